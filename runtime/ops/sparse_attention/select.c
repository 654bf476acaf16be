// InfLLM-v2's block selection (select.h).
#include "runtime/ops/sparse_attention/select.h"

#include <math.h>
#include <string.h>

tpr__sa_cfg tpr__sa_cfg_of(const tpr_op_attrs *attrs) {
  return (tpr__sa_cfg){.ks = attrs->i[0], .st = attrs->i[1], .bs = attrs->i[2], .topk = attrs->i[3],
                       .init = attrs->i[4], .local = attrs->i[5] / attrs->i[2], .dense_len = attrs->i[6],
                       .scale = attrs->f[0]};
}

void tpr__sa_select(const tpr__sa_cfg *cf, bool dense, tpr__sa_chunk_fn chunk, const void *ctx, int64_t n_c,
                    int64_t g, int64_t D, const double *qd, int64_t G, int64_t p, const tpr__sa_sel_scratch *sc,
                    char *sel) {
  const int64_t qb = p / cf->bs;
  if (dense) {  // every block up to the query's
    memset(sel, 1, (size_t)(qb + 1));
    return;
  }
  for (int64_t b = 0; b <= qb; b++) sel[b] = b < cf->init || b > qb - cf->local;
  const int64_t first = cf->init, last = qb - cf->local;  // candidates [first, last]
  int64_t slots = cf->topk - cf->init;
  if (last < first || slots <= 0) return;
  // S_j over the chunks position p sees: j*st + ks <= p + 1.
  int64_t n_valid = p + 1 >= cf->ks ? (p + 1 - cf->ks) / cf->st + 1 : 0;
  if (n_valid > n_c) n_valid = n_c;
  // Chunks outer, the group's heads inner: each compressed key is read once
  // for the group. Logits into w (G, cap); mz the heads' maxima, then their
  // sums.
  double *m = sc->mz, *z = sc->mz + G;
  for (int64_t h = 0; h < G; h++) m[h] = -INFINITY, z[h] = 0;
  for (int64_t j = 0; j < n_valid; j++) {
    const float *c = chunk(ctx, j, g);
    for (int64_t h = 0; h < G; h++) {
      const double w = tpr__sa_dot(qd + h * D, c, 1, D) * cf->scale;
      sc->w[h * sc->cap + j] = w;
      m[h] = w > m[h] ? w : m[h];
    }
  }
  for (int64_t h = 0; h < G; h++) {
    double *w = sc->w + h * sc->cap;
    for (int64_t j = 0; j < n_valid; j++) z[h] += (w[j] = exp(w[j] - m[h]));
  }
  for (int64_t j = 0; j < n_valid; j++) {  // S_j summed over the heads in order
    double S = 0;
    for (int64_t h = 0; h < G; h++) S += sc->w[h * sc->cap + j] / z[h];
    sc->S[j] = S;
  }
  // Block b's score: the max over the seen chunks overlapping it.
  const int64_t per = cf->bs / cf->st, back = cf->ks / cf->st - 1;
  for (int64_t b = first; b <= last; b++) {
    int64_t lo = b * per - back, hi = (b + 1) * per;
    lo = lo < 0 ? 0 : lo, hi = hi < n_valid ? hi : n_valid;
    double best = 0;  // every S_j >= 0: a block with no seen chunk scores 0
    for (int64_t j = lo; j < hi; j++) best = sc->S[j] > best ? sc->S[j] : best;
    sc->score[b] = best;
  }
  // The best `slots` candidates, the lower block first among equals.
  for (; slots > 0; slots--) {
    int64_t pick = -1;
    for (int64_t b = first; b <= last; b++)
      if (!sel[b] && (pick < 0 || sc->score[b] > sc->score[pick])) pick = b;
    if (pick < 0) break;
    sel[pick] = 1;
  }
}
