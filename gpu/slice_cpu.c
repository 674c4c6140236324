/* SPDX-License-Identifier: MIT */
/*
 * The CPU backend: the host copy of an N-d strided box (slice_internal.h),
 * and the batches of the read path executed block by block with it.
 */
#include "slice.h"
#include "slice_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void flx_slice_coalesce(flx_slice *s)
{
	int out = s->ndim - 1;

	if (s->ndim <= 1)
		return;
	/* Walk from the innermost dimension outwards, folding dimension d
	 * into d+1 when d's stride equals (extent x stride) of d+1 in both. */
	for (int d = s->ndim - 2; d >= 0; d--) {
		if (s->dst_stride[d] == s->shape[out] * s->dst_stride[out] &&
		    s->src_stride[d] == s->shape[out] * s->src_stride[out]) {
			s->shape[out] *= s->shape[d];
			continue;
		}
		out--;
		s->shape[out] = s->shape[d];
		s->dst_stride[out] = s->dst_stride[d];
		s->src_stride[out] = s->src_stride[d];
	}
	if (out > 0) {
		int n = s->ndim - out;

		memmove(s->shape, s->shape + out, n * sizeof(s->shape[0]));
		memmove(s->dst_stride, s->dst_stride + out,
			n * sizeof(s->dst_stride[0]));
		memmove(s->src_stride, s->src_stride + out,
			n * sizeof(s->src_stride[0]));
		s->ndim = n;
	}
}

/* count elements of esz bytes, strides in bytes.  Always inlined, so that
 * each caller that passes a constant esz (the dispatchers below) gets a
 * fixed-size memcpy, one load and one store, instead of a call per
 * element. */
static inline __attribute__((always_inline)) void
elems(unsigned char *d, int64_t ds, const unsigned char *p, int64_t ps,
      int64_t count, size_t esz)
{
	for (int64_t k = 0; k < count; k++)
		memcpy(d + k * ds, p + k * ps, esz);
}

static void copy_elems(unsigned char *d, int64_t ds, const unsigned char *p,
		       int64_t ps, int64_t count, size_t esz)
{
	switch (esz) {
	case 1:
		elems(d, ds, p, ps, count, 1);
		break;
	case 2:
		elems(d, ds, p, ps, count, 2);
		break;
	case 4:
		elems(d, ds, p, ps, count, 4);
		break;
	case 8:
		elems(d, ds, p, ps, count, 8);
		break;
	case 16:
		elems(d, ds, p, ps, count, 16);
		break;
	default:
		elems(d, ds, p, ps, count, esz);
	}
}

/*
 * A transpose: 2 dimensions, the destination dense along the inner one and
 * the source along the outer one (rows of a transposed chunk).  Row by
 * row, every element read comes from another cache line, often of the same
 * cache set (strides of a multiple of 4 KiB), and the line holding the
 * next row's element is evicted before it is used; in tiles of TILE x TILE
 * elements the lines of a tile are reused while cached (the tile size is
 * measured in docs/performance.md).
 */
#define TILE 16

/* always inlined like elems(), for the same reason */
static inline __attribute__((always_inline)) void
tiles(unsigned char *d, const unsigned char *p, const flx_slice *s, size_t esz)
{
	int64_t rows = s->shape[0], cols = s->shape[1];
	int64_t ds = s->dst_stride[0], ps0 = s->src_stride[0],
		ps1 = s->src_stride[1];

	for (int64_t r0 = 0; r0 < rows; r0 += TILE)
		for (int64_t c0 = 0; c0 < cols; c0 += TILE) {
			int64_t rn = rows - r0 < TILE ? rows - r0 : TILE;
			int64_t cn = cols - c0 < TILE ? cols - c0 : TILE;

			for (int64_t r = r0; r < r0 + rn; r++)
				elems(d + r * ds + c0 * (int64_t)esz,
				      (int64_t)esz, p + r * ps0 + c0 * ps1, ps1,
				      cn, esz);
		}
}

