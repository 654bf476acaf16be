#include "models/layers/router_softmax.h"

#include "runtime/program/autodiff.h"

tpr_status tpr_router_softmax_topk(tpr_program *p, tpr_value_id logits, int64_t k, bool renormalise,
                                   tpr_value_id *gates) {
  tpr_router_softmax_values v;
  TPR_CHECK(tpr_router_softmax_topk_values(p, logits, k, renormalise, &v));
  *gates = v.gates;
  return TPR_OK;
}

tpr_status tpr_router_softmax_topk_values(tpr_program *p, tpr_value_id logits, int64_t k, bool renormalise,
                                          tpr_router_softmax_values *out) {
  tpr_value_id *gates = &out->gates;
  tpr_tensor d;
  TPR_CHECK(tpr_program_value(p, logits, &d));
  if (d.ndim != 2 || d.dtype != TPR_F32 || k < 1 || k > d.shape[1])
    return TPR_FAIL(TPR_ERR_SHAPE, "router_softmax_topk: logits must be (T, E) f32 with 1 <= k <= E, got %d-D, k %lld",
                    d.ndim, (long long)k);
  int64_t T = d.shape[0], E = d.shape[1];
  tpr_value_id probs, row, zero, one, onecol, onesE, w, w1, ww, mask, g;
  TPR_CHECK(tpr_pb_softmax(p, logits, &probs));                            // (T, E)
  TPR_CHECK(tpr_pb_slice(p, logits, 0, 0, 1, &row));                       // (1, E): a shape to fill
  TPR_CHECK(tpr_pb_reshape(p, row, 1, (const int64_t[]){E}, &row));
  TPR_CHECK(tpr_pb_fill(p, row, 0.0f, &zero));                             // (E) no selection bias
  TPR_CHECK(tpr_pb_fill(p, row, 1.0f, &onesE));                            // (E)
  TPR_CHECK(tpr_pb_slice(p, onesE, 0, 0, 1, &one));                        // (1)
  TPR_CHECK(tpr_pb_router_sigmoid_topk(p, probs, zero, (int)k, &w));       // (T, E), > 0 on the chosen
  TPR_CHECK(tpr_pb_reshape(p, w, 2, (const int64_t[]){T * E, 1}, &w1));    // one element per row
  TPR_CHECK(tpr_pb_mul(p, w1, w1, &ww));
  TPR_CHECK(tpr_pb_rms_scale(p, w1, ww, one, 1.0f, 1e-30f, &mask));        // w / |w|: 1 or 0
  TPR_CHECK(tpr_pb_reshape(p, mask, 2, (const int64_t[]){T, E}, &mask));
  out->probs = probs, out->chosen = mask;
  TPR_CHECK(tpr_pb_mul(p, probs, mask, &g));                               // (T, E) chosen p
  if (!renormalise) return *gates = g, TPR_OK;
  tpr_value_id sum, sum2;
  TPR_CHECK(tpr_pb_reshape(p, onesE, 2, (const int64_t[]){E, 1}, &onecol));
  TPR_CHECK(tpr_pb_matmul(p, g, onecol, false, false, &sum));             // (T, 1) sum of the chosen p
  TPR_CHECK(tpr_pb_mul(p, sum, sum, &sum2));
  return tpr_pb_rms_scale(p, g, sum2, onesE, 1.0f, 0.0f, gates);           // g / sum (sum >= k/E > 0)
}
