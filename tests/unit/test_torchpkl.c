/* SPDX-License-Identifier: MIT */
/*
 * Tensor data.pkl interpretation: real torch.save outputs (torch 1.13 and
 * 2.6, expectations taken from the saved tensors by gen_vectors.py), then
 * hand-built data.pkl variants for every rejection path.
 */
#include "check.h"
#include "data/vectors.h"
#include "torchpkl.h"
#include "zipitem.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NZIP (sizeof(zip_vecs) / sizeof(zip_vecs[0]))

/* Parse data.pkl of zip vector v; returns flx_tensor_pkl_parse's code. */
static int parse_vec(const struct zip_vec *v, flx_tensor_pkl *t,
		     uint64_t *key_size, bool *is_v3)
{
	size_t len = 0;
	unsigned char *buf = check_read_file(v->file, &len);
	flx_reader r;
	flx_mem_reader m;
	flx_zip *z = NULL;
	flx_zip_rec pkl, data;
	flx_error e;
	char rel[80];
	int rc = -EIO;

	if (!buf)
		return -EIO;
	flx_error_init(&e);
	flx_reader_mem(&r, &m, buf + v->win_off, v->win_len);
	if (flx_zip_open(&r, v->file, &z, &e) ||
	    flx_zip_find(z, "data.pkl", &pkl))
		goto out;
	rc = flx_tensor_pkl_parse(buf + v->win_off + pkl.data_off,
				  (size_t)pkl.size, v->file, t, &e);
	if (rc) {
		fprintf(stderr, "%s: %s\n", v->file, e.text);
		goto out;
	}
	*is_v3 = memmem(buf + v->win_off + pkl.data_off, (size_t)pkl.size,
			"_rebuild_tensor_v3", 18) != NULL;
	snprintf(rel, sizeof(rel), "data/%s", t->key);
	*key_size = flx_zip_find(z, rel, &data) ? UINT64_MAX : data.size;
out:
	flx_zip_close(z);
	free(buf);
	return rc;
}

static void test_vectors(void)
{
	int n = 0, nv3 = 0, n113 = 0;

	for (size_t i = 0; i < NZIP; i++) {
		const struct zip_vec *v = &zip_vecs[i];
		flx_tensor_pkl t;
		uint64_t ksize = 0;
		bool v3 = false;

		if (!v->has_tensor)
			continue;
		memset(&t, 0xa5, sizeof(t));
		CHECK_EQ(parse_vec(v, &t, &ksize, &v3), 0);
		CHECK_STR(flx_dtype_name(t.dtype), v->dtype);
		CHECK_STR(t.key, v->key);
		CHECK_EQ(t.ndim, v->ndim);
		for (int d = 0; d < v->ndim && d < t.ndim; d++) {
			CHECK_EQ(t.size[d], v->size[d]);
			CHECK_EQ(t.stride[d], v->stride[d]);
		}
		CHECK_EQ(t.storage_offset, v->offset);
		CHECK_EQ(t.storage_bytes, v->storage_bytes);
		/* the storage record holds exactly the storage */
		CHECK_EQ(ksize, t.storage_bytes);
		n++;
		nv3 += v3;
		n113 += strncmp(v->file, "torch/t113_", 11) == 0;
	}
	CHECK(n >= 34);
	CHECK(n113 >= 16);
	CHECK(nv3 >= 4); /* float8 and uint16/32 from torch 2.6 */
}

