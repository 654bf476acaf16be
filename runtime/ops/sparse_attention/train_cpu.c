// InfLLM-v2 sparse attention of one whole sequence and its backward, CPU
// (semantics: tpr_pb_sparse_attention in program.h): the training form of
// the paged op in cpu.c. q (T, Hq, D), k and v (T, Hkv, D) are one sequence
// from position 0, so L = T decides dense (T < dense_len) or sparse for the
// whole call, as the paged op decides per sequence.
//
// The selection is select.h's, the paged op's own code, on compressed keys
// computed the same way (each chunk's kernel_size keys summed in order in
// double, divided, rounded to f32): both ops pick the same blocks bit for
// bit. It is a
// set of indices: the backward recomputes it and passes no gradient through
// it or the compressed keys (the published forward feeds them only to its
// top-k kernel). The attention over the selected keys is differentiated as
// softmax attention's: with P the probabilities over the attended rows r and
// dP_r = dout . v_r, dv_r += P_r dout, dz_r = P_r (dP_r - sum P dP) scale,
// dq += dz_r k_r, dk_r += dz_r q.
//
// Everything is computed in double from the f32 operands. The forward's
// (token, KV head) items are split over threads, each writing its own rows;
// the backward's KV heads are (each thread owns its heads' dk, dv and its
// query heads' dq, and walks the tokens in order), so no result depends on
// the thread count.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/cpu_threads.h"
#include "runtime/ops/sparse_attention/select.h"

typedef struct wq_seq {
  const float *q, *k, *v;
  const int64_t *qs, *ks, *vs;  // strides (T, H, D)
  int64_t T, Hq, Hkv, G, D;
  bool dense;
  int64_t n_c;
  float *c;  // (n_c, Hkv, D) compressed keys, NULL when dense
} wq_seq;

static const float *row(const float *base, const int64_t *st, int64_t t, int64_t h) {
  return base + t * st[0] + h * st[1];
}

// c := the mean of each chunk's kernel_size keys (select.h's rule, as
// cpu.c's mean_chunk on rows). acc (D) scratch.
static void compress(const wq_seq *s, const tpr__sa_cfg *cf, double *acc) {
  for (int64_t j = 0; j < s->n_c; j++)
    for (int64_t g = 0; g < s->Hkv; g++) {
      float *out = s->c + (j * s->Hkv + g) * s->D;
      for (int64_t d = 0; d < s->D; d++) acc[d] = 0;
      for (int64_t r = j * cf->st; r < j * cf->st + cf->ks; r++) {
        const float *k = row(s->k, s->ks, r, g);
        for (int64_t d = 0; d < s->D; d++) acc[d] += k[d * s->ks[2]];
      }
      for (int64_t d = 0; d < s->D; d++) out[d] = (float)(acc[d] / (double)cf->ks);
    }
}

static const float *chunk_of(const void *ctx, int64_t j, int64_t g) {
  const wq_seq *s = ctx;
  return s->c + (j * s->Hkv + g) * s->D;
}

// Scratch of one thread.
typedef struct wq_scratch {
  double *S, *w, *mz, *score;  // select.h's (w: (G, n_c + 1))
  char *sel;              // (T / bs + 1)
  double *qd;             // (G, D) the group's queries
  int64_t *idx;           // (T) the attended rows, ascending
  double *P;              // (G, T) their probabilities per head
  double *acc;            // (D) a weighted sum (forward)
} wq_scratch;

static bool scratch_new(wq_scratch *sc, const wq_seq *s, const tpr__sa_cfg *cf) {
  const int64_t n = s->n_c + 1, nb = s->T / cf->bs + 1;
  sc->S = malloc((size_t)n * sizeof(double)), sc->w = malloc((size_t)(s->G * n) * sizeof(double));
  sc->mz = malloc((size_t)(2 * s->G + 1) * sizeof(double));
  sc->score = malloc((size_t)nb * sizeof(double)), sc->sel = malloc((size_t)nb);
  sc->qd = malloc((size_t)(s->G * s->D + 1) * sizeof(double));
  sc->idx = malloc((size_t)(s->T + 1) * sizeof(int64_t));
  sc->P = malloc((size_t)(s->G * s->T + 1) * sizeof(double));
  sc->acc = malloc((size_t)(s->D + 1) * sizeof(double));
  return sc->S && sc->w && sc->mz && sc->score && sc->sel && sc->qd && sc->idx && sc->P && sc->acc;
}
static void scratch_free(wq_scratch *sc) {
  free(sc->S), free(sc->w), free(sc->mz), free(sc->score), free(sc->sel), free(sc->qd), free(sc->idx), free(sc->P), free(sc->acc);
}

