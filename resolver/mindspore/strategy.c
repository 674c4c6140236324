/* SPDX-License-Identifier: MIT */
/*
 * MindSpore strategy files: protobuf and JSON into flx_ms_strategy, and
 * the box arithmetic of docs/formats/mindspore.md#rank-boxes,
 * docs/formats/mindspore.md#box-algorithm.
 *
 * The protobuf is unpacked by protobuf-c (node_strategy.pb-c.h, generated
 * at build time from node_strategy.proto), JSON by jansson.  Both parsers
 * fill a raw_layout (the file's values, unchecked) and hand it to
 * layout_finish(), the one place the values are validated, so the two
 * variants refuse the same things with the same words.
 */
#include "strategy.h"

#include "json_guard.h"
#include "node_strategy.pb-c.h"

#include <errno.h>
#include <stddef.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A layout as the file gives it.  Lists are bounded by the message (or
 * JSON array) they come from; the fixed ones by FLX_MS_MAX_DIMS. */
typedef struct raw_layout {
	char *name;
	uint32_t ndev;
	int64_t dev[FLX_MS_MAX_DIMS];
	uint32_t nent; /* tensor_map entries */
	uint32_t entlen[FLX_MS_MAX_DIMS];
	int64_t ent[FLX_MS_MAX_DIMS][FLX_MS_MAX_DIMS];
	uint32_t nsplit, noff;
	int64_t *split, *off;
	int64_t field, step, size;
	bool has_shape;
	uint32_t nshape;
	int64_t shape[FLX_MS_MAX_DIMS];
} raw_layout;

static void raw_free(raw_layout *r)
{
	free(r->name);
	free(r->split);
	free(r->off);
	memset(r, 0, sizeof(*r));
}

typedef struct builder {
	const char *file;
	flx_error *err;
	flx_ms_layout *v;
	uint32_t n, cap;
	bool have_stage;
	uint32_t file_stage;
} builder;

static int bad(builder *b, const char *key, const char *what)
{
	return flx_error_set(b->err, -EINVAL, b->file, key, "%s", what);
}

