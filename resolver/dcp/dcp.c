/* SPDX-License-Identifier: MIT */
/*
 * PyTorch Distributed Checkpoint reader: ".metadata" (a pickle of the
 * Metadata dataclass, decoded by the inert pickle VM and interpreted here by
 * class *name*, so torch 1.13's _shard modules and 2.x's modules both work)
 * and the items of the "__R_N.distcp" files (each a torch.save zip whose
 * data/0 record holds the chunk's raw storage).
 *
 * Everything is validated at open so a mount either fails with one precise
 * line or serves a checkpoint whose every chunk byte lies inside a file that
 * was present and long enough.
 */
#include "ckpt.h"
#include "grow.h"
#include "pickle.h"
#include "reader.h"
#include "torchpkl.h"
#include "zipitem.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define META_NAME	   ".metadata"
#define MAX_METADATA_BYTES (1ull << 30)
#define MAX_DATA_PKL_BYTES (1u << 20)

static int64_t mtime_ns(const struct stat *st)
{
	return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

#define PATH_MEMO 64
#define MAX_PARTS 8 /* threads interpreting the metadata, see part */

/* One storage_data entry: (fqn, chunk offsets or none) -> item location. */
typedef struct sentry {
	const char *fqn;
	int ndim; /* -1: no offset key (BYTE_IO) */
	/* ndim offsets in a part's pool (an index while that array grows):
	 * tens of thousands of entries, so no FLX_MAX_DIMS array each */
	union {
		const int64_t *off;
		size_t offi;
	};
	const char *relpath;
	uint64_t offset;
	uint64_t length;
	const flx_pv *transforms; /* list or NULL */
	uint64_t h;		  /* sentry_hash() */
} sentry;

typedef struct sentry_ref {
	uint32_t idx; /* into loader.se; UINT32_MAX: empty slot */
	uint32_t tag; /* high half of the entry's hash */
} sentry_ref;

typedef struct loader {
	flx_ckpt *c;
	int dirfd;
	char *realdir; /* realpath of the directory, for symlink checks */
	flx_error *err;
	sentry *se;
	size_t nse;
	size_t cap_files;
	int *fmap; /* open-addressing index of files by relpath */
	size_t fmap_cap;
	size_t nitems;		     /* chunks of all tensors */
	int64_t *offpool[MAX_PARTS]; /* storage_data offsets, see sentry */
	sentry_ref *smap;	     /* open-addressing index of se */
	struct path_memo {
		const char *s; /* a relative_path node's string */
		uint32_t idx;  /* its file */
	} paths[PATH_MEMO];
	size_t smap_mask;
} loader;

/* Bytes of n chunks of t and their dims block; never an empty dims block:
 * chunk pointers must be valid even for 0-d tensors, where nothing is read
 * through them. */
static size_t chunks_bytes(const flx_tensor *t, uint32_t n)
{
	size_t ndims = (size_t)n * 3 * (size_t)t->ndim;

	_Static_assert(sizeof(flx_chunk) % sizeof(int64_t) == 0,
		       "dims follow the chunks, aligned");
	return (size_t)n * sizeof(flx_chunk) +
	       (ndims ? ndims : 1) * sizeof(int64_t);
}

/* Lay n chunks out in ch (zeroed, chunks_bytes() long). */
static void place_chunks(flx_tensor *t, uint32_t n, flx_chunk *ch)
{
	size_t per = 3 * (size_t)t->ndim;

	t->chunks = ch;
	t->dims = (int64_t *)(ch + n);
	for (uint32_t i = 0; i < n; i++) {
		int64_t *d = t->dims + i * per;

		ch[i].off = d;
		ch[i].size = d + t->ndim;
		ch[i].stride = d + 2 * t->ndim;
	}
}

int flx_tensor_alloc_chunks(flx_tensor *t, uint32_t n)
{
	flx_chunk *ch = calloc(1, chunks_bytes(t, n));

	if (!ch)
		return -ENOMEM;
	place_chunks(t, n, ch);
	return 0;
}

int flx_chunk_contig_from(int ndim, const flx_chunk *ch)
{
	int64_t expect = 1;
	int k = ndim;

	while (k > 0) {
		int64_t sz = ch->size[k - 1];

		if (sz != 1 && ch->stride[k - 1] != expect)
			break;
		expect *= sz;
		k--;
	}
	return k;
}

/* ---- small interpretation helpers over the pickle tree ---- */

/* Class name check that also insists on a torch.distributed module, so an
 * unrelated class that happens to share a name is not mistaken for DCP's. */
static bool is_dcp_obj(const flx_pv *v, const char *name)
{
	const flx_pv *cls = flx_pv_obj_class(v);

	return cls && strcmp(cls->u.global.name, name) == 0 &&
	       strncmp(cls->u.global.module, "torch.distributed.", 18) == 0;
}

/* The attribute dict of a dataclass-like object (BUILD state).  An object
 * with no BUILD (empty __dict__) has no state: NULL. */
static const flx_pv *obj_state(const flx_pv *v)
{
	if (!v || v->kind != FLX_PV_OBJ)
		return NULL;
	return v->u.obj.state;
}

static const flx_pv *attr(const flx_pv *obj, const char *key)
{
	return flx_pv_dict_get(obj_state(obj), key);
}

/* torch.Size(...) is REDUCE(torch.Size, (tuple_of_ints,)); accept a bare
 * tuple/list of ints as well. */
static int decode_size(loader *L, const flx_pv *v, const char *key,
		       const char *what, int *ndim, int64_t *dims)
{
	const flx_pv *t = v;
	size_t n;

	if (v && v->kind == FLX_PV_OBJ &&
	    flx_pv_is_global(v->u.obj.cls, "torch", "Size"))
		t = flx_pv_item(v->u.obj.args, 0);
	if (!t || (t->kind != FLX_PV_TUPLE && t->kind != FLX_PV_LIST))
		return flx_error_set(L->err, -EINVAL, META_NAME, key,
				     "%s: expected torch.Size, found %s", what,
				     v ? flx_pv_kind_name(v) : "nothing");
	n = flx_pv_len(t);
	if (n > FLX_MAX_DIMS)
		return flx_error_set(L->err, -EINVAL, META_NAME, key,
				     "%s: %zu dimensions (at most %d)", what, n,
				     FLX_MAX_DIMS);
	for (size_t i = 0; i < n; i++) {
		if (!flx_pv_int(flx_pv_item(t, i), &dims[i]) || dims[i] < 0)
			return flx_error_set(L->err, -EINVAL, META_NAME, key,
					     "%s: dimension %zu is not a "
					     "non-negative integer",
					     what, i);
	}
	*ndim = (int)n;
	return 0;
}

static int decode_dtype(loader *L, const flx_pv *props, const char *key,
			flx_dtype *out)
{
	const flx_pv *st = obj_state(props), *dt = NULL;

	if (!flx_pv_is_obj_of(props, "TensorProperties"))
		return flx_error_set(L->err, -EINVAL, META_NAME, key,
				     "properties: expected TensorProperties");
	/* BUILD state is a tuple (dtype, layout, requires_grad,
	 * memory_format, pin_memory[, ...]) in every released version; a
	 * dict state with "dtype" is accepted for forward compatibility. */
	if (st && st->kind == FLX_PV_TUPLE)
		dt = flx_pv_item(st, 0);
	else if (st && st->kind == FLX_PV_DICT)
		dt = flx_pv_dict_get(st, "dtype");
	if (!dt || dt->kind != FLX_PV_GLOBAL ||
	    strcmp(dt->u.global.module, "torch") != 0)
		return flx_error_set(L->err, -EINVAL, META_NAME, key,
				     "properties: dtype is not a torch dtype");
	*out = flx_dtype_from_torch(dt->u.global.name);
	if (*out == FLX_DT_INVALID)
		return flx_error_set(L->err, -EINVAL, META_NAME, key,
				     "unsupported dtype torch.%s",
				     dt->u.global.name);
	return 0;
}

static int get_u64(loader *L, const flx_pv *obj, const char *name,
		   const char *key, uint64_t *out)
{
	int64_t v;

	if (!flx_pv_int(attr(obj, name), &v) || v < 0)
		return flx_error_set(L->err, -EINVAL, META_NAME, key,
				     "%s is missing or not a non-negative "
				     "integer",
				     name);
	*out = (uint64_t)v;
	return 0;
}

/* A string of the metadata, or NULL if v is none or holds a NUL byte (a
 * name or path cut at a NUL would silently mean another one). */
static const char *cstr(const flx_pv *v)
{
	const char *s = flx_pv_str(v);

	return s && strlen(s) == v->u.str.len ? s : NULL;
}

/* ---- storage_data ---- */

static int cmp_offsets(int na, const int64_t *a, int nb, const int64_t *b)
{
	if (na != nb)
		return na < nb ? -1 : 1;
	for (int i = 0; i < na; i++)
		if (a[i] != b[i])
			return a[i] < b[i] ? -1 : 1;
	return 0;
}

/* storage_data is looked up once per chunk, by (fqn, offsets): a hash
 * table, not a sort and binary search, which spent most of its time in
 * strcmp over tens of thousands of long, shared-prefix names. */
static uint64_t name_hash(const char *fqn)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

	for (const unsigned char *p = (const unsigned char *)fqn; *p; p++)
		h = (h ^ *p) * 0x100000001b3ull;
	return h;
}

