/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_SPEC_H
#define FLX_RESHARD_SPEC_H

/*
 * The target parallel layout a mount presents: tp x pp ranks, optional
 * placement rules, and the naming conventions for pipeline stages.
 *
 * Rules file: a JSON array of objects, tried in order, first match wins:
 *   { "match": "<fnmatch glob on the FQN>",
 *     "split": <axis> | null,          (absent: infer from the source)
 *     "stage": "first" | "last" | "all" | <n>,   (absent: default rule)
 *     "groups": <G>,   (2-64; with "split": the axis is G equal
 *                      consecutive parts, each split over TP: rank r
 *                      holds [part0_r; part1_r; ...], as Megatron's
 *                      SwiGLU fc1 [gate_r; up_r]; absent: one part)
 *     "when": "<fact>", (the rule applies only to a source whose model
 *                      has that fact, FLX_FACT_*; else the next rule is
 *                      tried)
 *     "note": "<free text, ignored>" }
 * Unknown keys are errors (a typo must not be silently ignored).
 *
 * Rules file v2: an object {"aoa_statements": [ "<statement>", ... ],
 * "rules": [ v1 rule objects ], "note": "<ignored>"}, each key optional:
 * Paddle's AOA statements (aoa.h) transform the tensors first, then the
 * rules place the result.
 */

#include "error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FLX_MAX_TP 4096
#define FLX_MAX_PP 1024
/* The metadata a mount's tree takes, about: per rank directory (its
 * entries in every view) and per tensor slice (a tensor on one TP rank:
 * its plan box, entries and headers), measured on hf-tiny at tp 64..4096;
 * a layout past the bound is refused before the plan is built. */
#define FLX_TREE_RANK_BYTES  1024
#define FLX_TREE_SLICE_BYTES 160
#define FLX_TREE_MAX_BYTES   (2ULL << 30)

typedef enum flx_split_kind {
	FLX_SPLIT_INFER = 0, /* from the source chunks */
	FLX_SPLIT_NONE,	     /* replicate on every TP rank */
	FLX_SPLIT_AXIS,	     /* along rule.axis */
} flx_split_kind;

typedef enum flx_stage_kind {
	FLX_STAGE_DEFAULT = 0, /* layer regex / embedding / last */
	FLX_STAGE_FIRST,
	FLX_STAGE_LAST,
	FLX_STAGE_ALL,
	FLX_STAGE_N,
} flx_stage_kind;

/* Facts of a source's model that a rule may require ("when"). */
#define FLX_FACT_SWIGLU 1u /* "swiglu": gated fc1 [gate; up] */

typedef struct flx_rule {
	char *match;
	flx_split_kind split;
	int axis;
	int groups;    /* equal parts of axis, each split over TP; 0: one */
	unsigned when; /* FLX_FACT_* the source must have; 0: any source */
	flx_stage_kind stage;
	int stage_n;
} flx_rule;

typedef struct flx_spec {
	int tp;		   /* >= 1 */
	int pp;		   /* >= 1 */
	char *rules_path;  /* NULL: no rules */
	bool rules_preset; /* rules=@NAME: a shipped preset */
	flx_rule *rules;
	size_t nrules;
	char *layer_regex; /* POSIX ERE; the last group is the layer index */
	char *embed_regex; /* POSIX ERE for first-stage tensors */
	bool pp_renumber;  /* stage-local layer indices */
	uint64_t hf_shard_size; /* bytes per hf/ shard before splitting */
	/* megatron/ legacy files with Transformer Engine names
	 * (megatron_spec=te); false: the local spec's */
	bool megatron_te;
	/* the tokenizer's vocab size for megatron/'s re-padded tables
	 * (megatron_true_vocab=V); 0: unknown, the saved table's rows */
	int64_t megatron_true_vocab;
	/* megatron/'s expert parallel size (megatron_ep=N) and virtual
	 * pipeline size (megatron_vp=N); 0: none */
	int megatron_ep, megatron_vp;
	/* mindspore/: per-rank .ckpt files (-o mindspore, or set by
	 * dst_strategy); dst_strategy (owned, NULL: none): the MindSpore
	 * strategy file giving their layout instead of tp x pp */
	bool mindspore;
	char *dst_strategy;
	/* the transform stage's list (transform.h), owned; NULL: the
	 * source's tensors are served as they are */
	struct flx_xform *xform;
	/* the rules file's AOA statements (aoa.h), owned; NULL: none.  At
	 * mount they are compiled against the source into the transform
	 * list that replaces xform */
	struct flx_aoa *aoa;
	/* fused_qkv's num_heads and num_key_value_groups where a statement
	 * omits them (aoa_num_heads=, aoa_num_key_value_groups=; 0: unset) */
	int64_t aoa_num_heads, aoa_num_kv_groups;
	/* fused_ffn's and fused_qkv_old's src_tp where a statement omits it
	 * (aoa_src_tp=; 0: unset, read as 1 unless the saved chunks show
	 * another degree: aoa.h) */
	int64_t aoa_src_tp;
	/* include=, exclude= (fnmatch globs on the names as saved, owned):
	 * a tensor or object is served when it matches an include glob (or
	 * there is none) and no exclude glob; strip_prefix= (owned, NULL:
	 * none) is then cut from the names that start with it (filter.h) */
	char **include;
	size_t ninclude;
	char **exclude;
	size_t nexclude;
	char *strip_prefix;
	/* the mount's slicer backend ("cpu", "cuda": gpu/slice.h; borrowed),
	 * which index.json records; NULL: not recorded */
	const char *slicer;
} flx_spec;

