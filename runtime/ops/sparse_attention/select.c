// InfLLM-v2's block selection (select.h). Moved out of cpu.c's
// select_blocks unchanged, so the paged op and the training op share it.
#include "runtime/ops/sparse_attention/select.h"

#include <math.h>
#include <string.h>

tpr__sa_cfg tpr__sa_cfg_of(const tpr_op_attrs *attrs) {
  return (tpr__sa_cfg){.ks = attrs->i[0], .st = attrs->i[1], .bs = attrs->i[2], .topk = attrs->i[3],
                       .init = attrs->i[4], .local = attrs->i[5] / attrs->i[2], .dense_len = attrs->i[6],
                       .scale = attrs->f[0]};
}

void tpr__sa_select(const tpr__sa_cfg *cf, bool dense, const double *c, int64_t n_c, int64_t Hkv, int64_t g,
                    int64_t D, const double *qd, int64_t G, int64_t p, const tpr__sa_sel_scratch *sc, char *sel) {
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
  for (int64_t j = 0; j < n_valid; j++) sc->S[j] = 0;
  for (int64_t h = 0; h < G && n_valid > 0; h++) {
    const double *q = qd + h * D;
    double m = -INFINITY, z = 0;
    for (int64_t j = 0; j < n_valid; j++) {
      const double *cj = c + (j * Hkv + g) * D;
      double dot = 0;
      for (int64_t d = 0; d < D; d++) dot += q[d] * cj[d];
      sc->w[j] = dot * cf->scale;
      m = sc->w[j] > m ? sc->w[j] : m;
    }
    for (int64_t j = 0; j < n_valid; j++) z += (sc->w[j] = exp(sc->w[j] - m));
    for (int64_t j = 0; j < n_valid; j++) sc->S[j] += sc->w[j] / z;
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
