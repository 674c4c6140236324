/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_NAMES_H
#define FLX_FS_NAMES_H

/*
 * The text pieces that layouts and formats share: file names made from
 * tensor and object names, and decimal numbers.  Pure functions, no
 * allocation; reentrant.
 */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Longest file name (bytes, without the NUL). */
#define FLX_NAME_MAX 255

/**
 * File name for a tensor or object name: '/', '%', control and bidi
 * characters and bytes that are not UTF-8 percent-escaped (flx_escape()),
 * "." and ".." escaped (a name must not be a directory link), suffix
 * appended, into out (FLX_NAME_MAX + 1 bytes, NUL-terminated).
 * @return 0, or -ENAMETOOLONG (out then undefined).
 */
int flx_file_name(const char *name, const char *suffix, char *out);

/**
 * File name for a file of the checkpoint directory passed through (an
 * extra): its own name when no code point of it needs escaping, else
 * flx_file_name(name, "") (then '%' too, so that it stays decodable), into
 * out (FLX_NAME_MAX + 1 bytes).
 * @return 0, or -ENAMETOOLONG.
 */
int flx_extra_name(const char *name, char *out);

/**
 * v in decimal at o, at least width digits (zero-padded), as printf's
 * "%0*lld" writes it (width 1: "%lld", jansson's integer format); no NUL.
 * Inline: generated text formats hundreds of thousands of numbers.
 * @return its length (at most 20).
 */
static inline size_t flx_fmt_int(char *o, int64_t v, int width)
{
	char b[24];
	size_t i = sizeof(b), n;
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;

	do {
		b[--i] = (char)('0' + u % 10);
		u /= 10;
	} while (u || (int)(sizeof(b) - i) < width);
	if (v < 0)
		b[--i] = '-';
	n = sizeof(b) - i;
	memcpy(o, b + i, n);
	return n;
}

/** The length flx_fmt_int(o, v, 1) has, without writing it. */
static inline size_t flx_int_len(int64_t v)
{
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
	size_t n = v < 0 ? 2 : 1;

	for (; u >= 10000; u /= 10000)
		n += 4;
	return n + (u >= 10) + (u >= 100) + (u >= 1000);
}

#endif