/* dst_stride[1] is elem_size (see flx_slice_copy()) */
static void copy_tiled(unsigned char *d, const unsigned char *p,
		       const flx_slice *s)
{
	switch (s->elem_size) {
	case 1:
		tiles(d, p, s, 1);
		break;
	case 2:
		tiles(d, p, s, 2);
		break;
	case 4:
		tiles(d, p, s, 4);
		break;
	case 8:
		tiles(d, p, s, 8);
		break;
	case 16:
		tiles(d, p, s, 16);
		break;
	default:
		tiles(d, p, s, s->elem_size);
	}
}

int flx_slice_copy(void *dst, const void *src, const flx_slice *in)
{
	flx_slice s = *in;
	int64_t idx[FLX_SLICE_MAX_DIMS] = {0};
	unsigned char *d = dst;
	const unsigned char *p = src;
	int inner;
	size_t run;
	int64_t count;

	if (s.ndim < 0 || s.ndim > FLX_SLICE_MAX_DIMS || !s.elem_size)
		return -EINVAL;
	for (int i = 0; i < s.ndim; i++)
		if (s.shape[i] <= 0)
			return 0;
	if (s.ndim == 0) {
		memcpy(d, p, s.elem_size);
		return 0;
	}
	flx_slice_coalesce(&s);
	inner = s.ndim - 1;
	if (s.ndim == 2 && s.dst_stride[1] == (int64_t)s.elem_size &&
	    s.src_stride[1] != (int64_t)s.elem_size &&
	    llabs(s.src_stride[0]) < llabs(s.src_stride[1])) {
		copy_tiled(d, p, &s);
		return 0;
	}
	/* Innermost: one memcpy when both sides are dense, else per element. */
	if (s.dst_stride[inner] == (int64_t)s.elem_size &&
	    s.src_stride[inner] == (int64_t)s.elem_size) {
		run = (size_t)s.shape[inner] * s.elem_size;
		count = 1;
	} else {
		run = s.elem_size;
		count = s.shape[inner];
	}
	for (;;) {
		int64_t doff = 0, soff = 0;

		for (int i = 0; i < inner; i++) {
			doff += idx[i] * s.dst_stride[i];
			soff += idx[i] * s.src_stride[i];
		}
		if (count == 1)
			memcpy(d + doff, p + soff, run);
		else
			copy_elems(d + doff, s.dst_stride[inner], p + soff,
				   s.src_stride[inner], count, s.elem_size);
		/* odometer over the outer dimensions */
		int i = inner - 1;

		while (i >= 0 && ++idx[i] == s.shape[i])
			idx[i--] = 0;
		if (i < 0)
			break;
	}
	return 0;
}

/* ---- batches ---- */

/*
 * Strided gathers, block by block.  A chunk saved with a strided innermost
 * axis spreads each target row over the whole chunk, and the next row
 * reads the same blocks a few bytes further on: copying row after row
 * would fetch every block once per row, and take every element from
 * memory the CPU's caches lost since the row before.  The batch's blocks
 * are visited in file order instead: each is fetched once, and every run
 * copies the elements that start in it.  pos[i] is the next stream byte
 * run i copies (from skip to skip + len).
 */

/* File offset of the element holding stream byte p of run u. */
static uint64_t elem_src(const flx_slice_run *u, uint64_t p, size_t esz)
{
	return u->src + p / esz * u->stride;
}

/* Offset in dst where stream byte p of run u goes. */
static uint64_t out_off(const flx_slice_run *u, uint64_t p)
{
	return u->dst + (p - u->skip);
}

static uint64_t run_end(const flx_slice_run *u)
{
	return u->skip + u->len;
}

/* Whether the element holding stream byte p of run u starts in block k's
 * home. */
static bool in_home(const flx_slice_batch *b, const flx_slice_run *u,
		    uint64_t p, const flx_slice_block *k)
{
	uint64_t s = elem_src(u, p, b->elem_size);

	return s >= k->start && s - k->start < b->block;
}

/* Whole elements run u can copy from block k from stream byte p on: those
 * that start in its home and end inside the bytes it holds; 0 when p is
 * inside an element, or its element lies outside the block. */