// Query t, KV head g: selects its blocks and fills idx (the attended rows
// <= t, ascending) and P (G, n) each head's softmax over them. Returns n.
static int64_t probs(const wq_seq *s, const tpr__sa_cfg *cf, int64_t t, int64_t g, wq_scratch *sc) {
  const int64_t G = s->G, D = s->D;
  for (int64_t h = 0; h < G; h++) {
    const float *q = row(s->q, s->qs, t, g * G + h);
    for (int64_t d = 0; d < D; d++) sc->qd[h * D + d] = q[d * s->qs[2]];
  }
  const tpr__sa_sel_scratch ss = {.S = sc->S, .w = sc->w, .mz = sc->mz, .score = sc->score, .cap = s->n_c + 1};
  tpr__sa_select(cf, s->dense, chunk_of, s, s->n_c, g, D, sc->qd, G, t, &ss, sc->sel);
  int64_t n = 0;
  for (int64_t b = 0; b <= t / cf->bs; b++)
    if (sc->sel[b])
      for (int64_t r = b * cf->bs; r < (b + 1) * cf->bs && r <= t; r++) sc->idx[n++] = r;
  for (int64_t h = 0; h < G; h++) {
    double *P = sc->P + h * s->T, m = -INFINITY, z = 0;
    for (int64_t i = 0; i < n; i++) {
      const float *k = row(s->k, s->ks, sc->idx[i], g);
      double dot = 0;
      for (int64_t d = 0; d < D; d++) dot += sc->qd[h * D + d] * k[d * s->ks[2]];
      P[i] = dot * cf->scale;
      m = P[i] > m ? P[i] : m;
    }
    for (int64_t i = 0; i < n; i++) z += (P[i] = exp(P[i] - m));
    for (int64_t i = 0; i < n; i++) P[i] /= z;
  }
  return n;
}

// The sequence's view of the operands and its compressed keys (sparse only).
static tpr_status seq_of(const char *op, const tpr_tensor *const *in, const tpr__sa_cfg *cf, wq_seq *s) {
  const tpr_tensor *q = in[0], *k = in[1], *v = in[2];
  *s = (wq_seq){.q = tpr_tensor_data(q), .k = tpr_tensor_data(k), .v = tpr_tensor_data(v), .qs = q->stride,
                .ks = k->stride, .vs = v->stride, .T = q->shape[0], .Hq = q->shape[1], .Hkv = k->shape[1],
                .D = q->shape[2]};
  s->G = s->Hq / s->Hkv;
  s->dense = s->T < cf->dense_len;
  if (s->dense) return TPR_OK;
  s->n_c = s->T >= cf->ks ? (s->T - cf->ks) / cf->st + 1 : 0;
  s->c = malloc((size_t)(s->n_c * s->Hkv * s->D + 1) * sizeof(float));
  double *acc = malloc((size_t)(s->D + 1) * sizeof *acc);
  if (!s->c || !acc) {
    free(acc);
    return TPR_FAIL(TPR_ERR_OOM, "%s: compressed keys of a %lld-token sequence", op, (long long)s->T);
  }
  compress(s, cf, acc);
  free(acc);
  return TPR_OK;
}

// q (T, Hq, D), k, v (T, Hkv, D) f32 -> out (T, Hq, D) contiguous.
TPR_CPU_KERNEL(sparse_attention) {
  const char *op = "sparse_attention (cpu)";
  if (n_in != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: expected 3 inputs, got %d", op, n_in);
  const tpr__sa_cfg cf = tpr__sa_cfg_of(attrs);  // checked by the shape rule (rules.c)
  wq_seq s;
  TPR_CHECK(seq_of(op, in, &cf, &s));
  float *o = tpr_tensor_data(out);
  const int64_t items = s.T * s.Hkv, G = s.G, D = s.D;
  const int nt = tpr__cpu_nt(ctx, s.T * s.Hq * s.T * D);
  int oom = 0;
#pragma omp parallel num_threads(nt) if (nt > 1 && items > 1)
  {
    wq_scratch sc;
    const bool ok = scratch_new(&sc, &s, &cf);
    if (!ok) {
#pragma omp atomic write
      oom = 1;
    }
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) {
      if (!ok) continue;
      const int64_t t = it / s.Hkv, g = it % s.Hkv, n = probs(&s, &cf, t, g, &sc);
      for (int64_t h = 0; h < G; h++) {
        const double *P = sc.P + h * s.T;
        double *acc = sc.acc;
        for (int64_t d = 0; d < D; d++) acc[d] = 0;
        for (int64_t i = 0; i < n; i++) {
          const float *v = row(s.v, s.vs, sc.idx[i], g);
          for (int64_t d = 0; d < D; d++) acc[d] += P[i] * v[d * s.vs[2]];
        }
        for (int64_t d = 0; d < D; d++) o[(t * s.Hq + g * G + h) * D + d] = (float)acc[d];
      }
    }
    scratch_free(&sc);
  }
  free(s.c);
  return oom ? TPR_FAIL(TPR_ERR_OOM, "%s: per-thread scratch for %lld keys", op, (long long)s.T) : TPR_OK;
}

