/* SPDX-License-Identifier: MIT */
/*
 * A stand-in for libflexfs-cuda.so (gpu/slice_cuda.h) for test_gpu_load:
 * the loader's paths without a device.  $FLEXFS_CUDA_STUB picks what it
 * does: "nodev" (open: -ENODEV, no device), "driver" (open: -EIO, a
 * driver error), "abi" (a wrong ABI number), "noentry" (the entry point
 * returns NULL), "runerr" (run: -EIO), "busy" (run: -EAGAIN after
 * scribbling on the runs), "corrupt" (a device that gets the last byte
 * of every run wrong: the end-to-end test shows the bytes it serves come
 * from here), anything else a working fake device that executes batches
 * one byte at a time (a cast one element at a time, with elemcast.h),
 * fetching each block once.  The
 * counters below are read by the test through dlsym().
 */
#include "slice_cuda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int stub_opens, stub_closes, stub_runs, stub_starts, stub_device = -1;

static const char *mode(void)
{
	const char *m = getenv("FLEXFS_CUDA_STUB");

	return m ? m : "";
}

static int stub_open(int device, uint64_t cache_bytes, char *what, size_t n,
		     void **dev)
{
	(void)cache_bytes;
	stub_opens++;
	stub_device = device;
	if (!strcmp(mode(), "nodev")) {
		snprintf(what, n, "no CUDA device (stub)");
		return -ENODEV;
	}
	if (!strcmp(mode(), "driver")) {
		snprintf(what, n, "cudaGetDeviceCount: driver error (stub)");
		return -EIO;
	}
	snprintf(what, n, "Stub GPU");
	*dev = &stub_opens;
	return 0;
}

static int stub_run(void *dev, const flx_slice_batch *b)
{
	size_t esz = b->elem_size, tsz = b->cast ? b->cast->to.size : esz;

	(void)dev;
	stub_runs++;
	if (!strcmp(mode(), "runerr"))
		return -EIO;
	if (!strcmp(mode(), "busy")) {
		for (size_t i = 0; i < b->nruns; i++)
			memset(b->dst + b->runs[i].dst, 0x5A, b->runs[i].len);
		return -EAGAIN;
	}
	for (size_t k = 0; k < b->nblocks; k++) {
		const flx_slice_block *blk = &b->blocks[k];
		const unsigned char *data;
		int rc = b->get(b->ctx, k, &data);

		if (rc)
			return rc;
		for (size_t i = 0; i < b->nruns; i++) {
			const flx_slice_run *u = &b->runs[i];

			if (u->file != blk->file)
				continue;
			for (uint64_t e = 0; b->cast && e < u->len / tsz; e++) {
				uint64_t s = u->src + e * u->stride;

				if (s >= blk->start &&
				    s - blk->start < b->block)
					flx_ecast_one(b->cast,
						      b->dst + u->dst + e * tsz,
						      data + (s - blk->start));
			}
			for (uint64_t p = u->skip;
			     !b->cast && p < u->skip + u->len; p++) {
				uint64_t s = u->src + p / esz * u->stride;

				if (s >= blk->start &&
				    s - blk->start < b->block)
					b->dst[u->dst + (p - u->skip)] =
					    data[s - blk->start + p % esz];
			}
		}
		b->put(b->ctx, k);
	}
	for (size_t i = 0; !strcmp(mode(), "corrupt") && i < b->nruns; i++)
		if (b->runs[i].len)
			b->dst[b->runs[i].dst + b->runs[i].len - 1] ^= 0xFF;
	return 0;
}

static void stub_close(void *dev)
{
	(void)dev;
	stub_closes++;
}

static void stub_start(void *dev)
{
	(void)dev;
	stub_starts++;
}

static const flx_cuda_api api = {FLX_CUDA_ABI, stub_open, stub_run, stub_close,
				 stub_start};
static const flx_cuda_api bad_abi = {FLX_CUDA_ABI + 1, stub_open, stub_run,
				     stub_close, stub_start};

const flx_cuda_api *flx_cuda_entry(void);

const flx_cuda_api *flx_cuda_entry(void)
{
	if (!strcmp(mode(), "abi"))
		return &bad_abi;
	if (!strcmp(mode(), "noentry"))
		return NULL;
	return &api;
}
