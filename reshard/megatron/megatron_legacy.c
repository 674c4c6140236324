/* SPDX-License-Identifier: MIT */
/*
 * Megatron's legacy per-rank state dicts from a torch_dist index; see
 * megatron_legacy.h for the rules.  Each source key becomes items (a
 * legacy key with its parts and its sort key), sorted into registration
 * order at the end.
 */
#include "megatron_legacy.h"
#include "megatron_legacy/mlg_rules.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS	 "decoder.layers."
#define EXPERTS	 "mlp.experts.experts."
#define WORD_EMB "embedding.word_embeddings.weight"

typedef flx_mlg_split split_rule;

/* Modules of a transformer layer in registration order (TransformerLayer,
 * SelfAttention: core_attention, linear_proj, then linear_qkv; MoELayer:
 * router, experts, shared experts). */
static const char *const layer_mods[] = {
    "input_layernorm",
    "self_attention.core_attention",
    "self_attention.linear_proj",
    "self_attention.linear_qkv",
    "self_attention.q_layernorm",
    "self_attention.k_layernorm",
    "pre_mlp_layernorm",
    "mlp.router",
    "mlp.experts",
    "mlp.shared_experts.linear_fc1",
    "mlp.shared_experts.linear_fc2",
    "mlp.linear_fc1",
    "mlp.linear_fc2",
};
#define NMODS	  (int)(sizeof(layer_mods) / sizeof(layer_mods[0]))
#define PRM_EXTRA 15
/* TEGroupedMLP: weight<e> sorts as PRM_GROUPED + e, _extra_state<e> as
 * 2 PRM_GROUPED + e */
#define PRM_GROUPED (1 << 24)

typedef struct item {
	int group; /* 0 embedding, 1 layers, 2 final norm, 3 output layer */
	int64_t layer, expert;
	int mod, prm;
	size_t seq;
	flx_mlg_entry e;
} item;

typedef struct ctx {
	const flx_ckpt *c;
	const flx_mlg_target *tgt;
	int tp, pp, ep;
	bool first, last; /* the chunk with the embedding, the output layer */
	int64_t nlayers, lo, hi; /* the chunk's global layers [lo, hi) */
	bool swiglu, moe;
	bool grouped; /* TE spec experts as TEGroupedMLP */
	int nep;      /* expert ranks */
	item *it;
	size_t n, cap;
	flx_error *err;
} ctx;

void flx_mlg_dir_name(int64_t iteration, int tp, int pp, int npp, int ep,
		      int nep, char *out, size_t cap)
{
	int n;

	if (tp < 0 && iteration < 0)
		snprintf(out, cap, "release");
	else if (tp < 0)
		snprintf(out, cap, "iter_%07lld", (long long)iteration);
	else {
		n = snprintf(out, cap, "mp_rank_%02d", tp);
		if (npp > 1 && n >= 0 && (size_t)n < cap)
			n += snprintf(out + n, cap - (size_t)n, "_%03d", pp);
		if (nep > 1 && n >= 0 && (size_t)n < cap)
			snprintf(out + n, cap - (size_t)n, "_%03d", ep);
	}
}

bool flx_mlg_is_model_key(const char *fqn)
{
	return strncmp(fqn, "optimizer.", 10) && strncmp(fqn, "chained_", 8);
}

bool flx_mlg_swiglu(const flx_ckpt *c)
{
	return flx_ckpt_fact_true(c, "swiglu");
}

/* The last component of module path mod ("self_attention.linear_qkv" ->
 * "linear_qkv"). */
static const char *last_comp(const char *mod)
{
	const char *d = strrchr(mod, '.');

	return d ? d + 1 : mod;
}

/* The decision: how TP splits parameter prm of module mod (legacy names,
 * without the layer prefix; a global key's module is its path). */
static split_rule decide_split(const char *mod, const char *prm, bool swiglu)
{
	return flx_mlg_split_rule(mod, prm, swiglu);
}

/* Whether module mod (legacy path without the layer prefix) is a linear
 * with an _extra_state. */
static bool has_extra(const char *mod)
{
	const char *m = last_comp(mod);

	return !strcmp(m, "linear_qkv") || !strcmp(m, "linear_proj") ||
	       !strcmp(m, "linear_fc1") || !strcmp(m, "linear_fc2") ||
	       !strcmp(mod, "output_layer");
}

static int fail(ctx *x, const char *key, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return flx_error_set(x->err, -EINVAL, NULL, key, "megatron/: %s", msg);
}

/* A new item named by printf; *out points to it (valid until the next). */
static int add_item(ctx *x, item **out, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;
	item *it;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(buf))
		return fail(x, buf, "legacy key too long");
	if (x->n == x->cap) {
		size_t cap = x->cap ? 2 * x->cap : 64;
		item *p = realloc(x->it, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		x->it = p;
		x->cap = cap;
	}
	it = &x->it[x->n];
	memset(it, 0, sizeof(*it));
	it->e.name = strdup(buf);
	if (!it->e.name)
		return -ENOMEM;
	it->seq = x->n++;
	*out = it;
	return 0;
}