// + dout (T, Hq, D) -> packed (dq (T, Hq, D) | dk (T, Hkv, D) | dv (T, Hkv, D)).
TPR_CPU_KERNEL(sparse_attention_bwd) {
  const char *op = "sparse_attention_bwd (cpu)";
  if (n_in != 4) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: expected 4 inputs, got %d", op, n_in);
  const tpr__sa_cfg cf = tpr__sa_cfg_of(attrs);
  wq_seq s;
  TPR_CHECK(seq_of(op, in, &cf, &s));
  const tpr_tensor *dy = in[3];
  const float *dyb = tpr_tensor_data(dy);
  const int64_t T = s.T, Hq = s.Hq, Hkv = s.Hkv, G = s.G, D = s.D;
  const int64_t nq = T * Hq * D, nk = T * Hkv * D;
  double *acc = calloc((size_t)(nq + 2 * nk + 1), sizeof *acc);  // dq | dk | dv in double
  if (!acc) {
    free(s.c);
    return TPR_FAIL(TPR_ERR_OOM, "%s: gradients of a %lld-token sequence", op, (long long)T);
  }
  double *dq = acc, *dk = acc + nq, *dv = acc + nq + nk;
  const int nt = tpr__cpu_nt(ctx, T * Hq * T * D);
  int oom = 0;
#pragma omp parallel num_threads(nt) if (nt > 1 && Hkv > 1)
  {
    wq_scratch sc;
    const bool ok = scratch_new(&sc, &s, &cf);
    double *dP = malloc((size_t)(T + 1) * sizeof *dP);
    if (!ok || !dP) {
#pragma omp atomic write
      oom = 1;
    }
#pragma omp for schedule(static)
    for (int64_t g = 0; g < Hkv; g++) {
      if (!ok || !dP) continue;
      for (int64_t t = 0; t < T; t++) {
        const int64_t n = probs(&s, &cf, t, g, &sc);
        for (int64_t h = 0; h < G; h++) {
          const int64_t hq = g * G + h;
          const double *P = sc.P + h * T, *qd = sc.qd + h * D;
          const float *o = dyb + t * dy->stride[0] + hq * dy->stride[1];
          double *dqr = dq + (t * Hq + hq) * D, sum = 0;
          for (int64_t i = 0; i < n; i++) {
            const int64_t r = sc.idx[i];
            const float *v = row(s.v, s.vs, r, g);
            double *dvr = dv + (r * Hkv + g) * D, dot = 0;
            for (int64_t d = 0; d < D; d++) {
              const double od = o[d * dy->stride[2]];
              dot += od * v[d * s.vs[2]];
              dvr[d] += P[i] * od;
            }
            dP[i] = dot;
            sum += P[i] * dot;
          }
          for (int64_t i = 0; i < n; i++) {
            const int64_t r = sc.idx[i];
            const double dz = P[i] * (dP[i] - sum) * cf.scale;
            const float *k = row(s.k, s.ks, r, g);
            double *dkr = dk + (r * Hkv + g) * D;
            for (int64_t d = 0; d < D; d++) {
              dqr[d] += dz * k[d * s.ks[2]];
              dkr[d] += dz * qd[d];
            }
          }
        }
      }
    }
    scratch_free(&sc);
    free(dP);
  }
  float *res = tpr_tensor_data(out);
  if (!oom)
    for (int64_t i = 0; i < nq + 2 * nk; i++) res[i] = (float)acc[i];
  free(acc), free(s.c);
  return oom ? TPR_FAIL(TPR_ERR_OOM, "%s: per-thread scratch for %lld keys", op, (long long)T) : TPR_OK;
}

const tpr__kernel_def tpr__sparse_attention_train_cpu[] = {
    {TPR_OP_SPARSE_ATTENTION, cpu_sparse_attention},
    {TPR_OP_SPARSE_ATTENTION_BWD, cpu_sparse_attention_bwd},
    {0},
};