/* What the vectors are meant to contain, stated independently. */
static void test_vector_facts(void)
{
	static const struct {
		const char *file;
		flx_dtype dt;
		int ndim;
		int64_t s0, st0, st1, off;
		uint64_t bytes;
	} facts[] = {
	    {"torch/t113_f32.pt", FLX_DT_F32, 2, 3, 4, 1, 0, 48},
	    {"torch/t26_bf16.pt", FLX_DT_BF16, 2, 2, 3, 1, 0, 12},
	    {"torch/t113_transposed.pt", FLX_DT_F32, 2, 4, 1, 4, 0, 48},
	    {"torch/t26_transposed.pt", FLX_DT_F32, 2, 4, 1, 4, 0, 48},
	    {"torch/t113_offset.pt", FLX_DT_F32, 1, 4, 1, 0, 5, 80},
	    {"torch/t26_offset.pt", FLX_DT_F32, 1, 4, 1, 0, 5, 80},
	    {"torch/t26_scalar.pt", FLX_DT_I64, 0, 0, 0, 0, 0, 8},
	    {"torch/t26_empty.pt", FLX_DT_F32, 2, 0, 3, 1, 0, 0},
	    {"torch/t26_f8e4m3.pt", FLX_DT_F8_E4M3FN, 1, 3, 1, 0, 0, 3},
	    {"torch/t26_f8e5m2.pt", FLX_DT_F8_E5M2, 1, 2, 1, 0, 0, 2},
	    {"torch/t26_u16.pt", FLX_DT_U16, 1, 2, 1, 0, 0, 4},
	    {"torch/t26_u32.pt", FLX_DT_U32, 1, 2, 1, 0, 0, 8},
	    {"torch/t113_bool.pt", FLX_DT_BOOL, 1, 3, 1, 0, 0, 3},
	    {"torch/t113_c64.pt", FLX_DT_C64, 1, 2, 1, 0, 0, 16},
	    {"torch/t26_window.pt", FLX_DT_F32, 2, 2, 3, 1, 0, 24},
	};

	for (size_t i = 0; i < sizeof(facts) / sizeof(facts[0]); i++) {
		const struct zip_vec *v = NULL;
		flx_tensor_pkl t;
		uint64_t ksize;
		bool v3;

		for (size_t j = 0; j < NZIP && !v; j++)
			if (strcmp(zip_vecs[j].file, facts[i].file) == 0)
				v = &zip_vecs[j];
		CHECK(v != NULL);
		if (!v || parse_vec(v, &t, &ksize, &v3) != 0) {
			check_failures++;
			continue;
		}
		CHECK_EQ(t.dtype, facts[i].dt);
		CHECK_EQ(t.ndim, facts[i].ndim);
		if (t.ndim) {
			CHECK_EQ(t.size[0], facts[i].s0);
			CHECK_EQ(t.stride[0], facts[i].st0);
		}
		if (t.ndim > 1)
			CHECK_EQ(t.stride[1], facts[i].st1);
		CHECK_EQ(t.storage_offset, facts[i].off);
		CHECK_EQ(t.storage_bytes, facts[i].bytes);
	}
}

/* ------------------------------------------------------ hand-built pkl */

struct pb {
	unsigned char b[4096];
	size_t n;
};

static void raw(struct pb *p, const void *s, size_t n)
{
	if (p->n + n > sizeof(p->b))
		abort();
	memcpy(p->b + p->n, s, n);
	p->n += n;
}

static void op(struct pb *p, const char *s)
{
	raw(p, s, strlen(s));
}

/* A literal that may hold NUL bytes. */
#define LIT(p, s) raw((p), (s), sizeof(s) - 1)

static void pstr(struct pb *p, const char *s)
{
	uint32_t n = (uint32_t)strlen(s);
	unsigned char h[5] = {'X', (unsigned char)n, (unsigned char)(n >> 8),
			      (unsigned char)(n >> 16),
			      (unsigned char)(n >> 24)};

	raw(p, h, 5);
	raw(p, s, n);
}

static void pint(struct pb *p, int64_t v)
{
	unsigned char h[10];
	uint64_t u = (uint64_t)v;

	if (v >= INT32_MIN && v <= INT32_MAX) {
		h[0] = 'J';
		for (int i = 0; i < 4; i++)
			h[1 + i] = (unsigned char)(u >> (8 * i));
		raw(p, h, 5);
		return;
	}
	h[0] = 0x8a; /* LONG1 */
	h[1] = 8;
	for (int i = 0; i < 8; i++)
		h[2 + i] = (unsigned char)(u >> (8 * i));
	raw(p, h, 10);
}

static void pglobal(struct pb *p, const char *mod, const char *name)
{
	op(p, "c");
	op(p, mod);
	op(p, "\n");
	op(p, name);
	op(p, "\n");
}

struct spec {
	const char *fn_mod, *fn;
	const char *st_mod, *st_cls;
	const char *key;
	int64_t numel, offset;
	int nd, nstride;
	int64_t size[20], stride[20];
	const char *dtype; /* v3 dtype argument, NULL for none */
	bool meta;	   /* trailing metadata dict */
	bool hooks_none;   /* backward_hooks = None instead of a dict */
	const char *tag;
};

