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
 *
 * The text of the synthetic files is not built here: each is a list of
 * generated segments (formats.h) measured once, and the views they
 * describe.  Nodes are created in the order the inode numbers have always
 * had: ranks/ (stage by stage, rank by rank), hf/, objects/, index.json.
 */
#include "tree_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct builder {
	const flx_ckpt *c;
	const flx_plan *p;
	flx_fs *fs;
	flx_error *err;
	flx_gen_ctx *ctx; /* owned by fs, as the rest */
	flx_hf_index *hf;
	flx_st_set *hf_all;
	const flx_st_set *stage0; /* pp=1 without renumbering: hf/'s set */
} builder;

static int fail(builder *b, int rc, const char *key, const char *what)
{
	if (rc == -ENOMEM)
		return flx_error_set(b->err, rc, NULL, key, "out of memory");
	return flx_error_set(b->err, rc, NULL, key, "%s: %s", what,
			     strerror(-rc));
}

/* Measure generated piece (kind, arg, idx) and append it to file. */
static int add_gen(builder *b, int file, flx_gen_kind kind, const void *arg,
		   uint32_t idx, const char *key)
{
	uint64_t len;
	int rc = flx_gen(kind, arg, idx, NULL, 0, 0, &len);

	if (!rc)
		rc = flx_fs_add_gen(b->fs, file, kind, arg, idx, len);
	return rc ? fail(b, rc, key, "generating") : 0;
}

static bool st_representable(const flx_tensor *t)
{
	return flx_dtype_get(t->dtype)->safetensors != NULL;
}

/*
 * A safetensors file of f's entries: the header (the u64 length, the
 * JSON, spaces to a multiple of 64), then the tensors in data order.
 */
static int add_safetensors(builder *b, int dir, const char *name,
			   flx_st_file *f)
{
	const flx_st_set *set = f->set;
	uint64_t text, total;
	int file, rc = 0;

	f->boff = flx_fs_alloc(b->fs,
			       (set->n / FLX_GEN_BATCH + 1) * sizeof(uint64_t));
	if (!f->boff)
		return fail(b, -ENOMEM, name, "");
	flx_st_offsets(f);
	file = flx_fs_mkfile(b->fs, dir, name);
	if (file < 0)
		return fail(b, file, name, "creating file");
	rc = add_gen(b, file, FLX_GEN_ST_HEAD, f, 0, name);
	for (size_t k = 0; !rc && f->pp >= 0 && k < set->n; k += FLX_GEN_BATCH)
		rc = add_gen(b, file, FLX_GEN_ST_META, f, (uint32_t)k, name);
	if (!rc && f->pp >= 0)
		rc = add_gen(b, file, FLX_GEN_ST_META_END, f, 0, name);
	for (size_t k = 0; !rc && k < set->n; k += FLX_GEN_BATCH)
		rc = add_gen(b, file, FLX_GEN_ST_ENTRY, f, (uint32_t)k, name);
	if (rc)
		return rc;
	/* the closing brace, then spaces so that the data starts 64-byte
	 * aligned; the length prefix counts both (the head, measured above,
	 * has its 8 bytes whatever their value) */
	text = flx_fs_file_size(b->fs, file) - 8 + 1;
	total = (8 + text + 63) & ~(uint64_t)63;
	f->hlen = total - 8;
	f->pad = total - 8 - text;
	rc = add_gen(b, file, FLX_GEN_ST_END, f, 0, name);
	for (size_t i = 0; !rc && i < set->n; i++)
		rc = flx_fs_add_view(b->fs, file,
				     flx_st_view(f, &set->e[set->order[i]]));
	return rc ? fail(b, rc, name, "building file") : 0;
}

/* A safetensors file over set. */
static flx_st_file *st_file_new(builder *b, const flx_st_set *set, int tp,
				int pp)
{
	flx_st_file *f = flx_fs_alloc(b->fs, sizeof(*f));

	if (!f)
		return NULL;
	f->ctx = b->ctx;
	f->tp = tp;
	f->pp = pp;
	f->set = set;
	return f;
}

/* A set with room for n entries (n filled by the caller). */
static flx_st_set *st_set_new(builder *b, size_t n)
{
	flx_st_set *s = flx_fs_alloc(
	    b->fs, sizeof(*s) + n * (sizeof(flx_st_entry) + sizeof(uint32_t)));

	if (!s)
		return NULL;
	s->e = (flx_st_entry *)(s + 1);
	s->order = (uint32_t *)(s->e + n);
	return s;
}

static flx_st_entry st_entry(const char *name, const flx_placement *pl)
{
	return (flx_st_entry){
	    .name = name, .pl = pl, .esz = flx_dtype_size(pl->src->dtype)};
}

