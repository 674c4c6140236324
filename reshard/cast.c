/* SPDX-License-Identifier: MIT */
/*
 * Element conversions (cast.h): which pairs, and whole arrays.  The
 * conversion of one element is gpu/elemcast.h's, the code the CUDA
 * backend runs too (it says how every conversion rounds once).
 */
#include "cast.h"
#include "elemcast.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The element types cast.c converts, as the conversions (elemcast.h)
 * see them. */
static flx_etype type_of(flx_dtype dt)
{
	switch (dt) {
	case FLX_DT_F64:
		return (flx_etype){FLX_EK_FLOAT, 11, 52, 64, 1, 8};
	case FLX_DT_F32:
		return (flx_etype){FLX_EK_FLOAT, 8, 23, 32, 1, 4};
	case FLX_DT_F16:
		return (flx_etype){FLX_EK_FLOAT, 5, 10, 16, 1, 2};
	case FLX_DT_BF16:
		return (flx_etype){FLX_EK_FLOAT, 8, 7, 16, 1, 2};
	case FLX_DT_I64:
		return (flx_etype){FLX_EK_INT, 0, 0, 64, 1, 8};
	case FLX_DT_I32:
		return (flx_etype){FLX_EK_INT, 0, 0, 32, 1, 4};
	case FLX_DT_I16:
		return (flx_etype){FLX_EK_INT, 0, 0, 16, 1, 2};
	case FLX_DT_I8:
		return (flx_etype){FLX_EK_INT, 0, 0, 8, 1, 1};
	case FLX_DT_U64:
		return (flx_etype){FLX_EK_INT, 0, 0, 64, 0, 8};
	case FLX_DT_U32:
		return (flx_etype){FLX_EK_INT, 0, 0, 32, 0, 4};
	case FLX_DT_U16:
		return (flx_etype){FLX_EK_INT, 0, 0, 16, 0, 2};
	case FLX_DT_U8:
		return (flx_etype){FLX_EK_INT, 0, 0, 8, 0, 1};
	case FLX_DT_BOOL:
		return (flx_etype){FLX_EK_BOOL, 0, 0, 1, 0, 1};
	default:
		return (flx_etype){FLX_EK_NONE, 0, 0, 0, 0, 0};
	}
}

bool flx_cast_supported(flx_dtype from, flx_dtype to)
{
	flx_etype a = type_of(from), b = type_of(to);

	if (a.kind == FLX_EK_NONE || b.kind == FLX_EK_NONE)
		return false;
	return !(a.kind == FLX_EK_FLOAT && b.kind != FLX_EK_FLOAT);
}

/* Significant bits of the largest magnitude of an integer type. */
static int int_digits(const flx_etype *t)
{
	return t->kind == FLX_EK_BOOL ? 1 : t->bits - t->sign;
}

bool flx_cast_exact(flx_dtype from, flx_dtype to)
{
	flx_etype a = type_of(from), b = type_of(to);

	if (!flx_cast_supported(from, to))
		return false;
	if (from == to || a.kind == FLX_EK_BOOL)
		return true;
	if (a.kind == FLX_EK_FLOAT)
		return b.ebits >= a.ebits && b.mbits >= a.mbits;
	if (b.kind == FLX_EK_FLOAT) /* every integer up to 2^(mbits + 1) */
		return int_digits(&a) <= b.mbits + 1;
	if (b.kind == FLX_EK_BOOL)
		return false;
	/* integer to integer: the target's range covers the source's */
	return a.sign ? b.sign && b.bits >= a.bits : b.bits - b.sign >= a.bits;
}

int flx_cast_desc(flx_dtype from, flx_dtype to, flx_ecast *out)
{
	if (!flx_cast_supported(from, to))
		return -EINVAL;
	*out = flx_ecast_make(type_of(from), type_of(to));
	return 0;
}

