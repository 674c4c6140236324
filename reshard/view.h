/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_VIEW_H
#define FLX_RESHARD_VIEW_H

/*
 * A "view" is one (tensor, box) pair whose bytes are the box's elements in
 * C order, of the tensor's dtype (converted on read when a cast of the
 * transform stage made it differ from the dtype its chunks hold,
 * flx_tensor.stored).  flx_view_read() serves any byte range of a view straight
 * from the source files: the box is intersected with the saved chunks (found
 * through an index sorted along one axis, never a scan of all pairs), and
 * every requested byte is copied by coalesced pread()s of contiguous source
 * runs; only chunks saved with a non-unit innermost stride are gathered
 * through the mount's slicer (gpu/slice.h): the strided runs of a read as
 * one batch, whose blocks come from the mount's cache (bcache.h).
 *
 * Thread-safety: a view is immutable once built; reads are reentrant.
 */

#include "bcache.h"
#include "ckpt.h"
#include "slice.h"

#include <stdbool.h>
#include <sys/types.h>

struct flx_zitem;

typedef struct flx_view flx_view;

/**
 * The largest storage span, in bytes, of a chunk saved with a strided
 * innermost axis (read by gathers, see bcache.h), and its tensor in *which
 * (may be NULL); 0 when every chunk's innermost axis is contiguous.
 */
uint64_t flx_ckpt_gather_span(const flx_ckpt *ckpt, const flx_tensor **which);

/** Box of a view, its tensor and its size in bytes. */
const flx_box *flx_view_box(const flx_view *v);
const flx_tensor *flx_view_tensor(const flx_view *v);
uint64_t flx_view_bytes(const flx_view *v);

/** Indices (into ckpt->files) of the backing files the view reads,
 * sorted and unique.  @return 0 and *out (owned, free()) / *n, or -ENOMEM. */
int flx_view_files(const flx_view *v, uint32_t **out, size_t *n);

/** The same without allocating: the view reads from npieces saved chunks,
 * piece i from file flx_view_piece_file(v, i) (files may repeat). */
size_t flx_view_npieces(const flx_view *v);
uint32_t flx_view_piece_file(const flx_view *v, size_t i);
/** The bytes piece i gives the view, in the view's dtype (as
 * flx_view_bytes(): the pieces' sum is the view's). */
uint64_t flx_view_piece_bytes(const flx_view *v, size_t i);

/** A view of any box of t, on its own (a plan's views belong to the plan).
 * @return 0 and *out (owned; flx_view_free()), or -errno. */
int flx_view_new(const flx_ckpt *ckpt, const flx_tensor *t, const flx_box *box,
		 flx_view **out, flx_error *err);

/** Free a view from flx_view_new(); NULL and a plan's views are ignored
 * (those go with the plan). */
void flx_view_free(flx_view *v);

/** A contiguous byte range of one backing file. */
typedef struct flx_range {
	uint32_t file; /* index into ckpt->files */
	uint64_t src;  /* offset in that file */
	uint64_t len;
} flx_range;

/**
 * Describe view bytes [off, off+n) as at most max contiguous ranges of
 * backing files, in order, a range that continues the one before merged
 * into it, after checking each file is unchanged: a reply can then be
 * spliced from the files without a copy.
 * @return 0 and *nout, the number of ranges written to out: >= 1, or 0
 *         when some bytes need a gather (a chunk saved with a strided
 *         innermost axis) or a conversion (a cast tensor), take more
 *         than max ranges, or lie outside the view, or come from a
 *         zstd chunk (decompressed, never spliced); -EIO if a backing
 *         file changed since mount.
 */
int flx_view_ranges(const flx_view *v, uint64_t off, size_t n, flx_range *out,
		    size_t max, size_t *nout);

/**
 * flx_view_ranges() without the check of the files: the same ranges, for
 * a caller that checks each file the ranges name before it uses them
 * (once per request, however many views name it).  Reads no file.
 * @return 0 and *nout, as flx_view_ranges().
 */
