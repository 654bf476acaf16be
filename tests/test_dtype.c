// Exactness of the dtype conversions against references that share no code
// with runtime/dtype.c:
//   f16    GCC's _Float16 conversions (libgcc __truncsfhf2/__extendhfsf2, IEEE RNE);
//   bf16   a double-precision nearest-even search written here;
//   f8e4m3 an ldexp decoder and a "nearest of all codes, ties to even code"
//          enumeration written here, plus a transcription of torch's
//          c10::detail::fp8e4m3fn_from_fp32_value (c10/util/Float8_e4m3fn.h).
// Each check counts mismatches and prints the first few, so one failing run
// shows the pattern instead of only the first bad value.
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/dtype.h"

#if !defined(__FLT16_MAX__)
#error "test_dtype needs GCC/Clang _Float16 as its independent f16 reference"
#endif

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static long n_fail;
static void mismatch(const char *what, double x, unsigned got, unsigned want) {
  if (n_fail++ < 8)
    printf("  %s: x=%a (%.9g): got 0x%x want 0x%x\n", what, x, x, got, want);
}
#define EXPECT_NO_MISMATCH() assert_int_equal(n_fail, 0)

// ---------------------------------------------------------------------------
// f16

static uint16_t ref_f16(float f) {
  _Float16 h = (_Float16)f;
  uint16_t b;
  memcpy(&b, &h, 2);
  return b;
}
static float ref_f16_dec(uint16_t b) {
  _Float16 h;
  memcpy(&h, &b, 2);
  return (float)h;
}
static int f16_isnan(uint16_t b) { return (b & 0x7c00) == 0x7c00 && (b & 0x3ff); }

// Bit-exact against _Float16; a NaN only has to be a NaN of the same sign.
static void check_f16(float x) {
  uint16_t got = tpr_f32_to_f16(x), want = ref_f16(x);
  int ok = f16_isnan(want) ? f16_isnan(got) && (got & 0x8000) == (want & 0x8000) : got == want;
  if (!ok) mismatch("f32->f16", x, got, want);
}

static void test_f16_decode_all(void **state) {
  n_fail = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float got = tpr_f16_to_f32((uint16_t)h), want = ref_f16_dec((uint16_t)h);
    int ok = isnan(want) ? isnan(got) && signbit(got) == signbit(want) : bits_of(got) == bits_of(want);
    if (!ok) mismatch("f16->f32", h, bits_of(got), bits_of(want));
  }
  EXPECT_NO_MISMATCH();
}

static void test_f16_roundtrip_all(void **state) {
  n_fail = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    uint16_t back = tpr_f32_to_f16(tpr_f16_to_f32((uint16_t)h));
    int ok = f16_isnan((uint16_t)h) ? f16_isnan(back) && (back & 0x8000) == (h & 0x8000) : back == h;
    if (!ok) mismatch("f16 round trip", h, back, h);
  }
  EXPECT_NO_MISMATCH();
}

// Every tie between adjacent f16 values (including 65504|65536 -> inf and
// the subnormal ones), and the floats just either side of it, both signs.
static void test_f16_midpoints(void **state) {
  n_fail = 0;
  for (uint32_t h = 0; h < 0x7c00; h++) {
    double lo = ref_f16_dec((uint16_t)h);
    double hi = h + 1 == 0x7c00 ? 65536.0 : ref_f16_dec((uint16_t)(h + 1));
    float mid = (float)((lo + hi) / 2);  // 12 significant bits: exact
    assert_true((double)mid == (lo + hi) / 2);
    uint32_t even = (h & 1) ? h + 1 : h;
    for (int s = 0; s < 2; s++) {
      float sg = s ? -1.0f : 1.0f;
      uint16_t sb = s ? 0x8000 : 0;
      float below = nextafterf(mid, 0), above = nextafterf(mid, INFINITY);
      check_f16(sg * mid);
      check_f16(sg * below);
      check_f16(sg * above);
      // The same facts stated without _Float16: ties to the even code.
      if (tpr_f32_to_f16(sg * mid) != (sb | even)) mismatch("f16 tie", sg * mid, tpr_f32_to_f16(sg * mid), sb | even);
      if (tpr_f32_to_f16(sg * below) != (sb | h)) mismatch("f16 below tie", sg * below, tpr_f32_to_f16(sg * below), sb | h);
      if (tpr_f32_to_f16(sg * above) != (sb | (h + 1)))
        mismatch("f16 above tie", sg * above, tpr_f32_to_f16(sg * above), sb | (h + 1));
    }
  }
  EXPECT_NO_MISMATCH();
}

