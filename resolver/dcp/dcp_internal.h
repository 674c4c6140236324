/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_DCP_INTERNAL_H
#define FLX_RESOLVER_DCP_INTERNAL_H

/*
 * Internal to resolver/: the DCP loader (dcp.c) as a step another source
 * runs inside its own load, for formats that are a DCP directory plus
 * files of their own (Megatron-Core's torch_dist, resolver/megatron/).
 * Thread-safety: as a source's load (one builder, one thread).
 */

#include "pickle.h"
#include "source.h"

#include <stdbool.h>

/* How a caller's format differs from plain DCP; zero-initialise. */
typedef struct flx_dcp_opts {
	/* a Metadata subclass accepted besides torch.distributed's own,
	 * matched by module and class name (nothing is executed); NULL:
	 * none */
	const char *sub_module;
	const char *sub_class;
	/* what to say when .metadata does not exist (NULL: DCP's own) */
	const char *missing;
	/* called with the Metadata's attribute dict (its BUILD state) once
	 * the tensors are decoded and before their items are read, to adjust
	 * them (Megatron's flattened optimizer tensors); NULL: none.  Its
	 * storage_data dict and the tensors' chunks lists may be empty there:
	 * the loader takes them out of the pickle as it decodes (dcp.c,
	 * sd_sink() and ck_sink()).
	 * @return 0, or -errno with err set */
	int (*attrs)(flx_build *b, const flx_pv *attrs, flx_error *err);
} flx_dcp_opts;

/**
 * Make ch (file, item_off, item_len and zstd kept, off and size its box)
 * a box of a flattened item: the item holds a piece of len elements saved
 * with shape (1, ..., 1, len) (ndim + 1 axes, ndim the tensor's), and
 * element (j_0, ..., j_{ndim-1}) of the box is the piece's element
 * shift + sum j_d x ch->stride[d] (ch->stride set by the caller: the
 * strides of the row-major block the piece flattens).  When the item is
 * read, stride and storage_offset are scaled to the saved one-axis stride
 * and point into the item's storage.  Thread-safe (touches only *ch).
 */
void flx_dcp_flat_box(flx_chunk *ch, int64_t len, int64_t shift);

/**
 * Fill b from the directory's .metadata and the items of its .distcp
 * files, as the DCP source does, with the differences d gives (NULL: none).
 * Sets flx_build_ckpt(b)->writer (strdup'ed) and mtime_ns.
 * @return 0, or -errno with err set (the builder's err).
 */
int flx_dcp_load(flx_build *b, const flx_ckpt_opts *o, const flx_dcp_opts *d,
		 flx_error *err);

/** Whether a directory entry is one of DCP's own files: the .distcp data
 * and torch's __R_N.metadata leftovers (.metadata is hidden, and the
 * builder never passes hidden files through). */
bool flx_dcp_owns(const char *name);

#endif
