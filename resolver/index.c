/* SPDX-License-Identifier: MIT */
/*
 * The global index and its format-neutral builder (source.h): opening a
 * checkpoint directory, choosing its source, and everything a source needs
 * that does not depend on its format: the file table, chunk validation,
 * the item workers, read-ahead, extras and the name index.
 *
 * Everything is validated at open so a mount either fails with one precise
 * line or serves a checkpoint whose every chunk byte lies inside a file that
 * was present and long enough.
 */
#include "ckpt.h"
#include "grow.h"
#include "reader.h"
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
	/* files that keep their descriptor from the open; the others go to
	 * the fd table of fd_slots slots (fd_budget()) */
	size_t fd_keep, fd_slots, nkept;
};

int64_t flx_mtime_ns(const struct stat *st)
{
	return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

flx_ckpt *flx_build_ckpt(flx_build *b)
{
	return b->c;
}

const char *flx_build_entered(const flx_build *b)
{
	return b->entered;
}

int flx_build_dirfd(const flx_build *b)
{
	return b->dirfd;
}

void flx_build_items(flx_build *b, const flx_item_ops *ops)
{
	b->items = ops;
}

void flx_build_names_from(flx_build *b, const char *from, const char *where)
{
	b->names_from = from;
	b->names_where = where;
}

/* ---- chunks ---- */

/* Bytes of n chunks of t and their dims block; never an empty dims block:
 * chunk pointers must be valid even for 0-d tensors, where nothing is read
 * through them. */
static size_t chunks_bytes(const flx_tensor *t, uint32_t n)
{
	size_t ndims = (size_t)n * 3 * (size_t)t->ndim;

	_Static_assert(sizeof(flx_chunk) % sizeof(int64_t) == 0,
		       "dims follow the chunks, aligned");
	return (size_t)n * sizeof(flx_chunk) +
	       (ndims ? ndims : 1) * sizeof(int64_t);
}

/* Lay n chunks out in ch (zeroed, chunks_bytes() long). */
static void place_chunks(flx_tensor *t, uint32_t n, flx_chunk *ch)
{
	size_t per = 3 * (size_t)t->ndim;

	t->chunks = ch;
	t->dims = (int64_t *)(ch + n);
	for (uint32_t i = 0; i < n; i++) {
		int64_t *d = t->dims + i * per;

		ch[i].off = d;
		ch[i].size = d + t->ndim;
		ch[i].stride = d + 2 * t->ndim;
	}
}

int flx_tensor_alloc_chunks(flx_tensor *t, uint32_t n)
{
	flx_chunk *ch = calloc(1, chunks_bytes(t, n));

	if (!ch)
		return -ENOMEM;
	place_chunks(t, n, ch);
	return 0;
}

int flx_tensor_pool_chunks(flx_pool *pool, flx_tensor *t, uint32_t n)
{
	flx_chunk *ch = flx_pool_alloc(pool, chunks_bytes(t, n));

	if (!ch)
		return -ENOMEM;
	place_chunks(t, n, ch);
	t->nchunks = n;
	return 0;
}

int flx_chunk_contig_from(int ndim, const flx_chunk *ch)
{
	int64_t expect = 1;
	int k = ndim;

	while (k > 0) {
		int64_t sz = ch->size[k - 1];

		if (sz != 1 && ch->stride[k - 1] != expect)
			break;
		expect *= sz;
		k--;
	}
	return k;
}

static int cmp_chunk_axis0(const void *pa, const void *pb, void *axis)
{
	const flx_chunk *a = *(flx_chunk *const *)pa;
	const flx_chunk *b = *(flx_chunk *const *)pb;
	int d = *(int *)axis;

	return a->off[d] < b->off[d] ? -1 : a->off[d] > b->off[d];
}

static bool chunks_overlap(int ndim, const flx_chunk *a, const flx_chunk *b)
{
	for (int d = 0; d < ndim; d++)
		if (a->off[d] >= b->off[d] + b->size[d] ||
		    b->off[d] >= a->off[d] + a->size[d])
			return false;
	return true;
}

/*
 * Disjointness is checked with a sweep along the axis of greatest extent
 * (sorted starts; an active list of chunks that still extend past the
 * sweep position), not a comparison of all pairs; coverage then follows
 * from the volumes adding up.
 */
int flx_tensor_check_chunks(const flx_tensor *t, const char *from,
			    flx_error *err)
{
	uint64_t total = flx_numel(t->ndim, t->shape), sum = 0;
	flx_chunk **order = NULL, **active = NULL;
	size_t nactive = 0;
	int axis = 0, rc = 0;
	char o[96];

	for (uint32_t i = 0; i < t->nchunks; i++) {
		const flx_chunk *ch = &t->chunks[i];
		uint64_t v = 1;

		for (int d = 0; d < t->ndim; d++) {
			if (ch->off[d] > t->shape[d] ||
			    ch->size[d] > t->shape[d] - ch->off[d]) {
				flx_fmt_dims(o, sizeof(o), t->ndim, ch->off);
				return flx_error_set(err, -EINVAL, from, t->fqn,
						     "chunk at %s lies outside "
						     "the global shape",
						     o);
			}
			v *= (uint64_t)ch->size[d];
		}
		/* Every chunk lies inside, so a surplus can only be overlap;
		 * the sweep below names the chunk. */
		if (__builtin_add_overflow(sum, v, &sum))
			sum = UINT64_MAX;
	}
	if (sum < total)
		return flx_error_set(err, -EINVAL, from, t->fqn,
				     "chunks cover %llu of %llu elements",
				     (unsigned long long)sum,
				     (unsigned long long)total);
	if (t->nchunks < 2)
		return 0;
	for (int d = 1; d < t->ndim; d++)
		if (t->shape[d] > t->shape[axis])
			axis = d;
	order = malloc(t->nchunks * sizeof(*order));
	active = malloc(t->nchunks * sizeof(*active));
	if (!order || !active) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < t->nchunks; i++)
		order[i] = &t->chunks[i];
	if (t->ndim > 0)
		qsort_r(order, t->nchunks, sizeof(*order), cmp_chunk_axis0,
			&axis);
	for (uint32_t i = 0; i < t->nchunks; i++) {
		flx_chunk *ch = order[i];
		size_t keep = 0;

		if (flx_numel(t->ndim, ch->size) == 0)
			continue; /* empty chunks overlap nothing */
		for (size_t j = 0; j < nactive; j++) {
			flx_chunk *a = active[j];

			if (t->ndim == 0 ||
			    a->off[axis] + a->size[axis] > ch->off[axis]) {
				if (chunks_overlap(t->ndim, a, ch)) {
					flx_fmt_dims(o, sizeof(o), t->ndim,
						     ch->off);
					rc = flx_error_set(
					    err, -EINVAL, from, t->fqn,
					    "chunk at %s overlaps another "
					    "chunk",
					    o);
					goto out;
				}
				active[keep++] = a;
			}
		}
		nactive = keep;
		active[nactive++] = ch;
	}
	if (sum != total)
		rc = flx_error_set(err, -EINVAL, from, t->fqn,
				   "chunks hold %llu elements, the tensor %llu",
				   (unsigned long long)sum,
				   (unsigned long long)total);
out:
	free(order);
	free(active);
	return rc;
}

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
static int open_beneath(int dirfd, const char *realdir, bool walk_only,
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

int flx_build_read_whole(flx_build *b, const char *relpath, uint64_t max,
			 const char *missing, void **buf_out, size_t *len_out,
			 int64_t *mtime_ns, flx_error *err)
{
	struct stat st;
	flx_access access;
	unsigned char *buf = NULL;
	char most[32];
	int fd = -1, rc = flx_build_open(b, relpath, &fd, &st);

	if (rc == -EXDEV)
		return flx_error_set(err, -EINVAL, relpath, NULL,
				     "resolves outside the checkpoint "
				     "directory (symlink)");
	if (rc == -ENOENT && b->c->backend) {
		rc = read_whole_remote(b, relpath, max, buf_out, len_out,
				       mtime_ns, err);
		if (rc != -ENOENT)
			return rc;
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
		goto out;
	}
	buf = whole_alloc((size_t)st.st_size + 1);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	rc = flx_pread_full(fd, buf, (size_t)st.st_size, 0);
	if (rc) {
		rc = flx_error_set(err, rc, relpath, NULL, "read failed: %s",
				   strerror(-rc));
		goto out;
	}
	buf[st.st_size] = '\0';
	*buf_out = buf;
	*len_out = (size_t)st.st_size;
	*mtime_ns = flx_mtime_ns(&st);
	/* the metadata file's owner and group rather than the directory's */
	access = flx_access_of(&st);
	flx_access_meet(&access, &b->c->access);
	b->c->access = access;
	buf = NULL;
out:
	free(buf);
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

static int file_index_lookup(const flx_build *b, const char *relpath)
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

static int file_index_add(flx_build *b, int idx)
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
static int open_followed(flx_build *b, const char *relpath, int *fd,
			 struct stat *st)
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

/* ---- the fd table ---- */

/*
 * The files past the descriptor budget (flx_file.fd -1) are opened on use
 * and their descriptors kept in a bounded number of slots; a clock hand
 * over the slots closes the least recently used one no caller holds
 * (pinned: acquired, not yet released) when a slot is needed.  When every
 * slot is pinned, a file is opened outside them and closed at its last
 * release: no caller ever waits for another, at the cost of descriptors
 * past the budget (the reserve).  Every open checks the file against the
 * identity recorded at mount.  One mutex; opens happen under it (only
 * files past the budget pay for it).
 */
#define NO_SLOT	   UINT32_MAX
#define FD_RESERVE 64 /* /dev/fuse, splice pipes, threads, stdio */
#define TEST_SLOTS 4  /* flx_ckpt_opts.keep_fds */

typedef struct fdt_entry {
	int fd;	       /* -1: closed */
	uint32_t pins; /* acquired, not yet released */
	uint32_t slot; /* its slot, or NO_SLOT: opened outside them */
	bool ref;      /* used since the hand last passed it */
} fdt_entry;

typedef struct flx_fdtable flx_fdtable;

struct flx_fdtable {
	pthread_mutex_t mu;
	int dirfd; /* the checkpoint directory (owned), as at mount */
	char *realdir;
	bool walk_only;
	uint32_t *slots; /* the file in each slot, or NO_SLOT */
	size_t nslots, used, hand;
	fdt_entry *e; /* per file of the checkpoint (ne of them so far) */
	size_t ne;
};

/* How many files keep their descriptor from the open (*keep) and how many
 * slots the table gets, from RLIMIT_NOFILE's soft limit less a reserve
 * (or the test's keep_fds). */
static void fd_budget(unsigned keep_fds, size_t *keep, size_t *slots)
{
	struct rlimit rl;
	uint64_t lim = (uint64_t)1 << 20, avail;

	if (keep_fds) {
		*keep = keep_fds;
		*slots = TEST_SLOTS;
		return;
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < lim)
		lim = rl.rlim_cur;
	avail = lim > FD_RESERVE + 32 ? lim - FD_RESERVE : 32;
	*slots = avail / 8 > 16 ? (size_t)(avail / 8) : 16;
	*keep = (size_t)(avail - *slots);
}

/* The table of b's checkpoint, made at the first file past the budget. */
static int fdtable_new(flx_build *b)
{
	flx_fdtable *t;

	if (b->c->fdt)
		return 0;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->dirfd = fcntl(b->dirfd, F_DUPFD_CLOEXEC, 0);
	t->realdir = strdup(b->realdir);
	t->slots = malloc(b->fd_slots * sizeof(uint32_t));
	if (t->dirfd < 0 || !t->realdir || !t->slots ||
	    pthread_mutex_init(&t->mu, NULL)) {
		if (t->dirfd >= 0)
			close(t->dirfd);
		free(t->realdir);
		free(t->slots);
		free(t);
		return -ENOMEM;
	}
	t->nslots = b->fd_slots;
	t->walk_only = b->walk_only;
	b->c->fdt = t;
	return 0;
}

static void fdtable_free(flx_fdtable *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->ne; i++)
		if (t->e[i].fd >= 0)
			close(t->e[i].fd);
	pthread_mutex_destroy(&t->mu);
	close(t->dirfd);
	free(t->realdir);
	free(t->slots);
	free(t->e);
	free(t);
}

/* A slot for a file about to be opened: a free one, else the first
 * unpinned one the hand finds unused since it last passed (its file
 * closed), else NO_SLOT. */
static uint32_t fdt_slot(flx_fdtable *t)
{
	if (t->used < t->nslots)
		return (uint32_t)t->used++;
	for (size_t step = 0; step < 2 * t->nslots; step++) {
		size_t s = t->hand;
		uint32_t j = t->slots[s];

		t->hand = (t->hand + 1) % t->nslots;
		if (j == NO_SLOT)
			return (uint32_t)s;
		if (t->e[j].pins)
			continue;
		if (t->e[j].ref) {
			t->e[j].ref = false;
			continue;
		}
		close(t->e[j].fd);
		t->e[j].fd = -1;
		t->e[j].slot = NO_SLOT;
		t->slots[s] = NO_SLOT;
		return (uint32_t)s;
	}
	return NO_SLOT;
}

static bool same_identity(const flx_file *f, const struct stat *st);

/* Open file i of c into its entry (closed), in a slot if one is free. */
static int fdt_open(flx_fdtable *t, const flx_ckpt *c, uint32_t i)
{
	const flx_file *f = &c->files[i];
	uint32_t slot = fdt_slot(t);
	struct stat st;
	int fd = -1, rc = open_beneath(t->dirfd, t->realdir, t->walk_only,
				       f->relpath, &fd, &st);

	if (!rc && (fd < 0 || !same_identity(f, &st)))
		rc = -ESTALE;
	if (rc) {
		if (fd >= 0)
			close(fd);
		if (slot != NO_SLOT)
			t->slots[slot] = NO_SLOT;
		return rc;
	}
	t->e[i].fd = fd;
	t->e[i].slot = slot;
	if (slot != NO_SLOT)
		t->slots[slot] = i;
	return 0;
}

/* Entries for every file of c (their number is final once the items are
 * read, before any read needs them). */
static int fdt_cover(flx_fdtable *t, size_t n)
{
	fdt_entry *e;

	if (n <= t->ne)
		return 0;
	e = realloc(t->e, n * sizeof(*e));
	if (!e)
		return -ENOMEM;
	for (size_t k = t->ne; k < n; k++)
		e[k] = (fdt_entry){-1, 0, NO_SLOT, false};
	t->e = e;
	t->ne = n;
	return 0;
}

/* flx_fdtable_acquire(), or, when !may_open, -ENOENT for a file not open
 * now (nothing to check that a later open would not). */
static int fdt_acquire(const flx_ckpt *c, uint32_t i, bool may_open, int *fd)
{
	flx_fdtable *t = c->fdt;
	int rc;

	if (!t || i >= c->nfiles)
		return -EBADF;
	pthread_mutex_lock(&t->mu);
	rc = fdt_cover(t, c->nfiles);
	if (!rc && t->e[i].fd < 0)
		rc = may_open ? fdt_open(t, c, i) : -ENOENT;
	if (!rc) {
		t->e[i].pins++;
		t->e[i].ref = true;
		*fd = t->e[i].fd;
	}
	pthread_mutex_unlock(&t->mu);
	return rc;
}

int flx_fdtable_acquire(const flx_ckpt *c, uint32_t i, int *fd)
{
	if (i < c->nfiles && c->files[i].remote)
		return -EREMOTE;
	return fdt_acquire(c, i, true, fd);
}

void flx_fdtable_release(const flx_ckpt *c, uint32_t i)
{
	flx_fdtable *t = c->fdt;
	fdt_entry *e;

	if (!t)
		return;
	pthread_mutex_lock(&t->mu);
	e = i < t->ne ? &t->e[i] : NULL;
	if (e && e->pins && --e->pins == 0 && e->slot == NO_SLOT &&
	    e->fd >= 0) {
		close(e->fd);
		e->fd = -1;
	}
	pthread_mutex_unlock(&t->mu);
}

int flx_file_pread(const flx_ckpt *c, uint32_t i, void *buf, size_t n,
		   uint64_t off)
{
	flx_file_span one = {i, off, buf, n};

	return flx_file_read_spans(c, &one, 1);
}

int flx_file_preadv(const flx_ckpt *c, uint32_t i, struct iovec *iov,
		    int iovcnt, uint64_t off)
{
	flx_file_span sp[64];
	int fd, rc = 0;

	if (!c->files[i].remote) {
		rc = flx_file_acquire(c, i, &fd);
		if (rc)
			return rc;
		rc = flx_preadv_full(fd, iov, iovcnt, off);
		flx_file_release(c, i);
		return rc;
	}
	while (iovcnt > 0 && !rc) {
		int k = iovcnt < 64 ? iovcnt : 64;

		for (int j = 0; j < k; j++) {
			sp[j] = (flx_file_span){i, off, iov[j].iov_base,
						iov[j].iov_len};
			off += iov[j].iov_len;
		}
		rc = flx_file_read_spans(c, sp, (size_t)k);
		iov += k;
		iovcnt -= k;
	}
	return rc;
}

static int file_reader_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	const flx_file_reader *fr = ctx;

	return flx_file_pread(fr->c, fr->file, buf, n, fr->base + off);
}

