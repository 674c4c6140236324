/* SPDX-License-Identifier: MIT */
/* The item workers: every chunk's item read at mount, in file order,
 * on several threads (source.h). */
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

/* ---- worker threads ---- */

unsigned flx_part_count(unsigned force, size_t n, size_t per)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t want = per ? n / per : n;

	if (force)
		want = force;
	else if (want > (size_t)(cpus < 1 ? 1 : cpus))
		want = (size_t)(cpus < 1 ? 1 : cpus);
	if (want > n)
		want = n;
	if (want > FLX_MAX_THREADS)
		want = FLX_MAX_THREADS;
	return want ? (unsigned)want : 1;
}

void flx_run_parts(void *parts, size_t size, unsigned n, void *(*fn)(void *))
{
	pthread_t tid[FLX_MAX_THREADS];
	bool started[FLX_MAX_THREADS] = {false};
	char *p = parts;

	for (unsigned k = 1; k < n; k++)
		started[k] =
		    pthread_create(&tid[k], NULL, fn, p + k * size) == 0;
	fn(p);
	for (unsigned k = 1; k < n; k++) {
		if (started[k])
			pthread_join(tid[k], NULL);
		else
			fn(p + k * size);
	}
}

/*
 * Reading the items.  Every chunk's item is read (a record of the
 * source's format, such as a zip directory and its pickle) to check it against
 * the metadata and to find its data.  A checkpoint can hold tens of thousands
 * of small items, so they are visited in file order (the source's reads of
 * neighbouring items then share blocks) and, past ITEMS_PER_THREAD items, on
 * several threads, each over a contiguous run of that order with its own
 * scratch.  Each thread stops at its first failure; the failure reported is the
 * first in file order, as a single thread would find it.
 */
#define ITEMS_PER_THREAD 4096

/* One chunk: tensors[t].chunks[k] (8 bytes: one per chunk, millions) */
typedef struct item_job {
	uint32_t t, k;
} item_job;

typedef struct item_worker {
	const flx_ckpt *c;
	const flx_item_ops *ops;
	item_job *jobs;
	size_t lo, hi;
	bool thread; /* running on tid, joined by items_end() */
	bool ran;
	pthread_t tid;
	int rc;
	flx_error err;
	flx_pool keep; /* what load keeps, given to the index's pool */
} item_worker;

/* Items being read, from items_begin() to items_end(). */
struct flx_item_load {
	item_job *jobs;
	unsigned nt;
	flx_pool *keep; /* the index's pool */
	item_worker w[FLX_MAX_THREADS];
};

static flx_chunk *job_chunk(const flx_ckpt *c, item_job j)
{
	return &c->tensors[j.t].chunks[j.k];
}

/* qsort_r() order of jobs over checkpoint arg: file, then offset. */
static int cmp_job(const void *pa, const void *pb, void *arg)
{
	const flx_chunk *a = job_chunk(arg, *(const item_job *)pa);
	const flx_chunk *b = job_chunk(arg, *(const item_job *)pb);

	if (a->file != b->file)
		return a->file < b->file ? -1 : 1;
	return a->item_off < b->item_off ? -1 : a->item_off > b->item_off;
}

/*
 * Fill jobs with every chunk of c in file order: by file, then by offset
 * in the file.  A rank writes its items in state-dict order, so bucketing
 * the chunks by file in tensor order (stable) nearly always leaves each
 * file's run sorted already, as the bucketing notes; a run that is not
 * gets sorted (a qsort of every job would cost more than the bucketing).
 * @return 0, or -ENOMEM.
 */
static int order_jobs(const flx_ckpt *c, item_job *jobs)
{
	size_t *at = calloc(c->nfiles + 1, sizeof(*at));
	/* per file: the item offset of the last job put in its run, and
	 * whether an offset went down (then the run gets sorted) */
	uint64_t *last = calloc(c->nfiles + 1, sizeof(*last));
	bool *unsorted = calloc(c->nfiles + 1, sizeof(*unsorted));
	int rc = -ENOMEM;

	if (!at || !last || !unsorted)
		goto out;
	for (size_t i = 0; i < c->ntensors; i++)
		for (uint32_t k = 0; k < c->tensors[i].nchunks; k++)
			at[c->tensors[i].chunks[k].file + 1]++;
	for (size_t f = 0; f < c->nfiles; f++)
		at[f + 1] += at[f];
	for (size_t i = 0; i < c->ntensors; i++)
		for (uint32_t k = 0; k < c->tensors[i].nchunks; k++) {
			flx_chunk *ch = &c->tensors[i].chunks[k];

			if (ch->item_off < last[ch->file])
				unsorted[ch->file] = true;
			last[ch->file] = ch->item_off;
			jobs[at[ch->file]++] = (item_job){(uint32_t)i, k};
		}
	/* at[f] is now the end of file f's run */
	for (size_t f = 0, lo = 0; f < c->nfiles; lo = at[f++])
		if (unsorted[f])
			qsort_r(jobs + lo, at[f] - lo, sizeof(*jobs), cmp_job,
				(void *)c);
	rc = 0;
out:
	free(at);
	free(last);
	free(unsorted);
	return rc;
}

