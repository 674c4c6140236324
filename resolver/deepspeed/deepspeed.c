/* SPDX-License-Identifier: MIT */
/*
 * The DeepSpeed ZeRO source (source.h), stages 1, 2 and 3, fp16 and bf16:
 * a save directory whose `latest` names a tag directory, or the tag
 * directory itself, holding
 *   mp_rank_MM_model_states.pt                      (stages 1, 2)
 *   zero_pp_rank_D_mp_rank_MM_model_states.pt       (stage 3, per DP rank)
 *   [bf16_]zero_pp_rank_D_mp_rank_MM_optim_states.pt (per DP rank)
 * for model-parallel (tensor-parallel) ranks MM = 00, 01, ...
 * all torch.save files (docs/formats/deepspeed.md), read in place by
 * resolver/codec/torchfile.h.
 *
 * The index holds what deepspeed/utils/zero_to_fp32.py returns
 * (get_fp32_state_dict_from_zero_checkpoint), in its order: the buffers of
 * buffer_names as float32 (the saved dtype is read and converted,
 * flx_tensor.stored), the frozen parameters from their fragments, every
 * trainable parameter's fp32 master from the flat partitions, the shared
 * parameters under both names; then the Adam moments as
 * optimizer.state.exp_avg.<param> and optimizer.state.exp_avg_sq.<param>.
 * Nothing is decoded: each parameter is box chunks over the saved flat
 * tensors in place (flx_flat_boxes()), one run per partition it spans;
 * padding is never part of a chunk.
 *
 * The pickles are decoded by the inert pickle VM and only read: the
 * DeepSpeed names they hold (ZeroStageEnum, the loss scalers, fragment
 * addresses) are recognised by name where a value is needed (the stage),
 * never resolved.
 *
 * Tensor-parallel ZeRO (mp_rank_01 and up): each model-parallel rank's
 * files are read as above into that rank's state dict (its slices), then
 * every tensor becomes one global tensor (merge_one()): the ranks' slices
 * as box chunks one after the other along the axis a rules= rule states
 * (flx_ckpt_opts.split_rule), or along the one axis their shapes differ
 * in; with equal shapes and no rule, rank 0's tensor when every rank
 * holds the same bytes (compared at mount), else refused naming the
 * tensor and rules=.  The files record no split axis
 * (docs/formats/deepspeed.md#tensor-parallel-zero).
 */
#include "deepspeed.h"

#include "opt.h"
#include "pickle.h"
#include "reader.h"
#include "source.h"
#include "torchfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LATEST_NAME	 "latest"
#define MAX_LATEST_BYTES 4096u
#define MAX_RANKS	 65536u
#define MAX_MP		 4096u
#define MODEL12_NAME	 "mp_rank_00_model_states.pt"
#define MODEL_SUFFIX	 "_model_states.pt"
#define OPTIM_SUFFIX	 "_optim_states.pt"
#define MOMENT_PREFIX	 "optimizer.state."

/* One torch.save file, parsed in place (torchfile.h). */
typedef struct ds_file {
	char *name;   /* relative to the checkpoint directory */
	uint32_t idx; /* in c->files */
	flx_torchfile *tf;
	const flx_pv *root;
} ds_file;

/* A saved tensor located in its file. */
typedef struct ds_saved {
	const ds_file *f;
	const char *key;   /* for messages */
	uint64_t data_off; /* the storage record's offset in the file */
	flx_tensor_pkl p;
} ds_saved;

/* A flat vector: saved 1-D tensors concatenated (ranks, groups). */
typedef struct ds_flat {
	ds_saved *t;
	size_t n, cap;
	uint64_t total;
} ds_flat;

/* One chunk being collected. */
typedef struct ds_box {
	int64_t off[FLX_MAX_DIMS];
	int64_t size[FLX_MAX_DIMS];
	uint32_t file;
	uint64_t data_off;
	int64_t storage_offset;
	int64_t stride[FLX_MAX_DIMS];
} ds_box;

typedef struct ds {
	flx_build *b;
	flx_ckpt *c;
	flx_error *err;
	ds_file *model; /* stage 3: one per rank; else one */
	size_t nmodel;
	ds_file *optim;
	size_t noptim;
	int stage;
	bool bf16opt; /* BF16_Optimizer's files (no zero_stage) */
	bool lp;      /* ds_weights=module: the module's weights in hf/ */
	/* tensors of the index being made */
	flx_tensor *t;
	size_t nt, capt;
	ds_box *boxes;
	size_t nboxes, capboxes;
} ds;

/* ---- names ---- */

static bool ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);

	return a >= b && !strcmp(s + a - b, suf);
}

/* "[bf16_]zero_pp_rank_<D>_mp_rank_<MM><suffix>": D and MM, or false. */
static bool zero_name(const char *s, const char *suffix, bool *bf16,
		      unsigned long *d, unsigned long *mp)
{
	char *end;

	*bf16 = !strncmp(s, "bf16_", 5);
	if (*bf16)
		s += 5;
	if (strncmp(s, "zero_pp_rank_", 13))
		return false;
	s += 13;
	if (*s < '0' || *s > '9' || (*s == '0' && s[1] >= '0' && s[1] <= '9'))
		return false;
	*d = strtoul(s, &end, 10);
	if (*d >= MAX_RANKS || strncmp(end, "_mp_rank_", 9))
		return false;
	s = end + 9;
	if (s[0] < '0' || s[0] > '9' || s[1] < '0' || s[1] > '9')
		return false;
	*mp = strtoul(s, &end, 10);
	return !strcmp(end, suffix);
}

/* "mp_rank_<MM>_model_states.pt": MM, or false. */
static bool model12_name(const char *s, unsigned long *mp)
{
	char *end;

	if (strncmp(s, "mp_rank_", 8) || s[8] < '0' || s[8] > '9' ||
	    s[9] < '0' || s[9] > '9')
		return false;
	*mp = strtoul(s + 8, &end, 10);
	return !strcmp(end, MODEL_SUFFIX);
}

static bool owns(const char *name)
{
	return !strcmp(name, LATEST_NAME) || ends_with(name, MODEL_SUFFIX) ||
	       ends_with(name, OPTIM_SUFFIX);
}

/* Whether dir ("" the top) of v is a tag directory: a model-states file
 * and an optim-states file of rank 0 (either stage's names). */
static bool tag_dir(const flx_dirview *v, const char *dir)
{
	static const char *const model[] = {
	    MODEL12_NAME, "zero_pp_rank_0_mp_rank_00" MODEL_SUFFIX, NULL};
	static const char *const optim[] = {
	    "zero_pp_rank_0_mp_rank_00" OPTIM_SUFFIX,
	    "bf16_zero_pp_rank_0_mp_rank_00" OPTIM_SUFFIX, NULL};
	const char *const *sets[] = {model, optim};
	char path[512];

	for (size_t k = 0; k < 2; k++) {
		bool any = false;

		for (const char *const *n = sets[k]; *n && !any; n++) {
			snprintf(path, sizeof(path), "%s%s%s", dir,
				 *dir ? "/" : "", *n);
			any = v->kind(v, path) == FLX_DV_FILE;
		}
		if (!any)
			return false;
	}
	return true;
}

static int probe(int dirfd, bool *yes)
{
	flx_dirview v;

	flx_dirview_local(&v, dirfd, NULL);
	*yes = tag_dir(&v, "");
	return 0;
}

int flx_ds_latest_tag(const char *buf, size_t len, char *sub, size_t cap,
		      flx_error *err)
{
	const char *ws = " \t\n\r\v\f";
	size_t a = 0, n = len;

	while (a < n && buf[a] && strchr(ws, buf[a]))
		a++;
	while (n > a && buf[n - 1] && strchr(ws, buf[n - 1]))
		n--;
	if (n == a)
		return flx_error_set(err, -EINVAL, LATEST_NAME, NULL,
				     "names no tag (empty)");
	if (n - a >= cap || (n - a == 1 && buf[a] == '.') ||
	    (n - a == 2 && buf[a] == '.' && buf[a + 1] == '.'))
		goto bad;
	for (size_t i = a; i < n; i++)
		if (buf[i] == '/' || (unsigned char)buf[i] < 0x20 ||
		    buf[i] == 0x7f)
			goto bad;
	memcpy(sub, buf + a, n - a);
	sub[n - a] = '\0';
	return 0;
bad:
	return flx_error_set(err, -EINVAL, LATEST_NAME, NULL,
			     "'%.*s' is not a plain directory name",
			     (int)(n - a > 32 ? 32 : n - a), buf + a);
}

/* Whether some subdirectory (among the first MAX_SCAN entries) is a tag
 * directory (holds model and optimizer states) or is named as DeepSpeed's
 * default tags are (global_step<N>): a `latest` beside none is not a
 * DeepSpeed save directory's, and is left to the other sources. */
#define MAX_SCAN 4096

static int is_tag_dir(void *arg, const char *name)
{
	/* DeepSpeed's default tag, or a directory holding a tag's files */
	return !strncmp(name, "global_step", 11) || tag_dir(arg, name);
}

