/* SPDX-License-Identifier: MIT */
#ifndef FLX_FUZZ_MOUNT_H
#define FLX_FUZZ_MOUNT_H

/*
 * The mount path of the whole-checkpoint fuzz targets, written once: the
 * input becomes one file of a scratch checkpoint directory, which is
 * opened, planned at tp x pp and turned into a tree as a mount does; when
 * all of that succeeds, the first limit bytes of each file of reads
 * (paths in the tree; one that does not exist is skipped) are read, so an
 * accepted input's offsets are exercised against the files.
 * Aborts only when the scratch file cannot be written (the fuzzer's own
 * failure, not the input's).
 */
#include "ckpt.h"
#include "plan.h"
#include "tree.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

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
			   const char *const *reads, uint64_t limit)
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
		if (flx_plan_build(c, &s, &p, NULL) == 0 &&
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
