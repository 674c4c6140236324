/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_TRANSFORM_H
#define FLX_RESHARD_TRANSFORM_H

/*
 * The transform stage, between a source index and the planner.
 *
 * A transform list (flx_xform) defines target tensors.  A target is one or
 * more pieces concatenated along an axis; a piece is a source tensor taken
 * through a chain of steps, applied in order:
 *   slice      a range [start, start + len) of one axis;
 *   split      part k of n equal parts of one axis (a slice);
 *   unstack    index i of one axis, the axis removed (Megatron's
 *              [layers, ...] to one tensor per layer);
 *   unsqueeze  a new axis of extent 1 (to stack pieces by concatenation);
 *   transpose  a permutation of the axes: new axis d is old axis perm[d];
 *   cast       another element type (cast.h).
 * A target of one piece and no steps renames its source.  Source tensors
 * no piece reads pass through as they are.
 *
 * flx_xform_apply() turns a source index and a list into the transformed
 * index: a flx_ckpt that the planner consumes like a source's (it never
 * sees where the tensors came from).  Its tensors are, in source order,
 * every source tensor no piece reads and, in place of the source tensor
 * that each target's first piece reads, the targets (in the list's
 * order).  Every step but cast is arithmetic on chunk metadata: a target's
 * chunks are the pieces' source chunks clipped to the steps' ranges, their
 * axes dropped or permuted, their storage offsets advanced and shifted
 * along the concatenation axis, so they still point into the source's
 * files and a read gathers them as it would a source chunk.  A cast
 * target keeps the dtype its chunks hold in flx_tensor.stored; reads
 * convert (flx_view_read(), plan.h).  With no list, or an empty one, the
 * transformed index is the source index itself: no copy, no cost.
 *
 * Ownership: the transformed index owns its tensor array, its name index,
 * and the derived tensors' names and chunks (one pool, freed with it); it
 * borrows from the source the files, the objects, the directory and
 * format strings, and every passed-through tensor's name and chunks.  The
 * source must outlive it, and it must never be given to flx_ckpt_close().
 *
 * Thread-safety: building a list is not thread-safe; a finished list is
 * only read by flx_xform_apply(), which any number of threads may call.
 * The transformed index is immutable after flx_xform_apply() (after
 * flx_xindex_finish() for a source still loading); any number of threads
 * may read it.
 */

#include "ckpt.h"
#include "error.h"

#include <stddef.h>
#include <stdint.h>

typedef struct flx_xform flx_xform;
typedef struct flx_xindex flx_xindex;

/**
 * An empty list.  origin names the list in errors (the file its statements
 * came from; NULL: none) and is copied.
 * @return 0 and *out (owned; flx_xform_free()), or -ENOMEM.
 */
int flx_xform_new(const char *origin, flx_xform **out);

/** Free a list; NULL is fine. */
void flx_xform_free(flx_xform *x);

/* concat_axis of a target whose pieces are placed at given offsets
 * (flx_xform_piece_at()) rather than concatenated along one axis. */
#define FLX_XFORM_PLACED (-2)

/**
 * Start target tensor name (copied): the pieces added next make it, and
 * several are concatenated along concat_axis (-1: it must have one;
 * FLX_XFORM_PLACED: each piece is placed at its own offset, the target's
 * shape is the pieces' bounding box, and flx_xform_apply() refuses pieces
 * that overlap or leave a hole).
 * @return 0, -EINVAL (empty name) or -ENOMEM.
 */
int flx_xform_target(flx_xform *x, const char *name, int concat_axis,
		     flx_error *err);

/** Add a piece reading source tensor source (copied) to the current
 * target.  @return 0, -EINVAL (no target yet) or -ENOMEM. */
int flx_xform_piece(flx_xform *x, const char *source, flx_error *err);

/** Add a piece reading source (copied) to the current target, a placed
 * one, at offset at[0..ndim) of the target (the piece's ndim after its
 * steps).  @return 0, -EINVAL (no target, a target not placed, a negative
 * offset) or -ENOMEM. */
int flx_xform_piece_at(flx_xform *x, const char *source, int ndim,
		       const int64_t *at, flx_error *err);

/** Source tensor source (copied) is not served, whether or not a target
 * reads it (a source no target reads is otherwise passed through); a name
 * the source lacks is ignored.  @return 0, -EINVAL (empty) or -ENOMEM. */
int flx_xform_drop(flx_xform *x, const char *source, flx_error *err);

/*
 * Steps, appended to the current piece's chain.  Each returns 0, -EINVAL
 * (no piece yet, or a value that no tensor accepts: a negative axis,
 * index or length, parts < 1, more than FLX_MAX_DIMS axes) or -ENOMEM.
 * What depends on the tensor (axes, extents, dtypes) is checked by
 * flx_xform_apply().
 */
int flx_xform_slice(flx_xform *x, int axis, int64_t start, int64_t len,
		    flx_error *err);
int flx_xform_split(flx_xform *x, int axis, int parts, int part,
		    flx_error *err);
int flx_xform_unstack(flx_xform *x, int axis, int64_t index, flx_error *err);
int flx_xform_unsqueeze(flx_xform *x, int axis, flx_error *err);
int flx_xform_transpose(flx_xform *x, int ndim, const int *perm,
			flx_error *err);
int flx_xform_cast(flx_xform *x, flx_dtype to, flx_error *err);

/** Target to made of source from as it is (flx_xform_target() and
 * flx_xform_piece()).  @return as those. */
int flx_xform_rename(flx_xform *x, const char *from, const char *to,
		     flx_error *err);

/** Number of targets defined so far. */
size_t flx_xform_ntargets(const flx_xform *x);

/**
 * The transformed index of src under list x (NULL: none).  Checks every
 * target against src and fails on the first wrong one, with err naming
 * the list's origin, the target, and the piece, the step and the reason:
 * a source tensor that does not exist, an axis the tensor lacks, a range
 * or index outside the axis, an axis that does not split equally, a
 * transpose that is no permutation of the tensor's axes, a cast that is
 * not supported or would round twice, pieces that differ in dtype or in
 * shape off the concatenation axis, a target name used twice (or also by
 * a tensor passed through, or by a non-tensor item).
 * Reads from src only what flx_ckpt_open_start() gives (names, dtypes,
 * shapes, chunk boxes and files), and, when src is complete, the storage
 * of the chunks it derives from (data_off, storage_offset, stride); while
 * src is still loading, the derived chunks' storage waits for
 * flx_xindex_finish(), to be called once flx_ckpt_finish(src) succeeded.
 * Planning and building a tree need no storage: they may come first.
 * @return 0 and *out (owned; flx_xindex_free()), or -errno with err.
 */
int flx_xform_apply(const flx_xform *x, const flx_ckpt *src, flx_xindex **out,
		    flx_error *err);

/** Take the derived chunks' storage (data_off, storage_offset, stride,
 * contig_from) from their source chunks: after flx_ckpt_finish() of a
 * source that was loading at flx_xform_apply(); harmless otherwise.  Not
 * thread-safe against reads of the index. */
void flx_xindex_finish(flx_xindex *xi);

/** The transformed index (src itself when nothing is transformed), valid
 * until flx_xindex_free(). */
const flx_ckpt *flx_xindex_ckpt(const flx_xindex *xi);

/** The pairs of placed pieces compared for overlap while building xi: a
 * cost counter for tests (about n log n for a tiling of n pieces, where
 * every pair would be n^2 / 2). */
uint64_t flx_xindex_overlap_tests(const flx_xindex *xi);

/** Free the transformed index (not the source); NULL is fine. */
void flx_xindex_free(flx_xindex *xi);

#endif
