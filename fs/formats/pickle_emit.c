/* SPDX-License-Identifier: MIT */
/* A protocol 2 pickle writer of decoded values; see pickle_emit.h. */
#include "pickle_emit.h"
#include "pickle_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define EMIT_MAX_NODES (1u << 20)
/* items per MARK ... SETITEMS / APPENDS group, as Python's pickler */
#define EMIT_BATCH 1000

void flx_pkb_raw(flx_pk_buf *b, const void *s, size_t n)
{
	if (b->err)
		return;
	if (b->n + n > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		unsigned char *p;

		while (cap < b->n + n)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p) {
			b->err = -ENOMEM;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
}

static void put_le(flx_pk_buf *b, uint64_t v, int n)
{
	unsigned char x[8];

	for (int i = 0; i < n; i++)
		x[i] = (unsigned char)(v >> (8 * i));
	flx_pkb_raw(b, x, (size_t)n);
}

void flx_pkb_int(flx_pk_buf *b, int64_t v)
{
	unsigned char x[FLX_PK_INT_MAX];

	flx_pkb_raw(b, x, flx_pk_int_enc(v, x));
}

void flx_pkb_str(flx_pk_buf *b, const char *s, size_t n)
{
	flx_pkb_raw(b, "X", 1);
	put_le(b, n, 4);
	flx_pkb_raw(b, s, n);
}

void flx_pkb_float(flx_pk_buf *b, double v)
{
	unsigned char x[9] = {'G'};
	uint64_t u;

	memcpy(&u, &v, 8);
	for (int i = 0; i < 8; i++)
		x[1 + i] = (unsigned char)(u >> (56 - 8 * i));
	flx_pkb_raw(b, x, 9);
}

typedef struct emit {
	flx_pk_buf *b;
	const char *name;
	flx_error *err;
	size_t visited;
} emit;

static int bad(emit *e, const char *what)
{
	return flx_error_set(e->err, -EINVAL, NULL, e->name,
			     "cannot write this value again: %s", what);
}

static int global(emit *e, const char *mod, const char *name)
{
	if (strchr(mod, '\n') || strchr(name, '\n'))
		return bad(e, "a global name with a newline");
	flx_pkb_raw(e->b, "c", 1);
	flx_pkb_raw(e->b, mod, strlen(mod));
	flx_pkb_raw(e->b, "\n", 1);
	flx_pkb_raw(e->b, name, strlen(name));
	flx_pkb_raw(e->b, "\n", 1);
	return 0;
}

static int value(emit *e, const flx_pv *v, int depth, const flx_pk_patch *pt,
		 size_t np);

static int items(emit *e, flx_pv *const *v, size_t n, int depth)
{
	int rc = 0;

	for (size_t i = 0; !rc && i < n; i++)
		rc = value(e, v[i], depth + 1, NULL, 0);
	return rc;
}

/* A list's items after EMPTY_LIST, as Python's pickler batches them:
 * MARK ... APPENDS per batch of several, APPEND after a single one. */
static int appends(emit *e, flx_pv *const *v, size_t n, int depth)
{
	int rc = 0;

	for (size_t i = 0; !rc && i < n; i += EMIT_BATCH) {
		size_t k = n - i < EMIT_BATCH ? n - i : EMIT_BATCH;

		if (k > 1)
			flx_pkb_raw(e->b, "(", 1);
		rc = items(e, v + i, k, depth);
		flx_pkb_raw(e->b, k > 1 ? "e" : "a", 1);
	}
	return rc;
}

static void patch_value(emit *e, const flx_pk_patch *p)
{
	if (p->kind == FLX_PK_INT)
		flx_pkb_int(e->b, p->i);
	else if (p->kind == FLX_PK_STR)
		flx_pkb_str(e->b, p->s, strlen(p->s));
	else if (p->kind == FLX_PK_FALSE)
		flx_pkb_raw(e->b, "\x89", 1);
	else
		flx_pkb_raw(e->b, "N", 1);
}

/* The number of pairs dict v has with the patch's keys added. */
static size_t dict_len(const flx_pv *v, const flx_pk_patch *pt, size_t np)
{
	size_t n = v->u.dict.n;

	for (size_t j = 0; j < np; j++)
		n += !pt[j].if_present && !flx_pv_dict_get(v, pt[j].key);
	return n;
}

/* After pair i of m: MARK before each batch of several, SETITEMS after
 * it, SETITEM after a single pair (Python's pickler). */
static void batch_open(emit *e, size_t i, size_t m)
{
	if (i % EMIT_BATCH == 0 && m - i > 1)
		flx_pkb_raw(e->b, "(", 1);
}

static void batch_close(emit *e, size_t i, size_t m)
{
	size_t start = i - i % EMIT_BATCH;

	if (i + 1 == m || (i + 1) % EMIT_BATCH == 0)
		flx_pkb_raw(e->b, m - start > 1 ? "u" : "s", 1);
}

/* A dict, its values under the patch's keys replaced, missing ones
 * appended. */
static int dict(emit *e, const flx_pv *v, int depth, const flx_pk_patch *pt,
		size_t np)
{
	int rc = 0;
	size_t n = v->u.dict.n, m = dict_len(v, pt, np), at = 0;

	flx_pkb_raw(e->b, "}", 1);
	for (size_t i = 0; !rc && i < n; i++, at++) {
		const flx_pv *k = v->u.dict.kv[2 * i];
		const char *ks = flx_pv_str(k);
		size_t j = np;

		for (j = 0; ks && j < np && strcmp(ks, pt[j].key); j++)
			;
		batch_open(e, at, m);
		rc = value(e, k, depth + 1, NULL, 0);
		if (rc)
			break;
		if (ks && j < np)
			patch_value(e, &pt[j]);
		else
			rc = value(e, v->u.dict.kv[2 * i + 1], depth + 1, NULL,
				   0);
		batch_close(e, at, m);
	}
	for (size_t j = 0; !rc && j < np; j++) {
		if (pt[j].if_present || flx_pv_dict_get(v, pt[j].key))
			continue;
		batch_open(e, at, m);
		flx_pkb_str(e->b, pt[j].key, strlen(pt[j].key));
		patch_value(e, &pt[j]);
		batch_close(e, at++, m);
	}
	return rc;
}

/* bytes, as protocol 2 writes them: _codecs.encode(latin-1 text,
 * 'latin1'), or bytes() when empty. */
static int bytes(emit *e, const flx_pv *v)
{
	const unsigned char *s = (const unsigned char *)v->u.str.s;
	int rc;

	if (!s)
		return bad(e, "bytes not read");
	if (!v->u.str.len) {
		rc = global(e, "__builtin__", "bytes");
		flx_pkb_raw(e->b, ")R", 2);
		return rc;
	}
	rc = global(e, "_codecs", "encode");
	flx_pkb_raw(e->b, "X", 1);
	{
		size_t n = 0;

		for (size_t i = 0; i < v->u.str.len; i++)
			n += s[i] < 0x80 ? 1 : 2;
		put_le(e->b, n, 4);
	}
	for (size_t i = 0; i < v->u.str.len; i++) {
		unsigned char u[2] = {(unsigned char)(0xC0 | s[i] >> 6),
				      (unsigned char)(0x80 | (s[i] & 0x3F))};

		if (s[i] < 0x80)
			flx_pkb_raw(e->b, &s[i], 1);
		else
			flx_pkb_raw(e->b, u, 2);
	}
	flx_pkb_str(e->b, "latin1", 6);
	flx_pkb_raw(e->b, "\x86R", 2);
	return rc;
}

static int value(emit *e, const flx_pv *v, int depth, const flx_pk_patch *pt,
		 size_t np)
{
	int rc = 0;

	if (!v || depth > FLX_PV_MAX_WALK_DEPTH ||
	    ++e->visited > EMIT_MAX_NODES)
		return bad(e, "too deep or too large");
	switch (v->kind) {
	case FLX_PV_NONE:
		flx_pkb_raw(e->b, "N", 1);
		return 0;
	case FLX_PV_BOOL:
		flx_pkb_raw(e->b, v->u.b ? "\x88" : "\x89", 1);
		return 0;
	case FLX_PV_INT:
		flx_pkb_int(e->b, v->u.i);
		return 0;
	case FLX_PV_FLOAT:
		flx_pkb_float(e->b, v->u.f);
		return 0;
	case FLX_PV_STR:
		if (!v->u.str.s)
			return bad(e, "string not read");
		flx_pkb_str(e->b, v->u.str.s, v->u.str.len);
		return 0;
	case FLX_PV_BYTES:
		return bytes(e, v);
	case FLX_PV_TUPLE:
		if (v->u.seq.n > 3 || !v->u.seq.n)
			flx_pkb_raw(e->b, v->u.seq.n ? "(" : ")", 1);
		if (!v->u.seq.n)
			return 0;
		rc = items(e, v->u.seq.v, v->u.seq.n, depth);
		flx_pkb_raw(
		    e->b,
		    v->u.seq.n > 3 ? "t" : &"\x85\x86\x87"[v->u.seq.n - 1], 1);
		return rc;
	case FLX_PV_LIST:
	case FLX_PV_SET:
		if (v->kind == FLX_PV_SET)
			rc = global(e, "__builtin__", "set");
		flx_pkb_raw(e->b, "]", 1);
		if (!rc)
			rc = appends(e, v->u.seq.v, v->u.seq.n, depth);
		if (v->kind == FLX_PV_SET)
			flx_pkb_raw(e->b, "\x85R", 2);
		return rc;
	case FLX_PV_DICT:
		return dict(e, v, depth, pt, np);
	case FLX_PV_GLOBAL:
		return global(e, v->u.global.module, v->u.global.name);
	case FLX_PV_OBJ:
		rc = value(e, v->u.obj.cls, depth + 1, NULL, 0);
		if (!rc)
			rc = value(e, v->u.obj.args, depth + 1, NULL, 0);
		flx_pkb_raw(e->b, v->newobj ? "\x81" : "R", 1);
		if (!rc && v->u.obj.state) {
			if (v->u.obj.state->kind == FLX_PV_DICT)
				rc = dict(e, v->u.obj.state, depth + 1, pt, np);
			else
				rc = value(e, v->u.obj.state, depth + 1, NULL,
					   0);
			flx_pkb_raw(e->b, "b", 1);
		}
		return rc;
	case FLX_PV_BIGINT:
		return bad(e, "an int wider than 64 bits");
	case FLX_PV_PERSID:
		return bad(e, "a persistent id");
	}
	return bad(e, "an unknown kind");
}

int flx_pk_emit(flx_pk_buf *b, const flx_pv *v, const flx_pk_patch *patch,
		size_t npatch, const char *name, flx_error *err)
{
	emit e = {.b = b, .name = name, .err = err};
	int rc = value(&e, v, 0, patch, npatch);

	if (!rc && b->err)
		rc = flx_error_set(err, b->err, NULL, name, "out of memory");
	return rc;
}