static void test_f16_boundaries(void **state) {
  static const struct { float x; uint16_t want; } cases[] = {
      {65504.0f, 0x7bff}, {65519.99f, 0x7bff}, {65520.0f, 0x7c00}, {-65520.0f, 0xfc00},
      {65536.0f, 0x7c00}, {FLT_MAX, 0x7c00},   {INFINITY, 0x7c00}, {-INFINITY, 0xfc00},
      {1.0f, 0x3c00},     {-0.0f, 0x8000},     {0.0f, 0x0000},
      {0x1p-14f, 0x0400},                      // smallest normal
      {0x1.ff8p-15f, 0x03ff},                  // largest subnormal 1023 * 2^-24
      {0x1.ffcp-15f, 0x0400},                  // tie 1023.5 * 2^-24 -> even 0x400
      {0x1.ffap-15f, 0x03ff},
      {0x1p-24f, 0x0001},   {-0x1p-24f, 0x8001}, // smallest subnormal
      {0x1p-25f, 0x0000},                      // tie between 0 and 2^-24 -> 0
      {-0x1p-25f, 0x8000},  {0x1.000002p-25f, 0x0001},
      {0x1.8p-24f, 0x0002}, {0x1.4p-23f, 0x0002}, // ties 1.5 -> 2, 2.5 -> 2
      {FLT_MIN, 0x0000},    {-FLT_TRUE_MIN, 0x8000},
  };
  n_fail = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    check_f16(cases[i].x);
    if (tpr_f32_to_f16(cases[i].x) != cases[i].want)
      mismatch("f16 boundary", cases[i].x, tpr_f32_to_f16(cases[i].x), cases[i].want);
  }
  check_f16(nextafterf(65520.0f, 0));
  assert_int_equal(tpr_f32_to_f16(nextafterf(65520.0f, 0)), 0x7bff);
  uint16_t qn = tpr_f32_to_f16(NAN), qn2 = tpr_f32_to_f16(float_of(0xff800001));  // sNaN
  assert_true(f16_isnan(qn) && f16_isnan(qn2) && (qn2 & 0x8000) && (qn2 & 0x0200));
  EXPECT_NO_MISMATCH();
}

static void test_f16_random(void **state) {
  n_fail = 0;
  for (int i = 0; i < 2000000; i++) check_f16(float_of((uint32_t)tt_next_u64()));
  // Half as many again with the exponent where f16 lives (f32 exponent
  // fields 100..145: below half the smallest subnormal up past overflow).
  for (int i = 0; i < 1000000; i++) {
    uint32_t r = (uint32_t)tt_next_u64();
    uint32_t e = 100 + (uint32_t)(tt_next_u64() % 46);
    check_f16(float_of((r & 0x807fffff) | (e << 23)));
  }
  EXPECT_NO_MISMATCH();
}

// ---------------------------------------------------------------------------
// bf16

// Value of a bf16 code with an unbounded exponent: 0x7f80 reads as 2^128, the
// next step after the largest finite value, which is where overflow rounds.
static double ref_bf16_val(uint32_t c) {
  int e = (c >> 7) & 0xff, m = c & 0x7f;
  double v = e ? ldexp(128 + m, e - 134) : ldexp(m, -133);
  return (c & 0x8000) ? -v : v;
}

// Nearest bf16 to a finite double, ties to the even code, by comparing the
// distances to the value truncated toward zero and the next one up. The
// differences are exact in double (Sterbenz: the candidates are within a
// factor of two of x), so the comparison, and the tie, are exact.
static uint16_t ref_bf16(double x) {
  uint32_t sign = signbit(x) ? 0x8000 : 0;
  double ax = fabs(x);
  if (ax >= 0x1p128) return (uint16_t)(sign | 0x7f80);
  uint32_t lo;
  if (ax < 0x1p-126) {
    lo = (uint32_t)floor(ax * 0x1p133);
  } else {
    int ex;
    frexp(ax, &ex);  // ax in [2^(ex-1), 2^ex)
    lo = (uint32_t)(ex + 126) << 7 | (uint32_t)floor((ldexp(ax, 1 - ex) - 1) * 128);
  }
  double dl = ax - ref_bf16_val(lo), du = ref_bf16_val(lo + 1) - ax;
  uint32_t c = dl < du ? lo : du < dl ? lo + 1 : (lo & 1) ? lo + 1 : lo;
  return (uint16_t)(sign | c);
}

static void check_bf16(float x) {
  uint16_t got = tpr_f32_to_bf16(x);
  if (isnan(x)) {
    if (!isnan(tpr_bf16_to_f32(got)) || (got & 0x8000) != ((bits_of(x) >> 16) & 0x8000))
      mismatch("f32->bf16 NaN", x, got, 0x7fc0);
    return;
  }
  uint16_t want = ref_bf16(x);
  if (got != want) mismatch("f32->bf16", x, got, want);
}

