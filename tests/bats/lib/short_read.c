/* SPDX-License-Identifier: MIT */
/*
 * LD_PRELOAD shim for faults.bats: the file named by $FLX_SHORT_FILE reads
 * as if it ended at byte $FLX_SHORT_AT, while fstat() still reports its
 * full size.  That is a backing file cut short after the daemon checked it
 * and before it read, spliced or sent the bytes: pread() and splice() from
 * it stop at the cut, and mmap() of it maps a copy of the bytes before the
 * cut (a mapping past a file's end: the kernel cannot take those pages).
 * With $FLX_SHORT_ARMED (a path), the cut applies only while that path
 * exists: a file the daemon reads at mount is cut after the mount.  Other
 * files are untouched.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
/* both pread and pread64 are defined here, under their own names */
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
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
	if (!known || fstat(fd, &st) != 0 || st.st_dev != want.st_dev ||
	    st.st_ino != want.st_ino)
		return 0;
	return !getenv("FLX_SHORT_ARMED") ||
	       access(getenv("FLX_SHORT_ARMED"), F_OK) == 0;
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

/* A memory file holding the bytes of fd before the cut, or -1. */
static int cut_copy(int fd)
{
	pread_fn real = (pread_fn)dlsym(RTLD_NEXT, "pread64");
	size_t left = clip(0, (size_t)-1 >> 1);
	off_t at = 0;
	char buf[65536];
	int m = memfd_create("flx-short", MFD_CLOEXEC);

	while (m >= 0 && left) {
		ssize_t n =
		    real(fd, buf, left < sizeof(buf) ? left : sizeof(buf), at);

		if (n <= 0 || write(m, buf, (size_t)n) != n) {
			close(m);
			return -1;
		}
		at += n;
		left -= (size_t)n;
	}
	return m;
}

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);

static void *cut_mmap(const char *sym, void *addr, size_t len, int prot,
		      int flags, int fd, off_t off)
{
	mmap_fn real = (mmap_fn)dlsym(RTLD_NEXT, sym);
	void *p;
	int m;

	if (fd < 0 || !is_target(fd))
		return real(addr, len, prot, flags, fd, off);
	m = cut_copy(fd);
	if (m < 0)
		return MAP_FAILED;
	p = real(addr, len, prot, flags, m, off);
	close(m);
	return p;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return cut_mmap("mmap", addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return cut_mmap("mmap64", addr, len, prot, flags, fd, off);
}
