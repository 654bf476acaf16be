// Lightning attention CPU kernels (ops.h, tpr_lightning_attention): the
// blocked prefill, its chunked backward, and the one-token decode step.
//
// The prefill follows transformers' MiniMaxLightningAttention block loop
// (modeling_minimax.py) in f32, per head, with slope s and a block of b
// tokens (local i, j = 1..b) starting from state S (D, D):
//   inter  = (Q * qdecay) @ S                  qdecay_i = exp(-s i)
//   intra  = ((Q @ K^T) * diag_decay) @ V      diag_decay_ij = exp(-s (i - j)), j <= i, else 0
//   o      = inter + intra
//   S'     = exp(-s b) S + (K * kdecay)^T @ V  kdecay_j = exp(-s (b - j))
// each decay an expf of the f32 product, as torch's buffers hold them. Each
// product is one sgemm on per-head contiguous copies of q, k, v (H, T, D).
//
// The backward is the same block loop run backwards, with no (T, T) buffer:
// a first pass recomputes the state at each block's start (T / block states
// of (D, D) per head), then, from G = d(final state), for each block from the
// last (M = diag_decay, P = dO V^T, A = Q K^T, G the gradient of the block's
// end state):
//   dQ = qdecay * (dO S^T) + (M * P) K
//   dK = kdecay * (V G^T) + (M * P)^T Q
//   dV = kdecay * (K G)   + (M * A)^T dO
//   G  = exp(-s b) G + (Q * qdecay)^T dO    (the gradient of the block's start state)
// and d(initial state) is the last G. The slopes are constants (transformers
// keeps them as buffers): they get no gradient.
//
// The document form (packed sequences; ops.h, tpr_lightning_attention_docs)
// cuts the T tokens into documents at their starts: each runs the loop
// above from its first token, the first from the given state, every later
// one from zeros. The backward runs the documents last to first: the
// gradient of a document's end state is d(final state) for the last and
// zero for the others (their end states feed nothing), and the gradient of
// a later document's zero start state is dropped; the first document's is
// d(initial state).
//
// Heads are independent: threads take whole heads (tpr__omp_share), each
// with its own scratch, so results do not depend on the thread count.
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "paged_runs.h"
#include "runtime/ops/cpu_threads.h"

static bool fits_blasint(int64_t v) { return (int64_t)(blasint)v == v; }

// gemm on row-major contiguous operands: C (m, n) = alpha op(A) op(B) + beta C.
static void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                 int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)m,
              (blasint)n, (blasint)k, 1.0f, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

// dst (H, N, D) contiguous := t (N, H, D), any strides: each head's rows
// contiguous, the sgemm operand layout.
static void heads_major(const tpr_tensor *t, float *dst) {
  const int64_t N = t->shape[0], D = t->shape[2];
  const int64_t ds[3] = {D, N * D, 1};
  tpr__strided_copy(dst, ds, tpr_tensor_data(t), t->stride, 3, t->shape, sizeof(float));
}

// The slopes (H), any stride, checked: a negative or non-finite slope would
// make the state grow without bound (transformers' are all > 0).
static tpr_status read_slopes(const char *op, const tpr_tensor *t, float *s) {
  const float *p = tpr_tensor_data(t);
  for (int64_t h = 0; h < t->shape[0]; h++) {
    s[h] = p[h * t->stride[0]];
    if (!(s[h] >= 0.0f) || !isfinite(s[h]))
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: slopes[%lld] = %g; slopes must be finite and >= 0", op,
                      (long long)h, (double)s[h]);
  }
  return TPR_OK;
}

// m (b, b) row-major: m_ij *= exp(-s (i - j)) for j <= i, 0 above the diagonal.
static void apply_diag_decay(float *m, int64_t b, float s) {
  for (int64_t i = 0; i < b; i++) {
    for (int64_t j = 0; j <= i; j++) m[i * b + j] *= expf(-(s * (float)(i - j)));
    for (int64_t j = i + 1; j < b; j++) m[i * b + j] = 0.0f;
  }
}