static void test_bf16_decode_all(void **state) {
  n_fail = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float got = tpr_bf16_to_f32((uint16_t)h);
    if (bits_of(got) != h << 16) mismatch("bf16->f32 bits", h, bits_of(got), h << 16);
    int e = (h >> 7) & 0xff;
    if (e == 0xff) continue;
    if ((double)got != ref_bf16_val(h)) mismatch("bf16->f32 value", h, bits_of(got), h << 16);
  }
  EXPECT_NO_MISMATCH();
}

static void test_bf16_midpoints(void **state) {
  n_fail = 0;
  for (uint32_t c = 0; c < 0x7f80; c++) {  // every finite code, subnormals included
    float mid = float_of(c << 16 | 0x8000);  // halfway to code c+1 (or to inf)
    assert_true((double)mid == (ref_bf16_val(c) + ref_bf16_val(c + 1)) / 2);
    uint32_t even = (c & 1) ? c + 1 : c;
    for (int s = 0; s < 2; s++) {
      float sg = s ? -1.0f : 1.0f;
      uint16_t sb = s ? 0x8000 : 0;
      check_bf16(sg * mid);
      check_bf16(sg * nextafterf(mid, 0));
      check_bf16(sg * nextafterf(mid, INFINITY));
      if (tpr_f32_to_bf16(sg * mid) != (sb | even)) mismatch("bf16 tie", sg * mid, tpr_f32_to_bf16(sg * mid), sb | even);
    }
  }
  EXPECT_NO_MISMATCH();
}

static void test_bf16_specials_random(void **state) {
  n_fail = 0;
  assert_int_equal(tpr_f32_to_bf16(INFINITY), 0x7f80);
  assert_int_equal(tpr_f32_to_bf16(-INFINITY), 0xff80);
  assert_int_equal(tpr_f32_to_bf16(FLT_MAX), 0x7f80);           // above max + half ulp
  assert_int_equal(tpr_f32_to_bf16(float_of(0x7f7f7fff)), 0x7f7f);
  assert_int_equal(tpr_f32_to_bf16(float_of(0x7f7f8000)), 0x7f80);  // tie, 0x7f7f odd
  assert_int_equal(tpr_f32_to_bf16(-0.0f), 0x8000);
  assert_int_equal(tpr_f32_to_bf16(1.0f), 0x3f80);
  // NaNs whose payload sits only in the dropped bits must not become inf.
  static const uint32_t nans[] = {0x7f800001, 0xff800001, 0x7fc00000, 0x7fffffff, 0xffffffff, 0x7f80ffff};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) check_bf16(float_of(nans[i]));
  for (int i = 0; i < 2000000; i++) check_bf16(float_of((uint32_t)tt_next_u64()));
  EXPECT_NO_MISMATCH();
}

// ---------------------------------------------------------------------------
// f8e4m3 (float8_e4m3fn)

static double ref_f8_val(uint32_t b) {  // b in 0..0xff; 0x7f/0xff read as 480
  int e = (b >> 3) & 0xf, m = b & 7;
  double v = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
  return (b & 0x80) ? -v : v;
}
static float ref_f8_dec(uint8_t b) {
  if ((b & 0x7f) == 0x7f) return (b & 0x80) ? -NAN : NAN;
  return (float)ref_f8_val(b);
}

// Nearest of the 127 non-negative finite codes, plus the pattern 0x7f at the
// next step (480) that RNE reaches before range is considered: landing there
// (or beyond, or on inf/NaN) gives NaN. Ties go to the even code.
static uint8_t ref_f8(double x) {
  uint8_t sign = signbit(x) ? 0x80 : 0;
  double ax = fabs(x);
  // At or past 480 the nearest candidate is 480 itself; say so directly, as
  // |x - v| for huge x would lose the differences between candidates.
  if (isnan(x) || ax >= 480) return sign | 0x7f;
  uint32_t best = 0;
  double best_d = INFINITY;
  for (uint32_t c = 0; c <= 0x7f; c++) {
    double d = fabs(ax - ref_f8_val(c));
    if (d < best_d || (d == best_d && !(c & 1))) best = c, best_d = d;
  }
  return (uint8_t)(sign | best);
}

