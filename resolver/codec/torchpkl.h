/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_TORCHPKL_H
#define FLX_RESOLVER_TORCHPKL_H

/*
 * Interpret a torch.save data.pkl whose root is one tensor:
 *   torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
 *                                   requires_grad, backward_hooks[, meta])
 *   torch._utils._rebuild_tensor_v3(..., backward_hooks, dtype[, meta])
 * with storage = BINPERSID ('storage', <torch.XStorage | UntypedStorage>,
 * key, location, numel) (the legacy format adds a sixth field, the view
 * metadata, which must be None).  numel counts elements for typed storages
 * and bytes for UntypedStorage; both are normalised to bytes here.
 */

#include "dtype.h"
#include "error.h"
#include "pickle.h"
#include "shape.h"

#include <stdint.h>

typedef struct flx_tensor_pkl {
	flx_dtype dtype;
	char key[64];		/* storage record name under data/ */
	uint64_t storage_bytes; /* storage size in bytes */
	/* bytes per element of the storage class (1 for UntypedStorage) */
	unsigned storage_esize;
	int64_t storage_offset; /* elements */
	int ndim;
	int64_t size[FLX_MAX_DIMS];
	int64_t stride[FLX_MAX_DIMS]; /* elements */
} flx_tensor_pkl;

/**
 * Parse data.pkl bytes.  name is used in messages.
 * Checks: the rebuild function, the persistent id shape, known dtype,
 * ndim <= FLX_MAX_DIMS, non-negative sizes/strides/offset, and that
 * storage_offset + max index reached by size x stride fits in the storage
 * (no overflow).  Does not check against the metadata (the caller does).
 * @return 0 and *out, -EINVAL with err, -ENOMEM.
 */
int flx_tensor_pkl_parse(const void *buf, size_t len, const char *name,
			 flx_tensor_pkl *out, flx_error *err);

/**
 * The same checks on v, a node of a tree already decoded (a tensor inside
 * a container).  v and its tree are borrowed, only read.
 * @return 0 and *out, -EINVAL with err.  Reentrant.
 */
int flx_tensor_pkl_from_pv(const flx_pv *v, const char *name,
			   flx_tensor_pkl *out, flx_error *err);

#endif
