/* SPDX-License-Identifier: MIT */
#ifndef FLX_TOOLS_SHA256_H
#define FLX_TOOLS_SHA256_H

/*
 * SHA-256, incremental, for flexfs-inspect's and flexfs-materialize's
 * digests: OpenSSL's libcrypto (EVP) underneath, which uses the CPU's
 * SHA instructions where there are some.
 *
 * A context is set up by flx_sha256_init() and released either by
 * flx_sha256_hex() (which gives the digest) or by flx_sha256_free()
 * (on an error path); flx_sha256_free() on a released or zeroed context
 * does nothing.
 * Thread-safety: a context is used by one thread at a time; distinct
 * contexts may be used on several threads.
 */

#include <stdbool.h>
#include <stddef.h>

typedef struct flx_sha256 {
	void *ctx; /* EVP_MD_CTX, owned; NULL once released */
	bool bad;  /* an update failed: the digest is refused */
} flx_sha256;

/** @return 0, or -ENOMEM / -EIO (libcrypto refused; s is then released). */
int flx_sha256_init(flx_sha256 *s);

/** Hash n more bytes of p (a failure is reported by flx_sha256_hex()). */
void flx_sha256_update(flx_sha256 *s, const void *p, size_t n);

/** The digest as 64 lowercase hex digits and a NUL in hex[65]; releases s.
 * @return 0, or -EIO (an update or the final step failed; hex is then
 * the empty string). */
int flx_sha256_hex(flx_sha256 *s, char hex[65]);

/** Release s without a digest. */
void flx_sha256_free(flx_sha256 *s);

#endif
