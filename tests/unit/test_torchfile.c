/* SPDX-License-Identifier: MIT */
/*
 * Whole torch.save files (resolver/codec/torchfile.h): the fixtures real
 * torch 1.13 and 2.6 wrote (tools/fixtures/gen_torchsave.py), zip and
 * legacy.  Every tensor is gathered element by element from the bytes at
 * the offsets and strides torchfile gives and compared with the truth file
 * the generator wrote from the tensor torch saved; then damaged copies
 * (truncated, wrong element count, bad magic, big-endian) are refused.
 */
#include "check.h"
#include "torchfile.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char *read_path(const char *path, size_t *len)
{
	unsigned char *buf = NULL;
	FILE *f = fopen(path, "rb");
	long n;

	if (!f) {
		fprintf(stderr, "cannot open %s\n", path);
		return NULL;
	}
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
	    fseek(f, 0, SEEK_SET) == 0) {
		buf = malloc((size_t)n + 1);
		if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
			free(buf);
			buf = NULL;
		}
		*len = (size_t)n;
	}
	fclose(f);
	return buf;
}

/* The tensor's elements in C order, gathered through its strides. */
static unsigned char *gather(const unsigned char *file, size_t flen,
			     const flx_torchfile_tensor *t, size_t *len)
{
	size_t es = flx_dtype_size(t->t.dtype), n = 1, k = 0;
	int64_t idx[FLX_MAX_DIMS] = {0};
	unsigned char *out;

	for (int d = 0; d < t->t.ndim; d++)
		n *= (size_t)t->t.size[d];
	out = malloc(n * es + 1);
	if (!out)
		return NULL;
	for (; k < n; k++) {
		uint64_t el = (uint64_t)t->t.storage_offset, off;

		for (int d = 0; d < t->t.ndim; d++)
			el += (uint64_t)idx[d] * (uint64_t)t->t.stride[d];
		off = t->data_off + el * es;
		if (off + es > flen) {
			free(out);
			return NULL;
		}
		memcpy(out + k * es, file + off, es);
		for (int d = t->t.ndim - 1; d >= 0; d--) {
			if (++idx[d] < t->t.size[d])
				break;
			idx[d] = 0;
		}
	}
	*len = n * es;
	return out;
}

struct ctx {
	const char *truth;
	const unsigned char *buf;
	size_t len;
	const flx_torchfile *f;
	int checked;
};

static void check_tensor(struct ctx *c, const char *key, const flx_pv *v)
{
	flx_torchfile_tensor t;
	flx_error e;
	char path[600];
	unsigned char *want, *got;
	size_t wl = 0, gl = 0;

	flx_error_init(&e);
	CHECK(flx_torchfile_is_tensor(v));
	if (flx_torchfile_resolve(c->f, v, key, &t, &e)) {
		fprintf(stderr, "%s: %s: %s\n", e.file, e.key, e.text);
		CHECK(0);
		return;
	}
	snprintf(path, sizeof(path), "%s/%s.bin", c->truth, key);
	want = read_path(path, &wl);
	got = gather(c->buf, c->len, &t, &gl);
	CHECK(want && got);
	if (want && got) {
		if (wl != gl || memcmp(want, got, wl) != 0) {
			fprintf(stderr, "%s: bytes differ from %s\n", key,
				path);
			CHECK(0);
		}
	}
	free(want);
	free(got);
	c->checked++;
}

/* Every tensor of dict sd (named prefix + key). */
static void check_dict(struct ctx *c, const char *prefix, const flx_pv *sd)
{
	char key[300];

	CHECK(sd && sd->kind == FLX_PV_DICT);
	if (!sd || sd->kind != FLX_PV_DICT)
		return;
	for (size_t i = 0; i < sd->u.dict.n; i++) {
		const flx_pv *k = sd->u.dict.kv[2 * i];
		const flx_pv *v = sd->u.dict.kv[2 * i + 1];

		snprintf(key, sizeof(key), "%s%s", prefix, flx_pv_str(k));
		check_tensor(c, key, v);
	}
}

