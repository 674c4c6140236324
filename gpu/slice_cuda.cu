/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend of the slicer (slice.h), built as libflexfs-cuda.so
 * (slice_cuda.h says why a shared object of its own).
 *
 * A batch is made one submission.  The host first cuts it into pieces
 * and rows of transposes (slice_plan.h: the same rule as the CPU
 * backend).  Then its blocks are made resident on the device, and every
 * piece of them executed in one launch.
 *
 * Blocks kept on the device.  A read of a transposed chunk wants a few
 * elements of every block of the chunk, and the next read the next few
 * of the same blocks: copying the blocks per read would move the chunk
 * over PCIe for each read.  So blocks stay in a pool of slots in device
 * memory (-o gpu_cache=, flx_slicer_opts.cache_bytes), found by the
 * batch's origin and the block's (file, start, len) (slice.h says when
 * that names the same bytes), the least recently used free slot reused
 * first.  A block not there is pinned (get), copied into a pinned staging
 * buffer, released (put) and copied to its slot on one of two streams,
 * so that the next block is fetched while this one travels.  A block
 * found there is still fetched once (get, put): that is where the read
 * path checks that its file is unchanged.  A lane holds at most
 * per_lane slots at a time, so a large batch runs in phases of that many
 * blocks, each phase one launch; blocks larger than the pool's slots
 * (more than 1 MiB, or the first batch's block size) go to the CPU.
 *
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
 * taken returns -EAGAIN (the CPU runs it).  The pool, made by the first
 * batch, and its slots' table, under the same mutex.  Every CUDA error becomes -EIO
 * here, in fail(), which prints the first one.
 */
#include "elemcast.h"
#include "slice_cuda.h"
#include "slice_plan.h"
#include "slice_slots.h"

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
#define PHASE_MIN 4 /* the fewest blocks a lane may hold at once */
/* the smallest slot: blocks of up to 1 MiB share one pool */
#define SLOT_MIN (1u << 20)

typedef flx_piece piece;
typedef flx_rows rows;
typedef flx_plan plan;

typedef struct lane {
	bool busy, ready, broken;
	cudaStream_t s[NSTREAMS];
	cudaEvent_t done[NSTREAMS]; /* h_blk[s] is free again */
	unsigned char *h_blk[NSTREAMS]; /* pinned staging of a block */
	size_t cap_blk;
	piece *h_pc, *d_pc; /* a phase's pieces and rows */
	rows *h_rw, *d_rw;
	size_t cap_pc;
	unsigned char *h_dst, *d_dst;
	size_t cap_dst;
	int32_t *held; /* the slots a phase holds, per_lane of them */
} lane;

typedef struct device {
	int id;
	uint64_t cache_bytes; /* 0: nothing kept across batches */
	pthread_mutex_t mu; /* lanes' busy flags, the slots, the hash */
	lane lanes[NLANES];
	bool pool_ready, pool_failed; /* failed: the CPU runs every batch */
	/* the blocks kept: slot i's bytes at pool + i * slot_cap, its copy
	 * there done when filled[i] is (recorded before it is published) */
	unsigned char *pool;
	size_t slot_cap, per_lane;
	flx_slots slots;
	cudaEvent_t *filled;
} device;

static int reported;
/* this process has used CUDA (a later probe runs here: a forked child
 * of it could not) */
static int used;

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
		l->h_blk[s] = NULL;
	}
	cudaFreeHost(l->h_pc);
	cudaFree(l->d_pc);
	cudaFreeHost(l->h_rw);
	cudaFree(l->d_rw);
	cudaFreeHost(l->h_dst);
	cudaFree(l->d_dst);
	free(l->held);
	l->h_pc = NULL;
	l->d_pc = NULL;
	l->h_rw = NULL;
	l->d_rw = NULL;
	l->h_dst = l->d_dst = NULL;
	l->held = NULL;
	l->cap_blk = l->cap_pc = l->cap_dst = 0;
}

