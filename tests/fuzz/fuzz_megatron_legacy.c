/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the megatron-legacy source (a Megatron-LM --ckpt-format
 * torch iteration directory), end to end.  The input becomes
 * mp_rank_00/model_optim_rng.pt of a scratch iteration directory of one
 * rank (tp 1, pp 1), so a decoded state dict reaches the source's
 * interpretation (args, model chunks, keys, split rules, layers); a
 * successful open is planned (tp=2) and turned into a tree whose hf/ and
 * megatron/ files are read, as a mount would.
 */
#include "fuzz_mount.h"

#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char rank_dir[128];

static void legacy_cleanup(void)
{
	char path[256];

	snprintf(path, sizeof(path), "%s/model_optim_rng.pt", rank_dir);
	unlink(path);
	rmdir(rank_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reads[] = {
	    "hf/model.safetensors",
	    "megatron/iter_0000100/mp_rank_00/model_optim_rng.pt",
	    "megatron/release/mp_rank_00/model_optim_rng.pt", NULL};
	const char *dir = flx_fuzz_scratch(NULL, "");

	if (!dir)
		abort();
	if (!rank_dir[0]) {
		snprintf(rank_dir, sizeof(rank_dir), "%s/mp_rank_00", dir);
		if (mkdir(rank_dir, 0700))
			abort();
		/* registered after the scratch's: runs first */
		atexit(legacy_cleanup);
	}
	flx_fuzz_mount(dir, "mp_rank_00/model_optim_rng.pt", data, size, 2, 1,
		       NULL, reads, 4096);
	return 0;
}
