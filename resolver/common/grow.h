/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_GROW_H
#define FLX_RESOLVER_GROW_H

#include <stddef.h>
#include <stdint.h>

/**
 * Make *arr (of *cap elements of elem bytes) hold at least need elements,
 * doubling its capacity.  *arr and *cap are updated only on success.
 * @return 0 or -ENOMEM (also when the byte size would overflow).
 */
int flx_grow(void **arr, size_t *cap, size_t need, size_t elem);

/*
 * A bump allocator for many small allocations that are freed together.
 * Blocks double from 64 KiB; from 2 MiB on they are mapped directly,
 * 2 MiB-aligned, and offered to transparent huge pages.  That keeps the
 * cost of fresh memory independent of the calling thread: a thread's
 * malloc arena gets 4 KiB pages even when the main arena has huge ones
 * (docs/performance.md).  A pool is used by one thread at a time.
 * Zero-initialise it.
 */
typedef struct flx_pool_blk flx_pool_blk;
typedef struct flx_pool {
	flx_pool_blk *head; /* the block being filled, then older ones */
	size_t next;	    /* size of the next block */
} flx_pool;

/** n bytes, zeroed, aligned for any type.  @return NULL when out of
 * memory.  Valid until flx_pool_free(). */
void *flx_pool_alloc(flx_pool *p, size_t n);

/** Make block (from malloc(), or NULL) one of p's, freed with the pool.
 * @return 0, or -ENOMEM (block is still the caller's). */
int flx_pool_adopt(flx_pool *p, void *block);

/** Give every block of src to dst (src ends empty). */
void flx_pool_move(flx_pool *dst, flx_pool *src);

/** Free every block; the pool ends empty. */
void flx_pool_free(flx_pool *p);

/** Sort v[0..n) ascending and drop repeats.  @return the new length. */
size_t flx_u32_sort_unique(uint32_t *v, size_t n);

#endif