/* nh: name_hash() of the entry's fqn (one per tensor, not per chunk). */
static uint64_t sentry_hash(uint64_t nh, int ndim, const int64_t *off)
{
	uint64_t h = nh ^ (uint64_t)(ndim + 1) * 0x9e3779b97f4a7c15ull;

	for (int i = 0; i < ndim; i++)
		h = (h ^ (uint64_t)off[i]) * 0xff51afd7ed558ccdull;
	/* murmur3's finaliser: every input bit reaches the low (slot) and
	 * the high (tag) bits */
	h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdull;
	h = (h ^ (h >> 33)) * 0xc4ceb9fe1a85ec53ull;
	return h ^ (h >> 33);
}

/* The slot holding the entry for (fqn, ndim, off), or the empty slot where
 * it would go.  A slot keeps the entry's index and the hash's high half,
 * so probing past other entries costs no visit to L->se. */
static sentry_ref *sentry_slot(const loader *L, uint64_t h, const char *fqn,
			       int ndim, const int64_t *off)
{
	uint32_t tag = (uint32_t)(h >> 32);

	for (size_t i = (size_t)h & L->smap_mask;; i = (i + 1) & L->smap_mask) {
		sentry_ref *r = &L->smap[i];
		const sentry *e;

		if (r->idx == UINT32_MAX)
			return r;
		if (r->tag != tag)
			continue;
		e = &L->se[r->idx];
		if (e->ndim == ndim &&
		    (e->fqn == fqn || strcmp(e->fqn, fqn) == 0) &&
		    cmp_offsets(ndim, e->off, ndim, off) == 0)
			return r;
	}
}

/* fqn: the pickle's string where there is one, so that the entry's name
 * (the same memoized string, as torch writes it) compares by pointer. */
static const sentry *find_sentry(const loader *L, uint64_t nh, const char *fqn,
				 int ndim, const int64_t *off)
{
	const sentry_ref *r =
	    sentry_slot(L, sentry_hash(nh, ndim, off), fqn, ndim, off);

	return r->idx == UINT32_MAX ? NULL : &L->se[r->idx];
}

/* ---- interpretation in parts ----
 *
 * The two big dicts of the metadata, storage_data (one entry per chunk)
 * and state_dict_metadata (one per tensor), are decoded in contiguous
 * ranges of entries on several threads: on a 10,000-tensor checkpoint
 * they were 24 ms of the mount on one CPU while the other idled (the item
 * workers start only after them).  A part touches nothing another part
 * does; what is shared (the storage_data hash table, the file table) is
 * filled afterwards, in entry order, so the error reported is the one a
 * single thread would report.
 */
#define ENTRIES_PER_PART 2048

enum { ENT_TENSOR = 1, ENT_OBJECT = 2 };

typedef struct part {
	loader L; /* shallow copy of the loader: L.err is &err */
	flx_error err;
	const flx_pv *dict;
	size_t lo, hi;	     /* entries [lo, hi) */
	size_t fail;	     /* first failing entry, hi while none */
	uint32_t fail_chunk; /* its chunks before this one need windows */
	int rc;
	int64_t *offs; /* storage_data: this part's chunk offsets */
	size_t noffs, capoffs;
	const unsigned char *kinds; /* state_dict_metadata: ENT_ per entry */
	size_t t0, o0;		    /* its first tensor and object slot */
	flx_pool pool;		    /* names and chunks, for c->pool */
	size_t nitems;
	pthread_t tid;
	bool thread;
} part;

/* FLEXFS_ITEM_THREADS=N forces N parts as it forces N item threads, so
 * the error corpus (a few dozen entries) runs through the parts too. */
static unsigned part_count(size_t n)
{
	const char *force = getenv("FLEXFS_ITEM_THREADS");
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t want = n / ENTRIES_PER_PART;

	if (force && *force >= '1' && *force <= '8' && !force[1])
		want = (size_t)(*force - '0');
	else if (want > (size_t)(cpus < 1 ? 1 : cpus))
		want = (size_t)(cpus < 1 ? 1 : cpus);
	if (want > n)
		want = n;
	if (want > MAX_PARTS)
		want = MAX_PARTS;
	return want ? (unsigned)want : 1;
}

/* np parts over entries [0, n) of dict; NULL when out of memory. */
static part *parts_new(const loader *L, const flx_pv *dict, size_t n,
		       unsigned np)
{
	part *p = calloc(np, sizeof(*p));

	for (unsigned k = 0; p && k < np; k++) {
		p[k].L = *L;
		flx_error_init(&p[k].err);
		p[k].L.err = &p[k].err;
		p[k].dict = dict;
		p[k].lo = n * k / np;
		p[k].hi = p[k].fail = n * (k + 1) / np;
	}
	return p;
}

/* Part 0 here, the others on threads; a part whose thread cannot start
 * runs here as well. */
static void parts_run(part *p, unsigned np, void *(*fn)(void *))
{
	for (unsigned k = 1; k < np; k++)
		p[k].thread = pthread_create(&p[k].tid, NULL, fn, &p[k]) == 0;
	fn(&p[0]);
	for (unsigned k = 1; k < np; k++) {
		if (p[k].thread)
			pthread_join(p[k].tid, NULL);
		else
			fn(&p[k]);
	}
}

/* Parts cover the entries in order: the first part that failed holds
 * the first failing entry. */
static part *parts_failed(part *p, unsigned np)
{
	for (unsigned k = 0; k < np; k++)
		if (p[k].rc)
			return &p[k];
	return NULL;
}

/* Report a part's failure through the loader's error. */
static int part_error(loader *L, const part *f)
{
	if (f->err.code && L->err && !L->err->code)
		*L->err = f->err;
	return f->rc;
}

/* ---- storage_data: decoding ---- */

static int decode_sentry(part *p, size_t i, sentry *e)
{
	loader *L = &p->L;
	const flx_pv *k = p->dict->u.dict.kv[2 * i];
	const flx_pv *v = p->dict->u.dict.kv[2 * i + 1];
	const flx_pv *off;
	int rc;

	if (!is_dcp_obj(k, "MetadataIndex") || !cstr(attr(k, "fqn")))
		return flx_error_set(L->err, -EINVAL, META_NAME, "storage_data",
				     "entry %zu: key is not a MetadataIndex "
				     "with a string fqn free of NUL bytes",
				     i);
	e->fqn = cstr(attr(k, "fqn"));
	/* "offset" is absent (or None) for BYTE_IO entries. */
	off = attr(k, "offset");
	e->ndim = -1;
	if (off && off->kind != FLX_PV_NONE) {
		int64_t o[FLX_MAX_DIMS];

		rc = decode_size(L, off, e->fqn, "MetadataIndex.offset",
				 &e->ndim, o);
		if (rc)
			return rc;
		if (flx_grow((void **)&p->offs, &p->capoffs,
			     p->noffs + (size_t)e->ndim, sizeof(int64_t)))
			return -ENOMEM;
		if (e->ndim)
			memcpy(p->offs + p->noffs, o,
			       sizeof(int64_t) * (size_t)e->ndim);
		e->offi = p->noffs;
		p->noffs += (size_t)e->ndim;
	}
	if (!is_dcp_obj(v, "_StorageInfo"))
		return flx_error_set(L->err, -EINVAL, META_NAME, e->fqn,
				     "storage_data value is not a "
				     "_StorageInfo");
	e->relpath = cstr(attr(v, "relative_path"));
	if (!e->relpath)
		return flx_error_set(L->err, -EINVAL, META_NAME, e->fqn,
				     "relative_path is missing or not a "
				     "string without NUL bytes");
	rc = get_u64(L, v, "offset", e->fqn, &e->offset);
	if (!rc)
		rc = get_u64(L, v, "length", e->fqn, &e->length);
	if (rc)
		return rc;
	e->transforms = attr(v, "transform_descriptors");
	if (e->transforms && e->transforms->kind != FLX_PV_NONE) {
		bool ok = e->transforms->kind == FLX_PV_LIST ||
			  e->transforms->kind == FLX_PV_TUPLE;

		for (size_t j = 0; ok && j < flx_pv_len(e->transforms); j++)
			ok = cstr(flx_pv_item(e->transforms, j)) != NULL;
		if (!ok)
			return flx_error_set(L->err, -EINVAL, META_NAME, e->fqn,
					     "transform_descriptors is not a "
					     "list of strings");
	}
	return 0;
}

static void *sd_part_run(void *arg)
{
	part *p = arg;
	const char *last = NULL;
	uint64_t nh = 0;

	for (size_t i = p->lo; i < p->hi; i++) {
		sentry *e = &p->L.se[i];
		int rc = decode_sentry(p, i, e);

		if (rc) {
			p->rc = rc;
			p->fail = i;
			break;
		}
		/* consecutive entries share the memoized fqn string */
		if (e->fqn != last) {
			last = e->fqn;
			nh = name_hash(last);
		}
		e->h = sentry_hash(nh, e->ndim,
				   e->ndim > 0 ? p->offs + e->offi : NULL);
	}
	return NULL;
}

