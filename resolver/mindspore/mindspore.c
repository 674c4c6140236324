/* SPDX-License-Identifier: MIT */
/*
 * The MindSpore source (source.h): per-rank checkpoint files and the
 * parallel strategy file that says which box of each parameter every rank
 * holds (docs/formats/mindspore.md).
 *
 * Directory: rank_<N>/ folders, each with .ckpt files (the last in
 * lexicographic order wins, as transform_checkpoints picks) or, from
 * MindSpore 2.4, .safetensors files; or flat files "..rank_<N>.." in the
 * directory itself (docs/formats/mindspore.md#file-names); a single unnumbered
 * .ckpt is rank 0; the part files of a unified_safetensors directory
 * (param_name_map.json beside them,
 * docs/formats/mindspore.md#safetensors-saves: whole tensors) are all rank 0's.
 * The strategy file comes from -o src_strategy=FILE (the source's option;
 * JSON when its name ends in ".json").  Without one only a
 * single rank is read (all of it replicated).
 *
 * A .ckpt file is a run of Checkpoint messages
 * (docs/formats/mindspore.md#ckpt-file-layout).  It is scanned with a bounded
 * wire decoder reading through a small pread window, never the whole file: each
 * tensor_content's file offset and length are recorded, and chunks point at
 * them, so payloads are served in place.  (protobuf-c unpacks whole messages
 * into memory and reports no offsets, which is why it is not used here; the
 * strategy file, small and read whole, is unpacked by protobuf-c, strategy.h.)
 * Encrypted files are refused; a CRC trailer is verified by reading the file
 * once at mount.
 *
 * Global index: the box of each (rank, parameter) from the strategy
 * (strategy.h), stored dims checked against it, replicas dropped (the
 * lowest rank holding a box serves it), chunks from each Value's byte
 * range (a parameter over several Values gives several chunks), coverage
 * checked by the builder.  A parameter without a layout is replicated.
 * An optimizer shard a JSON layout leaves out is inferred from the stored
 * dims against the JSON global shape (flx_ms_opt_infer(),
 * docs/formats/mindspore.md#optimizer-shard). Zero-element parameters have no
 * record from 2.3 on (docs/formats/mindspore.md#dims) and are not in the index,
 * layout or not: the strategy gives no dtype to serve them with (MindSpore's
 * loader keeps the network's value).  A <= 2.2 record with empty content is
 * indexed as DCP indexes a zero-element tensor: one chunk of no bytes per
 * distinct box.
 *
 * A checkpoint of thousands of ranks is read on several threads, in three
 * steps of parts over contiguous runs (flx_run_parts()): the rank
 * directories looked into (scan_dir(), once: the open's probe keeps what
 * it found for load, probe_open()), the rank files read (each part
 * interning its own names and dims, merge_scans() numbering them as one
 * reader in rank order would), and the tensors built (each part with its
 * own pool).  The files are opened between, on this thread, in rank order.
 * Every step reports the first failure in the order of one thread, so the
 * index and the error do not depend on the thread count
 * (flx_ckpt_opts.threads).
 */
#include "crc32.h"
#include "json_guard.h"
#include "source.h"
#include "strategy.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_STRATEGY_BYTES (256ull << 20)
#define MAX_TAG		   65536u
#define MAX_ST_HEADER	   100000000ull
#define WINDOW		   65536u
#define MAX_RANKS	   FLX_MS_MAX_DEVICES
/* what unified_safetensors writes beside its part files
 * (docs/formats/mindspore.md#safetensors-saves) */
#define UNIFIED_MAP "param_name_map.json"

static const uint32_t enc_magic[] = {0x7F3A5ED8u, 0x7F3A5ED9u, 0x7F3A5EDAu};

/* One byte range of a parameter's data (a Value's tensor_content). */
typedef struct piece {
	uint64_t off, len;
} piece;

/* A parameter as one rank's file holds it: its name is
 * loader.names[name] and its dims loader.dimv[dims], interned (every rank
 * of a parameter mostly stores the same); its one byte range starts at p0
 * and is as long as the dims' elements (npieces 1), or its ranges are
 * loader.pc[p0, p0 + npieces) (piece_of()), so that a million of them stay
 * small. */
typedef struct entry {
	uint32_t name; /* index into loader.names, in first-stored order */
	uint32_t rank, file, npieces;
	uint32_t dims; /* index into loader.dimv */
	uint8_t dtype,
	    stored; /* flx_dtype; stored: legacy BFloat16 as float32 */
	uint8_t ndim;
	uint64_t p0;
} entry;

_Static_assert(sizeof(entry) <= 32, "an entry per (rank, parameter)");

/* The run of same-tag records load_ckpt() is reading: one entry once it
 * ends (finish_entry()); its pieces are the tail of loader.pc. */
typedef struct run {
	char name[MAX_TAG + 1];
	uint32_t namelen;
	char type[33]; /* tensor_type of the run's last record */
	uint32_t rank, file, npieces;
	flx_dtype dtype, stored;
	int ndim;
	int64_t dims[FLX_MAX_DIMS];
	uint64_t p0;
} run;

/* Byte strings stored once each: an open-addressing table (cap a power of
 * two, at most half full) of slots naming the copies. */
typedef struct islot {
	const void *p; /* NULL: empty */
	uint32_t n, id;
} islot;

typedef struct itab {
	islot *slot;
	size_t cap, n;
} itab;

typedef struct rankfile {
	uint32_t rank;
	uint32_t idx; /* its file in the index, once opened */
	char *relpath;
} rankfile;

/* Free rf[0, n) and rf. */
static void free_rankfiles(rankfile *rf, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(rf[i].relpath);
	free(rf);
}

/*
 * The rank files [lo, hi) read by one part (flx_run_parts(): parts cover
 * the files in order, each on its own thread): the entries found, their
 * pieces, and the names and dims they use, interned by the part alone.
 * merge_scans() then numbers names and dims as one thread reading every
 * file in order would have.
 */
typedef struct scan {
	const struct loader *L;
	const flx_ckpt *c;
	flx_error *err; /* &own */
	flx_error own;
	size_t lo, hi;
	int rc; /* its first failure (the part stops there) */
	entry *e;
	size_t ne, cape;
	piece *pc; /* every entry's pieces */
	size_t npc, cappc;
	/* entry.name: names[i] (in npool), found by nametab; entry.dims
	 * found by dimtab (in dims), dimv[i] ndimv_of[i] int64s long; a
	 * name's last dims, name_dims[i], are tried first, as the name
	 * after the last entry's is (ranks store parameters in one order) */
	const char **names;
	uint32_t *name_dims;
	size_t nnames, capnames, capname_dims;
	itab nametab, dimtab;
	flx_pool npool, dims;
	const int64_t **dimv;
	uint8_t *ndimv_of;
	size_t ndimv, capdimv, capndimv;
	uint32_t last_name;
	char last_type[33]; /* finish_entry()'s last tensor_type, last_dt */
	flx_dtype last_dt;
	/* merge_scans(): the global numbers of names and dims, and where
	 * the pieces start in loader.pc */
	uint32_t *name_to, *dims_to;
	uint64_t pc0;
} scan;

typedef struct loader {
	flx_build *b;
	flx_ckpt *c;
	flx_error *err;
	flx_ms_strategy *st;
	const char *st_path;
	unsigned threads; /* flx_ckpt_opts.threads */
	flx_pool *pool;	  /* the chunks' (build_tensor()) */
	rankfile *rf;
	size_t nrf, caprf;
	scan *sc; /* the parts that read the rank files, in file order */
	unsigned nsc;
	piece *pc; /* every entry's pieces, the parts' in order */
	size_t npc;
	/* entry.name (after merge_scans()): names[i] (in c->pool, the
	 * tensors' fqn), found by nametab; entry.dims: dimv[i], found by
	 * dimtab (in dims, the parts' dims pools) */
	char **names;
	size_t nnames, capnames;
	itab nametab, dimtab;
	flx_pool dims;
	const int64_t **dimv;
	size_t ndimv, capdimv;
	bool safetensors;
	/* unnumbered top-level .safetensors names (owned), and whether
	 * param_name_map.json is beside them: a unified_safetensors output
	 * (docs/formats/mindspore.md#safetensors-saves), whose files together
	 * are one whole checkpoint */
	char **flat_st;
	size_t nflat, capflat;
	bool unified;
} loader;

/* Parts (threads) for n things, per a part (flx_part_count()). */
static unsigned parts_for(const loader *L, size_t n, size_t per)
{
	return flx_part_count(L->threads, n, per);
}

/* ---- directory ---- */

static bool ends_with(const char *s, const char *suf)
{
	size_t n = strlen(s), m = strlen(suf);
	return n >= m && strcmp(s + n - m, suf) == 0;
}

static bool is_data_name(const char *s)
{
	return ends_with(s, ".ckpt") || ends_with(s, ".safetensors");
}

/* "rank_<digits>" at s: the number. */
static bool rank_at(const char *s, uint32_t *r, size_t *used)
{
	uint64_t v = 0;
	size_t i = 5;
	if (strncmp(s, "rank_", 5) != 0 || s[5] < '0' || s[5] > '9')
		return false;
	while (s[i] >= '0' && s[i] <= '9' && i < 13)
		v = v * 10 + (uint64_t)(s[i++] - '0');
	if (v >= MAX_RANKS || (s[i] >= '0' && s[i] <= '9'))
		return false;
	*r = (uint32_t)v;
	*used = i;
	return true;
}

static bool is_rank_dir(const char *s, uint32_t *r)
{
	size_t n;
	return rank_at(s, r, &n) && s[n] == 0;
}

/* a flat file's rank: the last "rank_<N>" in its name */
static bool flat_rank(const char *s, uint32_t *r)
{
	bool any = false;
	for (const char *p = strstr(s, "rank_"); p;
	     p = strstr(p + 1, "rank_")) {
		size_t n;
		uint32_t v;
		if (rank_at(p, &v, &n)) {
			*r = v;
			any = true;
		}
	}
	return any;
}

static bool owns(const char *name)
{
	return is_data_name(name) || ends_with(name, ".tmp") ||
	       ends_with(name, ".meta") || strcmp(name, "meta.json") == 0 ||
	       strcmp(name, UNIFIED_MAP) == 0;
}

/* The last two runs of decimal digits met by scan_digits(). */
typedef struct last_two {
	const char *p[2]; /* p[1] the last, p[0] the one before */
	size_t n[2];
	unsigned count;
} last_two;

static void scan_digits(last_two *k, const char *s)
{
	while (*s) {
		size_t n = 0;

		if (*s < '0' || *s > '9') {
			s++;
			continue;
		}
		while (s[n] >= '0' && s[n] <= '9')
			n++;
		k->p[0] = k->p[1];
		k->n[0] = k->n[1];
		k->p[1] = s;
		k->n[1] = n;
		k->count += k->count < 2;
		s += n;
	}
}

/* numeric order of two digit runs of any length */
static int cmp_run(const char *a, size_t na, const char *b, size_t nb)
{
	while (na > 1 && *a == '0')
		a++, na--;
	while (nb > 1 && *b == '0')
		b++, nb--;
	if (na != nb)
		return na < nb ? -1 : 1;
	return memcmp(a, b, na);
}

/*
 * Whether safetensors file dir/a sorts after dir/b as MindSpore picks a
 * rank's file (docs/formats/mindspore.md#file-names: the last after sorting on
 * the last two integers of the path, a Python list: element by element, a
 * shorter prefix first; _extract_last_two_numbers); equal keys: the later name.
 */
