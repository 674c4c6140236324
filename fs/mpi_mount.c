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
 *   reply (rep, the request's tag): i32 status (0 or -errno), u32 0, then
 *       the spans' bytes in order (status 0 only)
 *   end (req, TAG_END): no payload
 *
 * Waits never block in MPI: they poll (MPI_Test, MPI_Iprobe) with a short
 * sleep that grows while nothing comes, so that an idle daemon costs no
 * CPU and every wait can end at a deadline.
 */
#include "mpi_mount.h"

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

#define TAG_REQ		  1
#define TAG_END		  2
#define SPAN_WIRE	  24	       /* bytes of a span in a request */
#define REQ_MAX_SPANS	  4096	       /* spans one request carries */
#define HASH_WHOLE	  (1u << 20)   /* files up to this are hashed whole */
#define HASH_EDGE	  (64u * 1024) /* else their first and last bytes */
#define DEFAULT_TIMEOUT_S 30
#define NAME_MAX_WIRE	  4096
#define BCAST_MAX	  (256u << 20) /* largest metadata file broadcast */

typedef struct dm_file {
	char *name;
	uint64_t size;
	int64_t mtime_ns;
	uint64_t hash;
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
	flx_file_backend be;
	pthread_t svc;
	bool svc_started;
	atomic_bool stop;     /* the service thread returns */
	atomic_bool ending;   /* the mount ends: reads fail at once */
	atomic_bool told;     /* another rank said the mount ends */
	atomic_bool any_dead; /* a rank stopped answering */
	atomic_uchar *dead;   /* per rank */
	atomic_uint next_tag;
	int tag_ub;
	flx_dm_stats st;    /* atomically updated fields */
	pthread_mutex_t mu; /* on_end, on_end_arg */
	void (*on_end)(void *);
	void *on_end_arg;
};

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

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v * 0x9E3779B97F4A7C15ull;
	h = (h ^ (h >> 31)) * 0xBF58476D1CE4E5B9ull;
	return h ^ (h >> 29);
}

static uint64_t hash_bytes(uint64_t h, const unsigned char *p, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		h = mix(h, get64(p + i));
	if (i < n) {
		unsigned char tail[8] = {0};

		memcpy(tail, p + i, n - i);
		h = mix(h, get64(tail) ^ ((uint64_t)(n - i) << 56));
	}
	return h;
}

/*
 * A file's identity: its size, and the whole content up to HASH_WHOLE,
 * else the first and last HASH_EDGE bytes.  Two holders of one name hold
 * copies of one file written once by one rank; what makes copies differ
 * in practice (a copy cut short or still being written, another step's
 * file of the same name) changes the size or the ends: DCP's files start
 * with an item's zip header and data and end with the last item's zip
 * directory, and the items' offsets come from .metadata, hashed whole.
 */
static int file_hash(int fd, uint64_t size, uint64_t *out)
{
	unsigned char *buf =
	    malloc(size <= HASH_WHOLE ? (size ? size : 1) : HASH_EDGE);
	uint64_t h = mix(0x666c6578ull, size);
	int rc;

	if (!buf)
		return -ENOMEM;
	if (size <= HASH_WHOLE) {
		rc = flx_pread_full(fd, buf, (size_t)size, 0);
		h = hash_bytes(h, buf, (size_t)size);
	} else {
		rc = flx_pread_full(fd, buf, HASH_EDGE, 0);
		h = hash_bytes(h, buf, HASH_EDGE);
		if (!rc)
			rc = flx_pread_full(fd, buf, HASH_EDGE,
					    size - HASH_EDGE);
		h = hash_bytes(h, buf, HASH_EDGE);
	}
	free(buf);
	*out = h;
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
	if (!m->dead) {
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

static void files_free(dm_file *f, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(f[i].name);
		free(f[i].holders);
		free(f[i].mem);
		if (f[i].fd >= 0)
			close(f[i].fd);
	}
	free(f);
}

/* dir's regular top-level files, opened, with their identity. */
static int list_local(const char *dir, dm_file **out, size_t *nout,
		      flx_error *err)
{
	DIR *d = opendir(dir);
	dm_file *f = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	int rc = 0;

	if (!d)
		return flx_error_set(err, -errno, dir, NULL,
				     "cannot open checkpoint directory: %s",
				     strerror(errno));
	while (!rc && (de = readdir(d))) {
		struct stat st;
		int fd;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    strlen(de->d_name) >= NAME_MAX_WIRE)
			continue;
		fd = openat(dirfd(d), de->d_name,
			    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		if (fd < 0)
			continue; /* a symlink, a socket: not served */
		if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
			close(fd);
			continue;
		}
		if (flx_grow((void **)&f, &cap, n + 1, sizeof(*f))) {
			close(fd);
			rc = -ENOMEM;
			break;
		}
		memset(&f[n], 0, sizeof(f[n]));
		f[n].fd = fd;
		f[n].st = st;
		f[n].size = (uint64_t)st.st_size;
		f[n].mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 +
				st.st_mtim.tv_nsec;
		f[n].name = strdup(de->d_name);
		n++;
		if (!f[n - 1].name)
			rc = -ENOMEM;
		else if ((rc = file_hash(fd, f[n - 1].size, &f[n - 1].hash)))
			flx_error_set(err, rc, dir, de->d_name,
				      "cannot read: %s", strerror(-rc));
	}
	closedir(d);
	if (rc) {
		files_free(f, n);
		return flx_error_default(err, rc, dir);
	}
	*out = f;
	*nout = n;
	return 0;
}

