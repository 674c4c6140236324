/* SPDX-License-Identifier: MIT */
/*
 * Placement (which tensor goes where under the target spec) and views (the
 * bytes of one target box, served from the source chunks).
 *
 * Read plan format.  A view keeps the list of "pieces": the non-empty
 * intersections of its box with the saved chunks, each remembering its
 * chunk, which knows how far its storage is dense row-major
 * (contig_from: dims contig_from..ndim-1 are contiguous in the file).  A read
 * of bytes [off, off+n) walks the box in C order; at each position it finds
 * the piece holding that element (box index below, with the previous piece
 * tried first since reads are sequential) and computes the longest run that
 * is contiguous in both the destination and the source file: the rest of
 * the current row, extended over whole outer slabs while the piece spans
 * the full box and the full chunk in every inner dimension.  Runs that
 * continue each other in the same file are merged before pread(), so a
 * target shard that is contiguous in one source file is one pread however
 * many rows it has.  Chunks saved with a non-unit innermost stride (a
 * transposed tensor saved as-is) are gathered element-wise through the
 * slicer, a block of the file at a time (gather_file(), bcache.h).
 *
 * Storage.  A plan has a view per tensor per TP rank (80,000 for 10,000
 * tensors at tp=8) and the mount walks them several times, so a view is
 * kept small: one block (struct, then its pieces with only ndim
 * coordinates each) cut from the plan's arena, its box shared with every
 * other view of the same box (interned), and no piece index below
 * SCAN_MAX pieces.
 */
#include "plan.h"

#include "bcache.h"
#include "grow.h"
#include "reader.h"
#include "slice.h"

#include <errno.h>
#include <limits.h>
#include <regex.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#define CLUSTER_BYTES (4u << 20) /* largest clustered preadv */
#define MAX_RUNS      65536	 /* runs queued before they are executed */

/* ---- box index: boxes sorted by start along one axis ---- */

/* Boxes (chunks, pieces) are scanned in order up to this count; sorted
 * and searched beyond. */
#define SCAN_MAX 8

/*
 * Boxes are read in place from the elements that hold them: a chunk's
 * slot of its tensor's dims block and a piece both keep ndim offsets then
 * ndim sizes (the chunk's strides follow).  gap is the distance, in
 * int64s, from off[0] to size[0].
 */
typedef struct box_index {
	const char *base; /* array of elements, each holding a box */
	size_t stride;	  /* element size */
	size_t box_off;	  /* offset of the box's off[0] inside an element */
	int gap;
	int ndim;
	int axis; /* sort axis (-1: a few boxes or 0-d, every one scanned) */
	int64_t maxext; /* largest extent along axis */
	size_t n;
	uint32_t *order; /* element indices sorted by off[axis] */
	bool own_order;	 /* order was malloc'd by bix_build() */
} box_index;

static const int64_t *bix_off(const box_index *ix, size_t i)
{
	return (const int64_t *)(ix->base + i * ix->stride + ix->box_off);
}

static int cmp_u32_by_start(const void *a, const void *b, void *arg)
{
	const box_index *ix = arg;
	int64_t sa = bix_off(ix, *(const uint32_t *)a)[ix->axis];
	int64_t sb = bix_off(ix, *(const uint32_t *)b)[ix->axis];

	return sa < sb ? -1 : sa > sb;
}

static bool box_empty(int ndim, const int64_t *size)
{
	for (int d = 0; d < ndim; d++)
		if (size[d] == 0)
			return true;
	return false;
}

/*
 * Sort along the axis with the most distinct starts, so a query scans as
 * few candidates as possible.  order: room for n indices, or NULL to have
 * one allocated (freed by bix_free()).
 */
static int bix_build(box_index *ix, const void *base, size_t stride,
		     size_t box_off, int gap, size_t n, int ndim,
		     uint32_t *order)
{
	int best = 0;
	size_t best_distinct = 0;

	memset(ix, 0, sizeof(*ix));
	ix->base = base;
	ix->stride = stride;
	ix->box_off = box_off;
	ix->gap = gap;
	ix->ndim = ndim;
	ix->axis = ndim ? 0 : -1;
	ix->order = order;
	if (!order) {
		ix->order = malloc((n ? n : 1) * sizeof(uint32_t));
		if (!ix->order)
			return -ENOMEM;
		ix->own_order = true;
	}
	for (size_t i = 0; i < n; i++)
		if (!box_empty(ndim, bix_off(ix, i) + gap))
			ix->order[ix->n++] = (uint32_t)i;
	/* a few boxes are scanned faster than sorted and searched */
	if (ndim == 0 || ix->n <= SCAN_MAX) {
		ix->axis = -1;
		return 0;
	}
	for (int d = 0; d < ndim; d++) {
		size_t distinct = 0;

		ix->axis = d;
		qsort_r(ix->order, ix->n, sizeof(uint32_t), cmp_u32_by_start,
			ix);
		for (size_t i = 0; i < ix->n; i++)
			distinct +=
			    i == 0 || bix_off(ix, ix->order[i])[d] !=
					  bix_off(ix, ix->order[i - 1])[d];
		if (distinct > best_distinct) {
			best_distinct = distinct;
			best = d;
		}
	}
	ix->axis = best;
	qsort_r(ix->order, ix->n, sizeof(uint32_t), cmp_u32_by_start, ix);
	for (size_t i = 0; i < ix->n; i++) {
		int64_t e = bix_off(ix, ix->order[i])[gap + ix->axis];

		if (e > ix->maxext)
			ix->maxext = e;
	}
	return 0;
}

static void bix_free(box_index *ix)
{
	if (ix->own_order)
		free(ix->order);
	ix->order = NULL;
}

static bool boxes_meet(int ndim, const int64_t *aoff, const int64_t *asize,
		       const int64_t *boff, const int64_t *bsize)
{
	for (int d = 0; d < ndim; d++)
		if (aoff[d] >= boff[d] + bsize[d] ||
		    boff[d] >= aoff[d] + asize[d])
			return false;
	return true;
}

/* Position of the first candidate whose start could reach lo along the
 * index axis (start > lo - maxext). */
static size_t bix_first(const box_index *ix, int64_t lo)
{
	size_t a = 0, b = ix->n;

	if (ix->axis < 0)
		return 0;
	while (a < b) {
		size_t m = a + (b - a) / 2;

		if (bix_off(ix, ix->order[m])[ix->axis] <= lo - ix->maxext)
			a = m + 1;
		else
			b = m;
	}
	return a;
}

/* Visit every indexed box that meets the query box (qoff, qsize); stops
 * early when fn returns non-zero and passes that value back. */
static int bix_query(const box_index *ix, const int64_t *qoff,
		     const int64_t *qsize, int (*fn)(void *arg, uint32_t idx),
		     void *arg)
{
	int64_t lo = ix->axis >= 0 ? qoff[ix->axis] : 0;
	int64_t hi = ix->axis >= 0 ? lo + qsize[ix->axis] : 1;

	if (box_empty(ix->ndim, qsize))
		return 0;
	for (size_t i = bix_first(ix, lo); i < ix->n; i++) {
		const int64_t *b = bix_off(ix, ix->order[i]);
		int rc;

		if (ix->axis >= 0 && b[ix->axis] >= hi)
			break;
		if (!boxes_meet(ix->ndim, b, b + ix->gap, qoff, qsize))
			continue;
		rc = fn(arg, ix->order[i]);
		if (rc)
			return rc;
	}
	return 0;
}