static bool st_later(const char *dir, const char *a, const char *b)
{
	last_two x = {0}, y = {0};
	unsigned nx, ny;

	scan_digits(&x, dir);
	scan_digits(&y, dir);
	scan_digits(&x, a);
	scan_digits(&y, b);
	for (nx = 2 - x.count, ny = 2 - y.count; nx < 2 && ny < 2; nx++, ny++) {
		int c = cmp_run(x.p[nx], x.n[nx], y.p[ny], y.n[ny]);
		if (c)
			return c > 0;
	}
	if (x.count != y.count)
		return x.count > y.count;
	return strcmp(a, b) > 0;
}

/* Whether file a of rank directory dir is a better data file than b: a
 * .ckpt over a .safetensors; .ckpt files the last by name (the
 * transform's glob sorted), .safetensors by st_later(). */
static bool better_in_dir(const char *dir, const char *a, const char *b)
{
	bool ca = ends_with(a, ".ckpt"), cb = ends_with(b, ".ckpt");

	if (ca != cb)
		return ca;
	return ca ? strcmp(a, b) > 0 : st_later(dir, a, b);
}

/* The data file of a rank directory (better_in_dir()'s best).  *best
 * NULL when none. */
static int pick_in_dir(int dirfd, const char *sub, char **best)
{
	int fd = openat(dirfd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char *ck = NULL, *sf = NULL;
	DIR *d;
	struct dirent *de;

	*best = NULL;
	if (fd < 0)
		return -errno;
	if (!(d = fdopendir(fd))) {
		close(fd);
		return -errno;
	}
	while ((de = readdir(d))) {
		char **slot = ends_with(de->d_name, ".ckpt")	      ? &ck
			      : ends_with(de->d_name, ".safetensors") ? &sf
								      : NULL;
		if (!slot || de->d_name[0] == '.')
			continue;
		if (!*slot || better_in_dir(sub, de->d_name, *slot)) {
			char *x = strdup(de->d_name);
			if (!x) {
				closedir(d);
				free(ck);
				free(sf);
				return -ENOMEM;
			}
			free(*slot);
			*slot = x;
		}
	}
	closedir(d);
	if (ck) {
		free(sf);
		sf = ck;
	}
	if (sf && asprintf(best, "%s/%s", sub, sf) < 0) {
		*best = NULL;
		free(sf);
		return -ENOMEM;
	}
	free(sf);
	return 0;
}

/* Append (rank, relpath) (relpath owned, freed on failure). */
static int push_rankfile(loader *L, uint32_t rank, char *relpath)
{
	if (flx_grow((void **)&L->rf, &L->caprf, L->nrf + 1, sizeof(*L->rf))) {
		free(relpath);
		return -ENOMEM;
	}
	L->rf[L->nrf++] = (rankfile){.rank = rank, .relpath = relpath};
	return 0;
}

/* Rank rank's file relpath (owned, freed on failure): of several for one
 * rank the last name wins (flat files of one rank, rank_5/ and rank_05/),
 * which scan_end() keeps.  @return 0 or -ENOMEM. */
static int add_rankfile(loader *L, uint32_t rank, char *relpath)
{
	return push_rankfile(L, rank, relpath);
}

static int cmp_rankfile(const void *a, const void *b)
{
	const rankfile *x = a, *y = b;
	if (x->rank != y->rank)
		return x->rank > y->rank ? 1 : -1;
	return strcmp(x->relpath, y->relpath);
}

/* The end of a scan for rank files, whose outcome so far is rc: when no
 * numbered file was found, the unnumbered .safetensors of a unified
 * directory are all rank 0's, else a lone unnumbered file (single,
 * owned; NULL: none) is rank 0; the rank files sorted.  @return 0 or
 * -errno. */
static int scan_end(loader *L, char *single, int rc)
{
	bool unified = !rc && L->nrf == 0 && L->unified && L->nflat;

	for (size_t i = 0; i < L->nflat; i++) {
		if (unified && !rc)
			rc = push_rankfile(L, 0, L->flat_st[i]);
		else
			free(L->flat_st[i]);
	}
	free(L->flat_st);
	L->flat_st = NULL;
	L->nflat = 0;
	L->unified = unified;
	if (!rc && L->nrf == 0 && single) {
		rc = add_rankfile(L, 0, single);
		single = NULL;
	}
	free(single);
	if (rc)
		return flx_error_set(L->err, rc, NULL, NULL,
				     "cannot list the rank directories: %s",
				     strerror(-rc));
	if (L->nrf == 0)
		return flx_error_set(L->err, -ENOENT, "rank_<N>/*.ckpt", NULL,
				     "no MindSpore checkpoint files");
	qsort(L->rf, L->nrf, sizeof(*L->rf), cmp_rankfile);
	/* each rank's last name (a unified directory's files are all rank
	 * 0's) */
	size_t n = 0;
	for (size_t i = 0; i < L->nrf; i++) {
		if (!unified && i + 1 < L->nrf &&
		    L->rf[i + 1].rank == L->rf[i].rank) {
			free(L->rf[i].relpath);
			continue;
		}
		L->rf[n++] = L->rf[i];
	}
	L->nrf = n;
	return 0;
}

/* A flat data file name of the top directory: a numbered one is that
 * rank's file; an unnumbered one replaces *single (owned) when it sorts
 * later (scan_end() decides what a lone one is).  @return 0 or -errno. */
static int add_flat(loader *L, const char *name, char **single)
{
	uint32_t r;
	char *rel = strdup(name);

	if (!rel)
		return -ENOMEM;
	if (flat_rank(name, &r))
		return add_rankfile(L, r, rel);
	if (ends_with(name, ".safetensors")) {
		char *x = strdup(name);
		if (!x || flx_grow((void **)&L->flat_st, &L->capflat,
				   L->nflat + 1, sizeof(*L->flat_st))) {
			free(x);
			free(rel);
			return -ENOMEM;
		}
		L->flat_st[L->nflat++] = x;
	}
	if (!*single || strcmp(rel, *single) > 0) {
		free(*single);
		*single = rel;
	} else {
		free(rel);
	}
	return 0;
}

/* A name at the top of the directory, for scan_dir(): its type as the
 * listing gives it (DT_UNKNOWN when it does not), whether it is a rank
 * directory, and then its data file (pick_in_dir(): rel, owned, or NULL)
 * or the failure to find it (rc). */
typedef struct topname {
	char *name;
	unsigned char type;
	uint32_t rank;
	bool rankdir;
	int rc;
	char *rel;
} topname;

/* The names [lo, hi) of t whose rank directories one thread looks into. */
typedef struct dirpart {
	int dirfd;
	topname *t;
	size_t lo, hi;
} dirpart;

static void *dirpart_run(void *arg)
{
	dirpart *P = arg;

	for (size_t i = P->lo; i < P->hi; i++) {
		topname *t = &P->t[i];
		struct stat sb;

		/* a directory the listing says is one needs no stat (a
		 * symlink to one does) */
		if (!is_rank_dir(t->name, &t->rank) ||
		    (t->type != DT_DIR && (fstatat(P->dirfd, t->name, &sb, 0) ||
					   !S_ISDIR(sb.st_mode))))
			continue;
		t->rankdir = true;
		t->rc = pick_in_dir(P->dirfd, t->name, &t->rel);
	}
	return NULL;
}

/*
 * The rank files of the directory.  A checkpoint of thousands of ranks has
 * as many rank directories, each listed for its data file: past
 * DIRS_PER_PART names they are looked into on several threads (parts over
 * contiguous runs of the listing, threads as read_rankfiles() has them),
 * then taken in listing order, stopping at the first failure, as one
 * thread looking into each in turn does.
 */
#define DIRS_PER_PART 256

static int scan_dir(loader *L, int dirfd)
{
	int fd = dup(dirfd);
	DIR *d;
	struct dirent *de;
	int rc = 0;
	char *single = NULL;
	topname *t = NULL;
	size_t nt = 0, capt = 0;
	dirpart p[FLX_MAX_THREADS];
	unsigned np;

	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return flx_error_set(L->err, -errno, NULL, NULL,
				     "cannot list the directory");
	}
	rewinddir(d);
	while (!rc && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		if (flx_grow((void **)&t, &capt, nt + 1, sizeof(*t))) {
			rc = -ENOMEM;
			break;
		}
		t[nt] =
		    (topname){.name = strdup(de->d_name), .type = de->d_type};
		if (!t[nt].name)
			rc = -ENOMEM;
		else
			nt++;
	}
	closedir(d);
	np = parts_for(L, nt, DIRS_PER_PART);
	for (unsigned k = 0; k < np; k++)
		p[k] = (dirpart){dirfd, t, nt * k / np, nt * (k + 1) / np};
	if (!rc)
		flx_run_parts(p, sizeof(*p), np, dirpart_run);
	for (size_t i = 0; !rc && i < nt; i++) {
		if (t[i].rankdir) {
			rc = t[i].rc;
			if (!rc && t[i].rel) {
				rc = add_rankfile(L, t[i].rank, t[i].rel);
				t[i].rel = NULL;
			}
		} else if (is_data_name(t[i].name)) {
			rc = add_flat(L, t[i].name, &single);
		} else if (strcmp(t[i].name, UNIFIED_MAP) == 0) {
			L->unified = true;
		}
	}
	for (size_t i = 0; i < nt; i++) {
		free(t[i].name);
		free(t[i].rel);
	}
	free(t);
	return scan_end(L, single, rc);
}

/* "rank_<N>/<data file>" (no further '/', no hidden file): N. */
static bool rank_dir_file(const char *n, uint32_t *r)
{
	const char *sl = strchr(n, '/');
	char dir[32];

	if (!sl || (size_t)(sl - n) >= sizeof(dir) || strchr(sl + 1, '/') ||
	    sl[1] == '.' || !is_data_name(sl + 1))
		return false;
	memcpy(dir, n, (size_t)(sl - n));
	dir[sl - n] = '\0';
	return is_rank_dir(dir, r);
}

/*
 * scan_dir() over the names of every node's files (-o mpi:
 * flx_build_remote_name(), this node's own included), where rank_0/ may be
 * on one node and rank_1/ on another: the same choices by the same rules.
 */
static int scan_names(loader *L)
{
	const char *n;
	char *single = NULL;
	int rc = 0;

	/* rank directories first: each one's best file */
	for (uint32_t i = 0; !rc && (n = flx_build_remote_name(L->b, i)); i++) {
		uint32_t r;
		size_t k;

		if (!rank_dir_file(n, &r))
			continue;
		for (k = 0; k < L->nrf && L->rf[k].rank != r; k++)
			;
		if (k < L->nrf) {
			char *x, dir[32];

			memcpy(dir, n, (size_t)(strchr(n, '/') - n));
			dir[strchr(n, '/') - n] = '\0';
			if (!better_in_dir(dir, strchr(n, '/') + 1,
					   strchr(L->rf[k].relpath, '/') + 1))
				continue;
			if (!(x = strdup(n))) {
				rc = -ENOMEM;
				break;
			}
			free(L->rf[k].relpath);
			L->rf[k].relpath = x;
		} else {
			char *x = strdup(n);

			rc = x ? add_rankfile(L, r, x) : -ENOMEM;
		}
	}
	/* then flat files, as scan_dir() takes them */
	for (uint32_t i = 0; !rc && (n = flx_build_remote_name(L->b, i)); i++) {
		if (strcmp(n, UNIFIED_MAP) == 0)
			L->unified = true;
		if (n[0] == '.' || strchr(n, '/') || !is_data_name(n))
			continue;
		rc = add_flat(L, n, &single);
	}
	return scan_end(L, single, rc);
}

