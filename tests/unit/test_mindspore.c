/* SPDX-License-Identifier: MIT */
/* The MindSpore .ckpt reader (resolver/mindspore/mindspore.c) on the byte
 * strings of docs/formats/mindspore.md#byte-examples, whose offsets the
 * spec's tables give, and on byte strings written here by the spec's wire
 * rules (docs/formats/mindspore.md#ckpt-schema, docs/formats/mindspore.md#dims,
 * docs/formats/mindspore.md#file-names): each file is the one rank of a scratch
 * directory, opened as a mount opens it; the chunks must point at the
 * documented tensor_content offsets, and the bytes there must be the values. */
#include "check.h"
#include "ckpt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

/* to := a copy of from (both paths); aborts when either cannot be opened */
static void copy_file(const char *from, const char *to)
{
	char buf[1 << 16];
	FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
	size_t n;

	if (!in || !out)
		abort();
	while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
		fwrite(buf, 1, n, out);
	fclose(in);
	fclose(out);
}

/* dir/m.ckpt := the spec-bytes fixture's file name */
static flx_ckpt *open_one(const char *name, flx_error *e)
{
	char from[256], to[128];
	flx_ckpt *c = NULL;

	snprintf(from, sizeof(from), "fixtures/mindspore-spec-bytes/%s", name);
	snprintf(to, sizeof(to), "%s/m.ckpt", dir);
	copy_file(from, to);
	flx_error_init(e);
	if (flx_ckpt_open(dir, &c, e) < 0)
		return NULL;
	return c;
}

static void test_plain_and_chunked(void)
{
	flx_error e;
	float v[6];
	flx_ckpt *c = open_one("ex5.1-plain.ckpt", &e);
	CHECK(c != NULL);
	if (c) {
		const flx_tensor *t = flx_ckpt_find(c, "w");
		CHECK_STR(c->format, "mindspore");
		CHECK(t != NULL);
		if (t) {
			CHECK_EQ(t->dtype, FLX_DT_F32);
			CHECK_EQ(t->ndim, 2);
			CHECK_EQ(t->shape[0], 2);
			CHECK_EQ(t->shape[1], 3);
			CHECK_EQ(t->nchunks, 1);
			/* docs/formats/mindspore.md#byte-examples */
			CHECK_EQ(t->chunks[0].data_off, 22);
			CHECK_EQ(flx_file_pread(c, t->chunks[0].file, v, 24,
						t->chunks[0].data_off),
				 0);
			for (int i = 0; i < 6; i++)
				CHECK(v[i] == (float)(i + 1));
		}
		flx_ckpt_close(c);
	}
	/* docs/formats/mindspore.md#byte-examples chunked: two Values of 12
	 * bytes, contents at 22 and 56 */
	c = open_one("ex5.2-chunked.ckpt", &e);
	CHECK(c != NULL);
	if (c) {
		const flx_tensor *t = flx_ckpt_find(c, "w");
		CHECK(t && t->nchunks == 2);
		if (t && t->nchunks == 2) {
			CHECK_EQ(t->chunks[0].data_off, 22);
			CHECK_EQ(t->chunks[0].off[0], 0);
			CHECK_EQ(t->chunks[0].size[0], 1);
			CHECK_EQ(t->chunks[1].data_off, 56);
			CHECK_EQ(t->chunks[1].off[0], 1);
			CHECK_EQ(t->chunks[1].size[1], 3);
		}
		flx_ckpt_close(c);
	}
	/* docs/formats/mindspore.md#byte-examples CRC trailer: verified,
	 * stripped; the tensor as in docs/formats/mindspore.md#byte-examples */
	c = open_one("ex5.2-crc.ckpt", &e);
	CHECK(c != NULL);
	if (c) {
		const flx_tensor *t = flx_ckpt_find(c, "w");
		CHECK(t && t->nchunks == 1 && t->chunks[0].data_off == 22);
		flx_ckpt_close(c);
	}
}

static void test_scalar_str(void)
{
	flx_error e;
	int32_t v = 0;
	flx_ckpt *c = open_one("ex5.2-scalar-str.ckpt", &e);
	CHECK(c != NULL);
	if (!c)
		return;
	const flx_tensor *t = flx_ckpt_find(c, "global_step");
	CHECK(t != NULL);
	if (t) {
		CHECK_EQ(t->ndim, 0);
		CHECK_EQ(t->dtype, FLX_DT_I32);
		CHECK_EQ(flx_file_pread(c, t->chunks[0].file, &v, 4,
					t->chunks[0].data_off),
			 0);
		CHECK_EQ(v, 10);
	}
	CHECK(flx_ckpt_find(c, "note") == NULL); /* str: not served */
	CHECK_EQ(c->ntensors, 1);
	flx_ckpt_close(c);
}

/* Zero-element tensors (docs/formats/mindspore.md#dims) in the mindspore-zero
 * fixture: the <= 2.2 writer's empty records are indexed as DCP indexes a
 * zero-element tensor (one chunk of no bytes per box: [0,4] whole, [8,0] as two
 * [4,0] rows); the >= 2.3 files have no record, and the layout the strategy
 * still has for [8,0] is left out without error. */
