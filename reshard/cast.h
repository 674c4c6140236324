/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESHARD_CAST_H
#define FLX_RESHARD_CAST_H

/*
 * Element conversions of the transform stage's cast step (transform.h),
 * executed when a cast tensor is read.
 *
 * Supported pairs (flx_cast_supported()):
 *   - between the floating types f64, f32, f16 and bf16: exact when the
 *     target holds every value of the source, otherwise rounded once to
 *     nearest, ties to even (never through an intermediate type);
 *     overflow gives an infinity, underflow a (signed) zero or subnormal;
 *     infinities and zeros keep their sign; a NaN stays a NaN of the same
 *     sign, quiet, with the leading bits of its payload (what x86's
 *     conversion instructions do);
 *   - from an integer type or bool to a floating type: rounded once, ties
 *     to even;
 *   - between the integer types and bool: the value modulo 2^bits of the
 *     target (two's complement), as torch and numpy convert; to bool,
 *     non-zero gives 1, and a bool source reads any non-zero byte as 1;
 *   - any type to itself (a copy).
 * Not supported: floating to integer (the result of a NaN or an
 * out-of-range value is not defined), complex and fp8 types.
 *
 * Elements are little-endian, packed, as saved.  One element's conversion
 * is gpu/elemcast.h's code, which the CUDA slicer runs too (bit-identical
 * by construction).  Every function is reentrant and thread-safe.
 */

#include "dtype.h"
#include "elemcast.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Whether flx_cast() converts from into to. */
bool flx_cast_supported(flx_dtype from, flx_dtype to);

/** Whether every value of from converts into to exactly (and back): a
 * cast into to followed by another cast rounds once. */
bool flx_cast_exact(flx_dtype from, flx_dtype to);

/**
 * Convert n elements of type from at src into type to at dst (the two
 * buffers must not overlap).
 * @return 0, or -EINVAL when the pair is not supported (dst untouched).
 */
int flx_cast(flx_dtype to, void *dst, flx_dtype from, const void *src,
	     size_t n);

/** The conversion from into to, as elemcast.h executes it (a gather batch
 * carries it to a slicer, gpu/slice.h).
 * @return 0, or -EINVAL when the pair is not supported. */
int flx_cast_desc(flx_dtype from, flx_dtype to, flx_ecast *out);

/** Reads bytes [off, off + n) of the source elements into buf, all of
 * them: @return 0 or -errno. */
typedef int (*flx_cast_source_fn)(void *ctx, void *buf, size_t n, uint64_t off);

/**
 * Bytes [off, off + n) of a sequence of elements of type to whose source
 * is a sequence of the same number of elements of type from, read through
 * rd (whole source elements, a bounded batch at a time) and converted.
 * The caller has clipped n to the converted sequence.
 * @return 0, -EINVAL (pair not supported), -ENOMEM or rd's error.
 */
int flx_cast_read(flx_dtype to, flx_dtype from, flx_cast_source_fn rd,
		  void *ctx, void *buf, size_t n, uint64_t off);

/** Writes the k converted elements [e, e + k) of a sequence, whole, to
 * conv (k * size of the target type bytes): @return 0 or -errno. */
typedef int (*flx_cast_conv_fn)(void *ctx, void *conv, size_t k, uint64_t e);

/**
 * flx_cast_read() when the source reads and converts in one pass (a
 * device slicer gathering and converting, reshard/view.c): bytes
 * [off, off + n) of the converted sequence, through conv, in as few
 * calls as a bounded window (8 MiB) allows: one for a read request,
 * straight into buf when [off, off + n) holds whole elements.  The
 * caller has clipped n.
 * @return 0, -EINVAL (pair not supported), -ENOMEM or conv's error.
 */
int flx_cast_read_conv(flx_dtype to, flx_dtype from, flx_cast_conv_fn conv,
		       void *ctx, void *buf, size_t n, uint64_t off);

#endif
