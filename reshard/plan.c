/* SPDX-License-Identifier: MIT */
/*
 * Placement: which tensor goes where under the target spec (split axis,
 * stages, names), and the views of its boxes (view.c), all kept in the
 * plan's arena (arena.c).
 */
#include "plan.h"

#include "arena_internal.h"
#include "boxindex_internal.h"
#include "transform.h"
#include "view_internal.h"

#include <errno.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- placement ---- */

typedef struct layer_match {
	int layer;     /* -1: not a layer tensor */
	size_t so, eo; /* the index digits in the FQN */
} layer_match;

/*
 * An allocation failure inside regexec() must not read as "no match" (the
 * tensor would silently land on another stage).  glibc's regexec() returns
 * REG_NOMATCH for every internal error, REG_ESPACE included, so the failed
 * malloc's errno is what tells them apart: callers clear errno first.
 */
static int match_rc(int r)
{
	if (r == 0 || (r == REG_NOMATCH && errno != ENOMEM))
		return 0;
	return -ENOMEM;
}

/* dflt: rx is FLX_DEFAULT_LAYER_REGEX, matched without regexec().
 * @return 0 (m->layer = -1 when fqn is no layer tensor) or -ENOMEM. */
static int match_layer(const regex_t *rx, bool dflt, const char *fqn,
		       layer_match *m)
{
	regmatch_t g[10];
	size_t ng = rx->re_nsub < 9 ? rx->re_nsub : 9;
	long v;
	int r;

	m->layer = -1;
	if (dflt) {
		if (!flx_default_layer_match(fqn, &m->so, &m->eo))
			return 0;
	} else {
		errno = 0;
		r = regexec(rx, fqn, ng + 1, g, 0);
		if (r != 0 || ng == 0 || g[ng].rm_so < 0)
			return match_rc(r);
		m->so = (size_t)g[ng].rm_so;
		m->eo = (size_t)g[ng].rm_eo;
	}
	if (m->eo == m->so || m->eo - m->so > 9)
		return 0;
	v = 0;
	for (size_t i = m->so; i < m->eo; i++) {
		if (fqn[i] < '0' || fqn[i] > '9')
			return 0;
		v = v * 10 + (fqn[i] - '0');
	}
	m->layer = (int)v;
	return 0;
}

/* ---- placement decisions: where a tensor goes, no view built ---- */

/* What placement decides for one tensor before any view is built. */
typedef struct decision {
	int split;	/* axis, or -1: replicated on every TP rank */
	int groups;	/* parts of the split axis, each split over TP */
	bool undecided; /* no rule, no single saved axis (decide_split()) */
	const flx_rule *rule; /* the rule that matched, NULL if none */
	int stage_lo;	      /* stages holding it: [stage_lo, stage_hi] */
	int stage_hi;
	int layer;     /* global layer index, -1 if none */
	bool by_stage; /* stacked: each stage its range of axis 0 */
} decision;

/* The axis t was saved split along (the source's word when it gave one,
 * else the one axis past its stacked axes
 * whose chunk offsets differ), -1 when saved whole, replicated or split
 * only along stacked axes; *second: another such axis, -1 if none (the
 * split is then undetermined).  dp0: axis 0 is split only by the source's
 * data-parallel sharding (dp_scan()), which is no TP split. */
static void infer_split(const flx_tensor *t, bool dp0, int *axis, int *second)
{
	*axis = *second = -1;
	if (t->saved_split) {
		*axis = t->saved_split > 0 ? t->saved_split - 1 : -1;
		return;
	}
	for (int d = dp0 ? 1 : t->stacked; d < t->ndim && *second < 0; d++) {
		for (uint32_t i = 1; i < t->nchunks; i++) {
			if (t->chunks[i].off[d] == t->chunks[0].off[d])
				continue;
			if (*axis < 0)
				*axis = d;
			else
				*second = d;
			break;
		}
	}
}

/*
 * Data-parallel sharding along dim 0 (FSDP, FSDP2 x TP): torch.chunk(n, m)
 * pieces of dim 0 (m = 1, or TP's pieces under torch's strided shards),
 * each cut in torch.chunk(., D) pieces, empty pieces absent (never saved).
 * offs: the k sorted distinct dim-0 chunk offsets of a tensor of n rows.
 */
static bool dim0_nested(const int64_t *offs, uint32_t k, int64_t n, int64_t m,
			int64_t D)
{
	int64_t c = (n + m - 1) / m;
	uint32_t i = 0;

	for (int64_t j = 0; j < m; j++) {
		int64_t lo = j * c < n ? j * c : n;
		int64_t len = (lo + c < n ? lo + c : n) - lo;
		int64_t c2 = (len + D - 1) / D;

		for (int64_t q = 0; q < D && q * c2 < len; q++)
			if (i >= k || offs[i++] != lo + q * c2)
				return false;
	}
	return i == k;
}