void flx_reader_file(flx_reader *r, flx_file_reader *ctx, const flx_ckpt *c,
		     uint32_t i, uint64_t base, uint64_t len)
{
	*ctx = (flx_file_reader){c, i, base};
	*r = (flx_reader){file_reader_pread, ctx, len};
}

/* The remote spans of s, with the backend's ids, in one backend call. */
static int read_remote_spans(const flx_ckpt *c, const flx_file_span *s,
			     size_t n, size_t nremote)
{
	flx_file_span *r = malloc(nremote * sizeof(*r));
	size_t k = 0;
	int rc;

	if (!r)
		return -ENOMEM;
	for (size_t j = 0; j < n; j++)
		if (c->files[s[j].file].remote) {
			r[k] = s[j];
			r[k++].file = c->files[s[j].file].remote_id;
		}
	rc = c->backend->read(c->backend->ctx, r, k);
	free(r);
	return rc;
}

int flx_file_read_spans(const flx_ckpt *c, const flx_file_span *s, size_t n)
{
	size_t nremote = 0;
	int fd, rc = 0;

	for (size_t j = 0; j < n && !rc; j++) {
		if (c->files[s[j].file].remote) {
			nremote++;
			continue;
		}
		rc = flx_file_acquire(c, s[j].file, &fd);
		if (rc)
			break;
		rc = flx_pread_full(fd, s[j].buf, s[j].len, s[j].off);
		flx_file_release(c, s[j].file);
	}
	if (!rc && nremote)
		rc = c->backend ? read_remote_spans(c, s, n, nremote) : -EIO;
	return rc;
}

