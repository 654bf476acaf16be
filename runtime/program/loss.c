// Builders of the training losses (loss.h): the loss ops one at a time and
// the two compositions a model builder emits.
#include "loss.h"

static tpr_op_attrs one_attr(int64_t v) { return (tpr_op_attrs){.n_i = 1, .i = {v}}; }

tpr_status tpr_pb_xent_max(tpr_program *p, tpr_value_id logits, tpr_value_id shard, int64_t V, tpr_value_id *out) {
  tpr_op_attrs at = one_attr(V);
  return tpr_program_op(p, TPR_OP_XENT_MAX, (const tpr_value_id[]){logits, shard}, 2, &at, out);
}

tpr_status tpr_pb_xent_sumexp(tpr_program *p, tpr_value_id logits, tpr_value_id max, tpr_value_id shard, int64_t V,
                              tpr_value_id *out) {
  tpr_op_attrs at = one_attr(V);
  return tpr_program_op(p, TPR_OP_XENT_SUMEXP, (const tpr_value_id[]){logits, max, shard}, 3, &at, out);
}

tpr_status tpr_pb_xent_target(tpr_program *p, tpr_value_id logits, tpr_value_id targets, tpr_value_id shard,
                              int64_t V, tpr_value_id *out) {
  tpr_op_attrs at = one_attr(V);
  return tpr_program_op(p, TPR_OP_XENT_TARGET, (const tpr_value_id[]){logits, targets, shard}, 3, &at, out);
}

tpr_status tpr_pb_xent_loss(tpr_program *p, tpr_value_id sumexp, tpr_value_id max, tpr_value_id target,
                            tpr_value_id targets, tpr_value_id *out) {
  return tpr_program_op(p, TPR_OP_XENT_LOSS, (const tpr_value_id[]){sumexp, max, target, targets}, 4, NULL, out);
}

tpr_status tpr_pb_moe_aux_stats(tpr_program *p, tpr_value_id router_logits, int k, tpr_value_id *out) {
  tpr_op_attrs at = one_attr(k);
  return tpr_program_op(p, TPR_OP_MOE_AUX_STATS, (const tpr_value_id[]){router_logits}, 1, &at, out);
}

tpr_status tpr_pb_moe_aux_loss(tpr_program *p, tpr_value_id stats, int64_t n_rows, tpr_value_id *out) {
  tpr_op_attrs at = one_attr(n_rows);
  return tpr_program_op(p, TPR_OP_MOE_AUX_LOSS, (const tpr_value_id[]){stats}, 1, &at, out);
}

tpr_status tpr_build_vocab_parallel_xent(tpr_program *p, tpr_value_id logits, tpr_value_id targets,
                                         tpr_value_id shard, int64_t V, tpr_mesh_axis axis, int tp,
                                         tpr_value_id *loss) {
  if (tp < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "vocab-parallel xent: tp = %d must be >= 1", tp);
  tpr_tensor l;
  TPR_CHECK(tpr_program_value(p, logits, &l));
  // A shard may be all padding (tiny V, large tp): its max loses every
  // all-reduce and it adds nothing, so only V <= tp*Vl is required.
  if (l.ndim == 2 && (V < 1 || V > l.shape[1] * (int64_t)tp))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "vocab-parallel xent: V = %lld does not fit tp = %d shards of Vl = %lld "
                    "columns (need 1 <= V <= tp*Vl)", (long long)V, tp, (long long)l.shape[1]);
  tpr_value_id m, se, tg;
  TPR_CHECK(tpr_pb_xent_max(p, logits, shard, V, &m));
  if (tp > 1) TPR_CHECK(tpr_pb_all_reduce(p, m, axis, tp, 1 /* max */, &m));
  TPR_CHECK(tpr_pb_xent_sumexp(p, logits, m, shard, V, &se));
  if (tp > 1) TPR_CHECK(tpr_pb_all_reduce(p, se, axis, tp, 0 /* sum */, &se));
  TPR_CHECK(tpr_pb_xent_target(p, logits, targets, shard, V, &tg));
  if (tp > 1) TPR_CHECK(tpr_pb_all_reduce(p, tg, axis, tp, 0 /* sum */, &tg));
  return tpr_pb_xent_loss(p, se, m, tg, targets, loss);
}

tpr_status tpr_build_moe_aux_loss(tpr_program *p, const tpr_value_id *router_logits, int n_layers, int k,
                                  tpr_value_id *loss) {
  if (n_layers < 1 || !router_logits)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe aux loss: needs at least one layer's router logits, got %d", n_layers);
  tpr_value_id sum = -1;
  int64_t rows = 0, E = -1;
  for (int l = 0; l < n_layers; l++) {
    tpr_tensor d;
    TPR_CHECK(tpr_program_value(p, router_logits[l], &d));
    if (d.ndim != 2)
      return TPR_FAIL(TPR_ERR_SHAPE, "moe aux loss: layer %d router logits must be (T, E), got %d-D", l, d.ndim);
    if (E >= 0 && d.shape[1] != E)
      return TPR_FAIL(TPR_ERR_SHAPE, "moe aux loss: layer %d has %lld experts, layer 0 has %lld", l,
                      (long long)d.shape[1], (long long)E);
    E = d.shape[1];
    rows += d.shape[0];
    tpr_value_id st;
    TPR_CHECK(tpr_pb_moe_aux_stats(p, router_logits[l], k, &st));
    if (sum < 0)
      sum = st;
    else
      TPR_CHECK(tpr_pb_add(p, sum, st, &sum));
  }
  return tpr_pb_moe_aux_loss(p, sum, rows, loss);
}
