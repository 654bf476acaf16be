// InfLLM-v2 sparse attention, CPU (semantics: tpr_pb_sparse_attention_paged
// in program.h; the published sources: docs/minicpm-sala.md). Keys and values
// are read in place from the paged pool through each sequence's block table.
//
// Per sequence of the call: its length L (1 + its largest position here)
// decides dense (L < dense_len) or sparse once, as the published forward
// does; with the prefill-length operand, each row decides by its own length
// max(p + 1, prefill_len) instead (program.h). A sequence with a sparse row
// has its compressed keys (mean of kernel_size keys every kernel_stride
// positions, per KV head) computed once, in double, each chunk summed on its
// own so equal chunks give equal means, and rounded to f32. With the compressed-key pool (i[7]'s TPR_SPARSE_CK_POOL) they are not
// recomputed: the chunks that end at this call's positions are written to
// the pool (the same rounding) and scoring reads the pool, so a decode step
// reads L/stride compressed keys instead of L keys. Then each (token,
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
  float *c;       // (n_c, Hkv, D) compressed keys recomputed, or NULL (dense, or read from the pool)
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

// out (D) := chunk j of KV head g: the mean of its kernel_size keys, summed
// in double in position order, rounded to f32 (the pool's and the plain
// form's value alike). acc (D) scratch.
static void mean_chunk(const sa_kv *kv, const sa_seq *sq, const sa_cfg *cf, int64_t j, int64_t g, int64_t D,
                       double *acc, float *out) {
  const int64_t dst = kv->ks[3];
  for (int64_t d = 0; d < D; d++) acc[d] = 0;
  for (int64_t r = j * cf->st; r < j * cf->st + cf->ks; r++) {
    const float *k = kv_row(kv->k, kv->ks, kv, sq, r, g);
    for (int64_t d = 0; d < D; d++) acc[d] += k[d * dst];
  }
  for (int64_t d = 0; d < D; d++) out[d] = (float)(acc[d] / (double)cf->ks);
}

// c (n_c, Hkv, D) := every chunk of the sequence (the plain form).
static tpr_status compress(const sa_kv *kv, const sa_seq *sq, const sa_cfg *cf, int64_t Hkv, int64_t D, float *c,
                           int nt) {
  const int64_t n = sq->n_c * Hkv;
  int oom = 0;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    double *acc = malloc((size_t)D * sizeof *acc);
    if (!acc) {
#pragma omp atomic write
      oom = 1;
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; i++)
      if (acc) mean_chunk(kv, sq, cf, i / Hkv, i % Hkv, D, acc, c + i * D);
    free(acc);
  }
  return oom ? TPR_FAIL(TPR_ERR_OOM, "sparse_attention_paged (cpu): compression scratch") : TPR_OK;
}

// The compressed-key pool (NB, R, Hkv, D) contiguous: chunk j ends at
// position e = j*stride + kernel_size - 1, in the sequence's block e / pbs,
// row (e % pbs) / stride (program.h).
typedef struct sa_ckpool {
  float *c;  // NULL: the plain form
  int64_t R;
} sa_ckpool;

static float *pool_chunk(const sa_ckpool *cp, const sa_kv *kv, const sa_seq *sq, const sa_cfg *cf, int64_t j,
                         int64_t g, int64_t Hkv, int64_t D) {
  const int64_t e = j * cf->st + cf->ks - 1;
  return cp->c + ((kv->blocks[sq->blk0 + e / kv->pbs] * cp->R + (e % kv->pbs) / cf->st) * Hkv + g) * D;
}