/* Record relpath as a file of the backend (the directory lacks it). */
static int add_remote_file(flx_build *b, const char *relpath, bool data,
			   uint32_t *idx)
{
	flx_ckpt *c = b->c;
	flx_file *f = &c->files[c->nfiles];
	uint32_t id;
	uint64_t size;
	int64_t mtime_ns;
	int rc =
	    c->backend->lookup(c->backend->ctx, relpath, &id, &size, &mtime_ns);

	if (rc)
		return rc;
	memset(f, 0, sizeof(*f));
	f->relpath = strdup(relpath);
	if (!f->relpath)
		return -ENOMEM;
	f->fd = -1;
	f->size = size;
	f->mtime_ns = mtime_ns;
	f->ctime_ns = mtime_ns;
	f->access = c->access; /* the directory's, as nothing else says */
	f->data = data;
	f->remote = true;
	f->remote_id = id;
	*idx = (uint32_t)c->nfiles++;
	return file_index_add(b, (int)*idx);
}

/* Open and record a file of the directory; key names the tensor or value
 * that needs it (NULL for extras), for messages. */
static int add_file(flx_build *b, const char *relpath, bool data,
		    const char *key, uint32_t *idx)
{
	flx_ckpt *c = b->c;
	struct stat st;
	flx_file *f;
	bool followed, keep;
	int fd = -1, rc;

	if (flx_grow((void **)&c->files, &b->cap_files, c->nfiles + 1,
		     sizeof(flx_file)))
		return -ENOMEM;
	rc = flx_build_open(b, relpath, &fd, &st);
	followed = rc == -EXDEV && b->follow;
	if (followed)
		rc = open_followed(b, relpath, &fd, &st);
	if (rc == -ENOENT && c->backend) {
		rc = add_remote_file(b, relpath, data, idx);
		if (rc == -ENOENT)
			return flx_error_set(b->err, rc, relpath, key,
					     "held by no node (missing "
					     "everywhere)");
		return rc;
	}
	if (rc == -EXDEV)
		return flx_error_set(b->err, -EINVAL, relpath, key,
				     "resolves outside the checkpoint "
				     "directory (symlink)");
	if (rc)
		return flx_error_set(b->err, rc, relpath, key,
				     "cannot open: %s", strerror(-rc));
	if (fd < 0) {
		rc = flx_error_set(b->err, -EINVAL, relpath, key,
				   "not a regular file");
		goto out;
	}
	/* past the budget: closed at out, opened on use; a file reached
	 * through symlinks outside the directory keeps its descriptor (the
	 * reopen resolves beneath the directory only) */
	keep = b->nkept < b->fd_keep || followed;
	rc = keep ? 0 : fdtable_new(b);
	if (rc)
		goto out;
	f = &c->files[c->nfiles];
	memset(f, 0, sizeof(*f));
	f->relpath = strdup(relpath);
	if (!f->relpath) {
		rc = -ENOMEM;
		goto out;
	}
	f->fd = -1;
	if (keep) {
		f->fd = fd;
		fd = -1;
		b->nkept++;
	}
	flx_file_identity(f, &st);
	f->data = data;
	*idx = (uint32_t)c->nfiles++;
	rc = file_index_add(b, (int)*idx);
	/* No POSIX_FADV_RANDOM: views end up reading every source byte, so
	 * the kernel's readahead is never wasted and keeps cold sequential
	 * reads streaming. */
out:
	if (fd >= 0)
		close(fd);
	return rc;
}

