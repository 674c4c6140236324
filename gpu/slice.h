/* SPDX-License-Identifier: MIT */
#ifndef FLX_GPU_SLICE_H
#define FLX_GPU_SLICE_H

/*
 * The slicing interface: copy an N-d strided box between two host buffers.
 * This is the one operation a read needs beyond pread, and the seam where an
 * accelerator plugs in: flx_slicer_default() returns the CPU implementation
 * unless a device backend was detected at run time.  Every backend must give
 * results identical to the CPU one (tests compare them).
 *
 * Strides are in bytes and may be any non-negative value; the innermost
 * dimension is copied with memcpy when both strides equal elem_size.
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

typedef struct flx_slicer {
	const char *name; /* "cpu", "cuda" */
	/** Copy box s from src to dst.  @return 0 or -errno. */
	int (*copy)(const struct flx_slicer *self, void *dst, const void *src,
		    const flx_slice *s);
} flx_slicer;

/** The CPU implementation (always available). */
const flx_slicer *flx_slicer_cpu(void);

/** Best available backend; the CPU one when no device is present. */
const flx_slicer *flx_slicer_default(void);

/** Merge adjacent dimensions that are contiguous in both buffers, so the
 * innermost memcpy is as long as possible.  Keeps the copy equivalent. */
void flx_slice_coalesce(flx_slice *s);

#endif
