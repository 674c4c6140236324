/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_LAYOUT_H
#define FLX_FS_LAYOUT_H

/*
 * Layouts: what the mounted tree contains.  A layout owns one part of the
 * tree (ranks/, hf/, objects/, index.json at the root) and its naming: it
 * creates its directories and files, each file made of a format's
 * generated pieces (fs/formats/), views and source ranges, and it answers
 * for its names, so that a file describing the tree (index.json) prints
 * the names the tree has.
 *
 * The builder runs every layout of its table in order, size() of all of
 * them (to allocate the tree once), then build() of all of them; inode
 * numbers follow the order nodes are created in, so a layout's place in
 * the table is part of the mount's stable numbering.
 *
 * Adding a layout: one file in fs/layouts/ defining a const flx_layout,
 * and its entry in the table (fs/layouts/table.c).  Its names must be
 * those of the checkpoint's own tool (a user or loader finds the files by
 * them), its bytes must depend only on the checkpoint and the plan, and
 * every error fills b->err through flx_build_fail().
 *
 * Thread-safety: the build is single-threaded; naming functions are pure
 * and reentrant (generators call them at read time).
 */

#include "formats/gen.h"
#include "names.h"
#include "opt.h"
#include "tree_internal.h"

#include <stddef.h>

typedef struct flx_build flx_build;
typedef struct flx_st_set flx_st_set;

typedef struct flx_layout {
	/* its directory under the root ("ranks"), or its file there
	 * ("index.json"); errors of the layout as a whole are keyed by it */
	const char *name;
	/**
	 * Optional: prepare, and add to *sz what build() will add (an
	 * estimate).  *state (NULL before) may be set to what build() needs,
	 * allocated with flx_fs_alloc(b->fs, ...).
	 * @return 0 or -errno, with b->err filled.
	 */
	int (*size)(flx_build *b, void **state, flx_fs_size *sz);
	/** Add the layout's nodes.  @return 0 or -errno, b->err filled. */
	int (*build)(flx_build *b, void *state);

	/*
	 * Naming, each NULL where the layout has no such thing.  Each writes
	 * a NUL-terminated file name into out (FLX_NAME_MAX + 1 bytes).
	 * @return 0 or -ENAMETOOLONG.
	 */
	/** The directory of rank (tp, pp), under the layout's directory. */
	int (*rank_dir)(int tp, int pp, char *out);
	/** The file of non-tensor item o, under the layout's directory. */
	int (*object_file)(const flx_object *o, char *out);
	/** File k (from 0) of n shards (n > 1) of the whole model. */
	int (*shard_file)(size_t k, size_t n, char *out);
	/* NULL, or the layout's own options ("-o NAME=VALUE"), read at
	 * build time from b->plan->spec->opts by name (opt.h) */
	const flx_opt_group *opts;
} flx_layout;

/* What a build shares with its layouts (they fill fs). */
struct flx_build {
	const flx_ckpt *ckpt;
	const flx_plan *plan;
	flx_fs *fs;
	flx_error *err;
	const flx_gen_ctx *gen; /* owned by fs */
	const flx_layout *const *layouts;
	size_t nlayouts;
	/*
	 * A safetensors set of every tensor safetensors can hold, under its
	 * FQN, in plan order and sorted, when a layout made one (ranks/
	 * with one stage and no renumbering); a later layout needing the
	 * same set may take it rather than sort again.  NULL otherwise.
	 */
	const flx_st_set *st_by_fqn;
};

/**
 * Fill b->err for a failure of key (NULL: none): "out of memory" for
 * -ENOMEM, otherwise "what: strerror(-rc)".  @return rc.
 */
int flx_build_fail(flx_build *b, int rc, const char *key, const char *what);

/** The layout of this build named name, or NULL. */
const flx_layout *flx_build_layout(const flx_build *b, const char *name);

/* The default table: ranks/, hf/, objects/, index.json, paddle/, in this
 * order. */
extern const flx_layout *const flx_layouts[];
extern const size_t flx_nlayouts;

/**
 * flx_fs_build() with the n layouts of table (borrowed; the layouts must
 * outlive the fs: generators call their naming functions).
 * @return as flx_fs_build().
 */
int flx_fs_build_with(const flx_ckpt *ckpt, const flx_plan *plan,
		      const flx_layout *const *table, size_t n, flx_fs **out,
		      flx_error *err);

#endif
