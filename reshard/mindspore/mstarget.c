/* SPDX-License-Identifier: MIT */
/*
 * The mindspore/ target of a strategy file; see mstarget.h.  The file is
 * parsed and each box computed by resolver/mindspore/strategy.h; here:
 * which tensor each layout is of, how many ranks there are, and the checks
 * that make every box one of its tensor.
 */
#include "mstarget.h"

#include "strategy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* the largest strategy file read */
#define MST_MAX_BYTES (256u << 20)

struct flx_mst {
	const flx_ckpt *ckpt;
	flx_ms_strategy *s;
	/* per tensor of ckpt (by index): its first layout + 1 (0: none);
	 * next[i]: the next layout of the same tensor + 1 */
	uint32_t *first;
	uint32_t *next;
};

void flx_mst_free(flx_mst *m)
{
	if (!m)
		return;
	flx_ms_strategy_free(m->s);
	free(m->first);
	free(m->next);
	free(m);
}

int64_t flx_mst_nranks(const flx_mst *m)
{
	return (int64_t)(m->s->devices * m->s->nstages);
}

/* The box of local rank of tensor t under layout l (fits: checked). */
static int layout_box(const flx_ms_layout *l, const flx_tensor *t,
		      uint64_t local, flx_box *box)
{
	uint64_t shape[FLX_MS_MAX_DIMS], start[FLX_MS_MAX_DIMS],
	    len[FLX_MS_MAX_DIMS];
	int rc;

	for (int d = 0; d < t->ndim; d++)
		shape[d] = (uint64_t)t->shape[d];
	rc = flx_ms_box(l, shape, local, start, len);
	memset(box, 0, sizeof(*box));
	for (int d = 0; !rc && d < t->ndim; d++) {
		box->off[d] = (int64_t)start[d];
		box->size[d] = (int64_t)len[d];
	}
	return rc;
}

bool flx_mst_box(const flx_mst *m, const flx_tensor *t, int64_t r, flx_box *box)
{
	size_t ti = (size_t)(t - m->ckpt->tensors);
	uint32_t stage = (uint32_t)((uint64_t)r / m->s->devices);

	if (!m->first[ti]) {
		memset(box, 0, sizeof(*box));
		memcpy(box->size, t->shape, (size_t)t->ndim * sizeof(int64_t));
		return true;
	}
	for (uint32_t i = m->first[ti]; i; i = m->next[i - 1]) {
		const flx_ms_layout *l = &m->s->layouts[i - 1];

		if (l->stage == stage)
			return !layout_box(l, t, (uint64_t)r % m->s->devices,
					   box);
	}
	return false;
}

/* Tensor name of ckpt, or NULL (a transformed index has no name index). */
static const flx_tensor *find(const flx_ckpt *c, const char *name)
{
	if (c->by_name)
		return flx_ckpt_find(c, name);
	for (size_t i = 0; i < c->ntensors; i++)
		if (!strcmp(c->tensors[i].fqn, name))
			return &c->tensors[i];
	return NULL;
}

/* A JSON layout of a Layout-API parameter is stored expanded (more dims
 * than the tensor, docs/formats/mindspore.md#strategy-json): folded back in
 * place by the source's rule, flx_ms_layout_fold(), which keeps l's name and
 * arrays (so freeing the strategy stays as it was).  A layout that does not
 * fold is left as it is for check_layout() to refuse. */
static void fold_layout(flx_ms_layout *l, const flx_tensor *t)
{
	flx_ms_layout f;

	if (l->has_shape && l->ndim > (uint32_t)t->ndim &&
	    !flx_ms_layout_fold(l, (uint32_t)t->ndim, &f))
		*l = f;
}

/* Whether layout l fits tensor t: its dims, its JSON shape, and a box for
 * every local rank (each split dividing its axis). */