static int has_tag_dir(const flx_dirview *v)
{
	return v->each_dir(v, MAX_SCAN, is_tag_dir, (void *)v);
}

/* A save directory: `latest` names the tag directory to read. */
static int enter(const flx_dirview *v, const flx_ckpt_opts *o, char *sub,
		 size_t cap, flx_error *err)
{
	void *buf = NULL;
	size_t len = 0;
	const char *tag;
	int rc;

	sub[0] = '\0';
	if (!flx_opt_text(o->vals, "ds_tag", &tag)) {
		rc = flx_ds_latest_tag(tag, strlen(tag), sub, cap, err);
		if (!rc && v->kind(v, sub) != FLX_DV_DIR) {
			rc = flx_error_set(err, -ENOENT, sub, "ds_tag",
					   "no such tag directory in the save "
					   "directory");
			sub[0] = '\0';
		}
		if (rc)
			flx_error_key(err, "ds_tag");
		return rc;
	}
	if (tag_dir(v, "") || v->kind(v, LATEST_NAME) != FLX_DV_FILE)
		return 0;
	rc = has_tag_dir(v);
	if (rc < 0)
		return flx_error_set(err, rc, ".", NULL,
				     "cannot list the save directory: %s",
				     strerror(-rc));
	if (!rc)
		return 0;
	rc = v->read(v, LATEST_NAME, MAX_LATEST_BYTES, &buf, &len, err);
	if (!rc)
		rc = flx_ds_latest_tag(buf, len, sub, cap, err);
	free(buf);
	if (!rc && v->kind(v, sub) != FLX_DV_DIR) {
		rc = flx_error_set(err, -ENOENT, LATEST_NAME, NULL,
				   "names %s, which is not a directory %s", sub,
				   v->where);
		sub[0] = '\0';
	}
	return rc;
}

/* ---- reading a torch.save file ---- */

static int open_file(ds *d, ds_file *f, const char *name, const char *why)
{
	const flx_file_ref ref = {LATEST_NAME, "tag directory", why};
	flx_file_reader fr;
	flx_reader r;
	int rc;

	f->name = strdup(name);
	if (!f->name)
		return -ENOMEM;
	rc = flx_build_data_file(d->b, name, &ref, &f->idx);
	if (rc)
		return rc;
	flx_reader_file(&r, &fr, d->c, f->idx, 0, d->c->files[f->idx].size);
	rc = flx_torchfile_open(&r, name, &f->tf, d->err);
	if (rc)
		return rc;
	f->root = flx_torchfile_root(f->tf);
	if (!f->root || f->root->kind != FLX_PV_DICT)
		return flx_error_set(d->err, -EINVAL, name, NULL,
				     "the saved object is a %s, not a dict",
				     flx_pv_kind_name(f->root));
	return 0;
}

static void close_file(ds_file *f)
{
	free(f->name);
	flx_torchfile_close(f->tf);
}

/* v, a tensor of f, located (flx_torchfile_resolve(): its storage lies in
 * the file and holds it). */
static int saved_tensor(ds *d, const ds_file *f, const flx_pv *v,
			const char *key, ds_saved *out)
{
	flx_torchfile_tensor tt;
	int rc;

	memset(out, 0, sizeof(*out));
	if (!flx_torchfile_is_tensor(v))
		return flx_error_set(d->err, -EINVAL, f->name, key,
				     "a %s, not a tensor", flx_pv_kind_name(v));
	rc = flx_torchfile_resolve(f->tf, v, key, &tt, d->err);
	if (rc)
		return rc;
	out->p = tt.t;
	out->f = f;
	out->key = key;
	out->data_off = tt.data_off;
	return 0;
}

static int64_t numel_of(int ndim, const int64_t *size)
{
	int64_t n = 1;

	for (int i = 0; i < ndim; i++)
		n *= size[i];
	return n;
}

/* A saved 1-D piece of a flat vector: contiguous. */
static int flat_add(ds *d, ds_flat *fl, const ds_file *f, const flx_pv *v,
		    const char *key, flx_dtype want)
{
	ds_saved s;
	int rc = saved_tensor(d, f, v, key, &s);

	if (rc)
		return rc;
	if (s.p.ndim != 1 || (s.p.size[0] > 1 && s.p.stride[0] != 1))
		return flx_error_set(d->err, -EINVAL, f->name, key,
				     "a flat partition must be one "
				     "contiguous dimension (%d dims)",
				     s.p.ndim);
	if (!want && fl->n)
		want = fl->t[0].p.dtype;
	if (want && s.p.dtype != want)
		return flx_error_set(d->err, -EINVAL, f->name, key,
				     "dtype %s, the partitions before it %s",
				     flx_dtype_name(s.p.dtype),
				     flx_dtype_name(want));
	if (flx_grow((void **)&fl->t, &fl->cap, fl->n + 1, sizeof(ds_saved)))
		return -ENOMEM;
	fl->t[fl->n++] = s;
	fl->total += (uint64_t)s.p.size[0];
	return 0;
}

/* ---- pickle values ---- */

/* A torch.Size (or a tuple/list of ints): its dims. */
static int shape_of(ds *d, const ds_file *f, const char *key, const flx_pv *v,
		    int *ndim, int64_t *shape)
{
	const flx_pv *tup = v;

	if (v && v->kind == FLX_PV_OBJ && flx_pv_is_obj_of(v, "Size"))
		tup = flx_pv_item(v->u.obj.args, 0);
	if (!tup || (tup->kind != FLX_PV_TUPLE && tup->kind != FLX_PV_LIST))
		return flx_error_set(d->err, -EINVAL, f->name, key,
				     "the shape is a %s, not a torch.Size",
				     flx_pv_kind_name(v));
	if (flx_pv_len(tup) > FLX_MAX_DIMS)
		return flx_error_set(d->err, -EINVAL, f->name, key,
				     "%zu dimensions, at most %d",
				     flx_pv_len(tup), FLX_MAX_DIMS);
	*ndim = (int)flx_pv_len(tup);
	for (int i = 0; i < *ndim; i++) {
		int64_t x;

		if (!flx_pv_int(flx_pv_item(tup, (size_t)i), &x) || x < 0 ||
		    x > (INT64_C(1) << 48))
			return flx_error_set(d->err, -EINVAL, f->name, key,
					     "dimension %d is not a size", i);
		shape[i] = x;
	}
	if (numel_of(*ndim, shape) > (INT64_C(1) << 48))
		return flx_error_set(d->err, -EINVAL, f->name, key,
				     "more than 2^48 elements");
	return 0;
}

/* ZeroStageEnum: getattr(ZeroStageEnum, "<member>") (Python >= 3.11),
 * ZeroStageEnum(<int>) (older), or a plain int. */
static int stage_of(ds *d, const ds_file *f, const flx_pv *v, int *stage)
{
	static const char *const names[] = {"disabled", "optimizer_states",
					    "gradients", "weights"};
	const flx_pv *cls = flx_pv_obj_class(v);
	const flx_pv *args = v && v->kind == FLX_PV_OBJ ? v->u.obj.args : NULL;
	int64_t x = -1;

	if (flx_pv_int(v, &x)) {
	} else if (cls && flx_pv_is_global(cls, NULL, "getattr") &&
		   flx_pv_is_global(flx_pv_item(args, 0),
				    "deepspeed.runtime.zero.config",
				    "ZeroStageEnum")) {
		const char *m = flx_pv_str(flx_pv_item(args, 1));

		for (int i = 0; m && i < 4; i++)
			if (!strcmp(m, names[i]))
				x = i;
		if (m && !strcmp(m, "max_stage"))
			x = 3;
	} else if (cls && flx_pv_is_global(cls, "deepspeed.runtime.zero.config",
					   "ZeroStageEnum")) {
		if (!flx_pv_int(flx_pv_item(args, 0), &x))
			x = -1;
	}
	if (x < 1 || x > 3)
		return flx_error_set(d->err, -EINVAL, f->name,
				     "optimizer_state_dict.zero_stage",
				     "not a ZeRO stage 1, 2 or 3");
	*stage = (int)x;
	return 0;
}

/* ---- the index ---- */

static int new_tensor(ds *d, const char *name, flx_dtype dt, int ndim,
		      const int64_t *shape, flx_tensor **out)
{
	size_t len = strlen(name) + 1;
	flx_tensor *t;

	for (size_t i = 0; i < d->nt; i++)
		if (!strcmp(d->t[i].fqn, name)) {
			*out = &d->t[i];
			t = *out;
			goto fill;
		}
	if (flx_grow((void **)&d->t, &d->capt, d->nt + 1, sizeof(flx_tensor)))
		return -ENOMEM;
	t = &d->t[d->nt++];
	memset(t, 0, sizeof(*t));
	t->fqn = flx_pool_alloc(&d->c->pool, len);
	if (!t->fqn)
		return -ENOMEM;
	memcpy(t->fqn, name, len);
	*out = t;
fill:
	t->dtype = dt;
	t->stored = FLX_DT_INVALID;
	t->ndim = ndim;
	memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
	t->saved_split = -1;
	t->nchunks = 0;
	t->chunks = NULL;
	t->dims = NULL;
	d->nboxes = 0;
	return 0;
}

