/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_PICKLE_H
#define FLX_RESOLVER_PICKLE_H

/*
 * A restricted pickle decoder.  No C library reads Python pickles, and the
 * ones torch writes must be read without executing anything, so this is a
 * small stack machine over protocols 2-5 whose GLOBAL/STACK_GLOBAL push an
 * inert class reference, REDUCE/NEWOBJ build an inert object node
 * (class + args) and BUILD attaches the state to that node.  Callers then
 * interpret the resulting tree (see dcp.c, torchpkl.c).
 *
 * The memo holds values, not re-decodable positions, so repeated references
 * share one node: the result is a DAG (a hostile pickle can even make a
 * cycle through SETITEM/APPEND on a memoized container).  Every walker over
 * the tree must bound its depth (FLX_PV_MAX_WALK_DEPTH) and, since shared
 * nodes multiply paths, the total number of nodes it visits.
 *
 * Values that cannot change (None, True, False, ints, tuples of up to 16
 * items) may share one node even where the pickle made them separately:
 * torch writes the same torch.Size tuples for every chunk.  A walk sees
 * the same tree either way, but node addresses say nothing about identity
 * in the pickle: compare values.  Lists, dicts, sets and objects are shared
 * only through the memo, as in Python.
 *
 * Everything is bounded: input length, stack depth, memo size, node count,
 * integer widths.  All nodes, strings and arrays live in one arena, owned
 * by flx_pickle and freed at once; none points into the input.  A large
 * tree takes 2 MiB blocks, prefaulted and offered to transparent huge
 * pages, so its memory rounds up to 2 MiB.
 *
 * Input comes from a buffer (flx_pickle_load) or from any flx_reader
 * (flx_pickle_load_reader).  A reader is read forward through a window of
 * limits.window bytes (more only to hold a longer text argument), so
 * memory does not grow with the input: a Paddle .distcp holds multi-GB
 * arrays as bytes payloads inside the pickle.  Such a load copies a bytes
 * payload only up to limits.max_copy bytes and a str payload up to
 * limits.max_str bytes; a longer one becomes a node with u.str.s == NULL
 * that records where its bytes lie (u.str.off, u.str.len), so that a
 * caller reads them in place.  A buffer load copies every payload,
 * whatever its size.
 */

#include "error.h"
#include "reader.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FLX_PV_MAX_WALK_DEPTH 64

/* u.str.off of a STR decoded from a text opcode (STRING, UNICODE, PERSID,
 * protocol 0-1): its bytes appear nowhere in the input as they are. */
#define FLX_PV_NO_OFFSET UINT64_MAX

typedef enum flx_pv_kind {
	FLX_PV_NONE,
	FLX_PV_BOOL,
	FLX_PV_INT,    /* fits int64 */
	FLX_PV_BIGINT, /* LONG1/LONG4 wider than 64 bits: value not kept */
	FLX_PV_FLOAT,
	FLX_PV_STR, /* unicode, UTF-8 bytes as found */
	FLX_PV_BYTES,
	FLX_PV_TUPLE,
	FLX_PV_LIST,
	FLX_PV_SET, /* set and frozenset */
	FLX_PV_DICT,
	FLX_PV_GLOBAL, /* class/function reference (module, name) */
	FLX_PV_OBJ,    /* result of REDUCE or NEWOBJ/NEWOBJ_EX */
	FLX_PV_PERSID, /* BINPERSID/PERSID: persistent id */
} flx_pv_kind;

typedef struct flx_pv flx_pv;