// rows (b, D) with leading dim ld: row i *= exp(-s * (off + sign * i)).
static void scale_rows(float *x, int64_t ld, int64_t b, int64_t D, float s, int64_t off, int64_t sign) {
  for (int64_t i = 0; i < b; i++) {
    const float f = expf(-(s * (float)(off + sign * i)));
    for (int64_t d = 0; d < D; d++) x[i * ld + d] *= f;
  }
}

// out (b, D) contiguous := x (b, D) rows times exp(-s (off + sign * i)).
static void decayed_copy(float *out, const float *x, int64_t b, int64_t D, float s, int64_t off, int64_t sign) {
  memcpy(out, x, (size_t)(b * D) * sizeof *out);
  scale_rows(out, D, b, D, s, off, sign);
}

// One block's state update: S (D, D) := exp(-s b) S + (K * kdecay)^T V.
// kd: (b, D) scratch.
static void state_step(float *S, const float *k, const float *v, int64_t b, int64_t D, float s, float *kd) {
  const float bd = expf(-(s * (float)b));
  for (int64_t e = 0; e < D * D; e++) S[e] *= bd;
  decayed_copy(kd, k, b, D, s, b - 1, -1);  // local j = 0..b-1: exp(-s (b - 1 - j))
  gemm(true, false, D, D, b, kd, D, v, D, 1.0f, S, D);
}

// Per-head scratch sizes (floats).
static int64_t fwd_scratch(int64_t B, int64_t D) { return B * B + B * D; }

// One head's prefill: q, k, v (T, D) contiguous; S (D, D) in/out; o rows at
// o + t * ldo. w: fwd_scratch floats.
static void prefill_head(const float *q, const float *k, const float *v, float *S, float *o, int64_t ldo, int64_t T,
                         int64_t D, int64_t B, float s, float *w) {
  float *a = w, *qd = w + B * B;  // (b, b) scores, (b, D) decayed rows
  for (int64_t t0 = 0; t0 < T; t0 += B) {
    const int64_t b = T - t0 < B ? T - t0 : B;
    const float *qb = q + t0 * D, *kb = k + t0 * D, *vb = v + t0 * D;
    float *ob = o + t0 * ldo;
    decayed_copy(qd, qb, b, D, s, 1, 1);  // local i = 0..b-1: exp(-s (i + 1))
    gemm(false, false, b, D, D, qd, D, S, D, 0.0f, ob, ldo);  // inter
    gemm(false, true, b, b, D, qb, D, kb, D, 0.0f, a, b);     // Q K^T
    apply_diag_decay(a, b, s);
    gemm(false, false, b, D, b, a, b, vb, D, 1.0f, ob, ldo);  // + intra
    state_step(S, kb, vb, b, D, s, qd);
  }
}

// The documents of a prefill: starts[i] the first token of document i
// (starts[0] = 0), *n of them. Without the document form (n_in the plain
// form's count) one document of all T tokens. lo is run-time data: checked.
static tpr_status doc_starts(const char *op, const tpr_tensor *const *in, int n_in, int lo_at, int64_t T,
                             int64_t *starts, int64_t *n) {
  *n = 1, starts[0] = 0;
  if (n_in <= lo_at) return TPR_OK;
  const tpr_tensor *lt = in[lo_at];
  const int32_t *lo = tpr_tensor_data(lt);
  const int64_t ls = lt->stride[0];
  for (int64_t t = 0; t < T; t++) {
    const int64_t v = lo[t * ls], prev = t ? lo[(t - 1) * ls] : 0;
    if (t == 0 && v != 0)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: lo[0] = %lld; the first token starts a document (lo[0] = 0)", op,
                      (long long)v);
    if (v != prev && v != t)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: lo[%lld] = %lld after lo[%lld] = %lld; a token's document starts "
                      "where the previous token's does or at the token itself (lo[0] = 0)", op, (long long)t,
                      (long long)v, (long long)(t ? t - 1 : 0), (long long)prev);
    if (t > 0 && v == t) starts[(*n)++] = t;
  }
  return TPR_OK;
}

