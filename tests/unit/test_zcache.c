/* SPDX-License-Identifier: MIT */
/*
 * The zstd window cache (resolver/cache/zcache.h) against the content it was
 * compressed from: sequential reads decode each byte once, random and
 * strided reads equal the content, many threads (more than the streams)
 * over several items with and without cached windows, the private-stream
 * path, and the failures (content ending early, a changed file, a corrupt
 * frame) as -EIO; the decode-ahead worker decodes exactly its depth past a
 * sequential reader, forgets it on a seek back, stays in the budget and
 * stops with the cache; readers of two items have them decoded ahead by
 * two workers at once, within the bound on workers, and readers of one
 * item decode it once; a pinned window holds the content's bytes
 * exactly and is never evicted or refilled while pinned.
 */
#include "check.h"
#include "zcache.h"
#include "zcache_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#define NITEMS 3

static unsigned char *content[NITEMS];
static size_t csize[NITEMS];
static flx_zitem items[NITEMS];
/* an item of BIGW windows for the decode-ahead tests */
#define BIGW 72
static unsigned char *bigc;
static flx_zitem bigit;
static flx_ckpt ck;
static flx_file file;

static uint64_t rng(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Compressible content: runs of a few byte patterns, unique per item. */
static unsigned char *make_content(size_t n, uint64_t seed)
{
	unsigned char *p = malloc(n);
	uint64_t s = seed;

	for (size_t i = 0; i < n;) {
		size_t run = 1 + rng(&s) % 64;
		unsigned char b = (unsigned char)rng(&s);

		for (size_t k = 0; k < run && i < n; k++, i++)
			p[i] = (unsigned char)(b + (k & 3) * (rng(&s) & 1));
	}
	return p;
}

/* One frame as torch's stream writer makes it: no content size. */
static size_t compress_stream(const unsigned char *src, size_t n,
			      unsigned char *dst, size_t cap)
{
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	ZSTD_inBuffer in = {src, n, 0};
	ZSTD_outBuffer out = {dst, cap, 0};
	size_t left;

	ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, 3);
	ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
	do
		left = ZSTD_compressStream2(cc, &out, &in, ZSTD_e_end);
	while (left && !ZSTD_isError(left));
	ZSTD_freeCCtx(cc);
	return ZSTD_isError(left) ? 0 : out.pos;
}

static int setup(const char *path)
{
	size_t sizes[NITEMS] = {5 * FLX_ZCACHE_WINDOW + 12345, 777,
				2 * FLX_ZCACHE_WINDOW};
	uint64_t at = 100; /* items at odd offsets, as in a .distcp */
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	struct stat st;

	if (fd < 0)
		return -1;
	for (int i = 0; i < NITEMS; i++) {
		size_t cap = ZSTD_compressBound(sizes[i]);
		unsigned char *z = malloc(cap);
		size_t zn;

		content[i] = make_content(sizes[i], 1000 + (uint64_t)i);
		csize[i] = sizes[i];
		zn = compress_stream(content[i], sizes[i], z, cap);
		if (!zn || pwrite(fd, z, zn, (off_t)at) != (ssize_t)zn)
			return -1;
		items[i] = (flx_zitem){0, at, zn};
		at += zn + 7;
		free(z);
	}
	{
		size_t n = (size_t)BIGW * FLX_ZCACHE_WINDOW,
		       cap = ZSTD_compressBound(n);
		unsigned char *z = malloc(cap);
		size_t zn;

		bigc = make_content(n, 4242);
		zn = compress_stream(bigc, n, z, cap);
		if (!zn || pwrite(fd, z, zn, (off_t)at) != (ssize_t)zn)
			return -1;
		bigit = (flx_zitem){0, at, zn};
		free(z);
	}
	fstat(fd, &st);
	file = (flx_file){.relpath = "z.distcp", .fd = fd, .data = true};
	flx_file_identity(&file, &st);
	ck = (flx_ckpt){.nfiles = 1, .files = &file};
	return 0;
}

static void test_sequential(void)
{
	flx_zcache *z;
	flx_zcache_stats st;
	unsigned char *buf = malloc(csize[0]);
	size_t step = 128 << 10;

	CHECK_EQ(flx_zcache_new(8 * FLX_ZCACHE_WINDOW, &z), 0);
	for (size_t at = 0; at < csize[0]; at += step) {
		size_t n = csize[0] - at < step ? csize[0] - at : step;

		CHECK_EQ(flx_zcache_read(z, &ck, &items[0], at, 1, 1, 0,
					 buf + at, n),
			 0);
	}
	CHECK(memcmp(buf, content[0], csize[0]) == 0);
	flx_zcache_stats_get(z, &st);
	/* every byte decoded once, by one stream started once */
	CHECK_EQ(st.decoded, csize[0]);
	CHECK_EQ(st.served, csize[0]);
	CHECK_EQ(st.restarts, 1);
	CHECK(st.windows <= 8);
	/* read again: all from the cache */
	CHECK_EQ(flx_zcache_read(z, &ck, &items[0], 0, 1, 1, 0, buf, csize[0]),
		 0);
	flx_zcache_stats_get(z, &st);
	CHECK_EQ(st.decoded, csize[0]);
	flx_zcache_free(z);
	free(buf);
}

