/* SPDX-License-Identifier: MIT */
/* Opening a source path below the checkpoint directory, never outside
 * it, and the builder's index of files by path (source.h). */
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

/* ---- files ---- */

bool flx_relpath_ok(const char *p)
{
	const char *s = p;

	if (!*p || *p == '/')
		return false;
	while (*s) {
		const char *e = strchr(s, '/');
		size_t n = e ? (size_t)(e - s) : strlen(s);

		if (n == 0 || (n == 1 && s[0] == '.') ||
		    (n == 2 && s[0] == '.' && s[1] == '.'))
			return false;
		s += n;
		if (*s == '/')
			s++;
	}
	return true;
}

/* A buffer of n bytes; a large one is offered to transparent huge pages:
 * copying megabytes into fresh 4 KiB pages costs a fault per page, several
 * times the copy itself.  free() releases it. */
static void *whole_alloc(size_t n)
{
	const size_t huge = (size_t)2 << 20;
	void *b = NULL;

	if (n < huge)
		return malloc(n ? n : 1);
	if (posix_memalign(&b, huge, (n + huge - 1) / huge * huge))
		return NULL;
#ifdef MADV_HUGEPAGE
	(void)madvise(b, (n + huge - 1) / huge * huge, MADV_HUGEPAGE);
#endif
	return b;
}

/* "1 GiB", "64 MiB", ... for a power of two of at least 1 KiB. */
static void fmt_pow2(char *out, size_t len, uint64_t v)
{
	static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB"};
	int u = 0;

	v >>= 10;
	while (v >= 1024 && u < 3) {
		v >>= 10;
		u++;
	}
	snprintf(out, len, "%" PRIu64 " %s", v, unit[u]);
}

/* ---- opening a source path below the directory ---- */

#ifndef RESOLVE_BENEATH
struct open_how {
	uint64_t flags;
	uint64_t mode;
	uint64_t resolve;
};
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_BENEATH	      0x08
#endif

/* Every descriptor that may read a source path: O_NONBLOCK so that a FIFO
 * never blocks (a type is refused only after an O_PATH look, but a FIFO
 * swapped in between must not hang us either), O_NOCTTY so that a
 * terminal never becomes ours. */
#define SOURCE_OPEN  (O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)
#define MAX_SYMLINKS 40	 /* the kernel's limit, for the same ELOOP */
#define MAX_DEPTH    256 /* directories entered by one path */

/* openat2() below dirfd: an escape (by "..", an absolute or an outside
 * symlink) fails with EXDEV by construction, symlinks inside are followed.
 * -ENOSYS on kernels before 5.6 (or without the system call here). */
