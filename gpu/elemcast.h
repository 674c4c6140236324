/* SPDX-License-Identifier: MIT */
#ifndef FLX_GPU_ELEMCAST_H
#define FLX_GPU_ELEMCAST_H

/*
 * Element conversions, one element at a time: the code both the CPU
 * (reshard/cast.c, the CPU slicer's cast batches) and the CUDA backend's
 * kernels (slice_cuda.cu) run, so that the two give the same bits by
 * construction -- the unit tests of cast.c (against torch-made vectors)
 * test what the device executes.  Every function is static inline and
 * FLX_HD: __host__ __device__ under nvcc, nothing under a C compiler.
 *
 * The rules (reshard/cast.h states them for users): every conversion goes
 * through one exact intermediate: a number is sign, class and, when
 * finite, an integer significand times a power of two; decoding a
 * floating or integer element into it loses nothing, and encoding it into
 * a floating type is the only rounding (to nearest, ties to even).  So a
 * narrowing rounds once, whatever the two types (f64 to f16 through f32
 * would round twice and may differ in the last bit).  The common widenings
 * to f32 and f64 and bf16 <-> f32 have shortcuts that give the same bits
 * (flx_ecast.op); NaNs always take the general path.  The f32 <-> f64
 * shortcuts use the C conversion, IEEE-754 round to nearest even on the
 * host (SSE, default MXCSR) and on the device (cvt.rn, no flush to zero:
 * the library is not built with fast math).
 *
 * Elements are little-endian, packed, at any alignment.  Thread-safety:
 * no state; reentrant.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FLX_HD __host__ __device__
#else
#define FLX_HD
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "elements are loaded with the host's byte order, assumed little-endian"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* What an element is. */
typedef enum flx_ekind {
	FLX_EK_NONE = 0,
	FLX_EK_FLOAT, /* IEEE-754 binary: ebits, mbits */
	FLX_EK_INT,   /* bits wide, two's complement when sign */
	FLX_EK_BOOL,  /* one byte, non-zero is 1 */
} flx_ekind;

typedef struct flx_etype {
	uint8_t kind;  /* flx_ekind */
	uint8_t ebits; /* FLX_EK_FLOAT: exponent bits */
	uint8_t mbits; /* FLX_EK_FLOAT: stored significand bits */
	uint8_t bits;  /* width in bits (FLX_EK_BOOL: 1) */
	uint8_t sign;  /* FLX_EK_INT: two's complement */
	uint8_t size;  /* bytes */
} flx_etype;

/* Which loop converts: a shortcut, or the general path. */
typedef enum flx_eop {
	FLX_EOP_COPY = 0, /* same type */
	FLX_EOP_F32_BF16,
	FLX_EOP_BF16_F32,
	FLX_EOP_F16_F32,
	FLX_EOP_F32_F64,
	FLX_EOP_F64_F32,
	FLX_EOP_GENERAL,
} flx_eop;

/* A conversion: flx_ecast_make() fills it (plain data: a batch carries it
 * to the device by value). */
typedef struct flx_ecast {
	flx_etype from, to;
	int op; /* flx_eop */
} flx_ecast;

/* ---- the exact intermediate ---- */

typedef enum flx_ecls {
	FLX_EC_ZERO,
	FLX_EC_FIN,
	FLX_EC_INF,
	FLX_EC_NAN
} flx_ecls;

/* FLX_EC_FIN: sig * 2^exp (sig != 0); FLX_EC_NAN: payload, left-aligned in
 * 64 bits (its leading bit is the quiet bit). */
typedef struct flx_enum {
	int c; /* flx_ecls */
	bool neg;
	uint64_t sig;
	int exp;
	uint64_t payload;
} flx_enum;

static inline FLX_HD int flx_e_bias(const flx_etype *f)
{
	return (1 << (f->ebits - 1)) - 1;
}

static inline FLX_HD flx_enum flx_e_decode_float(const flx_etype *f,
						 uint64_t bits)
{
	uint64_t emask = ((uint64_t)1 << f->ebits) - 1;
	uint64_t frac = bits & (((uint64_t)1 << f->mbits) - 1);
	uint64_t e = (bits >> f->mbits) & emask;
	flx_enum v;

	v.c = FLX_EC_ZERO;
	v.neg = (bits >> (f->ebits + f->mbits)) & 1;
	v.sig = 0;
	v.exp = 0;
	v.payload = 0;
	if (e == emask) {
		v.c = frac ? FLX_EC_NAN : FLX_EC_INF;
		v.payload = frac << (64 - f->mbits);
	} else if (e == 0) {
		v.c = frac ? FLX_EC_FIN : FLX_EC_ZERO;
		v.sig = frac;
		v.exp = 1 - flx_e_bias(f) - f->mbits;
	} else {
		v.c = FLX_EC_FIN;
		v.sig = frac | (uint64_t)1 << f->mbits;
		v.exp = (int)e - flx_e_bias(f) - f->mbits;
	}
	return v;
}

/* An integer or bool element (bits: zero-extended to 64 bits) as a
 * 64-bit two's complement value. */
