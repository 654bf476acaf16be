// A training state over a session: the forward+backward program of its
// family (models/minimax_m2.c, or models/qk_head_decoder.c's training mode
// for qwen3_moe, hunyuan_v1_moe, qwen3_vl_moe and the dense qwen2_vl), and
// the trained params with their gradient accumulators. The steps on them
// are state_step.c's, the export state_export.c's. Only the program and the
// expert kinds' names depend on the family.
#include "train/state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/hunyuan_moe.h"
#include "models/minicpm_sala.h"
#include "models/minimax.h"
#include "models/minimax_m2.h"
#include "models/qwen2_vl.h"
#include "models/qwen3_moe.h"
#include "models/qwen3_vl_moe.h"
#include "train/state_impl.h"

void tpr_train_state_free(tpr_train_state *t) {
  if (!t) return;
  tpr_exec_free(t->exec);
  tpr_program_free(t->program);
  tpr_tensor_free(t->tokens), tpr_tensor_free(t->targets), tpr_tensor_free(t->positions), tpr_tensor_free(t->start);
  tpr_tensor_free(t->loss_scale);
  tpr_tensor_free(t->pos3), tpr_tensor_free(t->attn_lo);
  free(t->pack_host);
  for (int i = 0; i < t->n_params; i++) {
    train_param *p = &t->params[i];
    free(p->grad_own);
    free(p->pieces);
    if (p->bound != p->master) tpr_tensor_free(p->bound);
    tpr_tensor_free(p->master);
  }
  free(t->params), free(t->host_i32), free(t->gather), free(t->load);
  free(t);
}

tpr_session *tpr_train_state_session(const tpr_train_state *t) { return t->s; }
int tpr_train_num_params(const tpr_train_state *t) { return t->n_trained; }
const tpr_train_param *tpr_train_param_at(const tpr_train_state *t, int i) { return &t->params[i].pub; }

static tpr_status add_param(tpr_train_state *t, const char *name, float *data, int64_t numel, bool trained,
                            int n_pieces) {
  train_param *p = &t->params[t->n_params++];
  snprintf(p->name, sizeof p->name, "%s", name);
  p->pub = (tpr_train_param){.name = p->name, .data = data, .numel = numel, .full_numel = numel, .shards = 1};
  p->full = data;
  p->trained = trained;
  p->pieces = calloc((size_t)n_pieces, sizeof *p->pieces);
  if (!p->pieces) return TPR_FAIL(TPR_ERR_OOM, "train params");
  // Under FSDP the accumulators are the chunks' (tpr__train_fsdp_shard).
  if (trained && !t->o.fsdp.on && !(p->grad_own = p->pub.grad = calloc((size_t)numel, sizeof(float))))
    return TPR_FAIL(TPR_ERR_OOM, "gradients");
  return TPR_OK;
}

static int find_kind(const tpr_shard_plan *p, const char *suffix) {
  for (int i = 0; i < p->n_tensors; i++)
    if (strstr(p->tensors[i].name, suffix)) return i;
  return -1;
}

// Layer L's stacked experts as two params, w13 (E_r, 2F_r, H) and w2
// (E_r, H, F_r), each piece one expert's checkpoint tensor.
static tpr_status add_experts(tpr_train_state *t, int64_t L, const int *k) {
  const tpr_shard_plan *pl = t->plan;
  int64_t Er = pl->experts_per_rank, Fr = pl->expert_inter_per_rank, H = t->cfg->hidden_size;
  for (int w = 0; w < 2; w++) {
    char name[160];
    tpr_family_expert_name(L, w ? "w2" : "w13", name, sizeof name);
    tpr_tensor *x = tpr__session_expert(t->s, L, w);
    TPR_CHECK(add_param(t, name, tpr_tensor_data(x), tpr_tensor_numel(x), true, (int)(w ? Er : 2 * Er)));
    train_param *p = &t->params[t->n_params - 1];
    p->expert = p->pub.expert = true;
    p->pub.decay = true;
    for (int64_t e = 0; e < Er; e++)
      if (w) {
        p->pieces[p->n_pieces++] = (piece){k[2], L, e, e * H * Fr};
      } else {
        p->pieces[p->n_pieces++] = (piece){k[0], L, e, e * 2 * Fr * H};
        p->pieces[p->n_pieces++] = (piece){k[1], L, e, e * 2 * Fr * H + Fr * H};
      }
  }
  return TPR_OK;
}

