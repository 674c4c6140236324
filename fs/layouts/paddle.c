/* SPDX-License-Identifier: MIT */
/*
 * paddle/: a Paddle checkpoint (flx_ckpt.paddle) as PaddleNLP's per-rank
 * files (docs/formats/paddle.md#paddlenlp-per-rank-files),
 *
 *   paddle/model_state<sfx>.pdparams   the rank's model weights,
 *                                      {key: ndarray} + the name table
 *   paddle/optimizer<sfx>.pdopt        its optimizer states, when the
 *                                      checkpoint has any
 *
 * sfx is PaddleNLP's weight_name_suffix: "" at tp = pp = 1, else "." and
 * the parts "tpXX", "ppYY" (two digits at least) of the degrees above 1,
 * joined by "_": model_state.pdparams, model_state.tp01.pdparams,
 * model_state.tp00_pp01.pdparams.
 *
 * A key ending in one of Paddle's optimizer state names (".moment1_0",
 * ".moment2_0", ".beta1_pow_acc_0", ".beta2_pow_acc_0", ".w_0", the
 * suffixes of aoa_engine.OPTIMIZER_STATE_NAME) is an optimizer state; every
 * other tensor is a weight, so each tensor of a rank is in one of its two
 * files.  The optimizer file holds the accumulators under their Paddle
 * names, by state (moment1, moment2, beta1, beta2) and within one in plan
 * order; when the checkpoint has master weights (".w_0"), a
 * "master_weights" dict maps each parameter's Paddle name to its fp32
 * copy (keyed by the master weight's name less "_fp32_master_0").  Names
 * come from the checkpoint's name table; a key without one is its own
 * name.
 */
#include "layout.h"

#include "formats/compat.h"
#include "formats/pdparams.h"
#include "paddle/paddle.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The layout's directory under the root. */
static const char dir_name[] = "paddle";

/* Optimizer states in the order of the accumulators in the file; the
 * master weight last (it goes to "master_weights"). */
static const char *const opt_states[] = {
    "moment1_0", "moment2_0", "beta1_pow_acc_0", "beta2_pow_acc_0", "w_0",
};
#define N_ACC	      4 /* opt_states[0, N_ACC): accumulators */
#define N_STATES      (sizeof(opt_states) / sizeof(opt_states[0]))
#define MASTER_SUFFIX "_fp32_master_0"

/* Which optimizer state key is (N_STATES: a weight). */
static size_t opt_state(const char *key)
{
	size_t n = strlen(key);

	for (size_t s = 0; s < N_STATES; s++) {
		size_t l = strlen(opt_states[s]);

		if (n > l + 1 && key[n - l - 1] == '.' &&
		    !strcmp(key + n - l, opt_states[s]))
			return s;
	}
	return N_STATES;
}

/* "model_state" + sfx + ext for rank (tp, pp) of degrees (ntp, npp). */
static int paddle_file(const char *base, const char *ext, int ntp, int npp,
		       int tp, int pp, char *out)
{
	char *o = out;
	size_t bl = strlen(base), el = strlen(ext);

	if (bl + el + 12 > FLX_NAME_MAX)
		return -ENAMETOOLONG;
	memcpy(o, base, bl);
	o += bl;
	if (ntp > 1 || npp > 1)
		*o++ = '.';
	if (ntp > 1) {
		memcpy(o, "tp", 2);
		o += 2 + flx_fmt_int(o + 2, tp, 2);
	}
	if (ntp > 1 && npp > 1)
		*o++ = '_';
	if (npp > 1) {
		memcpy(o, "pp", 2);
		o += 2 + flx_fmt_int(o + 2, pp, 2);
	}
	memcpy(o, ext, el + 1);
	return 0;
}

static int cmp_pair(const void *k, const void *p)
{
	return strcmp(k, ((const flx_name_pair *)p)->key);
}

/* Paddle's name of the tensor under key (key itself when unnamed). */
static const char *static_name(const flx_paddle *pd, const char *key)
{
	const flx_name_pair *p = NULL;

	/* no table (names NULL): bsearch() must not be given a NULL array */
	if (pd->nnames)
		p = bsearch(key, pd->names, pd->nnames, sizeof(*pd->names),
			    cmp_pair);
	return p ? p->name : key;
}

/* The key of a master weight in "master_weights": its parameter's Paddle
 * name, its own name less "_fp32_master_0" (all of it without that end);
 * in fs, or NULL (no memory). */
static const char *master_key(flx_build *b, const char *name)
{
	size_t n = strlen(name), l = sizeof(MASTER_SUFFIX) - 1;
	char *out;

	if (n > l && !strcmp(name + n - l, MASTER_SUFFIX))
		n -= l;
	out = flx_fs_alloc(b->fs, n + 1);
	if (out) {
		memcpy(out, name, n);
		out[n] = '\0';
	}
	return out;
}

/* Whether the files of stage pp hold pl: on the stage, and of a dtype
 * the .pdparams files hold (formats/compat.h: all but those
 * exclude_dtypes= names). */
static bool on_stage_held(const flx_plan *p, const flx_placement *pl, int pp)
{
	return pp >= pl->stage_lo && pp <= pl->stage_hi &&
	       !flx_fmt_left_out(p->spec, FLX_FMT_PDPARAMS, pl->src->dtype);
}

/* Whether the checkpoint has optimizer states, and master weights. */
static void opt_kinds(const flx_plan *p, bool *opt, bool *master)
{
	*opt = *master = false;
	for (size_t i = 0; i < p->n; i++) {
		size_t s = opt_state(p->p[i].src->fqn);

		*opt |= s < N_STATES;
		*master |= s == N_STATES - 1;
	}
}

