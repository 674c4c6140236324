/* SPDX-License-Identifier: MIT */
/*
 * Read engine and placement against a formula oracle: a synthetic checkpoint
 * whose element at global index (i, j, k) holds a value computed from the
 * index, stored as chunks with different layouts (row-major, transposed,
 * with a storage offset, split across files).  Every view must read back the
 * formula for every byte range, and contiguous shards must cost one pread.
 */
#include "check.h"
#include "ckpt.h"
#include "plan.h"
#include "spec.h"
#include "tree.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int32_t value(const int64_t *g)
{
	return (int32_t)(g[0] * 1000000 + g[1] * 1000 + g[2] + 7);
}

typedef struct spec3 {
	int64_t off[3], size[3];
	int order[3]; /* storage dimension order, outermost first */
	int64_t storage_offset;
	int file;
} spec3;

/* Write one chunk: element (a,b,c) of the chunk at storage position
 * storage_offset + sum(idx * stride), strides from the chosen order. */
static void write_chunk(int fd, uint64_t at, const spec3 *s, flx_chunk *ch)
{
	int64_t stride[3], n = 1;
	int64_t total =
	    s->size[0] * s->size[1] * s->size[2] + s->storage_offset;
	int32_t *buf = calloc((size_t)total + 1, sizeof(int32_t));

	for (int k = 2; k >= 0; k--) {
		stride[s->order[k]] = n;
		n *= s->size[s->order[k]];
	}
	for (int64_t a = 0; a < s->size[0]; a++)
		for (int64_t b = 0; b < s->size[1]; b++)
			for (int64_t c = 0; c < s->size[2]; c++) {
				int64_t g[3] = {s->off[0] + a, s->off[1] + b,
						s->off[2] + c};
				buf[s->storage_offset + a * stride[0] +
				    b * stride[1] + c * stride[2]] = value(g);
			}
	CHECK(pwrite(fd, buf, (size_t)total * 4, (off_t)at) == total * 4);
	free(buf);
	memcpy(ch->off, s->off, sizeof(s->off));
	memcpy(ch->size, s->size, sizeof(s->size));
	memcpy(ch->stride, stride, sizeof(stride));
	ch->contig_from = flx_chunk_contig_from(3, ch);
	ch->storage_offset = s->storage_offset;
	ch->data_off = at;
}

/* A 7 x 10 x 3 int32 tensor in 5 chunks over 2 files:
 *   rows 0-2, cols 0-3   row-major                     file 0
 *   rows 0-2, cols 4-9   transposed storage (k,j,i)    file 0
 *   rows 3-6, cols 0-5   row-major, storage offset 5   file 1
 *   rows 3-6, cols 6-8   row-major                     file 1
 *   rows 3-6, col 9      (j,i,k) order                 file 1 */
static const spec3 five[5] = {
    {{0, 0, 0}, {3, 4, 3}, {0, 1, 2}, 0, 0},
    {{0, 4, 0}, {3, 6, 3}, {2, 1, 0}, 0, 0},
    {{3, 0, 0}, {4, 6, 3}, {0, 1, 2}, 5, 1},
    {{3, 6, 0}, {4, 3, 3}, {0, 1, 2}, 0, 1},
    {{3, 9, 0}, {4, 1, 3}, {1, 0, 2}, 0, 1},
};

/* The same tensor in 35 chunks (one row by two columns each, storage
 * orders and files varying): views meet many pieces, and the chunks and
 * pieces are searched through their sorted index rather than scanned. */
static spec3 many[35];

static void make_many(void)
{
	static const int orders[3][3] = {{0, 1, 2}, {2, 1, 0}, {1, 0, 2}};

	for (int i = 0; i < 35; i++) {
		spec3 *s = &many[i];

		s->off[0] = i / 5;
		s->off[1] = 2 * (i % 5);
		s->off[2] = 0;
		s->size[0] = 1;
		s->size[1] = 2;
		s->size[2] = 3;
		memcpy(s->order, orders[i % 3], sizeof(s->order));
		s->storage_offset = i % 4;
		s->file = i % 2;
	}
}

static const int64_t shape_7x10x3[3] = {7, 10, 3};

/* where make_ckpt() writes the first chunk of each file */
static uint64_t first_at[2] = {16, 40};

static flx_ckpt *make_ckpt(const char *dir, const spec3 *specs, int nspecs,
			   const int64_t *shape)
{
	flx_ckpt *c = calloc(1, sizeof(*c));
	flx_tensor *t;
	uint64_t at[2] = {first_at[0], first_at[1]};

	c->dir = strdup(dir);
	c->format = strdup("test");
	c->writer = strdup("test");
	c->nfiles = 2;
	c->files = calloc(2, sizeof(flx_file));
	for (int f = 0; f < 2; f++) {
		char path[512];

		snprintf(path, sizeof(path), "%s/f%d", dir, f);
		c->files[f].relpath = strdup(path);
		c->files[f].fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
		c->files[f].data = true;
		CHECK(c->files[f].fd >= 0);
	}
	c->ntensors = 1;
	c->tensors = calloc(1, sizeof(flx_tensor));
	t = &c->tensors[0];
	t->fqn = strdup("layers.0.w");
	t->dtype = FLX_DT_I32;
	t->ndim = 3;
	memcpy(t->shape, shape, 3 * sizeof(int64_t));
	t->nchunks = (uint32_t)nspecs;
	CHECK(flx_tensor_alloc_chunks(t, (uint32_t)nspecs) == 0);
	for (int i = 0; i < nspecs; i++) {
		const spec3 *s = &specs[i];
		flx_chunk *ch = &t->chunks[i];

		ch->file = (uint32_t)s->file;
		write_chunk(c->files[s->file].fd, at[s->file], s, ch);
		at[s->file] += (uint64_t)(s->size[0] * s->size[1] * s->size[2] +
					  s->storage_offset) *
				   4 +
			       12;
	}
	/* record identity as flx_ckpt_open does: reads check it */
	for (int f = 0; f < 2; f++) {
		struct stat st;

		CHECK(fstat(c->files[f].fd, &st) == 0);
		flx_file_identity(&c->files[f], &st);
	}
	c->by_name = calloc(1, sizeof(flx_tensor *));
	c->by_name[0] = t;
	return c;
}

