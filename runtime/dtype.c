// Element types and exact conversions between them (see dtype.h).
//
// The narrow float formats are converted by integer manipulation of the f32
// bit pattern rather than with compiler half types or the FPU, so results do
// not depend on the compiler, the target, or the FPU's rounding/FTZ mode.
#include "dtype.h"

#include <string.h>

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);  // memcpy: type punning without aliasing UB
  return u;
}

static float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// x >> s rounded to nearest, ties to even (1 <= s <= 31). Applied to a whole
// exponent|mantissa pattern it is also right across binades: a mantissa that
// rounds up past all ones carries into the exponent, which is exactly the
// next representable value (and the inf/NaN pattern past the largest).
static uint32_t rne_shift(uint32_t x, int s) {
  uint32_t q = x >> s;
  uint32_t rem = x & ((UINT32_C(1) << s) - 1);
  uint32_t half = UINT32_C(1) << (s - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  return q;
}

// Magnitude of an f32 that lies below the target's normal range, as a count
// of the target's smallest subnormal step 2^-unit_log2 (rounded to nearest
// even). Non-normal f32 inputs are far below any target's subnormals, so
// their exponent field (0) sends them to zero with the shift guard below.
static uint32_t subnormal_steps(uint32_t a, int unit_log2) {
  int e = (int)(a >> 23);
  uint32_t mant = (a & 0x7fffff) | 0x800000;  // value = mant * 2^(e-150)
  int shift = 150 - unit_log2 - e;            // steps = mant >> shift
  if (shift > 24) return 0;                   // below half a step: +-0
  return rne_shift(mant, shift);
}

uint16_t tpr_f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  // Rounding a NaN could carry it into inf (or zero its payload); force the
  // quiet bit instead so it stays a NaN with its sign.
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x0040);
  // bf16 keeps the f32 exponent, so RNE of the bit pattern is the whole job;
  // values above the largest bf16 carry into the inf pattern.
  return (uint16_t)rne_shift(x, 16);
}

float tpr_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t tpr_f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t a = x & 0x7fffffff;
  if (a > 0x7f800000) return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));  // quiet NaN
  // 65520 = 65504 + half an ulp; that tie goes to the even neighbour, which
  // is the inf pattern (65504 has an all-ones mantissa). Also catches inf.
  if (a >= 0x477ff000) return (uint16_t)(sign | 0x7c00);
  // Normal f16 (>= 2^-14): rebias the exponent 127 -> 15 and round.
  if (a >= 0x38800000) return (uint16_t)(sign | rne_shift(a - (UINT32_C(112) << 23), 13));
  // Subnormal f16: multiples of 2^-24. A result of 0x400 is the smallest
  // normal, which is the right encoding when rounding crosses up into it.
  return (uint16_t)(sign | subnormal_steps(a, 24));
}

float tpr_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000 | (mant << 13));  // inf/NaN
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);  // signed zero
    // Subnormal: normalise; every f16 subnormal is a normal f32.
    exp = 113;  // 127 - 14
    while (!(mant & 0x400)) {
      mant <<= 1;
      exp--;
    }
    return f32_from_bits(sign | (exp << 23) | ((mant & 0x3ff) << 13));
  }
  return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

uint8_t tpr_f32_to_f8e4m3(float f) {
  uint32_t x = f32_bits(f);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80);
  uint32_t a = x & 0x7fffffff;
  // 464 is the midpoint of 448 (S.1111.110) and the pattern S.1111.111,
  // which would be 480 but is NaN. RNE sends the tie to the even 448 and
  // anything above it to the NaN pattern; inf and NaN inputs land here too.
  // This is torch's c10::Float8_e4m3fn (NaN for >= 480 and by carry above 464).
  if (a > 0x43e80000) return (uint8_t)(sign | 0x7f);
  // Normal f8 (>= 2^-6): rebias 127 -> 7 and round; at most 0x7e here.
  if (a >= 0x3c800000) return (uint8_t)(sign | rne_shift(a - (UINT32_C(120) << 23), 20));
  // Subnormal f8: multiples of 2^-9 (0x08 is the smallest normal, as above).
  return (uint8_t)(sign | subnormal_steps(a, 9));
}

