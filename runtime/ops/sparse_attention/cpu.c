// InfLLM-v2 sparse attention, CPU (semantics: tpr_pb_sparse_attention_paged
// in program.h; the published sources: docs/minicpm-sala.md). Keys and values
// are read in place from the paged pool through each sequence's block table.
//
// Per sequence of the call: its length L (1 + its largest position here)
// decides dense (L < dense_len) or sparse once, as the published forward
// does; with the prefill-length operand, each row decides by its own length
// max(p + 1, prefill_len) instead (program.h). A sequence with a sparse row
// has its compressed keys (mean of kernel_size keys every
// kernel_stride positions, per KV head) are computed once, in double, each
// chunk summed on its own so equal chunks give equal means. Then each (token,
// KV head) is one work item: it picks its blocks (init and local always; the
// best-scoring others up to topk - init_blocks, ties to the lower block) and
// runs every query head of its group over the picked keys up to its position.
// Scores, softmax and the weighted sum are in double from the f32 operands,
// so the selection equals a float64 reference's wherever a float64
// reference's is decided (exact ties included: both take the lower index).
// Items are split statically over threads and each writes only its own
// output rows, so results do not depend on the thread count. Every index is
// checked before anything is written.
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/cpu_threads.h"
#include "runtime/ops/sparse_attention/select.h"
#include "runtime/ops/strided.h"

typedef tpr__sa_cfg sa_cfg;  // select.h

typedef struct sa_seq {
  int64_t len;    // L: 1 + the largest position of its tokens in this call; 0: absent
  bool sparse;    // a row of it is sparse
  int64_t blk0;   // its first entry in the flat block list
  int64_t n_c;    // compressed chunks (sparse sequences only)
  double *c;      // (n_c, Hkv, D) compressed keys, or NULL (dense)
} sa_seq;

// The pool as the kernel reads it: rows of position r of a sequence live in
// block blocks[blk0 + r / pbs], offset r % pbs.
typedef struct sa_kv {
  const float *k, *v;
  const int64_t *ks, *vs;  // the pools' strides (NB, bs, Hkv, D)
  const int64_t *blocks;
  int64_t pbs;
} sa_kv;

static const float *kv_row(const float *base, const int64_t *st, const sa_kv *kv, const sa_seq *sq, int64_t r,
                           int64_t g) {
  return base + kv->blocks[sq->blk0 + r / kv->pbs] * st[0] + (r % kv->pbs) * st[1] + g * st[2];
}

static int64_t at1(const tpr_tensor *t, int64_t i) { return tpr__index_at(t, i * t->stride[0]); }

// c (n_c, Hkv, D) := the mean of each chunk's kernel_size keys, in double.
static void compress(const sa_kv *kv, const sa_seq *sq, const sa_cfg *cf, int64_t Hkv, int64_t D, double *c,
                     int nt) {
  const int64_t n = sq->n_c * Hkv, dst = kv->ks[3];
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (int64_t i = 0; i < n; i++) {
    const int64_t j = i / Hkv, g = i % Hkv;
    double *out = c + i * D;
    for (int64_t d = 0; d < D; d++) out[d] = 0;
    for (int64_t r = j * cf->st; r < j * cf->st + cf->ks; r++) {
      const float *k = kv_row(kv->k, kv->ks, kv, sq, r, g);
      for (int64_t d = 0; d < D; d++) out[d] += k[d * dst];
    }
    for (int64_t d = 0; d < D; d++) out[d] /= (double)cf->ks;
  }
}

// Scratch of one thread.
typedef struct sa_scratch {
  double *S;      // (max n_c) group-summed chunk probabilities
  double *score;  // (max blocks) candidate scores
  char *sel;      // (max blocks) 1 = attended
  double *w;      // (G, cap) the group's attention logits; stage 1's chunk logits too
  double *acc;    // (G, D) the weighted sums
  double *mz;     // (2G) each head's max logit, then its sum of exps
  double *qd;     // (G, D) the group's queries in double
} sa_scratch;

