/* SPDX-License-Identifier: MIT */
/*
 * The pickle VM against pickles made by CPython (protocols 0-5), numpy and
 * torch 1.13/2.6 DCP saves (data/vectors.h, from data/gen_vectors.py), then
 * against hand-made and damaged inputs.  Expected trees come from CPython's
 * own unpickler (see gen_vectors.py), printed in a canonical form that
 * dump() below reproduces from our tree.  Reader loads must give the trees
 * and errors of buffer loads, through windows small enough that every
 * opcode straddles an edge, and leave long payloads where numpy's bytes
 * are (offsets found by Python) without reading them.
 */
#include "check.h"
#include "data/vectors.h"
#include "pickle.h"
#include "reader.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 2 MiB blocks allocated (the pickle arena's and memo's, pickle.c
 * huge_alloc()), counted as count_alloc.h counts malloc: not under ASan,
 * which owns the allocator. */
#define HUGE_BLOCK ((size_t)2 << 20)
#if defined(__SANITIZE_ADDRESS__)
#define HUGE_COUNT_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HUGE_COUNT_OFF 1
#endif
#endif
#ifndef HUGE_COUNT_OFF
extern void *__libc_memalign(size_t align, size_t n);

static unsigned long nhuge;

int posix_memalign(void **out, size_t align, size_t n)
{
	void *b = __libc_memalign(align, n);

	if (!b)
		return ENOMEM;
	nhuge += n == HUGE_BLOCK;
	*out = b;
	return 0;
}
#endif

#define NVEC (sizeof(pkl_vecs) / sizeof(pkl_vecs[0]))

/* ------------------------------------------------------- canonical dump */

struct sbuf {
	char *p;
	size_t n, cap;
	size_t budget; /* nodes left to visit: a shared DAG can be huge */
	/* reader loads: print payload offsets too, and take a payload left
	 * in the input from src[0..srclen) (counted in refs) */
	bool offs;
	const unsigned char *src;
	size_t srclen;
	size_t refs;
	size_t long_bytes; /* bytes payloads over 1 byte visited */
};

static void put(struct sbuf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;

		while (cap < b->n + n + 1)
			cap *= 2;
		b->p = realloc(b->p, cap);
		if (!b->p)
			abort();
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
}

static void puts_(struct sbuf *b, const char *s)
{
	put(b, s, strlen(s));
}

static void put_esc(struct sbuf *b, const char *s, size_t n)
{
	puts_(b, "\"");
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		char t[8];

		if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
			put(b, (const char *)&c, 1);
		} else {
			snprintf(t, sizeof(t), "\\x%02x", c);
			puts_(b, t);
		}
	}
	puts_(b, "\"");
}

/* Mirrors dump() in gen_vectors.py. */
static void dump(struct sbuf *b, const flx_pv *v, int depth)
{
	char t[64];

	if (b->budget == 0)
		return;
	b->budget--;
	if (depth >= FLX_PV_MAX_WALK_DEPTH) {
		puts_(b, "~");
		return;
	}
	switch (v->kind) {
	case FLX_PV_NONE:
		puts_(b, "N");
		break;
	case FLX_PV_BOOL:
		puts_(b, v->u.b ? "T" : "F");
		break;
	case FLX_PV_INT:
		snprintf(t, sizeof(t), "i%" PRId64, v->u.i);
		puts_(b, t);
		break;
	case FLX_PV_BIGINT:
		puts_(b, "I");
		break;
	case FLX_PV_FLOAT: {
		uint64_t bits;

		memcpy(&bits, &v->u.f, sizeof(bits));
		snprintf(t, sizeof(t), "f%016" PRIx64, bits);
		puts_(b, t);
		break;
	}
	case FLX_PV_STR:
	case FLX_PV_BYTES: {
		const char *s = v->u.str.s;

		puts_(b, v->kind == FLX_PV_STR ? "s" : "b");
		if (v->kind == FLX_PV_BYTES && v->u.str.len > 1)
			b->long_bytes++;
		if (!s) {
			b->refs++;
			if (b->src && v->u.str.off <= b->srclen &&
			    v->u.str.len <= b->srclen - v->u.str.off)
				s = (const char *)b->src + v->u.str.off;
		}
		if (s)
			put_esc(b, s, v->u.str.len);
		else
			puts_(b, "?");
		if (b->offs) {
			snprintf(t, sizeof(t), "@%" PRIu64, v->u.str.off);
			puts_(b, t);
		}
		break;
	}
	case FLX_PV_TUPLE:
	case FLX_PV_LIST:
	case FLX_PV_SET: {
		const char *br = v->kind == FLX_PV_TUPLE  ? "()"
				 : v->kind == FLX_PV_LIST ? "[]"
							  : "{}";

		put(b, br, 1);
		for (size_t i = 0; i < v->u.seq.n; i++) {
			if (i)
				puts_(b, ",");
			dump(b, v->u.seq.v[i], depth + 1);
		}
		put(b, br + 1, 1);
		break;
	}
	case FLX_PV_DICT:
		puts_(b, "<");
		for (size_t i = 0; i < v->u.dict.n; i++) {
			if (i)
				puts_(b, ",");
			dump(b, v->u.dict.kv[2 * i], depth + 1);
			puts_(b, ":");
			dump(b, v->u.dict.kv[2 * i + 1], depth + 1);
		}
		puts_(b, ">");
		break;
	case FLX_PV_GLOBAL:
		puts_(b, "g(");
		put_esc(b, v->u.global.module, strlen(v->u.global.module));
		puts_(b, " ");
		put_esc(b, v->u.global.name, strlen(v->u.global.name));
		puts_(b, ")");
		break;
	case FLX_PV_OBJ:
		puts_(b, v->newobj ? "O(" : "R(");
		dump(b, v->u.obj.cls, depth + 1);
		puts_(b, ";");
		dump(b, v->u.obj.args, depth + 1);
		puts_(b, ";");
		if (v->u.obj.state)
			dump(b, v->u.obj.state, depth + 1);
		else
			puts_(b, "-");
		puts_(b, ")");
		break;
	case FLX_PV_PERSID:
		puts_(b, "P(");
		dump(b, v->u.persid.pid, depth + 1);
		puts_(b, ")");
		break;
	}
}

static uint64_t fnv64(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325u;

	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * 0x100000001b3u;
	return h;
}

/* Does the tree match the generator's expectation? */
static bool matches(const flx_pv *root, const char *expect, const char *file)
{
	struct sbuf b = {.budget = 10000000}; /* a bad decode may loop */
	char h[64];
	bool ok;

	dump(&b, root, 0);
	if (strncmp(expect, "fnv:", 4) == 0) {
		snprintf(h, sizeof(h), "fnv:%016" PRIx64 ":%zu",
			 fnv64(b.p, b.n), b.n);
		ok = strcmp(h, expect) == 0;
	} else {
		ok = strcmp(b.p, expect) == 0;
	}
	if (!ok)
		fprintf(stderr,
			"%s: tree differs\n got: %.600s\nwant: %.600s\n", file,
			b.p, expect);
	free(b.p);
	return ok;
}

/* ------------------------------------------------------------- helpers */

/* NULL-safe accessors, so a wrong tree fails a CHECK instead of crashing */
static int kind(const flx_pv *v)
{
	return v ? (int)v->kind : -1;
}

static const flx_pv *state(const flx_pv *v)
{
	return v && v->kind == FLX_PV_OBJ ? v->u.obj.state : NULL;
}

static const flx_pv *args(const flx_pv *v)
{
	return v && v->kind == FLX_PV_OBJ ? v->u.obj.args : NULL;
}

static bool is_newobj(const flx_pv *v)
{
	return v && v->kind == FLX_PV_OBJ && v->newobj;
}

static int load(const void *buf, size_t len, flx_pickle **p, flx_error *e)
{
	flx_error_init(e);
	return flx_pickle_load(buf, len, "t.pkl", NULL, p, e);
}

static void expect_fail(const char *s, size_t n, const char *needle, int line)
{
	flx_pickle *p = NULL;
	flx_error e;
	int rc = load(s, n, &p, &e);

	if (rc != -EINVAL || p != NULL) {
		fprintf(stderr, "line %d: expected -EINVAL, got %d\n", line,
			rc);
		check_failures++;
		flx_pickle_free(p);
		return;
	}
	if (needle && !strstr(e.text, needle)) {
		fprintf(stderr, "line %d: error '%s' lacks '%s'\n", line,
			e.text, needle);
		check_failures++;
	}
	if (strcmp(e.file, "t.pkl") != 0) {
		fprintf(stderr, "line %d: error file '%s'\n", line, e.file);
		check_failures++;
	}
}

#define FAILS(s, needle) expect_fail((s), sizeof(s) - 1, (needle), __LINE__)

static const flx_pv *root_of(const char *s, size_t n, flx_pickle **p)
{
	flx_error e;
	int rc = load(s, n, p, &e);

	if (rc) {
		fprintf(stderr, "load failed: %s\n", e.text);
		check_failures++;
		return NULL;
	}
	return flx_pickle_root(*p);
}

#define ROOT(s, p) root_of((s), sizeof(s) - 1, (p))

/* Load with limits; only the return code matters. */
static int limited(const char *s, size_t n, const flx_pickle_limits *lim,
		   flx_error *e)
{
	flx_pickle *p = NULL;
	int rc;

	flx_error_init(e);
	rc = flx_pickle_load(s, n, "t", lim, &p, e);
	if (rc)
		CHECK(p == NULL); /* out untouched on failure */
	flx_pickle_free(p);
	return rc;
}

#define LIMITED(s, lim, e) limited((s), sizeof(s) - 1, (lim), (e))

/* -------------------------------------------------------------- vectors */

static void test_vectors(void)
{
	size_t nproto[6] = {0}, nmeta = 0;

	CHECK(NVEC >= 26);
	for (size_t i = 0; i < NVEC; i++) {
		size_t len = 0;
		unsigned char *buf = check_read_file(pkl_vecs[i].file, &len);
		flx_pickle *p = NULL;
		flx_error e;
		int rc;

		CHECK(buf != NULL);
		if (!buf)
			continue;
		rc = load(buf, len, &p, &e);
		if (rc)
			fprintf(stderr, "%s: %s\n", pkl_vecs[i].file, e.text);
		CHECK_EQ(rc, 0);
		if (!rc) {
			CHECK(matches(flx_pickle_root(p), pkl_vecs[i].expect,
				      pkl_vecs[i].file));
			if (buf[0] == 0x80 && buf[1] <= 5)
				nproto[buf[1]]++;
			else
				nproto[0]++;
			if (strstr(pkl_vecs[i].file, "metadata"))
				nmeta++;
		}
		flx_pickle_free(p);
		free(buf);
	}
	/* Every protocol is represented, and both torch versions. */
	for (int v = 0; v <= 5; v++)
		CHECK(nproto[v] >= 3 || (v == 1 && nproto[1] == 0));
	CHECK_EQ(nmeta, 2);
}

/* Structural facts the dumps cannot show: sharing through the memo. */
static void test_memo_sharing(void)
{
	for (int proto = 0; proto <= 5; proto++) {
		char name[64];
		size_t len = 0;
		unsigned char *buf;
		flx_pickle *p = NULL;
		flx_error e;
		const flx_pv *r;

		snprintf(name, sizeof(name), "pickle/memo_p%d.pkl", proto);
		buf = check_read_file(name, &len);
		CHECK(buf != NULL);
		if (!buf)
			continue;
		CHECK_EQ(load(buf, len, &p, &e), 0);
		r = flx_pickle_root(p);
		CHECK_EQ(flx_pv_len(r), 7);
		CHECK(flx_pv_item(r, 0) == flx_pv_item(r, 1));
		CHECK_STR(flx_pv_str(flx_pv_item(r, 0)), "shared string");
		CHECK(flx_pv_item(r, 2) == flx_pv_item(r, 3));
		CHECK(flx_pv_item(r, 4) == flx_pv_item(r, 5));
		CHECK(flx_pv_item(flx_pv_item(r, 4), 0) == flx_pv_item(r, 2));
		CHECK(flx_pv_dict_get(flx_pv_item(r, 6), "k") ==
		      flx_pv_item(r, 0));
		flx_pickle_free(p);
		free(buf);
	}
}

static void test_objects(void)
{
	size_t len = 0;
	unsigned char *buf = check_read_file("pickle/objects_p4.pkl", &len);
	flx_pickle *p = NULL;
	flx_error e;
	const flx_pv *r, *pt, *st, *od;
	int64_t x;

	CHECK(buf != NULL);
	if (!buf)
		return;
	CHECK_EQ(load(buf, len, &p, &e), 0);
	r = flx_pickle_root(p);
	CHECK_EQ(flx_pv_len(r), 10);
	/* dataclass: NEWOBJ(Point, ()) + BUILD(dict) */
	pt = flx_pv_item(r, 0);
	CHECK(flx_pv_is_obj_of(pt, "Point"));
	CHECK(flx_pv_is_global(flx_pv_obj_class(pt), "__main__", "Point"));
	CHECK(!flx_pv_is_global(flx_pv_obj_class(pt), "other", "Point"));
	CHECK(is_newobj(pt));
	st = state(pt);
	CHECK(flx_pv_int(flx_pv_dict_get(st, "x"), &x) && x == 1);
	CHECK_EQ(kind(flx_pv_dict_get(st, "y")), FLX_PV_FLOAT);
	CHECK_EQ(flx_pv_len(flx_pv_dict_get(st, "tags")), 1);
	CHECK(flx_pv_dict_get(st, "nope") == NULL);
	/* __getstate__ tuple (TensorProperties-like) */
	st = state(flx_pv_item(r, 1));
	CHECK(kind(st) == FLX_PV_TUPLE && flx_pv_len(st) == 2);
	/* __reduce__: REDUCE(Reduced, (3, 'x')) */
	CHECK(flx_pv_is_obj_of(flx_pv_item(r, 2), "Reduced"));
	CHECK(!is_newobj(flx_pv_item(r, 2)));
	CHECK_STR(flx_pv_str(flx_pv_item(args(flx_pv_item(r, 2)), 1)), "x");
	/* OrderedDict() / OrderedDict(a=1) / state dict with _metadata */
	CHECK_EQ(kind(flx_pv_item(r, 5)), FLX_PV_DICT);
	CHECK_EQ(flx_pv_len(flx_pv_item(r, 5)), 0);
	CHECK_EQ(kind(flx_pv_item(r, 6)), FLX_PV_DICT);
	CHECK(flx_pv_int(flx_pv_dict_get(flx_pv_item(r, 6), "a"), &x) &&
	      x == 1);
	od = flx_pv_item(r, 7);
	CHECK_EQ(kind(od), FLX_PV_DICT);
	CHECK_EQ(flx_pv_len(od), 2);
	CHECK(flx_pv_int(flx_pv_dict_get(od, "b"), &x) && x == 2);
	flx_pickle_free(p);
	free(buf);
}