/* The box of an index chunk of a tensor of ndim dimensions. */
static ds_box box_of(const flx_chunk *ch, int ndim)
{
	ds_box bx = {.file = ch->file,
		     .data_off = ch->data_off,
		     .storage_offset = ch->storage_offset};

	for (int k = 0; k < ndim; k++) {
		bx.off[k] = ch->off[k];
		bx.size[k] = ch->size[k];
		bx.stride[k] = ch->stride[k];
	}
	return bx;
}

static int add_box(ds *d, const ds_box *bx)
{
	if (flx_grow((void **)&d->boxes, &d->capboxes, d->nboxes + 1,
		     sizeof(ds_box)))
		return -ENOMEM;
	d->boxes[d->nboxes++] = *bx;
	return 0;
}

/* The collected boxes become t's chunks, checked. */
static int finish_tensor(ds *d, flx_tensor *t, const char *from)
{
	int rc = flx_tensor_pool_chunks(&d->c->pool, t, (uint32_t)d->nboxes);

	if (rc)
		return rc;
	for (size_t i = 0; i < d->nboxes; i++) {
		flx_chunk *ch = &t->chunks[i];
		const ds_box *bx = &d->boxes[i];

		for (int k = 0; k < t->ndim; k++) {
			ch->off[k] = bx->off[k];
			ch->size[k] = bx->size[k];
			ch->stride[k] = bx->stride[k];
		}
		ch->file = bx->file;
		ch->data_off = ch->item_off = bx->data_off;
		ch->item_len = 0;
		ch->storage_offset = bx->storage_offset;
		ch->contig_from = flx_chunk_contig_from(t->ndim, ch);
	}
	d->nboxes = 0;
	return flx_tensor_check_chunks(t, from, d->err);
}

/* The elements [e0, e0 + count) of t (row-major) lie at [at, at + count)
 * of the flat vector fl: one run per piece they meet, as boxes. */
static int map_range(ds *d, const flx_tensor *t, const ds_flat *fl, uint64_t at,
		     uint64_t count, int64_t e0)
{
	int64_t off[FLX_FLAT_BOXES_MAX][FLX_MAX_DIMS];
	int64_t size[FLX_FLAT_BOXES_MAX][FLX_MAX_DIMS];
	int64_t first[FLX_FLAT_BOXES_MAX], rs[FLX_MAX_DIMS];
	uint64_t cs = 0;
	int64_t step = 1;
	int rc;

	for (int k = t->ndim - 1; k >= 0; k--) {
		rs[k] = step;
		step *= t->shape[k] ? t->shape[k] : 1;
	}
	for (size_t i = 0; i < fl->n && count; i++) {
		const ds_saved *s = &fl->t[i];
		uint64_t len = (uint64_t)s->p.size[0];
		uint64_t a = at > cs ? at : cs;
		uint64_t z = at + count < cs + len ? at + count : cs + len;
		int64_t p0 = e0 + (int64_t)(a - at),
			p1 = e0 + (int64_t)(z - at);
		unsigned nb = 0;

		if (a < z) {
			flx_flat_boxes(t->ndim, t->shape, p0, p1, off, size,
				       first, &nb);
			for (unsigned j = 0; j < nb; j++) {
				ds_box bx = {.file = s->f->idx,
					     .data_off = s->data_off};

				memcpy(bx.off, off[j], sizeof(bx.off));
				memcpy(bx.size, size[j], sizeof(bx.size));
				memcpy(bx.stride, rs, sizeof(bx.stride));
				bx.storage_offset = s->p.storage_offset +
						    (int64_t)(a - cs) +
						    (first[j] - p0);
				rc = add_box(d, &bx);
				if (rc)
					return rc;
			}
		}
		cs += len;
	}
	return 0;
}

/* A tensor saved whole (a buffer, a stage 1/2 frozen parameter). */
static int whole(ds *d, const ds_file *f, const flx_pv *v, const char *name,
		 bool to_f32, int ndim, const int64_t *shape)
{
	ds_saved s;
	flx_tensor *t;
	ds_box bx = {0};
	flx_dtype st;
	int rc = saved_tensor(d, f, v, name, &s);

	if (rc)
		return rc;
	if (ndim >= 0 &&
	    (s.p.ndim != ndim ||
	     memcmp(s.p.size, shape, sizeof(int64_t) * (size_t)ndim)))
		return flx_error_set(d->err, -EINVAL, f->name, name,
				     "saved with %lld elements in %d dims, "
				     "its recorded shape has %lld in %d",
				     (long long)numel_of(s.p.ndim, s.p.size),
				     s.p.ndim, (long long)numel_of(ndim, shape),
				     ndim);
	st = s.p.dtype;
	if (to_f32 && (st == FLX_DT_C64 || st == FLX_DT_C128 ||
		       st == FLX_DT_F8_E4M3FN || st == FLX_DT_F8_E5M2 ||
		       st == FLX_DT_F8_E4M3FNUZ || st == FLX_DT_F8_E5M2FNUZ))
		return flx_error_set(d->err, -EINVAL, f->name, name,
				     "a %s buffer: zero_to_fp32 converts "
				     "buffers to float32, flexfs cannot",
				     flx_dtype_name(st));
	rc = new_tensor(d, name, to_f32 ? FLX_DT_F32 : st, s.p.ndim, s.p.size,
			&t);
	if (rc)
		return rc;
	if (to_f32 && st != FLX_DT_F32)
		t->stored = st;
	if (numel_of(s.p.ndim, s.p.size) == 0)
		return finish_tensor(d, t, f->name);
	memcpy(bx.size, s.p.size, sizeof(int64_t) * (size_t)s.p.ndim);
	memcpy(bx.stride, s.p.stride, sizeof(int64_t) * (size_t)s.p.ndim);
	bx.file = f->idx;
	bx.data_off = s.data_off;
	bx.storage_offset = s.p.storage_offset;
	rc = add_box(d, &bx);
	return rc ? rc : finish_tensor(d, t, f->name);
}

static const flx_pv *osd_of(ds *d, const ds_file *f)
{
	const flx_pv *o = flx_pv_dict_get(f->root, "optimizer_state_dict");

	if (!o || o->kind != FLX_PV_DICT) {
		flx_error_set(d->err, -EINVAL, f->name, "optimizer_state_dict",
			      "missing, or not a dict: not a ZeRO optimizer "
			      "states file");
		return NULL;
	}
	return o;
}

static const flx_pv *get_kind(ds *d, const ds_file *f, const flx_pv *dict,
			      const char *key, flx_pv_kind kind,
			      const char *what)
{
	const flx_pv *v = flx_pv_dict_get(dict, key);

	if (!v || (v->kind != kind &&
		   !(kind == FLX_PV_LIST && v->kind == FLX_PV_TUPLE))) {
		flx_error_set(d->err, -EINVAL, f->name, key, "%s, not %s",
			      v ? flx_pv_kind_name(v) : "missing", what);
		return NULL;
	}
	return v;
}

/* The base optimizer's state of flat tensor i (index in its param
 * groups' order): torch.optim's state_dict {"state": {i: {...}}}, or
 * (elastic) a list of per-group states. */
static const flx_pv *moment_state(const flx_pv *base, size_t i)
{
	const flx_pv *st;

	if (!base)
		return NULL;
	if (base->kind == FLX_PV_LIST)
		return flx_pv_item(base, i);
	st = flx_pv_dict_get(base, "state");
	for (size_t k = 0; st && st->kind == FLX_PV_DICT && k < st->u.dict.n;
	     k++) {
		int64_t x;

		if (flx_pv_int(st->u.dict.kv[2 * k], &x) && x >= 0 &&
		    (uint64_t)x == i)
			return st->u.dict.kv[2 * k + 1];
	}
	return NULL;
}

/* The names and shapes of the trainable parameters, group by group. */
typedef struct ds_param {
	const char *name;
	int ndim;
	int64_t shape[FLX_MAX_DIMS];
	int64_t numel;
	size_t group;
} ds_param;

