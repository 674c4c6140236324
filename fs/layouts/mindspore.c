/* SPDX-License-Identifier: MIT */
/*
 * mindspore/: the per-rank checkpoint files MindSpore's load_checkpoint
 * reads, named as transform_checkpoints writes them with the docs' prefix
 * "checkpoint_" (docs/formats/mindspore.md#file-names):
 *
 *   mindspore/rank_N/checkpoint_N.ckpt
 *
 * present when asked for (-o mindspore, -o dst_strategy=FILE) or when the
 * source is MindSpore's.  Which parameters a rank holds, and which box of
 * each, is the target's decision:
 *
 *   tp=/pp= (the plan)   rank N = stage * tp + tp rank (MindSpore's global
 *                        rank, stage-major); the placements of its stage
 *                        under their names there, each its TP rank's box
 *   dst_strategy=FILE    reshard/mindspore/mstarget.h: the strategy's layouts
 *
 * Each file is a .ckpt of those (tag, box) in that order
 * (fs/formats/msckpt.h).
 */
#include "layout.h"

#include "formats/compat.h"
#include "formats/msckpt.h"
#include "mstarget.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The layout's directory under the root. */
static const char dir_name[] = "mindspore";

/* "rank_N" / "checkpoint_N.ckpt" */
static void rank_names(int64_t r, char *dir, char *file)
{
	memcpy(dir, "rank_", 5);
	dir[5 + flx_fmt_int(dir + 5, r, 1)] = '\0';
	memcpy(file, "checkpoint_", 11);
	memcpy(file + 11 + flx_fmt_int(file + 11, r, 1), ".ckpt", 6);
}

static bool on_stage(const flx_placement *pl, int pp)
{
	return pp >= pl->stage_lo && pp <= pl->stage_hi;
}

/* asked for, or a MindSpore source (formats/compat.h decides it once, for
 * index.json and the mount's note too) */
static bool wanted(const flx_build *b)
{
	return flx_fmt_served(b->plan, FLX_FMT_MSCKPT);
}

/* Whether the .ckpt files hold placement i: a dtype load_checkpoint has
 * no tensor_type for is left out of them (formats/compat.h), as are those
 * exclude_dtypes= names. */
static bool holds(const flx_plan *p, size_t i)
{
	return !flx_fmt_left_out(p->spec, FLX_FMT_MSCKPT, p->p[i].src->dtype);
}

/* The parameters of rank r under the plan, into fs. */
static int plan_params(flx_build *b, int64_t r, flx_ms_param **out, size_t *n)
{
	const flx_plan *p = b->plan;
	int ntp = p->spec->tp, tp = (int)(r % ntp), pp = (int)(r / ntp);
	flx_ms_param *e;

	*n = 0;
	for (size_t i = 0; i < p->n; i++)
		*n += on_stage(&p->p[i], pp) && holds(p, i);
	e = flx_fs_alloc(b->fs, *n * sizeof(*e) + 1);
	if (!e)
		return -ENOMEM;
	*n = 0;
	for (size_t i = 0; i < p->n; i++) {
		const flx_placement *pl = &p->p[i];

		if (on_stage(pl, pp) && holds(p, i))
			e[(*n)++] =
			    (flx_ms_param){flx_placement_name(pl, pp),
					   flx_placement_view(pl, pp, tp, ntp)};
	}
	*out = e;
	return 0;
}

/* The views of every tensor on every rank under strategy m: v[i * nranks
 * + r] for placement i, NULL where rank r does not hold it; one view per
 * distinct box, owned by the fs; the whole tensor is the plan's. */
static int mst_views(flx_build *b, const flx_mst *m, const flx_view ***out)
{
	const flx_plan *p = b->plan;
	int64_t nr = flx_mst_nranks(m);
	const flx_view **v = calloc(p->n * (size_t)nr + 1, sizeof(*v));
	int rc = v ? 0 : -ENOMEM;

	for (size_t i = 0; !rc && i < p->n; i++) {
		const flx_tensor *t = p->p[i].src;
		const flx_view **row = v + i * (size_t)nr;
		size_t bytes = (size_t)t->ndim * sizeof(int64_t);

		for (int64_t r = 0; !rc && r < nr; r++) {
			flx_box box;
			flx_view *nv;

			if (!flx_mst_box(m, t, r, &box))
				continue;
			/* a replica of an earlier rank's box */
			for (int64_t q = 0; q < r && !row[r]; q++)
				if (row[q] &&
				    !memcmp(flx_view_box(row[q])->off, box.off,
					    bytes) &&
				    !memcmp(flx_view_box(row[q])->size,
					    box.size, bytes))
					row[r] = row[q];
			if (row[r])
				continue;
			if (!memcmp(flx_view_box(p->p[i].whole)->size, box.size,
				    bytes)) {
				row[r] = p->p[i].whole;
				continue;
			}
			rc = flx_view_new(b->plan->ckpt, t, &box, &nv, b->err);
			if (!rc)
				rc = flx_fs_own_view(b->fs, nv);
			if (!rc)
				row[r] = nv;
		}
	}
	if (rc == -ENOMEM) /* flx_view_new()'s other errors fill err */
		flx_build_fail(b, rc, dir_name, "");
	if (rc) {
		free(v);
		v = NULL;
	}
	*out = v;
	return rc;
}

