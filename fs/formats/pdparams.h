/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_PDPARAMS_H
#define FLX_FS_FORMATS_PDPARAMS_H

/*
 * Paddle's paddle.save of a dict of tensors (.pdparams, .pdopt): a pickle,
 * protocol 4, that pickle.load and paddle.load read unchanged
 * (docs/formats/paddle.md#paddlenlp-per-rank-files).  Each tensor is a
 * numpy array rebuilt by numpy.core.multiarray._reconstruct (a name numpy
 * 1.x and 2.x both import) with its C-order bytes in one BINBYTES
 * (BINBYTES8 from 4 GiB); bfloat16 is numpy uint16 holding the raw bits,
 * float8 uint8, as Paddle exports them.  The dict is one of paddle.save's
 * two forms, chosen as paddle.save chooses:
 *
 *   state dict (_legacy_save), when no value is a dict holding a tensor:
 *     {key: ndarray, ..., ["master_weights": {},]
 *      "StructuredToParameterName@@": {key: name, ...}}
 *   otherwise (_pickle_save), each tensor a (name, ndarray) tuple:
 *     {key: (name, ndarray), ..., "master_weights": {key: (name, ndarray)}}
 *
 * Written without FRAME or memo opcodes and with GLOBAL (all valid at
 * protocol 4); the tensor bytes sit right after each length field.
 *
 * Thread-safety: sets and files are built single-threaded with their
 * tree; once built they are immutable and read by any number of threads.
 */

#include "formats/gen.h"
#include "tree_internal.h"

#include <stdbool.h>
#include <stddef.h>

/* One tensor of a Paddle pickle. */
typedef struct flx_pd_entry {
	const char *key;  /* its key in its dict (borrowed) */
	const char *name; /* Paddle's name of the tensor (borrowed) */
	const flx_placement *pl;
} flx_pd_entry;

/*
 * The tensors of Paddle pickles, shared by the files that hold the same
 * keys in the same order (the TP ranks of one stage; each reads its own
 * views): e[0, ntop) are the dict's own values, in order; with master,
 * the dict also has a "master_weights" dict holding e[ntop, n).
 */
typedef struct flx_pd_set {
	size_t n;
	size_t ntop;
	bool master;
	flx_pd_entry *e;
	int stage, ntp; /* the stage and tp whose views the placements give
			 * (flx_placement_view()); 0, 1 by default */
} flx_pd_set;

/** A set with room for n entries, n and ntop 0, master false, stage 0,
 * ntp 1 (the caller
 * appends), owned by fs.  @return 0 and *out, or -ENOMEM. */
int flx_pd_set_new(flx_fs *fs, size_t n, flx_pd_set **out);

/**
 * Whether set can be written: every key and name UTF-8 (a pickled str),
 * no key twice in one dict, none equal to a key the format adds.  On
 * failure *bad is the offending key or name (borrowed from set).
 * @return 0, -EINVAL (not UTF-8), -EEXIST (a key twice or reserved) or
 *         -ENOMEM.  set is not changed.
 */
int flx_pd_check(const flx_pd_set *set, const char **bad);

/**
 * Add file name to directory dir: the pickle of set (checked with
 * flx_pd_check(); borrowed, must outlive fs), holding the views of TP
 * rank tp.  Builds and measures every piece now.
 * @return 0, or -ENOMEM, -ENOTDIR, -EEXIST.
 */
int flx_pd_add_file(flx_fs *fs, int dir, const char *name,
		    const flx_pd_set *set, int tp);

#endif
