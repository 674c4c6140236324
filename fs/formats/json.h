/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_JSON_H
#define FLX_FS_FORMATS_JSON_H

/*
 * What the builder checks before any JSON is generated: JSON carries only
 * UTF-8, and plain names can be copied without escaping.  Pure functions.
 */

#include <stdbool.h>

/** Whether s is UTF-8 as jansson accepts it (no overlong forms, no
 * surrogates, nothing past U+10FFFF). */
bool flx_utf8_valid(const char *s);

/** Whether s is printable ASCII without " or \ (JSON needs no escape). */
bool flx_json_plain(const char *s);

#endif
