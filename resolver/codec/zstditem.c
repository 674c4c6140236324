/* SPDX-License-Identifier: MIT */
/*
 * zstd items: the frame header (RFC 8878 section 3.1.1.1) read by hand, so
 * that what is accepted at mount is stated here and fuzzed, then the frame
 * decoded by libzstd's streaming decoder into a head, a tail ring and a
 * count (zstditem.h).
 */
#include "zstditem.h"

#include "crc32.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define IN_CAP	(128u << 10)
#define OUT_CAP (128u << 10)

bool flx_zstd_descriptor_ok(const char *desc)
{
	static const char name[] = "stream.zstd/";
	const char *v;

	if (strncmp(desc, name, sizeof(name) - 1) != 0)
		return false;
	v = desc + sizeof(name) - 1;
	/* major component "1": "1" alone or followed by ".minor..." */
	return v[0] == '1' && (v[1] == '\0' || v[1] == '.');
}

static uint64_t le(const unsigned char *p, int n)
{
	uint64_t v = 0;

	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

int flx_zstd_frame_check(const unsigned char *hdr, size_t n, uint64_t max_out,
			 const char *name, const char *key, flx_zstd_frame *out,
			 flx_error *err)
{
	static const int did_len[4] = {0, 1, 2, 4};
	unsigned fhd, fcs_flag, single;
	size_t need, at;
	int fcs_len;

	if (n < 5 || le(hdr, 4) != FLX_ZSTD_MAGIC)
		return flx_error_set(err, -EINVAL, name, key,
				     "item is not a zstd frame (no magic)");
	fhd = hdr[4];
	fcs_flag = fhd >> 6;
	single = (fhd >> 5) & 1;
	fcs_len = fcs_flag ? 1 << fcs_flag : (int)single;
	if (fhd & 0x08)
		return flx_error_set(err, -EINVAL, name, key,
				     "zstd frame header has its reserved bit "
				     "set");
	if (fhd & 3)
		return flx_error_set(err, -EINVAL, name, key,
				     "zstd frame needs a dictionary");
	need = 5 + !single + (size_t)did_len[fhd & 3] + (size_t)fcs_len;
	if (n < need)
		return flx_error_set(err, -EINVAL, name, key,
				     "zstd frame header is cut short");
	at = 5;
	out->checksum = (fhd >> 2) & 1;
	out->content_size = UINT64_MAX;
	out->window = 0;
	if (!single) {
		unsigned wd = hdr[at++], exp = wd >> 3;
		uint64_t base = 1ull << (10 + exp);

		out->window = base + (base / 8) * (wd & 7);
	}
	if (fcs_len) {
		out->content_size = le(hdr + at, fcs_len);
		if (fcs_len == 2)
			out->content_size += 256;
		if (single)
			out->window = out->content_size;
		if (out->content_size > max_out)
			return flx_error_set(
			    err, -EINVAL, name, key,
			    "zstd frame declares %llu bytes of content, more "
			    "than the item may hold (%llu)",
			    (unsigned long long)out->content_size,
			    (unsigned long long)max_out);
	}
	if (out->window > (1ull << FLX_ZSTD_WINDOW_LOG_MAX))
		return flx_error_set(err, -EINVAL, name, key,
				     "zstd frame window of %llu bytes exceeds "
				     "%u MiB",
				     (unsigned long long)out->window,
				     (1u << FLX_ZSTD_WINDOW_LOG_MAX) >> 20);
	return 0;
}

void flx_zstd_item_release(flx_zstd_item *z)
{
	ZSTD_freeDCtx(z->dctx);
	free(z->in);
	free(z->head);
	free(z->ring);
	free(z->tail);
	free(z->out);
	memset(z, 0, sizeof(*z));
}

/* Copy [off, off+n) of the decompressed item from its head and tail. */
static int zr_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	const flx_zstd_item *z = ((flx_zstd_reader *)ctx)->z;
	unsigned char *d = buf;
	uint64_t tstart = z->size - z->tlen;

	while (n) {
		size_t k;

		if (off < z->hlen) {
			k = z->hlen - off < n ? (size_t)(z->hlen - off) : n;
			memcpy(d, z->head + off, k);
		} else if (off >= tstart && off < z->size) {
			k = z->size - off < n ? (size_t)(z->size - off) : n;
			memcpy(d, z->tail + (off - tstart), k);
		} else {
			return -EIO; /* the middle was not kept */
		}
		d += k;
		off += k;
		n -= k;
	}
	return 0;
}

