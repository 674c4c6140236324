/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_NPY_H
#define FLX_FS_FORMATS_NPY_H

/*
 * .npy files: the NumPy header (v1, or v2 past 64 KiB; the data starts at
 * a multiple of 64), generated, then the view's bytes.
 */

#include "tree_internal.h"

/**
 * Add the .npy file of view v (borrowed; must outlive fs) to directory
 * dir, named name, or, when like >= 0, named as that earlier node (name
 * unused, may be NULL; see flx_fs_mkfile_as()).
 * @return 0 and *node, or -ENOMEM, -ENOTDIR, -EINVAL.
 */
int flx_npy_add_file(flx_fs *fs, int dir, const char *name, int like,
		     const flx_view *v, int *node);

#endif
