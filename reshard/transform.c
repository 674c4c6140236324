/* SPDX-License-Identifier: MIT */
/*
 * The transform stage (transform.h).
 *
 * A piece is worked on as a list of virtual chunks: each source chunk the
 * piece still reads, with its box in the piece's current coordinates and
 * its recipe, the map from the piece's axes to the source chunk's axes
 * (axis_of; -1 for an axis a step added) and the first element it takes
 * along every source axis (start, chunk-local).  Steps change boxes and
 * recipes only.  A derived chunk's storage is then its source chunk's with
 *   stride[d]      = source stride[axis_of[d]] (0 for an added axis),
 *   storage_offset = source storage_offset + sum of start[a] * stride[a],
 * which lies inside the source chunk's storage, already validated.  The
 * recipes are kept so that flx_xindex_finish() can compute the storage
 * again once a loading source has it.
 */
#include "transform.h"

#include "cast.h"
#include "grow.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the list ---- */

typedef enum step_kind {
	ST_SLICE,
	ST_SPLIT,
	ST_UNSTACK,
	ST_UNSQUEEZE,
	ST_TRANSPOSE,
	ST_CAST,
} step_kind;

static const char *const step_names[] = {
    [ST_SLICE] = "slice",	  [ST_SPLIT] = "split",
    [ST_UNSTACK] = "unstack",	  [ST_UNSQUEEZE] = "unsqueeze",
    [ST_TRANSPOSE] = "transpose", [ST_CAST] = "cast",
};

typedef struct step {
	step_kind kind;
	int axis;
	int64_t a, b; /* slice: start, len; split: parts, part; unstack:
			 index */
	int ndim;     /* transpose */
	int perm[FLX_MAX_DIMS];
	flx_dtype to; /* cast */
} step;

typedef struct piece_def {
	char *source;
	size_t step0, nsteps; /* steps[step0, step0 + nsteps) */
	int at_ndim;	      /* a placed piece: its offset in the target */
	int64_t at[FLX_MAX_DIMS];
} piece_def;

typedef struct target_def {
	char *name;
	int axis;
	size_t piece0, npieces; /* pieces[piece0, piece0 + npieces) */
} target_def;

struct flx_xform {
	char *origin;
	target_def *targets;
	size_t ntargets, captargets;
	piece_def *pieces;
	size_t npieces, cappieces;
	step *steps;
	size_t nsteps, capsteps;
	char **drops; /* source tensors read by no target, not served */
	size_t ndrops, capdrops;
};

int flx_xform_new(const char *origin, flx_xform **out)
{
	flx_xform *x = calloc(1, sizeof(*x));

	if (!x)
		return -ENOMEM;
	if (origin && !(x->origin = strdup(origin))) {
		free(x);
		return -ENOMEM;
	}
	*out = x;
	return 0;
}

void flx_xform_free(flx_xform *x)
{
	if (!x)
		return;
	for (size_t i = 0; i < x->ntargets; i++)
		free(x->targets[i].name);
	for (size_t i = 0; i < x->npieces; i++)
		free(x->pieces[i].source);
	for (size_t i = 0; i < x->ndrops; i++)
		free(x->drops[i]);
	free(x->drops);
	free(x->targets);
	free(x->pieces);
	free(x->steps);
	free(x->origin);
	free(x);
}

/* The key of a builder error: the current target's name, if any. */
static const char *current_name(const flx_xform *x)
{
	return x->ntargets ? x->targets[x->ntargets - 1].name : NULL;
}

int flx_xform_target(flx_xform *x, const char *name, int concat_axis,
		     flx_error *err)
{
	target_def *t;

	if (!name || !name[0])
		return flx_error_set(err, -EINVAL, x->origin, NULL,
				     "target with an empty name");
	if (concat_axis < FLX_XFORM_PLACED || concat_axis >= FLX_MAX_DIMS)
		return flx_error_set(err, -EINVAL, x->origin, name,
				     "concatenation axis %d", concat_axis);
	if (flx_grow((void **)&x->targets, &x->captargets, x->ntargets + 1,
		     sizeof(*x->targets)))
		return flx_error_default(err, -ENOMEM, x->origin);
	t = &x->targets[x->ntargets];
	*t = (target_def){.axis = concat_axis, .piece0 = x->npieces};
	t->name = strdup(name);
	if (!t->name)
		return flx_error_default(err, -ENOMEM, x->origin);
	x->ntargets++;
	return 0;
}