// torch c10::detail::fp8e4m3fn_from_fp32_value, transcribed.
static uint8_t torch_f8(float f) {
  const uint32_t fp8_max = UINT32_C(1087) << 20;  // 480.0f
  const uint32_t denorm_mask = UINT32_C(141) << 23;
  uint32_t f_bits = bits_of(f);
  uint8_t result;
  const uint32_t sign = f_bits & UINT32_C(0x80000000);
  f_bits ^= sign;
  if (f_bits >= fp8_max) {
    result = 0x7f;
  } else if (f_bits < (UINT32_C(121) << 23)) {
    f_bits = bits_of(float_of(f_bits) + float_of(denorm_mask));
    result = (uint8_t)(f_bits - denorm_mask);
  } else {
    uint8_t mant_odd = (f_bits >> 20) & 1;
    f_bits += ((uint32_t)(7 - 127) << 23) + 0x7FFFF;
    f_bits += mant_odd;
    result = (uint8_t)(f_bits >> 20);
  }
  return result | (uint8_t)(sign >> 24);
}

static void check_f8(float x) {
  uint8_t got = tpr_f32_to_f8e4m3(x), want = ref_f8(x), torch = torch_f8(x);
  if (got != want) mismatch("f32->f8 vs enumeration", x, got, want);
  if (got != torch) mismatch("f32->f8 vs torch", x, got, torch);
}

static void test_f8_decode_all(void **state) {
  n_fail = 0;
  for (uint32_t b = 0; b < 256; b++) {
    float got = tpr_f8e4m3_to_f32((uint8_t)b), want = ref_f8_dec((uint8_t)b);
    int ok = isnan(want) ? isnan(got) && signbit(got) == signbit(want) : bits_of(got) == bits_of(want);
    if (!ok) mismatch("f8->f32", b, bits_of(got), bits_of(want));
    if (tpr_f32_to_f8e4m3(got) != b) mismatch("f8 round trip", b, tpr_f32_to_f8e4m3(got), b);
  }
  assert_true(tpr_f8e4m3_to_f32(0x7e) == 448.0f && tpr_f8e4m3_to_f32(0x01) == 0x1p-9f);
  assert_true(tpr_f8e4m3_to_f32(0x08) == 0x1p-6f && tpr_f8e4m3_to_f32(0x80) == 0 && signbit(tpr_f8e4m3_to_f32(0x80)));
  EXPECT_NO_MISMATCH();
}

static void test_f8_midpoints_subnormals(void **state) {
  n_fail = 0;
  for (uint32_t c = 0; c < 0x7f; c++) {
    float mid = (float)((ref_f8_val(c) + ref_f8_val(c + 1)) / 2);  // exact
    for (int s = 0; s < 2; s++) {
      float sg = s ? -1.0f : 1.0f;
      check_f8(sg * mid);
      check_f8(sg * nextafterf(mid, 0));
      check_f8(sg * nextafterf(mid, INFINITY));
    }
  }
  // Subnormal range: every quarter step and random values.
  for (int k = 0; k <= 64; k++) check_f8(k * 0x1p-11f), check_f8(-k * 0x1p-11f);
  for (int i = 0; i < 200000; i++) check_f8((float)tt_uniform(-0x1p-5, 0x1p-5));
  check_f8(FLT_TRUE_MIN);
  check_f8(-FLT_MIN);
  EXPECT_NO_MISMATCH();
}

static void test_f8_nan_boundary(void **state) {
  static const struct { float x; uint8_t want; } cases[] = {
      {448.0f, 0x7e},    {463.99f, 0x7e}, {464.0f, 0x7e},  // 464: tie, 448 is the even code
      {464.00003f, 0x7f}, {479.99f, 0x7f}, {480.0f, 0x7f}, {1e9f, 0x7f},
      {INFINITY, 0x7f},  {-INFINITY, 0xff}, {NAN, 0x7f},   {-NAN, 0xff},
      {-464.0f, 0xfe},   {-465.0f, 0xff},   {416.0f, 0x7d}, {431.99f, 0x7d},
      {432.0f, 0x7e},    {-432.0f, 0xfe},   // 432: tie between 416 (odd) and 448
      {0x1p-10f, 0x00},  {0x1.000002p-10f, 0x01}, {-0x1p-10f, 0x80}, {0x1.8p-9f, 0x02},
      {0x1.ep-7f, 0x08},  // 7.5 * 2^-9: tie between 0x07 and 0x08 (smallest normal)
  };
  n_fail = 0;
  assert_true(464.00003f > 464.0f && 463.99f < 464.0f);
  check_f8(nextafterf(464.0f, 0)), check_f8(nextafterf(464.0f, INFINITY));
  assert_int_equal(tpr_f32_to_f8e4m3(nextafterf(464.0f, INFINITY)), 0x7f);
  assert_int_equal(tpr_f32_to_f8e4m3(nextafterf(480.0f, 0)), 0x7f);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    check_f8(cases[i].x);
    if (tpr_f32_to_f8e4m3(cases[i].x) != cases[i].want)
      mismatch("f8 boundary", cases[i].x, tpr_f32_to_f8e4m3(cases[i].x), cases[i].want);
  }
  EXPECT_NO_MISMATCH();
}

