/* SPDX-License-Identifier: MIT */
/* Fuzz target: one zstd-transformed DCP item held in memory, as the mount
 * reads it: the frame header check, the bounded streaming decode (head and
 * tail kept, content capped at 4 MiB), then the zip records and the tensor
 * data.pkl read through the decoded item's reader. */
#include "reader.h"
#include "torchpkl.h"
#include "zipitem.h"
#include "zstditem.h"

#include <stdint.h>
#include <stdlib.h>

#define MAX_OUT (4u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	flx_reader src, r;
	flx_mem_reader m;
	flx_zstd_item zi = {0};
	flx_zstd_reader zr;
	flx_zstd_frame fr;
	flx_zip *z = NULL;
	flx_zip_rec rec;

	(void)flx_zstd_frame_check(data, size, MAX_OUT, "fuzz", "k", &fr, NULL);
	flx_reader_mem(&src, &m, data, size);
	if (flx_zstd_item_load(&zi, &src, MAX_OUT, "fuzz", "k", &r, &zr, NULL))
		goto out;
	if (r.size > MAX_OUT || zi.hlen > r.size || zi.tlen > r.size)
		abort(); /* the bound and the windows must hold */
	if (flx_zip_open(&r, "fuzz", &z, NULL))
		goto out;
	if (flx_zip_find(z, "data.pkl", &rec) == 0 && rec.size <= (1u << 20)) {
		unsigned char *buf = malloc(rec.size ? rec.size : 1);
		flx_tensor_pkl t;

		if (buf && flx_read_at(&r, buf, rec.size, rec.data_off) == 0)
			(void)flx_tensor_pkl_parse(buf, rec.size, "fuzz", &t,
						   NULL);
		free(buf);
	}
	flx_zip_close(z);
out:
	flx_zstd_item_release(&zi);
	return 0;
}
