/* SPDX-License-Identifier: MIT */
/*
 * The PyTorch Distributed Checkpoint source (source.h): ".metadata" (a
 * pickle of the Metadata dataclass, decoded by the inert pickle VM and
 * interpreted here by class *name*, so torch 1.13's _shard modules and
 * 2.x's modules both work) and the items of the "__R_N.distcp" files (each
 * a torch.save zip whose data/0 record holds the chunk's raw storage),
 * read by the builder's item workers.
 */
#include "dcp_internal.h"
#include "grow.h"
#include "pickle.h"
#include "reader.h"
#include "source.h"
#include "torchpkl.h"
#include "zipitem.h"
#include "zstditem.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define META_NAME	   ".metadata"
#define MAX_METADATA_BYTES (1ull << 30)
#define MAX_DATA_PKL_BYTES (1u << 20)
/* A zstd item decompresses to at most its storage and this much zip
 * (data.pkl and the small records); a BYTE_IO value to at most
 * MAX_ZSTD_OBJECT.  Past that it is a decompression bomb. */
#define ZSTD_ZIP_SLACK	(MAX_DATA_PKL_BYTES + (64u << 10))
#define MAX_ZSTD_OBJECT (1ull << 30)

#define PATH_MEMO 64
#define MAX_PARTS FLX_MAX_THREADS /* threads interpreting the metadata */

/* One storage_data entry: (fqn, chunk offsets or none) -> item location.
 * One per chunk, so kept small: its transform_descriptors are looked up
 * again in the tree (sentry_transforms()) and its hash lives in a
 * temporary array while the index is built. */
typedef struct sentry {
	const char *fqn;
	int8_t ndim; /* -1: no offset key (BYTE_IO) */
	/* streamed entries (see sd_sink): transform_descriptors is
	 * ['stream.zstd/1'] (checked), else none */
	bool ztr;
	uint32_t rid; /* placed (see place()): relpath's number */
	/* ndim offsets in a part's pool (an index while that array grows):
	 * tens of thousands of entries, so no FLX_MAX_DIMS array each */
	union {
		const int64_t *off;
		size_t offi;
	};
	const char *relpath;
	uint64_t offset;
	uint64_t length;
} sentry;

typedef struct sentry_ref {
	uint32_t idx; /* into loader.se; UINT32_MAX: empty slot */
	uint32_t tag; /* high half of the entry's hash */
} sentry_ref;

/* Attribute names the sinks look up for every entry or chunk. */
enum akey {
	AK_FQN,
	AK_OFFSET,
	AK_INDEX,
	AK_RELPATH,
	AK_LENGTH,
	AK_TRANSFORMS,
	AK_OFFSETS,
	AK_SIZES,
	AK_N
};

/* Class nodes a sink call has found to be what it checks for: the same
 * node again needs no string compared.  A sink call's nodes all live
 * until it returns, no longer (the batch's memory is reused after it), so
 * each call starts with none. */
struct cls_seen {
	const flx_pv *mi, *si, *csm; /* MetadataIndex, _StorageInfo, Chunk.. */
	const flx_pv *size;	     /* torch.Size */
	/* a key node found to be the string akeys[k] (the pickler memoizes
	 * attribute names: every object's dict names the same nodes) */
	const flx_pv *key[AK_N];
};

typedef struct loader {
	flx_build *b;
	struct cls_seen *seen; /* a sink call's (see above), or NULL */
	const flx_dcp_opts *dopts;
	flx_ckpt *c;
	flx_error *err;
	unsigned threads; /* flx_ckpt_opts.threads */
	sentry *se;
	size_t nse;
	const flx_pv *sd; /* storage_data: se[i] is its entry i */
	uint64_t *sh;	  /* sentry_hash() of se[i], while smap is built */
	int64_t *offpool[MAX_PARTS]; /* storage_data offsets, see sentry */
	sentry_ref *smap;	     /* open-addressing index of se */
	struct path_memo {
		const char *s; /* a relative_path node's string */
		uint32_t idx;  /* its file */
	} paths[PATH_MEMO];
	size_t smap_mask;
	flx_zstd_item zobj; /* decodes zstd objects (resolve_windows()) */
	/* storage_data streamed (sd_sink): se[0..nse) came from the sink,
	 * offsets in offpool[0], names in names */
	bool streamed;
	size_t capse;
	size_t noffs, capoffs;
	flx_pool names; /* interned fqn and relative_path strings */
	struct iname {
		const char *s; /* NULL: empty slot */
		uint32_t id;   /* names[id] */
	} * itab;	       /* open addressing over names, imask + 1 slots */
	size_t imask, in;
	const char **iname; /* the names by number, in[0..in) */
	size_t capiname;
	/* chunks lists streamed (ck_sink): the chunks of all, in order, their
	 * offsets and sizes in ckd, and an open-addressing table of the
	 * lists (clmask + 1 slots, list NULL: empty) */
	struct ck_rec {
		uint32_t dims; /* ckd[dims..): n1 offsets, then n2 sizes */
		int8_t n1, n2;
	} * ck;
	size_t nck, capck;
	/* once the tree is decoded, ckd belongs to the index's pool
	 * (ckd_kept) and the chunks' boxes point into it, not copied */
	int64_t *ckd;
	bool ckd_kept;
	size_t nckd, capckd;
	struct ck_list {
		const flx_pv *list;
		uint32_t first, n; /* its chunks: ck[first, first + n) */
		bool used;	   /* a tensor's chunks (load_streamed()) */
		/* placed: the boxes of chunk i at ckd[dims + 2 * nd * i] */
		int8_t nd;
		uint32_t dims;
		const char *fqn; /* placed: its tensor (interned), or NULL */
	} * cl;
	size_t clmask, ncl;
	const flx_pv *cl_last; /* the list of the latest batch */
	/* Placed (the first attempt, see "storage_data: placed"): the
	 * chunks themselves made as their lists stream, chk[0..nck) in
	 * stream order (ck unused), and each storage_data entry written
	 * into its chunk; own: the tensors' lists by interned fqn, as the
	 * state_dict_metadata pairs were watched (ownmask + 1 slots) */
	bool place;
	bool place_declined;   /* the placing declined: try unplaced */
	bool kept_chunk_entry; /* a chunk's entry went to se (place()) */
	flx_chunk *chk;
	size_t capchk;
	bool chk_kept; /* chk belongs to the index's pool */
	struct owner {
		const char *fqn; /* NULL: empty slot */
		uint32_t first, n, dims;
		uint32_t next; /* the chunk after the last placed */
		int8_t nd;
		int8_t distinct; /* see owned_distinct() */
	} * own;
	size_t ownmask, nown;
	uint32_t *cmap; /* see cmap_build() */
	size_t cmask;
} loader;

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
/* is_dcp_obj() through a sink call's seen class *known (known NULL: none) */
static bool is_dcp_obj_seen(const flx_pv *v, const char *name,
			    const flx_pv **known)
{
	const flx_pv *cls;

	if (!known)
		return is_dcp_obj(v, name);
	cls = flx_pv_obj_class(v);
	if (cls && cls == *known)
		return true;
	if (!is_dcp_obj(v, name))
		return false;
	*known = cls;
	return true;
}

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

/* The names of enum akey, n = strlen(s). */
static const struct {
	const char *s;
	size_t n;
} akeys[AK_N] = {
    [AK_FQN] = {"fqn", 3},
    [AK_OFFSET] = {"offset", 6},
    [AK_INDEX] = {"index", 5},
    [AK_RELPATH] = {"relative_path", 13},
    [AK_LENGTH] = {"length", 6},
    [AK_TRANSFORMS] = {"transform_descriptors", 21},
    [AK_OFFSETS] = {"offsets", 7},
    [AK_SIZES] = {"sizes", 5},
};

/* attr(obj, akeys[k].s) through a sink call's seen key nodes (seen NULL:
 * attr() itself): a key that is the node found before needs no bytes
 * compared.  The same pair as attr(): the last whose key is the string. */
static const flx_pv *attr_k(struct cls_seen *seen, const flx_pv *obj,
			    enum akey k)
{
	const flx_pv *d = obj_state(obj);

