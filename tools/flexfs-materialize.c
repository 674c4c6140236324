/* SPDX-License-Identifier: MIT */
/*
 * flexfs-materialize: write the views a mount would serve as real files,
 * through the core (fs/stack.h, fs/tree.h), no FUSE.  Under mpirun every
 * rank builds the same tree and writes a disjoint, byte-balanced set of its
 * files (materialize.h decides which); alone it is a world of one.
 *
 * A file is written to a temporary name in its directory, fsync'd and
 * renamed, so a file at its final name is complete; OUT carries a run
 * record (RECORD_NAME) naming what was materialized, and a run resumes
 * only into an OUT whose record matches, skipping the files already there
 * at their exact size (flx_mat_state_of()).  The checkpoint directory is
 * only read.
 */
#include "error.h"
#include "mat_comm.h"
#include "materialize.h"
#include "mountopts.h"
#include "optdoc.h"
#include "sha256.h"
#include "stack.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef FLX_HAVE_MPI
#define MPI_BUILT "yes"
#else
#define MPI_BUILT "no"
#endif

#define RECORD_NAME ".flexfs-materialize"
#define PART_PREFIX ".flexfs-part."
#define BLOCK	    (4u << 20) /* bytes per read and write */
#define ROUND_NS    250000000  /* at most four progress sums a second */

/* One directory or file of the selected views, in tree order (a
 * directory before its entries). */
typedef struct entry {
	char *path; /* relative to the root */
	flx_ino ino;
	uint64_t size;
	bool dir;
	int parent; /* index of its directory in the entries, -1: the root */
} entry;

typedef struct list {
	entry *e;
	size_t n, cap;
} list;

/* Counters summed over the ranks (FLX_COMM_N of them).  C_ERR: a rank
 * failed, every rank stops; C_BAD: files --verify found unequal. */
enum {
	C_BYTES,
	C_SKIPBYTES,
	C_FILES,
	C_SKIPFILES,
	C_DONE,
	C_ERR,
	C_TENSORS,
	C_BAD
};

typedef struct job {
	const char *out; /* OUT as given, for messages */
	int outfd;
	const flx_fs *fs;
	const list *l;
	const int *owner; /* per entry; -1 for directories */
	flx_comm *c;
	bool tty;
	bool verbose;	/* -v: a line per file written */
	uint64_t total; /* bytes of all files */
	unsigned char *buf, *buf2;
	uint64_t mine[FLX_COMM_N], sum[FLX_COMM_N];
	struct timespec t0, last;
	bool stop; /* a rank failed: write no more */
	bool all_done;
	unsigned kill_after; /* FLEXFS_MATERIALIZE_KILL_AFTER (tests) */
	const char *what;    /* the phase, for the progress line */
} job;

static void usage(FILE *f, const char *argv0)
{
	flx_doc_usage(f, &flx_doc_materialize, argv0);
}

static double since(const struct timespec *a)
{
	struct timespec b;

	clock_gettime(CLOCK_MONOTONIC, &b);
	return (double)(b.tv_sec - a->tv_sec) +
	       (double)(b.tv_nsec - a->tv_nsec) / 1e9;
}

/* ---- the tree's files ---- */

static int push(list *l, const entry *e)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		entry *p = realloc(l->e, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		l->e = p;
		l->cap = cap;
	}
	l->e[l->n++] = *e;
	return 0;
}

static void list_free(list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->e[i].path);
	free(l->e);
}

/* Add dir's entries (and theirs) under path prefix pre ("" at the root,
 * where only the selected views are taken). */
static int walk(const flx_fs *fs, flx_ino dir, const char *pre, int parent,
		const char *views, list *l)
{
	const char *name;
	flx_stat st;
	int rc = 0;

	for (uint64_t pos = 0; !rc; pos++) {
		entry e = {0};

		rc = flx_fs_readdir(fs, dir, pos, &name, &st);
		if (rc || !name)
			break;
		if (!*pre && !flx_mat_selected(views, name))
			continue;
		if (asprintf(&e.path, "%s%s%s", pre, *pre ? "/" : "", name) < 0)
			return -ENOMEM;
		e.ino = st.ino;
		e.dir = st.dir;
		e.size = st.dir ? 0 : st.size;
		e.parent = parent;
		rc = push(l, &e);
		if (rc) {
			free(e.path);
			break;
		}
		if (st.dir)
			rc = walk(fs, st.ino, l->e[l->n - 1].path,
				  (int)(l->n - 1), views, l);
	}
	return rc;
}

