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
 * Both 1 and 2 present are refused too.  -o torch_file=NAME reads that
 * file instead of all this.  Other files are extras.
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
 * contiguous by the view layer); tied tensors share bytes.  A value with
 * no tensor below it (step, config, param_groups) is an object: a legacy
 * torch.save file of it, re-pickled from the inert tree into one memory
 * file; one that cannot be re-pickled is counted in the writer string.
 * The writer string also names where the state dict was found.  A tensor
 * inside any other object (a custom class) is refused: it would be
 * dropped.
 */
#include "grow.h"
#include "reader.h"
#include "source.h"
#include "torchfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <sys/mman.h>
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
	/* the objects' files, one after the other (objects.fqn/off/len
	 * recorded as they are written; file set at the end) */
	unsigned char *ob;
	size_t obn, obcap;
	size_t objcap;	  /* room in c->objects */
	size_t unencoded; /* values not served: no encoding for them */
	int emit_err;	  /* -ENOMEM while emitting, sticky */
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

/* Whether the directory has a regular file (or a link) with a candidate
 * name; looks at names and types only. */
static int probe(int dirfd, bool *yes)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;
	struct dirent *de;

	*yes =
	    flx_dir_has(dirfd, SINGLE_NAME) || flx_dir_has(dirfd, INDEX_NAME);
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
	if (!v || depth > FLX_PV_MAX_WALK_DEPTH)
		return false;
	if (!*budget)
		return true; /* not known: look further down */
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

/* ---- non-tensor values: objects ----
 *
 * Each is served as a file torch.load reads: the legacy layout
 * (torch/serialization.py _legacy_save) with no storage, its object pickle
 * re-written from the inert tree (protocol 2, no memo: a shared node is
 * written again where it recurs).  docs/formats/torch-save-source.md.
 */

/* The magic number, the protocol version, sys_info (as _legacy_save
 * writes them, protocol 2). */
static const unsigned char obj_head[] = {
    0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a,
    0xa8, 0x50, 0x19, 0x2e, 0x80, 0x02, 0x4d, 0xe9, 0x03, 0x2e, 0x80,
    0x02, 0x7d, 0x28, 0x58, 0x10, 0x00, 0x00, 0x00, 'p',  'r',	'o',
    't',  'o',	'c',  'o',  'l',  '_',	'v',  'e',  'r',  's',	'i',
    'o',  'n',	0x4d, 0xe9, 0x03, 0x58, 0x0d, 0x00, 0x00, 0x00, 'l',
    'i',  't',	't',  'l',  'e',  '_',	'e',  'n',  'd',  'i',	'a',
    'n',  0x88, 0x58, 0x0a, 0x00, 0x00, 0x00, 't',  'y',  'p',	'e',
    '_',  's',	'i',  'z',  'e',  's',	0x7d, 0x28, 0x58, 0x05, 0x00,
    0x00, 0x00, 's',  'h',  'o',  'r',	't',  0x4b, 0x02, 0x58, 0x03,
    0x00, 0x00, 0x00, 'i',  'n',  't',	0x4b, 0x04, 0x58, 0x04, 0x00,
    0x00, 0x00, 'l',  'o',  'n',  'g',	0x4b, 0x08, 0x75, 0x75, 0x2e};
/* the storage key list: an empty list */
static const unsigned char obj_tail[] = {0x80, 0x02, 0x5d, 0x2e};

#define MAX_OBJECT_NODES (1u << 20)
#define MAX_OBJECT_BYTES (256u << 20)

static void ob_raw(ts *s, const void *p, size_t n)
{
	void *b = s->ob;

	if (s->emit_err)
		return;
	if (s->obn + n > MAX_OBJECT_BYTES) {
		s->emit_err = -EFBIG;
		return;
	}
	if (flx_grow(&b, &s->obcap, s->obn + n, 1)) {
		s->emit_err = -ENOMEM;
		return;
	}
	s->ob = b;
	memcpy(s->ob + s->obn, p, n);
	s->obn += n;
}

static void ob_byte(ts *s, unsigned char c)
{
	ob_raw(s, &c, 1);
}

