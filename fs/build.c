/* SPDX-License-Identifier: MIT */
/*
 * What the mounted tree contains:
 *
 *   index.json                          source summary, target spec, placement
 *   ranks/tpTT_ppPP/model.safetensors   that rank's shards
 *   ranks/tpTT_ppPP/tensors/<name>.npy  one file per shard
 *   hf/model.safetensors                full tensors (or model-i-of-N +
 *   hf/model.safetensors.index.json      index past hf_shard_size)
 *   hf/<other files of the checkpoint>  verbatim (config.json, tokenizer...)
 *   objects/<fqn>.pt                    non-tensor items verbatim
 *                                       (torch.save zips)
 */
#include "json_guard.h"
#include "tree_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct builder {
	const flx_ckpt *c;
	const flx_plan *p;
	flx_fs *fs;
	flx_error *err;
	json_t *index;	  /* index.json root */
	flx_view **whole; /* per tensor: a view of the whole tensor */
} builder;

static void rank_dir_name(char *buf, size_t len, int tp, int pp)
{
	snprintf(buf, len, "tp%02d_pp%02d", tp, pp);
}

static int fail(builder *b, int rc, const char *key, const char *what)
{
	if (rc == -ENOMEM)
		return flx_error_set(b->err, rc, NULL, key, "out of memory");
	return flx_error_set(b->err, rc, NULL, key, "%s: %s", what,
			     strerror(-rc));
}

/* A safetensors file made of entries; meta is the __metadata__ object. */
static int add_safetensors(builder *b, int dir, const char *name,
			   flx_st_entry *e, size_t n, json_t *meta)
{
	unsigned char *hdr = NULL;
	uint64_t hlen = 0;
	int f, rc;

	rc = flx_safetensors_header(e, n, meta, &hdr, &hlen);
	if (rc)
		return fail(b, rc, name, "safetensors header");
	f = flx_fs_mkfile(b->fs, dir, name);
	if (f < 0) {
		free(hdr);
		return fail(b, f, name, "creating file");
	}
	rc = flx_fs_add_lit(b->fs, f, hdr, hlen);
	for (size_t i = 0; !rc && i < n; i++)
		rc = flx_fs_add_view(b->fs, f, e[i].view);
	return rc ? fail(b, rc, name, "building file") : 0;
}

static int add_npy(builder *b, int dir, const char *tname, const flx_view *v)
{
	const flx_tensor *t = flx_view_tensor(v);
	unsigned char *hdr;
	uint64_t hlen;
	char *fname;
	int f, rc;

	rc = flx_file_name(tname, ".npy", &fname);
	if (rc)
		return flx_error_set(b->err, rc, NULL, tname,
				     "tensor name too long for a file name");
	rc = flx_npy_header(t->dtype, t->ndim, flx_view_box(v)->size, &hdr,
			    &hlen);
	if (rc) {
		free(fname);
		return fail(b, rc, tname, "npy header");
	}
	f = flx_fs_mkfile(b->fs, dir, fname);
	free(fname);
	if (f < 0) {
		free(hdr);
		return fail(b, f, tname, "creating .npy");
	}
	rc = flx_fs_add_lit(b->fs, f, hdr, hlen);
	if (!rc)
		rc = flx_fs_add_view(b->fs, f, v);
	return rc ? fail(b, rc, tname, "building .npy") : 0;
}

static bool st_representable(const flx_tensor *t)
{
	return flx_dtype_get(t->dtype)->safetensors != NULL;
}

/* One rank directory: its safetensors file, its .npy files, and its rows
 * in index.json's placement maps. */
