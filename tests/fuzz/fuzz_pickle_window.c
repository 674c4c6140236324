/* SPDX-License-Identifier: MIT */
/* Fuzz target: the pickle VM reading through a small window of a reader
 * must do what it does over the whole buffer: the same error message, or
 * the same tree with the same payload offsets (a payload left in the
 * input holds the buffer's bytes there).  The window (1 to 61 bytes) and
 * whether bytes payloads are copied follow from the input's length, so
 * any pickle is a seed (bytes after STOP change them). */
#include "pickle.h"
#include "pv_same.h"
#include "reader.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The bytes of a load: a payload left in the input is read there. */
struct src {
	const uint8_t *p;
	size_t n;
};

/* a from the buffer load (every payload copied), b from the reader load */
static bool same_payload(const flx_pv *a, const flx_pv *b, void *ctx)
{
	const struct src *src = ctx;
	const char *bs = b->u.str.s;

	if (a->u.str.len != b->u.str.len || a->u.str.off != b->u.str.off)
		return false;
	if (!bs) {
		if (b->u.str.off > src->n ||
		    b->u.str.len > src->n - b->u.str.off)
			return false;
		bs = (const char *)src->p + b->u.str.off;
	}
	return memcmp(a->u.str.s, bs, a->u.str.len) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	flx_pickle_limits lim = {
	    .window = 1 + size % 61,
	    .max_copy = (size & 64) ? 1 : SIZE_MAX,
	    .max_str = SIZE_MAX,
	};
	struct src src = {data, size};
	pv_same_ops ops = {
	    .payload = same_payload, .ctx = &src, .budget = 1u << 16};
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
	if (ra != rb || strcmp(ea.text, eb.text) != 0 ||
	    (!ra && !pv_same(flx_pickle_root(a), flx_pickle_root(b), &ops, 0)))
		abort();
	flx_pickle_free(a);
	flx_pickle_free(b);
	return 0;
}
