/* SPDX-License-Identifier: MIT */
/*
 * The paddle/ tree of a synthetic Paddle checkpoint (flx_ckpt.paddle set),
 * against an expectation written here: for tp x pp in {1, 2, 4} x {1, 2}
 * and three checkpoints (bf16 weights with fp32 master weights, pure fp32
 * training, weights only), the directory holds exactly PaddleNLP's file
 * names (paddle-format.md 6.1), each file reads the same whole and in
 * steps without allocating, and tests/unit/check_pdparams.py, given every
 * file and what it must hold (keys in order, Paddle names, numpy dtype,
 * shape and bytes, the latter taken here element by element from the
 * backing file), loads each with pickle.load as paddle.load does and
 * compares.  Keys without a Paddle name, uneven and empty TP shards, a 0-d
 * tensor and a stage without master weights are included.  Two optimizer
 * states with one Paddle name, and a name that is not UTF-8, fail the
 * build naming the file and the key.  Without /usr/bin/python3 and numpy
 * the pickle check is skipped (said on stderr).
 */
#include "check.h"
#include "ckpt.h"
#include "paddle/paddle.h"
#include "plan.h"
#include "spec.h"
#include "synth_ckpt.h"
#include "tree.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "count_alloc.h"

/* ---- the synthetic checkpoint ---- */

enum kind { W, M1, M2, B1, B2, MW }; /* weight, the optimizer states */

typedef struct tdef {
	const char *fqn;
	flx_dtype dt;
	int ndim;
	int64_t shape[2];
	const char *name; /* Paddle's name; NULL: none in the table */
	enum kind kind;
} tdef;

/* Rules give the TP axes (the saved chunks are whole). */
static const char rules_text[] =
    "[{\"match\": \"*pow_acc_0\", \"split\": null},"
    " {\"match\": \"*embed_tokens.weight*\", \"split\": 0},"
    " {\"match\": \"*o_proj.weight*\", \"split\": 0},"
    " {\"match\": \"*_proj.weight*\", \"split\": 1},"
    " {\"match\": \"lm_head.weight*\", \"split\": 1},"
    " {\"match\": \"*\", \"split\": null}]";

#define WEIGHTS(dt)                                                            \
	{"llama.embed_tokens.weight", dt, 2, {8, 4}, "embedding_0.w_0", W},    \
	    {"llama.layers.0.self_attn.q_proj.weight",                         \
	     dt,                                                               \
	     2,                                                                \
	     {4, 6},                                                           \
	     "linear_0.w_0",                                                   \
	     W},                                                               \
	    {"llama.layers.0.self_attn.o_proj.weight",                         \
	     FLX_DT_F32,                                                       \
	     2,                                                                \
	     {6, 4},                                                           \
	     "linear_1.w_0",                                                   \
	     W},                                                               \
	    {"llama.layers.0.input_layernorm.weight",                          \
	     FLX_DT_F32,                                                       \
	     1,                                                                \
	     {4},                                                              \
	     "create_parameter_0.w_0",                                         \
	     W},                                                               \
	    {"llama.layers.1.mlp.up_proj.weight",                              \
	     dt,                                                               \
	     2,                                                                \
	     {4, 5},                                                           \
	     "linear_2.w_0",                                                   \
	     W},                                                               \
	    {"llama.norm.weight", FLX_DT_F32, 1, {4}, NULL, W},                \
	    {"extra.step", FLX_DT_I64, 0, {0}, "step_0", W},                   \
	    {"extra.mask", FLX_DT_BOOL, 1, {3}, "mask_0", W},                  \
	{                                                                      \
		"lm_head.weight", dt, 2, {4, 8}, "linear_3.w_0", W             \
	}

/* The states of parameter P (Paddle name N) of shape S; master weights
 * named N_fp32_master_0 and their states N_fp32_master_0_<state>. */
