/* SPDX-License-Identifier: MIT */
/*
 * The default layouts, in the order they are built: that order numbers
 * the inodes, so a new layout goes at the end.
 */
#include "layout.h"

extern const flx_layout flx_layout_ranks, flx_layout_hf, flx_layout_objects,
    flx_layout_index;
extern const flx_layout flx_layout_paddle, flx_layout_megatron;
extern const flx_layout flx_layout_mindspore;

const flx_layout *const flx_layouts[] = {
    &flx_layout_ranks,	   &flx_layout_hf,     &flx_layout_objects,
    &flx_layout_index,	   &flx_layout_paddle, &flx_layout_megatron,
    &flx_layout_mindspore,
};

const size_t flx_nlayouts = sizeof(flx_layouts) / sizeof(flx_layouts[0]);
