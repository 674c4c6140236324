/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_MEGATRON_LEGACY_H
#define FLX_RESHARD_MEGATRON_LEGACY_H

/*
 * Megatron's legacy per-rank state dicts
 * (docs/formats/megatron.md#legacy-target,
 * docs/formats/megatron.md#legacy-recipe) from a torch_dist index: which keys
 * rank (tp, pp) of a target TP x PP holds, in module registration order, and
 * where each one's bytes lie in the source tensors.  The decision only;
 * fs/layouts/megatron.c turns it into files.
 *
 * The rules, written here once:
 *  - stage p holds global layers [p L/PP, (p+1) L/PP), numbered from 0
 *    (L must divide by PP); with a virtual pipeline of VP chunks, chunk
 *    i of stage p holds [i L/VP + p L/(PP VP), + L/(PP VP)), the
 *    embedding in chunk 0 of stage 0, the final norm and output layer in
 *    the last chunk of the last stage; embedding.* on stage 0,
 * decoder.final_layernorm and output_layer on the last;
 *  - stacked "decoder.layers.<rest>" and per-layer "decoder.layers.<g>."
 *    keys become "decoder.layers.<l>.<rest>"; experts stacked under
 *    "mlp.experts.experts." become "mlp.experts.local_experts.<e>." (e the
 *    local expert: global ep E/EP + e), or with TE and
 *    args.moe_grouped_gemm (TEGroupedMLP) "mlp.experts.<linear>.weight<e>";
 *  - local spec: "self_attention.linear_qkv.layer_norm_*" is
 *    "input_layernorm.*", "mlp.linear_fc1.layer_norm_*" is
 *    "pre_mlp_layernorm.*"; TE spec: names unchanged, but a MoE layer's
 *    "mlp.linear_fc1.layer_norm_*" (no fc1 to fuse into) is
 *    "pre_mlp_layernorm.*";
 *  - TP: linear_qkv, core_attention.softmax_offset column-parallel (axis 0);
 *    linear_proj.weight and linear_fc2.weight row-parallel (axis 1); with
 *    SwiGLU linear_fc1 (weight, bias) as [gate_r; up_r], two row ranges of
 *    the [gate; up] global form, else column-parallel; the vocab tables
 *    (word and output embeddings, output bias) re-padded to
 *    ceil(V / (m TP)) (m TP) rows (V the true vocab when given, else
 *    the source's args.vocab_size, else any V the saved rows P allow
 *    when all give the same rows, flx_mlg_padded_vocab(); m =
 * make_vocab_size_divisible_by, default 128): rows past P zero, rows past the
 * new size dropped, split on rows; norms, router, biases of row-parallel
 * linears, position embeddings replicated; another key split along the one
 * parameter axis its chunks split;
 *  - tied embeddings (no output_layer.weight key): the last stage of
 *    PP > 1 holds output_layer.weight, its slice of the word embedding,
 *    and every last stage output_layer._extra_state = None;
 *  - _extra_state after each linear's parameters: None (local spec;
 *    output_layer in both), an empty uint8 tensor (TE spec), and for TE
 *    one of self_attention.core_attention before linear_proj; with TE a
 *    layer linear (not an expert's) whose source has the bytes item
 *    "decoder.layers.<mod>._extra_state/shard_<g>_<L>" (g global, L the
 *    layer count) takes that item's first list element (FLX_MLG_OBJECT),
 *    the same on every TP rank
 * (docs/formats/megatron.md#stage-local-layer-numbering).
 *
 * Thread-safety: pure; any number of threads.
 */

#include "ckpt.h"
#include "megatron/megatron.h"
#include "opt.h"
#include "spec.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* the file in each rank directory */
#define FLX_MLG_FILE "model_optim_rng.pt"
/* the most virtual pipeline chunks a target may have */
#define FLX_MLG_MAX_VP 64

typedef enum flx_mlg_kind {
	FLX_MLG_TENSOR,
	FLX_MLG_NONE,	  /* the value None */
	FLX_MLG_EMPTY_U8, /* torch.empty(0, dtype=torch.uint8) */
	FLX_MLG_OBJECT,	  /* the first list element of a bytes item (obj) */
} flx_mlg_kind;

/* Bytes of a legacy tensor, in order: a box of a source tensor (its C-order
 * bytes), or (src NULL) zero bytes. */
typedef struct flx_mlg_part {
	const flx_tensor *src;
	flx_box box;
	uint64_t zeros;
} flx_mlg_part;

typedef struct flx_mlg_entry {
	char *name; /* the state dict key; owned by the list */
	flx_mlg_kind kind;
	flx_dtype dtype;
	int ndim;
	int64_t shape[FLX_MAX_DIMS];
	int nparts;
	flx_mlg_part part[2];
	const flx_object *obj; /* FLX_MLG_OBJECT: the source's item */
} flx_mlg_entry;