/* The m that makes offs[0..k) FSDP's dim-0 pieces of degree D
 * (dim0_nested()), 0 if none.  The pieces number m * D less the empty
 * ones, so m is at least ceil(k / D) and, short pieces being rare, close
 * to it. */
static int64_t dim0_factor(const int64_t *offs, uint32_t k, int64_t n,
			   int64_t D)
{
	int64_t lo = ((int64_t)k + D - 1) / D;

	if (n == 0)
		return 1;
	for (int64_t m = lo; m <= lo + 3 && m <= (int64_t)k; m++)
		if (dim0_nested(offs, k, n, m, D))
			return m;
	return 0;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

/* The sorted distinct dim-0 offsets of t's chunks into buf, their number
 * in *k.  Chunks listed in dim-0 order (the usual case) need no sort. */
static void dim0_offsets(const flx_tensor *t, int64_t *buf, uint32_t *k)
{
	uint32_t n = 0;
	bool sorted = true;

	for (uint32_t i = 0; i < t->nchunks; i++) {
		buf[i] = t->chunks[i].off[0];
		if (i && buf[i] < buf[i - 1])
			sorted = false;
	}
	if (!sorted)
		qsort(buf, t->nchunks, sizeof(*buf), cmp_i64);
	for (uint32_t i = 0; i < t->nchunks; i++)
		if (i == 0 || buf[i] != buf[n - 1])
			buf[n++] = buf[i];
	*k = n;
}

/* Whether tensor t takes part in dp_scan(): one or more dimensions, none
 * stacking modules, and a split the source did not state itself (its
 * word is final: infer_split()). */
static bool dp_tensor(const flx_tensor *t)
{
	return t->ndim > 0 && t->stacked == 0 && t->saved_split == 0;
}

/* Candidate degrees tried, smallest piece counts first. */
#define DP_CANDIDATES 8

/*
 * The source's data-parallel degree: D >= 2 when every tensor of one or
 * more dimensions (none stacking modules) is saved in FSDP's dim-0 pieces
 * of degree D (dim0_factor()), else 0.  dp0[i]: dim 0 of tensor i is split
 * by that sharding alone (factor 1), so no TP split; a factor above 1 is
 * TP's split along dim 0 under FSDP's (torch's strided shards).
 * @return 0 and *D, dp0 filled (all false when *D is 0), or -ENOMEM.
 */
static int dp_scan(const flx_ckpt *c, int *D, bool *dp0)
{
	uint32_t maxc = 1, cand[DP_CANDIDATES], ncand = 0;
	int64_t *buf;
	bool fits = false;

	*D = 0;
	for (size_t i = 0; i < c->ntensors; i++) {
		dp0[i] = false;
		if (c->tensors[i].nchunks > maxc)
			maxc = c->tensors[i].nchunks;
	}
	buf = malloc(maxc * sizeof(*buf));
	if (!buf)
		return -ENOMEM;
	/* the smallest piece counts above 1: D is one of them */
	for (size_t i = 0; i < c->ntensors; i++) {
		uint32_t k, at = 0;

		if (!dp_tensor(&c->tensors[i]))
			continue;
		dim0_offsets(&c->tensors[i], buf, &k);
		while (at < ncand && cand[at] < k)
			at++;
		if (k < 2 || (at < ncand && cand[at] == k) ||
		    at == DP_CANDIDATES)
			continue;
		memmove(cand + at + 1, cand + at,
			(ncand - at - (ncand == DP_CANDIDATES)) *
			    sizeof(*cand));
		cand[at] = k;
		ncand += ncand < DP_CANDIDATES;
	}
	for (uint32_t ci = 0; ci < ncand && !fits; ci++) {
		fits = true;
		for (size_t i = 0; i < c->ntensors && fits; i++) {
			const flx_tensor *t = &c->tensors[i];
			uint32_t k;
			int64_t m;

			if (!dp_tensor(t))
				continue;
			dim0_offsets(t, buf, &k);
			m = dim0_factor(buf, k, t->shape[0], cand[ci]);
			fits = m > 0;
			dp0[i] = m == 1;
		}
		if (fits)
			*D = (int)cand[ci];
	}
	if (!fits)
		for (size_t i = 0; i < c->ntensors; i++)
			dp0[i] = false;
	free(buf);
	return 0;
}

/* Split axis of t: the rule's, else the saved one.  At tp=1 nothing is
 * split, so a tensor saved along several axes is served whole (-1).  A
 * tensor saved along several axes at tp > 1 without a rule is undecided:
 * *axis = -1 and *undecided (flx_plan_build() refuses the plan, listing
 * them; flx_plan_build_all() serves them replicated).
 * @return 0 and *axis (-1: replicated), or -EINVAL naming the tensor (a
 *         rule's axis it lacks). */
static int decide_split(const flx_spec *s, const flx_rule *rule,
			const flx_tensor *t, bool dp0, int *axis,
			bool *undecided, flx_error *err)
{
	int second;

	*undecided = false;
	if (rule && rule->split == FLX_SPLIT_NONE) {
		*axis = -1;
		return 0;
	}
	if (rule && rule->split == FLX_SPLIT_AXIS) {
		if (rule->axis >= t->ndim)
			return flx_error_set(err, -EINVAL, s->rules_path,
					     t->fqn,
					     "rule '%s' splits axis %d but the "
					     "tensor has %d dimension(s)",
					     rule->match, rule->axis, t->ndim);
		if (rule->axis < t->stacked)
			return flx_error_set(err, -EINVAL, s->rules_path,
					     t->fqn,
					     "rule '%s' splits axis %d, which "
					     "stacks layers or experts",
					     rule->match, rule->axis);
		*axis = rule->axis;
		return 0;
	}
	infer_split(t, dp0, axis, &second);
	if (second < 0)
		return 0;
	*axis = -1;
	*undecided = s->tp > 1;
	return 0;
}

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	return x < y ? -1 : x > y;
}

