/* SPDX-License-Identifier: MIT */
/* Fuzz target: a sink load (flx_pickle_load_sink(), the dict under
 * "storage_data" and the lists under "chunks", as the DCP loader streams
 * them, and the lists that are values of the dict under
 * "state_dict_metadata", as the Paddle loader streams its LTM lists) either
 * fails with -EAGAIN (decode again without a sink) or does what a plain reader
 * load does: the same error message, or the same tree, where the streamed dict
 * and lists held, in order, exactly what the sink was handed (compared by a
 * structural hash taken during the call, since the sink's values are reused
 * after it).  The window follows from the input's length, as in pickle_window.
 */
#include "pickle.h"
#include "reader.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_TAKEN 65536

/* what the sink was handed: per value, its container and hash */
static struct taken {
	const flx_pv *in;
	uint64_t h;
} taken[MAX_TAKEN];
static size_t ntaken;
/* pairs() cannot name the sink dict (the VM says which it is after the
 * load, flx_pickle_sink_dict()): its values are filed under this, then
 * under the dict */
static const flx_pv placeholder;

static uint64_t mixh(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	return h * 0xff51afd7ed558ccdull;
}

/* Structural hash: equal values hash equal (the walk is bounded, so a
 * shared DAG costs at most the budget).  Lists below the top are hashed
 * by kind only. */
static uint64_t hv(const flx_pv *v, int depth, size_t *budget)
{
	uint64_t h;

	if (!v)
		return 1;
	if (depth > FLX_PV_MAX_WALK_DEPTH || *budget == 0)
		return 2;
	(*budget)--;
	h = mixh(3, (uint64_t)v->kind);
	switch (v->kind) {
	case FLX_PV_BOOL:
		return mixh(h, v->u.b);
	case FLX_PV_INT:
		return mixh(h, (uint64_t)v->u.i);
	case FLX_PV_FLOAT: {
		uint64_t bits;

		memcpy(&bits, &v->u.f, sizeof(bits));
		return mixh(h, bits);
	}
	case FLX_PV_STR:
	case FLX_PV_BYTES:
		h = mixh(h, v->u.str.len);
		for (size_t i = 0; v->u.str.s && i < v->u.str.len; i++)
			h = mixh(h, (unsigned char)v->u.str.s[i]);
		return h;
	case FLX_PV_LIST:
		/* a list inside a value may be one the sink load streamed
		 * (empty there, full in the plain load): not looked into */
		if (depth > 0)
			return h;
		/* fall through */
	case FLX_PV_TUPLE:
	case FLX_PV_SET:
		for (size_t i = 0; i < v->u.seq.n; i++)
			h = mixh(h, hv(v->u.seq.v[i], depth + 1, budget));
		return h;
	case FLX_PV_DICT:
		for (size_t i = 0; i < 2 * v->u.dict.n; i++)
			h = mixh(h, hv(v->u.dict.kv[i], depth + 1, budget));
		return h;
	case FLX_PV_GLOBAL:
		for (const char *s = v->u.global.module; *s; s++)
			h = mixh(h, (unsigned char)*s);
		for (const char *s = v->u.global.name; *s; s++)
			h = mixh(h, (unsigned char)*s);
		return h;
	case FLX_PV_OBJ:
		h = mixh(h, v->newobj);
		h = mixh(h, hv(v->u.obj.cls, depth + 1, budget));
		h = mixh(h, hv(v->u.obj.args, depth + 1, budget));
		return mixh(h, hv(v->u.obj.state, depth + 1, budget));
	case FLX_PV_PERSID:
		return mixh(h, hv(v->u.persid.pid, depth + 1, budget));
	default:
		return h;
	}
}

static int take(const flx_pv *in, flx_pv *const *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		size_t budget = 4096;

		if (ntaken == MAX_TAKEN)
			return -EAGAIN;
		taken[ntaken].in = in;
		taken[ntaken++].h = hv(v[i], 0, &budget);
	}
	return 0;
}

static int pairs(void *ctx, flx_pv *const *kv, size_t npairs)
{
	(void)ctx;
	return take(&placeholder, kv, 2 * npairs);
}

static int items(void *ctx, const flx_pv *list, flx_pv *const *v, size_t n)
{
	(void)ctx;
	if (!flx_pv_streamed(list))
		abort();
	return take(list, v, n);
}

static size_t walk_budget;

/* a: the plain load's value, b: the sink load's; in: b is a container
 * the sink took values of: a's items are those, in order, and b holds
 * none (a container that also got values otherwise is not compared). */
