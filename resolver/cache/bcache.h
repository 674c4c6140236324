/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_BCACHE_H
#define FLX_RESHARD_BCACHE_H

/*
 * A bounded cache of backing-file blocks for strided gathers.
 *
 * A chunk saved with a strided innermost axis (a transposed tensor saved
 * as-is) scatters every target row over the whole chunk: one row of a
 * 4096 x 4096 bf16 weight touches 4096 source elements 8 KiB apart, all 32
 * MiB of it, and the next row touches the same blocks again.  Read through
 * a private window, a 996 KiB request re-read the chunk once per row (128
 * GiB of pread for one 32 MiB view).  This cache keeps whole aligned blocks
 * of the backing files so that the rows of one request, and the requests
 * after it, find them in memory; the read path visits a request's blocks
 * in file order, so even without the cache each block is read once per
 * request.  Contiguous reads never come here: they are spliced or read
 * straight into the reply.
 *
 * Block b of a file holds its bytes [b * block, b * block + block + TAIL),
 * cut at the end of the file: TAIL (the largest element size) lets an
 * element that starts in block b be copied from it whole even when it
 * straddles the block boundary (items sit at any offset in a .distcp, so
 * elements are not aligned to blocks).
 *
 * Memory: at most cap / block blocks, each allocated when first used and
 * kept until flx_bcache_free(); a mount that never gathers allocates none.
 * Replacement is least recently used among unpinned blocks.
 *
 * Thread-safety: every function but new/free may be called from any number
 * of threads.  A block being read by one thread is waited for by others
 * (one pread per miss, not one per thread).  A thread pins at most the
 * block it is copying from, so waits cannot deadlock.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FLX_BCACHE_TAIL		 16u	     /* largest element size */
#define FLX_BCACHE_BLOCK	 (1u << 20)  /* block size of a mount's cache */
#define FLX_BCACHE_DEFAULT_BYTES (64u << 20) /* cache_size= default */

typedef struct flx_bcache flx_bcache;

/** A pinned block: data[0..len) are the file's bytes from start. */
typedef struct flx_bref {
	const unsigned char *data;
	uint64_t start;
	size_t len;
	bool loaded;  /* the get that pinned it read it from the file */
	int32_t slot; /* internal */
} flx_bref;

typedef struct flx_bcache_stats {
	uint64_t hits;	    /* block found (or waited for while loading) */
	uint64_t misses;    /* block read from the file into the cache */
	uint64_t evictions; /* a cached block replaced */
	uint64_t bypassed;  /* every block pinned: the caller read its own */
	uint64_t blocks;    /* blocks allocated so far (memory in use) */
} flx_bcache_stats;

/**
 * A cache of cap bytes in blocks of block bytes (a power of two, at least
 * 64; tests use small ones).  cap below one block makes a cache that holds
 * nothing: every get returns -EAGAIN, and the caller's reads still use the
 * block size.
 * @return 0 and *out (owned; flx_bcache_free()), -EINVAL for a bad block
 *         size, or -ENOMEM.
 */
int flx_bcache_new(uint64_t cap, size_t block, flx_bcache **out);

/** Free the cache and its blocks; NULL is ignored.  No block may be
 * pinned. */
void flx_bcache_free(flx_bcache *c);

/** The block size; the number of blocks the cache may hold. */
size_t flx_bcache_block(const flx_bcache *c);
size_t flx_bcache_slots(const flx_bcache *c);

/**
 * Pin block blk of backing file number file (any stable number naming the
 * file for the cache's life; the read path uses the index into ckpt->files),
 * reading it with pread from fd, whose size is file_size, on a miss.
 * The block's bytes are [blk * block, min(blk * block + block + TAIL,
 * file_size)).
 * @return 0 and *ref (release with flx_bcache_put()), ref->loaded telling
 *         whether this call read the block (a miss) or found it; -EAGAIN
 *         when every block is pinned or being read (nothing pinned: read
 *         it yourself); -EINVAL when blk lies past file_size; or the pread
 *         error (-EIO for a file shorter than file_size), in which case
 *         nothing is cached.
 */
int flx_bcache_get(flx_bcache *c, uint32_t file, int fd, uint64_t file_size,
		   uint64_t blk, flx_bref *ref);

/**
 * Pin block blk of file file (of file_size bytes) when cached, or claim it
 * for the caller to fill, never waiting and never reading: for a reader
 * that fetches many blocks at once from elsewhere (the distributed
 * mount's remote files, which have no descriptor).
 * @return 0 and *ref: ref->loaded false, the block found (*dst NULL); or
 *         ref->loaded true, a pinned empty block whose ref->len bytes the
 *         caller writes at *dst, then hands over with flx_bcache_filled()
 *         (other threads' gets of it wait until then, claims get
 *         -EAGAIN: fill it soon, and never wait on another block while
 *         holding a claim).  -EAGAIN when another thread is loading the
 *         block or every block is pinned (fetch it yourself); -EINVAL
 *         when blk lies past file_size; -ENOMEM.
 */
int flx_bcache_claim(flx_bcache *c, uint32_t file, uint64_t file_size,
		     uint64_t blk, flx_bref *ref, unsigned char **dst);

/**
 * A claimed block filled (rc 0: cached, and still pinned: release it with
 * flx_bcache_put()) or not (rc != 0: nothing cached, unpinned, ref->slot
 * -1 so that a put is a no-op).
 */
void flx_bcache_filled(flx_bcache *c, flx_bref *ref, int rc);

/** Bytes block blk of a file of file_size bytes holds, for any reader of
 * blocks of this size (the cache, or a caller reading one itself): from
 * blk * block on, block + FLX_BCACHE_TAIL of them cut at the end of the
 * file; 0 when the block starts at or past the end. */
size_t flx_bcache_block_len(size_t block, uint64_t file_size, uint64_t blk);

/** Unpin a block from flx_bcache_get(). */
void flx_bcache_put(flx_bcache *c, flx_bref *ref);

/** Counters since flx_bcache_new() (a consistent snapshot). */
void flx_bcache_stats_get(flx_bcache *c, flx_bcache_stats *out);

#endif
