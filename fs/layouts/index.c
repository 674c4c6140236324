/* SPDX-License-Identifier: MIT */
/*
 * index.json at the root: what the mount holds and where (see
 * formats/index_json.h).  It names rank directories and object files as
 * the ranks/ and objects/ layouts do, asking them.
 */
#include "layout.h"

#include "formats/index_json.h"

#include <errno.h>
#include <stdint.h>

static const char name[] = "index.json";

static int index_size(flx_build *b, void **state, flx_fs_size *sz)
{
	flx_index_json *x = flx_fs_alloc(b->fs, sizeof(*x));

	if (!x)
		return flx_build_fail(b, -ENOMEM, name, "");
	x->ctx = b->gen;
	x->ranks = flx_build_layout(b, "ranks");
	x->objects = flx_build_layout(b, "objects");
	if (!x->ranks || !x->ranks->rank_dir || !x->objects ||
	    !x->objects->object_file)
		return flx_error_set(b->err, -EINVAL, NULL, name,
				     "needs the ranks and objects layouts");
	for (size_t i = 0; i < b->ckpt->nfiles; i++) {
		const flx_file *f = &b->ckpt->files[i];

		if (f->data &&
		    (__builtin_add_overflow(x->bytes, f->size, &x->bytes) ||
		     x->bytes > INT64_MAX))
			return flx_error_set(b->err, -EFBIG, f->relpath, name,
					     "the data files' sizes total more "
					     "than 2^63-1 bytes");
	}
	*state = x;
	sz->nodes += 1;
	sz->segs += 3 + b->plan->n + b->ckpt->nobjects;
	sz->names += sizeof(name);
	return 0;
}

static int index_build(flx_build *b, void *state)
{
	int rc = flx_index_json_add_file(b->fs, 0, name, state);

	return rc ? flx_build_fail(b, rc, name, "building file") : 0;
}

const flx_layout flx_layout_index = {
    .name = name,
    .size = index_size,
    .build = index_build,
};