/* The lane's buffers at least this large (the lane is idle). */
static int lane_fit(device *d, lane *l, size_t blk, size_t npc, size_t dst)
{
	int rc = 0;

	if (!l->ready) {
		/* first, so that its failure leaves no streams behind */
		l->held = (int32_t *)calloc(d->per_lane, sizeof(int32_t));
		if (!l->held) {
			rc = -ENOMEM;
			goto out;
		}
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
			l->h_blk[s] = NULL;
			l->cap_blk = 0;
			CU(cudaHostAlloc((void **)&l->h_blk[s], blk,
					 cudaHostAllocDefault));
		}
	l->cap_blk = blk > l->cap_blk ? blk : l->cap_blk;
	if (npc > l->cap_pc) {
		cudaFreeHost(l->h_pc);
		cudaFree(l->d_pc);
		cudaFreeHost(l->h_rw);
		cudaFree(l->d_rw);
		l->h_pc = l->d_pc = NULL;
		l->h_rw = l->d_rw = NULL;
		l->cap_pc = 0;
		CU(cudaHostAlloc((void **)&l->h_pc, npc * sizeof(piece),
				 cudaHostAllocDefault));
		CU(cudaMalloc((void **)&l->d_pc, npc * sizeof(piece)));
		CU(cudaHostAlloc((void **)&l->h_rw, npc * sizeof(rows),
				 cudaHostAllocDefault));
		CU(cudaMalloc((void **)&l->d_rw, npc * sizeof(rows)));
		l->cap_pc = npc;
	}
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

/* ---- the blocks kept on the device ---- */

static void pool_free(device *d)
{
	for (size_t i = 0; d->filled && i < d->slots.n; i++)
		if (d->filled[i])
			cudaEventDestroy(d->filled[i]);
	cudaFree(d->pool);
	free(d->filled);
	flx_slots_free(&d->slots);
	d->pool = NULL;
	d->filled = NULL;
	d->pool_ready = false;
}

/*
 * The pool, made at start() or by the first batch (slot_cap from the
 * block size): as many slots as cache_bytes holds, at most half the
 * device's free memory, and at least PHASE_MIN per lane (a lane never
 * holds more than per_lane slots, so a lane asking for one always finds
 * one with ref 0).
 */
static int pool_init(device *d, uint64_t block)
{
	size_t free_b = 0, total_b = 0, n = 0;
	cudaError_t e;
	int rc = 0;

	d->slot_cap = (size_t)((block + 64 + 255) / 256 * 256);
	e = cudaMemGetInfo(&free_b, &total_b);
	if (e != cudaSuccess) {
		rc = fail("cudaMemGetInfo", e);
		goto out;
	}
	n = (size_t)(d->cache_bytes / d->slot_cap);
	if (n > free_b / 2 / d->slot_cap)
		n = free_b / 2 / d->slot_cap;
	if (n < (size_t)NLANES * PHASE_MIN)
		n = (size_t)NLANES * PHASE_MIN;
	d->per_lane = n / NLANES;
	rc = flx_slots_init(&d->slots, n);
	d->filled = (cudaEvent_t *)calloc(n, sizeof(cudaEvent_t));
	if (!rc && !d->filled)
		rc = -ENOMEM;
	if (rc)
		goto out;
	e = cudaMalloc((void **)&d->pool, n * d->slot_cap);
	for (size_t i = 0; e == cudaSuccess && i < n; i++)
		e = cudaEventCreateWithFlags(&d->filled[i],
					     cudaEventDisableTiming);
	if (e != cudaSuccess) {
		rc = fail("the block pool", e);
		goto out;
	}
	d->pool_ready = true;
out:
	if (rc)
		pool_free(d);
	return rc;
}

/* ---- a batch ---- */

/* Rows sets in grids of at most 65535 (gridDim.y); c: the batch's cast
 * or NULL */
template <size_t E>
static void launch_rows(lane *l, const unsigned char *blk, size_t nrw,
			const flx_ecast *c)
{
	for (size_t g = 0; g < nrw;) {
		size_t m = nrw - g < 65535 ? nrw - g : 65535;
		uint64_t tiles = 0;

		/* one grid over the largest rows set of these m */
		for (size_t k = g; k < g + m; k++) {
			const rows *r = &l->h_rw[k];
			uint64_t t = ((r->nrows + TILE - 1) / TILE) *
				     ((r->n + TILE - 1) / TILE);

			tiles = t > tiles ? t : tiles;
		}
		dim3 grid((unsigned)tiles, (unsigned)m), threads(TILE, ROWS);

		if (c)
			rows_kernel<E, true><<<grid, threads, 0, l->s[0]>>>(
			    blk, l->d_rw + g, l->d_dst, *c);
		else
			rows_kernel<E, false><<<grid, threads, 0, l->s[0]>>>(
			    blk, l->d_rw + g, l->d_dst, flx_ecast{});
		g += m;
	}
}

template <size_t E>
static void launch(lane *l, const unsigned char *blk, size_t npc, size_t nrw,
		   size_t esz, const flx_ecast *c)
{
	if (npc && c)
		pieces_cast_kernel<<<(unsigned)npc, 128, 0, l->s[0]>>>(
		    blk, l->d_pc, l->d_dst, *c);
	else if (npc)
		pieces_kernel<E><<<(unsigned)npc, 128, 0, l->s[0]>>>(
		    blk, l->d_pc, l->d_dst, esz);
	if constexpr (E != 0)
		launch_rows<E>(l, blk, nrw, c);
}

static bool fixed_size(size_t esz)
{
	return esz == 1 || esz == 2 || esz == 4 || esz == 8 || esz == 16;
}

/* A cast's source elements have fixed sizes (1, 2, 4, 8: elemcast.h),
 * so a cast never takes launch<0>. */
static void launch_any(lane *l, const unsigned char *blk, size_t npc,
		       size_t nrw, size_t esz, const flx_ecast *c)
{
	switch (esz) {
	case 1:
		launch<1>(l, blk, npc, nrw, esz, c);
		break;
	case 2:
		launch<2>(l, blk, npc, nrw, esz, c);
		break;
	case 4:
		launch<4>(l, blk, npc, nrw, esz, c);
		break;
	case 8:
		launch<8>(l, blk, npc, nrw, esz, c);
		break;
	case 16:
		launch<16>(l, blk, npc, nrw, esz, c);
		break;
	default:
		launch<0>(l, blk, npc, nrw, esz, NULL);
	}
}

/* Let go of the n slots held (flx_slots_release(), under the mutex). */
static void slots_release(device *d, const int32_t *held, size_t n, bool drop)
{
	pthread_mutex_lock(&d->mu);
	flx_slots_release(&d->slots, held, n, drop);
	pthread_mutex_unlock(&d->mu);
}

/*
 * Block k of b on the device, held in l->held[*nheld] (counted in
 * *nheld even when this fails, for the caller to release): found kept
 * there, or fetched (get), copied into staging buffer s and from there to
 * its slot on stream s.  Either way the lane's stream 0 waits for its
 * copy.  A block found is still fetched once (get, put): that is where
 * the read path checks its file unchanged for this read.
 */
static int resident(device *d, lane *l, const flx_slice_batch *b, size_t k,
		    int s, size_t *nheld)
{
	const size_t len = b->blocks[k].len;
	const uint64_t origin = d->cache_bytes ? b->origin : 0;
	const unsigned char *data;
	bool hit, pinned = false;
	int32_t i;
	int rc;

	pthread_mutex_lock(&d->mu);
	rc = flx_slots_hold(&d->slots, origin, &b->blocks[k], &i, &hit);
	pthread_mutex_unlock(&d->mu);
	if (rc)
		return rc;
	l->held[(*nheld)++] = i;
	if (!hit)
		CU(cudaEventSynchronize(l->done[s]));
	rc = b->get(b->ctx, k, &data);
	if (rc)
		goto out;
	pinned = true;
	if (!hit) {
		memcpy(l->h_blk[s], data, len);
		b->put(b->ctx, k);
		pinned = false;
		CU(cudaMemcpyAsync(d->pool + (size_t)i * d->slot_cap,
				   l->h_blk[s], len, cudaMemcpyHostToDevice,
				   l->s[s]));
		CU(cudaEventRecord(l->done[s], l->s[s]));
		CU(cudaEventRecord(d->filled[i], l->s[s]));
		pthread_mutex_lock(&d->mu);
		flx_slots_publish(&d->slots, i);
		pthread_mutex_unlock(&d->mu);
	}
	CU(cudaStreamWaitEvent(l->s[0], d->filled[i], 0));
out:
	if (pinned)
		b->put(b->ctx, k);
	return rc;
}

/* Block k's n pieces (from in) appended to the lane's arrays at *npc and
 * *nrw, rows of transposes apart, their sources made offsets in the pool
 * (the block sits at off there). */
static void plan_block(lane *l, const flx_slice_batch *b, const piece *in,
		       size_t n, uint64_t off, size_t *npc, size_t *nrw)
{
	size_t osz = b->cast ? b->cast->to.size : b->elem_size;
	size_t np = n, nr = 0;

	/* rows of transposes go to the tiled kernel, which has compile-time
	 * element sizes only */
	if (fixed_size(b->elem_size))
		flx_plan_rows(in, n, osz, l->h_pc + *npc, &np, l->h_rw + *nrw,
			      &nr);
	else
		memcpy(l->h_pc + *npc, in, n * sizeof(piece));
	for (size_t i = 0; i < np; i++)
		l->h_pc[*npc + i].soff += off;
	for (size_t i = 0; i < nr; i++)
		l->h_rw[*nrw + i].soff += off;
	*npc += np;
	*nrw += nr;
}

/*
 * The batch's pieces executed on lane l (see the top of this file), in
 * phases of at most per_lane blocks: the phase's blocks made resident
 * (copies alternating between two streams), then every piece of the
 * phase in one launch on stream 0.
 */
static int run_lane(device *d, lane *l, const flx_slice_batch *b, const plan *p)
{
	size_t maxblk = 1, j = 0, k = 0, nheld = 0;
	int rc = 0;

	for (size_t q = 0; q < b->nblocks; q++)
		if (p->first[q + 1] > p->first[q] && b->blocks[q].len > maxblk)
			maxblk = b->blocks[q].len;
	__atomic_store_n(&used, 1, __ATOMIC_RELAXED);
	CU(cudaSetDevice(d->id));
	pthread_mutex_lock(&d->mu);
	if (!d->pool_ready && !d->pool_failed &&
	    pool_init(d, b->block > SLOT_MIN ? b->block : SLOT_MIN))
		d->pool_failed = true; /* said once, by fail() */
	rc = d->pool_failed ? -EAGAIN : 0;
	pthread_mutex_unlock(&d->mu);
	if (rc)
		goto out;
	if (maxblk > d->slot_cap) {
		rc = -EAGAIN; /* not a block of the size the pool was made for */
		goto out;
	}
	rc = lane_fit(d, l, maxblk, p->npc ? p->npc : 1,
		      b->dst_len ? b->dst_len : 1);
	if (rc)
		goto out;
	while (k < b->nblocks) {
		size_t npc = 0, nrw = 0;

		for (; k < b->nblocks && nheld < d->per_lane; k++) {
			size_t first = p->first[k], n = p->first[k + 1] - first;

			if (!n)
				continue;
			rc = resident(d, l, b, k, (int)(j++ % NSTREAMS),
				      &nheld);
			if (rc)
				goto out;
			plan_block(l, b, p->pc + first, n,
				   (uint64_t)l->held[nheld - 1] * d->slot_cap,
				   &npc, &nrw);
		}
		if (npc)
			CU(cudaMemcpyAsync(l->d_pc, l->h_pc, npc * sizeof(piece),
					   cudaMemcpyHostToDevice, l->s[0]));
		if (nrw)
			CU(cudaMemcpyAsync(l->d_rw, l->h_rw, nrw * sizeof(rows),
					   cudaMemcpyHostToDevice, l->s[0]));
		launch_any(l, d->pool, npc, nrw, b->elem_size, b->cast);
		CU(cudaGetLastError());
		/* the last phase queues the copy back behind its kernels:
		 * one wait for both */
		if (k >= b->nblocks && b->dst_len)
			CU(cudaMemcpyAsync(l->h_dst, l->d_dst, b->dst_len,
					   cudaMemcpyDeviceToHost, l->s[0]));
		CU(cudaStreamSynchronize(l->s[0]));
		slots_release(d, l->held, nheld, false);
		nheld = 0;
	}
	flx_plan_copy_runs(b, l->h_dst);
out:
	/* nothing of a failed batch left in flight on the lane */
	if (rc && l->ready)
		for (int s = 0; s < NSTREAMS; s++)
			cudaStreamSynchronize(l->s[s]);
	if (nheld)
		slots_release(d, l->held, nheld, rc != 0);
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
 * before start() or its first batch.  Once it has, it probes here.
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

	if (__atomic_load_n(&used, __ATOMIC_RELAXED))
		return probe_here(id, what, what_len);
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

static int cuda_open(int id, uint64_t cache_bytes, char *what, size_t what_len,
		     void **out)
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
	d->cache_bytes = cache_bytes;
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
	if (d->pool_ready && cudaSetDevice(d->id) == cudaSuccess)
		pool_free(d);
	pthread_mutex_destroy(&d->mu);
	free(d);
}

/* The context, the pool (for the read path's 1 MiB blocks) and every
 * lane's streams and buffers for a batch of one block, made now; errors
 * are left to the first batch (which meets them again and says them). */
static void cuda_start(void *dv)
{
	device *d = (device *)dv;

	__atomic_store_n(&used, 1, __ATOMIC_RELAXED);
	if (cudaSetDevice(d->id) != cudaSuccess || cudaFree(0) != cudaSuccess)
		return;
	pthread_mutex_lock(&d->mu);
	if (!d->pool_ready && !d->pool_failed && pool_init(d, SLOT_MIN))
		d->pool_failed = true;
	pthread_mutex_unlock(&d->mu);
	for (int i = 0; d->pool_ready && i < NLANES; i++)
		if (lane_fit(d, &d->lanes[i], d->slot_cap, 1024, SLOT_MIN))
			break;
}

static const flx_cuda_api api = {FLX_CUDA_ABI, cuda_open, cuda_run, cuda_close,
				 cuda_start};

extern "C" __attribute__((visibility("default"))) const flx_cuda_api *
flx_cuda_entry(void)
{
	return &api;
}
