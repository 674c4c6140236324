/* SPDX-License-Identifier: MIT */
/*
 * The namespace model.  Nodes live in one array; node i is inode i + 1.
 * Directories keep their children as node indices sorted by name (binary
 * search for lookup, that order for readdir).  Files are segment lists whose
 * starts are increasing, so a read finds its first segment by binary search.
 */
#include "tree_internal.h"

#include "grow.h"
#include "reader.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct node {
	char *name;
	int parent;
	bool dir;
	/* directory */
	int *kids;
	size_t nkids, capkids;
	/* file */
	flx_seg *segs;
	size_t nsegs, capsegs;
	uint64_t size;
	uint32_t *deps; /* backing files read (indices into ckpt->files) */
	size_t ndeps;
} node;

struct flx_fs {
	const flx_ckpt *ckpt;
	node *nodes;
	size_t n, cap;
	flx_view **views; /* owned views (hf/ whole tensors) */
	size_t nviews, capviews;
	int64_t mtime_ns;
	uint64_t total;
};

int flx_fs_new(flx_fs **out, const flx_ckpt *ckpt)
{
	flx_fs *fs = calloc(1, sizeof(*fs));

	if (!fs || flx_grow((void **)&fs->nodes, &fs->cap, 1, sizeof(node))) {
		free(fs);
		return -ENOMEM;
	}
	memset(&fs->nodes[0], 0, sizeof(node));
	fs->nodes[0].name = strdup("");
	if (!fs->nodes[0].name) {
		free(fs->nodes);
		free(fs);
		return -ENOMEM;
	}
	fs->nodes[0].dir = true;
	fs->n = 1;
	fs->ckpt = ckpt;
	fs->mtime_ns = ckpt->mtime_ns;
	*out = fs;
	return 0;
}

static int add_node(flx_fs *fs, int parent, const char *name, bool dir)
{
	node *pn, *nn;
	int idx;

	if (parent < 0 || (size_t)parent >= fs->n || !fs->nodes[parent].dir)
		return -ENOTDIR;
	if (flx_grow((void **)&fs->nodes, &fs->cap, fs->n + 1, sizeof(node)))
		return -ENOMEM;
	pn = &fs->nodes[parent];
	if (flx_grow((void **)&pn->kids, &pn->capkids, pn->nkids + 1,
		     sizeof(int)))
		return -ENOMEM;
	idx = (int)fs->n;
	nn = &fs->nodes[idx];
	memset(nn, 0, sizeof(*nn));
	nn->name = strdup(name);
	if (!nn->name)
		return -ENOMEM;
	nn->parent = parent;
	nn->dir = dir;
	pn->kids[pn->nkids++] = idx;
	fs->n++;
	return idx;
}

int flx_fs_mkdir(flx_fs *fs, int parent, const char *name)
{
	return add_node(fs, parent, name, true);
}

int flx_fs_mkfile(flx_fs *fs, int parent, const char *name)
{
	return add_node(fs, parent, name, false);
}

static flx_seg *new_seg(flx_fs *fs, int file, flx_seg_kind kind, uint64_t len)
{
	node *f = &fs->nodes[file];
	flx_seg *s;

	if (len == 0)
		return NULL;
	if (flx_grow((void **)&f->segs, &f->capsegs, f->nsegs + 1,
		     sizeof(flx_seg)))
		return NULL;
	s = &f->segs[f->nsegs++];
	s->kind = kind;
	s->start = f->size;
	s->len = len;
	f->size += len;
	fs->total += len;
	return s;
}

int flx_fs_add_lit(flx_fs *fs, int file, unsigned char *bytes, uint64_t len)
{
	flx_seg *s;

	if (len == 0) {
		free(bytes);
		return 0;
	}
	s = new_seg(fs, file, FLX_SEG_LIT, len);
	if (!s) {
		free(bytes);
		return -ENOMEM;
	}
	s->u.lit = bytes;
	return 0;
}

int flx_fs_add_view(flx_fs *fs, int file, const flx_view *v)
{
	flx_seg *s;

	if (flx_view_bytes(v) == 0)
		return 0;
	s = new_seg(fs, file, FLX_SEG_VIEW, flx_view_bytes(v));
	if (!s)
		return -ENOMEM;
	s->u.view = v;
	return 0;
}

int flx_fs_add_raw(flx_fs *fs, int file, const flx_file *f, uint64_t off,
		   uint64_t len)
{
	flx_seg *s;

	if (len == 0)
		return 0;
	s = new_seg(fs, file, FLX_SEG_RAW, len);
	if (!s)
		return -ENOMEM;
	s->u.raw.file = f;
	s->u.raw.off = off;
	return 0;
}

uint64_t flx_fs_file_size(const flx_fs *fs, int file)
{
	return fs->nodes[file].size;
}

int flx_fs_own_view(flx_fs *fs, flx_view *v)
{
	if (flx_grow((void **)&fs->views, &fs->capviews, fs->nviews + 1,
		     sizeof(flx_view *))) {
		flx_view_free(v);
		return -ENOMEM;
	}
	fs->views[fs->nviews++] = v;
	return 0;
}

