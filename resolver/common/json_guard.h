/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_JSON_GUARD_H
#define FLX_RESOLVER_JSON_GUARD_H

/*
 * jansson reports allocation failures inconsistently: some calls assert,
 * json_dumps() can drop a key and still return text.  flexfs therefore
 * routes jansson's allocations through functions that record a failure in
 * a per-thread flag, and every operation that builds or parses JSON checks
 * the flag once at its end and fails with -ENOMEM, discarding what it
 * built.  Thread-safe: the flag is per thread.
 */

#include "error.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/** Install the allocator hooks (once per process) and clear this
 * thread's failure flag. */
void flx_json_guard_begin(void);

/** Whether a jansson allocation failed on this thread since begin. */
bool flx_json_guard_failed(void);

/**
 * Parse buf[0..len) as one JSON value, duplicate keys refused, under the
 * guard (begin, then the check).  Thread-safe.
 * @return 0 and *out (owned: json_decref()); -ENOMEM (an allocation
 *         failed, nothing kept); or -EINVAL with err: "<file>: <key>:
 *         not valid JSON: line L column C: <jansson's text>".
 */
int flx_json_parse(const void *buf, size_t len, const char *file,
		   const char *key, json_t **out, flx_error *err);

#endif
