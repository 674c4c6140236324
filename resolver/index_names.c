/* SPDX-License-Identifier: MIT */
/* Extras (files served as they are) and the name index (source.h,
 * ckpt.h). */
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
int load_extras(flx_build *b)
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
		/* what the listing says is neither needs no stat (a
		 * directory of thousands of rank directories) */
		if (de->d_type != DT_UNKNOWN && de->d_type != DT_REG &&
		    de->d_type != DT_LNK)
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

/* ---- names ---- */

static int cmp_tensor_ptr(const void *a, const void *b)
{
	return strcmp((*(flx_tensor *const *)a)->fqn,
		      (*(flx_tensor *const *)b)->fqn);
}

/* Sorted view for flx_ckpt_find(), and the uniqueness of names. */
int build_names(flx_build *b)
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
