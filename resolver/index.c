/* SPDX-License-Identifier: MIT */
/*
 * The global index and its format-neutral builder (source.h): opening a
 * checkpoint directory, choosing its source, loading and closing it.
 * Everything else a source needs that does not depend on its format is in
 * the index_*.c files (index_internal.h): the file table, chunk
 * validation, the item workers, read-ahead, extras and the name index.
 *
 * Everything is validated at open so a mount either fails with one precise
 * line or serves a checkpoint whose every chunk byte lies inside a file that
 * was present and long enough.
 */
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
#include <stdarg.h>
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

void flx_build_keep(flx_build *b, void *p, void (*fn)(void *))
{
	if (b->kept && b->kept_free)
		b->kept_free(b->kept);
	b->kept = p;
	b->kept_free = fn;
}

void *flx_build_take(flx_build *b)
{
	void *p = b->kept;

	b->kept = NULL;
	b->kept_free = NULL;
	return p;
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

/* Append to buf[cap] at *n, never past its end (a message cut short). */
static void append(char *buf, size_t cap, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *n, const char *fmt, ...)
{
	va_list ap;
	int k;

	if (*n >= cap)
		return;
	va_start(ap, fmt);
	k = vsnprintf(buf + *n, cap - *n, fmt, ap);
	va_end(ap);
	*n = k < 0 ? cap : *n + (size_t)k;
}

/* ", no MARKER (KIND)" for the sources from s on that share s's marker
 * (adjacent in flx_sources), their kinds shortened to the words they
 * share ("Maker fmt-a", "Maker fmt-b": "Maker").
 * @return the first source past the group. */
static const flx_source *const *list_marker(const flx_source *const *s,
					    char *buf, size_t cap, size_t *n)
{
	const flx_source *const *t = s + 1;
	size_t common = strlen((*s)->kind);

	for (; *t && strcmp((*t)->marker, (*s)->marker) == 0; t++) {
		size_t k = 0;

		while (k < common && (*t)->kind[k] == (*s)->kind[k])
			k++;
		if (k < common)
			while (k && (*s)->kind[k] != ' ')
				k--;
		common = k;
	}
	if (t - s > 1 && common) {
		append(buf, cap, n, ", no %s (%.*s)", (*s)->marker, (int)common,
		       (*s)->kind);
		return t;
	}
	append(buf, cap, n, ", no %s (", (*s)->marker);
	for (const flx_source *const *u = s; u < t; u++)
		append(buf, cap, n, "%s%s", u == s ? "" : " or ", (*u)->kind);
	append(buf, cap, n, ")");
	return t;
}

/* Whether dir holds training output directories "checkpoint-<step>"
 * (as common trainers write them): *count of them and the
 * highest step into *latest. */
static void find_step_dirs(int dirfd, size_t *count, unsigned long long *latest)
{
	int fd = dup(dirfd);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	struct dirent *e;

	*count = 0;
	*latest = 0;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	rewinddir(d); /* the duplicate shares the probes' position */
	while ((e = readdir(d))) {
		const char *p = e->d_name;
		char *end;
		unsigned long long step;
		struct stat st;

		if (strncmp(p, "checkpoint-", 11) || p[11] < '0' || p[11] > '9')
			continue;
		errno = 0;
		step = strtoull(p + 11, &end, 10);
		if (*end || errno ||
		    fstatat(dirfd, p, &st, AT_SYMLINK_NOFOLLOW) ||
		    !S_ISDIR(st.st_mode))
			continue;
		if (!*count || step > *latest)
			*latest = step;
		(*count)++;
	}
	closedir(d);
}

/* The source named by o->format, else the first whose probe recognises
 * the directory. */
static int pick_source(flx_build *b, const flx_ckpt_opts *o,
		       const flx_source **out)
{
	const flx_source *const *f = flx_sources;
	const flx_source *first;
	char others[FLX_ERR_FIELD] = "";
	unsigned long long latest;
	size_t n = 0, steps;

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
		rc = (*s)->probe_open ? (*s)->probe_open(b, &yes)
				      : (*s)->probe(b->dirfd, &yes);
		if (rc || !yes)
			flx_build_keep(b, NULL, NULL);
		if (rc)
			return flx_error_set(b->err, rc, b->c->dir, NULL,
					     "cannot look for %s: %s",
					     (*s)->marker, strerror(-rc));
		if (yes) {
			*out = *s;
			return 0;
		}
	}
	if (o->format)
		return flx_error_set(b->err, -EINVAL, b->c->dir, "format",
				     "unknown checkpoint format '%s'",
				     o->format);
	find_step_dirs(b->dirfd, &steps, &latest);
	if (steps)
		return flx_error_set(
		    b->err, -ENOENT, b->c->dir, NULL,
		    "a training output directory, not a "
		    "checkpoint: it holds %zu checkpoint-<step>/ "
		    "director%s; mount one of them (the latest: "
		    "checkpoint-%llu)",
		    steps, steps == 1 ? "y" : "ies", latest);
	for (const flx_source *const *s = flx_sources; *s;)
		if (*s == first)
			s++;
		else
			s = list_marker(s, others, sizeof(others), &n);
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
	flx_dirview v;
	char sub[256];
	int rc;

	/* a caller that entered the subdirectory itself has done this */
	if (o->entered)
		return 0;
	flx_dirview_local(&v, b->dirfd, b);
	rc = flx_source_enter(&v, o, sub, sizeof(sub), b->err);
	return rc || !sub[0] ? rc : descend(b, sub);
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
	flx_build_keep(b, NULL, NULL);
	prefetch_end(&b->pf);
	free(b->fmap);
	free(b->realdir);
	free(b->entered);
	if (b->dirfd >= 0)
		close(b->dirfd);
}

/* An option only its owner reads (FLX_OPT_OWN), given while another
 * source reads the checkpoint: refused, not ignored. */
static int check_foreign_opts(const flx_source *src, const flx_ckpt_opts *o,
			      const char *dir, flx_error *err)
{
	for (const flx_source *const *s = flx_sources; *s && o->vals; s++) {
		const flx_opt_group *g = (*s)->opts;

		if (*s == src || !g)
			continue;
		for (size_t i = 0; i < g->nopts; i++)
			if ((g->opts[i].flags & FLX_OPT_OWN) &&
			    flx_opt_given(o->vals, g->opts[i].name))
				return flx_error_set(
				    err, -EINVAL, dir, g->opts[i].name,
				    "%s= is given but the source is %s, "
				    "which does not read it (an option of "
				    "the %s source)",
				    g->opts[i].name, src->name, (*s)->name);
	}
	return 0;
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
	if (!rc)
		rc = check_foreign_opts(b.src, o, dir, err);
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
