/* SPDX-License-Identifier: MIT */
/* Read-ahead of small files while a source parses its metadata
 * (source.h). */
#include "ckpt.h"
#include "grow.h"
#include "reader.h"
#include "index_internal.h"
#include "source.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* ---- read-ahead ----
 *
 * Cold mounts: while the metadata is read and decoded, a thread asks the
 * kernel to start reading the small files whose records the source parses
 * right after; a checkpoint of many small tensors keeps its item headers
 * spread over all of them (docs/performance.md).  Large files are left
 * alone: their items are few, and reading them ahead would read the
 * tensors.  Only a hint: every failure is ignored, and nothing but regular
 * files, not through symlinks, is opened.
 */
#define PREFETCH_FILE_MAX  (4u << 20)
#define PREFETCH_TOTAL_MAX (128u << 20)

/* Entries are read with getdents64() into the stack, not readdir(): no
 * allocation on this thread, so the chaos test's count of the mount
 * path's allocations stays the same from run to run.  The thread is joined
 * before the checkpoint is returned (its few system calls end long before
 * the decode does), so no thread or descriptor of it outlives the open or
 * reaches the daemon's fork. */
static void *prefetch_run(void *arg)
{
	struct prefetch *pf = arg;
	_Alignas(struct dirent64) char buf[8192];
	uint64_t total = 0;
	ssize_t got;

	while (total < PREFETCH_TOTAL_MAX &&
	       (got = getdents64(pf->dirfd, buf, sizeof(buf))) > 0) {
		for (ssize_t at = 0; at < got;) {
			const struct dirent64 *de =
			    (const struct dirent64 *)(buf + at);
			struct stat st;
			int fd;

			at += de->d_reclen;
			if (!pf->want(de->d_name) ||
			    fstatat(pf->dirfd, de->d_name, &st,
				    AT_SYMLINK_NOFOLLOW) ||
			    !S_ISREG(st.st_mode) ||
			    st.st_size > PREFETCH_FILE_MAX ||
			    total + (uint64_t)st.st_size > PREFETCH_TOTAL_MAX)
				continue;
			fd = openat(pf->dirfd, de->d_name,
				    O_RDONLY | O_CLOEXEC | O_NOFOLLOW |
					O_NOCTTY | O_NONBLOCK);
			if (fd < 0)
				continue;
			total += (uint64_t)st.st_size;
			(void)posix_fadvise(fd, 0, st.st_size,
					    POSIX_FADV_WILLNEED);
			close(fd);
		}
	}
	close(pf->dirfd);
	return NULL;
}

void flx_build_prefetch(flx_build *b, bool (*want)(const char *name))
{
	struct prefetch *pf = &b->pf;

	if (pf->started)
		return;
	pf->want = want;
	pf->dirfd = openat(b->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (pf->dirfd < 0)
		return;
	pf->started = pthread_create(&pf->tid, NULL, prefetch_run, pf) == 0;
	if (!pf->started)
		close(pf->dirfd);
}

void prefetch_end(struct prefetch *pf)
{
	if (pf->started)
		pthread_join(pf->tid, NULL);
	pf->started = false;
}
