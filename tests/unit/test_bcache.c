/* SPDX-License-Identifier: MIT */
/*
 * The block cache on its own: block contents and bounds (the tail past
 * the block, the short last block), least-recently-used replacement,
 * pinned blocks never replaced (-EAGAIN when all are), a failed read
 * leaving nothing cached, and many threads getting and checking blocks of
 * one small cache at once (also run under TSan by tools/test-sanitize.sh).
 */
#include "bcache.h"
#include "check.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLK   64u
#define FSIZE (10 * BLK + 5) /* 10 whole blocks and 5 bytes */

static unsigned char byte_at(uint64_t off)
{
	return (unsigned char)(off * 7 + off / 251 + 3);
}

static int make_file(char *path, uint64_t size)
{
	int fd = mkstemp(path);
	unsigned char *b = malloc(size);

	for (uint64_t i = 0; i < size; i++)
		b[i] = byte_at(i);
	CHECK(fd >= 0 && write(fd, b, size) == (ssize_t)size);
	free(b);
	unlink(path);
	return fd;
}

/* The bytes of a pinned block are the file's, with the tail. */
static int block_ok(const flx_bref *r, uint64_t blk, uint64_t size)
{
	uint64_t want = blk * BLK + BLK + FLX_BCACHE_TAIL;

	if (want > size)
		want = size;
	if (r->start != blk * BLK || r->len != want - blk * BLK)
		return 0;
	for (size_t i = 0; i < r->len; i++)
		if (r->data[i] != byte_at(r->start + i))
			return 0;
	return 1;
}

/* flx_bcache_get(), what it says folded into the result for the checks:
 * 1 when this call read the block (ref->loaded), 0 when it found it, or
 * its -errno. */
static int get(flx_bcache *c, uint32_t file, int fd, uint64_t size,
	       uint64_t blk, flx_bref *ref)
{
	int rc = flx_bcache_get(c, file, fd, size, blk, ref);

	return rc ? rc : ref->loaded;
}

/* get + check + put; @return what get returned. */
static int touch(flx_bcache *c, int fd, uint64_t blk)
{
	flx_bref r;
	int rc = get(c, 0, fd, FSIZE, blk, &r);

	if (rc >= 0) {
		CHECK(block_ok(&r, blk, FSIZE));
		flx_bcache_put(c, &r);
	}
	return rc;
}

static void test_basics(int fd)
{
	flx_bcache *c;
	flx_bcache_stats st;
	flx_bref r[4];

	CHECK_EQ(flx_bcache_new(1024, 0, &c), -EINVAL);
	CHECK_EQ(flx_bcache_new(1024, 32, &c), -EINVAL);
	CHECK_EQ(flx_bcache_new(1024, 96, &c), -EINVAL);

	/* no room at all: every get says "read it yourself" */
	CHECK_EQ(flx_bcache_new(BLK - 1, BLK, &c), 0);
	CHECK_EQ(flx_bcache_slots(c), 0);
	CHECK_EQ(flx_bcache_block(c), BLK);
	CHECK_EQ(touch(c, fd, 0), -EAGAIN);
	flx_bcache_free(c);

	CHECK_EQ(flx_bcache_new(3 * BLK, BLK, &c), 0);
	CHECK_EQ(flx_bcache_slots(c), 3);
	CHECK_EQ(touch(c, fd, 0), 1);  /* read */
	CHECK_EQ(touch(c, fd, 0), 0);  /* found */
	CHECK_EQ(touch(c, fd, 10), 1); /* the short last block */
	CHECK_EQ(touch(c, fd, 11), -EINVAL);
	CHECK_EQ(touch(c, fd, UINT64_MAX), -EINVAL);
	/* 0 and 10 cached; 1 fills the third slot; 0 is used again, so
	 * 10 is the least recently used and goes for 2 */
	CHECK_EQ(touch(c, fd, 1), 1);
	CHECK_EQ(touch(c, fd, 0), 0);
	CHECK_EQ(touch(c, fd, 2), 1);
	CHECK_EQ(touch(c, fd, 0), 0);
	CHECK_EQ(touch(c, fd, 1), 0);
	CHECK_EQ(touch(c, fd, 10), 1);
	CHECK_EQ(touch(c, fd, 2), 1); /* 2 was the oldest then */
	flx_bcache_stats_get(c, &st);
	CHECK_EQ(st.misses, 6);
	CHECK_EQ(st.hits, 4);
	CHECK_EQ(st.evictions, 3);
	CHECK_EQ(st.blocks, 3);
	CHECK_EQ(st.bypassed, 0);

	/* pinned blocks stay: with all three pinned a fourth is refused,
	 * and the pinned ones are still found */
	CHECK_EQ(get(c, 0, fd, FSIZE, 4, &r[0]), 1);
	CHECK_EQ(get(c, 0, fd, FSIZE, 5, &r[1]), 1);
	CHECK_EQ(get(c, 0, fd, FSIZE, 6, &r[2]), 1);
	CHECK_EQ(get(c, 0, fd, FSIZE, 7, &r[3]), -EAGAIN);
	CHECK_EQ(touch(c, fd, 5), 0);
	CHECK(block_ok(&r[0], 4, FSIZE) && block_ok(&r[1], 5, FSIZE) &&
	      block_ok(&r[2], 6, FSIZE));
	flx_bcache_put(c, &r[1]);
	CHECK_EQ(touch(c, fd, 7), 1); /* took 5's slot, the only free one */
	CHECK(block_ok(&r[0], 4, FSIZE) && block_ok(&r[2], 6, FSIZE));
	flx_bcache_put(c, &r[0]);
	flx_bcache_put(c, &r[2]);
	flx_bcache_stats_get(c, &st);
	CHECK_EQ(st.bypassed, 1);

	/* the same block number of another file is another block */
	CHECK_EQ(get(c, 1, fd, FSIZE, 4, &r[0]), 1);
	flx_bcache_put(c, &r[0]);

	/* a file shorter than the caller says: the error, nothing kept,
	 * the next get reads again */
	CHECK_EQ(get(c, 2, fd, FSIZE + 4 * BLK, 11, &r[0]), -EIO);
	CHECK_EQ(get(c, 2, fd, FSIZE + 4 * BLK, 11, &r[0]), -EIO);
	CHECK_EQ(get(c, 2, fd, FSIZE, 10, &r[0]), 1);
	flx_bcache_put(c, &r[0]);
	flx_bcache_free(c);
	flx_bcache_free(NULL);
}