	if (!seen)
		return attr(obj, akeys[k].s);
	if (!d || d->kind != FLX_PV_DICT)
		return NULL;
	for (size_t i = d->u.dict.n; i-- > 0;) {
		const flx_pv *key = d->u.dict.kv[2 * i];

		if (key == seen->key[k])
			return d->u.dict.kv[2 * i + 1];
		if (key->kind == FLX_PV_STR && key->u.str.len == akeys[k].n &&
		    key->u.str.s &&
		    memcmp(key->u.str.s, akeys[k].s, akeys[k].n) == 0) {
			seen->key[k] = key;
			return d->u.dict.kv[2 * i + 1];
		}
	}
	return NULL;
}

/* torch.Size(...) is REDUCE(torch.Size, (tuple_of_ints,)); accept a bare
 * tuple/list of ints as well. */
static int decode_size(loader *L, const flx_pv *v, const char *key,
		       const char *what, int *ndim, int64_t *dims)
{
	const flx_pv *t = v;
	size_t n;

	if (v && v->kind == FLX_PV_OBJ &&
	    ((L->seen && v->u.obj.cls && v->u.obj.cls == L->seen->size) ||
	     flx_pv_is_global(v->u.obj.cls, "torch", "Size"))) {
		if (L->seen)
			L->seen->size = v->u.obj.cls;
		t = flx_pv_item(v->u.obj.args, 0);
	}
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

/* val: the value of attribute name (attr_k()), NULL when there is none. */
static int get_u64(loader *L, const flx_pv *val, const char *name,
		   const char *key, uint64_t *out)
{
	int64_t v;

	if (!flx_pv_int(val, &v) || v < 0)
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
 * ranges of entries on several threads, since the item workers start only
 * after them (docs/performance.md).  A part touches nothing another part
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
} part;

/* Parts for n entries (flx_part_count()). */
static unsigned part_count(const loader *L, size_t n)
{
	return flx_part_count(L->threads, n, ENTRIES_PER_PART);
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

/* Entry i (key k, value v) into e, its offsets appended to *offs. */
static int decode_pair(loader *L, const flx_pv *k, const flx_pv *v, size_t i,
		       sentry *e, int64_t **offs, size_t *noffs,
		       size_t *capoffs)
{
	struct cls_seen *sn = L->seen;
	const flx_pv *off, *tr;
	int rc;

	if (!is_dcp_obj_seen(k, "MetadataIndex", sn ? &sn->mi : NULL) ||
	    !(e->fqn = cstr(attr_k(sn, k, AK_FQN))))
		return flx_error_set(L->err, -EINVAL, META_NAME, "storage_data",
				     "entry %zu: key is not a MetadataIndex "
				     "with a string fqn free of NUL bytes",
				     i);
	/* "offset" is absent (or None) for BYTE_IO entries. */
	off = attr_k(sn, k, AK_OFFSET);
	e->ndim = -1;
	if (off && off->kind != FLX_PV_NONE) {
		int64_t o[FLX_MAX_DIMS];
		int nd;

		rc =
		    decode_size(L, off, e->fqn, "MetadataIndex.offset", &nd, o);
		if (rc)
			return rc;
		e->ndim = (int8_t)nd; /* at most FLX_MAX_DIMS */
		if (flx_grow((void **)offs, capoffs, *noffs + (size_t)e->ndim,
			     sizeof(int64_t)))
			return -ENOMEM;
		if (e->ndim)
			memcpy(*offs + *noffs, o,
			       sizeof(int64_t) * (size_t)e->ndim);
		e->offi = *noffs;
		*noffs += (size_t)e->ndim;
	}
	if (!is_dcp_obj_seen(v, "_StorageInfo", sn ? &sn->si : NULL))
		return flx_error_set(L->err, -EINVAL, META_NAME, e->fqn,
				     "storage_data value is not a "
				     "_StorageInfo");
	e->relpath = cstr(attr_k(sn, v, AK_RELPATH));
	if (!e->relpath)
		return flx_error_set(L->err, -EINVAL, META_NAME, e->fqn,
				     "relative_path is missing or not a "
				     "string without NUL bytes");
	rc = get_u64(L, attr_k(sn, v, AK_OFFSET), "offset", e->fqn, &e->offset);
	if (!rc)
		rc = get_u64(L, attr_k(sn, v, AK_LENGTH), "length", e->fqn,
			     &e->length);
	if (rc)
		return rc;
	tr = attr_k(sn, v, AK_TRANSFORMS);
	if (tr && tr->kind != FLX_PV_NONE) {
		bool ok = tr->kind == FLX_PV_LIST || tr->kind == FLX_PV_TUPLE;

		for (size_t j = 0; ok && j < flx_pv_len(tr); j++)
			ok = cstr(flx_pv_item(tr, j)) != NULL;
		if (!ok)
			return flx_error_set(L->err, -EINVAL, META_NAME, e->fqn,
					     "transform_descriptors is not a "
					     "list of strings");
	}
	return 0;
}

static int decode_sentry(part *p, size_t i, sentry *e)
{
	return decode_pair(&p->L, p->dict->u.dict.kv[2 * i],
			   p->dict->u.dict.kv[2 * i + 1], i, e, &p->offs,
			   &p->noffs, &p->capoffs);
}

/* ---- storage_data: streamed ----
 *
 * A million-chunk .metadata is mostly storage_data: two objects and two
 * attribute dicts per chunk.  The pickle VM hands its pairs over as they
 * are decoded (flx_pickle_load_sink()) and reuses their memory, so the
 * tree never holds them.  Only entries that decode_pair() accepts, with
 * no transform or ['stream.zstd/1'], are taken; on anything else the sink
 * declines and the whole .metadata is decoded again as a tree, which
 * reports what the tree path reports.  Names are copied once each
 * (interned): the pairs' strings do not outlive the call.
 */

/* The interned copy of s, numbered (*id: L->iname[*id] is it; id may be
 * NULL), or NULL when out of memory. */
static const char *intern(loader *L, const char *s, uint32_t *id)
{
	size_t n = strlen(s), i;
	uint64_t h = name_hash(s);
	char *c;

	if (2 * (L->in + 1) > L->imask + 1) {
		size_t nmask = L->imask ? 2 * L->imask + 1 : 255;
		struct iname *nt = calloc(nmask + 1, sizeof(*nt));

		if (!nt)
			return NULL;
		for (size_t j = 0; L->itab && j <= L->imask; j++) {
			if (!L->itab[j].s)
				continue;
			for (i = name_hash(L->itab[j].s) & nmask; nt[i].s;
			     i = (i + 1) & nmask)
				;
			nt[i] = L->itab[j];
		}
		free(L->itab);
		L->itab = nt;
		L->imask = nmask;
	}
	for (i = h & L->imask; L->itab[i].s; i = (i + 1) & L->imask)
		if (strcmp(L->itab[i].s, s) == 0)
			goto found;
	if (L->in >= UINT32_MAX ||
	    flx_grow((void **)&L->iname, &L->capiname, L->in + 1,
		     sizeof(*L->iname)) ||
	    !(c = flx_pool_alloc(&L->names, n + 1)))
		return NULL;
	memcpy(c, s, n + 1);
	L->itab[i] = (struct iname){c, (uint32_t)L->in};
	L->iname[L->in++] = c;
found:
	if (id)
		*id = L->itab[i].id;
	return L->itab[i].s;
}

/* The interned copy of s (hash: name_hash(s)), or s when none: entries
 * then find their name by pointer (find_sentry()).  Read only: safe on
 * the parts' threads. */
static const char *interned(const loader *L, const char *s, uint64_t hash)
{
	if (!L->itab)
		return s;
	for (size_t i = hash & L->imask; L->itab[i].s; i = (i + 1) & L->imask)
		if (strcmp(L->itab[i].s, s) == 0)
			return L->itab[i].s;
	return s;
}

/* Whether a decoded entry's transform_descriptors is none or exactly the
 * one item_transform() accepts (*ztr: it is). */
static bool sink_transform(struct cls_seen *seen, const flx_pv *v, bool *ztr)
{
	const flx_pv *tr = attr_k(seen, v, AK_TRANSFORMS);
	size_t n = tr && tr->kind != FLX_PV_NONE ? flx_pv_len(tr) : 0;

	*ztr = n > 0;
	return n == 0 || (n == 1 && flx_zstd_descriptor_ok(
					flx_pv_str(flx_pv_item(tr, 0))));
}

/* Declined by the placing itself: the next attempt decodes unplaced. */
static int place_decline(loader *L)
{
	L->place_declined = true;
	return -EAGAIN;
}

static int place(loader *L, struct cls_seen *seen, const flx_pv *k,
		 const sentry *e);

static int sd_sink(void *ctx, flx_pv *const *kv, size_t npairs)
{
	loader *L = ctx, tmp;
	flx_error scratch;
	struct cls_seen seen = {0};
	const char *lastf = NULL, *lastr = NULL, *inf = NULL, *inr = NULL;
	uint64_t nh = 0;
	uint32_t rid = 0;
	int rc;

	flx_error_init(&scratch);
	/* decode_pair() reads nothing of its loader but err */
	tmp = *L;
	tmp.err = &scratch;
	tmp.seen = &seen;
	if (npairs > UINT32_MAX / 2 - L->nse)
		return -EAGAIN;
	if (flx_grow((void **)&L->se, &L->capse, L->nse + npairs,
		     sizeof(*L->se)))
		return -ENOMEM;
	/* sh grows with se: same capacity */
	{
		uint64_t *nsh = realloc(L->sh, L->capse * sizeof(*L->sh));

		if (!nsh)
			return -ENOMEM;
		L->sh = nsh;
	}
	for (size_t j = 0; j < npairs; j++) {
		sentry *e = &L->se[L->nse];

		memset(e, 0, sizeof(*e));
		rc = decode_pair(&tmp, kv[2 * j], kv[2 * j + 1], L->nse, e,
				 &L->offpool[0], &L->noffs, &L->capoffs);
		if (rc == -ENOMEM)
			return rc;
		if (rc || !sink_transform(&seen, kv[2 * j + 1], &e->ztr))
			return -EAGAIN;
		/* consecutive entries share their strings' nodes */
		if (e->fqn != lastf) {
			lastf = e->fqn;
			if (!(inf = intern(L, lastf, NULL)))
				return -ENOMEM;
			nh = name_hash(inf);
		}
		if (e->relpath != lastr) {
			lastr = e->relpath;
			if (!(inr = intern(L, lastr, &rid)))
				return -ENOMEM;
		}
		e->fqn = inf;
		e->relpath = inr;
		e->rid = rid;
		if (L->place && e->ndim >= 0) {
			rc = place(L, &seen, kv[2 * j], e);
			if (rc < 0)
				return rc;
			if (rc == 0) {
				/* nothing kept: the next entry reuses its
				 * room */
				L->noffs -= (size_t)e->ndim;
				continue;
			}
		}
		L->sh[L->nse] = sentry_hash(
		    nh, e->ndim, e->ndim > 0 ? L->offpool[0] + e->offi : NULL);
		L->nse++;
	}
	return 0;
}

/* ---- state_dict_metadata: chunks lists streamed ----
 *
 * The other per-chunk part of the metadata: each tensor's list of
 * ChunkStorageMetadata objects.  Their offsets and sizes are kept (ck,
 * ckd) and the objects' memory reused, as for storage_data; the list
 * stays in the tree, empty, and decode_tensor() finds its chunks by the
 * list's node.  A list none of the tensors holds (or two) decodes again
 * as a tree (load_streamed()).
 */

static size_t cl_slot(const loader *L, const flx_pv *list)
{
	uint64_t h = (uint64_t)(uintptr_t)list * 0x9e3779b97f4a7c15ull;
	size_t i = (size_t)(h >> 20) & L->clmask;

	while (L->cl[i].list && L->cl[i].list != list)
		i = (i + 1) & L->clmask;
	return i;
}

/* The chunks of a streamed list, or NULL.  Read only: safe on the parts'
 * threads. */
static const struct ck_list *cl_find(const loader *L, const flx_pv *list)
{
	const struct ck_list *e;

	if (!L->cl || !flx_pv_streamed(list))
		return NULL;
	e = &L->cl[cl_slot(L, list)];
	return e->list ? e : NULL;
}

/* Room for one more list in the table: -ENOMEM or 0. */
static int cl_room(loader *L)
{
	struct ck_list *old = L->cl, *nt;
	size_t oldmask = L->clmask, nmask;

	if (L->cl && 2 * (L->ncl + 1) <= L->clmask + 1)
		return 0;
	nmask = L->cl ? 2 * L->clmask + 1 : 255;
	if (!(nt = calloc(nmask + 1, sizeof(*nt))))
		return -ENOMEM;
	L->cl = nt;
	L->clmask = nmask;
	for (size_t j = 0; old && j <= oldmask; j++)
		if (old[j].list)
			L->cl[cl_slot(L, old[j].list)] = old[j];
	free(old);
	return 0;
}

static int ck_sink(void *ctx, const flx_pv *list, flx_pv *const *v, size_t n)
{
	loader *L = ctx, tmp = *L;
	flx_error scratch;
	struct cls_seen seen = {0};
	size_t k;

	flx_error_init(&scratch);
	tmp.err = &scratch;
	tmp.seen = &seen;
	if (cl_room(L))
		return -ENOMEM;
	k = cl_slot(L, list);
	if (!L->cl[k].list) {
		if (L->nck > UINT32_MAX)
			return -EAGAIN;
		L->cl[k] = (struct ck_list){.list = list,
					    .first = (uint32_t)L->nck,
					    .nd = -1,
					    .dims = (uint32_t)L->nckd};
		L->ncl++;
	} else if (list != L->cl_last) {
		return -EAGAIN; /* its chunks would not be contiguous */
	}
	L->cl_last = list;
	if (n > UINT32_MAX - L->nck - 1 || n > UINT32_MAX - L->cl[k].n)
		return -EAGAIN;
	if (L->place && L->cl[k].fqn)
		return place_decline(L); /* items after its tensor's pair */
	if (L->place ? flx_grow((void **)&L->chk, &L->capchk, L->nck + n,
				sizeof(*L->chk))
		     : flx_grow((void **)&L->ck, &L->capck, L->nck + n,
				sizeof(*L->ck)))
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		int64_t at[FLX_MAX_DIMS], sz[FLX_MAX_DIMS];
		int n1, n2;

		if (!is_dcp_obj_seen(v[i], "ChunkStorageMetadata", &seen.csm) ||
		    decode_size(&tmp, attr_k(&seen, v[i], AK_OFFSETS), "", "",
				&n1, at) ||
		    decode_size(&tmp, attr_k(&seen, v[i], AK_SIZES), "", "",
				&n2, sz) ||
		    L->nckd + (size_t)(n1 + n2) > UINT32_MAX)
			return -EAGAIN;
		if (L->place &&
		    (n1 != n2 || (L->cl[k].nd >= 0 && n1 != L->cl[k].nd)))
			return place_decline(L); /* boxes of one step */
		if (flx_grow((void **)&L->ckd, &L->capckd,
			     L->nckd + (size_t)(n1 + n2), sizeof(*L->ckd)))
			return -ENOMEM;
		if (L->place) {
			L->cl[k].nd = (int8_t)n1;
			L->chk[L->nck++] = (flx_chunk){.file = UINT32_MAX};
		} else {
			L->ck[L->nck++] = (struct ck_rec){
			    (uint32_t)L->nckd, (int8_t)n1, (int8_t)n2};
		}
		if (n1)
			memcpy(L->ckd + L->nckd, at, sizeof(*at) * (size_t)n1);
		if (n2)
			memcpy(L->ckd + L->nckd + n1, sz,
			       sizeof(*sz) * (size_t)n2);
		L->nckd += (size_t)(n1 + n2);
	}
	L->cl[k].n += (uint32_t)n;
	return 0;
}

/* Whether every streamed list is the chunks of exactly one tensor, and
 * holds nothing in the tree (what was added to it otherwise); placed, the
 * tensor sdm_watch() saw. */
static bool lists_placed(loader *L, const flx_pv *sdm)
{
	size_t used = 0;

	for (size_t i = 0; sdm && sdm->kind == FLX_PV_DICT && i < sdm->u.dict.n;
	     i++) {
		const flx_pv *v = sdm->u.dict.kv[2 * i + 1], *ch;
		struct ck_list *e;

		if (!is_dcp_obj(v, "TensorStorageMetadata"))
			continue;
		ch = attr(v, "chunks");
		if (!flx_pv_streamed(ch))
			continue;
		e = (struct ck_list *)cl_find(L, ch);
		if (!e || e->used || flx_pv_len(ch))
			return false;
		/* placed: the tensor the watched pairs said */
		if (L->place &&
		    (!cstr(sdm->u.dict.kv[2 * i]) ||
		     e->fqn !=
			 interned(L, cstr(sdm->u.dict.kv[2 * i]),
				  name_hash(cstr(sdm->u.dict.kv[2 * i])))))
			return false;
		e->used = true;
		used++;
	}
	return used == L->ncl;
}

/* ---- storage_data: placed ----
 *
 * torch's planner numbers each storage_data key (MetadataIndex.index)
 * with its chunk's place in the tensor's chunks list
 * (torch/distributed/checkpoint/default_planner.py,
 * create_default_global_save_plan()), and pickles state_dict_metadata
 * before storage_data.  So in the first attempt the chunks are made as
 * their lists stream (ck_sink()), the state_dict_metadata pairs tell
 * which tensor owns which list (sdm_watch()), and each storage_data entry
 * of a chunk is written into the chunk its index names, once its offsets
 * are checked to be that chunk's; an entry without an index (Megatron-
 * Core's planner writes none) or whose index names another chunk is
 * found by its offsets in a table of the chunks (4 to 8 bytes a chunk,
 * while the stream lasts).  No entry is kept.  An entry for no chunk, a
 * second entry for a chunk, two chunks at one place, or the lists or the
 * pairs in another order decline, and the entries are decoded again and
 * looked up by their offsets (the second attempt), which reports what the
 * tree path reports.  Entries of tensors whose chunks list did not stream
 * (one chunk: APPEND, not a batch) and entries without offsets (BYTE_IO)
 * are kept and looked up as there.
 */

static size_t own_slot(const loader *L, const char *fqn)
{
	uint64_t h = (uint64_t)(uintptr_t)fqn * 0x9e3779b97f4a7c15ull;
	size_t i = (size_t)(h >> 20) & L->ownmask;

	while (L->own[i].fqn && L->own[i].fqn != fqn)
		i = (i + 1) & L->ownmask;
	return i;
}

static int sdm_watch(void *ctx, flx_pv *const *kv, size_t npairs)
{
	loader *L = ctx;

	for (size_t j = 0; j < npairs; j++) {
		const char *fqn = cstr(kv[2 * j]), *in;
		const flx_pv *ch = attr(kv[2 * j + 1], "chunks");
		struct ck_list *e;
		size_t k;

		if (!fqn || !is_dcp_obj(kv[2 * j + 1], "TensorStorageMetadata"))
			continue;
		if (!(in = intern(L, fqn, NULL)))
			return -ENOMEM;
		e = (struct ck_list *)cl_find(L, ch);
		if (!e)
			continue;
		/* an entry kept before might be this tensor's; the chunk
		 * table holds the owners so far */
		if (e->fqn || flx_pv_len(ch) || L->kept_chunk_entry || L->cmap)
			return place_decline(L);
		if (!L->own || 2 * (L->nown + 1) > L->ownmask + 1) {
			struct owner *old = L->own;
			size_t oldmask = L->ownmask;

			L->ownmask = old ? 2 * oldmask + 1 : 255;
			if (!(L->own =
				  calloc(L->ownmask + 1, sizeof(*L->own)))) {
				L->own = old;
				L->ownmask = oldmask;
				return -ENOMEM;
			}
			for (size_t i = 0; old && i <= oldmask; i++)
				if (old[i].fqn)
					L->own[own_slot(L, old[i].fqn)] =
					    old[i];
			free(old);
		}
		k = own_slot(L, in);
		if (L->own[k].fqn)
			return place_decline(L); /* a key given twice */
		L->own[k] =
		    (struct owner){in, e->first, e->n, e->dims, 0, e->nd, 0};
		L->nown++;
		e->fqn = in;
	}
	return 0;
}

/* Chunk i of owner o's offsets (o->nd of them; none when 0). */
static const int64_t *owned_box(const loader *L, const struct owner *o,
				size_t i)
{
	return o->nd ? L->ckd + o->dims + i * 2 * (size_t)o->nd : NULL;
}

static uint64_t owned_hash(const struct owner *o, const int64_t *off)
{
	return sentry_hash((uint64_t)(uintptr_t)o->fqn, o->nd, off);
}

/* Whether o's chunks lie in strictly increasing order of their offsets
 * (so no two share them), worked out on the first call: the placing may
 * then take the chunk after the last one placed when its offsets match,
 * with no lookup, as no other chunk of o has those offsets. */
static bool owned_distinct(struct owner *o, const loader *L)
{
	if (!o->distinct) {
		o->distinct = 1;
		for (size_t i = 1; o->nd && i < o->n; i++) {
			const int64_t *a = owned_box(L, o, i - 1);
			const int64_t *b = owned_box(L, o, i);
			int8_t d = 0;

			while (d < o->nd && a[d] == b[d])
				d++;
			if (d == o->nd || a[d] > b[d]) {
				o->distinct = -1;
				break;
			}
		}
		if (!o->nd && o->n > 1)
			o->distinct = -1;
	}
	return o->distinct > 0;
}

/* The number within o's list of its chunk at off, or -1. */
static int64_t cmap_find(const loader *L, const struct owner *o,
			 const int64_t *off)
{
	size_t nb = sizeof(*off) * (size_t)o->nd;

	for (size_t h = (size_t)owned_hash(o, off);; h++) {
		uint32_t c = L->cmap[h & L->cmask];

		if (c == UINT32_MAX)
			return -1;
		if (c >= o->first && c - o->first < o->n &&
		    (!nb ||
		     memcmp(owned_box(L, o, c - o->first), off, nb) == 0))
			return (int64_t)(c - o->first);
	}
}

/* The chunk table of place(): every owned chunk by (owner, offsets),
 * cmask + 1 slots of chunk numbers (UINT32_MAX: empty), built when the
 * first entry without a matching index comes (Megatron-Core writes none)
 * and freed once the stream is done.  Two chunks of a tensor at the same
 * offsets (refused later, as overlapping) decline: each probe passes only
 * other places.  @return 0, -ENOMEM, or -EAGAIN. */
static int cmap_build(loader *L)
{
	size_t n = 0;

	for (size_t j = 0; j <= L->ownmask; j++)
		n += L->own[j].fqn ? L->own[j].n : 0;
	for (L->cmask = 15; L->cmask < 2 * n;)
		L->cmask = 2 * L->cmask + 1;
	if (!(L->cmap = malloc((L->cmask + 1) * sizeof(*L->cmap))))
		return -ENOMEM;
	memset(L->cmap, 0xff, (L->cmask + 1) * sizeof(*L->cmap));
	for (size_t j = 0; j <= L->ownmask; j++) {
		const struct owner *o = &L->own[j];

		for (size_t i = 0; o->fqn && i < o->n; i++) {
			const int64_t *box = owned_box(L, o, i);

			if (cmap_find(L, o, box) >= 0)
				return place_decline(L);
			for (size_t h = (size_t)owned_hash(o, box);; h++)
				if (L->cmap[h & L->cmask] == UINT32_MAX) {
					L->cmap[h & L->cmask] =
					    o->first + (uint32_t)i;
					break;
				}
		}
	}
	return 0;
}

/* Write entry e (key k, offsets at offpool[0] + e->offi) into the chunk it
 * is for, the one its index names or else found by its offsets: 0; 1 when
 * its tensor's chunks did not stream (keep it, as the unplaced path does);
 * or decline. */
static int place(loader *L, struct cls_seen *seen, const flx_pv *k,
		 const sentry *e)
{
	struct owner *o = L->own ? &L->own[own_slot(L, e->fqn)] : NULL;
	const int64_t *off = L->offpool[0] + e->offi;
	size_t nb = sizeof(*off) * (size_t)e->ndim;
	flx_chunk *ch;
	int64_t i;
	int rc;

	if (!o || !o->fqn) {
		L->kept_chunk_entry = true;
		return 1;
	}
	if (e->ndim != o->nd)
		return place_decline(L);
	if (!flx_pv_int(attr_k(seen, k, AK_INDEX), &i) || i < 0 || i >= o->n ||
	    (nb && memcmp(owned_box(L, o, (size_t)i), off, nb))) {
		i = o->next;
		if (i >= o->n ||
		    (nb && memcmp(owned_box(L, o, (size_t)i), off, nb)) ||
		    !owned_distinct(o, L)) {
			if (!L->cmap && (rc = cmap_build(L)))
				return rc;
			if ((i = cmap_find(L, o, off)) < 0)
				return place_decline(L); /* for no chunk */
		}
	}
	o->next = (uint32_t)i + 1;
	ch = &L->chk[o->first + (size_t)i];
	if (ch->file != UINT32_MAX)
		return place_decline(L); /* a second entry */
	ch->file = e->rid;
	ch->item_off = e->offset;
	ch->item_len = e->length;
	ch->zstd = e->ztr;
	return 0;
}

/* Forget what the sink took (before decoding again as a tree). */
static void sink_reset(loader *L)
{
	free(L->se);
	free(L->sh);
	free(L->offpool[0]);
	free(L->itab);
	flx_pool_free(&L->names);
	free(L->ck);
	free(L->ckd);
	free(L->cl);
	free(L->iname);
	free(L->chk);
	free(L->own);
	free(L->cmap);
	L->cmap = NULL;
	L->cmask = 0;
	L->iname = NULL;
	L->capiname = 0;
	L->chk = NULL;
	L->capchk = 0;
	L->own = NULL;
	L->ownmask = L->nown = 0;
	L->place = L->kept_chunk_entry = false;
	L->ck = NULL;
	L->ckd = NULL;
	L->cl = NULL;
	L->nck = L->capck = L->nckd = L->capckd = L->clmask = L->ncl = 0;
	L->cl_last = NULL;
	L->se = NULL;
	L->sh = NULL;
	L->offpool[0] = NULL;
	L->itab = NULL;
	L->nse = L->capse = L->noffs = L->capoffs = L->imask = L->in = 0;
	L->streamed = false;
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
		p->L.sh[i] = sentry_hash(
		    nh, e->ndim, e->ndim > 0 ? p->offs + e->offi : NULL);
	}
	return NULL;
}

