// Training state of a session: the forward+backward program of its family
// (minimax_m2.c, or qk_head_decoder.c's training mode for qwen3_moe,
// hunyuan_v1_moe, qwen3_vl_moe and the dense qwen2_vl), the
// trained params with their gradient accumulators, and the collective steps
// on gradients (fold, dp mean, norm) and weights (export). Only the program
// and the expert kinds' names depend on the family.
#include "minimax_m2_train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/minimax_m2_impl.h"
#include "models/minimax_m2_train_impl.h"
#include "models/hunyuan_moe.h"
#include "models/qwen2_vl.h"
#include "models/qwen3_moe.h"
#include "models/qwen3_vl_moe.h"
#include "engine/session_impl.h"
#include "shard/unshard.h"

void tpr__m2_train_free(struct tpr_m2_train *t) {
  if (!t) return;
  tpr_exec_free(t->exec);
  tpr_program_free(t->program);
  tpr_tensor_free(t->tokens), tpr_tensor_free(t->targets), tpr_tensor_free(t->positions), tpr_tensor_free(t->start);
  tpr_tensor_free(t->pos3);
  for (int i = 0; i < t->n_params; i++) {
    train_param *p = &t->params[i];
    free(p->pub.grad);
    free(p->pieces);
    if (p->bound != p->master) tpr_tensor_free(p->bound);
    tpr_tensor_free(p->master);
  }
  free(t->params), free(t->host_i32), free(t->gather), free(t->load);
  free(t);
}

int tpr_m2_train_num_params(const tpr_session *s) { return s->train ? s->train->n_trained : 0; }
const tpr_m2_param *tpr_m2_train_param(const tpr_session *s, int i) { return &s->train->params[i].pub; }

static tpr_status add_param(struct tpr_m2_train *t, const char *name, float *data, int64_t numel, bool trained,
                            int n_pieces) {
  train_param *p = &t->params[t->n_params++];
  snprintf(p->name, sizeof p->name, "%s", name);
  p->pub = (tpr_m2_param){.name = p->name, .data = data, .numel = numel, .full_numel = numel, .shards = 1};
  p->full = data;
  p->trained = trained;
  p->pieces = calloc((size_t)n_pieces, sizeof *p->pieces);
  if (!p->pieces) return TPR_FAIL(TPR_ERR_OOM, "train params");
  // Under FSDP the accumulators are the chunks' (tpr__m2_fsdp_shard).
  if (trained && !t->o.fsdp.on && !(p->pub.grad = calloc((size_t)numel, sizeof(float))))
    return TPR_FAIL(TPR_ERR_OOM, "gradients");
  return TPR_OK;
}

static int find_kind(const tpr_shard_plan *p, const char *suffix) {
  for (int i = 0; i < p->n_tensors; i++)
    if (strstr(p->tensors[i].name, suffix)) return i;
  return -1;
}

