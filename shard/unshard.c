#include "unshard.h"

#include <string.h>

static bool expert_kind(const tpr_shard_tensor *k) {
  return k->transform == TPR_XFORM_EXPERT_COLUMN || k->transform == TPR_XFORM_EXPERT_ROW;
}

bool tpr_unshard_heads_layout(const tpr_shard_tensor *k) {
  return k->transform == TPR_XFORM_COLUMN_HEADS || k->transform == TPR_XFORM_ROW_HEADS ||
         k->transform == TPR_XFORM_NORM_HEADS;
}

// The head layout of a *_HEADS kind: its map over all slots, the slots one
// buffer holds (all of them for NORM_HEADS, held whole) and where tp rank r's
// first slot is.
typedef struct heads {
  const int32_t *map;
  int64_t n_slots, per, D;
  bool whole;
} heads;

static heads heads_of(const tpr_shard_plan *p, const tpr_shard_tensor *k) {
  const tpr_attn_plan *a = &p->attn;
  heads h = {.map = k->kv_layout ? a->kv_head_map : a->q_head_map,
             .n_slots = k->kv_layout ? a->nkv_eff : a->nq_padded,
             .D = a->head_dim,
             .whole = k->transform == TPR_XFORM_NORM_HEADS};
  h.per = h.whole ? h.n_slots : (k->kv_layout ? a->kv_per_rank : a->q_per_rank);
  return h;
}

// First slot of head map[s]'s copies: only it counts in norms.
static bool first_copy(const heads *h, int64_t s) {
  for (int64_t j = 0; j < s; j++)
    if (h->map[j] == h->map[s]) return false;
  return h->map[s] >= 0;
}

// Slot i of a buffer: `unit` elements at `stride`-spaced positions — rows of
// D*cols for COLUMN/NORM, D columns of every row for ROW (H rows of per*D).
typedef struct slot_geom {
  int64_t rows, row_len, unit;  // for ROW_HEADS: rows = H, row_len = per*D; else rows = 1
} slot_geom;

static slot_geom geom_of(const tpr_shard_tensor *k, const heads *h) {
  if (k->transform == TPR_XFORM_ROW_HEADS) return (slot_geom){k->rank_shape[0], h->per * h->D, h->D};
  int64_t cols = k->transform == TPR_XFORM_NORM_HEADS || k->ndim == 1 ? 1 : k->rank_shape[1];
  return (slot_geom){1, h->per * h->D * cols, h->D * cols};
}

static float *slot_at(float *buf, const slot_geom *g, int64_t row, int64_t slot) {
  return buf + row * g->row_len + slot * g->unit;
}

bool tpr_unshard_fold_needs_gather(const tpr_shard_plan *p, const tpr_shard_tensor *k) {
  return tpr_unshard_heads_layout(k) && k->transform != TPR_XFORM_NORM_HEADS && k->kv_layout && p->attn.strategy != TPR_KV_SHARD;
}

void tpr_unshard_fold_grad(const tpr_shard_plan *p, const tpr_shard_tensor *k, int tp_rank, float *buf,
                           const float *gathered) {
  if (!tpr_unshard_heads_layout(k)) return;
  heads h = heads_of(p, k);
  slot_geom g = geom_of(k, &h);
  int64_t first = h.whole ? 0 : tp_rank * h.per, numel = g.rows * g.row_len;
  for (int64_t i = 0; i < h.per; i++) {
    int32_t head = h.map[first + i];
    for (int64_t r = 0; r < g.rows; r++) {
      float *dst = slot_at(buf, &g, r, i);
      if (head < 0) {
        memset(dst, 0, (size_t)g.unit * sizeof *dst);
        continue;
      }
      if (!h.whole && !gathered) continue;  // a sharded layout: no copies elsewhere
      // Sum over every slot of this head, in slot order (deterministic, the
      // same on every rank), then store it in this slot.
      float sum[g.unit > 0 ? g.unit : 1];
      memset(sum, 0, sizeof sum);
      for (int64_t s = 0; s < h.n_slots; s++) {
        if (h.map[s] != head) continue;
        const float *src = h.whole ? slot_at(buf, &g, r, s)
                                   : slot_at((float *)gathered + (s / h.per) * numel, &g, r, s % h.per);
        for (int64_t e = 0; e < g.unit; e++) sum[e] += src[e];
      }
      if (h.whole) continue;  // stored below, once every slot's sum is known
      memcpy(dst, sum, sizeof sum);
    }
  }
  if (!h.whole) return;
  // Held whole: fold in place, each head's sum written to all its slots.
  for (int64_t s = 0; s < h.n_slots; s++) {
    if (h.map[s] < 0 || !first_copy(&h, s)) continue;
    float sum[g.unit];
    memset(sum, 0, sizeof sum);
    for (int64_t t = s; t < h.n_slots; t++)
      if (h.map[t] == h.map[s])
        for (int64_t e = 0; e < g.unit; e++) sum[e] += buf[t * g.unit + e];
    for (int64_t t = s; t < h.n_slots; t++)
      if (h.map[t] == h.map[s]) memcpy(buf + t * g.unit, sum, sizeof sum);
  }
}

