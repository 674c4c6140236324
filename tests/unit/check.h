/* SPDX-License-Identifier: MIT */
#ifndef FLX_TESTS_CHECK_H
#define FLX_TESTS_CHECK_H

/* Minimal assertion macros: print file:line and count failures; main()
 * returns CHECK_RESULT() so ctest sees the failure. */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures;

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, \
				__LINE__, #cond);                              \
			check_failures++;                                      \
		}                                                              \
	} while (0)

#define CHECK_EQ(a, b)                                                         \
	do {                                                                   \
		long long va_ = (long long)(a), vb_ = (long long)(b);          \
		if (va_ != vb_) {                                              \
			fprintf(stderr,                                        \
				"%s:%d: %s == %s failed: %lld vs %lld\n",      \
				__FILE__, __LINE__, #a, #b, va_, vb_);         \
			check_failures++;                                      \
		}                                                              \
	} while (0)

#define CHECK_STR(a, b)                                                        \
	do {                                                                   \
		const char *sa_ = (a), *sb_ = (b);                             \
		if (!sa_ || !sb_ || strcmp(sa_, sb_) != 0) {                   \
			fprintf(stderr,                                        \
				"%s:%d: %s == %s failed: '%s' vs '%s'\n",      \
				__FILE__, __LINE__, #a, #b,                    \
				sa_ ? sa_ : "(null)", sb_ ? sb_ : "(null)");   \
			check_failures++;                                      \
		}                                                              \
	} while (0)

#define CHECK_RESULT()                                                         \
	(check_failures                                                        \
	     ? (fprintf(stderr, "%d check(s) failed\n", check_failures), 1)    \
	     : 0)

/* Read tests/unit/data/<rel> (tests run with tests/ as working dir) into a
 * malloc'd buffer; NULL (with a message) on failure. */
static inline unsigned char *check_read_file(const char *rel, size_t *len)
{
	char path[512];
	unsigned char *buf = NULL;
	FILE *f;
	long n;

	snprintf(path, sizeof(path), "unit/data/%s", rel);
	f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "cannot open %s\n", path);
		return NULL;
	}
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
	    fseek(f, 0, SEEK_SET) == 0) {
		buf = malloc((size_t)n + 1);
		if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
			free(buf);
			buf = NULL;
		}
		*len = (size_t)n;
	}
	fclose(f);
	return buf;
}

#endif
