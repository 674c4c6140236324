/* SPDX-License-Identifier: MIT */
/*
 * flexfs-materialize's decisions (materialize.h): pure functions, no I/O.
 */
#include "materialize.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct by_size {
	const uint64_t *size;
	size_t i;
} by_size;

/* Largest first; equal sizes in file order (a total order: every rank
 * sorts to the same sequence, whatever qsort's algorithm). */
static int cmp_size(const void *x, const void *y)
{
	const by_size *a = x, *b = y;
	uint64_t sa = a->size[a->i], sb = b->size[b->i];

	if (sa != sb)
		return sa > sb ? -1 : 1;
	return a->i < b->i ? -1 : a->i > b->i;
}

int flx_mat_assign(const uint64_t *size, size_t n, int nranks, int *owner)
{
	by_size *order = NULL;
	uint64_t *load = NULL;
	int rc = 0;

	if (nranks < 1)
		return -EINVAL;
	order = malloc((n ? n : 1) * sizeof(*order));
	load = calloc((size_t)nranks, sizeof(*load));
	if (!order || !load) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		order[i] = (by_size){size, i};
	qsort(order, n, sizeof(*order), cmp_size);
	/* a linear scan for the least loaded rank: ranks are few (one per
	 * core or node), files many */
	for (size_t k = 0; k < n; k++) {
		size_t i = order[k].i;
		int best = 0;

		for (int r = 1; r < nranks; r++)
			if (load[r] < load[best])
				best = r;
		owner[i] = best;
		load[best] += size[i] + FLX_MAT_FILE_COST;
	}
out:
	free(order);
	free(load);
	return rc;
}

flx_mat_state flx_mat_state_of(bool exists, bool regular, uint64_t size,
			       uint64_t want)
{
	if (!exists)
		return FLX_MAT_ABSENT;
	if (!regular)
		return FLX_MAT_BLOCKED;
	return size == want ? FLX_MAT_DONE : FLX_MAT_REDO;
}

bool flx_mat_within(const char *a, const char *b)
{
	size_t n = strlen(a);

	/* "/" contains everything; otherwise a must be a whole prefix of
	 * b's components */
	if (n == 1 && a[0] == '/')
		return true;
	return !strncmp(a, b, n) && (b[n] == '\0' || b[n] == '/');
}

bool flx_mat_selected(const char *views, const char *name)
{
	const char *p = views;

	if (!views)
		return true;
	while (*p) {
		size_t n = strcspn(p, ",");

		if ((strlen(name) == n && !strncmp(p, name, n)) ||
		    (n == 5 && !strncmp(p, "index", 5) &&
		     !strcmp(name, "index.json")))
			return true;
		p += n;
		if (*p == ',')
			p++;
	}
	return false;
}

void flx_mat_bytes(char *buf, size_t len, uint64_t n)
{
	static const char *const unit[] = {"B",	  "KiB", "MiB",
					   "GiB", "TiB", "PiB"};
	double v = (double)n;
	size_t u = 0;

	while (v >= 1024 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)n);
	else
		snprintf(buf, len, "%.1f %s", v, unit[u]);
}

void flx_mat_progress(char *buf, size_t len, uint64_t done, uint64_t total,
		      uint64_t written, double secs)
{
	char d[32], t[32], r[32], eta[32] = "--";
	double rate = secs > 0 ? (double)written / secs : 0;
	unsigned pct = total ? (unsigned)(done * 100 / total) : 100;

	flx_mat_bytes(d, sizeof(d), done);
	flx_mat_bytes(t, sizeof(t), total);
	flx_mat_bytes(r, sizeof(r), (uint64_t)rate);
	if (rate > 0 && done <= total) {
		double left = (double)(total - done) / rate;

		snprintf(eta, sizeof(eta), "%um%02us", (unsigned)(left / 60),
			 (unsigned)left % 60);
	}
	snprintf(buf, len, "%3u%% %s / %s, %s/s, ETA %s", pct, d, t, r, eta);
}