static int build_rank(builder *b, int ranks_dir, int tp, int pp)
{
	const flx_plan *p = b->p;
	char dname[32];
	flx_st_entry *e = NULL;
	size_t n = 0;
	json_t *meta = NULL, *info = NULL, *tinfo;
	int dir, tdir, rc = 0;

	rank_dir_name(dname, sizeof(dname), tp, pp);
	dir = flx_fs_mkdir(b->fs, ranks_dir, dname);
	tdir = dir < 0 ? dir : flx_fs_mkdir(b->fs, dir, "tensors");
	if (tdir < 0)
		return fail(b, tdir, dname, "creating rank directory");
	e = calloc(p->n ? p->n : 1, sizeof(*e));
	tinfo = json_object();
	info = json_pack("{s:i,s:i,s:{s:i,s:i},s:O}", "tp", p->spec->tp, "pp",
			 p->spec->pp, "rank", "tp", tp, "pp", pp, "tensors",
			 tinfo);
	if (!e || !tinfo || !info) {
		rc = fail(b, -ENOMEM, dname, "");
		goto out;
	}
	for (size_t i = 0; i < p->n && !rc; i++) {
		const flx_placement *pl = &p->p[i];
		const flx_view *v;
		const char *name;
		json_t *jt, *row;

		if (pp < pl->stage_lo || pp > pl->stage_hi)
			continue;
		v = pl->views[tp];
		name = flx_placement_name(pl, pp);
		row = json_pack(
		    "{s:s,s:o,s:o}", "name", name, "offset",
		    flx_json_ints(pl->src->ndim, flx_view_box(v)->off), "shape",
		    flx_json_ints(pl->src->ndim, flx_view_box(v)->size));
		jt = json_object_get(json_object_get(b->index, "tensors"),
				     pl->src->fqn);
		if (!row || json_object_set_new(
				json_object_get(jt, "placement"), dname, row)) {
			rc = fail(b, -ENOMEM, dname, "");
			break;
		}
		rc = add_npy(b, tdir, name, v);
		if (rc || !st_representable(pl->src))
			continue;
		e[n].name = name;
		e[n].view = v;
		n++;
		if (json_object_set_new(
			tinfo, name,
			json_pack(
			    "{s:s,s:o,s:o,s:o}", "source", pl->src->fqn,
			    "global_shape",
			    flx_json_ints(pl->src->ndim, pl->src->shape),
			    "global_offset",
			    flx_json_ints(pl->src->ndim, flx_view_box(v)->off),
			    "split_axis",
			    pl->split < 0 ? json_null()
					  : json_integer(pl->split))))
			rc = fail(b, -ENOMEM, dname, "");
	}
	if (rc)
		goto out;
	{
		char *s = json_dumps(info, JSON_COMPACT);

		meta = s ? json_pack("{s:s,s:s}", "format", "pt", "flexfs", s)
			 : NULL;
		free(s);
	}
	rc = meta ? add_safetensors(b, dir, "model.safetensors", e, n, meta)
		  : fail(b, -ENOMEM, dname, "");
out:
	json_decref(meta);
	json_decref(info);
	json_decref(tinfo);
	free(e);
	return rc;
}

static int build_hf(builder *b)
{
	const flx_plan *p = b->p;
	const flx_spec *s = p->spec;
	flx_st_entry *e = NULL;
	size_t n = 0, nshards = 0;
	size_t *shard_of = NULL;
	uint64_t cur = 0, total = 0;
	json_t *wmap = NULL;
	int dir, rc = 0;

	dir = flx_fs_mkdir(b->fs, 0, "hf");
	if (dir < 0)
		return fail(b, dir, "hf", "creating directory");
	e = calloc(p->n ? p->n : 1, sizeof(*e));
	shard_of = calloc(p->n ? p->n : 1, sizeof(*shard_of));
	if (!e || !shard_of) {
		rc = fail(b, -ENOMEM, "hf", "");
		goto out;
	}
	/* Fill shards in state-dict order, closing one before it would pass
	 * hf_shard_size (a larger tensor gets a shard of its own), as the
	 * huggingface_hub splitter does. */
	for (size_t i = 0; i < p->n; i++) {
		uint64_t bytes;

		if (!st_representable(p->p[i].src))
			continue;
		bytes = flx_view_bytes(b->whole[i]);
		if (n == 0 || (cur > 0 && cur + bytes > s->hf_shard_size)) {
			nshards++;
			cur = 0;
		}
		e[n].name = p->p[i].src->fqn;
		e[n].view = b->whole[i];
		shard_of[n] = nshards - 1;
		cur += bytes;
		total += bytes;
		n++;
	}
	if (nshards <= 1) {
		json_t *meta = json_pack("{s:s}", "format", "pt");

		rc = meta ? add_safetensors(b, dir, "model.safetensors", e, n,
					    meta)
			  : -ENOMEM;
		json_decref(meta);
		goto out;
	}
	wmap = json_object();
	for (size_t k = 0, first = 0; k < nshards && !rc; k++) {
		char fname[64];
		size_t cnt = 0;
		json_t *meta = json_pack("{s:s}", "format", "pt");

		snprintf(fname, sizeof(fname),
			 "model-%05zu-of-%05zu.safetensors", k + 1, nshards);
		while (first + cnt < n && shard_of[first + cnt] == k) {
			json_object_set_new(wmap, e[first + cnt].name,
					    json_string(fname));
			cnt++;
		}
		rc = meta ? add_safetensors(b, dir, fname, e + first, cnt, meta)
			  : -ENOMEM;
		json_decref(meta);
		first += cnt;
	}
	if (!rc) {
		json_t *idx =
		    json_pack("{s:{s:I},s:O}", "metadata", "total_size",
			      (json_int_t)total, "weight_map", wmap);
		char *text = idx ? json_dumps(idx, JSON_INDENT(2)) : NULL;
		int f = text ? flx_fs_mkfile(b->fs, dir,
					     "model.safetensors.index.json")
			     : -ENOMEM;

		json_decref(idx);
		if (f < 0) {
			free(text);
			rc = fail(b, f, "hf", "index");
		} else {
			rc = flx_fs_add_lit(b->fs, f, (unsigned char *)text,
					    strlen(text));
		}
	}
out:
	json_decref(wmap);
	for (size_t i = 0; !rc && i < b->c->nfiles; i++) {
		const flx_file *f = &b->c->files[i];
		int fi;

		if (f->data)
			continue;
		fi = flx_fs_mkfile(b->fs, dir, f->relpath);
		rc = fi < 0 ? fi : flx_fs_add_raw(b->fs, fi, f, 0, f->size);
		if (rc)
			rc = fail(b, rc, f->relpath, "hf passthrough");
	}
	free(e);
	free(shard_of);
	return rc;
}

