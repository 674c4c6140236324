/* SPDX-License-Identifier: MIT */
#include "reader.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
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

int flx_small_read_cache_init(flx_small_read_cache *c)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	for (int i = 0; i < 2; i++) {
		c->slot[i].buf = malloc(FLX_SMALL_READ_SLOT);
		if (!c->slot[i].buf) {
			flx_small_read_cache_release(c);
			return -ENOMEM;
		}
	}
	return 0;
}

void flx_small_read_cache_bind(flx_small_read_cache *c, int fd, uint64_t fsize)
{
	if (c->fd == fd && c->fsize == fsize && !c->src)
		return;
	c->src = NULL;
	c->fd = fd;
	c->fsize = fsize;
	c->slot[0].len = 0;
	c->slot[1].len = 0;
}

void flx_small_read_cache_bind_reader(flx_small_read_cache *c, int key,
				      uint64_t fsize, const flx_reader *src)
{
	if (c->fd == key && c->fsize == fsize && c->src == src)
		return;
	flx_small_read_cache_bind(c, key, fsize);
	c->src = src;
}

/* Bytes of the bound file, from its descriptor or its reader. */
static int fill(const flx_small_read_cache *c, void *buf, size_t n,
		uint64_t off)
{
	return c->src ? flx_read_at(c->src, buf, n, off)
		      : flx_pread_full(c->fd, buf, n, off);
}

void flx_small_read_cache_release(flx_small_read_cache *c)
{
	free(c->slot[0].buf);
	free(c->slot[1].buf);
	c->slot[0].buf = NULL;
	c->slot[1].buf = NULL;
	c->fd = -1;
}

static int cached_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	const flx_cached_reader *cr = ctx;
	flx_small_read_cache *c = cr->cache;
	uint64_t at = cr->base + off, start;
	size_t len;
	int i, rc;

	for (i = 0; i < 2; i++) {
		if (c->slot[i].len && at >= c->slot[i].start &&
		    at - c->slot[i].start <= c->slot[i].len &&
		    n <= c->slot[i].len - (at - c->slot[i].start)) {
			memcpy(buf, c->slot[i].buf + (at - c->slot[i].start),
			       n);
			c->slot[i].used = ++c->tick;
			c->hits++;
			return 0;
		}
	}
	/* The block is centred on the read: parsers read an item's zip
	 * directory backwards from its end, then its head, and the next
	 * item starts where this one ends, so half a block on either side
	 * catches both this item's records and the next item's. */
	if (n > FLX_SMALL_READ_SLOT / 2 || at >= c->fsize) {
		c->preads++;
		return fill(c, buf, n, at);
	}
	start = at + n > FLX_SMALL_READ_SLOT / 2
		    ? (at + n - FLX_SMALL_READ_SLOT / 2) & ~(uint64_t)4095
		    : 0;
	len = c->fsize - start < FLX_SMALL_READ_SLOT
		  ? (size_t)(c->fsize - start)
		  : FLX_SMALL_READ_SLOT;
	if (len < (at - start) + n) /* the read runs past the file's end */
		return -EIO;
	i = c->slot[0].used <= c->slot[1].used ? 0 : 1;
	c->slot[i].len = 0;
	c->preads++;
	rc = fill(c, c->slot[i].buf, len, start);
	if (rc)
		return rc;
	c->slot[i].start = start;
	c->slot[i].len = len;
	c->slot[i].used = ++c->tick;
	memcpy(buf, c->slot[i].buf + (at - start), n);
	return 0;
}

void flx_reader_cached(flx_reader *r, flx_cached_reader *ctx,
		       flx_small_read_cache *cache, uint64_t base, uint64_t len)
{
	ctx->cache = cache;
	ctx->base = base;
	r->pread = cached_pread;
	r->ctx = ctx;
	r->size = len;
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

int flx_preadv_full(int fd, struct iovec *iov, int iovcnt, uint64_t off)
{
	for (;;) {
		ssize_t got;

		/* empty entries first: a read of 0 bytes is done, not EOF */
		while (iovcnt > 0 && iov->iov_len == 0) {
			iov++;
			iovcnt--;
		}
		if (iovcnt == 0)
			return 0;
		got = preadv(fd, iov, iovcnt, (off_t)off);

		if (got < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (got == 0)
			return -EIO;
		off += (uint64_t)got;
		while (iovcnt > 0 && (size_t)got >= iov->iov_len) {
			got -= (ssize_t)iov->iov_len;
			iov++;
			iovcnt--;
		}
		if (iovcnt > 0) {
			iov->iov_base = (char *)iov->iov_base + got;
			iov->iov_len -= (size_t)got;
		}
	}
}

int flx_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
	struct iovec v = {.iov_base = buf, .iov_len = n};

	return flx_preadv_full(fd, &v, 1, off);
}
