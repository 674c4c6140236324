/* SPDX-License-Identifier: MIT */
/*
 * The CPU slicer against a naive oracle (one element at a time through an
 * odometer over the slice's index space): random shapes and strides in up
 * to 4 dimensions, element sizes of every dtype and an odd one, and the
 * transposes the strided gathers send (2-D, the source dense along the
 * outer axis), whose tiled path must give the same bytes at every size,
 * multiples of the tile or not.  Bytes outside the destination slice stay
 * untouched.
 */
#include "check.h"
#include "slice.h"

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

static void check_slice(const flx_slice *s)
{
	const flx_slicer *sl = flx_slicer_cpu();
	size_t ns = extent(s, 0), nd = extent(s, 1);
	unsigned char *src = malloc(ns), *want = malloc(nd), *got = malloc(nd);

	for (size_t i = 0; i < ns; i++)
		src[i] = (unsigned char)(i * 131 + i / 256 + 1);
	memset(want, 0xEE, nd);
	memset(got, 0xEE, nd);
	oracle(want, src, s);
	CHECK_EQ(sl->copy(sl, got, src, s), 0);
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

int main(void)
{
	static const size_t esz[] = {1, 2, 3, 4, 8, 16};
	unsigned seed = 12345;

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
	return CHECK_RESULT();
}
