/* SPDX-License-Identifier: MIT */
/*
 * The table of blocks the CUDA backend keeps on the device
 * (gpu/slice_slots.h), on the host: hits only for a published slot of the
 * same origin and block, the least recently held free slot taken first,
 * held slots never taken, -EAGAIN when all are held, origin 0 never kept,
 * a second copy of a block never published, drop after an error; then a
 * random run against a model that remembers what each slot holds.
 */
#include "check.h"
#include "slice_slots.h"

#include <errno.h>
#include <stdlib.h>

static flx_slice_block blk(uint32_t file, uint64_t start)
{
	return (flx_slice_block){start, 1024, file};
}

static void test_rules(void)
{
	flx_slots t = {0};
	flx_slice_block a = blk(0, 0), b = blk(0, 1024), c = blk(1, 0),
			d = blk(0, 2048), e = blk(2, 0);
	const flx_slice_block *k[4] = {&a, &b, &c, &d};
	int32_t s[4], x, y;
	bool hit;

	CHECK_EQ(flx_slots_init(&t, 0), -EINVAL);
	CHECK_EQ(flx_slots_init(&t, 4), 0);
	for (int i = 0; i < 4; i++) {
		CHECK_EQ(flx_slots_hold(&t, 7, k[i], &s[i], &hit), 0);
		CHECK(!hit);
		for (int j = 0; j < i; j++)
			CHECK(s[i] != s[j]);
	}
	/* every slot held: none for a fifth block */
	CHECK_EQ(flx_slots_hold(&t, 7, &e, &x, &hit), -EAGAIN);
	for (int i = 0; i < 4; i++)
		flx_slots_publish(&t, s[i]);
	flx_slots_release(&t, s, 4, false);
	/* found again: same origin and block only */
	CHECK_EQ(flx_slots_hold(&t, 7, &a, &x, &hit), 0);
	CHECK(hit && x == s[0]);
	flx_slots_release(&t, &x, 1, false);
	CHECK_EQ(flx_slots_hold(&t, 8, &b, &x, &hit), 0); /* other origin */
	CHECK(!hit && x == s[1]); /* b's slot: the least recently held */
	flx_slots_release(&t, &x, 1, false);
	CHECK_EQ(flx_slots_hold(&t, 7, &b, &x, &hit), 0); /* b was replaced */
	CHECK(!hit && x == s[2]);
	flx_slots_release(&t, &x, 1, false);
	/* a block's length is part of its key */
	e = c;
	e.len = 512;
	CHECK_EQ(flx_slots_hold(&t, 7, &d, &x, &hit), 0);
	CHECK(hit && x == s[3]);
	CHECK_EQ(flx_slots_hold(&t, 7, &e, &y, &hit), 0);
	CHECK(!hit && y != x);
	flx_slots_release(&t, &x, 1, false);
	flx_slots_release(&t, &y, 1, false);
	flx_slots_free(&t);

	/* origin 0: never kept; a second copy is not published; drop */
	CHECK_EQ(flx_slots_init(&t, 3), 0);
	CHECK_EQ(flx_slots_hold(&t, 0, &a, &x, &hit), 0);
	flx_slots_publish(&t, x);
	flx_slots_release(&t, &x, 1, false);
	CHECK_EQ(flx_slots_hold(&t, 0, &a, &x, &hit), 0);
	CHECK(!hit);
	flx_slots_release(&t, &x, 1, false);
	CHECK_EQ(flx_slots_hold(&t, 5, &a, &x, &hit), 0);
	CHECK_EQ(flx_slots_hold(&t, 5, &a, &y, &hit), 0); /* both missed */
	CHECK(!hit && x != y);
	flx_slots_publish(&t, x);
	flx_slots_publish(&t, y);
	flx_slots_release(&t, &y, 1, false);
	flx_slots_release(&t, &x, 1, false);
	CHECK_EQ(flx_slots_hold(&t, 5, &a, &s[0], &hit), 0);
	CHECK(hit && s[0] == x);
	flx_slots_release(&t, s, 1, true); /* dropped: a is gone */
	CHECK_EQ(flx_slots_hold(&t, 5, &a, &s[0], &hit), 0);
	CHECK(!hit);
	flx_slots_release(&t, s, 1, false);
	flx_slots_free(&t);
}

/* Random holds, publishes and releases of 24 blocks of 2 origins on 8
 * slots, against what each slot was given and whether it is published. */
static void test_random(void)
{
	enum { N = 8, HELD = 6 };
	flx_slots t = {0};
	struct {
		uint64_t origin;
		flx_slice_block k;
		bool published;
		unsigned ref;
	} m[N] = {{0}};
	int32_t held[HELD];
	size_t nheld = 0;
	unsigned seed = 99, hits = 0;

	CHECK_EQ(flx_slots_init(&t, N), 0);
	for (int op = 0; op < 20000; op++) {
		uint64_t origin = 1 + (unsigned)rand_r(&seed) % 2;
		flx_slice_block k = blk(0, (unsigned)rand_r(&seed) % 12 * 1024);
		int32_t i, want = -1;
		bool hit;

		if (nheld == HELD || rand_r(&seed) % 3 == 0) {
			bool drop = rand_r(&seed) % 10 == 0;

			flx_slots_release(&t, held, nheld, drop);
			for (size_t j = 0; j < nheld; j++) {
				m[held[j]].ref--;
				m[held[j]].published &= !drop;
			}
			nheld = 0;
			continue;
		}
		for (int j = 0; j < N; j++)
			if (m[j].published && m[j].origin == origin &&
			    m[j].k.start == k.start)
				want = j;
		CHECK_EQ(flx_slots_hold(&t, origin, &k, &i, &hit), 0);
		CHECK_EQ(hit, want >= 0);
		CHECK(hit ? i == want : m[i].ref == 0);
		hits += hit;
		if (!hit) {
			m[i].origin = origin;
			m[i].k = k;
			m[i].published = false;
		}
		m[i].ref++;
		held[nheld++] = i;
		if (!hit && rand_r(&seed) % 4) {
			flx_slots_publish(&t, i);
			/* published unless another slot holds it published */
			m[i].published = true;
			for (int j = 0; j < N; j++)
				if (j != i && m[j].published &&
				    m[j].origin == origin &&
				    m[j].k.start == k.start)
					m[i].published = false;
		}
	}
	CHECK(hits > 1000);
	flx_slots_free(&t);
}

int main(void)
{
	test_rules();
	test_random();
	return CHECK_RESULT();
}
