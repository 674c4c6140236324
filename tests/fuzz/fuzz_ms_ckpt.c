/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: a MindSpore .ckpt file (resolver/mindspore/mindspore.c: the
 * encryption magic, the CRC trailer, the bounded wire decoder through its
 * pread window, Value runs, tensor_type and dims rules), end to end.  The
 * input becomes the one checkpoint file of a scratch directory (a single
 * rank, no strategy); a checkpoint that opens is planned (tp=2) and turned
 * into a tree, and its views are read, so the located payload offsets are
 * exercised against the file.
 */
#include "fuzz_mount.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reads[] = {
	    "hf/model.safetensors", "ranks/tp01_pp00/model.safetensors", NULL};
	const char *dir = flx_fuzz_scratch(NULL, "");

	if (!dir)
		abort();
	flx_fuzz_mount(dir, "m.ckpt", data, size, 2, 1, NULL, reads, 1 << 20);
	return 0;
}