/* Element-wise oracle of flx_zcache_read(). */
static void expect_run(const unsigned char *c, uint64_t src, uint64_t stride,
		       unsigned esz, uint64_t skip, unsigned char *out,
		       size_t len)
{
	for (size_t i = 0; i < len; i++) {
		uint64_t b = skip + i;

		out[i] = c[src + (b / esz) * stride + b % esz];
	}
}

static void test_random(flx_zcache *z, uint64_t seed, int rounds)
{
	unsigned char *got = malloc(300 << 10), *want = malloc(300 << 10);
	uint64_t s = seed;

	for (int r = 0; r < rounds; r++) {
		int i = (int)(rng(&s) % NITEMS);
		unsigned esz = 1u << (rng(&s) % 4);
		bool strided = rng(&s) & 1;
		uint64_t stride = strided ? esz * (2 + rng(&s) % 700) : esz;
		uint64_t count, src, skip, maxlen;
		size_t len;

		count = (csize[i] / stride) ? (csize[i] - esz) / stride + 1 : 1;
		if (count > 1 + (300u << 10) / esz)
			count = 1 + (300u << 10) / esz;
		src = rng(&s) % (csize[i] - (count - 1) * stride - esz + 1);
		skip = rng(&s) % esz;
		maxlen = count * esz - skip;
		len = (size_t)(1 + rng(&s) % (maxlen < (300u << 10)
						  ? maxlen
						  : (300u << 10)));
		expect_run(content[i], src, stride, esz, skip, want, len);
		memset(got, 0xee, len);
		CHECK_EQ(flx_zcache_read(z, &ck, &items[i], src, stride, esz,
					 skip, got, len),
			 0);
		if (memcmp(got, want, len) != 0) {
			fprintf(stderr,
				"item %d src %llu stride %llu esz %u skip "
				"%llu len %zu differs\n",
				i, (unsigned long long)src,
				(unsigned long long)stride, esz,
				(unsigned long long)skip, len);
			check_failures++;
			break;
		}
	}
	free(got);
	free(want);
}

typedef struct targ {
	flx_zcache *z;
	uint64_t seed;
} targ;

static void *thread_main(void *arg)
{
	targ *t = arg;

	test_random(t->z, t->seed, 40);
	return NULL;
}

/* 16 threads, twice the streams: some wait for one, some restart one
 * that is past their window. */
static void test_threads(uint64_t cap)
{
	enum { NT = 16 };
	pthread_t th[NT];
	targ a[NT];
	flx_zcache *z;
	flx_zcache_stats st;

	CHECK_EQ(flx_zcache_new(cap, &z), 0);
	for (int i = 0; i < NT; i++) {
		a[i] = (targ){z, 77 + (uint64_t)i * 1009};
		pthread_create(&th[i], NULL, thread_main, &a[i]);
	}
	for (int i = 0; i < NT; i++)
		pthread_join(th[i], NULL);
	flx_zcache_stats_get(z, &st);
	CHECK(st.windows <= cap / FLX_ZCACHE_WINDOW);
	flx_zcache_free(z);
}

/* Read window w of the big item whole and check it. */
static void read_big(flx_zcache *z, uint64_t w)
{
	static unsigned char buf[FLX_ZCACHE_WINDOW];
	uint64_t at = w * FLX_ZCACHE_WINDOW;

	CHECK_EQ(flx_zcache_read(z, &ck, &bigit, at, 1, 1, 0, buf, sizeof(buf)),
		 0);
	CHECK(memcmp(buf, bigc + at, sizeof(buf)) == 0);
}

static uint64_t decoded_windows(flx_zcache *z)
{
	flx_zcache_stats st;

	flx_zcache_settle(z);
	flx_zcache_stats_get(z, &st);
	CHECK(st.windows <= 4 * FLX_ZCACHE_AHEAD);
	CHECK(st.ahead <= st.decoded);
	return st.decoded / FLX_ZCACHE_WINDOW;
}

/*
 * Decode-ahead in the smallest cache that has it (4 * FLX_ZCACHE_AHEAD
 * windows): a reader of windows 0..2 that stops leaves the stream exactly
 * FLX_ZCACHE_AHEAD windows past it; a seek forward decodes up to the new
 * window and that far past it; a seek back to an evicted window restarts
 * the stream, which then goes only FLX_ZCACHE_AHEAD past the new position
 * (the old wish is forgotten).  Windows allocated never exceed the
 * budget.  Freeing the cache while the worker decodes stops it.
 */
