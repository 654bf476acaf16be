// The step-time model (see stepmodel.h; docs/scale.md lists every call).
#include "scale/stepmodel.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/file_io.h"

static const char *const wl_names[] = {"train", "prefill", "decode"};
const char *tpr_workload_name(tpr_workload w) { return (unsigned)w < 3 ? wl_names[w] : "?"; }
int tpr_workload_from_name(const char *name) {
  for (int k = 0; name && k < 3; k++)
    if (!strcmp(name, wl_names[k])) return k;
  return -1;
}

static bool cfg_int(const cJSON *j, const char *k, int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
  if (!cJSON_IsNumber(v) || v->valuedouble < 0) return false;
  *out = (int64_t)v->valuedouble;
  return true;
}

tpr_status tpr_scale_config_read(const char *path, tpr_scale_config *out) {
  FILE *f = fopen(path, "rb");
  if (!f) return TPR_FAIL(TPR_ERR_IO, "scale: cannot open config %s", path);
  char *text = NULL;
  size_t len = 0, cap = 0, got;
  char buf[4096];
  while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
    if (len + got + 1 > cap) {
      cap = 2 * (len + got + 1);
      char *grown = realloc(text, cap);
      if (!grown) {
        free(text);
        fclose(f);
        return TPR_FAIL(TPR_ERR_OOM, "scale: reading %s", path);
      }
      text = grown;
    }
    memcpy(text + len, buf, got);
    len += got;
  }
  fclose(f);
  cJSON *j = text ? (text[len] = 0, cJSON_Parse(text)) : NULL;
  free(text);
  if (!j) return TPR_FAIL(TPR_ERR_FORMAT, "scale: %s is not a JSON object", path);
  *out = (tpr_scale_config){0};
  out->head_dim = 0;
  bool ok = cfg_int(j, "hidden_size", &out->hidden) && cfg_int(j, "num_hidden_layers", &out->layers) &&
            cfg_int(j, "num_attention_heads", &out->heads) && cfg_int(j, "num_key_value_heads", &out->kv_heads) &&
            cfg_int(j, "intermediate_size", &out->expert_ffn) && cfg_int(j, "num_local_experts", &out->experts) &&
            cfg_int(j, "num_experts_per_tok", &out->top_k) && cfg_int(j, "vocab_size", &out->vocab);
  if (ok && !cfg_int(j, "head_dim", &out->head_dim)) out->head_dim = out->heads ? out->hidden / out->heads : 0;
  cJSON_Delete(j);
  if (!ok || !out->hidden || !out->layers || !out->heads || !out->kv_heads || !out->experts || !out->top_k ||
      !out->vocab || !out->head_dim)
    return TPR_FAIL(TPR_ERR_FORMAT, "scale: %s lacks one of hidden_size, num_hidden_layers, num_attention_heads, "
                    "num_key_value_heads, intermediate_size, num_local_experts, num_experts_per_tok, vocab_size "
                    "(MiniMax-M2 names, all > 0)", path);
  return TPR_OK;
}

tpr_status tpr_scale_mesh_resolve(tpr_scale_mesh *m) {
  if (m->world < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "scale: mesh world %d < 1", m->world);
  if (!m->dp && !m->tp) m->dp = 1;
  if (!m->tp) m->tp = m->dp > 0 && m->world % m->dp == 0 ? m->world / m->dp : 0;
  if (!m->dp) m->dp = m->tp > 0 && m->world % m->tp == 0 ? m->world / m->tp : 0;
  if (!m->ep) m->ep = 1;
  if (!m->etp) m->etp = m->ep > 0 && m->world % m->ep == 0 ? m->world / m->ep : 0;
  if (m->tp < 1 || m->dp < 1 || m->ep < 1 || m->etp < 1 || m->dp * m->tp != m->world ||
      m->world % (m->ep * m->etp) != 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "scale: mesh world %d tp %d dp %d ep %d etp %d: needs world = dp*tp and "
                    "ep*etp dividing world", m->world, m->tp, m->dp, m->ep, m->etp);
  return TPR_OK;
}

