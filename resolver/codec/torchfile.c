/* SPDX-License-Identifier: MIT */
#include "torchfile.h"

#include "zipitem.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * The layouts are those of torch/serialization.py: _save and _load (zip,
 * through torch._C.PyTorchFileWriter/Reader), _legacy_save and _legacy_load
 * (a stream of pickles, then the storages).  See
 * docs/formats/torch-save-source.md.
 */

/* Most nodes visited by the walk over the object tree: shared nodes make
 * paths multiply, and this is what a hostile DAG can cost at most. */
#define MAX_VISITS (1u << 24)
/* Longest key path kept for messages. */
#define PATH_MAX_LEN 120
/* byteorder / version records are a few bytes. */
#define SMALL_RECORD 64

/* The magic number's pickle at the start of a legacy file: PROTO n
 * [FRAME len] LONG1 10 <0x1950a86a20f9469cfc6c, little-endian> STOP. */
static const unsigned char legacy_magic[10] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9,
					       0x20, 0x6a, 0xa8, 0x50, 0x19};
#define LEGACY_PROTOCOL_VERSION 1001

struct flx_torchfile {
	flx_torchfile_kind kind;
	flx_pickle *pkl;
	uint64_t pkl_off, pkl_len;
	char *name;
	uint32_t n;
	flx_torch_storage *st; /* sorted by key */
	unsigned *esize;       /* per storage: element size (legacy) */
	char *keys;	       /* the keys, NUL-terminated */
};

/* A window [base, base + size) of another reader. */
struct sub_ctx {
	const flx_reader *r;
	uint64_t base;
};

static int sub_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	struct sub_ctx *s = ctx;

	return flx_read_at(s->r, buf, n, s->base + off);
}

static void sub_reader(flx_reader *out, struct sub_ctx *ctx,
		       const flx_reader *r, uint64_t base, uint64_t len)
{
	ctx->r = r;
	ctx->base = base;
	out->pread = sub_pread;
	out->ctx = ctx;
	out->size = len;
}

/* A key met while walking: its storage as tensors state it. */
struct ref {
	const char *key; /* in the pickle's tree (tensor_pkl copies it) */
	uint64_t need;	 /* most bytes a tensor viewing it reaches */
	uint64_t bytes;	 /* storage bytes the persistent id states */
	unsigned esize;
	char path[PATH_MAX_LEN]; /* first tensor naming it */
};

struct walk {
	const char *name;
	flx_error *err;
	struct ref *refs;
	size_t n, cap;
	uint64_t visits;
	char path[PATH_MAX_LEN];
};