/* ---- arena: the plan's views, names and boxes, freed all at once ---- */

#define ARENA_BLOCK 65000 /* below malloc's mmap threshold: heap memory */

typedef struct arena_blk {
	struct arena_blk *next;
	size_t used, cap;
	max_align_t data[];
} arena_blk;

/* Boxes are interned while the plan is built: the views of tensors of one
 * shape share their boxes (a model has few distinct ones), which keeps a
 * view small enough that walking all of them stays in cache. */
typedef struct box_entry {
	int ndim;
	flx_box box;
} box_entry;

struct flx_plan_arena {
	arena_blk *head;
	box_entry **boxes; /* open addressing; only while building */
	size_t nboxes, capboxes;
};

/* n bytes, zeroed, aligned for any type; NULL when out of memory. */
static void *arena_alloc(flx_plan_arena *a, size_t n)
{
	arena_blk *b = a->head;
	size_t al = (n + _Alignof(max_align_t) - 1) &
		    ~(size_t)(_Alignof(max_align_t) - 1);
	void *p;

	if (al < n)
		return NULL;
	if (!b || b->cap - b->used < al) {
		bool own = al > ARENA_BLOCK / 4;
		size_t cap = own ? al : ARENA_BLOCK;

		if (cap > SIZE_MAX - sizeof(*b))
			return NULL;
		b = malloc(sizeof(*b) + cap);
		if (!b)
			return NULL;
		b->used = 0;
		b->cap = cap;
		/* a large block of its own goes behind the current one,
		 * whose free room stays in use */
		if (a->head && own) {
			b->next = a->head->next;
			a->head->next = b;
		} else {
			b->next = a->head;
			a->head = b;
		}
	}
	p = (char *)b->data + b->used;
	b->used += al;
	memset(p, 0, n);
	return p;
}

static void arena_free(flx_plan_arena *a)
{
	while (a && a->head) {
		arena_blk *b = a->head;

		a->head = b->next;
		free(b);
	}
	if (a) {
		free(a->boxes);
		a->boxes = NULL;
	}
}

static uint64_t box_hash(int ndim, const flx_box *b)
{
	uint64_t h = (uint64_t)ndim * 0x9e3779b97f4a7c15ull;

	for (int d = 0; d < ndim; d++) {
		h = (h ^ (uint64_t)b->off[d]) * 0xff51afd7ed558ccdull;
		h = (h ^ (uint64_t)b->size[d]) * 0xc4ceb9fe1a85ec53ull;
	}
	return h ^ (h >> 29);
}

static bool box_same(int ndim, const box_entry *e, const flx_box *b)
{
	if (e->ndim != ndim)
		return false;
	for (int d = 0; d < ndim; d++)
		if (e->box.off[d] != b->off[d] || e->box.size[d] != b->size[d])
			return false;
	return true;
}

/* The plan's copy of box (dims past ndim zero).  @return NULL when out of
 * memory. */
static const flx_box *box_intern(flx_plan_arena *a, int ndim, const flx_box *b)
{
	size_t i, mask;
	box_entry *e;

	if (a->nboxes + 1 > a->capboxes / 2) {
		size_t cap = a->capboxes ? 2 * a->capboxes : 256;
		box_entry **nb = calloc(cap, sizeof(*nb));

		if (!nb)
			return NULL;
		for (size_t k = 0; k < a->capboxes; k++) {
			box_entry *o = a->boxes[k];

			if (!o)
				continue;
			for (i = box_hash(o->ndim, &o->box) & (cap - 1); nb[i];
			     i = (i + 1) & (cap - 1))
				;
			nb[i] = o;
		}
		free(a->boxes);
		a->boxes = nb;
		a->capboxes = cap;
	}
	mask = a->capboxes - 1;
	for (i = box_hash(ndim, b) & mask; a->boxes[i]; i = (i + 1) & mask)
		if (box_same(ndim, a->boxes[i], b))
			return &a->boxes[i]->box;
	e = arena_alloc(a, sizeof(*e));
	if (!e)
		return NULL;
	e->ndim = ndim;
	memcpy(e->box.off, b->off, (size_t)ndim * sizeof(int64_t));
	memcpy(e->box.size, b->size, (size_t)ndim * sizeof(int64_t));
	a->boxes[i] = e;
	a->nboxes++;
	return &e->box;
}

/* ---- views ---- */

/* A piece: the intersection of the view's box with one saved chunk.
 * Stored back to back, each sizeof(piece) + 2 * ndim int64s. */
typedef struct piece {
	const flx_chunk *ch;
	int64_t c[]; /* off[0..ndim) then size[0..ndim), global */
} piece;

/*
 * One allocation per view: the struct, its pieces, then (more than
 * SCAN_MAX pieces) the piece index and its order array, then (a view of
 * its own) its box.  A plan's views live in its arena and share interned
 * boxes; flx_view_new()'s are malloc'd alone.
 */
struct flx_view {
	const flx_ckpt *ckpt;
	const flx_tensor *t;
	const flx_box *box;
	uint64_t bytes;
	uint32_t npieces;
	uint16_t esz;
	uint8_t ndim;
	bool standalone; /* freed by flx_view_free() */
	box_index *pix;	 /* NULL: few pieces, scanned */
};

static size_t piece_stride(int ndim)
{
	return sizeof(piece) + 2 * (size_t)ndim * sizeof(int64_t);
}

static const piece *piece_at(const flx_view *v, size_t i)
{
	return (const piece *)((const unsigned char *)(v + 1) +
			       i * piece_stride(v->ndim));
}

/* Chunk indices met by a view's box, gathered before the view is sized;
 * the buffer is reused from one view to the next. */
typedef struct scratch {
	uint32_t *idx;
	size_t n, cap;
} scratch;

static int collect_chunk(void *arg, uint32_t idx)
{
	scratch *s = arg;

	if (flx_grow((void **)&s->idx, &s->cap, s->n + 1, sizeof(uint32_t)))
		return -ENOMEM;
	s->idx[s->n++] = idx;
	return 0;
}

/* The chunk index of a tensor; order from small when it fits. */
static int chunk_index(const flx_tensor *t, box_index *ix, uint32_t *small,
		       size_t nsmall)
{
	return bix_build(ix, t->dims, 3 * (size_t)t->ndim * sizeof(int64_t), 0,
			 t->ndim, t->nchunks, t->ndim,
			 t->nchunks <= nsmall ? small : NULL);
}

/* Build the view of box over tensor t; from arena a, or malloc'd alone
 * when a is NULL.  sc: scratch space (emptied here). */
