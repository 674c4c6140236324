/* SPDX-License-Identifier: MIT */
/* The plan's arena (arena_internal.h). */
#include "arena_internal.h"

#include <stdlib.h>
#include <string.h>

#define ARENA_BLOCK 65000 /* below malloc's mmap threshold: heap memory */

typedef struct arena_blk {
	struct arena_blk *next;
	size_t used, cap;
	max_align_t data[];
} arena_blk;

/* n bytes, zeroed, aligned for any type; NULL when out of memory. */
void *arena_alloc(flx_plan_arena *a, size_t n)
{
	arena_blk *b = a->head;
	size_t al = (n + _Alignof(max_align_t) - 1) &
		    ~(size_t)(_Alignof(max_align_t) - 1);
	void *p;

	if (al < n)
		return NULL;
	if (!b || b->cap - b->used < al) {
		bool own = al > ARENA_BLOCK / 4;
		size_t cap = own ? al : ARENA_BLOCK;

		if (cap > SIZE_MAX - sizeof(*b))
			return NULL;
		b = malloc(sizeof(*b) + cap);
		if (!b)
			return NULL;
		b->used = 0;
		b->cap = cap;
		/* a large block of its own goes behind the current one,
		 * whose free room stays in use */
		if (a->head && own) {
			b->next = a->head->next;
			a->head->next = b;
		} else {
			b->next = a->head;
			a->head = b;
		}
	}
	p = (char *)b->data + b->used;
	b->used += al;
	memset(p, 0, n);
	return p;
}

void arena_free(flx_plan_arena *a)
{
	while (a && a->head) {
		arena_blk *b = a->head;

		a->head = b->next;
		free(b);
	}
	if (a) {
		free(a->boxes);
		a->boxes = NULL;
	}
}

static uint64_t box_hash(int ndim, const flx_box *b)
{
	uint64_t h = (uint64_t)ndim * 0x9e3779b97f4a7c15ull;

	for (int d = 0; d < ndim; d++) {
		h = (h ^ (uint64_t)b->off[d]) * 0xff51afd7ed558ccdull;
		h = (h ^ (uint64_t)b->size[d]) * 0xc4ceb9fe1a85ec53ull;
	}
	return h ^ (h >> 29);
}

static bool box_same(int ndim, const box_entry *e, const flx_box *b)
{
	if (e->ndim != ndim)
		return false;
	for (int d = 0; d < ndim; d++)
		if (e->box.off[d] != b->off[d] || e->box.size[d] != b->size[d])
			return false;
	return true;
}

/* The plan's copy of box (dims past ndim zero).  @return NULL when out of
 * memory. */
const flx_box *box_intern(flx_plan_arena *a, int ndim, const flx_box *b)
{
	size_t i, mask;
	box_entry *e;

	if (a->nboxes + 1 > a->capboxes / 2) {
		size_t cap = a->capboxes ? 2 * a->capboxes : 256;
		box_entry **nb = calloc(cap, sizeof(*nb));

		if (!nb)
			return NULL;
		for (size_t k = 0; k < a->capboxes; k++) {
			box_entry *o = a->boxes[k];

			if (!o)
				continue;
			for (i = box_hash(o->ndim, &o->box) & (cap - 1); nb[i];
			     i = (i + 1) & (cap - 1))
				;
			nb[i] = o;
		}
		free(a->boxes);
		a->boxes = nb;
		a->capboxes = cap;
	}
	mask = a->capboxes - 1;
	for (i = box_hash(ndim, b) & mask; a->boxes[i]; i = (i + 1) & mask)
		if (box_same(ndim, a->boxes[i], b))
			return &a->boxes[i]->box;
	e = arena_alloc(a, sizeof(*e));
	if (!e)
		return NULL;
	e->ndim = ndim;
	memcpy(e->box.off, b->off, (size_t)ndim * sizeof(int64_t));
	memcpy(e->box.size, b->size, (size_t)ndim * sizeof(int64_t));
	a->boxes[i] = e;
	a->nboxes++;
	return &e->box;
}
