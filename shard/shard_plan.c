// The tensor list of the sharding plan: every checkpoint tensor kind, its
// global and per-rank shapes, the transform, and the bytes each rank holds.
#include "shard_plan.h"

#include <stdio.h>
#include <string.h>

#include "shard/mesh.h"

static const char *const transform_names[TPR_XFORM_COUNT] = {
    [TPR_XFORM_REPLICATE] = "replicate",
    [TPR_XFORM_COLUMN_HEADS] = "column_heads",
    [TPR_XFORM_ROW_HEADS] = "row_heads",
    [TPR_XFORM_NORM_HEADS] = "norm_heads",
    [TPR_XFORM_VOCAB] = "vocab",
    [TPR_XFORM_EXPERT_COLUMN] = "expert_column",
    [TPR_XFORM_EXPERT_ROW] = "expert_row",
    [TPR_XFORM_COLUMN] = "column",
    [TPR_XFORM_ROW] = "row",
};

const char *tpr_shard_transform_name(tpr_shard_transform t) {
  return (unsigned)t < TPR_XFORM_COUNT ? transform_names[t] : "?";
}

void tpr_shard_plan_free(tpr_shard_plan *p) {
  if (!p) return;
  tpr_attn_plan_free(&p->attn);
  memset(p, 0, sizeof *p);
}

// count * numel * elt in uint64, refusing to wrap.
static tpr_status tensor_bytes(const tpr_shard_tensor *t, size_t elt, uint64_t *out) {
  uint64_t n = (uint64_t)t->count;
  for (int d = 0; d < t->ndim; d++)
    if (__builtin_mul_overflow(n, (uint64_t)t->rank_shape[d], &n))
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: %s: byte count overflows", t->name);
  if (__builtin_mul_overflow(n, (uint64_t)elt, out))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: %s: byte count overflows", t->name);
  return TPR_OK;
}