/* The vocab the tables are padded from
 * (docs/formats/megatron.md#vocabulary-padding): megatron_true_vocab, else the
 * source's args.vocab_size, else 0 (unknown: the saved rows). */
static int64_t true_vocab(const flx_ckpt *c, const flx_mlg_target *tgt)
{
	if (tgt->true_vocab > 0)
		return tgt->true_vocab;
	return flx_megatron_of(c)->vocab_size > 0
		   ? flx_megatron_of(c)->vocab_size
		   : 0;
}

static int64_t repad(int64_t rows, int64_t m, int tp)
{
	int64_t q = m * tp;

	return (rows + q - 1) / q * q;
}

/* The saving run's tp: args.tensor_model_parallel_size, else the number of
 * distinct row offsets of the table t's saved chunks (its lead axes
 * skipped); at least 1. */
static int64_t saved_tp(const flx_ckpt *c, const flx_tensor *t, int lead)
{
	int64_t k = 0;

	if (flx_megatron_of(c)->tensor_model_parallel_size > 0)
		return flx_megatron_of(c)->tensor_model_parallel_size;
	for (uint32_t i = 0; i < t->nchunks; i++) {
		uint32_t j = 0;

		while (j < i &&
		       t->chunks[j].off[lead] != t->chunks[i].off[lead])
			j++;
		k += j == i;
	}
	return k > 0 ? k : 1;
}

/*
 * The target's padded rows of the table t (its n rows on axis lead):
 * repad() of the true vocab by make_vocab_size_divisible_by m (the option,
 * else args).  Neither stating it: the saved rows are the saving run's
 * padding (a multiple of the unknown m x the saving tp), so at that tp
 * with no true vocab they are the answer; anything else would be a guessed
 * multiple.  With m but no true vocab V: the saved rows are repad(V) at
 * the saving tp, so V lies in (n - m tp_saved, n], and the target's rows
 * are certain when repad() is the same over that range (always when tp is
 * a multiple of tp_saved); otherwise refused naming megatron_true_vocab
 * (docs/facts.md, docs/formats/megatron.md#vocabulary-padding).
 */
static int padded_rows(const flx_ckpt *c, const flx_mlg_target *tgt,
		       const flx_tensor *t, int lead, int64_t *out,
		       flx_error *err)
{
	const flx_megatron *mg = flx_megatron_of(c);
	int64_t v = true_vocab(c, tgt), m = mg->make_vocab_size_divisible_by;
	int64_t n = t->shape[lead], q, lo, hi;

	if (tgt->div_by > 0 && m > 0 && tgt->div_by != m)
		return flx_error_set(err, -EINVAL, NULL,
				     "megatron_vocab_divisible_by",
				     "megatron/: %lld contradicts "
				     "args.make_vocab_size_divisible_by %lld",
				     (long long)tgt->div_by, (long long)m);
	if (tgt->div_by > 0)
		m = tgt->div_by;
	if (m <= 0 && !v && mg->tensor_model_parallel_size == tgt->tp) {
		*out = n;
		return 0;
	}
	if (m <= 0)
		return flx_error_set(
		    err, -EINVAL, NULL, "args.make_vocab_size_divisible_by",
		    "megatron/: absent from common.pt, and the vocab padding "
		    "at tp=%d depends on it: state it with -o "
		    "megatron_vocab_divisible_by=M",
		    tgt->tp);
	if (v) {
		*out = repad(v, m, tgt->tp);
		return 0;
	}
	q = saved_tp(c, t, lead);
	q = n >= 1 && m <= n && q <= n / m ? m * q : 0;
	if (!q || n % q)
		return flx_error_set(
		    err, -EINVAL, NULL, "args.vocab_size",
		    "megatron/: absent, and the saved %lld rows of %s are "
		    "not a multiple of make_vocab_size_divisible_by %lld x "
		    "the saving tp %lld: state the vocab with -o "
		    "megatron_true_vocab=V",
		    (long long)n, t->fqn, (long long)m,
		    (long long)saved_tp(c, t, lead));
	lo = repad(n - q + 1, m, tgt->tp);
	hi = repad(n, m, tgt->tp);
	if (lo != hi)
		return flx_error_set(
		    err, -EINVAL, NULL, "args.vocab_size",
		    "megatron/: absent, and the padded rows at tp=%d depend "
		    "on it (%lld or %lld for a vocab in (%lld, %lld]): state "
		    "it with -o megatron_true_vocab=V",
		    tgt->tp, (long long)lo, (long long)hi, (long long)(n - q),
		    (long long)n);
	*out = hi;
	return 0;
}

/* The one parameter axis (from lead) along which t's chunks are split,
 * -1 for none; -2 for several. */
