/* SPDX-License-Identifier: MIT */
/* Fuzz target: locate records in a torch.save zip item held in memory,
 * then parse its data.pkl as a tensor, as the mount does for every item. */
#include "reader.h"
#include "torchpkl.h"
#include "zipitem.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	flx_reader r;
	flx_mem_reader m;
	flx_zip *z = NULL;
	flx_zip_rec rec;

	flx_reader_mem(&r, &m, data, size);
	if (flx_zip_open(&r, "fuzz", &z, NULL))
		return 0;
	(void)flx_zip_prefix(z);
	(void)flx_zip_find(z, "data/0", &rec);
	if (flx_zip_find(z, "data.pkl", &rec) == 0 && rec.size <= size) {
		unsigned char *buf = malloc(rec.size ? rec.size : 1);
		flx_tensor_pkl t;

		if (buf && flx_read_at(&r, buf, rec.size, rec.data_off) == 0)
			(void)flx_tensor_pkl_parse(buf, rec.size, "fuzz", &t,
						   NULL);
		free(buf);
	}
	flx_zip_close(z);
	return 0;
}
