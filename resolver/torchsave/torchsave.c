/* SPDX-License-Identifier: MIT */
/*
 * The torch.save source (source.h): checkpoints written by torch.save, zip
 * (torch >= 1.6) or legacy, read in place through resolver/codec/
 * torchfile.h; docs/formats/torch-save-source.md.
 *
 * Which file(s), in this order:
 *  1. "pytorch_model.bin.index.json": the shards its weight_map names
 *     (transformers' sharded .bin), checked both ways: every tensor of a
 *     shard is listed for that shard, every listed tensor is in it;
 *  2. "pytorch_model.bin";
 *  3. otherwise the one regular file whose name ends in ".pt", ".pth" or
 *     ".bin"; several are refused, naming them (nothing would tell which).
 * Both 1 and 2 present are refused too.  Other files are extras.
 *
 * What is served, from the file's root object:
 *  - a dict with a key "model", "state_dict" or "module" (looked for in
 *    that order) whose value is a dict holding a tensor: a training
 *    checkpoint.  That dict's tensors are served under their own keys;
 *    every tensor under the other top-level keys under its dotted path
 *    ("optimizer.state.0.exp_avg": key, then dict keys and list indices);
 *    two such keys both holding tensors are refused (which is the model?);
 *  - any other dict: a state dict, its tensors (and any under dicts and
 *    lists inside it) under their dotted keys.
 * Each tensor is one chunk located in place: the storage's file offset,
 * the storage offset and the saved strides (a transposed tensor is served
 * contiguous by the view layer); tied tensors share bytes.  Values that are
 * not tensors are not served (the writer string names where the state
 * dict was found; docs say which values are left).  A tensor inside any
 * other object (a custom class) is refused: it would be dropped.
 */
#include "reader.h"
#include "source.h"
#include "torchfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_guard.h"

#define SINGLE_NAME	"pytorch_model.bin"
#define INDEX_NAME	"pytorch_model.bin.index.json"
#define MAX_INDEX_BYTES (64u << 20)
#define MAX_NAME	4096
/* The most candidate files named in an "ambiguous" message. */
#define NAMES_SHOWN 4

static const char *const model_keys[] = {"model", "state_dict", "module"};

typedef struct ts {
	flx_build *b;
	flx_ckpt *c;
	flx_error *err;
	json_t *index; /* NULL: one file */
	json_t *weight_map;
	const char *relpath; /* the file being read */
	uint32_t file;
	const flx_torchfile *tf;
	size_t cap; /* room in c->tensors */
	/* where the state dict was: "" (the root), or its key */
	const char *under;
	bool under_mixed; /* several files disagree */
	bool legacy, zip;
	char path[MAX_NAME];
} ts;

/* ---- names ---- */

static bool ends_with(const char *s, const char *suf)
{
	size_t n = strlen(s), m = strlen(suf);

	return n > m && strcmp(s + n - m, suf) == 0;
}

/* pytorch_model-<digits>-of-<digits>.bin */
static bool is_shard_name(const char *name)
{
	const char *p = name;
	size_t d;

	if (strncmp(p, "pytorch_model-", 14) != 0)
		return false;
	p += 14;
	d = strspn(p, "0123456789");
	if (!d || strncmp(p + d, "-of-", 4) != 0)
		return false;
	p += d + 4;
	d = strspn(p, "0123456789");
	return d && strcmp(p + d, ".bin") == 0;
}

static bool is_candidate(const char *name)
{
	return name[0] != '.' &&
	       (ends_with(name, ".pt") || ends_with(name, ".pth") ||
		ends_with(name, ".bin"));
}

static bool owns(const char *name)
{
	return strcmp(name, SINGLE_NAME) == 0 ||
	       strcmp(name, INDEX_NAME) == 0 || is_shard_name(name);
}

static bool exists(int dirfd, const char *name)
{
	struct stat st;

	return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ||
	       errno != ENOENT;
}

static bool has(const flx_build *b, int dirfd, const char *name)
{
	return exists(dirfd, name) || flx_build_remote(b, name);
}

/* Whether the directory has a regular file (or a link) with a candidate
 * name; looks at names and types only. */
static int probe(int dirfd, bool *yes)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;
	struct dirent *de;

	*yes = exists(dirfd, SINGLE_NAME) || exists(dirfd, INDEX_NAME);
	if (*yes)
		return 0;
	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		int e = -errno;

		close(fd);
		return e;
	}
	while (!*yes && (de = readdir(d)))
		*yes = (de->d_type == DT_REG || de->d_type == DT_LNK ||
			de->d_type == DT_UNKNOWN) &&
		       is_candidate(de->d_name);
	closedir(d);
	return 0;
}

