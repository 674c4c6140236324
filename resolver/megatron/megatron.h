/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_MEGATRON_MEGATRON_H
#define FLX_RESOLVER_MEGATRON_MEGATRON_H

/*
 * The Megatron-Core sources (torch_dist, zarr) as their consumers see
 * them: the common state a source read, reached through the index's
 * facts (flx_megatron_of()), and the save directory's tracker file.
 *
 * Facts of these sources: "megatron" (a pointer to flx_megatron),
 * "swiglu" (bool: whether linear_fc1 is SwiGLU, from args.swiglu, else
 * fc1's saved chunks, else -o megatron_swiglu=; when none of them tells
 * and the model has an fc1 the hook answers -ENODATA with a text naming
 * the option, see flx_ckpt_fact()).
 */

#include "ckpt.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * What a Megatron-Core checkpoint's common state says (common.pt, or from
 * 0.19 the bytes item common_state/shard_0_1): the iteration and the
 * arguments of the saving run that a legacy per-rank view needs.  Integer
 * fields are -1, flags -1 and strings "" where the state lacks them.  The
 * pickle itself stays where it is (common_file, pkl_off, pkl_len), to be
 * re-read by whoever re-emits the arguments.
 */
typedef struct flx_megatron {
	int64_t iteration;
	double checkpoint_version;
	/* args (an argparse.Namespace, or a dict of its fields) */
	int64_t num_layers;
	int64_t hidden_size;
	int64_t num_attention_heads;
	int64_t num_query_groups;
	int64_t kv_channels;
	int64_t ffn_hidden_size;
	int64_t padded_vocab_size;
	int64_t make_vocab_size_divisible_by;
	int64_t tensor_model_parallel_size;
	int64_t pipeline_model_parallel_size;
	int64_t virtual_pipeline_model_parallel_size;
	int64_t num_experts;
	int64_t moe_ffn_hidden_size;
	int64_t expert_model_parallel_size;
	int64_t expert_tensor_parallel_size;
	int swiglu; /* flags: 0, 1, or -1 absent */
	/* swiglu was absent from args and decided from fc1's saved chunks
	 * (torch_dist: each TP rank's W and V row ranges) */
	bool swiglu_inferred;
	/* swiglu was absent from args, the chunks did not tell, and
	 * -o megatron_swiglu= stated it */
	bool swiglu_stated;
	/* the model has a linear_fc1 weight (dense or expert): swiglu
	 * decides how it splits */
	bool has_fc1;
	int group_query_attention;
	int untie_embeddings_and_output_weights;
	int add_bias_linear;
	int add_qkv_bias;
	int moe_grouped_gemm; /* TE spec experts: TEGroupedMLP */
	int64_t vocab_size; /* args.vocab_size (the tokenizer's); -1: unknown */
	char transformer_impl[32];	  /* "local", "transformer_engine" */
	char normalization[32];		  /* "RMSNorm", "LayerNorm" */
	char position_embedding_type[32]; /* "rope", "learned_absolute" */
	/* content_metadata.distrib_optim_sharding_type, else
	 * optimizer.param_state_sharding_type */
	char optim_sharding[48];
	/* neither says: optim_sharding is what Megatron assumes
	 * (docs/formats/megatron.md#optimizer-format-detection), from
	 * args.ckpt_fully_parallel_save */
	bool optim_assumed;
	/* content_metadata.singleton_local_shards
	 * (docs/formats/megatron.md#stacked-layers: per-layer, per-expert keys,
	 * fc1 as weight_w / weight_v): 0, 1, or -1 absent */
	int singleton_local_shards;
	/* where the common state's data.pkl lies: files[common_file],
	 * bytes [pkl_off, pkl_off + pkl_len) */
	uint32_t common_file;
	uint64_t pkl_off;
	uint64_t pkl_len;
	bool common_item; /* from the common_state item, not common.pt */
	/* the source's ShardedObject values are torch.save(value) files
	 * (zarr), not torch.save([value]) bytes items (torch_dist) */
	bool objects_bare;
	/* mounted through a save directory whose
	 * latest_checkpointed_iteration.txt says "release" (its release/) */
	bool release;
} flx_megatron;

/* The option that states args.swiglu when the checkpoint does not. */
#define FLX_MEGATRON_SWIGLU_OPT "megatron_swiglu"

/* The name of the pointer fact that is a flx_megatron. */
#define FLX_FACT_MEGATRON "megatron"

/** c's Megatron common state, or NULL when c is not from a Megatron-Core
 * source.  Thread-safe. */
static inline const flx_megatron *flx_megatron_of(const flx_ckpt *c)
{
	return (const flx_megatron *)flx_ckpt_fact_ptr(c, FLX_FACT_MEGATRON);
}

#endif
