/* SPDX-License-Identifier: MIT */
/* The sorted box index (boxindex_internal.h). */
#include "boxindex_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const int64_t *bix_off(const box_index *ix, size_t i)
{
	return (const int64_t *)(ix->base + i * ix->stride + ix->box_off);
}

static int cmp_u32_by_start(const void *a, const void *b, void *arg)
{
	const box_index *ix = arg;
	int64_t sa = bix_off(ix, *(const uint32_t *)a)[ix->axis];
	int64_t sb = bix_off(ix, *(const uint32_t *)b)[ix->axis];

	return sa < sb ? -1 : sa > sb;
}

/* Sort order by the starts along ix->axis; an order already sorted (chunks
 * are mostly listed so) is left as it is, as the stable sort leaves it. */
static void sort_by_start(box_index *ix)
{
	size_t i = 1;

	while (i < ix->n &&
	       cmp_u32_by_start(&ix->order[i - 1], &ix->order[i], ix) <= 0)
		i++;
	if (i < ix->n)
		qsort_r(ix->order, ix->n, sizeof(uint32_t), cmp_u32_by_start,
			ix);
}

static bool box_empty(int ndim, const int64_t *size)
{
	for (int d = 0; d < ndim; d++)
		if (size[d] == 0)
			return true;
	return false;
}

static void bix_init(box_index *ix, const void *base, size_t stride,
		     size_t box_off, int gap, int ndim, uint32_t *order)
{
	memset(ix, 0, sizeof(*ix));
	ix->base = base;
	ix->stride = stride;
	ix->box_off = box_off;
	ix->gap = gap;
	ix->ndim = ndim;
	ix->axis = ndim ? 0 : -1;
	ix->order = order;
}

/* Sort ix->order[0..ix->n) along the axis with the most distinct starts,
 * so a query scans as few candidates as possible. */
static void bix_sort(box_index *ix)
{
	int best = 0, ndim = ix->ndim;
	size_t best_distinct = 0;

	/* a few boxes are scanned faster than sorted and searched */
	if (ndim == 0 || ix->n <= SCAN_MAX) {
		ix->axis = -1;
		return;
	}
	for (int d = 0; d < ndim; d++) {
		size_t distinct = 0;

		ix->axis = d;
		sort_by_start(ix);
		for (size_t i = 0; i < ix->n; i++)
			distinct +=
			    i == 0 || bix_off(ix, ix->order[i])[d] !=
					  bix_off(ix, ix->order[i - 1])[d];
		if (distinct > best_distinct) {
			best_distinct = distinct;
			best = d;
		}
	}
	ix->axis = best;
	sort_by_start(ix);
	for (size_t i = 0; i < ix->n; i++) {
		int64_t e = bix_off(ix, ix->order[i])[ix->gap + ix->axis];

		if (e > ix->maxext)
			ix->maxext = e;
	}
}

int bix_build(box_index *ix, const void *base, size_t stride, size_t box_off,
	      int gap, size_t n, int ndim, uint32_t *order)
{
	bix_init(ix, base, stride, box_off, gap, ndim, order);
	if (!order) {
		ix->order = malloc((n ? n : 1) * sizeof(uint32_t));
		if (!ix->order)
			return -ENOMEM;
		ix->own_order = true;
	}
	for (size_t i = 0; i < n; i++)
		if (!box_empty(ndim, bix_off(ix, i) + gap))
			ix->order[ix->n++] = (uint32_t)i;
	bix_sort(ix);
	return 0;
}

int bix_build_subset(box_index *ix, const void *base, size_t stride,
		     size_t box_off, int gap, const uint32_t *idx, size_t n,
		     int ndim, uint32_t *order)
{
	bix_init(ix, base, stride, box_off, gap, ndim, order);
	for (size_t i = 0; i < n; i++)
		if (!box_empty(ndim, bix_off(ix, idx[i]) + gap))
			ix->order[ix->n++] = idx[i];
	bix_sort(ix);
	return 0;
}

void bix_free(box_index *ix)
{
	if (ix->own_order)
		free(ix->order);
	ix->order = NULL;
}

static bool boxes_meet(int ndim, const int64_t *aoff, const int64_t *asize,
		       const int64_t *boff, const int64_t *bsize)
{
	for (int d = 0; d < ndim; d++)
		if (aoff[d] >= boff[d] + bsize[d] ||
		    boff[d] >= aoff[d] + asize[d])
			return false;
	return true;
}

/* Position of the first candidate whose start could reach lo along the
 * index axis (start > lo - maxext). */
static size_t bix_first(const box_index *ix, int64_t lo)
{
	size_t a = 0, b = ix->n;

	if (ix->axis < 0)
		return 0;
	while (a < b) {
		size_t m = a + (b - a) / 2;

		if (bix_off(ix, ix->order[m])[ix->axis] <= lo - ix->maxext)
			a = m + 1;
		else
			b = m;
	}
	return a;
}

/* Position (in order) of the first box from position i on that meets the
 * query box (qoff, qsize); ix->n when there is none.  hi: the query's end
 * along the index axis. */
static size_t next_hit(const box_index *ix, const int64_t *qoff,
		       const int64_t *qsize, int64_t hi, size_t i)
{
	for (; i < ix->n; i++) {
		const int64_t *b = bix_off(ix, ix->order[i]);

		if (ix->axis >= 0 && b[ix->axis] >= hi)
			return ix->n;
		if (boxes_meet(ix->ndim, b, b + ix->gap, qoff, qsize))
			return i;
	}
	return ix->n;
}

int bix_query(const box_index *ix, const int64_t *qoff, const int64_t *qsize,
	      int (*fn)(void *arg, uint32_t idx), void *arg)
{
	int64_t lo = ix->axis >= 0 ? qoff[ix->axis] : 0;
	int64_t hi = ix->axis >= 0 ? lo + qsize[ix->axis] : 1;

	if (box_empty(ix->ndim, qsize))
		return 0;
	for (size_t i = next_hit(ix, qoff, qsize, hi, bix_first(ix, lo));
	     i < ix->n; i = next_hit(ix, qoff, qsize, hi, i + 1)) {
		int rc = fn(arg, ix->order[i]);

		if (rc)
			return rc;
	}
	return 0;
}

int bix_find(const box_index *ix, const int64_t *qoff, const int64_t *qsize,
	     uint32_t *idx)
{
	int64_t lo = ix->axis >= 0 ? qoff[ix->axis] : 0;
	int64_t hi = ix->axis >= 0 ? lo + qsize[ix->axis] : 1;
	size_t i;

	if (box_empty(ix->ndim, qsize))
		return -ENOENT;
	i = next_hit(ix, qoff, qsize, hi, bix_first(ix, lo));
	if (i == ix->n)
		return -ENOENT;
	*idx = ix->order[i];
	return 0;
}