/* The rank files scan_dir() found for probe_open(), kept for load
 * (flx_build_keep()): looking into thousands of rank directories once. */
typedef struct found {
	rankfile *rf;
	size_t nrf;
	bool unified;
} found;

static void found_free(void *p)
{
	found *f = p;

	if (f)
		free_rankfiles(f->rf, f->nrf);
	free(f);
}

/* Whether scan_dir() finds rank files in dirfd; unless f is NULL, what
 * it found into *f (owned; NULL when none, or when there is no memory to
 * keep it: load then looks again).  @return 0, -ENOMEM. */
static int probe_scan(int dirfd, bool *yes, found **f)
{
	loader L = {0};
	flx_error e;
	int rc;

	flx_error_init(&e);
	L.err = &e;
	*yes = false;
	if (f)
		*f = NULL;
	rc = scan_dir(&L, dirfd);
	*yes = rc == 0;
	if (f && rc == 0 && (*f = malloc(sizeof(**f)))) {
		**f = (found){L.rf, L.nrf, L.unified};
		L.rf = NULL;
		L.nrf = 0;
	}
	free_rankfiles(L.rf, L.nrf);
	return rc == -ENOMEM ? rc : 0;
}

static int probe(int dirfd, bool *yes)
{
	return probe_scan(dirfd, yes, NULL);
}

static int probe_open(flx_build *b, bool *yes)
{
	found *f = NULL;
	int rc = probe_scan(flx_build_dirfd(b), yes, &f);

	if (f)
		flx_build_keep(b, f, found_free);
	return rc;
}

/* ---- .ckpt records ---- */

/* A window over file idx of the index, read through the file table (a
 * file another node holds too, -o mpi): bytes are fetched WINDOW at a
 * time. */
typedef struct frd {
	const flx_ckpt *c;
	uint32_t idx;
	uint64_t size, base;
	size_t n;
	uint8_t buf[WINDOW];
} frd;

/* -EBADMSG: the bytes are malformed (the caller says where); -errno:
 * the read failed. */
static int frd_byte(frd *r, uint64_t pos, uint64_t end, uint8_t *b)
{
	if (pos >= end)
		return -EBADMSG;
	if (pos < r->base || pos >= r->base + r->n) {
		size_t want = WINDOW;
		if (want > r->size - pos)
			want = (size_t)(r->size - pos);
		int rc = flx_file_pread(r->c, r->idx, r->buf, want, pos);
		if (rc)
			return rc;
		r->base = pos;
		r->n = want;
	}
	*b = r->buf[pos - r->base];
	return 0;
}

/* frd_varint() past its one-byte case. */
static int frd_varint_long(frd *r, uint64_t *pos, uint64_t end, uint64_t *v)
{
	uint64_t x = 0, p = *pos;

	/* within the window: straight from its bytes */
	if (p < end && p >= r->base && p - r->base < r->n) {
		const uint8_t *b = r->buf + (p - r->base);
		uint64_t m = r->n - (p - r->base);

		if (m > end - p)
			m = end - p;
		if (m > 10)
			m = 10;
		for (unsigned i = 0; i < m; i++) {
			if (i == 9 && b[i] > 1)
				return -EBADMSG;
			x |= (uint64_t)(b[i] & 0x7f) << (7 * i);
			if (!(b[i] & 0x80)) {
				*v = x;
				*pos = p + i + 1;
				return 0;
			}
		}
		if (m == 10)
			return -EBADMSG;
		x = 0; /* cut by the window or end: byte by byte */
	}
	for (unsigned i = 0; i < 10; i++) {
		uint8_t b = 0;
		int rc = frd_byte(r, (*pos)++, end, &b);
		if (rc)
			return rc;
		if (i == 9 && b > 1)
			return -EBADMSG;
		x |= (uint64_t)(b & 0x7f) << (7 * i);
		if (!(b & 0x80)) {
			*v = x;
			return 0;
		}
	}
	return -EBADMSG;
}

/* The varint at *pos (before end) into *v, *pos moved past it.  A
 * record's keys, lengths and dims are mostly one byte, read here straight
 * from the window.  @return 0, -EBADMSG, or the read's -errno. */
static inline int frd_varint(frd *r, uint64_t *pos, uint64_t end, uint64_t *v)
{
	uint64_t p = *pos;

	/* p - base wraps past n when p is before the window */
	if (p < end && p - r->base < r->n && r->buf[p - r->base] < 0x80) {
		*v = r->buf[p - r->base];
		*pos = p + 1;
		return 0;
	}
	return frd_varint_long(r, pos, end, v);
}

static int frd_read(frd *r, uint64_t pos, void *dst, size_t n)
{
	uint8_t *d = dst;

	if (pos >= r->base && pos - r->base <= r->n &&
	    n <= r->n - (pos - r->base) && n <= r->size - pos) {
		memcpy(d, r->buf + (pos - r->base), n);
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		int rc = frd_byte(r, pos + i, r->size, &d[i]);
		if (rc)
			return rc;
	}
	return 0;
}

/* key and, for LEN, the payload's [*pos, *sub_end) (a VARINT's value
 * follows: *sub_end is *pos) */
static inline int frd_field(frd *r, uint64_t *pos, uint64_t end,
			    uint32_t *field, uint32_t *wt, uint64_t *sub_end)
{
	uint64_t k, n;
	int rc = frd_varint(r, pos, end, &k);
	if (rc)
		return rc;
	if ((k >> 3) == 0)
		return -EBADMSG;
	*field = (uint32_t)(k >> 3);
	*wt = (uint32_t)(k & 7);
	switch (*wt) {
	case 0:
		*sub_end = *pos;
		return 0;
	case 1:
	case 5:
		n = *wt == 1 ? 8 : 4;
		break;
	case 2:
		if ((rc = frd_varint(r, pos, end, &n)))
			return rc;
		break;
	default:
		return -EBADMSG;
	}
	if (n > end - *pos)
		return -EBADMSG;
	*sub_end = *pos + n;
	return 0;
}

typedef struct record {
	char tag[MAX_TAG + 1];
	uint32_t taglen;
	char type[33];
	bool has_tensor, map;
	int ndim;
	int64_t dims[FLX_MAX_DIMS];
	uint64_t off, len;
} record;

static int parse_tensor(frd *r, uint64_t pos, uint64_t end, record *rec)
{
	uint32_t field, wt;
	uint64_t sub, v;
	int rc;
	bool have_type = false, have_content = false;

	while (pos < end) {
		if ((rc = frd_field(r, &pos, end, &field, &wt, &sub)))
			return rc;
		if (field == 1 && (wt == 0 || wt == 2)) {
			/* unpacked: one varint; packed: varints that end
			 * inside the payload */
			uint64_t stop = wt == 0 ? pos + 1 : sub;
			while (pos < stop) {
				if ((rc = frd_varint(r, &pos,
						     wt == 0 ? end : sub, &v)))
					return rc;
				if (rec->ndim == FLX_MAX_DIMS ||
				    v > (uint64_t)INT64_MAX)
					return -E2BIG;
				rec->dims[rec->ndim++] = (int64_t)v;
				if (wt == 0)
					break;
			}
			continue;
		}
		if (wt == 0 && (rc = frd_varint(r, &pos, end, &v)))
			return rc;
		if (wt == 0)
			continue;
		if (field == 2 && wt == 2) {
			if (sub - pos >= sizeof(rec->type))
				return -EBADMSG;
			if ((rc = frd_read(r, pos, rec->type, sub - pos)))
				return rc;
			rec->type[sub - pos] = 0;
			have_type = true;
		} else if (field == 3 && wt == 2) {
			rec->off = pos;
			rec->len = sub - pos;
			have_content = true;
		}
		pos = sub;
	}
	return have_type && have_content ? 0 : -EBADMSG;
}

static int parse_value(frd *r, uint64_t pos, uint64_t end, record *rec)
{
	uint32_t field, wt;
	uint64_t sub, v;
	int rc;
	bool have_tag = false;

	rec->has_tensor = rec->map = false;
	rec->ndim = 0;
	while (pos < end) {
		if ((rc = frd_field(r, &pos, end, &field, &wt, &sub)))
			return rc;
		if (wt == 0) {
			if ((rc = frd_varint(r, &pos, end, &v)))
				return rc;
			continue;
		}
		if (field == 1 && wt == 2) {
			if (sub - pos > MAX_TAG)
				return -E2BIG;
			if ((rc = frd_read(r, pos, rec->tag, sub - pos)))
				return rc;
			rec->tag[sub - pos] = 0;
			rec->taglen = (uint32_t)(sub - pos);
			if (memchr(rec->tag, 0, rec->taglen))
				return -EBADMSG;
			have_tag = true;
		} else if (field == 2 && wt == 2) {
			rec->ndim = 0;
			if ((rc = parse_tensor(r, pos, sub, rec)))
				return rc;
			rec->has_tensor = true;
		} else if (field == 3 && wt == 2) {
			rec->map = true;
		}
		pos = sub;
	}
	return have_tag && (rec->has_tensor || rec->map) ? 0 : -EBADMSG;
}

static const struct {
	const char *name;
	flx_dtype dt;
} ms_types[] = {
    {"Bool", FLX_DT_BOOL},     {"Int8", FLX_DT_I8},	{"UInt8", FLX_DT_U8},
    {"Int16", FLX_DT_I16},     {"UInt16", FLX_DT_U16},	{"Int32", FLX_DT_I32},
    {"UInt32", FLX_DT_U32},    {"Int64", FLX_DT_I64},	{"UInt64", FLX_DT_U64},
    {"Float16", FLX_DT_F16},   {"Float32", FLX_DT_F32}, {"Float64", FLX_DT_F64},
    {"BFloat16", FLX_DT_BF16},
};

static flx_dtype ms_dtype(const char *s)
{
	for (size_t i = 0; i < sizeof(ms_types) / sizeof(ms_types[0]); i++)
		if (strcmp(s, ms_types[i].name) == 0)
			return ms_types[i].dt;
	return FLX_DT_INVALID;
}

/* FNV-1a */
static uint32_t hash_bytes(const void *p, size_t n)
{
	const unsigned char *c = p;
	uint64_t x = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++)
		x = (x ^ c[i]) * 1099511628211ull;
	return (uint32_t)(x ^ (x >> 32));
}

/* Whether a[0, n) == b[0, n): a few dims, compared in line (a call a
 * compare costs as much, a million times over). */
static inline bool same_dims(const int64_t *a, const int64_t *b, int n)
{
	for (int d = 0; d < n; d++)
		if (a[d] != b[d])
			return false;
	return true;
}

/* The slot of key (n bytes, hash h) in t: the one holding it or the empty
 * one it goes to. */
static islot *itab_slot(const itab *t, const void *key, uint32_t n, uint32_t h)
{
	for (size_t i = h & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
		islot *s = &t->slot[i];

		if (!s->p || (s->n == n && memcmp(s->p, key, n) == 0))
			return s;
	}
}

/* Make room in t for one more key.  @return 0, -ENOMEM. */
static int itab_room(itab *t)
{
	size_t cap = t->cap ? 2 * t->cap : 64;
	islot *old = t->slot, *ns;
	size_t oldcap = t->cap;

	if (t->n + 1 <= t->cap / 2)
		return 0;
	if (t->n >= UINT32_MAX || !(ns = calloc(cap, sizeof(*ns))))
		return -ENOMEM;
	t->slot = ns;
	t->cap = cap;
	for (size_t i = 0; i < oldcap; i++)
		if (old[i].p)
			*itab_slot(t, old[i].p, old[i].n,
				   hash_bytes(old[i].p, old[i].n)) = old[i];
	free(old);
	return 0;
}

