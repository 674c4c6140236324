/* SPDX-License-Identifier: MIT */
/*
 * Placement: which tensor goes where under the target spec (split axis,
 * stages, names), and the views of its boxes (view.c), all kept in the
 * plan's arena (arena.c).
 */
#include "plan.h"

#include "arena_internal.h"
#include "boxindex_internal.h"
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

static int infer_split(const flx_tensor *t, flx_error *err)
{
	int axis = -1;

	for (int d = 0; d < t->ndim; d++) {
		for (uint32_t i = 1; i < t->nchunks; i++) {
			if (t->chunks[i].off[d] == t->chunks[0].off[d])
				continue;
			if (axis >= 0 && axis != d)
				return flx_error_set(
				    err, -EINVAL, NULL, t->fqn,
				    "saved split along axes %d and %d; "
				    "add a rule giving its target split "
				    "(rules=FILE)",
				    axis, d);
			axis = d;
			break;
		}
	}
	return axis;
}

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	return x < y ? -1 : x > y;
}

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

/* Stage of each distinct layer: contiguous groups, the first
 * (nlayers mod pp) stages one layer longer. */
typedef struct layer_map {
	int *idx; /* sorted distinct layer indices */
	int n;
	int pp;
} layer_map;

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

/* What place_one() needs besides the plan. */
typedef struct placer {
	const regex_t *embed_rx;
	const layer_map *lm;
	const layer_match *matches; /* per tensor, from build_layer_map() */
	scratch sc;
} placer;

static int place_one(flx_plan *p, size_t i, placer *pc, const box_index *chunks,
		     flx_error *err)
{
	const flx_spec *s = p->spec;
	flx_placement *pl = &p->p[i];
	const flx_tensor *t = pl->src;
	const flx_rule *rule = flx_spec_match(s, t->fqn);
	const layer_map *lm = pc->lm;
	const layer_match *m = &pc->matches[i];
	flx_view *whole = NULL;
	int nst, rc;
	flx_box box;

	/* split axis */
	if (rule && rule->split == FLX_SPLIT_NONE) {
		pl->split = -1;
	} else if (rule && rule->split == FLX_SPLIT_AXIS) {
		if (rule->axis >= t->ndim)
			return flx_error_set(err, -EINVAL, s->rules_path,
					     t->fqn,
					     "rule '%s' splits axis %d but the "
					     "tensor has %d dimension(s)",
					     rule->match, rule->axis, t->ndim);
		pl->split = rule->axis;
	} else {
		pl->split = infer_split(t, err);
		if (pl->split < -1)
			return pl->split;
	}
	/* stage */
	pl->layer = m->layer;
	switch (rule ? rule->stage : FLX_STAGE_DEFAULT) {
	case FLX_STAGE_FIRST:
		pl->stage_lo = pl->stage_hi = 0;
		break;
	case FLX_STAGE_LAST:
		pl->stage_lo = pl->stage_hi = s->pp - 1;
		break;
	case FLX_STAGE_ALL:
		pl->stage_lo = 0;
		pl->stage_hi = s->pp - 1;
		break;
	case FLX_STAGE_N:
		if (rule->stage_n >= s->pp)
			return flx_error_set(err, -EINVAL, s->rules_path,
					     t->fqn,
					     "rule '%s' names stage %d but "
					     "pp=%d",
					     rule->match, rule->stage_n, s->pp);
		pl->stage_lo = pl->stage_hi = rule->stage_n;
		break;
	default:
		errno = 0;
		rc = m->layer >= 0 ? 0
				   : regexec(pc->embed_rx, t->fqn, 0, NULL, 0);
		if (match_rc(rc))
			return -ENOMEM;
		if (m->layer >= 0)
			pl->stage_lo =
			    stage_of_pos(lm, layer_pos(lm, m->layer));
		else
			pl->stage_lo = rc == 0 ? 0 : s->pp - 1;
		pl->stage_hi = pl->stage_lo;
	}
	/* names per stage: the FQN itself unless renumbered */
	nst = pl->stage_hi - pl->stage_lo + 1;
	pl->names = arena_alloc(p->arena, (size_t)nst * sizeof(char *));
	if (!pl->names)
		return -ENOMEM;
	for (int k = 0; k < nst; k++) {
		int st = pl->stage_lo + k, pos = layer_pos(lm, m->layer);

		if (s->pp_renumber && m->layer >= 0 &&
		    stage_of_pos(lm, pos) == st)
			pl->names[k] =
			    renamed(p->arena, t->fqn, m,
				    pos - first_pos_of_stage(lm, st));
		else
			pl->names[k] = t->fqn;
		if (!pl->names[k])
			return -ENOMEM;
	}
	/* one view per TP rank; replicated tensors share one */
	pl->views = arena_alloc(p->arena, (size_t)s->tp * sizeof(flx_view *));
	if (!pl->views)
		return -ENOMEM;
	for (int d = 0; d < t->ndim; d++) {
		box.off[d] = 0;
		box.size[d] = t->shape[d];
	}
	for (int r = 0; r < s->tp; r++) {
		if (pl->split < 0 && r > 0) {
			pl->views[r] = pl->views[0];
			continue;
		}
		if (pl->split >= 0) {
			int64_t n = t->shape[pl->split];
			int64_t c = (n + s->tp - 1) / s->tp;
			int64_t lo = (int64_t)r * c < n ? (int64_t)r * c : n;
			int64_t hi = lo + c < n ? lo + c : n;

			box.off[pl->split] = lo;
			box.size[pl->split] = hi - lo;
		}
		rc = view_build(p->ckpt, t, chunks, &box, p->arena, &pc->sc,
				&pl->views[r], err);
		if (rc)
			return rc;
	}
	/* the whole tensor, for hf/: rank 0's view when its box is whole
	 * (replicated, or tp=1) */
	if (pl->split < 0 ||
	    pl->views[0]->box->size[pl->split] == t->shape[pl->split]) {
		pl->whole = pl->views[0];
		return 0;
	}
	for (int d = 0; d < t->ndim; d++) {
		box.off[d] = 0;
		box.size[d] = t->shape[d];
	}
	rc = view_build(p->ckpt, t, chunks, &box, p->arena, &pc->sc, &whole,
			err);
	pl->whole = whole;
	return rc;
}