static void add(tpr_scale_call *calls, int *n, tpr_coll op, int group, int stride, double size, double count) {
  if (group <= 1 || count <= 0 || *n >= TPR_SCALE_MAX_CALLS) return;
  calls[(*n)++] = (tpr_scale_call){op, group, stride, size, count};
}

// Parameters per rank: the dense ones (attention, router, embeddings, head)
// split over tp, the experts over ep*etp. Per layer for the first two.
// Attention holds ceil(heads / tp) query heads (padded) and at least one KV
// head: past tp = kv_heads the KV heads are replicated, not split.
static void params(const tpr_scale_config *c, const tpr_scale_mesh *m, double *dense_layer, double *expert_layer,
                   double *edges) {
  double H = (double)c->hidden, D = (double)c->head_dim;
  double q_r = ceil((double)c->heads / m->tp), kv_r = fmax(1, ceil((double)c->kv_heads / m->tp));
  *dense_layer = H * D * (2 * q_r + 2 * kv_r) + H * (double)c->experts + 2 * H;
  *expert_layer = (double)c->experts * 3 * H * (double)c->expert_ffn / ((double)m->ep * m->etp);
  *edges = 2 * (double)c->vocab * H / m->tp;
}

// The collectives of the step's program (forward, and backward in training):
// what tpr_m2_build emits for the mesh (test_scale counts them in the real
// programs). Backward: a grad_all_reduce mark becomes an all-reduce over its
// group, an all-to-all(v) another one, a reduce-scatter an all-gather; an
// all-gather whose output is replicated needs nothing (its cotangent is
// sliced).
static int program_calls(const tpr_scale_config *c, const tpr_scale_mesh *m, const tpr_scale_work *w,
                         const tpr_scale_hw *hw, tpr_scale_call *calls, int n) {
  const bool train = w->kind == TPR_WL_TRAIN;
  const double T = (double)w->tokens, H = (double)c->hidden, L = (double)c->layers, E = (double)c->experts;
  const double k = (double)(c->top_k < c->experts ? c->top_k : c->experts), A = hw->act_bytes;
  const double D = (double)c->head_dim, bwd = train ? 1 : 0;
  const int tp = m->tp, ep = m->ep, etp = m->etp;
  // Embedding: vocab-parallel rows summed over tp.
  add(calls, &n, TPR_COLL_ALL_REDUCE, tp, 1, T * H * A, 1);
  // Attention per layer: the QK-norm's sums of squares (q, k) and o_proj's
  // row-parallel output; backward: the sums' and the norm weights' marks and
  // the column-parallel input's.
  add(calls, &n, TPR_COLL_ALL_REDUCE, tp, 1, T * 4, 2 * L * (1 + bwd));
  add(calls, &n, TPR_COLL_ALL_REDUCE, tp, 1, (double)c->heads * D * 4, L * bwd);
  add(calls, &n, TPR_COLL_ALL_REDUCE, tp, 1, (double)c->kv_heads * D * 4, L * bwd);
  add(calls, &n, TPR_COLL_ALL_REDUCE, tp, 1, T * H * A, L * (1 + bwd));
  if (ep > 1 || m->dp > 1) {  // the all-to-all dispatcher (tpr's auto choice)
    double Ts = ceil(T / tp), N = etp * Ts;
    add(calls, &n, TPR_COLL_ALL_GATHER, etp, 1, N * H * A, L);  // tokens and gates to every F slice
    add(calls, &n, TPR_COLL_ALL_GATHER, etp, 1, N * E * 4, L);
    add(calls, &n, TPR_COLL_ALL_TO_ALL, ep, etp, E * 4, L);  // counts (no backward)
    add(calls, &n, TPR_COLL_ALL_TO_ALL, ep, etp, N * k * H * A, 2 * L * (1 + bwd));
    add(calls, &n, TPR_COLL_REDUCE_SCATTER, etp, 1, N * H * A, L);
    add(calls, &n, TPR_COLL_ALL_GATHER, tp, 1, tp * Ts * H * A, L);
    add(calls, &n, TPR_COLL_ALL_GATHER, etp, 1, N * H * A, L * bwd);  // the reduce-scatter's backward
    add(calls, &n, TPR_COLL_ALL_REDUCE, etp, 1, N * H * A, L * bwd);  // marks: gathered tokens, gates over etp
    add(calls, &n, TPR_COLL_ALL_REDUCE, etp, 1, N * E * 4, L * bwd);
    add(calls, &n, TPR_COLL_ALL_REDUCE, tp, 1, T * H * A, L * bwd);   // marks: x, gates before the tp slice
    add(calls, &n, TPR_COLL_ALL_REDUCE, tp, 1, T * E * 4, L * bwd);
  } else {  // all-reduce dispatcher: partial outputs summed over ep, then etp; marks on x and gates
    add(calls, &n, TPR_COLL_ALL_REDUCE, ep, etp, T * H * A, L * (1 + bwd));
    add(calls, &n, TPR_COLL_ALL_REDUCE, etp, 1, T * H * A, L * (1 + bwd));
    add(calls, &n, TPR_COLL_ALL_REDUCE, ep, etp, T * E * 4, L * bwd);
    add(calls, &n, TPR_COLL_ALL_REDUCE, etp, 1, T * E * 4, L * bwd);
  }
  if (train) {  // vocab-parallel loss: max, sum of exponentials, target logit; the head input's mark
    add(calls, &n, TPR_COLL_ALL_REDUCE, tp, 1, T * 4, 3);
    add(calls, &n, TPR_COLL_ALL_REDUCE, tp, 1, T * H * A, 1);
  } else {  // logits of the sampled rows
    add(calls, &n, TPR_COLL_ALL_GATHER, tp, 1, (double)c->vocab * (double)w->samples * 4, 1);
  }
  return n;
}