typedef struct arg {
	flx_bcache *c;
	int fd;
	unsigned seed;
	int bad;
} arg;

static void *worker(void *p)
{
	arg *a = p;

	for (int i = 0; i < 20000; i++) {
		uint64_t blk = (uint64_t)rand_r(&a->seed) % 11;
		flx_bref r;
		int rc = get(a->c, 0, a->fd, FSIZE, blk, &r);

		if (rc == -EAGAIN)
			continue;
		if (rc < 0 || !block_ok(&r, blk, FSIZE))
			a->bad++;
		if (rc >= 0)
			flx_bcache_put(a->c, &r);
	}
	return NULL;
}

static void test_threads(int fd)
{
	flx_bcache *c;
	flx_bcache_stats st;
	pthread_t th[6];
	arg a[6];

	/* 4 slots for 6 threads and 11 blocks: misses, waits on blocks
	 * being read, replacement and refusals all happen */
	CHECK_EQ(flx_bcache_new(4 * BLK, BLK, &c), 0);
	for (int i = 0; i < 6; i++) {
		a[i] = (arg){c, fd, 1u + (unsigned)i, 0};
		CHECK_EQ(pthread_create(&th[i], NULL, worker, &a[i]), 0);
	}
	for (int i = 0; i < 6; i++) {
		pthread_join(th[i], NULL);
		CHECK_EQ(a[i].bad, 0);
	}
	flx_bcache_stats_get(c, &st);
	CHECK(st.hits > 0 && st.misses > 0 && st.evictions > 0);
	CHECK(st.blocks <= 4);
	flx_bcache_free(c);
}

/* Claimed blocks (the distributed mount's remote bytes): a claim is
 * filled by the caller and then found by claims and gets; a claim of a
 * block being filled, or with every block pinned, is -EAGAIN; a failed
 * fill caches nothing. */
static void test_claim(int fd)
{
	flx_bcache *c;
	flx_bref r, r2;
	unsigned char *dst;

	CHECK_EQ(flx_bcache_new(2 * BLK, BLK, &c), 0);
	CHECK_EQ(flx_bcache_claim(c, 7, FSIZE, 11, &r, &dst), -EINVAL);
	CHECK_EQ(flx_bcache_claim(c, 7, FSIZE, 3, &r, &dst), 0);
	CHECK(r.loaded && dst && r.len == BLK + FLX_BCACHE_TAIL);
	/* being filled: another claim does not wait */
	CHECK_EQ(flx_bcache_claim(c, 7, FSIZE, 3, &r2, &dst), -EAGAIN);
	for (size_t i = 0; i < r.len; i++)
		dst[i] = byte_at(3 * BLK + i);
	flx_bcache_filled(c, &r, 0);
	CHECK(block_ok(&r, 3, FSIZE));
	flx_bcache_put(c, &r);
	CHECK_EQ(flx_bcache_claim(c, 7, FSIZE, 3, &r, &dst), 0);
	CHECK(!r.loaded && !dst && block_ok(&r, 3, FSIZE));
	/* a get of the same key finds it, without reading fd */
	CHECK_EQ(get(c, 7, -1, FSIZE, 3, &r2), 0);
	CHECK(block_ok(&r2, 3, FSIZE));
	flx_bcache_put(c, &r2);
	/* both blocks pinned (3 found, 4 claimed): nothing to claim */
	CHECK_EQ(flx_bcache_claim(c, 7, FSIZE, 4, &r2, &dst), 0);
	CHECK(r2.loaded);
	{
		flx_bref r3;

		CHECK_EQ(flx_bcache_claim(c, 7, FSIZE, 5, &r3, &dst), -EAGAIN);
	}
	flx_bcache_put(c, &r);
	/* a failed fill: block 4 not cached, its slot free again */
	flx_bcache_filled(c, &r2, -EIO);
	CHECK_EQ(r2.slot, -1);
	flx_bcache_put(c, &r2); /* a no-op */
	CHECK_EQ(get(c, 7, fd, FSIZE, 4, &r2), 1);
	CHECK(block_ok(&r2, 4, FSIZE));
	flx_bcache_put(c, &r2);
	flx_bcache_free(c);
}

int main(void)
{
	char path[] = "/tmp/flx_bcache_XXXXXX";
	int fd = make_file(path, FSIZE);

	test_basics(fd);
	test_claim(fd);
	test_threads(fd);
	close(fd);
	return CHECK_RESULT();
}