// The length that decides whether the row of token t (position p) is dense:
// the call's (the published rule), or with the prefill-length operand pl
// (T) the row's own, max(p + 1, pl[t]) where pl[t] > 0.
static int64_t deciding_len(const tpr_tensor *pl, const sa_seq *sq, int64_t t, int64_t p) {
  const int64_t n = pl ? tpr__index_at(pl, t * pl->stride[0]) : 0;
  if (n <= 0) return sq->len;
  return n > p + 1 ? n : p + 1;
}

// sel[0..qb] := the blocks query position p of KV head g attends (select.h;
// dense: every block up to the query's).
static void select_blocks(const sa_cfg *cf, const sa_seq *sq, int64_t p, int64_t g, int64_t G, int64_t Hkv,
                          int64_t D, bool dense, sa_scratch *sc) {
  const tpr__sa_sel_scratch ss = {.S = sc->S, .w = sc->w, .score = sc->score};
  tpr__sa_select(cf, dense, sq->c, sq->n_c, Hkv, g, D, sc->qd, G, p, &ss, sc->sel);
}

// q . k in double: four interleaved partial sums combined in one fixed tree
// when k is contiguous (a deterministic order the compiler can vectorise),
// else in order.
static inline double dot_qk(const double *q, const float *k, int64_t dk, int64_t D) {
  if (dk != 1) {
    double dot = 0;
    for (int64_t d = 0; d < D; d++) dot += q[d] * k[d * dk];
    return dot;
  }
  double a[4] = {0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 4 <= D; d += 4)
    for (int l = 0; l < 4; l++) a[l] += q[d + l] * k[d + l];
  for (int l = 0; d < D; d++, l++) a[l] += q[d] * k[d];
  return (a[0] + a[2]) + (a[1] + a[3]);
}

// out rows of token t, heads of group g := softmax over the picked keys <= p,
// times v. Keys outer, the group's heads inner: each key and value row is read
// once for the whole group. Per head, the weighted sum runs over the keys in
// ascending order.
static void attend(const sa_cfg *cf, const sa_kv *kv, const sa_seq *sq, int64_t p, int64_t g, int64_t G, int64_t D,
                   int64_t cap, sa_scratch *sc, float *out_t) {
  const int64_t qb = p / cf->bs, dk = kv->ks[3], dv = kv->vs[3];
  double *m = sc->mz, *z = sc->mz + G;
  for (int64_t h = 0; h < G; h++) m[h] = -INFINITY, z[h] = 0;
  int64_t n = 0;  // keys attended
  for (int64_t b = 0; b <= qb; b++) {
    if (!sc->sel[b]) continue;
    const int64_t end = (b + 1) * cf->bs < p + 1 ? (b + 1) * cf->bs : p + 1;
    for (int64_t r = b * cf->bs; r < end; r++, n++) {
      const float *k = kv_row(kv->k, kv->ks, kv, sq, r, g);
      for (int64_t h = 0; h < G; h++) {
        const double w = dot_qk(sc->qd + h * D, k, dk, D) * cf->scale;
        sc->w[h * cap + n] = w;
        m[h] = w > m[h] ? w : m[h];
      }
    }
  }
  for (int64_t e = 0; e < G * D; e++) sc->acc[e] = 0;
  n = 0;
  for (int64_t b = 0; b <= qb; b++) {
    if (!sc->sel[b]) continue;
    const int64_t end = (b + 1) * cf->bs < p + 1 ? (b + 1) * cf->bs : p + 1;
    for (int64_t r = b * cf->bs; r < end; r++, n++) {
      const float *v = kv_row(kv->v, kv->vs, kv, sq, r, g);
      for (int64_t h = 0; h < G; h++) {
        const double e = exp(sc->w[h * cap + n] - m[h]);
        double *acc = sc->acc + h * D;
        z[h] += e;
        if (dv == 1)
          for (int64_t d = 0; d < D; d++) acc[d] += e * v[d];
        else
          for (int64_t d = 0; d < D; d++) acc[d] += e * v[d * dv];
      }
    }
  }
  for (int64_t h = 0; h < G; h++)
    for (int64_t d = 0; d < D; d++) out_t[h * D + d] = (float)(sc->acc[h * D + d] / z[h]);
}