// In double, as 16 fixed chunks summed in parallel and then added in chunk
// order: the same result whatever the number of threads.
// Sum of squares in double: 16 fixed chunks, each over 8 lanes (element i
// in lane i mod 8 of its chunk) combined in one fixed tree, so the total is
// the same for any thread count, and the lanes are independent chains the
// compiler vectorises (one dependent chain ran at the add's latency: a
// 232M-parameter model's gradient norm took ~110 ms of a training step).
static double sumsq(const float *x, int64_t n) {
  enum { CHUNKS = 16, LANES = 8 };
  double part[CHUNKS];
  int64_t per = (n + CHUNKS - 1) / CHUNKS;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int c = 0; c < CHUNKS; c++) {
    double l[LANES] = {0};
    int64_t i = c * per, end = (c + 1) * per < n ? (c + 1) * per : n;
    for (; i + LANES <= end; i += LANES)
      for (int u = 0; u < LANES; u++) l[u] += (double)x[i + u] * x[i + u];
    for (int u = 0; i < end; i++, u++) l[u] += (double)x[i] * x[i];
    part[c] = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
  }
  double s = 0;
  for (int c = 0; c < CHUNKS; c++) s += part[c];
  return s;
}

double tpr_unshard_sumsq(const tpr_shard_plan *p, const tpr_shard_tensor *k, const tpr_mesh *m, const float *buf) {
  if (expert_kind(k) ? m->edp_rank != 0 : m->dp_rank != 0) return 0;
  int64_t numel = k->ndim == 2 ? k->rank_shape[0] * k->rank_shape[1] : k->rank_shape[0];
  if (!tpr_unshard_heads_layout(k)) return tpr_unshard_sumsq_range(k, m, buf, 0, numel);
  heads h = heads_of(p, k);
  if (h.whole && m->tp_rank != 0) return 0;
  slot_geom g = geom_of(k, &h);
  int64_t first = h.whole ? 0 : m->tp_rank * h.per;
  double s = 0;
  for (int64_t i = 0; i < h.per; i++)
    if (first_copy(&h, first + i))
      for (int64_t r = 0; r < g.rows; r++) s += sumsq(slot_at((float *)buf, &g, r, i), g.unit);
  return s;
}

double tpr_unshard_sumsq_range(const tpr_shard_tensor *k, const tpr_mesh *m, const float *buf, int64_t lo,
                               int64_t hi) {
  // The elements this rank counts are a prefix [0, end) of its buffer:
  // all of it, none of a tp-replicated tensor off tp rank 0, a vocabulary
  // shard's real rows (experts, dense column/row blocks: disjoint slices).
  int64_t end = k->ndim == 2 ? k->rank_shape[0] * k->rank_shape[1] : k->rank_shape[0];
  if (k->transform == TPR_XFORM_REPLICATE && m->tp_rank != 0) return 0;
  if (k->transform == TPR_XFORM_VOCAB) {
    int64_t Vr = k->rank_shape[0], real = k->global_shape[0] - m->tp_rank * Vr;
    real = real < 0 ? 0 : real > Vr ? Vr : real;
    end = real * k->rank_shape[1];
  }
  end = end < hi ? end : hi;
  return end > lo ? sumsq(buf, end - lo) : 0;
}

// Copies rows [0, nr) x cols [0, nc) of src (ld ls) to dst (ld ld_).
static void copy_box(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t nr, int64_t nc) {
  for (int64_t r = 0; r < nr; r++) memcpy(dst + r * ldd, src + r * lds, (size_t)nc * sizeof *dst);
}

void tpr_unshard_place(const tpr_shard_plan *p, const tpr_shard_tensor *k, const tpr_mesh *m, const float *buf,
                       float *hf) {
  int64_t R = k->rank_shape[0], C = k->ndim == 2 ? k->rank_shape[1] : 1;
  int64_t GC = k->ndim == 2 ? k->global_shape[1] : 1;
  switch (k->transform) {
    case TPR_XFORM_REPLICATE: memcpy(hf, buf, (size_t)(R * C) * sizeof *hf); return;
    case TPR_XFORM_VOCAB: {
      int64_t first = m->tp_rank * R, real = k->global_shape[0] - first;
      real = real < 0 ? 0 : real > R ? R : real;
      copy_box(hf + first * GC, GC, buf, C, real, C);
      return;
    }
    case TPR_XFORM_EXPERT_COLUMN: copy_box(hf + m->etp_rank * R * GC, GC, buf, C, R, C); return;
    case TPR_XFORM_EXPERT_ROW: copy_box(hf + m->etp_rank * C, GC, buf, C, R, C); return;
    case TPR_XFORM_COLUMN: copy_box(hf + m->tp_rank * R * GC, GC, buf, C, R, C); return;
    case TPR_XFORM_ROW: copy_box(hf + m->tp_rank * C, GC, buf, C, R, C); return;
    case TPR_XFORM_COLUMN_HEADS:
    case TPR_XFORM_ROW_HEADS:
    case TPR_XFORM_NORM_HEADS: {
      heads h = heads_of(p, k);
      slot_geom g = geom_of(k, &h);
      int64_t first = h.whole ? 0 : m->tp_rank * h.per;
      for (int64_t i = 0; i < h.per; i++) {
        int32_t head = h.map[first + i];
        if (head < 0) continue;
        if (k->transform == TPR_XFORM_ROW_HEADS)  // (H, heads*D): D columns of every row
          copy_box(hf + head * h.D, GC, buf + i * h.D, g.row_len, R, h.D);
        else
          memcpy(hf + head * g.unit, buf + i * g.unit, (size_t)g.unit * sizeof *hf);
      }
      return;
    }
    default: return;
  }
}