/*
 * Into *copy the stored copy of key (n bytes) and into *id its number:
 * t's count before it when it is new, which pool (when not NULL) then
 * stores a copy of, else t keeps key itself (which must outlive t).
 * @return 0, -ENOMEM.
 */
static int intern(itab *t, flx_pool *pool, const void *key, uint32_t n,
		  const void **copy, uint32_t *id)
{
	islot *s;

	if (itab_room(t))
		return -ENOMEM;
	s = itab_slot(t, key, n, hash_bytes(key, n));
	if (!s->p) {
		void *c = (void *)key;

		if (pool && !(c = flx_pool_alloc(pool, n ? n : 1)))
			return -ENOMEM;
		if (pool)
			memcpy(c, key, n);
		*s = (islot){c, n, (uint32_t)t->n++};
	}
	*copy = s->p;
	*id = s->id;
	return 0;
}

/* The number of name (n bytes with its NUL) in S: the one after the last
 * entry's when it matches, else interned.  @return 0, -ENOMEM. */
static int name_id(scan *S, const char *name, uint32_t n, uint32_t *id)
{
	uint32_t g = S->last_name + 1 < S->nnames ? S->last_name + 1 : 0;
	const void *nm;

	if (g < S->nnames && strcmp(S->names[g], name) == 0) {
		*id = g;
		return 0;
	}
	if (flx_grow((void **)&S->names, &S->capnames, S->nnames + 1,
		     sizeof(*S->names)) ||
	    flx_grow((void **)&S->name_dims, &S->capname_dims, S->nnames + 1,
		     sizeof(*S->name_dims)) ||
	    intern(&S->nametab, &S->npool, name, n, &nm, id))
		return -ENOMEM;
	if (*id == S->nnames) {
		S->names[S->nnames] = nm;
		S->name_dims[S->nnames++] = UINT32_MAX;
	}
	return 0;
}

/* The number of dims[0, ndim) in S, for an entry of name id: the name's
 * last dims when they match, else interned.  @return 0, -ENOMEM. */
static int dims_id(scan *S, uint32_t name, int ndim, const int64_t *dims,
		   uint32_t *id)
{
	uint32_t g = S->name_dims[name];
	size_t n = sizeof(int64_t) * (size_t)ndim;
	const void *dm;

	if (g != UINT32_MAX && S->ndimv_of[g] == ndim &&
	    same_dims(S->dimv[g], dims, ndim)) {
		*id = g;
		return 0;
	}
	if (flx_grow((void **)&S->dimv, &S->capdimv, S->ndimv + 1,
		     sizeof(*S->dimv)) ||
	    flx_grow((void **)&S->ndimv_of, &S->capndimv, S->ndimv + 1,
		     sizeof(*S->ndimv_of)) ||
	    intern(&S->dimtab, &S->dims, dims, (uint32_t)n, &dm, id))
		return -ENOMEM;
	if (*id == S->ndimv) {
		S->dimv[S->ndimv] = dm;
		S->ndimv_of[S->ndimv++] = (uint8_t)ndim;
	}
	S->name_dims[name] = *id;
	return 0;
}

/* Append to S->e the entry of name (namelen bytes; its pieces are S->pc[p0, p0
 * + npieces): one alone is taken back into the entry, as the length its dims
 * give).  @return 0 or -ENOMEM. */
static int push_entry(scan *S, const char *name, size_t namelen, uint32_t rank,
		      uint32_t file, flx_dtype dtype, flx_dtype stored,
		      int ndim, const int64_t *dims, uint64_t p0,
		      uint32_t npieces)
{
	uint32_t id, did;

	if (flx_grow((void **)&S->e, &S->cape, S->ne + 1, sizeof(*S->e)) ||
	    name_id(S, name, (uint32_t)namelen + 1, &id) ||
	    dims_id(S, id, ndim, dims, &did))
		return -ENOMEM;
	S->last_name = id;
	/* one piece: its offset in the entry, its length the elements' */
	if (npieces == 1) {
		S->npc = p0;
		p0 = S->pc[p0].off;
	}
	S->e[S->ne++] = (entry){.name = id,
				.rank = rank,
				.file = file,
				.npieces = npieces,
				.dims = did,
				.dtype = (uint8_t)dtype,
				.stored = (uint8_t)stored,
				.ndim = (uint8_t)ndim,
				.p0 = p0};
	return 0;
}

static const int64_t *dims_of(const loader *L, const entry *e)
{
	return L->dimv[e->dims];
}

/* Bytes per stored element of e. */
static unsigned elsize(const entry *e)
{
	return flx_dtype_size(e->stored ? e->stored : e->dtype);
}

/* Byte range p of e's data. */
static piece piece_of(const loader *L, const entry *e, uint32_t p)
{
	if (e->npieces == 1)
		return (piece){e->p0,
			       flx_numel(e->ndim, dims_of(L, e)) * elsize(e)};
	return L->pc[e->p0 + p];
}

/* Append a piece to S->pc.  @return 0 or -ENOMEM. */
static int push_piece(scan *S, uint64_t off, uint64_t len)
{
	if (flx_grow((void **)&S->pc, &S->cappc, S->npc + 1, sizeof(*S->pc)))
		return -ENOMEM;
	S->pc[S->npc++] = (piece){off, len};
	return 0;
}

/* Close the run of same-tag records in *cur: dtype and dims from the last
 * record (docs/formats/mindspore.md#large-tensors), legacy rules
 * (docs/formats/mindspore.md#tensor-types, docs/formats/mindspore.md#dims),
 * total length checked.  A run not kept gives its pieces back. */
static int finish_entry(scan *S, const char *file, run *cur)
{
	uint64_t total = 0, numel;
	flx_dtype dt = S->last_dt;
	const piece *pc = &S->pc[cur->p0];
	int rc;

	if (cur->type[0] == 's' && strcmp(cur->type, "str") == 0) {
		/* append_dict text: not a tensor, not served */
		S->npc = cur->p0;
		return 0;
	}
	if (strcmp(cur->type, S->last_type) != 0) {
		dt = ms_dtype(cur->type);
		memcpy(S->last_type, cur->type, sizeof(S->last_type));
		S->last_dt = dt;
	}
	if (dt == FLX_DT_INVALID) {
		rc = flx_error_set(S->err, -EINVAL, file, cur->name,
				   "tensor_type '%s' is not supported",
				   cur->type);
		goto fail;
	}
	cur->dtype = dt;
	for (uint32_t i = 0; i < cur->npieces; i++)
		total += pc[i].len;
	/* ≤ 2.2 scalars: dims [0] holding one element (a BFloat16 one as
	 * the float32 that version wrote,
	 * docs/formats/mindspore.md#tensor-types) */
	if (cur->ndim == 1 && cur->dims[0] == 0 &&
	    (total == flx_dtype_size(dt) ||
	     (dt == FLX_DT_BF16 && total == 4))) {
		cur->ndim = 0;
	}
	numel = flx_numel(cur->ndim, cur->dims);
	if (numel == UINT64_MAX || numel > (UINT64_MAX >> 4)) {
		rc = flx_error_set(S->err, -EINVAL, file, cur->name,
				   "dims too large");
		goto fail;
	}
	if (dt == FLX_DT_BF16 && total == numel * 4 && numel) {
		cur->stored = FLX_DT_F32; /* ≤ 2.2: bf16 written as float32 */
	} else if (total != numel * flx_dtype_size(dt)) {
		rc = flx_error_set(
		    S->err, -EINVAL, file, cur->name,
		    "tensor_content holds %llu bytes, dims and "
		    "%s need %llu",
		    (unsigned long long)total, cur->type,
		    (unsigned long long)(numel * flx_dtype_size(dt)));
		goto fail;
	}
	for (uint32_t i = 0; i < cur->npieces; i++)
		if (pc[i].len %
		    flx_dtype_size(cur->stored ? cur->stored : dt)) {
			rc = flx_error_set(S->err, -EINVAL, file, cur->name,
					   "a Value's tensor_content is not a "
					   "whole number of elements");
			goto fail;
		}
	return push_entry(S, cur->name, cur->namelen, cur->rank, cur->file,
			  cur->dtype, cur->stored, cur->ndim, cur->dims,
			  cur->p0, cur->npieces);
fail:
	S->npc = cur->p0;
	return rc;
}

static int check_crc(scan *S, const char *file, frd *r, uint64_t end,
		     const uint8_t *be)
{
	uint64_t want = 0;
	uint32_t crc = 0;
	unsigned high = 0;
	/* the CRC-32 as a 10-byte big-endian integer
	 * (docs/formats/mindspore.md#ckpt-file-layout): MindSpore compares the
	 * whole integer, so a non-zero high byte matches none */
	for (int i = 0; i < 10; i++) {
		if (i < 6)
			high |= be[i];
		else
			want = want << 8 | be[i];
	}
	if (high)
		return flx_error_set(S->err, -EINVAL, file, "crc_num",
				     "the trailer's 10-byte CRC-32 is above "
				     "32 bits");
	for (uint64_t pos = 0; pos < end;) {
		size_t n = WINDOW;
		if (n > end - pos)
			n = (size_t)(end - pos);
		int rc = flx_file_pread(r->c, r->idx, r->buf, n, pos);
		if (rc)
			return flx_error_set(S->err, rc, file, NULL,
					     "cannot read");
		r->base = pos;
		r->n = n;
		crc = flx_crc32(crc, r->buf, n);
		pos += n;
	}
	if (want != crc)
		return flx_error_set(S->err, -EINVAL, file, "crc_num",
				     "CRC-32 of the file is %08x, its trailer "
				     "says %08llx",
				     crc, (unsigned long long)want);
	return 0;
}