// The params in a fixed order (the same on every rank): trained weights
// items, the stacked experts, then the untrained routing biases.
static tpr_status list_params(tpr_train_state *t) {
  const tpr_shard_plan *pl = t->plan;
  const tpr_rank_weights *wt = tpr__session_weights(t->s);
  int64_t layers = t->cfg->num_layers;
  t->params = calloc((size_t)(wt->n + 2 * layers), sizeof *t->params);
  if (!t->params) return TPR_FAIL(TPR_ERR_OOM, "train params");
  const tpr_family *f = tpr__session_family(t->s);
  const int k[3] = {find_kind(pl, f->expert_gate), find_kind(pl, f->expert_up), find_kind(pl, f->expert_down)};
  for (int pass = 0; pass < 2; pass++) {  // trained first, then the frozen biases
    for (int64_t i = 0; i < wt->n; i++) {
      const tpr_load_item *it = &wt->items[i];
      bool trained = !strstr(it->name, "e_score_correction_bias");
      if (it->local_expert >= 0 || trained != (pass == 0)) continue;
      TPR_CHECK(add_param(t, it->name, tpr_tensor_data(tpr__session_item_tensor(t->s, i)), it->numel, trained, 1));
      train_param *p = &t->params[t->n_params - 1];
      p->pieces[p->n_pieces++] = (piece){it->kind, it->layer, -1, 0};
      p->pub.decay = pl->tensors[it->kind].ndim >= 2;
    }
    if (pass == 1) break;
    for (int64_t L = 0; L < layers; L++)  // dense-MLP layers (qwen3_moe) hold no experts
      if (tpr__session_expert(t->s, L, 0)) TPR_CHECK(add_experts(t, L, k));
    t->n_trained = t->n_params;
  }
  return TPR_OK;
}

static tpr_status build_m2(const tpr_shard_plan *plan, const void *opts, tpr_program **out) {
  return tpr_m2_build(plan, opts, out);
}

static tpr_status build_minimax(const tpr_shard_plan *plan, const void *opts, tpr_program **out) {
  return tpr_minimax_build(plan, opts, out);
}