/* ---- tensors ---- */

static int add_tensor(ts *s, const char *name, const flx_pv *v)
{
	flx_ckpt *c = s->c;
	flx_torchfile_tensor t;
	flx_tensor *x;
	flx_chunk *ch;
	size_t len = strlen(name) + 1;
	int rc;

	rc = flx_torchfile_resolve(s->tf, v, name, &t, s->err);
	if (rc)
		return rc;
	if (s->index) {
		const char *to =
		    json_string_value(json_object_get(s->weight_map, name));

		if (!to)
			return flx_error_set(s->err, -EINVAL, s->relpath, name,
					     "not listed in " INDEX_NAME
					     "'s weight_map");
		if (strcmp(to, s->relpath) != 0)
			return flx_error_set(s->err, -EINVAL, s->relpath, name,
					     "weight_map places it in %s", to);
	}
	if (c->ntensors == s->cap) {
		size_t nc = s->cap ? s->cap * 2 : 64;
		flx_tensor *nt = realloc(c->tensors, nc * sizeof(*nt));

		if (!nt)
			return -ENOMEM;
		c->tensors = nt;
		s->cap = nc;
	}
	x = &c->tensors[c->ntensors];
	memset(x, 0, sizeof(*x));
	x->fqn = flx_pool_alloc(&c->pool, len);
	if (!x->fqn)
		return -ENOMEM;
	memcpy(x->fqn, name, len);
	x->dtype = t.t.dtype;
	x->ndim = t.t.ndim;
	memcpy(x->shape, t.t.size, sizeof(int64_t) * (size_t)t.t.ndim);
	rc = flx_tensor_pool_chunks(&c->pool, x, 1);
	if (rc)
		return rc;
	c->ntensors++;
	ch = &x->chunks[0];
	for (int d = 0; d < x->ndim; d++) {
		ch->size[d] = x->shape[d];
		ch->stride[d] = t.t.stride[d];
	}
	ch->file = s->file;
	ch->data_off = t.data_off;
	ch->storage_offset = t.t.storage_offset;
	ch->item_off = t.data_off;
	ch->item_len = flx_torchfile_storage(s->tf, t.storage)->bytes;
	ch->contig_from = flx_chunk_contig_from(x->ndim, ch);
	return flx_tensor_check_chunks(x, s->relpath, s->err);
}

/* Whether v holds a tensor anywhere (bounded as the torchfile walk). */
static bool holds_tensor(const flx_pv *v, unsigned depth, uint64_t *budget)
{
	if (!v || depth > FLX_PV_MAX_WALK_DEPTH || !*budget)
		return false;
	--*budget;
	switch (v->kind) {
	case FLX_PV_TUPLE:
	case FLX_PV_LIST:
	case FLX_PV_SET:
		for (size_t i = 0; i < v->u.seq.n; i++)
			if (holds_tensor(v->u.seq.v[i], depth + 1, budget))
				return true;
		return false;
	case FLX_PV_DICT:
		for (size_t i = 0; i < v->u.dict.n; i++)
			if (holds_tensor(v->u.dict.kv[2 * i + 1], depth + 1,
					 budget))
				return true;
		return false;
	case FLX_PV_OBJ:
		if (flx_torchfile_is_tensor(v))
			return true;
		return holds_tensor(v->u.obj.args, depth + 1, budget) ||
		       holds_tensor(v->u.obj.state, depth + 1, budget);
	default:
		return false;
	}
}

static int walk(ts *s, const flx_pv *v, unsigned depth);

static int walk_child(ts *s, const flx_pv *v, const char *comp, size_t clen,
		      unsigned depth)
{
	size_t len = strlen(s->path);
	int rc;

	if (len + (len ? 1 : 0) + clen >= sizeof(s->path))
		return flx_error_set(s->err, -EINVAL, s->relpath, s->path,
				     "key path longer than %d bytes", MAX_NAME);
	if (len)
		s->path[len++] = '.';
	memcpy(s->path + len, comp, clen);
	s->path[len + clen] = '\0';
	rc = walk(s, v, depth + 1);
	s->path[len ? len - 1 : 0] = '\0';
	return rc;
}