/* A dense float32 (3, 4) tensor, as torch writes it. */
static struct spec base(void)
{
	return (struct spec){
	    .fn_mod = "torch._utils",
	    .fn = "_rebuild_tensor_v2",
	    .st_mod = "torch",
	    .st_cls = "FloatStorage",
	    .key = "0",
	    .numel = 12,
	    .nd = 2,
	    .nstride = -1,
	    .size = {3, 4},
	    .stride = {4, 1},
	    .tag = "storage",
	};
}

/* (3, 4) stride (4, 1) -> its transpose (4, 3) stride (1, 4) */
static void transpose(struct spec *s)
{
	s->size[0] = 4;
	s->size[1] = 3;
	s->stride[0] = 1;
	s->stride[1] = 4;
}

static void ones(struct spec *s)
{
	for (int i = 0; i < s->nd; i++) {
		s->size[i] = 1;
		s->stride[i] = 1;
	}
}

static void build(struct pb *p, const struct spec *s)
{
	int ns = s->nstride < 0 ? s->nd : s->nstride;

	p->n = 0;
	op(p, "\x80\x02");
	pglobal(p, s->fn_mod, s->fn);
	LIT(p, "q\x00(("); /* BINPUT 0, MARK args, MARK persistent id */
	pstr(p, s->tag);
	pglobal(p, s->st_mod, s->st_cls);
	pstr(p, s->key);
	pstr(p, "cpu");
	pint(p, s->numel);
	op(p, "tQ");
	pint(p, s->offset);
	op(p, "(");
	for (int i = 0; i < s->nd; i++)
		pint(p, s->size[i]);
	op(p, "t(");
	for (int i = 0; i < ns; i++)
		pint(p, s->stride[i]);
	raw(p, "t\x89", 2);
	if (s->hooks_none) {
		op(p, "N");
	} else {
		pglobal(p, "collections", "OrderedDict");
		op(p, ")R");
	}
	if (s->dtype)
		pglobal(p, "torch", s->dtype);
	if (s->meta)
		op(p, "}");
	op(p, "tR.");
}

static int parse_spec(const struct spec *s, flx_tensor_pkl *t, flx_error *e)
{
	struct pb p;

	build(&p, s);
	flx_error_init(e);
	return flx_tensor_pkl_parse(p.b, p.n, "x.pkl", t, e);
}

static void expect_bad(const struct spec *s, const char *needle, int line)
{
	flx_tensor_pkl t;
	flx_error e;
	int rc;

	memset(&t, 0x5a, sizeof(t));
	rc = parse_spec(s, &t, &e);
	if (rc != -EINVAL) {
		fprintf(stderr, "line %d: expected -EINVAL, got %d\n", line,
			rc);
		check_failures++;
	} else if (!strstr(e.text, needle) || strcmp(e.file, "x.pkl")) {
		fprintf(stderr, "line %d: error '%s: %s' lacks '%s'\n", line,
			e.file, e.text, needle);
		check_failures++;
	}
	/* *out untouched on failure */
	CHECK_EQ(t.ndim, 0x5a5a5a5a);
}

#define BAD(s, needle) expect_bad((s), (needle), __LINE__)

static void expect_ok(const struct spec *s, flx_tensor_pkl *t, int line)
{
	flx_error e;

	if (parse_spec(s, t, &e) != 0) {
		fprintf(stderr, "line %d: %s\n", line, e.text);
		check_failures++;
	}
}

#define OK(s, t) expect_ok((s), (t), __LINE__)