/* The .npy file of a tensor; name_of >= 0: named like that node. */
static int add_npy(builder *b, int dir, const char *tname, const flx_view *v,
		   int name_of)
{
	char fname[FLX_NAME_MAX + 1];
	int rc = name_of >= 0 ? 0 : flx_file_name(tname, ".npy", fname);

	if (rc < 0)
		return flx_error_set(b->err, rc, NULL, tname,
				     "tensor name too long for a file name");
	rc = flx_fs_mknpy(b->fs, dir, fname, v, name_of);
	return rc < 0 ? fail(b, rc, tname, "creating .npy") : rc;
}

/*
 * The rank directories of stage pp, rank by rank: .npy files, then the
 * safetensors file.  The ranks of a stage hold the same tensors under the
 * same names, so the names and the data order are made once.
 */
static int build_stage(builder *b, int ranks_dir, int pp, int *npy_node)
{
	const flx_plan *p = b->p;
	flx_st_set *set;
	size_t n = 0;
	int rc = 0;

	for (size_t i = 0; i < p->n; i++)
		n += pp >= p->p[i].stage_lo && pp <= p->p[i].stage_hi &&
		     st_representable(p->p[i].src);
	set = st_set_new(b, n);
	if (!set)
		return fail(b, -ENOMEM, "ranks", "");
	for (size_t i = 0; i < p->n; i++) {
		const flx_placement *pl = &p->p[i];

		if (pp >= pl->stage_lo && pp <= pl->stage_hi &&
		    st_representable(pl->src))
			set->e[set->n++] =
			    st_entry(flx_placement_name(pl, pp), pl);
	}
	flx_st_sort(set);
	if (p->spec->pp == 1 && !p->spec->pp_renumber)
		b->stage0 = set;
	for (int tp = 0; tp < p->spec->tp && !rc; tp++) {
		char dname[32];
		flx_st_file *f;
		int dir, tdir;

		snprintf(dname, sizeof(dname), "tp%02d_pp%02d", tp, pp);
		dir = flx_fs_mkdir(b->fs, ranks_dir, dname);
		tdir = dir < 0 ? dir : flx_fs_mkdir(b->fs, dir, "tensors");
		if (tdir < 0)
			return fail(b, tdir, dname, "creating rank directory");
		for (size_t i = 0; i < p->n && !rc; i++) {
			const flx_placement *pl = &p->p[i];
			int node;

			if (pp < pl->stage_lo || pp > pl->stage_hi)
				continue;
			node = add_npy(b, tdir, flx_placement_name(pl, pp),
				       pl->views[tp], tp ? npy_node[i] : -1);
			if (node < 0)
				rc = node;
			else if (!tp)
				npy_node[i] = node;
		}
		f = rc ? NULL : st_file_new(b, set, tp, pp);
		if (!rc && !f)
			rc = fail(b, -ENOMEM, dname, "");
		if (!rc)
			rc = add_safetensors(b, dir, "model.safetensors", f);
	}
	return rc;
}

/* hf/model.safetensors.index.json of a sharded hf/. */
static int add_hf_index(builder *b, int dir, const flx_hf_index *h)
{
	static const char name[] = "model.safetensors.index.json";
	int file = flx_fs_mkfile(b->fs, dir, name), rc;

	if (file < 0)
		return fail(b, file, "hf", "index");
	rc = add_gen(b, file, FLX_GEN_HFIDX_HEAD, h, 0, name);
	for (size_t k = 0; !rc && k < h->n; k += FLX_GEN_BATCH)
		rc =
		    add_gen(b, file, FLX_GEN_HFIDX_ENTRY, h, (uint32_t)k, name);
	return rc ? rc : add_gen(b, file, FLX_GEN_HFIDX_TAIL, h, 0, name);
}

/*
 * The tensors of hf/ and their shards: filled in state-dict order, a
 * shard closed before it would pass hf_shard_size (a larger tensor gets a
 * shard of its own), as the huggingface_hub splitter does.
 */
static int hf_layout(builder *b)
{
	const flx_plan *p = b->p;
	flx_st_set *all;
	flx_hf_index *h;
	size_t n = 0;
	uint64_t cur = 0;

	for (size_t i = 0; i < p->n; i++)
		n += st_representable(p->p[i].src);
	all = st_set_new(b, n);
	h = flx_fs_alloc(b->fs, sizeof(*h));
	if (!all || !h)
		return fail(b, -ENOMEM, "hf", "");
	for (size_t i = 0; i < p->n; i++) {
		const flx_placement *pl = &p->p[i];
		uint64_t bytes;

		if (!st_representable(pl->src))
			continue;
		bytes = flx_view_bytes(pl->whole);
		if (all->n == 0 ||
		    (cur > 0 && cur + bytes > p->spec->hf_shard_size)) {
			h->nshards++;
			cur = 0;
		}
		all->e[all->n] = st_entry(pl->src->fqn, pl);
		all->e[all->n++].shard = (uint32_t)(h->nshards - 1);
		cur += bytes;
		h->total += bytes;
	}
	h->ctx = b->ctx;
	h->n = all->n;
	h->e = all->e;
	b->hf = h;
	b->hf_all = all;
	return 0;
}