// Document i's length of T tokens.
static int64_t doc_len(const int64_t *starts, int64_t n, int64_t i, int64_t T) {
  return (i + 1 < n ? starts[i + 1] : T) - starts[i];
}

// Threads for H heads of `work` elements each (tpr__cpu_nt), at most H.
static int head_threads(const void *ctx, int64_t H, int64_t work) {
  const int nt = tpr__cpu_nt(ctx, H * work);
  return nt < H ? nt : (int)(H > 0 ? H : 1);
}

// The common checks of the kernels: sizes within BLAS's integer.
static tpr_status check_sizes(const char *op, int64_t H, int64_t D, int64_t B) {
  if (!fits_blasint(H * D) || !fits_blasint(D * D) || !fits_blasint(B * B))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s (cpu): sizes exceed the BLAS integer range", op);
  return TPR_OK;
}

// q, k, v (T, H, D), state (H, D, D), slopes (H) [, lo (T) i32]; i[0] block;
// out packed (o (T, H, D) | state (H, D, D)).
TPR_CPU_KERNEL(lightning_attention) {
  const tpr_tensor *st = in[3];
  const int64_t T = in[0]->shape[0], H = in[0]->shape[1], D = in[0]->shape[2], B = attrs->i[0];
  const int64_t Bt = T < B ? T : B;  // the largest block this call forms
  TPR_CHECK(check_sizes("lightning_attention", H, D, Bt));
  float *o = tpr_tensor_data(out), *S = o + T * H * D;
  const int64_t cs[3] = {D * D, D, 1};
  tpr__strided_copy(S, cs, tpr_tensor_data(st), st->stride, 3, st->shape, sizeof(float));
  if (T == 0 || H == 0 || D == 0) return TPR_OK;
  const int nt = head_threads(ctx, H, T * D * (D + Bt));
  float *sl = malloc((size_t)H * sizeof *sl), *qkv = malloc((size_t)(3 * T * H * D) * sizeof *qkv);
  float *w = malloc((size_t)(nt * fwd_scratch(Bt, D)) * sizeof *w);
  int64_t *starts = malloc((size_t)T * sizeof *starts), nd = 1;
  tpr_status rc = TPR_OK;
  if (!sl || !qkv || !w || !starts) {
    rc = TPR_FAIL(TPR_ERR_OOM, "lightning_attention (cpu): scratch for T = %lld, H = %lld, D = %lld", (long long)T,
                  (long long)H, (long long)D);
    goto done;
  }
  TPR_CHECK_GOTO(read_slopes("lightning_attention", in[4], sl), rc, done);
  TPR_CHECK_GOTO(doc_starts("lightning_attention", in, n_in, 5, T, starts, &nd), rc, done);
  float *qh = qkv, *kh = qkv + T * H * D, *vh = qkv + 2 * T * H * D;  // (H, T, D) each
  heads_major(in[0], qh), heads_major(in[1], kh), heads_major(in[2], vh);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    int64_t h0, h1;
    tpr__omp_share(H, 1, &h0, &h1);
    float *wt = w + omp_get_thread_num() * fwd_scratch(Bt, D);
    for (int64_t h = h0; h < h1; h++)
      for (int64_t d = 0; d < nd; d++) {
        const int64_t t0 = starts[d], r = h * T * D + t0 * D;
        if (d > 0) memset(S + h * D * D, 0, (size_t)(D * D) * sizeof *S);  // a later document: the zero state
        prefill_head(qh + r, kh + r, vh + r, S + h * D * D, o + t0 * H * D + h * D, H * D, doc_len(starts, nd, d, T),
                     D, Bt, sl[h], wt);
      }
  }
