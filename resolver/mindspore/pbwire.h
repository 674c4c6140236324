/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_MS_PBWIRE_H
#define FLX_RESOLVER_MS_PBWIRE_H

/*
 * Internal: a bounded protobuf wire reader over a byte range, for the
 * MindSpore checkpoint and strategy decoders.  A cursor never moves past
 * its end; varints are at most 10 bytes; a length-delimited field must lie
 * inside its message.  Pure functions over caller memory; thread-safe.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct flx_pb {
	const uint8_t *p, *end;
} flx_pb;

enum { FLX_PB_VARINT = 0, FLX_PB_I64 = 1, FLX_PB_LEN = 2, FLX_PB_I32 = 5 };

/** Read a varint.  @return 0, or -EINVAL (truncated, over 10 bytes). */
static inline int flx_pb_varint(flx_pb *c, uint64_t *v)
{
	uint64_t x = 0;
	for (unsigned i = 0; i < 10; i++) {
		if (c->p >= c->end)
			return -22;
		uint8_t b = *c->p++;
		if (i == 9 && b > 1)
			return -22;
		x |= (uint64_t)(b & 0x7f) << (7 * i);
		if (!(b & 0x80)) {
			*v = x;
			return 0;
		}
	}
	return -22;
}

/** Read a field key.  @return 0 with *field (>= 1) and *wt, or -EINVAL. */
static inline int flx_pb_key(flx_pb *c, uint32_t *field, uint32_t *wt)
{
	uint64_t k;
	if (flx_pb_varint(c, &k) < 0 || (k >> 3) == 0 || (k >> 3) > 536870911u)
		return -22;
	*field = (uint32_t)(k >> 3);
	*wt = (uint32_t)(k & 7);
	return 0;
}

/** Read a length-delimited payload into *sub (inside c).  @return 0 or
 * -EINVAL. */
static inline int flx_pb_len(flx_pb *c, flx_pb *sub)
{
	uint64_t n;
	if (flx_pb_varint(c, &n) < 0 || n > (uint64_t)(c->end - c->p))
		return -22;
	sub->p = c->p;
	sub->end = c->p + n;
	c->p += n;
	return 0;
}

/** Skip a field of wire type wt (groups are refused).  @return 0 or
 * -EINVAL. */
static inline int flx_pb_skip(flx_pb *c, uint32_t wt)
{
	uint64_t v;
	flx_pb sub;
	switch (wt) {
	case FLX_PB_VARINT:
		return flx_pb_varint(c, &v);
	case FLX_PB_I64:
	case FLX_PB_I32: {
		size_t n = wt == FLX_PB_I64 ? 8 : 4;
		if ((size_t)(c->end - c->p) < n)
			return -22;
		c->p += n;
		return 0;
	}
	case FLX_PB_LEN:
		return flx_pb_len(c, &sub);
	default:
		return -22;
	}
}

#endif