static void *item_worker_run(void *arg)
{
	item_worker *w = arg;
	void *s = malloc(w->ops->scratch_size);

	w->ran = true;
	w->rc = s ? w->ops->scratch_init(s) : -ENOMEM;
	for (size_t i = w->lo; !w->rc && i < w->hi; i++)
		w->rc = w->ops->load(w->c, s, &w->c->tensors[w->jobs[i].t],
				     job_chunk(w->c, w->jobs[i]), &w->keep,
				     &w->err);
	if (s)
		w->ops->scratch_release(s);
	free(s);
	return NULL;
}

/* Threads for n items: by size and CPUs, or forced (flx_ckpt_opts.threads;
 * tests run the error corpus that way: the report must not change). */
static unsigned item_threads(unsigned force, size_t n)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t want = n / ITEMS_PER_THREAD;

	if (force)
		return force < n ? force : 1;
	if (cpus < 1)
		cpus = 1;
	if (want > (size_t)cpus)
		want = (size_t)cpus;
	if (want > FLX_MAX_THREADS)
		want = FLX_MAX_THREADS;
	return want ? (unsigned)want : 1;
}

/*
 * Start reading the items of b's index: workers 1.. on their own threads,
 * worker 0 too unless wait (then it runs here, before returning).  A
 * worker whose thread cannot start runs in items_end().  @return 0 and
 * *out (for items_end()), -ENOMEM, or -EOVERFLOW (more than UINT32_MAX
 * tensors, more than any metadata bound admits).
 */
int items_begin(const flx_build *b, bool wait, struct flx_item_load **out)
{
	const flx_ckpt *c = b->c;
	struct flx_item_load *ld = NULL;
	size_t n = 0;
	int rc = -ENOMEM;

	if (c->ntensors > UINT32_MAX)
		return -EOVERFLOW;

	for (size_t i = 0; i < c->ntensors; i++)
		n += c->tensors[i].nchunks;
	ld = calloc(1, sizeof(*ld));
	if (!ld || !(ld->jobs = calloc(n ? n : 1, sizeof(item_job))))
		goto out;
	rc = order_jobs(c, ld->jobs);
	if (rc)
		goto out;
	ld->nt = item_threads(b->threads, n);
	ld->keep = &b->c->pool;
	for (unsigned k = 0; k < ld->nt; k++) {
		item_worker *w = &ld->w[k];

		*w = (item_worker){.c = c,
				   .ops = b->items,
				   .jobs = ld->jobs,
				   .lo = n * k / ld->nt,
				   .hi = n * (k + 1) / ld->nt};
		flx_error_init(&w->err);
	}
	for (unsigned k = wait; k < ld->nt; k++) {
		if (pthread_create(&ld->w[k].tid, NULL, item_worker_run,
				   &ld->w[k]))
			break;
		ld->w[k].thread = true;
	}
	if (wait)
		item_worker_run(&ld->w[0]);
	*out = ld;
	ld = NULL;
out:
	if (ld)
		free(ld->jobs);
	free(ld);
	return rc;
}

/* Wait for (or run) every worker, then free ld.  @return 0, or the first
 * failure in file order with err. */
int items_end(struct flx_item_load *ld, flx_error *err)
{
	int rc = 0;

	for (unsigned k = 0; k < ld->nt; k++) {
		if (ld->w[k].thread)
			pthread_join(ld->w[k].tid, NULL);
		else if (!ld->w[k].ran)
			item_worker_run(&ld->w[k]);
	}
	for (unsigned k = 0; k < ld->nt; k++) {
		flx_pool_move(ld->keep, &ld->w[k].keep);
		if (rc)
			continue;
		rc = ld->w[k].rc;
		if (rc && ld->w[k].err.code && err)
			*err = ld->w[k].err;
	}
	flx_error_default(err, rc, NULL);
	free(ld->jobs);
	free(ld);
	return rc;
}