/* Every tensor's layer match (kept for place_one()) and the sorted
 * distinct layer indices. */
static int build_layer_map(const flx_ckpt *c, const regex_t *rx, bool dflt,
			   int pp, layer_map *lm, layer_match *matches)
{
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
	{
		int k = 0;

		for (int i = 0; i < lm->n; i++)
			if (i == 0 || lm->idx[i] != lm->idx[k - 1])
				lm->idx[k++] = lm->idx[i];
		lm->n = k;
	}
	return 0;
}

int flx_plan_build(const flx_ckpt *ckpt, const flx_spec *spec, flx_plan **out,
		   flx_error *err)
{
	flx_plan *p = calloc(1, sizeof(*p));
	regex_t layer_rx, embed_rx;
	bool have_layer = false, have_embed = false;
	layer_map lm = {0};
	layer_match *matches = NULL;
	placer pc = {.embed_rx = &embed_rx, .lm = &lm};
	int rc;

	if (!p)
		return flx_error_default(err, -ENOMEM, NULL);
	p->ckpt = ckpt;
	p->spec = spec;
	p->arena = calloc(1, sizeof(*p->arena));
	if (!p->arena) {
		rc = -ENOMEM;
		goto fail;
	}
	/* both were compiled when set; failing now means out of memory */
	rc = regcomp(&layer_rx, spec->layer_regex, REG_EXTENDED);
	have_layer = rc == 0;
	if (!rc) {
		rc = regcomp(&embed_rx, spec->embed_regex,
			     REG_EXTENDED | REG_NOSUB);
		have_embed = rc == 0;
	}
	if (rc) {
		rc = rc == REG_ESPACE
			 ? -ENOMEM
			 : flx_error_set(err, -EINVAL, NULL,
					 have_layer ? "embed_regex"
						    : "layer_regex",
					 "invalid regular expression");
		goto fail;
	}
	matches =
	    malloc((ckpt->ntensors ? ckpt->ntensors : 1) * sizeof(*matches));
	rc = matches ? build_layer_map(ckpt, &layer_rx,
				       strcmp(spec->layer_regex,
					      FLX_DEFAULT_LAYER_REGEX) == 0,
				       spec->pp, &lm, matches)
		     : -ENOMEM;
	if (rc)
		goto fail;
	pc.matches = matches;
	p->nlayers = lm.n;
	p->p = calloc(ckpt->ntensors ? ckpt->ntensors : 1, sizeof(*p->p));
	if (!p->p) {
		rc = -ENOMEM;
		goto fail;
	}
	for (size_t i = 0; i < ckpt->ntensors; i++) {
		uint32_t small[64];
		box_index ix;

		p->p[i].src = &ckpt->tensors[i];
		p->n = i + 1;
		rc = chunk_index(&ckpt->tensors[i], &ix, small, 64);
		if (rc)
			goto fail;
		rc = place_one(p, i, &pc, &ix, err);
		bix_free(&ix);
		if (rc)
			goto fail;
	}
	rc = check_unique_names(p, err);
	if (rc)
		goto fail;
	/* interning is over: the boxes stay, their table goes */
	free(p->arena->boxes);
	p->arena->boxes = NULL;
	p->arena->nboxes = p->arena->capboxes = 0;
	free(pc.sc.idx);
	free(matches);
	free(lm.idx);
	regfree(&layer_rx);
	regfree(&embed_rx);
	*out = p;
	return 0;
fail:
	flx_error_default(err, rc, NULL);
	if (err && !err->file[0]) {
		char meta[FLX_ERR_FIELD];

		snprintf(meta, sizeof(meta), "%s/.metadata", ckpt->dir);
		flx_error_file(err, meta);
	}
	free(pc.sc.idx);
	free(matches);
	free(lm.idx);
	if (have_layer)
		regfree(&layer_rx);
	if (have_embed)
		regfree(&embed_rx);
	flx_plan_free(p);
	return rc;
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
	free(p->p);
	free(p);
}