static int load_storage_data(loader *L, const flx_pv *sd)
{
	size_t n;
	unsigned np;
	part *p, *f;
	int rc = 0;

	if (!sd || sd->kind != FLX_PV_DICT)
		return flx_error_set(L->err, -EINVAL, META_NAME, "storage_data",
				     "missing or not a dict");
	n = sd->u.dict.n;
	if (n > UINT32_MAX / 2)
		return flx_error_set(L->err, -EOVERFLOW, META_NAME,
				     "storage_data", "%zu entries", n);
	L->se = calloc(n ? n : 1, sizeof(sentry));
	if (!L->se)
		return -ENOMEM;
	np = part_count(n);
	if (!(p = parts_new(L, sd, n, np)))
		return -ENOMEM;
	/* room for two dimensions per entry, allocated here: a part's
	 * thread would grow it in 4 KiB pages (see flx_pool) */
	for (unsigned k = 0; k < np && !rc; k++) {
		p[k].capoffs = 2 * (p[k].hi - p[k].lo);
		p[k].offs =
		    malloc((p[k].capoffs ? p[k].capoffs : 1) * sizeof(int64_t));
		if (!p[k].offs)
			rc = -ENOMEM;
	}
	if (rc) {
		for (unsigned k = 0; k < np; k++)
			free(p[k].offs);
		free(p);
		return rc;
	}
	parts_run(p, np, sd_part_run);
	for (unsigned k = 0; k < np; k++) {
		L->offpool[k] = p[k].offs; /* freed with the loader */
		for (size_t i = p[k].lo; i < p[k].fail; i++) {
			sentry *e = &L->se[i];

			e->off = e->ndim > 0 ? p[k].offs + e->offi : NULL;
		}
	}
	f = parts_failed(p, np);
	if (f)
		rc = part_error(L, f);
	free(p);
	if (rc)
		return rc;
	L->nse = n;
	for (L->smap_mask = 15; L->smap_mask < 2 * L->nse;)
		L->smap_mask = 2 * L->smap_mask + 1;
	L->smap = malloc((L->smap_mask + 1) * sizeof(*L->smap));
	if (!L->smap)
		return -ENOMEM;
	memset(L->smap, 0xff, (L->smap_mask + 1) * sizeof(*L->smap));
	for (size_t i = 0; i < L->nse; i++) {
		sentry *e = &L->se[i];
		sentry_ref *r = sentry_slot(L, e->h, e->fqn, e->ndim, e->off);

		if (r->idx != UINT32_MAX)
			return flx_error_set(L->err, -EINVAL, META_NAME, e->fqn,
					     "duplicate storage_data entry "
					     "for one chunk");
		*r = (sentry_ref){(uint32_t)i, (uint32_t)(e->h >> 32)};
	}
	return 0;
}

/* ---- files ---- */

/* relative_path must name a file inside the checkpoint directory: not
 * absolute, no "." or ".." component, no empty component. */
static bool relpath_ok(const char *p)
{
	const char *s = p;

	if (!*p || *p == '/')
		return false;
	while (*s) {
		const char *e = strchr(s, '/');
		size_t n = e ? (size_t)(e - s) : strlen(s);

		if (n == 0 || (n == 1 && s[0] == '.') ||
		    (n == 2 && s[0] == '.' && s[1] == '.'))
			return false;
		s += n;
		if (*s == '/')
			s++;
	}
	return true;
}

/* Open relpath read-only.  Symlinks (in any component) are followed only
 * while the resolved path stays inside the checkpoint directory. */
static int open_inside(loader *L, const char *relpath, int *fd_out)
{
	size_t n = strlen(L->realdir);
	char *abs = NULL, *real;
	int fd;

	if (asprintf(&abs, "%s/%s", L->realdir, relpath) < 0)
		return -ENOMEM;
	real = realpath(abs, NULL);
	free(abs);
	if (!real)
		return -errno;
	if (strncmp(real, L->realdir, n) != 0 ||
	    (real[n] != '/' && !(n == 1 && real[0] == '/'))) {
		free(real);
		return -EXDEV;
	}
	/* real has no symlink left; O_NOFOLLOW keeps it that way */
	fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	free(real);
	if (fd < 0)
		return -errno;
	*fd_out = fd;
	return 0;
}

/* relpath -> index into files, so deduplication stays linear in the
 * number of items (torch 1.13 writes one file per item). */
static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	while (*s)
		h = (h ^ (unsigned char)*s++) * 1099511628211ull;
	return h;
}

static int file_index_lookup(const loader *L, const char *relpath)
{
	if (!L->fmap_cap)
		return -1;
	for (size_t i = hash_str(relpath) & (L->fmap_cap - 1);;
	     i = (i + 1) & (L->fmap_cap - 1)) {
		int v = L->fmap[i];

		if (v < 0)
			return -1;
		if (strcmp(L->c->files[v].relpath, relpath) == 0)
			return v;
	}
}

static int file_index_add(loader *L, int idx)
{
	if (2 * (size_t)(idx + 1) > L->fmap_cap) {
		size_t cap = L->fmap_cap ? 2 * L->fmap_cap : 64;
		int *m = malloc(cap * sizeof(int));

		if (!m)
			return -ENOMEM;
		memset(m, 0xff, cap * sizeof(int));
		free(L->fmap);
		L->fmap = m;
		L->fmap_cap = cap;
		for (int k = 0; k < idx; k++)
			file_index_add(L, k);
	}
	for (size_t i = hash_str(L->c->files[idx].relpath) & (L->fmap_cap - 1);;
	     i = (i + 1) & (L->fmap_cap - 1))
		if (L->fmap[i] < 0) {
			L->fmap[i] = idx;
			return 0;
		}
}

/* Open and record a file of the directory.  key names the tensor or
 * value that needs it (NULL for passthrough extras), for messages. */
static int add_file(loader *L, const char *relpath, bool data, const char *key,
		    uint32_t *idx)
{
	flx_ckpt *c = L->c;
	struct stat st;
	flx_file *f;
	int fd = -1, rc, known = file_index_lookup(L, relpath);

	if (known >= 0) {
		*idx = (uint32_t)known;
		return 0;
	}
	if (data && !relpath_ok(relpath))
		return flx_error_set(L->err, -EINVAL, META_NAME, key,
				     "relative_path '%s' leaves the "
				     "checkpoint directory",
				     relpath);
	if (flx_grow((void **)&c->files, &L->cap_files, c->nfiles + 1,
		     sizeof(flx_file)))
		return -ENOMEM;
	rc = open_inside(L, relpath, &fd);
	if (rc == -EXDEV)
		return flx_error_set(L->err, -EINVAL, relpath, key,
				     "resolves outside the checkpoint "
				     "directory (symlink)");
	if (rc)
		return flx_error_set(L->err, rc, relpath, key,
				     "cannot open: %s", strerror(-rc));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return flx_error_set(L->err, -EINVAL, relpath, key,
				     "not a regular file");
	}
	f = &c->files[c->nfiles];
	memset(f, 0, sizeof(*f));
	f->relpath = strdup(relpath);
	if (!f->relpath) {
		close(fd);
		return -ENOMEM;
	}
	f->fd = fd;
	flx_file_identity(f, &st);
	f->data = data;
	*idx = (uint32_t)c->nfiles++;
	if (file_index_add(L, (int)*idx))
		return -ENOMEM;
	/* No POSIX_FADV_RANDOM: views end up reading every source byte, so
	 * the kernel's readahead is never wasted and keeps cold sequential
	 * reads streaming. */
	return 0;
}

static int item_window(loader *L, const sentry *e, const char *key,
		       uint32_t *file)
{
	const flx_file *f;
	int rc;

	if (e->transforms && flx_pv_len(e->transforms) > 0) {
		const char *t = flx_pv_str(flx_pv_item(e->transforms, 0));

		return flx_error_set(L->err, -ENOTSUP, META_NAME, key,
				     "item transform '%s' is not supported",
				     t ? t : "?");
	}
	{
		/* relative_path strings are memoized in the pickle: one node,
		 * so one pointer, per file for tens of thousands of entries,
		 * and the tree outlives this cache */
		struct path_memo *pm =
		    &L->paths[((uintptr_t)e->relpath >> 4) % PATH_MEMO];

		if (pm->s == e->relpath) {
			*file = pm->idx;
		} else {
			rc = add_file(L, e->relpath, true, key, file);
			if (rc)
				return rc;
			*pm = (struct path_memo){e->relpath, *file};
		}
	}
	f = &L->c->files[*file];
	if (e->offset > f->size || e->length > f->size - e->offset)
		return flx_error_set(L->err, -EINVAL, e->relpath, key,
				     "item [%llu, +%llu) runs past the end "
				     "of the file (%llu bytes)",
				     (unsigned long long)e->offset,
				     (unsigned long long)e->length,
				     (unsigned long long)f->size);
	return 0;
}