static void test_handmade_ok(void)
{
	struct spec s = base();
	flx_tensor_pkl t;

	memset(&t, 0, sizeof(t));
	OK(&s, &t);
	CHECK_EQ(t.dtype, FLX_DT_F32);
	CHECK_EQ(t.storage_bytes, 48);
	CHECK_EQ(t.ndim, 2);
	/* transposed within the same storage */
	transpose(&s);
	OK(&s, &t);
	/* offset + extent exactly at the end */
	s = base();
	s.numel = 13;
	s.offset = 1;
	OK(&s, &t);
	CHECK_EQ(t.storage_offset, 1);
	/* a size-1 axis may have any stride: it never steps */
	s = base();
	s.size[0] = 1;
	s.stride[0] = 0;
	OK(&s, &t);
	/* a sliced view: rows 8 apart, 4 wide, gaps between */
	s = base();
	s.numel = 24;
	s.stride[0] = 8;
	OK(&s, &t);
	/* a zero-size dimension needs no storage at all */
	s = base();
	s.numel = 0;
	s.size[0] = 0;
	s.stride[0] = INT64_MAX;
	s.offset = 1000;
	OK(&s, &t);
	/* 0-d */
	s = base();
	s.nd = 0;
	s.numel = 1;
	OK(&s, &t);
	CHECK_EQ(t.ndim, 0);
	/* 16 dims */
	s = base();
	s.nd = 16;
	ones(&s);
	s.numel = 1;
	OK(&s, &t);
	CHECK_EQ(t.ndim, 16);
	/* v2 with trailing metadata dict */
	s = base();
	s.meta = true;
	OK(&s, &t);
	/* v3 + UntypedStorage: numel counts bytes */
	s = base();
	s.fn = "_rebuild_tensor_v3";
	s.st_mod = "torch.storage";
	s.st_cls = "UntypedStorage";
	s.dtype = "uint16";
	s.numel = 4;
	s.nd = 1;
	s.size[0] = 2;
	s.stride[0] = 1;
	OK(&s, &t);
	CHECK_EQ(t.dtype, FLX_DT_U16);
	CHECK_EQ(t.storage_bytes, 4);
	s.st_mod = "torch";
	s.dtype = "float8_e4m3fn";
	s.numel = 2;
	s.meta = true;
	OK(&s, &t);
	CHECK_EQ(t.dtype, FLX_DT_F8_E4M3FN);
	/* v3 with a typed storage: bytes from the storage class */
	s = base();
	s.fn = "_rebuild_tensor_v3";
	s.dtype = "int32";
	OK(&s, &t);
	CHECK_EQ(t.dtype, FLX_DT_I32);
	CHECK_EQ(t.storage_bytes, 48);
	/* v2 with UntypedStorage: torch reads bytes */
	s = base();
	s.st_cls = "UntypedStorage";
	s.numel = 12;
	OK(&s, &t);
	CHECK_EQ(t.dtype, FLX_DT_U8);
	/* big values through LONG1 */
	s = base();
	s.numel = (int64_t)1 << 40;
	s.size[0] = (int64_t)1 << 36;
	s.stride[0] = 4;
	OK(&s, &t);
	CHECK_EQ(t.size[0], (int64_t)1 << 36);
	CHECK_EQ(t.storage_bytes, (uint64_t)1 << 42);
	/* key of 63 bytes is the longest */
	s = base();
	s.key =
	    "123456789012345678901234567890123456789012345678901234567890123";
	OK(&s, &t);
	CHECK_EQ(strlen(t.key), 63);
}

