/* SPDX-License-Identifier: MIT */
/*
 * megatron/: the legacy per-rank files Megatron's --ckpt-format torch
 * loader reads (docs/formats/megatron.md#legacy-target), present when the
 * source is Megatron-Core torch_dist, for the mount's tp x pp:
 *
 *   megatron/latest_checkpointed_iteration.txt   "100" (no newline)
 *   megatron/iter_0000100/mp_rank_TT/model_optim_rng.pt        (pp 1)
 *   megatron/iter_0000100/mp_rank_TT_PPP/model_optim_rng.pt    (pp > 1)
 *
 * (release/ and "release" when the common state has no iteration or
 * iteration 0, which Megatron's loader accepts only as a release), or,
 * for a target the legacy format cannot express, megatron/unavailable.txt
 * saying why.  Each
 * file is torch.save({'args': Namespace, 'checkpoint_version': 3.0,
 * 'iteration': N, 'model': OrderedDict}); the keys of 'model' and where
 * their bytes lie are reshard/megatron/megatron_legacy.h's decision, 'args' is
 * the source's Namespace written again with the target's parallel sizes
 * (docs/formats/megatron.md#legacy-file-content).  No optimizer or rng state,
 * as Megatron's own converter.  A tensor of a dtype torch.save's row of
 * formats/compat.h leaves out (uint16/32/64 and float8 by default, which
 * torch 1.13 cannot load; exclude_dtypes=) is left out of these files as
 * of ranks/ model.pt.  A TE FP8 _extra_state
 * (docs/formats/megatron.md#te-extra-state) is the uint8 tensor that is the
 * first element of the source's bytes item, a torch.save of a list (of a zarr
 * checkpoint, flx_megatron.objects_bare: the value itself): checked at
 * mount (a 1-D contiguous uint8 tensor inside its storage record), its
 * bytes served from the item's storage record; None or an empty tensor
 * there gives the empty tensor.  Anything else (an io.BytesIO of older
 * TE, a zstd item, a malformed archive) refuses the mount, naming the
 * item: a blob is never guessed at.
 */
#include "layout.h"

#include "formats/compat.h"
#include "formats/pickle_emit.h"
#include "formats/torchsave.h"
#include "megatron_legacy.h"
#include "pickle.h"
#include "reader.h"
#include "torchpkl.h"
#include "zipitem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char dir_name[] = "megatron";
static const char file_name[] = FLX_MLG_FILE;
static const char latest_name[] = "latest_checkpointed_iteration.txt";
/* the longest common-state pickle read to write its args again */
#define COMMON_MAX (64u << 20)

/* Literal bytes, generated from the fs's copy. */
typedef struct lit {
	size_t n;
	char s[];
} lit;

static int gen_lit(const void *arg, uint32_t idx, unsigned char *dst,
		   uint64_t lo, uint64_t hi, uint64_t *len)
{
	const lit *l = arg;

	(void)idx;
	if (lo < hi && lo < l->n)
		memcpy(dst, l->s + lo, (hi < l->n ? hi : l->n) - lo);
	*len = l->n;
	return 0;
}

static const flx_gen_ops lit_ops = {"megatron latest iteration", gen_lit};

/* The number of virtual chunks of the target (1 without). */
static int chunks(const flx_mlg_target *tgt)
{
	return tgt->vp > 1 ? tgt->vp : 1;
}

/* The number of expert ranks of the target (1 without). */
static int nep(const flx_mlg_target *tgt)
{
	return tgt->ep > 1 ? tgt->ep : 1;
}

/* The common state's pickle, decoded. */
static int load_common(flx_build *b, flx_pickle **pk, flx_error *err)
{
	const flx_megatron *m = flx_megatron_of(b->ckpt);
	const flx_file *f = &b->ckpt->files[m->common_file];
	unsigned char *buf;
	int rc;

	if (m->pkl_len > COMMON_MAX)
		return flx_error_set(err, -EFBIG, NULL, f->relpath,
				     "common state pickle over %u bytes",
				     COMMON_MAX);
	buf = malloc(m->pkl_len ? m->pkl_len : 1);
	if (!buf)
		return flx_build_fail(b, -ENOMEM, f->relpath, "");
	rc = flx_file_pread(b->ckpt, m->common_file, buf, m->pkl_len,
			    m->pkl_off);
	if (rc)
		rc = flx_error_set(err, rc, NULL, f->relpath,
				   "common state: cannot read: %s",
				   strerror(-rc));
	else
		rc =
		    flx_pickle_load(buf, m->pkl_len, f->relpath, NULL, pk, err);
	free(buf);
	return rc;
}

