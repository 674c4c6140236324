/* SPDX-License-Identifier: MIT */
/*
 * The Hugging Face safetensors source (source.h): a directory holding
 * "model.safetensors", or "model.safetensors.index.json" and the shards its
 * weight_map names ("model-0000i-of-0000N.safetensors").  Each tensor is
 * one chunk: the whole tensor, dense row-major, at 8 + N + data_offsets[0]
 * of its file.  Other regular files (config.json, tokenizer files) are
 * passed through as extras.
 *
 * Every header is checked as the safetensors library checks it when it
 * loads a file (huggingface/safetensors, src/tensor.rs, Metadata::validate):
 *  - at least 8 bytes; the header length N (u64 little-endian) at most
 *    100,000,000 and 8 + N within the file;
 *  - the header is UTF-8 JSON: an object whose keys are tensor names, each
 *    {"dtype", "shape", "data_offsets": [begin, end]} (other fields are
 *    ignored), plus an optional "__metadata__" of string values; no name
 *    twice;
 *  - sorted by data_offsets, the tensors' data is contiguous from 0: each
 *    begins where the previous ends, ends at or after it begins, holds
 *    numel x element size bytes (no overflow), and the last ends at the
 *    end of the file.
 * flexfs adds its own bounds: at most FLX_MAX_DIMS dimensions, element and
 * byte counts within 63 bits, dtypes it can serve (sub-byte and e8m0 types
 * are refused).  With an index, every tensor of every shard must be listed
 * for that shard and every listed tensor must be in the shard named.
 * Tensors are indexed shard by shard (in name order), each in data order.
 */
#include "json_guard.h"
#include "reader.h"
#include "source.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SINGLE_NAME	 "model.safetensors"
#define INDEX_NAME	 "model.safetensors.index.json"
#define MAX_HEADER_BYTES 100000000ull /* the safetensors library's limit */
#define MAX_INDEX_BYTES	 (64u << 20)

/* One tensor of a header; name points into the header's JSON tree. */
typedef struct st_entry {
	const char *name;
	flx_dtype dtype;
	int ndim;
	int64_t shape[FLX_MAX_DIMS];
	uint64_t bytes; /* numel x element size */
	uint64_t begin; /* data_offsets, relative to the data */
	uint64_t end;
} st_entry;

/* One safetensors file. */
typedef struct shard {
	const char *relpath; /* in the index's tree, or SINGLE_NAME */
	const char *key;     /* a tensor the index lists in it, for messages */
	uint32_t file;
	uint64_t data_start; /* 8 + N */
	json_t *header;
	st_entry *e;
	size_t n;
} shard;

typedef struct hf {
	flx_build *b;
	flx_ckpt *c;
	flx_error *err;
	json_t *index; /* NULL: one file, no index */
	json_t *weight_map;
	shard *sh;
	size_t nsh;
	const char *format; /* the first shard's __metadata__ "format" */
} hf;

/* ---- names ---- */

/* model-<digits>-of-<digits>.safetensors */
static bool is_shard_name(const char *name)
{
	const char *p = name;
	size_t d;

	if (strncmp(p, "model-", 6) != 0)
		return false;
	p += 6;
	d = strspn(p, "0123456789");
	if (!d || strncmp(p + d, "-of-", 4) != 0)
		return false;
	p += d + 4;
	d = strspn(p, "0123456789");
	return d && strcmp(p + d, ".safetensors") == 0;
}

/* Never passed through: the checkpoint's own names. */
static bool owns(const char *name)
{
	return strcmp(name, SINGLE_NAME) == 0 ||
	       strcmp(name, INDEX_NAME) == 0 || is_shard_name(name);
}

static int probe(int dirfd, bool *yes)
{
	*yes =
	    flx_dir_has(dirfd, SINGLE_NAME) || flx_dir_has(dirfd, INDEX_NAME);
	return 0;
}

/* ---- JSON ---- */