done:
  free(sl), free(qkv), free(w), free(starts);
  return rc;
}

// ---- Backward.

// Per-head scratch of the backward (floats): the block-start states, two
// (b, b) matrices, one (b, D) row block.
static int64_t bwd_scratch(int64_t nb, int64_t B, int64_t D) { return nb * D * D + 2 * B * B + B * D; }

typedef struct head_grads {
  float *dq, *dk, *dv;  // (T, D) rows at t * ld
  int64_t ld;
  float *G;  // (D, D): d(final state) in, d(initial state) out
} head_grads;

// One head's backward (the file comment's recurrence): q, k, v, dy (T, D)
// contiguous, S0 (D, D).
static void backward_head(const float *q, const float *k, const float *v, const float *dy, const float *S0,
                          const head_grads *g, int64_t T, int64_t D, int64_t B, float s, float *w) {
  const int64_t nb = (T + B - 1) / B, ld = g->ld;
  float *Ss = w, *p = w + nb * D * D, *a = p + B * B, *rows = a + B * B;  // Ss (nb, D, D): block-start states
  memcpy(Ss, S0, (size_t)(D * D) * sizeof *Ss);
  for (int64_t c = 0; c + 1 < nb; c++) {
    memcpy(Ss + (c + 1) * D * D, Ss + c * D * D, (size_t)(D * D) * sizeof *Ss);
    state_step(Ss + (c + 1) * D * D, k + c * B * D, v + c * B * D, B, D, s, rows);
  }
  float *G = g->G;
  for (int64_t c = nb - 1; c >= 0; c--) {
    const int64_t t0 = c * B, b = T - t0 < B ? T - t0 : B;
    const float *qb = q + t0 * D, *kb = k + t0 * D, *vb = v + t0 * D, *db = dy + t0 * D, *S = Ss + c * D * D;
    float *dqb = g->dq + t0 * ld, *dkb = g->dk + t0 * ld, *dvb = g->dv + t0 * ld;
    gemm(false, true, b, b, D, db, D, vb, D, 0.0f, p, b);  // P = dO V^T
    apply_diag_decay(p, b, s);
    gemm(false, true, b, b, D, qb, D, kb, D, 0.0f, a, b);  // A = Q K^T
    apply_diag_decay(a, b, s);
    gemm(false, true, b, D, D, db, D, S, D, 0.0f, dqb, ld);  // dO S^T
    scale_rows(dqb, ld, b, D, s, 1, 1);
    gemm(false, false, b, D, b, p, b, kb, D, 1.0f, dqb, ld);  // + (M * P) K
    gemm(false, true, b, D, D, vb, D, G, D, 0.0f, dkb, ld);   // V G^T
    scale_rows(dkb, ld, b, D, s, b - 1, -1);
    gemm(true, false, b, D, b, p, b, qb, D, 1.0f, dkb, ld);  // + (M * P)^T Q
    gemm(false, false, b, D, D, kb, D, G, D, 0.0f, dvb, ld);  // K G
    scale_rows(dvb, ld, b, D, s, b - 1, -1);
    gemm(true, false, b, D, b, a, b, db, D, 1.0f, dvb, ld);  // + (M * A)^T dO
    const float bd = expf(-(s * (float)b));
    for (int64_t e = 0; e < D * D; e++) G[e] *= bd;
    decayed_copy(rows, qb, b, D, s, 1, 1);
    gemm(true, false, D, D, b, rows, D, db, D, 1.0f, G, D);  // + (Q * qdecay)^T dO
  }
}