/* Every name of views must be a top-level entry of the tree. */
static int check_views(const flx_fs *fs, const char *views, flx_error *err)
{
	const char *p = views;
	char have[512] = "", tok[64];
	const char *name;
	flx_stat st;

	for (uint64_t pos = 0;
	     !flx_fs_readdir(fs, FLX_ROOT_INO, pos, &name, &st) && name; pos++)
		snprintf(have + strlen(have), sizeof(have) - strlen(have),
			 "%s%s", pos ? ", " : "", name);
	while (p && *p) {
		size_t n = strcspn(p, ",");
		bool found = false;

		snprintf(tok, sizeof(tok), "%.*s", (int)n, p);
		for (uint64_t pos = 0;
		     !found &&
		     !flx_fs_readdir(fs, FLX_ROOT_INO, pos, &name, &st) && name;
		     pos++)
			found = flx_mat_selected(tok, name);
		if (!found) {
			flx_error_set(err, -EINVAL, NULL, "--views",
				      "no '%s' in this tree (it has: %s)", tok,
				      have);
			return -EINVAL;
		}
		p += n + (p[n] == ',');
	}
	return 0;
}

/* ---- OUT ---- */

/* OUT's canonical path into res (PATH_MAX), OUT itself not yet made:
 * its parent's realpath and its last component. */
static int out_path(const char *out, char *res)
{
	char *copy = strdup(out), *slash, *base;
	char parent[PATH_MAX];
	int rc = 0;

	if (!copy)
		return -ENOMEM;
	if (realpath(out, res))
		goto out;
	slash = strrchr(copy, '/');
	while (slash && slash > copy && slash[1] == '\0') {
		*slash = '\0';
		slash = strrchr(copy, '/');
	}
	base = slash ? slash + 1 : copy;
	if (slash == copy)
		strcpy(parent, "/");
	else if (slash) {
		*slash = '\0';
		if (!realpath(copy, parent))
			rc = -errno;
	} else if (!realpath(".", parent))
		rc = -errno;
	if (!rc &&
	    snprintf(res, PATH_MAX, "%s/%s", strcmp(parent, "/") ? parent : "",
		     base) >= PATH_MAX)
		rc = -ENAMETOOLONG;
out:
	free(copy);
	return rc;
}

/* The run's identity: the source (its path and files), the options'
 * effect (index.json, which names every rank's tensors, dtypes and
 * shapes), the views and the file list. */
static int run_key(const flx_stack *st, const char *src, const list *l,
		   unsigned char *buf, char hex[65])
{
	const flx_ckpt *ck = st->ckpt;
	flx_sha256 s;
	flx_stat is;
	char line[64];

	flx_sha256_init(&s);
	flx_sha256_update(&s, "flexfs-materialize 1\n", 21);
	flx_sha256_update(&s, src, strlen(src) + 1);
	for (size_t i = 0; i < ck->nfiles; i++) {
		snprintf(line, sizeof(line), "%llu %lld\n",
			 (unsigned long long)ck->files[i].size,
			 (long long)ck->files[i].mtime_ns);
		flx_sha256_update(&s, ck->files[i].relpath,
				  strlen(ck->files[i].relpath) + 1);
		flx_sha256_update(&s, line, strlen(line));
	}
	for (size_t i = 0; i < l->n; i++) {
		snprintf(line, sizeof(line), "%d %llu\n", l->e[i].dir,
			 (unsigned long long)l->e[i].size);
		flx_sha256_update(&s, l->e[i].path, strlen(l->e[i].path) + 1);
		flx_sha256_update(&s, line, strlen(line));
	}
	if (!flx_fs_resolve(st->fs, "index.json", &is) && !is.dir) {
		for (uint64_t off = 0; off < is.size;) {
			ssize_t got =
			    flx_fs_read(st->fs, is.ino, buf, BLOCK, off, NULL);

			if (got <= 0)
				return got < 0 ? (int)got : -EIO;
			flx_sha256_update(&s, buf, (size_t)got);
			off += (uint64_t)got;
		}
	}
	flx_sha256_hex(&s, hex);
	return 0;
}