static int view_build(const flx_ckpt *ckpt, const flx_tensor *t,
		      const box_index *chunks, const flx_box *box,
		      flx_plan_arena *a, scratch *sc, flx_view **out,
		      flx_error *err)
{
	int D = t->ndim, rc;
	size_t np, pstride = piece_stride(D), need, at;
	uint64_t numel = 1, covered = 0;
	unsigned char *mem;
	flx_view *v;

	for (int d = D - 1; d >= 0; d--) {
		if (box->off[d] < 0 || box->size[d] < 0 ||
		    box->off[d] + box->size[d] > t->shape[d])
			return flx_error_set(err, -EINVAL, NULL, t->fqn,
					     "view box outside the tensor");
		numel *= (uint64_t)box->size[d];
	}
	sc->n = 0;
	rc = bix_query(chunks, box->off, box->size, collect_chunk, sc);
	if (rc)
		return rc;
	np = sc->n;
	need = sizeof(*v) + np * pstride;
	if (np > SCAN_MAX)
		need += sizeof(box_index) + np * sizeof(uint32_t);
	need = (need + 7) & ~(size_t)7;
	if (!a)
		need += sizeof(flx_box);
	mem = a ? arena_alloc(a, need) : calloc(1, need);
	if (!mem)
		return -ENOMEM;
	v = (flx_view *)mem;
	if (a) {
		v->box = box_intern(a, D, box);
		if (!v->box)
			return -ENOMEM;
	} else {
		flx_box *own = (flx_box *)(mem + need - sizeof(flx_box));

		*own = *box;
		v->box = own;
	}
	v->ckpt = ckpt;
	v->t = t;
	v->ndim = (uint8_t)D;
	v->esz = (uint16_t)flx_dtype_size(t->dtype);
	v->bytes = numel * v->esz;
	v->npieces = (uint32_t)np;
	v->standalone = !a;
	at = sizeof(*v) + np * pstride;
	for (size_t i = 0; i < np; i++) {
		const flx_chunk *ch = &t->chunks[sc->idx[i]];
		piece *p = (piece *)(mem + sizeof(*v) + i * pstride);

		for (int d = 0; d < D; d++) {
			int64_t lo =
			    ch->off[d] > box->off[d] ? ch->off[d] : box->off[d];
			int64_t e1 = ch->off[d] + ch->size[d];
			int64_t e2 = box->off[d] + box->size[d];

			p->c[d] = lo;
			p->c[D + d] = (e1 < e2 ? e1 : e2) - lo;
		}
		p->ch = ch;
		covered += flx_numel(D, p->c + D);
	}
	/* The chunks were validated to tile the tensor, so the pieces must
	 * tile the box; anything else is a bug, and serving it would return
	 * wrong bytes. */
	if (covered != numel) {
		rc = flx_error_set(err, -EIO, NULL, t->fqn,
				   "internal: pieces cover %llu of %llu "
				   "elements",
				   (unsigned long long)covered,
				   (unsigned long long)numel);
		if (!a)
			free(v);
		return rc;
	}
	if (np > SCAN_MAX) { /* order lies in the same block: cannot fail */
		v->pix = (box_index *)(mem + at);
		bix_build(v->pix, mem + sizeof(*v), pstride, offsetof(piece, c),
			  D, np, D, (uint32_t *)(mem + at + sizeof(box_index)));
	}
	*out = v;
	return 0;
}

int flx_view_new(const flx_ckpt *ckpt, const flx_tensor *t, const flx_box *box,
		 flx_view **out, flx_error *err)
{
	uint32_t small[64];
	scratch sc = {0};
	box_index ix;
	int rc = chunk_index(t, &ix, small, 64);

	if (rc)
		return rc;
	rc = view_build(ckpt, t, &ix, box, NULL, &sc, out, err);
	bix_free(&ix);
	free(sc.idx);
	return rc;
}

void flx_view_free(flx_view *v)
{
	if (v && v->standalone)
		free(v);
}

int flx_view_files(const flx_view *v, uint32_t **out, size_t *n)
{
	uint32_t *f = malloc((v->npieces ? v->npieces : 1) * sizeof(*f));

	if (!f)
		return -ENOMEM;
	for (size_t i = 0; i < v->npieces; i++)
		f[i] = piece_at(v, i)->ch->file;
	*out = f;
	*n = flx_u32_sort_unique(f, v->npieces);
	return 0;
}

size_t flx_view_npieces(const flx_view *v)
{
	return v->npieces;
}

uint32_t flx_view_piece_file(const flx_view *v, size_t i)
{
	return piece_at(v, i)->ch->file;
}

const flx_box *flx_view_box(const flx_view *v)
{
	return v->box;
}

const flx_tensor *flx_view_tensor(const flx_view *v)
{
	return v->t;
}

uint64_t flx_view_bytes(const flx_view *v)
{
	return v->bytes;
}

/* ---- reading ---- */

typedef struct pending {
	uint32_t file;
	uint64_t src; /* file offset */
	size_t dst;   /* offset in the caller's buffer */
	size_t len;
} pending;

/* A strided run queued for gather_flush(): view bytes [lo, hi), whose
 * element 0 starts at view byte ebase and file offset src0 and element i
 * at src0 + i * sstride.  lo advances as the run is copied. */
typedef struct srun {
	uint32_t file;
	uint64_t src0, sstride, ebase, lo, hi;
} srun;

typedef struct rdctx {
	const flx_view *v;
	unsigned char *buf;
	uint64_t off; /* view byte that buf[0] holds */
	flx_read_stats *stats;
	/* runs queued for this call, executed by flush() */
	pending *runs;
	size_t nruns, capruns;
	struct iovec *iov; /* scatter list of a clustered run */
	size_t capiov;
	/* files already verified during this call (reads touch few) */
	uint32_t checked[8];
	unsigned nchecked; /* verifications so far; the last 8 are kept */
	/* strided runs, executed block by block by gather_flush() */
	srun *sruns;
	size_t nsruns, capsruns;
	flx_bcache *cache;  /* shared blocks, or NULL */
	size_t block;	    /* block size of the gathers */
	unsigned char *win; /* a block read for this call alone */
	size_t win_cap;
} rdctx;

/* A backing file changed since mount would hand out wrong or mixed bytes:
 * check size and mtime once per file per read. */
static int check_file(rdctx *r, uint32_t file)
{
	const flx_file *f = &r->v->ckpt->files[file];
	int rc;

	for (unsigned i = 0; i < r->nchecked && i < 8; i++)
		if (r->checked[i] == file)
			return 0;
	rc = flx_file_verify(r->v->ckpt, f, false);
	if (rc)
		return -EIO;
	r->checked[r->nchecked++ % 8] = file;
	return 0;
}

static int do_pread(rdctx *r, uint32_t file, void *dst, size_t len,
		    uint64_t off)
{
	int rc = check_file(r, file);

	if (rc)
		return rc;
	rc = flx_pread_full(r->v->ckpt->files[file].fd, dst, len, off);
	if (r->stats) {
		r->stats->preads++;
		r->stats->bytes_read += len;
	}
	return rc;
}

static int cmp_run_src(const void *a, const void *b)
{
	const pending *x = a, *y = b;

	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->src < y->src ? -1 : x->src > y->src;
}