/* Stage of each distinct layer: contiguous groups, the first
 * (nlayers mod pp) stages one layer longer. */
typedef struct layer_map {
	int *idx; /* sorted distinct layer indices */
	int n;
	int pp;
} layer_map;

/* Position of layer among the distinct layers; layer must be one. */
static int layer_pos(const layer_map *m, int layer)
{
	int *hit = bsearch(&layer, m->idx, (size_t)m->n, sizeof(int), cmp_int);

	return hit ? (int)(hit - m->idx) : -1;
}

static int stage_of_pos(const layer_map *m, int pos)
{
	int base = m->n / m->pp, rem = m->n % m->pp;
	int big = rem * (base + 1);

	if (pos < big)
		return pos / (base + 1);
	return rem + (pos - big) / (base ? base : 1);
}

static int first_pos_of_stage(const layer_map *m, int s)
{
	int base = m->n / m->pp, rem = m->n % m->pp;

	return s < rem ? s * (base + 1) : rem * (base + 1) + (s - rem) * base;
}

/* What the decisions need besides the spec; shared by every tensor. */
typedef struct placer {
	const bool *dp0; /* per tensor, from dp_scan() */
	const regex_t *embed_rx;
	const layer_map *lm;
	const layer_match *matches; /* per tensor, from build_layer_map() */
	scratch sc;		    /* view building's, reused */
} placer;

/* Stages of the tensor named fqn with layer match m: the rule's, else its
 * layer's stage, else the first stage for an embedding and the last for
 * the rest.  @return 0 and [*lo, *hi], -EINVAL (a rule's stage past pp) or
 * -ENOMEM. */
static int decide_stages(const flx_spec *s, const flx_rule *rule,
			 const placer *pc, const layer_match *m,
			 const char *fqn, int *lo, int *hi, flx_error *err)
{
	int rc;

	switch (rule ? rule->stage : FLX_STAGE_DEFAULT) {
	case FLX_STAGE_FIRST:
		*lo = *hi = 0;
		return 0;
	case FLX_STAGE_LAST:
		*lo = *hi = s->pp - 1;
		return 0;
	case FLX_STAGE_ALL:
		*lo = 0;
		*hi = s->pp - 1;
		return 0;
	case FLX_STAGE_N:
		if (rule->stage_n >= s->pp)
			return flx_error_set(err, -EINVAL, s->rules_path, fqn,
					     "rule '%s' names stage %d but "
					     "pp=%d",
					     rule->match, rule->stage_n, s->pp);
		*lo = *hi = rule->stage_n;
		return 0;
	default:
		break;
	}
	if (m->layer >= 0) {
		*lo = *hi = stage_of_pos(pc->lm, layer_pos(pc->lm, m->layer));
		return 0;
	}
	errno = 0;
	rc = regexec(pc->embed_rx, fqn, 0, NULL, 0);
	if (match_rc(rc))
		return -ENOMEM;
	*lo = *hi = rc == 0 ? 0 : s->pp - 1;
	return 0;
}

/* Everything placement decides for tensor i of the plan's index. */
static int decide(const flx_plan *p, const placer *pc, size_t i, decision *d,
		  flx_error *err)
{
	const flx_tensor *t = &p->ckpt->tensors[i];
	const flx_rule *rule = flx_spec_match_facts(p->spec, t->fqn, p->facts);
	const layer_match *m = &pc->matches[i];
	int rc;

	*d = (decision){
	    .split = -1, .groups = 1, .layer = m->layer, .rule = rule};
	rc = decide_split(p->spec, rule, t, pc->dp0[i], &d->split,
			  &d->undecided, err);
	if (rc)
		return rc;
	/* at tp=1 every part is whole: a plain tensor */
	if (rule && rule->groups > 1 && d->split >= 0 && p->spec->tp > 1)
		d->groups = rule->groups;
	/* A stacked tensor spans every layer: each stage holds its range
	 * of axis 0 (stacked_range()). */
	if (t->stacked > 0 && !t->stacked_experts && p->spec->pp > 1 &&
	    (!rule || rule->stage == FLX_STAGE_DEFAULT)) {
		int64_t n = t->shape[0];

		d->by_stage = true;
		d->stage_lo = 0;
		d->stage_hi = (int)(n < p->spec->pp ? n : p->spec->pp) - 1;
		if (d->stage_hi < 0)
			d->stage_hi = 0;
		return 0;
	}
	return decide_stages(p->spec, rule, pc, m, t->fqn, &d->stage_lo,
			     &d->stage_hi, err);
}