// The params in a fixed order (the same on every rank): trained weights
// items, the stacked experts, then the untrained routing biases.
static tpr_status list_params(tpr_session *s, struct tpr_m2_train *t) {
  const tpr_shard_plan *pl = &s->plan;
  int64_t layers = s->cfg.num_layers, Er = pl->experts_per_rank, Fr = pl->expert_inter_per_rank, H = s->cfg.hidden_size;
  t->params = calloc((size_t)(s->weights.n + 2 * layers), sizeof *t->params);
  if (!t->params) return TPR_FAIL(TPR_ERR_OOM, "train params");
  const tpr_family *f = s->family;
  int k1 = find_kind(pl, f->expert_gate), k3 = find_kind(pl, f->expert_up), k2 = find_kind(pl, f->expert_down);
  for (int pass = 0; pass < 2; pass++) {  // trained first, then the frozen biases
    for (int64_t i = 0; i < s->weights.n; i++) {
      const tpr_load_item *it = &s->weights.items[i];
      bool trained = !strstr(it->name, "e_score_correction_bias");
      if (it->local_expert >= 0 || trained != (pass == 0)) continue;
      TPR_CHECK(add_param(t, it->name, tpr_tensor_data(s->item_tensors[i]), it->numel, trained, 1));
      train_param *p = &t->params[t->n_params - 1];
      p->pieces[p->n_pieces++] = (piece){it->kind, it->layer, -1, 0};
      p->pub.decay = pl->tensors[it->kind].ndim >= 2;
    }
    if (pass == 1) break;
    for (int64_t L = 0; L < layers; L++)
      for (int w = 0; w < 2 && s->experts[2 * L]; w++) {  // dense-MLP layers (qwen3_moe) hold no experts
        char name[160];
        tpr_family_expert_name(L, w ? "w2" : "w13", name, sizeof name);
        tpr_tensor *x = s->experts[2 * L + w];
        TPR_CHECK(add_param(t, name, tpr_tensor_data(x), tpr_tensor_numel(x), true, (int)(w ? Er : 2 * Er)));
        train_param *p = &t->params[t->n_params - 1];
        p->expert = p->pub.expert = true;
        p->pub.decay = true;
        for (int64_t e = 0; e < Er; e++)
          if (w)
            p->pieces[p->n_pieces++] = (piece){k2, L, e, e * H * Fr};
          else {
            p->pieces[p->n_pieces++] = (piece){k1, L, e, e * 2 * Fr * H};
            p->pieces[p->n_pieces++] = (piece){k3, L, e, e * 2 * Fr * H + Fr * H};
          }
      }
    t->n_trained = t->n_params;
  }
  return TPR_OK;
}

static tpr_status build_m2(const tpr_shard_plan *plan, const void *opts, tpr_program **out) {
  return tpr_m2_build(plan, opts, out);
}

// The per-head QK-norm families' training program: a descriptor and its options.
typedef struct qkhd_job {
  const tpr_qkhd_desc *d;
  tpr_qkhd_opts o;
} qkhd_job;

static tpr_status build_qkhd(const tpr_shard_plan *plan, const void *opts, tpr_program **out) {
  const qkhd_job *j = opts;
  return tpr_qkhd_build(j->d, plan, &j->o, out);
}

bool tpr_m2_train_fsdp_built(tpr_model_family f) {
  return f == TPR_FAMILY_MINIMAX_M2 || f == TPR_FAMILY_QWEN3_MOE || f == TPR_FAMILY_HUNYUAN_V1_MOE ||
         f == TPR_FAMILY_QWEN3_VL_MOE || f == TPR_FAMILY_QWEN2_VL;
}

