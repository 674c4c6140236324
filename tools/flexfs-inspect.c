/* SPDX-License-Identifier: MIT */
/*
 * flexfs-inspect: show what a mount would present, without FUSE.
 *
 *   flexfs-inspect CHECKPOINT [-o tp=N,pp=M,rules=FILE,...] [--json]
 *                  [--rules-template=FILE]
 *
 * Runs the same open -> plan (-> tree) sequence as flexfs, so any error a
 * mount would report is reported here, with the same wording.  The table
 * is read from the plan; --json prints the mounted tree's own index.json,
 * so the JSON has exactly one definition (fs/build.c).
 *
 * A tensor whose split the plan cannot decide (saved along several axes,
 * tp > 1, no rule) does not hide the table: it is shown replicated and
 * marked "?", every such tensor is listed on stderr and the exit status is
 * 1, and --rules-template writes a rules file for them that mounts as is.
 */
#include "ckpt.h"
#include "error.h"
#include "filter.h"
#include "formats/compat.h"
#include "inspect_svg.h"
#include "megatron_legacy.h"
#include "mountopts.h"
#include "optdoc.h"
#include "plan.h"
#include "sha256.h"
#include "stack.h"
#include "transform.h"
#include "tree.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef FLEXFS_VERSION
#define FLEXFS_VERSION "unknown"
#endif

enum {
	COL_FQN,
	COL_DTYPE,
	COL_SHAPE,
	COL_CHUNKS,
	COL_SPLIT,
	COL_STAGE,
	COL_LOCAL,
	NCOLS
};

static const char *const col_names[NCOLS] = {
    "TENSOR", "DTYPE", "SHAPE", "CHUNKS", "SPLIT", "STAGE", "LOCAL (TP)",
};

/* A growable string; on allocation failure it keeps failing (ok = 0). */
typedef struct sbuf {
	char *s;
	size_t len, cap;
	int ok;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!b->ok)
		return;
	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (b->len + (size_t)n + 1 > b->cap) {
		size_t cap = 2 * (b->len + (size_t)n + 1);
		char *s = realloc(b->s, cap);

		if (!s) {
			b->ok = 0;
			return;
		}
		b->s = s;
		b->cap = cap;
	}
	va_start(ap, fmt);
	vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

/* Take the string (owned by the caller), or NULL after a failure. */
static char *sb_take(sbuf *b)
{
	if (!b->ok || !b->s) {
		free(b->s);
		return b->ok ? strdup("") : NULL;
	}
	return b->s;
}

static void sb_shape(sbuf *b, int ndim, const int64_t *shape)
{
	if (ndim == 0)
		sb_printf(b, "()");
	for (int d = 0; d < ndim; d++)
		sb_printf(b, "%s%" PRId64, d ? "x" : "", shape[d]);
}

/* "4 (axis 0)", "4 (axes 0,1)" or "1": saved chunks and their split. */
static void sb_chunks(sbuf *b, const flx_tensor *t)
{
	int axes[FLX_MAX_DIMS], n = 0;
	const char *sep;

	for (int d = 0; d < t->ndim; d++)
		for (uint32_t c = 0; c < t->nchunks; c++)
			if (t->chunks[c].size[d] != t->shape[d]) {
				axes[n++] = d;
				break;
			}
	sep = n > 1 ? " (axes " : " (axis ";
	sb_printf(b, "%" PRIu32, t->nchunks);
	for (int i = 0; i < n; i++)
		sb_printf(b, "%s%d", i ? "," : sep, axes[i]);
	if (n)
		sb_printf(b, ")");
}

static int same_size(const flx_box *a, const flx_box *b, int ndim)
{
	for (int d = 0; d < ndim; d++)
		if (a->size[d] != b->size[d])
			return 0;
	return 1;
}

/* Local shapes per TP rank, runs of equal ones merged: "r0-2: 3x4, r3: 1x4". */
static void sb_local(sbuf *b, const flx_placement *pl, int tp)
{
	int ndim = pl->src->ndim;

	for (int r = 0; r < tp;) {
		const flx_box *box = flx_view_box(pl->views[r]);
		int end = r + 1;

		while (end < tp &&
		       same_size(box, flx_view_box(pl->views[end]), ndim))
			end++;
		if (end - r > 1)
			sb_printf(b, "%sr%d-%d: ", r ? ", " : "", r, end - 1);
		else
			sb_printf(b, "%sr%d: ", r ? ", " : "", r);
		sb_shape(b, ndim, box->size);
		r = end;
	}
}

/* The DTYPE cell: the dtype, then the formats the mount of p serves whose
 * files leave the tensor out, "complex64 (not in safetensors)"
 * (formats/compat.h). */
static void sb_dtype(sbuf *b, const flx_plan *p, flx_dtype dt)
{
	bool any = false;

	sb_printf(b, "%s", flx_dtype_name(dt));
	for (int f = 0; f < FLX_FMT_COUNT; f++) {
		if (!flx_fmt_served(p, (flx_fmt)f) ||
		    !flx_fmt_left_out(p->spec, (flx_fmt)f, dt))
			continue;
		sb_printf(b, "%s%s", any ? ", " : " (not in ",
			  flx_fmt_row((flx_fmt)f)->name);
		any = true;
	}
	if (any)
		sb_printf(b, ")");
}

