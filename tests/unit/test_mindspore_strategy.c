/* SPDX-License-Identifier: MIT */
/* MindSpore strategy parser and box arithmetic (resolver/mindspore/
 * strategy.h) against the byte strings and worked examples of
 * docs/formats/mindspore.md#worked-examples,
 * docs/formats/mindspore.md#mindformers-strategies,
 * docs/formats/mindspore.md#byte-examples (tables copied by hand: the oracle is
 * the spec, not the code). */
#include "check.h"
#include "strategy.h"

#include <errno.h>
#include <string.h>

static flx_ms_strategy *parse(const void *b, size_t n, bool json, flx_error *e)
{
	flx_ms_strategy *s = NULL;
	flx_error_init(e);
	int rc = flx_ms_strategy_parse(b, n, json, "s.ckpt", &s, e);
	if (rc < 0)
		return NULL;
	return s;
}

/* A strategy file of current_stage stage (one byte) and one layout item
 * (its wire bytes, under 60), parsed; NULL on failure. */
static flx_ms_strategy *parse_item(unsigned stage, const unsigned char *item,
				   size_t n, flx_error *e)
{
	unsigned char buf[64];

	buf[0] = 0x08; /* current_stage */
	buf[1] = (unsigned char)stage;
	buf[2] = 0x1a; /* parallel_layout_item */
	buf[3] = (unsigned char)n;
	memcpy(buf + 4, item, n);
	return parse(buf, 4 + n, false, e);
}

/* docs/formats/mindspore.md#byte-examples: 70 bytes, D=[2,4], T=[1,-1], stage 0
 */
static const unsigned char ex53[] = {
    0x08, 0x01, 0x12, 0x1c, 0x0a, 0x0a, 0x4d, 0x61, 0x74, 0x4d, 0x75, 0x6c,
    0x2d, 0x6f, 0x70, 0x30, 0x12, 0x0e, 0x08, 0x00, 0x12, 0x04, 0x08, 0x02,
    0x08, 0x01, 0x12, 0x04, 0x08, 0x01, 0x08, 0x04, 0x1a, 0x24, 0x0a, 0x01,
    0x77, 0x12, 0x1f, 0x0a, 0x04, 0x08, 0x02, 0x08, 0x04, 0x12, 0x0d, 0x08,
    0x01, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
    0x1a, 0x00, 0x22, 0x00, 0x28, 0x00, 0x30, 0x00, 0x38, 0x00};

static void box_is(const flx_ms_layout *l, const uint64_t *S, uint64_t rank,
		   uint64_t s0, uint64_t l0, uint64_t s1, uint64_t l1, int line)
{
	uint64_t st[2] = {99, 99}, ln[2] = {99, 99};
	int rc = flx_ms_box(l, S, rank, st, ln);
	if (rc || st[0] != s0 || ln[0] != l0 ||
	    (l->ndim > 1 && (st[1] != s1 || ln[1] != l1))) {
		fprintf(stderr,
			"line %d rank %llu: rc %d box [%llu+%llu, %llu+%llu] "
			"want [%llu+%llu, %llu+%llu]\n",
			line, (unsigned long long)rank, rc,
			(unsigned long long)st[0], (unsigned long long)ln[0],
			(unsigned long long)st[1], (unsigned long long)ln[1],
			(unsigned long long)s0, (unsigned long long)l0,
			(unsigned long long)s1, (unsigned long long)l1);
		check_failures++;
	}
}
#define BOX(l, S, r, a, b, c, d) box_is(l, S, r, a, b, c, d, __LINE__)