static tpr_status build_sala(const tpr_shard_plan *plan, const void *opts, tpr_program **out) {
  return tpr_minicpm_sala_build_training(plan, opts, out);
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

// The trainable families: MiniMax-M2 has its own builder (desc NULL); the
// others are the per-head QK-norm builder's training mode on their
// descriptor. A family added here must have its training test
// (tests/test_train_family.c) before fsdp is set.
static const struct trainable {
  tpr_model_family family;
  const tpr_qkhd_desc *desc;
  bool fsdp;
} trainable[] = {
    {TPR_FAMILY_MINIMAX_M2, NULL, true},
    {TPR_FAMILY_QWEN3_MOE, &tpr_qwen3_moe_desc, true},
    {TPR_FAMILY_HUNYUAN_V1_MOE, &tpr_hunyuan_moe_desc, true},
    {TPR_FAMILY_QWEN3_VL_MOE, &tpr_qwen3_vl_moe_desc, true},
    {TPR_FAMILY_QWEN2_VL, &tpr_qwen2_vl_desc, true},
    {TPR_FAMILY_MINIMAX, NULL, true},  // its own builder (models/minimax.c)
    {TPR_FAMILY_MINICPM_SALA, NULL, true},  // its own builder (models/minicpm_sala.c)
};
#define N_TRAINABLE (sizeof trainable / sizeof trainable[0])

static const struct trainable *find_trainable(tpr_model_family f) {
  for (size_t i = 0; i < N_TRAINABLE; i++)
    if (trainable[i].family == f) return &trainable[i];
  return NULL;
}

bool tpr_train_supported(tpr_model_family f) { return find_trainable(f) != NULL; }

bool tpr_train_fsdp_built(tpr_model_family f) {
  const struct trainable *t = find_trainable(f);
  return t && t->fsdp;
}

const char *tpr_train_supported_list(void) {
  static char list[256];
  if (!list[0])
    for (size_t i = 0; i < N_TRAINABLE; i++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? (i + 1 < N_TRAINABLE ? ", " : " and ") : "",
               tpr_model_family_name(trainable[i].family));
  return list;
}

// Whether the program's attention stops at document starts (packed
// sequences, unless a test's control leaves the mask out).
static bool packed_attention(const tpr_train_state *t) {
  return t->o.pack && !(t->o.pack_debug & TPR_PACK_DEBUG_NO_MASK);
}

// The family's training program: MiniMax-M2's builder, or the per-head
// QK-norm builder's training mode from the family's descriptor.
static tpr_status make_program(tpr_train_state *t) {
  const tpr_session_opts *so = tpr__session_opts(t->s);
  const tpr_model_family family = t->cfg->family;
  int64_t T = t->o.seq_len;
  double coef = t->o.aux_coef >= 0 ? t->o.aux_coef : t->cfg->router_aux_loss_coef;
  const char *fam = tpr_model_family_name(family);
  if (family != TPR_FAMILY_MINIMAX && (t->o.pack_debug & TPR_PACK_DEBUG_NO_STATE_RESET))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --debug-pack no-state-reset: %s has no lightning attention layers",
                    fam);
  if (family == TPR_FAMILY_MINIMAX_M2) {
    tpr_m2_build_opts bo = {.tokens = T,
                            .per_rank_qk_norm = so->per_rank_qk_norm,
                            .moe = so->moe,
                            .training = true,
                            .aux_coef = coef,
                            .pack = packed_attention(t),
                            .skip_grad_marks = so->skip_grad_marks,
                            .fsdp = t->o.fsdp};
    return tpr__session_make_program(t->s, build_m2, &bo, &t->program);
  }
  const struct trainable *tr = find_trainable(family);
  if (!tr)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "train: model family %s runs inference only; training supports %s", fam,
                    tpr_train_supported_list());
  qkhd_job j = {.d = tr->desc};
  // FSDP: the builder gathers every param from its chunk (family_step.c);
  // the state's chunks are family-blind (train/fsdp.c). Families added to
  // the builder later stay refused here until tested under FSDP.
  if (t->o.fsdp.on && !tpr_train_fsdp_built(family))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "train: FSDP is not built for %s; train it with --no-fsdp (plain data "
                    "parallelism)", fam);
  if (family == TPR_FAMILY_MINICPM_SALA) {
    // One whole sequence per run: the sparse layers' dense-or-sparse
    // decision and selection are the published forward's for one call from
    // position 0. Packed documents would need the selection per document.
    if (t->o.pack)
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "train: --pack is not built for %s (its sparse layers select blocks over "
                      "the whole sequence); train without --pack", fam);
    if (t->o.aux_coef > 0)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --aux-coef %g: %s has no experts (no load-balancing loss)",
                      t->o.aux_coef, fam);
    tpr_sala_train_opts to = {.tokens = T,
                              .family_control = so->per_rank_qk_norm ? TPR_SALA_CONTROL_LOCAL_NORM
                                                                     : TPR_SALA_CONTROL_NONE,
                              .skip_grad_marks = so->skip_grad_marks,
                              .dense = so->dense_sparse_layers,
                              .fsdp = t->o.fsdp};
    return tpr__session_make_program(t->s, build_sala, &to, &t->program);
  }
  if (family == TPR_FAMILY_MINIMAX) {
    // Packed documents: the softmax layers' mask and the lightning layers'
    // state reset both stop at each document's first token ("attn_lo").
    tpr_minimax_opts mo = {.step = {.moe = so->moe},
                           .control = so->per_rank_qk_norm ? TPR_MINIMAX_CONTROL_LOCAL_NORM : TPR_MINIMAX_CONTROL_NONE,
                           .training = true,
                           .tokens = T,
                           .aux_coef = coef,
                           .pack = packed_attention(t),
                           .debug_carry_state = (t->o.pack_debug & TPR_PACK_DEBUG_NO_STATE_RESET) != 0,
                           .skip_grad_marks = so->skip_grad_marks,
                           .fsdp = t->o.fsdp};
    return tpr__session_make_program(t->s, build_minimax, &mo, &t->program);
  }
  // transformers' HunYuanMoEV1ForCausalLM trains on the cross-entropy alone
  // (no load-balancing loss): the family's default weight is 0.
  if (t->o.aux_coef < 0 && family == TPR_FAMILY_HUNYUAN_V1_MOE) coef = 0;
  // A dense model (qwen2_vl) has no router: nothing to balance.
  if (!j.d->router) {
    if (t->o.aux_coef > 0)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --aux-coef %g: %s has no experts (no load-balancing loss)",
                      t->o.aux_coef, fam);
    coef = 0;
  }
  j.o = (tpr_qkhd_opts){.step = {.moe = so->moe},
                        // A test's control: the family's wrong QK-norm (hunyuan: the order around RoPE).
                        .qk_control = so->per_rank_qk_norm ? j.d->session_control : TPR_QK_CONTROL_NONE,
                        .training = true,
                        .tokens = T,
                        .aux_coef = coef,
                        .pack = packed_attention(t),
                        .skip_grad_marks = so->skip_grad_marks,
                        .fsdp = t->o.fsdp};
  return tpr__session_make_program(t->s, build_qkhd, &j, &t->program);
}

