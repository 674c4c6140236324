/* SPDX-License-Identifier: MIT */
/*
 * The Megatron-Core torch_dist source: every tests/fixtures/megatron-*
 * fixture opens as "megatron-torch_dist", and its flx_megatron (from
 * common.pt) says what the generator's configuration (truth/manifest.json
 * "config", an independent record) says; the recorded data.pkl window is
 * a whole pickle; stacked keys are marked per the spec's key convention;
 * a metadata.json with only sharded_backend and unknown extra keys is
 * accepted; the zarr backend's fixture opens with torch_dist's tensors.  Runs
 * with tests/ as the working directory.
 */
#include "check.h"
#include "ckpt.h"
#include "megatron/megatron.h"
#include "plan.h"
#include "spec.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ITER "ckpt/iter_0000100"

static const char *const fixtures[] = {
    "megatron-untied",
    "megatron-tied",
    "megatron-moe",
    "megatron-optim-dp-reshardable",
    "megatron-optim-fully-reshardable",
    "megatron-optim-fully-sharded-model-space",
    "megatron-optim-fsms-unaligned",
};

static int64_t cfg_int(const json_t *cfg, const char *key)
{
	const json_t *v = json_object_get(cfg, key);

	return json_is_integer(v) && json_integer_value(v) > 0
		   ? (int64_t)json_integer_value(v)
		   : -1;
}

/* The spec's rule (megatron-format.md 3.2, 3.5), written apart from the
 * source's. */
static int want_stacked(const char *fqn)
{
	const char *p = strstr(fqn, "decoder.layers.");

	if (!p || (p != fqn && p[-1] != '.'))
		return 0;
	p += 15;
	if (*p >= '0' && *p <= '9')
		return 0;
	return strstr(p, "experts.experts.") ? 2 : 1;
}

static void test_fixture(const char *fx)
{
	char path[512];
	json_error_t je;
	json_t *man, *cfg;
	flx_ckpt *c = NULL;
	flx_error err = {0};
	const flx_megatron *m;
	char line[1024];

	snprintf(path, sizeof(path), "fixtures/%s/truth/manifest.json", fx);
	man = json_load_file(path, 0, &je);
	CHECK(man != NULL);
	if (!man)
		return;
	cfg = json_object_get(man, "config");
	snprintf(path, sizeof(path), "fixtures/%s/" ITER, fx);
	CHECK_EQ(flx_ckpt_open(path, &c, &err), 0);
	if (!c) {
		fprintf(stderr, "%s: %s\n", fx,
			flx_error_line(&err, line, sizeof(line)));
		json_decref(man);
		return;
	}
	CHECK_STR(c->format, "megatron-torch_dist");
	CHECK(strncmp(c->writer, "Megatron-Core torch_dist, ", 26) == 0);
	m = flx_megatron_of(c);
	CHECK(m != NULL);
	if (m) {
		unsigned char head[2], tail;
		const flx_file *f = &c->files[m->common_file];

		CHECK_EQ(m->iteration,
			 json_integer_value(json_object_get(man, "iteration")));
		CHECK(m->checkpoint_version == 3.0);
		CHECK_EQ(m->num_layers, cfg_int(cfg, "layers"));
		CHECK_EQ(m->hidden_size, cfg_int(cfg, "hidden"));
		CHECK_EQ(m->num_attention_heads, cfg_int(cfg, "heads"));
		CHECK_EQ(m->num_query_groups, cfg_int(cfg, "groups"));
		CHECK_EQ(m->kv_channels, cfg_int(cfg, "kv"));
		CHECK_EQ(m->ffn_hidden_size, cfg_int(cfg, "ffn"));
		CHECK_EQ(m->padded_vocab_size, cfg_int(cfg, "padded_vocab"));
		CHECK_EQ(m->make_vocab_size_divisible_by,
			 cfg_int(cfg, "divisible_by"));
		CHECK_EQ(m->tensor_model_parallel_size, cfg_int(cfg, "tp"));
		CHECK_EQ(m->pipeline_model_parallel_size, cfg_int(cfg, "pp"));
		CHECK_EQ(m->num_experts, cfg_int(cfg, "experts"));
		CHECK_EQ(m->moe_ffn_hidden_size, cfg_int(cfg, "moe_ffn"));
		CHECK_EQ(m->untie_embeddings_and_output_weights,
			 !json_is_true(json_object_get(cfg, "tied")));
		CHECK_EQ(m->swiglu, 1);
		CHECK_EQ(m->virtual_pipeline_model_parallel_size, -1);
		CHECK_STR(m->transformer_impl, "local");
		CHECK_STR(m->normalization, "RMSNorm");
		if (json_is_string(json_object_get(cfg, "optim")))
			CHECK_STR(
			    m->optim_sharding,
			    json_string_value(json_object_get(cfg, "optim")));
		CHECK(!m->common_item);
		CHECK_STR(f->relpath, "common.pt");
		CHECK(m->pkl_len > 3 && m->pkl_off + m->pkl_len <= f->size);
		CHECK(pread(f->fd, head, 2, (off_t)m->pkl_off) == 2 &&
		      head[0] == 0x80 && head[1] == 2);
		CHECK(pread(f->fd, &tail, 1,
			    (off_t)(m->pkl_off + m->pkl_len - 1)) == 1 &&
		      tail == '.');
	}
	for (size_t i = 0; i < c->ntensors; i++) {
		const flx_tensor *t = &c->tensors[i];

		if (t->stacked != want_stacked(t->fqn))
			fprintf(stderr, "%s: %s stacked %d\n", fx, t->fqn,
				t->stacked);
		CHECK_EQ(t->stacked, want_stacked(t->fqn));
	}
	flx_ckpt_close(c);
	json_decref(man);
}