static int chunk_axis(const flx_tensor *t, int lead)
{
	int found = -1;

	for (int d = lead; d < t->ndim; d++)
		for (uint32_t k = 0; k < t->nchunks; k++)
			if (t->chunks[k].size[d] < t->shape[d]) {
				if (found >= 0 && found != d - lead)
					return -2;
				found = d - lead;
				break;
			}
	return found;
}

/*
 * Fill e with the TP slice of rank x->tp under rule r: box (the layer's
 * and expert's box of t, lead axes of extent 1 not in the legacy tensor)
 * cut on the split axis.
 */
static int tp_slice(ctx *x, flx_mlg_entry *e, const flx_tensor *t,
		    const flx_box *box, int lead, split_rule r)
{
	int T = x->tgt->tp, ax = 0, nd = t->ndim - lead;
	int64_t n;

	e->kind = FLX_MLG_TENSOR;
	e->dtype = t->dtype;
	e->ndim = nd;
	for (int d = 0; d < nd; d++)
		e->shape[d] = t->shape[lead + d];
	e->nparts = 1;
	e->part[0] = (flx_mlg_part){.src = t, .box = *box};
	if (r == FLX_MLG_CHUNKS) {
		ax = chunk_axis(t, lead);
		if (ax == -2)
			return fail(x, t->fqn,
				    "saved split along several axes, no "
				    "legacy rule for it");
		if (ax < 0)
			return 0;
	}
	if (r == FLX_MLG_REPL)
		return 0;
	if (r == FLX_MLG_ROW)
		ax = 1;
	if (ax >= nd)
		return fail(x, t->fqn, "no axis %d to split", ax);
	n = e->shape[ax];
	if (r == FLX_MLG_GLU) {
		int64_t f;

		if (n % (2 * T))
			return fail(x, t->fqn,
				    "SwiGLU rows %lld do not split into "
				    "2 x tp=%d",
				    (long long)n, T);
		f = n / (2 * T);
		e->nparts = 2;
		e->part[1] = e->part[0];
		e->part[0].box.off[lead] = x->tp * f;
		e->part[0].box.size[lead] = f;
		e->part[1].box.off[lead] = n / 2 + x->tp * f;
		e->part[1].box.size[lead] = f;
		e->shape[0] = 2 * f;
		return 0;
	}
	if (r == FLX_MLG_VOCAB) {
		int64_t V =
		    true_vocab(x->c, x->tgt) ? true_vocab(x->c, x->tgt) : n;
		int64_t P = 0, R, a, have;
		uint64_t row = flx_dtype_size(t->dtype);
		int rc;

		if (V > n)
			return fail(x, t->fqn,
				    "true vocab %lld is larger than the saved "
				    "%lld rows",
				    (long long)V, (long long)n);
		rc = padded_rows(x->c, x->tgt, t, lead, &P, x->err);
		if (rc)
			return rc;
		R = P / T;
		a = x->tp * R;
		have = a < n ? (a + R < n ? R : n - a) : 0;
		for (int d = 1; d < nd; d++)
			row *= (uint64_t)e->shape[d];
		e->shape[0] = R;
		e->part[0].box.off[lead] = a < n ? a : 0;
		e->part[0].box.size[lead] = have;
		e->part[1] =
		    (flx_mlg_part){.zeros = (uint64_t)(R - have) * row};
		if (!have)
			e->part[0] = e->part[1];
		e->nparts = have && have < R ? 2 : 1;
		return 0;
	}
	if (n % T)
		return fail(x, t->fqn,
			    "axis %d (%lld) does not split into tp=%d", ax,
			    (long long)n, T);
	e->part[0].box.off[lead + ax] = x->tp * (n / T);
	e->part[0].box.size[lead + ax] = n / T;
	e->shape[ax] = n / T;
	return 0;
}

/* Index of module mod in layer_mods ("mlp.experts.local_experts.<e>.*"
 * is "mlp.experts"); NMODS when unknown. */
static int mod_rank(const char *mod)
{
	if (!strncmp(mod, "mlp.experts.", 12))
		return 8;
	for (int i = 0; i < NMODS; i++)
		if (!strcmp(mod, layer_mods[i]))
			return i;
	return NMODS;
}

static int prm_rank(const char *prm)
{
	static const char *const order[] = {
	    "layer_norm_weight", "layer_norm_bias", "weight", "bias"};

	for (int i = 0; i < 4; i++)
		if (!strcmp(prm, order[i]))
			return i;
	return 4;
}

/* The object named key, a ShardedObject's unique key
 * "<key>/shard_<offsets>_<shape>", else its legacy variant whose shape
 * lacks the last entry (docs/formats/megatron.md#key-namespaces: Megatron pads
 * it with -1; the zarr backend's older with_suffix names), which only a shape
 * of two or more entries has.  NULL: neither. */