// Appends one tensor kind; 1-d tensors pass d1 = 0.
static tpr_status add(tpr_shard_plan *p, const char *name, tpr_shard_transform x, int64_t count, int64_t g0,
                      int64_t g1, int64_t r0, int64_t r1) {
  if (count == 0) return TPR_OK;  // e.g. no dense layers, tied lm_head
  if (p->n_tensors == TPR_SHARD_MAX_TENSORS) return TPR_FAIL(TPR_ERR_INTERNAL, "plan: more than %d tensor kinds", TPR_SHARD_MAX_TENSORS);
  tpr_shard_tensor *t = &p->tensors[p->n_tensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = g1 ? 2 : 1;
  t->global_shape[0] = g0, t->global_shape[1] = g1;
  t->rank_shape[0] = r0, t->rank_shape[1] = r1;
  t->transform = x;
  t->count = count;
  TPR_CHECK(tensor_bytes(t, tpr_dtype_size(p->dtype), &t->rank_bytes));
  if (__builtin_add_overflow(p->rank_bytes, t->rank_bytes, &p->rank_bytes))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: per-rank byte count overflows");
  return TPR_OK;
}

// Marks the kind just added as laid out like the KV heads.
static void kv_layout(tpr_shard_plan *p) { p->tensors[p->n_tensors - 1].kv_layout = true; }

// Family-specific checkpoint names; everything else is shared.
typedef struct names {
  const char *moe_gate, *moe_bias, *expert_up_gate, *expert_up, *expert_down;
  const char *q_norm, *k_norm;  // per-head QK-norm weights (NULL: self_attn.q_norm / k_norm)
  const char *shared_gate, *shared_up, *shared_down;  // the shared expert, when the config has one
} names;

static const names minimax_names = {
    .moe_gate = "model.layers.{L}.block_sparse_moe.gate.weight",
    .moe_bias = "model.layers.{L}.block_sparse_moe.e_score_correction_bias",
    .expert_up_gate = "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight",
    .expert_up = "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight",
    .expert_down = "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight",
};
static const names qwen3_names = {
    .moe_gate = "model.layers.{L}.mlp.gate.weight",
    .expert_up_gate = "model.layers.{L}.mlp.experts.{E}.gate_proj.weight",
    .expert_up = "model.layers.{L}.mlp.experts.{E}.up_proj.weight",
    .expert_down = "model.layers.{L}.mlp.experts.{E}.down_proj.weight",
};

static const names hunyuan_names = {
    .moe_gate = "model.layers.{L}.mlp.gate.wg.weight",
    .expert_up_gate = "model.layers.{L}.mlp.experts.{E}.gate_proj.weight",
    .expert_up = "model.layers.{L}.mlp.experts.{E}.up_proj.weight",
    .expert_down = "model.layers.{L}.mlp.experts.{E}.down_proj.weight",
    .q_norm = "model.layers.{L}.self_attn.query_layernorm.weight",
    .k_norm = "model.layers.{L}.self_attn.key_layernorm.weight",
    .shared_gate = "model.layers.{L}.mlp.shared_mlp.gate_proj.weight",
    .shared_up = "model.layers.{L}.mlp.shared_mlp.up_proj.weight",
    .shared_down = "model.layers.{L}.mlp.shared_mlp.down_proj.weight",
};

// Marks the kinds added since `from` as living in `which` layers only.
static void attn_layers(tpr_shard_plan *p, int from, tpr_attn_layers which) {
  for (int i = from; i < p->n_tensors; i++) p->tensors[i].attn_layers = which;
}

// The lightning attention layers of a hybrid model (minimax;
// docs/lightning-attention.md "Around the op"): tensor-parallel over heads,
// whole heads per rank, so nh % tp == 0 (a padded head would still decay
// and feed the all-reduced norm: refused rather than padded).
//   qkv_proj (nh*3D, H): rows per head [q | k | v] -> rank r's head block (nh/tp*3D, H)
//   output_gate (nh*D, H) -> (nh/tp*D, H)        column-parallel like the heads
//   out_proj (H, nh*D) -> (H, nh/tp*D)           row-parallel
//   norm (nh*D) held whole: its RMS is over every head (an all-reduce), and
//       the program selects the rank's slice with the rank tensor
static tpr_status add_linear_attention(tpr_shard_plan *p) {
  const tpr_model_config *c = &p->config;
  int64_t Ll = c->num_linear_layers, H = c->hidden_size, D = c->head_dim, nh = c->num_heads;
  if (Ll == 0) return TPR_OK;
  if (nh % p->tp)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: %s: %lld lightning attention heads do not split over tp=%d (each "
                    "rank keeps whole heads and their states; padding is not built for linear layers): use a tp "
                    "that divides %lld", tpr_model_family_name(c->family), (long long)nh, p->tp, (long long)nh);
  int64_t nr = nh / p->tp, from = p->n_tensors;
  TPR_CHECK(add(p, "model.layers.{L}.self_attn.qkv_proj.weight", TPR_XFORM_COLUMN, Ll, nh * 3 * D, H, nr * 3 * D, H));
  TPR_CHECK(add(p, "model.layers.{L}.self_attn.output_gate.weight", TPR_XFORM_COLUMN, Ll, nh * D, H, nr * D, H));
  TPR_CHECK(add(p, "model.layers.{L}.self_attn.out_proj.weight", TPR_XFORM_ROW, Ll, H, nh * D, H, nr * D));
  TPR_CHECK(add(p, "model.layers.{L}.self_attn.norm.weight", TPR_XFORM_REPLICATE, Ll, nh * D, 0, nh * D, 0));
  attn_layers(p, from, TPR_ATTN_LAYERS_LINEAR);
  return TPR_OK;
}

// MiniCPM-SALA (docs/minicpm-sala.md; models/minicpm_sala.h): its lightning
// layers and its InfLLM-v2 sparse layers share the checkpoint names q/k/v/o_proj
// with different shapes, so each name is two kinds, one per layer set.
//   lightning (nh % tp == 0, whole heads per rank, as minimax's):
//     q_proj (nh*D, H) -> (nh/tp*D, H) column; z_proj the same
//     k_proj, v_proj (nkv*D, H): column when nkv % tp == 0 (rank r's q heads
//       read only its kv block), else held whole (the program picks the heads)
//     o_proj (H, nh*D) -> (H, nh/tp*D) row
//     q_norm, k_norm (D) and o_norm (nh*D) held whole (o_norm's RMS spans all
//       heads: an all-reduce; the program selects the rank's slice)
//   sparse: q/k/v/o_proj as every softmax layer (padded / replicated heads),
//     o_gate (nq*D, H) laid out like q_proj.
static tpr_status add_sala_attention(tpr_shard_plan *p) {
  const tpr_model_config *c = &p->config;
  const tpr_attn_plan *a = &p->attn;
  int64_t Ll = c->num_linear_layers, Ls = c->num_layers - Ll, H = c->hidden_size, D = c->head_dim;
  int64_t nh = c->num_heads, nkv = c->linear_kv_heads;
  if (Ll && nh % p->tp)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: minicpm_sala: %lld lightning attention heads do not split over tp=%d "
                    "(each rank keeps whole heads and their states): use a tp that divides %lld", (long long)nh, p->tp,
                    (long long)nh);
  if (Ls && a->strategy == TPR_KV_CONVERT_TO_MHA)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: minicpm_sala: %lld sparse-attention KV heads over tp=%d: the block "
                    "selection scores a KV head's whole query group, so tp must divide the KV heads or be a "
                    "multiple of them", (long long)c->num_kv_heads, p->tp);
  int from = p->n_tensors;
  if (Ll) {
    int64_t nr = nh / p->tp;
    bool kv_split = nkv % p->tp == 0;
    int64_t kr = kv_split ? nkv / p->tp : nkv;
    tpr_shard_transform kx = kv_split ? TPR_XFORM_COLUMN : TPR_XFORM_REPLICATE;
    TPR_CHECK(add(p, "model.layers.{L}.self_attn.q_proj.weight", TPR_XFORM_COLUMN, Ll, nh * D, H, nr * D, H));
    TPR_CHECK(add(p, "model.layers.{L}.self_attn.k_proj.weight", kx, Ll, nkv * D, H, kr * D, H));
    TPR_CHECK(add(p, "model.layers.{L}.self_attn.v_proj.weight", kx, Ll, nkv * D, H, kr * D, H));
    TPR_CHECK(add(p, "model.layers.{L}.self_attn.o_proj.weight", TPR_XFORM_ROW, Ll, H, nh * D, H, nr * D));
    if (c->linear_qk_norm) {
      TPR_CHECK(add(p, "model.layers.{L}.self_attn.q_norm.weight", TPR_XFORM_REPLICATE, Ll, D, 0, D, 0));
      TPR_CHECK(add(p, "model.layers.{L}.self_attn.k_norm.weight", TPR_XFORM_REPLICATE, Ll, D, 0, D, 0));
    }
    if (c->linear_out_norm)
      TPR_CHECK(add(p, "model.layers.{L}.self_attn.o_norm.weight", TPR_XFORM_REPLICATE, Ll, nh * D, 0, nh * D, 0));
    if (c->linear_out_gate)
      TPR_CHECK(add(p, "model.layers.{L}.self_attn.z_proj.weight", TPR_XFORM_COLUMN, Ll, nh * D, H, nr * D, H));
    attn_layers(p, from, TPR_ATTN_LAYERS_LINEAR);
  }
  if (!Ls) return TPR_OK;
  from = p->n_tensors;
  TPR_CHECK(add(p, "model.layers.{L}.self_attn.q_proj.weight", TPR_XFORM_COLUMN_HEADS, Ls, a->nq * D, H,
                a->q_per_rank * D, H));
  TPR_CHECK(add(p, "model.layers.{L}.self_attn.k_proj.weight", TPR_XFORM_COLUMN_HEADS, Ls, a->nkv * D, H,
                a->kv_per_rank * D, H));
  kv_layout(p);
  TPR_CHECK(add(p, "model.layers.{L}.self_attn.v_proj.weight", TPR_XFORM_COLUMN_HEADS, Ls, a->nkv * D, H,
                a->kv_per_rank * D, H));
  kv_layout(p);
  TPR_CHECK(add(p, "model.layers.{L}.self_attn.o_proj.weight", TPR_XFORM_ROW_HEADS, Ls, H, a->nq * D, H,
                a->q_per_rank * D));
  if (c->attn_out_gate)
    TPR_CHECK(add(p, "model.layers.{L}.self_attn.o_gate.weight", TPR_XFORM_COLUMN_HEADS, Ls, a->nq * D, H,
                  a->q_per_rank * D, H));
  attn_layers(p, from, TPR_ATTN_LAYERS_SOFTMAX);
  return TPR_OK;
}