static void test_zero_element(void)
{
	const char *fx = "fixtures/mindspore-zero/";
	char d22[128], d23[128], st[128];
	flx_ckpt_opts o = {0};
	flx_opt_vals vals = {0};
	flx_ckpt *c = NULL;
	flx_error e;

	snprintf(d22, sizeof(d22), "%sckpt-legacy22", fx);
	snprintf(d23, sizeof(d23), "%sckpt", fx);
	snprintf(st, sizeof(st), "%sstrategy/ckpt_strategy_rank_0.ckpt", fx);
	CHECK_EQ(flx_ckpt_opt_set(&vals, "src_strategy", st, NULL), 0);
	o.vals = &vals;
	flx_error_init(&e);
	CHECK_EQ(flx_ckpt_open_with(d22, &o, &c, &e), 0);
	if (c) {
		const flx_tensor *b = flx_ckpt_find(c, "model.freqs_cache");
		const flx_tensor *w =
		    flx_ckpt_find(c, "model.layers.0.attention.prefix.weight");
		CHECK(b && b->ndim == 2 && b->shape[0] == 0 &&
		      b->shape[1] == 4 && b->nchunks == 1);
		if (b && b->nchunks == 1)
			CHECK(b->chunks[0].size[0] == 0 &&
			      b->chunks[0].size[1] == 4 &&
			      b->chunks[0].item_len == 0);
		CHECK(w && w->ndim == 2 && w->shape[0] == 8 &&
		      w->shape[1] == 0 && w->nchunks == 2);
		if (w && w->nchunks == 2)
			for (int i = 0; i < 2; i++)
				CHECK(w->chunks[i].size[0] == 4 &&
				      w->chunks[i].size[1] == 0 &&
				      w->chunks[i].off[0] == 4 * i);
		CHECK_EQ(c->ntensors, 23);
		flx_ckpt_close(c);
	}
	c = NULL;
	flx_error_init(&e);
	CHECK_EQ(flx_ckpt_open_with(d23, &o, &c, &e), 0);
	if (c) {
		CHECK(flx_ckpt_find(c, "model.freqs_cache") == NULL);
		CHECK(flx_ckpt_find(c, "model.layers.0.attention.prefix."
				       "weight") == NULL);
		CHECK_EQ(c->ntensors, 21);
		flx_ckpt_close(c);
	}
	flx_opt_vals_release(&vals);
}

/* The chunks' layout in the index (resolver/mindspore/mindspore.c,
 * build_tensor()): per chunk its offsets and sizes only, chunk i's box
 * 2 * ndim numbers past chunk i-1's, and one strides array shared by the
 * chunks in a row that have the same strides.  The tp2dp2 fixture has
 * split, replicated and multi-Value (sub-box) chunks; that the strides
 * read the right bytes, mindspore.bats checks against the truth. */
static void test_chunk_layout(void)
{
	const char *fx = "fixtures/mindspore-tp2dp2/";
	char d[128], st[128];
	flx_ckpt_opts o = {0};
	flx_opt_vals vals = {0};
	flx_ckpt *c = NULL;
	flx_error e;
	uint32_t shared = 0, rows = 0;

	snprintf(d, sizeof(d), "%sckpt", fx);
	snprintf(st, sizeof(st), "%sstrategy/ckpt_strategy_rank_0.ckpt", fx);
	CHECK_EQ(flx_ckpt_opt_set(&vals, "src_strategy", st, NULL), 0);
	o.vals = &vals;
	flx_error_init(&e);
	CHECK_EQ(flx_ckpt_open_with(d, &o, &c, &e), 0);
	for (size_t i = 0; c && i < c->ntensors; i++) {
		const flx_tensor *t = &c->tensors[i];
		size_t nd = (size_t)t->ndim;

		if (!nd)
			continue;
		for (uint32_t k = 0; k < t->nchunks; k++) {
			const flx_chunk *ch = &t->chunks[k];

			CHECK(ch->off == t->chunks[0].off + k * 2 * nd);
			CHECK(ch->size == ch->off + nd);
			CHECK(ch->shared_stride);
			if (k && !memcmp(ch->stride, ch[-1].stride,
					 nd * sizeof(int64_t))) {
				rows++;
				shared += ch->stride == ch[-1].stride;
			}
		}
	}
	CHECK(rows > 100); /* the fixture has many */
	CHECK_EQ(shared, rows);
	flx_ckpt_close(c);
	flx_opt_vals_release(&vals);
}

/* ---- byte strings written here by the spec's wire rules
 * (docs/formats/mindspore.md#ckpt-schema) ---- */

