// Training losses as program ops (ops.h, "Vocab-parallel cross-entropy" and
// "MoE auxiliary"): builder shorthands and the two compositions a model
// builder emits. Backward rules exist for every op on the loss path
// (runtime/grad/loss.c), so tpr_program_build_backward goes through them.
#ifndef TPR_LOSS_H
#define TPR_LOSS_H

#include "program.h"

// logits (T, Vl) f32 (this rank's vocab columns [shard*Vl, shard*Vl + Vl)),
// shard (1) i32/i64 read at run time, V the real vocabulary: columns >= V are
// padding and never count. out (T, 1) f32.
tpr_status tpr_pb_xent_max(tpr_program *p, tpr_value_id logits, tpr_value_id shard, int64_t V, tpr_value_id *out);
// max (T, 1): the GLOBAL max (all-reduced). out (T, 1) = sum exp(l - max).
tpr_status tpr_pb_xent_sumexp(tpr_program *p, tpr_value_id logits, tpr_value_id max, tpr_value_id shard, int64_t V,
                              tpr_value_id *out);
// targets (T) i32/i64 in [0, V) or -100 (ignored). out (T, 1): the target's
// logit where this shard owns it, else 0.
tpr_status tpr_pb_xent_target(tpr_program *p, tpr_value_id logits, tpr_value_id targets, tpr_value_id shard,
                              int64_t V, tpr_value_id *out);
// sumexp, max, target (T, 1) global (all-reduced); out (1) = mean over
// targets != -100 of log(sumexp) + max - target, 0 when all are ignored.
tpr_status tpr_pb_xent_loss(tpr_program *p, tpr_value_id sumexp, tpr_value_id max, tpr_value_id target,
                            tpr_value_id targets, tpr_value_id *out);

// Megatron's vocab-parallel cross-entropy over the tp group on `axis`:
//   m  = all_reduce_max(xent_max(logits))
//   se = all_reduce_sum(xent_sumexp(logits, m))
//   tg = all_reduce_sum(xent_target(logits, targets))
//   loss = xent_loss(se, m, tg, targets)          (1) f32, replicated
// With tp == 1 the all-reduces are left out. The max gets no gradient (it
// cancels analytically), so the max all-reduce needs no backward; the sum
// all-reduces' backward is the identity (Megatron's g), which hands each
// rank's logits exactly its own part of the gradient. 1 <= V <= tp*Vl.
tpr_status tpr_build_vocab_parallel_xent(tpr_program *p, tpr_value_id logits, tpr_value_id targets,
                                         tpr_value_id shard, int64_t V, tpr_mesh_axis axis, int tp,
                                         tpr_value_id *loss);

// One layer's router logits (T, E) f32 -> stats (2, E) = [top-k counts;
// summed softmax probabilities]; 1 <= k <= E.
tpr_status tpr_pb_moe_aux_stats(tpr_program *p, tpr_value_id router_logits, int k, tpr_value_id *out);
// stats (2, E) summed over layers, n_rows = N router rows over all layers;
// out (1) = E * sum_e counts_e * probsum_e / N^2.
tpr_status tpr_pb_moe_aux_loss(tpr_program *p, tpr_value_id stats, int64_t n_rows, tpr_value_id *out);

// transformers' load_balancing_loss_func (MiniMaxM2ForCausalLM, no
// attention mask) over n_layers router logits (T_l, E) (the raw gate
// outputs, before any sigmoid or correction bias): per layer stats, added,
// then the loss with N = sum T_l. The result is unscaled: multiply by
// router_aux_loss_coef (tpr_pb_scale) before adding it to the LM loss.
tpr_status tpr_build_moe_aux_loss(tpr_program *p, const tpr_value_id *router_logits, int n_layers, int k,
                                  tpr_value_id *loss);

#endif