// The family's training program: MiniMax-M2's builder, or the per-head
// QK-norm builder's training mode from the family's descriptor.
static tpr_status make_program(tpr_session *s, struct tpr_m2_train *t) {
  int64_t T = t->o.seq_len;
  double coef = t->o.aux_coef >= 0 ? t->o.aux_coef : s->cfg.router_aux_loss_coef;
  const char *fam = tpr_model_family_name(s->cfg.family);
  if (s->cfg.family == TPR_FAMILY_MINIMAX_M2) {
    tpr_m2_build_opts bo = {.tokens = T,
                            .per_rank_qk_norm = s->o.per_rank_qk_norm,
                            .moe = s->o.moe,
                            .training = true,
                            .aux_coef = coef,
                            .skip_grad_marks = s->o.skip_grad_marks,
                            .fsdp = t->o.fsdp};
    return tpr__session_make_program(s, build_m2, &bo, &t->program);
  }
  qkhd_job j = {.d = s->cfg.family == TPR_FAMILY_QWEN3_MOE        ? &tpr_qwen3_moe_desc
                     : s->cfg.family == TPR_FAMILY_HUNYUAN_V1_MOE ? &tpr_hunyuan_moe_desc
                     : s->cfg.family == TPR_FAMILY_QWEN3_VL_MOE   ? &tpr_qwen3_vl_moe_desc
                     : s->cfg.family == TPR_FAMILY_QWEN2_VL       ? &tpr_qwen2_vl_desc
                                                                  : NULL};
  if (!j.d)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "train: model family %s runs inference only; training supports "
                    "minimax_m2, qwen3_moe, hunyuan_v1_moe, qwen3_vl_moe and qwen2_vl", fam);
  // FSDP: the builder gathers every param from its chunk (family_step.c);
  // the session's chunks are family-blind (minimax_m2_fsdp.c). Families
  // added to the builder later stay refused here until tested under FSDP.
  if (t->o.fsdp.on && !tpr_m2_train_fsdp_built(s->cfg.family))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "train: FSDP is built for minimax_m2, qwen3_moe, hunyuan_v1_moe and "
                    "qwen3_vl_moe, not %s; train it with --no-fsdp (plain data parallelism)", fam);
  // transformers' HunYuanMoEV1ForCausalLM trains on the cross-entropy alone
  // (no load-balancing loss): the family's default weight is 0.
  if (t->o.aux_coef < 0 && s->cfg.family == TPR_FAMILY_HUNYUAN_V1_MOE) coef = 0;
  // A dense model (qwen2_vl) has no router: nothing to balance.
  if (!j.d->router) {
    if (t->o.aux_coef > 0)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --aux-coef %g: %s has no experts (no load-balancing loss)",
                      t->o.aux_coef, fam);
    coef = 0;
  }
  j.o = (tpr_qkhd_opts){.step = {.moe = s->o.moe},
                        // A test's control: the family's wrong QK-norm (hunyuan: the order around RoPE).
                        .qk_control = s->o.per_rank_qk_norm ? j.d->session_control : TPR_QK_CONTROL_NONE,
                        .training = true,
                        .tokens = T,
                        .aux_coef = coef,
                        .skip_grad_marks = s->o.skip_grad_marks,
                        .fsdp = t->o.fsdp};
  return tpr__session_make_program(s, build_qkhd, &j, &t->program);
}

// MRoPE families: the (3, T) rope positions, the caller's or the text rule's.
static tpr_status bind_positions_3d(tpr_session *s, struct tpr_m2_train *t) {
  int64_t T = t->o.seq_len;
  if (!s->cfg.mrope_layout) {
    if (t->o.positions_3d)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --positions-3d is for MRoPE families; %s has 1-D positions",
                      tpr_model_family_name(s->cfg.family));
    return TPR_OK;
  }
  int32_t *pos = malloc((size_t)(3 * T) * sizeof *pos);
  if (!pos) return TPR_FAIL(TPR_ERR_OOM, "train: positions_3d");
  tpr_status rc = TPR_OK;
  for (int64_t i = 0; i < 3 * T; i++) {
    pos[i] = t->o.positions_3d ? t->o.positions_3d[i] : (int32_t)(i % T);
    if (pos[i] < 0 && rc == TPR_OK)
      rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "train: positions_3d[%lld][%lld] = %d is negative", (long long)(i / T),
                    (long long)(i % T), pos[i]);
  }
  if (rc == TPR_OK) rc = tpr_tensor_new(s->be, TPR_I32, 2, (const int64_t[]){3, T}, &t->pos3);
  if (rc == TPR_OK) rc = tpr_tensor_from_host(t->pos3, pos, (size_t)(3 * T) * sizeof *pos);
  if (rc == TPR_OK) rc = tpr_exec_bind(t->exec, "positions_3d", t->pos3);
  free(pos);
  return rc;
}

static tpr_status build(tpr_session *s, struct tpr_m2_train *t) {
  int64_t T = t->o.seq_len;
  TPR_CHECK(make_program(s, t));
  TPR_CHECK(tpr_exec_new(t->program, s->be, &t->exec));
  tpr_exec_set_collectives(t->exec, &s->hook);
  if (t->o.profile) TPR_CHECK(tpr_exec_set_profiling(t->exec, true));
  TPR_CHECK(list_params(s, t));
  if (t->o.fsdp.on) TPR_CHECK(tpr__m2_fsdp_shard(s, t));  // binds the chunks; the full tensors are gone
  TPR_CHECK(tpr__session_bind_params(s, t->exec));
  tpr_tensor **ins[] = {&t->tokens, &t->targets, &t->positions};
  const char *names[] = {"tokens", "targets", "positions"};
  for (int i = 0; i < 3; i++) {
    TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, 1, (const int64_t[]){T}, ins[i]));
    TPR_CHECK(tpr_exec_bind(t->exec, names[i], *ins[i]));
  }
  TPR_CHECK(tpr_tensor_new(s->be, TPR_I32, 1, (const int64_t[]){1}, &t->start));
  TPR_CHECK(tpr_exec_bind(t->exec, "start", t->start));
  TPR_CHECK(bind_positions_3d(s, t));
  int32_t zero = 0, *pos = t->host_i32;
  for (int64_t i = 0; i < T; i++) pos[i] = (int32_t)i;
  TPR_CHECK(tpr_tensor_from_host(t->positions, pos, (size_t)T * sizeof *pos));
  return tpr_tensor_from_host(t->start, &zero, sizeof zero);
}

