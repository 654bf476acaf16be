#include "moe.h"

#include <math.h>
#include <string.h>

#include "runtime/program/autodiff.h"
#include "shard/mesh.h"

const char *tpr_moe_dispatch_name(tpr_moe_dispatch d) {
  switch (d) {
    case TPR_MOE_DISPATCH_AUTO: return "auto";
    case TPR_MOE_DISPATCH_ALLTOALL: return "alltoall";
    case TPR_MOE_DISPATCH_ALLREDUCE: return "allreduce";
  }
  return "?";
}

bool tpr_moe_dispatch_parse(const char *s, tpr_moe_dispatch *out) {
  for (int d = TPR_MOE_DISPATCH_AUTO; d <= TPR_MOE_DISPATCH_ALLREDUCE; d++)
    if (s && strcmp(s, tpr_moe_dispatch_name((tpr_moe_dispatch)d)) == 0) {
      *out = (tpr_moe_dispatch)d;
      return true;
    }
  return false;
}

tpr_moe_dispatch tpr_moe_dispatch_resolve(tpr_moe_dispatch d, const tpr_shard_plan *plan) {
  if (d != TPR_MOE_DISPATCH_AUTO) return d;
  // allreduce needs every rank to hold the same tokens: dp = 1.
  return plan->ep > 1 || plan->dp > 1 ? TPR_MOE_DISPATCH_ALLTOALL : TPR_MOE_DISPATCH_ALLREDUCE;
}

