/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_CRC32_H
#define FLX_RESOLVER_CRC32_H

/*
 * CRC-32 as zip records carry it (ISO-HDLC: reflected polynomial
 * 0xEDB88320, initial and final value 0xFFFFFFFF): zlib's crc32_z() and
 * crc32_combine() under the project's names, with zlib's calling
 * convention: flx_crc32(0, p, n) is the CRC of p[0..n), and
 * flx_crc32(flx_crc32(0, a, na), b, nb) that of a followed by b.
 *
 * Thread-safety: pure functions.
 */

#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

/** The CRC of buf[0..n) continued from crc (0 to start). */
static inline uint32_t flx_crc32(uint32_t crc, const void *buf, size_t n)
{
	return (uint32_t)crc32_z(crc, (const Bytef *)buf, n);
}

/** The CRC of A followed by B from crc1 = CRC(A), crc2 = CRC(B) and
 * len2 = |B| (z_off_t is 64 bits: the build sets _FILE_OFFSET_BITS=64). */
static inline uint32_t flx_crc32_combine(uint32_t crc1, uint32_t crc2,
					 uint64_t len2)
{
	return (uint32_t)crc32_combine(crc1, crc2, (z_off_t)len2);
}

#endif
