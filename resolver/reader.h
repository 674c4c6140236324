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

#endif
