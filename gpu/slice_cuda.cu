/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend of the slicer (slice.h), built as libflexfs-cuda.so
 * (slice_cuda.h says why a shared object of its own).
 *
 * A batch is made one submission.  The host first cuts it into pieces
 * and rows of transposes (slice_plan.h: the same rule as the CPU
 * backend).  Then block after block: the block is pinned (get), copied into a
 * pinned staging buffer and released (put), and its copy to the device, its
 * pieces' kernels and nothing else are queued on one of two streams, so
 * the next block is fetched and copied while this one's kernels run.
 * The request's bytes are assembled in device memory, copied back once
 * into pinned memory at the end, and from there only the runs' bytes go to
 * the caller's buffer (no byte outside the runs is written).
 *
 * Rows of a transpose go through tiles in shared memory: a tile of
 * TILE x TILE elements is read along the source's dense axis and written
 * along the destination's, both coalesced.  Other pieces take one thread
 * per element.  Every copy is a copy of bytes: the result is bit-identical
 * to the CPU backend's.  A batch carrying a cast (slice.h) takes the same
 * way through kernels that convert each element as they write it, with
 * elemcast.h's code, the CPU's: gather and conversion in one pass, the
 * converted bytes bit-identical to the CPU's by construction.
 *
 * Device state: NLANES lanes, each two streams, their events and buffers,
 * taken by one batch at a time under a mutex; a batch finding every lane
 * taken returns -EAGAIN (the CPU runs it).  Every CUDA error becomes -EIO
 * here, in fail(), which prints the first one.
 */
#include "elemcast.h"
#include "slice_cuda.h"
#include "slice_plan.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NLANES	 4
#define NSTREAMS 2
#define TILE	 32
#define ROWS	 8 /* threads per tile column: TILE / ROWS rows each */

typedef flx_piece piece;
typedef flx_rows rows;
typedef flx_plan plan;

typedef struct lane {
	bool busy, ready, broken;
	cudaStream_t s[NSTREAMS];
	cudaEvent_t done[NSTREAMS]; /* the slot's buffers are free again */
	unsigned char *h_blk[NSTREAMS], *d_blk[NSTREAMS];
	size_t cap_blk;
	piece *h_pc[NSTREAMS], *d_pc[NSTREAMS];
	rows *h_rw[NSTREAMS], *d_rw[NSTREAMS];
	size_t cap_pc, cap_rw;
	unsigned char *h_dst, *d_dst;
	size_t cap_dst;
} lane;

typedef struct device {
	int id;
	pthread_mutex_t mu;
	lane lanes[NLANES];
} device;

static int reported;

/* A CUDA error as -EIO, the first one printed on stderr. */
static int fail(const char *what, cudaError_t e)
{
	if (!__atomic_exchange_n(&reported, 1, __ATOMIC_RELAXED))
		fprintf(stderr, "flexfs: cuda: %s: %s\n", what,
			cudaGetErrorString(e));
	return -EIO;
}