// MRoPE families: the (3, T) rope positions, the caller's or the text rule's.
static tpr_status bind_positions_3d(tpr_train_state *t) {
  int64_t T = t->o.seq_len;
  if (!t->cfg->mrope_layout) {
    if (t->o.positions_3d)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --positions-3d is for MRoPE families; %s has 1-D positions",
                      tpr_model_family_name(t->cfg->family));
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
  if (rc == TPR_OK) rc = tpr_tensor_new(t->be, TPR_I32, 2, (const int64_t[]){3, T}, &t->pos3);
  if (rc == TPR_OK) rc = tpr_tensor_from_host(t->pos3, pos, (size_t)(3 * T) * sizeof *pos);
  if (rc == TPR_OK) rc = tpr_exec_bind(t->exec, "positions_3d", t->pos3);
  free(pos);
  return rc;
}

static tpr_status build(tpr_train_state *t) {
  int64_t T = t->o.seq_len;
  TPR_CHECK(make_program(t));
  TPR_CHECK(tpr_exec_new(t->program, t->be, &t->exec));
  tpr_exec_set_collectives(t->exec, tpr__session_collectives(t->s));
  if (t->o.profile) TPR_CHECK(tpr_exec_set_profiling(t->exec, true));
  TPR_CHECK(list_params(t));
  if (t->o.fsdp.on) TPR_CHECK(tpr__train_fsdp_shard(t));  // binds the chunks; the full tensors are gone
  TPR_CHECK(tpr__session_bind_params(t->s, t->exec));
  tpr_tensor **ins[] = {&t->tokens, &t->targets, &t->positions};  // (T) i32 each
  const char *names[] = {"tokens", "targets", "positions"};
  for (int i = 0; i < 3; i++) {
    TPR_CHECK(tpr_tensor_new(t->be, TPR_I32, 1, (const int64_t[]){T}, ins[i]));
    TPR_CHECK(tpr_exec_bind(t->exec, names[i], *ins[i]));
  }
  if (tpr_exec_has(t->exec, "start")) {  // (1) i32, 0: families whose step reads the first position
    TPR_CHECK(tpr_tensor_new(t->be, TPR_I32, 1, (const int64_t[]){1}, &t->start));
    TPR_CHECK(tpr_exec_bind(t->exec, "start", t->start));
  }
  TPR_CHECK(tpr_tensor_new(t->be, TPR_F32, 1, (const int64_t[]){1}, &t->loss_scale));
  TPR_CHECK(tpr_exec_bind(t->exec, "loss_scale", t->loss_scale));
  TPR_CHECK(bind_positions_3d(t));
  if (packed_attention(t)) {  // each sequence's document starts (state_pack.c)
    TPR_CHECK(tpr_tensor_new(t->be, TPR_I32, 1, (const int64_t[]){T}, &t->attn_lo));
    TPR_CHECK(tpr_exec_bind(t->exec, "attn_lo", t->attn_lo));
  }
  int32_t zero = 0, *pos = t->host_i32;
  for (int64_t i = 0; i < T; i++) pos[i] = (int32_t)i;
  TPR_CHECK(tpr_tensor_from_host(t->positions, pos, (size_t)T * sizeof *pos));
  return t->start ? tpr_tensor_from_host(t->start, &zero, sizeof zero) : TPR_OK;
}