static size_t put_varint(uint8_t *o, uint64_t v)
{
	size_t n = 0;
	while (v >= 0x80) {
		o[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	o[n++] = (uint8_t)v;
	return n;
}

/* field (wire type 2) holding p[0, n) */
static size_t put_len(uint8_t *o, unsigned field, const void *p, size_t n)
{
	size_t k = put_varint(o, field << 3 | 2);
	k += put_varint(o + k, n);
	memcpy(o + k, p, n);
	return k + n;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n)
		abort();
	fclose(f);
}

/* dir/m.ckpt := p[0, n), opened as a mount opens it */
/* The checkpoint of one rank file holding p[0..n): opened, or a failed
 * check with the error printed and NULL. */
static flx_ckpt *open_bytes(const void *p, size_t n)
{
	char to[128];
	flx_ckpt *c = NULL;
	flx_error e;

	snprintf(to, sizeof(to), "%s/m.ckpt", dir);
	write_bytes(to, p, n);
	flx_error_init(&e);
	if (flx_ckpt_open(dir, &c, &e) < 0) {
		CHECK(c != NULL);
		fprintf(stderr, "  %s\n", e.text);
		return NULL;
	}
	return c;
}

/* docs/formats/mindspore.md#tensor-types: each of the 13 tensor_type names
 * load_checkpoint maps, two elements of its size (the spec's table), read as
 * its dtype. */
static void test_all_types(void)
{
	static const struct {
		const char *name;
		flx_dtype dt;
		unsigned size;
	} t[] = {{"Bool", FLX_DT_BOOL, 1},    {"Int8", FLX_DT_I8, 1},
		 {"UInt8", FLX_DT_U8, 1},     {"Int16", FLX_DT_I16, 2},
		 {"UInt16", FLX_DT_U16, 2},   {"Int32", FLX_DT_I32, 4},
		 {"UInt32", FLX_DT_U32, 4},   {"Int64", FLX_DT_I64, 8},
		 {"UInt64", FLX_DT_U64, 8},   {"Float16", FLX_DT_F16, 2},
		 {"Float32", FLX_DT_F32, 4},  {"Float64", FLX_DT_F64, 8},
		 {"BFloat16", FLX_DT_BF16, 2}};
	enum { NT = sizeof(t) / sizeof(t[0]) };
	static uint8_t f[NT * 64];
	size_t nf = 0;
	flx_ckpt *c;

	for (size_t i = 0; i < NT; i++) {
		uint8_t tp[48], v[64], tag[2] = {(uint8_t)('a' + i), 0},
				       data[16] = {0};
		size_t nt = 0, nv;

		tp[nt++] = 0x08; /* dims [2] */
		tp[nt++] = 0x02;
		nt += put_len(tp + nt, 2, t[i].name, strlen(t[i].name));
		nt += put_len(tp + nt, 3, data, 2 * t[i].size);
		nv = put_len(v, 1, tag, 1);
		nv += put_len(v + nv, 2, tp, nt);
		nf += put_len(f + nf, 1, v, nv);
	}
	c = open_bytes(f, nf);
	if (!c)
		return;
	CHECK_EQ(c->ntensors, NT);
	for (size_t i = 0; i < NT; i++) {
		char tag[2] = {(char)('a' + i), 0};
		const flx_tensor *x = flx_ckpt_find(c, tag);
		CHECK(x && x->dtype == t[i].dt && !x->stored && x->ndim == 1 &&
		      x->shape[0] == 2);
	}
	flx_ckpt_close(c);
}

/* docs/formats/mindspore.md#tensor-types + docs/formats/mindspore.md#dims: a
 * <= 2.2 BFloat16 scalar is dims [0] and the float32 that version wrote (4
 * bytes): a 0-d BFloat16 tensor stored as float32. */
static void test_legacy_bf16_scalar(void)
{
	uint8_t t[64], v[96], rec[128], got[4];
	const uint8_t f15[4] = {0x00, 0x00, 0xc0, 0x3f}; /* 1.5f */
	size_t nt = 0, nv, nr;
	flx_ckpt *c;

	t[nt++] = 0x08; /* dims: [0] */
	t[nt++] = 0x00;
	nt += put_len(t + nt, 2, "BFloat16", 8);
	nt += put_len(t + nt, 3, f15, 4);
	nv = put_len(v, 1, "loss_scale", 10);
	nv += put_len(v + nv, 2, t, nt);
	nr = put_len(rec, 1, v, nv);
	c = open_bytes(rec, nr);
	if (!c)
		return;
	const flx_tensor *x = flx_ckpt_find(c, "loss_scale");
	CHECK(x != NULL);
	if (x) {
		CHECK_EQ(x->ndim, 0);
		CHECK_EQ(x->dtype, FLX_DT_BF16);
		CHECK_EQ(x->stored, FLX_DT_F32);
		CHECK_EQ(x->nchunks, 1);
		CHECK_EQ(flx_file_pread(c, x->chunks[0].file, got, 4,
					x->chunks[0].data_off),
			 0);
		CHECK(memcmp(got, f15, 4) == 0);
	}
	flx_ckpt_close(c);
}

/* A tensor saved in two records whose first has another tensor_type and
 * dims (Complex128 [1], then Float32 [4], 8 bytes each: 16 bytes, as the
 * last record's type and dims need) is refused naming the record: only
 * the last record's were read before. */
static void test_records_differ(void)
{
	static const struct {
		const char *type0;
		uint8_t dim0;
	} cases[] = {{"Complex128", 1}, {"Float32", 2}};

	for (size_t k = 0; k < 2; k++) {
		uint8_t t[64], v[96], f[256], data[8] = {0};
		size_t nf = 0, nt, nv;
		char to[128];
		flx_ckpt *c = NULL;
		flx_error e;

		for (int r = 0; r < 2; r++) {
			const char *ty = r ? "Float32" : cases[k].type0;

			nt = 0;
			t[nt++] = 0x08; /* dims: [dim] */
			t[nt++] = r ? 4 : cases[k].dim0;
			nt += put_len(t + nt, 2, ty, strlen(ty));
			nt += put_len(t + nt, 3, data, 8);
			nv = put_len(v, 1, "w", 1);
			nv += put_len(v + nv, 2, t, nt);
			nf += put_len(f + nf, 1, v, nv);
		}
		snprintf(to, sizeof(to), "%s/m.ckpt", dir);
		write_bytes(to, f, nf);
		flx_error_init(&e);
		CHECK(flx_ckpt_open(dir, &c, &e) == -EINVAL);
		CHECK(strstr(e.text, "record 2 of the tensor") &&
		      strstr(e.text, "not one tensor"));
		CHECK(!strcmp(e.key, "w"));
		if (!strstr(e.text, "not one tensor"))
			fprintf(stderr, "  %s\n", e.text);
		flx_ckpt_close(c);
	}
}

/* docs/formats/mindspore.md#ckpt-schema: fields in any order, unknown fields of
 * every wire type skipped, dims packed; a top-level field other than 1 skipped
 * (docs/formats/mindspore.md#ckpt-schema). */
static void test_wire_variants(void)
{
	const float w[6] = {1, 2, 3, 4, 5, 6};
	const uint8_t unk[] = {0x38, 0x05,		 /* 7: varint */
			       0x35, 1,	   2,	 3,   4, /* 6: fixed32 */
			       0x29, 1,	   2,	 3,   4,
			       5,    6,	   7,	 8,	/* 5: fixed64 */
			       0x4a, 0x02, 0xaa, 0xbb}; /* 9: LEN */
	const uint8_t dims[] = {0x02, 0x03};
	uint8_t t[128], v[192], f[256];
	size_t nt = 0, nv = 0, nf = 0;
	flx_ckpt *c;

	nt += put_len(t + nt, 3, w, sizeof(w)); /* content first */
	memcpy(t + nt, unk, sizeof(unk));
	nt += sizeof(unk);
	nt += put_len(t + nt, 2, "Float32", 7);
	nt += put_len(t + nt, 1, dims, sizeof(dims)); /* packed dims */
	nv += put_len(v + nv, 2, t, nt);	      /* tensor before tag */
	v[nv++] = 0x20; /* Value field 4: varint */
	v[nv++] = 0x01;
	nv += put_len(v + nv, 1, "w", 1);
	f[nf++] = 0x10; /* Checkpoint field 2: varint, skipped */
	f[nf++] = 0x07;
	nf += put_len(f + nf, 1, v, nv);
	c = open_bytes(f, nf);
	if (!c)
		return;
	const flx_tensor *x = flx_ckpt_find(c, "w");
	CHECK(x && x->ndim == 2 && x->shape[0] == 2 && x->shape[1] == 3 &&
	      x->dtype == FLX_DT_F32 && x->nchunks == 1);
	if (x && x->nchunks == 1) {
		size_t at = 0;
		float got[6];
		while (at + sizeof(w) <= nf && memcmp(f + at, w, sizeof(w)))
			at++;
		CHECK(at + sizeof(w) <= nf && x->chunks[0].data_off == at);
		CHECK_EQ(flx_file_pread(c, x->chunks[0].file, got, sizeof(got),
					x->chunks[0].data_off),
			 0);
		CHECK(memcmp(got, w, sizeof(w)) == 0);
	}
	CHECK_EQ(c->ntensors, 1);
	flx_ckpt_close(c);
}

/* One Value record of tag (taglen bytes) holding the Float32 vector x[n],
 * written to o.  @return its length. */
static size_t put_f32_record(uint8_t *o, const char *tag, size_t taglen,
			     const float *x, size_t n)
{
	uint8_t *t = malloc(4 * n + 64), *v = malloc(4 * n + 256);
	size_t nt = 0, nv = 0, k;

	if (!t || !v)
		abort();
	t[nt++] = 0x08; /* dims: n, unpacked */
	nt += put_varint(t + nt, n);
	nt += put_len(t + nt, 2, "Float32", 7);
	nt += put_len(t + nt, 3, x, 4 * n);
	nv += put_len(v + nv, 1, tag, taglen);
	nv += put_len(v + nv, 2, t, nt);
	k = put_len(o, 1, v, nv);
	free(t);
	free(v);
	return k;
}

/* The reader's window (65,536 bytes) ends inside a record's length
 * varint: the varint is read across the window's end, and the next
 * tensor is where the bytes say. */
static void test_window_edge(void)
{
	static const float b[2] = {7, 8};
	float *a = calloc(16384, sizeof(float)), got[2];
	uint8_t *f = malloc(1 << 17);
	size_t nf = 0, n = 0, taglen = 0;
	const char tag[] = "aaaaaaaaaaaaaaaa";
	char btag[128];
	flx_ckpt *c;

	if (!a || !f)
		abort();
	/* the first record 65,534 bytes long: the second's key at byte
	 * 65,534, its two-byte length at 65,535 and 65,536 */
	for (taglen = 1; taglen < 8 && !n; taglen++)
		for (size_t m = 16000; m < 16384 && !n; m++)
			if (put_f32_record(f, tag, taglen, a, m) == 65534)
				n = m;
	taglen--;
	CHECK(n != 0);
	if (!n)
		goto out;
	nf = put_f32_record(f, tag, taglen, a, n);
	/* a tag of 128 bytes: the record's length takes two bytes */
	memset(btag, 'b', sizeof(btag));
	nf += put_f32_record(f + nf, btag, sizeof(btag), b, 2);
	CHECK(f[65534] == 0x0A && (f[65535] & 0x80) && !(f[65536] & 0x80));
	c = open_bytes(f, nf);
	if (!c)
		goto out;
	CHECK_EQ(c->ntensors, 2);
	const flx_tensor *x = c->ntensors == 2 ? &c->tensors[1] : NULL;
	CHECK(x && x->ndim == 1 && x->shape[0] == 2 && x->nchunks == 1);
	if (x && x->nchunks == 1) {
		CHECK_EQ(x->chunks[0].data_off, nf - sizeof(b));
		CHECK_EQ(flx_file_pread(c, x->chunks[0].file, got, sizeof(got),
					x->chunks[0].data_off),
			 0);
		CHECK(got[0] == 7 && got[1] == 8);
	}
	flx_ckpt_close(c);
out:
	free(a);
	free(f);
}

/* rank_0/<name>: a safetensors file of one F32 [1] tensor "w" = x */
static void put_st(const char *name, float x)
{
	const char hdr[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],"
			   "\"data_offsets\":[0,4]}}";
	uint8_t b[128];
	uint64_t n = sizeof(hdr) - 1;
	char path[192];

	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(n >> (8 * i));
	memcpy(b + 8, hdr, n);
	memcpy(b + 8 + n, &x, 4);
	snprintf(path, sizeof(path), "%s/rank_0/%s", dir, name);
	write_bytes(path, b, 8 + n + 4);
}

/* dir/<name>: a safetensors file of F32 tensors names[i] = {x[i]} */
static void put_st_flat(const char *name, int n, const char *const *names,
			const float *x)
{
	char hdr[512], path[192];
	uint8_t b[640];
	size_t h = 1;

	hdr[0] = '{';
	for (int i = 0; i < n; i++)
		h +=
		    (size_t)snprintf(hdr + h, sizeof(hdr) - h,
				     "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[],"
				     "\"data_offsets\":[%d,%d]}",
				     i ? "," : "", names[i], 4 * i, 4 * i + 4);
	hdr[h++] = '}';
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)h >> (8 * i));
	memcpy(b + 8, hdr, h);
	memcpy(b + 8 + h, x, 4 * (size_t)n);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	write_bytes(path, b, 8 + h + 4 * (size_t)n);
}

