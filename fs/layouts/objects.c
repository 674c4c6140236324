/* SPDX-License-Identifier: MIT */
/*
 * objects/: the checkpoint's non-tensor items, verbatim,
 *
 *   objects/<fqn>.pt   the item's bytes (torch.save zips)
 */
#include "layout.h"

#include <string.h>

/* The layout's directory under the root. */
static const char dir_name[] = "objects";

static int objects_file(const flx_object *o, char *out)
{
	return flx_file_name(o->fqn, ".pt", out);
}

static int objects_size(flx_build *b, void **state, flx_fs_size *sz)
{
	(void)state;
	sz->nodes += 1 + b->ckpt->nobjects;
	sz->segs += 1; /* a file of one segment keeps it in its node */
	sz->names += sizeof(dir_name);
	for (size_t i = 0; i < b->ckpt->nobjects; i++)
		sz->names += strlen(b->ckpt->objects[i].fqn) + 5;
	return 0;
}

static int objects_build(flx_build *b, void *state)
{
	int dir, rc = flx_fs_mkdir(b->fs, 0, dir_name, &dir);

	(void)state;
	if (rc)
		return flx_build_fail(b, rc, dir_name, "creating directory");
	for (size_t i = 0; i < b->ckpt->nobjects; i++) {
		const flx_object *o = &b->ckpt->objects[i];
		char fname[FLX_NAME_MAX + 1];
		int file;

		rc = objects_file(o, fname);
		if (rc)
			return flx_error_set(b->err, rc, NULL, o->fqn,
					     "name too long for a file name");
		rc = flx_fs_mkfile(b->fs, dir, fname, &file);
		if (!rc && o->zstd)
			rc = flx_fs_add_zobj(b->fs, file, o);
		else if (!rc)
			rc = flx_fs_add_raw(b->fs, file,
					    &b->ckpt->files[o->file], o->off,
					    o->len);
		if (rc)
			return flx_build_fail(b, rc, o->fqn, "object");
	}
	return 0;
}

const flx_layout flx_layout_objects = {
    .name = dir_name,
    .size = objects_size,
    .build = objects_build,
    .object_file = objects_file,
};