static int push(builder *b, const flx_ms_layout *l)
{
	if (b->n == FLX_MS_MAX_LAYOUTS)
		return flx_error_set(
		    b->err, -EINVAL, b->file, l->name,
		    "more than %u parallel_layout_item entries",
		    FLX_MS_MAX_LAYOUTS);
	if (b->n == b->cap) {
		uint32_t cap = b->cap ? b->cap * 2 : 64;
		flx_ms_layout *v = realloc(b->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		b->v = v;
		b->cap = cap;
	}
	b->v[b->n++] = *l;
	return 0;
}

/* Validate r and move it into a layout (r's lists are taken over). */
static int layout_finish(builder *b, raw_layout *r)
{
	flx_ms_layout l;
	const char *key = r->name;
	uint32_t used = 0;

	memset(&l, 0, sizeof(l));
	if (r->ndev == 0)
		return bad(b, key, "dev_matrix is missing or empty");
	if (r->field != 0)
		return flx_error_set(b->err, -EINVAL, b->file, key,
				     "field %lld (a field-split embedding) is "
				     "not supported",
				     (long long)r->field);
	if (r->step < INT32_MIN || r->step > INT32_MAX || r->size < INT32_MIN ||
	    r->size > INT32_MAX)
		return bad(b, key,
			   "opt_weight_shard_step or _size outside "
			   "int32");
	l.ndev = r->ndev;
	l.devices = 1;
	for (uint32_t j = 0; j < r->ndev; j++) {
		if (r->dev[j] < 1 || r->dev[j] > FLX_MS_MAX_DEVICES)
			return flx_error_set(b->err, -EINVAL, b->file, key,
					     "dev_matrix entry %lld is not in "
					     "1..%u",
					     (long long)r->dev[j],
					     FLX_MS_MAX_DEVICES);
		l.dev[j] = (uint32_t)r->dev[j];
		l.devices *= l.dev[j];
		if (l.devices > FLX_MS_MAX_DEVICES)
			return flx_error_set(b->err, -EINVAL, b->file, key,
					     "dev_matrix has more than %u "
					     "devices",
					     FLX_MS_MAX_DEVICES);
	}
	/* docs/formats/mindspore.md#layout-api: one entry is the classic flat
	 * map; several are one list per tensor dim once empty entries are
	 * dropped. */
	if (r->nent == 1) {
		l.ndim = r->entlen[0];
		for (uint32_t i = 0; i < l.ndim; i++) {
			int64_t k = r->ent[0][i];
			if (k != -1)
				l.map[i][l.nmap[i]++] = (uint8_t)(k & 0xff);
			if (k != -1 && (k < 0 || k >= r->ndev))
				goto bad_k;
		}
	} else {
		l.nested = r->nent > 1;
		for (uint32_t e = 0; e < r->nent; e++) {
			if (r->entlen[e] == 0)
				continue;
			uint32_t i = l.ndim++;
			for (uint32_t j = 0; j < r->entlen[e]; j++) {
				int64_t k = r->ent[e][j];
				if (k == -1)
					continue;
				if (k < 0 || k >= r->ndev)
					goto bad_k;
				l.map[i][l.nmap[i]++] = (uint8_t)k;
			}
		}
	}
	for (uint32_t i = 0; i < l.ndim; i++)
		for (uint32_t j = 0; j < l.nmap[i]; j++) {
			if (used & (1u << l.map[i][j]))
				return bad(b, key,
					   "tensor_map uses a device "
					   "dimension twice");
			used |= 1u << l.map[i][j];
		}
	l.opt_step = (int32_t)r->step;
	l.opt_size = (int32_t)r->size;
	if (r->has_shape) {
		if (r->nshape != l.ndim)
			return flx_error_set(
			    b->err, -EINVAL, b->file, key,
			    "tensor_shape has %u dims, tensor_map %u (an "
			    "expanded Layout-API map is not supported)",
			    r->nshape, l.ndim);
		for (uint32_t i = 0; i < l.ndim; i++) {
			if (r->shape[i] < 0)
				return bad(b, key, "negative tensor_shape");
			l.shape[i] = (uint64_t)r->shape[i];
		}
		l.has_shape = true;
	}
	/* docs/formats/mindspore.md#manual-split: a manual split only with
	 * offsets of the same count. */
	if (r->nsplit > 0 && r->nsplit == r->noff && l.ndim > 0) {
		for (uint32_t j = 0; j < r->nsplit; j++)
			if (r->split[j] < 0 || r->off[j] < 0 ||
			    r->split[j] > INT64_MAX - r->off[j])
				return bad(b, key,
					   "negative or huge "
					   "param_split_shape or "
					   "indices_offset");
		uint64_t blocks = 1;
		for (uint32_t j = 0; j < l.nmap[0]; j++)
			blocks *= l.dev[l.ndev - 1 - l.map[0][j]];
		if (blocks != r->nsplit)
			return flx_error_set(
			    b->err, -EINVAL, b->file, key,
			    "param_split_shape and indices_offset have %u "
			    "entries, dim 0 is split %llu ways (a manual "
			    "split has one per block)",
			    r->nsplit, (unsigned long long)blocks);
		l.nsplit = r->nsplit;
		l.split_rows = r->split;
		l.split_off = r->off;
		r->split = r->off = NULL;
	}
	l.name = r->name;
	r->name = NULL;
	int rc = push(b, &l);
	if (rc < 0) {
		r->name = l.name;
		r->split = l.split_rows;
		r->off = l.split_off;
	}
	return rc;
bad_k:
	return flx_error_set(b->err, -EINVAL, b->file, key,
			     "tensor_map value outside the %u-dim dev_matrix",
			     r->ndev);
}

/* ---- protobuf ---- */

/* What unpacking may hold at once: protobuf-c builds a struct of about
 * 40 bytes per message and, while it scans a message, about 32 bytes per
 * field, so a file of empty sub-messages ("12 00") needs about 60 times
 * its size; a real strategy (per layout item about 30 bytes plus the name
 * on the wire, seven messages) at most about 12.  The cap bounds the
 * memory a hostile file takes whatever its size; a strategy of
 * FLX_MS_MAX_LAYOUTS items needs about half of it. */
#define PB_BUDGET_FACTOR 32u
#define PB_BUDGET_FLOOR	 ((size_t)1 << 20)
#define PB_BUDGET_CAP	 ((size_t)1 << 30)

/* protobuf-c's allocator: keeps what unpack holds at once (each block
 * carries its size) within a budget, and tells a failed malloc or the
 * budget apart from a malformed file (unpack returns NULL for all). */
typedef struct pb_arena {
	size_t live, budget;
	bool over, nomem;
} pb_arena;

typedef union pb_block {
	size_t size;
	max_align_t align;
} pb_block;

static void *pb_alloc(void *data, size_t size)
{
	pb_arena *a = data;
	pb_block *p;
	if (size > a->budget - a->live) {
		a->over = true;
		return NULL;
	}
	if (!(p = malloc(sizeof(*p) + size))) {
		a->nomem = true;
		return NULL;
	}
	p->size = size;
	a->live += size;
	return p + 1;
}

static void pb_release(void *data, void *ptr)
{
	pb_arena *a = data;
	pb_block *p = ptr;
	if (!p)
		return;
	p--;
	a->live -= p->size;
	free(p);
}

/* A list of n values into a new int64 array (a manual split's rows or
 * offsets, taken over by the layout). */
static int pb_i64_dup(const int64_t *v, size_t n, int64_t **out, uint32_t *nout)
{
	*out = malloc((n ? n : 1) * sizeof(**out));
	if (!*out)
		return -ENOMEM;
	if (n)
		memcpy(*out, v, n * sizeof(**out));
	*nout = (uint32_t)n;
	return 0;
}

/* One unpacked ParallelLayoutItem into a raw layout, then validated.
 * dev_matrix, param_split_shape and indices_offset: entry [0]
 * (docs/formats/mindspore.md#strategy-schema). */
static int pb_layout(builder *b,
		     const Mindspore__Straspb__ParallelLayoutItem *it)
{
	const Mindspore__Straspb__ParallelLayouts *pl = it->parallel_layouts;
	const char *key = it->param_name;
	raw_layout r;
	int rc = 0;

	memset(&r, 0, sizeof(r));
	if (!key || !pl)
		return bad(b, key,
			   "parallel_layout_item without param_name "
			   "or parallel_layouts");
	if (pl->n_tensor_map > FLX_MS_MAX_DIMS ||
	    (pl->n_dev_matrix > 0 &&
	     pl->dev_matrix[0]->n_dim > FLX_MS_MAX_DIMS))
		goto too_long;
	for (size_t e = 0; e < pl->n_tensor_map; e++)
		if (pl->tensor_map[e]->n_dim > FLX_MS_MAX_DIMS)
			goto too_long;
	if ((pl->n_param_split_shape > 0 &&
	     pl->param_split_shape[0]->n_dim > FLX_MS_MAX_DEVICES) ||
	    (pl->n_indices_offset > 0 &&
	     pl->indices_offset[0]->n_dim > FLX_MS_MAX_DEVICES))
		return flx_error_set(b->err, -EINVAL, b->file, key,
				     "param_split_shape or indices_offset "
				     "longer than %u",
				     FLX_MS_MAX_DEVICES);
	if (!(r.name = strdup(key)))
		return -ENOMEM;
	if (pl->n_dev_matrix > 0) {
		r.ndev = (uint32_t)pl->dev_matrix[0]->n_dim;
		for (uint32_t j = 0; j < r.ndev; j++)
			r.dev[j] = pl->dev_matrix[0]->dim[j];
	}
	r.nent = (uint32_t)pl->n_tensor_map;
	for (uint32_t e = 0; e < r.nent; e++) {
		r.entlen[e] = (uint32_t)pl->tensor_map[e]->n_dim;
		for (uint32_t j = 0; j < r.entlen[e]; j++)
			r.ent[e][j] = pl->tensor_map[e]->dim[j];
	}
	if (pl->n_param_split_shape > 0)
		rc = pb_i64_dup(pl->param_split_shape[0]->dim,
				pl->param_split_shape[0]->n_dim, &r.split,
				&r.nsplit);
	if (!rc && pl->n_indices_offset > 0)
		rc = pb_i64_dup(pl->indices_offset[0]->dim,
				pl->indices_offset[0]->n_dim, &r.off, &r.noff);
	r.field = pl->field;
	r.step = pl->opt_weight_shard_step;
	r.size = pl->opt_weight_shard_size;
	if (!rc)
		rc = layout_finish(b, &r);
	raw_free(&r);
	return rc;
too_long:
	return flx_error_set(b->err, -EINVAL, b->file, key,
			     "dev_matrix or tensor_map longer than %u",
			     FLX_MS_MAX_DIMS);
}

/* The file is one ParallelStrategyMap, unpacked whole by protobuf-c from
 * node_strategy.proto (the spec's schema, compiled at build time).  The
 * file's stage is that of the first strategy item that has one
 * (docs/formats/mindspore.md#merged-strategies). */
static int parse_proto(builder *b, const void *buf, size_t len)
{
	pb_arena arena = {.budget = PB_BUDGET_CAP};
	ProtobufCAllocator al = {pb_alloc, pb_release, &arena};
	Mindspore__Straspb__ParallelStrategyMap *m;
	int rc = 0;

	if (len < (PB_BUDGET_CAP - PB_BUDGET_FLOOR) / PB_BUDGET_FACTOR)
		arena.budget = PB_BUDGET_FLOOR + len * PB_BUDGET_FACTOR;
	m = mindspore__straspb__parallel_strategy_map__unpack(&al, len, buf);
	if (!m && arena.nomem)
		return -ENOMEM;
	if (!m && arena.over)
		return flx_error_set(
		    b->err, -EINVAL, b->file, "ParallelStrategyMap",
		    "unpacking it needs more than %zu MiB of memory (%u "
		    "times its size, at most %zu MiB)",
		    arena.budget >> 20, PB_BUDGET_FACTOR, PB_BUDGET_CAP >> 20);
	if (!m)
		return bad(b, "ParallelStrategyMap",
			   "not a ParallelStrategyMap protobuf message "
			   "(protobuf-c cannot unpack it: truncated, a "
			   "malformed field or a required field missing)");
	for (size_t i = 0; i < m->n_parallel_strategy_item && !b->have_stage;
	     i++) {
		const Mindspore__Straspb__ParallelStrategys *ps =
		    m->parallel_strategy_item[i]->parallel_strategys;
		if (!ps)
			continue;
		if (ps->stage >= FLX_MS_MAX_STAGES) {
			rc = bad(b, "stage", "pipeline stage too large");
			goto out;
		}
		b->file_stage = ps->stage;
		b->have_stage = true;
	}
	for (size_t i = 0; i < m->n_parallel_layout_item && !rc; i++)
		rc = pb_layout(b, m->parallel_layout_item[i]);
out:
	mindspore__straspb__parallel_strategy_map__free_unpacked(m, &al);
	return rc;
}

/* ---- JSON ---- */

static int js_ints(const json_t *a, int64_t *out, uint32_t max, uint32_t *n)
{
	size_t i;
	json_t *x;
	*n = 0;
	if (!json_is_array(a))
		return -EINVAL;
	json_array_foreach(a, i, x)
	{
		if (!json_is_integer(x))
			return -EINVAL;
		if (*n == max)
			return -E2BIG;
		out[(*n)++] = json_integer_value(x);
	}
	return 0;
}

static int js_ints_alloc(const json_t *a, int64_t **out, uint32_t *n)
{
	size_t m = json_is_array(a) ? json_array_size(a) : 0;
	if (m > FLX_MS_MAX_DEVICES)
		return -E2BIG;
	*out = malloc((m ? m : 1) * sizeof(**out));
	if (!*out)
		return -ENOMEM;
	return js_ints(a, *out, (uint32_t)m, n);
}

static int js_int(const json_t *o, const char *k, int64_t *v)
{
	json_t *x = json_object_get(o, k);
	if (!x)
		return 0;
	if (!json_is_integer(x))
		return -EINVAL;
	*v = json_integer_value(x);
	return 0;
}

static int js_layout(builder *b, const char *name, const json_t *o)
{
	raw_layout r;
	json_t *tm, *x;
	size_t i;
	int rc = -EINVAL;
	const char *what = "";

	memset(&r, 0, sizeof(r));
	r.name = strdup(name);
	if (!r.name)
		return -ENOMEM;
	if (!json_is_object(o)) {
		what = "is not an object";
		goto bad;
	}
	what = "dev_matrix";
	rc = js_ints(json_object_get(o, "dev_matrix"), r.dev, FLX_MS_MAX_DIMS,
		     &r.ndev);
	if (rc < 0)
		goto bad;
	what = "tensor_map";
	tm = json_object_get(o, "tensor_map");
	if (!json_is_array(tm)) {
		rc = -EINVAL;
		goto bad;
	}
	/* flat ints (the C++ writer), or one list per dim */
	if (json_array_size(tm) > 0 && json_is_array(json_array_get(tm, 0))) {
		json_array_foreach(tm, i, x)
		{
			if (r.nent == FLX_MS_MAX_DIMS) {
				rc = -E2BIG;
				goto bad;
			}
			rc = js_ints(x, r.ent[r.nent], FLX_MS_MAX_DIMS,
				     &r.entlen[r.nent]);
			if (rc < 0)
				goto bad;
			r.nent++;
		}
	} else {
		r.nent = 1;
		rc = js_ints(tm, r.ent[0], FLX_MS_MAX_DIMS, &r.entlen[0]);
		if (rc < 0)
			goto bad;
	}
	what = "tensor_shape";
	if ((x = json_object_get(o, "tensor_shape"))) {
		rc = js_ints(x, r.shape, FLX_MS_MAX_DIMS, &r.nshape);
		if (rc < 0)
			goto bad;
		r.has_shape = true;
	}
	what = "field, opt_weight_shard_step or opt_weight_shard_size";
	if (js_int(o, "field", &r.field) < 0 ||
	    js_int(o, "opt_weight_shard_step", &r.step) < 0 ||
	    js_int(o, "opt_weight_shard_size", &r.size) < 0) {
		rc = -EINVAL;
		goto bad;
	}
	what = "param_split_shape or indices_offset";
	if ((x = json_object_get(o, "param_split_shape")) &&
	    (rc = js_ints_alloc(x, &r.split, &r.nsplit)) < 0)
		goto bad;
	if ((x = json_object_get(o, "indices_offset")) &&
	    (rc = js_ints_alloc(x, &r.off, &r.noff)) < 0)
		goto bad;
	rc = layout_finish(b, &r);
	raw_free(&r);
	return rc;
bad:
	if (rc == -ENOMEM) {
		raw_free(&r);
		return rc;
	}
	rc = flx_error_set(b->err, -EINVAL, b->file, name, "%s %s", what,
			   rc == -E2BIG ? "is too long"
					: "is not a list of integers");
	raw_free(&r);
	return rc;
}

static int parse_json(builder *b, const void *buf, size_t len)
{
	json_error_t je;
	json_t *root, *items, *x;
	const char *k;
	int rc = 0;

	flx_json_guard_begin();
	root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	if (flx_json_guard_failed()) {
		json_decref(root);
		return -ENOMEM;
	}
	if (!root)
		return flx_error_set(b->err, -EINVAL, b->file, NULL,
				     "not JSON: %s (line %d)", je.text,
				     je.line);
	if (!json_is_object(root)) {
		rc = bad(b, "ParallelStrategyMap", "not a JSON object");
		goto out;
	}
	items = json_object_get(root, "parallel_strategy_item");
	if (json_is_object(items)) {
		json_object_foreach(items, k, x)
		{
			int64_t st = 0;
			if (js_int(x, "stage", &st) < 0 || st < 0 ||
			    st >= FLX_MS_MAX_STAGES) {
				rc = bad(b, k,
					 "stage is not a small "
					 "non-negative integer");
				goto out;
			}
			b->file_stage = (uint32_t)st;
			b->have_stage = true;
			break;
		}
	}
	items = json_object_get(root, "parallel_layout_item");
	if (!json_is_object(items)) {
		rc = bad(b, "parallel_layout_item", "missing or not an object");
		goto out;
	}
	json_object_foreach(items, k, x)
	{
		if ((rc = js_layout(b, k, x)) < 0)
			goto out;
	}
out:
	json_decref(root);
	return rc;
}

/* ---- the whole file ---- */

/* "<digits>-rest": *stage and *rest; false otherwise. */
static bool stage_prefix(const char *name, uint32_t *stage, size_t *skip)
{
	uint64_t v = 0;
	size_t i = 0;
	while (name[i] >= '0' && name[i] <= '9' && i < 6)
		v = v * 10 + (uint64_t)(name[i++] - '0');
	if (i == 0 || name[i] != '-' || v >= FLX_MS_MAX_STAGES)
		return false;
	*stage = (uint32_t)v;
	*skip = i + 1;
	return true;
}

static int finish_strategy(builder *b, flx_ms_strategy *s)
{
	uint32_t stage = 0;
	size_t skip = 0;
	bool merged = b->n > 0;
	uint8_t *seen = NULL;
	int rc = 0;

	if (b->n == 0)
		return bad(b, "parallel_layout_item", "no parameter layouts");
	for (uint32_t i = 0; i < b->n && merged; i++)
		merged = stage_prefix(b->v[i].name, &stage, &skip);
	s->merged = merged;
	s->devices = b->v[0].devices;
	for (uint32_t i = 0; i < b->n; i++) {
		flx_ms_layout *l = &b->v[i];
		l->stage = b->have_stage ? b->file_stage : 0;
		if (merged) {
			stage_prefix(l->name, &l->stage, &skip);
			memmove(l->name, l->name + skip,
				strlen(l->name + skip) + 1);
		}
		if (l->devices != s->devices)
			return flx_error_set(
			    b->err, -EINVAL, b->file, l->name,
			    "dev_matrix has %llu devices, the first layout "
			    "%llu (one stage's device count must be the same "
			    "for every parameter)",
			    (unsigned long long)l->devices,
			    (unsigned long long)s->devices);
		if (l->stage + 1 > s->nstages)
			s->nstages = l->stage + 1;
	}
	if ((uint64_t)s->nstages * s->devices > FLX_MS_MAX_DEVICES)
		return bad(b, NULL, "too many ranks (stages x devices)");
	seen = calloc(s->nstages, 1);
	if (!seen)
		return -ENOMEM;
	for (uint32_t i = 0; i < b->n; i++)
		seen[b->v[i].stage] = 1;
	for (uint32_t st = 0; st < s->nstages; st++)
		if (!seen[st]) {
			rc = flx_error_set(b->err, -EINVAL, b->file, "stage",
					   "pipeline stage %u has no layouts "
					   "(a single stage's file: pass the "
					   "merged strategy)",
					   st);
			break;
		}
	free(seen);
	return rc;
}

static int cmp_layout(const void *a, const void *b)
{
	const flx_ms_layout *x = *(flx_ms_layout *const *)a,
			    *y = *(flx_ms_layout *const *)b;
	int c = strcmp(x->name, y->name);
	if (c)
		return c;
	return (x->stage > y->stage) - (x->stage < y->stage);
}

static int check_unique(builder *b)
{
	flx_ms_layout **p = malloc(b->n * sizeof(*p));
	int rc = 0;
	if (!p)
		return -ENOMEM;
	for (uint32_t i = 0; i < b->n; i++)
		p[i] = &b->v[i];
	qsort(p, b->n, sizeof(*p), cmp_layout);
	for (uint32_t i = 1; i < b->n; i++)
		if (cmp_layout(&p[i - 1], &p[i]) == 0) {
			rc = flx_error_set(b->err, -EINVAL, b->file, p[i]->name,
					   "listed twice for stage %u",
					   p[i]->stage);
			break;
		}
	free(p);
	return rc;
}

static void layouts_free(flx_ms_layout *v, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		free(v[i].name);
		free(v[i].split_rows);
		free(v[i].split_off);
	}
	free(v);
}

