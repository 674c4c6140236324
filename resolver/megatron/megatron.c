/* SPDX-License-Identifier: MIT */
/*
 * The Megatron-Core torch_dist source (source.h): an iter_XXXXXXX/
 * directory that is a PyTorch DCP checkpoint (read by the DCP loader,
 * dcp_internal.h, which here also accepts Megatron-Core 0.15's
 * MCoreMetadata subclass) plus files of its own: "metadata.json" (the
 * sharded backend, which must be torch_dist) and "common.pt" (a torch.save
 * of the non-sharded state: args, iteration, ...; from 0.19 the bytes item
 * "common_state/shard_0_1" instead), read parse-only into flx_megatron.
 * Keys "decoder.layers.<non-digit>..." stack every layer along axis 0 (and
 * "...experts.experts..." the experts along axis 1): flx_tensor.stacked.
 * The fully_sharded_model_space optimizer tensors are presented under
 * their original shapes (section 4.4; see unflatten()).
 * Spec: docs/formats/megatron.md#save-directory,
 * docs/formats/megatron.md#optimizer-layouts.
 */
#include "dcp_internal.h"
#include "megatron_internal.h"
#include "json_guard.h"
#include "pickle.h"
#include "reader.h"
#include "source.h"
#include "zipitem.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG_NAME FLX_MCORE_CONFIG
/* a save directory's tracker file, beside its iter_NNNNNNN/ directories,
 * and the most bytes of it read */
#define TRACKER_NAME	  "latest_checkpointed_iteration.txt"
#define MAX_TRACKER_BYTES 4096
#define COMMON_NAME	  FLX_MCORE_COMMON
#define COMMON_ITEM	  "common_state/shard_0_1"
#define MCORE_MODULE	  "megatron.core.dist_checkpointing.strategies.torch"
#define MAX_CONFIG_BYTES  (1u << 20)
#define MAX_COMMON_BYTES  (1u << 28)

/* ---- metadata.json ---- */

/* A documented key, when present, has this JSON type; others are
 * ignored (0.19 dropped common_backend*, later versions may add keys). */
static const struct {
	const char *key;
	json_type type;
} config_keys[] = {
    {"sharded_backend_version", JSON_INTEGER},
    {"common_backend", JSON_STRING},
    {"common_backend_version", JSON_INTEGER},
};

/* What to say when metadata.json names v, the other backend than this
 * source's: each source's probe looks for its own files (.metadata or
 * none), but -o source_format may name either. */
static int other_backend(int dirfd, const char *backend, const char *v,
			 flx_error *err)
{
	bool meta = flx_mcore_exists(dirfd, ".metadata");

	if (meta == !strcmp(backend, "torch_dist"))
		return meta
			   ? flx_error_set(err, -EINVAL, CONFIG_NAME,
					   "sharded_backend",
					   "'%s', but the directory has a "
					   ".metadata (a torch_dist "
					   "checkpoint's; a zarr one has none)",
					   v)
			   : flx_error_set(err, -ENOENT, ".metadata", NULL,
					   "no such file (a torch_dist "
					   "checkpoint has one)");
	return flx_error_set(err, -EINVAL, CONFIG_NAME, "sharded_backend",
			     "'%s': read it as format megatron-%s, not "
			     "megatron-%s",
			     v, v, backend);
}

/* metadata.json parsed from buf[0..len): an object whose sharded_backend
 * is backend.  @return 0, -ENOMEM, -ENOTSUP (a backend no source reads)
 * or -EINVAL / -ENOENT (other_backend()), with err naming the key. */
static int check_config(int dirfd, const char *buf, size_t len,
			const char *backend, flx_error *err)
{
	const json_t *v;
	json_t *root;
	int rc = flx_json_parse(buf, len, CONFIG_NAME, NULL, &root, err);

	if (rc)
		return rc;
	if (!json_is_object(root)) {
		rc = flx_error_set(err, -EINVAL, CONFIG_NAME, NULL,
				   "not a JSON object");
		goto out;
	}
	v = json_object_get(root, "sharded_backend");
	if (!json_is_string(v)) {
		rc = flx_error_set(err, -EINVAL, CONFIG_NAME, "sharded_backend",
				   v ? "not a string" : "missing");
		goto out;
	}
	if (strcmp(json_string_value(v), "torch_dist") != 0 &&
	    strcmp(json_string_value(v), "zarr") != 0) {
		rc =
		    flx_error_set(err, -ENOTSUP, CONFIG_NAME, "sharded_backend",
				  "'%.64s' is not supported (only torch_dist "
				  "and zarr checkpoints mount)",
				  json_string_value(v));
		goto out;
	}
	if (strcmp(json_string_value(v), backend) != 0) {
		rc = other_backend(dirfd, backend, json_string_value(v), err);
		goto out;
	}
	for (size_t i = 0; i < sizeof(config_keys) / sizeof(config_keys[0]);
	     i++) {
		v = json_object_get(root, config_keys[i].key);
		if (v && json_typeof(v) != config_keys[i].type) {
			rc = flx_error_set(err, -EINVAL, CONFIG_NAME,
					   config_keys[i].key, "not %s",
					   config_keys[i].type == JSON_STRING
					       ? "a string"
					       : "an integer");
			goto out;
		}
	}
out:
	json_decref(root);
	return rc;
}

int flx_mcore_config(flx_build *b, const char *backend, int64_t *mtime_ns,
		     flx_error *err)
{
	void *buf = NULL;
	size_t len = 0;
	int rc;

	rc = flx_build_read_whole(b, CONFIG_NAME, MAX_CONFIG_BYTES, NULL, &buf,
				  &len, mtime_ns, err);
	if (!rc)
		rc = check_config(flx_build_dirfd(b), buf, len, backend, err);
	free(buf);
	return rc;
}

/* ---- the common state ---- */