static int count_truth(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (strstr(de->d_name, ".bin"))
			n++;
	closedir(d);
	return n;
}

static int open_buf(const unsigned char *buf, size_t len, flx_torchfile **f,
		    flx_error *e)
{
	flx_reader r;
	flx_mem_reader m;

	flx_error_init(e);
	flx_reader_mem(&r, &m, buf, len);
	return flx_torchfile_open(&r, "test.bin", f, e);
}

/* A fixture directory: files (NULL-terminated) under ckpt/; nested: the
 * state dict under "model" and Adam's state under "optimizer". */
static void check_fixture(const char *fx, const char *const *files, bool nested,
			  flx_torchfile_kind kind)
{
	char path[300], truth[300];
	struct ctx c = {.truth = truth};

	snprintf(truth, sizeof(truth), "fixtures/%s/truth", fx);
	for (size_t i = 0; files[i]; i++) {
		unsigned char *buf;
		size_t len = 0;
		flx_torchfile *f = NULL;
		flx_error e;
		const flx_pv *root;

		snprintf(path, sizeof(path), "fixtures/%s/ckpt/%s", fx,
			 files[i]);
		buf = read_path(path, &len);
		CHECK(buf != NULL);
		if (!buf)
			continue;
		if (open_buf(buf, len, &f, &e)) {
			fprintf(stderr, "%s: %s: %s\n", path, e.key, e.text);
			CHECK(0);
			free(buf);
			continue;
		}
		CHECK_EQ(flx_torchfile_kind_of(f), kind);
		c.buf = buf;
		c.len = len;
		c.f = f;
		root = flx_torchfile_root(f);
		if (nested) {
			const flx_pv *st = flx_pv_dict_get(
			    flx_pv_dict_get(root, "optimizer"), "state");
			const flx_pv *step = flx_pv_dict_get(root, "step");
			int64_t sv = 0;

			check_dict(&c, "", flx_pv_dict_get(root, "model"));
			CHECK(st && st->kind == FLX_PV_DICT);
			for (size_t k = 0; st && k < st->u.dict.n; k++) {
				char pre[64];
				int64_t id = -1;

				CHECK(flx_pv_int(st->u.dict.kv[2 * k], &id));
				snprintf(pre, sizeof(pre),
					 "optimizer.state.%" PRId64 ".", id);
				check_dict(&c, pre, st->u.dict.kv[2 * k + 1]);
			}
			CHECK(flx_pv_int(step, &sv) && sv == 7);
		} else {
			check_dict(&c, "", root);
		}
		if (strcmp(fx, "ts-t113-zip") == 0 ||
		    strcmp(fx, "ts-t113-legacy") == 0) {
			flx_torchfile_tensor a, b;
			flx_error e2;

			flx_error_init(&e2);
			/* tied: one storage, both resolved */
			CHECK(!flx_torchfile_resolve(
			    f, flx_pv_dict_get(root, "lm_head.weight"), "a", &a,
			    &e2));
			CHECK(!flx_torchfile_resolve(
			    f,
			    flx_pv_dict_get(root, "model.embed_tokens.weight"),
			    "b", &b, &e2));
			CHECK_EQ(a.storage, b.storage);
			CHECK_EQ(a.data_off, b.data_off);
			CHECK(!flx_torchfile_resolve(
			    f,
			    flx_pv_dict_get(
				root, "model.layers.1.mlp.up_proj.weight"),
			    "c", &a, &e2));
			CHECK(a.t.storage_offset > 0);
			CHECK(!flx_torchfile_resolve(
			    f,
			    flx_pv_dict_get(root,
					    "model.layers.0.self_attn.o_proj."
					    "weight"),
			    "d", &a, &e2));
			CHECK(a.t.stride[0] == 1 && a.t.stride[1] == 24);
			CHECK(flx_torchfile_resolve(
				  f, flx_pv_dict_get(root, "nothing"), "x", &a,
				  &e2) == -EINVAL);
		}
		flx_torchfile_close(f);
		free(buf);
	}
	CHECK_EQ(c.checked, count_truth(truth));
	printf("%s: %d tensors bit-exact\n", fx, c.checked);
}

