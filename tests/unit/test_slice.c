/* SPDX-License-Identifier: MIT */
/*
 * The slicer against naive oracles.
 *
 * The host copy (slice_internal.h) against one element at a time through
 * an odometer over the slice's index space: random shapes and strides in
 * up to 4 dimensions, element sizes of every dtype and an odd one, and
 * the transposes the strided gathers send (2-D, the source dense along
 * the outer axis), whose tiled path must give the same bytes at every
 * size, multiples of the tile or not.  Bytes outside the destination slice
 * stay untouched.
 *
 * Every backend's batches (slice.h) against one byte at a time straight
 * from the files: random batches of runs over random files and block
 * sizes, the rows of transposes off the tile grid cut at any byte, 6
 * element sizes; each listed block fetched once, one pinned at a time,
 * exactly its len bytes readable (each get hands out a fresh allocation of
 * that size, for ASan); bytes outside the runs untouched.  Backends: the
 * CPU one, flx_slicer_default(), and test backends that decline small
 * batches, that answer -EAGAIN after scribbling on the runs (both must
 * fall back to the CPU) and that fail (the error must come back).  Then
 * the errors: invalid batches, an element past its block's bytes, a block
 * missing from the list, a failing get.
 *
 * The CUDA backend (libflexfs-cuda.so, opened as gpu=on,gpu_min=0 would)
 * when this machine has a device, else one line says it was skipped: it
 * runs the random batches, and every random slice and transpose above
 * made a batch (one run per innermost line, any block size), against the
 * same oracles; so does the CPU backend, which checks the conversion.
 * Without a device, the CUDA backend's host half (slice_plan.h) still
 * runs everything above and the errors below: a test backend executes its
 * pieces and rows on the host, as the header defines them.
 */
#include "cast.h"
#include "check.h"
#include "slice.h"
#include "slice_internal.h"
#include "slice_plan.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Furthest byte a slice reaches with the given strides, plus one. */
static size_t extent(const flx_slice *s, int dst)
{
	size_t end = s->elem_size;

	for (int d = 0; d < s->ndim; d++)
		end += (size_t)(s->shape[d] - 1) *
		       (size_t)(dst ? s->dst_stride[d] : s->src_stride[d]);
	return end;
}

static void oracle(unsigned char *dst, const unsigned char *src,
		   const flx_slice *s)
{
	int64_t idx[FLX_SLICE_MAX_DIMS] = {0};

	for (int d = 0; d < s->ndim; d++)
		if (s->shape[d] <= 0)
			return;
	for (;;) {
		size_t doff = 0, soff = 0;
		int d;

		for (d = 0; d < s->ndim; d++) {
			doff += (size_t)(idx[d] * s->dst_stride[d]);
			soff += (size_t)(idx[d] * s->src_stride[d]);
		}
		for (size_t b = 0; b < s->elem_size; b++)
			dst[doff + b] = src[soff + b];
		for (d = s->ndim - 1; d >= 0 && ++idx[d] == s->shape[d]; d--)
			idx[d] = 0;
		if (d < 0)
			return;
	}
}

static unsigned cases, tiled_cases;

static void check_slice_batch(const flx_slice *s, const unsigned char *src,
			      size_t ns, const unsigned char *want, size_t nd,
			      uint64_t block);

static void check_slice(const flx_slice *s)
{
	size_t ns = extent(s, 0), nd = extent(s, 1);
	unsigned char *src = malloc(ns), *want = malloc(nd), *got = malloc(nd);

	for (size_t i = 0; i < ns; i++)
		src[i] = (unsigned char)(i * 131 + i / 256 + 1);
	memset(want, 0xEE, nd);
	memset(got, 0xEE, nd);
	oracle(want, src, s);
	CHECK_EQ(flx_slice_copy(got, src, s), 0);
	check_slice_batch(s, src, ns, want, nd, 64u << (cases % 3 * 3));
	if (memcmp(got, want, nd) != 0) {
		fprintf(stderr, "slice mismatch: ndim %d esz %zu shape",
			s->ndim, s->elem_size);
		for (int d = 0; d < s->ndim; d++)
			fprintf(stderr, " %lld/%lld/%lld",
				(long long)s->shape[d],
				(long long)s->dst_stride[d],
				(long long)s->src_stride[d]);
		fprintf(stderr, "\n");
		check_failures++;
	}
	cases++;
	free(src);
	free(want);
	free(got);
}

/* Rows of a transposed chunk: dst[r][c] = src[c][r], with padding. */
static void check_transpose(int64_t rows, int64_t cols, size_t esz,
			    int64_t src_row, int64_t dst_row)
{
	flx_slice s = {.ndim = 2, .elem_size = esz};

	s.shape[0] = rows;
	s.shape[1] = cols;
	s.dst_stride[0] = dst_row * (int64_t)esz;
	s.dst_stride[1] = (int64_t)esz;
	s.src_stride[0] = (int64_t)esz;
	s.src_stride[1] = src_row * (int64_t)esz;
	check_slice(&s);
	tiled_cases++;
}

/* ---- batches ---- */

#define NFILES 3
#define TAIL   16 /* bytes a block holds past its home, as the read path */

