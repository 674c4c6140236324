/* SPDX-License-Identifier: MIT */
#include "synth_ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int synth_ckpt_open(const char *dir, const synth_layout *l, size_t ntensors,
		    flx_ckpt **out)
{
	flx_ckpt *c = calloc(1, sizeof(*c));
	char path[600];
	int rc = -ENOMEM;

	if (!c)
		return -ENOMEM;
	c->dir = strdup(dir);
	c->format = strdup(l->format);
	c->writer = strdup(l->writer);
	c->files = calloc(l->nfiles, sizeof(flx_file));
	c->tensors = calloc(ntensors ? ntensors : 1, sizeof(flx_tensor));
	c->by_name = calloc(ntensors ? ntensors : 1, sizeof(flx_tensor *));
	if (!c->dir || !c->format || !c->writer || !c->files || !c->tensors ||
	    !c->by_name)
		goto out;
	for (uint32_t f = 0; f < l->nfiles; f++)
		c->files[f].fd = -1;
	c->nfiles = l->nfiles;
	c->ntensors = ntensors;
	if (!(c->files[0].relpath = strdup(l->data_file)))
		goto out;
	c->files[0].data = true;
	snprintf(path, sizeof(path), "%s/%s", dir, l->data_file);
	c->files[0].fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	rc = c->files[0].fd < 0 ? -errno : 0;
out:
	if (rc) {
		flx_ckpt_close(c);
		return rc;
	}
	*out = c;
	return 0;
}

int synth_ckpt_whole(flx_ckpt *c, size_t i, const char *fqn, flx_dtype dt,
		     int ndim, const int64_t *shape, uint64_t *at)
{
	flx_tensor *t = &c->tensors[i];
	flx_chunk *ch;
	int64_t numel = 1;

	t->dtype = dt;
	t->ndim = ndim;
	if (!(t->fqn = strdup(fqn)) || flx_tensor_alloc_chunks(t, 1))
		return -ENOMEM;
	t->nchunks = 1;
	ch = t->chunks;
	for (int d = ndim - 1; d >= 0; d--) {
		t->shape[d] = shape[d];
		ch->size[d] = shape[d];
		ch->stride[d] = numel;
		numel *= shape[d];
	}
	ch->contig_from = flx_chunk_contig_from(ndim, ch);
	ch->data_off = *at;
	*at += (uint64_t)numel * flx_dtype_size(dt) + 8;
	c->by_name[i] = t; /* uniqueness is what the tests need of it */
	return 0;
}

int synth_ckpt_fill(flx_ckpt *c, const synth_layout *l, uint64_t end)
{
	unsigned char buf[4096];
	int fd = c->files[0].fd;
	struct stat st;

	if (ftruncate(fd, (off_t)end))
		return -errno;
	for (uint64_t at = 0; at < end; at += sizeof(buf)) {
		size_t n =
		    end - at < sizeof(buf) ? (size_t)(end - at) : sizeof(buf);

		for (size_t k = 0; k < n; k++)
			buf[k] = (unsigned char)((at + k) * l->mul + l->add);
		if (pwrite(fd, buf, n, (off_t)at) != (ssize_t)n)
			return -EIO;
	}
	if (fstat(fd, &st))
		return -errno;
	flx_file_identity(&c->files[0], &st);
	return 0;
}
