/* SPDX-License-Identifier: MIT */
#include "grow.h"

#include <errno.h>
#include <stdalign.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

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

#define POOL_FIRST ((size_t)64 << 10)
#define POOL_HUGE  ((size_t)2 << 20)

struct flx_pool_blk {
	flx_pool_blk *next;
	void *adopted; /* a block of flx_pool_adopt(), freed with this one */
	size_t size;   /* bytes, this header included */
	size_t used;
	bool mapped; /* munmap(), not free() */
	alignas(max_align_t) unsigned char data[];
};

/* size bytes, size-aligned (size is a power of two), straight from the
 * kernel: zeroed, and aligned as a huge page must be. */
static void *map_aligned(size_t size)
{
	unsigned char *m, *b;
	uintptr_t a;

	m = mmap(NULL, 2 * size, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	a = ((uintptr_t)m + size - 1) & ~(uintptr_t)(size - 1);
	b = (unsigned char *)a;
	if (b > m)
		munmap(m, (size_t)(b - m));
	if (b + size < m + 2 * size)
		munmap(b + size, (size_t)(m + 2 * size - (b + size)));
#ifdef MADV_HUGEPAGE
	(void)madvise(b, size, MADV_HUGEPAGE);
#endif
	return b;
}

static flx_pool_blk *pool_block(size_t size)
{
	flx_pool_blk *b;
	bool mapped = size == POOL_HUGE;

	b = mapped ? map_aligned(size) : calloc(1, size);
	if (!b)
		return NULL;
	b->size = size;
	b->used = sizeof(*b);
	b->mapped = mapped;
	return b;
}

static void pool_block_free(flx_pool_blk *b)
{
	free(b->adopted);
	if (b->mapped)
		munmap(b, b->size);
	else
		free(b);
}

void *flx_pool_alloc(flx_pool *p, size_t n)
{
	size_t al = (n + alignof(max_align_t) - 1) &
		    ~(size_t)(alignof(max_align_t) - 1);
	flx_pool_blk *b = p->head;
	void *r;

	if (al < n || al > SIZE_MAX - sizeof(*b))
		return NULL;
	if (!b || b->size - b->used < al) {
		if (!p->next)
			p->next = POOL_FIRST;
		if (al > (p->next - sizeof(*b)) / 4) {
			/* a large request gets its own block, behind the
			 * current one, whose free room stays in use */
			b = pool_block(sizeof(*b) + al);
			if (!b)
				return NULL;
			if (p->head) {
				b->next = p->head->next;
				p->head->next = b;
			} else {
				b->next = NULL;
				p->head = b;
			}
			b->used = b->size;
			return b->data;
		}
		b = pool_block(p->next);
		if (!b)
			return NULL;
		b->next = p->head;
		p->head = b;
		if (p->next < POOL_HUGE)
			p->next *= 2;
	}
	r = (unsigned char *)b + b->used;
	b->used += al;
	return r;
}

int flx_pool_adopt(flx_pool *p, void *block)
{
	/* a full block of its own, behind the one being filled */
	flx_pool_blk *b = pool_block(sizeof(*b));

	if (!b)
		return -ENOMEM;
	b->adopted = block;
	if (p->head) {
		b->next = p->head->next;
		p->head->next = b;
	} else {
		p->head = b;
	}
	return 0;
}

void flx_pool_move(flx_pool *dst, flx_pool *src)
{
	flx_pool_blk *last = src->head;

	if (!last)
		return;
	while (last->next)
		last = last->next;
	/* src's blocks go behind dst's current one: dst keeps filling it */
	if (dst->head) {
		last->next = dst->head->next;
		dst->head->next = src->head;
	} else {
		dst->head = src->head;
	}
	src->head = NULL;
}

void flx_pool_free(flx_pool *p)
{
	while (p->head) {
		flx_pool_blk *b = p->head;

		p->head = b->next;
		pool_block_free(b);
	}
	p->next = 0;
}
