/* SPDX-License-Identifier: MIT */
/*
 * The megatron-legacy source: a Megatron-LM iteration directory of
 * per-rank torch.save files (--ckpt-format torch), read as the global
 * model Megatron-Core's torch_dist source gives (docs/formats/
 * megatron-legacy.md):
 *
 *   iter_NNNNNNN/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt
 *     {'args': Namespace, 'checkpoint_version': 3.0, 'iteration': N,
 *      'model' (or 'model0' .. under a virtual pipeline): state dict,
 *      'optimizer', 'opt_param_scheduler', 'rng_state', ...}
 *
 * Every saved model tensor is located in place (its storage in the rank
 * file, zip or pre-1.6, by torchfile.h) and becomes one box of a global tensor
 * (two for SwiGLU's [gate_r; up_r]): layer keys stacked on a layer axis under
 * their torch_dist names ("decoder.layers.self_attention.linear_qkv.
 * weight" [L, ...]; the local spec's input_layernorm / pre_mlp_layernorm
 * under their fused names), layer numbers made global from the stage and
 * virtual chunk; the split of each parameter is Megatron's own
 * (mlg_rules.h).  A MoE layer's experts (local_experts.<e>, or
 * TEGroupedMLP's <prm><e>) are stacked on an expert axis after the layer
 * axis, numbered globally from the expert rank.  Replicated tensors are
 * compared byte for byte across the TP ranks, everything outside the
 * experts across the expert ranks, at mount.  Rank 0's args become
 * flx_ckpt.megatron, so megatron/ serves this model again at any tp x pp.  Each
 * rank file is also an object (objects/mp_rank_TT_PPP.pt), verbatim: its
 * optimizer, scheduler and rng state, exactly as saved.
 *
 * Upstream: Megatron-LM megatron/training/checkpointing.py
 * (get_checkpoint_name, generate_state_dict, save_checkpoint).
 */
#include "megatron/megatron_internal.h"
#include "megatron_legacy/mlg_rules.h"
#include "pickle.h"
#include "reader.h"
#include "source.h"
#include "torchfile.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RANK_FILE	 "model_optim_rng.pt"
#define LAYERS		 "decoder.layers."
#define WORD_EMB	 "embedding.word_embeddings.weight"
#define OUT_W		 "output_layer.weight"
#define MAX_TP		 1024
#define MAX_PP		 1024
#define MAX_RANKS	 65536
#define MAX_VP		 64
#define MAX_LOCAL_LAYERS 100000
#define MAX_EXPERTS	 65536
#define EXPERTS		 "mlp.experts.experts."
#define CMP_BUF		 (1u << 20)

/* A rank file. */
typedef struct rank {
	int tp, pp, ep;
	int nv, v[3];  /* the numbers of its directory's name */
	char rel[80];  /* "mp_rank_00_000/model_optim_rng.pt" */
	char name[64]; /* "mp_rank_00_000" */
	uint32_t file;
	uint64_t pkl_off, pkl_len;
	flx_torchfile *tf;
	const flx_pv *root;
	int nlocal; /* local layers per virtual chunk (-1: none seen) */
} rank;

/* A saved model tensor. */
typedef struct rec {
	char *key;   /* global key (owned) */
	char *local; /* as saved, "model0/..." under a vp (owned) */
	const rank *rk;
	int vc;
	int64_t layer; /* local layer number, -1: not a layer key */
	int64_t g;     /* global layer */
	int64_t lex;   /* local expert number, -1: not an expert's key */
	int64_t ex;    /* global expert: the rank's ep x local experts + lex */
	bool pre_mlp;  /* saved as pre_mlp_layernorm.* */
	flx_mlg_split rule;
	flx_tensor_pkl p;
	uint64_t data_off; /* storage record's first byte in the file */
} rec;

typedef struct ld {
	flx_build *b;
	flx_ckpt *c;
	flx_error *err;
	rank *rk;
	int nrk, TP, PP, VP, EP;
	int64_t NLE, E; /* local experts per rank; experts (0: no MoE) */
	int64_t L, per; /* layers; per virtual chunk */
	rec *r;
	size_t nr, cap;
	flx_megatron *m;
	int swiglu, untie;
} ld;