// Trained tensors per layer (q, k, v, o, q_norm, k_norm, two norms, router;
// the experts' w13 and w2) and outside the layers (embedding, head, final
// norm): FSDP gathers and scatters, and plain DP all-reduces, one tensor per
// call. The layers' tensors are counted at their class's mean size; the
// embedding and the head, which dwarf them (vocab x H), at their own, since a
// collective's cost is not linear in its size across regimes.
enum { DENSE_TENSORS = 9, EXPERT_TENSORS = 2 };

int tpr_scale_step_calls(const tpr_scale_config *c, const tpr_scale_mesh *m, const tpr_scale_work *w,
                         const tpr_scale_hw *hw, tpr_scale_call *calls) {
  int n = program_calls(c, m, w, hw, calls, 0);
  if (w->kind != TPR_WL_TRAIN) return n;
  const double L = (double)c->layers, E = (double)c->experts;
  const int tp = m->tp, ep = m->ep, etp = m->etp, edp = m->world / (ep * etp);
  // The trainer: loss and expert-load statistics over the world.
  add(calls, &n, TPR_COLL_ALL_REDUCE, m->world, 1, 12, 1);
  add(calls, &n, TPR_COLL_ALL_REDUCE, m->world, 1, L * E * 8, 1);
  double dl, el, edges;
  params(c, m, &dl, &el, &edges);
  const double dn = DENSE_TENSORS * L, en = EXPERT_TENSORS * L, dbytes = dl * L * 4 / dn, ebytes = el * L * 4 / en,
               table = edges / 2 * 4, norm = (double)c->hidden * 4;  // embedding or head; the final norm
  if (m->dp > 1 && m->fsdp) {
    // Every trained tensor gathered for forward and again for backward (but
    // the head, used last in forward and still whole), its gradient scattered.
    add(calls, &n, TPR_COLL_ALL_GATHER, m->dp, tp, dbytes, 2 * dn);
    add(calls, &n, TPR_COLL_REDUCE_SCATTER, m->dp, tp, dbytes, dn);
    add(calls, &n, TPR_COLL_ALL_GATHER, m->dp, tp, table, 3);
    add(calls, &n, TPR_COLL_REDUCE_SCATTER, m->dp, tp, table, 2);
    add(calls, &n, TPR_COLL_ALL_GATHER, m->dp, tp, norm, 2);
    add(calls, &n, TPR_COLL_REDUCE_SCATTER, m->dp, tp, norm, 1);
    add(calls, &n, TPR_COLL_ALL_GATHER, edp, ep * etp, ebytes, 2 * en);
    add(calls, &n, TPR_COLL_REDUCE_SCATTER, edp, ep * etp, ebytes, en);
  } else {  // plain data parallelism: every gradient all-reduced
    add(calls, &n, TPR_COLL_ALL_REDUCE, m->dp, tp, dbytes, dn);
    add(calls, &n, TPR_COLL_ALL_REDUCE, m->dp, tp, table, 2);
    add(calls, &n, TPR_COLL_ALL_REDUCE, m->dp, tp, norm, 1);
    add(calls, &n, TPR_COLL_ALL_REDUCE, edp, ep * etp, ebytes, en);
  }
  return n;
}

