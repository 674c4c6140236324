/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: a Paddle Flex Checkpoint's .distcp file (resolver/paddle/
 * paddle.c: the pickle VM through a bounded window, numpy arrays of
 * protocols 2, 4 and 5 located in place, the name table), end to end.  The
 * input becomes 0_0.distcp of a scratch directory that holds the rest of
 * the paddle-flex-p4 fixture (its 0.metadata names the file's arrays); a
 * successful open is planned (tp=2) and turned into a tree, and the first
 * bytes of its views are read, so the located offsets are exercised.
 */
#include "fuzz_mount.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifndef FLX_FUZZ_FIXTURE
#define FLX_FUZZ_FIXTURE "tests/fixtures/paddle-flex-p4/ckpt"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reads[] = {"hf/model.safetensors", NULL};
	const char *dir = flx_fuzz_scratch(FLX_FUZZ_FIXTURE, "0_0.distcp");

	if (!dir)
		abort();
	flx_fuzz_mount(dir, "0_0.distcp", data, size, 2, 1, NULL, reads,
		       1 << 20);
	return 0;
}
