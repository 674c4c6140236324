/* SPDX-License-Identifier: MIT */
/* The MindSpore .ckpt reader (resolver/mindspore/mindspore.c) on the byte
 * strings of shared/specs/mindspore-format.md §5.1-5.2, whose offsets the
 * spec's tables give: each file is the one rank of a scratch directory,
 * opened as a mount opens it; the chunks must point at the documented
 * tensor_content offsets, and the bytes there must be the values. */
#include "check.h"
#include "ckpt.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

/* dir/m.ckpt := the spec-bytes fixture's file name */
static flx_ckpt *open_one(const char *name, flx_error *e)
{
	char from[256], to[128], buf[4096];
	flx_ckpt *c = NULL;
	FILE *in, *out;
	size_t n;

	snprintf(from, sizeof(from), "fixtures/mindspore-spec-bytes/%s", name);
	snprintf(to, sizeof(to), "%s/m.ckpt", dir);
	in = fopen(from, "rb");
	out = fopen(to, "wb");
	if (!in || !out)
		abort();
	while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
		fwrite(buf, 1, n, out);
	fclose(in);
	fclose(out);
	flx_error_init(e);
	if (flx_ckpt_open(dir, &c, e) < 0)
		return NULL;
	return c;
}

static void test_plain_and_chunked(void)
{
	flx_error e;
	float v[6];
	flx_ckpt *c = open_one("ex5.1-plain.ckpt", &e);
	CHECK(c != NULL);
	if (c) {
		const flx_tensor *t = flx_ckpt_find(c, "w");
		CHECK_STR(c->format, "mindspore");
		CHECK(t != NULL);
		if (t) {
			CHECK_EQ(t->dtype, FLX_DT_F32);
			CHECK_EQ(t->ndim, 2);
			CHECK_EQ(t->shape[0], 2);
			CHECK_EQ(t->shape[1], 3);
			CHECK_EQ(t->nchunks, 1);
			CHECK_EQ(t->chunks[0].data_off, 22); /* §5.1 table */
			CHECK_EQ(flx_file_pread(c, t->chunks[0].file, v, 24,
						t->chunks[0].data_off),
				 0);
			for (int i = 0; i < 6; i++)
				CHECK(v[i] == (float)(i + 1));
		}
		flx_ckpt_close(c);
	}
	/* §5.2 chunked: two Values of 12 bytes, contents at 22 and 56 */
	c = open_one("ex5.2-chunked.ckpt", &e);
	CHECK(c != NULL);
	if (c) {
		const flx_tensor *t = flx_ckpt_find(c, "w");
		CHECK(t && t->nchunks == 2);
		if (t && t->nchunks == 2) {
			CHECK_EQ(t->chunks[0].data_off, 22);
			CHECK_EQ(t->chunks[0].off[0], 0);
			CHECK_EQ(t->chunks[0].size[0], 1);
			CHECK_EQ(t->chunks[1].data_off, 56);
			CHECK_EQ(t->chunks[1].off[0], 1);
			CHECK_EQ(t->chunks[1].size[1], 3);
		}
		flx_ckpt_close(c);
	}
	/* §5.2 CRC trailer: verified, stripped; the tensor as in §5.1 */
	c = open_one("ex5.2-crc.ckpt", &e);
	CHECK(c != NULL);
	if (c) {
		const flx_tensor *t = flx_ckpt_find(c, "w");
		CHECK(t && t->nchunks == 1 && t->chunks[0].data_off == 22);
		flx_ckpt_close(c);
	}
}

static void test_scalar_str(void)
{
	flx_error e;
	int32_t v = 0;
	flx_ckpt *c = open_one("ex5.2-scalar-str.ckpt", &e);
	CHECK(c != NULL);
	if (!c)
		return;
	const flx_tensor *t = flx_ckpt_find(c, "global_step");
	CHECK(t != NULL);
	if (t) {
		CHECK_EQ(t->ndim, 0);
		CHECK_EQ(t->dtype, FLX_DT_I32);
		CHECK_EQ(flx_file_pread(c, t->chunks[0].file, &v, 4,
					t->chunks[0].data_off),
			 0);
		CHECK_EQ(v, 10);
	}
	CHECK(flx_ckpt_find(c, "note") == NULL); /* str: not served */
	CHECK_EQ(c->ntensors, 1);
	flx_ckpt_close(c);
}

/* Zero-element tensors (§1.4) in the mindspore-zero fixture: the <= 2.2
 * writer's empty records are indexed as DCP indexes a zero-element tensor
 * (one chunk of no bytes per box: [0,4] whole, [8,0] as two [4,0] rows);
 * the >= 2.3 files have no record, and the layout the strategy still has
 * for [8,0] is left out without error. */
static void test_zero_element(void)
{
	const char *fx = "fixtures/mindspore-zero/";
	char d22[128], d23[128], st[128];
	flx_ckpt_opts o = {0};
	flx_ckpt *c = NULL;
	flx_error e;

	snprintf(d22, sizeof(d22), "%sckpt-legacy22", fx);
	snprintf(d23, sizeof(d23), "%sckpt", fx);
	snprintf(st, sizeof(st), "%sstrategy/ckpt_strategy_rank_0.ckpt", fx);
	o.ms_strategy = st;
	flx_error_init(&e);
	CHECK_EQ(flx_ckpt_open_with(d22, &o, &c, &e), 0);
	if (c) {
		const flx_tensor *b = flx_ckpt_find(c, "model.freqs_cache");
		const flx_tensor *w =
		    flx_ckpt_find(c, "model.layers.0.attention.prefix.weight");
		CHECK(b && b->ndim == 2 && b->shape[0] == 0 &&
		      b->shape[1] == 4 && b->nchunks == 1);
		if (b && b->nchunks == 1)
			CHECK(b->chunks[0].size[0] == 0 &&
			      b->chunks[0].size[1] == 4 &&
			      b->chunks[0].item_len == 0);
		CHECK(w && w->ndim == 2 && w->shape[0] == 8 &&
		      w->shape[1] == 0 && w->nchunks == 2);
		if (w && w->nchunks == 2)
			for (int i = 0; i < 2; i++)
				CHECK(w->chunks[i].size[0] == 4 &&
				      w->chunks[i].size[1] == 0 &&
				      w->chunks[i].off[0] == 4 * i);
		CHECK_EQ(c->ntensors, 23);
		flx_ckpt_close(c);
	}
	c = NULL;
	flx_error_init(&e);
	CHECK_EQ(flx_ckpt_open_with(d23, &o, &c, &e), 0);
	if (c) {
		CHECK(flx_ckpt_find(c, "model.freqs_cache") == NULL);
		CHECK(flx_ckpt_find(c, "model.layers.0.attention.prefix."
				       "weight") == NULL);
		CHECK_EQ(c->ntensors, 21);
		flx_ckpt_close(c);
	}
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/flx-ms-unit.XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	test_plain_and_chunked();
	test_scalar_str();
	test_zero_element();
	char p[128];
	snprintf(p, sizeof(p), "%s/m.ckpt", dir);
	unlink(p);
	rmdir(dir);
	return CHECK_RESULT();
}
