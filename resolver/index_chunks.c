/* SPDX-License-Identifier: MIT */
/* Chunk tables of tensors: allocation and validation at mount
 * (source.h). */
#include "ckpt.h"
#include "grow.h"
#include "reader.h"
#include "index_internal.h"
#include "source.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* ---- chunks ---- */

/* Bytes of n chunks of t and their dims block; never an empty dims block:
 * chunk pointers must be valid even for 0-d tensors, where nothing is read
 * through them. */
static size_t chunks_bytes(const flx_tensor *t, uint32_t n)
{
	size_t ndims = (size_t)n * 3 * (size_t)t->ndim;

	_Static_assert(sizeof(flx_chunk) % sizeof(int64_t) == 0,
		       "dims follow the chunks, aligned");
	_Static_assert(sizeof(flx_chunk) <= 64,
		       "a chunk record is one cache line (millions per mount)");
	return (size_t)n * sizeof(flx_chunk) +
	       (ndims ? ndims : 1) * sizeof(int64_t);
}

/* Lay n chunks out in ch (zeroed, chunks_bytes() long). */
static void place_chunks(flx_tensor *t, uint32_t n, flx_chunk *ch)
{
	size_t per = 3 * (size_t)t->ndim;

	t->chunks = ch;
	t->dims = (int64_t *)(ch + n);
	for (uint32_t i = 0; i < n; i++) {
		int64_t *d = t->dims + i * per;

		ch[i].off = d;
		ch[i].size = d + t->ndim;
		ch[i].stride = d + 2 * t->ndim;
	}
}

int flx_tensor_alloc_chunks(flx_tensor *t, uint32_t n)
{
	flx_chunk *ch = calloc(1, chunks_bytes(t, n));

	if (!ch)
		return -ENOMEM;
	place_chunks(t, n, ch);
	return 0;
}

int flx_tensor_pool_chunks(flx_pool *pool, flx_tensor *t, uint32_t n)
{
	flx_chunk *ch = flx_pool_alloc(pool, chunks_bytes(t, n));

	if (!ch)
		return -ENOMEM;
	place_chunks(t, n, ch);
	t->nchunks = n;
	return 0;
}

int flx_tensor_pool_strides(flx_pool *pool, flx_tensor *t, uint32_t n)
{
	size_t nd = (size_t)t->ndim;
	flx_chunk *ch;

	if (t->ndim <= 0)
		return -EINVAL;
	ch = flx_pool_alloc(pool,
			    (size_t)n * (sizeof(*ch) + nd * sizeof(int64_t)));
	if (!ch)
		return -ENOMEM;
	t->chunks = ch;
	t->dims = (int64_t *)(ch + n);
	for (uint32_t i = 0; i < n; i++)
		ch[i].stride = t->dims + i * nd;
	t->nchunks = n;
	return 0;
}

/* The strides of a dense row-major layout of size (ndim > 0). */
static void dense_strides(int ndim, const int64_t *size, int64_t *out)
{
	int64_t s = 1;

	for (int k = ndim - 1; k >= 0; k--) {
		out[k] = s;
		s *= size[k];
	}
}

int64_t *flx_strides_share(flx_pool *pool, int ndim, const int64_t *want,
			   int64_t *last)
{
	size_t bytes = sizeof(*want) * (size_t)ndim;
	int64_t *own;

	if (last && !memcmp(last, want, bytes))
		return last;
	own = flx_pool_alloc(pool, bytes ? bytes : 1);
	if (own)
		memcpy(own, want, bytes);
	return own;
}

int flx_tensor_pool_place(flx_pool *pool, flx_tensor *t, flx_chunk *ch,
			  uint32_t n)
{
	int nd = t->ndim;
	int64_t want[FLX_MAX_DIMS], *last = NULL;

	t->chunks = ch;
	t->dims = t->shape; /* no dims block: boxes and strides elsewhere */
	t->nchunks = n;
	for (uint32_t i = 0; i < n; i++) {
		ch[i].shared_stride = true;
		if (!nd) {
			ch[i].off = ch[i].size = ch[i].stride = t->shape;
			continue;
		}
		/* the boxes lie inside the shape (checked): no overflow */
		dense_strides(nd, ch[i].size, want);
		if (!(last = flx_strides_share(pool, nd, want, last)))
			return -ENOMEM;
		ch[i].stride = last;
	}
	return 0;
}

int flx_chunk_set_strides(flx_chunk *ch, int ndim, const int64_t *stride,
			  flx_pool *keep)
{
	int64_t *own;

	if (!ch->shared_stride) {
		memcpy(ch->stride, stride, sizeof(*stride) * (size_t)ndim);
		return 0;
	}
	own = flx_strides_share(keep, ndim, stride, ch->stride);
	if (!own)
		return -ENOMEM;
	ch->shared_stride = own == ch->stride;
	ch->stride = own;
	return 0;
}