// Lengths per sequence and every index the kernel reads, checked; which
// sequences have a sparse row; the flat block list filled. Nothing is
// written on failure.
static tpr_status plan(const char *op, const tpr_tensor *bt, const tpr_tensor *seq, const tpr_tensor *pos,
                       const tpr_tensor *pl, int64_t dense_len, int64_t NB, int64_t pbs, sa_seq *sq,
                       int64_t **blocks, int64_t *max_len) {
  const int64_t T = seq->shape[0], B = bt->shape[0], MB = bt->shape[1];
  *max_len = 0;
  for (int64_t t = 0; t < T; t++) {
    const int64_t s = at1(seq, t), p = at1(pos, t);
    if (s < 0) continue;  // a padded token
    if (s >= B)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: seq[%lld] = %lld but block_tables has B = %lld rows", op,
                      (long long)t, (long long)s, (long long)B);
    if (p < 0 || p >= MB * pbs)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: positions[%lld] = %lld is outside [0, MB*bs = %lld)", op,
                      (long long)t, (long long)p, (long long)(MB * pbs));
    if (p + 1 > sq[s].len) sq[s].len = p + 1;
    if (p + 1 > *max_len) *max_len = p + 1;
  }
  for (int64_t t = 0; t < T; t++) {
    const int64_t s = at1(seq, t);
    if (s >= 0 && deciding_len(pl, &sq[s], t, at1(pos, t)) >= dense_len) sq[s].sparse = true;
  }
  int64_t total = 0;
  for (int64_t s = 0; s < B; s++) sq[s].blk0 = total, total += (sq[s].len + pbs - 1) / pbs;
  *blocks = malloc((size_t)(total > 0 ? total : 1) * sizeof **blocks);
  if (!*blocks) return TPR_FAIL(TPR_ERR_OOM, "%s: %lld block table entries", op, (long long)total);
  for (int64_t s = 0; s < B; s++)
    for (int64_t j = 0; j * pbs < sq[s].len; j++) {
      const int64_t b = tpr__index_at(bt, s * bt->stride[0] + j * bt->stride[1]);
      if (b < 0 || b >= NB)
        return TPR_FAIL(TPR_ERR_INVALID_ARG,
                        "%s: block_tables[%lld][%lld] = %lld (read by sequence %lld of length %lld) is outside "
                        "the pool's [0, NB = %lld) blocks",
                        op, (long long)s, (long long)j, (long long)b, (long long)s, (long long)sq[s].len,
                        (long long)NB);
      (*blocks)[sq[s].blk0 + j] = b;
    }
  return TPR_OK;
}

static void free_scratch(sa_scratch *sc) {
  free(sc->S), free(sc->score), free(sc->sel), free(sc->w), free(sc->acc), free(sc->qd), free(sc->mz);
}

