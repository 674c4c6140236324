/* SPDX-License-Identifier: MIT */
/*
 * Loading the CUDA backend (gpu/slice_load.c) on a machine without a GPU.
 *
 * Through a stub of libflexfs-cuda.so (stub_cuda.c, told what to do by
 * $FLEXFS_CUDA_STUB): the library missing, no device, a driver error, a
 * wrong ABI and a missing entry each give the CPU slicer and one line
 * saying why under gpu=auto, and fail with -ENODEV and one line under
 * gpu=on; gpu=off never loads it.  A working stub is used for batches of
 * at least gpu_min bytes only (the rest run on the CPU), is handed
 * gpu_device, and its errors come back while its -EAGAIN falls back to
 * the CPU; every result against an oracle.  Then the real
 * libflexfs-cuda.so when it was built: whatever this machine has, the
 * line is one line and gpu=auto mounts.
 */
#include "check.h"
#include "slice.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int *stub_counter(const char *name)
{
	void *dl = dlopen(STUB_PATH, RTLD_NOW | RTLD_NOLOAD);
	int *p = dl ? dlsym(dl, name) : NULL;

	if (dl)
		dlclose(dl);
	return p;
}

/* One line: not empty, no newline, fits. */
static void check_line(const char *line)
{
	CHECK(line[0] != '\0');
	CHECK(strchr(line, '\n') == NULL);
}

/* open with the stub in mode m; *out closed by the caller */
static int open_stub(const char *m, flx_gpu_mode mode, uint64_t min,
		     const flx_slicer **out, char *line, size_t n)
{
	flx_slicer_opts o = {mode, min, 0, STUB_PATH, 0};

	setenv("FLEXFS_CUDA_STUB", m, 1);
	return flx_slicer_open(&o, out, line, n);
}

static void test_fallbacks(void)
{
	static const struct {
		const char *mode, *why;
	} cases[] = {
	    {"nodev", "no CUDA device (stub)"},
	    {"driver", "driver error (stub)"},
	    {"abi", "not a flexfs CUDA backend"},
	    {"noentry", "not a flexfs CUDA backend"},
	};
	flx_slicer_opts missing = {FLX_GPU_AUTO, 0, 0,
				   "/nonexistent/libflexfs-cuda.so", 0};
	const flx_slicer *s;
	char line[1024];

	CHECK_EQ(flx_slicer_open(&missing, &s, line, sizeof(line)), 0);
	CHECK(s == flx_slicer_cpu());
	CHECK(strstr(line, "slicer: cpu (gpu=auto: libflexfs-cuda.so not "
			   "loaded (/nonexistent/libflexfs-cuda.so") == line);
	check_line(line);
	missing.mode = FLX_GPU_ON;
	CHECK_EQ(flx_slicer_open(&missing, &s, line, sizeof(line)), -ENODEV);
	CHECK(s == flx_slicer_cpu());
	CHECK(strstr(line, "gpu=on: no usable CUDA device: ") == line);
	check_line(line);

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		CHECK_EQ(open_stub(cases[i].mode, FLX_GPU_AUTO, 0, &s, line,
				   sizeof(line)),
			 0);
		CHECK(s == flx_slicer_cpu());
		CHECK(strstr(line, "slicer: cpu (gpu=auto: ") == line);
		CHECK(strstr(line, cases[i].why) != NULL);
		check_line(line);
		CHECK_EQ(open_stub(cases[i].mode, FLX_GPU_ON, 0, &s, line,
				   sizeof(line)),
			 -ENODEV);
		CHECK(s == flx_slicer_cpu());
		CHECK(strstr(line, "gpu=on: no usable CUDA device: ") == line);
		CHECK(strstr(line, cases[i].why) != NULL);
		check_line(line);
	}
	/* nothing of a failed load stays loaded */
	CHECK(stub_counter("stub_opens") == NULL);

	/* off: the stub is not even loaded */
	CHECK_EQ(open_stub("ok", FLX_GPU_OFF, 0, &s, line, sizeof(line)), 0);
	CHECK(s == flx_slicer_cpu());
	CHECK_STR(line, "slicer: cpu (gpu=off)");
	CHECK(stub_counter("stub_opens") == NULL);
	flx_slicer_close(s);
}

/* ---- batches through the working stub ---- */

typedef struct tfile {
	unsigned char data[4096];
	unsigned gets, puts;
} tfile;

static int tf_get(void *ctx, size_t k, const unsigned char **data)
{
	tfile *f = ctx;

	(void)k;
	f->gets++;
	*data = f->data + k * 1024;
	return 0;
}

static void tf_put(void *ctx, size_t k)
{
	tfile *f = ctx;

	(void)k;
	f->puts++;
}

/* Runs of len bytes each, stride 40, elements of 4 bytes, from one file
 * in 1024-byte blocks; the result against the file, gaps untouched. */
static int run_batch(const flx_slicer *s, size_t nruns, size_t len,
		     unsigned char *dst, size_t dst_len, tfile *f)
{
	flx_slice_run runs[8];
	flx_slice_block blocks[4];

	for (int k = 0; k < 4; k++)
		blocks[k] = (flx_slice_block){(uint64_t)k * 1024,
					      k < 3 ? 1024 + 16 : 1024, 0};
	for (size_t i = 0; i < nruns; i++)
		runs[i] = (flx_slice_run){4 * i, 40, 0, i * (len + 3), len, 0};
	memset(dst, 0xEE, dst_len);
	return flx_slicer_run(s, &(flx_slice_batch){.elem_size = 4,
						    .dst = dst,
						    .dst_len = dst_len,
						    .runs = runs,
						    .nruns = nruns,
						    .blocks = blocks,
						    .nblocks = 4,
						    .block = 1024,
						    .get = tf_get,
						    .put = tf_put,
						    .ctx = f});
}

