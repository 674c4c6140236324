/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_MPI_MOUNT_H
#define FLX_FS_MPI_MOUNT_H

/*
 * The distributed mount's MPI side (built only with FLEXFS_WITH_MPI; no
 * FUSE here): one daemon per MPI rank, each with a directory holding any
 * subset of a checkpoint's files.
 *
 * At start the ranks exchange what they hold (name, size and mtime, then
 * a digest of each copy held by several ranks, see flx_dm_exchange()) and
 * agree on one table of files, the same on every rank, with its holders.  The
 * index is then opened with flx_dm_backend(): files the rank's directory lacks
 * are read from a holder over MPI by flx_file_backend.read(), which groups a
 * batch's spans per holder into requests of at most FLX_DM_REQ_BYTES, sends
 * them all at once (at most FLX_DM_INFLIGHT in flight) and waits for them with
 * a deadline; a request that times out marks its holder dead and goes to
 * another holder, or fails with -EIO.  A service thread per rank answers
 * the others' requests from its own files, checking each file unchanged.
 *
 * The collective steps (flx_dm_agree(), flx_dm_exchange()) must be called
 * by every rank in the same order.  Thread-safety: flx_dm_backend()'s
 * functions are thread-safe; everything else is for the main thread.
 */

#include "ckpt.h"
#include "error.h"

#include <stdbool.h>

#define FLX_DM_REQ_BYTES (4u << 20) /* bytes one request asks for */
#define FLX_DM_INFLIGHT	 16	    /* requests a batch has in flight */

typedef struct flx_dm flx_dm;

/**
 * MPI_Init_thread(MPI_THREAD_MULTIPLE) and this rank's place.
 * @return 0 and *out (flx_dm_end() frees it), or -ENOTSUP (no
 *         MPI_THREAD_MULTIPLE) / -ENOMEM with err set.
 */
int flx_dm_init(int *argc, char ***argv, unsigned timeout_s, flx_dm **out,
		flx_error *err);

/** This rank and the number of ranks. */
int flx_dm_rank(const flx_dm *m);
int flx_dm_size(const flx_dm *m);

/** s with every "{rank}" replaced by rank.  @return 0 and *out (owned),
 * or -ENOMEM. */
int flx_dm_subst(const char *s, int rank, char **out);

/**
 * Collective: whether every rank got rc == 0 so far.  @return 0 when all
 * did; otherwise the lowest failing rank's -errno, and err (on every rank)
 * holds that rank's error line prefixed with "rank R: " (err is read on
 * the failing rank, written on all).
 */
int flx_dm_agree(flx_dm *m, int rc, flx_error *err);

/**
 * Collective: list dir's regular files (hidden ones too: a .metadata;
 * in subdirectories too, named by relative path, at most 4 components
 * deep and 65536 files, symlinks never followed), exchange the lists, and check
 * them as one: two holders of a name must agree on its size, and then on
 * the XXH64 digest of its whole content, which every holder of a file held
 * by several ranks computes (a few threads, sequential reads, bounded
 * memory); a file held by one rank is not read.  Then start the service
 * thread and agree on the checkpoint format (the sources' probes over the
 * union of the ranks' file names).
 *
 * A save directory (a tracker file naming the subdirectory that holds the
 * checkpoint) is entered as one, as the sources' enter hooks decide over
 * the union of the ranks' files (flx_source_enter()): the subdirectory is
 * the checkpoint, its files named from there on, wherever they lie (each
 * rank may hold any subset; every holder's tracker must be the same).
 * @param o  the open's options (the hooks read theirs), or NULL; when a
 *           save directory is entered, o->entered names it, owned by m
 *           (the open then reads flx_dm_dir() as the checkpoint itself).
 * @return 0, or -errno with the same one-line err on every rank.
 */
int flx_dm_exchange(flx_dm *m, const char *dir, flx_ckpt_opts *o,
		    flx_error *err);

/** The directory this rank opens as the checkpoint (after exchange; m
 * owns it): dir, its entered iteration directory, or an empty directory
 * of m's when this rank holds none of that iteration's files. */
const char *flx_dm_dir(const flx_dm *m);

/* Counters, for benchmarks (all uint64_t). */
typedef struct flx_dm_stats {
	uint64_t exchange_bytes; /* the gathered file lists, all ranks */
	uint64_t bcast_bytes;	 /* metadata files broadcast at start */
	uint64_t batches;	 /* backend reads (one per FUSE read's flush) */
	uint64_t requests;	 /* requests sent (each answered by a reply) */
	uint64_t spans;		 /* file ranges they asked for */
	uint64_t bytes;		 /* bytes they asked for */
	uint64_t served;	 /* requests this rank answered */
	uint64_t served_bytes;
	uint64_t digested;  /* bytes of copies held twice this rank hashed */
	uint64_t digest_ns; /* the time it took (wall clock) */
	uint64_t cached;    /* remote bytes read from the block cache */
} flx_dm_stats;

/** The counters so far.  Thread-safe. */
void flx_dm_stats_get(const flx_dm *m, flx_dm_stats *out);

/** The format every rank opens the checkpoint as (after exchange). */
const char *flx_dm_format(const flx_dm *m);

/**
 * Keep the other ranks' bytes that reads fetch in cache (the mount's
 * block cache, resolver/cache/bcache.h: one budget, cache_size=), whole blocks,
 * so that a re-read does not fetch them again; NULL: none.  Cached bytes
 * are never stale: a holder serves only its copy unchanged since the
 * start, the copy every holder agreed on.  Call before the first read;
 * cache must outlive the reads.
 */
struct flx_bcache;
void flx_dm_set_cache(flx_dm *m, struct flx_bcache *cache);

/** The backend of the other ranks' files (after exchange); m owns it. */
const flx_file_backend *flx_dm_backend(flx_dm *m);

/**
 * Into buf (len bytes, NUL-terminated) why the calling thread's last read
 * of other ranks' bytes failed: the file and each holder's state ("rank
 * 1: timed out (no reply within mpi_timeout)", "rank ended or unreachable
 * (MPI error)", "could not read its copy"), or "" when it succeeded or
 * there was none.  Thread-safe (per thread).
 */
void flx_dm_why(const flx_dm *m, char *buf, size_t len);

/**
 * What the service thread calls (once, on its thread) when another rank
 * ends the mount: the caller ends its own, e.g. by raising SIGTERM.
 */
void flx_dm_on_end(flx_dm *m, void (*fn)(void *), void *arg);

/** Whether another rank said the mount ends (before flx_dm_on_end() was
 * called, too).  Thread-safe. */
bool flx_dm_told(const flx_dm *m);

/**
 * This rank's mount is over: tell every other rank MPI has not reported
 * gone to end (unless one told this rank), ranks taken for dead by a
 * timeout too; wait, at most mpi_timeout for each of two barriers, for
 * every rank to end as well; stop the service thread; MPI_Finalize only
 * when both barriers completed (every rank alive: all finalize), else
 * exit MPI without it (a rank killed or still stopped would make it wait
 * forever); free m.  Its waits take at most 2 s + 2.5 x mpi_timeout in
 * all (the service thread may be finishing a reply).  Called once, by the
 * main thread, after the FUSE session ended; NULL is fine.
 */
void flx_dm_end(flx_dm *m);

#endif
