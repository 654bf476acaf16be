// Cast CPU kernel: copies a strided x into a contiguous out, converting to
// out's dtype with tpr_dtype_convert (dtype.c owns every conversion rule).
//
// The strided iterator merges dims, so a contiguous x is one row and one
// tpr_dtype_convert call over the whole tensor; strided rows are gathered
// into a small stack buffer first because tpr_dtype_convert reads unit
// stride only. The flat element range is split over threads
// (cpu_threads.h): every element's conversion is independent of the others.
// Also slice_bwd, the one kernel of the view ops (their forwards copy
// nothing): dy placed into zeros.
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

// dy (..., len, ...) any strides; i[0] dim, i[1] start, i[2] full len;
// out (..., full, ...): zeros with dy at [start, start + len) along dim.
TPR_CPU_KERNEL(slice_bwd) {
  if (n_in != 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "slice_bwd (cpu): expected 1 input, got %d", n_in);
  const tpr_tensor *dy = in[0];
  const int dim = (int)attrs->i[0];
  const int64_t start = attrs->i[1];
  float *o = tpr_tensor_data(out);
  memset(o, 0, (size_t)tpr_tensor_numel(out) * sizeof *o);
  int64_t so[TPR_MAX_DIMS];
  tpr__contig_strides(out->ndim, out->shape, so);
  tpr__strided_copy(o + start * so[dim], so, tpr_tensor_data(dy), dy->stride, dy->ndim, dy->shape, sizeof *o);
  return TPR_OK;
}

const tpr__kernel_def tpr__copy_cpu[] = {
    {TPR_OP_CAST, cpu_cast},
    {TPR_OP_SLICE_BWD, cpu_slice_bwd},
    {0},
};