int flx_xform_piece(flx_xform *x, const char *source, flx_error *err)
{
	piece_def *p;

	if (!x->ntargets)
		return flx_error_set(err, -EINVAL, x->origin, source,
				     "piece before any target");
	if (!source || !source[0])
		return flx_error_set(err, -EINVAL, x->origin, current_name(x),
				     "piece with an empty source name");
	if (flx_grow((void **)&x->pieces, &x->cappieces, x->npieces + 1,
		     sizeof(*x->pieces)))
		return flx_error_default(err, -ENOMEM, x->origin);
	p = &x->pieces[x->npieces];
	*p = (piece_def){.step0 = x->nsteps};
	p->source = strdup(source);
	if (!p->source)
		return flx_error_default(err, -ENOMEM, x->origin);
	x->npieces++;
	x->targets[x->ntargets - 1].npieces++;
	return 0;
}

int flx_xform_piece_at(flx_xform *x, const char *source, int ndim,
		       const int64_t *at, flx_error *err)
{
	piece_def *p;
	int rc;

	if (x->ntargets && x->targets[x->ntargets - 1].axis != FLX_XFORM_PLACED)
		return flx_error_set(err, -EINVAL, x->origin, current_name(x),
				     "placed piece in a concatenated target");
	if (ndim < 0 || ndim > FLX_MAX_DIMS)
		return flx_error_set(err, -EINVAL, x->origin, current_name(x),
				     "placed piece of %d axes", ndim);
	for (int d = 0; d < ndim; d++)
		if (at[d] < 0)
			return flx_error_set(
			    err, -EINVAL, x->origin, current_name(x),
			    "placed piece at a negative offset");
	rc = flx_xform_piece(x, source, err);
	if (rc)
		return rc;
	p = &x->pieces[x->npieces - 1];
	p->at_ndim = ndim;
	memcpy(p->at, at, (size_t)ndim * sizeof(int64_t));
	return 0;
}

int flx_xform_drop(flx_xform *x, const char *source, flx_error *err)
{
	if (!source || !source[0])
		return flx_error_set(err, -EINVAL, x->origin, NULL,
				     "drop of an empty source name");
	if (flx_grow((void **)&x->drops, &x->capdrops, x->ndrops + 1,
		     sizeof(*x->drops)))
		return flx_error_default(err, -ENOMEM, x->origin);
	if (!(x->drops[x->ndrops] = strdup(source)))
		return flx_error_default(err, -ENOMEM, x->origin);
	x->ndrops++;
	return 0;
}

int flx_xform_rename(flx_xform *x, const char *from, const char *to,
		     flx_error *err)
{
	int rc = flx_xform_target(x, to, -1, err);

	return rc ? rc : flx_xform_piece(x, from, err);
}

size_t flx_xform_ntargets(const flx_xform *x)
{
	return x ? x->ntargets : 0;
}

/* Append s to the current piece after the checks that need no tensor. */
static int add_step(flx_xform *x, const step *s, flx_error *err)
{
	const char *what = step_names[s->kind];

	if (!x->ntargets || !x->targets[x->ntargets - 1].npieces)
		return flx_error_set(err, -EINVAL, x->origin, current_name(x),
				     "%s before any piece", what);
	if (s->axis < 0 || s->axis >= FLX_MAX_DIMS)
		return flx_error_set(err, -EINVAL, x->origin, current_name(x),
				     "%s of axis %d", what, s->axis);
	if (s->a < 0 || s->b < 0)
		return flx_error_set(err, -EINVAL, x->origin, current_name(x),
				     "%s with a negative index or length",
				     what);
	if (flx_grow((void **)&x->steps, &x->capsteps, x->nsteps + 1,
		     sizeof(*x->steps)))
		return flx_error_default(err, -ENOMEM, x->origin);
	x->steps[x->nsteps++] = *s;
	x->pieces[x->npieces - 1].nsteps++;
	return 0;
}

int flx_xform_slice(flx_xform *x, int axis, int64_t start, int64_t len,
		    flx_error *err)
{
	step s = {.kind = ST_SLICE, .axis = axis, .a = start, .b = len};

	return add_step(x, &s, err);
}

int flx_xform_split(flx_xform *x, int axis, int parts, int part, flx_error *err)
{
	step s = {.kind = ST_SPLIT, .axis = axis, .a = parts, .b = part};

	if (parts < 1 || part >= parts)
		return flx_error_set(err, -EINVAL, x->origin, current_name(x),
				     "split into part %d of %d", part, parts);
	return add_step(x, &s, err);
}

int flx_xform_unstack(flx_xform *x, int axis, int64_t index, flx_error *err)
{
	step s = {.kind = ST_UNSTACK, .axis = axis, .a = index};

	return add_step(x, &s, err);
}

int flx_xform_unsqueeze(flx_xform *x, int axis, flx_error *err)
{
	step s = {.kind = ST_UNSQUEEZE, .axis = axis};

	return add_step(x, &s, err);
}

int flx_xform_transpose(flx_xform *x, int ndim, const int *perm, flx_error *err)
{
	step s = {.kind = ST_TRANSPOSE, .ndim = ndim};

	if (ndim < 0 || ndim > FLX_MAX_DIMS)
		return flx_error_set(err, -EINVAL, x->origin, current_name(x),
				     "transpose of %d axes", ndim);
	memcpy(s.perm, perm, (size_t)ndim * sizeof(int));
	return add_step(x, &s, err);
}