/* The stage-local layer index that replaces the layer digits of a tensor
 * of layer match m in its name on stage st: *local >= 0 when the name is
 * renumbered there (pp_renumber, a layer tensor, its own stage), -1 when
 * the FQN stays. */
static void decide_local_layer(const flx_spec *s, const layer_map *lm,
			       const layer_match *m, int st, int *local)
{
	int pos = m->layer >= 0 ? layer_pos(lm, m->layer) : -1;

	*local = -1;
	if (s->pp_renumber && pos >= 0 && stage_of_pos(lm, pos) == st)
		*local = pos - first_pos_of_stage(lm, st);
}

/* The box rank r of tp holds of tensor t split along split (-1: the whole
 * tensor): torch.chunk's, see plan.h. */
static void rank_box(const flx_tensor *t, int split, int tp, int r,
		     flx_box *box)
{
	for (int d = 0; d < t->ndim; d++) {
		box->off[d] = 0;
		box->size[d] = t->shape[d];
	}
	if (split >= 0) {
		int64_t n = t->shape[split];
		int64_t c = (n + tp - 1) / tp;
		int64_t lo = (int64_t)r * c < n ? (int64_t)r * c : n;
		int64_t hi = lo + c < n ? lo + c : n;

		box->off[split] = lo;
		box->size[split] = hi - lo;
	}
}

/* The range [*off, *off + *n) of axis 0 (n entries, layers) that stage s
 * of pp holds: contiguous, the first n mod pp stages one longer. */
static void stacked_range(int64_t n, int pp, int s, int64_t *off, int64_t *len)
{
	int64_t base = n / pp, rem = n % pp;

	*off = s < rem ? s * (base + 1) : rem * (base + 1) + (s - rem) * base;
	*len = base + (s < rem);
}

/* ---- placement machinery: names and views of a decision ---- */

typedef struct name_ref {
	const char *name;
	int stage;
	size_t tensor;
} name_ref;

