/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_TREE_INTERNAL_H
#define FLX_FS_TREE_INTERNAL_H

/* Construction interface of the namespace, shared by tree.c (the model and
 * its queries) and build.c (what the tree contains). */

#include "tree.h"

#include <jansson.h>

typedef enum flx_seg_kind {
	FLX_SEG_LIT,  /* bytes owned by the segment */
	FLX_SEG_VIEW, /* a view's tensor bytes */
	FLX_SEG_RAW,  /* a byte range of a source file, verbatim */
} flx_seg_kind;

typedef struct flx_seg {
	flx_seg_kind kind;
	uint64_t start; /* offset of the segment in its file */
	uint64_t len;
	union {
		unsigned char *lit;
		const flx_view *view;
		struct {
			const flx_file *file;
			uint64_t off;
		} raw;
	} u;
} flx_seg;

/** Add a directory (parent 0 = root's index) and return its node index.
 * @return index >= 0, -EEXIST, -ENOMEM. */
int flx_fs_mkdir(flx_fs *fs, int parent, const char *name);

/** Add an empty file; returns its node index or -errno. */
int flx_fs_mkfile(flx_fs *fs, int parent, const char *name);

/** Append a literal segment; takes ownership of bytes (freed on error). */
int flx_fs_add_lit(flx_fs *fs, int file, unsigned char *bytes, uint64_t len);

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

/** Keep a view alive as long as the fs (takes ownership). */
int flx_fs_own_view(flx_fs *fs, flx_view *v);

/** Sort directory entries and record which backing files each file
 * reads; call once after the last mk*().
 * @return 0, or -EEXIST with *dup naming a name that occurs twice. */
int flx_fs_finish(flx_fs *fs, const char **dup);

/* flx_fs_finish() fails with -ENOMEM (dup untouched) when out of memory. */

/* formats.c: literal parts of synthetic files. */

typedef struct flx_st_entry {
	const char *name; /* tensor name in the file */
	const flx_view *view;
} flx_st_entry;

/**
 * Safetensors header ("u64 N" + JSON + space padding so the data starts at
 * a multiple of 64) for entries, which are reordered in place into data
 * order (element size descending, then name, as the safetensors writer
 * does).  metadata: the "__metadata__" object of string values (borrowed;
 * NULL for {"format": "pt"}).
 * @return 0 and *out and *len (owned by caller), -EINVAL (dtype without a
 *         safetensors name), -ENOMEM.
 */
int flx_safetensors_header(flx_st_entry *entries, size_t n, json_t *metadata,
			   unsigned char **out, uint64_t *len);

/** A JSON array of n integers (a shape or offsets); NULL if out of memory.
 * @return a new reference. */
json_t *flx_json_ints(int n, const int64_t *v);

/** .npy header (v1, or v2 past 64 KiB) with data at a multiple of 64.
 * @return 0 and *out and *len (owned), or -ENOMEM. */
int flx_npy_header(flx_dtype dt, int ndim, const int64_t *shape,
		   unsigned char **out, uint64_t *len);

/** File name for a tensor name: '/' and '%' percent-escaped, "." and ".."
 * escaped, suffix appended.  @return 0 and *out (owned), -ENAMETOOLONG. */
int flx_file_name(const char *fqn, const char *suffix, char **out);

#endif
