/* SPDX-License-Identifier: MIT */
/* Fuzz target: the rules file parser and the -o option layer.  The input
 * is split at the first NUL: rules JSON before it, an option string after
 * it (rules= and other file-reading keys are not reachable this way, since
 * the fuzzer must not open arbitrary paths). */
#include "mountopts.h"
#include "spec.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nul = memchr(data, 0, size);
	size_t jlen = nul ? (size_t)(nul - data) : size;
	flx_spec s;
	flx_mountopts mo;
	char *opts;

	if (flx_spec_init(&s) == 0) {
		(void)flx_spec_rules_parse(&s, (const char *)data, jlen, "fuzz",
					   NULL);
		(void)flx_spec_match(&s, "layers.0.attention.wq.weight");
		flx_spec_release(&s);
	}
	if (!nul)
		return 0;
	opts = strndup((const char *)nul + 1, size - jlen - 1);
	if (opts && !strstr(opts, "rules") && flx_mo_init(&mo) == 0) {
		char *fuse = NULL;

		if (flx_mo_options(&mo, opts, NULL) == 0 &&
		    flx_mo_set_source(&mo, "/data/ckpt,x") == 0 &&
		    flx_mo_fuse_optstring(&mo, &fuse) == 0)
			free(fuse);
		flx_mo_release(&mo);
	}
	free(opts);
	return 0;
}
