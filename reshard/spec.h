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
 *                      holds [part0_r; part1_r; ...], as a gated
 *                      MLP's fused fc1 [gate_r; up_r]; absent: one part)
 *     "when": "<fact>", (the rule applies only to a source whose model
 *                      has that fact, flx_ckpt_fact(); else the next rule is
 *                      tried)
 *     "note": "<free text, ignored>" }
 * Unknown keys are errors (a typo must not be silently ignored).
 *
 * Rules file v2: an object {"<kind>": [ "<statement>", ... ],
 * "rules": [ v1 rule objects ], "note": "<ignored>"}, each key optional:
 * a transform's statements (one key per kind of statements,
 * flx_stmt_kinds[]) transform the tensors first, then the rules place the
 * result.
 */

#include "error.h"
#include "opt.h"

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

/* A transform whose statements a rules file may carry (v2): the key of
 * the rules object it owns and its parse of that key's strings. */
typedef struct flx_stmt_kind {
	const char *key;
	/* Parse n statement strings; origin names them in errors.
	 * @return 0 and *out (owned, free()), or -EINVAL / -ENOMEM with
	 *         err. */
	int (*parse)(const char *const *v, size_t n, const char *origin,
		     void **out, flx_error *err);
	void (*free)(void *stmts);
} flx_stmt_kind;

/* The kinds of statements, NULL-terminated (reshard/stmt_kinds.c). */
#define FLX_MAX_STMT_KINDS 4
extern const flx_stmt_kind *const flx_stmt_kinds[];

/* At most this many distinct facts in the rules' "when". */
#define FLX_SPEC_MAX_FACTS 32

typedef struct flx_rule {
	char *match;
	flx_split_kind split;
	int axis;
	int groups; /* equal parts of axis, each split over TP; 0: one */
	/* the facts the source must have (bit i: flx_spec.facts[i]); 0: any
	 * source */
	unsigned when;
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
	/* the transform stage's list (transform.h), owned; NULL: the
	 * source's tensors are served as they are */
	struct flx_xform *xform;
	/* the rules file's statements, per kind (stmts[k] of
	 * flx_stmt_kinds[k], parsed by it, owned); NULL: none.  At mount they
	 * are compiled against the source into the transform list that
	 * replaces xform */
	void *stmts[FLX_MAX_STMT_KINDS];
	/* include=, exclude= (fnmatch globs on the names as saved, owned):
	 * a tensor or object is served when it matches an include glob (or
	 * there is none) and no exclude glob; strip_prefix= (owned, NULL:
	 * none) is then cut from the names that start with it (filter.h) */
	char **include;
	size_t ninclude;
	char **exclude;
	size_t nexclude;
	char *strip_prefix;
	/* the plugins' options (the layouts' and the transforms' own, opt.h):
	 * read by their owners by name at build time; owned */
	flx_opt_vals opts;
	/* the facts the rules' "when" name (flx_ckpt_fact()), owned; a
	 * rule's when is a bit set over these, bit i for facts[i] */
	char **facts;
	size_t nfacts;
	/* the mount's slicer backend ("cpu", "cuda": gpu/slice.h; borrowed),
	 * which index.json records; NULL: not recorded */
	const char *slicer;
} flx_spec;

#define FLX_DEFAULT_LAYER_REGEX "(^|\\.)layers\\.([0-9]+)\\."
#define FLX_DEFAULT_EMBED_REGEX                                                \
	"(^|\\.)(tok_embeddings|embed_tokens|word_embeddings|wte)(\\.|$)"
#define FLX_DEFAULT_HF_SHARD_SIZE (5ull << 30)

/* The options flx_spec_set() applies (tp, pp, rules, ...): the view's
 * own, every one of them core (flx_opt_group.core). */
extern const flx_opt_group flx_spec_opt_group;

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
 * (bytes with optional K/M/G/T suffix, binary), include and exclude
 * (globs separated by ':'; each option adds to the list), strip_prefix:
 * flx_spec_opt_group.  A plugin's option is not one of these: the parser
 * stores it in s->opts (flx_opt_vals_set()).
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
 * facts (bit i: the source has flx_spec.facts[i]), or NULL. */
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

#endif
