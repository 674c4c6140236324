/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_H
#define FLX_FS_FORMATS_H

/*
 * The bytes of the synthetic files (index.json, safetensors headers, the
 * hf/ weight map, .npy headers), generated on demand.
 *
 * A mount of a large checkpoint has tens of thousands of such files and
 * megabytes of JSON, most of which is never read.  So the text is never
 * stored: each file is cut into pieces that can be generated on their own
 * (the head of index.json, one tensor's member, a batch of safetensors
 * entries, ...), the build runs every piece once in counting mode to learn
 * its exact length, and a read runs the pieces it touches again, keeping
 * only the bytes it asked for.  Generation allocates nothing and depends
 * only on the immutable checkpoint and plan, so any number of threads may
 * read at once.
 *
 * The text is exactly what jansson's json_dumps() writes for the same
 * values (index.json: JSON_INDENT(1); safetensors headers: JSON_COMPACT |
 * JSON_ENSURE_ASCII, the "flexfs" metadata being a JSON_COMPACT dump; the
 * hf/ index: JSON_INDENT(2)): members in insertion order, jansson's string
 * escapes (\uXXXX in upper case, UTF-16 surrogate pairs) and integer
 * format.  tests/unit/test_formats.c checks it against jansson itself.
 */

#include "plan.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest file name (bytes, without the NUL). */
#define FLX_NAME_MAX 255

/* Tensors per generated piece of a safetensors header or the hf/ index:
 * few pieces to store, little to regenerate for a partial read. */
#define FLX_GEN_BATCH 32

/* What every generator reads. */
typedef struct flx_gen_ctx {
	const flx_plan *plan;
	/* every tensor FQN is printable ASCII without " or \ (so are the
	 * target names, which only change layer digits): names need no
	 * escape and are copied whole */
	bool plain_names;
} flx_gen_ctx;

typedef enum flx_gen_kind {
	/* index.json; arg: the flx_gen_ctx */
	FLX_GEN_INDEX_HEAD,   /* up to the opening brace of "tensors" */
	FLX_GEN_INDEX_TENSOR, /* idx: that tensor's member */
	FLX_GEN_INDEX_MID,    /* closes "tensors", opens "objects" */
	FLX_GEN_INDEX_OBJECT, /* idx: that object's member */
	FLX_GEN_INDEX_TAIL,
	/* a safetensors header; arg: its flx_st_file */
	FLX_GEN_ST_HEAD,     /* u64 length, then up to the metadata's
			      * "tensors" (ranks/) or past __metadata__ */
	FLX_GEN_ST_META,     /* idx: first of a batch of the "flexfs"
			      * metadata's tensors, in plan order */
	FLX_GEN_ST_META_END, /* closes the metadata */
	FLX_GEN_ST_ENTRY,    /* idx: first of a batch of tensor entries,
			      * in data order */
	FLX_GEN_ST_END,	     /* closing brace and the space padding */
	/* hf/model.safetensors.index.json; arg: its flx_hf_index */
	FLX_GEN_HFIDX_HEAD,
	FLX_GEN_HFIDX_ENTRY, /* idx: first of a batch of weight_map entries */
	FLX_GEN_HFIDX_TAIL,
} flx_gen_kind;

/* One tensor of safetensors files. */
typedef struct flx_st_entry {
	const char *name; /* its name in the file (borrowed from the plan) */
	const flx_placement *pl;
	uint32_t shard; /* hf/: shard number, from 0 */
	uint32_t esz;	/* element size */
} flx_st_entry;

/*
 * The tensors of a safetensors file, shared by the files of one stage's
 * TP ranks (same names, same order; each reads its own views).  Entries
 * in plan order; order[k] is the k-th in data order (element size
 * descending, then name, as the safetensors writer orders them).
 */
typedef struct flx_st_set {
	size_t n;
	flx_st_entry *e;
	uint32_t *order;
} flx_st_set;

/* A safetensors file. */
typedef struct flx_st_file {
	const flx_gen_ctx *ctx;
	int tp, pp; /* the rank of a ranks/ file; pp < 0: hf/, whole views
		     * and no "flexfs" metadata */
	const flx_st_set *set;
	uint64_t *boff; /* data offset of each FLX_GEN_BATCH-th entry in
			 * data order (from the end of the header) */
	uint64_t hlen;	/* the header's length prefix: JSON + padding */
	uint64_t pad;	/* spaces after the closing brace */
} flx_st_file;

/* hf/model.safetensors.index.json. */
typedef struct flx_hf_index {
	const flx_gen_ctx *ctx;
	size_t n;
	const flx_st_entry *e; /* plan order, each with its shard */
	size_t nshards;
	uint64_t total; /* bytes of all tensors */
} flx_hf_index;

/**
 * Generate piece (kind, arg, idx) and copy its bytes [lo, hi) to dst
 * (dst[0] is byte lo; bytes past the end are not written).  lo == hi
 * only measures.
 * @return 0 and *len, the piece's whole length; -EINVAL if a string in it
 *         is not UTF-8 (JSON cannot carry it), -ENAMETOOLONG for an
 *         object name too long for a file name.
 */
int flx_gen(flx_gen_kind kind, const void *arg, uint32_t idx,
	    unsigned char *dst, uint64_t lo, uint64_t hi, uint64_t *len);

/**
 * The .npy header of view v (v1, or v2 past 64 KiB, data at a multiple of
 * 64), windowed as flx_gen().  @return 0 and *len.
 */
int flx_npy_header(const flx_view *v, unsigned char *dst, uint64_t lo,
		   uint64_t hi, uint64_t *len);

/** Sort the entries of s into data order (fills s->order). */
void flx_st_sort(flx_st_set *s);

/** The view entry e stands for in file f. */
const flx_view *flx_st_view(const flx_st_file *f, const flx_st_entry *e);

/** Fill f->boff (room for n / FLX_GEN_BATCH + 1) from its set's order.
 * @return the size of the data. */
uint64_t flx_st_offsets(flx_st_file *f);

/** Whether s is UTF-8 as jansson accepts it (no overlong forms, no
 * surrogates, nothing past U+10FFFF). */
bool flx_utf8_valid(const char *s);

/** Whether s is printable ASCII without " or \ (JSON needs no escape). */
bool flx_json_plain(const char *s);

/**
 * File name for a tensor name: '/' and '%' percent-escaped, "." and ".."
 * escaped, suffix appended, into out (FLX_NAME_MAX + 1 bytes).
 * @return its length, or -ENAMETOOLONG.
 */
int flx_file_name(const char *fqn, const char *suffix, char *out);

#endif
