/* SPDX-License-Identifier: MIT */
/*
 * The host half of the CUDA backend: a batch cut into what its kernels
 * execute (slice_plan.h).  Plain C, so that test_slice_plan checks it on
 * machines without a device.
 */
#include "slice_plan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int add_piece(flx_plan *p, size_t k, flx_piece pc)
{
	if (p->npc == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 64;
		flx_piece *np = (flx_piece *)realloc(p->pc, cap * sizeof(*np));
		size_t *nb;

		if (!np)
			return -ENOMEM;
		p->pc = np;
		nb = (size_t *)realloc(p->blk_of, cap * sizeof(*nb));
		if (!nb)
			return -ENOMEM;
		p->blk_of = nb;
		p->cap = cap;
	}
	p->pc[p->npc] = pc;
	p->blk_of[p->npc++] = k;
	return 0;
}

/* The listed block of file f whose home holds offset s, in
 * blocks[lo, hi) (those of file f), or hi. */
static size_t find_block(const flx_slice_batch *b, size_t lo, size_t hi,
			 uint64_t s)
{
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const flx_slice_block *k = &b->blocks[mid];

		if (s < k->start)
			hi = mid;
		else if (s - k->start >= b->block)
			lo = mid + 1;
		else
			return mid;
	}
	return SIZE_MAX;
}

/* Run u's pieces, its file's blocks being blocks[lo, hi).
 * @return 0, -EIO (an element in no listed block, or past its bytes),
 *         -ENOMEM. */
static int cut_run(const flx_slice_batch *b, const flx_slice_run *u, size_t lo,
		   size_t hi, flx_plan *p)
{
	/* esz: the source's element size (the block rule); osz: the
	 * stream's, of the converted elements with a cast */
	uint64_t esz = b->elem_size, osz = b->cast ? b->cast->to.size : esz;
	uint64_t e = u->skip / osz, end;

	if (!u->len)
		return 0;
	end = (u->skip + u->len - 1) / osz + 1;
	while (e < end) {
		uint64_t s = u->src + e * u->stride, n = end - e, last;
		size_t k = find_block(b, lo, hi, s);
		const flx_slice_block *blk;
		uint64_t home, q0 = e * osz;
		int rc;

		if (k == SIZE_MAX)
			return -EIO;
		blk = &b->blocks[k];
		home = blk->start + b->block;
		if (u->stride && (home - 1 - s) / u->stride + 1 < n)
			n = (home - 1 - s) / u->stride + 1;
		last = s + (n - 1) * u->stride;
		if (last + esz > blk->start + blk->len)
			return -EIO;
		rc = add_piece(p, k,
			       (flx_piece){s - blk->start, u->stride,
					   (int64_t)u->dst - (int64_t)u->skip +
					       (int64_t)q0,
					   n, u->skip > q0 ? u->skip - q0 : 0,
					   u->skip + u->len - q0 < n * osz
					       ? u->skip + u->len - q0
					       : n * osz});
		if (rc)
			return rc;
		e += n;
	}
	return 0;
}

/* Every run cut, the pieces sorted by block (counting sort: runs are
 * walked in order, so a block's pieces keep the runs' order). */
int flx_plan_cut(const flx_slice_batch *b, flx_plan *p)
{
	size_t lo = 0, hi = 0, *cnt;
	flx_piece *sorted;
	int rc = 0;

	for (size_t i = 0; i < b->nruns && !rc; i++) {
		uint32_t f = b->runs[i].file;

		while (lo < b->nblocks && b->blocks[lo].file < f)
			lo++;
		if (hi < lo)
			hi = lo;
		while (hi < b->nblocks && b->blocks[hi].file == f)
			hi++;
		rc = cut_run(b, &b->runs[i], lo, hi, p);
	}
	if (rc)
		return rc;
	cnt = (size_t *)calloc(b->nblocks + 1, sizeof(*cnt));
	sorted = (flx_piece *)malloc((p->npc ? p->npc : 1) * sizeof(*sorted));
	if (!cnt || !sorted) {
		free(cnt);
		free(sorted);
		return -ENOMEM;
	}
	for (size_t i = 0; i < p->npc; i++)
		cnt[p->blk_of[i] + 1]++;
	for (size_t k = 0; k < b->nblocks; k++)
		cnt[k + 1] += cnt[k];
	p->first = cnt;
	{
		size_t *at = (size_t *)malloc((b->nblocks + 1) * sizeof(*at));

		if (!at) {
			free(sorted);
			return -ENOMEM;
		}
		memcpy(at, cnt, (b->nblocks + 1) * sizeof(*at));
		for (size_t i = 0; i < p->npc; i++)
			sorted[at[p->blk_of[i]]++] = p->pc[i];
		free(at);
	}
	free(p->pc);
	p->pc = sorted;
	return 0;
}

/* Split pieces pc[0..n) of one block into rows of transposes (into rw)
 * and the rest (moved to the front of pc); *npc, *nrw: their counts. */
void flx_plan_rows(const flx_piece *in, size_t n, uint64_t esz, flx_piece *pc,
		   size_t *npc, flx_rows *rw, size_t *nrw)
{
	size_t np = 0, nr = 0;

	for (size_t i = 0, j; i < n; i = j) {
		const flx_piece *a = &in[i];
		bool whole = a->lo == 0 && a->hi == a->n * esz;

		for (j = i + 1; whole && j < n; j++) {
			const flx_piece *x = &in[j - 1], *y = &in[j];

			if (y->lo || y->hi != y->n * esz || y->n != a->n ||
			    y->stride != a->stride || y->soff <= x->soff ||
			    y->dbase <= x->dbase ||
			    y->soff - x->soff != in[i + 1].soff - a->soff ||
			    y->dbase - x->dbase != in[i + 1].dbase - a->dbase)
				break;
		}
		if (!whole || j - i < 2) {
			pc[np++] = *a;
			j = i + 1;
			continue;
		}
		rw[nr++] = (flx_rows){a->soff,
				      in[i + 1].soff - a->soff,
				      a->stride,
				      (uint64_t)a->dbase,
				      (uint64_t)(in[i + 1].dbase - a->dbase),
				      j - i,
				      a->n};
	}
	*npc = np;
	*nrw = nr;
}

/* ---- lanes ---- */

void flx_slice_plan_free(flx_plan *p)
{
	free(p->pc);
	free(p->blk_of);
	free(p->first);
	memset(p, 0, sizeof(*p));
}

void flx_plan_copy_runs(const flx_slice_batch *b, const unsigned char *from)
{
	for (size_t i = 0, j; i < b->nruns; i = j) {
		size_t lo = b->runs[i].dst, hi = lo + b->runs[i].len;

		for (j = i + 1; j < b->nruns && b->runs[j].dst == hi; j++)
			hi += b->runs[j].len;
		memcpy(b->dst + lo, from + lo, hi - lo);
	}
}