int flx_xform_cast(flx_xform *x, flx_dtype to, flx_error *err)
{
	step s = {.kind = ST_CAST, .to = to};

	if (!flx_dtype_size(to))
		return flx_error_set(err, -EINVAL, x->origin, current_name(x),
				     "cast to an invalid dtype");
	return add_step(x, &s, err);
}

/* ---- virtual chunks and the steps ---- */

typedef struct vchunk {
	const flx_chunk *src;
	int src_ndim;
	int64_t off[FLX_MAX_DIMS];
	int64_t size[FLX_MAX_DIMS];
	int axis_of[FLX_MAX_DIMS];   /* source axis, -1: added */
	int64_t start[FLX_MAX_DIMS]; /* per source axis, chunk-local */
} vchunk;

/* A piece, or a target, being built. */
typedef struct vtensor {
	flx_dtype dtype;  /* after the casts */
	flx_dtype stored; /* what the chunks hold */
	int ndim;
	int64_t shape[FLX_MAX_DIMS];
	vchunk *ch;
	size_t n, cap;
} vtensor;

/* Where an error is: the list's origin, the target, piece and step (both
 * counted from 1; 0: not about one). */
typedef struct where {
	const flx_xform *x;
	const char *target;
	size_t piece, step;
	const char *what;
} where;