#define CU(call)                                                               \
	do {                                                                   \
		cudaError_t e_ = (call);                                       \
		if (e_ != cudaSuccess) {                                       \
			rc = fail(#call, e_);                                  \
			l->broken = true;                                      \
			goto out;                                              \
		}                                                              \
	} while (0)

/* ---- kernels ---- */

/* One element of esz bytes (a compile-time size: one load, one store). */
template <size_t E> struct elem {
	unsigned char b[E];
};

/* Pieces: CUDA block p copies piece p, a thread per element; partial
 * elements at a run's ends byte by byte. */
template <size_t E>
__global__ void pieces_kernel(const unsigned char *blk, const piece *pc,
			      unsigned char *dst, size_t esz_rt)
{
	const piece p = pc[blockIdx.x];
	const size_t esz = E ? E : esz_rt;

	for (uint64_t i = threadIdx.x; i < p.n; i += blockDim.x) {
		const unsigned char *s = blk + p.soff + i * p.stride;
		uint64_t q = i * esz;

		if constexpr (E != 0) {
			if (q >= p.lo && q + E <= p.hi) {
				memcpy(dst + p.dbase + q, s, E);
				continue;
			}
		}
		for (size_t b = 0; b < esz; b++)
			if (q + b >= p.lo && q + b < p.hi)
				dst[p.dbase + (int64_t)(q + b)] = s[b];
	}
}

/* Rows of a transpose through a shared-memory tile.  blockIdx.y: the
 * rows set, blockIdx.x: its tile (row-tile major); threads TILE x ROWS.
 * CAST: the tile holds source elements, each converted by c as it is
 * written (c.to.size bytes in dst per element); else copied, E bytes. */
template <size_t E, bool CAST>
__global__ void rows_kernel(const unsigned char *blk, const rows *rw,
			    unsigned char *dst, flx_ecast c)
{
	__shared__ elem<E> tile[TILE][TILE + 1];
	const rows g = rw[blockIdx.y];
	uint64_t tn = (g.n + TILE - 1) / TILE;
	uint64_t r0 = blockIdx.x / tn * TILE, i0 = blockIdx.x % tn * TILE;

	if (r0 >= g.nrows)
		return;
	/* read: consecutive threads take consecutive rows (the source's
	 * dense axis: rows are a bytes apart) */
	for (unsigned k = threadIdx.y; k < TILE; k += ROWS) {
		uint64_t r = r0 + threadIdx.x, i = i0 + k;

		if (r < g.nrows && i < g.n)
			memcpy(&tile[k][threadIdx.x],
			       blk + g.soff + r * g.a + i * g.stride, E);
	}
	__syncthreads();
	/* write: consecutive threads take consecutive elements of a row */
	for (unsigned k = threadIdx.y; k < TILE; k += ROWS) {
		uint64_t r = r0 + k, i = i0 + threadIdx.x;

		if (r >= g.nrows || i >= g.n)
			continue;
		if constexpr (CAST)
			flx_ecast_one(&c,
				      dst + g.dbase + r * g.d + i * c.to.size,
				      tile[threadIdx.x][k].b);
		else
			memcpy(dst + g.dbase + r * g.d + i * E,
			       &tile[threadIdx.x][k], E);
	}
}

/* Pieces of a cast batch: whole elements, each converted (c->to.size
 * bytes in dst per source element). */
__global__ void pieces_cast_kernel(const unsigned char *blk, const piece *pc,
				   unsigned char *dst, flx_ecast c)
{
	const piece p = pc[blockIdx.x];

	for (uint64_t i = threadIdx.x; i < p.n; i += blockDim.x)
		flx_ecast_one(&c, dst + p.dbase + (int64_t)(i * c.to.size),
			      blk + p.soff + i * p.stride);
}

/* ---- lanes ---- */

static void lane_free_bufs(lane *l)
{
	for (int s = 0; s < NSTREAMS; s++) {
		cudaFreeHost(l->h_blk[s]);
		cudaFree(l->d_blk[s]);
		cudaFreeHost(l->h_pc[s]);
		cudaFree(l->d_pc[s]);
		cudaFreeHost(l->h_rw[s]);
		cudaFree(l->d_rw[s]);
		l->h_blk[s] = l->d_blk[s] = NULL;
		l->h_pc[s] = l->d_pc[s] = NULL;
		l->h_rw[s] = l->d_rw[s] = NULL;
	}
	cudaFreeHost(l->h_dst);
	cudaFree(l->d_dst);
	l->h_dst = l->d_dst = NULL;
	l->cap_blk = l->cap_pc = l->cap_rw = l->cap_dst = 0;
}

/* The lane's buffers at least this large (the lane is idle). */
static int lane_fit(lane *l, size_t blk, size_t npc, size_t dst)
{
	int rc = 0;

	if (!l->ready) {
		for (int s = 0; s < NSTREAMS; s++) {
			CU(cudaStreamCreateWithFlags(&l->s[s],
						     cudaStreamNonBlocking));
			CU(cudaEventCreateWithFlags(&l->done[s],
						    cudaEventDisableTiming));
		}
		l->ready = true;
	}
	if (blk > l->cap_blk)
		for (int s = 0; s < NSTREAMS; s++) {
			cudaFreeHost(l->h_blk[s]);
			cudaFree(l->d_blk[s]);
			l->h_blk[s] = l->d_blk[s] = NULL;
			l->cap_blk = 0;
			CU(cudaHostAlloc((void **)&l->h_blk[s], blk,
					 cudaHostAllocDefault));
			CU(cudaMalloc((void **)&l->d_blk[s], blk));
		}
	l->cap_blk = blk > l->cap_blk ? blk : l->cap_blk;
	if (npc > l->cap_pc)
		for (int s = 0; s < NSTREAMS; s++) {
			cudaFreeHost(l->h_pc[s]);
			cudaFree(l->d_pc[s]);
			cudaFreeHost(l->h_rw[s]);
			cudaFree(l->d_rw[s]);
			l->h_pc[s] = l->d_pc[s] = NULL;
			l->h_rw[s] = l->d_rw[s] = NULL;
			l->cap_pc = 0;
			CU(cudaHostAlloc((void **)&l->h_pc[s],
					 npc * sizeof(piece),
					 cudaHostAllocDefault));
			CU(cudaMalloc((void **)&l->d_pc[s],
				      npc * sizeof(piece)));
			CU(cudaHostAlloc((void **)&l->h_rw[s],
					 npc * sizeof(rows),
					 cudaHostAllocDefault));
			CU(cudaMalloc((void **)&l->d_rw[s],
				      npc * sizeof(rows)));
		}
	l->cap_pc = npc > l->cap_pc ? npc : l->cap_pc;
	if (dst > l->cap_dst) {
		cudaFreeHost(l->h_dst);
		cudaFree(l->d_dst);
		l->h_dst = l->d_dst = NULL;
		l->cap_dst = 0;
		CU(cudaHostAlloc((void **)&l->h_dst, dst,
				 cudaHostAllocDefault));
		CU(cudaMalloc((void **)&l->d_dst, dst));
		l->cap_dst = dst;
	}
out:
	if (rc)
		lane_free_bufs(l);
	return rc;
}

static lane *lane_take(device *d)
{
	lane *l = NULL;

	pthread_mutex_lock(&d->mu);
	for (int i = 0; i < NLANES && !l; i++)
		if (!d->lanes[i].busy && !d->lanes[i].broken) {
			l = &d->lanes[i];
			l->busy = true;
		}
	pthread_mutex_unlock(&d->mu);
	return l;
}

/* l->broken was set by its batch (CU) after a device error: the lane is
 * not taken again, and once all are broken every batch goes to the CPU */
static void lane_give(device *d, lane *l)
{
	pthread_mutex_lock(&d->mu);
	l->busy = false;
	pthread_mutex_unlock(&d->mu);
}

/* ---- a batch ---- */

/* Rows sets in grids of at most 65535 (gridDim.y); c: the batch's cast
 * or NULL */
template <size_t E>
static void launch_rows(lane *l, int s, size_t nrw, const flx_ecast *c)
{
	for (size_t g = 0; g < nrw;) {
		size_t m = nrw - g < 65535 ? nrw - g : 65535;
		uint64_t tiles = 0;

		/* one grid over the largest rows set of these m */
		for (size_t k = g; k < g + m; k++) {
			const rows *r = &l->h_rw[s][k];
			uint64_t t = ((r->nrows + TILE - 1) / TILE) *
				     ((r->n + TILE - 1) / TILE);

			tiles = t > tiles ? t : tiles;
		}
		dim3 grid((unsigned)tiles, (unsigned)m), threads(TILE, ROWS);

		if (c)
			rows_kernel<E, true><<<grid, threads, 0, l->s[s]>>>(
			    l->d_blk[s], l->d_rw[s] + g, l->d_dst, *c);
		else
			rows_kernel<E, false><<<grid, threads, 0, l->s[s]>>>(
			    l->d_blk[s], l->d_rw[s] + g, l->d_dst, flx_ecast{});
		g += m;
	}
}

template <size_t E>
static void launch(lane *l, int s, size_t npc, size_t nrw, size_t esz,
		   const flx_ecast *c)
{
	if (npc && c)
		pieces_cast_kernel<<<(unsigned)npc, 128, 0, l->s[s]>>>(
		    l->d_blk[s], l->d_pc[s], l->d_dst, *c);
	else if (npc)
		pieces_kernel<E><<<(unsigned)npc, 128, 0, l->s[s]>>>(
		    l->d_blk[s], l->d_pc[s], l->d_dst, esz);
	if constexpr (E != 0)
		launch_rows<E>(l, s, nrw, c);
}

static bool fixed_size(size_t esz)
{
	return esz == 1 || esz == 2 || esz == 4 || esz == 8 || esz == 16;
}

/* A cast's source elements have fixed sizes (1, 2, 4, 8: elemcast.h),
 * so a cast never takes launch<0>. */
static void launch_any(lane *l, int s, size_t npc, size_t nrw, size_t esz,
		       const flx_ecast *c)
{
	switch (esz) {
	case 1:
		launch<1>(l, s, npc, nrw, esz, c);
		break;
	case 2:
		launch<2>(l, s, npc, nrw, esz, c);
		break;
	case 4:
		launch<4>(l, s, npc, nrw, esz, c);
		break;
	case 8:
		launch<8>(l, s, npc, nrw, esz, c);
		break;
	case 16:
		launch<16>(l, s, npc, nrw, esz, c);
		break;
	default:
		launch<0>(l, s, npc, nrw, esz, NULL);
	}
}

/* The batch's pieces executed on lane l (see the top of this file). */
static int run_lane(device *d, lane *l, const flx_slice_batch *b, const plan *p)
{
	size_t maxblk = 1, maxpc = 1, j = 0;
	size_t osz = b->cast ? b->cast->to.size : b->elem_size;
	bool pinned = false;
	size_t pinned_k = 0;
	int rc = 0;

	for (size_t k = 0; k < b->nblocks; k++) {
		size_t n = p->first[k + 1] - p->first[k];

		if (n && b->blocks[k].len > maxblk)
			maxblk = b->blocks[k].len;
		maxpc = n > maxpc ? n : maxpc;
	}
	CU(cudaSetDevice(d->id));
	rc = lane_fit(l, maxblk, maxpc, b->dst_len ? b->dst_len : 1);
	if (rc)
		goto out;
	for (size_t k = 0; k < b->nblocks; k++) {
		size_t first = p->first[k], n = p->first[k + 1] - first;
		const unsigned char *data;
		size_t npc = n, nrw = 0, len = b->blocks[k].len;
		int s;

		if (!n)
			continue;
		s = (int)(j++ % NSTREAMS);
		/* the slot's last block copied and executed */
		CU(cudaEventSynchronize(l->done[s]));
		rc = b->get(b->ctx, k, &data);
		if (rc)
			goto out;
		pinned = true;
		pinned_k = k;
		memcpy(l->h_blk[s], data, len);
		b->put(b->ctx, k);
		pinned = false;
		/* rows of transposes go to the tiled kernel, which has
		 * compile-time element sizes only */
		if (fixed_size(b->elem_size))
			flx_plan_rows(p->pc + first, n, osz, l->h_pc[s], &npc,
				      l->h_rw[s], &nrw);
		else
			memcpy(l->h_pc[s], p->pc + first, n * sizeof(piece));
		CU(cudaMemcpyAsync(l->d_blk[s], l->h_blk[s], len,
				   cudaMemcpyHostToDevice, l->s[s]));
		if (npc)
			CU(cudaMemcpyAsync(l->d_pc[s], l->h_pc[s],
					   npc * sizeof(piece),
					   cudaMemcpyHostToDevice, l->s[s]));
		if (nrw)
			CU(cudaMemcpyAsync(l->d_rw[s], l->h_rw[s],
					   nrw * sizeof(rows),
					   cudaMemcpyHostToDevice, l->s[s]));
		launch_any(l, s, npc, nrw, b->elem_size, b->cast);
		CU(cudaGetLastError());
		CU(cudaEventRecord(l->done[s], l->s[s]));
	}
	for (int s = 0; s < NSTREAMS; s++)
		CU(cudaStreamSynchronize(l->s[s]));
	if (b->dst_len)
		CU(cudaMemcpy(l->h_dst, l->d_dst, b->dst_len,
			      cudaMemcpyDeviceToHost));
	flx_plan_copy_runs(b, l->h_dst);
out:
	if (pinned)
		b->put(b->ctx, pinned_k);
	/* nothing of a failed batch left in flight on the lane */
	if (rc && l->ready)
		for (int s = 0; s < NSTREAMS; s++)
			cudaStreamSynchronize(l->s[s]);
	return rc;
}

static int cuda_run(void *dv, const flx_slice_batch *b)
{
	device *d = (device *)dv;
	plan p;
	lane *l;
	int rc;

	memset(&p, 0, sizeof(p));
	if (b->cast && !fixed_size(b->elem_size))
		return -EINVAL; /* not a type elemcast.h converts */
	rc = flx_plan_cut(b, &p);
	if (rc)
		goto out;
	l = lane_take(d);
	if (!l) {
		rc = -EAGAIN;
		goto out;
	}
	rc = run_lane(d, l, b, &p);
	lane_give(d, l);
out:
	flx_slice_plan_free(&p);
	return rc;
}

/* What the probe finds, in the child that ran it. */
static int probe_here(int id, char *what, size_t what_len)
{
	cudaDeviceProp prop;
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
	    (e == cudaSuccess && id >= n)) {
		if (e == cudaSuccess)
			snprintf(what, what_len,
				 "no CUDA device %d (%d present)", id, n);
		else
			snprintf(what, what_len, "no CUDA driver or device: %s",
				 cudaGetErrorString(e));
		return -ENODEV;
	}
	if (e != cudaSuccess) {
		snprintf(what, what_len, "cudaGetDeviceCount: %s",
			 cudaGetErrorString(e));
		return -EIO;
	}
	e = cudaGetDeviceProperties(&prop, id);
	if (e != cudaSuccess) {
		snprintf(what, what_len, "cudaGetDeviceProperties: %s",
			 cudaGetErrorString(e));
		return -EIO;
	}
	snprintf(what, what_len, "%s", prop.name);
	return 0;
}