static int fill_row(const flx_placement *pl, const flx_plan *p, char **row)
{
	const flx_spec *s = p->spec;
	int tp = s->tp;
	const flx_tensor *t = pl->src;
	size_t cap = 3 * strlen(t->fqn) + 1;
	char *name = malloc(cap);
	sbuf b[NCOLS];
	int ok = 1;

	if (!name)
		return -ENOMEM;
	for (int c = 0; c < NCOLS; c++)
		b[c] = (sbuf){.ok = 1};
	/* as the error lines have it: no control or bidi character reaches
	 * the terminal raw */
	(void)flx_escape(t->fqn, false, name, cap);
	sb_printf(&b[COL_FQN], "%s", name);
	free(name);
	sb_dtype(&b[COL_DTYPE], p, t->dtype);
	sb_shape(&b[COL_SHAPE], t->ndim, t->shape);
	sb_chunks(&b[COL_CHUNKS], t);
	if (pl->undecided)
		sb_printf(&b[COL_SPLIT], "?");
	else if (pl->split < 0)
		sb_printf(&b[COL_SPLIT], "-");
	else if (pl->groups > 1) /* G parts, each split: "1x2" */
		sb_printf(&b[COL_SPLIT], "%dx%d", pl->split, pl->groups);
	else
		sb_printf(&b[COL_SPLIT], "%d", pl->split);
	if (pl->stage_lo == pl->stage_hi)
		sb_printf(&b[COL_STAGE], "%d", pl->stage_lo);
	else
		sb_printf(&b[COL_STAGE], "%d-%d", pl->stage_lo, pl->stage_hi);
	sb_local(&b[COL_LOCAL], pl, tp);
	for (int c = 0; c < NCOLS; c++)
		ok &= (row[c] = sb_take(&b[c])) != NULL;
	return ok ? 0 : -ENOMEM;
}

static void print_row(char *const *row, const size_t *w)
{
	for (int c = 0; c < NCOLS; c++)
		if (c == NCOLS - 1)
			printf("%s\n", row[c]);
		else
			printf("%-*s  ", (int)w[c], row[c]);
}

static void human(char *buf, size_t len, uint64_t n)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)n;
	int u = 0;

	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	if (u)
		snprintf(buf, len, "%.1f %s", v, unit[u]);
	else
		snprintf(buf, len, "%" PRIu64 " B", n);
}

/* The mount's slicer as flx_slicer_open() describes it (gpu=, gpu_min=,
 * gpu_device=), for the table. */
static char slicer_line[1024];

/* Totals: tensor and object counts, bytes, and the rank byte spread.
 * Sums checked (the tree built before bounds them: a guard, not a
 * message users should see). */
static int print_totals(const flx_ckpt *c, const flx_plan *p)
{
	int tp = p->spec->tp, pp = p->spec->pp, lo = 0, hi = 0;
	uint64_t *rank = calloc((size_t)tp * (size_t)pp, sizeof(*rank));
	uint64_t total = 0, span;
	const flx_tensor *st;
	char h1[32], h2[32], h3[32], note[512];

	if (!rank)
		return -ENOMEM;
	for (size_t i = 0; i < p->n; i++) {
		const flx_placement *pl = &p->p[i];
		uint64_t b;
		bool over = __builtin_mul_overflow(
				flx_numel(pl->src->ndim, pl->src->shape),
				(uint64_t)flx_dtype_size(pl->src->dtype), &b) ||
			    __builtin_add_overflow(total, b, &total);

		for (int s = pl->stage_lo; s <= pl->stage_hi; s++)
			for (int r = 0; r < tp; r++)
				over |= __builtin_add_overflow(
				    rank[s * tp + r],
				    flx_view_bytes(
					flx_placement_view(pl, s, r, tp)),
				    &rank[s * tp + r]);
		if (over) {
			free(rank);
			return -EFBIG;
		}
	}
	for (int i = 1; i < tp * pp; i++) {
		lo = rank[i] < rank[lo] ? i : lo;
		hi = rank[i] > rank[hi] ? i : hi;
	}
	human(h1, sizeof(h1), total);
	human(h2, sizeof(h2), rank[lo]);
	human(h3, sizeof(h3), rank[hi]);
	printf("\n%zu tensors (%s), %zu objects, %d layers; "
	       "target tp=%d pp=%d (%d ranks), rules: %s\n"
	       "per rank: min %s (tp%02d_pp%02d), max %s (tp%02d_pp%02d)\n",
	       c->ntensors, h1, c->nobjects, p->nlayers, tp, pp, tp * pp,
	       p->spec->rules_path ? p->spec->rules_path : "none", h2, lo % tp,
	       lo / tp, h3, hi % tp, hi / tp);
	for (size_t i = 0; !flx_plan_note(p, i, note, sizeof(note)); i++)
		printf("%s\n", note);
	if (!flx_fmt_note(p, note, sizeof(note)))
		printf("%s\n", note);
	/* what the mount's cache_size= must hold for full speed */
	span = flx_ckpt_gather_span(c, &st);
	if (span) {
		human(h1, sizeof(h1), span);
		printf(
		    "saved transposed (strided innermost axis): largest chunk "
		    "%s, %s; gathered through the mount's block cache "
		    "(cache_size=, default 64M)\n",
		    h1, st->fqn);
		printf("strided gathers and casts: %s\n", slicer_line);
	}
	free(rank);
	return 0;
}

