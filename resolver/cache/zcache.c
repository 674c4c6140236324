/* SPDX-License-Identifier: MIT */
/*
 * The decompressed-window cache of zstd items (zcache.h).  One mutex
 * guards the slots and the streams' bookkeeping; each stream has its own
 * mutex, held while it decodes, so that decoding runs outside the cache
 * lock and readers of other items are not held up.  A stream's item never
 * changes while a reader or the decode-ahead worker has claimed it
 * (users > 0).
 *
 * Decode-ahead: a reader that follows a stream (the stream is at most
 * FLX_ZCACHE_AHEAD windows past the window it just got) raises the
 * stream's want to that many windows past its own; worker threads decode
 * wanted windows into cache slots, one window per turn, as a reader
 * would.  So the next window is decoded while the FUSE thread copies the
 * current one out.  A worker never restarts a stream and never goes past
 * want: a stream restarted (a seek back) or re-keyed forgets its want,
 * and a reader that stops leaves at most FLX_ZCACHE_AHEAD windows decoded
 * for nothing.
 *
 * Workers: each holds one stream while it decodes a window (busy, so no
 * two decode the same stream and readers of one item still share one
 * decode), so streams of different items are decoded in parallel.  A
 * wish that no parked worker can take starts another worker, up to
 * amax (ahead_workers()); with none to start, the busy ones take it when
 * they finish their window.  A worker with nothing wanted parks on acv
 * until a wish or the cache's end; a wake-up is handed to one parked
 * worker (apend), so two wishes in a row wake two workers.
 *
 * In place: libzstd's buffer-less decoder keeps the output of its last
 * call as history and, when the next call writes elsewhere, the whole of
 * that previous run of output as a second, older piece of history.  So a
 * stream writes each window into its slot in one run (from the bytes of
 * the block that crossed into it on), and the window before stays
 * unmodified until this one is done: the stream pins its slot (hslot).
 * A run is at least FLX_ZCACHE_WINDOW - ZSTD_BLOCKSIZE_MAX bytes long, so
 * back-references of that reach always find their bytes.
 */
#include "zcache.h"
#include "zcache_internal.h"

#include "reader.h"
#include "zstditem.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#define ZSTD_STATIC_LINKING_ONLY /* the buffer-less decoder */
#include <zstd.h>

#define IN_CAP (128u << 10)
/* A window's room: its bytes and the block that may cross its end when
 * decoded in place (the next window's first bytes, copied there). */
#define ROOM (FLX_ZCACHE_WINDOW + ZSTD_BLOCKSIZE_MAX)
/* The alignment of the slots' mapping: a transparent huge page */
#define HUGE_ALIGN (2u << 20)

typedef struct zslot {
	flx_zitem key;
	uint64_t win; /* window index in the item's content */
	unsigned char *data;
	size_t n; /* valid bytes (the last window may be short) */
	uint32_t pins;
	struct zstream *hist; /* the stream whose history it is (one pin) */
	bool valid;
	uint64_t used; /* LRU tick */
	int32_t hnext; /* next valid slot of its hash chain, -1: none */
} zslot;

typedef struct zstream zstream;

struct zstream {
	pthread_mutex_t mu; /* held while decoding or lending out */
	flx_zitem key;
	bool keyed;	/* key names an item */
	uint32_t users; /* readers that claimed it (under the cache lock) */
	bool busy;	/* one of them holds or is taking mu (cache lock) */
	uint64_t used;
	/* next and fresh as the holder last published them, for claim()
	 * (under the cache lock; the fields below are the holder's) */
	uint64_t pnext;
	bool pfresh;
	bool pended;
	/* decode ahead until pnext reaches it (under the cache lock) */
	uint64_t want;
	const flx_ckpt *c; /* its item's checkpoint (set with the key) */
	/* under mu */
	ZSTD_DCtx *dctx;
	unsigned char *in;
	unsigned char *own[2]; /* ROOM bytes each: windows no slot took */
	unsigned char *lent;   /* of own, window next - 1 (no slot took it) */
	size_t in_pos, in_len;
	uint64_t in_off; /* frame bytes read so far */
	uint64_t next;	 /* the window it produces next */
	bool ended;	 /* the frame ended */
	bool fresh;	 /* must restart before use */
	size_t out_n;	 /* bytes of window next - 1 in lent */
	/* In place (the frame's window fits one window's room less a
	 * block): libzstd's buffer-less decoder writes straight into the
	 * window's buffer and reads its back-references from there and from
	 * the buffer of the window before, hist (hn bytes decoded into it,
	 * past FLX_ZCACHE_WINDOW: the block that crossed into window next).
	 * hist is a slot pinned for it (hslot, under the cache lock too) or
	 * one of own.  Otherwise ZSTD_decompressStream() copies the window
	 * out of libzstd's own history buffer. */
	bool inplace;
	bool raw; /* in place: the block being decoded is raw (step()) */
	unsigned char *hist;
	size_t hn;
	zslot *hslot;
};

