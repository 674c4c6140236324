/* SPDX-License-Identifier: MIT */
/*
 * Block cache: a fixed array of slots, a chained hash table on (file,
 * block) and a use clock for replacement.  One mutex guards it all; the
 * pread of a miss and the callers' copies run outside it (a slot being read
 * is marked LOADING and pinned, so nobody evicts or reads it half-filled).
 * Replacement scans the slots for the least recently used unpinned one: it
 * runs only on a miss, which costs a pread of a whole block anyway.
 */
#include "bcache.h"

#include "reader.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

enum { S_FREE = 0, S_LOADING, S_READY };

typedef struct slot {
	uint64_t blk;
	uint64_t used; /* clock value of the last get */
	uint32_t file;
	uint32_t refs;
	int32_t hnext; /* next slot in its hash chain, -1 at the end */
	int state;
	size_t len;
	unsigned char *data; /* block + TAIL bytes, allocated on first use */
} slot;

struct flx_bcache {
	pthread_mutex_t mu;
	pthread_cond_t loaded; /* a LOADING slot became READY or FREE */
	size_t block;
	size_t nslots;
	slot *slots;
	int32_t *heads; /* hash buckets, -1 empty */
	size_t mask;	/* buckets - 1 */
	uint64_t clock;
	flx_bcache_stats st;
};

static size_t bucket(const flx_bcache *c, uint32_t file, uint64_t blk)
{
	uint64_t h = (blk ^ ((uint64_t)file << 40)) * 0x9E3779B97F4A7C15ull;

	return (size_t)(h >> 32) & c->mask;
}

int flx_bcache_new(uint64_t cap, size_t block, flx_bcache **out)
{
	flx_bcache *c;
	size_t nb = 1;

	*out = NULL;
	if (block < 64 || (block & (block - 1)) || block > (1u << 30))
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->block = block;
	/* more blocks than fit in memory are refused by the option parser;
	 * bound the slot array anyway */
	c->nslots =
	    cap / block > (1u << 24) ? (1u << 24) : (size_t)(cap / block);
	while (nb < 2 * c->nslots)
		nb <<= 1;
	c->mask = nb - 1;
	c->slots = calloc(c->nslots ? c->nslots : 1, sizeof(slot));
	c->heads = malloc(nb * sizeof(int32_t));
	if (!c->slots || !c->heads) {
		free(c->slots);
		free(c->heads);
		free(c);
		return -ENOMEM;
	}
	for (size_t i = 0; i < nb; i++)
		c->heads[i] = -1;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->loaded, NULL);
	*out = c;
	return 0;
}

void flx_bcache_free(flx_bcache *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nslots; i++)
		free(c->slots[i].data);
	free(c->slots);
	free(c->heads);
	pthread_cond_destroy(&c->loaded);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

size_t flx_bcache_block(const flx_bcache *c)
{
	return c->block;
}

size_t flx_bcache_slots(const flx_bcache *c)
{
	return c->nslots;
}

static int32_t find(const flx_bcache *c, uint32_t file, uint64_t blk)
{
	int32_t i = c->heads[bucket(c, file, blk)];

	while (i >= 0 && (c->slots[i].file != file || c->slots[i].blk != blk ||
			  c->slots[i].state == S_FREE))
		i = c->slots[i].hnext;
	return i;
}

static void unlink_slot(flx_bcache *c, int32_t i)
{
	slot *s = &c->slots[i];
	int32_t *p = &c->heads[bucket(c, s->file, s->blk)];

	while (*p != i)
		p = &c->slots[*p].hnext;
	*p = s->hnext;
	s->hnext = -1;
	s->state = S_FREE;
}

/* The least recently used slot nobody holds, or -1. */
static int32_t victim(const flx_bcache *c)
{
	int32_t best = -1;

	for (size_t i = 0; i < c->nslots; i++) {
		const slot *s = &c->slots[i];

		if (s->state == S_FREE)
			return (int32_t)i;
		if (s->refs == 0 && s->state == S_READY &&
		    (best < 0 || s->used < c->slots[best].used))
			best = (int32_t)i;
	}
	return best;
}

size_t flx_bcache_block_len(size_t block, uint64_t file_size, uint64_t blk)
{
	uint64_t start;

	if (blk > file_size / block) /* also keeps blk * block in range */
		return 0;
	start = blk * block;
	if (start >= file_size)
		return 0;
	return file_size - start < block + FLX_BCACHE_TAIL
		   ? (size_t)(file_size - start)
		   : block + FLX_BCACHE_TAIL;
}

static void fill(flx_bref *ref, const flx_bcache *c, int32_t i, bool loaded)
{
	const slot *s = &c->slots[i];

	ref->data = s->data;
	ref->start = s->blk * c->block;
	ref->len = s->len;
	ref->loaded = loaded;
	ref->slot = i;
}

