/* SPDX-License-Identifier: MIT */
/*
 * flexfs-slice-bench: the slicer alone (gpu/slice.h), CPU backend against
 * the CUDA backend, on the batches a read of a transposed bf16 chunk
 * makes, without FUSE or files: what a backend costs per batch size, to
 * choose gpu_min from (docs/performance.md, "GPU slicing").
 *
 *   flexfs-slice-bench [--rows R] [--cols C] [--passes N] [--json FILE]
 *                      [SIZE...]           (default 128K 1M 4M 16M 64M)
 *
 * The chunk: R x C bf16 (default 8192 x 4096, 64 MiB) saved as the
 * transpose of a dense (C, R) storage, in memory, cut into the read
 * path's blocks (FLX_BCACHE_BLOCK, flx_bcache_block_len()).  A batch of
 * SIZE bytes is SIZE / (2C) whole rows of the row-major chunk: one run
 * per row (C elements, 2R bytes apart), every block they start in.  A
 * pass reads the chunk front to back in such batches.  For each SIZE:
 * the CPU backend's median pass; the CUDA backend (gpu_cache default,
 * one slicer, started first as the daemon starts it; every batch of a
 * SIZE of one origin, as a mount's are) first pass (blocks copied to the
 * device) and median later pass (blocks kept there).  Every batch of every
 * backend is compared with the CPU's bytes; a difference exits 1.  Without a
 * device the CUDA columns say why and the CPU ones are still measured.
 */
#include "bcache.h"
#include "slice.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct bench {
	uint64_t rows, cols;
	unsigned char *file; /* the saved storage, rows * cols * 2 bytes */
	uint64_t file_size;
	unsigned char *want; /* the chunk row-major: what every batch checks */
} bench;

typedef struct batch {
	flx_slice_batch b;
	flx_slice_run *runs;
	flx_slice_block *blocks;
	const bench *x;
} batch;

static int get(void *ctx, size_t k, const unsigned char **data)
{
	const batch *t = ctx;

	*data = t->x->file + t->b.blocks[k].start;
	return 0;
}

static void put(void *ctx, size_t k)
{
	(void)ctx;
	(void)k;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Rows [r0, r1) as batch t (its arrays owned: batch_free()). */
static int batch_make(const bench *x, uint64_t r0, uint64_t r1, uint64_t origin,
		      unsigned char *dst, batch *t)
{
	const uint64_t block = FLX_BCACHE_BLOCK;
	uint64_t *blk = NULL;
	size_t nblk = 0, n = 0;
	int rc = 0;

	memset(t, 0, sizeof(*t));
	t->x = x;
	t->runs = calloc(r1 - r0, sizeof(*t->runs));
	blk = calloc(x->cols * 2, sizeof(*blk));
	if (!t->runs || !blk) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint64_t r = r0; r < r1; r++)
		t->runs[r - r0] = (flx_slice_run){.src = r * 2,
						  .stride = x->rows * 2,
						  .dst = (r - r0) * x->cols * 2,
						  .len = x->cols * 2};
	/* the blocks every column's elements [r0, r1) start in */
	for (uint64_t c = 0; c < x->cols; c++) {
		uint64_t lo = (c * x->rows + r0) * 2 / block;
		uint64_t hi = (c * x->rows + r1 - 1) * 2 / block;

		blk[nblk++] = lo;
		if (hi != lo)
			blk[nblk++] = hi;
	}
	qsort(blk, nblk, sizeof(*blk), cmp_u64);
	t->blocks = calloc(nblk, sizeof(*t->blocks));
	if (!t->blocks) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nblk; i++)
		if (!i || blk[i] != blk[i - 1])
			t->blocks[n++] = (flx_slice_block){
			    blk[i] * block,
			    flx_bcache_block_len(block, x->file_size, blk[i]),
			    0};
	t->b = (flx_slice_batch){.elem_size = 2,
				 .dst = dst,
				 .dst_len = (r1 - r0) * x->cols * 2,
				 .runs = t->runs,
				 .nruns = r1 - r0,
				 .blocks = t->blocks,
				 .nblocks = n,
				 .block = block,
				 .origin = origin,
				 .get = get,
				 .put = put,
				 .ctx = t};
out:
	free(blk);
	return rc;
}

static void batch_free(batch *t)
{
	free(t->runs);
	free(t->blocks);
}

/* One pass over the chunk in batches of rows_per rows with s, each
 * checked against x->want.  @return 0, -EIO (wrong bytes), run's error. */