static int read_params(ds *d, const ds_file *m, ds_param **out, size_t *n,
		       size_t *ngroups)
{
	const flx_pv *ps = get_kind(d, m, m->root, "param_shapes", FLX_PV_LIST,
				    "a list of dicts (a checkpoint saved "
				    "without ZeRO?)");
	size_t cap = 0;
	int rc;

	*out = NULL;
	*n = 0;
	if (!ps)
		return -EINVAL;
	*ngroups = flx_pv_len(ps);
	for (size_t g = 0; g < *ngroups; g++) {
		const flx_pv *grp = flx_pv_item(ps, g);

		if (!grp || grp->kind != FLX_PV_DICT)
			return flx_error_set(d->err, -EINVAL, m->name,
					     "param_shapes",
					     "group %zu is a %s, not a dict", g,
					     flx_pv_kind_name(grp));
		for (size_t k = 0; k < grp->u.dict.n; k++) {
			const char *name = flx_pv_str(grp->u.dict.kv[2 * k]);
			ds_param *p;

			if (!name || !*name)
				return flx_error_set(d->err, -EINVAL, m->name,
						     "param_shapes",
						     "a name that is not a "
						     "string");
			if (flx_grow((void **)out, &cap, *n + 1,
				     sizeof(ds_param)))
				return -ENOMEM;
			p = &(*out)[(*n)++];
			p->name = name;
			p->group = g;
			rc = shape_of(d, m, name, grp->u.dict.kv[2 * k + 1],
				      &p->ndim, p->shape);
			if (rc)
				return rc;
			p->numel = numel_of(p->ndim, p->shape);
		}
	}
	return 0;
}

static int moment_name(ds *d, const char *which, const char *param, char **out)
{
	size_t n = strlen(MOMENT_PREFIX) + strlen(which) + strlen(param) + 2;

	*out = malloc(n);
	if (!*out)
		return -ENOMEM;
	snprintf(*out, n, MOMENT_PREFIX "%s.%s", which, param);
	(void)d;
	return 0;
}

static void flats_free(ds_flat *f, size_t n)
{
	for (size_t i = 0; f && i < n; i++)
		free(f[i].t);
	free(f);
}

static int load_shared(ds *d);

static int whole(ds *d, const ds_file *f, const flx_pv *v, const char *name,
		 bool to_f32, int ndim, const int64_t *shape);

/* ds_weights=module: parameter p from the module state dict, as saved
 * (the low-precision weights), in place of its fp32 master. */
static int module_weight(ds *d, const ds_param *p)
{
	const ds_file *m = &d->model[0];
	const flx_pv *v =
	    flx_pv_dict_get(flx_pv_dict_get(m->root, "module"), p->name);

	if (!v)
		return flx_error_set(d->err, -EINVAL, m->name, p->name,
				     "ds_weights=module: the module state "
				     "dict has no such parameter");
	return whole(d, m, v, p->name, false, p->ndim, p->shape);
}

/* zero_to_fp32's sanity check of stages 1 and 2: the parameters consume
 * the group but for the alignment padding (to 2 x world size). */
static bool zero2_adds_up(uint64_t used, uint64_t avail, uint64_t ws)
{
	uint64_t al = 2 * ws;

	return (used + al - 1) / al == (avail + al - 1) / al;
}

/* Adam's moments in a partition's optimizer state */
static const char *const adam_mom[] = {"exp_avg", "exp_avg_sq"};

/* The moments state st has (moment_state()) appended to out[0] and
 * out[1]; *have and *lack count those found and missing. */
static int moments_add(ds *d, const ds_file *f, const flx_pv *st, ds_flat *out,
		       size_t *have, size_t *lack)
{
	int rc = 0;

	for (int k = 0; !rc && k < 2; k++) {
		const flx_pv *v = flx_pv_dict_get(st, adam_mom[k]);

		if (!v) {
			(*lack)++;
			continue;
		}
		(*have)++;
		rc = flat_add(d, &out[k], f, v, adam_mom[k], FLX_DT_INVALID);
	}
	return rc;
}

/* Stages 1 and 2: group g's flat vector is the ranks' partitions of it
 * concatenated in rank order (padding only at its end). */
static int load_stage12(ds *d, ds_param *ps, size_t np, size_t ng)
{
	ds_flat *fp = calloc(ng ? ng : 1, sizeof(ds_flat));
	ds_flat *mm = calloc(ng ? 2 * ng : 1, sizeof(ds_flat));
	size_t n_m = 0, no_m = 0;
	bool have_m = true;
	int rc = 0;

	if (!fp || !mm) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t r = 0; !rc && r < d->noptim; r++) {
		const ds_file *f = &d->optim[r];
		const flx_pv *o = osd_of(d, f);
		const flx_pv *parts =
		    o ? get_kind(d, f, o, "single_partition_of_fp32_groups",
				 FLX_PV_LIST, "a list of tensors")
		      : NULL;
		const flx_pv *base = flx_pv_dict_get(o, "base_optimizer_state");

		if (!parts) {
			rc = -EINVAL;
			break;
		}
		if (flx_pv_len(parts) != ng) {
			rc = flx_error_set(d->err, -EINVAL, f->name,
					   "single_partition_of_fp32_groups",
					   "%zu groups, param_shapes has %zu",
					   flx_pv_len(parts), ng);
			break;
		}
		for (size_t g = 0; !rc && g < ng; g++) {
			const flx_pv *st = moment_state(base, g);

			rc = flat_add(d, &fp[g], f, flx_pv_item(parts, g),
				      "single_partition_of_fp32_groups",
				      FLX_DT_F32);
			if (!rc)
				rc = moments_add(d, f, st, &mm[2 * g], &n_m,
						 &no_m);
		}
	}
	have_m = !no_m;
	if (!rc && n_m && no_m)
		rc = flx_error_set(d->err, -EINVAL, d->optim[0].name,
				   adam_mom[0],
				   "the base optimizer keeps moments for some "
				   "partitions only");
	/* every group consumed but for the padding */
	for (size_t g = 0; !rc && g < ng; g++) {
		uint64_t used = 0;

		for (size_t i = 0; i < np; i++)
			if (ps[i].group == g)
				used += (uint64_t)ps[i].numel;
		if (used > fp[g].total ||
		    !zero2_adds_up(used, fp[g].total, d->noptim))
			rc = flx_error_set(
			    d->err, -EINVAL, d->optim[0].name,
			    "single_partition_of_fp32_groups",
			    "group %zu: the parameters need %llu "
			    "elements, the %zu partitions hold "
			    "%llu: they do not add up",
			    g, (unsigned long long)used, d->noptim,
			    (unsigned long long)fp[g].total);
		for (int k = 0; !rc && have_m && k < 2; k++)
			if (mm[2 * g + (size_t)k].total < used)
				rc = flx_error_set(
				    d->err, -EINVAL, d->optim[0].name,
				    adam_mom[k],
				    "group %zu: the parameters need %llu "
				    "elements, the partitions hold %llu",
				    g, (unsigned long long)used,
				    (unsigned long long)mm[2 * g + (size_t)k]
					.total);
	}
	for (int pass = 0; !rc && pass < 3; pass++) {
		uint64_t off = 0;
		size_t g = 0;

		if (pass && !have_m)
			break;
		for (size_t i = 0; !rc && i < np; i++) {
			flx_tensor *t;
			char *nm = NULL;

			if (ps[i].group != g) {
				g = ps[i].group;
				off = 0;
			}
			if (pass)
				rc = moment_name(d, adam_mom[pass - 1],
						 ps[i].name, &nm);
			if (!rc)
				rc = new_tensor(d, nm ? nm : ps[i].name,
						FLX_DT_F32, ps[i].ndim,
						ps[i].shape, &t);
			if (!rc && !pass && d->lp) {
				rc = module_weight(d, &ps[i]);
				off += (uint64_t)ps[i].numel;
				continue;
			}
			if (!rc) {
				const ds_flat *fl =
				    pass ? &mm[2 * g + (size_t)pass - 1]
					 : &fp[g];

				if (pass && fl->n &&
				    fl->t[0].p.dtype != FLX_DT_F32) {
					t->dtype = fl->t[0].p.dtype;
				}
				rc = map_range(d, t, fl, off,
					       (uint64_t)ps[i].numel, 0);
			}
			if (!rc)
				rc = finish_tensor(d, t, d->optim[0].name);
			off += (uint64_t)ps[i].numel;
			free(nm);
		}
		if (!rc && !pass)
			rc = load_shared(d);
	}
out:
	flats_free(fp, ng);
	flats_free(mm, 2 * ng);
	return rc;
}

/* Stage 3: each rank holds ceil(numel / ws) elements of every parameter,
 * the parameters one after the other across its flat groups. */
