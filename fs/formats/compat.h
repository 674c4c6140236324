/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_COMPAT_H
#define FLX_FS_FORMATS_COMPAT_H

/*
 * Which dtypes the files of each format hold: one table, format x dtype,
 * each format's row defined by its writer (safetensors.c, torchsave.c,
 * npy.c, pdparams.c, msckpt.c) with the reader it was checked against
 * (docs/formats/<page>.md).  A tensor of a dtype the common readers of a
 * format cannot all hold is left out of that format's files only, and
 * still served by the others: a file any of its readers opens whole beats
 * one that holds everything and opens in none.  Two kinds:
 *
 *   older[dt]  some reader still in common use (safetensors 0.4.5, torch
 *              1.13) cannot hold dt, newer ones can: left out unless
 *              new_dtypes=1;
 *   never[dt]  the format has no name for dt: always left out;
 *
 * and exclude_dtypes= leaves the dtypes it names out of every file.
 * index.json prints each left-out tensor's reasons ("left_out", one key
 * per format the mount serves: flx_fmt_served()), the mount says them
 * once (flx_fmt_note()), flexfs-inspect flags them.
 *
 * Thread-safety: constant tables and pure functions.
 */

#include "dtype.h"
#include "opt.h"
#include "plan.h"
#include "spec.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum flx_fmt {
	FLX_FMT_SAFETENSORS, /* ranks/tpTT_ppPP/model.safetensors, hf/ */
	FLX_FMT_TORCHSAVE,   /* ranks/tpTT_ppPP/model.pt, megatron/ */
	FLX_FMT_NPY,	     /* ranks/tpTT_ppPP/tensors/ */
	FLX_FMT_PDPARAMS,    /* paddle/ */
	FLX_FMT_MSCKPT,	     /* mindspore/ */
	FLX_FMT_COUNT
} flx_fmt;

/* The formats every mount serves (ranks/, hf/); paddle/ and mindspore/
 * are served for some mounts only (flx_fmt_served()). */
#define FLX_FMT_CORE 3

/* One format's row. */
typedef struct flx_fmt_dtypes {
	const char *name; /* "safetensors": its key in index.json */
	/* why the dtype is left out: by default (NULL: every common reader
	 * holds it), and always (NULL: the format can name it) */
	const char *older[FLX_DT_COUNT];
	const char *never[FLX_DT_COUNT];
} flx_fmt_dtypes;

/* The rows, defined by the writers. */
extern const flx_fmt_dtypes flx_st_dtypes, flx_pt_dtypes, flx_npy_dtypes,
    flx_pd_dtypes, flx_ms_dtypes;

/* The options of this table (-o new_dtypes, -o exclude_dtypes=DT:DT),
 * registered in fs/plugins.c, read from flx_spec.opts by name. */
extern const flx_opt_group flx_fmt_opt_group;

/** Format f's row (f < FLX_FMT_COUNT). */
const flx_fmt_dtypes *flx_fmt_row(flx_fmt f);

/**
 * Why the files of format f leave out a tensor of dtype dt under spec s
 * (its new_dtypes= and exclude_dtypes=, in s->opts): a constant one-line
 * reason, or NULL when they hold it.
 */
const char *flx_fmt_left_out(const flx_spec *s, flx_fmt f, flx_dtype dt);

/**
 * Whether the mount of plan p serves files of format f: the core formats
 * always; pdparams when the source is Paddle's (paddle/); mindspore when
 * asked for (-o mindspore, dst_strategy=) or the source is MindSpore's
 * (mindspore/).  torch.save covers megatron/ too, whose files follow its
 * row.  index.json, the mount's note and flexfs-inspect speak of these.
 */
bool flx_fmt_served(const flx_plan *p, flx_fmt f);

/** Whether a tensor of dtype dt is left out of the files of some format
 * the mount of p serves (flx_fmt_served()), but for exclude_dtypes= (asked
 * for). */
bool flx_fmt_any_left_out(const flx_plan *p, flx_dtype dt);

/**
 * The mount's one line about the tensors of plan p left out of some served
 * format's files but for those exclude_dtypes= names: how many, the first
 * ones with the formats, and the option that keeps them, into buf (len
 * bytes, no newline).  @return 0 and buf, or -ENOENT: none.
 */
int flx_fmt_note(const flx_plan *p, char *buf, size_t len);

#endif
