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

/* Longest file name (bytes, without the NUL). */
#define FLX_NAME_MAX 255

/**
 * File name for a tensor or object name: '/' and '%' percent-escaped,
 * "." and ".." escaped (a name must not be a directory link), suffix
 * appended, into out (FLX_NAME_MAX + 1 bytes, NUL-terminated).
 * @return 0, or -ENAMETOOLONG (out then holds no name).
 */
int flx_file_name(const char *name, const char *suffix, char *out);

/**
 * v in decimal at o, at least width digits (zero-padded), as printf's
 * "%0*lld" writes it (width 1: "%lld", jansson's integer format); no NUL.
 * @return its length (at most 20).
 */
size_t flx_fmt_int(char *o, int64_t v, int width);

/** The length flx_fmt_int(o, v, 1) has, without writing it. */
size_t flx_int_len(int64_t v);

#endif
