/* SPDX-License-Identifier: MIT */
/*
 * What the sources say of a directory before one opens it: the local
 * directory as their enter hooks see it (source.h), the walk over the
 * hooks shared by the local open and the ranks' one, and which files are
 * metadata; and the walks over a directory's top names, local or the
 * ranks' sorted list of paths, that the views and
 * flx_build_each_name() share.
 */
#include "source.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static flx_dv_kind local_kind(const flx_dirview *v, const char *path)
{
	struct stat st;

	if (fstatat(v->dirfd, path, &st, AT_SYMLINK_NOFOLLOW))
		return errno == ENOENT ? FLX_DV_NONE : FLX_DV_OTHER;
	if (S_ISDIR(st.st_mode))
		return FLX_DV_DIR;
	if (S_ISLNK(st.st_mode) && fstatat(v->dirfd, path, &st, 0))
		return FLX_DV_OTHER;
	return S_ISREG(st.st_mode) ? FLX_DV_FILE : FLX_DV_OTHER;
}

int flx_each_local_name(int dirfd, unsigned max,
			int (*fn)(void *arg, const char *name, bool dir),
			void *arg)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;
	struct stat st;
	int rc = 0;

	if (!d) {
		rc = -errno;
		if (fd >= 0)
			close(fd);
		return rc;
	}
	for (unsigned n = 0; !rc && n < max && (e = readdir(d)); n++)
		if (e->d_name[0] != '.')
			rc = fn(arg, e->d_name,
				!fstatat(dirfd, e->d_name, &st,
					 AT_SYMLINK_NOFOLLOW) &&
				    S_ISDIR(st.st_mode));
	closedir(d);
	return rc;
}

int flx_each_listed_name(const char *(*name_at)(void *ctx, uint32_t i),
			 void *ctx, size_t longest, unsigned max_dirs,
			 int (*fn)(void *arg, const char *name, bool dir),
			 void *arg)
{
	char last[PATH_MAX] = "";
	const char *n, *sl;
	unsigned ndirs = 0;
	int rc = 0;

	if (longest >= sizeof(last))
		longest = sizeof(last) - 1;
	/* in strcmp() order: a subdirectory's names are adjacent */
	for (uint32_t i = 0; !rc && ndirs < max_dirs && (n = name_at(ctx, i));
	     i++) {
		size_t k;

		if (n[0] == '.')
			continue;
		if (!(sl = strchr(n, '/'))) {
			rc = fn(arg, n, false);
			continue;
		}
		k = (size_t)(sl - n);
		if (k > longest || (!strncmp(last, n, k) && !last[k]))
			continue;
		memcpy(last, n, k);
		last[k] = '\0';
		ndirs++;
		rc = fn(arg, last, true);
	}
	return rc;
}

/* An each_dir's fn, called for the directories of a walk above. */
typedef struct dirs_only {
	int (*fn)(void *arg, const char *name);
	void *arg;
} dirs_only;

static int pass_dir(void *arg, const char *name, bool dir)
{
	const dirs_only *d = arg;

	return dir ? d->fn(d->arg, name) : 0;
}

int flx_each_listed_dir(const char *(*name_at)(void *ctx, uint32_t i),
			void *ctx, size_t longest, unsigned max,
			int (*fn)(void *arg, const char *name), void *arg)
{
	dirs_only d = {fn, arg};

	return flx_each_listed_name(name_at, ctx, longest, max, pass_dir, &d);
}

static int local_each_dir(const flx_dirview *v, unsigned max,
			  int (*fn)(void *arg, const char *name), void *arg)
{
	dirs_only d = {fn, arg};

	return flx_each_local_name(v->dirfd, max, pass_dir, &d);
}

static int local_read(const flx_dirview *v, const char *path, uint64_t max,
		      void **buf, size_t *len, flx_error *err)
{
	int64_t mtime;

	if (!v->b)
		return flx_error_set(err, -ENOTSUP, path, NULL,
				     "not read by a probe");
	return flx_build_read_whole(v->b, path, max, NULL, buf, len, &mtime,
				    err);
}

void flx_dirview_local(flx_dirview *v, int dirfd, flx_build *b)
{
	*v = (flx_dirview){.dirfd = dirfd,
			   .b = b,
			   .where = "here",
			   .kind = local_kind,
			   .each_dir = local_each_dir,
			   .read = local_read};
}

int flx_source_enter(const flx_dirview *v, const flx_ckpt_opts *o, char *sub,
		     size_t cap, flx_error *err)
{
	for (const flx_source *const *s = flx_sources; *s; s++) {
		int rc;

		if (!(*s)->enter ||
		    (o->format && strcmp((*s)->name, o->format)))
			continue;
		sub[0] = '\0';
		rc = (*s)->enter(v, o, sub, cap, err);
		if (rc || sub[0])
			return rc;
	}
	sub[0] = '\0';
	return 0;
}

bool flx_source_metadata(const char *relpath)
{
	for (const flx_source *const *s = flx_sources; *s; s++)
		if ((*s)->metadata && !fnmatch((*s)->metadata, relpath, 0))
			return true;
	return false;
}