typedef struct bfile {
	unsigned char *data;
	size_t size;
} bfile;

/* A batch under test, its files and what its callbacks saw. */
typedef struct tb {
	flx_slice_batch b;
	bfile f[NFILES];
	flx_slice_run *runs;
	flx_slice_block *blocks;
	unsigned *fetched; /* per block */
	long pinned;	   /* block pinned now, or -1 */
	unsigned char *mem;
	int bad;       /* protocol violations */
	long fail_at;  /* get of this block fails (-EIO), or -1 */
	size_t nbytes; /* bytes the runs want */
} tb;

static int tb_get(void *ctx, size_t k, const unsigned char **data)
{
	tb *t = ctx;
	const flx_slice_block *b;

	if (k >= t->b.nblocks || t->pinned >= 0) {
		t->bad++;
		return -EINVAL;
	}
	if ((long)k == t->fail_at)
		return -EIO;
	b = &t->blocks[k];
	t->mem = malloc(b->len ? b->len : 1);
	memcpy(t->mem, t->f[b->file].data + b->start, b->len);
	t->fetched[k]++;
	t->pinned = (long)k;
	*data = t->mem;
	return 0;
}

static void tb_put(void *ctx, size_t k)
{
	tb *t = ctx;

	if ((long)k != t->pinned)
		t->bad++;
	free(t->mem);
	t->mem = NULL;
	t->pinned = -1;
}

