/* SPDX-License-Identifier: MIT */
/*
 * AOA statements (aoa.h): a lexer and a recursive-descent parser, then a
 * compiler that executes the statements on symbolic variables.
 *
 * A variable is a tensor made of boxes ("pieces"): each a source tensor
 * taken through a chain of steps (slice, transpose, cast) and placed at an
 * offset of the variable.  Every operation of the language is arithmetic
 * on those boxes: a slice keeps the pieces it meets, clipped; a transpose
 * or a cast is appended to every piece's chain and permutes the offsets; a
 * concatenation shifts the pieces of its inputs.  A variable that no later
 * statement consumes becomes a placed target of the transform list, whose
 * apply step turns it into chunks pointing into the source's files: no
 * byte is read before a reader asks for it.
 */
#include "aoa.h"
#include "megatron/megatron.h"

#include "grow.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the parsed form ---- */

enum { M_NONE, M_FUSED_QKV, M_FUSED_QKV_OLD, M_FUSED_FFN };
static const char *const macro_names[] = {[M_NONE] = "",
					  [M_FUSED_QKV] = "fused_qkv",
					  [M_FUSED_QKV_OLD] = "fused_qkv_old",
					  [M_FUSED_FFN] = "fused_ffn"};

typedef struct avar {
	char *name;
	bool t; /* ^T */
} avar;

typedef struct astmt {
	size_t no; /* statement number, from 1 */
	char *text;
	avar *in, *out;
	size_t nin, nout;
	bool has_axis, has_dtype, has_permute, has_reshape;
	int axis;
	flx_dtype dtype;
	int nperm;  /* 0 with has_permute: reverse the axes */
	int nshape; /* reshape='[...]': the new shape (-1: inferred) */
	int64_t shape[FLX_MAX_DIMS];
	int perm[FLX_MAX_DIMS];
	int macro;
	int64_t num_heads, num_kv, src_tp, dst_tp; /* 0: absent */
} astmt;

struct flx_aoa {
	char *origin;
	astmt *st;
	size_t n, cap;
};

/* ---- lexer ---- */

typedef enum tok_kind {
	T_END,
	T_IDENT,
	T_NUMBER,
	T_STRING,
	T_ARROW,
	T_LARROW,
	T_COMMA,
	T_EQ,
	T_LBRACK,
	T_RBRACK,
	T_COLON,
	T_BAD,
} tok_kind;

typedef struct token {
	tok_kind kind;
	size_t pos, len; /* in the line */
	int64_t num;
} token;

typedef struct lexer {
	const char *s;
	size_t len, pos;
	token tok; /* the current token */
	const flx_aoa *a;
	size_t no;
	flx_error *err;
} lexer;

/* VAR := [A-Za-z_][A-Za-z.$_*0-9^]* (Paddle's lexer): a macro such as
 * $LAYER_ID never starts a name. */
static bool ident_first(int c)
{
	return isalpha(c) || c == '_';
}

static bool ident_rest(int c)
{
	return isalnum(c) || c == '_' || c == '$' || c == '.' || c == '*' ||
	       c == '^';
}

static void lex_next(lexer *l)
{
	const char *s = l->s;
	size_t p = l->pos;
	token *t = &l->tok;

	while (p < l->len && (s[p] == ' ' || s[p] == '\t' || s[p] == '\r'))
		p++;
	t->pos = p;
	t->len = 1;
	if (p >= l->len) {
		t->kind = T_END;
		t->len = 0;
	} else if (s[p] == '-' && p + 1 < l->len && s[p + 1] == '>') {
		t->kind = T_ARROW;
		t->len = 2;
	} else if (s[p] == '<' && p + 1 < l->len && s[p + 1] == '-') {
		t->kind = T_LARROW;
		t->len = 2;
	} else if (ident_first((unsigned char)s[p])) {
		t->kind = T_IDENT;
		while (p + t->len < l->len &&
		       ident_rest((unsigned char)s[p + t->len]))
			t->len++;
	} else if (isdigit((unsigned char)s[p]) ||
		   (s[p] == '-' && p + 1 < l->len &&
		    isdigit((unsigned char)s[p + 1]))) {
		bool neg = s[p] == '-';
		uint64_t v = 0;

		t->kind = T_NUMBER;
		t->len = neg;
		while (p + t->len < l->len &&
		       isdigit((unsigned char)s[p + t->len])) {
			if (v > (uint64_t)INT64_MAX / 10)
				t->kind = T_BAD;
			v = v * 10 + (uint64_t)(s[p + t->len] - '0');
			t->len++;
		}
		if (v > (uint64_t)INT64_MAX)
			t->kind = T_BAD;
		t->num = neg ? -(int64_t)v : (int64_t)v;
	} else if (s[p] == '\'' || s[p] == '"') {
		t->kind = T_BAD;
		while (p + t->len < l->len && s[p + t->len] != s[p])
			t->len++;
		if (p + t->len < l->len) {
			t->kind = T_STRING;
			t->len++;
		}
	} else {
		switch (s[p]) {
		case ',':
			t->kind = T_COMMA;
			break;
		case '=':
			t->kind = T_EQ;
			break;
		case '[':
			t->kind = T_LBRACK;
			break;
		case ']':
			t->kind = T_RBRACK;
			break;
		case ':':
			t->kind = T_COLON;
			break;
		default:
			t->kind = T_BAD;
			break;
		}
	}
	l->pos = p + t->len;
}