/*
 * The pickle opcodes around every file's state dict: "}(" "args" the
 * source's args with the target's sizes, "checkpoint_version" 3.0,
 * "iteration" N, "model"; then the dict's SETITEMS.
 */
static int wrapper(flx_build *b, const flx_mlg_target *tgt, flx_pk_buf *pre,
		   flx_error *err)
{
	const flx_megatron *m = flx_megatron_of(b->ckpt);
	const flx_pv *root, *args;
	flx_pickle *pk = NULL;
	int64_t vocab;
	int rc = flx_mlg_padded_vocab(b->ckpt, tgt, &vocab, err);

	if (!rc)
		rc = load_common(b, &pk, err);
	if (rc)
		return rc;
	root = flx_pickle_root(pk);
	if (m->common_item && root && root->kind == FLX_PV_LIST)
		root = flx_pv_item(root, 0);
	args = flx_pv_dict_get(root, "args");
	flx_pkb_raw(pre, "}(", 2);
	if (args && args->kind != FLX_PV_NONE) {
		/* EP ranks are data-parallel ranks: the least world */
		int ep = nep(tgt), vp = chunks(tgt);
		int64_t per_chunk =
		    flx_mlg_layer_count(b->ckpt) / ((int64_t)tgt->pp * vp);

		const flx_pk_patch patch[] = {
		    {"tensor_model_parallel_size", FLX_PK_INT, tgt->tp, NULL,
		     false},
		    {"pipeline_model_parallel_size", FLX_PK_INT, tgt->pp, NULL,
		     false},
		    {"padded_vocab_size", FLX_PK_INT, vocab, NULL, false},
		    {"virtual_pipeline_model_parallel_size",
		     vp > 1 ? FLX_PK_INT : FLX_PK_NONE, vp, NULL, false},
		    {"num_layers_per_virtual_pipeline_stage",
		     vp > 1 ? FLX_PK_INT : FLX_PK_NONE, per_chunk, NULL, false},
		    {"expert_model_parallel_size", FLX_PK_INT, ep, NULL, false},
		    {"ckpt_format", FLX_PK_STR, 0, "torch", false},
		    {"world_size", FLX_PK_INT, (int64_t)tgt->tp * tgt->pp * ep,
		     NULL, false},
		    {"data_parallel_size", FLX_PK_INT, ep, NULL, false},
		    {"transformer_pipeline_model_parallel_size", FLX_PK_INT,
		     tgt->pp, NULL, false},
		    {"expert_tensor_parallel_size", FLX_PK_INT, tgt->tp, NULL,
		     false},
		    /* the files split the layers evenly: a source's uneven
		     * split must not be claimed for them */
		    {"decoder_first_pipeline_num_layers", FLX_PK_NONE, 0, NULL,
		     true},
		    {"decoder_last_pipeline_num_layers", FLX_PK_NONE, 0, NULL,
		     true},
		    {"pipeline_model_parallel_layout", FLX_PK_NONE, 0, NULL,
		     true},
		    {"account_for_embedding_in_pipeline_split", FLX_PK_FALSE, 0,
		     NULL, true},
		    {"account_for_loss_in_pipeline_split", FLX_PK_FALSE, 0,
		     NULL, true},
		    {"num_virtual_stages_per_pipeline_rank", FLX_PK_NONE, 0,
		     NULL, true},
		};

		static const char ns_head[] = "cargparse\nNamespace\n)\x81";

		flx_pkb_str(pre, "args", 4);
		/* a dict of the fields (a reduced state dict) becomes the
		 * Namespace Megatron reads them from by attribute:
		 * Namespace() by NEWOBJ, the dict its BUILD state */
		if (args->kind == FLX_PV_DICT)
			flx_pkb_raw(pre, ns_head, sizeof(ns_head) - 1);
		rc = flx_pk_emit(pre, args, patch,
				 sizeof(patch) / sizeof(patch[0]),
				 "common state args", err);
		if (args->kind == FLX_PV_DICT)
			flx_pkb_raw(pre, "b", 1);
	}
	flx_pkb_str(pre, "checkpoint_version", 18);
	flx_pkb_float(pre, 3.0);
	flx_pkb_str(pre, "iteration", 9);
	flx_pkb_int(pre, m->iteration < 0 ? 0 : m->iteration);
	if (chunks(tgt) > 1)
		flx_pkb_str(pre, "model0", 6);
	else
		flx_pkb_str(pre, "model", 5);
	if (!rc && pre->err)
		rc = flx_error_set(err, pre->err, NULL, dir_name,
				   "out of memory");
	flx_pickle_free(pk);
	return rc;
}