tpr_status tpr_moe_opts_check(const tpr_moe_opts *o, const tpr_shard_plan *plan) {
  if (!(o->capacity_factor >= 0) || isinf(o->capacity_factor))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--capacity-factor %g: must be a finite number > 0", o->capacity_factor);
  if (o->reroute_dropped && o->capacity_factor == 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--reroute-dropped needs --capacity-factor (dropless routing drops nothing)");
  if (tpr_moe_dispatch_resolve(o->dispatch, plan) == TPR_MOE_DISPATCH_ALLREDUCE && plan->dp != 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG,
                    "--moe-dispatch allreduce needs every rank to hold the same tokens (dp = 1), but dp = %d; "
                    "use --moe-dispatch alltoall",
                    plan->dp);
  return TPR_OK;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Training: x (replicated over the group of `axis`) enters rank-local
// compute; its cotangent is summed over that group (runtime/program/autodiff.h).
static tpr_status mark(tpr_program *p, const tpr_moe_opts *o, tpr_value_id *x, tpr_mesh_axis axis, int n) {
  if (!o->mark_grads || n == 1) return TPR_OK;
  return tpr_pb_grad_all_reduce(p, *x, axis, n, x);
}

// x (T, H), gates (T, E) -> (T, H): this rank's experts on every token,
// summed over the expert groups.
static tpr_status allreduce_path(tpr_program *p, const tpr_shard_plan *plan, const tpr_moe_opts *o,
                                 tpr_value_id rank, tpr_value_id x, tpr_value_id g, tpr_value_id w13, tpr_value_id w2,
                                 tpr_value_id *out) {
  int64_t T, E = plan->config.num_experts, Er = plan->experts_per_rank;
  // The partial outputs are summed over ep, then etp: the same groups sum
  // the inputs' cotangents.
  TPR_CHECK(mark(p, o, &x, TPR_AXIS_EP, plan->ep));
  TPR_CHECK(mark(p, o, &x, TPR_AXIS_ETP, plan->etp));
  TPR_CHECK(mark(p, o, &g, TPR_AXIS_EP, plan->ep));
  TPR_CHECK(mark(p, o, &g, TPR_AXIS_ETP, plan->etp));
  tpr_tensor d;
  TPR_CHECK(tpr_program_value(p, x, &d));
  T = d.shape[0];
  tpr_value_id gl = g, y;
  if (plan->ep > 1) {  // gates' column block ep_rank: (T, ep, Er)[:, ep_rank] -> (T, Er)
    tpr_value_id rank_ep, g3;
    TPR_CHECK(tpr_pb_rank_index(p, rank, TPR_RANK_EP, &rank_ep));
    TPR_CHECK(tpr_pb_reshape(p, g, 3, (const int64_t[]){T, plan->ep, Er}, &g3));
    TPR_CHECK(tpr_pb_index_select(p, g3, 1, rank_ep, &g3));  // (T, 1, Er)
    TPR_CHECK(tpr_pb_reshape(p, g3, 2, (const int64_t[]){T, Er}, &gl));
  } else if (Er != E) {
    return TPR_FAIL(TPR_ERR_INTERNAL, "moe: ep = 1 but %lld of %lld experts per rank", (long long)Er, (long long)E);
  }
  if (o->fp8_block > 0)
    TPR_CHECK(tpr_pb_moe_experts_fp8(p, x, gl, &(tpr_fp8_experts){w13, w2, o->s13, o->s2, o->fp8_block}, &y));
  else
    TPR_CHECK(tpr_pb_moe_experts(p, x, gl, w13, w2, &y));  // (T, H) partial over ep and etp
  if (plan->ep > 1) TPR_CHECK(tpr_pb_all_reduce(p, y, TPR_AXIS_EP, plan->ep, 0, &y));
  if (plan->etp > 1) TPR_CHECK(tpr_pb_all_reduce(p, y, TPR_AXIS_ETP, plan->etp, 0, &y));
  *out = y;
  return TPR_OK;
}

static tpr_status alltoall_path(tpr_program *p, const tpr_shard_plan *plan, const tpr_moe_opts *o,
                                tpr_value_id rank, tpr_value_id x, tpr_value_id g, tpr_value_id w13, tpr_value_id w2,
                                tpr_value_id *out, tpr_moe_values *v) {
  const int tp = plan->tp, ep = plan->ep, etp = plan->etp;
  const int64_t E = plan->config.num_experts, Er = plan->experts_per_rank, k = plan->config.experts_per_tok;
  tpr_tensor d;
  TPR_CHECK(tpr_program_value(p, x, &d));
  const int64_t T = d.shape[0], Ts = (T + tp - 1) / tp, N = etp * Ts;
  const int64_t send_rows = N * min64(k, E), recv_rows = ep * N * min64(k, Er);
  tpr_value_id xs = x, gs = g, counts, recv_counts, send, recv, y, back, ys;
  if (tp > 1) {  // tp peers hold the same tokens: each takes its own slice
    tpr_value_id rank_tp;
    TPR_CHECK(mark(p, o, &x, TPR_AXIS_TP, tp));
    TPR_CHECK(mark(p, o, &g, TPR_AXIS_TP, tp));
    TPR_CHECK(tpr_pb_rank_index(p, rank, TPR_RANK_TP, &rank_tp));
    TPR_CHECK(tpr_pb_row_slice(p, x, rank_tp, tp, &xs));  // (Ts, H)
    TPR_CHECK(tpr_pb_row_slice(p, g, rank_tp, tp, &gs));  // (Ts, E)
  }
  if (etp > 1) {  // every F slice of an expert must see the same tokens
    TPR_CHECK(tpr_pb_all_gather(p, xs, TPR_AXIS_ETP, etp, &xs));  // (N, H)
    TPR_CHECK(tpr_pb_all_gather(p, gs, TPR_AXIS_ETP, etp, &gs));  // (N, E)
    // Gathered, they are replicated over etp and feed each rank's F slice.
    TPR_CHECK(mark(p, o, &xs, TPR_AXIS_ETP, etp));
    TPR_CHECK(mark(p, o, &gs, TPR_AXIS_ETP, etp));
  }
  TPR_CHECK(tpr_pb_moe_counts(p, gs, &counts));  // (E) i32
  TPR_CHECK(tpr_pb_moe_permute(p, xs, gs, send_rows, &send));
  if (ep > 1) {
    TPR_CHECK(tpr_pb_all_to_all(p, counts, TPR_AXIS_EP, ep, &recv_counts));  // (ep, Er) flattened
    TPR_CHECK(tpr_pb_all_to_allv(p, send, counts, recv_counts, TPR_AXIS_EP, ep, recv_rows, &recv));
  } else {
    recv_counts = counts, recv = send;
  }
  v->send_counts = counts, v->recv_counts = recv_counts;
  if (o->fp8_block > 0)
    TPR_CHECK(tpr_pb_moe_grouped_ffn_fp8(p, recv, recv_counts, &(tpr_fp8_experts){w13, w2, o->s13, o->s2, o->fp8_block},
                                         &y));
  else
    TPR_CHECK(tpr_pb_moe_grouped_ffn(p, recv, recv_counts, w13, w2, &y));
  if (ep > 1)
    TPR_CHECK(tpr_pb_all_to_allv(p, y, recv_counts, counts, TPR_AXIS_EP, ep, send_rows, &back));
  else
    back = y;
  TPR_CHECK(tpr_pb_moe_unpermute(p, back, gs, &ys));  // (N, H)
  if (etp > 1) TPR_CHECK(tpr_pb_reduce_scatter(p, ys, TPR_AXIS_ETP, etp, 0, &ys));  // (Ts, H)
  if (tp > 1) {
    TPR_CHECK(tpr_pb_all_gather(p, ys, TPR_AXIS_TP, tp, &ys));  // (tp*Ts, H)
    if (tp * Ts != T) TPR_CHECK(tpr_pb_slice(p, ys, 0, 0, T, &ys));
  }
  *out = ys;
  return TPR_OK;
}

tpr_status tpr_moe_capacity_gates(tpr_program *p, const tpr_moe_opts *o, int64_t top_k, int64_t layer,
                                  tpr_value_id gates, tpr_value_id *out) {
  uint64_t seed = o->seed ^ ((uint64_t)(layer + 1) * 0x9e3779b97f4a7c15ull);  // a stream per layer
  tpr_value_id c;
  TPR_CHECK(tpr_pb_moe_capacity(p, gates, top_k, (float)o->capacity_factor, o->reroute_dropped, seed, &c));
  if (!o->reroute_dropped || !o->reroute_own_prob) return *out = c, TPR_OK;
  tpr_tensor d;
  TPR_CHECK(tpr_program_value(p, c, &d));
  const int64_t T = d.shape[0], E = d.shape[1];
  tpr_value_id c1, cc, like, one, ind, kept, a, b, nb, sum;
  tpr_op_attrs one_at = {.n_f = 1, .f = {1.0f}}, neg = {.n_f = 1, .f = {-1.0f}};
  TPR_CHECK(tpr_pb_reshape(p, c, 2, (const int64_t[]){T * E, 1}, &c1));  // one element per row
  TPR_CHECK(tpr_pb_mul(p, c1, c1, &cc));
  TPR_CHECK(tpr_pb_slice(p, c1, 0, 0, 1, &like));  // (1, 1) -> (1): a shape to fill
  TPR_CHECK(tpr_pb_reshape(p, like, 1, (const int64_t[]){1}, &like));
  TPR_CHECK(tpr_program_op(p, TPR_OP_FILL, &like, 1, &one_at, &one));
  TPR_CHECK(tpr_pb_rms_scale(p, c1, cc, one, 1.0f, 1e-30f, &ind));  // c / |c|: 1 or 0
  TPR_CHECK(tpr_pb_reshape(p, ind, 2, (const int64_t[]){T, E}, &ind));
  TPR_CHECK(tpr_pb_mul(p, c, o->chosen, &kept));  // (T, E) kept gates
  TPR_CHECK(tpr_pb_mul(p, ind, o->probs, &a));     // probs wherever c routes
  TPR_CHECK(tpr_pb_mul(p, a, o->chosen, &b));      // ... where the router chose: not re-routed
  TPR_CHECK(tpr_program_op(p, TPR_OP_SCALE, &b, 1, &neg, &nb));
  TPR_CHECK(tpr_pb_add(p, kept, a, &sum));
  return tpr_pb_add(p, sum, nb, out);
}

tpr_status tpr_moe_build(tpr_program *p, const tpr_shard_plan *plan, const tpr_moe_opts *o, int64_t layer,
                         tpr_value_id rank, tpr_value_id x, tpr_value_id router_gates, tpr_value_id w13,
                         tpr_value_id w2, tpr_value_id *out, tpr_moe_values *v) {
  TPR_CHECK(tpr_moe_opts_check(o, plan));
  tpr_moe_values unused;
  if (!v) v = &unused;
  *v = (tpr_moe_values){-1, -1, -1};
  tpr_value_id g = router_gates;
  if (o->capacity_factor > 0) TPR_CHECK(tpr_moe_capacity_gates(p, o, plan->config.experts_per_tok, layer, g, &g));
  v->gates = g;
  if (tpr_moe_dispatch_resolve(o->dispatch, plan) == TPR_MOE_DISPATCH_ALLTOALL)
    return alltoall_path(p, plan, o, rank, x, g, w13, w2, out, v);
  return allreduce_path(p, plan, o, rank, x, g, w13, w2, out);
}
