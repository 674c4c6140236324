/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_ARENA_INTERNAL_H
#define FLX_RESHARD_ARENA_INTERNAL_H

/*
 * The plan's arena (not public): the memory of a plan's views, names and
 * boxes, cut from large blocks and freed all at once by arena_free().
 *
 * Thread-safety: none; an arena is filled by the one thread building its
 * plan.
 */

#include "ckpt.h"
#include "plan.h"

#include <stdbool.h>
#include <stddef.h>

/* Boxes are interned while the plan is built: the views of tensors of one
 * shape share their boxes (a model has few distinct ones), which keeps a
 * view small enough that walking all of them stays in cache. */
typedef struct box_entry {
	int ndim;
	flx_box box;
} box_entry;

struct flx_plan_arena {
	struct arena_blk *head;
	box_entry **boxes; /* open addressing; only while building */
	size_t nboxes, capboxes;
};

/** n bytes, zeroed, aligned for any type, owned by the arena.
 * @return NULL when out of memory. */
void *arena_alloc(flx_plan_arena *a, size_t n);

/** Free every block of a (NULL is ignored) and the interning table; a
 * itself stays, empty. */
void arena_free(flx_plan_arena *a);

/** The plan's copy of box (dims past ndim zero), shared by every caller
 * interning an equal box.  @return NULL when out of memory. */
const flx_box *box_intern(flx_plan_arena *a, int ndim, const flx_box *b);

#endif