/* Expected bytes of a box in C order. */
static unsigned char *expected(const flx_box *b, size_t *len)
{
	size_t n = (size_t)(b->size[0] * b->size[1] * b->size[2]);
	int32_t *v = malloc(n * 4 + 1);
	size_t k = 0;

	for (int64_t i = 0; i < b->size[0]; i++)
		for (int64_t j = 0; j < b->size[1]; j++)
			for (int64_t l = 0; l < b->size[2]; l++) {
				int64_t g[3] = {b->off[0] + i, b->off[1] + j,
						b->off[2] + l};
				v[k++] = value(g);
			}
	*len = n * 4;
	return (unsigned char *)v;
}

/* the block cache check_box() reads through (NULL: none) */
static flx_bcache *cache_now;

/* flx_view_read_io() through cache (NULL: none) and the mount's slicer */
static ssize_t read_cached(const flx_view *v, flx_bcache *cache, void *buf,
			   size_t n, uint64_t off, flx_read_stats *stats)
{
	flx_view_io io = {cache, flx_slicer_default(), NULL};

	return flx_view_read_io(v, &io, buf, n, off, stats);
}

/* flx_view_ranges(), its count folded into the result for the checks:
 * the number of ranges, 0 (none describe the bytes), or -errno */
static int ranges(const flx_view *v, uint64_t off, size_t n, flx_range *out,
		  size_t max)
{
	size_t k;
	int rc = flx_view_ranges(v, off, n, out, max, &k);

	return rc ? rc : (int)k;
}

static size_t mapped;	    /* ranges flx_view_ranges described */
static size_t mapped_multi; /* ... with more than one backing range */

static void check_box(const flx_ckpt *c, const flx_box *box)
{
	flx_view *v = NULL;
	flx_error err;
	size_t len;
	unsigned char *want = expected(box, &len), *got;
	int rc;

	flx_error_init(&err);
	rc = flx_view_new(c, &c->tensors[0], box, &v, &err);
	CHECK_EQ(rc, 0);
	if (rc) {
		free(want);
		return;
	}
	CHECK_EQ(flx_view_bytes(v), len);
	got = malloc(len + 8);
	/* whole view, then every (start, length) with a few lengths,
	 * including starts and ends in the middle of elements */
	CHECK_EQ(read_cached(v, cache_now, got, len + 8, 0, NULL),
		 (ssize_t)len);
	CHECK(memcmp(got, want, len) == 0);
	for (size_t s = 0; s < len; s += (len > 400 ? 37 : 1)) {
		static const size_t lens[] = {1, 3, 4, 5, 13, 64, 1000};

		for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
			size_t want_n = len - s < lens[li] ? len - s : lens[li];
			ssize_t r;

			memset(got, 0xAB, want_n);
			r = read_cached(v, cache_now, got, lens[li], s, NULL);
			CHECK_EQ(r, (ssize_t)want_n);
			if (memcmp(got, want + s, want_n) != 0) {
				fprintf(stderr,
					"mismatch box off %lld,%lld "
					"size %lld,%lld at %zu+%zu\n",
					(long long)box->off[0],
					(long long)box->off[1],
					(long long)box->size[0],
					(long long)box->size[1], s, want_n);
				check_failures++;
				s = len;
				break;
			}
		}
	}
	CHECK_EQ(read_cached(v, cache_now, got, 4, len, NULL), 0);
	/* the backing ranges flx_view_ranges gives must hold exactly those
	 * bytes, in order; with room for one range it answers 1 or 0 */
	for (size_t s = 0; s < len; s += 3) {
		for (size_t n = 1; s + n <= len; n = n * 2 + 1) {
			flx_range r[4], one;
			int mr = ranges(v, s, n, r, 4);
			size_t at = 0;

			CHECK(mr >= 0 && mr <= 4);
			if (mr <= 0)
				continue;
			mapped++;
			mapped_multi += mr > 1;
			CHECK_EQ(ranges(v, s, n, &one, 1), mr == 1 ? 1 : 0);
			for (int i = 0; i < mr; i++) {
				CHECK(r[i].len > 0 && at + r[i].len <= n);
				if (i && r[i].file == r[i - 1].file)
					CHECK(r[i].src !=
					      r[i - 1].src + r[i - 1].len);
				CHECK(pread(c->files[r[i].file].fd, got + at,
					    r[i].len, (off_t)r[i].src) ==
				      (ssize_t)r[i].len);
				at += r[i].len;
			}
			CHECK_EQ(at, n);
			if (memcmp(got, want + s, n) != 0) {
				fprintf(stderr, "ranges mismatch at %zu+%zu\n",
					s, n);
				check_failures++;
			}
		}
	}
	free(got);
	free(want);
	flx_view_free(v);
}

static void test_boxes(const flx_ckpt *c)
{
	const flx_tensor *t = &c->tensors[0];

	/* every torch.chunk split along every axis for tp 1..5 */
	for (int axis = 0; axis < 3; axis++)
		for (int tp = 1; tp <= 5; tp++) {
			int64_t n = t->shape[axis], ch = (n + tp - 1) / tp;

			for (int r = 0; r < tp; r++) {
				flx_box b;

				for (int d = 0; d < 3; d++) {
					b.off[d] = 0;
					b.size[d] = t->shape[d];
				}
				b.off[axis] = r * ch < n ? r * ch : n;
				b.size[axis] =
				    (r + 1) * ch < n ? ch : n - b.off[axis];
				if (b.size[axis] < 0)
					b.size[axis] = 0;
				check_box(c, &b);
			}
		}
	/* a box straddling all five chunks */
	{
		flx_box b = {{1, 2, 1}, {5, 8, 2}};

		check_box(c, &b);
	}
}

/* Every byte of a view, read whole, against the formula. */
static void check_view_bytes(const flx_view *v)
{
	size_t len;
	unsigned char *want = expected(flx_view_box(v), &len);
	unsigned char *got = malloc(len + 8);

	CHECK_EQ(flx_view_bytes(v), len);
	CHECK_EQ(flx_view_read(v, got, len + 8, 0, NULL), (ssize_t)len);
	CHECK(memcmp(got, want, len) == 0);
	free(got);
	free(want);
}