static int cmp_kid(const void *a, const void *b, void *arg)
{
	const flx_fs *fs = arg;

	return strcmp(fs->nodes[*(const int *)a].name,
		      fs->nodes[*(const int *)b].name);
}

/* The sorted, unique backing files of a file node. */
static int collect_deps(const flx_fs *fs, node *nd)
{
	size_t cap = 0;
	int rc = 0;

	for (size_t i = 0; i < nd->nsegs && !rc; i++) {
		const flx_seg *sg = &nd->segs[i];
		uint32_t *files = NULL, one;
		size_t n = 0;

		if (sg->kind == FLX_SEG_LIT)
			continue;
		if (sg->kind == FLX_SEG_RAW) {
			one = (uint32_t)(sg->u.raw.file - fs->ckpt->files);
			files = &one;
			n = 1;
		} else if ((rc = flx_view_files(sg->u.view, &files, &n))) {
			break;
		}
		rc = flx_grow((void **)&nd->deps, &cap, nd->ndeps + n,
			      sizeof(uint32_t));
		if (!rc && n) {
			memcpy(nd->deps + nd->ndeps, files, n * sizeof(*files));
			nd->ndeps += n;
		}
		if (files != &one)
			free(files);
	}
	if (rc)
		return rc;
	nd->ndeps = flx_u32_sort_unique(nd->deps, nd->ndeps);
	return 0;
}

int flx_fs_finish(flx_fs *fs, const char **dup)
{
	for (size_t i = 0; i < fs->n; i++) {
		node *d = &fs->nodes[i];

		if (!d->dir) {
			if (collect_deps(fs, d))
				return -ENOMEM;
			continue;
		}
		if (d->nkids > 1) /* an empty directory has no array */
			qsort_r(d->kids, d->nkids, sizeof(int), cmp_kid, fs);
		/* a duplicate name would make lookups ambiguous */
		for (size_t k = 1; k < d->nkids; k++)
			if (cmp_kid(&d->kids[k - 1], &d->kids[k], fs) == 0) {
				*dup = fs->nodes[d->kids[k]].name;
				return -EEXIST;
			}
	}
	return 0;
}

void flx_fs_free(flx_fs *fs)
{
	if (!fs)
		return;
	for (size_t i = 0; i < fs->n; i++) {
		node *nd = &fs->nodes[i];

		for (size_t k = 0; k < nd->nsegs; k++)
			if (nd->segs[k].kind == FLX_SEG_LIT)
				free(nd->segs[k].u.lit);
		free(nd->segs);
		free(nd->deps);
		free(nd->kids);
		free(nd->name);
	}
	for (size_t i = 0; i < fs->nviews; i++)
		flx_view_free(fs->views[i]);
	free(fs->views);
	free(fs->nodes);
	free(fs);
}

/* ---- queries ---- */

static const node *get(const flx_fs *fs, flx_ino ino)
{
	if (ino < 1 || ino > fs->n)
		return NULL;
	return &fs->nodes[ino - 1];
}

static void fill_stat(const flx_fs *fs, const node *nd, flx_stat *st)
{
	st->ino = (flx_ino)(nd - fs->nodes) + 1;
	st->dir = nd->dir;
	st->size = nd->dir ? nd->nkids : nd->size;
	st->nlink = 1;
	if (nd->dir) {
		st->nlink = 2;
		for (size_t i = 0; i < nd->nkids; i++)
			st->nlink += fs->nodes[nd->kids[i]].dir;
	}
	st->mtime_ns = fs->mtime_ns;
}

int flx_fs_stat(const flx_fs *fs, flx_ino ino, flx_stat *st)
{
	const node *nd = get(fs, ino);

	if (!nd)
		return -ENOENT;
	fill_stat(fs, nd, st);
	return 0;
}

int flx_fs_lookup(const flx_fs *fs, flx_ino parent, const char *name,
		  flx_stat *st)
{
	const node *dir = get(fs, parent);
	size_t lo = 0, hi;

	if (!dir)
		return -ENOENT;
	if (!dir->dir)
		return -ENOTDIR;
	hi = dir->nkids;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const node *k = &fs->nodes[dir->kids[mid]];
		int r = strcmp(k->name, name);

		if (r == 0) {
			fill_stat(fs, k, st);
			return 0;
		}
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -ENOENT;
}

int flx_fs_readdir(const flx_fs *fs, flx_ino dir, uint64_t pos,
		   const char **name, flx_stat *st)
{
	const node *d = get(fs, dir);
	const node *k;

	if (!d)
		return -ENOENT;
	if (!d->dir)
		return -ENOTDIR;
	if (pos >= d->nkids)
		return 0;
	k = &fs->nodes[d->kids[pos]];
	*name = k->name;
	fill_stat(fs, k, st);
	return 1;
}