static void test_f8_random(void **state) {
  n_fail = 0;
  for (int i = 0; i < 1000000; i++) check_f8((float)tt_uniform(-500, 500));
  for (int i = 0; i < 1000000; i++) check_f8(float_of((uint32_t)tt_next_u64()));
  EXPECT_NO_MISMATCH();
}

// ---------------------------------------------------------------------------
// tpr_dtype_convert / load / store

static const tpr_dtype all_dt[] = {TPR_F32, TPR_BF16, TPR_F16, TPR_F8E4M3, TPR_I32, TPR_I64, TPR_U8};
enum { N_DT = 7 };

static void test_convert_float_roundtrips(void **state) {
  n_fail = 0;
  static uint16_t h[65536], back[65536];
  static float f[65536];
  static uint8_t b8[256], b8back[256];
  for (int i = 0; i < 256; i++) b8[i] = (uint8_t)i;
  // f8 -> any wider float -> f8 is the identity on all 256 codes, NaNs included.
  for (int d = 0; d < 3; d++) {
    tpr_dtype mid = all_dt[d];
    tpr_dtype_convert(b8, TPR_F8E4M3, f, mid, 256);
    tpr_dtype_convert(f, mid, b8back, TPR_F8E4M3, 256);
    for (int i = 0; i < 256; i++)
      if (b8back[i] != i) mismatch(tpr_dtype_name(mid), i, b8back[i], i);
  }
  // f16 and bf16 -> f32 -> back: identity for every non-NaN code.
  for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
  for (int d = 1; d <= 2; d++) {
    tpr_dtype_convert(h, all_dt[d], f, TPR_F32, 65536);
    tpr_dtype_convert(f, TPR_F32, back, all_dt[d], 65536);
    for (int i = 0; i < 65536; i++) {
      int nan_code = (d == 1 ? (i & 0x7f80) == 0x7f80 : (i & 0x7c00) == 0x7c00) && (i & (d == 1 ? 0x7f : 0x3ff));
      if (!nan_code && back[i] != i) mismatch(tpr_dtype_name(all_dt[d]), i, back[i], i);
    }
  }
  // Narrow -> narrow rounds once, from the exact value.
  tpr_dtype_convert(h, TPR_BF16, back, TPR_F16, 65536);
  for (int i = 0; i < 65536; i++) {
    float x = tpr_bf16_to_f32((uint16_t)i);
    if (!isnan(x) && back[i] != ref_f16(x)) mismatch("bf16->f16", x, back[i], ref_f16(x));
  }
  static uint8_t b8h[65536];
  tpr_dtype_convert(h, TPR_F16, b8h, TPR_F8E4M3, 65536);
  for (int i = 0; i < 65536; i++) {
    float x = ref_f16_dec((uint16_t)i);
    if (!isnan(x) && b8h[i] != ref_f8(x)) mismatch("f16->f8", x, b8h[i], ref_f8(x));
  }
  EXPECT_NO_MISMATCH();
}

