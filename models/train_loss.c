// The training head of every family's training program (models/train_loss.h)
// and MiniMax-M2's use of it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/train_loss.h"
#include "models/family.h"

#include "minimax_m2_impl.h"
#include "runtime/program/autodiff.h"
#include "runtime/program/loss.h"
#include "shard/mesh.h"

// Which params train: every f32 param (or bf16 FSDP chunk) except the
// routing-correction bias (transformers keeps it as a buffer: it selects experts and gets no
// gradient; the aux-loss-free update moves it instead).
static bool trained(const tpr_program *p, tpr_value_id v) {
  tpr_tensor d;
  if (tpr_program_value_kind(p, v) != TPR_VALUE_PARAM || tpr_program_value(p, v, &d) != TPR_OK) return false;
  const char *name = tpr_program_value_name(p, v);
  return (d.dtype == TPR_F32 || d.dtype == TPR_BF16) && !strstr(name, "e_score_correction_bias") &&
         strncmp(name, TPR_FAMILY_CONST_PREFIX, strlen(TPR_FAMILY_CONST_PREFIX)) != 0;  // slopes, zero state, ...
}

static tpr_status backward(tpr_program *p, const char *fam, tpr_value_id rank, tpr_value_id rank_tp, tpr_value_id loss) {
  int nv = tpr_program_num_values(p), n = 0;
  tpr_value_id *wrt = malloc((size_t)nv * sizeof *wrt), *grads = malloc((size_t)nv * sizeof *grads);
  tpr_status rc = wrt && grads ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "%s: backward lists", fam);
  for (int v = 0; rc == TPR_OK && v < nv; v++)
    if (trained(p, v)) wrt[n++] = v;
  tpr_backward_opts bo;
  tpr_backward_opts_init(&bo);
  bo.axis_rank[TPR_AXIS_TP] = rank_tp;
  const struct { tpr_mesh_axis axis; tpr_rank_slot slot; } axes[] = {
      {TPR_AXIS_DP, TPR_RANK_DP}, {TPR_AXIS_EP, TPR_RANK_EP}, {TPR_AXIS_ETP, TPR_RANK_ETP}, {TPR_AXIS_EDP, TPR_RANK_EDP}};
  for (size_t i = 0; rc == TPR_OK && i < sizeof axes / sizeof *axes; i++)
    rc = tpr_pb_rank_index(p, rank, axes[i].slot, &bo.axis_rank[axes[i].axis]);
  if (rc == TPR_OK) rc = tpr_program_build_backward(p, loss, wrt, n, &bo, grads);
  for (int i = 0; rc == TPR_OK && i < n; i++) {
    const char *name = tpr_program_value_name(p, wrt[i]);
    if (grads[i] < 0) {
      rc = TPR_FAIL(TPR_ERR_INTERNAL, "%s: the loss does not depend on %s", fam, name);
      break;
    }
    char out[192];
    snprintf(out, sizeof out, "%s%s", TPR_TRAIN_GRAD_PREFIX, name);
    rc = tpr_program_output(p, grads[i], out);
  }
  free(wrt);
  free(grads);
  return rc;
}

tpr_status tpr_train_build_loss(tpr_program *p, const tpr_shard_plan *plan, const tpr_train_loss_opts *o,
                                tpr_value_id rank, tpr_value_id rank_tp, tpr_value_id x, tpr_value_id head,
                                const tpr_value_id *router_logits, int n_router) {
  const tpr_model_config *cfg = &plan->config;
  int tp = plan->tp;
  tpr_value_id targets, loss_scale, logits, ce, aux, scaled, loss, seed;
  TPR_CHECK(tpr_program_input(p, "targets", TPR_I32, 1, (const int64_t[]){o->tokens}, &targets));
  TPR_CHECK(tpr_program_input(p, "loss_scale", TPR_F32, 1, (const int64_t[]){1}, &loss_scale));
  if (tp > 1 && !o->skip_head_mark)  // the vocab-parallel head is rank-local
    TPR_CHECK(tpr_pb_grad_all_reduce(p, x, TPR_AXIS_TP, tp, &x));
  TPR_CHECK(tpr_pb_matmul(p, x, head, false, true, &logits));  // (T, V'/tp)
  TPR_CHECK(tpr_build_vocab_parallel_xent(p, logits, targets, rank_tp, cfg->vocab_size, TPR_AXIS_TP, tp, &ce));
  if (n_router > 0) {
    TPR_CHECK(tpr_build_moe_aux_loss(p, router_logits, n_router, (int)cfg->experts_per_tok, &aux));
    TPR_CHECK(tpr_pb_scale(p, aux, (float)o->aux_coef, &scaled));
  } else {
    // A dense model routes nothing: aux is 0 (0 * ce, an op the outputs can
    // name), and loss = ce + 0 is ce exactly, its cotangent ce's.
    TPR_CHECK(tpr_pb_scale(p, ce, 0.0f, &aux));
    TPR_CHECK(tpr_pb_scale(p, aux, 1.0f, &scaled));
  }
  TPR_CHECK(tpr_pb_add(p, ce, scaled, &loss));
  TPR_CHECK(tpr_program_output(p, loss, "loss"));
  TPR_CHECK(tpr_program_output(p, ce, "ce"));
  TPR_CHECK(tpr_program_output(p, aux, "aux"));
  // The backward starts from loss * loss_scale: a per-rank weight applied
  // before any gradient reduction (FSDP reduce-scatters inside the program).
  TPR_CHECK(tpr_pb_mul(p, loss, loss_scale, &seed));
  return backward(p, o->family ? o->family : "train", rank, rank_tp, seed);
}

tpr_status tpr__m2_build_loss(tpr_program *p, const tpr_shard_plan *plan, const tpr_m2_build_opts *o,
                              tpr_value_id rank, tpr_value_id rank_tp, tpr_value_id x, tpr_value_id head,
                              const tpr_value_id *router_logits) {
  tpr_train_loss_opts lo = {.tokens = o->tokens,
                            .aux_coef = o->aux_coef,
                            .skip_head_mark = (o->skip_grad_marks & TPR_M2_MARKS_COLUMN) != 0,
                            .family = "minimax_m2"};
  return tpr_train_build_loss(p, plan, &lo, rank, rank_tp, x, head, router_logits, (int)plan->config.num_layers);
}