/* A plan of c at tp ranks with every tensor split on axis (spec in *s,
 * released by the caller); NULL if the build failed (counted). */
static flx_plan *plan_split(const flx_ckpt *c, flx_spec *s, int tp, int axis)
{
	char rules[64];
	flx_plan *p = NULL;

	flx_spec_init(s);
	s->tp = tp;
	snprintf(rules, sizeof(rules), "[{\"match\": \"*\", \"split\": %d}]",
		 axis);
	CHECK_EQ(flx_spec_rules_parse(s, rules, strlen(rules), "r.json", NULL),
		 0);
	CHECK_EQ(flx_plan_build(c, s, &p, NULL), 0);
	return p;
}

/* The plan's own views (held in its arena, boxes shared between views):
 * torch.chunk boxes along every axis, and the whole tensor for hf/. */
static void test_plan_views(const flx_ckpt *c)
{
	static const int tps[] = {1, 2, 3, 4, 8};
	const flx_tensor *t = &c->tensors[0];

	for (int axis = 0; axis < 3; axis++)
		for (size_t k = 0; k < sizeof(tps) / sizeof(tps[0]); k++) {
			flx_spec s;
			int tp = tps[k];
			flx_plan *p = plan_split(c, &s, tp, axis);
			int64_t n = t->shape[axis], ch = (n + tp - 1) / tp;

			for (int r = 0; p && r < tp; r++) {
				const flx_box *b =
				    flx_view_box(p->p[0].views[r]);
				int64_t lo = r * ch < n ? r * ch : n;
				int64_t hi = lo + ch < n ? lo + ch : n;

				for (int d = 0; d < 3; d++) {
					CHECK_EQ(b->off[d], d == axis ? lo : 0);
					CHECK_EQ(b->size[d], d == axis
								 ? hi - lo
								 : t->shape[d]);
				}
				check_view_bytes(p->p[0].views[r]);
			}
			if (p) {
				const flx_box *b = flx_view_box(p->p[0].whole);

				for (int d = 0; d < 3; d++) {
					CHECK_EQ(b->off[d], 0);
					CHECK_EQ(b->size[d], t->shape[d]);
				}
				check_view_bytes(p->p[0].whole);
				/* tp=1: rank 0's view is the whole tensor */
				CHECK(tp > 1 ||
				      p->p[0].whole == p->p[0].views[0]);
			}
			flx_plan_free(p);
			flx_spec_release(&s);
		}
}

/* A box equal to one row-major chunk must be a single pread; the whole
 * first-file row-major chunk rows (3 rows x 4 cols x 3) also one. */
static void test_coalescing(const flx_ckpt *c)
{
	flx_box b = {{3, 6, 0}, {4, 3, 3}};
	flx_view *v = NULL;
	flx_read_stats st = {0};
	unsigned char buf[4 * 3 * 3 * 4];

	CHECK_EQ(flx_view_new(c, &c->tensors[0], &b, &v, NULL), 0);
	CHECK_EQ(flx_view_read(v, buf, sizeof(buf), 0, &st),
		 (ssize_t)sizeof(buf));
	CHECK_EQ(st.preads, 1);
	CHECK_EQ(st.bytes_read, sizeof(buf));
	flx_view_free(v);

	/* rows 3-6, cols 0-8: the destination rows interleave two chunks,
	 * but each chunk's rows are adjacent in the file, and the two
	 * chunks lie 12 bytes apart in file 1 (make_ckpt's layout): one
	 * preadv, the 12 bytes read but not delivered */
	flx_box b2 = {{3, 0, 0}, {4, 9, 3}};
	unsigned char buf2[4 * 9 * 3 * 4];

	memset(&st, 0, sizeof(st));
	CHECK_EQ(flx_view_new(c, &c->tensors[0], &b2, &v, NULL), 0);
	CHECK_EQ(flx_view_read(v, buf2, sizeof(buf2), 0, &st),
		 (ssize_t)sizeof(buf2));
	CHECK_EQ(st.bytes_read, sizeof(buf2) + 12);
	CHECK_EQ(st.preads, 1);
	flx_view_free(v);

	/* rows 0-2, cols 1-2 of the first chunk (3 x 4 x 3, row-major):
	 * 24-byte runs 24 bytes apart.  One preadv with the two gaps read
	 * into scratch (72 bytes delivered, 120 read), the bytes right. */
	flx_box b3 = {{0, 1, 0}, {3, 2, 3}};
	unsigned char buf3[3 * 2 * 3 * 4];

	memset(&st, 0, sizeof(st));
	CHECK_EQ(flx_view_new(c, &c->tensors[0], &b3, &v, NULL), 0);
	CHECK_EQ(flx_view_read(v, buf3, sizeof(buf3), 0, &st),
		 (ssize_t)sizeof(buf3));
	CHECK_EQ(st.preads, 1);
	CHECK_EQ(st.bytes_read, 120);
	flx_view_free(v);
	check_box(c, &b3);
}

static void test_read_errors(flx_ckpt *c)
{
	flx_box b = {{0, 0, 0}, {3, 4, 3}};
	flx_view *v = NULL;
	unsigned char buf[256];

	CHECK_EQ(flx_view_new(c, &c->tensors[0], &b, &v, NULL), 0);
	/* a backing file rewritten after mount (same size, new mtime) or
	 * shrinking must give EIO, not other or mixed bytes */
	{
		struct timespec ts[2] = {{0, UTIME_OMIT}, {12345, 0}};

		CHECK_EQ(futimens(c->files[0].fd, ts), 0);
		CHECK_EQ(flx_view_read(v, buf, sizeof(buf), 0, NULL), -EIO);
	}
	CHECK_EQ(ftruncate(c->files[0].fd, 20), 0);
	CHECK_EQ(flx_view_read(v, buf, sizeof(buf), 0, NULL), -EIO);
	flx_view_free(v);
}

