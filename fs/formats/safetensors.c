/* SPDX-License-Identifier: MIT */
/*
 * safetensors files; see safetensors.h.  The header is cut into pieces
 * that are generated alone: the head (length prefix, __metadata__, and
 * in a rank's file the start of the "flexfs" metadata), the metadata's
 * tensors by batches, the metadata's end, the tensor entries by batches,
 * and the closing brace with its padding.
 */
#include "safetensors.h"

#include "compat.h"
#include "json_internal.h"
#include "names.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* A safetensors file (owned by the fs). */
typedef struct st_file {
	const flx_gen_ctx *ctx;
	int tp, pp; /* see flx_st_add_file() */
	const flx_st_set *set;
	uint64_t *boff; /* data offset of each FLX_GEN_BATCH-th entry in
			 * data order (from the end of the header) */
	uint64_t hlen;	/* the header's length prefix: JSON + padding */
	uint64_t pad;	/* spaces after the closing brace */
} st_file;

/* Checked against safetensors 0.4.5 (Debian's python3-safetensors): its
 * Dtype enum (safetensors/src/tensor.rs) parses BOOL, U8, I8, F8_E5M2,
 * F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 and refuses
 * a header naming any other ("InvalidHeaderDeserialization": the whole
 * file).  C64 came with safetensors 0.7 (pull request #660), the FNUZ
 * float8 names later still; complex128 it never names.
 * docs/formats/hf-safetensors.md#dtypes-older-readers-cannot-read */
const flx_fmt_dtypes flx_st_dtypes = {
    .name = "safetensors",
    .older =
	{
	    [FLX_DT_C64] = "safetensors before 0.7 (0.4.5) cannot read C64",
	    [FLX_DT_F8_E4M3FNUZ] = "safetensors 0.4.5 cannot read F8_E4M3FNUZ",
	    [FLX_DT_F8_E5M2FNUZ] = "safetensors 0.4.5 cannot read F8_E5M2FNUZ",
	},
    .never =
	{
	    [FLX_DT_C128] = "safetensors has no complex128 dtype",
	},
};

/* The view entry e stands for in file f. */
static const flx_view *st_view(const st_file *f, const flx_st_entry *e)
{
	return f->pp < 0 ? e->pl->whole
			 : flx_placement_view(e->pl, f->pp, f->tp,
					      f->ctx->plan->spec->tp);
}

/* A writer of a header piece of f: compact and ASCII, as the
 * safetensors writers dump it. */
static flx_jw st_writer(const st_file *f, unsigned char *dst, uint64_t lo,
			uint64_t hi)
{
	flx_jw w = flx_jw_window(dst, lo, hi);

	w.ascii = true;
	w.plain_names = f->ctx->plain_names;
	return w;
}

/* The length prefix, __metadata__, and in a rank's file the "flexfs"
 * metadata (a compact JSON text as a string value) up to its tensors. */
static int st_head(const void *arg, uint32_t idx, unsigned char *dst,
		   uint64_t lo, uint64_t hi, uint64_t *len)
{
	const st_file *f = arg;
	const flx_spec *s = f->ctx->plan->spec;
	flx_jw w = st_writer(f, dst, lo, hi);
	unsigned char prefix[8];

	(void)idx;
	for (int i = 0; i < 8; i++)
		prefix[i] = (unsigned char)(f->hlen >> (8 * i));
	flx_jw_raw(&w, prefix, 8);
	flx_jw_open(&w, '{');
	flx_jw_key(&w, "__metadata__");
	flx_jw_open(&w, '{');
	flx_jw_key(&w, "format");
	flx_jw_str(&w, "pt");
	if (f->pp < 0) {
		flx_jw_close(&w, '}');
		return flx_jw_end(&w, len);
	}
	flx_jw_key(&w, "flexfs");
	flx_jw_quote(&w);
	w.quoted = true;
	w.ascii = false;
	flx_jw_open(&w, '{');
	flx_jw_key(&w, "tp");
	flx_jw_int(&w, s->tp);
	flx_jw_key(&w, "pp");
	flx_jw_int(&w, s->pp);
	flx_jw_key(&w, "rank");
	flx_jw_open(&w, '{');
	flx_jw_key(&w, "tp");
	flx_jw_int(&w, f->tp);
	flx_jw_key(&w, "pp");
	flx_jw_int(&w, f->pp);
	flx_jw_close(&w, '}');
	flx_jw_key(&w, "tensors");
	flx_jw_open(&w, '{');
	return flx_jw_end(&w, len);
}