/* A copy of a fixture file changed by fn is refused with -EINVAL and a
 * message containing want. */
static void refuse(const char *path, void (*fn)(unsigned char *, size_t *),
		   const char *want)
{
	size_t len = 0;
	unsigned char *buf = read_path(path, &len);
	flx_torchfile *f = NULL;
	flx_error e;
	int rc;

	CHECK(buf != NULL);
	if (!buf)
		return;
	fn(buf, &len);
	rc = open_buf(buf, len, &f, &e);
	if (rc != -EINVAL)
		fprintf(stderr, "%s changed to fail with '%s': %d\n", path,
			want, rc);
	CHECK_EQ(rc, -EINVAL);
	if (rc == -EINVAL && !strstr(e.text, want)) {
		fprintf(stderr, "message '%s' lacks '%s'\n", e.text, want);
		CHECK(0);
	}
	if (!rc)
		flx_torchfile_close(f);
	free(buf);
}

static void cut_half(unsigned char *b, size_t *len)
{
	(void)b;
	*len /= 2;
}

static void cut_last(unsigned char *b, size_t *len)
{
	(void)b;
	*len -= 1;
}

static void bad_magic(unsigned char *b, size_t *len)
{
	(void)len;
	b[5] ^= 0x01;
}

static unsigned char *find(unsigned char *b, size_t len, const char *s)
{
	return memmem(b, len, s, strlen(s));
}

static void big_endian(unsigned char *b, size_t *len)
{
	unsigned char *p = find(b, *len, "little");

	if (p)
		memcpy(p, "bigxxx", 6);
}

/* legacy: the first storage's element count, one more */
static void bad_count(unsigned char *b, size_t *len)
{
	flx_torchfile *f = NULL;
	flx_error e;
	uint64_t off = 0;

	if (open_buf(b, *len, &f, &e))
		return;
	off = flx_torchfile_storage(f, 0)->off;
	flx_torchfile_close(f);
	b[off - 8] += 1;
}

/* legacy little_endian True -> False (NEWTRUE -> NEWFALSE) */
static void legacy_big(unsigned char *b, size_t *len)
{
	unsigned char *p = find(b, *len, "little_endian");

	if (p && p[13 + 1] == 0x88)
		p[13 + 1] = 0x89;
	else if (p && p[13 + 2] == 0x88)
		p[13 + 2] = 0x89;
}

static void test_refusals(void)
{
	const char *zip = "fixtures/ts-t113-zip/ckpt/pytorch_model.bin";
	const char *leg = "fixtures/ts-t113-legacy/ckpt/pytorch_model.bin";

	refuse(zip, cut_half, "zip:");
	/* torch >= 2.1 writes the byteorder record */
	refuse("fixtures/ts-t26-zip/ckpt/pytorch_model.bin", big_endian,
	       "byte order");
	refuse(leg, cut_last, "past the end");
	refuse(leg, bad_magic, "magic");
	refuse(leg, bad_count, "elements");
	refuse(leg, legacy_big, "little_endian");
}

int main(void)
{
	static const char *const single[] = {"pytorch_model.bin", NULL};
	static const char *const sharded[] = {
	    "pytorch_model-00001-of-00003.bin",
	    "pytorch_model-00002-of-00003.bin",
	    "pytorch_model-00003-of-00003.bin", NULL};
	static const char *const train[] = {"checkpoint.pt", NULL};

	check_fixture("ts-t113-zip", single, false, FLX_TORCHFILE_ZIP);
	check_fixture("ts-t113-legacy", single, false, FLX_TORCHFILE_LEGACY);
	check_fixture("ts-t113-sharded", sharded, false, FLX_TORCHFILE_ZIP);
	check_fixture("ts-t113-train", train, true, FLX_TORCHFILE_ZIP);
	check_fixture("ts-t26-zip", single, false, FLX_TORCHFILE_ZIP);
	check_fixture("ts-t26-train", train, true, FLX_TORCHFILE_ZIP);
	test_refusals();
	return CHECK_RESULT();
}