static int load_stage3(ds *d, ds_param *ps, size_t np)
{
	size_t ws = d->noptim;
	ds_flat *fl = calloc(3 * ws, sizeof(ds_flat));
	size_t n_m = 0, no_m = 0;
	bool have_m = true;
	uint64_t need = 0;
	int rc = 0;

	if (!fl)
		return -ENOMEM;
	for (size_t i = 0; i < np; i++)
		need += ((uint64_t)ps[i].numel + ws - 1) / ws;
	for (size_t r = 0; !rc && r < ws; r++) {
		const ds_file *f = &d->optim[r];
		const flx_pv *o = osd_of(d, f);
		const flx_pv *groups =
		    o ? get_kind(d, f, o, "fp32_flat_groups", FLX_PV_LIST,
				 "a list of tensors")
		      : NULL;
		const flx_pv *base = flx_pv_dict_get(o, "optimizer_state_dict");

		if (!groups) {
			rc = -EINVAL;
			break;
		}
		for (size_t g = 0; !rc && g < flx_pv_len(groups); g++) {
			const flx_pv *st = moment_state(base, g);

			rc = flat_add(d, &fl[3 * r], f, flx_pv_item(groups, g),
				      "fp32_flat_groups", FLX_DT_F32);
			if (!rc)
				rc = moments_add(d, f, st, &fl[3 * r + 1], &n_m,
						 &no_m);
		}
		if (!rc && fl[3 * r].total != need)
			rc = flx_error_set(d->err, -EINVAL, f->name,
					   "fp32_flat_groups",
					   "%llu elements, the parameters' "
					   "partitions over %zu ranks need "
					   "%llu: they do not add up",
					   (unsigned long long)fl[3 * r].total,
					   ws, (unsigned long long)need);
		for (int k = 0; !rc && !no_m && k < 2; k++)
			if (fl[3 * r + 1 + (size_t)k].total < need)
				rc = flx_error_set(
				    d->err, -EINVAL, f->name, adam_mom[k],
				    "%llu elements, the parameters' "
				    "partitions need %llu",
				    (unsigned long long)
					fl[3 * r + 1 + (size_t)k]
					    .total,
				    (unsigned long long)need);
	}
	have_m = !no_m;
	if (!rc && n_m && no_m)
		rc = flx_error_set(d->err, -EINVAL, d->optim[0].name,
				   adam_mom[0],
				   "the base optimizer keeps moments for some "
				   "partitions only");
	for (int pass = 0; !rc && pass < 3; pass++) {
		uint64_t off = 0;

		if (pass && !have_m)
			break;
		for (size_t i = 0; !rc && i < np; i++) {
			uint64_t pn = ((uint64_t)ps[i].numel + ws - 1) / ws;
			flx_tensor *t;
			char *nm = NULL;

			if (pass)
				rc = moment_name(d, adam_mom[pass - 1],
						 ps[i].name, &nm);
			if (!rc)
				rc = new_tensor(d, nm ? nm : ps[i].name,
						FLX_DT_F32, ps[i].ndim,
						ps[i].shape, &t);
			if (!rc && pass && fl[1].n)
				t->dtype = fl[(size_t)pass].t[0].p.dtype;
			for (size_t r = 0; !rc && r < ws; r++) {
				uint64_t lo = r * pn;
				uint64_t k = (uint64_t)ps[i].numel > lo
						 ? (uint64_t)ps[i].numel - lo
						 : 0;

				if (k > pn)
					k = pn;
				if (k)
					rc = map_range(
					    d, t, &fl[3 * r + (size_t)pass],
					    off, k, (int64_t)lo);
			}
			if (!rc)
				rc = finish_tensor(d, t, d->optim[0].name);
			off += pn;
			free(nm);
		}
		if (!rc && !pass)
			rc = load_shared(d);
	}
	flats_free(fl, 3 * ws);
	return rc;
}

/* The buffers of buffer_names, from the module state dict, as float32
 * (zero_to_fp32's v.float()), in the module's order. */
static int load_buffers(ds *d, const ds_file *m)
{
	const flx_pv *names = get_kind(d, m, m->root, "buffer_names",
				       FLX_PV_LIST, "a list of names");
	const flx_pv *mod =
	    get_kind(d, m, m->root, "module", FLX_PV_DICT, "a state dict");
	int rc = 0;

	if (!names || !mod)
		return -EINVAL;
	for (size_t k = 0; !rc && k < mod->u.dict.n; k++) {
		const char *key = flx_pv_str(mod->u.dict.kv[2 * k]);
		bool buf = false;

		for (size_t i = 0; key && !buf && i < flx_pv_len(names); i++) {
			const char *b = flx_pv_str(flx_pv_item(names, i));

			buf = b && !strcmp(b, key);
		}
		if (buf)
			rc = whole(d, m, mod->u.dict.kv[2 * k + 1], key, true,
				   -1, NULL);
	}
	return rc;
}

/* The frozen parameters: whole in the model states (stages 1, 2), or
 * each rank's partition in its own model states file (stage 3). */
static int load_frozen(ds *d)
{
	const ds_file *m = &d->model[0];
	const flx_pv *shapes = flx_pv_dict_get(m->root, "frozen_param_shapes");
	int rc = 0;

	if (!shapes || shapes->kind == FLX_PV_NONE || !shapes->u.dict.n)
		return 0;
	if (shapes->kind != FLX_PV_DICT)
		return flx_error_set(d->err, -EINVAL, m->name,
				     "frozen_param_shapes", "a %s, not a dict",
				     flx_pv_kind_name(shapes));
	for (size_t k = 0; !rc && k < shapes->u.dict.n; k++) {
		const char *name = flx_pv_str(shapes->u.dict.kv[2 * k]);
		int64_t shape[FLX_MAX_DIMS];
		int ndim = 0;
		ds_flat fl = {0};
		flx_tensor *t;

		if (!name)
			return flx_error_set(d->err, -EINVAL, m->name,
					     "frozen_param_shapes",
					     "a name that is not a string");
		rc = shape_of(d, m, name, shapes->u.dict.kv[2 * k + 1], &ndim,
			      shape);
		for (size_t r = 0; !rc && r < d->nmodel; r++) {
			const ds_file *f = &d->model[r];
			const flx_pv *fr = flx_pv_dict_get(
			    flx_pv_dict_get(f->root, "frozen_param_fragments"),
			    name);

			if (!fr) {
				rc = flx_error_set(d->err, -EINVAL, f->name,
						   name,
						   "frozen_param_fragments "
						   "has no such parameter");
			} else if (d->stage <= 2) {
				rc = whole(d, f, fr, name, false, ndim, shape);
				break;
			} else {
				rc = flat_add(d, &fl, f, fr, name,
					      fl.n ? fl.t[0].p.dtype
						   : FLX_DT_INVALID);
			}
		}
		if (!rc && d->stage == 3) {
			int64_t n = numel_of(ndim, shape);

			if (fl.total < (uint64_t)n)
				rc = flx_error_set(
				    d->err, -EINVAL, m->name, name,
				    "the fragments hold %llu elements, the "
				    "shape needs %lld",
				    (unsigned long long)fl.total, (long long)n);
			if (!rc)
				rc = new_tensor(d, name, fl.t[0].p.dtype, ndim,
						shape, &t);
			if (!rc)
				rc = map_range(d, t, &fl, 0, (uint64_t)n, 0);
			if (!rc)
				rc = finish_tensor(d, t, m->name);
		}
		free(fl.t);
	}
	return rc;
}

/* shared_params: {name not stored: name holding the data}, the second
 * copied under the first when present (zero_to_fp32's last step). */
static int load_shared(ds *d)
{
	const ds_file *m = &d->model[0];
	const flx_pv *sp = flx_pv_dict_get(m->root, "shared_params");
	int rc = 0;

	if (!sp || sp->kind == FLX_PV_NONE)
		return 0;
	if (sp->kind != FLX_PV_DICT)
		return flx_error_set(d->err, -EINVAL, m->name, "shared_params",
				     "a %s, not a dict", flx_pv_kind_name(sp));
	for (size_t k = 0; !rc && k < sp->u.dict.n; k++) {
		const char *a = flx_pv_str(sp->u.dict.kv[2 * k]);
		const char *b = flx_pv_str(sp->u.dict.kv[2 * k + 1]);
		const flx_tensor *src = NULL;
		flx_tensor *t;
		size_t si = 0;

		if (!a || !b || !*a)
			return flx_error_set(d->err, -EINVAL, m->name,
					     "shared_params",
					     "a pair that is not two names");
		for (size_t i = 0; i < d->nt && !src; i++)
			if (!strcmp(d->t[i].fqn, b)) {
				src = &d->t[i];
				si = i;
			}
		if (!src || !strcmp(a, b))
			continue;
		rc = new_tensor(d, a, src->dtype, src->ndim, src->shape, &t);
		if (rc)
			return rc;
		src = &d->t[si]; /* the array may have moved */
		t->stored = src->stored;
		for (uint32_t c = 0; c < src->nchunks; c++) {
			ds_box bx = box_of(&src->chunks[c], src->ndim);

			rc = add_box(d, &bx);
			if (rc)
				return rc;
		}
		rc = finish_tensor(d, t, m->name);
	}
	return rc;
}

/* ---- the tag directory ---- */

typedef struct ds_name {
	char *s;
	unsigned long mp;
	unsigned long rank;
} ds_name;

