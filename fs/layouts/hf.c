/* SPDX-License-Identifier: MIT */
/*
 * hf/: the whole model as Hugging Face checkpoints hold it,
 *
 *   hf/model.safetensors                 every tensor, whole, or past
 *   hf/model-0000i-of-0000N.safetensors   hf_shard_size shards and
 *   hf/model.safetensors.index.json       their index
 *   hf/<the checkpoint's other files>    verbatim (config.json, ...)
 *
 * Shards are filled in state-dict order, a shard closed before it would
 * pass hf_shard_size (a larger tensor gets a shard of its own), as the
 * huggingface_hub splitter does.
 */
#include "layout.h"

#include "formats/compat.h"
#include "formats/hf_index.h"
#include "formats/safetensors.h"

#include <errno.h>
#include <string.h>

extern const flx_layout flx_layout_hf;

/* The layout's directory under the root. */
static const char dir_name[] = "hf";

static const char index_name[] = "model.safetensors.index.json";

/* "model-%05zu-of-%05zu.safetensors", k from 0 */
static int hf_shard_file(size_t k, size_t n, char *out)
{
	char *o = out;

	memcpy(o, "model-", 6);
	o += 6 + flx_fmt_int(o + 6, (int64_t)k + 1, 5);
	memcpy(o, "-of-", 4);
	o += 4 + flx_fmt_int(o + 4, (int64_t)n, 5);
	memcpy(o, ".safetensors", sizeof(".safetensors"));
	return 0;
}

/* What hf_size() plans for hf_build(): the tensors, their shards. */
typedef struct hf_state {
	flx_st_set *all; /* plan order, each entry with its shard */
	flx_hf_index index;
} hf_state;

static int hf_size(flx_build *b, void **state, flx_fs_size *sz)
{
	const flx_plan *p = b->plan;
	hf_state *h = flx_fs_alloc(b->fs, sizeof(*h));
	flx_hf_index *x = h ? &h->index : NULL;
	uint64_t cur = 0;
	size_t n = 0;

	for (size_t i = 0; i < p->n; i++)
		n += !flx_fmt_left_out(p->spec, FLX_FMT_SAFETENSORS,
				       p->p[i].src->dtype);
	if (!h || flx_st_set_new(b->fs, n, &h->all))
		return flx_build_fail(b, -ENOMEM, dir_name, "");
	for (size_t i = 0; i < p->n; i++) {
		const flx_placement *pl = &p->p[i];
		flx_st_entry *e = &h->all->e[h->all->n];
		uint64_t bytes;

		if (flx_fmt_left_out(p->spec, FLX_FMT_SAFETENSORS,
				     pl->src->dtype))
			continue;
		bytes = flx_view_bytes(pl->whole);
		if (h->all->n == 0 ||
		    (cur > 0 && cur + bytes > p->spec->hf_shard_size)) {
			x->nshards++;
			cur = 0;
		}
		*e = flx_st_entry_of(pl->src->fqn, pl);
		e->shard = (uint32_t)(x->nshards - 1);
		h->all->n++;
		cur += bytes;
		x->total += bytes;
	}
	x->ctx = b->gen;
	x->layout = &flx_layout_hf;
	x->n = h->all->n;
	x->e = h->all->e;
	*state = h;
	sz->nodes += 2 + x->nshards + b->ckpt->nfiles;
	/* views, their header's batches, the index's batches and ends */
	sz->segs += n + n / 32 + n / 32 + 5 * x->nshards + 3;
	sz->names += 40 * (x->nshards + 1);
	for (size_t i = 0; i < b->ckpt->nfiles; i++)
		sz->names += strlen(b->ckpt->files[i].relpath) + 1;
	return 0;
}

/* The safetensors set of shard k (the whole model when unsharded). */
static int shard_set(flx_build *b, hf_state *h, size_t k, size_t *first,
		     const flx_st_set **out)
{
	flx_st_set *all = h->all, *shard;
	size_t cnt = 0;

	if (h->index.nshards <= 1) {
		/* the same set as ranks/'s single stage: already sorted */
		if (b->st_by_fqn && b->st_by_fqn->n == all->n) {
			*out = b->st_by_fqn;
		} else {
			flx_st_sort(all);
			*out = all;
		}
		return 0;
	}
	/* a shard's entries are a range of the index's */
	while (*first + cnt < all->n && all->e[*first + cnt].shard == k)
		cnt++;
	shard = flx_fs_alloc(b->fs, sizeof(*shard));
	if (!shard)
		return flx_build_fail(b, -ENOMEM, dir_name, "");
	shard->n = cnt;
	shard->e = all->e + *first;
	shard->order = all->order + *first;
	flx_st_sort(shard);
	*first += cnt;
	*out = shard;
	return 0;
}

/* The checkpoint's files that hold no tensor data, verbatim. */
static int hf_passthrough(flx_build *b, int dir)
{
	for (size_t i = 0; i < b->ckpt->nfiles; i++) {
		const flx_file *f = &b->ckpt->files[i];
		char name[FLX_NAME_MAX + 1];
		int file, rc;

		if (f->data)
			continue;
		rc = flx_extra_name(f->relpath, name);
		if (!rc)
			rc = flx_fs_mkfile(b->fs, dir, name, &file);
		if (!rc)
			rc = flx_fs_add_raw(b->fs, file, f, 0, f->size);
		if (rc)
			return flx_build_fail(b, rc, f->relpath,
					      "hf passthrough");
	}
	return 0;
}

static int hf_build(flx_build *b, void *state)
{
	hf_state *h = state;
	size_t nshards = h->index.nshards, first = 0;
	int dir, rc = flx_fs_mkdir(b->fs, 0, dir_name, &dir);

	if (rc)
		return flx_build_fail(b, rc, dir_name, "creating directory");
	for (size_t k = 0; k < (nshards ? nshards : 1) && !rc; k++) {
		char fname[FLX_NAME_MAX + 1] = "model.safetensors";
		const flx_st_set *set = NULL;

		if (nshards > 1)
			hf_shard_file(k, nshards, fname);
		rc = shard_set(b, h, k, &first, &set);
		if (!rc)
			rc = flx_st_add_file(b->fs, dir, fname, b->gen, set, 0,
					     -1);
		if (rc) /* the first error recorded stays */
			return flx_build_fail(b, rc, fname, "building file");
	}
	if (nshards > 1)
		rc = flx_hf_index_add_file(b->fs, dir, index_name, &h->index);
	if (rc)
		return flx_build_fail(b, rc, index_name, "building file");
	return hf_passthrough(b, dir);
}

const flx_layout flx_layout_hf = {
    .name = dir_name,
    .size = hf_size,
    .build = hf_build,
    .shard_file = hf_shard_file,
};