struct flx_zcache {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* a stream let go, or a window published */
	zslot *slots;
	size_t nslots;
	/* the slots' windows: one mapping of nslots windows, its pages
	 * touched as slots are first filled */
	unsigned char *mem;
	size_t memlen;
	int32_t *chain; /* hash chains of valid slots: nchains heads, -1 */
	size_t nchains; /* a power of two */
	zstream streams[FLX_ZCACHE_STREAMS];
	uint64_t tick;
	flx_zcache_stats st;
	/* the decode-ahead workers */
	pthread_cond_t acv; /* a stream wants windows, or stop */
	pthread_t athr[FLX_ZCACHE_STREAMS];
	uint32_t nthr;	/* workers started (joined by free) */
	uint32_t amax;	/* at most this many (ahead_workers()) */
	uint32_t aidle; /* workers parked on acv */
	uint32_t apend; /* wake-ups handed to parked workers, not taken */
	uint32_t abusy; /* streams the workers hold */
	uint32_t adec;	/* of them, decoding a window now */
	bool afailed, astop;
	void (*ahook)(void *); /* zcache_internal.h */
	void *aarg;
};

/* A pinned window: a slot, or a stream's output (its mutex held). */
typedef struct zref {
	const unsigned char *data;
	size_t n;
	zslot *slot;
	zstream *s;
} zref;

/* The decision: how many windows past a sequential reader's window its
 * stream decodes ahead.  None in a cache of fewer than 4 * FLX_ZCACHE_AHEAD
 * windows (the private one of a call included): the windows decoded ahead
 * for one reader stay within a quarter of the cache, so they do not
 * evict what other readers still use. */
static uint64_t ahead_depth(const flx_zcache *z)
{
	return z->nslots >= 4 * FLX_ZCACHE_AHEAD ? FLX_ZCACHE_AHEAD : 0;
}

/* The decision: how many decode-ahead workers a cache of nslots windows
 * runs at most.  One per stream (more would find no stream to take),
 * never more than the online CPUs (a decode is CPU work: more threads
 * only take turns), and one per 4 * FLX_ZCACHE_AHEAD windows: each worker
 * pins a slot while it decodes, so the workers together pin at most a
 * quarter of the cache's windows (none below that: ahead_depth()). */
static uint32_t ahead_workers(size_t nslots)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t n = nslots / (4 * FLX_ZCACHE_AHEAD);

	if (n > FLX_ZCACHE_STREAMS)
		n = FLX_ZCACHE_STREAMS;
	if (cpus >= 1 && n > (size_t)cpus)
		n = (size_t)cpus;
	return (uint32_t)n;
}

static void *ahead_main(void *arg);

/* Under z->mu: a stream wants windows decoded: a parked worker not yet
 * woken takes it, else a new worker while fewer than amax run, else the
 * busy workers take it when their window is done.  A worker that cannot
 * be started leaves the wish to the running ones (none: to the readers,
 * who decode their windows themselves). */
static void ahead_wake(flx_zcache *z)
{
	if (z->aidle > z->apend) {
		z->apend++;
		pthread_cond_signal(&z->acv);
	} else if (z->nthr < z->amax && !z->afailed && !z->astop) {
		if (pthread_create(&z->athr[z->nthr], NULL, ahead_main, z))
			z->afailed = true;
		else
			z->nthr++;
	}
}

/* Reserve len bytes for the slots' windows, aligned to a huge page and
 * advised as such: a window's first fill then faults once per 2 MiB, not
 * once per page, and copies out of it miss the TLB less.  The pages are
 * only touched (in RSS) as windows are filled.  NULL when out of
 * address space. */
