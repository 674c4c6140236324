/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the Hugging Face safetensors source, end to end.  The input
 * becomes the model.safetensors of a scratch directory, which is opened as
 * a mount opens it (header length, JSON, fields, data layout); a checkpoint
 * that opens is planned and turned into a tree, and every byte of its
 * hf/model.safetensors and of one rank's file is read, so that an accepted
 * header's offsets are exercised against the file.
 */
#include "fuzz_mount.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reads[] = {
	    "hf/model.safetensors", "ranks/tp01_pp01/model.safetensors", NULL};
	const char *dir = flx_fuzz_scratch(NULL, "");

	if (!dir)
		abort();
	flx_fuzz_mount(dir, "model.safetensors", data, size, 2, 2, NULL, reads,
		       UINT64_MAX);
	return 0;
}
