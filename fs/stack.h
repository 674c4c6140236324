/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_STACK_H
#define FLX_FS_STACK_H

/*
 * The whole stack a mount serves, built by the one path that decides what
 * is accepted: source -> transform -> filter -> plan -> tree.  The daemon
 * mounts what it builds; flexfs-inspect prints it; so the two accept and
 * refuse the same inputs with the same message (but for tensors whose
 * split is undecided, which inspect shows rather than refuses: all).
 *
 * Thread-safety: building is single-threaded; a built stack is read by
 * any number of threads (the tree's own rules, tree.h).
 */

#include "aoa.h"
#include "ckpt.h"
#include "error.h"
#include "filter.h"
#include "plan.h"
#include "spec.h"
#include "transform.h"
#include "tree.h"

typedef struct flx_stack {
	flx_ckpt *ckpt;	   /* the source's index */
	flx_aoa_prog *aoa; /* the rules' AOA statements compiled against
			    * the source (NULL: none) */
	flx_xindex *xi;	   /* the transformed index (the source's when no
			    * rule transforms) */
	flx_findex *fi;	   /* the filtered index (the transformed one when no
			    * filter is set) */
	flx_plan *plan;	   /* over flx_stack_ckpt() */
	flx_fs *fs;	   /* the tree */
} flx_stack;

/**
 * Open source with o (NULL: defaults; defer_items is set here), transform,
 * filter, plan and build the tree with spec (borrowed; it must outlive the
 * stack).  all: a tensor whose split cannot be decided is placed
 * replicated and marked (flx_plan_build_all()) rather than refused.  The
 * transform, plan and tree are built while the items are read; a bad item
 * is reported before a failure of those, as if the items had been read
 * first.
 * @return 0 and *s (flx_stack_free()), or -errno with err filled (one
 *         line naming the file, key and reason) and *s empty.
 */
int flx_stack_build(const char *source, const flx_ckpt_opts *o,
		    const flx_spec *spec, bool all, flx_stack *s,
		    flx_error *err);

/** The index the plan and the tree serve (filtered, transformed). */
static inline const flx_ckpt *flx_stack_ckpt(const flx_stack *s)
{
	return flx_findex_ckpt(s->fi);
}

/**
 * Note i (0, 1, ... in turn) of what a built stack says once, one line
 * without a newline in buf (len bytes): the symlinked files of the source
 * that are not served, then the AOA statements that matched nothing
 * (flx_aoa_prog_note()), then the plan's notes (flx_plan_note()), then
 * the tensors some formats' files leave out (flx_fmt_note()).
 * @return 0 and buf, or -ENOENT past the last.
 */
int flx_stack_note(const flx_stack *s, size_t i, char *buf, size_t len);

/** Free what flx_stack_build() made (the tree first); a zeroed s is fine. */
void flx_stack_free(flx_stack *s);

#endif