int flx_view_runs(const flx_view *v, uint64_t off, size_t n, flx_range *out,
		  size_t max, size_t *nout);

/**
 * Whether view bytes [off, off+n) are one contiguous run of one zstd
 * chunk's content (an innermost axis of unit stride, no cast): then a
 * reply can be sent from the content's cached windows (zcache.h) without
 * a copy.  Reads no file.
 * @return 0 and *found; when true, *it (the chunk's item) and *a (the
 *         run's first byte in the item's content).
 */
int flx_view_zrun(const flx_view *v, uint64_t off, size_t n,
		  struct flx_zitem *it, uint64_t *a, bool *found);

/** Read statistics, for tests and benchmarks (per call, caller-owned). */
typedef struct flx_read_stats {
	uint64_t preads;     /* pread() calls issued */
	uint64_t bytes_read; /* bytes read from backing files */
} flx_read_stats;

/**
 * Copy bytes [off, off+n) of view v into buf (n is clipped at the end),
 * gathering strided chunks on the CPU without a cache.  stats may be NULL.
 * @return bytes copied (0 at/after the end), or -EIO (short read of a
 *         backing file, which means it changed after mount) / -errno.
 */
ssize_t flx_view_read(const flx_view *v, void *buf, size_t n, uint64_t off,
		      flx_read_stats *stats);

/**
 * How the reads of one mount gather chunks saved with a strided innermost
 * axis, chosen once at mount (flx_slicer_default()) and shared by every
 * read, which only reads it.
 */
typedef struct flx_view_io {
	flx_bcache *cache;	  /* their blocks, kept for later reads; NULL:
				   * each read fetches the blocks it needs */
	const flx_slicer *slicer; /* executes them; NULL: the CPU backend */
	/* zstd chunks' decompressed windows (zcache.h); NULL: each read
	 * decodes its item up to the bytes it needs */
	struct flx_zcache *zcache;
} flx_view_io;

/**
 * flx_view_read() whose strided gathers go through io (borrowed; NULL:
 * no cache, the CPU backend).  Reads through one io may run in parallel.
 */
ssize_t flx_view_read_io(const flx_view *v, const flx_view_io *io, void *buf,
			 size_t n, uint64_t off, flx_read_stats *stats);

/*
 * The reads of several view reads (the segments of one request),
 * collected to run together at flx_view_batch_flush(): the remote files'
 * (flx_file_is_remote()) go to the file backend as one batch, one request
 * per holder rather than one per segment; the local files' are sorted by
 * place, each file checked unchanged once (flx_file_verify()) and read
 * with clustered preadv()s, so that small tensors one after the other in
 * a file cost a syscall per cluster, not a fstat and a pread each.
 * Zero-initialise; one thread.
 */
typedef struct flx_view_batch {
	const struct flx_ckpt *ckpt;
	struct flx_file_span *spans; /* remote runs */
	size_t n, cap;
	struct flx_file_span *local; /* local runs */
	size_t nlocal, caplocal;
	struct iovec *iov; /* the clustered reads' scatter list */
	size_t capiov;
	flx_read_stats *stats; /* the local reads counted here; or NULL */
	int rc;		       /* the first failure of an early flush */
} flx_view_batch;

/**
 * flx_view_read_io() whose contiguous runs (of local and remote files) are
 * appended to batch (NULL: read at once), their bytes not in buf until
 * flx_view_batch_flush(): the caller must not look at buf, nor free it,
 * before.  A cast tensor's view reads at once
 * (its bytes are converted).  A batch that grows past a bound is flushed
 * early.  @return as flx_view_read_io().
 */
ssize_t flx_view_read_batch(const flx_view *v, const flx_view_io *io,
			    flx_view_batch *batch, void *buf, size_t n,
			    uint64_t off, flx_read_stats *stats);

/** Read what batch collected, and empty it (its memory is kept; free it
 * with flx_view_batch_release()).  @return 0, or the first -errno. */
int flx_view_batch_flush(flx_view_batch *batch);
void flx_view_batch_release(flx_view_batch *batch);

#endif
