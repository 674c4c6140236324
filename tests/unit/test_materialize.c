/* SPDX-License-Identifier: MIT */
/*
 * flexfs-materialize's decisions (tools/materialize.h): the rank of each
 * file against an independent check of disjointness, coverage and the
 * balance bound; the resume rule; nesting of paths; --views selection.
 */
#include "check.h"
#include "materialize.h"

#include <errno.h>

/* xorshift: sizes with a spread, reproducible */
static uint64_t next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* owner[] covers every file once, within [0, nranks), and no rank's
 * load passes the mean by more than the largest file's cost. */
static void check_assignment(const uint64_t *size, size_t n, int nranks)
{
	int *owner = malloc((n ? n : 1) * sizeof(*owner));
	int *again = malloc((n ? n : 1) * sizeof(*again));
	uint64_t load[64] = {0}, total = 0, biggest = 0, max = 0;

	CHECK(owner && again && nranks <= 64);
	CHECK_EQ(flx_mat_assign(size, n, nranks, owner), 0);
	CHECK_EQ(flx_mat_assign(size, n, nranks, again), 0);
	for (size_t i = 0; i < n; i++) {
		uint64_t cost = size[i] + FLX_MAT_FILE_COST;

		CHECK(owner[i] >= 0 && owner[i] < nranks);
		CHECK_EQ(owner[i], again[i]); /* every rank decides alike */
		if (owner[i] < 0 || owner[i] >= nranks)
			continue;
		load[owner[i]] += cost;
		total += cost;
		if (cost > biggest)
			biggest = cost;
	}
	for (int r = 0; r < nranks; r++)
		if (load[r] > max)
			max = load[r];
	/* greedy's bound: the most loaded rank got its last file while it
	 * was the least loaded */
	CHECK(max <= total / (uint64_t)nranks + biggest);
	/* more files than ranks: every rank writes something */
	if (n >= (size_t)nranks)
		for (int r = 0; r < nranks; r++)
			CHECK(load[r] > 0);
	free(owner);
	free(again);
}

static void test_assign(void)
{
	uint64_t size[1000], seed = 88172645463325252ull;
	int owner[4];
	uint64_t two[2] = {100, 100};
	uint64_t big[4] = {1000000, 10, 10, 10};

	for (size_t i = 0; i < 1000; i++)
		size[i] = next(&seed) % (64u << 20);
	for (int r = 1; r <= 8; r++) {
		check_assignment(size, 1000, r);
		check_assignment(size, 3, r); /* fewer files than ranks */
	}
	check_assignment(size, 0, 4);
	CHECK_EQ(flx_mat_assign(size, 4, 0, owner), -EINVAL);
	/* exact answers on small cases */
	CHECK_EQ(flx_mat_assign(two, 2, 2, owner), 0);
	CHECK(owner[0] != owner[1]);
	CHECK_EQ(flx_mat_assign(big, 4, 2, owner), 0);
	CHECK_EQ(owner[0], 0);
	CHECK_EQ(owner[1], 1);
	CHECK_EQ(owner[2], 1);
	CHECK_EQ(owner[3], 1);
	CHECK_EQ(flx_mat_assign(big, 4, 1, owner), 0);
	for (int i = 0; i < 4; i++)
		CHECK_EQ(owner[i], 0);
}

static void test_state(void)
{
	CHECK_EQ(flx_mat_state_of(false, false, 0, 10), FLX_MAT_ABSENT);
	CHECK_EQ(flx_mat_state_of(true, true, 10, 10), FLX_MAT_DONE);
	CHECK_EQ(flx_mat_state_of(true, true, 0, 0), FLX_MAT_DONE);
	CHECK_EQ(flx_mat_state_of(true, true, 9, 10), FLX_MAT_REDO);
	CHECK_EQ(flx_mat_state_of(true, true, 11, 10), FLX_MAT_REDO);
	CHECK_EQ(flx_mat_state_of(true, false, 10, 10), FLX_MAT_BLOCKED);
}

static void test_within(void)
{
	CHECK(flx_mat_within("/a/b", "/a/b"));
	CHECK(flx_mat_within("/a/b", "/a/b/c"));
	CHECK(!flx_mat_within("/a/b", "/a/bc"));
	CHECK(!flx_mat_within("/a/b/c", "/a/b"));
	CHECK(flx_mat_within("/", "/x"));
	CHECK(!flx_mat_within("/x", "/"));
}

static void test_selected(void)
{
	CHECK(flx_mat_selected(NULL, "ranks"));
	CHECK(flx_mat_selected("ranks,hf", "hf"));
	CHECK(flx_mat_selected("ranks,hf", "ranks"));
	CHECK(!flx_mat_selected("ranks,hf", "objects"));
	CHECK(!flx_mat_selected("rank", "ranks"));
	CHECK(!flx_mat_selected("ranks", "rank"));
	CHECK(flx_mat_selected("index", "index.json"));
	CHECK(flx_mat_selected("hf,index.json", "index.json"));
	CHECK(!flx_mat_selected("", "ranks"));
}

static void test_progress(void)
{
	char buf[128];

	flx_mat_progress(buf, sizeof(buf), 512u << 20, 1024u << 20, 512u << 20,
			 4.0);
	CHECK_STR(buf, " 50% 512.0 MiB / 1.0 GiB, 128.0 MiB/s, ETA 0m04s");
	flx_mat_progress(buf, sizeof(buf), 0, 100, 0, 0);
	CHECK_STR(buf, "  0% 0 B / 100 B, 0 B/s, ETA --");
}

int main(void)
{
	test_assign();
	test_state();
	test_within();
	test_selected();
	test_progress();
	return CHECK_RESULT();
}