/* cp SRC DST for a small file. */
static int copy_file(const char *src, const char *dst)
{
	char buf[1 << 16];
	FILE *in = fopen(src, "rb"), *out = in ? fopen(dst, "wb") : NULL;
	size_t n;
	int rc = in && out ? 0 : -1;

	while (!rc && (n = fread(buf, 1, sizeof(buf), in)) > 0)
		if (fwrite(buf, 1, n, out) != n)
			rc = -1;
	if (in)
		fclose(in);
	if (out && fclose(out))
		rc = -1;
	return rc;
}

static const char *const iter_files[] = {
    ".metadata",    "__0_0.distcp", "__0_1.distcp", "__1_0.distcp",
    "__1_1.distcp", "__2_0.distcp", "__2_1.distcp", "__3_0.distcp",
    "__3_1.distcp", "common.pt",    "metadata.json"};

/* A copy of megatron-untied's iter_0000100 in a new temporary directory
 * dir: without common.pt when overlay is given, and with overlay's
 * .metadata and __0_2.distcp (tests/unit/data/<overlay>). */
static void assemble(char *dir, const char *overlay)
{
	static const char *const over[] = {".metadata", "__0_2.distcp"};
	char src[512], dst[512];

	CHECK(mkdtemp(dir) != NULL);
	for (size_t i = 0; i < sizeof(iter_files) / sizeof(iter_files[0]);
	     i++) {
		if (overlay && !strcmp(iter_files[i], "common.pt"))
			continue;
		snprintf(src, sizeof(src),
			 "fixtures/megatron-untied/" ITER "/%s", iter_files[i]);
		snprintf(dst, sizeof(dst), "%s/%s", dir, iter_files[i]);
		CHECK_EQ(copy_file(src, dst), 0);
	}
	for (size_t i = 0; overlay && i < 2; i++) {
		snprintf(src, sizeof(src), "unit/data/%s/%s", overlay, over[i]);
		snprintf(dst, sizeof(dst), "%s/%s", dir, over[i]);
		CHECK_EQ(copy_file(src, dst), 0);
	}
}