float tpr_f8e4m3_to_f32(uint8_t b) {
  uint32_t sign = (uint32_t)(b & 0x80) << 24;
  uint32_t exp = (b >> 3) & 0xf;
  uint32_t mant = b & 7;
  if (exp == 0xf && mant == 7) return f32_from_bits(sign | 0x7fc00000);  // the only NaN
  if (exp == 0) {
    // Subnormal: mant * 2^-9, exact in f32 and far from f32's own subnormals.
    float v = (float)mant * 0x1p-9f;
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 120) << 23) | (mant << 20));
}

// ---------------------------------------------------------------------------
// dtype table

static const struct {
  const char *name, *alias;
  size_t size;
  int is_float;
} dtype_info[TPR_DTYPE_COUNT] = {
    [TPR_F32] = {"f32", "float32", 4, 1},      [TPR_BF16] = {"bf16", "bfloat16", 2, 1},
    [TPR_F16] = {"f16", "float16", 2, 1},      [TPR_F8E4M3] = {"f8e4m3", "float8_e4m3fn", 1, 1},
    [TPR_I32] = {"i32", "int32", 4, 0},        [TPR_I64] = {"i64", "int64", 8, 0},
    [TPR_U8] = {"u8", "uint8", 1, 0},
};

int tpr_dtype_valid(tpr_dtype dt) { return (unsigned)dt < TPR_DTYPE_COUNT; }
size_t tpr_dtype_size(tpr_dtype dt) { return tpr_dtype_valid(dt) ? dtype_info[dt].size : 0; }
const char *tpr_dtype_name(tpr_dtype dt) { return tpr_dtype_valid(dt) ? dtype_info[dt].name : "?"; }
int tpr_dtype_is_float(tpr_dtype dt) { return tpr_dtype_valid(dt) && dtype_info[dt].is_float; }