static int build_objects(builder *b)
{
	json_t *objs = json_object_get(b->index, "objects");
	int dir = flx_fs_mkdir(b->fs, 0, "objects");

	if (dir < 0)
		return fail(b, dir, "objects", "creating directory");
	for (size_t i = 0; i < b->c->nobjects; i++) {
		const flx_object *o = &b->c->objects[i];
		char *fname, *path = NULL;
		int f, rc = flx_file_name(o->fqn, ".pt", &fname);

		if (rc)
			return flx_error_set(b->err, rc, NULL, o->fqn,
					     "name too long for a file name");
		f = flx_fs_mkfile(b->fs, dir, fname);
		rc = f < 0 ? f
			   : flx_fs_add_raw(b->fs, f, &b->c->files[o->file],
					    o->off, o->len);
		if (!rc && asprintf(&path, "objects/%s", fname) < 0)
			rc = -ENOMEM;
		free(fname);
		if (!rc && json_object_set_new(
			       objs, o->fqn,
			       json_pack("{s:s,s:I,s:s}", "path", path, "bytes",
					 (json_int_t)o->len, "file",
					 b->c->files[o->file].relpath)))
			rc = -ENOMEM;
		free(path);
		if (rc)
			return fail(b, rc, o->fqn, "object");
	}
	return 0;
}

/* index.json skeleton; build_rank() fills each tensor's placement. */
static int index_begin(builder *b)
{
	const flx_ckpt *c = b->c;
	const flx_spec *s = b->p->spec;
	uint64_t bytes = 0;
	json_t *tensors = json_object();

	for (size_t i = 0; i < c->nfiles; i++)
		bytes += c->files[i].data ? c->files[i].size : 0;
	b->index = json_pack(
	    "{s:s,s:{s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:i},"
	    "s:{s:i,s:i,s:s?,s:s,s:s,s:b,s:I},s:o,s:{}}",
	    "flexfs_version", "0.1.0", "source", "format", c->format, "writer",
	    c->writer, "dir", c->dir, "tensors", (json_int_t)c->ntensors,
	    "objects", (json_int_t)c->nobjects, "files", (json_int_t)c->nfiles,
	    "bytes", (json_int_t)bytes, "layers", b->p->nlayers, "target", "tp",
	    s->tp, "pp", s->pp, "rules", s->rules_path, "layer_regex",
	    s->layer_regex, "embed_regex", s->embed_regex, "pp_renumber",
	    s->pp_renumber, "hf_shard_size", (json_int_t)s->hf_shard_size,
	    "tensors", tensors, "objects");
	if (!b->index)
		return fail(b, -ENOMEM, "index.json", "");
	for (size_t i = 0; i < b->p->n; i++) {
		const flx_placement *pl = &b->p->p[i];
		const flx_tensor *t = pl->src;
		json_t *jt = json_pack(
		    "{s:s,s:o,s:o,s:I,s:o,s:i,s:i,s:o,s:b,s:{}}", "dtype",
		    flx_dtype_name(t->dtype), "shape",
		    flx_json_ints(t->ndim, t->shape), "split_axis",
		    pl->split < 0 ? json_null() : json_integer(pl->split),
		    "source_chunks", (json_int_t)t->nchunks, "layer",
		    pl->layer < 0 ? json_null() : json_integer(pl->layer),
		    "stage_lo", pl->stage_lo, "stage_hi", pl->stage_hi,
		    "npy_dtype", json_string(flx_dtype_get(t->dtype)->npy),
		    "in_safetensors", st_representable(t), "placement");

		if (!jt || json_object_set_new(tensors, t->fqn, jt))
			return fail(b, -ENOMEM, "index.json", "");
	}
	return 0;
}