/* Decode the n entries of storage_data into L->se, in parts. */
static int decode_storage_data(loader *L, const flx_pv *sd, size_t n)
{
	unsigned np = part_count(L, n);
	part *p = parts_new(L, sd, n, np), *f;
	int rc = 0;

	if (!p)
		return -ENOMEM;
	/* room for two dimensions per entry, allocated here: a part's
	 * thread would grow it in 4 KiB pages (see flx_pool); the loader
	 * owns each block from the start */
	for (unsigned k = 0; k < np && !rc; k++) {
		p[k].capoffs = 2 * (p[k].hi - p[k].lo);
		p[k].offs =
		    malloc((p[k].capoffs ? p[k].capoffs : 1) * sizeof(int64_t));
		L->offpool[k] = p[k].offs;
		if (!p[k].offs)
			rc = -ENOMEM;
	}
	if (rc)
		goto out;
	flx_run_parts(p, sizeof(*p), np, sd_part_run);
	for (unsigned k = 0; k < np; k++) {
		/* a part's thread may have moved its block */
		L->offpool[k] = p[k].offs;
		for (size_t i = p[k].lo; i < p[k].fail; i++) {
			sentry *e = &L->se[i];

			e->off = e->ndim > 0 ? p[k].offs + e->offi : NULL;
		}
	}
	f = parts_failed(p, np);
	if (f)
		rc = part_error(L, f);
out:
	free(p);
	return rc;
}

