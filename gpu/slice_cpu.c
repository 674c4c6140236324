/* SPDX-License-Identifier: MIT */
#include "slice.h"

#include <errno.h>
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
		for (int64_t k = 0; k < count; k++)
			memcpy(d + doff + k * s.dst_stride[inner],
			       p + soff + k * s.src_stride[inner], run);
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
