/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the DCP metadata interpreter and validator, end to end.  The
 * input becomes the .metadata of a scratch directory that holds the real
 * torch 1.13 fixture's data files, so interpreted entries reach the item
 * parsers and the coverage checks; a successful open is then planned and
 * turned into a tree, as a mount would.
 */
#include "fuzz_mount.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifndef FLX_FUZZ_FIXTURE
#define FLX_FUZZ_FIXTURE "tests/fixtures/dcp-t113/ckpt"
#endif

static char scratch[64];

/* The scratch directory: symlinks to every fixture file but .metadata. */
static int setup(void)
{
	char src[4096], dst[4400];
	const char *fx = getenv("FLX_FUZZ_FIXTURE");
	DIR *d;
	struct dirent *de;

	if (scratch[0])
		return 0;
	if (!fx)
		fx = FLX_FUZZ_FIXTURE;
	if (!realpath(fx, src))
		return -1;
	snprintf(scratch, sizeof(scratch), "/tmp/flx-fuzz-meta.XXXXXX");
	if (!mkdtemp(scratch))
		return -1;
	d = opendir(src);
	if (!d)
		return -1;
	while ((de = readdir(d))) {
		char target[4400];

		if (de->d_name[0] == '.')
			continue;
		snprintf(target, sizeof(target), "%.4000s/%s", src, de->d_name);
		snprintf(dst, sizeof(dst), "%s/%.300s", scratch, de->d_name);
		if (symlink(target, dst) && unlink(dst) == 0)
			(void)!symlink(target, dst);
	}
	closedir(d);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reads[] = {"hf/model.safetensors", NULL};

	if (setup())
		abort();
	flx_fuzz_mount(scratch, ".metadata", data, size, 3, 2, reads, 4096);
	return 0;
}