/* A non-negative JSON integer. */
static bool get_uint(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

/* ---- the index ---- */

static int cmp_shard(const void *a, const void *b)
{
	return strcmp(((const shard *)a)->relpath, ((const shard *)b)->relpath);
}

/* The index's weight_map: tensor name -> file; the files become the
 * shards, in name order (the order transformers loads them in). */
static int load_index(hf *h)
{
	const char *name;
	json_t *v;
	void *buf = NULL;
	size_t len = 0, n = 0;
	int rc = flx_build_read_whole(h->b, INDEX_NAME, MAX_INDEX_BYTES, NULL,
				      &buf, &len, &h->c->mtime_ns, h->err);

	if (!rc)
		rc = flx_json_parse(buf, len, INDEX_NAME, NULL, &h->index,
				    h->err);
	free(buf);
	if (rc)
		return rc;
	h->weight_map = json_object_get(h->index, "weight_map");
	if (!json_is_object(h->index) || !json_is_object(h->weight_map))
		return flx_error_set(h->err, -EINVAL, INDEX_NAME, "weight_map",
				     "missing, or not an object");
	h->sh = calloc(json_object_size(h->weight_map) + 1, sizeof(*h->sh));
	if (!h->sh)
		return -ENOMEM;
	json_object_foreach(h->weight_map, name, v)
	{
		const char *file = json_string_value(v);
		size_t k;

		if (!file)
			return flx_error_set(h->err, -EINVAL, INDEX_NAME, name,
					     "weight_map value is not a file "
					     "name");
		for (k = 0; k < n && strcmp(h->sh[k].relpath, file) != 0; k++)
			;
		if (k == n)
			h->sh[n++] = (shard){.relpath = file, .key = name};
	}
	h->nsh = n;
	qsort(h->sh, n, sizeof(*h->sh), cmp_shard);
	return 0;
}

/* ---- one header ---- */

static flx_dtype dtype_of(const char *s)
{
	for (int i = 1; i < FLX_DT_COUNT; i++) {
		const char *name = flx_dtype_get((flx_dtype)i)->safetensors;

		if (name && strcmp(name, s) == 0)
			return (flx_dtype)i;
	}
	return FLX_DT_INVALID;
}

/* safetensors dtypes flexfs does not serve (no whole-byte element, or no
 * torch dtype in the views) */
static bool dtype_unservable(const char *s)
{
	static const char *const other[] = {"F8_E8M0", "F4", "F6_E2M3",
					    "F6_E3M2"};

	for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++)
		if (strcmp(s, other[i]) == 0)
			return true;
	return false;
}

static int decode_entry(hf *h, const shard *s, const char *name,
			const json_t *v, st_entry *e)
{
	const json_t *dt = json_object_get(v, "dtype");
	const json_t *shape = json_object_get(v, "shape");
	const json_t *offs = json_object_get(v, "data_offsets");
	size_t nd;

	e->name = name;
	if (!json_is_object(v))
		return flx_error_set(h->err, -EINVAL, s->relpath, name,
				     "not an object with dtype, shape and "
				     "data_offsets");
	if (!json_is_string(dt))
		return flx_error_set(h->err, -EINVAL, s->relpath, name,
				     "dtype is missing or not a string");
	e->dtype = dtype_of(json_string_value(dt));
	if (e->dtype == FLX_DT_INVALID &&
	    dtype_unservable(json_string_value(dt)))
		return flx_error_set(h->err, -ENOTSUP, s->relpath, name,
				     "unsupported dtype '%s'",
				     json_string_value(dt));
	if (e->dtype == FLX_DT_INVALID)
		return flx_error_set(h->err, -EINVAL, s->relpath, name,
				     "unknown dtype '%s'",
				     json_string_value(dt));
	if (!json_is_array(shape))
		return flx_error_set(h->err, -EINVAL, s->relpath, name,
				     "shape is missing or not a list");
	nd = json_array_size(shape);
	if (nd > FLX_MAX_DIMS)
		return flx_error_set(h->err, -EINVAL, s->relpath, name,
				     "shape has %zu dimensions (at most %d)",
				     nd, FLX_MAX_DIMS);
	for (size_t d = 0; d < nd; d++) {
		uint64_t x;

		if (!get_uint(json_array_get(shape, d), &x))
			return flx_error_set(h->err, -EINVAL, s->relpath, name,
					     "shape: dimension %zu is not a "
					     "non-negative integer",
					     d);
		e->shape[d] = (int64_t)x;
	}
	e->ndim = (int)nd;
	if (flx_shape_bytes(e->ndim, e->shape, flx_dtype_size(e->dtype), NULL,
			    &e->bytes))
		return flx_error_set(h->err, -EOVERFLOW, s->relpath, name,
				     "tensor size overflows 64 bits");
	if (!json_is_array(offs) || json_array_size(offs) != 2 ||
	    !get_uint(json_array_get(offs, 0), &e->begin) ||
	    !get_uint(json_array_get(offs, 1), &e->end))
		return flx_error_set(h->err, -EINVAL, s->relpath, name,
				     "data_offsets is missing or not a pair "
				     "of non-negative integers");
	return 0;
}