static void test_placement(const flx_ckpt *c)
{
	flx_spec s;
	flx_plan *p = NULL;
	flx_error err;
	int rc;

	/* split along axes 0 and 1 in the source: needs a rule */
	flx_spec_init(&s);
	flx_error_init(&err);
	s.tp = 2;
	rc = flx_plan_build(c, &s, &p, &err);
	CHECK_EQ(rc, -EINVAL);
	CHECK_STR(err.key, "layers.0.w");
	CHECK(strstr(err.text, "rule") != NULL);

	static const char rules[] =
	    "[{\"match\": \"layers.*.w\", \"split\": 1, \"stage\": 1}]";
	CHECK_EQ(
	    flx_spec_rules_parse(&s, rules, sizeof(rules) - 1, "r.json", NULL),
	    0);
	flx_error_init(&err);
	rc = flx_plan_build(c, &s, &p, &err);
	CHECK_EQ(rc, -EINVAL); /* stage 1 but pp = 1 */
	CHECK(strstr(err.text, "stage 1") != NULL);

	s.pp = 2;
	s.tp = 3;
	rc = flx_plan_build(c, &s, &p, NULL);
	CHECK_EQ(rc, 0);
	if (!rc) {
		CHECK_EQ(p->p[0].split, 1);
		CHECK_EQ(p->p[0].stage_lo, 1);
		CHECK_EQ(p->p[0].stage_hi, 1);
		/* 10 columns over 3 ranks: 4, 4, 2 */
		CHECK_EQ(flx_view_box(p->p[0].views[0])->size[1], 4);
		CHECK_EQ(flx_view_box(p->p[0].views[1])->off[1], 4);
		CHECK_EQ(flx_view_box(p->p[0].views[2])->size[1], 2);
		CHECK_STR(flx_placement_name(&p->p[0], 1), "layers.0.w");
	}
	/* the tree of a checkpoint without bytes values has an empty
	 * objects/ (and stage 0 holds no tensor): empty directories */
	if (!rc) {
		flx_fs *fs = NULL;
		flx_stat st;
		const char *name;

		CHECK_EQ(flx_fs_build(c, p, &fs, NULL), 0);
		CHECK_EQ(flx_fs_resolve(fs, "objects", &st), 0);
		CHECK(st.dir);
		CHECK_EQ(flx_fs_readdir(fs, st.ino, 0, &name, &st), 0);
		CHECK(name == NULL);
		CHECK_EQ(flx_fs_resolve(fs, "ranks/tp00_pp00/tensors", &st), 0);
		CHECK_EQ(flx_fs_readdir(fs, st.ino, 0, &name, &st), 0);
		CHECK(name == NULL);
		CHECK_EQ(flx_fs_resolve(fs,
					"ranks/tp02_pp01/tensors/"
					"layers.0.w.npy",
					&st),
			 0);
		flx_fs_free(fs);
	}
	flx_plan_free(p);

	/* unknown rule key and bad JSON are refused with the rule named */
	flx_error_init(&err);
	static const char bad[] = "[{\"match\":\"x\",\"splt\":1}]";
	CHECK_EQ(flx_spec_rules_parse(&s, bad, sizeof(bad) - 1, "r.json", &err),
		 -EINVAL);
	CHECK(strstr(err.key, "splt") != NULL);
	flx_error_init(&err);
	CHECK_EQ(flx_spec_rules_parse(&s, "[{", 2, "r.json", &err), -EINVAL);
	CHECK_STR(err.file, "r.json");
	flx_spec_release(&s);
}

static void test_spec_values(void)
{
	flx_spec s;
	flx_error err;
	uint64_t sz;

	flx_spec_init(&s);
	flx_error_init(&err);
	CHECK_EQ(flx_spec_set(&s, "tp", "0", &err), -EINVAL);
	CHECK_STR(err.key, "tp");
	CHECK_EQ(flx_spec_set(&s, "tp", "4x", NULL), -EINVAL);
	CHECK_EQ(flx_spec_set(&s, "pp", "-1", NULL), -EINVAL);
	CHECK_EQ(flx_spec_set(&s, "tp", "8", NULL), 0);
	CHECK_EQ(s.tp, 8);
	CHECK_EQ(flx_spec_set(&s, "bogus", "1", NULL), -ENOENT);
	CHECK_EQ(flx_spec_set(&s, "layer_regex", "layers\\.[0-9]+", NULL),
		 -EINVAL);
	/* regexes whose automaton would explode are refused up front */
	flx_error_init(&err);
	CHECK_EQ(
	    flx_spec_set(&s, "layer_regex", "(^|\\.+++++)h\\.([0-9]+)", &err),
	    -EINVAL);
	CHECK(strstr(err.text, "repetition right after another") != NULL);
	CHECK_EQ(flx_spec_set(&s, "layer_regex", "((x){33})([0-9]+)", NULL),
		 -EINVAL);
	CHECK_EQ(
	    flx_spec_set(&s, "layer_regex", "layers[.]([0-9]{1,})[.]", NULL),
	    0);
	CHECK_EQ(flx_spec_set(&s, "pp_renumber", NULL, NULL), 0);
	CHECK(s.pp_renumber);
	CHECK_EQ(flx_parse_size("5G", &sz), 0);
	CHECK_EQ(sz, 5ull << 30);
	CHECK_EQ(flx_parse_size("512MiB", &sz), 0);
	CHECK_EQ(sz, 512ull << 20);
	CHECK_EQ(flx_parse_size("0", &sz), -EINVAL);
	CHECK_EQ(flx_parse_size("99999999999999999999T", &sz), -EINVAL);
	flx_spec_release(&s);
}

/* ranges of tree files flx_fs_pieces() described: in all, with literal
 * bytes and backing ranges together, with several backing ranges */
static size_t pieced, pieced_mixed, pieced_multi;

/* The pieces of [off, off+n) of ino, when flx_fs_pieces() gives them,
 * must hold exactly what flx_fs_read() returns for that range. */
