/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_PICKLE_EMIT_H
#define FLX_FS_FORMATS_PICKLE_EMIT_H

/*
 * A pickle writer for values the inert pickle VM (resolver/codec/pickle.h)
 * decoded: protocol 2 opcodes as Python's pickler writes them for torch.save,
 * without memo opcodes, so that an object read from a checkpoint (Megatron's
 * argparse.Namespace) is written again, nothing of it executed.  Into a
 * growable buffer; fragments, never a whole pickle (no PROTO, no STOP): the
 * caller frames them.  The opcodes of generated files, written into a
 * window rather than a buffer, are pickle_internal.h's; both encode ints
 * with flx_pk_int_enc().
 *
 * Thread-safety: a buffer belongs to one thread.
 */

#include "error.h"
#include "pickle.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct flx_pk_buf {
	unsigned char *p; /* owned; free() */
	size_t n, cap;
	int err; /* first failure (-ENOMEM), sticky; 0 */
} flx_pk_buf;

void flx_pkb_raw(flx_pk_buf *b, const void *s, size_t n);
void flx_pkb_int(flx_pk_buf *b, int64_t v);		  /* K, M, J or LONG1 */
void flx_pkb_str(flx_pk_buf *b, const char *s, size_t n); /* BINUNICODE */
void flx_pkb_float(flx_pk_buf *b, double v);		  /* BINFLOAT */

/* A value to put under a key of an object's state dict. */
typedef struct flx_pk_patch {
	const char *key;
	enum { FLX_PK_INT, FLX_PK_NONE, FLX_PK_STR, FLX_PK_FALSE } kind;
	int64_t i;
	const char *s;
	bool if_present; /* only replace: never appended */
} flx_pk_patch;

/**
 * Append the opcodes that rebuild v.  When v is an object (REDUCE or
 * NEWOBJ) whose state is a dict, each key of patch takes the patch's value
 * (in its place; a key the state lacks is appended, in patch order, unless
 * the patch is if_present), as setattr() on it would.  Shared nodes are written
 * again where they recur; depth and the nodes visited are bounded.
 * @return 0, or -EINVAL with err naming what cannot be written (an int
 *         wider than 64 bits, a persistent id, a name with a newline, a
 *         tree too deep or too large), or -ENOMEM.
 */
int flx_pk_emit(flx_pk_buf *b, const flx_pv *v, const flx_pk_patch *patch,
		size_t npatch, const char *name, flx_error *err);

#endif