static int walk(ts *s, const flx_pv *v, unsigned depth)
{
	char idx[24];
	int rc;

	if (!v)
		return 0;
	if (depth > FLX_PV_MAX_WALK_DEPTH)
		return flx_error_set(s->err, -EINVAL, s->relpath, s->path,
				     "nested deeper than %d",
				     FLX_PV_MAX_WALK_DEPTH);
	switch (v->kind) {
	case FLX_PV_TUPLE:
	case FLX_PV_LIST:
	case FLX_PV_SET:
		for (size_t i = 0; i < v->u.seq.n; i++) {
			int n = snprintf(idx, sizeof(idx), "%zu", i);

			if ((rc = walk_child(s, v->u.seq.v[i], idx, (size_t)n,
					     depth)))
				return rc;
		}
		return 0;
	case FLX_PV_DICT:
		for (size_t i = 0; i < v->u.dict.n; i++) {
			const flx_pv *k = v->u.dict.kv[2 * i];
			const flx_pv *val = v->u.dict.kv[2 * i + 1];
			const char *ks = flx_pv_str(k);
			size_t kl = ks ? k->u.str.len : 0;
			int64_t ki;

			if (!ks && flx_pv_int(k, &ki) &&
			    k->kind == FLX_PV_INT) {
				kl = (size_t)snprintf(idx, sizeof(idx),
						      "%" PRId64, ki);
				ks = idx;
			}
			if (ks && (strlen(ks) != kl || kl == 0))
				ks = NULL;
			if (!ks) {
				uint64_t budget = 1u << 20;

				if (!holds_tensor(val, depth + 1, &budget))
					continue;
				return flx_error_set(
				    s->err, -EINVAL, s->relpath, s->path,
				    "a key that is a %s (not a str or int) "
				    "leads to a tensor",
				    flx_pv_kind_name(k));
			}
			if ((rc = walk_child(s, val, ks, kl, depth)))
				return rc;
		}
		return 0;
	case FLX_PV_OBJ: {
		uint64_t budget = 1u << 20;
		const flx_pv *cls;

		if (flx_torchfile_is_tensor(v))
			return add_tensor(s, s->path, v);
		if (!holds_tensor(v, depth, &budget))
			return 0;
		cls = flx_pv_obj_class(v);
		return flx_error_set(s->err, -EINVAL, s->relpath, s->path,
				     "a tensor inside a %s%s%s object: not "
				     "supported",
				     cls ? cls->u.global.module : "?",
				     cls ? "." : "",
				     cls ? cls->u.global.name : "");
	}
	default:
		return 0;
	}
}

/* Whether v is a dict with at least one tensor value. */
static bool is_state_dict(const flx_pv *v)
{
	if (!v || v->kind != FLX_PV_DICT)
		return false;
	for (size_t i = 0; i < v->u.dict.n; i++)
		if (flx_torchfile_is_tensor(v->u.dict.kv[2 * i + 1]))
			return true;
	return false;
}

/* Serve the tensors of one file's root. */
static int load_root(ts *s)
{
	const flx_pv *root = flx_torchfile_root(s->tf), *sd = NULL;
	const char *under = "";
	int rc;

	if (!root || root->kind != FLX_PV_DICT)
		return flx_error_set(s->err, -EINVAL, s->relpath, NULL,
				     "the saved object is a %s, not a dict "
				     "(a state dict or a training checkpoint)",
				     flx_pv_kind_name(root));
	for (size_t k = 0; k < sizeof(model_keys) / sizeof(*model_keys); k++) {
		const flx_pv *v = flx_pv_dict_get(root, model_keys[k]);

		if (!is_state_dict(v))
			continue;
		if (sd)
			return flx_error_set(
			    s->err, -EINVAL, s->relpath, model_keys[k],
			    "holds a state dict, and so does '%s': which "
			    "is the model?",
			    under);
		sd = v;
		under = model_keys[k];
	}
	if (s->under && strcmp(s->under, under) != 0)
		s->under_mixed = true;
	s->under = under;
	s->path[0] = '\0';
	if (!sd)
		return walk(s, root, 0);
	if ((rc = walk(s, sd, 1)))
		return rc;
	for (size_t i = 0; i < root->u.dict.n; i++) {
		const flx_pv *k = root->u.dict.kv[2 * i];

		if (root->u.dict.kv[2 * i + 1] == sd && flx_pv_str(k) &&
		    strcmp(flx_pv_str(k), under) == 0)
			continue;
		/* the other top-level entries, each under its key */
		rc = walk(s,
			  &(flx_pv){.kind = FLX_PV_DICT,
				    .u.dict = {.kv = root->u.dict.kv + 2 * i,
					       .n = 1}},
			  0);
		if (rc)
			return rc;
	}
	return 0;
}

