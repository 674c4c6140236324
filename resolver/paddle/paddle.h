/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_PADDLE_PADDLE_H
#define FLX_RESOLVER_PADDLE_PADDLE_H

/*
 * The Paddle Flex Checkpoint source as its consumers see it: what the
 * checkpoint says beyond its tensors, reached through the index's facts
 * (flx_paddle_of()).
 *
 * Facts of this source: "paddle" (a pointer to flx_paddle).
 */

#include "ckpt.h"

#include <stddef.h>
#include <stdint.h>

/*
 * What a Paddle Flex Checkpoint says beyond its tensors: the checkpoint id
 * that was read and the static parameter name Paddle gave each key (the
 * "StructuredToParameterName@@" tables of its .distcp files, merged:
 * "llama.embed_tokens.weight" -> "embedding_0.w_0",
 * "....q_proj.weight.moment1_0" -> "linear_0.w_0_fp32_master_0_moment1_0"),
 * which per-rank .pdparams/.pdopt files carry again.  Strings in pool.
 */
typedef struct flx_name_pair {
	const char *key;  /* a tensor FQN of the index */
	const char *name; /* Paddle's static name for it */
} flx_name_pair;

typedef struct flx_paddle {
	int64_t unique_id;
	size_t nnames;
	flx_name_pair *names; /* sorted by key, keys unique */
} flx_paddle;

/* The name of the pointer fact that is a flx_paddle. */
#define FLX_FACT_PADDLE "paddle"

/** c's Paddle description, or NULL when c is not from the Paddle
 * source.  Thread-safe. */
static inline const flx_paddle *flx_paddle_of(const flx_ckpt *c)
{
	return (const flx_paddle *)flx_ckpt_fact_ptr(c, FLX_FACT_PADDLE);
}

/**
 * Make c (an index built by hand, tests) answer the "paddle" fact with
 * pd (borrowed; NULL: no such fact).
 */
void flx_paddle_attach(flx_ckpt *c, const flx_paddle *pd);

#endif