static void test_ex53_and_examples(void)
{
	flx_error e;
	flx_ms_strategy *s = parse(ex53, sizeof(ex53), false, &e);
	CHECK(s != NULL);
	if (!s)
		return;
	CHECK_EQ(s->nlayouts, 1);
	CHECK_EQ(s->devices, 8);
	CHECK_EQ(s->nstages, 1);
	CHECK(!s->merged);
	flx_ms_layout *l = &s->layouts[0];
	CHECK_STR(l->name, "w");
	CHECK_EQ(l->ndev, 2);
	CHECK_EQ(l->dev[0], 2);
	CHECK_EQ(l->dev[1], 4);
	CHECK_EQ(l->ndim, 2);
	CHECK_EQ(l->nmap[0], 1);
	CHECK_EQ(l->map[0][0], 1);
	CHECK_EQ(l->nmap[1], 0);
	CHECK(flx_ms_strategy_find(s, "w", 0) == l);
	CHECK(flx_ms_strategy_find(s, "w", 1) == NULL);
	CHECK(flx_ms_strategy_find(s, "x", UINT32_MAX) == NULL);

	/* Example 1 */
	uint64_t S[2] = {1024, 512}, f[2];
	for (uint64_t r = 0; r < 8; r++)
		BOX(l, S, r, r < 4 ? 0 : 512, 512, 0, 512);
	flx_ms_factors(l, f);
	CHECK_EQ(f[0], 2);
	CHECK_EQ(f[1], 1);
	uint64_t st[2], ln[2];
	CHECK_EQ(flx_ms_box(l, S, 8, st, ln), -EINVAL);
	uint64_t odd[2] = {1023, 512};
	CHECK_EQ(flx_ms_box(l, odd, 0, st, ln), -EINVAL);

	/* Example 3: opt shard size 4 (and -1), step 1 */
	l->opt_step = 1;
	l->opt_size = 4;
	for (uint64_t r = 0; r < 8; r++)
		BOX(l, S, r, 128 * r, 128, 0, 512);
	CHECK_EQ(flx_ms_opt_parts(l), 4);
	flx_ms_factors(l, f);
	CHECK_EQ(f[0], 8);
	l->opt_size = -1;
	for (uint64_t r = 0; r < 8; r++)
		BOX(l, S, r, 128 * r, 128, 0, 512);
	/* size 2: ranks 0,2 rows 0:256; 1,3 256:512; 4,6 512:768; 5,7 */
	l->opt_size = 2;
	static const uint64_t e3[8] = {0, 256, 0, 256, 512, 768, 512, 768};
	for (uint64_t r = 0; r < 8; r++)
		BOX(l, S, r, e3[r], 256, 0, 512);
	/* size larger than R is clamped to R */
	l->opt_size = 16;
	CHECK_EQ(flx_ms_opt_parts(l), 4);
	/* step 0: no optimizer shard (MindFormers quirk) */
	l->opt_step = 0;
	l->opt_size = -1;
	CHECK_EQ(flx_ms_opt_parts(l), 1);

	/* pure DP over three repeated dims (D=[2,2,2], 1-D T=[-1]) with a
	 * full optimizer shard: G is all 8 ranks, q = rank */
	l->ndev = 3;
	l->dev[0] = l->dev[1] = l->dev[2] = 2;
	l->ndim = 1;
	l->nmap[0] = 0;
	l->opt_step = 1;
	l->opt_size = -1;
	uint64_t S1[1] = {16};
	for (uint64_t r = 0; r < 8; r++)
		BOX(l, S1, r, 2 * r, 2, 0, 0);
	l->opt_size = 4; /* groups [0..3], [4..7] */
	for (uint64_t r = 0; r < 8; r++)
		BOX(l, S1, r, 4 * (r % 4), 4, 0, 0);
	l->opt_step = 0;
	l->ndev = 2;
	l->dev[0] = 2;
	l->dev[1] = 4;
	l->ndim = 2;

	/* Example 2: T=[-1,0] */
	l->nmap[0] = 0;
	l->nmap[1] = 1;
	l->map[1][0] = 0;
	for (uint64_t r = 0; r < 8; r++)
		BOX(l, S, r, 0, 1024, 128 * (r % 4), 128);
	flx_ms_strategy_free(s);
}

/* docs/formats/mindspore.md#mindformers-strategies layout item (Example 4):
 * shard (2,1), local (512,512), 8 ranks */
