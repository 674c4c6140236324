/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_MS_STRATEGY_H
#define FLX_RESOLVER_MS_STRATEGY_H

/*
 * MindSpore parallel strategy files (docs/formats/mindspore.md#strategy-file):
 * which box of each parameter every rank holds.
 *
 * A strategy file is a protobuf ParallelStrategyMap (package
 * mindspore.straspb) or, when its name ends in ".json", the C++ writer's
 * JSON.  flx_ms_strategy_parse() turns either into a flx_ms_strategy: one
 * flx_ms_layout per (parameter, pipeline stage).  Merged pipeline files
 * (merge_pipeline_strategys, docs/formats/mindspore.md#merged-strategies) name
 * parameters "<stage>-<name>"; the prefix is split off (only when it is all
 * decimal digits) and becomes the layout's stage.  An unmerged file's stage is
 * the stage of its first strategy item (0 when it has none).
 *
 * flx_ms_box() is the pure layout arithmetic of
 * docs/formats/mindspore.md#box-algorithm: the box (start and length per
 * dimension) of a parameter held by a stage-local rank, from dev_matrix,
 * tensor_map (classic or nested,
 * docs/formats/mindspore.md#coordinates-and-blocks(e)), manual split
 * (docs/formats/mindspore.md#manual-split) and optimizer shard
 * (docs/formats/mindspore.md#optimizer-shard).  Ranks: stage s owns global
 * ranks [s * devices, (s + 1) * devices); the local rank is rank % devices.
 *
 * The protobuf is unpacked by protobuf-c, with code protoc-c generates at
 * build time from node_strategy.proto (the spec's schema), under an
 * allocation budget proportional to the file's size; the unpacked lists
 * are then bounded by FLX_MS_MAX_DIMS and FLX_MS_MAX_LAYOUTS as JSON's are.
 * The caller bounds the file's size.
 *
 * Thread-safety: a parsed strategy is immutable; every function here may
 * be called concurrently on the same strategy.  parse/free touch only
 * their own arguments.
 */

#include "error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* bound on dev_matrix length, tensor rank and device dims per tensor dim */
#define FLX_MS_MAX_DIMS 16
/* bound on layout items in one file */
#define FLX_MS_MAX_LAYOUTS (1u << 20)
/* bound on devices per stage (∏dev_matrix) and on stages */
#define FLX_MS_MAX_DEVICES (1u << 20)
#define FLX_MS_MAX_STAGES  4096u

typedef struct flx_ms_layout {
	char *name;	/* parameter name, "<stage>-" prefix removed */
	uint32_t stage; /* pipeline stage this layout is for */
	/* dev_matrix D (docs/formats/mindspore.md#coordinates-and-blocks): ndev
	 * entries, each >= 1; devices = ∏D */
	uint32_t ndev;
	uint32_t dev[FLX_MS_MAX_DIMS];
	uint64_t devices;
	/* tensor map, one entry per tensor dimension (ndim of them): for
	 * dim i, nmap[i] device dimensions counted from the right (k: D[ndev
	 * - 1 - k]), most significant first; nmap[i] == 0: not split.  A
	 * classic flat map has nmap[i] <= 1.  Every k < ndev, and no k
	 * appears twice in the whole map. */
	uint32_t ndim;
	uint8_t nmap[FLX_MS_MAX_DIMS];
	uint8_t map[FLX_MS_MAX_DIMS][FLX_MS_MAX_DIMS];
	bool nested; /* the Layout-API (>= 2.6) per-dimension form */
	/* optimizer shard (docs/formats/mindspore.md#optimizer-shard): active
	 * when both are non-zero */
	int32_t opt_step, opt_size;
	/* global shape, from JSON's tensor_shape only (has_shape) */
	bool has_shape;
	uint64_t shape[FLX_MS_MAX_DIMS];
	/* manual split along dim 0 (docs/formats/mindspore.md#manual-split):
	 * nsplit rows/offset pairs, one per dim-0 block; 0 when absent or
	 * ignored (MindFormers' writer) */
	uint32_t nsplit;
	int64_t *split_rows, *split_off;
} flx_ms_layout;

typedef struct flx_ms_strategy {
	uint32_t nlayouts;
	flx_ms_layout *layouts; /* in file order */
	bool merged;		/* names carried "<stage>-" prefixes */
	uint32_t nstages;	/* 1 + highest stage; every stage has layouts */
	uint64_t devices;	/* ∏D, the same for every layout and stage */
} flx_ms_strategy;

