/* SPDX-License-Identifier: MIT */
/* Unit tests for the small-read cache reader (resolver/common/reader.h): every
 * read returns the file's bytes, whatever mix of hits, misses, reads
 * across a block's end, reads larger than a block and item windows; the
 * pread count shows the cache does its job; a file shorter than it was
 * when bound reads as -EIO, never as stale or zero bytes. */
#include "check.h"
#include "reader.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#define FILE_BYTES (300u * 1024 + 123)

static unsigned char byte_at(uint64_t off)
{
	return (unsigned char)((off * 2654435761u) >> 13);
}

static int check_range(const flx_reader *r, uint64_t base, uint64_t off,
		       size_t n)
{
	static unsigned char buf[3 * FLX_SMALL_READ_SLOT];
	int rc = flx_read_at(r, buf, n, off);

	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++)
		if (buf[i] != byte_at(base + off + i))
			return 1;
	return 0;
}

int main(void)
{
	char path[] = "/tmp/flx_reader_XXXXXX";
	int fd = mkstemp(path);
	static unsigned char data[FILE_BYTES];
	flx_small_read_cache bc;
	flx_cached_reader cr;
	flx_reader r;
	uint64_t before;

	CHECK(fd >= 0);
	for (uint64_t i = 0; i < FILE_BYTES; i++)
		data[i] = byte_at(i);
	CHECK_EQ(write(fd, data, FILE_BYTES), FILE_BYTES);
	CHECK_EQ(flx_small_read_cache_init(&bc), 0);
	flx_small_read_cache_bind(&bc, fd, FILE_BYTES);

	/* Whole-file window: small reads in order cost one pread per block. */
	flx_reader_cached(&r, &cr, &bc, 0, FILE_BYTES);
	for (uint64_t off = 0; off + 100 <= FILE_BYTES; off += 100)
		CHECK_EQ(check_range(&r, 0, off, 100), 0);
	CHECK(bc.preads <= FILE_BYTES / (FLX_SMALL_READ_SLOT / 2 - 4096) + 2);
	CHECK(bc.hits > 2900);

	/* Head, tail, head again (from empty slots): two slots keep both. */
	flx_small_read_cache_bind(&bc, -1, 0);
	flx_small_read_cache_bind(&bc, fd, FILE_BYTES);
	before = bc.preads;
	CHECK_EQ(check_range(&r, 0, 10, 50), 0);
	CHECK_EQ(check_range(&r, 0, FILE_BYTES - 22, 22), 0);
	CHECK_EQ(check_range(&r, 0, 200, 64), 0);
	CHECK_EQ(check_range(&r, 0, FILE_BYTES - 300, 278), 0);
	CHECK_EQ(bc.preads - before, 2);

	/* Across a block end, half a block, larger than a block, the last
	 * byte. */
	CHECK_EQ(check_range(&r, 0, FLX_SMALL_READ_SLOT - 10, 20), 0);
	CHECK_EQ(check_range(&r, 0, 3, FLX_SMALL_READ_SLOT / 2), 0);
	CHECK_EQ(check_range(&r, 0, 4099, FLX_SMALL_READ_SLOT / 2), 0);
	CHECK_EQ(check_range(&r, 0, 4099, FLX_SMALL_READ_SLOT / 2 + 1), 0);
	CHECK_EQ(check_range(&r, 0, 5, 2 * FLX_SMALL_READ_SLOT + 7), 0);
	CHECK_EQ(check_range(&r, 0, FILE_BYTES - 1, 1), 0);
	CHECK_EQ(check_range(&r, 0, FILE_BYTES - 1, 2), -EINVAL);

	/* An item window in the middle: offsets are relative to it, and it
	 * shares the blocks already cached for the file. */
	flx_reader_cached(&r, &cr, &bc, 70000, 1000);
	CHECK_EQ(check_range(&r, 70000, 0, 1000), 0);
	CHECK_EQ(check_range(&r, 70000, 999, 1), 0);
	CHECK_EQ(check_range(&r, 70000, 999, 2), -EINVAL);

	/* Rebinding the same file keeps the blocks; another drops them. */
	before = bc.preads;
	flx_small_read_cache_bind(&bc, fd, FILE_BYTES);
	CHECK_EQ(check_range(&r, 70000, 10, 10), 0);
	CHECK_EQ(bc.preads, before);

	/* preadv scatter: 1000 entries of odd sizes, some empty, filled in
	 * order; a read past the end: -EIO. */
	{
		static unsigned char out[200000];
		struct iovec iov[1000];
		size_t at = 0;

		for (int k = 0; k < 1000; k++) {
			size_t len = (size_t)(k % 7 == 3 ? 0 : k % 301 + 1);

			iov[k].iov_base = out + at;
			iov[k].iov_len = len;
			at += len;
		}
		CHECK_EQ(flx_preadv_full(fd, iov, 1000, 777), 0);
		for (size_t i = 0; i < at; i++)
			if (out[i] != byte_at(777 + i)) {
				CHECK(!"preadv byte");
				break;
			}
		iov[0].iov_base = out;
		iov[0].iov_len = 4096;
		iov[1].iov_base = out + 4096;
		iov[1].iov_len = 4096;
		CHECK_EQ(flx_preadv_full(fd, iov, 2, FILE_BYTES - 5000), -EIO);
		/* nothing to read is done, even at or past the end */
		iov[0].iov_len = 0;
		iov[1].iov_len = 0;
		CHECK_EQ(flx_preadv_full(fd, iov, 2, FILE_BYTES), 0);
		CHECK_EQ(flx_pread_full(fd, out, 0, FILE_BYTES + 10), 0);
		CHECK_EQ(flx_pread_full(fd, out, 1, FILE_BYTES), -EIO);
	}

	/* The file shrinks under a fresh binding: -EIO, not short data. */
	CHECK_EQ(ftruncate(fd, 100000), 0);
	flx_small_read_cache_bind(&bc, -1, 0);
	flx_small_read_cache_bind(&bc, fd, FILE_BYTES);
	flx_reader_cached(&r, &cr, &bc, 0, FILE_BYTES);
	CHECK_EQ(check_range(&r, 0, 10, 10), 0);
	CHECK_EQ(check_range(&r, 0, 150000, 10), -EIO);
	CHECK_EQ(check_range(&r, 0, 99990, 20), -EIO);
	CHECK_EQ(check_range(&r, 0, 90000, 2 * FLX_SMALL_READ_SLOT), -EIO);

	flx_small_read_cache_release(&bc);
	flx_small_read_cache_release(&bc); /* idempotent */
	close(fd);
	unlink(path);
	return CHECK_RESULT();
}
