/* SPDX-License-Identifier: MIT */
/*
 * ranks/: one directory per target rank,
 *
 *   ranks/tpTT_ppPP/model.safetensors   that rank's shards
 *   ranks/tpTT_ppPP/model.pt            the same as a torch.save state
 *                                       dict (plan order)
 *   ranks/tpTT_ppPP/tensors/<name>.npy  one file per shard
 *
 * built stage by stage, rank by rank.  The ranks of a stage hold the same
 * tensors under the same names, so a stage's names (shared between its
 * .npy files), its safetensors data order and its torch.save entries are
 * made once.  Each format holds the tensors its readers can
 * (formats/compat.h).
 */
#include "layout.h"

#include "formats/compat.h"
#include "formats/npy.h"
#include "formats/safetensors.h"
#include "formats/torchsave.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The layout's directory under the root. */
static const char dir_name[] = "ranks";

/* "tp%02d_pp%02d" */
static int ranks_dir(int tp, int pp, char *out)
{
	char *o = out;

	memcpy(o, "tp", 2);
	o += 2 + flx_fmt_int(o + 2, tp, 2);
	memcpy(o, "_pp", 3);
	o += 3 + flx_fmt_int(o + 3, pp, 2);
	*o = '\0';
	return 0;
}

static bool on_stage(const flx_placement *pl, int pp)
{
	return pp >= pl->stage_lo && pp <= pl->stage_hi;
}

/* Whether the files of format f hold placement i (compat.h). */
static bool holds(const flx_plan *p, flx_fmt f, size_t i)
{
	return !flx_fmt_left_out(p->spec, f, p->p[i].src->dtype);
}

/* The safetensors set of stage pp: its tensors safetensors files hold,
 * in plan order, under their names on that stage. */
static int stage_set(flx_build *b, int pp, flx_st_set **out)
{
	const flx_plan *p = b->plan;
	flx_st_set *set;
	size_t n = 0;
	int rc;

	for (size_t i = 0; i < p->n; i++)
		n += on_stage(&p->p[i], pp) && holds(p, FLX_FMT_SAFETENSORS, i);
	rc = flx_st_set_new(b->fs, n, &set);
	if (rc)
		return flx_build_fail(b, rc, dir_name, "");
	for (size_t i = 0; i < p->n; i++) {
		const flx_placement *pl = &p->p[i];

		if (on_stage(pl, pp) && holds(p, FLX_FMT_SAFETENSORS, i))
			set->e[set->n++] =
			    flx_st_entry_of(flx_placement_name(pl, pp), pl);
	}
	flx_st_sort(set);
	*out = set;
	return 0;
}

/* The torch.save entries of stage pp: its tensors torch.save files hold,
 * in plan order, under their names on that stage. */
static int stage_pt_set(flx_build *b, int pp, flx_pt_set **out)
{
	const flx_plan *p = b->plan;
	flx_pt_set *set;
	size_t n = 0;
	int rc;

	for (size_t i = 0; i < p->n; i++)
		n += on_stage(&p->p[i], pp) && holds(p, FLX_FMT_TORCHSAVE, i);
	rc = flx_pt_set_new(b->fs, n, &set);
	if (rc)
		return flx_build_fail(b, rc, dir_name, "");
	set->stage = pp;
	set->ntp = p->spec->tp;
	for (size_t i = 0; i < p->n; i++)
		if (on_stage(&p->p[i], pp) && holds(p, FLX_FMT_TORCHSAVE, i))
			set->e[set->n++] = (flx_pt_entry){
			    .name = flx_placement_name(&p->p[i], pp),
			    .pl = &p->p[i]};
	*out = set;
	return 0;
}

/* The .npy files of rank (tp, pp) in directory tdir; npy_node[i]: the
 * node of placement i on the stage's first rank, whose name the others
 * share. */