/*
 * The fast writer of the per-tensor text.  A header of a rank file made of
 * small tensors is mostly this text (about 200 bytes a tensor), generated
 * again on every read of it; the JSON writer's call per token and window
 * test per byte run cost 7 ns a byte there (docs/performance-history.md,
 * "Scale: small items, second round").  With plain names (flx_gen_ctx),
 * nothing in an entry needs an escape, so its bytes are written with
 * memcpy and flx_fmt_int into a stage on the stack and go to the window a
 * stage at a time.  Other names, and an entry whose bound does not fit an
 * empty stage, go through the JSON writer, which writes the same bytes
 * (tests/unit/test_formats.c checks both against jansson).
 */
#define ST_STAGE 4096

typedef struct st_stage {
	size_t n;
	char b[ST_STAGE];
} st_stage;

/* The most bytes an entry naming name and fqn (NULL: none) with ndim
 * dimensions can take in either piece: its two names, three arrays of
 * ndim integers of at most 20 characters and their separators, the
 * escaped quotes and keys around them. */
static size_t st_bound(const char *name, const char *fqn, int ndim)
{
	return strlen(name) + (fqn ? strlen(fqn) : 0) +
	       3 * (size_t)(ndim + 1) * 21 + 256;
}

static void st_flush(flx_jw *w, st_stage *s)
{
	flx_jw_raw(w, s->b, s->n);
	s->n = 0;
}

/* Room for bound bytes in s, flushed to w if need be; false when an
 * entry that large must go through the JSON writer. */
static bool st_room(flx_jw *w, st_stage *s, size_t bound)
{
	if (bound > sizeof(s->b)) {
		st_flush(w, s);
		return false;
	}
	if (s->n + bound > sizeof(s->b))
		st_flush(w, s);
	return true;
}

static char *st_put(char *p, const char *s, size_t n)
{
	memcpy(p, s, n);
	return p + n;
}

/* A literal, without its NUL. */
#define ST_LIT(p, s) st_put(p, s, sizeof(s) - 1)

/* An array of n integers, compact, as flx_jw_ints() writes it. */
static char *st_ints(char *p, int n, const int64_t *v)
{
	*p++ = '[';
	for (int i = 0; i < n; i++) {
		if (i)
			*p++ = ',';
		p += flx_fmt_int(p, v[i], 1);
	}
	*p++ = ']';
	return p;
}

/* The separator before a member of the container w is in, as
 * flx_jw_item() writes it compact. */
static char *st_item(flx_jw *w, char *p)
{
	if (w->has >> w->depth & 1)
		*p++ = ',';
	w->has |= 1ull << w->depth;
	return p;
}

/* Entry e's member of the "flexfs" metadata's tensors, through the JSON
 * writer. */
static void st_meta_jw(flx_jw *w, const flx_st_entry *e, const flx_box *part)
{
	const flx_tensor *t = e->pl->src;

	flx_jw_key_name(w, e->name);
	flx_jw_open(w, '{');
	flx_jw_key(w, "source");
	flx_jw_name(w, t->fqn);
	flx_jw_key(w, "global_shape");
	flx_jw_ints(w, t->ndim, t->shape);
	flx_jw_key(w, "global_offset");
	flx_jw_ints(w, t->ndim, part->off);
	flx_jw_key(w, "split_axis");
	flx_jw_int_or_null(w, e->pl->split);
	if (e->pl->groups > 1) {
		flx_jw_key(w, "split_groups");
		flx_jw_int(w, e->pl->groups);
	}
	flx_jw_close(w, '}');
}

/* The same bytes into s (room made by st_room()): inside the quoted
 * metadata, every quote escaped. */
static void st_meta_fast(flx_jw *w, st_stage *s, const flx_st_entry *e,
			 const flx_box *part)
{
	const flx_tensor *t = e->pl->src;
	char *p = st_item(w, s->b + s->n);

	p = ST_LIT(p, "\\\"");
	p = st_put(p, e->name, strlen(e->name));
	p = ST_LIT(p, "\\\":{\\\"source\\\":\\\"");
	p = st_put(p, t->fqn, strlen(t->fqn));
	p = ST_LIT(p, "\\\",\\\"global_shape\\\":");
	p = st_ints(p, t->ndim, t->shape);
	p = ST_LIT(p, ",\\\"global_offset\\\":");
	p = st_ints(p, t->ndim, part->off);
	p = ST_LIT(p, ",\\\"split_axis\\\":");
	if (e->pl->split < 0)
		p = ST_LIT(p, "null");
	else
		p += flx_fmt_int(p, e->pl->split, 1);
	if (e->pl->groups > 1) {
		p = ST_LIT(p, ",\\\"split_groups\\\":");
		p += flx_fmt_int(p, e->pl->groups, 1);
	}
	*p++ = '}';
	s->n = (size_t)(p - s->b);
}

/* The metadata's tensors idx.. (a batch, in set order), inside the quoted
 * metadata, whose "tensors" object is at depth 4. */