#define STATES(P, N, S0, S1, NDIM)                                             \
	{P ".moment1_0", FLX_DT_F32, NDIM, {S0, S1}, N "_moment1_0", M1},      \
	    {P ".moment2_0", FLX_DT_F32, NDIM, {S0, S1}, N "_moment2_0", M2},  \
	    {P ".beta1_pow_acc_0", FLX_DT_F32, 1, {1},                         \
	     N "_beta1_pow_acc_0", B1},                                        \
	{                                                                      \
		P ".beta2_pow_acc_0", FLX_DT_F32, 1, {1},                      \
		    N "_beta2_pow_acc_0", B2                                   \
	}

#define FP32_MASTER(P, N, S0, S1, NDIM)                                        \
	STATES(P, N "_fp32_master_0", S0, S1, NDIM),                           \
	{                                                                      \
		P ".w_0", FLX_DT_F32, NDIM, {S0, S1}, N "_fp32_master_0", MW   \
	}

static const tdef master_defs[] = {
    WEIGHTS(FLX_DT_BF16),
    FP32_MASTER("llama.embed_tokens.weight", "embedding_0.w_0", 8, 4, 2),
    FP32_MASTER("llama.layers.0.self_attn.q_proj.weight", "linear_0.w_0", 4, 6,
		2),
    /* fp32: states, no master weight; layer 1 holds no master weight */
    STATES("llama.layers.0.input_layernorm.weight", "create_parameter_0.w_0", 4,
	   0, 1),
    STATES("llama.layers.1.mlp.up_proj.weight", "linear_2.w_0", 4, 5, 2),
    /* a master weight whose name lacks the suffix; an unnamed state (the
     * last stage at pp=2 has no master weight) */
    {"llama.layers.0.self_attn.o_proj.weight.w_0",
     FLX_DT_F32,
     2,
     {6, 4},
     "o_proj_master",
     MW},
    {"lm_head.weight.moment1_0", FLX_DT_F32, 2, {4, 8}, NULL, M1},
};

static const tdef fp32_defs[] = {
    WEIGHTS(FLX_DT_F32),
    STATES("llama.embed_tokens.weight", "embedding_0.w_0", 8, 4, 2),
    STATES("llama.layers.0.self_attn.q_proj.weight", "linear_0.w_0", 4, 6, 2),
    STATES("llama.layers.1.mlp.up_proj.weight", "linear_2.w_0", 4, 5, 2),
};

static const tdef weight_defs[] = {WEIGHTS(FLX_DT_BF16)};

static const tdef dup_defs[] = {
    {"a.weight", FLX_DT_F32, 1, {4}, "linear_0.w_0", W},
    {"a.weight.moment1_0", FLX_DT_F32, 1, {4}, "linear_0.w_0_moment1_0", M1},
    {"b.weight.moment1_0", FLX_DT_F32, 1, {4}, "linear_0.w_0_moment1_0", M1},
};

static const tdef utf8_defs[] = {
    {"a.weight", FLX_DT_F32, 1, {4}, "linear_\xff.w_0", W},
};

static flx_paddle pd;

static int cmp_pair(const void *a, const void *b)
{
	return strcmp(((const flx_name_pair *)a)->key,
		      ((const flx_name_pair *)b)->key);
}

static const synth_layout synth = {
    .format = "paddle-dcp",
    .writer = "test",
    .data_file = "0_0.distcp",
    .nfiles = 1,
    .first = 16,
    .mul = 151,
    .add = 11,
};

