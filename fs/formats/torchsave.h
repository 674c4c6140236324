/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_TORCHSAVE_H
#define FLX_FS_FORMATS_TORCHSAVE_H

/*
 * torch.save zip files of a state dict (torch.load gives an OrderedDict of
 * name -> tensor, in set order), laid out as PyTorch's miniz writer lays
 * them out (docs: docs/formats/torch-save.md):
 *
 *   archive/data.pkl      pickle protocol 2 without memo opcodes
 *   archive/byteorder     "little"
 *   archive/data/<k>      the k-th tensor's bytes, k = 0.. in set order
 *   archive/version       "3\n"
 *
 * every record STORED, its data 64-aligned (the "FB" padding field), data
 * descriptors, ZIP64 extra fields past 4 GiB, the central directory, the
 * ZIP64 end record and locator and the end record.  A tensor whose dtype
 * has a storage class is rebuilt by torch._utils._rebuild_tensor_v2 (every
 * torch from 1.6); the others (uint16/32/64, float8) by
 * _rebuild_tensor_v3 on an UntypedStorage, as torch >= 2.1 saves them.
 * A tensor of parts is stored as its parts' bytes (views, raw file ranges),
 * zero runs generated.
 * Literal records carry their real CRC-32; tensor records CRC 0, which
 * torch.load never checks (PyTorch builds miniz without reader CRC
 * checks), so nothing is read from the tensors to build a file.
 *
 * Thread-safety: sets and files are built single-threaded with their
 * tree; once built they are immutable and read by any number of threads.
 */

#include "formats/gen.h"
#include "tree_internal.h"

#include <stddef.h>

/* Bytes of a tensor built of parts: a view's bytes, else (file not NULL)
 * bytes [off, off + len) of a source file verbatim, else zeros zero
 * bytes. */
typedef struct flx_pt_part {
	const flx_view *view;
	uint64_t zeros;
	const flx_file *file;
	uint64_t off, len;
} flx_pt_part;

/* A tensor of its own shape whose bytes are its parts' in order (their
 * sum must be the shape's). */
typedef struct flx_pt_tensor {
	flx_dtype dtype;
	int ndim;
	int64_t shape[FLX_MAX_DIMS];
	size_t nparts;
	const flx_pt_part *parts;
} flx_pt_tensor;

/* One value of a torch.save file: a placement's view for the file's TP
 * rank, else a tensor of parts, else (both NULL) None. */
typedef struct flx_pt_entry {
	const char *name; /* its key in the state dict (borrowed) */
	const flx_placement *pl;
	const flx_pt_tensor *t;
	/* not a value: the state dict so far ends here and the entries
	 * after it fill a new OrderedDict, the value of key name in the
	 * dict that holds them (several state dicts in one file: Megatron's
	 * model0, model1, ...; pre must end with the first one's key) */
	bool next_dict;
} flx_pt_entry;

/*
 * The values of torch.save files, shared by the files that hold the same
 * names in the same order (the TP ranks of one stage; each reads its own
 * views), in state dict order.  The state dict is the file's object, or
 * lies inside one: pre holds the pickle opcodes that come between PROTO
 * and it, post those between it and STOP (a dict of which it is the last
 * value: pre "}(" ... "X\x05model", post "u"); both empty by default.
 */
typedef struct flx_pt_set {
	size_t n;
	flx_pt_entry *e;
	const unsigned char *pre, *post; /* borrowed, must outlive the fs */
	size_t npre, npost;
	int stage, ntp; /* the stage and tp whose views the placements give
			 * (flx_placement_view()); 0, 1 by default */
} flx_pt_set;

/** A set with room for n entries, n set to 0 (the caller appends), no
 * pre or post, owned by fs.  @return 0 and *out, or -ENOMEM. */
int flx_pt_set_new(flx_fs *fs, size_t n, flx_pt_set **out);

/**
 * Add file name to directory dir: the torch.save file of set (borrowed,
 * must outlive fs, with the tensors and views of its entries), holding
 * the views of TP rank tp (tp < 0: the whole tensors) of its placements. Builds
 * and measures every piece now (the pickle once more, for its CRC).
 * @return 0, or -ENOMEM, -ENOTDIR, -EINVAL (a name that is not UTF-8,
 *         which a pickle cannot carry), -EIO (the pieces do not add up to
 *         the computed layout: a bug, never served).
 */
int flx_pt_add_file(flx_fs *fs, int dir, const char *name,
		    const flx_pt_set *set, int tp);

#endif
