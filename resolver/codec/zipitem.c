/* SPDX-License-Identifier: MIT */
#include "zipitem.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Only what torch.save writes is accepted, checked at least as strictly as
 * PyTorch's reader (miniz): we hand out raw payload slices, so every offset
 * is validated here once.  Offsets are relative to the reader's window,
 * which is the archive itself (a DCP item is a window of a .distcp file).
 */

#define SIG_LFH	     0x04034b50u
#define SIG_CDH	     0x02014b50u
#define SIG_EOCD     0x06054b50u
#define SIG_Z64_EOCD 0x06064b50u
#define SIG_Z64_LOC  0x07064b50u

#define LFH_LEN	     30
#define CDH_LEN	     46
#define EOCD_LEN     22
#define Z64_LOC_LEN  20
#define Z64_EOCD_LEN 56
#define MAX_COMMENT  0xffff
/* The CD is read in one piece.  torch writes ~60 bytes per record, so
 * this only stops absurd sizes; 4096 entries with 1 KiB names fit. */
#define MAX_CD_SIZE (16 << 20)

/* General-purpose flags that mean the payload is not plain bytes:
 * encrypted (bit 0), strong encryption (bit 6), masked headers (bit 13). */
#define FLAG_ENCRYPTED 0x2041u

struct zent {
	const char *name; /* in flx_zip.names */
	const char *rel;  /* name past "<prefix>/": what flx_zip_find() takes */
	flx_zip_rec rec;
};

/* Everything is kept between parses (flx_zip_parse()): a mount parses tens
 * of thousands of items, and ten allocations each cost more than the
 * parse itself. */
struct flx_zip {
	char *prefix; /* in names */
	size_t n;
	struct zent *ents; /* sorted by name */
	size_t cap_ents;
	char *names; /* every name NUL-terminated, the prefix after them */
	size_t cap_names;
	unsigned char *cd; /* the central directory, as read */
	size_t cap_cd;
};

/* Room for n bytes in *buf (capacity *cap), contents not kept. */
static int room(void **buf, size_t *cap, size_t n)
{
	void *b;

	if (n <= *cap)
		return 0;
	b = malloc(n);
	if (!b)
		return -ENOMEM;
	free(*buf);
	*buf = b;
	*cap = n;
	return 0;
}

struct zctx {
	const flx_reader *r;
	const char *name;
	flx_error *err;
	uint64_t max_entries; /* FLX_ZIP_MAX_ENTRIES unless raised */
};

/* The central directory's size limit for an archive of up to max entries:
 * MAX_CD_SIZE, or 256 bytes per entry when more are allowed. */
static uint64_t cd_limit(uint64_t max)
{
	return max > FLX_ZIP_MAX_ENTRIES ? max * 256 : MAX_CD_SIZE;
}