typedef struct flx_mlg_target {
	int tp, pp;
	/* expert parallel size (megatron_ep): each (tp, pp, ep) rank holds
	 * experts [ep E/EP, (ep + 1) E/EP), numbered from 0; virtual
	 * pipeline size (megatron_vp): each file holds chunks model0 ..
	 * model<vp-1>; 0 or 1: none */
	int ep, vp;
	bool te; /* Transformer Engine names (megatron_spec=te) */
	/* the tokenizer's vocab V (megatron_true_vocab); 0: the source's
	 * args.vocab_size, or when that is unknown too the saved table's
	 * rows bound it (flx_mlg_padded_vocab()) */
	int64_t true_vocab;
	/* make_vocab_size_divisible_by (megatron_vocab_divisible_by); 0: the
	 * source's args */
	int64_t div_by;
	/* TEGroupedMLP experts (megatron_grouped_gemm): 0, 1, -1 the
	 * source's args.moe_grouped_gemm */
	int grouped;
} flx_mlg_target;

/* The megatron/ layout's options: megatron_spec, megatron_true_vocab,
 * megatron_vocab_divisible_by, megatron_grouped_gemm, megatron_ep,
 * megatron_vp. */
extern const flx_opt_group flx_mlg_opt_group;

/** The target the spec's tp, pp and the layout's options (in s->opts)
 * describe.  Pure. */
flx_mlg_target flx_mlg_target_of(const flx_spec *s);

/**
 * The padded vocab size of the target (what args.padded_vocab_size says):
 * the source's word embedding rows re-padded for tgt->tp.  The multiple
 * is tgt->div_by, else args.make_vocab_size_divisible_by; with neither,
 * only a target at the saving run's tp with no true vocab is certain (the
 * saved rows), any other is refused naming megatron_vocab_divisible_by
 * (docs/facts.md); so is a tgt->div_by that contradicts the args.  With
 * the multiple m but no true vocab (tgt->true_vocab, args.vocab_size) the
 * saved rows n bound it to (n - m tp_saved, n] (tp_saved from
 * args.tensor_model_parallel_size, else the table's row chunks): the
 * padding is served when the same for all of them, else refused naming
 * megatron_true_vocab.
 * @return 0 and *out, or -EINVAL with err (no word embedding, a fact
 *         absent or contradicted).
 */
int flx_mlg_padded_vocab(const flx_ckpt *c, const flx_mlg_target *tgt,
			 int64_t *out, flx_error *err);

/**
 * The state dict of target rank (tp, pp, ep), virtual chunk vc (0 without
 * a virtual pipeline; chunk vc of stage pp holds global layers from
 * vc L/VP + pp L/(PP VP), L/(PP VP) of them,
 * docs/formats/megatron.md#stage-local-layer-numbering): *n entries in *out
 * (owned; flx_mlg_free()), in module registration order.  c must be a
 * Megatron index (flx_megatron_of(c) set).
 * @return 0, or -EINVAL with err naming the key that has no legacy place
 *         or split (a layer count PP does not divide, a split axis TP does
 *         not divide, a key outside the catalogue), -ENOMEM.
 */
int flx_mlg_rank(const flx_ckpt *c, const flx_mlg_target *tgt, int tp, int pp,
		 int ep, int vc, flx_mlg_entry **out, size_t *n,
		 flx_error *err);

void flx_mlg_free(flx_mlg_entry *e, size_t n);

/**
 * The path scheme (docs/formats/megatron.md#legacy-paths): into out (cap bytes)
 * the iteration's directory, "iter_%07d" or "release" (iteration < 0), when tp
 * < 0; else rank (tp, pp, ep)'s directory of npp stages and nep expert ranks,
 * "mp_rank_%02d", "_%03d" (pp) appended when npp > 1, "_%03d" (ep) when
 * nep > 1.  Truncated to cap.
 */
void flx_mlg_dir_name(int64_t iteration, int tp, int pp, int npp, int ep,
		      int nep, char *out, size_t cap);

/** The layer count L: args.num_layers, else the stacked axis of the
 * model keys; 0 when neither says. */
int64_t flx_mlg_layer_count(const flx_ckpt *c);

/** Whether fqn is a model key (not optimizer state). */
bool flx_mlg_is_model_key(const char *fqn);

/** Whether c's model has a SwiGLU linear_fc1 ([gate; up], split per TP
 * rank as [gate_r; up_r]): its Megatron args say swiglu=True; false for
 * any other source.  Thread-safe. */
bool flx_mlg_swiglu(const flx_ckpt *c);

#endif