static int cmp_rank(const void *a, const void *b)
{
	const ds_name *x = a, *y = b;

	if (x->mp != y->mp)
		return x->mp < y->mp ? -1 : 1;
	return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int name_add(ds_name **arr, size_t *n, size_t *cap, const char *s,
		    unsigned long mp, unsigned long rank)
{
	if (flx_grow((void **)arr, cap, *n + 1, sizeof(ds_name)))
		return -ENOMEM;
	(*arr)[*n].s = strdup(s);
	(*arr)[*n].mp = mp;
	(*arr)[*n].rank = rank;
	return (*arr)[(*n)++].s ? 0 : -ENOMEM;
}

/* The lists list_files() fills, one name at a time. */
typedef struct ds_lists {
	ds *d;
	ds_name **om, **mm, **m12;
	size_t *nom, *nmm, *nm12;
	size_t capo, capm, cap12;
	int bf16;
} ds_lists;

static int list_one(void *arg, const char *name, bool dir)
{
	ds_lists *l = arg;
	unsigned long dr, mp;
	bool b16;
	int rc;

	(void)dir; /* what a name is, its open says */
	if (zero_name(name, OPTIM_SUFFIX, &b16, &dr, &mp)) {
		if (l->bf16 >= 0 && l->bf16 != (int)b16)
			return flx_error_set(
			    l->d->err, -EINVAL, name, NULL,
			    "optimizer states files with and without "
			    "the bf16_ prefix: two runs in one tag");
		l->bf16 = b16;
		rc = mp < MAX_MP
			 ? name_add(l->om, l->nom, &l->capo, name, mp, dr)
			 : 0;
	} else if (zero_name(name, MODEL_SUFFIX, &b16, &dr, &mp) && !b16) {
		rc = mp < MAX_MP
			 ? name_add(l->mm, l->nmm, &l->capm, name, mp, dr)
			 : 0;
	} else if (model12_name(name, &mp)) {
		rc = mp < MAX_MP
			 ? name_add(l->m12, l->nm12, &l->cap12, name, mp, 0)
			 : 0;
	} else {
		return 0;
	}
	if (!rc && mp >= MAX_MP)
		rc = flx_error_set(l->d->err, -EOPNOTSUPP, name, NULL,
				   "model-parallel rank %lu: at most %u ranks",
				   mp, MAX_MP);
	return rc;
}

/* The files, sorted by model-parallel rank, then data-parallel rank:
 * optimizer states (om), stage 3 model states (mm), stages 1 and 2 model
 * states (m12): the tag directory's, or every node's under -o mpi. */
static int list_files(ds *d, ds_name **om, size_t *nom, ds_name **mm,
		      size_t *nmm, ds_name **m12, size_t *nm12)
{
	ds_lists l = {.d = d,
		      .om = om,
		      .mm = mm,
		      .m12 = m12,
		      .nom = nom,
		      .nmm = nmm,
		      .nm12 = nm12,
		      .bf16 = -1};
	int rc = flx_build_each_name(d->b, list_one, &l);

	if (rc < 0 && rc != -ENOMEM && !d->err->code)
		return flx_error_set(d->err, rc, ".", NULL,
				     "cannot list the tag directory: %s",
				     strerror(-rc));
	if (rc)
		return rc;
	/* a list may be empty, and then NULL: qsort() wants neither */
	if (*nom)
		qsort(*om, *nom, sizeof(ds_name), cmp_rank);
	if (*nmm)
		qsort(*mm, *nmm, sizeof(ds_name), cmp_rank);
	if (*nm12)
		qsort(*m12, *nm12, sizeof(ds_name), cmp_rank);
	return 0;
}

/* The files of model-parallel rank mp among n sorted names: [*a, *z). */
static void mp_range(const ds_name *v, size_t n, unsigned long mp, size_t *a,
		     size_t *z)
{
	*a = 0;
	while (*a < n && v[*a].mp < mp)
		(*a)++;
	*z = *a;
	while (*z < n && v[*z].mp == mp)
		(*z)++;
}

/* Data-parallel ranks 0..n-1, each once. */
static int check_ranks(ds *d, const ds_name *v, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (v[i].rank != i)
			return flx_error_set(d->err, -ENOENT, v[0].s, NULL,
					     "the %s of data parallel rank %zu "
					     "are missing (%zu files)",
					     what, i, n);
	return 0;
}

static int check_count(ds *d)
{
	const ds_file *f = &d->optim[0];
	const flx_pv *o = osd_of(d, f);
	const flx_pv *pc = flx_pv_dict_get(o, "partition_count");
	int64_t ws = -1, x;

	if (!o)
		return -EINVAL;
	if (flx_pv_int(pc, &ws)) {
	} else if (pc &&
		   (pc->kind == FLX_PV_LIST || pc->kind == FLX_PV_TUPLE)) {
		for (size_t i = 0; i < flx_pv_len(pc); i++)
			if (flx_pv_int(flx_pv_item(pc, i), &x) && x > ws)
				ws = x;
	}
	if (ws < 1)
		return flx_error_set(d->err, -EINVAL, f->name,
				     "optimizer_state_dict.partition_count",
				     "missing, or not a count");
	if ((uint64_t)ws != d->noptim)
		return flx_error_set(d->err, -EINVAL, f->name,
				     "optimizer_state_dict.partition_count",
				     "%lld partitions, %zu optimizer states "
				     "files in the tag directory",
				     (long long)ws, d->noptim);
	return 0;
}

static int set_writer(ds *d, size_t nmp)
{
	const char *v =
	    flx_pv_str(flx_pv_dict_get(d->model[0].root, "ds_version"));
	char vb[40], mp[48] = "";

	snprintf(vb, sizeof(vb), "%s", v ? v : "?");
	for (char *p = vb; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	if (nmp > 1)
		snprintf(mp, sizeof(mp), ", %zu model-parallel ranks", nmp);
	if (asprintf(&d->c->writer, "DeepSpeed %s ZeRO stage %d%s%s", vb,
		     d->stage, d->bf16opt ? " (bf16 optimizer)" : "", mp) < 0) {
		d->c->writer = NULL;
		return -ENOMEM;
	}
	return 0;
}

/* What one model-parallel rank's files make: zero_to_fp32's state dict
 * of that rank (its slices of the split parameters). */
typedef struct ds_mp {
	flx_tensor *t;
	size_t nt;
	char *file; /* its (first) model states file, for messages */
} ds_mp;

static void close_files(ds *d)
{
	for (size_t i = 0; d->optim && i < d->noptim; i++)
		close_file(&d->optim[i]);
	for (size_t i = 0; d->model && i < d->nmodel; i++)
		close_file(&d->model[i]);
	free(d->optim);
	free(d->model);
	d->optim = d->model = NULL;
	d->noptim = d->nmodel = 0;
}

/* Model-parallel rank mp's files (om, mm: its optimizer and stage 3 model
 * states, sorted by data-parallel rank; m12: its stages 1, 2 model states
 * file or NULL) into out; its stage must be that of rank 0 (stage0 > 0). */
static int load_mp(ds *d, unsigned long mp, size_t nmp, const ds_name *om,
		   size_t nom, const ds_name *mm, size_t nmm, const char *m12,
		   int stage0, bool bf16opt0, ds_mp *out)
{
	size_t np = 0, ng = 0;
	ds_param *ps = NULL;
	int rc;

	d->nt = 0;
	if (!nom) {
		rc = flx_error_set(d->err, -ENOENT,
				   nmm	 ? mm[0].s
				   : m12 ? m12
					 : ".",
				   NULL,
				   "model-parallel rank %lu has no optimizer "
				   "states files",
				   mp);
		goto out;
	}
	rc = check_ranks(d, om, nom, "optimizer states");
	if (rc)
		goto out;
	d->optim = calloc(nom, sizeof(ds_file));
	if (!d->optim) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; !rc && i < nom; i++) {
		rc = open_file(d, &d->optim[i], om[i].s, "optimizer states");
		d->noptim = i + 1;
	}
	if (!rc)
		rc = check_count(d);
	if (rc)
		goto out;
	{
		const flx_pv *os = osd_of(d, &d->optim[0]);
		const flx_pv *zs = flx_pv_dict_get(os, "zero_stage");

		if (!zs &&
		    flx_pv_dict_get(os, "single_partition_of_fp32_groups")) {
			d->bf16opt = true;
			d->stage = 1;
		} else {
			d->bf16opt = false;
			rc = stage_of(d, &d->optim[0], zs, &d->stage);
		}
	}
	if (!rc && stage0 > 0 && (d->stage != stage0 || d->bf16opt != bf16opt0))
		rc = flx_error_set(d->err, -EINVAL, d->optim[0].name,
				   "optimizer_state_dict.zero_stage",
				   "differs from model-parallel rank 0's");
	for (size_t i = 1; !rc && i < nom; i++) {
		const flx_pv *zs =
		    flx_pv_dict_get(osd_of(d, &d->optim[i]), "zero_stage");
		int s = 1;

		if (zs || !d->bf16opt)
			rc = stage_of(d, &d->optim[i], zs, &s);
		if (!rc && (s != d->stage || (!zs) != d->bf16opt))
			rc = flx_error_set(d->err, -EINVAL, d->optim[i].name,
					   "optimizer_state_dict.zero_stage",
					   "differs from rank 0's");
	}
	if (rc)
		goto out;
	if (d->stage == 3) {
		if (nmm != nom) {
			rc = flx_error_set(
			    d->err, -ENOENT,
			    nmm ? mm[0].s
				: "zero_pp_rank_0_mp_rank_00" MODEL_SUFFIX,
			    NULL,
			    "ZeRO stage 3 keeps one model states "
			    "file per rank: %zu for %zu ranks",
			    nmm, nom);
			goto out;
		}
		rc = check_ranks(d, mm, nmm, "model states");
		if (rc)
			goto out;
	} else if (!m12) {
		char want[64];

		snprintf(want, sizeof(want), "mp_rank_%02lu" MODEL_SUFFIX, mp);
		rc = flx_error_set(d->err, -ENOENT, want, NULL,
				   "no such file (ZeRO stage %d keeps the "
				   "model states there)",
				   d->stage);
		goto out;
	}
	if (d->lp && d->stage == 3) {
		rc = flx_error_set(d->err, -EINVAL, mm[0].s, "ds_weights",
				   "ZeRO stage 3 saves no module weights "
				   "(placeholders of no elements): "
				   "ds_weights=module needs stage 1 or 2");
		goto out;
	}
	d->nmodel = d->stage == 3 ? nmm : 1;
	d->model = calloc(d->nmodel, sizeof(ds_file));
	if (!d->model) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; !rc && i < d->nmodel; i++)
		rc = open_file(d, &d->model[i], d->stage == 3 ? mm[i].s : m12,
			       "model states");
	if (!rc)
		rc = read_params(d, &d->model[0], &ps, &np, &ng);
	if (!rc)
		rc = load_buffers(d, &d->model[0]);
	if (!rc)
		rc = load_frozen(d);
	if (!rc)
		rc = d->stage == 3 ? load_stage3(d, ps, np)
				   : load_stage12(d, ps, np, ng);
	if (!rc && mp == 0) {
		rc = set_writer(d, nmp);
		d->c->mtime_ns = d->c->files[d->model[0].idx].mtime_ns;
	}
	if (!rc) {
		out->file = strdup(d->model[0].name);
		if (!out->file)
			rc = -ENOMEM;
	}
	if (!rc) {
		out->t = d->t;
		out->nt = d->nt;
		d->t = NULL;
		d->nt = d->capt = 0;
	}
out:
	free(ps);
	close_files(d);
	return rc;
}