struct flx_pv {
	flx_pv_kind kind;
	/* OBJ: made by NEWOBJ/NEWOBJ_EX (true) or REDUCE (false); false for
	 * every other kind.  Kept here, beside kind, rather than in u.obj, so
	 * that a node takes 32 bytes: a DCP .metadata decodes into several
	 * nodes per chunk. */
	bool newobj;
	bool shared_ : 1; /* internal (OBJ): one node for equal torch.Size
			   * values; callers ignore */
	bool reref_ : 1;  /* internal (DICT, LIST): named again through the
			   * memo or DUP; callers ignore */
	bool sunk_ : 1;	  /* internal (LIST): see flx_pv_streamed() */
	bool taken_ : 1;  /* internal: reachable from a value a sink took;
			   * callers ignore */
	union {
		bool b;
		int64_t i;
		double f;
		struct {
			/* NUL-terminated copy (may hold NULs), or NULL where a
			 * reader load left a long payload in the input */
			const char *s;
			size_t len;   /* payload bytes */
			uint64_t off; /* input offset of the payload's first
				       * byte, or FLX_PV_NO_OFFSET */
		} str;		      /* STR and BYTES */
		struct {
			flx_pv **v;
			size_t n;
			size_t cap_; /* internal: room in v; callers ignore */
		} seq;		     /* TUPLE, LIST, SET */
		struct {
			flx_pv **kv; /* kv[2*i] = key, kv[2*i+1] = value */
			size_t n;    /* number of pairs, in insertion order */
			size_t cap_; /* internal: room in kv, in pairs */
		} dict;
		struct {
			const char *module;
			const char *name;
		} global;
		struct {
			flx_pv *cls;  /* the callable (usually FLX_PV_GLOBAL) */
			flx_pv *args; /* TUPLE (NEWOBJ/REDUCE argument) */
			flx_pv *state; /* BUILD argument, NULL if none */
		} obj;		       /* newobj: see above */
		struct {
			flx_pv *pid;
		} persid;
	} u;
};

/* Limits; 0 selects the default.  Nodes, stack and memo are further capped
 * at the input length + 1, which no legitimate pickle exceeds.  The last
 * three apply to reader loads only.  A sink load (flx_pickle_load_sink())
 * bounds what it holds: the values of the batches a sink took are given
 * back from max_nodes, and max_memo bounds the memo slots held, not the
 * indices (up to the input length), unless set by the caller. */
typedef struct flx_pickle_limits {
	size_t max_nodes; /* values created, shared or not; default 1<<25 */
	size_t max_stack; /* values on the stack incl. marks; default 1<<20 */
	size_t max_depth; /* MARK nesting; default 1024 */
	size_t max_memo;  /* memo slots; default 1<<25 */
	size_t window;	  /* most bytes read ahead at a time; default
			   * 256 KiB (4 KiB after a payload passed over,
			   * doubling with each read) */
	size_t max_copy;  /* longest bytes payload copied; default 4 KiB */
	size_t max_str;	  /* longest str payload copied, and longest text
			   * argument (protocol 0-1 line); default 1 MiB */
} flx_pickle_limits;

typedef struct flx_pickle flx_pickle;
typedef struct flx_pickle_sink flx_pickle_sink;

/**
 * Decode one pickle from buf[0..len).  Stops at the first STOP; bytes after
 * it are ignored.  name names the input in error messages (e.g. the file).
 * Special cases, for the objects torch pickles: REDUCE or NEWOBJ of
 * collections.OrderedDict with empty args yields an empty FLX_PV_DICT (so
 * later SETITEMS fill it); REDUCE of torch.Size over equal arguments
 * yields one shared node (torch.Size is an immutable tuple: BUILD on it
 * fails, as in Python).  Nothing else is interpreted.
 * Every payload is copied and the tree keeps no pointer into buf: buf may
 * be freed as soon as this returns.  Reentrant; buf is only read.
 * @return 0 and *out (owned by caller, release with flx_pickle_free()), or
 *         -EINVAL (malformed/unsupported input; err says offset and opcode)
 *         or -ENOMEM.  *out untouched on failure.
 */
int flx_pickle_load(const void *buf, size_t len, const char *name,
		    const flx_pickle_limits *lim, flx_pickle **out,
		    flx_error *err);

