/* SPDX-License-Identifier: MIT */
/* Pickle opcodes of the generated files; see pickle_internal.h. */
#include "pickle_internal.h"

#include <string.h>

void flx_pk_le(flx_jw *w, uint64_t v, int n)
{
	unsigned char b[8];

	for (int i = 0; i < n; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	flx_jw_raw(w, b, (size_t)n);
}

size_t flx_pk_int_enc(int64_t v, unsigned char out[FLX_PK_INT_MAX])
{
	uint64_t u = (uint64_t)v;
	size_t n = 1, len;

	if (v >= 0 && v <= 0xff) {
		out[0] = 'K';
		len = 1;
	} else if (v >= 0 && v <= 0xffff) {
		out[0] = 'M';
		len = 2;
	} else if (v >= INT32_MIN && v <= INT32_MAX) {
		out[0] = 'J';
		len = 4;
	} else {
		/* LONG1: the fewest two's complement bytes */
		while (n < 8 && v >> (8 * n - 1) != 0 && v >> (8 * n - 1) != -1)
			n++;
		out[0] = 0x8a;
		out[1] = (unsigned char)n;
		for (size_t i = 0; i < n; i++)
			out[2 + i] = (unsigned char)(u >> (8 * i));
		return 2 + n;
	}
	for (size_t i = 0; i < len; i++)
		out[1 + i] = (unsigned char)(u >> (8 * i));
	return 1 + len;
}

void flx_pk_int(flx_jw *w, uint64_t v)
{
	unsigned char b[FLX_PK_INT_MAX];

	flx_jw_raw(w, b, flx_pk_int_enc((int64_t)v, b));
}

void flx_pk_str(flx_jw *w, const char *s)
{
	size_t n = strlen(s);

	flx_jw_raw(w, "X", 1);
	flx_pk_le(w, n, 4);
	flx_jw_raw(w, s, n);
}

void flx_pk_global(flx_jw *w, const char *mod, const char *name)
{
	flx_jw_raw(w, "c", 1);
	flx_jw_lit(w, mod);
	flx_jw_raw(w, "\n", 1);
	flx_jw_lit(w, name);
	flx_jw_raw(w, "\n", 1);
}

void flx_pk_ints(flx_jw *w, int n, const uint64_t *v)
{
	if (n == 0) {
		flx_jw_raw(w, ")", 1);
		return;
	}
	if (n > 3)
		flx_jw_raw(w, "(", 1);
	for (int i = 0; i < n; i++)
		flx_pk_int(w, v[i]);
	flx_jw_raw(w, n > 3 ? "t" : &"\x85\x86\x87"[n - 1], 1);
}

bool flx_pk_utf8_ok(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	while (*p) {
		uint32_t c = *p;
		int n = c < 0x80		? 0
			: c >= 0xC2 && c < 0xE0 ? 1
			: c >= 0xE0 && c < 0xF0 ? 2
			: c >= 0xF0 && c < 0xF5 ? 3
						: -1;

		if (n < 0)
			return false;
		c &= n ? 0x3Fu >> n : 0x7Fu;
		p++;
		for (int i = 0; i < n; i++, p++) {
			if ((*p & 0xC0) != 0x80)
				return false;
			c = c << 6 | (*p & 0x3F);
		}
		if ((n == 2 && c < 0x800) || (n == 3 && c < 0x10000) ||
		    c > 0x10FFFF)
			return false;
	}
	return true;
}