static int fail(const where *w, flx_error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(const where *w, flx_error *err, const char *fmt, ...)
{
	char why[FLX_ERR_FIELD], at[64] = "";
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (w->step)
		snprintf(at, sizeof(at), "piece %zu, step %zu (%s): ", w->piece,
			 w->step, w->what);
	else if (w->piece)
		snprintf(at, sizeof(at), "piece %zu: ", w->piece);
	return flx_error_set(err, -EINVAL, w->x->origin, w->target, "%s%s", at,
			     why);
}

static int check_axis(const where *w, const vtensor *v, int axis,
		      flx_error *err)
{
	if (axis >= v->ndim)
		return fail(w, err,
			    "axis %d but the tensor has %d dimension(s)", axis,
			    v->ndim);
	return 0;
}

/* Keep [start, start + len) of axis a (checked). */
static void do_slice(vtensor *v, int a, int64_t start, int64_t len)
{
	size_t k = 0;

	for (size_t i = 0; i < v->n; i++) {
		vchunk *c = &v->ch[i];
		int64_t lo = c->off[a] > start ? c->off[a] : start;
		int64_t e1 = c->off[a] + c->size[a], e2 = start + len;
		int64_t hi = e1 < e2 ? e1 : e2;

		if (hi <= lo)
			continue;
		if (c->axis_of[a] >= 0)
			c->start[c->axis_of[a]] += lo - c->off[a];
		c->off[a] = lo - start;
		c->size[a] = hi - lo;
		v->ch[k++] = *c;
	}
	v->n = k;
	v->shape[a] = len;
}

/* Remove axis a (extent 1 by now) from v. */
static void drop_axis(vtensor *v, int a)
{
	for (size_t i = 0; i < v->n; i++) {
		vchunk *c = &v->ch[i];

		for (int d = a; d + 1 < v->ndim; d++) {
			c->off[d] = c->off[d + 1];
			c->size[d] = c->size[d + 1];
			c->axis_of[d] = c->axis_of[d + 1];
		}
	}
	for (int d = a; d + 1 < v->ndim; d++)
		v->shape[d] = v->shape[d + 1];
	v->ndim--;
}

/* Insert a new axis of extent 1 before axis a of v. */
static void add_axis(vtensor *v, int a)
{
	for (size_t i = 0; i < v->n; i++) {
		vchunk *c = &v->ch[i];

		for (int d = v->ndim; d > a; d--) {
			c->off[d] = c->off[d - 1];
			c->size[d] = c->size[d - 1];
			c->axis_of[d] = c->axis_of[d - 1];
		}
		c->off[a] = 0;
		c->size[a] = 1;
		c->axis_of[a] = -1;
	}
	for (int d = v->ndim; d > a; d--)
		v->shape[d] = v->shape[d - 1];
	v->shape[a] = 1;
	v->ndim++;
}

static void do_transpose(vtensor *v, const int *perm)
{
	int64_t shape[FLX_MAX_DIMS];

	for (size_t i = 0; i < v->n; i++) {
		vchunk *c = &v->ch[i], o = *c;

		for (int d = 0; d < v->ndim; d++) {
			c->off[d] = o.off[perm[d]];
			c->size[d] = o.size[perm[d]];
			c->axis_of[d] = o.axis_of[perm[d]];
		}
	}
	for (int d = 0; d < v->ndim; d++)
		shape[d] = v->shape[perm[d]];
	memcpy(v->shape, shape, sizeof(shape));
}

static int check_transpose(const where *w, const vtensor *v, const step *s,
			   flx_error *err)
{
	bool seen[FLX_MAX_DIMS] = {false};

	if (s->ndim != v->ndim)
		return fail(w, err, "%d axes for a tensor of %d dimension(s)",
			    s->ndim, v->ndim);
	for (int d = 0; d < s->ndim; d++) {
		if (s->perm[d] < 0 || s->perm[d] >= v->ndim || seen[s->perm[d]])
			return fail(w, err,
				    "not a permutation of the axes "
				    "(axis %d at position %d)",
				    s->perm[d], d);
		seen[s->perm[d]] = true;
	}
	return 0;
}

static int check_cast(const where *w, const vtensor *v, flx_dtype to,
		      flx_error *err)
{
	if (!flx_cast_supported(v->stored, to))
		return fail(w, err, "no conversion from %s to %s",
			    flx_dtype_name(v->stored), flx_dtype_name(to));
	/* one conversion is executed, from the stored dtype: the cast
	 * before must not have rounded */
	if (v->dtype != v->stored && to != v->dtype &&
	    !flx_cast_exact(v->stored, v->dtype))
		return fail(w, err, "%s to %s after %s to %s would round twice",
			    flx_dtype_name(v->dtype), flx_dtype_name(to),
			    flx_dtype_name(v->stored),
			    flx_dtype_name(v->dtype));
	return 0;
}

static int apply_step(const where *w, const step *s, vtensor *v, flx_error *err)
{
	int rc = 0;

	switch (s->kind) {
	case ST_SLICE:
		rc = check_axis(w, v, s->axis, err);
		if (!rc && (s->a > v->shape[s->axis] ||
			    s->b > v->shape[s->axis] - s->a))
			rc = fail(w, err,
				  "[%lld, +%lld) outside axis %d of extent "
				  "%lld",
				  (long long)s->a, (long long)s->b, s->axis,
				  (long long)v->shape[s->axis]);
		if (!rc)
			do_slice(v, s->axis, s->a, s->b);
		return rc;
	case ST_SPLIT:
		rc = check_axis(w, v, s->axis, err);
		if (!rc && v->shape[s->axis] % s->a)
			rc = fail(w, err,
				  "axis %d of extent %lld does not split "
				  "into %lld equal parts",
				  s->axis, (long long)v->shape[s->axis],
				  (long long)s->a);
		if (!rc) {
			int64_t part = v->shape[s->axis] / s->a;

			do_slice(v, s->axis, s->b * part, part);
		}
		return rc;
	case ST_UNSTACK:
		rc = check_axis(w, v, s->axis, err);
		if (!rc && s->a >= v->shape[s->axis])
			rc = fail(w, err,
				  "index %lld outside axis %d of extent %lld",
				  (long long)s->a, s->axis,
				  (long long)v->shape[s->axis]);
		if (!rc) {
			do_slice(v, s->axis, s->a, 1);
			drop_axis(v, s->axis);
		}
		return rc;
	case ST_UNSQUEEZE:
		if (s->axis > v->ndim || v->ndim == FLX_MAX_DIMS)
			return fail(w, err,
				    "axis %d of a tensor of %d dimension(s)",
				    s->axis, v->ndim);
		add_axis(v, s->axis);
		return 0;
	case ST_TRANSPOSE:
		rc = check_transpose(w, v, s, err);
		if (!rc)
			do_transpose(v, s->perm);
		return rc;
	case ST_CAST:
		rc = check_cast(w, v, s->to, err);
		if (!rc)
			v->dtype = s->to;
		return rc;
	}
	return -EINVAL;
}

/* The virtual chunks of source tensor t as it is, appended to v. */
static int load_source(vtensor *v, const flx_tensor *t)
{
	if (flx_grow((void **)&v->ch, &v->cap, v->n + t->nchunks,
		     sizeof(*v->ch)))
		return -ENOMEM;
	v->dtype = t->dtype;
	v->stored = flx_tensor_stored(t);
	v->ndim = t->ndim;
	memcpy(v->shape, t->shape, sizeof(v->shape));
	for (uint32_t i = 0; i < t->nchunks; i++) {
		vchunk *c = &v->ch[v->n++];
		const flx_chunk *s = &t->chunks[i];

		memset(c, 0, sizeof(*c));
		c->src = s;
		c->src_ndim = t->ndim;
		for (int d = 0; d < t->ndim; d++) {
			c->off[d] = s->off[d];
			c->size[d] = s->size[d];
			c->axis_of[d] = d;
		}
	}
	return 0;
}

/* Piece k of a target: its source through its steps, into v (emptied). */
static int build_piece(const flx_xform *x, const flx_ckpt *src, where *w,
		       size_t k, vtensor *v, flx_error *err)
{
	const piece_def *p = &x->pieces[k];
	const flx_tensor *t = flx_ckpt_find(src, p->source);
	int rc;

	v->n = 0;
	w->step = 0;
	if (!t)
		return fail(w, err, "no source tensor '%s'", p->source);
	rc = load_source(v, t);
	for (size_t s = 0; s < p->nsteps && !rc; s++) {
		const step *st = &x->steps[p->step0 + s];

		w->step = s + 1;
		w->what = step_names[st->kind];
		rc = apply_step(w, st, v, err);
	}
	return rc;
}

static int append(vtensor *to, const vtensor *from, int axis, int64_t shift)
{
	if (flx_grow((void **)&to->ch, &to->cap, to->n + from->n,
		     sizeof(*to->ch)))
		return -ENOMEM;
	for (size_t i = 0; i < from->n; i++) {
		vchunk *c = &to->ch[to->n++];

		*c = from->ch[i];
		if (axis >= 0)
			c->off[axis] += shift;
	}
	return 0;
}

/* Piece v joins target tv, after the pieces already there. */
static int concat(const where *w, int axis, vtensor *tv, const vtensor *v,
		  flx_error *err)
{
	int64_t shift = axis >= 0 && tv->ndim > axis ? tv->shape[axis] : 0;

	if (w->piece == 1) {
		if (axis >= v->ndim)
			return fail(w, err,
				    "concatenation axis %d but the tensor "
				    "has %d dimension(s)",
				    axis, v->ndim);
		*tv = (vtensor){.dtype = v->dtype,
				.stored = v->stored,
				.ndim = v->ndim,
				.ch = tv->ch,
				.cap = tv->cap};
		memcpy(tv->shape, v->shape, sizeof(tv->shape));
		return append(tv, v, -1, 0);
	}
	if (axis < 0)
		return fail(w, err,
			    "several pieces and no concatenation "
			    "axis");
	if (v->dtype != tv->dtype || v->stored != tv->stored)
		return fail(w, err,
			    "dtype %s (stored as %s), piece 1: %s "
			    "(stored as %s)",
			    flx_dtype_name(v->dtype), flx_dtype_name(v->stored),
			    flx_dtype_name(tv->dtype),
			    flx_dtype_name(tv->stored));
	if (v->ndim != tv->ndim)
		return fail(w, err, "%d dimension(s), piece 1: %d", v->ndim,
			    tv->ndim);
	for (int d = 0; d < v->ndim; d++)
		if (d != axis && v->shape[d] != tv->shape[d])
			return fail(w, err,
				    "extent %lld of axis %d, piece 1: %lld "
				    "(concatenated along axis %d)",
				    (long long)v->shape[d], d,
				    (long long)tv->shape[d], axis);
	if (__builtin_add_overflow(tv->shape[axis], v->shape[axis],
				   &tv->shape[axis]))
		return fail(w, err, "concatenated extent overflows");
	return append(tv, v, axis, shift);
}

/* Piece v joins placed target tv at offset at (ndim at_ndim); the
 * target's shape grows to hold it.  Overlap and coverage are checked once
 * every piece is in (check_placed()). */
static int place(const where *w, vtensor *tv, const vtensor *v, int at_ndim,
		 const int64_t *at, flx_error *err)
{
	if (at_ndim != v->ndim)
		return fail(w, err, "placed with %d offset(s) but has %d axes",
			    at_ndim, v->ndim);
	if (w->piece == 1) {
		*tv = (vtensor){.dtype = v->dtype,
				.stored = v->stored,
				.ndim = v->ndim,
				.ch = tv->ch,
				.cap = tv->cap};
	} else if (v->dtype != tv->dtype || v->stored != tv->stored) {
		return fail(w, err,
			    "dtype %s (stored as %s), piece 1: %s "
			    "(stored as %s)",
			    flx_dtype_name(v->dtype), flx_dtype_name(v->stored),
			    flx_dtype_name(tv->dtype),
			    flx_dtype_name(tv->stored));
	} else if (v->ndim != tv->ndim) {
		return fail(w, err, "%d dimension(s), piece 1: %d", v->ndim,
			    tv->ndim);
	}
	for (int d = 0; d < v->ndim; d++) {
		int64_t end;

		if (__builtin_add_overflow(at[d], v->shape[d], &end))
			return fail(w, err, "placed past 2^63");
		if (end > tv->shape[d])
			tv->shape[d] = end;
	}
	if (flx_grow((void **)&tv->ch, &tv->cap, tv->n + v->n, sizeof(*tv->ch)))
		return -ENOMEM;
	for (size_t i = 0; i < v->n; i++) {
		vchunk *c = &tv->ch[tv->n++];

		*c = v->ch[i];
		for (int d = 0; d < v->ndim; d++)
			c->off[d] += at[d];
	}
	return 0;
}

/* The placed pieces of a target (boxes at[k] + shape[k]) must not overlap:
 * with the coverage count of build_target(), they then tile it. */
static int check_placed(const where *w, int ndim, size_t n,
			const int64_t (*at)[FLX_MAX_DIMS],
			const int64_t (*shape)[FLX_MAX_DIMS], flx_error *err)
{
	for (size_t i = 0; i < n; i++)
		for (size_t j = i + 1; j < n; j++) {
			bool meet = flx_numel(ndim, shape[i]) &&
				    flx_numel(ndim, shape[j]);

			for (int d = 0; d < ndim && meet; d++)
				meet = at[i][d] < at[j][d] + shape[j][d] &&
				       at[j][d] < at[i][d] + shape[i][d];
			if (meet)
				return fail(w, err,
					    "pieces %zu and %zu overlap", i + 1,
					    j + 1);
		}
	return 0;
}

/* ---- the transformed index ---- */

/* How a derived chunk's storage follows from its source chunk. */
typedef struct recipe {
	flx_chunk *ch;
	const flx_chunk *src;
	int ndim, src_ndim;
	int axis_of[FLX_MAX_DIMS];
	int64_t start[FLX_MAX_DIMS];
} recipe;

struct flx_xindex {
	const flx_ckpt *src;
	bool identity; /* nothing transformed: the index is src */
	flx_ckpt c;
	flx_pool pool;	 /* derived names and chunks */
	recipe *recipes; /* one per derived chunk */
	size_t nrecipes, caprecipes;
};

static void storage_of(const recipe *r)
{
	flx_chunk *ch = r->ch;
	int64_t e = r->src->storage_offset;

	for (int a = 0; a < r->src_ndim; a++)
		e += r->start[a] * r->src->stride[a];
	for (int d = 0; d < r->ndim; d++)
		ch->stride[d] =
		    r->axis_of[d] >= 0 ? r->src->stride[r->axis_of[d]] : 0;
	ch->storage_offset = e;
	ch->data_off = r->src->data_off;
	ch->item_off = r->src->item_off;
	ch->item_len = r->src->item_len;
	ch->zstd = r->src->zstd;
	ch->contig_from = flx_chunk_contig_from(r->ndim, ch);
}

void flx_xindex_finish(flx_xindex *xi)
{
	for (size_t i = 0; xi && i < xi->nrecipes; i++)
		storage_of(&xi->recipes[i]);
}

/* Target name from v: a tensor whose chunks live in the pool. */
static int make_tensor(flx_xindex *xi, const char *name, const vtensor *v,
		       flx_tensor *t)
{
	size_t per = 3 * (size_t)v->ndim, nl = strlen(name) + 1, bytes;
	flx_chunk *ch;
	char *fqn;

	if (v->n > UINT32_MAX ||
	    __builtin_mul_overflow(
		v->n, sizeof(flx_chunk) + per * sizeof(int64_t), &bytes) ||
	    flx_grow((void **)&xi->recipes, &xi->caprecipes,
		     xi->nrecipes + v->n, sizeof(recipe)))
		return -ENOMEM;
	/* the dims block of a 0-d tensor is empty, not absent */
	ch = flx_pool_alloc(&xi->pool, bytes + sizeof(int64_t));
	fqn = flx_pool_alloc(&xi->pool, nl);
	if (!ch || !fqn)
		return -ENOMEM;
	memcpy(fqn, name, nl);
	*t = (flx_tensor){.fqn = fqn,
			  .dtype = v->dtype,
			  .stored = v->stored != v->dtype ? v->stored
							  : FLX_DT_INVALID,
			  .ndim = v->ndim,
			  .nchunks = (uint32_t)v->n,
			  .chunks = ch,
			  .dims = (int64_t *)(ch + v->n)};
	memcpy(t->shape, v->shape, sizeof(t->shape));
	for (size_t i = 0; i < v->n; i++) {
		const vchunk *c = &v->ch[i];
		recipe *r = &xi->recipes[xi->nrecipes++];

		ch[i].off = t->dims + i * per;
		ch[i].size = ch[i].off + v->ndim;
		ch[i].stride = ch[i].size + v->ndim;
		ch[i].file = c->src->file;
		ch[i].zstd = c->src->zstd;
		memcpy(ch[i].off, c->off, (size_t)v->ndim * sizeof(int64_t));
		memcpy(ch[i].size, c->size, (size_t)v->ndim * sizeof(int64_t));
		*r = (recipe){.ch = &ch[i],
			      .src = c->src,
			      .ndim = v->ndim,
			      .src_ndim = c->src_ndim};
		memcpy(r->axis_of, c->axis_of, sizeof(r->axis_of));
		memcpy(r->start, c->start, sizeof(r->start));
		/* a loading source's item threads are still writing it */
		if (!xi->src->loading)
			storage_of(r);
	}
	return 0;
}

/* Target i of x, checked against src and built into *t. */
static int build_target(flx_xindex *xi, const flx_xform *x, size_t i,
			vtensor *pv, vtensor *tv, flx_tensor *t, flx_error *err)
{
	const target_def *td = &x->targets[i];
	where w = {.x = x, .target = td->name};
	uint64_t numel = 0, covered = 0;
	int rc = 0;

	int64_t(*at)[FLX_MAX_DIMS] = NULL, (*shape)[FLX_MAX_DIMS] = NULL;

	if (!td->npieces)
		return fail(&w, err, "no piece");
	tv->n = 0;
	if (td->axis == FLX_XFORM_PLACED) {
		at = calloc(td->npieces, sizeof(*at));
		shape = calloc(td->npieces, sizeof(*shape));
		if (!at || !shape)
			rc = -ENOMEM;
	}
	for (size_t k = 0; k < td->npieces && !rc; k++) {
		const piece_def *pd = &x->pieces[td->piece0 + k];

		w.piece = k + 1;
		rc = build_piece(x, xi->src, &w, td->piece0 + k, pv, err);
		w.step = 0;
		if (rc)
			break;
		if (td->axis != FLX_XFORM_PLACED) {
			rc = concat(&w, td->axis, tv, pv, err);
			continue;
		}
		rc = place(&w, tv, pv, pd->at_ndim, pd->at, err);
		memcpy(at[k], pd->at, sizeof(at[k]));
		memcpy(shape[k], pv->shape, sizeof(shape[k]));
	}
	w.piece = 0;
	if (!rc && at)
		rc = check_placed(&w, tv->ndim, td->npieces,
				  (const int64_t(*)[FLX_MAX_DIMS])at,
				  (const int64_t(*)[FLX_MAX_DIMS])shape, err);
	free(at);
	free(shape);
	if (rc)
		return rc;
	/* the pieces tile the target by construction; a total that does
	 * not fit, or chunks that do not cover it, are refused */
	numel = 1;
	for (int d = 0; d < tv->ndim && !rc; d++)
		if (__builtin_mul_overflow(numel, (uint64_t)tv->shape[d],
					   &numel) ||
		    numel > INT64_MAX)
			rc = fail(&w, err, "more than 2^63 elements");
	for (size_t k = 0; k < tv->n && !rc; k++)
		covered += flx_numel(tv->ndim, tv->ch[k].size);
	if (!rc && covered != numel && td->axis == FLX_XFORM_PLACED)
		rc = fail(&w, err, "the pieces cover %llu of %llu elements",
			  (unsigned long long)covered,
			  (unsigned long long)numel);
	if (!rc && covered != numel)
		rc = flx_error_set(err, -EIO, x->origin, td->name,
				   "internal: chunks cover %llu of %llu "
				   "elements",
				   (unsigned long long)covered,
				   (unsigned long long)numel);
	return rc ? rc : make_tensor(xi, td->name, tv, t);
}

static int cmp_tensor_ptr(const void *a, const void *b)
{
	return strcmp((*(flx_tensor *const *)a)->fqn,
		      (*(flx_tensor *const *)b)->fqn);
}

/*
 * The name index, and names used once: by one tensor of the index, and
 * by no object.  origin[k]: the target tensor k is (SIZE_MAX: passed
 * through), for the message.
 */
static int index_names(flx_xindex *xi, const flx_xform *x, const size_t *origin,
		       flx_error *err)
{
	flx_ckpt *c = &xi->c;

	c->by_name =
	    malloc((c->ntensors ? c->ntensors : 1) * sizeof(*c->by_name));
	if (!c->by_name)
		return -ENOMEM;
	for (size_t i = 0; i < c->ntensors; i++)
		c->by_name[i] = &c->tensors[i];
	qsort(c->by_name, c->ntensors, sizeof(*c->by_name), cmp_tensor_ptr);
	for (size_t i = 1; i < c->ntensors; i++) {
		const flx_tensor *a = c->by_name[i - 1], *b = c->by_name[i];
		size_t oa = origin[a - c->tensors], ob = origin[b - c->tensors];

		if (strcmp(a->fqn, b->fqn))
			continue;
		if (oa == SIZE_MAX || ob == SIZE_MAX)
			return flx_error_set(err, -EINVAL, x->origin, a->fqn,
					     "target name is also a source "
					     "tensor's, which no piece reads");
		return flx_error_set(err, -EINVAL, x->origin, a->fqn,
				     "targets %zu and %zu have this name",
				     (oa < ob ? oa : ob) + 1,
				     (oa < ob ? ob : oa) + 1);
	}
	for (size_t i = 0; i < c->nobjects; i++)
		if (flx_ckpt_find(c, c->objects[i].fqn))
			return flx_error_set(err, -EINVAL, x->origin,
					     c->objects[i].fqn,
					     "target name is also a "
					     "non-tensor item's");
	return 0;
}

/* Which source tensors some piece reads, and the first target reading
 * each first (anchor[t]: index in src of target t's first piece). */
static void find_sources(const flx_xform *x, const flx_ckpt *src,
			 bool *consumed, size_t *anchor)
{
	for (size_t i = 0; i < x->ndrops; i++) {
		const flx_tensor *s = flx_ckpt_find(src, x->drops[i]);

		if (s)
			consumed[s - src->tensors] = true;
	}
	for (size_t t = 0; t < x->ntargets; t++) {
		anchor[t] = SIZE_MAX;
		for (size_t k = 0; k < x->targets[t].npieces; k++) {
			const flx_tensor *s = flx_ckpt_find(
			    src, x->pieces[x->targets[t].piece0 + k].source);

			if (!s)
				continue; /* build_target() says so */
			consumed[s - src->tensors] = true;
			if (k == 0)
				anchor[t] = (size_t)(s - src->tensors);
		}
	}
}

/* The tensors of the index, in order (transform.h); built[t]: target t. */
static int lay_out(flx_xindex *xi, const flx_xform *x, const bool *consumed,
		   const size_t *anchor, const flx_tensor *built,
		   size_t *origin)
{
	const flx_ckpt *src = xi->src;
	size_t n = 0, total = x->ntargets;

	for (size_t i = 0; i < src->ntensors; i++)
		total += !consumed[i];
	xi->c.tensors = calloc(total ? total : 1, sizeof(flx_tensor));
	if (!xi->c.tensors)
		return -ENOMEM;
	for (size_t i = 0; i < src->ntensors; i++) {
		if (!consumed[i]) {
			origin[n] = SIZE_MAX;
			xi->c.tensors[n++] = src->tensors[i];
			continue;
		}
		for (size_t t = 0; t < x->ntargets; t++)
			if (anchor[t] == i) {
				origin[n] = t;
				xi->c.tensors[n++] = built[t];
			}
	}
	xi->c.ntensors = n;
	return 0;
}

/* The borrowed part of the index: everything but the tensors. */
static void borrow(flx_ckpt *c, const flx_ckpt *src)
{
	c->dir = src->dir;
	c->format = src->format;
	c->writer = src->writer;
	c->mtime_ns = src->mtime_ns;
	c->access = src->access;
	c->nfiles = src->nfiles;
	c->files = src->files;
	c->fdt = src->fdt;
	c->backend = src->backend;
	c->nobjects = src->nobjects;
	c->objects = src->objects;
	c->src_state = src->src_state;
	c->src_fact = src->src_fact;
}

int flx_xform_apply(const flx_xform *x, const flx_ckpt *src, flx_xindex **out,
		    flx_error *err)
{
	flx_xindex *xi = calloc(1, sizeof(*xi));
	size_t nt = x ? x->ntargets : 0, *anchor = NULL, *origin = NULL;
	bool *consumed = NULL;
	flx_tensor *built = NULL;
	vtensor pv = {0}, tv = {0};
	int rc = 0;

	if (!xi)
		return flx_error_default(err, -ENOMEM, NULL);
	xi->src = src;
	xi->identity = nt == 0 && !(x && x->ndrops);
	if (xi->identity)
		goto out;
	consumed = calloc(src->ntensors ? src->ntensors : 1, sizeof(bool));
	anchor = calloc(nt ? nt : 1, sizeof(size_t));
	origin = calloc(src->ntensors + nt + 1, sizeof(size_t));
	built = calloc(nt ? nt : 1, sizeof(flx_tensor));
	if (!consumed || !anchor || !origin || !built) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t t = 0; t < nt && !rc; t++)
		rc = build_target(xi, x, t, &pv, &tv, &built[t], err);
	if (!rc) {
		find_sources(x, src, consumed, anchor);
		rc = lay_out(xi, x, consumed, anchor, built, origin);
	}
	if (!rc) {
		borrow(&xi->c, src);
		rc = index_names(xi, x, origin, err);
	}
out:
	free(pv.ch);
	free(tv.ch);
	free(consumed);
	free(anchor);
	free(origin);
	free(built);
	if (rc) {
		flx_error_default(err, rc, x ? x->origin : NULL);
		flx_xindex_free(xi);
		return rc;
	}
	*out = xi;
	return 0;
}

const flx_ckpt *flx_xindex_ckpt(const flx_xindex *xi)
{
	return xi->identity ? xi->src : &xi->c;
}

void flx_xindex_free(flx_xindex *xi)
{
	if (!xi)
		return;
	free(xi->c.tensors);
	free(xi->c.by_name);
	free(xi->recipes);
	flx_pool_free(&xi->pool);
	free(xi);
}
