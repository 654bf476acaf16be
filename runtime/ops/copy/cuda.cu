// Cast CUDA kernel (cpu.c's twin): a strided x into a contiguous out,
// converting to out's dtype; same dtypes make it a plain strided copy. Also
// the strided copy every other CUDA kernel uses for scratch.
//
// The conversions are dtype.c's, rule for rule, on the bit patterns (integer
// manipulation, no hardware half/bf16 types), so every (src, dst) dtype pair
// gives the CPU's bytes exactly:
//   float -> f32: exact; float -> narrow float: round to nearest even from
//   f32; float -> int: truncate toward zero, saturate, NaN -> 0;
//   int -> f32: round to nearest even; int -> narrow float: round to odd into
//   f32 first, then to nearest even (one rounding overall); int -> int:
//   saturate.
#include "runtime/ops/cuda_kernels.h"

// ---- dtype.c's conversions on device ----------------------------------------

static __device__ uint32_t rne_shift(uint32_t x, int s) {  // x >> s, nearest even, 1 <= s <= 31
  uint32_t q = x >> s;
  uint32_t rem = x & ((1u << s) - 1);
  uint32_t half = 1u << (s - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  return q;
}

static __device__ uint32_t subnormal_steps(uint32_t a, int unit_log2) {
  int e = (int)(a >> 23);
  uint32_t mant = (a & 0x7fffff) | 0x800000;
  int shift = 150 - unit_log2 - e;
  if (shift > 24) return 0;
  return rne_shift(mant, shift);
}

static __device__ uint16_t f32_to_bf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x0040);
  return (uint16_t)rne_shift(x, 16);
}

static __device__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

static __device__ uint16_t f32_to_f16(float f) {
  uint32_t x = __float_as_uint(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t a = x & 0x7fffffff;
  if (a > 0x7f800000) return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
  if (a >= 0x477ff000) return (uint16_t)(sign | 0x7c00);
  if (a >= 0x38800000) return (uint16_t)(sign | rne_shift(a - (112u << 23), 13));
  return (uint16_t)(sign | subnormal_steps(a, 24));
}

static __device__ float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000 | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return __uint_as_float(sign);
    exp = 113;
    while (!(mant & 0x400)) {
      mant <<= 1;
      exp--;
    }
    return __uint_as_float(sign | (exp << 23) | ((mant & 0x3ff) << 13));
  }
  return __uint_as_float(sign | ((exp + 112) << 23) | (mant << 13));
}

static __device__ uint8_t f32_to_f8e4m3(float f) {
  uint32_t x = __float_as_uint(f);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80);
  uint32_t a = x & 0x7fffffff;
  if (a > 0x43e80000) return (uint8_t)(sign | 0x7f);
  if (a >= 0x3c800000) return (uint8_t)(sign | rne_shift(a - (120u << 23), 20));
  return (uint8_t)(sign | subnormal_steps(a, 9));
}

static __device__ float f8e4m3_to_f32(uint8_t b) {
  uint32_t sign = (uint32_t)(b & 0x80) << 24;
  uint32_t exp = (b >> 3) & 0xf;
  uint32_t mant = b & 7;
  if (exp == 0xf && mant == 7) return __uint_as_float(sign | 0x7fc00000);
  if (exp == 0) {
    float v = (float)mant * 0.001953125f;  // 2^-9, exact
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((exp + 120) << 23) | (mant << 20));
}

static __device__ float i64_to_f32_odd(int64_t v) {
  uint64_t m = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  int s = 0;
  while ((m >> s) >= (1ull << 24)) s++;
  uint64_t q = m >> s;
  if (s && (m & ((1ull << s) - 1))) q |= 1;
  float f = (float)q * (float)(1ull << s);  // exact: q < 2^24 times a power of two
  return v < 0 ? -f : f;
}

static __device__ int64_t f64_to_i64_sat(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;  // truncates toward zero
}

static __device__ void store_int(void *base, int dt, int64_t i, int64_t v) {
  switch (dt) {
    case TPR_I32: ((int32_t *)base)[i] = (int32_t)(v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v); break;
    case TPR_I64: ((int64_t *)base)[i] = v; break;
    case TPR_U8: ((uint8_t *)base)[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); break;
    default: break;
  }
}

