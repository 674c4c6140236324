/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_ZSTDITEM_H
#define FLX_RESOLVER_ZSTDITEM_H

/*
 * zstd-transformed DCP items (torch >= 2.7's ZStandard extension,
 * docs/formats/dcp.md#zstd-items): the item's bytes are one zstd frame whose
 * content is the ordinary item (a torch.save zip, or a BYTE_IO value).
 *
 * At mount an item is validated in two steps.  flx_zstd_frame_check()
 * looks at the frame header only (magic, header, window bounded, content
 * size when present).  flx_zstd_item_load() then decompresses the whole
 * frame through libzstd's streaming API with bounded memory: it keeps the
 * first FLX_ZSTD_HEAD and the last FLX_ZSTD_TAIL decompressed bytes and
 * counts the rest, and hands back a reader over those two windows, which
 * the zip and data.pkl parsers (zipitem.h, torchpkl.h) read as they read
 * an uncompressed item: a torch.save zip keeps data.pkl and the local
 * headers before the storage record at its start and the directory at its
 * end.  A read of the middle (the storage payload) is -EIO.
 *
 * Thread-safety: a flx_zstd_item is used by one thread at a time;
 * flx_zstd_frame_check() and flx_zstd_descriptor_ok() are pure.
 */

#include "error.h"
#include "reader.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* libzstd's frame magic, little-endian bytes 28 b5 2f fd */
#define FLX_ZSTD_MAGIC 0xFD2FB528u
/* The largest window a frame may ask for (8 MiB: level 19; torch writes
 * level 3, 2 MiB).  It bounds a decompression stream's memory. */
#define FLX_ZSTD_WINDOW_LOG_MAX 23
/* A frame header is at most this long (magic included). */
#define FLX_ZSTD_HEADER_MAX 18
/* Decompressed bytes kept at the start and the end of an item at mount. */
#define FLX_ZSTD_HEAD ((1u << 20) + (64u << 10))
#define FLX_ZSTD_TAIL (64u << 10)

/** Whether a transform descriptor is one flexfs decodes: "stream.zstd"
 * with a version whose major component is 1 ("stream.zstd/1",
 * "stream.zstd/1.1"), as torch's ZStandard extension accepts. */
bool flx_zstd_descriptor_ok(const char *desc);

typedef struct flx_zstd_frame {
	uint64_t window;       /* bytes */
	uint64_t content_size; /* UINT64_MAX: not in the header */
	bool checksum;	       /* an XXH64 checksum ends the frame */
} flx_zstd_frame;

/**
 * Validate the header of a frame that starts at hdr[0] (n: the bytes
 * available there, the item's length when shorter than
 * FLX_ZSTD_HEADER_MAX): magic, reserved bits, no dictionary, window at
 * most 1 << FLX_ZSTD_WINDOW_LOG_MAX, content size (when present) at most
 * max_out.  Errors name file `name` and key `key`.
 * @return 0 and *out, or -EINVAL with err.
 */
int flx_zstd_frame_check(const unsigned char *hdr, size_t n, uint64_t max_out,
			 const char *name, const char *key, flx_zstd_frame *out,
			 flx_error *err);

/* Scratch for flx_zstd_item_load(), reused item after item. */
typedef struct flx_zstd_item {
	void *dctx; /* ZSTD_DCtx */
	unsigned char *in;
	unsigned char *head; /* FLX_ZSTD_HEAD bytes */
	unsigned char *ring; /* FLX_ZSTD_TAIL bytes, the last ones written */
	unsigned char *tail; /* the ring in order, for the reader */
	unsigned char *out;  /* scratch output */
	/* of the last item loaded */
	uint64_t size; /* decompressed bytes */
	size_t hlen, tlen;
	uint32_t crc_mid; /* CRC-32 of what lies between head and tail */
	uint64_t decoded; /* statistics: every byte decompressed so far */
} flx_zstd_item;

/** Zero it first; release with flx_zstd_item_release() (also after a
 * failed load, or never used). */
void flx_zstd_item_release(flx_zstd_item *z);

/**
 * Decompress the frame that fills src ([0, src->size)) and keep its head
 * and tail.  Refused (-EINVAL with err, naming `name` and `key`): a bad
 * header (flx_zstd_frame_check()), a corrupt block or checksum, a frame
 * that does not end within src or is followed by other bytes, a content
 * size that disagrees with the header's, and more than max_out bytes of
 * content (a decompression bomb: decoding stops there).  -ENOMEM; src's
 * errors.
 * @return 0, *r reading the decompressed item (r->size = z->size: its
 *         first z->hlen and last z->tlen bytes; -EIO elsewhere), valid
 *         until the next load or release; rctx must outlive r.
 */
typedef struct flx_zstd_reader {
	const flx_zstd_item *z;
} flx_zstd_reader;

int flx_zstd_item_load(flx_zstd_item *z, const flx_reader *src,
		       uint64_t max_out, const char *name, const char *key,
		       flx_reader *r, flx_zstd_reader *rctx, flx_error *err);

/**
 * The CRC-32 (zip's, crc32.h) of content bytes [off, off+len) of the last
 * item loaded, which must start in its head and end in the head or its
 * tail (a torch.save zip's storage record does: data.pkl before it, small
 * records after it).  The bytes between were never kept: their CRC was
 * taken as they went by.
 * @return 0 and *crc; -EIO when the range does not lie so; -EINVAL when it
 *         leaves the content.
 */
int flx_zstd_item_crc(const flx_zstd_item *z, uint64_t off, uint64_t len,
		      uint32_t *crc);

#endif