static int check_layout(const flx_ms_layout *l, const flx_tensor *t,
			const char *path, flx_error *err)
{
	flx_box box;

	if (l->ndim != (uint32_t)t->ndim)
		return flx_error_set(err, -EINVAL, path, l->name,
				     "tensor map of %u dims for a tensor of "
				     "%d%s",
				     l->ndim, t->ndim,
				     l->has_shape ? " (an expanded Layout-API "
						    "map that does not fold "
						    "back)"
						  : "");
	for (int d = 0; l->has_shape && d < t->ndim; d++)
		if (l->shape[d] != (uint64_t)t->shape[d])
			return flx_error_set(err, -EINVAL, path, l->name,
					     "tensor_shape differs from the "
					     "checkpoint's in dim %d "
					     "(%llu, %lld)",
					     d, (unsigned long long)l->shape[d],
					     (long long)t->shape[d]);
	for (uint64_t k = 0; k < l->devices; k++)
		if (layout_box(l, t, k, &box))
			return flx_error_set(
			    err, -EINVAL, path, l->name,
			    "the layout does not divide the tensor's shape "
			    "(rank %llu of stage %u)",
			    (unsigned long long)k, l->stage);
	return 0;
}

/* The file's bytes (owned, free()). */
static int read_file(const char *path, char **out, size_t *len, flx_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	struct stat st;
	ssize_t got = -1;
	int rc = 0;

	*out = NULL;
	if (fd < 0)
		return flx_error_set(err, -errno, path, "dst_strategy",
				     "cannot open the strategy file: %s",
				     strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_size > MST_MAX_BYTES)
		rc = flx_error_set(err, -EINVAL, path, "dst_strategy",
				   "not a regular file of at most 256 MiB");
	if (!rc) {
		*out = malloc((size_t)st.st_size + 1);
		rc = *out ? 0
			  : flx_error_set(err, -ENOMEM, path, "dst_strategy",
					  "out of memory");
	}
	if (!rc)
		got = read(fd, *out, (size_t)st.st_size);
	if (!rc && got != st.st_size)
		rc = flx_error_set(err, -EIO, path, "dst_strategy",
				   "short read of the strategy file");
	close(fd);
	*len = (size_t)st.st_size;
	return rc;
}

int flx_mst_open(const flx_ckpt *ckpt, const char *path, flx_mst **out,
		 flx_error *err)
{
	flx_mst *m = calloc(1, sizeof(*m));
	size_t len = 0, pl = strlen(path);
	char *buf = NULL;
	int rc = m ? 0 : -ENOMEM;

	if (!rc)
		rc = read_file(path, &buf, &len, err);
	if (!rc)
		rc = flx_ms_strategy_parse(
		    buf, len, pl > 5 && !strcmp(path + pl - 5, ".json"), path,
		    &m->s, err);
	if (!rc) {
		m->ckpt = ckpt;
		m->first = calloc(ckpt->ntensors + 1, sizeof(*m->first));
		m->next = calloc(m->s->nlayouts + 1, sizeof(*m->next));
		rc = m->first && m->next ? 0 : -ENOMEM;
	}
	/* each layout onto its tensor's list, in file order; a parameter
	 * the checkpoint lacks is left out (MindSpore's transform writes
	 * the source's parameters) */
	for (uint32_t i = m && m->s ? m->s->nlayouts : 0; !rc && i-- > 0;) {
		const flx_ms_layout *l = &m->s->layouts[i];
		const flx_tensor *t = find(ckpt, l->name);
		size_t ti;

		if (!t)
			continue;
		fold_layout(&m->s->layouts[i], t);
		rc = check_layout(l, t, path, err);
		ti = (size_t)(t - ckpt->tensors);
		m->next[i] = m->first[ti];
		m->first[ti] = i + 1;
	}
	free(buf);
	if (rc) {
		if (rc == -ENOMEM)
			flx_error_set(err, rc, path, "dst_strategy",
				      "out of memory");
		flx_mst_free(m);
		m = NULL;
	}
	*out = m;
	return rc;
}