static tpr_status start(tpr_session *s, const tpr_m2_train_opts *o) {
  if (!s->o.training) return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: the session was not opened for training");
  if (!s->be->vt->host_addressable)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "train: runs on the CPU backend (backend %s has no backward kernels yet)",
                    tpr_backend_name(s->be));
  if (o->seq_len < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --seq-len %lld", (long long)o->seq_len);
  if (s->train) return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: already started");
  struct tpr_m2_train *t = calloc(1, sizeof *t);
  if (!t) return TPR_FAIL(TPR_ERR_OOM, "train");
  s->train = t;
  t->o = *o;
  if (!(t->host_i32 = malloc((size_t)o->seq_len * sizeof *t->host_i32)) ||
      !(t->load = calloc((size_t)(s->cfg.num_layers * s->cfg.num_experts) + 1, sizeof *t->load)))  // + 1: E may be 0
    return TPR_FAIL(TPR_ERR_OOM, "train");
  TPR_CHECK(build(s, t));
  int64_t big = 0;
  for (int k = 0; k < s->plan.n_tensors; k++) big = tpr__kind_numel(&s->plan.tensors[k]) > big ? tpr__kind_numel(&s->plan.tensors[k]) : big;
  t->gather_cap = big * (s->plan.world > s->plan.tp ? s->plan.world : s->plan.tp);
  if (!(t->gather = malloc((size_t)t->gather_cap * sizeof *t->gather))) return TPR_FAIL(TPR_ERR_OOM, "train staging");
  return TPR_OK;
}

tpr_status tpr_m2_train_start(tpr_session *s, const tpr_m2_train_opts *o) {
  return tpr_comm_agree(s->world, start(s, o));
}

void tpr_m2_train_profile(const tpr_session *s, double *seconds, int64_t *runs, double *gemm_flops_per_run) {
  const struct tpr_m2_train *t = s->train;
  const double *node = tpr_exec_node_seconds(t->exec);
  memset(seconds, 0, TPR_OP_KIND_COUNT * sizeof *seconds);
  *gemm_flops_per_run = 0;
  *runs = t->runs;
  for (int n = 0; n < tpr_program_num_nodes(t->program); n++) {
    tpr_op_kind op = tpr_program_node_op(t->program, n);
    if (node) seconds[op] += node[n];
    *gemm_flops_per_run += tpr_program_node_flops(t->program, n);
  }
}

tpr_status tpr_m2_train_update_bias(tpr_session *s, double rate) {
  struct tpr_m2_train *t = s->train;
  int64_t layers = s->cfg.num_layers, E = s->cfg.num_experts, n = layers * E;
  // Every tp rank of a replica routed the same tokens: sum the world, divide by tp.
  TPR_CHECK(tpr_comm_all_reduce(s->world, t->load, t->load, (size_t)n, TPR_I64, TPR_SUM));
  for (int i = t->n_trained; i < t->n_params; i++) {  // the frozen params: the routing biases
    const piece *pc = &t->params[i].pieces[0];
    float *bias = t->params[i].pub.data;
    const int64_t *load = t->load + pc->layer * E;
    double mean = 0;
    for (int64_t e = 0; e < E; e++) mean += (double)load[e] / s->plan.tp;
    mean /= (double)E;
    for (int64_t e = 0; e < E; e++) {
      double l = (double)load[e] / s->plan.tp;
      bias[e] += (float)(rate * (l < mean ? 1 : l > mean ? -1 : 0));
    }
  }
  memset(t->load, 0, (size_t)n * sizeof *t->load);
  return TPR_OK;
}

