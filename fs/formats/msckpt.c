/* SPDX-License-Identifier: MIT */
/*
 * MindSpore .ckpt files; see msckpt.h.  Pieces, in file order, per
 * record k: its head (generated: the Value's key and length, the tag, the
 * TensorProto's key and length, dims, tensor_type, the content's key and
 * length), then its content (a view).
 */
#include "msckpt.h"

#include "compat.h"
#include "json_internal.h"
#include "pickle_internal.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* One record: a parameter, or one piece of it. */
typedef struct ms_rec {
	const char *tag;
	const flx_view *whole; /* the parameter: dims, tensor_type */
	const flx_view *part;  /* the content */
} ms_rec;

typedef struct ms_file {
	size_t n;
	ms_rec *r;
} ms_file;

/* tensor_type by dtype: the names load_checkpoint's tensor_to_ms_type
 * maps (1.3); NULL: none. */
static const char *const ms_types[FLX_DT_COUNT] = {
    [FLX_DT_F64] = "Float64", [FLX_DT_F32] = "Float32",
    [FLX_DT_F16] = "Float16", [FLX_DT_BF16] = "BFloat16",
    [FLX_DT_I64] = "Int64",   [FLX_DT_I32] = "Int32",
    [FLX_DT_I16] = "Int16",   [FLX_DT_I8] = "Int8",
    [FLX_DT_U8] = "UInt8",    [FLX_DT_BOOL] = "Bool",
    [FLX_DT_U16] = "UInt16",  [FLX_DT_U32] = "UInt32",
    [FLX_DT_U64] = "UInt64",
};

size_t flx_ms_varint(uint64_t v, unsigned char out[FLX_MS_VARINT_MAX])
{
	size_t n = 0;

	while (v >= 0x80) {
		out[n++] = (unsigned char)(v | 0x80);
		v >>= 7;
	}
	out[n++] = (unsigned char)v;
	return n;
}

static size_t varint_len(uint64_t v)
{
	unsigned char b[FLX_MS_VARINT_MAX];

	return flx_ms_varint(v, b);
}

const char *flx_ms_type(flx_dtype dt)
{
	return (unsigned)dt < FLX_DT_COUNT ? ms_types[dt] : NULL;
}

/* The dtypes ms_types lacks: load_checkpoint maps no tensor_type to them.
 * docs/formats/mindspore.md#flexfs-behaviour */
#define MS_NONE "MindSpore's load_checkpoint has no tensor_type for it"
const flx_fmt_dtypes flx_ms_dtypes = {
    .name = "mindspore",
    .never =
	{
	    [FLX_DT_C64] = MS_NONE,
	    [FLX_DT_C128] = MS_NONE,
	    [FLX_DT_F8_E4M3FN] = MS_NONE,
	    [FLX_DT_F8_E5M2] = MS_NONE,
	    [FLX_DT_F8_E4M3FNUZ] = MS_NONE,
	    [FLX_DT_F8_E5M2FNUZ] = MS_NONE,
	},
};

/* A key and a length (or a varint value). */
static void put_key(flx_jw *w, unsigned char key, uint64_t v)
{
	unsigned char b[1 + FLX_MS_VARINT_MAX];

	b[0] = key;
	flx_jw_raw(w, b, 1 + flx_ms_varint(v, b + 1));
}

/* The lengths of record r: its TensorProto and its Value. */
static void rec_lens(const ms_rec *r, uint64_t *tp, uint64_t *val)
{
	const flx_tensor *t = flx_view_tensor(r->whole);
	const flx_box *box = flx_view_box(r->whole);
	size_t tl = strlen(r->tag), yl = strlen(ms_types[t->dtype]);
	uint64_t c = flx_view_bytes(r->part);

	*tp = 1 + varint_len(yl) + yl + 1 + varint_len(c) + c;
	for (int d = 0; d < t->ndim; d++)
		*tp += 1 + varint_len((uint64_t)box->size[d]);
	*val = 1 + varint_len(tl) + tl + 1 + varint_len(*tp) + *tp;
}

static int ms_head(const void *arg, uint32_t idx, unsigned char *dst,
		   uint64_t lo, uint64_t hi, uint64_t *len)
{
	const ms_rec *r = &((const ms_file *)arg)->r[idx];
	const flx_tensor *t = flx_view_tensor(r->whole);
	const flx_box *box = flx_view_box(r->whole);
	const char *type = ms_types[t->dtype];
	flx_jw w = flx_jw_window(dst, lo, hi);
	uint64_t tp, val;

	rec_lens(r, &tp, &val);
	put_key(&w, 0x0A, val); /* Checkpoint.value */
	put_key(&w, 0x0A, strlen(r->tag));
	flx_jw_raw(&w, r->tag, strlen(r->tag));
	put_key(&w, 0x12, tp); /* Value.tensor */
	for (int d = 0; d < t->ndim; d++)
		put_key(&w, 0x08, (uint64_t)box->size[d]);
	put_key(&w, 0x12, strlen(type));
	flx_jw_raw(&w, type, strlen(type));
	put_key(&w, 0x1A, flx_view_bytes(r->part));
	return flx_jw_end(&w, len);
}

static const flx_gen_ops ms_head_ops = {"mindspore ckpt record", ms_head};

/* Where pieces go: counted, and written while there is room. */
typedef struct cut_sink {
	flx_box *out;
	size_t cap, n;
} cut_sink;