static void test_scalars(void)
{
	size_t len = 0;
	unsigned char *buf = check_read_file("pickle/scalars_p2.pkl", &len);
	flx_pickle *p = NULL;
	flx_error e;
	const flx_pv *ints, *strs;
	int64_t v;

	CHECK(buf != NULL);
	if (!buf)
		return;
	CHECK_EQ(load(buf, len, &p, &e), 0);
	ints = flx_pv_item(flx_pickle_root(p), 0);
	CHECK(flx_pv_int(flx_pv_item(ints, 8), &v) && v == INT32_MIN);
	CHECK(flx_pv_int(flx_pv_item(ints, 12), &v) && v == INT64_MAX);
	CHECK(flx_pv_int(flx_pv_item(ints, 13), &v) && v == INT64_MIN);
	CHECK_EQ(kind(flx_pv_item(ints, 14)), FLX_PV_BIGINT);
	CHECK_EQ(kind(flx_pv_item(ints, 15)), FLX_PV_BIGINT);
	CHECK_EQ(kind(flx_pv_item(ints, 19)), FLX_PV_BIGINT);
	CHECK(!flx_pv_int(flx_pv_item(ints, 19), &v));
	strs = flx_pv_item(flx_pickle_root(p), 2);
	CHECK_STR(flx_pv_str(flx_pv_item(strs, 2)),
		  "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
	CHECK(kind(flx_pv_item(strs, 4)) == FLX_PV_STR &&
	      flx_pv_item(strs, 4)->u.str.len == 20); /* holds a NUL */
	CHECK_EQ(strlen(flx_pv_str(flx_pv_item(strs, 6))), 256);
	flx_pickle_free(p);
	free(buf);
}

/* A real torch 2.6 DCP .metadata, walked the way dcp.c will. */
static void test_dcp_metadata(void)
{
	static const char *const files[] = {"pickle/t113_dcp_metadata.pkl",
					    "pickle/t26_dcp_metadata.pkl"};

	for (int i = 0; i < 2; i++) {
		size_t len = 0;
		unsigned char *buf = check_read_file(files[i], &len);
		flx_pickle *p = NULL;
		flx_error e;
		const flx_pv *r, *sdm, *w, *props, *sd;

		CHECK(buf != NULL);
		if (!buf)
			continue;
		CHECK_EQ(load(buf, len, &p, &e), 0);
		r = flx_pickle_root(p);
		CHECK(flx_pv_is_obj_of(r, "Metadata"));
		sdm = flx_pv_dict_get(state(r), "state_dict_metadata");
		CHECK_EQ(flx_pv_len(sdm), 3);
		w = flx_pv_dict_get(sdm, "w");
		CHECK(flx_pv_is_obj_of(w, "TensorStorageMetadata"));
		props = flx_pv_dict_get(state(w), "properties");
		CHECK(flx_pv_is_obj_of(props, "TensorProperties"));
		CHECK(flx_pv_is_global(flx_pv_item(state(props), 0), "torch",
				       "float32"));
		CHECK(flx_pv_is_obj_of(flx_pv_dict_get(sdm, "step"),
				       "BytesStorageMetadata"));
		CHECK(state(flx_pv_dict_get(sdm, "step")) == NULL);
		sd = flx_pv_dict_get(state(r), "storage_data");
		CHECK_EQ(flx_pv_len(sd), 3);
		if (flx_pv_len(sd) == 3) {
			CHECK(flx_pv_is_obj_of(sd->u.dict.kv[0],
					       "MetadataIndex"));
			CHECK(
			    flx_pv_is_obj_of(sd->u.dict.kv[1], "_StorageInfo"));
		}
		flx_pickle_free(p);
		free(buf);
	}
}

/* -------------------------------------------------------- hand-made ok */

static void test_text_opcodes(void)
{
	flx_pickle *p = NULL;
	const flx_pv *r;
	int64_t v;

	r = ROOT("S'a\\x41\\n\\101\\q'\n.", &p);
	CHECK(r && r->kind == FLX_PV_STR && r->u.str.len == 6 &&
	      memcmp(r->u.str.s, "aA\nA\\q", 6) == 0);
	flx_pickle_free(p);
	r = ROOT("T\x03\x00\x00\x00"
		 "abc.",
		 &p);
	CHECK_STR(flx_pv_str(r), "abc");
	flx_pickle_free(p);
	r = ROOT("U\x02hi.", &p);
	CHECK_STR(flx_pv_str(r), "hi");
	flx_pickle_free(p);
	r = ROOT("I01\n.", &p);
	CHECK(r && r->kind == FLX_PV_BOOL && r->u.b);
	CHECK(flx_pv_int(r, &v) && v == 1);
	flx_pickle_free(p);
	r = ROOT("I-9223372036854775808\n.", &p);
	CHECK(flx_pv_int(r, &v) && v == INT64_MIN);
	flx_pickle_free(p);
	r = ROOT("I9223372036854775808\n.", &p);
	CHECK(r && r->kind == FLX_PV_BIGINT);
	flx_pickle_free(p);
	r = ROOT("L123L\n.", &p);
	CHECK(flx_pv_int(r, &v) && v == 123);
	flx_pickle_free(p);
	r = ROOT("L99999999999999999999999\n.", &p);
	CHECK(r && r->kind == FLX_PV_BIGINT);
	flx_pickle_free(p);
	r = ROOT("F-1.5e3\n.", &p);
	CHECK(r && r->kind == FLX_PV_FLOAT && r->u.f == -1500.0);
	flx_pickle_free(p);
	r = ROOT("Vx\\u20ac\\\\u0041\\\\\\u0041\xe9\n.", &p);
	CHECK_STR(flx_pv_str(r), "x\xe2\x82\xac\\\\u0041\\\\A\xc3\xa9");
	flx_pickle_free(p);
	/* PUT/GET text, DUP, POP right after MARK drops the mark */
	r = ROOT("(Vs\np7\n0g7\n2t.", &p);
	CHECK(flx_pv_len(r) == 2 && flx_pv_item(r, 0) == flx_pv_item(r, 1));
	flx_pickle_free(p);
	r = ROOT("(0N.", &p);
	CHECK(r && r->kind == FLX_PV_NONE);
	flx_pickle_free(p);
	/* PERSID and BINPERSID */
	r = ROOT("Pkey\n.", &p);
	CHECK_EQ(kind(r), FLX_PV_PERSID);
	if (kind(r) == FLX_PV_PERSID)
		CHECK_STR(flx_pv_str(r->u.persid.pid), "key");
	flx_pickle_free(p);
	r = ROOT("\x80\x02K\x05Q.", &p);
	CHECK(r && r->kind == FLX_PV_PERSID &&
	      flx_pv_int(r->u.persid.pid, &v) && v == 5);
	flx_pickle_free(p);
	/* INST and OBJ are inert objects */
	r = ROOT("(I1\nimod\ncls\n.", &p);
	CHECK(flx_pv_is_obj_of(r, "cls") && flx_pv_len(r->u.obj.args) == 1);
	flx_pickle_free(p);
	r = ROOT("(cmod\ncls\nI1\nI2\no.", &p);
	CHECK(flx_pv_is_obj_of(r, "cls") && flx_pv_len(r->u.obj.args) == 2);
	flx_pickle_free(p);
}

static void test_binary_opcodes(void)
{
	flx_pickle *p = NULL;
	const flx_pv *r;
	int64_t v;

	/* LONG1 with redundant sign bytes still fits */
	r = ROOT("\x80\x02\x8a\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff.",
		 &p);
	CHECK(flx_pv_int(r, &v) && v == -1);
	flx_pickle_free(p);
	r = ROOT("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00.", &p);
	CHECK(r && r->kind == FLX_PV_BIGINT); /* 2^63 */
	flx_pickle_free(p);
	r = ROOT("\x80\x02\x8a\x00.", &p);
	CHECK(flx_pv_int(r, &v) && v == 0);
	flx_pickle_free(p);
	r = ROOT("\x80\x02\x8b\x02\x00\x00\x00\x00\x80.", &p);
	CHECK(flx_pv_int(r, &v) && v == -32768);
	flx_pickle_free(p);
	r = ROOT("\x80\x02J\xfe\xff\xff\xff.", &p);
	CHECK(flx_pv_int(r, &v) && v == -2);
	flx_pickle_free(p);
	r = ROOT("\x80\x05\x96\x02\x00\x00\x00\x00\x00\x00\x00\x00\x01.", &p);
	CHECK(r && r->kind == FLX_PV_BYTES && r->u.str.len == 2 &&
	      r->u.str.s[1] == 1 && r->u.str.s[2] == 0);
	flx_pickle_free(p);
	/* FRAME covering exactly the rest */
	r = ROOT("\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00N.", &p);
	CHECK(r && r->kind == FLX_PV_NONE);
	flx_pickle_free(p);
	/* OrderedDict via NEWOBJ is a dict; with args it stays an object */
	r = ROOT("\x80\x02"
		 "ccollections\nOrderedDict\n)\x81.",
		 &p);
	CHECK(r && r->kind == FLX_PV_DICT);
	flx_pickle_free(p);
	r = ROOT("\x80\x02"
		 "ccollections\nOrderedDict\n]\x85R.",
		 &p);
	CHECK(flx_pv_is_obj_of(r, "OrderedDict"));
	flx_pickle_free(p);
	/* NEWOBJ_EX with empty kwargs */
	r = ROOT("\x80\x04\x8c\x01m\x8c\x01"
		 "c\x93)}\x92.",
		 &p);
	CHECK(flx_pv_is_obj_of(r, "c") && r->newobj);
	flx_pickle_free(p);
	/* a list that contains itself (memo cycle) stays a plain graph */
	r = ROOT("\x80\x04]\x94h\x00"
		 "a.",
		 &p);
	CHECK(r && flx_pv_item(r, 0) == r);
	flx_pickle_free(p);
	/* bytes after STOP are ignored */
	r = ROOT("N.\xff\xff garbage", &p);
	CHECK(r && r->kind == FLX_PV_NONE);
	flx_pickle_free(p);
	/* BUILD with None state is still a state */
	r = ROOT("\x80\x02"
		 "cm\nC\n)\x81N"
		 "b.",
		 &p);
	CHECK_EQ(kind(state(r)), FLX_PV_NONE);
	flx_pickle_free(p);
}

static void test_helpers(void)
{
	flx_pickle *p = NULL;
	const flx_pv *r = ROOT("\x80\x02}X\x01\x00\x00\x00kC\x01"
			       "bs.",
			       &p);
	int64_t v;

	CHECK(flx_pv_dict_get(NULL, "k") == NULL);
	CHECK(flx_pv_dict_get(r, NULL) == NULL);
	CHECK_EQ(kind(flx_pv_dict_get(r, "k")), FLX_PV_BYTES);
	CHECK(flx_pv_str(flx_pv_dict_get(r, "k")) == NULL);
	CHECK(flx_pv_item(r, 0) == NULL);
	CHECK(flx_pv_item(NULL, 0) == NULL);
	CHECK_EQ(flx_pv_len(r), 1);
	CHECK_EQ(flx_pv_len(flx_pv_dict_get(r, "k")), 0);
	CHECK_EQ(flx_pv_len(NULL), 0);
	CHECK(!flx_pv_int(r, &v));
	CHECK(!flx_pv_int(NULL, &v));
	CHECK(flx_pv_obj_class(r) == NULL);
	CHECK(!flx_pv_is_obj_of(NULL, "x"));
	CHECK(!flx_pv_is_global(NULL, NULL, "x"));
	CHECK_STR(flx_pv_kind_name(r), "dict");
	CHECK_STR(flx_pv_kind_name(NULL), "nothing");
	CHECK(flx_pickle_root(NULL) == NULL);
	flx_pickle_free(p);
	flx_pickle_free(NULL);
}

/* ------------------------------------------------- arena, memo, sharing */

/* Pickles too big to spell out, written opcode by opcode. */
static void put_u8(struct sbuf *b, unsigned v)
{
	char c = (char)(v & 0xff);

	put(b, &c, 1);
}

static void put_le(struct sbuf *b, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		put_u8(b, (unsigned)(v >> (8 * i)));
}

static void put_binint(struct sbuf *b, int64_t v)
{
	put_u8(b, 'J');
	put_le(b, (uint64_t)v, 4);
}

static void put_binget(struct sbuf *b, uint32_t idx)
{
	put_u8(b, 'j');
	put_le(b, idx, 4);
}

static bool str_is(const flx_pv *v, const char *want)
{
	const char *s = flx_pv_str(v);

	return s && strcmp(s, want) == 0;
}

static bool int_is(const flx_pv *v, int64_t want)
{
	int64_t x;

	return flx_pv_int(v, &x) && x == want;
}

/* Lists grown across many arena blocks: by APPENDS batches (a big input:
 * 2 MiB blocks from the start); by single APPENDs of a shared value, so
 * the array ends the arena and grows in place; by single APPENDs taking
 * turns with a second list, so each growth copies. */
static void test_big_lists(void)
{
	enum { N = 300000, M = 3000 };
	struct sbuf b = {0};
	flx_pickle *p = NULL;
	const flx_pv *r, *l0, *l1, *l2;
	bool ok = true;

	put(&b, "\x80\x02]", 3);
	for (int i = 0; i < N; i++) {
		if (i % 1000 == 0)
			put_u8(&b, '(');
		put_binint(&b, (int64_t)i * 7 - 5);
		if (i % 1000 == 999)
			put_u8(&b, 'e');
	}
	put_u8(&b, '.');
	CHECK(b.n > ((size_t)1 << 20));
	r = root_of(b.p, b.n, &p);
	CHECK_EQ(flx_pv_len(r), N);
	for (size_t i = 0; ok && i < N; i++)
		ok = int_is(flx_pv_item(r, i), (int64_t)i * 7 - 5);
	CHECK(ok);
	flx_pickle_free(p);
	p = NULL;

	/* a small input, so the arena starts with small blocks */
	b.n = 0;
	put(&b,
	    "\x80\x02]q\x00"
	    "0]q\x01"
	    "0]q\x02"
	    "0",
	    14);
	for (int i = 0; i < M; i++)
		put(&b, "h\x00Na0", 5);
	for (int i = 0; i < M; i++) {
		put(&b, "h\x01", 2);
		put_binint(&b, i);
		put(&b, "a0h\x02", 4);
		put_binint(&b, -i);
		put(&b, "a0", 2);
	}
	put(&b, "h\x00h\x01h\x02\x87.", 8);
	r = root_of(b.p, b.n, &p);
	l0 = flx_pv_item(r, 0);
	l1 = flx_pv_item(r, 1);
	l2 = flx_pv_item(r, 2);
	CHECK(flx_pv_len(l0) == M && flx_pv_len(l1) == M &&
	      flx_pv_len(l2) == M);
	for (size_t i = 0; ok && i < M; i++)
		ok = kind(flx_pv_item(l0, i)) == FLX_PV_NONE &&
		     int_is(flx_pv_item(l1, i), (int64_t)i) &&
		     int_is(flx_pv_item(l2, i), -(int64_t)i);
	CHECK(ok);
	flx_pickle_free(p);
	p = NULL;
	free(b.p);
}

/* A dict filled by SETITEMS batches and SETITEMs with other values made in
 * between; a memoized list grown after megabytes of other nodes, seen the
 * same through both of its references. */
static void test_big_dict_and_memo(void)
{
	enum { BATCHES = 40, PER = 1000, FILL = 60000 };
	struct sbuf b = {0};
	flx_pickle *p = NULL;
	const flx_pv *r, *d, *l;
	char key[32];
	bool ok = true;
	size_t n = 0;

	/* memo 0: the dict, 1: a list, 2: the latest filler list */
	put(&b,
	    "\x80\x02}q\x00"
	    "0]q\x01"
	    "0",
	    10);
	for (int k = 0; k < BATCHES; k++) {
		put(&b, "h\x00(", 3);
		for (int i = 0; i < PER; i++) {
			int len =
			    snprintf(key, sizeof(key), "k%d", k * PER + i);

			put_u8(&b, 0x8c);
			put_u8(&b, (unsigned)len);
			put(&b, key, (size_t)len);
			put_binint(&b, k * PER + i);
		}
		put(&b, "u0", 2);
		/* other values in between: the dict's array ends no block */
		put(&b, "]q\x02(", 4);
		for (int i = 0; i < FILL / BATCHES; i++)
			put(&b, "}", 1);
		put(&b, "e0h\x01", 4);
		put_binint(&b, k);
		put(&b, "a0", 2);
		/* SETITEM repeating the first key: the last value wins */
		put(&b, "h\x00\x8c\x02k0", 6);
		put_binint(&b, -k);
		put(&b, "s0", 2);
	}
	put(&b, "(h\x00h\x01h\x02h\x01t.", 11);
	r = root_of(b.p, b.n, &p);
	CHECK_EQ(flx_pv_len(r), 4);
	d = flx_pv_item(r, 0);
	l = flx_pv_item(r, 1);
	CHECK_EQ(kind(d), FLX_PV_DICT);
	CHECK_EQ(flx_pv_len(d), BATCHES * PER + BATCHES);
	if (flx_pv_len(d) == BATCHES * PER + BATCHES) {
		for (int k = 0; ok && k < BATCHES; k++) {
			for (int i = 0; ok && i < PER; i++) {
				snprintf(key, sizeof(key), "k%d", k * PER + i);
				ok = str_is(d->u.dict.kv[2 * n], key) &&
				     int_is(d->u.dict.kv[2 * n + 1],
					    k * PER + i);
				n++;
			}
			ok = ok && int_is(d->u.dict.kv[2 * n + 1], -k);
			n++;
		}
	}
	CHECK(ok);
	CHECK(int_is(flx_pv_dict_get(d, "k0"), -(BATCHES - 1)));
	CHECK(int_is(flx_pv_dict_get(d, "k1"), 1));
	CHECK_EQ(flx_pv_len(l), BATCHES);
	CHECK(flx_pv_item(r, 3) == l);
	for (size_t i = 0; i < BATCHES; i++)
		CHECK(int_is(flx_pv_item(l, i), (int64_t)i));
	CHECK_EQ(flx_pv_len(flx_pv_item(r, 2)), FILL / BATCHES);
	flx_pickle_free(p);
	p = NULL;
	free(b.p);
}

/* Strings and bytes bigger than an arena block get blocks of their own,
 * also as the very first allocation; the blocks around keep working. */
static void test_big_strings(void)
{
	static const size_t sizes[] = {100000, 3u << 20};
	struct sbuf b = {0};
	flx_pickle *p = NULL;
	const flx_pv *r, *s;

	for (size_t k = 0; k < 2; k++) {
		size_t n = sizes[k];
		bool ok = true;

		b.n = 0;
		put(&b, "\x80\x04(", 3);
		put_u8(&b, 0x8e); /* BINBYTES8 */
		put_le(&b, n, 8);
		for (size_t i = 0; i < n; i++)
			put_u8(&b, (unsigned)(i * 31 + k));
		put(&b, "\x8c\x02hiK\x07X", 7);
		put_le(&b, n + 1, 4);
		for (size_t i = 0; i <= n; i++)
			put_u8(&b, 'a' + (unsigned)(i % 26));
		put(&b, "t.", 2);
		r = root_of(b.p, b.n, &p);
		CHECK_EQ(flx_pv_len(r), 4);
		s = flx_pv_item(r, 0);
		CHECK(kind(s) == FLX_PV_BYTES && s->u.str.len == n);
		for (size_t i = 0; ok && kind(s) == FLX_PV_BYTES && i < n; i++)
			ok = (unsigned char)s->u.str.s[i] ==
			     (unsigned char)(i * 31 + k);
		CHECK(ok && s->u.str.s[n] == '\0');
		CHECK_STR(flx_pv_str(flx_pv_item(r, 1)), "hi");
		CHECK(int_is(flx_pv_item(r, 2), 7));
		s = flx_pv_item(r, 3);
		CHECK(kind(s) == FLX_PV_STR && s->u.str.len == n + 1);
		for (size_t i = 0; ok && kind(s) == FLX_PV_STR && i <= n; i++)
			ok = s->u.str.s[i] == 'a' + (char)(i % 26);
		CHECK(ok && s->u.str.s[n + 1] == '\0');
		flx_pickle_free(p);
		p = NULL;
	}
	free(b.p);
}

/* More memo entries than one memo chunk holds, read back from either side
 * of every chunk edge; slots never set stay out of range. */
static void test_big_memo(void)
{
	static const size_t counts[] = {100000, 300000};
	static const uint32_t probes[] = {0,	 1,	511,	512,	65535,
					  65536, 99999, 262143, 262144, 299999};
	struct sbuf b = {0};
	flx_pickle *p = NULL;
	flx_error e;
	const flx_pv *r;

	for (size_t k = 0; k < 2; k++) {
		size_t n = counts[k], np = 0;

		b.n = 0;
		put(&b, "\x80\x04", 2);
		for (size_t i = 0; i < n; i++) {
			put_binint(&b, (int64_t)i * 3);
			put_u8(&b, 0x94); /* MEMOIZE */
			put_u8(&b, '0');
		}
		put_u8(&b, '(');
		for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]);
		     i++) {
			if (probes[i] >= n)
				continue;
			put_binget(&b, probes[i]);
			np++;
		}
		put(&b, "t.", 2);
		r = root_of(b.p, b.n, &p);
		CHECK_EQ(flx_pv_len(r), np);
		for (size_t i = 0; i < np; i++)
			CHECK(
			    int_is(flx_pv_item(r, i), (int64_t)probes[i] * 3));
		flx_pickle_free(p);
		p = NULL;
		/* one past the last MEMOIZE */
		b.n -= np * 5 + 3;
		put_binget(&b, (uint32_t)n);
		put_u8(&b, '.');
		CHECK_EQ(load(b.p, b.n, &p, &e), -EINVAL);
		CHECK(strstr(e.text, "out of range") != NULL);
	}

	/* a sparse index: the slots below it exist but are unset */
	b.n = 0;
	put(&b, "\x80\x02", 2);
	for (int i = 0; i < 150001; i++)
		put(&b, "N0", 2);
	put(&b, "Nr", 2);
	put_le(&b, 300000, 4);
	put_binget(&b, 300000);
	put(&b, "\x86.", 2);
	r = root_of(b.p, b.n, &p);
	CHECK(flx_pv_len(r) == 2 && flx_pv_item(r, 0) == flx_pv_item(r, 1));
	flx_pickle_free(p);
	p = NULL;
	b.n -= 7;
	put_binget(&b, 299999);
	put(&b, "\x86.", 2);
	CHECK_EQ(load(b.p, b.n, &p, &e), -EINVAL);
	CHECK(strstr(e.text, "memo index 299999 out of range") != NULL);
	free(b.p);
}