bool flx_build_remote(const flx_build *b, const char *relpath)
{
	const flx_file_backend *be = b->c->backend;
	uint32_t id;
	uint64_t size;
	int64_t mtime_ns;

	return be && be->lookup(be->ctx, relpath, &id, &size, &mtime_ns) == 0;
}

const char *flx_build_remote_name(const flx_build *b, uint32_t id)
{
	const flx_file_backend *be = b->c->backend;

	return be ? be->name(be->ctx, id) : NULL;
}

int flx_build_data_file(flx_build *b, const char *relpath,
			const flx_file_ref *ref, uint32_t *idx)
{
	int known = file_index_lookup(b, relpath);

	if (known >= 0) {
		*idx = (uint32_t)known;
		return 0;
	}
	if (!flx_relpath_ok(relpath))
		return flx_error_set(b->err, -EINVAL, ref->from, ref->key,
				     "%s '%s' leaves the checkpoint directory",
				     ref->field, relpath);
	return add_file(b, relpath, true, ref->key, idx);
}

int flx_build_decoded_file(flx_build *b, const char *name, int fd,
			   uint32_t *idx)
{
	flx_ckpt *c = b->c;
	struct stat st;
	flx_file *f;

	if (fstat(fd, &st) < 0) {
		int rc = -errno;

		close(fd);
		return rc;
	}
	if (flx_grow((void **)&c->files, &b->cap_files, c->nfiles + 1,
		     sizeof(flx_file))) {
		close(fd);
		return -ENOMEM;
	}
	f = &c->files[c->nfiles];
	memset(f, 0, sizeof(*f));
	f->relpath = strdup(name);
	if (!f->relpath) {
		close(fd);
		return -ENOMEM;
	}
	f->fd = fd;
	flx_file_identity(f, &st);
	f->data = true;
	f->decoded = true;
	*idx = (uint32_t)c->nfiles++;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether the extra name, a symlink, is served: it leads to a regular file
 * inside the directory, or anywhere with follow_symlinks; otherwise it is
 * added to the ckpt's skipped_links.  @return 0 and *serve, or -ENOMEM. */
static int symlinked_extra(flx_build *b, const char *name, bool *serve)
{
	flx_ckpt *c = b->c;
	struct stat st;
	size_t len = c->skipped_links ? strlen(c->skipped_links) : 0;
	char *grown;
	int fd = -1, rc = flx_build_open(b, name, &fd, &st);

	if (rc == -EXDEV && b->follow)
		rc = open_followed(b, name, &fd, &st);
	*serve = rc == 0 && fd >= 0;
	if (fd >= 0)
		close(fd);
	if (*serve)
		return 0;
	grown = realloc(c->skipped_links, len + strlen(name) + 3);
	if (!grown)
		return -ENOMEM;
	sprintf(grown + len, "%s%s", len ? ", " : "", name);
	c->skipped_links = grown;
	c->nskipped_links++;
	return 0;
}

/* The backend's files that would be extras (top-level, not hidden, not
 * the source's), appended to names: every node then serves the same
 * extras, wherever they lie.  @return 0 or -ENOMEM. */
static int backend_extras(flx_build *b, char ***names, size_t *n, size_t *cap)
{
	const flx_file_backend *be = b->c->backend;
	const char *name;

	for (uint32_t id = 0; be && (name = be->name(be->ctx, id)); id++) {
		if (name[0] == '.' || strchr(name, '/') || b->src->owns(name))
			continue;
		if (flx_grow((void **)names, cap, *n + 1, sizeof(**names)))
			return -ENOMEM;
		if (!((*names)[*n] = strdup(name)))
			return -ENOMEM;
		(*n)++;
	}
	return 0;
}

/* The other regular files of the directory (not hidden; a symlink as
 * symlinked_extra() says), in name order: passed through unchanged
 * (config.json, tokenizer files). */
static int load_extras(flx_build *b)
{
	int fd = openat(b->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	int rc = 0;

	if (!d) {
		rc = flx_error_set(b->err, -errno, b->c->dir, NULL,
				   "cannot list the directory");
		goto out;
	}
	while ((de = readdir(d))) {
		struct stat st;

		if (de->d_name[0] == '.' || b->src->owns(de->d_name))
			continue;
		if (fstatat(b->dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
		    !(S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)))
			continue;
		if (flx_grow((void **)&names, &cap, n + 1, sizeof(*names))) {
			rc = -ENOMEM;
			goto out;
		}
		if (!(names[n] = strdup(de->d_name))) {
			rc = -ENOMEM;
			goto out;
		}
		n++;
	}
	rc = backend_extras(b, &names, &n, &cap);
	if (rc)
		goto out;
	if (n)
		qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n && !rc; i++) {
		struct stat st;
		bool serve = true;
		uint32_t idx;

		if (file_index_lookup(b, names[i]) >= 0 ||
		    (i && !strcmp(names[i], names[i - 1])))
			continue;
		if (fstatat(b->dirfd, names[i], &st, AT_SYMLINK_NOFOLLOW) ==
			0 &&
		    S_ISLNK(st.st_mode))
			rc = symlinked_extra(b, names[i], &serve);
		if (!rc && serve)
			rc = add_file(b, names[i], false, NULL, &idx);
	}
out:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (d)
		closedir(d); /* closes fd */
	else if (fd >= 0)
		close(fd);
	return rc;
}

/* ---- worker threads ---- */

void flx_run_parts(void *parts, size_t size, unsigned n, void *(*fn)(void *))
{
	pthread_t tid[FLX_MAX_THREADS];
	bool started[FLX_MAX_THREADS] = {false};
	char *p = parts;

	for (unsigned k = 1; k < n; k++)
		started[k] =
		    pthread_create(&tid[k], NULL, fn, p + k * size) == 0;
	fn(p);
	for (unsigned k = 1; k < n; k++) {
		if (started[k])
			pthread_join(tid[k], NULL);
		else
			fn(p + k * size);
	}
}

/*
 * Reading the items.  Every chunk's item is read (for DCP: its torch.save
 * zip directory and data.pkl) to check it against the metadata and to find
 * its data.  A checkpoint can hold tens of thousands of small items, so
 * they are visited in file order (the source's reads of neighbouring items
 * then share blocks) and, past ITEMS_PER_THREAD items, on several threads,
 * each over a contiguous run of that order with its own scratch.  Each
 * thread stops at its first failure; the failure reported is the first in
 * file order, as a single thread would find it.
 */
#define ITEMS_PER_THREAD 4096

typedef struct item_job {
	const flx_tensor *t;
	flx_chunk *ch;
} item_job;

typedef struct item_worker {
	const flx_ckpt *c;
	const flx_item_ops *ops;
	item_job *jobs;
	size_t lo, hi;
	bool thread; /* running on tid, joined by items_end() */
	bool ran;
	pthread_t tid;
	int rc;
	flx_error err;
} item_worker;

/* Items being read, from items_begin() to items_end(). */
struct flx_item_load {
	item_job *jobs;
	unsigned nt;
	item_worker w[FLX_MAX_THREADS];
};

static int cmp_job(const void *pa, const void *pb)
{
	const flx_chunk *a = ((const item_job *)pa)->ch;
	const flx_chunk *b = ((const item_job *)pb)->ch;

	if (a->file != b->file)
		return a->file < b->file ? -1 : 1;
	return a->item_off < b->item_off ? -1 : a->item_off > b->item_off;
}

/*
 * Fill jobs with every chunk of c in file order: by file, then by offset
 * in the file.  A rank writes its items in state-dict order, so bucketing
 * the chunks by file in tensor order (stable) nearly always leaves each
 * file's run sorted already; a run that is not gets sorted (a qsort of
 * every job would cost more than the bucketing).  @return 0, or -ENOMEM.
 */
static int order_jobs(const flx_ckpt *c, item_job *jobs)
{
	size_t *at = calloc(c->nfiles + 1, sizeof(*at));

	if (!at)
		return -ENOMEM;
	for (size_t i = 0; i < c->ntensors; i++)
		for (uint32_t k = 0; k < c->tensors[i].nchunks; k++)
			at[c->tensors[i].chunks[k].file + 1]++;
	for (size_t f = 0; f < c->nfiles; f++)
		at[f + 1] += at[f];
	for (size_t i = 0; i < c->ntensors; i++)
		for (uint32_t k = 0; k < c->tensors[i].nchunks; k++) {
			flx_chunk *ch = &c->tensors[i].chunks[k];

			jobs[at[ch->file]++] = (item_job){&c->tensors[i], ch};
		}
	/* at[f] is now the end of file f's run */
	for (size_t f = 0, lo = 0; f < c->nfiles; lo = at[f++])
		for (size_t j = lo + 1; j < at[f]; j++)
			if (jobs[j - 1].ch->item_off > jobs[j].ch->item_off) {
				qsort(jobs + lo, at[f] - lo, sizeof(*jobs),
				      cmp_job);
				break;
			}
	free(at);
	return 0;
}

static void *item_worker_run(void *arg)
{
	item_worker *w = arg;
	void *s = malloc(w->ops->scratch_size);

	w->ran = true;
	w->rc = s ? w->ops->scratch_init(s) : -ENOMEM;
	for (size_t i = w->lo; !w->rc && i < w->hi; i++)
		w->rc =
		    w->ops->load(w->c, s, w->jobs[i].t, w->jobs[i].ch, &w->err);
	if (s)
		w->ops->scratch_release(s);
	free(s);
	return NULL;
}

/* Threads for n items: by size and CPUs, or forced (flx_ckpt_opts.threads;
 * tests run the error corpus that way: the report must not change). */
static unsigned item_threads(unsigned force, size_t n)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t want = n / ITEMS_PER_THREAD;

	if (force)
		return force < n ? force : 1;
	if (cpus < 1)
		cpus = 1;
	if (want > (size_t)cpus)
		want = (size_t)cpus;
	if (want > FLX_MAX_THREADS)
		want = FLX_MAX_THREADS;
	return want ? (unsigned)want : 1;
}

