/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_DCP_INTERNAL_H
#define FLX_RESOLVER_DCP_INTERNAL_H

/*
 * Internal to resolver/: the DCP loader (dcp.c) as a step another source
 * runs inside its own load, for formats that are a DCP directory plus
 * files of their own (Megatron-Core's torch_dist, resolver/megatron/).
 * Thread-safety: as a source's load (one builder, one thread).
 */

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
} flx_dcp_opts;

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
