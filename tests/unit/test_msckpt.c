/* SPDX-License-Identifier: MIT */
/*
 * MindSpore .ckpt files (fs/formats/msckpt.h): varints at every length
 * boundary against their definition (7 bits a byte, high bit set but on
 * the last), the tensor_type names, the cuts of large parameters (pieces
 * consecutive in C order, covering the box once, none over the limit
 * where a row fits), and whole files of tests/fixtures/dcp-t113 at tp=2
 * built with a small record limit: the file's size is exactly its bytes,
 * and a protobuf wire decoder written here (any field order, skipping by
 * wire type, as load_checkpoint's parser) finds each parameter as
 * consecutive records of its tag with full dims and tensor_type, whose
 * contents joined are the view's bytes read directly.
 */
#include "check.h"
#include "formats/compat.h"
#include "formats/msckpt.h"
#include "plan.h"
#include "spec.h"
#include "tree.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void test_varint(void)
{
	static const struct {
		uint64_t v;
		size_t n;
	} cases[] = {
	    {0, 1},
	    {1, 1},
	    {127, 1},
	    {128, 2},
	    {16383, 2},
	    {16384, 3},
	    {(1ull << 21) - 1, 3},
	    {1ull << 21, 4},
	    {(1ull << 28) - 1, 4},
	    {1ull << 28, 5},
	    {(1ull << 35) - 1, 5},
	    {1ull << 35, 6},
	    {(1ull << 56) - 1, 8},
	    {1ull << 56, 9},
	    {(1ull << 63) - 1, 9},
	    {1ull << 63, 10},
	    {UINT64_MAX, 10},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		unsigned char b[FLX_MS_VARINT_MAX];
		size_t n = flx_ms_varint(cases[i].v, b);
		uint64_t back = 0;

		CHECK_EQ(n, cases[i].n);
		for (size_t k = 0; k < n; k++) {
			CHECK_EQ((b[k] & 0x80) != 0, k + 1 < n);
			back |= (uint64_t)(b[k] & 0x7f) << (7 * k);
		}
		CHECK_EQ(back, cases[i].v);
	}
}

static void test_types(void)
{
	/* the 13 names of docs/formats/mindspore.md#tensor-types's table */
	static const struct {
		flx_dtype dt;
		const char *name;
	} t[] = {{FLX_DT_BOOL, "Bool"},	   {FLX_DT_I8, "Int8"},
		 {FLX_DT_U8, "UInt8"},	   {FLX_DT_I16, "Int16"},
		 {FLX_DT_U16, "UInt16"},   {FLX_DT_I32, "Int32"},
		 {FLX_DT_U32, "UInt32"},   {FLX_DT_I64, "Int64"},
		 {FLX_DT_U64, "UInt64"},   {FLX_DT_F16, "Float16"},
		 {FLX_DT_F32, "Float32"},  {FLX_DT_F64, "Float64"},
		 {FLX_DT_BF16, "BFloat16"}};
	const char bad[] = {'w', (char)0xff, 0};
	flx_ms_param p = {bad, NULL};
	size_t k = 99;

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		CHECK_STR(flx_ms_type(t[i].dt), t[i].name);
	/* a tag that is not UTF-8 cannot be a protobuf string */
	CHECK_EQ(flx_ms_check(&p, 1, &k), -EINVAL);
	CHECK_EQ(k, 0);
	CHECK(flx_ms_type(FLX_DT_C64) == NULL);
	CHECK(flx_ms_type(FLX_DT_F8_E4M3FN) == NULL);
	CHECK(flx_ms_type(FLX_DT_INVALID) == NULL);
	/* the .ckpt row of the format x dtype table leaves out exactly the
	 * dtypes without a tensor_type, so no file is refused at mount */
	for (int dt = 1; dt < FLX_DT_COUNT; dt++)
		CHECK((flx_ms_type((flx_dtype)dt) == NULL) ==
		      (flx_ms_dtypes.never[dt] != NULL));
}

/* C-order index of coordinate c in box b (ndim axes). */
static int64_t lin(const flx_box *b, int ndim, const int64_t *c)
{
	int64_t i = 0;

	for (int d = 0; d < ndim; d++)
		i = i * b->size[d] + (c[d] - b->off[d]);
	return i;
}

/* The cuts of box are consecutive C-order pieces covering it once, each
 * of at most max bytes (every slice of one element fits max). */