int flx_chunk_contig_from(int ndim, const flx_chunk *ch)
{
	int64_t expect = 1;
	int k = ndim;

	while (k > 0) {
		int64_t sz = ch->size[k - 1];

		if (sz != 1 && ch->stride[k - 1] != expect)
			break;
		expect *= sz;
		k--;
	}
	return k;
}

static int cmp_chunk_axis0(const void *pa, const void *pb, void *axis)
{
	const flx_chunk *a = *(flx_chunk *const *)pa;
	const flx_chunk *b = *(flx_chunk *const *)pb;
	int d = *(int *)axis;

	return a->off[d] < b->off[d] ? -1 : a->off[d] > b->off[d];
}

static bool chunks_overlap(int ndim, const flx_chunk *a, const flx_chunk *b)
{
	for (int d = 0; d < ndim; d++)
		if (a->off[d] >= b->off[d] + b->size[d] ||
		    b->off[d] >= a->off[d] + a->size[d])
			return false;
	return true;
}

/*
 * Disjointness is checked with a sweep along the axis of greatest extent
 * (sorted starts; an active list of chunks that still extend past the
 * sweep position), not a comparison of all pairs; coverage then follows
 * from the volumes adding up.
 */
int flx_tensor_check_chunks(const flx_tensor *t, const char *from,
			    flx_error *err)
{
	uint64_t total = flx_numel(t->ndim, t->shape), sum = 0;
	flx_chunk **order = NULL, **active = NULL;
	size_t nactive = 0;
	int axis = 0, rc = 0;
	char o[96];

	for (uint32_t i = 0; i < t->nchunks; i++) {
		const flx_chunk *ch = &t->chunks[i];
		uint64_t v = 1;

		for (int d = 0; d < t->ndim; d++) {
			if (ch->off[d] > t->shape[d] ||
			    ch->size[d] > t->shape[d] - ch->off[d]) {
				flx_fmt_dims(o, sizeof(o), t->ndim, ch->off);
				return flx_error_set(err, -EINVAL, from, t->fqn,
						     "chunk at %s lies outside "
						     "the global shape",
						     o);
			}
			v *= (uint64_t)ch->size[d];
		}
		/* Every chunk lies inside, so a surplus can only be overlap;
		 * the sweep below names the chunk. */
		if (__builtin_add_overflow(sum, v, &sum))
			sum = UINT64_MAX;
	}
	if (sum < total)
		return flx_error_set(err, -EINVAL, from, t->fqn,
				     "chunks cover %llu of %llu elements",
				     (unsigned long long)sum,
				     (unsigned long long)total);
	if (t->nchunks < 2)
		return 0;
	for (int d = 1; d < t->ndim; d++)
		if (t->shape[d] > t->shape[axis])
			axis = d;
	order = malloc(t->nchunks * sizeof(*order));
	active = malloc(t->nchunks * sizeof(*active));
	if (!order || !active) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < t->nchunks; i++)
		order[i] = &t->chunks[i];
	/* chunks mostly come in that order already, which the stable sort
	 * would leave as it is */
	if (t->ndim > 0) {
		uint32_t i = 1;

		while (i < t->nchunks &&
		       cmp_chunk_axis0(&order[i - 1], &order[i], &axis) <= 0)
			i++;
		if (i < t->nchunks)
			qsort_r(order, t->nchunks, sizeof(*order),
				cmp_chunk_axis0, &axis);
	}
	for (uint32_t i = 0; i < t->nchunks; i++) {
		flx_chunk *ch = order[i];
		size_t keep = 0;

		if (flx_numel(t->ndim, ch->size) == 0)
			continue; /* empty chunks overlap nothing */
		for (size_t j = 0; j < nactive; j++) {
			flx_chunk *a = active[j];

			if (t->ndim == 0 ||
			    a->off[axis] + a->size[axis] > ch->off[axis]) {
				if (chunks_overlap(t->ndim, a, ch)) {
					flx_fmt_dims(o, sizeof(o), t->ndim,
						     ch->off);
					rc = flx_error_set(
					    err, -EINVAL, from, t->fqn,
					    "chunk at %s overlaps another "
					    "chunk",
					    o);
					goto out;
				}
				active[keep++] = a;
			}
		}
		nactive = keep;
		active[nactive++] = ch;
	}
	if (sum != total)
		rc = flx_error_set(err, -EINVAL, from, t->fqn,
				   "chunks hold %llu elements, the tensor %llu",
				   (unsigned long long)sum,
				   (unsigned long long)total);
out:
	free(order);
	free(active);
	return rc;
}
