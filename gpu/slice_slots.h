/* SPDX-License-Identifier: MIT */
#ifndef FLX_GPU_SLICE_SLOTS_H
#define FLX_GPU_SLICE_SLOTS_H

/*
 * The table of blocks a device backend keeps across batches (not public;
 * slice_cuda.cu holds the bytes, one slot each, this the bookkeeping, so
 * that test_slots checks it on the host).
 *
 * Slot i holds one block of the backing files.  A published slot is
 * findable by its key (origin, file, start, len): its bytes are that
 * block's, or are being copied there behind a marker the backend recorded
 * before publishing (slice_cuda.cu: an event).  A held slot (ref > 0) is
 * used by a batch now and is not taken for another block; a slot with
 * ref 0 may be, the least recently held first.  Origin 0 is never
 * published (slice.h: such blocks are the batch's alone).
 *
 * Thread-safety: none; the caller serializes every call on one table
 * (slice_cuda.cu: the device's mutex).
 */

#include "slice.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flx_slot {
	uint64_t origin;
	flx_slice_block key;
	int32_t next; /* hash chain of published slots */
	unsigned ref; /* batches holding it */
	bool published;
	uint64_t tick; /* when last held */
} flx_slot;

typedef struct flx_slots {
	flx_slot *s;
	size_t n;
	int32_t *head; /* nbuckets chains, a power of two */
	size_t nbuckets;
	uint64_t tick;
} flx_slots;

/** A table of n slots (n >= 1, < 2^30), none published, into *t (zeroed
 * by the caller; flx_slots_free() after, whatever the result).
 * @return 0, -EINVAL (n out of range), -ENOMEM. */
int flx_slots_init(flx_slots *t, size_t n);

/** Free what t holds (a zeroed t: nothing). */
void flx_slots_free(flx_slots *t);

/**
 * Hold a slot for block k of origin: the published one holding it (*hit
 * true), or the least recently held slot with ref 0, unpublished and
 * given k's key (*hit false: the caller fills it, then publishes it).
 * @return 0 and *slot; -EAGAIN when every slot is held.
 */
int flx_slots_hold(flx_slots *t, uint64_t origin, const flx_slice_block *k,
		   int32_t *slot, bool *hit);

/** Make held slot i findable, unless its origin is 0 or another slot
 * holding its block was published meanwhile (then i stays the holder's
 * alone, and is free again once released). */
void flx_slots_publish(flx_slots *t, int32_t i);

/** Let go of the n slots held[]; drop: unpublish them too (their copies
 * may not have happened). */
void flx_slots_release(flx_slots *t, const int32_t *held, size_t n, bool drop);

#ifdef __cplusplus
}
#endif

#endif