static int load_storage_data(loader *L, const flx_pv *sd)
{
	size_t n;
	int rc;

	if (!sd || sd->kind != FLX_PV_DICT)
		return flx_error_set(L->err, -EINVAL, META_NAME, "storage_data",
				     "missing or not a dict");
	if (L->streamed) {
		/* the offsets' block has stopped moving */
		for (size_t i = 0; i < L->nse; i++) {
			sentry *e = &L->se[i];

			e->off = e->ndim > 0 ? L->offpool[0] + e->offi : NULL;
		}
		goto index;
	}
	n = sd->u.dict.n;
	if (n > UINT32_MAX / 2)
		return flx_error_set(L->err, -EOVERFLOW, META_NAME,
				     "storage_data", "%zu entries", n);
	L->se = calloc(n ? n : 1, sizeof(sentry));
	L->sh = malloc((n ? n : 1) * sizeof(*L->sh));
	if (!L->se || !L->sh)
		return -ENOMEM;
	L->sd = sd;
	rc = decode_storage_data(L, sd, n);
	if (rc)
		return rc;
	L->nse = n;
index:
	for (L->smap_mask = 15; L->smap_mask < 2 * L->nse;)
		L->smap_mask = 2 * L->smap_mask + 1;
	L->smap = malloc((L->smap_mask + 1) * sizeof(*L->smap));
	if (!L->smap)
		return -ENOMEM;
	memset(L->smap, 0xff, (L->smap_mask + 1) * sizeof(*L->smap));
	for (size_t i = 0; i < L->nse; i++) {
		sentry *e = &L->se[i];
		uint64_t h = L->sh[i];
		sentry_ref *r = sentry_slot(L, h, e->fqn, e->ndim, e->off);

		if (r->idx != UINT32_MAX)
			return flx_error_set(L->err, -EINVAL, META_NAME, e->fqn,
					     "duplicate storage_data entry "
					     "for one chunk");
		*r = (sentry_ref){(uint32_t)i, (uint32_t)(h >> 32)};
	}
	free(L->sh);
	L->sh = NULL;
	return 0;
}

