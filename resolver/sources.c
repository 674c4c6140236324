/* SPDX-License-Identifier: MIT */
/*
 * The sources flx_ckpt_open() knows, in the order they are asked whether
 * they recognise a directory.  Adding a source: its file under resolver/,
 * one declaration and one entry here, one line in CMakeLists.txt.
 */
#include "source.h"

extern const flx_source flx_source_megatron;
extern const flx_source flx_source_megatron_zarr;
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