static unsigned char *slots_map(size_t len)
{
	size_t all = len + HUGE_ALIGN;
	unsigned char *p =
	    mmap(NULL, all, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	size_t head;

	if (p == MAP_FAILED)
		return NULL;
	head = (HUGE_ALIGN - (uintptr_t)p % HUGE_ALIGN) % HUGE_ALIGN;
	if (head)
		munmap(p, head);
	if (all - head > len)
		munmap(p + head + len, all - head - len);
	p += head;
	(void)madvise(p, len, MADV_HUGEPAGE); /* advice: failure is fine */
	return p;
}

int flx_zcache_new(uint64_t cap, flx_zcache **out)
{
	flx_zcache *z = calloc(1, sizeof(*z));

	if (!z)
		return -ENOMEM;
	z->nslots = (size_t)(cap / FLX_ZCACHE_WINDOW);
	if (z->nslots > INT32_MAX / 2)
		z->nslots = INT32_MAX / 2;
	for (z->nchains = 1; z->nchains < 2 * z->nslots;)
		z->nchains *= 2;
	z->slots = calloc(z->nslots ? z->nslots : 1, sizeof(zslot));
	z->chain = malloc(z->nchains * sizeof(int32_t));
	if (!z->slots || !z->chain) {
		free(z->slots);
		free(z->chain);
		free(z);
		return -ENOMEM;
	}
	memset(z->chain, 0xff, z->nchains * sizeof(int32_t)); /* -1 */
	z->memlen = z->nslots * (size_t)ROOM;
	if (z->nslots && !(z->mem = slots_map(z->memlen))) {
		free(z->slots);
		free(z->chain);
		free(z);
		return -ENOMEM;
	}
	z->amax = ahead_workers(z->nslots);
	pthread_mutex_init(&z->mu, NULL);
	pthread_cond_init(&z->cv, NULL);
	pthread_cond_init(&z->acv, NULL);
	for (int i = 0; i < FLX_ZCACHE_STREAMS; i++)
		pthread_mutex_init(&z->streams[i].mu, NULL);
	*out = z;
	return 0;
}

void flx_zcache_free(flx_zcache *z)
{
	if (!z)
		return;
	pthread_mutex_lock(&z->mu);
	z->astop = true;
	pthread_cond_broadcast(&z->acv);
	pthread_mutex_unlock(&z->mu);
	for (uint32_t i = 0; i < z->nthr; i++)
		pthread_join(z->athr[i], NULL);
	if (z->mem)
		munmap(z->mem, z->memlen);
	for (int i = 0; i < FLX_ZCACHE_STREAMS; i++) {
		zstream *s = &z->streams[i];

		ZSTD_freeDCtx(s->dctx);
		free(s->in);
		free(s->own[0]);
		free(s->own[1]);
		pthread_mutex_destroy(&s->mu);
	}
	pthread_cond_destroy(&z->cv);
	pthread_cond_destroy(&z->acv);
	pthread_mutex_destroy(&z->mu);
	free(z->slots);
	free(z->chain);
	free(z);
}

void flx_zcache_stats_get(flx_zcache *z, flx_zcache_stats *out)
{
	pthread_mutex_lock(&z->mu);
	*out = z->st;
	out->workers = z->nthr;
	pthread_mutex_unlock(&z->mu);
}

void flx_zcache_set_ahead_hook(flx_zcache *z, void (*fn)(void *), void *arg)
{
	pthread_mutex_lock(&z->mu);
	z->ahook = fn;
	z->aarg = arg;
	pthread_mutex_unlock(&z->mu);
}

static bool same(const flx_zitem *a, const flx_zitem *b)
{
	return a->file == b->file && a->off == b->off && a->len == b->len;
}

/* The chain of window w of it. */
static int32_t *chain_of(flx_zcache *z, const flx_zitem *it, uint64_t w)
{
	uint64_t h = (it->file * 0x9e3779b97f4a7c15ull) ^ it->off;

	h = (h ^ (h >> 29) ^ w) * 0xbf58476d1ce4e5b9ull;
	return &z->chain[(h ^ (h >> 32)) & (z->nchains - 1)];
}

/* Under z->mu.  The valid slot of window w of it, or NULL. */
static zslot *find(flx_zcache *z, const flx_zitem *it, uint64_t w)
{
	for (int32_t i = *chain_of(z, it, w); i >= 0; i = z->slots[i].hnext) {
		zslot *sl = &z->slots[i];

		if (sl->win == w && same(&sl->key, it))
			return sl;
	}
	return NULL;
}

/* Under z->mu: take valid slot sl out of its chain. */
static void unlink_slot(flx_zcache *z, zslot *sl)
{
	int32_t *at = chain_of(z, &sl->key, sl->win);

	while (*at != (int32_t)(sl - z->slots))
		at = &z->slots[*at].hnext;
	*at = sl->hnext;
	sl->valid = false;
}

/* Under z->mu: pin sl into *ref. */
static void pin(flx_zcache *z, zslot *sl, zref *ref)
{
	sl->pins++;
	sl->used = ++z->tick;
	*ref = (zref){sl->data, sl->n, sl, NULL};
}

/* Under z->mu: a slot to decode a window into, pinned and out of the
 * cache (least recently used among the unpinned; its pages touched on
 * first use), or NULL when every slot is pinned. */
static void drop_history(zstream *s);

/* Under z->mu: whether take_slot() may take sl though pinned: its one pin
 * is the history of a stream no one has claimed, which then restarts when
 * next used.  So a history is evicted in LRU order like any window. */
static bool history_only(const zslot *sl)
{
	return sl->pins == 1 && sl->hist && !sl->hist->users;
}

static zslot *take_slot(flx_zcache *z)
{
	zslot *best = NULL;

	for (size_t i = 0; i < z->nslots; i++) {
		zslot *sl = &z->slots[i];

		if (sl->pins && !history_only(sl))
			continue;
		if (!sl->valid) {
			best = sl;
			break;
		}
		if (!best || sl->used < best->used)
			best = sl;
	}
	if (!best)
		return NULL;
	if (best->pins) { /* history_only(): that stream restarts */
		zstream *v = best->hist;

		drop_history(v);
		/* unclaimed, so no holder: its own fields are free too */
		v->fresh = v->pfresh = true;
		v->want = 0;
	}
	if (!best->data) { /* first use: its pages are touched now */
		best->data = z->mem + (size_t)(best - z->slots) * ROOM;
		z->st.windows++;
	}
	if (best->valid)
		unlink_slot(z, best);
	best->pins = 1;
	return best;
}

/* Under z->mu: slot sl (from take_slot()) now holds window w of it, n
 * bytes: into the cache, unless another stream of the item put it there
 * first. */
static void publish(flx_zcache *z, zslot *sl, const flx_zitem *it, uint64_t w,
		    size_t n)
{
	sl->key = *it;
	sl->win = w;
	sl->n = n;
	sl->used = ++z->tick;
	if (find(z, it, w))
		return;
	sl->valid = true;
	sl->hnext = *chain_of(z, it, w);
	*chain_of(z, it, w) = (int32_t)(sl - z->slots);
}

/* Under z->mu, s unclaimed or held: s keeps no history (it restarts). */
static void drop_history(zstream *s)
{
	if (s->hslot) {
		s->hslot->pins--;
		s->hslot->hist = NULL;
	}
	s->hslot = NULL;
	s->hist = NULL;
}

/* Under z->mu, s held: s decoded its window next - 1 into buf (slot sl,
 * or NULL: one of its own buffers).  In place, that window is the frame's
 * history for the next one: its slot stays pinned for it and the window
 * before is let go. */
static void keep_history(zstream *s, zslot *sl, unsigned char *buf)
{
	if (!s->inplace)
		return;
	drop_history(s);
	if (sl) {
		sl->pins++;
		sl->hist = s;
	}
	s->hslot = sl;
	s->hist = buf;
}

/* Under z->mu, s held: produce() returned rc after n bytes of window
 * next - 1 into buf (slot sl, or NULL: one of s's own buffers).  The
 * counts, the position others see (pnext, pfresh, pended), and the
 * history kept or let go. */
static void produced(flx_zcache *z, zstream *s, int rc, size_t n, zslot *sl,
		     unsigned char *buf)
{
	z->st.decoded += n;
	if (s->inplace)
		z->st.inplace += n;
	s->pnext = s->next;
	s->pfresh = s->fresh;
	s->pended = s->ended;
	if (rc)
		drop_history(s);
	else
		keep_history(s, sl, buf);
}

/* Under z->mu: the window a stream's next decode gives (0 when fresh). */
static uint64_t pos(const zstream *s)
{
	return s->pfresh ? 0 : s->pnext;
}

/*
 * Under z->mu: claim a stream for window w of it: one of its streams not
 * past w (the furthest), else an unclaimed stream (least recently used,
 * re-keyed), else one of its streams (to restart), else NULL (wait).
 */
static zstream *claim(flx_zcache *z, const flx_ckpt *c, const flx_zitem *it,
		      uint64_t w)
{
	zstream *ahead = NULL, *own = NULL, *idle = NULL;

	for (int i = 0; i < FLX_ZCACHE_STREAMS; i++) {
		zstream *s = &z->streams[i];

		if (s->keyed && same(&s->key, it)) {
			/* a fresh stream stands at the item's start: a
			 * second reader joins it rather than decoding the
			 * same first windows on a stream of its own */
			uint64_t at = pos(s);

			if (at <= w && (!ahead || at > pos(ahead)))
				ahead = s;
			own = s;
		} else if (!s->users && (!idle || s->used < idle->used)) {
			idle = s;
		}
	}
	if (!ahead && idle) {
		drop_history(idle);
		idle->key = *it;
		idle->keyed = true;
		/* unclaimed, so no holder: its own fields are free too */
		idle->fresh = idle->pfresh = true;
		idle->want = 0;
		idle->c = c;
		ahead = idle;
	}
	if (!ahead)
		ahead = own;
	if (ahead) {
		ahead->users++;
		ahead->used = ++z->tick;
	}
	return ahead;
}

/* Under z->mu: the holder of busy stream s (its mutex released) lets it
 * go and unclaims it; the worker is told if s is wanted further. */
static void let_go(flx_zcache *z, zstream *s)
{
	s->busy = false;
	s->users--;
	pthread_cond_broadcast(&z->cv);
	if (s->pnext < s->want)
		ahead_wake(z);
}

/* Under s->mu: frame bytes [in_off, in_off + n) into dst, the file checked
 * unchanged since mount first.  -EIO where the frame ends first. */
static int frame_read(const flx_ckpt *c, zstream *s, unsigned char *dst,
		      size_t n)
{
	int rc;

	if (n > s->key.len - s->in_off ||
	    flx_file_verify(c, &c->files[s->key.file], false))
		return -EIO;
	rc = flx_file_pread(c, s->key.file, dst, n, s->key.off + s->in_off);
	if (!rc)
		s->in_off += n;
	return rc;
}

/* Under s->mu: at least need bytes of the frame from in + in_pos on,
 * what is left moved to the front and more read behind it: as much as
 * the buffer holds, or (exact) no more than need.  -EIO where the frame
 * ends first. */
static int input(const flx_ckpt *c, zstream *s, size_t need, bool exact)
{
	size_t left = s->in_len - s->in_pos, n = (exact ? need : IN_CAP) - left;
	int rc;

	if (left >= need)
		return 0;
	if (need > IN_CAP)
		return -EIO;
	memmove(s->in, s->in + s->in_pos, left);
	s->in_pos = 0;
	s->in_len = left;
	if (n > s->key.len - s->in_off)
		n = (size_t)(s->key.len - s->in_off);
	if (left + n < need)
		return -EIO;
	if ((rc = frame_read(c, s, s->in + left, n)))
		return rc;
	s->in_len = left + n;
	return 0;
}

/* The decision: whether a frame of this header is decoded in place (its
 * back-references reach no further than the window before: every
 * window is decoded after at least FLX_ZCACHE_WINDOW - ZSTD_BLOCKSIZE_MAX
 * bytes of the one before, the block that crossed its start aside). */
static bool in_place(const ZSTD_frameHeader *fh)
{
	return fh->frameType == ZSTD_frame &&
	       fh->windowSize <= FLX_ZCACHE_WINDOW - ZSTD_BLOCKSIZE_MAX;
}

/* Under s->mu: back to the frame's first byte, its header read to choose
 * the decoder.  The caller lets the stream's history go (drop_history(),
 * under the cache lock). */
static int restart(const flx_ckpt *c, zstream *s)
{
	ZSTD_frameHeader fh;
	size_t r;
	int rc;

	if (!s->dctx) {
		s->dctx = ZSTD_createDCtx();
		s->in = malloc(IN_CAP);
		if (!s->dctx || !s->in)
			return -ENOMEM;
	}
	s->in_pos = s->in_len = 0;
	s->in_off = 0;
	s->next = 0;
	s->ended = false;
	s->fresh = true; /* until the end: a failure leaves it to restart */
	s->out_n = 0;
	s->lent = NULL;
	s->raw = false;
	if ((rc = input(c, s, 1, false)))
		return rc;
	r = ZSTD_getFrameHeader(&fh, s->in, s->in_len);
	if (ZSTD_isError(r) || r > 0)
		return -EIO; /* not a frame, or shorter than its header */
	s->inplace = in_place(&fh);
	if (s->inplace) {
		if (ZSTD_isError(ZSTD_decompressBegin(s->dctx)))
			return -ENOMEM;
	} else {
		ZSTD_DCtx_reset(s->dctx, ZSTD_reset_session_only);
		if (ZSTD_isError(ZSTD_DCtx_setParameter(
			s->dctx, ZSTD_d_windowLogMax, FLX_ZSTD_WINDOW_LOG_MAX)))
			return -ENOMEM;
	}
	s->fresh = false;
	return 0;
}

/* Under s->mu: decode window s->next into dst (FLX_ZCACHE_WINDOW bytes)
 * through libzstd's streaming decoder. */
static int produce_stream(const flx_ckpt *c, zstream *s, unsigned char *dst,
			  size_t *decoded)
{
	ZSTD_outBuffer o = {dst, FLX_ZCACHE_WINDOW, 0};
	int rc = 0;

	while (o.pos < o.size && !s->ended && !(rc = input(c, s, 1, false))) {
		ZSTD_inBuffer in = {s->in, s->in_len, s->in_pos};
		size_t ret = ZSTD_decompressStream(s->dctx, &o, &in);

		s->in_pos = in.pos;
		if (ZSTD_isError(ret))
			rc = -EIO;
		else if (ret == 0)
			s->ended = true;
		if (rc)
			break;
	}
	*decoded = o.pos;
	return rc;
}

/* Under s->mu: one step of the buffer-less decoder (a header, a block,
 * the checksum) writing at at (room bytes), *r bytes written.  A raw
 * block (stored: what zstd writes for bytes it cannot compress) is read
 * from the file straight to where it goes, after what the input buffer
 * holds of it, and libzstd moves it onto itself: no copy.  Its header,
 * and the header after it, are read alone, so that the buffer does not
 * take the block's bytes first. */
static int step(const flx_ckpt *c, zstream *s, unsigned char *at, size_t room,
		size_t *r)
{
	size_t need = ZSTD_nextSrcSizeToDecompress(s->dctx),
	       left = s->in_len - s->in_pos;
	ZSTD_nextInputType_e t = ZSTD_nextInputType(s->dctx);
	const unsigned char *src;
	int rc;

	if (t == ZSTDnit_block && s->raw && need > left && need <= room) {
		memcpy(at, s->in + s->in_pos, left);
		if ((rc = frame_read(c, s, at + left, need - left)))
			return rc;
		s->in_pos = s->in_len = 0;
		src = at;
	} else {
		if ((rc =
			 input(c, s, need, t == ZSTDnit_blockHeader && s->raw)))
			return rc;
		src = s->in + s->in_pos;
		s->in_pos += need;
	}
	if (t == ZSTDnit_blockHeader) /* 3 bytes, little-endian: type 0 raw */
		s->raw = ((src[0] >> 1) & 3) == 0;
	*r = ZSTD_decompressContinue(s->dctx, at, room, src, need);
	return ZSTD_isError(*r) ? -EIO : 0;
}

/* Under s->mu: decode window s->next in place into dst (ROOM bytes, not
 * s->hist): first the bytes of the block that crossed into it from hist,
 * then block after block until it is full, the last block running on
 * into dst's room past the window. */
static int produce_in_place(const flx_ckpt *c, zstream *s, unsigned char *dst,
			    size_t *decoded)
{
	size_t pos = 0;
	int rc = 0;

	if (s->next > 0 && s->hn > FLX_ZCACHE_WINDOW) {
		pos = s->hn - FLX_ZCACHE_WINDOW;
		memcpy(dst, s->hist + FLX_ZCACHE_WINDOW, pos);
	}
	while (pos < FLX_ZCACHE_WINDOW && !s->ended) {
		size_t r = 0;

		if (ZSTD_nextSrcSizeToDecompress(s->dctx) == 0) {
			s->ended = true;
			break;
		}
		if ((rc = step(c, s, dst + pos, ROOM - pos, &r)))
			break;
		pos += r;
	}
	/* a window full at the frame's last block: its checksum now, so the
	 * frame's end is checked before its last window is served */
	while (!rc && !s->ended &&
	       ZSTD_nextInputType(s->dctx) == ZSTDnit_checksum) {
		size_t r;

		rc = step(c, s, dst + pos, ROOM - pos, &r);
	}
	/* ended: no window after this one (none of the frame's bytes past
	 * the window's end) */
	if (!rc && ZSTD_nextSrcSizeToDecompress(s->dctx) == 0 &&
	    pos <= FLX_ZCACHE_WINDOW)
		s->ended = true;
	s->hn = pos;
	*decoded = pos < FLX_ZCACHE_WINDOW ? pos : FLX_ZCACHE_WINDOW;
	return rc;
}

/* Under s->mu: decode window s->next into dst (ROOM bytes; in place, not
 * s->hist).  A frame that fails or ends without its end (the file changed
 * since mount) is -EIO and leaves the stream to restart. */
static int produce(const flx_ckpt *c, zstream *s, unsigned char *dst,
		   size_t *decoded)
{
	int rc = s->inplace ? produce_in_place(c, s, dst, decoded)
			    : produce_stream(c, s, dst, decoded);

	s->next++;
	if (rc)
		s->fresh = true;
	return rc;
}

/* Under s->mu: a buffer of the stream's own for its next window where no
 * slot takes it (not its history), or NULL when memory is short. */
static unsigned char *own_buffer(zstream *s)
{
	int i = s->own[0] && s->own[0] == s->hist ? 1 : 0;

	if (!s->own[i])
		s->own[i] = malloc(ROOM);
	return s->own[i];
}

/* Under z->mu: a reader got window w of it.  The stream of it furthest
 * past w but at most the decode-ahead depth past it is the one the reader
 * follows (the one claim() gives it next): it is to be decoded that far
 * past w (the worker started on first use).  One stream only: two streams
 * of an item that meet would otherwise decode the same windows twice. */
static void ahead_note(flx_zcache *z, const flx_zitem *it, uint64_t w)
{
	uint64_t d = ahead_depth(z);
	zstream *f = NULL;

	if (!d || z->astop || (z->afailed && !z->nthr))
		return;
	for (int i = 0; i < FLX_ZCACHE_STREAMS; i++) {
		zstream *s = &z->streams[i];

		if (s->keyed && same(&s->key, it) && !s->pfresh && !s->pended &&
		    s->pnext > w && s->pnext <= w + 1 + d &&
		    (!f || s->pnext > f->pnext))
			f = s;
	}
	if (!f || f->want >= w + 1 + d)
		return;
	f->want = w + 1 + d;
	if (!f->busy)
		ahead_wake(z);
}

/* Under z->mu: the stream furthest behind its want, or NULL. */
static zstream *ahead_pick(flx_zcache *z)
{
	zstream *best = NULL;

	for (int i = 0; i < FLX_ZCACHE_STREAMS; i++) {
		zstream *s = &z->streams[i];

		if (!s->keyed || s->busy || s->pfresh || s->pended ||
		    s->pnext >= s->want)
			continue;
		if (!best || s->want - s->pnext > best->want - best->pnext)
			best = s;
	}
	return best;
}

/* Under s->mu, claimed by the worker: decode one wanted window of s into
 * a cache slot.  No slot to take: s is wanted no further.  A failure
 * leaves s to restart (fresh) for the reader that comes to it, which
 * then gets the error itself. */
static void ahead_one(flx_zcache *z, zstream *s)
{
	const flx_ckpt *c;
	zslot *dst = NULL;
	size_t n = 0;
	int rc;

	pthread_mutex_lock(&z->mu);
	c = s->c;
	if (!s->fresh && !s->ended && s->next < s->want &&
	    !(dst = take_slot(z)))
		s->want = 0;
	if (dst && ++z->adec > z->st.ahead_peak)
		z->st.ahead_peak = z->adec;
	pthread_mutex_unlock(&z->mu);
	if (!dst)
		return;
	if (z->ahook)
		z->ahook(z->aarg);
	rc = produce(c, s, dst->data, &n);
	pthread_mutex_lock(&z->mu);
	z->adec--;
	z->st.ahead += n;
	produced(z, s, rc, n, dst, dst->data);
	if (!rc && n)
		publish(z, dst, &s->key, s->next - 1, n);
	dst->pins--;
	pthread_mutex_unlock(&z->mu);
}

static void *ahead_main(void *arg)
{
	flx_zcache *z = arg;

	pthread_mutex_lock(&z->mu);
	while (!z->astop) {
		zstream *s = ahead_pick(z);

		if (!s) {
			z->aidle++;
			while (!z->apend && !z->astop)
				pthread_cond_wait(&z->acv, &z->mu);
			z->aidle--;
			if (z->apend)
				z->apend--;
			continue;
		}
		s->users++; /* its item stays while the worker decodes */
		s->busy = true;
		z->abusy++;
		pthread_mutex_unlock(&z->mu);
		pthread_mutex_lock(&s->mu);
		ahead_one(z, s);
		pthread_mutex_unlock(&s->mu);
		pthread_mutex_lock(&z->mu);
		s->busy = false;
		s->users--;
		z->abusy--;
		pthread_cond_broadcast(&z->cv);
	}
	pthread_mutex_unlock(&z->mu);
	return NULL;
}

void flx_zcache_settle(flx_zcache *z)
{
	pthread_mutex_lock(&z->mu);
	while (z->nthr && !z->astop && (ahead_pick(z) || z->abusy))
		pthread_cond_wait(&z->cv, &z->mu);
	pthread_mutex_unlock(&z->mu);
}

/*
 * Pin window w of it: from the cache, or decoded by a claimed stream (its
 * windows up to w entering the cache).  @return 0 and *ref (release with
 * put()), -EIO, -ENOMEM.
 */
static int get(flx_zcache *z, const flx_ckpt *c, const flx_zitem *it,
	       uint64_t w, zref *ref)
{
	zslot *sl;
	zstream *s;
	int rc = 0;

	pthread_mutex_lock(&z->mu);
	if ((sl = find(z, it, w))) {
		z->st.hits++;
		pin(z, sl, ref);
		ahead_note(z, it, w);
		pthread_mutex_unlock(&z->mu);
		return 0;
	}
	while (!(s = claim(z, c, it, w)))
		pthread_cond_wait(&z->cv, &z->mu);
	/* Whoever holds the stream may be decoding w: wait for w to be
	 * published or the stream let go, not for the holder's whole run
	 * (a reader further on decodes up to its own window). */
	while (!(sl = find(z, it, w)) && s->busy)
		pthread_cond_wait(&z->cv, &z->mu);
	if (sl) {
		z->st.hits++;
		pin(z, sl, ref);
		ahead_note(z, it, w);
		s->users--;
		pthread_cond_broadcast(&z->cv);
		pthread_mutex_unlock(&z->mu);
		return 0;
	}
	z->st.misses++;
	s->busy = true;
	pthread_mutex_unlock(&z->mu);

	pthread_mutex_lock(&s->mu);
	if (s->fresh || s->next > w) {
		rc = restart(c, s);
		pthread_mutex_lock(&z->mu);
		drop_history(s);
		z->st.restarts++;
		s->pnext = s->next;
		s->pfresh = s->fresh;
		s->pended = s->ended;
		s->want = 0; /* a reader behind it: wishes of before are void */
		pthread_mutex_unlock(&z->mu);
	}
	/* Each window is decoded straight into a cache slot (or, none free,
	 * into one of the stream's own); the one asked for stays pinned for
	 * the caller, or the stream is lent with its buffer. */
	while (!rc && s->next <= w) {
		size_t n = 0;
		zslot *dst;
		unsigned char *buf;

		if (s->ended) {
			rc = -EIO; /* the content ends before w */
			break;
		}
		pthread_mutex_lock(&z->mu);
		dst = take_slot(z);
		pthread_mutex_unlock(&z->mu);
		buf = dst ? dst->data : own_buffer(s);
		if (buf) {
			rc = produce(c, s, buf, &n);
		} else {
			s->fresh = true; /* its history is let go below */
			rc = -ENOMEM;
		}
		pthread_mutex_lock(&z->mu);
		produced(z, s, rc, n, dst, buf);
		if (dst && !rc && n) {
			publish(z, dst, it, s->next - 1, n);
			pthread_cond_broadcast(&z->cv);
		}
		if (dst && !rc && s->next > w) {
			*ref = (zref){dst->data, n, dst, NULL};
			sl = dst; /* pinned by take_slot() */
		} else if (dst) {
			dst->pins--;
		} else {
			s->lent = buf;
			s->out_n = n;
		}
		pthread_mutex_unlock(&z->mu);
	}
	if (!rc && !sl) { /* lend the stream's window, its mutex held */
		*ref = (zref){s->lent, s->out_n, NULL, s};
		return 0;
	}
	pthread_mutex_unlock(&s->mu);
	pthread_mutex_lock(&z->mu);
	if (!rc)
		ahead_note(z, it, w);
	let_go(z, s);
	pthread_mutex_unlock(&z->mu);
	return rc;
}

static void put(flx_zcache *z, zref *ref)
{
	if (ref->slot) {
		pthread_mutex_lock(&z->mu);
		ref->slot->pins--;
		pthread_mutex_unlock(&z->mu);
	} else if (ref->s) {
		pthread_mutex_unlock(&ref->s->mu);
		pthread_mutex_lock(&z->mu);
		let_go(z, ref->s);
		pthread_mutex_unlock(&z->mu);
	}
	*ref = (zref){0};
}

/* A reader's position: the window it has pinned (held: ref valid). */
typedef struct zcur {
	flx_zcache *z;
	const flx_ckpt *c;
	const flx_zitem *it;
	zref ref;
	uint64_t w;
	bool held;
} zcur;

/* Copy content bytes [a, a+n) of the item into dst. */
static int copy(zcur *k, uint64_t a, unsigned char *dst, size_t n)
{
	while (n) {
		uint64_t w = a / FLX_ZCACHE_WINDOW;
		size_t at = (size_t)(a % FLX_ZCACHE_WINDOW), m;
		int rc;

		if (k->held && k->w != w) {
			put(k->z, &k->ref);
			k->held = false;
		}
		if (!k->held) {
			rc = get(k->z, k->c, k->it, w, &k->ref);
			if (rc)
				return rc;
			k->held = true;
			k->w = w;
		}
		if (k->ref.n <= at)
			return -EIO; /* the content ends before a */
		m = k->ref.n - at < n ? k->ref.n - at : n;
		memcpy(dst, k->ref.data + at, m);
		dst += m;
		a += m;
		n -= m;
	}
	return 0;
}

int flx_zcache_read(flx_zcache *z, const flx_ckpt *c, const flx_zitem *it,
		    uint64_t src, uint64_t stride, unsigned esz, uint64_t skip,
		    void *dst, size_t len)
{
	flx_zcache *own = NULL;
	zcur k = {.c = c, .it = it};
	unsigned char *d = dst;
	int rc = 0;

	/* cached windows too: a file changed since mount is EIO, as for
	 * plain chunks, even where the bytes are at hand */
	if (flx_file_verify(c, &c->files[it->file], false))
		return -EIO;
	if (!z && (rc = flx_zcache_new(0, &own)))
		return rc;
	k.z = z ? z : own;
	if (stride == esz) {
		rc = copy(&k, src + skip, d, len);
	} else {
		uint64_t e = skip / esz;
		size_t in = (size_t)(skip % esz);

		for (size_t done = 0; done < len && !rc; e++, in = 0) {
			size_t m =
			    esz - in < len - done ? esz - in : len - done;

			rc = copy(&k, src + e * stride + in, d + done, m);
			done += m;
		}
	}
	if (k.held)
		put(k.z, &k.ref);
	if (!rc) {
		pthread_mutex_lock(&k.z->mu);
		k.z->st.served += len;
		pthread_mutex_unlock(&k.z->mu);
	}
	flx_zcache_free(own);
	return rc;
}

size_t flx_zcache_windows(uint64_t a, uint64_t n, size_t max)
{
	uint64_t k;

	if (n == 0 || a + n < a)
		return 0;
	k = (a + n - 1) / FLX_ZCACHE_WINDOW - a / FLX_ZCACHE_WINDOW + 1;
	return k <= max ? (size_t)k : 0;
}

int flx_zcache_pin(flx_zcache *z, const flx_ckpt *c, const flx_zitem *it,
		   uint64_t a, flx_zpin *out)
{
	size_t at = (size_t)(a % FLX_ZCACHE_WINDOW);
	zref ref;
	int rc;

	*out = (flx_zpin){0};
	if (!z->nslots)
		return -ENOBUFS;
	if (flx_file_verify(c, &c->files[it->file], false))
		return -EIO;
	rc = get(z, c, it, a / FLX_ZCACHE_WINDOW, &ref);
	if (rc)
		return rc;
	if (!ref.slot || ref.n <= at) {
		/* the content ends before a, or lent by a stream: no slot */
		rc = ref.n <= at ? -EIO : -ENOBUFS;
		put(z, &ref);
		return rc;
	}
	*out = (flx_zpin){ref.data, ref.n, ref.slot};
	return 0;
}

void flx_zcache_unpin(flx_zcache *z, flx_zpin *p, size_t served)
{
	zref ref = {.slot = p->slot};

	if (p->slot) {
		pthread_mutex_lock(&z->mu);
		z->st.served += served;
		pthread_mutex_unlock(&z->mu);
		put(z, &ref);
	}
	*p = (flx_zpin){0};
}

bool flx_ckpt_has_zstd(const flx_ckpt *c)
{
	for (size_t i = 0; i < c->nobjects; i++)
		if (c->objects[i].zstd)
			return true;
	for (size_t i = 0; i < c->ntensors; i++)
		for (uint32_t k = 0; k < c->tensors[i].nchunks; k++)
			if (c->tensors[i].chunks[k].zstd)
				return true;
	return false;
}