/*
 * Execute the queued runs.  Sorted by source position, runs of one file
 * that follow each other with gaps under a page form a cluster, read
 * with one preadv() that scatters each run straight to its place in the
 * caller's buffer and each gap into a scratch page.  The rows a request
 * needs from one saved chunk are usually adjacent on disk even when their
 * destinations interleave with another chunk's (a column-split source
 * read row-wise): hundreds of small reads become one, copying each byte
 * once.  A gap is what another rank's slice of the same rows leaves (TP4
 * of a TP2 source keeps half of each saved row): reading it costs a copy
 * of under a page per run, far less than a syscall per run, and no extra
 * disk I/O, since a gap under a page lies in pages the runs around it
 * need anyway.
 */
#define GAP_MAX 4095

static int read_cluster(rdctx *r, size_t i, size_t j)
{
	/* gap bytes land here, unread; one per thread (no shared writes) */
	static _Thread_local unsigned char gap_sink[GAP_MAX];
	uint32_t file = r->runs[i].file;
	int rc = check_file(r, file);

	/* Each preadv starts at its first run and ends at its last: the
	 * bytes it reads are at - src, gaps included. */
	while (!rc && i < j) {
		size_t k = 0;
		uint64_t src = r->runs[i].src, at = src;

		if (flx_grow((void **)&r->iov, &r->capiov, IOV_MAX,
			     sizeof(struct iovec)))
			return -ENOMEM;
		/* A run and the gap before it take two entries. */
		while (i < j && k + 2 <= IOV_MAX) {
			const pending *p = &r->runs[i];

			if (p->src > at) {
				r->iov[k].iov_base = gap_sink;
				r->iov[k++].iov_len = (size_t)(p->src - at);
			}
			r->iov[k].iov_base = r->buf + p->dst;
			r->iov[k++].iov_len = p->len;
			at = p->src + p->len;
			i++;
		}
		rc = flx_preadv_full(r->v->ckpt->files[file].fd, r->iov, (int)k,
				     src);
		if (r->stats) {
			r->stats->preads++;
			r->stats->bytes_read += at - src;
		}
	}
	return rc;
}

static int flush(rdctx *r)
{
	size_t i = 0;
	int rc = 0;

	if (r->nruns > 1)
		qsort(r->runs, r->nruns, sizeof(pending), cmp_run_src);
	while (i < r->nruns && !rc) {
		size_t j = i + 1;
		uint64_t end = r->runs[i].src + r->runs[i].len;

		while (j < r->nruns && r->runs[j].file == r->runs[i].file &&
		       r->runs[j].src >= end &&
		       r->runs[j].src - end <= GAP_MAX &&
		       r->runs[j].src + r->runs[j].len - r->runs[i].src <=
			   CLUSTER_BYTES) {
			end = r->runs[j].src + r->runs[j].len;
			j++;
		}
		if (j == i + 1)
			rc = do_pread(r, r->runs[i].file,
				      r->buf + r->runs[i].dst, r->runs[i].len,
				      r->runs[i].src);
		else
			rc = read_cluster(r, i, j);
		i = j;
	}
	r->nruns = 0;
	return rc;
}

/* Queue a contiguous run, merging it with the previous one when it
 * continues it in both the file and the buffer. */
static int emit(rdctx *r, uint32_t file, uint64_t src, size_t dst, size_t len)
{
	pending *last = r->nruns ? &r->runs[r->nruns - 1] : NULL;
	int rc;

	if (last && last->file == file && last->src + last->len == src &&
	    last->dst + last->len == dst) {
		last->len += len;
		return 0;
	}
	if (r->nruns == MAX_RUNS && (rc = flush(r)))
		return rc;
	if (flx_grow((void **)&r->runs, &r->capruns, r->nruns + 1,
		     sizeof(pending)))
		return -ENOMEM;
	r->runs[r->nruns++] = (pending){file, src, dst, len};
	return 0;
}

static int find_piece_cb(void *arg, uint32_t idx)
{
	*(uint32_t *)arg = idx;
	return 1;
}

static bool piece_holds(const flx_view *v, const piece *p, const int64_t *g)
{
	for (int d = 0; d < v->ndim; d++)
		if (g[d] < p->c[d] || g[d] >= p->c[d] + p->c[v->ndim + d])
			return false;
	return true;
}

static const piece *find_piece(const flx_view *v, const piece *hint,
			       const int64_t *g)
{
	int64_t ones[FLX_MAX_DIMS];
	uint32_t idx = UINT32_MAX;

	if (hint && piece_holds(v, hint, g))
		return hint;
	if (!v->pix) {
		for (size_t i = 0; i < v->npieces; i++)
			if (piece_holds(v, piece_at(v, i), g))
				return piece_at(v, i);
		return NULL;
	}
	for (int d = 0; d < v->ndim; d++)
		ones[d] = 1;
	bix_query(v->pix, g, ones, find_piece_cb, &idx);
	return idx == UINT32_MAX ? NULL : piece_at(v, idx);
}

/* Elements from g onwards (C order of the box) that stay inside piece p
 * and contiguous in its chunk's storage; see the comment at the top. */
static uint64_t run_elems(const flx_view *v, const piece *p, const int64_t *g)
{
	const flx_chunk *ch = p->ch;
	const flx_box *bx = v->box;
	int D = v->ndim;
	const int64_t *boff = p->c, *bsize = p->c + D;
	uint64_t n, inner;

	if (D == 0)
		return 1;
	n = (uint64_t)(boff[D - 1] + bsize[D - 1] - g[D - 1]);
	if (p->ch->contig_from >= D)
		return n; /* strided innermost: the caller gathers */
	inner = (uint64_t)bsize[D - 1];
	for (int j = D - 1; j >= 1; j--) {
		bool full = boff[j] == bx->off[j] && bsize[j] == bx->size[j] &&
			    boff[j] == ch->off[j] && bsize[j] == ch->size[j];

		if (!full || p->ch->contig_from > j - 1)
			break;
		n += (uint64_t)(boff[j - 1] + bsize[j - 1] - g[j - 1] - 1) *
		     inner;
		inner *= (uint64_t)bsize[j - 1];
	}
	return n;
}

/* File offset of global element g inside piece p's chunk. */
static uint64_t src_offset(const flx_view *v, const piece *p, const int64_t *g)
{
	const flx_chunk *ch = p->ch;
	int64_t e = ch->storage_offset;

	for (int d = 0; d < v->ndim; d++)
		e += (g[d] - ch->off[d]) * ch->stride[d];
	return ch->data_off + (uint64_t)e * v->esz;
}

/*
 * Strided gathers, block by block.  A chunk saved with a strided innermost
 * axis spreads each target row over the whole chunk, and the next row
 * reads the same blocks a few bytes further on; copying row after row
 * would read every block once per row.  The strided runs of a call are
 * queued instead, and gather_file() visits the blocks in file order: each
 * block is fetched once (from the shared cache, which also keeps it for
 * the next requests, or read for this call alone) and every run copies the
 * elements that start in it.
 */
#define MAX_SRUNS 4096 /* strided runs queued before they are executed */