/* Every tensor whole in one chunk of file 0, whose bytes are distinct. */
static flx_ckpt *make_ckpt(const char *dir, const tdef *defs, size_t n)
{
	flx_ckpt *c = NULL;
	uint64_t at = synth.first;

	CHECK(synth_ckpt_open(dir, &synth, n, &c) == 0);
	pd.names = calloc(n, sizeof(flx_name_pair));
	pd.nnames = 0;
	for (size_t i = 0; i < n; i++) {
		CHECK(synth_ckpt_whole(c, i, defs[i].fqn, defs[i].dt,
				       defs[i].ndim, defs[i].shape, &at) == 0);
		if (defs[i].name)
			pd.names[pd.nnames++] = (flx_name_pair){
			    .key = defs[i].fqn, .name = defs[i].name};
	}
	qsort(pd.names, pd.nnames, sizeof(*pd.names), cmp_pair);
	flx_paddle_attach(c, &pd);
	CHECK(synth_ckpt_fill(c, &synth, at) == 0);
	return c;
}

static void free_ckpt(flx_ckpt *c)
{
	flx_paddle_attach(c, NULL);
	flx_ckpt_close(c);
	free(pd.names);
	pd.names = NULL;
}

/* ---- the expectation ---- */

/* PaddleNLP's suffix, written out the obvious way. */
static void file_name(char *out, const char *base, const char *ext, int ntp,
		      int npp, int tp, int pp)
{
	if (ntp > 1 && npp > 1)
		sprintf(out, "%s.tp%02d_pp%02d%s", base, tp, pp, ext);
	else if (ntp > 1)
		sprintf(out, "%s.tp%02d%s", base, tp, ext);
	else if (npp > 1)
		sprintf(out, "%s.pp%02d%s", base, pp, ext);
	else
		sprintf(out, "%s%s", base, ext);
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++)
		fprintf(f, *s == '"' || *s == '\\' ? "\\%c" : "%c", *s);
	fputc('"', f);
}

/* The bytes of box b of whole-saved tensor t, in hex, element by element
 * from the backing file. */
static void box_hex(FILE *f, const flx_ckpt *c, const flx_tensor *t,
		    const flx_box *b)
{
	unsigned esz = flx_dtype_size(t->dtype);
	int64_t idx[FLX_MAX_DIMS] = {0}, n = 1;

	for (int d = 0; d < t->ndim; d++)
		n *= b->size[d];
	fputc('"', f);
	for (int64_t e = 0; e < n; e++) {
		int64_t lin = 0;
		unsigned char buf[16];

		for (int d = 0; d < t->ndim; d++)
			lin = lin * t->shape[d] + b->off[d] + idx[d];
		CHECK(pread(c->files[0].fd, buf, esz,
			    (off_t)(t->chunks[0].data_off +
				    (uint64_t)lin * esz)) == (ssize_t)esz);
		for (unsigned k = 0; k < esz; k++)
			fprintf(f, "%02x", buf[k]);
		for (int d = t->ndim - 1; d >= 0; d--) {
			if (++idx[d] < b->size[d])
				break;
			idx[d] = 0;
		}
	}
	fputc('"', f);
}

static const char *npy_of(flx_dtype dt)
{
	switch (dt) {
	case FLX_DT_BF16:
		return "<u2";
	case FLX_DT_F32:
		return "<f4";
	case FLX_DT_I64:
		return "<i8";
	case FLX_DT_BOOL:
		return "|b1";
	default:
		return "?";
	}
}

static void entry(FILE *f, const flx_ckpt *c, const flx_placement *pl, int tp,
		  const tdef *d, const char *k0, const char *k1, bool *first)
{
	const flx_box *b = flx_view_box(pl->views[tp]);
	const char *name = d->name ? d->name : d->fqn;

	fprintf(f, "%s\n    {\"path\": [", *first ? "" : ",");
	*first = false;
	json_str(f, k0);
	if (k1) {
		fputs(", ", f);
		json_str(f, k1);
	}
	fputs("], \"name\": ", f);
	json_str(f, name);
	fprintf(f, ", \"dtype\": \"%s\", \"shape\": [", npy_of(d->dt));
	for (int i = 0; i < d->ndim; i++)
		fprintf(f, "%s%lld", i ? ", " : "", (long long)b->size[i]);
	fputs("], \"hex\": ", f);
	box_hex(f, c, pl->src, b);
	fputc('}', f);
}