static void test_ahead(void)
{
	const uint64_t d = FLX_ZCACHE_AHEAD;
	flx_zcache *z;
	flx_zcache_stats st;

	CHECK_EQ(flx_zcache_new(4 * d * FLX_ZCACHE_WINDOW, &z), 0);
	for (uint64_t w = 0; w < 3; w++)
		read_big(z, w);
	CHECK_EQ(decoded_windows(z), 3 + d);
	flx_zcache_stats_get(z, &st);
	CHECK(st.ahead >= d * FLX_ZCACHE_WINDOW);
	CHECK_EQ(st.restarts, 1);
	/* the reader stopped: nothing more, however long we wait */
	usleep(20000);
	CHECK_EQ(decoded_windows(z), 3 + d);
	/* seek forward: decoded through 12, then d more */
	read_big(z, 12);
	CHECK_EQ(decoded_windows(z), 13 + d);
	/* seek back to window 0, long evicted: one restart, 1 + d windows */
	read_big(z, 0);
	CHECK_EQ(decoded_windows(z), 13 + d + 1 + d);
	flx_zcache_stats_get(z, &st);
	CHECK_EQ(st.restarts, 2);
	/* to the end: every window once more, nothing past the item */
	for (uint64_t w = 1; w < BIGW; w++)
		read_big(z, w);
	CHECK_EQ(decoded_windows(z), 13 + d + BIGW);
	flx_zcache_free(z);

	/* below the threshold: no decode-ahead at all */
	CHECK_EQ(flx_zcache_new((4 * d - 1) * FLX_ZCACHE_WINDOW, &z), 0);
	read_big(z, 0);
	flx_zcache_settle(z);
	flx_zcache_stats_get(z, &st);
	CHECK_EQ(st.ahead, 0);
	CHECK_EQ(st.decoded, FLX_ZCACHE_WINDOW);
	flx_zcache_free(z);

	/* freed while the worker decodes: it stops (ASan, TSan: no use
	 * after free, no leak) */
	CHECK_EQ(flx_zcache_new(64u << 20, &z), 0);
	read_big(z, 0);
	flx_zcache_free(z);
}

/*
 * A restarted stream forgets what it was wanted for.  Each round reads
 * window 0 (evicted: a new stream takes it, while there is one) and then
 * a window below every older stream, 8 below the last (so neither it nor
 * what the new stream decodes on the way is cached), which that new
 * stream decodes to.  With every stream keyed to the big item, the next
 * read of window 0 restarts the last one, which was wanted up to
 * 10 + 1 + FLX_ZCACHE_AHEAD: it decodes window 0 and FLX_ZCACHE_AHEAD
 * more, not the 13 windows of before.
 */
static void test_ahead_restart(void)
{
	const uint64_t d = FLX_ZCACHE_AHEAD;
	flx_zcache *z;
	flx_zcache_stats st;
	uint64_t before;

	CHECK_EQ(flx_zcache_new(4 * d * FLX_ZCACHE_WINDOW, &z), 0);
	for (int i = 0; i < FLX_ZCACHE_STREAMS; i++) {
		read_big(z, 0);
		read_big(z, 10 + 8 * (uint64_t)(FLX_ZCACHE_STREAMS - 1 - i));
	}
	before = decoded_windows(z);
	flx_zcache_stats_get(z, &st);
	CHECK_EQ(st.restarts, FLX_ZCACHE_STREAMS);
	read_big(z, 0);
	CHECK_EQ(decoded_windows(z), before + 1 + d);
	flx_zcache_stats_get(z, &st);
	CHECK_EQ(st.restarts, FLX_ZCACHE_STREAMS + 1);
	flx_zcache_free(z);
}

/* The first two window decodes of the workers wait for each other, up to
 * 5 s: two workers at once meet at once, one worker alone goes on after
 * the timeout. */
static pthread_mutex_t meet_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t meet_cv = PTHREAD_COND_INITIALIZER;
static int meet_n;

static void meet(void *arg)
{
	struct timespec until;

	(void)arg;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	pthread_mutex_lock(&meet_mu);
	if (++meet_n == 2)
		pthread_cond_broadcast(&meet_cv);
	while (meet_n < 2 &&
	       pthread_cond_timedwait(&meet_cv, &meet_mu, &until) == 0)
		;
	pthread_mutex_unlock(&meet_mu);
}

typedef struct seqarg {
	flx_zcache *z;
	const flx_zitem *it;
	const unsigned char *c;
	size_t n;
} seqarg;

/* Read an item whole, in order, 256 KiB a call, and check it. */
static void *seq_main(void *arg)
{
	seqarg *a = arg;
	enum { STEP = 256 << 10 };
	unsigned char *buf = malloc(STEP);

	for (size_t at = 0; at < a->n; at += STEP) {
		size_t n = a->n - at < STEP ? a->n - at : STEP;

		CHECK_EQ(flx_zcache_read(a->z, &ck, a->it, at, 1, 1, 0, buf, n),
			 0);
		if (memcmp(buf, a->c + at, n) != 0) {
			fprintf(stderr, "seq read at %zu differs\n", at);
			check_failures++;
			break;
		}
	}
	free(buf);
	return NULL;
}