static void check_pieces(const flx_fs *fs, flx_ino ino, uint64_t off, size_t n,
			 size_t max)
{
	flx_piece pc[FLX_FS_PIECES_MAX];
	unsigned char *lit = malloc(n), *got = malloc(n), *want = malloc(n);
	size_t at = 0, nfd = 0, nlit = 0, k = max + 1;

	CHECK_EQ(flx_fs_pieces(fs, ino, off, n, lit, pc, max, &k), 0);
	CHECK(k <= max);
	CHECK_EQ(flx_fs_read(fs, ino, want, n, off, NULL), (ssize_t)n);
	for (size_t i = 0; i < k && k <= max; i++) {
		CHECK(pc[i].len > 0 && at + pc[i].len <= n);
		if (at + pc[i].len > n)
			break;
		if (pc[i].fd >= 0) {
			CHECK(pread(pc[i].fd, got + at, pc[i].len,
				    (off_t)pc[i].src) == (ssize_t)pc[i].len);
			/* a range continuing the last one is merged into it */
			CHECK(i == 0 || pc[i - 1].fd != pc[i].fd ||
			      pc[i - 1].src + pc[i - 1].len != pc[i].src);
			nfd++;
		} else {
			CHECK(pc[i].mem == lit + at);
			memcpy(got + at, pc[i].mem, pc[i].len);
			nlit++;
		}
		at += pc[i].len;
	}
	if (k > 0 && k <= max && at == n) {
		/* what a reply that cannot send them copies: lit is the
		 * reply's buffer, literal pieces in place already */
		CHECK_EQ(flx_fs_pieces_copy(fs, pc, k, lit), (ssize_t)n);
		CHECK(!memcmp(lit, want, n));
	}
	if (k > 0) {
		pieced++;
		pieced_mixed += nfd && nlit;
		pieced_multi += nfd > 1;
		if (at != n || memcmp(got, want, n)) {
			fprintf(stderr, "pieces of ino %llu %llu+%zu differ\n",
				(unsigned long long)ino,
				(unsigned long long)off, n);
			check_failures++;
		}
	}
	free(lit);
	free(got);
	free(want);
}

/* Every file of the tree, as .npy and safetensors views of several
 * layouts: replies pieced from headers and backing ranges must be the
 * bytes a read gives (fuse_ll.c splices them). */
static void test_tree_pieces(const flx_ckpt *c)
{
	static const size_t lens[] = {1, 7, 64, 300, 1000, 100000};
	static const size_t maxes[] = {1, 2, 4, FLX_FS_PIECES_MAX};

	for (int axis = 0; axis < 3; axis++)
		for (int tp = 1; tp <= 4; tp++) {
			flx_spec s;
			flx_plan *p = plan_split(c, &s, tp, axis);
			flx_fs *fs = NULL;

			if (p)
				CHECK_EQ(flx_fs_build(c, p, &fs, NULL), 0);
			for (flx_ino ino = 1;
			     fs && ino <= flx_fs_inode_count(fs); ino++) {
				flx_stat st;

				if (flx_fs_stat(fs, ino, &st) || st.dir)
					continue;
				for (uint64_t o = 0; o < st.size; o += 5)
					for (size_t l = 0;
					     l < sizeof(lens) / sizeof(lens[0]);
					     l++)
						check_pieces(
						    fs, ino, o,
						    lens[l] < st.size - o
							? lens[l]
							: (size_t)(st.size - o),
						    maxes[(o + l) % 4]);
			}
			flx_fs_free(fs);
			flx_plan_free(p);
			flx_spec_release(&s);
		}
}

/* flx_fs_push_range() against the segments flx_fs_segment() lists: the
 * rest of a view's segment, past skip and at most cap; nothing from other
 * segments or at the end of the file. */
static void check_push_file(const flx_fs *fs, flx_ino ino, uint64_t size)
{
	flx_fs_seg sg;
	uint64_t po, pl;

	for (size_t i = 0; flx_fs_segment(fs, ino, i, &sg) == 0; i++) {
		uint64_t end = sg.off + sg.len;

		if (!sg.len)
			continue;
		CHECK_EQ(flx_fs_push_range(fs, ino, sg.off, 1, 0, UINT64_MAX,
					   &po, &pl),
			 0);
		if (!sg.tensor || end == sg.off + 1 || sg.off + 1 >= size) {
			CHECK_EQ(pl, 0);
			continue;
		}
		CHECK_EQ(po, sg.off + 1);
		CHECK_EQ(pl, end - po);
		CHECK_EQ(flx_fs_push_range(fs, ino, sg.off, 1, 1, 3, &po, &pl),
			 0);
		CHECK(pl == 0 ||
		      (po == sg.off + 2 && pl <= 3 && po + pl <= end));
		/* a read that ends at the segment's end pushes the next one
		 * only if the last byte read is in it: here it is not */
		CHECK_EQ(flx_fs_push_range(fs, ino, sg.off, sg.len, 0,
					   UINT64_MAX, &po, &pl),
			 0);
		CHECK_EQ(pl, 0);
	}
	CHECK_EQ(flx_fs_push_range(fs, ino, 0, size, 0, UINT64_MAX, &po, &pl),
		 0);
	CHECK_EQ(pl, 0);
}

static void test_push_range(const flx_ckpt *c)
{
	flx_spec s;
	flx_plan *p = plan_split(c, &s, 2, 0);
	flx_fs *fs = NULL;
	uint64_t po, pl;
	int views = 0;

	if (p)
		CHECK_EQ(flx_fs_build(c, p, &fs, NULL), 0);
	for (flx_ino ino = 1; fs && ino <= flx_fs_inode_count(fs); ino++) {
		flx_stat st;
		flx_fs_seg sg;

		if (flx_fs_stat(fs, ino, &st))
			continue;
		if (st.dir) {
			CHECK_EQ(
			    flx_fs_push_range(fs, ino, 0, 1, 0, 1, &po, &pl),
			    -EISDIR);
			continue;
		}
		views += flx_fs_segment(fs, ino, 0, &sg) == 0 && sg.tensor;
		check_push_file(fs, ino, st.size);
	}
	CHECK(views > 0);
	if (fs)
		CHECK_EQ(flx_fs_push_range(fs, flx_fs_inode_count(fs) + 1, 0, 1,
					   0, 1, &po, &pl),
			 -ENOENT);
	flx_fs_free(fs);
	flx_plan_free(p);
	flx_spec_release(&s);
}

/* A 256 x 2 x 128 int32 tensor in one chunk stored (k, j, i), like a
 * transposed weight saved as-is: consecutive elements of a view row lie
 * 512 elements (2 KiB) apart in the file, so every row of a read spans the
 * whole 256 KiB chunk and the next row needs the same blocks again. */
static const spec3 tposed[1] = {{{0, 0, 0}, {256, 2, 128}, {2, 1, 0}, 3, 0}};
static const int64_t shape_tposed[3] = {256, 2, 128};