static uint64_t block_elems(const flx_slice_batch *b, const flx_slice_run *u,
			    uint64_t p, const flx_slice_block *k)
{
	size_t esz = b->elem_size;
	uint64_t home = k->start + b->block, have = k->start + k->len;
	uint64_t s = elem_src(u, p, esz), end = run_end(u), n, fit;

	if (end - p < esz || p % esz || s < k->start || s >= home ||
	    s + esz > have)
		return 0;
	n = (end - p) / esz;
	if (u->stride) {
		fit = (home - 1 - s) / u->stride + 1;
		if (fit > (have - esz - s) / u->stride + 1)
			fit = (have - esz - s) / u->stride + 1;
		if (n > fit)
			n = fit;
	}
	return n;
}

/* Copy the elements of run u that start in block k (data: its bytes);
 * partial elements at the ends of the run are copied alone. */
static int gather_block(const flx_slice_batch *b, const flx_slice_run *u,
			uint64_t *pos, const flx_slice_block *k,
			const unsigned char *data)
{
	size_t esz = b->elem_size;
	uint64_t home = k->start + b->block, have = k->start + k->len;
	uint64_t end = run_end(u);

	while (*pos < end) {
		uint64_t within = *pos % esz, s = elem_src(u, *pos, esz),
			 n = block_elems(b, u, *pos, k);
		unsigned char *d = b->dst + out_off(u, *pos);
		int rc;

		if (s >= home)
			break;
		/* the element reaches past the bytes the block holds */
		if (s < k->start || s + esz > have)
			return -EIO;
		if (n) {
			flx_slice sc = {.ndim = 1, .elem_size = esz};

			sc.shape[0] = (int64_t)n;
			sc.dst_stride[0] = (int64_t)esz;
			sc.src_stride[0] = (int64_t)u->stride;
			rc = flx_slice_copy(d, data + (s - k->start), &sc);
			if (rc)
				return rc;
			*pos += n * esz;
		} else {
			uint64_t take = esz - within;

			if (take > end - *pos)
				take = end - *pos;
			memcpy(d, data + (s - k->start) + within, take);
			*pos += take;
		}
	}
	return 0;
}

/*
 * Runs that step through block k together -- consecutive rows of a
 * transposed chunk: sources a fixed few bytes apart, destinations a row
 * apart, the same number of elements in the block -- are copied as one 2-D
 * slice, in tiles (a transpose); gather_block() then finishes what is left
 * of each run in the block.  u[0..n) are the runs of k's file.
 */
static int gather_rows(const flx_slice_batch *b, const flx_slice_run *u,
		       uint64_t *pos, size_t n, const flx_slice_block *k,
		       const unsigned char *data)
{
	size_t esz = b->elem_size;

	for (size_t i = 0, j; i < n; i = j) {
		uint64_t cnt = block_elems(b, &u[i], pos[i], k), a = 0, d = 0;
		flx_slice sc = {.ndim = 2, .elem_size = esz};
		int rc;

		for (j = i + 1; cnt && j < n; j++) {
			uint64_t s0 = elem_src(&u[j - 1], pos[j - 1], esz),
				 s1 = elem_src(&u[j], pos[j], esz),
				 d0 = out_off(&u[j - 1], pos[j - 1]),
				 d1 = out_off(&u[j], pos[j]);

			if (j == i + 1) {
				a = s1 - s0;
				d = d1 - d0;
			}
			if (u[j].stride != u[i].stride || s1 <= s0 ||
			    s1 - s0 != a || d1 <= d0 || d1 - d0 != d ||
			    block_elems(b, &u[j], pos[j], k) != cnt)
				break;
		}
		if (!cnt || j - i < 2) {
			j = i + 1;
			continue;
		}
		sc.shape[0] = (int64_t)(j - i);
		sc.shape[1] = (int64_t)cnt;
		sc.dst_stride[0] = (int64_t)d;
		sc.dst_stride[1] = (int64_t)esz;
		sc.src_stride[0] = (int64_t)a;
		sc.src_stride[1] = (int64_t)u[i].stride;
		rc = flx_slice_copy(
		    b->dst + out_off(&u[i], pos[i]),
		    data + (elem_src(&u[i], pos[i], esz) - k->start), &sc);
		if (rc)
			return rc;
		for (size_t q = i; q < j; q++)
			pos[q] += cnt * esz;
	}
	return 0;
}

