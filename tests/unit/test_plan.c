/* SPDX-License-Identifier: MIT */
/*
 * Placement decisions on hand-built indexes (no files are read): every
 * undecided tensor reported at once, and the split inferred from sources
 * sharded data-parallel along dim 0 (FSDP), alone and with TP.  The oracle
 * is the layout each index was built from (its axes and degrees).
 */
#include "check.h"

#include "ckpt.h"
#include "filter.h"
#include "plan.h"
#include "spec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One tensor of a test index: its shape and how it was saved, as the
 * cartesian product of torch.chunk pieces per axis; strided: axis 0 holds
 * parts[0] pieces (FSDP's shards of TP's shards) */
typedef struct tdesc {
	const char *fqn;
	int ndim;
	int64_t shape[3];
	int parts[3]; /* torch.chunk pieces per axis (0 or 1: whole) */
} tdesc;

/* [lo, hi) of piece k of n elements in parts torch.chunk pieces. */
static void piece(int64_t n, int parts, int k, int64_t *lo, int64_t *hi)
{
	int64_t c = parts > 1 ? (n + parts - 1) / parts : n;

	*lo = (int64_t)k * c < n ? (int64_t)k * c : n;
	*hi = *lo + c < n ? *lo + c : n;
}

static void add_tensor(flx_tensor *t, const tdesc *d)
{
	uint32_t n = 1, k = 0;

	t->fqn = strdup(d->fqn);
	t->dtype = FLX_DT_F32;
	t->ndim = d->ndim;
	memcpy(t->shape, d->shape, sizeof(d->shape));
	for (int a = 0; a < d->ndim; a++)
		n *= (uint32_t)(d->parts[a] > 1 ? d->parts[a] : 1);
	CHECK(flx_tensor_alloc_chunks(t, n) == 0);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t rest = i;
		int empty = 0;
		flx_chunk *ch = &t->chunks[k];

		for (int a = d->ndim - 1; a >= 0; a--) {
			int p = d->parts[a] > 1 ? d->parts[a] : 1;
			int64_t lo, hi;

			piece(d->shape[a], p, (int)(rest % (uint32_t)p), &lo,
			      &hi);
			rest /= (uint32_t)p;
			ch->off[a] = lo;
			ch->size[a] = hi - lo;
			empty |= hi == lo;
		}
		/* row-major strides, data nowhere: nothing is read */
		for (int a = d->ndim - 1, s = 1; a >= 0; a--) {
			ch->stride[a] = s;
			s *= (int)ch->size[a];
		}
		ch->contig_from = 0;
		k += !empty; /* torch saves no empty shard */
	}
	t->nchunks = k;
}

static flx_ckpt *make_index(const tdesc *d, size_t n)
{
	flx_ckpt *c = calloc(1, sizeof(*c));

	c->dir = strdup("/test");
	c->format = strdup("test");
	c->writer = strdup("test");
	c->ntensors = n;
	c->tensors = calloc(n, sizeof(flx_tensor));
	for (size_t i = 0; i < n; i++)
		add_tensor(&c->tensors[i], &d[i]);
	return c;
}

static const flx_placement *find(const flx_plan *p, const char *fqn)
{
	for (size_t i = 0; i < p->n; i++)
		if (!strcmp(p->p[i].src->fqn, fqn))
			return &p->p[i];
	CHECK(!"tensor in the plan");
	return NULL;
}

/* Five tensors on a 2-D block grid and two decided ones. */
static const tdesc blocks[] = {
    {"a.block", 2, {8, 8}, {2, 2}}, {"b.block", 2, {8, 8}, {2, 2}},
    {"ok.rows", 2, {8, 8}, {2, 1}}, {"c.block", 2, {8, 8}, {2, 4}},
    {"d.block", 2, {8, 8}, {4, 2}}, {"e.block", 2, {8, 8}, {2, 2}},
    {"ok.whole", 1, {8}, {1}},
};