/* The __metadata__ object: string values only. */
static int decode_metadata(hf *h, const shard *s, const json_t *v)
{
	const char *k;
	const json_t *x;

	if (!json_is_object(v))
		return flx_error_set(h->err, -EINVAL, s->relpath,
				     "__metadata__", "not an object");
	json_object_foreach((json_t *)v, k, x)
	{
		if (!json_is_string(x))
			return flx_error_set(
			    h->err, -EINVAL, s->relpath, "__metadata__",
			    "value of '%s' is not a string", k);
	}
	if (!h->format)
		h->format = json_string_value(json_object_get(v, "format"));
	return 0;
}

static int cmp_data(const void *pa, const void *pb)
{
	const st_entry *a = pa, *b = pb;

	if (a->begin != b->begin)
		return a->begin < b->begin ? -1 : 1;
	if (a->end != b->end)
		return a->end < b->end ? -1 : 1;
	return strcmp(a->name, b->name);
}

/* In data order, the tensors' bytes tile the data exactly: [0, len). */
static int check_layout(hf *h, shard *s, uint64_t len)
{
	uint64_t pos = 0;

	qsort(s->e, s->n, sizeof(*s->e), cmp_data);
	for (size_t i = 0; i < s->n; i++) {
		const st_entry *e = &s->e[i];
		unsigned long long b = e->begin, x = e->end;

		if (e->end < e->begin)
			return flx_error_set(h->err, -EINVAL, s->relpath,
					     e->name,
					     "data_offsets [%llu, %llu) end "
					     "before they begin",
					     b, x);
		if (e->begin < pos)
			return flx_error_set(h->err, -EINVAL, s->relpath,
					     e->name,
					     "data_offsets [%llu, %llu) "
					     "overlap %s's data",
					     b, x, s->e[i - 1].name);
		if (e->begin > pos)
			return flx_error_set(
			    h->err, -EINVAL, s->relpath, e->name,
			    "data_offsets [%llu, %llu) leave bytes [%llu, "
			    "%llu) of the data to no tensor",
			    b, x, (unsigned long long)pos, b);
		if (e->end > len)
			return flx_error_set(h->err, -EINVAL, s->relpath,
					     e->name,
					     "data_offsets [%llu, %llu) run "
					     "past the end of the file (its "
					     "data holds %llu bytes)",
					     b, x, (unsigned long long)len);
		if (e->end - e->begin != e->bytes) {
			char sh[96];

			flx_fmt_dims(sh, sizeof(sh), e->ndim, e->shape);
			return flx_error_set(
			    h->err, -EINVAL, s->relpath, e->name,
			    "data_offsets [%llu, %llu) hold %llu bytes; %s "
			    "%s needs %llu",
			    b, x, x - b, flx_dtype_get(e->dtype)->safetensors,
			    sh, (unsigned long long)e->bytes);
		}
		pos = e->end;
	}
	if (pos != len)
		return flx_error_set(h->err, -EINVAL, s->relpath, NULL,
				     "trailing bytes: %llu after the last "
				     "tensor's data",
				     (unsigned long long)(len - pos));
	return 0;
}

