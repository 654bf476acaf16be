// The steps of a training state on its gradients: one sequence's forward +
// backward accumulated, the fold of copied heads and the mean over the dp
// replicas, the global norm, and the routing-bias update.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/train_loss.h"
#include "shard/unshard.h"
#include "train/state_impl.h"

tpr_status tpr_train_update_bias(tpr_train_state *t, double rate) {
  int64_t layers = t->cfg->num_layers, E = t->cfg->num_experts, n = layers * E;
  // Every tp rank of a replica routed the same tokens: sum the world, divide by tp.
  TPR_CHECK(tpr_comm_all_reduce(t->world, t->load, t->load, (size_t)n, TPR_I64, TPR_SUM));
  for (int i = t->n_trained; i < t->n_params; i++) {  // the frozen params: the routing biases
    const piece *pc = &t->params[i].pieces[0];
    float *bias = t->params[i].pub.data;
    const int64_t *load = t->load + pc->layer * E;
    double mean = 0;
    for (int64_t e = 0; e < E; e++) mean += (double)load[e] / t->plan->tp;
    mean /= (double)E;
    for (int64_t e = 0; e < E; e++) {
      double l = (double)load[e] / t->plan->tp;
      bias[e] += (float)(rate * (l < mean ? 1 : l > mean ? -1 : 0));
    }
  }
  memset(t->load, 0, (size_t)n * sizeof *t->load);
  return TPR_OK;
}

// The first sequence of a step writes the accumulators instead of adding to
// them, so clearing them is free (no pass over every gradient).
void tpr_train_zero_grads(tpr_train_state *t) {
  for (int i = 0; i < t->n_trained; i++) t->params[i].pub.grad = t->params[i].grad_own;
  t->fresh = true;
  tpr_exec_comm_reset(t->exec);
}

void tpr_train_params_updated(tpr_train_state *t) {
  if (t->o.fsdp.on) tpr__train_fsdp_refresh(t);
}

// grad (+)= w * g, n elements, over the OpenMP threads.
static void accumulate(float *grad, const float *g, int64_t n, float w, bool first) {
  if (first) {
#pragma omp parallel for simd schedule(static)
    for (int64_t j = 0; j < n; j++) grad[j] = w * g[j];
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t j = 0; j < n; j++) grad[j] += w * g[j];
  }
}

static tpr_status read_scalar(tpr_exec *e, const char *name, double *out) {
  const tpr_tensor *x;
  float v;
  TPR_CHECK(tpr_exec_output(e, name, &x));
  TPR_CHECK(tpr_tensor_to_host(x, &v, sizeof v));
  *out = v;
  return TPR_OK;
}

static tpr_status check_ids(const int32_t *ids, int64_t T, int64_t V, bool targets) {
  for (int64_t i = 0; i < T; i++)
    if ((ids[i] < 0 || ids[i] >= V) && !(targets && ids[i] == -100))
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: %s id %d at position %lld is outside the vocabulary [0, %lld)%s",
                      targets ? "target" : "token", ids[i], (long long)i, (long long)V,
                      targets ? " (and is not the ignore index -100)" : "");
  return TPR_OK;
}

// The gradients read in place (a pub.grad pointing into the program's
// outputs, not at its grad_own) copied into the params' own accumulators:
// before the program runs again and overwrites them.
static void grads_to_own(tpr_train_state *t) {
  for (int i = 0; i < t->n_trained; i++) {
    tpr_train_param *p = &t->params[i].pub;
    if (p->grad == t->params[i].grad_own) continue;
    accumulate(t->params[i].grad_own, p->grad, p->numel, 1.0f, true);
    p->grad = t->params[i].grad_own;
  }
}

// Whether the program's gradient outputs can serve as this step's gradients
// where they lie: f32, contiguous, one per param at its size, no two
// overlapping (the steps after the sequence fold, reduce and scale them in
// place). Not under FSDP, whose chunks are copied out of them.
static bool grads_readable_in_place(tpr_train_state *t, const tpr_tensor *const *g) {
  if (t->o.fsdp.on) return false;
  for (int i = 0; i < t->n_trained; i++)
    if (g[i]->dtype != TPR_F32 || !tpr_tensor_is_contiguous(g[i]) || tpr_tensor_numel(g[i]) != t->params[i].pub.numel)
      return false;
  for (int i = 0; i < t->n_trained; i++)
    for (int j = i + 1; j < t->n_trained; j++) {
      const char *a = tpr_tensor_data(g[i]), *b = tpr_tensor_data(g[j]);
      if (a < b + tpr_tensor_nbytes(g[j]) && b < a + tpr_tensor_nbytes(g[i])) return false;
    }
  return true;
}

