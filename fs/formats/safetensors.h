/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_SAFETENSORS_H
#define FLX_FS_FORMATS_SAFETENSORS_H

/*
 * safetensors files: an 8-byte little-endian header length, the JSON
 * header (jansson's JSON_COMPACT | JSON_ENSURE_ASCII text; a per-rank file
 * carries its placement as the "flexfs" metadata, itself a JSON_COMPACT
 * text), spaces to a multiple of 64, then every tensor's bytes in data
 * order (element size descending, then name, as the safetensors writer
 * orders them).  Which dtypes the files hold is this writer's row of
 * formats/compat.h (flx_st_dtypes); the layouts leave the others out.
 *
 * Thread-safety: sets and files are built single-threaded with their
 * tree; once built they are immutable and read by any number of threads.
 */

#include "formats/gen.h"
#include "tree_internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One tensor of safetensors files. */
typedef struct flx_st_entry {
	const char *name; /* its name in the file (borrowed from the plan) */
	const flx_placement *pl;
	uint32_t shard; /* the file of a sharded set that holds it, from 0 */
	uint32_t esz;	/* element size */
} flx_st_entry;

/*
 * The tensors of safetensors files, shared by the files that hold the
 * same names in the same order (the TP ranks of one stage; each reads its
 * own views).  Entries in the caller's order; order[k] is the k-th in data
 * order.
 */
typedef struct flx_st_set {
	size_t n;
	flx_st_entry *e;
	uint32_t *order;
} flx_st_set;

/** Entry name for placement pl (the element size from its dtype). */
flx_st_entry flx_st_entry_of(const char *name, const flx_placement *pl);

/** A set with room for n entries, n set to 0 (the caller appends), owned
 * by fs.  @return 0 and *out, or -ENOMEM. */
int flx_st_set_new(flx_fs *fs, size_t n, flx_st_set **out);

/** Sort the entries of s into data order (fills s->order). */
void flx_st_sort(flx_st_set *s);

/**
 * Add file name to directory dir: the safetensors file of set (sorted;
 * borrowed, must outlive fs), its header generated from ctx (borrowed,
 * the same).  pp >= 0: the views of rank (tp, pp), described in the
 * "flexfs" metadata; pp < 0: the whole tensors, no such metadata (hf/).
 * @return 0, or -ENOMEM, -ENOTDIR, or a generator's error.
 */
int flx_st_add_file(flx_fs *fs, int dir, const char *name,
		    const flx_gen_ctx *ctx, const flx_st_set *set, int tp,
		    int pp);

#endif