static const unsigned char ex3item[] = {
    0x0a, 0x01, 0x77, 0x12, 0x1c, 0x0a, 0x06, 0x08, 0x04, 0x08, 0x02,
    0x08, 0x01, 0x12, 0x04, 0x08, 0x01, 0x08, 0x00, 0x1a, 0x06, 0x08,
    0x80, 0x04, 0x08, 0x80, 0x04, 0x28, 0x00, 0x30, 0x00, 0x38, 0x00};

static void test_ex4_mindformers(void)
{
	flx_error e;
	flx_ms_strategy *s = parse_item(0, ex3item, sizeof(ex3item), &e);
	CHECK(s != NULL);
	if (!s)
		return;
	flx_ms_layout *l = &s->layouts[0];
	CHECK_EQ(l->ndev, 3);
	CHECK_EQ(l->nsplit, 0); /* param_split_shape without offsets */
	uint64_t S[2] = {1024, 512};
	for (uint64_t r = 0; r < 8; r++)
		BOX(l, S, r, 512 * (r % 2), 512, 0, 512);
	l->opt_step = 2;
	l->opt_size = 4;
	static const uint64_t e4[8] = {0, 512, 128, 640, 256, 768, 384, 896};
	for (uint64_t r = 0; r < 8; r++)
		BOX(l, S, r, e4[r], 128, 0, 512);
	flx_ms_strategy_free(s);
}

/* docs/formats/mindspore.md#optimizer-shard from the stored dims: Example 4
 * (TP2 x DP4, R = 4, S = [1024,512]) saved with ZeRO while its strategy says
 * step = size = 0 */
static void test_opt_infer(void)
{
	flx_error e;
	flx_ms_layout o;
	uint64_t p;
	flx_ms_strategy *s = parse_item(1, ex3item, sizeof(ex3item), &e);
	CHECK(s != NULL);
	if (!s)
		return;
	flx_ms_layout *l = &s->layouts[0];
	uint64_t S[2] = {1024, 512};
	/* rows 128: P = 4, the spec's ZeRO-3 boxes */
	static const uint64_t e4[8] = {0, 512, 128, 640, 256, 768, 384, 896};
	for (uint64_t r = 0; r < 8; r++) {
		uint64_t d[2] = {128, 512};
		CHECK_EQ(flx_ms_opt_infer(l, S, r, d, &p), 0);
		CHECK_EQ(p, 4);
		flx_ms_layout_opt(l, p, &o);
		BOX(&o, S, r, e4[r], 128, 0, 512);
	}
	/* rows 256: P = 2, G = {r%2, r%2+2, ...} cut in pairs, q = (r/2)%2 */
	for (uint64_t r = 0; r < 8; r++) {
		uint64_t d[2] = {256, 512};
		CHECK_EQ(flx_ms_opt_infer(l, S, r, d, &p), 0);
		CHECK_EQ(p, 2);
		flx_ms_layout_opt(l, p, &o);
		BOX(&o, S, r, 512 * (r % 2) + 256 * ((r / 2) % 2), 256, 0, 512);
	}
	/* no shard: the box itself, no integer factor, P = 8 not dividing
	 * R = 4, another dim differing */
	static const uint64_t none[5][2] = {
	    {512, 512}, {384, 512}, {64, 512}, {128, 256}, {1024, 512}};
	for (int i = 0; i < 5; i++) {
		p = 9;
		CHECK_EQ(flx_ms_opt_infer(l, S, 3, none[i], &p), 0);
		CHECK_EQ(p, 1);
	}
	/* a layout with its shard recorded is taken as it is */
	l->opt_step = 2;
	l->opt_size = 4;
	uint64_t d[2] = {128, 512};
	CHECK_EQ(flx_ms_opt_infer(l, S, 0, d, &p), 0);
	CHECK_EQ(p, 1);
	flx_ms_strategy_free(s);
}