/*
 * Start reading the items of b's index: workers 1.. on their own threads,
 * worker 0 too unless wait (then it runs here, before returning).  A
 * worker whose thread cannot start runs in items_end().  @return 0 and
 * *out (for items_end()), or -ENOMEM.
 */
static int items_begin(const flx_build *b, bool wait,
		       struct flx_item_load **out)
{
	const flx_ckpt *c = b->c;
	struct flx_item_load *ld = NULL;
	size_t n = 0;
	int rc = -ENOMEM;

	for (size_t i = 0; i < c->ntensors; i++)
		n += c->tensors[i].nchunks;
	ld = calloc(1, sizeof(*ld));
	if (!ld || !(ld->jobs = calloc(n ? n : 1, sizeof(item_job))))
		goto out;
	rc = order_jobs(c, ld->jobs);
	if (rc)
		goto out;
	ld->nt = item_threads(b->threads, n);
	for (unsigned k = 0; k < ld->nt; k++) {
		item_worker *w = &ld->w[k];

		*w = (item_worker){.c = c,
				   .ops = b->items,
				   .jobs = ld->jobs,
				   .lo = n * k / ld->nt,
				   .hi = n * (k + 1) / ld->nt};
		flx_error_init(&w->err);
	}
	for (unsigned k = wait; k < ld->nt; k++) {
		if (pthread_create(&ld->w[k].tid, NULL, item_worker_run,
				   &ld->w[k]))
			break;
		ld->w[k].thread = true;
	}
	if (wait)
		item_worker_run(&ld->w[0]);
	*out = ld;
	ld = NULL;
out:
	if (ld)
		free(ld->jobs);
	free(ld);
	return rc;
}

