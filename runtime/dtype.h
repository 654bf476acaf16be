// Element types and exact conversions between them.
//
// bf16, f16 and f8e4m3 are stored as raw bits. Conversions from f32 round to
// nearest, ties to even, as IEEE 754 (binary16) and the OCP 8-bit floating
// point spec (E4M3, "FN" variant: no infinities, one NaN pattern per sign,
// max finite 448) define them.
#ifndef TPR_DTYPE_H
#define TPR_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

// Values are part of the serialized program format: append, never reorder.
typedef enum tpr_dtype {
  TPR_F32 = 0,
  TPR_BF16 = 1,
  TPR_F16 = 2,
  TPR_F8E4M3 = 3,
  TPR_I32 = 4,
  TPR_I64 = 5,
  TPR_U8 = 6,
  TPR_DTYPE_COUNT
} tpr_dtype;

size_t tpr_dtype_size(tpr_dtype dt);      // bytes per element, 0 if invalid
const char *tpr_dtype_name(tpr_dtype dt); // "f32", "bf16", ... ; "?" if invalid
// Parses a name as printed by tpr_dtype_name (also "float32", "bfloat16", ...).
tpr_status tpr_dtype_parse(const char *name, tpr_dtype *out);
int tpr_dtype_is_float(tpr_dtype dt);
int tpr_dtype_valid(tpr_dtype dt);

// bfloat16: the top 16 bits of an f32. f32 -> bf16 rounds to nearest even;
// NaN stays NaN (quiet), infinities stay infinite, overflow rounds to inf.
uint16_t tpr_f32_to_bf16(float f);
float tpr_bf16_to_f32(uint16_t h);

// IEEE 754 binary16: f32 -> f16 rounds to nearest even, including into the
// subnormal range; |x| >= 65520 becomes inf; NaN stays NaN (quiet).
uint16_t tpr_f32_to_f16(float f);
float tpr_f16_to_f32(uint16_t h);

// OCP E4M3 (float8_e4m3fn): bias 7, subnormals, no inf, NaN = S.1111.111.
// f32 -> f8 rounds to nearest even; a magnitude that rounds above 448
// (|x| > 464; 464 itself is a tie that goes to the even 448) or is inf/NaN
// becomes NaN with the input's sign, matching the non-saturating conversion
// of the OCP spec and of torch.float8_e4m3fn.
uint8_t tpr_f32_to_f8e4m3(float f);
float tpr_f8e4m3_to_f32(uint8_t b);

// Converts n elements between any two dtypes (float -> int truncates toward
// zero as C casts do, saturates to the destination range, NaN -> 0; int ->
// int saturates; int -> float rounds once to nearest even). src and dst
// must not overlap unless they are the same pointer with the same dtype.
void tpr_dtype_convert(const void *src, tpr_dtype src_dt, void *dst, tpr_dtype dst_dt, size_t n);

// Element i of a buffer of dtype dt, as a double (read) / stored from a double.
double tpr_dtype_load(const void *base, tpr_dtype dt, size_t i);
void tpr_dtype_store(void *base, tpr_dtype dt, size_t i, double v);

#endif
