/* SPDX-License-Identifier: MIT */
/*
 * flexfs-inspect --svg (see inspect_svg.h): the (file, rank, group) byte
 * flows of a plan, summed from its views' pieces, drawn as a Sankey
 * diagram.  Positions are the bytes before them times one scale, so the
 * bands leaving a file and those reaching a rank tile their boxes.
 */

#include "inspect_svg.h"

#include "ckpt.h"
#include "view.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Geometry, in SVG user units (pixels at 100%).  The picture is at least
 * SVG_MIN_W wide (a 1000-pixel window less a scroll bar) and, up to
 * SVG_LEGEND_ROWS tensor groups and about 70 files or ranks, fits
 * SVG_FIT_H high (a 800-pixel window), legend included: the legend is a
 * column right of the ranks' labels, and the bands take the width the
 * labels leave. */
#define SVG_MIN_W	980
#define SVG_FIT_H	780
#define SVG_TOP		40
#define SVG_MIN_H	240 /* height of all the bytes, at least */
#define SVG_GAP		6   /* between two boxes of a column */
#define SVG_MARGIN	10
#define BOX_W		20
#define BAND_MIN	300 /* the bands' span, at least */
#define LEGEND_DY	14
#define LABEL_DY	12 /* a label's height: labels closer are left out */
#define SVG_LEGEND_ROWS ((SVG_FIT_H - SVG_TOP) / LEGEND_DY)
#define CHAR_W                                                                 \
	6.8 /* a character of the 12-unit sans-serif font, at most about */
#define LABEL_CHARS    48 /* a file or group label's characters, at most */
#define BAND_LABEL_MIN 12 /* a band this thick gets its group's name */
/* Bytes that a rank reads from a file for one tensor group. */
typedef struct flow {
	uint32_t file, rank, group;
	uint64_t bytes;
	uint64_t at_file; /* bytes of the file's box before this band */
	uint64_t at_rank; /* bytes of the rank's box before this band */
} flow;

typedef struct svg {
	const flx_plan *p;
	char **group; /* sorted, unique: group names */
	size_t ngroups;
	flow *fl;
	size_t nfl, capfl;
	uint64_t *file_bytes; /* per ckpt file: bytes its bands carry */
	uint64_t *rank_bytes; /* per rank, stage-major */
	uint64_t *group_bytes;
	uint64_t total;
} svg;

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The group of a tensor name: every all-digit '.'-component as '*'.
 * @return the name (owned) or NULL (out of memory). */
static char *group_of(const char *fqn)
{
	size_t len = strlen(fqn), o = 0;
	char *g = malloc(len + 1);

	if (!g)
		return NULL;
	for (const char *s = fqn; *s;) {
		size_t n = strcspn(s, ".");
		bool digits = n > 0;

		for (size_t i = 0; i < n; i++)
			digits &= isdigit((unsigned char)s[i]) != 0;
		if (digits) {
			g[o++] = '*';
		} else {
			memcpy(g + o, s, n);
			o += n;
		}
		s += n;
		if (*s)
			g[o++] = *s++;
	}
	g[o] = '\0';
	return g;
}

/* The sorted unique groups of the plan's tensors. */
static int collect_groups(svg *v)
{
	const flx_plan *p = v->p;
	char **g = calloc(p->n ? p->n : 1, sizeof(*g));
	size_t n = 0;

	if (!g)
		return -ENOMEM;
	for (size_t i = 0; i < p->n; i++) {
		g[i] = group_of(p->p[i].src->fqn);
		if (!g[i]) {
			for (size_t j = 0; j < i; j++)
				free(g[j]);
			free(g);
			return -ENOMEM;
		}
	}
	qsort(g, p->n, sizeof(*g), cmp_str);
	for (size_t i = 0; i < p->n; i++) {
		if (n && !strcmp(g[n - 1], g[i]))
			free(g[i]);
		else
			g[n++] = g[i];
	}
	v->group = g;
	v->ngroups = n;
	return 0;
}

static uint32_t group_id(const svg *v, const char *name)
{
	char *const *at =
	    bsearch(&name, v->group, v->ngroups, sizeof(*v->group), cmp_str);

	return (uint32_t)(at - v->group);
}