static int load_ckpt(scan *S, uint32_t rank, uint32_t idx, const char *file)
{
	frd *r = malloc(sizeof(*r));
	record *rec = malloc(sizeof(*rec));
	run *cur = malloc(sizeof(*cur));
	uint64_t pos = 0, end, at = 0;
	bool open_run = false;
	uint8_t head[4], tail[17];
	int rc = 0;

	if (!r || !rec || !cur) {
		rc = -ENOMEM;
		goto out;
	}
	r->c = S->c;
	r->idx = idx;
	r->size = end = S->c->files[idx].size;
	r->base = r->n = 0;
	if (end >= 4) {
		if ((rc = frd_read(r, 0, head, 4)))
			goto io;
		uint32_t m = (uint32_t)head[0] | (uint32_t)head[1] << 8 |
			     (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24;
		for (size_t i = 0; i < 3; i++)
			if (m == enc_magic[i]) {
				rc = flx_error_set(
				    S->err, -EINVAL, file, NULL,
				    "encrypted checkpoint (%s); flexfs reads "
				    "only plain files: decrypt it first",
				    i == 0   ? "AES-GCM"
				    : i == 1 ? "AES-CBC"
					     : "SM4-CBC");
				goto out;
			}
	}
	if (end >= 17) {
		if ((rc = frd_read(r, end - 17, tail, 17)))
			goto io;
		if (memcmp(tail, "crc_num", 7) == 0) {
			end -= 17;
			if ((rc = check_crc(S, file, r, end, tail + 7)))
				goto out;
		}
	}
	while (pos < end) {
		uint32_t field, wt;
		uint64_t sub;
		at = pos;
		if ((rc = frd_field(r, &pos, end, &field, &wt, &sub)))
			goto bad;
		if (wt == 0) {
			uint64_t v;
			if ((rc = frd_varint(r, &pos, end, &v)))
				goto bad;
			continue;
		}
		if (field != 1 || wt != 2) {
			pos = sub;
			continue;
		}
		if ((rc = parse_value(r, pos, sub, rec)))
			goto bad;
		pos = sub;
		if (rec->map) {
			rc = flx_error_set(S->err, -EINVAL, file, rec->tag,
					   "a MapParameter (maptensor) is not "
					   "supported");
			goto out;
		}
		if (open_run && (cur->namelen != rec->taglen ||
				 memcmp(cur->name, rec->tag, rec->taglen))) {
			open_run = false;
			if ((rc = finish_entry(S, file, cur)))
				goto out;
		}
		if (!open_run) {
			size_t n = rec->taglen + 1;

			memcpy(cur->name, rec->tag, n);
			cur->namelen = rec->taglen;
			cur->type[0] = '\0';
			cur->rank = rank;
			cur->file = idx;
			cur->npieces = 0;
			cur->dtype = cur->stored = FLX_DT_INVALID;
			cur->ndim = 0;
			cur->p0 = S->npc;
			open_run = true;
		}
		if (cur->npieces == UINT32_MAX) {
			rc = -E2BIG;
			goto bad;
		}
		/* a tensor saved in several records repeats its dims and
		 * tensor_type in each: one that differs is no part of it */
		if (cur->npieces &&
		    (strcmp(cur->type, rec->type) || cur->ndim != rec->ndim ||
		     memcmp(cur->dims, rec->dims,
			    (size_t)rec->ndim * sizeof(int64_t)))) {
			rc = flx_error_set(
			    S->err, -EINVAL, file, rec->tag,
			    "record %u of the tensor (at byte %llu) differs "
			    "from the one before in tensor_type ('%s', then "
			    "'%s') or dims (%d, then %d of them): not one "
			    "tensor",
			    cur->npieces + 1, (unsigned long long)at, cur->type,
			    rec->type, cur->ndim, rec->ndim);
			goto out;
		}
		if ((rc = push_piece(S, rec->off, rec->len)))
			goto out;
		cur->npieces++;
		/* the run's dtype and dims: its last record's
		 * (docs/formats/mindspore.md#large-tensors) */
		memcpy(cur->dims, rec->dims, sizeof(cur->dims));
		cur->ndim = rec->ndim;
		memcpy(cur->type, rec->type, sizeof(cur->type));
	}
	goto done;
bad:
	if (rc == -EBADMSG || rc == -E2BIG)
		rc = flx_error_set(S->err, -EINVAL, file, NULL,
				   "malformed Checkpoint protobuf record at "
				   "byte %llu",
				   (unsigned long long)at);
	else
		goto io;
	goto out;
io:
	rc = flx_error_set(S->err, rc, file, NULL, "cannot read: %s",
			   strerror(-rc));
	goto out;
done:
	rc = 0;
out:
	if (open_run && rc == 0) {
		open_run = false;
		rc = finish_entry(S, file, cur);
	}
	if (open_run)
		S->npc = cur->p0;
	free(r);
	free(rec);
	free(cur);
	return rc;
}

/* ---- safetensors variant (docs/formats/mindspore.md#safetensors-saves) ----
 */

static flx_dtype st_dtype(const char *s)
{
	for (int i = 1; i < FLX_DT_COUNT; i++) {
		const char *n = flx_dtype_get((flx_dtype)i)->safetensors;
		if (n && strcmp(n, s) == 0)
			return (flx_dtype)i;
	}
	return FLX_DT_INVALID;
}

static int st_entry(scan *S, const char *file, uint32_t rank, uint32_t idx,
		    uint64_t base, uint64_t dlen, const char *k, json_t *v)
{
	json_t *dt = json_object_get(v, "dtype"),
	       *sh = json_object_get(v, "shape"),
	       *of = json_object_get(v, "data_offsets"), *x;
	int64_t dims[FLX_MAX_DIMS];
	flx_dtype dtype;
	int ndim = 0;
	size_t i;

	if (!json_is_string(dt) || !json_is_array(sh) ||
	    json_array_size(sh) > FLX_MAX_DIMS || !json_is_array(of) ||
	    json_array_size(of) != 2 ||
	    !json_is_integer(json_array_get(of, 0)) ||
	    !json_is_integer(json_array_get(of, 1)))
		return flx_error_set(S->err, -EINVAL, file, k,
				     "needs dtype, shape and two data_offsets");
	dtype = st_dtype(json_string_value(dt));
	if (dtype == FLX_DT_INVALID)
		return flx_error_set(S->err, -EINVAL, file, k,
				     "dtype '%s' is not supported",
				     json_string_value(dt));
	json_array_foreach(sh, i, x)
	{
		if (!json_is_integer(x) || json_integer_value(x) < 0)
			return flx_error_set(S->err, -EINVAL, file, k,
					     "shape is not a list of sizes");
		dims[ndim++] = json_integer_value(x);
	}
	int64_t b0 = json_integer_value(json_array_get(of, 0)),
		b1 = json_integer_value(json_array_get(of, 1));
	uint64_t numel = flx_numel(ndim, dims);
	if (b0 < 0 || b1 < b0 || (uint64_t)b1 > dlen ||
	    numel > (UINT64_MAX >> 4) ||
	    (uint64_t)(b1 - b0) != numel * flx_dtype_size(dtype))
		return flx_error_set(S->err, -EINVAL, file, k,
				     "data_offsets [%lld, %lld] do not hold "
				     "the shape's bytes inside the file",
				     (long long)b0, (long long)b1);
	uint64_t p0 = S->npc;

	if (numel && push_piece(S, base + (uint64_t)b0, (uint64_t)(b1 - b0)))
		return -ENOMEM;
	if (push_entry(S, k, strlen(k), rank, idx, dtype, FLX_DT_INVALID, ndim,
		       dims, p0, numel ? 1 : 0)) {
		S->npc = p0;
		return -ENOMEM;
	}
	return 0;
}

static int cmp_str_p(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/*
 * The __metadata__ crc_num of a safetensors file
 * (docs/formats/mindspore.md#safetensors-saves), the decimal string s: the
 * CRC-32 chained over the tensors in sorted name order, of each its UTF-8 name
 * then its bytes (data at base + data_offsets; the entries were checked by
 * st_entry()).  Verified once at mount, as a .ckpt trailer is.  @return 0 or
 * -errno with S->err set.
 */
static int check_st_crc(scan *S, const char *file, uint32_t idx, json_t *root,
			uint64_t base, const char *s)
{
	size_t n = json_object_size(root), nk = 0;
	const char **keys = malloc((n ? n : 1) * sizeof(*keys));
	unsigned char *buf = malloc(WINDOW);
	uint64_t want = 0;
	uint32_t crc = 0;
	const char *k;
	json_t *v;
	int rc = 0;

	if (!keys || !buf) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; s[i]; i++)
		if (s[i] < '0' || s[i] > '9' || i >= 10) {
			rc =
			    flx_error_set(S->err, -EINVAL, file, "crc_num",
					  "__metadata__ crc_num '%.20s' is not "
					  "a decimal CRC-32",
					  s);
			goto out;
		} else {
			want = want * 10 + (uint64_t)(s[i] - '0');
		}
	json_object_foreach(root, k, v)
	{
		if (strcmp(k, "__metadata__") != 0)
			keys[nk++] = k;
	}
	qsort(keys, nk, sizeof(*keys), cmp_str_p);
	for (size_t i = 0; i < nk; i++) {
		json_t *of = json_object_get(json_object_get(root, keys[i]),
					     "data_offsets");
		uint64_t at = base + (uint64_t)json_integer_value(
					 json_array_get(of, 0)),
			 end = base + (uint64_t)json_integer_value(
					  json_array_get(of, 1));

		crc = flx_crc32(crc, keys[i], strlen(keys[i]));
		while (at < end) {
			size_t m =
			    end - at < WINDOW ? (size_t)(end - at) : WINDOW;

			if ((rc = flx_file_pread(S->c, idx, buf, m, at))) {
				rc = flx_error_set(S->err, rc, file, keys[i],
						   "cannot read: %s",
						   strerror(-rc));
				goto out;
			}
			crc = flx_crc32(crc, buf, m);
			at += m;
		}
	}
	if (want != crc)
		rc = flx_error_set(S->err, -EINVAL, file, "crc_num",
				   "CRC-32 of the tensors is %u, __metadata__ "
				   "says %llu",
				   crc, (unsigned long long)want);
out:
	free(keys);
	free(buf);
	return rc;
}

static int load_safetensors(scan *S, uint32_t rank, uint32_t idx,
			    const char *file)
{
	uint64_t size = S->c->files[idx].size, n = 0;
	uint8_t h8[8];
	char *buf = NULL;
	json_t *root = NULL, *v, *meta;
	json_error_t je;
	const char *k;
	int rc = 0;

	if (size < 8 || flx_file_pread(S->c, idx, h8, 8, 0))
		return flx_error_set(S->err, -EINVAL, file, NULL,
				     "too short for a safetensors header");
	for (int i = 7; i >= 0; i--)
		n = n << 8 | h8[i];
	if (n > MAX_ST_HEADER || n > size - 8)
		return flx_error_set(S->err, -EINVAL, file, NULL,
				     "safetensors header length %llu does not "
				     "fit the file",
				     (unsigned long long)n);
	if (!(buf = malloc(n + 1)))
		return -ENOMEM;
	if (flx_file_pread(S->c, idx, buf, n, 8)) {
		rc = flx_error_set(S->err, -EIO, file, NULL, "cannot read");
		goto out;
	}
	flx_json_guard_begin();
	root = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &je);
	if (flx_json_guard_failed()) {
		rc = -ENOMEM;
		goto out;
	}
	if (!json_is_object(root)) {
		rc = flx_error_set(S->err, -EINVAL, file, NULL,
				   "safetensors header is not a JSON object");
		goto out;
	}
	meta = json_object_get(root, "__metadata__");
	json_object_foreach(root, k, v)
	{
		const char *mk;

		if (strcmp(k, "__metadata__") == 0)
			continue;
		/* docs/formats/mindspore.md#safetensors-saves: an int4
		 * parameter is stored packed two per byte and named in the
		 * metadata; its dtype says otherwise
		 * (docs/formats/mindspore.md#tensor-types: refused, as in a
		 * .ckpt) */
		mk = json_string_value(json_object_get(meta, k));
		if (mk && strcmp(mk, "Int4") == 0) {
			rc = flx_error_set(S->err, -EINVAL, file, k,
					   "an Int4 parameter (__metadata__) "
					   "is not supported");
			goto out;
		}
		if ((rc = st_entry(S, file, rank, idx, 8 + n, size - 8 - n, k,
				   v)))
			goto out;
	}
	if (json_is_string(json_object_get(meta, "crc_num")))
		rc = check_st_crc(
		    S, file, idx, root, 8 + n,
		    json_string_value(json_object_get(meta, "crc_num")));
out:
	json_decref(root);
	free(buf);
	return rc;
}

/* ---- the strategy ---- */

