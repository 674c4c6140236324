/* SPDX-License-Identifier: MIT */
/*
 * LD_PRELOAD shim for faults.bats: the file named by $FLX_SHORT_FILE reads
 * as if it ended at byte $FLX_SHORT_AT, while fstat() still reports its
 * full size.  That is a backing file cut short after the daemon checked it
 * and before it read or spliced the bytes: pread() and splice() from it
 * stop at the cut.  Other files are untouched.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
/* both pread and pread64 are defined here, under their own names */
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static int is_target(int fd)
{
	static struct stat want;
	static int known = -1; /* racing first calls compute the same */
	struct stat st;

	if (known < 0) {
		const char *p = getenv("FLX_SHORT_FILE");

		known = p && stat(p, &want) == 0;
	}
	return known && fstat(fd, &st) == 0 && st.st_dev == want.st_dev &&
	       st.st_ino == want.st_ino;
}

/* Bytes of [off, off + len) before the cut. */
static size_t clip(off_t off, size_t len)
{
	const char *c = getenv("FLX_SHORT_AT");
	off_t at = c ? (off_t)strtoll(c, NULL, 10) : 0;

	if (off >= at)
		return 0;
	return (size_t)(at - off) < len ? (size_t)(at - off) : len;
}

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);

static ssize_t cut_pread(const char *sym, int fd, void *buf, size_t n,
			 off_t off)
{
	pread_fn real = (pread_fn)dlsym(RTLD_NEXT, sym);

	if (is_target(fd))
		n = clip(off, n);
	return n ? real(fd, buf, n, off) : 0;
}

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
	return cut_pread("pread", fd, buf, n, off);
}

ssize_t pread64(int fd, void *buf, size_t n, off_t off)
{
	return cut_pread("pread64", fd, buf, n, off);
}

ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len,
	       unsigned int flags)
{
	typedef ssize_t (*splice_fn)(int, loff_t *, int, loff_t *, size_t,
				     unsigned int);
	splice_fn real = (splice_fn)dlsym(RTLD_NEXT, "splice");

	if (off_in && is_target(in)) {
		len = clip((off_t)*off_in, len);
		if (!len)
			return 0;
	}
	return real(in, off_in, out, off_out, len, flags);
}
