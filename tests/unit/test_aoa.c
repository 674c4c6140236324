/* SPDX-License-Identifier: MIT */
/*
 * AOA statements (aoa.h).
 *
 * Parser: every example statement of docs/formats/paddle.md#aoa-statements (the
 * documentation's placeholders {i}, H, G, E filled in) parses; malformed
 * statements fail with one line naming the statement and the column.
 *
 * Compiler, over fixtures/hf-tiny/single: the boxes each target is made
 * of, against the layouts worked out by hand from the spec (interleaved
 * GQA, per-rank [gate_r | up_r], concatenation then re-split); refusals.
 * The bytes themselves are checked against torch in tests/bats/aoa.bats.
 */
#include "aoa.h"
#include "check.h"
#include "ckpt.h"
#include "transform.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const examples[] = {
    "model.norm.weight -> model.norm.weight",
    "model.layers.$LAYER_ID.mlp.down_proj.weight^T -> "
    "model.layers.$LAYER_ID.mlp.down_proj.weight",
    "model.layers.$LAYER_ID.mlp.gate.weight -> "
    "model.layers.$LAYER_ID.mlp.gate.weight, dtype='float32'",
    "model.language_model.layers.$LAYER_ID.self_attn.q_proj.weight^T, "
    "model.language_model.layers.$LAYER_ID.self_attn.k_proj.weight^T, "
    "model.language_model.layers.$LAYER_ID.self_attn.v_proj.weight^T -> "
    "model.language_model.layers.$LAYER_ID.self_attn.qkv_proj.weight, "
    "fused_qkv, num_heads=8, num_key_value_groups=2",
    "model.visual.blocks.3.attn.qkv.weight -> model.visual.blocks.3.attn.q."
    "weight, model.visual.blocks.3.attn.k.weight, "
    "model.visual.blocks.3.attn.v.weight, axis=0",
    "s0, s1 -> s, axis = 1",
    "s -> d0, d1, axis = 0",
    "layers.2.experts.*.weight -> fused_experts, axis = 1",
    "layers.2.experts.0.weight,layers.2.experts.1.weight->fused_experts,"
    "axis=1",
    "layers.5.experts.$EXPERT_ID.up_gate_proj.weight -> "
    "layers.5.experts.$EXPERT_ID.gate_proj.weight, "
    "layers.5.experts.$EXPERT_ID.up_proj.weight, fused_ffn",
    "model.embed_tokens.weight -> lm_head.weight",
    "lm_head.weight -> _",
    "model.language_model.layers.$LAYER_ID.mlp.experts.gate_up_proj -> "
    "layers.$LAYER_ID.mlp.experts.0.up_gate_proj.weight, "
    "layers.$LAYER_ID.mlp.experts.1.up_gate_proj.weight, axis=0",
    "layers.$LAYER_ID_OFFSET.experts.0.weight -> "
    "layers.$LAYER_ID_OFFSET.experts.0.weight, axis = 1",
    "qkv -> Q, K, V, fused_qkv, num_heads=8, num_key_value_groups=2",
    "qkv -> Q0,Q1,Q2,Q3,K0,V0,Q4,Q5,Q6,Q7,K1,V1, axis=1",
    "Q0,Q1,Q2,Q3,Q4,Q5,Q6,Q7 -> Q, axis=1",
    "A -> B, permute='[1,0]'",
    "A -> B, permute=\"[]\"",
    "A -> B, axis=1",
    "A^T -> B, dtype='bfloat16'",
    "A -> B, reshape='[4,2,2,8]'",
    "qkv -> qkv, fused_qkv_old, num_heads=8, num_key_value_groups=2",
    "gate_up -> gate_up, fused_ffn",
    "_ -> B",
    "w[0:3] -> w, axis=0",
    "dst <- src",
};

