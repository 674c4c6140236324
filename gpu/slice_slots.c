/* SPDX-License-Identifier: MIT */
#include "slice_slots.h"

#include <errno.h>
#include <stdlib.h>

int flx_slots_init(flx_slots *t, size_t n)
{
	if (n < 1 || n >= (1u << 30))
		return -EINVAL;
	for (t->nbuckets = 1; t->nbuckets < 2 * n; t->nbuckets *= 2)
		;
	t->s = calloc(n, sizeof(*t->s));
	t->head = malloc(t->nbuckets * sizeof(*t->head));
	if (!t->s || !t->head)
		return -ENOMEM;
	t->n = n;
	for (size_t b = 0; b < t->nbuckets; b++)
		t->head[b] = -1;
	return 0;
}

void flx_slots_free(flx_slots *t)
{
	free(t->s);
	free(t->head);
	t->s = NULL;
	t->head = NULL;
	t->n = t->nbuckets = 0;
}

static size_t bucket(const flx_slots *t, uint64_t origin,
		     const flx_slice_block *k)
{
	uint64_t h = origin * 0x9E3779B97F4A7C15ull ^
		     (k->file + 1ull) * 0xC2B2AE3D27D4EB4Full ^
		     (k->start >> 8) * 0x165667B19E3779F9ull;

	return (size_t)((h ^ h >> 29) & (t->nbuckets - 1));
}

static bool same(const flx_slot *s, uint64_t origin, const flx_slice_block *k)
{
	return s->origin == origin && s->key.file == k->file &&
	       s->key.start == k->start && s->key.len == k->len;
}

/* The published slot holding k of origin, or -1. */
static int32_t find(const flx_slots *t, uint64_t origin,
		    const flx_slice_block *k)
{
	for (int32_t i = t->head[bucket(t, origin, k)]; i >= 0;
	     i = t->s[i].next)
		if (same(&t->s[i], origin, k))
			return i;
	return -1;
}

static void unpublish(flx_slots *t, int32_t i)
{
	flx_slot *s = &t->s[i];
	int32_t *at;

	if (!s->published)
		return;
	at = &t->head[bucket(t, s->origin, &s->key)];
	while (*at != i)
		at = &t->s[*at].next;
	*at = s->next;
	s->published = false;
}

int flx_slots_hold(flx_slots *t, uint64_t origin, const flx_slice_block *k,
		   int32_t *slot, bool *hit)
{
	int32_t i = origin ? find(t, origin, k) : -1;

	*hit = i >= 0;
	for (size_t j = 0; !*hit && j < t->n; j++)
		if (!t->s[j].ref && (i < 0 || t->s[j].tick < t->s[i].tick))
			i = (int32_t)j;
	if (i < 0)
		return -EAGAIN;
	if (!*hit) {
		unpublish(t, i);
		t->s[i].origin = origin;
		t->s[i].key = *k;
	}
	t->s[i].ref++;
	t->s[i].tick = ++t->tick;
	*slot = i;
	return 0;
}

void flx_slots_publish(flx_slots *t, int32_t i)
{
	flx_slot *s = &t->s[i];
	size_t h;

	if (!s->origin || s->published || find(t, s->origin, &s->key) >= 0)
		return;
	h = bucket(t, s->origin, &s->key);
	s->next = t->head[h];
	t->head[h] = i;
	s->published = true;
}

void flx_slots_release(flx_slots *t, const int32_t *held, size_t n, bool drop)
{
	for (size_t j = 0; j < n; j++) {
		t->s[held[j]].ref--;
		if (drop)
			unpublish(t, held[j]);
	}
}