static int build_hf(builder *b)
{
	const flx_hf_index *h = b->hf;
	flx_st_set *all = b->hf_all;
	size_t nshards = h->nshards;
	int dir, rc = 0;

	dir = flx_fs_mkdir(b->fs, 0, "hf");
	if (dir < 0)
		return fail(b, dir, "hf", "creating directory");
	for (size_t k = 0, first = 0; k < (nshards ? nshards : 1) && !rc; k++) {
		char fname[64];
		const flx_st_set *set = all;
		flx_st_set *shard;
		flx_st_file *f;

		if (nshards <= 1) {
			snprintf(fname, sizeof(fname), "model.safetensors");
			/* one stage, FQNs as names: the stage's own set,
			 * already sorted */
			if (b->stage0 && b->stage0->n == all->n)
				set = b->stage0;
			else
				flx_st_sort(all);
		} else {
			/* a shard's entries are a range of the index's */
			size_t cnt = 0;

			snprintf(fname, sizeof(fname),
				 "model-%05zu-of-%05zu.safetensors", k + 1,
				 nshards);
			while (first + cnt < all->n &&
			       all->e[first + cnt].shard == k)
				cnt++;
			set = shard = flx_fs_alloc(b->fs, sizeof(*shard));
			if (shard) {
				shard->n = cnt;
				shard->e = all->e + first;
				shard->order = all->order + first;
				flx_st_sort(shard);
			}
			first += cnt;
		}
		f = set ? st_file_new(b, set, 0, -1) : NULL;
		if (!f)
			return fail(b, -ENOMEM, "hf", "");
		rc = add_safetensors(b, dir, fname, f);
	}
	if (!rc && nshards > 1)
		rc = add_hf_index(b, dir, h);
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
	return rc;
}

static int build_objects(builder *b)
{
	int dir = flx_fs_mkdir(b->fs, 0, "objects");

	if (dir < 0)
		return fail(b, dir, "objects", "creating directory");
	for (size_t i = 0; i < b->c->nobjects; i++) {
		const flx_object *o = &b->c->objects[i];
		char fname[FLX_NAME_MAX + 1];
		int f, rc = flx_file_name(o->fqn, ".pt", fname);

		if (rc < 0)
			return flx_error_set(b->err, rc, NULL, o->fqn,
					     "name too long for a file name");
		f = flx_fs_mkfile(b->fs, dir, fname);
		rc = f < 0 ? f
			   : flx_fs_add_raw(b->fs, f, &b->c->files[o->file],
					    o->off, o->len);
		if (rc)
			return fail(b, rc, o->fqn, "object");
	}
	return 0;
}

/* index.json: its head, one piece per tensor, one per object. */
static int build_index(builder *b)
{
	static const char name[] = "index.json";
	const flx_gen_ctx *x = b->ctx;
	int f = flx_fs_mkfile(b->fs, 0, name), rc;

	if (f < 0)
		return fail(b, f, name, "creating");
	rc = add_gen(b, f, FLX_GEN_INDEX_HEAD, x, 0, name);
	for (size_t i = 0; !rc && i < b->p->n; i++)
		rc = add_gen(b, f, FLX_GEN_INDEX_TENSOR, x, (uint32_t)i, name);
	if (!rc)
		rc = add_gen(b, f, FLX_GEN_INDEX_MID, x, 0, name);
	for (size_t i = 0; !rc && i < b->c->nobjects; i++)
		rc = add_gen(b, f, FLX_GEN_INDEX_OBJECT, x, (uint32_t)i, name);
	return rc ? rc : add_gen(b, f, FLX_GEN_INDEX_TAIL, x, 0, name);
}

/* Sizes of the tree, estimated from the plan so that its arrays are
 * allocated once rather than copied as they double. */
static int reserve(builder *b)
{
	const flx_plan *p = b->p;
	const flx_spec *s = p->spec;
	size_t per = (size_t)s->tp, nodes = 6, segs = 16, names = 256;
	size_t nsh = b->hf->nshards ? b->hf->nshards : 1;

	for (size_t i = 0; i < p->n; i++) {
		const flx_placement *pl = &p->p[i];
		size_t st = (size_t)(pl->stage_hi - pl->stage_lo + 1);

		nodes += per * st;
		segs += per * st + per * st / 16 + 3;
		names += st * (strlen(pl->src->fqn) + 8);
	}
	nodes +=
	    (size_t)s->pp * per * 3 + nsh + 1 + b->c->nfiles + b->c->nobjects;
	segs += (size_t)s->pp * per * 3 + 4 * nsh + b->c->nfiles +
		2 * b->c->nobjects;
	names += (size_t)s->pp * per * 40 + nsh * 40;
	for (size_t i = 0; i < b->c->nfiles; i++)
		names += strlen(b->c->files[i].relpath) + 1;
	for (size_t i = 0; i < b->c->nobjects; i++)
		names += strlen(b->c->objects[i].fqn) + 5;
	if (flx_fs_reserve(b->fs, nodes, segs, names))
		return fail(b, -ENOMEM, NULL, "");
	return 0;
}