static void test_examples(void)
{
	size_t n = sizeof(examples) / sizeof(examples[0]);
	flx_aoa *a = NULL;
	flx_error err;
	const char *joined[] = {"a -> b\n\n  c -> d  \nx, y -> z, axis=0"};

	for (size_t i = 0; i < n; i++) {
		flx_error_init(&err);
		CHECK_EQ(flx_aoa_parse(&examples[i], 1, "t", &a, &err), 0);
		if (err.code)
			fprintf(stderr, "example %zu: %s\n", i, err.text);
		CHECK_EQ(flx_aoa_count(a), 1);
		flx_aoa_free(a);
		a = NULL;
	}
	CHECK_EQ(flx_aoa_parse(examples, n, "t", &a, &err), 0);
	CHECK_EQ(flx_aoa_count(a), n);
	flx_aoa_free(a);
	CHECK_EQ(flx_aoa_parse(joined, 1, "t", &a, &err), 0);
	CHECK_EQ(flx_aoa_count(a), 3);
	flx_aoa_free(a);
}

static const struct {
	const char *stmt, *msg;
} bad[] = {
    {"a b", "statement 2 column 3: expected '->' or ',', found a name"},
    {"a ->", "statement 2 column 5: expected a name, found end of statement"},
    {"a -> b,", "statement 2 column 8: expected a name, found end"},
    {"-> b", "statement 2 column 1: expected a name, found '->'"},
    {"a -> b^T", "statement 2 column 7: ^T on the destination side"},
    {"a^X -> b", "statement 2 column 2: '^' only as a trailing ^T"},
    {"a -> b, axis=x", "statement 2 column 14: expected a number or a "
		       "string"},
    {"a -> b, axis='1'", "statement 2 column 14: axis must be a number"},
    {"a -> b, axis=1, axis=0", "statement 2 column 17: axis given twice"},
    {"a -> b, dtype='int3'", "statement 2 column 15: dtype must be"},
    /* 'float' is float64 to numpy and paddle.cast: ambiguous, refused */
    {"a -> b, dtype='float'", "statement 2 column 15: dtype must be"},
    {"a -> b, permute='[1,1]'", "statement 2 column 17: permute must be"},
    {"a -> b, permute='1,0'", "statement 2 column 17: permute must be"},
    {"a -> b, color=1", "statement 2 column 9: unknown attribute 'color'"},
    {"a -> b, axis=1 c", "statement 2 column 16: expected ',' or the end"},
    {"a -> b, 'x'", "statement 2 column 9: expected a name, found a string"},
    {"a -> b, dtype='float32", "statement 2 column 15: expected a number"},
    {"a -> b; c -> d", "statement 2 column 7: expected ',' or the end, "
		       "found an invalid character"},
    {"a -> b/c", "statement 2 column 7: expected ',' or the end"},
    {"a -> fused_qkv", "statement 2 column 3: no destination"},
    {"a -> b, num_heads=2", "without fused_qkv or fused_qkv_old"},
    {"a -> b, fused_ffn, fused_qkv", "two fused macros"},
    {"w[3:3] -> b", "statement 2 column 2: range [3:3] is empty"},
    {"w[1:x] -> b", "statement 2 column 5: expected a number"},
    {"a -> b, num_heads=0, fused_qkv", "num_heads must be in [1, 2^20]"},
    {"a -> b, reshape='[2,-1,-1]'", "column 17: reshape must be a list"},
    {"a -> b, reshape='[2,0]'", "column 17: reshape must be a list"},
    {"a -> b, reshape=3", "column 17: reshape must be a string"},
    {"a*b*c*d*e*f -> b", "column 1: more than 4 '*' and '$' macros in a name"},
    /* VAR := [A-Za-z_][A-Za-z.$_*0-9^T]*: no '$' first */
    {"$LAYER_ID.w -> b", "statement 2 column 1: expected a name, found an "
			 "invalid character"},
    {"a -> b, $EXPERT_ID.c, axis=0", "statement 2 column 9: expected a name"},
    /* a fused macro is splits and concatenations: axis only (a cast or a
     * transpose would be dropped, serving the source's bytes) */
    {"a, b -> c, fused_ffn, dtype='float32'",
     "statement 2 column 6: fused_ffn takes no dtype or permute"},
    {"a, b, c -> d, fused_qkv, num_heads=4, num_key_value_groups=2, "
     "permute='[1,0]'",
     "statement 2 column 9: fused_qkv takes no dtype or permute"},
    {"q -> q, fused_qkv_old, num_heads=4, num_key_value_groups=2, "
     "dtype='bfloat16'",
     "fused_qkv_old takes no dtype or permute"},
    /* shard counts belong to the per-rank fused layouts only */
    {"a -> b, src_tp=2", "statement 2 column 3: src_tp or dst_tp without "
			 "fused_ffn or fused_qkv_old"},
    {"a, b -> c, axis=0, dst_tp=2", "src_tp or dst_tp without fused_ffn"},
    {"a -> b, c, d, fused_qkv, num_heads=4, num_key_value_groups=2, "
     "src_tp=2",
     "src_tp or dst_tp without fused_ffn or fused_qkv_old"},
};

