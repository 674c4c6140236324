/* SPDX-License-Identifier: MIT */
/*
 * index.json; see index_json.h.  Its pieces: the head up to the opening
 * brace of "tensors", one piece per tensor, the middle (closes "tensors",
 * opens "objects"), one piece per object, the tail.
 */
#include "index_json.h"

#include "compat.h"
#include "json_internal.h"
#include "layout.h"
#include "names.h"

#include <errno.h>
#include <string.h>

static flx_jw index_writer(const flx_index_json *x, unsigned char *dst,
			   uint64_t lo, uint64_t hi)
{
	flx_jw w = flx_jw_window(dst, lo, hi);

	w.indent = 1;
	w.plain_names = x->ctx->plain_names;
	return w;
}

static int index_head(const void *arg, uint32_t idx, unsigned char *dst,
		      uint64_t lo, uint64_t hi, uint64_t *len)
{
	const flx_index_json *x = arg;
	const flx_plan *p = x->ctx->plan;
	const flx_ckpt *c = p->ckpt;
	const flx_spec *s = p->spec;
	flx_jw w = index_writer(x, dst, lo, hi);

	(void)idx;
	flx_jw_open(&w, '{');
	flx_jw_key(&w, "flexfs_version");
	flx_jw_str(&w, "0.1.0");
	flx_jw_key(&w, "source");
	flx_jw_open(&w, '{');
	flx_jw_key(&w, "format");
	flx_jw_str(&w, c->format);
	flx_jw_key(&w, "writer");
	flx_jw_str(&w, c->writer);
	flx_jw_key(&w, "dir");
	flx_jw_str(&w, c->dir);
	flx_jw_key(&w, "tensors");
	flx_jw_int(&w, (int64_t)c->ntensors);
	flx_jw_key(&w, "objects");
	flx_jw_int(&w, (int64_t)c->nobjects);
	flx_jw_key(&w, "files");
	flx_jw_int(&w, (int64_t)c->nfiles);
	flx_jw_key(&w, "bytes");
	flx_jw_int(&w, (int64_t)x->bytes);
	flx_jw_key(&w, "layers");
	flx_jw_int(&w, p->nlayers);
	flx_jw_close(&w, '}');
	flx_jw_key(&w, "target");
	flx_jw_open(&w, '{');
	flx_jw_key(&w, "tp");
	flx_jw_int(&w, s->tp);
	flx_jw_key(&w, "pp");
	flx_jw_int(&w, s->pp);
	flx_jw_key(&w, "rules");
	if (s->rules_path)
		flx_jw_str(&w, s->rules_path);
	else
		flx_jw_lit(&w, "null");
	flx_jw_key(&w, "layer_regex");
	flx_jw_str(&w, s->layer_regex);
	flx_jw_key(&w, "embed_regex");
	flx_jw_str(&w, s->embed_regex);
	flx_jw_key(&w, "pp_renumber");
	flx_jw_lit(&w, s->pp_renumber ? "true" : "false");
	flx_jw_key(&w, "hf_shard_size");
	flx_jw_int(&w, (int64_t)s->hf_shard_size);
	flx_jw_close(&w, '}');
	if (s->slicer) { /* the backend of both (gpu/slice.h) */
		flx_jw_key(&w, "slicer");
		flx_jw_str(&w, s->slicer);
		flx_jw_key(&w, "slicer_serves");
		flx_jw_str(&w, "strided gathers, casts");
	}
	flx_jw_key(&w, "tensors");
	flx_jw_open(&w, '{');
	return flx_jw_end(&w, len);
}

/* "parts" of a grouped placement's rank view of box b: each part as a box
 * of the tensor (flx_placement_part()). */
static void grouped_parts(flx_jw *w, const flx_placement *pl, const flx_box *b)
{
	const flx_tensor *t = pl->src;
	flx_box part;

	flx_jw_key(w, "parts");
	flx_jw_open(w, '[');
	for (int k = 0; k < pl->groups; k++) {
		flx_placement_part(pl, b, k, &part);
		flx_jw_item(w);
		flx_jw_open(w, '{');
		flx_jw_key(w, "offset");
		flx_jw_ints(w, t->ndim, part.off);
		flx_jw_key(w, "shape");
		flx_jw_ints(w, t->ndim, part.size);
		flx_jw_close(w, '}');
	}
	flx_jw_close(w, ']');
}

