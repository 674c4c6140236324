/* SPDX-License-Identifier: MIT */
#include "slice.h"

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
 * elements the lines of a tile are reused while cached: a 4096 x 4096 bf16
 * transpose takes half the time.
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

/* dst_stride[1] is elem_size (see cpu_copy) */
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

static int cpu_copy(const flx_slicer *self, void *dst, const void *src,
		    const flx_slice *in)
{
	flx_slice s = *in;
	int64_t idx[FLX_SLICE_MAX_DIMS] = {0};
	unsigned char *d = dst;
	const unsigned char *p = src;
	int inner;
	size_t run;
	int64_t count;

	(void)self;
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

static const flx_slicer cpu_slicer = {"cpu", cpu_copy};

const flx_slicer *flx_slicer_cpu(void)
{
	return &cpu_slicer;
}

const flx_slicer *flx_slicer_default(void)
{
	/* No device backend is built yet; the CUDA one plugs in here. */
	return &cpu_slicer;
}