/**
 * Parse a strategy file's bytes.  json selects the JSON variant (the
 * caller decides, by the ".json" name, as MindSpore does).  file names the
 * file in messages.  Refused (-EINVAL, one line naming file, key and
 * reason): malformed protobuf (what protobuf-c will not unpack: truncated,
 * a wrong wire type, a required field missing, except the opt_weight_shard
 * fields, absent in files before 2021 and then 0) or JSON, a protobuf
 * that needs more memory to unpack than its size allows, a missing or
 * empty dev_matrix, a
 * zero device dimension, a tensor_map value outside the device matrix or
 * repeated, field != 0, more than FLX_MS_MAX_* of anything, layouts whose
 * device counts differ, a stage without layouts (an unmerged stage file of
 * a pipeline: pass the merged one), the same parameter twice in a stage.
 * @return 0 and *out (owned; flx_ms_strategy_free()), or -EINVAL /
 *         -ENOMEM with err set.
 */
int flx_ms_strategy_parse(const void *buf, size_t len, bool json,
			  const char *file, flx_ms_strategy **out,
			  flx_error *err);

/** Free a strategy from flx_ms_strategy_parse() (NULL is fine). */
void flx_ms_strategy_free(flx_ms_strategy *s);

/**
 * The layout of parameter name for stage (stage prefix already removed),
 * or NULL when the strategy has none (then the parameter is replicated).
 * stage == UINT32_MAX: the first layout of that name in any stage.
 * Linear in the number of layouts.
 */
const flx_ms_layout *flx_ms_strategy_find(const flx_ms_strategy *s,
					  const char *name, uint32_t stage);

/**
 * Per-dimension split factors of a layout: out[i] = s_i
 * (docs/formats/mindspore.md#coordinates-and-blocks), with dim 0 also
 * multiplied by the optimizer-shard factor P
 * (docs/formats/mindspore.md#optimizer-shard); the global shape is local dims
 * times these (docs/formats/mindspore.md#global-shape).  With a manual split
 * out[0] is 0 (dim 0 cannot be derived by multiplication).
 * out has ndim entries.  @return 0.
 */
int flx_ms_factors(const flx_ms_layout *l, uint64_t *out);

/** The optimizer-shard factor P of a layout (1 when inactive). */
uint64_t flx_ms_opt_parts(const flx_ms_layout *l);

/**
 * The box of a parameter of global shape shape (l->ndim dims) held by
 * stage-local rank local (< l->devices): start[i], len[i] for each dim
 * (docs/formats/mindspore.md#box-algorithm).  Pure.
 * @return 0, or -EINVAL when local is out of range, a dimension does not
 *         divide by its split factor, or a manual split does not fit.
 */
int flx_ms_box(const flx_ms_layout *l, const uint64_t *shape, uint64_t local,
	       uint64_t *start, uint64_t *len);

/**
 * The optimizer-shard factor a stored slice implies where its layout has
 * none (docs/formats/mindspore.md#optimizer-shard: from 2.6 a file may hold
 * optimizer-sharded data while its strategy says step = size = 0).  With shape
 * the global shape (known only from a JSON tensor_shape: a protobuf layout's
 * global shape is derived from the slices themselves, so there is nothing to
 * compare) and stored the slice's dims (l->ndim of them) on stage-local rank
 * local: *parts = P > 1 when l has no active optimizer shard and no manual
 * split, stored equals local's box but for dim 0, and dim 0 is the box's
 * divided by P with P dividing R, the replica group's size; else *parts = 1
 * (the caller checks the dims as they are).  Pure; a decision only
 * (flx_ms_layout_opt() applies it).
 * @return 0, or -EINVAL when the box itself fails (as flx_ms_box()).
 */
int flx_ms_opt_infer(const flx_ms_layout *l, const uint64_t *shape,
		     uint64_t local, const uint64_t *stored, uint64_t *parts);

/**
 * *out = l with the standard optimizer shard of parts (>= 1) applied
 * (opt_size = parts, opt_step non-zero), sharing l's name and arrays.
 */
void flx_ms_layout_opt(const flx_ms_layout *l, uint64_t parts,
		       flx_ms_layout *out);

/**
 * Fold a JSON layout of a Layout-API parameter, which the C++ writer
 * stores expanded (docs/formats/mindspore.md#strategy-json: [8,6] split
 * ((2,1),0) as tensor_shape [2,4,6], map [2,1,0]), back into ndim dimensions: a
 * run of expanded dims of local size 1 (size equal to a split by one device
 * dim) joins the dim after it, leftmost runs first, until ndim remain; the
 * joined dim's map lists the device dims in order (most significant first) and
 * its size is the product.  Needs l->has_shape and ndim < l->ndim.  Pure.
 * @return 0 and *out (sharing l's manual-split arrays), or -EINVAL when l
 *         cannot be folded into ndim dims.
 */
int flx_ms_layout_fold(const flx_ms_layout *l, uint32_t ndim,
		       flx_ms_layout *out);

#endif
