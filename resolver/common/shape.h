/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_SHAPE_H
#define FLX_RESOLVER_SHAPE_H

/*
 * Shape arithmetic shared by the codecs, the index and the views: element
 * counts and strided extents with their overflow checks.  Pure functions:
 * thread-safe, no allocation.
 */

#include <stddef.h>
#include <stdint.h>

/* The most dimensions a tensor may have (what torch's dispatcher allows
 * in practice is far below it; a bound every array here can rely on). */
#define FLX_MAX_DIMS 16

/** Number of elements of a shape; 1 for ndim 0.  The caller has checked
 * that it fits (flx_shape_bytes(), which every source runs at open). */
uint64_t flx_numel(int ndim, const int64_t *shape);

/**
 * Elements and bytes of a shape of non-negative dimensions whose elements
 * are elem_size bytes (elem_size > 0).  Both must fit in 63 bits, so that
 * offsets derived from them stay valid int64_t.
 * @return 0 and *numel, *bytes (either may be NULL), or -EOVERFLOW.
 */
int flx_shape_bytes(int ndim, const int64_t *shape, unsigned elem_size,
		    uint64_t *numel, uint64_t *bytes);

/**
 * How many storage elements a strided box spans, from its first element to
 * its last inclusive: 1 + the sum of (size - 1) x stride (sizes and strides
 * non-negative), 0 when the box has no element.
 * @return 0 and *span, or -ERANGE when the span does not fit 64 bits.
 */
int flx_strided_span(int ndim, const int64_t *size, const int64_t *stride,
		     uint64_t *span);

/**
 * Whether distinct elements of a strided box (sizes and strides
 * non-negative, the span known to fit 64 bits) always lie at distinct
 * storage positions: the axes of more than one element, by increasing
 * stride, each step past everything the smaller ones reach.  Dense,
 * transposed and sliced views are disjoint; an expand()ed view (stride 0)
 * or rows that overlap are not (nor the rare as_strided() interleaving,
 * which this sufficient test also refuses).  Thread-safe.
 * @return 0 when disjoint, -EINVAL when elements may share storage.
 */
int flx_strided_disjoint(int ndim, const int64_t *size, const int64_t *stride);

/* At most this many boxes make a flattened range (flx_flat_boxes()). */
#define FLX_FLAT_BOXES_MAX (2 * FLX_MAX_DIMS - 1)

/**
 * Elements [start, stop) of the row-major flattening of a block of shape
 * blk (ndim axes, all > 0 when start < stop; stop <= its element count) as
 * boxes: from start, greedily the longest run of whole sub-blocks (single
 * elements, then rows, planes, ...) that fits, so a partial run along the
 * innermost axis, runs of ever larger sub-blocks, then ever smaller ones:
 * *n <= 2 ndim - 1 boxes (1 for ndim 0 with a non-empty range; 0 when
 * start == stop).  off[k] and size[k] are box k relative to the block;
 * first[k] is the flat index of its first element, and its elements in
 * row-major order have consecutive flat indices (so the range's 1-D
 * storage holds box k at first[k] - start with the block's row-major
 * strides).  Thread-safe.
 */
void flx_flat_boxes(int ndim, const int64_t *blk, int64_t start, int64_t stop,
		    int64_t off[][FLX_MAX_DIMS], int64_t size[][FLX_MAX_DIMS],
		    int64_t *first, unsigned *n);

/** Write "[a,b,c]" of ndim values into buf (len > 0), cut to fit; for
 * messages. */
void flx_fmt_dims(char *buf, size_t len, int ndim, const int64_t *v);

#endif