// q, k, v (T, H, D), state (H, D, D), slopes (H), dout packed (T*H*D |
// H*D*D) [, lo (T) i32]; i[0] block; out packed (dq | dk | dv (T, H, D) |
// dstate (H, D, D)).
TPR_CPU_KERNEL(lightning_attention_bwd) {
  const tpr_tensor *st = in[3], *dout = in[5];
  const int64_t T = in[0]->shape[0], H = in[0]->shape[1], D = in[0]->shape[2], B = attrs->i[0];
  const int64_t Bt = T < B ? T : B, n = T * H * D;
  TPR_CHECK(check_sizes("lightning_attention_bwd", H, D, Bt));
  float *dq = tpr_tensor_data(out), *dk = dq + n, *dv = dk + n, *dS = dv + n;
  // dout: (n) then (H*D*D); any stride along its one dim.
  const int64_t ds_len[1] = {H * D * D}, one[1] = {1}, dstr[1] = {dout->stride[0]};
  const float *dbase = tpr_tensor_data(dout);
  tpr__strided_copy(dS, one, dbase + n * dout->stride[0], dstr, 1, ds_len, sizeof(float));
  if (T == 0 || H == 0 || D == 0) return TPR_OK;
  const int64_t nb = (T + Bt - 1) / Bt;
  const int nt = head_threads(ctx, H, T * D * (D + Bt));
  float *sl = malloc((size_t)H * sizeof *sl), *buf = malloc((size_t)(4 * n + H * D * D) * sizeof *buf);
  float *w = malloc((size_t)(nt * bwd_scratch(nb, Bt, D)) * sizeof *w);
  int64_t *starts = malloc((size_t)T * sizeof *starts), nd = 1;
  float *zeros = calloc((size_t)(D * D), sizeof *zeros);  // a later document's start state
  tpr_status rc = TPR_OK;
  if (!sl || !buf || !w || !starts || !zeros) {
    rc = TPR_FAIL(TPR_ERR_OOM, "lightning_attention_bwd (cpu): scratch for T = %lld, H = %lld, D = %lld, %lld blocks",
                  (long long)T, (long long)H, (long long)D, (long long)nb);
    goto done;
  }
  TPR_CHECK_GOTO(read_slopes("lightning_attention_bwd", in[4], sl), rc, done);
  TPR_CHECK_GOTO(doc_starts("lightning_attention_bwd", in, n_in, 6, T, starts, &nd), rc, done);
  float *qh = buf, *kh = buf + n, *vh = buf + 2 * n, *dh = buf + 3 * n, *S0 = buf + 4 * n;  // (H, T, D), (H, D, D)
  heads_major(in[0], qh), heads_major(in[1], kh), heads_major(in[2], vh);
  const int64_t dys[3] = {H * D * dstr[0], D * dstr[0], dstr[0]}, dyc[3] = {D, T * D, 1}, shp[3] = {T, H, D};
  tpr__strided_copy(dh, dyc, dbase, dys, 3, shp, sizeof(float));
  const int64_t cs[3] = {D * D, D, 1};
  tpr__strided_copy(S0, cs, tpr_tensor_data(st), st->stride, 3, st->shape, sizeof(float));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    int64_t h0, h1;
    tpr__omp_share(H, 1, &h0, &h1);
    float *wt = w + omp_get_thread_num() * bwd_scratch(nb, Bt, D);
    for (int64_t h = h0; h < h1; h++)
      for (int64_t d = nd - 1; d >= 0; d--) {  // G: d(final state), then zero for each earlier document's end
        const int64_t t0 = starts[d], r = h * T * D + t0 * D, at = t0 * H * D + h * D;
        const head_grads g = {dq + at, dk + at, dv + at, H * D, dS + h * D * D};
        backward_head(qh + r, kh + r, vh + r, dh + r, d ? zeros : S0 + h * D * D, &g, doc_len(starts, nd, d, T), D,
                      Bt, sl[h], wt);
        if (d > 0) memset(g.G, 0, (size_t)(D * D) * sizeof *g.G);  // a zero start state: its gradient is dropped
      }
  }
done:
  free(sl), free(buf), free(w), free(starts), free(zeros);
  return rc;
}