/* the largest bytes item read whole to find its tensor */
#define MAX_EXTRA_ITEM (16u << 20)

/* Refuse item o: why, or (why NULL) the codec's reason in e. */
static int extra_fail(flx_build *b, const flx_object *o, const char *why,
		      const flx_error *e)
{
	char where[FLX_ERR_FIELD];

	snprintf(where, sizeof(where), "%s@%llu",
		 b->ckpt->files[o->file].relpath, (unsigned long long)o->off);
	return flx_error_set(b->err, -EINVAL, where, o->fqn,
			     "megatron/: TE _extra_state: %s",
			     why ? why : e->text);
}

/*
 * The uint8 tensor of bytes item o (a torch.save of [tensor]) as part p of
 * t: the range of its storage record in o's file; t left empty when the
 * element is None or the tensor is.
 */
static int extra_blob(flx_build *b, const flx_object *o, flx_pt_tensor *t,
		      flx_pt_part *p)
{
	static const flx_pickle_limits lim = {0};
	const flx_file *f = &b->ckpt->files[o->file];
	unsigned char *buf = NULL;
	flx_mem_reader mr;
	flx_reader r;
	flx_zip *z = NULL;
	flx_zip_rec rec, srec;
	flx_pickle *pk = NULL;
	const flx_pv *root, *v;
	flx_tensor_pkl tp;
	flx_error e;
	char rel[80];
	int rc;

	flx_error_init(&e);
	if (o->zstd)
		return extra_fail(b, o, "a zstd item is not supported", NULL);
	if (o->len > MAX_EXTRA_ITEM || o->off > f->size ||
	    o->len > f->size - o->off)
		return extra_fail(b, o,
				  "item larger than 16 MiB or past its "
				  "file",
				  NULL);
	buf = malloc(o->len ? o->len : 1);
	if (!buf)
		return -ENOMEM;
	rc = flx_file_pread(b->ckpt, o->file, buf, o->len, o->off);
	if (rc) {
		rc = extra_fail(b, o, "cannot read the item", NULL);
		goto out;
	}
	flx_reader_mem(&r, &mr, buf, o->len);
	rc = flx_zip_open(&r, o->fqn, &z, &e);
	if (rc)
		goto out;
	if (flx_zip_find(z, "data.pkl", &rec)) {
		rc = extra_fail(b, o, "no data.pkl record", NULL);
		goto out;
	}
	rc = flx_pickle_load(buf + rec.data_off, rec.size, o->fqn, &lim, &pk,
			     &e);
	if (rc)
		goto out;
	root = flx_pickle_root(pk);
	if (flx_megatron_of(b->ckpt)->objects_bare) {
		v = root; /* a zarr object file holds the value alone */
	} else if (root->kind != FLX_PV_LIST || root->u.seq.n < 1) {
		rc = extra_fail(b, o, "not a non-empty list", NULL);
		goto out;
	} else {
		v = root->u.seq.v[0];
	}
	if (v->kind == FLX_PV_NONE)
		goto out;
	if (flx_pv_obj_class(v) &&
	    flx_pv_is_global(flx_pv_obj_class(v), "_io", "BytesIO")) {
		rc = extra_fail(b, o,
				"an io.BytesIO (older TE) is not "
				"supported: its bytes in a legacy file are "
				"not specified (megatron_spec=local has no TE "
				"blobs)",
				NULL);
		goto out;
	}
	rc = flx_tensor_pkl_from_pv(v, o->fqn, &tp, &e);
	if (rc)
		goto out;
	if (tp.dtype != FLX_DT_U8 || tp.ndim != 1 ||
	    (tp.size[0] > 1 && tp.stride[0] != 1)) {
		rc =
		    extra_fail(b, o, "not a 1-D contiguous uint8 tensor", NULL);
		goto out;
	}
	snprintf(rel, sizeof(rel), "data/%s", tp.key);
	if (flx_zip_find(z, rel, &srec) ||
	    (uint64_t)tp.storage_offset > srec.size ||
	    (uint64_t)tp.size[0] > srec.size - (uint64_t)tp.storage_offset) {
		rc = extra_fail(b, o, "its storage record is missing or short",
				NULL);
		goto out;
	}
	t->shape[0] = tp.size[0];
	if (tp.size[0] > 0) {
		*p = (flx_pt_part){.file = f,
				   .off = o->off + srec.data_off +
					  (uint64_t)tp.storage_offset,
				   .len = (uint64_t)tp.size[0]};
		t->nparts = 1;
	}
out:
	if (rc && e.code)
		rc = rc == -ENOMEM ? rc : extra_fail(b, o, NULL, &e);
	flx_pickle_free(pk);
	flx_zip_close(z);
	free(buf);
	return rc;
}