static tpr_status add_attention(tpr_shard_plan *p, const names *n) {
  const tpr_model_config *c = &p->config;
  const tpr_attn_plan *a = &p->attn;
  int64_t H = c->hidden_size, D = c->head_dim;
  TPR_CHECK(add(p, "model.layers.{L}.input_layernorm.weight", TPR_XFORM_REPLICATE, c->num_layers, H, 0, H, 0));
  if (c->family == TPR_FAMILY_MINICPM_SALA) {
    TPR_CHECK(add_sala_attention(p));
    return add(p, "model.layers.{L}.post_attention_layernorm.weight", TPR_XFORM_REPLICATE, c->num_layers, H, 0, H, 0);
  }
  TPR_CHECK(add_linear_attention(p));
  // The softmax-attention layers: every layer but the lightning ones.
  int64_t L = c->num_layers - c->num_linear_layers, first_softmax = p->n_tensors;
  TPR_CHECK(add(p, "model.layers.{L}.self_attn.q_proj.weight", TPR_XFORM_COLUMN_HEADS, L, a->nq * D, H,
                a->q_per_rank * D, H));  // (nq*D, H) -> (nq'/tp*D, H)
  TPR_CHECK(add(p, "model.layers.{L}.self_attn.k_proj.weight", TPR_XFORM_COLUMN_HEADS, L, a->nkv * D, H,
                a->kv_per_rank * D, H));  // (nkv*D, H) -> (nkv'/tp*D, H)
  kv_layout(p);
  TPR_CHECK(add(p, "model.layers.{L}.self_attn.v_proj.weight", TPR_XFORM_COLUMN_HEADS, L, a->nkv * D, H,
                a->kv_per_rank * D, H));
  kv_layout(p);
  TPR_CHECK(add(p, "model.layers.{L}.self_attn.o_proj.weight", TPR_XFORM_ROW_HEADS, L, H, a->nq * D, H,
                a->q_per_rank * D));  // (H, nq*D) -> (H, nq'/tp*D)
  if (c->qkv_bias) {
    // Column-parallel biases follow their weight's rows exactly: the same
    // head map (Q padded interleaved with zero heads, KV replicated), D
    // elements per head.
    TPR_CHECK(add(p, "model.layers.{L}.self_attn.q_proj.bias", TPR_XFORM_COLUMN_HEADS, L, a->nq * D, 0,
                  a->q_per_rank * D, 0));  // (nq*D) -> (nq'/tp*D)
    TPR_CHECK(add(p, "model.layers.{L}.self_attn.k_proj.bias", TPR_XFORM_COLUMN_HEADS, L, a->nkv * D, 0,
                  a->kv_per_rank * D, 0));  // (nkv*D) -> (nkv'/tp*D)
    kv_layout(p);
    TPR_CHECK(add(p, "model.layers.{L}.self_attn.v_proj.bias", TPR_XFORM_COLUMN_HEADS, L, a->nkv * D, 0,
                  a->kv_per_rank * D, 0));
    kv_layout(p);
  }
  if (c->qk_norm == TPR_QK_NORM_FULL) {
    // Held whole, padded like Q / replicated like K; selected by the rank tensor (docs/architecture.md section 5).
    TPR_CHECK(add(p, "model.layers.{L}.self_attn.q_norm.weight", TPR_XFORM_NORM_HEADS, L, a->nq * D, 0,
                  a->nq_padded * D, 0));
    TPR_CHECK(add(p, "model.layers.{L}.self_attn.k_norm.weight", TPR_XFORM_NORM_HEADS, L, a->nkv * D, 0,
                  a->nkv_eff * D, 0));
    kv_layout(p);
  } else if (c->qk_norm == TPR_QK_NORM_PER_HEAD) {
    TPR_CHECK(add(p, n->q_norm ? n->q_norm : "model.layers.{L}.self_attn.q_norm.weight", TPR_XFORM_REPLICATE, L, D,
                  0, D, 0));
    TPR_CHECK(add(p, n->k_norm ? n->k_norm : "model.layers.{L}.self_attn.k_norm.weight", TPR_XFORM_REPLICATE, L, D,
                  0, D, 0));
  }
  if (c->num_linear_layers) attn_layers(p, first_softmax, TPR_ATTN_LAYERS_SOFTMAX);
  return add(p, "model.layers.{L}.post_attention_layernorm.weight", TPR_XFORM_REPLICATE, c->num_layers, H, 0, H, 0);
}

