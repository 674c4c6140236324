/* SPDX-License-Identifier: MIT */
/*
 * The transform stage and its casts against independent oracles.
 *
 * Casts: every supported pair over the vectors of gen_cast_vectors.py
 * (exact rational arithmetic, cross-checked there with numpy and torch).
 *
 * Transforms: a synthetic checkpoint, whose element at every index is a
 * formula of the tensor and the index, saved as chunks of different
 * storage orders, storage offsets and files, is transformed; every target
 * tensor is read through views over many boxes and byte ranges and
 * compared with the formula at the source index that numpy-style index
 * arithmetic, written out below for each target, gives.
 */
#include "cast.h"
#include "check.h"
#include "ckpt.h"
#include "plan.h"
#include "spec.h"
#include "transform.h"
#include "tree.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- casts ---- */

static const struct {
	const char *name;
	flx_dtype dt;
} dt_names[] = {
    {"f64", FLX_DT_F64},   {"f32", FLX_DT_F32}, {"f16", FLX_DT_F16},
    {"bf16", FLX_DT_BF16}, {"i64", FLX_DT_I64}, {"i32", FLX_DT_I32},
    {"i16", FLX_DT_I16},   {"i8", FLX_DT_I8},	{"u8", FLX_DT_U8},
    {"bool", FLX_DT_BOOL}, {"u16", FLX_DT_U16}, {"u32", FLX_DT_U32},
    {"u64", FLX_DT_U64},
};
#define NDT (sizeof(dt_names) / sizeof(dt_names[0]))

static int dt_index(const char *name, size_t len)
{
	for (size_t i = 0; i < NDT; i++)
		if (strlen(dt_names[i].name) == len &&
		    memcmp(dt_names[i].name, name, len) == 0)
			return (int)i;
	return -1;
}

/* The vectors, per source type: inputs and, per target, expected bits
 * (UINT64_MAX: the pair is not listed). */
typedef struct vecs {
	size_t n, cap;
	uint64_t *in;
	uint64_t *out[NDT];
} vecs;

static void vec_add(vecs *v, uint64_t in, const uint64_t *out)
{
	if (v->n == v->cap) {
		v->cap = v->cap ? 2 * v->cap : 64;
		v->in = realloc(v->in, v->cap * sizeof(uint64_t));
		for (size_t j = 0; j < NDT; j++)
			v->out[j] =
			    realloc(v->out[j], v->cap * sizeof(uint64_t));
	}
	v->in[v->n] = in;
	for (size_t j = 0; j < NDT; j++)
		v->out[j][v->n] = out[j];
	v->n++;
}

static size_t vectors_listed; /* (element, target) pairs in the file */

static void load_vectors(vecs *all)
{
	size_t len;
	char *text = (char *)check_read_file("cast_vectors.txt", &len);
	char *line, *save = NULL;

	CHECK(text != NULL);
	if (!text)
		return;
	text[len] = 0;
	for (line = strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		uint64_t out[NDT], in;
		char *p = line, *sp;
		int src;

		if (line[0] == '#')
			continue;
		sp = strchr(p, ' ');
		src = sp ? dt_index(p, (size_t)(sp - p)) : -1;
		CHECK(src >= 0);
		if (src < 0)
			continue;
		in = strtoull(sp + 1, &p, 16);
		for (size_t j = 0; j < NDT; j++)
			out[j] = UINT64_MAX;
		while (*p == ' ') {
			char *eq = strchr(p + 1, '=');
			int dst =
			    eq ? dt_index(p + 1, (size_t)(eq - p - 1)) : -1;

			CHECK(dst >= 0);
			if (dst < 0)
				break;
			out[dst] = strtoull(eq + 1, &p, 16);
			vectors_listed++;
		}
		vec_add(&all[src], in, out);
	}
	free(text);
}