/* Where a common state pickle is, for messages: "common.pt" or the
 * item's "<relpath>@<offset>". */
typedef struct common_src {
	char file[FLX_ERR_FIELD];
	bool item; /* a one-element list around the dict */
} common_src;

/* An integer field of args (or of the state), -1 when absent or None. */
static int get_int(const common_src *cs, const flx_pv *dict, const char *key,
		   const char *what, int64_t *out, flx_error *err)
{
	const flx_pv *v = flx_pv_dict_get(dict, key);

	*out = -1;
	if (!v || v->kind == FLX_PV_NONE)
		return 0;
	if (v->kind != FLX_PV_INT || v->u.i < 0)
		return flx_error_set(err, -EINVAL, cs->file, what,
				     "not a non-negative integer (a %s)",
				     flx_pv_kind_name(v));
	*out = v->u.i;
	return 0;
}

/* A flag of args: 0 or 1, -1 when absent or None. */
static int get_flag(const common_src *cs, const flx_pv *dict, const char *key,
		    const char *what, int *out, flx_error *err)
{
	const flx_pv *v = flx_pv_dict_get(dict, key);

	*out = -1;
	if (!v || v->kind == FLX_PV_NONE)
		return 0;
	if (v->kind != FLX_PV_BOOL)
		return flx_error_set(err, -EINVAL, cs->file, what,
				     "not a bool (a %s)", flx_pv_kind_name(v));
	*out = v->u.b ? 1 : 0;
	return 0;
}

/* A short string, "" when absent or None. */
static int get_str(const common_src *cs, const flx_pv *dict, const char *key,
		   const char *what, char *out, size_t size, flx_error *err)
{
	const flx_pv *v = flx_pv_dict_get(dict, key);
	const char *s = flx_pv_str(v);

	out[0] = '\0';
	if (!v || v->kind == FLX_PV_NONE)
		return 0;
	if (!s || strlen(s) != v->u.str.len)
		return flx_error_set(err, -EINVAL, cs->file, what,
				     "not a string (a %s)",
				     flx_pv_kind_name(v));
	if (v->u.str.len >= size)
		return flx_error_set(err, -EINVAL, cs->file, what,
				     "longer than %zu bytes", size - 1);
	memcpy(out, s, v->u.str.len + 1);
	return 0;
}

/* The args fields flx_megatron keeps, by kind. */
#define INT_ARG(f)                                                             \
	{                                                                      \
#f, "args." #f, offsetof(flx_megatron, f)                      \
	}
static const struct arg_field {
	const char *key;
	const char *what;
	size_t off;
} int_args[] =
    {
	INT_ARG(num_layers),
	INT_ARG(hidden_size),
	INT_ARG(num_attention_heads),
	INT_ARG(num_query_groups),
	INT_ARG(kv_channels),
	INT_ARG(ffn_hidden_size),
	INT_ARG(padded_vocab_size),
	INT_ARG(make_vocab_size_divisible_by),
	INT_ARG(tensor_model_parallel_size),
	INT_ARG(pipeline_model_parallel_size),
	INT_ARG(virtual_pipeline_model_parallel_size),
	INT_ARG(num_experts),
	INT_ARG(moe_ffn_hidden_size),
	INT_ARG(expert_model_parallel_size),
	INT_ARG(expert_tensor_parallel_size),
	INT_ARG(vocab_size),
},
  flag_args[] = {
      INT_ARG(swiglu),
      INT_ARG(group_query_attention),
      INT_ARG(untie_embeddings_and_output_weights),
      INT_ARG(add_bias_linear),
      INT_ARG(add_qkv_bias),
      INT_ARG(moe_grouped_gemm),
};
#undef INT_ARG

/* args: an argparse.Namespace (NEWOBJ + BUILD of its __dict__), or the
 * plain dict of its fields that reduced state dicts carry
 * (docs/formats/megatron.md#unverified-points). */
static int interpret_args(const common_src *cs, const flx_pv *args,
			  flx_megatron *m, flx_error *err)
{
	unsigned char *base = (unsigned char *)m;
	const flx_pv *ns = NULL;
	int rc = 0;

	if (args && args->kind == FLX_PV_NONE)
		args = NULL;
	if (args && args->kind != FLX_PV_DICT &&
	    (args->kind != FLX_PV_OBJ ||
	     !flx_pv_is_global(flx_pv_obj_class(args), "argparse",
			       "Namespace")))
		return flx_error_set(
		    err, -EINVAL, cs->file, "args",
		    "neither an argparse.Namespace nor a dict");
	/* an empty Namespace has no BUILD: every field absent */
	ns = args && args->kind == FLX_PV_DICT ? args
	     : args			       ? args->u.obj.state
					       : NULL;
	if (ns && ns->kind != FLX_PV_DICT)
		return flx_error_set(err, -EINVAL, cs->file, "args",
				     "not an argparse.Namespace");
	for (size_t i = 0; i < sizeof(int_args) / sizeof(int_args[0]) && !rc;
	     i++)
		rc = get_int(cs, ns, int_args[i].key, int_args[i].what,
			     (int64_t *)(base + int_args[i].off), err);
	for (size_t i = 0; i < sizeof(flag_args) / sizeof(flag_args[0]) && !rc;
	     i++)
		rc = get_flag(cs, ns, flag_args[i].key, flag_args[i].what,
			      (int *)(base + flag_args[i].off), err);
	if (!rc)
		rc = get_str(cs, ns, "transformer_impl",
			     "args.transformer_impl", m->transformer_impl,
			     sizeof(m->transformer_impl), err);
	if (!rc)
		rc = get_str(cs, ns, "normalization", "args.normalization",
			     m->normalization, sizeof(m->normalization), err);
	if (!rc)
		rc = get_str(cs, ns, "position_embedding_type",
			     "args.position_embedding_type",
			     m->position_embedding_type,
			     sizeof(m->position_embedding_type), err);
	return rc;
}