/* ---- tensors ---- */

/*
 * What an item worker keeps from one item to the next: a mount reads tens
 * of thousands of items, each a few hundred bytes, and allocating for each
 * (and decoding each data.pkl from scratch) cost more than reading them.
 * memo: data.pkl bytes already parsed, direct-mapped by a hash.  Items of
 * equally shaped chunks carry byte-identical data.pkl records, and equal
 * bytes parse to the equal result, so a hit (same length and bytes) skips
 * the pickle VM and stays exact.  Only successful parses are kept: a bad
 * record is parsed, and reported, every time.
 */
#define PKL_MEMO     64
#define PKL_MEMO_MAX 4096 /* longer data.pkl records are not kept */

typedef struct pkl_memo_ent {
	uint64_t hash;
	size_t len;
	unsigned char *bytes; /* owned copy; NULL: empty slot */
	flx_tensor_pkl tp;
} pkl_memo_ent;

typedef struct item_scratch {
	flx_small_read_cache bc;
	flx_zip *zip;
	unsigned char *buf; /* data.pkl bytes */
	size_t cap;
	pkl_memo_ent memo[PKL_MEMO];
} item_scratch;

/* On failure too, s is left for scratch_release(). */
static int scratch_init(item_scratch *s)
{
	int rc;

	memset(s, 0, sizeof(*s));
	rc = flx_small_read_cache_init(&s->bc);
	s->zip = flx_zip_new();
	return rc ? rc : s->zip ? 0 : -ENOMEM;
}

static void scratch_release(item_scratch *s)
{
	flx_small_read_cache_release(&s->bc);
	flx_zip_close(s->zip);
	free(s->buf);
	for (int i = 0; i < PKL_MEMO; i++)
		free(s->memo[i].bytes);
}

static uint64_t bytes_hash(const unsigned char *p, size_t n)
{
	uint64_t h = 0x9e3779b97f4a7c15ull ^ n, w;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		memcpy(&w, p + i, 8);
		h = (h ^ w) * 0xff51afd7ed558ccdull;
		h ^= h >> 32;
	}
	w = 0;
	memcpy(&w, p + i, n - i);
	/* murmur3's finaliser: the slot (low bits) depends on every byte,
	 * not mostly on the last word */
	h ^= w;
	h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdull;
	h = (h ^ (h >> 33)) * 0xc4ceb9fe1a85ec53ull;
	return h ^ (h >> 33);
}

/* flx_tensor_pkl_parse() of buf[0..n), through the memo. */
static int parse_data_pkl(item_scratch *s, const unsigned char *buf, size_t n,
			  const char *name, flx_tensor_pkl *tp, flx_error *err)
{
	uint64_t h = bytes_hash(buf, n);
	pkl_memo_ent *m = &s->memo[h % PKL_MEMO];
	int rc;

	if (m->bytes && m->hash == h && m->len == n &&
	    memcmp(m->bytes, buf, n) == 0) {
		*tp = m->tp;
		return 0;
	}
	rc = flx_tensor_pkl_parse(buf, n, name, tp, err);
	if (rc || n > PKL_MEMO_MAX)
		return rc;
	if (!m->bytes || m->len < n) {
		unsigned char *b = malloc(n ? n : 1);

		if (!b)
			return 0; /* not kept; the parse stands */
		free(m->bytes);
		m->bytes = b;
	}
	memcpy(m->bytes, buf, n);
	m->len = n;
	m->hash = h;
	m->tp = *tp;
	return 0;
}

/* "<relpath>@<offset>", the item's name in messages, without snprintf's
 * cost (one per item).  relpath is cut to fit. */
static void item_name(char *buf, size_t size, const char *relpath, uint64_t off)
{
	char digits[24];
	size_t n = strlen(relpath), k = sizeof(digits);

	do {
		digits[--k] = (char)('0' + off % 10);
		off /= 10;
	} while (off);
	if (n > size - 2 - (sizeof(digits) - k))
		n = size - 2 - (sizeof(digits) - k);
	memcpy(buf, relpath, n);
	buf[n++] = '@';
	memcpy(buf + n, digits + k, sizeof(digits) - k);
	buf[n + sizeof(digits) - k] = '\0';
}

/* Locate the chunk's storage inside its torch.save item and check it
 * against the metadata.  Reads go through s's cache, bound here to the
 * item's file; errors go to err.  Touches nothing shared but *ch, so items
 * may be loaded on several threads at once (items_begin()). */
static int load_item(const flx_ckpt *c, item_scratch *s, flx_error *err,
		     const flx_tensor *t, flx_chunk *ch)
{
	const flx_file *f = &c->files[ch->file];
	char name[FLX_ERR_FIELD];
	flx_reader r;
	flx_cached_reader cr;
	flx_zip *z = s->zip;
	flx_zip_rec pkl, data, bo;
	flx_tensor_pkl tp;
	int rc;

	item_name(name, sizeof(name), f->relpath, ch->item_off);
	flx_small_read_cache_bind(&s->bc, f->fd, f->size);
	flx_reader_cached(&r, &cr, &s->bc, ch->item_off, ch->item_len);
	rc = flx_zip_parse(z, &r, name, err);
	if (rc) {
		flx_error_key(err, t->fqn);
		return rc;
	}
	if (flx_zip_find(z, "data.pkl", &pkl) || pkl.size > MAX_DATA_PKL_BYTES)
		return flx_error_set(err, -EINVAL, name, t->fqn,
				     "item has no usable data.pkl record");
	if (!flx_zip_find(z, "byteorder", &bo)) {
		char order[8] = {0};

		if (bo.size > 7 ||
		    (rc = flx_read_at(&r, order, bo.size, bo.data_off)) ||
		    strcmp(order, "little") != 0)
			return flx_error_set(err, -ENOTSUP, name, t->fqn,
					     "byteorder record is not "
					     "'little'");
	}
	if (pkl.size > s->cap) {
		unsigned char *b = malloc(pkl.size);

		if (!b)
			return -ENOMEM;
		free(s->buf);
		s->buf = b;
		s->cap = pkl.size;
	}
	rc = flx_read_at(&r, s->buf, pkl.size, pkl.data_off);
	if (rc)
		return flx_error_set(err, rc, name, t->fqn,
				     "cannot read data.pkl");
	rc = parse_data_pkl(s, s->buf, pkl.size, name, &tp, err);
	if (rc) {
		flx_error_key(err, t->fqn);
		return rc;
	}
	if (tp.dtype != t->dtype)
		return flx_error_set(err, -EINVAL, name, t->fqn,
				     "dtype %s in data.pkl disagrees with %s "
				     "in .metadata",
				     flx_dtype_name(tp.dtype),
				     flx_dtype_name(t->dtype));
	if (cmp_offsets(tp.ndim, tp.size, t->ndim, ch->size) != 0) {
		char a[96], b[96];

		flx_fmt_dims(a, sizeof(a), tp.ndim, tp.size);
		flx_fmt_dims(b, sizeof(b), t->ndim, ch->size);
		return flx_error_set(err, -EINVAL, name, t->fqn,
				     "saved tensor shape %s differs from the "
				     "chunk's sizes %s",
				     a, b);
	}
	{
		char rel[80] = "data/";
		size_t k = strlen(tp.key);

		/* tp.key is shorter than its 64 bytes: rel has room */
		memcpy(rel + 5, tp.key, k + 1);
		if (flx_zip_find(z, rel, &data))
			return flx_error_set(err, -EINVAL, name, t->fqn,
					     "item has no %s record", rel);
	}
	if (data.size < tp.storage_bytes)
		return flx_error_set(err, -EINVAL, name, t->fqn,
				     "storage record holds %llu bytes, the "
				     "tensor needs %llu",
				     (unsigned long long)data.size,
				     (unsigned long long)tp.storage_bytes);
	ch->data_off = ch->item_off + data.data_off;
	ch->storage_offset = tp.storage_offset;
	memcpy(ch->stride, tp.stride, sizeof(int64_t) * (size_t)t->ndim);
	ch->contig_from = flx_chunk_contig_from(t->ndim, ch);
	return 0;
}

/*
 * Reading the items.  Every chunk's torch.save item is opened (zip
 * directory, data.pkl) to check it against the metadata and to find its
 * data.  A checkpoint can hold tens of thousands of small items, so they
 * are visited in file order, through a block cache that serves the
 * directory and data.pkl of neighbouring items from one pread, and, past
 * ITEMS_PER_THREAD items, on several threads, each over a contiguous run
 * of that order with its own cache.  Each thread stops at its first
 * failure; the failure reported is the first in file order, as a single
 * thread would find it.
 */
#define ITEMS_PER_THREAD 4096
#define MAX_ITEM_THREADS 8

typedef struct item_job {
	const flx_tensor *t;
	flx_chunk *ch;
} item_job;

typedef struct item_worker {
	const flx_ckpt *c;
	item_job *jobs;
	size_t lo, hi;
	bool thread; /* running on tid, joined by items_end() */
	bool ran;
	pthread_t tid;
	int rc;
	flx_error err;
} item_worker;