/* docs/formats/mindspore.md#safetensors-saves: unified_safetensors writes whole
 * tensors as part{i}.safetensors, the others as hyper_param.safetensors, and
 * param_name_map.json; every file's tensors are served (not only the last
 * file's, as for a lone unnumbered file), and no strategy is asked for. */
static void test_unified(void)
{
	static const char *const p0[] = {"a", "c"}, *const p1[] = {"b"},
				 *const hp[] = {"global_step"};
	static const float v0[] = {1, 3}, v1[] = {2}, vh[] = {7};
	static const char *const files[] = {
	    "part0.safetensors", "part1.safetensors", "hyper_param.safetensors",
	    "param_name_map.json"};
	const char *map = "{\"metadata\":{\"total_size\":12},\"weight_map\":"
			  "{\"a\":\"part0.safetensors\",\"c\":\"part0."
			  "safetensors\",\"b\":\"part1.safetensors\"}}";
	const char *want[] = {"a", "b", "c", "global_step"};
	const float wv[] = {1, 2, 3, 7};
	char path[192];
	flx_ckpt *c = NULL;
	flx_error e;

	put_st_flat(files[0], 2, p0, v0);
	put_st_flat(files[1], 1, p1, v1);
	put_st_flat(files[2], 1, hp, vh);
	snprintf(path, sizeof(path), "%s/%s", dir, files[3]);
	write_bytes(path, map, strlen(map));
	flx_error_init(&e);
	CHECK_EQ(flx_ckpt_open(dir, &c, &e), 0);
	if (c) {
		CHECK_EQ(c->ntensors, 4);
		for (int i = 0; i < 4; i++) {
			const flx_tensor *x = flx_ckpt_find(c, want[i]);
			float got = 0;
			CHECK(x && x->ndim == 0 && x->nchunks == 1);
			if (x && x->nchunks == 1)
				CHECK_EQ(flx_file_pread(c, x->chunks[0].file,
							&got, 4,
							x->chunks[0].data_off),
					 0);
			CHECK(got == wv[i]);
		}
		flx_ckpt_close(c);
	} else {
		fprintf(stderr, "  %s\n", e.text);
	}
	for (int i = 0; i < 4; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
		unlink(path);
	}
}

