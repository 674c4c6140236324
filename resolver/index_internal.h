/* SPDX-License-Identifier: MIT */
#ifndef FLX_INDEX_INTERNAL_H
#define FLX_INDEX_INTERNAL_H

/*
 * What the files of the global index's builder share, and nothing else
 * includes (source.h is the sources' interface): the builder's state and
 * the functions one of its files calls in another.
 *
 *   index.c          opening a checkpoint: choosing the source, entering
 *                    a subdirectory, the load, close
 *   index_paths.c    opening a source path below the directory (openat2
 *                    RESOLVE_BENEATH or the walk), the path index
 *   index_files.c    the file table, the fd table, file reads, identity
 *                    checks at run time
 *   index_chunks.c   chunk allocation and validation
 *   index_items.c    the item workers
 *   index_prefetch.c read-ahead of small files at mount
 *   index_names.c    extras and the name index
 *
 * Thread-safety: as source.h; a flx_build belongs to the thread opening
 * the checkpoint.
 */
#include "ckpt.h"
#include "source.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

struct flx_build {
	flx_ckpt *c;
	int dirfd;
	char *realdir; /* realpath of the directory, for symlink checks */
	flx_error *err;
	const flx_source *src;
	size_t cap_files;
	int *fmap; /* open-addressing index of files by relpath */
	size_t fmap_cap;
	const flx_item_ops *items; /* NULL: no items to read */
	const char *names_from, *names_where;
	struct prefetch {
		pthread_t tid;
		int dirfd; /* owned by the thread once it runs */
		bool (*want)(const char *name);
		bool started;
	} pf;
	unsigned threads; /* flx_ckpt_opts.threads */
	bool walk_only;	  /* flx_ckpt_opts.walk_only */
	bool follow;	  /* flx_ckpt_opts.follow_symlinks */
	char *entered;	  /* flx_build_entered() */
	/* flx_build_keep(): a probe's findings, for load */
	void *kept;
	void (*kept_free)(void *);
	/* files that keep their descriptor from the open; the others go to
	 * the fd table of fd_slots slots (fd_budget()) */
	size_t fd_keep, fd_slots, nkept;
};

/* index_paths.c */

/* flx_build_open() below dirfd (realdir its realpath), by the walk alone
 * when walk_only; also what reopens a file of the fd table. */
int open_beneath(int dirfd, const char *realdir, bool walk_only,
		 const char *relpath, int *fd_out, struct stat *st);
/* The index in b's file table of relpath, or -1. */
int file_index_lookup(const flx_build *b, const char *relpath);
/* Enter file idx of b's table in its index by path.  @return 0, -ENOMEM. */
int file_index_add(flx_build *b, int idx);
/* follow_symlinks: relpath opened through its symlinks wherever they
 * lead; fd -1 when it is no regular file.  @return 0 or -errno. */
int open_followed(flx_build *b, const char *relpath, int *fd, struct stat *st);

/* index_files.c */

/* How many files keep their descriptor from the open (*keep) and how many
 * slots the fd table gets (keep_fds: the test's, flx_ckpt_opts). */
void fd_budget(unsigned keep_fds, size_t *keep, size_t *slots);
/* Free fd table t (NULL: nothing). */
void fdtable_free(struct flx_fdtable *t);
/* Open and record a file of the directory, *idx its index; key names the
 * tensor or value that needs it (NULL for extras), for messages.
 * @return 0 or -errno with b's error. */
int add_file(flx_build *b, const char *relpath, bool data, const char *key,
	     uint32_t *idx);

/* index_items.c */

/* Start reading the items of b's index: workers 1.. on their own
 * threads, worker 0 too unless wait (then it runs here, before returning).
 * @return 0 and *out (for items_end()), -ENOMEM, or -EOVERFLOW (more
 * than UINT32_MAX tensors). */
int items_begin(const flx_build *b, bool wait, struct flx_item_load **out);
/* Wait for (or run) every worker, give what they kept to the index's pool
 * (the caller's thread must be the only one using it), then free ld.
 * @return 0, or the first failure in file order with err. */
int items_end(struct flx_item_load *ld, flx_error *err);

/* index_prefetch.c */

/* Join the read-ahead thread of pf, if it runs. */
void prefetch_end(struct prefetch *pf);

/* index_names.c */

/* The other regular files of the directory, passed through unchanged
 * (config.json, tokenizer files).  @return 0 or -errno with b's error. */
int load_extras(flx_build *b);
/* The name index of tensors and objects (flx_ckpt_find()), a name
 * used twice refused.  @return 0 or -errno with b's error. */
int build_names(flx_build *b);

#endif