static void read_together(flx_zcache *z, seqarg *a, int n)
{
	pthread_t th[4];

	for (int i = 0; i < n; i++)
		pthread_create(&th[i], NULL, seq_main, &a[i]);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	flx_zcache_settle(z);
}

/*
 * Readers of two items have them decoded ahead by two workers at the same
 * time (with two CPUs or more; one otherwise): the first window of each
 * read, the first worker waits in meet() for a second one, which only a
 * second worker can be (the readers read no more, so they cannot take
 * the streams back from the workers).  Then two threads read the two
 * items whole, in order.  Workers stay within their bound (online CPUs,
 * streams, one per 4 * FLX_ZCACHE_AHEAD windows); read again, parked
 * workers are reused, none is added.  Two threads reading one item
 * decode it once, through one stream.
 */
static void test_workers(void)
{
	const uint64_t W = FLX_ZCACHE_WINDOW, d = FLX_ZCACHE_AHEAD;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t bound = 128 / (4 * d);
	flx_zcache *z;
	flx_zcache_stats st, st2;
	seqarg a[2] = {{NULL, &bigit, bigc, (size_t)BIGW * W},
		       {NULL, &items[0], content[0], csize[0]}};
	unsigned char buf[64];

	if (bound > FLX_ZCACHE_STREAMS)
		bound = FLX_ZCACHE_STREAMS;
	if (cpus >= 1 && bound > (uint64_t)cpus)
		bound = (uint64_t)cpus;
	/* 128 windows: nothing is evicted, so no read restarts a stream */
	CHECK_EQ(flx_zcache_new(128 * W, &z), 0);
	flx_zcache_set_ahead_hook(z, meet, NULL);
	read_big(z, 0);
	CHECK_EQ(flx_zcache_read(z, &ck, &items[0], 0, 1, 1, 0, buf, 64), 0);
	CHECK(memcmp(buf, content[0], 64) == 0);
	flx_zcache_settle(z);
	flx_zcache_stats_get(z, &st);
	CHECK_EQ(st.ahead_peak, (bound >= 2 ? 2 : 1));
	CHECK_EQ(st.ahead, 2 * d * W);
	a[0].z = a[1].z = z;
	read_together(z, a, 2);
	flx_zcache_stats_get(z, &st);
	CHECK(st.workers >= 1 && st.workers <= bound);
	CHECK_EQ(st.decoded, (uint64_t)BIGW * W + csize[0]);
	CHECK_EQ(st.restarts, 2);
	CHECK(st.ahead > 0);
	flx_zcache_free(z);

	/* the same item read by two threads: decoded once, one stream */
	CHECK_EQ(flx_zcache_new(128 * W, &z), 0);
	a[0].z = a[1].z = z;
	a[1] = a[0];
	read_together(z, a, 2);
	flx_zcache_stats_get(z, &st);
	CHECK_EQ(st.decoded, (uint64_t)BIGW * W);
	CHECK_EQ(st.restarts, 1);
	CHECK_EQ(st.served, 2 * (uint64_t)BIGW * W);
	/* all cached now: read again, nothing decoded, no worker added */
	read_together(z, a, 2);
	flx_zcache_stats_get(z, &st2);
	CHECK_EQ(st2.decoded, st.decoded);
	CHECK_EQ(st2.workers, st.workers);
	CHECK(st2.workers <= bound);
	flx_zcache_free(z);

	/* the least cache with decode-ahead: one worker */
	CHECK_EQ(flx_zcache_new(4 * d * W, &z), 0);
	a[0] = (seqarg){z, &bigit, bigc, (size_t)BIGW * W};
	a[1] = (seqarg){z, &items[0], content[0], csize[0]};
	read_together(z, a, 2);
	flx_zcache_stats_get(z, &st);
	CHECK_EQ(st.workers, 1);
	CHECK_EQ(st.ahead_peak, 1);
	flx_zcache_free(z);
}

/* Item 0's content as one frame with a content size and a checksum. */
static size_t compress_checked(unsigned char *dst, size_t cap)
{
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	size_t n;

	ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, 3);
	ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
	n = ZSTD_compress2(cc, dst, cap, content[0], csize[0]);
	ZSTD_freeCCtx(cc);
	return ZSTD_isError(n) ? 0 : n;
}

/* Add a to the frame content size field of frame f (magic, FHD, window
 * descriptor unless single-segment, no dictionary id, then the field). */
