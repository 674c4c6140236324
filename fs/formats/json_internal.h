/* SPDX-License-Identifier: MIT */
#ifndef FLX_FS_FORMATS_JSON_INTERNAL_H
#define FLX_FS_FORMATS_JSON_INTERNAL_H

/*
 * The streaming JSON writer of the generated formats (index.json, the
 * safetensors headers, the hf/ index), writing into a window.
 *
 * The text is exactly what jansson's json_dumps() writes for the same
 * values: members in insertion order, its separators and indentation, its
 * string escapes (\uXXXX in upper case, UTF-16 surrogate pairs) and its
 * integer format; tests/unit/test_formats.c checks it against jansson.
 * It is written by hand rather than built as jansson trees and dumped
 * because a piece must be regenerated alone, at read time, without
 * allocating.
 *
 * Output goes to a window: of the bytes generated, those at [lo, hi) are
 * copied to dst, the rest only counted (lo == hi: sizing).  A writer lives
 * on the stack of one generator call.
 */

#include "json.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct flx_jw {
	unsigned char *dst;
	uint64_t lo, hi;
	uint64_t pos;
	int indent; /* spaces per level; 0: compact */
	int depth;
	uint64_t has; /* bit d: the container at depth d has a member */
	/* strings at the current level escape non-ASCII (JSON_ENSURE_ASCII) */
	bool ascii;
	/* the bytes written are the value of a JSON string of the enclosing
	 * document (a JSON text kept as a string) and are escaped as such,
	 * non-ASCII as \uXXXX */
	bool quoted;
	bool plain_names; /* see flx_gen_ctx */
	int err;	  /* the first error, -errno */
} flx_jw;

/* A writer of the window [lo, hi) into dst. */
static inline flx_jw flx_jw_window(unsigned char *dst, uint64_t lo, uint64_t hi)
{
	return (flx_jw){.dst = dst, .lo = lo, .hi = hi};
}

/* n bytes, verbatim. */
static inline void flx_jw_raw(flx_jw *w, const void *s, size_t n)
{
	uint64_t a = w->pos, b = w->pos + n;

	if (b > w->lo && a < w->hi) {
		uint64_t from = a > w->lo ? a : w->lo;
		uint64_t to = b < w->hi ? b : w->hi;

		memcpy(w->dst + (from - w->lo),
		       (const unsigned char *)s + (from - a),
		       (size_t)(to - from));
	}
	w->pos = b;
}

/* Whether the writer only measures (an empty window). */
static inline bool flx_jw_sizing(const flx_jw *w)
{
	return w->hi <= w->lo;
}

/** n spaces, verbatim. */
void flx_jw_spaces(flx_jw *w, uint64_t n);

/** The opening or closing quote of a string at the current level. */
void flx_jw_quote(flx_jw *w);

/** A JSON string value or key at the current level (NULL: -EINVAL). */
void flx_jw_str(flx_jw *w, const char *s);

/** A tensor name (FQN or target name): as flx_jw_str(), copied whole
 * when the checkpoint's names are all plain. */
void flx_jw_name(flx_jw *w, const char *s);

void flx_jw_int(flx_jw *w, int64_t v);

/** v, or null when v < 0. */
void flx_jw_int_or_null(flx_jw *w, int v);

/** An array of n integers. */
void flx_jw_ints(flx_jw *w, int n, const int64_t *v);

/*
 * The structure of the text, inline: every token of a generated file goes
 * through them, at mount (sizing) and on every read.
 */

/** Plain ASCII without quotes or backslashes (the same at every level). */
static inline void flx_jw_lit(flx_jw *w, const char *s)
{
	flx_jw_raw(w, s, strlen(s));
}

/** Newline and indentation to depth (nothing when compact). */
static inline void flx_jw_newline(flx_jw *w, int depth)
{
	if (!w->indent)
		return;
	flx_jw_raw(w, "\n", 1);
	flx_jw_spaces(w, (uint64_t)depth * (uint64_t)w->indent);
}

/** Open an object ('{') or array ('['). */
static inline void flx_jw_open(flx_jw *w, char c)
{
	flx_jw_raw(w, &c, 1);
	w->depth++;
	w->has &= ~(1ull << w->depth);
}

/** Close an object ('}') or array (']'). */
static inline void flx_jw_close(flx_jw *w, char c)
{
	if (w->has >> w->depth & 1)
		flx_jw_newline(w, w->depth - 1);
	w->depth--;
	flx_jw_raw(w, &c, 1);
}

/** Start a member or element: separator, then indentation. */
static inline void flx_jw_item(flx_jw *w)
{
	if (w->has >> w->depth & 1)
		flx_jw_raw(w, ",", 1);
	w->has |= 1ull << w->depth;
	flx_jw_newline(w, w->depth);
}

/** After a key. */
static inline void flx_jw_colon(flx_jw *w)
{
	if (w->indent)
		flx_jw_raw(w, ": ", 2);
	else
		flx_jw_raw(w, ":", 1);
}

/** A member's key: separator, indentation, the key, the colon. */
static inline void flx_jw_key(flx_jw *w, const char *k)
{
	flx_jw_item(w);
	flx_jw_str(w, k);
	flx_jw_colon(w);
}

/** A key that is a tensor name (see flx_jw_name()). */
static inline void flx_jw_key_name(flx_jw *w, const char *k)
{
	flx_jw_item(w);
	flx_jw_name(w, k);
	flx_jw_colon(w);
}

/**
 * Resume inside a document, for a piece that continues it: the
 * containers at depths 1..depth are open, all but the innermost have
 * members, the innermost has one if more.
 */
static inline void flx_jw_resume(flx_jw *w, int depth, bool more)
{
	w->depth = depth;
	w->has = ((1ull << depth) - 1) & ~1ull;
	if (more)
		w->has |= 1ull << depth;
}

/** The piece's result: 0 and *len, its length, or the first error. */
static inline int flx_jw_end(const flx_jw *w, uint64_t *len)
{
	*len = w->pos;
	return w->err;
}

#endif
