/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FUSE_LL_H
#define FLX_FS_FUSE_LL_H

/*
 * The low-level FUSE adapter over the immutable namespace (tree.h).  Only
 * fuse_ll.c and fuse_main.c include libfuse headers.
 */

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "tree.h"

#include <limits.h>
#include <stdbool.h>

#include <stdint.h>
#include <sys/types.h>

#define FLX_LL_RA_AUTO UINT_MAX

/* Per-mount context, the session's userdata.  Read-only while mounted,
 * except ra_done, the counters, and push, pass, maps and kernel_flags2
 * (set at INIT, before any other request, and cleared when the session is
 * destroyed). */
typedef struct flx_ll {
	const flx_fs *fs; /* borrowed; outlives the session */
	bool foreground;  /* log to stderr (else syslog) */
	/* -o log=FILE: its descriptor (O_APPEND, borrowed), every message
	 * appended there too; -1: none */
	int log_fd;
	unsigned char *logged; /* per inode: a failure was logged (owned by
				* the caller; NULL disables logging) */
	/* Readahead to set on the mount's bdi ("MAJ:MIN", empty: none) once
	 * the kernel has processed INIT, which would otherwise clamp it back
	 * to its own offer; ra_verbose: report a failure (the user asked). */
	char bdi[64];
	unsigned read_ahead_kb; /* FLX_LL_RA_AUTO: 4 requests (set at INIT) */
	bool ra_verbose;
	int ra_done; /* set atomically by the first request after INIT */
	/* Open files FOPEN_DIRECT_IO (-o direct_io).  Cleared at INIT when
	 * the kernel could not mmap such files; read atomically. */
	bool direct_io;
	/* -o passthrough: a file that is the whole of one backing file
	 * (flx_fs_whole_file(), after flx_fs_mark_whole()) is opened FUSE
	 * passthrough; cleared at INIT when the kernel or the process cannot
	 * (see the block above pass_get() in fuse_ll.c); read atomically */
	bool passthrough;
	struct flx_pass *pass;	/* the adapter's: from INIT to destroy */
	uint32_t kernel_flags2; /* the kernel's INIT flags2 (0: none) */
	/* what the INIT reply must add (FLX_LL_PATCH_*, see
	 * flx_ll_session_mounted()); 0 once sent */
	int init_patch;
	/* requests served, for FLEXFS_FUSE_STATS (updated atomically):
	 * reads, opens, the opens answered passthrough, and the reads
	 * replied from mapped backing files */
	unsigned long n_reads, n_opens, n_pass_opens, n_mapped;
	/* NULL, or: into buf (len bytes) the cause of the last failed read
	 * when the mount knows it (the distributed mount: which rank, and
	 * why), "" otherwise; called from any thread */
	void (*why)(void *arg, char *buf, size_t len);
	void *why_arg;
	/* -o push_ahead_kb: after a read lands in a tensor, up to this many
	 * KiB more of it are stored in the kernel's page cache by a thread of
	 * the adapter (0: off); see the block above push_after() */
	unsigned push_kb;
	struct flx_pusher *push; /* the adapter's: from INIT to destroy */
	/* the checkpoint's backing files (ckpt->nfiles): read replies of
	 * many ranges are sent from their mappings, kept in maps (the
	 * adapter's: from INIT to destroy; NULL: none) */
	size_t nfiles;
	struct flx_maps *maps;
	struct fuse_session *se; /* set by flx_ll_session_new() */
} flx_ll;

/**
 * fuse_session_new() with flexfs's operations; ll is borrowed and must
 * outlive the session.  args as for fuse_session_new().
 * @return the session (owned: fuse_session_destroy()), or NULL after
 *         libfuse printed why (e.g. an unknown -o option).
 */
struct fuse_session *flx_ll_session_new(struct fuse_args *args, flx_ll *ll);

/**
 * What the session needs once fuse_session_mount() succeeded and before
 * the loop runs: the session's writes and splices to /dev/fuse go through
 * flexfs (fuse_session_custom_io(); reads are unchanged), so that a reply
 * that came out short is answered with EIO instead, and, with -o direct_io
 * and a libfuse that cannot ask the kernel to allow mmap of direct-io files
 * (before 3.17), so that the INIT reply can ask for it; with -o passthrough,
 * so that the kernel's INIT offer is seen and the INIT and open replies can
 * carry what libfuse 3.14 cannot (FUSE_PASSTHROUGH, backing ids).  The hooks
 * get the session's flx_ll as their userdata (flx_ll_session_new()).
 * @return 0, or -errno (out of memory) after libfuse printed why.
 */
int flx_ll_session_mounted(struct fuse_session *se);

#endif