// The first sequence of a step writes the accumulators instead of adding to
// them, so clearing them is free (no pass over every gradient).
void tpr_m2_train_zero_grads(tpr_session *s) {
  s->train->fresh = true;
  tpr_exec_comm_reset(s->train->exec);
}

void tpr_m2_train_comm_info(const tpr_session *s, tpr_m2_train_comm *out) {
  const tpr_exec_comm_stats *c = tpr_exec_comm(s->train->exec);
  int g = TPR_OP_PARAM_GATHER, r = TPR_OP_REDUCE_SCATTER;  // the training program's only reduce-scatters are FSDP's
  *out = (tpr_m2_train_comm){.gather_bytes = c->bytes[g], .gather_s = c->seconds[g], .scatter_bytes = c->bytes[r],
                             .scatter_s = c->seconds[r], .exposed_s = c->exposed[g] + c->exposed[r]};
}

void tpr_m2_train_params_updated(tpr_session *s) {
  if (s->train->o.fsdp.on) tpr__m2_fsdp_refresh(s->train);
}

void tpr_m2_train_memory_info(const tpr_session *s, tpr_m2_train_memory *out) {
  const struct tpr_m2_train *t = s->train;
  *out = (tpr_m2_train_memory){.arena = tpr_exec_plan(t->exec)->arena_bytes};
  for (int i = 0; i < t->n_params; i++) {
    const train_param *p = &t->params[i];
    if (!s->weights.arena) out->params += (uint64_t)p->pub.numel * sizeof(float);
    if (p->bound && p->bound != p->master) out->params += (uint64_t)tpr_tensor_nbytes(p->bound);
    if (p->pub.grad) out->grads += (uint64_t)p->pub.numel * sizeof(float);
  }
  // Without FSDP the params live in the loader's arena, which also keeps the
  // experts it read before they were stacked into s->experts.
  if (s->weights.arena) {
    out->params = s->weights.bytes_held;
    for (int64_t i = 0; i < 2 * s->cfg.num_layers; i++)
      if (s->experts[i]) out->params += (uint64_t)tpr_tensor_nbytes(s->experts[i]);
  }
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

// One run of the program on a sequence, its losses read out.
static tpr_status run_sequence(tpr_session *s, const int32_t *inputs, const int32_t *targets, tpr_m2_losses *out) {
  struct tpr_m2_train *t = s->train;
  if (!t) return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: not started");
  int64_t T = t->o.seq_len;
  TPR_CHECK(check_ids(inputs, T, s->cfg.vocab_size, false));
  TPR_CHECK(check_ids(targets, T, s->cfg.vocab_size, true));
  TPR_CHECK(tpr_tensor_from_host(t->tokens, inputs, (size_t)T * sizeof *inputs));
  TPR_CHECK(tpr_tensor_from_host(t->targets, targets, (size_t)T * sizeof *targets));
  TPR_CHECK(tpr_exec_run(t->exec));
  t->runs++;
  if (out) {
    TPR_CHECK(read_scalar(t->exec, "loss", &out->loss));
    TPR_CHECK(read_scalar(t->exec, "ce", &out->ce));
    TPR_CHECK(read_scalar(t->exec, "aux", &out->aux));
  }
  return TPR_OK;
}

tpr_status tpr_m2_train_eval_sequence(tpr_session *s, const int32_t *inputs, const int32_t *targets,
                                      tpr_m2_losses *out) {
  return run_sequence(s, inputs, targets, out);
}

tpr_status tpr_m2_train_sequence(tpr_session *s, const int32_t *inputs, const int32_t *targets, double weight,
                                 tpr_m2_losses *out) {
  TPR_CHECK(run_sequence(s, inputs, targets, out));
  struct tpr_m2_train *t = s->train;
  int64_t E = s->cfg.num_experts;
  for (int64_t L = 0; L < s->cfg.num_layers; L++) {
    if (!tpr_model_config_layer_is_moe(&s->cfg, L)) continue;  // dense layers route nothing
    char name[64];
    const tpr_tensor *x;
    snprintf(name, sizeof name, "moe_load.%lld", (long long)L);
    TPR_CHECK(tpr_exec_output(t->exec, name, &x));
    const int32_t *c = tpr_tensor_data(x);
    for (int64_t e = 0; e < E; e++) t->load[L * E + e] += c[e];
  }
  float w = (float)weight;
  for (int i = 0; i < t->n_trained; i++) {
    tpr_m2_param *p = &t->params[i].pub;
    char name[192];
    snprintf(name, sizeof name, "%s%s", TPR_M2_GRAD_PREFIX, p->name);
    const tpr_tensor *g;
    TPR_CHECK(tpr_exec_output(t->exec, name, &g));
    accumulate(p->grad, tpr_tensor_data(g), p->numel, w, t->fresh);
  }
  t->fresh = false;
  return TPR_OK;
}

// The tp all-gather of a copied head uses t->gather: g must not live there.
tpr_status tpr__m2_fold_param(tpr_session *s, struct tpr_m2_train *t, int i, float *grad) {
  const tpr_shard_plan *pl = &s->plan;
  for (int j = 0; j < t->params[i].n_pieces; j++) {
    const piece *pc = &t->params[i].pieces[j];
    const tpr_shard_tensor *k = &pl->tensors[pc->kind];
    float *g = grad + pc->offset;
    const float *all = NULL;
    if (tpr_unshard_fold_needs_gather(pl, k)) {
      TPR_CHECK(tpr_comm_all_gather(s->comms.axis[TPR_AXIS_TP], g, t->gather, (size_t)tpr__kind_numel(k), TPR_F32));
      all = t->gather;
    }
    tpr_unshard_fold_grad(pl, k, s->mesh.tp_rank, g, all);
  }
  return TPR_OK;
}

tpr_status tpr_m2_train_reduce_grads(tpr_session *s) {
  struct tpr_m2_train *t = s->train;
  if (t->fresh)  // no sequence ran this step: the gradient is zero
    for (int i = 0; i < t->n_trained; i++) memset(t->params[i].pub.grad, 0, (size_t)t->params[i].pub.numel * sizeof(float));
  if (t->o.fsdp.on) return tpr__m2_fsdp_reduce(s, t);
  for (int i = 0; i < t->n_trained; i++) TPR_CHECK(tpr__m2_fold_param(s, t, i, t->params[i].pub.grad));
  const tpr_shard_plan *pl = &s->plan;
  // Dense params: each replica has d L_d / dW; the mean over replicas.
  // Experts under the alltoall dispatcher: each edp copy saw only the tokens
  // routed through its ep group (tp peers take disjoint slices), so the
  // copies' gradients are summed, then divided by the replicas. Under the
  // allreduce dispatcher (dp = 1) every copy saw every token: nothing to do.
  bool split_experts = tpr_moe_dispatch_resolve(s->o.moe.dispatch, pl) == TPR_MOE_DISPATCH_ALLTOALL;
  float inv = 1.0f / (float)pl->dp;
  for (int i = 0; i < t->n_trained; i++) {
    tpr_m2_param *p = &t->params[i].pub;
    bool expert = t->params[i].expert;
    int n = expert ? (split_experts ? pl->edp : 1) : pl->dp;
    if (n > 1) {
      tpr_comm_t c = s->comms.axis[expert ? TPR_AXIS_EDP : TPR_AXIS_DP];
      TPR_CHECK(tpr_comm_all_reduce(c, p->grad, p->grad, (size_t)p->numel, TPR_F32, TPR_SUM));
    }
    if (pl->dp > 1)
      for (int64_t j = 0; j < p->numel; j++) p->grad[j] *= inv;
  }
  return TPR_OK;
}

tpr_status tpr_m2_train_grad_sumsq(tpr_session *s, double *out) {
  struct tpr_m2_train *t = s->train;
  double sum = 0;
  if (t->o.fsdp.on)
    sum = tpr__m2_fsdp_sumsq(s, t);
  else
    for (int i = 0; i < t->n_trained; i++)
      for (int j = 0; j < t->params[i].n_pieces; j++) {
        const piece *pc = &t->params[i].pieces[j];
        sum += tpr_unshard_sumsq(&s->plan, &s->plan.tensors[pc->kind], &s->mesh, t->params[i].pub.grad + pc->offset);
      }
  // The ranks' doubles are gathered bit for bit (the collectives have no f64)
  // and added in rank order: the same exact total on every rank.
  int world = s->plan.world;
  int64_t bits, *all = malloc((size_t)world * sizeof *all);
  if (!all) return TPR_FAIL(TPR_ERR_OOM, "grad norm");
  memcpy(&bits, &sum, sizeof bits);
  tpr_status rc = tpr_comm_all_gather(s->world, &bits, all, 1, TPR_I64);
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

// One piece gathered from every rank; on rank 0 each checkpoint tensor it
// covers (one, or one per ep group for experts) is assembled and handed on.
static tpr_status export_piece(tpr_session *s, const piece *pc, const float *mine, tpr_m2_export_fn fn,
                               void *ctx) {
  struct tpr_m2_train *t = s->train;
  const tpr_shard_plan *pl = &s->plan;
  const tpr_shard_tensor *k = &pl->tensors[pc->kind];
  int64_t n = tpr__kind_numel(k), world = pl->world;
  TPR_CHECK(tpr_comm_all_gather(s->world, mine, t->gather, (size_t)n, TPR_F32));
  if (s->mesh.world_rank != 0) return TPR_OK;
  int64_t gn = k->ndim == 2 ? k->global_shape[0] * k->global_shape[1] : k->global_shape[0];
  int groups = pc->local_expert >= 0 ? pl->ep : 1;
  float *hf = calloc((size_t)(groups * gn), sizeof *hf);
  if (!hf) return TPR_FAIL(TPR_ERR_OOM, "export %s", k->name);
  tpr_status rc = TPR_OK;
  for (int64_t r = 0; rc == TPR_OK && r < world; r++) {
    tpr_mesh m;
    rc = tpr_mesh_init((int)world, (int)r, pl->tp, pl->ep, pl->etp, &m);
    int grp = groups > 1 ? m.ep_rank : 0;
    if (rc == TPR_OK) tpr_unshard_place(pl, k, &m, t->gather + r * n, hf + grp * gn);
  }
  for (int g = 0; rc == TPR_OK && g < groups; g++) {
    char name[TPR_LOAD_NAME_MAX];
    int64_t expert = pc->local_expert >= 0 ? g * pl->experts_per_rank + pc->local_expert : -1;
    rc = tpr_loader_tensor_name(k->name, pc->layer, expert, name);
    if (rc == TPR_OK) rc = fn(ctx, name, k->ndim, k->global_shape, hf + g * gn);
  }
  free(hf);
  return rc;
}

tpr_status tpr_m2_train_export(tpr_session *s, bool grads, tpr_m2_export_fn fn, void *ctx) {
  struct tpr_m2_train *t = s->train;
  if (!t) return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: not started");
  int n = grads ? t->n_trained : t->n_params;
  float *whole = NULL;  // an FSDP param gathered back into its rank layout
  tpr_status rc = TPR_OK;
  for (int i = 0; rc == TPR_OK && i < n; i++) {
    const train_param *p = &t->params[i];
    const float *base = grads ? p->pub.grad : p->pub.data;
    if (p->pub.shards > 1) {
      free(whole);
      whole = malloc((size_t)(p->pub.shards * p->pub.numel) * sizeof *whole);
      rc = whole ? tpr__m2_fsdp_unshard(s, p, grads, whole) : TPR_FAIL(TPR_ERR_OOM, "export %s", p->name);
      base = whole;
    }
    for (int j = 0; rc == TPR_OK && j < p->n_pieces; j++)
      rc = export_piece(s, &p->pieces[j], base + p->pieces[j].offset, fn, ctx);
  }
  free(whole);
  return rc;
}
