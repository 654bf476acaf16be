// What the CPU and CUDA matmul kernels read off a call the shape rule has
// passed (rules.c checked dtypes, ranks, the inner dim and the batch dims,
// so nothing here can fail): the GEMM's sizes and how each operand steps
// over the batch.
#ifndef TPR_OPS_MATMUL_H
#define TPR_OPS_MATMUL_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/ops.h"

typedef struct tpr__matmul_dims {
  bool ta, tb;  // i[0] trans_a, i[1] trans_b
  int64_t M, N, K;
  int nb;  // batch dims: out's leading out->ndim - 2
} tpr__matmul_dims;

// a (..., M, K) [(..., K, M) if ta], b (..., K, N) [(..., N, K) if tb] or
// 2-D; out (..., M, N).
static inline tpr__matmul_dims tpr__matmul_dims_of(const tpr_tensor *a, const tpr_tensor *b,
                                                   const tpr_op_attrs *attrs, const tpr_tensor *out) {
  tpr__matmul_dims d;
  d.ta = attrs->n_i > 0 && attrs->i[0];
  d.tb = attrs->n_i > 1 && attrs->i[1];
  const int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
  const int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
  d.M = d.ta ? ac : ar;
  d.K = d.ta ? ar : ac;
  d.N = d.tb ? br : bc;
  d.nb = out->ndim - 2;
  return d;
}

// Batch strides (nb) of a matrix stack (nd dims: batch..., r, c; element
// strides tstride) read against out's nb batch dims: 0 for a batch dim it
// lacks (a 2-D b shared by every batch) or holds once.
static inline void tpr__matmul_batch_strides(int nd, const int64_t *shape, const int64_t *tstride, int nb,
                                             int64_t *stride) {
  const int tb = nd - 2;
  for (int d = 0; d < nb; d++) {
    const int td = d - (nb - tb);
    stride[d] = (td < 0 || shape[td] == 1) ? 0 : tstride[td];
  }
}

#endif