static int alloc_scratch(flx_zstd_item *z)
{
	if (!z->dctx) {
		z->dctx = ZSTD_createDCtx();
		z->in = malloc(IN_CAP);
		z->head = malloc(FLX_ZSTD_HEAD);
		z->ring = malloc(FLX_ZSTD_TAIL);
		z->tail = malloc(FLX_ZSTD_TAIL);
		z->out = malloc(OUT_CAP);
	}
	if (!z->dctx || !z->in || !z->head || !z->ring || !z->tail || !z->out)
		return -ENOMEM;
	ZSTD_DCtx_reset(z->dctx, ZSTD_reset_session_only);
	if (ZSTD_isError(ZSTD_DCtx_setParameter(z->dctx, ZSTD_d_windowLogMax,
						FLX_ZSTD_WINDOW_LOG_MAX)))
		return -ENOMEM;
	return 0;
}

/* Before p[0..n) (the bytes at z->size) enter the ring: the bytes they
 * push out of it, past the head, continue z->crc_mid, which then covers
 * [FLX_ZSTD_HEAD, max(FLX_ZSTD_HEAD, new size - FLX_ZSTD_TAIL)). */
static void evict(flx_zstd_item *z, const unsigned char *p, size_t n)
{
	uint64_t a = z->size > FLX_ZSTD_TAIL ? z->size - FLX_ZSTD_TAIL : 0;
	uint64_t b =
	    z->size + n > FLX_ZSTD_TAIL ? z->size + n - FLX_ZSTD_TAIL : 0;

	for (a = a < FLX_ZSTD_HEAD ? FLX_ZSTD_HEAD : a; a < b;) {
		size_t k;

		if (a < z->size) { /* still in the ring */
			size_t at = (size_t)(a % FLX_ZSTD_TAIL);

			k = FLX_ZSTD_TAIL - at;
			if (k > z->size - a)
				k = (size_t)(z->size - a);
			if (k > b - a)
				k = (size_t)(b - a);
			z->crc_mid = flx_crc32(z->crc_mid, z->ring + at, k);
		} else { /* new bytes that never stay */
			k = (size_t)(b - a);
			z->crc_mid =
			    flx_crc32(z->crc_mid, p + (a - z->size), k);
		}
		a += k;
	}
}

/* Keep out[0..n), the bytes at z->size, in the head and the ring. */
static void keep(flx_zstd_item *z, const unsigned char *p, size_t n)
{
	evict(z, p, n);
	if (z->size < FLX_ZSTD_HEAD) {
		size_t k = FLX_ZSTD_HEAD - z->size < n
			       ? (size_t)(FLX_ZSTD_HEAD - z->size)
			       : n;

		memcpy(z->head + z->size, p, k);
	}
	if (n > FLX_ZSTD_TAIL) { /* only the last ones can stay */
		z->size += n - FLX_ZSTD_TAIL;
		p += n - FLX_ZSTD_TAIL;
		n = FLX_ZSTD_TAIL;
	}
	while (n) {
		size_t at = (size_t)(z->size % FLX_ZSTD_TAIL);
		size_t k = FLX_ZSTD_TAIL - at < n ? FLX_ZSTD_TAIL - at : n;

		memcpy(z->ring + at, p, k);
		z->size += k;
		p += k;
		n -= k;
	}
}

