/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_ZIPITEM_H
#define FLX_RESOLVER_ZIPITEM_H

/*
 * Locate records inside one torch.save ZIP archive (a DCP item): EOCD at the
 * end (ZIP64 record through its locator when present), the central
 * directory, then each record's local header, exactly as PyTorch's reader
 * computes record offsets (lho + 30 + name_len + extra_len from the LOCAL
 * header; size from the central directory).  Only STORED records are
 * accepted: torch.save never compresses, and we slice payloads in place.
 */

#include "error.h"
#include "reader.h"

#include <stdint.h>

#define FLX_ZIP_MAX_ENTRIES 4096
#define FLX_ZIP_MAX_NAME    1024

typedef struct flx_zip_rec {
	uint64_t data_off; /* payload offset relative to the archive start */
	uint64_t size;	   /* payload bytes */
	uint32_t crc;	   /* CRC-32 the central directory records */
} flx_zip_rec;

typedef struct flx_zip flx_zip;

/**
 * Parse the archive that fills reader r entirely ([0, r->size)).
 * name is used in messages (e.g. "__0_0.distcp@1234").
 * Validates: EOCD/ZIP64 signatures and counts, CD inside the archive,
 * every entry STORED, unencrypted, single disk, names with a common
 * "<prefix>/" (taken from the first CD entry, as torch does), local header
 * signature, payload inside the archive.
 * @return 0 and *out (owned; flx_zip_close()), -EINVAL (malformed; err
 *         names the record and reason), -EIO, -ENOMEM.
 */
int flx_zip_open(const flx_reader *r, const char *name, flx_zip **out,
		 flx_error *err);

/**
 * flx_zip_open() for an archive of up to max_entries records (at least
 * FLX_ZIP_MAX_ENTRIES), its central directory up to 256 bytes per record:
 * a whole torch.save file holds one record per storage.
 * @return as flx_zip_open().
 */
int flx_zip_open_max(const flx_reader *r, const char *name,
		     uint32_t max_entries, flx_zip **out, flx_error *err);

/**
 * The same as a reusable object: flx_zip_new() makes an empty one (NULL:
 * out of memory), flx_zip_parse() parses r into it, replacing what it
 * held and reusing its memory (no allocation once it has grown to the
 * largest archive seen).  After a failed parse z holds no records but
 * may be parsed again.  Records and the prefix are valid until the next
 * parse or flx_zip_close().  @return as flx_zip_open().
 */
flx_zip *flx_zip_new(void);
int flx_zip_parse(flx_zip *z, const flx_reader *r, const char *name,
		  flx_error *err);

/**
 * Find record "<prefix>/<rel>" (e.g. rel = "data.pkl", "data/0").
 * @return 0 and *rec, or -ENOENT.
 */
int flx_zip_find(const flx_zip *z, const char *rel, flx_zip_rec *rec);

/** The archive prefix ("archive"); borrowed, valid until close. */
const char *flx_zip_prefix(const flx_zip *z);

void flx_zip_close(flx_zip *z);

#endif
