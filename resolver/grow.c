/* SPDX-License-Identifier: MIT */
#include "grow.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

int flx_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
	size_t ncap, bytes;
	void *p;

	if (need <= *cap)
		return 0;
	ncap = *cap ? *cap : 8;
	while (ncap < need) {
		if (ncap > SIZE_MAX / 2)
			return -ENOMEM;
		ncap *= 2;
	}
	if (__builtin_mul_overflow(ncap, elem, &bytes))
		return -ENOMEM;
	p = realloc(*arr, bytes);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = ncap;
	return 0;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

size_t flx_u32_sort_unique(uint32_t *v, size_t n)
{
	size_t k = 0;

	if (n > 1)
		qsort(v, n, sizeof(*v), cmp_u32);
	for (size_t i = 0; i < n; i++)
		if (k == 0 || v[i] != v[k - 1])
			v[k++] = v[i];
	return k;
}