/* Items being read, from items_begin() to items_end(). */
struct flx_item_load {
	item_job *jobs;
	unsigned nt;
	item_worker w[MAX_ITEM_THREADS];
};

static int cmp_job(const void *pa, const void *pb)
{
	const flx_chunk *a = ((const item_job *)pa)->ch;
	const flx_chunk *b = ((const item_job *)pb)->ch;

	if (a->file != b->file)
		return a->file < b->file ? -1 : 1;
	return a->item_off < b->item_off ? -1 : a->item_off > b->item_off;
}

/*
 * Fill jobs with every chunk of c in file order: by file, then by offset
 * in the file.  A rank writes its items in state-dict order, so bucketing
 * the chunks by file in tensor order (stable) nearly always leaves each
 * file's run sorted already; a run that is not gets sorted.  A qsort of
 * all 64 k jobs cost 4 ms of a mount.  @return the job count, SIZE_MAX
 * when out of memory.
 */
static size_t order_jobs(const flx_ckpt *c, item_job *jobs)
{
	size_t *at = calloc(c->nfiles + 1, sizeof(*at)), n = 0;

	if (!at)
		return SIZE_MAX;
	for (size_t i = 0; i < c->ntensors; i++)
		for (uint32_t k = 0; k < c->tensors[i].nchunks; k++)
			at[c->tensors[i].chunks[k].file + 1]++;
	for (size_t f = 0; f < c->nfiles; f++)
		at[f + 1] += at[f];
	n = at[c->nfiles];
	for (size_t i = 0; i < c->ntensors; i++)
		for (uint32_t k = 0; k < c->tensors[i].nchunks; k++) {
			flx_chunk *ch = &c->tensors[i].chunks[k];

			jobs[at[ch->file]++] = (item_job){&c->tensors[i], ch};
		}
	/* at[f] is now the end of file f's run */
	for (size_t f = 0, lo = 0; f < c->nfiles; lo = at[f++])
		for (size_t j = lo + 1; j < at[f]; j++)
			if (jobs[j - 1].ch->item_off > jobs[j].ch->item_off) {
				qsort(jobs + lo, at[f] - lo, sizeof(*jobs),
				      cmp_job);
				break;
			}
	free(at);
	return n;
}

static void *item_worker_run(void *arg)
{
	item_worker *w = arg;
	item_scratch *s = malloc(sizeof(*s));

	w->ran = true;
	w->rc = s ? scratch_init(s) : -ENOMEM;
	for (size_t i = w->lo; !w->rc && i < w->hi; i++)
		w->rc =
		    load_item(w->c, s, &w->err, w->jobs[i].t, w->jobs[i].ch);
	if (s) {
		scratch_release(s);
		free(s);
	}
	return NULL;
}

/* FLEXFS_ITEM_THREADS=N forces N threads however few the items (tests
 * run the error corpus that way: the report must not change). */
static unsigned item_threads(size_t n)
{
	const char *force = getenv("FLEXFS_ITEM_THREADS");
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t want = n / ITEMS_PER_THREAD;

	if (force && *force >= '1' && *force <= '8' && !force[1])
		return (unsigned)(*force - '0') < n ? (unsigned)(*force - '0')
						    : 1;

	if (cpus < 1)
		cpus = 1;
	if (want > (size_t)cpus)
		want = (size_t)cpus;
	if (want > MAX_ITEM_THREADS)
		want = MAX_ITEM_THREADS;
	return want ? (unsigned)want : 1;
}

/*
 * Start reading the nitems items of c: workers 1.. on their own threads,
 * worker 0 too unless wait (then it runs here, before returning).  A
 * worker whose thread cannot start runs in items_end().  @return 0 and
 * *out (for items_end()), or -ENOMEM.
 */
static int items_begin(const flx_ckpt *c, size_t nitems, bool wait,
		       struct flx_item_load **out)
{
	struct flx_item_load *ld = calloc(1, sizeof(*ld));
	size_t n = 0;

	if (!ld ||
	    !(ld->jobs = calloc(nitems ? nitems : 1, sizeof(item_job)))) {
		free(ld);
		return -ENOMEM;
	}
	n = order_jobs(c, ld->jobs);
	if (n == SIZE_MAX) {
		free(ld->jobs);
		free(ld);
		return -ENOMEM;
	}
	ld->nt = item_threads(n);
	for (unsigned k = 0; k < ld->nt; k++) {
		item_worker *w = &ld->w[k];

		*w = (item_worker){.c = c,
				   .jobs = ld->jobs,
				   .lo = n * k / ld->nt,
				   .hi = n * (k + 1) / ld->nt};
		flx_error_init(&w->err);
	}
	for (unsigned k = wait; k < ld->nt; k++) {
		if (pthread_create(&ld->w[k].tid, NULL, item_worker_run,
				   &ld->w[k]))
			break;
		ld->w[k].thread = true;
	}
	if (wait)
		item_worker_run(&ld->w[0]);
	*out = ld;
	return 0;
}

/* Wait for (or run) every worker, then free ld.  @return 0, or the first
 * failure in file order with err. */
static int items_end(struct flx_item_load *ld, flx_error *err)
{
	int rc = 0;

	for (unsigned k = 0; k < ld->nt; k++) {
		if (ld->w[k].thread)
			pthread_join(ld->w[k].tid, NULL);
		else if (!ld->w[k].ran)
			item_worker_run(&ld->w[k]);
	}
	for (unsigned k = 0; k < ld->nt && !rc; k++) {
		rc = ld->w[k].rc;
		if (rc && ld->w[k].err.code)
			*err = ld->w[k].err;
	}
	if (rc && !err->code)
		flx_error_set(err, rc, NULL, NULL, "%s", strerror(-rc));
	free(ld->jobs);
	free(ld);
	return rc;
}

static int cmp_chunk_axis0(const void *pa, const void *pb, void *axis)
{
	const flx_chunk *a = *(flx_chunk *const *)pa;
	const flx_chunk *b = *(flx_chunk *const *)pb;
	int d = *(int *)axis;

	return a->off[d] < b->off[d] ? -1 : a->off[d] > b->off[d];
}

static bool chunks_overlap(int ndim, const flx_chunk *a, const flx_chunk *b)
{
	for (int d = 0; d < ndim; d++)
		if (a->off[d] >= b->off[d] + b->size[d] ||
		    b->off[d] >= a->off[d] + a->size[d])
			return false;
	return true;
}

/*
 * Chunks must lie inside the global shape, be pairwise disjoint and cover
 * it.  Disjointness is checked with a sweep along the axis of greatest
 * extent (sorted starts; an active list of chunks that still extend past
 * the sweep position), not a comparison of all pairs; coverage then
 * follows from the volumes adding up.
 */
static int check_coverage(loader *L, flx_tensor *t)
{
	uint64_t total = flx_numel(t->ndim, t->shape), sum = 0;
	flx_chunk **order = NULL, **active = NULL;
	size_t nactive = 0;
	int axis = 0, rc = 0;

	for (uint32_t i = 0; i < t->nchunks; i++) {
		const flx_chunk *ch = &t->chunks[i];
		uint64_t v = 1;
		char o[96];

		for (int d = 0; d < t->ndim; d++) {
			if (ch->off[d] > t->shape[d] ||
			    ch->size[d] > t->shape[d] - ch->off[d]) {
				flx_fmt_dims(o, sizeof(o), t->ndim, ch->off);
				return flx_error_set(L->err, -EINVAL, META_NAME,
						     t->fqn,
						     "chunk at %s lies outside "
						     "the global shape",
						     o);
			}
			v *= (uint64_t)ch->size[d];
		}
		/* Every chunk lies inside, so a surplus can only be overlap;
		 * the sweep below names the chunk. */
		if (__builtin_add_overflow(sum, v, &sum))
			sum = UINT64_MAX;
	}
	if (sum < total)
		return flx_error_set(L->err, -EINVAL, META_NAME, t->fqn,
				     "chunks cover %llu of %llu elements",
				     (unsigned long long)sum,
				     (unsigned long long)total);
	if (t->nchunks < 2)
		return 0;
	for (int d = 1; d < t->ndim; d++)
		if (t->shape[d] > t->shape[axis])
			axis = d;
	order = malloc(t->nchunks * sizeof(*order));
	active = malloc(t->nchunks * sizeof(*active));
	if (!order || !active) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < t->nchunks; i++)
		order[i] = &t->chunks[i];
	if (t->ndim > 0)
		qsort_r(order, t->nchunks, sizeof(*order), cmp_chunk_axis0,
			&axis);
	for (uint32_t i = 0; i < t->nchunks; i++) {
		flx_chunk *ch = order[i];
		size_t keep = 0;

		if (flx_numel(t->ndim, ch->size) == 0)
			continue; /* empty chunks overlap nothing */
		for (size_t j = 0; j < nactive; j++) {
			flx_chunk *a = active[j];

			if (t->ndim == 0 ||
			    a->off[axis] + a->size[axis] > ch->off[axis]) {
				if (chunks_overlap(t->ndim, a, ch)) {
					char o[96];

					flx_fmt_dims(o, sizeof(o), t->ndim,
						     ch->off);
					rc = flx_error_set(
					    L->err, -EINVAL, META_NAME, t->fqn,
					    "chunk at %s overlaps another "
					    "chunk",
					    o);
					goto out;
				}
				active[keep++] = a;
			}
		}
		nactive = keep;
		active[nactive++] = ch;
	}
	if (sum != total)
		rc = flx_error_set(L->err, -EINVAL, META_NAME, t->fqn,
				   "chunks hold %llu elements, the tensor %llu",
				   (unsigned long long)sum,
				   (unsigned long long)total);
