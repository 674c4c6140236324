/* SPDX-License-Identifier: MIT */
#ifndef FLX_RESOLVER_DTYPE_H
#define FLX_RESOLVER_DTYPE_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Element types.  One table maps each to every spelling we meet: the torch
 * attribute name (".metadata" and _rebuild_tensor_v3), the legacy typed
 * storage class (_rebuild_tensor_v2), the safetensors string and the numpy
 * descr used for .npy views (bf16 and fp8 have no numpy type: they are
 * exposed as raw bits, <u2 and |u1).
 */
typedef enum flx_dtype {
	FLX_DT_INVALID = 0,
	FLX_DT_F64,
	FLX_DT_F32,
	FLX_DT_F16,
	FLX_DT_BF16,
	FLX_DT_I64,
	FLX_DT_I32,
	FLX_DT_I16,
	FLX_DT_I8,
	FLX_DT_U8,
	FLX_DT_BOOL,
	FLX_DT_C64,
	FLX_DT_C128,
	FLX_DT_U16,
	FLX_DT_U32,
	FLX_DT_U64,
	FLX_DT_F8_E4M3FN,
	FLX_DT_F8_E5M2,
	FLX_DT_F8_E4M3FNUZ,
	FLX_DT_F8_E5M2FNUZ,
	FLX_DT_COUNT
} flx_dtype;

typedef struct flx_dtype_info {
	const char *torch;	 /* "float32" (torch.<name>) */
	const char *storage;	 /* "FloatStorage", NULL for v3-only dtypes */
	const char *safetensors; /* "F32", NULL when safetensors has none */
	const char *npy;	 /* "<f4" */
	unsigned size;		 /* bytes per element */
} flx_dtype_info;

/** Table entry for dt; the FLX_DT_INVALID entry has empty strings, size 0. */
const flx_dtype_info *flx_dtype_get(flx_dtype dt);

/** Lookup by torch attribute name ("bfloat16"); FLX_DT_INVALID if unknown. */
flx_dtype flx_dtype_from_torch(const char *name);

/** Lookup by legacy storage class ("BFloat16Storage"); FLX_DT_INVALID if
 * unknown. */
flx_dtype flx_dtype_from_storage(const char *name);

/** Lookup by torch attribute name or safetensors string ("C64");
 * FLX_DT_INVALID if neither. */
flx_dtype flx_dtype_from_name(const char *name);

static inline unsigned flx_dtype_size(flx_dtype dt)
{
	return flx_dtype_get(dt)->size;
}

static inline const char *flx_dtype_name(flx_dtype dt)
{
	return flx_dtype_get(dt)->torch;
}

#endif