static int lex_fail(lexer *l, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int lex_fail(lexer *l, size_t pos, const char *fmt, ...)
{
	char why[FLX_ERR_FIELD];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return flx_error_set(l->err, -EINVAL, l->a->origin, "aoa_statements",
			     "statement %zu column %zu: %s", l->no, pos + 1,
			     why);
}

static const char *tok_desc(tok_kind k)
{
	static const char *const d[] = {
	    [T_END] = "end of statement",
	    [T_IDENT] = "a name",
	    [T_NUMBER] = "a number",
	    [T_STRING] = "a string",
	    [T_ARROW] = "'->'",
	    [T_LARROW] = "'<-'",
	    [T_COMMA] = "','",
	    [T_EQ] = "'='",
	    [T_LBRACK] = "'['",
	    [T_RBRACK] = "']'",
	    [T_COLON] = "':'",
	    [T_BAD] = "an invalid character",
	};
	return d[k];
}

static int expect(lexer *l, tok_kind k)
{
	if (l->tok.kind != k)
		return lex_fail(l, l->tok.pos, "expected %s, found %s",
				tok_desc(k), tok_desc(l->tok.kind));
	lex_next(l);
	return 0;
}

/* ---- parser ---- */

static int add_var(lexer *l, avar **v, size_t *n, const char *name, size_t nlen,
		   bool t, size_t pos)
{
	size_t cap = *n;

	if (*n >= FLX_AOA_MAX_VARS)
		return lex_fail(l, pos, "more than %d names on one side",
				FLX_AOA_MAX_VARS);
	if (nlen >= FLX_AOA_MAX_NAME)
		return lex_fail(l, pos, "name longer than %d bytes",
				FLX_AOA_MAX_NAME - 1);
	/* a bound on the matcher's backtracking (tmatch()) */
	for (size_t i = 0, wild = 0; i < nlen; i++)
		if ((name[i] == '*' || name[i] == '$') && ++wild > 4)
			return lex_fail(l, pos,
					"more than 4 '*' and '$' macros in a "
					"name");
	/* *n grows by one at a time: a power-of-two capacity */
	if ((cap & (cap - 1)) == 0) {
		avar *nv = realloc(*v, (cap ? 2 * cap : 1) * sizeof(**v));

		if (!nv)
			return -ENOMEM;
		*v = nv;
	}
	(*v)[*n].t = t;
	if (!((*v)[*n].name = strndup(name, nlen)))
		return -ENOMEM;
	(*n)++;
	return 0;
}

/* VAR := IDENT ['[' NUMBER ':' NUMBER ']']; name[a:b] is name_a, ...,
 * name_{b-1}. */
static int parse_var(lexer *l, avar **v, size_t *n, bool rhs)
{
	token id = l->tok;
	const char *name = l->s + id.pos, *caret;
	size_t nlen = id.len;
	bool t = false;
	int64_t a, b;
	int rc;

	if (id.kind != T_IDENT)
		return lex_fail(l, id.pos, "expected a name, found %s",
				tok_desc(id.kind));
	caret = memchr(name, '^', nlen);
	if (caret) {
		if (caret != name + nlen - 2 || caret[1] != 'T' || nlen < 3)
			return lex_fail(l, id.pos + (size_t)(caret - name),
					"'^' only as a trailing ^T");
		if (rhs)
			return lex_fail(l, id.pos + (size_t)(caret - name),
					"^T on the destination side");
		t = true;
		nlen -= 2;
	}
	lex_next(l);
	if (l->tok.kind != T_LBRACK || l->tok.pos != id.pos + id.len)
		return add_var(l, v, n, name, nlen, t, id.pos);
	lex_next(l);
	a = l->tok.num;
	if ((rc = expect(l, T_NUMBER)) || (rc = expect(l, T_COLON)))
		return rc;
	b = l->tok.num;
	if ((rc = expect(l, T_NUMBER)) || (rc = expect(l, T_RBRACK)))
		return rc;
	if (a < 0 || b <= a || b - a > FLX_AOA_MAX_VARS)
		return lex_fail(l, id.pos + id.len,
				"range [%lld:%lld] is empty or too long",
				(long long)a, (long long)b);
	for (int64_t i = a; i < b; i++) {
		char buf[FLX_AOA_MAX_NAME + 24];
		int k = snprintf(buf, sizeof(buf), "%.*s_%lld", (int)nlen, name,
				 (long long)i);

		if ((rc = add_var(l, v, n, buf, (size_t)k, t, id.pos)))
			return rc;
	}
	return 0;
}

static int parse_list(lexer *l, avar **v, size_t *n, bool rhs)
{
	int rc = parse_var(l, v, n, rhs);

	while (!rc && l->tok.kind == T_COMMA) {
		lexer save = *l;

		lex_next(l);
		/* after the arrow, ", IDENT =" starts the attributes */
		if (rhs && l->tok.kind == T_IDENT) {
			lexer peek = *l;

			lex_next(&peek);
			if (peek.tok.kind == T_EQ) {
				*l = save;
				return 0;
			}
		}
		rc = parse_var(l, v, n, rhs);
	}
	return rc;
}

static flx_dtype dtype_named(const char *s, size_t n)
{
	static const struct {
		const char *name;
		flx_dtype dt;
	} names[] = {
	    /* not "float": numpy and paddle.cast read it as float64 */
	    {"float32", FLX_DT_F32}, {"fp32", FLX_DT_F32},
	    {"float16", FLX_DT_F16}, {"fp16", FLX_DT_F16},
	    {"half", FLX_DT_F16},    {"bfloat16", FLX_DT_BF16},
	    {"bf16", FLX_DT_BF16},   {"float64", FLX_DT_F64},
	    {"fp64", FLX_DT_F64},    {"double", FLX_DT_F64},
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strlen(names[i].name) == n &&
		    memcmp(names[i].name, s, n) == 0)
			return names[i].dt;
	return FLX_DT_INVALID;
}

/* The integers of a quoted list '[i0, i1, ...]' (the token's text
 * between its quotes, [s, e)) into v[0..*n): at most FLX_MAX_DIMS, each
 * digits after a '-' only when signed, "[]" only when allow_empty.
 * @return 0, or -EINVAL for anything else. */
static int int_list(const char *s, const char *e, bool allow_empty,
		    bool is_signed, int64_t *v, int *n)
{
	*n = 0;
	while (s < e && isspace((unsigned char)*s))
		s++;
	if (s == e || *s++ != '[')
		return -EINVAL;
	for (;;) {
		int64_t d = 0;
		bool neg = false, any = false;

		while (s < e && isspace((unsigned char)*s))
			s++;
		if (s < e && *s == ']' && *n == 0 && allow_empty)
			break;
		if (s < e && *s == '-' && is_signed)
			neg = true, s++;
		while (s < e && isdigit((unsigned char)*s) && d < (1ll << 48)) {
			d = d * 10 + (*s++ - '0');
			any = true;
		}
		if (!any || *n == FLX_MAX_DIMS)
			return -EINVAL;
		v[(*n)++] = neg ? -d : d;
		while (s < e && isspace((unsigned char)*s))
			s++;
		if (s < e && *s == ',') {
			s++;
			continue;
		}
		if (s < e && *s == ']')
			break;
		return -EINVAL;
	}
	s++;
	while (s < e && isspace((unsigned char)*s))
		s++;
	return s == e ? 0 : -EINVAL;
}

/* permute='[p0, p1, ...]' ("[]": reverse the axes): distinct axes. */
static int parse_perm(lexer *l, astmt *st, const token *v)
{
	int64_t p[FLX_MAX_DIMS];
	bool seen[FLX_MAX_DIMS] = {false};
	int n;

	if (int_list(l->s + v->pos + 1, l->s + v->pos + v->len - 1, true, false,
		     p, &n))
		goto bad;
	for (int d = 0; d < n; d++) {
		if (p[d] < 0 || p[d] >= n || seen[p[d]])
			goto bad;
		seen[p[d]] = true;
		st->perm[d] = (int)p[d];
	}
	st->nperm = n;
	st->has_permute = true;
	return 0;
bad:
	return lex_fail(l, v->pos,
			"permute must be a list of distinct axes, "
			"'[1,0]' or '[]'");
}

/* reshape='[d0, d1, ...]': extents, one of them -1 at most. */
static int parse_shape(lexer *l, astmt *st, const token *v)
{
	int infer = 0;

	if (int_list(l->s + v->pos + 1, l->s + v->pos + v->len - 1, false, true,
		     st->shape, &st->nshape))
		goto bad;
	for (int d = 0; d < st->nshape; d++)
		if ((st->shape[d] < 1 && st->shape[d] != -1) ||
		    (st->shape[d] == -1 && infer++))
			goto bad;
	st->has_reshape = true;
	return 0;
bad:
	return lex_fail(l, v->pos,
			"reshape must be a list of positive extents, one "
			"of them -1 at most: '[4,2,8]'");
}

/* ATTR := IDENT '=' (NUMBER | STRING) */
static int parse_attr(lexer *l, astmt *st)
{
	token k = l->tok, v;
	const char *key = l->s + k.pos;
	int rc;

#define KEY_IS(s) (k.len == strlen(s) && memcmp(key, s, k.len) == 0)
	if ((rc = expect(l, T_IDENT)) || (rc = expect(l, T_EQ)))
		return rc;
	v = l->tok;
	if (v.kind != T_NUMBER && v.kind != T_STRING)
		return lex_fail(l, v.pos, "expected a number or a string");
	lex_next(l);
	if (KEY_IS("axis") || KEY_IS("num_heads") ||
	    KEY_IS("num_key_value_groups") || KEY_IS("src_tp") ||
	    KEY_IS("dst_tp")) {
		int64_t *slot = KEY_IS("num_heads") ? &st->num_heads
				: KEY_IS("num_key_value_groups") ? &st->num_kv
				: KEY_IS("src_tp")		 ? &st->src_tp
				: KEY_IS("dst_tp")		 ? &st->dst_tp
								 : NULL;

		if (v.kind != T_NUMBER)
			return lex_fail(l, v.pos, "%.*s must be a number",
					(int)k.len, key);
		if (!slot) {
			if (st->has_axis)
				return lex_fail(l, k.pos, "axis given twice");
			if (v.num < 0 || v.num >= FLX_MAX_DIMS)
				return lex_fail(l, v.pos, "axis %lld",
						(long long)v.num);
			st->has_axis = true;
			st->axis = (int)v.num;
			return 0;
		}
		if (*slot)
			return lex_fail(l, k.pos, "%.*s given twice",
					(int)k.len, key);
		if (v.num < 1 || v.num > 1 << 20)
			return lex_fail(l, v.pos, "%.*s must be in [1, 2^20]",
					(int)k.len, key);
		*slot = v.num;
		return 0;
	}
	if (KEY_IS("dtype")) {
		if (st->has_dtype)
			return lex_fail(l, k.pos, "dtype given twice");
		st->dtype = v.kind == T_STRING
				? dtype_named(l->s + v.pos + 1, v.len - 2)
				: FLX_DT_INVALID;
		if (st->dtype == FLX_DT_INVALID)
			return lex_fail(l, v.pos,
					"dtype must be 'float32', 'float16', "
					"'bfloat16' or 'float64'");
		st->has_dtype = true;
		return 0;
	}
	if (KEY_IS("permute")) {
		if (st->has_permute)
			return lex_fail(l, k.pos, "permute given twice");
		if (v.kind != T_STRING)
			return lex_fail(l, v.pos, "permute must be a string");
		return parse_perm(l, st, &v);
	}
	if (KEY_IS("reshape")) {
		if (st->has_reshape)
			return lex_fail(l, k.pos, "reshape given twice");
		if (v.kind != T_STRING)
			return lex_fail(l, v.pos, "reshape must be a string");
		return parse_shape(l, st, &v);
	}
#undef KEY_IS
	return lex_fail(l, k.pos, "unknown attribute '%.*s'", (int)k.len, key);
}

/* Macro keywords listed among the destinations become the statement's
 * macro. */
static int take_macros(lexer *l, astmt *st, size_t pos)
{
	size_t k = 0;

	for (size_t i = 0; i < st->nout; i++) {
		int m = M_NONE;

		for (int j = M_FUSED_QKV; j <= M_FUSED_FFN; j++)
			if (strcmp(st->out[i].name, macro_names[j]) == 0)
				m = j;
		if (m == M_NONE) {
			st->out[k++] = st->out[i];
			continue;
		}
		free(st->out[i].name);
		st->macro = st->macro ? -1 : m;
	}
	st->nout = k;
	if (st->macro < 0)
		return lex_fail(l, pos, "two fused macros");
	if (!k)
		return lex_fail(l, pos, "no destination");
	if ((st->num_heads || st->num_kv) && st->macro != M_FUSED_QKV &&
	    st->macro != M_FUSED_QKV_OLD)
		return lex_fail(l, pos,
				"num_heads or num_key_value_groups without "
				"fused_qkv or fused_qkv_old");
	/* shard counts only matter to the per-rank layouts */
	if ((st->src_tp || st->dst_tp) && st->macro != M_FUSED_FFN &&
	    st->macro != M_FUSED_QKV_OLD)
		return lex_fail(l, pos,
				"src_tp or dst_tp without fused_ffn or "
				"fused_qkv_old");
	/* a fused macro expands into splits and concatenations, which take
	 * one attribute, axis: a cast or transpose there would be lost */
	if (st->macro && (st->has_dtype || st->has_permute))
		return lex_fail(l, pos,
				"%s takes no dtype or permute (cast or "
				"transpose in a statement of its own, or "
				"with ^T)",
				macro_names[st->macro]);
	return 0;
}

/* STATEMENT := VAR_LIST '->' VAR_LIST {',' ATTR}  |  VAR_LIST '<-' VAR_LIST */
static int parse_statement(lexer *l, astmt *st)
{
	avar *left = NULL, *right = NULL;
	size_t nleft = 0, nright = 0, arrow;
	bool old;
	int rc;

	lex_next(l);
	rc = parse_list(l, &left, &nleft, false);
	arrow = l->tok.pos;
	old = l->tok.kind == T_LARROW;
	if (!rc && l->tok.kind != T_ARROW && !old)
		rc = lex_fail(l, l->tok.pos, "expected '->' or ',', found %s",
			      tok_desc(l->tok.kind));
	if (!rc) {
		lex_next(l);
		rc = parse_list(l, &right, &nright, !old);
	}
	while (!rc && !old && l->tok.kind == T_COMMA) {
		lex_next(l);
		rc = parse_attr(l, st);
	}
	if (!rc && l->tok.kind != T_END)
		rc =
		    lex_fail(l, l->tok.pos, "expected ',' or the end, found %s",
			     tok_desc(l->tok.kind));
	/* old syntax: destination on the left */
	st->in = old ? right : left;
	st->nin = old ? nright : nleft;
	st->out = old ? left : right;
	st->nout = old ? nleft : nright;
	for (size_t i = 0; !rc && old && i < st->nout; i++)
		if (st->out[i].t)
			rc = lex_fail(l, arrow, "^T on the destination side");
	if (!rc)
		rc = take_macros(l, st, arrow);
	return rc;
}

static void free_stmt(astmt *st)
{
	for (size_t i = 0; i < st->nin; i++)
		free(st->in[i].name);
	for (size_t i = 0; i < st->nout; i++)
		free(st->out[i].name);
	free(st->in);
	free(st->out);
	free(st->text);
}

void flx_aoa_free(flx_aoa *a)
{
	if (!a)
		return;
	for (size_t i = 0; i < a->n; i++)
		free_stmt(&a->st[i]);
	free(a->st);
	free(a->origin);
	free(a);
}

size_t flx_aoa_count(const flx_aoa *a)
{
	return a ? a->n : 0;
}

int flx_aoa_parse(const char *const *stmts, size_t n, const char *origin,
		  flx_aoa **out, flx_error *err)
{
	flx_aoa *a = calloc(1, sizeof(*a));
	int rc = 0;

	if (!a || (origin && !(a->origin = strdup(origin)))) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n && !rc; i++) {
		const char *s = stmts[i];

		while (*s && !rc) {
			const char *nl = strchr(s, '\n');
			size_t len = nl ? (size_t)(nl - s) : strlen(s), k = 0;
			lexer l = {.s = s, .len = len, .a = a, .err = err};
			astmt *st;

			while (k < len && isspace((unsigned char)s[k]))
				k++;
			s += len + (nl != NULL);
			if (k == len)
				continue; /* a blank line */
			if (a->n >= FLX_AOA_MAX_STATEMENTS) {
				rc = flx_error_set(err, -EINVAL, a->origin,
						   "aoa_statements",
						   "more than %d statements",
						   FLX_AOA_MAX_STATEMENTS);
				break;
			}
			if (flx_grow((void **)&a->st, &a->cap, a->n + 1,
				     sizeof(*a->st))) {
				rc = -ENOMEM;
				break;
			}
			st = &a->st[a->n++];
			memset(st, 0, sizeof(*st));
			st->no = l.no = a->n;
			st->text = strndup(l.s, len);
			if (!st->text) {
				rc = -ENOMEM;
				break;
			}
			rc = parse_statement(&l, st);
		}
	}
out:
	if (rc) {
		flx_error_default(err, rc, origin);
		flx_aoa_free(a);
		return rc;
	}
	*out = a;
	return 0;
}

/* ---- the compiler: symbolic variables ---- */

typedef enum {
	CS_SLICE,
	CS_TRANSPOSE,
	CS_CAST,
	CS_UNSTACK,
	CS_UNSQUEEZE
} cstep_kind;

typedef struct cstep {
	cstep_kind kind;
	int axis;
	int64_t start, len;
	int ndim;
	int perm[FLX_MAX_DIMS];
	flx_dtype to;
} cstep;

typedef struct cpiece {
	const char *src; /* the source tensor's name (borrowed) */
	int64_t at[FLX_MAX_DIMS], shape[FLX_MAX_DIMS];
	cstep *st;
	size_t nst;
} cpiece;

typedef struct var {
	char *name;
	flx_dtype dtype;
	int ndim;
	int64_t shape[FLX_MAX_DIMS];
	cpiece *p;
	size_t np, capp;
	bool live;   /* an output unless a later statement consumes it */
	bool keep;   /* its name is a source key's: never a temporary */
	size_t stmt; /* the statement that wrote it */
	char *chain; /* the statements that made it, "3 <- 1, 2" */
} var;

struct flx_aoa_prog {
	flx_xform *x;
	char **notes;
	size_t nnotes, capnotes;
	char **tname, **tchain;
	char ***tsrc; /* per target, its pieces' descriptions */
	size_t *tnsrc;
	size_t ntargets;
};

typedef struct cc {
	const flx_aoa *a;
	const flx_ckpt *src;
	int tp;
	int64_t heads, groups; /* fused_qkv defaults, 0: none */
	int64_t src_tp;	       /* fused_ffn / fused_qkv_old default, 0: none */
	bool follower;	       /* compiling an optimizer state's instance */
	flx_aoa_prog *p;
	var *v; /* every variable written, in order */
	size_t nv, capv;
	size_t *slot; /* open addressing: name -> index in v of its latest
		       * variable, SIZE_MAX: empty */
	size_t capslot, nslot;
	const astmt *st; /* the statement being compiled */
	flx_error *err;
	size_t instances;
	uint64_t boxbytes; /* bytes of boxes copied or written, in all */
	uint64_t scanned;  /* keys matched against templates, in all */
} cc;

/* The most of a statement's text an error quotes. */
#define STMT_QUOTE 64

