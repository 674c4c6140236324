/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_INDEX_JSON_H
#define FLX_FS_FORMATS_INDEX_JSON_H

/*
 * index.json: the source summary, the target spec, every tensor's
 * placement (its name and box on every rank, keyed by the rank's
 * directory) and every object's file; jansson's JSON_INDENT(1) text.
 * The paths it prints are the layouts' own names, asked of them.
 */

#include "formats/gen.h"
#include "tree_internal.h"

struct flx_layout;

/* What index.json describes (borrowed; must outlive the fs). */
typedef struct flx_index_json {
	const flx_gen_ctx *ctx;
	const struct flx_layout *ranks;	  /* names rank directories */
	const struct flx_layout *objects; /* names the objects' files */
	/* the data files' sizes, summed (checked: at most INT64_MAX) */
	uint64_t bytes;
} flx_index_json;

/**
 * Add file name, index.json of x, to directory dir.
 * @return 0, or -ENOMEM, -ENOTDIR, or a generator's error (-EINVAL: a
 *         string that is not UTF-8; -ENAMETOOLONG: a name the layouts
 *         cannot make a file name of).
 */
int flx_index_json_add_file(flx_fs *fs, int dir, const char *name,
			    const flx_index_json *x);

#endif
