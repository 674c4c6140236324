/* SPDX-License-Identifier: MIT */
#ifndef FLX_FUZZ_MOUNT_H
#define FLX_FUZZ_MOUNT_H

/*
 * The mount path of the whole-checkpoint fuzz targets, written once: the
 * input becomes one file of a scratch checkpoint directory, which is
 * opened, planned at tp x pp (with a rules file, or none) and turned into
 * a tree as a mount does; when
 * all of that succeeds, the first limit bytes of each file of reads
 * (paths in the tree; one that does not exist is skipped) are read, so an
 * accepted input's offsets are exercised against the files.
 * Aborts only when the scratch file cannot be written (the fuzzer's own
 * failure, not the input's).
 */
#include "ckpt.h"
#include "plan.h"
#include "tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The scratch checkpoint directory of this process ("" until made). */
static char flx_fuzz_dir[64];

/* cp from to.  @return 0 or -1. */
static int flx_fuzz_copy(const char *from, const char *to)
{
	char buf[65536];
	int in = open(from, O_RDONLY), out;
	ssize_t n;
	int rc = 0;

	if (in < 0)
		return -1;
	out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (out < 0) {
		close(in);
		return -1;
	}
	while ((n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, (size_t)n) != n)
			rc = -1;
	if (n < 0)
		rc = -1;
	close(in);
	close(out);
	return rc;
}

/* At exit: the scratch directory and its files. */
static void flx_fuzz_cleanup(void)
{
	char path[400];
	DIR *d = opendir(flx_fuzz_dir);
	struct dirent *de;

	while (d && (de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%.300s", flx_fuzz_dir,
			 de->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(flx_fuzz_dir);
}

/*
 * Make the scratch directory once per process (removed at exit): a copy
 * of every file of the fixture (FLX_FUZZ_FIXTURE in the environment, else
 * dflt; NULL: none) but skip, the file each input replaces.  Copies, not
 * symlinks: a symlink leaving the directory is refused at open, and no
 * input would get past its data files.
 * @return the directory, or NULL.
 */
static const char *flx_fuzz_scratch(const char *dflt, const char *skip)
{
	char src[4096], from[4400], to[4400];
	const char *fx = getenv("FLX_FUZZ_FIXTURE");
	DIR *d;
	struct dirent *de;
	int rc = 0;

	if (flx_fuzz_dir[0])
		return flx_fuzz_dir;
	snprintf(flx_fuzz_dir, sizeof(flx_fuzz_dir), "/tmp/flx-fuzz.XXXXXX");
	if (!mkdtemp(flx_fuzz_dir))
		return NULL;
	atexit(flx_fuzz_cleanup);
	if (!fx)
		fx = dflt;
	if (!fx)
		return flx_fuzz_dir;
	if (!realpath(fx, src) || !(d = opendir(src)))
		return NULL;
	while (!rc && (de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    !strcmp(de->d_name, skip))
			continue;
		snprintf(from, sizeof(from), "%.4000s/%s", src, de->d_name);
		snprintf(to, sizeof(to), "%s/%.300s", flx_fuzz_dir, de->d_name);
		rc = flx_fuzz_copy(from, to);
	}
	closedir(d);
	return rc ? NULL : flx_fuzz_dir;
}

static void flx_fuzz_read(const flx_fs *fs, const char *path, uint64_t limit)
{
	static char buf[1 << 16];
	flx_stat st;
	uint64_t off = 0;
	ssize_t got = 1;

	if (flx_fs_resolve(fs, path, &st))
		return;
	while (off < limit && got > 0) {
		size_t n = limit - off < sizeof(buf) ? (size_t)(limit - off)
						     : sizeof(buf);

		got = flx_fs_read(fs, st.ino, buf, n, off, NULL);
		off += got > 0 ? (uint64_t)got : 0;
	}
}

static void flx_fuzz_mount(const char *dir, const char *file,
			   const uint8_t *data, size_t size, int tp, int pp,
			   const char *rules, const char *const *reads,
			   uint64_t limit)
{
	char path[512];
	flx_ckpt *c = NULL;
	flx_spec s;
	flx_plan *p = NULL;
	flx_fs *fs = NULL;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write(fd, data, size) != (ssize_t)size)
		abort();
	close(fd);
	if (flx_ckpt_open(dir, &c, NULL) == 0 && flx_spec_init(&s) == 0) {
		s.tp = tp;
		s.pp = pp;
		if ((!rules || flx_spec_set(&s, "rules", rules, NULL) == 0) &&
		    flx_plan_build(c, &s, &p, NULL) == 0 &&
		    flx_fs_build(c, p, &fs, NULL) == 0)
			for (size_t i = 0; reads[i]; i++)
				flx_fuzz_read(fs, reads[i], limit);
		flx_fs_free(fs);
		flx_plan_free(p);
		flx_spec_release(&s);
	}
	flx_ckpt_close(c);
}

#endif