static void discard(const char *dir)
{
	char path[512];

	for (size_t i = 0; i < sizeof(iter_files) / sizeof(iter_files[0]);
	     i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, iter_files[i]);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/__0_2.distcp", dir);
	unlink(path);
	rmdir(dir);
}

/* metadata.json with only sharded_backend and keys of a later version
 * opens; a "torch" backend is refused. */
static void test_config_subset(void)
{
	char dir[] = "/tmp/flx-megatron.XXXXXX", path[512], line[1024];
	flx_ckpt *c = NULL;
	flx_error err = {0};
	FILE *f;

	assemble(dir, NULL);
	snprintf(path, sizeof(path), "%s/metadata.json", dir);
	f = fopen(path, "w");
	CHECK(f != NULL);
	if (f) {
		fputs("{\"sharded_backend\": \"torch_dist\", "
		      "\"future\": {\"x\": [1, 2]}}",
		      f);
		fclose(f);
	}
	CHECK_EQ(flx_ckpt_open(dir, &c, &err), 0);
	CHECK(c && flx_megatron_of(c) && flx_megatron_of(c)->iteration == 100);
	flx_ckpt_close(c);
	c = NULL;
	err = (flx_error){0};
	f = fopen(path, "w");
	if (f) {
		fputs("{\"sharded_backend\": \"torch\"}", f);
		fclose(f);
	}
	CHECK_EQ(flx_ckpt_open(dir, &c, &err), -ENOTSUP);
	CHECK(strstr(flx_error_line(&err, line, sizeof(line)),
		     "metadata.json: sharded_backend: "
		     "'torch' is not supported") != NULL);
	flx_ckpt_close(c);
	discard(dir);
}

/* 0.19: no common.pt, the common state is the bytes item
 * common_state/shard_0_1 (tools/fixtures/gen_megatron_item.py made the
 * overlays from this fixture's common.pt, with torch 2.6). */
static void test_common_item(void)
{
	char dir[] = "/tmp/flx-megatron.XXXXXX", line[1024];
	char bad[] = "/tmp/flx-megatron.XXXXXX";
	flx_ckpt *c = NULL;
	flx_error err = {0};
	const flx_megatron *m;

	assemble(dir, "megatron-common-item/good");
	CHECK_EQ(flx_ckpt_open(dir, &c, &err), 0);
	m = c ? flx_megatron_of(c) : NULL;
	CHECK(m != NULL);
	if (m) {
		const flx_file *f = &c->files[m->common_file];
		unsigned char head[2];

		CHECK(m->common_item);
		CHECK_EQ(m->iteration, 100);
		CHECK_EQ(m->num_layers, 4);
		CHECK_EQ(m->hidden_size, 16);
		CHECK_EQ(m->padded_vocab_size, 256);
		CHECK_EQ(m->swiglu, 1);
		CHECK(m->checkpoint_version == 3.0);
		CHECK_STR(f->relpath, "__0_2.distcp");
		CHECK(pread(f->fd, head, 2, (off_t)m->pkl_off) == 2 &&
		      head[0] == 0x80 && head[1] == 2);
	}
	flx_ckpt_close(c);
	c = NULL;
	discard(dir);

	assemble(bad, "megatron-common-item/bad");
	CHECK_EQ(flx_ckpt_open(bad, &c, &err), -EINVAL);
	CHECK(strstr(flx_error_line(&err, line, sizeof(line)),
		     "__0_2.distcp@0: args.num_layers: not a non-negative "
		     "integer") != NULL);
	flx_ckpt_close(c);
	discard(bad);
}

/* Whether t has a chunk with ch's box. */
static bool has_box(const flx_tensor *t, const flx_chunk *ch)
{
	for (uint32_t i = 0; i < t->nchunks; i++) {
		const flx_chunk *o = &t->chunks[i];
		bool same = true;

		for (int d = 0; d < t->ndim; d++)
			same &= o->off[d] == ch->off[d] &&
				o->size[d] == ch->size[d];
		if (same)
			return true;
	}
	return false;
}