/* Entry e as a torch.save value, its views owned by the fs. */
static int pt_value(flx_build *b, const flx_mlg_entry *e, flx_pt_entry *out)
{
	flx_pt_tensor *t;
	flx_pt_part *parts;
	char *name = flx_fs_alloc(b->fs, strlen(e->name) + 1);
	int rc = 0;

	if (!name)
		return -ENOMEM;
	strcpy(name, e->name);
	*out = (flx_pt_entry){.name = name};
	if (e->kind == FLX_MLG_NONE)
		return 0;
	t = flx_fs_alloc(b->fs, sizeof(*t));
	parts = flx_fs_alloc(b->fs, 2 * sizeof(*parts));
	if (!t || !parts)
		return -ENOMEM;
	out->t = t;
	t->parts = parts;
	if (e->kind == FLX_MLG_EMPTY_U8 || e->kind == FLX_MLG_OBJECT) {
		t->dtype = FLX_DT_U8;
		t->ndim = 1;
		return e->kind == FLX_MLG_OBJECT
			   ? extra_blob(b, e->obj, t, &parts[0])
			   : 0;
	}
	t->dtype = e->dtype;
	t->ndim = e->ndim;
	memcpy(t->shape, e->shape, sizeof(t->shape));
	for (int k = 0; !rc && k < e->nparts; k++) {
		flx_view *v;

		parts[k].zeros = e->part[k].zeros;
		if (!e->part[k].src)
			continue;
		rc = flx_view_new(b->ckpt, e->part[k].src, &e->part[k].box, &v,
				  b->err);
		if (!rc)
			rc = flx_fs_own_view(b->fs, v);
		if (!rc)
			parts[k].view = v;
	}
	t->nparts = (size_t)e->nparts;
	return rc;
}

/* The state dicts of rank (tp, pp, ep), chunk after chunk: *e, *n
 * (flx_mlg_free()); starts[c] the first entry of chunk c. */
static int rank_entries(const flx_ckpt *c, const flx_mlg_target *tgt, int tp,
			int pp, int ep, flx_mlg_entry **e, size_t *n,
			size_t *starts, flx_error *err)
{
	int rc = 0;

	*e = NULL;
	*n = 0;
	for (int vc = 0; !rc && vc < chunks(tgt); vc++) {
		flx_mlg_entry *ce = NULL, *all;
		size_t cn = 0;

		rc = flx_mlg_rank(c, tgt, tp, pp, ep, vc, &ce, &cn, err);
		if (rc)
			break;
		all = realloc(*e, (*n + cn + 1) * sizeof(*all));
		if (!all) {
			flx_mlg_free(ce, cn);
			rc = -ENOMEM;
			break;
		}
		*e = all;
		memcpy(all + *n, ce, cn * sizeof(*all));
		free(ce); /* the names moved */
		starts[vc] = *n;
		*n += cn;
	}
	return rc;
}