// One run of the program on a sequence, its losses read out.
static tpr_status run_sequence(tpr_train_state *t, const int32_t *inputs, const int32_t *targets, float loss_scale,
                               tpr_losses *out) {
  int64_t T = t->o.seq_len;
  TPR_CHECK(check_ids(inputs, T, t->cfg->vocab_size, false));
  TPR_CHECK(check_ids(targets, T, t->cfg->vocab_size, true));
  if (t->o.pack) TPR_CHECK(tpr__train_bind_pack(t, inputs, targets, &targets));  // EOS inputs' targets -100
  TPR_CHECK(tpr_tensor_from_host(t->tokens, inputs, (size_t)T * sizeof *inputs));
  TPR_CHECK(tpr_tensor_from_host(t->targets, targets, (size_t)T * sizeof *targets));
  TPR_CHECK(tpr_tensor_from_host(t->loss_scale, &loss_scale, sizeof loss_scale));
  TPR_CHECK(tpr_exec_run(t->exec));
  t->runs++;
  if (out) {
    TPR_CHECK(read_scalar(t->exec, "loss", &out->loss));
    TPR_CHECK(read_scalar(t->exec, "ce", &out->ce));
    TPR_CHECK(read_scalar(t->exec, "aux", &out->aux));
  }
  return TPR_OK;
}

tpr_status tpr_train_eval_sequence(tpr_train_state *t, const int32_t *inputs, const int32_t *targets,
                                   tpr_losses *out) {
  grads_to_own(t);
  return run_sequence(t, inputs, targets, 1.0f, out);
}

tpr_status tpr_train_sequence(tpr_train_state *t, const int32_t *inputs, const int32_t *targets, double weight,
                              tpr_losses *out) {
  return tpr_train_sequence_scaled(t, inputs, targets, 1.0, weight, out);
}

// The step's first sequence leaves its gradients where the program wrote
// them (scaled in place by `weight`), and pub.grad points there: copying
// them out was a pass over every gradient, ~5% of a step at the small
// config. A second sequence copies them out first and accumulates.
tpr_status tpr_train_sequence_scaled(tpr_train_state *t, const int32_t *inputs, const int32_t *targets,
                                     double loss_scale, double weight, tpr_losses *out) {
  grads_to_own(t);
  TPR_CHECK(run_sequence(t, inputs, targets, (float)loss_scale, out));
  int64_t E = t->cfg->num_experts;
  for (int64_t L = 0; L < t->cfg->num_layers; L++) {
    if (!tpr_model_config_layer_is_moe(t->cfg, L)) continue;  // dense layers route nothing
    char name[64];
    const tpr_tensor *x;
    snprintf(name, sizeof name, "moe_load.%lld", (long long)L);
    TPR_CHECK(tpr_exec_output(t->exec, name, &x));
    const int32_t *c = tpr_tensor_data(x);
    for (int64_t e = 0; e < E; e++) t->load[L * E + e] += c[e];
  }
  float w = (float)weight;
  const tpr_tensor **g = malloc((size_t)(t->n_trained + 1) * sizeof *g);
  if (!g) return TPR_FAIL(TPR_ERR_OOM, "train: gradient outputs");
  tpr_status rc = TPR_OK;
  for (int i = 0; i < t->n_trained && rc == TPR_OK; i++) {
    char name[192];
    snprintf(name, sizeof name, "%s%s", TPR_TRAIN_GRAD_PREFIX, t->params[i].pub.name);
    rc = tpr_exec_output(t->exec, name, &g[i]);
  }
  const bool in_place = rc == TPR_OK && t->fresh && grads_readable_in_place(t, g);
  for (int i = 0; i < t->n_trained && rc == TPR_OK; i++) {
    tpr_train_param *p = &t->params[i].pub;
    float *d = tpr_tensor_data(g[i]);
    if (!in_place) {
      accumulate(p->grad, d, p->numel, w, t->fresh);
      continue;
    }
    if (w != 1.0f) accumulate(d, d, p->numel, w, true);
    p->grad = d;
  }
  free(g);
  TPR_CHECK(rc);
  t->fresh = false;
  return TPR_OK;
}

