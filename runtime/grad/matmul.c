// Backward rule of matmul. out = op(a) @ op(b) with op = transpose when the
// flag says: da = dout @ op(b)^T, db = op(a)^T @ dout, each written back
// through its own transpose flag so no operand is copied. A 2-D b shared by
// a batched a gets the sum over the batch: a and dout are seen as one
// (batch*M) matrix.
#include "grad.h"

TPR__BWD_RULE(matmul) {
  tpr_program *p = tpr_grad_program(g);
  bool ta = n->attrs.n_i > 0 && n->attrs.i[0], tb = n->attrs.n_i > 1 && n->attrs.i[1];
  tpr_value_id a = n->in[0], b = n->in[1], d = n->dout, da, db;
  tpr_tensor ad, bd, dd;
  TPR_CHECK(tpr_program_value(p, a, &ad));
  TPR_CHECK(tpr_program_value(p, b, &bd));
  if (tpr_grad_wanted(g, a)) {
    if (!ta)
      TPR_CHECK(tpr_pb_matmul(p, d, b, false, !tb, &da));  // (.., M, K)
    else
      TPR_CHECK(tpr_pb_matmul(p, b, d, tb, true, &da));    // (.., K, M)
    TPR_CHECK(tpr_grad_add(g, a, da));
  }
  if (!tpr_grad_wanted(g, b)) return TPR_OK;
  if (bd.ndim == 2 && ad.ndim > 2) {  // shared b: flatten the batch into rows
    if (ta)
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backward: matmul with a batched transposed a and a shared 2-D b");
    TPR_CHECK(tpr_grad_contiguous(g, a, &a));
    TPR_CHECK(tpr_grad_contiguous(g, d, &d));
    TPR_CHECK(tpr_program_value(p, d, &dd));
    int64_t K = ad.shape[ad.ndim - 1], N = dd.shape[dd.ndim - 1];
    TPR_CHECK(tpr_pb_reshape(p, a, 2, (const int64_t[]){tpr_tensor_numel(&ad) / K, K}, &a));
    TPR_CHECK(tpr_pb_reshape(p, d, 2, (const int64_t[]){tpr_tensor_numel(&dd) / N, N}, &d));
  }
  if (!tb)
    TPR_CHECK(tpr_pb_matmul(p, a, d, !ta, false, &db));  // (.., K, N)
  else
    TPR_CHECK(tpr_pb_matmul(p, d, a, true, ta, &db));    // (.., N, K)
  return tpr_grad_add(g, b, db);
}

const tpr__grad_def tpr__matmul_grad[] = {
    {TPR_OP_MATMUL, bwd_matmul},
    {0},
};