/* ---- tensor-parallel ranks merged ---- */

/* The rules' split of fqn, or of the parameter a moment belongs to:
 * flx_ckpt_opts.split_rule's answer. */
static int rule_split(const flx_ckpt_opts *o, const char *fqn, int *axis)
{
	static const char *const mom[] = {MOMENT_PREFIX "exp_avg.",
					  MOMENT_PREFIX "exp_avg_sq."};
	int rc;

	if (!o->split_rule)
		return -ENOENT;
	rc = o->split_rule(o->split_ctx, fqn, axis);
	for (int k = 0; rc == -ENOENT && k < 2; k++)
		if (!strncmp(fqn, mom[k], strlen(mom[k])) &&
		    fqn[strlen(mom[k])])
			rc = o->split_rule(o->split_ctx, fqn + strlen(mom[k]),
					   axis);
	return rc;
}

/* A chunk whose elements, in row-major order, are one run of the
 * tensor's row-major order and one run of its storage. */
typedef struct ds_run {
	uint64_t at, n; /* elements of the tensor */
	uint32_t file;
	uint64_t off; /* bytes */
} ds_run;

static int cmp_run(const void *a, const void *b)
{
	const ds_run *x = a, *y = b;

	return x->at < y->at ? -1 : x->at > y->at;
}

/* t's chunks as runs, sorted; a chunk that is not one run: -EOPNOTSUPP. */
static int runs_of(const flx_tensor *t, uint64_t es, ds_run **out)
{
	int64_t rs[FLX_MAX_DIMS], step = 1;

	*out = calloc(t->nchunks ? t->nchunks : 1, sizeof(ds_run));
	if (!*out)
		return -ENOMEM;
	for (int k = t->ndim - 1; k >= 0; k--) {
		rs[k] = step;
		step *= t->shape[k];
	}
	for (uint32_t i = 0; i < t->nchunks; i++) {
		const flx_chunk *ch = &t->chunks[i];
		int k0 = 0;
		int64_t s = 1, at = 0;

		while (k0 < t->ndim && ch->size[k0] == 1)
			k0++;
		for (int k = t->ndim - 1; k >= 0; k--) {
			if (k > k0 &&
			    (ch->off[k] != 0 || ch->size[k] != t->shape[k]))
				return -EOPNOTSUPP;
			if (ch->size[k] > 1 && ch->stride[k] != s)
				return -EOPNOTSUPP;
			s *= ch->size[k];
			at += ch->off[k] * rs[k];
		}
		(*out)[i] = (ds_run){.at = (uint64_t)at,
				     .n = (uint64_t)s,
				     .file = ch->file,
				     .off = ch->data_off +
					    (uint64_t)ch->storage_offset * es};
	}
	if (t->nchunks)
		qsort(*out, t->nchunks, sizeof(ds_run), cmp_run);
	return 0;
}

#define CMP_BUF (1u << 20)

/* Whether a and b (same dtype and shape, chunks covering them) hold the
 * same elements; -EOPNOTSUPP when one's chunks are not runs. */
static int same_elems(ds *d, const flx_tensor *a, const flx_tensor *b,
		      const char *file, unsigned char *buf, bool *same)
{
	uint64_t es =
	    flx_dtype_size(a->stored != FLX_DT_INVALID ? a->stored : a->dtype);
	uint64_t numel = (uint64_t)numel_of(a->ndim, a->shape), pos = 0;
	uint64_t cap = CMP_BUF / 2 / es;
	ds_run *ra = NULL, *rb = NULL;
	size_t ia = 0, ib = 0;
	int rc = runs_of(a, es, &ra);

	*same = true;
	if (!rc)
		rc = runs_of(b, es, &rb);
	while (!rc && *same && pos < numel) {
		uint64_t ea, eb, n;

		while (ia < a->nchunks && ra[ia].at + ra[ia].n <= pos)
			ia++;
		while (ib < b->nchunks && rb[ib].at + rb[ib].n <= pos)
			ib++;
		if (ia == a->nchunks || ib == b->nchunks || ra[ia].at > pos ||
		    rb[ib].at > pos) {
			rc = -EIO; /* the chunks were checked to cover it */
			break;
		}
		ea = ra[ia].at + ra[ia].n;
		eb = rb[ib].at + rb[ib].n;
		n = (ea < eb ? ea : eb) - pos;
		if (n > cap)
			n = cap;
		rc = flx_file_pread(d->c, ra[ia].file, buf, n * es,
				    ra[ia].off + (pos - ra[ia].at) * es);
		if (!rc)
			rc = flx_file_pread(
			    d->c, rb[ib].file, buf + CMP_BUF / 2, n * es,
			    rb[ib].off + (pos - rb[ib].at) * es);
		if (rc) {
			rc = flx_error_set(d->err, rc, file, b->fqn,
					   "cannot read: %s", strerror(-rc));
			break;
		}
		*same = !memcmp(buf, buf + CMP_BUF / 2, n * es);
		pos += n;
	}
	free(ra);
	free(rb);
	return rc;
}

/* The global tensor i from every model-parallel rank's tensor i: the
 * slices concatenated along the axis a rule states or the one axis
 * their shapes differ in, or rank 0's when a rule replicates it (its
 * bytes checked equal on every rank). */