/* Wait for (or run) every worker, then free ld.  @return 0, or the first
 * failure in file order with err. */
static int items_end(struct flx_item_load *ld, flx_error *err)
{
	int rc = 0;

	for (unsigned k = 0; k < ld->nt; k++) {
		if (ld->w[k].thread)
			pthread_join(ld->w[k].tid, NULL);
		else if (!ld->w[k].ran)
			item_worker_run(&ld->w[k]);
	}
	for (unsigned k = 0; k < ld->nt && !rc; k++) {
		rc = ld->w[k].rc;
		if (rc && ld->w[k].err.code && err)
			*err = ld->w[k].err;
	}
	flx_error_default(err, rc, NULL);
	free(ld->jobs);
	free(ld);
	return rc;
}

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

static void prefetch_end(struct prefetch *pf)
{
	if (pf->started)
		pthread_join(pf->tid, NULL);
	pf->started = false;
}

/* ---- names ---- */

static int cmp_tensor_ptr(const void *a, const void *b)
{
	return strcmp((*(flx_tensor *const *)a)->fqn,
		      (*(flx_tensor *const *)b)->fqn);
}

/* Sorted view for flx_ckpt_find(), and the uniqueness of names. */
static int build_names(flx_build *b)
{
	flx_ckpt *c = b->c;
	const char **obj, *dup = NULL;
	size_t t = 0;
	int rc = 0;

	c->by_name =
	    malloc((c->ntensors ? c->ntensors : 1) * sizeof(*c->by_name));
	obj = malloc((c->nobjects ? c->nobjects : 1) * sizeof(*obj));
	if (!c->by_name || !obj) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < c->ntensors; i++)
		c->by_name[i] = &c->tensors[i];
	qsort(c->by_name, c->ntensors, sizeof(*c->by_name), cmp_tensor_ptr);
	for (size_t i = 0; i < c->nobjects; i++)
		obj[i] = c->objects[i].fqn;
	qsort(obj, c->nobjects, sizeof(*obj), cmp_str);
	/* Every name, tensor or value, must be unique or views would be
	 * ambiguous (a crafted metadata can repeat a key).  The two sorted
	 * lists are checked without a third sort; the name reported is the
	 * smallest one listed twice. */
	for (size_t i = 1; i < c->ntensors && !dup; i++)
		if (strcmp(c->by_name[i - 1]->fqn, c->by_name[i]->fqn) == 0)
			dup = c->by_name[i]->fqn;
	for (size_t i = 0; i < c->nobjects; i++) {
		const char *o = obj[i];
		int r = 1;

		if (dup && strcmp(o, dup) >= 0)
			break;
		if (i && strcmp(obj[i - 1], o) == 0) {
			dup = o;
			break;
		}
		while (t < c->ntensors &&
		       (r = strcmp(c->by_name[t]->fqn, o)) < 0)
			t++;
		if (t < c->ntensors && r == 0) {
			dup = o;
			break;
		}
	}
	if (dup)
		rc = flx_error_set(b->err, -EINVAL, b->names_from, dup,
				   "listed twice in %s", b->names_where);
out:
	free(obj);
	return rc;
}

int flx_ckpt_fact(const flx_ckpt *c, const char *name, flx_fact *out)
{
	if (!c || !c->src_fact)
		return -ENOENT;
	return c->src_fact(c, name, out);
}

bool flx_ckpt_fact_true(const flx_ckpt *c, const char *name)
{
	flx_fact f;

	return !flx_ckpt_fact(c, name, &f) && f.type == FLX_FACT_BOOL && f.v.b;
}

const void *flx_ckpt_fact_ptr(const flx_ckpt *c, const char *name)
{
	flx_fact f;

	if (flx_ckpt_fact(c, name, &f) || f.type != FLX_FACT_PTR)
		return NULL;
	return f.v.p;
}

