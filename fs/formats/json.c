/* SPDX-License-Identifier: MIT */
/*
 * The JSON writer of the generated formats; see json_internal.h.  It
 * mirrors jansson's dump.c (separators, indentation, escapes).
 */
#include "json_internal.h"

#include "names.h"

#include <errno.h>

static const char spaces[] = "                                ";

void flx_jw_spaces(flx_jw *w, uint64_t n)
{
	while (n) {
		size_t k =
		    n < sizeof(spaces) - 1 ? (size_t)n : sizeof(spaces) - 1;

		flx_jw_raw(w, spaces, k);
		n -= k;
	}
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

bool flx_json_plain(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	while (plain(*p))
		p++;
	return !*p;
}

void flx_jw_quote(flx_jw *w)
{
	if (w->quoted)
		flx_jw_raw(w, "\\\"", 2);
	else
		flx_jw_raw(w, "\"", 1);
}

/*
 * Plain ASCII needs no escape at either level.  An escape of this level
 * (\", \n, \u001F), when quoted, is escaped again by the enclosing
 * document; non-ASCII is kept as is here unless ensure_ascii, but always
 * escaped when quoted (the enclosing document is ensure_ascii).
 * Sequences are decoded with at most 4 bytes of look-ahead, which stops
 * at the NUL (not a continuation byte), so s is never read past its end.
 */
void flx_jw_str(flx_jw *w, const char *s)
{
	const unsigned char *p, *run;

	if (!s) {
		w->err = -EINVAL;
		return;
	}
	p = run = (const unsigned char *)s;
	if (flx_jw_sizing(w)) {
		/* a plain string is its length and two quotes (each escaped
		 * when quoted) */
		while (plain(*p))
			p++;
		if (!*p) {
			w->pos += (uint64_t)(p - run) + (w->quoted ? 4 : 2);
			return;
		}
		p = run;
	}
	flx_jw_quote(w);
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
		flx_jw_raw(w, run, (size_t)(p - run));
		n = escape_cp(esc, cp);
		if (w->quoted && cp < 0x80) {
			/* escape the escape: its \ and " */
			for (size_t i = 0; i < n; i++) {
				if (esc[i] == '\\' || esc[i] == '"')
					flx_jw_raw(w, "\\", 1);
				flx_jw_raw(w, esc + i, 1);
			}
		} else {
			flx_jw_raw(w, esc, n);
		}
		p += k;
		run = p;
	}
	flx_jw_raw(w, run, (size_t)(p - run));
	flx_jw_quote(w);
}

void flx_jw_name(flx_jw *w, const char *s)
{
	if (!w->plain_names) {
		flx_jw_str(w, s);
		return;
	}
	flx_jw_quote(w);
	flx_jw_raw(w, s, strlen(s));
	flx_jw_quote(w);
}

void flx_jw_int(flx_jw *w, int64_t v)
{
	char b[24];

	/* sizing needs only the length: the mount sizes every header of
	 * every rank this way */
	if (flx_jw_sizing(w)) {
		w->pos += flx_int_len(v);
		return;
	}
	flx_jw_raw(w, b, flx_fmt_int(b, v, 1));
}

void flx_jw_int_or_null(flx_jw *w, int v)
{
	if (v < 0)
		flx_jw_lit(w, "null");
	else
		flx_jw_int(w, v);
}

void flx_jw_ints(flx_jw *w, int n, const int64_t *v)
{
	flx_jw_open(w, '[');
	for (int i = 0; i < n; i++) {
		flx_jw_item(w);
		flx_jw_int(w, v[i]);
	}
	flx_jw_close(w, ']');
}
