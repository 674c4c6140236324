/* SPDX-License-Identifier: MIT */
/*
 * The ZIP record locator against real torch.save archives (torch 1.13 and
 * 2.6, alone, inside a bigger file and as items of a DCP data file) and
 * Python-made ones, with offsets computed by Python's zipfile
 * (data/vectors.h), then against damaged copies.
 */
#include "check.h"
#include "data/vectors.h"
#include "zipitem.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NZIP (sizeof(zip_vecs) / sizeof(zip_vecs[0]))

static uint64_t fnv64(const unsigned char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325u;

	for (size_t i = 0; i < n; i++)
		h = (h ^ s[i]) * 0x100000001b3u;
	return h;
}

static int open_mem(const unsigned char *buf, size_t len, flx_zip **z,
		    flx_error *e)
{
	flx_reader r;
	flx_mem_reader m;

	flx_error_init(e);
	*z = NULL;
	flx_reader_mem(&r, &m, buf, len);
	return flx_zip_open(&r, "item", z, e);
}

/* Check every record of vector v in an opened archive; base = where the
 * archive starts in file (the window). */
static void check_records(const struct zip_vec *v, const flx_zip *z,
			  const unsigned char *file)
{
	flx_zip_rec rec;

	CHECK_STR(flx_zip_prefix(z), v->prefix);
	for (int i = 0; i < v->nrec; i++) {
		const struct zip_rec_vec *rv = &v->rec[i];

		memset(&rec, 0, sizeof(rec));
		CHECK_EQ(flx_zip_find(z, rv->rel, &rec), 0);
		CHECK_EQ(rec.data_off, rv->off);
		CHECK_EQ(rec.size, rv->size);
		if (rec.data_off + rec.size <= v->win_len)
			CHECK(fnv64(file + v->win_off + rec.data_off,
				    rec.size) == rv->fnv);
	}
	CHECK_EQ(flx_zip_find(z, "nope", &rec), -ENOENT);
	CHECK_EQ(flx_zip_find(z, "", &rec), -ENOENT);
	CHECK_EQ(flx_zip_find(z, "data", &rec), -ENOENT);
	CHECK_EQ(flx_zip_find(z, NULL, &rec), -ENOENT);
}

static void test_vectors(void)
{
	int n113 = 0, n26 = 0, nwin = 0, nbyteio = 0, nbad = 0;

	CHECK(NZIP >= 40);
	for (size_t i = 0; i < NZIP; i++) {
		const struct zip_vec *v = &zip_vecs[i];
		size_t len = 0;
		unsigned char *buf = check_read_file(v->file, &len);
		flx_zip *z = NULL;
		flx_zip_rec rec;
		flx_error e;
		int rc;

		CHECK(buf != NULL);
		if (!buf)
			continue;
		CHECK(v->win_off + v->win_len <= len);
		rc = open_mem(buf + v->win_off, (size_t)v->win_len, &z, &e);
		if (v->err) {
			CHECK_EQ(rc, -EINVAL);
			CHECK(strstr(e.text, v->err) != NULL);
			CHECK(z == NULL);
			nbad++;
			free(buf);
			continue;
		}
		if (rc)
			fprintf(stderr, "%s@%" PRIu64 ": %s\n", v->file,
				v->win_off, e.text);
		CHECK_EQ(rc, 0);
		if (z)
			check_records(v, z, buf);
		/* BYTE_IO items: a pickle without storages, no data/0 */
		if (z && !v->has_tensor && strstr(v->file, "dcp")) {
			CHECK_EQ(flx_zip_find(z, "data/0", &rec), -ENOENT);
			CHECK_EQ(flx_zip_find(z, "data.pkl", &rec), 0);
			nbyteio++;
		}
		flx_zip_close(z);
		n113 += strncmp(v->file, "torch/t113_", 11) == 0;
		n26 += strncmp(v->file, "torch/t26_", 10) == 0;
		nwin += v->win_off != 0;
		free(buf);
	}
	CHECK(n113 >= 15);
	CHECK(n26 >= 15);
	CHECK(nwin >= 4);
	CHECK(nbyteio >= 2);
	CHECK_EQ(nbad, 2);
}

