/* SPDX-License-Identifier: MIT */
/*
 * Element conversions (cast.h).  Every conversion goes through one exact
 * intermediate: a number is sign, class and, when finite, an integer
 * significand times a power of two; decoding a floating or integer element
 * into it loses nothing, and encoding it into a floating type is the only
 * rounding.  So a narrowing rounds once, whatever the two types (f64 to
 * f16 through f32 would round twice and may differ in the last bit).  The
 * common widenings to f32 and f64 and bf16 <-> f32 have shortcuts that
 * give the same bits; NaNs always take the general path.
 */
#include "cast.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "elements are loaded with the host's byte order, assumed little-endian"
#endif

/* An IEEE-754 binary format: exponent and stored significand bits. */
typedef struct ffmt {
	int ebits;
	int mbits;
} ffmt;

typedef enum kind { K_NONE, K_FLOAT, K_INT, K_BOOL } kind;

typedef struct ty {
	kind k;
	ffmt f;	     /* K_FLOAT */
	int bits;    /* K_INT: width */
	bool sign;   /* K_INT: two's complement */
	unsigned sz; /* bytes */
} ty;

static ty type_of(flx_dtype dt)
{
	switch (dt) {
	case FLX_DT_F64:
		return (ty){K_FLOAT, {11, 52}, 64, true, 8};
	case FLX_DT_F32:
		return (ty){K_FLOAT, {8, 23}, 32, true, 4};
	case FLX_DT_F16:
		return (ty){K_FLOAT, {5, 10}, 16, true, 2};
	case FLX_DT_BF16:
		return (ty){K_FLOAT, {8, 7}, 16, true, 2};
	case FLX_DT_I64:
		return (ty){K_INT, {0, 0}, 64, true, 8};
	case FLX_DT_I32:
		return (ty){K_INT, {0, 0}, 32, true, 4};
	case FLX_DT_I16:
		return (ty){K_INT, {0, 0}, 16, true, 2};
	case FLX_DT_I8:
		return (ty){K_INT, {0, 0}, 8, true, 1};
	case FLX_DT_U64:
		return (ty){K_INT, {0, 0}, 64, false, 8};
	case FLX_DT_U32:
		return (ty){K_INT, {0, 0}, 32, false, 4};
	case FLX_DT_U16:
		return (ty){K_INT, {0, 0}, 16, false, 2};
	case FLX_DT_U8:
		return (ty){K_INT, {0, 0}, 8, false, 1};
	case FLX_DT_BOOL:
		return (ty){K_BOOL, {0, 0}, 1, false, 1};
	default:
		return (ty){K_NONE, {0, 0}, 0, false, 0};
	}
}

bool flx_cast_supported(flx_dtype from, flx_dtype to)
{
	ty a = type_of(from), b = type_of(to);

	if (a.k == K_NONE || b.k == K_NONE)
		return false;
	return !(a.k == K_FLOAT && b.k != K_FLOAT);
}

/* Significant bits of the largest magnitude of an integer type. */
static int int_digits(const ty *t)
{
	return t->k == K_BOOL ? 1 : t->bits - t->sign;
}

bool flx_cast_exact(flx_dtype from, flx_dtype to)
{
	ty a = type_of(from), b = type_of(to);

	if (!flx_cast_supported(from, to))
		return false;
	if (from == to || a.k == K_BOOL)
		return true;
	if (a.k == K_FLOAT)
		return b.f.ebits >= a.f.ebits && b.f.mbits >= a.f.mbits;
	if (b.k == K_FLOAT) /* every integer up to 2^(mbits + 1) is exact */
		return int_digits(&a) <= b.f.mbits + 1;
	if (b.k == K_BOOL)
		return false;
	/* integer to integer: the target's range covers the source's */
	return a.sign ? b.sign && b.bits >= a.bits : b.bits - b.sign >= a.bits;
}

/* ---- the exact intermediate ---- */

typedef enum cls { C_ZERO, C_FIN, C_INF, C_NAN } cls;

/* C_FIN: sig * 2^exp (sig != 0); C_NAN: payload, left-aligned in 64
 * bits (its leading bit is the quiet bit). */
typedef struct num {
	cls c;
	bool neg;
	uint64_t sig;
	int exp;
	uint64_t payload;
} num;

static int bias_of(const ffmt *f)
{
	return (1 << (f->ebits - 1)) - 1;
}

static num decode_float(const ffmt *f, uint64_t bits)
{
	uint64_t emask = ((uint64_t)1 << f->ebits) - 1;
	uint64_t frac = bits & (((uint64_t)1 << f->mbits) - 1);
	uint64_t e = (bits >> f->mbits) & emask;
	num v = {.neg = (bits >> (f->ebits + f->mbits)) & 1};

	if (e == emask) {
		v.c = frac ? C_NAN : C_INF;
		v.payload = frac << (64 - f->mbits);
	} else if (e == 0) {
		v.c = frac ? C_FIN : C_ZERO;
		v.sig = frac;
		v.exp = 1 - bias_of(f) - f->mbits;
	} else {
		v.c = C_FIN;
		v.sig = frac | (uint64_t)1 << f->mbits;
		v.exp = (int)e - bias_of(f) - f->mbits;
	}
	return v;
}