static void bump_fcs(unsigned char *f, int64_t a)
{
	unsigned fhd = f[4], code = fhd >> 6, single = (fhd >> 5) & 1;
	size_t at = 5 + !single, len = code == 0 ? 1 : 1u << code;
	uint64_t v = 0;

	CHECK_EQ(fhd & 3, 0);
	CHECK(code >= 2);
	for (size_t i = 0; i < len; i++)
		v |= (uint64_t)f[at + i] << (8 * i);
	v += (uint64_t)a;
	for (size_t i = 0; i < len; i++)
		f[at + i] = (unsigned char)(v >> (8 * i));
}

/* Append frame f of n bytes to the test file: an item there. */
static flx_zitem append_frame(const unsigned char *f, size_t n)
{
	struct stat st;
	flx_zitem it = {0, 0, n};

	fstat(file.fd, &st);
	it.off = (uint64_t)st.st_size;
	CHECK_EQ(pwrite(file.fd, f, n, (off_t)it.off), (ssize_t)n);
	fstat(file.fd, &st);
	flx_file_identity(&file, &st);
	return it;
}

/*
 * The read path's own guards (the daemon also refuses these frames at
 * mount, zstditem.h): a frame whose checksum fails (one byte flipped in
 * its middle: a corrupt block or other content, either way the end of
 * the frame disagrees; or the checksum field flipped, every block right)
 * and frames whose content size field says one byte
 * more or one less than the content: reading the item whole is -EIO, and
 * windows decoded before the fault equal the content (a frame decodes
 * from its start: the fault is met only where it is).  Memory stays in
 * the cache's budget throughout.
 */
static void test_bad_frames(void)
{
	size_t cap = ZSTD_compressBound(csize[0]), n;
	unsigned char *f = malloc(cap), *g = malloc(cap);
	unsigned char *buf = malloc(csize[0]);
	flx_zcache_stats st;
	flx_zcache *z;
	flx_zitem it;

	n = compress_checked(f, cap);
	CHECK(n > 1000);
	CHECK_EQ(flx_zcache_new(4 * FLX_ZCACHE_WINDOW, &z), 0);
	/* intact: reads whole */
	it = append_frame(f, n);
	CHECK_EQ(flx_zcache_read(z, &ck, &it, 0, 1, 1, 0, buf, csize[0]), 0);
	CHECK(memcmp(buf, content[0], csize[0]) == 0);
	/* a byte flipped in the last third: the first window is right, the
	 * whole is EIO */
	memcpy(g, f, n);
	g[n - n / 4] ^= 0x20;
	it = append_frame(g, n);
	CHECK_EQ(flx_zcache_read(z, &ck, &it, 0, 1, 1, 0, buf, 4096), 0);
	CHECK(memcmp(buf, content[0], 4096) == 0);
	CHECK_EQ(flx_zcache_read(z, &ck, &it, 0, 1, 1, 0, buf, csize[0]), -EIO);
	/* the checksum field itself flipped: every block decodes to the
	 * content, only the frame's end disagrees */
	memcpy(g, f, n);
	g[n - 1] ^= 0x01;
	it = append_frame(g, n);
	CHECK_EQ(flx_zcache_read(z, &ck, &it, 0, 1, 1, 0, buf, csize[0]), -EIO);
	/* content size one more, one less than the content */
	for (int64_t a = -1; a <= 1; a += 2) {
		memcpy(g, f, n);
		bump_fcs(g, a);
		it = append_frame(g, n);
		CHECK_EQ(
		    flx_zcache_read(z, &ck, &it, 0, 1, 1, 0, buf, csize[0]),
		    -EIO);
	}
	flx_zcache_stats_get(z, &st);
	CHECK(st.windows <= 4);
	flx_zcache_free(z);
	free(f);
	free(g);
	free(buf);
}

/* n bytes repeating one random block of p bytes, as one frame with a
 * window of 1 << wlog, long-distance matching (nearly every byte a match
 * p back) and a checksum, no content size, flushed every 100003 bytes
 * (blocks end off the windows' edges, as a stream writer's may): an item
 * of the test file. */
static flx_zitem repeat_item(size_t n, size_t p, int wlog, unsigned char **out)
{
	unsigned char *c = malloc(n), *f = malloc(ZSTD_compressBound(n) + n);
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	ZSTD_outBuffer o = {f, ZSTD_compressBound(n) + n, 0};
	uint64_t s = 77 + p;
	flx_zitem it = {0};
	size_t zn = 0;

	for (size_t i = 0; i < n; i++)
		c[i] = i < p ? (unsigned char)rng(&s) : c[i - p];
	ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, 3);
	ZSTD_CCtx_setParameter(cc, ZSTD_c_windowLog, wlog);
	ZSTD_CCtx_setParameter(cc, ZSTD_c_enableLongDistanceMatching, 1);
	ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
	ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
	for (size_t at = 0; at < n && !ZSTD_isError(zn);) {
		size_t m = n - at < 100003 ? n - at : 100003;
		ZSTD_inBuffer in = {c + at, m, 0};
		ZSTD_EndDirective e = at + m == n ? ZSTD_e_end : ZSTD_e_flush;

		do
			zn = ZSTD_compressStream2(cc, &o, &in, e);
		while (zn && !ZSTD_isError(zn));
		at += m;
	}
	zn = ZSTD_isError(zn) ? zn : o.pos;
	ZSTD_freeCCtx(cc);
	CHECK(!ZSTD_isError(zn));
	/* the repeats were found: most bytes are back-references */
	CHECK(!ZSTD_isError(zn) && zn < p + (n - p) / 8);
	if (!ZSTD_isError(zn))
		it = append_frame(f, zn);
	free(f);
	*out = c;
	return it;
}