static int cmp_run(const void *a, const void *b)
{
	const flx_slice_run *x = a, *y = b;

	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

static int cmp_block(const void *a, const void *b)
{
	const flx_slice_block *x = a, *y = b;

	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->start < y->start ? -1 : x->start > y->start;
}

/* The blocks of t's runs, found independently of the read path: every
 * element's block, sorted, each once. */
static void tb_blocks(tb *t)
{
	size_t n = 0, cap = 16, esz = t->b.elem_size;
	uint64_t B = t->b.block;

	t->blocks = malloc(cap * sizeof(*t->blocks));
	for (size_t i = 0; i < t->b.nruns; i++) {
		const flx_slice_run *u = &t->runs[i];
		uint64_t c = t->b.cast ? u->len / t->b.cast->to.size
				       : (u->skip + u->len + esz - 1) / esz;

		for (uint64_t e = 0; e < c; e++) {
			uint64_t start = (u->src + e * u->stride) / B * B;
			size_t sz = t->f[u->file].size;

			if (n == cap)
				t->blocks = realloc(
				    t->blocks, (cap *= 2) * sizeof(*t->blocks));
			t->blocks[n++] = (flx_slice_block){
			    start,
			    sz - start < B + TAIL ? sz - start : B + TAIL,
			    u->file};
		}
	}
	qsort(t->blocks, n, sizeof(*t->blocks), cmp_block);
	t->b.nblocks = 0;
	for (size_t i = 0; i < n; i++)
		if (!t->b.nblocks ||
		    cmp_block(&t->blocks[i], &t->blocks[t->b.nblocks - 1]))
			t->blocks[t->b.nblocks++] = t->blocks[i];
	t->b.blocks = t->blocks;
	t->fetched = calloc(t->b.nblocks + 1, sizeof(unsigned));
}

/* Room for a run of len bytes at the end of dst, after a gap. */
static size_t tb_place(tb *t, size_t len, unsigned *seed)
{
	size_t at =
	    t->b.dst_len + (rand_r(seed) % 3 == 0 ? 0 : rand_r(seed) % 9);

	t->b.dst_len = at + len;
	t->nbytes += len;
	return at;
}

static void tb_add(tb *t, flx_slice_run u)
{
	t->runs[t->b.nruns++] = u;
}

static uint64_t next_origin;

/* Random files; the runs are added by the callers, then tb_finish(). */
static void tb_init(tb *t, size_t esz, uint64_t block, unsigned *seed,
		    size_t maxruns)
{
	memset(t, 0, sizeof(*t));
	t->b.elem_size = esz;
	t->b.block = block;
	t->b.get = tb_get;
	t->b.put = tb_put;
	t->b.ctx = t;
	t->b.origin = ++next_origin; /* its files' bytes are its own */
	t->pinned = -1;
	t->fail_at = -1;
	for (int f = 0; f < NFILES; f++) {
		t->f[f].size = 1 + (size_t)(rand_r(seed) % 20000);
		if (f == 0)
			t->f[f].size += 40000; /* room for transposes */
		t->f[f].data = malloc(t->f[f].size);
		for (size_t i = 0; i < t->f[f].size; i++)
			t->f[f].data[i] = (unsigned char)rand_r(seed);
	}
	t->runs = calloc(maxruns, sizeof(*t->runs));
	t->b.runs = t->runs;
}

static void tb_finish(tb *t)
{
	qsort(t->runs, t->b.nruns, sizeof(*t->runs), cmp_run);
	t->b.dst = malloc(t->b.dst_len ? t->b.dst_len : 1);
	memset(t->b.dst, 0xEE, t->b.dst_len);
	tb_blocks(t);
}

static void tb_free(tb *t)
{
	for (int f = 0; f < NFILES; f++)
		free(t->f[f].data);
	free(t->runs);
	free(t->blocks);
	free(t->fetched);
	free(t->b.dst);
}

/* A random run over a random file: any stride (0, under the element,
 * dense, a few elements, past a block), cut at any byte. */
static void add_random_run(tb *t, unsigned *seed)
{
	size_t esz = t->b.elem_size;
	uint32_t file = (uint32_t)(rand_r(seed) % NFILES);
	size_t size = t->f[file].size;
	uint64_t stride, c, span, src, skip, len;

	switch (rand_r(seed) % 6) {
	case 0:
		stride = 0;
		break;
	case 1:
		stride = 1 + (uint64_t)(rand_r(seed) % esz);
		break;
	case 2:
		stride = esz * (1 + (uint64_t)(rand_r(seed) % 5));
		break;
	case 3:
		stride = t->b.block + (uint64_t)(rand_r(seed) % 300);
		break;
	default:
		stride = 1 + (uint64_t)(rand_r(seed) % 700);
	}
	if (size < esz)
		return;
	c = 1 + (uint64_t)(rand_r(seed) % 60);
	while (c > 1 && (c - 1) * stride + esz > size)
		c--;
	span = (c - 1) * stride + esz;
	src = (uint64_t)(rand_r(seed) % (size - span + 1));
	skip = (uint64_t)(rand_r(seed) % esz);
	if (skip >= c * esz)
		skip = 0;
	len = 1 + (uint64_t)(rand_r(seed) % (c * esz - skip));
	tb_add(t, (flx_slice_run){src, stride, skip, tb_place(t, len, seed),
				  len, file});
}

/*
 * The rows of a transpose: file 0 holds a rows_s x cols_s matrix at
 * offset base (row-major, elements esz apart, rows pitch bytes apart); the
 * target's row r is the source's column c0 + r, from row r0 on, as the
 * read path sends them: element i of run r at base + (r0 + i) * pitch +
 * (c0 + r) * esz.  The first run may start inside an element and the last
 * end inside one (a request cut at any byte).  gaps: the rows' destinations
 * step unevenly.
 */
static void add_transpose(tb *t, unsigned *seed)
{
	size_t esz = t->b.elem_size;
	uint64_t rows_s = 1 + (uint64_t)(rand_r(seed) % 70),
		 cols_s = 1 + (uint64_t)(rand_r(seed) % 70);
	uint64_t pitch = cols_s * esz + (uint64_t)(rand_r(seed) % 2) * esz;
	uint64_t base, r0, c0, nr, len_row;
	int gaps = rand_r(seed) % 3 == 0;

	if (rows_s * pitch > t->f[0].size)
		return;
	base = (uint64_t)(rand_r(seed) % (t->f[0].size - rows_s * pitch + 1));
	r0 = (uint64_t)(rand_r(seed) % rows_s);
	c0 = (uint64_t)(rand_r(seed) % cols_s);
	nr = 1 + (uint64_t)(rand_r(seed) % (cols_s - c0));
	len_row = (rows_s - r0) * esz;
	for (uint64_t r = 0; r < nr; r++) {
		uint64_t skip = 0, len = len_row;

		if (r == 0 && rand_r(seed) % 2) {
			skip = (uint64_t)(rand_r(seed) % len_row);
			len -= skip;
		}
		if (r == nr - 1 && rand_r(seed) % 2)
			len -= (uint64_t)(rand_r(seed) % len);
		/* rows back to back in dst, as in a view, or (gaps) rows
		 * whose destinations step unevenly: no 2-D slice then */
		tb_add(
		    t,
		    (flx_slice_run){
			base + r0 * pitch + (c0 + r) * esz + skip / esz * pitch,
			pitch, skip % esz,
			gaps ? tb_place(t, len, seed) : t->b.dst_len, len, 0});
		if (!gaps) {
			t->b.dst_len += len;
			t->nbytes += len;
		}
	}
}

/* What the runs of t want, one byte at a time from the files. */
static unsigned char *tb_oracle(const tb *t)
{
	unsigned char *want = malloc(t->b.dst_len ? t->b.dst_len : 1);
	size_t esz = t->b.elem_size;

	memset(want, 0xEE, t->b.dst_len);
	for (size_t i = 0; i < t->b.nruns; i++) {
		const flx_slice_run *u = &t->runs[i];
		const flx_ecast *c = t->b.cast;

		/* a cast: each element read alone, then converted (cast.c's
		 * tests check the conversion against torch's) */
		for (uint64_t e = 0; c && e < u->len / c->to.size; e++)
			flx_ecast_one(c, want + u->dst + e * c->to.size,
				      t->f[u->file].data + u->src +
					  e * u->stride);
		for (uint64_t p = u->skip; !c && p < u->skip + u->len; p++)
			want[u->dst + (p - u->skip)] =
			    t->f[u->file]
				.data[u->src + p / esz * u->stride + p % esz];
	}
	return want;
}

/* Test backends wrapping the CPU one. */
static unsigned declined, taken;

static bool big_only(const flx_slicer *self, const flx_slice_batch *b)
{
	size_t n = 0;

	(void)self;
	for (size_t i = 0; i < b->nruns; i++)
		n += b->runs[i].len;
	return n >= 2000;
}

static int counting_run(const flx_slicer *self, const flx_slice_batch *b)
{
	const flx_slicer *cpu = flx_slicer_cpu();

	(void)self;
	taken++;
	return cpu->run(cpu, b);
}

static int busy_run(const flx_slicer *self, const flx_slice_batch *b)
{
	(void)self;
	for (size_t i = 0; i < b->nruns; i++)
		memset(b->dst + b->runs[i].dst, 0x5A, b->runs[i].len);
	return -EAGAIN;
}

static int failing_run(const flx_slicer *self, const flx_slice_batch *b)
{
	(void)self;
	(void)b;
	return -EIO;
}

/* The CUDA backend's plan (slice_plan.h) executed on the host: block by
 * block, the pieces and rows into a scratch copy of dst, then the runs'
 * bytes copied out, as slice_cuda.cu does on the device. */
static int plan_run(const flx_slicer *self, const flx_slice_batch *b)
{
	const flx_ecast *c = b->cast;
	size_t esz = c ? c->to.size : b->elem_size, cap = 0;
	flx_piece *pc = NULL;
	flx_rows *rw = NULL;
	unsigned char *scratch = NULL;
	flx_plan p;
	int rc;

	(void)self;
	memset(&p, 0, sizeof(p));
	rc = flx_slice_batch_check(b);
	if (!rc)
		rc = flx_plan_cut(b, &p);
	for (size_t k = 0; !rc && k < b->nblocks; k++)
		if (p.first[k + 1] - p.first[k] > cap)
			cap = p.first[k + 1] - p.first[k];
	if (!rc) {
		pc = malloc((cap + 1) * sizeof(*pc));
		rw = malloc((cap + 1) * sizeof(*rw));
		scratch = malloc(b->dst_len + 1);
	}
	for (size_t k = 0; !rc && k < b->nblocks; k++) {
		size_t first = p.first[k], n = p.first[k + 1] - first, npc, nrw;
		const unsigned char *blk;

		if (!n)
			continue;
		rc = b->get(b->ctx, k, &blk);
		if (rc)
			break;
		flx_plan_rows(p.pc + first, n, esz, pc, &npc, rw, &nrw);
		for (size_t j = 0; c && j < npc; j++)
			for (uint64_t i = 0; i < pc[j].n; i++)
				flx_ecast_one(
				    c,
				    scratch + pc[j].dbase + (int64_t)(i * esz),
				    blk + pc[j].soff + i * pc[j].stride);
		for (size_t j = 0; !c && j < npc; j++)
			for (uint64_t i = 0; i < pc[j].n; i++)
				for (size_t x = 0; x < esz; x++) {
					uint64_t q = i * esz + x;

					if (q >= pc[j].lo && q < pc[j].hi)
						scratch[pc[j].dbase +
							(int64_t)q] =
						    blk[pc[j].soff +
							i * pc[j].stride + x];
				}
		for (size_t j = 0; j < nrw; j++)
			for (uint64_t r = 0; r < rw[j].nrows; r++)
				for (uint64_t i = 0; i < rw[j].n; i++) {
					unsigned char *d =
					    scratch + rw[j].dbase +
					    r * rw[j].d + i * esz;
					const unsigned char *sp =
					    blk + rw[j].soff + r * rw[j].a +
					    i * rw[j].stride;

					if (c)
						flx_ecast_one(c, d, sp);
					else
						memcpy(d, sp, esz);
				}
		b->put(b->ctx, k);
	}
	if (!rc)
		flx_plan_copy_runs(b, scratch);
	flx_slice_plan_free(&p);
	free(pc);
	free(rw);
	free(scratch);
	return rc;
}

/*
 * The plan emulator is an entry of a backend table (slice.h,
 * flx_slicer_backend), opened through flx_slicer_open_from() like the
 * CUDA backend is from the built-in one; an entry without a device
 * before it.
 */
static unsigned plan_opens, plan_starts, plan_closes;
static const flx_slicer_backend plan_backend;
static const flx_slicer plan_emu = {"cuda plan on the host", NULL, plan_run,
				    true, &plan_backend};

static int plan_open(const flx_slicer_backend *be, const flx_slicer_opts *o,
		     const flx_slicer **out, char *why, size_t n)
{
	(void)be;
	plan_opens++;
	snprintf(why, n, "the host (device %d)", o->device);
	*out = &plan_emu;
	return 0;
}

static void plan_start(const flx_slicer *s)
{
	CHECK(s == &plan_emu);
	plan_starts++;
}

static void plan_close(const flx_slicer *s)
{
	CHECK(s == &plan_emu);
	plan_closes++;
}

static int nodev_open(const flx_slicer_backend *be, const flx_slicer_opts *o,
		      const flx_slicer **out, char *why, size_t n)
{
	(void)be;
	(void)o;
	(void)out;
	snprintf(why, n, "no test device");
	return -ENODEV;
}

static const flx_slicer_backend plan_backend = {"plan", "host", plan_open,
						plan_start, plan_close};
static const flx_slicer_backend nodev_backend = {"nodev", "TEST", nodev_open,
						 NULL, NULL};

static const flx_slicer declining = {"declining", big_only, counting_run, true,
				     NULL};
static const flx_slicer busy = {"busy", NULL, busy_run, true, NULL};
static const flx_slicer failing = {"failing", NULL, failing_run, true, NULL};

/* flx_slicer_open_from(): the first entry that opens, the CPU one after
 * them, gpu=off opening none, gpu=on failing with the first's reason. */
static void test_backend_table(void)
{
	static const flx_slicer_backend
	    *const plan_only[] = {&plan_backend, NULL},
		   *const nodev_first[] = {&nodev_backend, &plan_backend, NULL},
		   *const nodev_only[] = {&nodev_backend, NULL},
		   *const empty[] = {NULL};
	flx_slicer_opts o = {FLX_GPU_AUTO, 4096, 3, NULL, 0};
	const flx_slicer *s = NULL;
	char line[256];

	CHECK_EQ(flx_slicer_open_from(plan_only, &o, &s, line, sizeof(line)),
		 0);
	CHECK(s == &plan_emu && plan_opens == 1);
	CHECK(!strcmp(line, "slicer: plan on the host (device 3) for strided "
			    "gathers and casts of 4096 bytes or more, cpu "
			    "below"));
	flx_slicer_start(s);
	flx_slicer_close(s);
	CHECK(plan_starts == 1 && plan_closes == 1);
	CHECK_EQ(flx_slicer_open_from(nodev_first, &o, &s, line, sizeof(line)),
		 0);
	CHECK(s == &plan_emu && plan_opens == 2);
	CHECK_EQ(flx_slicer_open_from(nodev_only, &o, &s, line, sizeof(line)),
		 0);
	CHECK(s == flx_slicer_cpu());
	CHECK(!strcmp(line, "slicer: cpu (gpu=auto: no test device)"));
	o.mode = FLX_GPU_ON;
	CHECK_EQ(flx_slicer_open_from(nodev_only, &o, &s, line, sizeof(line)),
		 -ENODEV);
	CHECK(s == flx_slicer_cpu());
	CHECK(!strcmp(line, "gpu=on: no usable TEST device: no test device"));
	CHECK_EQ(flx_slicer_open_from(empty, &o, &s, line, sizeof(line)),
		 -ENODEV);
	o.mode = FLX_GPU_OFF;
	CHECK_EQ(flx_slicer_open_from(plan_only, &o, &s, line, sizeof(line)),
		 0);
	CHECK(s == flx_slicer_cpu() && plan_opens == 2);
	CHECK(!strcmp(line, "slicer: cpu (gpu=off)"));
	/* the CPU slicer and static ones: nothing to start or close */
	flx_slicer_start(flx_slicer_cpu());
	flx_slicer_close(flx_slicer_cpu());
	flx_slicer_close(&busy);
	CHECK(plan_starts == 1 && plan_closes == 1);
}

static unsigned batches, batch_bytes, transposes, slice_batches;

/* The CUDA backend, or NULL without a device (test_slice says so); and
 * the same with the fewest blocks kept on the device (gpu_cache=1: every
 * batch of more than a few blocks runs in phases and evicts). */
static const flx_slicer *cuda, *cuda_small;
static unsigned cuda_repeats;

/* Run t with s (through flx_slicer_run()) and compare with the oracle. */
static void check_batch(tb *t, const flx_slicer *s, const char *what)
{
	unsigned char *want = tb_oracle(t);
	unsigned before = taken;
	bool accept = !s->accepts || s->accepts(s, &t->b);
	int rc;

	/* a device backend runs it twice: the second time its blocks are
	 * found on the device (the batch's origin is the same), and each is
	 * still fetched once, where the read path checks its file */
	for (int pass = 0; pass < (s == cuda || s == cuda_small ? 2 : 1);
	     pass++) {
		memset(t->b.dst, 0xEE, t->b.dst_len);
		memset(t->fetched, 0, (t->b.nblocks + 1) * sizeof(unsigned));
		rc = flx_slicer_run(s, &t->b);
		CHECK_EQ(rc, 0);
		CHECK_EQ(t->bad, 0);
		CHECK_EQ(t->pinned, -1);
		if (s == &declining)
			CHECK_EQ(taken - before, accept ? 1 : 0);
		declined += !accept;
		for (size_t k = 0; k < t->b.nblocks; k++)
			CHECK_EQ(t->fetched[k], 1);
		if (rc == 0 && memcmp(t->b.dst, want, t->b.dst_len) != 0) {
			fprintf(stderr,
				"%s: batch mismatch (pass %d): esz %zu block "
				"%llu, %zu runs\n",
				what, pass, t->b.elem_size,
				(unsigned long long)t->b.block, t->b.nruns);
			check_failures++;
		}
		cuda_repeats += pass;
	}
	free(want);
}

/*
 * Slice s of src (ns bytes; the destination nd bytes, dense along the
 * inner dimension) as a batch: one run per line of the inner dimension,
 * from file 0 in blocks of block bytes; with the CPU backend, and the
 * CUDA one when present, against the batch oracle and want (the slice
 * oracle's bytes, 0xEE outside the slice).
 */
static void check_slice_batch(const flx_slice *s, const unsigned char *src,
			      size_t ns, const unsigned char *want, size_t nd,
			      uint64_t block)
{
	int inner = s->ndim - 1;
	int64_t idx[FLX_SLICE_MAX_DIMS] = {0};
	size_t nruns = 1;
	tb t;

	CHECK_EQ(s->dst_stride[inner], (int64_t)s->elem_size);
	for (int d = 0; d < inner; d++)
		nruns *= (size_t)s->shape[d];
	memset(&t, 0, sizeof(t));
	t.b.elem_size = s->elem_size;
	t.b.block = block;
	t.b.get = tb_get;
	t.b.put = tb_put;
	t.b.ctx = &t;
	t.pinned = -1;
	t.fail_at = -1;
	t.f[0].data = malloc(ns);
	memcpy(t.f[0].data, src, ns);
	t.f[0].size = ns;
	t.runs = calloc(nruns, sizeof(*t.runs));
	t.b.runs = t.runs;
	for (;;) {
		uint64_t doff = 0, soff = 0;
		size_t len = (size_t)s->shape[inner] * s->elem_size;
		int d;

		for (d = 0; d < inner; d++) {
			doff += (uint64_t)(idx[d] * s->dst_stride[d]);
			soff += (uint64_t)(idx[d] * s->src_stride[d]);
		}
		tb_add(&t, (flx_slice_run){soff, (uint64_t)s->src_stride[inner],
					   0, doff, len, 0});
		t.nbytes += len;
		for (d = inner - 1; d >= 0 && ++idx[d] == s->shape[d]; d--)
			idx[d] = 0;
		if (d < 0)
			break;
	}
	t.b.dst_len = nd;
	tb_finish(&t);
	check_batch(&t, flx_slicer_cpu(), "cpu (slice)");
	CHECK(!memcmp(t.b.dst, want, nd));
	check_batch(&t, &plan_emu, "cuda plan (slice)");
	CHECK(!memcmp(t.b.dst, want, nd));
	if (cuda) {
		check_batch(&t, cuda, "cuda (slice)");
		CHECK(!memcmp(t.b.dst, want, nd));
		check_batch(&t, cuda_small, "cuda gpu_cache=1 (slice)");
		CHECK(!memcmp(t.b.dst, want, nd));
	}
	slice_batches++;
	tb_free(&t);
}

static void test_batches(void)
{
	static const size_t esz[] = {1, 2, 3, 4, 8, 16};
	static const uint64_t blocks[] = {64, 256, 1024, 4096};
	const flx_slicer *backends[] = {flx_slicer_cpu(), flx_slicer_default(),
					&declining,	  &busy,
					&plan_emu,	  cuda,
					cuda_small};
	unsigned seed = 777;

	for (int i = 0; i < 600; i++) {
		tb t;
		int nr = rand_r(&seed) % 40;

		tb_init(&t, esz[i % 6], blocks[rand_r(&seed) % 4], &seed, 4096);
		for (int k = 0; k < nr; k++)
			add_random_run(&t, &seed);
		if (i % 2) {
			add_transpose(&t, &seed);
			transposes++;
		}
		tb_finish(&t);
		for (size_t s = 0; s < sizeof(backends) / sizeof(backends[0]);
		     s++)
			if (backends[s])
				check_batch(&t, backends[s], backends[s]->name);
		CHECK_EQ(flx_slicer_run(&failing, &t.b), -EIO);
		CHECK_EQ(t.pinned, -1);
		batches++;
		batch_bytes += (unsigned)t.nbytes;
		tb_free(&t);
	}
	/* both sides of the declining backend's threshold were run */
	CHECK(declined > 0 && taken > 0);
}

/*
 * t's runs (elements of the source type, added but not finished) made a
 * cast batch: each run's elements, partial ones whole, converted by c and
 * placed back to back in dst in run order (gaps: after a random few
 * bytes, so that rows of a transpose step unevenly).
 */
static void tb_castify(tb *t, const flx_ecast *c, unsigned *seed, int gaps)
{
	size_t esz = t->b.elem_size, tsz = c->to.size;

	qsort(t->runs, t->b.nruns, sizeof(*t->runs), cmp_run);
	t->b.dst_len = 0;
	t->nbytes = 0;
	t->b.cast = c;
	for (size_t i = 0; i < t->b.nruns; i++) {
		flx_slice_run *u = &t->runs[i];
		uint64_t e0 = u->skip / esz;
		uint64_t n = (u->skip + u->len + esz - 1) / esz - e0;

		u->src += e0 * u->stride;
		u->skip = 0;
		u->len = (size_t)(n * tsz);
		if (gaps && rand_r(seed) % 2)
			t->b.dst_len += (size_t)(rand_r(seed) % 5);
		u->dst = t->b.dst_len;
		t->b.dst_len += u->len;
		t->nbytes += u->len;
	}
}

static int run_cpu(tb *t);

/* Gathers with casts: pairs of every kind of conversion (shortcuts,
 * narrowings that round, integers, bools), random runs and transposes of
 * random bytes (NaNs, infinities, subnormals included), on every backend,
 * against each element read alone and converted. */
static unsigned cast_batches;

static void test_cast_batches(void)
{
	static const flx_dtype F[] = {FLX_DT_F64, FLX_DT_F32, FLX_DT_F16,
				      FLX_DT_BF16};
	static const flx_dtype pairs[][2] = {
	    {FLX_DT_I32, FLX_DT_F32},  {FLX_DT_I64, FLX_DT_BF16},
	    {FLX_DT_U8, FLX_DT_F16},   {FLX_DT_I16, FLX_DT_I8},
	    {FLX_DT_I8, FLX_DT_I64},   {FLX_DT_U8, FLX_DT_BOOL},
	    {FLX_DT_BOOL, FLX_DT_F32}, {FLX_DT_I32, FLX_DT_U16}};
	static const uint64_t blocks[] = {64, 256, 1024, 4096};
	const flx_slicer *backends[] = {flx_slicer_cpu(), flx_slicer_default(),
					&declining,	  &busy,
					&plan_emu,	  cuda,
					cuda_small};
	flx_dtype from[16 + 8], to[16 + 8];
	size_t np = 0;
	unsigned seed = 31337;

	for (size_t i = 0; i < 4; i++)
		for (size_t j = 0; j < 4; j++, np++) {
			from[np] = F[i];
			to[np] = F[j];
		}
	for (size_t i = 0; i < 8; i++, np++) {
		from[np] = pairs[i][0];
		to[np] = pairs[i][1];
	}
	for (size_t k = 0; k < np; k++)
		for (int i = 0; i < 16; i++) {
			flx_ecast c;
			tb t;
			int nr = rand_r(&seed) % 30;

			CHECK_EQ(flx_cast_desc(from[k], to[k], &c), 0);
			tb_init(&t, c.from.size, blocks[rand_r(&seed) % 4],
				&seed, 4096);
			for (int q = 0; q < nr; q++)
				add_random_run(&t, &seed);
			if (i % 2)
				add_transpose(&t, &seed);
			tb_castify(&t, &c, &seed, i % 4 == 3);
			tb_finish(&t);
			CHECK_EQ(flx_slice_batch_check(&t.b), 0);
			for (size_t b = 0;
			     b < sizeof(backends) / sizeof(backends[0]); b++)
				if (backends[b])
					check_batch(&t, backends[b],
						    backends[b]->name);
			if (t.b.nruns && t.runs[0].len) {
				/* not whole converted elements */
				t.runs[0].len -= c.to.size > 1;
				CHECK_EQ(run_cpu(&t),
					 c.to.size > 1 ? -EINVAL : 0);
				t.runs[0].len += c.to.size > 1;
				t.runs[0].skip = 1;
				CHECK_EQ(run_cpu(&t), -EINVAL);
				t.runs[0].skip = 0;
				t.b.elem_size++;
				CHECK_EQ(run_cpu(&t), -EINVAL);
				t.b.elem_size--;
				CHECK_EQ(run_cpu(&t), 0);
			}
			cast_batches++;
			tb_free(&t);
		}
}

/* A batch of random runs for the error checks (one element size). */
static void error_batch(tb *t, unsigned *seed)
{
	tb_init(t, 4, 256, seed, 64);
	while (t->b.nruns < 8)
		add_random_run(t, seed);
	tb_finish(t);
}

/* The CPU backend's result, which the CUDA plan's must equal. */
static int run_cpu(tb *t)
{
	const flx_slicer *cpu = flx_slicer_cpu();
	int rc = cpu->run(cpu, &t->b);

	CHECK_EQ(t->pinned, -1);
	CHECK_EQ(t->bad, 0);
	CHECK_EQ(plan_emu.run(&plan_emu, &t->b), rc);
	CHECK_EQ(t->pinned, -1);
	CHECK_EQ(t->bad, 0);
	return rc;
}

static void test_batch_errors(void)
{
	unsigned seed = 4242;
	flx_slice_run keep;
	tb t;

	/* invalid batches */
	error_batch(&t, &seed);
	CHECK_EQ(flx_slice_batch_check(&t.b), 0);
	keep = t.runs[0];
	t.runs[0].skip = t.b.elem_size;
	CHECK_EQ(run_cpu(&t), -EINVAL);
	t.runs[0] = keep;
	t.runs[0].len = t.b.dst_len - t.runs[0].dst + 1;
	CHECK_EQ(run_cpu(&t), -EINVAL);
	t.runs[0] = keep;
	t.runs[0].dst = t.b.dst_len + 1;
	t.runs[0].len = 0;
	CHECK_EQ(run_cpu(&t), -EINVAL);
	t.runs[0] = keep;
	t.runs[0].file = NFILES; /* sorted after the others' */
	CHECK_EQ(run_cpu(&t), -EINVAL);
	t.runs[0] = keep;
	t.b.elem_size = 0;
	CHECK_EQ(run_cpu(&t), -EINVAL);
	t.b.elem_size = 4;
	t.b.block = 0;
	CHECK_EQ(run_cpu(&t), -EINVAL);
	t.b.block = 256;
	if (t.b.nblocks > 1) {
		flx_slice_block b0 = t.blocks[0];

		t.blocks[0] = t.blocks[1];
		t.blocks[1] = b0;
		CHECK_EQ(run_cpu(&t), -EINVAL);
		t.blocks[1] = t.blocks[0];
		t.blocks[0] = b0;
	}
	CHECK_EQ(run_cpu(&t), 0);

	/* a block missing from the list: its elements cannot be copied */
	for (size_t k = 0; k < t.b.nblocks; k++) {
		flx_slice_block b = t.blocks[k];

		memmove(&t.blocks[k], &t.blocks[k + 1],
			(t.b.nblocks - k - 1) * sizeof(b));
		t.b.nblocks--;
		CHECK_EQ(run_cpu(&t), -EIO);
		t.b.nblocks++;
		memmove(&t.blocks[k + 1], &t.blocks[k],
			(t.b.nblocks - k - 1) * sizeof(b));
		t.blocks[k] = b;
	}
	/* a get that fails at any block: its error, nothing left pinned */
	for (size_t k = 0; k < t.b.nblocks; k++) {
		t.fail_at = (long)k;
		CHECK_EQ(run_cpu(&t), -EIO);
	}
	t.fail_at = -1;
	CHECK_EQ(run_cpu(&t), 0);
	tb_free(&t);

	/* an element past the bytes its block holds (a file shorter than
	 * the list says): 16-byte elements 60 bytes into their homes of 64,
	 * so each ends 12 bytes into its block's tail */
	tb_init(&t, 16, 64, &seed, 4);
	tb_add(&t, (flx_slice_run){60, 64, 0, tb_place(&t, 64, &seed), 64, 0});
	tb_finish(&t);
	CHECK_EQ(t.b.nblocks, 4);
	for (size_t k = 0; k < t.b.nblocks; k++) {
		t.blocks[k].len = 76; /* the element's last byte: enough */
		CHECK_EQ(run_cpu(&t), 0);
		t.blocks[k].len = 75;
		CHECK_EQ(run_cpu(&t), -EIO);
		t.blocks[k].len = 80;
	}
	tb_free(&t);
}

/* The CUDA backend as a mount with gpu=on,gpu_min=0 opens it, or NULL
 * and one line saying why it is skipped. */
static void open_cuda(void)
{
	flx_slicer_opts o = {FLX_GPU_ON, 0, 0, NULL, FLX_GPU_CACHE_DEFAULT};
	char line[1024];

	if (flx_slicer_open(&o, &cuda, line, sizeof(line))) {
		fprintf(stderr, "test_slice: CUDA backend skipped: %s\n", line);
		cuda = NULL;
		return;
	}
	fprintf(stderr, "test_slice: checking the CUDA backend: %s\n", line);
	flx_slicer_start(cuda);
	/* opened after this process used CUDA (probed here, not in a
	 * child), and left to start at its first batch */
	o.cache_bytes = 1;
	CHECK_EQ(flx_slicer_open(&o, &cuda_small, line, sizeof(line)), 0);
}

int main(void)
{
	static const size_t esz[] = {1, 2, 3, 4, 8, 16};
	unsigned seed = 12345;

	test_backend_table();
	open_cuda();
	for (size_t e = 0; e < sizeof(esz) / sizeof(esz[0]); e++) {
		check_transpose(1, 1, esz[e], 1, 1);
		check_transpose(16, 16, esz[e], 16, 16);
		check_transpose(17, 33, esz[e], 40, 35);
		check_transpose(124, 300, esz[e], 512, 300);
		check_transpose(5, 1000, esz[e], 7, 1000);
		check_transpose(1000, 3, esz[e], 1003, 5);
	}
	for (int i = 0; i < 3000; i++) {
		flx_slice s = {.ndim = 1 + rand_r(&seed) % 4,
			       .elem_size = esz[rand_r(&seed) % 6]};
		int64_t dense = (int64_t)s.elem_size;

		/* the destination dense (C order) or padded; the source
		 * with any permutation of dense strides, padded or not */
		for (int d = s.ndim - 1; d >= 0; d--) {
			s.shape[d] = 1 + rand_r(&seed) % 9;
			s.dst_stride[d] = dense;
			dense *= s.shape[d] + (rand_r(&seed) % 3 == 0);
		}
		dense = (int64_t)s.elem_size;
		for (int k = 0; k < s.ndim; k++) {
			int d = (k + rand_r(&seed)) % s.ndim;

			while (s.src_stride[d])
				d = (d + 1) % s.ndim;
			s.src_stride[d] = dense;
			dense *= s.shape[d] + rand_r(&seed) % 2;
		}
		check_slice(&s);
	}
	CHECK(cases > 3000 && tiled_cases == 36);
	test_batches();
	test_batch_errors();
	test_cast_batches();
	CHECK_EQ(cast_batches, 24 * 16);
	CHECK(batches == 600 && transposes == 300 && batch_bytes > 100000);
	CHECK_EQ(slice_batches, cases);
	/* every batch the device backends ran was run again from kept blocks */
	CHECK(!cuda ||
	      cuda_repeats == 2 * (slice_batches + batches + cast_batches));
	flx_slicer_close(cuda);
	flx_slicer_close(cuda_small);
	fprintf(stderr,
		"%u batches (%u bytes, %u declined by the test backend), "
		"%u with casts\n",
		batches, batch_bytes, declined, cast_batches);
	return CHECK_RESULT();
}