static void test_malformed(void)
{
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *v[] = {"ok -> fine", bad[i].stmt};
		flx_aoa *a = NULL;
		flx_error err;

		flx_error_init(&err);
		CHECK_EQ(flx_aoa_parse(v, 2, "r.json", &a, &err), -EINVAL);
		CHECK(a == NULL);
		CHECK_STR(err.file, "r.json");
		CHECK_STR(err.key, "aoa_statements");
		if (!strstr(err.text, bad[i].msg)) {
			fprintf(stderr, "'%s': got '%s', want '%s'\n",
				bad[i].stmt, err.text, bad[i].msg);
			check_failures++;
		}
	}
}

/* Compile stmts over hf-tiny; 0 and the targets' descriptions joined by
 * '\n' into buf, or the error's text. */
static int compile(const char *const *stmts, size_t n, int tp, char *buf,
		   size_t len)
{
	flx_ckpt *c = NULL;
	flx_aoa *a = NULL;
	flx_aoa_prog *p = NULL;
	flx_xindex *xi = NULL;
	flx_error err;
	const char *name, *how;
	size_t k = 0, ns;
	int rc;

	flx_error_init(&err);
	buf[0] = 0;
	rc = flx_ckpt_open("fixtures/hf-tiny/single", &c, &err);
	if (!rc)
		rc = flx_aoa_parse(stmts, n, "t", &a, &err);
	if (!rc)
		rc = flx_aoa_compile(a, c, &(flx_aoa_opts){.tp = tp}, &p, &err);
	if (!rc)
		rc = flx_xform_apply(flx_aoa_prog_xform(p), c, &xi, &err);
	for (size_t i = 0; !rc && !flx_aoa_prog_target(p, i, &name, &how, &ns);
	     i++) {
		k += (size_t)snprintf(buf + k, len - k, "%s = %s:", name, how);
		for (size_t j = 0; j < ns; j++)
			k += (size_t)snprintf(buf + k, len - k, "%s %s",
					      j ? ";" : "",
					      flx_aoa_prog_source(p, i, j));
		k += (size_t)snprintf(buf + k, len - k, "\n");
	}
	if (rc)
		snprintf(buf, len, "%s", err.text);
	flx_xindex_free(xi);
	flx_aoa_prog_free(p);
	flx_aoa_free(a);
	flx_ckpt_close(c);
	return rc;
}

#define L0 "model.layers.0."