static int cfail(cc *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The error of the current statement: its number, why, and its text. */
static int stmt_error(cc *c, int code, const char *why)
{
	return flx_error_set(c->err, code, c->a->origin, "aoa_statements",
			     "statement %zu: %s (in \"%.*s%s\")", c->st->no,
			     why, STMT_QUOTE, c->st->text,
			     strlen(c->st->text) > STMT_QUOTE ? "..." : "");
}

static int cfail(cc *c, const char *fmt, ...)
{
	char why[FLX_ERR_FIELD];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return stmt_error(c, -EINVAL, why);
}

static void var_release(var *v)
{
	for (size_t i = 0; i < v->np; i++)
		free(v->p[i].st);
	free(v->p);
	free(v->name);
	free(v->chain);
	memset(v, 0, sizeof(*v));
}

static int piece_step(cpiece *p, const cstep *s)
{
	cstep *n = realloc(p->st, (p->nst + 1) * sizeof(*n));

	if (!n)
		return -ENOMEM;
	p->st = n;
	p->st[p->nst++] = *s;
	return 0;
}

static int piece_copy(cpiece *to, const cpiece *from)
{
	*to = *from;
	to->st = NULL;
	if (from->nst) {
		to->st = malloc(from->nst * sizeof(*to->st));
		if (!to->st)
			return -ENOMEM;
		memcpy(to->st, from->st, from->nst * sizeof(*to->st));
	}
	return 0;
}

/* A bound on one variable's boxes (fused layouts, reshapes and splits
 * multiply them): past it, -E2BIG. */
#define MAX_PIECES 65536

static int add_piece(var *v, const cpiece *p)
{
	cpiece *n;

	if (v->np >= MAX_PIECES)
		return -E2BIG;
	if (v->np == v->capp) {
		size_t cap = v->capp ? 2 * v->capp : 4;

		if (!(n = realloc(v->p, cap * sizeof(*n))))
			return -ENOMEM;
		v->p = n;
		v->capp = cap;
	}
	if (piece_copy(&v->p[v->np], p))
		return -ENOMEM;
	v->np++;
	return 0;
}

static int var_from_source(const flx_tensor *t, var *v)
{
	cpiece p = {.src = t->fqn};

	memset(v, 0, sizeof(*v));
	v->dtype = t->dtype;
	v->ndim = t->ndim;
	memcpy(v->shape, t->shape, sizeof(v->shape));
	memcpy(p.shape, t->shape, sizeof(p.shape));
	return add_piece(v, &p);
}

static int var_copy(const var *from, var *to)
{
	memset(to, 0, sizeof(*to));
	to->dtype = from->dtype;
	to->ndim = from->ndim;
	memcpy(to->shape, from->shape, sizeof(to->shape));
	for (size_t i = 0; i < from->np; i++) {
		int rc = add_piece(to, &from->p[i]);

		if (rc)
			return rc;
	}
	if (from->chain && !(to->chain = strdup(from->chain)))
		return -ENOMEM;
	return 0;
}

/* v transposed in place: new axis d is old axis perm[d]. */
static int var_transpose(var *v, const int *perm)
{
	cstep s = {.kind = CS_TRANSPOSE, .ndim = v->ndim};
	int64_t sh[FLX_MAX_DIMS];

	memcpy(s.perm, perm, sizeof(s.perm));
	for (size_t i = 0; i < v->np; i++) {
		cpiece *p = &v->p[i], o = *p;

		for (int d = 0; d < v->ndim; d++) {
			p->at[d] = o.at[perm[d]];
			p->shape[d] = o.shape[perm[d]];
		}
		if (piece_step(p, &s))
			return -ENOMEM;
	}
	for (int d = 0; d < v->ndim; d++)
		sh[d] = v->shape[perm[d]];
	memcpy(v->shape, sh, sizeof(sh));
	return 0;
}

static int var_reverse(var *v)
{
	int perm[FLX_MAX_DIMS];

	for (int d = 0; d < v->ndim; d++)
		perm[d] = v->ndim - 1 - d;
	return var_transpose(v, perm);
}

static int var_cast(var *v, flx_dtype to)
{
	cstep s = {.kind = CS_CAST, .to = to};

	if (v->dtype == to)
		return 0;
	for (size_t i = 0; i < v->np; i++)
		if (piece_step(&v->p[i], &s))
			return -ENOMEM;
	v->dtype = to;
	return 0;
}

/* out = [start, start + len) of axis a of v (checked by the caller). */
static int var_slice(const var *v, int a, int64_t start, int64_t len, var *out)
{
	memset(out, 0, sizeof(*out));
	out->dtype = v->dtype;
	out->ndim = v->ndim;
	memcpy(out->shape, v->shape, sizeof(out->shape));
	out->shape[a] = len;
	for (size_t i = 0; i < v->np; i++) {
		int rc;
		const cpiece *p = &v->p[i];
		int64_t lo = p->at[a] > start ? p->at[a] : start;
		int64_t e1 = p->at[a] + p->shape[a], e2 = start + len;
		int64_t hi = e1 < e2 ? e1 : e2;
		cpiece q;
		cstep s = {.kind = CS_SLICE,
			   .axis = a,
			   .start = lo - p->at[a],
			   .len = hi - lo};

		if (hi <= lo)
			continue;
		if (piece_copy(&q, p))
			return -ENOMEM;
		q.at[a] = lo - start;
		q.shape[a] = s.len;
		if ((s.start || s.len != p->shape[a]) && piece_step(&q, &s)) {
			free(q.st);
			return -ENOMEM;
		}
		rc = add_piece(out, &q);
		free(q.st);
		if (rc)
			return rc;
	}
	return 0;
}

/* out = the n variables concatenated along axis a. */
static int var_concat(cc *c, var *const *in, size_t n, int a, var *out)
{
	int64_t shift = 0;

	memset(out, 0, sizeof(*out));
	for (size_t k = 0; k < n; k++) {
		const var *v = in[k];

		if (a >= v->ndim)
			return cfail(c, "axis %d but input %zu has %d axes", a,
				     k + 1, v->ndim);
		if (k && (v->ndim != out->ndim || v->dtype != out->dtype))
			return cfail(c,
				     "input %zu is %s with %d axes, input 1 "
				     "%s with %d",
				     k + 1, flx_dtype_name(v->dtype), v->ndim,
				     flx_dtype_name(out->dtype), out->ndim);
		for (int d = 0; k && d < v->ndim; d++)
			if (d != a && v->shape[d] != out->shape[d])
				return cfail(c,
					     "input %zu has extent %lld on "
					     "axis %d, input 1 %lld",
					     k + 1, (long long)v->shape[d], d,
					     (long long)out->shape[d]);
		if (!k) {
			out->dtype = v->dtype;
			out->ndim = v->ndim;
			memcpy(out->shape, v->shape, sizeof(out->shape));
		}
		for (size_t i = 0; i < v->np; i++) {
			cpiece q;

			int rc;

			if (piece_copy(&q, &v->p[i]))
				return -ENOMEM;
			q.at[a] += shift;
			rc = add_piece(out, &q);
			free(q.st);
			if (rc)
				return rc;
		}
		if (__builtin_add_overflow(shift, v->shape[a], &shift))
			return cfail(c, "concatenated extent overflows");
	}
	out->shape[a] = shift;
	return 0;
}

/* out = v with axes d and d + 1 merged (row-major): every piece is cut
 * into its rows along d, each placed at row * extent(d + 1). */
static int var_merge(cc *c, const var *v, int d, var *out)
{
	int64_t b = v->shape[d + 1];

	memset(out, 0, sizeof(*out));
	out->dtype = v->dtype;
	out->ndim = v->ndim - 1;
	for (int k = 0, j = 0; k < v->ndim; k++)
		if (k != d + 1)
			out->shape[j++] =
			    k == d ? v->shape[d] * b : v->shape[k];
	for (size_t i = 0; i < v->np; i++) {
		const cpiece *p = &v->p[i];

		for (int64_t r = 0; r < p->shape[d]; r++) {
			cstep s = {.kind = CS_UNSTACK, .axis = d, .start = r};
			cpiece q;
			int rc;

			if (out->np >= MAX_PIECES)
				return cfail(c,
					     "reshape into more than %d "
					     "boxes",
					     MAX_PIECES);
			if (piece_copy(&q, p))
				return -ENOMEM;
			for (int k = d; k + 1 < v->ndim; k++) {
				q.at[k] = p->at[k + 1];
				q.shape[k] = p->shape[k + 1];
			}
			q.at[d] = (p->at[d] + r) * b + p->at[d + 1];
			rc = piece_step(&q, &s);
			if (!rc)
				rc = add_piece(out, &q);
			free(q.st);
			if (rc)
				return rc;
		}
	}
	return 0;
}

/* out = v with axis d (extent a * b) split into axes d (a) and d + 1
 * (b), row-major: slices of b rows, each given a new axis d. */
static int var_split_axis(cc *c, const var *v, int d, int64_t a, var *out)
{
	int64_t b = v->shape[d] / a;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	out->dtype = v->dtype;
	out->ndim = v->ndim + 1;
	for (int k = 0; k < out->ndim; k++)
		out->shape[k] = k < d	     ? v->shape[k]
				: k == d     ? a
				: k == d + 1 ? b
					     : v->shape[k - 1];
	for (int64_t i = 0; i < a && !rc; i++) {
		var sl;

		rc = var_slice(v, d, i * b, b, &sl);
		for (size_t j = 0; j < sl.np && !rc; j++) {
			cstep s = {.kind = CS_UNSQUEEZE, .axis = d};
			cpiece *q = &sl.p[j];

			if (out->np >= MAX_PIECES) {
				rc = cfail(c, "reshape into more than %d boxes",
					   MAX_PIECES);
				break;
			}
			for (int k = v->ndim; k > d; k--) {
				q->at[k] = q->at[k - 1];
				q->shape[k] = q->shape[k - 1];
			}
			q->at[d] = i;
			q->shape[d] = 1;
			rc = piece_step(q, &s);
			if (!rc)
				rc = add_piece(out, q);
		}
		var_release(&sl);
	}
	return rc;
}

/* v (taken over) replaced by *with. */
static void var_replace(var *v, var *with)
{
	var_release(v);
	*v = *with;
	memset(with, 0, sizeof(*with));
}

/* v reshaped in place to the statement's shape, row-major as numpy: the
 * extent-1 axes are dropped, each group of axes whose product matches a
 * group of new axes is merged into one and split again, then the new
 * extent-1 axes are added. */
static int var_reshape(cc *c, var *v)
{
	const astmt *st = c->st;
	int64_t want[FLX_MAX_DIMS], known = 1;
	uint64_t numel = flx_numel(v->ndim, v->shape);
	int infer = -1, pos = 0, nn = 0, rc = 0;
	int64_t nz[FLX_MAX_DIMS];
	var t;

	for (int k = 0; k < st->nshape; k++) {
		want[k] = st->shape[k];
		if (want[k] < 0)
			infer = k;
		else if (__builtin_mul_overflow(known, want[k], &known))
			return cfail(c, "reshape extents overflow");
	}
	if (infer >= 0 && known && numel % (uint64_t)known == 0)
		want[infer] = (int64_t)(numel / (uint64_t)known), known = 0;
	if ((infer >= 0 && known) || flx_numel(st->nshape, want) != numel)
		return cfail(c,
			     "reshape to %d axes of another element count "
			     "than the tensor's %llu",
			     st->nshape, (unsigned long long)numel);
	/* drop the extent-1 axes */
	for (int k = v->ndim - 1; k >= 0 && !rc; k--) {
		if (v->shape[k] != 1)
			continue;
		for (size_t i = 0; i < v->np && !rc; i++) {
			cstep s = {.kind = CS_UNSTACK, .axis = k};
			cpiece *p = &v->p[i];

			for (int j = k; j + 1 < v->ndim; j++) {
				p->at[j] = p->at[j + 1];
				p->shape[j] = p->shape[j + 1];
			}
			rc = piece_step(p, &s);
		}
		for (int j = k; j + 1 < v->ndim; j++)
			v->shape[j] = v->shape[j + 1];
		v->ndim--;
	}
	for (int k = 0; k < st->nshape; k++)
		if (want[k] != 1)
			nz[nn++] = want[k];
	/* groups of equal products */
	for (int j = 0; j < nn && !rc;) {
		int64_t po = v->shape[pos], pn = nz[j];
		int ko = 1, kn = 1;

		while (po != pn) {
			if (po < pn)
				po *= v->shape[pos + ko++];
			else
				pn *= nz[j + kn++];
		}
		for (int m = 1; m < ko && !rc; m++) {
			rc = var_merge(c, v, pos, &t);
			if (!rc)
				var_replace(v, &t);
		}
		for (int m = 0; m + 1 < kn && !rc; m++) {
			rc = var_split_axis(c, v, pos + m, nz[j + m], &t);
			if (!rc)
				var_replace(v, &t);
		}
		pos += kn;
		j += kn;
	}
	/* add the new extent-1 axes */
	for (int k = 0; k < st->nshape && !rc; k++) {
		if (want[k] != 1)
			continue;
		for (size_t i = 0; i < v->np && !rc; i++) {
			cstep s = {.kind = CS_UNSQUEEZE, .axis = k};
			cpiece *p = &v->p[i];

			for (int j = v->ndim; j > k; j--) {
				p->at[j] = p->at[j - 1];
				p->shape[j] = p->shape[j - 1];
			}
			p->at[k] = 0;
			p->shape[k] = 1;
			rc = piece_step(p, &s);
		}
		for (int j = v->ndim; j > k; j--)
			v->shape[j] = v->shape[j - 1];
		v->shape[k] = 1;
		v->ndim++;
	}
	return rc;
}

/* ---- the compiler: names ---- */

/* FNV-1a of a name. */
static size_t name_hash(const char *s)
{
	uint64_t h = 1469598103934665603ULL;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ULL;
	return (size_t)(h ^ (h >> 29));
}

/* The slot of name in the variable table: its own, or the empty one where
 * it would go (the table is never full). */
static size_t *var_slot(cc *c, const char *name)
{
	size_t mask = c->capslot - 1, i = name_hash(name) & mask;

	while (c->slot[i] != SIZE_MAX &&
	       strcmp(c->v[c->slot[i]].name, name) != 0)
		i = (i + 1) & mask;
	return &c->slot[i];
}

/* The latest variable of that name, or NULL: one hash probe. */
static var *find_var(cc *c, const char *name)
{
	size_t k;

	if (!c->capslot)
		return NULL;
	k = *var_slot(c, name);
	return k == SIZE_MAX ? NULL : &c->v[k];
}

/* Variable k (named) becomes the latest of its name. */
static int index_var(cc *c, size_t k)
{
	size_t *sl;

	if (2 * (c->nslot + 1) > c->capslot) {
		size_t cap = c->capslot ? 2 * c->capslot : 64, *old = c->slot,
		       oldcap = c->capslot;

		if (!(c->slot = malloc(cap * sizeof(*c->slot)))) {
			c->slot = old;
			return -ENOMEM;
		}
		for (size_t i = 0; i < cap; i++)
			c->slot[i] = SIZE_MAX;
		c->capslot = cap;
		for (size_t i = 0; i < oldcap; i++)
			if (old[i] != SIZE_MAX)
				*var_slot(c, c->v[old[i]].name) = old[i];
		free(old);
	}
	sl = var_slot(c, c->v[k].name);
	c->nslot += *sl == SIZE_MAX;
	*sl = k;
	return 0;
}

/* The boxes of a variable about to be copied or kept count against one
 * bound on the whole compilation: statements that copy a big variable
 * many times are refused before they take the memory. */
static int charge(cc *c, const var *v)
{
	uint64_t b = v->np * sizeof(cpiece);

	for (size_t i = 0; i < v->np; i++)
		b += v->p[i].nst * sizeof(cstep);
	c->boxbytes += b;
	if (c->boxbytes > FLX_AOA_MAX_BOX_BYTES)
		return cfail(c,
			     "the statements copy more than %d MiB of "
			     "boxes in all (this one: '%s', %zu boxes)",
			     FLX_AOA_MAX_BOX_BYTES >> 20,
			     v->name ? v->name : "input", v->np);
	return 0;
}

static bool name_exists(cc *c, const char *name)
{
	return find_var(c, name) || flx_ckpt_find(c->src, name);
}

/* Match key against template t, where $LAYER_ID / $LAYER_ID_OFFSET and
 * $EXPERT_ID match digits (ids[0], ids[1]; -1 while unset) and '*' a
 * non-empty run without '.' (its first match in *star, *starlen). */
static bool tmatch(const char *t, const char *k, int64_t *ids,
		   const char **star, size_t *starlen)
{
	static const struct {
		const char *m;
		int slot;
	} macros[] = {
	    {"$LAYER_ID_OFFSET", 0}, {"$LAYER_ID", 0}, {"$EXPERT_ID", 1}};

	for (;;) {
		if (!*t)
			return !*k;
		for (size_t i = 0; i < 3; i++) {
			size_t ml = strlen(macros[i].m);
			int s = macros[i].slot;
			int64_t save = ids[s], v = 0;

			if (strncmp(t, macros[i].m, ml) != 0)
				continue;
			for (size_t n = 1; isdigit((unsigned char)k[n - 1]);
			     n++) {
				if (v > INT64_MAX / 100)
					return false;
				v = v * 10 + (k[n - 1] - '0');
				if (save >= 0 && save != v)
					continue;
				ids[s] = v;
				if (tmatch(t + ml, k + n, ids, star, starlen))
					return true;
				ids[s] = save;
			}
			return false;
		}
		if (*t == '*') {
			for (size_t n = 1; k[n - 1] && k[n - 1] != '.'; n++) {
				const char *ss = *star;
				size_t sl = *starlen;

				if (!ss) {
					*star = k;
					*starlen = n;
				}
				if (tmatch(t + 1, k + n, ids, star, starlen))
					return true;
				*star = ss;
				*starlen = sl;
			}
			return false;
		}
		if (*t != *k)
			return false;
		t++;
		k++;
	}
}

static bool has_id_macro(const char *s)
{
	return strstr(s, "$LAYER_ID") || strstr(s, "$EXPERT_ID");
}

/* name with its macros replaced: layer ids[0] (minus shift for
 * $LAYER_ID_OFFSET), expert ids[1]. */
static int substitute(cc *c, const char *name, const int64_t *ids,
		      int64_t shift, char **out)
{
	char buf[FLX_AOA_MAX_NAME + 64];
	size_t n = 0;

	for (const char *s = name; *s;) {
		int64_t v = -1;
		size_t ml = 0;

		if (strncmp(s, "$LAYER_ID_OFFSET", 16) == 0) {
			v = ids[0] - shift;
			ml = 16;
		} else if (strncmp(s, "$LAYER_ID", 9) == 0) {
			v = ids[0];
			ml = 9;
		} else if (strncmp(s, "$EXPERT_ID", 10) == 0) {
			v = ids[1];
			ml = 10;
		}
		if (ml) {
			if (v < 0 && ml == 16)
				return -ERANGE; /* layer 0 has no layer -1 */
			if (v < 0)
				return cfail(c, "$EXPERT_ID has no value here");
			n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%lld",
					      (long long)v);
			s += ml;
		} else {
			buf[n++] = *s++;
		}
		if (n >= FLX_AOA_MAX_NAME)
			return cfail(c, "expanded name too long");
	}
	buf[n] = 0;
	*out = strdup(buf);
	return *out ? 0 : -ENOMEM;
}

