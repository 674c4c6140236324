/* SPDX-License-Identifier: MIT */
/*
 * The Megatron-Core zarr source (docs/formats/megatron.md#zarr-backend):
 * metadata.json saying "sharded_backend": "zarr", common.pt (read as for
 * torch_dist, megatron_internal.h), and one directory per key:
 *
 *   <key>/.zarray            a Zarr v2 array: shape (global), chunks (the
 *                            local shard's shape), dtype "<f4", "<f2" or
 *                            "bfloat16", compressor null, order "C"
 *   <key>/0.1.0              the chunk at grid index (0, 1, 0): raw C-order
 *                            elements, prod(chunks) of them (an edge chunk
 *                            too, as Zarr pads it), little-endian
 *   <key>/shard_<o>_<s>.pt   a ShardedObject: torch.save of its value
 *                            ("<key>/shard_<o>_<s>" is its unique key; the
 *                            older with_suffix naming drops the shape's
 *                            last entry,
 * docs/formats/megatron.md#key-namespaces)
 *
 * Every chunk of the grid must exist (fill_value null: Megatron writes
 * them all), each of exactly a chunk's bytes; its elements are served in
 * place.  Anything else in a .zarray (a compressor, filters, order F,
 * another dtype or dimension separator) refuses the mount, naming it.
 * Keys, prepended axes and the chunk grid are torch_dist's, so the
 * stacked axes and every view follow unchanged.  Directories with neither
 * a .zarray nor a shard_*.pt (tokenizer/) are not the checkpoint's; one
 * holding chunk files ("0.1.0") without a .zarray is a tensor whose
 * metadata is missing, and refuses the mount.
 */
#include "json_guard.h"
#include "megatron_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KIND		 "zarr"
#define ZARRAY		 ".zarray"
#define OBJ_PREFIX	 "shard_"
#define OBJ_SUFFIX	 ".pt"
#define MAX_ZARRAY_BYTES (1u << 16)
/* entries of the key directories, all together */
#define MAX_ENTRIES (1u << 24)
/* digits of one offset or shape entry of an object's name */
#define MAX_DIGITS 18

/* The checkpoint's files one level down: "<key>/<name>", sorted, unique. */
typedef struct zlist {
	char **v;
	size_t n, cap;
} zlist;

typedef struct zs {
	flx_build *b;
	flx_ckpt *c;
	flx_error *err;
	zlist l;
} zs;

static int list_add(zs *z, const char *key, const char *name)
{
	zlist *l = &z->l;
	size_t n = strlen(key) + strlen(name) + 2;

	if (l->n >= MAX_ENTRIES)
		return flx_error_set(z->err, -E2BIG, key, NULL,
				     "more than %u files in the key "
				     "directories",
				     MAX_ENTRIES);
	if (flx_grow((void **)&l->v, &l->cap, l->n + 1, sizeof(*l->v)))
		return -ENOMEM;
	if (!(l->v[l->n] = malloc(n)))
		return -ENOMEM;
	snprintf(l->v[l->n++], n, "%s/%s", key, name);
	return 0;
}