static void test_compile(void)
{
	static char buf[1 << 16];
	const char *qkv[] = {
	    L0 "self_attn.q_proj.weight, " L0 "self_attn.k_proj.weight, " L0
	       "self_attn.v_proj.weight -> qkv, fused_qkv, num_heads=4, "
	       "num_key_value_groups=2, axis=0",
	    "qkv -> q, k, v, fused_qkv, num_heads=4, num_key_value_groups=2, "
	    "axis=0"};
	const char *ffn[] = {L0 "mlp.gate_proj.weight^T, " L0
				"mlp.up_proj.weight^T -> gu, fused_ffn"};
	const char *cut[] = {L0 "mlp.gate_proj.weight, " L0
				"mlp.up_proj.weight -> s, axis=0",
			     "s -> d[0:2], axis=1", "d_1 -> e[0:5], axis=0"};

	/* group g: [q heads 2g, 2g+1 | k head g | v head g], head dim 6 */
	CHECK_EQ(compile(qkv, 1, 1, buf, sizeof(buf)), 0);
	CHECK(strstr(buf, "qkv = stmt 1: " L0 "self_attn.q_proj.weight[0:12, "
			  "0:24] -> [0:12, 0:24]; " L0 "self_attn.k_proj."
			  "weight[0:6, 0:24] -> [12:18, 0:24]; " L0
			  "self_attn.v_proj.weight[0:6, 0:24] -> [18:24, "
			  "0:24]; " L0 "self_attn.q_proj.weight[12:24, 0:24] "
			  "-> [24:36, 0:24]; " L0 "self_attn.k_proj.weight[6:"
			  "12, 0:24] -> [36:42, 0:24]; " L0 "self_attn.v_proj."
			  "weight[6:12, 0:24] -> [42:48, 0:24]\n"));
	/* and back: q is whole again, from the sources themselves */
	CHECK_EQ(compile(qkv, 2, 1, buf, sizeof(buf)), 0);
	CHECK(strstr(buf, "q = stmt 2 <- stmt 1: " L0 "self_attn.q_proj."
			  "weight[0:12, 0:24] -> [0:12, 0:24]; " L0
			  "self_attn.q_proj.weight[12:24, 0:24] -> [12:24, "
			  "0:24]\n"));
	CHECK(!strstr(buf, "qkv ="));
	/* per-rank [gate_r | up_r] along axis 1 of the transposed weights */
	CHECK_EQ(compile(ffn, 1, 1, buf, sizeof(buf)), 0);
	CHECK(strstr(buf,
		     "gu = stmt 1: " L0 "mlp.gate_proj.weight[0:35, 0:24] "
		     "permute(1,0) -> [0:24, 0:35]; " L0 "mlp.up_proj."
		     "weight[0:35, 0:24] permute(1,0) -> [0:24, 35:70]\n"));
	CHECK_EQ(compile(ffn, 1, 5, buf, sizeof(buf)), 0);
	CHECK(strstr(buf,
		     "; " L0 "mlp.gate_proj.weight[7:14, 0:24] permute(1,0) "
		     "-> [0:24, 14:21]; " L0 "mlp.up_proj.weight[7:14, "
		     "0:24] permute(1,0) -> [0:24, 21:28]; "));
	CHECK_EQ(compile(ffn, 1, 2, buf, sizeof(buf)), -EINVAL);
	CHECK(strstr(buf,
		     "statement 1: axis 1 of extent 35 does not split into "
		     "2 equal parts"));
	/* reshape: split an axis (a piece per row of the outer one), merge
	 * axes (a piece per row of the first), drop and add extent-1 axes */
	{
		const char *rs[] = {"lm_head.weight -> r, reshape='[37,2,12]'",
				    "r -> m, reshape='[1,74,12]'"};

		CHECK_EQ(compile(rs, 1, 1, buf, sizeof(buf)), 0);
		CHECK(strstr(buf,
			     "r = stmt 1: lm_head.weight[0:37, 0:12] "
			     "axes(0,new,1) -> [0:37, 0:1, 0:12]; "
			     "lm_head.weight[0:37, 12:24] axes(0,new,1) -> "
			     "[0:37, 1:2, 0:12]\n"));
		CHECK_EQ(compile(rs, 2, 1, buf, sizeof(buf)), 0);
		CHECK(strstr(
		    buf, "; lm_head.weight[36:37, 12:24] axes(new,new,1) -> "
			 "[0:1, 73:74, 0:12]\n"));
	}
	/* stacked layers: stacked along a new axis, unstacked by index */
	{
		const char *sk[] = {
		    "model.layers.$LAYER_ID.mlp.up_proj.weight -> stk, axis=1",
		    "stk -> l.$LAYER_ID.up, axis=1"};

		CHECK_EQ(compile(sk, 1, 1, buf, sizeof(buf)), 0);
		CHECK(strstr(buf, "stk = stmt 1: model.layers.0.mlp.up_proj."
				  "weight[0:35, 0:24] axes(0,new,1) -> [0:35, "
				  "0:1, 0:24]; model.layers.1.mlp.up_proj."
				  "weight[0:35, 0:24] axes(0,new,1) -> [0:35, "
				  "1:2, 0:24]; "));
		CHECK_EQ(compile(sk, 2, 1, buf, sizeof(buf)), 0);
		CHECK(strstr(buf,
			     "l.1.up = stmt 2 <- stmt 1: model.layers.1.mlp."
			     "up_proj.weight[0:35, 0:24] -> [0:35, 0:24]\n"));
		CHECK(!strstr(buf, "stk ="));
	}
	/* a box straddling the concatenation boundary (rows 35..69 of 70) */
	CHECK_EQ(compile(cut, 3, 1, buf, sizeof(buf)), 0);
	CHECK(strstr(buf,
		     "e_2 = stmt 3 <- stmt 2 <- stmt 1: " L0
		     "mlp.gate_proj.weight[28:35, 12:24] -> [0:7, 0:12]; " L0
		     "mlp.up_proj.weight[0:7, 12:24] -> [7:14, 0:12]\n"));
}