/* The keys a template may match: source tensors, then variables. */
static size_t nkeys(const cc *c)
{
	return c->src->ntensors + c->nv;
}

static const char *key_at(const cc *c, size_t i)
{
	return i < c->src->ntensors ? c->src->tensors[i].fqn
				    : c->v[i - c->src->ntensors].name;
}

/* A template statement is about to match every key: the scans of all
 * statements together are bounded. */
static int charge_scan(cc *c)
{
	c->scanned += nkeys(c);
	if (c->scanned > FLX_AOA_MAX_SCAN)
		return cfail(c,
			     "the templates ($LAYER_ID, $EXPERT_ID, '*') of "
			     "the statements so far were matched against "
			     "more than %llu names in all",
			     (unsigned long long)FLX_AOA_MAX_SCAN);
	return 0;
}

typedef struct combo {
	int64_t ids[2];
	char *star; /* the '*' match (owned), NULL: none */
} combo;

static int cmp_num(const char *a, const char *b)
{
	size_t la = strspn(a, "0123456789"), lb = strspn(b, "0123456789");

	if (la && lb && !a[la] && !b[lb]) {
		while (*a == '0' && la > 1)
			a++, la--;
		while (*b == '0' && lb > 1)
			b++, lb--;
		if (la != lb)
			return la < lb ? -1 : 1;
	}
	return strcmp(a, b);
}

static int cmp_combo(const void *pa, const void *pb)
{
	const combo *a = pa, *b = pb;

	for (int i = 0; i < 2; i++)
		if (a->ids[i] != b->ids[i])
			return a->ids[i] < b->ids[i] ? -1 : 1;
	if (!a->star || !b->star)
		return !!a->star - !!b->star;
	return cmp_num(a->star, b->star);
}

/* The id combinations of a statement: every distinct ($LAYER_ID,
 * $EXPERT_ID) of the keys its first macro name on the left matches. */
static int find_combos(cc *c, const char *tmpl, combo **out, size_t *nout)
{
	combo *v = NULL;
	size_t n = 0, cap = 0;
	int rc = charge_scan(c);

	if (rc)
		return rc;
	for (size_t i = 0; i < nkeys(c); i++) {
		int64_t ids[2] = {-1, -1};
		const char *star = NULL;
		size_t sl = 0;

		if (!tmatch(tmpl, key_at(c, i), ids, &star, &sl))
			continue;
		if (flx_grow((void **)&v, &cap, n + 1, sizeof(*v))) {
			free(v);
			return -ENOMEM;
		}
		v[n++] = (combo){.ids = {ids[0], ids[1]}};
	}
	if (n)
		qsort(v, n, sizeof(*v), cmp_combo);
	*nout = 0;
	for (size_t i = 0; i < n; i++)
		if (!*nout || cmp_combo(&v[*nout - 1], &v[i]))
			v[(*nout)++] = v[i];
	*out = v;
	return 0;
}

typedef struct names {
	char **s;
	bool *t;
	char **star; /* per name: the '*' match it came from, or NULL */
	size_t n, cap;
} names;

static void names_free(names *ns)
{
	for (size_t i = 0; i < ns->n; i++) {
		free(ns->s[i]);
		free(ns->star[i]);
	}
	free(ns->s);
	free(ns->t);
	free(ns->star);
	memset(ns, 0, sizeof(*ns));
}

static int names_add(names *ns, char *s, bool t, char *star)
{
	if (ns->n == ns->cap) {
		size_t cap = ns->cap ? 2 * ns->cap : 8;
		char **a = realloc(ns->s, cap * sizeof(char *));
		char **b = a ? realloc(ns->star, cap * sizeof(char *)) : NULL;
		bool *tt = b ? realloc(ns->t, cap * sizeof(bool)) : NULL;

		if (a)
			ns->s = a;
		if (b)
			ns->star = b;
		if (tt)
			ns->t = tt;
		if (!a || !b || !tt) {
			free(s);
			free(star);
			return -ENOMEM;
		}
		ns->cap = cap;
	}
	ns->s[ns->n] = s;
	ns->t[ns->n] = t;
	ns->star[ns->n++] = star;
	return 0;
}

static int cmp_star(const void *pa, const void *pb)
{
	const combo *a = pa, *b = pb;

	return cmp_num(a->star, b->star);
}

/* name, with a '*', as the sorted keys it matches (appended to ns); the
 * matches go to stars when that is not NULL. */
static int expand_star(cc *c, const char *name, bool t, names *ns)
{
	combo *m = NULL;
	size_t n = 0, cap = 0;
	int rc = charge_scan(c);

	for (size_t i = 0; i < nkeys(c) && !rc; i++) {
		int64_t ids[2] = {-1, -1};
		const char *star = NULL, *k = key_at(c, i);
		size_t sl = 0;

		if (i >= c->src->ntensors && flx_ckpt_find(c->src, k))
			continue; /* listed as a source already */
		if (!tmatch(name, k, ids, &star, &sl))
			continue;
		if (flx_grow((void **)&m, &cap, n + 1, sizeof(*m))) {
			rc = -ENOMEM;
			break;
		}
		m[n].star = strndup(star, sl);
		m[n].ids[0] = (int64_t)i;
		if (!m[n++].star)
			rc = -ENOMEM;
	}
	if (!rc && n)
		qsort(m, n, sizeof(*m), cmp_star);
	for (size_t i = 0; i < n; i++) {
		if (!rc) {
			char *s = strdup(key_at(c, (size_t)m[i].ids[0]));

			rc = s ? names_add(ns, s, t, m[i].star) : -ENOMEM;
			if (s)
				continue;
		}
		free(m[i].star);
	}
	free(m);
	return rc;
}