static tpr_status add_mlp(tpr_shard_plan *p, const names *n) {
  const tpr_model_config *c = &p->config;
  int64_t H = c->hidden_size, E = c->num_experts, I = c->moe_intermediate_size, Lm = c->num_moe_layers;
  int64_t experts = Lm * p->experts_per_rank, Ir = p->expert_inter_per_rank;
  TPR_CHECK(add(p, n->moe_gate, TPR_XFORM_REPLICATE, Lm, E, H, E, H));  // every rank routes every token
  if (c->routing_bias) TPR_CHECK(add(p, n->moe_bias, TPR_XFORM_REPLICATE, Lm, E, 0, E, 0));
  TPR_CHECK(add(p, n->expert_up_gate, TPR_XFORM_EXPERT_COLUMN, experts, I, H, Ir, H));  // (I, H) -> (I/etp, H)
  TPR_CHECK(add(p, n->expert_up, TPR_XFORM_EXPERT_COLUMN, experts, I, H, Ir, H));
  TPR_CHECK(add(p, n->expert_down, TPR_XFORM_EXPERT_ROW, experts, H, I, H, Ir));  // (H, I) -> (H, I/etp)
  int64_t S = c->shared_expert_intermediate_size;
  if (S) {  // beside the routed experts of each MoE layer, sharded over tp like a dense MLP
    if (!n->shared_gate)
      return TPR_FAIL(TPR_ERR_UNSUPPORTED, "plan: %s has no shared expert", tpr_model_family_name(c->family));
    if (S % p->tp)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: the shared expert width %lld does not split over tp=%d",
                      (long long)S, p->tp);
    TPR_CHECK(add(p, n->shared_gate, TPR_XFORM_COLUMN, Lm, S, H, S / p->tp, H));  // (S, H) -> (S/tp, H)
    p->tensors[p->n_tensors - 1].moe_layers = true;
    TPR_CHECK(add(p, n->shared_up, TPR_XFORM_COLUMN, Lm, S, H, S / p->tp, H));
    p->tensors[p->n_tensors - 1].moe_layers = true;
    TPR_CHECK(add(p, n->shared_down, TPR_XFORM_ROW, Lm, H, S, H, S / p->tp));  // (H, S) -> (H, S/tp)
    p->tensors[p->n_tensors - 1].moe_layers = true;
  }
  int64_t Ld = c->num_layers - Lm, F = c->dense_intermediate_size;
  if (Ld > 0) {
    if (F % p->tp)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: the dense MLP width %lld does not split over tp=%d", (long long)F, p->tp);
    TPR_CHECK(add(p, "model.layers.{L}.mlp.gate_proj.weight", TPR_XFORM_COLUMN, Ld, F, H, F / p->tp, H));
    TPR_CHECK(add(p, "model.layers.{L}.mlp.up_proj.weight", TPR_XFORM_COLUMN, Ld, F, H, F / p->tp, H));
    TPR_CHECK(add(p, "model.layers.{L}.mlp.down_proj.weight", TPR_XFORM_ROW, Ld, H, F, H, F / p->tp));
  }
  return TPR_OK;
}