static void test_convert_int_saturation(void **state) {
  int32_t i32;
  int64_t i64;
  uint8_t u8;
  float f;
  f = 3e9f, tpr_dtype_convert(&f, TPR_F32, &i32, TPR_I32, 1), assert_int_equal(i32, INT32_MAX);
  f = -3e9f, tpr_dtype_convert(&f, TPR_F32, &i32, TPR_I32, 1), assert_int_equal(i32, INT32_MIN);
  f = -1.0f, tpr_dtype_convert(&f, TPR_F32, &u8, TPR_U8, 1), assert_int_equal(u8, 0);
  f = 300.0f, tpr_dtype_convert(&f, TPR_F32, &u8, TPR_U8, 1), assert_int_equal(u8, 255);
  f = 255.9f, tpr_dtype_convert(&f, TPR_F32, &u8, TPR_U8, 1), assert_int_equal(u8, 255);
  f = -2.7f, tpr_dtype_convert(&f, TPR_F32, &i32, TPR_I32, 1), assert_int_equal(i32, -2);
  f = 2.7f, tpr_dtype_convert(&f, TPR_F32, &i64, TPR_I64, 1), assert_int_equal(i64, 2);
  f = 1e30f, tpr_dtype_convert(&f, TPR_F32, &i64, TPR_I64, 1), assert_true(i64 == INT64_MAX);
  f = -INFINITY, tpr_dtype_convert(&f, TPR_F32, &i64, TPR_I64, 1), assert_true(i64 == INT64_MIN);
  f = -0x1p63f, tpr_dtype_convert(&f, TPR_F32, &i64, TPR_I64, 1), assert_true(i64 == INT64_MIN);
  // NaN -> 0 from every float dtype to every int dtype.
  const float f32nan = NAN;
  const uint16_t bfnan = 0xffc0, hnan = 0x7e00;
  const uint8_t f8nan = 0xff;
  const void *nan_src[4] = {&f32nan, &bfnan, &hnan, &f8nan};
  for (int s = 0; s < 4; s++)
    for (int d = 4; d < N_DT; d++) {
      int64_t out = 77;
      tpr_dtype_convert(nan_src[s], all_dt[s], &out, all_dt[d], 1);
      assert_int_equal(tpr_dtype_load(&out, all_dt[d], 0), 0);
    }
  uint16_t hmax = 0x7bff;  // 65504 -> u8 saturates, -> i32 exact
  tpr_dtype_convert(&hmax, TPR_F16, &u8, TPR_U8, 1), assert_int_equal(u8, 255);
  tpr_dtype_convert(&hmax, TPR_F16, &i32, TPR_I32, 1), assert_int_equal(i32, 65504);
  // int -> int.
  i64 = 5000000000, tpr_dtype_convert(&i64, TPR_I64, &i32, TPR_I32, 1), assert_int_equal(i32, INT32_MAX);
  i64 = -5000000000, tpr_dtype_convert(&i64, TPR_I64, &i32, TPR_I32, 1), assert_int_equal(i32, INT32_MIN);
  i32 = -5, tpr_dtype_convert(&i32, TPR_I32, &u8, TPR_U8, 1), assert_int_equal(u8, 0);
  i64 = 1000, tpr_dtype_convert(&i64, TPR_I64, &u8, TPR_U8, 1), assert_int_equal(u8, 255);
  i32 = -123456, tpr_dtype_convert(&i32, TPR_I32, &i64, TPR_I64, 1), assert_int_equal(i64, -123456);
  // Every u8 survives a trip through each dtype that holds 0..255 exactly.
  uint8_t all_u8[256], back[256];
  int64_t tmp[256];
  for (int i = 0; i < 256; i++) all_u8[i] = (uint8_t)i;
  for (int d = 0; d < N_DT; d++) {
    if (all_dt[d] == TPR_F8E4M3) continue;  // 4 significant bits: checked below
    tpr_dtype_convert(all_u8, TPR_U8, tmp, all_dt[d], 256);
    tpr_dtype_convert(tmp, all_dt[d], back, TPR_U8, 256);
    assert_memory_equal(back, all_u8, 256);
  }
  uint8_t f8[256];
  tpr_dtype_convert(all_u8, TPR_U8, f8, TPR_F8E4M3, 256);
  for (int i = 0; i < 256; i++) assert_int_equal(f8[i], ref_f8(i));
  // Same dtype: a copy, and a no-op in place.
  int32_t a[3] = {1, -2, 3}, c[3] = {0};
  tpr_dtype_convert(a, TPR_I32, c, TPR_I32, 3), assert_memory_equal(a, c, sizeof a);
  tpr_dtype_convert(a, TPR_I32, a, TPR_I32, 3), assert_int_equal(a[1], -2);
}