static int not_utf8(builder *b, const char *what, const char *s)
{
	if (!s || flx_utf8_valid(s))
		return 0;
	return flx_error_set(b->err, -EINVAL, NULL, what,
			     "not valid UTF-8: cannot be written in JSON "
			     "(index.json, safetensors headers)");
}

/* JSON carries only UTF-8: every string the generated files hold is
 * checked before any is measured, so that a read never meets one. */
static int check_strings(builder *b)
{
	const flx_ckpt *c = b->c;
	const flx_spec *s = b->p->spec;
	int rc = not_utf8(b, "dir", c->dir);

	if (!rc)
		rc = not_utf8(b, "format", c->format);
	if (!rc)
		rc = not_utf8(b, "writer", c->writer);
	if (!rc)
		rc = not_utf8(b, "rules", s->rules_path);
	if (!rc)
		rc = not_utf8(b, "layer_regex", s->layer_regex);
	if (!rc)
		rc = not_utf8(b, "embed_regex", s->embed_regex);
	for (size_t i = 0; !rc && i < c->ntensors; i++)
		rc = not_utf8(b, c->tensors[i].fqn, c->tensors[i].fqn);
	for (size_t i = 0; !rc && i < c->nobjects; i++) {
		const flx_object *o = &c->objects[i];

		rc = not_utf8(b, o->fqn, o->fqn);
		if (!rc)
			rc = not_utf8(b, o->fqn, c->files[o->file].relpath);
	}
	return rc;
}

/* What the generators read, owned by the fs. */
static int gen_ctx(builder *b)
{
	const flx_ckpt *c = b->c;

	b->ctx = flx_fs_alloc(b->fs, sizeof(*b->ctx));
	if (!b->ctx)
		return fail(b, -ENOMEM, "index.json", "");
	b->ctx->plan = b->p;
	b->ctx->plain_names = true;
	for (size_t i = 0; i < c->ntensors && b->ctx->plain_names; i++)
		b->ctx->plain_names = flx_json_plain(c->tensors[i].fqn);
	return 0;
}

int flx_fs_build(const flx_ckpt *ckpt, const flx_plan *plan, flx_fs **out,
		 flx_error *err)
{
	builder b = {.c = ckpt, .p = plan, .err = err};
	const char *dup = NULL;
	int *npy_node = NULL;
	int rc, ranks;

	rc = flx_fs_new(&b.fs, ckpt);
	if (rc)
		return fail(&b, rc, NULL, "");
	/* generated pieces name their tensor or object by a 32-bit index */
	if (plan->n > UINT32_MAX || ckpt->nobjects > UINT32_MAX)
		rc = fail(&b, -EFBIG, "index.json", "too many tensors");
	if (!rc)
		rc = check_strings(&b);
	if (!rc)
		rc = gen_ctx(&b);
	if (!rc)
		rc = hf_layout(&b);
	if (!rc)
		rc = reserve(&b);
	if (rc)
		goto fail;
	ranks = flx_fs_mkdir(b.fs, 0, "ranks");
	if (ranks < 0) {
		rc = fail(&b, ranks, "ranks", "creating directory");
		goto fail;
	}
	npy_node = malloc((plan->n ? plan->n : 1) * sizeof(*npy_node));
	if (!npy_node) {
		rc = fail(&b, -ENOMEM, "ranks", "");
		goto fail;
	}
	for (int pp = 0; pp < plan->spec->pp && !rc; pp++)
		rc = build_stage(&b, ranks, pp, npy_node);
	free(npy_node);
	npy_node = NULL;
	if (!rc)
		rc = build_hf(&b);
	if (!rc)
		rc = build_objects(&b);
	if (!rc)
		rc = build_index(&b);
	if (!rc && (rc = flx_fs_finish(b.fs, &dup)))
		flx_error_set(err, rc, NULL, dup,
			      rc == -EEXIST ? "two entries of one directory "
					      "share this name"
					    : "out of memory");
	if (rc)
		goto fail;
	*out = b.fs;
	return 0;
fail:
	flx_error_default(err, rc, NULL);
	free(npy_node);
	flx_fs_free(b.fs);
	return rc;
}
