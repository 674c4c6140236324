/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_MLG_RULES_H
#define FLX_RESOLVER_MLG_RULES_H

/*
 * How Megatron's tensor parallelism splits a parameter of its GPT model
 * (docs/formats/megatron-legacy.md, "Split rules"): one decision shared by
 * the megatron/ target (reshard/megatron_legacy.c, global -> per rank) and
 * the megatron-legacy source (per rank -> global).  Upstream: Megatron-LM
 * megatron/core/tensor_parallel/layers.py (ColumnParallelLinear,
 * RowParallelLinear, VocabParallelEmbedding) and
 * megatron/core/transformer/mlp.py (apply_swiglu_sharded_factory).
 *
 * Thread-safety: pure.
 */

#include <stdbool.h>

typedef enum flx_mlg_split {
	FLX_MLG_REPL,	/* replicated on every TP rank */
	FLX_MLG_COL,	/* axis 0 */
	FLX_MLG_ROW,	/* axis 1 */
	FLX_MLG_GLU,	/* [gate_r; up_r] of the global [gate; up] */
	FLX_MLG_VOCAB,	/* rows of the padded vocab table */
	FLX_MLG_CHUNKS, /* no rule: the saved split decides, if any */
} flx_mlg_split;

/**
 * The split of parameter prm ("weight", "bias", "layer_norm_weight", ...)
 * of module mod, a module path without a layer prefix
 * ("self_attention.linear_qkv", "embedding.word_embeddings",
 * "output_layer"); swiglu: linear_fc1 holds [gate; up].
 */
flx_mlg_split flx_mlg_split_rule(const char *mod, const char *prm, bool swiglu);

#endif