static bool empty_dir(int fd)
{
	int dup_fd = dup(fd);
	DIR *d = dup_fd < 0 ? NULL : fdopendir(dup_fd);
	struct dirent *de;
	bool empty = true;

	if (!d) {
		if (dup_fd >= 0)
			close(dup_fd);
		return false;
	}
	while (empty && (de = readdir(d)))
		empty = !strcmp(de->d_name, ".") || !strcmp(de->d_name, "..");
	closedir(d);
	return empty;
}

/* Rank 0: OUT made and checked; the run record written, or found equal
 * to key.  @return 0 and *outfd, or -errno with err. */
static int prepare_out(const char *src, const char *out, const char *key,
		       int *outfd, flx_error *err)
{
	char rsrc[PATH_MAX], rout[PATH_MAX], rec[128], want[128];
	int fd = -1, rfd = -1, rc;
	ssize_t got;

	if (!realpath(src, rsrc)) {
		rc = -errno;
		flx_error_set(err, rc, src, NULL, "%s", strerror(-rc));
		return rc;
	}
	rc = out_path(out, rout);
	if (rc) {
		flx_error_set(err, rc, out, NULL, "cannot resolve: %s",
			      strerror(-rc));
		return rc;
	}
	if (flx_mat_within(rsrc, rout) || flx_mat_within(rout, rsrc)) {
		flx_error_set(err, -EINVAL, out, NULL,
			      "%s the checkpoint directory %s: refused (the "
			      "checkpoint is never written)",
			      flx_mat_within(rsrc, rout) ? "is inside"
							 : "contains",
			      rsrc);
		return -EINVAL;
	}
	if (mkdir(out, 0755) && errno != EEXIST) {
		rc = -errno;
		flx_error_set(err, rc, out, NULL, "cannot create: %s",
			      strerror(-rc));
		return rc;
	}
	fd = open(out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || access(out, W_OK | X_OK)) {
		rc = -errno;
		flx_error_set(err, rc, out, NULL, "not writable: %s",
			      strerror(-rc));
		goto out;
	}
	/* held by rank 0 until it exits: one run at a time in an OUT */
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
		flx_error_set(err, rc, out, NULL,
			      "in use by another flexfs-materialize run");
		goto out;
	}
	snprintf(want, sizeof(want), "flexfs-materialize run %s\n", key);
	rfd = openat(fd, RECORD_NAME, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (rfd >= 0) {
		got = read(rfd, rec, sizeof(rec) - 1);
		rec[got > 0 ? got : 0] = '\0';
		if (strcmp(rec, want)) {
			rc = -EEXIST;
			flx_error_set(err, rc, out, RECORD_NAME,
				      "holds the output of another run (other "
				      "source, options or views): use an empty "
				      "directory");
		}
		goto out;
	}
	if (!empty_dir(fd)) {
		rc = -ENOTEMPTY;
		flx_error_set(err, rc, out, NULL,
			      "not empty and no %s record in it: use an "
			      "empty directory",
			      RECORD_NAME);
		goto out;
	}
	/* the record first, so that every file written later is known to
	 * be this run's */
	rfd = openat(fd, RECORD_NAME, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
		     0644);
	if (rfd < 0 ||
	    write(rfd, want, strlen(want)) != (ssize_t)strlen(want) ||
	    fsync(rfd) || fsync(fd)) {
		rc = errno ? -errno : -EIO;
		flx_error_set(err, rc, out, RECORD_NAME, "cannot write: %s",
			      strerror(-rc));
	}
out:
	if (rfd >= 0)
		close(rfd);
	if (rc && fd >= 0)
		close(fd);
	else
		*outfd = fd;
	return rc;
}

/* Rank 0: every directory of the views. */
static int make_dirs(int outfd, const char *out, const list *l, flx_error *err)
{
	struct stat sb;

	for (size_t i = 0; i < l->n; i++) {
		if (!l->e[i].dir)
			continue;
		if (mkdirat(outfd, l->e[i].path, 0755) && errno != EEXIST) {
			int rc = -errno;

			flx_error_set(err, rc, out, l->e[i].path,
				      "cannot create: %s", strerror(rc));
			return rc;
		}
		if (fstatat(outfd, l->e[i].path, &sb, AT_SYMLINK_NOFOLLOW) ||
		    !S_ISDIR(sb.st_mode)) {
			flx_error_set(err, -ENOTDIR, out, l->e[i].path,
				      "exists and is not a directory");
			return -ENOTDIR;
		}
	}
	return 0;
}