// Chunk j of head g as scoring reads it.
static inline const float *chunk_at(const sa_ckpool *cp, const sa_kv *kv, const sa_seq *sq, const sa_cfg *cf,
                                    int64_t j, int64_t g, int64_t Hkv, int64_t D) {
  return cp->c ? pool_chunk(cp, kv, sq, cf, j, g, Hkv, D) : sq->c + (j * Hkv + g) * D;
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

// A sequence's compressed keys as select.h reads them: from the pool or
// from its own recomputed array.
typedef struct sa_chunks {
  const sa_ckpool *cp;
  const sa_kv *kv;
  const sa_seq *sq;
  const sa_cfg *cf;
  int64_t Hkv, D;
} sa_chunks;

static const float *chunk_of(const void *ctx, int64_t j, int64_t g) {
  const sa_chunks *k = ctx;
  return chunk_at(k->cp, k->kv, k->sq, k->cf, j, g, k->Hkv, k->D);
}

// sel[0..qb] := the blocks query position p of KV head g attends (select.h;
// dense: every block up to the query's).
static void select_blocks(const sa_cfg *cf, const sa_kv *kv, const sa_ckpool *cp, const sa_seq *sq, int64_t p,
                          int64_t g, int64_t G, int64_t Hkv, int64_t D, int64_t cap, bool dense, sa_scratch *sc) {
  const sa_chunks ck = {.cp = cp, .kv = kv, .sq = sq, .cf = cf, .Hkv = Hkv, .D = D};
  const tpr__sa_sel_scratch ss = {.S = sc->S, .w = sc->w, .mz = sc->mz, .score = sc->score, .cap = cap};
  tpr__sa_select(cf, dense, chunk_of, &ck, sq->n_c, g, D, sc->qd, G, p, &ss, sc->sel);
}


// out rows of token t, heads of group g := softmax over the picked keys <= p,
// times v. Keys outer, the group's heads inner: each key and value row is read
// once for the whole group. Per head, the weighted sum runs over the keys in
// ascending order.
//
// Cloned for AVX2 (picked at load time where the CPU has it): its double
// loops run 4 lanes wide instead of SSE2's 2. AVX2 alone brings no FMA, so
// no multiply-add is contracted and both clones give the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx2", "default")))
#endif
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
        const double w = tpr__sa_dot(sc->qd + h * D, k, dk, D) * cf->scale;
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

// The pool's chunks that end at this call's positions := their means, for
// every sequence (dense ones too: they turn sparse later). One item per
// (token, KV head); each writes its own row.
static tpr_status fill_pool(const sa_ckpool *cp, const sa_kv *kv, const sa_seq *sq, const sa_cfg *cf,
                            const tpr_tensor *seq, const tpr_tensor *pos, int64_t T, int64_t Hkv, int64_t D, int nt) {
  int oom = 0;
#pragma omp parallel num_threads(nt) if (nt > 1 && T * Hkv > 1)
  {
    double *acc = malloc((size_t)D * sizeof *acc);
    if (!acc) {
#pragma omp atomic write
      oom = 1;
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < T * Hkv; i++) {
      const int64_t t = i / Hkv, g = i % Hkv, s = at1(seq, t), e = s < 0 ? -1 : at1(pos, t);
      if (!acc || e + 1 < cf->ks || (e + 1 - cf->ks) % cf->st) continue;  // padded, or no chunk ends at e
      const int64_t j = (e + 1 - cf->ks) / cf->st;
      mean_chunk(kv, &sq[s], cf, j, g, D, acc, pool_chunk(cp, kv, &sq[s], cf, j, g, Hkv, D));
    }
    free(acc);
  }
  return oom ? TPR_FAIL(TPR_ERR_OOM, "sparse_attention_paged (cpu): compression scratch") : TPR_OK;
}

// q (T, Hq, D) f32, k_pool/v_pool (NB, bs, Hkv, D) f32, block_tables (B, MB)
// i32, seq (T) i32, positions (T) i32[, ck_pool (NB, R, Hkv, D) f32 written
// in place][, prefill_len (T) i32] (i[7]'s optional inputs, ops.h); out
// (T, Hq, D) contiguous.
TPR_CPU_KERNEL(sparse_attention_paged) {
  const char *op = "sparse_attention_paged (cpu)";
  const int64_t opt = attrs->n_i > 7 ? attrs->i[7] : 0;
  const int n_ck = (opt & TPR_SPARSE_CK_POOL) ? 1 : 0, n_pl = (opt & TPR_SPARSE_PREFILL_LEN) ? 1 : 0;
  if (n_in != 6 + n_ck + n_pl)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: expected %d inputs, got %d", op, 6 + n_ck + n_pl, n_in);
  const tpr_tensor *q = in[0], *kp = in[1], *vp = in[2], *bt = in[3], *seq = in[4], *pos = in[5];
  const tpr_tensor *ckt = n_ck ? in[6] : NULL, *pl = n_pl ? in[6 + n_ck] : NULL;
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
  const sa_ckpool cp = {.c = ckt ? tpr_tensor_data(ckt) : NULL, .R = ckt ? ckt->shape[1] : 0};
  if (rc == TPR_OK && cp.c) rc = fill_pool(&cp, &kv, sq, &cf, seq, pos, T, Hkv, D, nt);
  int64_t max_c = 0;
  for (int64_t s = 0; s < B && rc == TPR_OK; s++) {
    if (!sq[s].sparse) continue;
    sq[s].n_c = sq[s].len >= cf.ks ? (sq[s].len - cf.ks) / cf.st + 1 : 0;
    max_c = sq[s].n_c > max_c ? sq[s].n_c : max_c;
    if (cp.c) continue;  // scoring reads the pool
    sq[s].c = malloc((size_t)(sq[s].n_c * Hkv * D > 0 ? sq[s].n_c * Hkv * D : 1) * sizeof(float));
    if (!sq[s].c) {
      rc = TPR_FAIL(TPR_ERR_OOM, "%s: compressed keys of a %lld-token sequence", op, (long long)sq[s].len);
      break;
    }
    rc = compress(&kv, &sq[s], &cf, Hkv, D, sq[s].c, nt);
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
      select_blocks(&cf, &kv, &cp, &sq[s], p, g, G, Hkv, D, cap, deciding_len(pl, &sq[s], t, p) < cf.dense_len,
                    &sc);
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