/* Entry e's transform_descriptors (checked by decode_sentry()), or NULL. */
static const flx_pv *sentry_transforms(const loader *L, const sentry *e)
{
	size_t i = (size_t)(e - L->se);

	return attr(L->sd->u.dict.kv[2 * i + 1], "transform_descriptors");
}

/* A streamed entry's transform (sd_sink() took only accepted ones). */
static int item_transform(loader *L, const sentry *e, const char *key,
			  bool *zstd);

/* Whether entry e's item is zstd-transformed (docs/formats/dcp.md#zstd-items):
 * one descriptor, "stream.zstd" of major version 1; any other list is refused.
 * @return 0 and *zstd, or -ENOTSUP with L->err. */
static int item_transform(loader *L, const sentry *e, const char *key,
			  bool *zstd)
{
	const flx_pv *tr;
	size_t n;
	const char *t;

	if (L->streamed) {
		*zstd = e->ztr;
		return 0;
	}
	tr = sentry_transforms(L, e);
	n = tr ? flx_pv_len(tr) : 0;
	t = n ? flx_pv_str(flx_pv_item(tr, 0)) : NULL;

	*zstd = n > 0;
	if (n == 0 || (n == 1 && flx_zstd_descriptor_ok(t)))
		return 0;
	if (n > 1)
		return flx_error_set(L->err, -ENOTSUP, META_NAME, key,
				     "item has %zu transforms; only "
				     "['stream.zstd/1'] is supported",
				     n);
	return flx_error_set(L->err, -ENOTSUP, META_NAME, key,
			     "item transform '%s' is not supported (only "
			     "stream.zstd/1 is)",
			     t);
}

/* A zstd object's decompressed size (flx_object.zsize), the frame
 * validated on the way. */
static int object_size(loader *L, flx_object *o)
{
	const flx_file *f = &L->c->files[o->file];
	char name[FLX_ERR_FIELD];
	flx_reader src, r;
	flx_fd_reader fr;
	flx_file_reader rr;
	flx_zstd_reader zr;
	int fd, rc;

	snprintf(name, sizeof(name), "%s@%llu", f->relpath,
		 (unsigned long long)o->off);
	if (flx_file_is_remote(L->c, o->file)) {
		flx_reader_file(&src, &rr, L->c, o->file, o->off, o->len);
		fd = -1;
	} else {
		rc = flx_file_acquire(L->c, o->file, &fd);
		if (rc)
			return flx_error_set(L->err, rc, f->relpath, o->fqn,
					     "cannot open: %s", strerror(-rc));
		flx_reader_fd(&src, &fr, fd, o->off, o->len);
	}
	rc = flx_zstd_item_load(&L->zobj, &src, MAX_ZSTD_OBJECT, name, o->fqn,
				&r, &zr, L->err);
	if (fd >= 0)
		flx_file_release(L->c, o->file);
	if (rc)
		return flx_error_set(L->err, rc, name, o->fqn, "%s",
				     rc == -ENOMEM ? "out of memory"
						   : "cannot read the item");
	o->zsize = L->zobj.size;
	return 0;
}

