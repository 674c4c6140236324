/* SPDX-License-Identifier: MIT */
/* The file table: adding files, the fd table of files past the
 * descriptor budget, reads, and identity checks at run time (source.h,
 * ckpt.h). */
#include "ckpt.h"
#include "grow.h"
#include "reader.h"
#include "index_internal.h"
#include "source.h"

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
void fd_budget(unsigned keep_fds, size_t *keep, size_t *slots)
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

void fdtable_free(flx_fdtable *t)
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
static void note_changed(const flx_file *f, const struct stat *st);

/* Open file i of c into its entry (closed), in a slot if one is free. */
static int fdt_open(flx_fdtable *t, const flx_ckpt *c, uint32_t i)
{
	const flx_file *f = &c->files[i];
	uint32_t slot = fdt_slot(t);
	struct stat st;
	int fd = -1, rc = open_beneath(t->dirfd, t->realdir, t->walk_only,
				       f->relpath, &fd, &st);

	if (!rc && (fd < 0 || !same_identity(f, &st))) {
		note_changed(f, &st);
		rc = -ESTALE;
	}
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
int add_file(flx_build *b, const char *relpath, bool data, const char *key,
	     uint32_t *idx)
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

bool flx_dir_has(int dirfd, const char *name)
{
	struct stat st;

	return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ||
	       errno != ENOENT;
}

bool flx_build_has(const flx_build *b, int dirfd, const char *name)
{
	return flx_dir_has(dirfd, name) || flx_build_remote(b, name);
}

const char *flx_build_remote_name(const flx_build *b, uint32_t id)
{
	const flx_file_backend *be = b->c->backend;

	return be ? be->name(be->ctx, id) : NULL;
}

int flx_build_each_name(flx_build *b,
			int (*fn)(void *arg, const char *name, bool dir),
			void *arg)
{
	const flx_file_backend *be = b->c->backend;

	if (be)
		return flx_each_listed_name(be->name, be->ctx, NAME_MAX,
					    UINT_MAX, fn, arg);
	return flx_each_local_name(b->dirfd, UINT_MAX, fn, arg);
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

/* The calling thread's last finding that a backing file changed, for
 * flx_file_changed_why(). */
static _Thread_local char changed_why[FLX_ERR_FIELD + 64];

/* Record how f differs from st (NULL: the path names nothing now). */
static void note_changed(const flx_file *f, const struct stat *st)
{
	flx_file now;

	if (!st || st->st_nlink == 0) {
		/* no path, or the open file has no name left */
		snprintf(changed_why, sizeof(changed_why),
			 "%s: removed or replaced since mount", f->relpath);
		return;
	}
	flx_file_identity(&now, st);
	if (!S_ISREG(st->st_mode))
		snprintf(changed_why, sizeof(changed_why),
			 "%s: no longer a regular file", f->relpath);
	else if (now.dev != f->dev || now.ino != f->ino)
		snprintf(changed_why, sizeof(changed_why),
			 "%s: replaced since mount (the path names another "
			 "file)",
			 f->relpath);
	else if (now.size != f->size)
		snprintf(changed_why, sizeof(changed_why),
			 "%s: %llu bytes at mount, %llu now", f->relpath,
			 (unsigned long long)f->size,
			 (unsigned long long)now.size);
	else
		snprintf(changed_why, sizeof(changed_why),
			 "%s: rewritten since mount (its modification or "
			 "change time moved)",
			 f->relpath);
}

void flx_file_changed_why(char *buf, size_t len)
{
	if (len)
		snprintf(buf, len, "%s", changed_why);
	changed_why[0] = '\0';
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
		if (!same_identity(f, &st)) {
			note_changed(f, &st);
			return -ESTALE;
		}
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
	    (!rc && !opened && !same_identity(f, &st))) {
		note_changed(f, rc ? NULL : &st);
		return -ESTALE;
	}
	if (!rc)
		__atomic_store_n(checked, now, __ATOMIC_RELAXED);
	return rc;
}
