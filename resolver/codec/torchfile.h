/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_TORCHFILE_H
#define FLX_RESOLVER_TORCHFILE_H

/*
 * A whole torch.save file, read in place: the object pickle decoded by the
 * inert pickle VM (pickle.h: nothing is executed, every global stays an
 * inert reference) and each storage located by file offset.  No tensor
 * byte is read.  Two layouts (docs/formats/torch-save-source.md):
 *
 *  - zip (torch >= 1.6, torch.serialization._save): STORED records
 *    "<prefix>/data.pkl" (the object pickle), "<prefix>/data/<key>" (one
 *    storage's raw bytes each), "<prefix>/byteorder" (absent before torch
 *    2.1: little-endian), "<prefix>/version";
 *  - legacy (torch.serialization._legacy_save, _use_new_zipfile_
 *    serialization=False): consecutive pickles of the magic number
 *    0x1950a86a20f9469cfc6c, the protocol version 1001, the sys_info dict
 *    (little_endian True), the object, the sorted list of storage keys;
 *    then per key, in that order, an 8-byte little-endian element count and
 *    the storage's bytes.
 *
 * A tensor inside the object tree is an OBJ node
 * torch._utils._rebuild_tensor_v2/_v3(...) (torchpkl.h), possibly wrapped
 * in torch._utils._rebuild_parameter[_with_state](tensor, ...) (an
 * nn.Parameter).  flx_torchfile_resolve() resolves one to its dtype, shape,
 * strides, storage offset and where its storage's element 0 lies in the
 * file.
 *
 * Bounds: the file size comes from the reader; the object pickle is read
 * through a bounded window with the pickle VM's limits; at most
 * FLX_TORCHFILE_MAX_STORAGES storages (zip records or legacy keys); every
 * storage lies inside the file (record inside the archive, legacy payload
 * before EOF) and is at least as long as every tensor viewing it needs.
 * Refused: a big-endian byteorder or sys_info, a legacy storage key no
 * tensor names (its element size would be a guess), two tensors naming
 * one storage with storage classes of different element sizes (legacy),
 * a legacy storage-view persistent id (6th field not None).
 *
 * Thread-safety: an flx_torchfile is immutable after open; any number of
 * threads may call the const functions on it.  The reader is used only
 * during flx_torchfile_open().
 */

#include "error.h"
#include "pickle.h"
#include "reader.h"
#include "torchpkl.h"

#include <stdbool.h>
#include <stdint.h>

#define FLX_TORCHFILE_MAX_STORAGES (1u << 20)

typedef enum flx_torchfile_kind {
	FLX_TORCHFILE_ZIP = 1,
	FLX_TORCHFILE_LEGACY = 2,
} flx_torchfile_kind;

typedef struct flx_torchfile flx_torchfile;

/* One storage: where its bytes lie in the reader's window. */
typedef struct flx_torch_storage {
	const char *key; /* record name under data/ (zip), or legacy key */
	uint64_t off;	 /* offset of its first byte in the window */
	uint64_t bytes;	 /* bytes it has in the file */
} flx_torch_storage;

/* A tensor node resolved (flx_torchfile_resolve()). */
typedef struct flx_torchfile_tensor {
	/* dtype, storage key, storage bytes (as the pickle states them),
	 * storage_offset, ndim, size, stride: see torchpkl.h */
	flx_tensor_pkl t;
	/* offset in the reader's window of storage element 0 (add
	 * t.storage_offset elements for the tensor's first element) */
	uint64_t data_off;
	/* index of the storage (flx_torchfile_storage()); tensors with the
	 * same index share bytes (tied weights) */
	uint32_t storage;
	bool parameter; /* wrapped in _rebuild_parameter[_with_state] */
} flx_torchfile_tensor;

/**
 * Detect the layout of the file filling r ([0, r->size)) and parse it:
 * zip when it starts with "PK\3\4", legacy when it starts with the magic
 * number's pickle, anything else refused.  name names the file in
 * messages.  Every tensor node reachable from the root (through dicts,
 * lists, tuples, sets, object arguments and states; depth bounded by
 * FLX_PV_MAX_WALK_DEPTH and visits by the pickle's node count) is checked
 * as flx_torchfile_resolve() would, so that after a successful open any
 * tensor node resolves.
 * @return 0 and *out (owned; flx_torchfile_close()), -EINVAL (malformed:
 *         err names the file, the record or key, and the reason), -EIO
 *         (the reader failed), -ENOMEM.  *out untouched on failure.
 */
int flx_torchfile_open(const flx_reader *r, const char *name,
		       flx_torchfile **out, flx_error *err);

/** The layout that was read. */
flx_torchfile_kind flx_torchfile_kind_of(const flx_torchfile *f);

/** The decoded object; borrowed, valid until flx_torchfile_close(). */
const flx_pv *flx_torchfile_root(const flx_torchfile *f);

/** Where the object pickle lies in the window ([*off, *off + *len)):
 * data.pkl's record, or the legacy object pickle.  Either may be NULL. */
void flx_torchfile_pickle_span(const flx_torchfile *f, uint64_t *off,
			       uint64_t *len);

/** Number of storages the file holds (zip: data/ records that a tensor
 * names; legacy: keys of the key list). */
uint32_t flx_torchfile_nstorages(const flx_torchfile *f);

/** Storage i (< flx_torchfile_nstorages()); borrowed, valid until
 * close. */
const flx_torch_storage *flx_torchfile_storage(const flx_torchfile *f,
					       uint32_t i);

/**
 * Whether v is a tensor node: an OBJ of torch._utils._rebuild_tensor_v2 or
 * _v3, or of torch._utils._rebuild_parameter / _rebuild_parameter_with_
 * state whose first argument is one.  Pure; NULL is false.
 */
bool flx_torchfile_is_tensor(const flx_pv *v);

/**
 * Resolve tensor node v of f's tree (flx_torchfile_is_tensor()).  key
 * names it in messages (the state-dict key).
 * @return 0 and *out, or -EINVAL with err naming f's file, key and the
 *         reason (not a tensor node, a storage the file lacks).
 *         Thread-safe.
 */
int flx_torchfile_resolve(const flx_torchfile *f, const flx_pv *v,
			  const char *key, flx_torchfile_tensor *out,
			  flx_error *err);

/** Free everything; NULL is fine. */
void flx_torchfile_close(flx_torchfile *f);

#endif