static void test_handmade_bad(void)
{
	struct spec s = base();
	flx_tensor_pkl t;
	flx_error e;
	int rc;

	s.numel = 11;
	BAD(&s, "tensor needs 48 bytes of storage '0' but it has 44");
	/* zero stride (an expand()ed view: 4 stored elements for 12) and
	 * overlapping rows (4 wide, 2 apart) are refused */
	s = base();
	s.numel = 4;
	s.stride[0] = 0;
	BAD(&s, "size [3,4] with stride [0,1] puts several elements at one "
		"storage position");
	s = base();
	s.stride[0] = 2;
	BAD(&s, "with stride [2,1] puts several elements");
	s = base();
	s.offset = 1;
	BAD(&s, "needs 52 bytes");
	s = base();
	transpose(&s);
	s.stride[1] = 5;
	BAD(&s, "needs");
	s = base();
	s.stride[1] = -1;
	BAD(&s, "stride[1] = -1 is negative");
	s = base();
	s.size[0] = -3;
	BAD(&s, "size[0] = -3 is negative");
	s = base();
	s.offset = -1;
	BAD(&s, "storage offset");
	s = base();
	s.numel = -1;
	BAD(&s, "storage size");
	s = base();
	s.size[0] = (int64_t)1 << 40;
	s.size[1] = (int64_t)1 << 40;
	s.stride[0] = (int64_t)1 << 40;
	BAD(&s, "overflows");
	s = base();
	s.offset = INT64_MAX;
	BAD(&s, "overflows");
	s = base();
	s.numel = INT64_MAX;
	BAD(&s, "storage size overflows");
	s = base();
	s.nd = 17;
	ones(&s);
	BAD(&s, "17 dimensions (limit 16)");
	s = base();
	s.nstride = 1;
	BAD(&s, "size has 2 dimensions but stride has 1");
	s = base();
	s.st_cls = "QInt8Storage";
	BAD(&s, "unsupported storage class torch.QInt8Storage");
	s = base();
	s.st_cls = "FooStorage";
	BAD(&s, "unsupported storage class");
	s = base();
	s.st_mod = "numpy";
	BAD(&s, "unsupported storage class numpy.FloatStorage");
	s = base();
	s.fn = "_rebuild_parameter";
	BAD(&s, "unsupported rebuild function torch._utils._rebuild_parameter");
	s = base();
	s.fn = "_rebuild_qtensor";
	BAD(&s, "unsupported rebuild function");
	s = base();
	s.fn_mod = "torch";
	BAD(&s, "unsupported rebuild function torch._rebuild_tensor_v2");
	s = base();
	s.fn = "_rebuild_tensor_v3"; /* v2 arguments: no dtype */
	BAD(&s, "takes 7 or 8 arguments, got 6");
	s = base();
	s.fn = "_rebuild_tensor_v3";
	s.st_cls = "UntypedStorage";
	s.dtype = "float4_e2m1fn_x2";
	BAD(&s, "unsupported dtype torch.float4_e2m1fn_x2");
	s.dtype = "uint16";
	s.numel = 3; /* 12 elements of 2 bytes need 24 */
	BAD(&s, "needs 24 bytes");
	s = base();
	s.dtype = "float32"; /* v2 with 7 args whose last is no dict */
	BAD(&s, "metadata argument is not a dict");
	s = base();
	s.meta = true;
	s.dtype = "float32"; /* 8 args for v2 */
	BAD(&s, "takes 6 or 7 arguments, got 8");
	s = base();
	s.key =
	    "1234567890123456789012345678901234567890123456789012345678901234";
	BAD(&s, "bad storage key (64 bytes)");
	s = base();
	s.key = "a/b";
	BAD(&s, "bad storage key");
	s = base();
	s.key = "";
	BAD(&s, "bad storage key (0 bytes)");
	s = base();
	s.tag = "stor";
	BAD(&s, "tag is not 'storage'");
	s = base();
	s.hooks_none = true;
	BAD(&s, "backward hooks are a None");

	/* not a tensor at all: what a BYTE_IO item's data.pkl holds */
	flx_error_init(&e);
	memset(&t, 0, sizeof(t));
	rc = flx_tensor_pkl_parse("\x80\x02K*.", 5, "x.pkl", &t, &e);
	CHECK_EQ(rc, -EINVAL);
	CHECK(strstr(e.text, "root is a int") != NULL);
	flx_error_init(&e);
	rc = flx_tensor_pkl_parse("\x80\x02"
				  "cm\nC\n)\x81.",
				  10, "x.pkl", &t, &e);
	CHECK_EQ(rc, -EINVAL);
	CHECK(strstr(e.text, "not a tensor rebuild call") != NULL);
	/* pickle errors come through with the pickle's message */
	{
		struct pb p;

		s = base();
		build(&p, &s);
		for (size_t k = 0; k < p.n; k++) {
			flx_error_init(&e);
			rc = flx_tensor_pkl_parse(p.b, k, "x.pkl", &t, &e);
			if (rc != -EINVAL || strncmp(e.text, "pickle:", 7)) {
				fprintf(stderr, "prefix %zu: %d %s\n", k, rc,
					e.text);
				check_failures++;
			}
		}
		/* persistent id with a wrong shape */
		p.n = 0;
		LIT(&p, "\x80\x02"
			"ctorch._utils\n_rebuild_tensor_v2\n(K\x01QK"
			"\x00))\x89}tR.");
		flx_error_init(&e);
		rc = flx_tensor_pkl_parse(p.b, p.n, "x.pkl", &t, &e);
		CHECK_EQ(rc, -EINVAL);
		CHECK(strstr(e.text, "persistent id is not a 5-tuple") != NULL);
		/* storage not a persistent id */
		p.n = 0;
		LIT(&p, "\x80\x02"
			"ctorch._utils\n_rebuild_tensor_v2\n(NK"
			"\x00))\x89}tR.");
		flx_error_init(&e);
		rc = flx_tensor_pkl_parse(p.b, p.n, "x.pkl", &t, &e);
		CHECK_EQ(rc, -EINVAL);
		CHECK(strstr(e.text, "not a persistent id") != NULL);
	}
}

int main(void)
{
	test_vectors();
	test_vector_facts();
	test_handmade_ok();
	test_handmade_bad();
	return CHECK_RESULT();
}
