/* SPDX-License-Identifier: MIT */
#ifndef FLX_GPU_SLICE_H
#define FLX_GPU_SLICE_H

/*
 * The slicer: executes the strided gathers of one read request.
 *
 * A chunk saved with a strided innermost axis (a transposed tensor saved
 * as-is) cannot be read in runs of bytes: the elements of a target row lie
 * a stride apart all over the chunk.  The read path (reshard/view.c)
 * decides which bytes of a request need such a gather, and hands all of
 * them to a slicer at once as one batch:
 *
 *   runs    every strided run of the request: elements of elem_size bytes
 *           read from file offsets src, src + stride, src + 2 * stride, ...
 *           of one backing file, written densely to the request's buffer;
 *   blocks  every block of the backing files those elements start in, each
 *           listed once, in file order, with its length, and how to pin
 *           it (through the mount's block cache, reshard/bcache.h).
 *
 * A backend fetches each block once, copies the elements that start in it
 * to their places, and releases it.  The CPU backend (slice_cpu.c) does it
 * block after block, so the request's blocks are read once and stay in the
 * CPU's caches while every run takes its elements, in tiles where
 * consecutive runs step through a block together (rows of a transpose).
 * A device backend makes one submission of the batch: each block copied
 * to the device as it is fetched, the runs executed there, the runs'
 * destination bytes copied back.
 *
 * The byte stream of a run is its elements back to back (element i: the
 * elem_size bytes at file offset src + i * stride); the run wants len bytes
 * of that stream from byte skip on (skip < elem_size: a request may start
 * or end inside an element), and they go to dst[run.dst, run.dst + len).
 * The element holding stream byte p is taken from the listed block of the
 * run's file whose home [start, start + block) holds the element's first
 * byte; the whole element must lie in the bytes the block holds,
 * [start, start + len).  Blocks hold a few bytes past their home (the
 * largest element size) so an element that straddles two homes is copied
 * from one.
 *
 * A valid batch (flx_slice_batch_check()): elem_size and block non-zero;
 * every run has skip < elem_size and dst + len <= dst_len; runs sorted by
 * file, then dst; blocks sorted by file, then start, their homes apart.
 * Every element a run wants must start in a listed block of its file and
 * end inside it, or the batch fails with -EIO (the read path lists blocks
 * of the file's size at mount: a file that shrank since then reads short
 * and fails there).
 *
 * Choosing a backend.  flx_slicer_default() is called once per mount and
 * the mount's reads all use what it returned (reshard/view.h,
 * flx_view_io).  flx_slicer_run() asks that backend whether it takes a
 * batch (a device declines batches too small to pay for the transfers:
 * the CPU is faster there) and runs the ones it declines on the CPU.
 *
 * Adding a backend (a CUDA one is issue #22): one file, gpu/slice_cuda.cu,
 * defining `const flx_slicer *flx_slicer_cuda(void)`, which returns NULL
 * when no usable device is present; its declaration in slice_internal.h
 * and its entry in the backends table of slice.c (detection); the file
 * added to flx_gpu in gpu/CMakeLists.txt behind an option
 * (FLEXFS_WITH_CUDA, enable_language(CUDA)).  test_slice then checks it
 * against the oracle like every backend, and skips it without a device.
 * Device errors become -EIO in that file, once.
 *
 * Thread-safety: a slicer is immutable and every function here may be
 * called from any number of threads at once (the FUSE threads each run
 * their own requests' batches); a backend that needs per-call device state
 * (streams, staging memory) keeps it per thread or in a pool it locks.  A
 * batch belongs to the thread that runs it: its callbacks are called from
 * that thread only, during the run.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** One strided run of a batch (see the top of this file). */
typedef struct flx_slice_run {
	uint64_t src;	 /* file offset of element 0 */
	uint64_t stride; /* bytes from an element to the next, in the file */
	uint64_t skip;	 /* stream bytes before the first wanted one */
	size_t dst;	 /* where the first wanted byte goes, in dst */
	size_t len;	 /* bytes wanted */
	uint32_t file;	 /* the backing file (the read path's numbering) */
} flx_slice_run;

/** One block of a backing file: the bytes [start, start + len). */
typedef struct flx_slice_block {
	uint64_t start;
	size_t len;
	uint32_t file;
} flx_slice_block;

typedef struct flx_slice_batch {
	size_t elem_size;
	unsigned char *dst; /* the request's buffer, dst_len bytes */
	size_t dst_len;
	const flx_slice_run *runs;
	size_t nruns;
	const flx_slice_block *blocks;
	size_t nblocks;
	uint64_t block; /* a block's home: [start, start + block) */
	/*
	 * Pin blocks[k]: *data gets its len bytes, valid until put(ctx, k),
	 * which must follow every get that returned 0 before the next get
	 * (at most one block is pinned at a time: the block cache's waits
	 * cannot deadlock then).  get returns 0 or -errno (-EIO: the file
	 * changed since mount), and the batch fails with that error.
	 */
	int (*get)(void *ctx, size_t k, const unsigned char **data);
	void (*put)(void *ctx, size_t k);
	void *ctx;
} flx_slice_batch;

typedef struct flx_slicer {
	const char *name; /* "cpu", "cuda" */
	/** Whether run() should take batch b (a device declines a batch too
	 * small to pay for its transfers); NULL: every batch.  Must be cheap
	 * and must not call b's callbacks. */
	bool (*accepts)(const struct flx_slicer *self,
			const flx_slice_batch *b);
	/**
	 * Execute batch b (borrowed for the call: nothing of it is kept):
	 * every run's bytes written to its place in b->dst, no byte of dst
	 * outside the runs written.
	 * @return 0, or -errno with dst partly written: -EINVAL (not a valid
	 *         batch), -EIO (an element outside its block, see above),
	 *         get()'s error, -ENOMEM; -EAGAIN from a device backend that
	 *         cannot take the batch now (its device memory is taken):
	 *         flx_slicer_run() runs the batch on the CPU instead.
	 */
	int (*run)(const struct flx_slicer *self, const flx_slice_batch *b);
} flx_slicer;

/** The CPU backend (always available; static, never freed). */
const flx_slicer *flx_slicer_cpu(void);

/** The backend a mount should use: the first device backend that finds
 * its device, else the CPU one (static, never freed).  It may probe
 * devices: call it once, at mount. */
const flx_slicer *flx_slicer_default(void);

/**
 * Execute batch b with slicer s (NULL: the CPU backend), or with the CPU
 * backend when s declines it or returns -EAGAIN (running a batch again
 * rewrites the same bytes).
 * @return 0 or -errno, as flx_slicer.run.
 */
int flx_slicer_run(const flx_slicer *s, const flx_slice_batch *b);

/** Whether b is a valid batch (see the top of this file), in O(nruns +
 * nblocks), for backends to call before they start.
 * @return 0 or -EINVAL. */
int flx_slice_batch_check(const flx_slice_batch *b);

#endif
