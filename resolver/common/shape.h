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

/** Write "[a,b,c]" of ndim values into buf (len > 0), cut to fit; for
 * messages. */
void flx_fmt_dims(char *buf, size_t len, int ndim, const int64_t *v);

#endif