/* The zarr backend (spec 1.6): tests/fixtures/megatron-zarr, the model of
 * megatron-untied, opens as "megatron-zarr" with the torch_dist
 * fixture's tensors (names, dtypes, shapes, chunk boxes, stacked axes) and
 * as many objects, each a whole .pt file; its common state names no
 * optimizer format, so Megatron's assumption is recorded (spec 1.5). */
static void test_zarr(void)
{
	flx_ckpt *z = NULL, *t = NULL;
	flx_error err = {0};
	const flx_megatron *m;

	CHECK_EQ(flx_ckpt_open("fixtures/megatron-zarr/ckpt", &z, &err), 0);
	CHECK_EQ(flx_ckpt_open("fixtures/megatron-untied/" ITER, &t, &err), 0);
	if (!z || !t)
		goto out;
	CHECK_STR(z->format, "megatron-zarr");
	CHECK_STR(z->writer, "Megatron-Core zarr");
	m = flx_megatron_of(z);
	CHECK(m && m->objects_bare && !flx_megatron_of(t)->objects_bare);
	CHECK(m && m->optim_assumed && !flx_megatron_of(t)->optim_assumed);
	if (m) {
		CHECK_STR(m->optim_sharding, "dp_zero_gather_scatter");
		CHECK_EQ(m->num_layers, 4);
		CHECK_EQ(m->iteration, 100);
	}
	CHECK_EQ(z->ntensors, t->ntensors);
	CHECK_EQ(z->nobjects, t->nobjects);
	for (size_t i = 0; i < z->ntensors; i++) {
		const flx_tensor *a = &z->tensors[i];
		const flx_tensor *b = flx_ckpt_find(t, a->fqn);

		CHECK(b != NULL);
		if (!b)
			continue;
		CHECK_EQ(a->dtype, b->dtype);
		CHECK_EQ(a->ndim, b->ndim);
		CHECK(!memcmp(a->shape, b->shape, sizeof(a->shape)));
		CHECK_EQ(a->stacked, want_stacked(a->fqn));
		CHECK_EQ(a->nchunks, b->nchunks);
		for (uint32_t k = 0; k < a->nchunks; k++) {
			const flx_chunk *ch = &a->chunks[k];

			CHECK(has_box(b, ch));
			CHECK_EQ(ch->data_off, 0);
			CHECK_EQ(z->files[ch->file].size,
				 flx_numel(a->ndim, ch->size) *
				     flx_dtype_size(a->dtype));
		}
	}
	for (size_t i = 0; i < z->nobjects; i++) {
		const flx_object *o = &z->objects[i];

		CHECK(strstr(o->fqn, "/shard_") != NULL);
		CHECK(o->off == 0 && o->len == z->files[o->file].size);
	}
out:
	flx_ckpt_close(z);
	flx_ckpt_close(t);
}

/* Plan megatron-untied with options opts ("tp=2,pp=2") and, when rules is
 * set, a rules file of that text.  @return flx_plan_build()'s value, the
 * error line in line. */
static int plan_with(const flx_ckpt *c, int tp, int pp, const char *rules,
		     char *line, size_t len)
{
	char path[] = "/tmp/flx-megatron-rules.XXXXXX", v[16];
	flx_error err = {0};
	flx_plan *p = NULL;
	flx_spec s;
	int rc, fd = -1;

	line[0] = '\0';
	if (flx_spec_init(&s))
		return -ENOMEM;
	snprintf(v, sizeof(v), "%d", tp);
	rc = flx_spec_set(&s, "tp", v, &err);
	snprintf(v, sizeof(v), "%d", pp);
	if (!rc)
		rc = flx_spec_set(&s, "pp", v, &err);
	if (!rc && rules) {
		fd = mkstemp(path);
		rc = fd >= 0 && write(fd, rules, strlen(rules)) ==
				    (ssize_t)strlen(rules)
			 ? flx_spec_set(&s, "rules", path, &err)
			 : -EIO;
	}
	if (!rc)
		rc = flx_plan_build(c, &s, &p, &err);
	if (rc)
		flx_error_line(&err, line, len);
	flx_plan_free(p);
	flx_spec_release(&s);
	if (fd >= 0) {
		close(fd);
		unlink(path);
	}
	return rc;
}

