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
 *           it (through the mount's block cache, resolver/cache/bcache.h).
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
 * A batch may carry a conversion (cast, elemcast.h: a cast tensor's
 * stored elements converted as they are gathered, reshard/cast.h).  Then
 * elem_size is the source type's size, and a run's stream is made of the
 * converted elements, cast->to.size bytes each (element i: the
 * conversion of the elem_size bytes at file offset src + i * stride);
 * runs want whole converted elements (skip 0, len a multiple of
 * cast->to.size).  Blocks and the block rule stay in the source's bytes.
 * Every backend converts with elemcast.h's code: the same bits on the CPU
 * and on the device.
 *
 * A valid batch (flx_slice_batch_check()): elem_size and block non-zero;
 * every run has skip < elem_size and dst + len <= dst_len; runs sorted by
 * file, then dst; blocks sorted by file, then start, their homes apart;
 * with a cast, elem_size == cast->from.size and the runs whole elements.
 * Every element a run wants must start in a listed block of its file and
 * end inside it, or the batch fails with -EIO (the read path lists blocks
 * of the file's size at mount: a file that shrank since then reads short
 * and fails there).
 *
 * Choosing a backend.  flx_slicer_open() is called once per mount, with
 * the mount's -o gpu=, gpu_min= and gpu_device=, and the mount's reads all
 * use what it returned (reshard/view.h, flx_view_io).  flx_slicer_run()
 * asks that backend whether it takes a batch (a device declines batches
 * too small to pay for the transfers: the CPU is faster there) and runs
 * the ones it declines on the CPU.
 *
 * The CUDA backend (slice_cuda.cu) is a shared object of its own,
 * libflexfs-cuda.so, that flx_slicer_open() loads with dlopen() when it
 * is asked for a device (slice_cuda.h gives the interface between the
 * two; slice_load.c the loading): the daemon never links the CUDA
 * runtime, and runs the same on machines with no GPU, driver or toolkit.
 * Device errors become -EIO in slice_cuda.cu, once.  test_slice checks
 * the CUDA backend against the oracle like every backend when a device is
 * present, and says in one line that it skipped it when not.
 *
 * Thread-safety: a slicer is immutable and every function here may be
 * called from any number of threads at once (the FUSE threads each run
 * their own requests' batches); a backend that needs per-call device state
 * (streams, staging memory) keeps it per thread or in a pool it locks.  A
 * batch belongs to the thread that runs it: its callbacks are called from
 * that thread only, during the run.
 */

#include "elemcast.h"

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
	uint64_t block;	       /* a block's home: [start, start + block) */
	const flx_ecast *cast; /* NULL: the elements copied as they are */
	/*
	 * What the blocks' bytes are: batches with the same non-zero origin
	 * read the same bytes for the same (file, start, len) block, for as
	 * long as the slicer is open (the read path gives its checkpoint's
	 * uid, and fails a read whose file changed since the mount at get()),
	 * so a backend may keep blocks across batches; 0: blocks are this
	 * batch's alone.
	 */
	uint64_t origin;
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
	/* Whether the read path should hand it a cast tensor's reads as
	 * batches carrying the cast (a device: gathered and converted in one
	 * pass).  Every backend executes such batches; the CPU one says
	 * false: there the read path converts after reading, contiguous
	 * runs with preadv (reshard/view.c). */
	bool casts;
	/* The table entry that opened it (flx_slicer_open()), which starts
	 * and closes it; NULL: a static slicer (the CPU one, tests' own),
	 * nothing to start or close. */
	const struct flx_slicer_backend *backend;
} flx_slicer;

/** The CPU backend (always available; static, never freed). */
const flx_slicer *flx_slicer_cpu(void);

/* -o gpu=: the CUDA backend when it loads and finds its device (auto),
 * the mount fails without it (on), never (off). */
typedef enum flx_gpu_mode {
	FLX_GPU_AUTO = 0,
	FLX_GPU_ON,
	FLX_GPU_OFF,
} flx_gpu_mode;

/* -o gpu_min= unset: the bytes a batch must want before a device takes it.
 * Chosen from measurements (docs/performance.md, "GPU slicing"): FUSE's
 * requests, which want just under 1 MiB, run faster on the CPU backend;
 * larger batches (flexfs-materialize's) on the device. */
#define FLX_GPU_MIN_DEFAULT (1ull << 20)

/* -o gpu_cache= unset: device memory that keeps blocks across batches
 * (slice_cuda.cu): a transposed chunk's blocks serve every read of the
 * chunk after one copy to the device. */
#define FLX_GPU_CACHE_DEFAULT (1ull << 30)

typedef struct flx_slicer_opts {
	flx_gpu_mode mode;
	uint64_t min_bytes; /* a device declines batches wanting fewer */
	int device;	    /* CUDA device number */
	/* the backend's shared object; NULL: $FLEXFS_CUDA_LIB (tests) or
	 * libflexfs-cuda.so next to the executable, then where it is
	 * installed, then in the build tree */
	const char *library;
	/* device memory for blocks kept across batches of one origin
	 * (flx_slice_batch.origin); 0: none, each batch copies its blocks */
	uint64_t cache_bytes;
} flx_slicer_opts;

/*
 * An entry of the table of device backends flx_slicer_open() chooses from
 * (slice_load.c: "cuda", the dlopen()ed libflexfs-cuda.so; tests open
 * their own tables with flx_slicer_open_from()).  The CPU backend is the
 * table's implicit last entry: it needs no open, start or close.
 */
typedef struct flx_slicer_backend {
	const char *name; /* "cuda": the log's "slicer: cuda on ..." */
	/* "CUDA": "gpu=on: no usable CUDA device"; NULL: the host's backend,
	 * the fallback when no device backend opens (never tried first) */
	const char *device;
	/**
	 * Open the backend for options o: 0 and *out (its backend field
	 * pointing at this entry), why[0..n) naming the device ("device 0
	 * (NVIDIA H100)"); or -errno (-ENODEV: no device, no library;
	 * -EIO: a driver error; -ENOMEM) and why[0..n) saying why.
	 */
	int (*open)(const struct flx_slicer_backend *be,
		    const flx_slicer_opts *o, const flx_slicer **out, char *why,
		    size_t n);
	/* flx_slicer_start() and flx_slicer_close() of what open() gave;
	 * NULL: nothing to do. */
	void (*start)(const flx_slicer *s);
	void (*close)(const flx_slicer *s);
} flx_slicer_backend;

/**
 * The slicer a mount with options o uses: the CUDA backend, or the CPU
 * one (mode off, or auto and the backend not loaded, no device, a driver
 * error).  line[0..n) gets one line for the mount log saying which and
 * why ("slicer: cpu (gpu=auto: no CUDA device: ...)").  May load a shared
 * object and probe a device: call it once per mount, from one thread.
 * @return 0 and *out (flx_slicer_close()); -ENODEV (mode on and no usable
 *         device: line says why, *out is the CPU one); -ENOMEM.
 */
int flx_slicer_open(const flx_slicer_opts *o, const flx_slicer **out,
		    char *line, size_t n);

/**
 * flx_slicer_open() choosing from table instead of the built-in one:
 * device backends best first, up to a NULL, the CPU one after them.
 * gpu=off opens none; otherwise the first that opens is the slicer, and
 * when none does, line gives the first one's reason.  table and its
 * entries must outlive what it returns.
 * @return as flx_slicer_open().
 */
int flx_slicer_open_from(const flx_slicer_backend *const *table,
			 const flx_slicer_opts *o, const flx_slicer **out,
			 char *line, size_t n);

/** Make s's device ready before the first batch (slice_cuda.h, start):
 * once, from one thread, before any batch, after the process forked for
 * the last time (a daemon: after it daemonized).  The CPU slicer, NULL:
 * nothing.  A failure is met again by the first batch, which says it. */
void flx_slicer_start(const flx_slicer *s);

/** Release what flx_slicer_open() returned (the CPU slicer, NULL:
 * nothing).  No batch may be running on it. */
void flx_slicer_close(const flx_slicer *s);

/** flx_slicer_open() with the defaults (gpu=auto, device 0), once per
 * process; the result is shared, never closed.  Thread-safe. */
const flx_slicer *flx_slicer_default(void);

/**
 * Execute batch b with slicer s (NULL: the CPU backend), or with the CPU
 * backend when s declines it or returns -EAGAIN (running a batch again
 * rewrites the same bytes).
 * @return 0 or -errno, as flx_slicer.run.
 */
int flx_slicer_run(const flx_slicer *s, const flx_slice_batch *b);

/** Whether the read path should send casts to s (flx_slicer.casts; NULL:
 * the CPU backend, false). */
bool flx_slicer_casts(const flx_slicer *s);

/** Whether b is a valid batch (see the top of this file), in O(nruns +
 * nblocks), for backends to call before they start.
 * @return 0 or -EINVAL. */
int flx_slice_batch_check(const flx_slice_batch *b);

#endif