static int item_window(loader *L, const sentry *e, const char *key,
		       uint32_t *file, bool *zstd)
{
	const flx_file *f;
	int rc = item_transform(L, e, key, zstd);

	if (rc)
		return rc;
	{
		/* relative_path strings are memoized in the pickle: one node,
		 * so one pointer, per file for tens of thousands of entries,
		 * and the tree outlives this cache */
		struct path_memo *pm =
		    &L->paths[((uintptr_t)e->relpath >> 4) % PATH_MEMO];

		if (pm->s == e->relpath) {
			*file = pm->idx;
		} else {
			const flx_file_ref ref = {META_NAME, "relative_path",
						  key};

			rc = flx_build_data_file(L->b, e->relpath, &ref, file);
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
	flx_reader remote; /* what bc reads a remote file through */
	flx_file_reader remote_ctx;
	flx_zstd_item zi; /* zstd items: their decompressed head and tail */
	flx_zip *zip;
	unsigned char *buf; /* data.pkl bytes */
	size_t cap;
	pkl_memo_ent memo[PKL_MEMO];
	pkl_memo_ent *last; /* the entry the previous item used, or NULL */
} item_scratch;

/* On failure too, s is left for scratch_release(). */
static int scratch_init(void *arg)
{
	item_scratch *s = arg;
	int rc;

	memset(s, 0, sizeof(*s));
	rc = flx_small_read_cache_init(&s->bc);
	s->zip = flx_zip_new();
	return rc ? rc : s->zip ? 0 : -ENOMEM;
}

static void scratch_release(void *arg)
{
	item_scratch *s = arg;

	flx_small_read_cache_release(&s->bc);
	flx_zstd_item_release(&s->zi);
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

/* flx_tensor_pkl_parse() of buf[0..n), through the memo.  Items next to
 * each other in a file are mostly chunks of one tensor, equally shaped:
 * the entry the previous item used is compared first, without hashing. */
static int parse_data_pkl(item_scratch *s, const unsigned char *buf, size_t n,
			  const char *name, flx_tensor_pkl *tp, flx_error *err)
{
	pkl_memo_ent *m = s->last;
	uint64_t h;
	int rc;

	if (m && m->len == n && memcmp(m->bytes, buf, n) == 0) {
		*tp = m->tp;
		return 0;
	}
	h = bytes_hash(buf, n);
	m = &s->memo[h % PKL_MEMO];
	if (m->bytes && m->hash == h && m->len == n &&
	    memcmp(m->bytes, buf, n) == 0) {
		*tp = m->tp;
		s->last = m;
		return 0;
	}
	s->last = NULL; /* m changes below, or is not kept */
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
	s->last = m;
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
 * item's file; errors go to err.  Touches nothing shared but *ch (and
 * keep, the worker's), so items may be loaded on several threads at once
 * (flx_item_ops). */
static int load_item_from(const flx_ckpt *c, item_scratch *s, flx_pool *keep,
			  const flx_tensor *t, flx_chunk *ch, flx_reader r,
			  flx_error *err)
{
	const flx_file *f = &c->files[ch->file];
	char name[FLX_ERR_FIELD];
	flx_zstd_reader zr;
	flx_zip *z = s->zip;
	flx_zip_rec pkl, data, bo;
	flx_tensor_pkl tp;
	int rc;

	item_name(name, sizeof(name), f->relpath, ch->item_off);
	if (ch->zstd) {
		/* the zip is then the frame's content, of which the head and
		 * the tail stay in memory: everything the parsers read */
		flx_reader src = r;
		uint64_t bytes = 0;

		flx_shape_bytes(t->ndim, ch->size, flx_dtype_size(t->dtype),
				NULL, &bytes);
		rc = flx_zstd_item_load(&s->zi, &src, bytes + ZSTD_ZIP_SLACK,
					name, t->fqn, &r, &zr, err);
		if (rc)
			return flx_error_set(err, rc, name, t->fqn, "%s",
					     rc == -ENOMEM
						 ? "out of memory"
						 : "cannot read the item");
	}
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
	if (ch->zstd) {
		/* A frame without a checksum (torch's) decodes a flipped
		 * literal byte silently; the record's CRC-32, taken as the
		 * frame went by, does not (plain items are read in place,
		 * their bytes never pass through here). */
		uint32_t crc;

		rc = flx_zstd_item_crc(&s->zi, data.data_off, data.size, &crc);
		if (rc || crc != data.crc)
			return flx_error_set(err, -EINVAL, name, t->fqn,
					     "storage record's CRC-32 does not "
					     "match its bytes");
	}
	/* zstd: an offset into the decompressed item (ckpt.h) */
	ch->data_off = ch->zstd ? data.data_off : ch->item_off + data.data_off;
	ch->storage_offset = tp.storage_offset;
	rc = flx_chunk_set_strides(ch, t->ndim, tp.stride, keep);
	if (rc)
		return rc;
	ch->contig_from = flx_chunk_contig_from(t->ndim, ch);
	return 0;
}

/* load_item_from() with a reader of the item's file.  The read cache
 * knows a file by its descriptor, which the fd table may give another file
 * once this one is closed: for such files it starts empty. */
static int load_item(const flx_ckpt *c, void *arg, const flx_tensor *t,
		     flx_chunk *ch, flx_pool *keep, flx_error *err)
{
	item_scratch *s = arg;
	flx_reader r;
	flx_cached_reader cr;
	int fd, rc;

	if (flx_file_is_remote(c, ch->file)) {
		/* another node's file: through the cache too, so that the
		 * small reads of nearby items are one request */
		uint64_t size = c->files[ch->file].size;

		flx_reader_file(&s->remote, &s->remote_ctx, c, ch->file, 0,
				size);
		flx_small_read_cache_bind_reader(&s->bc, -2 - (int)ch->file,
						 size, &s->remote);
		flx_reader_cached(&r, &cr, &s->bc, ch->item_off, ch->item_len);
		return load_item_from(c, s, keep, t, ch, r, err);
	}
	rc = flx_file_acquire(c, ch->file, &fd);
	if (rc)
		return flx_error_set(err, rc, c->files[ch->file].relpath,
				     t->fqn, "cannot open: %s", strerror(-rc));
	if (c->files[ch->file].fd < 0)
		flx_small_read_cache_bind(&s->bc, -1, 0);
	flx_small_read_cache_bind(&s->bc, fd, c->files[ch->file].size);
	flx_reader_cached(&r, &cr, &s->bc, ch->item_off, ch->item_len);
	rc = load_item_from(c, s, keep, t, ch, r, err);
	flx_file_release(c, ch->file);
	return rc;
}

/* flx_dcp_flat_box(): until its item is read, a box of a flattened item
 * holds contig_from FLAT_BOX (load_item() sets 0..ndim), the piece's
 * length in data_off and the box's first element in the piece in
 * storage_offset. */
#define FLAT_BOX (-1)

void flx_dcp_flat_box(flx_chunk *ch, int64_t len, int64_t shift)
{
	ch->contig_from = FLAT_BOX;
	ch->data_off = (uint64_t)len;
	ch->storage_offset = shift;
}

/* The item of a box of a flattened item, read as the (1, ..., 1, len)
 * chunk it was saved as; then the box's strides and first element are
 * placed in the piece's storage (inside it: the item's storage record was
 * checked to hold the whole piece). */
static int load_flat_box(const flx_ckpt *c, void *arg, const flx_tensor *t,
			 flx_chunk *ch, flx_pool *keep, flx_error *err)
{
	int64_t stride[FLX_MAX_DIMS];
	int64_t dims[3 * FLX_MAX_DIMS];
	flx_tensor pt = {.fqn = t->fqn, .dtype = t->dtype, .ndim = t->ndim + 1};
	flx_chunk pc = {.off = dims,
			.size = dims + FLX_MAX_DIMS,
			.stride = dims + 2 * FLX_MAX_DIMS,
			.file = ch->file,
			.item_off = ch->item_off,
			.item_len = ch->item_len,
			.zstd = ch->zstd};
	int64_t ls;
	int rc;

	if (pt.ndim > FLX_MAX_DIMS)
		return flx_error_set(err, -EINVAL, c->files[ch->file].relpath,
				     t->fqn, "too many dimensions");
	for (int d = 0; d < pt.ndim; d++) {
		pc.off[d] = 0;
		pc.size[d] = 1;
	}
	pc.size[t->ndim] = (int64_t)ch->data_off;
	rc = load_item(c, arg, &pt, &pc, keep, err);
	if (rc)
		return rc;
	ls = pc.stride[t->ndim];
	for (int d = 0; d < t->ndim; d++)
		stride[d] = ch->stride[d] * ls;
	rc = flx_chunk_set_strides(ch, t->ndim, stride, keep);
	if (rc)
		return rc;
	ch->data_off = pc.data_off;
	ch->storage_offset = pc.storage_offset + ch->storage_offset * ls;
	ch->contig_from = flx_chunk_contig_from(t->ndim, ch);
	return 0;
}

/* An item: a chunk's own, or the one a box of a flattened item is in. */
static int load_any_item(const flx_ckpt *c, void *arg, const flx_tensor *t,
			 flx_chunk *ch, flx_pool *keep, flx_error *err)
{
	if (ch->contig_from == FLAT_BOX)
		return load_flat_box(c, arg, t, ch, keep, err);
	return load_item(c, arg, t, ch, keep, err);
}

/*
 * Decode one tensor's metadata and find its chunks' storage_data entries.
 * name: the key's string in the tree (t->fqn is a copy), for
 * find_sentry().  Runs in a part: each chunk's ch->file holds its entry's
 * index into L->se until resolve_windows() replaces it with the file.  On
 * failure *windows is how many chunks were found before it (their windows
 * come first in the error order).
 */
static int no_entry(loader *L, const flx_tensor *t, const flx_chunk *ch)
{
	char o[96];

	flx_fmt_dims(o, sizeof(o), t->ndim, ch->off);
	return flx_error_set(L->err, -EINVAL, META_NAME, t->fqn,
			     "no storage_data entry for the chunk at %s", o);
}

/* decode_tensor() of a placed list's tensor: its chunks are cl's, their
 * boxes in ckd, their entries written (place()), with the checks and
 * messages of the unplaced path. */
static int placed_tensor(loader *L, flx_pool *pool, flx_tensor *t,
			 const struct ck_list *cl, uint32_t *windows)
{
	size_t step = 2 * (size_t)t->ndim;
	int rc;

	t->chunks = L->chk + cl->first;
	t->nchunks = cl->n;
	t->dims = t->shape; /* until flx_tensor_pool_place() */
	for (uint32_t i = 0; i < t->nchunks; i++) {
		flx_chunk *ch = &t->chunks[i];

		*windows = i;
		if (cl->nd != t->ndim)
			return flx_error_set(L->err, -EINVAL, META_NAME, t->fqn,
					     "chunk %u has %d/%d dimensions, "
					     "the tensor %d",
					     i, cl->nd, cl->nd, t->ndim);
		ch->off = ch->size = t->shape; /* ndim 0: nothing read */
		if (t->ndim) {
			ch->off = L->ckd + cl->dims + i * step;
			ch->size = ch->off + t->ndim;
		}
		if (ch->file == UINT32_MAX)
			return no_entry(L, t, ch);
	}
	*windows = t->nchunks;
	rc = flx_tensor_check_chunks(t, META_NAME, L->err);
	if (!rc)
		rc = flx_tensor_pool_place(pool, t, t->chunks, t->nchunks);
	return rc;
}

static int decode_tensor(loader *L, flx_pool *pool, flx_tensor *t,
			 const char *name, const flx_pv *tsm, uint32_t *windows)
{
	const flx_pv *chunks = attr(tsm, "chunks");
	const struct ck_list *cl = cl_find(L, chunks);
	size_t nch;
	uint64_t nh = name_hash(name);
	bool shared;
	int rc;

	name = interned(L, name, nh);
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
	nch = cl ? cl->n : flx_pv_len(chunks);
	if (nch == 0 || nch > UINT32_MAX)
		return flx_error_set(L->err, -EINVAL, META_NAME, t->fqn,
				     "tensor has %zu chunks", nch);
	if (cl && L->chk)
		return placed_tensor(L, pool, t, cl, windows);
	shared = cl && L->ckd_kept && t->ndim > 0;
	rc = shared ? flx_tensor_pool_strides(pool, t, (uint32_t)nch)
		    : flx_tensor_pool_chunks(pool, t, (uint32_t)nch);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < t->nchunks; i++) {
		const flx_pv *cm = cl ? NULL : flx_pv_item(chunks, i);
		flx_chunk *ch = &t->chunks[i];
		const sentry *e;
		int64_t at[FLX_MAX_DIMS], sz[FLX_MAX_DIMS];
		int n1, n2;

		*windows = i;
		if (cl) {
			/* streamed: checked as below when taken */
			const struct ck_rec *r = &L->ck[cl->first + i];

			n1 = r->n1;
			n2 = r->n2;
			if (shared) {
				ch->off = L->ckd + r->dims;
				ch->size = ch->off + n1;
				goto decoded;
			}
			memcpy(at, L->ckd + r->dims, sizeof(*at) * (size_t)n1);
			memcpy(sz, L->ckd + r->dims + n1,
			       sizeof(*sz) * (size_t)n2);
			goto decoded;
		}
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
	decoded:
		if (n1 != t->ndim || n2 != t->ndim)
			return flx_error_set(L->err, -EINVAL, META_NAME, t->fqn,
					     "chunk %u has %d/%d dimensions, "
					     "the tensor %d",
					     i, n1, n2, t->ndim);
		if (!shared) {
			memcpy(ch->off, at, sizeof(int64_t) * (size_t)t->ndim);
			memcpy(ch->size, sz, sizeof(int64_t) * (size_t)t->ndim);
		}
		e = find_sentry(L, nh, name, t->ndim, ch->off);
		if (!e)
			return no_entry(L, t, ch);
		ch->file = L->place ? e->rid : (uint32_t)(e - L->se);
		ch->zstd = e->ztr;
		ch->item_off = e->offset;
		ch->item_len = e->length;
	}
	*windows = t->nchunks;
	/* The items themselves are read later, all together, in file order
	 * (flx_build_items()). */
	return flx_tensor_check_chunks(t, META_NAME, L->err);
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
				const sentry *e = &L->se[ch->file];
				sentry pe;

				if (L->place) {
					/* the entry is in the chunk, its
					 * relative_path numbered (intern()) */
					pe = (sentry){.relpath =
							  L->iname[ch->file],
						      .offset = ch->item_off,
						      .length = ch->item_len,
						      .ztr = ch->zstd};
					e = &pe;
				}
				rc = item_window(L, e, t->fqn, &ch->file,
						 &ch->zstd);
				if (rc)
					return rc;
			}
		} else if (i != last) {
			flx_object *o = &c->objects[oi++];

			rc = item_window(L, &L->se[o->file], o->fqn, &o->file,
					 &o->zstd);
			if (!rc && o->zstd)
				rc = object_size(L, o);
			if (rc)
				return rc;
		}
	}
	return f ? part_error(L, f) : 0;
}

