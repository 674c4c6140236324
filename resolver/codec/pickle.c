/* SPDX-License-Identifier: MIT */
#include "pickle.h"
#include "grow.h"

#include <errno.h>
#include <inttypes.h>
#include <locale.h>
#include <stdarg.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/*
 * Design: a loop over opcodes with an explicit value stack and a separate
 * mark stack (like CPython's _pickle.c: values above the innermost mark form
 * the current "frame" and nothing may pop below it).  The input is never
 * trusted: every length is compared with what is left before use, every
 * count is bounded by flx_pickle_limits, and nodes are inert data.
 *
 * Memory decides the speed: a DCP .metadata of 10,000 tensors decodes into
 * millions of values, and first touches of fresh pages cost more than all
 * the opcodes together.  So the tree is kept small:
 *  - nodes, strings and container arrays come from one bump arena (blocks
 *    doubling up to ARENA_MAX_BLOCK, freed all at once); a string's bytes
 *    and a tuple's items sit right behind their node;
 *  - values nothing can change after creation are shared: None, True,
 *    False, ints (through a small cache) and tuples of up to
 *    TUPLE_SHARE_MAX items (hash-consed on their item pointers; not in a
 *    sink's batch, see new_tuple()).  torch writes the same few ints and
 *    torch.Size tuples for every chunk, as distinct objects.  Lists,
 *    dicts, sets and objects are never shared this way: APPEND, SETITEMS
 *    and BUILD change them in place;
 *  - container arrays are filled from the stack at their exact size and
 *    grow geometrically after that, in place when they end the arena.
 * Sharing does not change the limits: max_nodes counts values created,
 * shared or not (held, in a sink load: set_limits()).  The VM's stacks,
 * memo and caches are heap arrays freed after the load.
 *
 * Input goes through a window (struct vm).  A buffer load's window is the
 * buffer itself, so an opcode's argument costs one comparison, as over a
 * plain buffer; a reader load refills its window (refill()) when an
 * opcode, argument or text line runs past the window's end, reads a long
 * copied payload in pieces (chunk()) and passes over one it does not copy
 * without reading it (skip()).  Only the tree grows with the input.
 */

#define DEF_MAX_NODES ((size_t)1 << 25)
#define DEF_MAX_STACK ((size_t)1 << 20)
#define DEF_MAX_DEPTH ((size_t)1024)
#define DEF_MAX_MEMO  ((size_t)1 << 25)
#define DEF_WINDOW    ((size_t)256 << 10)
#define DEF_MAX_COPY  ((size_t)4 << 10)
#define DEF_MAX_STR   ((size_t)1 << 20)
/* Caps on the reader limits, so that window arithmetic cannot overflow. */
#define MAX_WINDOW ((size_t)1 << 30)
#define MAX_LINE   ((size_t)1 << 30)
/* Read-ahead at the start and after a payload passed over; it doubles with
 * each refill up to the window.  Between two large arrays of a .distcp lie
 * a few hundred bytes of opcodes: a whole window read there would be
 * mostly the next array's bytes, read for nothing. */
#define AHEAD_MIN ((size_t)4 << 10)

/* A transparent huge page (x86-64, arm64 with 4 KiB pages); see huge_alloc() */
#define HUGE_SIZE ((size_t)2 << 20)
/* memo slots per chunk: one huge page of pointers */
#define MEMO_CHUNK (HUGE_SIZE / sizeof(flx_pv *))
/* memo chunks kept for reuse once packed (struct vm) */
#define MEMO_SPARE 2
/* memo slots cleared at once (a 4 KiB page); divides MEMO_CHUNK */
#define MEMO_STEP ((size_t)512)

#define ARENA_FIRST_BLOCK ((size_t)16 << 10)
#define ARENA_MAX_BLOCK	  HUGE_SIZE
/* The arena holds pointers, sizes, int64, double and bytes, nothing wider
 * (UBSan checks).  An array behind a node is aligned too: sizeof(flx_pv)
 * is a multiple of its alignment, which covers a pointer's. */
#define ARENA_ALIGN ((size_t)8)
_Static_assert(alignof(flx_pv) <= ARENA_ALIGN, "arena alignment");
/* Nodes are most of a large tree's memory (several per DCP chunk). */
_Static_assert(sizeof(void *) != 8 || sizeof(flx_pv) == 32, "node size");

/* Tuples up to this length are hash-consed; longer ones rarely repeat. */
#define TUPLE_SHARE_MAX 16
/* Int cache slots: at most this many, fewer for small inputs. */
#define INT_CACHE_MAX ((size_t)4096)
/* ints a sink load's batches may share (new_int()) */
#define SIDE_INT_MAX ((int64_t)1 << 24)
#define SIDE_INTS    ((size_t)1 << 16)
/* strings kept past a sink load's batches and shared by content
 * (rewind_batch()): at most this many */
#define KEEP_MAX ((size_t)1 << 16)
/* A memo slot of a sink load holds, for a string kept past its batch that
 * equals one kept before, a word instead of a node (kw_word()): bit 0 set
 * (a node is ARENA_ALIGN-aligned), the id of the string kept before
 * (vm->kstr) in the next KW_ID_BITS bits, the string's input offset above
 * them.  memo_get() makes its node when it is named again.  Python's
 * pickler memoizes a new dtype or key string per chunk: 8 bytes each
 * rather than a 32-byte node. */
#define KW_ID_BITS 16
#define KW_OFF_MAX ((uint64_t)(UINTPTR_MAX >> (KW_ID_BITS + 1)))
_Static_assert(KEEP_MAX <= (size_t)1 << KW_ID_BITS, "kept string id");

struct arena_blk {
	struct arena_blk *next;
	max_align_t data[];
};

struct flx_pickle {
	struct arena_blk *blocks; /* the current block first */
	unsigned char *cur;	  /* free room in the current block: */
	size_t left;		  /* cur[0..left) */
	size_t next_size;	  /* of the next ordinary block, header too */
	flx_pv *root;
	uint64_t end;	   /* input offset just past STOP */
	flx_pv *sink_dict; /* see flx_pickle_sink_dict() */
	/* a sink load's side arena (its own blocks only): the values that
	 * caches share, made while a batch is open (see struct vm) */
	flx_pickle *side;
	/* a block of ARENA_MAX_BLOCK bytes a rewound batch gave back
	 * (rewind_batch()), the next such block arena_block() takes, or NULL */
	struct arena_blk *spare;
};

/* A packed memo chunk (pack_memo()): its live slots' values are
 * pk_v[base ..), in ascending slot order.  Sparse (nidx live slots, at most
 * PACK_SPARSE): the slot at idx[j] is pk_v[base + j].  Dense (nidx is
 * PACK_DENSE): slot i is live when bit i % 64 of bits[i / 64] is set, its
 * value pk_v[base + rank[i / 64] + the live slots below i in its word].
 * A packed chunk holds at most PACK_MAX live slots: with their values, a
 * quarter of the chunk's bytes and a few pages, where a chunk of memo
 * slots takes a huge page; a sparse one takes 4 bytes a live slot, not
 * the bitmap's 48 KiB (a dropped value's logged slots: a few dozen a
 * chunk). */
#define PACK_MAX    (MEMO_CHUNK / 4)
#define PACK_SPARSE 1024
#define PACK_DENSE  UINT32_MAX
/* memo_ref_packed()'s cache: slots (a power of two), and the place of a
 * slot that is not live */
#define PK_CACHE ((size_t)64)
#define PK_DEAD	 SIZE_MAX
struct pk_chunk {
	size_t base;
	uint32_t nidx;
	uint64_t *bits; /* dense: MEMO_CHUNK / 64 words, then rank */
	uint32_t *rank;
	uint32_t idx[]; /* sparse: the live slots, ascending */
};
_Static_assert(PACK_MAX <= UINT32_MAX, "pk_chunk rank");

/* The kinds of value that hold others (bits 1 << kind). */
#define HOLDS_OTHERS                                                           \
	((1u << FLX_PV_TUPLE) | (1u << FLX_PV_LIST) | (1u << FLX_PV_SET) |     \
	 (1u << FLX_PV_DICT) | (1u << FLX_PV_OBJ) | (1u << FLX_PV_PERSID))

/* No hold on the window (see struct vm). */
#define NO_HOLD SIZE_MAX

struct vm {
	/* Input bytes [base, base + wlen) are buf[0..wlen); the next byte is
	 * buf[pos].  A buffer load's window is the whole input (base 0,
	 * wlen == len), so its every need is met without a refill; a reader
	 * load's window is wbuf, refilled as the VM advances. */
	const unsigned char *buf;
	size_t pos, wlen;
	uint64_t base;
	uint64_t len;	     /* of the input */
	const flx_reader *r; /* NULL: a buffer load */
	unsigned char *wbuf;
	size_t wcap;
	size_t hold;	 /* window index a refill keeps (two-line GLOBAL), or
			  * NO_HOLD: only the bytes from pos on are kept */
	size_t window;	 /* most bytes read ahead at a refill */
	size_t ahead;	 /* bytes read ahead at the next refill */
	size_t max_copy; /* longest BYTES payload copied */
	size_t max_str;	 /* longest STR payload copied */
	size_t max_line; /* longest text argument */
	uint64_t op_off; /* offset of the opcode being run, for messages */
	unsigned char op;
	const char *name;
	flx_error *err;
	flx_pickle *p;
	size_t max_nodes, max_stack, max_depth, max_memo;
	/* values held (a sink load gives back those of the batches the sink
	 * took, rewind_batch()); memo slots held in a sink load: slots of
	 * allocated chunks and packed ones, at most max_held */
	size_t nodes, max_held, memo_chunks;
	int rc; /* first failure, also when err is NULL */

	flx_pv **stack;
	size_t sp, stack_cap;
	size_t *marks; /* stack heights at each open MARK */
	size_t nmarks, marks_cap;
	size_t fence; /* marks[nmarks - 1], 0 without a mark (fence()) */
	/* push() needs no check below this height: the smaller of stack_cap
	 * and max_stack - nmarks (set_fence()) */
	size_t push_lim;
	/* memo chunks of MEMO_CHUNK slots but chunk 0 (memo0_cap slots);
	 * slots [0, memo_len) exist and are set or NULL */
	flx_pv ***memo;
	size_t memo0_cap, memo_len, memo_count;
	/* chunks pack_memo() freed, kept for the next ones memo_extend()
	 * makes: memory already touched, where a fresh huge block would be
	 * faulted in and zeroed again */
	flx_pv **memo_spare[MEMO_SPARE];
	size_t nspare;
	locale_t cloc; /* "C" numeric locale for FLOAT, created on demand */

	/* shared immutable values (see the design note) */
	flx_pv *none, *bools[2], *empty_tuple;
	/* GLOBALs known not to be OrderedDict, the latest first (DCP's
	 * storage_data makes objects of two classes in turn) */
	flx_pv *not_odict[2];
	flx_pv **ints; /* direct-mapped cache, ints_mask + 1 slots */
	size_t ints_mask;
	flx_pv *size_cls; /* a GLOBAL known to be torch.Size */
	flx_pv **sizes;	  /* shared torch.Size objects, by args */
	size_t sizes_n;
	unsigned sizes_bits;
	flx_pv **tuples; /* open addressing, 1 << tuples_bits slots */
	size_t tuples_n;
	unsigned tuples_bits;

	/* A sink load (see flx_pickle_load_sink()).  A batch is the span
	 * from a MARK right above the sink dict (or a sink list) to the
	 * SETITEMS (APPENDS) closing it; the values made in between are
	 * young: they lie in the arena from y_cur on.  The caches take no
	 * young value (what they share is made in p->side instead), so once
	 * the sink has the batch, only the memo can still point at young
	 * values (ylog: the memo indices written in the batch), unless an
	 * older container was changed (young_dirty); then the arena is
	 * wound back to y_cur (rewind_batch()). */
	const flx_pickle_sink *sink;
	flx_pv *sink_dict;
	flx_pv *watch_dict;   /* see flx_pickle_sink.watch */
	flx_pv *batch_target; /* the sink dict or a sink list */
	bool young, young_dirty;
	/* a value that holds others (HOLDS_OTHERS) was named again
	 * (push_again()) while the batch was open */
	bool y_holder;
	bool to_side;	     /* alloc_node() takes from p->side */
	size_t side_ints;    /* ints made in p->side */
	size_t young_nmarks; /* nmarks while the batch's mark is open */
	struct arena_blk *y_blk, *y_next;
	unsigned char *y_cur;
	size_t y_left;	/* room of y_blk from y_cur on */
	size_t y_size;	/* p->next_size when the batch opened */
	size_t y_nodes; /* nodes when the batch opened */
	size_t y_side;	/* values the batch made in p->side */
	size_t *ylog;
	size_t nylog, ylog_cap;
	/* mark_taken()'s walk */
	flx_pv **tk;
	size_t tk_cap;
	/* The strings batches kept (rewind_batch()): kstr[id], id below
	 * keeps_n; by content, keeps: open addressing, 1 << keeps_bits
	 * slots, each an id + 1 or 0 (free) */
	flx_pv **kstr;
	size_t kstr_cap;
	uint32_t *keeps;
	size_t keeps_n;
	unsigned keeps_bits;
	/* rewind_batch(): the memo slots whose values it copied, once each */
	flx_pv ***mv;
	size_t mv_cap;
	/* memo chunks packed once a sink load has passed them (pack_memo()):
	 * packed[c] set, memo[c] freed, its live slots' values in pk_v
	 * (ascending indices), found through packed[c]'s bitmap */
	struct pk_chunk **packed;
	size_t memo_scan; /* the next chunk pack_memo() looks at */
	flx_pv **pk_v;
	size_t npk, cap_v;
	/* packed slots found before (memo_ref_packed()), direct-mapped by
	 * index: key idx + 1 (0: empty), pos its value's place in pk_v or
	 * PK_DEAD; a packed chunk never changes which slots are live, nor
	 * where their values lie in pk_v */
	struct {
		size_t key, pos;
	} pkc[PK_CACHE];

	/* The value dropped (sink->drop_key, see drop_mark()): drop_v, the
	 * list or dict under the key, at stack[drop_vi], until the pair goes
	 * into drop_d (drop_taken).  While a batch of it is open, every
	 * MARK opens a level (dl[0] is the batch's own): the arena, nodes,
	 * side values and memo log when it opened, so that the values its
	 * APPENDS or SETITEMS adds are given back (drop_close()).  The batch
	 * is young throughout (the caches take none of its values);
	 * drop_nmarks is nmarks with the batch's mark, 0 when none is open;
	 * drop_ph: a reference stood for nothing (nothing_pv) in it. */
	flx_pv *drop_v, *drop_d;
	size_t drop_vi, drop_nmarks;
	bool drop_taken, drop_ph;
	struct drop_lvl {
		struct arena_blk *blk, *next;
		unsigned char *cur;
		size_t left, size, nodes, side, nylog;
	} * dl;
	size_t ndl, dl_cap;
};

/* Memo slots of values a rewound batch held: referring to one again makes
 * the load fail with -EAGAIN (decode again without a sink).  Never
 * written; only its address is used. */
static flx_pv consumed;

/* What a reference inside a dropped value's batch pushes instead of a
 * value the sink took or a container (push_again()): a None, never
 * written (only a DICT, LIST or OBJ node is). */
static flx_pv nothing_pv = {.kind = FLX_PV_NONE};

/* ---------------------------------------------------------------- opcodes */

enum {
	OP_MARK = '(',
	OP_STOP = '.',
	OP_POP = '0',
	OP_POP_MARK = '1',
	OP_DUP = '2',
	OP_FLOAT = 'F',
	OP_INT = 'I',
	OP_BININT = 'J',
	OP_BININT1 = 'K',
	OP_LONG = 'L',
	OP_BININT2 = 'M',
	OP_NONE = 'N',
	OP_PERSID = 'P',
	OP_BINPERSID = 'Q',
	OP_REDUCE = 'R',
	OP_STRING = 'S',
	OP_BINSTRING = 'T',
	OP_SHORT_BINSTRING = 'U',
	OP_UNICODE = 'V',
	OP_BINUNICODE = 'X',
	OP_APPEND = 'a',
	OP_BUILD = 'b',
	OP_GLOBAL = 'c',
	OP_DICT = 'd',
	OP_EMPTY_DICT = '}',
	OP_APPENDS = 'e',
	OP_GET = 'g',
	OP_BINGET = 'h',
	OP_INST = 'i',
	OP_LONG_BINGET = 'j',
	OP_LIST = 'l',
	OP_EMPTY_LIST = ']',
	OP_OBJ = 'o',
	OP_PUT = 'p',
	OP_BINPUT = 'q',
	OP_LONG_BINPUT = 'r',
	OP_SETITEM = 's',
	OP_TUPLE = 't',
	OP_EMPTY_TUPLE = ')',
	OP_SETITEMS = 'u',
	OP_BINFLOAT = 'G',
	OP_BINBYTES = 'B',
	OP_SHORT_BINBYTES = 'C',
	OP_PROTO = 0x80,
	OP_NEWOBJ = 0x81,
	OP_EXT1 = 0x82,
	OP_EXT2 = 0x83,
	OP_EXT4 = 0x84,
	OP_TUPLE1 = 0x85,
	OP_TUPLE2 = 0x86,
	OP_TUPLE3 = 0x87,
	OP_NEWTRUE = 0x88,
	OP_NEWFALSE = 0x89,
	OP_LONG1 = 0x8a,
	OP_LONG4 = 0x8b,
	OP_SHORT_BINUNICODE = 0x8c,
	OP_BINUNICODE8 = 0x8d,
	OP_BINBYTES8 = 0x8e,
	OP_EMPTY_SET = 0x8f,
	OP_ADDITEMS = 0x90,
	OP_FROZENSET = 0x91,
	OP_NEWOBJ_EX = 0x92,
	OP_STACK_GLOBAL = 0x93,
	OP_MEMOIZE = 0x94,
	OP_FRAME = 0x95,
	OP_BYTEARRAY8 = 0x96,
	OP_NEXT_BUFFER = 0x97,
	OP_READONLY_BUFFER = 0x98,
};

static const char *const op_names[256] = {
    [OP_MARK] = "MARK",
    [OP_STOP] = "STOP",
    [OP_POP] = "POP",
    [OP_POP_MARK] = "POP_MARK",
    [OP_DUP] = "DUP",
    [OP_FLOAT] = "FLOAT",
    [OP_INT] = "INT",
    [OP_BININT] = "BININT",
    [OP_BININT1] = "BININT1",
    [OP_LONG] = "LONG",
    [OP_BININT2] = "BININT2",
    [OP_NONE] = "NONE",
    [OP_PERSID] = "PERSID",
    [OP_BINPERSID] = "BINPERSID",
    [OP_REDUCE] = "REDUCE",
    [OP_STRING] = "STRING",
    [OP_BINSTRING] = "BINSTRING",
    [OP_SHORT_BINSTRING] = "SHORT_BINSTRING",
    [OP_UNICODE] = "UNICODE",
    [OP_BINUNICODE] = "BINUNICODE",
    [OP_APPEND] = "APPEND",
    [OP_BUILD] = "BUILD",
    [OP_GLOBAL] = "GLOBAL",
    [OP_DICT] = "DICT",
    [OP_EMPTY_DICT] = "EMPTY_DICT",
    [OP_APPENDS] = "APPENDS",
    [OP_GET] = "GET",
    [OP_BINGET] = "BINGET",
    [OP_INST] = "INST",
    [OP_LONG_BINGET] = "LONG_BINGET",
    [OP_LIST] = "LIST",
    [OP_EMPTY_LIST] = "EMPTY_LIST",
    [OP_OBJ] = "OBJ",
    [OP_PUT] = "PUT",
    [OP_BINPUT] = "BINPUT",
    [OP_LONG_BINPUT] = "LONG_BINPUT",
    [OP_SETITEM] = "SETITEM",
    [OP_TUPLE] = "TUPLE",
    [OP_EMPTY_TUPLE] = "EMPTY_TUPLE",
    [OP_SETITEMS] = "SETITEMS",
    [OP_BINFLOAT] = "BINFLOAT",
    [OP_BINBYTES] = "BINBYTES",
    [OP_SHORT_BINBYTES] = "SHORT_BINBYTES",
    [OP_PROTO] = "PROTO",
    [OP_NEWOBJ] = "NEWOBJ",
    [OP_EXT1] = "EXT1",
    [OP_EXT2] = "EXT2",
    [OP_EXT4] = "EXT4",
    [OP_TUPLE1] = "TUPLE1",
    [OP_TUPLE2] = "TUPLE2",
    [OP_TUPLE3] = "TUPLE3",
    [OP_NEWTRUE] = "NEWTRUE",
    [OP_NEWFALSE] = "NEWFALSE",
    [OP_LONG1] = "LONG1",
    [OP_LONG4] = "LONG4",
    [OP_SHORT_BINUNICODE] = "SHORT_BINUNICODE",
    [OP_BINUNICODE8] = "BINUNICODE8",
    [OP_BINBYTES8] = "BINBYTES8",
    [OP_EMPTY_SET] = "EMPTY_SET",
    [OP_ADDITEMS] = "ADDITEMS",
    [OP_FROZENSET] = "FROZENSET",
    [OP_NEWOBJ_EX] = "NEWOBJ_EX",
    [OP_STACK_GLOBAL] = "STACK_GLOBAL",
    [OP_MEMOIZE] = "MEMOIZE",
    [OP_FRAME] = "FRAME",
    [OP_BYTEARRAY8] = "BYTEARRAY8",
    [OP_NEXT_BUFFER] = "NEXT_BUFFER",
    [OP_READONLY_BUFFER] = "READONLY_BUFFER",
};

static const char *op_name(unsigned char op)
{
	return op_names[op];
}

/* ------------------------------------------------------------------ errors */

static int vm_fail(struct vm *vm, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int vm_fail(struct vm *vm, int code, const char *fmt, ...)
{
	char why[160];
	const char *on = op_name(vm->op);
	va_list ap;

	/* a reference in a dropped batch stood for nothing: only a decode
	 * without a sink can tell whether the pickle is malformed */
	if (code == -EINVAL && vm->drop_ph)
		code = -EAGAIN;
	if (!vm->rc)
		vm->rc = code;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (on)
		return flx_error_set(vm->err, code, vm->name, NULL,
				     "pickle: offset %" PRIu64
				     ": %s (opcode %s)",
				     vm->op_off, why, on);
	return flx_error_set(vm->err, code, vm->name, NULL,
			     "pickle: offset %" PRIu64 ": %s", vm->op_off, why);
}

static int vm_nomem(struct vm *vm)
{
	return vm_fail(vm, -ENOMEM, "out of memory");
}

/* ------------------------------------------------------------------- arena */

static size_t round_up(size_t n)
{
	return (n + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1);
}

/* A 2 MiB block (arena, memo chunk), aligned to its size.  Page faults, not
 * opcodes, are most of the time a large load takes, so the block is offered
 * to transparent huge pages (one fault instead of 512) and prefaulted in one
 * call where THP is off: the arena fills it front to back, and memo slots
 * are numbered densely (docs/performance.md has the figures).  Either
 * advice is a hint; without it the block is ordinary memory. */
static void *huge_alloc(void)
{
	void *b = NULL;

	if (posix_memalign(&b, HUGE_SIZE, HUGE_SIZE))
		return NULL;
#ifdef MADV_HUGEPAGE
	(void)madvise(b, HUGE_SIZE, MADV_HUGEPAGE);
#endif
#ifdef MADV_POPULATE_WRITE
	(void)madvise(b, HUGE_SIZE, MADV_POPULATE_WRITE);
#endif
	return b;
}

static void *arena_block(flx_pickle *p, size_t n)
{
	size_t size = p->next_size;
	size_t cap = size - sizeof(struct arena_blk);
	struct arena_blk *b;

	if (n > cap / 4) {
		/* A dedicated block for a big string or array; it goes
		 * behind the current block, whose free room stays usable. */
		if (n > SIZE_MAX - sizeof(*b) || !(b = malloc(sizeof(*b) + n)))
			return NULL;
		if (p->blocks) {
			b->next = p->blocks->next;
			p->blocks->next = b;
		} else {
			b->next = NULL;
			p->blocks = b;
		}
		return b->data;
	}
	if (size == ARENA_MAX_BLOCK && p->spare) {
		b = p->spare;
		p->spare = NULL;
	} else {
		b = size == ARENA_MAX_BLOCK ? huge_alloc() : malloc(size);
	}
	if (!b)
		return NULL;
	b->next = p->blocks;
	p->blocks = b;
	p->cur = (unsigned char *)b->data + n;
	p->left = cap - n;
	p->next_size = size < ARENA_MAX_BLOCK ? 2 * size : size;
	return b->data;
}

/* n > 0 bytes, aligned to ARENA_ALIGN, valid until flx_pickle_free().
 * Inline: every node takes one. */
static inline __attribute__((always_inline)) void *arena_alloc(flx_pickle *p,
							       size_t n)
{
	void *r;

	if (n > SIZE_MAX / 2)
		return NULL;
	n = round_up(n);
	if (n > p->left)
		return arena_block(p, n);
	r = p->cur;
	p->cur += n;
	p->left -= n;
	return r;
}

/* Grow the allocation a from old to new bytes where it is the last one in
 * the current block and the block has the room.  False: allocate anew. */
static bool arena_extend(flx_pickle *p, void *a, size_t old, size_t new)
{
	old = round_up(old);
	new = round_up(new);
	if ((unsigned char *)a + old != p->cur || new - old > p->left)
		return false;
	p->cur += new - old;
	p->left -= new - old;
	return true;
}

/* Whether the open batch's values lie in y_blk from y_cur on and, if it
 * moved on to one new ordinary block (*nb, else NULL), in that block:
 * no other block was made since the batch opened (a dedicated one goes
 * right behind the current block).  y_blk is a block of the arena's
 * chain (a rewind keeps the block it winds back to). */
static bool batch_span(const struct vm *vm, struct arena_blk **nb)
{
	const flx_pickle *p = vm->p;

	if (!p->blocks || !vm->y_blk || vm->y_blk->next != vm->y_next)
		return false;
	if (p->blocks == vm->y_blk)
		*nb = NULL;
	else if (p->blocks->next == vm->y_blk)
		*nb = p->blocks;
	else
		return false;
	return true;
}

/* Whether v was made in the open batch: exact while batch_span() holds
 * (the batch can be wound back only then, see rewind_batch()); otherwise
 * an address comparison. */
static inline __attribute__((always_inline)) bool is_young(const struct vm *vm,
							   const void *v)
{
	const unsigned char *a = v;
	struct arena_blk *nb = NULL;

	/* the batch's block is still the current one: the last line below,
	 * whatever batch_span() says */
	if (vm->p->blocks == vm->y_blk)
		return a >= vm->y_cur && a < vm->p->cur;
	if (!vm->ndl && batch_span(vm, &nb) && nb)
		return (a >= vm->y_cur && a < vm->y_cur + vm->y_left) ||
		       (a >= (const unsigned char *)nb->data && a < vm->p->cur);
	return a >= vm->y_cur && a < vm->p->cur;
}

/* An older container changed in a batch: the batch is not wound back. */
/* Before an opcode changes target (adds to it, or BUILDs it).  A value a
 * sink took (mark_taken()) is what the sink saw: were it changed after, the
 * sink's view and the tree's would differ, so the load declines (-EAGAIN:
 * the caller decodes the tree). */
static int touch_slow(struct vm *vm, const flx_pv *target)
{
	if (target->taken_)
		return vm_fail(vm, -EAGAIN,
			       "changes a value a sink took (a %s)",
			       flx_pv_kind_name(target));
	if (vm->young && !vm->young_dirty && !is_young(vm, target))
		vm->young_dirty = true;
	return 0;
}

static inline __attribute__((always_inline)) int touch(struct vm *vm,
						       const flx_pv *target)
{
	if (!target->taken_ && (!vm->young || vm->young_dirty))
		return 0;
	return touch_slow(vm, target);
}

/* ------------------------------------------------------------------- nodes */

/* Every value an opcode creates counts against max_nodes, also when it
 * turns out to be a shared one: the limit reads the same as without
 * sharing. */
static bool count_value(struct vm *vm)
{
	if (vm->nodes >= vm->max_nodes) {
		vm_fail(vm, -EINVAL, "more than %zu values", vm->max_nodes);
		return false;
	}
	vm->nodes++;
	return true;
}

/* A zeroed node with extra bytes behind it (extra < SIZE_MAX / 4). */
/* p->side, made on first use; NULL when out of memory. */
static flx_pickle *side_arena(struct vm *vm)
{
	if (!vm->p->side && (vm->p->side = calloc(1, sizeof(*vm->p->side))))
		vm->p->side->next_size = ARENA_FIRST_BLOCK;
	return vm->p->side;
}

/* Inline: every value made but a cached one takes one. */
static inline __attribute__((always_inline)) flx_pv *
alloc_node(struct vm *vm, flx_pv_kind kind, size_t extra)
{
	flx_pickle *a = vm->to_side ? side_arena(vm) : vm->p;
	flx_pv *v = a ? arena_alloc(a, sizeof(*v) + extra) : NULL;

	if (!v) {
		vm_nomem(vm);
		return NULL;
	}
	memset(v, 0, sizeof(*v));
	v->kind = kind;
	vm->y_side += vm->to_side && vm->young;
	return v;
}

static flx_pv *new_node(struct vm *vm, flx_pv_kind kind)
{
	return count_value(vm) ? alloc_node(vm, kind, 0) : NULL;
}

/* None, True, False and (): one node each per pickle. */
static flx_pv *new_shared(struct vm *vm, flx_pv **slot, flx_pv_kind kind)
{
	if (!count_value(vm))
		return NULL;
	if (!*slot) {
		vm->to_side = vm->young;
		*slot = alloc_node(vm, kind, 0);
		vm->to_side = false;
	}
	return *slot;
}

static flx_pv *new_bool(struct vm *vm, bool b)
{
	flx_pv *v = new_shared(vm, &vm->bools[b], FLX_PV_BOOL);

	if (v)
		v->u.b = b;
	return v;
}

/* STR/BYTES node with room for a NUL-terminated copy of n bytes, to be
 * filled by the caller; off as in flx_pv. */
static flx_pv *new_str_room(struct vm *vm, flx_pv_kind kind, size_t n,
			    uint64_t off)
{
	flx_pv *v;
	char *d;

	if (n >= SIZE_MAX / 4) {
		vm_nomem(vm);
		return NULL;
	}
	if (!count_value(vm) || !(v = alloc_node(vm, kind, n + 1)))
		return NULL;
	d = (char *)(v + 1);
	d[n] = '\0';
	v->u.str.s = d;
	v->u.str.len = n;
	v->u.str.off = off;
	return v;
}

/* STR/BYTES node holding a NUL-terminated copy of s[0..n). */
static flx_pv *new_str(struct vm *vm, flx_pv_kind kind, const void *s, size_t n,
		       uint64_t off)
{
	flx_pv *v = new_str_room(vm, kind, n, off);

	if (v && n)
		memcpy((char *)(v + 1), s, n);
	return v;
}

/* dst[0..n) = src[0..n): a loop for the one to a few pointers of a
 * tuple or an object's state (no library call), memcpy() beyond. */
static inline __attribute__((always_inline)) void
copy_items(flx_pv **dst, flx_pv *const *src, size_t n)
{
	if (n > 8) {
		memcpy(dst, src, n * sizeof(*src));
		return;
	}
	for (size_t i = 0; i < n; i++)
		dst[i] = src[i];
}

/* Node of kind holding a copy of items[0..n), the array right behind it
 * (n pointers for a sequence, n/2 pairs for a DICT).  Not counted. */
static flx_pv *items_node(struct vm *vm, flx_pv_kind kind, flx_pv *const *items,
			  size_t n)
{
	flx_pv *v;
	flx_pv **arr;

	if (n >= SIZE_MAX / 4 / sizeof(*items)) {
		vm_nomem(vm);
		return NULL;
	}
	v = alloc_node(vm, kind, n * sizeof(*items));
	if (!v || !n)
		return v;
	arr = (flx_pv **)(v + 1);
	copy_items(arr, items, n);
	if (kind == FLX_PV_DICT) {
		v->u.dict.kv = arr;
		v->u.dict.n = n / 2;
		v->u.dict.cap_ = n / 2;
	} else {
		v->u.seq.v = arr;
		v->u.seq.n = n;
		v->u.seq.cap_ = n;
	}
	return v;
}

/* A LIST/SET/DICT made from stack items (never shared: it may change). */
static flx_pv *new_items(struct vm *vm, flx_pv_kind kind, flx_pv *const *items,
			 size_t n)
{
	return count_value(vm) ? items_node(vm, kind, items, n) : NULL;
}

static uint64_t mix(uint64_t h)
{
	return (h ^ (h >> 32)) * 0x9e3779b97f4a7c15u;
}

static size_t tuple_slot(const struct vm *vm, flx_pv *const *items, size_t n)
{
	uint64_t h = n;

	for (size_t i = 0; i < n; i++)
		h = mix(h ^ (uint64_t)(uintptr_t)items[i]);
	return (size_t)(mix(h) >> (64 - vm->tuples_bits));
}

static int tuples_grow(struct vm *vm)
{
	unsigned bits = vm->tuples_bits ? vm->tuples_bits + 1 : 8;
	size_t cap = (size_t)1 << bits, mask = cap - 1;
	flx_pv **old = vm->tuples, **nt = calloc(cap, sizeof(*nt));
	size_t oldcap = vm->tuples ? (size_t)1 << vm->tuples_bits : 0;

	if (!nt)
		return vm_nomem(vm);
	vm->tuples = nt;
	vm->tuples_bits = bits;
	for (size_t i = 0; i < oldcap; i++) {
		flx_pv *t = old[i];
		size_t s;

		if (!t)
			continue;
		s = tuple_slot(vm, t->u.seq.v, t->u.seq.n);
		while (nt[s])
			s = (s + 1) & mask;
		nt[s] = t;
	}
	free(old);
	return 0;
}

static bool same_items(const flx_pv *t, flx_pv *const *items, size_t n)
{
	/* a loop, not memcmp: n is one to a few pointers */
	if (t->u.seq.n != n)
		return false;
	for (size_t i = 0; i < n; i++)
		if (t->u.seq.v[i] != items[i])
			return false;
	return true;
}

/* A TUPLE of items[0..n): the existing node when an equal tuple (same item
 * nodes) was made before.  Tuples are immutable here as in Python, so the
 * sharing is invisible to callers. */
static flx_pv *new_tuple(struct vm *vm, flx_pv *const *items, size_t n)
{
	size_t s, mask;
	flx_pv *t;

	if (n == 0)
		return new_shared(vm, &vm->empty_tuple, FLX_PV_TUPLE);
	if (!count_value(vm))
		return NULL;
	/* never in a sink's batch: a shared tuple outlives the batch, its
	 * memo slot stays live, and a million distinct chunk offsets would
	 * stay with it; a later reference to a tuple of a batch decodes
	 * again as a tree */
	if (n > TUPLE_SHARE_MAX || vm->young)
		return items_node(vm, FLX_PV_TUPLE, items, n);
	/* at most half full, so probes stay short and end at a NULL */
	if (2 * (vm->tuples_n + 1) > ((size_t)1 << vm->tuples_bits) &&
	    tuples_grow(vm))
		return NULL;
	mask = ((size_t)1 << vm->tuples_bits) - 1;
	for (s = tuple_slot(vm, items, n); (t = vm->tuples[s]);
	     s = (s + 1) & mask)
		if (same_items(t, items, n))
			return t;
	t = items_node(vm, FLX_PV_TUPLE, items, n);
	if (t) {
		vm->tuples[s] = t;
		vm->tuples_n++;
	}
	return t;
}

/* Room for more slots behind the used ones in *arr (capacity *cap slots).
 * Filled from the stack at once, an array gets its exact size; later growth
 * doubles, so the arena space left behind stays below the live size. */
static int reserve(struct vm *vm, flx_pv ***arr, size_t used, size_t *cap,
		   size_t more)
{
	size_t ncap;
	flx_pv **na;

	if (more <= *cap - used)
		return 0;
	if (more >= SIZE_MAX / 8 / sizeof(**arr) - used)
		return vm_nomem(vm);
	ncap = used + more;
	if (ncap < 2 * *cap)
		ncap = 2 * *cap;
	if (*cap && arena_extend(vm->p, *arr, *cap * sizeof(**arr),
				 ncap * sizeof(**arr))) {
		*cap = ncap;
		return 0;
	}
	na = arena_alloc(vm->p, ncap * sizeof(*na));
	if (!na)
		return vm_nomem(vm);
	if (used)
		memcpy(na, *arr, used * sizeof(*na));
	*arr = na;
	*cap = ncap;
	return 0;
}

/* Whether the opcode running closed a level of a dropped value's batch
 * (popped its MARK): what it adds is not kept (drop_close()). */
static bool drop_closing(const struct vm *vm)
{
	return vm->ndl && vm->nmarks + 1 < vm->drop_nmarks + vm->ndl;
}

/* LIST/SET: append items[0..n). */
static int seq_add(struct vm *vm, flx_pv *seq, flx_pv *const *items, size_t n)
{
	int rc;

	if (!n || drop_closing(vm))
		return 0;
	if ((rc = touch(vm, seq)))
		return rc;
	rc = reserve(vm, &seq->u.seq.v, seq->u.seq.n, &seq->u.seq.cap_, n);
	if (rc)
		return rc;
	copy_items(seq->u.seq.v + seq->u.seq.n, items, n);
	seq->u.seq.n += n;
	return 0;
}

/* DICT: append the pairs in items[0..2*npairs) (key, value, key, ...). */
static int dict_add(struct vm *vm, flx_pv *d, flx_pv *const *items,
		    size_t npairs)
{
	size_t cap = 2 * d->u.dict.cap_;
	int rc;

	if (!npairs || drop_closing(vm))
		return 0;
	if (vm->drop_v && d == vm->drop_d && !vm->drop_taken) {
		/* the dropped value's pair is left out */
		for (size_t i = 0; i < npairs; i++) {
			if (items[2 * i + 1] != vm->drop_v)
				continue;
			vm->drop_taken = true;
			if ((rc = dict_add(vm, d, items, i)))
				return rc;
			return dict_add(vm, d, items + 2 * i + 2,
					npairs - i - 1);
		}
	}
	if ((rc = touch(vm, d)))
		return rc;
	rc = reserve(vm, &d->u.dict.kv, 2 * d->u.dict.n, &cap, 2 * npairs);
	if (rc)
		return rc;
	d->u.dict.cap_ = cap / 2;
	copy_items(d->u.dict.kv + 2 * d->u.dict.n, items, 2 * npairs);
	d->u.dict.n += npairs;
	return 0;
}

/* ------------------------------------------------------------------ stacks */

/* The stack height at the innermost mark (0 without one): nothing below
 * it may be popped. */
static size_t fence(const struct vm *vm)
{
	return vm->fence;
}

/* After nmarks or stack_cap changed. */
static void set_fence(struct vm *vm)
{
	size_t lim =
	    vm->max_stack > vm->nmarks ? vm->max_stack - vm->nmarks : 0;

	vm->fence = vm->nmarks ? vm->marks[vm->nmarks - 1] : 0;
	vm->push_lim = lim < vm->stack_cap ? lim : vm->stack_cap;
}

static int push_slow(struct vm *vm, flx_pv *v)
{
	if (!v)
		return vm->rc ? vm->rc : -ENOMEM;
	if (vm->sp + vm->nmarks >= vm->max_stack)
		return vm_fail(vm, -EINVAL, "stack deeper than %zu entries",
			       vm->max_stack);
	if (vm->sp == vm->stack_cap) {
		size_t ncap = vm->stack_cap ? vm->stack_cap * 2 : 64;
		flx_pv **ns = realloc(vm->stack, ncap * sizeof(*ns));

		if (!ns)
			return vm_nomem(vm);
		vm->stack = ns;
		vm->stack_cap = ncap;
		set_fence(vm);
	}
	vm->stack[vm->sp++] = v;
	return 0;
}

/* Push v; a NULL v (its making failed) is the load's failure.  Inline
 * while the stack has room. */
static inline __attribute__((always_inline)) int push(struct vm *vm, flx_pv *v)
{
	if (!v || vm->sp >= vm->push_lim)
		return push_slow(vm, v);
	vm->stack[vm->sp++] = v;
	return 0;
}

/* Values at and above the innermost mark only: like CPython, a pop that
 * would cross the mark is a malformed pickle. */
static inline __attribute__((always_inline)) int pop(struct vm *vm,
						     flx_pv **out)
{
	if (vm->sp <= fence(vm))
		return vm_fail(vm, -EINVAL, "stack underflow");
	*out = vm->stack[--vm->sp];
	return 0;
}

static inline __attribute__((always_inline)) int top(struct vm *vm,
						     flx_pv **out)
{
	if (vm->sp <= fence(vm))
		return vm_fail(vm, -EINVAL, "stack underflow");
	*out = vm->stack[vm->sp - 1];
	return 0;
}

/* Close the innermost mark: the items are stack[*start .. vm->sp).  The
 * caller consumes them, then sets vm->sp = *start. */
static int pop_mark(struct vm *vm, size_t *start)
{
	if (!vm->nmarks)
		return vm_fail(vm, -EINVAL, "no MARK on the stack");
	*start = vm->marks[--vm->nmarks];
	set_fence(vm);
	if (vm->nmarks < vm->young_nmarks)
		vm->young = false; /* the batch's mark is gone */
	return 0;
}

static int push_mark(struct vm *vm)
{
	if (vm->nmarks >= vm->max_depth)
		return vm_fail(vm, -EINVAL, "MARK nesting deeper than %zu",
			       vm->max_depth);
	if (vm->sp + vm->nmarks >= vm->max_stack)
		return vm_fail(vm, -EINVAL, "stack deeper than %zu entries",
			       vm->max_stack);
	if (vm->nmarks == vm->marks_cap) {
		size_t ncap = vm->marks_cap ? vm->marks_cap * 2 : 16;
		size_t *nm = realloc(vm->marks, ncap * sizeof(*nm));

		if (!nm)
			return vm_nomem(vm);
		vm->marks = nm;
		vm->marks_cap = ncap;
	}
	vm->marks[vm->nmarks++] = vm->sp;
	set_fence(vm);
	return 0;
}

/* Push v named a second time (memo, DUP).  The sink dict must have one
 * place in the tree, where its caller looks for it: its pairs are in no
 * other, so a second reference to it fails the load with -EAGAIN, and a
 * dict named again is never made the sink dict. */
static int push_again_slow(struct vm *vm, flx_pv *v)
{
	vm->y_holder |= vm->young && ((1u << v->kind) & HOLDS_OTHERS);
	/* in a dropped value's batch: what the sink took, and any
	 * container, which that batch must not change nor hold past it */
	if (vm->ndl && (v == &consumed || v == vm->sink_dict || v->sunk_ ||
			v->kind == FLX_PV_DICT || v->kind == FLX_PV_LIST ||
			v->kind == FLX_PV_SET || v->kind == FLX_PV_OBJ)) {
		vm->drop_ph = true;
		return push(vm, &nothing_pv);
	}
	if (v == vm->sink_dict || v->sunk_)
		return vm_fail(vm, -EAGAIN,
			       "a %s streamed is named a second time",
			       flx_pv_kind_name(v));
	if (v->kind == FLX_PV_DICT || v->kind == FLX_PV_LIST)
		v->reref_ = true;
	return push(vm, v);
}

static inline __attribute__((always_inline)) int push_again(struct vm *vm,
							    flx_pv *v)
{
	if (vm->ndl || v == vm->sink_dict || v->sunk_)
		return push_again_slow(vm, v);
	if ((1u << v->kind) & HOLDS_OTHERS) {
		vm->y_holder |= vm->young;
		if (v->kind == FLX_PV_DICT || v->kind == FLX_PV_LIST)
			v->reref_ = true;
	}
	return push(vm, v);
}

/* -------------------------------------------------------------------- memo */

static flx_pv **memo_slot(const struct vm *vm, size_t idx)
{
	return &vm->memo[idx / MEMO_CHUNK][idx % MEMO_CHUNK];
}

/* Make slots [memo_len, len) exist and clear them.  Slots are cleared only
 * up to the highest one used, never to a chunk's end: a DCP .metadata has
 * a million memo entries, and memory touched for nothing is what costs. */
static int memo_extend(struct vm *vm, size_t len)
{
	/* a page of slots at a time, not one per MEMOIZE */
	len = (len + MEMO_STEP - 1) / MEMO_STEP * MEMO_STEP;
	if (len > vm->max_memo)
		len = vm->max_memo;
	if (!vm->memo) {
		vm->memo =
		    calloc(vm->max_memo / MEMO_CHUNK + 1, sizeof(*vm->memo));
		if (!vm->memo)
			return vm_nomem(vm);
	}
	while (vm->memo_len < len) {
		size_t c = vm->memo_len / MEMO_CHUNK;
		size_t from = vm->memo_len % MEMO_CHUNK;
		size_t to = len - c * MEMO_CHUNK;

		if (to > MEMO_CHUNK)
			to = MEMO_CHUNK;
		if (c == 0 && to > vm->memo0_cap) {
			/* chunk 0 starts small (most pickles are) and
			 * doubles, to a full huge block at the end; a big
			 * input gets that at once */
			size_t ncap = vm->memo0_cap	     ? 2 * vm->memo0_cap
				      : vm->len >= HUGE_SIZE ? MEMO_CHUNK
							     : MEMO_STEP;
			flx_pv **nm;

			if (ncap < to)
				ncap = to;
			if (ncap > vm->max_memo)
				ncap = vm->max_memo;
			if (ncap > MEMO_CHUNK / 4) {
				ncap = MEMO_CHUNK;
				nm = huge_alloc();
				if (nm && vm->memo_len)
					memcpy(nm, vm->memo[0],
					       vm->memo_len * sizeof(*nm));
				if (nm)
					free(vm->memo[0]);
			} else {
				nm = realloc(vm->memo[0], ncap * sizeof(*nm));
			}
			if (!nm)
				return vm_nomem(vm);
			vm->memo[0] = nm;
			vm->memo0_cap = ncap;
		} else if (c > 0 && !vm->memo[c]) {
			if (vm->sink &&
			    (vm->memo_chunks + 2) * MEMO_CHUNK + vm->npk >
				vm->max_held)
				return vm_fail(vm, -EINVAL,
					       "more than %zu memo slots held",
					       vm->max_held);
			vm->memo[c] = vm->nspare ? vm->memo_spare[--vm->nspare]
						 : huge_alloc();
			if (!vm->memo[c])
				return vm_nomem(vm);
			vm->memo_chunks++;
		}
		memset(vm->memo[c] + from, 0, (to - from) * sizeof(**vm->memo));
		vm->memo_len = c * MEMO_CHUNK + to;
	}
	return 0;
}

/* memo_put() in full: a slot to make or a log to grow, or a failure. */
static int memo_put_slow(struct vm *vm, uint64_t idx, flx_pv *v)
{
	flx_pv **slot;
	int rc;

	/* bounded by max_memo, so is the memory a hostile index costs */
	if (idx >= vm->max_memo)
		return vm_fail(vm, -EINVAL,
			       "memo index %" PRIu64
			       " out of range (limit %zu)",
			       idx, vm->max_memo);
	if (idx >= vm->memo_len && (rc = memo_extend(vm, (size_t)idx + 1)))
		return rc;
	if (vm->packed && vm->packed[idx / MEMO_CHUNK])
		return vm_fail(vm, -EAGAIN,
			       "memo index %" PRIu64 " set again after its "
			       "chunk was packed",
			       idx);
	if (vm->young) {
		if (vm->nylog == vm->ylog_cap &&
		    flx_grow((void **)&vm->ylog, &vm->ylog_cap, vm->nylog + 1,
			     sizeof(*vm->ylog)))
			return vm_nomem(vm);
		vm->ylog[vm->nylog++] = (size_t)idx;
	}
	slot = memo_slot(vm, (size_t)idx);
	if (!*slot)
		vm->memo_count++;
	*slot = v;
	return 0;
}

/* Set bits of x (without a library call where the target lacks the
 * instruction). */
static inline unsigned popcount64(uint64_t x)
{
	x -= (x >> 1) & 0x5555555555555555ull;
	x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
	x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
	return (unsigned)((x * 0x0101010101010101ull) >> 56);
}

/* The place in pk_v of slot idx of packed chunk k, or PK_DEAD when the
 * slot is not live. */
static size_t pk_pos(const struct pk_chunk *k, size_t idx)
{
	size_t i = idx % MEMO_CHUNK, w = i / 64;
	uint64_t bit = (uint64_t)1 << (i % 64);

	if (k->nidx != PACK_DENSE) {
		size_t lo = 0, hi = k->nidx;

		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;

			if (k->idx[mid] < i)
				lo = mid + 1;
			else
				hi = mid;
		}
		return lo < k->nidx && k->idx[lo] == i ? k->base + lo : PK_DEAD;
	}
	if (!(k->bits[w] & bit))
		return PK_DEAD;
	return k->base + k->rank[w] + popcount64(k->bits[w] & (bit - 1));
}

/* memo_ref() of a slot in a packed chunk (vm->memo[idx / MEMO_CHUNK] is
 * NULL: pack_memo() freed it).  A DCP .metadata names the same few keys
 * and classes of a packed chunk in every entry of storage_data: they are
 * found in vm->pkc. */
static flx_pv **memo_ref_packed(struct vm *vm, size_t idx)
{
	const struct pk_chunk *k =
	    vm->packed ? vm->packed[idx / MEMO_CHUNK] : NULL;
	size_t h = idx & (PK_CACHE - 1), pos;

	if (vm->pkc[h].key == idx + 1) {
		pos = vm->pkc[h].pos;
	} else {
		if (!k)
			return NULL;
		pos = pk_pos(k, idx);
		vm->pkc[h].key = idx + 1;
		vm->pkc[h].pos = pos;
	}
	return pos == PK_DEAD ? NULL : &vm->pk_v[pos];
}

/* Whether memo value v is a kept string's word (KW_ID_BITS), not a node. */
static bool kw_is(const flx_pv *v)
{
	return (uintptr_t)v & 1;
}

/* The word of a kept string equal to vm->kstr[id], at input offset off
 * (at most KW_OFF_MAX). */
static flx_pv *kw_word(size_t id, uint64_t off)
{
	return (flx_pv *)(((uintptr_t)off << (KW_ID_BITS + 1)) |
			  ((uintptr_t)id << 1) | 1);
}

/* The node of the kept string whose word memo slot *ref holds: made once,
 * in p->side while a batch is open (no rewind gives it back), and stored
 * in the slot; not counted again (its word was).  Its bytes are those of
 * the string kept before.  NULL when out of memory. */
static flx_pv *kw_node(struct vm *vm, flx_pv **ref)
{
	uintptr_t w = (uintptr_t)*ref;
	const flx_pv *k =
	    vm->kstr[(w >> 1) & (((uintptr_t)1 << KW_ID_BITS) - 1)];
	flx_pickle *a = vm->young ? side_arena(vm) : vm->p;
	flx_pv *v = a ? arena_alloc(a, sizeof(*v)) : NULL;

	if (!v)
		return NULL;
	memset(v, 0, sizeof(*v));
	v->kind = k->kind;
	v->u.str.s = k->u.str.s;
	v->u.str.len = k->u.str.len;
	v->u.str.off = (uint64_t)(w >> (KW_ID_BITS + 1));
	*ref = v;
	return v;
}

/* The memo slot idx (below memo_len) as a place to read and write: in its
 * chunk, or, in a packed chunk, the live slot's value in pk_v (valid until
 * pack_memo() grows pk_v); NULL for a packed slot that is not live (it
 * names &consumed).  Constant time: a DCP .metadata's storage_data names,
 * for every entry, the offsets its chunk's batch memoized long before.
 * Every chunk below memo_len is allocated until pack_memo() frees it, so
 * a chunk that is there is not packed: one load and a test on the common
 * path, inlined where the opcodes run. */
static inline __attribute__((always_inline)) flx_pv **memo_ref(struct vm *vm,
							       size_t idx)
{
	flx_pv **m = vm->memo[idx / MEMO_CHUNK];

	if (m)
		return &m[idx % MEMO_CHUNK];
	return memo_ref_packed(vm, idx);
}

/* Set memo slot idx to v (MEMOIZE, PUT, BINPUT): inline where the slot
 * exists in an unpacked chunk and the batch log (if a batch is open) has
 * room; memo_put_slow() checks and does the rest. */
static inline __attribute__((always_inline)) int
memo_put(struct vm *vm, uint64_t idx, flx_pv *v)
{
	flx_pv **m, **slot;

	/* memo_len <= max_memo: idx is in range */
	if (idx >= vm->memo_len || !(m = vm->memo[idx / MEMO_CHUNK]) ||
	    (vm->young && vm->nylog == vm->ylog_cap))
		return memo_put_slow(vm, idx, v);
	if (vm->young)
		vm->ylog[vm->nylog++] = (size_t)idx;
	slot = &m[idx % MEMO_CHUNK];
	vm->memo_count += !*slot;
	*slot = v;
	return 0;
}

/* memo_get() of a slot that holds no node to push as it is (ref: the
 * slot, NULL when v is not in one). */
static int memo_get_slow(struct vm *vm, uint64_t idx, flx_pv **ref, flx_pv *v)
{
	if (!v)
		return vm_fail(vm, -EINVAL,
			       "memo index %" PRIu64 " out of range", idx);
	if (v == &consumed && !vm->ndl)
		return vm_fail(vm, -EAGAIN,
			       "memo index %" PRIu64 " names a value the sink "
			       "took",
			       idx);
	if (kw_is(v) && !(v = kw_node(vm, ref)))
		return vm_nomem(vm);
	return push_again(vm, v);
}

static inline __attribute__((always_inline)) int memo_get(struct vm *vm,
							  uint64_t idx)
{
	flx_pv **ref, *v;

	if (idx >= vm->memo_len)
		return memo_get_slow(vm, idx, NULL, NULL);
	ref = memo_ref(vm, (size_t)idx);
	v = ref ? *ref : &consumed;
	if (!v || v == &consumed || kw_is(v))
		return memo_get_slow(vm, idx, ref, v);
	return push_again(vm, v);
}

static void memo_free(struct vm *vm)
{
	if (!vm->memo)
		return;
	for (size_t c = 0; c <= vm->max_memo / MEMO_CHUNK; c++)
		free(vm->memo[c]);
	free(vm->memo);
	while (vm->nspare)
		free(vm->memo_spare[--vm->nspare]);
}

/* ------------------------------------------------------------------- input */

/* Input offset of the next byte. */
static uint64_t at(const struct vm *vm)
{
	return vm->base + vm->pos;
}

/* Input bytes from the next one on. */
static uint64_t left(const struct vm *vm)
{
	return vm->len - at(vm);
}

static int truncated(struct vm *vm, uint64_t n, const char *what)
{
	return vm_fail(vm, -EINVAL,
		       "truncated: %s needs %" PRIu64 " bytes, %" PRIu64
		       " left",
		       what, n, left(vm));
}

/*
 * Make the window hold buf[pos, pos + n), n > wlen - pos and n <= left():
 * keep its bytes from pos (or from the hold) on, moved to the front, and
 * read behind them vm->ahead bytes or what n still lacks, whichever is
 * more, never past the input's end.  Only a reader load gets here: a
 * buffer load's window already holds everything left.
 */
static int refill(struct vm *vm, size_t n)
{
	size_t from = vm->hold < vm->pos ? vm->hold : vm->pos;
	size_t keep = vm->wlen - from;
	size_t upto = vm->pos - from + n;
	uint64_t rest = vm->len - (vm->base + from);
	size_t want = keep + vm->ahead > upto ? keep + vm->ahead : upto;
	int rc;

	if (want > rest)
		want = (size_t)rest;
	if (want > vm->wcap) {
		size_t cap = want < 2 * vm->wcap ? 2 * vm->wcap : want;
		unsigned char *nb = realloc(vm->wbuf, cap);

		if (!nb)
			return vm_nomem(vm);
		vm->wbuf = nb;
		vm->wcap = cap;
	}
	memmove(vm->wbuf, vm->wbuf + from, keep);
	vm->buf = vm->wbuf;
	vm->base += from;
	vm->pos -= from;
	vm->wlen = keep;
	if (vm->hold != NO_HOLD)
		vm->hold -= from;
	if (vm->ahead < vm->window / 2)
		vm->ahead *= 2;
	else
		vm->ahead = vm->window;
	rc = flx_read_at(vm->r, vm->wbuf + keep, want - keep, vm->base + keep);
	if (rc)
		return vm_fail(vm, rc, "read error: %s", strerror(-rc));
	vm->wlen = want;
	return 0;
}

static int need_slow(struct vm *vm, size_t n, const char *what)
{
	if (n > left(vm))
		return truncated(vm, n, what);
	return refill(vm, n);
}

/* n contiguous bytes at buf[pos] (n small: an argument).  Inlined: most
 * opcodes have one, and the window nearly always holds it. */
static inline __attribute__((always_inline)) int need(struct vm *vm, size_t n,
						      const char *what)
{
	if (n <= vm->wlen - vm->pos)
		return 0;
	return need_slow(vm, n, what);
}

static const unsigned char *take(struct vm *vm, size_t n)
{
	const unsigned char *r = vm->buf + vm->pos;

	vm->pos += n;
	return r;
}

/* Pass n <= left() bytes without reading them. */
static void skip(struct vm *vm, uint64_t n)
{
	if (n <= vm->wlen - vm->pos) {
		vm->pos += (size_t)n;
		return;
	}
	vm->base = at(vm) + n;
	vm->pos = 0;
	vm->wlen = 0;
	vm->ahead = vm->window < AHEAD_MIN ? vm->window : AHEAD_MIN;
}

/* The next bytes of a run being consumed: *p[0..*n) with 0 < *n <= rest
 * (rest <= left()). */
static int chunk(struct vm *vm, uint64_t rest, const unsigned char **p,
		 size_t *n)
{
	int rc;

	if (vm->pos == vm->wlen && (rc = refill(vm, 1)))
		return rc;
	*n = vm->wlen - vm->pos < rest ? vm->wlen - vm->pos : (size_t)rest;
	*p = take(vm, *n);
	return 0;
}

/* Little-endian unsigned of n <= 8 bytes.  Inline, and spelled out for
 * the widths of opcode arguments: with n known, one load. */
static inline __attribute__((always_inline)) uint64_t le(const unsigned char *p,
							 int n)
{
	uint64_t v = 0;

	switch (n) {
	case 1:
		return p[0];
	case 2:
		return (uint64_t)p[0] | (uint64_t)p[1] << 8;
	case 4:
		return (uint64_t)p[0] | (uint64_t)p[1] << 8 |
		       (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
	default:
		for (int i = n - 1; i >= 0; i--)
			v = v << 8 | p[i];
		return v;
	}
}

/* Fixed-width little-endian argument. */
static inline __attribute__((always_inline)) int arg_le(struct vm *vm, int n,
							uint64_t *out)
{
	int rc = need(vm, (size_t)n, "argument");

	if (rc)
		return rc;
	*out = le(take(vm, (size_t)n), n);
	return 0;
}

/* A protocol-0 text argument: bytes up to the next '\n'.  *s stays valid
 * until the next read from the input, or, under a hold, until the hold
 * ends. */
static int arg_line(struct vm *vm, const char **s, size_t *n)
{
	size_t seen = 0; /* bytes from pos known to hold no '\n' */
	const unsigned char *nl;
	int rc;

	while (!(nl = memchr(vm->buf + vm->pos + seen, '\n',
			     vm->wlen - vm->pos - seen))) {
		uint64_t more;

		seen = vm->wlen - vm->pos;
		if (seen == left(vm))
			return vm_fail(vm, -EINVAL,
				       "truncated: unterminated line");
		if (seen > vm->max_line)
			return vm_fail(vm, -EINVAL,
				       "text argument longer than %zu bytes",
				       vm->max_line);
		more = left(vm) - seen;
		if (more > vm->ahead)
			more = vm->ahead;
		if ((rc = refill(vm, seen + (size_t)more)))
			return rc;
	}
	*s = (const char *)vm->buf + vm->pos;
	*n = (size_t)(nl - (vm->buf + vm->pos));
	if (*n > vm->max_line)
		return vm_fail(vm, -EINVAL,
			       "text argument longer than %zu bytes",
			       vm->max_line);
	vm->pos += *n + 1;
	return 0;
}

/* --------------------------------------------------------------- integers */

static int int_cache_init(struct vm *vm)
{
	size_t n = 64;

	while (n < INT_CACHE_MAX && n < vm->len / 64)
		n *= 2;
	vm->ints = calloc(n, sizeof(*vm->ints));
	if (!vm->ints)
		return vm_nomem(vm);
	vm->ints_mask = n - 1;
	return 0;
}

/* new_int() of an int not in the cache (or the cache not made yet). */
static flx_pv *new_int_slow(struct vm *vm, int64_t i)
{
	flx_pv **slot, *v;

	if (!count_value(vm) || (!vm->ints && int_cache_init(vm)))
		return NULL;
	slot = &vm->ints[(size_t)(mix((uint64_t)i) >> 40) & vm->ints_mask];
	if (*slot && (*slot)->u.i == i)
		return *slot;
	/* in a batch, ints up to SIDE_INT_MAX (offsets, sizes) are still
	 * shared, from the side arena, SIDE_INTS of them at most */
	vm->to_side = vm->young && i >= 0 && i < SIDE_INT_MAX &&
		      vm->side_ints < SIDE_INTS;
	v = alloc_node(vm, FLX_PV_INT, 0);
	if (v) {
		v->u.i = i;
		if (!vm->young || vm->to_side)
			*slot = v;
		vm->side_ints += vm->to_side;
	}
	vm->to_side = false;
	return v;
}

/* Ints are immutable: equal ones share a node while it stays cached.  A
 * cached one costs a lookup, inline. */
static inline __attribute__((always_inline)) flx_pv *new_int(struct vm *vm,
							     int64_t i)
{
	flx_pv *v;

	if (!vm->ints || vm->nodes >= vm->max_nodes)
		return new_int_slow(vm, i);
	v = vm->ints[(size_t)(mix((uint64_t)i) >> 40) & vm->ints_mask];
	if (!v || v->u.i != i)
		return new_int_slow(vm, i);
	vm->nodes++;
	return v;
}

/* Two's complement little-endian (LONG1/LONG4); wider than int64 -> BIGINT.
 * Python writes the shortest form, but longer sign-extended encodings are
 * valid and still fit. */
static flx_pv *new_long_le(struct vm *vm, const unsigned char *b, size_t n)
{
	unsigned char ext;
	uint64_t u;

	if (n == 0)
		return new_int(vm, 0);
	ext = (b[n - 1] & 0x80) ? 0xff : 0x00;
	if (n > 8) {
		for (size_t i = 8; i < n; i++)
			if (b[i] != ext)
				return new_node(vm, FLX_PV_BIGINT);
		if ((b[7] & 0x80) != (ext & 0x80))
			return new_node(vm, FLX_PV_BIGINT);
		n = 8;
	}
	u = le(b, (int)n);
	if (n < 8 && ext)
		u |= ~(uint64_t)0 << (8 * n);
	return new_int(vm, (int64_t)u);
}

/* LONG1/LONG4 payload of n <= left() bytes at the cursor.  One across the
 * window's end (reader loads) is read in pieces: its value depends only on
 * its first 8 bytes, its last byte's sign and whether the bytes from the
 * 9th on all repeat that sign. */
static flx_pv *new_long(struct vm *vm, uint64_t n)
{
	unsigned char lo[8], last = 0;
	bool zeros = true, ones = true;

	if (n <= vm->wlen - vm->pos)
		return new_long_le(vm, take(vm, (size_t)n), (size_t)n);
	for (uint64_t got = 0; got < n;) {
		const unsigned char *p;
		size_t k;

		if (chunk(vm, n - got, &p, &k))
			return NULL;
		for (size_t i = 0; i < k; i++, got++) {
			if (got < 8)
				lo[got] = p[i];
			else {
				zeros = zeros && p[i] == 0x00;
				ones = ones && p[i] == 0xff;
			}
		}
		last = p[k - 1];
	}
	if (n <= 8)
		return new_long_le(vm, lo, (size_t)n);
	if (!((last & 0x80) ? ones : zeros) || (lo[7] & 0x80) != (last & 0x80))
		return new_node(vm, FLX_PV_BIGINT);
	return new_long_le(vm, lo, 8);
}

/* Decimal text ("-12"): magnitude in *u, *big when it exceeds 64 bits.
 * False when the text is no decimal integer. */
static bool parse_dec(const char *s, size_t n, uint64_t *u, bool *neg,
		      bool *big)
{
	size_t i = 0;

	*u = 0;
	*neg = false;
	*big = false;
	if (i < n && (s[i] == '-' || s[i] == '+'))
		*neg = s[i++] == '-';
	if (i == n)
		return false;
	for (; i < n; i++) {
		unsigned d = (unsigned)((unsigned char)s[i] - '0');

		if (d > 9)
			return false;
		if (*u > (UINT64_MAX - d) / 10)
			*big = true;
		else
			*u = *u * 10 + d;
	}
	return true;
}

/* INT/LONG text ("-12", "12L"); wider than int64 -> BIGINT. */
static flx_pv *new_int_text(struct vm *vm, const char *s, size_t n,
			    bool long_suffix)
{
	bool neg, big;
	uint64_t u;

	if (long_suffix && n && s[n - 1] == 'L')
		n--;
	if (!parse_dec(s, n, &u, &neg, &big)) {
		vm_fail(vm, -EINVAL, "bad integer literal");
		return NULL;
	}
	if (big || (!neg && u > (uint64_t)INT64_MAX) ||
	    (neg && u > (uint64_t)INT64_MAX + 1))
		return new_node(vm, FLX_PV_BIGINT);
	return new_int(vm, neg ? (int64_t)(0 - u) : (int64_t)u);
}

/* ----------------------------------------------------------- text strings */

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* STRING: a quoted Python 2 str literal, decoded as codecs.escape_decode
 * does (unknown escapes keep their backslash). */
static flx_pv *new_string_text(struct vm *vm, const char *s, size_t n)
{
	char *out;
	size_t o = 0;
	flx_pv *v;

	if (n < 2 || s[0] != s[n - 1] || (s[0] != '\'' && s[0] != '"')) {
		vm_fail(vm, -EINVAL, "argument must be quoted");
		return NULL;
	}
	s++;
	n -= 2;
	out = arena_alloc(vm->p, n + 1);
	if (!out) {
		vm_nomem(vm);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (c != '\\' || i + 1 == n) {
			if (c == '\\') {
				vm_fail(vm, -EINVAL, "trailing backslash");
				return NULL;
			}
			out[o++] = c;
			continue;
		}
		c = s[++i];
		switch (c) {
		case '\\':
			out[o++] = '\\';
			break;
		case '\'':
			out[o++] = '\'';
			break;
		case '"':
			out[o++] = '"';
			break;
		case 'a':
			out[o++] = '\a';
			break;
		case 'b':
			out[o++] = '\b';
			break;
		case 'f':
			out[o++] = '\f';
			break;
		case 'n':
			out[o++] = '\n';
			break;
		case 'r':
			out[o++] = '\r';
			break;
		case 't':
			out[o++] = '\t';
			break;
		case 'v':
			out[o++] = '\v';
			break;
		case 'x': {
			int h =
			    i + 2 < n ? hexval((unsigned char)s[i + 1]) : -1;
			int l = h >= 0 ? hexval((unsigned char)s[i + 2]) : -1;

			if (l < 0) {
				vm_fail(vm, -EINVAL, "invalid \\x escape");
				return NULL;
			}
			out[o++] = (char)(h << 4 | l);
			i += 2;
			break;
		}
		default:
			if (c >= '0' && c <= '7') {
				unsigned val = (unsigned)(c - '0');

				for (int k = 0;
				     k < 2 && i + 1 < n && s[i + 1] >= '0' &&
				     s[i + 1] <= '7';
				     k++)
					val =
					    val * 8 + (unsigned)(s[++i] - '0');
				out[o++] = (char)(val & 0xff);
			} else {
				out[o++] = '\\';
				out[o++] = c;
			}
		}
	}
	out[o] = '\0';
	v = new_node(vm, FLX_PV_STR);
	if (v) {
		v->u.str.s = out;
		v->u.str.len = o;
		v->u.str.off = FLX_PV_NO_OFFSET;
	}
	return v;
}

static size_t utf8_put(char *o, uint32_t cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | cp >> 6);
		o[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | cp >> 12);
		o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		o[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | cp >> 18);
	o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
	o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
	o[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* UNICODE: raw-unicode-escape (latin-1 bytes plus \uXXXX / \UXXXXXXXX after
 * an odd run of backslashes), re-encoded as UTF-8.  Each input byte yields
 * at most two output bytes. */
static flx_pv *new_unicode_text(struct vm *vm, const char *s, size_t n)
{
	char *out = n < SIZE_MAX / 4 ? arena_alloc(vm->p, 2 * n + 1) : NULL;
	size_t o = 0, i = 0;
	flx_pv *v;

	if (!out) {
		vm_nomem(vm);
		return NULL;
	}
	while (i < n) {
		size_t run = 0, digits;
		uint32_t cp = 0;

		if (s[i] != '\\') {
			o += utf8_put(out + o, (unsigned char)s[i++]);
			continue;
		}
		while (i + run < n && s[i + run] == '\\')
			run++;
		if (!(run & 1) || i + run >= n ||
		    (s[i + run] != 'u' && s[i + run] != 'U')) {
			memset(out + o, '\\', run);
			o += run;
			i += run;
			continue;
		}
		memset(out + o, '\\', run - 1);
		o += run - 1;
		i += run;
		digits = s[i] == 'u' ? 4 : 8;
		i++;
		if (n - i < digits) {
			vm_fail(vm, -EINVAL, "truncated \\u escape");
			return NULL;
		}
		for (size_t k = 0; k < digits; k++) {
			int h = hexval((unsigned char)s[i + k]);

			if (h < 0) {
				vm_fail(vm, -EINVAL, "bad \\u escape");
				return NULL;
			}
			cp = cp << 4 | (uint32_t)h;
		}
		if (cp > 0x10ffff) {
			vm_fail(vm, -EINVAL, "\\U escape out of range");
			return NULL;
		}
		i += digits;
		o += utf8_put(out + o, cp);
	}
	out[o] = '\0';
	v = new_node(vm, FLX_PV_STR);
	if (v) {
		v->u.str.s = out;
		v->u.str.len = o;
		v->u.str.off = FLX_PV_NO_OFFSET;
	}
	return v;
}

static flx_pv *new_float_text(struct vm *vm, const char *s, size_t n)
{
	char tmp[64];
	char *end;
	flx_pv *v;

	if (n == 0 || n >= sizeof(tmp)) {
		vm_fail(vm, -EINVAL, "bad float literal");
		return NULL;
	}
	memcpy(tmp, s, n);
	tmp[n] = '\0';
	/* strtod follows LC_NUMERIC; pickles always use '.'. */
	if (!vm->cloc)
		vm->cloc = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
	if (!vm->cloc) {
		vm_nomem(vm);
		return NULL;
	}
	v = new_node(vm, FLX_PV_FLOAT);
	if (!v)
		return NULL;
	v->u.f = strtod_l(tmp, &end, vm->cloc);
	if (end != tmp + n) {
		vm_fail(vm, -EINVAL, "bad float literal");
		return NULL;
	}
	return v;
}

/* GLOBAL / INST argument: "module\nname\n". */
static flx_pv *new_global_text(struct vm *vm)
{
	const char *m = NULL, *nm = NULL;
	size_t ml = 0, nl = 0;
	uint64_t m_at = at(vm);
	flx_pv *v, *ms, *ns;
	int rc;

	/* the module line stays in the window while the name is read */
	vm->hold = vm->pos;
	rc = arg_line(vm, &m, &ml);
	if (!rc)
		rc = arg_line(vm, &nm, &nl);
	vm->hold = NO_HOLD;
	if (rc)
		return NULL;
	m = (const char *)vm->buf + (m_at - vm->base);
	if (!ml || !nl) {
		vm_fail(vm, -EINVAL, "empty module or name");
		return NULL;
	}
	ms = new_str(vm, FLX_PV_STR, m, ml, FLX_PV_NO_OFFSET);
	ns = ms ? new_str(vm, FLX_PV_STR, nm, nl, FLX_PV_NO_OFFSET) : NULL;
	v = ns ? new_node(vm, FLX_PV_GLOBAL) : NULL;
	if (v) {
		v->u.global.module = ms->u.str.s;
		v->u.global.name = ns->u.str.s;
	}
	return v;
}

/* ----------------------------------------------------------------- objects */

static size_t size_slot(const struct vm *vm, const flx_pv *args)
{
	return (size_t)(mix((uint64_t)(uintptr_t)args) >>
			(64 - vm->sizes_bits));
}

static int sizes_grow(struct vm *vm)
{
	unsigned bits = vm->sizes_bits ? vm->sizes_bits + 1 : 8;
	size_t cap = (size_t)1 << bits;
	flx_pv **old = vm->sizes, **ns = calloc(cap, sizeof(*ns));
	size_t oldcap = old ? (size_t)1 << vm->sizes_bits : 0;

	if (!ns)
		return vm_nomem(vm);
	vm->sizes = ns;
	vm->sizes_bits = bits;
	for (size_t i = 0; i < oldcap; i++) {
		size_t s;

		if (!old[i])
			continue;
		for (s = size_slot(vm, old[i]->u.obj.args); ns[s];
		     s = (s + 1) & (cap - 1))
			;
		ns[s] = old[i];
	}
	free(old);
	return 0;
}

/*
 * torch.Size(t), shared like tuples: a DCP .metadata holds three per saved
 * chunk (offsets, sizes, storage key), nearly all equal to others, and
 * they were a quarter of the tree.  args is a one-item tuple, so a shared
 * one (new_tuple()): equal arguments are the same node.
 */
static flx_pv *shared_size(struct vm *vm, flx_pv *cls, flx_pv *args)
{
	size_t s, mask;
	flx_pv *v;

	if (!count_value(vm))
		return NULL;
	if (vm->young && (vm->ndl || is_young(vm, cls) || is_young(vm, args))) {
		/* not shared: it dies with the batch */
		v = alloc_node(vm, FLX_PV_OBJ, 0);
		if (v) {
			v->u.obj.cls = cls;
			v->u.obj.args = args;
			v->shared_ = true;
		}
		return v;
	}
	if (2 * (vm->sizes_n + 1) > ((size_t)1 << vm->sizes_bits) &&
	    sizes_grow(vm))
		return NULL;
	mask = ((size_t)1 << vm->sizes_bits) - 1;
	for (s = size_slot(vm, args); (v = vm->sizes[s]); s = (s + 1) & mask)
		if (v->u.obj.args == args && v->u.obj.cls == cls)
			return v;
	/* shared: made in the side arena while a batch is open */
	vm->to_side = vm->young;
	v = alloc_node(vm, FLX_PV_OBJ, 0);
	vm->to_side = false;
	if (v) {
		v->u.obj.cls = cls;
		v->u.obj.args = args;
		v->shared_ = true;
		vm->sizes[s] = v;
		vm->sizes_n++;
	}
	return v;
}

/* Inert REDUCE/NEWOBJ result.  OrderedDict() is the one call we give a
 * meaning to: torch pickles it (backward_hooks, state dicts) and then fills
 * it with SETITEMS, so it must be a real DICT. */
static flx_pv *new_obj(struct vm *vm, flx_pv *cls, flx_pv *args, bool newobj)
{
	flx_pv *v;

	if (args->kind != FLX_PV_TUPLE) {
		vm_fail(vm, -EINVAL, "argument is a %s, not a tuple",
			flx_pv_kind_name(args));
		return NULL;
	}
	if (args->u.seq.n == 0 && cls != vm->not_odict[0] &&
	    cls != vm->not_odict[1]) {
		if (flx_pv_is_global(cls, "collections", "OrderedDict"))
			return new_node(vm, FLX_PV_DICT);
		/* torch makes every DCP object this way, with one class
		 * node from the memo; GLOBAL nodes never change */
		if (cls->kind == FLX_PV_GLOBAL) {
			vm->not_odict[1] = vm->not_odict[0];
			vm->not_odict[0] = cls;
		}
	}
	if (!newobj && args->u.seq.n == 1 &&
	    (cls == vm->size_cls || flx_pv_is_global(cls, "torch", "Size"))) {
		vm->size_cls = cls;
		return shared_size(vm, cls, args);
	}
	v = new_node(vm, FLX_PV_OBJ);
	if (v) {
		v->u.obj.cls = cls;
		v->u.obj.args = args;
		v->newobj = newobj;
	}
	return v;
}

static int op_build(struct vm *vm)
{
	flx_pv *state = NULL, *o = NULL;
	int rc;

	if ((rc = pop(vm, &state)) || (rc = top(vm, &o)))
		return rc;
	if (o->kind == FLX_PV_OBJ && o->shared_)
		return vm_fail(vm, -EINVAL, "BUILD on a torch.Size");
	if (o->kind == FLX_PV_OBJ) {
		if ((rc = touch(vm, o)))
			return rc;
		o->u.obj.state = state;
		return 0;
	}
	/* nn.Module.state_dict() is an OrderedDict carrying a _metadata
	 * attribute, pickled as BUILD on the (by then) DICT.  Nobody reads
	 * it, so it is dropped instead of rejecting every state dict. */
	if (o->kind == FLX_PV_DICT)
		return 0;
	return vm_fail(vm, -EINVAL, "BUILD on a %s", flx_pv_kind_name(o));
}

/* ------------------------------------------------------------------- sink */

static bool is_key(const flx_pv *k, const char *key)
{
	return key && k->kind == FLX_PV_STR && k->u.str.s &&
	       k->u.str.len == strlen(key) &&
	       memcmp(k->u.str.s, key, k->u.str.len) == 0;
}

/* Whether the list at the stack's top, below a MARK, is a value of a dict
 * under the sink's list_parent key: that dict, then its own MARK, then
 * pairs, the list's key (a str) and the list. */
static bool in_list_parent(const struct vm *vm)
{
	size_t m;

	if (!vm->sink->list_parent || vm->nmarks < 2)
		return false;
	m = vm->marks[vm->nmarks - 2];
	return m >= 2 && m + 2 <= vm->sp && (vm->sp - 2 - m) % 2 == 0 &&
	       vm->stack[vm->sp - 2]->kind == FLX_PV_STR &&
	       vm->stack[m - 1]->kind == FLX_PV_DICT &&
	       is_key(vm->stack[m - 2], vm->sink->list_parent);
}

/* A MARK right above the sink dict or a sink list opens a batch.  The
 * sink dict is the first empty dict found under the sink's key when a
 * MARK follows it (torch pickles a dict as EMPTY_DICT, then batches of
 * MARK, pairs, SETITEMS); a sink list is any empty list under the sink's
 * list key with a MARK above it (EMPTY_LIST, then MARK, items, APPENDS).
 * Whether they are the ones the caller wanted, the caller checks
 * (flx_pickle_sink_dict(), flx_pv_streamed()). */
static void batch_start(struct vm *vm)
{
	const flx_pv *k;
	flx_pv *d;

	if (!vm->sink || vm->young || vm->sp < 2 ||
	    vm->marks[vm->nmarks - 1] != vm->sp)
		return;
	d = vm->stack[vm->sp - 1];
	k = vm->stack[vm->sp - 2];
	if (vm->sink->watch && !vm->watch_dict && d->kind == FLX_PV_DICT &&
	    d != vm->sink_dict && !d->u.dict.n && !d->reref_ &&
	    is_key(k, vm->sink->watch_key)) {
		vm->watch_dict = d;
		return;
	}
	if (d->kind == FLX_PV_LIST) {
		if (!vm->sink->items || d->u.seq.n || d->reref_ ||
		    !(is_key(k, vm->sink->list_key) || in_list_parent(vm)))
			return;
		d->sunk_ = true;
	} else if (d->kind != FLX_PV_DICT) {
		return;
	} else if (!vm->sink_dict) {
		if (d->u.dict.n || d->reref_ || !is_key(k, vm->sink->key))
			return;
		vm->sink_dict = d;
		vm->p->sink_dict = d;
	} else if (d != vm->sink_dict) {
		return;
	}
	vm->batch_target = d;
	vm->young = true;
	vm->young_dirty = !vm->p->blocks;
	vm->young_nmarks = vm->nmarks;
	vm->y_blk = vm->p->blocks;
	vm->y_next = vm->p->blocks ? vm->p->blocks->next : NULL;
	vm->y_cur = vm->p->cur;
	vm->y_left = vm->p->left;
	vm->y_size = vm->p->next_size;
	vm->y_nodes = vm->nodes;
	vm->y_side = 0;
	vm->y_holder = false;
	vm->nylog = 0;
}

/* Arena bytes a memoized young value takes when kept past its batch: the
 * immutable scalars a later opcode may name (strings, class references,
 * numbers); 0 for a container, which the batch's pairs alone may hold. */
static inline __attribute__((always_inline)) size_t keep_size(const flx_pv *v)
{
	switch (v->kind) {
	case FLX_PV_STR:
	case FLX_PV_BYTES:
		return round_up(sizeof(*v) +
				(v->u.str.s ? v->u.str.len + 1 : 0));
	case FLX_PV_GLOBAL:
		return round_up(sizeof(*v) + strlen(v->u.global.module) + 1 +
				strlen(v->u.global.name) + 1);
	case FLX_PV_NONE:
	case FLX_PV_BOOL:
	case FLX_PV_INT:
	case FLX_PV_BIGINT:
	case FLX_PV_FLOAT:
		return round_up(sizeof(*v));
	default:
		return 0;
	}
}

/* Copy v (keep_size() bytes) to dst; its own pointers point into dst. */
static void keep_copy(flx_pv *dst, const flx_pv *v)
{
	char *d = (char *)(dst + 1);

	*dst = *v;
	if ((v->kind == FLX_PV_STR || v->kind == FLX_PV_BYTES) && v->u.str.s) {
		memcpy(d, v->u.str.s, v->u.str.len + 1);
		dst->u.str.s = d;
	} else if (v->kind == FLX_PV_GLOBAL) {
		size_t ml = strlen(v->u.global.module) + 1;

		memcpy(d, v->u.global.module, ml);
		strcpy(d + ml, v->u.global.name);
		dst->u.global.module = d;
		dst->u.global.name = d + ml;
	}
}

/* p moved with the bytes [lo, hi) to `to` on: where it points now. */
static const char *moved_ptr(const char *p, const unsigned char *lo,
			     const unsigned char *hi, unsigned char *to)
{
	const unsigned char *c = (const unsigned char *)p;

	return c >= lo && c < hi ? (const char *)(to + (c - lo)) : p;
}

/* Re-point v's own pointers that point into [lo, hi) (keep_copy()'s
 * copies, moved with v from [lo, hi) to `to` on); a string's payload
 * shared with a string kept before (rewind_batch()) stays where it is. */
static void keep_fix(flx_pv *v, const unsigned char *lo,
		     const unsigned char *hi, unsigned char *to)
{
	if ((v->kind == FLX_PV_STR || v->kind == FLX_PV_BYTES) && v->u.str.s) {
		v->u.str.s = moved_ptr(v->u.str.s, lo, hi, to);
	} else if (v->kind == FLX_PV_GLOBAL) {
		v->u.global.module = moved_ptr(v->u.global.module, lo, hi, to);
		v->u.global.name = moved_ptr(v->u.global.name, lo, hi, to);
	}
}

/* Whether a is in [lo, hi) or in [lo2, hi2). */
static bool in_spans(const void *a, const unsigned char *lo,
		     const unsigned char *hi, const unsigned char *lo2,
		     const unsigned char *hi2)
{
	const unsigned char *c = a;

	return (c >= lo && c < hi) || (lo2 && c >= lo2 && c < hi2);
}

static void forget_young(flx_pv **hint, const unsigned char *lo,
			 const unsigned char *hi, const unsigned char *lo2,
			 const unsigned char *hi2)
{
	if (in_spans(*hint, lo, hi, lo2, hi2))
		*hint = NULL;
}

/* Whether a scalar kept past its batch may be shared by content: a copied
 * string or bytes payload. */
static bool keep_shares(const flx_pv *v)
{
	return (v->kind == FLX_PV_STR || v->kind == FLX_PV_BYTES) && v->u.str.s;
}

static size_t keep_hash(const struct vm *vm, const flx_pv *v)
{
	uint64_t h = 0xcbf29ce484222325u ^ (uint64_t)v->kind;

	for (size_t i = 0; i < v->u.str.len; i++)
		h = (h ^ (unsigned char)v->u.str.s[i]) * 0x100000001b3u;
	return (size_t)(mix(h) >> (64 - vm->keeps_bits));
}

/* The slot of vm->keeps that holds the id of a string equal to v
 * (keep_shares()), or the empty one where it would go; vm->keeps must
 * exist. */
static size_t keep_slot(const struct vm *vm, const flx_pv *v)
{
	size_t mask = ((size_t)1 << vm->keeps_bits) - 1, i;

	for (i = keep_hash(vm, v); vm->keeps[i]; i = (i + 1) & mask) {
		const flx_pv *k = vm->kstr[vm->keeps[i] - 1];

		if (k->kind == v->kind && k->u.str.len == v->u.str.len &&
		    memcmp(k->u.str.s, v->u.str.s, v->u.str.len) == 0)
			break;
	}
	return i;
}

/* Room in vm->keeps and vm->kstr for n more strings, so that neither
 * moves while a batch is wound back.  False: out of memory, or past
 * KEEP_MAX (nothing more is added then). */
static bool keep_room(struct vm *vm, size_t n)
{
	size_t cap = vm->keeps ? (size_t)1 << vm->keeps_bits : 0, ncap;
	unsigned bits = vm->keeps_bits ? vm->keeps_bits : 8;
	uint32_t *nt;

	if (n > KEEP_MAX - vm->keeps_n ||
	    flx_grow((void **)&vm->kstr, &vm->kstr_cap, vm->keeps_n + n,
		     sizeof(*vm->kstr)))
		return false;
	if (2 * (vm->keeps_n + n) <= cap)
		return true;
	while (((size_t)1 << bits) < 2 * (vm->keeps_n + n))
		bits++;
	ncap = (size_t)1 << bits;
	if (!(nt = calloc(ncap, sizeof(*nt))))
		return false;
	vm->keeps_bits = bits;
	for (size_t j = 0; j < cap; j++) {
		size_t i;

		if (!vm->keeps[j])
			continue;
		for (i = keep_hash(vm, vm->kstr[vm->keeps[j] - 1]); nt[i];
		     i = (i + 1) & (ncap - 1))
			;
		nt[i] = vm->keeps[j];
	}
	free(vm->keeps);
	vm->keeps = nt;
	return true;
}

/*
 * After the sink took a batch's pairs: give the batch's arena room back.
 * Nothing but memo slots can point at young values (no cache takes one,
 * the stack is back below the mark, and no older container changed, or
 * nothing is done); the memoized scalars are copied above the young
 * values (or, without the room there, to a buffer of their own), then
 * down to y_cur, and every other value memoized in the batch that is no
 * such scalar becomes &consumed.  The young values lie
 * in the batch's block from y_cur on and, where the batch moved on to a
 * new block (nb, batch_span()), in that block too: the scalars are then
 * copied back into the batch's block when they fit in its room (that
 * block is current again, and nb is kept for the next block, p->spare,
 * or freed), else to the start of nb (the batch's values in the batch's
 * block, fewer bytes than the scalars, stay unused).  Where they lie
 * elsewhere too (a dedicated block, more blocks), they stay.  Where they
 * stay for good (not in a level of a dropped value, which its enclosing
 * level winds back again), a string equal to one kept before keeps
 * neither bytes nor a node: its memo slot holds a word (kw_word()) that
 * says which and its own u.str.off (as in a plain load), and the node
 * memo_get() makes of it has that string's payload (strings are
 * immutable; Python's pickler memoizes each object it meets, so torch
 * writes the same dtype or key as one new memoized string per chunk).
 * One whose offset does not fit the word keeps a node of its own.
 * @return whether the batch was wound back (false: nothing changed).
 */
static bool rewind_batch(struct vm *vm)
{
	flx_pickle *p = vm->p;
	struct arena_blk *nb = NULL;
	unsigned char *lo = vm->y_cur, *hi, *lo2 = NULL, *top = p->cur, *dst;
	unsigned char *stage = top, *to;
	/* room for the scalars kept from lo on, and from lo2 on */
	size_t room = (size_t)(top - lo) + p->left, room2 = 0;
	size_t need = 0, moved, kept = 0, nmv = 0, kfrom = vm->keeps_n;
	bool share;

	if (vm->young_dirty || !batch_span(vm, &nb))
		return false;
	if (nb) {
		hi = vm->y_cur + vm->y_left;
		lo2 = (unsigned char *)nb->data;
		room = vm->y_left;
		room2 = (size_t)(top - lo2) + p->left;
	} else {
		hi = p->cur;
	}
	for (size_t i = 0; i < vm->nylog; i++) {
		flx_pv **slot = memo_ref(vm, vm->ylog[i]);

		if (slot && !kw_is(*slot) && in_spans(*slot, lo, hi, lo2, top))
			need += keep_size(*slot);
	}
	/* need counts a string shared (below) as a copy: what is moved
	 * fits in the room it fits in */
	if ((need > room && need > room2) ||
	    flx_grow((void **)&vm->mv, &vm->mv_cap, vm->nylog,
		     sizeof(*vm->mv)) ||
	    (need > p->left && !(stage = malloc(need))))
		return false;
	share = !vm->ndl && keep_room(vm, vm->nylog);
	dst = stage;
	for (size_t i = 0; i < vm->nylog; i++) {
		flx_pv **slot = memo_ref(vm, vm->ylog[i]);
		size_t n;

		/* a word: a slot logged twice, made a word the first time */
		if (!slot || kw_is(*slot))
			continue;
		if (!in_spans(*slot, lo, hi, lo2, top)) {
			/* a container memoized in the batch but made before
			 * it or in the side arena goes too,
			 * so that the memo chunks the batches filled can be
			 * packed (pack_memo()); naming it again decodes
			 * again, as for a young one */
			if (*slot != &consumed && !keep_size(*slot) &&
			    (*slot)->kind != FLX_PV_TUPLE &&
			    !((*slot)->kind == FLX_PV_OBJ && (*slot)->shared_))
				*slot = &consumed;
			continue;
		}
		n = keep_size(*slot);
		if (!n) {
			*slot = &consumed;
			continue;
		}
		if (share && keep_shares(*slot)) {
			size_t k = keep_slot(vm, *slot);

			if (vm->keeps[k] && (*slot)->u.str.off <= KW_OFF_MAX) {
				*slot = kw_word(vm->keeps[k] - 1,
						(*slot)->u.str.off);
				kept++;
				continue;
			}
			if (vm->keeps[k]) {
				flx_pv *d = (flx_pv *)dst;

				*d = **slot;
				d->u.str.s =
				    vm->kstr[vm->keeps[k] - 1]->u.str.s;
				*slot = d;
				vm->mv[nmv++] = slot;
				dst += round_up(sizeof(*d));
				kept++;
				continue;
			}
			vm->keeps[k] = (uint32_t)vm->keeps_n + 1;
			vm->kstr[vm->keeps_n++] = (flx_pv *)dst;
		}
		keep_copy((flx_pv *)dst, *slot);
		*slot = (flx_pv *)dst;
		vm->mv[nmv++] = slot;
		dst += n;
		kept++;
	}
	moved = (size_t)(dst - stage);
	to = moved <= room ? lo : lo2;
	if (moved)
		memmove(to, stage, moved);
	/* each copied value once (a memo index set twice in the batch is
	 * logged twice, and its moved value may lie in [stage, dst) again) */
	for (size_t i = 0; i < nmv; i++) {
		flx_pv **slot = vm->mv[i];

		*slot = (flx_pv *)(to + ((unsigned char *)*slot - stage));
		keep_fix(*slot, stage, dst, to);
	}
	for (size_t i = kfrom; i < vm->keeps_n; i++)
		vm->kstr[i] =
		    (flx_pv *)(to + ((unsigned char *)vm->kstr[i] - stage));
	if (stage != top)
		free(stage);
	forget_young(&vm->none, lo, hi, lo2, top);
	forget_young(&vm->bools[0], lo, hi, lo2, top);
	forget_young(&vm->bools[1], lo, hi, lo2, top);
	forget_young(&vm->empty_tuple, lo, hi, lo2, top);
	forget_young(&vm->not_odict[0], lo, hi, lo2, top);
	forget_young(&vm->not_odict[1], lo, hi, lo2, top);
	forget_young(&vm->size_cls, lo, hi, lo2, top);
	p->left = (to == lo ? room : room2) - moved;
	p->cur = to + moved;
	if (nb && to == lo) {
		p->blocks = vm->y_blk;
		if (vm->y_size == ARENA_MAX_BLOCK && !p->spare)
			p->spare = nb;
		else
			free(nb);
	}
	/* the batch's values are gone but for the scalars kept and what it
	 * made in p->side: max_nodes bounds the values held */
	vm->nodes = vm->y_nodes + vm->y_side + kept;
	vm->nylog = 0;
	return true;
}

/*
 * In a sink load, most memo slots behind the streamed dict's batches name
 * values the sink took (&consumed): a memo chunk the load has passed
 * (every slot index below memo_count) that holds at most PACK_MAX live slots
 * is freed (or kept for the next chunk, MEMO_SPARE), its live slots'
 * values kept in pk_v and found through a bitmap (struct pk_chunk).  A
 * packed slot set again fails the load with -EAGAIN (CPython numbers memo
 * slots densely; only a hand-made pickle goes back).  The slots that open
 * batches logged are live, and their rewinds find them in pk_v
 * (memo_ref()): a dropped value's outer levels stay open across many
 * chunks (Megatron-Core's all_local_plans: one batch of every plan).  Out
 * of memory: the chunk simply stays.
 */
/* A packed chunk for live slots: sparse up to PACK_SPARSE, else dense
 * (struct pk_chunk).  @return it (owned by the caller, one free()), or
 * NULL when out of memory. */
static struct pk_chunk *pk_chunk_new(size_t live)
{
	const size_t words = MEMO_CHUNK / 64;
	struct pk_chunk *k;

	if (live <= PACK_SPARSE) {
		if ((k = malloc(sizeof(*k) + live * sizeof(k->idx[0])))) {
			k->nidx = (uint32_t)live;
			k->bits = NULL;
			k->rank = NULL;
		}
		return k;
	}
	k = malloc(sizeof(*k) + words * (sizeof(uint64_t) + sizeof(uint32_t)));
	if (k) {
		k->nidx = PACK_DENSE;
		k->bits = (uint64_t *)(k + 1);
		k->rank = (uint32_t *)(k->bits + words);
	}
	return k;
}

static void pack_memo(struct vm *vm)
{
	size_t nchunks = vm->max_memo / MEMO_CHUNK + 1;

	while ((vm->memo_scan + 1) * MEMO_CHUNK <= vm->memo_count &&
	       (vm->memo_scan + 1) * MEMO_CHUNK <= vm->memo_len) {
		size_t c = vm->memo_scan++, live = 0;
		flx_pv **m = vm->memo[c];
		struct pk_chunk *k;

		if (c == 0 || !m)
			continue;
		for (size_t i = 0; i < MEMO_CHUNK; i++)
			live += m[i] && m[i] != &consumed;
		if (live > PACK_MAX)
			continue;
		if (!vm->packed &&
		    !(vm->packed = calloc(nchunks, sizeof(*vm->packed))))
			return;
		if (flx_grow((void **)&vm->pk_v, &vm->cap_v, vm->npk + live,
			     sizeof(*vm->pk_v)) ||
		    !(k = pk_chunk_new(live)))
			return;
		k->base = vm->npk;
		for (size_t i = 0; k->nidx != PACK_DENSE && i < MEMO_CHUNK;
		     i++) {
			if (!m[i] || m[i] == &consumed)
				continue;
			k->idx[vm->npk - k->base] = (uint32_t)i;
			vm->pk_v[vm->npk++] = m[i];
		}
		for (size_t w = 0; k->nidx == PACK_DENSE && w < MEMO_CHUNK / 64;
		     w++) {
			uint64_t bits = 0;

			k->rank[w] = (uint32_t)(vm->npk - k->base);
			for (size_t b = 0; b < 64; b++) {
				flx_pv *v = m[w * 64 + b];

				if (!v || v == &consumed)
					continue;
				bits |= (uint64_t)1 << b;
				vm->pk_v[vm->npk++] = v;
			}
			k->bits[w] = bits;
		}
		if (vm->nspare < MEMO_SPARE)
			vm->memo_spare[vm->nspare++] = m;
		else
			free(m);
		vm->memo[c] = NULL;
		vm->packed[c] = k;
		vm->memo_chunks--;
	}
}

/* ------------------------------------------------------- a dropped value */

/* Open a level of a dropped value's batch, at its MARK. */
static int drop_level(struct vm *vm)
{
	struct drop_lvl *l;

	if (flx_grow((void **)&vm->dl, &vm->dl_cap, vm->ndl + 1,
		     sizeof(*vm->dl)))
		return vm_nomem(vm);
	l = &vm->dl[vm->ndl++];
	l->blk = vm->p->blocks;
	l->next = vm->p->blocks ? vm->p->blocks->next : NULL;
	l->cur = vm->p->cur;
	l->left = vm->p->left;
	l->size = vm->p->next_size;
	l->nodes = vm->nodes;
	l->side = vm->y_side;
	l->nylog = vm->nylog;
	return 0;
}

/*
 * At a MARK: a level of the open batch, or the start of a batch of the
 * value V to drop: the MARK right above V, V a list or dict right above
 * the drop key, a key of the outermost dict being filled (the frame of
 * the first MARK holds pairs, then the key and V).  Python's pickler
 * writes Megatron-Core's all_local_plans so: EMPTY_LIST, MARK, plans,
 * APPENDS, within the SETITEMS of MCoreMetadata's state.  V named
 * again before (memo, DUP) is kept: another value holds it.
 */
static int drop_mark(struct vm *vm)
{
	size_t f;
	flx_pv *d, *v;

	if (vm->ndl)
		return drop_level(vm);
	if (!vm->sink || !vm->sink->drop_key || vm->young || vm->nmarks != 2 ||
	    vm->marks[1] != vm->sp)
		return 0;
	f = vm->marks[0];
	if (f == 0 || vm->sp < f + 2 || (vm->sp - f) % 2)
		return 0;
	d = vm->stack[f - 1];
	v = vm->stack[vm->sp - 1];
	if (d->kind != FLX_PV_DICT || d == vm->sink_dict ||
	    (v->kind != FLX_PV_LIST && v->kind != FLX_PV_DICT) || v->reref_ ||
	    v == vm->sink_dict || (vm->drop_v ? v != vm->drop_v : v->sunk_) ||
	    !is_key(vm->stack[vm->sp - 2], vm->sink->drop_key))
		return 0;
	v->sunk_ = true;
	vm->drop_v = v;
	vm->drop_vi = vm->sp - 1;
	vm->drop_d = d;
	vm->drop_nmarks = vm->nmarks;
	vm->batch_target = NULL;
	vm->young = true;
	vm->young_nmarks = vm->nmarks;
	vm->y_side = 0;
	vm->nylog = 0;
	return drop_level(vm);
}

/* Give back level l's values (rewind_batch(), over its part of the log);
 * then every container, tuple and object it memoized, and every slot
 * that stood for nothing, names a value the sink took (&consumed), and
 * the log keeps the scalars, which the enclosing level holds now. */
static void drop_rewind(struct vm *vm, const struct drop_lvl *l)
{
	size_t *log = vm->ylog, n = vm->nylog, side = vm->y_side, k = l->nylog;

	vm->y_blk = l->blk;
	vm->y_next = l->next;
	vm->y_cur = l->cur;
	vm->y_left = l->left;
	vm->y_size = l->size;
	vm->y_nodes = l->nodes;
	vm->y_side = side - l->side;
	vm->young_dirty = !l->blk;
	vm->ylog = log ? log + l->nylog : NULL;
	vm->nylog = n - l->nylog;
	rewind_batch(vm);
	vm->ylog = log;
	vm->y_side = side;
	for (size_t i = l->nylog; i < n; i++) {
		flx_pv **slot = memo_ref(vm, log[i]);

		if (!slot || *slot == &consumed)
			continue;
		if (!kw_is(*slot) &&
		    (*slot == &nothing_pv || !keep_size(*slot))) {
			*slot = &consumed;
			continue;
		}
		log[k++] = log[i];
	}
	vm->nylog = k;
	pack_memo(vm);
}

static bool drop_batch_op(unsigned char op)
{
	return op == OP_APPENDS || op == OP_SETITEMS || op == OP_ADDITEMS ||
	       op == OP_POP_MARK || op == OP_POP;
}

/* After each opcode while a value is dropped: a level the opcode closed
 * gives back its values when the opcode added them (APPENDS, SETITEMS,
 * ADDITEMS: not kept, see drop_closing()) or discarded them, else its
 * enclosing level holds them; the batch's own level must close so, and
 * the pickle must not end inside it.  V leaves the stack only as the pair
 * dict_add() left out. */
static int drop_close(struct vm *vm)
{
	if (vm->ndl && vm->op == OP_STOP)
		return vm_fail(vm, -EAGAIN,
			       "the pickle ends in a batch of the value under "
			       "'%s'",
			       vm->sink->drop_key);
	if (drop_closing(vm)) {
		const struct drop_lvl *l = &vm->dl[--vm->ndl];
		bool batch = drop_batch_op(vm->op);

		if (!vm->ndl && !batch)
			return vm_fail(vm, -EAGAIN,
				       "the batch of the value under '%s' "
				       "makes a value",
				       vm->sink->drop_key);
		if (batch)
			drop_rewind(vm, l);
		if (!vm->ndl) {
			vm->drop_nmarks = 0;
			vm->young = false;
			vm->drop_ph = false;
			vm->nylog = 0;
		}
	}
	if (vm->sp > vm->drop_vi && vm->stack[vm->drop_vi] == vm->drop_v)
		return 0;
	if (!vm->drop_taken)
		return vm_fail(vm, -EAGAIN, "the value under '%s' is used",
			       vm->sink->drop_key);
	vm->drop_v = NULL;
	vm->drop_taken = false;
	return 0;
}

/* -------------------------------------------------------------- containers */

/* The container below the innermost mark, which must be of kind want;
 * *start is the first item above the mark. */
static int mark_target(struct vm *vm, flx_pv_kind want, const char *op,
		       size_t *start, flx_pv **target)
{
	int rc = pop_mark(vm, start);

	if (rc)
		return rc;
	if (*start <= fence(vm))
		return vm_fail(vm, -EINVAL, "stack underflow");
	*target = vm->stack[*start - 1];
	if ((*target)->kind != want)
		return vm_fail(vm, -EINVAL, "%s a %s", op,
			       flx_pv_kind_name(*target));
	return 0;
}

/* APPENDS (list) and ADDITEMS (set): add every item above the mark. */
/* A sink callback's result rc, as the load's. */
static int sink_result(struct vm *vm, int rc)
{
	if (rc == -EAGAIN)
		return vm_fail(vm, -EAGAIN, "the sink declined");
	if (rc == -ENOMEM)
		return vm_nomem(vm);
	if (rc)
		return vm_fail(vm, rc, "the sink failed");
	return 0;
}

/* Whether an item added alone (APPEND, SETITEM) to target goes to the
 * sink: target is the sink dict or a list streamed (Python's pickler ends
 * a dict or list whose length is one past a multiple of its batch size
 * with such an item), outside any batch or dropped value.  Its values
 * were made outside a batch: nothing is rewound, they stay valid. */
static bool lone_to_sink(const struct vm *vm, const flx_pv *target)
{
	return vm->sink && !vm->young && !vm->ndl && target != vm->drop_v &&
	       (target == vm->sink_dict || (target->kind == FLX_PV_LIST &&
					    target->sunk_ && vm->sink->items));
}

/* Mark v taken and queue it at vm->tk[*sp] for its children: a node that
 * holds others (scalars are never changed by an opcode). */
static inline __attribute__((always_inline)) int
take_push(struct vm *vm, size_t *sp, flx_pv *v)
{
	if (!v || v->taken_ || !((1u << v->kind) & HOLDS_OTHERS))
		return 0;
	if (*sp == vm->tk_cap &&
	    flx_grow((void **)&vm->tk, &vm->tk_cap, *sp + 1, sizeof(*vm->tk)))
		return vm_nomem(vm);
	v->taken_ = true;
	vm->tk[(*sp)++] = v;
	return 0;
}

/*
 * Before a sink takes v[0..n): mark every node they reach taken_, so that
 * an opcode that changes one later declines the load (touch()).  Each node
 * is walked once per load (a marked one stops the walk), so the cost is
 * linear in the values decoded.
 */
static int mark_taken(struct vm *vm, flx_pv *const *v, size_t n)
{
	size_t sp = 0;
	int rc = 0;

	for (size_t i = 0; !rc && i < n; i++)
		rc = take_push(vm, &sp, v[i]);
	while (!rc && sp) {
		flx_pv *t = vm->tk[--sp];

		switch (t->kind) {
		case FLX_PV_TUPLE:
		case FLX_PV_LIST:
		case FLX_PV_SET:
			for (size_t i = 0; !rc && i < t->u.seq.n; i++)
				rc = take_push(vm, &sp, t->u.seq.v[i]);
			break;
		case FLX_PV_DICT:
			for (size_t i = 0; !rc && i < 2 * t->u.dict.n; i++)
				rc = take_push(vm, &sp, t->u.dict.kv[i]);
			break;
		case FLX_PV_OBJ:
			if (!(rc = take_push(vm, &sp, t->u.obj.cls)) &&
			    !(rc = take_push(vm, &sp, t->u.obj.args)))
				rc = take_push(vm, &sp, t->u.obj.state);
			break;
		case FLX_PV_PERSID:
			rc = take_push(vm, &sp, t->u.persid.pid);
			break;
		default:
			break;
		}
	}
	return rc;
}

/* The sink's items() of v[0 .. n) for the sink list list, or, list NULL,
 * its pairs() of the n / 2 pairs there. */
static int sink_call(struct vm *vm, const flx_pv *list, flx_pv *const *v,
		     size_t n)
{
	return list ? vm->sink->items(vm->sink->ctx, list, v, n)
		    : vm->sink->pairs(vm->sink->ctx, v, n / 2);
}

/* sink_call() of what the sink takes, marked taken first (mark_taken()). */
static int sink_take(struct vm *vm, const flx_pv *list, flx_pv *const *v,
		     size_t n)
{
	int rc = mark_taken(vm, v, n);

	return rc ? rc : sink_call(vm, list, v, n);
}

/*
 * A batch closed (its mark popped, start the first item above it): the
 * sink's items() (list the sink list) or pairs() (list NULL) of
 * v = stack[start .. sp), then the batch's memory given back.  What the
 * sink took is marked taken (mark_taken()) where a later opcode can still
 * reach it: marking is for the opcodes after the batch, so it is left out
 * when rewind_batch() winds the batch back and no value that holds others
 * was named again in it (y_holder): then the memo names none of the
 * batch's containers (their slots name &consumed), the stack is below the
 * batch's mark, no older container was changed (young_dirty), and
 * whatever else v reaches is a scalar or an immutable shared value
 * (None, an int, (), a torch.Size object whose arguments are older: those
 * were named again).  Where the batch stays, v is marked after the sink's
 * call: its values are where they were.
 */
static int batch_end(struct vm *vm, const flx_pv *list, size_t start)
{
	flx_pv *const *v = vm->stack + start;
	size_t n = vm->sp - start;
	bool holder = vm->y_holder;
	int rc = holder ? mark_taken(vm, v, n) : 0;

	if (!rc)
		rc = sink_call(vm, list, v, n);
	if ((rc = sink_result(vm, rc)))
		return rc;
	vm->sp = start;
	if (!rewind_batch(vm) && !holder && (rc = mark_taken(vm, v, n)))
		return rc;
	pack_memo(vm);
	return 0;
}

/* The watched dict's pairs kv[0 .. 2 * n) to the sink's watch(). */
static int watched(struct vm *vm, flx_pv *const *kv, size_t n)
{
	return sink_result(vm, vm->sink->watch(vm->sink->ctx, kv, n));
}

static int op_add_seq(struct vm *vm, flx_pv_kind want, const char *op)
{
	size_t start = 0;
	flx_pv *seq = NULL;
	/* the innermost mark is the batch's (mark_target() pops it) */
	bool batch = vm->young && vm->nmarks == vm->young_nmarks;
	int rc = mark_target(vm, want, op, &start, &seq);

	if (rc)
		return rc;
	if (batch && seq == vm->batch_target)
		return batch_end(vm, seq, start);
	if ((rc = seq_add(vm, seq, vm->stack + start, vm->sp - start)))
		return rc;
	vm->sp = start;
	return 0;
}

static int op_setitems(struct vm *vm)
{
	size_t start = 0;
	flx_pv *d = NULL;
	/* the innermost mark is the batch's (mark_target() pops it) */
	bool batch = vm->young && vm->nmarks == vm->young_nmarks;
	int rc = mark_target(vm, FLX_PV_DICT, "SETITEMS on", &start, &d);

	if (rc)
		return rc;
	if ((vm->sp - start) & 1)
		return vm_fail(vm, -EINVAL, "odd number of items");
	if (batch && d == vm->batch_target)
		return batch_end(vm, NULL, start);
	if (d == vm->watch_dict &&
	    (rc = watched(vm, vm->stack + start, (vm->sp - start) / 2)))
		return rc;
	if ((rc = dict_add(vm, d, vm->stack + start, (vm->sp - start) / 2)))
		return rc;
	vm->sp = start;
	return 0;
}

/* TUPLE, LIST, FROZENSET, DICT, OBJ, INST: consume everything above the
 * innermost mark. */
static int op_from_mark(struct vm *vm)
{
	size_t start = 0, n;
	flx_pv **items;
	flx_pv *v = NULL;
	int rc = pop_mark(vm, &start);

	if (rc)
		return rc;
	n = vm->sp - start;
	/* the stack is not allocated before its first push: no pointer
	 * arithmetic on NULL when the mark sits on an empty stack */
	items = vm->stack ? vm->stack + start : NULL;
	switch (vm->op) {
	case OP_TUPLE:
		v = new_tuple(vm, items, n);
		break;
	case OP_LIST:
		v = new_items(vm, FLX_PV_LIST, items, n);
		break;
	case OP_FROZENSET:
		v = new_items(vm, FLX_PV_SET, items, n);
		break;
	case OP_DICT:
		if (n & 1)
			return vm_fail(vm, -EINVAL, "odd number of items");
		v = new_items(vm, FLX_PV_DICT, items, n);
		break;
	case OP_OBJ: {
		flx_pv *args;

		if (n == 0)
			return vm_fail(vm, -EINVAL, "stack underflow");
		args = new_tuple(vm, items + 1, n - 1);
		v = args ? new_obj(vm, vm->stack[start], args, false) : NULL;
		break;
	}
	case OP_INST: {
		flx_pv *cls = new_global_text(vm);
		flx_pv *args = cls ? new_tuple(vm, items, n) : NULL;

		v = args ? new_obj(vm, cls, args, false) : NULL;
		break;
	}
	}
	vm->sp = start;
	return push(vm, v);
}

static int op_tuple_n(struct vm *vm, size_t n)
{
	if (vm->sp - fence(vm) < n)
		return vm_fail(vm, -EINVAL, "stack underflow");
	vm->sp -= n;
	return push(vm, new_tuple(vm, vm->stack + vm->sp, n));
}

/* -------------------------------------------------------------------- loop */

/* STR/BYTES payload of n <= left() bytes at the cursor.  Copied where a
 * buffer load or the limits say so; else a node that says where it is. */
static flx_pv *new_payload(struct vm *vm, flx_pv_kind kind, uint64_t n)
{
	size_t max = kind == FLX_PV_BYTES ? vm->max_copy : vm->max_str;
	uint64_t off = at(vm);
	flx_pv *v;
	char *d;

	if (n <= vm->wlen - vm->pos && n <= max)
		return new_str(vm, kind, take(vm, (size_t)n), (size_t)n, off);
	if (n > max) {
		if ((uint64_t)(size_t)n != n) {
			vm_nomem(vm);
			return NULL;
		}
		if (!count_value(vm) || !(v = alloc_node(vm, kind, 0)))
			return NULL;
		v->u.str.len = (size_t)n;
		v->u.str.off = off;
		skip(vm, n);
		return v;
	}
	/* a copied payload across the window's end (reader loads) */
	if (!(v = new_str_room(vm, kind, (size_t)n, off)))
		return NULL;
	d = (char *)(v + 1);
	for (uint64_t got = 0; got < n;) {
		const unsigned char *p;
		size_t k;

		if (chunk(vm, n - got, &p, &k))
			return NULL;
		memcpy(d + got, p, k);
		got += k;
	}
	return v;
}

/* Length-prefixed STR/BYTES payload. */
static int op_sized(struct vm *vm, int lenbytes, bool is_signed,
		    flx_pv_kind kind)
{
	uint64_t n;
	int rc = arg_le(vm, lenbytes, &n);

	if (rc)
		return rc;
	if (is_signed && (n & 0x80000000u))
		return vm_fail(vm, -EINVAL, "negative length");
	if (n > left(vm))
		return truncated(vm, n, "payload");
	return push(vm, new_payload(vm, kind, n));
}

/* Inlined into the loop of flx_pickle_load(): as a call, its prologue and
 * epilogue were a quarter of the time of a large load's opcodes. */
static inline __attribute__((always_inline)) int
step(struct vm *vm, unsigned char op, bool *stop)
{
	const char *s;
	size_t sl;
	uint64_t u;
	flx_pv *a = NULL, *b = NULL, *c = NULL, *a2[2];
	int rc;

	switch (op) {
	case OP_PROTO:
		if ((rc = arg_le(vm, 1, &u)))
			return rc;
		if (u > 5)
			return vm_fail(vm, -EINVAL,
				       "unsupported protocol %" PRIu64, u);
		return 0;
	case OP_FRAME:
		if ((rc = arg_le(vm, 8, &u)))
			return rc;
		/* Frames only group opcodes for buffered reading; the
		 * content is parsed as if unframed, but a frame claiming
		 * more than what is left means a damaged file. */
		if (u > left(vm))
			return vm_fail(vm, -EINVAL,
				       "frame of %" PRIu64
				       " bytes runs past the end (%" PRIu64
				       " left)",
				       u, left(vm));
		return 0;
	case OP_STOP:
		if ((rc = pop(vm, &a)))
			return rc;
		vm->p->root = a;
		vm->p->end = at(vm);
		*stop = true;
		return 0;

	case OP_MARK:
		if ((rc = push_mark(vm)))
			return rc;
		batch_start(vm);
		return drop_mark(vm);
	case OP_POP:
		/* CPython: POP right after MARK discards the mark. */
		if (vm->nmarks && vm->marks[vm->nmarks - 1] == vm->sp) {
			vm->nmarks--;
			set_fence(vm);
			if (vm->nmarks < vm->young_nmarks)
				vm->young = false;
			return 0;
		}
		return pop(vm, &a);
	case OP_POP_MARK: {
		size_t start = 0;

		if ((rc = pop_mark(vm, &start)))
			return rc;
		vm->sp = start;
		return 0;
	}
	case OP_DUP:
		if ((rc = top(vm, &a)))
			return rc;
		return push_again(vm, a);

	case OP_MEMOIZE:
		if ((rc = top(vm, &a)))
			return rc;
		return memo_put(vm, vm->memo_count, a);
	case OP_BINPUT:
		if ((rc = arg_le(vm, 1, &u)) || (rc = top(vm, &a)))
			return rc;
		return memo_put(vm, u, a);
	case OP_LONG_BINPUT:
		if ((rc = arg_le(vm, 4, &u)) || (rc = top(vm, &a)))
			return rc;
		return memo_put(vm, u, a);
	case OP_PUT:
	case OP_GET: {
		bool neg, big;

		if ((rc = arg_line(vm, &s, &sl)))
			return rc;
		if (!parse_dec(s, sl, &u, &neg, &big) || neg || big)
			return vm_fail(vm, -EINVAL, "bad memo index");
		if (op == OP_GET)
			return memo_get(vm, u);
		if ((rc = top(vm, &a)))
			return rc;
		return memo_put(vm, u, a);
	}
	case OP_BINGET:
		if ((rc = arg_le(vm, 1, &u)))
			return rc;
		return memo_get(vm, u);
	case OP_LONG_BINGET:
		if ((rc = arg_le(vm, 4, &u)))
			return rc;
		return memo_get(vm, u);

	case OP_NONE:
		return push(vm, new_shared(vm, &vm->none, FLX_PV_NONE));
	case OP_NEWTRUE:
	case OP_NEWFALSE:
		return push(vm, new_bool(vm, op == OP_NEWTRUE));
	case OP_BININT:
		if ((rc = arg_le(vm, 4, &u)))
			return rc;
		return push(vm, new_int(vm, (int32_t)(uint32_t)u));
	case OP_BININT1:
		if ((rc = arg_le(vm, 1, &u)))
			return rc;
		return push(vm, new_int(vm, (int64_t)u));
	case OP_BININT2:
		if ((rc = arg_le(vm, 2, &u)))
			return rc;
		return push(vm, new_int(vm, (int64_t)u));
	case OP_LONG1:
	case OP_LONG4:
		if ((rc = arg_le(vm, op == OP_LONG1 ? 1 : 4, &u)))
			return rc;
		if (op == OP_LONG4 && (u & 0x80000000u))
			return vm_fail(vm, -EINVAL, "negative length");
		if (u > left(vm))
			return truncated(vm, u, "payload");
		return push(vm, new_long(vm, u));
	case OP_INT:
		if ((rc = arg_line(vm, &s, &sl)))
			return rc;
		/* Protocol 0 spells booleans as INT "01"/"00". */
		if (sl == 2 && s[0] == '0' && (s[1] == '0' || s[1] == '1'))
			return push(vm, new_bool(vm, s[1] == '1'));
		return push(vm, new_int_text(vm, s, sl, false));
	case OP_LONG:
		if ((rc = arg_line(vm, &s, &sl)))
			return rc;
		return push(vm, new_int_text(vm, s, sl, true));
	case OP_BINFLOAT: {
		const unsigned char *p;
		double d;

		if ((rc = need(vm, 8, "argument")))
			return rc;
		p = take(vm, 8);
		u = 0;
		for (int i = 0; i < 8; i++)
			u = u << 8 | p[i]; /* big-endian, unlike the rest */
		memcpy(&d, &u, sizeof(d));
		a = new_node(vm, FLX_PV_FLOAT);
		if (a)
			a->u.f = d;
		return push(vm, a);
	}
	case OP_FLOAT:
		if ((rc = arg_line(vm, &s, &sl)))
			return rc;
		return push(vm, new_float_text(vm, s, sl));

	case OP_SHORT_BINUNICODE:
		return op_sized(vm, 1, false, FLX_PV_STR);
	case OP_BINUNICODE:
		return op_sized(vm, 4, false, FLX_PV_STR);
	case OP_BINUNICODE8:
		return op_sized(vm, 8, false, FLX_PV_STR);
	case OP_SHORT_BINSTRING:
		return op_sized(vm, 1, false, FLX_PV_STR);
	case OP_BINSTRING:
		return op_sized(vm, 4, true, FLX_PV_STR);
	case OP_SHORT_BINBYTES:
		return op_sized(vm, 1, false, FLX_PV_BYTES);
	case OP_BINBYTES:
		return op_sized(vm, 4, false, FLX_PV_BYTES);
	case OP_BINBYTES8:
	case OP_BYTEARRAY8:
		return op_sized(vm, 8, false, FLX_PV_BYTES);
	case OP_STRING:
		if ((rc = arg_line(vm, &s, &sl)))
			return rc;
		return push(vm, new_string_text(vm, s, sl));
	case OP_UNICODE:
		if ((rc = arg_line(vm, &s, &sl)))
			return rc;
		return push(vm, new_unicode_text(vm, s, sl));

	case OP_EMPTY_TUPLE:
		return push(vm, new_tuple(vm, NULL, 0));
	case OP_TUPLE1:
	case OP_TUPLE2:
	case OP_TUPLE3:
		return op_tuple_n(vm, (size_t)(op - OP_TUPLE1 + 1));
	case OP_EMPTY_LIST:
		return push(vm, new_node(vm, FLX_PV_LIST));
	case OP_EMPTY_DICT:
		return push(vm, new_node(vm, FLX_PV_DICT));
	case OP_EMPTY_SET:
		return push(vm, new_node(vm, FLX_PV_SET));
	case OP_TUPLE:
	case OP_LIST:
	case OP_DICT:
	case OP_FROZENSET:
	case OP_OBJ:
	case OP_INST:
		return op_from_mark(vm);
	case OP_APPEND:
		if ((rc = pop(vm, &a)) || (rc = top(vm, &b)))
			return rc;
		if (b->kind != FLX_PV_LIST)
			return vm_fail(vm, -EINVAL, "APPEND to a %s",
				       flx_pv_kind_name(b));
		if (lone_to_sink(vm, b))
			return sink_result(vm, sink_take(vm, b, &a, 1));
		return seq_add(vm, b, &a, 1);
	case OP_APPENDS:
		return op_add_seq(vm, FLX_PV_LIST, "APPENDS to");
	case OP_SETITEM:
		if ((rc = pop(vm, &a)) || (rc = pop(vm, &b)) ||
		    (rc = top(vm, &c)))
			return rc;
		if (c->kind != FLX_PV_DICT)
			return vm_fail(vm, -EINVAL, "SETITEM on a %s",
				       flx_pv_kind_name(c));
		a2[0] = b;
		a2[1] = a;
		if (lone_to_sink(vm, c))
			return sink_result(vm, sink_take(vm, NULL, a2, 2));
		if (c == vm->watch_dict && (rc = watched(vm, a2, 1)))
			return rc;
		return dict_add(vm, c, a2, 1);
	case OP_SETITEMS:
		return op_setitems(vm);
	case OP_ADDITEMS:
		return op_add_seq(vm, FLX_PV_SET, "ADDITEMS to");

	case OP_GLOBAL:
		return push(vm, new_global_text(vm));
	case OP_STACK_GLOBAL:
		if ((rc = pop(vm, &b)) || (rc = pop(vm, &a)))
			return rc;
		if (a->kind != FLX_PV_STR || b->kind != FLX_PV_STR)
			return vm_fail(vm, -EINVAL,
				       "module and name must be str");
		if (!a->u.str.s || !b->u.str.s)
			return vm_fail(vm, -EINVAL,
				       "module or name longer than %zu bytes",
				       vm->max_str);
		c = new_node(vm, FLX_PV_GLOBAL);
		if (c) {
			c->u.global.module = a->u.str.s;
			c->u.global.name = b->u.str.s;
		}
		return push(vm, c);
	case OP_REDUCE:
	case OP_NEWOBJ:
		if ((rc = pop(vm, &b)) || (rc = pop(vm, &a)))
			return rc;
		return push(vm, new_obj(vm, a, b, op == OP_NEWOBJ));
	case OP_NEWOBJ_EX:
		if ((rc = pop(vm, &c)) || (rc = pop(vm, &b)) ||
		    (rc = pop(vm, &a)))
			return rc;
		/* The tree has no slot for keyword arguments; dropping them
		 * silently would misdescribe the object. */
		if (c->kind != FLX_PV_DICT || c->u.dict.n)
			return vm_fail(vm, -EINVAL,
				       "keyword arguments are not supported");
		return push(vm, new_obj(vm, a, b, true));
	case OP_BUILD:
		return op_build(vm);
	case OP_PERSID:
		if ((rc = arg_line(vm, &s, &sl)))
			return rc;
		a = new_str(vm, FLX_PV_STR, s, sl, FLX_PV_NO_OFFSET);
		goto persid;
	case OP_BINPERSID:
		if ((rc = pop(vm, &a)))
			return rc;
	persid:
		if (!a)
			return vm->rc ? vm->rc : -ENOMEM;
		b = new_node(vm, FLX_PV_PERSID);
		if (b)
			b->u.persid.pid = a;
		return push(vm, b);

	case OP_EXT1:
	case OP_EXT2:
	case OP_EXT4:
		return vm_fail(vm, -EINVAL,
			       "extension registry codes are not supported");
	case OP_NEXT_BUFFER:
	case OP_READONLY_BUFFER:
		return vm_fail(vm, -EINVAL,
			       "out-of-band buffers are not supported");
	}
	return vm_fail(vm, -EINVAL, "unknown opcode 0x%02x", op);
}

static void set_limits(struct vm *vm, const flx_pickle_limits *lim)
{
	vm->max_nodes = lim && lim->max_nodes ? lim->max_nodes : DEF_MAX_NODES;
	vm->max_stack = lim && lim->max_stack ? lim->max_stack : DEF_MAX_STACK;
	vm->max_depth = lim && lim->max_depth ? lim->max_depth : DEF_MAX_DEPTH;
	vm->max_memo = lim && lim->max_memo ? lim->max_memo : DEF_MAX_MEMO;
	/* a sink load holds the memo slots of the chunks it has not packed
	 * (pack_memo()): max_memo bounds those, and any index up to the
	 * input length may be named */
	vm->max_held = vm->max_memo;
	/* Every value, stack slot and memo slot costs at least one opcode
	 * byte (CPython numbers memo slots densely), so nothing legitimate
	 * exceeds the input length; clamping there keeps memory proportional
	 * to the input whatever indices a hostile pickle names. */
	if (vm->len < SIZE_MAX) {
		if (vm->max_nodes > vm->len + 1)
			vm->max_nodes = (size_t)vm->len + 1;
		if (vm->max_stack > vm->len + 1)
			vm->max_stack = (size_t)vm->len + 1;
		if (vm->max_memo > vm->len + 1)
			vm->max_memo = (size_t)vm->len + 1;
	}
	if (vm->sink && !(lim && lim->max_memo))
		vm->max_memo =
		    vm->len < SIZE_MAX ? (size_t)vm->len + 1 : SIZE_MAX;
	if (!vm->r) { /* a buffer load copies everything */
		vm->window = 0;
		vm->max_copy = SIZE_MAX;
		vm->max_str = SIZE_MAX;
		vm->max_line = SIZE_MAX;
		return;
	}
	vm->window = lim && lim->window ? lim->window : DEF_WINDOW;
	vm->max_copy = lim && lim->max_copy ? lim->max_copy : DEF_MAX_COPY;
	vm->max_str = lim && lim->max_str ? lim->max_str : DEF_MAX_STR;
	if (vm->window > MAX_WINDOW)
		vm->window = MAX_WINDOW;
	vm->ahead = vm->window < AHEAD_MIN ? vm->window : AHEAD_MIN;
	vm->max_line = vm->max_str < MAX_LINE ? vm->max_str : MAX_LINE;
}

/* The VM over whole (the whole input, a buffer load) or else vm->r. */
static int load(struct vm *vm, const unsigned char *whole, flx_pickle **out)
{
	unsigned char op;
	bool stop = false;
	int rc = 0;

	vm->hold = NO_HOLD;
	if (whole) {
		vm->buf = whole;
		vm->wlen = (size_t)vm->len;
	}
	vm->p = calloc(1, sizeof(*vm->p));
	if (!vm->p)
		return flx_error_set(vm->err, -ENOMEM, vm->name, NULL,
				     "pickle: out of memory");
	/* The tree takes a few times the input: small blocks for a small
	 * pickle, huge ones from the start for a large one. */
	vm->p->next_size = ARENA_FIRST_BLOCK;
	while (vm->p->next_size < ARENA_MAX_BLOCK && vm->p->next_size < vm->len)
		vm->p->next_size *= 2;
	while (!stop) {
		if (vm->pos == vm->wlen) {
			vm->op_off = at(vm);
			vm->op = 0;
			if (vm->op_off == vm->len) {
				rc = vm_fail(vm, -EINVAL,
					     "truncated: no STOP opcode");
				break;
			}
			if ((rc = refill(vm, 1)))
				break;
		}
		vm->op_off = at(vm);
		op = vm->buf[vm->pos++];
		vm->op = op;
		rc = step(vm, op, &stop);
		if (!rc && vm->drop_v)
			rc = drop_close(vm);
		if (rc)
			break;
	}
	free(vm->wbuf);
	free(vm->stack);
	free(vm->marks);
	memo_free(vm);
	free(vm->ints);
	free(vm->tuples);
	free(vm->sizes);
	free(vm->ylog);
	free(vm->tk);
	free(vm->keeps);
	free(vm->kstr);
	free(vm->mv);
	if (vm->packed)
		for (size_t c = 0; c <= vm->max_memo / MEMO_CHUNK; c++)
			free(vm->packed[c]);
	free(vm->packed);
	free(vm->pk_v);
	free(vm->dl);
	if (vm->cloc)
		freelocale(vm->cloc);
	if (rc) {
		flx_pickle_free(vm->p);
		return rc;
	}
	*out = vm->p;
	return 0;
}

int flx_pickle_load(const void *buf, size_t len, const char *name,
		    const flx_pickle_limits *lim, flx_pickle **out,
		    flx_error *err)
{
	struct vm vm = {.len = len, .name = name, .err = err};

	if (!buf && len)
		return flx_error_set(err, -EINVAL, name, NULL,
				     "pickle: no input");
	set_limits(&vm, lim);
	return load(&vm, buf, out);
}

int flx_pickle_load_reader(const flx_reader *r, const char *name,
			   const flx_pickle_limits *lim, flx_pickle **out,
			   flx_error *err)
{
	struct vm vm = {.len = r->size, .r = r, .name = name, .err = err};

	set_limits(&vm, lim);
	return load(&vm, NULL, out);
}

int flx_pickle_load_sink(const flx_reader *r, const char *name,
			 const flx_pickle_limits *lim,
			 const flx_pickle_sink *sink, flx_pickle **out,
			 flx_error *err)
{
	struct vm vm = {
	    .len = r->size, .r = r, .name = name, .err = err, .sink = sink};

	set_limits(&vm, lim);
	return load(&vm, NULL, out);
}

const flx_pv *flx_pickle_sink_dict(const flx_pickle *p)
{
	return p ? p->sink_dict : NULL;
}

bool flx_pv_streamed(const flx_pv *v)
{
	return v && v->kind == FLX_PV_LIST && v->sunk_;
}

const flx_pv *flx_pickle_root(const flx_pickle *p)
{
	return p ? p->root : NULL;
}

uint64_t flx_pickle_end(const flx_pickle *p)
{
	return p ? p->end : 0;
}

void flx_pickle_free(flx_pickle *p)
{
	struct arena_blk *b, *next;

	if (!p)
		return;
	flx_pickle_free(p->side);
	for (b = p->blocks; b; b = next) {
		next = b->next;
		free(b);
	}
	free(p->spare);
	free(p);
}

/* ----------------------------------------------------------------- helpers */

const flx_pv *flx_pv_dict_get(const flx_pv *dict, const char *key)
{
	size_t kl;

	if (!dict || !key || dict->kind != FLX_PV_DICT)
		return NULL;
	kl = strlen(key);
	/* From the end: a repeated key behaves as in Python (last wins). */
	for (size_t i = dict->u.dict.n; i-- > 0;) {
		const flx_pv *k = dict->u.dict.kv[2 * i];

		if (k->kind == FLX_PV_STR && k->u.str.len == kl && k->u.str.s &&
		    memcmp(k->u.str.s, key, kl) == 0)
			return dict->u.dict.kv[2 * i + 1];
	}
	return NULL;
}

bool flx_pv_is_global(const flx_pv *v, const char *module, const char *name)
{
	if (!v || v->kind != FLX_PV_GLOBAL || !name)
		return false;
	if (strcmp(v->u.global.name, name) != 0)
		return false;
	return !module || strcmp(v->u.global.module, module) == 0;
}

const flx_pv *flx_pv_obj_class(const flx_pv *v)
{
	if (!v || v->kind != FLX_PV_OBJ || !v->u.obj.cls ||
	    v->u.obj.cls->kind != FLX_PV_GLOBAL)
		return NULL;
	return v->u.obj.cls;
}

bool flx_pv_is_obj_of(const flx_pv *v, const char *name)
{
	return flx_pv_is_global(flx_pv_obj_class(v), NULL, name);
}

const char *flx_pv_str(const flx_pv *v)
{
	return v && v->kind == FLX_PV_STR ? v->u.str.s : NULL;
}

bool flx_pv_payload(const flx_pv *v, uint64_t *off, size_t *len)
{
	if (!v || (v->kind != FLX_PV_STR && v->kind != FLX_PV_BYTES) ||
	    v->u.str.off == FLX_PV_NO_OFFSET)
		return false;
	if (off)
		*off = v->u.str.off;
	if (len)
		*len = v->u.str.len;
	return true;
}

bool flx_pv_int(const flx_pv *v, int64_t *out)
{
	if (!v || !out)
		return false;
	if (v->kind == FLX_PV_INT)
		*out = v->u.i;
	else if (v->kind == FLX_PV_BOOL)
		*out = v->u.b;
	else
		return false;
	return true;
}

const flx_pv *flx_pv_item(const flx_pv *v, size_t i)
{
	if (!v || (v->kind != FLX_PV_TUPLE && v->kind != FLX_PV_LIST) ||
	    i >= v->u.seq.n)
		return NULL;
	return v->u.seq.v[i];
}

size_t flx_pv_len(const flx_pv *v)
{
	if (!v)
		return 0;
	switch (v->kind) {
	case FLX_PV_TUPLE:
	case FLX_PV_LIST:
	case FLX_PV_SET:
		return v->u.seq.n;
	case FLX_PV_DICT:
		return v->u.dict.n;
	default:
		return 0;
	}
}

const char *flx_pv_kind_name(const flx_pv *v)
{
	static const char *const names[] = {
	    [FLX_PV_NONE] = "None",   [FLX_PV_BOOL] = "bool",
	    [FLX_PV_INT] = "int",     [FLX_PV_BIGINT] = "big int",
	    [FLX_PV_FLOAT] = "float", [FLX_PV_STR] = "str",
	    [FLX_PV_BYTES] = "bytes", [FLX_PV_TUPLE] = "tuple",
	    [FLX_PV_LIST] = "list",   [FLX_PV_SET] = "set",
	    [FLX_PV_DICT] = "dict",   [FLX_PV_GLOBAL] = "global",
	    [FLX_PV_OBJ] = "object",  [FLX_PV_PERSID] = "persistent id",
	};

	if (!v)
		return "nothing";
	if ((unsigned)v->kind >= sizeof(names) / sizeof(names[0]))
		return "?";
	return names[v->kind];
}