/**
 * Decode one pickle from the window of r, as flx_pickle_load() does, reading
 * it forward, at most lim->window bytes ahead: apart from the tree, memory
 * does not depend on r->size.  A bytes payload longer than lim->max_copy,
 * or a str payload longer than lim->max_str, is passed over (read only as
 * far as the read-ahead went): its node has u.str.s == NULL and says where
 * the payload lies in r's window (u.str.off + u.str.len <= r->size,
 * checked).  A text argument longer than lim->max_str is refused, and so
 * is a STACK_GLOBAL of a str not copied.  Otherwise the tree is the one
 * flx_pickle_load() makes of the same bytes, and so are the error
 * messages.  r is used only during the call, by the calling thread; the
 * tree keeps nothing of it.
 * @return as flx_pickle_load(), or the reader's -errno (-EIO) when a read
 *         fails (err says where).
 */
int flx_pickle_load_reader(const flx_reader *r, const char *name,
			   const flx_pickle_limits *lim, flx_pickle **out,
			   flx_error *err);

/* A consumer of one dict's pairs while they are decoded (see
 * flx_pickle_load_sink()). */
struct flx_pickle_sink {
	/* the dict stored under this str key (as the key of an enclosing
	 * dict's pair) */
	const char *key;
	/* Called, on the loading thread, with each batch of pairs that a
	 * SETITEMS adds to that dict, in order (and, as a batch of one, a
	 * pair a lone SETITEM adds outside any batch: Python's pickler ends
	 * a dict one pair past a multiple of its batch size so): kv[2*i] is a
	 * key, kv[2*i+1] its value, both borrowed for the call only (their
	 * nodes are reused once it returns: copy what is kept).  The pairs are
	 * then not added to the dict.
	 * @return 0; -EAGAIN to decline (the load fails with -EAGAIN);
	 *         another -errno fails the load with it */
	int (*pairs)(void *ctx, flx_pv *const *kv, size_t npairs);
	void *ctx;
	/* and the lists stored under this str key (NULL: none): items() is
	 * called, as pairs() is, with each batch of items that an APPENDS
	 * adds to one of them (and an item a lone APPEND adds to one after
	 * its first batch), and list says which (borrowed, valid as long
	 * as the tree) */
	const char *list_key;
	int (*items)(void *ctx, const flx_pv *list, flx_pv *const *v, size_t n);
	/* and, to items() as well, the lists that are the values of the dict
	 * stored under this str key (NULL: none), whatever their own keys
	 * (a dict of str -> list, as Paddle's state_dict_metadata) */
	const char *list_parent;
	/* and, without taking them, the pairs of the dict stored under this
	 * str key (NULL: none; found as the sink dict is, and not one of
	 * the sink's own): watch() is called with each batch of pairs that a
	 * SETITEMS or SETITEM adds to it, before they are added, as pairs()
	 * is but with the pairs valid as long as the tree; its result as
	 * pairs()'s */
	const char *watch_key;
	int (*watch)(void *ctx, flx_pv *const *kv, size_t npairs);
	/* and the value stored under this str key (NULL: none) in the
	 * outermost dict being filled (the dict below the first MARK on the
	 * stack, such as the state of the root object), when that value is a
	 * list or dict filled by MARK ... APPENDS/SETITEMS batches: decoded
	 * and checked, then dropped (see flx_pickle_load_sink()).  It should
	 * name none of the keys above. */
	const char *drop_key;
};

