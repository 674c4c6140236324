/* SPDX-License-Identifier: MIT */
#include "shape.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>

uint64_t flx_numel(int ndim, const int64_t *shape)
{
	uint64_t n = 1;

	for (int i = 0; i < ndim; i++)
		n *= (uint64_t)shape[i];
	return n;
}

int flx_shape_bytes(int ndim, const int64_t *shape, unsigned elem_size,
		    uint64_t *numel, uint64_t *bytes)
{
	uint64_t n = 1;

	for (int d = 0; d < ndim; d++)
		if (shape[d] &&
		    __builtin_mul_overflow(n, (uint64_t)shape[d], &n))
			return -EOVERFLOW;
	if (n > (uint64_t)INT64_MAX / elem_size)
		return -EOVERFLOW;
	for (int d = 0; d < ndim; d++)
		if (shape[d] == 0)
			n = 0;
	if (numel)
		*numel = n;
	if (bytes)
		*bytes = n * elem_size;
	return 0;
}

int flx_strided_span(int ndim, const int64_t *size, const int64_t *stride,
		     uint64_t *span)
{
	uint64_t last = 0;

	*span = 0;
	for (int d = 0; d < ndim; d++)
		if (size[d] == 0)
			return 0;
	for (int d = 0; d < ndim; d++) {
		uint64_t step;

		if (__builtin_mul_overflow((uint64_t)(size[d] - 1),
					   (uint64_t)stride[d], &step) ||
		    __builtin_add_overflow(last, step, &last))
			return -ERANGE;
	}
	if (__builtin_add_overflow(last, 1, span))
		return -ERANGE;
	return 0;
}

int flx_strided_disjoint(int ndim, const int64_t *size, const int64_t *stride)
{
	bool done[FLX_MAX_DIMS] = {false};
	uint64_t reach = 1; /* the smaller axes span [0, reach) */

	for (int d = 0; d < ndim; d++)
		if (size[d] == 0)
			return 0; /* no elements */
	for (;;) {
		int next = -1;

		for (int d = 0; d < ndim; d++)
			if (!done[d] && size[d] > 1 &&
			    (next < 0 || stride[d] < stride[next]))
				next = d;
		if (next < 0)
			return 0;
		if ((uint64_t)stride[next] < reach)
			return -EINVAL;
		/* fits: no more than the span, which the caller checked */
		reach += (uint64_t)(size[next] - 1) * (uint64_t)stride[next];
		done[next] = true;
	}
}

void flx_fmt_dims(char *buf, size_t len, int ndim, const int64_t *v)
{
	size_t n = (size_t)snprintf(buf, len, "[");

	for (int i = 0; i < ndim && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? "," : "",
				      (long long)v[i]);
	if (n < len)
		snprintf(buf + n, len - n, "]");
}

void flx_flat_boxes(int ndim, const int64_t *blk, int64_t start, int64_t stop,
		    int64_t off[][FLX_MAX_DIMS], int64_t size[][FLX_MAX_DIMS],
		    int64_t *first, unsigned *n)
{
	unsigned k = 0;

	if (ndim == 0 && start < stop) {
		first[k++] = start;
		start = stop;
	}
	while (start < stop) {
		int64_t inner = 1, rest = start, c;
		int j = ndim - 1;

		/* the sub-block unit: grows while start sits on its boundary
		 * and a whole one fits */
		while (j > 0 && start % (inner * blk[j]) == 0 &&
		       stop - start >= inner * blk[j]) {
			inner *= blk[j];
			j--;
		}
		for (int d = ndim - 1; d >= 0; d--) {
			off[k][d] = rest % blk[d];
			rest /= blk[d];
			size[k][d] = d < j ? 1 : blk[d];
		}
		c = blk[j] - off[k][j];
		if (c > (stop - start) / inner)
			c = (stop - start) / inner;
		size[k][j] = c;
		first[k++] = start;
		start += c * inner;
	}
	*n = k;
}
