/* SPDX-License-Identifier: MIT */
#ifndef FLX_TOOLS_INSPECT_SVG_H
#define FLX_TOOLS_INSPECT_SVG_H

/*
 * flexfs-inspect --svg: a picture of a plan, an SVG that a browser shows.
 * The source's data files are boxes on the left, the target ranks
 * (tpTT_ppPP) boxes on the right, each as tall as the bytes it gives or
 * serves; a band joins a file to a rank for each tensor group, as wide as
 * the bytes the rank reads from that file for the group's tensors (a rank
 * holding a replicated tensor reads it too).  A tensor's group is its
 * target-independent name with every all-digit component (a layer or
 * expert number) replaced by '*'.  Every element carries a <title> with
 * exact byte counts; bands carry data-file, data-rank, data-group and
 * data-bytes attributes.  Names are escaped (flx_escape(), then XML).
 *
 * Thread-safety: reads the plan only; one call per stream.
 */

#include "error.h"
#include "plan.h"

#include <stdio.h>

/**
 * Write the picture of plan p to f (borrowed, left open; name names it in
 * messages).
 * @return 0, or -errno with err (-EFBIG: byte sums overflow; -ENOMEM;
 *         -EIO: a write to f failed).
 */
int flx_inspect_svg(const flx_plan *p, FILE *f, const char *name,
		    flx_error *err);

#endif
