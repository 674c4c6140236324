/* SPDX-License-Identifier: MIT */
/*
 * Views: the bytes of one target box, served from the source chunks.
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
 * slicer, the strided runs of a call as one batch (gather_flush(),
 * gpu/slice.h) whose blocks come from the mount's cache (bcache.h).
 *
 * Storage.  A plan has a view per tensor per TP rank (80,000 for 10,000
 * tensors at tp=8) and a piece per chunk it meets (a million at tp=1 over
 * a million-chunk checkpoint), so a view is kept small: one block
 * (struct, then its pieces) cut from the plan's arena, its box shared with
 * every other view of the same box (interned), and no piece index below
 * SCAN_MAX pieces.  A view whose box holds each chunk it meets whole (the
 * usual case: a target rank gathers saved shards) keeps per piece only
 * the chunk's number in its tensor, 4 bytes, and reads the box from the
 * chunk; any other keeps the chunk and the intersection's coordinates.
 */
#include "view_internal.h"

#include "bcache.h"
#include "cast.h"
#include "grow.h"
#include "reader.h"
#include "slice.h"
#include "zcache.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#define CLUSTER_BYTES (4u << 20) /* largest clustered preadv */
#define MAX_RUNS      65536	 /* runs queued before they are executed */

/* ---- views ---- */

/* A piece: the intersection of the view's box with one saved chunk.  In
 * a view of whole chunks (flx_view.whole) a piece is the chunk's number in
 * its tensor (uint32_t); otherwise it is this, sizeof(piece) + 2 * ndim
 * int64s long, back to back. */
typedef struct piece {
	const flx_chunk *ch;
	int64_t c[]; /* off[0..ndim) then size[0..ndim), global */
} piece;

/* A piece as the read path sees it, whichever way it is stored: its
 * chunk and its box (global).  ch NULL: none. */
typedef struct pref {
	const flx_chunk *ch;
	const int64_t *off, *size;
} pref;

static size_t piece_stride(int ndim, bool whole)
{
	return whole ? sizeof(uint32_t)
		     : sizeof(piece) + 2 * (size_t)ndim * sizeof(int64_t);
}

static pref chunk_piece(const flx_view *v, uint32_t chunk)
{
	const flx_chunk *ch = &v->t->chunks[chunk];

	return (pref){ch, ch->off, ch->size};
}

static pref piece_get(const flx_view *v, size_t i)
{
	const unsigned char *at = (const unsigned char *)(v + 1);
	const piece *p;

	if (v->whole)
		return chunk_piece(v, ((const uint32_t *)at)[i]);
	p = (const piece *)(at + i * piece_stride(v->ndim, false));
	return (pref){p->ch, p->c, p->c + v->ndim};
}

/* Whether box b holds chunk ch whole. */
static bool box_holds(int D, const flx_box *b, const flx_chunk *ch)
{
	for (int d = 0; d < D; d++)
		if (ch->off[d] < b->off[d] ||
		    ch->off[d] + ch->size[d] > b->off[d] + b->size[d])
			return false;
	return true;
}

static int collect_chunk(void *arg, uint32_t idx)
{
	scratch *s = arg;

	if (flx_grow((void **)&s->idx, &s->cap, s->n + 1, sizeof(uint32_t)))
		return -ENOMEM;
	s->idx[s->n++] = idx;
	return 0;
}

/* The chunk index of a tensor; order from small when it fits.  The boxes
 * are read in place: chunk i's off lies i steps past chunk 0's, its size
 * right behind it (flx_tensor.dims); anything else is a bug (-EIO). */
int chunk_index(const flx_tensor *t, box_index *ix, uint32_t *small,
		size_t nsmall)
{
	ptrdiff_t D = t->ndim, step = 3 * D;
	const int64_t *base = t->dims;

	if (t->nchunks > 0 && D > 0) {
		base = t->chunks[0].off;
		if (t->nchunks > 1)
			step = t->chunks[1].off - base;
		if (step < 2 * D)
			return -EIO;
		for (uint32_t i = 0; i < t->nchunks; i++)
			if (t->chunks[i].off != base + (ptrdiff_t)i * step ||
			    t->chunks[i].size != t->chunks[i].off + D)
				return -EIO;
	}
	return bix_build(ix, base, (size_t)step * sizeof(int64_t), 0, t->ndim,
			 t->nchunks, t->ndim,
			 t->nchunks <= nsmall ? small : NULL);
}

/* Build the view of box over tensor t; from arena a, or malloc'd alone
 * when a is NULL.  sc: scratch space (emptied here). */