/* Read and check the header of s, recorded as a data file. */
static int load_header(hf *h, shard *s)
{
	const flx_file *f = &h->c->files[s->file];
	unsigned char len8[8];
	uint64_t n = 0;
	char *buf = NULL;
	const char *name;
	json_t *v;
	int rc;

	if (f->size < 8)
		return flx_error_set(h->err, -EINVAL, s->relpath,
				     "header length",
				     "file of %llu bytes has no 8-byte header "
				     "length",
				     (unsigned long long)f->size);
	rc = flx_file_pread(h->c, s->file, len8, 8, 0);
	if (rc)
		return flx_error_set(h->err, rc, s->relpath, NULL,
				     "read failed: %s", strerror(-rc));
	for (int i = 7; i >= 0; i--)
		n = n << 8 | len8[i];
	if (n > MAX_HEADER_BYTES)
		return flx_error_set(h->err, -EINVAL, s->relpath,
				     "header length",
				     "%llu bytes, more than the 100000000 "
				     "safetensors allows",
				     (unsigned long long)n);
	if (n > f->size - 8)
		return flx_error_set(
		    h->err, -EINVAL, s->relpath, "header length",
		    "%llu bytes run past the end of the file "
		    "(%llu bytes)",
		    (unsigned long long)n, (unsigned long long)f->size);
	s->data_start = 8 + n;
	buf = malloc(n ? n : 1);
	if (!buf)
		return -ENOMEM;
	rc = flx_file_pread(h->c, s->file, buf, n, 8);
	if (rc)
		rc = flx_error_set(h->err, rc, s->relpath, NULL,
				   "read failed: %s", strerror(-rc));
	if (!rc)
		rc = flx_json_parse(buf, n, s->relpath, "header", &s->header,
				    h->err);
	free(buf);
	if (rc)
		return rc;
	if (!json_is_object(s->header))
		return flx_error_set(h->err, -EINVAL, s->relpath, "header",
				     "not a JSON object");
	s->e = calloc(json_object_size(s->header) + 1, sizeof(*s->e));
	if (!s->e)
		return -ENOMEM;
	json_object_foreach(s->header, name, v)
	{
		rc = strcmp(name, "__metadata__") == 0
			 ? decode_metadata(h, s, v)
			 : decode_entry(h, s, name, v, &s->e[s->n++]);
		if (rc)
			return rc;
	}
	return check_layout(h, s, f->size - s->data_start);
}

/* With an index: every tensor of s is listed for s. */
static int check_listed(hf *h, const shard *s)
{
	for (size_t i = 0; i < s->n; i++) {
		const char *to = json_string_value(
		    json_object_get(h->weight_map, s->e[i].name));

		if (!to)
			return flx_error_set(
			    h->err, -EINVAL, s->relpath, s->e[i].name,
			    "not listed in " INDEX_NAME "'s weight_map");
		if (strcmp(to, s->relpath) != 0)
			return flx_error_set(h->err, -EINVAL, s->relpath,
					     s->e[i].name,
					     "weight_map places it in %s", to);
	}
	return 0;
}

/* With an index: every listed tensor is in the shard named for it. */
static int check_complete(hf *h)
{
	const char *name;
	json_t *v;

	json_object_foreach(h->weight_map, name, v)
	{
		const char *file = json_string_value(v);
		const shard *s = NULL;

		for (size_t k = 0; k < h->nsh && !s; k++)
			if (strcmp(h->sh[k].relpath, file) == 0)
				s = &h->sh[k];
		/* every file the map names is a shard: s is found */
		if (!s || strcmp(name, "__metadata__") == 0 ||
		    !json_object_get(s->header, name))
			return flx_error_set(h->err, -EINVAL, INDEX_NAME, name,
					     "weight_map lists it in %s, which "
					     "has no such tensor",
					     file);
	}
	return 0;
}

/* ---- the index of tensors ---- */

