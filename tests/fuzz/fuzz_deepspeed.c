/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: a DeepSpeed ZeRO optimizer states file (resolver/deepspeed/
 * deepspeed.c: the torch.save zip, its pickle through a bounded window, the
 * ZeRO keys, the flat partitions mapped to parameters), end to end.  The
 * input becomes zero_pp_rank_1_mp_rank_00_optim_states.pt of a scratch
 * directory that holds the rest of the zero2-fp16-dp2 fixture's tag
 * directory; a successful open is planned (tp=2) and turned into a tree,
 * and the first bytes of its views are read, so the located offsets are
 * exercised.
 */
#include "fuzz_mount.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifndef FLX_FUZZ_FIXTURE
#define FLX_FUZZ_FIXTURE                                                       \
	"tests/fixtures/deepspeed/zero2-fp16-dp2/ckpt/global_step5"
#endif

#define DS_FUZZ_FILE "zero_pp_rank_1_mp_rank_00_optim_states.pt"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reads[] = {"hf/model.safetensors", NULL};
	const char *dir = flx_fuzz_scratch(FLX_FUZZ_FIXTURE, DS_FUZZ_FILE);

	if (!dir)
		abort();
	flx_fuzz_mount(dir, DS_FUZZ_FILE, data, size, 2, 1, NULL, reads,
		       1 << 20);
	return 0;
}
