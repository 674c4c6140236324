/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_MSCKPT_H
#define FLX_FS_FORMATS_MSCKPT_H

/*
 * MindSpore's .ckpt (docs/formats/mindspore.md#ckpt-file-layout,
 * docs/formats/mindspore.md#large-tensors): a protobuf Checkpoint message,
 * written as MindSpore >= 2.3 writes it, a run of records
 *
 *   0x0A len(Value)  Value = 0x0A len(tag) tag
 *                            0x12 len(TensorProto) TensorProto
 *   TensorProto = (0x08 dim)* 0x12 len(type) type 0x1A len(content) content
 *
 * one per parameter, dims unpacked (none for a 0-d tensor), tensor_type
 * the name load_checkpoint maps ("Float32", "BFloat16" at 2 bytes per
 * element), content the rank's box in C order.  A parameter of more than
 * max bytes is several consecutive records with its tag and full dims,
 * each content a consecutive C-order piece of at most max bytes where the
 * shape allows it (whole rows of the outermost axis that can be cut), as
 * MindSpore's numpy path cuts them; load_checkpoint joins consecutive
 * records with one tag (1.5).  A zero-element parameter has no record, as
 * MindSpore >= 2.3 writes it (1.4); the loader keeps the network's value
 * for a parameter it does not find.  Every
 * length is computed at mount, so the file's size is exact; the content
 * bytes are the views', read on demand.
 *
 * Thread-safety: files are built single-threaded with their tree; the
 * pure functions are reentrant.
 */

#include "formats/gen.h"
#include "tree_internal.h"

#include <stddef.h>
#include <stdint.h>

/* MindSpore's record size for large tensors (1.5): 512 MiB. */
#define FLX_MS_CHUNK (512ull << 20)

/* The longest varint. */
#define FLX_MS_VARINT_MAX 10

/* One parameter of a .ckpt file. */
typedef struct flx_ms_param {
	const char *tag;   /* its name (borrowed) */
	const flx_view *v; /* its box on the rank (borrowed) */
} flx_ms_param;

/** The protobuf varint of v into out.  @return its length, 1 to 10. */
size_t flx_ms_varint(uint64_t v, unsigned char out[FLX_MS_VARINT_MAX]);

/** MindSpore's tensor_type of dt ("Float32"), or NULL where
 * load_checkpoint reads none (complex, float8). */
const char *flx_ms_type(flx_dtype dt);

/**
 * The consecutive C-order pieces of box (ndim axes, esize > 0 bytes per
 * element, max >= esize) that become the records of one parameter: box
 * itself when it holds at most max bytes (or none); otherwise runs of
 * whole slices of the outermost axis of size above 1 (all axes before it
 * 1 long), each of at most max bytes, or, where one such slice is larger,
 * each slice cut the same way.  out may be NULL (count only); otherwise
 * it has room for cap boxes.
 * @return 0 and *n (the count, also when out is NULL or cap too small:
 *         then only cap are written and -ENOSPC is returned).
 */
int flx_ms_cuts(const flx_box *box, int ndim, uint64_t esize, uint64_t max,
		flx_box *out, size_t cap, size_t *n);

/**
 * Whether p[0, n) can be written: every tag UTF-8 and every dtype one
 * MindSpore loads.  On failure *bad is the index of the parameter.
 * @return 0, -EINVAL (not UTF-8) or -ENOTSUP (dtype).
 */
int flx_ms_check(const flx_ms_param *p, size_t n, size_t *bad);

/**
 * Add file name to directory dir: the .ckpt of p[0, n) (checked with
 * flx_ms_check(); borrowed, must outlive fs), in that order but for
 * zero-element tensors (no record), records of
 * at most max content bytes (FLX_MS_CHUNK; smaller in tests).  The views
 * of pieces are made over ckpt and owned by fs.
 * @return 0, or -ENOMEM, -ENOTDIR, -EFBIG, or flx_view_new()'s error.
 */
int flx_ms_add_file(flx_fs *fs, const flx_ckpt *ckpt, int dir, const char *name,
		    const flx_ms_param *p, size_t n, uint64_t max);

#endif