/* What file (tp, pp) of kind opt must hold, in order, as JSON. */
static void expect_file(FILE *f, const flx_ckpt *c, const flx_plan *p,
			const tdef *defs, int tp, int pp, bool opt,
			bool have_master)
{
	static const enum kind order[] = {M1, M2, B1, B2};
	bool first = true, master_here = false;

	for (size_t i = 0; i < p->n; i++)
		master_here |= defs[i].kind == MW && pp >= p->p[i].stage_lo &&
			       pp <= p->p[i].stage_hi;
	fprintf(f, "{\"form\": \"%s\", \"master_empty\": %s, \"entries\": [",
		opt && master_here ? "tuples" : "state_dict",
		opt && have_master && !master_here ? "true" : "false");
	for (int o = 0; o < (opt ? 5 : 1); o++)
		for (size_t i = 0; i < p->n; i++) {
			const flx_placement *pl = &p->p[i];
			const tdef *d = &defs[i];
			const char *name = d->name ? d->name : d->fqn;
			char mkey[200];

			if (pp < pl->stage_lo || pp > pl->stage_hi)
				continue;
			if (!opt && d->kind == W)
				entry(f, c, pl, tp, d,
				      flx_placement_name(pl, pp), NULL, &first);
			if (opt && o < 4 && d->kind == order[o])
				entry(f, c, pl, tp, d, name, NULL, &first);
			if (opt && o == 4 && d->kind == MW) {
				snprintf(mkey, sizeof(mkey), "%s", name);
				if (strstr(mkey, "_fp32_master_0"))
					*strstr(mkey, "_fp32_master_0") = '\0';
				entry(f, c, pl, tp, d, "master_weights", mkey,
				      &first);
			}
		}
	fputs("]}", f);
}

/* ---- comparing ---- */

/* File path of fs read whole and in steps; written to out/name. */
static void read_file(const flx_fs *fs, const char *path, const char *out)
{
	static const size_t steps[] = {1, 7, 4096};
	flx_stat st;
	unsigned char *whole, *got;
	FILE *f;

	if (flx_fs_resolve(fs, path, &st)) {
		fprintf(stderr, "missing: %s\n", path);
		check_failures++;
		return;
	}
	whole = malloc(st.size + 1);
	got = malloc(st.size + 1);
	CHECK_EQ(flx_fs_read(fs, st.ino, whole, st.size + 1, 0, NULL),
		 (ssize_t)st.size);
	/* generated bytes (the head, before any tensor's, and the end)
	 * read without allocating */
#ifndef COUNT_ALLOC_OFF
	unsigned long before = nallocs;
#endif
	CHECK(st.size > 64);
	CHECK_EQ(flx_fs_read(fs, st.ino, got, 64, 0, NULL), 64);
	CHECK_EQ(flx_fs_read(fs, st.ino, got + 64, 2, st.size - 2, NULL), 2);
#ifndef COUNT_ALLOC_OFF
	CHECK_EQ(nallocs, before);
#endif
	CHECK(!memcmp(got, whole, 64) && !memcmp(got + 64, "u.", 2));
	for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++) {
		uint64_t off = 0;

		memset(got, 0, st.size);
		while (off < st.size) {
			size_t n = steps[s] < st.size - off
				       ? steps[s]
				       : (size_t)(st.size - off);

			if (flx_fs_read(fs, st.ino, got + off, n, off, NULL) !=
			    (ssize_t)n)
				break;
			off += n;
		}
		if (off != st.size || memcmp(got, whole, st.size)) {
			fprintf(stderr, "%s: differs when read by %zu\n", path,
				steps[s]);
			check_failures++;
		}
	}
	f = fopen(out, "wb");
	CHECK(f && fwrite(whole, 1, st.size, f) == st.size);
	if (f)
		fclose(f);
	free(whole);
	free(got);
}

static bool have_python;

