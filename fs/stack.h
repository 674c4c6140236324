/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_STACK_H
#define FLX_FS_STACK_H

/*
 * The whole stack a mount serves, built by the one path that decides what
 * is accepted: source -> transform -> plan -> tree.  The daemon mounts what
 * it builds; flexfs-inspect prints it; so the two accept and refuse the
 * same inputs with the same message.
 */

#include "ckpt.h"
#include "error.h"
#include "plan.h"
#include "spec.h"
#include "transform.h"
#include "tree.h"

typedef struct flx_stack {
	flx_ckpt *ckpt; /* the source's index */
	flx_xindex *xi; /* the transformed index (the source's when no
			 * rule transforms) */
	flx_plan *plan; /* over flx_xindex_ckpt(xi) */
	flx_fs *fs;	/* the tree */
} flx_stack;

/**
 * Open source (as format; NULL: probe), transform, plan and build the tree
 * with spec (borrowed; it must outlive the stack).  The transform, plan
 * and tree are built while the items are read; a bad item is reported
 * before a failure of those, as if the items had been read first.
 * @return 0 and *s (flx_stack_free()), or -errno with err filled (one
 *         line naming the file, key and reason) and *s empty.
 */
int flx_stack_build(const char *source, const char *format,
		    const flx_spec *spec, flx_stack *s, flx_error *err);

/** Free what flx_stack_build() made (the tree first); a zeroed s is fine. */
void flx_stack_free(flx_stack *s);

#endif