int flx_cast(flx_dtype to, void *dst, flx_dtype from, const void *src, size_t n)
{
	flx_ecast c;
	int rc = flx_cast_desc(from, to, &c);

	if (!rc)
		flx_ecast_n(&c, dst, src, n);
	return rc;
}

/* Elements converted per batch: bounds the memory of a read. */
#define CAST_BATCH 16384
/* Converted bytes per window of a one-pass source (a device slicer): a
 * FUSE request in one window, so its blocks are fetched and sent once;
 * bounds a batch's source bytes (8x at most: i64 to i8) too. */
#define CONV_WINDOW (8u << 20)

/* Target bytes [off, off + n) through windows of at most max converted
 * elements: each filled by conv() into win, its wanted bytes copied out. */
static int cast_windows(unsigned tsz, flx_cast_conv_fn conv, void *ctx,
			unsigned char *win, uint64_t max, unsigned char *out,
			size_t n, uint64_t off)
{
	uint64_t e, end = off + n;
	int rc = 0;

	/* elements [e, e + k) hold target bytes [e * tsz, (e + k) * tsz),
	 * of which [lo, hi) were asked for */
	for (e = off / tsz; e * tsz < end;) {
		uint64_t k = (end - e * tsz + tsz - 1) / tsz, lo, hi;

		if (k > max)
			k = max;
		rc = conv(ctx, win, (size_t)k, e);
		if (rc)
			break;
		lo = e * tsz > off ? e * tsz : off;
		hi = (e + k) * tsz < end ? (e + k) * tsz : end;
		memcpy(out + (lo - off), win + (lo - e * tsz), hi - lo);
		e += k;
	}
	return rc;
}

/* flx_cast_read()'s conv(): the source elements read, then converted. */
typedef struct raw_src {
	flx_cast_source_fn rd;
	void *ctx;
	unsigned char *raw;
	flx_ecast c;
} raw_src;

static int read_convert(void *arg, void *conv, size_t k, uint64_t e)
{
	raw_src *s = arg;
	int rc = s->rd(s->ctx, s->raw, k * s->c.from.size, e * s->c.from.size);

	if (!rc)
		flx_ecast_n(&s->c, conv, s->raw, k);
	return rc;
}

int flx_cast_read(flx_dtype to, flx_dtype from, flx_cast_source_fn rd,
		  void *ctx, void *buf, size_t n, uint64_t off)
{
	raw_src s = {rd, ctx, NULL, {{0}, {0}, 0}};
	unsigned char *conv = NULL;
	int rc = flx_cast_desc(from, to, &s.c);

	if (rc || n == 0)
		return rc;
	s.raw = malloc((size_t)CAST_BATCH * s.c.from.size);
	conv = malloc((size_t)CAST_BATCH * s.c.to.size);
	if (!s.raw || !conv) {
		rc = -ENOMEM;
		goto out;
	}
	rc = cast_windows(s.c.to.size, read_convert, &s, conv, CAST_BATCH, buf,
			  n, off);
out:
	free(s.raw);
	free(conv);
	return rc;
}

int flx_cast_read_conv(flx_dtype to, flx_dtype from, flx_cast_conv_fn conv,
		       void *ctx, void *buf, size_t n, uint64_t off)
{
	uint64_t tsz = flx_dtype_size(to), max = CONV_WINDOW / tsz;
	uint64_t k = (off + n + tsz - 1) / tsz - off / tsz;
	unsigned char *win;
	int rc;

	if (!flx_cast_supported(from, to))
		return -EINVAL;
	if (n == 0)
		return 0;
	/* whole elements in one window: converted straight into buf */
	if (off % tsz == 0 && n % tsz == 0 && k <= max)
		return conv(ctx, buf, (size_t)k, off / tsz);
	if (k > max)
		k = max;
	win = malloc((size_t)(k * tsz));
	if (!win)
		return -ENOMEM;
	rc = cast_windows((unsigned)tsz, conv, ctx, win, k, buf, n, off);
	free(win);
	return rc;
}
