/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_DEEPSPEED_H
#define FLX_RESOLVER_DEEPSPEED_H

/*
 * The DeepSpeed ZeRO source (deepspeed.c, flx_source_deepspeed); this
 * header gives what its tests and fuzz target call besides the source
 * table.
 */

#include "error.h"

#include <stddef.h>

/**
 * The tag a save directory's `latest` file names (buf[0..len), its
 * bytes): white space stripped, a plain directory name (no '/', no
 * control bytes, not "." or ".."), shorter than cap, into sub.
 * Reentrant.
 * @return 0, or -EINVAL with err naming `latest` (empty, not a plain
 *         name, too long).
 */
int flx_ds_latest_tag(const char *buf, size_t len, char *sub, size_t cap,
		      flx_error *err);

#endif