/* docs/formats/mindspore.md#byte-examples Layout-API 1-D item D=[2,2,2], map
 * [[2,1]] (+ empty entry), and Example 6 (nested [[2,1],[0]], S=[8,6]) through
 * JSON lists of lists */
static const unsigned char ex53item1d[] = {
    0x0a, 0x01, 0x62, 0x12, 0x1a, 0x0a, 0x06, 0x08, 0x02, 0x08, 0x02,
    0x08, 0x02, 0x12, 0x04, 0x08, 0x02, 0x08, 0x01, 0x12, 0x00, 0x1a,
    0x00, 0x22, 0x00, 0x28, 0x00, 0x30, 0x00, 0x38, 0x00};

static void test_nested(void)
{
	flx_error e;
	flx_ms_strategy *s = parse_item(1, ex53item1d, sizeof(ex53item1d), &e);
	CHECK(s != NULL);
	if (s) {
		flx_ms_layout *l = &s->layouts[0];
		CHECK(l->nested);
		CHECK_EQ(l->ndim, 1);
		CHECK_EQ(l->nmap[0], 2);
		uint64_t S[1] = {8};
		for (uint64_t r = 0; r < 8; r++)
			BOX(l, S, r, 2 * (r / 2), 2, 0, 0);
		flx_ms_strategy_free(s);
	}
	const char *js = "{\"current_stage\":1,\"parallel_layout_item\":{\"m\":"
			 "{\"dev_matrix\":[2,2,2],\"tensor_map\":[[2,1],[0]],"
			 "\"field\":0}}}";
	s = parse(js, strlen(js), true, &e);
	CHECK(s != NULL);
	if (s) {
		flx_ms_layout *l = &s->layouts[0];
		uint64_t S[2] = {8, 6};
		for (uint64_t r = 0; r < 8; r++)
			BOX(l, S, r, 2 * (r / 2), 2, 3 * (r % 2), 3);
		flx_ms_strategy_free(s);
	}
}

/* Example 6 as the C++ JSON writer stores it, expanded
 * (docs/formats/mindspore.md#strategy-json): [8,6] with
 * ((2,1),0) as tensor_shape [2,4,6], map [2,1,0]; folded back to 2 dims it
 * gives Example 6's boxes */
static void test_fold(void)
{
	flx_error e;
	flx_ms_layout f;
	const char *js = "{\"parallel_layout_item\":{\"m\":{\"dev_matrix\":"
			 "[2,2,2],\"tensor_map\":[2,1,0],\"tensor_shape\":"
			 "[2,4,6],\"field\":0}}}";
	flx_ms_strategy *s = parse(js, strlen(js), true, &e);
	CHECK(s != NULL);
	if (!s)
		return;
	CHECK_EQ(flx_ms_layout_fold(&s->layouts[0], 2, &f), 0);
	CHECK_EQ(f.ndim, 2);
	CHECK_EQ(f.shape[0], 8);
	CHECK_EQ(f.shape[1], 6);
	for (uint64_t r = 0; r < 8; r++)
		BOX(&f, f.shape, r, 2 * (r / 2), 2, 3 * (r % 2), 3);
	CHECK_EQ(flx_ms_layout_fold(&s->layouts[0], 1, &f), -EINVAL);
	flx_ms_strategy_free(s);
}

