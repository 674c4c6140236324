/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_ERROR_H
#define FLX_RESOLVER_ERROR_H

/*
 * Rich diagnostics travel in an optional flx_error passed as the last
 * argument; NULL is allowed everywhere.  The first error set wins, so the
 * innermost failure (the one that knows the file and key) is what the user
 * sees.  The core never prints: the front end prints flx_error_line() once.
 */

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
 * Control characters in any field are replaced by '?' (one printable line).
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

/**
 * Format "FILE: KEY: REASON" (empty parts omitted) into buf.
 * @return buf
 */
const char *flx_error_line(const flx_error *e, char *buf, size_t len);

#endif