/* A Megatron-Core checkpoint's common state, and its stacked tensors. */
static void print_megatron(const flx_ckpt *c)
{
	const flx_megatron *m = flx_megatron_of(c);
	size_t stacked = 0;

	if (!m)
		return;
	/* a layer's own expert tensors stack experts alone: not counted */
	for (size_t i = 0; i < c->ntensors; i++)
		stacked +=
		    c->tensors[i].stacked > 0 && !c->tensors[i].stacked_experts;
	printf("Megatron-Core: iteration %lld, checkpoint_version %.1f "
	       "(from %s); num_layers %lld, hidden %lld, heads %lld, "
	       "query groups %lld, ffn %lld%s, padded vocab %lld, experts "
	       "%lld; saved at tp=%lld pp=%lld; optimizer %s%s\n"
	       "%zu stacked tensor(s): axis 0 indexes layers (and axis 1 "
	       "experts under experts.experts.), never split by TP; each pp "
	       "stage holds its layers' range\n",
	       (long long)m->iteration, m->checkpoint_version,
	       m->common_item ? "the common_state item" : "common.pt",
	       (long long)m->num_layers, (long long)m->hidden_size,
	       (long long)m->num_attention_heads,
	       (long long)m->num_query_groups, (long long)m->ffn_hidden_size,
	       m->swiglu != 1	    ? ""
	       : m->swiglu_inferred ? " (SwiGLU, from fc1's saved chunks)"
	       : m->swiglu_stated   ? " (SwiGLU, from -o megatron_swiglu)"
				    : " (SwiGLU)",
	       (long long)m->padded_vocab_size, (long long)m->num_experts,
	       (long long)m->tensor_model_parallel_size,
	       (long long)m->pipeline_model_parallel_size,
	       m->optim_sharding[0] ? m->optim_sharding : "-",
	       m->optim_assumed ? " (assumed: no format named; from "
				  "args.ckpt_fully_parallel_save)"
				: "",
	       stacked);
}

/* Natural order: runs of digits compare as numbers ("layers.2." before
 * "layers.10."), everything else byte by byte. */
static int natural_cmp(const char *a, const char *b)
{
	while (*a && *b) {
		if (*a >= '0' && *a <= '9' && *b >= '0' && *b <= '9') {
			const char *ea = a, *eb = b;
			size_t la, lb;
			int c;

			while (*a == '0' && a[1] >= '0' && a[1] <= '9')
				a++;
			while (*b == '0' && b[1] >= '0' && b[1] <= '9')
				b++;
			for (ea = a; *ea >= '0' && *ea <= '9'; ea++)
				;
			for (eb = b; *eb >= '0' && *eb <= '9'; eb++)
				;
			la = (size_t)(ea - a);
			lb = (size_t)(eb - b);
			if (la != lb)
				return la < lb ? -1 : 1;
			c = strncmp(a, b, la);
			if (c)
				return c;
			a = ea;
			b = eb;
			continue;
		}
		if (*a != *b)
			return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
		a++;
		b++;
	}
	return *a ? 1 : *b ? -1 : 0;
}

static int cmp_placement(const void *x, const void *y)
{
	const flx_placement *a = *(const flx_placement *const *)x;
	const flx_placement *b = *(const flx_placement *const *)y;
	int c = natural_cmp(a->src->fqn, b->src->fqn);

	/* equal numbers spelled differently (01, 1): bytes decide */
	return c ? c : strcmp(a->src->fqn, b->src->fqn);
}

/* The table, rows in natural name order. */
/* A part of a legacy tensor: the source box, an axis as an index (extent
 * 1), ':' (whole) or lo:hi; or a zero run. */
static void print_part(const flx_mlg_part *pt, bool named)
{
	const flx_tensor *t = pt->src;

	if (!t) {
		printf("zeros(%llu bytes)", (unsigned long long)pt->zeros);
		return;
	}
	printf("%s[", named ? t->fqn : "");
	for (int d = 0; d < t->ndim; d++) {
		int64_t lo = pt->box.off[d], n = pt->box.size[d];

		printf("%s", d ? ", " : "");
		if (n == t->shape[d])
			printf(":");
		else if (n == 1 && d < t->stacked)
			printf("%lld", (long long)lo);
		else
			printf("%lld:%lld", (long long)lo, (long long)(lo + n));
	}
	printf("]");
}

/*
 * The megatron/ view: for TP rank 0 of every stage, each legacy key and
 * where its bytes come from (the layer and expert picked on the stacked
 * axes, the TP slice; SwiGLU fc1 as two row ranges).
 */
