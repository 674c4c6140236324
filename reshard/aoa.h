/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_AOA_H
#define FLX_RESHARD_AOA_H

/*
 * Paddle's AOA ("All-in-One-Arrow") statements: the rule language of
 * Paddle's Flex Checkpoint (../shared/specs/paddle-format.md section 5),
 * compiled into the transform stage's list (transform.h).
 *
 * Parsing needs no checkpoint: flx_aoa_parse() lexes and parses every
 * statement ("src, ... -> dst, ... [, key=value ...]", or the old
 * "dst <- src"), expands name[a:b], and checks the attributes.  Compiling
 * needs the source's names and shapes: flx_aoa_compile() expands the
 * macros against the source keys ($LAYER_ID, $EXPERT_ID, $LAYER_ID_OFFSET,
 * prefix*suffix), executes the statements symbolically (every variable is
 * a set of boxes, each a source tensor through a chain of slices,
 * transposes and casts, placed at an offset) and emits one transform
 * target per variable that no later statement consumes.  Source tensors a
 * statement reads are not served under their own names any more (unless a
 * statement writes them again); the others pass through.
 *
 * Not supported (refused with a clear error): `_ -> B` (a view cannot
 * invent data).  A fused macro's statement takes axis, its head and shard
 * counts only (no dtype=, permute=); src_tp= and dst_tp= need fused_ffn
 * or fused_qkv_old (docs/spec-audit-aoa-pdparams.md).
 *
 * Thread-safety: a parsed list and a compiled program are immutable; any
 * number of threads may read them.  Parsing and compiling are reentrant.
 */

#include "ckpt.h"
#include "error.h"
#include "opt.h"
#include "transform.h"

#include <stddef.h>

/* Bounds on untrusted statements. */
#define FLX_AOA_MAX_STATEMENTS 65536
#define FLX_AOA_MAX_NAME       1024
#define FLX_AOA_MAX_VARS       4096    /* per side of one statement */
#define FLX_AOA_MAX_EXPANSION  1000000 /* statement instances in all */

typedef struct flx_aoa flx_aoa;
typedef struct flx_aoa_prog flx_aoa_prog;

/**
 * Parse n statement strings (each may hold several, one per line).
 * origin names the list in errors (copied; NULL: none).  An error is one
 * line: "statement K column C: reason" (K counts lines holding a
 * statement, from 1 across all strings; C from 1).
 * @return 0 and *out (owned, flx_aoa_free()), or -EINVAL / -ENOMEM with
 *         err.
 */
int flx_aoa_parse(const char *const *stmts, size_t n, const char *origin,
		  flx_aoa **out, flx_error *err);

/** Free a parsed list; NULL is fine. */
void flx_aoa_free(flx_aoa *a);

/** Number of statements parsed. */
size_t flx_aoa_count(const flx_aoa *a);

/* What the statements cannot say themselves. */
typedef struct flx_aoa_opts {
	int tp; /* the mount's TP degree: the default destination shard
		 * count of fused_ffn / fused_qkv_old (< 1: 1) */
	/* defaults of fused_qkv's num_heads and num_key_value_groups (0:
	 * the source's Megatron arguments, if any) */
	int64_t num_heads, num_kv_groups;
	/* the default source shard count of fused_ffn / fused_qkv_old (0:
	 * unset, read as 1; then a source tensor saved in k > 1 equal
	 * pieces along the fused axis is refused: its layout may be the
	 * per-rank [gate_0 | up_0 | gate_1 | ...] of TP k) */
	int64_t src_tp;
} flx_aoa_opts;

/* The transform's options (aoa_num_heads, aoa_num_key_value_groups,
 * aoa_src_tp), read from a value store by flx_aoa_opts_from(). */
extern const flx_opt_group flx_aoa_opt_group;

/** The options vals gives (NULL: none) at the mount's TP degree tp. */
flx_aoa_opts flx_aoa_opts_from(const flx_opt_vals *vals, int tp);

/**
 * Compile a against src (its names, dtypes, shapes and saved chunks:
 * what flx_ckpt_open_start() gives) with o (NULL: defaults).
 * @return 0 and *out (owned, flx_aoa_prog_free()), or -errno with err
 *         naming the statement and the reason.
 */
int flx_aoa_compile(const flx_aoa *a, const flx_ckpt *src,
		    const flx_aoa_opts *o, flx_aoa_prog **out, flx_error *err);

/** The compiled transform list, valid until flx_aoa_prog_free(). */
const flx_xform *flx_aoa_prog_xform(const flx_aoa_prog *p);

/** Warning i (0, 1, ...): a statement that matched nothing.  One line in
 * buf.  @return 0, or -ENOENT past the last. */
int flx_aoa_prog_note(const flx_aoa_prog *p, size_t i, char *buf, size_t len);

/** Number of warnings (0 for NULL). */
size_t flx_aoa_prog_nnotes(const flx_aoa_prog *p);

/** Target i (0, 1, ...), in the order of the statements that wrote them:
 * its name, the statements that made it ("stmt 3 <- stmt 1, stmt 2") and
 * the number of its source boxes, all valid until flx_aoa_prog_free().
 * @return 0, or -ENOENT past the last. */
int flx_aoa_prog_target(const flx_aoa_prog *p, size_t i, const char **name,
			const char **chain, size_t *nsources);

/** Source box k of target i, one line: "SOURCE[lo:hi, ...] permute(...)
 * cast(DTYPE) -> [lo:hi, ...]" (the box of the source tensor read, the
 * chain applied to it, the box of the target it fills); NULL past the
 * last.  Valid until flx_aoa_prog_free(). */
const char *flx_aoa_prog_source(const flx_aoa_prog *p, size_t i, size_t k);

/** Free a program; NULL is fine. */
void flx_aoa_prog_free(flx_aoa_prog *p);

#endif