static void ob_le(ts *s, uint64_t v, int n)
{
	unsigned char b[8];

	for (int i = 0; i < n; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	ob_raw(s, b, (size_t)n);
}

/* As Python's pickler writes an int under protocol 2. */
static void ob_int(ts *s, int64_t v)
{
	if (v >= 0 && v < 256) {
		ob_byte(s, 'K');
		ob_le(s, (uint64_t)v, 1);
	} else if (v >= 0 && v < 65536) {
		ob_byte(s, 'M');
		ob_le(s, (uint64_t)v, 2);
	} else if (v >= INT32_MIN && v <= INT32_MAX) {
		ob_byte(s, 'J');
		ob_le(s, (uint64_t)v, 4);
	} else {
		/* LONG1: the fewest little-endian two's-complement bytes */
		int n = 8;

		while (n > 1 && ((v >> (8 * (n - 1) - 1)) == 0 ||
				 (v >> (8 * (n - 1) - 1)) == -1))
			n--;
		ob_byte(s, 0x8a);
		ob_byte(s, (unsigned char)n);
		ob_le(s, (uint64_t)v, n);
	}
}

static void ob_str(ts *s, const char *p, size_t n)
{
	ob_byte(s, 'X');
	ob_le(s, n, 4);
	ob_raw(s, p, n);
}

/* Append the opcodes that rebuild v: false when v holds something
 * without an encoding here (a payload left in the file, an int wider
 * than 64 bits, a persistent id). */
static bool ob_emit(ts *s, const flx_pv *v, unsigned depth, uint64_t *budget)
{
	static const unsigned char tupn[] = {')', 0x85, 0x86, 0x87};

	if (!v || depth > FLX_PV_MAX_WALK_DEPTH || !*budget)
		return false;
	--*budget;
	switch (v->kind) {
	case FLX_PV_NONE:
		ob_byte(s, 'N');
		return true;
	case FLX_PV_BOOL:
		ob_byte(s, v->u.b ? 0x88 : 0x89);
		return true;
	case FLX_PV_INT:
		ob_int(s, v->u.i);
		return true;
	case FLX_PV_FLOAT: {
		uint64_t bits;

		memcpy(&bits, &v->u.f, 8);
		ob_byte(s, 'G');
		for (int i = 7; i >= 0; i--)
			ob_byte(s, (unsigned char)(bits >> (8 * i)));
		return true;
	}
	case FLX_PV_STR:
		if (!v->u.str.s)
			return false;
		ob_str(s, v->u.str.s, v->u.str.len);
		return true;
	case FLX_PV_BYTES: {
		/* protocol 2: _codecs.encode(<latin-1 text>, 'latin1') */
		const unsigned char *p = (const unsigned char *)v->u.str.s;
		size_t n = 0;

		if (!p)
			return false;
		for (size_t i = 0; i < v->u.str.len; i++)
			n += p[i] < 0x80 ? 1 : 2;
		ob_raw(s, "c_codecs\nencode\n", 16);
		ob_byte(s, 'X');
		ob_le(s, n, 4);
		for (size_t i = 0; i < v->u.str.len; i++) {
			if (p[i] < 0x80) {
				ob_byte(s, p[i]);
			} else {
				ob_byte(s, (unsigned char)(0xc0 | p[i] >> 6));
				ob_byte(s,
					(unsigned char)(0x80 | (p[i] & 0x3f)));
			}
		}
		ob_str(s, "latin1", 6);
		ob_byte(s, 0x86);
		ob_byte(s, 'R');
		return true;
	}
	case FLX_PV_TUPLE:
		if (v->u.seq.n > 3)
			ob_byte(s, '(');
		for (size_t i = 0; i < v->u.seq.n; i++)
			if (!ob_emit(s, v->u.seq.v[i], depth + 1, budget))
				return false;
		ob_byte(s, v->u.seq.n > 3 ? 't' : tupn[v->u.seq.n]);
		return true;
	case FLX_PV_LIST:
	case FLX_PV_SET:
		if (v->kind == FLX_PV_SET)
			ob_raw(s, "cbuiltins\nset\n", 14);
		ob_byte(s, ']');
		if (v->u.seq.n) {
			ob_byte(s, '(');
			for (size_t i = 0; i < v->u.seq.n; i++)
				if (!ob_emit(s, v->u.seq.v[i], depth + 1,
					     budget))
					return false;
			ob_byte(s, 'e');
		}
		if (v->kind == FLX_PV_SET) {
			ob_byte(s, 0x85);
			ob_byte(s, 'R');
		}
		return true;
	case FLX_PV_DICT:
		ob_byte(s, '}');
		if (v->u.dict.n) {
			ob_byte(s, '(');
			for (size_t i = 0; i < 2 * v->u.dict.n; i++)
				if (!ob_emit(s, v->u.dict.kv[i], depth + 1,
					     budget))
					return false;
			ob_byte(s, 'u');
		}
		return true;
	case FLX_PV_GLOBAL:
		if (strchr(v->u.global.module, '\n') ||
		    strchr(v->u.global.name, '\n'))
			return false;
		ob_byte(s, 'c');
		ob_raw(s, v->u.global.module, strlen(v->u.global.module));
		ob_byte(s, '\n');
		ob_raw(s, v->u.global.name, strlen(v->u.global.name));
		ob_byte(s, '\n');
		return true;
	case FLX_PV_OBJ:
		if (!ob_emit(s, v->u.obj.cls, depth + 1, budget) ||
		    !ob_emit(s, v->u.obj.args, depth + 1, budget))
			return false;
		ob_byte(s, v->newobj ? 0x81 : 'R');
		if (v->u.obj.state) {
			if (!ob_emit(s, v->u.obj.state, depth + 1, budget))
				return false;
			ob_byte(s, 'b');
		}
		return true;
	default:
		return false;
	}
}

/* Serve v (no tensor below) as object s->path. */
static int add_object(ts *s, const flx_pv *v)
{
	flx_ckpt *c = s->c;
	size_t start = s->obn, len = strlen(s->path) + 1;
	uint64_t budget = MAX_OBJECT_NODES;
	flx_object *o;
	void *arr = c->objects;
	bool ok;

	ob_raw(s, obj_head, sizeof(obj_head));
	ob_raw(s, "\x80\x02", 2);
	ok = ob_emit(s, v, 0, &budget);
	ob_byte(s, '.');
	ob_raw(s, obj_tail, sizeof(obj_tail));
	if (s->emit_err == -EFBIG)
		return flx_error_set(s->err, -EINVAL, s->relpath, s->path,
				     "values other than tensors take more than "
				     "%u MiB",
				     MAX_OBJECT_BYTES >> 20);
	if (s->emit_err)
		return s->emit_err;
	if (!ok) {
		s->obn = start;
		s->unencoded++;
		return 0;
	}
	if (flx_grow(&arr, &s->objcap, c->nobjects + 1, sizeof(*o)))
		return -ENOMEM;
	c->objects = arr;
	o = &c->objects[c->nobjects];
	memset(o, 0, sizeof(*o));
	o->fqn = flx_pool_alloc(&c->pool, len);
	if (!o->fqn)
		return -ENOMEM;
	memcpy(o->fqn, s->path, len);
	o->off = start;
	o->len = s->obn - start;
	c->nobjects++;
	return 0;
}

/* The objects' bytes into one memory file of the index. */
static int finish_objects(ts *s)
{
	uint32_t idx;
	int fd, rc;

	if (!s->c->nobjects)
		return 0;
	fd = memfd_create("flexfs-torchsave-objects", MFD_CLOEXEC);
	if (fd < 0)
		return flx_error_set(s->err, -errno, s->relpath, NULL,
				     "memfd_create: %s", strerror(errno));
	for (size_t done = 0; done < s->obn;) {
		ssize_t w = write(fd, s->ob + done, s->obn - done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			rc = w < 0 ? -errno : -EIO;
			close(fd);
			return flx_error_set(s->err, rc, s->relpath, NULL,
					     "writing the objects: %s",
					     strerror(-rc));
		}
		done += (size_t)w;
	}
	rc = flx_build_decoded_file(s->b, "(torch.save values, re-pickled)", fd,
				    &idx);
	if (rc)
		return rc;
	for (size_t i = 0; i < s->c->nobjects; i++)
		s->c->objects[i].file = idx;
	return 0;
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
	if (s->path[0] && !flx_torchfile_is_tensor(v)) {
		uint64_t budget = 1u << 20;

		/* a value with no tensor below: one object */
		if (!holds_tensor(v, depth, &budget))
			return add_object(s, v);
	}
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

				if (!holds_tensor(val, depth + 1, &budget)) {
					s->unencoded++; /* no name for it */
					continue;
				}
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
	const char *name;
	json_t *v;
	void *buf = NULL;
	size_t len = 0, n = 0;
	int rc = flx_build_read_whole(s->b, INDEX_NAME, MAX_INDEX_BYTES, NULL,
				      &buf, &len, &s->c->mtime_ns, s->err);

	if (!rc)
		rc = flx_json_parse(buf, len, INDEX_NAME, NULL, &s->index,
				    s->err);
	free(buf);
	if (rc)
		return rc;
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
				   "(%s%s): which one is the checkpoint? Name "
				   "it with -o torch_file=NAME",
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
	char left[80] = "";
	int n;

	if (s->unencoded)
		snprintf(left, sizeof(left),
			 "; %zu value%s not served (no encoding)", s->unencoded,
			 s->unencoded == 1 ? "" : "s");
	if (s->under && *s->under && !s->under_mixed)
		n = asprintf(&s->c->writer,
			     "torch.save %s; state dict under '%s'%s", fmt,
			     s->under, left);
	else
		n = asprintf(&s->c->writer, "torch.save %s%s", fmt, left);
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
	const char **files = NULL, *named = NULL;
	char *single = NULL;
	size_t nfiles = 0;
	int rc = 0;

	if (flx_opt_text(o->vals, "torch_file", &named) == 0) {
		const flx_file_ref ref = {"-o torch_file", "file name", NULL};

		single = strdup(named);
		rc = single ? 0 : -ENOMEM;
		if (!rc) {
			flx_build_names_from(b, single, "the saved object");
			rc = load_file(&s, single, &ref);
		}
		if (!rc)
			s.c->mtime_ns = s.c->files[s.file].mtime_ns;
		goto done;
	}
	if (flx_build_has(b, dirfd, SINGLE_NAME) &&
	    flx_build_has(b, dirfd, INDEX_NAME)) {
		rc = flx_error_set(err, -EINVAL, INDEX_NAME, NULL,
				   "beside " SINGLE_NAME
				   ": which one is the checkpoint?");
		goto out;
	}
	if (flx_build_has(b, dirfd, INDEX_NAME)) {
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

		if (flx_build_has(b, dirfd, SINGLE_NAME))
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
done:
	if (!rc)
		rc = finish_objects(&s);
	if (!rc)
		rc = set_writer(&s);
out:
	free(s.ob);
	free(files);
	free(single);
	json_decref(s.index);
	return rc;
}

/* A plain file name of the directory: no '/', not "." or "..". */
static int check_file(const flx_opt *o, const char *value, uint64_t *num,
		      flx_error *err)
{
	(void)num;
	if (!value || !*value || strchr(value, '/') || !strcmp(value, ".") ||
	    !strcmp(value, ".."))
		return flx_error_set(err, -EINVAL, NULL, o->name,
				     "needs a file name of the checkpoint "
				     "directory (no '/')");
	return 0;
}

static const flx_opt ts_opts[] = {
    {.name = "torch_file",
     .type = FLX_OPT_TEXT,
     .metavar = "NAME",
     .help = "the torch.save file of the directory to read (when it holds "
	     "several *.pt, *.pth or *.bin files, or to read another than "
	     "pytorch_model.bin)",
     .check = check_file},
};

static const flx_opt_group ts_group = {
    .owner = "torch-save",
    .title = "torch.save source",
    .opts = ts_opts,
    .nopts = FLX_OPT_COUNT(ts_opts),
};

const flx_source flx_source_torchsave = {
    .name = "torch-save",
    .kind = "torch.save",
    .marker = SINGLE_NAME ", " INDEX_NAME " or one *.pt/*.pth/*.bin",
    .probe = probe,
    .owns = owns,
    .load = load,
    .opts = &ts_group,
};