static int print_megatron_legacy(const flx_ckpt *c, const flx_spec *s)
{
	flx_mlg_target tgt = flx_mlg_target_of(s);
	int nvc = tgt.vp > 1 ? tgt.vp : 1;
	flx_error err;

	flx_error_init(&err);
	for (int st = 0; st < s->pp * nvc; st++) {
		int pp = st / nvc, vc = st % nvc;
		flx_mlg_entry *e = NULL;
		size_t n = 0;
		char line[3 * FLX_ERR_FIELD + 8], it[32], rank[32], chunk[24];
		int rc = flx_mlg_rank(c, &tgt, 0, pp, 0, vc, &e, &n, &err);

		if (rc == -EINVAL) {
			flx_error_line(&err, line, sizeof(line));
			printf("megatron/: unavailable at this target: %s\n",
			       line);
			return 0;
		}
		if (rc)
			return rc;
		flx_mlg_dir_name(flx_megatron_of(c)->release
				     ? -1
				     : flx_megatron_of(c)->iteration,
				 -1, 0, 1, 0, 1, it, sizeof(it));
		flx_mlg_dir_name(0, 0, pp, s->pp, 0, tgt.ep > 1 ? tgt.ep : 1,
				 rank, sizeof(rank));
		chunk[0] = '\0';
		if (nvc > 1)
			snprintf(chunk, sizeof(chunk), " model%d", vc);
		printf("megatron/%s/%s/" FLX_MLG_FILE "%s (%s spec; tp rank 0 "
		       "of %d, the others hold the same keys, their slices):\n",
		       it, rank, chunk, tgt.te ? "te" : "local", s->tp);
		for (size_t i = 0; i < n; i++) {
			printf("  %s  ", e[i].name);
			if (e[i].kind == FLX_MLG_NONE)
				printf("None\n");
			if (e[i].kind == FLX_MLG_EMPTY_U8)
				printf("empty uint8 tensor\n");
			if (e[i].kind == FLX_MLG_OBJECT)
				printf("the uint8 tensor of %s\n",
				       e[i].obj->fqn);
			if (e[i].kind != FLX_MLG_TENSOR)
				continue;
			printf("%s ", flx_dtype_name(e[i].dtype));
			for (int d = 0; d < e[i].ndim; d++)
				printf("%s%lld", d ? "x" : "",
				       (long long)e[i].shape[d]);
			printf(" = ");
			for (int k = 0; k < e[i].nparts; k++) {
				printf("%s", k ? " ++ " : "");
				print_part(&e[i].part[k], k == 0);
			}
			printf("\n");
		}
		flx_mlg_free(e, n);
	}
	return 0;
}

static int print_table(const flx_ckpt *c, const flx_plan *p)
{
	char **cells = calloc(p->n ? p->n * NCOLS : 1, sizeof(*cells));
	const flx_placement **rows = malloc((p->n ? p->n : 1) * sizeof(*rows));
	size_t w[NCOLS];
	int rc = cells && rows ? 0 : -ENOMEM;

	for (size_t i = 0; i < p->n && rows; i++)
		rows[i] = &p->p[i];
	if (rows)
		qsort(rows, p->n, sizeof(*rows), cmp_placement);
	for (int k = 0; k < NCOLS; k++)
		w[k] = strlen(col_names[k]);
	for (size_t i = 0; i < p->n && !rc; i++) {
		rc = fill_row(rows[i], p, cells + i * NCOLS);
		for (int k = 0; k < NCOLS && !rc; k++)
			if (strlen(cells[i * NCOLS + k]) > w[k])
				w[k] = strlen(cells[i * NCOLS + k]);
	}
	if (!rc) {
		print_row((char *const *)col_names, w);
		for (size_t i = 0; i < p->n; i++)
			print_row(cells + i * NCOLS, w);
		rc = print_totals(c, p);
		print_megatron(c);
		if (!rc && flx_megatron_of(c))
			rc = print_megatron_legacy(c, p->spec);
	}
	for (size_t i = 0; cells && i < p->n * NCOLS; i++)
		free(cells[i]);
	free(cells);
	free(rows);
	return rc;
}

/* The saved split axes of t, "0,1" (sb_chunks()'s list). */
static char *saved_axes(const flx_tensor *t)
{
	sbuf b = {.ok = 1};
	int n = 0;

	for (int d = 0; d < t->ndim; d++)
		for (uint32_t c = 0; c < t->nchunks; c++)
			if (t->chunks[c].size[d] != t->shape[d]) {
				sb_printf(&b, "%s%d", n++ ? "," : "", d);
				break;
			}
	return sb_take(&b);
}

/* Every undecided tensor, one per line on stderr, and what to do. */
static int list_undecided(const flx_plan *p)
{
	fprintf(stderr,
		"flexfs-inspect: %zu tensor(s) saved split along several axes "
		"need a rule giving their target split at tp=%d (SPLIT ?):\n",
		p->nundecided, p->spec->tp);
	for (size_t i = 0; i < p->n; i++) {
		char *axes;

		if (!p->p[i].undecided)
			continue;
		axes = saved_axes(p->p[i].src);
		if (!axes)
			return -ENOMEM;
		fprintf(stderr, "  %s (saved along axes %s)\n",
			p->p[i].src->fqn, axes);
		free(axes);
	}
	fprintf(stderr, "flexfs-inspect: --rules-template=FILE writes a rules "
			"file for them (mount with rules=FILE)\n");
	return 0;
}

/* fqn as an fnmatch() pattern matching only itself. */
static char *glob_literal(const char *fqn)
{
	sbuf b = {.ok = 1};

	for (const char *c = fqn; *c; c++)
		sb_printf(&b, "%s%c", strchr("*?[]\\", *c) ? "\\" : "", *c);
	return sb_take(&b);
}

/* One rule: the tensor by name, replicated (the documented default, valid
 * for every tensor), its saved axes in "note". */
