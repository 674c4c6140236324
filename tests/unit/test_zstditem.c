/* SPDX-License-Identifier: MIT */
/*
 * zstd items at mount (resolver/codec/zstditem.h): descriptors, frame
 * headers, the bounded decode (head and tail against the content, the
 * bomb bound, trailing bytes), and the CRC-32 of a range taken as the
 * frame goes by against a CRC of the content itself (crc32.h, checked
 * against the standard check value and its own combination).
 */
#include "check.h"
#include "crc32.h"
#include "zstditem.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

static uint64_t rng(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void test_crc(void)
{
	unsigned char buf[1000];
	uint64_t s = 5;

	CHECK_EQ(flx_crc32(0, "123456789", 9), 0xCBF43926u);
	CHECK_EQ(flx_crc32(0, "", 0), 0);
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (unsigned char)rng(&s);
	for (size_t cut = 0; cut <= sizeof(buf); cut += 37) {
		uint32_t a = flx_crc32(0, buf, cut);
		uint32_t b = flx_crc32(0, buf + cut, sizeof(buf) - cut);

		CHECK_EQ(flx_crc32_combine(a, b, sizeof(buf) - cut),
			 flx_crc32(0, buf, sizeof(buf)));
		CHECK_EQ(flx_crc32(a, buf + cut, sizeof(buf) - cut),
			 flx_crc32(0, buf, sizeof(buf)));
	}
}

static void test_descriptors(void)
{
	CHECK(flx_zstd_descriptor_ok("stream.zstd/1"));
	CHECK(flx_zstd_descriptor_ok("stream.zstd/1.1"));
	CHECK(flx_zstd_descriptor_ok("stream.zstd/1.0.7"));
	CHECK(!flx_zstd_descriptor_ok("stream.zstd/10"));
	CHECK(!flx_zstd_descriptor_ok("stream.zstd/2"));
	CHECK(!flx_zstd_descriptor_ok("stream.zstd"));
	CHECK(!flx_zstd_descriptor_ok("stream.zstd/"));
	CHECK(!flx_zstd_descriptor_ok("stream.lz4/1"));
	CHECK(!flx_zstd_descriptor_ok("stream.zstd@x/1x"));
}

static void test_headers(void)
{
	/* torch's: FHD 0, window descriptor 0x58 = 2 MiB */
	const unsigned char torch[] = {0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x58};
	/* single segment, 2-byte content size 0x0100 + 256 = 512, checksum */
	const unsigned char ss[] = {0x28, 0xb5, 0x2f, 0xfd, 0x64, 0x00, 0x01};
	const unsigned char big[] = {0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x88};
	const unsigned char dict[] = {0x28, 0xb5, 0x2f, 0xfd, 0x01, 0x58, 7};
	const unsigned char zip[] = {0x50, 0x4b, 0x03, 0x04, 0x00, 0x00};
	flx_zstd_frame f;
	flx_error e = {0};

	CHECK_EQ(flx_zstd_frame_check(torch, 6, 100, "f", "k", &f, NULL), 0);
	CHECK_EQ(f.window, 2u << 20);
	CHECK_EQ(f.content_size, UINT64_MAX);
	CHECK(!f.checksum);
	CHECK_EQ(flx_zstd_frame_check(ss, 7, 1000, "f", "k", &f, NULL), 0);
	CHECK_EQ(f.content_size, 512);
	CHECK(f.checksum);
	/* content size above the bound */
	CHECK_EQ(flx_zstd_frame_check(ss, 7, 511, "f", "k", &f, &e), -EINVAL);
	CHECK(strstr(e.text, "512 bytes of content") != NULL);
	CHECK_EQ(flx_zstd_frame_check(ss, 6, 1000, "f", "k", &f, NULL),
		 -EINVAL); /* cut short */
	CHECK_EQ(flx_zstd_frame_check(big, 6, 100, "f", "k", &f, NULL),
		 -EINVAL); /* 128 MiB window */
	CHECK_EQ(flx_zstd_frame_check(dict, 7, 100, "f", "k", &f, NULL),
		 -EINVAL);
	CHECK_EQ(flx_zstd_frame_check(zip, 6, 100, "f", "k", &f, NULL),
		 -EINVAL);
}

static unsigned char *frame_of(const unsigned char *c, size_t n, size_t *zn)
{
	size_t cap = ZSTD_compressBound(n) + 16;
	unsigned char *z = malloc(cap);
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	ZSTD_inBuffer in = {c, n, 0};
	ZSTD_outBuffer out = {z, cap, 0};

	ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
	while (ZSTD_compressStream2(cc, &out, &in, ZSTD_e_end))
		;
	ZSTD_freeCCtx(cc);
	*zn = out.pos;
	return z;
}

static int load(flx_zstd_item *zi, const unsigned char *z, size_t zn,
		uint64_t max_out, flx_reader *r, flx_zstd_reader *zr,
		flx_error *e)
{
	flx_reader src;
	flx_mem_reader m;

	flx_reader_mem(&src, &m, z, zn);
	return flx_zstd_item_load(zi, &src, max_out, "f", "k", r, zr, e);
}

/* Content of n bytes: head and tail readable and equal, the middle not;
 * CRCs of ranges from the head to the tail equal the content's. */
static void test_load(size_t n, uint64_t seed)
{
	unsigned char *c = malloc(n), *got = malloc(FLX_ZSTD_TAIL);
	flx_zstd_item zi = {0};
	flx_zstd_reader zr;
	flx_reader r;
	flx_error e = {0};
	uint64_t s = seed;
	size_t zn;
	unsigned char *z;

	for (size_t i = 0; i < n; i++)
		c[i] = (unsigned char)(rng(&s) % 7);
	z = frame_of(c, n, &zn);
	CHECK_EQ(load(&zi, z, zn, n, &r, &zr, &e), 0);
	CHECK_EQ(r.size, n);
	CHECK_EQ(flx_read_at(&r, got, 100, 0), 0);
	CHECK(memcmp(got, c, 100) == 0);
	if (n >= FLX_ZSTD_TAIL) {
		CHECK_EQ(flx_read_at(&r, got, FLX_ZSTD_TAIL, n - FLX_ZSTD_TAIL),
			 0);
		CHECK(memcmp(got, c + n - FLX_ZSTD_TAIL, FLX_ZSTD_TAIL) == 0);
	}
	if (n > FLX_ZSTD_HEAD + FLX_ZSTD_TAIL)
		CHECK_EQ(flx_read_at(&r, got, 10, FLX_ZSTD_HEAD + 5), -EIO);
	for (int k = 0; k < 40; k++) {
		uint64_t off =
		    rng(&s) % (n < FLX_ZSTD_HEAD ? n : FLX_ZSTD_HEAD);
		uint64_t lo = n > FLX_ZSTD_TAIL ? n - FLX_ZSTD_TAIL : 0;
		uint64_t end = lo + rng(&s) % (n - lo + 1);
		uint32_t crc = 0;

		if (end < off)
			end = off;
		CHECK_EQ(flx_zstd_item_crc(&zi, off, end - off, &crc), 0);
		CHECK_EQ(crc, flx_crc32(0, c + off, end - off));
	}
	if (n > FLX_ZSTD_HEAD + 2 * FLX_ZSTD_TAIL) {
		uint32_t crc;

		/* a range ending in the middle cannot be checked */
		CHECK_EQ(flx_zstd_item_crc(&zi, 10, n / 2, &crc), -EIO);
		/* one byte changed in the middle changes the CRC */
		c[n / 2] ^= 1;
		free(z);
		z = frame_of(c, n, &zn);
		CHECK_EQ(load(&zi, z, zn, n, &r, &zr, &e), 0);
		c[n / 2] ^= 1;
		CHECK_EQ(flx_zstd_item_crc(&zi, 100, n - 200, &crc), 0);
		CHECK(crc != flx_crc32(0, c + 100, n - 200));
	}
	/* the bomb bound: one byte less than the content */
	CHECK_EQ(load(&zi, z, zn, n - 1, &r, &zr, &e), -EINVAL);
	CHECK(strstr(e.text, "decompresses to more than") != NULL);
	/* a byte after the frame */
	{
		unsigned char *z2 = malloc(zn + 1);

		memcpy(z2, z, zn);
		z2[zn] = 0;
		memset(&e, 0, sizeof(e));
		CHECK_EQ(load(&zi, z2, zn + 1, n, &r, &zr, &e), -EINVAL);
		CHECK(strstr(e.text, "1 bytes after its zstd frame") != NULL);
		memset(&e, 0, sizeof(e));
		CHECK_EQ(load(&zi, z2, zn - 1, n, &r, &zr, &e), -EINVAL);
		free(z2);
	}
	flx_zstd_item_release(&zi);
	free(z);
	free(c);
	free(got);
}

int main(void)
{
	test_crc();
	test_descriptors();
	test_headers();
	test_load(1000, 1);
	test_load(FLX_ZSTD_TAIL + 3, 2);
	test_load(FLX_ZSTD_HEAD + 1000, 3);
	test_load((3u << 20) + 77, 4);
	return CHECK_RESULT();
}
