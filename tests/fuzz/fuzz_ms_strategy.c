/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: MindSpore strategy files (resolver/mindspore/strategy.c),
 * as protobuf (protobuf-c's unpack with the generated node_strategy code,
 * its allocation budget, then the layout checks) and, when the input
 * starts with '{', as JSON.  Every layout
 * of a strategy that parses has its box computed for every local rank
 * (at most 64) on a shape its split factors divide, and each box must lie
 * inside that shape.
 */
#include "strategy.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void boxes(const flx_ms_strategy *s)
{
	for (uint32_t i = 0; i < s->nlayouts; i++) {
		const flx_ms_layout *l = &s->layouts[i];
		uint64_t f[FLX_MS_MAX_DIMS], shape[FLX_MS_MAX_DIMS];
		uint64_t st[FLX_MS_MAX_DIMS], ln[FLX_MS_MAX_DIMS];

		flx_ms_factors(l, f);
		for (uint32_t d = 0; d < l->ndim; d++)
			shape[d] =
			    l->has_shape ? l->shape[d] : 2 * (f[d] ? f[d] : 1);
		for (uint64_t r = 0; r < l->devices && r < 64; r++) {
			if (flx_ms_box(l, shape, r, st, ln))
				continue;
			for (uint32_t d = 0; d < l->ndim; d++)
				if (st[d] > shape[d] ||
				    ln[d] > shape[d] - st[d])
					abort();
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	flx_ms_strategy *s = NULL;
	flx_error err;

	flx_error_init(&err);
	if (flx_ms_strategy_parse(data, size, size > 0 && data[0] == '{',
				  "fuzz", &s, &err) == 0)
		boxes(s);
	flx_ms_strategy_free(s);
	return 0;
}