static void test_refused(void)
{
	static char buf[4096];
	static const struct {
		const char *stmt, *msg;
	} cases[] = {
	    {"_ -> x", "statement 1: '_ -> x': a view cannot invent data"},
	    {"lm_head.weight, buffers.i8 -> x, axis=0",
	     "input 2 is int8 with 2 axes, input 1 bfloat16 with 2"},
	    {"lm_head.weight -> a, b, axis=0", "axis 0 of extent 37 does not"},
	    {"lm_head.weight -> a, b", "a split takes one attribute, axis"},
	    {"lm_head.weight -> a, permute='[1,0]', dtype='float32'",
	     "one operation per statement"},
	    {"lm_head.weight -> a, permute='[1,0,2]'", "permute of 3 axes"},
	    {"lm_head.weight -> a, reshape='[1]'",
	     "statement 1: reshape to 1 axes of another element count than "
	     "the tensor's 888"},
	    {"lm_head.weight -> a, reshape='[-1,5]'", "another element count"},
	    {"lm_head.weight, lm_head.weight -> a, axis=0, reshape='[2]'",
	     "reshape is a statement of one source, one destination"},
	    {"lm_head.weight -> a, dtype='float16'\na -> b, dtype='float32'",
	     "float16 to float32 after bfloat16 to float16 would round twice"},
	    {"lm_head.weight -> x.$LAYER_ID, y.$LAYER_ID",
	     "a $ macro on the right only unstacks one source into one name"},
	    {"model.layers.$LAYER_ID.mlp.up_proj.weight -> a, b, axis=0",
	     "a $ macro on the left only stacks one name into one destination"},
	    {"model.layers.$LAYER_ID.mlp.up_proj.weight -> s, axis=3",
	     "axis 3 but the tensor has 2 axes"},
	    {"lm_head.weight, model.norm.weight -> a, b", "without a fused"},
	    {"lm_head.weight -> a, b, c, fused_qkv",
	     "fused_qkv needs num_heads and num_key_value_groups"},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *v[] = {cases[i].stmt};
		int rc = compile(v, 1, 1, buf, sizeof(buf));

		CHECK(rc != 0);
		if (!strstr(buf, cases[i].msg)) {
			fprintf(stderr, "'%s': got '%s', want '%s'\n",
				cases[i].stmt, buf, cases[i].msg);
			check_failures++;
		}
	}
}

/* ---- the cost of compiling ---- */

#define NSTMT 65536
#define E     "model.embed_tokens.weight"