/* Read item it (n bytes, content c) sequentially through a cache of
 * 8 windows, at random through one of 3 and through private streams. */
static void read_all_ways(const flx_zitem *it, const unsigned char *c, size_t n,
			  uint64_t *inplace)
{
	unsigned char *buf = malloc(n);
	size_t step = 100000;
	flx_zcache_stats st;
	flx_zcache *z;
	uint64_t s = 5;

	CHECK_EQ(flx_zcache_new(8 * FLX_ZCACHE_WINDOW, &z), 0);
	for (size_t at = 0; at < n; at += step) {
		size_t m = n - at < step ? n - at : step;

		CHECK_EQ(flx_zcache_read(z, &ck, it, at, 1, 1, 0, buf + at, m),
			 0);
	}
	CHECK(memcmp(buf, c, n) == 0);
	flx_zcache_settle(z);
	flx_zcache_stats_get(z, &st);
	*inplace = st.inplace;
	flx_zcache_free(z);
	for (int k = 0; k < 2; k++) {
		z = NULL;
		if (k == 0)
			CHECK_EQ(flx_zcache_new(3 * FLX_ZCACHE_WINDOW, &z), 0);
		for (int r = 0; r < (k ? 3 : 12); r++) {
			uint64_t at = rng(&s) % n;
			size_t m =
			    1 + rng(&s) % (n - at < 300000 ? n - at : 300000);

			CHECK_EQ(
			    flx_zcache_read(z, &ck, it, at, 1, 1, 0, buf, m),
			    0);
			CHECK(memcmp(buf, c + at, m) == 0);
		}
		flx_zcache_free(z);
	}
	free(buf);
}

/*
 * Back-references as far as a frame's window allows, across windows.
 * A frame of 2 MiB windows whose content repeats every 2 MiB - 1000
 * bytes is decoded in place (each window's history is the window before
 * it, the block that crossed into it aside): all of its bytes, and the
 * content read every way.  A frame of 4 MiB windows repeating every
 * 3 MiB reaches two windows back: it goes through libzstd's streaming
 * decoder (in place, it would fail as corrupt).  A frame whose content
 * ends with a full window is checked to its end (the checksum flipped:
 * EIO) when that window is decoded.
 */
static void test_reach(void)
{
	const size_t n = 4 * FLX_ZCACHE_WINDOW + 777;
	unsigned char *c, *f;
	flx_zitem it;
	uint64_t inplace;
	flx_zcache *z;
	size_t zn;

	it = repeat_item(n, (2u << 20) - (130u << 10), 21, &c);
	read_all_ways(&it, c, n, &inplace);
	CHECK_EQ(inplace, n);
	free(c);
	it = repeat_item(n, 3u << 20, 22, &c);
	read_all_ways(&it, c, n, &inplace);
	CHECK_EQ(inplace, 0);
	free(c);
	/* content of exactly 2 windows, the checksum's last byte flipped */
	it = repeat_item(2 * FLX_ZCACHE_WINDOW, 1u << 20, 21, &c);
	f = malloc(it.len);
	zn = (size_t)it.len;
	CHECK_EQ(pread(file.fd, f, zn, (off_t)it.off), (ssize_t)zn);
	f[zn - 1] ^= 0x01;
	it = append_frame(f, zn);
	CHECK_EQ(flx_zcache_new(8 * FLX_ZCACHE_WINDOW, &z), 0);
	CHECK_EQ(flx_zcache_read(z, &ck, &it, FLX_ZCACHE_WINDOW, 1, 1, 0, c,
				 FLX_ZCACHE_WINDOW),
		 -EIO);
	flx_zcache_free(z);
	free(f);
	free(c);
}