// int -> narrow float must round once: via RNE f32 first, 2^25 + 2^17 + 1
// becomes 2^25 + 2^17 (a bf16 tie) and then 2^25, but the nearest bf16 is
// 2^25 + 2^18.
static void test_convert_int_to_float_single_rounding(void **state) {
  n_fail = 0;
  int32_t v = (1 << 25) + (1 << 17) + 1;
  uint16_t got;
  tpr_dtype_convert(&v, TPR_I32, &got, TPR_BF16, 1);
  assert_int_equal(got, ref_bf16(v));
  assert_true(tpr_bf16_to_f32(got) == (float)((1 << 25) + (1 << 18)));
  assert_int_not_equal(tpr_f32_to_bf16((float)v), ref_bf16(v));  // the trap is real
  for (int i = 0; i < 300000; i++) {
    int32_t x = (int32_t)(uint32_t)tt_next_u64() >> (int)(tt_next_u64() % 28);
    uint16_t hb, hh;
    uint8_t b8;
    float f;
    tpr_dtype_convert(&x, TPR_I32, &hb, TPR_BF16, 1);
    tpr_dtype_convert(&x, TPR_I32, &hh, TPR_F16, 1);
    tpr_dtype_convert(&x, TPR_I32, &b8, TPR_F8E4M3, 1);
    tpr_dtype_convert(&x, TPR_I32, &f, TPR_F32, 1);
    _Float16 r16 = (_Float16)(double)x;  // one rounding: i32 is exact in double
    uint16_t want16;
    memcpy(&want16, &r16, 2);
    if (hb != ref_bf16(x)) mismatch("i32->bf16", x, hb, ref_bf16(x));
    if (hh != want16) mismatch("i32->f16", x, hh, want16);
    if (b8 != ref_f8(x)) mismatch("i32->f8", x, b8, ref_f8(x));
    if (f != (float)x) mismatch("i32->f32", x, bits_of(f), bits_of((float)x));
    int64_t y = (int64_t)(tt_next_u64() >> 11) * (tt_next_u64() & 1 ? 1 : -1);  // |y| < 2^53
    y >>= tt_next_u64() % 40;
    tpr_dtype_convert(&y, TPR_I64, &hb, TPR_BF16, 1);
    if (hb != ref_bf16((double)y)) mismatch("i64->bf16", (double)y, hb, ref_bf16((double)y));
  }
  int64_t big[2] = {INT64_MIN, INT64_MAX};
  uint16_t bb[2], hh[2];
  uint8_t b8[2];
  tpr_dtype_convert(big, TPR_I64, bb, TPR_BF16, 2);
  tpr_dtype_convert(big, TPR_I64, hh, TPR_F16, 2);
  tpr_dtype_convert(big, TPR_I64, b8, TPR_F8E4M3, 2);
  assert_int_equal(bb[0], 0xdf00);  // -2^63 exactly
  assert_int_equal(bb[1], 0x5f00);  // 2^63 - 1 rounds up to 2^63
  assert_int_equal(hh[0], 0xfc00);
  assert_int_equal(hh[1], 0x7c00);
  assert_int_equal(b8[0], 0xff);
  assert_int_equal(b8[1], 0x7f);
  EXPECT_NO_MISMATCH();
}

static void test_load_store(void **state) {
  unsigned char buf[8 * 4];
  // A double just above an f16/bf16/f8 tie: rounding it to f32 first would
  // land exactly on the tie and go down; store must round once, up.
  tpr_dtype_store(buf, TPR_F16, 1, 1 + 0x1p-11 + 0x1p-40);
  assert_true(tpr_dtype_load(buf, TPR_F16, 1) == 1 + 0x1p-10);
  tpr_dtype_store(buf, TPR_BF16, 2, 1 + 0x1p-8 + 0x1p-40);
  assert_true(tpr_dtype_load(buf, TPR_BF16, 2) == 1 + 0x1p-7);
  tpr_dtype_store(buf, TPR_F8E4M3, 3, 1 + 0x1p-4 + 0x1p-40);
  assert_true(tpr_dtype_load(buf, TPR_F8E4M3, 3) == 1 + 0x1p-3);
  tpr_dtype_store(buf, TPR_F8E4M3, 3, -(1 + 0x1p-4 - 0x1p-40));
  assert_true(tpr_dtype_load(buf, TPR_F8E4M3, 3) == -1.0);
  tpr_dtype_store(buf, TPR_F16, 0, 1e300);
  assert_true(isinf(tpr_dtype_load(buf, TPR_F16, 0)));
  tpr_dtype_store(buf, TPR_BF16, 0, 0x1p-130);  // bf16 (and f32) subnormal, exact
  assert_true(tpr_dtype_load(buf, TPR_BF16, 0) == 0x1p-130);
  tpr_dtype_store(buf, TPR_BF16, 0, 0x1p-134);  // tie between 0 and 2^-133 -> 0
  assert_true(tpr_dtype_load(buf, TPR_BF16, 0) == 0);
  tpr_dtype_store(buf, TPR_BF16, 0, 0x1p-134 + 0x1p-160);  // just above it, below f32's reach
  assert_true(tpr_dtype_load(buf, TPR_BF16, 0) == 0x1p-133);
  tpr_dtype_store(buf, TPR_F16, 0, NAN);
  assert_true(isnan(tpr_dtype_load(buf, TPR_F16, 0)));
  tpr_dtype_store(buf, TPR_F32, 2, 0.1);
  assert_true(tpr_dtype_load(buf, TPR_F32, 2) == (double)0.1f);
  tpr_dtype_store(buf, TPR_I32, 1, -7.9), assert_true(tpr_dtype_load(buf, TPR_I32, 1) == -7);
  tpr_dtype_store(buf, TPR_I32, 1, 1e100), assert_true(tpr_dtype_load(buf, TPR_I32, 1) == INT32_MAX);
  tpr_dtype_store(buf, TPR_I64, 2, -1e100), assert_true(tpr_dtype_load(buf, TPR_I64, 2) == (double)INT64_MIN);
  tpr_dtype_store(buf, TPR_U8, 5, 256.0), assert_true(tpr_dtype_load(buf, TPR_U8, 5) == 255);
  tpr_dtype_store(buf, TPR_U8, 5, NAN), assert_true(tpr_dtype_load(buf, TPR_U8, 5) == 0);
  // Random doubles: store then load equals the one-rounding references.
  n_fail = 0;
  for (int i = 0; i < 200000; i++) {
    double x = tt_normal() * ldexp(1, (int)tt_randint(-30, 20));
    tpr_dtype_store(buf, TPR_BF16, 0, x);
    tpr_dtype_store(buf, TPR_F8E4M3, 4, x);
    tpr_dtype_store(buf, TPR_F16, 3, x);
    _Float16 r16 = (_Float16)x;  // libgcc __truncdfhf2: one rounding from double
    uint16_t want16, h0, h3;
    memcpy(&want16, &r16, 2);
    memcpy(&h0, buf, 2);
    memcpy(&h3, buf + 6, 2);
    if (h0 != ref_bf16(x)) mismatch("store bf16", x, h0, ref_bf16(x));
    if (buf[4] != ref_f8(x)) mismatch("store f8", x, buf[4], ref_f8(x));
    if (h3 != want16) mismatch("store f16", x, h3, want16);
  }
  EXPECT_NO_MISMATCH();
}