/* The optimizer layout's name: content_metadata's (0.13+), else the
 * optimizer leftovers'. */
static int interpret_optim(const common_src *cs, const flx_pv *st,
			   flx_megatron *m, flx_error *err)
{
	const flx_pv *cm = flx_pv_dict_get(st, "content_metadata");
	const flx_pv *opt = flx_pv_dict_get(st, "optimizer"), *sls;
	int rc;

	if (cm && cm->kind != FLX_PV_DICT && cm->kind != FLX_PV_NONE)
		return flx_error_set(err, -EINVAL, cs->file, "content_metadata",
				     "not a dict (a %s)", flx_pv_kind_name(cm));
	rc = get_str(cs, cm, "distrib_optim_sharding_type",
		     "content_metadata.distrib_optim_sharding_type",
		     m->optim_sharding, sizeof(m->optim_sharding), err);
	/* read leniently: only megatron/ uses it, to refuse */
	sls = flx_pv_dict_get(cm, "singleton_local_shards");
	m->singleton_local_shards =
	    sls && sls->kind == FLX_PV_BOOL ? sls->u.b : -1;
	if (rc || m->optim_sharding[0] || !opt || opt->kind != FLX_PV_DICT)
		return rc;
	return get_str(cs, opt, "param_state_sharding_type",
		       "optimizer.param_state_sharding_type", m->optim_sharding,
		       sizeof(m->optim_sharding), err);
}

/*
 * Older checkpoints name no optimizer format: Megatron then assumes
 * fully_sharded_model_space when the saving run had
 * args.ckpt_fully_parallel_save, else dp_zero_gather_scatter
 * (docs/formats/megatron.md#optimizer-format-detection). args was checked by
 * interpret_args().
 */
static int assume_optim(const common_src *cs, const flx_pv *args,
			flx_megatron *m, flx_error *err)
{
	const flx_pv *ns =
	    args && args->kind == FLX_PV_OBJ ? args->u.obj.state : args;
	int fps = -1;
	int rc = get_flag(cs, ns && ns->kind == FLX_PV_DICT ? ns : NULL,
			  "ckpt_fully_parallel_save",
			  "args.ckpt_fully_parallel_save", &fps, err);

	if (rc)
		return rc;
	snprintf(m->optim_sharding, sizeof(m->optim_sharding), "%s",
		 fps == 1 ? "fully_sharded_model_space"
			  : "dp_zero_gather_scatter");
	m->optim_assumed = true;
	return 0;
}

/* The common state's pickle root: the dict (inside its one-element list
 * for the item). */
static int interpret_common(const common_src *cs, const flx_pv *root,
			    flx_megatron *m, flx_error *err)
{
	const flx_pv *st = root, *v;
	int rc;

	if (cs->item) {
		if (!root || root->kind != FLX_PV_LIST || flx_pv_len(root) != 1)
			return flx_error_set(err, -EINVAL, cs->file,
					     COMMON_ITEM,
					     "not a one-element list (a %s)",
					     flx_pv_kind_name(root));
		st = flx_pv_item(root, 0);
	}
	if (!st || st->kind != FLX_PV_DICT)
		return flx_error_set(err, -EINVAL, cs->file, NULL,
				     "the common state is a %s, not a dict",
				     flx_pv_kind_name(st));
	rc = get_int(cs, st, "iteration", "iteration", &m->iteration, err);
	if (rc)
		return rc;
	v = flx_pv_dict_get(st, "checkpoint_version");
	m->checkpoint_version = -1;
	if (v && v->kind == FLX_PV_FLOAT)
		m->checkpoint_version = v->u.f;
	else if (v && v->kind == FLX_PV_INT)
		m->checkpoint_version = (double)v->u.i;
	else if (v && v->kind != FLX_PV_NONE)
		return flx_error_set(
		    err, -EINVAL, cs->file, "checkpoint_version",
		    "not a number (a %s)", flx_pv_kind_name(v));
	rc = interpret_args(cs, flx_pv_dict_get(st, "args"), m, err);
	if (!rc)
		rc = interpret_optim(cs, st, m, err);
	if (!rc && !m->optim_sharding[0])
		rc = assume_optim(cs, flx_pv_dict_get(st, "args"), m, err);
	return rc;
}

int flx_mcore_interpret_state(const char *file, const flx_pv *state,
			      flx_megatron *m, flx_error *err)
{
	common_src cs = {.item = false};

	snprintf(cs.file, sizeof(cs.file), "%s", file);
	return interpret_common(&cs, state, m, err);
}

/* Decode the torch.save zip buf[0..len) (the file's bytes [base, base +
 * len)) of the common state: locate data.pkl, decode it inertly,
 * interpret it, and record where it lies. */
static int decode_common(const common_src *cs, const unsigned char *buf,
			 size_t len, uint64_t base, flx_megatron *m,
			 flx_error *err)
{
	static const flx_pickle_limits lim = {0};
	flx_mem_reader mr;
	flx_reader r;
	flx_zip *z = NULL;
	flx_zip_rec rec;
	flx_pickle *pk = NULL;
	int rc;

	flx_reader_mem(&r, &mr, buf, len);
	rc = flx_zip_open(&r, cs->file, &z, err);
	if (rc)
		goto out;
	if (flx_zip_find(z, "data.pkl", &rec)) {
		rc = flx_error_set(err, -EINVAL, cs->file, NULL,
				   "no data.pkl record in the archive");
		goto out;
	}
	rc = flx_pickle_load(buf + rec.data_off, rec.size, cs->file, &lim, &pk,
			     err);
	if (rc)
		goto out;
	rc = interpret_common(cs, flx_pickle_root(pk), m, err);
	m->pkl_off = base + rec.data_off;
	m->pkl_len = rec.size;
out:
	flx_pickle_free(pk);
	flx_zip_close(z);
	return rc;
}