static void remove_files(const char *dir);

static void test_random_layouts(const char *dir);

typedef struct par_arg {
	const flx_view *v;
	flx_bcache *cache;
	const unsigned char *want;
	size_t len;
	unsigned seed;
	int bad;
} par_arg;

static void *par_reader(void *p)
{
	par_arg *a = p;
	unsigned char *got = malloc(40000);

	for (int i = 0; i < 300; i++) {
		size_t off = (size_t)rand_r(&a->seed) % a->len;
		size_t n = 1 + (size_t)rand_r(&a->seed) % 40000;
		ssize_t r;

		if (n > a->len - off)
			n = a->len - off;
		r = read_cached(a->v, a->cache, got, n, off, NULL);
		if (r != (ssize_t)n || memcmp(got, a->want + off, n) != 0)
			a->bad++;
	}
	free(got);
	return NULL;
}

/* Strided gathers visit blocks in file order: without a cache a request
 * reads each block it needs once, and with a cache that holds the chunk
 * the whole view reads each block once.  (Row after row, a 16 KiB request
 * here would read its 65 blocks 32 times.)  Elements straddle block
 * boundaries: the chunk starts 2 bytes into a 4-byte element grid. */
static void test_gather_blocks(const char *dir)
{
	const flx_box whole = {{0, 0, 0}, {256, 2, 128}};
	const size_t req = 16384;
	/* blocks the 256 KiB + 12 byte span can touch */
	const uint64_t span_blocks = (256 * 1024 + 12) / 4096 + 2;
	flx_bcache *none, *big, *small;
	flx_bcache_stats bs;
	flx_read_stats st, total = {0};
	flx_view *v = NULL;
	unsigned char *want, *got;
	size_t len;
	flx_ckpt *c;

	first_at[0] = 18;
	c = make_ckpt(dir, tposed, 1, shape_tposed);
	first_at[0] = 16;
	CHECK_EQ(c->tensors[0].chunks[0].contig_from, 3); /* gathered */
	CHECK_EQ(flx_view_new(c, &c->tensors[0], &whole, &v, NULL), 0);
	want = expected(&whole, &len);
	CHECK_EQ(len, 256 * 2 * 128 * 4);
	got = malloc(len);
	CHECK_EQ(flx_bcache_new(0, 4096, &none), 0);
	CHECK_EQ(flx_bcache_new(1 << 20, 4096, &big), 0);
	CHECK_EQ(flx_bcache_new(8 * 4096, 4096, &small), 0);

	for (size_t off = 0; off < len; off += req) {
		memset(&st, 0, sizeof(st));
		CHECK_EQ(read_cached(v, none, got + off, req, off, &st),
			 (ssize_t)req);
		CHECK(st.preads <= span_blocks);
		CHECK(st.preads >= span_blocks - 2);
	}
	CHECK(memcmp(got, want, len) == 0);

	memset(got, 0, len);
	for (size_t off = 0; off < len; off += req)
		CHECK_EQ(read_cached(v, big, got + off, req, off, &total),
			 (ssize_t)req);
	CHECK(memcmp(got, want, len) == 0);
	flx_bcache_stats_get(big, &bs);
	CHECK(bs.misses <= span_blocks);
	CHECK_EQ(total.preads, bs.misses);
	CHECK(bs.hits >= (len / req - 1) * (span_blocks - 2));
	CHECK_EQ(bs.evictions, 0);
	CHECK_EQ(bs.blocks, bs.misses);

	/* a cache smaller than the chunk: replaced blocks, same bytes;
	 * reads that start and end inside elements */
	memset(got, 0, len);
	for (size_t off = 0; off < len;) {
		size_t n = len - off < 9001 ? len - off : 9001;

		CHECK_EQ(read_cached(v, small, got + off, n, off, NULL),
			 (ssize_t)n);
		off += n;
	}
	CHECK(memcmp(got, want, len) == 0);
	flx_bcache_stats_get(small, &bs);
	CHECK(bs.evictions > 0);
	CHECK(bs.blocks <= 8);

	/* readers in parallel through one cache (run under TSan too) */
	{
		flx_bcache *shared;
		pthread_t th[4];
		par_arg a[4];

		CHECK_EQ(flx_bcache_new(16 * 4096, 4096, &shared), 0);
		for (int i = 0; i < 4; i++) {
			a[i] = (par_arg){v,   shared,		want,
					 len, 7u + (unsigned)i, 0};
			CHECK_EQ(
			    pthread_create(&th[i], NULL, par_reader, &a[i]), 0);
		}
		for (int i = 0; i < 4; i++) {
			pthread_join(th[i], NULL);
			CHECK_EQ(a[i].bad, 0);
		}
		flx_bcache_free(shared);
	}

	/* the file cut short after mount: EIO, from a cached block too */
	CHECK_EQ(ftruncate(c->files[0].fd, 4096 * 10), 0);
	CHECK_EQ(read_cached(v, big, got, req, 0, NULL), -EIO);
	CHECK_EQ(read_cached(v, none, got, req, 0, NULL), -EIO);

	flx_bcache_free(none);
	flx_bcache_free(big);
	flx_bcache_free(small);
	free(got);
	free(want);
	flx_view_free(v);
	remove_files(dir);
	flx_ckpt_close(c);
}

/*
 * Random checkpoints: a random 3-D shape cut into a grid of chunks at
 * random points, each chunk stored in one of the 6 axis orders with a
 * random storage offset, in either file, the files' first chunk at a
 * random alignment.  Random boxes, the whole tensor and boxes on the cuts
 * (views of whole chunks, indexed in place past SCAN_MAX pieces) are read
 * whole and in random pieces, through no cache or one of four, against the
 * formula.  This is where
 * the gathers meet layouts the fixed tensors above do not have (every
 * permutation, runs that line up or not).
 */
