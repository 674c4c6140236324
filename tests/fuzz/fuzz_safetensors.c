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

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char scratch[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reads[] = {
	    "hf/model.safetensors", "ranks/tp01_pp01/model.safetensors", NULL};

	if (!scratch[0]) {
		snprintf(scratch, sizeof(scratch), "/tmp/flx-fuzz-st.XXXXXX");
		if (!mkdtemp(scratch))
			abort();
	}
	flx_fuzz_mount(scratch, "model.safetensors", data, size, 2, 2, reads,
		       UINT64_MAX);
	return 0;
}
