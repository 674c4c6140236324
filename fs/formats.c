/* SPDX-License-Identifier: MIT */
/*
 * Bytes of the synthetic file formats, generated piece by piece; see
 * formats.h for why.
 *
 * The JSON is written by hand with a small streaming writer rather than
 * built as jansson trees and dumped: a tree per tensor per rank (640,000
 * objects for 10,000 tensors at tp=8, pp=8) cost most of the mount's time
 * and memory, and a piece must be regenerated alone at read time without
 * allocating.  The writer mirrors jansson's dump.c exactly (separators,
 * indentation, escapes), which tests/unit/test_formats.c checks.
 */
#include "formats.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---- the writer ---- */

/*
 * Output goes to a window: of the bytes generated, those at [lo, hi) are
 * copied to dst, the rest only counted.  quoted: the bytes being written
 * are the value of a JSON string of the enclosing document (the "flexfs"
 * metadata inside a safetensors header) and are escaped as such, with
 * non-ASCII as \uXXXX; ascii: strings at the current level escape
 * non-ASCII too.  has: bit d set when the container at depth d already
 * has a member (for the separator and the closing indentation).
 */
typedef struct jw {
	unsigned char *dst;
	uint64_t lo, hi;
	uint64_t pos;
	int indent; /* spaces per level; 0: compact */
	int depth;
	uint64_t has;
	bool ascii;
	bool quoted;
	bool plain_names; /* see flx_gen_ctx */
	int err;
} jw;

static inline void put_raw(jw *w, const void *s, size_t n)
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

/*
 * Decode the UTF-8 sequence at s (n bytes left), as jansson's
 * utf8_iterate() does.  @return its length, 0 if invalid.
 */
static size_t utf8_next(const unsigned char *s, size_t n, int32_t *cp)
{
	unsigned char u = s[0];
	size_t k;
	int32_t v;

	if (u < 0x80) {
		*cp = u;
		return 1;
	}
	if (u >= 0xC2 && u <= 0xDF) {
		k = 2;
		v = u & 0x1F;
	} else if (u >= 0xE0 && u <= 0xEF) {
		k = 3;
		v = u & 0xF;
	} else if (u >= 0xF0 && u <= 0xF4) {
		k = 4;
		v = u & 0x7;
	} else {
		return 0;
	}
	if (k > n)
		return 0;
	for (size_t i = 1; i < k; i++) {
		if (s[i] < 0x80 || s[i] > 0xBF)
			return 0;
		v = (v << 6) + (s[i] & 0x3F);
	}
	if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) ||
	    (k == 3 && v < 0x800) || (k == 4 && v < 0x10000))
		return 0;
	*cp = v;
	return k;
}

bool flx_utf8_valid(const char *s)
{
	size_t n = strlen(s);

	while (n) {
		int32_t cp;
		size_t k = utf8_next((const unsigned char *)s, n, &cp);

		if (!k)
			return false;
		s += k;
		n -= k;
	}
	return true;
}

static const char hexdig[] = "0123456789ABCDEF";

static size_t u4(char *o, unsigned v)
{
	o[0] = '\\';
	o[1] = 'u';
	o[2] = hexdig[(v >> 12) & 15];
	o[3] = hexdig[(v >> 8) & 15];
	o[4] = hexdig[(v >> 4) & 15];
	o[5] = hexdig[v & 15];
	return 6;
}

/* The escape jansson writes for a code point that needs one (", \,
 * controls, and non-ASCII under ensure_ascii). */
static size_t escape_cp(char *o, int32_t cp)
{
	static const char short_esc[] = "\"\"\\\\\bb\ff\nn\rr\tt";

	for (size_t i = 0; i < sizeof(short_esc) - 1; i += 2)
		if (cp == short_esc[i]) {
			o[0] = '\\';
			o[1] = short_esc[i + 1];
			return 2;
		}
	if (cp < 0x10000)
		return u4(o, (unsigned)cp);
	cp -= 0x10000;
	u4(o, 0xD800 | ((unsigned)(cp & 0xffc00) >> 10));
	u4(o + 6, 0xDC00 | (unsigned)(cp & 0x3ff));
	return 12;
}