static int cmp_name_ref(const void *a, const void *b)
{
	const name_ref *x = a, *y = b;

	if (x->stage != y->stage)
		return x->stage < y->stage ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int check_unique_names(flx_plan *p, flx_error *err)
{
	const flx_ckpt *c = p->ckpt;
	size_t n = 0, cap = 0;
	name_ref *refs = NULL;
	int rc = 0;

	/* Without renumbering every name is an FQN, and the checkpoint's
	 * FQNs are unique (its sorted index says so at a glance). */
	if (!p->spec->pp_renumber && c->by_name) {
		size_t i = 1;

		while (i < c->ntensors &&
		       strcmp(c->by_name[i - 1]->fqn, c->by_name[i]->fqn))
			i++;
		if (i >= c->ntensors)
			return 0;
		/* a repeat: the full check below names it */
	}

	for (size_t i = 0; i < p->n; i++)
		cap += (size_t)(p->p[i].stage_hi - p->p[i].stage_lo + 1);
	refs = malloc((cap ? cap : 1) * sizeof(*refs));
	if (!refs)
		return -ENOMEM;
	for (size_t i = 0; i < p->n; i++)
		for (int s = p->p[i].stage_lo; s <= p->p[i].stage_hi; s++)
			refs[n++] =
			    (name_ref){flx_placement_name(&p->p[i], s), s, i};
	qsort(refs, n, sizeof(*refs), cmp_name_ref);
	for (size_t i = 1; i < n && !rc; i++)
		if (cmp_name_ref(&refs[i - 1], &refs[i]) == 0)
			rc = flx_error_set(err, -EINVAL, NULL,
					   p->p[refs[i].tensor].src->fqn,
					   "target name '%s' on stage %d is "
					   "also used by %s",
					   refs[i].name, refs[i].stage,
					   p->p[refs[i - 1].tensor].src->fqn);
	free(refs);
	return rc;
}

/* fqn with the layer digits replaced by local, in the plan's arena. */
static const char *renamed(flx_plan_arena *a, const char *fqn,
			   const layer_match *lm, int local)
{
	char digits[16];
	int nd = snprintf(digits, sizeof(digits), "%d", local);
	size_t tail = strlen(fqn + lm->eo);
	char *out = arena_alloc(a, lm->so + (size_t)nd + tail + 1);

	if (!out)
		return NULL;
	memcpy(out, fqn, lm->so);
	memcpy(out + lm->so, digits, (size_t)nd);
	memcpy(out + lm->so + (size_t)nd, fqn + lm->eo, tail + 1);
	return out;
}

/* pl->names: per stage, the FQN itself unless renumbered there. */
static int place_names(flx_plan *p, flx_placement *pl, const placer *pc,
		       const layer_match *m)
{
	int nst = pl->stage_hi - pl->stage_lo + 1;

	pl->names = arena_alloc(p->arena, (size_t)nst * sizeof(char *));
	if (!pl->names)
		return -ENOMEM;
	for (int k = 0; k < nst; k++) {
		int local;

		decide_local_layer(p->spec, pc->lm, m, pl->stage_lo + k,
				   &local);
		pl->names[k] = local >= 0
				   ? renamed(p->arena, pl->src->fqn, m, local)
				   : pl->src->fqn;
		if (!pl->names[k])
			return -ENOMEM;
	}
	return 0;
}

/* A grouped placement's views: rank r's box of the regrouped tensor
 * (build_regroup()), whose axis holds the parts rank by rank, so that
 * torch.chunk's box of rank r is [part0_r; part1_r; ...]; pl->whole is
 * the source tensor's. */
static int place_grouped_views(flx_plan *p, flx_placement *pl, placer *pc,
			       const box_index *chunks, flx_error *err)
{
	const flx_ckpt *rc_ckpt = flx_xindex_ckpt(p->regroup);
	const flx_tensor *g = flx_ckpt_find(rc_ckpt, pl->src->fqn);
	int tp = p->spec->tp, rc;
	int nst = pl->by_stage ? pl->stage_hi - pl->stage_lo + 1 : 1;
	uint32_t small[64];
	box_index gix;
	flx_view *whole = NULL;
	flx_box box;

	if (!g)
		return -EIO; /* build_regroup() made it: a bug */
	pl->views = arena_alloc(p->arena,
				(size_t)nst * (size_t)tp * sizeof(flx_view *));
	if (!pl->views)
		return -ENOMEM;
	rc = chunk_index(g, &gix, small, 64);
	if (rc)
		return rc;
	for (int k = 0; !rc && k < nst * tp; k++) {
		rank_box(g, pl->split, tp, k % tp, &box);
		if (pl->by_stage)
			stacked_range(g->shape[0], p->spec->pp,
				      pl->stage_lo + k / tp, &box.off[0],
				      &box.size[0]);
		rc = view_build(rc_ckpt, g, &gix, &box, p->arena, &pc->sc,
				&pl->views[k], err);
	}
	bix_free(&gix);
	if (rc)
		return rc;
	rank_box(pl->src, -1, tp, 0, &box);
	rc = view_build(p->ckpt, pl->src, chunks, &box, p->arena, &pc->sc,
			&whole, err);
	pl->whole = whole;
	return rc;
}

/* pl->views, one per TP rank (replicated tensors share one), and
 * pl->whole. */
static int place_views(flx_plan *p, flx_placement *pl, placer *pc,
		       const box_index *chunks, flx_error *err)
{
	const flx_tensor *t = pl->src;
	int tp = p->spec->tp, rc;
	flx_view *whole = NULL;
	flx_box box;
	int nst = pl->by_stage ? pl->stage_hi - pl->stage_lo + 1 : 1;

	if (pl->groups > 1)
		return place_grouped_views(p, pl, pc, chunks, err);
	pl->views = arena_alloc(p->arena,
				(size_t)nst * (size_t)tp * sizeof(flx_view *));
	if (!pl->views)
		return -ENOMEM;
	for (int k = 0; k < nst * tp; k++) {
		int r = k % tp;

		if (pl->split < 0 && r > 0) {
			pl->views[k] = pl->views[k - r];
			continue;
		}
		rank_box(t, pl->split, tp, r, &box);
		if (pl->by_stage)
			stacked_range(t->shape[0], p->spec->pp,
				      pl->stage_lo + k / tp, &box.off[0],
				      &box.size[0]);
		rc = view_build(p->ckpt, t, chunks, &box, p->arena, &pc->sc,
				&pl->views[k], err);
		if (rc)
			return rc;
	}
	/* the whole tensor, for hf/: rank 0's view when its box is whole
	 * (replicated, or tp=1) */
	if (!pl->by_stage &&
	    (pl->split < 0 ||
	     pl->views[0]->box->size[pl->split] == t->shape[pl->split])) {
		pl->whole = pl->views[0];
		return 0;
	}
	rank_box(t, -1, tp, 0, &box);
	rc = view_build(p->ckpt, t, chunks, &box, p->arena, &pc->sc, &whole,
			err);
	pl->whole = whole;
	return rc;
}

/* The regrouped index: every tensor t whose decision groups its split
 * axis a in G parts (at tp > 1) becomes t' of the same name and shape,
 * whose axis a holds, rank by rank, rank r's piece of each part in turn
 * ([part0_0; part1_0; part0_1; part1_1; ...]): transform steps, so its
 * chunks still point into the source's files.  NULL when no tensor is
 * grouped.  @return 0, or -EINVAL naming a tensor whose axis does not
 * divide into G x tp, or -errno. */
static int build_regroup(flx_plan *p, const placer *pc, flx_error *err)
{
	int tp = p->spec->tp, rc = 0;
	flx_xform *x = NULL;

	for (size_t i = 0; i < p->ckpt->ntensors && !rc; i++) {
		const flx_tensor *t = &p->ckpt->tensors[i];
		int64_t len, c;
		decision d;

		rc = decide(p, pc, i, &d, err);
		if (rc || d.groups < 2)
			continue;
		len = t->shape[d.split];
		if (len % ((int64_t)d.groups * tp)) {
			rc = flx_error_set(err, -EINVAL, p->spec->rules_path,
					   t->fqn,
					   "rule '%s' makes axis %d %d parts "
					   "split over tp=%d, but its %lld "
					   "entries do not divide into %d",
					   d.rule->match, d.split, d.groups, tp,
					   (long long)len, d.groups * tp);
			break;
		}
		c = len / ((int64_t)d.groups * tp);
		if (!x)
			rc = flx_xform_new(p->spec->rules_path, &x);
		if (!rc)
			rc = flx_xform_target(x, t->fqn, d.split, err);
		for (int r = 0; !rc && r < tp; r++)
			for (int k = 0; !rc && k < d.groups; k++) {
				rc = flx_xform_piece(x, t->fqn, err);
				if (!rc)
					rc = flx_xform_slice(
					    x, d.split,
					    k * (len / d.groups) + r * c, c,
					    err);
			}
	}
	if (!rc && x)
		rc = flx_xform_apply(x, p->ckpt, &p->regroup, err);
	flx_xform_free(x);
	return rc;
}

/* Whether a rule of s groups its axis (else no tensor is regrouped). */
static bool any_groups(const flx_spec *s)
{
	for (size_t i = 0; i < s->nrules; i++)
		if (s->rules[i].groups > 1)
			return true;
	return false;
}

/* Decide where tensor i goes, then build its names and views. */
static int place_one(flx_plan *p, size_t i, placer *pc, const box_index *chunks,
		     flx_error *err)
{
	flx_placement *pl = &p->p[i];
	decision d;
	int rc = decide(p, pc, i, &d, err);

	if (rc)
		return rc;
	pl->split = d.split;
	pl->groups = d.groups;
	pl->undecided = d.undecided;
	if (d.rule)
		p->rule_used[d.rule - p->spec->rules] = true;
	p->nundecided += d.undecided;
	pl->stage_lo = d.stage_lo;
	pl->stage_hi = d.stage_hi;
	pl->layer = d.layer;
	pl->by_stage = d.by_stage;
	rc = place_names(p, pl, pc, &pc->matches[i]);
	if (rc)
		return rc;
	return place_views(p, pl, pc, chunks, err);
}

/* Every tensor's layer match (kept for the decisions) and the sorted
 * distinct layer indices. */
static int build_layer_map(const flx_ckpt *c, const regex_t *rx, bool dflt,
			   int pp, layer_map *lm, layer_match *matches)
{
	int k = 0;

	lm->pp = pp;
	lm->n = 0;
	lm->idx = malloc((c->ntensors ? c->ntensors : 1) * sizeof(int));
	if (!lm->idx)
		return -ENOMEM;
	for (size_t i = 0; i < c->ntensors; i++) {
		if (match_layer(rx, dflt, c->tensors[i].fqn, &matches[i]))
			return -ENOMEM;
		if (matches[i].layer >= 0)
			lm->idx[lm->n++] = matches[i].layer;
	}
	qsort(lm->idx, (size_t)lm->n, sizeof(int), cmp_int);
	for (int i = 0; i < lm->n; i++)
		if (i == 0 || lm->idx[i] != lm->idx[k - 1])
			lm->idx[k++] = lm->idx[i];
	lm->n = k;
	return 0;
}

/* Both regexes of spec were compiled when set; failing now means out of
 * memory.  @return 0 with *have_layer and *have_embed telling which to
 * regfree(), or -errno. */
static int compile_regexes(const flx_spec *spec, regex_t *layer_rx,
			   regex_t *embed_rx, bool *have_layer,
			   bool *have_embed, flx_error *err)
{
	int rc = regcomp(layer_rx, spec->layer_regex, REG_EXTENDED);

	*have_layer = rc == 0;
	*have_embed = false;
	if (!rc) {
		rc = regcomp(embed_rx, spec->embed_regex,
			     REG_EXTENDED | REG_NOSUB);
		*have_embed = rc == 0;
	}
	if (!rc)
		return 0;
	return rc == REG_ESPACE
		   ? -ENOMEM
		   : flx_error_set(err, -EINVAL, NULL,
				   *have_layer ? "embed_regex" : "layer_regex",
				   "invalid regular expression");
}

/* A placement error without a file is about the checkpoint's metadata. */
static void plan_error_file(const flx_ckpt *ckpt, flx_error *err)
{
	char meta[FLX_ERR_FIELD];

	if (!err || err->file[0])
		return;
	snprintf(meta, sizeof(meta), "%s/.metadata", ckpt->dir);
	flx_error_file(err, meta);
}

/* The undecided tensors named in the error, at most so many and within so
 * many bytes of names: the count says the rest. */
#define UNDECIDED_NAMED	    3
#define UNDECIDED_NAMES_LEN 160

/* The one error for every undecided tensor of p: the first few by name,
 * how many in all, and where a rules file for them comes from. */
static int undecided_error(const flx_plan *p, flx_error *err)
{
	char names[FLX_ERR_FIELD];
	size_t len = 0, shown = 0;

	names[0] = '\0';
	for (size_t i = 0; i < p->n && shown < UNDECIDED_NAMED; i++) {
		const char *fqn = p->p[i].src->fqn;

		if (!p->p[i].undecided)
			continue;
		if (shown && len + strlen(fqn) + 2 > UNDECIDED_NAMES_LEN)
			break;
		len += (size_t)snprintf(names + len, sizeof(names) - len,
					"%s%s", shown ? ", " : "", fqn);
		if (len >= sizeof(names))
			len = sizeof(names) - 1;
		shown++;
	}
	if (p->nundecided > shown)
		snprintf(names + len, sizeof(names) - len, " and %zu more",
			 p->nundecided - shown);
	return flx_error_set(err, -EINVAL, NULL, names,
			     "%zu tensor(s) saved split along several axes; "
			     "add a rule giving their target split "
			     "(flexfs-inspect --rules-template=FILE writes "
			     "one for all of them; mount with rules=FILE)",
			     p->nundecided);
}

int flx_plan_build(const flx_ckpt *ckpt, const flx_spec *spec, flx_plan **out,
		   flx_error *err)
{
	flx_plan *p = NULL;
	int rc = flx_plan_build_all(ckpt, spec, &p, err);

	if (rc)
		return rc;
	if (p->nundecided) {
		rc = undecided_error(p, err);
		plan_error_file(ckpt, err);
		flx_plan_free(p);
		return rc;
	}
	*out = p;
	return 0;
}

int flx_plan_build_all(const flx_ckpt *ckpt, const flx_spec *spec,
		       flx_plan **out, flx_error *err)
{
	flx_plan *p = calloc(1, sizeof(*p));
	regex_t layer_rx, embed_rx;
	bool have_layer = false, have_embed = false;
	layer_map lm = {0};
	layer_match *matches = NULL;
	bool *dp0 = NULL;
	placer pc = {.embed_rx = &embed_rx, .lm = &lm};
	int rc;

	if (!p)
		return flx_error_default(err, -ENOMEM, NULL);
	p->ckpt = ckpt;
	p->spec = spec;
	p->arena = calloc(1, sizeof(*p->arena));
	rc = p->arena ? compile_regexes(spec, &layer_rx, &embed_rx, &have_layer,
					&have_embed, err)
		      : -ENOMEM;
	if (rc)
		goto out;
	matches =
	    malloc((ckpt->ntensors ? ckpt->ntensors : 1) * sizeof(*matches));
	rc = matches ? build_layer_map(ckpt, &layer_rx,
				       strcmp(spec->layer_regex,
					      FLX_DEFAULT_LAYER_REGEX) == 0,
				       spec->pp, &lm, matches)
		     : -ENOMEM;
	if (rc)
		goto out;
	pc.matches = matches;
	p->nlayers = lm.n;
	/* the layers, the embedding's stage and the head's: more stages can
	 * only be empty */
	if (lm.n > 0 && spec->pp > lm.n + 2) {
		rc = flx_error_set(err, -EINVAL, ckpt->dir, "pp",
				   "pp=%d but the checkpoint has %d layer(s): "
				   "at most %d stages can hold a tensor",
				   spec->pp, lm.n, lm.n + 2);
		goto out;
	}
	dp0 = malloc(ckpt->ntensors ? ckpt->ntensors : 1);
	rc = dp0 ? dp_scan(ckpt, &p->dp_degree, dp0) : -ENOMEM;
	if (rc)
		goto out;
	pc.dp0 = dp0;
	p->rule_used = calloc(spec->nrules ? spec->nrules : 1, 1);
	if (!p->rule_used) {
		rc = -ENOMEM;
		goto out;
	}
	p->p = calloc(ckpt->ntensors ? ckpt->ntensors : 1, sizeof(*p->p));
	if (!p->p) {
		rc = -ENOMEM;
		goto out;
	}
	p->facts = 0;
	for (size_t i = 0; i < spec->nfacts; i++) {
		flx_fact f;
		int r = flx_ckpt_fact(ckpt, spec->facts[i], &f);

		/* a rule's "when" names a fact the checkpoint does not tell:
		 * refused, never taken as false (docs/facts.md) */
		if (r == -ENODATA) {
			rc = flx_error_set(err, -EINVAL, NULL, spec->facts[i],
					   "a rule's \"when\" names it: %s",
					   f.type == FLX_FACT_TEXT && f.v.s
					       ? f.v.s
					       : "the checkpoint does not "
						 "tell it");
			goto out;
		}
		if (!r && f.type == FLX_FACT_BOOL && f.v.b)
			p->facts |= 1u << i;
	}
	rc = spec->tp > 1 && any_groups(spec) ? build_regroup(p, &pc, err) : 0;
	if (rc)
		goto out;
	for (size_t i = 0; i < ckpt->ntensors && !rc; i++) {
		uint32_t small[64];
		box_index ix;

		p->p[i].src = &ckpt->tensors[i];
		p->n = i + 1;
		rc = chunk_index(&ckpt->tensors[i], &ix, small, 64);
		if (rc)
			break;
		rc = place_one(p, i, &pc, &ix, err);
		bix_free(&ix);
	}
	if (!rc)
		rc = check_unique_names(p, err);
	/* interning is over: the boxes stay, their table goes */
	if (!rc) {
		free(p->arena->boxes);
		p->arena->boxes = NULL;
		p->arena->nboxes = p->arena->capboxes = 0;
	}
out:
	if (rc) {
		flx_error_default(err, rc, NULL);
		plan_error_file(ckpt, err);
		flx_plan_free(p);
		p = NULL;
	}
	free(pc.sc.idx);
	free(dp0);
	free(matches);
	free(lm.idx);
	if (have_layer)
		regfree(&layer_rx);
	if (have_embed)
		regfree(&embed_rx);
	if (p)
		*out = p;
	return rc;
}

/* The mount's notes, in flx_plan_note()'s order. */
enum { NOTE_DP, NOTE_EMPTY_STAGES, NOTE_UNUSED_RULES, NNOTES };

/* Whether note k has something to say; stages: the empty ones listed. */
static bool note_due(const flx_plan *p, int k, char *list, size_t len)
{
	size_t n = 0;
	bool any = false;

	list[0] = '\0';
	if (k == NOTE_DP)
		return p->dp_degree && p->spec->tp > 1;
	if (k == NOTE_UNUSED_RULES) {
		/* a preset covers many models: some rules always idle */
		for (size_t r = 0;
		     r < p->spec->nrules && !p->spec->rules_preset; r++) {
			if (p->rule_used[r])
				continue;
			if (n < len)
				n += (size_t)snprintf(list + n, len - n,
						      "%s%zu ('%s')",
						      any ? ", " : "", r,
						      p->spec->rules[r].match);
			any = true;
		}
		return any;
	}
	for (int st = 0; st < p->spec->pp; st++) {
		bool held = false;

		for (size_t i = 0; i < p->n && !held; i++)
			held = p->p[i].stage_lo <= st && st <= p->p[i].stage_hi;
		if (held)
			continue;
		if (n < len)
			n += (size_t)snprintf(list + n, len - n, "%s%d",
					      any ? ", " : "", st);
		any = true;
	}
	return any;
}

int flx_plan_note(const flx_plan *p, size_t i, char *buf, size_t len)
{
	char list[160];

	for (int k = 0; k < NNOTES; k++) {
		if (!note_due(p, k, list, sizeof(list)) || i--)
			continue;
		if (strlen(list) == sizeof(list) - 1)
			strcpy(list + sizeof(list) - 4, "...");
		if (k == NOTE_DP)
			snprintf(buf, len,
				 "every tensor was saved in %d data-parallel "
				 "shards along dim 0 (FSDP): that split is no "
				 "TP split, so a tensor split only so is "
				 "replicated unless a rule splits it",
				 p->dp_degree);
		else if (k == NOTE_EMPTY_STAGES)
			snprintf(buf, len,
				 "pp=%d over %d layer(s) leaves stage(s) %s "
				 "without any tensor",
				 p->spec->pp, p->nlayers, list);
		else
			snprintf(buf, len,
				 "%s: rule(s) %s match no tensor (each tensor "
				 "takes the first rule matching it)",
				 p->spec->rules_path, list);
		return 0;
	}
	return -ENOENT;
}

void flx_placement_part(const flx_placement *pl, const flx_box *b, int k,
			flx_box *out)
{
	int a = pl->split, G = pl->groups;

	*out = *b;
	if (G < 2)
		return;
	/* rank r's box of the regrouped axis is [r G c, (r + 1) G c) */
	out->size[a] = b->size[a] / G;
	out->off[a] = k * (pl->src->shape[a] / G) + b->off[a] / G;
}

void flx_plan_finish(flx_plan *p)
{
	if (p && p->regroup)
		flx_xindex_finish(p->regroup);
}

const char *flx_placement_name(const flx_placement *pl, int stage)
{
	return pl->names[stage - pl->stage_lo];
}

void flx_plan_free(flx_plan *p)
{
	if (!p)
		return;
	arena_free(p->arena);
	free(p->arena);
	flx_xindex_free(p->regroup);
	free(p->rule_used);
	free(p->p);
	free(p);
}
