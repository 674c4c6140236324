/* SPDX-License-Identifier: MIT */
/*
 * flexfs-inspect: show what a mount would present, without FUSE.
 *
 *   flexfs-inspect CHECKPOINT [-o tp=N,pp=M,rules=FILE,...] [--json]
 *
 * Runs the same open -> plan (-> tree) sequence as flexfs, so any error a
 * mount would report is reported here, with the same wording.  The table
 * is read from the plan; --json prints the mounted tree's own index.json,
 * so the JSON has exactly one definition (fs/build.c).
 */
#include "ckpt.h"
#include "error.h"
#include "mountopts.h"
#include "plan.h"
#include "stack.h"
#include "transform.h"
#include "tree.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int fill_row(const flx_placement *pl, int tp, char **row)
{
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
	sb_printf(&b[COL_DTYPE], "%s", flx_dtype_name(t->dtype));
	sb_shape(&b[COL_SHAPE], t->ndim, t->shape);
	sb_chunks(&b[COL_CHUNKS], t);
	if (pl->split < 0)
		sb_printf(&b[COL_SPLIT], "-");
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

/* Totals: tensor and object counts, bytes, and the rank byte spread.
 * Sums checked (the tree built before bounds them: a guard, not a
 * message users should see). */
static int print_totals(const flx_ckpt *c, const flx_plan *p)
{
	int tp = p->spec->tp, pp = p->spec->pp, lo = 0, hi = 0;
	uint64_t *rank = calloc((size_t)tp * (size_t)pp, sizeof(*rank));
	uint64_t total = 0, span;
	const flx_tensor *st;
	char h1[32], h2[32], h3[32];

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
				    flx_view_bytes(pl->views[r]),
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
	/* what the mount's cache_size= must hold for full speed */
	span = flx_ckpt_gather_span(c, &st);
	if (span) {
		human(h1, sizeof(h1), span);
		printf(
		    "saved transposed (strided innermost axis): largest chunk "
		    "%s, %s; gathered through the mount's block cache "
		    "(cache_size=, default 64M)\n",
		    h1, st->fqn);
	}
	free(rank);
	return 0;
}

/* A Megatron-Core checkpoint's common state, and its stacked tensors. */
static void print_megatron(const flx_ckpt *c)
{
	const flx_megatron *m = c->megatron;
	size_t stacked = 0;

	if (!m)
		return;
	for (size_t i = 0; i < c->ntensors; i++)
		stacked += c->tensors[i].stacked > 0;
	printf("Megatron-Core: iteration %lld, checkpoint_version %.1f "
	       "(from %s); num_layers %lld, hidden %lld, heads %lld, "
	       "query groups %lld, ffn %lld%s, padded vocab %lld, experts "
	       "%lld; saved at tp=%lld pp=%lld; optimizer %s\n"
	       "%zu stacked tensor(s): axis 0 indexes layers (and axis 1 "
	       "experts under experts.experts.), never split by TP; pp>1 "
	       "needs a stage rule for them\n",
	       (long long)m->iteration, m->checkpoint_version,
	       m->common_item ? "the common_state item" : "common.pt",
	       (long long)m->num_layers, (long long)m->hidden_size,
	       (long long)m->num_attention_heads,
	       (long long)m->num_query_groups, (long long)m->ffn_hidden_size,
	       m->swiglu == 1 ? " (SwiGLU)" : "",
	       (long long)m->padded_vocab_size, (long long)m->num_experts,
	       (long long)m->tensor_model_parallel_size,
	       (long long)m->pipeline_model_parallel_size,
	       m->optim_sharding[0] ? m->optim_sharding : "-", stacked);
}

static int print_table(const flx_ckpt *c, const flx_plan *p)
{
	char **cells = calloc(p->n ? p->n * NCOLS : 1, sizeof(*cells));
	size_t w[NCOLS];
	int rc = cells ? 0 : -ENOMEM;

	for (int k = 0; k < NCOLS; k++)
		w[k] = strlen(col_names[k]);
	for (size_t i = 0; i < p->n && !rc; i++) {
		rc = fill_row(&p->p[i], p->spec->tp, cells + i * NCOLS);
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
	}
	for (size_t i = 0; cells && i < p->n * NCOLS; i++)
		free(cells[i]);
	free(cells);
	return rc;
}

/* index.json of the tree that flexfs would mount, verbatim. */
static int print_json(const flx_fs *fs, flx_error *err)
{
	flx_stat st;
	char *buf = NULL;
	ssize_t n = 0;
	int rc = flx_fs_resolve(fs, "index.json", &st);

	if (!rc && !(buf = malloc(st.size + 1)))
		rc = -ENOMEM;
	if (!rc && (n = flx_fs_read(fs, st.ino, buf, st.size, 0, NULL)) < 0)
		rc = (int)n;
	if (!rc) {
		fwrite(buf, 1, (size_t)n, stdout);
		if (n == 0 || buf[n - 1] != '\n')
			putchar('\n');
	}
	if (rc)
		flx_error_set(err, rc, NULL, "index.json", "%s", strerror(-rc));
	free(buf);
	return rc;
}

static void usage(FILE *f, const char *prog)
{
	fprintf(f,
		"usage: %s CHECKPOINT [-o OPTIONS] [--json]\n"
		"\n"
		"Show how flexfs would reshard the PyTorch DCP checkpoint "
		"CHECKPOINT: every\n"
		"tensor's dtype, global shape, saved chunks (and their split "
		"axes), target\n"
		"split axis, pipeline stage(s) and local shape per TP rank.\n"
		"\n"
		"    -o OPTIONS   mount options, as for flexfs (repeatable)\n"
		"    -j, --json   print the mount's index.json instead\n"
		"    -h, --help   print this help\n"
		"    -V, --version\n"
		"\n%s",
		prog, flx_mo_help);
}

static void report(const flx_error *e)
{
	char line[4 * FLX_ERR_FIELD];

	fprintf(stderr, "flexfs-inspect: %s\n",
		flx_error_line(e, line, sizeof(line)));
}

static const struct option long_opts[] = {
    {"json", no_argument, NULL, 'j'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

/* @return 0 to go on, 1/2 to exit with that status, 3 to exit with 0. */
static int parse(int argc, char **argv, flx_mountopts *mo, int *json,
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
			*json = 1;
			break;
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
	flx_stack st = {0};
	flx_error err;
	int json = 0, rc;

	flx_error_init(&err);
	/* one descriptor per file of the checkpoint; failing to raise the
	 * limit is not an error until a file cannot be opened */
	(void)flx_nofile_raise();
	if (flx_mo_init(&mo)) {
		fprintf(stderr, "flexfs-inspect: out of memory\n");
		return 1;
	}
	rc = parse(argc, argv, &mo, &json, &err);
	if (rc) {
		flx_mo_release(&mo);
		return rc == 3 ? 0 : rc;
	}
	/* the mount's stages, by the mount's own path: what it refuses is
	 * refused here with the same line */
	rc = flx_stack_build(argv[optind], mo.source_format, &mo.spec, &st,
			     &err);
	if (!rc)
		rc = json ? print_json(st.fs, &err)
			  : print_table(flx_xindex_ckpt(st.xi), st.plan);
	if (rc) {
		if (!err.code)
			flx_error_set(&err, rc, NULL, NULL, "%s",
				      strerror(-rc));
		report(&err);
	}
	flx_stack_free(&st);
	flx_mo_release(&mo);
	return rc ? 1 : 0;
}