/* Example 5 (merged pipeline, JSON) and a stage gap */
static void test_pipeline(void)
{
	flx_error e;
	const char *js =
	    "{\"current_stage\":1,\"parallel_layout_item\":{"
	    "\"0-model.layers.0.w\":{\"dev_matrix\":[4,2,1],\"tensor_map\":"
	    "[1,0],\"tensor_shape\":[1024,512],\"field\":0},"
	    "\"1-model.layers.31.w\":{\"dev_matrix\":[4,2,1],\"tensor_map\":"
	    "[1,0],\"tensor_shape\":[1024,512],\"field\":0}}}";
	flx_ms_strategy *s = parse(js, strlen(js), true, &e);
	CHECK(s != NULL);
	if (!s)
		return;
	CHECK(s->merged);
	CHECK_EQ(s->nstages, 2);
	CHECK_EQ(s->devices, 8);
	const flx_ms_layout *l =
	    flx_ms_strategy_find(s, "model.layers.31.w", 1);
	CHECK(l != NULL);
	CHECK(flx_ms_strategy_find(s, "model.layers.31.w", 0) == NULL);
	if (l) {
		CHECK(l->has_shape);
		/* global rank 13: local 5, rows 512:1024 */
		BOX(l, l->shape, 13 % s->devices, 512, 512, 0, 512);
	}
	flx_ms_strategy_free(s);

	const char *gap = "{\"parallel_layout_item\":{\"1-w\":{\"dev_matrix\":"
			  "[2],\"tensor_map\":[0],\"field\":0}}}";
	CHECK(parse(gap, strlen(gap), true, &e) == NULL);
	CHECK(strstr(e.text, "stage 0 has no layouts") != NULL);
}

static void refused(const void *b, size_t n, bool json, const char *key,
		    const char *text, int line)
{
	flx_error e;
	flx_ms_strategy *s = parse(b, n, json, &e);
	if (s || e.code != -EINVAL || strcmp(e.file, "s.ckpt") != 0 ||
	    (key && strcmp(e.key, key) != 0) || !strstr(e.text, text)) {
		fprintf(stderr,
			"line %d: want refusal '%s' '%s', got '%s' '%s'\n",
			line, key ? key : "", text, e.key, e.text);
		check_failures++;
	}
	flx_ms_strategy_free(s);
}
#define REFUSED(b, n, j, k, t) refused(b, n, j, k, t, __LINE__)

static void test_refusals(void)
{
	unsigned char b[sizeof(ex53)];
	/* every truncation of the file is refused or parses cleanly */
	for (size_t n = 0; n < sizeof(ex53); n++) {
		flx_error e;
		flx_ms_strategy *s = parse(ex53, n, false, &e);
		CHECK(s == NULL);
		CHECK(e.code == -EINVAL);
	}
	/* tensor_map value 5 outside the 2-dim device matrix */
	memcpy(b, ex53, sizeof(b));
	b[48] = 0x05;
	REFUSED(b, sizeof(b), false, "w", "outside the 2-dim dev_matrix");
	/* field 1 */
	memcpy(b, ex53, sizeof(b));
	b[65] = 0x01;
	REFUSED(b, sizeof(b), false, "w", "field 1");
	/* dev_matrix entry 0 */
	memcpy(b, ex53, sizeof(b));
	b[42] = 0x00;
	REFUSED(b, sizeof(b), false, "w", "dev_matrix entry 0");
	/* a length past the end of the message */
	memcpy(b, ex53, sizeof(b));
	b[33] = 0x7f;
	REFUSED(b, sizeof(b), false, NULL, "malformed");
	const char *j1 = "{\"parallel_layout_item\":{\"w\":{\"dev_matrix\":"
			 "[2,2],\"tensor_map\":[0,0],\"field\":0}}}";
	REFUSED(j1, strlen(j1), true, "w", "device dimension twice");
	const char *j2 = "{\"parallel_layout_item\":{\"w\":{\"dev_matrix\":"
			 "[2,\"x\"],\"tensor_map\":[0],\"field\":0}}}";
	REFUSED(j2, strlen(j2), true, "w", "dev_matrix is not a list");
	const char *j3 = "{\"parallel_layout_item\":{\"a\":{\"dev_matrix\":"
			 "[2],\"tensor_map\":[0]},\"b\":{\"dev_matrix\":[4],"
			 "\"tensor_map\":[0]}}}";
	REFUSED(j3, strlen(j3), true, "b", "has 4 devices");
	REFUSED("[1", 2, true, NULL, "not JSON");
}