static __device__ void store_narrow(void *base, int dt, int64_t i, float f) {
  switch (dt) {
    case TPR_BF16: ((uint16_t *)base)[i] = f32_to_bf16(f); break;
    case TPR_F16: ((uint16_t *)base)[i] = f32_to_f16(f); break;
    case TPR_F8E4M3: ((uint8_t *)base)[i] = f32_to_f8e4m3(f); break;
    default: break;
  }
}

static __device__ float load_f32(const void *base, int dt, int64_t i) {
  switch (dt) {
    case TPR_F32: return ((const float *)base)[i];
    case TPR_BF16: return bf16_to_f32(((const uint16_t *)base)[i]);
    case TPR_F16: return f16_to_f32(((const uint16_t *)base)[i]);
    case TPR_F8E4M3: return f8e4m3_to_f32(((const uint8_t *)base)[i]);
    default: return 0;
  }
}

static __device__ int64_t load_int(const void *base, int dt, int64_t i) {
  switch (dt) {
    case TPR_I32: return ((const int32_t *)base)[i];
    case TPR_I64: return ((const int64_t *)base)[i];
    case TPR_U8: return ((const uint8_t *)base)[i];
    default: return 0;
  }
}

static __device__ bool is_float_dt(int dt) {
  return dt == TPR_F32 || dt == TPR_BF16 || dt == TPR_F16 || dt == TPR_F8E4M3;
}

// out[i] = convert(x[offset(i)]) for i < n; sdt != ddt.
static __global__ void cast_kernel(const void *x, int sdt, tpr__cuda_desc xd, void *o, int ddt, int64_t n) {
  const bool src_float = is_float_dt(sdt), dst_float = is_float_dt(ddt);
  TPR_CUDA_GRID_STRIDE(i, n) {
    const int64_t off = tpr__cuda_offset(xd, i);
    if (src_float) {
      float f = load_f32(x, sdt, off);
      if (ddt == TPR_F32) ((float *)o)[i] = f;
      else if (dst_float) store_narrow(o, ddt, i, f);
      else store_int(o, ddt, i, f64_to_i64_sat((double)f));
    } else {
      int64_t v = load_int(x, sdt, off);
      if (ddt == TPR_F32) ((float *)o)[i] = (float)v;  // round to nearest even
      else if (dst_float) store_narrow(o, ddt, i, i64_to_f32_odd(v));
      else store_int(o, ddt, i, v);
    }
  }
}

// x (...) any dtype and strides; out (...) contiguous, out->dtype.
TPR_CUDA_KERNEL(cast) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "cast (cuda): expected 1 input, got %d", n_in);
  const tpr_tensor *x = in[0];
  if (!tpr_dtype_valid(x->dtype) || !tpr_dtype_valid(out->dtype))
    return TPR_FAIL(TPR_ERR_DTYPE, "cast (cuda): cannot cast %s to %s", tpr_dtype_name(x->dtype),
                    tpr_dtype_name(out->dtype));
  if (!tpr_tensor_same_shape(x, out)) return TPR_FAIL(TPR_ERR_SHAPE, "cast (cuda): x and out shapes differ");
  const int64_t n = tpr_tensor_numel(out);
  if (n == 0) return TPR_OK;
  TPR_CUDA_TRY(cudaSetDevice(c->device), "cast", "set device");
  const size_t xsz = tpr_dtype_size(x->dtype);
  if (x->dtype == out->dtype) {
    if (tpr_tensor_is_contiguous(x)) {  // one memcpy
      TPR_CUDA_TRY(cudaMemcpyAsync(tpr_tensor_data(out), tpr_tensor_data(x), (size_t)n * xsz, cudaMemcpyDeviceToDevice,
                                   c->stream), "cast", "copy");
      return TPR_OK;
    }
    int64_t so[TPR_MAX_DIMS];
    tpr__contig_strides(out->ndim, out->shape, so);
    return tpr__cuda_strided_copy(c, "cast", tpr_tensor_data(out), so, tpr_tensor_data(x), x->stride, x->ndim,
                                  x->shape, xsz);
  }
  const int th = 256;
  cast_kernel<<<tpr__cuda_blocks(n, th), th, 0, c->stream>>>(tpr_tensor_data(x), (int)x->dtype,
                                                              tpr__cuda_tensor_desc(x), tpr_tensor_data(out),
                                                              (int)out->dtype, n);
  TPR_CUDA_LAUNCHED("cast", "cast kernel");
  return TPR_OK;
}

const tpr__kernel_def tpr__copy_cuda[] = {
    {TPR_OP_CAST, cuda_cast},
    {},
};