int tpr_scale_program_calls(const tpr_scale_config *c, const tpr_scale_mesh *m, const tpr_scale_work *w,
                            const tpr_scale_hw *hw, tpr_scale_call *calls) {
  return program_calls(c, m, w, hw, calls, 0);
}

void tpr_scale_step_work(const tpr_scale_config *c, const tpr_scale_mesh *m, const tpr_scale_work *w,
                         const tpr_scale_hw *hw, double *flops, double *bytes) {
  const double T = (double)w->tokens, H = (double)c->hidden, D = (double)c->head_dim, L = (double)c->layers;
  const double nq = (double)c->heads, nkv = (double)c->kv_heads, E = (double)c->experts;
  const double k = (double)(c->top_k < c->experts ? c->top_k : c->experts), F = (double)c->expert_ffn;
  const double P = hw->param_bytes;
  // Forward FLOPs of the replica's T tokens on one of its tp ranks (its
  // query heads and its KV heads, replicated past tp = kv_heads); expert
  // work spreads over all world ranks, dp*T tokens / world = T / tp each.
  const double q_r = ceil(nq / m->tp), kv_r = fmax(1, ceil(nkv / m->tp));
  double attn = 2 * T * H * (q_r + 2 * kv_r) * D + 2 * T * q_r * D * H + 4 * T * q_r * D * (double)w->context;
  double fwd = L * (attn + 2 * T * H * E + 6 * T * k * H * F / m->tp) +
               2 * (double)w->samples * H * (double)c->vocab / m->tp;
  double dl, el, edges;
  params(c, m, &dl, &el, &edges);
  if (w->kind == TPR_WL_TRAIN) {
    *flops = 3 * fwd;
    double held = dl * L + el * L + edges, owned = m->dp > 1 && m->fsdp ? held / m->dp : held;
    // Weights read forward and twice backward; AdamW reads w, g, m, v and writes w, m, v (f32).
    *bytes = 3 * held * P + 7 * 4 * owned;
  } else {
    // Inference reads the dense slices, the head's slice, the embedding's
    // rows of the step's tokens, and the experts the step's tokens pick: a
    // rank's experts see every replica's tokens (dp*T), each picking k of E
    // at random, so an expert is hit with probability 1 - (1 - k/E)^(dp*T)
    // (what tpr bench model counts as a decode step's bytes).
    double hit = 1 - pow(1 - k / E, T * m->dp);
    *flops = fwd;
    *bytes = (dl * L + edges / 2 + T * H / m->tp + hit * el * L) * P;
  }
}