/* docs/formats/mindspore.md#manual-split: a manual split (param_split_shape
 * with indices_offset of the same length, one pair per dim-0 block):
 * Gather-style rows 3 and 5 of an [8,4] table over D=[2], T=[0,-1]; rank 0 rows
 * 0:3, rank 1 rows 3:8, with a replicated 2-fold DP dim on the left (D=[2,2])
 * the same per block; a pair count other than the block count has no box.
 * docs/formats/mindspore.md#mindformers-strategies: a scalar's empty TensorMap
 * (MindFormers) is a 0-d replicated layout. */
static void test_manual_split(void)
{
	const char *j = "{\"parallel_layout_item\":{"
			"\"t\":{\"dev_matrix\":[2,2],\"tensor_map\":[0,-1],"
			"\"field\":0,\"param_split_shape\":[3,5],"
			"\"indices_offset\":[0,3],\"tensor_shape\":[8,4]},"

			"\"v\":{\"dev_matrix\":[2,2],\"tensor_map\":[0,-1],"
			"\"field\":0,\"param_split_shape\":[4,4]}}}";
	static const unsigned char scalar[] = {0x0a, 0x01, 0x73, 0x12, 0x0a,
					       0x0a, 0x02, 0x08, 0x04, 0x12,
					       0x00, 0x28, 0x00, 0x30, 0x00};
	uint64_t S[2] = {8, 4}, f[2];
	flx_error e;
	flx_ms_strategy *s = parse(j, strlen(j), true, &e);

	CHECK(s != NULL);
	if (s) {
		const flx_ms_layout *t = flx_ms_strategy_find(s, "t", 0),
				    *v = flx_ms_strategy_find(s, "v", 0);
		CHECK(t && t->nsplit == 2 && v && v->nsplit == 0);
		if (t) {
			for (uint64_t r = 0; r < 4; r++)
				BOX(t, S, r, r % 2 ? 3 : 0, r % 2 ? 5 : 3, 0,
				    4);
			flx_ms_factors(t, f);
			CHECK_EQ(f[0], 0); /* dim 0 not by multiplication */
		}
		if (v) /* no offsets: no manual split
			  (docs/formats/mindspore.md#mindformers-strategies) */
			BOX(v, S, 1, 4, 4, 0, 4);
	}
	flx_ms_strategy_free(s);
	/* three pairs for two dim-0 blocks */
	const char *u = "{\"parallel_layout_item\":{"
			"\"u\":{\"dev_matrix\":[2,2],\"tensor_map\":[0,-1],"
			"\"field\":0,\"param_split_shape\":[2,2,4],"
			"\"indices_offset\":[0,2,4]}}}";
	REFUSED(u, strlen(u), true, "u",
		"param_split_shape and indices_offset have 3 entries, dim 0 "
		"is split 2 ways");
	s = parse_item(0, scalar, sizeof(scalar), &e);
	CHECK(s != NULL);
	if (s) {
		CHECK_EQ(s->layouts[0].ndim, 0);
		CHECK_EQ(s->devices, 4);
	}
	flx_ms_strategy_free(s);
}

/* docs/formats/mindspore.md#strategy-schema: repeated scalars may also come
 * packed; ex53 with dev_matrix "08 02 08 04" as "0a 02 02 04" and tensor_map
 * "08 01 08 <-1>" as "0a 0b 01 <-1>" (the same lengths) parses to the same
 * layout. */
static void test_packed(void)
{
	unsigned char b[sizeof(ex53)];
	flx_error e;
	flx_ms_strategy *s;

	memcpy(b, ex53, sizeof(b));
	b[0x29] = 0x0a, b[0x2a] = 0x02, b[0x2b] = 0x02, b[0x2c] = 0x04;
	b[0x2f] = 0x0a, b[0x30] = 0x0b, b[0x31] = 0x01;
	s = parse(b, sizeof(b), false, &e);
	CHECK(s != NULL);
	if (s) {
		const flx_ms_layout *l = &s->layouts[0];
		CHECK(l->ndev == 2 && l->dev[0] == 2 && l->dev[1] == 4);
		CHECK(l->ndim == 2 && l->nmap[0] == 1 && l->map[0][0] == 1 &&
		      l->nmap[1] == 0 && !l->nested);
	}
	flx_ms_strategy_free(s);
}