int flx_ms_strategy_parse(const void *buf, size_t len, bool json,
			  const char *file, flx_ms_strategy **out,
			  flx_error *err)
{
	builder b = {.file = file, .err = err};
	flx_ms_strategy *s = calloc(1, sizeof(*s));
	int rc;

	*out = NULL;
	if (!s)
		return flx_error_default(err, -ENOMEM, file);
	rc = json ? parse_json(&b, buf, len) : parse_proto(&b, buf, len);
	if (rc == 0)
		rc = finish_strategy(&b, s);
	if (rc == 0)
		rc = check_unique(&b);
	if (rc < 0) {
		layouts_free(b.v, b.n);
		free(s);
		return flx_error_default(err, rc, file);
	}
	s->layouts = b.v;
	s->nlayouts = b.n;
	*out = s;
	return 0;
}

void flx_ms_strategy_free(flx_ms_strategy *s)
{
	if (!s)
		return;
	layouts_free(s->layouts, s->nlayouts);
	free(s);
}

const flx_ms_layout *flx_ms_strategy_find(const flx_ms_strategy *s,
					  const char *name, uint32_t stage)
{
	for (uint32_t i = 0; i < s->nlayouts; i++)
		if ((stage == UINT32_MAX || s->layouts[i].stage == stage) &&
		    strcmp(s->layouts[i].name, name) == 0)
			return &s->layouts[i];
	return NULL;
}