/* RHS name with a '*', replaced by each match of the left's one starred
 * name. */
static int expand_rhs_star(cc *c, const char *name, const names *in, names *ns)
{
	const char *st = strchr(name, '*');
	size_t nstar = 0;

	if (strchr(st + 1, '*'))
		return cfail(c, "'%s': one '*' at most on the right", name);
	for (size_t i = 0; i < in->n; i++) {
		char *s;
		size_t pl = (size_t)(st - name), sl;

		if (!in->star[i])
			continue;
		nstar++;
		sl = strlen(in->star[i]);
		s = malloc(strlen(name) + sl);
		if (!s)
			return -ENOMEM;
		memcpy(s, name, pl);
		memcpy(s + pl, in->star[i], sl);
		strcpy(s + pl + sl, st + 1);
		if (names_add(ns, s, false, NULL))
			return -ENOMEM;
	}
	if (!nstar)
		return cfail(c,
			     "'%s': a '*' on the right needs a '*' name on "
			     "the left",
			     name);
	return 0;
}

/* The names of one side of an instance: macros substituted, '*'
 * expanded. */
static int instance_names(cc *c, const avar *v, size_t n, const int64_t *ids,
			  int64_t shift, const names *left, names *ns)
{
	int rc = 0;

	for (size_t i = 0; i < n && !rc; i++) {
		char *s;

		rc = substitute(c, v[i].name, ids, shift, &s);
		if (rc)
			break;
		if (!strchr(s, '*')) {
			rc = names_add(ns, s, v[i].t, NULL);
			continue;
		}
		rc = left ? expand_rhs_star(c, s, left, ns)
			  : expand_star(c, s, v[i].t, ns);
		free(s);
	}
	return rc;
}

/* ---- the compiler: statements ---- */

/* A chain is cut past this many bytes, " ..." appended: long enough to
 * tell where a target comes from, short enough that a chain of renames
 * stays linear. */
#define CHAIN_MAX 200

static int append_chain(char **chain, const char *more)
{
	size_t a = *chain ? strlen(*chain) : 0, b = strlen(more);
	char *n;

	if (a > CHAIN_MAX)
		return 0;
	if (b > CHAIN_MAX + 4)
		b = CHAIN_MAX + 4; /* more is a cut chain itself */
	n = realloc(*chain, a + b + 3);
	if (!n)
		return -ENOMEM;
	if (a)
		memcpy(n + a, ", ", 2), a += 2;
	memcpy(n + a, more, b);
	n[a + b] = 0;
	*chain = n;
	return 0;
}

/* Write variable name = *v (taken over). */
static int define(cc *c, const char *name, var *v, const char *inchain)
{
	var *old = find_var(c, name);
	char buf[64];
	var *nv;
	int rc;

	if (old && old->live)
		return cfail(c,
			     "'%s' is written again (first by statement %zu)",
			     name, old->stmt);
	if (flx_grow((void **)&c->v, &c->capv, c->nv + 1, sizeof(*c->v)))
		return -ENOMEM;
	nv = &c->v[c->nv];
	*nv = *v;
	memset(v, 0, sizeof(*v));
	free(nv->chain);
	nv->chain = NULL;
	nv->stmt = c->st->no;
	nv->live = true;
	nv->keep = flx_ckpt_find(c->src, name) != NULL;
	snprintf(buf, sizeof(buf), "stmt %zu%s", c->st->no,
		 inchain && *inchain ? " <- " : "");
	rc = append_chain(&nv->chain, buf);
	if (!rc && inchain && *inchain) {
		size_t l = strlen(nv->chain), m = strlen(inchain);
		size_t keep = m;
		char *n;

		if (m > CHAIN_MAX) { /* cut before a whole "stmt K" */
			keep = CHAIN_MAX;
			while (keep > 0 && strncmp(inchain + keep, "stmt ", 5))
				keep--;
		}
		n = realloc(nv->chain, l + keep + 4 + 1);
		if (!n) {
			rc = -ENOMEM;
		} else {
			nv->chain = n;
			memcpy(n + l, inchain, keep);
			strcpy(n + l + keep, keep < m ? "..." : "");
		}
	}
	if (!rc && !(nv->name = strdup(name)))
		rc = -ENOMEM;
	c->nv++;
	if (!rc)
		rc = index_var(c, c->nv - 1);
	if (!rc)
		rc = charge(c, nv);
	return rc;
}

/* Input name of the current instance, as a new variable; a source read
 * is not served under its own name any more. */
static int resolve(cc *c, const char *name, bool t, var *out, char **chain)
{
	var *v = find_var(c, name);
	const flx_tensor *s;
	int rc;

	if (v) {
		rc = charge(c, v);
		if (!rc)
			rc = var_copy(v, out);
		if (!rc && !v->keep)
			v->live = false; /* a temporary, consumed */
		if (!rc && v->chain)
			rc = append_chain(chain, v->chain);
	} else if ((s = flx_ckpt_find(c->src, name))) {
		rc = var_from_source(s, out);
		if (!rc)
			rc = flx_xform_drop(c->p->x, name, c->err);
	} else {
		return cfail(c, "no tensor '%s'", name);
	}
	if (!rc && t)
		rc = var_reverse(out);
	return rc;
}

static int split_equal(cc *c, const var *in, int a, size_t n, var *out)
{
	int64_t part;
	int rc = 0;

	if (a >= in->ndim)
		return cfail(c, "axis %d but the tensor has %d axes", a,
			     in->ndim);
	if (in->shape[a] % (int64_t)n)
		return cfail(c,
			     "axis %d of extent %lld does not split into %zu "
			     "equal parts",
			     a, (long long)in->shape[a], n);
	part = in->shape[a] / (int64_t)n;
	for (size_t k = 0; k < n && !rc; k++)
		rc = var_slice(in, a, (int64_t)k * part, part, &out[k]);
	return rc;
}

/* The fused layout: n shards, each [comp 0 part r | comp 1 part r | ...]
 * along axis a, comp k taking units[k] of every shard's U units.
 * fuse: comps -> fused. */
static int fuse(cc *c, var *const *comps, size_t k, size_t n, int a, var *fused)
{
	var *parts = calloc(k * n, sizeof(var));
	var **order = calloc(k * n, sizeof(var *));
	int rc = parts && order ? 0 : -ENOMEM;

	for (size_t j = 0; j < k && !rc; j++) {
		var *pj = calloc(n, sizeof(var));

		rc = pj ? split_equal(c, comps[j], a, n, pj) : -ENOMEM;
		for (size_t r = 0; r < n && pj; r++) {
			parts[r * k + j] = pj[r];
			order[r * k + j] = &parts[r * k + j];
		}
		free(pj);
	}
	if (!rc)
		rc = var_concat(c, order, k * n, a, fused);
	for (size_t i = 0; parts && i < k * n; i++)
		var_release(&parts[i]);
	free(parts);
	free(order);
	return rc;
}

/* unfuse: fused -> comps (units[k] of U per shard). */
static int unfuse(cc *c, const var *fused, const int64_t *units, size_t k,
		  size_t n, int a, var *comps)
{
	int64_t u = 0, e, unit;
	var *slices = calloc(k * n, sizeof(var));
	var **order = calloc(n, sizeof(var *));
	int rc = slices && order ? 0 : -ENOMEM;

	for (size_t j = 0; j < k; j++)
		u += units[j];
	if (!rc && a >= fused->ndim)
		rc = cfail(c, "axis %d but the tensor has %d axes", a,
			   fused->ndim);
	e = rc ? 0 : fused->shape[a];
	if (!rc && (u <= 0 || e % ((int64_t)n * u)))
		rc = cfail(c,
			   "axis %d of extent %lld is not %zu shard(s) of "
			   "%lld equal unit(s)",
			   a, (long long)e, n, (long long)u);
	unit = rc ? 0 : e / ((int64_t)n * u);
	for (size_t r = 0; r < n && !rc; r++) {
		int64_t pos = (int64_t)r * u * unit;

		for (size_t j = 0; j < k && !rc; j++) {
			rc = var_slice(fused, a, pos, units[j] * unit,
				       &slices[j * n + r]);
			pos += units[j] * unit;
		}
	}
	for (size_t j = 0; j < k && !rc; j++) {
		for (size_t r = 0; r < n; r++)
			order[r] = &slices[j * n + r];
		rc = var_concat(c, order, n, a, &comps[j]);
	}
	for (size_t i = 0; slices && i < k * n; i++)
		var_release(&slices[i]);
	free(slices);
	free(order);
	return rc;
}

/* The fused macros: the components' units per shard and the shards. */
static int fused_units(cc *c, int64_t shards, int64_t *units, size_t *k,
		       size_t *n)
{
	const astmt *st = c->st;
	int64_t h = st->num_heads ? st->num_heads : c->heads;
	int64_t g = st->num_kv ? st->num_kv : c->groups;

	if (st->macro == M_FUSED_FFN) {
		units[0] = units[1] = 1;
		*k = 2;
		*n = (size_t)shards;
		return 0;
	}
	*k = 3;
	if (h < 1 || g < 1)
		return cfail(c,
			     "%s needs num_heads and num_key_value_groups "
			     "(in the statement, -o aoa_num_heads= and "
			     "aoa_num_key_value_groups=, or the "
			     "checkpoint's Megatron arguments)",
			     macro_names[st->macro]);
	*k = 3;
	if (st->macro == M_FUSED_QKV) {
		/* interleaved GQA: one shard per KV group */
		if (h % g)
			return cfail(c,
				     "num_heads %lld is not a multiple of "
				     "num_key_value_groups %lld",
				     (long long)h, (long long)g);
		units[0] = h / g;
		units[1] = units[2] = 1;
		*n = (size_t)g;
		return 0;
	}
	if (h % shards || g % shards)
		return cfail(c,
			     "%lld heads and %lld KV heads do not split over "
			     "%lld shards",
			     (long long)h, (long long)g, (long long)shards);
	units[0] = h / shards;
	units[1] = units[2] = g / shards;
	*n = (size_t)shards;
	return 0;
}

static int default_axis(const astmt *st, const var *v)
{
	if (st->has_axis)
		return st->axis;
	return v->ndim > 1 ? 1 : 0;
}

/*
 * How many equal pieces the saved chunks of t cut axis a into: k > 1 when
 * every chunk spans extent / k of it from a multiple of extent / k (the
 * global index checks that the chunks tile the tensor), else 1 (saved
 * whole, replicated along a, or cut unevenly).
 */
static int64_t saved_pieces(const flx_tensor *t, int a)
{
	int64_t e, s;

	if (a < 0 || a >= t->ndim || t->nchunks < 2)
		return 1;
	e = t->shape[a];
	s = t->chunks[0].size[a];
	if (s <= 0 || s >= e || e % s)
		return 1;
	for (uint32_t i = 0; i < t->nchunks; i++)
		if (t->chunks[i].size[a] != s || t->chunks[i].off[a] % s)
			return 1;
	return e / s;
}

/*
 * The decision of a fused statement's source shard count *src: its
 * src_tp= (stmt), else -o aoa_src_tp= (opt), else 1.  When neither is
 * given and the source is saved in pieces > 1 equal pieces along the
 * fused axis, -EINVAL: a PaddleNLP checkpoint saved at TP N holds
 * [gate_0 | up_0 | gate_1 | up_1 | ...] there
 * (docs/formats/paddle.md#aoa-statements,
 * docs/formats/paddle.md#paddlenlp-per-rank-files), which 1 would read as one
 * merged [gate | up] and serve wrong bytes. A value given is trusted.
 */
static int fused_src_tp(int64_t stmt, int64_t opt, int64_t pieces, int64_t *src)
{
	*src = stmt ? stmt : opt ? opt : 1;
	return stmt || opt || pieces < 2 ? 0 : -EINVAL;
}

/* The source shard count of the statement in c reading in (one name, a
 * source tensor or a variable, transposed by ^T when t) along axis a of
 * what it reads: fused_src_tp() on the source tensor's saved pieces. */