/* An integer or bool element (bits: zero-extended to 64 bits) as a
 * 64-bit two's complement value. */
static uint64_t int_value(const ty *t, uint64_t bits)
{
	if (t->k == K_BOOL)
		return bits != 0;
	if (t->sign && t->bits < 64 && (bits >> (t->bits - 1)) & 1)
		return bits | ~(uint64_t)0 << t->bits; /* sign-extend */
	return bits;
}

static num decode_int(const ty *t, uint64_t bits)
{
	uint64_t x = int_value(t, bits);
	num v = {.c = x ? C_FIN : C_ZERO};

	v.neg = t->sign && (int64_t)x < 0;
	v.sig = v.neg ? (uint64_t)0 - x : x;
	return v;
}

static int top_bit(uint64_t x)
{
	return 63 - __builtin_clzll(x);
}

/* sig >> shift rounded to nearest, ties to even (shift >= 1). */
static uint64_t round_shift(uint64_t sig, int shift)
{
	uint64_t q, rem, half;

	if (shift > 64)
		return 0; /* below half of the quantum */
	if (shift == 64) {
		q = 0;
		rem = sig;
	} else {
		q = sig >> shift;
		rem = sig & (((uint64_t)1 << shift) - 1);
	}
	half = (uint64_t)1 << (shift - 1);
	return q + (rem > half || (rem == half && (q & 1)));
}

static uint64_t encode_float(const ffmt *f, const num *v)
{
	uint64_t sign = (uint64_t)v->neg << (f->ebits + f->mbits);
	uint64_t inf = (((uint64_t)1 << f->ebits) - 1) << f->mbits;
	int bias = bias_of(f), emin = 1 - bias, lead, q;
	uint64_t s, mag;

	switch (v->c) {
	case C_ZERO:
		return sign;
	case C_INF:
		return sign | inf;
	case C_NAN:
		return sign | inf | (uint64_t)1 << (f->mbits - 1) |
		       v->payload >> (64 - f->mbits);
	default:
		break;
	}
	/* lead: exponent of the leading bit; q: exponent of the target's
	 * last significand bit there (fixed below the normal range) */
	lead = top_bit(v->sig) + v->exp;
	if (lead > bias)
		return sign | inf;
	q = (lead >= emin ? lead : emin) - f->mbits;
	if (q <= v->exp)
		s = v->sig << (v->exp - q); /* exact: fits mbits + 1 bits */
	else
		s = round_shift(v->sig, q - v->exp);
	/* s holds the implicit bit of a normal number: adding it to the
	 * exponent field one below carries a rounding that overflowed the
	 * significand into the exponent, up to infinity */
	mag = lead >= emin ? ((uint64_t)(lead + bias - 1) << f->mbits) + s : s;
	return sign | (mag >= inf ? inf : mag);
}

/* ---- elements ---- */

static uint64_t load(const unsigned char *p, unsigned sz)
{
	uint8_t u8;
	uint16_t u16;
	uint32_t u32;
	uint64_t u64;

	switch (sz) {
	case 1:
		memcpy(&u8, p, 1);
		return u8;
	case 2:
		memcpy(&u16, p, 2);
		return u16;
	case 4:
		memcpy(&u32, p, 4);
		return u32;
	default:
		memcpy(&u64, p, 8);
		return u64;
	}
}

static void store(unsigned char *p, unsigned sz, uint64_t v)
{
	uint8_t u8 = (uint8_t)v;
	uint16_t u16 = (uint16_t)v;
	uint32_t u32 = (uint32_t)v;

	switch (sz) {
	case 1:
		memcpy(p, &u8, 1);
		break;
	case 2:
		memcpy(p, &u16, 2);
		break;
	case 4:
		memcpy(p, &u32, 4);
		break;
	default:
		memcpy(p, &v, 8);
	}
}

/* One element, through the intermediate; between integer types, the
 * value modulo 2^bits of b (store() keeps the low bits). */
static uint64_t convert(const ty *a, const ty *b, uint64_t bits)
{
	num v;

	if (a->k != K_FLOAT && b->k != K_FLOAT)
		return b->k == K_BOOL ? int_value(a, bits) != 0
				      : int_value(a, bits);
	v = a->k == K_FLOAT ? decode_float(&a->f, bits) : decode_int(a, bits);
	return encode_float(&b->f, &v);
}

static bool is_nan32(uint32_t u)
{
	return (u & 0x7fffffffu) > 0x7f800000u;
}

/* The shortcuts: NaNs are left to convert(). */
static void f32_to_bf16(unsigned char *d, const unsigned char *s, size_t n)
{
	static const ty a = {K_FLOAT, {8, 23}, 32, true, 4},
			b = {K_FLOAT, {8, 7}, 16, true, 2};

	for (size_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)load(s + 4 * i, 4);
		uint64_t r = is_nan32(u)
				 ? convert(&a, &b, u)
				 : (u + 0x7fffu + ((u >> 16) & 1)) >> 16;

		store(d + 2 * i, 2, r);
	}
}