/* docs/formats/mindspore.md#file-names: of a rank directory's .safetensors
 * files MindSpore takes the last after sorting on the last two integers of the
 * name (epoch, step), not the last by name: net-10_2 over net-9_2 and net-10_1.
 */
static void test_safetensors_pick(void)
{
	const char *names[] = {"net-9_2.safetensors", "net-10_2.safetensors",
			       "net-10_1.safetensors"};
	const float val[] = {9.2f, 10.2f, 10.1f};
	char sub[128], path[192];
	flx_ckpt *c = NULL;
	flx_error e;
	float got = 0;

	snprintf(sub, sizeof(sub), "%s/rank_0", dir);
	CHECK_EQ(mkdir(sub, 0755), 0);
	for (int i = 0; i < 3; i++)
		put_st(names[i], val[i]);
	flx_error_init(&e);
	CHECK_EQ(flx_ckpt_open(dir, &c, &e), 0);
	if (c) {
		const flx_tensor *x = flx_ckpt_find(c, "w");
		CHECK(x && x->nchunks == 1);
		if (x && x->nchunks == 1)
			CHECK_EQ(flx_file_pread(c, x->chunks[0].file, &got, 4,
						x->chunks[0].data_off),
				 0);
		CHECK(got == 10.2f);
		flx_ckpt_close(c);
	}
	/* .ckpt files over .safetensors, the last by name (x-9_2 after
	 * x-10_2: transform_checkpoints' glob sorted,
	 * docs/formats/mindspore.md#file-names) */
	{
		static const uint8_t v9[] = {
		    0x0a, 0x16, 0x0a, 0x01, 0x77, 0x12, 0x11, 0x08,
		    0x01, 0x12, 0x07, 'F',  'l',  'o',	'a',  't',
		    '3',  '2',	0x1a, 0x04, 0,	  0,	0x80, 0x3f};
		uint8_t v10[sizeof(v9)];

		memcpy(v10, v9, sizeof(v9));
		v10[sizeof(v9) - 1] = 0x40; /* 2.0f */
		snprintf(path, sizeof(path), "%s/x-9_2.ckpt", sub);
		write_bytes(path, v9, sizeof(v9));
		snprintf(path, sizeof(path), "%s/x-10_2.ckpt", sub);
		write_bytes(path, v10, sizeof(v10));
		c = NULL;
		got = 0;
		flx_error_init(&e);
		CHECK_EQ(flx_ckpt_open(dir, &c, &e), 0);
		if (c) {
			const flx_tensor *x = flx_ckpt_find(c, "w");
			if (x && x->nchunks == 1)
				CHECK_EQ(flx_file_pread(c, x->chunks[0].file,
							&got, 4,
							x->chunks[0].data_off),
					 0);
			CHECK(got == 1.0f);
			flx_ckpt_close(c);
		}
		unlink(path);
		snprintf(path, sizeof(path), "%s/x-9_2.ckpt", sub);
		unlink(path);
	}
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/%s", sub, names[i]);
		unlink(path);
	}
	rmdir(sub);
}