static int openat2_beneath(int dirfd, const char *relpath, int flags, int *fd)
{
#ifdef SYS_openat2
	struct open_how how = {.flags = (uint64_t)flags,
			       .resolve =
				   RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
	long r = syscall(SYS_openat2, dirfd, relpath, &how, sizeof(how));

	if (r < 0)
		return -errno;
	*fd = (int)r;
	return 0;
#else
	(void)dirfd, (void)relpath, (void)flags, (void)fd;
	return -ENOSYS;
#endif
}

/* Open name, in parent, that an O_PATH look found a regular file (st),
 * for reading, and check that it still is that inode: a device or FIFO
 * swapped in between is then refused, never read. */
static int reopen_regular(int parent, const char *name, const struct stat *st,
			  int *fd_out)
{
	struct stat now;
	int fd = openat(parent, name, SOURCE_OPEN | O_NOFOLLOW);

	if (fd < 0)
		return -errno;
	if (fstat(fd, &now) < 0 || now.st_dev != st->st_dev ||
	    now.st_ino != st->st_ino) {
		close(fd);
		return -ESTALE;
	}
	*fd_out = fd;
	return 0;
}

/* The component walk's state: fds[0] is the checkpoint directory (not
 * owned), fds[1..depth] O_PATH descriptors of the directories entered;
 * path holds the components still to resolve. */
struct walk {
	int fds[MAX_DEPTH];
	size_t depth;
	char *path;
};

static void walk_pop_to(struct walk *w, size_t depth)
{
	while (w->depth > depth)
		close(w->fds[w->depth--]);
}

/* Replace the walk's remaining path by target followed by after (the
 * components after the symlink).  An absolute target must name a place
 * inside realdir: the walk restarts from the directory. */
static int walk_splice(struct walk *w, const char *realdir, const char *target,
		       const char *after)
{
	size_t n = strlen(realdir);
	char *next;

	if (target[0] == '/') {
		if (n == 1)
			n = 0; /* realdir "/": every absolute path is inside */
		if (strncmp(target, realdir, n) != 0 ||
		    (target[n] != '/' && target[n] != '\0'))
			return -EXDEV;
		walk_pop_to(w, 0);
		target += n;
	}
	if (asprintf(&next, "%s/%s", target, after) < 0)
		return -ENOMEM;
	free(w->path);
	w->path = next;
	return 0;
}

/*
 * The component walk, where openat2() is missing or refused an absolute
 * symlink: relpath resolved one component at a time with openat(O_PATH |
 * O_NOFOLLOW) from the directory's descriptor, so that no intermediate
 * directory can be swapped for a symlink under us; a symlink is read and
 * its target walked in its place; ".." never above the directory.  The
 * same rule as openat2()'s, plus absolute symlinks that point inside
 * realdir (the realpath() of the directory), which it would refuse.
 * @return 0 with *pfd (O_PATH) and *st its fstat, and, when the last
 *         component is a regular file, *fd open for reading (else -1);
 *         -EXDEV when the path leaves the directory, -ELOOP past
 *         MAX_SYMLINKS, or -errno.
 */
static int walk_beneath(int dirfd, const char *realdir, const char *relpath,
			int *fd, struct stat *st)
{
	struct walk w = {.depth = 0};
	char target[PATH_MAX];
	unsigned links = 0;
	int rc = 0, cfd = -1;
	char *p;

	w.fds[0] = dirfd;
	w.path = strdup(relpath);
	if (!w.path)
		return -ENOMEM;
	for (p = w.path;;) {
		char *name, *slash;
		ssize_t len;

		while (*p == '/')
			p++;
		if (!*p) {
			rc = -EISDIR; /* the path names a directory */
			goto out;
		}
		name = p;
		slash = strchr(name, '/');
		p = slash ? slash + 1 : name + strlen(name);
		if (slash)
			*slash = '\0';
		while (*p == '/')
			p++;
		if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
			if (name[1] && !w.depth) {
				rc = -EXDEV;
				goto out;
			}
			if (name[1])
				walk_pop_to(&w, w.depth - 1);
			continue;
		}
		cfd = openat(w.fds[w.depth], name,
			     O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (cfd < 0 || fstat(cfd, st) < 0) {
			rc = -errno;
			goto out;
		}
		if (S_ISLNK(st->st_mode)) {
			len = readlinkat(cfd, "", target, sizeof(target));
			rc = len < 0 ? -errno : 0;
			if (!rc && ++links > MAX_SYMLINKS)
				rc = -ELOOP;
			if (!rc && (size_t)len >= sizeof(target))
				rc = -ENAMETOOLONG;
			if (rc)
				goto out;
			target[len] = '\0';
			close(cfd);
			cfd = -1;
			rc = walk_splice(&w, realdir, target, p);
			if (rc)
				goto out;
			p = w.path;
			continue;
		}
		if (!*p) {
			/* the last component */
			*fd = -1;
			if (S_ISREG(st->st_mode))
				rc = reopen_regular(w.fds[w.depth], name, st,
						    fd);
			goto out;
		}
		if (!S_ISDIR(st->st_mode)) {
			rc = -ENOTDIR;
			goto out;
		}
		if (w.depth + 1 >= MAX_DEPTH) {
			rc = -ENAMETOOLONG;
			goto out;
		}
		w.fds[++w.depth] = cfd;
		cfd = -1;
	}
out:
	if (cfd >= 0)
		close(cfd);
	walk_pop_to(&w, 0);
	free(w.path);
	return rc;
}

/* Whether openat2() is known to be missing (ENOSYS once): then every later
 * open goes straight to the walk.  Any thread may set it. */
static int openat2_missing;

/* flx_build_open() below dirfd (realdir its realpath), by the walk alone
 * when walk_only; also what reopens a file of the fd table. */
int open_beneath(int dirfd, const char *realdir, bool walk_only,
		 const char *relpath, int *fd_out, struct stat *st)
{
	int pfd = -1, fd = -1, rc = -ENOSYS;

	if (!walk_only &&
	    !__atomic_load_n(&openat2_missing, __ATOMIC_RELAXED)) {
		rc = openat2_beneath(dirfd, relpath, O_PATH | O_CLOEXEC, &pfd);
		if (rc == -ENOSYS)
			__atomic_store_n(&openat2_missing, 1, __ATOMIC_RELAXED);
	}
	/* EXDEV: maybe an absolute symlink to inside, which the walk
	 * allows; EAGAIN: openat2() could not rule out a race on "..";
	 * EPERM: a seccomp filter that refuses system calls it does not
	 * know (an O_PATH lookup needs no permission on the file itself). */
	if (rc == -ENOSYS || rc == -EXDEV || rc == -EAGAIN || rc == -EPERM)
		return walk_beneath(dirfd, realdir, relpath, fd_out, st);
	if (rc)
		return rc;
	if (fstat(pfd, st) < 0) {
		rc = -errno;
		goto out;
	}
	if (S_ISREG(st->st_mode)) {
		rc = openat2_beneath(dirfd, relpath, SOURCE_OPEN, &fd);
		if (!rc) {
			struct stat now;

			if (fstat(fd, &now) < 0 || now.st_dev != st->st_dev ||
			    now.st_ino != st->st_ino) {
				close(fd);
				fd = -1;
				rc = -ESTALE;
			}
		}
	}
	if (!rc)
		*fd_out = fd;
out:
	close(pfd);
	return rc;
}

int flx_build_open(flx_build *b, const char *relpath, int *fd_out,
		   struct stat *st)
{
	return open_beneath(b->dirfd, b->realdir, b->walk_only, relpath, fd_out,
			    st);
}

/* flx_build_read_whole() of a file the backend serves: -ENOENT when it
 * does not, else 0 and *buf_out, or -errno with err. */
static int read_whole_remote(flx_build *b, const char *relpath, uint64_t max,
			     void **buf_out, size_t *len_out, int64_t *mtime_ns,
			     flx_error *err)
{
	const flx_file_backend *be = b->c->backend;
	flx_file_span sp;
	unsigned char *buf;
	uint64_t size;
	uint32_t id;
	char most[32];
	int rc = be->lookup(be->ctx, relpath, &id, &size, mtime_ns);

	if (rc)
		return rc;
	if (size > max) {
		fmt_pow2(most, sizeof(most), max);
		return flx_error_set(err, -EINVAL, relpath, NULL,
				     "not a regular file of at most %s", most);
	}
	buf = whole_alloc((size_t)size + 1);
	if (!buf)
		return -ENOMEM;
	sp = (flx_file_span){id, 0, buf, (size_t)size};
	rc = be->read(be->ctx, &sp, 1);
	if (rc) {
		free(buf);
		return flx_error_set(err, rc, relpath, NULL,
				     "cannot read from the node holding it: "
				     "%s",
				     strerror(-rc));
	}
	buf[size] = '\0';
	*buf_out = buf;
	*len_out = (size_t)size;
	return 0;
}

/* flx_build_open_whole(); remote: whether a file the remote backend
 * serves is read from it (flx_build_read_whole()) or left to the caller
 * (-EREMOTE, nothing in err). */
static int open_whole(flx_build *b, const char *relpath, uint64_t max,
		      const char *missing, bool remote, void **buf_out,
		      size_t *len_out, int *fd_out, uint64_t *size_out,
		      int64_t *mtime_ns, flx_error *err)
{
	struct stat st;
	flx_access access;
	char most[32];
	int fd = -1, rc = flx_build_open(b, relpath, &fd, &st);

	if (rc == -EXDEV)
		return flx_error_set(err, -EINVAL, relpath, NULL,
				     "resolves outside the checkpoint "
				     "directory (symlink)");
	if (rc == -ENOENT && b->c->backend) {
		if (!remote)
			return -EREMOTE;
		rc = read_whole_remote(b, relpath, max, buf_out, len_out,
				       mtime_ns, err);
		if (rc != -ENOENT)
			return rc ? rc : 1;
	}
	if (rc == -ENOENT && missing)
		return flx_error_set(err, rc, relpath, NULL, "%s", missing);
	if (rc)
		return flx_error_set(err, rc, relpath, NULL, "cannot open: %s",
				     strerror(-rc));
	if (fd < 0 || (uint64_t)st.st_size > max) {
		fmt_pow2(most, sizeof(most), max);
		rc = flx_error_set(err, -EINVAL, relpath, NULL,
				   "not a regular file of at most %s", most);
		if (fd >= 0)
			close(fd);
		return rc;
	}
	*fd_out = fd;
	*size_out = (uint64_t)st.st_size;
	*mtime_ns = flx_mtime_ns(&st);
	/* the metadata file's owner and group rather than the directory's */
	access = flx_access_of(&st);
	flx_access_meet(&access, &b->c->access);
	b->c->access = access;
	return 0;
}

int flx_build_open_whole(flx_build *b, const char *relpath, uint64_t max,
			 const char *missing, int *fd, uint64_t *size,
			 int64_t *mtime_ns, flx_error *err)
{
	return open_whole(b, relpath, max, missing, false, NULL, NULL, fd, size,
			  mtime_ns, err);
}

int flx_build_read_whole(flx_build *b, const char *relpath, uint64_t max,
			 const char *missing, void **buf_out, size_t *len_out,
			 int64_t *mtime_ns, flx_error *err)
{
	unsigned char *buf = NULL;
	uint64_t size = 0;
	int64_t mt = 0;
	int fd = -1, rc = open_whole(b, relpath, max, missing, true, buf_out,
				     len_out, &fd, &size, &mt, err);

	if (rc)
		return rc > 0 ? 0 : rc;
	buf = whole_alloc((size_t)size + 1);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	rc = flx_pread_full(fd, buf, (size_t)size, 0);
	if (rc) {
		rc = flx_error_set(err, rc, relpath, NULL, "read failed: %s",
				   strerror(-rc));
		goto out;
	}
	buf[size] = '\0';
	*buf_out = buf;
	*len_out = (size_t)size;
	*mtime_ns = mt;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return rc;
}

int flx_build_load_pickle(flx_build *b, const char *relpath, uint64_t max,
			  const char *missing, int64_t *mtime_ns,
			  unsigned nattempt, flx_pickle_attempt attempt,
			  void (*reset)(void *ctx), void *ctx, flx_pickle **pk,
			  flx_error *err)
{
	static const flx_pickle_limits buf_lim = {0};
	const flx_pickle_limits win_lim = {.max_copy = max, .max_str = max};
	flx_fd_reader fctx;
	flx_reader r;
	void *meta = NULL;
	size_t meta_len = 0;
	uint64_t size = 0;
	int fd = -1;
	int rc = flx_build_open_whole(b, relpath, max, missing, &fd, &size,
				      mtime_ns, err);

	if (rc == -EREMOTE) {
		rc = flx_build_read_whole(b, relpath, max, missing, &meta,
					  &meta_len, mtime_ns, err);
		if (!rc)
			rc = flx_pickle_load(meta, meta_len, relpath, &buf_lim,
					     pk, err);
		goto out;
	}
	if (rc)
		goto out;
	flx_reader_fd(&r, &fctx, fd, 0, size);
	rc = -EAGAIN;
	for (unsigned k = 0; k <= nattempt && rc == -EAGAIN; k++) {
		if (k) {
			reset(ctx);
			if (err)
				flx_error_init(err);
		}
		rc = k < nattempt ? attempt(ctx, k, &r, &win_lim, pk)
				  : flx_pickle_load_reader(&r, relpath,
							   &win_lim, pk, err);
	}
out:
	free(meta);
	if (fd >= 0)
		close(fd);
	return rc;
}

/* relpath -> index into files, so that recording a file stays linear in
 * the number of references (torch 1.13 writes one file per item). */
static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	while (*s)
		h = (h ^ (unsigned char)*s++) * 1099511628211ull;
	return h;
}