static inline FLX_HD uint64_t flx_e_int_value(const flx_etype *t, uint64_t bits)
{
	if (t->kind == FLX_EK_BOOL)
		return bits != 0;
	if (t->sign && t->bits < 64 && (bits >> (t->bits - 1)) & 1)
		return bits | ~(uint64_t)0 << t->bits; /* sign-extend */
	return bits;
}

static inline FLX_HD flx_enum flx_e_decode_int(const flx_etype *t,
					       uint64_t bits)
{
	uint64_t x = flx_e_int_value(t, bits);
	flx_enum v;

	v.c = x ? FLX_EC_FIN : FLX_EC_ZERO;
	v.neg = t->sign && (int64_t)x < 0;
	v.sig = v.neg ? (uint64_t)0 - x : x;
	v.exp = 0;
	v.payload = 0;
	return v;
}

static inline FLX_HD int flx_e_top_bit(uint64_t x)
{
#ifdef __CUDA_ARCH__
	return 63 - __clzll((long long)x);
#else
	return 63 - __builtin_clzll(x);
#endif
}

/* sig >> shift rounded to nearest, ties to even (shift >= 1). */
static inline FLX_HD uint64_t flx_e_round_shift(uint64_t sig, int shift)
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

static inline FLX_HD uint64_t flx_e_encode_float(const flx_etype *f,
						 const flx_enum *v)
{
	uint64_t sign = (uint64_t)v->neg << (f->ebits + f->mbits);
	uint64_t inf = (((uint64_t)1 << f->ebits) - 1) << f->mbits;
	int bias = flx_e_bias(f), emin = 1 - bias, lead, q;
	uint64_t s, mag;

	switch (v->c) {
	case FLX_EC_ZERO:
		return sign;
	case FLX_EC_INF:
		return sign | inf;
	case FLX_EC_NAN:
		return sign | inf | (uint64_t)1 << (f->mbits - 1) |
		       v->payload >> (64 - f->mbits);
	default:
		break;
	}
	/* lead: exponent of the leading bit; q: exponent of the target's
	 * last significand bit there (fixed below the normal range) */
	lead = flx_e_top_bit(v->sig) + v->exp;
	if (lead > bias)
		return sign | inf;
	q = (lead >= emin ? lead : emin) - f->mbits;
	if (q <= v->exp)
		s = v->sig << (v->exp - q); /* exact: fits mbits + 1 bits */
	else
		s = flx_e_round_shift(v->sig, q - v->exp);
	/* s holds the implicit bit of a normal number: adding it to the
	 * exponent field one below carries a rounding that overflowed the
	 * significand into the exponent, up to infinity */
	mag = lead >= emin ? ((uint64_t)(lead + bias - 1) << f->mbits) + s : s;
	return sign | (mag >= inf ? inf : mag);
}

/* ---- elements ---- */

static inline FLX_HD uint64_t flx_e_load(const unsigned char *p, unsigned sz)
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

static inline FLX_HD void flx_e_store(unsigned char *p, unsigned sz, uint64_t v)
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

/* One element (its bits), through the intermediate; between integer
 * types, the value modulo 2^bits of b (flx_e_store() keeps the low
 * bits). */
static inline FLX_HD uint64_t flx_e_convert(const flx_etype *a,
					    const flx_etype *b, uint64_t bits)
{
	flx_enum v;

	if (a->kind != FLX_EK_FLOAT && b->kind != FLX_EK_FLOAT)
		return b->kind == FLX_EK_BOOL ? flx_e_int_value(a, bits) != 0
					      : flx_e_int_value(a, bits);
	v = a->kind == FLX_EK_FLOAT ? flx_e_decode_float(a, bits)
				    : flx_e_decode_int(a, bits);
	return flx_e_encode_float(b, &v);
}

static inline FLX_HD bool flx_e_is_nan32(uint32_t u)
{
	return (u & 0x7fffffffu) > 0x7f800000u;
}

/* The shortcuts, one element each (c: the conversion, for its NaNs). */
static inline FLX_HD void flx_e_f32_bf16(const flx_ecast *c, unsigned char *d,
					 const unsigned char *s)
{
	uint32_t u = (uint32_t)flx_e_load(s, 4);
	uint64_t r = flx_e_is_nan32(u) ? flx_e_convert(&c->from, &c->to, u)
				       : (u + 0x7fffu + ((u >> 16) & 1)) >> 16;

	flx_e_store(d, 2, r);
}

static inline FLX_HD void flx_e_bf16_f32(unsigned char *d,
					 const unsigned char *s)
{
	uint32_t u = (uint32_t)flx_e_load(s, 2) << 16;

	if (flx_e_is_nan32(u))
		u |= 0x00400000u; /* quiet */
	flx_e_store(d, 4, u);
}

/* f16 to f32: a normal number only moves its exponent; the rest (zeros,
 * subnormals, infinities, NaNs) take the general path. */