tpr_status tpr_shard_plan_build(const tpr_model_config *c, int tp, int ep, int etp, int dp, tpr_dtype dtype,
                                tpr_shard_plan *out) {
  memset(out, 0, sizeof *out);
  TPR_CHECK(tpr_model_config_validate(c, "plan: model config"));
  if (!tpr_dtype_valid(dtype)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: invalid dtype %d", (int)dtype);
  if (tp < 1 || dp < 1 || (int64_t)tp * dp > (1 << 24))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: tp=%d dp=%d: both must be >= 1 with a world of at most 2^24", tp, dp);
  tpr_mesh m;
  TPR_CHECK(tpr_mesh_init(tp * dp, 0, tp, ep, etp, &m));  // world = dp*tp = edp*ep*etp
  if (c->num_experts == 0 && ep != 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: %s has no experts to split over ep=%d (use ep 1)",
                    tpr_model_family_name(c->family), ep);
  if (c->num_experts % ep)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: %lld experts do not split into contiguous blocks over ep=%d",
                    (long long)c->num_experts, ep);
  if (c->moe_intermediate_size % etp)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "plan: the expert width %lld does not split over etp=%d",
                    (long long)c->moe_intermediate_size, etp);
  tpr_shard_plan *p = out;
  p->config = *c;
  p->dtype = dtype;
  p->world = m.world_size, p->tp = tp, p->dp = m.dp, p->ep = ep, p->etp = etp, p->edp = m.edp;
  p->vocab_padded = (c->vocab_size + tp - 1) / tp * tp;
  p->experts_per_rank = c->num_experts / ep;
  p->expert_inter_per_rank = c->moe_intermediate_size / etp;
  TPR_CHECK(tpr_attn_plan_build(c->num_heads, c->num_kv_heads, c->head_dim, tp, &p->attn));
  const names *n = c->family == TPR_FAMILY_MINIMAX_M2 || c->family == TPR_FAMILY_MINIMAX ? &minimax_names
                   : c->family == TPR_FAMILY_HUNYUAN_V1_MOE ? &hunyuan_names
                                                            : &qwen3_names;
  int64_t H = c->hidden_size, V = c->vocab_size, Vr = p->vocab_padded / tp;
  tpr_status rc = TPR_OK;
  TPR_CHECK_GOTO(add(p, "model.embed_tokens.weight", TPR_XFORM_VOCAB, 1, V, H, Vr, H), rc, fail);
  TPR_CHECK_GOTO(add_attention(p, n), rc, fail);
  TPR_CHECK_GOTO(add_mlp(p, n), rc, fail);
  TPR_CHECK_GOTO(add(p, "model.norm.weight", TPR_XFORM_REPLICATE, 1, H, 0, H, 0), rc, fail);
  if (!c->tie_word_embeddings) TPR_CHECK_GOTO(add(p, "lm_head.weight", TPR_XFORM_VOCAB, 1, V, H, Vr, H), rc, fail);
  return TPR_OK;
