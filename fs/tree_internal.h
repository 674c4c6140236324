/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_TREE_INTERNAL_H
#define FLX_FS_TREE_INTERNAL_H

/*
 * Construction interface of the namespace, shared by tree.c (the model and
 * its queries) and build.c (what the tree contains).
 *
 * Nodes are created in order and numbered from 0 (the root); a file's
 * segments must be appended before the next node is created (they are kept
 * in one array shared by all files).  Every call returns 0 (or an index)
 * or -errno; after a failure the tree must only be freed.
 */

#include "formats.h"
#include "tree.h"

/** Add a directory (parent 0 = root's index) and return its node index.
 * @return index >= 0, -ENOTDIR (parent is no directory), -ENOMEM. */
int flx_fs_mkdir(flx_fs *fs, int parent, const char *name);

/** Add an empty file; returns its node index or -errno. */
int flx_fs_mkfile(flx_fs *fs, int parent, const char *name);

/**
 * Add the .npy file of view v (borrowed; must outlive the fs): its header,
 * generated on demand, then the view's bytes.  No segments.  name_of >= 0
 * names it like that earlier node (its name is shared; name is ignored).
 * Returns its node index or -errno.
 */
int flx_fs_mknpy(flx_fs *fs, int parent, const char *name, const flx_view *v,
		 int name_of);

/** Append a generated segment of len bytes (flx_gen(kind, arg, idx)
 * gives them; arg borrowed, e.g. from flx_fs_alloc()) to file, the last
 * node created.  @return 0, -EINVAL (not the last node), -ENOMEM. */
int flx_fs_add_gen(flx_fs *fs, int file, flx_gen_kind kind, const void *arg,
		   uint32_t idx, uint64_t len);

/** Append a view segment (view borrowed; must outlive the fs). */
int flx_fs_add_view(flx_fs *fs, int file, const flx_view *v);

/** Append a raw source range. */
int flx_fs_add_raw(flx_fs *fs, int file, const flx_file *f, uint64_t off,
		   uint64_t len);

/** Size of a file so far. */
uint64_t flx_fs_file_size(const flx_fs *fs, int file);

/** Allocate an empty tree holding only the root, over ckpt (borrowed).
 * @return 0 or -ENOMEM. */
int flx_fs_new(flx_fs **out, const flx_ckpt *ckpt);

/** Make room for this many nodes, segments and bytes of names in all, so
 * that a large tree is not copied while it grows (estimates: more is only
 * slower).  @return 0 or -ENOMEM. */
int flx_fs_reserve(flx_fs *fs, size_t nodes, size_t segs, size_t names);

/** n zeroed bytes owned by the fs (freed with it), for the contexts of
 * generated segments.  @return NULL when out of memory. */
void *flx_fs_alloc(flx_fs *fs, size_t n);

/** Sort directory entries and record which backing files each file
 * reads; call once after the last mk*().
 * @return 0, -EEXIST with *dup naming a name that occurs twice, or
 *         -ENOMEM (dup untouched). */
int flx_fs_finish(flx_fs *fs, const char **dup);

#endif
