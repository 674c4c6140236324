/* SPDX-License-Identifier: MIT */
#ifndef FLX_GPU_SLICE_INTERNAL_H
#define FLX_GPU_SLICE_INTERNAL_H

/*
 * The host copy the CPU backend is built from (not public): an N-d strided
 * box copied between two host buffers.  Strides are in bytes and may be
 * any non-negative value; the innermost dimension is copied with memcpy
 * when both strides equal elem_size, and a 2-D box dense along the inner
 * dimension of the destination and the outer one of the source (rows of a
 * transpose) in tiles.
 *
 * Thread-safety: no state; reentrant.
 */

#include <stddef.h>
#include <stdint.h>

#define FLX_SLICE_MAX_DIMS 16

typedef struct flx_slice {
	int ndim;
	size_t elem_size;
	int64_t shape[FLX_SLICE_MAX_DIMS];
	int64_t dst_stride[FLX_SLICE_MAX_DIMS]; /* bytes */
	int64_t src_stride[FLX_SLICE_MAX_DIMS]; /* bytes */
} flx_slice;

/** Copy box s from src to dst.  @return 0, or -EINVAL (ndim out of range,
 * elem_size 0). */
int flx_slice_copy(void *dst, const void *src, const flx_slice *s);

/** Merge adjacent dimensions that are contiguous in both buffers, so the
 * innermost memcpy is as long as possible.  Keeps the copy equivalent. */
void flx_slice_coalesce(flx_slice *s);

#endif
