/* SPDX-License-Identifier: MIT */
/*
 * flx_flat_boxes() (resolver/common/shape.h), the decomposition of a Paddle
 * flattened shard into box chunks, against a per-element oracle: for every
 * range [start, stop) of blocks of 0 to 4 axes (3-D and 4-D included,
 * where Paddle's own minimal_nd_slice goes wrong), the boxes lie inside
 * the block, there are at most 2n - 1 of them, every element of the range
 * is in exactly one box and no other element is, and each box's elements
 * in row-major order have consecutive flat indices from first[k] (what
 * reading the 1-D payload with the block's row-major strides needs).
 */
#include "check.h"
#include "shape.h"

static void check_range(int n, const int64_t *blk, int64_t s, int64_t e)
{
	int64_t off[FLX_FLAT_BOXES_MAX][FLX_MAX_DIMS];
	int64_t size[FLX_FLAT_BOXES_MAX][FLX_MAX_DIMS],
	    first[FLX_FLAT_BOXES_MAX];
	int64_t st[FLX_MAX_DIMS], numel = 1;
	unsigned char seen[256] = {0};
	unsigned nb = 99;

	for (int d = n - 1; d >= 0; d--) {
		st[d] = numel;
		numel *= blk[d];
	}
	flx_flat_boxes(n, blk, s, e, off, size, first, &nb);
	CHECK(nb <= (unsigned)(n ? 2 * n - 1 : 1));
	CHECK(s < e || nb == 0);
	for (unsigned k = 0; k < nb; k++) {
		int64_t cnt = 1, idx[FLX_MAX_DIMS] = {0};

		for (int d = 0; d < n; d++) {
			CHECK(off[k][d] >= 0 && size[k][d] >= 1 &&
			      off[k][d] + size[k][d] <= blk[d]);
			cnt *= size[k][d];
		}
		/* the box's elements, row-major: flat index first[k] + i */
		for (int64_t i = 0; i < cnt; i++) {
			int64_t flat = 0;

			for (int d = 0; d < n; d++)
				flat += (off[k][d] + idx[d]) * st[d];
			CHECK_EQ(flat, first[k] + i);
			if (flat >= 0 && flat < 256)
				seen[flat]++;
			for (int d = n - 1; d >= 0; d--) {
				if (++idx[d] < size[k][d])
					break;
				idx[d] = 0;
			}
		}
	}
	for (int64_t i = 0; i < numel; i++)
		CHECK_EQ(seen[i], i >= s && i < e);
}

int main(void)
{
	static const struct {
		int n;
		int64_t blk[4];
	} shapes[] = {
	    {0, {0}},	       {1, {7}},	  {2, {3, 4}},
	    {2, {1, 5}},       {2, {5, 1}},	  {3, {2, 3, 4}},
	    {3, {3, 2, 2}},    {3, {4, 1, 3}},	  {4, {2, 2, 2, 2}},
	    {4, {2, 3, 1, 4}}, {4, {3, 1, 2, 2}},
	};

	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		int64_t numel = 1;

		for (int d = 0; d < shapes[i].n; d++)
			numel *= shapes[i].blk[d];
		for (int64_t s = 0; s <= numel; s++)
			for (int64_t e = s; e <= numel; e++)
				check_range(shapes[i].n, shapes[i].blk, s, e);
	}
	return CHECK_RESULT();
}