/* ---- several threads (flx_ckpt_opts.threads): the rank directories,
 * the rank files and the tensors are each read in parts on their own
 * threads; the index and the first failure must be those of one thread
 * ---- */

#define PP2 "fixtures/mindspore-pp2/"
static const unsigned thread_counts[] = {0, 2, 3, 5, 8};

/* the pp2 fixture's rank files (one each in rank_0 .. rank_7) copied into
 * to/rank_<r>/, to be spoilt; *names the copies' paths */
static void copy_pp2(const char *to, char names[8][192])
{
	char from[192];

	for (int r = 0; r < 8; r++) {
		snprintf(names[r], 192, "%s/rank_%d", to, r);
		mkdir(names[r], 0755);
		snprintf(names[r], 192, "%s/rank_%d/llama_rank_%d-2_4.ckpt", to,
			 r, r);
		snprintf(from, sizeof(from),
			 PP2 "ckpt/rank_%d/llama_rank_%d-2_4.ckpt", r, r);
		copy_file(from, names[r]);
	}
}

static flx_ckpt *open_pp2(const char *d, unsigned threads, flx_error *e)
{
	flx_opt_vals vals = {0};
	flx_ckpt_opts o = {.threads = threads};
	flx_ckpt *c = NULL;

	CHECK_EQ(flx_ckpt_opt_set(&vals, "src_strategy",
				  PP2 "merged/merged_ckpt_strategy.ckpt", NULL),
		 0);
	o.vals = &vals;
	flx_error_init(e);
	if (flx_ckpt_open_with(d, &o, &c, e) < 0)
		c = NULL;
	flx_opt_vals_release(&vals);
	return c;
}

/* The open of d fails alike with every thread count: as with one.
 * @return the code. */
static int fails_alike(const char *d, flx_error *one)
{
	flx_error e;
	flx_ckpt *c = open_pp2(d, 1, one);

	CHECK(c == NULL);
	CHECK(one->code < 0);
	for (size_t i = 0; i < sizeof(thread_counts) / sizeof(*thread_counts);
	     i++) {
		c = open_pp2(d, thread_counts[i], &e);
		CHECK(c == NULL);
		CHECK_EQ(e.code, one->code);
		CHECK_STR(e.file, one->file);
		CHECK_STR(e.key, one->key);
		CHECK_STR(e.text, one->text);
		flx_ckpt_close(c);
	}
	return one->code;
}