out:
	free(order);
	free(active);
	return rc;
}

/*
 * Decode one tensor's metadata and find its chunks' storage_data entries.
 * name: the key's string in the tree (t->fqn is a copy), for
 * find_sentry().  Runs in a part: each chunk's ch->file holds its entry's
 * index into L->se until resolve_windows() replaces it with the file.  On
 * failure *windows is how many chunks were found before it (their windows
 * come first in the error order).
 */
static int decode_tensor(loader *L, flx_pool *pool, flx_tensor *t,
			 const char *name, const flx_pv *tsm, uint32_t *windows)
{
	const flx_pv *chunks = attr(tsm, "chunks");
	uint64_t nh = name_hash(name);
	int rc;

	*windows = 0;
	rc = decode_dtype(L, attr(tsm, "properties"), t->fqn, &t->dtype);
	if (!rc)
		rc = decode_size(L, attr(tsm, "size"), t->fqn, "size", &t->ndim,
				 t->shape);
	if (rc)
		return rc;
	if (flx_shape_bytes(t->ndim, t->shape, flx_dtype_size(t->dtype), NULL,
			    NULL))
		return flx_error_set(L->err, -EOVERFLOW, META_NAME, t->fqn,
				     "tensor size overflows 64 bits");
	if (!chunks || chunks->kind != FLX_PV_LIST)
		return flx_error_set(L->err, -EINVAL, META_NAME, t->fqn,
				     "chunks is missing or not a list");
	if (flx_pv_len(chunks) == 0 || flx_pv_len(chunks) > UINT32_MAX)
		return flx_error_set(L->err, -EINVAL, META_NAME, t->fqn,
				     "tensor has %zu chunks",
				     flx_pv_len(chunks));
	{
		uint32_t n = (uint32_t)flx_pv_len(chunks);
		flx_chunk *mem = flx_pool_alloc(pool, chunks_bytes(t, n));

		if (!mem)
			return -ENOMEM;
		place_chunks(t, n, mem);
		t->nchunks = n;
	}
	for (uint32_t i = 0; i < t->nchunks; i++) {
		const flx_pv *cm = flx_pv_item(chunks, i);
		flx_chunk *ch = &t->chunks[i];
		const sentry *e;
		int64_t at[FLX_MAX_DIMS], sz[FLX_MAX_DIMS];
		int n1, n2;

		*windows = i;
		if (!is_dcp_obj(cm, "ChunkStorageMetadata"))
			return flx_error_set(L->err, -EINVAL, META_NAME, t->fqn,
					     "chunk %u is not a "
					     "ChunkStorageMetadata",
					     i);
		/* decoded aside: the chunk has room for t->ndim only */
		rc = decode_size(L, attr(cm, "offsets"), t->fqn,
				 "chunk offsets", &n1, at);
		if (!rc)
			rc = decode_size(L, attr(cm, "sizes"), t->fqn,
					 "chunk sizes", &n2, sz);
		if (rc)
			return rc;
		if (n1 != t->ndim || n2 != t->ndim)
			return flx_error_set(L->err, -EINVAL, META_NAME, t->fqn,
					     "chunk %u has %d/%d dimensions, "
					     "the tensor %d",
					     i, n1, n2, t->ndim);
		memcpy(ch->off, at, sizeof(int64_t) * (size_t)t->ndim);
		memcpy(ch->size, sz, sizeof(int64_t) * (size_t)t->ndim);
		e = find_sentry(L, nh, name, t->ndim, ch->off);
		if (!e) {
			char o[96];

			flx_fmt_dims(o, sizeof(o), t->ndim, ch->off);
			return flx_error_set(L->err, -EINVAL, META_NAME, t->fqn,
					     "no storage_data entry for the "
					     "chunk at %s",
					     o);
		}
		ch->file = (uint32_t)(e - L->se);
		ch->item_off = e->offset;
		ch->item_len = e->length;
	}
	*windows = t->nchunks;
	/* The items themselves are read later, all together, in file order
	 * (items_begin()). */
	return check_coverage(L, t);
}

/* As decode_tensor(): o->file holds the entry's index for now. */
static int decode_object(loader *L, flx_object *o)
{
	const sentry *e = find_sentry(L, name_hash(o->fqn), o->fqn, -1, NULL);

	if (!e)
		return flx_error_set(L->err, -EINVAL, META_NAME, o->fqn,
				     "no storage_data entry for this bytes "
				     "value");
	o->file = (uint32_t)(e - L->se);
	o->off = e->offset;
	o->len = e->length;
	return 0;
}

static void *sdm_part_run(void *arg)
{
	part *p = arg;
	loader *L = &p->L;
	flx_ckpt *c = L->c;
	size_t ti = p->t0, oi = p->o0;

	for (size_t i = p->lo; i < p->hi; i++) {
		const flx_pv *v = p->dict->u.dict.kv[2 * i + 1];
		const char *fqn = cstr(p->dict->u.dict.kv[2 * i]);
		size_t len = strlen(fqn) + 1;
		char *copy = flx_pool_alloc(&p->pool, len);
		uint32_t windows = 0;
		int rc;

		if (p->kinds[i] == ENT_TENSOR) {
			flx_tensor *t = &c->tensors[ti++];

			t->fqn = copy;
			if (copy)
				memcpy(copy, fqn, len);
			rc = copy ? decode_tensor(L, &p->pool, t, fqn, v,
						  &windows)
				  : -ENOMEM;
			p->nitems += t->nchunks;
		} else {
			flx_object *o = &c->objects[oi++];

			if (copy)
				memcpy(copy, fqn, len);
			o->fqn = copy;
			rc = copy ? decode_object(L, o) : -ENOMEM;
		}
		if (rc) {
			p->rc = rc;
			p->fail = i;
			p->fail_chunk = windows;
			break;
		}
	}
	return NULL;
}

/*
 * After the parts: open each chunk's file and check its item window, in
 * entry order up to the first failing entry f (NULL: all of [0, n)), which
 * gets windows only for the chunks it found before failing.  @return 0,
 * the first window failure, or f's failure.
 */
static int resolve_windows(loader *L, const unsigned char *kinds, size_t n,
			   const part *f)
{
	flx_ckpt *c = L->c;
	size_t ti = 0, oi = 0, last = f ? f->fail : n;
	int rc;

	for (size_t i = 0; i < n && i <= last; i++) {
		if (kinds[i] == ENT_TENSOR) {
			flx_tensor *t = &c->tensors[ti++];
			uint32_t lim = i == last ? f->fail_chunk : t->nchunks;

			for (uint32_t k = 0; k < lim; k++) {
				flx_chunk *ch = &t->chunks[k];

				rc = item_window(L, &L->se[ch->file], t->fqn,
						 &ch->file);
				if (rc)
					return rc;
			}
		} else if (i != last) {
			flx_object *o = &c->objects[oi++];

			rc = item_window(L, &L->se[o->file], o->fqn, &o->file);
			if (rc)
				return rc;
		}
	}
	return f ? part_error(L, f) : 0;
}