static const flx_object *find_object(const flx_ckpt *c, const char *key)
{
	const char *shape = strrchr(key, '_'), *dot = strrchr(key, '.');
	size_t n = dot && shape && dot > shape ? (size_t)(dot - key) : 0;

	for (size_t i = 0; i < c->nobjects; i++)
		if (!strcmp(c->objects[i].fqn, key))
			return &c->objects[i];
	for (size_t i = 0; n && i < c->nobjects; i++)
		if (!strncmp(c->objects[i].fqn, key, n) &&
		    !c->objects[i].fqn[n])
			return &c->objects[i];
	return NULL;
}

/* The source's bytes item of layer module mod's _extra_state at global
 * layer g: "decoder.layers.<mod>._extra_state/shard_<g>_<L>", or for
 * expert e (of E; mod the expert's module, "linear_fc1")
 * "decoder.layers.mlp.experts.experts.<mod>._extra_state/
 * shard_<g>.<e>_<L>.<E>"; a layer's own keys (!stacked,
 * docs/formats/megatron.md#stacked-layers) have no layer offset:
 * "decoder.layers.<g>.<mod>._extra_state/shard_0_1",
 * "decoder.layers.<g>.mlp.experts.experts.<mod>._extra_state/
 * shard_<e>_<E>".  NULL: none. */
static const flx_object *extra_object(const ctx *x, const char *mod, int64_t g,
				      int64_t e, int64_t E, bool stacked)
{
	char key[1024];
	int n;

	if (!stacked && e < 0)
		n = snprintf(key, sizeof(key),
			     LAYERS "%lld.%s._extra_state/shard_0_1",
			     (long long)g, mod);
	else if (!stacked)
		n = snprintf(key, sizeof(key),
			     LAYERS "%lld." EXPERTS
				    "%s._extra_state/shard_%lld_%lld",
			     (long long)g, mod, (long long)e, (long long)E);
	else if (e < 0)
		n = snprintf(key, sizeof(key),
			     LAYERS "%s._extra_state/shard_%lld_%lld", mod,
			     (long long)g, (long long)x->nlayers);
	else
		n = snprintf(key, sizeof(key),
			     LAYERS EXPERTS "%s._extra_state/shard_%lld.%lld_"
					    "%lld.%lld",
			     mod, (long long)g, (long long)e,
			     (long long)x->nlayers, (long long)E);
	if (n < 0 || (size_t)n >= sizeof(key))
		return NULL;
	return find_object(x->c, key);
}

/* An _extra_state item after module mod's parameters: None, or an empty
 * uint8 tensor, or (obj not NULL) obj's value. */
static int add_extra(ctx *x, const item *like, const char *prefix,
		     const char *mod, const char *suffix, bool none,
		     const flx_object *obj)
{
	item *it;
	item copy = *like;
	int rc = add_item(x, &it, "%s%s._extra_state%s", prefix, mod, suffix);

	if (rc)
		return rc;
	it->group = copy.group;
	it->layer = copy.layer;
	it->expert = copy.expert;
	it->mod = copy.mod;
	it->prm = copy.prm - copy.prm % 16 + PRM_EXTRA;
	if (x->grouped && copy.prm >= PRM_GROUPED)
		it->prm = copy.prm + PRM_GROUPED;
	it->e.kind = none ? FLX_MLG_NONE : FLX_MLG_EMPTY_U8;
	if (!none && obj) {
		it->e.kind = FLX_MLG_OBJECT;
		it->e.obj = obj;
	}
	return 0;
}

/*
 * The legacy name of a layer key's rest (torch_dist names,
 * docs/formats/megatron.md#norm-naming): module path into mod, parameter into
 * prm.  moe: the layer is a MoE layer.
 */
static int layer_name(ctx *x, const flx_tensor *t, const char *rest, bool moe,
		      char *mod, size_t cap, const char **prm)
{
	const char *dot = strrchr(rest, '.');
	size_t n = dot ? (size_t)(dot - rest) : 0;

	if (!dot || n >= cap)
		return fail(x, t->fqn, "no module in the key");
	memcpy(mod, rest, n);
	mod[n] = '\0';
	*prm = dot + 1;
	if (!strncmp(*prm, "layer_norm_", 11)) {
		bool qkv = !strcmp(mod, "self_attention.linear_qkv");
		bool fc1 = !strcmp(mod, "mlp.linear_fc1");

		/* local spec: the norms are modules of their own; TE: a MoE
		 * layer has no fc1 to fuse its norm into */
		if ((qkv && !x->tgt->te) || (fc1 && (!x->tgt->te || moe))) {
			strcpy(mod,
			       qkv ? "input_layernorm" : "pre_mlp_layernorm");
			*prm += 11;
		}
	}
	return 0;
}

/* The _extra_state items that follow the weight w of layer module mod
 * (expert ge of E, or ge -1; tgt: the legacy module path): the module's own
 * (a linear), and for TE the core attention's before linear_proj.  A
 * TEGroupedMLP's linear (mod "linear_fc1", tgt "mlp.experts.linear_fc1")
 * has one per expert e: "_extra_state" for e 0, "_extra_state<e>" for the
 * others (docs/formats/megatron.md#moe-experts), which Megatron's load hook
 * merges. */
