/* SPDX-License-Identifier: MIT */
/* SHA-256 through libcrypto's EVP interface (openssl/evp.h). */
#include "sha256.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>

int flx_sha256_init(flx_sha256 *s)
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();

	s->ctx = c;
	s->bad = false;
	if (!c)
		return -ENOMEM;
	if (EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
		flx_sha256_free(s);
		return -EIO;
	}
	return 0;
}

void flx_sha256_update(flx_sha256 *s, const void *p, size_t n)
{
	if (!s->ctx || s->bad || !n)
		return;
	if (EVP_DigestUpdate(s->ctx, p, n) != 1)
		s->bad = true;
}

int flx_sha256_hex(flx_sha256 *s, char hex[65])
{
	unsigned char d[EVP_MAX_MD_SIZE];
	unsigned int len = 0;
	int rc = -EIO;

	hex[0] = 0;
	if (!s->ctx || s->bad)
		goto out;
	if (EVP_DigestFinal_ex(s->ctx, d, &len) != 1 || len != 32)
		goto out;
	for (unsigned int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", d[i]);
	rc = 0;
out:
	flx_sha256_free(s);
	return rc;
}

void flx_sha256_free(flx_sha256 *s)
{
	EVP_MD_CTX_free(s->ctx);
	s->ctx = NULL;
}