static void check_cuts(const flx_box *box, int ndim, uint64_t es, uint64_t max,
		       size_t want_n)
{
	size_t n, n2;
	flx_box *c;
	int64_t next = 0, total = 1;

	CHECK_EQ(flx_ms_cuts(box, ndim, es, max, NULL, 0, &n), 0);
	CHECK_EQ(n, want_n);
	c = calloc(n, sizeof(*c));
	CHECK_EQ(flx_ms_cuts(box, ndim, es, max, c, n, &n2), 0);
	CHECK_EQ(n2, n);
	if (n > 1)
		CHECK_EQ(flx_ms_cuts(box, ndim, es, max, c, n - 1, &n2),
			 -ENOSPC);
	for (int d = 0; d < ndim; d++)
		total *= box->size[d];
	for (size_t k = 0; k < n; k++) {
		int64_t cnt = 1, at[FLX_MAX_DIMS];

		for (int d = 0; d < ndim; d++) {
			cnt *= c[k].size[d];
			at[d] = c[k].off[d];
			CHECK(c[k].off[d] >= box->off[d]);
			CHECK(c[k].off[d] + c[k].size[d] <=
			      box->off[d] + box->size[d]);
		}
		if (n > 1)
			CHECK((uint64_t)cnt * es <= max);
		/* first element continues the previous piece; a piece
		 * spans a contiguous run */
		CHECK_EQ(lin(box, ndim, at), next);
		next += cnt;
	}
	CHECK_EQ(next, total);
	free(c);
}

static void test_cuts(void)
{
	flx_box b = {.off = {3, 0}, .size = {5, 7}};
	flx_box c = {.off = {0, 2, 0}, .size = {1, 3, 10}};
	flx_box z = {.off = {0, 0}, .size = {0, 9}};
	flx_box s = {0};

	check_cuts(&b, 2, 4, 1000, 1); /* fits */
	check_cuts(&b, 2, 4, 140, 1);  /* exactly */
	check_cuts(&b, 2, 4, 28, 5);   /* one row each */
	check_cuts(&b, 2, 4, 60, 3);   /* 2, 2, 1 rows */
	check_cuts(&c, 3, 4, 16, 9);   /* rows too long: 4, 4, 2 each */
	check_cuts(&c, 3, 4, 40, 3);   /* one row each, axis 0 skipped */
	check_cuts(&z, 2, 2, 4, 1);    /* empty: one record */
	check_cuts(&s, 0, 8, 8, 1);    /* 0-d */
}

/* ---- whole files, read back through a wire decoder ---- */

typedef struct rd {
	const unsigned char *p, *end;
	int bad;
} rd;

static uint64_t varint(rd *r)
{
	uint64_t v = 0;

	for (int s = 0; s < 70; s += 7) {
		if (r->p >= r->end) {
			r->bad = 1;
			return 0;
		}
		v |= (uint64_t)(*r->p & 0x7f) << s;
		if (!(*r->p++ & 0x80))
			return v;
	}
	r->bad = 1;
	return 0;
}

/* A LEN field's body as a sub-reader. */
static rd sub(rd *r)
{
	uint64_t n = varint(r);
	rd s = {r->p, r->p + n, 0};

	if (r->bad || n > (uint64_t)(r->end - r->p)) {
		r->bad = 1;
		s.end = s.p;
	} else
		r->p += n;
	return s;
}

typedef struct rec {
	char tag[256], type[32];
	int ndims;
	int64_t dims[FLX_MAX_DIMS];
	const unsigned char *content;
	uint64_t clen;
} rec;

static void parse_tensor(rd t, rec *o)
{
	while (t.p < t.end && !t.bad) {
		uint64_t key = varint(&t);
		rd s;

		if (key == 0x08 && o->ndims < FLX_MAX_DIMS)
			o->dims[o->ndims++] = (int64_t)varint(&t);
		else if (key == 0x12 || key == 0x1A) {
			s = sub(&t);
			if (key == 0x12)
				snprintf(o->type, sizeof(o->type), "%.*s",
					 (int)(s.end - s.p), s.p);
			else {
				o->content = s.p;
				o->clen = (uint64_t)(s.end - s.p);
			}
		} else
			t.bad = 1;
	}
	CHECK(!t.bad);
}