static void check_result(const unsigned char *dst, size_t dst_len, size_t nruns,
			 size_t len, const tfile *f)
{
	for (size_t b = 0; b < dst_len; b++) {
		size_t i = b / (len + 3), p = b % (len + 3);
		int want = i < nruns && p < len
			       ? f->data[4 * i + p / 4 * 40 + p % 4]
			       : 0xEE;

		if (dst[b] != want) {
			fprintf(stderr, "byte %zu: %d, want %d\n", b, dst[b],
				want);
			check_failures++;
			return;
		}
	}
}

static void test_stub_batches(void)
{
	const flx_slicer *s;
	flx_slicer_opts o = {FLX_GPU_ON, 400, 3, STUB_PATH, 0};
	unsigned char dst[8 * 103];
	char line[1024];
	int *runs, *dev, *closes;
	tfile f = {{0}, 0, 0};

	for (size_t i = 0; i < sizeof(f.data); i++)
		f.data[i] = (unsigned char)(i * 7 + i / 251);
	setenv("FLEXFS_CUDA_STUB", "ok", 1);
	CHECK_EQ(flx_slicer_open(&o, &s, line, sizeof(line)), 0);
	CHECK_STR(s->name, "cuda");
	CHECK_STR(line, "slicer: cuda on device 3 (Stub GPU) for strided "
			"gathers and casts of 400 bytes or more, cpu below");
	runs = stub_counter("stub_runs");
	dev = stub_counter("stub_device");
	closes = stub_counter("stub_closes");
	CHECK(runs && dev && closes);
	if (!runs || !dev || !closes)
		return;
	CHECK_EQ(*dev, 3);
	/* start reaches the backend once; the CPU slicer has none */
	flx_slicer_start(s);
	flx_slicer_start(flx_slicer_cpu());
	flx_slicer_start(NULL);
	CHECK(stub_counter("stub_starts") && *stub_counter("stub_starts") == 1);
	/* 4 runs of 100 bytes: 400, taken by the device */
	CHECK_EQ(run_batch(s, 4, 100, dst, sizeof(dst), &f), 0);
	CHECK_EQ(*runs, 1);
	check_result(dst, sizeof(dst), 4, 100, &f);
	/* 399 bytes: declined, the CPU runs it */
	CHECK_EQ(run_batch(s, 3, 133, dst, sizeof(dst), &f), 0);
	CHECK_EQ(*runs, 1);
	check_result(dst, sizeof(dst), 3, 133, &f);
	/* the device's error comes back; its -EAGAIN goes to the CPU */
	setenv("FLEXFS_CUDA_STUB", "runerr", 1);
	CHECK_EQ(run_batch(s, 8, 100, dst, sizeof(dst), &f), -EIO);
	setenv("FLEXFS_CUDA_STUB", "busy", 1);
	CHECK_EQ(run_batch(s, 8, 100, dst, sizeof(dst), &f), 0);
	CHECK_EQ(*runs, 3);
	check_result(dst, sizeof(dst), 8, 100, &f);
	CHECK_EQ(f.gets, f.puts);
	/* an invalid batch never reaches the device */
	{
		flx_slice_batch bad = {.elem_size = 0};

		CHECK_EQ(s->run(s, &bad), -EINVAL);
		CHECK_EQ(*runs, 3);
	}
	flx_slicer_close(s);
	/* the object is unloaded with the slicer: read closes before */
	CHECK(stub_counter("stub_runs") == NULL);

	/* $FLEXFS_CUDA_LIB names the object when the options do not */
	setenv("FLEXFS_CUDA_STUB", "ok", 1);
	setenv("FLEXFS_CUDA_LIB", STUB_PATH, 1);
	o.library = NULL;
	CHECK_EQ(flx_slicer_open(&o, &s, line, sizeof(line)), 0);
	CHECK_STR(s->name, "cuda");
	flx_slicer_close(s);
	unsetenv("FLEXFS_CUDA_LIB");
}

/* The real object, when built: one line, and auto always mounts. */
static void test_real(void)
{
	flx_slicer_opts o = {FLX_GPU_ON, 0, 0, CUDA_PATH,
			     FLX_GPU_CACHE_DEFAULT};
	const flx_slicer *s;
	char line[1024];
	int rc;

	if (!CUDA_PATH[0]) {
		fprintf(stderr, "test_gpu_load: libflexfs-cuda.so not built "
				"(FLEXFS_WITH_CUDA off or no toolkit)\n");
		return;
	}
	rc = flx_slicer_open(&o, &s, line, sizeof(line));
	check_line(line);
	fprintf(stderr, "test_gpu_load: gpu=on with %s: %s\n", CUDA_PATH, line);
	CHECK(rc == 0 || rc == -ENODEV);
	CHECK(rc ? s == flx_slicer_cpu() : !strcmp(s->name, "cuda"));
	flx_slicer_close(s);
	o.mode = FLX_GPU_AUTO;
	CHECK_EQ(flx_slicer_open(&o, &s, line, sizeof(line)), 0);
	check_line(line);
	CHECK(rc ? s == flx_slicer_cpu() : !strcmp(s->name, "cuda"));
	flx_slicer_close(s);
}

int main(void)
{
	test_fallbacks();
	test_stub_batches();
	test_real();
	return CHECK_RESULT();
}