static int fused_src(cc *c, const char *in, bool t, int a, int64_t *src)
{
	const flx_tensor *s =
	    find_var(c, in) ? NULL : flx_ckpt_find(c->src, in);
	int sa = s && t ? s->ndim - 1 - a : a;
	int64_t k = s ? saved_pieces(s, sa) : 1;

	if (fused_src_tp(c->st->src_tp, c->src_tp, k, src))
		return cfail(c,
			     "'%s' is saved in %lld equal pieces along axis "
			     "%d, as %s at TP %lld: pass -o aoa_src_tp=%lld "
			     "(or aoa_src_tp=1 if merged)",
			     in, (long long)k, sa, macro_names[c->st->macro],
			     (long long)k, (long long)k);
	return 0;
}

/* in names the one source read when nin is 1. */
static int run_fused(cc *c, const names *in_names, var *in, size_t nin,
		     var *out, size_t nout)
{
	const astmt *st = c->st;
	int64_t units[3], src = 1;
	int64_t dst = st->dst_tp ? st->dst_tp : c->tp;
	size_t k = 0, n;
	int a = default_axis(st, &in[0]), rc;
	var *pin[3], comps[3] = {0};

	if (nin == 1 && st->macro != M_FUSED_QKV) {
		rc = fused_src(c, in_names->s[0], in_names->t[0], a, &src);
		if (rc)
			return rc;
	}
	if (nin == 1 && nout == 1) {
		/* a relayout between shard counts */
		if (st->macro == M_FUSED_QKV)
			return var_copy(&in[0], &out[0]);
		rc = fused_units(c, src, units, &k, &n);
		if (!rc)
			rc = unfuse(c, &in[0], units, k, n, a, comps);
		if (!rc)
			rc = fused_units(c, dst, units, &k, &n);
		for (size_t j = 0; j < k; j++)
			pin[j] = &comps[j];
		if (!rc)
			rc = fuse(c, pin, k, n, a, &out[0]);
		for (size_t j = 0; j < 3; j++)
			var_release(&comps[j]);
		return rc;
	}
	if (nin == 1) {
		rc = fused_units(c, src, units, &k, &n);
		if (!rc && nout != k)
			return cfail(c, "%s splits into %zu tensors, not %zu",
				     macro_names[st->macro], k, nout);
		return rc ? rc : unfuse(c, &in[0], units, k, n, a, out);
	}
	rc = fused_units(c, dst, units, &k, &n);
	if (!rc && (nin != k || nout != 1))
		return cfail(c,
			     "%s fuses %zu tensors into one, not %zu into %zu",
			     macro_names[st->macro], k, nin, nout);
	for (size_t j = 0; j < k && !rc; j++)
		pin[j] = &in[j];
	return rc ? rc : fuse(c, pin, k, n, a, &out[0]);
}

/* One instance: names resolved, the operation run, outputs written. */
static int run_instance(cc *c, const names *in, const names *out)
{
	const astmt *st = c->st;
	var *iv = calloc(in->n, sizeof(var)), *ov = NULL;
	var **pin = calloc(in->n, sizeof(var *));
	char *chain = NULL;
	int rc = iv && pin ? 0 : -ENOMEM;

	if (!rc && out->n == 1 && strcmp(out->s[0], "_") == 0) {
		/* A -> _: drop */
		for (size_t i = 0; i < in->n && !rc; i++) {
			var *v = find_var(c, in->s[i]);

			if (v)
				v->live = false;
			else if (flx_ckpt_find(c->src, in->s[i]))
				rc = flx_xform_drop(c->p->x, in->s[i], c->err);
			else
				rc = cfail(c, "no tensor '%s'", in->s[i]);
		}
		goto out;
	}
	for (size_t i = 0; i < in->n && !rc; i++)
		if (strcmp(in->s[i], "_") == 0)
			rc = cfail(c,
				   "'_ -> %s': a view cannot invent data "
				   "(a destination needs a source)",
				   out->s[0]);
	for (size_t i = 0; i < out->n && !rc; i++)
		if (strcmp(out->s[i], "_") == 0)
			rc = cfail(c, "'_' among several destinations");
	for (size_t i = 0; i < in->n && !rc; i++) {
		rc = resolve(c, in->s[i], in->t[i], &iv[i], &chain);
		pin[i] = &iv[i];
	}
	if (!rc && !(ov = calloc(out->n, sizeof(var))))
		rc = -ENOMEM;
	if (rc)
		goto out;
	if (st->has_reshape && (in->n != 1 || out->n != 1 || st->macro ||
				st->has_dtype || st->has_permute)) {
		rc = cfail(c, "reshape is a statement of one source, one "
			      "destination and no other operation");
	} else if (st->has_reshape) {
		rc = var_copy(&iv[0], &ov[0]);
		if (!rc)
			rc = var_reshape(c, &ov[0]);
	} else if (st->macro) {
		rc = run_fused(c, in, iv, in->n, ov, out->n);
	} else if (in->n == 1 && out->n == 1) {
		if (st->has_permute + st->has_dtype > 1)
			rc = cfail(c, "one operation per statement (permute "
				      "and dtype given)");
		rc = rc ? rc : var_copy(&iv[0], &ov[0]);
		if (!rc && st->has_permute) {
			int perm[FLX_MAX_DIMS];

			if (st->nperm && st->nperm != ov->ndim)
				rc = cfail(c,
					   "permute of %d axes for a tensor "
					   "of %d",
					   st->nperm, ov->ndim);
			else if (!st->nperm)
				rc = var_reverse(ov);
			else
				rc = var_transpose(
				    ov, memcpy(perm, st->perm, sizeof(perm)));
		}
		/* an optimizer state keeps its own dtype */
		if (!rc && st->has_dtype && !c->follower)
			rc = var_cast(ov, st->dtype);
	} else if (in->n > 1 && out->n == 1) {
		if (!st->has_axis || st->has_dtype || st->has_permute)
			rc = cfail(c, "a concatenation takes one attribute, "
				      "axis");
		else
			rc = var_concat(c, pin, in->n, st->axis, &ov[0]);
	} else if (in->n == 1 && out->n > 1) {
		if (!st->has_axis || st->has_dtype || st->has_permute)
			rc = cfail(c, "a split takes one attribute, axis");
		else
			rc = split_equal(c, &iv[0], st->axis, out->n, ov);
	} else {
		rc = cfail(c,
			   "%zu sources to %zu destinations without a "
			   "fused macro",
			   in->n, out->n);
	}
	for (size_t i = 0; i < out->n && !rc; i++)
		rc = define(c, out->s[i], &ov[i], chain);
out:
	for (size_t i = 0; iv && i < in->n; i++)
		var_release(&iv[i]);
	for (size_t i = 0; ov && i < out->n; i++)
		var_release(&ov[i]);
	free(iv);
	free(ov);
	free(pin);
	free(chain);
	return rc;
}

/*
 * Optimizer states follow their parameter
 * (docs/formats/paddle.md#aoa-statements): the state of parameter X is saved
 * under prefix + X + suffix, by torch DCP (optim.state.X.exp_avg),
 * Megatron-Core (optimizer.state.exp_avg.X) and Paddle (X.moment1_0, X.w_0 the
 * master weight, X.beta1_pow_acc_0).
 */
static const struct {
	const char *prefix, *suffix;
} state_names[] = {
    {"optim.state.", ".exp_avg"},
    {"optim.state.", ".exp_avg_sq"},
    {"optim.state.", ".max_exp_avg_sq"},
    {"optim.state.", ".momentum_buffer"},
    {"optim.state.", ".step"},
    {"optimizer.state.exp_avg.", ""},
    {"optimizer.state.exp_avg_sq.", ""},
    {"optimizer.state.fp32_param.", ""},
    {"", ".moment1_0"},
    {"", ".moment2_0"},
    {"", ".w_0"},
    {"", ".beta1_pow_acc_0"},
    {"", ".beta2_pow_acc_0"},
    {"", "/moment1_0"},
    {"", "/moment2_0"},
    {"", "/beta1_pow_acc_0"},
    {"", "/beta2_pow_acc_0"},
    {"", "_fp32_master_0"},
    {"", "_fp32_master_0_moment1_0"},
    {"", "_fp32_master_0_moment2_0"},
};

static char *state_name(size_t f, const char *s)
{
	size_t n = strlen(state_names[f].prefix) + strlen(s) +
		   strlen(state_names[f].suffix) + 1;
	char *m = malloc(n);

	if (m)
		snprintf(m, n, "%s%s%s", state_names[f].prefix, s,
			 state_names[f].suffix);
	return m;
}

static size_t nstates(void)
{
	return sizeof(state_names) / sizeof(state_names[0]);
}

/* The dims of name (a variable or a source tensor); false: none. */
static bool name_shape(cc *c, const char *name, int *ndim, int64_t *shape)
{
	const var *v = find_var(c, name);
	const flx_tensor *t = v ? NULL : flx_ckpt_find(c->src, name);

	if (!v && !t)
		return false;
	*ndim = v ? v->ndim : t->ndim;
	memcpy(shape, v ? v->shape : t->shape, sizeof(int64_t) * FLX_MAX_DIMS);
	return true;
}

/* ns mapped through state f ("_" stays). */
static int state_names_of(size_t f, const names *ns, names *out)
{
	for (size_t i = 0; i < ns->n; i++) {
		const char *s = ns->s[i];
		size_t n = strlen(state_names[f].prefix) + strlen(s) +
			   strlen(state_names[f].suffix) + 1;
		char *m = malloc(n);

		if (!m)
			return -ENOMEM;
		if (strcmp(s, "_") == 0)
			strcpy(m, "_");
		else
			snprintf(m, n, "%s%s%s", state_names[f].prefix, s,
				 state_names[f].suffix);
		if (names_add(out, m, ns->t[i], NULL))
			return -ENOMEM;
	}
	return 0;
}

/* A state not shaped as its parameter (a step, a beta power): each
 * destination takes it from the first source; the others are dropped. */
static int follow_scalar(cc *c, const names *in, const names *out)
{
	char *chain = NULL;
	int rc = 0;

	for (size_t i = 1; i < in->n && !rc; i++) {
		var *v = find_var(c, in->s[i]);

		if (v)
			v->live = false;
		else
			rc = flx_xform_drop(c->p->x, in->s[i], c->err);
	}
	for (size_t j = 0; j < out->n && !rc; j++) {
		var v = {0};

		if (strcmp(out->s[j], "_") == 0) {
			names one = {.s = in->s, .t = in->t, .n = 1};
			names drop = {.s = out->s + j, .t = out->t, .n = 1};

			rc = run_instance(c, &one, &drop);
			continue;
		}
		rc = resolve(c, in->s[0], false, &v, &chain);
		if (!rc)
			rc = define(c, out->s[j], &v, chain);
		var_release(&v);
	}
	free(chain);
	return rc;
}

/* Which optimizer states follow an instance, decided before it runs (it
 * may write a parameter's name again): kind[f] 0 none, 1 shaped as the
 * parameters, 2 another shape (taken from one source). */
static void plan_followers(cc *c, const names *in, unsigned char *kind)
{
	for (size_t f = 0; f < nstates(); f++) {
		bool all = in->n > 0, same = true;

		for (size_t i = 0; i < in->n && all; i++) {
			char *sf = state_name(f, in->s[i]);
			int pn, sn;
			int64_t ps[FLX_MAX_DIMS], ss[FLX_MAX_DIMS];

			all = sf && strcmp(in->s[i], "_") &&
			      name_shape(c, sf, &sn, ss) &&
			      name_shape(c, in->s[i], &pn, ps);
			same &= all && pn == sn &&
				!memcmp(ps, ss, sizeof(int64_t) * (size_t)pn);
			free(sf);
		}
		kind[f] = !all ? 0 : same ? 1 : 2;
	}
}

/* The optimizer states of an instance's sources, through the instance. */
static int run_followers(cc *c, const names *in, const names *out,
			 const unsigned char *kind)
{
	int rc = 0;

	for (size_t f = 0; f < nstates() && !rc; f++) {
		names si = {0}, so = {0};

		if (!kind[f])
			continue;
		rc = state_names_of(f, in, &si);
		if (!rc)
			rc = state_names_of(f, out, &so);
		if (!rc) {
			c->follower = true;
			rc = kind[f] == 1 ? run_instance(c, &si, &so)
					  : follow_scalar(c, &si, &so);
			c->follower = false;
		}
		names_free(&si);
		names_free(&so);
	}
	return rc;
}