// q (T, Hq, D) f32, k_pool/v_pool (NB, bs, Hkv, D) f32, block_tables (B, MB)
// i32, seq (T) i32, positions (T) i32, and in its prefill-length form
// prefill_len (T) i32; out (T, Hq, D) contiguous.
TPR_CPU_KERNEL(sparse_attention_paged) {
  const char *op = "sparse_attention_paged (cpu)";
  if (n_in != 6 && n_in != 7) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: expected 6 or 7 inputs, got %d", op, n_in);
  const tpr_tensor *q = in[0], *kp = in[1], *vp = in[2], *bt = in[3], *seq = in[4], *pos = in[5];
  const tpr_tensor *pl = n_in == 7 ? in[6] : NULL;
  // Dtypes, shapes and attributes: the shape rule (rules.c) checked them.
  const sa_cfg cf = tpr__sa_cfg_of(attrs);
  const int64_t T = q->shape[0], Hq = q->shape[1], D = q->shape[2], B = bt->shape[0];
  const int64_t NB = kp->shape[0], pbs = kp->shape[1], Hkv = kp->shape[2], G = Hq / Hkv;
  sa_seq *sq = calloc((size_t)(B > 0 ? B : 1), sizeof *sq);
  int64_t *blocks = NULL, max_len = 0;
  if (!sq) return TPR_FAIL(TPR_ERR_OOM, "%s: %lld sequences", op, (long long)B);
  tpr_status rc = plan(op, bt, seq, pos, pl, cf.dense_len, NB, pbs, sq, &blocks, &max_len);
  const sa_kv kv = {.k = tpr_tensor_data(kp), .v = tpr_tensor_data(vp), .ks = kp->stride, .vs = vp->stride,
                    .blocks = blocks, .pbs = pbs};
  const int nt = tpr__cpu_nt(ctx, T * Hq * (max_len > 1 ? max_len : 1));
  int64_t max_c = 0;
  for (int64_t s = 0; s < B && rc == TPR_OK; s++) {
    if (!sq[s].sparse) continue;
    sq[s].n_c = sq[s].len >= cf.ks ? (sq[s].len - cf.ks) / cf.st + 1 : 0;
    sq[s].c = malloc((size_t)(sq[s].n_c * Hkv * D > 0 ? sq[s].n_c * Hkv * D : 1) * sizeof(double));
    if (!sq[s].c) {
      rc = TPR_FAIL(TPR_ERR_OOM, "%s: compressed keys of a %lld-token sequence", op, (long long)sq[s].len);
      break;
    }
    compress(&kv, &sq[s], &cf, Hkv, D, sq[s].c, nt);
    max_c = sq[s].n_c > max_c ? sq[s].n_c : max_c;
  }
  float *o = tpr_tensor_data(out);
  if (rc == TPR_OK) memset(o, 0, (size_t)(T * Hq * D) * sizeof *o);  // padded tokens' rows stay 0
  const float *qb = tpr_tensor_data(q);
  const int64_t *qs = q->stride, max_blk = max_len / cf.bs + 1;
  const int64_t items = rc == TPR_OK ? T * Hkv : 0;
  const int64_t cap = max_len > max_c ? max_len : max_c + 1;  // keys one query attends at most, and chunks
  int oom = 0;
#pragma omp parallel num_threads(nt) if (nt > 1 && items > 1)
  {
    sa_scratch sc = {.S = malloc((size_t)(max_c + 1) * sizeof(double)),
                     .score = malloc((size_t)max_blk * sizeof(double)),
                     .sel = malloc((size_t)max_blk),
                     .w = malloc((size_t)(G * cap + 1) * sizeof(double)),
                     .acc = malloc((size_t)(G * D + 1) * sizeof(double)),
                     .qd = malloc((size_t)(G * D + 1) * sizeof(double)),
                     .mz = malloc((size_t)(2 * G + 1) * sizeof(double))};
    const int ok = sc.S && sc.score && sc.sel && sc.w && sc.acc && sc.qd && sc.mz;
    if (!ok) {
#pragma omp atomic write
      oom = 1;
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < items; i++) {
      const int64_t t = i / Hkv, g = i % Hkv, s = at1(seq, t);
      if (!ok || s < 0) continue;
      const int64_t p = at1(pos, t);
      for (int64_t h = 0; h < G; h++)
        for (int64_t d = 0; d < D; d++) sc.qd[h * D + d] = qb[t * qs[0] + (g * G + h) * qs[1] + d * qs[2]];
      select_blocks(&cf, &sq[s], p, g, G, Hkv, D, deciding_len(pl, &sq[s], t, p) < cf.dense_len, &sc);
      attend(&cf, &kv, &sq[s], p, g, G, D, cap, &sc, o + (t * Hq + g * G) * D);
    }
    free_scratch(&sc);
  }
  if (rc == TPR_OK && oom) rc = TPR_FAIL(TPR_ERR_OOM, "%s: per-thread scratch for %lld keys", op, (long long)max_len);
  for (int64_t s = 0; s < B; s++) free(sq[s].c);
  free(sq), free(blocks);
  return rc;
}

const tpr__kernel_def tpr__sparse_attention_cpu[] = {
    {TPR_OP_SPARSE_ATTENTION_PAGED, cpu_sparse_attention_paged},
    {0},
};
