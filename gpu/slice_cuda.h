/* SPDX-License-Identifier: MIT */
#ifndef FLX_GPU_SLICE_CUDA_H
#define FLX_GPU_SLICE_CUDA_H

/*
 * The interface between the daemon and libflexfs-cuda.so (not public).
 *
 * The CUDA backend lives in a shared object of its own, built from
 * slice_cuda.cu when CMake finds the CUDA toolkit; it links the CUDA
 * runtime, and nothing else of flexfs links it: the daemon dlopen()s it at
 * mount (slice_load.c), so one flexfs binary runs on machines with no
 * GPU, no driver or no toolkit.  The object exports one C symbol,
 * FLX_CUDA_ENTRY, a function returning its flx_cuda_api (static, never
 * freed); the loader refuses an object whose abi differs from
 * FLX_CUDA_ABI.
 *
 * Thread-safety: open(), start() and close() are called once each, by one
 * thread; run() from any number of threads at once after start() (or
 * after open() when start() is not called).
 */

#include "slice.h"

#include <stddef.h>

#define FLX_CUDA_ABI	 3
#define FLX_CUDA_ENTRY	 "flx_cuda_entry"
#define FLX_CUDA_LIBRARY "libflexfs-cuda.so"

typedef struct flx_cuda_api {
	unsigned abi; /* FLX_CUDA_ABI */
	/**
	 * Open device number device, keeping blocks across batches in up to
	 * cache_bytes of its memory (flx_slicer_opts.cache_bytes).  *dev
	 * (owned: close()) is the object's
	 * state; what[0..what_len) gets one line: the device's name on
	 * success ("NVIDIA H100 80GB HBM3"), else the reason.  The device
	 * is probed in a child process: this process first uses CUDA in its
	 * first run(), so it may fork (daemonize) in between.
	 * @return 0, -ENODEV (no such device, no driver), -EIO (the driver
	 *         failed), -ENOMEM.
	 */
	int (*open)(int device, uint64_t cache_bytes, char *what,
		    size_t what_len, void **dev);
	/**
	 * Execute batch b (already checked by flx_slice_batch_check()) as
	 * flx_slicer.run does.  @return 0, -EIO (a device error, or an
	 * element outside its block), get()'s error, -ENOMEM, -EAGAIN (every
	 * stream set of the device is busy: run it on the CPU).
	 */
	int (*run)(void *dev, const flx_slice_batch *b);
	/** Free dev (NULL: nothing); no run() may be in flight. */
	void (*close)(void *dev);
	/**
	 * Make the device ready for run() (CUDA context, the pool of kept
	 * blocks, the lanes' buffers), so that the first read does not wait
	 * for it.  Once, before any run(), after the process forked for the
	 * last time; what fails is met again, and said, by the first run().
	 */
	void (*start)(void *dev);
} flx_cuda_api;

typedef const flx_cuda_api *(*flx_cuda_entry_fn)(void);

#endif