/* Immutable values made twice may share a node; mutable ones never do
 * unless the memo says so.  Values are counted as made either way. */
static void test_sharing(void)
{
	flx_pickle *p = NULL;
	flx_pickle_limits lim;
	flx_error e;
	const flx_pv *r, *t;

	r = ROOT("\x80\x02(K\x01K\x02\x86K\x01K\x02\x86K\x01K\x02K\x03\x87"
		 "K\x02K\x01\x86]q\x00\x85h\x00\x85]\x85))NN\x88\x88"
		 "(K\x01K\x02tt.",
		 &p);
	CHECK_EQ(flx_pv_len(r), 14);
	t = flx_pv_item(r, 0);
	CHECK(flx_pv_len(t) == 2 && int_is(flx_pv_item(t, 0), 1) &&
	      int_is(flx_pv_item(t, 1), 2));
	CHECK(flx_pv_item(r, 1) == t);
	CHECK(flx_pv_item(r, 13) == t); /* TUPLE after MARK: same */
	CHECK(flx_pv_item(r, 2) != t && flx_pv_len(flx_pv_item(r, 2)) == 3);
	CHECK(flx_pv_item(r, 3) != t);
	CHECK(int_is(flx_pv_item(flx_pv_item(r, 3), 0), 2));
	/* equal ints share too */
	CHECK(flx_pv_item(t, 0) == flx_pv_item(flx_pv_item(r, 2), 0));
	/* (l,) twice with the same list is one tuple, with another list not */
	CHECK(flx_pv_item(r, 4) == flx_pv_item(r, 5));
	CHECK(flx_pv_item(r, 6) != flx_pv_item(r, 4));
	CHECK(flx_pv_item(flx_pv_item(r, 6), 0) !=
	      flx_pv_item(flx_pv_item(r, 4), 0));
	CHECK(kind(flx_pv_item(flx_pv_item(r, 6), 0)) == FLX_PV_LIST);
	CHECK(flx_pv_item(r, 7) == flx_pv_item(r, 8));
	CHECK_EQ(flx_pv_len(flx_pv_item(r, 7)), 0);
	CHECK(flx_pv_item(r, 9) == flx_pv_item(r, 10));
	CHECK(flx_pv_item(r, 11) == flx_pv_item(r, 12));
	CHECK(kind(flx_pv_item(r, 11)) == FLX_PV_BOOL &&
	      flx_pv_item(r, 11)->u.b);
	flx_pickle_free(p);
	p = NULL;
	/* empty lists and dicts stay apart: they can be filled later */
	r = ROOT("\x80\x02(]]}}t.", &p);
	CHECK(flx_pv_len(r) == 4 && flx_pv_item(r, 0) != flx_pv_item(r, 1));
	CHECK(flx_pv_item(r, 2) != flx_pv_item(r, 3));
	flx_pickle_free(p);
	p = NULL;
	/* many distinct tuples (the table of shared ones grows), each made
	 * twice; SETITEMS and APPENDS with nothing to add */
	{
		enum { T = 5000 };
		struct sbuf b = {0};
		bool ok = true;
		char str[16];

		/* (s,) for T strings, then again from the memo */
		put(&b, "\x80\x02(", 3);
		for (int i = 0; i < T; i++) {
			int len = snprintf(str, sizeof(str), "s%d", i);

			put_u8(&b, 0x8c);
			put_u8(&b, (unsigned)len);
			put(&b, str, (size_t)len);
			put_u8(&b, 'r');
			put_le(&b, (uint64_t)i, 4);
			put_u8(&b, 0x85);
		}
		for (int i = 0; i < T; i++) {
			put_binget(&b, (uint32_t)i);
			put_u8(&b, 0x85);
		}
		put(&b, "}(u](et.", 8);
		r = root_of(b.p, b.n, &p);
		CHECK_EQ(flx_pv_len(r), 2 * T + 2);
		for (size_t i = 0; ok && i < T; i++) {
			t = flx_pv_item(r, i);
			snprintf(str, sizeof(str), "s%zu", i);
			ok = flx_pv_item(r, T + i) == t && flx_pv_len(t) == 1 &&
			     str_is(flx_pv_item(t, 0), str) &&
			     (i == 0 || t != flx_pv_item(r, i - 1));
		}
		CHECK(ok);
		CHECK(kind(flx_pv_item(r, 2 * T)) == FLX_PV_DICT &&
		      flx_pv_len(flx_pv_item(r, 2 * T)) == 0);
		CHECK(kind(flx_pv_item(r, 2 * T + 1)) == FLX_PV_LIST &&
		      flx_pv_len(flx_pv_item(r, 2 * T + 1)) == 0);
		flx_pickle_free(p);
		p = NULL;
		free(b.p);
	}
	/* a shared value still counts as made: 4 ints + the list > 4 */
	lim = (flx_pickle_limits){.max_nodes = 4};
	CHECK_EQ(LIMITED("\x80\x02(K\x01K\x01K\x01K\x01l.", &lim, &e), -EINVAL);
	CHECK(strstr(e.text, "more than 4 values") != NULL);
	lim = (flx_pickle_limits){.max_nodes = 5};
	CHECK_EQ(LIMITED("\x80\x02(K\x01K\x01K\x01K\x01l.", &lim, &e), 0);
	lim = (flx_pickle_limits){.max_nodes = 3};
	CHECK_EQ(LIMITED("\x80\x02K\x01K\x02\x86K\x01K\x02\x86.", &lim, &e),
		 -EINVAL);
}

/* ------------------------------------------------------------ malformed */

/* torch.Size(t) is shared like a tuple: equal arguments, one node, which
 * BUILD may not change.  NEWOBJ of it, or any other class, stays apart. */
static void test_size_sharing(void)
{
	flx_pickle *p = NULL;
	flx_error e;
	const flx_pv *r, *a;
	int64_t x;

	/* (Size((1,2)), Size((1,2)), Size((1,3)), NEWOBJ Size((1,2))) */
	r = ROOT("\x80\x02(ctorch\nSize\nq\x00K\x01K\x02\x86\x85Rh\x00K\x01K"
		 "\x02\x86\x85Rh\x00K\x01K\x03\x86\x85Rh\x00K\x01K\x02\x86\x85"
		 "\x81t.",
		 &p);
	CHECK_EQ(flx_pv_len(r), 4);
	CHECK(flx_pv_is_global(flx_pv_obj_class(flx_pv_item(r, 0)), "torch",
			       "Size"));
	CHECK(flx_pv_item(r, 0) == flx_pv_item(r, 1));
	CHECK(flx_pv_item(r, 2) != flx_pv_item(r, 0));
	CHECK(flx_pv_item(r, 3) != flx_pv_item(r, 0));
	CHECK(is_newobj(flx_pv_item(r, 3)));
	a = flx_pv_item(args(flx_pv_item(r, 2)), 0);
	CHECK(flx_pv_len(a) == 2 && flx_pv_int(flx_pv_item(a, 1), &x) &&
	      x == 3);
	flx_pickle_free(p);
	p = NULL;
	/* BUILD on one would change every use of it: refused, as Python
	 * refuses it (no __dict__) */
	{
		static const char build[] = "\x80\x02"
					    "ctorch\nSize\nK\x01\x85\x85R}b.";

		CHECK_EQ(load(build, sizeof(build) - 1, &p, &e), -EINVAL);
	}
	CHECK(strstr(e.text, "BUILD on a torch.Size") != NULL);
	/* another class is not shared */
	r = ROOT("\x80\x02(ctorch\nShape\nq\x00K\x01\x85\x85Rh\x00K\x01\x85"
		 "\x85Rt.",
		 &p);
	CHECK(flx_pv_len(r) == 2 && flx_pv_item(r, 0) != flx_pv_item(r, 1));
	flx_pickle_free(p);
}

static void test_malformed(void)
{
	char *big;
	flx_pickle *p = NULL;
	flx_pickle_limits lim = {0};
	flx_error e;
	int rc;

	/* the exact message format */
	flx_error_init(&e);
	rc = flx_pickle_load("\x80\x02h\x05.", 5, "meta.pkl", NULL, &p, &e);
	CHECK_EQ(rc, -EINVAL);
	CHECK_STR(
	    e.text,
	    "pickle: offset 2: memo index 5 out of range (opcode BINGET)");
	CHECK_STR(e.file, "meta.pkl");
	CHECK(p == NULL);

	FAILS("\x80\x02\xff.", "offset 2: unknown opcode 0xff");
	FAILS("\x80\x02N\x00.", "unknown opcode 0x00");
	FAILS("\x80\x06N.", "unsupported protocol 6");
	FAILS("", "no STOP");
	FAILS("\x80\x02N", "no STOP");
	FAILS("\x80\x02.", "stack underflow");
	FAILS("\x80\x02N(.", "stack underflow"); /* STOP below a mark */
	FAILS("\x80\x02Nt.", "no MARK");
	FAILS("\x80\x02N1.", "no MARK");
	FAILS("\x80\x02N(\x86.", "stack underflow"); /* TUPLE2 across mark */
	FAILS("\x80\x02j\x00\x00\x01\x00.", "memo index 65536 out of range");
	FAILS("\x80\x02\x94.", "stack underflow"); /* MEMOIZE on nothing */
	FAILS("\x80\x02Nr\xff\xff\xff\xff.", "out of range (limit");
	FAILS("g1\n.", "memo index 1 out of range (opcode GET)");
	FAILS("Ng-1\n.", "bad memo index");
	FAILS("\x80\x04\x95\xe8\x03\x00\x00\x00\x00\x00\x00N.",
	      "frame of 1000 bytes runs past the end");
	FAILS("\x80\x04\x95\x01\x00\x00", "truncated");
	FAILS("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7fN.",
	      "truncated: payload needs 9223372036854775807 bytes");
	FAILS("\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\xffN.", "truncated");
	FAILS("\x80\x05\x96\xff\xff\xff\xff\xff\xff\xff\x7fN.", "truncated");
	FAILS("\x80\x02X\xff\xff\xff\xffN.", "truncated");
	FAILS("\x80\x02T\xff\xff\xff\xffN.", "negative length");
	FAILS("\x80\x02\x8b\xff\xff\xff\xffN.", "negative length");
	FAILS("\x80\x02\x8a\x05\x01.", "truncated");
	FAILS("\x80\x02)Na.", "APPEND to a tuple");
	FAILS("\x80\x02}(Ne.", "APPENDS to a dict");
	FAILS("\x80\x02]NNs.", "SETITEM on a list");
	FAILS("\x80\x02](NNu.", "SETITEMS on a list");
	FAILS("\x80\x02}(Nu.", "odd number of items");
	FAILS("\x80\x02(NNNd.", "odd number of items");
	FAILS("\x80\x04](N\x90.", "ADDITEMS to a list");
	FAILS("\x80\x02]Nb.", "BUILD on a list");
	FAILS("\x80\x02NNR.", "not a tuple");
	FAILS("\x80\x04K\x01K\x02\x93.", "module and name must be str");
	FAILS("\x80\x04\x8c\x01m\x8c\x01"
	      "c\x93)}X\x01\x00\x00\x00kN"
	      "s\x92.",
	      "keyword arguments");
	FAILS("\x80\x02\x82\x01.", "extension registry");
	FAILS("\x80\x02\x83\x01\x00.", "extension registry");
	FAILS("\x80\x05\x97.", "out-of-band buffers");
	FAILS("\x80\x05N\x98.", "out-of-band buffers");
	FAILS("c\nname\n.", "empty module or name");
	FAILS("cmod", "unterminated line");
	FAILS("Iabc\n.", "bad integer literal");
	FAILS("I\n.", "bad integer literal");
	FAILS("Fx1\n.", "bad float literal");
	FAILS("S'abc\n.", "must be quoted");
	FAILS("S'\\x4'\n.", "invalid \\x escape");
	FAILS("V\\u12\n.", "truncated \\u escape");
	FAILS("V\\U00110000\n.", "out of range");
	FAILS("Q.", "stack underflow");

	/* MARK nesting and stack limits */
	big = malloc(200000);
	CHECK(big != NULL);
	if (!big)
		return;
	memset(big, '(', 200000);
	rc = load(big, 200000, &p, &e);
	CHECK_EQ(rc, -EINVAL);
	CHECK(strstr(e.text, "MARK nesting deeper than 1024") != NULL);
	memset(big, 'N', 200000);
	lim.max_stack = 1000;
	flx_error_init(&e);
	rc = flx_pickle_load(big, 200000, "t", &lim, &p, &e);
	CHECK_EQ(rc, -EINVAL);
	CHECK(strstr(e.text, "stack deeper than 1000") != NULL);
	/* marks count towards the stack too */
	memset(big, '(', 200000);
	lim.max_depth = 1u << 20;
	flx_error_init(&e);
	rc = flx_pickle_load(big, 200000, "t", &lim, &p, &e);
	CHECK_EQ(rc, -EINVAL);
	CHECK(strstr(e.text, "stack deeper than 1000") != NULL);
	free(big);

	/* depth exactly at the limit works, one more fails */
	lim = (flx_pickle_limits){.max_depth = 3};
	CHECK_EQ(LIMITED("(((Nttt.", &lim, &e), 0);
	CHECK_EQ(LIMITED("((((Ntttt.", &lim, &e), -EINVAL);

	/* node and memo limits */
	lim = (flx_pickle_limits){.max_nodes = 4};
	CHECK_EQ(LIMITED("(NNNl.", &lim, &e), 0);
	CHECK_EQ(LIMITED("(NNNNl.", &lim, &e), -EINVAL);
	CHECK(strstr(e.text, "more than 4 values") != NULL);
	/* (NONE POP padding makes the input longer than the memo limit, so
	 * the explicit limit is what is tested, not the input-length cap) */
	lim = (flx_pickle_limits){.max_memo = 16};
	CHECK_EQ(LIMITED("\x80\x02N0N0N0N0N0N0N0N0Nq\x0fh\x0f.", &lim, &e), 0);
	CHECK_EQ(LIMITED("\x80\x02N0N0N0N0N0N0N0N0Nq\x10.", &lim, &e), -EINVAL);
	/* without a limit, a memo index past the input length is refused
	 * (CPython numbers slots densely): no 128 MiB table for 9 bytes */
	CHECK_EQ(LIMITED("\x80\x02Nr\xff\xff\xff\x00.", NULL, &e), -EINVAL);
	/* a NULL err still gets the right code */
	CHECK_EQ(LIMITED("\x80\x02h\x05.", NULL, NULL), -EINVAL);
	lim = (flx_pickle_limits){.max_nodes = 2};
	CHECK_EQ(LIMITED("(NNNNl.", &lim, NULL), -EINVAL);
}

/* Every proper prefix of a valid pickle must fail cleanly, and random
 * damage must either fail with -EINVAL or give a walkable tree. */
static void test_damage(void)
{
	size_t total = 0;

	for (size_t i = 0; i < NVEC; i++) {
		size_t len = 0;
		unsigned char *buf = check_read_file(pkl_vecs[i].file, &len);
		unsigned char *cp;
		bool bigfile = len > 4096;

		if (!buf)
			continue;
		cp = malloc(len);
		for (size_t k = 0; cp && k < len; k += bigfile ? 7 : 1) {
			flx_pickle *p = NULL;
			flx_error e;
			int rc;

			/* exact-size copy so ASan sees any over-read */
			memcpy(cp, buf, k);
			rc = load(cp, k, &p, &e);
			if (rc != -EINVAL) {
				fprintf(stderr, "%s: prefix %zu gave %d\n",
					pkl_vecs[i].file, k, rc);
				check_failures++;
			}
			flx_pickle_free(p);
			total++;
		}
		for (size_t k = 0; cp && !bigfile && k < len; k++) {
			static const unsigned char flips[] = {0xff, 0x01, 0x80};

			for (size_t f = 0; f < sizeof(flips); f++) {
				flx_pickle *p = NULL;
				flx_error e;
				int rc;

				memcpy(cp, buf, len);
				cp[k] ^= flips[f];
				rc = load(cp, len, &p, &e);
				if (rc == 0) {
					struct sbuf b = {.budget = 100000};

					dump(&b, flx_pickle_root(p), 0);
					free(b.p);
				} else if (rc != -EINVAL) {
					fprintf(stderr, "%s: flip at %zu: %d\n",
						pkl_vecs[i].file, k, rc);
					check_failures++;
				}
				flx_pickle_free(p);
			}
		}
		free(cp);
		free(buf);
	}
	CHECK(total > 10000);
}