static int layer_extras(ctx *x, const item *w, const char *mod, const char *tgt,
			int64_t ge, int64_t E, bool stacked)
{
	char prefix[64], suffix[24] = "";
	item like = *w; /* w moves when items grow */
	int rc = 0;

	snprintf(prefix, sizeof(prefix), LAYERS "%lld.", (long long)like.layer);
	if (x->grouped && ge >= 0 && like.prm >= PRM_GROUPED &&
	    like.prm - PRM_GROUPED > 0)
		snprintf(suffix, sizeof(suffix), "%lld",
			 (long long)(like.prm - PRM_GROUPED));
	if (has_extra(tgt))
		rc = add_extra(x, &like, prefix, tgt, suffix, !x->tgt->te,
			       x->tgt->te
				   ? extra_object(x, mod, like.layer + x->lo,
						  ge, E, stacked)
				   : NULL);
	like.mod = mod_rank("self_attention.core_attention");
	if (!rc && x->tgt->te && !strcmp(tgt, "self_attention.linear_proj"))
		rc =
		    add_extra(x, &like, prefix, "self_attention.core_attention",
			      "", false, NULL);
	return rc;
}

/* Whether layer g is a MoE layer.  Stacked keys share one structure
 * (x->moe); a non-homogeneous model (its layers' own keys,
 * docs/formats/megatron.md#stacked-layers) may mix dense and MoE layers
 * (moe_layer_freq): g is MoE when it has no dense fc1 but a router, or the
 * model has experts. */
static bool layer_moe(const ctx *x, int64_t g, bool stacked)
{
	char key[96];

	if (stacked)
		return x->moe;
	snprintf(key, sizeof(key), LAYERS "%lld.mlp.linear_fc1.weight",
		 (long long)g);
	if (flx_ckpt_find(x->c, key))
		return false;
	snprintf(key, sizeof(key), LAYERS "%lld.mlp.router.weight",
		 (long long)g);
	return flx_ckpt_find(x->c, key) ||
	       flx_megatron_of(x->c)->num_experts > 0;
}

/* Items of layer key t: its layers on this stage, its experts, the TP
 * slice, and the _extra_state of its module. */
static int layer_items(ctx *x, const flx_tensor *t, const char *rest,
		       int64_t g1, bool stacked)
{
	char mod[512], emod[600];
	const char *prm = NULL;
	bool expert = !strncmp(rest, EXPERTS, sizeof(EXPERTS) - 1);
	int lead = (stacked ? 1 : 0) + (expert ? 1 : 0), rc;
	int64_t E = 1, g0 = stacked ? 0 : g1,
		gn = stacked ? x->nlayers : g1 + 1;
	split_rule r;

	if (t->ndim <= lead)
		return fail(x, t->fqn, "too few axes for its stacking");
	if (stacked && t->shape[0] != x->nlayers)
		return fail(x, t->fqn, "%lld layers stacked, num_layers %lld",
			    (long long)t->shape[0], (long long)x->nlayers);
	if (expert) {
		E = t->shape[lead - 1];
		if (E % x->nep)
			return fail(x, t->fqn,
				    "%lld experts do not divide into "
				    "megatron_ep=%d ranks",
				    (long long)E, x->nep);
	}
	rc = layer_name(x, t, expert ? rest + sizeof(EXPERTS) - 1 : rest,
			layer_moe(x, g1, stacked), mod, sizeof(mod), &prm);
	if (rc)
		return rc;
	r = decide_split(mod, prm, x->swiglu);
	for (int64_t g = g0 > x->lo ? g0 : x->lo; g < gn && g < x->hi; g++) {
		for (int64_t e = 0; e < (expert ? E / x->nep : 1); e++) {
			/* local expert e is global expert ge */
			int64_t ge =
			    expert ? (int64_t)x->ep * (E / x->nep) + e : 0;
			flx_box box;
			item *it;
			int mr = mod_rank(expert ? "mlp.experts" : mod);

			if (expert && x->grouped)
				snprintf(emod, sizeof(emod), "mlp.experts.%s",
					 mod);
			else if (expert)
				snprintf(emod, sizeof(emod),
					 "mlp.experts.local_experts.%lld.%s",
					 (long long)e, mod);
			else
				snprintf(emod, sizeof(emod), "%s", mod);
			if (expert && x->grouped)
				rc = add_item(x, &it, LAYERS "%lld.%s.%s%lld",
					      (long long)(g - x->lo), emod, prm,
					      (long long)e);
			else
				rc =
				    add_item(x, &it, LAYERS "%lld.%s.%s",
					     (long long)(g - x->lo), emod, prm);
			if (rc)
				return rc;
			it->group = 1;
			it->layer = g - x->lo;
			it->expert = e;
			it->mod = mr;
			it->prm =
			    (expert && !strcmp(mod, "linear_fc2") ? 16 : 0) +
			    prm_rank(prm);
			if (expert && x->grouped) {
				/* one GroupedLinear per linear: its
				 * weight<e> in expert order */
				it->expert = !strcmp(mod, "linear_fc2");
				it->prm = PRM_GROUPED + e;
			}
			for (int d = 0; d < t->ndim; d++) {
				box.off[d] = 0;
				box.size[d] = t->shape[d];
			}
			if (stacked) {
				box.off[0] = g;
				box.size[0] = 1;
			}
			if (expert) {
				box.off[lead - 1] = ge;
				box.size[lead - 1] = 1;
			}
			rc = tp_slice(x, &it->e, t, &box, lead, r);
			if (!rc && !strcmp(prm, "weight"))
				rc = layer_extras(x, it, mod, emod,
						  expert ? ge : -1, E, stacked);
			if (rc)
				return rc;
		}
	}
	return rc;
}

