/* SPDX-License-Identifier: MIT */
/* Running a batch on a backend, and the batch rules every backend shares
 * (slice.h); choosing the backend is slice_load.c's. */
#include "slice.h"

#include <errno.h>

int flx_slicer_run(const flx_slicer *s, const flx_slice_batch *b)
{
	const flx_slicer *cpu = flx_slicer_cpu();
	int rc;

	if (!s || s == cpu || (s->accepts && !s->accepts(s, b)))
		return cpu->run(cpu, b);
	rc = s->run(s, b);
	return rc == -EAGAIN ? cpu->run(cpu, b) : rc;
}

bool flx_slicer_casts(const flx_slicer *s)
{
	return s && s->casts;
}

int flx_slice_batch_check(const flx_slice_batch *b)
{
	size_t osz = b->cast ? b->cast->to.size : 0;

	if (!b->elem_size || !b->block || (b->nruns && !b->runs) ||
	    (b->nblocks && !b->blocks) || !b->get || !b->put)
		return -EINVAL;
	if (b->cast && (b->cast->from.size != b->elem_size || !osz))
		return -EINVAL;
	for (size_t i = 0; i < b->nruns; i++) {
		const flx_slice_run *u = &b->runs[i], *p = u - 1;

		if (u->skip >= b->elem_size || u->dst > b->dst_len ||
		    u->len > b->dst_len - u->dst)
			return -EINVAL;
		if (osz && (u->skip || u->len % osz))
			return -EINVAL;
		if (i && (p->file > u->file ||
			  (p->file == u->file && p->dst > u->dst)))
			return -EINVAL;
	}
	for (size_t k = 1; k < b->nblocks; k++) {
		const flx_slice_block *c = &b->blocks[k], *p = c - 1;

		if (p->file > c->file ||
		    (p->file == c->file &&
		     (p->start > c->start || c->start - p->start < b->block)))
			return -EINVAL;
	}
	return 0;
}