/* ---- progress: counters summed over the ranks, a round at a time ---- */

/* Rank 0, on a terminal: the progress line, or erase it. */
static void draw(job *j, bool erase)
{
	char line[160];

	if (j->c->rank != 0 || !j->tty)
		return;
	flx_mat_progress(line, sizeof(line),
			 j->sum[C_BYTES] + j->sum[C_SKIPBYTES], j->total,
			 j->sum[C_BYTES], since(&j->t0));
	fprintf(stderr, "\r\033[K%s%s", j->what, erase ? "" : line);
	fflush(stderr);
}

/* Let a round of sums progress: take a completed one's result, start the
 * next one at most every ROUND_NS.  Every rank starts the same rounds:
 * they end together when a result says every rank is done.
 * @return 0 or -EIO. */
static int poll_round(job *j)
{
	uint64_t res[FLX_COMM_N];
	bool done;
	int rc = 0;

	if (j->c->pending) {
		rc = flx_comm_test(j->c, &done, res);
		if (rc || !done)
			return rc;
		memcpy(j->sum, res, sizeof(res));
		if (j->sum[C_ERR])
			j->stop = true;
		if (j->sum[C_DONE] == (uint64_t)j->c->size) {
			j->all_done = true;
			return 0;
		}
		draw(j, false);
	}
	/* a rank with nothing left to write starts the next round at once:
	 * the ranks still writing set the pace */
	if (j->mine[C_DONE] || since(&j->last) * 1e9 >= ROUND_NS) {
		clock_gettime(CLOCK_MONOTONIC, &j->last);
		rc = flx_comm_start(j->c, j->mine);
	}
	return rc;
}

/* This rank is done (or failed): take part in rounds until all are. */
static int finish_rounds(job *j)
{
	struct timespec nap = {0, 5000000};
	int rc = 0;

	j->mine[C_DONE] = 1;
	while (!rc && !j->all_done) {
		rc = poll_round(j);
		if (!j->all_done)
			nanosleep(&nap, NULL);
	}
	if (j->tty && j->c->rank == 0)
		fprintf(stderr, "\r\033[K");
	return rc;
}

/* ---- writing ---- */

