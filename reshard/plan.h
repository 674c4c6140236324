/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_PLAN_H
#define FLX_RESHARD_PLAN_H

/*
 * The resharding plan: for every source tensor, where it goes in the target
 * layout (split axis, pipeline stage, per-stage name) and, for every target
 * rank, the box (global offset + local shape) it holds.  Boxes follow
 * torch.chunk / DTensor Shard semantics: chunk = ceil(n / tp); rank r holds
 * [r*chunk, min((r+1)*chunk, n)), so trailing ranks may be short or empty.
 *
 * A "view" is one (tensor, box) pair whose bytes are the box's elements in
 * C order, of the tensor's dtype (converted on read when a cast of the
 * transform stage made it differ from the dtype its chunks hold,
 * flx_tensor.stored).  flx_view_read() serves any byte range of a view straight
 * from the source files: the box is intersected with the saved chunks (found
 * through an index sorted along one axis, never a scan of all pairs), and
 * every requested byte is copied by coalesced pread()s of contiguous source
 * runs; only chunks saved with a non-unit innermost stride are gathered
 * through the slicer, block by block (see bcache.h).
 *
 * Thread-safety: immutable after flx_plan_build(); reads are reentrant.
 */

#include "bcache.h"
#include "ckpt.h"
#include "spec.h"

#include <sys/types.h>

typedef struct flx_view flx_view;
typedef struct flx_plan_arena flx_plan_arena;

/* Everything a placement points to belongs to the plan (names are the
 * source FQN itself unless renumbered) and lives until flx_plan_free(). */
typedef struct flx_placement {
	const flx_tensor *src;
	int split;    /* axis, or -1: replicated on every TP rank */
	int stage_lo; /* stages holding it: [stage_lo, stage_hi] */
	int stage_hi;
	int layer;	       /* global layer index, -1 if none */
	const char **names;    /* per stage in [lo, hi]: target FQN */
	flx_view **views;      /* per TP rank: the view of its box (replicated:
				* all the same view) */
	const flx_view *whole; /* the whole tensor (hf/); views[0] when
				* that box is already whole */
} flx_placement;

typedef struct flx_plan {
	const flx_ckpt *ckpt; /* borrowed */
	const flx_spec *spec; /* borrowed */
	size_t n;
	flx_placement *p;      /* one per source tensor, same order */
	int nlayers;	       /* distinct layer indices matched */
	flx_plan_arena *arena; /* internal: views and names, in blocks */
} flx_plan;

/**
 * Place every tensor of ckpt under spec.  ckpt is the index to serve: a
 * source's, or the transformed index of one (transform.h); placement
 * reads only its tensors' names, shapes and chunk boxes.  Fails (one error
 * naming the tensor) when a tensor's split cannot be inferred and no rule gives
 * it, a rule names an axis the tensor lacks, a stage number is out of range, or
 * two tensors land on the same name in one stage.
 * @return 0 and *out (owned; flx_plan_free()), or -errno with err.
 */
int flx_plan_build(const flx_ckpt *ckpt, const flx_spec *spec, flx_plan **out,
		   flx_error *err);

void flx_plan_free(flx_plan *p);

/**
 * The largest storage span, in bytes, of a chunk saved with a strided
 * innermost axis (read by gathers, see bcache.h), and its tensor in *which
 * (may be NULL); 0 when every chunk's innermost axis is contiguous.
 */
uint64_t flx_ckpt_gather_span(const flx_ckpt *ckpt, const flx_tensor **which);

/** Target name of placement pl on stage (must be in range). */
const char *flx_placement_name(const flx_placement *pl, int stage);

/** Box of a view, its tensor and its size in bytes. */
const flx_box *flx_view_box(const flx_view *v);
const flx_tensor *flx_view_tensor(const flx_view *v);
uint64_t flx_view_bytes(const flx_view *v);

/** Indices (into ckpt->files) of the backing files the view reads,
 * sorted and unique.  @return 0 and *out (owned, free()) / *n, or -ENOMEM. */
int flx_view_files(const flx_view *v, uint32_t **out, size_t *n);

/** The same without allocating: the view reads from npieces saved chunks,
 * piece i from file flx_view_piece_file(v, i) (files may repeat). */
size_t flx_view_npieces(const flx_view *v);
uint32_t flx_view_piece_file(const flx_view *v, size_t i);

/** A view of any box of t, on its own (a plan's views belong to the plan).
 * @return 0 and *out (owned; flx_view_free()), or -errno. */
int flx_view_new(const flx_ckpt *ckpt, const flx_tensor *t, const flx_box *box,
		 flx_view **out, flx_error *err);

/** Free a view from flx_view_new(); NULL and a plan's views are ignored
 * (those go with the plan). */
void flx_view_free(flx_view *v);

/** A contiguous byte range of one backing file. */
typedef struct flx_range {
	uint32_t file; /* index into ckpt->files */
	uint64_t src;  /* offset in that file */
	uint64_t len;
} flx_range;

/**
 * Describe view bytes [off, off+n) as at most max contiguous ranges of
 * backing files, in order, a range that continues the one before merged
 * into it, after checking each file is unchanged: a reply can then be
 * spliced from the files without a copy.
 * @return the number of ranges (>= 1) written to out; 0 if some bytes
 *         need a gather (a chunk saved with a strided innermost axis) or a
 *         conversion (a cast tensor) or take more than max ranges;
 *         -EIO if a backing file changed since mount.
 */
int flx_view_ranges(const flx_view *v, uint64_t off, size_t n, flx_range *out,
		    size_t max);

/** Read statistics, for tests and benchmarks (per call, caller-owned). */
typedef struct flx_read_stats {
	uint64_t preads;     /* pread() calls issued */
	uint64_t bytes_read; /* bytes read from backing files */
} flx_read_stats;

/**
 * Copy bytes [off, off+n) of view v into buf (n is clipped at the end).
 * stats may be NULL.
 * @return bytes copied (0 at/after the end), or -EIO (short read of a
 *         backing file, which means it changed after mount) / -errno.
 */
ssize_t flx_view_read(const flx_view *v, void *buf, size_t n, uint64_t off,
		      flx_read_stats *stats);

/**
 * flx_view_read() whose strided gathers (chunks saved with a strided
 * innermost axis) take their blocks from cache, which keeps them for later
 * reads; cache may be NULL (each call reads the blocks it needs once).
 * Reads through one cache may run in parallel.
 */
ssize_t flx_view_read_cached(const flx_view *v, flx_bcache *cache, void *buf,
			     size_t n, uint64_t off, flx_read_stats *stats);

#endif