/* ---- box arithmetic (docs/formats/mindspore.md#rank-boxes,
 * docs/formats/mindspore.md#box-algorithm) ---- */

/* c[j]: the mixed-radix digits of local over D, last fastest
 * (docs/formats/mindspore.md#coordinates-and-blocks) */
static void coords(const flx_ms_layout *l, uint64_t local, uint64_t *c)
{
	for (uint32_t j = l->ndev; j-- > 0;) {
		c[j] = local % l->dev[j];
		local /= l->dev[j];
	}
}

/* the device dims the map references, as a mask over D's indices */
static uint32_t used_mask(const flx_ms_layout *l)
{
	uint32_t m = 0;
	for (uint32_t i = 0; i < l->ndim; i++)
		for (uint32_t j = 0; j < l->nmap[i]; j++)
			m |= 1u << (l->ndev - 1 - l->map[i][j]);
	return m;
}

static bool opt_active(const flx_ms_layout *l)
{
	return l->opt_step != 0 && l->opt_size != 0 && l->ndim > 0;
}

/* R = devices / ∏(referenced dims): the replica group's size
 * (docs/formats/mindspore.md#replicas) */
static uint64_t replicas(const flx_ms_layout *l)
{
	uint64_t r = l->devices;
	uint32_t m = used_mask(l);
	for (uint32_t j = 0; j < l->ndev; j++)
		if (m & (1u << j))
			r /= l->dev[j];
	return r;
}

