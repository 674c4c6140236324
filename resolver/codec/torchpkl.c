/* SPDX-License-Identifier: MIT */
#include "torchpkl.h"

#include "pickle.h"
#include "shape.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* data.pkl of one tensor is a few hundred bytes; these limits only stop a
 * hostile file from making the decoder work hard. */
static const flx_pickle_limits tpkl_limits = {
    .max_nodes = 1u << 16,
    .max_stack = 1u << 12,
    .max_depth = 64,
    .max_memo = 1u << 16,
};

struct tctx {
	const char *name;
	flx_error *err;
};

static int tfail(struct tctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int tfail(struct tctx *c, const char *fmt, ...)
{
	char why[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return flx_error_set(c->err, -EINVAL, c->name, NULL, "data.pkl: %s",
			     why);
}

/* Storage class of the persistent id: dtype (typed storage) or
 * FLX_DT_INVALID with *untyped set. */
static int storage_class(struct tctx *c, const flx_pv *cls, flx_dtype *dt,
			 bool *untyped)
{
	const char *mod, *nm;

	if (!cls || cls->kind != FLX_PV_GLOBAL)
		return tfail(c, "storage type is a %s, not a class",
			     flx_pv_kind_name(cls));
	mod = cls->u.global.module;
	nm = cls->u.global.name;
	*untyped = false;
	*dt = FLX_DT_INVALID;
	if (strcmp(nm, "UntypedStorage") == 0 &&
	    (strcmp(mod, "torch") == 0 || strcmp(mod, "torch.storage") == 0)) {
		*untyped = true;
		return 0;
	}
	if (strcmp(mod, "torch") == 0)
		*dt = flx_dtype_from_storage(nm);
	if (*dt == FLX_DT_INVALID)
		return tfail(c, "unsupported storage class %s.%s", mod, nm);
	return 0;
}

/* ('storage', <class>, key, location, numel) */
static int parse_persid(struct tctx *c, const flx_pv *st, flx_tensor_pkl *t,
			flx_dtype *sdt, bool *untyped)
{
	const flx_pv *pid;
	const char *tag, *key;
	int64_t numel;
	unsigned esize;
	size_t klen;
	int rc;

	if (!st || st->kind != FLX_PV_PERSID)
		return tfail(c, "storage argument is a %s, not a persistent id",
			     flx_pv_kind_name(st));
	pid = st->u.persid.pid;
	/* torch.serialization._legacy_save adds a sixth field, the storage
	 * view's metadata, None since storages stopped having views */
	if (!pid || pid->kind != FLX_PV_TUPLE ||
	    (flx_pv_len(pid) != 5 && flx_pv_len(pid) != 6))
		return tfail(c, "storage persistent id is not a 5-tuple");
	if (flx_pv_len(pid) == 6 && flx_pv_item(pid, 5)->kind != FLX_PV_NONE)
		return tfail(c,
			     "storage persistent id names a storage view "
			     "(%s): not supported",
			     flx_pv_kind_name(flx_pv_item(pid, 5)));
	tag = flx_pv_str(flx_pv_item(pid, 0));
	if (!tag || strcmp(tag, "storage") != 0)
		return tfail(c, "persistent id tag is not 'storage'");
	if ((rc = storage_class(c, flx_pv_item(pid, 1), sdt, untyped)))
		return rc;
	key = flx_pv_str(flx_pv_item(pid, 2));
	if (!key)
		return tfail(c, "storage key is not a str");
	klen = flx_pv_item(pid, 2)->u.str.len;
	/* The key names the record data/<key>: keep it a plain name. */
	if (klen == 0 || klen >= sizeof(t->key) || strlen(key) != klen ||
	    strchr(key, '/'))
		return tfail(c, "bad storage key (%zu bytes)", klen);
	if (!flx_pv_str(flx_pv_item(pid, 3)))
		return tfail(c, "storage location is not a str");
	if (!flx_pv_item(pid, 4) || flx_pv_item(pid, 4)->kind != FLX_PV_INT ||
	    !flx_pv_int(flx_pv_item(pid, 4), &numel) || numel < 0)
		return tfail(c, "storage size is not a non-negative int");
	esize = *untyped ? 1 : flx_dtype_size(*sdt);
	t->storage_esize = esize;
	if (__builtin_mul_overflow((uint64_t)numel, (uint64_t)esize,
				   &t->storage_bytes))
		return tfail(c, "storage size overflows");
	memcpy(t->key, key, klen + 1);
	return 0;
}

/* A tuple of non-negative ints (size or stride). */
static int int_tuple(struct tctx *c, const flx_pv *v, const char *what,
		     int64_t *out, int *n)
{
	size_t len;

	if (!v || v->kind != FLX_PV_TUPLE)
		return tfail(c, "%s is a %s, not a tuple", what,
			     flx_pv_kind_name(v));
	len = flx_pv_len(v);
	if (len > FLX_MAX_DIMS)
		return tfail(c, "%s has %zu dimensions (limit %d)", what, len,
			     FLX_MAX_DIMS);
	for (size_t i = 0; i < len; i++) {
		const flx_pv *e = flx_pv_item(v, i);

		if (!e || e->kind != FLX_PV_INT)
			return tfail(c, "%s[%zu] is a %s, not an int", what, i,
				     flx_pv_kind_name(e));
		if (e->u.i < 0)
			return tfail(c, "%s[%zu] = %" PRId64 " is negative",
				     what, i, e->u.i);
		out[i] = e->u.i;
	}
	*n = (int)len;
	return 0;
}

/* Distinct elements at distinct storage positions, and storage_offset +
 * the last index reached inside the storage. */
static int check_extent(struct tctx *c, const flx_tensor_pkl *t)
{
	uint64_t span, end, bytes;

	if (flx_strided_span(t->ndim, t->size, t->stride, &span))
		return tfail(c, "size x stride overflows");
	if (span == 0)
		return 0; /* no elements: no storage needed */
	/* an expand()ed view would let a few stored bytes stand for any
	 * number of served ones: every size must stay what storage backs */
	if (flx_strided_disjoint(t->ndim, t->size, t->stride)) {
		char sz[96], st[96];

		flx_fmt_dims(sz, sizeof(sz), t->ndim, t->size);
		flx_fmt_dims(st, sizeof(st), t->ndim, t->stride);
		return tfail(c,
			     "size %s with stride %s puts several elements "
			     "at one storage position (an expand()ed or "
			     "overlapping view): not supported",
			     sz, st);
	}
	if (__builtin_add_overflow(span, (uint64_t)t->storage_offset, &end) ||
	    __builtin_mul_overflow(end, (uint64_t)flx_dtype_size(t->dtype),
				   &bytes))
		return tfail(c, "size x stride overflows");
	if (bytes > t->storage_bytes)
		return tfail(c,
			     "tensor needs %" PRIu64 " bytes of storage "
			     "'%s' but it has %" PRIu64,
			     bytes, t->key, t->storage_bytes);
	return 0;
}

static int interpret(struct tctx *c, const flx_pv *root, flx_tensor_pkl *t)
{
	const flx_pv *fn = flx_pv_obj_class(root), *args, *v;
	flx_dtype sdt = FLX_DT_INVALID;
	bool v3, untyped = false;
	size_t nargs, base;
	int nstride;
	int rc;

	if (!fn || root->newobj)
		return tfail(c, "root is a %s, not a tensor rebuild call",
			     flx_pv_kind_name(root));
	if (strcmp(fn->u.global.module, "torch._utils") != 0 ||
	    (strcmp(fn->u.global.name, "_rebuild_tensor_v2") != 0 &&
	     strcmp(fn->u.global.name, "_rebuild_tensor_v3") != 0))
		return tfail(c, "unsupported rebuild function %s.%s",
			     fn->u.global.module, fn->u.global.name);
	v3 = strcmp(fn->u.global.name, "_rebuild_tensor_v3") == 0;
	args = root->u.obj.args;
	nargs = flx_pv_len(args);
	/* v2: storage, offset, size, stride, requires_grad, hooks[, meta];
	 * v3 adds dtype after hooks. */
	base = v3 ? 7 : 6;
	if (nargs != base && nargs != base + 1)
		return tfail(c, "%s takes %zu or %zu arguments, got %zu",
			     fn->u.global.name, base, base + 1, nargs);
	if (nargs == base + 1 && flx_pv_item(args, base)->kind != FLX_PV_DICT)
		return tfail(c, "tensor metadata argument is not a dict");

	if ((rc = parse_persid(c, flx_pv_item(args, 0), t, &sdt, &untyped)))
		return rc;
	if (v3) {
		v = flx_pv_item(args, 6);
		if (!v || v->kind != FLX_PV_GLOBAL ||
		    strcmp(v->u.global.module, "torch") != 0)
			return tfail(c, "dtype argument is not a torch dtype");
		t->dtype = flx_dtype_from_torch(v->u.global.name);
		if (t->dtype == FLX_DT_INVALID)
			return tfail(c, "unsupported dtype torch.%s",
				     v->u.global.name);
	} else {
		/* torch views an UntypedStorage as uint8 here. */
		t->dtype = untyped ? FLX_DT_U8 : sdt;
	}

	v = flx_pv_item(args, 1);
	if (!v || v->kind != FLX_PV_INT || v->u.i < 0)
		return tfail(c, "storage offset is not a non-negative int");
	t->storage_offset = v->u.i;
	if ((rc = int_tuple(c, flx_pv_item(args, 2), "size", t->size,
			    &t->ndim)) ||
	    (rc = int_tuple(c, flx_pv_item(args, 3), "stride", t->stride,
			    &nstride)))
		return rc;
	if (nstride != t->ndim)
		return tfail(c, "size has %d dimensions but stride has %d",
			     t->ndim, nstride);
	v = flx_pv_item(args, 4);
	if (!v || v->kind != FLX_PV_BOOL)
		return tfail(c, "requires_grad is not a bool");
	v = flx_pv_item(args, 5);
	if (!v || v->kind != FLX_PV_DICT)
		return tfail(c, "backward hooks are a %s, not a dict",
			     flx_pv_kind_name(v));
	return check_extent(c, t);
}

int flx_tensor_pkl_parse(const void *buf, size_t len, const char *name,
			 flx_tensor_pkl *out, flx_error *err)
{
	struct tctx c = {.name = name, .err = err};
	flx_tensor_pkl t;
	flx_pickle *p = NULL;
	int rc;

	memset(&t, 0, sizeof(t));
	rc = flx_pickle_load(buf, len, name, &tpkl_limits, &p, err);
	if (rc)
		return rc;
	rc = interpret(&c, flx_pickle_root(p), &t);
	flx_pickle_free(p);
	if (rc)
		return rc;
	*out = t;
	return 0;
}

int flx_tensor_pkl_from_pv(const flx_pv *v, const char *name,
			   flx_tensor_pkl *out, flx_error *err)
{
	struct tctx c = {.name = name, .err = err};
	flx_tensor_pkl t;
	int rc;

	memset(&t, 0, sizeof(t));
	rc = interpret(&c, v, &t);
	if (rc)
		return rc;
	*out = t;
	return 0;
}
