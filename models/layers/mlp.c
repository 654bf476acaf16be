#include "mlp.h"

#include <stdio.h>

tpr_status tpr_mlp_declare(tpr_program *p, const char *prefix, const tpr_mlp_dims *d, tpr_mlp_params *out) {
  if (d->tp < 1 || d->ffn % d->tp)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "mlp: tp=%lld does not divide intermediate size %lld", (long long)d->tp,
                    (long long)d->ffn);
  char name[256];
  snprintf(name, sizeof name, "%sw1", prefix);
  TPR_CHECK(tpr_program_param(p, name, TPR_F32, 2, (const int64_t[]){d->ffn, d->hidden}, &out->w1));
  snprintf(name, sizeof name, "%sw3", prefix);
  TPR_CHECK(tpr_program_param(p, name, TPR_F32, 2, (const int64_t[]){d->ffn, d->hidden}, &out->w3));
  snprintf(name, sizeof name, "%sw2", prefix);
  TPR_CHECK(tpr_program_param(p, name, TPR_F32, 2, (const int64_t[]){d->hidden, d->ffn}, &out->w2));
  return TPR_OK;
}

// (F, H) -> this rank's (F/tp, H) row block.
static tpr_status select_rows(tpr_program *p, const tpr_mlp_dims *d, tpr_value_id w, tpr_value_id rank_index,
                              tpr_value_id *out) {
  int64_t fl = d->ffn / d->tp;
  tpr_value_id blocks, mine;
  TPR_CHECK(tpr_pb_reshape(p, w, 3, (const int64_t[]){d->tp, fl, d->hidden}, &blocks));  // (tp, F/tp, H)
  TPR_CHECK(tpr_pb_index_select(p, blocks, 0, rank_index, &mine));                      // (1, F/tp, H)
  return tpr_pb_reshape(p, mine, 2, (const int64_t[]){fl, d->hidden}, out);
}

// (H, F) -> this rank's (H, F/tp) column block.
static tpr_status select_cols(tpr_program *p, const tpr_mlp_dims *d, tpr_value_id w, tpr_value_id rank_index,
                              tpr_value_id *out) {
  int64_t fl = d->ffn / d->tp;
  tpr_value_id blocks, mine;
  TPR_CHECK(tpr_pb_reshape(p, w, 3, (const int64_t[]){d->hidden, d->tp, fl}, &blocks));  // (H, tp, F/tp)
  TPR_CHECK(tpr_pb_index_select(p, blocks, 1, rank_index, &mine));                      // (H, 1, F/tp)
  return tpr_pb_reshape(p, mine, 2, (const int64_t[]){d->hidden, fl}, out);
}

tpr_status tpr_mlp_build(tpr_program *p, const tpr_mlp_dims *d, const tpr_mlp_params *w, tpr_value_id rank_index,
                         tpr_value_id x, tpr_value_id *partial) {
  tpr_value_id w1, w3, w2, gate, up, act;
  TPR_CHECK(select_rows(p, d, w->w1, rank_index, &w1));  // (F/tp, H)
  TPR_CHECK(select_rows(p, d, w->w3, rank_index, &w3));  // (F/tp, H)
  TPR_CHECK(select_cols(p, d, w->w2, rank_index, &w2));  // (H, F/tp)
  TPR_CHECK(tpr_pb_matmul(p, x, w1, false, true, &gate));  // (T, F/tp)
  TPR_CHECK(tpr_pb_matmul(p, x, w3, false, true, &up));    // (T, F/tp)
  TPR_CHECK(tpr_pb_swiglu(p, gate, up, &act));             // (T, F/tp)
  return tpr_pb_matmul(p, act, w2, false, true, partial);  // (T, H)
}
