/* SPDX-License-Identifier: MIT */
/*
 * The distributed mount over MPI (mpi_mount.h).
 *
 * Three communicators, duplicated from MPI_COMM_WORLD so that nothing
 * else's traffic can match ours: coll for the collective steps, req for
 * requests and the end notice (received only by the service thread, any
 * tag), rep for replies (received by the reading thread that asked, under
 * a tag of its own).  Messages:
 *
 *   request (req, TAG_REQ): u32 nspans, u32 reply tag, then per span
 *       u32 file id, u32 0, u64 offset, u64 length
 *   reply (rep, the request's tag): i32 status (0 or -errno), u32 the
 *       failed file's id + 1 (0: none or unknown), then the spans' bytes
 *       in order (status 0 only)
 *   end (req, TAG_END): no payload; then two barriers on coll decide
 *       whether every rank finalizes (flx_dm_end())
 *
 * Waits never block in MPI: they poll (MPI_Test, MPI_Iprobe) with a short
 * sleep that grows while nothing comes, so that an idle daemon costs no
 * CPU and every wait can end at a deadline.
 */
#include "mpi_mount.h"

#include "source.h"

#include "bcache.h"
#include "grow.h"
#include "reader.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define TAG_REQ		  1
#define TAG_END		  2
#define SPAN_WIRE	  24	     /* bytes of a span in a request */
#define REQ_MAX_SPANS	  4096	     /* spans one request carries */
#define DIGEST_BUF	  (8u << 20) /* bytes one digest read takes */
#define DIGEST_THREADS	  4	     /* files digested at once */
#define DEFAULT_TIMEOUT_S 30
#define NAME_MAX_WIRE	  4096
#define BCAST_MAX	  (256u << 20) /* largest metadata file broadcast */

typedef struct dm_file {
	char *name;
	uint64_t size;
	int64_t mtime_ns;
	int fd;		/* this rank's copy, O_RDONLY; -1: held elsewhere */
	struct stat st; /* its identity when listed */
	int *holders;	/* ranks, ascending */
	int nholders;
	unsigned char *mem; /* broadcast at start (is_broadcast()), or NULL */
} dm_file;

struct flx_dm {
	int rank, size;
	MPI_Comm coll, req, rep;
	unsigned timeout_s;
	dm_file *files; /* sorted by name: the id is the index, as on every
			 * rank */
	size_t nfiles;
	char format[64];
	char *dir;     /* the directory this rank opens (flx_dm_dir()) */
	char *tmpdir;  /* an empty one of ours, removed at the end, or NULL */
	char *entered; /* the save directory's subdirectory entered, or NULL */
	flx_file_backend be;
	flx_bcache
	    *cache; /* remote blocks kept (flx_dm_set_cache()), or NULL */
	pthread_t svc;
	bool svc_started;
	atomic_bool stop;   /* the service thread returns */
	atomic_bool ending; /* the mount ends: reads fail at once */
	atomic_bool told;   /* another rank said the mount ends */
	bool up; /* the exchange succeeded on every rank: the end protocol
		  * runs (flx_dm_end()) */
	atomic_uchar *dead; /* per rank: 0 alive, else a DEAD_* reason */
	/* per rank: answered a read with an error: the file's id + 1 it
	 * named, UINT32_MAX when it named none; 0: never */
	atomic_uint *refused;
	atomic_uint next_tag;
	int tag_ub;
	flx_dm_stats st;    /* atomically updated fields */
	pthread_mutex_t mu; /* on_end, on_end_arg */
	void (*on_end)(void *);
	void *on_end_arg;
};

/* The cause of this thread's last backend read, when it failed (""
 * after a success): the thread that reads is the one that logs the EIO,
 * so that a cause is never given to another read's failure. */
static _Thread_local char last_why[256];

/* Why a rank is taken for dead (flx_dm.dead): it did not answer within
 * the timeout, MPI reported its connection failed (it ended), or it
 * stopped taking this rank's replies. */
enum { DEAD_TIMEOUT = 1, DEAD_GONE, DEAD_NOREAD };

static void mark_dead(flx_dm *m, int rank, unsigned char why)
{
	unsigned char alive = 0;

	atomic_compare_exchange_strong(&m->dead[rank], &alive, why);
}

/* ---- small helpers ---- */

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * Sleep a little, longer each time nothing happened, up to cap us.  The
 * caps trade latency for idle wakeups: a reader waiting for a reply polls
 * at least every POLL_READ us, an idle service thread every POLL_IDLE us
 * (about 5,000 wakeups a second, a small fraction of a core).
 */
#define POLL_READ 50
#define POLL_IDLE 200
static void backoff(unsigned *us, unsigned cap)
{
	struct timespec ts = {0, (long)*us * 1000};

	nanosleep(&ts, NULL);
	if (*us < cap)
		*us *= 2;
}

static void put32(unsigned char *p, uint32_t v)
{
	memcpy(p, &v, 4);
}
static void put64(unsigned char *p, uint64_t v)
{
	memcpy(p, &v, 8);
}
static uint32_t get32(const unsigned char *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}
static uint64_t get64(const unsigned char *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v;
}

/* XXH3-64 (libxxhash) of fd's size bytes, read in sequential preads of
 * bufsize bytes into buf: the digest of the copies that several ranks
 * hold.  Whole files are hashed at mount, so speed is what matters; it
 * detects a stale or damaged copy, not an adversary, who could as well
 * change .metadata. */
static int file_digest(int fd, uint64_t size, unsigned char *buf,
		       size_t bufsize, uint64_t *out)
{
	XXH3_state_t *st = XXH3_createState();
	int rc = 0;

	if (!st)
		return -ENOMEM;
	if (XXH3_64bits_reset(st) != XXH_OK) {
		rc = -EIO;
		goto out;
	}
	for (uint64_t at = 0; at < size;) {
		size_t k = size - at < bufsize ? (size_t)(size - at) : bufsize;

		rc = flx_pread_full(fd, buf, k, at);
		if (rc)
			goto out;
		if (XXH3_64bits_update(st, buf, k) != XXH_OK) {
			rc = -EIO;
			goto out;
		}
		at += k;
	}
	*out = XXH3_64bits_digest(st);
out:
	XXH3_freeState(st);
	return rc;
}

/* ---- start ---- */

int flx_dm_init(int *argc, char ***argv, unsigned timeout_s, flx_dm **out,
		flx_error *err)
{
	flx_dm *m;
	int provided = 0, flag = 0, *ub = NULL;

	if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) !=
	    MPI_SUCCESS)
		return flx_error_set(err, -EIO, NULL, "mpi", "MPI_Init failed");
	if (provided < MPI_THREAD_MULTIPLE) {
		MPI_Finalize();
		return flx_error_set(err, -ENOTSUP, NULL, "mpi",
				     "this MPI does not provide "
				     "MPI_THREAD_MULTIPLE");
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		MPI_Finalize();
		return flx_error_set(err, -ENOMEM, NULL, NULL, "out of memory");
	}
	pthread_mutex_init(&m->mu, NULL);
	MPI_Comm_rank(MPI_COMM_WORLD, &m->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &m->size);
	MPI_Comm_dup(MPI_COMM_WORLD, &m->coll);
	MPI_Comm_dup(MPI_COMM_WORLD, &m->req);
	MPI_Comm_dup(MPI_COMM_WORLD, &m->rep);
	/* a failure is an error code here, never an abort of the job */
	MPI_Comm_set_errhandler(m->coll, MPI_ERRORS_RETURN);
	MPI_Comm_set_errhandler(m->req, MPI_ERRORS_RETURN);
	MPI_Comm_set_errhandler(m->rep, MPI_ERRORS_RETURN);
	MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
	m->tag_ub = flag && ub && *ub > 100 ? *ub : 32767;
	m->timeout_s = timeout_s ? timeout_s : DEFAULT_TIMEOUT_S;
	m->dead = calloc((size_t)m->size, sizeof(*m->dead));
	m->refused = calloc((size_t)m->size, sizeof(*m->refused));
	if (!m->dead || !m->refused) {
		flx_dm_end(m);
		return flx_error_set(err, -ENOMEM, NULL, NULL, "out of memory");
	}
	*out = m;
	return 0;
}

int flx_dm_rank(const flx_dm *m)
{
	return m->rank;
}

int flx_dm_size(const flx_dm *m)
{
	return m->size;
}

int flx_dm_subst(const char *s, int rank, char **out)
{
	static const char key[] = "{rank}";
	char num[16], *o;
	size_t n = 0, k = (size_t)snprintf(num, sizeof(num), "%d", rank);
	const char *p;

	for (p = s; (p = strstr(p, key)); p += sizeof(key) - 1)
		n++;
	o = malloc(strlen(s) + n * k + 1);
	if (!o)
		return -ENOMEM;
	*out = o;
	while ((p = strstr(s, key))) {
		memcpy(o, s, (size_t)(p - s));
		o += p - s;
		memcpy(o, num, k);
		o += k;
		s = p + sizeof(key) - 1;
	}
	strcpy(o, s);
	return 0;
}