static int st_meta(const void *arg, uint32_t idx, unsigned char *dst,
		   uint64_t lo, uint64_t hi, uint64_t *len)
{
	const st_file *f = arg;
	flx_jw w = st_writer(f, dst, lo, hi);
	st_stage s;

	s.n = 0;
	w.quoted = true;
	w.ascii = false;
	flx_jw_resume(&w, 4, idx > 0);
	for (size_t i = idx; i < f->set->n && i < idx + FLX_GEN_BATCH; i++) {
		const flx_st_entry *e = &f->set->e[i];
		const flx_tensor *t = e->pl->src;
		flx_box part;

		/* a grouped placement: its first part's offset */
		flx_placement_part(e->pl, flx_view_box(st_view(f, e)), 0,
				   &part);
		if (w.plain_names &&
		    st_room(&w, &s, st_bound(e->name, t->fqn, t->ndim)))
			st_meta_fast(&w, &s, e, &part);
		else
			st_meta_jw(&w, e, &part);
	}
	st_flush(&w, &s);
	return flx_jw_end(&w, len);
}

static int st_meta_end(const void *arg, uint32_t idx, unsigned char *dst,
		       uint64_t lo, uint64_t hi, uint64_t *len)
{
	const st_file *f = arg;
	flx_jw w = st_writer(f, dst, lo, hi);

	(void)idx;
	w.quoted = true;
	w.ascii = false;
	flx_jw_resume(&w, 4, f->set->n > 0);
	flx_jw_close(&w, '}');
	flx_jw_close(&w, '}');
	w.quoted = false;
	w.ascii = true;
	flx_jw_quote(&w);
	flx_jw_close(&w, '}');
	return flx_jw_end(&w, len);
}

/* Entry e (its data at [off, off + its bytes)) through the JSON
 * writer. */
static void st_entry_jw(flx_jw *w, const flx_st_entry *e, const flx_view *v,
			const int64_t offs[2])
{
	const flx_tensor *t = e->pl->src;

	flx_jw_key_name(w, e->name);
	flx_jw_open(w, '{');
	flx_jw_key(w, "dtype");
	flx_jw_str(w, flx_dtype_get(t->dtype)->safetensors);
	flx_jw_key(w, "shape");
	flx_jw_ints(w, t->ndim, flx_view_box(v)->size);
	flx_jw_key(w, "data_offsets");
	flx_jw_ints(w, 2, offs);
	flx_jw_close(w, '}');
}

/* The same bytes into s (room made by st_room()); the dtype's name is
 * one of the fixed table's, plain. */
static void st_entry_fast(flx_jw *w, st_stage *s, const flx_st_entry *e,
			  const char *dtype, const flx_view *v,
			  const int64_t offs[2])
{
	char *p = st_item(w, s->b + s->n);

	*p++ = '"';
	p = st_put(p, e->name, strlen(e->name));
	p = ST_LIT(p, "\":{\"dtype\":\"");
	p = st_put(p, dtype, strlen(dtype));
	p = ST_LIT(p, "\",\"shape\":");
	p = st_ints(p, e->pl->src->ndim, flx_view_box(v)->size);
	p = ST_LIT(p, ",\"data_offsets\":");
	p = st_ints(p, 2, offs);
	*p++ = '}';
	s->n = (size_t)(p - s->b);
}

/* Tensor entries idx.. in data order (a batch), at depth 1 after
 * __metadata__. */
static int st_entries(const void *arg, uint32_t idx, unsigned char *dst,
		      uint64_t lo, uint64_t hi, uint64_t *len)
{
	const st_file *f = arg;
	flx_jw w = st_writer(f, dst, lo, hi);
	uint64_t off = f->boff[idx / FLX_GEN_BATCH];
	st_stage s;

	s.n = 0;
	flx_jw_resume(&w, 1, true);
	for (size_t i = idx; i < f->set->n && i < idx + FLX_GEN_BATCH; i++) {
		const flx_st_entry *e = &f->set->e[f->set->order[i]];
		const flx_view *v = st_view(f, e);
		const flx_tensor *t = e->pl->src;
		const char *dtype = flx_dtype_get(t->dtype)->safetensors;
		int64_t offs[2] = {(int64_t)off,
				   (int64_t)(off + flx_view_bytes(v))};

		if (w.plain_names && dtype &&
		    st_room(&w, &s, st_bound(e->name, dtype, t->ndim)))
			st_entry_fast(&w, &s, e, dtype, v, offs);
		else
			st_entry_jw(&w, e, v, offs);
		off += flx_view_bytes(v);
	}
	st_flush(&w, &s);
	return flx_jw_end(&w, len);
}

