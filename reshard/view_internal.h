/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_VIEW_INTERNAL_H
#define FLX_RESHARD_VIEW_INTERNAL_H

/*
 * What the placement (plan.c) needs of the views (view.c) and nothing
 * public: the view's layout and its constructor into a plan's arena.
 *
 * Thread-safety: view_build() fills its arena and scratch (one thread per
 * plan being built); a built view is immutable.
 */

#include "arena_internal.h"
#include "boxindex_internal.h"
#include "view.h"

#include <stdbool.h>
#include <stdint.h>

/*
 * One allocation per view: the struct, its pieces (view.c), then (more than
 * SCAN_MAX pieces) the piece index and its order array, then (a view of
 * its own) its box.  A plan's views live in its arena and share interned
 * boxes; flx_view_new()'s are malloc'd alone.
 */
struct flx_view {
	const flx_ckpt *ckpt;
	const flx_tensor *t;
	const flx_box *box;
	uint64_t bytes;
	uint32_t npieces;
	uint16_t esz;
	uint8_t ndim;
	bool standalone; /* freed by flx_view_free() */
	bool whole;	 /* each piece a whole chunk, kept as its number */
	box_index *pix;	 /* NULL: few pieces, scanned */
};

/* Chunk indices met by a view's box, gathered before the view is sized;
 * the buffer is reused from one view to the next (free idx when done). */
typedef struct scratch {
	uint32_t *idx;
	size_t n, cap;
} scratch;

/** The chunk index of tensor t, its order in small[0..nsmall) when it
 * fits (else allocated; bix_free() it).  @return 0 or -ENOMEM. */
int chunk_index(const flx_tensor *t, box_index *ix, uint32_t *small,
		size_t nsmall);

/**
 * Build the view of box over tensor t, whose chunks are indexed by chunks;
 * from arena a (the view then belongs to the arena), or malloc'd alone
 * when a is NULL (flx_view_free()).  sc: scratch space (emptied here).
 * @return 0 and *out, or -errno with err (-EINVAL: box outside the tensor;
 *         -EIO: the pieces do not tile the box, a bug; -ENOMEM).
 */
int view_build(const flx_ckpt *ckpt, const flx_tensor *t,
	       const box_index *chunks, const flx_box *box, flx_plan_arena *a,
	       scratch *sc, flx_view **out, flx_error *err);

#endif