static int load_state_dict_metadata(loader *L, const flx_pv *sdm)
{
	flx_ckpt *c = L->c;
	unsigned char *kinds;
	size_t n, ok, nt = 0, no = 0;
	unsigned np;
	part *p;
	int rc;

	if (!sdm || sdm->kind != FLX_PV_DICT)
		return flx_error_set(L->err, -EINVAL, META_NAME,
				     "state_dict_metadata",
				     "missing or not a dict");
	n = sdm->u.dict.n;
	c->tensors = calloc(n ? n : 1, sizeof(flx_tensor));
	c->objects = calloc(n ? n : 1, sizeof(flx_object));
	kinds = malloc(n ? n : 1);
	if (!c->tensors || !c->objects || !kinds) {
		free(kinds);
		return -ENOMEM;
	}
	/* Classify first (cheap), so that every part knows its slots; the
	 * parts run over the entries before the first unclassifiable one. */
	for (ok = 0; ok < n; ok++) {
		const flx_pv *v = sdm->u.dict.kv[2 * ok + 1];

		if (!cstr(sdm->u.dict.kv[2 * ok]))
			break;
		if (is_dcp_obj(v, "TensorStorageMetadata"))
			kinds[ok] = ENT_TENSOR;
		else if (is_dcp_obj(v, "BytesStorageMetadata"))
			kinds[ok] = ENT_OBJECT;
		else
			break;
	}
	np = part_count(ok);
	if (!(p = parts_new(L, sdm, ok, np))) {
		free(kinds);
		return -ENOMEM;
	}
	for (unsigned k = 0; k < np; k++) {
		p[k].kinds = kinds;
		p[k].t0 = nt;
		p[k].o0 = no;
		for (size_t i = p[k].lo; i < p[k].hi; i++)
			if (kinds[i] == ENT_TENSOR)
				nt++;
			else
				no++;
	}
	/* every slot counts from here: flx_ckpt_close() frees what the
	 * parts filled, and NULL in slots they did not reach */
	c->ntensors = nt;
	c->nobjects = no;
	/* big parts start with huge blocks (see flx_pool) */
	for (unsigned k = 0; ok >= ENTRIES_PER_PART && k < np; k++)
		p[k].pool.next = (size_t)2 << 20;
	parts_run(p, np, sdm_part_run);
	for (unsigned k = 0; k < np; k++)
		flx_pool_move(&c->pool, &p[k].pool);
	rc = resolve_windows(L, kinds, ok, parts_failed(p, np));
	for (unsigned k = 0; k < np; k++)
		L->nitems += p[k].nitems;
	free(p);
	free(kinds);
	if (rc || ok == n)
		return rc;
	if (!cstr(sdm->u.dict.kv[2 * ok]))
		return flx_error_set(L->err, -EINVAL, META_NAME,
				     "state_dict_metadata",
				     "key %zu is not a string without NUL "
				     "bytes",
				     ok);
	return flx_error_set(L->err, -EINVAL, META_NAME,
			     cstr(sdm->u.dict.kv[2 * ok]),
			     "value is neither TensorStorageMetadata nor "
			     "BytesStorageMetadata");
}

/* The buffer for .metadata's bytes.  A large one is offered to
 * transparent huge pages: copying 9 MB into fresh 4 KiB pages costs a
 * fault per page, several times the copy itself.  free() releases it. */
static void *meta_alloc(size_t n)
{
	const size_t huge = (size_t)2 << 20;
	void *b = NULL;

	if (n < huge)
		return malloc(n ? n : 1);
	if (posix_memalign(&b, huge, (n + huge - 1) / huge * huge))
		return NULL;
#ifdef MADV_HUGEPAGE
	(void)madvise(b, (n + huge - 1) / huge * huge, MADV_HUGEPAGE);
#endif
	return b;
}

static int read_metadata(loader *L, void **buf_out, size_t *len_out)
{
	struct stat st;
	void *buf;
	int fd = -1, rc = open_inside(L, META_NAME, &fd);

	if (rc == -EXDEV)
		return flx_error_set(L->err, -EINVAL, META_NAME, NULL,
				     "resolves outside the checkpoint "
				     "directory (symlink)");
	if (rc == -ENOENT)
		return flx_error_set(L->err, rc, META_NAME, NULL,
				     "no such file (is this a PyTorch DCP "
				     "checkpoint directory?)");
	if (rc)
		return flx_error_set(L->err, rc, META_NAME, NULL,
				     "cannot open: %s", strerror(-rc));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_size > MAX_METADATA_BYTES) {
		close(fd);
		return flx_error_set(L->err, -EINVAL, META_NAME, NULL,
				     "not a regular file of at most 1 GiB");
	}
	L->c->mtime_ns = mtime_ns(&st);
	buf = meta_alloc((size_t)st.st_size);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	rc = flx_pread_full(fd, buf, (size_t)st.st_size, 0);
	close(fd);
	if (rc) {
		free(buf);
		return flx_error_set(L->err, rc, META_NAME, NULL,
				     "read failed: %s", strerror(-rc));
	}
	*buf_out = buf;
	*len_out = (size_t)st.st_size;
	return 0;
}

/* Regular, non-hidden files other than the checkpoint's own appear
 * unchanged in hf/ (config.json, tokenizer files, ...). */
static bool is_distcp(const char *name)
{
	size_t n = strlen(name);

	return n > 7 && strcmp(name + n - 7, ".distcp") == 0;
}