/* The entries of subdirectory key (not "." and ".."). */
static int list_key(zs *z, const char *key)
{
	int fd = openat(flx_build_dirfd(z->b), key,
			O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *de;
	int rc = 0;

	if (!d) {
		rc = flx_error_set(z->err, -errno, key, NULL,
				   "cannot list the directory: %s",
				   strerror(errno));
		if (fd >= 0)
			close(fd);
		return rc;
	}
	while (!rc && (de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			rc = list_add(z, key, de->d_name);
	closedir(d);
	return rc;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every "<key>/<name>" of the directory's subdirectories (not hidden, not
 * symlinks) and of the file backend's names, sorted, repeats dropped. */
static int list_all(zs *z)
{
	int fd = openat(flx_build_dirfd(z->b), ".",
			O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	const char *r;
	struct dirent *de;
	size_t k = 0;
	int rc = 0;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return flx_error_set(z->err, -errno, ".", NULL,
				     "cannot list the directory");
	}
	while (!rc && (de = readdir(d))) {
		struct stat st;

		if (de->d_name[0] == '.' ||
		    fstatat(flx_build_dirfd(z->b), de->d_name, &st,
			    AT_SYMLINK_NOFOLLOW) ||
		    !S_ISDIR(st.st_mode))
			continue;
		rc = list_key(z, de->d_name);
	}
	closedir(d);
	for (uint32_t i = 0; !rc && (r = flx_build_remote_name(z->b, i)); i++) {
		const char *slash = strchr(r, '/');
		char key[256];

		if (r[0] == '.' || !slash || strchr(slash + 1, '/') ||
		    !slash[1] || (size_t)(slash - r) >= sizeof(key))
			continue;
		memcpy(key, r, (size_t)(slash - r));
		key[slash - r] = '\0';
		rc = list_add(z, key, slash + 1);
	}
	if (rc || !z->l.n)
		return rc;
	qsort(z->l.v, z->l.n, sizeof(*z->l.v), cmp_str);
	for (size_t i = 1; i < z->l.n; i++) {
		if (!strcmp(z->l.v[i], z->l.v[k])) {
			free(z->l.v[i]);
			continue;
		}
		z->l.v[++k] = z->l.v[i];
	}
	z->l.n = k + 1;
	return 0;
}

static bool listed(const zs *z, const char *rel)
{
	return z->l.n &&
	       bsearch(&rel, z->l.v, z->l.n, sizeof(*z->l.v), cmp_str) != NULL;
}

/* The key of entry i ("<key>/...") and its length. */
static size_t key_len(const char *rel)
{
	return (size_t)(strchr(rel, '/') - rel);
}

static bool ends_with(const char *s, const char *tail)
{
	size_t n = strlen(s), m = strlen(tail);

	return n >= m && !strcmp(s + n - m, tail);
}

/* ---- .zarray ---- */

typedef struct zarray {
	flx_dtype dtype;
	int ndim;
	int64_t shape[FLX_MAX_DIMS];
	int64_t chunks[FLX_MAX_DIMS];
} zarray;

/* A JSON array of at most FLX_MAX_DIMS integers >= min into v. */
static int dims(const json_t *a, int64_t min, int *n, int64_t *v)
{
	size_t i;
	const json_t *e;

	if (!json_is_array(a) || json_array_size(a) > FLX_MAX_DIMS)
		return -1;
	json_array_foreach(a, i, e)
	{
		if (!json_is_integer(e) || json_integer_value(e) < min)
			return -1;
		v[i] = json_integer_value(e);
	}
	*n = (int)json_array_size(a);
	return 0;
}

/* fill_value: only read where a chunk is missing, which refuses the
 * mount; any value Zarr v2 allows is accepted. */
static bool fill_ok(const json_t *v)
{
	const char *s = json_string_value(v);

	return !v || json_is_null(v) || json_is_number(v) ||
	       (s && (!strcmp(s, "NaN") || !strcmp(s, "Infinity") ||
		      !strcmp(s, "-Infinity")));
}

/* The checks of a parsed .zarray (rel names it), in the order of the
 * spec's fields. */
static int check_zarray(const json_t *o, const char *rel, zarray *za,
			flx_error *err)
{
	const json_t *v = json_object_get(o, "zarr_format");
	const char *s;
	int n;

	if (!json_is_integer(v) || json_integer_value(v) != 2)
		return flx_error_set(err, -ENOTSUP, rel, "zarr_format",
				     "not 2 (only Zarr v2 arrays are read)");
	if (dims(json_object_get(o, "shape"), 0, &za->ndim, za->shape))
		return flx_error_set(err, -EINVAL, rel, "shape",
				     "not a list of at most %d non-negative "
				     "integers",
				     FLX_MAX_DIMS);
	if (dims(json_object_get(o, "chunks"), 1, &n, za->chunks) ||
	    n != za->ndim)
		return flx_error_set(err, -EINVAL, rel, "chunks",
				     "not a list of %d positive integers (one "
				     "per axis of shape)",
				     za->ndim);
	s = json_string_value(json_object_get(o, "dtype"));
	za->dtype = !s			     ? FLX_DT_INVALID
		    : !strcmp(s, "<f4")	     ? FLX_DT_F32
		    : !strcmp(s, "<f2")	     ? FLX_DT_F16
		    : !strcmp(s, "bfloat16") ? FLX_DT_BF16
					     : FLX_DT_INVALID;
	if (za->dtype == FLX_DT_INVALID)
		return flx_error_set(err, s ? -ENOTSUP : -EINVAL, rel, "dtype",
				     "'%.32s' is not supported (<f4, <f2 or "
				     "bfloat16)",
				     s ? s : "(not a string)");
	v = json_object_get(o, "compressor");
	if (!v)
		return flx_error_set(err, -EINVAL, rel, "compressor",
				     "missing");
	if (!json_is_null(v))
		return flx_error_set(err, -ENOTSUP, rel, "compressor",
				     "not null (compressed chunks are not "
				     "supported)");
	if (!fill_ok(json_object_get(o, "fill_value")))
		return flx_error_set(err, -EINVAL, rel, "fill_value",
				     "not null, a number, NaN or Infinity");
	s = json_string_value(json_object_get(o, "order"));
	if (!s || strcmp(s, "C"))
		return flx_error_set(err, -ENOTSUP, rel, "order",
				     "'%.8s' is not supported (only C order)",
				     s ? s : "(not a string)");
	v = json_object_get(o, "filters");
	if (v && !json_is_null(v) &&
	    !(json_is_array(v) && json_array_size(v) == 0))
		return flx_error_set(err, -ENOTSUP, rel, "filters",
				     "not null (filters are not supported)");
	v = json_object_get(o, "dimension_separator");
	s = json_string_value(v);
	if (v && (!s || strcmp(s, ".")))
		return flx_error_set(err, -ENOTSUP, rel, "dimension_separator",
				     "'%.8s' is not supported (only '.': "
				     "chunk files named 0.1.0)",
				     s ? s : "(not a string)");
	return 0;
}

/* Read and check rel, a .zarray (a data file, so that a remote one is
 * read too). */
static int load_zarray(zs *z, const char *rel, const char *key, zarray *za)
{
	const flx_file_ref ref = {.from = rel, .field = "file", .key = key};
	flx_error *err = z->err;
	json_error_t je;
	json_t *root = NULL;
	char *buf = NULL;
	uint64_t size;
	uint32_t idx;
	int rc;

	rc = flx_build_data_file(z->b, rel, &ref, &idx);
	if (rc)
		return rc;
	size = z->c->files[idx].size;
	if (size > MAX_ZARRAY_BYTES)
		return flx_error_set(err, -EINVAL, rel, NULL,
				     "larger than %u KiB",
				     MAX_ZARRAY_BYTES >> 10);
	if (!(buf = malloc(size + 1)))
		return -ENOMEM;
	rc = flx_file_pread(z->c, idx, buf, size, 0);
	if (rc) {
		rc = flx_error_set(err, rc, rel, NULL, "cannot read: %s",
				   strerror(-rc));
		goto out;
	}
	flx_json_guard_begin();
	root = json_loadb(buf, size, JSON_REJECT_DUPLICATES, &je);
	if (flx_json_guard_failed()) {
		rc = -ENOMEM;
		goto out;
	}
	if (!root)
		rc = flx_error_set(err, -EINVAL, rel, NULL,
				   "not valid JSON: line %d column %d: %s",
				   je.line, je.column, je.text);
	else if (!json_is_object(root))
		rc =
		    flx_error_set(err, -EINVAL, rel, NULL, "not a JSON object");
	else
		rc = check_zarray(root, rel, za, err);
out:
	json_decref(root);
	free(buf);
	return rc;
}

/* ---- arrays ---- */

/* Chunk file name of grid index g (n axes): "0.1.0"; "0" for n 0. */
static void chunk_name(char *out, size_t cap, const char *key, int n,
		       const int64_t *g)
{
	int at = snprintf(out, cap, "%s/", key);

	if (n == 0)
		snprintf(out + at, cap - (size_t)at, "0");
	for (int d = 0; d < n && (size_t)at < cap; d++)
		at += snprintf(out + at, cap - (size_t)at, "%s%lld",
			       d ? "." : "", (long long)g[d]);
}

/* Grid extent per axis and the number of chunks, bounded by the files
 * the key directory has (each chunk is one). */
static int grid(zs *z, const char *rel, const zarray *za, size_t files,
		int64_t *per, uint32_t *n)
{
	uint64_t total = 1;

	for (int d = 0; d < za->ndim; d++) {
		per[d] = za->shape[d] / za->chunks[d] +
			 (za->shape[d] % za->chunks[d] != 0);
		total = per[d] ? total : 0;
	}
	for (int d = 0; d < za->ndim && total; d++) {
		/* total <= files before, per[d] <= files: no overflow */
		total = (uint64_t)per[d] > files ? UINT64_MAX
						 : total * (uint64_t)per[d];
		if (total > files)
			return flx_error_set(
			    z->err, -ENOENT, rel, "chunks",
			    "a grid of more chunks than the directory "
			    "has files (%zu): chunks are missing",
			    files);
	}
	*n = (uint32_t)total;
	return 0;
}

/* Tensor t from key's .zarray and its chunk files (files: how many
 * entries the key's directory has). */
static int load_array(zs *z, const char *key, size_t files, flx_tensor *t)
{
	char rel[320], cname[640];
	int64_t per[FLX_MAX_DIMS], g[FLX_MAX_DIMS] = {0}, st[FLX_MAX_DIMS];
	uint64_t cbytes;
	int64_t k = 1;
	uint32_t n = 0;
	zarray za;
	size_t klen = strlen(key) + 1;
	int rc;

	snprintf(rel, sizeof(rel), "%s/" ZARRAY, key);
	rc = load_zarray(z, rel, key, &za);
	if (rc)
		return rc;
	if (flx_shape_bytes(za.ndim, za.shape, flx_dtype_size(za.dtype), NULL,
			    NULL) ||
	    flx_shape_bytes(za.ndim, za.chunks, flx_dtype_size(za.dtype), NULL,
			    &cbytes))
		return flx_error_set(z->err, -EOVERFLOW, rel, "shape",
				     "its size or a chunk's overflows 63 "
				     "bits");
	rc = grid(z, rel, &za, files, per, &n);
	if (rc)
		return rc;
	if (!(t->fqn = flx_pool_alloc(&z->c->pool, klen)))
		return -ENOMEM;
	memcpy(t->fqn, key, klen);
	t->dtype = za.dtype;
	t->ndim = za.ndim;
	memcpy(t->shape, za.shape, sizeof(int64_t) * (size_t)za.ndim);
	rc = flx_tensor_pool_chunks(&z->c->pool, t, n);
	if (rc)
		return rc;
	for (int d = za.ndim - 1; d >= 0; d--) {
		st[d] = k;
		k *= za.chunks[d];
	}
	for (uint32_t i = 0; i < n; i++) {
		const flx_file_ref ref = {
		    .from = rel, .field = "chunk", .key = key};
		flx_chunk *ch = &t->chunks[i];
		uint32_t idx;

		chunk_name(cname, sizeof(cname), key, za.ndim, g);
		if (!listed(z, cname))
			return flx_error_set(z->err, -ENOENT, cname, key,
					     "missing chunk (every chunk of "
					     "the grid is written)");
		rc = flx_build_data_file(z->b, cname, &ref, &idx);
		if (rc)
			return rc;
		if (z->c->files[idx].size != cbytes)
			return flx_error_set(
			    z->err, -EINVAL, cname, key,
			    "%llu bytes, not a chunk's %llu",
			    (unsigned long long)z->c->files[idx].size,
			    (unsigned long long)cbytes);
		for (int d = 0; d < za.ndim; d++) {
			ch->off[d] = g[d] * za.chunks[d];
			ch->size[d] = za.shape[d] - ch->off[d] < za.chunks[d]
					  ? za.shape[d] - ch->off[d]
					  : za.chunks[d];
			ch->stride[d] = st[d];
		}
		ch->file = idx;
		ch->item_len = cbytes;
		ch->contig_from = flx_chunk_contig_from(za.ndim, ch);
		/* the next grid index, row-major */
		for (int d = za.ndim - 1; d >= 0; d--) {
			if (++g[d] < per[d])
				break;
			g[d] = 0;
		}
	}
	return flx_tensor_check_chunks(t, rel, z->err);
}

/* ---- objects ---- */

/* A '.'-separated list of at most FLX_MAX_DIMS decimal numbers from *p
 * up to stop; *p past it, the count into *n.  @return 0 or -1. */
static int numbers(const char **p, char stop, int *n)
{
	const char *s = *p;

	*n = 0;
	for (;;) {
		size_t digits = 0;

		while (s[digits] >= '0' && s[digits] <= '9')
			digits++;
		if (!digits || digits > MAX_DIGITS || ++*n > FLX_MAX_DIMS)
			return -1;
		s += digits;
		if (*s != '.')
			break;
		s++;
	}
	if (*s != stop)
		return -1;
	*p = s;
	return 0;
}

/* An object file's name (within its key directory) is
 * shard_<offsets>_<shape>.pt: the shape as many entries as the offsets,
 * or one fewer (the older with_suffix naming,
 * docs/formats/megatron.md#key-namespaces). */
static bool object_name_ok(const char *name)
{
	char stem[256];
	size_t n = strlen(name) - strlen(OBJ_SUFFIX);
	const char *p = stem + strlen(OBJ_PREFIX);
	int no, ns;

	if (n >= sizeof(stem))
		return false;
	memcpy(stem, name, n);
	stem[n] = '\0';
	if (numbers(&p, '_', &no))
		return false;
	p++;
	if (numbers(&p, '\0', &ns))
		return false;
	return ns == no || ns + 1 == no;
}

static bool is_object(const char *name)
{
	return !strncmp(name, OBJ_PREFIX, strlen(OBJ_PREFIX)) &&
	       ends_with(name, OBJ_SUFFIX);
}

/* Object o from rel, "<key>/shard_<...>.pt": its unique key is rel less
 * ".pt"; its value the whole file. */
static int load_object(zs *z, const char *rel, size_t klen, flx_object *o)
{
	const flx_file_ref ref = {.from = rel, .field = "file", .key = NULL};
	size_t n = strlen(rel) - strlen(OBJ_SUFFIX);
	uint32_t idx;
	int rc;

	if (!object_name_ok(rel + klen + 1))
		return flx_error_set(z->err, -EINVAL, rel, NULL,
				     "not a ShardedObject file name "
				     "(shard_<offsets>_<shape>.pt)");
	rc = flx_build_data_file(z->b, rel, &ref, &idx);
	if (rc)
		return rc;
	if (!(o->fqn = flx_pool_alloc(&z->c->pool, n + 1)))
		return -ENOMEM;
	memcpy(o->fqn, rel, n);
	o->fqn[n] = '\0';
	o->file = idx;
	o->len = z->c->files[idx].size;
	return 0;
}

/* ---- the source ---- */

/* Whether name is a chunk file's ("0", "0.1.0": grid indices). */
static bool is_chunk(const char *name)
{
	if (!(*name >= '0' && *name <= '9'))
		return false;
	for (; *name; name++)
		if (!(*name >= '0' && *name <= '9') && *name != '.')
			return false;
	return name[-1] != '.';
}

/* Each key directory's tensor (a .zarray) and objects (shard_*.pt), in
 * name order. */
static int load_keys(zs *z)
{
	size_t nt = 0, no = 0;
	int rc = 0;

	for (size_t i = 0; i < z->l.n; i++) {
		const char *name = z->l.v[i] + key_len(z->l.v[i]) + 1;

		nt += !strcmp(name, ZARRAY);
		no += is_object(name);
	}
	z->c->tensors = calloc(nt ? nt : 1, sizeof(flx_tensor));
	z->c->objects = calloc(no ? no : 1, sizeof(flx_object));
	if (!z->c->tensors || !z->c->objects)
		return -ENOMEM;
	if (!nt && !no)
		return flx_error_set(z->err, -ENOENT, FLX_MCORE_CONFIG,
				     "sharded_backend",
				     "'zarr', but no subdirectory holds an "
				     "array (<key>/.zarray) or an object "
				     "(<key>/shard_*.pt)");
	for (size_t i = 0, j; !rc && i < z->l.n; i = j) {
		size_t klen = key_len(z->l.v[i]);
		char key[256];

		for (j = i; j < z->l.n && key_len(z->l.v[j]) == klen &&
			    !strncmp(z->l.v[j], z->l.v[i], klen);
		     j++)
			;
		if (klen >= sizeof(key))
			return flx_error_set(z->err, -ENAMETOOLONG, z->l.v[i],
					     NULL,
					     "a key longer than 255 bytes");
		memcpy(key, z->l.v[i], klen);
		key[klen] = '\0';
		for (size_t k = i, arr = 0; k < j; k++) {
			const char *name = z->l.v[k] + klen + 1;

			arr += !strcmp(name, ZARRAY);
			if (!arr && k + 1 == j) {
				/* a tensor whose metadata is missing would be
				 * dropped silently */
				for (size_t m = i; m < j; m++)
					if (is_chunk(z->l.v[m] + klen + 1))
						return flx_error_set(
						    z->err, -ENOENT, z->l.v[m],
						    NULL,
						    "a chunk file, but no "
						    "%s/%s "
						    "describes its array",
						    key, ZARRAY);
			}
		}
		for (size_t k = i; !rc && k < j; k++) {
			const char *name = z->l.v[k] + klen + 1;

			if (!strcmp(name, ZARRAY))
				rc = load_array(
				    z, key, j - i,
				    &z->c->tensors[z->c->ntensors++]);
			else if (is_object(name))
				rc = load_object(
				    z, z->l.v[k], klen,
				    &z->c->objects[z->c->nobjects++]);
		}
	}
	return rc;
}

static int load(flx_build *b, const flx_ckpt_opts *o, flx_error *err)
{
	zs z = {.b = b, .c = flx_build_ckpt(b), .err = err};
	int rc;

	rc = flx_mcore_config(b, KIND, &z.c->mtime_ns, err);
	if (!rc)
		rc = list_all(&z);
	if (!rc)
		rc = load_keys(&z);
	flx_build_names_from(b, "the key directories", "the key directories");
	if (!rc)
		rc = flx_mcore_finish(b, KIND, true, o, err);
	for (size_t i = 0; i < z.l.n; i++)
		free(z.l.v[i]);
	free(z.l.v);
	return rc;
}

/* metadata.json and common.pt without a .metadata: torch_dist has one. */
static int probe(int dirfd, bool *yes)
{
	*yes = flx_mcore_exists(dirfd, FLX_MCORE_CONFIG) &&
	       flx_mcore_exists(dirfd, FLX_MCORE_COMMON) &&
	       !flx_mcore_exists(dirfd, ".metadata");
	return 0;
}

static bool owns(const char *name)
{
	return !strcmp(name, FLX_MCORE_CONFIG) ||
	       !strcmp(name, FLX_MCORE_COMMON);
}

const flx_source flx_source_megatron_zarr = {
    .name = "megatron-zarr",
    .kind = "Megatron-Core zarr",
    .marker = FLX_MCORE_CONFIG,
    .variant = true,
    .probe = probe,
    .owns = owns,
    .load = load,
    .metadata = FLX_MCORE_CONFIG,
    .enter = flx_mcore_enter,
    .opts = &flx_mcore_opts,
    .fact = flx_mcore_fact,
    .facts = flx_mcore_facts,
};