uint64_t flx_ms_opt_parts(const flx_ms_layout *l)
{
	if (!opt_active(l))
		return 1;
	uint64_t r = replicas(l);
	if (l->opt_size == -1 || l->opt_size < 0)
		return r;
	return (uint64_t)l->opt_size < r ? (uint64_t)l->opt_size : r;
}

static uint64_t split_of(const flx_ms_layout *l, uint32_t i)
{
	uint64_t s = 1;
	for (uint32_t j = 0; j < l->nmap[i]; j++)
		s *= l->dev[l->ndev - 1 - l->map[i][j]];
	return s;
}

int flx_ms_factors(const flx_ms_layout *l, uint64_t *out)
{
	for (uint32_t i = 0; i < l->ndim; i++)
		out[i] = split_of(l, i);
	if (l->ndim > 0) {
		out[0] *= flx_ms_opt_parts(l);
		if (l->nsplit)
			out[0] = 0;
	}
	return 0;
}

int flx_ms_box(const flx_ms_layout *l, const uint64_t *shape, uint64_t local,
	       uint64_t *start, uint64_t *len)
{
	uint64_t c[FLX_MS_MAX_DIMS];

	if (local >= l->devices)
		return -EINVAL;
	coords(l, local, c);
	for (uint32_t i = 0; i < l->ndim; i++) {
		uint64_t s = 1, idx = 0;
		for (uint32_t j = 0; j < l->nmap[i]; j++) {
			uint32_t d = l->ndev - 1 - l->map[i][j];
			s *= l->dev[d];
			idx = idx * l->dev[d] + c[d];
		}
		if (i == 0 && l->nsplit) {
			/* docs/formats/mindspore.md#manual-split: one
			 * rows/offset pair per dim-0 block */
			if (l->nsplit != s ||
			    (uint64_t)l->split_off[idx] >
				shape[0] - (uint64_t)l->split_rows[idx] ||
			    (uint64_t)l->split_rows[idx] > shape[0])
				return -EINVAL;
			start[0] = (uint64_t)l->split_off[idx];
			len[0] = (uint64_t)l->split_rows[idx];
			continue;
		}
		if (shape[i] % s)
			return -EINVAL;
		len[i] = shape[i] / s;
		start[i] = idx * len[i];
	}
	uint64_t p = flx_ms_opt_parts(l);
	if (p > 1) {
		/* docs/formats/mindspore.md#optimizer-shard: G = the ranks
		 * agreeing with local on every referenced device dim,
		 * ascending; q = index in G mod P */
		/* G's members differ only in the unreferenced dims and
		 * ranks order coordinates lexicographically, so local's index
		 * in G is the mixed-radix number of those coordinates. */
		uint32_t m = used_mask(l);
		uint64_t q = 0;
		for (uint32_t j = 0; j < l->ndev; j++)
			if (!(m & (1u << j)))
				q = q * l->dev[j] + c[j];
		q %= p;
		if (len[0] % p)
			return -EINVAL;
		len[0] /= p;
		start[0] += q * len[0];
	}
	return 0;
}

