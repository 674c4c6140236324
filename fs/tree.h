/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_TREE_H
#define FLX_FS_TREE_H

/*
 * The namespace: a pure, immutable model of the mounted tree, built once at
 * mount from a checkpoint index and a plan.  No FUSE here; the adapter in
 * fuse_ll.c only translates.
 *
 * Inode numbers: node i of the internal array has inode i + 1, so the root
 * (node 0) is inode 1 = FUSE_ROOT_ID.  The tree never changes after build,
 * so inode numbers are stable for the life of the mount and lookups need no
 * reference counting.
 *
 * Every file is an ordered list of segments (literal bytes, a view's
 * tensor data, or a raw byte range of a source file) with its size fixed at
 * build time.  Reads map [off, off+len) onto segments by binary search.
 *
 * Thread-safety: immutable after flx_fs_build(); every call is reentrant.
 */

#include "ckpt.h"
#include "error.h"
#include "plan.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef uint64_t flx_ino;

#define FLX_ROOT_INO 1

typedef struct flx_fs flx_fs;

typedef struct flx_stat {
	flx_ino ino;
	bool dir;
	uint64_t size; /* bytes for files, entries for directories */
	uint32_t nlink;
	int64_t mtime_ns; /* the checkpoint's .metadata mtime */
} flx_stat;

/**
 * Build the tree for ckpt placed by plan (both borrowed; they must outlive
 * the fs).
 * @return 0 and *out (owned; flx_fs_free()), or -errno with err.
 */
int flx_fs_build(const flx_ckpt *ckpt, const flx_plan *plan, flx_fs **out,
		 flx_error *err);

void flx_fs_free(flx_fs *fs);

/** Stat an inode.  @return 0 or -ENOENT. */
int flx_fs_stat(const flx_fs *fs, flx_ino ino, flx_stat *st);

/** Look name up in directory parent.
 * @return 0 and *st, -ENOENT, or -ENOTDIR if parent is a file. */
int flx_fs_lookup(const flx_fs *fs, flx_ino parent, const char *name,
		  flx_stat *st);

/**
 * Directory entry number pos (0-based, excluding "." and "..") of dir.
 * @return 1 with *name (borrowed, valid for the fs's life) and *st, 0 past
 *         the end, -ENOENT, or -ENOTDIR.
 */
int flx_fs_readdir(const flx_fs *fs, flx_ino dir, uint64_t pos,
		   const char **name, flx_stat *st);

/** Resolve a path relative to the root ("ranks/tp00_pp00/model.safetensors").
 * @return 0 and *st, or -ENOENT/-ENOTDIR. */
int flx_fs_resolve(const flx_fs *fs, const char *path, flx_stat *st);

/**
 * Read up to n bytes at off of file ino.
 * @return bytes read (short only at end of file), -EISDIR, -ENOENT, or the
 *         backing error (-EIO).  stats may be NULL.
 */
ssize_t flx_fs_read(const flx_fs *fs, flx_ino ino, void *buf, size_t n,
		    uint64_t off, flx_read_stats *stats);

/**
 * If bytes [off, off+n) of file ino (n already clipped to the file size)
 * are one contiguous range of one backing file, give its descriptor and
 * offset, so the reply can be spliced without a copy (the file was just
 * checked unchanged).
 * @return 1 with *fd and *src, 0 otherwise (literal bytes, several
 *         ranges), or -EIO / -ENOENT.
 */
int flx_fs_map(const flx_fs *fs, flx_ino ino, uint64_t off, size_t n, int *fd,
	       uint64_t *src);

/**
 * Check, when a file is opened, that every backing file it reads is still
 * the one validated at mount (same inode at the same path, same size and
 * mtime); see flx_file_verify().  Directories always pass.
 * @return 0, -ESTALE (a backing file changed), -ENOENT.
 */
int flx_fs_open_check(const flx_fs *fs, flx_ino ino);

/** The path of ino relative to the root into buf (for messages).
 * @return 0, -ENOENT, or -ENAMETOOLONG. */
int flx_fs_path(const flx_fs *fs, flx_ino ino, char *buf, size_t len);

/** Number of inodes (for statfs). */
uint64_t flx_fs_inode_count(const flx_fs *fs);
uint64_t flx_fs_total_bytes(const flx_fs *fs);

#endif