/* The same windows through a file descriptor, as the resolver reads
 * items of a .distcp file. */
/* One reusable object through every vector, in order and then backwards
 * (so each archive follows a bigger and a smaller one, and the failing
 * ones in between): records as from a fresh open, nothing left over. */
static void test_reuse(void)
{
	flx_zip *z = flx_zip_new();
	const struct zip_vec *prev = NULL;
	int stale = 0;

	CHECK(z != NULL);
	if (!z)
		return;
	for (size_t k = 0; k < 2 * NZIP; k++) {
		const struct zip_vec *v =
		    &zip_vecs[k < NZIP ? k : 2 * NZIP - 1 - k];
		size_t len = 0;
		unsigned char *buf = check_read_file(v->file, &len);
		flx_reader r;
		flx_mem_reader m;
		flx_zip_rec rec;
		flx_error e;
		int rc;

		if (!buf)
			continue;
		flx_error_init(&e);
		flx_reader_mem(&r, &m, buf + v->win_off, (size_t)v->win_len);
		rc = flx_zip_parse(z, &r, "item", &e);
		if (v->err) {
			CHECK_EQ(rc, -EINVAL);
			CHECK(strstr(e.text, v->err) != NULL);
			/* a failed parse leaves no records behind */
			CHECK_EQ(flx_zip_find(z, "data.pkl", &rec), -ENOENT);
			CHECK(flx_zip_prefix(z) == NULL);
		} else {
			CHECK_EQ(rc, 0);
			check_records(v, z, buf);
			/* records only the previous archive had are gone */
			for (int i = 0; prev && i < prev->nrec; i++) {
				bool here = false;

				for (int j = 0; j < v->nrec; j++)
					here |= !strcmp(prev->rec[i].rel,
							v->rec[j].rel);
				if (!here)
					CHECK_EQ(flx_zip_find(
						     z, prev->rec[i].rel, &rec),
						 -ENOENT);
				stale += !here;
			}
		}
		prev = v;
		free(buf);
	}
	CHECK(stale > 0); /* the vectors differ enough to test that */
	flx_zip_close(z);
}

static void test_fd_windows(void)
{
	int nwin = 0;

	for (size_t i = 0; i < NZIP; i++) {
		const struct zip_vec *v = &zip_vecs[i];
		char path[512];
		size_t len = 0;
		unsigned char *buf;
		flx_reader r;
		flx_fd_reader fr;
		flx_zip *z = NULL;
		flx_error e;
		int fd;

		if (v->err || v->win_off == 0)
			continue;
		snprintf(path, sizeof(path), "unit/data/%s", v->file);
		fd = open(path, O_RDONLY);
		buf = check_read_file(v->file, &len);
		CHECK(fd >= 0 && buf);
		if (fd < 0 || !buf) {
			free(buf);
			continue;
		}
		flx_error_init(&e);
		flx_reader_fd(&r, &fr, fd, v->win_off, v->win_len);
		CHECK_EQ(flx_zip_open(&r, v->file, &z, &e), 0);
		if (z)
			check_records(v, z, buf);
		flx_zip_close(z);
		/* the whole file is no archive: the window matters */
		z = NULL;
		flx_reader_fd(&r, &fr, fd, 0, len);
		if (len != v->win_off + v->win_len) {
			flx_error_init(&e);
			CHECK_EQ(flx_zip_open(&r, v->file, &z, &e), -EINVAL);
			CHECK(z == NULL);
		}
		/* an I/O error is not a format error */
		flx_reader_fd(&r, &fr, -1, v->win_off, v->win_len);
		flx_error_init(&e);
		CHECK_EQ(flx_zip_open(&r, v->file, &z, &e), -EIO);
		CHECK(strstr(e.text, "Bad file descriptor") != NULL);
		close(fd);
		free(buf);
		nwin++;
	}
	CHECK(nwin >= 4);
}