static void run(const flx_ckpt *c, const tdef *defs, const char *rules,
		const char *tmp, int tp, int pp)
{
	char v[16], path[1200], exp[1200], cmd[2600];
	bool opt = false, master = false;
	size_t nfiles = 0;
	const char *name;
	flx_stat st, dst;
	flx_spec s;
	flx_plan *p = NULL;
	flx_fs *fs = NULL;
	flx_error err;
	FILE *f;

	for (size_t i = 0; i < c->ntensors; i++) {
		opt |= defs[i].kind != W;
		master |= defs[i].kind == MW;
	}
	flx_spec_init(&s);
	flx_error_init(&err);
	snprintf(v, sizeof(v), "%d", tp);
	CHECK_EQ(flx_spec_set(&s, "tp", v, &err), 0);
	snprintf(v, sizeof(v), "%d", pp);
	CHECK_EQ(flx_spec_set(&s, "pp", v, &err), 0);
	CHECK_EQ(flx_spec_set(&s, "rules", rules, &err), 0);
	CHECK_EQ(flx_plan_build(c, &s, &p, &err), 0);
	if (p)
		CHECK_EQ(flx_fs_build(c, p, &fs, &err), 0);
	if (!fs) {
		fprintf(stderr, "tp=%d pp=%d: %s: %s\n", tp, pp, err.key,
			err.text);
		check_failures++;
		goto out;
	}
	snprintf(exp, sizeof(exp), "%s/expected.json", tmp);
	f = fopen(exp, "w");
	CHECK(f != NULL);
	fputs("{", f);
	for (int q = 0; q < pp; q++)
		for (int t = 0; t < tp; t++)
			for (int o = 0; o < 1 + opt; o++) {
				char fname[64];

				file_name(
				    fname, o ? "optimizer" : "model_state",
				    o ? ".pdopt" : ".pdparams", tp, pp, t, q);
				snprintf(path, sizeof(path), "paddle/%s",
					 fname);
				snprintf(cmd, sizeof(cmd), "%s/%s", tmp, fname);
				read_file(fs, path, cmd);
				fprintf(f, "%s\n \"%s\": ", nfiles ? "," : "",
					fname);
				expect_file(f, c, p, defs, t, q, o, master);
				nfiles++;
			}
	fputs("}\n", f);
	fclose(f);
	/* nothing else in paddle/ */
	CHECK_EQ(flx_fs_resolve(fs, "paddle", &dst), 0);
	CHECK_EQ(flx_fs_readdir(fs, dst.ino, nfiles, &name, &st), 0);
	CHECK(name == NULL);
	if (have_python) {
		snprintf(cmd, sizeof(cmd),
			 "/usr/bin/python3 unit/check_pdparams.py '%s'", tmp);
		if (system(cmd)) {
			fprintf(stderr, "tp=%d pp=%d: check_pdparams failed\n",
				tp, pp);
			check_failures++;
		}
	}
out:
	flx_fs_free(fs);
	flx_plan_free(p);
	flx_spec_release(&s);
}

/* A checkpoint whose tree cannot be built: the error names the key and
 * the generated file. */
static void refused(const char *dir, const tdef *defs, size_t n, int code,
		    const char *file, const char *key)
{
	flx_ckpt *c = make_ckpt(dir, defs, n);
	flx_spec s;
	flx_plan *p = NULL;
	flx_fs *fs = NULL;
	flx_error err;

	flx_spec_init(&s);
	flx_error_init(&err);
	CHECK_EQ(flx_plan_build(c, &s, &p, &err), 0);
	CHECK_EQ(flx_fs_build(c, p, &fs, &err), code);
	CHECK(fs == NULL);
	CHECK(strstr(err.text, file) != NULL);
	CHECK_STR(err.key, key);
	flx_plan_free(p);
	flx_spec_release(&s);
	free_ckpt(c);
}

