/* SPDX-License-Identifier: MIT */
/*
 * The Paddle Flex Checkpoint source: every tests/fixtures/paddle-* fixture
 * (every unique id of paddle-multi-id, each PaddleFormers part and the
 * checkpoint-N/ directory whole) opens as "paddle-dcp", and what the index
 * says beyond the bytes (which paddle.bats checks) agrees with the
 * generator's manifest (truth/manifest.json, an independent record): the
 * tensors and their dtypes and shapes, flx_ckpt.paddle's id and its name
 * table (sorted by key, one static name per key, each the one the key's
 * .distcp files carry), and the saved split axis (flx_tensor.saved_split:
 * the one axis the shards' blocks differ along).  The tensors of
 * paddle-flex-pieces (arrays saved in pieces) are also read whole through
 * a view and compared with the truth's .npy files.  Runs with tests/ as
 * the working directory.
 */
#include "check.h"
#include "ckpt.h"
#include "paddle/paddle.h"
#include "view.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The manifest's axis the blocks of e's primary shards differ along, -1
 * when none, -2 when several. */
static int block_axis(const json_t *e)
{
	const json_t *shards = json_object_get(e, "shards"), *s0 = NULL;
	int axis = -1;
	size_t i;
	json_t *s;

	json_array_foreach(shards, i, s)
	{
		const json_t *r = json_object_get(s, "replica_id");

		if (json_integer_value(r) > 0)
			continue;
		if (!s0) {
			s0 = s;
			continue;
		}
		for (size_t d = 0;
		     d < json_array_size(json_object_get(s, "global_offset"));
		     d++) {
			json_int_t a = json_integer_value(json_array_get(
			    json_object_get(s, "global_offset"), d));
			json_int_t b = json_integer_value(json_array_get(
			    json_object_get(s0, "global_offset"), d));

			if (a == b || axis == (int)d)
				continue;
			axis = axis < 0 ? (int)d : -2;
		}
	}
	return axis;
}

/* Chunks (after the first of a tensor) that share their strides array
 * with the chunk before (check_ckpt()). */
static size_t nshared;

/* Every tensor of checkpoint entry ck of the manifest is in c as the
 * manifest says; the name table has exactly those keys.  Counts the
 * chunks that share their strides array with the chunk before
 * (nshared). */
static void check_ckpt(const flx_ckpt *c, const json_t *ck, size_t *seen)
{
	const json_t *tensors = json_object_get(ck, "tensors");
	const char *key;
	json_t *e;

	json_object_foreach((json_t *)tensors, key, e)
	{
		const flx_tensor *t = flx_ckpt_find(c, key);
		const json_t *shape = json_object_get(e, "shape");
		const char *want =
		    json_string_value(json_object_get(e, "static_name"));
		const flx_name_pair *p = NULL;
		int axis = block_axis(e);

		CHECK(t != NULL);
		if (!t)
			continue;
		(*seen)++;
		CHECK_STR(
		    flx_dtype_name(t->dtype),
		    json_string_value(json_object_get(e, "paddle_dtype")));
		CHECK_EQ(t->ndim, json_array_size(shape));
		for (int d = 0; d < t->ndim; d++)
			CHECK_EQ(t->shape[d],
				 json_integer_value(json_array_get(shape, d)));
		for (uint32_t i = 1; t->ndim > 0 && i < t->nchunks; i++)
			nshared +=
			    t->chunks[i].stride == t->chunks[i - 1].stride;
		/* placement's word: the blocks' axis (several: inferred) */
		CHECK_EQ(t->saved_split, axis == -2 ? 0
					 : axis < 0 ? -1
						    : axis + 1);
		for (size_t i = 0; i < flx_paddle_of(c)->nnames; i++)
			if (!strcmp(flx_paddle_of(c)->names[i].key, key))
				p = &flx_paddle_of(c)->names[i];
		CHECK(p != NULL);
		if (p && want)
			CHECK_STR(p->name, want);
	}
}