/* What protobuf-c (node_strategy.proto) accepts and refuses:
 * docs/formats/mindspore.md#strategy-schema's required fields, but
 * opt_weight_shard_* absent (files before 2021) as 0; lists past
 * FLX_MS_MAX_DIMS; a file costing more memory unpacked than its size allows
 * (PB_BUDGET_*: 32 times, plus 1 MiB). */
static void test_protobuf_c(void)
{
	unsigned char b[sizeof(ex53)];
	flx_error e;
	flx_ms_strategy *s;

	/* ex53 without "30 00 38 00": the layout item and its
	 * ParallelLayouts 4 bytes shorter */
	memcpy(b, ex53, sizeof(b));
	b[33] -= 4;
	b[38] -= 4;
	s = parse(b, sizeof(b) - 4, false, &e);
	CHECK(s != NULL);
	if (s) {
		CHECK_EQ(s->layouts[0].opt_step, 0);
		CHECK_EQ(s->layouts[0].opt_size, 0);
		CHECK_EQ(s->layouts[0].ndim, 2);
	}
	flx_ms_strategy_free(s);
	/* opt_weight_shard_size -1 (a 10-byte varint): the layout item and
	 * its ParallelLayouts 9 bytes longer */
	unsigned char m1[sizeof(ex53) + 9];
	static const unsigned char neg[] = {0x38, 0xff, 0xff, 0xff, 0xff, 0xff,
					    0xff, 0xff, 0xff, 0xff, 0x01};
	memcpy(m1, ex53, sizeof(ex53) - 2);
	memcpy(m1 + sizeof(ex53) - 2, neg, sizeof(neg));
	m1[33] += 9;
	m1[38] += 9;
	s = parse(m1, sizeof(m1), false, &e);
	CHECK(s != NULL);
	if (s)
		CHECK_EQ(s->layouts[0].opt_size, -1);
	flx_ms_strategy_free(s);
	/* without the required field (5): "28 00" left out */
	memcpy(b, ex53, 64);
	memcpy(b + 64, ex53 + 66, 4);
	b[33] -= 2;
	b[38] -= 2;
	REFUSED(b, sizeof(b) - 2, false, "ParallelStrategyMap",
		"protobuf-c cannot unpack it");
	/* without the required current_stage */
	REFUSED(ex53 + 2, sizeof(ex53) - 2, false, "ParallelStrategyMap",
		"protobuf-c cannot unpack it");
	/* a wrong wire type for a known field: dev_matrix as a varint */
	memcpy(b, ex53, sizeof(b));
	b[39] = 0x08;
	REFUSED(b, sizeof(b), false, "ParallelStrategyMap",
		"protobuf-c cannot unpack it");

	/* 17 empty TensorMap entries */
	unsigned char t[80];
	size_t n = 0;
	t[n++] = 0x08, t[n++] = 0x01, t[n++] = 0x1a, t[n++] = 0;
	t[n++] = 0x0a, t[n++] = 0x01, t[n++] = 0x77, t[n++] = 0x12;
	t[n++] = 0;
	t[n++] = 0x0a, t[n++] = 0x02, t[n++] = 0x08, t[n++] = 0x02;
	for (int i = 0; i < 17; i++)
		t[n++] = 0x12, t[n++] = 0x00;
	t[n++] = 0x28, t[n++] = 0x00;
	t[8] = (unsigned char)(n - 9);
	t[3] = (unsigned char)(n - 4);
	REFUSED(t, n, false, "w", "tensor_map longer than 16");
	t[n - 2 - 2] = 0x28; /* 16 entries: parses */
	t[n - 2 - 1] = 0x00;
	t[8] -= 2;
	t[3] -= 2;
	s = parse(t, n - 2, false, &e);
	CHECK(s != NULL);
	if (s)
		CHECK(s->layouts[0].nested);
	flx_ms_strategy_free(s);

	/* 400000 empty strategy items ("12 00": 2 bytes, about 120 while
	 * unpacking) after the docs/formats/mindspore.md#byte-examples file:
	 * over the budget, refused before any layout is read */
	size_t big = 2 * 400000 + sizeof(ex53);
	unsigned char *p = malloc(big);
	CHECK(p != NULL);
	if (!p)
		return;
	memcpy(p, ex53, sizeof(ex53));
	for (size_t i = sizeof(ex53); i < big; i += 2)
		p[i] = 0x12, p[i + 1] = 0x00;
	REFUSED(p, big, false, "ParallelStrategyMap",
		"unpacking it needs more than 25 MiB of memory");
	/* 4000 of them fit */
	s = parse(p, sizeof(ex53) + 2 * 4000, false, &e);
	CHECK(s != NULL);
	flx_ms_strategy_free(s);
	free(p);
}