int flx_dm_agree(flx_dm *m, int rc, flx_error *err)
{
	int mine = rc ? m->rank : INT_MAX, first = INT_MAX;
	flx_error e;

	if (MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, m->coll) !=
	    MPI_SUCCESS)
		return flx_error_set(err, -EIO, NULL, "mpi",
				     "the ranks cannot agree (MPI_Allreduce "
				     "failed)");
	if (first == INT_MAX)
		return 0;
	flx_error_init(&e);
	if (m->rank == first) {
		if (err && err->code)
			e = *err;
		else
			flx_error_set(&e, rc, NULL, NULL, "%s", strerror(-rc));
	}
	MPI_Bcast(&e, (int)sizeof(e), MPI_BYTE, first, m->coll);
	if (err) {
		char file[FLX_ERR_FIELD];

		snprintf(file, sizeof(file), "rank %d%s%.200s", first,
			 e.file[0] ? ": " : "", e.file);
		memcpy(e.file, file, sizeof(file));
		*err = e;
	}
	return e.code ? e.code : -EIO;
}

/* ---- the exchange ---- */

/* Free n entries of f, and the array when whole. */
static void files_free(dm_file *f, size_t n, bool whole)
{
	for (size_t i = 0; i < n; i++) {
		free(f[i].name);
		free(f[i].holders);
		free(f[i].mem);
		if (f[i].fd >= 0)
			close(f[i].fd);
	}
	if (whole)
		free(f);
}

/*
 * The files exchanged: regular files at most DEPTH_MAX components deep
 * (a source's per-rank or per-part subdirectories), FILES_MAX in all;
 * symlinks and other types are never followed or served.  A name, local or a
 * peer's, is a plain relative path (name_ok()).
 */
#define DEPTH_MAX 4
#define FILES_MAX 65536

/* A plain relative path of at most DEPTH_MAX components: not empty, no
 * empty, "." or ".." component, shorter than NAME_MAX_WIRE; k bytes. */
static bool name_ok(const char *p, size_t k)
{
	unsigned depth = 0;

	if (!k || k >= NAME_MAX_WIRE || memchr(p, '\0', k))
		return false;
	for (size_t at = 0; at <= k;) {
		const char *e = memchr(p + at, '/', k - at);
		size_t n = e ? (size_t)(e - (p + at)) : k - at;

		if (!n || (n == 1 && p[at] == '.') ||
		    (n == 2 && p[at] == '.' && p[at + 1] == '.') ||
		    ++depth > DEPTH_MAX)
			return false;
		at += n + 1;
	}
	return true;
}

typedef struct lister {
	dm_file *f;
	size_t n, cap;
	flx_error *err;
	const char *dir;
} lister;