int flx_zstd_item_load(flx_zstd_item *z, const flx_reader *src,
		       uint64_t max_out, const char *name, const char *key,
		       flx_reader *r, flx_zstd_reader *rctx, flx_error *err)
{
	flx_zstd_frame fr;
	uint64_t pos = 0;
	size_t ret = 1;
	int rc = alloc_scratch(z);

	if (rc)
		return rc;
	z->size = 0;
	z->hlen = z->tlen = 0;
	z->crc_mid = 0;
	{
		size_t n = src->size < FLX_ZSTD_HEADER_MAX
			       ? (size_t)src->size
			       : FLX_ZSTD_HEADER_MAX;

		rc = flx_read_at(src, z->in, n, 0);
		if (!rc)
			rc = flx_zstd_frame_check(z->in, n, max_out, name, key,
						  &fr, err);
		if (rc)
			return rc;
	}
	while (pos < src->size && ret != 0) {
		size_t len = src->size - pos < IN_CAP
				 ? (size_t)(src->size - pos)
				 : IN_CAP;
		ZSTD_inBuffer in = {z->in, len, 0};
		bool full = false;

		rc = flx_read_at(src, z->in, len, pos);
		if (rc)
			return rc;
		while ((in.pos < in.size || full) && ret != 0) {
			ZSTD_outBuffer o = {z->out, OUT_CAP, 0};

			ret = ZSTD_decompressStream(z->dctx, &o, &in);
			if (ZSTD_isError(ret))
				return flx_error_set(err, -EINVAL, name, key,
						     "zstd frame is corrupt: "
						     "%s",
						     ZSTD_getErrorName(ret));
			full = o.pos == o.size;
			z->decoded += o.pos;
			if (o.pos > max_out - z->size)
				return flx_error_set(
				    err, -EINVAL, name, key,
				    "zstd frame decompresses to more than the "
				    "%llu bytes the item may hold",
				    (unsigned long long)max_out);
			keep(z, z->out, o.pos);
		}
		pos += in.pos;
	}
	if (ret != 0)
		return flx_error_set(err, -EINVAL, name, key,
				     "zstd frame is incomplete (the item "
				     "ends before the frame)");
	if (pos != src->size)
		return flx_error_set(err, -EINVAL, name, key,
				     "item has %llu bytes after its zstd frame",
				     (unsigned long long)(src->size - pos));
	if (fr.content_size != UINT64_MAX && fr.content_size != z->size)
		return flx_error_set(err, -EINVAL, name, key,
				     "zstd frame holds %llu bytes, its header "
				     "says %llu",
				     (unsigned long long)z->size,
				     (unsigned long long)fr.content_size);
	z->hlen = z->size < FLX_ZSTD_HEAD ? (size_t)z->size : FLX_ZSTD_HEAD;
	z->tlen = z->size < FLX_ZSTD_TAIL ? (size_t)z->size : FLX_ZSTD_TAIL;
	{
		size_t at = (size_t)(z->size % FLX_ZSTD_TAIL);

		if (z->size >= FLX_ZSTD_TAIL) {
			memcpy(z->tail, z->ring + at, FLX_ZSTD_TAIL - at);
			memcpy(z->tail + FLX_ZSTD_TAIL - at, z->ring, at);
		} else {
			memcpy(z->tail, z->ring, z->tlen);
		}
	}
	rctx->z = z;
	r->pread = zr_pread;
	r->ctx = rctx;
	r->size = z->size;
	return 0;
}

int flx_zstd_item_crc(const flx_zstd_item *z, uint64_t off, uint64_t len,
		      uint32_t *crc)
{
	uint64_t end = off + len, t0 = z->size - z->tlen, mid_end;

	if (off > z->size || len > z->size - off)
		return -EINVAL;
	if (end <= z->hlen) { /* all in the head */
		*crc = flx_crc32(0, z->head + off, (size_t)len);
		return 0;
	}
	/* head [off, HEAD), then the evicted middle, then the tail */
	mid_end = t0 > FLX_ZSTD_HEAD ? t0 : FLX_ZSTD_HEAD;
	if (off >= z->hlen || end < mid_end || z->hlen != FLX_ZSTD_HEAD)
		return -EIO;
	*crc = flx_crc32(0, z->head + off, (size_t)(FLX_ZSTD_HEAD - off));
	*crc = flx_crc32_combine(*crc, z->crc_mid, mid_end - FLX_ZSTD_HEAD);
	*crc =
	    flx_crc32(*crc, z->tail + (mid_end - t0), (size_t)(end - mid_end));
	return 0;
}
