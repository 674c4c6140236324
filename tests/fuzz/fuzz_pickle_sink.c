/* SPDX-License-Identifier: MIT */
/* Fuzz target: a sink load (flx_pickle_load_sink(), the dict under
 * "storage_data" and the lists under "chunks", as the DCP loader streams
 * them, and the lists that are values of the dict under
 * "state_dict_metadata", as the Paddle loader streams its LTM lists, with
 * the value under "all_local_plans" dropped, as the DCP loader drops it)
 * either fails with -EAGAIN (decode again without a sink) or does what a
 * plain reader load does: the same error message, or the same tree, where
 * the streamed dict and lists held, in order, exactly what the sink was
 * handed (compared by a structural hash taken during the call, since the
 * sink's values are reused after it), and where a dict may lack a pair under
 * "all_local_plans" whose value is a list or dict.  The window follows from
 * the input's length, as in pickle_window.
 */
#include "pickle.h"
#include "pv_same.h"
#include "reader.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_TAKEN 65536
#define DROP_KEY  "all_local_plans"

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

/* the walk's state, for same_dict() */
static pv_same_ops *walk;

static bool is_drop_key(const flx_pv *k)
{
	return k->kind == FLX_PV_STR && k->u.str.s &&
	       k->u.str.len == strlen(DROP_KEY) &&
	       memcmp(k->u.str.s, DROP_KEY, k->u.str.len) == 0;
}

/* Dicts a (plain load) and b (sink load) where b lacks one pair of a, a
 * list or dict under DROP_KEY: the other pairs equal, in order; -1 for
 * dicts of the same length. */
static int same_dict(const flx_pv *a, const flx_pv *b)
{
	size_t j = 0;
	bool skipped = false;

	if (a->u.dict.n != b->u.dict.n + 1)
		return -1;
	for (size_t i = 0; i < a->u.dict.n; i++) {
		const flx_pv *k = a->u.dict.kv[2 * i];
		const flx_pv *v = a->u.dict.kv[2 * i + 1];

		if (!skipped && is_drop_key(k) &&
		    (v->kind == FLX_PV_LIST || v->kind == FLX_PV_DICT) &&
		    (j == b->u.dict.n || !is_drop_key(b->u.dict.kv[2 * j]))) {
			skipped = true;
			continue;
		}
		if (j == b->u.dict.n ||
		    !pv_same(k, b->u.dict.kv[2 * j], walk, 1) ||
		    !pv_same(v, b->u.dict.kv[2 * j + 1], walk, 1))
			return 0;
		j++;
	}
	return skipped && j == b->u.dict.n;
}

/* b: a container the sink took values of (the sink dict sunk, or a
 * streamed list): a's items are those, in order, and b holds none (a
 * container that also got values otherwise is not compared); -1 for
 * any other b. */
static int same_sunk(const flx_pv *a, const flx_pv *b, void *ctx)
{
	const flx_pv *sunk = ctx;
	flx_pv *const *av;
	size_t an, j = 0;

	if (b != sunk && a->kind == FLX_PV_DICT)
		return same_dict(a, b);
	if (b != sunk && !flx_pv_streamed(b))
		return -1;
	if (flx_pv_len(b) != 0)
		return 1;
	av = a->kind == FLX_PV_DICT ? a->u.dict.kv : a->u.seq.v;
	an = a->kind == FLX_PV_DICT ? 2 * a->u.dict.n : a->u.seq.n;
	for (size_t i = 0; i < ntaken; i++) {
		size_t budget = 4096;

		if (taken[i].in != b)
			continue;
		if (j == an || hv(av[j++], 0, &budget) != taken[i].h)
			return 0;
	}
	return j == an;
}

/* a from the plain load, b from the sink load, both copying every
 * payload */
static bool same_payload(const flx_pv *a, const flx_pv *b, void *ctx)
{
	(void)ctx;
	return a->u.str.len == b->u.str.len && a->u.str.off == b->u.str.off &&
	       (!a->u.str.s || !b->u.str.s
		    ? a->u.str.s == b->u.str.s
		    : memcmp(a->u.str.s, b->u.str.s, a->u.str.len) == 0);
}

/* The watched dict's pairs: walked (they must be valid while the tree
 * is), and a batch of 7 declined, so that a decline from watch() is met
 * too.  That they stay in the tree, the comparison with the plain load
 * checks. */
static int watch(void *ctx, flx_pv *const *kv, size_t npairs)
{
	size_t budget = 4096;

	(void)ctx;
	for (size_t i = 0; i < 2 * npairs; i++)
		(void)hv(kv[i], 0, &budget);
	return npairs == 7 ? -EAGAIN : 0;
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
				      .list_parent = "state_dict_metadata",
				      .watch_key = "state_dict_metadata",
				      .watch = watch,
				      .drop_key = DROP_KEY};
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
		pv_same_ops ops = {.payload = same_payload,
				   .pre = same_sunk,
				   .ctx = (void *)sd,
				   .budget = 1u << 16};

		walk = &ops;
		if (ra != rb || strcmp(ea.text, eb.text) != 0 ||
		    (!ra &&
		     !pv_same(flx_pickle_root(a), flx_pickle_root(b), &ops, 0)))
			abort();
	}
	flx_pickle_free(a);
	flx_pickle_free(b);
	return 0;
}