/* "left_out": {format: reason} for the formats the mount serves whose
 * files leave out a tensor of dtype dt (compat.h); nothing when none
 * does. */
static void left_out(flx_jw *w, const flx_plan *p, flx_dtype dt)
{
	bool any = false;

	for (int f = 0; f < FLX_FMT_COUNT; f++) {
		const char *why =
		    flx_fmt_served(p, (flx_fmt)f)
			? flx_fmt_left_out(p->spec, (flx_fmt)f, dt)
			: NULL;

		if (!why)
			continue;
		if (!any) {
			flx_jw_key(w, "left_out");
			flx_jw_open(w, '{');
		}
		any = true;
		flx_jw_key(w, flx_fmt_row((flx_fmt)f)->name);
		flx_jw_str(w, why);
	}
	if (any)
		flx_jw_close(w, '}');
}

/* Tensor idx's member of "tensors". */
static int index_tensor(const void *arg, uint32_t idx, unsigned char *dst,
			uint64_t lo, uint64_t hi, uint64_t *len)
{
	const flx_index_json *x = arg;
	const flx_plan *p = x->ctx->plan;
	const flx_placement *pl = &p->p[idx];
	const flx_tensor *t = pl->src;
	flx_jw w = index_writer(x, dst, lo, hi);

	flx_jw_resume(&w, 2, idx > 0);
	flx_jw_key_name(&w, t->fqn);
	flx_jw_open(&w, '{');
	flx_jw_key(&w, "dtype");
	flx_jw_str(&w, flx_dtype_name(t->dtype));
	flx_jw_key(&w, "shape");
	flx_jw_ints(&w, t->ndim, t->shape);
	flx_jw_key(&w, "split_axis");
	flx_jw_int_or_null(&w, pl->split);
	if (pl->groups > 1) {
		flx_jw_key(&w, "split_groups");
		flx_jw_int(&w, pl->groups);
	}
	flx_jw_key(&w, "source_chunks");
	flx_jw_int(&w, t->nchunks);
	flx_jw_key(&w, "layer");
	flx_jw_int_or_null(&w, pl->layer);
	flx_jw_key(&w, "stage_lo");
	flx_jw_int(&w, pl->stage_lo);
	flx_jw_key(&w, "stage_hi");
	flx_jw_int(&w, pl->stage_hi);
	flx_jw_key(&w, "npy_dtype");
	flx_jw_str(&w, flx_dtype_get(t->dtype)->npy);
	flx_jw_key(&w, "in_safetensors");
	flx_jw_lit(&w, flx_fmt_left_out(p->spec, FLX_FMT_SAFETENSORS, t->dtype)
			   ? "false"
			   : "true");
	left_out(&w, p, t->dtype);
	flx_jw_key(&w, "placement");
	flx_jw_open(&w, '{');
	/* ranks in the order their directories are built: stage, then rank */
	for (int pp = pl->stage_lo; pp <= pl->stage_hi; pp++) {
		for (int tp = 0; tp < p->spec->tp; tp++) {
			const flx_box *b = flx_view_box(
			    flx_placement_view(pl, pp, tp, p->spec->tp));
			char dname[FLX_NAME_MAX + 1];
			int rc = x->ranks->rank_dir(tp, pp, dname);

			if (rc)
				return rc;
			flx_jw_key(&w, dname);
			flx_jw_open(&w, '{');
			flx_jw_key(&w, "name");
			flx_jw_name(&w, flx_placement_name(pl, pp));
			if (pl->groups > 1)
				grouped_parts(&w, pl, b);
			else {
				flx_jw_key(&w, "offset");
				flx_jw_ints(&w, t->ndim, b->off);
			}
			flx_jw_key(&w, "shape");
			flx_jw_ints(&w, t->ndim, b->size);
			flx_jw_close(&w, '}');
		}
	}
	flx_jw_close(&w, '}');
	flx_jw_close(&w, '}');
	return flx_jw_end(&w, len);
}