/* Block k, fetched once, for the runs u[0..n) of its file. */
static int gather_one(const flx_slice_batch *b, size_t k,
		      const flx_slice_run *u, uint64_t *pos, size_t n)
{
	const flx_slice_block *blk = &b->blocks[k];
	const unsigned char *data;
	int rc = b->get(b->ctx, k, &data);

	if (rc)
		return rc;
	rc = gather_rows(b, u, pos, n, blk, data);
	/* runs finished by gather_rows() have pos == end: left alone */
	for (size_t q = 0; q < n && !rc; q++)
		if (pos[q] < run_end(&u[q]) && in_home(b, &u[q], pos[q], blk))
			rc = gather_block(b, &u[q], &pos[q], blk, data);
	b->put(b->ctx, k);
	return rc;
}

/* Every block in order, each with the runs of its file (both sorted by
 * file: one walk).  A run left unfinished wanted an element of a block
 * the batch lacks. */
static int gather_all(const flx_slice_batch *b, uint64_t *pos)
{
	size_t lo = 0, hi = 0;
	int rc = 0;

	for (size_t k = 0; k < b->nblocks && !rc; k++) {
		uint32_t f = b->blocks[k].file;

		while (lo < b->nruns && b->runs[lo].file < f)
			lo++;
		if (hi < lo)
			hi = lo;
		while (hi < b->nruns && b->runs[hi].file == f)
			hi++;
		if (hi > lo)
			rc = gather_one(b, k, b->runs + lo, pos + lo, hi - lo);
	}
	for (size_t i = 0; i < b->nruns && !rc; i++)
		if (pos[i] < run_end(&b->runs[i]))
			rc = -EIO;
	return rc;
}

/* Valid batch b without a cast. */
static int copy_batch(const flx_slice_batch *b)
{
	uint64_t small[256], *pos = small;
	int rc;

	if (b->nruns > sizeof(small) / sizeof(small[0])) {
		pos = malloc(b->nruns * sizeof(*pos));
		if (!pos)
			return -ENOMEM;
	}
	for (size_t i = 0; i < b->nruns; i++)
		pos[i] = b->runs[i].skip;
	rc = gather_all(b, pos);
	if (pos != small)
		free(pos);
	return rc;
}

/*
 * Valid batch b with a cast: the source elements gathered as a batch of
 * their own into raw (the runs' elements back to back, in run order:
 * still sorted), then each run converted to its place.  (The read path
 * sends casts to device backends only; this serves the batches they
 * decline or hand back.)
 */
static int cast_batch(const flx_slice_batch *b)
{
	const flx_ecast *c = b->cast;
	size_t ssz = b->elem_size, tsz = c->to.size, total = 0;
	flx_slice_batch raw = *b;
	flx_slice_run *runs = NULL;
	unsigned char *buf = NULL;
	int rc = 0;

	for (size_t i = 0; i < b->nruns; i++)
		total += b->runs[i].len / tsz * ssz;
	runs = malloc((b->nruns ? b->nruns : 1) * sizeof(*runs));
	buf = malloc(total ? total : 1);
	if (!runs || !buf) {
		rc = -ENOMEM;
		goto out;
	}
	total = 0;
	for (size_t i = 0; i < b->nruns; i++) {
		runs[i] = b->runs[i];
		runs[i].dst = total;
		runs[i].len = b->runs[i].len / tsz * ssz;
		total += runs[i].len;
	}
	raw.dst = buf;
	raw.dst_len = total;
	raw.runs = runs;
	raw.cast = NULL;
	rc = copy_batch(&raw);
	for (size_t i = 0; i < b->nruns && !rc; i++)
		flx_ecast_n(c, b->dst + b->runs[i].dst, buf + runs[i].dst,
			    b->runs[i].len / tsz);
out:
	free(runs);
	free(buf);
	return rc;
}

static int cpu_run(const flx_slicer *self, const flx_slice_batch *b)
{
	int rc = flx_slice_batch_check(b);

	(void)self;
	if (rc)
		return rc;
	return b->cast ? cast_batch(b) : copy_batch(b);
}

static const flx_slicer cpu_slicer = {"cpu", NULL, cpu_run, false, NULL};

const flx_slicer *flx_slicer_cpu(void)
{
	return &cpu_slicer;
}
