/* SPDX-License-Identifier: MIT */
#include "reader.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

static int mem_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	const flx_mem_reader *m = ctx;

	memcpy(buf, m->base + off, n);
	return 0;
}

static int fd_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	const flx_fd_reader *f = ctx;

	return flx_pread_full(f->fd, buf, n, f->base + off);
}

void flx_reader_mem(flx_reader *r, flx_mem_reader *ctx, const void *buf,
		    uint64_t len)
{
	ctx->base = buf;
	r->pread = mem_pread;
	r->ctx = ctx;
	r->size = len;
}

void flx_reader_fd(flx_reader *r, flx_fd_reader *ctx, int fd, uint64_t base,
		   uint64_t len)
{
	ctx->fd = fd;
	ctx->base = base;
	r->pread = fd_pread;
	r->ctx = ctx;
	r->size = len;
}

int flx_read_at(const flx_reader *r, void *buf, size_t n, uint64_t off)
{
	if (off > r->size || n > r->size - off)
		return -EINVAL;
	if (n == 0)
		return 0;
	return r->pread(r->ctx, buf, n, off);
}

int flx_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
	unsigned char *p = buf;

	while (n) {
		ssize_t got = pread(fd, p, n, (off_t)off);

		if (got < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (got == 0)
			return -EIO;
		p += got;
		n -= (size_t)got;
		off += (uint64_t)got;
	}
	return 0;
}
