/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_MEGATRON_INTERNAL_H
#define FLX_RESOLVER_MEGATRON_INTERNAL_H

/*
 * Internal to resolver/megatron/: what the two Megatron-Core sources share.
 * A Megatron-Core distributed checkpoint is metadata.json (which sharded
 * backend holds the tensors), the common state (common.pt) and the sharded
 * part, a DCP directory (torch_dist, megatron.c) or one Zarr v2 array or
 * torch.save file per key (zarr, zarr.c).  Spec:
 * docs/formats/megatron.md#save-directory. Thread-safety: as a source's load
 * (one builder, one thread).
 */

#include "megatron/megatron.h"
#include "pickle.h"
#include "source.h"

#include <stdbool.h>
#include <stdint.h>

#define FLX_MCORE_CONFIG "metadata.json"
#define FLX_MCORE_COMMON "common.pt"

/** Whether name exists in dirfd (a failing look other than ENOENT counts
 * as existing, so that the load reports it). */
bool flx_mcore_exists(int dirfd, const char *name);

/**
 * Read metadata.json whole and check it: a JSON object whose
 * sharded_backend is backend ("torch_dist" or "zarr"), with the documented
 * keys of their types.  Into *mtime_ns its mtime.
 * @return 0, or -errno with err naming the file and key: -ENOTSUP (a
 *         backend neither source reads), -EINVAL (the other source's
 *         backend where this directory lacks its files, malformed), or
 *         the read's error.
 */
int flx_mcore_config(flx_build *b, const char *backend, int64_t *mtime_ns,
		     flx_error *err);

/**
 * Once the tensors and objects are in the index: read the common state
 * (common.pt, else the common_state/shard_0_1 object) into
 * the index's "megatron" fact (flx_megatron_of()), mark the stacked axes of
 * every tensor and prefix the writer with "Megatron-Core <kind>, " (writer
 * NULL: kind alone).  objects_bare: the source's ShardedObject values are
 * torch.save(value), not torch.save([value]) (flx_megatron.objects_bare).
 * @return 0, or -errno with err.
 */
int flx_mcore_finish(flx_build *b, const char *kind, bool objects_bare,
		     const flx_ckpt_opts *o, flx_error *err);

/**
 * -o megatron_swiglu= against what the checkpoint says of SwiGLU:
 * m->swiglu (0 or 1 from proof, a phrase naming where it was read or
 * inferred, or -1 unknown).  Not given: nothing.  Given and m->swiglu
 * unknown: m->swiglu takes it (m->swiglu_stated).  Given and different
 * from m->swiglu: refused (docs/facts.md).  Thread-safe on distinct m.
 * @return 0, or -EINVAL with err naming the option and proof.
 */
int flx_mcore_state_swiglu(const flx_opt_vals *vals, flx_megatron *m,
			   const char *proof, flx_error *err);

/**
 * Interpret a Megatron state dict (a dict: iteration, checkpoint_version,
 * args, optimizer leftovers) into *m as the common state is read; file
 * names it in messages.  For the megatron-legacy source, whose rank 0
 * file holds the same fields.  Sets no file or pickle location.
 * @return 0, or -EINVAL with err naming file and key.
 */
int flx_mcore_interpret_state(const char *file, const flx_pv *state,
			      flx_megatron *m, flx_error *err);

/* The sources' options (megatron_iter, megatron_swiglu), facts and fact
 * hook. */
extern const flx_opt_group flx_mcore_opts;
extern const char *const flx_mcore_facts[];
int flx_mcore_fact(const flx_ckpt *c, const char *name, flx_fact *out);

/** The sources' enter hook (a save directory: source.h). */
int flx_mcore_enter(const flx_dirview *v, const flx_ckpt_opts *o, char *sub,
		    size_t cap, flx_error *err);

#endif