static int load_strategy(loader *L, const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	struct stat sb;
	char *buf = NULL;
	int rc = 0;

	if (fd < 0)
		return flx_error_set(L->err, -errno, path, "src_strategy",
				     "cannot open the strategy file");
	if (fstat(fd, &sb) || !S_ISREG(sb.st_mode) ||
	    (uint64_t)sb.st_size > MAX_STRATEGY_BYTES) {
		rc = flx_error_set(L->err, -EINVAL, path, "src_strategy",
				   "not a regular file of at most 256 MiB");
		goto out;
	}
	if (!(buf = malloc((size_t)sb.st_size + 1))) {
		rc = -ENOMEM;
		goto out;
	}
	for (off_t at = 0; at < sb.st_size;) {
		ssize_t k = pread(fd, buf + at, (size_t)(sb.st_size - at), at);
		if (k <= 0) {
			rc = flx_error_set(L->err, k < 0 ? -errno : -EIO, path,
					   "src_strategy", "cannot read");
			goto out;
		}
		at += k;
	}
	rc = flx_ms_strategy_parse(buf, (size_t)sb.st_size,
				   ends_with(path, ".json"), path, &L->st,
				   L->err);
	if (!rc) {
		flx_access a = flx_access_of(&sb);
		flx_access_meet(&L->c->access, &a);
	}
out:
	free(buf);
	close(fd);
	return rc;
}

/* ---- the global index ---- */

/* The entries of one name, by rank (then as stored). */
typedef struct group {
	const entry *e;
	size_t n;
	char *name;
} group;

/* The strategy's layout of g's parameter for e's stage, through a cache
 * of the last stage asked (a group's entries come by rank). */
typedef struct lcache {
	bool valid;
	uint32_t stage;
	const flx_ms_layout *l;
} lcache;

static const flx_ms_layout *layout_of(const loader *L, const group *g,
				      const entry *e, lcache *lc)
{
	uint32_t stage;

	if (!L->st)
		return NULL;
	stage = (uint32_t)(e->rank / L->st->devices);
	if (!lc->valid || lc->stage != stage) {
		lc->l = flx_ms_strategy_find(L->st, g->name, stage);
		lc->stage = stage;
		lc->valid = true;
	}
	return lc->l;
}

/* A kept (rank, box): e's data placed at off in the global tensor. */
typedef struct held {
	const entry *e;
	const int64_t *dims; /* e's */
	int64_t off[FLX_MAX_DIMS];
} held;

/* Whether a and b, which hold one box of one parameter, agree on a
 * sample of their bytes (the first and last up to 64 of their data) into
 * *same.  Data-parallel replicas are bit-identical; slices that only look
 * like replicas (an optimizer shard a protobuf strategy does not record,
 * docs/formats/mindspore.md#optimizer-shard: no global shape tells it) differ,
 * and serving one of them as the whole would be wrong bytes.  @return 0 or
 * -errno. */
static int same_sample(loader *L, const entry *a, const entry *b, bool *same)
{
	unsigned char x[64], y[64];
	const entry *e[2] = {a, b};
	unsigned char *buf[2] = {x, y};
	int rc = 0;

	*same = true;
	if (!a->npieces || !b->npieces)
		return 0; /* zero elements: nothing to differ */
	for (int end = 0; end < 2 && *same && !rc; end++) {
		size_t n = sizeof(x);
		for (int i = 0; i < 2; i++) {
			piece p =
			    piece_of(L, e[i], end ? e[i]->npieces - 1 : 0);
			if (p.len < n)
				n = (size_t)p.len;
		}
		for (int i = 0; i < 2 && !rc; i++) {
			piece p =
			    piece_of(L, e[i], end ? e[i]->npieces - 1 : 0);
			rc = flx_file_pread(L->c, e[i]->file, buf[i], n,
					    end ? p.off + p.len - n : p.off);
		}
		if (!rc)
			*same = memcmp(x, y, n) == 0;
	}
	if (rc)
		flx_error_set(L->err, rc, L->c->files[b->file].relpath,
			      L->names[b->name], "cannot read: %s",
			      strerror(-rc));
	return rc;
}

/* The boxes place() holds, by (offset, dims): an open-addressing table of
 * cap slots (a power of two above twice the group's entries), each 0 or
 * the index + 1 of a held box. */
typedef struct boxset {
	size_t *slot;
	size_t cap;
} boxset;

static size_t box_hash(const int64_t *off, const int64_t *dims, int ndim)
{
	uint64_t x = 1469598103934665603ull; /* FNV-1a over the coordinates */

	for (int d = 0; d < ndim; d++) {
		x = (x ^ (uint64_t)off[d]) * 1099511628211ull;
		x = (x ^ (uint64_t)dims[d]) * 1099511628211ull;
	}
	return (size_t)(x ^ (x >> 29));
}

/* The slot of the box (x.off, x.dims) in bs: the one that holds it, or
 * the empty one it goes to. */
static size_t *box_slot(const boxset *bs, const held *h, const held *x,
			int ndim)
{
	size_t i = box_hash(x->off, x->dims, ndim) & (bs->cap - 1);

	for (;; i = (i + 1) & (bs->cap - 1)) {
		size_t k = bs->slot[i];

		if (!k || (same_dims(h[k - 1].off, x->off, ndim) &&
			   h[k - 1].dims == x->dims))
			return &bs->slot[i];
	}
}

/* The box each entry of g holds, into h (replicas dropped): *nh kept. */
static int place(loader *L, const group *g, flx_tensor *t, held *h, size_t *nh,
		 const boxset *bs, const flx_ms_layout **layout,
		 flx_ms_layout *fold0)
{
	const entry *e0 = &g->e[0];
	uint64_t devices = L->st ? L->st->devices : 0;
	lcache lc = {0};
	char a[160], b[160];

	*nh = 0;
	t->ndim = e0->ndim;
	t->dtype = e0->dtype;
	t->stored = e0->stored;
	/* the global shape: from the first rank with a layout
	 * (docs/formats/mindspore.md#global-shape) */
	const flx_ms_layout *lay0 = NULL;
	flx_ms_layout fold;
	for (size_t i = 0; i < g->n && L->st && !lay0; i++)
		lay0 = layout_of(L, g, &g->e[i], &lc);
	memcpy(t->shape, dims_of(L, e0), sizeof(int64_t) * e0->ndim);
	if (lay0) {
		const entry *ref = NULL;
		for (size_t i = 0; i < g->n && !ref; i++)
			if (layout_of(L, g, &g->e[i], &lc) == lay0)
				ref = &g->e[i];
		if ((int)lay0->ndim > ref->ndim &&
		    flx_ms_layout_fold(lay0, (uint32_t)ref->ndim, fold0) == 0)
			lay0 = fold0;
		if ((int)lay0->ndim != ref->ndim)
			return flx_error_set(
			    L->err, -EINVAL, L->c->files[ref->file].relpath,
			    g->name,
			    "stored with %d dims, its strategy layout has %u",
			    ref->ndim, lay0->ndim);
		if (lay0->has_shape) {
			for (uint32_t i = 0; i < lay0->ndim; i++)
				t->shape[i] = (int64_t)lay0->shape[i];
		} else {
			uint64_t f[FLX_MS_MAX_DIMS];
			flx_ms_factors(lay0, f);
			for (uint32_t i = 0; i < lay0->ndim; i++)
				t->shape[i] =
				    dims_of(L, ref)[i] * (int64_t)f[i];
			if (lay0->nsplit) {
				int64_t m = 0;
				for (uint32_t j = 0; j < lay0->nsplit; j++)
					if (lay0->split_off[j] +
						lay0->split_rows[j] >
					    m)
						m = lay0->split_off[j] +
						    lay0->split_rows[j];
				t->shape[0] = m;
			}
		}
	}
	*layout = lay0;
	for (size_t i = 0; i < g->n; i++) {
		const entry *e = &g->e[i];
		const char *ef = L->c->files[e->file].relpath;
		const flx_ms_layout *lay = layout_of(L, g, e, &lc);
		uint64_t st[FLX_MS_MAX_DIMS], ln[FLX_MS_MAX_DIMS];
		flx_ms_layout opt;
		held *x = &h[*nh]; /* kept when its box is new */

		if (lay && (int)lay->ndim > e->ndim &&
		    flx_ms_layout_fold(lay, (uint32_t)e->ndim, &fold) == 0)
			lay = &fold;

		if (e->dtype != t->dtype || e->stored != t->stored)
			return flx_error_set(L->err, -EINVAL, ef, g->name,
					     "dtype %s differs from rank %u's "
					     "%s",
					     flx_dtype_name(e->dtype), e0->rank,
					     flx_dtype_name(t->dtype));
		if (e->ndim != t->ndim)
			goto shape_mismatch;
		x->e = e;
		x->dims = dims_of(L, e);
		memset(x->off, 0, sizeof(x->off));
		bool whole = same_dims(dims_of(L, e), t->shape, t->ndim);
		if (lay && !whole) {
			uint64_t S[FLX_MS_MAX_DIMS], E[FLX_MS_MAX_DIMS], p = 1;
			for (int d = 0; d < t->ndim; d++) {
				S[d] = (uint64_t)t->shape[d];
				E[d] = (uint64_t)dims_of(L, e)[d];
			}
			/* an optimizer shard the strategy does not record
			 * (docs/formats/mindspore.md#optimizer-shard); only a
			 * JSON shape tells it */
			if (lay->has_shape &&
			    !flx_ms_opt_infer(lay, S, e->rank % devices, E,
					      &p) &&
			    p > 1) {
				flx_ms_layout_opt(lay, p, &opt);
				lay = &opt;
			}
			if (flx_ms_box(lay, S, e->rank % devices, st, ln))
				return flx_error_set(
				    L->err, -EINVAL, ef, g->name,
				    "its strategy layout does not split the "
				    "global shape evenly");
			for (int d = 0; d < t->ndim; d++) {
				if ((uint64_t)dims_of(L, e)[d] != ln[d])
					goto shape_mismatch;
				x->off[d] = (int64_t)st[d];
			}
		} else if (!whole) {
			goto shape_mismatch;
		}
		/* replicas: keep the first (lowest rank) of each box, once
		 * a sample of their bytes agrees */
		size_t *slot = box_slot(bs, h, x, t->ndim);
		if (!*slot) {
			*slot = ++*nh;
			continue;
		}
		size_t k = *slot - 1;
		bool same;
		int rc = same_sample(L, h[k].e, e, &same);
		if (rc)
			return rc;
		if (!same)
			return flx_error_set(
			    L->err, -EINVAL, ef, g->name,
			    "rank %u holds the box of rank %u with other "
			    "bytes: not a replica (an optimizer shard that "
			    "%s does not record? pass the JSON strategy, "
			    "whose tensor_shape tells it)",
			    e->rank, h[k].e->rank,
			    L->st_path ? L->st_path : "the strategy");
		continue;
	shape_mismatch:
		flx_fmt_dims(a, sizeof(a), e->ndim, dims_of(L, e));
		if (lay && e->ndim == t->ndim) {
			int64_t want[FLX_MAX_DIMS];
			for (int d = 0; d < t->ndim; d++)
				want[d] = (int64_t)ln[d];
			flx_fmt_dims(b, sizeof(b), t->ndim, want);
		} else {
			flx_fmt_dims(b, sizeof(b), t->ndim, t->shape);
		}
		return flx_error_set(L->err, -EINVAL, ef, g->name,
				     "rank %u stores dims %s, %s says %s",
				     e->rank, a,
				     lay ? "its strategy layout"
					 : "the first rank holding it (no "
					   "layout: replicated)",
				     b);
	}
	return 0;
}

/* flx_tensor.saved_split: the one tensor-parallel axis of the layout
 * (the optimizer shard is no TP split, so chunks that differ along dim 0
 * too do not hide it); -1 when none splits; 0 (inferred) for several. */
static int split_axis(const flx_ms_layout *l)
{
	int axis = -1;
	uint64_t f[FLX_MS_MAX_DIMS];

	if (!l)
		return -1;
	for (uint32_t i = 0; i < l->ndim; i++) {
		f[i] = 1;
		for (uint32_t j = 0; j < l->nmap[i]; j++)
			f[i] *= l->dev[l->ndev - 1 - l->map[i][j]];
		if (f[i] > 1 && axis >= 0)
			return 0;
		if (f[i] > 1)
			axis = (int)i;
	}
	return axis < 0 ? -1 : axis + 1;
}