static void test_undecided(void)
{
	flx_ckpt *c = make_index(blocks, sizeof(blocks) / sizeof(blocks[0]));
	flx_spec s;
	flx_plan *p = NULL;
	flx_error err;

	flx_spec_init(&s);
	s.tp = 2;
	/* the mount: one error naming the first three and counting all */
	flx_error_init(&err);
	CHECK_EQ(flx_plan_build(c, &s, &p, &err), -EINVAL);
	CHECK(p == NULL);
	CHECK_STR(err.key, "a.block, b.block, c.block and 2 more");
	CHECK(strstr(err.text, "5 tensor(s)") != NULL);
	CHECK(strstr(err.text, "--rules-template") != NULL);
	CHECK_STR(err.file, "/test/.metadata");

	/* inspect: every tensor placed, the undecided ones marked */
	flx_error_init(&err);
	CHECK_EQ(flx_plan_build_all(c, &s, &p, &err), 0);
	if (p) {
		CHECK_EQ(p->n, 7);
		CHECK_EQ(p->nundecided, 5);
		CHECK(find(p, "a.block")->undecided);
		CHECK_EQ(find(p, "a.block")->split, -1);
		CHECK(find(p, "e.block")->undecided);
		CHECK(!find(p, "ok.rows")->undecided);
		CHECK_EQ(find(p, "ok.rows")->split, 0);
		CHECK(!find(p, "ok.whole")->undecided);
	}
	flx_plan_free(p);
	p = NULL;

	/* a rule decides: four left */
	static const char one[] = "[{\"match\": \"b.block\", \"split\": 1}]";
	CHECK_EQ(flx_spec_rules_parse(&s, one, sizeof(one) - 1, "r", NULL), 0);
	flx_error_init(&err);
	CHECK_EQ(flx_plan_build(c, &s, &p, &err), -EINVAL);
	CHECK_STR(err.key, "a.block, c.block, d.block and 1 more");

	/* tp=1: nothing is split, nothing undecided */
	s.tp = 1;
	CHECK_EQ(flx_plan_build(c, &s, &p, NULL), 0);
	if (p)
		CHECK_EQ(p->nundecided, 0);
	flx_plan_free(p);
	flx_spec_release(&s);
	flx_ckpt_close(c);
}

/* FSDP2 alone over 4 ranks: every tensor in dim-0 shards, uneven ones
 * and one shorter than the degree included (3 rows: 3 shards) */
static const tdesc fsdp[] = {
    {"emb", 2, {38, 10}, {4, 1}}, {"norm", 1, {10}, {4}},
    {"short", 2, {3, 5}, {4, 1}}, {"step", 0, {0}, {0}},
    {"w2", 2, {10, 22}, {4, 1}},
};

/* FSDP2 (dp 2) x TP (tp 2): norms in FSDP's shards only, rowwise weights
 * also along axis 1, colwise ones in FSDP's shards of TP's along axis 0 */
static const tdesc fsdp_tp[] = {
    {"norm", 1, {12}, {2}},	 {"wo", 2, {12, 12}, {2, 2}},
    {"wq", 2, {12, 12}, {4, 1}}, {"w1", 2, {24, 12}, {4, 1}},
    {"w2", 2, {12, 24}, {2, 2}}, {"emb", 2, {40, 12}, {4, 1}},
    {"step", 0, {0}, {0}},
};

/* Every tensor's chunks listed backwards (their boxes swapped; each
 * chunk's arrays stay where flx_tensor_alloc_chunks() put them): the order
 * a source gives them in says nothing of where they sit. */
static void reverse_chunks(flx_ckpt *c)
{
	for (size_t i = 0; i < c->ntensors; i++) {
		flx_tensor *t = &c->tensors[i];

		for (uint32_t a = 0, b = t->nchunks; a + 1 < b; a++, b--) {
			flx_chunk *x = &t->chunks[a], *y = &t->chunks[b - 1];

			for (int d = 0; d < t->ndim; d++) {
				int64_t o = x->off[d], n = x->size[d],
					st = x->stride[d];

				x->off[d] = y->off[d];
				x->size[d] = y->size[d];
				x->stride[d] = y->stride[d];
				y->off[d] = o;
				y->size[d] = n;
				y->stride[d] = st;
			}
		}
	}
}

static void check_splits(const tdesc *d, size_t n, int tp, int dp,
			 const int *want, bool reversed)
{
	flx_ckpt *c = make_index(d, n);
	flx_spec s;
	flx_plan *p = NULL;
	flx_error err;

	if (reversed)
		reverse_chunks(c);
	flx_spec_init(&s);
	s.tp = tp;
	flx_error_init(&err);
	CHECK_EQ(flx_plan_build(c, &s, &p, &err), 0);
	if (p) {
		CHECK_EQ(p->dp_degree, dp);
		for (size_t i = 0; i < n; i++) {
			if (p->p[i].split != want[i])
				fprintf(stderr, "%s: split %d, want %d\n",
					d[i].fqn, p->p[i].split, want[i]);
			CHECK_EQ(p->p[i].split, want[i]);
		}
	}
	flx_plan_free(p);
	flx_spec_release(&s);
	flx_ckpt_close(c);
}