/* Items of a key outside the layers: stage 0 or the last stage. */
static int global_items(ctx *x, const flx_tensor *t, const char *as)
{
	char mod[512];
	const char *dot = strrchr(as, '.');
	int group, rc;
	flx_box box;
	item *it;

	if (!strncmp(as, "embedding.", 10))
		group = 0;
	else if (!strncmp(as, "decoder.final_layernorm.", 24))
		group = 2;
	else if (!strncmp(as, "output_layer.", 13))
		group = 3;
	else
		return fail(x, t->fqn, "no legacy place for this key");
	if (group == 0 ? !x->first : !x->last)
		return 0;
	if (!dot || (size_t)(dot - as) >= sizeof(mod))
		return fail(x, t->fqn, "no module in the key");
	memcpy(mod, as, (size_t)(dot - as));
	mod[dot - as] = '\0';
	rc = add_item(x, &it, "%s", as);
	if (rc)
		return rc;
	it->group = group;
	it->mod = !strcmp(mod, "embedding.position_embeddings");
	it->prm = prm_rank(dot + 1);
	for (int d = 0; d < t->ndim; d++) {
		box.off[d] = 0;
		box.size[d] = t->shape[d];
	}
	rc = tp_slice(x, &it->e, t, &box, 0,
		      decide_split(mod, dot + 1, x->swiglu));
	if (!rc && !strcmp(dot + 1, "weight") && has_extra(mod)) {
		item like = *it;

		rc = add_extra(x, &like, "", mod, "", true, NULL);
	}
	return rc;
}

static int cmp_item(const void *a, const void *b)
{
	const item *x = a, *y = b;
	int64_t k1[] = {x->group,  x->layer, x->mod,
			x->expert, x->prm,   (int64_t)x->seq};
	int64_t k2[] = {y->group,  y->layer, y->mod,
			y->expert, y->prm,   (int64_t)y->seq};

	for (int i = 0; i < 6; i++)
		if (k1[i] != k2[i])
			return k1[i] < k2[i] ? -1 : 1;
	return 0;
}

int64_t flx_mlg_layer_count(const flx_ckpt *c)
{
	if (flx_megatron_of(c)->num_layers > 0)
		return flx_megatron_of(c)->num_layers;
	for (size_t i = 0; i < c->ntensors; i++)
		if (c->tensors[i].stacked && !c->tensors[i].stacked_experts &&
		    flx_mlg_is_model_key(c->tensors[i].fqn))
			return c->tensors[i].shape[0];
	return 0;
}

int flx_mlg_padded_vocab(const flx_ckpt *c, const flx_mlg_target *tgt,
			 int64_t *out, flx_error *err)
{
	const flx_tensor *t = flx_ckpt_find(c, WORD_EMB);

	if (!t || t->ndim < 1)
		return flx_error_set(err, -EINVAL, NULL, WORD_EMB,
				     "megatron/: no word embedding");
	return padded_rows(c, tgt, t, 0, out, err);
}

/* Items of every model key, then the tied output layer. */
static int collect(ctx *x)
{
	const flx_ckpt *c = x->c;
	int rc = 0;

	for (size_t i = 0; !rc && i < c->ntensors; i++) {
		const flx_tensor *t = &c->tensors[i];
		const char *rest = t->fqn + sizeof(LAYERS) - 1;

		if (!flx_mlg_is_model_key(t->fqn))
			continue;
		if (strncmp(t->fqn, LAYERS, sizeof(LAYERS) - 1)) {
			rc = global_items(x, t, t->fqn);
		} else if (*rest >= '0' && *rest <= '9') {
			char *end;
			long long g = strtoll(rest, &end, 10);

			if (*end != '.' || g >= x->nlayers)
				return fail(x, t->fqn, "layer out of range");
			rc = layer_items(x, t, end + 1, g, false);
		} else {
			rc = layer_items(x, t, rest, 0, true);
		}
	}
	if (!rc && !flx_ckpt_find(c, "output_layer.weight") && x->last) {
		const flx_tensor *emb = flx_ckpt_find(c, WORD_EMB);
		item *it;

		/* tied: the last stage's own copy of its slice (PP > 1) */
		if (emb && x->tgt->pp > 1)
			rc = global_items(x, emb, "output_layer.weight");
		else if (!(rc =
			       add_item(x, &it, "output_layer._extra_state"))) {
			it->group = 3;
			it->prm = PRM_EXTRA;
			it->e.kind = FLX_MLG_NONE;
		}
	}
	return rc;
}