/* Read bytes [off, off + len) of file idx of the index, len bounded. */
static int read_window(const flx_ckpt *c, uint32_t idx, uint64_t off,
		       uint64_t len, const char *name, unsigned char **out,
		       flx_error *err)
{
	unsigned char *buf;
	int rc;

	*out = NULL;
	if (len > MAX_COMMON_BYTES)
		return flx_error_set(err, -EINVAL, name, NULL,
				     "larger than %u MiB",
				     MAX_COMMON_BYTES >> 20);
	buf = malloc(len ? len : 1);
	if (!buf)
		return -ENOMEM;
	rc = flx_file_pread(c, idx, buf, len, off);
	if (rc) {
		free(buf);
		return flx_error_set(err, rc, name, NULL, "cannot read: %s",
				     strerror(-rc));
	}
	*out = buf;
	return 0;
}

bool flx_mcore_exists(int dirfd, const char *name)
{
	struct stat st;

	return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ||
	       errno != ENOENT;
}

/* The common state: common.pt (recorded as a data file), else the
 * common_state item of the DCP metadata. */
static int load_common(flx_build *b, flx_megatron *m, flx_error *err)
{
	static const flx_file_ref ref = {
	    .from = COMMON_NAME, .field = "file", .key = NULL};
	flx_ckpt *c = flx_build_ckpt(b);
	const flx_object *o = NULL;
	common_src cs = {.item = false};
	unsigned char *buf = NULL;
	uint64_t off = 0, len;
	uint32_t idx;
	int rc;

	if (flx_mcore_exists(flx_build_dirfd(b), COMMON_NAME) ||
	    flx_build_remote(b, COMMON_NAME)) {
		rc = flx_build_data_file(b, COMMON_NAME, &ref, &idx);
		if (rc)
			return rc;
		snprintf(cs.file, sizeof(cs.file), "%s", COMMON_NAME);
		len = c->files[idx].size;
	} else {
		for (size_t i = 0; i < c->nobjects && !o; i++)
			if (strcmp(c->objects[i].fqn, COMMON_ITEM) == 0)
				o = &c->objects[i];
		if (!o)
			return flx_error_set(
			    err, -ENOENT, COMMON_NAME, NULL,
			    "no such file, and no " COMMON_ITEM
			    " item in .metadata (the common state)");
		idx = o->file;
		off = o->off;
		len = o->len;
		cs.item = true;
		snprintf(cs.file, sizeof(cs.file), "%s@%llu",
			 c->files[idx].relpath, (unsigned long long)off);
	}
	m->common_file = idx;
	m->common_item = cs.item;
	rc = read_window(c, idx, off, len, cs.file, &buf, err);
	if (!rc)
		rc = decode_common(&cs, buf, len, off, m, err);
	free(buf);
	return rc;
}

/* ---- stacked tensors ---- */

/* Leading axes of a key that stack modules
 * (docs/formats/megatron.md#stacked-layers,
 * docs/formats/megatron.md#moe-experts): "decoder. layers." (at the start or
 * after a '.', as optimizer keys carry a prefix) directly followed by a
 * non-digit stacks layers on axis 0; "experts.experts." after it stacks the
 * experts on axis 1. "decoder.layers.<N>." names one layer (a non-homogeneous
 * model): no layer axis, but "experts.experts." after it still stacks the
 * experts, on axis 0 (*experts set). */
static int stacked_axes(const char *fqn, bool *experts)
{
	static const char tag[] = "decoder.layers.";
	const char *p = fqn;

	*experts = false;
	while ((p = strstr(p, tag)) && p != fqn && p[-1] != '.')
		p++;
	if (!p)
		return 0;
	p += sizeof(tag) - 1;
	if (*p >= '0' && *p <= '9') {
		while (*p >= '0' && *p <= '9')
			p++;
		*experts = *p == '.' && strstr(p, ".experts.experts.");
		return *experts ? 1 : 0;
	}
	return strstr(p, "experts.experts.") ? 2 : 1;
}

static void mark_stacked(flx_ckpt *c)
{
	for (size_t i = 0; i < c->ntensors; i++) {
		flx_tensor *t = &c->tensors[i];
		bool experts;
		int n = stacked_axes(t->fqn, &experts);

		t->stacked = n < t->ndim ? n : 0;
		t->stacked_experts = t->stacked && experts;
	}
}

/* ---- fully_sharded_model_space: the N-D flattened reformulation ---- */

/*
 * A tensor of the distributed optimizer's fully_sharded_model_space layout
 * is saved reformulated (docs/formats/megatron.md#fully-sharded-model-space):
 * its DCP shape is the grid counts f of the original tensor's chunk grid plus
 * one axis of prod(s) elements, s = orig / f the TP-local shard shape, and each
 * chunk (g, a) -> (1, ..., 1, len) is elements [a, a + len) of the flattened
 * shard at grid index g.  mcore_data[key]['nd_reformulated_orig_global_
 * shape'] gives orig.  The tensor is presented under orig: each chunk
 * becomes the boxes of its range inside the block at g * s
 * (flx_flat_boxes()), reading the saved item in place
 * (flx_dcp_flat_box()).  The reformulated chunks were checked disjoint and
 * covering, and the map from (g, flat index) to orig is a bijection, so
 * the boxes are too.
 */
#define ORIG_SHAPE "nd_reformulated_orig_global_shape"

/* orig (n axes) against t's reformulated shape: f = orig / s exactly on
 * every axis, and the last axis of t holds prod(s).  Fills s. */