static int zfail(struct zctx *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int zfail(struct zctx *c, int code, const char *fmt, ...)
{
	char why[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return flx_error_set(c->err, code, c->name, NULL, "zip: %s", why);
}

/* Little-endian fields, written out so that the compiler makes each one
 * load (a directory's fields are read for every item at mount). */
static inline uint32_t get_le16(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static inline uint32_t get_le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static inline uint64_t get_le64(const unsigned char *p)
{
	return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

#define U16(p) get_le16(p)
#define U32(p) get_le32(p)
#define U64(p) get_le64(p)

/* Read [off, off+n) of the archive; what names the structure. */
static int zread(struct zctx *c, void *buf, size_t n, uint64_t off,
		 const char *what)
{
	int rc;

	if (off > c->r->size || n > c->r->size - off)
		return zfail(c, -EINVAL,
			     "%s at %" PRIu64
			     " runs past the end of the archive (%" PRIu64
			     " bytes)",
			     what, off, c->r->size);
	rc = flx_read_at(c->r, buf, n, off);
	if (rc)
		return zfail(c, -EIO, "cannot read %s at %" PRIu64 ": %s", what,
			     off, strerror(-rc));
	return 0;
}

/* The classic EOCD: at size-22 when there is no comment (torch), else the
 * last signature in the final 64 KiB + 22 whose comment ends at EOF. */
static int find_eocd(struct zctx *c, unsigned char eocd[EOCD_LEN],
		     uint64_t *pos)
{
	uint64_t size = c->r->size, span, base;
	unsigned char *tail;
	int rc;

	if (size < EOCD_LEN)
		return zfail(c, -EINVAL,
			     "archive of %" PRIu64
			     " bytes is too small for an EOCD record",
			     size);
	if ((rc = zread(c, eocd, EOCD_LEN, size - EOCD_LEN, "EOCD")))
		return rc;
	if (U32(eocd) == SIG_EOCD && U16(eocd + 20) == 0) {
		*pos = size - EOCD_LEN;
		return 0;
	}
	span = size < MAX_COMMENT + EOCD_LEN ? size : MAX_COMMENT + EOCD_LEN;
	base = size - span;
	tail = malloc((size_t)span);
	if (!tail)
		return zfail(c, -ENOMEM, "out of memory");
	rc = zread(c, tail, (size_t)span, base, "archive tail");
	if (rc)
		goto out;
	for (size_t i = (size_t)span - EOCD_LEN + 1; i-- > 0;) {
		if (U32(tail + i) == SIG_EOCD &&
		    i + EOCD_LEN + U16(tail + i + 20) == span) {
			memcpy(eocd, tail + i, EOCD_LEN);
			*pos = base + i;
			goto out;
		}
	}
	rc = zfail(c, -EINVAL,
		   "no end-of-central-directory record in the last %" PRIu64
		   " bytes",
		   span);
out:
	free(tail);
	return rc;
}

struct cdinfo {
	uint64_t entries, cd_off, cd_size;
	uint64_t end; /* start of the end records: the CD must end here */
};

/* EOCD (+ ZIP64 record when its locator precedes the EOCD). */
static int read_end(struct zctx *c, struct cdinfo *ci)
{
	unsigned char eocd[EOCD_LEN], loc[Z64_LOC_LEN], z[Z64_EOCD_LEN];
	uint64_t epos = 0, ent_disk, ent, cd_size, cd_off;
	bool z64 = false, sat;
	int rc;

	if ((rc = find_eocd(c, eocd, &epos)))
		return rc;
	if (U16(eocd + 4) != 0 || U16(eocd + 6) != 0)
		return zfail(c, -EINVAL,
			     "EOCD: multi-disk archives are "
			     "not supported");
	ent_disk = U16(eocd + 8);
	ent = U16(eocd + 10);
	cd_size = U32(eocd + 12);
	cd_off = U32(eocd + 16);
	ci->end = epos;
	sat = ent_disk == 0xffff || ent == 0xffff || cd_size == 0xffffffffu ||
	      cd_off == 0xffffffffu;

	if (epos >= Z64_LOC_LEN) {
		if ((rc = zread(c, loc, Z64_LOC_LEN, epos - Z64_LOC_LEN,
				"ZIP64 EOCD locator")))
			return rc;
		z64 = U32(loc) == SIG_Z64_LOC;
	}
	if (!z64 && sat)
		return zfail(c, -EINVAL,
			     "EOCD fields are saturated but there "
			     "is no ZIP64 EOCD locator");
	if (z64) {
		uint64_t zoff = U64(loc + 8);

		if (U32(loc + 4) != 0 || U32(loc + 16) > 1)
			return zfail(c, -EINVAL,
				     "ZIP64 EOCD locator: "
				     "multi-disk archives are not supported");
		if (zoff > epos - Z64_LOC_LEN ||
		    epos - Z64_LOC_LEN - zoff < Z64_EOCD_LEN)
			return zfail(c, -EINVAL,
				     "ZIP64 EOCD locator points "
				     "at %" PRIu64 ", outside the archive",
				     zoff);
		if ((rc = zread(c, z, Z64_EOCD_LEN, zoff, "ZIP64 EOCD")))
			return rc;
		if (U32(z) != SIG_Z64_EOCD)
			return zfail(c, -EINVAL,
				     "ZIP64 EOCD at %" PRIu64 ": bad signature",
				     zoff);
		if (U64(z + 4) < Z64_EOCD_LEN - 12)
			return zfail(c, -EINVAL,
				     "ZIP64 EOCD: record size %" PRIu64
				     " too small",
				     U64(z + 4));
		if (U32(z + 16) != 0 || U32(z + 20) != 0)
			return zfail(c, -EINVAL,
				     "ZIP64 EOCD: multi-disk "
				     "archives are not supported");
		/* A field that is not saturated in the classic record must
		 * agree with the ZIP64 one: anything else is corruption. */
		if ((ent_disk != 0xffff && ent_disk != U64(z + 24)) ||
		    (ent != 0xffff && ent != U64(z + 32)) ||
		    (cd_size != 0xffffffffu && cd_size != U64(z + 40)) ||
		    (cd_off != 0xffffffffu && cd_off != U64(z + 48)))
			return zfail(c, -EINVAL,
				     "EOCD and ZIP64 EOCD "
				     "disagree");
		ent_disk = U64(z + 24);
		ent = U64(z + 32);
		cd_size = U64(z + 40);
		cd_off = U64(z + 48);
		ci->end = zoff;
	}
	if (ent_disk != ent)
		return zfail(c, -EINVAL,
			     "EOCD: %" PRIu64 " entries on this "
			     "disk but %" PRIu64 " in total",
			     ent_disk, ent);
	if (ent == 0)
		return zfail(c, -EINVAL, "EOCD: the archive has no entries");
	if (ent > c->max_entries)
		return zfail(c, -EINVAL,
			     "EOCD: %" PRIu64 " entries (limit %" PRIu64 ")",
			     ent, c->max_entries);
	if (cd_size < ent * CDH_LEN)
		return zfail(c, -EINVAL,
			     "EOCD: central directory of %" PRIu64
			     " bytes cannot hold %" PRIu64 " entries",
			     cd_size, ent);
	if (cd_size > cd_limit(c->max_entries))
		return zfail(c, -EINVAL,
			     "central directory of %" PRIu64
			     " bytes (limit %" PRIu64 ")",
			     cd_size, cd_limit(c->max_entries));
	if (cd_off > ci->end || cd_size > ci->end - cd_off)
		return zfail(c, -EINVAL,
			     "central directory [%" PRIu64 ", +%" PRIu64
			     ") is outside the archive (ends "
			     "at %" PRIu64 ")",
			     cd_off, cd_size, ci->end);
	ci->entries = ent;
	ci->cd_off = cd_off;
	ci->cd_size = cd_size;
	return 0;
}

/* Replace saturated sizes/offset with the values of the ZIP64 extra field
 * (id 1).  Its fields appear only for saturated entries, in this order. */
static int zip64_extra(struct zctx *c, const unsigned char *ex, size_t n,
		       uint64_t *usize, uint64_t *csize, uint64_t *lho,
		       uint32_t *disk, size_t idx)
{
	size_t i = 0;

	while (i + 4 <= n) {
		uint32_t id = U16(ex + i), len = U16(ex + i + 2);
		const unsigned char *p = ex + i + 4;
		size_t need, o = 0;

		if (len > n - i - 4)
			return zfail(c, -EINVAL,
				     "central directory entry %zu:"
				     " extra field overruns",
				     idx);
		if (id != 1) {
			i += 4 + len;
			continue;
		}
		need = (*usize == 0xffffffffu) * 8 +
		       (*csize == 0xffffffffu) * 8 + (*lho == 0xffffffffu) * 8 +
		       (*disk == 0xffff) * 4;
		if (len < need)
			return zfail(c, -EINVAL,
				     "central directory entry %zu:"
				     " ZIP64 extra field too short",
				     idx);
		if (*usize == 0xffffffffu) {
			*usize = U64(p + o);
			o += 8;
		}
		if (*csize == 0xffffffffu) {
			*csize = U64(p + o);
			o += 8;
		}
		if (*lho == 0xffffffffu) {
			*lho = U64(p + o);
			o += 8;
		}
		if (*disk == 0xffff)
			*disk = U32(p + o);
		return 0;
	}
	if (*usize == 0xffffffffu || *csize == 0xffffffffu ||
	    *lho == 0xffffffffu || *disk == 0xffff)
		return zfail(c, -EINVAL,
			     "central directory entry %zu: sizes "
			     "saturated but no ZIP64 extra field",
			     idx);
	return 0;
}

/* Every name starts with "<prefix>/", so names sort as the part after it
 * (rel) does. */
static int cmp_ent(const void *a, const void *b)
{
	return strcmp(((const struct zent *)a)->rel,
		      ((const struct zent *)b)->rel);
}

/* Sort e[0..n) by rel: an insertion sort for the few records of a
 * torch.save item (written nearly in order), qsort() past SMALL_SORT, so
 * that a hostile directory of FLX_ZIP_MAX_ENTRIES records costs
 * n log n compares, not n^2. */
#define SMALL_SORT 16

static void sort_ents(struct zent *e, size_t n)
{
	if (n > SMALL_SORT) {
		qsort(e, n, sizeof(*e), cmp_ent);
		return;
	}
	for (size_t i = 1; i < n; i++) {
		struct zent x = e[i];
		size_t j = i;

		for (; j > 0 && strcmp(e[j - 1].rel, x.rel) > 0; j--)
			e[j] = e[j - 1];
		e[j] = x;
	}
}

/* One CD entry at cd[*cur]: fill e (its name copied to *pool, which has
 * room: names are shorter than their CD records), advance *cur and *pool. */
static int read_cd_entry(struct zctx *c, const struct cdinfo *ci,
			 const unsigned char *cd, size_t *cur, size_t idx,
			 struct zent *e, char **pool)
{
	unsigned char lfh[LFH_LEN + FLX_ZIP_MAX_NAME];
	const unsigned char *h = cd + *cur;
	uint64_t usize, csize, lho;
	uint32_t flags, method, nlen, xlen, clen, disk;
	size_t rec_len, left = (size_t)ci->cd_size - *cur;
	int rc;

	if (left < CDH_LEN)
		return zfail(c, -EINVAL,
			     "central directory entry %zu runs "
			     "past the central directory",
			     idx);
	if (U32(h) != SIG_CDH)
		return zfail(c, -EINVAL,
			     "central directory entry %zu at %" PRIu64
			     ": bad signature",
			     idx, ci->cd_off + *cur);
	flags = U16(h + 8);
	method = U16(h + 10);
	csize = U32(h + 20);
	usize = U32(h + 24);
	nlen = U16(h + 28);
	xlen = U16(h + 30);
	clen = U16(h + 32);
	disk = U16(h + 34);
	lho = U32(h + 42);
	rec_len = (size_t)CDH_LEN + nlen + xlen + clen;
	if (rec_len > left)
		return zfail(c, -EINVAL,
			     "central directory entry %zu runs "
			     "past the central directory",
			     idx);
	if (nlen == 0 || nlen > FLX_ZIP_MAX_NAME)
		return zfail(c, -EINVAL,
			     "central directory entry %zu: name "
			     "length %" PRIu32 " (limit %d)",
			     idx, nlen, FLX_ZIP_MAX_NAME);
	if (memchr(h + CDH_LEN, '\0', nlen))
		return zfail(c, -EINVAL,
			     "central directory entry %zu: NUL "
			     "in name",
			     idx);
	memcpy(*pool, h + CDH_LEN, nlen);
	(*pool)[nlen] = '\0';
	e->name = *pool;
	*pool += nlen + 1;
	if ((rc = zip64_extra(c, h + CDH_LEN + nlen, xlen, &usize, &csize, &lho,
			      &disk, idx)))
		return rc;
	if (flags & FLAG_ENCRYPTED)
		return zfail(c, -EINVAL, "record '%s': encrypted", e->name);
	if (method != 0)
		return zfail(c, -EINVAL,
			     "record '%s': compressed (method %" PRIu32
			     "); only stored records can be sliced",
			     e->name, method);
	if (csize != usize)
		return zfail(c, -EINVAL,
			     "record '%s': stored but compressed "
			     "size %" PRIu64 " != size %" PRIu64,
			     e->name, csize, usize);
	if (disk != 0)
		return zfail(c, -EINVAL, "record '%s': on disk %" PRIu32,
			     e->name, disk);

	/* The payload offset comes from the LOCAL header, as in PyTorch:
	 * its extra field (alignment padding) differs from the CD's. */
	if (lho > ci->cd_off || ci->cd_off - lho < LFH_LEN + nlen)
		return zfail(c, -EINVAL,
			     "record '%s': local header offset %" PRIu64
			     " is not before the central directory",
			     e->name, lho);
	if ((rc = zread(c, lfh, LFH_LEN + nlen, lho, "local header")))
		return rc;
	if (U32(lfh) != SIG_LFH)
		return zfail(c, -EINVAL,
			     "record '%s': bad local header "
			     "signature at %" PRIu64,
			     e->name, lho);
	if (U16(lfh + 26) != nlen || memcmp(lfh + LFH_LEN, e->name, nlen) != 0)
		return zfail(c, -EINVAL,
			     "record '%s': local header names a "
			     "different record",
			     e->name);
	e->rec.data_off = lho + LFH_LEN + nlen + U16(lfh + 28);
	e->rec.size = usize;
	e->rec.crc = (uint32_t)U32(h + 16);
	if (e->rec.data_off > ci->cd_off ||
	    usize > ci->cd_off - e->rec.data_off)
		return zfail(c, -EINVAL,
			     "record '%s': payload [%" PRIu64 ", +%" PRIu64
			     ") runs into the central directory"
			     " at %" PRIu64,
			     e->name, e->rec.data_off, usize, ci->cd_off);
	*cur += rec_len;
	return 0;
}

flx_zip *flx_zip_new(void)
{
	return calloc(1, sizeof(flx_zip));
}

static int parse(flx_zip *z, struct zctx *cx)
{
	struct zctx c = *cx;
	struct cdinfo ci = {0};
	size_t cur = 0, plen = 0;
	char *pool;
	int rc;

	if ((rc = read_end(&c, &ci)))
		return rc;
	/* names: at most the CD's bytes with a NUL each, then the prefix
	 * (shorter than the first name) */
	if (room((void **)&z->ents, &z->cap_ents,
		 (size_t)ci.entries * sizeof(*z->ents)) ||
	    room((void **)&z->cd, &z->cap_cd, (size_t)ci.cd_size) ||
	    room((void **)&z->names, &z->cap_names,
		 2 * ((size_t)ci.cd_size + (size_t)ci.entries)))
		return zfail(&c, -ENOMEM, "out of memory");
	if ((rc = zread(&c, z->cd, (size_t)ci.cd_size, ci.cd_off,
			"central directory")))
		return rc;
	pool = z->names;
	for (size_t i = 0; i < ci.entries; i++) {
		struct zent *e = &z->ents[i];
		const char *slash;

		rc = read_cd_entry(&c, &ci, z->cd, &cur, i, e, &pool);
		if (rc)
			return rc;
		z->n = i + 1;
		if (i == 0) {
			/* torch: the prefix is whatever precedes the first
			 * '/' of the first record. */
			slash = strchr(e->name, '/');
			if (!slash || slash == e->name)
				return zfail(&c, -EINVAL,
					     "record '%s': no "
					     "archive folder prefix",
					     e->name);
			plen = (size_t)(slash - e->name);
			/* after this first name, before the next one: the
			 * pool has room for the CD twice */
			z->prefix = z->names + ci.cd_size + ci.entries;
			memcpy(z->prefix, e->name, plen);
			z->prefix[plen] = '\0';
		}
		if (strncmp(e->name, z->prefix, plen) != 0 ||
		    e->name[plen] != '/')
			return zfail(&c, -EINVAL,
				     "record '%s' is not under '%s/'", e->name,
				     z->prefix);
		e->rel = e->name + plen + 1;
	}
	sort_ents(z->ents, z->n);
	for (size_t i = 1; i < z->n; i++)
		if (strcmp(z->ents[i - 1].rel, z->ents[i].rel) == 0)
			return zfail(&c, -EINVAL, "record '%s' appears twice",
				     z->ents[i].name);
	return 0;
}

static int parse_max(flx_zip *z, const flx_reader *r, const char *name,
		     uint64_t max_entries, flx_error *err)
{
	struct zctx c = {
	    .r = r, .name = name, .err = err, .max_entries = max_entries};
	int rc;

	z->n = 0;
	z->prefix = NULL;
	rc = parse(z, &c);
	if (rc) {
		z->n = 0;
		z->prefix = NULL;
	}
	return rc;
}

int flx_zip_parse(flx_zip *z, const flx_reader *r, const char *name,
		  flx_error *err)
{
	return parse_max(z, r, name, FLX_ZIP_MAX_ENTRIES, err);
}

int flx_zip_open_max(const flx_reader *r, const char *name,
		     uint32_t max_entries, flx_zip **out, flx_error *err)
{
	flx_zip *z = flx_zip_new();
	int rc;

	if (!z)
		return flx_error_set(err, -ENOMEM, name, NULL,
				     "zip: out of memory");
	if (max_entries < FLX_ZIP_MAX_ENTRIES)
		max_entries = FLX_ZIP_MAX_ENTRIES;
	rc = parse_max(z, r, name, max_entries, err);
	if (rc) {
		flx_zip_close(z);
		return rc;
	}
	*out = z;
	return 0;
}

int flx_zip_open(const flx_reader *r, const char *name, flx_zip **out,
		 flx_error *err)
{
	flx_zip *z = flx_zip_new();
	int rc;

	if (!z)
		return flx_error_set(err, -ENOMEM, name, NULL,
				     "zip: out of memory");
	rc = flx_zip_parse(z, r, name, err);
	if (rc) {
		flx_zip_close(z);
		return rc;
	}
	*out = z;
	return 0;
}

int flx_zip_find(const flx_zip *z, const char *rel, flx_zip_rec *rec)
{
	size_t lo = 0, hi;

	if (!z || !rel || !z->prefix || !z->n)
		return -ENOENT;
	hi = z->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int d = strcmp(rel, z->ents[mid].rel);

		if (d == 0) {
			*rec = z->ents[mid].rec;
			return 0;
		}
		if (d < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return -ENOENT;
}

const char *flx_zip_prefix(const flx_zip *z)
{
	return z ? z->prefix : NULL;
}

void flx_zip_close(flx_zip *z)
{
	if (!z)
		return;
	free(z->ents);
	free(z->names);
	free(z->cd);
	free(z);
}
