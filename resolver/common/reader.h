/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_READER_H
#define FLX_RESOLVER_READER_H

/*
 * A random-access byte source: a window of a file, or memory (tests,
 * fuzzers, decompressed items).  Parsers take this instead of an fd so they
 * run unchanged on all three.
 */

#include <stddef.h>
#include <stdint.h>

typedef struct flx_reader {
	/* Read exactly n bytes at off (relative to the window).  Returns 0,
	 * or -EIO on a short read / I/O error, -EINVAL if out of range. */
	int (*pread)(void *ctx, void *buf, size_t n, uint64_t off);
	void *ctx;
	uint64_t size; /* window length */
} flx_reader;

typedef struct flx_mem_reader {
	const unsigned char *base;
} flx_mem_reader;

typedef struct flx_fd_reader {
	int fd;
	uint64_t base; /* window start in the file */
} flx_fd_reader;

/*
 * The small-read cache: a read cache over one file for parsers that make
 * many small reads close together (the zip directory and data.pkl of each
 * torch.save item, item after item) while a checkpoint is opened.  Not
 * the views' block cache of tensor data (reshard's flx_bcache).  Two slots of
 * FLX_SMALL_READ_SLOT bytes, least recently used replaced, each filled by one
 * pread of the aligned block centred on a miss; reads over half a slot go
 * straight to the file.  Items visited in file order then cost about one pread
 * per 32 KiB of small items, and one or two per large one, instead of about
 * eight. Not thread-safe: one cache per thread.
 */
#define FLX_SMALL_READ_SLOT (64u * 1024)

typedef struct flx_small_read_cache {
	int fd;		/* -1: nothing bound */
	uint64_t fsize; /* bound file's size: blocks never extend past it */
	struct {
		unsigned char *buf; /* FLX_SMALL_READ_SLOT bytes */
		uint64_t start;	    /* file offset of buf[0] */
		size_t len;	    /* valid bytes (0: empty) */
		uint64_t used;	    /* LRU tick */
	} slot[2];
	uint64_t tick;
	uint64_t preads; /* counters, for tests and diagnostics */
	uint64_t hits;
	/* what blocks are read from when there is no descriptor (a remote
	 * file), or NULL: fd */
	const struct flx_reader *src;
} flx_small_read_cache;

typedef struct flx_cached_reader {
	flx_small_read_cache *cache;
	uint64_t base; /* window start in the file */
} flx_cached_reader;

/** Allocate the slots; nothing bound.  @return 0 or -ENOMEM. */
int flx_small_read_cache_init(flx_small_read_cache *c);

/** Bind to fd of fsize bytes, dropping cached blocks unless fd is the
 * one already bound (the cache trusts that the file does not change).
 * The cache knows a file only by descriptor number and size: fd must stay
 * open as long as it is bound, or a reused number of an equally long file
 * would be served the old file's blocks (bind to -1 first). */
void flx_small_read_cache_bind(flx_small_read_cache *c, int fd, uint64_t fsize);

/** flx_small_read_cache_bind() for a file read through src (a reader
 * over the whole file, fsize bytes, outliving the binding) instead of a
 * descriptor; key (negative, never a descriptor) tells files apart as fd
 * does. */
void flx_small_read_cache_bind_reader(flx_small_read_cache *c, int key,
				      uint64_t fsize,
				      const struct flx_reader *src);
/** Free the slots (safe after a failed init or twice). */
void flx_small_read_cache_release(flx_small_read_cache *c);

/** Reader over bytes [base, base+len) of the cache's bound file; base+len
 * must not exceed its fsize.  cache and ctx must outlive the reader. */
void flx_reader_cached(flx_reader *r, flx_cached_reader *ctx,
		       flx_small_read_cache *cache, uint64_t base,
		       uint64_t len);

/** Reader over buf[0..len); ctx must outlive the reader. */
void flx_reader_mem(flx_reader *r, flx_mem_reader *ctx, const void *buf,
		    uint64_t len);

/** Reader over fd bytes [base, base+len); ctx must outlive the reader. */
void flx_reader_fd(flx_reader *r, flx_fd_reader *ctx, int fd, uint64_t base,
		   uint64_t len);

/**
 * Read exactly n bytes at off of the reader's window, bounds-checked here
 * once for every implementation.  Parsers call only this.
 * @return 0, -EINVAL if [off, off+n) is outside the window, or the
 *         implementation's -errno (-EIO on a short read).
 */
int flx_read_at(const flx_reader *r, void *buf, size_t n, uint64_t off);

/** pread() that loops over short reads and EINTR.
 * @return 0, -EIO on EOF before n bytes, or -errno. */
int flx_pread_full(int fd, void *buf, size_t n, uint64_t off);

/** preadv() that loops over short reads and EINTR; iov is modified (the
 * entries already filled are consumed).
 * @return 0, -EIO on EOF before every entry is full, or -errno. */
struct iovec;
int flx_preadv_full(int fd, struct iovec *iov, int iovcnt, uint64_t off);

#endif