#define FLX_DEFAULT_LAYER_REGEX "(^|\\.)layers\\.([0-9]+)\\."
#define FLX_DEFAULT_EMBED_REGEX                                                \
	"(^|\\.)(tok_embeddings|embed_tokens|word_embeddings|wte)(\\.|$)"
#define FLX_DEFAULT_HF_SHARD_SIZE (5ull << 30)

/** Defaults: tp=1 pp=1, default regexes, 5 GiB hf shards.
 * @return 0 or -ENOMEM. */
int flx_spec_init(flx_spec *s);

/** Free owned strings, rules and the transform list; safe after a
 * partial init. */
void flx_spec_release(flx_spec *s);

/**
 * Set one option from its text form ("tp", "4").  Keys: tp, pp, rules
 * (loads and validates the file now; "@NAME" is the preset NAME.json of
 * flx_spec_preset_dir()), layer_regex, embed_regex,
 * pp_renumber (value NULL, "1", "0", "true", "false"), hf_shard_size
 * (bytes with optional K/M/G/T suffix, binary), megatron_spec (local, te),
 * megatron_true_vocab (a positive integer), aoa_num_heads,
 * aoa_num_key_value_groups and aoa_src_tp (positive integers), mindspore
 * (a flag),
 * dst_strategy (a path, read when the tree is built), include and exclude
 * (globs separated by ':'; each option adds to the list), strip_prefix.
 * @return 0, -EINVAL (bad value; err names the key) or -ENOENT (unknown key,
 *         err untouched so callers can pass it on).
 */
int flx_spec_set(flx_spec *s, const char *key, const char *value,
		 flx_error *err);

/**
 * The directory of the shipped rules presets: $FLEXFS_PRESET_DIR when set,
 * else share/flexfs/rules beside the running executable's bin/ directory
 * (<prefix>/bin/flexfs -> <prefix>/share/flexfs/rules; the build tree has
 * the same layout).  @return 0 and buf, or -errno (-ENAMETOOLONG: len too
 * small).  Thread-safe.
 */
int flx_spec_preset_dir(char *buf, size_t len);

/** Parse rules JSON text (name for messages).  Replaces s->rules.
 * @return 0 or -EINVAL with err naming the file, the rule index and key. */
int flx_spec_rules_parse(flx_spec *s, const char *json, size_t len,
			 const char *name, flx_error *err);

/** First rule whose glob matches fqn and that requires no fact, or
 * NULL. */
const flx_rule *flx_spec_match(const flx_spec *s, const char *fqn);

/** First rule whose glob matches fqn and whose facts ("when") are all in
 * facts (FLX_FACT_* of the source), or NULL. */
const flx_rule *flx_spec_match_facts(const flx_spec *s, const char *fqn,
				     unsigned facts);

/**
 * The default layer regex, FLX_DEFAULT_LAYER_REGEX, without regexec():
 * true when fqn matches it, with [*so, *eo) the layer digits (its last
 * group), exactly as regexec() reports them.  glibc's regexec() with
 * capture groups is slow enough to dominate the plan of a large
 * checkpoint (docs/performance.md).
 */
bool flx_default_layer_match(const char *fqn, size_t *so, size_t *eo);

/** Parse a size "5G", "512M", "1048576".  @return 0 or -EINVAL. */
int flx_parse_size(const char *text, uint64_t *out);

/**
 * Parse the value of a flag option: absent (NULL, "-o flag"), "1" or
 * "true" set it, "0" or "false" clear it.  Every flag of the mount
 * (pp_renumber, direct_io) takes this one grammar.
 * @return 0 and *out, or -EINVAL with err naming key.
 */
int flx_parse_flag(const char *key, const char *value, bool *out,
		   flx_error *err);

#endif