static int rank_npy(flx_build *b, int tdir, int tp, int pp, int *npy_node)
{
	const flx_plan *p = b->plan;

	for (size_t i = 0; i < p->n; i++) {
		const flx_placement *pl = &p->p[i];
		const char *tname = flx_placement_name(pl, pp);
		char fname[FLX_NAME_MAX + 1];
		int node, rc = 0;

		if (!on_stage(pl, pp) || !holds(p, FLX_FMT_NPY, i))
			continue;
		if (!tp && flx_file_name(tname, ".npy", fname))
			return flx_error_set(
			    b->err, -ENAMETOOLONG,
			    pl->src->nchunks
				? b->ckpt->files[pl->src->chunks[0].file]
				      .relpath
				: b->ckpt->dir,
			    tname,
			    "tensor name too long for a file name (the "
			    "tensor is read from this file)");
		rc = flx_npy_add_file(
		    b->fs, tdir, tp ? NULL : fname, tp ? npy_node[i] : -1,
		    flx_placement_view(pl, pp, tp, b->plan->spec->tp), &node);
		if (rc)
			return flx_build_fail(b, rc, tname, "creating .npy");
		if (!tp)
			npy_node[i] = node;
	}
	return 0;
}

static int build_stage(flx_build *b, int ranks, int pp, int *npy_node)
{
	const flx_spec *s = b->plan->spec;
	flx_st_set *set = NULL;
	flx_pt_set *pt_set = NULL;
	int rc = stage_set(b, pp, &set);

	if (!rc)
		rc = stage_pt_set(b, pp, &pt_set);
	if (!rc && s->pp == 1 && !s->pp_renumber)
		b->st_by_fqn = set;
	for (int tp = 0; tp < s->tp && !rc; tp++) {
		char dname[FLX_NAME_MAX + 1];
		int dir, tdir;

		ranks_dir(tp, pp, dname);
		rc = flx_fs_mkdir(b->fs, ranks, dname, &dir);
		if (!rc)
			rc = flx_fs_mkdir(b->fs, dir, "tensors", &tdir);
		if (rc)
			return flx_build_fail(b, rc, dname,
					      "creating rank directory");
		rc = rank_npy(b, tdir, tp, pp, npy_node);
		if (!rc)
			rc = flx_st_add_file(b->fs, dir, "model.safetensors",
					     b->gen, set, tp, pp);
		if (rc) /* the first error recorded stays */
			return flx_build_fail(b, rc, "model.safetensors",
					      "building file");
		rc = flx_pt_add_file(b->fs, dir, "model.pt", pt_set, tp);
		if (rc)
			return flx_build_fail(b, rc, "model.pt",
					      "building file");
	}
	return rc;
}

static int ranks_size(flx_build *b, void **state, flx_fs_size *sz)
{
	const flx_plan *p = b->plan;
	size_t tp = (size_t)p->spec->tp, ranks = (size_t)p->spec->pp * tp;
	size_t views = 0;

	(void)state;
	for (size_t i = 0; i < p->n; i++) {
		const flx_placement *pl = &p->p[i];
		size_t st = (size_t)(pl->stage_hi - pl->stage_lo + 1);

		views += tp * st;
		sz->names += st * (strlen(pl->src->fqn) + 8);
	}
	/* a .npy file per view (its one segment in its node); in the
	 * safetensors files, a segment per view, two per batch of views and
	 * three more per file; in the torch.save files, two per view, two
	 * per batch and six more per file */
	sz->nodes += views + 1 + 4 * ranks;
	sz->segs += 3 * views + views / 8 + 11 * ranks;
	sz->names += 6 + 50 * ranks;
	return 0;
}

static int ranks_build(flx_build *b, void *state)
{
	const flx_plan *p = b->plan;
	int *npy_node = malloc((p->n ? p->n : 1) * sizeof(*npy_node));
	int ranks, rc = -ENOMEM;

	(void)state;
	if (!npy_node) {
		flx_build_fail(b, rc, dir_name, "");
		goto out;
	}
	rc = flx_fs_mkdir(b->fs, 0, dir_name, &ranks);
	if (rc) {
		flx_build_fail(b, rc, dir_name, "creating directory");
		goto out;
	}
	for (int pp = 0; pp < p->spec->pp && !rc; pp++)
		rc = build_stage(b, ranks, pp, npy_node);
out:
	free(npy_node);
	return rc;
}

const flx_layout flx_layout_ranks = {
    .name = dir_name,
    .size = ranks_size,
    .build = ranks_build,
    .rank_dir = ranks_dir,
};