static void test_threads(void)
{
	char d[] = "/tmp/flx-ms-threads.XXXXXX", names[8][192], sub[224];
	flx_ckpt *one, *c;
	flx_error e;
	uint8_t x;

	if (!mkdtemp(d))
		abort();
	copy_pp2(d, names);
	one = open_pp2(d, 1, &e);
	CHECK(one != NULL);
	if (!one)
		return;
	CHECK_EQ(one->nfiles, 8);
	/* the same index: tensors in first-stored order, chunks, files */
	for (size_t i = 0; i < sizeof(thread_counts) / sizeof(*thread_counts);
	     i++) {
		c = open_pp2(d, thread_counts[i], &e);
		CHECK(c != NULL);
		if (!c)
			continue;
		CHECK_EQ(c->ntensors, one->ntensors);
		CHECK_EQ(c->nfiles, one->nfiles);
		for (size_t f = 0; f < c->nfiles && f < one->nfiles; f++)
			CHECK_STR(c->files[f].relpath, one->files[f].relpath);
		for (size_t t = 0; t < c->ntensors && t < one->ntensors; t++) {
			const flx_tensor *a = &one->tensors[t],
					 *b = &c->tensors[t];

			CHECK_STR(b->fqn, a->fqn);
			CHECK_EQ(b->dtype, a->dtype);
			CHECK_EQ(b->ndim, a->ndim);
			CHECK_EQ(b->nchunks, a->nchunks);
			CHECK_EQ(b->saved_split, a->saved_split);
			for (int k = 0; k < a->ndim; k++)
				CHECK_EQ(b->shape[k], a->shape[k]);
			for (uint32_t k = 0; k < a->nchunks && k < b->nchunks;
			     k++) {
				const flx_chunk *p = &a->chunks[k],
						*q = &b->chunks[k];

				CHECK_EQ(q->file, p->file);
				CHECK_EQ(q->data_off, p->data_off);
				CHECK_EQ(q->item_len, p->item_len);
				for (int m = 0; m < a->ndim; m++) {
					CHECK_EQ(q->off[m], p->off[m]);
					CHECK_EQ(q->size[m], p->size[m]);
					CHECK_EQ(q->stride[m], p->stride[m]);
				}
			}
		}
		flx_ckpt_close(c);
	}

	/* every kept chunk 0 with a byte flipped: its replicas differ, and
	 * the tensor reported is the first such in index order */
	for (size_t t = 0; t < one->ntensors; t++) {
		const flx_chunk *ch = &one->tensors[t].chunks[0];
		FILE *f;

		if (!one->tensors[t].nchunks || !ch->item_len)
			continue;
		f = fopen(names[ch->file], "r+b");
		CHECK(f != NULL);
		if (!f)
			continue;
		CHECK(strstr(names[ch->file], one->files[ch->file].relpath));
		fseek(f, (long)ch->data_off, SEEK_SET);
		x = (uint8_t)fgetc(f);
		fseek(f, (long)ch->data_off, SEEK_SET);
		fputc(x ^ 0x55, f);
		fclose(f);
	}
	CHECK_EQ(fails_alike(d, &e), -EINVAL);
	CHECK(strstr(e.text, "not a replica") != NULL);
	CHECK(strcmp(e.key, one->tensors[one->ntensors - 1].fqn) != 0);
	flx_ckpt_close(one);

	/* rank 6's data file a directory (cannot be opened), ranks 2 and 5
	 * truncated (cannot be read): rank 2's failure first, then with
	 * rank 2 whole, rank 5's; with 5 whole too, rank 6's open */
	copy_pp2(d, names);
	snprintf(sub, sizeof(sub), "%s/rank_6/zz.ckpt", d);
	CHECK_EQ(mkdir(sub, 0755), 0);
	CHECK_EQ(truncate(names[2], 100), 0);
	CHECK_EQ(truncate(names[5], 100), 0);
	CHECK_EQ(fails_alike(d, &e), -EINVAL);
	CHECK(strstr(e.file, "rank_2/") != NULL);
	copy_pp2(d, names);
	CHECK_EQ(truncate(names[5], 100), 0);
	CHECK_EQ(fails_alike(d, &e), -EINVAL);
	CHECK(strstr(e.file, "rank_5/") != NULL);
	copy_pp2(d, names);
	fails_alike(d, &e);
	CHECK(strstr(e.file, "rank_6/zz.ckpt") != NULL);

	CHECK_EQ(rmdir(sub), 0);
	for (int r = 0; r < 8; r++) {
		unlink(names[r]);
		snprintf(sub, sizeof(sub), "%s/rank_%d", d, r);
		rmdir(sub);
	}
	rmdir(d);
}

/*
 * Many ranks of many small tensors, built on two threads: 128 ranks of
 * 4,096 parameters, rank r holding row r of each [128, 4] float32 (its
 * values r, i, 0, 1), a JSON strategy splitting dim 0.  The entries'
 * pages go back to the system as their tensors are built, while the
 * threads map blocks of their own for the chunks: every chunk must then
 * be where its rank's record says (a block of chunks unmapped with the
 * entries would fault here).
 */
