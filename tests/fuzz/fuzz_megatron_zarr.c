/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the Megatron-Core zarr backend's .zarray (a Zarr v2 array's
 * JSON: shape, chunks, dtype, compressor, order, filters, separator), end
 * to end.  The input becomes w/.zarray of a scratch zarr checkpoint (the
 * megatron-zarr fixture's metadata.json and common.pt) whose key w has
 * chunk files "0", "0.0", "1.0", "0.1", "1.1" of 64 bytes and "0.0.0" of
 * 8, and an object w/shard_0_1.pt, so that accepted grids meet present,
 * missing and wrongly sized chunks; a successful open is planned (tp=2)
 * and every byte of hf/model.safetensors read.
 */
#include "fuzz_mount.h"

#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifndef FLX_FUZZ_FIXTURE
#define FLX_FUZZ_FIXTURE "tests/fixtures/megatron-zarr/ckpt/iter_0000100"
#endif

static const struct {
	const char *name;
	size_t len;
} chunks[] = {
    {"0", 64},	 {"0.0", 64},  {"1.0", 64},	    {"0.1", 64},
    {"1.1", 64}, {"0.0.0", 8}, {"shard_0_1.pt", 4},
};

static char zarr_key[128];

/* At exit (before flx_fuzz_cleanup, registered first): the key
 * directory. */
static void zarr_cleanup(void)
{
	char path[256];

	for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", zarr_key, chunks[i].name);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/.zarray", zarr_key);
	unlink(path);
	rmdir(zarr_key);
}

/* The scratch zarr checkpoint, once per process.  @return it or NULL. */
static const char *zarr_scratch(void)
{
	static const char *const own[] = {"metadata.json", "common.pt"};
	const char *fx = getenv("FLX_FUZZ_FIXTURE");
	const char *dir;
	char from[4400], to[256];
	unsigned char fill[64];

	if (zarr_key[0])
		return flx_fuzz_dir;
	dir = flx_fuzz_scratch(NULL, "");
	if (!dir)
		return NULL;
	snprintf(zarr_key, sizeof(zarr_key), "%s/w", dir);
	if (mkdir(zarr_key, 0700))
		return NULL;
	atexit(zarr_cleanup);
	for (size_t i = 0; i < 2; i++) {
		snprintf(from, sizeof(from), "%.4000s/%s",
			 fx ? fx : FLX_FUZZ_FIXTURE, own[i]);
		snprintf(to, sizeof(to), "%s/%s", dir, own[i]);
		if (flx_fuzz_copy(from, to))
			return NULL;
	}
	memset(fill, 0x3c, sizeof(fill));
	for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
		int fd;

		snprintf(to, sizeof(to), "%s/%s", zarr_key, chunks[i].name);
		fd = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd < 0 ||
		    write(fd, fill, chunks[i].len) != (ssize_t)chunks[i].len)
			return NULL;
		close(fd);
	}
	return dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reads[] = {"hf/model.safetensors", NULL};
	const char *dir = zarr_scratch();

	if (!dir)
		abort();
	flx_fuzz_mount(dir, "w/.zarray", data, size, 2, 1, NULL, reads,
		       UINT64_MAX);
	return 0;
}
