/* SPDX-License-Identifier: MIT */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void flx_error_init(flx_error *e)
{
	if (e)
		memset(e, 0, sizeof(*e));
}

/* Names and reasons can carry bytes from a hostile file: keep the error
 * one printable line whatever they contain. */
static void sanitize(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

static void copy_field(char *dst, const char *src)
{
	snprintf(dst, FLX_ERR_FIELD, "%s", src ? src : "");
	sanitize(dst);
}

int flx_error_set(flx_error *e, int code, const char *file, const char *key,
		  const char *fmt, ...)
{
	va_list ap;

	if (!e || e->code)
		return code;
	e->code = code;
	copy_field(e->file, file);
	copy_field(e->key, key);
	va_start(ap, fmt);
	vsnprintf(e->text, sizeof(e->text), fmt, ap);
	va_end(ap);
	sanitize(e->text);
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
