/* SPDX-License-Identifier: MIT */
/*
 * The sources flx_ckpt_open() knows, in the order they are asked whether
 * they recognise a directory.  Adding a source: its file under resolver/,
 * one declaration and one entry here, one line in CMakeLists.txt.
 */
#include "source.h"

#include <errno.h>
#include <string.h>

extern const flx_source flx_source_megatron;
extern const flx_source flx_source_megatron_zarr;
extern const flx_source flx_source_megatron_legacy;
extern const flx_source flx_source_dcp;
extern const flx_source flx_source_hf;
extern const flx_source flx_source_paddle;
extern const flx_source flx_source_mindspore;
extern const flx_source flx_source_deepspeed;
extern const flx_source flx_source_torchsave;

/* Megatron's torch_dist is a DCP directory with a metadata.json: asked
 * first, so that DCP does not claim it.  Its zarr backend (metadata.json
 * and common.pt, no .metadata) is a variant too, named after it. */
const flx_source *const flx_sources[] = {
    &flx_source_megatron,
    &flx_source_megatron_zarr,
    &flx_source_dcp,
    &flx_source_paddle,
    &flx_source_hf,
    &flx_source_mindspore,
    /* Megatron-LM's legacy per-rank files (mp_rank_TT[_PPP] directories
     * holding model_optim_rng.pt, no metadata of their own): no source
     * above claims such a directory; before torchsave, whose probe would
     * (.pt files); after the plain formats, which "no source recognises
     * it" names first.  Its enter hook is torch_dist's. */
    &flx_source_megatron_legacy,
    &flx_source_deepspeed, /* before torchsave: its files are .pt too */
    /* last: other formats' directories hold .pt/.bin files too */
    &flx_source_torchsave,
    NULL,
};

const char *flx_ckpt_format_name(size_t i)
{
	for (size_t k = 0; flx_sources[k]; k++)
		if (k == i)
			return flx_sources[k]->name;
	return NULL;
}

/* Whether the k-th source's fact name first appears there. */
static bool first_decl(size_t k, const char *name)
{
	for (size_t j = 0; j < k; j++)
		for (size_t i = 0;
		     flx_sources[j]->facts && flx_sources[j]->facts[i]; i++)
			if (!strcmp(flx_sources[j]->facts[i], name))
				return false;
	return true;
}

const char *flx_fact_name(size_t n)
{
	for (size_t k = 0; flx_sources[k]; k++)
		for (size_t i = 0;
		     flx_sources[k]->facts && flx_sources[k]->facts[i]; i++)
			if (first_decl(k, flx_sources[k]->facts[i]) && !n--)
				return flx_sources[k]->facts[i];
	return NULL;
}

bool flx_fact_known(const char *name)
{
	const char *f;

	for (size_t n = 0; (f = flx_fact_name(n)); n++)
		if (!strcmp(f, name))
			return true;
	return false;
}

int flx_ckpt_opt_set(flx_opt_vals *vals, const char *name, const char *value,
		     flx_error *err)
{
	for (size_t k = 0; flx_sources[k]; k++) {
		const flx_opt *o =
		    flx_opt_group_find(flx_sources[k]->opts, name);

		if (o)
			return flx_opt_vals_set(vals, o, value, err);
	}
	return -ENOENT;
}