enum { CHAIN, FAN, DOUBLE };

/* A generated list, each statement its own string: CHAIN E -> t0, t0 ->
 * t1, ...; FAN E -> f0, E -> f1, ...; DOUBLE E, E -> d0, then d0, d0 ->
 * d1, ... (axis 0). */
static char **gen(size_t n, int kind)
{
	char **v = calloc(n, sizeof(char *));

	for (size_t i = 0; v && i < n; i++) {
		char b[160];

		if (kind == FAN)
			snprintf(b, sizeof(b), E " -> f%zu", i);
		else if (i == 0)
			snprintf(b, sizeof(b), "%s -> %s",
				 kind == CHAIN ? E : E ", " E,
				 kind == CHAIN ? "t0" : "d0, axis=0");
		else if (kind == CHAIN)
			snprintf(b, sizeof(b), "t%zu -> t%zu", i - 1, i);
		else
			snprintf(b, sizeof(b), "d%zu, d%zu -> d%zu, axis=0",
				 i - 1, i - 1, i);
		v[i] = strdup(b);
	}
	return v;
}

static void gen_free(char **v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		free(v[i]);
	free(v);
}

/* Parse and compile v in a child limited to 1 GiB of address space and
 * 60 s (a generous bound for a loaded machine: the list compiles in about
 * a second); the child checks the last target's name and chain.  The rule
 * compiler was quadratic in time and memory here (a 65,536-statement
 * chain of renames took some 50 GB). */
#if defined(__SANITIZE_ADDRESS__)
static const int under_asan = 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
static const int under_asan = 1;
#else
static const int under_asan = 0;
#endif
#else
static const int under_asan = 0;
#endif

