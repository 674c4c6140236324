/* SPDX-License-Identifier: MIT */
#ifndef FLX_FUZZ_PV_SAME_H
#define FLX_FUZZ_PV_SAME_H

/*
 * The pickle fuzz targets' structural comparison of two trees, a from one
 * load and b from another of the same input.  Shared nodes make a tree a
 * DAG, even a cyclic one: the walk is bounded by depth and by budget
 * (past either, what is left counts as equal).  Single-threaded: the
 * state lives in the caller's pv_same_ops.
 */

#include "pickle.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

typedef struct pv_same_ops {
	/* STR and BYTES payloads (same kind): equal or not */
	bool (*payload)(const flx_pv *a, const flx_pv *b, void *ctx);
	/* NULL, or asked first about every pair of the same kind: 1 equal,
	 * 0 not, -1 compare as usual */
	int (*pre)(const flx_pv *a, const flx_pv *b, void *ctx);
	void *ctx;
	size_t budget; /* nodes the walk may still visit */
} pv_same_ops;

static bool pv_same(const flx_pv *a, const flx_pv *b, pv_same_ops *o, int depth)
{
	int pre;

	if (!a || !b)
		return a == b;
	if (depth > FLX_PV_MAX_WALK_DEPTH || o->budget == 0)
		return true;
	o->budget--;
	if (a->kind != b->kind)
		return false;
	if (o->pre && (pre = o->pre(a, b, o->ctx)) >= 0)
		return pre;
	switch (a->kind) {
	case FLX_PV_BOOL:
		return a->u.b == b->u.b;
	case FLX_PV_INT:
		return a->u.i == b->u.i;
	case FLX_PV_FLOAT:
		return memcmp(&a->u.f, &b->u.f, sizeof(a->u.f)) == 0;
	case FLX_PV_STR:
	case FLX_PV_BYTES:
		return o->payload(a, b, o->ctx);
	case FLX_PV_TUPLE:
	case FLX_PV_LIST:
	case FLX_PV_SET:
		if (a->u.seq.n != b->u.seq.n)
			return false;
		for (size_t i = 0; i < a->u.seq.n; i++)
			if (!pv_same(a->u.seq.v[i], b->u.seq.v[i], o,
				     depth + 1))
				return false;
		return true;
	case FLX_PV_DICT:
		if (a->u.dict.n != b->u.dict.n)
			return false;
		for (size_t i = 0; i < 2 * a->u.dict.n; i++)
			if (!pv_same(a->u.dict.kv[i], b->u.dict.kv[i], o,
				     depth + 1))
				return false;
		return true;
	case FLX_PV_GLOBAL:
		return strcmp(a->u.global.module, b->u.global.module) == 0 &&
		       strcmp(a->u.global.name, b->u.global.name) == 0;
	case FLX_PV_OBJ:
		return a->newobj == b->newobj &&
		       pv_same(a->u.obj.cls, b->u.obj.cls, o, depth + 1) &&
		       pv_same(a->u.obj.args, b->u.obj.args, o, depth + 1) &&
		       pv_same(a->u.obj.state, b->u.obj.state, o, depth + 1);
	case FLX_PV_PERSID:
		return pv_same(a->u.persid.pid, b->u.persid.pid, o, depth + 1);
	default: /* NONE, BIGINT */
		return true;
	}
}

#endif