tpr_status tpr_scale_predict(const tpr_scale_config *c, const tpr_scale_mesh *m, const tpr_scale_work *w,
                             const tpr_scale_hw *hw, tpr_scale_pred *out) {
  *out = (tpr_scale_pred){0};
  if (!(hw->gemm_flops > 0) || !(hw->mem_bw > 0) || hw->ranks_per_node < 1 || hw->act_bytes < 1 || hw->param_bytes < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "scale: hardware '%s' needs gemm_flops, mem_bw > 0, ranks_per_node, "
                    "act_bytes, param_bytes >= 1", hw->name);
  if (m->world < 1 || m->tp < 1 || m->dp < 1 || m->ep < 1 || m->etp < 1 || m->dp * m->tp != m->world ||
      m->world % (m->ep * m->etp))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "scale: mesh world %d tp %d dp %d ep %d etp %d is inconsistent "
                    "(tpr_scale_mesh_resolve first)", m->world, m->tp, m->dp, m->ep, m->etp);
  if ((unsigned)w->kind > TPR_WL_DECODE || w->tokens < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "scale: workload %d with %lld tokens per step", (int)w->kind,
                    (long long)w->tokens);
  tpr_scale_call calls[TPR_SCALE_MAX_CALLS];
  int n = tpr_scale_step_calls(c, m, w, hw, calls);
  for (int i = 0; i < n; i++) {
    const tpr_scale_call *k = &calls[i];
    bool intra = k->group * k->stride <= hw->ranks_per_node;
    const tpr_ab *ab = intra ? &hw->intra[k->op] : &hw->inter[k->op];
    if (intra && k->group < TPR_SCALE_FIT_RANKS && hw->by_ranks[k->op][k->group].points) ab = &hw->by_ranks[k->op][k->group];
    if (!ab->points) return TPR_FAIL(TPR_ERR_INVALID_ARG, "scale: hardware '%s' has no %s fit for %d ranks", hw->name,
                                     tpr_coll_name(k->op), k->group);
    out->coll_s[k->op] += k->count * tpr_ab_time(ab, k->op, k->group, k->size);
    out->coll_bytes[k->op] += k->count * k->size;
    out->coll_calls[k->op] += k->count;
    out->calls += k->count;
  }
  // The synchronisation cost of a call is that of its group's ranks
  // meeting: t_sync at the group's size (calibrated where group = world).
  for (int i = 0; i < n && m->world <= hw->ranks_per_node; i++)
    if (calls[i].group < TPR_SCALE_FIT_RANKS) out->sync_s += calls[i].count * hw->t_sync[w->kind][calls[i].group];
  tpr_scale_step_work(c, m, w, hw, &out->flops, &out->bytes);
  double node = m->world < hw->ranks_per_node ? m->world : hw->ranks_per_node;
  double s = hw->cores > 0 && node > hw->cores ? node / hw->cores : 1;
  // Ranks running at once share the node's memory bandwidth and slow each
  // other's GEMMs (shared caches, clocks): the rates measured with every
  // core busy, where the sweep measured them.
  double active = hw->cores > 0 ? fmin(node, hw->cores) : node, bw = hw->mem_bw, gemm = hw->gemm_flops;
  if (hw->mem_bw_node > 0 && active > 1) bw = fmin(bw, hw->mem_bw_node / active);
  if (hw->gemm_flops_busy > 0 && hw->cores > 1 && active > 1)
    gemm += (hw->gemm_flops_busy - hw->gemm_flops) * (active - 1) / (hw->cores - 1);
  double eta = hw->roofline_factor[w->kind] > 0 ? hw->roofline_factor[w->kind] : 1;
  out->compute_s = s * (hw->t_fixed[w->kind] + eta * fmax(out->flops / gemm, out->bytes / bw));
  out->comm_s = out->sync_s;
  for (int k = 0; k < TPR_COLL_COUNT; k++) out->comm_s += out->coll_s[k];
  out->step_s = out->compute_s + out->comm_s;
  out->tokens_per_s = (double)w->tokens * m->dp / out->step_s;
  return TPR_OK;
}