static bool is_checkpoint_file(const char *name)
{
	size_t n = strlen(name);

	if (name[0] == '.' || is_distcp(name))
		return true;
	if (n > 9 && strncmp(name, "__", 2) == 0 &&
	    strcmp(name + n - 9, ".metadata") == 0)
		return true;
	return false;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int load_extras(loader *L)
{
	int fd = openat(L->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	int rc = 0;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return flx_error_set(L->err, -errno, L->c->dir, NULL,
				     "cannot list the directory");
	}
	while ((de = readdir(d))) {
		struct stat st;

		if (is_checkpoint_file(de->d_name))
			continue;
		if (fstatat(L->dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
		    !S_ISREG(st.st_mode))
			continue;
		if (flx_grow((void **)&names, &cap, n + 1, sizeof(*names))) {
			rc = -ENOMEM;
			goto out;
		}
		if (!(names[n] = strdup(de->d_name))) {
			rc = -ENOMEM;
			goto out;
		}
		n++;
	}
	if (n)
		qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n && !rc; i++) {
		uint32_t idx;
		if (file_index_lookup(L, names[i]) < 0)
			rc = add_file(L, names[i], false, NULL, &idx);
	}
out:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	closedir(d);
	return rc;
}

static int interpret(loader *L, const flx_pv *root)
{
	const flx_pv *cls = flx_pv_obj_class(root);
	int rc;

	if (!is_dcp_obj(root, "Metadata") || !obj_state(root) ||
	    obj_state(root)->kind != FLX_PV_DICT)
		return flx_error_set(L->err, -EINVAL, META_NAME, NULL,
				     "not a DCP Metadata object");
	L->c->writer =
	    strdup(strstr(cls->u.global.module, "._shard.")
		       ? "torch 1.13 (torch.distributed._shard.checkpoint)"
		   : attr(root, "storage_meta")
		       ? "torch >= 2.4 (torch.distributed.checkpoint)"
		       : "torch >= 2.0 (torch.distributed.checkpoint)");
	L->c->format = strdup("torch-dcp");
	if (!L->c->writer || !L->c->format)
		return -ENOMEM;
	rc = load_storage_data(L, attr(root, "storage_data"));
	if (!rc)
		rc = load_state_dict_metadata(
		    L, attr(root, "state_dict_metadata"));
	return rc;
}

static int cmp_tensor_ptr(const void *a, const void *b)
{
	return strcmp((*(flx_tensor *const *)a)->fqn,
		      (*(flx_tensor *const *)b)->fqn);
}

static int build_index(loader *L);

/* Name files by their path, as the user will look them up. */
static void name_by_path(flx_error *err, const char *dir)
{
	if (err && err->file[0] && err->file[0] != '/' &&
	    strcmp(err->file, dir) != 0) {
		char path[2 * FLX_ERR_FIELD + 2];

		snprintf(path, sizeof(path), "%s/%s", dir, err->file);
		flx_error_file_replace(err, path);
	}
}

/*
 * Everything is checked in this order, and the first failure is the one
 * reported: the metadata, the items, then the other files and the names.
 * The items are read last (or, unless wait, left reading) because they
 * take the longest and nothing else needs them; so when the other files
 * or the names fail, the items are still read first, to report what a
 * full check would have found first.
 */
static void loader_release(loader *L)
{
	free(L->se);
	free(L->smap);
	for (unsigned k = 0; k < MAX_PARTS; k++)
		free(L->offpool[k]);
	free(L->fmap);
	free(L->realdir);
	if (L->dirfd >= 0)
		close(L->dirfd);
}

/*
 * Cold mounts: while the metadata is read and decoded (about 50 ms for
 * 10,000 tensors), a thread asks the kernel to start reading the small
 * .distcp files, whose items the workers parse right after; a checkpoint
 * of many small tensors keeps its item headers spread over all of them.
 * 10,000 tensors from 64 ranks (64 files of 1 MB), caches dropped: exec to
 * index.json 92-98 -> 79-84 ms; warm mounts unchanged (docs/performance.md).
 * Large files are left alone: their items are few, and reading them ahead
 * would read the tensors.  Only a hint: every failure is ignored, and
 * nothing but regular files, not through symlinks, is opened.
 */
#define PREFETCH_FILE_MAX  (4u << 20)
#define PREFETCH_TOTAL_MAX (128u << 20)

typedef struct prefetch {
	pthread_t tid;
	int dirfd; /* owned by the thread once it runs */
	bool started;
} prefetch;

/* Entries are read with getdents64() into the stack, not readdir(): no
 * allocation on this thread, so the chaos test's count of the mount
 * path's allocations stays the same from run to run.  The thread is joined
 * before the checkpoint is returned (its few system calls end long before
 * the decode does), so no thread or descriptor of it outlives the open or
 * reaches the daemon's fork. */
static void *prefetch_run(void *arg)
{
	prefetch *pf = arg;
	_Alignas(struct dirent64) char buf[8192];
	uint64_t total = 0;
	ssize_t got;

	while (total < PREFETCH_TOTAL_MAX &&
	       (got = getdents64(pf->dirfd, buf, sizeof(buf))) > 0) {
		for (ssize_t at = 0; at < got;) {
			const struct dirent64 *de =
			    (const struct dirent64 *)(buf + at);
			struct stat st;
			int fd;

			at += de->d_reclen;
			if (!is_distcp(de->d_name) ||
			    fstatat(pf->dirfd, de->d_name, &st,
				    AT_SYMLINK_NOFOLLOW) ||
			    !S_ISREG(st.st_mode) ||
			    st.st_size > PREFETCH_FILE_MAX ||
			    total + (uint64_t)st.st_size > PREFETCH_TOTAL_MAX)
				continue;
			fd = openat(pf->dirfd, de->d_name,
				    O_RDONLY | O_CLOEXEC | O_NOFOLLOW |
					O_NOCTTY | O_NONBLOCK);
			if (fd < 0)
				continue;
			total += (uint64_t)st.st_size;
			(void)posix_fadvise(fd, 0, st.st_size,
					    POSIX_FADV_WILLNEED);
			close(fd);
		}
	}
	close(pf->dirfd);
	return NULL;
}

static void prefetch_start(prefetch *pf, int dirfd)
{
	pf->started = false;
	pf->dirfd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (pf->dirfd < 0)
		return;
	pf->started = pthread_create(&pf->tid, NULL, prefetch_run, pf) == 0;
	if (!pf->started)
		close(pf->dirfd);
}

static void prefetch_end(prefetch *pf)
{
	if (pf->started)
		pthread_join(pf->tid, NULL);
	pf->started = false;
}

static int open_ckpt(const char *dir, bool wait, flx_ckpt **out, flx_error *err)
{
	static const flx_pickle_limits lim = {0};
	loader L = {.err = err, .dirfd = -1};
	struct flx_item_load *ld = NULL;
	flx_pickle *pk = NULL;
	void *meta = NULL;
	size_t meta_len = 0;
	prefetch pf = {0};
	int rc;

	L.c = calloc(1, sizeof(flx_ckpt));
	if (!L.c)
		return flx_error_default(err, -ENOMEM, dir);
	L.c->pooled = true;
	L.c->dir = strdup(dir);
	if (!L.c->dir) {
		rc = -ENOMEM;
		goto fail;
	}
	L.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (L.dirfd < 0) {
		rc = flx_error_set(err, -errno, dir, NULL,
				   "cannot open checkpoint directory: %s",
				   strerror(errno));
		goto fail;
	}
	L.realdir = realpath(dir, NULL);
	if (!L.realdir) {
		rc = -errno;
		goto fail;
	}
	prefetch_start(&pf, L.dirfd);
	rc = read_metadata(&L, &meta, &meta_len);
	if (rc)
		goto fail;
	rc = flx_pickle_load(meta, meta_len, META_NAME, &lim, &pk, err);
	/* The tree holds copies of every string: the raw bytes can go
	 * before the tree is interpreted, and the tree before the items
	 * are read, so no two of them count together in peak memory. */
	free(meta);
	meta = NULL;
	if (rc)
		goto fail;
	rc = interpret(&L, flx_pickle_root(pk));
	flx_pickle_free(pk);
	pk = NULL;
	if (!rc) {
		/* the other files first: adding them moves c->files, which
		 * the item workers read */
		flx_error later;
		int rc2;

		flx_error_init(&later);
		L.err = &later;
		rc2 = load_extras(&L);
		if (!rc2)
			rc2 = build_index(&L);
		L.err = err;
		rc = items_begin(L.c, L.nitems, wait || rc2, &ld);
		if (!rc && (wait || rc2)) {
			rc = items_end(ld, err);
			ld = NULL;
		}
		if (!rc && rc2) {
			*err = later;
			rc = rc2;
		}
	}
	if (rc)
		goto fail;
	L.c->loading = ld;
	prefetch_end(&pf);
	loader_release(&L);
	*out = L.c;
	return 0;
fail:
	prefetch_end(&pf);
	flx_error_default(err, rc, dir);
	name_by_path(err, dir);
	flx_pickle_free(pk);
	free(meta);
	loader_release(&L);
	flx_ckpt_close(L.c);
	return rc;
}

int flx_ckpt_open(const char *dir, flx_ckpt **out, flx_error *err)
{
	return open_ckpt(dir, true, out, err);
}

int flx_ckpt_open_start(const char *dir, flx_ckpt **out, flx_error *err)
{
	return open_ckpt(dir, false, out, err);
}

int flx_ckpt_finish(flx_ckpt *c, flx_error *err)
{
	int rc;

	if (!c->loading)
		return 0;
	rc = items_end(c->loading, err);
	c->loading = NULL;
	if (rc) {
		flx_error_default(err, rc, c->dir);
		name_by_path(err, c->dir);
	}
	return rc;
}

/* Sorted view for flx_ckpt_find(), and the uniqueness of names. */
static int build_index(loader *L)
{
	flx_ckpt *c = L->c;
	const char **obj, *dup = NULL;
	size_t t = 0;

	c->by_name =
	    malloc((c->ntensors ? c->ntensors : 1) * sizeof(*c->by_name));
	obj = malloc((c->nobjects ? c->nobjects : 1) * sizeof(*obj));
	if (!c->by_name || !obj) {
		free(obj);
		return -ENOMEM;
	}
	for (size_t i = 0; i < c->ntensors; i++)
		c->by_name[i] = &c->tensors[i];
	qsort(c->by_name, c->ntensors, sizeof(*c->by_name), cmp_tensor_ptr);
	for (size_t i = 0; i < c->nobjects; i++)
		obj[i] = c->objects[i].fqn;
	qsort(obj, c->nobjects, sizeof(*obj), cmp_str);
	/* A crafted pickle can repeat a dict key: every name, tensor or
	 * bytes value, must be unique or views would be ambiguous.  The two
	 * sorted lists are checked without a third sort; the name reported
	 * is the smallest one listed twice. */
	for (size_t i = 1; i < c->ntensors && !dup; i++)
		if (strcmp(c->by_name[i - 1]->fqn, c->by_name[i]->fqn) == 0)
			dup = c->by_name[i]->fqn;
	for (size_t i = 0; i < c->nobjects; i++) {
		const char *o = obj[i];
		int r = 1;

		if (dup && strcmp(o, dup) >= 0)
			break;
		if (i && strcmp(obj[i - 1], o) == 0) {
			dup = o;
			break;
		}
		while (t < c->ntensors &&
		       (r = strcmp(c->by_name[t]->fqn, o)) < 0)
			t++;
		if (t < c->ntensors && r == 0) {
			dup = o;
			break;
		}
	}
	free(obj);
	if (dup)
		return flx_error_set(L->err, -EINVAL, META_NAME, dup,
				     "listed twice in state_dict_metadata");
	return 0;
}

const flx_tensor *flx_ckpt_find(const flx_ckpt *c, const char *fqn)
{
	size_t lo = 0, hi = c->ntensors;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int r = strcmp(c->by_name[mid]->fqn, fqn);

		if (r == 0)
			return c->by_name[mid];
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void flx_file_identity(flx_file *f, const struct stat *st)
{
	f->size = (uint64_t)st->st_size;
	f->dev = st->st_dev;
	f->ino = st->st_ino;
	f->mtime_ns = mtime_ns(st);
}

int flx_file_verify(const flx_ckpt *c, const flx_file *f, bool by_path)
{
	/* the one mutable field of the index (see ckpt.h) */
	int64_t *checked = (int64_t *)&f->path_checked_ns;
	struct stat st;
	char *path = NULL;
	int64_t now, last;
	int rc;

	if (fstat(f->fd, &st) < 0)
		return -errno;
	if ((uint64_t)st.st_size != f->size || mtime_ns(&st) != f->mtime_ns)
		return -ESTALE;
	if (!by_path)
		return 0;
	now = now_ns();
	last = __atomic_load_n(checked, __ATOMIC_RELAXED);
	if (last && now - last < 1000000000)
		return 0;
	if (asprintf(&path, "%s/%s", c->dir, f->relpath) < 0)
		return -ENOMEM;
	rc = stat(path, &st) < 0 ? -errno : 0;
	free(path);
	if (rc == -ENOENT ||
	    (!rc && (st.st_dev != f->dev || st.st_ino != f->ino)))
		return -ESTALE;
	if (!rc)
		__atomic_store_n(checked, now, __ATOMIC_RELAXED);
	return rc;
}

void flx_ckpt_close(flx_ckpt *c)
{
	if (!c)
		return;
	if (c->loading) {
		flx_error ignored;

		flx_error_init(&ignored);
		(void)items_end(c->loading, &ignored);
	}
	for (size_t i = 0; i < c->nfiles; i++) {
		free(c->files[i].relpath);
		close(c->files[i].fd);
	}
	if (!c->pooled) {
		for (size_t i = 0; i < c->ntensors; i++) {
			free(c->tensors[i].fqn);
			free(c->tensors[i].chunks);
		}
		for (size_t i = 0; i < c->nobjects; i++)
			free(c->objects[i].fqn);
	}
	flx_pool_free(&c->pool);
	free(c->files);
	free(c->tensors);
	free(c->objects);
	free(c->by_name);
	free(c->dir);
	free(c->format);
	free(c->writer);
	free(c);
}