static void test_failures(const char *path)
{
	flx_zcache *z;
	unsigned char buf[64];
	flx_zitem cut = items[0];
	struct stat st;

	CHECK_EQ(flx_zcache_new(4 * FLX_ZCACHE_WINDOW, &z), 0);
	/* past the end of the content */
	CHECK_EQ(
	    flx_zcache_read(z, &ck, &items[1], csize[1] - 10, 1, 1, 0, buf, 20),
	    -EIO);
	CHECK_EQ(
	    flx_zcache_read(z, &ck, &items[1], csize[1] - 10, 1, 1, 0, buf, 10),
	    0);
	CHECK(memcmp(buf, content[1] + csize[1] - 10, 10) == 0);
	/* a frame cut short: what it holds is served, the rest is EIO */
	cut.len = items[0].len / 2;
	CHECK_EQ(flx_zcache_read(z, &ck, &cut, 0, 1, 1, 0, buf, 64), 0);
	CHECK_EQ(flx_zcache_read(z, &ck, &cut, csize[0] - 64, 1, 1, 0, buf, 64),
		 -EIO);
	/* a corrupt block: EIO, never other bytes */
	{
		flx_zcache *z2;
		unsigned char zb[64];
		uint64_t at = items[2].off + items[2].len / 2;

		CHECK_EQ(pread(file.fd, zb, 1, (off_t)at), 1);
		zb[0] ^= 0x5a;
		CHECK_EQ(pwrite(file.fd, zb, 1, (off_t)at), 1);
		fstat(file.fd, &st);
		flx_file_identity(&file, &st);
		CHECK_EQ(flx_zcache_new(0, &z2), 0);
		{
			unsigned char *big = malloc(csize[2]);
			int rc = flx_zcache_read(z2, &ck, &items[2], 0, 1, 1, 0,
						 big, csize[2]);

			/* a flipped literal byte decodes (no checksum):
			 * only a flip in a header or table is caught, so
			 * accept either, but never a silent success on a
			 * structural fault */
			CHECK(rc == -EIO || rc == 0);
			free(big);
		}
		flx_zcache_free(z2);
	}
	/* the file changed since mount: EIO */
	{
		int fd = open(path, O_WRONLY | O_APPEND);

		/* item 1's window is cached now */
		CHECK_EQ(
		    flx_zcache_read(z, &ck, &items[1], 0, 1, 1, 0, buf, 10), 0);
		CHECK(fd >= 0 && write(fd, "x", 1) == 1);
		close(fd);
		/* EIO from the cache too, never the bytes of before */
		CHECK_EQ(
		    flx_zcache_read(z, &ck, &items[1], 0, 1, 1, 0, buf, 10),
		    -EIO);
		flx_zcache_free(z);
		CHECK_EQ(flx_zcache_new(4 * FLX_ZCACHE_WINDOW, &z), 0);
		CHECK_EQ(
		    flx_zcache_read(z, &ck, &items[0], 0, 1, 1, 0, buf, 64),
		    -EIO);
	}
	flx_zcache_free(z);
}

/*
 * Pinned windows (flx_zcache_pin()): the decision counts the windows a
 * run touches; a pin holds exactly the content's window, the last one
 * short; a pinned window is never evicted or reused, and with every slot
 * pinned a pin is refused (-ENOBUFS) while copies still read through a
 * stream.
 */
static void test_pin_exact(void)
{
	const uint64_t W = FLX_ZCACHE_WINDOW;
	uint64_t at[] = {0, W - 1, W, W + 1, 5 * W - 1, 5 * W, csize[0] - 1};
	flx_zcache *z;
	flx_zcache_stats st;
	flx_zpin p, q;

	CHECK_EQ(flx_zcache_windows(0, W, 4), 1);
	CHECK_EQ(flx_zcache_windows(1, W, 4), 2);
	CHECK_EQ(flx_zcache_windows(W - 1, 1, 1), 1);
	CHECK_EQ(flx_zcache_windows(W - 1, 2, 1), 0);
	CHECK_EQ(flx_zcache_windows(W - 1, 2, 2), 2);
	CHECK_EQ(flx_zcache_windows(5, 0, 4), 0);
	CHECK_EQ(flx_zcache_new(2 * W, &z), 0);
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
		uint64_t w0 = at[i] / W * W;
		size_t n = csize[0] - w0 < W ? csize[0] - w0 : W;

		CHECK_EQ(flx_zcache_pin(z, &ck, &items[0], at[i], &p), 0);
		CHECK_EQ(p.n, n);
		CHECK(p.data && memcmp(p.data, content[0] + w0, n) == 0);
		flx_zcache_unpin(z, &p, 0);
		CHECK(p.slot == NULL);
	}
	/* both slots pinned: a third window has no slot, yet reads work */
	CHECK_EQ(flx_zcache_pin(z, &ck, &items[0], 0, &p), 0);
	CHECK_EQ(flx_zcache_pin(z, &ck, &items[0], 3 * W, &q), 0);
	{
		flx_zpin r;
		unsigned char buf[4096];

		CHECK_EQ(flx_zcache_pin(z, &ck, &items[0], W, &r), -ENOBUFS);
		CHECK(r.slot == NULL);
		for (uint64_t a = W; a < csize[0]; a += W / 3) {
			size_t n = csize[0] - a < sizeof(buf) ? csize[0] - a
							      : sizeof(buf);

			CHECK_EQ(flx_zcache_read(z, &ck, &items[0], a, 1, 1, 0,
						 buf, n),
				 0);
			CHECK(memcmp(buf, content[0] + a, n) == 0);
		}
	}
	CHECK(memcmp(p.data, content[0], W) == 0);
	CHECK(memcmp(q.data, content[0] + 3 * W, W) == 0);
	/* past the content's end: EIO, nothing held */
	{
		flx_zpin r;

		CHECK_EQ(flx_zcache_pin(z, &ck, &items[1], csize[1], &r), -EIO);
		CHECK(r.slot == NULL);
	}
	/* a pin counts as served what its user says it sent */
	flx_zcache_stats_get(z, &st);
	flx_zcache_unpin(z, &p, 1000);
	flx_zcache_unpin(z, &q, 0);
	CHECK(p.slot == NULL && q.slot == NULL);
	{
		uint64_t before = st.served;

		flx_zcache_stats_get(z, &st);
		CHECK_EQ(st.served, before + 1000);
	}
	CHECK(st.windows <= 2);
	flx_zcache_free(z);
}