/* Add regular file fd (prefix + name) to the list; takes fd. */
static int list_add(lister *l, int fd, const struct stat *st, const char *rel)
{
	dm_file *x;

	if (l->n == FILES_MAX) {
		close(fd);
		return flx_error_set(l->err, -E2BIG, l->dir, NULL,
				     "more than %d files to exchange",
				     FILES_MAX);
	}
	if (flx_grow((void **)&l->f, &l->cap, l->n + 1, sizeof(*l->f))) {
		close(fd);
		return -ENOMEM;
	}
	x = &l->f[l->n++];
	memset(x, 0, sizeof(*x));
	x->fd = fd;
	x->st = *st;
	x->size = (uint64_t)st->st_size;
	x->mtime_ns =
	    (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
	x->name = strdup(rel);
	return x->name ? 0 : -ENOMEM;
}

/* The entries of directory dfd (owned: closed here), prefix its relative
 * path ("" or "rank_0/"), depth its components. */
static int list_dir(lister *l, int dfd, const char *prefix, unsigned depth)
{
	DIR *d = fdopendir(dfd);
	struct dirent *de;
	int rc = 0;

	if (!d) {
		rc = -errno;
		close(dfd);
		return flx_error_set(l->err, rc, l->dir, prefix,
				     "cannot list: %s", strerror(-rc));
	}
	while (!rc && (de = readdir(d))) {
		char rel[NAME_MAX_WIRE];
		struct stat st;
		int fd, n;

		n = snprintf(rel, sizeof(rel), "%s%s", prefix, de->d_name);
		if (n < 0 || !name_ok(rel, (size_t)n))
			continue; /* ".", "..", too long or too deep */
		fd = openat(dirfd(d), de->d_name,
			    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		if (fd < 0)
			continue; /* a symlink, a socket: not served */
		if (fstat(fd, &st)) {
			close(fd);
		} else if (S_ISREG(st.st_mode)) {
			rc = list_add(l, fd, &st, rel);
		} else if (S_ISDIR(st.st_mode) && depth + 1 < DEPTH_MAX &&
			   (size_t)n + 1 < sizeof(rel)) {
			rel[n] = '/';
			rel[n + 1] = '\0';
			rc = list_dir(l, fd, rel, depth + 1);
		} else {
			close(fd);
		}
	}
	closedir(d);
	return rc;
}

/* dir's regular files (see DEPTH_MAX), opened, with their identity. */
static int list_local(const char *dir, dm_file **out, size_t *nout,
		      flx_error *err)
{
	lister l = {.err = err, .dir = dir};
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc;

	if (dfd < 0)
		return flx_error_set(err, -errno, dir, NULL,
				     "cannot open checkpoint directory: %s",
				     strerror(errno));
	rc = list_dir(&l, dfd, "", 0);
	if (rc) {
		files_free(l.f, l.n, true);
		return flx_error_default(err, rc, dir);
	}
	*out = l.f;
	*nout = l.n;
	return 0;
}

/* The list as bytes: per file u32 name length, name, u64 size,
 * i64 mtime (LIST_WIRE bytes besides the name). */
#define LIST_WIRE 20
static int pack(const dm_file *f, size_t n, unsigned char **out, int *len)
{
	size_t total = 0;
	unsigned char *b, *p;

	for (size_t i = 0; i < n; i++)
		total += strlen(f[i].name) + LIST_WIRE;
	if (total > INT_MAX / 2)
		return -E2BIG;
	b = malloc(total ? total : 1);
	if (!b)
		return -ENOMEM;
	p = b;
	for (size_t i = 0; i < n; i++) {
		uint32_t k = (uint32_t)strlen(f[i].name);

		put32(p, k);
		memcpy(p + 4, f[i].name, k);
		p += 4 + k;
		put64(p, f[i].size);
		put64(p + 8, (uint64_t)f[i].mtime_ns);
		p += 16;
	}
	*out = b;
	*len = (int)total;
	return 0;
}

typedef struct entry {
	const char *name; /* into the gathered bytes */
	uint32_t nlen;
	uint64_t size;
	int64_t mtime_ns;
	int rank;
	size_t local; /* index into this rank's list, or SIZE_MAX */
} entry;

static int cmp_entry(const void *a, const void *b)
{
	const entry *x = a, *y = b;
	uint32_t n = x->nlen < y->nlen ? x->nlen : y->nlen;
	int c = memcmp(x->name, y->name, n);

	if (c)
		return c;
	if (x->nlen != y->nlen)
		return x->nlen < y->nlen ? -1 : 1;
	return x->rank - y->rank;
}

/* Every rank's list, unpacked into one array sorted by name, then rank. */
static int unpack_all(const unsigned char *all, const int *lens,
		      const int *offs, int nranks, int me, entry **out,
		      size_t *nout)
{
	entry *e = NULL;
	size_t n = 0, cap = 0, mine = 0;

	for (int r = 0; r < nranks; r++) {
		const unsigned char *p = all + offs[r], *end = p + lens[r];

		while (p < end) {
			uint32_t k = end - p >= 4 ? get32(p) : 0;

			/* a peer's names are checked as this rank's are */
			if (end - p < LIST_WIRE ||
			    k > (size_t)(end - p) - LIST_WIRE ||
			    !name_ok((const char *)p + 4, k)) {
				free(e);
				return -EPROTO;
			}
			if (flx_grow((void **)&e, &cap, n + 1, sizeof(*e))) {
				free(e);
				return -ENOMEM;
			}
			e[n] = (entry){(const char *)p + 4,
				       k,
				       get64(p + 4 + k),
				       (int64_t)get64(p + 12 + k),
				       r,
				       r == me ? mine++ : SIZE_MAX};
			p += k + LIST_WIRE;
			n++;
		}
	}
	qsort(e, n, sizeof(*e), cmp_entry);
	*out = e;
	*nout = n;
	return 0;
}

/* The table of every name with its holders; two holders that disagree
 * on the size are the error (the same on every rank: the data is), on
 * the content that of verify_copies(). */
#define DIFFER "rank %d and rank %d hold different files of this name ("
static int merge(flx_dm *m, dm_file *local, const entry *e, size_t n,
		 flx_error *err)
{
	dm_file *f = NULL;
	size_t nf = 0, cap = 0;

	for (size_t i = 0; i < n;) {
		size_t j = i + 1;
		dm_file *d;

		while (j < n && e[j].nlen == e[i].nlen &&
		       !memcmp(e[j].name, e[i].name, e[i].nlen))
			j++;
		if (flx_grow((void **)&f, &cap, nf + 1, sizeof(*f)))
			goto nomem;
		d = &f[nf++];
		memset(d, 0, sizeof(*d));
		d->fd = -1;
		d->name = strndup(e[i].name, e[i].nlen);
		d->holders = malloc((j - i) * sizeof(int));
		if (!d->name || !d->holders)
			goto nomem;
		d->size = e[i].size;
		d->mtime_ns = e[i].mtime_ns;
		for (size_t k = i; k < j; k++) {
			if (e[k].size != d->size) {
				flx_error_set(err, -EINVAL, d->name, NULL,
					      DIFFER "sizes differ)", e[i].rank,
					      e[k].rank);
				files_free(f, nf, true);
				return -EINVAL;
			}
			d->holders[d->nholders++] = e[k].rank;
			if (e[k].local != SIZE_MAX) {
				dm_file *l = &local[e[k].local];

				d->fd = l->fd;
				d->st = l->st;
				l->fd = -1;
			}
		}
		i = j;
	}
	m->files = f;
	m->nfiles = nf;
	return 0;
nomem:
	files_free(f, nf, true);
	return flx_error_set(err, -ENOMEM, NULL, NULL, "out of memory");
}

/*
 * Collective: every rank's len bytes at mine, gathered on every rank into
 * *all, with each rank's length and offset in *lens and *offs (m->size
 * each; all three owned by the caller, freed even on failure).  rc is
 * this rank's failure so far: every rank takes part in every collective
 * whatever failed, and a failure anywhere is every rank's
 * (flx_dm_agree()).  @return 0, or -errno with err set on every rank.
 */
static int allgather_bytes(flx_dm *m, int rc, const unsigned char *mine,
			   int len, unsigned char **all, int **lens, int **offs,
			   flx_error *err)
{
	size_t total = 0;

	*all = NULL;
	*lens = calloc((size_t)m->size, sizeof(int));
	*offs = calloc((size_t)m->size, sizeof(int));
	if (!rc && (!*lens || !*offs))
		rc = -ENOMEM;
	if (MPI_Allgather(&len, 1, MPI_INT, *lens ? *lens : &len, 1, MPI_INT,
			  m->coll) != MPI_SUCCESS &&
	    !rc)
		rc = -EIO;
	for (int r = 0; !rc && r < m->size; r++) {
		(*offs)[r] = (int)total;
		total += (size_t)(*lens)[r];
	}
	if (!rc && total > INT_MAX)
		rc = -E2BIG;
	if (!rc && !(*all = malloc(total ? total : 1)))
		rc = -ENOMEM;
	rc = flx_dm_agree(m, rc, err);
	if (rc)
		return rc;
	m->st.exchange_bytes += total;
	if (MPI_Allgatherv(mine, len, MPI_BYTE, *all, *lens, *offs, MPI_BYTE,
			   m->coll) != MPI_SUCCESS)
		rc = flx_error_set(err, -EIO, NULL, "mpi",
				   "MPI_Allgatherv failed");
	/* the same data on every rank: the same line, no rank's prefix */
	return flx_dm_agree(m, rc, err);
}

/* Gather every rank's list and merge them. */
static int gather(flx_dm *m, dm_file *local, size_t nlocal, flx_error *err)
{
	unsigned char *mine = NULL, *all = NULL;
	int len = 0, *lens = NULL, *offs = NULL, rc;
	entry *e = NULL;
	size_t ne = 0;

	rc = pack(local, nlocal, &mine, &len);
	rc = allgather_bytes(m, rc, mine, len, &all, &lens, &offs, err);
	if (rc)
		goto out;
	rc = unpack_all(all, lens, offs, m->size, m->rank, &e, &ne);
	if (rc == -EPROTO)
		flx_error_set(err, rc, NULL, "mpi",
			      "a rank sent an invalid list of files");
	rc = flx_dm_agree(m, rc, err);
	if (!rc)
		rc = merge(m, local, e, ne, err);
out:
	free(e);
	free(all);
	free(mine);
	free(lens);
	free(offs);
	return rc;
}

/* ---- the copies held twice ---- */

/* The files this rank digests, worked through by several threads. */
typedef struct digester {
	const flx_dm *m;
	const uint32_t *ids; /* files (indices into m->files) */
	size_t n;
	uint64_t *out; /* their digests */
	atomic_size_t next;
	atomic_int rc;	   /* the first failure */
	atomic_size_t bad; /* its index in ids */
} digester;

static void digest_fail(digester *d, size_t i, int rc)
{
	int none = 0;

	if (atomic_compare_exchange_strong(&d->rc, &none, rc))
		atomic_store(&d->bad, i);
}

static void *digest_worker(void *arg)
{
	digester *d = arg;
	unsigned char *buf = malloc(DIGEST_BUF);
	size_t i;

	if (!buf) {
		digest_fail(d, d->n, -ENOMEM);
		return NULL;
	}
	while (!atomic_load(&d->rc) &&
	       (i = atomic_fetch_add(&d->next, 1)) < d->n) {
		const dm_file *f = &d->m->files[d->ids[i]];
		int rc =
		    file_digest(f->fd, f->size, buf, DIGEST_BUF, &d->out[i]);

		if (rc)
			digest_fail(d, i, rc);
	}
	free(buf);
	return NULL;
}

/*
 * The digests of the files this rank holds that another rank holds too
 * (a file held once has nothing to be compared with), by up to
 * DIGEST_THREADS threads, each with one DIGEST_BUF buffer: sequential
 * reads of whole files, several files at once so that a disk's queue
 * and the cores are used.  As wire bytes: per file u32 id, u64 digest.
 */
#define DIGEST_WIRE 12
static int digest_local(flx_dm *m, unsigned char **wire, int *len,
			flx_error *err)
{
	digester d = {.m = m};
	pthread_t th[DIGEST_THREADS - 1];
	size_t nth = 0, cap = 0;
	uint32_t *ids = NULL;
	int64_t t0 = now_ns();
	int rc = 0;

	for (size_t i = 0; i < m->nfiles; i++) {
		if (m->files[i].nholders < 2 || m->files[i].fd < 0)
			continue;
		if (flx_grow((void **)&ids, &cap, d.n + 1, sizeof(*ids)))
			goto nomem;
		ids[d.n++] = (uint32_t)i;
		m->st.digested += m->files[i].size;
	}
	d.ids = ids;
	d.out = malloc((d.n ? d.n : 1) * sizeof(*d.out));
	*wire = malloc(d.n ? d.n * DIGEST_WIRE : 1);
	if (!d.out || !*wire)
		goto nomem;
	while (nth + 1 < DIGEST_THREADS && nth + 1 < d.n &&
	       !pthread_create(&th[nth], NULL, digest_worker, &d))
		nth++;
	if (d.n)
		digest_worker(&d);
	while (nth)
		pthread_join(th[--nth], NULL);
	rc = atomic_load(&d.rc);
	if (rc) {
		size_t bad = atomic_load(&d.bad);

		flx_error_set(err, rc,
			      bad < d.n ? m->files[ids[bad]].name : NULL, NULL,
			      "cannot read: %s", strerror(-rc));
		goto out;
	}
	for (size_t i = 0; i < d.n; i++) {
		put32(*wire + i * DIGEST_WIRE, ids[i]);
		put64(*wire + i * DIGEST_WIRE + 4, d.out[i]);
	}
	*len = (int)(d.n * DIGEST_WIRE);
	m->st.digest_ns = (uint64_t)(now_ns() - t0);
	goto out;
nomem:
	rc = flx_error_set(err, -ENOMEM, NULL, NULL, "out of memory");
out:
	free(ids);
	free(d.out);
	return rc;
}

/* Every rank's digests (all, per rank lens and offs) against each other:
 * the first file, in table order, whose holders' digests differ is the
 * error, naming its lowest holder and the first that differs from it.
 * first and dig: room for m->nfiles each. */
static int compare_digests(const flx_dm *m, const unsigned char *all,
			   const int *lens, const int *offs, int *first,
			   uint64_t *dig, flx_error *err)
{
	size_t bad = SIZE_MAX;
	int r1 = 0, r2 = 0, rc = 0;

	for (size_t i = 0; i < m->nfiles; i++)
		first[i] = -1;
	for (int r = 0; r < m->size; r++) {
		if (lens[r] % DIGEST_WIRE) {
			rc = -EPROTO;
			break;
		}
		for (int at = 0; at < lens[r]; at += DIGEST_WIRE) {
			const unsigned char *p = all + offs[r] + at;
			uint32_t id = get32(p);
			uint64_t d = get64(p + 4);

			if (id >= m->nfiles || m->files[id].nholders < 2) {
				rc = -EPROTO;
				break;
			}
			if (first[id] < 0) {
				first[id] = r;
				dig[id] = d;
			} else if (d != dig[id] && id < bad) {
				bad = id;
				r1 = first[id];
				r2 = r;
			}
		}
	}
	if (rc)
		flx_error_set(err, rc, NULL, "mpi",
			      "a rank sent an invalid list of digests");
	else if (bad != SIZE_MAX)
		rc = flx_error_set(err, -EINVAL, m->files[bad].name, NULL,
				   DIFFER "contents differ)", r1, r2);
	return rc;
}

/*
 * Collective: every copy of a file held by several ranks must be the same
 * bytes, not only the same size: a copy left from another save, or
 * damaged, differs anywhere.  Each holder digests its copies whole
 * (digest_local()), the digests are gathered and compared on every rank.
 */
static int verify_copies(flx_dm *m, flx_error *err)
{
	unsigned char *mine = NULL, *all = NULL;
	int len = 0, *lens = NULL, *offs = NULL, rc;
	int *first = malloc((m->nfiles ? m->nfiles : 1) * sizeof(int));
	uint64_t *dig = malloc((m->nfiles ? m->nfiles : 1) * sizeof(*dig));

	rc = first && dig
		 ? digest_local(m, &mine, &len, err)
		 : flx_error_set(err, -ENOMEM, NULL, NULL, "out of memory");
	rc = allgather_bytes(m, rc, mine, len, &all, &lens, &offs, err);
	if (!rc)
		rc = compare_digests(m, all, lens, offs, first, dig, err);
	free(first);
	free(dig);
	free(mine);
	free(all);
	free(lens);
	free(offs);
	return rc;
}

/*
 * Whether every rank gets a copy of the file at start: a metadata file,
 * which every rank's open reads whole (flx_source.metadata).  One broadcast (a
 * tree: log2 N rounds) instead of a request from each rank to its holder.
 */
static bool is_broadcast(const dm_file *f)
{
	return f->size <= BCAST_MAX && flx_source_metadata(f->name);
}

/* The broadcast files, from their lowest holder, kept by the ranks that
 * lack them (is_broadcast()).  Collective. */
static int broadcast(flx_dm *m, flx_error *err)
{
	for (size_t i = 0; i < m->nfiles; i++) {
		dm_file *f = &m->files[i];
		unsigned char *buf;
		int rc = 0;

		if (!is_broadcast(f))
			continue;
		buf = malloc(f->size ? f->size : 1);
		if (!buf)
			rc = -ENOMEM;
		else if (m->rank == f->holders[0])
			rc = flx_pread_full(f->fd, buf, f->size, 0);
		/* the root's failure is everyone's, before the broadcast */
		rc = flx_dm_agree(m, rc, err);
		if (!rc && MPI_Bcast(buf, (int)f->size, MPI_BYTE, f->holders[0],
				     m->coll) != MPI_SUCCESS)
			rc = flx_error_set(err, -EIO, f->name, "mpi",
					   "MPI_Bcast failed");
		if (!rc)
			m->st.bcast_bytes += f->size;
		if (rc || f->fd >= 0)
			free(buf);
		else
			f->mem = buf;
		if (rc)
			return rc;
	}
	return 0;
}

/* ---- a save directory: the sources' enter hooks over the ranks' files ---- */

/* The most bytes of a file an enter hook reads (a tracker file). */
#define ENTER_READ_MAX (1u << 20)

static int cmp_name(const void *key, const void *elt);
static const char *be_name(void *ctx, uint32_t id);

static dm_file *find_file(const flx_dm *m, const char *name)
{
	return bsearch(name, m->files, m->nfiles, sizeof(dm_file), cmp_name);
}

/* The first file at or after name in the table (sorted by name), or
 * m->nfiles. */
static size_t lower_bound(const flx_dm *m, const char *name)
{
	size_t lo = 0, hi = m->nfiles;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(m->files[mid].name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static flx_dv_kind dv_kind(const flx_dirview *v, const char *path)
{
	const flx_dm *m = v->ctx;
	size_t k = strlen(path), i;
	char *pre;

	if (find_file(m, path))
		return FLX_DV_FILE;
	/* a directory: some file named path/... */
	pre = malloc(k + 2);
	if (!pre)
		return FLX_DV_OTHER;
	memcpy(pre, path, k);
	memcpy(pre + k, "/", 2);
	i = lower_bound(m, pre);
	free(pre);
	return i < m->nfiles && !strncmp(m->files[i].name, path, k) &&
		       m->files[i].name[k] == '/'
		   ? FLX_DV_DIR
		   : FLX_DV_NONE;
}

/* Over the files' table, every name shorter than NAME_MAX_WIRE
 * (name_ok()): no subdirectory is too long to pass. */
_Static_assert(NAME_MAX_WIRE <= PATH_MAX, "a subdirectory's name fits");

static int dv_each_dir(const flx_dirview *v, unsigned max,
		       int (*fn)(void *arg, const char *name), void *arg)
{
	return flx_each_listed_dir(be_name, v->ctx, NAME_MAX_WIRE - 1, max, fn,
				   arg);
}

/* Collective: the lowest holder reads, every rank gets the bytes (every
 * holder's copy is the same: verify_copies()). */
static int dv_read(const flx_dirview *v, const char *path, uint64_t max,
		   void **buf, size_t *len, flx_error *err)
{
	flx_dm *m = v->ctx;
	const dm_file *t = find_file(m, path);
	char *b;
	int rc = 0;

	*buf = NULL;
	*len = 0;
	if (!t)
		return flx_error_set(err, -ENOENT, path, NULL,
				     "no rank holds it");
	if (t->size > max || max > ENTER_READ_MAX)
		return flx_error_set(err, -EINVAL, path, NULL,
				     "not a regular file of at most %llu "
				     "bytes",
				     (unsigned long long)max);
	b = malloc((size_t)t->size + 1);
	if (!b)
		rc = -ENOMEM;
	if (!rc && m->rank == t->holders[0])
		rc = flx_pread_full(t->fd, b, (size_t)t->size, 0);
	rc = flx_dm_agree(m, rc, err);
	if (!rc && MPI_Bcast(b, (int)t->size, MPI_BYTE, t->holders[0],
			     m->coll) != MPI_SUCCESS)
		rc = flx_error_set(err, -EIO, t->name, "mpi",
				   "MPI_Bcast failed");
	rc = flx_dm_agree(m, rc, err);
	if (rc) {
		free(b);
		return rc;
	}
	b[t->size] = '\0';
	*buf = b;
	*len = (size_t)t->size;
	return 0;
}

/*
 * Into sub the subdirectory to serve when the ranks' files make a save
 * directory (a tracker file naming an iteration or tag directory), as the
 * sources' enter hooks decide over the union of the ranks' files; ""
 * when they make none.  Collective.
 */
static int save_sub(flx_dm *m, const flx_ckpt_opts *o, char *sub, size_t cap,
		    flx_error *err)
{
	static const flx_ckpt_opts none;
	flx_dirview v = {.ctx = m,
			 .dirfd = -1,
			 .where = "on any rank",
			 .kind = dv_kind,
			 .each_dir = dv_each_dir,
			 .read = dv_read};

	return flx_source_enter(&v, o ? o : &none, sub, cap, err);
}

/*
 * The table cut to the files under sub/, named from there on: the
 * checkpoint every rank opens.  This rank opens dir/sub when it holds
 * any of them, else an empty directory of its own (every file then
 * comes from the others).  Deterministic: the same table on every rank.
 */
static int enter_sub(flx_dm *m, const char *dir, const char *sub,
		     flx_error *err)
{
	size_t k = strlen(sub), n = 0;
	bool mine = false;
	char tmpl[] = "/tmp/flexfs-mpi-XXXXXX";

	for (size_t i = 0; i < m->nfiles; i++) {
		dm_file *f = &m->files[i];

		if (strncmp(f->name, sub, k) || f->name[k] != '/') {
			files_free(f, 1, false);
			continue;
		}
		memmove(f->name, f->name + k + 1, strlen(f->name + k + 1) + 1);
		mine |= f->fd >= 0;
		m->files[n++] = *f;
	}
	m->nfiles = n;
	/* the hooks name only a directory some rank holds a file under */
	if (!n)
		return flx_error_set(err, -ENOENT, sub, NULL,
				     "no rank holds a file under it");
	free(m->dir);
	m->dir = NULL;
	if (mine) {
		if (asprintf(&m->dir, "%s/%s", dir, sub) < 0)
			m->dir = NULL;
	} else if (mkdtemp(tmpl)) {
		struct stat st;

		/* served as the save directory would be: its owner and
		 * mode stand for the directory's (flx_ckpt.access); where
		 * they cannot, it stays ours, 0700 */
		if (!stat(dir, &st) && chown(tmpl, st.st_uid, st.st_gid) == 0)
			chmod(tmpl, st.st_mode & 0777);
		m->tmpdir = strdup(tmpl);
		m->dir = m->tmpdir ? strdup(tmpl) : NULL;
		if (!m->tmpdir)
			rmdir(tmpl);
	} else {
		return flx_error_set(err, -errno, tmpl, NULL,
				     "cannot make an empty directory: %s",
				     strerror(errno));
	}
	return m->dir
		   ? 0
		   : flx_error_set(err, -ENOMEM, NULL, NULL, "out of memory");
}

/* Create n (a name_ok() path) as an empty file under dfd, its
 * directories too; failures only make the probe see less. */
static void probe_touch(int dfd, const char *n)
{
	char path[NAME_MAX_WIRE];
	int fd;

	snprintf(path, sizeof(path), "%s", n);
	for (char *sl = strchr(path, '/'); sl; sl = strchr(sl + 1, '/')) {
		*sl = '\0';
		(void)mkdirat(dfd, path, 0700);
		*sl = '/';
	}
	fd = openat(dfd, path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
}

/* Remove what probe_touch(dfd, n) made (a directory once empty). */
static void probe_untouch(int dfd, const char *n)
{
	char path[NAME_MAX_WIRE];
	char *sl;

	snprintf(path, sizeof(path), "%s", n);
	unlinkat(dfd, path, 0);
	while ((sl = strrchr(path, '/'))) {
		*sl = '\0';
		unlinkat(dfd, path, AT_REMOVEDIR);
	}
}

/*
 * The checkpoint's format: what the sources' probes say of the union of
 * the ranks' files, where one rank may hold one of a source's marker
 * files and another the rest, or one rank directory and another the next.
 * Probes look at names, never at payloads (resolver/source.h), so rank 0
 * probes a private directory of empty files of those names and broadcasts
 * the answer.
 */
static int probe_union(const flx_dm *m, char *format, size_t len)
{
	char tmpl[] = "/tmp/flexfs-probe-XXXXXX";
	const char *dir = mkdtemp(tmpl), *fmt;
	int dfd, rc = -ENOENT;

	if (!dir)
		return -errno;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	/* names are name_ok(): plain, below the directory */
	for (size_t i = 0; dfd >= 0 && i < m->nfiles; i++)
		probe_touch(dfd, m->files[i].name);
	if (dfd >= 0 && flx_ckpt_probe(dir, &fmt) == 0) {
		snprintf(format, len, "%s", fmt);
		rc = 0;
	}
	for (size_t i = 0; dfd >= 0 && i < m->nfiles; i++)
		probe_untouch(dfd, m->files[i].name);
	if (dfd >= 0)
		close(dfd);
	rmdir(dir);
	return rc;
}

static int agree_format(flx_dm *m, flx_error *err)
{
	char fmt[64] = "";

	if (m->rank == 0)
		(void)probe_union(m, fmt, sizeof(fmt));
	if (MPI_Bcast(fmt, (int)sizeof(fmt), MPI_CHAR, 0, m->coll) !=
	    MPI_SUCCESS)
		return flx_error_set(err, -EIO, NULL, "mpi",
				     "MPI_Bcast failed");
	fmt[sizeof(fmt) - 1] = '\0';
	memcpy(m->format, fmt, sizeof(fmt));
	if (!fmt[0])
		return flx_error_set(err, -ENOENT, NULL, NULL,
				     "no rank's directory holds a "
				     "checkpoint's metadata (.metadata)");
	return 0;
}

static void *service(void *arg);
static int be_lookup(void *ctx, const char *relpath, uint32_t *id,
		     uint64_t *size, int64_t *mtime_ns);
static int be_read(void *ctx, const flx_file_span *s, size_t n);

int flx_dm_exchange(flx_dm *m, const char *dir, flx_ckpt_opts *o,
		    flx_error *err)
{
	dm_file *local = NULL;
	size_t nlocal = 0;
	sigset_t all, old;
	char sub[256] = "";
	int rc = list_local(dir, &local, &nlocal, err);

	rc = flx_dm_agree(m, rc, err);
	if (!rc)
		rc = gather(m, local, nlocal, err);
	files_free(local, nlocal, true);
	if (!rc)
		rc = verify_copies(m, err);
	if (!rc)
		rc = save_sub(m, o, sub, sizeof(sub), err);
	if (!rc && sub[0])
		rc = enter_sub(m, dir, sub, err);
	/* the open reads the entered directory as the checkpoint itself,
	 * and serves it as entered (a release/ is named release/ again) */
	if (!rc && sub[0] && !(m->entered = strdup(sub)))
		rc = flx_error_set(err, -ENOMEM, NULL, NULL, "out of memory");
	if (!rc && sub[0] && o)
		o->entered = m->entered;
	if (!rc && !sub[0] && !(m->dir = strdup(dir)))
		rc = flx_error_set(err, -ENOMEM, NULL, NULL, "out of memory");
	if (!rc)
		rc = broadcast(m, err);
	if (!rc)
		rc = agree_format(m, err);
	if (rc)
		return rc;
	m->be = (flx_file_backend){m, be_lookup, be_name, be_read};
	/* signals go to the main thread (FUSE's handlers), never here */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	m->svc_started = pthread_create(&m->svc, NULL, service, m) == 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	rc = m->svc_started ? 0 : -EAGAIN;
	if (rc)
		flx_error_set(err, rc, NULL, "mpi",
			      "cannot start the service thread");
	rc = flx_dm_agree(m, rc, err);
	m->up = rc == 0;
	return rc;
}

void flx_dm_stats_get(const flx_dm *m, flx_dm_stats *out)
{
	const uint64_t *f = (const uint64_t *)&m->st;
	uint64_t *o = (uint64_t *)out;

	for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
		o[i] = __atomic_load_n(&f[i], __ATOMIC_RELAXED);
}

const char *flx_dm_dir(const flx_dm *m)
{
	return m->dir;
}

const char *flx_dm_format(const flx_dm *m)
{
	return m->format;
}

const flx_file_backend *flx_dm_backend(flx_dm *m)
{
	return &m->be;
}

void flx_dm_on_end(flx_dm *m, void (*fn)(void *), void *arg)
{
	pthread_mutex_lock(&m->mu);
	m->on_end = fn;
	m->on_end_arg = arg;
	pthread_mutex_unlock(&m->mu);
}

bool flx_dm_told(const flx_dm *m)
{
	return atomic_load(&((flx_dm *)m)->told);
}

/* ---- serving ---- */

/* Whether file f still is what was listed (a replaced or rewritten file
 * serves no bytes). */
static bool unchanged(const dm_file *f)
{
	struct stat st;

	return fstat(f->fd, &st) == 0 && st.st_size == f->st.st_size &&
	       st.st_ino == f->st.st_ino && st.st_dev == f->st.st_dev &&
	       st.st_mtim.tv_sec == f->st.st_mtim.tv_sec &&
	       st.st_mtim.tv_nsec == f->st.st_mtim.tv_nsec &&
	       st.st_ctim.tv_sec == f->st.st_ctim.tv_sec &&
	       st.st_ctim.tv_nsec == f->st.st_ctim.tv_nsec;
}

/* The reply's bytes for request q (count bytes): status 0 and the data,
 * or a status alone. */
static int serve_spans(flx_dm *m, const unsigned char *q, int count,
		       unsigned char **reply, size_t *rlen, uint32_t *bad)
{
	uint32_t ns = count >= 8 ? get32(q) : 0;
	uint64_t total = 0;
	unsigned char *out;
	size_t at = 8;
	int rc = 0;

	if (count < 8 || ns > REQ_MAX_SPANS ||
	    (size_t)count != 8 + (size_t)ns * SPAN_WIRE)
		return -EPROTO;
	for (uint32_t i = 0; i < ns; i++) {
		const unsigned char *s = q + 8 + (size_t)i * SPAN_WIRE;
		uint32_t id = get32(s);
		uint64_t off = get64(s + 8), len = get64(s + 16);

		if (id >= m->nfiles || m->files[id].fd < 0 ||
		    len > FLX_DM_REQ_BYTES || off > m->files[id].size ||
		    len > m->files[id].size - off)
			return -EINVAL;
		total += len;
	}
	if (total > FLX_DM_REQ_BYTES)
		return -EINVAL;
	out = malloc(8 + total);
	if (!out)
		return -ENOMEM;
	for (uint32_t i = 0; i < ns && !rc; i++) {
		const unsigned char *s = q + 8 + (size_t)i * SPAN_WIRE;
		const dm_file *f = &m->files[get32(s)];
		uint64_t len = get64(s + 16);

		rc = unchanged(f)
			 ? flx_pread_full(f->fd, out + at, len, get64(s + 8))
			 : -ESTALE;
		if (rc)
			*bad = get32(s) + 1;
		at += len;
	}
	if (rc) {
		free(out);
		return rc;
	}
	put32(out, 0);
	put32(out + 4, 0);
	*reply = out;
	*rlen = 8 + total;
	return 0;
}

/* Wait for req until the deadline, polling at least every cap us: 0,
 * -EIO (MPI failed it), or -ETIMEDOUT (req still pending). */
static int wait_until(MPI_Request *req, int64_t deadline, unsigned cap)
{
	unsigned us = 2;
	int done = 0;

	for (;;) {
		if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
			return -EIO;
		if (done)
			return 0;
		if (now_ns() > deadline)
			return -ETIMEDOUT;
		backoff(&us, cap);
	}
}

static void serve(flx_dm *m, const MPI_Status *st)
{
	unsigned char *q = NULL, *reply = NULL, small[8];
	size_t rlen = sizeof(small);
	int count = 0, src = st->MPI_SOURCE, rc;
	uint32_t tag, bad = 0;
	MPI_Request sreq;

	MPI_Get_count(st, MPI_BYTE, &count);
	q = malloc(count > 0 ? (size_t)count : 1);
	if (!q || MPI_Recv(q, count, MPI_BYTE, src, TAG_REQ, m->req,
			   MPI_STATUS_IGNORE) != MPI_SUCCESS) {
		free(q);
		return; /* the asker times out */
	}
	/* the mount ends: the asker's read fails as its own mount ends
	 * (every rank is told), so nothing is sent that nobody takes */
	if (atomic_load(&m->ending)) {
		free(q);
		return;
	}
	tag = count >= 8 ? get32(q + 4) : 0;
	rc = serve_spans(m, q, count, &reply, &rlen, &bad);
	free(q);
	if (!tag || tag > (uint32_t)m->tag_ub || m->dead[src]) {
		free(reply);
		return;
	}
	if (rc) {
		put32(small, (uint32_t)rc);
		put32(small + 4, bad);
		rlen = sizeof(small);
	}
	__atomic_add_fetch(&m->st.served, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&m->st.served_bytes, rlen - 8, __ATOMIC_RELAXED);
	if (MPI_Isend(rc ? small : reply, (int)rlen, MPI_BYTE, src, (int)tag,
		      m->rep, &sreq) != MPI_SUCCESS) {
		free(reply);
		return;
	}
	/* half the readers' timeout: while this waits nobody else is
	 * served, and the others must not take this rank for dead */
	if (wait_until(&sreq, now_ns() + (int64_t)m->timeout_s * 500000000,
		       POLL_READ)) {
		/* the asker is gone: its send stays pending, and so does its
		 * buffer (leaked: freeing it under MPI would be worse) */
		mark_dead(m, src, DEAD_NOREAD);
		return;
	}
	free(reply);
}

static void *service(void *arg)
{
	flx_dm *m = arg;
	unsigned us = 2;

	while (!atomic_load(&m->stop)) {
		MPI_Status st;
		int flag = 0;

		if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, m->req, &flag,
			       &st) != MPI_SUCCESS ||
		    !flag) {
			backoff(&us, POLL_IDLE);
			continue;
		}
		us = 2;
		/* an end queued behind requests goes first: requests are
		 * then dropped (serve()), so that a rank resumed after a
		 * stop ends at once rather than answering stale reads */
		if (st.MPI_TAG == TAG_REQ && !atomic_load(&m->ending)) {
			MPI_Status est;
			int e = 0;

			if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_END, m->req, &e,
				       &est) == MPI_SUCCESS &&
			    e)
				st = est;
		}
		if (st.MPI_TAG == TAG_REQ) {
			serve(m, &st);
			continue;
		}
		MPI_Recv(NULL, 0, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, m->req,
			 MPI_STATUS_IGNORE);
		if (st.MPI_TAG == TAG_END && !atomic_exchange(&m->told, true)) {
			atomic_store(&m->ending, true);
			pthread_mutex_lock(&m->mu);
			if (m->on_end)
				m->on_end(m->on_end_arg);
			pthread_mutex_unlock(&m->mu);
		}
	}
	return NULL;
}

/* ---- reading ---- */

static int cmp_name(const void *key, const void *elt)
{
	return strcmp(key, ((const dm_file *)elt)->name);
}

static int be_lookup(void *ctx, const char *relpath, uint32_t *id,
		     uint64_t *size, int64_t *mtime_ns)
{
	flx_dm *m = ctx;
	const dm_file *f =
	    bsearch(relpath, m->files, m->nfiles, sizeof(dm_file), cmp_name);

	if (!f)
		return -ENOENT;
	*id = (uint32_t)(f - m->files);
	*size = f->size;
	*mtime_ns = f->mtime_ns;
	return 0;
}

static const char *be_name(void *ctx, uint32_t id)
{
	flx_dm *m = ctx;

	return id < m->nfiles ? m->files[id].name : NULL;
}

/* A piece: part of a span of at most FLX_DM_REQ_BYTES, and its holder. */
typedef struct piece {
	uint32_t file;
	int holder; /* -1: none alive */
	uint64_t off;
	unsigned char *buf;
	size_t len;
	bool done;
	int32_t claim; /* the cache block it fills (batch.cl), or -1 */
} piece;

/* The live holder of file id to ask, spread over holders by rank;
 * this rank itself when it holds it; -1 when every holder is dead. */
static int pick_holder(const flx_dm *m, uint32_t id)
{
	const dm_file *f = &m->files[id];

	if (f->fd >= 0 || f->mem)
		return m->rank;
	for (int k = 0; k < f->nholders; k++) {
		int h = f->holders[(k + m->rank) % f->nholders];

		if (!m->dead[h])
			return h;
	}
	return -1;
}

static int cmp_piece(const void *a, const void *b)
{
	const piece *x = a, *y = b;

	if (x->holder != y->holder)
		return x->holder < y->holder ? -1 : 1;
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->off < y->off ? -1 : x->off > y->off;
}

typedef struct request {
	int holder;
	size_t first, n; /* pieces */
	size_t bytes;
	unsigned char *msg, *reply;
	MPI_Request sreq, rreq;
	bool sent, got;
} request;

static uint32_t new_tag(flx_dm *m)
{
	return 1 +
	       atomic_fetch_add(&m->next_tag, 1) % (uint32_t)(m->tag_ub - 1);
}

static int post(flx_dm *m, request *q, piece *p)
{
	uint32_t tag = new_tag(m);
	unsigned char *s;

	q->msg = malloc(8 + q->n * SPAN_WIRE);
	q->reply = malloc(8 + q->bytes);
	if (!q->msg || !q->reply)
		return -ENOMEM;
	put32(q->msg, (uint32_t)q->n);
	put32(q->msg + 4, tag);
	s = q->msg + 8;
	for (size_t i = 0; i < q->n; i++, s += SPAN_WIRE) {
		const piece *x = &p[q->first + i];

		put32(s, x->file);
		put32(s + 4, 0);
		put64(s + 8, x->off);
		put64(s + 16, x->len);
	}
	__atomic_add_fetch(&m->st.requests, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&m->st.bytes, q->bytes, __ATOMIC_RELAXED);
	__atomic_add_fetch(&m->st.spans, q->n, __ATOMIC_RELAXED);
	if (MPI_Irecv(q->reply, (int)(8 + q->bytes), MPI_BYTE, q->holder,
		      (int)tag, m->rep, &q->rreq) != MPI_SUCCESS)
		return -EIO;
	q->got = true;
	if (MPI_Isend(q->msg, (int)(8 + q->n * SPAN_WIRE), MPI_BYTE, q->holder,
		      TAG_REQ, m->req, &q->sreq) != MPI_SUCCESS)
		return -EIO;
	q->sent = true;
	return 0;
}

/* Give up on q: its receive is cancelled (a late reply then matches
 * nothing), its send left to complete on its own. */
static void abandon(request *q)
{
	if (q->got) {
		MPI_Cancel(&q->rreq);
		MPI_Wait(&q->rreq, MPI_STATUS_IGNORE);
		q->got = false;
	}
	if (q->sent) {
		int done = 0;

		MPI_Test(&q->sreq, &done, MPI_STATUS_IGNORE);
		if (!done) {
			MPI_Request_free(&q->sreq);
			q->msg = NULL; /* still MPI's: leaked */
		}
		q->sent = false;
	}
}

/* What a refused reply names: the file's id + 1, or UINT32_MAX. */
static uint32_t refused_file(const flx_dm *m, const request *q, int count)
{
	uint32_t bad = count >= 8 ? get32(q->reply + 4) : 0;

	return bad && bad <= m->nfiles ? bad : UINT32_MAX;
}

/* Scatter q's reply into its pieces: 0, or its status. */
static int scatter(request *q, piece *p, int count)
{
	int32_t status = (int32_t)get32(q->reply);
	size_t at = 8;

	if (status)
		return status < 0 ? status : -EIO;
	if (count < 0 || (size_t)count != 8 + q->bytes)
		return -EPROTO;
	for (size_t i = 0; i < q->n; i++) {
		piece *x = &p[q->first + i];

		memcpy(x->buf, q->reply + at, x->len);
		at += x->len;
		x->done = true;
	}
	return 0;
}

/* Run the requests qs[0..nq) at once until each is answered or the
 * deadline passes; a holder whose request times out is marked dead.
 * @return 0 (failed pieces stay !done), or -ENOMEM. */
static int run(flx_dm *m, request *qs, size_t nq, piece *p)
{
	int64_t deadline = now_ns() + (int64_t)m->timeout_s * 1000000000;
	size_t left = nq;
	unsigned us = 2;
	int rc = 0;

	for (size_t i = 0; i < nq && !rc; i++)
		rc = post(m, &qs[i], p);
	while (!rc && left) {
		bool progress = false;

		for (size_t i = 0; i < nq; i++) {
			request *q = &qs[i];
			MPI_Status st;
			int done = 0, count = 0;

			if (!q->got)
				continue;
			if (MPI_Test(&q->rreq, &done, &st) != MPI_SUCCESS) {
				done = 0;
				mark_dead(m, q->holder, DEAD_GONE);
				abandon(q);
				left--;
				continue;
			}
			if (!done)
				continue;
			q->got = false;
			left--;
			progress = true;
			MPI_Get_count(&st, MPI_BYTE, &count);
			if (count < 8 || scatter(q, p, count))
				atomic_store(&m->refused[q->holder],
					     refused_file(m, q, count));
		}
		if (!left)
			break;
		if (atomic_load(&m->ending))
			break;
		if (now_ns() > deadline) {
			for (size_t i = 0; i < nq; i++)
				if (qs[i].got)
					mark_dead(m, qs[i].holder,
						  DEAD_TIMEOUT);
			break;
		}
		if (progress)
			us = 2;
		else
			backoff(&us, POLL_READ);
	}
	for (size_t i = 0; i < nq; i++) {
		abandon(&qs[i]);
		if (qs[i].sent) {
			MPI_Wait(&qs[i].sreq, MPI_STATUS_IGNORE);
			qs[i].sent = false;
		}
		free(qs[i].msg);
		free(qs[i].reply);
		qs[i].msg = qs[i].reply = NULL;
	}
	return rc;
}

/* One round: every piece not done to its holder (this rank's own
 * straight from its file), in requests of at most FLX_DM_REQ_BYTES,
 * FLX_DM_INFLIGHT at a time. */
static int round_trip(flx_dm *m, piece *p, size_t n)
{
	request qs[FLX_DM_INFLIGHT];
	size_t nq = 0;
	int rc = 0;

	if (!n) /* every span came from the block cache (p is NULL) */
		return 0;
	for (size_t i = 0; i < n; i++)
		p[i].holder = p[i].done ? INT_MAX : pick_holder(m, p[i].file);
	qsort(p, n, sizeof(*p), cmp_piece);
	for (size_t i = 0; i < n && !rc;) {
		request *q;

		if (p[i].holder == INT_MAX || p[i].holder < 0) {
			i++;
			continue;
		}
		if (p[i].holder == m->rank) {
			const dm_file *f = &m->files[p[i].file];

			if (f->mem) {
				memcpy(p[i].buf, f->mem + p[i].off, p[i].len);
				p[i].done = true;
			} else if (unchanged(f) &&
				   !flx_pread_full(f->fd, p[i].buf, p[i].len,
						   p[i].off)) {
				p[i].done = true;
			}
			i++;
			continue;
		}
		q = &qs[nq++];
		memset(q, 0, sizeof(*q));
		q->holder = p[i].holder;
		q->first = i;
		while (i < n && p[i].holder == q->holder &&
		       q->n < REQ_MAX_SPANS &&
		       q->bytes + p[i].len <= FLX_DM_REQ_BYTES) {
			q->bytes += p[i].len;
			q->n++;
			i++;
		}
		if (nq == FLX_DM_INFLIGHT) {
			rc = run(m, qs, nq, p);
			nq = 0;
		}
	}
	if (!rc && nq)
		rc = run(m, qs, nq, p);
	return rc;
}

/* Say in last_why what the first piece not read was waiting for: the
 * mount ending, or each of its holders' state. */
static void note_why(flx_dm *m, const piece *p, size_t n)
{
	static const char *const dead[] = {
	    [DEAD_TIMEOUT] = "timed out (no reply within mpi_timeout)",
	    [DEAD_GONE] = "rank ended or unreachable (MPI error)",
	    [DEAD_NOREAD] = "rank stopped taking replies"};
	const size_t cap = sizeof(last_why);
	const dm_file *f = NULL;
	size_t at = 0;

	for (size_t i = 0; i < n && !f; i++)
		if (!p[i].done)
			f = &m->files[p[i].file];
	if (atomic_load(&m->ending) || !f) {
		snprintf(last_why, cap, "%s",
			 f ? "the distributed mount is ending"
			   : "a request failed in MPI");
		return;
	}
	for (int k = 0; k < f->nholders && at < cap; k++) {
		int h = f->holders[k];
		unsigned char d = atomic_load(&m->dead[h]);
		uint32_t bad = atomic_load(&m->refused[h]);
		const char *name = f->name;

		if (!d && bad && bad != UINT32_MAX)
			name = m->files[bad - 1].name;
		at += (size_t)snprintf(
		    last_why + at, cap - at, "%srank %d: %s: %s", k ? "; " : "",
		    h, name,
		    d	  ? dead[d]
		    : bad ? "could not read its copy (changed after the start?)"
			  : "no reply");
	}
}

void flx_dm_why(const flx_dm *m, char *buf, size_t len)
{
	(void)m;
	if (len)
		snprintf(buf, len, "%s", last_why);
}

/*
 * A batch: the pieces to fetch, and the cache blocks it claimed
 * (flx_bcache_claim()) with the bytes each span takes from them.  Remote
 * blocks are cached under CACHE_KEY + id, apart from the read path's own
 * blocks (keyed by index into the index's files, far below).
 */
#define CACHE_KEY 0x80000000u

typedef struct claim {
	uint32_t file;
	uint64_t blk;
	flx_bref ref;
	bool ok; /* its piece was read */
} claim;

typedef struct copy {
	size_t claim;
	size_t at; /* offset in the block */
	unsigned char *dst;
	size_t len;
} copy;

typedef struct batch {
	piece *p;
	size_t np, capp;
	claim *cl;
	size_t ncl, capcl;
	copy *cp;
	size_t ncp, capcp;
} batch;

/* Pieces of at most FLX_DM_REQ_BYTES for len bytes at off of file. */
static int add_pieces(batch *b, uint32_t file, uint64_t off, unsigned char *buf,
		      size_t len, int32_t cl)
{
	for (size_t at = 0; at < len;) {
		size_t k =
		    len - at < FLX_DM_REQ_BYTES ? len - at : FLX_DM_REQ_BYTES;

		if (flx_grow((void **)&b->p, &b->capp, b->np + 1,
			     sizeof(piece)))
			return -ENOMEM;
		b->p[b->np++] =
		    (piece){file, 0, off + at, buf + at, k, false, cl};
		at += k;
	}
	return 0;
}

/* The batch's claim of (file, blk) among its last few, or -1. */
static ssize_t find_claim(const batch *b, uint32_t file, uint64_t blk)
{
	for (size_t i = b->ncl; i > 0 && b->ncl - i < 8; i--)
		if (b->cl[i - 1].file == file && b->cl[i - 1].blk == blk)
			return (ssize_t)(i - 1);
	return -1;
}

/*
 * Span s through the cache, block by block: a cached block is copied at
 * once; a block nobody has is claimed, fetched whole by one piece and
 * copied once read; a block another thread is loading, or past the
 * batch's share of the cache (half its blocks, so that other readers
 * keep some), is fetched for this span alone.
 */
static int span_cached(flx_dm *m, batch *b, const flx_file_span *s)
{
	size_t B = flx_bcache_block(m->cache),
	       most = flx_bcache_slots(m->cache) / 2;
	uint64_t size = m->files[s->file].size, end = s->off + s->len;
	unsigned char *out = s->buf;
	int rc = 0;

	for (uint64_t pos = s->off; pos < end && !rc;) {
		uint64_t blk = pos / B, bstart = blk * B;
		size_t k =
		    (size_t)((end < bstart + B ? end : bstart + B) - pos);
		unsigned char *dst = out + (pos - s->off);
		ssize_t c = find_claim(b, s->file, blk);
		flx_bref ref;
		unsigned char *fill;

		if (c < 0 && b->ncl < most) {
			rc = flx_bcache_claim(m->cache, CACHE_KEY + s->file,
					      size, blk, &ref, &fill);
			if (rc == 0 && !ref.loaded) {
				memcpy(dst, ref.data + (pos - bstart), k);
				flx_bcache_put(m->cache, &ref);
				__atomic_add_fetch(&m->st.cached, k,
						   __ATOMIC_RELAXED);
				pos += k;
				continue;
			}
			if (rc == 0) {
				if (flx_grow((void **)&b->cl, &b->capcl,
					     b->ncl + 1, sizeof(claim))) {
					flx_bcache_filled(m->cache, &ref,
							  -ENOMEM);
					return -ENOMEM;
				}
				c = (ssize_t)b->ncl;
				b->cl[b->ncl++] =
				    (claim){s->file, blk, ref, false};
				rc = add_pieces(b, s->file, bstart, fill,
						ref.len, (int32_t)c);
			} else if (rc == -EAGAIN) {
				rc = 0;
			}
		}
		if (!rc && c >= 0) {
			if (flx_grow((void **)&b->cp, &b->capcp, b->ncp + 1,
				     sizeof(copy)))
				return -ENOMEM;
			b->cp[b->ncp++] =
			    (copy){(size_t)c, (size_t)(pos - bstart), dst, k};
		} else if (!rc) {
			rc = add_pieces(b, s->file, pos, dst, k, -1);
		}
		pos += k;
	}
	return rc;
}

/* The claimed blocks handed back, each cached when its piece was read
 * (ok), and their bytes copied to the spans: 0, or -EIO when one was not
 * read (the batch fails anyway). */
static int claims_end(flx_dm *m, batch *b)
{
	int rc = 0;

	for (size_t i = 0; i < b->np; i++)
		if (b->p[i].claim >= 0 && b->p[i].done)
			b->cl[b->p[i].claim].ok = true;
	for (size_t i = 0; i < b->ncl; i++)
		flx_bcache_filled(m->cache, &b->cl[i].ref,
				  b->cl[i].ok ? 0 : -EIO);
	for (size_t i = 0; i < b->ncp; i++) {
		const claim *c = &b->cl[b->cp[i].claim];

		if (!c->ok) {
			rc = -EIO;
			continue;
		}
		memcpy(b->cp[i].dst, c->ref.data + b->cp[i].at, b->cp[i].len);
	}
	for (size_t i = 0; i < b->ncl; i++)
		flx_bcache_put(m->cache, &b->cl[i].ref);
	return rc;
}

static int be_read(void *ctx, const flx_file_span *s, size_t n)
{
	flx_dm *m = ctx;
	batch b = {0};
	bool all = false;
	int rc = 0;

	for (size_t i = 0; i < n && !rc; i++) {
		const dm_file *f;

		if (s[i].file >= m->nfiles ||
		    s[i].off > m->files[s[i].file].size ||
		    s[i].len > m->files[s[i].file].size - s[i].off) {
			rc = -EIO;
			break;
		}
		f = &m->files[s[i].file];
		/* other ranks' bytes only: this rank's are in memory */
		if (m->cache && f->fd < 0 && !f->mem)
			rc = span_cached(m, &b, &s[i]);
		else
			rc = add_pieces(&b, s[i].file, s[i].off, s[i].buf,
					s[i].len, -1);
	}
	if (rc)
		goto out;
	__atomic_add_fetch(&m->st.batches, 1, __ATOMIC_RELAXED);
	/* a round per holder that fails, at most one per rank */
	for (int round = 0; !rc && !all && round <= m->size; round++) {
		bool alive = false;

		all = true;
		rc = round_trip(m, b.p, b.np);
		for (size_t i = 0; i < b.np; i++)
			if (!b.p[i].done) {
				all = false;
				alive |= pick_holder(m, b.p[i].file) >= 0;
			}
		if (all)
			break;
		if (!alive || atomic_load(&m->ending))
			rc = -EIO;
	}
	/* never success with a piece unread */
	if (!rc && !all)
		rc = -EIO;
	if (rc)
		note_why(m, b.p, b.np);
	else
		last_why[0] = '\0';
out:
	if (b.ncl) {
		int crc = claims_end(m, &b);

		if (!rc)
			rc = crc;
	}
	free(b.p);
	free(b.cl);
	free(b.cp);
	return rc;
}

void flx_dm_set_cache(flx_dm *m, flx_bcache *cache)
{
	m->cache = cache;
}

/* ---- the end ---- */

/*
 * The end protocol (docs/reliability.md#the-end-of-a-distributed-mount).
 * MPI_Finalize waits for every rank of the job, forever for one that died
 * or never calls it; a rank that exits without it makes mpirun fail.  So
 * a rank finalizes only once every rank has shown it is alive and ending
 * too, and otherwise exits without: each wait below is bounded by
 * mpi_timeout, and a rank taken for dead during reads (timed out, or
 * stopped taking replies) counts as alive again if it takes part.
 *
 *   1. A rank that ends on its own (not told) sends the end message to
 *      every other rank but those MPI reported gone: a rank taken for
 *      dead by a timeout may only have been slow, and it must end too.
 *   2. Two barriers (MPI_Ibarrier on coll), each awaited at most
 *      mpi_timeout.  The first completes once every rank has entered its
 *      end: proof of life of all.  The second makes the decision
 *      common: a rank that gave up on the first never enters it, so no
 *      rank's second completes and none finalizes; once the first has
 *      completed anywhere, every rank enters the second at once.
 *   3. MPI_Finalize when both completed, else none (plain mpirun then
 *      fails the job, exit status 1).
 */
#define POLL_END 2000 /* us between polls of the end's waits */

/* Step 1: the end message to every rank not gone; the sends are given
 * 2 s in all (a rank that takes none will not take part in step 2). */
static void tell_end(flx_dm *m)
{
	MPI_Request *r = calloc((size_t)m->size, sizeof(*r));
	int64_t deadline = now_ns() + 2000000000ll;
	int n = 0;

	if (!r)
		return;
	for (int k = 0; k < m->size; k++)
		if (k != m->rank && atomic_load(&m->dead[k]) != DEAD_GONE &&
		    MPI_Isend(NULL, 0, MPI_BYTE, k, TAG_END, m->req, &r[n]) ==
			MPI_SUCCESS)
			n++;
	for (int k = 0; k < n; k++)
		if (wait_until(&r[k], deadline, POLL_END))
			MPI_Request_free(&r[k]);
	free(r);
}

/* Step 2: whether every rank is alive and ending (both barriers done
 * within mpi_timeout each).  A barrier left pending is never freed: the
 * process exits without MPI_Finalize. */
static bool all_ending(flx_dm *m)
{
	for (int k = 0; k < m->size; k++)
		if (atomic_load(&m->dead[k]) == DEAD_GONE)
			return false;
	for (int phase = 0; phase < 2; phase++) {
		MPI_Request b;

		if (MPI_Ibarrier(m->coll, &b) != MPI_SUCCESS ||
		    wait_until(&b,
			       now_ns() + (int64_t)m->timeout_s * 1000000000,
			       POLL_END))
			return false;
	}
	return true;
}

void flx_dm_end(flx_dm *m)
{
	bool fin = true;

	if (!m)
		return;
	atomic_store(&m->ending, true);
	/* an end message from now on must not signal this rank again */
	pthread_mutex_lock(&m->mu);
	m->on_end = NULL;
	pthread_mutex_unlock(&m->mu);
	if (m->up) {
		if (!atomic_load(&m->told))
			tell_end(m);
		/* the service thread keeps taking messages meanwhile (end
		 * messages; requests, dropped unanswered) */
		fin = all_ending(m);
	}
	atomic_store(&m->stop, true);
	if (m->svc_started)
		pthread_join(m->svc, NULL);
	files_free(m->files, m->nfiles, true);
	if (m->tmpdir)
		rmdir(m->tmpdir);
	free(m->tmpdir);
	free(m->dir);
	free(m->entered);
	if (fin)
		MPI_Finalize();
	free(m->dead);
	free(m->refused);
	pthread_mutex_destroy(&m->mu);
	free(m);
}