static int write_all(int fd, const unsigned char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* The temporary name of entry i, beside its final name. */
static void part_name(const list *l, size_t i, char *buf, size_t len)
{
	const entry *e = &l->e[i];

	if (e->parent < 0)
		snprintf(buf, len, PART_PREFIX "%zu", i);
	else
		snprintf(buf, len, "%s/" PART_PREFIX "%zu",
			 l->e[e->parent].path, i);
}

/* Test hook (FLEXFS_MATERIALIZE_KILL_AFTER=N): after N files, die by
 * SIGKILL halfway through the next one, as an interrupted run would. */
static void maybe_die(job *j, int fd, const unsigned char *p, size_t n)
{
	if (!j->kill_after || j->mine[C_FILES] < j->kill_after)
		return;
	(void)write_all(fd, p, n / 2);
	raise(SIGKILL);
}

/* Write file i, or skip it when complete.  @return 0 or -errno, after a
 * line on stderr. */
static int write_one(job *j, size_t i)
{
	const entry *e = &j->l->e[i];
	char part[PATH_MAX + 32];
	struct stat sb;
	flx_mat_state s;
	bool exists = true;
	int fd = -1, rc = 0;

	if (fstatat(j->outfd, e->path, &sb, AT_SYMLINK_NOFOLLOW)) {
		if (errno != ENOENT) {
			rc = -errno;
			goto out;
		}
		exists = false;
	}
	s = flx_mat_state_of(exists, exists && S_ISREG(sb.st_mode),
			     exists ? (uint64_t)sb.st_size : 0, e->size);
	if (s == FLX_MAT_DONE) {
		j->mine[C_SKIPBYTES] += e->size;
		j->mine[C_SKIPFILES]++;
		return 0;
	}
	if (s == FLX_MAT_BLOCKED) {
		rc = -EEXIST;
		goto out;
	}
	part_name(j->l, i, part, sizeof(part));
	fd =
	    openat(j->outfd, part,
		   O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	for (uint64_t off = 0; off < e->size && !rc;) {
		ssize_t got =
		    flx_fs_read(j->fs, e->ino, j->buf, BLOCK, off, NULL);

		if (got <= 0) {
			rc = got < 0 ? (int)got : -EIO;
			break;
		}
		maybe_die(j, fd, j->buf, (size_t)got);
		rc = write_all(fd, j->buf, (size_t)got);
		off += (uint64_t)got;
		j->mine[C_BYTES] += (uint64_t)got;
		if (!rc)
			rc = poll_round(j);
	}
	if (!rc && fsync(fd))
		rc = -errno;
	if (close(fd) && !rc)
		rc = -errno;
	fd = -1;
	if (!rc && renameat(j->outfd, part, j->outfd, e->path))
		rc = -errno;
	if (!rc)
		j->mine[C_FILES]++;
	if (!rc && j->verbose)
		printf("rank %d wrote %s (%llu bytes)\n", j->c->rank, e->path,
		       (unsigned long long)e->size);
out:
	if (fd >= 0)
		close(fd);
	if (rc)
		fprintf(stderr, "flexfs-materialize: %s/%s: cannot write: %s\n",
			j->out, e->path,
			rc == -EEXIST ? "exists and is not a regular file"
				      : strerror(-rc));
	return rc;
}

/* fsync the directories this rank renamed files into (their entries
 * durable), the root too. */
static int sync_dirs(job *j)
{
	int rc = fsync(j->outfd) ? -errno : 0;

	for (size_t i = 0; i < j->l->n && !rc; i++) {
		int fd;

		if (!j->l->e[i].dir)
			continue;
		fd = openat(j->outfd, j->l->e[i].path,
			    O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0 || fsync(fd))
			rc = -errno;
		if (fd >= 0)
			close(fd);
	}
	if (rc)
		fprintf(stderr, "flexfs-materialize: %s: cannot sync: %s\n",
			j->out, strerror(-rc));
	return rc;
}

/* ---- --verify ---- */

/* Compare [off, off+len) of the output file (fd) with the tree's file:
 * *same, and, when sums is set, the sha256 of both into a and b (for the
 * report of a difference: equal bytes need no digest).
 * @return 0 or -errno. */
static int compare_range(job *j, const entry *e, int fd, uint64_t off,
			 uint64_t len, bool sums, bool *same, char a[65],
			 char b[65])
{
	flx_sha256 sa, sb;

	*same = true;
	flx_sha256_init(&sa);
	flx_sha256_init(&sb);
	for (uint64_t at = off; at < off + len;) {
		size_t want =
		    off + len - at < BLOCK ? (size_t)(off + len - at) : BLOCK;
		ssize_t got = pread(fd, j->buf, want, (off_t)at);
		ssize_t ref =
		    flx_fs_read(j->fs, e->ino, j->buf2, want, at, NULL);

		if (got < 0 || ref < 0)
			return got < 0 ? -errno : (int)ref;
		if ((size_t)got != want || (size_t)ref != want)
			return -EIO;
		if (memcmp(j->buf, j->buf2, want))
			*same = false;
		if (sums) {
			flx_sha256_update(&sa, j->buf, want);
			flx_sha256_update(&sb, j->buf2, want);
		} else {
			j->mine[C_BYTES] += want;
		}
		at += want;
	}
	if (sums) {
		flx_sha256_hex(&sa, a);
		flx_sha256_hex(&sb, b);
	}
	return poll_round(j);
}

/* Check file i against the tree, one segment (a tensor, or generated
 * bytes) at a time.  @return 0, -EBADMSG (differs: a line per
 * difference), or -errno. */
static int verify_one(job *j, size_t i)
{
	const entry *e = &j->l->e[i];
	char a[65], b[65];
	flx_fs_seg seg;
	struct stat sb;
	int fd, rc = 0, bad = 0;

	fd = openat(j->outfd, e->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &sb)) {
		rc = -errno;
		goto out;
	}
	/* its pages are clean (fsync'd before the rename): drop them, so
	 * that what is compared comes from the disk, not the page cache */
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	if ((uint64_t)sb.st_size != e->size) {
		fprintf(stderr,
			"flexfs-materialize: %s/%s: %llu bytes, expected "
			"%llu\n",
			j->out, e->path, (unsigned long long)sb.st_size,
			(unsigned long long)e->size);
		rc = -EBADMSG;
		goto out;
	}
	for (size_t k = 0; !rc && !flx_fs_segment(j->fs, e->ino, k, &seg);
	     k++) {
		bool same;

		rc = compare_range(j, e, fd, seg.off, seg.len, false, &same, a,
				   b);
		if (seg.tensor)
			j->mine[C_TENSORS]++;
		if (rc || same)
			continue;
		rc = compare_range(j, e, fd, seg.off, seg.len, true, &same, a,
				   b);
		if (rc)
			continue;
		bad = 1;
		fprintf(stderr,
			"flexfs-materialize: %s/%s: %s%s (bytes %llu..%llu): "
			"differs: sha256 %.16s, expected %.16s\n",
			j->out, e->path, seg.tensor ? "tensor " : "",
			seg.tensor ? seg.tensor->fqn : "generated bytes",
			(unsigned long long)seg.off,
			(unsigned long long)(seg.off + seg.len), a, b);
	}
	if (!rc && bad)
		rc = -EBADMSG;
	if (!rc)
		j->mine[C_FILES]++;
out:
	if (fd >= 0)
		close(fd);
	if (rc && rc != -EBADMSG)
		fprintf(stderr,
			"flexfs-materialize: %s/%s: cannot verify: %s\n",
			j->out, e->path, strerror(-rc));
	return rc;
}

/* ---- the phases ---- */

/* Run op over this rank's files, with the progress rounds; the summed
 * counters in j->sum.  @return 0, or -errno when any rank failed. */
static int phase(job *j, int (*op)(job *, size_t), const char *what)
{
	int rc = 0;

	memset(j->mine, 0, sizeof(j->mine));
	memset(j->sum, 0, sizeof(j->sum));
	j->stop = j->all_done = false;
	j->what = what;
	clock_gettime(CLOCK_MONOTONIC, &j->t0);
	j->last = j->t0;
	for (size_t i = 0; i < j->l->n && !j->stop; i++) {
		if (j->l->e[i].dir || j->owner[i] != j->c->rank)
			continue;
		rc = op(j, i);
		if (rc == -EBADMSG) { /* a file verified unequal: said,
				       * counted, and the others checked */
			j->mine[C_BAD]++;
			rc = 0;
		}
		if (rc) {
			j->mine[C_ERR]++;
			break;
		}
		rc = poll_round(j);
		if (rc)
			break;
	}
	if (op == write_one && !j->mine[C_ERR] && !rc)
		rc = sync_dirs(j);
	if (rc && !j->mine[C_ERR])
		j->mine[C_ERR]++;
	/* a rank that failed still sums its counters, so that the others
	 * learn it and stop */
	rc = finish_rounds(j);
	if (!rc && (j->sum[C_ERR] || j->sum[C_BAD]))
		rc = -EIO;
	return rc;
}

static void final_line(job *j, double secs, int nranks, const char *kind)
{
	char w[32], s[32], r[32], pr[32];
	double rate = secs > 0 ? (double)j->sum[C_BYTES] / secs : 0;

	flx_mat_bytes(w, sizeof(w), j->sum[C_BYTES]);
	flx_mat_bytes(s, sizeof(s), j->sum[C_SKIPBYTES]);
	flx_mat_bytes(r, sizeof(r), (uint64_t)rate);
	flx_mat_bytes(pr, sizeof(pr), (uint64_t)(rate / nranks));
	printf("flexfs-materialize: %s: %llu files written (%s), %llu "
	       "skipped as complete (%s), %s, %.2f s, %s/s (%s/s per rank)\n",
	       j->out, (unsigned long long)j->sum[C_FILES], w,
	       (unsigned long long)j->sum[C_SKIPFILES], s, kind, secs, r, pr);
}

/* ---- main ---- */

enum { OPT_VIEWS = 256, OPT_VERIFY };

static const struct option long_opts[] = {
    {"views", required_argument, NULL, OPT_VIEWS},
    {"verify", no_argument, NULL, OPT_VERIFY},
    {"verbose", no_argument, NULL, 'v'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

typedef struct request {
	const char *views;
	bool verify, verbose;
	const char *src, *out;
} request;

static void report(const flx_error *e)
{
	char line[4 * FLX_ERR_FIELD];

	fprintf(stderr, "flexfs-materialize: %s\n",
		flx_error_line(e, line, sizeof(line)));
}

/* @return 0, 2 (usage, told on stderr), 3 (done: help or version). */
static int parse(int argc, char **argv, flx_mountopts *mo, request *rq,
		 bool talk)
{
	flx_error err;
	int ch;

	flx_error_init(&err);
	while ((ch = getopt_long(argc, argv, "o:vhV", long_opts, NULL)) != -1) {
		switch (ch) {
		case 'o':
			if (flx_mo_options(mo, optarg, &err)) {
				if (talk)
					report(&err);
				return 2;
			}
			break;
		case OPT_VIEWS:
			rq->views = optarg;
			break;
		case OPT_VERIFY:
			rq->verify = true;
			break;
		case 'v':
			rq->verbose = true;
			break;
		case 'h':
			if (talk)
				usage(stdout, argv[0]);
			return 3;
		case 'V':
			if (talk)
				printf("flexfs-materialize version %s (MPI: "
				       "%s)\n",
				       FLEXFS_VERSION, MPI_BUILT);
			return 3;
		default:
			if (talk)
				usage(stderr, argv[0]);
			return 2;
		}
	}
	if (optind != argc - 2) {
		if (talk)
			fprintf(stderr,
				"flexfs-materialize: expected SRC and OUT "
				"(see %s --help)\n",
				argv[0]);
		return 2;
	}
	rq->src = argv[optind];
	rq->out = argv[optind + 1];
	for (size_t i = 0; talk && i < mo->nfuse; i++)
		fprintf(stderr,
			"flexfs-materialize: ignoring mount option '%s'\n",
			mo->fuse[i]);
	return 0;
}

/* Agree on rc over the ranks; say err once: rank 0's when it failed
 * (every rank fails alike building the same stack), else each failing
 * rank's own.  @return the most negative rc. */
static int settle(flx_comm *c, int rc, flx_error *err)
{
	int all = rc, first = 0;

	if (flx_comm_agree(c, rc, &all) ||
	    flx_comm_agree(c, c->rank == 0 ? rc : 0, &first))
		all = all ? all : -EIO;
	if (rc && (c->rank == 0 || !first)) {
		if (!err->code)
			flx_error_set(err, rc, NULL, NULL, "%s", strerror(-rc));
		report(err);
	}
	return all;
}

int main(int argc, char **argv)
{
	flx_comm c;
	flx_mountopts mo;
	flx_stack st = {0};
	flx_ckpt_opts o;
	flx_error err;
	request rq = {0};
	list l = {0};
	job j = {0};
	int *owner = NULL;
	uint64_t *sizes = NULL;
	char key[65], note[2 * FLX_ERR_FIELD], kind[64];
	const char *env;
	char *src = NULL;
	const flx_slicer *slicer = NULL;
	char sline[1024];
	int rc;

	j.outfd = -1;
	flx_error_init(&err);
	if (flx_comm_init(&argc, &argv, &c))
		return 1;
	(void)flx_nofile_raise();
	if (flx_mo_init(&mo)) {
		fprintf(stderr, "flexfs-materialize: out of memory\n");
		flx_comm_end(&c);
		return 1;
	}
	rc = parse(argc, argv, &mo, &rq, c.rank == 0);
	if (rc) {
		flx_mo_release(&mo);
		flx_comm_end(&c);
		return rc == 3 ? 0 : rc;
	}
	/* every rank builds the same stack by the mount's own path, from
	 * the canonical source path as the mount does (index.json names it) */
	o = flx_mo_ckpt_opts(&mo);
	/* the mount's slicer, opened as the mount opens it: index.json
	 * records it, and gpu=on without a device is refused the same way */
	rc = flx_slicer_open(&mo.gpu, &slicer, sline, sizeof(sline));
	if (rc)
		flx_error_set(&err, rc, NULL, NULL, "%s",
			      rc == -ENOMEM ? "out of memory" : sline);
	else
		mo.spec.slicer = slicer->name;
	src = rc ? NULL : realpath(rq.src, NULL);
	if (!rc && !src)
		rc = flx_error_set(&err, -errno, rq.src, NULL, "%s",
				   strerror(errno));
	else if (!rc)
		rc = flx_stack_build(src, &o, &mo.spec, false, &st, &err);
	if (!rc)
		flx_fs_set_io(st.fs, &(flx_view_io){NULL, slicer, NULL});
	for (size_t i = 0;
	     !rc && c.rank == 0 && !flx_stack_note(&st, i, note, sizeof(note));
	     i++)
		fprintf(stderr, "flexfs-materialize: %s: %s\n", rq.src, note);
	if (!rc)
		rc = check_views(st.fs, rq.views, &err);
	if (!rc)
		rc = walk(st.fs, FLX_ROOT_INO, "", -1, rq.views, &l);
	j.buf = malloc(BLOCK);
	j.buf2 = malloc(BLOCK);
	owner = calloc(l.n ? l.n : 1, sizeof(*owner));
	sizes = calloc(l.n ? l.n : 1, sizeof(*sizes));
	if (!rc && (!j.buf || !j.buf2 || !owner || !sizes))
		rc = -ENOMEM;
	if (!rc)
		rc = run_key(&st, src, &l, j.buf, key);
	if (rc && !err.code)
		flx_error_set(&err, rc, rq.src, NULL, "%s", strerror(-rc));
	rc = settle(&c, rc, &err);
	if (rc)
		goto out;
	/* rank 0 makes OUT and its directories; the others open it after */
	if (c.rank == 0) {
		rc = prepare_out(src, rq.out, key, &j.outfd, &err);
		if (!rc)
			rc = make_dirs(j.outfd, rq.out, &l, &err);
	}
	rc = settle(&c, rc, &err);
	if (!rc) {
		if (c.rank != 0)
			j.outfd =
			    open(rq.out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (j.outfd < 0) {
			rc = -errno;
			flx_error_set(&err, rc, rq.out, NULL, "cannot open: %s",
				      strerror(-rc));
		}
		rc = settle(&c, rc, &err);
	}
	if (rc)
		goto out;
	for (size_t i = 0; i < l.n; i++) {
		sizes[i] = l.e[i].size;
		j.total += l.e[i].dir ? 0 : l.e[i].size;
	}
	rc = flx_mat_assign(sizes, l.n, c.size, owner);
	if (rc)
		goto out;
	j.out = rq.out;
	j.fs = st.fs;
	j.l = &l;
	j.owner = owner;
	j.c = &c;
	j.tty = isatty(STDERR_FILENO);
	j.verbose = rq.verbose;
	/* whole lines, whatever the ranks' output is forwarded through */
	setvbuf(stdout, NULL, _IOLBF, 0);
	env = getenv("FLEXFS_MATERIALIZE_KILL_AFTER");
	j.kill_after = env ? (unsigned)strtoul(env, NULL, 10) : 0;
	flx_comm_kind(&c, kind, sizeof(kind));
	rc = phase(&j, write_one, "");
	if (c.rank == 0)
		final_line(&j, since(&j.t0), c.size, kind);
	if (!rc && rq.verify) {
		j.kill_after = 0;
		rc = phase(&j, verify_one, "verify: ");
		if (c.rank == 0 && !rc)
			printf("flexfs-materialize: %s: verified %llu files, "
			       "%llu tensors: every tensor equal to the "
			       "tree's\n",
			       rq.out, (unsigned long long)j.sum[C_FILES],
			       (unsigned long long)j.sum[C_TENSORS]);
		else if (c.rank == 0)
			printf("flexfs-materialize: %s: verify failed\n",
			       rq.out);
	}
out:
	if (j.outfd >= 0)
		close(j.outfd);
	free(owner);
	free(sizes);
	free(j.buf);
	free(j.buf2);
	list_free(&l);
	flx_stack_free(&st);
	free(src);
	flx_mo_release(&mo);
	flx_slicer_close(slicer);
	flx_comm_end(&c);
	return rc ? 1 : 0;
}
