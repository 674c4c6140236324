/* SPDX-License-Identifier: MIT */
#include "stack.h"

#include "formats/compat.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* The layout's tree, estimated from the ranks and the tensor slices it
 * will hold, must fit FLX_TREE_MAX_BYTES: tp=4096,pp=1024 made 4 M rank
 * directories (3.3 GB), tp=4096 over 200k tensors ran out of memory. */
static int check_tree_cost(const char *source, const flx_ckpt *c,
			   const flx_spec *spec, flx_error *err)
{
	uint64_t ranks = (uint64_t)spec->tp * (uint64_t)spec->pp;
	uint64_t slices = (uint64_t)c->ntensors * (uint64_t)spec->tp;
	uint64_t bytes =
	    ranks * FLX_TREE_RANK_BYTES + slices * FLX_TREE_SLICE_BYTES;

	if (bytes <= FLX_TREE_MAX_BYTES)
		return 0;
	return flx_error_set(
	    err, -E2BIG, source, "tp",
	    "tp=%d x pp=%d over %zu tensors: %llu rank "
	    "directories and %llu tensor slices would take "
	    "about %.1f GiB of metadata, past the %llu GiB "
	    "bound",
	    spec->tp, spec->pp, c->ntensors, (unsigned long long)ranks,
	    (unsigned long long)slices, (double)bytes / (1 << 30),
	    (unsigned long long)(FLX_TREE_MAX_BYTES >> 30));
}

int flx_stack_build(const char *source, const flx_ckpt_opts *o,
		    const flx_spec *spec, bool all, flx_stack *s,
		    flx_error *err)
{
	flx_ckpt_opts oo = o ? *o : (flx_ckpt_opts){0};
	flx_error ierr;
	int rc, irc;

	memset(s, 0, sizeof(*s));
	oo.defer_items = true;
	if (spec->nrules && !oo.split_rule) {
		oo.split_rule = flx_spec_split_rule;
		oo.split_ctx = spec;
	}
	rc = flx_ckpt_open_with(source, &oo, &s->ckpt, err);
	if (!rc && flx_aoa_of_spec(spec)) {
		flx_aoa_opts ao = flx_aoa_opts_from(&spec->opts, spec->tp);

		rc = flx_aoa_compile(flx_aoa_of_spec(spec), s->ckpt, &ao,
				     &s->aoa, err);
	}
	if (!rc)
		rc = flx_xform_apply(s->aoa ? flx_aoa_prog_xform(s->aoa)
					    : spec->xform,
				     s->ckpt, &s->xi, err);
	if (!rc)
		rc =
		    flx_filter_apply(spec, flx_xindex_ckpt(s->xi), &s->fi, err);
	if (!rc)
		rc = check_tree_cost(source, flx_stack_ckpt(s), spec, err);
	if (!rc)
		rc = (all ? flx_plan_build_all : flx_plan_build)(
		    flx_stack_ckpt(s), spec, &s->plan, err);
	if (!rc)
		rc = flx_fs_build(flx_stack_ckpt(s), s->plan, &s->fs, err);
	if (s->ckpt) {
		/* a bad item first, as when the items were read first */
		flx_error_init(&ierr);
		irc = flx_ckpt_finish(s->ckpt, &ierr);
		if (irc) {
			if (err)
				*err = ierr;
			rc = irc;
		} else {
			if (s->xi)
				flx_xindex_finish(s->xi);
			flx_plan_finish(s->plan);
		}
	}
	if (rc) {
		if (err && !err->code)
			flx_error_set(err, rc, source, NULL, "%s",
				      strerror(-rc));
		flx_stack_free(s);
	}
	return rc;
}

int flx_stack_note(const flx_stack *s, size_t i, char *buf, size_t len)
{
	if (s->ckpt->skipped_links) {
		if (i == 0) {
			snprintf(buf, len,
				 "%zu symlinked file(s) not served (leading "
				 "outside the directory, dangling or not to a "
				 "file; -o follow_symlinks follows them "
				 "outside): %s",
				 s->ckpt->nskipped_links,
				 s->ckpt->skipped_links);
			return 0;
		}
		i--;
	}
	if (flx_aoa_prog_note(s->aoa, i, buf, len) == 0)
		return 0;
	i -= flx_aoa_prog_nnotes(s->aoa);
	for (size_t k = 0;; k++) {
		if (flx_plan_note(s->plan, k, buf, len) == 0) {
			if (k == i)
				return 0;
			continue;
		}
		/* k plan notes; then the tensors some formats leave out */
		return i == k ? flx_fmt_note(s->plan, buf, len) : -ENOENT;
	}
}

void flx_stack_free(flx_stack *s)
{
	flx_fs_free(s->fs);
	flx_plan_free(s->plan);
	flx_findex_free(s->fi);
	flx_xindex_free(s->xi);
	flx_aoa_prog_free(s->aoa);
	flx_ckpt_close(s->ckpt);
	memset(s, 0, sizeof(*s));
}
