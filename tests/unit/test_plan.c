/* SPDX-License-Identifier: MIT */
/*
 * Placement decisions on hand-built indexes (no files are read): every
 * undecided tensor reported at once, and the split inferred from sources
 * sharded data-parallel along dim 0 (FSDP), alone and with TP.  The oracle
 * is the layout each index was built from (its axes and degrees).
 */
#include "check.h"

#include "ckpt.h"
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

int main(void)
{
	test_undecided();
	return CHECK_RESULT();
}