fail:
  tpr_shard_plan_free(p);
  return rc;
}

// Padding heads (-1 entries) among entries [from, from+n) of a head map.
static int64_t pad_heads(const int32_t *map, int64_t from, int64_t n) {
  int64_t k = 0;
  for (int64_t j = from; j < from + n; j++) k += map[j] < 0;
  return k;
}

tpr_status tpr_shard_plan_rank_bytes(const tpr_shard_plan *p, int rank, uint64_t *held, uint64_t *padding) {
  tpr_mesh m;
  TPR_CHECK(tpr_mesh_init(p->world, rank, p->tp, p->ep, p->etp, &m));
  const tpr_attn_plan *a = &p->attn;
  int64_t D = a->head_dim, H = p->config.hidden_size, r = m.tp_rank;
  int64_t q_pad = pad_heads(a->q_head_map, r * a->q_per_rank, a->q_per_rank);
  int64_t kv_pad = pad_heads(a->kv_head_map, r * a->kv_per_rank, a->kv_per_rank);
  // Vocab rows [first, end) of this rank; those at or past V are zeros.
  int64_t V = p->config.vocab_size, first = r * (p->vocab_padded / p->tp), end = first + p->vocab_padded / p->tp;
  int64_t vocab_pad = end > V ? end - (first > V ? first : V) : 0;
  uint64_t pad = 0;
  for (int i = 0; i < p->n_tensors; i++) {
    const tpr_shard_tensor *t = &p->tensors[i];
    int64_t zeros = 0;  // zero elements in one tensor of this kind on this rank
    switch (t->transform) {
      case TPR_XFORM_COLUMN_HEADS:
      case TPR_XFORM_ROW_HEADS: zeros = (t->kv_layout ? kv_pad : q_pad) * D * (t->ndim == 2 ? H : 1); break;
      case TPR_XFORM_NORM_HEADS:  // held whole: every rank holds all the padding
        zeros = t->kv_layout ? pad_heads(a->kv_head_map, 0, a->nkv_eff) * D : (a->nq_padded - a->nq) * D;
        break;
      case TPR_XFORM_VOCAB: zeros = vocab_pad * H; break;
      default: break;
    }
    pad += (uint64_t)zeros * (uint64_t)t->count * tpr_dtype_size(p->dtype);
  }
  *held = p->rank_bytes;  // SPMD: identical buffers on every rank
  *padding = pad;
  return TPR_OK;
}