static int merge_one(ds *d, const flx_ckpt_opts *o, const ds_mp *mp, size_t nmp,
		     size_t i, unsigned char *buf)
{
	const flx_tensor *t0 = &mp[0].t[i];
	int64_t shape[FLX_MAX_DIMS];
	flx_tensor *t;
	int axis = -1, rc;
	bool rule, same = true;

	for (size_t m = 1; m < nmp; m++) {
		const flx_tensor *tm = &mp[m].t[i];

		if (tm->dtype != t0->dtype || tm->stored != t0->stored ||
		    tm->ndim != t0->ndim)
			return flx_error_set(
			    d->err, -EINVAL, mp[m].file, tm->fqn,
			    "%s in %d dims here, %s in %d dims on "
			    "model-parallel rank 0 (%s)",
			    flx_dtype_name(tm->dtype), tm->ndim,
			    flx_dtype_name(t0->dtype), t0->ndim, mp[0].file);
	}
	rc = rule_split(o, t0->fqn, &axis);
	if (rc == -EOPNOTSUPP)
		return flx_error_set(d->err, -EOPNOTSUPP, mp[0].file, t0->fqn,
				     "rules: a split in \"groups\" cannot "
				     "merge tensor-parallel ZeRO slices");
	rule = !rc;
	if (rc && rc != -ENOENT)
		return rc;
	if (rule && axis >= t0->ndim)
		return flx_error_set(d->err, -EINVAL, mp[0].file, t0->fqn,
				     "rules: split axis %d of a %d-dim tensor",
				     axis, t0->ndim);
	if (!rule) {
		int ndiff = 0;

		for (int k = 0; k < t0->ndim; k++)
			for (size_t m = 1; m < nmp; m++)
				if (mp[m].t[i].shape[k] != t0->shape[k]) {
					ndiff++;
					axis = k;
					break;
				}
		if (ndiff > 1)
			return flx_error_set(
			    d->err, -EINVAL, mp[0].file, t0->fqn,
			    "the tensor-parallel ranks' shapes differ in %d "
			    "axes: not slices of one tensor",
			    ndiff);
		/* equal shapes: replicated, or evenly split (a zero-filled
		 * bias split in two has equal bytes too); the files do not
		 * say which, so it is never guessed */
		if (!ndiff)
			return flx_error_set(
			    d->err, -EINVAL, mp[nmp > 1].file, t0->fqn,
			    "the same shape on every tensor-parallel rank: "
			    "replicated or split, the files do not say; state "
			    "it with rules= (a rule's \"split\": an axis, or "
			    "null for replicated)");
	}
	memcpy(shape, t0->shape, sizeof(int64_t) * (size_t)t0->ndim);
	for (size_t m = 1; m < nmp; m++) {
		const flx_tensor *tm = &mp[m].t[i];

		for (int k = 0; k < t0->ndim; k++)
			if (k != axis && tm->shape[k] != t0->shape[k])
				return flx_error_set(
				    d->err, -EINVAL, mp[m].file, tm->fqn,
				    "dimension %d is %lld here, %lld on "
				    "model-parallel rank 0: not slices of one "
				    "tensor along axis %d",
				    k, (long long)tm->shape[k],
				    (long long)t0->shape[k], axis);
		if (axis >= 0)
			shape[axis] += tm->shape[axis];
	}
	for (size_t m = 1; axis < 0 && same && m < nmp; m++) {
		rc = same_elems(d, t0, &mp[m].t[i], mp[m].file, buf, &same);
		if (rc == -EOPNOTSUPP)
			return flx_error_set(
			    d->err, -EINVAL, mp[m].file, t0->fqn,
			    "saved with strides: not compared across the "
			    "tensor-parallel ranks; state its split with "
			    "rules= (a rule's \"split\")");
		if (rc)
			return rc;
		if (!same)
			return flx_error_set(
			    d->err, -EINVAL, mp[m].file, t0->fqn,
			    "rules= replicate it, but its bytes differ from "
			    "model-parallel rank 0's");
	}
	if (flx_grow((void **)&d->t, &d->capt, d->nt + 1, sizeof(flx_tensor)))
		return -ENOMEM;
	t = &d->t[d->nt++];
	*t = *t0;
	memcpy(t->shape, shape, sizeof(shape));
	t->saved_split = axis >= 0 ? axis + 1 : -1;
	t->nchunks = 0;
	t->chunks = NULL;
	t->dims = NULL;
	d->nboxes = 0;
	for (size_t m = 0, at = 0; m < (axis >= 0 ? nmp : 1); m++) {
		const flx_tensor *tm = &mp[m].t[i];

		for (uint32_t c = 0; c < tm->nchunks; c++) {
			ds_box bx = box_of(&tm->chunks[c], tm->ndim);

			if (axis >= 0)
				bx.off[axis] += (int64_t)at;
			rc = add_box(d, &bx);
			if (rc)
				return rc;
		}
		if (axis >= 0)
			at += (size_t)tm->shape[axis];
	}
	return finish_tensor(d, t, mp[0].file);
}

/* The model-parallel ranks' state dicts as one: the same names in the
 * same order on every rank, each merged by merge_one(). */
static int merge_mp(ds *d, const flx_ckpt_opts *o, const ds_mp *mp, size_t nmp)
{
	unsigned char *buf = malloc(CMP_BUF);
	int rc = buf ? 0 : -ENOMEM;

	for (size_t m = 1; !rc && m < nmp; m++) {
		size_t n = mp[m].nt < mp[0].nt ? mp[m].nt : mp[0].nt;

		for (size_t i = 0; !rc && i < n; i++)
			if (strcmp(mp[m].t[i].fqn, mp[0].t[i].fqn))
				rc = flx_error_set(
				    d->err, -EINVAL, mp[m].file, mp[m].t[i].fqn,
				    "tensor %zu here, model-parallel rank 0 "
				    "(%s) has %s there: the ranks' parameter "
				    "lists differ",
				    i, mp[0].file, mp[0].t[i].fqn);
		if (!rc && mp[m].nt != mp[0].nt)
			rc = flx_error_set(
			    d->err, -EINVAL, mp[m].file, NULL,
			    "%zu tensors, model-parallel rank 0 (%s) %zu: the "
			    "ranks' parameter lists differ",
			    mp[m].nt, mp[0].file, mp[0].nt);
	}
	d->nt = 0;
	for (size_t i = 0; !rc && i < mp[0].nt; i++)
		rc = merge_one(d, o, mp, nmp, i, buf);
	free(buf);
	return rc;
}

static int load(flx_build *b, const flx_ckpt_opts *o, flx_error *err)
{
	ds d = {.b = b, .c = flx_build_ckpt(b), .err = err};
	ds_name *om = NULL, *mm = NULL, *m12 = NULL;
	size_t nom = 0, nmm = 0, nm12 = 0, nmp = 0;
	ds_mp *mp = NULL;
	int rc;

	{
		const char *w = NULL;

		d.lp = !flx_opt_text(o->vals, "ds_weights", &w) &&
		       !strcmp(w, "module");
	}
	rc = list_files(&d, &om, &nom, &mm, &nmm, &m12, &nm12);
	if (rc)
		goto out;
	if (!nom) {
		rc = flx_error_set(err, -ENOENT,
				   "zero_pp_rank_0_mp_rank_00" OPTIM_SUFFIX,
				   NULL,
				   "no optimizer states files: not a "
				   "ZeRO checkpoint");
		goto out;
	}
	nmp = om[nom - 1].mp + 1;
	if (nmm && mm[nmm - 1].mp + 1 > nmp)
		nmp = mm[nmm - 1].mp + 1;
	if (nm12 && m12[nm12 - 1].mp + 1 > nmp)
		nmp = m12[nm12 - 1].mp + 1;
	mp = calloc(nmp, sizeof(ds_mp));
	if (!mp) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t m = 0; !rc && m < nmp; m++) {
		size_t oa, oz, ma, mz, ta, tz;

		mp_range(om, nom, m, &oa, &oz);
		mp_range(mm, nmm, m, &ma, &mz);
		mp_range(m12, nm12, m, &ta, &tz);
		/* no offset on a NULL list (none of that kind) */
		rc = load_mp(&d, m, nmp, om ? om + oa : NULL, oz - oa,
			     mm ? mm + ma : NULL, mz - ma,
			     tz > ta ? m12[ta].s : NULL, m ? d.stage : 0,
			     d.bf16opt, &mp[m]);
	}
	if (!rc && nmp > 1)
		rc = merge_mp(&d, o, mp, nmp);
	if (!rc) {
		if (nmp == 1) {
			d.t = mp[0].t;
			d.nt = mp[0].nt;
			mp[0].t = NULL;
		}
		d.c->tensors = d.t;
		d.c->ntensors = d.nt;
		d.t = NULL;
	}
out:
	free(d.t);
	free(d.boxes);
	close_files(&d);
	for (size_t m = 0; mp && m < nmp; m++) {
		free(mp[m].t);
		free(mp[m].file);
	}
	free(mp);
	for (size_t i = 0; i < nom; i++)
		free(om[i].s);
	for (size_t i = 0; i < nmm; i++)
		free(mm[i].s);
	for (size_t i = 0; i < nm12; i++)
		free(m12[i].s);
	free(om);
	free(mm);
	free(m12);
	return rc;
}

static const char *const weights_choices[] = {"fp32", "module", NULL};

static const flx_opt ds_opts[] = {
    {.name = "ds_weights",
     .type = FLX_OPT_CHOICE,
     .metavar = "W",
     .def = "fp32",
     .help = "DeepSpeed ZeRO: the weights under the parameter names, the "
	     "fp32 masters or the module's low-precision ones (stages 1, 2)",
     .choices = weights_choices},
    {.name = "ds_tag",
     .type = FLX_OPT_TEXT,
     .metavar = "TAG",
     .def = "the one `latest` names",
     .help = "DeepSpeed ZeRO: the tag directory of a save directory to "
	     "mount"},
};

static const flx_opt_group ds_group = {
    .owner = "deepspeed-zero",
    .title = "DeepSpeed ZeRO source",
    .opts = ds_opts,
    .nopts = FLX_OPT_COUNT(ds_opts),
};

const flx_source flx_source_deepspeed = {
    .name = "deepspeed-zero",
    .kind = "DeepSpeed ZeRO",
    .marker = MODEL12_NAME " and zero_pp_rank_0_mp_rank_00" OPTIM_SUFFIX,
    .probe = probe,
    .owns = owns,
    .load = load,
    .enter = enter,
    .opts = &ds_group,
};
