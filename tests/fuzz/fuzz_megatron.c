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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifndef FLX_FUZZ_FIXTURE
#define FLX_FUZZ_FIXTURE "tests/fixtures/megatron-untied/ckpt/iter_0000100"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reads[] = {"hf/model.safetensors", NULL};
	const char *dir = flx_fuzz_scratch(FLX_FUZZ_FIXTURE, "common.pt");

	if (!dir)
		abort();
	flx_fuzz_mount(dir, "common.pt", data, size, 2, 1, NULL, reads, 4096);
	return 0;
}