int flx_ms_opt_infer(const flx_ms_layout *l, const uint64_t *shape,
		     uint64_t local, const uint64_t *stored, uint64_t *parts)
{
	uint64_t start[FLX_MS_MAX_DIMS], len[FLX_MS_MAX_DIMS], r;
	int rc;

	*parts = 1;
	if (opt_active(l) || l->nsplit || l->ndim == 0)
		return 0;
	if ((rc = flx_ms_box(l, shape, local, start, len)))
		return rc;
	for (uint32_t i = 1; i < l->ndim; i++)
		if (stored[i] != len[i])
			return 0;
	r = replicas(l);
	/* P > 1 stored parts of the box's dim 0, P dividing R */
	if (stored[0] == 0 || stored[0] >= len[0] || len[0] % stored[0] ||
	    r % (len[0] / stored[0]))
		return 0;
	*parts = len[0] / stored[0];
	return 0;
}

void flx_ms_layout_opt(const flx_ms_layout *l, uint64_t parts,
		       flx_ms_layout *out)
{
	*out = *l;
	/* step only marks the shard active
	 * (docs/formats/mindspore.md#optimizer-shard: a consistency value) */
	out->opt_step = 1;
	out->opt_size = (int32_t)parts;
}

int flx_ms_layout_fold(const flx_ms_layout *l, uint32_t ndim,
		       flx_ms_layout *out)
{
	uint32_t extra, j = 0;

	if (!l->has_shape || ndim >= l->ndim || l->nsplit)
		return -EINVAL;
	extra = l->ndim - ndim;
	*out = *l;
	memset(out->nmap, 0, sizeof(out->nmap));
	out->ndim = ndim;
	out->nested = true;
	for (uint32_t i = 0; i < ndim; i++) {
		uint64_t size = 1;
		/* leading expanded dims of local size 1, while some must go */
		for (;;) {
			if (j >= l->ndim)
				return -EINVAL;
			bool unit =
			    l->nmap[j] == 1 && l->shape[j] == split_of(l, j);
			for (uint32_t k = 0; k < l->nmap[j]; k++)
				out->map[i][out->nmap[i]++] = l->map[j][k];
			size *= l->shape[j];
			j++;
			if (!(unit && extra > 0))
				break;
			extra--;
		}
		out->shape[i] = size;
	}
	return j == l->ndim && extra == 0 ? 0 : -EINVAL;
}