static void test_names(void **state) {
  static const size_t sizes[N_DT] = {4, 2, 2, 1, 4, 8, 1};
  static const char *aliases[N_DT] = {"float32", "bfloat16", "float16", "float8_e4m3fn", "int32", "int64", "uint8"};
  for (int d = 0; d < N_DT; d++) {
    tpr_dtype dt = all_dt[d], back = TPR_DTYPE_COUNT;
    assert_true(tpr_dtype_valid(dt));
    assert_int_equal(tpr_dtype_size(dt), sizes[d]);
    assert_int_equal(tpr_dtype_is_float(dt), d < 4);
    TT_OK(tpr_dtype_parse(tpr_dtype_name(dt), &back));
    assert_int_equal(back, dt);
    back = TPR_DTYPE_COUNT;
    TT_OK(tpr_dtype_parse(aliases[d], &back));
    assert_int_equal(back, dt);
  }
  assert_string_equal(tpr_dtype_name(TPR_F8E4M3), "f8e4m3");
  assert_string_equal(tpr_dtype_name(TPR_DTYPE_COUNT), "?");
  assert_int_equal(tpr_dtype_size(TPR_DTYPE_COUNT), 0);
  assert_false(tpr_dtype_valid(TPR_DTYPE_COUNT));
  assert_false(tpr_dtype_valid((tpr_dtype)-1));
  assert_false(tpr_dtype_is_float(TPR_DTYPE_COUNT));
  static const char *bad[] = {"f64", "", "F32", "float8", "bf16 ", "int"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tpr_dtype out = TPR_I32;
    tpr_clear_error();
    assert_int_equal(tpr_dtype_parse(bad[i], &out), TPR_ERR_INVALID_ARG);
    assert_int_equal(out, TPR_I32);  // untouched on failure
    char quoted[32];
    snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
    assert_non_null(strstr(tpr_last_error(), quoted));
  }
  tpr_dtype out;
  assert_int_equal(tpr_dtype_parse(NULL, &out), TPR_ERR_INVALID_ARG);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f16_decode_all),
      cmocka_unit_test(test_f16_roundtrip_all),
      cmocka_unit_test(test_f16_midpoints),
      cmocka_unit_test(test_f16_boundaries),
      cmocka_unit_test(test_f16_random),
      cmocka_unit_test(test_bf16_decode_all),
      cmocka_unit_test(test_bf16_midpoints),
      cmocka_unit_test(test_bf16_specials_random),
      cmocka_unit_test(test_f8_decode_all),
      cmocka_unit_test(test_f8_midpoints_subnormals),
      cmocka_unit_test(test_f8_nan_boundary),
      cmocka_unit_test(test_f8_random),
      cmocka_unit_test(test_convert_float_roundtrips),
      cmocka_unit_test(test_convert_int_saturation),
      cmocka_unit_test(test_convert_int_to_float_single_rounding),
      cmocka_unit_test(test_load_store),
      cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