/* Chunk at of t (chunks from build_tensor()), its box at a fixed step in
 * box and its strides stride (shared_stride). */
static flx_chunk *new_chunk(flx_tensor *t, int64_t *box, uint32_t at,
			    int64_t *stride)
{
	flx_chunk *ch = &t->chunks[at];

	ch->off = ch->size = t->shape; /* ndim 0: nothing read */
	if (t->ndim) {
		ch->off = box + (size_t)at * 2 * (size_t)t->ndim;
		ch->size = ch->off + t->ndim;
	}
	ch->stride = stride;
	ch->shared_stride = true;
	return ch;
}

static int build_tensor(loader *L, const group *g, flx_tensor *t)
{
	held *h = malloc(g->n * sizeof(*h));
	boxset bs = {.cap = 2};
	const flx_ms_layout *lay = NULL;
	flx_ms_layout fold0;
	size_t nch = 0, per;
	uint32_t at = 0, total = 0;
	int64_t *box, *shared = NULL;
	int rc;

	while (bs.cap < 2 * g->n)
		bs.cap *= 2;
	bs.slot = calloc(bs.cap, sizeof(*bs.slot));
	if (!h || !bs.slot) {
		rc = -ENOMEM;
		goto out;
	}
	if ((rc = place(L, g, t, h, &nch, &bs, &lay, &fold0)))
		goto out;
	t->saved_split = split_axis(lay);
	/* chunks: each piece of a kept entry as the boxes of its elements */
	for (size_t i = 0; i < nch; i++) {
		const entry *e = h[i].e;
		unsigned es = elsize(e);
		int64_t lo[FLX_FLAT_BOXES_MAX][FLX_MAX_DIMS],
		    sz[FLX_FLAT_BOXES_MAX][FLX_MAX_DIMS],
		    first[FLX_FLAT_BOXES_MAX];
		uint64_t el = 0, numel = flx_numel(e->ndim, h[i].dims);
		if (numel == 0)
			total++; /* its empty box, as DCP saves it */
		if (e->npieces == 1 && numel) {
			total++; /* all its elements: its whole box */
			continue;
		}
		for (uint32_t p = 0; p < e->npieces; p++) {
			unsigned nb;
			uint64_t n = piece_of(L, e, p).len / es;
			flx_flat_boxes(e->ndim, h[i].dims, (int64_t)el,
				       (int64_t)(el + n), lo, sz, first, &nb);
			total += nb;
			el += n;
		}
	}
	/* the chunks, then their boxes (offsets, sizes) at a fixed step;
	 * strides shared by the chunks in a row that have the same */
	per = sizeof(flx_chunk) + 2 * (size_t)t->ndim * sizeof(int64_t);
	if (total > (SIZE_MAX - 1) / per ||
	    !(t->chunks = flx_pool_alloc(L->pool, total * per + 1))) {
		rc = -ENOMEM;
		goto out;
	}
	t->nchunks = total;
	t->dims = t->shape;
	box = (int64_t *)(t->chunks + total);
	for (size_t i = 0; i < nch; i++) {
		const entry *e = h[i].e;
		const int64_t *dims = h[i].dims;
		unsigned es = elsize(e);
		int64_t lo[FLX_FLAT_BOXES_MAX][FLX_MAX_DIMS],
		    sz[FLX_FLAT_BOXES_MAX][FLX_MAX_DIMS],
		    first[FLX_FLAT_BOXES_MAX], stride[FLX_MAX_DIMS];
		uint64_t el = 0;
		int64_t s = 1;
		for (int d = e->ndim; d-- > 0;) {
			stride[d] = s;
			s *= dims[d] ? dims[d] : 1;
		}
		if (!e->ndim) {
			shared = t->shape; /* nothing read */
		} else if (!(shared = flx_strides_share(L->pool, e->ndim,
							stride, shared))) {
			rc = -ENOMEM;
			goto out;
		}
		if (flx_numel(e->ndim, dims) == 0) {
			/* a zero-element box (a <= 2.2 record with empty
			 * content, docs/formats/mindspore.md#dims) is one chunk
			 * of no bytes, as DCP stores a zero-element tensor */
			flx_chunk *ch = new_chunk(t, box, at++, shared);
			for (int d = 0; d < e->ndim; d++) {
				ch->off[d] = h[i].off[d];
				ch->size[d] = dims[d];
			}
			ch->file = e->file;
			ch->data_off = ch->item_off =
			    e->npieces ? piece_of(L, e, 0).off : 0;
			ch->item_len = 0;
			ch->contig_from = flx_chunk_contig_from(e->ndim, ch);
		}
		for (uint32_t p = 0; p < e->npieces; p++) {
			unsigned nb = 1;
			piece pc = piece_of(L, e, p);
			uint64_t n = pc.len / es;

			if (e->npieces == 1 && n) {
				/* all its elements: its whole box (as
				 * flx_flat_boxes() gives it) */
				first[0] = 0;
				for (int d = 0; d < e->ndim; d++) {
					lo[0][d] = 0;
					sz[0][d] = dims[d];
				}
			} else {
				flx_flat_boxes(e->ndim, dims, (int64_t)el,
					       (int64_t)(el + n), lo, sz, first,
					       &nb);
			}
			for (unsigned k = 0; k < nb; k++) {
				flx_chunk *ch = new_chunk(t, box, at++, shared);
				for (int d = 0; d < e->ndim; d++) {
					ch->off[d] = h[i].off[d] + lo[k][d];
					ch->size[d] = sz[k][d];
				}
				ch->file = e->file;
				ch->data_off = ch->item_off =
				    pc.off +
				    (uint64_t)(first[k] - (int64_t)el) * es;
				ch->item_len =
				    flx_numel(e->ndim, ch->size) * es;
				ch->contig_from =
				    flx_chunk_contig_from(e->ndim, ch);
			}
			el += n;
		}
	}
	rc = flx_tensor_check_chunks(
	    t, L->st_path ? L->st_path : L->c->files[g->e[0].file].relpath,
	    L->err);
	if (rc == -EINVAL && L->err)
		flx_error_key(L->err, t->fqn);
out:
	free(bs.slot);
	free(h);
	return rc;
}

/* Give back to the system the whole pages of the mapping m before byte
 * upto that *done (a page boundary) does not cover yet.  Their addresses
 * stay m's (build_index() unmaps it whole): unmapped, another thread's
 * mapping could take them, and that unmap would take it away. */
static void release_pages(void *m, size_t *done, size_t upto)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), cut = upto & ~(page - 1);

	if (cut > *done) {
		(void)madvise((char *)m + *done, cut - *done, MADV_DONTNEED);
		*done = cut;
	}
}

/*
 * Building the tensors.  Past ENTRIES_PER_PART entries the groups are
 * built on several threads, each a part over a contiguous run of them
 * (tensors in index order), with its own pool for the chunks (given to
 * the index's) and its own error; each part stops at its first failure,
 * and the one reported is the first in index order, as one thread
 * building them in turn finds it.
 */
#define ENTRIES_PER_PART 65536

typedef struct tpart {
	loader L; /* shallow copy: L.err is &err, L.pool is &pool */
	flx_error err;
	flx_pool pool;
	const group *g;
	entry *s;
	const size_t *at;
	size_t lo, hi, fail;
	int rc;
} tpart;

static void *tpart_run(void *arg)
{
	tpart *P = arg;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	/* its entries' whole pages, given back as it goes */
	size_t done = P->lo ? P->at[P->lo - 1] * sizeof(entry) : 0;

	done = (done + page - 1) & ~(page - 1);
	for (size_t i = P->lo; i < P->hi; i++) {
		int rc = build_tensor(&P->L, &P->g[i], &P->L.c->tensors[i]);

		if (rc) {
			P->rc = rc;
			P->fail = i;
			break;
		}
		if (done < P->at[i] * sizeof(entry))
			release_pages(P->s, &done, P->at[i] * sizeof(entry));
	}
	return NULL;
}

/* Build the ng groups g (entries in s, group k ending at at[k]) into the
 * index's tensors, their fqn set.  @return 0, or the first failure in
 * index order with L->err. */
static int build_tensors(loader *L, const group *g, entry *s, const size_t *at)
{
	size_t ng = L->nnames, ne = ng ? at[ng - 1] : 0;
	unsigned np = parts_for(L, ne, ENTRIES_PER_PART);
	tpart *p;
	int rc = 0;

	if (np > ng)
		np = ng ? (unsigned)ng : 1;
	if (!(p = calloc(np, sizeof(*p))))
		return -ENOMEM;
	/* part k: the groups from the one holding entry ne * k / np */
	for (size_t k = 0, i = 0; k < np; k++) {
		tpart *P = &p[k];

		while (k && i < ng && at[i] <= ne * k / np)
			i++;
		P->L = *L;
		flx_error_init(&P->err);
		P->L.err = &P->err;
		P->L.pool = &P->pool;
		P->g = g;
		P->s = s;
		P->at = at;
		P->lo = i;
		if (k)
			p[k - 1].hi = p[k - 1].fail = i;
	}
	p[np - 1].hi = p[np - 1].fail = ng;
	flx_run_parts(p, sizeof(*p), np, tpart_run);
	L->c->ntensors = ng;
	for (unsigned k = 0; k < np; k++) {
		flx_pool_move(&L->c->pool, &p[k].pool);
		if (rc || !p[k].rc)
			continue;
		rc = p[k].rc;
		L->c->ntensors = p[k].fail + 1;
		if (L->err)
			*L->err = p[k].err;
	}
	free(p);
	return rc;
}

/* The entries grouped by name, by a stable counting sort on entry.name
 * into a mapping of their own (the parts' are freed): a group's entries come as
 * stored, by rank, and the groups (the tensors) in the order their names
 * were first stored.  Each group's pages go back as soon as its tensor is
 * built, so that the entries and the chunks made from them are not all
 * held at once.  A name one rank stores twice is refused: the first such
 * name in byte order, the later of its two entries. */
static int build_index(loader *L)
{
	size_t ng = L->nnames, len = 0;
	entry *s = NULL;
	size_t *at = calloc(ng + 1, sizeof(*at));
	group *g = malloc((ng ? ng : 1) * sizeof(*g));
	const entry *dup = NULL;
	int rc = 0;

	if (!at || !g) {
		rc = -ENOMEM;
		goto out;
	}
	/* the parts' entries, renumbered as merge_scans() says */
	for (unsigned k = 0; k < L->nsc; k++) {
		scan *S = &L->sc[k];

		for (size_t i = 0; i < S->ne; i++) {
			entry *e = &S->e[i];

			e->name = S->name_to[e->name];
			e->dims = S->dims_to[e->dims];
			if (e->npieces != 1)
				e->p0 += S->pc0;
			at[e->name + 1]++;
		}
		len += S->ne * sizeof(entry);
	}
	/* populated at once: the scatter below writes every page of it */
	if (len) {
		s = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		if (s == MAP_FAILED) {
			s = NULL;
			rc = -ENOMEM;
			goto out;
		}
	}
	for (size_t k = 0; k < ng; k++)
		at[k + 1] += at[k];
	/* at[k] ends as the end of group k */
	for (unsigned k = 0; k < L->nsc; k++) {
		scan *S = &L->sc[k];

		for (size_t i = 0; i < S->ne; i++)
			s[at[S->e[i].name]++] = S->e[i];
		free(S->e);
		S->e = NULL;
		S->ne = S->cape = 0;
	}
	for (size_t k = 0; k < ng; k++) {
		size_t i = k ? at[k - 1] : 0;

		g[k] = (group){s + i, at[k] - i, L->names[k]};
		for (size_t j = i + 1; j < at[k]; j++)
			if (s[j].rank == s[j - 1].rank) {
				if (!dup ||
				    strcmp(g[k].name, L->names[dup->name]) < 0)
					dup = &s[j];
				break;
			}
	}
	if (dup) {
		rc = flx_error_set(L->err, -EINVAL,
				   L->c->files[dup->file].relpath,
				   L->names[dup->name],
				   "stored twice (not in consecutive "
				   "records)");
		goto out;
	}
	L->c->tensors = calloc(ng ? ng : 1, sizeof(flx_tensor));
	if (!L->c->tensors) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < ng; i++)
		L->c->tensors[i].fqn = L->names[i];
	rc = build_tensors(L, g, s, at);
