/* SPDX-License-Identifier: MIT */
/* The hf/ shard index; see hf_index.h.  Pieces: the head, the weight
 * map's entries by batches, the tail. */
#include "hf_index.h"

#include "json_internal.h"
#include "layout.h"
#include "names.h"

static flx_jw hfidx_writer(const flx_hf_index *h, unsigned char *dst,
			   uint64_t lo, uint64_t hi)
{
	flx_jw w = flx_jw_window(dst, lo, hi);

	w.indent = 2;
	w.plain_names = h->ctx->plain_names;
	return w;
}

static int hfidx_head(const void *arg, uint32_t idx, unsigned char *dst,
		      uint64_t lo, uint64_t hi, uint64_t *len)
{
	const flx_hf_index *h = arg;
	flx_jw w = hfidx_writer(h, dst, lo, hi);

	(void)idx;
	flx_jw_open(&w, '{');
	flx_jw_key(&w, "metadata");
	flx_jw_open(&w, '{');
	flx_jw_key(&w, "total_size");
	flx_jw_int(&w, (int64_t)h->total);
	flx_jw_close(&w, '}');
	flx_jw_key(&w, "weight_map");
	flx_jw_open(&w, '{');
	return flx_jw_end(&w, len);
}

/* Entries idx.. of the weight map (a batch): name, then its file. */
static int hfidx_entries(const void *arg, uint32_t idx, unsigned char *dst,
			 uint64_t lo, uint64_t hi, uint64_t *len)
{
	const flx_hf_index *h = arg;
	flx_jw w = hfidx_writer(h, dst, lo, hi);

	flx_jw_resume(&w, 2, idx > 0);
	for (size_t i = idx; i < h->n && i < idx + FLX_GEN_BATCH; i++) {
		char name[FLX_NAME_MAX + 1];
		int rc = h->layout->shard_file(h->e[i].shard, h->nshards, name);

		if (rc)
			return rc;
		flx_jw_key_name(&w, h->e[i].name);
		flx_jw_str(&w, name);
	}
	return flx_jw_end(&w, len);
}

static int hfidx_tail(const void *arg, uint32_t idx, unsigned char *dst,
		      uint64_t lo, uint64_t hi, uint64_t *len)
{
	const flx_hf_index *h = arg;
	flx_jw w = hfidx_writer(h, dst, lo, hi);

	(void)idx;
	flx_jw_resume(&w, 2, h->n > 0);
	flx_jw_close(&w, '}');
	flx_jw_close(&w, '}');
	return flx_jw_end(&w, len);
}

static const flx_gen_ops hfidx_head_ops = {"hf index head", hfidx_head};
static const flx_gen_ops hfidx_entries_ops = {"hf index entries",
					      hfidx_entries};
static const flx_gen_ops hfidx_tail_ops = {"hf index tail", hfidx_tail};

int flx_hf_index_add_file(flx_fs *fs, int dir, const char *name,
			  const flx_hf_index *h)
{
	int file, rc = flx_fs_mkfile(fs, dir, name, &file);

	if (!rc)
		rc = flx_fs_add_gen(fs, file, &hfidx_head_ops, h, 0);
	for (size_t k = 0; !rc && k < h->n; k += FLX_GEN_BATCH)
		rc = flx_fs_add_gen(fs, file, &hfidx_entries_ops, h,
				    (uint32_t)k);
	if (!rc)
		rc = flx_fs_add_gen(fs, file, &hfidx_tail_ops, h, 0);
	return rc;
}
