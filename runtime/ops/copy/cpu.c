// Cast CPU kernel: copies a strided x into a contiguous out, converting to
// out's dtype with tpr_dtype_convert (dtype.c owns every conversion rule).
//
// The strided iterator merges dims, so a contiguous x is one row and one
// tpr_dtype_convert call over the whole tensor; strided rows are gathered
// into a small stack buffer first because tpr_dtype_convert reads unit
// stride only. The flat element range is split over threads
// (cpu_threads.h): every element's conversion is independent of the others.
#include <string.h>

#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/cpu_threads.h"
#include "runtime/ops/strided.h"

enum { CHUNK = 1024 };  // elements gathered per conversion call

typedef struct cast_arg {
  const char *x;
  char *o;
  tpr_dtype xt, ot;
} cast_arg;

// len elements of the row at it from column col; out rows are unit stride.
static void cast_piece(const tpr__iter *it, int64_t col, int64_t len, int64_t q, void *arg) {
  const cast_arg *p = arg;
  const int64_t xsz = (int64_t)tpr_dtype_size(p->xt), osz = (int64_t)tpr_dtype_size(p->ot);
  const char *src = p->x + (it->off[1] + col * it->inner[1]) * xsz;
  char *dst = p->o + (it->off[0] + col * it->inner[0]) * osz;
  if (p->xt == p->ot) {  // a plain strided copy
    const int64_t one = 1;
    tpr__strided_copy(dst, &one, src, &it->inner[1], 1, &len, (size_t)xsz);
    return;
  }
  if (it->inner[1] == 1 || len == 1) {
    tpr_dtype_convert(src, p->xt, dst, p->ot, (size_t)len);
    return;
  }
  _Alignas(8) char buf[CHUNK * 8];  // 8 = the widest element
  const int64_t step = it->inner[1] * xsz;
  for (int64_t i0 = 0; i0 < len; i0 += CHUNK) {
    int64_t m = len - i0 < CHUNK ? len - i0 : CHUNK;
    for (int64_t i = 0; i < m; i++) memcpy(buf + i * xsz, src + (i0 + i) * step, (size_t)xsz);
    tpr_dtype_convert(buf, p->xt, dst + i0 * osz, p->ot, (size_t)m);
  }
}

// x (...) any dtype and strides; out (...) contiguous, out->dtype.
TPR_CPU_KERNEL(cast) {
  if (n_in != 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "cast (cpu): expected 1 input, got %d", n_in);
  const tpr_tensor *x = in[0];
  if (!tpr_dtype_valid(x->dtype) || !tpr_dtype_valid(out->dtype))
    return TPR_FAIL(TPR_ERR_DTYPE, "cast (cpu): cannot cast %s to %s", tpr_dtype_name(x->dtype),
                    tpr_dtype_name(out->dtype));
  if (!tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "cast (cpu): x and out shapes differ");
  int64_t so[TPR_MAX_DIMS];
  tpr__contig_strides(out->ndim, out->shape, so);
  const int64_t *st[2] = {so, x->stride};
  tpr__iter it;
  if (!tpr__iter_init(&it, x->ndim, x->shape, 2, st)) return TPR_OK;
  cast_arg arg = {tpr_tensor_data(x), tpr_tensor_data(out), x->dtype, out->dtype};
  tpr__par_pieces(ctx, &it, cast_piece, &arg);
  return TPR_OK;
}

// ---- Backward. Cotangents are f32 whatever the value's dtype (autodiff.h),
// so a cast between float types hands its cotangent straight on: for an
// f32 -> f32 cast (a strided copy) that is the exact gradient, for a
// narrowing one the straight-through estimate. Integer sources have none.
#include "runtime/grad/grad.h"

TPR__BWD_RULE(cast) {
  if (!tpr_grad_wanted(g, n->in[0])) return TPR_OK;
  tpr_tensor x;
  TPR_CHECK(tpr_program_value(tpr_grad_program(g), n->in[0], &x));
  if (x.dtype != TPR_F32 && x.dtype != TPR_BF16 && x.dtype != TPR_F16)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backward: cast from %s has no gradient (only f32, bf16, f16 sources)",
                    tpr_dtype_name(x.dtype));
  return tpr_grad_add(g, n->in[0], n->dout);
}
