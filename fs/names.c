/* SPDX-License-Identifier: MIT */
/*
 * File names and decimal numbers; see names.h.  Numbers are formatted by
 * hand rather than by printf: index.json alone holds hundreds of
 * thousands of them, and every read of it formats them again.
 */
#include "names.h"

#include <errno.h>
#include <string.h>

int flx_file_name(const char *name, const char *suffix, char *out)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = 0, sl = strlen(suffix);

	if (!strcmp(name, ".") || !strcmp(name, "..")) {
		memcpy(out, "%2E", 3);
		n = 3;
		name++;
	}
	for (; *name; name++) {
		if (n + 3 > FLX_NAME_MAX)
			return -ENAMETOOLONG;
		if (*name == '/' || *name == '%') {
			out[n++] = '%';
			out[n++] = hex[(unsigned char)*name >> 4];
			out[n++] = hex[(unsigned char)*name & 15];
		} else {
			out[n++] = *name;
		}
	}
	if (n + sl > FLX_NAME_MAX)
		return -ENAMETOOLONG;
	memcpy(out + n, suffix, sl + 1);
	return 0;
}

size_t flx_fmt_int(char *o, int64_t v, int width)
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

size_t flx_int_len(int64_t v)
{
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
	size_t n = v < 0 ? 2 : 1;

	for (; u >= 10000; u /= 10000)
		n += 4;
	return n + (u >= 10) + (u >= 100) + (u >= 1000);
}
