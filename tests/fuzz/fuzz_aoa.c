/* SPDX-License-Identifier: MIT */
/* Fuzz target: the AOA statement parser and compiler (reshard/paddle/aoa.h).
 * The input is the statements' text (newlines separate statements); what parses
 * is compiled against tests/fixtures/hf-tiny/single when that is found from the
 * working directory (the source root under ctest), and applied by the transform
 * stage.  The TP degree is the first byte's low bits (1..8). */
#include "aoa.h"
#include "ckpt.h"
#include "transform.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static flx_ckpt *fixture(void)
{
	static flx_ckpt *c;
	static int tried;

	if (!tried) {
		tried = 1;
		if (flx_ckpt_open("tests/fixtures/hf-tiny/single", &c, NULL))
			c = NULL;
	}
	return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = strndup((const char *)data, size);
	const char *v[1] = {text};
	flx_ckpt *c = fixture();
	flx_aoa *a = NULL;
	flx_aoa_prog *p = NULL;
	flx_xindex *xi = NULL;
	int tp = size ? (data[0] & 7) + 1 : 1;

	if (!text)
		return 0;
	if (flx_aoa_parse(v, 1, "fuzz", &a, NULL) == 0 && c &&
	    flx_aoa_compile(a, c, &(flx_aoa_opts){.tp = tp}, &p, NULL) == 0 &&
	    flx_xform_apply(flx_aoa_prog_xform(p), c, &xi, NULL) == 0)
		(void)flx_ckpt_find(flx_xindex_ckpt(xi), "lm_head.weight");
	flx_xindex_free(xi);
	flx_aoa_prog_free(p);
	flx_aoa_free(a);
	free(text);
	return 0;
}
