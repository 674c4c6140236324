/* SPDX-License-Identifier: MIT */
/* Fuzz target: the pickle VM reading through a small window of a reader
 * must do what it does over the whole buffer: the same error message, or
 * the same tree with the same payload offsets (a payload left in the
 * input holds the buffer's bytes there).  The window (1 to 61 bytes) and
 * whether bytes payloads are copied follow from the input's length, so
 * any pickle is a seed (bytes after STOP change them). */
#include "pickle.h"
#include "reader.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* shared nodes make the tree a DAG, even cyclic: the walk has a budget */
static size_t budget;

static bool same_payload(const flx_pv *a, const flx_pv *b, const uint8_t *src,
			 size_t n)
{
	const char *bs = b->u.str.s;

	if (a->u.str.len != b->u.str.len || a->u.str.off != b->u.str.off)
		return false;
	if (!bs) {
		if (b->u.str.off > n || b->u.str.len > n - b->u.str.off)
			return false;
		bs = (const char *)src + b->u.str.off;
	}
	return memcmp(a->u.str.s, bs, a->u.str.len) == 0;
}

/* a from the buffer load (every payload copied), b from the reader load */
static bool same(const flx_pv *a, const flx_pv *b, const uint8_t *src, size_t n,
		 int depth)
{
	if (!a || !b)
		return a == b;
	if (depth > FLX_PV_MAX_WALK_DEPTH || budget == 0)
		return true;
	budget--;
	if (a->kind != b->kind)
		return false;
	switch (a->kind) {
	case FLX_PV_BOOL:
		return a->u.b == b->u.b;
	case FLX_PV_INT:
		return a->u.i == b->u.i;
	case FLX_PV_FLOAT:
		return memcmp(&a->u.f, &b->u.f, sizeof(a->u.f)) == 0;
	case FLX_PV_STR:
	case FLX_PV_BYTES:
		return same_payload(a, b, src, n);
	case FLX_PV_TUPLE:
	case FLX_PV_LIST:
	case FLX_PV_SET:
		if (a->u.seq.n != b->u.seq.n)
			return false;
		for (size_t i = 0; i < a->u.seq.n; i++)
			if (!same(a->u.seq.v[i], b->u.seq.v[i], src, n,
				  depth + 1))
				return false;
		return true;
	case FLX_PV_DICT:
		if (a->u.dict.n != b->u.dict.n)
			return false;
		for (size_t i = 0; i < 2 * a->u.dict.n; i++)
			if (!same(a->u.dict.kv[i], b->u.dict.kv[i], src, n,
				  depth + 1))
				return false;
		return true;
	case FLX_PV_GLOBAL:
		return strcmp(a->u.global.module, b->u.global.module) == 0 &&
		       strcmp(a->u.global.name, b->u.global.name) == 0;
	case FLX_PV_OBJ:
		return a->newobj == b->newobj &&
		       same(a->u.obj.cls, b->u.obj.cls, src, n, depth + 1) &&
		       same(a->u.obj.args, b->u.obj.args, src, n, depth + 1) &&
		       same(a->u.obj.state, b->u.obj.state, src, n, depth + 1);
	case FLX_PV_PERSID:
		return same(a->u.persid.pid, b->u.persid.pid, src, n,
			    depth + 1);
	default: /* NONE, BIGINT */
		return true;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	flx_pickle_limits lim = {
	    .window = 1 + size % 61,
	    .max_copy = (size & 64) ? 1 : SIZE_MAX,
	    .max_str = SIZE_MAX,
	};
	flx_pickle *a = NULL, *b = NULL;
	flx_mem_reader m;
	flx_reader r;
	flx_error ea, eb;
	int ra, rb;

	flx_error_init(&ea);
	flx_error_init(&eb);
	ra = flx_pickle_load(data, size, "fuzz", NULL, &a, &ea);
	flx_reader_mem(&r, &m, data, size);
	rb = flx_pickle_load_reader(&r, "fuzz", &lim, &b, &eb);
	budget = 1u << 16;
	if (ra != rb || strcmp(ea.text, eb.text) != 0 ||
	    (!ra &&
	     !same(flx_pickle_root(a), flx_pickle_root(b), data, size, 0)))
		abort();
	flx_pickle_free(a);
	flx_pickle_free(b);
	return 0;
}