/* Bytes of the paddle/ file at off, which must read n bytes. */
static void fs_bytes(const flx_fs *fs, uint64_t ino, uint64_t off, void *buf,
		     size_t n)
{
	CHECK_EQ(flx_fs_read(fs, ino, buf, n, off, NULL), (ssize_t)n);
}

/*
 * A tensor of 4 GiB and more (2^30 + 1 float32, in a sparse data file):
 * its bytes follow BINBYTES8's u64 length (target-formats.md 6), then the
 * next tensor's key and its BINBYTES.  The head is written out here by
 * hand; marks at the ends of each tensor's bytes show where they are
 * served.
 */
static void binbytes8(const char *dir)
{
	static const int64_t big[] = {(INT64_C(1) << 30) + 1}, small[] = {2};
	static const char head[] =
	    "\x80\x04}(X\x03\x00\x00\x00"
	    "big"
	    "cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
	    "K\x00\x85"
	    "C\x01"
	    "b\x87R(K\x01J\x01\x00\x00\x40\x85"
	    "cnumpy\ndtype\nX\x02\x00\x00\x00"
	    "f4\x89\x88\x87R"
	    "(K\x03X\x01\x00\x00\x00<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xff"
	    "K\x00tb\x89\x8e\x04\x00\x00\x00\x01\x00\x00\x00";
	const uint64_t nb = ((uint64_t)1 << 32) + 4, h = sizeof(head) - 1;
	unsigned char got[sizeof(head) + 64];
	uint64_t at = synth.first, small_at;
	flx_ckpt *c = NULL;
	flx_spec s;
	flx_plan *p = NULL;
	flx_fs *fs = NULL;
	flx_error err;
	flx_stat st;
	struct stat fst;

	CHECK(synth_ckpt_open(dir, &synth, 2, &c) == 0);
	if (!c)
		return;
	CHECK(synth_ckpt_whole(c, 0, "big", FLX_DT_F32, 1, big, &at) == 0);
	small_at = at;
	CHECK(synth_ckpt_whole(c, 1, "small", FLX_DT_F32, 1, small, &at) == 0);
	CHECK(ftruncate(c->files[0].fd, (off_t)at) == 0);
	CHECK(pwrite(c->files[0].fd, "HEAD", 4, (off_t)synth.first) == 4);
	CHECK(pwrite(c->files[0].fd, "TAIL", 4,
		     (off_t)(synth.first + nb - 4)) == 4);
	CHECK(pwrite(c->files[0].fd, "SMALLxyz", 8, (off_t)small_at) == 8);
	CHECK(fstat(c->files[0].fd, &fst) == 0);
	flx_file_identity(&c->files[0], &fst);
	pd.names = NULL;
	pd.nnames = 0;
	flx_paddle_attach(c, &pd);
	flx_spec_init(&s);
	flx_error_init(&err);
	CHECK_EQ(flx_plan_build(c, &s, &p, &err), 0);
	if (p)
		CHECK_EQ(flx_fs_build(c, p, &fs, &err), 0);
	if (fs && !flx_fs_resolve(fs, "paddle/model_state.pdparams", &st)) {
		static const char mid[] = "tbX\x05\x00\x00\x00small";
		static const char tail[] =
		    "tbX\x1b\x00\x00\x00StructuredToParameterName@@}("
		    "X\x03\x00\x00\x00"
		    "bigX\x03\x00\x00\x00"
		    "big"
		    "X\x05\x00\x00\x00smallX\x05\x00\x00\x00smalluu.";
		/* small's start: its key (5 bytes more than big's), the same
		 * opcodes with shape K\x02\x85 (3 bytes less) and BINBYTES
		 * with a u32 (4 less) */
		uint64_t sm = h + nb + 2 + (h - 9);

		fs_bytes(fs, st.ino, 0, got, h + 4);
		CHECK(!memcmp(got, head, h) && !memcmp(got + h, "HEAD", 4));
		fs_bytes(fs, st.ino, h + nb - 4, got, 4 + sizeof(mid) - 1);
		CHECK(!memcmp(got, "TAIL", 4) &&
		      !memcmp(got + 4, mid, sizeof(mid) - 1));
		fs_bytes(fs, st.ino, sm - 6, got, 14);
		CHECK(!memcmp(got,
			      "\x89"
			      "B\x08\x00\x00\x00",
			      6));
		CHECK(!memcmp(got + 6, "SMALLxyz", 8));
		CHECK_EQ(st.size, sm + 8 + sizeof(tail) - 1);
		fs_bytes(fs, st.ino, sm + 8, got, sizeof(tail) - 1);
		CHECK(!memcmp(got, tail, sizeof(tail) - 1));
	} else {
		fprintf(stderr, "binbytes8: %s: %s\n", err.key, err.text);
		check_failures++;
	}
	flx_fs_free(fs);
	flx_plan_free(p);
	flx_spec_release(&s);
	free_ckpt(c);
}