static bool same(const flx_pv *a, const flx_pv *b, const flx_pv *sunk,
		 int depth)
{
	if (!a || !b)
		return a == b;
	if (depth > FLX_PV_MAX_WALK_DEPTH || walk_budget == 0)
		return true;
	walk_budget--;
	if (a->kind != b->kind)
		return false;
	if ((b == sunk || flx_pv_streamed(b)) && flx_pv_len(b) == 0) {
		flx_pv *const *av =
		    a->kind == FLX_PV_DICT ? a->u.dict.kv : a->u.seq.v;
		size_t an =
		    a->kind == FLX_PV_DICT ? 2 * a->u.dict.n : a->u.seq.n;
		size_t j = 0;

		for (size_t i = 0; i < ntaken; i++) {
			size_t budget = 4096;

			if (taken[i].in != b)
				continue;
			if (j == an || hv(av[j++], 0, &budget) != taken[i].h)
				return false;
		}
		return j == an;
	}
	if (b == sunk || flx_pv_streamed(b))
		return true;
	switch (a->kind) {
	case FLX_PV_BOOL:
		return a->u.b == b->u.b;
	case FLX_PV_INT:
		return a->u.i == b->u.i;
	case FLX_PV_FLOAT:
		return memcmp(&a->u.f, &b->u.f, sizeof(a->u.f)) == 0;
	case FLX_PV_STR:
	case FLX_PV_BYTES:
		return a->u.str.len == b->u.str.len &&
		       a->u.str.off == b->u.str.off &&
		       (!a->u.str.s || !b->u.str.s
			    ? a->u.str.s == b->u.str.s
			    : memcmp(a->u.str.s, b->u.str.s, a->u.str.len) ==
				  0);
	case FLX_PV_TUPLE:
	case FLX_PV_LIST:
	case FLX_PV_SET:
		if (a->u.seq.n != b->u.seq.n)
			return false;
		for (size_t i = 0; i < a->u.seq.n; i++)
			if (!same(a->u.seq.v[i], b->u.seq.v[i], sunk,
				  depth + 1))
				return false;
		return true;
	case FLX_PV_DICT:
		if (a->u.dict.n != b->u.dict.n)
			return false;
		for (size_t i = 0; i < 2 * a->u.dict.n; i++)
			if (!same(a->u.dict.kv[i], b->u.dict.kv[i], sunk,
				  depth + 1))
				return false;
		return true;
	case FLX_PV_GLOBAL:
		return strcmp(a->u.global.module, b->u.global.module) == 0 &&
		       strcmp(a->u.global.name, b->u.global.name) == 0;
	case FLX_PV_OBJ:
		return a->newobj == b->newobj &&
		       same(a->u.obj.cls, b->u.obj.cls, sunk, depth + 1) &&
		       same(a->u.obj.args, b->u.obj.args, sunk, depth + 1) &&
		       same(a->u.obj.state, b->u.obj.state, sunk, depth + 1);
	case FLX_PV_PERSID:
		return same(a->u.persid.pid, b->u.persid.pid, sunk, depth + 1);
	default: /* NONE, BIGINT */
		return true;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const flx_pickle_limits lim = {
	    .window = 1 + size % 61,
	    .max_copy = SIZE_MAX,
	    .max_str = SIZE_MAX,
	};
	const flx_pickle_sink sink = {.key = "storage_data",
				      .pairs = pairs,
				      .list_key = "chunks",
				      .items = items,
				      .list_parent = "state_dict_metadata"};
	flx_pickle *a = NULL, *b = NULL;
	flx_mem_reader m;
	flx_reader r;
	flx_error ea, eb;
	int ra, rb;

	flx_error_init(&ea);
	flx_error_init(&eb);
	ntaken = 0;
	flx_reader_mem(&r, &m, data, size);
	ra = flx_pickle_load_reader(&r, "fuzz", &lim, &a, &ea);
	flx_reader_mem(&r, &m, data, size);
	rb = flx_pickle_load_sink(&r, "fuzz", &lim, &sink, &b, &eb);
	if (rb != -EAGAIN) {
		const flx_pv *sd = flx_pickle_sink_dict(b);

		for (size_t i = 0; sd && i < ntaken; i++)
			if (taken[i].in == &placeholder)
				taken[i].in = sd;
		walk_budget = 1u << 16;
		if (ra != rb || strcmp(ea.text, eb.text) != 0 ||
		    (!ra &&
		     !same(flx_pickle_root(a), flx_pickle_root(b), sd, 0)))
			abort();
	}
	flx_pickle_free(a);
	flx_pickle_free(b);
	return 0;
}