/* Whether te names give the experts as TEGroupedMLP's: args.moe_grouped_gemm,
 * else -o megatron_grouped_gemm= (contradicting the args: refused); neither
 * with expert tensors to name: refused, the keys are the same either way
 * (docs/facts.md). */
static int grouped_experts(const flx_ckpt *c, const flx_mlg_target *tgt,
			   bool *out, flx_error *err)
{
	int a = flx_megatron_of(c)->moe_grouped_gemm;
	bool experts = false;

	*out = false;
	if (!tgt->te)
		return 0;
	if (a >= 0 && tgt->grouped >= 0 && a != tgt->grouped)
		return flx_error_set(
		    err, -EINVAL, NULL, "megatron_grouped_gemm",
		    "megatron/: '%s' contradicts "
		    "args.moe_grouped_gemm (%s)",
		    tgt->grouped ? "on" : "off", a ? "True" : "False");
	if (a < 0)
		a = tgt->grouped;
	for (size_t i = 0; i < c->ntensors && a < 0 && !experts; i++)
		experts = flx_mlg_is_model_key(c->tensors[i].fqn) &&
			  strstr(c->tensors[i].fqn, EXPERTS);
	if (experts)
		return flx_error_set(err, -EINVAL, NULL,
				     "args.moe_grouped_gemm",
				     "megatron/: absent from common.pt, and "
				     "the experts' te names depend on it: "
				     "state it with -o "
				     "megatron_grouped_gemm=on|off");
	*out = a == 1;
	return 0;
}

int flx_mlg_rank(const flx_ckpt *c, const flx_mlg_target *tgt, int tp, int pp,
		 int ep, int vc, flx_mlg_entry **out, size_t *n, flx_error *err)
{
	ctx x = {.c = c, .tgt = tgt, .tp = tp, .pp = pp, .ep = ep, .err = err};
	int vp = tgt->vp > 1 ? tgt->vp : 1, rc;
	int64_t per;

	x.nep = tgt->ep > 1 ? tgt->ep : 1;
	/* docs/formats/megatron.md#stacked-layers,
	 * docs/formats/megatron.md#legacy-recipe: its keys (fc1 as weight_w /
	 * weight_v, experts per global index) have no legacy rule here:
	 * refused, never guessed */
	if (flx_megatron_of(c)->singleton_local_shards == 1)
		return flx_error_set(err, -EINVAL, NULL,
				     "content_metadata.singleton_local_shards",
				     "megatron/: a singleton_local_shards "
				     "checkpoint has no legacy layout here");
	x.nlayers = flx_mlg_layer_count(c);
	if (x.nlayers <= 0 || x.nlayers % ((int64_t)tgt->pp * vp))
		return flx_error_set(err, -EINVAL, NULL, "num_layers",
				     vp > 1 ? "megatron/: %lld layers do not "
					      "divide into pp=%d x vp=%d chunks"
					    : "megatron/: %lld layers do not "
					      "divide into pp=%d stages",
				     (long long)x.nlayers, tgt->pp, vp);
	per = x.nlayers / ((int64_t)tgt->pp * vp);
	x.lo = vc * (x.nlayers / vp) + pp * per;
	x.hi = x.lo + per;
	x.first = pp == 0 && vc == 0;
	x.last = pp == tgt->pp - 1 && vc == vp - 1;
	x.swiglu = flx_mlg_swiglu(c);
	if (flx_megatron_of(c)->swiglu < 0) {
		for (size_t i = 0; i < c->ntensors; i++) {
			const char *f = c->tensors[i].fqn;
			size_t len = strlen(f);

			if (flx_mlg_is_model_key(f) && len >= 17 &&
			    !strcmp(f + len - 17, "linear_fc1.weight"))
				return flx_error_set(
				    err, -EINVAL, NULL, "args.swiglu",
				    "megatron/: absent from common.pt, and "
				    "the saved chunks of %s do not show "
				    "whether fc1 is SwiGLU (its split would "
				    "differ): state it with -o "
				    "megatron_swiglu=on|off",
				    f);
		}
	}
	x.moe = !flx_ckpt_find(c, LAYERS "mlp.linear_fc1.weight") &&
		(flx_megatron_of(c)->num_experts > 0 ||
		 flx_ckpt_find(c, LAYERS "mlp.router.weight"));
	rc = grouped_experts(c, tgt, &x.grouped, err);
	if (rc)
		return rc;
	if (x.nep > 1 && !x.moe)
		return flx_error_set(err, -EINVAL, NULL, "megatron_ep",
				     "megatron/: expert parallel size %d, but "
				     "the model has no experts",
				     x.nep);
	rc = collect(&x);
	if (rc)
		goto out;
	qsort(x.it, x.n, sizeof(*x.it), cmp_item);
	*out = malloc((x.n ? x.n : 1) * sizeof(**out));
	if (!*out) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < x.n; i++)
		(*out)[i] = x.it[i].e;
	*n = x.n;
	x.n = 0; /* the names went to *out */