/* --------------------------------------------------------------- readers */

static int load_reader(const flx_reader *r, const flx_pickle_limits *lim,
		       flx_pickle **p, flx_error *e)
{
	flx_error_init(e);
	return flx_pickle_load_reader(r, "t.pkl", lim, p, e);
}

/* An unlinked temp file of pad bytes, data[0..n), pad bytes (pad <= 64),
 * or -1. */
static int temp_file(const void *data, size_t n, size_t pad)
{
	char path[] = "/tmp/flx_pickle_XXXXXX";
	unsigned char junk[64];
	int fd = mkstemp(path);

	if (fd < 0)
		return -1;
	unlink(path);
	memset(junk, '\n', sizeof(junk));
	if (write(fd, junk, pad) != (ssize_t)pad ||
	    write(fd, data, n) != (ssize_t)n ||
	    write(fd, junk, pad) != (ssize_t)pad) {
		close(fd);
		return -1;
	}
	return fd;
}

/* What a load gave, as text: its error, or its tree with payload offsets
 * (payloads left in the input taken from src).  Caller frees. */
static char *outcome(int rc, const flx_pickle *p, const flx_error *e,
		     const unsigned char *src, size_t srclen, size_t *refs,
		     size_t *long_bytes)
{
	struct sbuf b = {
	    .budget = 100000, .offs = true, .src = src, .srclen = srclen};
	char t[32];

	if (rc) {
		snprintf(t, sizeof(t), "rc %d: ", rc);
		puts_(&b, t);
		puts_(&b, e->text);
	} else {
		dump(&b, flx_pickle_root(p), 0);
	}
	if (refs)
		*refs = b.refs;
	if (long_bytes)
		*long_bytes = b.long_bytes;
	return b.p;
}

/* Every vector through file readers (at offset 13 of the file): windows
 * of 1 and 7 bytes put every opcode, argument and payload across an edge;
 * the tree, offsets included, is the buffer load's.  With max_copy 1,
 * the bytes at the offsets of the payloads left in the file are theirs. */
static void test_reader_vectors(void)
{
	static const size_t windows[] = {1, 7, 64, 4096, 0};
	static const size_t copies[] = {SIZE_MAX, 1};
	size_t refs_total = 0;

	for (size_t i = 0; i < NVEC; i++) {
		size_t len = 0, refs = 0, nlong = 0;
		unsigned char *buf = check_read_file(pkl_vecs[i].file, &len);
		flx_pickle *p = NULL;
		flx_error e;
		char *want;
		int fd, rc;

		CHECK(buf != NULL);
		if (!buf)
			continue;
		rc = load(buf, len, &p, &e);
		want = outcome(rc, p, &e, NULL, 0, &refs, &nlong);
		CHECK_EQ(refs, 0); /* a buffer load copies everything */
		flx_pickle_free(p);
		p = NULL;
		fd = temp_file(buf, len, 13);
		CHECK(fd >= 0);
		for (size_t w = 0; fd >= 0 && w < 5; w++) {
			for (size_t c = 0; c < 2; c++) {
				flx_pickle_limits lim = {.window = windows[w],
							 .max_copy = copies[c],
							 .max_str = SIZE_MAX};
				flx_fd_reader ctx;
				flx_reader r;
				char *got;

				flx_reader_fd(&r, &ctx, fd, 13, len);
				rc = load_reader(&r, &lim, &p, &e);
				got = outcome(rc, p, &e, buf, len, &refs, NULL);
				if (strcmp(got, want) != 0) {
					fprintf(stderr,
						"%s: window %zu, max_copy %zu:"
						" differs\n got: %.300s\nwant:"
						" %.300s\n",
						pkl_vecs[i].file, windows[w],
						copies[c], got, want);
					check_failures++;
				}
				/* max_copy 1 leaves every longer bytes */
				CHECK_EQ(refs, c == 0 ? 0 : nlong);
				refs_total += refs;
				free(got);
				flx_pickle_free(p);
				p = NULL;
			}
		}
		if (fd >= 0)
			close(fd);
		free(want);
		free(buf);
	}
	/* numpy arrays, scalars' bytes: payloads were left in the file */
	CHECK(refs_total > 50);
}

/* A buffer load and a reader load of data[0..n) give the same. */
static void same_outcome(const unsigned char *data, size_t n,
			 const flx_pickle_limits *lim, const char *file,
			 size_t at)
{
	flx_pickle *p = NULL;
	flx_mem_reader m;
	flx_reader r;
	flx_error e;
	char *a, *b;

	int rc = load(data, n, &p, &e);

	a = outcome(rc, p, &e, NULL, 0, NULL, NULL);
	flx_pickle_free(p);
	p = NULL;
	flx_reader_mem(&r, &m, data, n);
	rc = load_reader(&r, lim, &p, &e);
	b = outcome(rc, p, &e, data, n, NULL, NULL);
	flx_pickle_free(p);
	if (strcmp(a, b) != 0) {
		fprintf(stderr,
			"%s: damage at %zu, window %zu: buffer and reader"
			" differ\nbuffer: %.300s\nreader: %.300s\n",
			file, at, lim->window, a, b);
		check_failures++;
	}
	free(a);
	free(b);
}

/* Damaged input fails through a reader exactly as from a buffer, message
 * included (or gives the same tree): every prefix and byte flip of the
 * small vectors, through windows of 1 and 7 bytes. */
static void test_reader_damage(void)
{
	static const flx_pickle_limits lims[] = {
	    {.window = 1, .max_copy = SIZE_MAX, .max_str = SIZE_MAX},
	    {.window = 7, .max_copy = 1, .max_str = SIZE_MAX},
	};
	size_t total = 0;

	for (size_t i = 0; i < NVEC; i++) {
		size_t len = 0;
		unsigned char *buf = check_read_file(pkl_vecs[i].file, &len);
		unsigned char *cp = buf && len <= 4096 ? malloc(len) : NULL;

		for (size_t k = 0; cp && k <= len; k++) {
			/* exact-size copies so ASan sees any over-read */
			unsigned char *pre = malloc(k ? k : 1);

			if (!pre)
				break;
			memcpy(pre, buf, k);
			same_outcome(pre, k, &lims[k & 1], pkl_vecs[i].file, k);
			free(pre);
			total++;
		}
		for (size_t k = 0; cp && k < len; k++) {
			static const unsigned char flips[] = {0xff, 0x01, 0x80};

			for (size_t f = 0; f < sizeof(flips); f++) {
				memcpy(cp, buf, len);
				cp[k] ^= flips[f];
				same_outcome(cp, len, &lims[f & 1],
					     pkl_vecs[i].file, k);
				total++;
			}
		}
		free(cp);
		free(buf);
	}
	CHECK(total > 50000);
}

/* numpy's arrays, pickled as Paddle saves them: each payload's offset and
 * length are where Python found the array's bytes in the file (protocol
 * 2: their latin-1 text as UTF-8); long ones are left in the file. */
static const flx_pv *npy_payload(const flx_pv *arr)
{
	const flx_pv *v;

	if (state(arr)) /* _reconstruct, BUILD((1, shape, dtype, F, raw)) */
		v = flx_pv_item(state(arr), 4);
	else /* _frombuffer(raw, dtype, shape, order) */
		v = flx_pv_item(args(arr), 0);
	if (flx_pv_is_obj_of(v, "encode")) /* _codecs.encode(s, 'latin1') */
		v = flx_pv_item(args(v), 0);
	return v;
}

static void test_numpy(void)
{
	size_t n = sizeof(npy_vecs) / sizeof(npy_vecs[0]), nref = 0;

	CHECK_EQ(n, 9);
	for (size_t i = 0; i < n; i++) {
		const struct npy_vec *nv = &npy_vecs[i];
		size_t len = 0, plen = 0;
		unsigned char *buf = check_read_file(nv->file, &len);
		char path[256];
		int proto = buf && len > 1 ? buf[1] : -1, fd;
		flx_pickle_limits lim = {.max_str = 4096};
		flx_pickle *p = NULL;
		flx_fd_reader ctx;
		flx_reader r;
		flx_error e;
		const flx_pv *arr, *v;
		uint64_t off = 0;

		snprintf(path, sizeof(path), "unit/data/%s", nv->file);
		fd = open(path, O_RDONLY);
		CHECK(buf != NULL && fd >= 0);
		if (!buf || fd < 0) {
			free(buf);
			continue;
		}
		flx_reader_fd(&r, &ctx, fd, 0, len);
		CHECK_EQ(load_reader(&r, NULL, &p, &e), 0);
		arr = flx_pv_dict_get(flx_pickle_root(p), nv->key);
		CHECK(flx_pv_is_obj_of(arr, proto == 5 ? "_frombuffer"
						       : "_reconstruct"));
		v = npy_payload(arr);
		CHECK_EQ(kind(v), proto == 2 ? FLX_PV_STR : FLX_PV_BYTES);
		CHECK(flx_pv_payload(v, &off, &plen));
		CHECK_EQ(off, nv->off);
		CHECK_EQ(plen, nv->len);
		if (v && v->u.str.s) {
			CHECK(proto == 2 || plen <= 4096);
			CHECK(off + plen <= len &&
			      memcmp(v->u.str.s, buf + off, plen) == 0);
		} else {
			CHECK(proto != 2 && plen > 4096);
			nref++;
		}
		flx_pickle_free(p);
		p = NULL;
		/* a str payload over max_str is left in the file too */
		if (proto == 2) {
			CHECK_EQ(load_reader(&r, &lim, &p, &e), 0);
			v = npy_payload(
			    flx_pv_dict_get(flx_pickle_root(p), nv->key));
			CHECK_EQ(kind(v), FLX_PV_STR);
			CHECK(flx_pv_payload(v, &off, &plen) &&
			      off == nv->off && plen == nv->len);
			CHECK((plen > 4096) == (flx_pv_str(v) == NULL));
			flx_pickle_free(p);
		}
		close(fd);
		free(buf);
	}
	CHECK_EQ(nref, 2); /* 'w' of protocols 4 and 5 */
}

/* A reader over a made-up input: segments of given bytes, or of n pattern
 * bytes standing for an array too large to hold.  It counts its reads and
 * fails those that reach fail_at. */
struct seg {
	const char *lit; /* NULL: pattern bytes */
	uint64_t n;
};

struct synth {
	const struct seg *seg;
	size_t nseg;
	uint64_t size;
	uint64_t fail_at;
	uint64_t bytes, max_read;
};

static unsigned char pattern(uint64_t off)
{
	return (unsigned char)((off * 2654435761u) >> 11);
}

static int synth_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	struct synth *s = ctx;
	unsigned char *d = buf;
	uint64_t start = 0;

	if (off + n > s->fail_at)
		return -EIO;
	s->bytes += n;
	if (n > s->max_read)
		s->max_read = n;
	for (size_t i = 0; i < s->nseg && n; start += s->seg[i++].n) {
		const struct seg *g = &s->seg[i];
		uint64_t in;
		size_t k;

		if (off >= start + g->n)
			continue;
		in = off - start;
		k = g->n - in < n ? (size_t)(g->n - in) : n;
		for (size_t j = 0; j < k; j++)
			d[j] = g->lit ? (unsigned char)g->lit[in + j]
				      : pattern(start + in + j);
		d += k;
		off += k;
		n -= k;
	}
	return n ? -EIO : 0;
}

static void synth_reader(flx_reader *r, struct synth *s, const struct seg *seg,
			 size_t nseg)
{
	*s = (struct synth){.seg = seg, .nseg = nseg, .fail_at = UINT64_MAX};
	for (size_t i = 0; i < nseg; i++)
		s->size += seg[i].n;
	r->pread = synth_pread;
	r->ctx = s;
	r->size = s->size;
}

#define GIB ((uint64_t)1 << 30)

/* {'w': <6 GiB BINBYTES8>, 'b': b'xyz', 's': 'hello'}, framed as protocol
 * 4 writes it: decoded through a 256 KiB window without reading the
 * array; a payload that runs past the end, or a failing read, refused. */
static void test_huge_payload(void)
{
	const uint64_t n = 6 * GIB;
	struct sbuf head = {0}, tail = {0};
	struct synth s;
	flx_reader r;
	flx_pickle *p = NULL;
	flx_error e;
	const flx_pv *root, *w;
	size_t b_at, s_at;
	uint64_t off = 0;
	size_t plen = 0;
	char want[200];

	put(&head, "\x80\x04\x95", 3);
	put_le(&head, 7, 8);
	put(&head, "}\x94(\x8c\x01w\x94", 7);
	put_u8(&head, 0x8e); /* BINBYTES8 */
	put_le(&head, n, 8);
	put_u8(&tail, 0x95);
	put_le(&tail, 0, 8);
	put(&tail,
	    "\x94\x8c\x01"
	    "b\x94"
	    "C\x03",
	    7);
	b_at = tail.n;
	put(&tail, "xyz\x94\x8c\x01s\x94\x8c\x05", 10);
	s_at = tail.n;
	put(&tail, "hello\x94u.", 8);
	for (int k = 0; k < 8; k++) /* the frame holds the rest */
		tail.p[1 + k] = (char)((tail.n - 9) >> (8 * k));
	{
		const struct seg seg[] = {
		    {head.p, head.n}, {NULL, n}, {tail.p, tail.n}};

		synth_reader(&r, &s, seg, 3);
		CHECK_EQ(load_reader(&r, NULL, &p, &e), 0);
		root = flx_pickle_root(p);
		CHECK_EQ(flx_pv_len(root), 3);
		w = flx_pv_dict_get(root, "w");
		CHECK(kind(w) == FLX_PV_BYTES && w->u.str.s == NULL);
		CHECK(flx_pv_payload(w, &off, &plen));
		CHECK_EQ(off, head.n);
		CHECK_EQ(plen, n);
		w = flx_pv_dict_get(root, "b");
		CHECK(kind(w) == FLX_PV_BYTES && w->u.str.s &&
		      strcmp(w->u.str.s, "xyz") == 0);
		CHECK(flx_pv_payload(w, &off, &plen) &&
		      off == head.n + n + b_at && plen == 3);
		CHECK_STR(flx_pv_str(flx_pv_dict_get(root, "s")), "hello");
		CHECK(flx_pv_payload(flx_pv_dict_get(root, "s"), &off, &plen) &&
		      off == head.n + n + s_at);
		/* bounded reads: the array's bytes were not read */
		CHECK(s.max_read <= ((size_t)256 << 10));
		CHECK(s.bytes < ((uint64_t)64 << 10));
		flx_pickle_free(p);
		p = NULL;

		/* a read that fails: the reader's code, and where */
		synth_reader(&r, &s, seg, 3);
		s.fail_at = head.n + n + 5;
		CHECK_EQ(load_reader(&r, NULL, &p, &e), -EIO);
		CHECK(p == NULL);
		snprintf(want, sizeof(want),
			 "pickle: offset %" PRIu64 ": read error: %s",
			 head.n + n, strerror(EIO));
		CHECK_STR(e.text, want);
	}
	/* the payload one byte short, then exactly to the end (no STOP) */
	for (int k = 0; k < 2; k++) {
		const struct seg seg[] = {{head.p, head.n}, {NULL, n - 1 + k}};

		synth_reader(&r, &s, seg, 2);
		CHECK_EQ(load_reader(&r, NULL, &p, &e), -EINVAL);
		if (k == 0)
			snprintf(want, sizeof(want),
				 "pickle: offset %zu: truncated: payload needs"
				 " %" PRIu64 " bytes, %" PRIu64
				 " left (opcode BINBYTES8)",
				 head.n - 9, n, n - 1);
		else
			snprintf(want, sizeof(want),
				 "pickle: offset %" PRIu64
				 ": truncated: no STOP opcode",
				 head.n + n);
		CHECK_STR(e.text, want);
		CHECK(s.bytes < ((uint64_t)64 << 10));
	}
	free(head.p);
	free(tail.p);
}

/* 300 arrays of 1 MiB in a list, protocol 3 (no frames): the read-ahead
 * starts small after each array passed over, so the reads stay near the
 * opcodes' bytes instead of a window per array. */
static void test_many_payloads(void)
{
	enum { N = 300 };
	const uint64_t size = (uint64_t)1 << 20;
	static char op[N][5];
	static struct seg seg[2 * N + 2];
	size_t nseg = 0;
	struct synth s;
	flx_reader r;
	flx_pickle *p = NULL;
	flx_error e;
	const flx_pv *root;
	uint64_t off = 0;
	size_t plen = 0;
	bool ok = true;

	/* PROTO 3, EMPTY_LIST, BINPUT 0, MARK, N x BINBYTES, APPENDS, STOP */
	seg[nseg++] = (struct seg){"\x80\x03]q\x00(", 6};
	for (int i = 0; i < N; i++) {
		op[i][0] = 'B';
		for (int k = 0; k < 4; k++)
			op[i][1 + k] = (char)(size >> (8 * k));
		seg[nseg++] = (struct seg){op[i], 5};
		seg[nseg++] = (struct seg){NULL, size};
	}
	seg[nseg++] = (struct seg){"e.", 2};
	synth_reader(&r, &s, seg, nseg);
	CHECK_EQ(load_reader(&r, NULL, &p, &e), 0);
	root = flx_pickle_root(p);
	CHECK_EQ(flx_pv_len(root), N);
	for (size_t i = 0; ok && i < N; i++) {
		const flx_pv *v = flx_pv_item(root, i);

		ok = flx_pv_payload(v, &off, &plen) && v->u.str.s == NULL &&
		     off == 6 + 5 + i * (size + 5) && plen == size;
	}
	CHECK(ok);
	/* a 4 KiB read-ahead per array, not a 256 KiB window */
	CHECK(s.bytes < (uint64_t)N * (8 << 10));
	flx_pickle_free(p);
}