#define MANY_RANKS   128
#define MANY_TENSORS 4096

static void test_many_ranks(void)
{
	char d[] = "/tmp/flx-ms-many.XXXXXX", path[256], tag[32];
	size_t cap = (size_t)MANY_TENSORS * 64, n;
	uint8_t *buf = malloc(cap), rec[128], ten[96];
	char *js = malloc((size_t)MANY_TENSORS * 192 + 64);
	size_t nj = 0;
	uint64_t *at = malloc(sizeof(uint64_t) * MANY_TENSORS);
	flx_opt_vals vals = {0};
	flx_ckpt_opts o = {.threads = 2};
	flx_ckpt *c = NULL;
	flx_error e;

	if (!buf || !js || !at || !mkdtemp(d))
		abort();
	/* every rank's records alike but for the values: the data offsets
	 * are the same in every file */
	for (int r = 0; r < MANY_RANKS; r++) {
		n = 0;
		for (int i = 0; i < MANY_TENSORS; i++) {
			float v[4] = {(float)r, (float)i, 0, 1};
			size_t k = 0, t;

			k += put_varint(ten + k, 1 << 3);
			k += put_varint(ten + k, 1);
			k += put_varint(ten + k, 1 << 3);
			k += put_varint(ten + k, 4);
			k += put_len(ten + k, 2, "Float32", 7);
			k += put_len(ten + k, 3, v, sizeof(v));
			t = put_len(
			    rec, 1, tag,
			    (size_t)snprintf(tag, sizeof(tag), "m.t%05d.w", i));
			t += put_len(rec + t, 2, ten, k);
			n += put_varint(buf + n, 1 << 3 | 2);
			n += put_varint(buf + n, t);
			memcpy(buf + n, rec, t);
			n += t;
			at[i] = n - sizeof(v);
		}
		snprintf(path, sizeof(path), "%s/rank_%d", d, r);
		mkdir(path, 0755);
		snprintf(path, sizeof(path), "%s/rank_%d/net.ckpt", d, r);
		write_bytes(path, buf, n);
	}
	nj += (size_t)sprintf(js, "{\"parallel_layout_item\":{");
	for (int i = 0; i < MANY_TENSORS; i++)
		nj += (size_t)sprintf(js + nj,
				      "%s\"m.t%05d.w\":{\"dev_matrix\":[%d,1],"
				      "\"tensor_map\":[1,-1],"
				      "\"tensor_shape\":[%d,4]}",
				      i ? "," : "", i, MANY_RANKS, MANY_RANKS);
	nj += (size_t)sprintf(js + nj, "}}");
	snprintf(path, sizeof(path), "%s/strategy.json", d);
	write_bytes(path, js, nj);
	CHECK_EQ(flx_ckpt_opt_set(&vals, "src_strategy", path, NULL), 0);
	o.vals = &vals;
	flx_error_init(&e);
	if (flx_ckpt_open_with(d, &o, &c, &e) < 0) {
		fprintf(stderr, "  %s\n", e.text);
		c = NULL;
	}
	CHECK(c != NULL);
	if (c) {
		size_t bad = 0;

		CHECK_EQ(c->ntensors, MANY_TENSORS);
		for (size_t i = 0; i < c->ntensors; i++) {
			const flx_tensor *t = &c->tensors[i];

			bad += t->nchunks != MANY_RANKS || t->ndim != 2 ||
			       t->shape[0] != MANY_RANKS || t->shape[1] != 4;
			for (uint32_t k = 0; k < t->nchunks && !bad; k++) {
				const flx_chunk *ch = &t->chunks[k];
				int64_t r = ch->off[0];

				snprintf(path, sizeof(path), "rank_%d/net.ckpt",
					 (int)r);
				bad += r < 0 || r >= MANY_RANKS ||
				       ch->off[1] != 0 || ch->size[0] != 1 ||
				       ch->size[1] != 4 ||
				       ch->data_off != at[i] ||
				       strcmp(c->files[ch->file].relpath, path);
			}
		}
		CHECK_EQ(bad, 0);
	}
	flx_ckpt_close(c);
	flx_opt_vals_release(&vals);
	for (int r = 0; r < MANY_RANKS; r++) {
		snprintf(path, sizeof(path), "%s/rank_%d/net.ckpt", d, r);
		unlink(path);
		snprintf(path, sizeof(path), "%s/rank_%d", d, r);
		rmdir(path);
	}
	snprintf(path, sizeof(path), "%s/strategy.json", d);
	unlink(path);
	rmdir(d);
	free(buf);
	free(js);
	free(at);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/flx-ms-unit.XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	test_plain_and_chunked();
	test_scalar_str();
	test_zero_element();
	test_chunk_layout();
	test_legacy_bf16_scalar();
	test_all_types();
	test_records_differ();
	test_wire_variants();
	test_window_edge();
	char p[128];
	snprintf(p, sizeof(p), "%s/m.ckpt", dir);
	unlink(p);
	test_safetensors_pick();
	test_unified();
	test_threads();
	test_many_ranks();
	snprintf(p, sizeof(p), "%s/m.ckpt", dir);
	unlink(p);
	rmdir(dir);
	return CHECK_RESULT();
}
