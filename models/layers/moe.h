// The MoE block on the folded mesh (docs/architecture.md sections 4 and 5): tokens come
// from attention on (dp, tp), replicated over the tp group; experts live on
// (edp, ep, etp), in contiguous blocks of experts_per_rank over ep, each
// expert's intermediate dim split over etp. Two dispatchers give the same
// result:
//
// alltoall (default when ep > 1 or dp > 1), per rank:
//   xs, gs = row_slice(x, g, tp_rank)          (Ts, H), (Ts, E)  Ts = ceil(T/tp):
//                                              tp peers take disjoint slices, no token routed twice
//   xs, gs = all_gather_etp(xs, gs)            (N, .)  N = etp*Ts: every etp slice of an
//                                              expert sees the same tokens
//   counts = moe_counts(gs)                    (E) i32 rows for each expert
//   recv_counts = all_to_all_ep(counts)        (E) = (ep source, Er)
//   send = moe_permute(xs, gs)                 (N*min(k,E), H) sorted by expert
//   recv = all_to_allv_ep(send)                (ep*N*min(k,Er), H) by (source, local expert)
//   y = moe_grouped_ffn(recv, recv_counts)     local experts, one GEMM pair each
//   back = all_to_allv_ep(y)                   reverse exchange
//   ys = moe_unpermute(back, gs)               (N, H) weighted, ascending expert order
//   ys = reduce_scatter_etp(ys)                (Ts, H) sum over the F slices
//   y = all_gather_tp(ys)[:T]                  (T, H) replicated again
//
// allreduce (--moe-dispatch allreduce; needs dp = 1 so every rank holds the
// same tokens): each rank runs its local experts (gates' column block ep_rank)
// on all T tokens with moe_experts, and the partial outputs are summed over
// ep, then etp.
//
// Capacity mode (factor > 0) rewrites the router's gates before either path
// (tpr_moe_capacity); every rank of a dense replica computes the same
// decision from the same T tokens, so results do not depend on the mesh.
//
// Buffers are sized for the worst case (every token of every ep peer routed
// here), as static program shapes must be: ep*N*min(k, Er) rows of H.
#ifndef TPR_MOE_LAYER_H
#define TPR_MOE_LAYER_H

#include "runtime/program/tpr_runtime.h"
#include "shard/shard_plan.h"

typedef enum tpr_moe_dispatch {
  TPR_MOE_DISPATCH_AUTO = 0,  // alltoall when ep > 1 or dp > 1, else allreduce
  TPR_MOE_DISPATCH_ALLTOALL = 1,
  TPR_MOE_DISPATCH_ALLREDUCE = 2,
} tpr_moe_dispatch;

const char *tpr_moe_dispatch_name(tpr_moe_dispatch d);  // "auto", "alltoall", "allreduce"
// Parses a --moe-dispatch value; false if unknown.
bool tpr_moe_dispatch_parse(const char *s, tpr_moe_dispatch *out);
// AUTO resolved for a plan.
tpr_moe_dispatch tpr_moe_dispatch_resolve(tpr_moe_dispatch d, const tpr_shard_plan *plan);

typedef struct tpr_moe_opts {
  tpr_moe_dispatch dispatch;
  double capacity_factor;  // 0: dropless
  bool reroute_dropped;    // capacity mode only
  // Re-routing's gate. false (MiniMax, the default): a re-routed assignment
  // keeps the weight it had at the expert that dropped it. true (Hunyuan,
  // Hunyuan's original top-1 gating): it takes its new expert's own router
  // probability probs[t, e']; kept assignments keep their gates either way.
  // probs (T, E): the router's softmax; chosen (T, E): 1 where the router
  // picked the expert, else 0 (router_softmax.h). Set by the family.
  bool reroute_own_prob;
  tpr_value_id probs, chosen;
  uint64_t seed;           // for re-routing; mixed with the layer index
  // Training: mark the replicated inputs where they enter rank-local expert
  // compute (grad_all_reduce over the group whose partial outputs are summed).
  bool mark_grads;
  // Inference: FP8 experts (w13, w2 f8e4m3) with per-row scales s13, s2 in
  // blocks of fp8_block columns (runtime/program/program.h, tpr_fp8_experts); 0:
  // plain f32/bf16 experts, s13 and s2 unused.
  int fp8_block;
  tpr_value_id s13, s2;
} tpr_moe_opts;

// Checks options against a plan: a dispatcher the mesh cannot run, a bad
// capacity factor, re-routing without capacity. TPR_ERR_INVALID_ARG naming
// the flag.
tpr_status tpr_moe_opts_check(const tpr_moe_opts *o, const tpr_shard_plan *plan);

// Values inside a built block that reports want (-1 where the path has none).
typedef struct tpr_moe_values {
  tpr_value_id gates;        // (T, E) the gates after capacity mode
  tpr_value_id send_counts;  // (E) i32 rows this rank sends each expert (alltoall)
  tpr_value_id recv_counts;  // (E) i32 = (ep source, Er) rows it receives (alltoall)
} tpr_moe_values;

// Capacity mode on the router's gates (T, E) as tpr_moe_build applies it
// (o->capacity_factor > 0): the seeded moe_capacity op, then, with
// reroute_own_prob, the re-routed entries' gates replaced by probs:
//   c   = moe_capacity(gates)            kept entries hold their gate, re-routed ones their origin's
//   ind = c / |c|                        1 where c routes (as w * rsqrt(w^2 + 1e-30): exact to 1e-6
//                                        for gates >= 1e-12, which softmax top-k gates are unless
//                                        the logits differ by more than ~27)
//   out = c * chosen + probs * ind * (1 - chosen)
// (a re-routed entry is one the router did not choose). layer seeds the stream.
tpr_status tpr_moe_capacity_gates(tpr_program *p, const tpr_moe_opts *o, int64_t top_k, int64_t layer,
                                  tpr_value_id gates, tpr_value_id *out);

// One MoE block. rank: the rank tensor param; x (T, H) the normalised input,
// replicated over tp; router_gates (T, E) dense combine weights;
// w13 (Er, 2Fr, H), w2 (Er, H, Fr) the local experts. out (T, H) the block's
// full output, replicated over tp; v (optional) the values statistics and
// benchmarks read. layer only seeds the re-routing.
tpr_status tpr_moe_build(tpr_program *p, const tpr_shard_plan *plan, const tpr_moe_opts *o, int64_t layer,
                         tpr_value_id rank, tpr_value_id x, tpr_value_id router_gates, tpr_value_id w13,
                         tpr_value_id w2, tpr_value_id *out, tpr_moe_values *v);

#endif