static int block_get(rdctx *r, uint32_t file, uint64_t blk, flx_bref *b)
{
	const flx_file *f = &r->v->ckpt->files[file];
	uint64_t start = blk * r->block;
	size_t want;
	int rc;

	if (r->cache) {
		rc = flx_bcache_get(r->cache, file, f->fd, f->size, blk, b);
		if (rc == 1 && r->stats) {
			r->stats->preads++;
			r->stats->bytes_read += b->len;
		}
		if (rc != -EAGAIN)
			return rc < 0 ? (rc == -EINVAL ? -EIO : rc) : 0;
	}
	want = flx_bcache_block_len(r->block, f->size, blk);
	if (!want)
		return -EIO;
	if (want > r->win_cap) {
		void *nw = realloc(r->win, want);

		if (!nw)
			return -ENOMEM;
		r->win = nw;
		r->win_cap = want;
	}
	*b =
	    (flx_bref){.data = r->win, .start = start, .len = want, .slot = -1};
	return do_pread(r, file, r->win, want, start);
}

static void block_put(rdctx *r, flx_bref *b)
{
	if (b->slot >= 0)
		flx_bcache_put(r->cache, b);
}

/* File offset of the element holding the next byte of run u. */
static uint64_t srun_src(const srun *u, unsigned esz)
{
	return u->src0 + (u->lo - u->ebase) / esz * u->sstride;
}

/* Whole elements run u can copy from block b where it stands: those that
 * start in the block and end inside the bytes read; 0 when it stands
 * inside an element, past the block, or at bytes the block lacks. */
static uint64_t block_elems(const rdctx *r, const srun *u, const flx_bref *b)
{
	unsigned esz = r->v->esz;
	uint64_t bend = b->start + r->block, have = b->start + b->len;
	uint64_t s = srun_src(u, esz), n, fit;

	if (u->hi - u->lo < esz || (u->lo - u->ebase) % esz || s < b->start ||
	    s >= bend || s + esz > have)
		return 0;
	n = (u->hi - u->lo) / esz;
	if (u->sstride) {
		fit = (bend - 1 - s) / u->sstride + 1;
		if (fit > (have - esz - s) / u->sstride + 1)
			fit = (have - esz - s) / u->sstride + 1;
		if (n > fit)
			n = fit;
	}
	return n;
}

/* Copy the elements of run u that start in block b; partial elements at
 * the ends of the request are copied alone. */
static int gather_block(rdctx *r, srun *u, const flx_bref *b)
{
	const flx_slicer *sl = flx_slicer_default();
	unsigned esz = r->v->esz;
	uint64_t bend = b->start + r->block, have = b->start + b->len;

	while (u->lo < u->hi) {
		uint64_t within = (u->lo - u->ebase) % esz,
			 s = srun_src(u, esz), n = block_elems(r, u, b);
		unsigned char *dst = r->buf + (u->lo - r->off);
		int rc;

		if (s >= bend)
			break;
		/* the file is shorter than at mount */
		if (s < b->start || s + esz > have)
			return -EIO;
		if (n) {
			flx_slice sc = {.ndim = 1, .elem_size = esz};

			sc.shape[0] = (int64_t)n;
			sc.dst_stride[0] = esz;
			sc.src_stride[0] = (int64_t)u->sstride;
			rc = sl->copy(sl, dst, b->data + (s - b->start), &sc);
			if (rc)
				return rc;
			u->lo += n * esz;
		} else {
			uint64_t take = esz - within;

			if (take > u->hi - u->lo)
				take = u->hi - u->lo;
			memcpy(dst, b->data + (s - b->start) + within, take);
			u->lo += take;
		}
	}
	return 0;
}

/*
 * Runs that step through block b together -- consecutive rows of a
 * transposed chunk: sources a fixed few bytes apart, destinations a row
 * apart, the same number of elements in the block -- are copied as one 2-D
 * slice, which the slicer copies tile by tile (a transpose); gather_block()
 * then finishes what is left of each run in the block.
 */
static int gather_rows(rdctx *r, srun *u, size_t n, const flx_bref *b)
{
	const flx_slicer *sl = flx_slicer_default();
	unsigned esz = r->v->esz;

	for (size_t k = 0, j; k < n; k = j) {
		uint64_t cnt = block_elems(r, &u[k], b), a = 0, d = 0;
		flx_slice sc = {.ndim = 2, .elem_size = esz};
		int rc;

		for (j = k + 1; cnt && j < n; j++) {
			uint64_t s0 = srun_src(&u[j - 1], esz),
				 s1 = srun_src(&u[j], esz);

			if (j == k + 1) {
				a = s1 - s0;
				d = u[j].lo - u[j - 1].lo;
			}
			if (u[j].sstride != u[k].sstride || s1 <= s0 ||
			    s1 - s0 != a || u[j].lo <= u[j - 1].lo ||
			    u[j].lo - u[j - 1].lo != d ||
			    block_elems(r, &u[j], b) != cnt)
				break;
		}
		if (!cnt || j - k < 2) {
			j = k + 1;
			continue;
		}
		sc.shape[0] = (int64_t)(j - k);
		sc.shape[1] = (int64_t)cnt;
		sc.dst_stride[0] = (int64_t)d;
		sc.dst_stride[1] = esz;
		sc.src_stride[0] = (int64_t)a;
		sc.src_stride[1] = (int64_t)u[k].sstride;
		rc = sl->copy(sl, r->buf + (u[k].lo - r->off),
			      b->data + (srun_src(&u[k], esz) - b->start), &sc);
		if (rc)
			return rc;
		for (size_t q = k; q < j; q++)
			u[q].lo += cnt * esz;
	}
	return 0;
}

/* Runs u[0..n) of one file, lowest block first. */
static int gather_file(rdctx *r, srun *u, size_t n)
{
	unsigned esz = r->v->esz;
	size_t left = n;
	int rc = check_file(r, u[0].file);

	while (!rc && left) {
		uint64_t blk = UINT64_MAX;
		flx_bref b;

		for (size_t k = 0; k < n; k++)
			if (u[k].lo < u[k].hi &&
			    srun_src(&u[k], esz) / r->block < blk)
				blk = srun_src(&u[k], esz) / r->block;
		rc = block_get(r, u[0].file, blk, &b);
		if (rc)
			break;
		/* runs done by gather_rows() have lo == hi and are left
		 * alone below, so count what is left afresh */
		rc = gather_rows(r, u, n, &b);
		left = 0;
		for (size_t k = 0; k < n && !rc; k++) {
			if (u[k].lo < u[k].hi &&
			    srun_src(&u[k], esz) / r->block == blk)
				rc = gather_block(r, &u[k], &b);
			left += u[k].lo < u[k].hi;
		}
		block_put(r, &b);
	}
	return rc;
}