static json_t *template_rule(const flx_tensor *t)
{
	char *match = glob_literal(t->fqn), *axes = saved_axes(t);
	char note[256];
	json_t *r = NULL;

	if (match && axes) {
		snprintf(note, sizeof(note),
			 "saved split along axes %s in %" PRIu32
			 " chunks; split null replicates it on every TP rank, "
			 "an axis splits it along that axis",
			 axes, t->nchunks);
		r = json_pack("{s:s, s:n, s:s}", "match", match, "split",
			      "note", note);
	}
	free(match);
	free(axes);
	return r;
}

/* A rules file (JSON array, spec.h) for every undecided tensor of p, to
 * path ("-": stdout).  @return 0, or -errno with err. */
static int write_template(const flx_plan *p, const char *path, flx_error *err)
{
	json_t *rules = json_array();
	FILE *f = NULL;
	int rc = rules ? 0 : -ENOMEM;

	for (size_t i = 0; i < p->n && !rc; i++)
		if (p->p[i].undecided &&
		    json_array_append_new(rules, template_rule(p->p[i].src)))
			rc = -ENOMEM;
	if (!rc && !(f = strcmp(path, "-") ? fopen(path, "w") : stdout))
		rc = flx_error_set(err, -errno, path, "rules-template", "%s",
				   strerror(errno));
	if (!rc && (json_dumpf(rules, f, JSON_INDENT(1)) || fputc('\n', f) < 0))
		rc = flx_error_set(err, -EIO, path, "rules-template",
				   "write failed");
	if (f && f != stdout && fclose(f) && !rc)
		rc = flx_error_set(err, -errno, path, "rules-template", "%s",
				   strerror(errno));
	if (!rc && f != stdout)
		fprintf(stderr,
			"flexfs-inspect: wrote %zu rule(s) to %s (each "
			"replicates its tensor; edit \"split\" to split it)\n",
			p->nundecided, path);
	json_decref(rules);
	return rc;
}

/* index.json of the tree that flexfs would mount, verbatim. */
/* The AOA statements' targets (aoa.h): per target, the statements that
 * made it and its source boxes. */
static void print_aoa(const flx_aoa_prog *p)
{
	const char *name, *chain;
	size_t n;

	if (!flx_aoa_prog_target(p, 0, &name, &chain, &n))
		printf("\nAOA targets (statements; source[box] chain -> "
		       "target box):\n");
	for (size_t i = 0; !flx_aoa_prog_target(p, i, &name, &chain, &n); i++) {
		printf("%s  (%s)\n", name, chain);
		for (size_t k = 0; k < n; k++)
			printf("    %s\n", flx_aoa_prog_source(p, i, k));
	}
}

/* index.json (buf, n bytes) with "aoa": {target: {"statements": chain,
 * "sources": [box lines]}} added, on stdout. */
static int print_json_aoa(const char *buf, size_t n, const flx_aoa_prog *p)
{
	json_t *root = json_loadb(buf, n, 0, NULL), *aoa = json_object();
	const char *name, *chain;
	size_t ns;
	int rc = root && aoa ? 0 : -ENOMEM;

	for (size_t i = 0;
	     !rc && !flx_aoa_prog_target(p, i, &name, &chain, &ns); i++) {
		json_t *t = json_object(), *src = json_array();

		if (!t || !src || json_object_set_new(aoa, name, t) ||
		    json_object_set_new(t, "statements", json_string(chain)) ||
		    json_object_set_new(t, "sources", src)) {
			json_decref(src);
			rc = -ENOMEM;
			break;
		}
		for (size_t k = 0; k < ns && !rc; k++)
			if (json_array_append_new(
				src, json_string(flx_aoa_prog_source(p, i, k))))
				rc = -ENOMEM;
	}
	if (!rc && json_object_set(root, "aoa", aoa))
		rc = -ENOMEM;
	if (!rc &&
	    (json_dumpf(root, stdout, JSON_INDENT(1)) || putchar('\n') == EOF))
		rc = -EIO;
	json_decref(aoa);
	json_decref(root);
	return rc;
}

static int print_json(const flx_fs *fs, const flx_aoa_prog *aoa, flx_error *err)
{
	flx_stat st;
	char *buf = NULL;
	ssize_t n = 0;
	int rc = flx_fs_resolve(fs, "index.json", &st);

	if (!rc && !(buf = malloc(st.size + 1)))
		rc = -ENOMEM;
	if (!rc && (n = flx_fs_read(fs, st.ino, buf, st.size, 0, NULL)) < 0)
		rc = (int)n;
	if (!rc && aoa) {
		rc = print_json_aoa(buf, (size_t)n, aoa);
	} else if (!rc) {
		fwrite(buf, 1, (size_t)n, stdout);
		if (n == 0 || buf[n - 1] != '\n')
			putchar('\n');
	}
	if (rc)
		flx_error_set(err, rc, NULL, "index.json", "%s", strerror(-rc));
	free(buf);
	return rc;
}

/* --svg FILE: the picture (inspect_svg.h) in FILE, or on stdout for -. */
static int write_svg(const flx_plan *p, const char *path, flx_error *err)
{
	bool out = !strcmp(path, "-");
	FILE *f = out ? stdout : fopen(path, "w");
	int rc;

	if (!f)
		return flx_error_set(err, -errno, path, NULL, "%s",
				     strerror(errno));
	rc = flx_inspect_svg(p, f, out ? "stdout" : path, err);
	if (!out && fclose(f) && !rc)
		rc = flx_error_set(err, -EIO, path, NULL, "%s", strerror(EIO));
	return rc;
}