/* Closes "tensors", opens "objects". */
static int index_mid(const void *arg, uint32_t idx, unsigned char *dst,
		     uint64_t lo, uint64_t hi, uint64_t *len)
{
	const flx_index_json *x = arg;
	flx_jw w = index_writer(x, dst, lo, hi);

	(void)idx;
	flx_jw_resume(&w, 2, x->ctx->plan->n > 0);
	flx_jw_close(&w, '}');
	flx_jw_key(&w, "objects");
	flx_jw_open(&w, '{');
	return flx_jw_end(&w, len);
}

/* Object idx's member of "objects": its file, named by its layout. */
static int index_object(const void *arg, uint32_t idx, unsigned char *dst,
			uint64_t lo, uint64_t hi, uint64_t *len)
{
	const flx_index_json *x = arg;
	const flx_ckpt *c = x->ctx->plan->ckpt;
	const flx_object *o = &c->objects[idx];
	const char *dir = x->objects->name;
	size_t dl = strlen(dir);
	char path[FLX_NAME_MAX + 1 + FLX_NAME_MAX + 1];
	flx_jw w = index_writer(x, dst, lo, hi);
	int rc;

	if (dl > FLX_NAME_MAX)
		return -ENAMETOOLONG;
	memcpy(path, dir, dl);
	path[dl] = '/';
	rc = x->objects->object_file(o, path + dl + 1);
	if (rc)
		return rc;
	flx_jw_resume(&w, 2, idx > 0);
	flx_jw_key(&w, o->fqn);
	flx_jw_open(&w, '{');
	flx_jw_key(&w, "path");
	flx_jw_str(&w, path);
	flx_jw_key(&w, "bytes");
	flx_jw_int(&w, (int64_t)(o->zstd ? o->zsize : o->len));
	flx_jw_key(&w, "file");
	flx_jw_str(&w, c->files[o->file].relpath);
	flx_jw_close(&w, '}');
	return flx_jw_end(&w, len);
}

static int index_tail(const void *arg, uint32_t idx, unsigned char *dst,
		      uint64_t lo, uint64_t hi, uint64_t *len)
{
	const flx_index_json *x = arg;
	flx_jw w = index_writer(x, dst, lo, hi);

	(void)idx;
	flx_jw_resume(&w, 2, x->ctx->plan->ckpt->nobjects > 0);
	flx_jw_close(&w, '}');
	flx_jw_close(&w, '}');
	return flx_jw_end(&w, len);
}

static const flx_gen_ops index_head_ops = {"index.json head", index_head};
static const flx_gen_ops index_tensor_ops = {"index.json tensor", index_tensor};
static const flx_gen_ops index_mid_ops = {"index.json middle", index_mid};
static const flx_gen_ops index_object_ops = {"index.json object", index_object};
static const flx_gen_ops index_tail_ops = {"index.json tail", index_tail};

int flx_index_json_add_file(flx_fs *fs, int dir, const char *name,
			    const flx_index_json *x)
{
	const flx_plan *p = x->ctx->plan;
	int file, rc = flx_fs_mkfile(fs, dir, name, &file);

	if (!rc)
		rc = flx_fs_add_gen(fs, file, &index_head_ops, x, 0);
	for (size_t i = 0; !rc && i < p->n; i++)
		rc =
		    flx_fs_add_gen(fs, file, &index_tensor_ops, x, (uint32_t)i);
	if (!rc)
		rc = flx_fs_add_gen(fs, file, &index_mid_ops, x, 0);
	for (size_t i = 0; !rc && i < p->ckpt->nobjects; i++)
		rc =
		    flx_fs_add_gen(fs, file, &index_object_ops, x, (uint32_t)i);
	if (!rc)
		rc = flx_fs_add_gen(fs, file, &index_tail_ops, x, 0);
	return rc;
}