// ---- Decode: q, k, v (B, H, D), state (B, H, D, D), slopes (H);
// out packed (o (B, H, D) | states (B, H, D, D)). transformers' cached
// path: S' = exp(-s) S + k^T v, then o = q S', each sum over a in order.
TPR_CPU_KERNEL(lightning_decode) {
  (void)n_in;
  const tpr_tensor *q = in[0], *k = in[1], *v = in[2], *st = in[3];
  const int64_t Bn = q->shape[0], H = q->shape[1], D = q->shape[2], n = Bn * H * D;
  float *o = tpr_tensor_data(out), *S = o + n;
  const int64_t cs[4] = {H * D * D, D * D, D, 1};
  tpr__strided_copy(S, cs, tpr_tensor_data(st), st->stride, 4, st->shape, sizeof(float));
  if (n == 0) return TPR_OK;
  float *sl = malloc((size_t)H * sizeof *sl);
  if (!sl) return TPR_FAIL(TPR_ERR_OOM, "lightning_decode (cpu): slopes");
  tpr_status rc = read_slopes("lightning_decode", in[4], sl);
  if (rc != TPR_OK) goto done;
  const float *qp = tpr_tensor_data(q), *kp = tpr_tensor_data(k), *vp = tpr_tensor_data(v);
  const int nt = tpr__cpu_nt(ctx, n * D);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    int64_t r0, r1;
    tpr__omp_share(Bn * H, 1, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {  // r = b * H + h
      const int64_t b = r / H, h = r % H;
      const float *qr = qp + b * q->stride[0] + h * q->stride[1], *kr = kp + b * k->stride[0] + h * k->stride[1];
      const float *vr = vp + b * v->stride[0] + h * v->stride[1];
      float *Sr = S + r * D * D, *orow = o + r * D;
      const float ratio = expf(-sl[h]);
      for (int64_t a = 0; a < D; a++) {
        const float ka = kr[a * k->stride[2]];
        for (int64_t c = 0; c < D; c++) Sr[a * D + c] = ratio * Sr[a * D + c] + ka * vr[c * v->stride[2]];
      }
      for (int64_t c = 0; c < D; c++) orow[c] = 0.0f;
      for (int64_t a = 0; a < D; a++) {
        const float qa = qr[a * q->stride[2]];
        for (int64_t c = 0; c < D; c++) orow[c] += qa * Sr[a * D + c];
      }
    }
  }
done:
  free(sl);
  return rc;
}