static void emit(cut_sink *s, const flx_box *b)
{
	if (s->out && s->n < s->cap)
		s->out[s->n] = *b;
	s->n++;
}

/* Cut b, whose axes before a are 1 long. */
static void cut(cut_sink *s, const flx_box *b, int ndim, int a, uint64_t esize,
		uint64_t max)
{
	uint64_t row = esize;

	while (a < ndim && b->size[a] == 1)
		a++;
	if (a == ndim) {
		emit(s, b);
		return;
	}
	for (int d = a + 1; d < ndim; d++)
		row *= (uint64_t)b->size[d];
	if (row * (uint64_t)b->size[a] <= max || row == 0) {
		emit(s, b);
		return;
	}
	for (int64_t i = 0; i < b->size[a];) {
		int64_t k = row <= max ? (int64_t)(max / row) : 1;
		flx_box sub = *b;

		if (k > b->size[a] - i)
			k = b->size[a] - i;
		sub.off[a] += i;
		sub.size[a] = k;
		if (row <= max)
			emit(s, &sub);
		else
			cut(s, &sub, ndim, a + 1, esize, max);
		i += k;
	}
}

int flx_ms_cuts(const flx_box *box, int ndim, uint64_t esize, uint64_t max,
		flx_box *out, size_t cap, size_t *n)
{
	cut_sink s = {.out = out, .cap = cap};

	cut(&s, box, ndim, 0, esize, max);
	*n = s.n;
	return out && s.n > cap ? -ENOSPC : 0;
}

int flx_ms_check(const flx_ms_param *p, size_t n, size_t *bad)
{
	for (size_t k = 0; k < n; k++) {
		if (!flx_pk_utf8_ok(p[k].tag)) {
			*bad = k;
			return -EINVAL;
		}
		if (!flx_ms_type(flx_view_tensor(p[k].v)->dtype)) {
			*bad = k;
			return -ENOTSUP;
		}
	}
	return 0;
}

/* The pieces of parameter p as records from f->r[f->n] on (room made by
 * the caller: cuts counted). */
static int add_pieces(flx_fs *fs, const flx_ckpt *ckpt, ms_file *f,
		      const flx_ms_param *p, const flx_box *cuts, size_t nc)
{
	const flx_tensor *t = flx_view_tensor(p->v);
	flx_error err = {0};
	int rc = 0;

	for (size_t k = 0; !rc && k < nc; k++) {
		flx_view *v;

		rc = flx_view_new(ckpt, t, &cuts[k], &v, &err);
		if (!rc)
			rc = flx_fs_own_view(fs, v);
		if (!rc)
			f->r[f->n++] = (ms_rec){p->tag, p->v, v};
	}
	return rc;
}

/* A tensor of no elements: MindSpore >= 2.3 writes no record for it (1.4:
 * its chunk loop runs zero times); the loader keeps the network's value.
 * (An empty box of a tensor that has elements, from an uneven tp= split,
 * keeps its record: MindSpore has no such split to compare with.) */
static bool no_elements(const flx_tensor *t)
{
	for (int d = 0; d < t->ndim; d++)
		if (t->shape[d] == 0)
			return true;
	return false;
}

int flx_ms_add_file(flx_fs *fs, const flx_ckpt *ckpt, int dir, const char *name,
		    const flx_ms_param *p, size_t n, uint64_t max)
{
	ms_file *f = flx_fs_alloc(fs, sizeof(*f));
	flx_box *cuts = NULL;
	size_t nrec = 0, nc;
	int file, rc = -ENOMEM;

	if (!f)
		goto out;
	for (size_t k = 0; k < n; k++) {
		const flx_tensor *t = flx_view_tensor(p[k].v);

		if (no_elements(t))
			continue;
		flx_ms_cuts(flx_view_box(p[k].v), t->ndim,
			    flx_dtype_size(t->dtype), max, NULL, 0, &nc);
		nrec += nc;
	}
	if (nrec > UINT32_MAX) {
		rc = -EFBIG;
		goto out;
	}
	f->r = flx_fs_alloc(fs, nrec * sizeof(*f->r) + 1);
	if (!f->r)
		goto out;
	rc = 0;
	for (size_t k = 0; k < n; k++) {
		const flx_tensor *t = flx_view_tensor(p[k].v);
		const flx_box *box = flx_view_box(p[k].v);
		uint64_t es = flx_dtype_size(t->dtype);

		if (no_elements(t))
			continue;
		flx_ms_cuts(box, t->ndim, es, max, NULL, 0, &nc);
		if (nc == 1) {
			f->r[f->n++] = (ms_rec){p[k].tag, p[k].v, p[k].v};
			continue;
		}
		free(cuts);
		cuts = malloc(nc * sizeof(*cuts));
		if (!cuts) {
			rc = -ENOMEM;
			goto out;
		}
		flx_ms_cuts(box, t->ndim, es, max, cuts, nc, &nc);
		rc = add_pieces(fs, ckpt, f, &p[k], cuts, nc);
		if (rc)
			goto out;
	}
	rc = flx_fs_mkfile(fs, dir, name, &file);
	for (size_t k = 0; !rc && k < f->n; k++) {
		rc = flx_fs_add_gen(fs, file, &ms_head_ops, f, (uint32_t)k);
		if (!rc)
			rc = flx_fs_add_view(fs, file, f->r[k].part, NULL);
	}
out:
	free(cuts);
	return rc;
}