/* At pp>1 a stacked tensor is on every stage, each holding its layers'
 * range of axis 0 (3 layers over 2 stages would be 2 + 1; the fixture has
 * 2: one each), TP still splitting its own axis. */
static void test_plan_stacked_stages(const flx_ckpt *c)
{
	flx_error err = {0};
	flx_plan *p = NULL;
	flx_spec s;

	CHECK_EQ(flx_spec_init(&s), 0);
	CHECK_EQ(flx_spec_set(&s, "tp", "2", &err), 0);
	CHECK_EQ(flx_spec_set(&s, "pp", "2", &err), 0);
	CHECK_EQ(flx_plan_build(c, &s, &p, &err), 0);
	for (size_t i = 0; p && i < p->n; i++) {
		const flx_placement *pl = &p->p[i];
		const flx_tensor *t = pl->src;

		if (strcmp(t->fqn, "decoder.layers.mlp.experts.experts."
				   "linear_fc1.weight"))
			continue;
		CHECK(pl->by_stage);
		CHECK_EQ(pl->stage_lo, 0);
		CHECK_EQ(pl->stage_hi, 1);
		for (int st = 0; st < 2; st++)
			for (int r = 0; r < 2; r++) {
				const flx_box *b = flx_view_box(
				    flx_placement_view(pl, st, r, 2));

				CHECK_EQ(b->off[0], st);
				CHECK_EQ(b->size[0], 1);
				CHECK_EQ(b->size[1], t->shape[1]);
				CHECK_EQ(b->off[2], r * t->shape[2] / 2);
				CHECK_EQ(b->size[2], t->shape[2] / 2);
			}
		CHECK_EQ(flx_view_box(pl->whole)->size[0], t->shape[0]);
	}
	flx_plan_free(p);
	flx_spec_release(&s);
}

/* Stacked tensors in the planner: TP takes their own axis, never a
 * stacked one; pp>1 places them by stage. */
static void test_plan_stacked(void)
{
	flx_ckpt *c = NULL;
	flx_error err = {0};
	char line[1024];

	CHECK_EQ(flx_ckpt_open("fixtures/megatron-moe/" ITER, &c, &err), 0);
	if (!c)
		return;
	CHECK_EQ(plan_with(c, 1, 1, NULL, line, sizeof(line)), 0);
	CHECK_EQ(plan_with(c, 4, 1, NULL, line, sizeof(line)), 0);
	CHECK_EQ(plan_with(c, 2, 2, NULL, line, sizeof(line)), 0);
	test_plan_stacked_stages(c);
	CHECK_EQ(plan_with(c, 2, 2,
			   "[{\"match\": \"decoder.layers.*\", "
			   "\"stage\": \"all\"}]",
			   line, sizeof(line)),
		 0);
	CHECK_EQ(plan_with(c, 2, 1,
			   "[{\"match\": \"decoder.layers.mlp.experts.*\", "
			   "\"split\": 1}]",
			   line, sizeof(line)),
		 -EINVAL);
	CHECK(strstr(line, "splits axis 1, which stacks layers or experts") !=
	      NULL);
	CHECK_EQ(plan_with(c, 2, 1,
			   "[{\"match\": \"decoder.layers.mlp.experts.*\", "
			   "\"split\": 3}]",
			   line, sizeof(line)),
		 0);
	flx_ckpt_close(c);
}

int main(void)
{
	for (size_t i = 0; i < sizeof(fixtures) / sizeof(fixtures[0]); i++)
		test_fixture(fixtures[i]);
	test_config_subset();
	test_common_item();
	test_zarr();
	test_plan_stacked();
	return CHECK_RESULT();
}