static int check_reformulated(const flx_tensor *t, int n, const int64_t *orig,
			      int64_t *s, flx_error *err)
{
	char a[96], b[96];
	uint64_t numel;

	flx_fmt_dims(a, sizeof(a), n, orig);
	flx_fmt_dims(b, sizeof(b), t->ndim, t->shape);
	if (t->ndim != n + 1)
		return flx_error_set(err, -EINVAL, ".metadata", t->fqn,
				     ORIG_SHAPE " %s does not fit the saved "
						"shape %s (%d axes, not %d)",
				     a, b, n, t->ndim - 1);
	for (int d = 0; d < n; d++) {
		if (t->shape[d] == 0 || orig[d] % t->shape[d] != 0)
			return flx_error_set(err, -EINVAL, ".metadata", t->fqn,
					     ORIG_SHAPE
					     " %s is not a grid of "
					     "the saved shape %s (axis %d)",
					     a, b, d);
		s[d] = orig[d] / t->shape[d];
	}
	/* orig is untrusted: its size, and the shard's, must fit */
	if (flx_shape_bytes(n, orig, flx_dtype_size(t->dtype), NULL, NULL) ||
	    flx_shape_bytes(n, s, 1, &numel, NULL))
		return flx_error_set(err, -EOVERFLOW, ".metadata", t->fqn,
				     ORIG_SHAPE " %s: size overflows 64 bits",
				     a);
	if (numel != (uint64_t)t->shape[n])
		return flx_error_set(
		    err, -EINVAL, ".metadata", t->fqn,
		    ORIG_SHAPE " %s: a shard of %llu elements, "
			       "the saved shape %s holds %lld",
		    a, (unsigned long long)numel, b, (long long)t->shape[n]);
	return 0;
}

/* The axis the model tensor is TP-split along, plus one: the one axis
 * past the stacked ones with more than one grid index; -1: none; 0:
 * several (the plan refuses). */
static int reformulated_split(const flx_tensor *t, int n)
{
	int axis = -1;

	bool experts;

	for (int d = stacked_axes(t->fqn, &experts); d < n; d++) {
		if (t->shape[d] <= 1)
			continue;
		if (axis >= 0)
			return 0;
		axis = d;
	}
	return axis < 0 ? -1 : axis + 1;
}

/* Present t (reformulated) under orig (n axes, checked). */
static int unflatten(flx_pool *pool, flx_tensor *t, int n, const int64_t *orig,
		     const int64_t *s, flx_error *err)
{
	int64_t lo[FLX_FLAT_BOXES_MAX][FLX_MAX_DIMS],
	    sz[FLX_FLAT_BOXES_MAX][FLX_MAX_DIMS], first[FLX_FLAT_BOXES_MAX],
	    st[FLX_MAX_DIMS];
	flx_tensor old = *t;
	uint32_t nch = 0, at = 0;
	unsigned nb;
	int64_t k = 1;
	int rc;

	for (uint32_t i = 0; i < old.nchunks; i++) {
		const flx_chunk *ch = &old.chunks[i];

		for (int d = 0; d < n; d++)
			if (ch->size[d] != 1) {
				char o[96];

				flx_fmt_dims(o, sizeof(o), t->ndim, ch->off);
				return flx_error_set(
				    err, -EINVAL, ".metadata", t->fqn,
				    "the reformulated chunk at "
				    "%s spans %lld grid blocks "
				    "along axis %d",
				    o, (long long)ch->size[d], d);
			}
		flx_flat_boxes(n, s, ch->off[n], ch->off[n] + ch->size[n], lo,
			       sz, first, &nb);
		if (nch > UINT32_MAX - nb)
			return flx_error_set(err, -EINVAL, ".metadata", t->fqn,
					     "too many chunks");
		nch += nb;
	}
	for (int d = n - 1; d >= 0; d--) {
		st[d] = k;
		k *= s[d];
	}
	t->saved_split = reformulated_split(t, n);
	t->ndim = n;
	memcpy(t->shape, orig, sizeof(int64_t) * (size_t)n);
	rc = flx_tensor_pool_chunks(pool, t, nch);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < old.nchunks; i++) {
		const flx_chunk *ch = &old.chunks[i];
		int64_t a = ch->off[n];

		flx_flat_boxes(n, s, a, a + ch->size[n], lo, sz, first, &nb);
		for (unsigned j = 0; j < nb; j++) {
			flx_chunk *nc = &t->chunks[at++];

			for (int d = 0; d < n; d++) {
				nc->off[d] = ch->off[d] * s[d] + lo[j][d];
				nc->size[d] = sz[j][d];
				nc->stride[d] = st[d];
			}
			nc->file = ch->file;
			nc->item_off = ch->item_off;
			nc->item_len = ch->item_len;
			nc->zstd = ch->zstd;
			flx_dcp_flat_box(nc, ch->size[n], first[j] - a);
		}
	}
	return flx_tensor_check_chunks(t, ".metadata", err);
}

/* orig from an mcore_data entry's ORIG_SHAPE: a tuple (or torch.Size) of
 * non-negative integers, at most FLX_MAX_DIMS - 1. */
static int orig_shape(const char *key, const flx_pv *v, int *n, int64_t *orig,
		      flx_error *err)
{
	const flx_pv *tp = v;

	if (v && v->kind == FLX_PV_OBJ &&
	    flx_pv_is_global(flx_pv_obj_class(v), "torch", "Size"))
		tp = flx_pv_item(v->u.obj.args, 0);
	if (!tp || (tp->kind != FLX_PV_TUPLE && tp->kind != FLX_PV_LIST))
		return flx_error_set(err, -EINVAL, ".metadata", key,
				     "mcore_data " ORIG_SHAPE " is not a tuple "
				     "(a %s)",
				     flx_pv_kind_name(v));
	if (flx_pv_len(tp) >= FLX_MAX_DIMS)
		return flx_error_set(err, -EINVAL, ".metadata", key,
				     "mcore_data " ORIG_SHAPE " has %zu axes "
				     "(at most %d)",
				     flx_pv_len(tp), FLX_MAX_DIMS - 1);
	*n = (int)flx_pv_len(tp);
	for (int d = 0; d < *n; d++)
		if (!flx_pv_int(flx_pv_item(tp, (size_t)d), &orig[d]) ||
		    orig[d] < 0)
			return flx_error_set(err, -EINVAL, ".metadata", key,
					     "mcore_data " ORIG_SHAPE
					     " axis %d "
					     "is not a non-negative integer",
					     d);
	return 0;
}