/* A 64 MiB array in a real (sparse) file through the file reader: its
 * offset finds its first and last bytes; a file shorter than the reader
 * says fails with -EIO. */
static void test_file_payload(void)
{
	const uint64_t n = (uint64_t)64 << 20;
	struct sbuf head = {0};
	char path[] = "/tmp/flx_pickle_XXXXXX";
	int fd = mkstemp(path);
	flx_fd_reader ctx;
	flx_reader r;
	flx_pickle *p = NULL;
	flx_error e;
	const flx_pv *v;
	uint64_t off = 0;
	size_t plen = 0;
	char c = 0;

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	unlink(path);
	put(&head, "\x80\x04\x8e", 3); /* BINBYTES8 */
	put_le(&head, n, 8);
	CHECK_EQ(pwrite(fd, head.p, head.n, 0), (ssize_t)head.n);
	CHECK_EQ(pwrite(fd, "A", 1, (off_t)head.n), 1);
	CHECK_EQ(pwrite(fd, "Z.", 2, (off_t)(head.n + n - 1)), 2);
	flx_reader_fd(&r, &ctx, fd, 0, head.n + n + 1);
	CHECK_EQ(load_reader(&r, NULL, &p, &e), 0);
	v = flx_pickle_root(p);
	CHECK(kind(v) == FLX_PV_BYTES && v->u.str.s == NULL);
	CHECK(flx_pv_payload(v, &off, &plen) && off == head.n && plen == n);
	CHECK(pread(fd, &c, 1, (off_t)off) == 1 && c == 'A');
	CHECK(pread(fd, &c, 1, (off_t)(off + plen - 1)) == 1 && c == 'Z');
	flx_pickle_free(p);
	p = NULL;
	CHECK_EQ(ftruncate(fd, (off_t)(head.n + n)), 0);
	CHECK_EQ(load_reader(&r, NULL, &p, &e), -EIO);
	CHECK(strstr(e.text, "read error") != NULL);
	close(fd);
	free(head.p);
}

/* Long strs through a reader: one over max_str is left in the input
 * (flx_pv_str() NULL, a dict key nothing matches) and refused as a module
 * name; a text argument over max_str is refused, where a buffer load
 * takes it. */
static void test_reader_str_limits(void)
{
	static const char d[] = "\x80\x04}(\x8c\x0b"
				"0123456789AK\x01\x8c\x05"
				"shortX\x0a\x00\x00\x00"
				"xxxxxxxxxxu.";
	static const char g[] = "\x80\x04\x8c\x0bmodule_name\x8c\x01"
				"c\x93.";
	static const char t10[] = "V0123456789\n.", t11[] = "V0123456789A\n.";
	static const char gl[] = "cmod\n0123456789A\n.";
	flx_pickle_limits lim = {.max_str = 10};
	flx_mem_reader m;
	flx_reader r;
	flx_pickle *p = NULL;
	flx_error e;
	const flx_pv *root, *v;
	uint64_t off = 0;
	size_t plen = 0;

	flx_reader_mem(&r, &m, d, sizeof(d) - 1);
	CHECK_EQ(load_reader(&r, &lim, &p, &e), 0);
	root = flx_pickle_root(p);
	CHECK_EQ(flx_pv_len(root), 2);
	v = flx_pv_len(root) == 2 ? root->u.dict.kv[0] : NULL;
	CHECK(kind(v) == FLX_PV_STR && flx_pv_str(v) == NULL);
	CHECK(flx_pv_payload(v, &off, &plen) && off == 6 && plen == 11);
	CHECK(flx_pv_dict_get(root, "0123456789A") == NULL);
	CHECK_STR(flx_pv_str(flx_pv_dict_get(root, "short")), "xxxxxxxxxx");
	flx_pickle_free(p);
	p = NULL;

	flx_reader_mem(&r, &m, g, sizeof(g) - 1);
	CHECK_EQ(load_reader(&r, &lim, &p, &e), -EINVAL);
	CHECK_STR(e.text, "pickle: offset 18: module or name longer than 10"
			  " bytes (opcode STACK_GLOBAL)");

	flx_reader_mem(&r, &m, t10, sizeof(t10) - 1);
	CHECK_EQ(load_reader(&r, &lim, &p, &e), 0);
	CHECK_STR(flx_pv_str(flx_pickle_root(p)), "0123456789");
	CHECK(!flx_pv_payload(flx_pickle_root(p), &off, &plen));
	flx_pickle_free(p);
	p = NULL;
	flx_reader_mem(&r, &m, t11, sizeof(t11) - 1);
	CHECK_EQ(load_reader(&r, &lim, &p, &e), -EINVAL);
	CHECK_STR(e.text, "pickle: offset 0: text argument longer than 10"
			  " bytes (opcode UNICODE)");
	CHECK_EQ(load(t11, sizeof(t11) - 1, &p, &e), 0);
	flx_pickle_free(p);
	p = NULL;
	/* a GLOBAL's name line, also through a 1-byte window */
	for (size_t w = 0; w < 2; w++) {
		lim.window = w;
		flx_reader_mem(&r, &m, gl, sizeof(gl) - 1);
		CHECK_EQ(load_reader(&r, &lim, &p, &e), -EINVAL);
		CHECK_STR(e.text, "pickle: offset 0: text argument longer than"
				  " 10 bytes (opcode GLOBAL)");
	}
}

/* ----------------------------------------------------------- sink loads */

struct sink_rec {
	struct sbuf pairs; /* every pair taken, dumped */
	size_t calls, npairs;
	bool decline;
	bool count_only;	 /* pairs counted, not dumped */
	const char *list_key;	 /* lists streamed too (rec_items()) */
	const char *list_parent; /* and the lists in the dict under it */
	struct sbuf items;	 /* every list's items taken, dumped */
	const char *watch_key;	 /* pairs watched (rec_watch()) */
	struct sbuf watched;	 /* every pair watched, dumped */
	bool watch_decline;
};

static int rec_watch(void *ctx, flx_pv *const *kv, size_t npairs)
{
	struct sink_rec *s = ctx;

	if (s->watch_decline)
		return -EAGAIN;
	for (size_t i = 0; i < 2 * npairs; i++) {
		s->watched.budget = 100000;
		dump(&s->watched, kv[i], 0);
		puts_(&s->watched, i & 1 ? ";" : ":");
	}
	puts_(&s->watched, "|");
	return 0;
}

static int rec_pairs(void *ctx, flx_pv *const *kv, size_t npairs)
{
	struct sink_rec *s = ctx;

	s->calls++;
	if (s->decline)
		return -EAGAIN;
	for (size_t i = 0; !s->count_only && i < 2 * npairs; i++) {
		s->pairs.budget = 100000;
		dump(&s->pairs, kv[i], 0);
		puts_(&s->pairs, i & 1 ? ";" : ":");
	}
	s->npairs += npairs;
	return 0;
}

static int rec_items(void *ctx, const flx_pv *list, flx_pv *const *v, size_t n)
{
	struct sink_rec *s = ctx;

	CHECK(flx_pv_streamed(list));
	for (size_t i = 0; i < n; i++) {
		s->items.budget = 100000;
		dump(&s->items, v[i], 0);
		puts_(&s->items, ";");
	}
	puts_(&s->items, "|");
	return 0;
}

static int load_sink(const void *data, size_t n, size_t window, const char *key,
		     struct sink_rec *s, flx_pickle **p, flx_error *e)
{
	const flx_pickle_limits lim = {.window = window,
				       .max_copy = SIZE_MAX / 4,
				       .max_str = SIZE_MAX / 4};
	flx_pickle_sink sink = {.key = key,
				.pairs = rec_pairs,
				.ctx = s,
				.list_key = s->list_key,
				.items = rec_items,
				.list_parent = s->list_parent,
				.watch_key = s->watch_key,
				.watch = rec_watch};
	flx_mem_reader m;
	flx_reader r;

	flx_error_init(e);
	flx_reader_mem(&r, &m, data, n);
	return flx_pickle_load_sink(&r, "t.pkl", &lim, &sink, p, e);
}

/* torch's own .metadata (1.13 and 2.6): storage_data streamed, and each
 * tensor's chunks list, give the pairs and items of the tree a plain load
 * makes, in order, and the rest of that tree, with storage_data and the
 * chunks lists left empty; through windows of 7 bytes too. */
static void test_sink_dcp(void)
{
	/* the fixtures' own .metadata: chunks lists of several items */
	static const char *const files[] = {
	    "pickle/t113_dcp_metadata.pkl", "pickle/t26_dcp_metadata.pkl",
	    "../../fixtures/dcp-t113/ckpt/.metadata",
	    "../../fixtures/dcp-t26/ckpt/.metadata"};
	static const size_t npairs[] = {3, 3, 0, 0};

	for (int i = 0; i < 4; i++) {
		size_t len = 0;
		unsigned char *buf = check_read_file(files[i], &len);
		flx_pickle *p = NULL;
		flx_error e;
		flx_pv *sd, *sdm;
		size_t nsd = 0;
		struct sbuf want = {0}, rest = {0}, witems = {0};

		CHECK(buf != NULL);
		if (!buf)
			continue;
		CHECK_EQ(load(buf, len, &p, &e), 0);
		sd = (flx_pv *)flx_pv_dict_get(state(flx_pickle_root(p)),
					       "storage_data");
		CHECK(sd && (!npairs[i] || flx_pv_len(sd) == npairs[i]));
		for (size_t j = 0; sd && j < 2 * sd->u.dict.n; j++) {
			want.budget = 100000;
			dump(&want, sd->u.dict.kv[j], 0);
			puts_(&want, j & 1 ? ";" : ":");
		}
		nsd = flx_pv_len(sd);
		if (sd)
			sd->u.dict.n = 0; /* what a sink load leaves */
		sdm = (flx_pv *)flx_pv_dict_get(state(flx_pickle_root(p)),
						"state_dict_metadata");
		for (size_t j = 0; sdm && j < sdm->u.dict.n; j++) {
			flx_pv *ch = (flx_pv *)flx_pv_dict_get(
			    state(sdm->u.dict.kv[2 * j + 1]), "chunks");

			/* CPython appends a single item with APPEND: no
			 * batch, nothing streamed */
			if (!ch || ch->u.seq.n < 2)
				continue;
			for (size_t k = 0; k < ch->u.seq.n; k++) {
				witems.budget = 100000;
				dump(&witems, ch->u.seq.v[k], 0);
				puts_(&witems, ";");
			}
			puts_(&witems, "|");
			ch->u.seq.n = 0;
		}
		CHECK(i < 2 || witems.p != NULL);
		rest.budget = 100000;
		dump(&rest, flx_pickle_root(p), 0);
		flx_pickle_free(p);
		for (size_t w = 7; w <= 7u << 16; w <<= 16) {
			struct sink_rec s = {.list_key = "chunks"};
			struct sbuf got = {.budget = 100000};
			const flx_pv *r;

			p = NULL;
			CHECK_EQ(
			    load_sink(buf, len, w, "storage_data", &s, &p, &e),
			    0);
			if (!p)
				continue;
			r = flx_pickle_root(p);
			CHECK_EQ(s.npairs, nsd);
			CHECK(flx_pickle_sink_dict(p) ==
			      flx_pv_dict_get(state(r), "storage_data"));
			CHECK(s.pairs.p && want.p &&
			      strcmp(s.pairs.p, want.p) == 0);
			CHECK(s.items.p == witems.p ||
			      (s.items.p && witems.p &&
			       strcmp(s.items.p, witems.p) == 0));
			dump(&got, r, 0);
			CHECK(got.p && rest.p && strcmp(got.p, rest.p) == 0);
			flx_pickle_free(p);
			free(s.pairs.p);
			free(s.items.p);
			free(got.p);
		}
		free(want.p);
		free(witems.p);
		free(rest.p);
		free(buf);
	}
}

static void put_str(struct sbuf *b, const char *s)
{
	size_t n = strlen(s);

	put_u8(b, 0x8c);
	put_u8(b, (unsigned)n);
	put(b, s, n);
}

static void put_binput(struct sbuf *b, uint32_t idx)
{
	put_u8(b, 'r');
	put_le(b, idx, 4);
}

/* The start of a protocol-4 pickle: a dict, a MARK for its pairs, the key
 * name and an empty dict (the sink dict, whose pairs follow). */
static void put_sink_start(struct sbuf *b, const char *name)
{
	put(b, "\x80\x04}(", 4);
	put_str(b, name);
	put(b, "}", 1);
}

/* A MARK, then the key "k<k>". */
static void put_mark_key(struct sbuf *b, int k)
{
	char key[16];

	snprintf(key, sizeof(key), "k%d", k);
	put(b, "(", 1);
	put_str(b, key);
}

enum { SB_BATCHES = 60, SB_PER = 300 };
enum { SB_PLAIN, SB_REFER_LIST, SB_DIRTY };

/*
 * {'sd': {...}, 'tail': ...} where 'sd' is filled in SB_BATCHES SETITEMS
 * of SB_PER pairs 'k<b>_<i>': ['v<b>'], a list made in the batch.  Batch
 * b memoizes its first key, list and 'v<b>' string; the second pair of
 * the next batch holds [that key] instead, named through the memo after
 * the batch's memory was reused.  tail: 'v<last>' (SB_PLAIN), batch 0's
 * list (SB_REFER_LIST), or, where batch 0 appended 'x' to an older list
 * (SB_DIRTY), (that list, batch 0's list).  *want gets the pairs the
 * sink must see, dumped.
 */
static void sink_pickle(struct sbuf *b, struct sbuf *want, int mode)
{
	uint32_t keym[SB_BATCHES], valm[SB_BATCHES];
	uint32_t memo = 0, lidx0 = 0, old = 0;
	char key[32], val[32], t[96];

	put(b, "\x80\x04", 2);
	if (mode == SB_DIRTY) {
		put(b, "]", 1);
		put_binput(b, old = memo++);
		put(b, "0", 1);
	}
	put(b, "}(", 2);
	put_str(b, "sd");
	put(b, "}", 1);
	for (int k = 0; k < SB_BATCHES; k++) {
		put(b, "(", 1);
		for (int i = 0; i < SB_PER; i++) {
			snprintf(key, sizeof(key), "k%d_%d", k, i);
			put_str(b, key);
			if (i == 0)
				put_binput(b, keym[k] = memo++);
			put(b, "]", 1);
			if (k == 0 && i == 0)
				put_binput(b, lidx0 = memo++);
			if (k > 0 && i == 0) {
				/* strings of the previous batch, its memory
				 * since reused */
				put_binget(b, keym[k - 1]);
				snprintf(val, sizeof(val), "k%d_0", k - 1);
			} else if (k > 0 && i == 1) {
				put_binget(b, valm[k - 1]);
				snprintf(val, sizeof(val), "v%d", k - 1);
			} else {
				snprintf(val, sizeof(val), "v%d", k);
				put_str(b, val);
				if (i == 2)
					put_binput(b, valm[k] = memo++);
			}
			put(b, "a", 1);
			if (k == 0 && i == 0 && mode == SB_DIRTY) {
				/* an older list, changed in the batch */
				put_binget(b, old);
				put_str(b, "x");
				put(b, "a0", 2);
			}
			snprintf(t, sizeof(t), "s\"%s\":[s\"%s\"];", key, val);
			puts_(want, t);
		}
		put(b, "u", 1);
	}
	put_str(b, "tail");
	if (mode == SB_PLAIN) {
		put_binget(b, valm[SB_BATCHES - 1]);
	} else if (mode == SB_REFER_LIST) {
		put_binget(b, lidx0);
	} else {
		put(b, "(", 1);
		put_binget(b, old);
		put_binget(b, lidx0);
		put(b, "t", 1);
	}
	put(b, "u.", 2);
}

/* Batches streamed one after another, the memory of each reused: the
 * strings memoized in a batch keep their value in the next (a plain load's
 * tree, dumped, is the oracle of what the sink sees); a memoized list of
 * a reused batch named again fails the load with -EAGAIN; a batch that
 * changed an older list is not reused, and what it made stays valid; a
 * sink that declines fails the load with -EAGAIN. */
static void test_sink_batches(void)
{
	static const char *const tails[] = {
	    "<s\"sd\":<>,s\"tail\":s\"v59\">", NULL,
	    "<s\"sd\":<>,s\"tail\":([s\"x\"],[s\"v0\"])>"};

	for (int mode = SB_PLAIN; mode <= SB_DIRTY; mode++) {
		for (size_t w = 7; w <= 7u << 16; w <<= 16) {
			struct sbuf b = {0}, want = {0}, got = {.budget = 1000};
			struct sink_rec s = {0};
			flx_pickle *p = NULL;
			flx_error e;
			int rc;

			sink_pickle(&b, &want, mode);
			rc = load_sink(b.p, b.n, w, "sd", &s, &p, &e);
			if (mode == SB_REFER_LIST) {
				CHECK_EQ(rc, -EAGAIN);
				CHECK(p == NULL);
				CHECK(strstr(e.text, "sink") != NULL);
			} else {
				CHECK_EQ(rc, 0);
				CHECK_EQ(s.calls, SB_BATCHES);
				CHECK(s.pairs.p && want.p &&
				      strcmp(s.pairs.p, want.p) == 0);
				if (p)
					dump(&got, flx_pickle_root(p), 0);
				CHECK(got.p && strcmp(got.p, tails[mode]) == 0);
				CHECK(
				    flx_pickle_sink_dict(p) ==
				    flx_pv_dict_get(flx_pickle_root(p), "sd"));
			}
			flx_pickle_free(p);
			free(s.pairs.p);
			free(got.p);
			/* the tree of a plain load holds the same pairs */
			p = NULL;
			{
				struct sbuf plain = {0};
				const flx_pv *sd;

				CHECK_EQ(load(b.p, b.n, &p, &e), 0);
				sd = flx_pv_dict_get(flx_pickle_root(p), "sd");
				for (size_t j = 0; sd && j < 2 * sd->u.dict.n;
				     j++) {
					plain.budget = 1000;
					dump(&plain, sd->u.dict.kv[j], 0);
					puts_(&plain, j & 1 ? ";" : ":");
				}
				CHECK(plain.p && want.p &&
				      strcmp(plain.p, want.p) == 0);
				free(plain.p);
				flx_pickle_free(p);
				p = NULL;
			}
			/* declined */
			memset(&s, 0, sizeof(s));
			s.decline = true;
			CHECK_EQ(load_sink(b.p, b.n, w, "sd", &s, &p, &e),
				 -EAGAIN);
			CHECK(p == NULL);
			CHECK_EQ(s.calls, 1);
			/* no dict under that key: a plain load */
			memset(&s, 0, sizeof(s));
			CHECK_EQ(load_sink(b.p, b.n, w, "nothere", &s, &p, &e),
				 0);
			CHECK_EQ(s.calls, 0);
			CHECK(flx_pickle_sink_dict(p) == NULL);
			flx_pickle_free(p);
			free(b.p);
			free(want.p);
		}
	}
}

