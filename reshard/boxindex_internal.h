/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_BOXINDEX_INTERNAL_H
#define FLX_RESHARD_BOXINDEX_INTERNAL_H

/*
 * The box index of reshard/ (not public): boxes (chunks, pieces) sorted by
 * start along one axis, so that the boxes meeting a query box are found
 * without a scan of all of them.
 *
 * Boxes are read in place from the elements that hold them: a chunk's
 * slot of its tensor's dims block and a piece both keep ndim offsets then
 * ndim sizes (the chunk's strides follow).  gap is the distance, in
 * int64s, from off[0] to size[0].
 *
 * Thread-safety: an index is immutable once built; queries are reentrant.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Boxes (chunks, pieces) are scanned in order up to this count; sorted
 * and searched beyond. */
#define SCAN_MAX 8

typedef struct box_index {
	const char *base; /* array of elements, each holding a box */
	size_t stride;	  /* element size */
	size_t box_off;	  /* offset of the box's off[0] inside an element */
	int gap;
	int ndim;
	int axis; /* sort axis (-1: a few boxes or 0-d, every one scanned) */
	int64_t maxext; /* largest extent along axis */
	size_t n;
	uint32_t *order; /* element indices sorted by off[axis] */
	bool own_order;	 /* order was malloc'd by bix_build() */
} box_index;

/**
 * Index the n elements of stride bytes at base (borrowed: they must
 * outlive the index), each holding a box of ndim dimensions at box_off;
 * empty boxes are left out.  order: room for n indices (borrowed), or NULL
 * to have one allocated.
 * @return 0 (always, when order is given) or -ENOMEM.
 */
int bix_build(box_index *ix, const void *base, size_t stride, size_t box_off,
	      int gap, size_t n, int ndim, uint32_t *order);

/**
 * As bix_build(), over the n elements of base whose indices are idx[0..n)
 * (borrowed for the call only) instead of all of them: a query answers
 * those indices.  order: room for n indices (borrowed).  @return 0.
 */
int bix_build_subset(box_index *ix, const void *base, size_t stride,
		     size_t box_off, int gap, const uint32_t *idx, size_t n,
		     int ndim, uint32_t *order);

/** Free what bix_build() allocated (nothing when order was given). */
void bix_free(box_index *ix);

/**
 * Call fn(arg, idx) for every indexed box that meets the query box (qoff,
 * qsize), idx its element's index, until fn fails.
 * @return 0, or the first -errno fn returned.
 */
int bix_query(const box_index *ix, const int64_t *qoff, const int64_t *qsize,
	      int (*fn)(void *arg, uint32_t idx), void *arg);

/** The first indexed box (in index order) that meets the query box.
 * @return 0 and *idx, its element's index, or -ENOENT. */
int bix_find(const box_index *ix, const int64_t *qoff, const int64_t *qsize,
	     uint32_t *idx);

#endif
