/* SPDX-License-Identifier: MIT */
/*
 * MindSpore strategy files: protobuf and JSON into flx_ms_strategy, and
 * the box arithmetic of shared/specs/mindspore-format.md §2.4-2.7.
 *
 * Both parsers fill a raw_layout (the file's values, unchecked) and hand
 * it to layout_finish(), the one place the values are validated, so the
 * two variants refuse the same things with the same words.
 */
#include "strategy.h"

#include "json_guard.h"
#include "pbwire.h"

#include <errno.h>
#include <jansson.h>
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
	/* §2.4(e): one entry is the classic flat map; several are one list
	 * per tensor dim once empty entries are dropped. */
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
	/* §2.4(g): a manual split only with offsets of the same count. */
	if (r->nsplit > 0 && r->nsplit == r->noff && l.ndim > 0) {
		for (uint32_t j = 0; j < r->nsplit; j++)
			if (r->split[j] < 0 || r->off[j] < 0 ||
			    r->split[j] > INT64_MAX - r->off[j])
				return bad(b, key,
					   "negative or huge "
					   "param_split_shape or "
					   "indices_offset");
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

/* The repeated field 1 of a {dim} message (DevMatrix, TensorMap, ...),
 * unpacked or packed, into out (at most max).  int32: values are int32
 * sent as 64-bit varints (−1 is 10 bytes), truncated as protobuf does. */
static int pb_dims(flx_pb m, int64_t *out, uint32_t max, uint32_t *n,
		   bool int32)
{
	uint32_t field, wt;
	uint64_t v;
	*n = 0;
	while (m.p < m.end) {
		if (flx_pb_key(&m, &field, &wt) < 0)
			return -EINVAL;
		if (field != 1) {
			if (flx_pb_skip(&m, wt) < 0)
				return -EINVAL;
			continue;
		}
		flx_pb one = m, *src = &m;
		if (wt == FLX_PB_LEN) {
			if (flx_pb_len(&m, &one) < 0)
				return -EINVAL;
			src = &one;
		} else if (wt != FLX_PB_VARINT) {
			return -EINVAL;
		}
		do {
			if (flx_pb_varint(src, &v) < 0)
				return -EINVAL;
			if (*n == max)
				return -E2BIG;
			out[(*n)++] =
			    int32 ? (int64_t)(int32_t)(uint32_t)v : (int64_t)v;
		} while (wt == FLX_PB_LEN && one.p < one.end);
	}
	return 0;
}

/* A list bounded only by its message: allocated (one element per byte is
 * the most a message can hold). */
static int pb_dims_alloc(flx_pb m, int64_t **out, uint32_t *n)
{
	size_t max = (size_t)(m.end - m.p);
	if (max > FLX_MS_MAX_DEVICES)
		max = FLX_MS_MAX_DEVICES;
	free(*out);
	*out = malloc((max ? max : 1) * sizeof(**out));
	if (!*out)
		return -ENOMEM;
	return pb_dims(m, *out, (uint32_t)max, n, false);
}

static int pb_layouts(builder *b, flx_pb m, raw_layout *r)
{
	uint32_t field, wt;
	uint64_t v;
	flx_pb sub;
	bool dev_seen = false, split_seen = false, off_seen = false;
	const char *key = r->name;

	while (m.p < m.end) {
		if (flx_pb_key(&m, &field, &wt) < 0)
			goto malformed;
		if (field >= 1 && field <= 4 && wt == FLX_PB_LEN) {
			int rc = 0;
			if (flx_pb_len(&m, &sub) < 0)
				goto malformed;
			/* dev_matrix, param_split_shape, indices_offset:
			 * readers use entry [0] */
			if (field == 1 && !dev_seen) {
				rc = pb_dims(sub, r->dev, FLX_MS_MAX_DIMS,
					     &r->ndev, false);
				dev_seen = true;
			} else if (field == 2) {
				if (r->nent == FLX_MS_MAX_DIMS)
					rc = -E2BIG;
				else
					rc = pb_dims(sub, r->ent[r->nent],
						     FLX_MS_MAX_DIMS,
						     &r->entlen[r->nent], true);
				r->nent++;
			} else if (field == 3 && !split_seen) {
				rc = pb_dims_alloc(sub, &r->split, &r->nsplit);
				split_seen = true;
			} else if (field == 4 && !off_seen) {
				rc = pb_dims_alloc(sub, &r->off, &r->noff);
				off_seen = true;
			}
			if (rc == -E2BIG)
				return flx_error_set(
				    b->err, -EINVAL, b->file, key,
				    "dev_matrix or tensor_map longer than %u",
				    FLX_MS_MAX_DIMS);
			if (rc < 0 && rc != -EINVAL)
				return rc;
			if (rc < 0)
				goto malformed;
		} else if (field >= 5 && field <= 7 && wt == FLX_PB_VARINT) {
			if (flx_pb_varint(&m, &v) < 0)
				goto malformed;
			int64_t x = (int64_t)(int32_t)(uint32_t)v;
			if (field == 5)
				r->field = x;
			else if (field == 6)
				r->step = x;
			else
				r->size = x;
		} else if (flx_pb_skip(&m, wt) < 0) {
			goto malformed;
		}
	}
	return 0;
malformed:
	return bad(b, key, "malformed ParallelLayouts message");
}

static int pb_layout_item(builder *b, flx_pb m)
{
	uint32_t field, wt;
	flx_pb sub, lay = {NULL, NULL};
	raw_layout r;
	int rc = -EINVAL;

	memset(&r, 0, sizeof(r));
	while (m.p < m.end) {
		if (flx_pb_key(&m, &field, &wt) < 0)
			goto malformed;
		if ((field == 1 || field == 2) && wt == FLX_PB_LEN) {
			if (flx_pb_len(&m, &sub) < 0)
				goto malformed;
			if (field == 2) {
				lay = sub;
				continue;
			}
			size_t n = (size_t)(sub.end - sub.p);
			if (memchr(sub.p, 0, n))
				goto malformed;
			free(r.name);
			r.name = strndup((const char *)sub.p, n);
			if (!r.name) {
				rc = -ENOMEM;
				goto out;
			}
		} else if (flx_pb_skip(&m, wt) < 0) {
			goto malformed;
		}
	}
	if (!r.name || !lay.p) {
		rc = bad(b, r.name,
			 "parallel_layout_item without param_name "
			 "or parallel_layouts");
		goto out;
	}
	rc = pb_layouts(b, lay, &r);
	if (rc == 0)
		rc = layout_finish(b, &r);
	goto out;
malformed:
	rc = bad(b, r.name, "malformed ParallelLayoutItem message");
out:
	raw_free(&r);
	return rc;
}

/* ParallelStrategyItem: only the stage of the first one is used. */
static int pb_strategy_item(builder *b, flx_pb m)
{
	uint32_t field, wt;
	uint64_t v;
	flx_pb sub, s;
	while (m.p < m.end) {
		if (flx_pb_key(&m, &field, &wt) < 0)
			return -EINVAL;
		if (field != 2 || wt != FLX_PB_LEN) {
			if (flx_pb_skip(&m, wt) < 0)
				return -EINVAL;
			continue;
		}
		if (flx_pb_len(&m, &sub) < 0)
			return -EINVAL;
		while (sub.p < sub.end) {
			if (flx_pb_key(&sub, &field, &wt) < 0)
				return -EINVAL;
			if (field == 1 && wt == FLX_PB_VARINT) {
				if (flx_pb_varint(&sub, &v) < 0)
					return -EINVAL;
				if (!b->have_stage) {
					if (v >= FLX_MS_MAX_STAGES)
						return -E2BIG;
					b->file_stage = (uint32_t)v;
					b->have_stage = true;
				}
			} else if (field == 2 && wt == FLX_PB_LEN) {
				if (flx_pb_len(&sub, &s) < 0)
					return -EINVAL;
			} else if (flx_pb_skip(&sub, wt) < 0) {
				return -EINVAL;
			}
		}
	}
	return 0;
}

static int parse_proto(builder *b, const void *buf, size_t len)
{
	flx_pb c = {buf, (const uint8_t *)buf + len}, sub;
	uint32_t field, wt;
	int rc;
	while (c.p < c.end) {
		if (flx_pb_key(&c, &field, &wt) < 0)
			goto malformed;
		if ((field == 2 || field == 3) && wt == FLX_PB_LEN) {
			if (flx_pb_len(&c, &sub) < 0)
				goto malformed;
			if (field == 3) {
				rc = pb_layout_item(b, sub);
			} else {
				rc = pb_strategy_item(b, sub);
				if (rc == -E2BIG)
					return bad(b, "stage",
						   "pipeline stage too large");
				if (rc < 0)
					return bad(b, NULL,
						   "malformed "
						   "ParallelStrategyItem "
						   "message");
			}
			if (rc < 0)
				return rc;
		} else if (flx_pb_skip(&c, wt) < 0) {
			goto malformed;
		}
	}
	return 0;
malformed:
	return bad(b, NULL,
		   "not a ParallelStrategyMap protobuf message "
		   "(malformed field)");
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
		rc = bad(b, NULL, "not a JSON object");
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
			rc = flx_error_set(b->err, -EINVAL, b->file, NULL,
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

/* ---- box arithmetic (§2.4, §2.7) ---- */

/* c[j]: the mixed-radix digits of local over D, last fastest (§2.4(a)) */
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

uint64_t flx_ms_opt_parts(const flx_ms_layout *l)
{
	if (!opt_active(l))
		return 1;
	/* R = devices / ∏(referenced dims): the replica group's size */
	uint64_t r = l->devices;
	uint32_t m = used_mask(l);
	for (uint32_t j = 0; j < l->ndev; j++)
		if (m & (1u << j))
			r /= l->dev[j];
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
			/* §2.4(g): one rows/offset pair per dim-0 block */
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
		/* §2.4(f): G = the ranks agreeing with local on every
		 * referenced device dim, ascending; q = index in G mod P */
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