/* The sink dict named a second time (memo, DUP): after its pairs went to
 * the sink, the load fails with -EAGAIN; before, it is not streamed. */
static void test_sink_named_again(void)
{
	static const char after[] =
	    "\x80\x04}(\x8c\x02sd}r\x00\x00\x00\x00(\x8c\x01k\x8c\x01vu"
	    "\x8c\x04tailj\x00\x00\x00\x00u.";
	static const char dup[] =
	    "\x80\x04}(\x8c\x02sd}(\x8c\x01k\x8c\x01vu20u.";
	static const char before[] =
	    "\x80\x04}(\x8c\x02sd}r\x00\x00\x00\x00\x8c\x02sdj\x00\x00\x00\x00"
	    "(\x8c\x01k\x8c\x01vuu.";
	struct sink_rec s = {0};
	struct sbuf got = {.budget = 100};
	flx_pickle *p = NULL;
	flx_error e;

	CHECK_EQ(load_sink(after, sizeof(after) - 1, 1 << 16, "sd", &s, &p, &e),
		 -EAGAIN);
	CHECK(p == NULL);
	CHECK_EQ(s.calls, 1);
	free(s.pairs.p);
	memset(&s, 0, sizeof(s));
	CHECK_EQ(load_sink(dup, sizeof(dup) - 1, 1 << 16, "sd", &s, &p, &e),
		 -EAGAIN);
	CHECK(p == NULL);
	free(s.pairs.p);
	memset(&s, 0, sizeof(s));
	CHECK_EQ(
	    load_sink(before, sizeof(before) - 1, 1 << 16, "sd", &s, &p, &e),
	    0);
	CHECK_EQ(s.calls, 0);
	CHECK(flx_pickle_sink_dict(p) == NULL);
	if (p)
		dump(&got, flx_pickle_root(p), 0);
	CHECK(got.p && strcmp(got.p, "<s\"sd\":<s\"k\":s\"v\">,s\"sd\":<s\"k\":"
				     "s\"v\">>") == 0);
	flx_pickle_free(p);
	free(got.p);
	free(s.pairs.p);
}

/* The lists that are values of the dict under list_parent (a str key) are
 * streamed, whatever their own keys; a list under a non-str key or in
 * another dict is not; naming a streamed list again fails the load with
 * -EAGAIN. */
static void test_sink_list_parent(void)
{
	/* {"sdm": {"a": [1, 2], 7: [3, 4], "b": [5, 6]}, "x": [8, 9]} */
	static const char pk[] = "\x80\x04}(\x8c\x03sdm}(\x8c\x01"
				 "a](K\x01K\x02"
				 "eK\x07](K\x03K"
				 "\x04"
				 "e\x8c\x01"
				 "b](K\x05K\x06"
				 "eu\x8c\x01x](K\x08K\x09"
				 "eu.";
	/* the list of "a" memoized, then named again as the value of "x" */
	static const char again[] = "\x80\x04}(\x8c\x03sdm}(\x8c\x01"
				    "a]q\x00(K\x01K\x02"
				    "e\x8c\x01"
				    "b](K\x05K\x06"
				    "eu\x8c\x01xh\x00u.";
	struct sink_rec s = {.list_parent = "sdm"};
	struct sbuf got = {.budget = 1000};
	flx_pickle *p = NULL;
	const flx_pv *sdm, *a, *b, *n7, *x;
	flx_error e;

	CHECK_EQ(load_sink(pk, sizeof(pk) - 1, 1 << 16, "none", &s, &p, &e), 0);
	CHECK(s.items.p && strcmp(s.items.p, "i1;i2;|i5;i6;|") == 0);
	sdm = flx_pv_dict_get(flx_pickle_root(p), "sdm");
	a = flx_pv_dict_get(sdm, "a");
	b = flx_pv_dict_get(sdm, "b");
	n7 = sdm && sdm->u.dict.n == 3 ? sdm->u.dict.kv[3] : NULL;
	x = flx_pv_dict_get(flx_pickle_root(p), "x");
	CHECK(a && flx_pv_streamed(a) && flx_pv_len(a) == 0);
	CHECK(b && flx_pv_streamed(b) && flx_pv_len(b) == 0);
	CHECK(n7 && !flx_pv_streamed(n7) && flx_pv_len(n7) == 2);
	CHECK(x && !flx_pv_streamed(x) && flx_pv_len(x) == 2);
	if (p)
		dump(&got, flx_pickle_root(p), 0);
	CHECK(got.p &&
	      strcmp(got.p, "<s\"sdm\":<s\"a\":[],i7:[i3,i4],s\"b\":[]>,"
			    "s\"x\":[i8,i9]>") == 0);
	flx_pickle_free(p);
	free(s.items.p);
	free(got.p);
	memset(&s, 0, sizeof(s));
	s.list_parent = "sdm";
	p = NULL;
	CHECK_EQ(
	    load_sink(again, sizeof(again) - 1, 1 << 16, "none", &s, &p, &e),
	    -EAGAIN);
	CHECK(p == NULL);
	free(s.items.p);
	/* without list_parent nothing is streamed */
	memset(&s, 0, sizeof(s));
	CHECK_EQ(load_sink(pk, sizeof(pk) - 1, 1 << 16, "none", &s, &p, &e), 0);
	CHECK(s.items.p == NULL);
	flx_pickle_free(p);
}

/* The pairs of the dict under the watch key are shown, SETITEMS by
 * SETITEMS and SETITEM by SETITEM, after the lists streamed inside them,
 * and stay in the tree; a decline fails the load; with no dict under the
 * key nothing is watched. */
static void test_sink_watch(void)
{
	/* {"sdm": {"a": [1, 2], "b": [3]} then "c": 4 by SETITEM,
	 *  "sd": {"k": 5}} */
	static const char pk[] = "\x80\x04}(\x8c\x03sdm}q\x00(\x8c\x01"
				 "a](K\x01K\x02"
				 "e\x8c\x01"
				 "b]K\x03"
				 "auh\x00\x8c\x01"
				 "cK\x04s0\x8c\x02sd}(\x8c\x01kK\x05uu.";
	struct sink_rec s = {.list_key = "a", .watch_key = "sdm"};
	struct sbuf got = {.budget = 1000};
	flx_pickle *p = NULL;
	flx_error e;

	CHECK_EQ(load_sink(pk, sizeof(pk) - 1, 1 << 16, "sd", &s, &p, &e), 0);
	CHECK(s.watched.p &&
	      strcmp(s.watched.p, "s\"a\":[];s\"b\":[i3];|s\"c\":i4;|") == 0);
	CHECK(s.items.p && strcmp(s.items.p, "i1;i2;|") == 0);
	CHECK(s.pairs.p && strcmp(s.pairs.p, "s\"k\":i5;") == 0);
	if (p)
		dump(&got, flx_pickle_root(p), 0);
	CHECK(got.p && strcmp(got.p, "<s\"sdm\":<s\"a\":[],s\"b\":[i3],"
				     "s\"c\":i4>,s\"sd\":<>>") == 0);
	flx_pickle_free(p);
	free(s.watched.p);
	free(s.items.p);
	free(s.pairs.p);
	free(got.p);
	memset(&s, 0, sizeof(s));
	s.watch_key = "sdm";
	s.watch_decline = true;
	p = NULL;
	CHECK_EQ(load_sink(pk, sizeof(pk) - 1, 1 << 16, "sd", &s, &p, &e),
		 -EAGAIN);
	CHECK(p == NULL);
	free(s.pairs.p);
	/* no dict under the key: nothing watched */
	memset(&s, 0, sizeof(s));
	s.watch_key = "zz";
	CHECK_EQ(load_sink(pk, sizeof(pk) - 1, 1 << 16, "sd", &s, &p, &e), 0);
	CHECK(s.watched.p == NULL);
	flx_pickle_free(p);
	free(s.items.p);
	free(s.pairs.p);
}

/* Python's pickler ends a dict or list one item past a multiple of its
 * batch size with a lone SETITEM or APPEND: after the batches, that item
 * goes to the sink too (a batch of one), and the tree keeps none. */
static void test_sink_lone_tail(void)
{
	/* {"sd": {"k": 1, "m": 2} then "z": 3 by SETITEM,
	 *  "chunks": [1, 2] then 3 by APPEND} */
	static const char pk[] =
	    "\x80\x04}(\x8c\x02sd}(\x8c\x01kK\x01\x8c\x01mK"
	    "\x02u\x8c\x01zK\x03s\x8c\x06"
	    "chunks](K\x01K\x02"
	    "eK\x03"
	    "au.";
	struct sink_rec s = {.list_key = "chunks"};
	struct sbuf got = {.budget = 1000};
	flx_pickle *p = NULL;
	flx_error e;

	CHECK_EQ(load_sink(pk, sizeof(pk) - 1, 1 << 16, "sd", &s, &p, &e), 0);
	CHECK(s.pairs.p &&
	      strcmp(s.pairs.p, "s\"k\":i1;s\"m\":i2;s\"z\":i3;") == 0);
	CHECK_EQ(s.calls, 2);
	CHECK(s.items.p && strcmp(s.items.p, "i1;i2;|i3;|") == 0);
	if (p)
		dump(&got, flx_pickle_root(p), 0);
	CHECK(got.p && strcmp(got.p, "<s\"sd\":<>,s\"chunks\":[]>") == 0);
	flx_pickle_free(p);
	free(s.pairs.p);
	free(s.items.p);
	free(got.p);
}

/*
 * A value a sink took, changed afterwards: d = {} is appended to the
 * streamed list under its own key, then d["chunks"] = that list, so
 * Python's d holds the list that holds d, where the sink saw d empty (as
 * a BUILD of an object taken before would differ too).  The sink load
 * declines (-EAGAIN: the caller decodes the tree); a sink of values that
 * stay as taken still streams (test_sink_lone_tail).  Found by the
 * pickle_sink fuzz target (its corpus holds this input).
 */
static void test_sink_taken_changed(void)
{
	/* }\x94( 'chunks' ]( h\x00 e u . */
	static const char pk[] = "}\x94(\x8c\x06"
				 "chunks](h\x00"
				 "eu.";
	/* o = c.O() memoized; {"chunks": [o]}; then BUILD o with {} */
	static const char built[] = "\x80\x04\x8c\x01"
				    "c\x8c\x01O\x93)\x81\x94"
				    "0}(\x8c\x06"
				    "chunks](h\x00"
				    "eu0h\x00}b.";
	struct sink_rec s = {.list_key = "chunks"};
	flx_pickle *p = NULL;
	flx_error e;

	CHECK_EQ(load_sink(pk, sizeof(pk) - 1, 1 << 16, "sd", &s, &p, &e),
		 -EAGAIN);
	CHECK(strstr(e.text, "changes a value a sink took (a dict)"));
	flx_pickle_free(p);
	free(s.items.p);
	memset(&s, 0, sizeof(s));
	s.list_key = "chunks";
	p = NULL;
	/* an object appended, then BUILT through the memo */
	CHECK_EQ(load_sink(built, sizeof(built) - 1, 1 << 16, "sd", &s, &p, &e),
		 -EAGAIN);
	CHECK(strstr(e.text, "changes a value a sink took (a object)"));
	flx_pickle_free(p);
	free(s.items.p);
	free(s.pairs.p);
}

/*
 * A batch that stays in the arena: its string of 1 MiB takes a block of
 * its own (more than the free room of the arena's 2 MiB block, a string of
 * 1.5 MiB before the batch filled, and more than a quarter of a block),
 * which keeps rewind_batch() from winding it back.  The list the sink took
 * under "k" is then still in the memo, and an APPEND to it through the
 * memo after the batch declines the load, as a change of a value taken
 * does where the memo still names it (test_sink_taken_changed).  A plain
 * load of the same bytes succeeds.
 */
static void test_sink_taken_kept_batch(void)
{
	const size_t na = (size_t)3 << 19, nb = (size_t)1 << 20;
	struct sbuf b = {0};
	struct sink_rec s = {0};
	flx_pickle *p = NULL;
	flx_error e;
	char *big = malloc(na);

	CHECK(big != NULL);
	if (!big)
		return;
	memset(big, 'x', na);
	/* {"a": "x" * na, "sd": {"k": [] (memo 5), "b": "x" * nb},
	 *  "z": memo 5 + [1]} */
	put(&b, "\x80\x04}(", 4);
	put_str(&b, "a");
	put(&b, "X", 1);
	put_le(&b, na, 4);
	put(&b, big, na);
	put_str(&b, "sd");
	put(&b, "}(", 2);
	put_str(&b, "k");
	put(&b, "]", 1);
	put_binput(&b, 5);
	put_str(&b, "b");
	put(&b, "X", 1);
	put_le(&b, nb, 4);
	put(&b, big, nb);
	put(&b, "u", 1);
	put_str(&b, "z");
	put_binget(&b, 5);
	put(&b,
	    "K\x01"
	    "au.",
	    5);

	flx_error_init(&e);
	CHECK_EQ(flx_pickle_load(b.p, b.n, "t.pkl", NULL, &p, &e), 0);
	flx_pickle_free(p);
	p = NULL;
	CHECK_EQ(load_sink(b.p, b.n, 1 << 16, "sd", &s, &p, &e), -EAGAIN);
	CHECK(strstr(e.text, "changes a value a sink took (a list)"));
	flx_pickle_free(p);
	free(s.pairs.p);
	free(s.items.p);
	free(b.p);
	free(big);
}

enum { PK_PAIRS = 600000, PK_PER = 1000, PK_REF = 300000 };
enum { PK_KEY, PK_LIST, PK_SET };

/* PK_PAIRS pairs 'k<j>': [] streamed in batches of PK_PER, every list
 * memoized, every PK_PER-th key too; then tail: the key of pair PK_REF
 * (PK_KEY), its list (PK_LIST), or the memo slot of that list set again
 * (PK_SET): slots in the second memo chunk, packed by then. */
static void packed_pickle(struct sbuf *b, int mode)
{
	uint32_t memo = 0, keyref = 0, listref = 0;
	char key[32];

	put(b, "\x80\x04}(", 4);
	put_str(b, "sd");
	put(b, "}", 1);
	for (int j = 0; j < PK_PAIRS; j++) {
		if (j % PK_PER == 0)
			put(b, "(", 1);
		snprintf(key, sizeof(key), "k%d", j);
		put_str(b, key);
		if (j % PK_PER == 0) {
			if (j == PK_REF)
				keyref = memo;
			put_binput(b, memo++);
		}
		put(b, "]", 1);
		if (j == PK_REF)
			listref = memo;
		put_binput(b, memo++);
		if (j % PK_PER == PK_PER - 1)
			put(b, "u", 1);
	}
	put_str(b, "tail");
	if (mode == PK_KEY) {
		put_binget(b, keyref);
	} else if (mode == PK_LIST) {
		put_binget(b, listref);
	} else {
		put_str(b, "x");
		put_binput(b, listref);
	}
	put(b, "u.", 2);
}

/* Memo chunks that the batches filled with values the sink took are
 * freed: the strings memoized there still read back, the values taken
 * fail the load with -EAGAIN, and so does setting a packed slot again
 * (which succeeds in a plain load). */
static void test_sink_packed(void)
{
	for (int mode = PK_KEY; mode <= PK_SET; mode++) {
		struct sbuf b = {0};
		struct sink_rec s = {0};
		flx_pickle *p = NULL;
		flx_error e;
		int rc;

		packed_pickle(&b, mode);
		s.count_only = true;
		rc = load_sink(b.p, b.n, 1 << 18, "sd", &s, &p, &e);
		if (mode == PK_KEY) {
			CHECK_EQ(rc, 0);
			CHECK_EQ(s.npairs, PK_PAIRS);
			CHECK(
			    str_is(flx_pv_dict_get(flx_pickle_root(p), "tail"),
				   "k300000"));
		} else {
			CHECK_EQ(rc, -EAGAIN);
			CHECK(p == NULL);
		}
		flx_pickle_free(p);
		p = NULL;
		CHECK_EQ(load(b.p, b.n, &p, &e), 0);
		flx_pickle_free(p);
		free(s.pairs.p);
		free(b.p);
	}
}

/* PK_PAIRS pairs 'k<j>': [] as in packed_pickle(), but the first
 * PK_DENSE keys of every batch memoized too (every other slot of those
 * stretches), then tail: a tuple naming every key memoized, most of them
 * in packed chunks by then. */
enum { PK_DENSE = 40 };

static void dense_packed_pickle(struct sbuf *b)
{
	uint32_t memo = 0, *keyref = calloc(PK_PAIRS, sizeof(*keyref));
	size_t nref = 0;
	char key[32];

	CHECK(keyref != NULL);
	put(b, "\x80\x04}(", 4);
	put_str(b, "sd");
	put(b, "}", 1);
	for (int j = 0; j < PK_PAIRS; j++) {
		if (j % PK_PER == 0)
			put(b, "(", 1);
		snprintf(key, sizeof(key), "k%d", j);
		put_str(b, key);
		if (j % PK_PER < PK_DENSE) {
			keyref[nref++] = memo;
			put_binput(b, memo++);
		}
		put(b, "]", 1);
		put_binput(b, memo++);
		if (j % PK_PER == PK_PER - 1)
			put(b, "u", 1);
	}
	put_str(b, "tail");
	put(b, "(", 1);
	for (size_t i = 0; i < nref; i++)
		put_binget(b, keyref[i]);
	put(b, "tu.", 3);
	free(keyref);
}