/* ASCII that needs no escape at any level. */
static inline bool plain(unsigned char c)
{
	return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

/* The opening or closing quote of a string at the current level. */
static void jw_quote(jw *w)
{
	if (w->quoted)
		put_raw(w, "\\\"", 2);
	else
		put_raw(w, "\"", 1);
}

/*
 * A JSON string value (or key) at the current level.  Plain ASCII needs
 * no escape at either level.  An escape of this level (\", \n, \u001F),
 * when quoted, is escaped again by the enclosing document; non-ASCII is
 * kept as is here unless ensure_ascii, but always escaped when quoted
 * (the enclosing document is ensure_ascii).  Sequences are decoded with
 * at most 4 bytes of look-ahead, which stops at the NUL (not a
 * continuation byte), so s is never read past its end.
 */
static void jw_str(jw *w, const char *s)
{
	const unsigned char *p, *run;

	if (!s) {
		w->err = -EINVAL;
		return;
	}
	p = run = (const unsigned char *)s;
	if (w->hi <= w->lo) {
		/* sizing: a plain string is its length and two quotes (each
		 * escaped when quoted) */
		while (plain(*p))
			p++;
		if (!*p) {
			w->pos += (uint64_t)(p - run) + (w->quoted ? 4 : 2);
			return;
		}
		p = run;
	}
	jw_quote(w);
	for (;;) {
		char esc[12];
		int32_t cp;
		size_t k, n;

		while (plain(*p))
			p++;
		if (!*p)
			break;
		k = utf8_next(p, 4, &cp);
		if (!k) {
			w->err = -EINVAL;
			return;
		}
		if (cp >= 0x80 && !w->ascii && !w->quoted) {
			p += k; /* kept as is, once checked */
			continue;
		}
		put_raw(w, run, (size_t)(p - run));
		n = escape_cp(esc, cp);
		if (w->quoted && cp < 0x80) {
			/* escape the escape: its \ and " */
			for (size_t i = 0; i < n; i++) {
				if (esc[i] == '\\' || esc[i] == '"')
					put_raw(w, "\\", 1);
				put_raw(w, esc + i, 1);
			}
		} else {
			put_raw(w, esc, n);
		}
		p += k;
		run = p;
	}
	put_raw(w, run, (size_t)(p - run));
	jw_quote(w);
}

bool flx_json_plain(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	while (plain(*p))
		p++;
	return !*p;
}

/* A tensor name (FQN or target name): as jw_str(), copied whole when the
 * checkpoint's names are all plain. */
static void jw_name(jw *w, const char *s)
{
	if (!w->plain_names) {
		jw_str(w, s);
		return;
	}
	jw_quote(w);
	put_raw(w, s, strlen(s));
	jw_quote(w);
}

/*
 * v in decimal at o, at least width digits (zero-padded), as printf's
 * %0*lld (and %lld, jansson's format for integers, with width 1), without
 * its cost: index.json alone has hundreds of thousands of numbers.
 * @return its length (at most 20).
 */
static size_t fmt_int(char *o, int64_t v, int width)
{
	char b[24];
	size_t i = sizeof(b), n;
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;

	do {
		b[--i] = (char)('0' + u % 10);
		u /= 10;
	} while (u || (int)(sizeof(b) - i) < width);
	if (v < 0)
		b[--i] = '-';
	n = sizeof(b) - i;
	memcpy(o, b + i, n);
	return n;
}

/* Decimal length of v, as fmt_int(o, v, 1) would write it. */
static size_t int_len(int64_t v)
{
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
	size_t n = v < 0 ? 2 : 1;

	for (; u >= 10000; u /= 10000)
		n += 4;
	return n + (u >= 10) + (u >= 100) + (u >= 1000);
}

static void jw_int(jw *w, int64_t v)
{
	char b[24];

	/* sizing a file (an empty window) needs only the length: the mount
	 * sizes every header of every rank this way */
	if (w->hi <= w->lo) {
		w->pos += int_len(v);
		return;
	}
	put_raw(w, b, fmt_int(b, v, 1));
}

/* Plain ASCII without quotes or backslashes: the same at every level. */
static void jw_lit(jw *w, const char *s)
{
	put_raw(w, s, strlen(s));
}

/* Newline and indentation to depth (nothing when compact). */
static void jw_nl(jw *w, int depth)
{
	static const char spaces[] = "                                ";
	size_t n;

	if (!w->indent)
		return;
	put_raw(w, "\n", 1);
	for (n = (size_t)depth * (size_t)w->indent; n;) {
		size_t k = n < sizeof(spaces) - 1 ? n : sizeof(spaces) - 1;

		put_raw(w, spaces, k);
		n -= k;
	}
}

static void jw_open(jw *w, char c)
{
	put_raw(w, &c, 1);
	w->depth++;
	w->has &= ~(1ull << w->depth);
}

static void jw_close(jw *w, char c)
{
	if (w->has >> w->depth & 1)
		jw_nl(w, w->depth - 1);
	w->depth--;
	put_raw(w, &c, 1);
}

/* Start a member or element: separator, then indentation. */
static void jw_item(jw *w)
{
	if (w->has >> w->depth & 1)
		put_raw(w, ",", 1);
	w->has |= 1ull << w->depth;
	jw_nl(w, w->depth);
}

/* After a key. */
static void jw_colon(jw *w)
{
	if (w->indent)
		put_raw(w, ": ", 2);
	else
		put_raw(w, ":", 1);
}

static void jw_key(jw *w, const char *k)
{
	jw_item(w);
	jw_str(w, k);
	jw_colon(w);
}

/* A key that is a tensor name (see jw_name()). */
static void jw_key_name(jw *w, const char *k)
{
	jw_item(w);
	jw_name(w, k);
	jw_colon(w);
}

static void jw_ints(jw *w, int n, const int64_t *v)
{
	jw_open(w, '[');
	for (int i = 0; i < n; i++) {
		jw_item(w);
		jw_int(w, v[i]);
	}
	jw_close(w, ']');
}

static void jw_int_or_null(jw *w, int v)
{
	if (v < 0)
		jw_lit(w, "null");
	else
		jw_int(w, v);
}

/*
 * Resume inside a document: the containers at depths 1..depth are open,
 * all but the innermost have members, the innermost has one if more.
 */
static void jw_resume(jw *w, int depth, bool more)
{
	w->depth = depth;
	w->has = ((1ull << depth) - 1) & ~1ull;
	if (more)
		w->has |= 1ull << depth;
}

/* ---- index.json ---- */

/* "tp%02d_pp%02d" */
static void rank_dir_name(char *buf, int tp, int pp)
{
	char *o = buf;

	memcpy(o, "tp", 2);
	o += 2 + fmt_int(o + 2, tp, 2);
	memcpy(o, "_pp", 3);
	o += 3 + fmt_int(o + 3, pp, 2);
	*o = '\0';
}

static void index_head(jw *w, const flx_plan *p)
{
	const flx_ckpt *c = p->ckpt;
	const flx_spec *s = p->spec;
	uint64_t bytes = 0;

	for (size_t i = 0; i < c->nfiles; i++)
		bytes += c->files[i].data ? c->files[i].size : 0;
	jw_open(w, '{');
	jw_key(w, "flexfs_version");
	jw_str(w, "0.1.0");
	jw_key(w, "source");
	jw_open(w, '{');
	jw_key(w, "format");
	jw_str(w, c->format);
	jw_key(w, "writer");
	jw_str(w, c->writer);
	jw_key(w, "dir");
	jw_str(w, c->dir);
	jw_key(w, "tensors");
	jw_int(w, (int64_t)c->ntensors);
	jw_key(w, "objects");
	jw_int(w, (int64_t)c->nobjects);
	jw_key(w, "files");
	jw_int(w, (int64_t)c->nfiles);
	jw_key(w, "bytes");
	jw_int(w, (int64_t)bytes);
	jw_key(w, "layers");
	jw_int(w, p->nlayers);
	jw_close(w, '}');
	jw_key(w, "target");
	jw_open(w, '{');
	jw_key(w, "tp");
	jw_int(w, s->tp);
	jw_key(w, "pp");
	jw_int(w, s->pp);
	jw_key(w, "rules");
	if (s->rules_path)
		jw_str(w, s->rules_path);
	else
		jw_lit(w, "null");
	jw_key(w, "layer_regex");
	jw_str(w, s->layer_regex);
	jw_key(w, "embed_regex");
	jw_str(w, s->embed_regex);
	jw_key(w, "pp_renumber");
	jw_lit(w, s->pp_renumber ? "true" : "false");
	jw_key(w, "hf_shard_size");
	jw_int(w, (int64_t)s->hf_shard_size);
	jw_close(w, '}');
	jw_key(w, "tensors");
	jw_open(w, '{');
}

static bool st_representable(const flx_tensor *t)
{
	return flx_dtype_get(t->dtype)->safetensors != NULL;
}

static void index_tensor(jw *w, const flx_plan *p, size_t i)
{
	const flx_placement *pl = &p->p[i];
	const flx_tensor *t = pl->src;

	jw_resume(w, 2, i > 0);
	jw_key_name(w, t->fqn);
	jw_open(w, '{');
	jw_key(w, "dtype");
	jw_str(w, flx_dtype_name(t->dtype));
	jw_key(w, "shape");
	jw_ints(w, t->ndim, t->shape);
	jw_key(w, "split_axis");
	jw_int_or_null(w, pl->split);
	jw_key(w, "source_chunks");
	jw_int(w, t->nchunks);
	jw_key(w, "layer");
	jw_int_or_null(w, pl->layer);
	jw_key(w, "stage_lo");
	jw_int(w, pl->stage_lo);
	jw_key(w, "stage_hi");
	jw_int(w, pl->stage_hi);
	jw_key(w, "npy_dtype");
	jw_str(w, flx_dtype_get(t->dtype)->npy);
	jw_key(w, "in_safetensors");
	jw_lit(w, st_representable(t) ? "true" : "false");
	jw_key(w, "placement");
	jw_open(w, '{');
	/* rank directories in the order they are built: stage, then rank */
	for (int pp = pl->stage_lo; pp <= pl->stage_hi; pp++) {
		for (int tp = 0; tp < p->spec->tp; tp++) {
			const flx_box *b = flx_view_box(pl->views[tp]);
			char dname[32];

			rank_dir_name(dname, tp, pp);
			jw_key(w, dname);
			jw_open(w, '{');
			jw_key(w, "name");
			jw_name(w, flx_placement_name(pl, pp));
			jw_key(w, "offset");
			jw_ints(w, t->ndim, b->off);
			jw_key(w, "shape");
			jw_ints(w, t->ndim, b->size);
			jw_close(w, '}');
		}
	}
	jw_close(w, '}');
	jw_close(w, '}');
}

static void index_object(jw *w, const flx_plan *p, size_t j)
{
	const flx_ckpt *c = p->ckpt;
	const flx_object *o = &c->objects[j];
	char path[sizeof("objects/") + FLX_NAME_MAX];
	int n;

	memcpy(path, "objects/", 8);
	n = flx_file_name(o->fqn, ".pt", path + 8);
	if (n < 0) {
		w->err = n;
		return;
	}
	jw_resume(w, 2, j > 0);
	jw_key(w, o->fqn);
	jw_open(w, '{');
	jw_key(w, "path");
	jw_str(w, path);
	jw_key(w, "bytes");
	jw_int(w, (int64_t)o->len);
	jw_key(w, "file");
	jw_str(w, c->files[o->file].relpath);
	jw_close(w, '}');
}

/* ---- safetensors headers ---- */

static void st_head(jw *w, const flx_st_file *f)
{
	unsigned char len[8];

	for (int i = 0; i < 8; i++)
		len[i] = (unsigned char)(f->hlen >> (8 * i));
	put_raw(w, len, 8);
	jw_open(w, '{');
	jw_key(w, "__metadata__");
	jw_open(w, '{');
	jw_key(w, "format");
	jw_str(w, "pt");
	if (f->pp < 0) {
		jw_close(w, '}');
		return;
	}
	/* "flexfs": a compact JSON text as a string value */
	jw_key(w, "flexfs");
	jw_quote(w);
	w->quoted = true;
	w->ascii = false;
	jw_open(w, '{');
	jw_key(w, "tp");
	jw_int(w, f->ctx->plan->spec->tp);
	jw_key(w, "pp");
	jw_int(w, f->ctx->plan->spec->pp);
	jw_key(w, "rank");
	jw_open(w, '{');
	jw_key(w, "tp");
	jw_int(w, f->tp);
	jw_key(w, "pp");
	jw_int(w, f->pp);
	jw_close(w, '}');
	jw_key(w, "tensors");
	jw_open(w, '{');
}

/* Inside the quoted metadata: its "tensors" object is at depth 4. */
static void st_meta(jw *w, const flx_st_file *f, size_t k)
{
	w->quoted = true;
	w->ascii = false;
	jw_resume(w, 4, k > 0);
	for (size_t i = k; i < f->set->n && i < k + FLX_GEN_BATCH; i++) {
		const flx_st_entry *e = &f->set->e[i];
		const flx_tensor *t = e->pl->src;

		jw_key_name(w, e->name);
		jw_open(w, '{');
		jw_key(w, "source");
		jw_name(w, t->fqn);
		jw_key(w, "global_shape");
		jw_ints(w, t->ndim, t->shape);
		jw_key(w, "global_offset");
		jw_ints(w, t->ndim, flx_view_box(flx_st_view(f, e))->off);
		jw_key(w, "split_axis");
		jw_int_or_null(w, e->pl->split);
		jw_close(w, '}');
	}
}

static void st_meta_end(jw *w, const flx_st_file *f)
{
	w->quoted = true;
	w->ascii = false;
	jw_resume(w, 4, f->set->n > 0);
	jw_close(w, '}');
	jw_close(w, '}');
	w->quoted = false;
	w->ascii = true;
	jw_quote(w);
	jw_close(w, '}');
}

/* Tensor entries at depth 1, after __metadata__. */
static void st_entry(jw *w, const flx_st_file *f, size_t k)
{
	uint64_t off = f->boff[k / FLX_GEN_BATCH];

	jw_resume(w, 1, true);
	for (size_t i = k; i < f->set->n && i < k + FLX_GEN_BATCH; i++) {
		const flx_st_entry *e = &f->set->e[f->set->order[i]];
		const flx_view *v = flx_st_view(f, e);
		const flx_tensor *t = e->pl->src;
		int64_t offs[2] = {(int64_t)off,
				   (int64_t)(off + flx_view_bytes(v))};

		jw_key_name(w, e->name);
		jw_open(w, '{');
		jw_key(w, "dtype");
		jw_str(w, flx_dtype_get(t->dtype)->safetensors);
		jw_key(w, "shape");
		jw_ints(w, t->ndim, flx_view_box(v)->size);
		jw_key(w, "data_offsets");
		jw_ints(w, 2, offs);
		jw_close(w, '}');
		off += flx_view_bytes(v);
	}
}

static void st_end(jw *w, const flx_st_file *f)
{
	static const char spaces[] = "                                ";

	put_raw(w, "}", 1);
	for (uint64_t n = f->pad; n;) {
		size_t k =
		    n < sizeof(spaces) - 1 ? (size_t)n : sizeof(spaces) - 1;

		put_raw(w, spaces, k);
		n -= k;
	}
}

static int cmp_entry(const void *pa, const void *pb, void *arg)
{
	const flx_st_set *s = arg;
	const flx_st_entry *a = &s->e[*(const uint32_t *)pa];
	const flx_st_entry *b = &s->e[*(const uint32_t *)pb];

	if (a->esz != b->esz)
		return a->esz > b->esz ? -1 : 1;
	return strcmp(a->name, b->name);
}

void flx_st_sort(flx_st_set *s)
{
	for (size_t i = 0; i < s->n; i++)
		s->order[i] = (uint32_t)i;
	if (s->n > 1)
		qsort_r(s->order, s->n, sizeof(*s->order), cmp_entry, s);
}

const flx_view *flx_st_view(const flx_st_file *f, const flx_st_entry *e)
{
	return f->pp < 0 ? e->pl->whole : e->pl->views[f->tp];
}

uint64_t flx_st_offsets(flx_st_file *f)
{
	const flx_st_set *s = f->set;
	uint64_t off = 0;

	for (size_t i = 0; i < s->n; i++) {
		if (i % FLX_GEN_BATCH == 0)
			f->boff[i / FLX_GEN_BATCH] = off;
		off += flx_view_bytes(flx_st_view(f, &s->e[s->order[i]]));
	}
	return off;
}

/* ---- hf/model.safetensors.index.json ---- */

/* "model-%05zu-of-%05zu.safetensors" of shard k (from 0) of n */
static void hf_shard_name(char *buf, size_t k, size_t n)
{
	char *o = buf;

	memcpy(o, "model-", 6);
	o += 6 + fmt_int(o + 6, (int64_t)k + 1, 5);
	memcpy(o, "-of-", 4);
	o += 4 + fmt_int(o + 4, (int64_t)n, 5);
	memcpy(o, ".safetensors", sizeof(".safetensors"));
}

static void hfidx_head(jw *w, const flx_hf_index *h)
{
	jw_open(w, '{');
	jw_key(w, "metadata");
	jw_open(w, '{');
	jw_key(w, "total_size");
	jw_int(w, (int64_t)h->total);
	jw_close(w, '}');
	jw_key(w, "weight_map");
	jw_open(w, '{');
}

static void hfidx_entry(jw *w, const flx_hf_index *h, size_t k)
{
	jw_resume(w, 2, k > 0);
	for (size_t i = k; i < h->n && i < k + FLX_GEN_BATCH; i++) {
		char name[80];

		hf_shard_name(name, h->e[i].shard, h->nshards);
		jw_key_name(w, h->e[i].name);
		jw_str(w, name);
	}
}

/* ---- dispatch ---- */

int flx_gen(flx_gen_kind kind, const void *arg, uint32_t idx,
	    unsigned char *dst, uint64_t lo, uint64_t hi, uint64_t *len)
{
	jw w = {.dst = dst, .lo = lo, .hi = hi};
	const flx_gen_ctx *ctx = arg;
	const flx_st_file *f = arg;
	const flx_hf_index *h = arg;
	const flx_plan *p;

	switch (kind) {
	case FLX_GEN_INDEX_HEAD:
	case FLX_GEN_INDEX_TENSOR:
	case FLX_GEN_INDEX_MID:
	case FLX_GEN_INDEX_OBJECT:
	case FLX_GEN_INDEX_TAIL:
		break;
	case FLX_GEN_HFIDX_HEAD:
	case FLX_GEN_HFIDX_ENTRY:
	case FLX_GEN_HFIDX_TAIL:
		ctx = h->ctx;
		break;
	default:
		ctx = f->ctx;
	}
	p = ctx->plan;
	w.plain_names = ctx->plain_names;
	switch (kind) {
	case FLX_GEN_INDEX_HEAD:
	case FLX_GEN_INDEX_TENSOR:
	case FLX_GEN_INDEX_MID:
	case FLX_GEN_INDEX_OBJECT:
	case FLX_GEN_INDEX_TAIL:
		w.indent = 1;
		break;
	case FLX_GEN_HFIDX_HEAD:
	case FLX_GEN_HFIDX_ENTRY:
	case FLX_GEN_HFIDX_TAIL:
		w.indent = 2;
		break;
	default:
		w.ascii = true;
	}
	switch (kind) {
	case FLX_GEN_INDEX_HEAD:
		index_head(&w, p);
		break;
	case FLX_GEN_INDEX_TENSOR:
		index_tensor(&w, p, idx);
		break;
	case FLX_GEN_INDEX_MID:
		jw_resume(&w, 2, p->n > 0);
		jw_close(&w, '}');
		jw_key(&w, "objects");
		jw_open(&w, '{');
		break;
	case FLX_GEN_INDEX_OBJECT:
		index_object(&w, p, idx);
		break;
	case FLX_GEN_INDEX_TAIL:
		jw_resume(&w, 2, p->ckpt->nobjects > 0);
		jw_close(&w, '}');
		jw_close(&w, '}');
		break;
	case FLX_GEN_ST_HEAD:
		st_head(&w, f);
		break;
	case FLX_GEN_ST_META:
		st_meta(&w, f, idx);
		break;
	case FLX_GEN_ST_META_END:
		st_meta_end(&w, f);
		break;
	case FLX_GEN_ST_ENTRY:
		st_entry(&w, f, idx);
		break;
	case FLX_GEN_ST_END:
		st_end(&w, f);
		break;
	case FLX_GEN_HFIDX_HEAD:
		hfidx_head(&w, h);
		break;
	case FLX_GEN_HFIDX_ENTRY:
		hfidx_entry(&w, h, idx);
		break;
	case FLX_GEN_HFIDX_TAIL:
		jw_resume(&w, 2, h->n > 0);
		jw_close(&w, '}');
		jw_close(&w, '}');
		break;
	default:
		return -EINVAL;
	}
	*len = w.pos;
	return w.err;
}

/* ---- .npy ---- */

int flx_npy_header(const flx_view *v, unsigned char *dst, uint64_t lo,
		   uint64_t hi, uint64_t *len)
{
	static const char head[] = "{'descr': '";
	static const char mid[] = "', 'fortran_order': False, 'shape': (";
	const flx_tensor *t = flx_view_tensor(v);
	const int64_t *shape = flx_view_box(v)->size;
	const char *descr = flx_dtype_get(t->dtype)->npy;
	size_t dl = strlen(descr);
	char dict[sizeof(head) + sizeof(mid) + 32 + 24 * FLX_MAX_DIMS];
	unsigned char pre[12];
	size_t n = 0, npre, total;
	jw w = {.dst = dst, .lo = lo, .hi = hi};
	bool v2;

	if (dl > 32)
		return -EINVAL;
	memcpy(dict, head, sizeof(head) - 1);
	n += sizeof(head) - 1;
	memcpy(dict + n, descr, dl);
	n += dl;
	memcpy(dict + n, mid, sizeof(mid) - 1);
	n += sizeof(mid) - 1;
	/* "(5,)" for 1-d; "(2, 3)" for more; "()" for 0-d */
	for (int d = 0; d < t->ndim; d++) {
		if (d) {
			memcpy(dict + n, ", ", 2);
			n += 2;
		}
		n += fmt_int(dict + n, shape[d], 1);
	}
	if (t->ndim == 1)
		dict[n++] = ',';
	memcpy(dict + n, "), }", 4);
	n += 4;
	v2 = n + 1 + 10 > 65535;
	npre = v2 ? 12 : 10;
	total = (npre + n + 1 + 63) & ~(size_t)63;
	memcpy(pre, "\x93NUMPY", 6);
	pre[6] = v2 ? 2 : 1;
	pre[7] = 0;
	for (size_t i = 0; i < npre - 8; i++)
		pre[8 + i] = (unsigned char)((total - npre) >> (8 * i));
	put_raw(&w, pre, npre);
	put_raw(&w, dict, n);
	for (size_t i = npre + n; i < total - 1; i++)
		put_raw(&w, " ", 1);
	put_raw(&w, "\n", 1);
	*len = w.pos;
	return 0;
}

/* ---- file names ---- */

int flx_file_name(const char *fqn, const char *suffix, char *out)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = 0, sl = strlen(suffix);

	if (!strcmp(fqn, ".") || !strcmp(fqn, "..")) {
		memcpy(out, "%2E", 3);
		n = 3;
		fqn++;
	}
	for (; *fqn; fqn++) {
		if (n + 3 > FLX_NAME_MAX)
			return -ENAMETOOLONG;
		if (*fqn == '/' || *fqn == '%') {
			out[n++] = '%';
			out[n++] = hex[(unsigned char)*fqn >> 4];
			out[n++] = hex[(unsigned char)*fqn & 15];
		} else {
			out[n++] = *fqn;
		}
	}
	if (n + sl > FLX_NAME_MAX)
		return -ENAMETOOLONG;
	memcpy(out + n, suffix, sl + 1);
	return (int)(n + sl);
}