out:
	for (size_t i = 0; i < x.n; i++)
		free(x.it[i].e.name);
	free(x.it);
	return rc;
}

void flx_mlg_free(flx_mlg_entry *e, size_t n)
{
	for (size_t i = 0; e && i < n; i++)
		free(e[i].name);
	free(e);
}

/* ---- the megatron/ layout's options ---- */

/* megatron_true_vocab, megatron_vocab_divisible_by: 1 to 2^40. */
static int check_vocab(const flx_opt *o, const char *value, uint64_t *num,
		       flx_error *err)
{
	char *end = NULL;
	long long v = value ? strtoll(value, &end, 10) : 0;

	if (!value || !*value || *end || v <= 0 || v > (1ll << 40))
		return flx_error_set(err, -EINVAL, NULL, o->name,
				     "expected a number from 1 to 2^40, "
				     "got '%s'",
				     value ? value : "");
	*num = (uint64_t)v;
	return 0;
}

/* megatron_ep, megatron_vp: 1 to 1024. */
static int check_size(const flx_opt *o, const char *value, uint64_t *num,
		      flx_error *err)
{
	char *end = NULL;
	long v = value ? strtol(value, &end, 10) : 0;

	if (!value || !*value || *end || v <= 0 || v > 1024)
		return flx_error_set(err, -EINVAL, NULL, o->name,
				     "expected a size from 1 to 1024, "
				     "got '%s'",
				     value ? value : "");
	*num = (uint64_t)v;
	return 0;
}

static const char *const spec_choices[] = {"local", "te", NULL};
static const char *const onoff_choices[] = {"off", "on", NULL};

static const flx_opt mlg_opts[] = {
    {.name = "megatron_spec",
     .type = FLX_OPT_CHOICE,
     .metavar = "SPEC",
     .def = "local",
     .help = "names in megatron/ legacy files: local, or te (Transformer "
	     "Engine)",
     .choices = spec_choices},
    {.name = "megatron_true_vocab",
     .type = FLX_OPT_UINT,
     .metavar = "V",
     .def = "args.vocab_size",
     .help = "the tokenizer's vocab size: megatron/ pads the vocab from "
	     "it; needed where the padding at tp depends on it",
     .check = check_vocab},
    {.name = "megatron_vocab_divisible_by",
     .type = FLX_OPT_UINT,
     .metavar = "M",
     .def = "args.make_vocab_size_divisible_by",
     .help = "make_vocab_size_divisible_by of the saving run, for "
	     "megatron/'s vocab padding when its args do not say",
     .check = check_vocab},
    {.name = "megatron_grouped_gemm",
     .type = FLX_OPT_CHOICE,
     .metavar = "on|off",
     .def = "args.moe_grouped_gemm",
     .help = "whether the experts are TEGroupedMLP's, for megatron_spec=te "
	     "when the args do not say",
     .choices = onoff_choices},
    {.name = "megatron_ep",
     .type = FLX_OPT_UINT,
     .metavar = "N",
     .help = "megatron/ legacy files for expert parallel size N",
     .check = check_size},
    {.name = "megatron_vp",
     .type = FLX_OPT_UINT,
     .metavar = "N",
     .help = "megatron/ legacy files with N virtual pipeline chunks",
     .check = check_size},
};

const flx_opt_group flx_mlg_opt_group = {
    .owner = "megatron",
    .title = "megatron/ layout (Megatron-LM legacy per-rank files)",
    .opts = mlg_opts,
    .nopts = FLX_OPT_COUNT(mlg_opts),
};

flx_mlg_target flx_mlg_target_of(const flx_spec *s)
{
	flx_mlg_target t = {.tp = s->tp, .pp = s->pp, .grouped = -1};
	uint64_t v;

	if (!flx_opt_u64(&s->opts, "megatron_ep", &v))
		t.ep = (int)v;
	if (!flx_opt_u64(&s->opts, "megatron_vp", &v))
		t.vp = (int)v;
	if (!flx_opt_u64(&s->opts, "megatron_spec", &v))
		t.te = v == 1;
	if (!flx_opt_u64(&s->opts, "megatron_true_vocab", &v))
		t.true_vocab = (int64_t)v;
	if (!flx_opt_u64(&s->opts, "megatron_vocab_divisible_by", &v))
		t.div_by = (int64_t)v;
	if (!flx_opt_u64(&s->opts, "megatron_grouped_gemm", &v))
		t.grouped = (int)v;
	return t;
}
