/* SPDX-License-Identifier: MIT */
/* Fuzz target: a whole torch.save file (zip or legacy) held in memory,
 * opened as the torch-save source does, then every tensor node of the
 * root dict resolved. */
#include "reader.h"
#include "torchfile.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	flx_reader r;
	flx_mem_reader m;
	flx_torchfile *f = NULL;
	const flx_pv *root;

	flx_reader_mem(&r, &m, data, size);
	if (flx_torchfile_open(&r, "fuzz", &f, NULL))
		return 0;
	root = flx_torchfile_root(f);
	for (size_t i = 0; i < flx_pv_len(root) && root->kind == FLX_PV_DICT;
	     i++) {
		flx_torchfile_tensor t;
		const flx_pv *v = root->u.dict.kv[2 * i + 1];

		if (flx_torchfile_is_tensor(v) &&
		    flx_torchfile_resolve(f, v, "k", &t, NULL) == 0 &&
		    (t.data_off > size ||
		     flx_torchfile_storage(f, t.storage)->bytes >
			 size - t.data_off))
			abort(); /* a storage outside the file */
	}
	for (uint32_t i = 0; i < flx_torchfile_nstorages(f); i++)
		(void)flx_torchfile_storage(f, i);
	flx_torchfile_close(f);
	return 0;
}
