/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_TREE_INTERNAL_H
#define FLX_FS_TREE_INTERNAL_H

/*
 * Construction interface of the namespace, used by the builder, the
 * layouts (what the tree contains) and the formats (what a file is made
 * of); tree.c implements it with the model and its queries.
 *
 * Nodes are created in order and numbered from 0 (the root); a file's
 * segments must be appended before the next node is created (they are kept
 * in one array shared by all files).  Every call that can fail returns 0
 * or -errno, other results through out-parameters; after a failure the
 * tree must only be freed.  Single-threaded: a tree is built by one
 * thread, then only read.
 */

#include "formats/gen.h"
#include "tree.h"

#include <stddef.h>
#include <stdint.h>

/* Sizes of a tree, or of the part one layout adds. */
typedef struct flx_fs_size {
	size_t nodes;
	size_t segs;
	size_t names; /* bytes of names, NULs included */
} flx_fs_size;

/** Allocate an empty tree holding only the root (node 0), over ckpt
 * (borrowed).  @return 0 and *out, or -ENOMEM. */
int flx_fs_new(const flx_ckpt *ckpt, flx_fs **out);

/** Make room for sz in all, so that a large tree is not copied while it
 * grows (an estimate: more or less is only slower).
 * @return 0 or -ENOMEM. */
int flx_fs_reserve(flx_fs *fs, const flx_fs_size *sz);

/** Add directory name to directory parent.
 * @return 0 and *node, -ENOTDIR (parent is no directory), -ENOMEM. */
int flx_fs_mkdir(flx_fs *fs, int parent, const char *name, int *node);

/** Add an empty file name to directory parent.
 * @return 0 and *node, -ENOTDIR, -ENOMEM. */
int flx_fs_mkfile(flx_fs *fs, int parent, const char *name, int *node);

/** Add an empty file to parent named as the earlier node like (the name
 * is shared, not copied: the rank directories of one stage hold the same
 * names).  @return 0 and *node, -EINVAL (no such node), -ENOTDIR,
 * -ENOMEM. */
int flx_fs_mkfile_as(flx_fs *fs, int parent, int like, int *node);

/**
 * Append a generated segment to file, the last node created: piece
 * (ops, arg, idx), measured now (ops and arg borrowed: static, owned by
 * the fs (flx_fs_alloc()) or by the plan).  An empty piece adds nothing.
 * @return 0, -EINVAL (file is not the last node), -EFBIG (the file's size
 *         or the tree's total would pass INT64_MAX), -ENOMEM, or the
 *         generator's error.
 */
int flx_fs_add_gen(flx_fs *fs, int file, const flx_gen_ops *ops,
		   const void *arg, uint32_t idx);

/**
 * Append the bytes of view v (borrowed; must outlive the fs), preceded,
 * when header is not NULL, by piece (v, 0) of header, a header about the
 * view (the format's own, as .npy's); nothing when both are empty.
 * @return 0, -EINVAL, -EFBIG (a header of 4 GiB, or the file's size or
 *         the tree's total past INT64_MAX), -ENOMEM, or the generator's
 *         error.
 */
int flx_fs_add_view(flx_fs *fs, int file, const flx_view *v,
		    const flx_gen_ops *header);

/** Append bytes [off, off+len) of source file f, verbatim.
 * @return 0, -EINVAL, -EFBIG (as flx_fs_add_gen()), -ENOMEM. */
int flx_fs_add_raw(flx_fs *fs, int file, const flx_file *f, uint64_t off,
		   uint64_t len);

/** Append the content of zstd object o (o->zsize bytes, decompressed on
 * read through the fs's io, zcache.h).  @return as flx_fs_add_raw(). */
int flx_fs_add_zobj(flx_fs *fs, int file, const flx_object *o);

/** Size of a file so far. */
uint64_t flx_fs_file_size(const flx_fs *fs, int file);

/** n zeroed bytes owned by the fs (freed with it), for the contexts of
 * generated segments.  @return NULL when out of memory. */
void *flx_fs_alloc(flx_fs *fs, size_t n);

/** Hand view v (from flx_view_new()) to the fs, which frees it with
 * itself; on failure v is freed at once.  @return 0 or -ENOMEM. */
int flx_fs_own_view(flx_fs *fs, flx_view *v);

/** Sort directory entries and record which backing files each file
 * reads; call once after the last node.
 * @return 0, -EEXIST with *dup naming a name that occurs twice, or
 *         -ENOMEM (dup untouched). */
int flx_fs_finish(flx_fs *fs, const char **dup);

#endif
