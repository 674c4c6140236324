/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the DCP metadata interpreter and validator, end to end.  The
 * input becomes the .metadata of a scratch directory that holds the real
 * torch 1.13 fixture's data files, so interpreted entries reach the item
 * parsers and the coverage checks; a successful open is then planned and
 * turned into a tree, as a mount would.
 */
#include "fuzz_mount.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifndef FLX_FUZZ_FIXTURE
#define FLX_FUZZ_FIXTURE "tests/fixtures/dcp-t113/ckpt"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reads[] = {"hf/model.safetensors", NULL};
	const char *dir = flx_fuzz_scratch(FLX_FUZZ_FIXTURE, ".metadata");

	if (!dir)
		abort();
	/* the fixture's 2-D block-sharded tensor needs its rule at tp=3 */
	flx_fuzz_mount(dir, ".metadata", data, size, 3, 2,
		       "tests/fixtures/rules.json", reads, 4096);
	return 0;
}