static void compile_bounded(char **v, size_t n, const char *last)
{
	pid_t pid = fork();
	int st = 0;

	CHECK(pid >= 0);
	if (pid == 0) {
		struct rlimit rl = {1UL << 30, 1UL << 30};
		flx_ckpt *c = NULL;
		flx_aoa *a = NULL;
		flx_aoa_prog *p = NULL;
		flx_error err;
		const char *name = NULL, *chain = NULL;
		size_t ns = 0, nt = 0;
		int rc;

		/* ASan reserves terabytes of address space for its shadow at
		 * start, so there the bound is on the resident set instead */
		if (!under_asan)
			setrlimit(RLIMIT_AS, &rl);
		alarm(60);
		flx_error_init(&err);
		rc = flx_ckpt_open("fixtures/hf-tiny/single", &c, &err);
		if (!rc)
			rc = flx_aoa_parse((const char *const *)v, n, "t", &a,
					   &err);
		if (!rc)
			rc = flx_aoa_compile(a, c, NULL, &p, &err);
		if (rc) {
			fprintf(stderr, "compile: %s\n", err.text);
			_exit(2);
		}
		while (!flx_aoa_prog_target(p, nt, &name, &chain, &ns))
			nt++;
		flx_aoa_prog_target(p, nt - 1, &name, &chain, &ns);
		/* a chain of renames names its first statements, then is cut */
		if (strcmp(name, last) || ns != 1 || strlen(chain) > 420 ||
		    (nt == 1 && !strstr(chain, " ..."))) {
			fprintf(stderr, "last target %s (%zu of %zu): %s\n",
				name, nt, ns, chain);
			_exit(3);
		}
		flx_aoa_prog_free(p);
		flx_aoa_free(a);
		flx_ckpt_close(c);
		if (under_asan) {
			struct rusage ru;

			getrusage(RUSAGE_SELF, &ru);
			if (ru.ru_maxrss > (1L << 21)) { /* KiB: 2 GiB */
				fprintf(stderr, "resident %ld KiB\n",
					ru.ru_maxrss);
				_exit(4);
			}
		}
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fprintf(stderr, "%s: child status %#x (signal %d)\n", last, st,
			WIFSIGNALED(st) ? WTERMSIG(st) : 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_cost(void)
{
	static char buf[1 << 16];
	char **v;
	flx_ckpt *c = NULL;
	flx_aoa *a = NULL;
	flx_aoa_prog *p = NULL;
	flx_xindex *xi = NULL;
	flx_error err;
	int rc;

	/* E -> t0, t0 -> t1, ..., t65534 -> t65535 */
	v = gen(NSTMT, CHAIN);
	compile_bounded(v, NSTMT, "t65535");
	gen_free(v, NSTMT);
	/* E -> f0, E -> f1, ..., E -> f65535 */
	v = gen(NSTMT, FAN);
	compile_bounded(v, NSTMT, "f65535");
	gen_free(v, NSTMT);

	/* d{i}, d{i} -> d{i+1}: 2^16 boxes in d15, whose placement is
	 * checked in about n log n pair tests, not n^2 / 2 */
	v = gen(16, DOUBLE);
	flx_error_init(&err);
	rc = flx_ckpt_open("fixtures/hf-tiny/single", &c, &err);
	if (!rc)
		rc = flx_aoa_parse((const char *const *)v, 16, "t", &a, &err);
	if (!rc)
		rc = flx_aoa_compile(a, c, NULL, &p, &err);
	if (!rc)
		rc = flx_xform_apply(flx_aoa_prog_xform(p), c, &xi, &err);
	CHECK(rc == 0);
	if (rc)
		fprintf(stderr, "d15: %s\n", err.text);
	if (!rc) {
		const flx_tensor *t = flx_ckpt_find(flx_xindex_ckpt(xi), "d15");

		CHECK(flx_xindex_overlap_tests(xi) < 16 * 65536);
		CHECK(t && t->shape[0] == 37 * 65536);
	}
	flx_xindex_free(xi);
	flx_aoa_prog_free(p);
	flx_aoa_free(a);
	flx_ckpt_close(c);
	gen_free(v, 16);

	/* one more doubling: refused naming the statement, its number and
	 * text (it was a bare "Cannot allocate memory") */
	v = gen(17, DOUBLE);
	rc = compile((const char *const *)v, 17, 1, buf, sizeof(buf));
	CHECK(rc == -EINVAL);
	CHECK(strstr(buf, "statement 17: a tensor made of more than 65536 "
			  "boxes (in \"d15, d15 -> d16, axis=0\")"));
	gen_free(v, 17);

	/* d15 (65,536 boxes) copied over and over: refused when the copies
	 * pass the bound on boxes in all, before they take the memory */
	v = gen(16 + 64, DOUBLE);
	for (size_t i = 16; v && i < 16 + 64; i++) {
		free(v[i]);
		snprintf(buf, 64, "d15 -> copy%zu", i);
		v[i] = strdup(buf);
	}
	rc = compile((const char *const *)v, 16 + 64, 1, buf, sizeof(buf));
	CHECK(rc == -EINVAL);
	CHECK(strstr(buf, "MiB of boxes in all"));
	CHECK(strstr(buf, "(in \"d15 -> copy"));
	if (!strstr(buf, "MiB of boxes"))
		fprintf(stderr, "copies: %s\n", buf);
	gen_free(v, 16 + 64);

	/* a short chain is shown whole */
	{
		const char *s[] = {E " -> a", "a -> b", "b -> c"};

		CHECK(compile(s, 3, 1, buf, sizeof(buf)) == 0);
		CHECK(strstr(buf, "c = stmt 3 <- stmt 2 <- stmt 1: " E));
	}
}

int main(void)
{
	/* AOA_DUMP=statement [AOA_TP=n]: print what it compiles to */
	if (getenv("AOA_DUMP")) {
		static char b[1 << 16];
		const char *v[] = {getenv("AOA_DUMP")};
		compile(v, 1, atoi(getenv("AOA_TP") ? getenv("AOA_TP") : "1"),
			b, sizeof(b));
		puts(b);
		return 0;
	}
	test_examples();
	test_malformed();
	test_compile();
	test_refused();
	test_cost();
	return CHECK_RESULT();
}
