/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_MSTARGET_H
#define FLX_RESHARD_MSTARGET_H

/*
 * The mindspore/ target of a MindSpore strategy file (-o dst_strategy):
 * how many ranks it has and which box of each tensor a rank holds
 * (docs/formats/mindspore.md#rank-boxes,
 * docs/formats/mindspore.md#box-algorithm, the box itself computed by the
 * strategy module, resolver/mindspore/strategy.h).  A decision only: the layout
 * (fs/layouts/mindspore.c) makes the views.
 *
 * Rank r is of stage r / N (N = the devices of a stage, the product of
 * dev_matrix), local rank r % N; the ranks are N times the stages
 * (0 .. n-1, all present).  A tensor the strategy names on some stage is
 * held by the ranks of those stages, each its box; a tensor it does not
 * name is whole on every rank (1.6: MindSpore copies it unchanged).
 *
 * Thread-safety: immutable after flx_mst_open(); queries are reentrant.
 */

#include "ckpt.h"
#include "error.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct flx_mst flx_mst;

/**
 * Read strategy file path (protobuf, JSON when it ends in .json) as the
 * target of the tensors of ckpt (borrowed; must outlive the result).
 * Every layout must fit its tensor: as many dims as the tensor (classic or
 * per-dim maps; a JSON Layout-API map stored expanded is folded back first,
 * flx_ms_layout_fold()), each split dividing its axis, the optimizer shard
 * dividing axis 0, a JSON tensor_shape equal to the tensor's shape; a
 * parameter the checkpoint lacks is an error (a load of the rank would
 * miss it).
 * @return 0 and *out (owned; flx_mst_free()), or -errno with err naming
 *         the file, the parameter and the reason.
 */
int flx_mst_open(const flx_ckpt *ckpt, const char *path, flx_mst **out,
		 flx_error *err);

void flx_mst_free(flx_mst *m);

/** The number of target ranks (>= 1). */
int64_t flx_mst_nranks(const flx_mst *m);

/**
 * Whether rank r (0 <= r < flx_mst_nranks()) holds tensor t (of the
 * checkpoint given to flx_mst_open()), and its box there (whole when the
 * strategy does not name it).
 * @return true and *box, or false.
 */
bool flx_mst_box(const flx_mst *m, const flx_tensor *t, int64_t r,
		 flx_box *box);

#endif