int main(void)
{
	char dir[] = "/tmp/flx_test_pdparams_XXXXXX";
	char rules[600], path[700];
	const struct {
		const tdef *defs;
		size_t n;
	} sets[] = {
	    {master_defs, sizeof(master_defs) / sizeof(master_defs[0])},
	    {fp32_defs, sizeof(fp32_defs) / sizeof(fp32_defs[0])},
	    {weight_defs, sizeof(weight_defs) / sizeof(weight_defs[0])},
	};
	static const int tps[] = {1, 2, 4}, pps[] = {1, 2};
	FILE *f;

	have_python =
	    access("/usr/bin/python3", X_OK) == 0 &&
	    system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") == 0;
	if (!have_python)
		fprintf(stderr, "no /usr/bin/python3 with numpy: the pickle "
				"check is skipped\n");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(rules, sizeof(rules), "%s/rules.json", dir);
	f = fopen(rules, "w");
	CHECK(f && fputs(rules_text, f) >= 0);
	if (f)
		fclose(f);
	for (size_t k = 0; k < sizeof(sets) / sizeof(sets[0]); k++) {
		flx_ckpt *c = make_ckpt(dir, sets[k].defs, sets[k].n);

		for (int i = 0; i < 3; i++)
			for (int j = 0; j < 2; j++) {
				char tmp[700];

				snprintf(tmp, sizeof(tmp), "%s/out", dir);
				mkdir(tmp, 0700);
				run(c, sets[k].defs, rules, tmp, tps[i],
				    pps[j]);
				snprintf(path, sizeof(path), "rm -rf '%s/out'",
					 dir);
				CHECK(system(path) == 0);
			}
		free_ckpt(c);
	}
	/* no Paddle state: no paddle/ */
	{
		flx_ckpt *c = make_ckpt(dir, weight_defs, 3);
		flx_spec s;
		flx_plan *p = NULL;
		flx_fs *fs = NULL;
		flx_error err;
		flx_stat st;

		flx_paddle_attach(c, NULL);
		flx_spec_init(&s);
		CHECK_EQ(flx_plan_build(c, &s, &p, &err), 0);
		CHECK_EQ(flx_fs_build(c, p, &fs, &err), 0);
		CHECK_EQ(flx_fs_resolve(fs, "paddle", &st), -ENOENT);
		flx_fs_free(fs);
		flx_plan_free(p);
		flx_spec_release(&s);
		free_ckpt(c);
	}
	binbytes8(dir);
	refused(dir, dup_defs, 3, -EEXIST, "paddle/optimizer.pdopt",
		"linear_0.w_0_moment1_0");
	refused(dir, utf8_defs, 1, -EINVAL, "paddle/model_state.pdparams",
		"linear_%FF.w_0"); /* escaped, error.h */
	unlink(rules);
	snprintf(path, sizeof(path), "%s/0_0.distcp", dir);
	unlink(path);
	rmdir(dir);
	return CHECK_RESULT();
}