/* The list as bytes: per file u32 name length, name, u64 size,
 * i64 mtime, u64 hash. */
static int pack(const dm_file *f, size_t n, unsigned char **out, int *len)
{
	size_t total = 0;
	unsigned char *b, *p;

	for (size_t i = 0; i < n; i++)
		total += 4 + strlen(f[i].name) + 24;
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
		put64(p + 16, f[i].hash);
		p += 24;
	}
	*out = b;
	*len = (int)total;
	return 0;
}

typedef struct entry {
	const char *name; /* into the gathered bytes */
	uint32_t nlen;
	uint64_t size, hash;
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
			uint32_t k = get32(p);

			if (flx_grow((void **)&e, &cap, n + 1, sizeof(*e))) {
				free(e);
				return -ENOMEM;
			}
			e[n] = (entry){
			    (const char *)p + 4,	k,
			    get64(p + 4 + k),		get64(p + 20 + k),
			    (int64_t)get64(p + 12 + k), r,
			    r == me ? mine++ : SIZE_MAX};
			p += 4 + k + 24;
			n++;
		}
	}
	qsort(e, n, sizeof(*e), cmp_entry);
	*out = e;
	*nout = n;
	return 0;
}

/* The table of every name with its holders; two holders that disagree
 * are the error (the same on every rank: the data is). */
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
		d->hash = e[i].hash;
		d->mtime_ns = e[i].mtime_ns;
		for (size_t k = i; k < j; k++) {
			if (e[k].size != d->size || e[k].hash != d->hash) {
				flx_error_set(
				    err, -EINVAL, d->name, NULL,
				    "rank %d and rank %d hold different files "
				    "of this name (%s)",
				    e[i].rank, e[k].rank,
				    e[k].size != d->size ? "sizes differ"
							 : "contents differ");
				files_free(f, nf);
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
	files_free(f, nf);
	return flx_error_set(err, -ENOMEM, NULL, NULL, "out of memory");
}

/* Gather every rank's list and merge them. */
static int gather(flx_dm *m, dm_file *local, size_t nlocal, flx_error *err)
{
	unsigned char *mine = NULL, *all = NULL;
	int len = 0, *lens = NULL, *offs = NULL, rc;
	entry *e = NULL;
	size_t ne = 0, total = 0;

	rc = pack(local, nlocal, &mine, &len);
	lens = calloc((size_t)m->size, sizeof(int));
	offs = calloc((size_t)m->size, sizeof(int));
	if (!rc && (!lens || !offs))
		rc = -ENOMEM;
	/* every rank takes part in every collective, whatever failed */
	if (MPI_Allgather(&len, 1, MPI_INT, lens ? lens : &len, 1, MPI_INT,
			  m->coll) != MPI_SUCCESS)
		rc = -EIO;
	for (int r = 0; !rc && r < m->size; r++) {
		offs[r] = (int)total;
		total += (size_t)lens[r];
	}
	if (!rc && total > INT_MAX)
		rc = -E2BIG;
	m->st.exchange_bytes = total;
	if (!rc && !(all = malloc(total ? total : 1)))
		rc = -ENOMEM;
	rc = flx_dm_agree(m, rc, err);
	if (rc)
		goto out;
	if (MPI_Allgatherv(mine, len, MPI_BYTE, all, lens, offs, MPI_BYTE,
			   m->coll) != MPI_SUCCESS)
		rc = -EIO;
	if (!rc)
		rc = unpack_all(all, lens, offs, m->size, m->rank, &e, &ne);
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

/*
 * Whether every rank gets a copy of the file at start: a metadata file,
 * which every rank's open reads whole (DCP's .metadata, Paddle's
 * N.metadata, Megatron's metadata.json).  One broadcast (a tree: log2 N
 * rounds) instead of a request from each rank to its holder.
 */
static bool is_broadcast(const dm_file *f)
{
	size_t n = strlen(f->name);

	return f->size <= BCAST_MAX &&
	       ((n >= 9 && !strcmp(f->name + n - 9, ".metadata")) ||
		!strcmp(f->name, "metadata.json"));
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

/*
 * The checkpoint's format: what the sources' probes say of the union of
 * the ranks' files, where one rank may hold .metadata and another
 * metadata.json (Megatron's).  Probes look at names, never at payloads
 * (resolver/source.h), so rank 0 probes a private directory of empty files
 * of those names and broadcasts the answer.
 */
static int probe_union(const flx_dm *m, char *format, size_t len)
{
	char tmpl[] = "/tmp/flexfs-probe-XXXXXX";
	const char *dir = mkdtemp(tmpl), *fmt;
	int dfd, rc = -ENOENT;

	if (!dir)
		return -errno;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	for (size_t i = 0; dfd >= 0 && i < m->nfiles; i++) {
		const char *n = m->files[i].name;
		int fd;

		/* a peer's name is a plain entry name, or nothing here */
		if (strchr(n, '/') || !strcmp(n, ".") || !strcmp(n, ".."))
			continue;
		fd = openat(dfd, n, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
			    0600);

		if (fd >= 0)
			close(fd);
	}
	if (dfd >= 0 && flx_ckpt_probe(dir, &fmt) == 0) {
		snprintf(format, len, "%s", fmt);
		rc = 0;
	}
	for (size_t i = 0; dfd >= 0 && i < m->nfiles; i++)
		if (!strchr(m->files[i].name, '/'))
			unlinkat(dfd, m->files[i].name, 0);
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
static const char *be_name(void *ctx, uint32_t id);
static int be_read(void *ctx, const flx_file_span *s, size_t n);

int flx_dm_exchange(flx_dm *m, const char *dir, flx_error *err)
{
	dm_file *local = NULL;
	size_t nlocal = 0;
	sigset_t all, old;
	int rc = list_local(dir, &local, &nlocal, err);

	rc = flx_dm_agree(m, rc, err);
	if (!rc)
		rc = gather(m, local, nlocal, err);
	files_free(local, nlocal);
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
	return flx_dm_agree(m, rc, err);
}

void flx_dm_stats_get(const flx_dm *m, flx_dm_stats *out)
{
	const uint64_t *f = (const uint64_t *)&m->st;
	uint64_t *o = (uint64_t *)out;

	for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
		o[i] = __atomic_load_n(&f[i], __ATOMIC_RELAXED);
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
		       unsigned char **reply, size_t *rlen)
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

/* Wait for req until the deadline: 0, or -ETIMEDOUT (req still pending). */
static int wait_until(MPI_Request *req, int64_t deadline)
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
		backoff(&us, POLL_READ);
	}
}

static void serve(flx_dm *m, const MPI_Status *st)
{
	unsigned char *q = NULL, *reply = NULL, small[8];
	size_t rlen = sizeof(small);
	int count = 0, src = st->MPI_SOURCE, rc;
	uint32_t tag;
	MPI_Request sreq;

	MPI_Get_count(st, MPI_BYTE, &count);
	q = malloc(count > 0 ? (size_t)count : 1);
	if (!q || MPI_Recv(q, count, MPI_BYTE, src, TAG_REQ, m->req,
			   MPI_STATUS_IGNORE) != MPI_SUCCESS) {
		free(q);
		return; /* the asker times out */
	}
	tag = count >= 8 ? get32(q + 4) : 0;
	rc = serve_spans(m, q, count, &reply, &rlen);
	free(q);
	if (!tag || tag > (uint32_t)m->tag_ub || m->dead[src]) {
		free(reply);
		return;
	}
	if (rc) {
		put32(small, (uint32_t)rc);
		put32(small + 4, 0);
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
	if (wait_until(&sreq, now_ns() + (int64_t)m->timeout_s * 500000000)) {
		/* the asker is gone: its send stays pending, and so does its
		 * buffer (leaked: freeing it under MPI would be worse) */
		m->dead[src] = 1;
		atomic_store(&m->any_dead, true);
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
			if (count >= 8)
				(void)scatter(q, p, count);
		}
		if (!left)
			break;
		if (atomic_load(&m->ending))
			break;
		if (now_ns() > deadline) {
			for (size_t i = 0; i < nq; i++)
				if (qs[i].got) {
					m->dead[qs[i].holder] = 1;
					atomic_store(&m->any_dead, true);
				}
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

static int be_read(void *ctx, const flx_file_span *s, size_t n)
{
	flx_dm *m = ctx;
	piece *p = NULL;
	size_t np = 0, cap = 0;
	bool all = false;
	int rc = 0;

	for (size_t i = 0; i < n; i++) {
		if (s[i].file >= m->nfiles ||
		    s[i].off > m->files[s[i].file].size ||
		    s[i].len > m->files[s[i].file].size - s[i].off) {
			free(p);
			return -EIO;
		}
		for (size_t at = 0; at < s[i].len;) {
			size_t k = s[i].len - at;

			if (k > FLX_DM_REQ_BYTES)
				k = FLX_DM_REQ_BYTES;
			if (flx_grow((void **)&p, &cap, np + 1, sizeof(*p))) {
				free(p);
				return -ENOMEM;
			}
			p[np++] = (piece){s[i].file,
					  0,
					  s[i].off + at,
					  (unsigned char *)s[i].buf + at,
					  k,
					  false};
			at += k;
		}
	}
	__atomic_add_fetch(&m->st.batches, 1, __ATOMIC_RELAXED);
	/* a round per holder that fails, at most one per rank */
	for (int round = 0; !rc && !all && round <= m->size; round++) {
		bool alive = false;

		all = true;
		rc = round_trip(m, p, np);
		for (size_t i = 0; i < np; i++)
			if (!p[i].done) {
				all = false;
				alive |= pick_holder(m, p[i].file) >= 0;
			}
		if (all)
			break;
		if (!alive || atomic_load(&m->ending))
			rc = -EIO;
	}
	/* never success with a piece unread */
	if (!rc && !all)
		rc = -EIO;
	free(p);
	return rc;
}

/* ---- the end ---- */

void flx_dm_end(flx_dm *m)
{
	MPI_Request *r;
	int n = 0;

	if (!m)
		return;
	atomic_store(&m->ending, true);
	r = calloc((size_t)m->size, sizeof(*r));
	if (r && m->files && !atomic_load(&m->told))
		for (int k = 0; k < m->size; k++)
			if (k != m->rank && !m->dead[k] &&
			    MPI_Isend(NULL, 0, MPI_BYTE, k, TAG_END, m->req,
				      &r[n]) == MPI_SUCCESS)
				n++;
	for (int k = 0; k < n; k++)
		if (wait_until(&r[k], now_ns() + 2000000000ll)) {
			MPI_Request_free(&r[k]);
			atomic_store(&m->any_dead, true);
		}
	free(r);
	atomic_store(&m->stop, true);
	if (m->svc_started)
		pthread_join(m->svc, NULL);
	files_free(m->files, m->nfiles);
	/* MPI_Finalize waits for every rank: not with one gone */
	if (!atomic_load(&m->any_dead))
		MPI_Finalize();
	free(m->dead);
	pthread_mutex_destroy(&m->mu);
	free(m);
}