tpr_status tpr_dtype_parse(const char *name, tpr_dtype *out) {
  if (!name || !out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_dtype_parse: NULL argument");
  for (int i = 0; i < TPR_DTYPE_COUNT; i++) {
    if (!strcmp(name, dtype_info[i].name) || !strcmp(name, dtype_info[i].alias)) {
      *out = (tpr_dtype)i;
      return TPR_OK;
    }
  }
  return TPR_FAIL(TPR_ERR_INVALID_ARG,
                  "unknown dtype '%s' (expected f32, bf16, f16, f8e4m3, i32, i64 or u8)", name);
}

// ---------------------------------------------------------------------------
// Generic conversion.
//
// Going through f32 before a narrow float would round twice (e.g. an i32 or a
// double first rounded to f32 can land exactly on a bf16 midpoint and then
// tie the wrong way). Rounding to f32 with round-to-odd instead keeps the
// information that decides the second rounding: RNO at >= p+2 bits followed
// by RNE to p bits equals a single RNE (Boldo & Melquiond, 2008), and f32's
// 24 bits exceed bf16/f16/f8's 8/11/4 by far, in every binade they share.

// Round-to-odd of a double to f32: the truncation, with the last bit forced
// to 1 if anything was lost. (float)v is one of the two neighbours of v; they
// are adjacent bit patterns, so exactly one of them is odd.
static float f64_to_f32_odd(double v) {
  float f = (float)v;
  if (v != v || (double)f == v) return f;
  uint32_t b = f32_bits(f);
  if (b & 1) return f;
  int v_bigger = v > 0 ? v > (double)f : v < (double)f;  // |v| > |f| (f = v's sign or 0)
  return f32_from_bits(v_bigger ? b + 1 : b - 1);
}

static float i64_to_f32_odd(int64_t v) {
  uint64_t m = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  int s = 0;
  while ((m >> s) >= (UINT64_C(1) << 24)) s++;  // keep 24 significant bits
  uint64_t q = m >> s;
  if (s && (m & ((UINT64_C(1) << s) - 1))) q |= 1;
  float f = (float)q * (float)(UINT64_C(1) << s);  // exact: q < 2^24, power-of-two scale
  return v < 0 ? -f : f;
}

// Truncates toward zero and saturates to int64; NaN -> 0. The range test is
// done in double before the cast, since casting an out-of-range double to an
// integer is undefined behaviour in C. store_int then saturates to the
// destination (truncation and clamping to integer bounds commute).
static int64_t f64_to_i64_sat(double v) {
  if (v != v) return 0;
  if (v >= 0x1p63) return INT64_MAX;
  if (v <= -0x1p63) return INT64_MIN;
  return (int64_t)v;  // C cast truncates toward zero
}

static void store_int(void *base, tpr_dtype dt, size_t i, int64_t v) {
  switch (dt) {
    case TPR_I32:
      ((int32_t *)base)[i] = (int32_t)(v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v);
      break;
    case TPR_I64: ((int64_t *)base)[i] = v; break;
    case TPR_U8: ((uint8_t *)base)[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); break;
    default: break;
  }
}

// Stores f32 `f` (already rounded to odd if it came from something wider) to
// a narrow float; f32 itself is stored by the callers as they need.
static void store_narrow(void *base, tpr_dtype dt, size_t i, float f) {
  switch (dt) {
    case TPR_BF16: ((uint16_t *)base)[i] = tpr_f32_to_bf16(f); break;
    case TPR_F16: ((uint16_t *)base)[i] = tpr_f32_to_f16(f); break;
    case TPR_F8E4M3: ((uint8_t *)base)[i] = tpr_f32_to_f8e4m3(f); break;
    default: break;
  }
}

// Every float dtype decodes exactly to f32.
static float load_f32(const void *base, tpr_dtype dt, size_t i) {
  switch (dt) {
    case TPR_F32: return ((const float *)base)[i];
    case TPR_BF16: return tpr_bf16_to_f32(((const uint16_t *)base)[i]);
    case TPR_F16: return tpr_f16_to_f32(((const uint16_t *)base)[i]);
    case TPR_F8E4M3: return tpr_f8e4m3_to_f32(((const uint8_t *)base)[i]);
    default: return 0;
  }
}

static int64_t load_int(const void *base, tpr_dtype dt, size_t i) {
  switch (dt) {
    case TPR_I32: return ((const int32_t *)base)[i];
    case TPR_I64: return ((const int64_t *)base)[i];
    case TPR_U8: return ((const uint8_t *)base)[i];
    default: return 0;
  }
}

void tpr_dtype_convert(const void *src, tpr_dtype src_dt, void *dst, tpr_dtype dst_dt, size_t n) {
  if (!tpr_dtype_valid(src_dt) || !tpr_dtype_valid(dst_dt) || n == 0) return;
  if (src_dt == dst_dt) {
    if (src != dst) memmove(dst, src, n * dtype_info[src_dt].size);
    return;
  }
  int src_float = dtype_info[src_dt].is_float, dst_float = dtype_info[dst_dt].is_float;
  for (size_t i = 0; i < n; i++) {
    if (src_float) {
      // An f32 holds every source value exactly, so one rounding happens.
      float f = load_f32(src, src_dt, i);
      if (dst_dt == TPR_F32) ((float *)dst)[i] = f;
      else if (dst_float) store_narrow(dst, dst_dt, i, f);
      else store_int(dst, dst_dt, i, f64_to_i64_sat(f));
    } else {
      int64_t v = load_int(src, src_dt, i);
      if (dst_dt == TPR_F32) ((float *)dst)[i] = (float)v;  // C: round to nearest even
      else if (dst_float) store_narrow(dst, dst_dt, i, i64_to_f32_odd(v));
      else store_int(dst, dst_dt, i, v);
    }
  }
}

double tpr_dtype_load(const void *base, tpr_dtype dt, size_t i) {
  if (!tpr_dtype_valid(dt)) return 0;
  if (dtype_info[dt].is_float) return load_f32(base, dt, i);
  return (double)load_int(base, dt, i);
}

void tpr_dtype_store(void *base, tpr_dtype dt, size_t i, double v) {
  if (!tpr_dtype_valid(dt)) return;
  if (dt == TPR_F32) ((float *)base)[i] = (float)v;
  else if (dtype_info[dt].is_float) store_narrow(base, dt, i, f64_to_f32_odd(v));
  else store_int(base, dt, i, f64_to_i64_sat(v));
}