static void test_random_layouts(const char *dir)
{
	static const int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
					{1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
	static const struct {
		uint64_t cap;
		size_t block;
	} cfg[4] = {{0, 64}, {3 * 64, 64}, {1 << 20, 64}, {1 << 20, 4096}};
	flx_bcache *caches[4];
	unsigned seed = 2024;
	size_t boxes = 0, gathered = 0;

	for (int iter = 0; iter < 150; iter++) {
		int64_t shape[3], cuts[3][4];
		int ncut[3];
		spec3 specs[27];
		int n = 0;
		flx_ckpt *c;

		for (int d = 0; d < 3; d++) {
			shape[d] = 1 + rand_r(&seed) % (d == 2 ? 7 : 11);
			ncut[d] = 1 + rand_r(&seed) % 3;
			if (ncut[d] > shape[d])
				ncut[d] = (int)shape[d];
			cuts[d][0] = 0;
			cuts[d][ncut[d]] = shape[d];
			for (int k = 1; k < ncut[d]; k++) /* increasing */
				cuts[d][k] =
				    cuts[d][k - 1] + 1 +
				    rand_r(&seed) % (shape[d] - cuts[d][k - 1] -
						     (ncut[d] - k));
		}
		for (int a = 0; a < ncut[0]; a++)
			for (int b = 0; b < ncut[1]; b++)
				for (int e = 0; e < ncut[2]; e++) {
					spec3 *sp = &specs[n++];
					const int *o = perms[rand_r(&seed) % 6];
					int k[3] = {a, b, e};

					for (int d = 0; d < 3; d++) {
						sp->off[d] = cuts[d][k[d]];
						sp->size[d] =
						    cuts[d][k[d] + 1] -
						    cuts[d][k[d]];
						sp->order[d] = o[d];
					}
					sp->storage_offset = rand_r(&seed) % 4;
					sp->file = rand_r(&seed) % 2;
				}
		first_at[0] = (uint64_t)(rand_r(&seed) % 8);
		first_at[1] = (uint64_t)(rand_r(&seed) % 8);
		c = make_ckpt(dir, specs, n, shape);
		first_at[0] = 16;
		first_at[1] = 40;
		/* a cache belongs to one checkpoint (one mount): it knows
		 * files by their index */
		for (int i = 0; i < 4; i++)
			CHECK_EQ(flx_bcache_new(cfg[i].cap, cfg[i].block,
						&caches[i]),
				 0);
		for (uint32_t i = 0; i < c->tensors[0].nchunks; i++)
			gathered += c->tensors[0].chunks[i].contig_from == 3;
		for (int bx = 0; bx < 6; bx++) {
			flx_box box;
			flx_view *v = NULL;
			unsigned char *want, *got;
			flx_bcache *cache;
			size_t len;

			for (int d = 0; d < 3; d++) {
				/* 4: the whole tensor; 5: chunks whole (on
				 * cuts): views of whole chunks */
				int lo = rand_r(&seed) % ncut[d];
				int hi =
				    lo + 1 + rand_r(&seed) % (ncut[d] - lo);

				box.off[d] = rand_r(&seed) % shape[d];
				box.size[d] =
				    1 + rand_r(&seed) % (shape[d] - box.off[d]);
				if (bx >= 4) {
					box.off[d] = bx == 4 ? 0 : cuts[d][lo];
					box.size[d] =
					    (bx == 4 ? shape[d] : cuts[d][hi]) -
					    box.off[d];
				}
			}
			{
				int pick = rand_r(&seed) % 5,
				    which = rand_r(&seed) % 4;

				cache = pick ? caches[which] : NULL;
			}
			CHECK_EQ(
			    flx_view_new(c, &c->tensors[0], &box, &v, NULL), 0);
			want = expected(&box, &len);
			got = malloc(len);
			CHECK_EQ(read_cached(v, cache, got, len, 0, NULL),
				 (ssize_t)len);
			CHECK(memcmp(got, want, len) == 0);
			for (int q = 0; q < 8; q++) {
				size_t off = (size_t)rand_r(&seed) % len;
				size_t m =
				    1 + (size_t)rand_r(&seed) % (len - off);

				memset(got, 0xAB, m);
				CHECK_EQ(
				    read_cached(v, cache, got, m, off, NULL),
				    (ssize_t)m);
				if (memcmp(got, want + off, m) != 0) {
					fprintf(stderr,
						"random layout %d box %d: "
						"mismatch at %zu+%zu\n",
						iter, bx, off, m);
					check_failures++;
				}
			}
			boxes++;
			free(got);
			free(want);
			flx_view_free(v);
		}
		for (int i = 0; i < 4; i++)
			flx_bcache_free(caches[i]);
		remove_files(dir);
		flx_ckpt_close(c);
	}
	CHECK(boxes == 900 && gathered > 100);
}

/*
 * A file of many small tensors saved one after the other, each behind a
 * header of its own (a DCP file of small torch.save items): a read of the
 * rank file that spans them all is one preadv, its flx_fs_read() batch
 * having sorted the segments' runs and read the headers between them into
 * scratch; the bytes are the tensors', each where the file's header says.
 */
#define SMALL_N	  200
#define SMALL_GAP 48 /* an item's header: bytes between two tensors */

static int cmp_tensor_name(const void *a, const void *b)
{
	return strcmp((*(flx_tensor *const *)a)->fqn,
		      (*(flx_tensor *const *)b)->fqn);
}

static void test_small_items(const char *dir)
{
	flx_ckpt *c = calloc(1, sizeof(*c));
	char path[512];
	unsigned char junk[SMALL_GAP];
	flx_spec s;
	flx_plan *p = NULL;
	flx_fs *fs = NULL;
	flx_stat st;
	flx_read_stats rs = {0};
	unsigned char *got = NULL, *part = NULL;
	uint64_t hlen = 0;
	struct stat fst;
	int fd;

	memset(junk, 0xee, sizeof(junk));
	snprintf(path, sizeof(path), "%s/f0", dir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	CHECK(fd >= 0);
	c->dir = strdup(dir);
	c->format = strdup("test");
	c->writer = strdup("test");
	c->nfiles = 1;
	c->files = calloc(1, sizeof(flx_file));
	c->files[0].relpath = strdup(path);
	c->files[0].fd = fd;
	c->files[0].data = true;
	c->ntensors = SMALL_N;
	c->tensors = calloc(SMALL_N, sizeof(flx_tensor));
	c->by_name = calloc(SMALL_N, sizeof(flx_tensor *));
	for (int i = 0; i < SMALL_N; i++) {
		flx_tensor *t = &c->tensors[i];
		uint64_t at = (uint64_t)i * (16 + SMALL_GAP);
		int32_t v[4];
		char name[32];

		for (int k = 0; k < 4; k++)
			v[k] = 1000 + i * 4 + k;
		CHECK(pwrite(fd, junk, SMALL_GAP, (off_t)at) == SMALL_GAP);
		CHECK(pwrite(fd, v, 16, (off_t)(at + SMALL_GAP)) == 16);
		snprintf(name, sizeof(name), "layers.%d.w", i);
		t->fqn = strdup(name);
		t->dtype = FLX_DT_I32;
		t->ndim = 1;
		t->shape[0] = 4;
		t->nchunks = 1;
		CHECK(flx_tensor_alloc_chunks(t, 1) == 0);
		t->chunks[0].size[0] = 4;
		t->chunks[0].stride[0] = 1;
		t->chunks[0].contig_from = flx_chunk_contig_from(1, t->chunks);
		t->chunks[0].data_off = at + SMALL_GAP;
		c->by_name[i] = t;
	}
	/* the rank file lists them by name (layers.0, layers.1, layers.10,
	 * ...), not in file order */
	qsort(c->by_name, SMALL_N, sizeof(flx_tensor *), cmp_tensor_name);
	CHECK(fstat(fd, &fst) == 0);
	flx_file_identity(&c->files[0], &fst);
	p = plan_split(c, &s, 1, 0);
	if (p)
		CHECK_EQ(flx_fs_build(c, p, &fs, NULL), 0);
	CHECK(fs && flx_fs_resolve(fs, "ranks/tp00_pp00/model.safetensors",
				   &st) == 0);
	if (fs)
		got = malloc(st.size), part = malloc(st.size);
	if (got && part && st.size > 8 + SMALL_N * 16) {
		CHECK_EQ(flx_fs_read(fs, st.ino, got, st.size, 0, &rs),
			 (ssize_t)st.size);
		/* one clustered preadv over the whole run of items */
		CHECK_EQ(rs.preads, 1);
		CHECK_EQ(rs.bytes_read, SMALL_N * (16 + SMALL_GAP) - SMALL_GAP);
		memcpy(&hlen, got, 8);
		CHECK_EQ(8 + hlen + SMALL_N * 16, st.size);
		for (int i = 0; i < SMALL_N && 8 + hlen < st.size; i++) {
			char key[48], *h = (char *)got + 8, *at;
			unsigned long long a = 0, b = 0;
			int32_t v[4];

			/* the header is JSON; got[8 + hlen] is a tensor's */
			snprintf(key, sizeof(key), "\"layers.%d.w\"", i);
			at = memmem(h, hlen, key, strlen(key));
			CHECK(at != NULL);
			at = at ? strstr(at, "\"data_offsets\"") : NULL;
			CHECK(at && sscanf(at,
					   "\"data_offsets\" : [ %llu , "
					   "%llu ]",
					   &a, &b) == 2);
			CHECK(b == a + 16 && 8 + hlen + b <= st.size);
			if (b != a + 16 || 8 + hlen + b > st.size)
				continue;
			memcpy(v, got + 8 + hlen + a, 16);
			for (int k = 0; k < 4; k++)
				CHECK_EQ(v[k], 1000 + i * 4 + k);
		}
		/* the same bytes in reads of every size and place */
		for (uint64_t off = 0, n = 1; off < st.size;
		     off += n, n = n * 3 % 997 + 1) {
			size_t k =
			    (size_t)(n < st.size - off ? n : st.size - off);

			CHECK_EQ(
			    flx_fs_read(fs, st.ino, part + off, k, off, NULL),
			    (ssize_t)k);
		}
		CHECK(!memcmp(part, got, st.size));
		/* a file changed since mount: EIO, however the runs are
		 * batched */
		CHECK(pwrite(fd, junk, 1, 0) == 1);
		CHECK_EQ(flx_fs_read(fs, st.ino, got, st.size, 0, NULL), -EIO);
	}
	free(got);
	free(part);
	flx_fs_free(fs);
	flx_plan_free(p);
	flx_spec_release(&s);
	unlink(path);
	flx_ckpt_close(c);
}

static void remove_files(const char *dir)
{
	char path[600];

	for (int f = 0; f < 2; f++) {
		snprintf(path, sizeof(path), "%s/f%d", dir, f);
		unlink(path);
	}
}

int main(void)
{
	char dir[] = "/tmp/flx_test_view_XXXXXX";
	flx_ckpt *c;

	CHECK(mkdtemp(dir) != NULL);
	c = make_ckpt(dir, five, 5, shape_7x10x3);
	test_boxes(c);
	CHECK(mapped > 1000); /* row-major chunks are mapped, not gathered */
	/* the same reads through block caches: none with small blocks (a
	 * block per call), one that keeps replacing, roomy ones */
	{
		static const struct {
			uint64_t cap;
			size_t block;
		} cfg[] = {
		    {0, 64}, {5 * 64, 64}, {1 << 20, 64}, {1 << 20, 4096}};

		for (size_t i = 0; i < sizeof(cfg) / sizeof(cfg[0]); i++) {
			CHECK_EQ(flx_bcache_new(cfg[i].cap, cfg[i].block,
						&cache_now),
				 0);
			test_boxes(c);
			flx_bcache_free(cache_now);
			cache_now = NULL;
		}
	}
	CHECK(mapped_multi > 100); /* ranges across chunks too */
	test_coalescing(c);
	test_placement(c);
	test_spec_values();
	test_plan_views(c);
	test_tree_pieces(c); /* before test_read_errors changes a file */
	test_push_range(c);
	test_read_errors(c);
	CHECK(pieced > 10000);
	CHECK(pieced_mixed > 500);  /* a header and tensor bytes */
	CHECK(pieced_multi > 3000); /* ranges of several chunks */
	remove_files(dir);
	flx_ckpt_close(c);
	test_gather_blocks(dir);
	test_random_layouts(dir);
	test_small_items(dir);
	make_many();
	c = make_ckpt(dir, many, 35, shape_7x10x3);
	test_boxes(c);
	test_plan_views(c);
	remove_files(dir);
	flx_ckpt_close(c);
	rmdir(dir);
	return CHECK_RESULT();
}