static void usage(FILE *f, const char *prog)
{
	flx_doc_usage(f, &flx_doc_inspect, prog);
}

static void report(const flx_error *e)
{
	char line[4 * FLX_ERR_FIELD];

	fprintf(stderr, "flexfs-inspect: %s\n",
		flx_error_line(e, line, sizeof(line)));
}

/* ---- --digest, --compare ---- */

/* Bytes read per step of a digest: the tensor never whole in memory. */
#define DIGEST_BLOCK (4u << 20)

/* One tensor's identity: name, dtype, shape and the sha256 of its
 * canonical bytes. */
typedef struct digest {
	const char *name;
	const flx_tensor *t;
	char hex[65];
} digest;

/* A progress line on stderr, only on a terminal and past the first
 * second; done: erase it. */
static void progress(const char *what, size_t i, size_t n, time_t t0, bool done)
{
	if (!isatty(STDERR_FILENO) || time(NULL) - t0 < 1)
		return;
	if (done)
		fprintf(stderr, "\r\033[K");
	else
		fprintf(stderr, "\r%s: %zu/%zu tensors", what, i, n);
}

/* sha256 of pl's whole tensor, C order, little-endian, in its dtype: read
 * through its whole view, so the same whatever layout it was saved in.
 * @return 0 and hex, or -errno. */
static int tensor_digest(const flx_placement *pl, unsigned char *buf,
			 char hex[65])
{
	uint64_t total = flx_view_bytes(pl->whole), off = 0;
	flx_sha256 s;
	int rc = flx_sha256_init(&s);

	if (rc)
		return rc;
	while (off < total) {
		size_t want =
		    total - off < DIGEST_BLOCK ? total - off : DIGEST_BLOCK;
		ssize_t got = flx_view_read(pl->whole, buf, want, off, NULL);

		if (got <= 0) {
			flx_sha256_free(&s);
			return got < 0 ? (int)got : -EIO;
		}
		flx_sha256_update(&s, buf, (size_t)got);
		off += (uint64_t)got;
	}
	return flx_sha256_hex(&s, hex);
}

static int cmp_digest(const void *a, const void *b)
{
	return strcmp(((const digest *)a)->name, ((const digest *)b)->name);
}

/* Every tensor of plan p, digested, sorted by name.
 * @return 0 and *out (owned: free()), or -errno with err. */
static int digest_all(const flx_plan *p, const char *what, digest **out,
		      flx_error *err)
{
	digest *d = calloc(p->n ? p->n : 1, sizeof(*d));
	unsigned char *buf = malloc(DIGEST_BLOCK);
	time_t t0 = time(NULL);
	int rc = d && buf ? 0 : -ENOMEM;

	for (size_t i = 0; i < p->n && !rc; i++) {
		progress(what, i, p->n, t0, false);
		d[i].name = p->p[i].src->fqn;
		d[i].t = p->p[i].src;
		rc = tensor_digest(&p->p[i], buf, d[i].hex);
		if (rc)
			flx_error_set(err, rc, p->ckpt->dir, d[i].name,
				      "cannot read: %s", strerror(-rc));
	}
	progress(what, p->n, p->n, t0, true);
	free(buf);
	if (rc) {
		free(d);
		return rc;
	}
	qsort(d, p->n, sizeof(*d), cmp_digest);
	*out = d;
	return 0;
}

/* --digest: one line per tensor, natural name order. */
static int print_digests(const flx_plan *p, flx_error *err)
{
	digest *d = NULL;
	const flx_placement **rows = NULL;
	int rc = digest_all(p, "digest", &d, err);

	if (!rc && !(rows = malloc((p->n ? p->n : 1) * sizeof(*rows))))
		rc = -ENOMEM;
	for (size_t i = 0; !rc && i < p->n; i++)
		rows[i] = &p->p[i];
	if (!rc)
		qsort(rows, p->n, sizeof(*rows), cmp_placement);
	for (size_t i = 0; !rc && i < p->n; i++) {
		digest key = {.name = rows[i]->src->fqn};
		const digest *hit =
		    bsearch(&key, d, p->n, sizeof(*d), cmp_digest);
		sbuf shape = {.ok = 1};

		sb_shape(&shape, rows[i]->src->ndim, rows[i]->src->shape);
		if (!shape.ok) {
			rc = -ENOMEM;
			break;
		}
		printf("%s  %-9s %-12s %s\n", hit->hex,
		       flx_dtype_name(rows[i]->src->dtype),
		       shape.s ? shape.s : "", rows[i]->src->fqn);
		free(shape.s);
	}
	free(rows);
	free(d);
	return rc;
}

/* Whether a and b differ in dtype, shape or bytes; one line saying how. */
static bool differ(const digest *a, const digest *b)
{
	const flx_tensor *x = a->t, *y = b->t;
	sbuf sx = {.ok = 1}, sy = {.ok = 1};
	bool shape = x->ndim != y->ndim;

	for (int d = 0; d < x->ndim && !shape; d++)
		shape = x->shape[d] != y->shape[d];
	if (x->dtype != y->dtype) {
		printf("dtype differs: %s: %s vs %s\n", a->name,
		       flx_dtype_name(x->dtype), flx_dtype_name(y->dtype));
		return true;
	}
	if (shape) {
		sb_shape(&sx, x->ndim, x->shape);
		sb_shape(&sy, y->ndim, y->shape);
		printf("shape differs: %s: %s vs %s\n", a->name,
		       sx.s ? sx.s : "?", sy.s ? sy.s : "?");
		free(sx.s);
		free(sy.s);
		return true;
	}
	if (strcmp(a->hex, b->hex)) {
		printf("bytes differ: %s: sha256 %s vs %s\n", a->name, a->hex,
		       b->hex);
		return true;
	}
	return false;
}

