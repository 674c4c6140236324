/* SPDX-License-Identifier: MIT */
#ifndef FLX_GPU_SLICE_PLAN_H
#define FLX_GPU_SLICE_PLAN_H

/*
 * A batch (slice.h) cut into the work of the CUDA backend's kernels (not
 * public; slice_cuda.cu executes it, test_slice_plan checks it on the
 * host).
 *
 * With a cast (slice.h), esz below is the converted element's size (the
 * stream's) and the bytes of element i are the conversion of the source
 * element at block[p.soff + i * p.stride]; pieces are whole elements.
 *
 * Every run is cut into pieces, one per block its elements start in, by
 * the CPU backend's rule: an element is taken from the listed block whose
 * home holds its first byte, and must end inside the bytes the block
 * holds.  Piece p of block k then means: for element i < p.n, stream
 * bytes q = i * esz + b (b < esz) with p.lo <= q < p.hi go
 *   dst[p.dbase + q] = block[p.soff + i * p.stride + b].
 * Among a block's pieces, rows of a transpose -- whole pieces with the
 * same count and stride, sources a fixed step a apart and destinations a
 * fixed step d apart, as slice_cpu.c's gather_rows() finds them -- become
 * one flx_rows: element i of row r goes
 *   dst[dbase + r * d + i * esz ..] = block[soff + r * a + i * stride ..].
 *
 * Thread-safety: no state; reentrant.
 */

#include "slice.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flx_piece {
	uint64_t soff;	 /* element 0's offset in the block */
	uint64_t stride; /* bytes between elements in the block */
	int64_t dbase;	 /* dst offset of element 0's first stream byte */
	uint64_t n;	 /* elements */
	uint64_t lo, hi; /* stream bytes wanted, from element 0's: [lo, hi) */
} flx_piece;

typedef struct flx_rows {
	uint64_t soff, a, stride;
	uint64_t dbase, d;
	uint64_t nrows, n;
} flx_rows;

typedef struct flx_plan {
	flx_piece *pc;	/* sorted by block, each block's in run order */
	size_t *blk_of; /* (while cutting) pc[i]'s block */
	size_t npc, cap;
	size_t *first; /* pieces of block k: pc[first[k], first[k + 1]) */
} flx_plan;

/**
 * Cut valid batch b (flx_slice_batch_check()) into *p (zeroed by the
 * caller; flx_slice_plan_free() after, whatever the result).
 * @return 0, -EIO (an element in no listed block, or past its block's
 *         bytes), -ENOMEM.
 */
int flx_plan_cut(const flx_slice_batch *b, flx_plan *p);

/** Split the n pieces in[0..n) of one block: rows of transposes to
 * rw[0..*nrw), the other pieces to pc[0..*npc) (both at least n long);
 * esz: the stream's element size (the converted one with a cast). */
void flx_plan_rows(const flx_piece *in, size_t n, uint64_t esz, flx_piece *pc,
		   size_t *npc, flx_rows *rw, size_t *nrw);

/** Copy the runs' bytes of b from from (dst_len bytes, where the pieces
 * were executed) to b->dst, runs back to back in one memcpy: no byte of
 * b->dst outside the runs is written. */
void flx_plan_copy_runs(const flx_slice_batch *b, const unsigned char *from);

/** Free what p holds. */
void flx_slice_plan_free(flx_plan *p);

#ifdef __cplusplus
}
#endif

#endif
