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
 * the one axis the shards' blocks differ along).  Runs with tests/ as the
 * working directory.
 */
#include "check.h"
#include "ckpt.h"

#include <jansson.h>
#include <stdio.h>
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

/* Every tensor of checkpoint entry ck of the manifest is in c as the
 * manifest says; the name table has exactly those keys. */
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
		/* placement's word: the blocks' axis (several: inferred) */
		CHECK_EQ(t->saved_split, axis == -2 ? 0
					 : axis < 0 ? -1
						    : axis + 1);
		for (size_t i = 0; i < c->paddle->nnames; i++)
			if (!strcmp(c->paddle->names[i].key, key))
				p = &c->paddle->names[i];
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
		o.has_paddle_id = true;
		o.paddle_id = (uint64_t)atoll(opt_id);
		id = atoll(opt_id);
	}
	snprintf(path, sizeof(path), "fixtures/%s/%s", fx, dir);
	flx_error_init(&err);
	CHECK_EQ(flx_ckpt_open_with(path, &o, &c, &err), 0);
	if (!c) {
		fprintf(stderr, "%s: %s %s %s\n", path, err.file, err.key,
			err.text);
		json_decref(man);
		return;
	}
	CHECK_STR(c->format, "paddle-dcp");
	CHECK(c->paddle != NULL);
	CHECK_EQ(c->paddle->unique_id, id);
	for (i = 1; i < c->paddle->nnames; i++)
		CHECK(strcmp(c->paddle->names[i - 1].key,
			     c->paddle->names[i].key) < 0);
	for (i = 0; i < c->paddle->nnames; i++)
		CHECK(flx_ckpt_find(c, c->paddle->names[i].key) != NULL);
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
	CHECK_EQ(c->paddle->nnames, want);
	flx_ckpt_close(c);
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
	return CHECK_RESULT();
}