/* By file, then in view order (gather_rows() looks for neighbours). */
static int cmp_srun_file(const void *a, const void *b)
{
	const srun *x = a, *y = b;

	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static int gather_flush(rdctx *r)
{
	size_t i = 0;
	int rc = 0;

	if (r->nsruns > 1)
		qsort(r->sruns, r->nsruns, sizeof(srun), cmp_srun_file);
	while (i < r->nsruns && !rc) {
		size_t j = i + 1;

		while (j < r->nsruns && r->sruns[j].file == r->sruns[i].file)
			j++;
		rc = gather_file(r, r->sruns + i, j - i);
		i = j;
	}
	r->nsruns = 0;
	return rc;
}

/* Queue view bytes [lo, hi) of a strided run; see srun. */
static int gather(rdctx *r, uint32_t file, uint64_t src0, uint64_t sstride,
		  uint64_t ebase, uint64_t lo, uint64_t hi)
{
	int rc;

	if (r->nsruns == MAX_SRUNS && (rc = gather_flush(r)))
		return rc;
	if (flx_grow((void **)&r->sruns, &r->capsruns, r->nsruns + 1,
		     sizeof(srun)))
		return -ENOMEM;
	r->sruns[r->nsruns++] = (srun){file, src0, sstride, ebase, lo, hi};
	return 0;
}

static void unravel(const flx_view *v, uint64_t e, int64_t *g)
{
	for (int d = v->ndim - 1; d >= 0; d--) {
		uint64_t sz = (uint64_t)v->box->size[d];

		g[d] = v->box->off[d] + (int64_t)(e % sz);
		e /= sz;
	}
}

uint64_t flx_ckpt_gather_span(const flx_ckpt *ckpt, const flx_tensor **which)
{
	uint64_t best = 0;

	if (which)
		*which = NULL;
	for (size_t i = 0; i < ckpt->ntensors; i++) {
		const flx_tensor *t = &ckpt->tensors[i];

		for (uint32_t c = 0; c < t->nchunks; c++) {
			const flx_chunk *ch = &t->chunks[c];
			uint64_t span; /* storage elements it reaches */

			if (t->ndim == 0 || ch->contig_from < t->ndim ||
			    flx_strided_span(t->ndim, ch->size, ch->stride,
					     &span) != 0 ||
			    span == 0)
				continue;
			if (span * flx_dtype_size(t->dtype) > best) {
				best = span * flx_dtype_size(t->dtype);
				if (which)
					*which = t;
			}
		}
	}
	return best;
}

ssize_t flx_view_read_cached(const flx_view *v, flx_bcache *cache, void *buf,
			     size_t n, uint64_t off, flx_read_stats *stats)
{
	rdctx r = {.v = v,
		   .buf = buf,
		   .off = off,
		   .stats = stats,
		   .cache = cache,
		   .block = cache ? flx_bcache_block(cache) : FLX_BCACHE_BLOCK};
	const piece *p = NULL;
	uint64_t pos, end;
	int64_t g[FLX_MAX_DIMS];
	int rc = 0;

	if (off >= v->bytes || n == 0)
		return 0;
	if (n > v->bytes - off)
		n = (size_t)(v->bytes - off);
	end = off + n;
	for (pos = off; pos < end && !rc;) {
		uint64_t e = pos / v->esz, within = pos % v->esz;
		uint64_t elems, stop;

		unravel(v, e, g);
		p = find_piece(v, p, g);
		if (!p) {
			rc = -EIO;
			break;
		}
		elems = run_elems(v, p, g);
		stop = (e + elems) * v->esz;
		if (stop > end)
			stop = end;
		if (p->ch->contig_from < v->ndim || v->ndim == 0) {
			rc = emit(&r, p->ch->file, src_offset(v, p, g) + within,
				  (size_t)(pos - off), (size_t)(stop - pos));
		} else {
			rc = gather(&r, p->ch->file, src_offset(v, p, g),
				    (uint64_t)p->ch->stride[v->ndim - 1] *
					v->esz,
				    e * v->esz, pos, stop);
		}
		pos = stop;
	}
	if (!rc)
		rc = flush(&r);
	if (!rc)
		rc = gather_flush(&r);
	free(r.sruns);
	free(r.win);
	free(r.iov);
	free(r.runs);
	return rc ? rc : (ssize_t)n;
}

ssize_t flx_view_read(const flx_view *v, void *buf, size_t n, uint64_t off,
		      flx_read_stats *stats)
{
	return flx_view_read_cached(v, NULL, buf, n, off, stats);
}

int flx_view_ranges(const flx_view *v, uint64_t off, size_t n, flx_range *out,
		    size_t max)
{
	int64_t g[FLX_MAX_DIMS] = {0};
	const piece *p = NULL;
	uint64_t pos = off, end;
	size_t k = 0;

	if (n == 0 || off >= v->bytes || n > v->bytes - off || max == 0)
		return 0;
	end = off + n;
	while (pos < end) {
		uint64_t e = pos / v->esz, stop, src;

		unravel(v, e, g);
		p = find_piece(v, p, g);
		if (!p || (v->ndim > 0 && p->ch->contig_from >= v->ndim))
			return 0;
		stop = (e + run_elems(v, p, g)) * v->esz;
		if (stop > end)
			stop = end;
		src = src_offset(v, p, g) + pos % v->esz;
		if (k && out[k - 1].file == p->ch->file &&
		    out[k - 1].src + out[k - 1].len == src) {
			out[k - 1].len += stop - pos;
		} else {
			if (k == max)
				return 0;
			out[k++] = (flx_range){p->ch->file, src, stop - pos};
		}
		pos = stop;
	}
	for (size_t i = 0; i < k; i++)
		if (flx_file_verify(v->ckpt, &v->ckpt->files[out[i].file],
				    false))
			return -EIO;
	return (int)k;
}

/* ---- placement ---- */

typedef struct layer_match {
	int layer;     /* -1: not a layer tensor */
	size_t so, eo; /* the index digits in the FQN */
} layer_match;

/*
 * An allocation failure inside regexec() must not read as "no match" (the
 * tensor would silently land on another stage).  glibc's regexec() returns
 * REG_NOMATCH for every internal error, REG_ESPACE included, so the failed
 * malloc's errno is what tells them apart: callers clear errno first.
 */
static int match_rc(int r)
{
	if (r == 0 || (r == REG_NOMATCH && errno != ENOMEM))
		return 0;
	return -ENOMEM;
}

/* dflt: rx is FLX_DEFAULT_LAYER_REGEX, matched without regexec().
 * @return 0 (m->layer = -1 when fqn is no layer tensor) or -ENOMEM. */
static int match_layer(const regex_t *rx, bool dflt, const char *fqn,
		       layer_match *m)
{
	regmatch_t g[10];
	size_t ng = rx->re_nsub < 9 ? rx->re_nsub : 9;
	long v;
	int r;

	m->layer = -1;
	if (dflt) {
		if (!flx_default_layer_match(fqn, &m->so, &m->eo))
			return 0;
	} else {
		errno = 0;
		r = regexec(rx, fqn, ng + 1, g, 0);
		if (r != 0 || ng == 0 || g[ng].rm_so < 0)
			return match_rc(r);
		m->so = (size_t)g[ng].rm_so;
		m->eo = (size_t)g[ng].rm_eo;
	}
	if (m->eo == m->so || m->eo - m->so > 9)
		return 0;
	v = 0;
	for (size_t i = m->so; i < m->eo; i++) {
		if (fqn[i] < '0' || fqn[i] > '9')
			return 0;
		v = v * 10 + (fqn[i] - '0');
	}
	m->layer = (int)v;
	return 0;
}

static int infer_split(const flx_tensor *t, flx_error *err)
{
	int axis = -1;

	for (int d = 0; d < t->ndim; d++) {
		for (uint32_t i = 1; i < t->nchunks; i++) {
			if (t->chunks[i].off[d] == t->chunks[0].off[d])
				continue;
			if (axis >= 0 && axis != d)
				return flx_error_set(
				    err, -EINVAL, NULL, t->fqn,
				    "saved split along axes %d and %d; "
				    "add a rule giving its target split "
				    "(rules=FILE)",
				    axis, d);
			axis = d;
			break;
		}
	}
	return axis;
}

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	return x < y ? -1 : x > y;
}