/**
 * flx_pickle_load_reader(), streaming one dict: the pairs added to the
 * dict found under sink->key (the first empty dict stored under that key
 * with a MARK pushed right above it) go to sink->pairs() instead of the
 * tree, and the memory their values took is reused.  That dict stays in
 * the tree, without those pairs; flx_pickle_sink_dict() says which it is.
 * A string memoized in a batch and named again after it is a node of its
 * own (its u.str.off its own, as in a plain load) whose u.str.s may be
 * that of an equal string kept from an earlier batch (strings are
 * immutable).
 * The same for the items of the lists under sink->list_key, if set, and of
 * the lists that are values of a dict under sink->list_parent, if set.
 * A later reference to a value the sink took (through the memo, to a
 * container, tuple or object; strings, numbers and class references stay
 * valid), or to the sink dict or a list streamed, fails the load with
 * -EAGAIN, as does an opcode that changes (adds to, BUILDs) a value the
 * sink took or one it reaches, and a decline: decode again
 * without a sink (flx_pickle_load_reader()), which reads every pickle
 * this one reads.
 * With sink->drop_key set, the items of each batch added to the value V
 * under that key (the batch's MARK right above V, V right above the key,
 * in the outermost dict being filled) are decoded but not kept: the
 * memory they took is given back at each batch's end (APPENDS, SETITEMS)
 * at every nesting level inside, as the sink's batches are, under the
 * same limits.  Inside such a batch, a reference to a value the sink
 * took, to the sink dict or a list streamed, or to any list, dict, set
 * or object made before (through the memo or DUP) stands for nothing and
 * fails nothing unless it is used as a container (then -EAGAIN).  The
 * pair (key, V) is then left out of that dict; a later reference to V or
 * to a container made inside its batches, or a use of V other than as
 * that pair, fails the load with -EAGAIN.  Limits and messages otherwise
 * as flx_pickle_load_reader().
 * @return as flx_pickle_load_reader(), or -EAGAIN (err set; a caller that
 *         decodes again should discard it).
 */
int flx_pickle_load_sink(const flx_reader *r, const char *name,
			 const flx_pickle_limits *lim,
			 const flx_pickle_sink *sink, flx_pickle **out,
			 flx_error *err);

/** Whether v is a list whose items (some batches of them, or all) a
 * sink load streamed: the tree holds only what was added otherwise. */
bool flx_pv_streamed(const flx_pv *v);

/** The dict whose pairs a sink load streamed, or NULL (no such dict was
 * found, or p came from another load); borrowed. */
const flx_pv *flx_pickle_sink_dict(const flx_pickle *p);

/** The decoded root value; borrowed, valid until flx_pickle_free(). */
const flx_pv *flx_pickle_root(const flx_pickle *p);

/** Input offset just past the STOP opcode that ended the pickle (where a
 * stream of consecutive pickles continues); 0 for NULL. */
uint64_t flx_pickle_end(const flx_pickle *p);

/** Free everything; NULL is fine. */
void flx_pickle_free(flx_pickle *p);

/* ---- helpers for interpreters (all accept NULL and return NULL/false) ---- */

/** Value stored under string key in a DICT, or NULL (a key that a reader
 * load did not copy matches nothing). */
const flx_pv *flx_pv_dict_get(const flx_pv *dict, const char *key);

/** True if v is a GLOBAL with this name (module ignored when NULL). */
bool flx_pv_is_global(const flx_pv *v, const char *module, const char *name);

/** For an OBJ: its class if it is a GLOBAL, else NULL. */
const flx_pv *flx_pv_obj_class(const flx_pv *v);

/** True if v is an OBJ whose class GLOBAL has this name. */
bool flx_pv_is_obj_of(const flx_pv *v, const char *name);

/** STR contents, or NULL (no STR, or one a reader load did not copy). */
const char *flx_pv_str(const flx_pv *v);

/**
 * Where the payload of a STR or BYTES value lies in the input: *off and
 * *len.  The bytes are v->u.str.s when copied, else input bytes
 * [*off, *off + *len) (BYTES always hold exactly these; a STR holds UTF-8,
 * so a protocol-2 `_codecs.encode(str, 'latin1')` payload must still be
 * decoded).  Either output may be NULL.  False (outputs untouched) for any
 * other value and for a STR decoded from a text opcode.
 */
bool flx_pv_payload(const flx_pv *v, uint64_t *off, size_t *len);

/** INT (or BOOL) value into *out; false if v is no such value. */
bool flx_pv_int(const flx_pv *v, int64_t *out);

/** Element i of a TUPLE or LIST, or NULL. */
const flx_pv *flx_pv_item(const flx_pv *v, size_t i);

/** Length of a TUPLE/LIST/SET, pairs of a DICT, 0 otherwise. */
size_t flx_pv_len(const flx_pv *v);

/** Short name of the kind for messages ("dict", "tuple", ...). */
const char *flx_pv_kind_name(const flx_pv *v);

#endif