/* The weights of stage pp, in plan order, under their names there. */
static int model_set(flx_build *b, int pp, flx_pd_set **out)
{
	const flx_plan *p = b->plan;
	size_t n = 0;
	int rc;

	for (size_t i = 0; i < p->n; i++)
		n += on_stage_held(p, &p->p[i], pp) &&
		     opt_state(p->p[i].src->fqn) == N_STATES;
	rc = flx_pd_set_new(b->fs, n, out);
	if (rc)
		return rc;
	(*out)->stage = pp;
	(*out)->ntp = p->spec->tp;
	for (size_t i = 0; i < p->n; i++) {
		const flx_placement *pl = &p->p[i];

		if (on_stage_held(p, pl, pp) &&
		    opt_state(pl->src->fqn) == N_STATES)
			(*out)->e[(*out)->n++] = (flx_pd_entry){
			    .key = flx_placement_name(pl, pp),
			    .name = static_name(flx_paddle_of(b->ckpt),
						pl->src->fqn),
			    .pl = pl};
	}
	(*out)->ntop = (*out)->n;
	return 0;
}

/* The optimizer states of stage pp: accumulators by state, then (master)
 * the master weights. */
static int opt_set(flx_build *b, int pp, bool master, flx_pd_set **out)
{
	const flx_plan *p = b->plan;
	size_t n = 0;
	int rc;

	for (size_t i = 0; i < p->n; i++)
		n += on_stage_held(p, &p->p[i], pp) &&
		     opt_state(p->p[i].src->fqn) < N_STATES;
	rc = flx_pd_set_new(b->fs, n, out);
	if (rc)
		return rc;
	(*out)->stage = pp;
	(*out)->ntp = p->spec->tp;
	for (size_t s = 0; s < N_STATES; s++) {
		if (s == N_ACC)
			(*out)->ntop = (*out)->n;
		for (size_t i = 0; i < p->n; i++) {
			const flx_placement *pl = &p->p[i];
			const char *name, *key;

			if (!on_stage_held(p, pl, pp) ||
			    opt_state(pl->src->fqn) != s)
				continue;
			name =
			    static_name(flx_paddle_of(b->ckpt), pl->src->fqn);
			key = s == N_ACC ? master_key(b, name) : name;
			if (!key)
				return -ENOMEM;
			(*out)->e[(*out)->n++] =
			    (flx_pd_entry){.key = key, .name = name, .pl = pl};
		}
	}
	(*out)->master = master;
	return 0;
}

/* The files of set for every TP rank of stage pp. */
static int add_files(flx_build *b, int dir, const char *base, const char *ext,
		     const flx_pd_set *set, int pp)
{
	const flx_spec *s = b->plan->spec;
	char fname[FLX_NAME_MAX + 1];
	const char *bad = NULL;
	int rc;

	paddle_file(base, ext, s->tp, s->pp, 0, pp, fname);
	rc = flx_pd_check(set, &bad);
	if (rc == -EEXIST || rc == -EINVAL)
		return flx_error_set(
		    b->err, rc, NULL, bad, "%s/%s: %s", dir_name, fname,
		    rc == -EEXIST ? "two tensors under this key in "
				    "one dict"
				  : "not valid UTF-8: cannot be "
				    "pickled");
	for (int tp = 0; !rc && tp < s->tp; tp++) {
		paddle_file(base, ext, s->tp, s->pp, tp, pp, fname);
		rc = flx_pd_add_file(b->fs, dir, fname, set, tp);
	}
	return rc ? flx_build_fail(b, rc, fname, "building file") : 0;
}

static int paddle_size(flx_build *b, void **state, flx_fs_size *sz)
{
	const flx_plan *p = b->plan;
	size_t ranks = (size_t)p->spec->tp * (size_t)p->spec->pp, views = 0;

	(void)state;
	if (!flx_paddle_of(b->ckpt))
		return 0;
	for (size_t i = 0; i < p->n; i++)
		views += (size_t)p->spec->tp *
			 (size_t)(p->p[i].stage_hi - p->p[i].stage_lo + 1);
	/* two files per rank; two segments per view, and per file a head,
	 * a close, the name table's batches and an end */
	sz->nodes += 1 + 2 * ranks;
	sz->segs += 2 * views + 2 * views / FLX_GEN_BATCH + 8 * ranks;
	sz->names += sizeof(dir_name) + 2 * ranks * 40;
	return 0;
}

static int paddle_build(flx_build *b, void *state)
{
	const flx_plan *p = b->plan;
	bool opt, master;
	int dir, rc;

	(void)state;
	if (!flx_paddle_of(b->ckpt))
		return 0;
	opt_kinds(p, &opt, &master);
	rc = flx_fs_mkdir(b->fs, 0, dir_name, &dir);
	if (rc)
		return flx_build_fail(b, rc, dir_name, "creating directory");
	for (int pp = 0; pp < p->spec->pp; pp++) {
		flx_pd_set *set;

		rc = model_set(b, pp, &set);
		if (rc)
			return flx_build_fail(b, rc, dir_name, "");
		rc = add_files(b, dir, "model_state", ".pdparams", set, pp);
		if (rc)
			return rc;
		if (!opt)
			continue;
		rc = opt_set(b, pp, master, &set);
		if (rc)
			return flx_build_fail(b, rc, dir_name, "");
		rc = add_files(b, dir, "optimizer", ".pdopt", set, pp);
		if (rc)
			return rc;
	}
	return rc;
}

const flx_layout flx_layout_paddle = {
    .name = dir_name,
    .size = paddle_size,
    .build = paddle_build,
};