static int pass(const bench *x, const flx_slicer *s, uint64_t rows_per,
		uint64_t origin, unsigned char *dst, double *secs)
{
	double t0, spent = 0;
	int rc = 0;

	for (uint64_t r0 = 0; r0 < x->rows && !rc; r0 += rows_per) {
		uint64_t r1 = r0 + rows_per < x->rows ? r0 + rows_per : x->rows;
		batch t;

		rc = batch_make(x, r0, r1, origin, dst, &t);
		if (rc)
			break;
		t0 = now();
		rc = s->run(s, &t.b);
		spent += now() - t0;
		if (!rc &&
		    memcmp(dst, x->want + r0 * x->cols * 2, t.b.dst_len) != 0)
			rc = -EIO;
		batch_free(&t);
	}
	*secs = spent;
	return rc;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t parse_size(const char *s)
{
	char *end;
	uint64_t v = strtoull(s, &end, 10);

	if (*end == 'K' || *end == 'k')
		v <<= 10;
	else if (*end == 'M' || *end == 'm')
		v <<= 20;
	else if (*end == 'G' || *end == 'g')
		v <<= 30;
	return v;
}

int main(int argc, char **argv)
{
	static const char *const dflt[] = {"128K", "1M", "4M", "16M", "64M"};
	const char *sizes[32], *json = NULL;
	int nsizes = 0, passes = 5, rc = 0;
	flx_slicer_opts o = {FLX_GPU_ON, 0, 0, NULL, FLX_GPU_CACHE_DEFAULT};
	const flx_slicer *cuda = NULL;
	double start = 0;
	bool dev;
	bench x = {.rows = 8192, .cols = 4096};
	unsigned char *dst = NULL;
	double gb, v[64];
	FILE *jf = NULL;
	char line[1024];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--rows") && i + 1 < argc)
			x.rows = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--cols") && i + 1 < argc)
			x.cols = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--passes") && i + 1 < argc)
			passes = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--json") && i + 1 < argc)
			json = argv[++i];
		else if (argv[i][0] != '-' && nsizes < 32)
			sizes[nsizes++] = argv[i];
		else {
			fprintf(stderr, "usage: flexfs-slice-bench [--rows R] "
					"[--cols C] [--passes N] [--json FILE] "
					"[SIZE...]\n");
			return 2;
		}
	}
	if (!nsizes)
		for (; nsizes < 5; nsizes++)
			sizes[nsizes] = dflt[nsizes];
	if (passes < 2 || passes > 64 || !x.rows || !x.cols) {
		fprintf(stderr, "flexfs-slice-bench: bad --passes, --rows or "
				"--cols\n");
		return 2;
	}
	x.file_size = x.rows * x.cols * 2;
	x.file = malloc(x.file_size);
	x.want = malloc(x.file_size);
	dst = malloc(x.file_size);
	if (!x.file || !x.want || !dst) {
		fprintf(stderr, "flexfs-slice-bench: out of memory\n");
		return 1;
	}
	srand(1);
	for (uint64_t i = 0; i < x.file_size; i++)
		x.file[i] = (unsigned char)rand();
	/* element (r, c) of the chunk is storage element (c, r) */
	for (uint64_t r = 0; r < x.rows; r++)
		for (uint64_t c = 0; c < x.cols; c++)
			memcpy(x.want + (r * x.cols + c) * 2,
			       x.file + (c * x.rows + r) * 2, 2);
	if (json && !(jf = fopen(json, "w"))) {
		perror(json);
		return 1;
	}
	gb = (double)x.file_size / 1e9;
	printf("chunk %llu x %llu bf16 saved transposed (%.0f MiB), blocks of "
	       "%u KiB, %d passes\n",
	       (unsigned long long)x.rows, (unsigned long long)x.cols,
	       (double)x.file_size / 1048576, FLX_BCACHE_BLOCK >> 10, passes);
	dev = flx_slicer_open(&o, &cuda, line, sizeof(line)) == 0;
	if (dev) {
		double t0 = now();

		flx_slicer_start(cuda);
		start = now() - t0;
		printf("%s; started in %.3f s\n", line, start);
	}
	printf("%12s | %10s | %16s | %16s | %s\n", "batch", "cpu GB/s",
	       "cuda first GB/s", "cuda later GB/s", "later / cpu");
	if (jf)
		fprintf(jf,
			"{\"rows\": %llu, \"cols\": %llu, \"passes\": %d, "
			"\"cuda_start_s\": %.4f, \"sizes\": [",
			(unsigned long long)x.rows, (unsigned long long)x.cols,
			passes, start);
	for (int i = 0; i < nsizes && !rc; i++) {
		uint64_t size = parse_size(sizes[i]);
		uint64_t per = size / (x.cols * 2) ? size / (x.cols * 2) : 1;
		double cpu, first = 0, later = 0, t;

		for (int p = 0; p < passes && !rc; p++)
			rc = pass(&x, flx_slicer_cpu(), per, 0, dst, &v[p]);
		if (rc)
			break;
		cpu = median(v, passes);
		if (dev) {
			rc = pass(&x, cuda, per, (uint64_t)i + 1, dst, &first);
			for (int p = 0; p < passes && !rc; p++)
				rc = pass(&x, cuda, per, (uint64_t)i + 1, dst,
					  &v[p]);
			later = rc ? 0 : median(v, passes);
		}
		if (rc)
			break;
		t = (double)(per * x.cols * 2);
		if (dev)
			printf("%8.0f KiB | %10.2f | %16.2f | %16.2f | %.2f\n",
			       t / 1024, gb / cpu, gb / first, gb / later,
			       cpu / later);
		else
			printf("%8.0f KiB | %10.2f | %s\n", t / 1024, gb / cpu,
			       line);
		if (jf)
			fprintf(jf,
				"%s{\"batch\": %.0f, \"cpu_gbs\": %.4f, "
				"\"cuda_first_gbs\": %.4f, "
				"\"cuda_later_gbs\": %.4f}",
				i ? ", " : "", t, gb / cpu,
				dev ? gb / first : 0, dev ? gb / later : 0);
	}
	if (jf) {
		fprintf(jf, "]}\n");
		fclose(jf);
	}
	flx_slicer_close(cuda);
	if (rc)
		fprintf(stderr, "flexfs-slice-bench: %s\n",
			rc == -EIO ? "WRONG BYTES" : strerror(-rc));
	free(x.file);
	free(x.want);
	free(dst);
	return rc ? 1 : 0;
}
