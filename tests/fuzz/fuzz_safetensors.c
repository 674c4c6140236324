/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the Hugging Face safetensors source, end to end.  The input
 * becomes the model.safetensors of a scratch directory, which is opened as
 * a mount opens it (header length, JSON, fields, data layout); a checkpoint
 * that opens is planned and turned into a tree, and every byte of its
 * hf/model.safetensors and of one rank's file is read, so that an accepted
 * header's offsets are exercised against the file.
 */
#include "ckpt.h"
#include "plan.h"
#include "tree.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char scratch[64];

/* Read all of path in the tree (which must exist when the open
 * succeeded). */
static void read_all(const flx_fs *fs, const char *path)
{
	static char buf[1 << 16];
	flx_stat st;
	uint64_t off = 0;
	ssize_t got;

	if (flx_fs_resolve(fs, path, &st))
		return;
	while ((got = flx_fs_read(fs, st.ino, buf, sizeof(buf), off, NULL)) > 0)
		off += (uint64_t)got;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[128];
	flx_ckpt *c = NULL;
	flx_spec s;
	flx_plan *p = NULL;
	flx_fs *fs = NULL;
	int fd;

	if (!scratch[0]) {
		snprintf(scratch, sizeof(scratch), "/tmp/flx-fuzz-st.XXXXXX");
		if (!mkdtemp(scratch))
			abort();
	}
	snprintf(path, sizeof(path), "%s/model.safetensors", scratch);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write(fd, data, size) != (ssize_t)size)
		abort();
	close(fd);
	if (flx_ckpt_open(scratch, &c, NULL) == 0 && flx_spec_init(&s) == 0) {
		s.tp = 2;
		s.pp = 2;
		if (flx_plan_build(c, &s, &p, NULL) == 0 &&
		    flx_fs_build(c, p, &fs, NULL) == 0) {
			read_all(fs, "hf/model.safetensors");
			read_all(fs, "ranks/tp01_pp01/model.safetensors");
		}
		flx_fs_free(fs);
		flx_plan_free(p);
		flx_spec_release(&s);
	}
	flx_ckpt_close(c);
	return 0;
}