static int fail(ld *x, const char *file, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(ld *x, const char *file, const char *key, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return flx_error_set(x->err, -EINVAL, file, key, "%s", msg);
}

/* "mp_rank_TT", "mp_rank_TT_NNN" or "mp_rank_TT_PPP_EEE" (2 and 3 digits,
 * as Megatron's get_checkpoint_name() writes them: the pipeline rank when
 * the pipeline has stages, then the expert rank under expert parallelism;
 * NNN is either): its 1 to 3 numbers into v, or 0. */
static int parse_rank_dir(const char *s, int v[3])
{
	static const char pre[] = "mp_rank_";
	int n = 0;
	const char *p = s + sizeof(pre) - 1;

	v[0] = v[1] = v[2] = 0;
	if (strncmp(s, pre, sizeof(pre) - 1))
		return 0;
	while (n < 3) {
		int d = 0, w = n ? 3 : 2;

		for (; d < w; d++)
			if (p[d] < '0' || p[d] > '9')
				return 0;
		for (d = 0; d < w; d++)
			v[n] = v[n] * 10 + (p[d] - '0');
		n++;
		p += w;
		if (!*p)
			break;
		if (*p != '_')
			return 0;
		p++;
	}
	if (*p)
		return 0;
	return n;
}

static bool is_dir_at(int dirfd, const char *name)
{
	struct stat st;

	return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	       S_ISDIR(st.st_mode);
}

/* Whether dirfd is an iteration directory of rank directories: an
 * mp_rank_* directory holding model_optim_rng.pt, and no DCP or Megatron
 * metadata of its own. */
static int probe(int dirfd, bool *yes)
{
	int fd = dup(dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;
	char path[300];
	int v[3];

	*yes = false;
	if (!d) {
		int no = errno;

		if (fd >= 0)
			close(fd);
		return -no; /* cannot look: the open reports it */
	}
	if (flx_dir_has(dirfd, ".metadata") ||
	    flx_dir_has(dirfd, "metadata.json")) {
		closedir(d);
		return 0;
	}
	rewinddir(d); /* a dup shares the offset another reader left */
	while (!*yes && (e = readdir(d))) {
		if (!parse_rank_dir(e->d_name, v) ||
		    !is_dir_at(dirfd, e->d_name))
			continue;
		snprintf(path, sizeof(path), "%s/" RANK_FILE, e->d_name);
		*yes = flx_dir_has(dirfd, path);
	}
	closedir(d);
	return 0;
}

static bool owns(const char *name)
{
	int v[3];

	return parse_rank_dir(name, v) > 0;
}

/* By the second number, the first, the third: mp_rank_00[_000[_000]]
 * first. */
static int cmp_rank(const void *a, const void *b)
{
	const rank *x = a, *y = b;
	static const int ord[3] = {1, 0, 2};

	for (int i = 0; i < 3; i++)
		if (x->v[ord[i]] != y->v[ord[i]])
			return x->v[ord[i]] < y->v[ord[i]] ? -1 : 1;
	return 0;
}

/* list_ranks()' walk. */
typedef struct list_state {
	ld *x;
	int cap;  /* of x->rk */
	int nsuf; /* numbers in the rank directories' names, -1: none yet */
} list_state;

/* One entry of the directory: a rank directory is added to x->rk. */
static int list_one(void *arg, const char *name, bool dir)
{
	list_state *l = arg;
	ld *x = l->x;
	int v[3], n = parse_rank_dir(name, v);
	size_t len = strlen(name);

	if (!n || !dir)
		return 0;
	if (l->nsuf >= 0 && n != l->nsuf)
		return fail(x, name, NULL,
			    "rank directories with %d and with %d "
			    "numbers in their names",
			    l->nsuf, n);
	l->nsuf = n;
	if (v[0] >= MAX_TP || v[1] >= MAX_PP || v[2] >= MAX_PP ||
	    x->nrk >= MAX_RANKS)
		return fail(x, name, NULL, "past %d TP x %d PP (or EP) ranks",
			    MAX_TP, MAX_PP);
	if (x->nrk == l->cap) {
		int nc = l->cap ? 2 * l->cap : 16;
		rank *p = realloc(x->rk, (size_t)nc * sizeof(*p));

		if (!p)
			return -ENOMEM;
		x->rk = p;
		l->cap = nc;
	}
	if (len >= sizeof(x->rk[0].name))
		return 0; /* parse_rank_dir() takes at most 20 */
	memset(&x->rk[x->nrk], 0, sizeof(rank));
	x->rk[x->nrk].nv = n;
	memcpy(x->rk[x->nrk].v, v, sizeof(v));
	x->rk[x->nrk].nlocal = -1;
	memcpy(x->rk[x->nrk].name, name, len + 1);
	memcpy(x->rk[x->nrk].rel, name, len);
	memcpy(x->rk[x->nrk].rel + len, "/" RANK_FILE, sizeof("/" RANK_FILE));
	x->nrk++;
	return 0;
}

/* The rank directories, sorted (cmp_rank); their numbers are read as tp,
 * pp and ep by assign_grid() once rank 0's args are known.  Under -o mpi,
 * every node's (flx_build_each_name()). */
static int list_ranks(ld *x)
{
	list_state l = {x, 0, -1};
	int rc = flx_build_each_name(x->b, list_one, &l);

	if (rc < 0 && rc != -ENOMEM && !x->err->code)
		return flx_error_set(x->err, rc, ".", NULL,
				     "cannot list the directory: %s",
				     strerror(-rc));
	if (rc)
		return rc;
	if (!x->nrk)
		return fail(x, ".", NULL, "no mp_rank_* directory");
	qsort(x->rk, (size_t)x->nrk, sizeof(rank), cmp_rank);
	return 0;
}

/* The name Megatron gives rank (t, p, e) of the directories' scheme. */
static void rank_dir_name(const ld *x, int t, int p, int e, char *out,
			  size_t cap)
{
	int nv = x->rk[0].nv;

	if (nv == 3)
		snprintf(out, cap, "mp_rank_%02d_%03d_%03d", t, p, e);
	else if (nv == 2)
		snprintf(out, cap, "mp_rank_%02d_%03d", t, x->EP > 1 ? e : p);
	else
		snprintf(out, cap, "mp_rank_%02d", t);
}

/*
 * Each directory's numbers as (tp, pp, ep), and the grid they must fill.
 * Three numbers are tp, pp, ep; two are tp and pp, or tp and ep when
 * rank 0's args.expert_model_parallel_size is above 1 (Megatron writes the
 * pipeline rank only when the pipeline has stages); a third number with
 * args saying the expert parallel size is 1 is refused.
 */
static int assign_grid(ld *x)
{
	const flx_megatron *m = x->m;
	bool ep_args = m->expert_model_parallel_size > 1;
	int nv = x->rk[0].nv, rc = 0;
	unsigned char *seen = NULL;

	if (nv == 2 && ep_args && m->pipeline_model_parallel_size > 1)
		return fail(x, x->rk[0].rel, "args.expert_model_parallel_size",
			    "%lld with pipeline size %lld, but the rank "
			    "directories' names hold two numbers, not "
			    "mp_rank_TT_PPP_EEE's three",
			    (long long)m->expert_model_parallel_size,
			    (long long)m->pipeline_model_parallel_size);
	if (nv == 3 && m->expert_model_parallel_size == 1)
		return fail(x, x->rk[0].rel, "args.expert_model_parallel_size",
			    "1, but the rank directories' names hold an "
			    "expert rank (mp_rank_TT_PPP_EEE)");
	x->TP = x->PP = x->EP = 0;
	for (int i = 0; i < x->nrk; i++) {
		rank *k = &x->rk[i];

		k->tp = k->v[0];
		k->pp = nv == 3 || (nv == 2 && !ep_args) ? k->v[1] : 0;
		k->ep = nv == 3 ? k->v[2] : nv == 2 && ep_args ? k->v[1] : 0;
		if (k->tp >= x->TP)
			x->TP = k->tp + 1;
		if (k->pp >= x->PP)
			x->PP = k->pp + 1;
		if (k->ep >= x->EP)
			x->EP = k->ep + 1;
	}
	if ((int64_t)x->TP * x->PP * x->EP > MAX_RANKS)
		return fail(x, x->rk[0].rel, NULL,
			    "a %d x %d x %d (tp x pp x ep) grid: past %d "
			    "ranks",
			    x->TP, x->PP, x->EP, MAX_RANKS);
	seen = calloc((size_t)x->TP * x->PP * x->EP, 1);
	if (!seen)
		return -ENOMEM;
	for (int i = 0; i < x->nrk; i++)
		seen[((size_t)x->rk[i].pp * x->TP + x->rk[i].tp) * x->EP +
		     x->rk[i].ep] = 1;
	for (int p = 0; !rc && p < x->PP; p++)
		for (int t = 0; !rc && t < x->TP; t++)
			for (int e = 0; !rc && e < x->EP; e++) {
				char name[64];

				if (seen[((size_t)p * x->TP + t) * x->EP + e])
					continue;
				rank_dir_name(x, t, p, e, name, sizeof(name));
				rc = x->EP > 1
					 ? flx_error_set(
					       x->err, -ENOENT, name, NULL,
					       "missing: the rank directories "
					       "make a %d x %d x %d (tp x pp x "
					       "ep) grid",
					       x->TP, x->PP, x->EP)
					 : flx_error_set(
					       x->err, -ENOENT, name, NULL,
					       "missing: the rank directories "
					       "make a %d x %d (tp x pp) grid",
					       x->TP, x->PP);
			}
	free(seen);
	return rc;
}

/* Open rank file k: a torch.save file (zip or pre-1.6), its object
 * pickle decoded inertly and every tensor in it located. */
static int read_rank(ld *x, rank *k)
{
	static const flx_file_ref ref = {
	    .from = "mp_rank_*", .field = "directory", .key = NULL};
	flx_file_reader fr;
	flx_reader r;
	int rc = flx_build_data_file(x->b, k->rel, &ref, &k->file);

	if (rc)
		return rc;
	flx_reader_file(&r, &fr, x->c, k->file, 0, x->c->files[k->file].size);
	rc = flx_torchfile_open(&r, k->rel, &k->tf, x->err);
	if (rc)
		return rc;
	flx_torchfile_pickle_span(k->tf, &k->pkl_off, &k->pkl_len);
	k->root = flx_torchfile_root(k->tf);
	if (!k->root || k->root->kind != FLX_PV_DICT)
		return fail(x, k->rel, NULL,
			    "the saved value is a %s, not a dict",
			    flx_pv_kind_name(k->root));
	return 0;
}

/* The model state dicts of rank k: "model", or "model0".."model<VP-1>". */
static int model_dicts(ld *x, const rank *k, const flx_pv **md)
{
	const flx_pv *v = flx_pv_dict_get(k->root, "model");
	int n = 0;

	if (v) {
		md[0] = v;
		n = 1;
	} else {
		for (; n < MAX_VP; n++) {
			char key[16];

			snprintf(key, sizeof(key), "model%d", n);
			if (!(md[n] = flx_pv_dict_get(k->root, key)))
				break;
		}
	}
	if (!n)
		return fail(x, k->rel, "model",
			    "no model state dict ('model' or 'model0')");
	if (x->VP && n != x->VP)
		return fail(x, k->rel, "model", "%d model chunks, %s has %d", n,
			    x->rk[0].rel, x->VP);
	x->VP = n;
	for (int i = 0; i < n; i++)
		if (md[i]->kind != FLX_PV_DICT)
			return fail(x, k->rel, n > 1 ? "model0" : "model",
				    "a %s, not a dict",
				    flx_pv_kind_name(md[i]));
	return 0;
}

/* An _extra_state value that holds nothing: None, or an empty tensor
 * (Transformer Engine's when FP8 is off). */
static bool empty_extra(const rank *k, const flx_pv *v, const char *key)
{
	flx_torchfile_tensor tt;
	flx_error e;

	if (v->kind == FLX_PV_NONE)
		return true;
	flx_error_init(&e);
	if (!flx_torchfile_is_tensor(v) ||
	    flx_torchfile_resolve(k->tf, v, key, &tt, &e))
		return false;
	for (int d = 0; d < tt.t.ndim; d++)
		if (!tt.t.size[d])
			return true;
	return false;
}

/* A local expert's number: digits at *p (advanced past them). */
static int expert_number(ld *x, const rank *k, const char *key, const char **p,
			 int64_t *e)
{
	if (**p < '0' || **p > '9')
		return fail(x, k->rel, key, "no expert number");
	for (*e = 0; **p >= '0' && **p <= '9'; (*p)++) {
		*e = *e * 10 + (**p - '0');
		if (*e >= MAX_EXPERTS)
			return fail(x, k->rel, key, "expert number too large");
	}
	return 0;
}

/*
 * An expert's key (rest: after "mlp.experts."), as torch_dist names it:
 * SequentialMLP's "local_experts.<e>.<linear>.<prm>" and TEGroupedMLP's
 * "<linear>.<prm><e>" (Megatron-Core megatron/core/transformer/moe/
 * experts.py; docs/formats/megatron.md#moe-experts) are both
 * "mlp.experts.experts.<linear>.<prm>" of local expert e.
 */
static int expert_key(ld *x, const rank *k, const char *key, const char *rest,
		      char *out, size_t cap, int64_t *lex)
{
	const char *p = rest, *dot;
	size_t n;
	int rc;

	if (!strncmp(p, "local_experts.", 14)) {
		p += 14;
		rc = expert_number(x, k, key, &p, lex);
		if (rc)
			return rc;
		if (*p != '.' || !p[1])
			return fail(x, k->rel, key,
				    "no module after the expert");
		snprintf(out, cap, LAYERS EXPERTS "%s", p + 1);
		return 0;
	}
	dot = strrchr(p, '.');
	if (!dot)
		return fail(x, k->rel, key, "an expert key of no known form");
	n = strlen(dot + 1);
	while (n && dot[n] >= '0' && dot[n] <= '9')
		n--;
	p = dot + 1 + n;
	if (!n || !*p)
		return fail(x, k->rel, key,
			    "an expert key of no known form (neither "
			    "local_experts.<e>. nor a grouped <prm><e>)");
	rc = expert_number(x, k, key, &p, lex);
	if (rc)
		return rc;
	snprintf(out, cap, LAYERS EXPERTS "%.*s%.*s", (int)(dot - rest), rest,
		 (int)(n + 1), dot);
	return 0;
}

/* The global key of a saved key, its local layer (-1: none) and local
 * expert (-1: none): torch_dist names (the local spec's norms fused into
 * the linear after them, as Megatron-Core's sharded_state_dict_keys_map
 * names them; a MoE layer's pre_mlp_layernorm is renamed back by
 * moe_layout()). */
static int global_key(ld *x, const rank *k, const char *key, char *out,
		      size_t cap, int64_t *layer, int64_t *lex)
{
	const char *rest = key + sizeof(LAYERS) - 1;
	int64_t l = 0;

	*layer = -1;
	*lex = -1;
	if (strncmp(key, LAYERS, sizeof(LAYERS) - 1)) {
		if (strncmp(key, "embedding.", 10) &&
		    strncmp(key, "decoder.final_layernorm.", 24) &&
		    strncmp(key, "output_layer.", 13))
			return fail(x, k->rel, key,
				    "not a Megatron-Core GPT key (no rule "
				    "for it)");
		snprintf(out, cap, "%s", key);
		return 0;
	}
	if (*rest < '0' || *rest > '9')
		return fail(x, k->rel, key, "no layer number");
	while (*rest >= '0' && *rest <= '9') {
		l = l * 10 + (*rest++ - '0');
		if (l >= MAX_LOCAL_LAYERS)
			return fail(x, k->rel, key, "layer number too large");
	}
	if (*rest++ != '.')
		return fail(x, k->rel, key, "no layer number");
	*layer = l;
	if (!strncmp(rest, "mlp.experts.", 12))
		return expert_key(x, k, key, rest + 12, out, cap, lex);
	if (!strncmp(rest, "input_layernorm.", 16))
		snprintf(out, cap,
			 LAYERS "self_attention.linear_qkv.layer_norm_%s",
			 rest + 16);
	else if (!strncmp(rest, "pre_mlp_layernorm.", 18))
		snprintf(out, cap, LAYERS "mlp.linear_fc1.layer_norm_%s",
			 rest + 18);
	else
		snprintf(out, cap, LAYERS "%s", rest);
	return 0;
}

/* Record one saved model entry of rank k, chunk vc. */
static int add_entry(ld *x, rank *k, int vc, const char *key, const flx_pv *v)
{
	char gk[512], what[560];
	flx_torchfile_tensor tt;
	int64_t layer, lex;
	const char *xs = strstr(key, "._extra_state");
	rec *r;
	int rc;

	if (x->VP > 1)
		snprintf(what, sizeof(what), "model%d/%s", vc, key);
	else
		snprintf(what, sizeof(what), "%s", key);
	/* TEGroupedMLP's are _extra_state<e> for the experts past the first */
	if (xs && !xs[13 + strspn(xs + 13, "0123456789")]) {
		if (empty_extra(k, v, key))
			return 0;
		return fail(x, k->rel, what,
			    "a non-empty _extra_state (Transformer Engine FP8 "
			    "state) is not read");
	}
	if (strlen(key) > 400)
		return fail(x, k->rel, what, "key too long");
	rc = global_key(x, k, key, gk, sizeof(gk), &layer, &lex);
	if (rc)
		return rc;
	if (x->nr == x->cap) {
		size_t nc = x->cap ? 2 * x->cap : 256;
		rec *p = realloc(x->r, nc * sizeof(*p));

		if (!p)
			return -ENOMEM;
		x->r = p;
		x->cap = nc;
	}
	r = &x->r[x->nr];
	memset(r, 0, sizeof(*r));
	rc = flx_torchfile_is_tensor(v)
		 ? flx_torchfile_resolve(k->tf, v, what, &tt, x->err)
		 : fail(x, k->rel, what, "a %s, not a tensor",
			flx_pv_kind_name(v));
	if (rc)
		return rc;
	r->p = tt.t;
	r->key = strdup(gk);
	r->local = strdup(what);
	if (!r->key || !r->local) {
		free(r->key);
		free(r->local);
		return -ENOMEM;
	}
	x->nr++;
	r->rk = k;
	r->vc = vc;
	r->layer = layer;
	r->lex = lex;
	r->ex = -1;
	r->pre_mlp = layer >= 0 && strstr(key, ".pre_mlp_layernorm.");
	r->data_off = tt.data_off;
	if (layer >= 0 && layer + 1 > k->nlocal)
		k->nlocal = (int)(layer + 1);
	return 0;
}

static int read_models(ld *x)
{
	const flx_pv *md[MAX_VP];
	int rc = 0;

	for (int i = 0; !rc && i < x->nrk; i++) {
		rank *k = &x->rk[i];

		rc = read_rank(x, k);
		if (!rc)
			rc = model_dicts(x, k, md);
		for (int vc = 0; !rc && vc < x->VP; vc++) {
			const flx_pv *d = md[vc];

			for (size_t j = 0; !rc && j < d->u.dict.n; j++) {
				const char *key =
				    flx_pv_str(d->u.dict.kv[2 * j]);

				if (!key || strlen(key) !=
						d->u.dict.kv[2 * j]->u.str.len)
					rc = fail(x, k->rel, "model",
						  "a key that is not a string");
				else
					rc = add_entry(x, k, vc, key,
						       d->u.dict.kv[2 * j + 1]);
			}
		}
	}
	return rc;
}

/* ---- the facts ---- */

/* The args fields every rank must agree on. */
#define AGREE(f)                                                               \
	{                                                                      \
#f, offsetof(flx_megatron, f)                                  \
	}
static const struct {
	const char *name;
	size_t off;
} agree64[] =
    {
	AGREE(iteration),
	AGREE(num_layers),
	AGREE(hidden_size),
	AGREE(num_attention_heads),
	AGREE(num_query_groups),
	AGREE(kv_channels),
	AGREE(ffn_hidden_size),
	AGREE(padded_vocab_size),
	AGREE(make_vocab_size_divisible_by),
	AGREE(tensor_model_parallel_size),
	AGREE(pipeline_model_parallel_size),
	AGREE(virtual_pipeline_model_parallel_size),
	AGREE(vocab_size),
	AGREE(num_experts),
	AGREE(moe_ffn_hidden_size),
	AGREE(expert_model_parallel_size),
	AGREE(expert_tensor_parallel_size),
},
  agree32[] = {
      AGREE(swiglu),
      AGREE(untie_embeddings_and_output_weights),
};
#undef AGREE

static int read_facts(ld *x)
{
	flx_megatron other;
	int rc;

	x->m = flx_pool_alloc(&x->c->pool, sizeof(*x->m));
	if (!x->m)
		return -ENOMEM;
	memset(x->m, 0, sizeof(*x->m));
	rc = flx_mcore_interpret_state(x->rk[0].rel, x->rk[0].root, x->m,
				       x->err);
	if (!rc)
		rc = assign_grid(x);
	for (int i = 1; !rc && i < x->nrk; i++) {
		const char *at = x->rk[i].rel;

		memset(&other, 0, sizeof(other));
		rc = flx_mcore_interpret_state(at, x->rk[i].root, &other,
					       x->err);
		for (size_t f = 0;
		     !rc && f < sizeof(agree64) / sizeof(agree64[0]); f++)
			if (*(int64_t *)((char *)x->m + agree64[f].off) !=
			    *(int64_t *)((char *)&other + agree64[f].off))
				rc = fail(
				    x, at, agree64[f].name,
				    "%lld, but %s says %lld",
				    (long long)*(int64_t *)((char *)&other +
							    agree64[f].off),
				    x->rk[0].rel,
				    (long long)*(int64_t *)((char *)x->m +
							    agree64[f].off));
		for (size_t f = 0;
		     !rc && f < sizeof(agree32) / sizeof(agree32[0]); f++)
			if (*(int *)((char *)x->m + agree32[f].off) !=
			    *(int *)((char *)&other + agree32[f].off))
				rc = fail(
				    x, at, agree32[f].name,
				    "%d, but %s says %d",
				    *(int *)((char *)&other + agree32[f].off),
				    x->rk[0].rel,
				    *(int *)((char *)x->m + agree32[f].off));
	}
	if (rc)
		return rc;
	/* the directory names are the layout; args must not say otherwise */
	if (x->m->tensor_model_parallel_size > 0 &&
	    x->m->tensor_model_parallel_size != x->TP)
		return fail(x, x->rk[0].rel, "args.tensor_model_parallel_size",
			    "%lld, but the rank directories make tp %d",
			    (long long)x->m->tensor_model_parallel_size, x->TP);
	if (x->m->pipeline_model_parallel_size > 0 &&
	    x->m->pipeline_model_parallel_size != x->PP)
		return fail(
		    x, x->rk[0].rel, "args.pipeline_model_parallel_size",
		    "%lld, but the rank directories make pp %d",
		    (long long)x->m->pipeline_model_parallel_size, x->PP);
	if (x->m->virtual_pipeline_model_parallel_size > 1 &&
	    x->m->virtual_pipeline_model_parallel_size != x->VP)
		return fail(
		    x, x->rk[0].rel,
		    "args.virtual_pipeline_model_parallel_size",
		    "%lld, but the files hold %d model chunks",
		    (long long)x->m->virtual_pipeline_model_parallel_size,
		    x->VP);
	if (x->m->expert_model_parallel_size > 0 &&
	    x->m->expert_model_parallel_size != x->EP)
		return fail(x, x->rk[0].rel, "args.expert_model_parallel_size",
			    "%lld, but the rank directories make ep %d",
			    (long long)x->m->expert_model_parallel_size, x->EP);
	x->m->tensor_model_parallel_size = x->TP;
	x->m->pipeline_model_parallel_size = x->PP;
	x->m->expert_model_parallel_size = x->EP;
	x->m->virtual_pipeline_model_parallel_size = x->VP > 1 ? x->VP : -1;
	x->m->optim_sharding[0] = '\0';
	x->m->optim_assumed = false;
	x->m->singleton_local_shards = -1;
	x->m->common_file = x->rk[0].file;
	x->m->pkl_off = x->rk[0].pkl_off;
	x->m->pkl_len = x->rk[0].pkl_len;
	x->m->release = flx_build_entered(x->b) &&
			!strcmp(flx_build_entered(x->b), "release");
	return 0;
}

/* Layers per chunk (the same on every stage: Megatron's even split), the
 * layer count, and each record's global layer. */
static int layer_layout(ld *x)
{
	int n = -1;

	for (int i = 0; i < x->nrk; i++) {
		if (n >= 0 && x->rk[i].nlocal != n)
			return fail(x, x->rk[i].rel, "decoder.layers",
				    "%d layers per model chunk, %s has %d: "
				    "uneven stages are not read",
				    x->rk[i].nlocal < 0 ? 0 : x->rk[i].nlocal,
				    x->rk[0].rel, n < 0 ? 0 : n);
		n = x->rk[i].nlocal;
	}
	if (n <= 0)
		return fail(x, x->rk[0].rel, "decoder.layers",
			    "no transformer layer");
	x->per = n;
	x->L = (int64_t)n * x->PP * x->VP;
	if (x->m->num_layers > 0 && x->m->num_layers != x->L)
		return fail(x, x->rk[0].rel, "args.num_layers",
			    "%lld, but the files hold %lld layers (%d per "
			    "chunk x pp %d x vp %d)",
			    (long long)x->m->num_layers, (long long)x->L, n,
			    x->PP, x->VP);
	x->m->num_layers = x->L;
	for (size_t i = 0; i < x->nr; i++)
		if (x->r[i].layer >= 0)
			x->r[i].g = (int64_t)x->r[i].vc * (x->L / x->VP) +
				    (int64_t)x->r[i].rk->pp * x->per +
				    x->r[i].layer;
	return 0;
}

/*
 * The experts: local experts per rank (the same on every rank: the count
 * checks of build_tensor() find one missing), each record's global expert
 * ep x local + e (Megatron-Core megatron/core/transformer/moe/experts.py,
 * the local-to-global offset of its sharded_state_dict), the count against
 * args.num_experts.  A MoE model keeps pre_mlp_layernorm (no fc1 to fuse
 * it into); dense and MoE layers mixed (args.moe_layer_freq) are refused.
 */
static int moe_layout(ld *x)
{
	const rec *dense = NULL, *moe = NULL;

	for (size_t i = 0; i < x->nr; i++) {
		const rec *r = &x->r[i];

		if (r->lex >= 0 && r->lex + 1 > x->NLE)
			x->NLE = r->lex + 1;
		if (r->lex >= 0 ||
		    !strncmp(r->key, LAYERS "mlp.router.", sizeof(LAYERS) + 10))
			moe = moe ? moe : r;
		if (!strncmp(r->key, LAYERS "mlp.linear_fc1.weight",
			     sizeof(LAYERS) + 20))
			dense = dense ? dense : r;
	}
	if (moe && dense)
		return fail(x, moe->rk->rel, moe->local,
			    "a MoE layer beside dense ones (%s): mixed "
			    "layers are not read",
			    dense->local);
	if (!x->NLE && x->EP > 1)
		return fail(x, x->rk[0].rel, "args.expert_model_parallel_size",
			    "expert-parallel rank directories (ep %d), but no "
			    "expert in the rank files",
			    x->EP);
	if (x->NLE && x->m->expert_tensor_parallel_size > 0 &&
	    x->m->expert_tensor_parallel_size != x->TP)
		return fail(x, x->rk[0].rel, "args.expert_tensor_parallel_size",
			    "%lld, but tp is %d: an expert tensor-parallel "
			    "size of its own is not read",
			    (long long)x->m->expert_tensor_parallel_size,
			    x->TP);
	x->E = x->NLE * x->EP;
	if (x->NLE && x->m->num_experts > 0 && x->m->num_experts != x->E)
		return fail(x, x->rk[0].rel, "args.num_experts",
			    "%lld, but the files hold %lld (%lld per rank x "
			    "ep %d)",
			    (long long)x->m->num_experts, (long long)x->E,
			    (long long)x->NLE, x->EP);
	if (x->NLE)
		x->m->num_experts = x->E;
	for (size_t i = 0; i < x->nr; i++) {
		rec *r = &x->r[i];
		const char *dot;
		char prm[512];

		if (r->lex >= 0)
			r->ex = (int64_t)r->rk->ep * x->NLE + r->lex;
		if (!moe || !r->pre_mlp)
			continue;
		dot = strrchr(r->key, '.');
		if (!dot || strncmp(dot + 1, "layer_norm_", 11))
			continue;
		/* "mlp.linear_fc1.layer_norm_<p>": "pre_mlp_layernorm.<p>",
		 * shorter, in place */
		snprintf(prm, sizeof(prm), "%s", dot + 12);
		snprintf(r->key + sizeof(LAYERS) - 1,
			 strlen(r->key) - sizeof(LAYERS) + 2,
			 "pre_mlp_layernorm.%s", prm);
	}
	return 0;
}

static const rec *find_rec(const ld *x, const char *key, int tp, int pp, int ep)
{
	for (size_t i = 0; i < x->nr; i++)
		if (x->r[i].rk->tp == tp && x->r[i].rk->pp == pp &&
		    x->r[i].rk->ep == ep && !strcmp(x->r[i].key, key))
			return &x->r[i];
	return NULL;
}

/* SwiGLU: args.swiglu, else fc1's rows (a dense fc1's, else an expert's)
 * against args.ffn_hidden_size (args.moe_ffn_hidden_size), else
 * -o megatron_swiglu= (a stated value that contradicts the first two is
 * refused); no fc1: nothing it could split, 0.  Tied embeddings: args,
 * else (pp 1) whether output_layer.weight exists. */
static int shape_facts(ld *x, const flx_opt_vals *vals)
{
	const rec *fc1 = NULL, *out = NULL;
	const char *proof = "args.swiglu";
	int rc;

	int64_t ffn = x->m->ffn_hidden_size;
	const char *ffn_arg = "args.ffn_hidden_size";

	for (size_t i = 0; i < x->nr && !fc1; i++)
		if (!strcmp(x->r[i].key, LAYERS "mlp.linear_fc1.weight"))
			fc1 = &x->r[i];
	/* a MoE model: its experts' fc1 against args.moe_ffn_hidden_size
	 * (Megatron's default for it is ffn_hidden_size) */
	for (size_t i = 0; i < x->nr && !fc1; i++)
		if (!strcmp(x->r[i].key, LAYERS EXPERTS "linear_fc1.weight")) {
			fc1 = &x->r[i];
			if (x->m->moe_ffn_hidden_size > 0) {
				ffn = x->m->moe_ffn_hidden_size;
				ffn_arg = "args.moe_ffn_hidden_size";
			}
		}
	if (x->m->swiglu < 0 && fc1) {
		int64_t rows = fc1->p.size[0] * x->TP;

		proof = ffn == x->m->ffn_hidden_size
			    ? "linear_fc1's rows against args.ffn_hidden_size"
			    : "the experts' linear_fc1 rows against "
			      "args.moe_ffn_hidden_size";
		if (ffn > 0 && rows == 2 * ffn)
			x->m->swiglu = 1;
		else if (ffn > 0 && rows == ffn)
			x->m->swiglu = 0;
	}
	rc = flx_mcore_state_swiglu(vals, x->m, proof, x->err);
	if (rc)
		return rc;
	x->swiglu = x->m->swiglu;
	if (x->swiglu < 0 && fc1)
		return fail(x, x->rk[0].rel, "args.swiglu",
			    "absent, and linear_fc1's %lld rows do not "
			    "tell (%s %lld): state it with -o "
			    "megatron_swiglu=on|off",
			    (long long)(fc1->p.size[0] * x->TP), ffn_arg,
			    (long long)ffn);
	if (x->swiglu < 0)
		x->swiglu = 0;
	x->m->swiglu = x->swiglu;
	for (size_t i = 0; i < x->nr && !out; i++)
		if (!strcmp(x->r[i].key, OUT_W))
			out = &x->r[i];
	x->untie = x->m->untie_embeddings_and_output_weights;
	if (x->untie < 0 && x->PP == 1)
		x->untie = out != NULL;
	if (x->untie < 0 && out)
		return fail(x, x->rk[0].rel,
			    "args.untie_embeddings_and_output_weights",
			    "absent: a last stage's output_layer.weight may "
			    "be a tied copy or its own");
	if (x->untie < 0)
		x->untie = 0;
	x->m->untie_embeddings_and_output_weights = x->untie;
	return 0;
}

/* ---- comparing replicated copies ---- */

static uint64_t rec_bytes(const rec *r)
{
	uint64_t n = flx_dtype_size(r->p.dtype);

	for (int d = 0; d < r->p.ndim; d++)
		n *= (uint64_t)r->p.size[d];
	return n;
}

static bool rec_dense(const rec *r)
{
	int64_t s = 1;

	for (int d = r->p.ndim - 1; d >= 0; d--) {
		if (r->p.size[d] > 1 && r->p.stride[d] != s)
			return false;
		s *= r->p.size[d];
	}
	return true;
}

/* Whether a and b (same dtype and shape) hold the same bytes. */
static int same_bytes(ld *x, const rec *a, const rec *b, unsigned char *buf,
		      bool *same)
{
	uint64_t n = rec_bytes(a), es = flx_dtype_size(a->p.dtype);
	uint64_t oa = a->data_off + (uint64_t)a->p.storage_offset * es;
	uint64_t ob = b->data_off + (uint64_t)b->p.storage_offset * es;
	int rc = 0;

	*same = true;
	if (!rec_dense(a) || !rec_dense(b))
		return fail(x, b->rk->rel, b->local,
			    "a replicated tensor saved with strides: not "
			    "compared, not read");
	for (uint64_t at = 0; !rc && *same && at < n; at += CMP_BUF / 2) {
		size_t k =
		    n - at < CMP_BUF / 2 ? (size_t)(n - at) : CMP_BUF / 2;

		rc = flx_file_pread(x->c, a->rk->file, buf, k, oa + at);
		if (!rc)
			rc = flx_file_pread(x->c, b->rk->file,
					    buf + CMP_BUF / 2, k, ob + at);
		if (rc)
			return flx_error_set(
			    x->err, rc, rc == -EIO ? b->rk->rel : a->rk->rel,
			    b->local, "cannot read: %s", strerror(-rc));
		*same = !memcmp(buf, buf + CMP_BUF / 2, k);
	}
	return rc;
}

/* ---- the global tensors ---- */

static int cmp_rec(const void *pa, const void *pb)
{
	const rec *a = pa, *b = pb;
	int c = strcmp(a->key, b->key);

	if (c)
		return c;
	if (a->g != b->g)
		return a->g < b->g ? -1 : 1;
	if (a->ex != b->ex)
		return a->ex < b->ex ? -1 : 1;
	if (a->rk->tp != b->rk->tp)
		return a->rk->tp < b->rk->tp ? -1 : 1;
	if (a->rk->ep != b->rk->ep)
		return a->rk->ep < b->rk->ep ? -1 : 1;
	return a->rk->pp < b->rk->pp ? -1 : a->rk->pp > b->rk->pp;
}

/* The split of key, and the axis it splits (-1: none). */
static flx_mlg_split key_rule(const ld *x, const char *key, int *axis)
{
	char mod[512];
	const char *dot = strrchr(key, '.'), *m = key;
	flx_mlg_split r;

	if (!strncmp(key, LAYERS, sizeof(LAYERS) - 1))
		m = key + sizeof(LAYERS) - 1;
	snprintf(mod, sizeof(mod), "%.*s", dot ? (int)(dot - m) : 0, m);
	r = flx_mlg_split_rule(mod, dot ? dot + 1 : key, x->swiglu == 1);
	*axis = r == FLX_MLG_ROW ? 1 : r == FLX_MLG_REPL ? -1 : 0;
	if (r == FLX_MLG_CHUNKS)
		*axis = -1;
	return r;
}

/* lead: the stacked axes before the parameter's (layer, then expert),
 * each of extent 1 at the record's layer r->g and expert r->ex. */
static void set_chunk(flx_chunk *ch, const rec *r, int lead, int axis,
		      int64_t off, int64_t size, int64_t soff)
{
	int nd = lead + r->p.ndim;

	for (int d = 0; d < lead; d++) {
		ch->off[d] = d ? r->ex : r->g;
		ch->size[d] = 1;
		ch->stride[d] = 1;
		for (int k = 0; k < r->p.ndim; k++)
			ch->stride[d] *= r->p.size[k] ? r->p.size[k] : 1;
	}
	for (int d = 0; d < r->p.ndim; d++) {
		ch->off[lead + d] = 0;
		ch->size[lead + d] = r->p.size[d];
		ch->stride[lead + d] = r->p.stride[d];
	}
	if (axis >= 0) {
		ch->off[lead + axis] = off;
		ch->size[lead + axis] = size;
	}
	ch->file = r->rk->file;
	ch->data_off = r->data_off;
	ch->item_off = r->data_off;
	ch->item_len = r->p.storage_bytes;
	ch->storage_offset = soff;
	ch->contig_from = flx_chunk_contig_from(nd, ch);
}

/* Records [a, e) of one key: checks, then one tensor.  Sorted (cmp_rec),
 * they are per group (layer, or layer and expert), per tp rank, per
 * expert rank copy: R copies of each (group, tp), R = EP for a tensor
 * outside the experts (each expert rank holds it), 1 for an expert's. */
static int build_tensor(ld *x, size_t a, size_t e, flx_tensor *t,
			unsigned char *buf)
{
	const rec *r0 = &x->r[a];
	bool layer = r0->layer >= 0, expert = r0->lex >= 0, tied_out = false;
	int axis, lead = layer ? (expert ? 2 : 1) : 0, rc;
	int R = expert ? 1 : x->EP;
	flx_mlg_split rule = key_rule(x, r0->key, &axis);
	int64_t groups = layer ? x->L * (expert ? x->E : 1) : 1;
	uint32_t nch = 0, k;
	size_t i, per = (size_t)x->TP * (size_t)R;

	if (!strcmp(r0->key, OUT_W) && !x->untie)
		tied_out = true;
	for (i = a; i < e; i++) {
		const rec *r = &x->r[i];

		if ((r->layer >= 0) != layer || (r->lex >= 0) != expert)
			return fail(x, r->rk->rel, r->local,
				    "both a layer (or expert) key and a global "
				    "one");
		if (r->p.dtype != r0->p.dtype || r->p.ndim != r0->p.ndim ||
		    memcmp(r->p.size, r0->p.size,
			   (size_t)r0->p.ndim * sizeof(int64_t)))
			return fail(x, r->rk->rel, r->local,
				    "dtype or shape differs from %s's %s",
				    r0->rk->rel, r0->local);
	}
	if (rule == FLX_MLG_CHUNKS && x->TP > 1)
		return fail(x, r0->rk->rel, r0->local,
			    "no tensor-parallel rule for this key");
	/* at tp 1 a rank's tensor is the global one, [gate; up] too */
	if (rule == FLX_MLG_GLU && x->TP == 1)
		rule = FLX_MLG_COL;
	if (axis >= r0->p.ndim)
		return fail(x, r0->rk->rel, r0->local,
			    "%d axes: its split axis %d is missing", r0->p.ndim,
			    axis);
	if (rule == FLX_MLG_GLU && r0->p.size[0] % 2)
		return fail(x, r0->rk->rel, r0->local,
			    "SwiGLU: %lld rows do not halve into gate and up",
			    (long long)r0->p.size[0]);
	/* each (group, tp, expert rank copy) once */
	for (i = a; i < e; i++) {
		const rec *r = &x->r[i];
		int64_t want = (int64_t)((i - a) / per), got = 0;
		int want_t = (int)((i - a) / (size_t)R % (size_t)x->TP);
		int want_e = (int)((i - a) % (size_t)R);

		if ((int64_t)(i - a) >= groups * (int64_t)per)
			return fail(x, r->rk->rel, r->local,
				    "saved twice (also in another rank file "
				    "of tp rank %d)",
				    r->rk->tp);
		if (layer)
			got = expert ? r->g * x->E + r->ex : r->g;
		if (got != want || r->rk->tp != want_t ||
		    (R > 1 && r->rk->ep != want_e)) {
			char ep[32] = "";

			if (R > 1)
				snprintf(ep, sizeof(ep), " and ep rank %d",
					 want_e);
			return fail(x, r0->rk->rel, r0->local,
				    "missing in the rank files of tp rank "
				    "%d%s%s",
				    want_t, ep,
				    expert  ? " for an expert of a layer"
				    : layer ? " for a layer"
					    : "");
		}
	}
	if ((int64_t)(e - a) != groups * (int64_t)per)
		return fail(
		    x, r0->rk->rel, r0->local,
		    "missing in %lld of the %lld rank files that "
		    "should hold it",
		    (long long)(groups * (int64_t)per - (int64_t)(e - a)),
		    (long long)(groups * (int64_t)per));
	if (tied_out) {
		/* the last stage's copy of its slice of the embedding */
		for (i = a; i < e; i++) {
			const rec *emb = find_rec(x, WORD_EMB, x->r[i].rk->tp,
						  0, x->r[i].rk->ep);
			bool same = false;

			if (!emb || emb->p.dtype != x->r[i].p.dtype ||
			    memcmp(emb->p.size, x->r[i].p.size,
				   sizeof(emb->p.size)))
				return fail(x, x->r[i].rk->rel, x->r[i].local,
					    "tied, but unlike the word "
					    "embedding of its tp rank");
			rc = same_bytes(x, emb, &x->r[i], buf, &same);
			if (rc)
				return rc;
			if (!same)
				return fail(x, x->r[i].rk->rel, x->r[i].local,
					    "tied (args), but its bytes differ "
					    "from the word embedding's");
		}
		return 1; /* no tensor of its own */
	}
	/* replicated copies: across tp ranks (a replicated rule) and across
	 * expert ranks (everything outside the experts), each compared with
	 * its first */
	for (i = a; i < e; i++) {
		bool repl = rule == FLX_MLG_REPL ||
			    (rule == FLX_MLG_CHUNKS && x->TP == 1);
		size_t grp = (i - a) / per * per;
		const rec
		    *r = &x->r[i],
		    *base = &x->r[a + (repl ? grp
					    : grp + (i - a - grp) / (size_t)R *
							(size_t)R)];
		bool same = true;

		if (r == base)
			continue;
		rc = same_bytes(x, base, r, buf, &same);
		if (rc)
			return rc;
		if (!same)
			return fail(
			    x, r->rk->rel, r->local,
			    "replicated, but its bytes differ from %s's",
			    base->rk->rel);
	}
	/* the tensor */
	t->fqn = flx_pool_alloc(&x->c->pool, strlen(r0->key) + 1);
	if (!t->fqn)
		return -ENOMEM;
	strcpy(t->fqn, r0->key);
	t->dtype = r0->p.dtype;
	t->ndim = lead + r0->p.ndim;
	if (t->ndim > FLX_MAX_DIMS)
		return fail(x, r0->rk->rel, r0->local, "too many axes");
	t->stacked = lead;
	if (lead)
		t->shape[0] = x->L;
	if (lead > 1)
		t->shape[1] = x->E;
	for (int d = 0; d < r0->p.ndim; d++)
		t->shape[lead + d] = r0->p.size[d];
	if (axis >= 0)
		t->shape[lead + axis] *= x->TP;
	if (rule == FLX_MLG_REPL || rule == FLX_MLG_CHUNKS)
		nch = (uint32_t)groups;
	else
		nch =
		    (uint32_t)(groups * x->TP * (rule == FLX_MLG_GLU ? 2 : 1));
	rc = flx_tensor_pool_chunks(&x->c->pool, t, nch);
	if (rc)
		return rc;
	k = 0;
	for (i = a; i < e; i++) {
		const rec *r = &x->r[i];
		int64_t n = r->p.size[axis >= 0 ? axis : 0];

		if ((i - a) % (size_t)R)
			continue; /* another expert rank's copy */
		if (rule == FLX_MLG_REPL || rule == FLX_MLG_CHUNKS) {
			if (r->rk->tp == 0)
				set_chunk(&t->chunks[k++], r, lead, -1, 0, 0,
					  r->p.storage_offset);
		} else if (rule == FLX_MLG_GLU) {
			int64_t f = n / 2;

			set_chunk(&t->chunks[k++], r, lead, 0, r->rk->tp * f, f,
				  r->p.storage_offset);
			set_chunk(&t->chunks[k++], r, lead, 0,
				  (int64_t)x->TP * f + r->rk->tp * f, f,
				  r->p.storage_offset + f * r->p.stride[0]);
		} else {
			set_chunk(&t->chunks[k++], r, lead, axis, r->rk->tp * n,
				  n, r->p.storage_offset);
		}
	}
	return 0;
}

static int build_tensors(ld *x)
{
	unsigned char *buf = malloc(CMP_BUF);
	size_t n = 0, a = 0;
	int rc = 0;

	if (!buf)
		return -ENOMEM;
	qsort(x->r, x->nr, sizeof(rec), cmp_rec);
	for (size_t i = 0; i < x->nr; i++)
		if (!i || strcmp(x->r[i].key, x->r[i - 1].key))
			n++;
	x->c->tensors = calloc(n ? n : 1, sizeof(flx_tensor));
	if (!x->c->tensors) {
		free(buf);
		return -ENOMEM;
	}
	for (size_t i = 1; !rc && i <= x->nr; i++) {
		if (i < x->nr && !strcmp(x->r[i].key, x->r[a].key))
			continue;
		rc = build_tensor(x, a, i, &x->c->tensors[x->c->ntensors], buf);
		if (rc == 0)
			x->c->ntensors++;
		else if (rc == 1)
			rc = 0;
		a = i;
	}
	free(buf);
	return rc;
}

/* Each rank file whole, as an object: what the model tensors leave out
 * (optimizer, scheduler, rng state), exactly as saved. */
static int rank_objects(ld *x)
{
	x->c->objects = calloc((size_t)x->nrk, sizeof(flx_object));
	if (!x->c->objects)
		return -ENOMEM;
	for (int i = 0; i < x->nrk; i++) {
		flx_object *o = &x->c->objects[i];

		o->fqn = flx_pool_alloc(&x->c->pool, strlen(x->rk[i].name) + 1);
		if (!o->fqn)
			return -ENOMEM;
		strcpy(o->fqn, x->rk[i].name);
		o->file = x->rk[i].file;
		o->off = 0;
		o->len = x->c->files[x->rk[i].file].size;
		x->c->nobjects++;
	}
	return 0;
}

static int load(flx_build *b, const flx_ckpt_opts *o, flx_error *err)
{
	ld x = {.b = b, .c = flx_build_ckpt(b), .err = err};
	int rc;

	rc = list_ranks(&x);
	if (!rc)
		rc = read_models(&x);
	if (!rc)
		rc = read_facts(&x);
	if (!rc)
		rc = layer_layout(&x);
	if (!rc)
		rc = moe_layout(&x);
	if (!rc)
		rc = shape_facts(&x, o ? o->vals : NULL);
	if (!rc)
		rc = build_tensors(&x);
	if (!rc)
		rc = rank_objects(&x);
	if (!rc) {
		char w[96];

		snprintf(w, sizeof(w),
			 "Megatron-LM legacy (torch), checkpoint_version %g",
			 x.m->checkpoint_version);
		x.c->writer = strdup(w);
		if (!x.c->writer)
			rc = -ENOMEM;
		x.c->mtime_ns = x.c->files[x.rk[0].file].mtime_ns;
		x.c->src_state = x.m;
	}
	for (size_t i = 0; i < x.nr; i++) {
		free(x.r[i].key);
		free(x.r[i].local);
	}
	free(x.r);
	for (int i = 0; i < x.nrk; i++) {
		flx_torchfile_close(x.rk[i].tf);
	}
	free(x.rk);
	return rc;
}

const flx_source flx_source_megatron_legacy = {
    .name = "megatron-legacy",
    .kind = "Megatron-LM legacy (torch)",
    .marker = "mp_rank_*/" RANK_FILE,
    .variant = false,
    .probe = probe,
    .owns = owns,
    .load = load,
    .enter = flx_mcore_enter,
    /* megatron_iter; the facts "megatron" (the args) and "swiglu" */
    .opts = &flx_mcore_opts,
    .fact = flx_mcore_fact,
    .facts = flx_mcore_facts,
};