static int tf_fail(flx_error *err, int code, const char *name, const char *key,
		   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static int tf_fail(flx_error *err, int code, const char *name, const char *key,
		   const char *fmt, ...)
{
	char why[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return flx_error_set(err, code, name, key && *key ? key : NULL, "%s",
			     why);
}

bool flx_torchfile_is_tensor(const flx_pv *v)
{
	const flx_pv *fn = flx_pv_obj_class(v);

	if (!fn || v->newobj ||
	    strcmp(fn->u.global.module, "torch._utils") != 0)
		return false;
	if (strcmp(fn->u.global.name, "_rebuild_tensor_v2") == 0 ||
	    strcmp(fn->u.global.name, "_rebuild_tensor_v3") == 0)
		return true;
	if (strcmp(fn->u.global.name, "_rebuild_parameter") == 0 ||
	    strcmp(fn->u.global.name, "_rebuild_parameter_with_state") == 0) {
		const flx_pv *inner = flx_pv_item(v->u.obj.args, 0);
		const flx_pv *ifn = flx_pv_obj_class(inner);

		return ifn && !inner->newobj &&
		       strcmp(ifn->u.global.module, "torch._utils") == 0 &&
		       (strcmp(ifn->u.global.name, "_rebuild_tensor_v2") == 0 ||
			strcmp(ifn->u.global.name, "_rebuild_tensor_v3") == 0);
	}
	return false;
}

/* The rebuild call of a tensor node, past a parameter wrapper. */
static const flx_pv *unwrap(const flx_pv *v, bool *param)
{
	const flx_pv *fn = flx_pv_obj_class(v);

	*param = false;
	if (fn &&
	    (strcmp(fn->u.global.name, "_rebuild_parameter") == 0 ||
	     strcmp(fn->u.global.name, "_rebuild_parameter_with_state") == 0)) {
		*param = true;
		return flx_pv_item(v->u.obj.args, 0);
	}
	return v;
}

/* Bytes of storage the tensor reaches: (storage_offset + span) x esize. */
static int tensor_need(const flx_tensor_pkl *t, uint64_t *need)
{
	uint64_t span, end;

	if (flx_strided_span(t->ndim, t->size, t->stride, &span))
		return -EOVERFLOW;
	if (span == 0) {
		*need = 0;
		return 0;
	}
	if (__builtin_add_overflow(span, (uint64_t)t->storage_offset, &end) ||
	    __builtin_mul_overflow(end, (uint64_t)flx_dtype_size(t->dtype),
				   need))
		return -EOVERFLOW;
	return 0;
}

static int add_ref(struct walk *w, const flx_pv *node)
{
	flx_tensor_pkl t;
	const flx_pv *inner;
	const char *key;
	uint64_t need;
	bool param;
	int rc;

	inner = unwrap(node, &param);
	rc = flx_tensor_pkl_from_pv(inner, w->name, &t, w->err);
	if (rc) {
		flx_error_key(w->err, w->path);
		return rc;
	}
	if (tensor_need(&t, &need))
		return tf_fail(w->err, -EINVAL, w->name, w->path,
			       "size x stride overflows");
	/* the key string lives in the tree: find it there */
	key = flx_pv_str(
	    flx_pv_item(inner->u.obj.args, 0)->u.persid.pid->u.seq.v[2]);
	/* one ref per tensor; make_table() merges those of one storage */
	if (w->n == FLX_TORCHFILE_MAX_STORAGES)
		return tf_fail(w->err, -EINVAL, w->name, w->path,
			       "more than %u tensors",
			       FLX_TORCHFILE_MAX_STORAGES);
	if (w->n == w->cap) {
		size_t nc = w->cap ? w->cap * 2 : 64;
		struct ref *nr = realloc(w->refs, nc * sizeof(*nr));

		if (!nr)
			return tf_fail(w->err, -ENOMEM, w->name, NULL,
				       "out of memory");
		w->refs = nr;
		w->cap = nc;
	}
	w->refs[w->n] = (struct ref){.key = key,
				     .need = need,
				     .bytes = t.storage_bytes,
				     .esize = t.storage_esize};
	snprintf(w->refs[w->n].path, PATH_MAX_LEN, "%s", w->path);
	w->n++;
	return 0;
}

static int walk(struct walk *w, const flx_pv *v, unsigned depth);

/* Walk child c with path component comp (NULL: the path stays). */
static int walk_child(struct walk *w, const flx_pv *c, const char *comp,
		      unsigned depth)
{
	size_t len = strlen(w->path);
	int rc;

	if (comp)
		snprintf(w->path + len, PATH_MAX_LEN - len, "%s%s",
			 len ? "." : "", comp);
	rc = walk(w, c, depth + 1);
	w->path[len] = '\0';
	return rc;
}

static int walk(struct walk *w, const flx_pv *v, unsigned depth)
{
	char idx[24];
	int rc;

	if (!v)
		return 0;
	if (++w->visits > MAX_VISITS)
		return tf_fail(w->err, -EINVAL, w->name, w->path,
			       "object tree: more than %u nodes visited",
			       MAX_VISITS);
	if (depth > FLX_PV_MAX_WALK_DEPTH)
		return tf_fail(w->err, -EINVAL, w->name, w->path,
			       "object tree nested deeper than %d",
			       FLX_PV_MAX_WALK_DEPTH);
	switch (v->kind) {
	case FLX_PV_TUPLE:
	case FLX_PV_LIST:
	case FLX_PV_SET:
		for (size_t i = 0; i < v->u.seq.n; i++) {
			snprintf(idx, sizeof(idx), "%zu", i);
			if ((rc = walk_child(w, v->u.seq.v[i], idx, depth)))
				return rc;
		}
		return 0;
	case FLX_PV_DICT:
		for (size_t i = 0; i < v->u.dict.n; i++) {
			const flx_pv *k = v->u.dict.kv[2 * i];
			const char *ks = flx_pv_str(k);
			int64_t ki;

			if (!ks && flx_pv_int(k, &ki)) {
				snprintf(idx, sizeof(idx), "%" PRId64, ki);
				ks = idx;
			}
			if ((rc = walk(w, k, depth + 1)) ||
			    (rc = walk_child(w, v->u.dict.kv[2 * i + 1],
					     ks ? ks : "?", depth)))
				return rc;
		}
		return 0;
	case FLX_PV_OBJ:
		if (flx_torchfile_is_tensor(v))
			return add_ref(w, v);
		for (size_t i = 0; i < flx_pv_len(v->u.obj.args); i++) {
			const flx_pv *a = flx_pv_item(v->u.obj.args, i);
			const flx_pv *cls = flx_pv_obj_class(v);

			if (a && a->kind == FLX_PV_PERSID)
				return tf_fail(
				    w->err, -EINVAL, w->name, w->path,
				    "a storage passed to %s%s%s, not to a "
				    "tensor rebuild function",
				    cls ? cls->u.global.module : "an object",
				    cls ? "." : "",
				    cls ? cls->u.global.name : "");
		}
		if ((rc = walk(w, v->u.obj.args, depth + 1)))
			return rc;
		return walk(w, v->u.obj.state, depth + 1);
	case FLX_PV_PERSID:
		return tf_fail(w->err, -EINVAL, w->name, w->path,
			       "a persistent id outside a tensor (a bare "
			       "storage or module): not supported");
	default:
		return 0;
	}
}

static int cmp_storage(const void *a, const void *b)
{
	return strcmp(((const flx_torch_storage *)a)->key,
		      ((const flx_torch_storage *)b)->key);
}

static int cmp_ref(const void *a, const void *b)
{
	return strcmp(((const struct ref *)a)->key,
		      ((const struct ref *)b)->key);
}

/* Storage table of f from the walk's refs (sorted by key), offsets
 * still 0. */
static int make_table(flx_torchfile *f, struct walk *w)
{
	size_t klen = 0, m = 0;
	char *p;

	/* one ref per storage: merge the tensors' (sorted by key), which
	 * must state the same storage */
	qsort(w->refs, w->n, sizeof(*w->refs), cmp_ref);
	for (size_t i = 0; i < w->n; i++) {
		struct ref *r = &w->refs[i], *prev = m ? &w->refs[m - 1] : NULL;

		if (prev && strcmp(prev->key, r->key) == 0) {
			if (prev->bytes != r->bytes || prev->esize != r->esize)
				return tf_fail(
				    w->err, -EINVAL, w->name, r->path,
				    "storage '%s' is stated as %" PRIu64
				    " bytes of %u-byte elements here but as "
				    "%" PRIu64 " bytes of %u-byte elements "
				    "by '%s'",
				    r->key, r->bytes, r->esize, prev->bytes,
				    prev->esize, prev->path);
			if (r->need > prev->need)
				prev->need = r->need;
			continue;
		}
		if (m != i)
			w->refs[m] = *r;
		m++;
	}
	w->n = m;
	for (size_t i = 0; i < w->n; i++)
		klen += strlen(w->refs[i].key) + 1;
	f->st = calloc(w->n ? w->n : 1, sizeof(*f->st));
	f->esize = calloc(w->n ? w->n : 1, sizeof(*f->esize));
	f->keys = malloc(klen ? klen : 1);
	if (!f->st || !f->esize || !f->keys)
		return tf_fail(w->err, -ENOMEM, f->name, NULL, "out of memory");
	p = f->keys;
	for (size_t i = 0; i < w->n; i++) {
		size_t l = strlen(w->refs[i].key) + 1;

		memcpy(p, w->refs[i].key, l);
		f->st[i].key = p;
		f->st[i].bytes = w->refs[i].bytes;
		f->esize[i] = w->refs[i].esize;
		p += l;
	}
	f->n = (uint32_t)w->n;
	return 0;
}

static int find_storage(const flx_torchfile *f, const char *key)
{
	flx_torch_storage k = {.key = key};
	const flx_torch_storage *s;

	s = bsearch(&k, f->st, f->n, sizeof(*f->st), cmp_storage);
	return s ? (int)(s - f->st) : -1;
}

/* ------------------------------------------------------------------- zip */

static int read_small(const flx_reader *r, const flx_zip *z, const char *rel,
		      const char *name, char *buf, size_t cap, bool *found,
		      flx_error *err)
{
	flx_zip_rec rec;
	int rc;

	*found = false;
	if (flx_zip_find(z, rel, &rec))
		return 0;
	if (rec.size >= cap)
		return tf_fail(err, -EINVAL, name, rel,
			       "record of %" PRIu64 " bytes (limit %zu)",
			       rec.size, cap - 1);
	if ((rc = flx_read_at(r, buf, (size_t)rec.size, rec.data_off)))
		return tf_fail(err, rc, name, rel, "cannot read: %s",
			       strerror(-rc));
	buf[rec.size] = '\0';
	*found = true;
	return 0;
}

static int open_zip(flx_torchfile *f, const flx_reader *r, flx_error *err)
{
	static const flx_pickle_limits lim = {0};
	struct walk w = {.name = f->name, .err = err};
	struct sub_ctx sc;
	flx_reader pr;
	flx_zip *z = NULL;
	flx_zip_rec rec;
	char small[SMALL_RECORD];
	bool found;
	int rc;

	rc = flx_zip_open_max(r, f->name, FLX_TORCHFILE_MAX_STORAGES + 16, &z,
			      err);
	if (rc)
		return rc;
	/* torch >= 2.1 records the byte order; before, little-endian */
	if ((rc = read_small(r, z, "byteorder", f->name, small, sizeof(small),
			     &found, err)))
		goto out;
	if (found && strcmp(small, "little") != 0) {
		rc = tf_fail(err, -EINVAL, f->name, "byteorder",
			     "byte order '%.16s' is not supported (only "
			     "'little')",
			     small);
		goto out;
	}
	if (flx_zip_find(z, "data.pkl", &rec)) {
		rc = tf_fail(err, -EINVAL, f->name, NULL,
			     "zip: no record '%s/data.pkl'", flx_zip_prefix(z));
		goto out;
	}
	f->pkl_off = rec.data_off;
	f->pkl_len = rec.size;
	sub_reader(&pr, &sc, r, rec.data_off, rec.size);
	if ((rc = flx_pickle_load_reader(&pr, f->name, &lim, &f->pkl, err)))
		goto out;
	if ((rc = walk(&w, flx_pickle_root(f->pkl), 0)) ||
	    (rc = make_table(f, &w)))
		goto out;
	for (uint32_t i = 0; i < f->n; i++) {
		char rel[96];
		struct ref *ref = &w.refs[i];

		snprintf(rel, sizeof(rel), "data/%s", f->st[i].key);
		if (flx_zip_find(z, rel, &rec)) {
			rc = tf_fail(err, -EINVAL, f->name, ref->path,
				     "storage '%s': no record '%s/%s'",
				     f->st[i].key, flx_zip_prefix(z), rel);
			goto out;
		}
		if (rec.size < f->st[i].bytes || rec.size < ref->need) {
			rc = tf_fail(err, -EINVAL, f->name, ref->path,
				     "storage '%s' holds %" PRIu64
				     " bytes but %" PRIu64 " are needed",
				     f->st[i].key, rec.size,
				     ref->need > f->st[i].bytes
					 ? ref->need
					 : f->st[i].bytes);
			goto out;
		}
		f->st[i].off = rec.data_off;
		f->st[i].bytes = rec.size;
	}
out:
	free(w.refs);
	flx_zip_close(z);
	return rc;
}

/* ---------------------------------------------------------------- legacy */

/* Load one pickle starting at *pos; *pos moves past its STOP. */
static int load_at(const flx_reader *r, uint64_t *pos, const char *name,
		   const flx_pickle_limits *lim, flx_pickle **out,
		   flx_error *err)
{
	struct sub_ctx sc;
	flx_reader pr;
	int rc;

	if (*pos >= r->size)
		return tf_fail(err, -EINVAL, name, NULL,
			       "legacy: file ends at %" PRIu64
			       " before the next pickle",
			       *pos);
	sub_reader(&pr, &sc, r, *pos, r->size - *pos);
	if ((rc = flx_pickle_load_reader(&pr, name, lim, out, err)))
		return rc;
	*pos += flx_pickle_end(*out);
	return 0;
}

/* The magic number's pickle; *pos past it. */
static int legacy_magic_at(const flx_reader *r, const char *name, uint64_t *pos,
			   flx_error *err)
{
	unsigned char h[32];
	size_t n = r->size < sizeof(h) ? (size_t)r->size : sizeof(h), i = 2;
	int rc;

	if ((rc = flx_read_at(r, h, n, 0)))
		return tf_fail(err, rc, name, NULL, "cannot read: %s",
			       strerror(-rc));
	if (n < 2 || h[0] != 0x80 || h[1] < 2 || h[1] > 5)
		goto bad;
	if (n > i && h[i] == 0x95) /* FRAME */
		i += 9;
	if (n < i + 13 || h[i] != 0x8a || h[i + 1] != 10 ||
	    memcmp(h + i + 2, legacy_magic, 10) != 0 || h[i + 12] != '.')
		goto bad;
	*pos = i + 13;
	return 0;
bad:
	return tf_fail(err, -EINVAL, name, NULL,
		       "neither a zip archive nor a legacy torch.save file "
		       "(no magic number)");
}

static int open_legacy(flx_torchfile *f, const flx_reader *r, flx_error *err)
{
	static const flx_pickle_limits small_lim = {.max_nodes = 1u << 12,
						    .max_depth = 16};
	static const flx_pickle_limits lim = {0};
	struct walk w = {.name = f->name, .err = err};
	flx_pickle *p = NULL;
	const flx_pv *v;
	uint64_t pos = 0;
	int64_t iv;
	size_t nkeys;
	unsigned char cnt[8];
	int rc;

	if ((rc = legacy_magic_at(r, f->name, &pos, err)))
		return rc;
	if ((rc = load_at(r, &pos, f->name, &small_lim, &p, err)))
		goto out;
	if (!flx_pv_int(flx_pickle_root(p), &iv) ||
	    iv != LEGACY_PROTOCOL_VERSION) {
		rc = tf_fail(err, -EINVAL, f->name, NULL,
			     "legacy: protocol version is not %d",
			     LEGACY_PROTOCOL_VERSION);
		goto out;
	}
	flx_pickle_free(p);
	p = NULL;
	if ((rc = load_at(r, &pos, f->name, &small_lim, &p, err)))
		goto out;
	v = flx_pv_dict_get(flx_pickle_root(p), "little_endian");
	if (!v || v->kind != FLX_PV_BOOL || !v->u.b) {
		rc = tf_fail(err, -EINVAL, f->name, "little_endian",
			     "legacy: sys_info does not say little_endian "
			     "True (big-endian files are not supported)");
		goto out;
	}
	flx_pickle_free(p);
	p = NULL;
	f->pkl_off = pos;
	if ((rc = load_at(r, &pos, f->name, &lim, &f->pkl, err)))
		goto out;
	f->pkl_len = pos - f->pkl_off;
	if ((rc = walk(&w, flx_pickle_root(f->pkl), 0)) ||
	    (rc = make_table(f, &w)))
		goto out;
	if ((rc = load_at(r, &pos, f->name, &lim, &p, err)))
		goto out;
	v = flx_pickle_root(p);
	if (!v || v->kind != FLX_PV_LIST) {
		rc = tf_fail(err, -EINVAL, f->name, NULL,
			     "legacy: storage key list is a %s, not a list",
			     flx_pv_kind_name(v));
		goto out;
	}
	nkeys = flx_pv_len(v);
	if (nkeys != f->n) {
		rc = tf_fail(err, -EINVAL, f->name, NULL,
			     "legacy: %zu storage keys listed but tensors "
			     "name %u storages",
			     nkeys, f->n);
		goto out;
	}
	for (size_t k = 0; k < nkeys; k++) {
		const char *key = flx_pv_str(flx_pv_item(v, k));
		int i = key ? find_storage(f, key) : -1;
		uint64_t count, bytes;

		if (i < 0) {
			rc = tf_fail(err, -EINVAL, f->name, key,
				     "legacy: storage key %zu is %s that no "
				     "tensor names",
				     k, key ? "a key" : "not a str");
			goto out;
		}
		if (f->st[i].off) {
			rc = tf_fail(err, -EINVAL, f->name, key,
				     "legacy: storage key listed twice");
			goto out;
		}
		if (pos > r->size || r->size - pos < 8) {
			rc = tf_fail(err, -EINVAL, f->name, key,
				     "legacy: storage's element count at "
				     "%" PRIu64 " is past the end of the file "
				     "(%" PRIu64 " bytes)",
				     pos, r->size);
			goto out;
		}
		if ((rc = flx_read_at(r, cnt, 8, pos))) {
			rc = tf_fail(err, rc, f->name, key, "cannot read: %s",
				     strerror(-rc));
			goto out;
		}
		count = 0;
		for (int b = 7; b >= 0; b--)
			count = count << 8 | cnt[b];
		if (__builtin_mul_overflow(count, (uint64_t)f->esize[i],
					   &bytes) ||
		    bytes != f->st[i].bytes) {
			rc = tf_fail(err, -EINVAL, f->name, key,
				     "legacy: storage holds %" PRIu64
				     " elements of %u bytes but the object "
				     "pickle states %" PRIu64 " bytes",
				     count, f->esize[i], f->st[i].bytes);
			goto out;
		}
		pos += 8;
		if (bytes > r->size - pos) {
			rc = tf_fail(err, -EINVAL, f->name, key,
				     "legacy: storage [%" PRIu64 ", +%" PRIu64
				     ") runs past the end of the file "
				     "(%" PRIu64 " bytes)",
				     pos, bytes, r->size);
			goto out;
		}
		f->st[i].off = pos;
		pos += bytes;
	}
	/* every storage's need fits: the persistent id's size was checked
	 * against each tensor (torchpkl), and the file's count equals it */
out:
	flx_pickle_free(p);
	free(w.refs);
	return rc;
}

/* ---------------------------------------------------------------- public */

int flx_torchfile_open(const flx_reader *r, const char *name,
		       flx_torchfile **out, flx_error *err)
{
	flx_torchfile *f;
	unsigned char m[4] = {0};
	int rc;

	if (!name)
		name = "";
	if (r->size >= 4 && (rc = flx_read_at(r, m, 4, 0)))
		return tf_fail(err, rc, name, NULL, "cannot read: %s",
			       strerror(-rc));
	f = calloc(1, sizeof(*f));
	if (!f || !(f->name = strdup(name))) {
		free(f);
		return tf_fail(err, -ENOMEM, name, NULL, "out of memory");
	}
	if (memcmp(m, "PK\3\4", 4) == 0) {
		f->kind = FLX_TORCHFILE_ZIP;
		rc = open_zip(f, r, err);
	} else {
		f->kind = FLX_TORCHFILE_LEGACY;
		rc = open_legacy(f, r, err);
	}
	if (rc) {
		flx_torchfile_close(f);
		return rc;
	}
	*out = f;
	return 0;
}

flx_torchfile_kind flx_torchfile_kind_of(const flx_torchfile *f)
{
	return f->kind;
}

const flx_pv *flx_torchfile_root(const flx_torchfile *f)
{
	return f ? flx_pickle_root(f->pkl) : NULL;
}

void flx_torchfile_pickle_span(const flx_torchfile *f, uint64_t *off,
			       uint64_t *len)
{
	if (off)
		*off = f->pkl_off;
	if (len)
		*len = f->pkl_len;
}

uint32_t flx_torchfile_nstorages(const flx_torchfile *f)
{
	return f ? f->n : 0;
}

const flx_torch_storage *flx_torchfile_storage(const flx_torchfile *f,
					       uint32_t i)
{
	return f && i < f->n ? &f->st[i] : NULL;
}

int flx_torchfile_resolve(const flx_torchfile *f, const flx_pv *v,
			  const char *key, flx_torchfile_tensor *out,
			  flx_error *err)
{
	flx_torchfile_tensor t;
	const flx_pv *inner;
	uint64_t need;
	int i, rc;

	if (!flx_torchfile_is_tensor(v))
		return tf_fail(err, -EINVAL, f->name, key, "a %s, not a tensor",
			       flx_pv_kind_name(v));
	memset(&t, 0, sizeof(t));
	inner = unwrap(v, &t.parameter);
	if ((rc = flx_tensor_pkl_from_pv(inner, f->name, &t.t, err))) {
		flx_error_key(err, key);
		return rc;
	}
	i = find_storage(f, t.t.key);
	if (i < 0)
		return tf_fail(err, -EINVAL, f->name, key,
			       "storage '%s' is not in the file", t.t.key);
	if (tensor_need(&t.t, &need) || need > f->st[i].bytes)
		return tf_fail(err, -EINVAL, f->name, key,
			       "tensor runs past its storage '%s'", t.t.key);
	t.data_off = f->st[i].off;
	t.storage = (uint32_t)i;
	*out = t;
	return 0;
}

void flx_torchfile_close(flx_torchfile *f)
{
	if (!f)
		return;
	flx_pickle_free(f->pkl);
	free(f->st);
	free(f->esize);
	free(f->keys);
	free(f->name);
	free(f);
}
