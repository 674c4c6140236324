/* SPDX-License-Identifier: MIT */
#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

void flx_error_init(flx_error *e)
{
	if (e)
		memset(e, 0, sizeof(*e));
}

/* The length of the valid UTF-8 sequence at s, 0 if it is not one
 * (overlong forms and surrogates are not). */
static size_t utf8_len(const unsigned char *s)
{
	size_t n;
	uint32_t cp;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xC2 && s[0] <= 0xDF)
		n = 2, cp = s[0] & 0x1F;
	else if (s[0] >= 0xE0 && s[0] <= 0xEF)
		n = 3, cp = s[0] & 0x0F;
	else if (s[0] >= 0xF0 && s[0] <= 0xF4)
		n = 4, cp = s[0] & 0x07;
	else
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3F);
	}
	if ((n == 3 && cp < 0x800) ||
	    (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
	    (cp >= 0xD800 && cp <= 0xDFFF))
		return 0;
	return n;
}

bool flx_escape_at(const char *s, size_t *len)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t n = utf8_len(u);

	*len = n ? n : 1;
	if (!n)
		return true;
	if (n == 1)
		return u[0] < 0x20 || u[0] == 0x7F;
	if (n == 2) /* C1 controls; U+061C ARABIC LETTER MARK */
		return (u[0] == 0xC2 && u[1] <= 0x9F) ||
		       (u[0] == 0xD8 && u[1] == 0x9C);
	if (n == 3 && u[0] == 0xE2 && u[1] == 0x80) /* U+2000..U+203F */
		return u[2] == 0x8E || u[2] == 0x8F ||
		       (u[2] >= 0xAA && u[2] <= 0xAE);
	if (n == 3 && u[0] == 0xE2 && u[1] == 0x81) /* U+2040..U+207F */
		return u[2] >= 0xA6 && u[2] <= 0xA9;
	return false;
}

int flx_escape(const char *s, bool more, char *out, size_t cap)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0, n;

	if (!cap)
		return -ENAMETOOLONG;
	for (; *s; s += n) {
		bool esc = flx_escape_at(s, &n);

		if (more && (*s == '/' || *s == '%'))
			esc = true;
		if (o + (esc ? 3 * n : n) >= cap) {
			out[o] = '\0';
			return -ENAMETOOLONG;
		}
		for (size_t i = 0; i < n; i++) {
			unsigned char c = (unsigned char)s[i];

			if (esc) {
				out[o++] = '%';
				out[o++] = hex[c >> 4];
				out[o++] = hex[c & 15];
			} else {
				out[o++] = (char)c;
			}
		}
	}
	out[o] = '\0';
	return 0;
}

/* Names and reasons can carry bytes from a hostile file: keep the error
 * one printable line whatever they contain. */
static void copy_field(char *dst, const char *src)
{
	(void)flx_escape(src ? src : "", false, dst, FLX_ERR_FIELD);
}

int flx_error_set(flx_error *e, int code, const char *file, const char *key,
		  const char *fmt, ...)
{
	char text[FLX_ERR_FIELD];
	va_list ap;

	if (!e || e->code)
		return code;
	e->code = code;
	copy_field(e->file, file);
	copy_field(e->key, key);
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	copy_field(e->text, text);
	return code;
}

int flx_error_default(flx_error *e, int code, const char *file)
{
	if (code < 0 && e && !e->code)
		flx_error_set(e, code, file, NULL, "%s", strerror(-code));
	return code;
}

void flx_error_key(flx_error *e, const char *key)
{
	if (e && e->code && !e->key[0])
		copy_field(e->key, key);
}

void flx_error_file(flx_error *e, const char *file)
{
	if (e && e->code && !e->file[0])
		copy_field(e->file, file);
}

void flx_error_file_replace(flx_error *e, const char *file)
{
	if (e && e->code)
		copy_field(e->file, file);
}

const char *flx_error_line(const flx_error *e, char *buf, size_t len)
{
	size_t n = 0;

	if (!len)
		return buf;
	buf[0] = '\0';
	if (e->file[0])
		n += snprintf(buf + n, len - n, "%s: ", e->file);
	if (n < len && e->key[0])
		n += snprintf(buf + n, len - n, "%s: ", e->key);
	if (n < len)
		snprintf(buf + n, len - n, "%s",
			 e->text[0] ? e->text : "unknown error");
	return buf;
}
