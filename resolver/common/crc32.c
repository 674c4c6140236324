/* SPDX-License-Identifier: MIT */
/*
 * CRC-32, eight bytes a step (slicing-by-8 tables), and the combination of
 * two CRCs by polynomial arithmetic modulo the CRC polynomial (the method
 * of zlib 1.2.12's crc32_combine(): x^(8 len) mod p by repeated squaring).
 */
#include "crc32.h"

#include <pthread.h>
#include <string.h>

#define POLY 0xedb88320u

static uint32_t tab[8][256];
static uint32_t x2n[32]; /* x^(2^n) mod p */
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* a * b mod p, both reflected polynomials */
static uint32_t multmodp(uint32_t a, uint32_t b)
{
	uint32_t m = 1u << 31, p = 0;

	for (;;) {
		if (a & m) {
			p ^= b;
			if ((a & (m - 1)) == 0)
				break;
		}
		m >>= 1;
		b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
	}
	return p;
}

static void init(void)
{
	uint32_t p = 1u << 30; /* x^1 */

	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
		tab[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int k = 1; k < 8; k++)
			tab[k][i] =
			    (tab[k - 1][i] >> 8) ^ tab[0][tab[k - 1][i] & 0xff];
	x2n[0] = p;
	for (int n = 1; n < 32; n++)
		x2n[n] = p = multmodp(p, p);
}

static uint32_t le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

uint32_t flx_crc32(uint32_t crc, const void *buf, size_t n)
{
	const unsigned char *p = buf;

	pthread_once(&once, init);
	crc = ~crc;
	for (; n >= 8; p += 8, n -= 8) {
		uint32_t lo = le32(p) ^ crc, hi = le32(p + 4);

		crc = tab[7][lo & 0xff] ^ tab[6][(lo >> 8) & 0xff] ^
		      tab[5][(lo >> 16) & 0xff] ^ tab[4][lo >> 24] ^
		      tab[3][hi & 0xff] ^ tab[2][(hi >> 8) & 0xff] ^
		      tab[1][(hi >> 16) & 0xff] ^ tab[0][hi >> 24];
	}
	while (n--)
		crc = (crc >> 8) ^ tab[0][(crc ^ *p++) & 0xff];
	return ~crc;
}

uint32_t flx_crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
{
	uint32_t p = 1u << 31; /* x^0 */
	unsigned k = 3;	       /* len2 bytes = 8 * len2 bits = 2^3 * len2 */

	pthread_once(&once, init);
	for (; len2; len2 >>= 1, k++)
		if (len2 & 1)
			p = multmodp(x2n[k & 31], p);
	return multmodp(p, crc1) ^ crc2;
}