static void check_fixture(const char *fx, const char *dir, const char *opt_id,
			  const char *const *parts)
{
	char path[512];
	json_error_t je;
	json_t *man;
	flx_ckpt *c = NULL;
	flx_error err;
	flx_opt_vals vals = {0};
	flx_ckpt_opts o = {0};
	int64_t id;
	size_t seen = 0, want = 0, i;
	json_t *ck;

	snprintf(path, sizeof(path), "fixtures/%s/truth/manifest.json", fx);
	man = json_load_file(path, 0, &je);
	CHECK(man != NULL);
	if (!man)
		return;
	id = json_integer_value(json_object_get(man, "default_id"));
	if (opt_id) {
		CHECK_EQ(flx_ckpt_opt_set(&vals, "paddle_id", opt_id, NULL), 0);
		o.vals = &vals;
		id = atoll(opt_id);
	}
	snprintf(path, sizeof(path), "fixtures/%s/%s", fx, dir);
	flx_error_init(&err);
	CHECK_EQ(flx_ckpt_open_with(path, &o, &c, &err), 0);
	if (!c) {
		fprintf(stderr, "%s: %s %s %s\n", path, err.file, err.key,
			err.text);
		json_decref(man);
		flx_opt_vals_release(&vals);
		return;
	}
	CHECK_STR(c->format, "paddle-dcp");
	CHECK(flx_paddle_of(c) != NULL);
	CHECK_EQ(flx_paddle_of(c)->unique_id, id);
	for (i = 1; i < flx_paddle_of(c)->nnames; i++)
		CHECK(strcmp(flx_paddle_of(c)->names[i - 1].key,
			     flx_paddle_of(c)->names[i].key) < 0);
	for (i = 0; i < flx_paddle_of(c)->nnames; i++)
		CHECK(flx_ckpt_find(c, flx_paddle_of(c)->names[i].key) != NULL);
	json_array_foreach(json_object_get(man, "checkpoints"), i, ck)
	{
		const char *part =
		    json_string_value(json_object_get(ck, "part"));
		bool take =
		    json_integer_value(json_object_get(ck, "unique_id")) == id;

		if (parts) {
			bool in = false;

			for (size_t k = 0; parts[k]; k++)
				in |= part && !strcmp(part, parts[k]);
			take &= in;
		}
		if (!take)
			continue;
		want += json_object_size(json_object_get(ck, "tensors"));
		check_ckpt(c, ck, &seen);
	}
	CHECK(want > 0);
	CHECK_EQ(seen, want);
	CHECK_EQ(c->ntensors, want);
	CHECK_EQ(flx_paddle_of(c)->nnames, want);
	flx_ckpt_close(c);
	flx_opt_vals_release(&vals);
	json_decref(man);
}

/* The data of a .npy file (version 1-3 header, little-endian, C order as
 * gen_paddle.py writes it): malloc'd into *out, *n bytes, or NULL. */
static char *npy_data(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	unsigned char h[12];
	size_t hl, at, len;
	char *buf = NULL;
	long end;

	if (!f)
		return NULL;
	if (fread(h, 1, sizeof(h), f) != sizeof(h) || memcmp(h, "\x93NUMPY", 6))
		goto out;
	hl = h[6] == 1 ? (size_t)h[8] | (size_t)h[9] << 8
		       : (size_t)h[8] | (size_t)h[9] << 8 |
			     (size_t)h[10] << 16 | (size_t)h[11] << 24;
	at = (h[6] == 1 ? 10 : 12) + hl;
	if (fseek(f, 0, SEEK_END) || (end = ftell(f)) < (long)at)
		goto out;
	len = (size_t)end - at;
	buf = malloc(len + 1);
	if (!buf || fseek(f, (long)at, SEEK_SET) ||
	    fread(buf, 1, len, f) != len) {
		free(buf);
		buf = NULL;
		goto out;
	}
	*n = len;
out:
	fclose(f);
	return buf;
}

/* Every tensor of fixture fx's id (in dir) reads back, whole, as its truth
 * .npy: the index's chunks of arrays saved in pieces put each slice's
 * bytes where numpy's concatenation puts them. */