int flx_fs_resolve(const flx_fs *fs, const char *path, flx_stat *st)
{
	char part[256];
	flx_ino cur = FLX_ROOT_INO;
	int rc = flx_fs_stat(fs, cur, st);

	while (!rc && *path) {
		size_t n = strcspn(path, "/");

		if (n == 0) {
			path++;
			continue;
		}
		if (n >= sizeof(part))
			return -ENOENT;
		memcpy(part, path, n);
		part[n] = '\0';
		rc = flx_fs_lookup(fs, cur, part, st);
		cur = st->ino;
		path += n;
	}
	return rc;
}

static ssize_t read_seg(const flx_fs *fs, const flx_seg *s, unsigned char *buf,
			size_t n, uint64_t off, flx_read_stats *stats)
{
	int rc;

	switch (s->kind) {
	case FLX_SEG_LIT:
		memcpy(buf, s->u.lit + off, n);
		return (ssize_t)n;
	case FLX_SEG_VIEW:
		return flx_view_read(s->u.view, buf, n, off, stats);
	case FLX_SEG_RAW:
		/* a passthrough file changed since mount: no mixed bytes */
		if (flx_file_verify(fs->ckpt, s->u.raw.file, false))
			return -EIO;
		rc = flx_pread_full(s->u.raw.file->fd, buf, n,
				    s->u.raw.off + off);
		if (stats) {
			stats->preads++;
			stats->bytes_read += n;
		}
		return rc ? rc : (ssize_t)n;
	}
	return -EIO;
}

/* Index of the last segment starting at or before off (f has segments). */
static size_t seg_at(const node *f, uint64_t off)
{
	size_t lo = 0, hi = f->nsegs;

	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;

		if (f->segs[mid].start <= off)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

int flx_fs_map(const flx_fs *fs, flx_ino ino, uint64_t off, size_t n, int *fd,
	       uint64_t *src)
{
	const node *f = get(fs, ino);
	const flx_seg *s;
	uint32_t file;
	uint64_t at;
	int rc;

	if (!f)
		return -ENOENT;
	if (f->dir || n == 0 || off >= f->size || n > f->size - off)
		return 0;
	s = &f->segs[seg_at(f, off)];
	at = off - s->start;
	if (n > s->len - at)
		return 0;
	switch (s->kind) {
	case FLX_SEG_RAW:
		if (flx_file_verify(fs->ckpt, s->u.raw.file, false))
			return -EIO;
		*fd = s->u.raw.file->fd;
		*src = s->u.raw.off + at;
		return 1;
	case FLX_SEG_VIEW:
		rc = flx_view_map(s->u.view, at, n, &file, src);
		if (rc == 1)
			*fd = fs->ckpt->files[file].fd;
		return rc;
	default:
		return 0;
	}
}

ssize_t flx_fs_read(const flx_fs *fs, flx_ino ino, void *buf, size_t n,
		    uint64_t off, flx_read_stats *stats)
{
	const node *f = get(fs, ino);
	size_t done = 0;

	if (!f)
		return -ENOENT;
	if (f->dir)
		return -EISDIR;
	if (off >= f->size || n == 0)
		return 0;
	if (n > f->size - off)
		n = (size_t)(f->size - off);
	for (size_t i = seg_at(f, off); done < n && i < f->nsegs; i++) {
		const flx_seg *s = &f->segs[i];
		uint64_t at = off + done - s->start;
		size_t take =
		    (size_t)(s->len - at < n - done ? s->len - at : n - done);
		ssize_t got = read_seg(fs, s, (unsigned char *)buf + done, take,
				       at, stats);

		if (got < 0)
			return got;
		if ((size_t)got != take)
			return -EIO;
		done += take;
	}
	return (ssize_t)done;
}

int flx_fs_open_check(const flx_fs *fs, flx_ino ino)
{
	const node *nd = get(fs, ino);

	if (!nd)
		return -ENOENT;
	for (size_t i = 0; i < nd->ndeps; i++) {
		int rc = flx_file_verify(fs->ckpt,
					 &fs->ckpt->files[nd->deps[i]], true);

		if (rc)
			return rc == -ENOMEM ? rc : -ESTALE;
	}
	return 0;
}

int flx_fs_path(const flx_fs *fs, flx_ino ino, char *buf, size_t len)
{
	const node *nd = get(fs, ino);
	size_t at;

	if (!nd)
		return -ENOENT;
	if (!len)
		return -ENAMETOOLONG;
	/* fill buf from its end while walking up to the root */
	at = len - 1;
	buf[at] = '\0';
	for (; nd != fs->nodes; nd = &fs->nodes[nd->parent]) {
		size_t n = strlen(nd->name), sep = at < len - 1;

		if (n + sep > at)
			return -ENAMETOOLONG;
		if (sep)
			buf[--at] = '/';
		at -= n;
		memcpy(buf + at, nd->name, n);
	}
	memmove(buf, buf + at, len - at);
	return 0;
}

uint64_t flx_fs_inode_count(const flx_fs *fs)
{
	return fs->n;
}

uint64_t flx_fs_total_bytes(const flx_fs *fs)
{
	return fs->total;
}
