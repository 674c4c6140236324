/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_ERROR_H
#define FLX_RESOLVER_ERROR_H

/*
 * Rich diagnostics travel in an optional flx_error passed as the last
 * argument; NULL is allowed everywhere.  The first error set wins, so the
 * innermost failure (the one that knows the file and key) is what the user
 * sees.  The core never prints: the front end prints flx_error_line() once.
 */

#include <stdbool.h>
#include <stddef.h>

#define FLX_ERR_FIELD 240

typedef struct flx_error {
	int code;		  /* -errno, 0 while unset */
	char file[FLX_ERR_FIELD]; /* file the problem is in ("" if none) */
	char key[FLX_ERR_FIELD];  /* key / tensor / option ("" if none) */
	char text[FLX_ERR_FIELD]; /* the reason */
} flx_error;

void flx_error_init(flx_error *e);

/**
 * Record an error unless one is already recorded.  file and key may be NULL.
 * Every field is escaped as flx_escape() does (one printable line that no
 * terminal reorders), truncated to fit between escapes.
 * @return code (a negative errno), so callers can `return flx_error_set(...)`.
 */
int flx_error_set(flx_error *e, int code, const char *file, const char *key,
		  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/**
 * At a public entry point's exit: if code is an error and nothing was
 * recorded (typically -ENOMEM from deep inside), record strerror(code).
 * @return code
 */
int flx_error_default(flx_error *e, int code, const char *file);

/** Fill key if the recorded error has none (adds context on the way out). */
void flx_error_key(flx_error *e, const char *key);

/** Fill file if the recorded error has none. */
void flx_error_file(flx_error *e, const char *file);

/** Replace the recorded error's file (truncated to fit). */
void flx_error_file_replace(flx_error *e, const char *file);

/*
 * The one escaping of untrusted names, in served file names and error
 * lines: the UTF-8 bytes of every code point that could hide or reorder
 * text are written as %XX (upper-case hex), and so are bytes that do not
 * form valid UTF-8.  Those code points: the C0 controls and DEL
 * (U+0000..U+001F, U+007F), the C1 controls (U+0080..U+009F, U+009B CSI
 * among them) and the bidirectional controls U+061C, U+200E, U+200F,
 * U+202A..U+202E and U+2066..U+2069.
 */

/**
 * The code point at s (not at its NUL): *len its bytes (1 for a byte that
 * does not start valid UTF-8, which is then unsafe too).
 * @return whether it must be escaped.  Pure.
 */
bool flx_escape_at(const char *s, size_t *len);

/**
 * s escaped (also '/' and '%' when more is true: a file name, which must
 * be decodable) into out, at most cap bytes with the NUL; an escape is
 * never cut.
 * @return 0, or -ENAMETOOLONG when it did not fit (out then holds what
 *         fitted).  Pure.
 */
int flx_escape(const char *s, bool more, char *out, size_t cap);

/**
 * Format "FILE: KEY: REASON" (empty parts omitted) into buf.
 * @return buf
 */
const char *flx_error_line(const flx_error *e, char *buf, size_t len);

#endif