static inline FLX_HD void flx_e_f16_f32(const flx_ecast *c, unsigned char *d,
					const unsigned char *s)
{
	uint32_t h = (uint32_t)flx_e_load(s, 2), e = h & 0x7c00u;
	uint64_t r =
	    e && e != 0x7c00u
		? (h & 0x8000u) << 16 | (((h & 0x7fffu) << 13) + 0x38000000u)
		: flx_e_convert(&c->from, &c->to, h);

	flx_e_store(d, 4, r);
}

static inline FLX_HD void flx_e_f32_f64(const flx_ecast *c, unsigned char *d,
					const unsigned char *s)
{
	float x;
	double y;

	memcpy(&x, s, 4);
	if (x != x) {
		flx_e_store(d, 8,
			    flx_e_convert(&c->from, &c->to, flx_e_load(s, 4)));
		return;
	}
	y = x;
	memcpy(d, &y, 8);
}

static inline FLX_HD void flx_e_f64_f32(const flx_ecast *c, unsigned char *d,
					const unsigned char *s)
{
	double x;
	float y;

	memcpy(&x, s, 8);
	if (x != x) {
		flx_e_store(d, 4,
			    flx_e_convert(&c->from, &c->to, flx_e_load(s, 8)));
		return;
	}
	y = (float)x; /* rounded to nearest, ties to even */
	memcpy(d, &y, 4);
}

static inline FLX_HD void flx_e_general(const flx_ecast *c, unsigned char *d,
					const unsigned char *s)
{
	flx_e_store(
	    d, c->to.size,
	    flx_e_convert(&c->from, &c->to, flx_e_load(s, c->from.size)));
}

/* ---- conversions ---- */

/** The conversion from a into b (both FLX_EK_NONE-free; which pairs are
 * allowed is the caller's rule, reshard/cast.c). */
static inline flx_ecast flx_ecast_make(flx_etype a, flx_etype b)
{
	flx_ecast c;
	bool fa = a.kind == FLX_EK_FLOAT, fb = b.kind == FLX_EK_FLOAT;

	c.from = a;
	c.to = b;
	if (!memcmp(&a, &b, sizeof(a)))
		c.op = FLX_EOP_COPY;
	else if (fa && fb && a.size == 4 && b.size == 2 && b.ebits == 8)
		c.op = FLX_EOP_F32_BF16;
	else if (fa && fb && a.size == 2 && a.ebits == 8 && b.size == 4)
		c.op = FLX_EOP_BF16_F32;
	else if (fa && fb && a.size == 2 && a.ebits == 5 && b.size == 4)
		c.op = FLX_EOP_F16_F32;
	else if (fa && fb && a.size == 4 && b.size == 8)
		c.op = FLX_EOP_F32_F64;
	else if (fa && fb && a.size == 8 && b.size == 4)
		c.op = FLX_EOP_F64_F32;
	else
		c.op = FLX_EOP_GENERAL;
	return c;
}

/** Convert the element at s into d (c->to.size bytes). */
static inline FLX_HD void flx_ecast_one(const flx_ecast *c, unsigned char *d,
					const unsigned char *s)
{
	switch (c->op) {
	case FLX_EOP_COPY:
		memcpy(d, s, c->from.size);
		break;
	case FLX_EOP_F32_BF16:
		flx_e_f32_bf16(c, d, s);
		break;
	case FLX_EOP_BF16_F32:
		flx_e_bf16_f32(d, s);
		break;
	case FLX_EOP_F16_F32:
		flx_e_f16_f32(c, d, s);
		break;
	case FLX_EOP_F32_F64:
		flx_e_f32_f64(c, d, s);
		break;
	case FLX_EOP_F64_F32:
		flx_e_f64_f32(c, d, s);
		break;
	default:
		flx_e_general(c, d, s);
	}
}

/** Convert n packed elements at s into d (the buffers do not overlap):
 * flx_ecast_one() on each, the choice of shortcut made once. */
static inline void flx_ecast_n(const flx_ecast *c, unsigned char *d,
			       const unsigned char *s, size_t n)
{
	size_t i;

	switch (c->op) {
	case FLX_EOP_COPY:
		memcpy(d, s, n * c->from.size);
		break;
	case FLX_EOP_F32_BF16:
		for (i = 0; i < n; i++)
			flx_e_f32_bf16(c, d + 2 * i, s + 4 * i);
		break;
	case FLX_EOP_BF16_F32:
		for (i = 0; i < n; i++)
			flx_e_bf16_f32(d + 4 * i, s + 2 * i);
		break;
	case FLX_EOP_F16_F32:
		for (i = 0; i < n; i++)
			flx_e_f16_f32(c, d + 4 * i, s + 2 * i);
		break;
	case FLX_EOP_F32_F64:
		for (i = 0; i < n; i++)
			flx_e_f32_f64(c, d + 8 * i, s + 4 * i);
		break;
	case FLX_EOP_F64_F32:
		for (i = 0; i < n; i++)
			flx_e_f64_f32(c, d + 4 * i, s + 8 * i);
		break;
	default:
		for (i = 0; i < n; i++)
			flx_e_general(c, d + i * c->to.size,
				      s + i * c->from.size);
	}
}

#ifdef __cplusplus
}
#endif

#endif
