/* SPDX-License-Identifier: MIT */
#ifndef FLX_TOOLS_MATERIALIZE_H
#define FLX_TOOLS_MATERIALIZE_H

/*
 * The decisions of flexfs-materialize, apart from the machinery that
 * writes files and talks MPI (flexfs-materialize.c, mat_comm.h): which
 * rank writes which file, whether a file left by an earlier run is
 * complete, whether two directories nest, which top-level entries a
 * --views list selects.  Pure functions of their arguments: every rank
 * computes the same answer from the same tree, with no message.
 *
 * Thread-safety: all reentrant.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What writing one file costs beyond its bytes, in bytes: creating,
 * syncing and renaming it (about a page), so that many empty or tiny
 * files still spread over the ranks. */
#define FLX_MAT_FILE_COST 4096u

/**
 * The writer of each of n files of sizes size[0..n): owner[i] in
 * [0, nranks), every file to exactly one rank, the ranks' loads (bytes +
 * FLX_MAT_FILE_COST per file) balanced by longest-first greedy placement
 * (each file, largest first, to the least loaded rank; ties to the lower
 * file index and the lower rank), so that no rank's load passes the mean
 * by more than one file's.  Deterministic.
 * @return 0 and owner, -EINVAL (nranks < 1), -ENOMEM.
 */
int flx_mat_assign(const uint64_t *size, size_t n, int nranks, int *owner);

/* What an earlier run may have left at a file's final name. */
typedef enum flx_mat_state {
	FLX_MAT_ABSENT = 0, /* nothing there: write it */
	FLX_MAT_DONE,	    /* complete: skip it */
	FLX_MAT_REDO,	    /* a regular file of another size: rewrite it */
	FLX_MAT_BLOCKED,    /* not a regular file: refuse */
} flx_mat_state;

/**
 * Whether a file of want bytes needs writing, from what lstat() found at
 * its final name (exists false: ENOENT).  A file reaches its final name
 * only by rename() after its bytes were fsync'd, and a run writes into an
 * OUT only under the same run record (the same source, options and tree),
 * so a regular file of the exact size there is this run's complete file;
 * anything else was not written by this run's rules.
 */
flx_mat_state flx_mat_state_of(bool exists, bool regular, uint64_t size,
			       uint64_t want);

/**
 * Whether directory path b is a or lies under a (both absolute,
 * canonical: realpath()'s), component-wise ("/a/bc" is not under "/a/b").
 */
bool flx_mat_within(const char *a, const char *b);

/**
 * Whether top-level entry name is selected by views, a comma-separated
 * list of names (NULL: every entry).  A view names a directory (ranks,
 * hf, objects, megatron, paddle) or a file (index.json; "index" also
 * selects it).
 */
bool flx_mat_selected(const char *views, const char *name);

/**
 * The progress line (no newline) into buf (len bytes): done of total
 * bytes, the rate of written bytes over secs, and the time left at that
 * rate ("--" until there is a rate).  Pure.
 */
void flx_mat_progress(char *buf, size_t len, uint64_t done, uint64_t total,
		      uint64_t written, double secs);

/** n bytes in binary units, "12.3 MiB", into buf (len bytes). */
void flx_mat_bytes(char *buf, size_t len, uint64_t n);

#endif