/* the committed fixtures: protobuf and JSON agree; the merged pipeline
 * strategy splits its stages */
static void *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	static char buf[1 << 20];
	*n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	char *p = malloc(*n + 1);
	memcpy(p, buf, *n);
	return p;
}

static void test_fixtures(void)
{
	const char *d = "fixtures/mindspore-tp2dp2/";
	char path[256];
	size_t n1, n2;
	flx_error e;
	snprintf(path, sizeof(path), "%sstrategy/ckpt_strategy_rank_0.ckpt", d);
	void *b1 = slurp(path, &n1);
	snprintf(path, sizeof(path),
		 "%sstrategy_json/ckpt_strategy_rank_0.json", d);
	void *b2 = slurp(path, &n2);
	CHECK(b1 && b2);
	if (!b1 || !b2)
		return;
	flx_ms_strategy *p = parse(b1, n1, false, &e);
	flx_ms_strategy *j = parse(b2, n2, true, &e);
	CHECK(p && j);
	if (p && j) {
		CHECK_EQ(p->nlayouts, j->nlayouts);
		CHECK_EQ(p->devices, 4);
		for (uint32_t i = 0; i < p->nlayouts; i++) {
			const flx_ms_layout *a = &p->layouts[i];
			const flx_ms_layout *b =
			    flx_ms_strategy_find(j, a->name, a->stage);
			CHECK(b != NULL);
			if (!b)
				continue;
			CHECK(b->has_shape);
			for (uint64_t r = 0; r < 4; r++) {
				uint64_t s1[16], l1[16], s2[16], l2[16];
				CHECK_EQ(flx_ms_box(a, b->shape, r, s1, l1), 0);
				CHECK_EQ(flx_ms_box(b, b->shape, r, s2, l2), 0);
				CHECK(memcmp(s1, s2, a->ndim * 8) == 0);
				CHECK(memcmp(l1, l2, a->ndim * 8) == 0);
			}
		}
	}
	flx_ms_strategy_free(p);
	flx_ms_strategy_free(j);
	free(b1);
	free(b2);
	b1 = slurp("fixtures/mindspore-pp2/merged/merged_ckpt_strategy.ckpt",
		   &n1);
	CHECK(b1 != NULL);
	p = b1 ? parse(b1, n1, false, &e) : NULL;
	CHECK(p != NULL);
	if (p) {
		CHECK(p->merged);
		CHECK_EQ(p->nstages, 2);
		CHECK(flx_ms_strategy_find(p, "lm_head.weight", 1) != NULL);
		CHECK(flx_ms_strategy_find(p, "lm_head.weight", 0) == NULL);
	}
	flx_ms_strategy_free(p);
	free(b1);
}

int main(void)
{
	test_ex53_and_examples();
	test_ex4_mindformers();
	test_opt_infer();
	test_nested();
	test_pipeline();
	test_fold();
	test_refusals();
	test_protobuf_c();
	test_packed();
	test_manual_split();
	test_fixtures();
	return CHECK_RESULT();
}