/* Whether the files leave entry e out: a tensor of a dtype torch.save's
 * row of formats/compat.h leaves out (torch 1.13 lacks it, or
 * exclude_dtypes= names it), as ranks/ model.pt does; index.json's
 * "torch.save" says why.  The _extra_state values (None, TE's uint8 blob)
 * are no tensors of the checkpoint and stay. */
static bool left_out(const flx_spec *s, const flx_mlg_entry *e)
{
	return e->kind == FLX_MLG_TENSOR &&
	       flx_fmt_left_out(s, FLX_FMT_TORCHSAVE, e->dtype);
}

/* The file of rank (tp, pp, ep) in directory dir: one state dict, or with
 * a virtual pipeline model0, model1, ... */
static int rank_file(flx_build *b, const flx_mlg_target *tgt, int dir,
		     const flx_pk_buf *pre, int tp, int pp, int ep)
{
	flx_mlg_entry *e = NULL;
	flx_pt_set *set;
	size_t n = 0, starts[FLX_MLG_MAX_VP];
	int rc = rank_entries(b->ckpt, tgt, tp, pp, ep, &e, &n, starts, b->err);

	if (rc)
		goto out;
	rc = flx_pt_set_new(b->fs, n + (size_t)chunks(tgt) - 1, &set);
	for (int vc = 0; !rc && vc < chunks(tgt); vc++) {
		size_t end = vc + 1 < chunks(tgt) ? starts[vc + 1] : n;

		if (vc > 0) {
			char key[24], *name;

			snprintf(key, sizeof(key), "model%d", vc);
			name = flx_fs_alloc(b->fs, strlen(key) + 1);
			if (!name) {
				rc = -ENOMEM;
				break;
			}
			strcpy(name, key);
			set->e[set->n++] =
			    (flx_pt_entry){.name = name, .next_dict = true};
		}
		for (size_t i = starts[vc]; !rc && i < end; i++)
			if (!left_out(b->plan->spec, &e[i]))
				rc = pt_value(b, &e[i], &set->e[set->n++]);
	}
	if (!rc) {
		set->pre = pre->p;
		set->npre = pre->n;
		set->post = (const unsigned char *)"u";
		set->npost = 1;
		rc = flx_pt_add_file(b->fs, dir, file_name, set, -1);
	}
out:
	if (rc && b->err && !b->err->code)
		flx_build_fail(b, rc, file_name, "legacy file");
	flx_mlg_free(e, n);
	return rc;
}

/* A file of the fs's copy of text in dir. */
static int text_file(flx_build *b, int dir, const char *name, const char *text)
{
	size_t n = strlen(text);
	lit *l = flx_fs_alloc(b->fs, sizeof(*l) + n + 1);
	int file, rc = l ? flx_fs_mkfile(b->fs, dir, name, &file) : -ENOMEM;

	if (rc)
		return rc;
	l->n = n;
	memcpy(l->s, text, n);
	return flx_fs_add_gen(b->fs, file, &lit_ops, l, 0);
}

/*
 * Whether the legacy format can express the target: every rank's keys
 * decided, the args written again (into pre).  When it cannot (a split TP
 * does not divide, layers PP does not divide: Megatron itself refuses
 * these; args holding a value the writer cannot write), megatron/ holds only
 * unavailable.txt, the reason in one line, and the rest of the mount
 * stands; *ok false.
 */
