/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_ZCACHE_H
#define FLX_RESHARD_ZCACHE_H

/*
 * The read path of zstd-transformed items (flx_chunk.zstd,
 * flx_object.zstd): a bounded cache of decompressed windows shared by every
 * reader of a mount, fed by a few live decompression streams.
 *
 * A zstd frame written by a stream writer has no seek points: byte x of
 * the content is reached only by decoding every byte before it.  So each
 * item being read keeps a live stream (libzstd's ZSTD_DCtx and its input
 * position) that produces the item's content window after window
 * (FLX_ZCACHE_WINDOW bytes each), every window entering the cache as it is
 * produced.  A sequential reader finds the next window in the cache or has
 * the stream decode it: each byte is decompressed once.  A reader behind
 * the stream finds its window in the cache, or (evicted) restarts a stream
 * from the start of the frame.  Readers of one item share its stream: the
 * one that takes it decodes, the others wait for it and then find their
 * windows cached.
 *
 * Decoding in place: a frame whose window (the reach of its
 * back-references) is at most FLX_ZCACHE_WINDOW less one block (torch's
 * level 3: 2 MiB) is decoded straight into the cache's windows, each
 * window's history being the window before it, which its stream keeps
 * pinned; other frames are decoded through libzstd's own history buffer
 * and copied out of it.
 *
 * Memory: at most cap / FLX_ZCACHE_WINDOW windows, each with room for one
 * block past its end (touched when first filled), plus FLX_ZCACHE_STREAMS
 * streams of 128 KiB of input each and, where no slot takes their
 * windows, two windows of their own (in place) or one and the frame's own
 * window (at most 8 MiB, zstditem.h), allocated when first used.
 * Replacement is least recently used among unpinned windows, a stream's
 * history counting as unpinned while no reader holds the stream (the
 * stream then restarts when used); a window no slot can take is served
 * from its stream.
 *
 * Decode-ahead: a reader that reads an item's windows in order finds the
 * next FLX_ZCACHE_AHEAD windows decoded by a worker thread while it copies
 * the current one out.  Streams of different items are decoded by
 * different workers at once: a worker is started when a stream is wanted
 * and none is parked, up to the least of the online CPUs,
 * FLX_ZCACHE_STREAMS and one per 4 * FLX_ZCACHE_AHEAD windows of the
 * cache (none below that); a worker with nothing wanted parks until the
 * cache is freed.  Workers take their windows from the same slots (the
 * budget above), each holding at most one slot at a time, and stop
 * decoding a stream when its reader stops, seeks back or the cache is
 * freed.
 *
 * Thread-safety: every function but new/free may be called from any
 * number of threads.
 */

#include "ckpt.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* 2 MiB (the window of the frames torch's level 3 writes) and one zstd
 * block: such a frame is decoded in place (zcache.c). */
#define FLX_ZCACHE_WINDOW  ((2u << 20) + (128u << 10))
#define FLX_ZCACHE_STREAMS 8
/* Windows a stream decodes ahead of a reader that follows it. */
#define FLX_ZCACHE_AHEAD 2

typedef struct flx_zcache flx_zcache;

/** One zstd item: the frame's window in a backing file. */
typedef struct flx_zitem {
	uint32_t file; /* index into ckpt->files */
	uint64_t off;  /* frame start in that file */
	uint64_t len;  /* frame bytes */
} flx_zitem;

typedef struct flx_zcache_stats {
	uint64_t hits;	   /* windows found in the cache */
	uint64_t misses;   /* windows a reader had a stream decode */
	uint64_t restarts; /* streams started from a frame's first byte */
	uint64_t decoded;  /* content bytes decompressed */
	uint64_t served;   /* content bytes copied out to readers */
	uint64_t windows;  /* windows allocated so far (memory in use) */
	uint64_t ahead; /* of decoded: bytes the decode-ahead workers decoded */
	uint64_t ahead_peak; /* most windows decoded ahead at the same time */
	uint64_t workers;    /* decode-ahead workers started */
	uint64_t inplace;    /* of decoded: bytes decoded in place */
} flx_zcache_stats;

/**
 * A cache of cap bytes of decompressed windows (below one window: none
 * cached, every read decodes through a stream).
 * @return 0 and *out (owned; flx_zcache_free()), or -ENOMEM.
 */
int flx_zcache_new(uint64_t cap, flx_zcache **out);

/** Free the cache, its windows and streams; NULL is ignored.  No read may
 * be running. */
void flx_zcache_free(flx_zcache *z);

/**
 * Copy bytes [skip, skip + len) of a run of elements of esz bytes of item
 * it's content, element i starting at content offset src + i * stride
 * (stride == esz: a contiguous run) into dst.  z NULL: through a private
 * stream for this call alone (decoding the item up to the run).  The
 * item's file is checked unchanged since mount (flx_file_verify()) once
 * per call and before every read of it, cached windows or not.
 * @return 0; -EIO when the file changed, the frame no longer decodes or
 *         ends before the run; -ENOMEM.
 */
int flx_zcache_read(flx_zcache *z, const flx_ckpt *c, const flx_zitem *it,
		    uint64_t src, uint64_t stride, unsigned esz, uint64_t skip,
		    void *dst, size_t len);

/** A window of an item's content pinned in a cache slot: data[0..n) stay
 * as they are (never evicted, never reused) until flx_zcache_unpin(). */
typedef struct flx_zpin {
	const unsigned char *data;
	size_t n;
	void *slot; /* the cache's, opaque */
} flx_zpin;

/**
 * The decision of a zero-copy reply: whether content bytes [a, a+n) of an
 * item lie in windows that can be pinned (n > 0, at most max windows).
 * @return the number of windows [a, a+n) touches, or 0 when above max.
 */
size_t flx_zcache_windows(uint64_t a, uint64_t n, size_t max);

/**
 * Pin window a / FLX_ZCACHE_WINDOW of it's content in a slot of z (from the
 * cache, or decoded into it as flx_zcache_read() would).  The item's file
 * is checked unchanged since mount first.
 * @return 0 and *out (release with flx_zcache_unpin()); -ENOBUFS when no
 *         slot could hold it (every slot pinned, or a cache of no slot):
 *         read with flx_zcache_read() instead; -EIO when the file changed,
 *         the frame fails or the content ends before a; -ENOMEM.
 */
int flx_zcache_pin(flx_zcache *z, const flx_ckpt *c, const flx_zitem *it,
		   uint64_t a, flx_zpin *out);

/** Release a pin of flx_zcache_pin() (its slot may be evicted and reused
 * after), counting served bytes of it as served to a reader (0: the pin
 * went unused); a zeroed pin is ignored. */
void flx_zcache_unpin(flx_zcache *z, flx_zpin *p, size_t served);

/** Whether any chunk or object of c is a zstd item.  Thread-safe. */
bool flx_ckpt_has_zstd(const flx_ckpt *c);

/** Wait until the decode-ahead workers have no wanted window left to
 * decode (tests, benchmarks: the counters are final then unless reads
 * run). */
void flx_zcache_settle(flx_zcache *z);

/** Counters since flx_zcache_new() (a consistent snapshot). */
void flx_zcache_stats_get(flx_zcache *z, flx_zcache_stats *out);

#endif