/* Every live slot of the packed memo chunks reads back its own value,
 * wherever it lies in its chunk (the keys memoized through a sink load
 * against those of a plain load of the same pickle). */
static void test_sink_packed_dense(void)
{
	struct sbuf b = {0};
	struct sink_rec s = {.count_only = true};
	flx_pickle *p = NULL, *q = NULL;
	const flx_pv *t, *u;
	flx_error e;
	char key[32];

	dense_packed_pickle(&b);
	CHECK_EQ(load_sink(b.p, b.n, 1 << 18, "sd", &s, &p, &e), 0);
	CHECK_EQ(s.npairs, PK_PAIRS);
	CHECK_EQ(load(b.p, b.n, &q, &e), 0);
	t = flx_pv_dict_get(flx_pickle_root(p), "tail");
	u = flx_pv_dict_get(flx_pickle_root(q), "tail");
	CHECK(t && u);
	CHECK_EQ(flx_pv_len(t), (size_t)PK_PAIRS / PK_PER * PK_DENSE);
	CHECK_EQ(flx_pv_len(u), flx_pv_len(t));
	for (size_t i = 0; t && u && i < flx_pv_len(t); i++) {
		snprintf(key, sizeof(key), "k%zu",
			 i / PK_DENSE * PK_PER + i % PK_DENSE);
		CHECK(str_is(flx_pv_item(t, i), key));
		CHECK(str_is(flx_pv_item(u, i), key));
	}
	flx_pickle_free(p);
	flx_pickle_free(q);
	free(s.pairs.p);
	free(b.p);
}

/* max_nodes bounds the values a sink load holds, not those it made: the
 * 1.2 million values of packed_pickle() load through a sink under a
 * limit of 50,000 (each batch's are given back once the sink took them),
 * and a plain load under the same limit is refused. */
static void test_sink_held(void)
{
	const flx_pickle_limits lim = {.max_nodes = 50000};
	struct sbuf b = {0};
	struct sink_rec s = {.count_only = true};
	flx_pickle_sink sink = {.key = "sd", .pairs = rec_pairs, .ctx = &s};
	flx_pickle *p = NULL;
	flx_mem_reader m;
	flx_reader r;
	flx_error e;

	packed_pickle(&b, PK_KEY);
	flx_error_init(&e);
	flx_reader_mem(&r, &m, b.p, b.n);
	CHECK_EQ(flx_pickle_load_sink(&r, "t.pkl", &lim, &sink, &p, &e), 0);
	CHECK_EQ(s.npairs, PK_PAIRS);
	CHECK(str_is(flx_pv_dict_get(flx_pickle_root(p), "tail"), "k300000"));
	flx_pickle_free(p);
	p = NULL;
	flx_reader_mem(&r, &m, b.p, b.n);
	CHECK_EQ(flx_pickle_load_reader(&r, "t.pkl", &lim, &p, &e), -EINVAL);
	CHECK(strstr(e.text, "more than 50000 values") != NULL);
	CHECK(p == NULL);
	free(b.p);
}

/* Batches whose memoized strings are kept (slid down over the batch's
 * other values) fill the arena's blocks to their end and move on to new
 * ones: every kept string reads back. */
static void test_sink_kept_strings(void)
{
	enum { BATCHES = 400, LONG = 3000 };
	struct sbuf b = {0};
	struct sink_rec s = {.count_only = true};
	flx_pickle *p = NULL;
	flx_error e;
	char *text = malloc(LONG);
	const flx_pv *r;
	bool ok = true;

	CHECK(text != NULL);
	if (!text)
		return;
	put_sink_start(&b, "sd");
	for (int k = 0; k < BATCHES; k++) {
		memset(text, 'a' + k % 26, LONG);
		snprintf(text, 16, "%d:", k);
		text[strlen(text)] = 'x';
		put(&b, "(", 1);
		put_str(&b, "key");
		put(&b, "]", 1);
		put_u8(&b, 'X');
		put_le(&b, LONG, 4);
		put(&b, text, LONG);
		put_binput(&b, (uint32_t)k);
		put(&b, "a", 1);
		put(&b, "u", 1);
	}
	put_str(&b, "all");
	put(&b, "(", 1);
	for (int k = 0; k < BATCHES; k++)
		put_binget(&b, (uint32_t)k);
	put(&b, "tu.", 3);
	CHECK_EQ(load_sink(b.p, b.n, 1 << 16, "sd", &s, &p, &e), 0);
	CHECK_EQ(s.npairs, BATCHES);
	r = p ? flx_pv_dict_get(flx_pickle_root(p), "all") : NULL;
	CHECK_EQ(flx_pv_len(r), BATCHES);
	for (int k = 0; r && ok && k < BATCHES; k++) {
		const flx_pv *v = flx_pv_item(r, (size_t)k);

		memset(text, 'a' + k % 26, LONG);
		snprintf(text, 16, "%d:", k);
		text[strlen(text)] = 'x';
		ok = v && v->kind == FLX_PV_STR && v->u.str.len == LONG &&
		     memcmp(v->u.str.s, text, LONG) == 0;
	}
	CHECK(ok);
	flx_pickle_free(p);
	free(text);
	free(b.p);
}

/* Equal strings memoized in different batches and named again after
 * them: a sink load gives each its own node, where its own bytes lie
 * (flx_pv_payload(), as in a plain load), while the bytes kept are those
 * of the first. */
static void test_sink_kept_offsets(void)
{
	enum { N = 4 };
	struct sbuf b = {0};
	struct sink_rec s = {.count_only = true};
	flx_pickle *p = NULL, *q = NULL;
	flx_error e;
	const flx_pv *r, *r0;
	bool ok = true;

	put_sink_start(&b, "sd");
	for (int k = 0; k < N; k++) {
		put_mark_key(&b, k);
		put(&b, "]", 1);
		put_str(&b, "float32");
		put_binput(&b, (uint32_t)k);
		put(&b, "a", 1);
		put(&b, "u", 1);
	}
	put_str(&b, "all");
	put(&b, "(", 1);
	for (int k = 0; k < N; k++)
		put_binget(&b, (uint32_t)k);
	put(&b, "tu.", 3);
	CHECK_EQ(load_sink(b.p, b.n, 1 << 16, "sd", &s, &p, &e), 0);
	CHECK_EQ(s.npairs, N);
	CHECK_EQ(load(b.p, b.n, &q, &e), 0);
	r = p ? flx_pv_dict_get(flx_pickle_root(p), "all") : NULL;
	r0 = q ? flx_pv_dict_get(flx_pickle_root(q), "all") : NULL;
	CHECK_EQ(flx_pv_len(r), N);
	CHECK_EQ(flx_pv_len(r0), N);
	for (size_t k = 0; r && r0 && k < N; k++) {
		const flx_pv *v = flx_pv_item(r, k), *w = flx_pv_item(r0, k);
		uint64_t vo = 0, wo = 1;
		size_t vl = 0, wl = 1;

		ok = ok && str_is(v, "float32") && str_is(w, "float32") &&
		     flx_pv_payload(v, &vo, &vl) &&
		     flx_pv_payload(w, &wo, &wl) && vo == wo && vl == wl &&
		     (k == 0 || v->u.str.s == flx_pv_item(r, 0)->u.str.s);
	}
	CHECK(ok);
	flx_pickle_free(p);
	flx_pickle_free(q);
	free(b.p);
}

/* Whether tuples r (a sink load's) and r0 (a plain load's of the same
 * bytes) hold the same n strings, each payload at the same offset. */
static bool same_strs(const flx_pv *r, const flx_pv *r0, size_t n,
		      const char *want)
{
	bool ok = flx_pv_len(r) == n && flx_pv_len(r0) == n;

	for (size_t k = 0; ok && k < n; k++) {
		const flx_pv *v = flx_pv_item(r, k), *w = flx_pv_item(r0, k);
		uint64_t vo = 0, wo = 1;
		size_t vl = 0, wl = 1;

		ok = str_is(v, want) && str_is(w, want) &&
		     flx_pv_payload(v, &vo, &vl) &&
		     flx_pv_payload(w, &wo, &wl) && vo == wo && vl == wl;
	}
	return ok;
}

/* A sink load keeps each batch's memoized 'float32' string (Python's
 * pickler memoizes a new one per chunk) without a node of its own: a
 * string equal to one kept before is a word in its memo slot.  KW_PAIRS
 * of them would take KW_PAIRS * 32 bytes of arena as nodes; the load
 * allocates fewer 2 MiB blocks than that in all (memo chunks too), and
 * those named again read as in a plain load. */
enum { KW_PAIRS = 300000, KW_PER = 1000, KW_TAIL = 4 };

static void test_sink_kept_words(void)
{
	struct sbuf b = {0};
	struct sink_rec s = {.count_only = true};
	flx_pickle *p = NULL, *q = NULL;
	flx_error e;
	char key[16];
	int rc;

	put_sink_start(&b, "sd");
	for (uint32_t j = 0; j < KW_PAIRS; j++) {
		if (j % KW_PER == 0)
			put(&b, "(", 1);
		snprintf(key, sizeof(key), "k%" PRIu32, j);
		put_str(&b, key);
		put_str(&b, "float32");
		put_binput(&b, j);
		if (j % KW_PER == KW_PER - 1)
			put(&b, "u", 1);
	}
	put_str(&b, "tail");
	put(&b, "(", 1);
	for (uint32_t j = KW_PAIRS - KW_TAIL; j < KW_PAIRS; j++)
		put_binget(&b, j);
	put(&b, "tu.", 3);
#ifndef HUGE_COUNT_OFF
	nhuge = 0;
#endif
	rc = load_sink(b.p, b.n, 1 << 16, "sd", &s, &p, &e);
	CHECK_EQ(rc, 0);
#ifndef HUGE_COUNT_OFF
	CHECK(nhuge * HUGE_BLOCK < (size_t)KW_PAIRS * 32);
#endif
	CHECK_EQ(s.npairs, KW_PAIRS);
	CHECK_EQ(load(b.p, b.n, &q, &e), 0);
	CHECK(same_strs(p ? flx_pv_dict_get(flx_pickle_root(p), "tail") : NULL,
			q ? flx_pv_dict_get(flx_pickle_root(q), "tail") : NULL,
			KW_TAIL, "float32"));
	flx_pickle_free(p);
	flx_pickle_free(q);
	free(b.p);
}

/* Paddle's 0.metadata in miniature: PD_PAIRS pairs, PD_PER a batch, each
 * value a dict {'dtype': 'float32', three tuples, 'l': []} whose every
 * object is memoized, the 'float32' string a new one each time (Python's
 * pickler memoizes every object it meets): one live slot in six or
 * seven, behind values the sink took.  The first PD_NAMED values of a
 * batch also hold 'name': a string of PD_NAME bytes of its own, memoized.
 * The first pair's keys are named again through the memo; tail names
 * the 'float32' of the first and last pair of every batch and the name
 * of its first: their memo indices in ref[0 .. 3 * PD_PAIRS / PD_PER). */
enum { PD_PAIRS = 320000, PD_PER = 1000, PD_NAMED = 20, PD_NAME = 2000 };

static void pd_name(char *s, int j)
{
	memset(s, 'a' + j % 26, PD_NAME);
	s[snprintf(s, 16, "%d:", j)] = 'x';
}

static void paddle_pickle(struct sbuf *b, uint32_t *ref)
{
	static const char *const keys[] = {"dtype",  "shape", "offset",
					   "gshape", "l",     "name"};
	uint32_t memo = 0, kref[6];
	size_t nref = 0;
	char key[32], name[PD_NAME];

	put(b, "\x80\x04}(", 4);
	put_str(b, "sd");
	put(b, "}", 1);
	for (int j = 0; j < PD_PAIRS; j++) {
		int nk = j % PD_PER < PD_NAMED ? 6 : 5;

		if (j % PD_PER == 0)
			put(b, "(", 1);
		snprintf(key, sizeof(key), "k%d", j);
		put_str(b, key);
		put(b, "}", 1);
		put_binput(b, memo++);
		put(b, "(", 1);
		for (int k = 0; k < nk; k++) {
			if (j) {
				put_binget(b, kref[k]);
			} else {
				put_str(b, keys[k]);
				kref[k] = memo;
				put_binput(b, memo++);
			}
			if (k == 0) {
				put_str(b, "float32");
				if (j % PD_PER == 0 || j % PD_PER == PD_PER - 1)
					ref[nref++] = memo;
				put_binput(b, memo++);
			} else if (k < 4) {
				put_binint(b, k == 3 ? PD_PAIRS : j % PD_PER);
				put_binint(b, k == 2 ? 0 : 4);
				put(b, "\x86", 1);
				put_binput(b, memo++);
			} else if (k == 4) {
				put(b, "]", 1);
				put_binput(b, memo++);
			} else {
				pd_name(name, j);
				put_u8(b, 'X');
				put_le(b, PD_NAME, 4);
				put(b, name, PD_NAME);
				if (j % PD_PER == 0)
					ref[nref++] = memo;
				put_binput(b, memo++);
			}
		}
		put(b, "u", 1);
		if (j % PD_PER == PD_PER - 1)
			put(b, "u", 1);
	}
	put_str(b, "tail");
	put(b, "(", 1);
	for (size_t i = 0; i < nref; i++)
		put_binget(b, ref[i]);
	put(b, "tu.", 3);
}

/* What a sink load of paddle_pickle() holds stays bounded: the values of
 * the batches the sink took (also of those that fill an arena block with
 * the names kept, and go on in a new one), the 'float32' strings kept
 * (a value each, counted as a node is, though equal ones take only their
 * memo slot's word), and the memo chunks the batches filled (packed,
 * though one slot in six is live): under limits of 400,000 values
 * (320,000 of them the 'float32' strings) and 2,000,000
 * memo slots, of the 4 million values and 2 million slots it makes.
 * Every string named again reads back, as in a plain load. */
static void test_sink_paddle_held(void)
{
	const flx_pickle_limits lim = {
	    .max_nodes = 400000, .max_memo = 2000000, .max_str = PD_NAME};
	struct sbuf b = {0};
	struct sink_rec s = {.count_only = true};
	flx_pickle_sink sink = {.key = "sd", .pairs = rec_pairs, .ctx = &s};
	uint32_t ref[3 * PD_PAIRS / PD_PER];
	flx_pickle *p = NULL, *q = NULL;
	const flx_pv *t, *u;
	flx_mem_reader m;
	flx_reader r;
	flx_error e;
	char name[PD_NAME];
	bool ok = true;

	paddle_pickle(&b, ref);
	flx_error_init(&e);
	flx_reader_mem(&r, &m, b.p, b.n);
	CHECK_EQ(flx_pickle_load_sink(&r, "t.pkl", &lim, &sink, &p, &e), 0);
	CHECK_EQ(s.npairs, PD_PAIRS);
	CHECK_EQ(load(b.p, b.n, &q, &e), 0);
	t = p ? flx_pv_dict_get(flx_pickle_root(p), "tail") : NULL;
	u = q ? flx_pv_dict_get(flx_pickle_root(q), "tail") : NULL;
	CHECK_EQ(flx_pv_len(t), sizeof(ref) / sizeof(ref[0]));
	CHECK_EQ(flx_pv_len(u), flx_pv_len(t));
	for (size_t i = 0; t && u && i < flx_pv_len(t); i++) {
		const flx_pv *v = flx_pv_item(t, i), *w = flx_pv_item(u, i);

		if (i % 3 == 1) {
			pd_name(name, (int)(i / 3) * PD_PER);
			ok = ok && v && v->kind == FLX_PV_STR &&
			     v->u.str.len == PD_NAME && w &&
			     w->kind == FLX_PV_STR && w->u.str.len == PD_NAME &&
			     memcmp(v->u.str.s, name, PD_NAME) == 0 &&
			     memcmp(w->u.str.s, name, PD_NAME) == 0;
		} else {
			ok = ok && str_is(v, "float32") && str_is(w, "float32");
		}
	}
	CHECK(ok);
	flx_pickle_free(p);
	flx_pickle_free(q);
	free(b.p);
}

static int load_drop(const void *data, size_t n, size_t window,
		     const char *drop, size_t max_nodes, struct sink_rec *s,
		     flx_pickle **p, flx_error *e)
{
	const flx_pickle_limits lim = {.max_nodes = max_nodes,
				       .window = window,
				       .max_copy = SIZE_MAX / 4,
				       .max_str = SIZE_MAX / 4};
	flx_pickle_sink sink = {.key = "storage_data",
				.pairs = rec_pairs,
				.ctx = s,
				.list_key = "chunks",
				.items = rec_items,
				.drop_key = drop};
	flx_mem_reader m;
	flx_reader r;

	flx_error_init(e);
	flx_reader_mem(&r, &m, data, n);
	return flx_pickle_load_sink(&r, "t.pkl", &lim, &sink, p, e);
}

/* The equal strings kept past their batches, named again inside a later
 * batch of the sink dict (and memoized again there), inside a batch of a
 * dropped value, and after both: each reads as in a plain load, its own
 * offset, in every place. */