static tpr_status open_state(tpr_session *s, const tpr_train_state_opts *o, tpr_train_state **out) {
  if (!tpr__session_opts(s)->training)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: the session was not opened for training");
  tpr_backend *be = tpr__session_backend(s);
  if (!be->vt->host_addressable)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "train: runs on the CPU backend (backend %s has no backward kernels yet)",
                    tpr_backend_name(be));
  if (o->seq_len < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --seq-len %lld", (long long)o->seq_len);
  const int64_t V = tpr_session_config(s)->vocab_size;
  if (o->pack && (o->eos_id < 0 || o->eos_id >= V))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --pack: the EOS id %d is outside the vocabulary [0, %lld)",
                    o->eos_id, (long long)V);
  if (o->pack && o->positions_3d)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --positions-3d gives every sequence the same positions, --pack "
                    "restarts them at each document: give one or the other");
  tpr_train_state *t = calloc(1, sizeof *t);
  if (!t) return TPR_FAIL(TPR_ERR_OOM, "train");
  *out = t;  // the caller's to free, built or not
  *t = (tpr_train_state){.o = *o, .s = s, .cfg = tpr_session_config(s), .plan = tpr_session_plan(s),
                         .mesh = tpr_session_mesh(s), .be = be, .world = tpr__session_world(s)};
  if (!(t->host_i32 = malloc((size_t)o->seq_len * sizeof *t->host_i32)) ||
      !(t->load = calloc((size_t)(t->cfg->num_layers * t->cfg->num_experts) + 1, sizeof *t->load)))  // + 1: E may be 0
    return TPR_FAIL(TPR_ERR_OOM, "train");
  TPR_CHECK(build(t));
  int64_t big = 0;
  for (int k = 0; k < t->plan->n_tensors; k++)
    if (tpr__kind_numel(&t->plan->tensors[k]) > big) big = tpr__kind_numel(&t->plan->tensors[k]);
  t->gather_cap = big * (t->plan->world > t->plan->tp ? t->plan->world : t->plan->tp);
  if (!(t->gather = malloc((size_t)t->gather_cap * sizeof *t->gather))) return TPR_FAIL(TPR_ERR_OOM, "train staging");
  return TPR_OK;
}

tpr_status tpr_train_state_open(tpr_session *s, const tpr_train_state_opts *o, tpr_train_state **out) {
  tpr_train_state *t = NULL;
  tpr_status rc = tpr_comm_agree(tpr__session_world(s), open_state(s, o, &t));
  if (rc != TPR_OK) tpr_train_state_free(t), t = NULL;
  *out = t;
  return rc;
}

void tpr_train_profile(const tpr_train_state *t, double *seconds, int64_t *runs, double *gemm_flops_per_run) {
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

void tpr_train_comm_info(const tpr_train_state *t, tpr_train_comm *out) {
  const tpr_exec_comm_stats *c = tpr_exec_comm(t->exec);
  int g = TPR_OP_PARAM_GATHER, r = TPR_OP_REDUCE_SCATTER;  // the training program's only reduce-scatters are FSDP's
  *out = (tpr_train_comm){.gather_bytes = c->bytes[g], .gather_s = c->seconds[g], .scatter_bytes = c->bytes[r],
                          .scatter_s = c->seconds[r], .exposed_s = c->exposed[g] + c->exposed[r]};
}

void tpr_train_memory_info(const tpr_train_state *t, tpr_train_memory *out) {
  const tpr_rank_weights *wt = tpr__session_weights(t->s);
  *out = (tpr_train_memory){.arena = tpr_exec_plan(t->exec)->arena_bytes};
  for (int i = 0; i < t->n_params; i++) {
    const train_param *p = &t->params[i];
    if (!wt->arena) out->params += (uint64_t)p->pub.numel * sizeof(float);
    if (p->bound && p->bound != p->master) out->params += (uint64_t)tpr_tensor_nbytes(p->bound);
    if (p->pub.grad) out->grads += (uint64_t)p->pub.numel * sizeof(float);
  }
  // Without FSDP the params live in the loader's arena, which also keeps the
  // experts it read before they were stacked (tpr__session_expert).
  if (wt->arena) {
    out->params = wt->bytes_held;
    for (int64_t L = 0; L < t->cfg->num_layers; L++)
      for (int w = 0; w < 2; w++) {
        const tpr_tensor *x = tpr__session_expert(t->s, L, w);
        if (x) out->params += (uint64_t)tpr_tensor_nbytes(x);
      }
  }
}
