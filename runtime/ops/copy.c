// Cast CPU kernel: copies a strided x into a contiguous out, converting to
// out's dtype with tpr_dtype_convert (dtype.c owns every conversion rule).
//
// The strided iterator merges dims, so a contiguous x is one row and one
// tpr_dtype_convert call over the whole tensor; strided rows are gathered
// into a small stack buffer first because tpr_dtype_convert reads unit
// stride only.
#include <string.h>

#include "cpu_kernels.h"
#include "strided.h"

enum { CHUNK = 1024 };  // elements gathered per conversion call

// x (...) any dtype and strides; out (...) contiguous, out->dtype.
TPR_CPU_KERNEL(cast) {
  if (n_in != 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "cast (cpu): expected 1 input, got %d", n_in);
  const tpr_tensor *x = in[0];
  if (!tpr_dtype_valid(x->dtype) || !tpr_dtype_valid(out->dtype))
    return TPR_FAIL(TPR_ERR_DTYPE, "cast (cpu): cannot cast %s to %s", tpr_dtype_name(x->dtype),
                    tpr_dtype_name(out->dtype));
  if (!tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "cast (cpu): x and out shapes differ");
  const size_t xsz = tpr_dtype_size(x->dtype), osz = tpr_dtype_size(out->dtype);
  const char *xd = tpr_tensor_data(x);
  char *o = tpr_tensor_data(out);
  int64_t so[TPR_MAX_DIMS];
  tpr__contig_strides(out->ndim, out->shape, so);
  if (x->dtype == out->dtype) {  // a plain strided copy
    tpr__strided_copy(o, so, xd, x->stride, x->ndim, x->shape, xsz);
    return TPR_OK;
  }
  const int64_t *st[2] = {so, x->stride};
  tpr__iter it;
  if (!tpr__iter_init(&it, x->ndim, x->shape, 2, st)) return TPR_OK;
  _Alignas(8) char buf[CHUNK * 8];  // 8 = the widest element
  do {
    const char *src = xd + it.off[1] * (int64_t)xsz;
    char *dst = o + it.off[0] * (int64_t)osz;  // out rows are unit stride
    if (it.inner[1] == 1 || it.n == 1) {
      tpr_dtype_convert(src, x->dtype, dst, out->dtype, (size_t)it.n);
      continue;
    }
    const int64_t step = it.inner[1] * (int64_t)xsz;
    for (int64_t i0 = 0; i0 < it.n; i0 += CHUNK) {
      int64_t m = it.n - i0 < CHUNK ? it.n - i0 : CHUNK;
      for (int64_t i = 0; i < m; i++) memcpy(buf + i * xsz, src + (i0 + i) * step, xsz);
      tpr_dtype_convert(buf, x->dtype, dst + i0 * (int64_t)osz, out->dtype, (size_t)m);
    }
  } while (tpr__iter_next(&it));
  return TPR_OK;
}

// ---- Backward. Cotangents are f32 whatever the value's dtype (autodiff.h),
// so a cast between float types hands its cotangent straight on: for an
// f32 -> f32 cast (a strided copy) that is the exact gradient, for a
// narrowing one the straight-through estimate. Integer sources have none.
#include "grad_rules.h"

TPR__BWD_RULE(cast) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_tensor x;
  TPR_CHECK(tpr_program_value(tpr_grad_program(g), n->in[0], &x));
  if (x.dtype != TPR_F32 && x.dtype != TPR_BF16 && x.dtype != TPR_F16)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backward: cast from %s has no gradient (only f32, bf16, f16 sources)",
                    tpr_dtype_name(x.dtype));
  return tpr_grad_add(g, n->in[0], n->dout);
}
