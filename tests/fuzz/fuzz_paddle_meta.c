/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: a Paddle Flex Checkpoint's {id}.metadata (resolver/paddle/
 * paddle.c: the pickle VM over the Metadata dataclass, state_dict_metadata,
 * storage_metadata, flat_mapping), end to end.  The input becomes the
 * 0.metadata of a scratch directory that holds the rest of the
 * paddle-flex-np2-sharding fixture (protocol 5, flattened shards,
 * replicas), so a decoded metadata reaches the .distcp files; a successful
 * open is then planned (tp=2) and turned into a tree, as a mount would.
 */
#include "fuzz_mount.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifndef FLX_FUZZ_FIXTURE
#define FLX_FUZZ_FIXTURE "tests/fixtures/paddle-flex-np2-sharding/ckpt"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reads[] = {"hf/model.safetensors", NULL};
	const char *dir = flx_fuzz_scratch(FLX_FUZZ_FIXTURE, "0.metadata");

	if (!dir)
		abort();
	flx_fuzz_mount(dir, "0.metadata", data, size, 2, 1, NULL, reads, 4096);
	return 0;
}