static int add_flow(svg *v, uint32_t file, uint32_t rank, uint32_t group,
		    uint64_t bytes)
{
	if (v->nfl == v->capfl) {
		size_t cap = v->capfl ? 2 * v->capfl : 1024;
		flow *n = realloc(v->fl, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		v->fl = n;
		v->capfl = cap;
	}
	v->fl[v->nfl++] = (flow){file, rank, group, bytes, 0, 0};
	return 0;
}

static int cmp_by_file(const void *a, const void *b)
{
	const flow *x = a, *y = b;

	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return x->group < y->group ? -1 : x->group > y->group;
}

static int cmp_by_rank(const void *a, const void *b)
{
	const flow *x = *(const flow *const *)a, *y = *(const flow *const *)b;

	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->group < y->group ? -1 : x->group > y->group;
}

/* Every piece of every view a rank serves, then merged per (file, rank,
 * group) and summed per file, rank and group (checked). */
static int collect_flows(svg *v)
{
	const flx_plan *p = v->p;
	int tp = p->spec->tp;
	size_t n = 0;
	bool over = false;

	for (size_t i = 0; i < p->n; i++) {
		const flx_placement *pl = &p->p[i];
		char *g = group_of(pl->src->fqn);
		uint32_t gid;

		if (!g)
			return -ENOMEM;
		gid = group_id(v, g);
		free(g);
		for (int s = pl->stage_lo; s <= pl->stage_hi; s++)
			for (int r = 0; r < tp; r++) {
				const flx_view *w =
				    flx_placement_view(pl, s, r, tp);

				for (size_t k = 0; k < flx_view_npieces(w);
				     k++) {
					int rc = add_flow(
					    v, flx_view_piece_file(w, k),
					    (uint32_t)(s * tp + r), gid,
					    flx_view_piece_bytes(w, k));

					if (rc)
						return rc;
				}
			}
	}
	if (v->nfl)
		qsort(v->fl, v->nfl, sizeof(*v->fl), cmp_by_file);
	for (size_t i = 0; i < v->nfl; i++) {
		flow *f = &v->fl[i];

		if (n && !cmp_by_file(&v->fl[n - 1], f))
			over |= __builtin_add_overflow(
			    v->fl[n - 1].bytes, f->bytes, &v->fl[n - 1].bytes);
		else
			v->fl[n++] = *f;
	}
	v->nfl = n;
	for (size_t i = 0; i < n; i++) {
		flow *f = &v->fl[i];

		f->at_file = v->file_bytes[f->file];
		over |=
		    __builtin_add_overflow(v->file_bytes[f->file], f->bytes,
					   &v->file_bytes[f->file]) ||
		    __builtin_add_overflow(v->rank_bytes[f->rank], f->bytes,
					   &v->rank_bytes[f->rank]) ||
		    __builtin_add_overflow(v->group_bytes[f->group], f->bytes,
					   &v->group_bytes[f->group]) ||
		    __builtin_add_overflow(v->total, f->bytes, &v->total);
	}
	return over ? -EFBIG : 0;
}

/* Each band's place in its rank's box: the bands in (rank, file, group)
 * order, as a rank's box lists them. */
static int place_at_ranks(svg *v)
{
	flow **by = malloc((v->nfl ? v->nfl : 1) * sizeof(*by));
	uint64_t at = 0;

	if (!by)
		return -ENOMEM;
	for (size_t i = 0; i < v->nfl; i++)
		by[i] = &v->fl[i];
	if (v->nfl)
		qsort(by, v->nfl, sizeof(*by), cmp_by_rank);
	for (size_t i = 0; i < v->nfl; i++) {
		if (i && by[i]->rank != by[i - 1]->rank)
			at = 0;
		by[i]->at_rank = at;
		at += by[i]->bytes; /* bounded by the rank's checked sum */
	}
	free(by);
	return 0;
}

/* s as XML character data or attribute value: flx_escape() first (no
 * control or bidi character reaches the reader), then the five XML
 * specials. */
static int put_xml(FILE *f, const char *s)
{
	size_t cap = 3 * strlen(s) + 1;
	char *e = malloc(cap);

	if (!e)
		return -ENOMEM;
	(void)flx_escape(s, false, e, cap); /* 3 bytes per byte: fits */
	for (const char *c = e; *c; c++) {
		switch (*c) {
		case '&':
			fputs("&amp;", f);
			break;
		case '<':
			fputs("&lt;", f);
			break;
		case '>':
			fputs("&gt;", f);
			break;
		case '"':
			fputs("&quot;", f);
			break;
		case '\'':
			fputs("&apos;", f);
			break;
		default:
			fputc(*c, f);
		}
	}
	free(e);
	return 0;
}

static void human(char *buf, size_t len, uint64_t n)
{
	static const char unit[][4] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double x = (double)n;
	int u = 0;

	while (x >= 1024 && u < 5) {
		x /= 1024;
		u++;
	}
	snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", x, unit[u]);
}

static void rank_name(const svg *v, uint32_t rank, char *buf, size_t len)
{
	int tp = v->p->spec->tp;

	snprintf(buf, len, "tp%02d_pp%02d", (int)rank % tp, (int)rank / tp);
}

/* A box's height: its bytes at scale k, at least 1 so that it shows. */
static double height(uint64_t bytes, double k)
{
	double h = (double)bytes * k;

	return h < 1 ? 1 : h;
}

static uint32_t gcd(uint32_t a, uint32_t b)
{
	while (b) {
		uint32_t t = a % b;

		a = b;
		b = t;
	}
	return a;
}

/* Group g of n: n hues evenly spaced around the circle, so no two groups
 * share one; groups next to each other in name order get hues far apart
 * (a step near n/2.618, coprime with n, walks the circle), and past 12
 * groups the lightness alternates too, so close hues still differ. */
static void group_colour(uint32_t g, uint32_t n, char *buf, size_t len)
{
	uint32_t step = (uint32_t)((double)n / 2.618 + 0.5), i;

	if (step == 0)
		step = 1;
	while (n > 1 && gcd(step, n) != 1)
		step++;
	i = n ? (uint32_t)((uint64_t)g * step % n) : 0;
	snprintf(buf, len, "hsl(%u,70%%,%u%%)",
		 n ? (unsigned)((uint64_t)i * 360 / n) : 0u,
		 n > 12 && i % 2 ? 36u : 50u);
}

/* The characters of s (UTF-8). */
static size_t chars(const char *s)
{
	size_t n = 0;

	for (; *s; s++)
		n += ((unsigned char)*s & 0xc0) != 0x80;
	return n;
}

/* The number of characters put_label() shows of s. */
static size_t label_len(const char *s)
{
	size_t n = chars(s);

	return n > LABEL_CHARS ? LABEL_CHARS : n;
}

/* s as a label: whole, or an ellipsis and its last LABEL_CHARS - 1
 * characters (titles keep it whole). */
static int put_label(FILE *f, const char *s)
{
	const char *c = s + strlen(s);

	if (chars(s) <= LABEL_CHARS)
		return put_xml(f, s);
	for (size_t n = 0; n < LABEL_CHARS - 1; c--)
		n += ((unsigned char)c[-1] & 0xc0) != 0x80;
	fputs("\xe2\x80\xa6", f);
	return put_xml(f, c);
}

/* Where everything goes: columns from the left, file labels, file boxes,
 * bands, rank boxes, rank labels, legend; heights from the bytes. */
typedef struct layout {
	double k;	       /* units per byte */
	double file_x, rank_x; /* the boxes' left edges */
	double legend_x, col_w;
	size_t rows, cols; /* the legend's */
	double w, h;
} layout;

static void plan_layout(const svg *v, layout *L)
{
	const flx_ckpt *c = v->p->ckpt;
	size_t nranks = (size_t)v->p->spec->tp * (size_t)v->p->spec->pp;
	size_t nfiles = 0, fchars = 0, gchars = 0, rchars = 0;
	double bytes_h, rest, left, right;
	char h[32];

	for (size_t i = 0; i < c->nfiles; i++)
		if (v->file_bytes[i]) {
			size_t n = label_len(c->files[i].relpath);

			human(h, sizeof(h), v->file_bytes[i]);
			n += strlen(h) + 3;
			fchars = n > fchars ? n : fchars;
			nfiles++;
		}
	for (size_t r = 0; r < nranks; r++) {
		human(h, sizeof(h), v->rank_bytes[r]);
		rchars = strlen(h) + 12 > rchars ? strlen(h) + 12 : rchars;
	}
	for (size_t g = 0; g < v->ngroups; g++) {
		size_t n = label_len(v->group[g]);

		human(h, sizeof(h), v->group_bytes[g]);
		n += strlen(h) + 2;
		gchars = n > gchars ? n : gchars;
	}
	/* the byte column's height: what the gaps leave of SVG_FIT_H */
	nfiles = nfiles > nranks ? nfiles : nranks;
	bytes_h = SVG_FIT_H - SVG_TOP - (double)nfiles * SVG_GAP;
	if (bytes_h < SVG_MIN_H)
		bytes_h = SVG_MIN_H;
	L->k = v->total ? bytes_h / (double)v->total : 0;
	L->rows = v->ngroups < SVG_LEGEND_ROWS ? v->ngroups : SVG_LEGEND_ROWS;
	L->cols = L->rows ? (v->ngroups + L->rows - 1) / L->rows : 0;
	L->col_w = 12 + 6 + (double)gchars * CHAR_W + 16;
	left = SVG_MARGIN + (double)fchars * CHAR_W + 6;
	right = BOX_W + 6 + (double)rchars * CHAR_W + 16 +
		(double)L->cols * L->col_w + SVG_MARGIN;
	/* the bands: what SVG_MIN_W leaves, at least BAND_MIN */
	rest = SVG_MIN_W - left - BOX_W - right;
	if (rest < BAND_MIN)
		rest = BAND_MIN;
	L->file_x = left;
	L->rank_x = left + BOX_W + rest;
	L->legend_x = L->rank_x + BOX_W + 6 + (double)rchars * CHAR_W + 16;
	L->w = L->legend_x + (double)L->cols * L->col_w + SVG_MARGIN;
	L->h = SVG_TOP + bytes_h + (double)nfiles * SVG_GAP;
	if (L->h < SVG_TOP + (double)(L->rows + 1) * LEGEND_DY)
		L->h = SVG_TOP + (double)(L->rows + 1) * LEGEND_DY;
	L->h += SVG_MARGIN;
}

/* Text over bands and boxes: a white halo keeps it readable. */
#define HALO "stroke=\"#fff\" stroke-width=\"3\" paint-order=\"stroke\""

/* A band's visible label, at its rank end, where it is thick enough:
 * its group's name, else the part after the last '*', else its last two
 * '.'-components, else its last one, the first that fits half the
 * band's span. */
static int band_label(const svg *v, const layout *L, FILE *f, const flow *b,
		      double y1, double t)
{
	const char *g = v->group[b->group], *cand[4] = {g, NULL, NULL, NULL};
	double room = (L->rank_x - L->file_x - BOX_W) / 2;
	const char *dot = strrchr(g, '.'), *star = strrchr(g, '*');
	int rc;

	if (t < BAND_LABEL_MIN)
		return 0;
	if (star && star[1] == '.')
		cand[1] = star + 2;
	if (dot) {
		cand[3] = dot + 1;
		for (const char *c = dot; c > g; c--)
			if (c[-1] == '.') {
				cand[2] = c;
				break;
			}
	}
	for (size_t i = 0; i < 4; i++) {
		g = cand[i];
		if (g && *g && (double)label_len(g) * CHAR_W <= room)
			break;
		g = NULL;
	}
	if (!g)
		return 0;
	fprintf(f,
		"<text class=\"band-label\" data-group=\"%" PRIu32
		"\" x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\" " HALO ">",
		b->group, L->rank_x - 6, y1 + t / 2 + 4);
	rc = put_label(f, g);
	fputs("</text>\n", f);
	return rc;
}

static int draw(const svg *v, FILE *f)
{
	const flx_ckpt *c = v->p->ckpt;
	size_t nranks = (size_t)v->p->spec->tp * (size_t)v->p->spec->pp;
	double *ftop = calloc(c->nfiles ? c->nfiles : 1, sizeof(*ftop));
	double *rtop = calloc(nranks, sizeof(*rtop));
	double lh = SVG_TOP, rh = SVG_TOP, y, k, last = -LABEL_DY;
	bool shown;
	char h[32], name[32], colour[32];
	layout L;
	int rc = 0;

	if (!ftop || !rtop) {
		rc = -ENOMEM;
		goto out;
	}
	plan_layout(v, &L);
	k = L.k;
	for (size_t i = 0; i < c->nfiles; i++)
		if (v->file_bytes[i]) {
			ftop[i] = lh;
			lh += height(v->file_bytes[i], k) + SVG_GAP;
		}
	for (size_t r = 0; r < nranks; r++) {
		rtop[r] = rh;
		rh += height(v->rank_bytes[r], k) + SVG_GAP;
	}
	if (L.h < (lh > rh ? lh : rh) + SVG_MARGIN)
		L.h = (lh > rh ? lh : rh) + SVG_MARGIN;
	human(h, sizeof(h), v->total);
	fprintf(f,
		"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
		"height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
		"font-family=\"sans-serif\" font-size=\"12\">\n"
		"<title>flexfs: source files to target ranks (tp=%d pp=%d), "
		"%" PRIu64 " bytes</title>\n"
		"<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n"
		"<text x=\"%d\" y=\"20\" font-size=\"14\">source files "
		"(left) to target ranks tpTT_ppPP (right), tp=%d pp=%d: %s "
		"served; bands by tensor group (layer numbers as *)</text>\n",
		L.w, L.h, L.w, L.h, v->p->spec->tp, v->p->spec->pp, v->total,
		SVG_MARGIN, v->p->spec->tp, v->p->spec->pp, h);
	/* bands first, boxes over their ends */
	fputs("<g id=\"bands\" fill-opacity=\"0.6\">\n", f);
	for (size_t i = 0; i < v->nfl && !rc; i++) {
		const flow *b = &v->fl[i];
		double x0 = L.file_x + BOX_W, x1 = L.rank_x, xm = (x0 + x1) / 2;
		double y0 = ftop[b->file] + (double)b->at_file * k;
		double y1 = rtop[b->rank] + (double)b->at_rank * k;
		double t = (double)b->bytes * k;

		rank_name(v, b->rank, name, sizeof(name));
		group_colour(b->group, (uint32_t)v->ngroups, colour,
			     sizeof(colour));
		fprintf(f,
			"<path fill=\"%s\" data-file=\"%" PRIu32
			"\" data-rank=\"%s\" data-group=\"%" PRIu32
			"\" data-bytes=\"%" PRIu64 "\" d=\"M%.2f %.2fC%.2f "
			"%.2f %.2f %.2f %.2f %.2fL%.2f %.2fC%.2f %.2f %.2f "
			"%.2f %.2f %.2fZ\"><title>",
			colour, b->file, name, b->group, b->bytes, x0, y0, xm,
			y0, xm, y1, x1, y1, x1, y1 + t, xm, y1 + t, xm, y0 + t,
			x0, y0 + t);
		rc = put_xml(f, c->files[b->file].relpath);
		fprintf(f, " -&gt; %s, ", name);
		rc = rc ? rc : put_xml(f, v->group[b->group]);
		fprintf(f, ": %" PRIu64 " bytes</title></path>\n", b->bytes);
	}
	fputs("</g>\n<g id=\"band-labels\" font-size=\"11\">\n", f);
	for (size_t i = 0; i < v->nfl && !rc; i++) {
		const flow *b = &v->fl[i];

		rc = band_label(v, &L, f, b,
				rtop[b->rank] + (double)b->at_rank * k,
				(double)b->bytes * k);
	}
	fputs("</g>\n<g id=\"files\">\n", f);
	for (size_t i = 0; i < c->nfiles && !rc; i++) {
		if (!v->file_bytes[i])
			continue;
		y = ftop[i] + height(v->file_bytes[i], k) / 2 + 4;
		/* a label that would overlap the one above is left to the
		 * box's title */
		shown = y - last >= LABEL_DY;
		if (shown)
			last = y;
		human(h, sizeof(h), v->file_bytes[i]);
		fprintf(
		    f,
		    "<g class=\"file\" data-file=\"%zu\" data-bytes=\"%" PRIu64
		    "\"><title>",
		    i, v->file_bytes[i]);
		rc = put_xml(f, c->files[i].relpath);
		fprintf(f,
			": %" PRIu64 " bytes read by the ranks (file size "
			"%" PRIu64 ")</title><rect x=\"%.2f\" y=\"%.2f\" "
			"width=\"%d\" height=\"%.2f\" fill=\"#555\"/>",
			v->file_bytes[i], c->files[i].size, L.file_x, ftop[i],
			BOX_W, height(v->file_bytes[i], k));
		if (shown) {
			fprintf(f,
				"<text x=\"%.2f\" y=\"%.2f\" "
				"text-anchor=\"end\">",
				L.file_x - 6, y);
			rc = rc ? rc : put_label(f, c->files[i].relpath);
			fprintf(f, " (%s)</text>", h);
		}
		fputs("</g>\n", f);
	}
	fputs("</g>\n<g id=\"ranks\">\n", f);
	for (size_t r = 0; r < nranks && !rc; r++) {
		rank_name(v, (uint32_t)r, name, sizeof(name));
		human(h, sizeof(h), v->rank_bytes[r]);
		fprintf(
		    f,
		    "<g class=\"rank\" data-rank=\"%s\" data-bytes=\"%" PRIu64
		    "\"><title>%s: %" PRIu64 " bytes served</title>"
		    "<rect x=\"%.2f\" y=\"%.2f\" width=\"%d\" height=\"%.2f\" "
		    "fill=\"#555\"/><text x=\"%.2f\" y=\"%.2f\">%s (%s)</text>"
		    "</g>\n",
		    name, v->rank_bytes[r], name, v->rank_bytes[r], L.rank_x,
		    rtop[r], BOX_W, height(v->rank_bytes[r], k),
		    L.rank_x + BOX_W + 6,
		    rtop[r] + height(v->rank_bytes[r], k) / 2 + 4, name, h);
	}
	fprintf(f,
		"</g>\n<g id=\"legend\">\n<text x=\"%.2f\" y=\"%d\">tensor "
		"groups (bytes served, all ranks):</text>\n",
		L.legend_x, SVG_TOP - 4);
	for (size_t g = 0; g < v->ngroups && !rc; g++) {
		double x = L.legend_x + (double)(g / L.rows) * L.col_w;

		y = SVG_TOP + (double)(g % L.rows + 1) * LEGEND_DY;
		group_colour((uint32_t)g, (uint32_t)v->ngroups, colour,
			     sizeof(colour));
		human(h, sizeof(h), v->group_bytes[g]);
		fprintf(f,
			"<g class=\"group\" data-group=\"%zu\" "
			"data-bytes=\"%" PRIu64 "\"><title>",
			g, v->group_bytes[g]);
		rc = put_xml(f, v->group[g]);
		fprintf(f,
			": %" PRIu64 " bytes</title><rect x=\"%.2f\" "
			"y=\"%.2f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
			"<text x=\"%.2f\" y=\"%.2f\">",
			v->group_bytes[g], x, y - 10, colour, x + 18, y);
		rc = rc ? rc : put_label(f, v->group[g]);
		fprintf(f, ": %s</text></g>\n", h);
	}
	fputs("</g>\n</svg>\n", f);
out:
	free(ftop);
	free(rtop);
	return rc;
}

int flx_inspect_svg(const flx_plan *p, FILE *f, const char *name,
		    flx_error *err)
{
	size_t nranks = (size_t)p->spec->tp * (size_t)p->spec->pp;
	svg v = {.p = p};
	int rc = collect_groups(&v);

	if (!rc) {
		v.file_bytes = calloc(p->ckpt->nfiles ? p->ckpt->nfiles : 1,
				      sizeof(*v.file_bytes));
		v.rank_bytes = calloc(nranks, sizeof(*v.rank_bytes));
		v.group_bytes =
		    calloc(v.ngroups ? v.ngroups : 1, sizeof(*v.group_bytes));
		if (!v.file_bytes || !v.rank_bytes || !v.group_bytes)
			rc = -ENOMEM;
	}
	rc = rc ? rc : collect_flows(&v);
	rc = rc ? rc : place_at_ranks(&v);
	rc = rc ? rc : draw(&v, f);
	if (!rc && (fflush(f) || ferror(f)))
		rc = -EIO;
	if (rc == -EFBIG)
		flx_error_set(err, rc, name, NULL,
			      "--svg: byte sums overflow 64 bits");
	else if (rc)
		flx_error_set(err, rc, name, NULL, "--svg: %s", strerror(-rc));
	for (size_t i = 0; i < v.ngroups; i++)
		free(v.group[i]);
	free(v.group);
	free(v.fl);
	free(v.file_bytes);
	free(v.rank_bytes);
	free(v.group_bytes);
	return rc;
}