static void test_sink_kept_named_in_batch(void)
{
	enum { N = 6 };
	struct sbuf b = {0};
	struct sink_rec s = {.count_only = true};
	flx_pickle *p = NULL, *q = NULL;
	flx_error e;

	put_sink_start(&b, "storage_data");
	for (int k = 0; k < N; k++) {
		put_mark_key(&b, k);
		put_str(&b, "float32");
		put_binput(&b, (uint32_t)k);
		put(&b, "u", 1);
	}
	/* a batch naming kept strings 1 and 2, and 1 again as N */
	put(&b, "(", 1);
	put_str(&b, "x");
	put_binget(&b, 1);
	put_binput(&b, N);
	put_str(&b, "y");
	put_binget(&b, 2);
	put(&b, "u", 1);
	/* a dropped value's batch naming 3 and 4 */
	put_str(&b, "plans");
	put(&b, "](", 2);
	put_binget(&b, 3);
	put_binget(&b, 4);
	put(&b, "e", 1);
	put_str(&b, "all");
	put(&b, "(", 1);
	for (int k = 0; k <= N; k++)
		put_binget(&b, (uint32_t)k);
	put(&b, "tu.", 3);
	CHECK_EQ(load_drop(b.p, b.n, 1 << 16, "plans", 0, &s, &p, &e), 0);
	CHECK_EQ(s.npairs, N + 2);
	CHECK_EQ(load(b.p, b.n, &q, &e), 0);
	CHECK(same_strs(p ? flx_pv_dict_get(flx_pickle_root(p), "all") : NULL,
			q ? flx_pv_dict_get(flx_pickle_root(q), "all") : NULL,
			N + 1, "float32"));
	CHECK(p && !flx_pv_dict_get(flx_pickle_root(p), "plans"));
	flx_pickle_free(p);
	flx_pickle_free(q);
	free(b.p);
}

/* Leave the pair under key out of dict d (a plain load's tree, the
 * oracle of what a drop leaves). */
static bool unset(flx_pv *d, const char *key)
{
	for (size_t i = 0; d && d->kind == FLX_PV_DICT && i < d->u.dict.n;
	     i++) {
		const char *k = flx_pv_str(d->u.dict.kv[2 * i]);

		if (!k || strcmp(k, key) != 0)
			continue;
		memmove(d->u.dict.kv + 2 * i, d->u.dict.kv + 2 * i + 2,
			(2 * (d->u.dict.n - i - 1)) * sizeof(*d->u.dict.kv));
		d->u.dict.n--;
		return true;
	}
	return false;
}

/* The real Megatron-Core .metadata (MCoreMetadata with all_local_plans,
 * whose WriteItems name the chunks of state_dict_metadata again): with
 * all_local_plans dropped, storage_data and every chunks list stream in
 * one decode, the sink sees the pairs and items of a plain load's tree,
 * and the rest is that tree without all_local_plans; without the drop
 * the decode is declined (-EAGAIN). */
static void test_sink_drop_megatron(void)
{
	static const char *const files[] = {
	    "../../fixtures/megatron-moe/ckpt/iter_0000100/.metadata",
	    "../../fixtures/megatron-optim-dp-reshardable/ckpt/iter_0000100/"
	    ".metadata"};

	for (int i = 0; i < 2; i++) {
		size_t len = 0;
		unsigned char *buf = check_read_file(files[i], &len);
		flx_pickle *p = NULL;
		flx_error e;
		flx_pv *sd, *sdm, *st;
		size_t nsd;
		struct sbuf want = {0}, rest = {0}, witems = {0};
		struct sink_rec s0 = {.list_key = "chunks"};

		CHECK(buf != NULL);
		if (!buf)
			continue;
		CHECK_EQ(load(buf, len, &p, &e), 0);
		st = (flx_pv *)state(flx_pickle_root(p));
		sd = (flx_pv *)flx_pv_dict_get(st, "storage_data");
		CHECK(flx_pv_len(sd) > 0);
		for (size_t j = 0; sd && j < 2 * sd->u.dict.n; j++) {
			want.budget = 100000;
			dump(&want, sd->u.dict.kv[j], 0);
			puts_(&want, j & 1 ? ";" : ":");
		}
		nsd = flx_pv_len(sd);
		if (sd)
			sd->u.dict.n = 0;
		sdm = (flx_pv *)flx_pv_dict_get(st, "state_dict_metadata");
		for (size_t j = 0; sdm && j < sdm->u.dict.n; j++) {
			flx_pv *ch = (flx_pv *)flx_pv_dict_get(
			    state(sdm->u.dict.kv[2 * j + 1]), "chunks");

			if (!ch || ch->u.seq.n < 2)
				continue;
			for (size_t k = 0; k < ch->u.seq.n; k++) {
				witems.budget = 100000;
				dump(&witems, ch->u.seq.v[k], 0);
				puts_(&witems, ";");
			}
			puts_(&witems, "|");
			ch->u.seq.n = 0;
		}
		CHECK(witems.p != NULL);
		CHECK(flx_pv_len(flx_pv_dict_get(st, "all_local_plans")) > 0);
		CHECK(unset(st, "all_local_plans"));
		rest.budget = 100000;
		dump(&rest, flx_pickle_root(p), 0);
		flx_pickle_free(p);
		p = NULL;
		CHECK_EQ(load_drop(buf, len, 1 << 16, NULL, 0, &s0, &p, &e),
			 -EAGAIN);
		free(s0.pairs.p);
		free(s0.items.p);
		for (size_t w = 7; w <= 7u << 16; w <<= 16) {
			struct sink_rec s = {.list_key = "chunks"};
			struct sbuf got = {.budget = 100000};
			const flx_pv *r;

			p = NULL;
			CHECK_EQ(load_drop(buf, len, w, "all_local_plans", 0,
					   &s, &p, &e),
				 0);
			if (!p)
				continue;
			r = flx_pickle_root(p);
			CHECK_EQ(s.npairs, nsd);
			CHECK(s.pairs.p && want.p &&
			      strcmp(s.pairs.p, want.p) == 0);
			CHECK(s.items.p && witems.p &&
			      strcmp(s.items.p, witems.p) == 0);
			CHECK(flx_pv_dict_get(state(r), "all_local_plans") ==
			      NULL);
			dump(&got, r, 0);
			CHECK(got.p && rest.p && strcmp(got.p, rest.p) == 0);
			flx_pickle_free(p);
			free(s.pairs.p);
			free(s.items.p);
			free(got.p);
		}
		free(want.p);
		free(witems.p);
		free(rest.p);
		free(buf);
	}
}

enum { DR_DROP, DR_OUTSIDE, DR_LATER, DR_CONTAINER, DR_STOP, DR_PLAIN };

/*
 * {'storage_data': {'k0': [v], 'k1': [v]}, KEY: PLANS, 'x': NAME, ...}:
 * storage_data streamed, its first list memoized (slot 0, a value the
 * sink took).  PLANS: np plans {'items': [ni items {'c': slot 0 (a str
 * 'c0' for DR_PLAIN), 'n': i}], 'name': 'p<p>' (memoized)}, each level
 * filled by one MARK ... SETITEMS or APPENDS (n: i % 7, ints a batch
 * shares, see new_int()).  KEY is 'plans', but
 * 'keep' for DR_OUTSIDE.  NAME names the last plan's name through the
 * memo.  DR_LATER adds 'y': the last plan's dict through the memo;
 * DR_CONTAINER appends to slot 0 inside the plans; DR_STOP ends the
 * pickle there, the last plan's items list its root.
 */
static void drop_pickle(struct sbuf *b, int mode, int np, int ni)
{
	uint32_t memo = 1, name = 0, plan = 0;
	char t[32];

	put(b, "\x80\x04}(", 4);
	put_str(b, "storage_data");
	put(b, "}(", 2);
	put_str(b, "k0");
	put(b, "]", 1);
	put_binput(b, 0);
	put_str(b, "v");
	put(b, "a", 1);
	put_str(b, "k1");
	put(b, "]", 1);
	put_str(b, "v");
	put(b, "au", 2);
	put_str(b, mode == DR_OUTSIDE ? "keep" : "plans");
	put(b, "](", 2);
	if (mode == DR_PLAIN)
		put_str(b, "c0"), put_binput(b, memo++), put(b, "0", 1);
	for (int p = 0; p < np; p++) {
		put(b, "}", 1);
		put_binput(b, plan = memo++);
		put(b, "(", 1);
		put_str(b, "items");
		put(b, "](", 2);
		for (int i = 0; i < ni; i++) {
			put(b, "}(", 2);
			put_str(b, "c");
			put_binget(b, mode == DR_PLAIN ? 1 : 0);
			put_str(b, "n");
			put_u8(b, 'J');
			put_le(b, (uint64_t)((p * ni + i) % 7), 4);
			put(b, "u", 1);
		}
		put(b, "e", 1);
		if (mode == DR_CONTAINER && p == np - 1) {
			put_binget(b, 0);
			put(b, "(", 1);
			put_str(b, "z");
			put(b, "e0", 2);
		}
		if (mode == DR_STOP && p == np - 1)
			put(b, ".", 1);
		put_str(b, "name");
		snprintf(t, sizeof(t), "p%d", p);
		put_str(b, t);
		put_binput(b, name = memo++);
		put(b, "u", 1);
	}
	put(b, "e", 1);
	put_str(b, "x");
	put_binget(b, name);
	if (mode == DR_LATER) {
		put_str(b, "y");
		put_binget(b, plan);
	}
	put(b, "u.", 2);
}

/* A dropped value's batches name what the sink took, yet the load goes
 * through and the tree lacks its key, while the strings it memoized keep
 * their value; the same reference outside it, a later reference to a
 * container made in it, a use of what the sink took as a container in
 * it, or a STOP in it, fail the load with -EAGAIN; its values are given back as
 * its batches end: it decodes under a max_nodes it far exceeds, which a load
 * without the drop does not. */
static void test_sink_drop(void)
{
	enum { NP = 40, NI = 100 };
	static const int fails[] = {DR_OUTSIDE, DR_LATER, DR_CONTAINER,
				    DR_STOP};

	for (size_t w = 5; w <= 5u << 16; w <<= 16) {
		struct sbuf b = {0}, got = {.budget = 1000};
		struct sink_rec s = {.list_key = "chunks"};
		flx_pickle *p = NULL;
		flx_error e;

		drop_pickle(&b, DR_DROP, NP, NI);
		CHECK_EQ(load_drop(b.p, b.n, w, "plans", 0, &s, &p, &e), 0);
		CHECK_EQ(s.npairs, 2);
		if (p)
			dump(&got, flx_pickle_root(p), 0);
		CHECK(got.p && strcmp(got.p, "<s\"storage_data\":<>,"
					     "s\"x\":s\"p39\">") == 0);
		flx_pickle_free(p);
		free(got.p);
		free(s.pairs.p);
		free(b.p);
		for (size_t f = 0; f < sizeof(fails) / sizeof(*fails); f++) {
			struct sink_rec s2 = {.list_key = "chunks"};

			memset(&b, 0, sizeof(b));
			drop_pickle(&b, fails[f], NP, NI);
			p = NULL;
			CHECK_EQ(
			    load_drop(b.p, b.n, w, "plans", 0, &s2, &p, &e),
			    -EAGAIN);
			CHECK(p == NULL);
			free(s2.pairs.p);
			free(b.p);
		}
	}
	/* memory: 40 x 100 items (16,000 values) decode in 2,000 held */
	{
		struct sbuf b = {0};
		struct sink_rec s = {.list_key = "chunks"};
		flx_pickle *p = NULL;
		flx_error e;

		drop_pickle(&b, DR_PLAIN, NP, NI);
		CHECK_EQ(
		    load_drop(b.p, b.n, 1 << 16, "plans", 2000, &s, &p, &e), 0);
		CHECK(p &&
		      flx_pv_dict_get(flx_pickle_root(p), "plans") == NULL);
		flx_pickle_free(p);
		p = NULL;
		CHECK_EQ(load_drop(b.p, b.n, 1 << 16, NULL, 2000, &s, &p, &e),
			 -EINVAL);
		CHECK(strstr(e.text, "more than 2000 values") != NULL);
		free(s.pairs.p);
		free(b.p);
	}
}

/*
 * {'storage_data': {'k0': [v]}, 'plans': PLANS, 'x': NAMES, ...}, shaped
 * as Megatron-Core's all_local_plans: PLANS is one MARK ... APPENDS of
 * DP_PLANS plans {'name': 'p<p>' (memoized), 'items': [DP_ITEMS items
 * {'c': 'c0', 't': (p, i)}, item and tuple memoized, in APPENDS batches of
 * 1,000]}, so that the plans' outer batches stay open across several memo
 * chunks and log a slot in each.  NAMES: a tuple of every plan's name
 * through the memo.  set_again: then 'y' sets slot DP_AGAIN (an item of
 * the second memo chunk) again.
 */
enum { DP_PLANS = 120, DP_ITEMS = 3000, DP_AGAIN = 300000 };

static void drop_plans_pickle(struct sbuf *b, bool set_again)
{
	uint32_t memo = 1, c0, names[DP_PLANS];
	char t[32];

	put(b, "\x80\x04}(", 4);
	put_str(b, "storage_data");
	put(b, "}(", 2);
	put_str(b, "k0");
	put(b, "]", 1);
	put_binput(b, 0);
	put_str(b, "v");
	put(b, "au", 2);
	put_str(b, "c0");
	put_binput(b, c0 = memo++);
	put(b, "0", 1);
	put_str(b, "plans");
	put(b, "](", 2);
	for (int p = 0; p < DP_PLANS; p++) {
		put(b, "}(", 2);
		put_str(b, "name");
		snprintf(t, sizeof(t), "p%d", p);
		put_str(b, t);
		put_binput(b, names[p] = memo++);
		put_str(b, "items");
		put(b, "]", 1);
		for (int i = 0; i < DP_ITEMS; i++) {
			if (i % 1000 == 0)
				put(b, "(", 1);
			put(b, "}", 1);
			put_binput(b, memo++);
			put(b, "(", 1);
			put_str(b, "c");
			put_binget(b, c0);
			put_str(b, "t");
			put_binint(b, p);
			put_binint(b, i);
			put(b, "\x86", 1);
			put_binput(b, memo++);
			put(b, "u", 1);
			if (i % 1000 == 999 || i == DP_ITEMS - 1)
				put(b, "e", 1);
		}
		put(b, "u", 1);
	}
	put(b, "e", 1);
	put_str(b, "x");
	put(b, "(", 1);
	for (int p = 0; p < DP_PLANS; p++)
		put_binget(b, names[p]);
	put(b, "t", 1);
	if (set_again) {
		put_str(b, "y");
		put_str(b, "z");
		put_binput(b, DP_AGAIN);
	}
	put(b, "u.", 2);
}

/* The memo chunks a dropped value's batches fill are packed while its
 * outer batches stay open (each plan logged a slot in them): the names
 * its plans memoized read back as a plain load's, and setting a slot of
 * them again afterwards fails the load with -EAGAIN, as for any packed
 * chunk (a plain load, and a sink load that packs nothing, take it). */
static void test_sink_drop_packed(void)
{
	struct sbuf b = {0};
	struct sink_rec s = {.list_key = "chunks"};
	flx_pickle *p = NULL, *q = NULL;
	const flx_pv *t, *u;
	flx_error e;

	drop_plans_pickle(&b, false);
	CHECK_EQ(load_drop(b.p, b.n, 1 << 16, "plans", 0, &s, &p, &e), 0);
	CHECK_EQ(s.npairs, 1);
	CHECK_EQ(load(b.p, b.n, &q, &e), 0);
	CHECK(p && flx_pv_dict_get(flx_pickle_root(p), "plans") == NULL);
	CHECK_EQ(flx_pv_len(flx_pv_dict_get(flx_pickle_root(q), "plans")),
		 DP_PLANS);
	t = p ? flx_pv_dict_get(flx_pickle_root(p), "x") : NULL;
	u = q ? flx_pv_dict_get(flx_pickle_root(q), "x") : NULL;
	CHECK_EQ(flx_pv_len(t), DP_PLANS);
	CHECK_EQ(flx_pv_len(u), DP_PLANS);
	for (size_t i = 0; t && u && i < DP_PLANS; i++) {
		const char *want = flx_pv_str(flx_pv_item(u, i));

		CHECK(want && str_is(flx_pv_item(t, i), want));
	}
	flx_pickle_free(p);
	flx_pickle_free(q);
	free(s.pairs.p);
	free(s.items.p);
	free(b.p);

	memset(&b, 0, sizeof(b));
	memset(&s, 0, sizeof(s));
	s.list_key = "chunks";
	drop_plans_pickle(&b, true);
	p = q = NULL;
	CHECK_EQ(load_drop(b.p, b.n, 1 << 16, "plans", 0, &s, &p, &e), -EAGAIN);
	CHECK(p == NULL);
	CHECK(strstr(e.text, "set again after its chunk was packed") != NULL);
	CHECK_EQ(load(b.p, b.n, &q, &e), 0);
	CHECK(q && str_is(flx_pv_dict_get(flx_pickle_root(q), "y"), "z"));
	flx_pickle_free(q);
	free(s.pairs.p);
	free(s.items.p);
	free(b.p);
}

int main(void)
{
	test_vectors();
	test_memo_sharing();
	test_objects();
	test_scalars();
	test_dcp_metadata();
	test_text_opcodes();
	test_binary_opcodes();
	test_helpers();
	test_big_lists();
	test_big_dict_and_memo();
	test_big_strings();
	test_big_memo();
	test_sharing();
	test_size_sharing();
	test_malformed();
	test_damage();
	test_reader_vectors();
	test_reader_damage();
	test_numpy();
	test_huge_payload();
	test_many_payloads();
	test_file_payload();
	test_reader_str_limits();
	test_sink_dcp();
	test_sink_list_parent();
	test_sink_watch();
	test_sink_lone_tail();
	test_sink_taken_changed();
	test_sink_taken_kept_batch();
	test_sink_batches();
	test_sink_named_again();
	test_sink_packed();
	test_sink_packed_dense();
	test_sink_held();
	test_sink_kept_strings();
	test_sink_paddle_held();
	test_sink_kept_offsets();
	test_sink_kept_named_in_batch();
	test_sink_kept_words();
	test_sink_drop_megatron();
	test_sink_drop();
	test_sink_drop_packed();
	return CHECK_RESULT();
}