/* --compare: the tensors of plan a and of the checkpoint at other (opened
 * with the same source options and filters, planned at tp=1), name by
 * name.  @return 0 and *ndiff (differences found), or -errno with err. */
static int compare(const flx_plan *a, const flx_mountopts *mo,
		   const char *other, size_t *ndiff, flx_error *err)
{
	flx_ckpt *c = NULL;
	flx_findex *fi = NULL;
	flx_plan *b = NULL;
	flx_spec plain;
	digest *da = NULL, *db = NULL;
	size_t i = 0, j = 0, same = 0;
	int rc = flx_spec_init(&plain);

	*ndiff = 0;
	if (!rc)
		rc = flx_ckpt_open_with(
		    other,
		    &(flx_ckpt_opts){.follow_symlinks = mo->follow_symlinks},
		    &c, err);
	if (!rc)
		rc = flx_filter_apply(&mo->spec, c, &fi, err);
	if (!rc)
		rc = flx_plan_build_all(flx_findex_ckpt(fi), &plain, &b, err);
	if (!rc)
		rc = digest_all(a, "compare", &da, err);
	if (!rc)
		rc = digest_all(b, "compare", &db, err);
	while (!rc && (i < a->n || j < b->n)) {
		int k = i == a->n   ? 1
			: j == b->n ? -1
				    : strcmp(da[i].name, db[j].name);

		if (k < 0)
			printf("only in %s: %s\n", a->ckpt->dir, da[i++].name);
		else if (k > 0)
			printf("only in %s: %s\n", other, db[j++].name);
		if (k)
			++*ndiff;
		else if (differ(&da[i++], &db[j++]))
			++*ndiff;
		else
			same++;
	}
	if (!rc)
		printf("%zu tensor(s) identical, %zu difference(s)\n", same,
		       *ndiff);
	free(da);
	free(db);
	flx_plan_free(b);
	flx_findex_free(fi);
	flx_ckpt_close(c);
	flx_spec_release(&plain);
	return rc;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* One preset: its name and the "note" of its first rule (what it is for),
 * after checking that it loads as a rules file. */
static void print_preset(const char *dir, const char *file)
{
	char path[4096 + 256], name[256];
	json_t *root;
	flx_spec s;
	flx_error err;
	const char *note;

	snprintf(name, sizeof(name), "%.*s", (int)(strlen(file) - 5), file);
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	flx_error_init(&err);
	if (flx_spec_init(&s) || flx_spec_set(&s, "rules", path, &err)) {
		report(&err);
		flx_spec_release(&s);
		return;
	}
	root = json_load_file(path, 0, NULL);
	/* v1: the first rule's note; v2: the object's */
	note = json_string_value(json_object_get(
	    json_is_object(root) ? root : json_array_get(root, 0), "note"));
	printf("@%-18s %s\n", name, note ? note : "");
	json_decref(root);
	flx_spec_release(&s);
}

/* The shipped presets (rules=@NAME), sorted by name.  @return 0 or 1. */
static int list_presets(void)
{
	char dir[4096], **names = NULL;
	size_t n = 0;
	struct dirent *e;
	DIR *d = NULL;
	int rc = flx_spec_preset_dir(dir, sizeof(dir));

	if (!rc && !(d = opendir(dir)))
		rc = -errno;
	if (rc) {
		fprintf(stderr, "flexfs-inspect: no preset directory: %s\n",
			strerror(-rc));
		return 1;
	}
	while (!rc && (e = readdir(d))) {
		size_t len = strlen(e->d_name);
		char **nn;

		if (len <= 5 || e->d_name[0] == '.' ||
		    strcmp(e->d_name + len - 5, ".json"))
			continue;
		nn = realloc(names, (n + 1) * sizeof(*names));
		if (nn)
			names = nn;
		if (!nn || !(names[n] = strdup(e->d_name)))
			rc = -ENOMEM;
		else
			n++;
	}
	closedir(d);
	if (names)
		qsort(names, n, sizeof(*names), cmp_str);
	if (!rc)
		printf("rules presets in %s (mount with -o rules=@NAME):\n",
		       dir);
	for (size_t i = 0; i < n; i++) {
		if (!rc)
			print_preset(dir, names[i]);
		free(names[i]);
	}
	free(names);
	if (rc)
		fprintf(stderr, "flexfs-inspect: %s\n", strerror(-rc));
	return rc ? 1 : 0;
}

enum { OPT_TEMPLATE = 256, OPT_PRESETS, OPT_DIGEST, OPT_COMPARE, OPT_SVG };

static const struct option long_opts[] = {
    {"json", no_argument, NULL, 'j'},
    {"rules-template", required_argument, NULL, OPT_TEMPLATE},
    {"list-presets", no_argument, NULL, OPT_PRESETS},
    {"digest", no_argument, NULL, OPT_DIGEST},
    {"compare", required_argument, NULL, OPT_COMPARE},
    {"svg", required_argument, NULL, OPT_SVG},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

/* @return 0 to go on, 1/2 to exit with that status, 3 to exit with 0. */
/* What the command line asks for besides the table. */
typedef struct request {
	int json;
	const char *tmpl;    /* --rules-template */
	int digest;	     /* --digest */
	const char *compare; /* --compare */
	const char *svg;     /* --svg */
} request;

static int parse(int argc, char **argv, flx_mountopts *mo, request *rq,
		 flx_error *err)
{
	int ch;

	while ((ch = getopt_long(argc, argv, "o:jhV", long_opts, NULL)) != -1) {
		switch (ch) {
		case 'o':
			if (flx_mo_options(mo, optarg, err)) {
				report(err);
				return 1;
			}
			break;
		case 'j':
			rq->json = 1;
			break;
		case OPT_TEMPLATE:
			rq->tmpl = optarg;
			break;
		case OPT_DIGEST:
			rq->digest = 1;
			break;
		case OPT_COMPARE:
			rq->compare = optarg;
			break;
		case OPT_SVG:
			rq->svg = optarg;
			break;
		case OPT_PRESETS:
			return list_presets() ? 1 : 3;
		case 'h':
			usage(stdout, argv[0]);
			return 3;
		case 'V':
			printf("flexfs-inspect version %s\n", FLEXFS_VERSION);
			return 3;
		default:
			usage(stderr, argv[0]);
			return 2;
		}
	}
	if (optind != argc - 1) {
		fprintf(stderr,
			"flexfs-inspect: expected one CHECKPOINT "
			"directory (see %s --help)\n",
			argv[0]);
		return 2;
	}
	/* The same -o string as a mount may carry libfuse/fstab options:
	 * they mean nothing here, but say so in case one was a typo. */
	for (size_t i = 0; i < mo->nfuse; i++)
		fprintf(stderr, "flexfs-inspect: ignoring mount option '%s'\n",
			mo->fuse[i]);
	return 0;
}

int main(int argc, char **argv)
{
	flx_mountopts mo;
	const flx_slicer *slicer = NULL;
	flx_stack st = {0};
	flx_ckpt_opts o;
	const flx_ckpt *served = NULL;
	const flx_plan *plan = NULL;
	char note[2 * FLX_ERR_FIELD];
	flx_error err;
	request rq = {0};
	size_t ndiff = 0;
	int rc, undecided = 0;

	flx_error_init(&err);
	/* one descriptor per file of the checkpoint; failing to raise the
	 * limit is not an error until a file cannot be opened */
	(void)flx_nofile_raise();
	if (flx_mo_init(&mo)) {
		fprintf(stderr, "flexfs-inspect: out of memory\n");
		return 1;
	}
	rc = parse(argc, argv, &mo, &rq, &err);
	if (rc) {
		flx_mo_release(&mo);
		return rc == 3 ? 0 : rc;
	}
	/* the mount's stages, by the mount's own path: what it refuses is
	 * refused here with the same line, but for undecided splits, which
	 * the table shows (the JSON is the mount's: it has none) */
	/* the mount's slicer, opened as the mount opens it (and refused
	 * alike): --json prints the index.json that records it */
	rc =
	    flx_slicer_open(&mo.gpu, &slicer, slicer_line, sizeof(slicer_line));
	if (rc) {
		fprintf(stderr, "flexfs-inspect: %s\n",
			rc == -ENOMEM ? "out of memory" : slicer_line);
		flx_mo_release(&mo);
		return 1;
	}
	mo.spec.slicer = slicer->name;
	o = flx_mo_ckpt_opts(&mo);
	rc = flx_stack_build(argv[optind], &o, &mo.spec, !rq.json, &st, &err);
	for (size_t i = 0; !rc && !flx_stack_note(&st, i, note, sizeof(note));
	     i++)
		fprintf(stderr, "flexfs-inspect: %s: %s\n", argv[optind], note);
	if (!rc) {
		served = flx_stack_ckpt(&st);
		plan = st.plan;
	}
	if (!rc && rq.svg)
		rc = write_svg(plan, rq.svg, &err);
	else if (!rc && rq.digest)
		rc = print_digests(plan, &err);
	else if (!rc && rq.compare)
		rc = compare(plan, &mo, rq.compare, &ndiff, &err);
	else if (!rc && rq.json)
		rc = print_json(st.fs, st.aoa, &err);
	else if (!rc && !(rq.tmpl && !strcmp(rq.tmpl, "-")))
		rc = print_table(served, plan);
	if (!rc && st.aoa && !rq.json && !rq.svg && !rq.digest && !rq.compare &&
	    !(rq.tmpl && !strcmp(rq.tmpl, "-")))
		print_aoa(st.aoa);
	if (!rc && rq.tmpl) {
		rc = write_template(plan, rq.tmpl, &err);
	} else if (!rc && !rq.json && !rq.digest && !rq.compare &&
		   plan->nundecided) {
		undecided = 1;
		rc = list_undecided(plan);
	}
	if (rc) {
		if (!err.code)
			flx_error_set(&err, rc, NULL, NULL, "%s",
				      strerror(-rc));
		report(&err);
	}
	flx_stack_free(&st);
	flx_mo_release(&mo);
	flx_slicer_close(slicer);
	return rc || undecided || ndiff ? 1 : 0;
}