const flx_tensor *flx_ckpt_find(const flx_ckpt *c, const char *fqn)
{
	size_t lo = 0, hi = c->ntensors;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int r = strcmp(c->by_name[mid]->fqn, fqn);

		if (r == 0)
			return c->by_name[mid];
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* ---- open ---- */

/* Name files by their path, as the user will look them up. */
static void name_by_path(flx_error *err, const char *dir)
{
	if (err && err->file[0] && err->file[0] != '/' &&
	    strcmp(err->file, dir) != 0) {
		char path[2 * FLX_ERR_FIELD + 2];

		snprintf(path, sizeof(path), "%s/%s", dir, err->file);
		flx_error_file_replace(err, path);
	}
}

/* The source named by o->format, else the first whose probe recognises
 * the directory. */
static int pick_source(flx_build *b, const flx_ckpt_opts *o,
		       const flx_source **out)
{
	const flx_source *const *f = flx_sources;
	const flx_source *first;
	char others[FLX_ERR_FIELD] = "";
	size_t n = 0;

	while (f[0]->variant && f[1])
		f++;
	first = *f;
	for (const flx_source *const *s = flx_sources; *s; s++) {
		bool yes = false;
		int rc;

		if (o->format) {
			if (strcmp((*s)->name, o->format) != 0)
				continue;
			*out = *s;
			return 0;
		}
		rc = (*s)->probe(b->dirfd, &yes);
		if (rc)
			return flx_error_set(b->err, rc, b->c->dir, NULL,
					     "cannot look for %s: %s",
					     (*s)->marker, strerror(-rc));
		if (yes) {
			*out = *s;
			return 0;
		}
		if (*s != first && !(*s)->variant && n < sizeof(others))
			n += (size_t)snprintf(others + n, sizeof(others) - n,
					      ", no %s (%s)", (*s)->marker,
					      (*s)->kind);
	}
	if (o->format)
		return flx_error_set(b->err, -EINVAL, b->c->dir, "format",
				     "unknown checkpoint format '%s'",
				     o->format);
	/* named after the first plain source's marker: the usual
	 * checkpoint */
	return flx_error_set(b->err, -ENOENT, first->marker, NULL,
			     "no such file (is this a %s checkpoint "
			     "directory?)%s",
			     first->kind, others);
}

/* Read subdirectory sub of the directory as the checkpoint directory:
 * its descriptor, path and realpath replace the directory's, its access
 * meets what the open needed so far. */
static int descend(flx_build *b, const char *sub)
{
	flx_access access;
	struct stat st;
	char *dir = NULL, *real = NULL, *name = strdup(sub);
	int fd = -1, rc = 0;

	if (asprintf(&dir, "%s/%s", b->c->dir, sub) < 0)
		dir = NULL;
	if (asprintf(&real, "%s/%s", b->realdir, sub) < 0)
		real = NULL;
	if (!name || !dir || !real) {
		rc = -ENOMEM;
		goto out;
	}
	if (!flx_relpath_ok(sub) || strchr(sub, '/')) {
		rc = flx_error_set(b->err, -EINVAL, sub, NULL,
				   "not a plain subdirectory name");
		goto out;
	}
	fd = openat(b->dirfd, sub,
		    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0) {
		rc = flx_error_set(b->err, -errno, sub, NULL,
				   "cannot open checkpoint directory: %s",
				   strerror(errno));
		goto out;
	}
	access = flx_access_of(&st);
	flx_access_meet(&access, &b->c->access);
	b->c->access = access;
	close(b->dirfd);
	b->dirfd = fd;
	fd = -1;
	free(b->c->dir);
	b->c->dir = dir;
	free(b->realdir);
	b->realdir = real;
	b->entered = name;
	dir = real = name = NULL;
out:
	if (fd >= 0)
		close(fd);
	free(dir);
	free(real);
	free(name);
	return rc;
}

/* The sources' enter hooks: the subdirectory that holds the checkpoint,
 * when the directory is a save directory of several. */
static int enter_sub(flx_build *b, const flx_ckpt_opts *o)
{
	char sub[256];

	/* a caller that entered the subdirectory itself has done this */
	if (o->entered)
		return 0;
	for (const flx_source *const *s = flx_sources; *s; s++) {
		int rc;

		if (!(*s)->enter ||
		    (o->format && strcmp((*s)->name, o->format)))
			continue;
		sub[0] = '\0';
		rc = (*s)->enter(b, o, sub, sizeof(sub), b->err);
		if (rc)
			return rc;
		if (sub[0])
			return descend(b, sub);
	}
	return 0;
}

/*
 * Everything is checked in this order, and the first failure is the one
 * reported: what the source loads, the items, then the other files and
 * the names.  The items are read last (or, unless wait, left reading)
 * because they take the longest and nothing else needs them; so when the
 * other files or the names fail, the items are still read first, to report
 * what a full check would have found first.
 */
static int finish_load(flx_build *b, bool wait)
{
	struct flx_item_load *ld = NULL;
	flx_error later;
	flx_error *err = b->err;
	int rc = 0, rc2;

	/* the other files first: adding them moves c->files, which the
	 * item workers read */
	flx_error_init(&later);
	b->err = &later;
	rc2 = load_extras(b);
	if (!rc2)
		rc2 = build_names(b);
	b->err = err;
	if (b->items) {
		rc = items_begin(b, wait || rc2, &ld);
		if (!rc && (wait || rc2)) {
			rc = items_end(ld, err);
			ld = NULL;
		}
	}
	if (!rc && rc2) {
		if (err)
			*err = later;
		rc = rc2;
	}
	if (!rc)
		b->c->loading = ld;
	return rc;
}

static void build_release(flx_build *b)
{
	prefetch_end(&b->pf);
	free(b->fmap);
	free(b->realdir);
	free(b->entered);
	if (b->dirfd >= 0)
		close(b->dirfd);
}

/* flx_ckpt.uid: the last one given */
static uint64_t next_uid;

int flx_ckpt_open_with(const char *dir, const flx_ckpt_opts *opts,
		       flx_ckpt **out, flx_error *err)
{
	static const flx_ckpt_opts none = {0};
	const flx_ckpt_opts *o = opts ? opts : &none;
	flx_build b = {.err = err, .dirfd = -1};
	struct stat st;
	int rc;

	b.threads = o->threads > FLX_MAX_THREADS ? FLX_MAX_THREADS : o->threads;
	b.walk_only = o->walk_only;
	b.follow = o->follow_symlinks;
	fd_budget(o->keep_fds, &b.fd_keep, &b.fd_slots);
	b.names_where = "the checkpoint";
	b.c = calloc(1, sizeof(flx_ckpt));
	if (!b.c)
		return flx_error_default(err, -ENOMEM, dir);
	b.c->backend = o->backend;
	b.c->uid = __atomic_add_fetch(&next_uid, 1, __ATOMIC_RELAXED);
	b.c->pooled = true;
	b.c->dir = strdup(dir);
	if (!b.c->dir) {
		rc = -ENOMEM;
		goto out;
	}
	b.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (b.dirfd < 0) {
		rc = flx_error_set(err, -errno, dir, NULL,
				   "cannot open checkpoint directory: %s",
				   strerror(errno));
		goto out;
	}
	rc = fstat(b.dirfd, &st) < 0 ? -errno : 0;
	if (rc)
		goto out;
	b.c->access = flx_access_of(&st);
	b.realdir = realpath(dir, NULL);
	if (!b.realdir) {
		rc = -errno;
		goto out;
	}
	if (o->entered && !(b.entered = strdup(o->entered))) {
		rc = -ENOMEM;
		goto out;
	}
	rc = enter_sub(&b, o);
	if (!rc)
		rc = pick_source(&b, o, &b.src);
	if (rc)
		goto out;
	b.c->format = strdup(b.src->name);
	if (!b.c->format) {
		rc = -ENOMEM;
		goto out;
	}
	rc = b.src->load(&b, o, err);
	b.c->src_fact = b.src->fact;
	if (!rc)
		rc = finish_load(&b, !o->defer_items);
out:
	build_release(&b);
	if (rc) {
		/* named under the directory read: a subdirectory entered */
		if (b.c && b.c->dir)
			dir = b.c->dir;
		flx_error_default(err, rc, dir);
		name_by_path(err, dir);
		flx_ckpt_close(b.c);
		return rc;
	}
	*out = b.c;
	return 0;
}

int flx_ckpt_probe(const char *dir, const char **format)
{
	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = -ENOENT;

	if (dirfd < 0)
		return -errno;
	for (const flx_source *const *s = flx_sources; *s && rc == -ENOENT;
	     s++) {
		bool yes = false;
		int prc = (*s)->probe(dirfd, &yes);

		if (prc)
			rc = prc;
		else if (yes) {
			*format = (*s)->name;
			rc = 0;
		}
	}
	close(dirfd);
	return rc;
}

int flx_ckpt_open(const char *dir, flx_ckpt **out, flx_error *err)
{
	return flx_ckpt_open_with(dir, NULL, out, err);
}

int flx_ckpt_open_start(const char *dir, flx_ckpt **out, flx_error *err)
{
	const flx_ckpt_opts o = {.defer_items = true};

	return flx_ckpt_open_with(dir, &o, out, err);
}

int flx_ckpt_finish(flx_ckpt *c, flx_error *err)
{
	int rc;

	if (!c->loading)
		return 0;
	rc = items_end(c->loading, err);
	c->loading = NULL;
	if (rc) {
		flx_error_default(err, rc, c->dir);
		name_by_path(err, c->dir);
	}
	return rc;
}

int flx_nofile_raise(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return -errno;
	if (rl.rlim_cur == rl.rlim_max)
		return 0;
	rl.rlim_cur = rl.rlim_max;
	return setrlimit(RLIMIT_NOFILE, &rl) < 0 ? -errno : 0;
}

/* ---- files at run time ---- */

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

flx_access flx_access_of(const struct stat *st)
{
	mode_t m = st->st_mode;

	if (S_ISDIR(m))
		m = (m & (S_IXUSR | S_IXGRP | S_IXOTH)) << 2;
	return (flx_access){st->st_uid, st->st_gid,
			    (uint16_t)(m & (S_IRUSR | S_IRGRP | S_IROTH))};
}

void flx_access_meet(flx_access *a, const flx_access *b)
{
	const bool su = a->uid == b->uid, sg = a->gid == b->gid;
	const bool bu = b->read & S_IRUSR, bg = b->read & S_IRGRP,
		   bo = b->read & S_IROTH;
	/* who each class of a can be to b: a's owner is b's owner, or not
	 * (then in b's group or not); a member of a's group may be b's owner,
	 * and is in b's group when the groups are one; anyone else may be
	 * b's owner or in its group unless those are a's */
	const bool ku = su ? bu : bg && bo;
	const bool kg = (su || bu) && bg && (sg || bo);
	const bool ko = (su || bu) && (sg || bg) && bo;

	a->read &= (uint16_t)((ku ? S_IRUSR : 0) | (kg ? S_IRGRP : 0) |
			      (ko ? S_IROTH : 0));
}

void flx_file_identity(flx_file *f, const struct stat *st)
{
	f->access = flx_access_of(st);
	f->size = (uint64_t)st->st_size;
	f->dev = st->st_dev;
	f->ino = st->st_ino;
	f->mtime_ns = flx_mtime_ns(st);
	f->ctime_ns =
	    (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
}

/* st (an fstat of f's descriptor) is still the identity of f at mount. */
static bool same_identity(const flx_file *f, const struct stat *st)
{
	flx_file now;

	flx_file_identity(&now, st);
	return now.size == f->size && now.mtime_ns == f->mtime_ns &&
	       now.ctime_ns == f->ctime_ns && now.dev == f->dev &&
	       now.ino == f->ino;
}

int flx_file_verify(const flx_ckpt *c, const flx_file *f, bool by_path)
{
	/* the one mutable field of the index (see ckpt.h) */
	int64_t *checked = (int64_t *)&f->path_checked_ns;
	struct stat st;
	char *path = NULL;
	int64_t now, last;
	uint32_t i = (uint32_t)(f - c->files);
	bool opened;
	int fd = -1, rc;

	/* a remote file is checked by the node that reads it */
	if (f->remote)
		return 0;
	/* a file past the budget that is not open now is checked when it is
	 * opened again; opening it here would only churn the fd table */
	rc = f->fd >= 0 ? 0 : fdt_acquire(c, i, false, &fd);
	opened = !rc;
	if (rc && rc != -ENOENT)
		return rc;
	if (opened) {
		rc = fstat(f->fd >= 0 ? f->fd : fd, &st) < 0 ? -errno : 0;
		flx_file_release(c, i);
		if (rc)
			return rc;
		if (!same_identity(f, &st))
			return -ESTALE;
	}
	if (!by_path || f->decoded)
		return 0;
	now = now_ns();
	last = __atomic_load_n(checked, __ATOMIC_RELAXED);
	if (last && now - last < 1000000000)
		return 0;
	if (asprintf(&path, "%s/%s", c->dir, f->relpath) < 0)
		return -ENOMEM;
	rc = stat(path, &st) < 0 ? -errno : 0;
	free(path);
	if (rc == -ENOENT ||
	    (!rc && (st.st_dev != f->dev || st.st_ino != f->ino)) ||
	    (!rc && !opened && !same_identity(f, &st)))
		return -ESTALE;
	if (!rc)
		__atomic_store_n(checked, now, __ATOMIC_RELAXED);
	return rc;
}

void flx_ckpt_close(flx_ckpt *c)
{
	if (!c)
		return;
	if (c->loading) {
		flx_error ignored;

		flx_error_init(&ignored);
		(void)items_end(c->loading, &ignored);
	}
	for (size_t i = 0; i < c->nfiles; i++) {
		free(c->files[i].relpath);
		if (c->files[i].fd >= 0)
			close(c->files[i].fd);
	}
	fdtable_free(c->fdt);
	if (!c->pooled) {
		for (size_t i = 0; i < c->ntensors; i++) {
			free(c->tensors[i].fqn);
			free(c->tensors[i].chunks);
		}
		for (size_t i = 0; i < c->nobjects; i++)
			free(c->objects[i].fqn);
	}
	flx_pool_free(&c->pool);
	free(c->files);
	free(c->tensors);
	free(c->objects);
	free(c->by_name);
	free(c->skipped_links);
	free(c->dir);
	free(c->format);
	free(c->writer);
	free(c);
}