// ---- The engine's form: q, k, v (T, H, D) rows of many sequences, pool
// (NS, H, D, D) contiguous, slopes (H), state_slot (T) i32 (-1: a padded
// row), positions (T) i32; i[0] block; out o (T, H, D). Each run of a
// slot's rows (paged_runs.h) is a prefill from the slot's state, written
// back in place. Padded rows output 0.
TPR_CPU_KERNEL(lightning_paged) {
  (void)n_in;
  const char *op = "lightning_paged";
  const tpr_tensor *pool = in[3];
  const int64_t T = in[0]->shape[0], H = in[0]->shape[1], D = in[0]->shape[2], B = attrs->i[0];
  const int64_t NS = pool->shape[0], Bt = T < B ? T : B;
  if (!tpr_tensor_is_contiguous(pool))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s (cpu): the state pool must be contiguous (it is written in place)", op);
  TPR_CHECK(check_sizes(op, H, D, Bt));
  float *o = tpr_tensor_data(out), *P = tpr_tensor_data(pool);
  memset(o, 0, (size_t)(T * H * D) * sizeof *o);  // padded rows
  if (T == 0 || H == 0 || D == 0) return TPR_OK;
  const int nt = head_threads(ctx, H, T * D * (D + Bt));
  tpr__la_run *runs = malloc((size_t)T * sizeof *runs);
  float *sl = malloc((size_t)H * sizeof *sl), *qkv = malloc((size_t)(3 * T * H * D) * sizeof *qkv);
  float *w = malloc((size_t)(nt * fwd_scratch(Bt, D)) * sizeof *w);
  int64_t n_runs = 0;
  tpr_status rc = TPR_OK;
  if (!runs || !sl || !qkv || !w) {
    rc = TPR_FAIL(TPR_ERR_OOM, "%s (cpu): scratch for T = %lld, H = %lld, D = %lld", op, (long long)T, (long long)H,
                  (long long)D);
    goto done;
  }
  TPR_CHECK_GOTO(read_slopes(op, in[4], sl), rc, done);
  const int32_t *slot = tpr_tensor_data(in[5]), *pos = tpr_tensor_data(in[6]);
  TPR_CHECK_GOTO(tpr__la_paged_runs(slot, in[5]->stride[0], pos, in[6]->stride[0], T, NS, runs, &n_runs), rc, done);
  float *qh = qkv, *kh = qkv + T * H * D, *vh = qkv + 2 * T * H * D;  // (H, T, D) each
  heads_major(in[0], qh), heads_major(in[1], kh), heads_major(in[2], vh);
  for (int64_t r = 0; r < n_runs; r++) {
    const int64_t t0 = runs[r].t0, n = runs[r].n;
    float *S = P + runs[r].slot * H * D * D;  // the slot's (H, D, D), updated in place
    if (pos[t0 * in[6]->stride[0]] == 0) memset(S, 0, (size_t)(H * D * D) * sizeof *S);  // a sequence's start
#pragma omp parallel num_threads(nt) if (nt > 1 && n * D > 4096)
    {
      int64_t h0, h1;
      tpr__omp_share(H, 1, &h0, &h1);
      float *wt = w + omp_get_thread_num() * fwd_scratch(Bt, D);
      for (int64_t h = h0; h < h1; h++)
        prefill_head(qh + (h * T + t0) * D, kh + (h * T + t0) * D, vh + (h * T + t0) * D, S + h * D * D,
                     o + t0 * H * D + h * D, H * D, n, D, Bt, sl[h], wt);
    }
  }
done:
  free(runs), free(sl), free(qkv), free(w);
  return rc;
}

// ops.h: transformers' get_slope_rate.
void tpr_lightning_slopes(int64_t heads, int64_t layer, int64_t n_layers, float *out) {
  const double base = 1.0 / pow(2.0, 8.0 / (double)heads);
  const double factor = 1.0 - (double)layer / ((double)n_layers - 1.0 + 1e-5) + 1e-5;
  for (int64_t h = 0; h < heads; h++) out[h] = (float)(pow(base, (double)(h + 1)) * factor);
}

// ops.h: ALiBi's slopes as MiniCPM-SALA builds them: power-of-two m heads
// give start_m * start_m^i, start_m = 2^(-2^-(log2 m - 3)); other counts
// take c (the largest power of two below) of those, then every other one of
// 2c's (index 2i: start_2c * start_2c^(2i)).
static double alibi_start(int64_t m) { return pow(2.0, -pow(2.0, -(log2((double)m) - 3.0))); }

void tpr_alibi_slopes(int64_t heads, float *out) {
  int64_t c = 1;
  while (c * 2 <= heads) c *= 2;
  const double s = alibi_start(c), s2 = alibi_start(2 * c);
  for (int64_t h = 0; h < heads; h++)
    out[h] = (float)(h < c ? s * pow(s, (double)h) : s2 * pow(s2, (double)(2 * (h - c))));
}

const tpr__kernel_def tpr__lightning_cpu[] = {
    {TPR_OP_LIGHTNING_ATTENTION, cpu_lightning_attention},
    {TPR_OP_LIGHTNING_ATTENTION_BWD, cpu_lightning_attention_bwd},
    {TPR_OP_LIGHTNING_DECODE, cpu_lightning_decode},
    {TPR_OP_LIGHTNING_PAGED, cpu_lightning_paged},
    {0},
};
