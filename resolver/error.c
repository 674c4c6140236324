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

static void copy_field(char *dst, const char *src)
{
	snprintf(dst, FLX_ERR_FIELD, "%s", src ? src : "");
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