out:
	if (s)
		munmap(s, len);
	free(at);
	free(g);
	return rc;
}

/* ---- load ---- */

/*
 * Reading the rank files.  A checkpoint of thousands of ranks has as many
 * files, so past FILES_PER_PART files they are read on several threads,
 * each a part over a contiguous run of them in rank order (the files are
 * opened before, in that order, on this thread: the file table is the
 * builder's).  Each part stops at its first failure; the one reported is
 * the first in rank order, an open's included, as a single thread reading
 * and opening the files in turn finds it.
 */
#define FILES_PER_PART 64

static void *scan_run(void *arg)
{
	scan *S = arg;

	for (size_t i = S->lo; i < S->hi; i++) {
		const rankfile *rf = &S->L->rf[i];
		int rc =
		    ends_with(rf->relpath, ".safetensors")
			? load_safetensors(S, rf->rank, rf->idx, rf->relpath)
			: load_ckpt(S, rf->rank, rf->idx, rf->relpath);

		if (rc) {
			S->rc = rc;
			break;
		}
	}
	return NULL;
}

/* Open the rank files in order up to the first that fails: *nopen are
 * open.  @return 0, or that open's -errno with its error moved from L->err
 * to *open_err (reported once the files before it are read). */
static int open_rankfiles(loader *L, size_t *nopen, flx_error *open_err)
{
	flx_file_ref ref = {.from = "rank directory", .field = "file"};

	for (size_t i = 0; i < L->nrf; i++) {
		int rc = flx_build_data_file(L->b, L->rf[i].relpath, &ref,
					     &L->rf[i].idx);

		if (rc) {
			*nopen = i;
			if (L->err) {
				*open_err = *L->err;
				flx_error_init(L->err);
			}
			return rc;
		}
		if (ends_with(L->rf[i].relpath, ".safetensors"))
			L->safetensors = true;
	}
	*nopen = L->nrf;
	return 0;
}

/* Read rank files [0, n) into the parts L->sc.  @return 0, or the first
 * failure in rank order with L->err. */
static int read_rankfiles(loader *L, size_t n)
{
	unsigned np = parts_for(L, n, FILES_PER_PART);

	if (!(L->sc = calloc(np, sizeof(*L->sc))))
		return -ENOMEM;
	L->nsc = np;
	for (unsigned k = 0; k < np; k++) {
		scan *S = &L->sc[k];

		S->L = L;
		S->c = L->c;
		flx_error_init(&S->own);
		S->err = &S->own;
		S->lo = n * k / np;
		S->hi = n * (k + 1) / np;
		S->last_name = UINT32_MAX;
		S->last_dt = FLX_DT_INVALID;
	}
	flx_run_parts(L->sc, sizeof(*L->sc), np, scan_run);
	for (unsigned k = 0; k < np; k++)
		if (L->sc[k].rc) {
			if (L->err)
				*L->err = L->sc[k].own;
			return L->sc[k].rc;
		}
	return 0;
}

/*
 * Number the parts' names and dims as one reader of every file in order
 * would (in order of first use: part by part, each in its own order),
 * into L->names (copies in the index's pool) and L->dimv (the parts' dims
 * pools, moved to L->dims), and their pieces into L->pc.  The parts'
 * entries keep their numbers until build_index() renumbers them.
 * @return 0 or -ENOMEM.
 */
static int merge_scans(loader *L)
{
	size_t npc = 0;

	for (unsigned k = 0; k < L->nsc; k++)
		npc += L->sc[k].npc;
	if (!(L->pc = malloc((npc ? npc : 1) * sizeof(*L->pc))))
		return -ENOMEM;
	for (unsigned k = 0; k < L->nsc; k++) {
		scan *S = &L->sc[k];
		const void *p;
		uint32_t id;

		S->pc0 = L->npc;
		if (S->npc)
			memcpy(L->pc + L->npc, S->pc, S->npc * sizeof(*S->pc));
		L->npc += S->npc;
		S->name_to =
		    malloc((S->nnames ? S->nnames : 1) * sizeof(*S->name_to));
		S->dims_to =
		    malloc((S->ndimv ? S->ndimv : 1) * sizeof(*S->dims_to));
		if (!S->name_to || !S->dims_to)
			return -ENOMEM;
		for (size_t i = 0; i < S->nnames; i++) {
			if (flx_grow((void **)&L->names, &L->capnames,
				     L->nnames + 1, sizeof(*L->names)) ||
			    intern(&L->nametab, &L->c->pool, S->names[i],
				   (uint32_t)strlen(S->names[i]) + 1, &p, &id))
				return -ENOMEM;
			if (id == L->nnames)
				L->names[L->nnames++] = (char *)p;
			S->name_to[i] = id;
		}
		for (size_t i = 0; i < S->ndimv; i++) {
			if (flx_grow((void **)&L->dimv, &L->capdimv,
				     L->ndimv + 1, sizeof(*L->dimv)) ||
			    intern(&L->dimtab, NULL, S->dimv[i],
				   (uint32_t)(sizeof(int64_t) * S->ndimv_of[i]),
				   &p, &id))
				return -ENOMEM;
			if (id == L->ndimv)
				L->dimv[L->ndimv++] = p;
			S->dims_to[i] = id;
		}
		flx_pool_move(&L->dims, &S->dims);
	}
	return 0;
}

/* Free the parts (their entries too, where build_index() has not). */
static void free_scans(loader *L)
{
	for (unsigned k = 0; L->sc && k < L->nsc; k++) {
		scan *S = &L->sc[k];

		free(S->e);
		free(S->pc);
		free(S->names);
		free(S->name_dims);
		free(S->nametab.slot);
		free(S->dimtab.slot);
		flx_pool_free(&S->npool);
		flx_pool_free(&S->dims);
		free(S->dimv);
		free(S->ndimv_of);
		free(S->name_to);
		free(S->dims_to);
	}
	free(L->sc);
	L->sc = NULL;
	L->nsc = 0;
}

static int load(flx_build *b, const flx_ckpt_opts *o, flx_error *err)
{
	loader L = {.b = b,
		    .c = flx_build_ckpt(b),
		    .err = err,
		    .threads = o->threads,
		    .pool = &flx_build_ckpt(b)->pool};
	const char *strategy = NULL;
	int rc;

	flx_opt_text(o->vals, "src_strategy", &strategy);
	/* the probe's rank files, when it kept them and the files are all
	 * this node's */
	found *f = flx_build_take(b);
	if (f && !flx_build_remote_name(b, 0)) {
		L.rf = f->rf;
		L.nrf = L.caprf = f->nrf;
		L.unified = f->unified;
		f->rf = NULL;
		f->nrf = 0;
		rc = 0;
	} else {
		rc = flx_build_remote_name(b, 0)
			 ? scan_names(&L)
			 : scan_dir(&L, flx_build_dirfd(b));
	}
	found_free(f);
	/* a unified directory's tensors are whole: a layout would slice them
	 * again */
	if (!rc && strategy && L.unified)
		rc =
		    flx_error_set(err, -EINVAL, UNIFIED_MAP, "src_strategy",
				  "a unified_safetensors directory holds whole "
				  "tensors: mount it without a strategy");
	/* without a layout, ranks' equal dims would pass for replicas even
	 * when they are slices: serving one as the whole would be wrong */
	if (!rc && !strategy && L.nrf > 1 && !L.unified)
		rc = flx_error_set(
		    err, -EINVAL, L.rf[1].relpath, "src_strategy",
		    "a checkpoint of %zu ranks needs its strategy "
		    "file: -o src_strategy=FILE",
		    L.nrf);
	if (!rc && strategy) {
		L.st_path = strategy;
		rc = load_strategy(&L, strategy);
	}
	if (!rc && L.st) {
		uint64_t world = (uint64_t)L.st->nstages * L.st->devices;
		for (size_t i = 0; i < L.nrf && !rc; i++)
			if (L.rf[i].rank >= world)
				rc = flx_error_set(
				    err, -EINVAL, L.rf[i].relpath, NULL,
				    "rank %u, but the strategy has %llu ranks "
				    "(%u stages of %llu devices)",
				    L.rf[i].rank, (unsigned long long)world,
				    L.st->nstages,
				    (unsigned long long)L.st->devices);
	}
	if (!rc) {
		flx_error open_err;
		size_t nopen;
		int orc;

		flx_error_init(&open_err);
		orc = open_rankfiles(&L, &nopen, &open_err);
		rc = read_rankfiles(&L, nopen);
		if (!rc && orc) {
			rc = orc;
			if (err)
				*err = open_err;
		}
	}
	if (!rc)
		rc = merge_scans(&L);
	if (!rc)
		rc = build_index(&L);
	if (!rc) {
		L.c->mtime_ns = L.c->files[0].mtime_ns;
		if (asprintf(&L.c->writer, "MindSpore (%s, %zu %s%s)",
			     L.safetensors ? "safetensors" : "ckpt", L.nrf,
			     L.unified ? "unified files" : "ranks",
			     L.st || L.unified ? "" : ", no strategy") < 0) {
			L.c->writer = NULL;
			rc = -ENOMEM;
		}
	}
	free_rankfiles(L.rf, L.nrf);
	free_scans(&L);
	free(L.pc);
	free(L.names);
	free(L.dimv);
	free(L.nametab.slot);
	free(L.dimtab.slot);
	flx_pool_free(&L.dims);
	flx_ms_strategy_free(L.st);
	return rc;
}

/* A path kept absolute: the daemon changes directory after the parse. */
static int check_strategy(const flx_opt *o, const char *value, uint64_t *num,
			  flx_error *err)
{
	(void)num;
	if (!value || !*value)
		return flx_error_set(err, -EINVAL, NULL, o->name,
				     "needs a strategy file's path");
	return 0;
}

static const flx_opt ms_opts[] = {
    {.name = "src_strategy",
     .type = FLX_OPT_PATH,
     .metavar = "FILE",
     .help = "a MindSpore checkpoint's parallel strategy file (protobuf, "
	     "or JSON when named *.json)",
     .check = check_strategy,
     .flags = FLX_OPT_BARE | FLX_OPT_OWN},
};

static const flx_opt_group ms_group = {
    .owner = "mindspore",
    .title = "MindSpore source",
    .opts = ms_opts,
    .nopts = FLX_OPT_COUNT(ms_opts),
};

const flx_source flx_source_mindspore = {
    .name = "mindspore",
    .kind = "MindSpore",
    .marker = "rank_<N>/*.ckpt",
    .probe = probe,
    .probe_open = probe_open,
    .owns = owns,
    .load = load,
    .opts = &ms_group,
};