static void bf16_to_f32(unsigned char *d, const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)load(s + 2 * i, 2) << 16;

		if (is_nan32(u))
			u |= 0x00400000u; /* quiet */
		store(d + 4 * i, 4, u);
	}
}

/* f16 to f32: a normal number only moves its exponent; the rest (zeros,
 * subnormals, infinities, NaNs) go through convert(). */
static void f16_to_f32(unsigned char *d, const unsigned char *s, size_t n)
{
	static const ty a = {K_FLOAT, {5, 10}, 16, true, 2},
			b = {K_FLOAT, {8, 23}, 32, true, 4};

	for (size_t i = 0; i < n; i++) {
		uint32_t h = (uint32_t)load(s + 2 * i, 2), e = h & 0x7c00u;
		uint64_t r = e && e != 0x7c00u
				 ? (h & 0x8000u) << 16 |
				       (((h & 0x7fffu) << 13) + 0x38000000u)
				 : convert(&a, &b, h);

		store(d + 4 * i, 4, r);
	}
}

static void f32_to_f64(unsigned char *d, const unsigned char *s, size_t n)
{
	static const ty a = {K_FLOAT, {8, 23}, 32, true, 4},
			b = {K_FLOAT, {11, 52}, 64, true, 8};

	for (size_t i = 0; i < n; i++) {
		float x;
		double y;

		memcpy(&x, s + 4 * i, 4);
		if (x != x) {
			store(d + 8 * i, 8,
			      convert(&a, &b, load(s + 4 * i, 4)));
			continue;
		}
		y = x;
		memcpy(d + 8 * i, &y, 8);
	}
}

static void f64_to_f32(unsigned char *d, const unsigned char *s, size_t n)
{
	static const ty a = {K_FLOAT, {11, 52}, 64, true, 8},
			b = {K_FLOAT, {8, 23}, 32, true, 4};

	for (size_t i = 0; i < n; i++) {
		double x;
		float y;

		memcpy(&x, s + 8 * i, 8);
		if (x != x) {
			store(d + 4 * i, 4,
			      convert(&a, &b, load(s + 8 * i, 8)));
			continue;
		}
		y = (float)x; /* rounded to nearest, ties to even */
		memcpy(d + 4 * i, &y, 4);
	}
}

int flx_cast(flx_dtype to, void *dst, flx_dtype from, const void *src, size_t n)
{
	ty a = type_of(from), b = type_of(to);
	unsigned char *d = dst;
	const unsigned char *s = src;

	if (!flx_cast_supported(from, to))
		return -EINVAL;
	if (from == to) {
		memcpy(d, s, n * a.sz);
		return 0;
	}
	if (from == FLX_DT_F32 && to == FLX_DT_BF16)
		f32_to_bf16(d, s, n);
	else if (from == FLX_DT_BF16 && to == FLX_DT_F32)
		bf16_to_f32(d, s, n);
	else if (from == FLX_DT_F16 && to == FLX_DT_F32)
		f16_to_f32(d, s, n);
	else if (from == FLX_DT_F32 && to == FLX_DT_F64)
		f32_to_f64(d, s, n);
	else if (from == FLX_DT_F64 && to == FLX_DT_F32)
		f64_to_f32(d, s, n);
	else
		for (size_t i = 0; i < n; i++)
			store(d + i * b.sz, b.sz,
			      convert(&a, &b, load(s + i * a.sz, a.sz)));
	return 0;
}

/* Elements converted per batch: bounds the memory of a read. */
#define CAST_BATCH 16384

int flx_cast_read(flx_dtype to, flx_dtype from, flx_cast_source_fn rd,
		  void *ctx, void *buf, size_t n, uint64_t off)
{
	unsigned ssz = flx_dtype_size(from), tsz = flx_dtype_size(to);
	unsigned char *raw = NULL, *conv = NULL, *out = buf;
	uint64_t e, end = off + n;
	int rc = 0;

	if (!flx_cast_supported(from, to))
		return -EINVAL;
	if (n == 0)
		return 0;
	raw = malloc((size_t)CAST_BATCH * ssz);
	conv = malloc((size_t)CAST_BATCH * tsz);
	if (!raw || !conv) {
		rc = -ENOMEM;
		goto out;
	}
	/* elements [e, e + k) hold target bytes [e * tsz, (e + k) * tsz),
	 * of which [lo, hi) were asked for */
	for (e = off / tsz; !rc && e * tsz < end;) {
		uint64_t k = (end - e * tsz + tsz - 1) / tsz, lo, hi;

		if (k > CAST_BATCH)
			k = CAST_BATCH;
		rc = rd(ctx, raw, (size_t)(k * ssz), e * ssz);
		if (rc)
			break;
		flx_cast(to, conv, from, raw, (size_t)k);
		lo = e * tsz > off ? e * tsz : off;
		hi = (e + k) * tsz < end ? (e + k) * tsz : end;
		memcpy(out + (lo - off), conv + (lo - e * tsz), hi - lo);
		e += k;
	}
out:
	free(raw);
	free(conv);
	return rc;
}