/* The parameters of rank r under the strategy's views v, into fs. */
static int mst_params(flx_build *b, const flx_view *const *v, int64_t nr,
		      int64_t r, flx_ms_param **out, size_t *n)
{
	const flx_plan *p = b->plan;
	flx_ms_param *e = flx_fs_alloc(b->fs, p->n * sizeof(*e) + 1);

	if (!e)
		return -ENOMEM;
	*n = 0;
	for (size_t i = 0; i < p->n; i++)
		if (v[i * (size_t)nr + r] && holds(p, i))
			e[(*n)++] = (flx_ms_param){p->p[i].src->fqn,
						   v[i * (size_t)nr + r]};
	*out = e;
	return 0;
}

/* The one line for a parameter of file dname/fname that cannot be
 * written (flx_ms_check()'s rc). */
static int check_fail(flx_build *b, int rc, const char *dname,
		      const char *fname, const flx_ms_param *p)
{
	char path[3 * (FLX_NAME_MAX + 1)];

	snprintf(path, sizeof(path), "%s/%s/%s", dir_name, dname, fname);
	if (rc == -EINVAL)
		return flx_error_set(b->err, rc, path, p->tag,
				     "name not valid UTF-8: cannot be a "
				     "protobuf string");
	return flx_error_set(b->err, rc, path, p->tag,
			     "dtype %s: no MindSpore tensor_type "
			     "load_checkpoint reads",
			     flx_dtype_name(flx_view_tensor(p->v)->dtype));
}

static int ms_size(flx_build *b, void **state, flx_fs_size *sz)
{
	size_t ranks = (size_t)b->plan->spec->tp * (size_t)b->plan->spec->pp;

	(void)state;
	if (!wanted(b))
		return 0;
	sz->nodes += 1 + 2 * ranks;
	sz->segs += 2 * ranks * b->plan->n;
	sz->names += sizeof(dir_name) + ranks * 48;
	return 0;
}

/* The rank files, ranks of them: the plan's (v NULL) or the strategy's
 * views v. */
static int rank_files(flx_build *b, int dir, int64_t ranks,
		      const flx_view *const *v)
{
	char dname[FLX_NAME_MAX + 1], fname[FLX_NAME_MAX + 1];
	int rc = 0;

	for (int64_t r = 0; r < ranks; r++) {
		flx_ms_param *e;
		size_t n, bad;
		int rdir;

		rank_names(r, dname, fname);
		rc = v ? mst_params(b, v, ranks, r, &e, &n)
		       : plan_params(b, r, &e, &n);
		if (rc)
			return flx_build_fail(b, rc, dname, "");
		rc = flx_ms_check(e, n, &bad);
		if (rc)
			return check_fail(b, rc, dname, fname, &e[bad]);
		rc = flx_fs_mkdir(b->fs, dir, dname, &rdir);
		if (!rc)
			rc = flx_ms_add_file(b->fs, b->plan->ckpt, rdir, fname,
					     e, n, FLX_MS_CHUNK);
		if (rc)
			return flx_build_fail(b, rc, fname, "building file");
	}
	return rc;
}

static int ms_build(flx_build *b, void *state)
{
	const char *path = NULL;
	flx_mst *m = NULL;
	const flx_view **v = NULL;
	int dir, rc;

	(void)state;
	if (!wanted(b))
		return 0;
	flx_opt_text(&b->plan->spec->opts, "dst_strategy", &path);
	rc = flx_fs_mkdir(b->fs, 0, dir_name, &dir);
	if (rc)
		return flx_build_fail(b, rc, dir_name, "creating directory");
	if (!path)
		return rank_files(
		    b, dir, (int64_t)b->plan->spec->tp * b->plan->spec->pp,
		    NULL);
	rc = flx_mst_open(b->plan->ckpt, path, &m, b->err);
	if (!rc)
		rc = mst_views(b, m, &v);
	if (!rc)
		rc = rank_files(b, dir, flx_mst_nranks(m), v);
	free(v);
	flx_mst_free(m);
	return rc;
}

static int check_strategy(const flx_opt *o, const char *value, uint64_t *num,
			  flx_error *err)
{
	(void)num;
	if (!value || !*value)
		return flx_error_set(err, -EINVAL, NULL, o->name,
				     "expected a MindSpore strategy file");
	return 0;
}

static const flx_opt ms_opts[] = {
    {.name = "mindspore",
     .type = FLX_OPT_FLAG,
     .help = "mindspore/rank_N/checkpoint_N.ckpt: the tp x pp ranks as "
	     "MindSpore .ckpt files"},
    {.name = "dst_strategy",
     .type = FLX_OPT_TEXT,
     .metavar = "FILE",
     .help = "their layout from a MindSpore strategy file instead "
	     "(protobuf, or JSON if FILE ends in .json)",
     .check = check_strategy},
};

static const flx_opt_group ms_group = {
    .owner = "mindspore",
    .title = "mindspore/ layout (MindSpore per-rank .ckpt files)",
    .opts = ms_opts,
    .nopts = FLX_OPT_COUNT(ms_opts),
};

const flx_layout flx_layout_mindspore = {
    .name = dir_name,
    .size = ms_size,
    .build = ms_build,
    .opts = &ms_group,
};