static int index_finish(builder *b)
{
	char *text = json_dumps(b->index, JSON_INDENT(1));
	int f;

	if (!text)
		return fail(b, -ENOMEM, "index.json", "");
	f = flx_fs_mkfile(b->fs, 0, "index.json");
	if (f < 0) {
		free(text);
		return fail(b, f, "index.json", "creating");
	}
	return flx_fs_add_lit(b->fs, f, (unsigned char *)text, strlen(text));
}

/* Whole-tensor views for hf/: a replicated tensor's rank view is already
 * whole; the others get one of their own, owned by the fs. */
static int make_whole_views(builder *b)
{
	b->whole = calloc(b->p->n ? b->p->n : 1, sizeof(*b->whole));
	if (!b->whole)
		return fail(b, -ENOMEM, "hf", "");
	for (size_t i = 0; i < b->p->n; i++) {
		const flx_placement *pl = &b->p->p[i];
		const flx_tensor *t = pl->src;
		flx_box box;
		flx_view *v;
		int rc;

		if (pl->split < 0) {
			b->whole[i] = pl->views[0];
			continue;
		}
		for (int d = 0; d < t->ndim; d++) {
			box.off[d] = 0;
			box.size[d] = t->shape[d];
		}
		rc = flx_view_new(b->c, t, &box, &v, b->err);
		if (!rc)
			rc = flx_fs_own_view(b->fs, v);
		if (rc)
			return rc;
		b->whole[i] = v;
	}
	return 0;
}

int flx_fs_build(const flx_ckpt *ckpt, const flx_plan *plan, flx_fs **out,
		 flx_error *err)
{
	builder b = {.c = ckpt, .p = plan, .err = err};
	const char *dup = NULL;
	int rc, ranks;

	flx_json_guard_begin();
	rc = flx_fs_new(&b.fs, ckpt);
	if (rc)
		return fail(&b, rc, NULL, "");
	rc = index_begin(&b);
	if (!rc)
		rc = make_whole_views(&b);
	if (rc)
		goto fail;
	ranks = flx_fs_mkdir(b.fs, 0, "ranks");
	if (ranks < 0) {
		rc = fail(&b, ranks, "ranks", "creating directory");
		goto fail;
	}
	for (int pp = 0; pp < plan->spec->pp && !rc; pp++)
		for (int tp = 0; tp < plan->spec->tp && !rc; tp++)
			rc = build_rank(&b, ranks, tp, pp);
	if (!rc)
		rc = build_hf(&b);
	if (!rc)
		rc = build_objects(&b);
	if (!rc)
		rc = index_finish(&b);
	if (!rc && (rc = flx_fs_finish(b.fs, &dup)))
		flx_error_set(err, rc, NULL, dup,
			      rc == -EEXIST ? "two entries of one directory "
					      "share this name"
					    : "out of memory");
	/* a jansson allocation that failed may have left a key out of some
	 * JSON text without an error: discard everything */
	if (!rc && flx_json_guard_failed())
		rc = fail(&b, -ENOMEM, "index.json", "");
	if (rc)
		goto fail;
	json_decref(b.index);
	free(b.whole);
	*out = b.fs;
	return 0;
fail:
	flx_error_default(err, rc, NULL);
	json_decref(b.index);
	free(b.whole);
	flx_fs_free(b.fs);
	return rc;
}