static int check_target(flx_build *b, const flx_mlg_target *tgt,
			flx_pk_buf *pre, int *top, bool *ok)
{
	flx_error why;
	char line[3 * FLX_ERR_FIELD + 8];
	int rc = 0;
	int64_t vocab;

	flx_error_init(&why);
	rc = flx_mlg_padded_vocab(b->ckpt, tgt, &vocab, &why);
	if (!rc && tgt->vp > FLX_MLG_MAX_VP)
		rc = flx_error_set(&why, -EINVAL, NULL, "megatron_vp",
				   "megatron/: at most %d virtual chunks",
				   FLX_MLG_MAX_VP);
	for (int pp = 0; !rc && pp < tgt->pp; pp++)
		for (int tp = 0; !rc && tp < tgt->tp; tp++)
			for (int ep = 0; !rc && ep < nep(tgt); ep++) {
				flx_mlg_entry *e = NULL;
				size_t n = 0, starts[FLX_MLG_MAX_VP];

				rc = rank_entries(b->ckpt, tgt, tp, pp, ep, &e,
						  &n, starts, &why);
				flx_mlg_free(e, n);
			}
	if (!rc)
		rc = wrapper(b, tgt, pre, &why);
	*ok = !rc;
	if (rc == -ENOMEM || rc == -EIO) {
		if (b->err)
			*b->err = why;
		return rc;
	}
	rc = flx_fs_mkdir(b->fs, 0, dir_name, top);
	if (!rc && !*ok) {
		size_t k;

		flx_error_line(&why, line, sizeof(line) - 1);
		k = strlen(line);
		line[k] = '\n';
		line[k + 1] = '\0';
		rc = text_file(b, *top, "unavailable.txt", line);
	}
	return rc ? flx_build_fail(b, rc, dir_name, "creating the tree") : 0;
}

static int megatron_build(flx_build *b, void *state)
{
	const flx_spec *s = b->plan->spec;
	flx_mlg_target tgt = flx_mlg_target_of(s);
	flx_pk_buf pre = {0};
	char name[64];
	int top, iter, rc;
	bool ok;
	int64_t it;

	(void)state;
	if (!flx_megatron_of(b->ckpt))
		return 0;
	rc = check_target(b, &tgt, &pre, &top, &ok);
	if (rc || !ok)
		goto out;
	/* a save directory's release/ is served as release/ again; so is
	 * iteration 0, which Megatron's read_metadata() refuses unless the
	 * tracker says release (it asserts iteration > 0 or release) */
	it = flx_megatron_of(b->ckpt)->release
		 ? -1
		 : flx_megatron_of(b->ckpt)->iteration;
	if (it == 0)
		it = -1;
	if (it < 0)
		snprintf(name, sizeof(name), "release");
	else
		snprintf(name, sizeof(name), "%lld", (long long)it);
	rc = text_file(b, top, latest_name, name);
	flx_mlg_dir_name(it, -1, 0, 1, 0, 1, name, sizeof(name));
	if (!rc)
		rc = flx_fs_mkdir(b->fs, top, name, &iter);
	if (rc) {
		flx_build_fail(b, rc, dir_name, "creating the tree");
		goto out;
	}
	/* the pre bytes are shared by every file: kept by the fs */
	{
		unsigned char *keep = flx_fs_alloc(b->fs, pre.n);

		if (!keep) {
			rc = flx_build_fail(b, -ENOMEM, dir_name, "");
			goto out;
		}
		memcpy(keep, pre.p, pre.n);
		free(pre.p);
		pre.p = keep;
		pre.cap = 0;
	}
	for (int pp = 0; !rc && pp < tgt.pp; pp++)
		for (int tp = 0; !rc && tp < tgt.tp; tp++)
			for (int ep = 0; !rc && ep < nep(&tgt); ep++) {
				int dir;

				flx_mlg_dir_name(0, tp, pp, tgt.pp, ep,
						 nep(&tgt), name, sizeof(name));
				rc = flx_fs_mkdir(b->fs, iter, name, &dir);
				if (rc)
					flx_build_fail(b, rc, name,
						       "creating directory");
				else
					rc = rank_file(b, &tgt, dir, &pre, tp,
						       pp, ep);
			}
out:
	if (pre.cap)
		free(pre.p);
	return rc;
}

const flx_layout flx_layout_megatron = {
    .name = dir_name,
    .build = megatron_build,
    .opts = &flx_mlg_opt_group,
};
