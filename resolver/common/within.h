/* SPDX-License-Identifier: MIT */
#ifndef FLX_COMMON_WITHIN_H
#define FLX_COMMON_WITHIN_H

/*
 * Whether a path lies inside a directory by identity, not by name: a bind
 * mount or a second path to the same directory (mount --bind CK ALIAS)
 * makes two names for one directory, which a comparison of canonical
 * paths misses.
 *
 * Thread-safety: reentrant.
 */

#include <stdbool.h>

/**
 * Whether path (absolute and canonical, as realpath() gives; it need not
 * exist) or one of its ancestors is the directory dir, compared by device
 * and inode.  An ancestor that cannot be stat()ed is skipped.
 * @return true when inside (or dir itself); false otherwise, or when dir
 *         cannot be stat()ed.
 */
bool flx_path_within_dir(const char *dir, const char *path);

#endif