/*
 * Under the lock: pin block (file, blk) when cached (0, *slot), or take a
 * slot for it, LOADING and pinned (1, *slot); -EAGAIN when every slot is
 * pinned, or, unless wait, when another thread is loading the block.
 */
static int reserve(flx_bcache *c, uint32_t file, uint64_t blk, bool wait,
		   int32_t *slot_out)
{
	int32_t i;
	slot *s;

	for (;;) {
		i = find(c, file, blk);
		if (i < 0 || c->slots[i].state == S_READY)
			break;
		if (!wait) {
			c->st.bypassed++;
			return -EAGAIN;
		}
		pthread_cond_wait(&c->loaded, &c->mu); /* LOADING elsewhere */
	}
	if (i >= 0) {
		s = &c->slots[i];
		s->refs++;
		s->used = ++c->clock;
		c->st.hits++;
		*slot_out = i;
		return 0;
	}
	i = victim(c);
	if (i < 0) {
		c->st.bypassed++;
		return -EAGAIN;
	}
	s = &c->slots[i];
	if (s->state != S_FREE) {
		unlink_slot(c, i);
		c->st.evictions++;
	}
	s->file = file;
	s->blk = blk;
	s->state = S_LOADING;
	s->refs = 1;
	s->used = ++c->clock;
	s->hnext = c->heads[bucket(c, file, blk)];
	c->heads[bucket(c, file, blk)] = i;
	c->st.misses++;
	if (!s->data) {
		s->data = malloc(c->block + FLX_BCACHE_TAIL);
		if (s->data)
			c->st.blocks++;
	}
	*slot_out = i;
	return 1;
}

/* Under the lock: the LOADING slot i filled with len bytes (rc 0: READY,
 * still pinned, into *ref) or not (FREE, unpinned). */
static void complete(flx_bcache *c, int32_t i, int rc, size_t len,
		     flx_bref *ref)
{
	slot *s = &c->slots[i];

	if (rc) {
		unlink_slot(c, i);
		s->refs = 0;
	} else {
		s->len = len;
		s->state = S_READY;
		fill(ref, c, i, true);
	}
	pthread_cond_broadcast(&c->loaded);
}

int flx_bcache_get(flx_bcache *c, uint32_t file, int fd, uint64_t file_size,
		   uint64_t blk, flx_bref *ref)
{
	size_t want = flx_bcache_block_len(c->block, file_size, blk);
	int32_t i;
	slot *s;
	int rc;

	if (!want)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	rc = reserve(c, file, blk, true, &i);
	if (rc <= 0) {
		if (rc == 0)
			fill(ref, c, i, false);
		pthread_mutex_unlock(&c->mu);
		return rc;
	}
	s = &c->slots[i];
	pthread_mutex_unlock(&c->mu);

	/* the slot is ours (LOADING, pinned): read outside the lock */
	rc = s->data ? flx_pread_full(fd, s->data, want, blk * c->block)
		     : -ENOMEM;

	pthread_mutex_lock(&c->mu);
	complete(c, i, rc, want, ref);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int flx_bcache_claim(flx_bcache *c, uint32_t file, uint64_t file_size,
		     uint64_t blk, flx_bref *ref, unsigned char **dst)
{
	size_t want = flx_bcache_block_len(c->block, file_size, blk);
	int32_t i;
	int rc;

	if (!want)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	rc = reserve(c, file, blk, false, &i);
	if (rc == 0) {
		fill(ref, c, i, false);
		*dst = NULL;
	} else if (rc == 1 && !c->slots[i].data) {
		complete(c, i, -ENOMEM, 0, ref);
		rc = -ENOMEM;
	} else if (rc == 1) {
		*ref = (flx_bref){.data = c->slots[i].data,
				  .start = blk * c->block,
				  .len = want,
				  .loaded = true,
				  .slot = i};
		*dst = c->slots[i].data;
		rc = 0;
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

void flx_bcache_filled(flx_bcache *c, flx_bref *ref, int rc)
{
	size_t len = ref->len;

	pthread_mutex_lock(&c->mu);
	complete(c, ref->slot, rc, len, ref);
	pthread_mutex_unlock(&c->mu);
	if (rc)
		ref->slot = -1;
}

void flx_bcache_put(flx_bcache *c, flx_bref *ref)
{
	if (!ref || ref->slot < 0)
		return;
	pthread_mutex_lock(&c->mu);
	c->slots[ref->slot].refs--;
	pthread_mutex_unlock(&c->mu);
	ref->slot = -1;
}

void flx_bcache_stats_get(flx_bcache *c, flx_bcache_stats *out)
{
	pthread_mutex_lock(&c->mu);
	*out = c->st;
	pthread_mutex_unlock(&c->mu);
}