static void put_bits(unsigned char *p, unsigned sz, uint64_t v)
{
	for (unsigned i = 0; i < sz; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_bits(const unsigned char *p, unsigned sz)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < sz; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

/* Every listed pair, one element at a time and as one array. */
static void test_cast_vectors(void)
{
	vecs all[NDT] = {{0}};
	size_t checked = 0, pairs = 0;

	load_vectors(all);
	for (size_t s = 0; s < NDT; s++) {
		const vecs *v = &all[s];
		flx_dtype from = dt_names[s].dt;
		unsigned ssz = flx_dtype_size(from);

		CHECK(v->n > 0);
		for (size_t d = 0; d < NDT && v->n; d++) {
			flx_dtype to = dt_names[d].dt;
			unsigned dsz = flx_dtype_size(to);
			bool listed = v->out[d][0] != UINT64_MAX;
			unsigned char *src = malloc(v->n * ssz);
			unsigned char *dst = malloc(v->n * dsz);

			CHECK_EQ(flx_cast_supported(from, to), listed);
			for (size_t i = 0; i < v->n; i++)
				put_bits(src + i * ssz, ssz, v->in[i]);
			if (!listed) {
				CHECK_EQ(flx_cast(to, dst, from, src, v->n),
					 -EINVAL);
				free(src);
				free(dst);
				continue;
			}
			pairs++;
			CHECK_EQ(flx_cast(to, dst, from, src, v->n), 0);
			for (size_t i = 0; i < v->n; i++) {
				unsigned char one[8];
				uint64_t want = v->out[d][i];

				CHECK_EQ(
				    flx_cast(to, one, from, src + i * ssz, 1),
				    0);
				if (get_bits(dst + i * dsz, dsz) != want ||
				    get_bits(one, dsz) != want) {
					fprintf(stderr,
						"cast %s %llx -> %s: %llx, "
						"want %llx\n",
						dt_names[s].name,
						(unsigned long long)v->in[i],
						dt_names[d].name,
						(unsigned long long)get_bits(
						    dst + i * dsz, dsz),
						(unsigned long long)want);
					check_failures++;
				}
				checked++;
			}
			free(src);
			free(dst);
		}
		free(v->in);
		for (size_t j = 0; j < NDT; j++)
			free(v->out[j]);
	}
	/* 4 x 4 floating pairs, 9 x 9 integer pairs, 9 x 4 to floating */
	CHECK_EQ(pairs, 16 + 81 + 36);
	CHECK(checked > 7000);
	CHECK_EQ(checked, vectors_listed);
	CHECK(!flx_cast_supported(FLX_DT_F32, FLX_DT_I32));
	CHECK(!flx_cast_supported(FLX_DT_C64, FLX_DT_C64));
	CHECK(!flx_cast_supported(FLX_DT_F8_E4M3FN, FLX_DT_F32));
}

static void test_cast_exact(void)
{
	static const struct {
		flx_dtype a, b;
		bool exact;
	} e[] = {
	    {FLX_DT_F16, FLX_DT_F32, true},   {FLX_DT_BF16, FLX_DT_F32, true},
	    {FLX_DT_F32, FLX_DT_F64, true},   {FLX_DT_F16, FLX_DT_BF16, false},
	    {FLX_DT_BF16, FLX_DT_F16, false}, {FLX_DT_F32, FLX_DT_BF16, false},
	    {FLX_DT_I16, FLX_DT_F32, true},   {FLX_DT_I32, FLX_DT_F32, false},
	    {FLX_DT_I32, FLX_DT_F64, true},   {FLX_DT_U8, FLX_DT_BF16, true},
	    {FLX_DT_I16, FLX_DT_F16, false},  {FLX_DT_U32, FLX_DT_I64, true},
	    {FLX_DT_I32, FLX_DT_U64, false},  {FLX_DT_U32, FLX_DT_I32, false},
	    {FLX_DT_BOOL, FLX_DT_BF16, true}, {FLX_DT_I8, FLX_DT_BOOL, false},
	    {FLX_DT_F32, FLX_DT_I64, false},
	};

	for (size_t i = 0; i < sizeof(e) / sizeof(e[0]); i++)
		if (flx_cast_exact(e[i].a, e[i].b) != e[i].exact) {
			fprintf(stderr, "exact %s -> %s\n",
				flx_dtype_name(e[i].a), flx_dtype_name(e[i].b));
			check_failures++;
		}
}

/* flx_cast_read() over a source of 40,000 f32 elements (more than one
 * batch), read to f64 and bf16 at ranges that start and end inside
 * elements, against flx_cast() of the whole array; flx_cast_read_conv()
 * alike, in one call. */
typedef struct arr_src {
	const unsigned char *p;
	size_t len;
	int calls;
} arr_src;

static int arr_read(void *ctx, void *buf, size_t n, uint64_t off)
{
	arr_src *a = ctx;

	a->calls++;
	if (off > a->len || n > a->len - off || off % 4 || n % 4)
		return -EIO;
	memcpy(buf, a->p + off, n);
	return 0;
}

/* flx_cast_read_conv()'s source: k whole converted elements from e on,
 * converted by elemcast.h (the device's code) from a's f32 elements into
 * conv_to. */
static flx_dtype conv_to;

static int arr_conv(void *ctx, void *conv, size_t k, uint64_t e)
{
	arr_src *a = ctx;
	flx_ecast c;

	a->calls++;
	if (e > a->len / 4 || k > a->len / 4 - e ||
	    flx_cast_desc(FLX_DT_F32, conv_to, &c))
		return -EIO;
	flx_ecast_n(&c, conv, a->p + e * 4, k);
	return 0;
}

static void test_cast_read(void)
{
	enum { N = 40000 };
	float *f = malloc(N * sizeof(float));
	unsigned char *whole = malloc(N * 8), *got = malloc(N * 8 + 8);
	arr_src a = {(const unsigned char *)f, N * sizeof(float), 0};
	static const flx_dtype to[] = {FLX_DT_F64, FLX_DT_BF16};

	for (int i = 0; i < N; i++)
		f[i] = (float)i * 0.37f - 1000.0f;
	for (size_t t = 0; t < 2; t++) {
		unsigned tsz = flx_dtype_size(to[t]);
		static const uint64_t offs[] = {0, 1, 7, 8, 12345, 65537};
		static const size_t lens[] = {1, 3, 9, 100, 70001, 200000};

		CHECK_EQ(flx_cast(to[t], whole, FLX_DT_F32, f, N), 0);
		conv_to = to[t];
		for (size_t i = 0; i < 6; i++)
			for (size_t j = 0; j < 6; j++) {
				uint64_t off = offs[i];
				size_t n = lens[j];

				if (off + n > (uint64_t)N * tsz)
					n = (size_t)(N * tsz - off);
				memset(got, 0xAB, n);
				CHECK_EQ(flx_cast_read(to[t], FLX_DT_F32,
						       arr_read, &a, got, n,
						       off),
					 0);
				CHECK(memcmp(got, whole + off, n) == 0);
				/* the one-pass reader: one call, the same
				 * bytes, none past them */
				memset(got, 0xAB, n + 8);
				a.calls = 0;
				CHECK_EQ(flx_cast_read_conv(to[t], FLX_DT_F32,
							    arr_conv, &a, got,
							    n, off),
					 0);
				CHECK_EQ(a.calls, 1);
				CHECK(memcmp(got, whole + off, n) == 0);
				for (size_t q = n; q < n + 8; q++)
					CHECK_EQ(got[q], 0xAB);
			}
	}
	a.calls = 0;
	CHECK_EQ(
	    flx_cast_read_conv(FLX_DT_I32, FLX_DT_F32, arr_conv, &a, got, 4, 0),
	    -EINVAL);
	CHECK_EQ(a.calls, 0);
	CHECK_EQ(flx_cast_read(FLX_DT_I32, FLX_DT_F32, arr_read, &a, got, 4, 0),
		 -EINVAL);
	CHECK_EQ(a.calls, 0);
	a.len = 16; /* the source fails: its error comes back */
	CHECK_EQ(
	    flx_cast_read(FLX_DT_F64, FLX_DT_F32, arr_read, &a, got, 800, 0),
	    -EIO);
	free(f);
	free(whole);
	free(got);
}

/* ---- a synthetic checkpoint ---- */

#define MAXD 3

typedef struct cspec {
	int64_t off[MAXD], size[MAXD];
	int order[MAXD]; /* storage order of the axes, outermost first */
	int64_t soff;
	int file;
} cspec;

typedef struct tspec {
	const char *name;
	int id;
	flx_dtype dtype; /* F32 or I32 */
	bool noisy;	 /* F32 values that bf16 must round */
	int ndim;
	int64_t shape[MAXD];
	int nchunks;
	cspec ch[4];
} tspec;

static const tspec tensors[] = {
    /* [layers, rows, cols], saved split along rows and layers, in four
     * storage orders: row-major, transposed, rows outermost, columns
     * before rows */
    {"stack.w",
     1,
     FLX_DT_F32,
     false,
     3,
     {4, 6, 5},
     4,
     {{{0, 0, 0}, {2, 3, 5}, {0, 1, 2}, 0, 0},
      {{0, 3, 0}, {2, 3, 5}, {2, 1, 0}, 3, 1},
      {{2, 0, 0}, {2, 3, 5}, {1, 0, 2}, 0, 0},
      {{2, 3, 0}, {2, 3, 5}, {0, 2, 1}, 7, 1}}},
    /* a fused QKV of 2 groups, 2 query heads of dim 2 per group */
    {"qkv.w",
     2,
     FLX_DT_F32,
     false,
     2,
     {16, 3},
     2,
     {{{0, 0}, {8, 3}, {0, 1}, 0, 0}, {{8, 0}, {8, 3}, {1, 0}, 2, 1}}},
    {"gate_up.w",
     3,
     FLX_DT_I32,
     false,
     2,
     {8, 3},
     2,
     {{{0, 0}, {8, 2}, {0, 1}, 0, 1}, {{0, 2}, {8, 1}, {0, 1}, 1, 0}}},
    {"q.w",
     4,
     FLX_DT_I32,
     false,
     2,
     {4, 3},
     1,
     {{{0, 0}, {4, 3}, {0, 1}, 0, 0}}},
    {"k.w",
     5,
     FLX_DT_I32,
     false,
     2,
     {2, 3},
     2,
     {{{0, 0}, {2, 1}, {1, 0}, 0, 1}, {{0, 1}, {2, 2}, {1, 0}, 0, 0}}},
    {"v.w",
     6,
     FLX_DT_I32,
     false,
     2,
     {2, 3},
     1,
     {{{0, 0}, {2, 3}, {1, 0}, 5, 1}}},
    {"noisy.w",
     7,
     FLX_DT_F32,
     true,
     2,
     {3, 7},
     2,
     {{{0, 0}, {2, 7}, {0, 1}, 0, 0}, {{2, 0}, {1, 7}, {1, 0}, 0, 1}}},
    {"plain.b", 8, FLX_DT_I32, false, 1, {5}, 1, {{{0}, {5}, {0}, 0, 0}}},
    {"vec.b",
     9,
     FLX_DT_F32,
     false,
     1,
     {6},
     2,
     {{{0}, {4}, {0}, 0, 1}, {{4}, {2}, {0}, 2, 0}}},
};
#define NTENSORS (int)(sizeof(tensors) / sizeof(tensors[0]))

static const tspec *spec_of(int id)
{
	for (int i = 0; i < NTENSORS; i++)
		if (tensors[i].id == id)
			return &tensors[i];
	return NULL;
}

/* The bits of source tensor id's element at g (its dtype's, 4 bytes). */
static uint32_t source_bits(int id, const int64_t *g)
{
	const tspec *t = spec_of(id);
	int64_t v = (int64_t)id * 1000000 + 1, w = 1;
	uint32_t u;

	for (int d = t->ndim - 1; d >= 0; d--, w *= 100)
		v += g[d] * w;
	if (t->dtype == FLX_DT_I32) {
		int32_t i = (int32_t)v;

		memcpy(&u, &i, 4);
	} else {
		float f = t->noisy ? (float)v * 0.3711f + 0.1f : (float)v;

		memcpy(&u, &f, 4);
	}
	return u;
}

static void write_chunk(int fd, uint64_t at, const tspec *t, const cspec *s,
			flx_chunk *ch)
{
	int64_t stride[MAXD], n = 1, total = s->soff, idx[MAXD] = {0};
	uint32_t *buf;

	for (int k = t->ndim - 1; k >= 0; k--) {
		stride[s->order[k]] = n;
		n *= s->size[s->order[k]];
	}
	total += n;
	buf = calloc((size_t)total + 1, 4);
	for (int64_t e = 0; e < n; e++) {
		int64_t g[MAXD], rest = e, pos = s->soff;

		for (int d = t->ndim - 1; d >= 0; d--) {
			idx[d] = rest % s->size[d];
			rest /= s->size[d];
		}
		for (int d = 0; d < t->ndim; d++) {
			g[d] = s->off[d] + idx[d];
			pos += idx[d] * stride[d];
		}
		buf[pos] = source_bits(t->id, g);
	}
	CHECK(pwrite(fd, buf, (size_t)total * 4, (off_t)at) == total * 4);
	free(buf);
	for (int d = 0; d < t->ndim; d++) {
		ch->off[d] = s->off[d];
		ch->size[d] = s->size[d];
		ch->stride[d] = stride[d];
	}
	ch->contig_from = flx_chunk_contig_from(t->ndim, ch);
	ch->storage_offset = s->soff;
	ch->data_off = at;
	ch->item_off = at;
	ch->item_len = (uint64_t)total * 4;
}

static int cmp_tensor_ptr(const void *a, const void *b)
{
	return strcmp((*(flx_tensor *const *)a)->fqn,
		      (*(flx_tensor *const *)b)->fqn);
}

static flx_ckpt *make_ckpt(const char *dir)
{
	flx_ckpt *c = calloc(1, sizeof(*c));
	uint64_t at[2] = {16, 40};

	c->dir = strdup(dir);
	c->format = strdup("test");
	c->writer = strdup("test");
	c->nfiles = 2;
	c->files = calloc(2, sizeof(flx_file));
	for (int f = 0; f < 2; f++) {
		char path[512];

		snprintf(path, sizeof(path), "%s/f%d", dir, f);
		c->files[f].relpath = strdup(path);
		c->files[f].fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
		c->files[f].data = true;
		CHECK(c->files[f].fd >= 0);
	}
	c->ntensors = (size_t)NTENSORS;
	c->tensors = calloc((size_t)NTENSORS, sizeof(flx_tensor));
	for (int i = 0; i < NTENSORS; i++) {
		const tspec *s = &tensors[i];
		flx_tensor *t = &c->tensors[i];

		t->fqn = strdup(s->name);
		t->dtype = s->dtype;
		t->ndim = s->ndim;
		memcpy(t->shape, s->shape, sizeof(s->shape));
		t->nchunks = (uint32_t)s->nchunks;
		CHECK(flx_tensor_alloc_chunks(t, t->nchunks) == 0);
		for (int k = 0; k < s->nchunks; k++) {
			const cspec *cs = &s->ch[k];
			uint64_t n = flx_numel(s->ndim, cs->size);

			t->chunks[k].file = (uint32_t)cs->file;
			write_chunk(c->files[cs->file].fd, at[cs->file], s, cs,
				    &t->chunks[k]);
			at[cs->file] += (n + (uint64_t)cs->soff) * 4 + 12;
		}
	}
	for (int f = 0; f < 2; f++) {
		struct stat st;

		CHECK(fstat(c->files[f].fd, &st) == 0);
		flx_file_identity(&c->files[f], &st);
	}
	c->by_name = calloc((size_t)NTENSORS, sizeof(flx_tensor *));
	for (int i = 0; i < NTENSORS; i++)
		c->by_name[i] = &c->tensors[i];
	qsort(c->by_name, (size_t)NTENSORS, sizeof(*c->by_name),
	      cmp_tensor_ptr);
	c->nobjects = 1;
	c->objects = calloc(1, sizeof(flx_object));
	c->objects[0].fqn = strdup("extra_state");
	return c;
}

/* ---- the oracle ---- */

/* A target and where each of its elements comes from. */
typedef struct tcase {
	const char *name;
	flx_dtype dtype;
	int ndim;
	int64_t shape[MAXD];
	int p; /* the map's parameter */
	/* source tensor id and index of target element t */
	void (*map)(const struct tcase *tc, const int64_t *t, int *id,
		    int64_t *s);
} tcase;

/* f32 to bf16, rounded to nearest even (no NaN in the data). */
static uint16_t bf16_of(uint32_t u)
{
	uint32_t lsb = (u >> 16) & 1;

	return (uint16_t)((u + 0x7fff + lsb) >> 16);
}

/* Element bits of dtype to from source bits of type from (F32 or I32). */
static void convert_one(flx_dtype from, uint32_t u, flx_dtype to,
			unsigned char *out)
{
	float f;
	int32_t i;
	double d;

	memcpy(&f, &u, 4);
	memcpy(&i, &u, 4);
	if (from == to) {
		memcpy(out, &u, 4);
	} else if (from == FLX_DT_F32 && to == FLX_DT_F64) {
		d = f;
		memcpy(out, &d, 8);
	} else if (from == FLX_DT_F32 && to == FLX_DT_BF16) {
		uint16_t h = bf16_of(u);

		memcpy(out, &h, 2);
	} else if (from == FLX_DT_I32 && to == FLX_DT_F32) {
		f = (float)i;
		memcpy(out, &f, 4);
	} else {
		CHECK(!"no oracle conversion");
	}
}

/* Expected bytes of box b of target tc, in C order. */
static unsigned char *expect_box(const tcase *tc, const flx_box *b, size_t *len)
{
	unsigned esz = flx_dtype_size(tc->dtype);
	uint64_t n = flx_numel(tc->ndim, b->size);
	unsigned char *out = malloc(n * esz + 1);

	for (uint64_t e = 0; e < n; e++) {
		int64_t t[MAXD], s[MAXD], rest = (int64_t)e;
		int id;

		for (int d = tc->ndim - 1; d >= 0; d--) {
			t[d] = b->off[d] + rest % b->size[d];
			rest /= b->size[d];
		}
		tc->map(tc, t, &id, s);
		convert_one(spec_of(id)->dtype, source_bits(id, s), tc->dtype,
			    out + e * esz);
	}
	*len = n * esz;
	return out;
}

static void map_same(const tcase *tc, const int64_t *t, int *id, int64_t *s)
{
	*id = tc->p;
	memcpy(s, t, MAXD * sizeof(int64_t));
}

/* stack.w[p] */
static void map_layer(const tcase *tc, const int64_t *t, int *id, int64_t *s)
{
	*id = 1;
	s[0] = tc->p;
	s[1] = t[0];
	s[2] = t[1];
}

/* query, key or value rows of group-interleaved qkv.w: per group, 4 query
 * rows, 2 key rows, 2 value rows; p: 0 q, 1 k, 2 v */
static void map_qkv(const tcase *tc, const int64_t *t, int *id, int64_t *s)
{
	int64_t per = tc->p == 0 ? 4 : 2,
		first = tc->p == 0 ? 0 : 2 + 2 * tc->p;

	*id = 2;
	s[0] = t[0] / per * 8 + first + t[0] % per;
	s[1] = t[1];
}

/* half p of gate_up.w's rows */
static void map_half(const tcase *tc, const int64_t *t, int *id, int64_t *s)
{
	*id = 3;
	s[0] = t[0] + 4 * tc->p;
	s[1] = t[1];
}

/* gate_up.w[:, 1:3] */
static void map_mid(const tcase *tc, const int64_t *t, int *id, int64_t *s)
{
	(void)tc;
	*id = 3;
	s[0] = t[0];
	s[1] = t[1] + 1;
}

/* cat(q.w, k.w, v.w) along rows */
static void map_cat(const tcase *tc, const int64_t *t, int *id, int64_t *s)
{
	(void)tc;
	*id = t[0] < 4 ? 4 : t[0] < 6 ? 5 : 6;
	s[0] = t[0] < 4 ? t[0] : t[0] < 6 ? t[0] - 4 : t[0] - 6;
	s[1] = t[1];
}

/* stack.w.permute(2, 0, 1) */
static void map_perm(const tcase *tc, const int64_t *t, int *id, int64_t *s)
{
	(void)tc;
	*id = 1;
	s[0] = t[1];
	s[1] = t[2];
	s[2] = t[0];
}

/* stack.w[2][:, 1:4].T */
static void map_chain(const tcase *tc, const int64_t *t, int *id, int64_t *s)
{
	(void)tc;
	*id = 1;
	s[0] = 2;
	s[1] = t[1];
	s[2] = 1 + t[0];
}

/* stack(stack.w[3], stack.w[2], stack.w[1], stack.w[0]) */
static void map_rev(const tcase *tc, const int64_t *t, int *id, int64_t *s)
{
	(void)tc;
	*id = 1;
	s[0] = 3 - t[0];
	s[1] = t[1];
	s[2] = t[2];
}

/* vec.b[3] */
static void map_scalar(const tcase *tc, const int64_t *t, int *id, int64_t *s)
{
	(void)tc;
	(void)t;
	*id = 9;
	s[0] = 3;
}

#define F32 FLX_DT_F32
#define I32 FLX_DT_I32
static const tcase cases[] = {
    {"layers.0.w", F32, 2, {6, 5}, 0, map_layer},
    {"layers.1.w", F32, 2, {6, 5}, 1, map_layer},
    {"layers.2.w", F32, 2, {6, 5}, 2, map_layer},
    {"layers.3.w", F32, 2, {6, 5}, 3, map_layer},
    {"renamed.qkv", F32, 2, {16, 3}, 2, map_same},
    {"attn.q", F32, 2, {8, 3}, 0, map_qkv},
    {"attn.k", F32, 2, {4, 3}, 1, map_qkv},
    {"attn.v", F32, 2, {4, 3}, 2, map_qkv},
    {"mlp.gate", I32, 2, {4, 3}, 0, map_half},
    {"mlp.up", I32, 2, {4, 3}, 1, map_half},
    {"fused.w", I32, 2, {8, 3}, 0, map_cat},
    {"stack.t", F32, 3, {5, 4, 6}, 0, map_perm},
    {"chain.w", FLX_DT_F64, 2, {3, 6}, 0, map_chain},
    {"noisy.bf16", FLX_DT_BF16, 2, {3, 7}, 7, map_same},
    {"q.f32", F32, 2, {4, 3}, 4, map_same},
    {"restack.w", F32, 3, {4, 6, 5}, 0, map_rev},
    {"vec.3", F32, 0, {0}, 0, map_scalar},
    {"gate_up.mid", I32, 2, {8, 2}, 0, map_mid},
    {"plain.b", I32, 1, {5}, 8, map_same},
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

static const tcase *find_case(const char *name)
{
	for (size_t k = 0; k < NCASES; k++)
		if (strcmp(cases[k].name, name) == 0)
			return &cases[k];
	return NULL;
}

/* The list behind cases[] (and the order the index must have). */
static flx_xform *build_list(void)
{
	static const int perm[3] = {2, 0, 1}, swap[2] = {1, 0};
	flx_xform *x = NULL;
	char name[32];

	CHECK_EQ(flx_xform_new("aoa.txt", &x), 0);
	for (int l = 0; l < 4; l++) { /* Megatron's stacked layers */
		snprintf(name, sizeof(name), "layers.%d.w", l);
		CHECK_EQ(flx_xform_target(x, name, -1, NULL), 0);
		CHECK_EQ(flx_xform_piece(x, "stack.w", NULL), 0);
		CHECK_EQ(flx_xform_unstack(x, 0, l, NULL), 0);
	}
	CHECK_EQ(flx_xform_rename(x, "qkv.w", "renamed.qkv", NULL), 0);
	/* GQA: q, k and v are slices of every group, concatenated */
	for (int p = 0; p < 3; p++) {
		static const char *const names[] = {"attn.q", "attn.k",
						    "attn.v"};

		CHECK_EQ(flx_xform_target(x, names[p], 0, NULL), 0);
		for (int g = 0; g < 2; g++) {
			CHECK_EQ(flx_xform_piece(x, "qkv.w", NULL), 0);
			CHECK_EQ(flx_xform_slice(x, 0,
						 8 * g + (p ? 2 + 2 * p : 0),
						 p ? 2 : 4, NULL),
				 0);
		}
	}
	CHECK_EQ(flx_xform_target(x, "mlp.gate", -1, NULL), 0);
	CHECK_EQ(flx_xform_piece(x, "gate_up.w", NULL), 0);
	CHECK_EQ(flx_xform_split(x, 0, 2, 0, NULL), 0);
	CHECK_EQ(flx_xform_target(x, "mlp.up", -1, NULL), 0);
	CHECK_EQ(flx_xform_piece(x, "gate_up.w", NULL), 0);
	CHECK_EQ(flx_xform_split(x, 0, 2, 1, NULL), 0);
	CHECK_EQ(flx_xform_target(x, "fused.w", 0, NULL), 0);
	CHECK_EQ(flx_xform_piece(x, "q.w", NULL), 0);
	CHECK_EQ(flx_xform_piece(x, "k.w", NULL), 0);
	CHECK_EQ(flx_xform_piece(x, "v.w", NULL), 0);
	CHECK_EQ(flx_xform_target(x, "stack.t", -1, NULL), 0);
	CHECK_EQ(flx_xform_piece(x, "stack.w", NULL), 0);
	CHECK_EQ(flx_xform_transpose(x, 3, perm, NULL), 0);
	/* a chain: unstack, slice, transpose, cast */
	CHECK_EQ(flx_xform_target(x, "chain.w", -1, NULL), 0);
	CHECK_EQ(flx_xform_piece(x, "stack.w", NULL), 0);
	CHECK_EQ(flx_xform_unstack(x, 0, 2, NULL), 0);
	CHECK_EQ(flx_xform_slice(x, 1, 1, 3, NULL), 0);
	CHECK_EQ(flx_xform_transpose(x, 2, swap, NULL), 0);
	CHECK_EQ(flx_xform_cast(x, FLX_DT_F64, NULL), 0);
	CHECK_EQ(flx_xform_target(x, "noisy.bf16", -1, NULL), 0);
	CHECK_EQ(flx_xform_piece(x, "noisy.w", NULL), 0);
	CHECK_EQ(flx_xform_cast(x, FLX_DT_BF16, NULL), 0);
	CHECK_EQ(flx_xform_target(x, "q.f32", -1, NULL), 0);
	CHECK_EQ(flx_xform_piece(x, "q.w", NULL), 0);
	CHECK_EQ(flx_xform_cast(x, FLX_DT_F32, NULL), 0);
	/* stacked again, in reverse: unsqueeze and concatenate */
	CHECK_EQ(flx_xform_target(x, "restack.w", 0, NULL), 0);
	for (int l = 3; l >= 0; l--) {
		CHECK_EQ(flx_xform_piece(x, "stack.w", NULL), 0);
		CHECK_EQ(flx_xform_unstack(x, 0, l, NULL), 0);
		CHECK_EQ(flx_xform_unsqueeze(x, 0, NULL), 0);
	}
	CHECK_EQ(flx_xform_target(x, "vec.3", -1, NULL), 0);
	CHECK_EQ(flx_xform_piece(x, "vec.b", NULL), 0);
	CHECK_EQ(flx_xform_unstack(x, 0, 3, NULL), 0);
	CHECK_EQ(flx_xform_target(x, "gate_up.mid", -1, NULL), 0);
	CHECK_EQ(flx_xform_piece(x, "gate_up.w", NULL), 0);
	CHECK_EQ(flx_xform_slice(x, 1, 1, 2, NULL), 0);
	CHECK_EQ(flx_xform_ntargets(x), NCASES - 1);
	return x;
}

/* In source order, each consumed source replaced by the targets whose
 * first piece reads it; plain.b, which no piece reads, in its place. */
static const char *const index_order[] = {
    "layers.0.w", "layers.1.w", "layers.2.w",  "layers.3.w",  "stack.t",
    "chain.w",	  "restack.w",	"renamed.qkv", "attn.q",      "attn.k",
    "attn.v",	  "mlp.gate",	"mlp.up",      "gate_up.mid", "fused.w",
    "q.f32",	  "noisy.bf16", "plain.b",     "vec.3",
};

/* ---- reading targets ---- */

static size_t boxes_read;

/* Every byte of box b of target t, read whole and in ranges that start
 * and end inside elements, against the oracle. */
static void check_box(const flx_ckpt *c, const flx_tensor *t, const tcase *tc,
		      const flx_box *b)
{
	size_t len;
	unsigned char *want = expect_box(tc, b, &len), *got;
	flx_view *v = NULL;
	flx_range r[4];

	CHECK_EQ(flx_view_new(c, t, b, &v, NULL), 0);
	if (!v) {
		free(want);
		return;
	}
	boxes_read++;
	got = malloc(len + 16);
	CHECK_EQ(flx_view_bytes(v), len);
	CHECK_EQ(flx_view_read(v, got, len + 16, 0, NULL), (ssize_t)len);
	if (memcmp(got, want, len) != 0) {
		fprintf(stderr,
			"%s: box off %lld,%lld size %lld,%lld differs\n",
			tc->name, (long long)b->off[0], (long long)b->off[1],
			(long long)b->size[0], (long long)b->size[1]);
		check_failures++;
	}
	for (size_t s = 0; s < len; s += 3) {
		static const size_t lens[] = {1, 2, 5, 11, 64};

		for (size_t k = 0; k < 5; k++) {
			size_t n = len - s < lens[k] ? len - s : lens[k];

			memset(got, 0xAB, n);
			CHECK_EQ(flx_view_read(v, got, lens[k], s, NULL),
				 (ssize_t)n);
			if (memcmp(got, want + s, n) != 0) {
				fprintf(stderr, "%s: bytes %zu+%zu differ\n",
					tc->name, s, n);
				check_failures++;
				s = len;
				break;
			}
		}
	}
	/* a cast's bytes are converted, never spliced from the file */
	if (t->stored && len) {
		size_t nr = 99;

		CHECK_EQ(flx_view_ranges(v, 0, len, r, 4, &nr), 0);
		CHECK_EQ(nr, 0);
	}
	free(got);
	free(want);
	flx_view_free(v);
}

/* The whole tensor, every torch.chunk split along every axis at tp 2..4,
 * and boxes of every corner. */
static void check_target(const flx_ckpt *c, const tcase *tc)
{
	const flx_tensor *t = flx_ckpt_find(c, tc->name);
	flx_box b;

	CHECK(t != NULL);
	if (!t)
		return;
	CHECK_EQ(t->dtype, tc->dtype);
	CHECK_EQ(t->ndim, tc->ndim);
	for (int d = 0; d < tc->ndim; d++)
		CHECK_EQ(t->shape[d], tc->shape[d]);
	for (int d = 0; d < t->ndim; d++) {
		b.off[d] = 0;
		b.size[d] = t->shape[d];
	}
	check_box(c, t, tc, &b);
	for (int axis = 0; axis < t->ndim; axis++)
		for (int tp = 2; tp <= 4; tp++) {
			int64_t n = t->shape[axis], ch = (n + tp - 1) / tp;

			for (int r = 0; r < tp; r++) {
				flx_box rb = b;

				rb.off[axis] = r * ch < n ? r * ch : n;
				rb.size[axis] = rb.off[axis] + ch < n
						    ? ch
						    : n - rb.off[axis];
				check_box(c, t, tc, &rb);
			}
		}
	for (int k = 0; k < (1 << t->ndim); k++) {
		flx_box cb;

		for (int d = 0; d < t->ndim; d++) {
			int64_t half = t->shape[d] / 2;

			cb.off[d] = (k >> d) & 1 ? half : 0;
			cb.size[d] = (k >> d) & 1 ? t->shape[d] - half
						  : half + (t->shape[d] > 2);
		}
		check_box(c, t, tc, &cb);
	}
}

static void test_targets(const flx_ckpt *src)
{
	flx_xform *x = build_list();
	flx_xindex *xi = NULL;
	flx_error err;
	const flx_ckpt *c;

	flx_error_init(&err);
	CHECK_EQ(flx_xform_apply(x, src, &xi, &err), 0);
	if (!xi) {
		char line[800];

		fprintf(stderr, "%s\n",
			flx_error_line(&err, line, sizeof(line)));
		flx_xform_free(x);
		return;
	}
	c = flx_xindex_ckpt(xi);
	CHECK(c != src);
	CHECK_EQ(c->ntensors, NCASES);
	for (size_t i = 0; i < c->ntensors && i < NCASES; i++)
		CHECK_STR(c->tensors[i].fqn, index_order[i]);
	/* sources some piece reads are gone; files and objects shared */
	CHECK(flx_ckpt_find(c, "stack.w") == NULL);
	CHECK(flx_ckpt_find(c, "qkv.w") == NULL);
	CHECK(c->files == src->files && c->objects == src->objects);
	/* a tensor passed through is the source's, chunks and all */
	CHECK(flx_ckpt_find(c, "plain.b")->chunks ==
	      flx_ckpt_find(src, "plain.b")->chunks);
	/* a cast records what its chunks hold; the others record nothing */
	CHECK_EQ(flx_ckpt_find(c, "chain.w")->stored, FLX_DT_F32);
	CHECK_EQ(flx_ckpt_find(c, "q.f32")->stored, FLX_DT_I32);
	CHECK_EQ(flx_ckpt_find(c, "attn.q")->stored, FLX_DT_INVALID);
	for (size_t i = 0; i < NCASES; i++)
		check_target(c, &cases[i]);
	CHECK(boxes_read > 300);
	flx_xindex_free(xi);
	flx_xform_free(x);
}

/* No list, or an empty one: the source index itself. */
static void test_identity(const flx_ckpt *src)
{
	flx_xform *x = NULL;
	flx_xindex *xi = NULL;

	CHECK_EQ(flx_xform_apply(NULL, src, &xi, NULL), 0);
	CHECK(xi && flx_xindex_ckpt(xi) == src);
	flx_xindex_free(xi);
	CHECK_EQ(flx_xform_new(NULL, &x), 0);
	CHECK_EQ(flx_xform_apply(x, src, &xi, NULL), 0);
	CHECK(xi && flx_xindex_ckpt(xi) == src);
	flx_xindex_free(xi);
	flx_xform_free(x);
}

/* The transformed index planned like a source's: Megatron's stacked
 * layers unstacked, placed on pp=2 stages by the default layer regex and
 * split at tp=2 along the axis the chunks were saved split on. */
static void test_plan(const flx_ckpt *src)
{
	flx_xform *x = NULL;
	flx_xindex *xi = NULL;
	flx_plan *p = NULL;
	flx_spec s;
	char name[32];
	const flx_ckpt *c;

	CHECK_EQ(flx_xform_new(NULL, &x), 0);
	for (int l = 0; l < 4; l++) {
		snprintf(name, sizeof(name), "layers.%d.w", l);
		CHECK_EQ(flx_xform_target(x, name, -1, NULL), 0);
		CHECK_EQ(flx_xform_piece(x, "stack.w", NULL), 0);
		CHECK_EQ(flx_xform_unstack(x, 0, l, NULL), 0);
	}
	CHECK_EQ(flx_xform_apply(x, src, &xi, NULL), 0);
	c = flx_xindex_ckpt(xi);
	CHECK_EQ(flx_spec_init(&s), 0);
	s.tp = 2;
	s.pp = 2;
	s.pp_renumber = true;
	CHECK_EQ(flx_plan_build(c, &s, &p, NULL), 0);
	CHECK(p != NULL);
	for (size_t i = 0; p && i < p->n; i++) {
		const flx_placement *pl = &p->p[i];
		const tcase *tc = find_case(pl->src->fqn);

		if (!tc || tc->map != map_layer)
			continue;
		CHECK_EQ(pl->layer, tc->p);
		CHECK_EQ(pl->stage_lo, tc->p / 2);
		CHECK_EQ(pl->split, 0);
		snprintf(name, sizeof(name), "layers.%d.w", tc->p % 2);
		CHECK_STR(flx_placement_name(pl, pl->stage_lo), name);
		for (int r = 0; r < 2; r++) {
			const flx_box *b = flx_view_box(pl->views[r]);
			size_t len;
			unsigned char *want = expect_box(tc, b, &len);
			unsigned char *got = malloc(len);

			CHECK_EQ(b->off[0], 3 * r);
			CHECK_EQ(b->size[0], 3);
			CHECK_EQ(flx_view_read(pl->views[r], got, len, 0, NULL),
				 (ssize_t)len);
			CHECK(memcmp(got, want, len) == 0);
			free(got);
			free(want);
		}
	}
	CHECK_EQ(p ? p->nlayers : 0, 4);
	flx_plan_free(p);
	flx_spec_release(&s);
	flx_xindex_free(xi);
	flx_xform_free(x);
}

/* The tree of a transformed index: each rank's .npy of a target holds
 * the target's dtype in its header and the rank's box in its data. */
static void test_mount(const flx_ckpt *src)
{
	static const char *const names[] = {"layers.1.w", "chain.w",
					    "noisy.bf16", "q.f32"};
	static const int swap[2] = {1, 0};
	flx_xform *x = NULL;
	flx_xindex *xi = NULL;
	flx_plan *p = NULL;
	flx_fs *fs = NULL;
	flx_spec s;

	CHECK_EQ(flx_xform_new(NULL, &x), 0);
	flx_xform_target(x, "layers.1.w", -1, NULL);
	flx_xform_piece(x, "stack.w", NULL);
	flx_xform_unstack(x, 0, 1, NULL);
	flx_xform_target(x, "chain.w", -1, NULL);
	flx_xform_piece(x, "stack.w", NULL);
	flx_xform_unstack(x, 0, 2, NULL);
	flx_xform_slice(x, 1, 1, 3, NULL);
	flx_xform_transpose(x, 2, swap, NULL);
	flx_xform_cast(x, FLX_DT_F64, NULL);
	flx_xform_target(x, "noisy.bf16", -1, NULL);
	flx_xform_piece(x, "noisy.w", NULL);
	flx_xform_cast(x, FLX_DT_BF16, NULL);
	flx_xform_target(x, "q.f32", -1, NULL);
	flx_xform_piece(x, "q.w", NULL);
	flx_xform_cast(x, FLX_DT_F32, NULL);
	CHECK_EQ(flx_xform_apply(x, src, &xi, NULL), 0);
	CHECK_EQ(flx_spec_init(&s), 0);
	s.tp = 2;
	CHECK_EQ(flx_plan_build(flx_xindex_ckpt(xi), &s, &p, NULL), 0);
	if (p)
		CHECK_EQ(flx_fs_build(flx_xindex_ckpt(xi), p, &fs, NULL), 0);
	for (size_t i = 0; fs && i < 4; i++) {
		const tcase *tc = find_case(names[i]);
		const flx_placement *pl = NULL;

		for (size_t k = 0; k < p->n; k++)
			if (strcmp(p->p[k].src->fqn, names[i]) == 0)
				pl = &p->p[k];
		CHECK(pl != NULL);
		if (!pl)
			continue;
		for (int r = 0; r < 2; r++) {
			const flx_view *v = pl->views[r];
			uint64_t bytes = flx_view_bytes(v);
			size_t len;
			unsigned char *want =
			    expect_box(tc, flx_view_box(v), &len);
			char path[128], descr[32];
			unsigned char *got;
			flx_stat st;

			snprintf(path, sizeof(path),
				 "ranks/tp%02d_pp00/tensors/%s.npy", r,
				 tc->name);
			CHECK_EQ(flx_fs_resolve(fs, path, &st), 0);
			CHECK_EQ(bytes, len);
			CHECK(st.size > bytes);
			got = malloc(st.size + 1);
			CHECK_EQ(flx_fs_read(fs, st.ino, got, st.size, 0, NULL),
				 (ssize_t)st.size);
			got[st.size] = 0;
			snprintf(descr, sizeof(descr), "'descr': '%s'",
				 flx_dtype_get(tc->dtype)->npy);
			CHECK(strstr((char *)got + 10, descr) != NULL);
			CHECK(memcmp(got + st.size - bytes, want, len) == 0);
			free(got);
			free(want);
		}
	}
	flx_fs_free(fs);
	flx_plan_free(p);
	flx_spec_release(&s);
	flx_xindex_free(xi);
	flx_xform_free(x);
}

/* A source still loading: the index is built from boxes, and its chunks
 * take their storage when flx_xindex_finish() runs after the items. */
static void test_finish(flx_ckpt *src)
{
	flx_tensor *t = (flx_tensor *)flx_ckpt_find(src, "stack.w");
	flx_chunk saved[4];
	int64_t strides[4][3];
	flx_xform *x = NULL;
	flx_xindex *xi = NULL;
	const flx_tensor *l1;

	for (uint32_t i = 0; i < t->nchunks; i++) {
		saved[i] = t->chunks[i];
		memcpy(strides[i], t->chunks[i].stride, sizeof(strides[i]));
		memset(t->chunks[i].stride, 0, sizeof(strides[i]));
		t->chunks[i].data_off = 0;
		t->chunks[i].storage_offset = 0;
		t->chunks[i].contig_from = 0;
	}
	/* never dereferenced by what the test calls while it is set */
	src->loading = (struct flx_item_load *)saved;
	CHECK_EQ(flx_xform_new(NULL, &x), 0);
	CHECK_EQ(flx_xform_target(x, "layers.1.w", -1, NULL), 0);
	CHECK_EQ(flx_xform_piece(x, "stack.w", NULL), 0);
	CHECK_EQ(flx_xform_unstack(x, 0, 1, NULL), 0);
	CHECK_EQ(flx_xform_apply(x, src, &xi, NULL), 0);
	l1 = flx_ckpt_find(flx_xindex_ckpt(xi), "layers.1.w");
	CHECK(l1 && l1->chunks[0].stride[1] == 0); /* not known yet */
	for (uint32_t i = 0; i < t->nchunks; i++) {
		t->chunks[i] = saved[i];
		memcpy(t->chunks[i].stride, strides[i], sizeof(strides[i]));
	}
	src->loading = NULL;
	flx_xindex_finish(xi);
	if (l1)
		check_target(flx_xindex_ckpt(xi), &cases[1]);
	flx_xindex_free(xi);
	flx_xform_free(x);
}

/* ---- errors ---- */

static flx_xform *newx(void)
{
	flx_xform *x = NULL;

	CHECK_EQ(flx_xform_new("aoa.txt", &x), 0);
	return x;
}

/* x (freed) fails to apply to c with exactly the line want. */
static void apply_fails(const flx_ckpt *c, flx_xform *x, const char *want)
{
	flx_xindex *xi = NULL;
	flx_error err;
	char line[800];

	flx_error_init(&err);
	CHECK(flx_xform_apply(x, c, &xi, &err) < 0);
	CHECK(xi == NULL);
	CHECK_STR(flx_error_line(&err, line, sizeof(line)), want);
	flx_xform_free(x);
}

/* A one-piece target "t" of source src; the steps follow. */
static flx_xform *one(const char *src)
{
	flx_xform *x = newx();

	CHECK_EQ(flx_xform_target(x, "t", -1, NULL), 0);
	CHECK_EQ(flx_xform_piece(x, src, NULL), 0);
	return x;
}

static void test_errors(const flx_ckpt *c)
{
	static const int perm3[3] = {0, 1, 1}, perm2[2] = {1, 0};
	flx_xform *x;
	flx_error err;
	char line[800];

	apply_fails(c, one("nope"),
		    "aoa.txt: t: piece 1: no source tensor "
		    "'nope'");
	x = one("stack.w");
	flx_xform_slice(x, 3, 0, 1, NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 1, step 1 (slice): axis 3 but "
		    "the tensor has 3 dimension(s)");
	x = one("stack.w");
	flx_xform_unstack(x, 0, 0, NULL);
	flx_xform_slice(x, 1, 2, 4, NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 1, step 2 (slice): [2, +4) "
		    "outside axis 1 of extent 5");
	x = one("stack.w");
	flx_xform_split(x, 2, 2, 0, NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 1, step 1 (split): axis 2 of "
		    "extent 5 does not split into 2 equal parts");
	x = one("stack.w");
	flx_xform_unstack(x, 0, 4, NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 1, step 1 (unstack): index 4 "
		    "outside axis 0 of extent 4");
	x = one("stack.w");
	flx_xform_transpose(x, 2, perm2, NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 1, step 1 (transpose): 2 axes "
		    "for a tensor of 3 dimension(s)");
	x = one("stack.w");
	flx_xform_transpose(x, 3, perm3, NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 1, step 1 (transpose): not a "
		    "permutation of the axes (axis 1 at position 2)");
	x = one("stack.w");
	flx_xform_cast(x, FLX_DT_I32, NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 1, step 1 (cast): no conversion "
		    "from float32 to int32");
	x = one("stack.w");
	flx_xform_cast(x, FLX_DT_BF16, NULL);
	flx_xform_cast(x, FLX_DT_F32, NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 1, step 2 (cast): bfloat16 to "
		    "float32 after float32 to bfloat16 would round "
		    "twice");
	x = one("vec.b");
	flx_xform_unsqueeze(x, 2, NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 1, step 1 (unsqueeze): axis 2 of "
		    "a tensor of 1 dimension(s)");
	/* concatenation */
	x = one("q.w");
	flx_xform_piece(x, "k.w", NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 2: several pieces and no "
		    "concatenation axis");
	x = newx();
	flx_xform_target(x, "t", 0, NULL);
	flx_xform_piece(x, "q.w", NULL);
	flx_xform_piece(x, "qkv.w", NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 2: dtype float32 (stored as "
		    "float32), piece 1: int32 (stored as int32)");
	x = newx();
	flx_xform_target(x, "t", 0, NULL);
	flx_xform_piece(x, "q.w", NULL);
	flx_xform_piece(x, "q.w", NULL);
	flx_xform_cast(x, FLX_DT_F32, NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 2: dtype float32 (stored as "
		    "int32), piece 1: int32 (stored as int32)");
	x = newx();
	flx_xform_target(x, "t", 1, NULL);
	flx_xform_piece(x, "q.w", NULL);
	flx_xform_piece(x, "k.w", NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 2: extent 2 of axis 0, piece 1: "
		    "4 (concatenated along axis 1)");
	x = newx();
	flx_xform_target(x, "t", 0, NULL);
	flx_xform_piece(x, "q.w", NULL);
	flx_xform_piece(x, "plain.b", NULL);
	apply_fails(c, x, "aoa.txt: t: piece 2: 1 dimension(s), piece 1: 2");
	x = newx();
	flx_xform_target(x, "t", 2, NULL);
	flx_xform_piece(x, "q.w", NULL);
	apply_fails(c, x,
		    "aoa.txt: t: piece 1: concatenation axis 2 but the "
		    "tensor has 2 dimension(s)");
	x = newx();
	flx_xform_target(x, "t", -1, NULL);
	apply_fails(c, x, "aoa.txt: t: no piece");
	/* names */
	x = newx();
	flx_xform_rename(x, "q.w", "t", NULL);
	flx_xform_rename(x, "k.w", "u", NULL);
	flx_xform_rename(x, "v.w", "t", NULL);
	apply_fails(c, x, "aoa.txt: t: targets 1 and 3 have this name");
	x = newx();
	flx_xform_rename(x, "q.w", "plain.b", NULL);
	apply_fails(c, x,
		    "aoa.txt: plain.b: target name is also a source "
		    "tensor's, which no piece reads");
	x = newx();
	flx_xform_rename(x, "q.w", "extra_state", NULL);
	apply_fails(c, x,
		    "aoa.txt: extra_state: target name is also a "
		    "non-tensor item's");
	/* a target may take the name of the source it consumes */
	x = newx();
	flx_xform_target(x, "q.w", -1, NULL);
	flx_xform_piece(x, "q.w", NULL);
	flx_xform_cast(x, FLX_DT_F64, NULL);
	{
		flx_xindex *xi = NULL;

		CHECK_EQ(flx_xform_apply(x, c, &xi, NULL), 0);
		CHECK(xi && flx_ckpt_find(flx_xindex_ckpt(xi), "q.w")->dtype ==
				FLX_DT_F64);
		flx_xindex_free(xi);
	}
	flx_xform_free(x);
	/* the builder's own checks */
	x = newx();
	flx_error_init(&err);
	CHECK_EQ(flx_xform_piece(x, "q.w", &err), -EINVAL);
	CHECK_STR(flx_error_line(&err, line, sizeof(line)),
		  "aoa.txt: q.w: piece before any target");
	flx_error_init(&err);
	CHECK_EQ(flx_xform_target(x, "", -1, &err), -EINVAL);
	CHECK_STR(flx_error_line(&err, line, sizeof(line)),
		  "aoa.txt: target with an empty name");
	CHECK_EQ(flx_xform_target(x, "t", -1, NULL), 0);
	flx_error_init(&err);
	CHECK_EQ(flx_xform_slice(x, 0, 0, 1, &err), -EINVAL);
	CHECK_STR(flx_error_line(&err, line, sizeof(line)),
		  "aoa.txt: t: slice before any piece");
	CHECK_EQ(flx_xform_piece(x, "q.w", NULL), 0);
	flx_error_init(&err);
	CHECK_EQ(flx_xform_slice(x, 0, -1, 1, &err), -EINVAL);
	CHECK_STR(flx_error_line(&err, line, sizeof(line)),
		  "aoa.txt: t: slice with a negative index or length");
	flx_error_init(&err);
	CHECK_EQ(flx_xform_split(x, 0, 2, 2, &err), -EINVAL);
	CHECK_STR(flx_error_line(&err, line, sizeof(line)),
		  "aoa.txt: t: split into part 2 of 2");
	flx_error_init(&err);
	CHECK_EQ(flx_xform_unstack(x, FLX_MAX_DIMS, 0, &err), -EINVAL);
	CHECK_STR(flx_error_line(&err, line, sizeof(line)),
		  "aoa.txt: t: unstack of axis 16");
	flx_error_init(&err);
	CHECK_EQ(flx_xform_cast(x, FLX_DT_INVALID, &err), -EINVAL);
	CHECK_STR(flx_error_line(&err, line, sizeof(line)),
		  "aoa.txt: t: cast to an invalid dtype");
	/* a step goes to the current target's piece, not an earlier one */
	CHECK_EQ(flx_xform_target(x, "u", -1, NULL), 0);
	flx_error_init(&err);
	CHECK_EQ(flx_xform_cast(x, FLX_DT_F64, &err), -EINVAL);
	CHECK_STR(flx_error_line(&err, line, sizeof(line)),
		  "aoa.txt: u: cast before any piece");
	flx_xform_free(x);
}

static void remove_files(const char *dir)
{
	char path[512];

	for (int f = 0; f < 2; f++) {
		snprintf(path, sizeof(path), "%s/f%d", dir, f);
		unlink(path);
	}
}

int main(void)
{
	char dir[] = "/tmp/flx_test_transform_XXXXXX";
	flx_ckpt *c;

	test_cast_vectors();
	test_cast_exact();
	test_cast_read();
	CHECK(mkdtemp(dir) != NULL);
	c = make_ckpt(dir);
	/* the source itself reads back the formula */
	for (int i = 0; i < NTENSORS; i++) {
		tcase tc = {tensors[i].name, tensors[i].dtype,
			    tensors[i].ndim, {0},
			    tensors[i].id,   map_same};

		memcpy(tc.shape, tensors[i].shape, sizeof(tc.shape));
		check_target(c, &tc);
	}
	test_identity(c);
	test_targets(c);
	test_plan(c);
	test_mount(c);
	test_finish(c);
	test_errors(c);
	remove_files(dir);
	flx_ckpt_close(c);
	rmdir(dir);
	return CHECK_RESULT();
}
