/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_PICKLE_INTERNAL_H
#define FLX_FS_FORMATS_PICKLE_INTERNAL_H

/*
 * The pickle opcodes the generated Python files share (torch.save's
 * data.pkl, Paddle's .pdparams/.pdopt), written into a window (the JSON
 * writer's flx_jw: bytes [lo, hi) copied, the rest counted).  Each writes
 * a value as CPython's pickler writes it at protocol 2 and above, without
 * memo opcodes.  No allocation; reentrant.
 */

#include "json_internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** v as n little-endian bytes (n <= 8). */
void flx_pk_le(flx_jw *w, uint64_t v, int n);

/* The longest int flx_pk_int_enc() writes: LONG1, its length, 8 bytes. */
#define FLX_PK_INT_MAX 10

/** v as CPython's pickler writes an int: BININT1, BININT2, BININT or
 * LONG1 (the fewest two's complement bytes), into out.  @return the
 * bytes written.  Pure. */
size_t flx_pk_int_enc(int64_t v, unsigned char out[FLX_PK_INT_MAX]);

/** A non-negative int below 2^63 (sizes, offsets, strides: all checked
 * to fit at mount), as flx_pk_int_enc(). */
void flx_pk_int(flx_jw *w, uint64_t v);

/** A str as BINUNICODE (s must be UTF-8: flx_pk_utf8_ok()). */
void flx_pk_str(flx_jw *w, const char *s);

/** GLOBAL "mod\nname\n". */
void flx_pk_global(flx_jw *w, const char *mod, const char *name);

/** A tuple of n non-negative ints: EMPTY_TUPLE, TUPLE1..3 or MARK..TUPLE. */
void flx_pk_ints(flx_jw *w, int n, const uint64_t *v);

/** Whether s is UTF-8, what a pickled str must be.  Pure. */
bool flx_pk_utf8_ok(const char *s);

#endif