// The tp all-gather of a copied head uses t->gather: g must not live there.
tpr_status tpr__train_fold_param(tpr_train_state *t, int i, float *grad) {
  const tpr_shard_plan *pl = t->plan;
  for (int j = 0; j < t->params[i].n_pieces; j++) {
    const piece *pc = &t->params[i].pieces[j];
    const tpr_shard_tensor *k = &pl->tensors[pc->kind];
    float *g = grad + pc->offset;
    const float *all = NULL;
    if (tpr_unshard_fold_needs_gather(pl, k)) {
      tpr_comm_t tp = tpr__session_axis(t->s, TPR_AXIS_TP);
      TPR_CHECK(tpr_comm_all_gather(tp, g, t->gather, (size_t)tpr__kind_numel(k), TPR_F32));
      all = t->gather;
    }
    tpr_unshard_fold_grad(pl, k, t->mesh->tp_rank, g, all);
  }
  return TPR_OK;
}

tpr_status tpr_train_reduce_grads(tpr_train_state *t) {
  if (t->fresh)  // no sequence ran this step: the gradient is zero
    for (int i = 0; i < t->n_trained; i++) memset(t->params[i].pub.grad, 0, (size_t)t->params[i].pub.numel * sizeof(float));
  if (t->o.fsdp.on) return tpr__train_fsdp_reduce(t);
  for (int i = 0; i < t->n_trained; i++) TPR_CHECK(tpr__train_fold_param(t, i, t->params[i].pub.grad));
  const tpr_shard_plan *pl = t->plan;
  // Dense params: each replica has d L_d / dW; the mean over replicas.
  // Experts under the alltoall dispatcher: each edp copy saw only the tokens
  // routed through its ep group (tp peers take disjoint slices), so the
  // copies' gradients are summed, then divided by the replicas. Under the
  // allreduce dispatcher (dp = 1) every copy saw every token: nothing to do.
  tpr_moe_dispatch dispatch = tpr_moe_dispatch_resolve(tpr__session_opts(t->s)->moe.dispatch, pl);
  bool split_experts = dispatch == TPR_MOE_DISPATCH_ALLTOALL;
  float inv = 1.0f / (float)pl->dp;
  for (int i = 0; i < t->n_trained; i++) {
    tpr_train_param *p = &t->params[i].pub;
    bool expert = t->params[i].expert;
    int n = expert ? (split_experts ? pl->edp : 1) : pl->dp;
    if (n > 1) {
      tpr_comm_t c = tpr__session_axis(t->s, expert ? TPR_AXIS_EDP : TPR_AXIS_DP);
      TPR_CHECK(tpr_comm_all_reduce(c, p->grad, p->grad, (size_t)p->numel, TPR_F32, TPR_SUM));
    }
    if (pl->dp > 1)
      for (int64_t j = 0; j < p->numel; j++) p->grad[j] *= inv;
  }
  return TPR_OK;
}

tpr_status tpr_train_grad_sumsq(tpr_train_state *t, double *out) {
  double sum = 0;
  if (t->o.fsdp.on)
    sum = tpr__train_fsdp_sumsq(t);
  else
    for (int i = 0; i < t->n_trained; i++)
      for (int j = 0; j < t->params[i].n_pieces; j++) {
        const piece *pc = &t->params[i].pieces[j];
        sum += tpr_unshard_sumsq(t->plan, &t->plan->tensors[pc->kind], t->mesh, t->params[i].pub.grad + pc->offset);
      }
  // The ranks' doubles are gathered bit for bit (the collectives have no f64)
  // and added in rank order: the same exact total on every rank.
  int world = t->plan->world;
  int64_t bits, *all = malloc((size_t)world * sizeof *all);
  if (!all) return TPR_FAIL(TPR_ERR_OOM, "grad norm");
  memcpy(&bits, &sum, sizeof bits);
  tpr_status rc = tpr_comm_all_gather(t->world, &bits, all, 1, TPR_I64);
  double total = 0;
  for (int r = 0; rc == TPR_OK && r < world; r++) {
    double v;
    memcpy(&v, &all[r], sizeof v);
    total += v;
  }
  free(all);
  *out = total;
  return rc;
}
