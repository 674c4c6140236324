/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the Megatron-Core torch_dist common state (common.pt: a
 * torch.save zip whose data.pkl pickles args, iteration, ...), end to end.
 * The input becomes the common.pt of a scratch directory that holds the
 * rest of the megatron-untied fixture's iter_0000100, so a decoded state
 * reaches the interpreter; a successful open is then planned (tp=2) and
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
#define FLX_FUZZ_FIXTURE "tests/fixtures/megatron-untied/ckpt/iter_0000100"
#endif

static char scratch[64];

/* cp from to (copies: a symlink leaving the directory is refused). */
static int copy(const char *from, const char *to)
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
static void cleanup(void)
{
	char path[400];
	DIR *d = opendir(scratch);
	struct dirent *de;

	while (d && (de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%.300s", scratch, de->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(scratch);
}

/* The scratch directory: a copy of every fixture file but common.pt
 * (.metadata included). */
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
	snprintf(scratch, sizeof(scratch), "/tmp/flx-fuzz-megatron.XXXXXX");
	if (!mkdtemp(scratch))
		return -1;
	atexit(cleanup);
	d = opendir(src);
	if (!d)
		return -1;
	while ((de = readdir(d))) {
		char target[4400];

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    !strcmp(de->d_name, "common.pt"))
			continue;
		snprintf(target, sizeof(target), "%.4000s/%s", src, de->d_name);
		snprintf(dst, sizeof(dst), "%s/%.300s", scratch, de->d_name);
		if (copy(target, dst)) {
			closedir(d);
			return -1;
		}
	}
	closedir(d);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reads[] = {"hf/model.safetensors", NULL};

	if (setup())
		abort();
	flx_fuzz_mount(scratch, "common.pt", data, size, 2, 1, reads, 4096);
	return 0;
}
