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
 * Each rank's box is served by a view (view.h).
 *
 * Thread-safety: immutable after flx_plan_build(); reads are reentrant.
 */

#include "ckpt.h"
#include "spec.h"
#include "view.h"

typedef struct flx_plan_arena flx_plan_arena;
struct flx_xindex;

/* Everything a placement points to belongs to the plan (names are the
 * source FQN itself unless renumbered) and lives until flx_plan_free(). */
typedef struct flx_placement {
	const flx_tensor *src;
	int split; /* axis, or -1: replicated on every TP rank */
	/* equal consecutive parts of the split axis, each split over TP
	 * (a rule's "groups" at tp > 1): rank r holds [part0_r; part1_r;
	 * ...]; 1: a plain split */
	int groups;
	/* flx_plan_build_all() only: saved split along several axes, tp > 1
	 * and no rule gives its split; placed replicated (split -1) */
	bool undecided;
	int stage_lo; /* stages holding it: [stage_lo, stage_hi] */
	int stage_hi;
	int layer;	       /* global layer index, -1 if none */
	const char **names;    /* per stage in [lo, hi]: target FQN */
	flx_view **views;      /* per TP rank: the view of its box (replicated:
				* all the same view); per stage and TP rank
				* when by_stage (flx_placement_view()) */
	bool by_stage;	       /* a stacked tensor at pp > 1: each stage
				* holds its layers' range of axis 0 */
	const flx_view *whole; /* the whole tensor (hf/); views[0] when
				* that box is already whole */
} flx_placement;

typedef struct flx_plan {
	const flx_ckpt *ckpt; /* borrowed */
	const flx_spec *spec; /* borrowed */
	size_t n;
	flx_placement *p;  /* one per source tensor, same order */
	int nlayers;	   /* distinct layer indices matched */
	size_t nundecided; /* placements marked undecided */
	/* the source's data-parallel degree D, 0 if none: every tensor of
	 * one or more dimensions (none stacking modules) was saved in
	 * FSDP's dim-0 shards of D (torch.chunk pieces, or pieces of TP's
	 * pieces under torch's strided shards).  That split is no TP split:
	 * a tensor split only so is replicated unless a rule splits it, and
	 * one split along another axis too is split along that one. */
	int dp_degree;
	bool *rule_used; /* per spec rule: a tensor took it */
	unsigned facts;	 /* the rules' facts the source has (flx_spec.facts) */
	/* internal: the grouped tensors' rank order (transform.h), whose
	 * views the grouped placements' rank views are; NULL: none */
	struct flx_xindex *regroup;
	flx_plan_arena *arena; /* internal: views and names, in blocks */
} flx_plan;

/**
 * Place every tensor of ckpt under spec.  ckpt is the index to serve: a
 * source's, or the transformed index of one (transform.h); placement
 * reads only its tensors' names, shapes and chunk boxes.  Fails with one
 * error when tensors' splits cannot be inferred at tp > 1 and no rule gives
 * them (the error names the first few and counts them all; at tp=1 nothing
 * is split: a tensor saved along several axes is served whole), or (one
 * error naming the tensor) a rule names an axis the tensor lacks or one of its
 * stacked axes (flx_tensor.stacked, never a TP axis), a stage number is out
 * of range, or two tensors land on the same name in one stage.  A stacked
 * tensor without a rule giving its stage is on every stage at pp > 1 (on
 * the first min(layers, pp)), under its name, each stage holding its
 * layers' range of axis 0 (contiguous, the first layers mod pp stages one
 * layer longer, as layer-numbered tensors).  Rules that require a fact
 * ("when") apply only when the source's model has it (the Megatron args'
 * swiglu, flx_mlg_swiglu()); a rule's "groups" at tp > 1 needs the axis
 * to divide into groups x tp.
 * @return 0 and *out (owned; flx_plan_free()), or -errno with err.
 */
int flx_plan_build(const flx_ckpt *ckpt, const flx_spec *spec, flx_plan **out,
		   flx_error *err);

/**
 * flx_plan_build(), except that a tensor whose split cannot be decided is
 * not an error: it is placed replicated and marked (flx_placement.undecided,
 * counted in nundecided), so that every tensor can be shown and a rule
 * written for the undecided ones (flexfs-inspect).  Every other failure is
 * flx_plan_build()'s.  @return 0 and *out (owned; flx_plan_free()), or
 * -errno with err.
 */
int flx_plan_build_all(const flx_ckpt *ckpt, const flx_spec *spec,
		       flx_plan **out, flx_error *err);

void flx_plan_free(flx_plan *p);

/** After flx_ckpt_finish() of a source whose items were deferred when the
 * plan was built: the grouped placements' views take their storage
 * (flx_xindex_finish()).  Harmless otherwise.  Not thread-safe against
 * reads. */
void flx_plan_finish(flx_plan *p);

/**
 * Note i (0, 1, ... in turn) of what a mount of plan p says once, one line
 * without a newline, in buf (len bytes): the source's data-parallel
 * sharding (dp_degree) at tp > 1, stages that hold no tensor (pp above the
 * layers), rules that no tensor takes (an unknown name, or one shadowed by
 * an earlier rule).
 * @return 0 and buf, or -ENOENT past the last note.
 */
int flx_plan_note(const flx_plan *p, size_t i, char *buf, size_t len);

/** The view rank tp of stage holds of placement pl (stage in range). */
static inline const flx_view *flx_placement_view(const flx_placement *pl,
						 int stage, int tp, int ntp)
{
	return pl->by_stage ? pl->views[(stage - pl->stage_lo) * ntp + tp]
			    : pl->views[tp];
}

/**
 * Part k (of pl->groups) of the box b of one of pl's rank views, as a box
 * of the source tensor in *out: a grouped placement's views are boxes of
 * the regrouped tensor (its parts rank by rank), so part k of rank r is
 * [k n/G + r c, + c) of the split axis (n entries, c = n / (G tp)); for a
 * plain placement (groups 1) *out is b.  Thread-safe.
 */
void flx_placement_part(const flx_placement *pl, const flx_box *b, int k,
			flx_box *out);

/** Target name of placement pl on stage (must be in range). */
const char *flx_placement_name(const flx_placement *pl, int stage);

#endif