static void test_fsdp(void)
{
	static const int none[7] = {-1, -1, -1, -1, -1, -1, -1};
	static const int tp_axes[7] = {-1, 1, 0, 0, 1, 0, -1};

	/* FSDP alone: its split is no TP split, everything replicated */
	check_splits(fsdp, 5, 2, 4, none, false);
	/* FSDP2 x TP: the TP axis from the other axis */
	check_splits(fsdp_tp, 7, 4, 2, tp_axes, false);
	/* the same, the chunks listed out of dim-0 order */
	check_splits(fsdp, 5, 2, 4, none, true);
	check_splits(fsdp_tp, 7, 4, 2, tp_axes, true);

	/* one whole 1-D tensor of more than one element: no data-parallel
	 * sharding, so wo and w2 are undecided at tp=2 and need nothing at
	 * tp=1 */
	tdesc mixed[8];
	flx_ckpt *c;
	flx_spec s;
	flx_plan *p = NULL;

	memcpy(mixed, fsdp_tp, sizeof(fsdp_tp));
	mixed[7] = (tdesc){"whole", 1, {12}, {1}};
	c = make_index(mixed, 8);
	flx_spec_init(&s);
	s.tp = 2;
	CHECK_EQ(flx_plan_build_all(c, &s, &p, NULL), 0);
	if (p) {
		CHECK_EQ(p->dp_degree, 0);
		CHECK_EQ(p->nundecided, 2);
		CHECK(find(p, "wo")->undecided && find(p, "w2")->undecided);
		CHECK_EQ(find(p, "norm")->split, 0);
	}
	flx_plan_free(p);
	s.tp = 1;
	CHECK_EQ(flx_plan_build(c, &s, &p, NULL), 0);
	flx_plan_free(p);
	flx_spec_release(&s);
	flx_ckpt_close(c);
}

/* strip_prefix= that gives two tensors one name is refused, by name */
static void test_filter_collision(void)
{
	static const tdesc two[] = {{"model.a", 1, {4}, {1}},
				    {"a", 1, {4}, {1}},
				    {"model.b", 1, {4}, {1}}};
	flx_ckpt *c = make_index(two, 3);
	flx_spec s;
	flx_findex *fi = NULL;
	flx_error err;

	flx_spec_init(&s);
	flx_error_init(&err);
	CHECK_EQ(flx_spec_set(&s, "strip_prefix", "model.", NULL), 0);
	CHECK_EQ(flx_filter_apply(&s, c, &fi, &err), -EINVAL);
	CHECK_STR(err.key, "strip_prefix");
	CHECK(strstr(err.text, "'a' names two") != NULL);
	/* without the unprefixed one: renamed, the source untouched */
	CHECK_EQ(flx_spec_set(&s, "exclude", "a", NULL), 0);
	CHECK_EQ(flx_filter_apply(&s, c, &fi, NULL), 0);
	if (fi) {
		const flx_ckpt *f = flx_findex_ckpt(fi);

		CHECK_EQ(f->ntensors, 2);
		CHECK_STR(f->tensors[0].fqn, "a");
		CHECK_STR(f->by_name[1]->fqn, "b");
		CHECK_STR(c->tensors[0].fqn, "model.a");
	}
	flx_findex_free(fi);
	flx_spec_release(&s);
	flx_ckpt_close(c);
}

/* A rule's groups must divide its axis into groups x tp equal pieces: a
 * tensor that does not is refused at plan time with one line naming it,
 * the rule and the count; one that does is placed. */
static void test_groups_divide(void)
{
	static const tdesc t[] = {{"fc1.weight", 2, {12, 4}, {1, 1}}};
	static const char r[] =
	    "[{\"match\": \"fc1.*\", \"split\": 0, \"groups\": 2}]";
	flx_ckpt *c = make_index(t, 1);
	flx_plan *p = NULL;
	flx_spec s;
	flx_error err;

	/* the regrouping transform looks its source up by name */
	c->by_name = calloc(1, sizeof(*c->by_name));
	c->by_name[0] = &c->tensors[0];
	flx_spec_init(&s);
	CHECK_EQ(flx_spec_rules_parse(&s, r, sizeof(r) - 1, "r.json", NULL), 0);
	s.tp = 3; /* 12 rows: 2 groups of 3 pieces of 2 */
	CHECK_EQ(flx_plan_build(c, &s, &p, NULL), 0);
	flx_plan_free(p);
	p = NULL;
	s.tp = 4; /* 12 rows do not divide into 8 */
	flx_error_init(&err);
	CHECK_EQ(flx_plan_build(c, &s, &p, &err), -EINVAL);
	CHECK(p == NULL);
	CHECK_STR(err.key, "fc1.weight");
	CHECK(strstr(err.text, "rule 'fc1.*' makes axis 0 2 parts split over "
			       "tp=4, but its 12 entries do not divide into "
			       "8") != NULL);
	CHECK(!strchr(err.text, '\n'));
	flx_plan_free(p);
	flx_spec_release(&s);
	flx_ckpt_close(c);
}

int main(void)
{
	test_filter_collision();
	test_undecided();
	test_fsdp();
	test_groups_divide();
	return CHECK_RESULT();
}