/* ------------------------------------------------------------ malformed */

static const struct zip_vec *find_vec(const char *file)
{
	for (size_t i = 0; i < NZIP; i++)
		if (strcmp(zip_vecs[i].file, file) == 0)
			return &zip_vecs[i];
	return NULL;
}

static void put16(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
}

static void put32(unsigned char *p, uint32_t v)
{
	put16(p, v & 0xffff);
	put16(p + 2, v >> 16);
}

static void put64(unsigned char *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t get16(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static uint32_t get32(const unsigned char *p)
{
	return get16(p) | get16(p + 2) << 16;
}

/* Offset of the first central directory header whose name ends with
 * suffix, or 0. */
static size_t cd_entry(const unsigned char *b, size_t len, const char *sfx)
{
	size_t sl = strlen(sfx);

	for (size_t i = 0; i + 46 <= len; i++) {
		uint32_t nl;

		if (get32(b + i) != 0x02014b50)
			continue;
		nl = get16(b + i + 28);
		if (nl >= sl && i + 46 + nl <= len &&
		    memcmp(b + i + 46 + nl - sl, sfx, sl) == 0)
			return i;
	}
	return 0;
}

static void expect_bad(const unsigned char *b, size_t len, const char *needle,
		       int line)
{
	flx_zip *z = NULL;
	flx_error e;
	int rc = open_mem(b, len, &z, &e);

	if (rc != -EINVAL || z) {
		fprintf(stderr, "line %d: expected -EINVAL, got %d\n", line,
			rc);
		check_failures++;
	} else if (needle && !strstr(e.text, needle)) {
		fprintf(stderr, "line %d: error '%s' lacks '%s'\n", line,
			e.text, needle);
		check_failures++;
	} else if (strcmp(e.file, "item") != 0) {
		fprintf(stderr, "line %d: error file '%s'\n", line, e.file);
		check_failures++;
	}
	flx_zip_close(z);
}

#define BAD(b, len, needle) expect_bad((b), (len), (needle), __LINE__)

static void test_damaged_torch(const char *file)
{
	const struct zip_vec *v = find_vec(file);
	size_t len = 0, eocd, z64, cd0, cd, lfh;
	unsigned char *orig, *b;
	flx_zip *z;
	flx_zip_rec rec;
	flx_error e;

	CHECK(v != NULL);
	if (!v)
		return;
	orig = check_read_file(file, &len);
	CHECK(orig && len == v->win_len && v->win_off == 0);
	if (!orig || len != v->win_len)
		return;
	b = malloc(len);
	eocd = len - 22;
	z64 = len - 22 - 20 - 56;
	CHECK_EQ(get32(orig + eocd), 0x06054b50);
	CHECK_EQ(get32(orig + z64), 0x06064b50);
	cd0 = get32(orig + eocd + 16);
	cd = cd_entry(orig, len, "/data/0");
	CHECK(cd0 > 0 && cd > 0);

#define RESET() memcpy(b, orig, len)
	RESET();
	b[eocd] ^= 0xff;
	BAD(b, len, "no end-of-central-directory record");
	RESET();
	put32(b + eocd + 16, (uint32_t)len);
	BAD(b, len, "disagree");
	RESET();
	put32(b + eocd + 16, (uint32_t)len + 100);
	put64(b + z64 + 48, len + 100);
	BAD(b, len, "outside the archive");
	RESET();
	put32(b + eocd + 12, (uint32_t)len);
	put64(b + z64 + 40, len);
	BAD(b, len, "outside the archive");
	RESET();
	put32(b + eocd + 12, 17u << 20);
	put64(b + z64 + 40, 17u << 20);
	BAD(b, len, "central directory of 17825792 bytes (limit 16777216)");
	RESET();
	put32(b + eocd + 12, 40);
	put64(b + z64 + 40, 40);
	BAD(b, len, "cannot hold");
	RESET();
	put16(b + eocd + 8, 5000);
	put16(b + eocd + 10, 5000);
	put64(b + z64 + 24, 5000);
	put64(b + z64 + 32, 5000);
	BAD(b, len, "5000 entries (limit 4096)");
	RESET();
	put64(b + z64 + 24, 1);
	put16(b + eocd + 8, 0xffff);
	BAD(b, len, "entries on this disk");
	RESET();
	b[z64] ^= 0xff;
	BAD(b, len, "ZIP64 EOCD at");
	RESET();
	put64(b + len - 22 - 20 + 8, len); /* locator points past itself */
	BAD(b, len, "ZIP64 EOCD locator points");
	RESET();
	b[0] ^= 0xff; /* local header of data.pkl */
	BAD(b, len, "bad local header signature at 0");
	RESET();
	put16(b + cd + 10, 8);
	BAD(b, len, "compressed (method 8)");
	RESET();
	put16(b + cd + 8, get16(b + cd + 8) | 1);
	BAD(b, len, "encrypted");
	RESET();
	put32(b + cd + 20, get32(b + cd + 20) + 1);
	BAD(b, len, "compressed size");
	RESET();
	put32(b + cd + 24, 0xfffffff0u);
	put32(b + cd + 20, 0xfffffff0u);
	BAD(b, len, "runs into the central directory");
	RESET();
	put32(b + cd + 42, (uint32_t)cd0);
	BAD(b, len, "is not before the central directory");
	RESET();
	put32(b + cd, 0x02014b51);
	BAD(b, len, "bad signature");
	RESET();
	put16(b + cd + 30, 0xffff); /* extra field runs past the CD */
	BAD(b, len, "runs past the central directory");
	RESET();
	put16(b + cd + 34, 1);
	BAD(b, len, "on disk 1");
	RESET();
	put16(b + cd + 28, 0);
	BAD(b, len, "name length 0");

	/* rename data/0 in both headers: a valid archive without data/0 */
	RESET();
	lfh = get32(b + cd + 42);
	b[cd + 46 + get16(b + cd + 28) - 1] = 'X';
	b[lfh + 30 + get16(b + lfh + 26) - 1] = 'X';
	z = NULL;
	CHECK_EQ(open_mem(b, len, &z, &e), 0);
	CHECK_EQ(flx_zip_find(z, "data/0", &rec), -ENOENT);
	CHECK_EQ(flx_zip_find(z, "data/X", &rec), 0);
	flx_zip_close(z);
	/* ... only in the CD: the local header disagrees */
	RESET();
	b[cd + 46 + get16(b + cd + 28) - 1] = 'X';
	BAD(b, len, "local header names a different record");
	/* a name outside the prefix (both headers) */
	RESET();
	b[cd + 46] = 'x';
	b[lfh + 30] = 'x';
	BAD(b, len, "is not under 'archive/'");
	/* first record without a folder */
	RESET();
	memset(b + cd0 + 46, '_', get16(b + cd0 + 28));
	memset(b + 30, '_', get16(b + 26));
	BAD(b, len, "no archive folder prefix");
	/* saturated classic EOCD without the ZIP64 locator */
	RESET();
	put32(b + len - 22 - 20, 0);
	put16(b + eocd + 10, 0xffff);
	BAD(b, len, "no ZIP64 EOCD locator");
	/* without the locator, the classic EOCD alone still works */
	RESET();
	put32(b + len - 22 - 20, 0);
	z = NULL;
	CHECK_EQ(open_mem(b, len, &z, &e), 0);
	CHECK_EQ(flx_zip_find(z, "data/0", &rec), 0);
	flx_zip_close(z);
#undef RESET

	/* every truncation of the window fails, from either end */
	for (size_t k = 0; k < len; k++) {
		unsigned char *t = malloc(k ? k : 1);

		memcpy(t, orig, k);
		z = NULL;
		if (open_mem(t, k, &z, &e) != -EINVAL) {
			fprintf(stderr, "%s: prefix %zu opened\n", file, k);
			check_failures++;
		}
		flx_zip_close(z);
		memcpy(t, orig + (len - k), k);
		z = NULL;
		if (k && open_mem(t, k, &z, &e) != -EINVAL) {
			fprintf(stderr, "%s: suffix %zu opened\n", file, k);
			check_failures++;
		}
		flx_zip_close(z);
		free(t);
	}

	/* single-byte damage anywhere: -EINVAL, or records still inside */
	for (size_t k = 0; k < len; k++) {
		static const unsigned char flips[] = {0xff, 0x01, 0x80, 0x40};

		for (size_t f = 0; f < sizeof(flips); f++) {
			int rc;

			memcpy(b, orig, len);
			b[k] ^= flips[f];
			z = NULL;
			rc = open_mem(b, len, &z, &e);
			if (rc == 0) {
				for (int i = 0; i < v->nrec; i++)
					if (flx_zip_find(z, v->rec[i].rel,
							 &rec) == 0)
						CHECK(rec.data_off + rec.size <=
						      len);
			} else if (rc != -EINVAL) {
				fprintf(stderr, "%s: flip at %zu: %d\n", file,
					k, rc);
				check_failures++;
			}
			flx_zip_close(z);
		}
	}
	free(b);
	free(orig);
}

static void test_zip64_saturated(void)
{
	const struct zip_vec *v = find_vec("torch/hand_zip64.zip");
	size_t len = 0;
	unsigned char *orig, *b;
	size_t cd;

	CHECK(v != NULL);
	if (!v)
		return;
	orig = check_read_file(v->file, &len);
	if (!orig)
		return;
	b = malloc(len);
	/* the vector itself passed test_vectors; now break its pieces */
	memcpy(b, orig, len);
	put32(b + len - 22 - 20, 0x07064b51);
	BAD(b, len, "no ZIP64 EOCD locator");
	memcpy(b, orig, len);
	put64(b + len - 22 - 20 - 56 + 4, 40);
	BAD(b, len, "record size 40 too small");
	memcpy(b, orig, len);
	cd = cd_entry(orig, len, "/data/0");
	CHECK(cd > 0);
	put16(b + cd + 30, 0); /* drop the ZIP64 extra field */
	BAD(b, len, "saturated but no ZIP64 extra field");
	memcpy(b, orig, len);
	put16(b + cd + 46 + get16(b + cd + 28) + 2, 16); /* 16 < 24 bytes */
	BAD(b, len, "ZIP64 extra field too short");
	memcpy(b, orig, len);
	put16(b + cd + 46 + get16(b + cd + 28) + 2, 40); /* past the entry */
	BAD(b, len, "extra field overruns");
	free(b);
	free(orig);
}

/* A stored archive of the records names[0..n) under "pre/" in that
 * order, record i holding the one byte 'A' + i % 26; @return its length
 * (at most size). */
static size_t build_zip(unsigned char *b, size_t size, const char *const *names,
			size_t n)
{
	size_t at = 0, cd, lho[64];

	CHECK(n <= 64);
	for (size_t i = 0; i < n; i++) {
		size_t nl = strlen(names[i]) + 4;

		CHECK(at + 30 + nl + 1 <= size);
		memset(b + at, 0, 30);
		put32(b + at, 0x04034b50);
		put16(b + at + 26, (uint32_t)nl);
		put32(b + at + 18, 1);
		put32(b + at + 22, 1);
		lho[i] = at;
		memcpy(b + at + 30, "pre/", 4);
		memcpy(b + at + 34, names[i], nl - 4);
		b[at + 30 + nl] = (unsigned char)('A' + i % 26);
		at += 30 + nl + 1;
	}
	cd = at;
	for (size_t i = 0; i < n; i++) {
		size_t nl = strlen(names[i]) + 4;

		CHECK(at + 46 + nl <= size);
		memset(b + at, 0, 46);
		put32(b + at, 0x02014b50);
		put32(b + at + 20, 1);
		put32(b + at + 24, 1);
		put16(b + at + 28, (uint32_t)nl);
		put32(b + at + 42, (uint32_t)lho[i]);
		memcpy(b + at + 46, "pre/", 4);
		memcpy(b + at + 50, names[i], nl - 4);
		at += 46 + nl;
	}
	CHECK(at + 22 <= size);
	memset(b + at, 0, 22);
	put32(b + at, 0x06054b50);
	put16(b + at + 8, (uint32_t)n);
	put16(b + at + 10, (uint32_t)n);
	put32(b + at + 12, (uint32_t)(at - cd));
	put32(b + at + 16, (uint32_t)cd);
	return at + 22;
}

/* Records in any order, a few (an item's) or many: each found by its name
 * under the prefix, its byte where it was written; a name given twice is
 * refused either way. */
static void test_record_order(void)
{
	static const char *const few[] = {
	    "version",	       "data/0",    "data.pkl",
	    ".format_version", "byteorder", ".data/serialization_id"};
	char many[40][16];
	const char *names[40];
	unsigned char *b = malloc(1 << 16);
	size_t counts[] = {6, 40};
	flx_zip_rec rec;
	flx_error e;
	flx_zip *z;
	size_t len;

	for (size_t i = 0; i < 40; i++) {
		/* data/0 .. data/39 scrambled: data/1 < data/10 < data/2 */
		snprintf(many[i], sizeof(many[i]), "data/%zu", (i * 17) % 40);
	}
	for (size_t c = 0; c < 2; c++) {
		size_t n = counts[c];

		for (size_t i = 0; i < n; i++)
			names[i] = n == 6 ? few[i] : many[i];
		len = build_zip(b, 1 << 16, names, n);
		z = NULL;
		CHECK_EQ(open_mem(b, len, &z, &e), 0);
		CHECK_STR(flx_zip_prefix(z), "pre");
		for (size_t i = 0; i < n; i++) {
			memset(&rec, 0, sizeof(rec));
			CHECK_EQ(flx_zip_find(z, names[i], &rec), 0);
			CHECK_EQ(rec.size, 1);
			CHECK(rec.data_off < len &&
			      b[rec.data_off] == 'A' + i % 26);
		}
		CHECK_EQ(flx_zip_find(z, "pre/data/0", &rec), -ENOENT);
		CHECK_EQ(flx_zip_find(z, "data/", &rec), -ENOENT);
		CHECK_EQ(flx_zip_find(z, "data/00", &rec), -ENOENT);
		flx_zip_close(z);
		/* the last record named as the first */
		names[n - 1] = names[0];
		len = build_zip(b, 1 << 16, names, n);
		BAD(b, len, "appears twice");
	}
	free(b);
}

static void test_tiny(void)
{
	static const unsigned char eocd_only[22] = {0x50, 0x4b, 0x05, 0x06};
	flx_zip_rec rec;

	BAD(eocd_only, 0, "too small");
	BAD(eocd_only, 21, "too small");
	BAD(eocd_only, 22, "no entries");
	CHECK(flx_zip_prefix(NULL) == NULL);
	flx_zip_close(NULL);
	CHECK_EQ(flx_zip_find(NULL, "data.pkl", &rec), -ENOENT);
}

int main(void)
{
	test_vectors();
	test_reuse();
	test_fd_windows();
	test_damaged_torch("torch/t113_f32.pt");
	test_damaged_torch("torch/t26_f32.pt");
	test_zip64_saturated();
	test_tiny();
	test_record_order();
	return CHECK_RESULT();
}