int file_index_lookup(const flx_build *b, const char *relpath)
{
	if (!b->fmap_cap)
		return -1;
	for (size_t i = hash_str(relpath) & (b->fmap_cap - 1);;
	     i = (i + 1) & (b->fmap_cap - 1)) {
		int v = b->fmap[i];

		if (v < 0)
			return -1;
		if (strcmp(b->c->files[v].relpath, relpath) == 0)
			return v;
	}
}

int file_index_add(flx_build *b, int idx)
{
	if (2 * (size_t)(idx + 1) > b->fmap_cap) {
		size_t cap = b->fmap_cap ? 2 * b->fmap_cap : 64;
		int *m = malloc(cap * sizeof(int));

		if (!m)
			return -ENOMEM;
		memset(m, 0xff, cap * sizeof(int));
		free(b->fmap);
		b->fmap = m;
		b->fmap_cap = cap;
		for (int k = 0; k < idx; k++)
			file_index_add(b, k);
	}
	for (size_t i = hash_str(b->c->files[idx].relpath) & (b->fmap_cap - 1);;
	     i = (i + 1) & (b->fmap_cap - 1))
		if (b->fmap[i] < 0) {
			b->fmap[i] = idx;
			return 0;
		}
}

/* follow_symlinks: relpath opened through its symlinks wherever they
 * lead; fd -1 when it is no regular file.  @return 0 or -errno. */
int open_followed(flx_build *b, const char *relpath, int *fd, struct stat *st)
{
	*fd = openat(b->dirfd, relpath, SOURCE_OPEN);
	if (*fd < 0)
		return -errno;
	if (fstat(*fd, st) == 0 && S_ISREG(st->st_mode))
		return 0;
	close(*fd);
	*fd = -1;
	return 0;
}