/* Open file relpath (ref: who names it) and serve its tensors. */
static int load_file(ts *s, const char *relpath, const flx_file_ref *ref)
{
	flx_file_reader fr;
	flx_reader r;
	flx_torchfile *tf = NULL;
	int rc;

	rc = flx_build_data_file(s->b, relpath, ref, &s->file);
	if (rc)
		return rc;
	s->relpath = relpath;
	flx_reader_file(&r, &fr, s->c, s->file, 0, s->c->files[s->file].size);
	rc = flx_torchfile_open(&r, relpath, &tf, s->err);
	if (rc)
		return rc;
	if (flx_torchfile_kind_of(tf) == FLX_TORCHFILE_LEGACY)
		s->legacy = true;
	else
		s->zip = true;
	s->tf = tf;
	rc = load_root(s);
	s->tf = NULL;
	flx_torchfile_close(tf);
	return rc;
}

/* ---- which files ---- */

static int load_index(ts *s, const char ***files, size_t *nfiles)
{
	json_error_t je;
	const char *name;
	json_t *v;
	void *buf = NULL;
	size_t len = 0, n = 0;
	int rc = flx_build_read_whole(s->b, INDEX_NAME, MAX_INDEX_BYTES, NULL,
				      &buf, &len, &s->c->mtime_ns, s->err);

	if (rc)
		return rc;
	flx_json_guard_begin();
	s->index = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	free(buf);
	if (flx_json_guard_failed())
		return -ENOMEM;
	if (!s->index)
		return flx_error_set(s->err, -EINVAL, INDEX_NAME, NULL,
				     "not valid JSON: line %d column %d: %s",
				     je.line, je.column, je.text);
	s->weight_map = json_object_get(s->index, "weight_map");
	if (!json_is_object(s->index) || !json_is_object(s->weight_map))
		return flx_error_set(s->err, -EINVAL, INDEX_NAME, "weight_map",
				     "missing, or not an object");
	*files = calloc(json_object_size(s->weight_map) + 1, sizeof(char *));
	if (!*files)
		return -ENOMEM;
	json_object_foreach(s->weight_map, name, v)
	{
		const char *file = json_string_value(v);
		size_t k;

		if (!file)
			return flx_error_set(s->err, -EINVAL, INDEX_NAME, name,
					     "weight_map value is not a file "
					     "name");
		for (k = 0; k < n && strcmp((*files)[k], file) != 0; k++)
			;
		if (k == n)
			(*files)[n++] = file;
	}
	*nfiles = n;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The one candidate file of the directory (or of the backend's names). */
static int find_single(ts *s, char **out)
{
	int fd = openat(flx_build_dirfd(s->b), ".",
			O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char *names[NAMES_SHOWN + 1] = {0}, list[512];
	size_t n = 0;
	DIR *d;
	struct dirent *de;
	int rc = 0;

	if (fd < 0)
		return flx_error_set(s->err, -errno, ".", NULL,
				     "cannot list the directory: %s",
				     strerror(errno));
	d = fdopendir(fd);
	if (!d) {
		rc = -errno;
		close(fd);
		return flx_error_set(s->err, rc, ".", NULL,
				     "cannot list the directory: %s",
				     strerror(-rc));
	}
	while ((de = readdir(d))) {
		struct stat st;

		if (!is_candidate(de->d_name) ||
		    fstatat(flx_build_dirfd(s->b), de->d_name, &st, 0) != 0 ||
		    !S_ISREG(st.st_mode))
			continue;
		if (n < NAMES_SHOWN + 1 && !(names[n] = strdup(de->d_name))) {
			rc = -ENOMEM;
			break;
		}
		n++;
	}
	closedir(d);
	for (uint32_t id = 0; !rc; id++) {
		const char *rn = flx_build_remote_name(s->b, id);

		if (!rn)
			break;
		if (strchr(rn, '/') || !is_candidate(rn))
			continue;
		bool dup = false;

		for (size_t k = 0; k < n && k <= NAMES_SHOWN && names[k]; k++)
			dup = dup || strcmp(names[k], rn) == 0;
		if (dup)
			continue;
		if (n < NAMES_SHOWN + 1 && !(names[n] = strdup(rn))) {
			rc = -ENOMEM;
			break;
		}
		n++;
	}
	if (!rc && n == 0)
		rc = flx_error_set(s->err, -ENOENT, SINGLE_NAME, NULL,
				   "no torch.save file (" SINGLE_NAME
				   ", " INDEX_NAME ", *.pt, *.pth, *.bin)");
	if (!rc && n > 1) {
		size_t m = n < NAMES_SHOWN ? n : NAMES_SHOWN, o = 0;

		qsort(names, m, sizeof(*names), cmp_str);
		list[0] = '\0';
		for (size_t k = 0; k < m && o < sizeof(list); k++)
			o += (size_t)snprintf(list + o, sizeof(list) - o,
					      "%s%s", k ? ", " : "", names[k]);
		rc = flx_error_set(s->err, -EINVAL, names[0], NULL,
				   "%zu torch.save files in the directory "
				   "(%s%s): which one is the checkpoint? Mount "
				   "a directory holding only it",
				   n, list, n > m ? ", ..." : "");
	}
	if (!rc) {
		*out = names[0];
		names[0] = NULL;
	}
	for (size_t k = 0; k <= NAMES_SHOWN; k++)
		free(names[k]);
	return rc;
}

/* With an index: every listed tensor was found in its shard. */
static int check_complete(ts *s)
{
	const char *name;
	json_t *v;

	/* each tensor served was listed for its shard, and names are
	 * unique (the builder checks): equal counts mean every listed one
	 * was found; otherwise name the first missing */
	if (json_object_size(s->weight_map) == s->c->ntensors)
		return 0;
	json_object_foreach(s->weight_map, name, v)
	{
		const flx_tensor *t = NULL;

		for (size_t i = 0; i < s->c->ntensors && !t; i++)
			if (strcmp(s->c->tensors[i].fqn, name) == 0)
				t = &s->c->tensors[i];
		if (!t)
			return flx_error_set(s->err, -EINVAL, INDEX_NAME, name,
					     "weight_map lists it in %s, which "
					     "has no such tensor",
					     json_string_value(v));
	}
	return 0;
}

static int set_writer(ts *s)
{
	const char *fmt = s->legacy && s->zip ? "zip and legacy"
			  : s->legacy	      ? "legacy (before torch 1.6)"
					      : "zip (torch >= 1.6)";
	int n;

	if (s->under && *s->under && !s->under_mixed)
		n = asprintf(&s->c->writer,
			     "torch.save %s; state dict under '%s'", fmt,
			     s->under);
	else
		n = asprintf(&s->c->writer, "torch.save %s", fmt);
	if (n < 0) {
		s->c->writer = NULL;
		return -ENOMEM;
	}
	return 0;
}

static int load(flx_build *b, const flx_ckpt_opts *o, flx_error *err)
{
	ts s = {.b = b, .c = flx_build_ckpt(b), .err = err};
	int dirfd = flx_build_dirfd(b);
	const char **files = NULL;
	char *single = NULL;
	size_t nfiles = 0;
	int rc = 0;

	(void)o;
	if (has(b, dirfd, SINGLE_NAME) && has(b, dirfd, INDEX_NAME)) {
		rc = flx_error_set(err, -EINVAL, INDEX_NAME, NULL,
				   "beside " SINGLE_NAME
				   ": which one is the checkpoint?");
		goto out;
	}
	if (has(b, dirfd, INDEX_NAME)) {
		rc = load_index(&s, &files, &nfiles);
		if (!rc)
			qsort(files, nfiles, sizeof(*files), cmp_str);
		flx_build_names_from(b, INDEX_NAME, "the shards");
		for (size_t k = 0; !rc && k < nfiles; k++) {
			const flx_file_ref ref = {INDEX_NAME, "weight_map file",
						  NULL};

			rc = load_file(&s, files[k], &ref);
		}
		if (!rc)
			rc = check_complete(&s);
	} else {
		const flx_file_ref ref = {".", "file name", NULL};

		if (has(b, dirfd, SINGLE_NAME))
			single = strdup(SINGLE_NAME);
		else
			rc = find_single(&s, &single);
		if (!rc && !single)
			rc = -ENOMEM;
		if (!rc) {
			flx_build_names_from(b, single, "the saved object");
			rc = load_file(&s, single, &ref);
		}
		if (!rc)
			s.c->mtime_ns = s.c->files[s.file].mtime_ns;
	}
	if (!rc)
		rc = set_writer(&s);
out:
	free(files);
	free(single);
	json_decref(s.index);
	return rc;
}

const flx_source flx_source_torchsave = {
    .name = "torch-save",
    .kind = "torch.save",
    .marker = SINGLE_NAME ", " INDEX_NAME " or one *.pt/*.pth/*.bin",
    .probe = probe,
    .owns = owns,
    .load = load,
};