/* The closing brace and the spaces that align the data to 64 bytes. */
static int st_end(const void *arg, uint32_t idx, unsigned char *dst,
		  uint64_t lo, uint64_t hi, uint64_t *len)
{
	const st_file *f = arg;
	flx_jw w = st_writer(f, dst, lo, hi);

	(void)idx;
	flx_jw_raw(&w, "}", 1);
	flx_jw_spaces(&w, f->pad);
	return flx_jw_end(&w, len);
}

static const flx_gen_ops st_head_ops = {"safetensors head", st_head};
static const flx_gen_ops st_meta_ops = {"safetensors metadata", st_meta};
static const flx_gen_ops st_meta_end_ops = {"safetensors metadata end",
					    st_meta_end};
static const flx_gen_ops st_entries_ops = {"safetensors entries", st_entries};
static const flx_gen_ops st_end_ops = {"safetensors end", st_end};

flx_st_entry flx_st_entry_of(const char *name, const flx_placement *pl)
{
	return (flx_st_entry){
	    .name = name, .pl = pl, .esz = flx_dtype_size(pl->src->dtype)};
}

int flx_st_set_new(flx_fs *fs, size_t n, flx_st_set **out)
{
	flx_st_set *s = flx_fs_alloc(
	    fs, sizeof(*s) + n * (sizeof(flx_st_entry) + sizeof(uint32_t)));

	if (!s)
		return -ENOMEM;
	s->e = (flx_st_entry *)(s + 1);
	s->order = (uint32_t *)(s->e + n);
	*out = s;
	return 0;
}

static int cmp_entry(const void *pa, const void *pb, void *arg)
{
	const flx_st_set *s = arg;
	const flx_st_entry *a = &s->e[*(const uint32_t *)pa];
	const flx_st_entry *b = &s->e[*(const uint32_t *)pb];

	if (a->esz != b->esz)
		return a->esz > b->esz ? -1 : 1;
	return strcmp(a->name, b->name);
}

void flx_st_sort(flx_st_set *s)
{
	for (size_t i = 0; i < s->n; i++)
		s->order[i] = (uint32_t)i;
	if (s->n > 1)
		qsort_r(s->order, s->n, sizeof(*s->order), cmp_entry, s);
}

/* Fill f->boff from its set's data order. */
static void st_offsets(st_file *f)
{
	const flx_st_set *s = f->set;
	uint64_t off = 0;

	for (size_t i = 0; i < s->n; i++) {
		if (i % FLX_GEN_BATCH == 0)
			f->boff[i / FLX_GEN_BATCH] = off;
		off += flx_view_bytes(st_view(f, &s->e[s->order[i]]));
	}
}

/*
 * The header's pieces, then the tensors in data order.  The length
 * prefix counts the JSON and the spaces after it; the head is measured
 * before the prefix is known, its 8 bytes being 8 whatever their value.
 */
int flx_st_add_file(flx_fs *fs, int dir, const char *name,
		    const flx_gen_ctx *ctx, const flx_st_set *set, int tp,
		    int pp)
{
	st_file *f = flx_fs_alloc(fs, sizeof(*f));
	uint64_t text, total;
	int file, rc = -ENOMEM;

	if (!f)
		goto out;
	*f = (st_file){.ctx = ctx, .tp = tp, .pp = pp, .set = set};
	f->boff =
	    flx_fs_alloc(fs, (set->n / FLX_GEN_BATCH + 1) * sizeof(uint64_t));
	if (!f->boff)
		goto out;
	st_offsets(f);
	rc = flx_fs_mkfile(fs, dir, name, &file);
	if (!rc)
		rc = flx_fs_add_gen(fs, file, &st_head_ops, f, 0);
	for (size_t k = 0; !rc && pp >= 0 && k < set->n; k += FLX_GEN_BATCH)
		rc = flx_fs_add_gen(fs, file, &st_meta_ops, f, (uint32_t)k);
	if (!rc && pp >= 0)
		rc = flx_fs_add_gen(fs, file, &st_meta_end_ops, f, 0);
	for (size_t k = 0; !rc && k < set->n; k += FLX_GEN_BATCH)
		rc = flx_fs_add_gen(fs, file, &st_entries_ops, f, (uint32_t)k);
	if (rc)
		goto out;
	/* the closing brace, then spaces to a multiple of 64 */
	text = flx_fs_file_size(fs, file) - 8 + 1;
	total = (8 + text + 63) & ~(uint64_t)63;
	f->hlen = total - 8;
	f->pad = total - 8 - text;
	rc = flx_fs_add_gen(fs, file, &st_end_ops, f, 0);
	for (size_t i = 0; !rc && i < set->n; i++)
		rc = flx_fs_add_view(fs, file,
				     st_view(f, &set->e[set->order[i]]), NULL);
out:
	return rc;
}