static int load_state_dict_metadata(loader *L, const flx_pv *sdm)
{
	flx_ckpt *c = L->c;
	unsigned char *kinds = NULL;
	size_t n, ok, nt = 0, no = 0;
	unsigned np;
	part *p = NULL;
	int rc = -ENOMEM;

	if (!sdm || sdm->kind != FLX_PV_DICT)
		return flx_error_set(L->err, -EINVAL, META_NAME,
				     "state_dict_metadata",
				     "missing or not a dict");
	n = sdm->u.dict.n;
	c->tensors = calloc(n ? n : 1, sizeof(flx_tensor));
	c->objects = calloc(n ? n : 1, sizeof(flx_object));
	kinds = malloc(n ? n : 1);
	if (!c->tensors || !c->objects || !kinds)
		goto out;
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
	/* the streamed chunks' boxes stay where they are (decode_tensor()),
	 * before the parts copy the loader:
	 * a million chunks' offsets and sizes are not copied again */
	if (L->ckd && L->nckd) {
		int64_t *fit = realloc(L->ckd, L->nckd * sizeof(*L->ckd));

		if (fit)
			L->ckd = fit;
		L->ckd_kept = flx_pool_adopt(&c->pool, L->ckd) == 0;
	}
	/* and, placed, the chunks themselves, which the boxes need */
	if (L->chk && L->nck) {
		flx_chunk *fit = realloc(L->chk, L->nck * sizeof(*L->chk));

		if (fit)
			L->chk = fit;
		if ((L->nckd && !L->ckd_kept) ||
		    flx_pool_adopt(&c->pool, L->chk))
			goto out;
		L->chk_kept = true;
	}
	np = part_count(L, ok);
	if (!(p = parts_new(L, sdm, ok, np)))
		goto out;
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
	flx_run_parts(p, sizeof(*p), np, sdm_part_run);
	for (unsigned k = 0; k < np; k++)
		flx_pool_move(&c->pool, &p[k].pool);
	rc = resolve_windows(L, kinds, ok, parts_failed(p, np));
	if (rc || ok == n)
		goto out;
	if (!cstr(sdm->u.dict.kv[2 * ok]))
		rc = flx_error_set(
		    L->err, -EINVAL, META_NAME, "state_dict_metadata",
		    "key %zu is not a string without NUL bytes", ok);
	else
		rc = flx_error_set(L->err, -EINVAL, META_NAME,
				   cstr(sdm->u.dict.kv[2 * ok]),
				   "value is neither TensorStorageMetadata "
				   "nor BytesStorageMetadata");
out:
	free(p);
	free(kinds);
	return rc;
}