static int note(cc *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int note(cc *c, const char *fmt, ...)
{
	flx_aoa_prog *p = c->p;
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (flx_grow((void **)&p->notes, &p->capnotes, p->nnotes + 1,
		     sizeof(*p->notes)))
		return -ENOMEM;
	if (!(p->notes[p->nnotes] = strdup(buf)))
		return -ENOMEM;
	p->nnotes++;
	return 0;
}

/* Whether an instance reads anything: a name that exists on the left. */
static bool instance_matches(cc *c, const names *in)
{
	for (size_t i = 0; i < in->n; i++)
		if (strcmp(in->s[i], "_") == 0 || name_exists(c, in->s[i]))
			return true;
	return false;
}

/* Index i of axis a of v, the axis removed (a stacked layer). */
static int var_unstack(const var *v, int a, int64_t i, var *out)
{
	int rc = var_slice(v, a, i, 1, out);

	for (size_t k = 0; k < out->np && !rc; k++) {
		cstep s = {.kind = CS_UNSTACK, .axis = a};
		cpiece *p = &out->p[k];

		for (int d = a; d + 1 < v->ndim; d++) {
			p->at[d] = p->at[d + 1];
			p->shape[d] = p->shape[d + 1];
		}
		rc = piece_step(p, &s);
	}
	for (int d = a; d + 1 < v->ndim; d++)
		out->shape[d] = out->shape[d + 1];
	out->ndim--;
	return rc;
}

/* v with a new axis a of extent 1, in place. */
static int var_unsqueeze(var *v, int a)
{
	for (size_t k = 0; k < v->np; k++) {
		cstep s = {.kind = CS_UNSQUEEZE, .axis = a};
		cpiece *p = &v->p[k];

		for (int d = v->ndim; d > a; d--) {
			p->at[d] = p->at[d - 1];
			p->shape[d] = p->shape[d - 1];
		}
		p->at[a] = 0;
		p->shape[a] = 1;
		if (piece_step(p, &s))
			return -ENOMEM;
	}
	for (int d = v->ndim; d > a; d--)
		v->shape[d] = v->shape[d - 1];
	v->shape[a] = 1;
	v->ndim++;
	return 0;
}

/* "A -> B.$LAYER_ID, axis=k": one destination per index of axis k of A
 * (default 0), the axis removed: a stacked tensor unstacked. */
static int unstack_one(cc *c, const char *from, bool t, const char *tmpl)
{
	const astmt *st = c->st;
	int a = st->has_axis ? st->axis : 0, rc;
	var in = {0};
	char *chain = NULL;

	rc = resolve(c, from, t, &in, &chain);
	if (!rc && a >= in.ndim)
		rc = cfail(c, "axis %d but the tensor has %d axes", a, in.ndim);
	for (int64_t i = 0; !rc && i < in.shape[a]; i++) {
		int64_t ids[2] = {i, i};
		var o;
		char *name;

		rc = substitute(c, tmpl, ids, 0, &name);
		if (rc)
			break;
		rc = var_unstack(&in, a, i, &o);
		if (!rc)
			rc = define(c, name, &o, chain);
		var_release(&o);
		free(name);
	}
	var_release(&in);
	free(chain);
	return rc;
}

/* prefix + s + suffix of optimizer state f (state_names[]). */
static char *state_name(size_t f, const char *s);
static size_t nstates(void);
static bool name_shape(cc *c, const char *name, int *ndim, int64_t *shape);

static int run_unstack(cc *c)
{
	const astmt *st = c->st;
	const char *from = st->in[0].name, *to = st->out[0].name;
	int pn, sn, rc;
	int64_t ps[FLX_MAX_DIMS], ss[FLX_MAX_DIMS];

	if (st->nin != 1 || st->nout != 1 || st->macro || st->has_dtype ||
	    st->has_permute || st->has_reshape ||
	    strstr(to, "$LAYER_ID_OFFSET") || strchr(from, '*') ||
	    strchr(to, '*'))
		return cfail(c, "a $ macro on the right only unstacks one "
				"source into one name, with axis= at most");
	if (!name_shape(c, from, &pn, ps))
		return note(c, "AOA statement %zu matches no tensor: %s",
			    st->no, st->text);
	rc = unstack_one(c, from, st->in[0].t, to);
	/* the optimizer states shaped as the parameter follow it */
	for (size_t f = 0; f < nstates() && !rc; f++) {
		char *sf = state_name(f, from), *stt = state_name(f, to);

		if (!sf || !stt)
			rc = -ENOMEM;
		else if (name_shape(c, sf, &sn, ss) && sn == pn &&
			 !memcmp(ps, ss, sizeof(int64_t) * (size_t)pn))
			rc = unstack_one(c, sf, st->in[0].t, stt);
		free(sf);
		free(stt);
	}
	return rc;
}

/* "A.$LAYER_ID -> B, axis=k": the instances' sources, ids 0..n-1 in
 * order, stacked along a new axis k (default 0). */
static int stack_one(cc *c, const combo *combos, size_t n, const char *tmpl,
		     bool t, const char *to)
{
	const astmt *st = c->st;
	int a = st->has_axis ? st->axis : 0, rc = 0;
	var *v = calloc(n ? n : 1, sizeof(var)), out = {0};
	var **pv = calloc(n ? n : 1, sizeof(var *));
	char *chain = NULL;

	if (!v || !pv)
		rc = -ENOMEM;
	for (size_t k = 0; k < n && !rc; k++) {
		char *name;

		if (combos[k].ids[0] != (int64_t)k &&
		    combos[k].ids[1] != (int64_t)k)
			rc = cfail(c,
				   "stacking needs the ids 0 to %zu, %zu is "
				   "missing",
				   n - 1, k);
		if (!rc)
			rc = substitute(c, tmpl, combos[k].ids, 0, &name);
		if (rc)
			break;
		rc = resolve(c, name, t, &v[k], &chain);
		free(name);
		if (!rc && a > v[k].ndim)
			rc = cfail(c, "axis %d but the tensor has %d axes", a,
				   v[k].ndim);
		if (!rc)
			rc = var_unsqueeze(&v[k], a);
		pv[k] = &v[k];
	}
	if (!rc)
		rc = var_concat(c, pv, n, a, &out);
	if (!rc)
		rc = define(c, to, &out, chain);
	for (size_t k = 0; v && k < n; k++)
		var_release(&v[k]);
	var_release(&out);
	free(v);
	free(pv);
	free(chain);
	return rc;
}

/* Whether a state of dims ss (sn axes) is a row of the stacked result
 * of dims ps (pn axes) along axis a. */
static bool same_rows(const int64_t *ps, int pn, const int64_t *ss, int sn,
		      int a)
{
	if (pn != sn + 1)
		return false;
	for (int d = 0; d < sn; d++)
		if (ss[d] != ps[d < a ? d : d + 1])
			return false;
	return true;
}

static int run_stack(cc *c, const combo *combos, size_t n)
{
	const astmt *st = c->st;
	const char *tmpl = st->in[0].name;
	int rc;

	if (st->nin != 1 || st->nout != 1 || st->macro || st->has_dtype ||
	    st->has_permute || st->has_reshape || strchr(tmpl, '*'))
		return cfail(c, "a $ macro on the left only stacks one name "
				"into one destination, with axis= at most");
	if (!n)
		return note(c, "AOA statement %zu matches no tensor: %s",
			    st->no, st->text);
	rc = stack_one(c, combos, n, tmpl, st->in[0].t, st->out[0].name);
	/* the optimizer states shaped as the parameter follow it */
	for (size_t f = 0; f < nstates() && !rc; f++) {
		char *sf = state_name(f, tmpl), *first = NULL;
		char *sto = state_name(f, st->out[0].name);
		int pn, sn;
		int64_t ps[FLX_MAX_DIMS], ss[FLX_MAX_DIMS];

		rc = sf && sto ? substitute(c, sf, combos[0].ids, 0, &first)
			       : -ENOMEM;
		/* the parameter itself is consumed: its state is compared
		 * with the stacked result's rows */
		if (!rc && name_shape(c, first, &sn, ss) &&
		    name_shape(c, st->out[0].name, &pn, ps) &&
		    same_rows(ps, pn, ss, sn, st->has_axis ? st->axis : 0))
			rc = stack_one(c, combos, n, sf, st->in[0].t, sto);
		free(first);
		free(sf);
		free(sto);
	}
	return rc;
}

static int compile_statement(cc *c)
{
	const astmt *st = c->st;
	const char *driver = NULL;
	combo *combos = NULL, one = {.ids = {-1, -1}};
	size_t ncombo = 1, matched = 0;
	int rc = 0;

	for (size_t i = 0; i < st->nin && !driver; i++)
		if (has_id_macro(st->in[i].name))
			driver = st->in[i].name;
	bool rmacro = false;

	for (size_t i = 0; i < st->nout; i++)
		rmacro |= has_id_macro(st->out[i].name);
	if (!driver && rmacro)
		return run_unstack(c);
	if (driver)
		rc = find_combos(c, driver, &combos, &ncombo);
	if (!rc && driver && !rmacro && strcmp(st->out[0].name, "_")) {
		rc = run_stack(c, combos, ncombo);
		free(combos);
		return rc;
	}
	for (size_t k = 0; k < ncombo && !rc; k++) {
		names in = {0}, out = {0};
		const int64_t *ids = combos ? combos[k].ids : one.ids;

		if (++c->instances > FLX_AOA_MAX_EXPANSION)
			rc = cfail(c, "more than %d statement instances",
				   FLX_AOA_MAX_EXPANSION);
		if (!rc)
			rc = instance_names(c, st->in, st->nin, ids, 0, NULL,
					    &in);
		if (!rc)
			rc = instance_names(c, st->out, st->nout, ids, 1, &in,
					    &out);
		if (rc == -ERANGE) {
			rc = note(c,
				  "AOA statement %zu: layer %lld has no "
				  "layer before it ($LAYER_ID_OFFSET); its "
				  "tensors are left as they are",
				  st->no, (long long)ids[0]);
			names_free(&in);
			names_free(&out);
			continue;
		}
		if (!rc && in.n && instance_matches(c, &in)) {
			matched++;
			unsigned char
			    kind[sizeof(state_names) / sizeof(state_names[0])];

			plan_followers(c, &in, kind);
			rc = run_instance(c, &in, &out);
			if (!rc)
				rc = run_followers(c, &in, &out, kind);
		}
		names_free(&in);
		names_free(&out);
	}
	free(combos);
	if (rc == -E2BIG)
		rc =
		    cfail(c, "a tensor made of more than %d boxes", MAX_PIECES);
	if (!rc && !matched)
		rc = note(c, "AOA statement %zu matches no tensor: %s", st->no,
			  st->text);
	return rc;
}

/* ---- the compiled program ---- */

/* A box "[lo:hi, ...]" appended to buf. */
static size_t put_box(char *buf, size_t len, size_t k, int ndim,
		      const int64_t *lo, const int64_t *ext)
{
	k += (size_t)snprintf(buf + k, k < len ? len - k : 0, "[");
	for (int d = 0; d < ndim; d++)
		k += (size_t)snprintf(buf + k, k < len ? len - k : 0,
				      "%s%lld:%lld", d ? ", " : "",
				      (long long)lo[d],
				      (long long)(lo[d] + ext[d]));
	k += (size_t)snprintf(buf + k, k < len ? len - k : 0, "]");
	return k;
}

/* Piece p of v as "source[box] transpose(...) cast(...) -> [box]": the
 * box of the source tensor it reads, the chain applied to it, and the box
 * of the target it fills. */
static int describe_piece(const cc *c, const var *v, const cpiece *p,
			  char **out)
{
	const flx_tensor *t = flx_ckpt_find(c->src, p->src);
	int64_t lo[FLX_MAX_DIMS] = {0}, ext[FLX_MAX_DIMS];
	int map[FLX_MAX_DIMS + 1], nd = t->ndim, cn = nd;
	flx_dtype to = FLX_DT_INVALID;
	bool moved = false;
	char buf[2048];
	size_t k;

	memcpy(ext, t->shape, sizeof(ext));
	for (int d = 0; d < nd; d++)
		map[d] = d; /* current axis d is source axis map[d], -1: new */
	for (size_t j = 0; j < p->nst; j++) {
		const cstep *s = &p->st[j];
		int m[FLX_MAX_DIMS], a = s->axis;

		if ((s->kind == CS_SLICE || s->kind == CS_UNSTACK) &&
		    map[a] >= 0) {
			lo[map[a]] += s->start;
			ext[map[a]] = s->kind == CS_SLICE ? s->len : 1;
		}
		if (s->kind == CS_CAST) {
			to = s->to;
		} else if (s->kind == CS_UNSTACK) {
			memmove(map + a, map + a + 1,
				(size_t)(cn - a - 1) * sizeof(int));
			cn--;
		} else if (s->kind == CS_UNSQUEEZE) {
			memmove(map + a + 1, map + a,
				(size_t)(cn - a) * sizeof(int));
			map[a] = -1;
			cn++;
		} else if (s->kind == CS_TRANSPOSE) {
			for (int d = 0; d < cn; d++)
				m[d] = map[s->perm[d]];
			memcpy(map, m, sizeof(m));
		}
	}
	moved = cn != nd;
	for (int d = 0; d < cn; d++)
		moved |= map[d] != d;
	k = (size_t)snprintf(buf, sizeof(buf), "%s", p->src);
	k = put_box(buf, sizeof(buf), k, nd, lo, ext);
	if (moved) {
		/* permute(...) when the axes are only reordered; axes(...)
		 * with "new" for added ones when some were added or dropped */
		k += (size_t)snprintf(buf + k,
				      k < sizeof(buf) ? sizeof(buf) - k : 0,
				      cn == nd ? " permute(" : " axes(");
		for (int d = 0; d < cn; d++)
			k += (size_t)snprintf(
			    buf + k, k < sizeof(buf) ? sizeof(buf) - k : 0,
			    map[d] < 0 ? "%snew" : "%s%d", d ? "," : "",
			    map[d]);
		k += (size_t)snprintf(
		    buf + k, k < sizeof(buf) ? sizeof(buf) - k : 0, ")");
	}
	if (to != FLX_DT_INVALID)
		k += (size_t)snprintf(buf + k,
				      k < sizeof(buf) ? sizeof(buf) - k : 0,
				      " cast(%s)", flx_dtype_name(to));
	k += (size_t)snprintf(buf + k, k < sizeof(buf) ? sizeof(buf) - k : 0,
			      " -> ");
	put_box(buf, sizeof(buf), k, v->ndim, p->at, p->shape);
	*out = strdup(buf);
	return *out ? 0 : -ENOMEM;
}

/* Variable v as a placed target of the list. */
static int emit(cc *c, const var *v)
{
	flx_xform *x = c->p->x;
	int rc = flx_xform_target(x, v->name, FLX_XFORM_PLACED, c->err);

	for (size_t i = 0; i < v->np && !rc; i++) {
		const cpiece *p = &v->p[i];

		rc = flx_xform_piece_at(x, p->src, v->ndim, p->at, c->err);
		for (size_t j = 0; j < p->nst && !rc; j++) {
			const cstep *s = &p->st[j];

			if (s->kind == CS_SLICE)
				rc = flx_xform_slice(x, s->axis, s->start,
						     s->len, c->err);
			else if (s->kind == CS_CAST)
				rc = flx_xform_cast(x, s->to, c->err);
			else if (s->kind == CS_UNSTACK)
				rc = flx_xform_unstack(x, s->axis, s->start,
						       c->err);
			else if (s->kind == CS_UNSQUEEZE)
				rc = flx_xform_unsqueeze(x, s->axis, c->err);
			else
				rc = flx_xform_transpose(x, s->ndim, s->perm,
							 c->err);
		}
	}
	return rc;
}

/*
 * The key-value groups of a Megatron source's attention for fused_qkv
 * (docs/facts.md): args.num_query_groups under group_query_attention,
 * the heads without it; group_query_attention absent: whichever of the
 * two linear_qkv's rows ((heads + 2 groups) x kv_channels) fit, when
 * exactly one does; else 0 (unknown: a statement that needs it is
 * refused, naming -o aoa_num_key_value_groups=).
 */
static int64_t megatron_groups(const flx_ckpt *src, const flx_megatron *m,
			       int64_t heads)
{
	static const char suf[] = "self_attention.linear_qkv.weight";
	const size_t k = sizeof(suf) - 1;
	int64_t g = m->num_query_groups, kv = m->kv_channels, rows = -1;

	if (m->group_query_attention == 0)
		return heads;
	if (m->group_query_attention == 1)
		return g > 0 ? g : 0;
	if (heads <= 0 || g <= 0 || kv <= 0)
		return 0;
	if (g == heads)
		return g;
	for (size_t i = 0; i < src->ntensors && rows < 0; i++) {
		const flx_tensor *t = &src->tensors[i];
		size_t len = strlen(t->fqn);

		if (len >= k && !strcmp(t->fqn + len - k, suf) && t->ndim >= 2)
			rows = t->shape[t->ndim - 2];
	}
	if (rows < 0 ||
	    (rows == (heads + 2 * g) * kv) == (rows == 3 * heads * kv))
		return 0;
	return rows == 3 * heads * kv ? heads : g;
}

int flx_aoa_compile(const flx_aoa *a, const flx_ckpt *src,
		    const flx_aoa_opts *o, flx_aoa_prog **out, flx_error *err)
{
	cc c = {.a = a, .src = src, .err = err};
	const flx_megatron *mg = flx_megatron_of(src);
	size_t nout = 0;
	int rc;

	c.tp = o && o->tp > 0 ? o->tp : 1;
	c.heads = o ? o->num_heads : 0;
	c.groups = o ? o->num_kv_groups : 0;
	c.src_tp = o && o->src_tp > 0 ? o->src_tp : 0;
	if (mg && !c.heads && mg->num_attention_heads > 0)
		c.heads = mg->num_attention_heads;
	if (mg && !c.groups)
		c.groups = megatron_groups(src, mg, c.heads);
	c.p = calloc(1, sizeof(*c.p));
	if (!c.p)
		return flx_error_default(err, -ENOMEM, a->origin);
	rc = flx_xform_new(a->origin, &c.p->x);
	for (size_t i = 0; i < a->n && !rc; i++) {
		c.st = &a->st[i];
		rc = compile_statement(&c);
		if (rc && err && !err->code) /* -ENOMEM from deep inside */
			stmt_error(&c, rc, strerror(-rc));
	}
	for (size_t i = 0; i < c.nv; i++)
		nout += c.v[i].live;
	if (!rc && nout) {
		c.p->tname = calloc(nout, sizeof(char *));
		c.p->tchain = calloc(nout, sizeof(char *));
		c.p->tsrc = calloc(nout, sizeof(char **));
		c.p->tnsrc = calloc(nout, sizeof(size_t));
		if (!c.p->tname || !c.p->tchain || !c.p->tsrc || !c.p->tnsrc)
			rc = -ENOMEM;
	}
	for (size_t i = 0; i < c.nv && !rc; i++) {
		const var *v = &c.v[i];
		size_t t = c.p->ntargets;

		if (!v->live)
			continue;
		c.p->ntargets++;
		rc = emit(&c, v);
		if (!rc && (!(c.p->tname[t] = strdup(v->name)) ||
			    !(c.p->tchain[t] = strdup(v->chain)) ||
			    !(c.p->tsrc[t] = calloc(v->np, sizeof(char *)))))
			rc = -ENOMEM;
		for (size_t k = 0; k < v->np && !rc; k++) {
			rc = describe_piece(&c, v, &v->p[k], &c.p->tsrc[t][k]);
			c.p->tnsrc[t] += !rc;
		}
	}
	for (size_t i = 0; i < c.nv; i++)
		var_release(&c.v[i]);
	free(c.v);
	free(c.slot);
	if (rc) {
		flx_error_default(err, rc, a->origin);
		flx_aoa_prog_free(c.p);
		return rc;
	}
	*out = c.p;
	return 0;
}

const flx_xform *flx_aoa_prog_xform(const flx_aoa_prog *p)
{
	return p->x;
}

int flx_aoa_prog_note(const flx_aoa_prog *p, size_t i, char *buf, size_t len)
{
	if (!p || i >= p->nnotes)
		return -ENOENT;
	snprintf(buf, len, "%s", p->notes[i]);
	return 0;
}

size_t flx_aoa_prog_nnotes(const flx_aoa_prog *p)
{
	return p ? p->nnotes : 0;
}

int flx_aoa_prog_target(const flx_aoa_prog *p, size_t i, const char **name,
			const char **chain, size_t *nsources)
{
	if (!p || i >= p->ntargets)
		return -ENOENT;
	*name = p->tname[i];
	*chain = p->tchain[i];
	*nsources = p->tnsrc[i];
	return 0;
}

const char *flx_aoa_prog_source(const flx_aoa_prog *p, size_t i, size_t k)
{
	return p && i < p->ntargets && k < p->tnsrc[i] ? p->tsrc[i][k] : NULL;
}

void flx_aoa_prog_free(flx_aoa_prog *p)
{
	if (!p)
		return;
	flx_xform_free(p->x);
	for (size_t i = 0; i < p->nnotes; i++)
		free(p->notes[i]);
	for (size_t i = 0; i < p->ntargets; i++) {
		free(p->tname[i]);
		free(p->tchain[i]);
		for (size_t k = 0; k < p->tnsrc[i]; k++)
			free(p->tsrc[i][k]);
		free(p->tsrc[i]);
	}
	free(p->notes);
	free(p->tname);
	free(p->tchain);
	free(p->tsrc);
	free(p->tnsrc);
	free(p);
}

/* ---- options ---- */

/* A strict decimal in [1, 2^20] (heads, groups) or [1, 2^16] (src_tp). */
static int check_count(const flx_opt *o, const char *value, uint64_t *num,
		       flx_error *err)
{
	uint64_t v = 0;
	const char *p = value;
	bool ok = p && *p && strlen(p) <= 19;

	for (; ok && *p; p++) {
		ok = *p >= '0' && *p <= '9';
		v = v * 10 + (uint64_t)(*p - '0');
	}
	if (!ok || v < 1 || v > o->max)
		return flx_error_set(err, -EINVAL, NULL, o->name,
				     "expected an integer in [1, 2^%d], "
				     "got '%s'",
				     o->max == (1u << 16) ? 16 : 20,
				     value ? value : "");
	*num = v;
	return 0;
}

static const flx_opt aoa_opts[] = {
    {.name = "aoa_num_heads",
     .type = FLX_OPT_UINT,
     .metavar = "H",
     .help = "fused_qkv's number of heads where an AOA statement omits it",
     .min = 1,
     .max = 1u << 20,
     .check = check_count},
    {.name = "aoa_num_key_value_groups",
     .type = FLX_OPT_UINT,
     .metavar = "G",
     .help = "fused_qkv's number of key-value groups where an AOA "
	     "statement omits it",
     .min = 1,
     .max = 1u << 20,
     .check = check_count},
    {.name = "aoa_src_tp",
     .type = FLX_OPT_UINT,
     .metavar = "N",
     .help = "fused_ffn's and fused_qkv_old's src_tp where an AOA "
	     "statement omits it (the source's TP degree)",
     .min = 1,
     .max = 1u << 16,
     .check = check_count},
};

const flx_opt_group flx_aoa_opt_group = {
    .owner = "aoa",
    .title = "AOA transform (aoa_statements of a rules file)",
    .opts = aoa_opts,
    .nopts = FLX_OPT_COUNT(aoa_opts),
};

flx_aoa_opts flx_aoa_opts_from(const flx_opt_vals *vals, int tp)
{
	flx_aoa_opts o = {.tp = tp};
	uint64_t v;

	if (!flx_opt_u64(vals, "aoa_num_heads", &v))
		o.num_heads = (int64_t)v;
	if (!flx_opt_u64(vals, "aoa_num_key_value_groups", &v))
		o.num_kv_groups = (int64_t)v;
	if (!flx_opt_u64(vals, "aoa_src_tp", &v))
		o.src_tp = (int64_t)v;
	return o;
}

/* ---- statements of a rules file ---- */

static int stmt_parse(const char *const *v, size_t n, const char *origin,
		      void **out, flx_error *err)
{
	flx_aoa *a = NULL;
	int rc = flx_aoa_parse(v, n, origin, &a, err);

	*out = a;
	return rc;
}

static void stmt_free(void *stmts)
{
	flx_aoa_free(stmts);
}

const flx_stmt_kind flx_aoa_stmt_kind = {
    .key = "aoa_statements",
    .parse = stmt_parse,
    .free = stmt_free,
};

const flx_aoa *flx_aoa_of_spec(const flx_spec *s)
{
	for (int i = 0; i < FLX_MAX_STMT_KINDS && flx_stmt_kinds[i]; i++)
		if (flx_stmt_kinds[i] == &flx_aoa_stmt_kind)
			return s->stmts[i];
	return NULL;
}