static void check_bytes(const char *fx, const char *dir, int64_t id)
{
	char path[1024];
	json_error_t je;
	json_t *man, *ck;
	flx_ckpt *c = NULL;
	flx_error err;
	flx_opt_vals vals = {0};
	flx_ckpt_opts o = {.vals = &vals};
	size_t i, nread = 0;
	char idtext[24];

	snprintf(idtext, sizeof(idtext), "%lld", (long long)id);
	CHECK_EQ(flx_ckpt_opt_set(&vals, "paddle_id", idtext, NULL), 0);
	snprintf(path, sizeof(path), "fixtures/%s/truth/manifest.json", fx);
	man = json_load_file(path, 0, &je);
	snprintf(path, sizeof(path), "fixtures/%s/%s", fx, dir);
	flx_error_init(&err);
	CHECK(man != NULL);
	CHECK_EQ(flx_ckpt_open_with(path, &o, &c, &err), 0);
	if (!man || !c) {
		json_decref(man);
		flx_opt_vals_release(&vals);
		return;
	}
	json_array_foreach(json_object_get(man, "checkpoints"), i, ck)
	{
		const char *key,
		    *tdir = json_string_value(json_object_get(ck, "truth"));
		json_t *e;

		if (json_integer_value(json_object_get(ck, "unique_id")) != id)
			continue;
		json_object_foreach(json_object_get(ck, "tensors"), key, e)
		{
			const flx_tensor *t = flx_ckpt_find(c, key);
			flx_view *v = NULL;
			flx_box box = {0};
			size_t n = 0;
			char *truth, *buf;

			snprintf(path, sizeof(path), "fixtures/%s/%s/%s", fx,
				 tdir,
				 json_string_value(json_object_get(e, "npy")));
			truth = npy_data(path, &n);
			CHECK(truth != NULL && t != NULL);
			if (!truth || !t) {
				free(truth);
				continue;
			}
			memcpy(box.size, t->shape, sizeof(box.size));
			CHECK_EQ(flx_view_new(c, t, &box, &v, &err), 0);
			buf = malloc(n + 1);
			if (v && buf) {
				CHECK_EQ(flx_view_read(v, buf, n + 1, 0, NULL),
					 (ssize_t)n);
				if (memcmp(buf, truth, n))
					fprintf(stderr,
						"%s id %lld: %s differs\n", fx,
						(long long)id, key);
				CHECK(memcmp(buf, truth, n) == 0);
				nread++;
			}
			flx_view_free(v);
			free(buf);
			free(truth);
		}
	}
	CHECK_EQ(nread, c->ntensors);
	flx_ckpt_close(c);
	flx_opt_vals_release(&vals);
	json_decref(man);
}

int main(void)
{
	static const char *const model[] = {"model_state", NULL};
	static const char *const opt[] = {"optimizer_state", NULL};
	static const char *const both[] = {"model_state", "optimizer_state",
					   NULL};
	static const char *const all[] = {"model_state", "optimizer_state",
					  "master_weight", NULL};
	static const char *const master[] = {"master_weight", NULL};
	const char *const ids[] = {NULL, "0", "1", "3", "10"};

	check_fixture("paddle-flex-p4", "ckpt", NULL, NULL);
	/* its shards' blocks are read in place: the chunks in a row with the
	 * same strides share one array, not 8 bytes a dimension each */
	CHECK(nshared > 0);
	check_fixture("paddle-flex-p5", "ckpt", NULL, NULL);
	check_fixture("paddle-flex-np2-sharding", "ckpt", NULL, NULL);
	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
		check_fixture("paddle-multi-id", "ckpt", ids[i], NULL);
	check_fixture("paddle-formers-np2-p4", "ckpt/checkpoint-5/model_state",
		      NULL, model);
	check_fixture("paddle-formers-np2-p4",
		      "ckpt/checkpoint-5/optimizer_state", NULL, opt);
	check_fixture("paddle-formers-np2-p4", "ckpt/checkpoint-5", NULL, both);
	/* bf16 training: master_weight/ is the third part; ema_state/ has
	 * no metadata and is no part; protocol 3 */
	check_fixture("paddle-formers-master-p3", "ckpt/checkpoint-5", NULL,
		      all);
	check_fixture("paddle-formers-master-p3",
		      "ckpt/checkpoint-5/master_weight", NULL, master);
	/* arrays saved in pieces: protocol 2 (latin-1 text) and 3 */
	check_fixture("paddle-flex-pieces", "ckpt", "0", NULL);
	check_fixture("paddle-flex-pieces", "ckpt", NULL, NULL);
	check_bytes("paddle-flex-pieces", "ckpt", 0);
	check_bytes("paddle-flex-pieces", "ckpt", 1);
	return CHECK_RESULT();
}
