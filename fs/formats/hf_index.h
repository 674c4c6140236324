/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_HF_INDEX_H
#define FLX_FS_FORMATS_HF_INDEX_H

/*
 * model.safetensors.index.json of sharded safetensors files, as
 * huggingface_hub writes it: the total size of the tensors and the file
 * of each (jansson's JSON_INDENT(2) text).
 */

#include "formats/safetensors.h"

struct flx_layout;

/* The sharded tensors (borrowed; must outlive the fs). */
typedef struct flx_hf_index {
	const flx_gen_ctx *ctx;
	const struct flx_layout *layout; /* names the shard files */
	size_t n;
	const flx_st_entry *e; /* the weight map's order, each with its shard */
	size_t nshards;
	uint64_t total; /* bytes of all tensors */
} flx_hf_index;

/**
 * Add file name, the index of h, to directory dir.
 * @return 0, or -ENOMEM, -ENOTDIR, or a generator's error.
 */
int flx_hf_index_add_file(flx_fs *fs, int dir, const char *name,
			  const flx_hf_index *h);

#endif