/* A key of mcore_data: its bytes and its position in the dict. */
typedef struct mkey {
	const char *s;
	size_t len, at;
} mkey;

static int cmp_mkey(const void *a, const void *b)
{
	const mkey *x = a, *y = b;
	int c = memcmp(x->s, y->s, x->len < y->len ? x->len : y->len);

	if (c)
		return c;
	if (x->len != y->len)
		return x->len < y->len ? -1 : 1;
	return (x->at > y->at) - (x->at < y->at);
}

/* The value of key in md through k (md's string keys sorted by
 * cmp_mkey(), nk of them), as flx_pv_dict_get(md, key) finds it (a
 * repeated key: the last) without a scan of md per key. */
static const flx_pv *mkey_get(const flx_pv *md, const mkey *k, size_t nk,
			      const char *key)
{
	mkey want = {key, strlen(key), SIZE_MAX};
	size_t lo = 0, hi = nk;

	/* the first key above (key, SIZE_MAX): the one before it is the
	 * last of key's run, if any */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (cmp_mkey(&k[mid], &want) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (!lo || k[lo - 1].len != want.len ||
	    memcmp(k[lo - 1].s, key, want.len) != 0)
		return NULL;
	return md->u.dict.kv[2 * k[lo - 1].at + 1];
}

/* The DCP loader's attrs hook: every tensor mcore_data says is
 * reformulated, presented under its original shape.  mcore_data has an
 * entry per tensor: its keys are sorted once, and each tensor's found by
 * a binary search. */
static int reformulated(flx_build *b, const flx_pv *attrs, flx_error *err)
{
	const flx_pv *md = flx_pv_dict_get(attrs, "mcore_data");
	flx_ckpt *c = flx_build_ckpt(b);
	mkey *k = NULL;
	size_t nk = 0;
	int rc = 0;

	if (!md || md->kind == FLX_PV_NONE)
		return 0;
	if (md->kind != FLX_PV_DICT)
		return flx_error_set(err, -EINVAL, ".metadata", "mcore_data",
				     "not a dict (a %s)", flx_pv_kind_name(md));
	if (!md->u.dict.n)
		return 0;
	k = malloc(md->u.dict.n * sizeof(*k));
	if (!k)
		return -ENOMEM;
	for (size_t i = 0; i < md->u.dict.n; i++) {
		const flx_pv *key = md->u.dict.kv[2 * i];

		if (key->kind == FLX_PV_STR && key->u.str.s)
			k[nk++] = (mkey){key->u.str.s, key->u.str.len, i};
	}
	qsort(k, nk, sizeof(*k), cmp_mkey);
	for (size_t i = 0; i < c->ntensors && !rc; i++) {
		flx_tensor *t = &c->tensors[i];
		const flx_pv *e = mkey_get(md, k, nk, t->fqn), *v;
		int64_t orig[FLX_MAX_DIMS], s[FLX_MAX_DIMS];
		int n = 0;

		if (!e || e->kind != FLX_PV_DICT ||
		    !(v = flx_pv_dict_get(e, ORIG_SHAPE)))
			continue;
		rc = orig_shape(t->fqn, v, &n, orig, err);
		if (!rc)
			rc = check_reformulated(t, n, orig, s, err);
		if (!rc)
			rc = unflatten(&c->pool, t, n, orig, s, err);
	}
	free(k);
	return rc;
}

/* ---- the save directory ---- */

/* Into sub (cap bytes) iteration iter's directory, as Megatron names it
 * ("iter_0000100"). */
static void iter_sub(uint64_t iter, char *sub, size_t cap)
{
	snprintf(sub, cap, "iter_%07llu", (unsigned long long)iter);
}

/*
 * The tracker's text (docs/formats/megatron.md#save-directory), read as
 * Megatron's read_metadata() does: stripped of white space, an iteration
 * (decimal digits) or "release". Into sub the directory it names: "iter_%07d"
 * or "release".
 */
static int parse_tracker(const char *buf, size_t len, char *sub, size_t cap,
			 flx_error *err)
{
	const char *ws = " \t\n\r\v\f";
	size_t a = 0, n = len;
	uint64_t it = 0;

	while (a < n && strchr(ws, buf[a]) && buf[a])
		a++;
	while (n > a && strchr(ws, buf[n - 1]) && buf[n - 1])
		n--;
	if (n - a == 7 && !memcmp(buf + a, "release", 7)) {
		snprintf(sub, cap, "release");
		return 0;
	}
	if (n == a || n - a > 18)
		goto bad;
	for (size_t i = a; i < n; i++) {
		if (buf[i] < '0' || buf[i] > '9')
			goto bad;
		it = it * 10 + (uint64_t)(buf[i] - '0');
	}
	iter_sub(it, sub, cap);
	return 0;
bad:
	return flx_error_set(err, -EINVAL, TRACKER_NAME, NULL,
			     "'%.*s' is neither an iteration number nor "
			     "'release'",
			     (int)(n - a > 32 ? 32 : n - a), buf + a);
}

/*
 * A Megatron save directory (no metadata.json of its own): the iteration
 * directory -o megatron_iter=N names, else the one its
 * latest_checkpointed_iteration.txt names, is the checkpoint.
 */
int flx_mcore_enter(const flx_dirview *v, const flx_ckpt_opts *o, char *sub,
		    size_t cap, flx_error *err)
{
	void *buf = NULL;
	size_t len = 0;
	uint64_t it;
	int rc;

	sub[0] = '\0';
	if (!flx_opt_u64(o->vals, "megatron_iter", &it)) {
		iter_sub(it, sub, cap);
		if (v->kind(v, sub) != FLX_DV_DIR)
			return flx_error_set(err, -ENOENT, sub, "megatron_iter",
					     "no such iteration directory in "
					     "the save directory");
		return 0;
	}
	if (v->kind(v, CONFIG_NAME) != FLX_DV_NONE ||
	    v->kind(v, TRACKER_NAME) == FLX_DV_NONE)
		return 0;
	rc = v->read(v, TRACKER_NAME, MAX_TRACKER_BYTES, &buf, &len, err);
	if (!rc)
		rc = parse_tracker(buf, len, sub, cap, err);
	free(buf);
	if (!rc && v->kind(v, sub) != FLX_DV_DIR) {
		rc = flx_error_set(err, -ENOENT, TRACKER_NAME, NULL,
				   "names %s, which is not a directory %s", sub,
				   v->where);
		sub[0] = '\0';
	}
	return rc;
}

/* An iteration number as Megatron writes it in its tracker file: digits
 * only, no sign, at most 18. */
static int check_iter(const flx_opt *o, const char *value, uint64_t *num,
		      flx_error *err)
{
	uint64_t v = 0;
	const char *p = value ? value : "";

	if (!*p || strlen(p) > 18)
		goto bad;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			goto bad;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	*num = v;
	return 0;
bad:
	return flx_error_set(err, -EINVAL, NULL, o->name,
			     "'%s' is not an iteration (a decimal number)",
			     value ? value : "");
}

static const char *const swiglu_choices[] = {"off", "on", NULL};

static const flx_opt mcore_opts[] = {
    {.name = "megatron_iter",
     .type = FLX_OPT_UINT,
     .metavar = "N",
     .def = "the one latest_checkpointed_iteration.txt names",
     .help = "the iteration of a Megatron save directory to read",
     .check = check_iter,
     .flags = FLX_OPT_BARE},
    {.name = FLX_MEGATRON_SWIGLU_OPT,
     .type = FLX_OPT_CHOICE,
     .metavar = "on|off",
     .def = "args.swiglu, else what fc1's saved chunks show",
     .help = "whether linear_fc1 is SwiGLU ([gate; up]), for a checkpoint "
	     "whose args do not say; refused when it contradicts them",
     .choices = swiglu_choices},
};

const flx_opt_group flx_mcore_opts = {
    .owner = "megatron",
    .title = "Megatron-Core sources (torch_dist, zarr)",
    .opts = mcore_opts,
    .nopts = FLX_OPT_COUNT(mcore_opts),
};

const char *const flx_mcore_facts[] = {"swiglu", NULL};

int flx_mcore_fact(const flx_ckpt *c, const char *name, flx_fact *out)
{
	const flx_megatron *m = c->src_state;

	if (!m)
		return -ENOENT;
	if (!strcmp(name, FLX_FACT_MEGATRON)) {
		*out = (flx_fact){.type = FLX_FACT_PTR, .v.p = m};
		return 0;
	}
	if (!strcmp(name, "swiglu") && m->swiglu < 0 && m->has_fc1) {
		/* docs/facts.md: never a guessed split */
		*out =
		    (flx_fact){.type = FLX_FACT_TEXT,
			       .v.s = "absent from the args and not shown by "
				      "fc1's saved chunks: state it with "
				      "-o " FLX_MEGATRON_SWIGLU_OPT "=on|off"};
		return -ENODATA;
	}
	if (!strcmp(name, "swiglu")) {
		*out = (flx_fact){.type = FLX_FACT_BOOL, .v.b = m->swiglu == 1};
		return 0;
	}
	return -ENOENT;
}

/* ---- the source ---- */

static bool owns(const char *name)
{
	return strcmp(name, CONFIG_NAME) == 0 ||
	       strcmp(name, COMMON_NAME) == 0 || flx_dcp_owns(name);
}

/* metadata.json beside a .metadata: load says what is wrong with it.  A
 * zarr checkpoint has none (zarr.c). */
static int probe(int dirfd, bool *yes)
{
	*yes = flx_mcore_exists(dirfd, CONFIG_NAME) &&
	       flx_mcore_exists(dirfd, ".metadata");
	return 0;
}

static int set_writer(flx_ckpt *c, const char *kind)
{
	const char *w = c->writer;
	size_t n = strlen(kind) + (w ? strlen(w) : 0) + 32;
	char *s = malloc(n);

	if (!s)
		return -ENOMEM;
	snprintf(s, n, "Megatron-Core %s%s%s", kind, w ? ", " : "", w ? w : "");
	free(c->writer);
	c->writer = s;
	return 0;
}

/* ---- args.swiglu, when common.pt does not state it ---- */

/* What fc1's saved chunks say of SwiGLU (Megatron-Core's
 * apply_swiglu_sharded_factory() in megatron/core/transformer/mlp.py
 * saves a SwiGLU fc1 as two sharded tensors per TP rank, its rows of the
 * first half (W) and of the second (V); a plain fc1 is one, a contiguous
 * range of the rows): 1, 0, or -1 when they do not tell.  rows: fc1's
 * rows axis (past the stacked ones); tp: args.tensor_model_parallel_size
 * or -1. */
static int fc1_verdict(const flx_tensor *t, int64_t tp)
{
	int axis = t->stacked, pair = 0, n = t->ndim;
	int64_t rows, half;

	if (axis >= n || t->shape[axis] < 2 || t->shape[axis] % 2)
		return -1;
	rows = t->shape[axis];
	half = rows / 2;
	for (uint32_t i = 0; i < t->nchunks; i++) {
		const flx_chunk *a = &t->chunks[i];
		int64_t lo = a->off[axis], hi = lo + a->size[axis];

		/* a range across the middle: no SwiGLU half */
		if (lo < half && hi > half)
			return 0;
		/* another chunk of the same file at the same place but
		 * half the rows further: W and V of one rank */
		for (uint32_t j = 0; j < t->nchunks && !pair; j++) {
			const flx_chunk *c = &t->chunks[j];
			bool same = c->file == a->file && j != i &&
				    c->off[axis] == lo + half &&
				    c->size[axis] == a->size[axis];

			for (int d = 0; d < n && same; d++)
				same = d == axis || (c->off[d] == a->off[d] &&
						     c->size[d] == a->size[d]);
			pair = same;
		}
	}
	if (pair)
		return 1;
	/* one sharded tensor per rank: rows / tp each, or two: rows / 2tp */
	if (tp >= 1 && rows % (2 * tp) == 0) {
		int64_t want1 = rows / (2 * tp), want0 = rows / tp;
		bool all1 = true, all0 = true;

		for (uint32_t i = 0; i < t->nchunks; i++) {
			all1 &= t->chunks[i].size[axis] == want1;
			all0 &= t->chunks[i].size[axis] == want0;
		}
		if (all1 != all0)
			return all1 ? 1 : 0;
	}
	return -1;
}

/* args.swiglu absent: decided from every model fc1 weight's chunks when
 * they all tell the same; else left absent (-1), and megatron/ says why
 * (reshard/megatron/megatron_legacy.c). */
static void infer_swiglu(flx_ckpt *c, flx_megatron *m)
{
	static const char suf[] = "linear_fc1.weight";
	const size_t k = sizeof(suf) - 1;
	int verdict = -2;

	for (size_t i = 0; i < c->ntensors; i++) {
		const flx_tensor *t = &c->tensors[i];
		size_t len = strlen(t->fqn);
		int v;

		if (len < k || strcmp(t->fqn + len - k, suf) ||
		    !strncmp(t->fqn, "optimizer.", 10) ||
		    !strncmp(t->fqn, "chained_", 8))
			continue;
		v = fc1_verdict(t, m->tensor_model_parallel_size);
		if (v < 0 || (verdict != -2 && v != verdict))
			return;
		verdict = v;
	}
	if (verdict >= 0) {
		m->swiglu = verdict;
		m->swiglu_inferred = true;
	}
}

int flx_mcore_state_swiglu(const flx_opt_vals *vals, flx_megatron *m,
			   const char *proof, flx_error *err)
{
	uint64_t v;

	if (flx_opt_u64(vals, FLX_MEGATRON_SWIGLU_OPT, &v))
		return 0;
	if (m->swiglu >= 0 && (uint64_t)m->swiglu != v)
		return flx_error_set(
		    err, -EINVAL, NULL, FLX_MEGATRON_SWIGLU_OPT,
		    "'%s' contradicts %s (%s)", swiglu_choices[v], proof,
		    m->swiglu ? "SwiGLU" : "not SwiGLU");
	if (m->swiglu < 0) {
		m->swiglu = (int)v;
		m->swiglu_stated = true;
	}
	return 0;
}

/* Whether c has a model linear_fc1 weight (dense or an expert's). */
static bool any_fc1(const flx_ckpt *c)
{
	static const char suf[] = "linear_fc1.weight";
	const size_t k = sizeof(suf) - 1;

	for (size_t i = 0; i < c->ntensors; i++) {
		const char *f = c->tensors[i].fqn;
		size_t len = strlen(f);

		if (len >= k && !strcmp(f + len - k, suf) &&
		    strncmp(f, "optimizer.", 10) && strncmp(f, "chained_", 8))
			return true;
	}
	return false;
}

int flx_mcore_finish(flx_build *b, const char *kind, bool objects_bare,
		     const flx_ckpt_opts *o, flx_error *err)
{
	bool from_args;
	flx_ckpt *c = flx_build_ckpt(b);
	flx_megatron *m = flx_pool_alloc(&c->pool, sizeof(*m));
	int rc;

	if (!m)
		return -ENOMEM;
	rc = load_common(b, m, err);
	if (rc)
		return rc;
	m->release =
	    flx_build_entered(b) && !strcmp(flx_build_entered(b), "release");
	m->objects_bare = objects_bare;
	c->src_state = m;
	mark_stacked(c);
	m->has_fc1 = any_fc1(c);
	from_args = m->swiglu >= 0;
	/* torch_dist: each saved chunk is one sharded tensor of one rank
	 * (zarr's are its own grid's) */
	if (m->swiglu < 0 && !strcmp(kind, "torch_dist"))
		infer_swiglu(c, m);
	rc = flx_mcore_state_swiglu(o ? o->vals : NULL, m,
				    from_args
					? "args.swiglu of the common state"
					: "what linear_fc1's saved chunks show",
				    err);
	if (rc)
		return rc;
	return set_writer(c, kind);
}

static int load(flx_build *b, const flx_ckpt_opts *o, flx_error *err)
{
	static const flx_dcp_opts dopts = {
	    .sub_module = MCORE_MODULE,
	    .sub_class = "MCoreMetadata",
	    .missing = "no such file (a torch_dist checkpoint has one)",
	    .attrs = reformulated,
	};
	int64_t mtime;
	int rc = flx_mcore_config(b, "torch_dist", &mtime, err);

	if (!rc)
		rc = flx_dcp_load(b, o, &dopts, err);
	if (!rc)
		rc = flx_mcore_finish(b, "torch_dist", false, o, err);
	return rc;
}

const flx_source flx_source_megatron = {
    .name = "megatron-torch_dist",
    .kind = "Megatron-Core torch_dist",
    .marker = CONFIG_NAME,
    .variant = true,
    .probe = probe,
    .owns = owns,
    .load = load,
    .metadata = CONFIG_NAME,
    .enter = flx_mcore_enter,
    .opts = &flx_mcore_opts,
    .fact = flx_mcore_fact,
    .facts = flx_mcore_facts,
};
