/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_FILTER_H
#define FLX_RESHARD_FILTER_H

/*
 * Filters and names, between the transform stage and placement: which
 * tensors and objects a mount serves (include= / exclude= globs of the
 * spec, matched with fnmatch() on the names as the index has them) and the
 * prefix cut from their names (strip_prefix=).  The filtered index is a
 * flx_ckpt like the one it filters, holding copies of the kept tensors'
 * and objects' records whose names point into the filtered index's own
 * names or into the originals' (a suffix); everything else (files, chunks,
 * the source's common state) is borrowed from the index it filters, which
 * must outlive it.  With no filter and no prefix, the filtered index is
 * the index itself: no copy.
 * Thread-safety: flx_filter_apply() reads its inputs only; the filtered
 * index is immutable and may be read by any number of threads.
 */

#include "ckpt.h"
#include "error.h"
#include "spec.h"

typedef struct flx_findex flx_findex;

/**
 * The index src as spec's include=, exclude= and strip_prefix= give it.
 * Fails (-EINVAL, err naming the option) when nothing passes the filters,
 * or when cutting the prefix gives two tensors or objects one name.
 * @return 0 and *out (owned; flx_findex_free()), or -errno with err.
 */
int flx_filter_apply(const flx_spec *spec, const flx_ckpt *src,
		     flx_findex **out, flx_error *err);

/** The filtered index (src itself when nothing is filtered), valid until
 * flx_findex_free(). */
const flx_ckpt *flx_findex_ckpt(const flx_findex *fi);

/** Free the filtered index (not what it borrows); NULL is fine. */
void flx_findex_free(flx_findex *fi);

#endif