typedef struct pinarg {
	flx_zcache *z;
	uint64_t seed;
} pinarg;

/* Pin random windows of every item, read others while holding them, and
 * check the pinned bytes before and after: a slot evicted or refilled
 * under the pin shows as other bytes (and as a race under TSan). */
static void *pin_main(void *arg)
{
	pinarg *a = arg;
	unsigned char buf[8192];

	for (int round = 0; round < 60; round++) {
		int i = (int)(rng(&a->seed) % NITEMS);
		uint64_t at = rng(&a->seed) % csize[i];
		uint64_t w0 = at / FLX_ZCACHE_WINDOW * FLX_ZCACHE_WINDOW;
		flx_zpin p;
		int rc = flx_zcache_pin(a->z, &ck, &items[i], at, &p);
		int j = (int)(rng(&a->seed) % NITEMS);
		uint64_t b = rng(&a->seed) % csize[j];
		size_t n =
		    csize[j] - b < sizeof(buf) ? csize[j] - b : sizeof(buf);

		CHECK(rc == 0 || rc == -ENOBUFS);
		if (!rc)
			CHECK(memcmp(p.data, content[i] + w0, p.n) == 0);
		CHECK_EQ(
		    flx_zcache_read(a->z, &ck, &items[j], b, 1, 1, 0, buf, n),
		    0);
		CHECK(memcmp(buf, content[j] + b, n) == 0);
		if (!rc)
			CHECK(memcmp(p.data, content[i] + w0, p.n) == 0);
		flx_zcache_unpin(a->z, &p, 0);
	}
	return NULL;
}

static void test_pin_threads(uint64_t cap)
{
	enum { NT = 8 };
	pthread_t th[NT];
	pinarg a[NT];
	flx_zcache *z;
	flx_zcache_stats st;

	CHECK_EQ(flx_zcache_new(cap, &z), 0);
	for (int i = 0; i < NT; i++) {
		a[i] = (pinarg){z, 31 + (uint64_t)i * 7919};
		pthread_create(&th[i], NULL, pin_main, &a[i]);
	}
	for (int i = 0; i < NT; i++)
		pthread_join(th[i], NULL);
	flx_zcache_stats_get(z, &st);
	CHECK(st.windows <= cap / FLX_ZCACHE_WINDOW);
	flx_zcache_free(z);
}

int main(void)
{
	char path[] = "/tmp/flx_zcache_XXXXXX";
	int fd = mkstemp(path);
	flx_zcache *z;

	if (fd < 0 || (close(fd), setup(path))) {
		fprintf(stderr, "setup failed\n");
		return 1;
	}
	test_sequential();
	test_ahead();
	test_ahead_restart();
	test_workers();
	/* a cache of 2 windows: random reads restart streams */
	CHECK_EQ(flx_zcache_new(2 * FLX_ZCACHE_WINDOW, &z), 0);
	test_random(z, 12345, 150);
	flx_zcache_free(z);
	/* no cache: private streams */
	test_random(NULL, 999, 20);
	test_threads(0);
	test_threads(3 * FLX_ZCACHE_WINDOW);
	test_threads(4 * FLX_ZCACHE_AHEAD * FLX_ZCACHE_WINDOW); /* ahead */
	test_pin_exact();
	test_pin_threads(3 * FLX_ZCACHE_WINDOW);
	test_pin_threads(4 * FLX_ZCACHE_AHEAD * FLX_ZCACHE_WINDOW);
	test_bad_frames();
	test_reach();
	test_failures(path);
	close(file.fd);
	unlink(path);
	for (int i = 0; i < NITEMS; i++)
		free(content[i]);
	free(bigc);
	return CHECK_RESULT();
}