/* The records of a file. */
static size_t parse_file(const unsigned char *b, size_t n, rec *out, size_t cap)
{
	rd r = {b, b + n, 0};
	size_t k = 0;

	while (r.p < r.end && !r.bad && k < cap) {
		rd v;

		CHECK_EQ(varint(&r), 0x0A);
		v = sub(&r);
		memset(&out[k], 0, sizeof(out[k]));
		while (v.p < v.end && !v.bad) {
			uint64_t key = varint(&v);
			rd s = sub(&v);

			if (key == 0x0A)
				snprintf(out[k].tag, sizeof(out[k].tag), "%.*s",
					 (int)(s.end - s.p), s.p);
			else if (key == 0x12)
				parse_tensor(s, &out[k]);
			else
				v.bad = 1;
		}
		CHECK(!v.bad);
		k++;
	}
	CHECK(!r.bad);
	CHECK(r.p == r.end);
	return k;
}

static void test_file(uint64_t max, int tp)
{
	flx_spec s;
	flx_ckpt *c = NULL;
	flx_plan *p = NULL;
	flx_fs *fs = NULL;
	flx_error err = {0};
	flx_ms_param *e;
	const char *dup = NULL;
	int dir;
	flx_stat st;
	unsigned char *buf;
	rec *recs;
	size_t n = 0, nr, k = 0;
	char tps[8];

	snprintf(tps, sizeof(tps), "%d", tp);
	CHECK_EQ(flx_spec_init(&s), 0);
	CHECK_EQ(flx_spec_set(&s, "tp", tps, &err), 0);
	CHECK_EQ(flx_spec_set(&s, "rules", "fixtures/rules.json", &err), 0);
	CHECK_EQ(flx_ckpt_open("fixtures/dcp-t113/ckpt", &c, &err), 0);
	CHECK_EQ(flx_plan_build(c, &s, &p, &err), 0);
	e = calloc(p->n, sizeof(*e));
	for (size_t i = 0; i < p->n; i++)
		e[n++] =
		    (flx_ms_param){flx_placement_name(&p->p[i], 0),
				   flx_placement_view(&p->p[i], 0, tp - 1, tp)};
	CHECK_EQ(flx_ms_check(e, n, &k), 0);
	CHECK_EQ(flx_fs_new(c, &fs), 0);
	CHECK_EQ(flx_fs_mkdir(fs, 0, "d", &dir), 0);
	CHECK_EQ(flx_ms_add_file(fs, c, dir, "x.ckpt", e, n, max), 0);
	CHECK_EQ(flx_fs_finish(fs, &dup), 0);
	CHECK_EQ(flx_fs_resolve(fs, "d/x.ckpt", &st), 0);
	/* one byte past the end is not there: the size is exact */
	buf = malloc(st.size + 1);
	CHECK_EQ(flx_fs_read(fs, st.ino, buf, st.size + 1, 0, NULL),
		 (ssize_t)st.size);
	recs = calloc(4096, sizeof(*recs));
	nr = parse_file(buf, st.size, recs, 4096);
	k = 0;
	for (size_t i = 0; i < n; i++) {
		const flx_view *v = e[i].v;
		const flx_tensor *t = flx_view_tensor(v);
		uint64_t nb = flx_view_bytes(v), got = 0;
		unsigned char *want = malloc(nb + 1);

		CHECK_EQ(flx_view_read(v, want, nb, 0, NULL), (ssize_t)nb);
		do {
			CHECK(k < nr);
			CHECK_STR(recs[k].tag, e[i].tag);
			CHECK_STR(recs[k].type, flx_ms_type(t->dtype));
			CHECK_EQ(recs[k].ndims, t->ndim);
			for (int d = 0; d < t->ndim; d++)
				CHECK_EQ(recs[k].dims[d],
					 flx_view_box(v)->size[d]);
			CHECK(recs[k].clen <= max || max < 8);
			CHECK(got + recs[k].clen <= nb);
			CHECK(
			    !memcmp(recs[k].content, want + got, recs[k].clen));
			got += recs[k].clen;
			k++;
		} while (got < nb);
		free(want);
	}
	CHECK_EQ(k, nr);
	free(recs);
	free(buf);
	free(e);
	flx_fs_free(fs);
	flx_plan_free(p);
	flx_ckpt_close(c);
	flx_spec_release(&s);
}

int main(void)
{
	test_varint();
	test_types();
	test_cuts();
	test_file(FLX_MS_CHUNK, 2); /* one record a parameter */
	test_file(64, 2);	    /* most cut in pieces */
	test_file(200, 1);
	return CHECK_RESULT();
}