int view_build(const flx_ckpt *ckpt, const flx_tensor *t,
	       const box_index *chunks, const flx_box *box, flx_plan_arena *a,
	       scratch *sc, flx_view **out, flx_error *err)
{
	int D = t->ndim, rc;
	size_t np, pstride, need, at;
	uint64_t numel = 1, covered = 0;
	unsigned char *mem;
	bool whole = true;
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
	for (size_t i = 0; i < np && whole; i++)
		whole = box_holds(D, box, &t->chunks[sc->idx[i]]);
	pstride = piece_stride(D, whole);
	need = sizeof(*v) + np * pstride;
	need = (need + 7) & ~(size_t)7;
	at = need;
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
	v->esz = (uint16_t)flx_dtype_size(flx_tensor_stored(t));
	v->bytes = numel * v->esz;
	v->npieces = (uint32_t)np;
	v->standalone = !a;
	v->whole = whole;
	for (size_t i = 0; i < np; i++) {
		const flx_chunk *ch = &t->chunks[sc->idx[i]];
		piece *p = (piece *)(mem + sizeof(*v) + i * pstride);

		if (whole) {
			((uint32_t *)(v + 1))[i] = sc->idx[i];
			covered += flx_numel(D, ch->size);
			continue;
		}
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
	/* the piece index lies in the same block: cannot fail.  A view of
	 * whole chunks indexes them in place, by chunk number. */
	if (np > SCAN_MAX) {
		uint32_t *order = (uint32_t *)(mem + at + sizeof(box_index));

		v->pix = (box_index *)(mem + at);
		if (whole)
			bix_build_subset(v->pix, chunks->base, chunks->stride,
					 chunks->box_off, chunks->gap, sc->idx,
					 np, D, order);
		else
			bix_build(v->pix, mem + sizeof(*v), pstride,
				  offsetof(piece, c), D, np, D, order);
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
		f[i] = piece_get(v, i).ch->file;
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
	return piece_get(v, i).ch->file;
}

uint64_t flx_view_piece_bytes(const flx_view *v, size_t i)
{
	/* a piece's elements fit the view's, whose bytes were checked */
	return flx_numel(v->ndim, piece_get(v, i).size) *
	       flx_dtype_size(v->t->dtype);
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
	/* v->bytes and v->esz count what the chunks hold; a cast tensor's
	 * elements are read in another size */
	if (!v->t->stored)
		return v->bytes;
	return v->bytes / v->esz * flx_dtype_size(v->t->dtype);
}

/* ---- reading ---- */

/* A contiguous run queued for reading: file, its offset there (off), its
 * place in the caller's buffer (buf) and its length. */
typedef flx_file_span pending;

/* Blocks [lo, hi] of a file that the elements of queued runs start in. */
typedef struct span {
	uint32_t file;
	uint64_t lo, hi;
} span;

typedef struct rdctx {
	const flx_view *v;
	unsigned char *buf;
	uint64_t off; /* view byte that buf[0] holds */
	size_t len;   /* bytes of buf this call fills */
	flx_read_stats *stats;
	/* runs queued for this call, executed by flush() */
	pending *runs;
	size_t nruns, capruns;
	struct iovec *iov; /* scatter list of a clustered run */
	size_t capiov;
	/* files already verified during this call (reads touch few) */
	uint32_t checked[8];
	unsigned nchecked; /* verifications so far; the last 8 are kept */
	/* strided runs, executed as one batch by gather_flush() */
	flx_slice_run *sruns;
	size_t nsruns, capsruns;
	size_t nspans; /* spans the queued runs add (see run_spans()) */
	span *spans;
	size_t capspans;
	flx_slice_block *blocks;
	size_t capblocks;
	flx_bcache *cache;	  /* shared blocks, or NULL */
	const flx_slicer *slicer; /* executes the batches */
	size_t block;		  /* block size of the gathers */
	flx_bref held;		  /* the block the slicer has pinned */
	unsigned char *win;	  /* a block read for this call alone */
	size_t win_cap;
	flx_zcache *zcache;    /* zstd chunks' content, or NULL */
	flx_view_batch *batch; /* remote runs deferred here, or NULL */
	/* a cast read for a slicer that converts as it gathers
	 * (flx_slicer_casts()): whole source elements, every run gathered
	 * with the cast, buf holding the converted ones; or NULL */
	const flx_ecast *cast;
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
	rc = flx_file_pread(r->v->ckpt, file, dst, len, off);
	if (rc && rc != -EIO && rc != -ENOMEM)
		rc = -EIO;
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
	return x->off < y->off ? -1 : x->off > y->off;
}

/* Sort runs[0..n) by file, then offset, unless they already are (runs are
 * mostly queued in file order: skipping the sort saves its cost). */
static void sort_runs(pending *runs, size_t n)
{
	for (size_t i = 1; i < n; i++)
		if (cmp_run_src(&runs[i - 1], &runs[i]) > 0) {
			qsort(runs, n, sizeof(pending), cmp_run_src);
			return;
		}
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
 * of a TP2 source keeps half of each saved row), or the item header
 * between two small tensors saved one after the other (a file of many
 * small items, each behind its own header): reading it costs a copy of
 * under a page per run, far less than a syscall per run, and no extra
 * disk I/O, since a gap under a page lies in pages the runs around it
 * need anyway.
 */
#define GAP_MAX 4095

/* Scatter lists of the clustered reads, grown on use. */
typedef struct iolist {
	struct iovec *iov;
	size_t cap;
} iolist;

/* Runs s[i..j) of one local file, sorted by offset, each starting at or
 * after the end of the one before with a gap under GAP_MAX: read with
 * preadv()s of at most IOV_MAX entries. */
static int read_cluster(const flx_ckpt *c, const pending *s, size_t i, size_t j,
			iolist *io, flx_read_stats *stats)
{
	/* gap bytes land here, unread; one per thread (no shared writes) */
	static _Thread_local unsigned char gap_sink[GAP_MAX];
	uint32_t file = s[i].file;
	int rc = 0;

	/* Each preadv starts at its first run and ends at its last: the
	 * bytes it reads are at - src, gaps included. */
	while (!rc && i < j) {
		size_t k = 0;
		uint64_t src = s[i].off, at = src;

		if (flx_grow((void **)&io->iov, &io->cap, IOV_MAX,
			     sizeof(struct iovec))) {
			rc = -ENOMEM;
			break;
		}
		/* A run and the gap before it take two entries. */
		while (i < j && k + 2 <= IOV_MAX) {
			const pending *p = &s[i];

			if (p->off > at) {
				io->iov[k].iov_base = gap_sink;
				io->iov[k++].iov_len = (size_t)(p->off - at);
			}
			io->iov[k].iov_base = p->buf;
			io->iov[k++].iov_len = p->len;
			at = p->off + p->len;
			i++;
		}
		rc = flx_file_preadv(c, file, io->iov, (int)k, src);
		if (rc && rc != -EIO && rc != -ENOMEM)
			rc = -EIO;
		if (stats) {
			stats->preads++;
			stats->bytes_read += at - src;
		}
	}
	return rc;
}

/* Local runs s[0..n) of one file, sorted by offset (the file checked by
 * the caller): clusters read by read_cluster(), a lone run by one pread. */
static int read_file_runs(const flx_ckpt *c, const pending *s, size_t n,
			  iolist *io, flx_read_stats *stats)
{
	size_t i = 0;
	int rc = 0;

	while (i < n && !rc) {
		size_t j = i + 1;
		uint64_t end = s[i].off + s[i].len;

		while (j < n && s[j].off >= end && s[j].off - end <= GAP_MAX &&
		       s[j].off + s[j].len - s[i].off <= CLUSTER_BYTES) {
			end = s[j].off + s[j].len;
			j++;
		}
		if (j == i + 1) {
			rc = flx_file_pread(c, s[i].file, s[i].buf, s[i].len,
					    s[i].off);
			if (rc && rc != -EIO && rc != -ENOMEM)
				rc = -EIO;
			if (stats) {
				stats->preads++;
				stats->bytes_read += s[i].len;
			}
		} else {
			rc = read_cluster(c, s, i, j, io, stats);
		}
		i = j;
	}
	return rc;
}

#define BATCH_MAX 65536 /* spans a batch holds before it is flushed */

/* The local runs of b, sorted: each file checked once (flx_file_verify(),
 * as check_file() does for one view read), then its runs read. */
static int batch_read_local(flx_view_batch *b)
{
	const flx_ckpt *c = b->ckpt;
	iolist io = {b->iov, b->capiov};
	size_t i = 0;
	int rc = 0;

	sort_runs(b->local, b->nlocal);
	while (i < b->nlocal && !rc) {
		uint32_t file = b->local[i].file;
		size_t j = i + 1;

		while (j < b->nlocal && b->local[j].file == file)
			j++;
		if (flx_file_verify(c, &c->files[file], false))
			rc = -EIO;
		else
			rc = read_file_runs(c, b->local + i, j - i, &io,
					    b->stats);
		i = j;
	}
	b->iov = io.iov;
	b->capiov = io.cap;
	return rc;
}

int flx_view_batch_flush(flx_view_batch *b)
{
	int rc = b->rc;

	if (!rc && b->n)
		rc = flx_file_read_spans(b->ckpt, b->spans, b->n);
	if (!rc && b->nlocal)
		rc = batch_read_local(b);
	b->n = 0;
	b->nlocal = 0;
	b->rc = 0;
	return rc == -ENOMEM ? rc : rc ? -EIO : 0;
}

void flx_view_batch_release(flx_view_batch *b)
{
	free(b->spans);
	free(b->local);
	free(b->iov);
	memset(b, 0, sizeof(*b));
}

/* The queued runs of r into its batch: the remote ones (k of them) to
 * go to the backend, the others to be read in file order. */
static int batch_add(rdctx *r, size_t k)
{
	flx_view_batch *b = r->batch;
	const flx_ckpt *c = r->v->ckpt;

	if ((b->n || b->nlocal) && b->ckpt != c &&
	    (b->rc = flx_view_batch_flush(b)))
		return b->rc;
	b->ckpt = c;
	if (flx_grow((void **)&b->spans, &b->cap, b->n + k,
		     sizeof(flx_file_span)) ||
	    flx_grow((void **)&b->local, &b->caplocal,
		     b->nlocal + (r->nruns - k), sizeof(flx_file_span)))
		return -ENOMEM;
	for (size_t i = 0; i < r->nruns; i++)
		if (flx_file_is_remote(c, r->runs[i].file))
			b->spans[b->n++] = r->runs[i];
		else
			b->local[b->nlocal++] = r->runs[i];
	if (b->n + b->nlocal >= BATCH_MAX)
		return flx_view_batch_flush(b);
	return 0;
}

/* The queued runs of remote files (flx_file_is_remote()), all in one
 * batch: the backend coalesces them per node and overlaps the nodes. */
static int flush_remote(rdctx *r)
{
	const flx_ckpt *c = r->v->ckpt;
	flx_file_span *sp;
	size_t k = 0;
	int rc;

	for (size_t i = 0; i < r->nruns; i++)
		k += flx_file_is_remote(c, r->runs[i].file);
	if (!k)
		return 0;
	sp = malloc(k * sizeof(*sp));
	if (!sp)
		return -ENOMEM;
	k = 0;
	for (size_t i = 0; i < r->nruns; i++)
		if (flx_file_is_remote(c, r->runs[i].file))
			sp[k++] = r->runs[i];
	rc = flx_file_read_spans(c, sp, k);
	if (r->stats) {
		r->stats->preads++;
		for (size_t i = 0; i < k; i++)
			r->stats->bytes_read += sp[i].len;
	}
	free(sp);
	return rc == -ENOMEM ? rc : rc ? -EIO : 0;
}

/*
 * Execute the queued runs: at once, or, with a batch, into it (every
 * run, local or remote: the view reads of one request then share their
 * file checks and their clustered reads, one preadv for the small tensors
 * one after the other in a file rather than a pread each).
 */
static int flush(rdctx *r)
{
	const flx_ckpt *c = r->v->ckpt;
	iolist io = {r->iov, r->capiov};
	size_t i = 0;
	int rc = 0;

	if (r->batch && r->nruns) {
		size_t k = 0;

		for (size_t j = 0; j < r->nruns; j++)
			k += flx_file_is_remote(c, r->runs[j].file);
		rc = batch_add(r, k);
		r->nruns = 0;
		return rc;
	}
	sort_runs(r->runs, r->nruns);
	rc = flush_remote(r);
	while (i < r->nruns && !rc) {
		size_t j = i + 1;

		if (flx_file_is_remote(c, r->runs[i].file)) {
			i++;
			continue;
		}
		while (j < r->nruns && r->runs[j].file == r->runs[i].file)
			j++;
		rc = check_file(r, r->runs[i].file);
		if (!rc)
			rc = read_file_runs(c, r->runs + i, j - i, &io,
					    r->stats);
		i = j;
	}
	r->iov = io.iov;
	r->capiov = io.cap;
	r->nruns = 0;
	return rc;
}

/* Queue a contiguous run, merging it with the previous one when it
 * continues it in both the file and the buffer. */
static int emit(rdctx *r, uint32_t file, uint64_t src, size_t dst, size_t len)
{
	pending *last = r->nruns ? &r->runs[r->nruns - 1] : NULL;
	unsigned char *to = r->buf + dst;
	int rc;

	if (last && last->file == file && last->off + last->len == src &&
	    (unsigned char *)last->buf + last->len == to) {
		last->len += len;
		return 0;
	}
	if (r->nruns == MAX_RUNS && (rc = flush(r)))
		return rc;
	if (flx_grow((void **)&r->runs, &r->capruns, r->nruns + 1,
		     sizeof(pending)))
		return -ENOMEM;
	r->runs[r->nruns++] = (pending){file, src, to, len};
	return 0;
}

static bool piece_holds(const flx_view *v, const pref *p, const int64_t *g)
{
	for (int d = 0; d < v->ndim; d++)
		if (g[d] < p->off[d] || g[d] >= p->off[d] + p->size[d])
			return false;
	return true;
}

/* The piece holding global element g, hint tried first; ch NULL: none. */
static pref find_piece(const flx_view *v, const pref *hint, const int64_t *g)
{
	int64_t ones[FLX_MAX_DIMS];
	uint32_t idx;
	pref p = {0};

	if (hint->ch && piece_holds(v, hint, g))
		return *hint;
	if (!v->pix) {
		for (size_t i = 0; i < v->npieces; i++) {
			p = piece_get(v, i);
			if (piece_holds(v, &p, g))
				return p;
		}
		return (pref){0};
	}
	for (int d = 0; d < v->ndim; d++)
		ones[d] = 1;
	if (bix_find(v->pix, g, ones, &idx))
		return p;
	return v->whole ? chunk_piece(v, idx) : piece_get(v, idx);
}

/* Elements from g onwards (C order of the box) that stay inside piece p
 * and contiguous in its chunk's storage; see the comment at the top. */
static uint64_t run_elems(const flx_view *v, const pref *p, const int64_t *g)
{
	const flx_chunk *ch = p->ch;
	const flx_box *bx = v->box;
	int D = v->ndim;
	const int64_t *boff = p->off, *bsize = p->size;
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
static uint64_t src_offset(const flx_view *v, const pref *p, const int64_t *g)
{
	const flx_chunk *ch = p->ch;
	int64_t e = ch->storage_offset;

	for (int d = 0; d < v->ndim; d++)
		e += (g[d] - ch->off[d]) * ch->stride[d];
	return ch->data_off + (uint64_t)e * v->esz;
}

static void unravel(const flx_view *v, uint64_t e, int64_t *g)
{
	for (int d = v->ndim - 1; d >= 0; d--) {
		uint64_t sz = (uint64_t)v->box->size[d];

		g[d] = v->box->off[d] + (int64_t)(e % sz);
		e /= sz;
	}
}

/*
 * Walking view bytes [off, end) run by run, the one walk of every read
 * path (read_stored(), flx_view_ranges(), flx_view_zrun()): a run is the
 * bytes [pos, stop) from element e on that stay inside one piece and
 * contiguous in its chunk's storage (run_elems()), or, when the chunk's
 * innermost axis is strided, the piece's elements to the end of its row
 * (the caller gathers them).
 */
typedef struct cursor {
	const flx_view *v;
	pref p; /* the piece holding pos (the next one's hint) */
	int64_t g[FLX_MAX_DIMS]; /* global coordinates of element e */
	uint64_t e;		 /* the element holding pos */
	uint64_t pos, stop, end; /* the run [pos, stop); stop <= end */
	uint64_t src;		 /* file (zstd: content) offset of element e */
	bool strided;		 /* innermost axis strided: gather */
	bool zstd;		 /* src is in the chunk's zstd content */
} cursor;

/* Start k before view bytes [off, end) (off < end <= v->bytes). */
static void cursor_init(cursor *k, const flx_view *v, uint64_t off,
			uint64_t end)
{
	k->v = v;
	k->p = (pref){0};
	k->pos = k->stop = off;
	k->end = end;
}

/* Move k to its next run.  @return 1 on it, 0 at end, -EIO when no piece
 * holds its first element (the pieces tile the box: a bug). */
static int cursor_next(cursor *k)
{
	const flx_view *v = k->v;

	if (k->stop >= k->end)
		return 0;
	k->pos = k->stop;
	k->e = k->pos / v->esz;
	unravel(v, k->e, k->g);
	k->p = find_piece(v, &k->p, k->g);
	if (!k->p.ch)
		return -EIO;
	k->stop = (k->e + run_elems(v, &k->p, k->g)) * v->esz;
	if (k->stop > k->end)
		k->stop = k->end;
	k->src = src_offset(v, &k->p, k->g);
	k->strided = v->ndim > 0 && k->p.ch->contig_from >= v->ndim;
	k->zstd = k->p.ch->zstd;
	return 1;
}

/*
 * Strided gathers.  The strided runs of a call are queued, then handed to
 * the mount's slicer as one batch (gpu/slice.h) with the blocks their
 * elements start in, each listed once in file order: a block is fetched
 * once per batch (from the shared cache, which also keeps it for the next
 * requests, or read for this call alone) however many runs need it.
 */
#define MAX_SRUNS 4096	/* strided runs queued before they are executed */
#define MAX_SPANS 65536 /* block spans a batch may list (memory bound) */

static int block_get(rdctx *r, uint32_t file, uint64_t blk, flx_bref *b)
{
	const flx_file *f = &r->v->ckpt->files[file];
	uint64_t start = blk * r->block;
	size_t want;
	int rc;

	if (r->cache && !flx_file_is_remote(r->v->ckpt, file)) {
		int fd;

		if (flx_file_acquire(r->v->ckpt, file, &fd))
			return -EIO;
		rc = flx_bcache_get(r->cache, file, fd, f->size, blk, b);
		flx_file_release(r->v->ckpt, file);
		if (rc == 0 && b->loaded && r->stats) {
			r->stats->preads++;
			r->stats->bytes_read += b->len;
		}
		if (rc != -EAGAIN)
			return rc == -EINVAL ? -EIO : rc;
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

/* The batch's get(): block k of the batch being executed, after its file
 * is checked unchanged. */
static int batch_get(void *ctx, size_t k, const unsigned char **data)
{
	rdctx *r = ctx;
	const flx_slice_block *b = &r->blocks[k];
	int rc = check_file(r, b->file);

	if (!rc)
		rc = block_get(r, b->file, b->start / r->block, &r->held);
	if (!rc && r->held.len != b->len) {
		block_put(r, &r->held);
		rc = -EIO;
	}
	if (!rc)
		*data = r->held.data;
	return rc;
}

static void batch_put(void *ctx, size_t k)
{
	rdctx *r = ctx;

	(void)k;
	block_put(r, &r->held);
}

/* Elements of run u (whole, partial ones included). */
static uint64_t run_count(const rdctx *r, const flx_slice_run *u)
{
	unsigned esz = r->v->esz;

	if (r->cast) /* whole converted elements */
		return u->len / r->cast->to.size;
	return (u->skip + u->len + esz - 1) / esz;
}

/* Bytes of buf that n bytes of whole source elements fill (a cast read
 * converts them). */
static uint64_t out_bytes(const rdctx *r, uint64_t n)
{
	return r->cast ? n / r->v->esz * r->cast->to.size : n;
}

/* Spans of blocks run u adds to a batch's list: one when its elements lie
 * less than a block apart (every block between its first and last element
 * then holds one), else one per element. */
static uint64_t run_spans(const rdctx *r, const flx_slice_run *u)
{
	return u->stride < r->block ? 1 : run_count(r, u);
}

static int add_span(rdctx *r, uint32_t file, uint64_t lo, uint64_t hi,
		    size_t *n)
{
	if (flx_grow((void **)&r->spans, &r->capspans, *n + 1, sizeof(span)))
		return -ENOMEM;
	r->spans[(*n)++] = (span){file, lo, hi};
	return 0;
}

static int cmp_span(const void *a, const void *b)
{
	const span *x = a, *y = b;

	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The blocks the queued runs' elements start in, sorted and each once.
 * @return 0 and *n, -EIO (a block past the end of its file), -ENOMEM. */
static int list_blocks(rdctx *r, size_t *n)
{
	size_t ns = 0, nb = 0;
	int rc = 0;

	for (size_t i = 0; i < r->nsruns && !rc; i++) {
		const flx_slice_run *u = &r->sruns[i];
		uint64_t c = run_count(r, u);

		if (u->stride < r->block)
			rc = add_span(r, u->file, u->src / r->block,
				      (u->src + (c - 1) * u->stride) / r->block,
				      &ns);
		for (uint64_t e = 0; u->stride >= r->block && e < c && !rc;
		     e++) {
			uint64_t blk = (u->src + e * u->stride) / r->block;

			rc = add_span(r, u->file, blk, blk, &ns);
		}
	}
	if (rc)
		return rc;
	qsort(r->spans, ns, sizeof(span), cmp_span);
	for (size_t i = 0, j; i < ns; i = j) {
		const flx_file *f = &r->v->ckpt->files[r->spans[i].file];
		uint64_t hi = r->spans[i].hi;

		for (j = i + 1;
		     j < ns && r->spans[j].file == r->spans[i].file &&
		     r->spans[j].lo <= hi + 1;
		     j++)
			if (r->spans[j].hi > hi)
				hi = r->spans[j].hi;
		for (uint64_t blk = r->spans[i].lo; blk <= hi; blk++) {
			size_t len =
			    flx_bcache_block_len(r->block, f->size, blk);

			if (!len)
				return -EIO;
			if (flx_grow((void **)&r->blocks, &r->capblocks, nb + 1,
				     sizeof(flx_slice_block)))
				return -ENOMEM;
			r->blocks[nb++] = (flx_slice_block){blk * r->block, len,
							    r->spans[i].file};
		}
	}
	*n = nb;
	return 0;
}

/* By file, then by destination (the slicer finds rows among neighbours). */
static int cmp_srun_file(const void *a, const void *b)
{
	const flx_slice_run *x = a, *y = b;

	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

static int gather_flush(rdctx *r)
{
	flx_slice_batch b = {.elem_size = r->v->esz,
			     .dst = r->buf,
			     .dst_len = r->len,
			     .runs = r->sruns,
			     .nruns = r->nsruns,
			     .block = r->block,
			     .cast = r->cast,
			     .origin = r->v->ckpt->uid,
			     .get = batch_get,
			     .put = batch_put,
			     .ctx = r};
	int rc;

	if (!r->nsruns)
		return 0;
	if (r->nsruns > 1)
		qsort(r->sruns, r->nsruns, sizeof(flx_slice_run),
		      cmp_srun_file);
	rc = list_blocks(r, &b.nblocks);
	b.blocks = r->blocks;
	if (!rc)
		rc = flx_slicer_run(r->slicer, &b);
	r->nsruns = 0;
	r->nspans = 0;
	return rc;
}

/*
 * Queue the strided run of view bytes [lo, hi): the element holding byte
 * lo starts at view byte ebase and file offset src, the next ones sstride
 * bytes further on.  A run of elements a block or more apart lists a block
 * per element: it is queued in parts of at most MAX_SPANS elements, and a
 * batch is executed before its list outgrows MAX_SPANS spans.
 */
static int gather(rdctx *r, uint32_t file, uint64_t src, uint64_t sstride,
		  uint64_t ebase, uint64_t lo, uint64_t hi)
{
	unsigned esz = r->v->esz;

	while (lo < hi) {
		uint64_t cut = ebase + (uint64_t)MAX_SPANS * esz;
		uint64_t take =
		    sstride >= r->block && hi > cut ? cut - lo : hi - lo;
		flx_slice_run u = {.src = src,
				   .stride = sstride,
				   .skip = lo - ebase,
				   .dst = (size_t)out_bytes(r, lo - r->off),
				   .len = (size_t)out_bytes(r, take),
				   .file = file};
		int rc;

		if ((r->nsruns == MAX_SRUNS ||
		     r->nspans + run_spans(r, &u) > MAX_SPANS) &&
		    (rc = gather_flush(r)))
			return rc;
		if (flx_grow((void **)&r->sruns, &r->capsruns, r->nsruns + 1,
			     sizeof(flx_slice_run)))
			return -ENOMEM;
		r->sruns[r->nsruns++] = u;
		r->nspans += run_spans(r, &u);
		lo += take;
		if (lo < hi) { /* the next part starts on an element */
			src += (uint64_t)MAX_SPANS * sstride;
			ebase = cut;
		}
	}
	return 0;
}

/* The run of cursor k, from a zstd chunk: the chunk's content through
 * the mount's window cache (zcache.h), strided or not. */
static int zstd_run(rdctx *r, const cursor *k)
{
	const flx_view *v = r->v;
	const flx_chunk *ch = k->p.ch;
	const flx_zitem it = {ch->file, ch->item_off, ch->item_len};
	uint64_t stride =
	    k->strided ? (uint64_t)ch->stride[v->ndim - 1] * v->esz : v->esz;

	return flx_zcache_read(r->zcache, v->ckpt, &it, k->src, stride, v->esz,
			       k->pos - k->e * v->esz,
			       r->buf + (k->pos - r->off),
			       (size_t)(k->stop - k->pos));
}

uint64_t flx_ckpt_gather_span(const flx_ckpt *ckpt, const flx_tensor **which)
{
	uint64_t best = 0;

	if (which)
		*which = NULL;
	for (size_t i = 0; i < ckpt->ntensors; i++) {
		const flx_tensor *t = &ckpt->tensors[i];
		uint64_t esz = flx_dtype_size(flx_tensor_stored(t));

		for (uint32_t c = 0; c < t->nchunks && t->ndim; c++) {
			const flx_chunk *ch = &t->chunks[c];
			uint64_t reach; /* storage elements it reaches */

			if (ch->contig_from < t->ndim ||
			    ch->zstd || /* gathered from its content */
			    flx_strided_span(t->ndim, ch->size, ch->stride,
					     &reach) != 0 ||
			    reach == 0)
				continue;
			if (reach * esz > best) {
				best = reach * esz;
				if (which)
					*which = t;
			}
		}
	}
	return best;
}

/* Bytes [off, off+n) of the elements as the chunks hold them; with cast
 * (whole elements, no zstd chunk), converted into buf by the slicer as
 * it gathers every run, contiguous ones too. */
static ssize_t read_stored(const flx_view *v, const flx_view_io *io,
			   flx_view_batch *batch, void *buf, size_t n,
			   uint64_t off, flx_read_stats *stats,
			   const flx_ecast *cast)
{
	flx_bcache *cache = io ? io->cache : NULL;
	rdctx r = {.v = v,
		   .batch = batch,
		   .buf = buf,
		   .off = off,
		   .stats = stats,
		   .cache = cache,
		   .slicer = io ? io->slicer : NULL,
		   .zcache = io ? io->zcache : NULL,
		   .block = cache ? flx_bcache_block(cache) : FLX_BCACHE_BLOCK,
		   .cast = cast};
	cursor k;
	int rc = 0;

	if (off >= v->bytes || n == 0)
		return 0;
	if (n > v->bytes - off)
		n = (size_t)(v->bytes - off);
	r.len = (size_t)out_bytes(&r, n);
	for (cursor_init(&k, v, off, off + n); (rc = cursor_next(&k)) > 0;) {
		const flx_chunk *ch = k.p.ch;

		if (k.zstd)
			rc = cast ? -EIO : zstd_run(&r, &k);
		else if (cast && !k.strided)
			rc = gather(&r, ch->file, k.src, v->esz, k.e * v->esz,
				    k.pos, k.stop);
		else if (!k.strided)
			rc = emit(&r, ch->file, k.src + k.pos % v->esz,
				  (size_t)(k.pos - off),
				  (size_t)(k.stop - k.pos));
		else
			rc = gather(&r, ch->file, k.src,
				    (uint64_t)ch->stride[v->ndim - 1] * v->esz,
				    k.e * v->esz, k.pos, k.stop);
		if (rc)
			break;
	}
	if (!rc)
		rc = flush(&r);
	if (!rc)
		rc = gather_flush(&r);
	free(r.sruns);
	free(r.spans);
	free(r.blocks);
	free(r.win);
	free(r.iov);
	free(r.runs);
	return rc ? rc : (ssize_t)n;
}

/* A cast tensor's view reads its stored elements, then converts; or,
 * with a slicer that converts as it gathers, has it do both (c). */
typedef struct stored_src {
	const flx_view *v;
	const flx_view_io *io;
	flx_read_stats *stats;
	flx_ecast c;
} stored_src;

static int read_stored_all(void *arg, void *buf, size_t n, uint64_t off)
{
	const stored_src *s = arg;
	ssize_t got =
	    read_stored(s->v, s->io, NULL, buf, n, off, s->stats, NULL);

	return got < 0 ? (int)got : (size_t)got == n ? 0 : -EIO;
}

static int read_converted(void *arg, void *conv, size_t k, uint64_t e)
{
	const stored_src *s = arg;
	size_t n = k * s->v->esz;
	ssize_t got = read_stored(s->v, s->io, NULL, conv, n, e * s->v->esz,
				  s->stats, &s->c);

	return got < 0 ? (int)got : (size_t)got == n ? 0 : -EIO;
}

/* Whether a cast view's reads go to its slicer with the cast: a slicer
 * that converts as it gathers (a device), no zstd chunk (its content
 * comes through the window cache, not in blocks of the file) and no
 * remote file (its contiguous runs are read as they are asked for, not in
 * whole blocks). */
static bool cast_in_slicer(const flx_view *v, const flx_view_io *io)
{
	if (!io || !flx_slicer_casts(io->slicer))
		return false;
	for (uint32_t c = 0; c < v->t->nchunks; c++)
		if (v->t->chunks[c].zstd ||
		    flx_file_is_remote(v->ckpt, v->t->chunks[c].file))
			return false;
	return true;
}

ssize_t flx_view_read_io(const flx_view *v, const flx_view_io *io, void *buf,
			 size_t n, uint64_t off, flx_read_stats *stats)
{
	return flx_view_read_batch(v, io, NULL, buf, n, off, stats);
}

ssize_t flx_view_read_batch(const flx_view *v, const flx_view_io *io,
			    flx_view_batch *batch, void *buf, size_t n,
			    uint64_t off, flx_read_stats *stats)
{
	stored_src s = {v, io, stats, {{0}, {0}, 0}};
	uint64_t bytes;
	int rc;

	if (!v->t->stored)
		return read_stored(v, io, batch, buf, n, off, stats, NULL);
	bytes = flx_view_bytes(v);
	if (off >= bytes || n == 0)
		return 0;
	if (n > bytes - off)
		n = (size_t)(bytes - off);
	if (cast_in_slicer(v, io) &&
	    flx_cast_desc(v->t->stored, v->t->dtype, &s.c) == 0)
		rc = flx_cast_read_conv(v->t->dtype, v->t->stored,
					read_converted, &s, buf, n, off);
	else
		rc = flx_cast_read(v->t->dtype, v->t->stored, read_stored_all,
				   &s, buf, n, off);
	return rc ? rc : (ssize_t)n;
}

ssize_t flx_view_read(const flx_view *v, void *buf, size_t n, uint64_t off,
		      flx_read_stats *stats)
{
	return flx_view_read_io(v, NULL, buf, n, off, stats);
}

int flx_view_runs(const flx_view *v, uint64_t off, size_t n, flx_range *out,
		  size_t max, size_t *nout)
{
	cursor c;
	size_t k = 0;
	int rc;

	*nout = 0;
	if (n == 0 || off >= v->bytes || n > v->bytes - off || max == 0 ||
	    v->t->stored) /* a cast: converted bytes, not the file's */
		return 0;
	for (cursor_init(&c, v, off, off + n); (rc = cursor_next(&c)) > 0;) {
		uint64_t src = c.src + c.pos % v->esz;
		uint32_t file = c.p.ch->file;

		if (c.strided || c.zstd) /* not the file's bytes in order */
			return 0;
		if (k && out[k - 1].file == file &&
		    out[k - 1].src + out[k - 1].len == src) {
			out[k - 1].len += c.stop - c.pos;
		} else {
			if (k == max)
				return 0;
			out[k++] = (flx_range){file, src, c.stop - c.pos};
		}
	}
	if (!rc)
		*nout = k;
	return 0;
}

int flx_view_ranges(const flx_view *v, uint64_t off, size_t n, flx_range *out,
		    size_t max, size_t *nout)
{
	size_t k;

	flx_view_runs(v, off, n, out, max, &k);
	for (size_t i = 0; i < k; i++)
		if (flx_file_verify(v->ckpt, &v->ckpt->files[out[i].file],
				    false))
			return -EIO;
	*nout = k;
	return 0;
}

int flx_view_zrun(const flx_view *v, uint64_t off, size_t n, flx_zitem *it,
		  uint64_t *a, bool *found)
{
	const flx_chunk *ch = NULL;
	uint64_t next = 0;
	cursor k;
	int rc;

	*found = false;
	if (n == 0 || off >= v->bytes || n > v->bytes - off || v->t->stored)
		return 0; /* a cast: converted bytes, not the content's */
	for (cursor_init(&k, v, off, off + n); (rc = cursor_next(&k)) > 0;) {
		uint64_t src = k.src + k.pos % v->esz;

		if (!k.zstd || (ch && k.p.ch != ch) || k.strided)
			return 0;
		if (ch && src != next)
			return 0; /* the next run is elsewhere in the content */
		if (!ch)
			*a = src;
		ch = k.p.ch;
		next = src + (k.stop - k.pos);
	}
	if (rc)
		return 0;
	*it = (flx_zitem){ch->file, ch->item_off, ch->item_len};
	*found = true;
	return 0;
}
