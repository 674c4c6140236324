/* SPDX-License-Identifier: MIT */
#ifndef FLX_TOOLS_SHA256_H
#define FLX_TOOLS_SHA256_H

/*
 * SHA-256 (FIPS 180-4), incremental, for flexfs-inspect's digests.
 * Thread-safety: a context is used by one thread at a time.
 */

#include <stddef.h>
#include <stdint.h>

typedef struct flx_sha256 {
	uint32_t h[8];
	uint64_t len; /* bytes hashed */
	unsigned char buf[64];
	size_t nbuf;
} flx_sha256;

void flx_sha256_init(flx_sha256 *s);

/** Hash n more bytes of p. */
void flx_sha256_update(flx_sha256 *s, const void *p, size_t n);

/** The digest as 64 lowercase hex digits and a NUL in hex[65]. */
void flx_sha256_hex(flx_sha256 *s, char hex[65]);

#endif
