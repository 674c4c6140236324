/* SPDX-License-Identifier: MIT */
#include "dtype.h"

#include <string.h>

static const flx_dtype_info table[FLX_DT_COUNT] = {
    [FLX_DT_INVALID] = {"", NULL, NULL, "", 0},
    [FLX_DT_F64] = {"float64", "DoubleStorage", "F64", "<f8", 8},
    [FLX_DT_F32] = {"float32", "FloatStorage", "F32", "<f4", 4},
    [FLX_DT_F16] = {"float16", "HalfStorage", "F16", "<f2", 2},
    [FLX_DT_BF16] = {"bfloat16", "BFloat16Storage", "BF16", "<u2", 2},
    [FLX_DT_I64] = {"int64", "LongStorage", "I64", "<i8", 8},
    [FLX_DT_I32] = {"int32", "IntStorage", "I32", "<i4", 4},
    [FLX_DT_I16] = {"int16", "ShortStorage", "I16", "<i2", 2},
    [FLX_DT_I8] = {"int8", "CharStorage", "I8", "|i1", 1},
    [FLX_DT_U8] = {"uint8", "ByteStorage", "U8", "|u1", 1},
    [FLX_DT_BOOL] = {"bool", "BoolStorage", "BOOL", "|b1", 1},
    [FLX_DT_C64] = {"complex64", "ComplexFloatStorage", "C64", "<c8", 8},
    [FLX_DT_C128] = {"complex128", "ComplexDoubleStorage", NULL, "<c16", 16},
    [FLX_DT_U16] = {"uint16", NULL, "U16", "<u2", 2},
    [FLX_DT_U32] = {"uint32", NULL, "U32", "<u4", 4},
    [FLX_DT_U64] = {"uint64", NULL, "U64", "<u8", 8},
    [FLX_DT_F8_E4M3FN] = {"float8_e4m3fn", NULL, "F8_E4M3", "|u1", 1},
    [FLX_DT_F8_E5M2] = {"float8_e5m2", NULL, "F8_E5M2", "|u1", 1},
    [FLX_DT_F8_E4M3FNUZ] = {"float8_e4m3fnuz", NULL, "F8_E4M3FNUZ", "|u1", 1},
    [FLX_DT_F8_E5M2FNUZ] = {"float8_e5m2fnuz", NULL, "F8_E5M2FNUZ", "|u1", 1},
};

const flx_dtype_info *flx_dtype_get(flx_dtype dt)
{
	if ((unsigned)dt >= FLX_DT_COUNT)
		dt = FLX_DT_INVALID;
	return &table[dt];
}

flx_dtype flx_dtype_from_torch(const char *name)
{
	for (int i = 1; i < FLX_DT_COUNT; i++)
		if (name && strcmp(table[i].torch, name) == 0)
			return (flx_dtype)i;
	return FLX_DT_INVALID;
}

flx_dtype flx_dtype_from_storage(const char *name)
{
	for (int i = 1; i < FLX_DT_COUNT; i++)
		if (name && table[i].storage &&
		    strcmp(table[i].storage, name) == 0)
			return (flx_dtype)i;
	return FLX_DT_INVALID;
}

flx_dtype flx_dtype_from_name(const char *name)
{
	flx_dtype dt = flx_dtype_from_torch(name);

	for (int i = 1; i < FLX_DT_COUNT && dt == FLX_DT_INVALID; i++)
		if (name && table[i].safetensors &&
		    strcmp(table[i].safetensors, name) == 0)
			dt = (flx_dtype)i;
	return dt;
}