typedef struct name_ref {
	const char *name;
	int stage;
	size_t tensor;
} name_ref;

static int cmp_name_ref(const void *a, const void *b)
{
	const name_ref *x = a, *y = b;

	if (x->stage != y->stage)
		return x->stage < y->stage ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int check_unique_names(flx_plan *p, flx_error *err)
{
	const flx_ckpt *c = p->ckpt;
	size_t n = 0, cap = 0;
	name_ref *refs = NULL;
	int rc = 0;

	/* Without renumbering every name is an FQN, and the checkpoint's
	 * FQNs are unique (its sorted index says so at a glance). */
	if (!p->spec->pp_renumber && c->by_name) {
		size_t i = 1;

		while (i < c->ntensors &&
		       strcmp(c->by_name[i - 1]->fqn, c->by_name[i]->fqn))
			i++;
		if (i >= c->ntensors)
			return 0;
		/* a repeat: the full check below names it */
	}

	for (size_t i = 0; i < p->n; i++)
		cap += (size_t)(p->p[i].stage_hi - p->p[i].stage_lo + 1);
	refs = malloc((cap ? cap : 1) * sizeof(*refs));
	if (!refs)
		return -ENOMEM;
	for (size_t i = 0; i < p->n; i++)
		for (int s = p->p[i].stage_lo; s <= p->p[i].stage_hi; s++)
			refs[n++] =
			    (name_ref){flx_placement_name(&p->p[i], s), s, i};
	qsort(refs, n, sizeof(*refs), cmp_name_ref);
	for (size_t i = 1; i < n && !rc; i++)
		if (cmp_name_ref(&refs[i - 1], &refs[i]) == 0)
			rc = flx_error_set(err, -EINVAL, NULL,
					   p->p[refs[i].tensor].src->fqn,
					   "target name '%s' on stage %d is "
					   "also used by %s",
					   refs[i].name, refs[i].stage,
					   p->p[refs[i - 1].tensor].src->fqn);
	free(refs);
	return rc;
}

/* Stage of each distinct layer: contiguous groups, the first
 * (nlayers mod pp) stages one layer longer. */
typedef struct layer_map {
	int *idx; /* sorted distinct layer indices */
	int n;
	int pp;
} layer_map;

static int layer_pos(const layer_map *m, int layer)
{
	int *hit = bsearch(&layer, m->idx, (size_t)m->n, sizeof(int), cmp_int);

	return hit ? (int)(hit - m->idx) : -1;
}

static int stage_of_pos(const layer_map *m, int pos)
{
	int base = m->n / m->pp, rem = m->n % m->pp;
	int big = rem * (base + 1);

	if (pos < big)
		return pos / (base + 1);
	return rem + (pos - big) / (base ? base : 1);
}

static int first_pos_of_stage(const layer_map *m, int s)
{
	int base = m->n / m->pp, rem = m->n % m->pp;

	return s < rem ? s * (base + 1) : rem * (base + 1) + (s - rem) * base;
}

/* fqn with the layer digits replaced by local, in the plan's arena. */
static const char *renamed(flx_plan_arena *a, const char *fqn,
			   const layer_match *lm, int local)
{
	char digits[16];
	int nd = snprintf(digits, sizeof(digits), "%d", local);
	size_t tail = strlen(fqn + lm->eo);
	char *out = arena_alloc(a, lm->so + (size_t)nd + tail + 1);

	if (!out)
		return NULL;
	memcpy(out, fqn, lm->so);
	memcpy(out + lm->so, digits, (size_t)nd);
	memcpy(out + lm->so + (size_t)nd, fqn + lm->eo, tail + 1);
	return out;
}

/* What place_one() needs besides the plan. */
typedef struct placer {
	const regex_t *embed_rx;
	const layer_map *lm;
	const layer_match *matches; /* per tensor, from build_layer_map() */
	scratch sc;
} placer;

static int place_one(flx_plan *p, size_t i, placer *pc, const box_index *chunks,
		     flx_error *err)
{
	const flx_spec *s = p->spec;
	flx_placement *pl = &p->p[i];
	const flx_tensor *t = pl->src;
	const flx_rule *rule = flx_spec_match(s, t->fqn);
	const layer_map *lm = pc->lm;
	const layer_match *m = &pc->matches[i];
	flx_view *whole = NULL;
	int nst, rc;
	flx_box box;

	/* split axis */
	if (rule && rule->split == FLX_SPLIT_NONE) {
		pl->split = -1;
	} else if (rule && rule->split == FLX_SPLIT_AXIS) {
		if (rule->axis >= t->ndim)
			return flx_error_set(err, -EINVAL, s->rules_path,
					     t->fqn,
					     "rule '%s' splits axis %d but the "
					     "tensor has %d dimension(s)",
					     rule->match, rule->axis, t->ndim);
		pl->split = rule->axis;
	} else {
		pl->split = infer_split(t, err);
		if (pl->split < -1)
			return pl->split;
	}
	/* stage */
	pl->layer = m->layer;
	switch (rule ? rule->stage : FLX_STAGE_DEFAULT) {
	case FLX_STAGE_FIRST:
		pl->stage_lo = pl->stage_hi = 0;
		break;
	case FLX_STAGE_LAST:
		pl->stage_lo = pl->stage_hi = s->pp - 1;
		break;
	case FLX_STAGE_ALL:
		pl->stage_lo = 0;
		pl->stage_hi = s->pp - 1;
		break;
	case FLX_STAGE_N:
		if (rule->stage_n >= s->pp)
			return flx_error_set(err, -EINVAL, s->rules_path,
					     t->fqn,
					     "rule '%s' names stage %d but "
					     "pp=%d",
					     rule->match, rule->stage_n, s->pp);
		pl->stage_lo = pl->stage_hi = rule->stage_n;
		break;
	default:
		errno = 0;
		rc = m->layer >= 0 ? 0
				   : regexec(pc->embed_rx, t->fqn, 0, NULL, 0);
		if (match_rc(rc))
			return -ENOMEM;
		if (m->layer >= 0)
			pl->stage_lo =
			    stage_of_pos(lm, layer_pos(lm, m->layer));
		else
			pl->stage_lo = rc == 0 ? 0 : s->pp - 1;
		pl->stage_hi = pl->stage_lo;
	}
	/* names per stage: the FQN itself unless renumbered */
	nst = pl->stage_hi - pl->stage_lo + 1;
	pl->names = arena_alloc(p->arena, (size_t)nst * sizeof(char *));
	if (!pl->names)
		return -ENOMEM;
	for (int k = 0; k < nst; k++) {
		int st = pl->stage_lo + k, pos = layer_pos(lm, m->layer);

		if (s->pp_renumber && m->layer >= 0 &&
		    stage_of_pos(lm, pos) == st)
			pl->names[k] =
			    renamed(p->arena, t->fqn, m,
				    pos - first_pos_of_stage(lm, st));
		else
			pl->names[k] = t->fqn;
		if (!pl->names[k])
			return -ENOMEM;
	}
	/* one view per TP rank; replicated tensors share one */
	pl->views = arena_alloc(p->arena, (size_t)s->tp * sizeof(flx_view *));
	if (!pl->views)
		return -ENOMEM;
	for (int d = 0; d < t->ndim; d++) {
		box.off[d] = 0;
		box.size[d] = t->shape[d];
	}
	for (int r = 0; r < s->tp; r++) {
		if (pl->split < 0 && r > 0) {
			pl->views[r] = pl->views[0];
			continue;
		}
		if (pl->split >= 0) {
			int64_t n = t->shape[pl->split];
			int64_t c = (n + s->tp - 1) / s->tp;
			int64_t lo = (int64_t)r * c < n ? (int64_t)r * c : n;
			int64_t hi = lo + c < n ? lo + c : n;

			box.off[pl->split] = lo;
			box.size[pl->split] = hi - lo;
		}
		rc = view_build(p->ckpt, t, chunks, &box, p->arena, &pc->sc,
				&pl->views[r], err);
		if (rc)
			return rc;
	}
	/* the whole tensor, for hf/: rank 0's view when its box is whole
	 * (replicated, or tp=1) */
	if (pl->split < 0 ||
	    pl->views[0]->box->size[pl->split] == t->shape[pl->split]) {
		pl->whole = pl->views[0];
		return 0;
	}
	for (int d = 0; d < t->ndim; d++) {
		box.off[d] = 0;
		box.size[d] = t->shape[d];
	}
	rc = view_build(p->ckpt, t, chunks, &box, p->arena, &pc->sc, &whole,
			err);
	pl->whole = whole;
	return rc;
}

/* Every tensor's layer match (kept for place_one()) and the sorted
 * distinct layer indices. */
static int build_layer_map(const flx_ckpt *c, const regex_t *rx, bool dflt,
			   int pp, layer_map *lm, layer_match *matches)
{
	lm->pp = pp;
	lm->n = 0;
	lm->idx = malloc((c->ntensors ? c->ntensors : 1) * sizeof(int));
	if (!lm->idx)
		return -ENOMEM;
	for (size_t i = 0; i < c->ntensors; i++) {
		if (match_layer(rx, dflt, c->tensors[i].fqn, &matches[i]))
			return -ENOMEM;
		if (matches[i].layer >= 0)
			lm->idx[lm->n++] = matches[i].layer;
	}
	qsort(lm->idx, (size_t)lm->n, sizeof(int), cmp_int);
	{
		int k = 0;

		for (int i = 0; i < lm->n; i++)
			if (i == 0 || lm->idx[i] != lm->idx[k - 1])
				lm->idx[k++] = lm->idx[i];
		lm->n = k;
	}
	return 0;
}

int flx_plan_build(const flx_ckpt *ckpt, const flx_spec *spec, flx_plan **out,
		   flx_error *err)
{
	flx_plan *p = calloc(1, sizeof(*p));
	regex_t layer_rx, embed_rx;
	bool have_layer = false, have_embed = false;
	layer_map lm = {0};
	layer_match *matches = NULL;
	placer pc = {.embed_rx = &embed_rx, .lm = &lm};
	int rc;

	if (!p)
		return flx_error_default(err, -ENOMEM, NULL);
	p->ckpt = ckpt;
	p->spec = spec;
	p->arena = calloc(1, sizeof(*p->arena));
	if (!p->arena) {
		rc = -ENOMEM;
		goto fail;
	}
	/* both were compiled when set; failing now means out of memory */
	rc = regcomp(&layer_rx, spec->layer_regex, REG_EXTENDED);
	have_layer = rc == 0;
	if (!rc) {
		rc = regcomp(&embed_rx, spec->embed_regex,
			     REG_EXTENDED | REG_NOSUB);
		have_embed = rc == 0;
	}
	if (rc) {
		rc = rc == REG_ESPACE
			 ? -ENOMEM
			 : flx_error_set(err, -EINVAL, NULL,
					 have_layer ? "embed_regex"
						    : "layer_regex",
					 "invalid regular expression");
		goto fail;
	}
	matches =
	    malloc((ckpt->ntensors ? ckpt->ntensors : 1) * sizeof(*matches));
	rc = matches ? build_layer_map(ckpt, &layer_rx,
				       strcmp(spec->layer_regex,
					      FLX_DEFAULT_LAYER_REGEX) == 0,
				       spec->pp, &lm, matches)
		     : -ENOMEM;
	if (rc)
		goto fail;
	pc.matches = matches;
	p->nlayers = lm.n;
	p->p = calloc(ckpt->ntensors ? ckpt->ntensors : 1, sizeof(*p->p));
	if (!p->p) {
		rc = -ENOMEM;
		goto fail;
	}
	for (size_t i = 0; i < ckpt->ntensors; i++) {
		uint32_t small[64];
		box_index ix;

		p->p[i].src = &ckpt->tensors[i];
		p->n = i + 1;
		rc = chunk_index(&ckpt->tensors[i], &ix, small, 64);
		if (rc)
			goto fail;
		rc = place_one(p, i, &pc, &ix, err);
		bix_free(&ix);
		if (rc)
			goto fail;
	}
	rc = check_unique_names(p, err);
	if (rc)
		goto fail;
	/* interning is over: the boxes stay, their table goes */
	free(p->arena->boxes);
	p->arena->boxes = NULL;
	p->arena->nboxes = p->arena->capboxes = 0;
	free(pc.sc.idx);
	free(matches);
	free(lm.idx);
	regfree(&layer_rx);
	regfree(&embed_rx);
	*out = p;
	return 0;
fail:
	flx_error_default(err, rc, NULL);
	if (err && !err->file[0]) {
		char meta[FLX_ERR_FIELD];

		snprintf(meta, sizeof(meta), "%s/.metadata", ckpt->dir);
		flx_error_file(err, meta);
	}
	free(pc.sc.idx);
	free(matches);
	free(lm.idx);
	if (have_layer)
		regfree(&layer_rx);
	if (have_embed)
		regfree(&embed_rx);
	flx_plan_free(p);
	return rc;
}

const char *flx_placement_name(const flx_placement *pl, int stage)
{
	return pl->names[stage - pl->stage_lo];
}

void flx_plan_free(flx_plan *p)
{
	if (!p)
		return;
	arena_free(p->arena);
	free(p->arena);
	free(p->p);
	free(p);
}
