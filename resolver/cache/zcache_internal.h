/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_ZCACHE_INTERNAL_H
#define FLX_RESHARD_ZCACHE_INTERNAL_H

/* What tests of zcache.c see beyond zcache.h. */

#include "zcache.h"

/**
 * Have every decode-ahead worker call fn(arg) before it decodes a window,
 * holding no cache lock (tests: to hold workers and see them decode at
 * the same time).  fn NULL: none.  Call before the first read; fn must
 * return.  Thread-safe.
 */
void flx_zcache_set_ahead_hook(flx_zcache *z, void (*fn)(void *), void *arg);

#endif