static int add_tensor(hf *h, const shard *s, const st_entry *e, flx_tensor *t)
{
	flx_ckpt *c = h->c;
	size_t len = strlen(e->name) + 1;
	flx_chunk *ch;
	int64_t step = 1;
	int rc;

	t->fqn = flx_pool_alloc(&c->pool, len);
	if (!t->fqn)
		return -ENOMEM;
	memcpy(t->fqn, e->name, len);
	t->dtype = e->dtype;
	t->ndim = e->ndim;
	memcpy(t->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim);
	rc = flx_tensor_pool_chunks(&c->pool, t, 1);
	if (rc)
		return rc;
	ch = &t->chunks[0];
	for (int d = t->ndim - 1; d >= 0; d--) {
		ch->size[d] = t->shape[d];
		ch->stride[d] = step;
		step *= t->shape[d] ? t->shape[d] : 1;
	}
	ch->file = s->file;
	ch->item_off = ch->data_off = s->data_start + e->begin;
	ch->item_len = e->bytes;
	ch->contig_from = flx_chunk_contig_from(t->ndim, ch);
	return flx_tensor_check_chunks(t, s->relpath, h->err);
}

/* "safetensors" and the writer's __metadata__ format when it is a plain
 * word ("pt"). */
static int set_writer(hf *h)
{
	const char *f = h->format;
	size_t n = f ? strlen(f) : 0;
	bool word = n > 0 && n <= 16;

	for (size_t i = 0; word && i < n; i++)
		word = (f[i] >= 'a' && f[i] <= 'z') ||
		       (f[i] >= 'A' && f[i] <= 'Z') ||
		       (f[i] >= '0' && f[i] <= '9');
	if (word ? asprintf(&h->c->writer, "safetensors (format %s)", f) < 0
		 : !(h->c->writer = strdup("safetensors"))) {
		h->c->writer = NULL;
		return -ENOMEM;
	}
	return 0;
}

static int load(flx_build *b, const flx_ckpt_opts *o, flx_error *err)
{
	hf h = {.b = b, .c = flx_build_ckpt(b), .err = err};
	int dirfd = flx_build_dirfd(b);
	size_t nt = 0;
	int rc = 0;

	(void)o;
	if (flx_build_has(b, dirfd, SINGLE_NAME) &&
	    flx_build_has(b, dirfd, INDEX_NAME)) {
		rc = flx_error_set(err, -EINVAL, INDEX_NAME, NULL,
				   "beside " SINGLE_NAME
				   ": which one is the checkpoint?");
		goto out;
	}
	if (flx_build_has(b, dirfd, INDEX_NAME)) {
		rc = load_index(&h);
	} else {
		h.sh = calloc(1, sizeof(*h.sh));
		if (!h.sh)
			rc = -ENOMEM;
		else
			h.sh[h.nsh++] = (shard){.relpath = SINGLE_NAME};
	}
	flx_build_names_from(b, h.index ? INDEX_NAME : SINGLE_NAME,
			     "the safetensors headers");
	for (size_t k = 0; !rc && k < h.nsh; k++) {
		shard *s = &h.sh[k];
		const flx_file_ref ref = {h.index ? INDEX_NAME : SINGLE_NAME,
					  "weight_map file", s->key};

		rc = flx_build_data_file(b, s->relpath, &ref, &s->file);
		if (!rc)
			rc = load_header(&h, s);
		if (!rc && h.index)
			rc = check_listed(&h, s);
		nt += s->n;
	}
	if (!rc && h.index)
		rc = check_complete(&h);
	if (!rc && !h.index)
		h.c->mtime_ns = h.c->files[h.sh[0].file].mtime_ns;
	if (!rc)
		rc = set_writer(&h);
	if (rc)
		goto out;
	h.c->tensors = calloc(nt ? nt : 1, sizeof(flx_tensor));
	if (!h.c->tensors) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t k = 0; !rc && k < h.nsh; k++)
		for (size_t i = 0; !rc && i < h.sh[k].n; i++)
			rc = add_tensor(&h, &h.sh[k], &h.sh[k].e[i],
					&h.c->tensors[h.c->ntensors++]);
out:
	for (size_t k = 0; k < h.nsh; k++) {
		json_decref(h.sh[k].header);
		free(h.sh[k].e);
	}
	free(h.sh);
	json_decref(h.index);
	return rc;
}

const flx_source flx_source_hf = {
    .name = "hf-safetensors",
    .kind = "Hugging Face safetensors",
    .marker = SINGLE_NAME "[.index.json]",
    .probe = probe,
    .owns = owns,
    .load = load,
};