/*
 * The device probed in a child process: a process that used CUDA cannot
 * use it in the children it forks, and the daemon forks (daemonizes)
 * after the mount chose its slicer, so this process must not touch CUDA
 * before its first batch.
 */
static int probe(int id, char *what, size_t what_len)
{
	struct {
		int rc;
		char what[256];
	} m;
	size_t got = 0;
	int fd[2], status;
	pid_t pid;

	memset(&m, 0, sizeof(m));
	if (pipe(fd))
		return -errno;
	pid = fork();
	if (pid < 0) {
		close(fd[0]);
		close(fd[1]);
		return -errno;
	}
	if (pid == 0) {
		close(fd[0]);
		m.rc = probe_here(id, m.what, sizeof(m.what));
		if (write(fd[1], &m, sizeof(m)) != (ssize_t)sizeof(m))
			_exit(1);
		_exit(0);
	}
	close(fd[1]);
	while (got < sizeof(m)) {
		ssize_t r = read(fd[0], (char *)&m + got, sizeof(m) - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (got < sizeof(m)) {
		snprintf(what, what_len, "the CUDA device probe died");
		return -EIO;
	}
	m.what[sizeof(m.what) - 1] = '\0';
	snprintf(what, what_len, "%s", m.what);
	return m.rc;
}

static int cuda_open(int id, char *what, size_t what_len, void **out)
{
	device *d;
	int rc;

	*out = NULL;
	if (id < 0) {
		snprintf(what, what_len, "no CUDA device %d", id);
		return -ENODEV;
	}
	rc = probe(id, what, what_len);
	if (rc)
		return rc;
	d = (device *)calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->id = id;
	pthread_mutex_init(&d->mu, NULL);
	*out = d;
	return 0;
}

/* Close: CUDA is touched only when a batch ran (lanes ready). */
static void cuda_close(void *dv)
{
	device *d = (device *)dv;

	if (!d)
		return;
	for (int i = 0; i < NLANES; i++)
		if (d->lanes[i].ready && cudaSetDevice(d->id) == cudaSuccess) {
			lane *l = &d->lanes[i];

			lane_free_bufs(l);
			for (int s = 0; l->ready && s < NSTREAMS; s++) {
				cudaEventDestroy(l->done[s]);
				cudaStreamDestroy(l->s[s]);
			}
		}
	pthread_mutex_destroy(&d->mu);
	free(d);
}

static const flx_cuda_api api = {FLX_CUDA_ABI, cuda_open, cuda_run, cuda_close};

extern "C" __attribute__((visibility("default"))) const flx_cuda_api *
flx_cuda_entry(void)
{
	return &api;
}