/* root is torch's Metadata, or the subclass the caller accepts. */
static bool is_metadata(const loader *L, const flx_pv *root)
{
	const flx_pv *cls = flx_pv_obj_class(root);
	const flx_dcp_opts *d = L->dopts;

	if (is_dcp_obj(root, "Metadata"))
		return true;
	return cls && d->sub_class && d->sub_module &&
	       strcmp(cls->u.global.name, d->sub_class) == 0 &&
	       strcmp(cls->u.global.module, d->sub_module) == 0;
}

static int interpret(loader *L, const flx_pv *root)
{
	const flx_pv *cls = flx_pv_obj_class(root);
	int rc;

	if (!is_metadata(L, root) || !obj_state(root) ||
	    obj_state(root)->kind != FLX_PV_DICT)
		return flx_error_set(L->err, -EINVAL, META_NAME, NULL,
				     "not a DCP Metadata object");
	L->c->writer =
	    strdup(strstr(cls->u.global.module, "._shard.")
		       ? "torch 1.13 (torch.distributed._shard.checkpoint)"
		   : attr(root, "storage_meta")
		       ? "torch >= 2.4 (torch.distributed.checkpoint)"
		       : "torch >= 2.0 (torch.distributed.checkpoint)");
	if (!L->c->writer)
		return -ENOMEM;
	rc = load_storage_data(L, attr(root, "storage_data"));
	if (!rc)
		rc = load_state_dict_metadata(
		    L, attr(root, "state_dict_metadata"));
	if (!rc && L->dopts->attrs)
		rc = L->dopts->attrs(L->b, obj_state(root), L->err);
	return rc;
}

/* ---- the source ---- */

static bool is_distcp(const char *name)
{
	size_t n = strlen(name);

	return n > 7 && strcmp(name + n - 7, ".distcp") == 0;
}

bool flx_dcp_owns(const char *name)
{
	size_t n = strlen(name);

	if (is_distcp(name))
		return true;
	if (n > 9 && strncmp(name, "__", 2) == 0 &&
	    strcmp(name + n - 9, ".metadata") == 0)
		return true;
	return false;
}

/* A directory with a .metadata entry, whatever it is: load says what is
 * wrong with it. */
static int probe(int dirfd, bool *yes)
{
	struct stat st;

	*yes = fstatat(dirfd, META_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0 ||
	       errno != ENOENT;
	return 0;
}

static const flx_item_ops item_ops = {
    .scratch_size = sizeof(item_scratch),
    .scratch_init = scratch_init,
    .scratch_release = scratch_release,
    .load = load_any_item,
};

static void loader_release(loader *L)
{
	flx_zstd_item_release(&L->zobj);
	free(L->se);
	free(L->sh);
	free(L->smap);
	for (unsigned k = 0; k < MAX_PARTS; k++)
		free(L->offpool[k]);
	free(L->itab);
	flx_pool_free(&L->names);
	free(L->ck);
	if (!L->ckd_kept)
		free(L->ckd);
	if (!L->chk_kept)
		free(L->chk);
	free(L->cl);
	free(L->iname);
	free(L->own);
	free(L->cmap);
}

/* The .metadata decoded with storage_data streamed into L->se (sd_sink),
 * and the chunks lists (ck_sink) when lists: 0 with L->streamed when the
 * dict streamed is the Metadata's storage_data and every pair of it went
 * to the sink, 0 without when no dict streamed, -EAGAIN when it must be
 * decoded otherwise. */
static int load_streamed(loader *L, const flx_reader *r,
			 const flx_pickle_limits *lim, bool lists,
			 flx_pickle **pk)
{
	flx_pickle_sink sink = {.key = "storage_data",
				.pairs = sd_sink,
				.ctx = L,
				.list_key = lists ? "chunks" : NULL,
				.items = lists ? ck_sink : NULL,
				.watch_key =
				    L->place ? "state_dict_metadata" : NULL,
				.watch = L->place ? sdm_watch : NULL,
				.drop_key = "all_local_plans"};
	const flx_pv *sd, *sunk;
	int rc = flx_pickle_load_sink(r, META_NAME, lim, &sink, pk, L->err);

	if (rc)
		return rc;
	sunk = flx_pickle_sink_dict(*pk);
	sd = attr(flx_pickle_root(*pk), "storage_data");
	/* placed, the chunks hold their entries only if storage_data was
	 * the dict streamed (its pairs may all be SETITEMs: no batch) */
	if ((!L->ncl || lists_placed(L, attr(flx_pickle_root(*pk),
					     "state_dict_metadata"))) &&
	    ((!sunk && !L->nse) || (sd == sunk && sd->u.dict.n == 0)) &&
	    !(L->place && L->ncl && !sunk)) {
		L->streamed = sunk != NULL;
		L->place = L->place && sunk; /* nothing placed otherwise */
		free(L->cmap);		     /* place()'s, done */
		L->cmap = NULL;
		return 0;
	}
	flx_pickle_free(*pk);
	*pk = NULL;
	if (L->place)
		L->place_declined = true;
	return -EAGAIN;
}

/* Attempt k: the chunks lists streamed and the storage_data entries
 * placed into their chunks (k 0); when the placing declined, the entries
 * looked up by their offsets instead (k 1); then, when the chunks are
 * named again (other than from all_local_plans, which every attempt
 * drops), storage_data alone, which no one names again (k 2). */
static int load_attempt(void *ctx, unsigned k, const flx_reader *r,
			const flx_pickle_limits *lim, flx_pickle **pk)
{
	loader *L = ctx;

	if (k == 1 && !L->place_declined)
		return -EAGAIN; /* declined for what k 1 would meet too */
	L->place = k == 0;
	return load_streamed(L, r, lim, k < 2, pk);
}

static void load_reset(void *ctx)
{
	sink_reset(ctx);
}

/* Decode the .metadata pickle, read forward through a window
 * (flx_build_load_pickle()): at a million chunks its bytes are over 100 MB
 * and never sit in memory whole next to the tree. */
static int load_metadata(loader *L, flx_pickle **pk)
{
	const char *missing = L->dopts->missing
				  ? L->dopts->missing
				  : "no such file (is this a PyTorch DCP "
				    "checkpoint directory?)";

	return flx_build_load_pickle(L->b, META_NAME, MAX_METADATA_BYTES,
				     missing, &L->c->mtime_ns, 3, load_attempt,
				     load_reset, L, pk, L->err);
}

int flx_dcp_load(flx_build *b, const flx_ckpt_opts *o, const flx_dcp_opts *d,
		 flx_error *err)
{
	static const flx_dcp_opts plain = {0};
	loader L = {.b = b,
		    .dopts = d ? d : &plain,
		    .c = flx_build_ckpt(b),
		    .err = err};
	flx_pickle *pk = NULL;
	int rc;

	L.threads = o->threads;
	flx_build_prefetch(b, is_distcp);
	flx_build_names_from(b, META_NAME, "state_dict_metadata");
	rc = load_metadata(&L, &pk);
	if (rc)
		goto out;
	rc = interpret(&L, flx_pickle_root(pk));
	if (!rc)
		flx_build_items(b, &item_ops);
out:
	flx_pickle_free(pk);
	loader_release(&L);
	return rc;
}

static int load(flx_build *b, const flx_ckpt_opts *o, flx_error *err)
{
	return flx_dcp_load(b, o, NULL, err);
}

const flx_source flx_source_dcp = {
    .name = "torch-dcp",
    .kind = "PyTorch DCP",
    .marker = META_NAME,
    .probe = probe,
    .owns = flx_dcp_owns,
    .metadata = "*.metadata",
    .load = load,
};
