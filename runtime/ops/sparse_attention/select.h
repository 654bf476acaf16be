// InfLLM-v2's block selection, shared by the paged inference op (cpu.c) and
// the whole-sequence training op (train_cpu.c), so both pick the same blocks
// bit for bit (semantics: tpr_pb_sparse_attention_paged in program.h; the
// published sources: docs/minicpm-sala.md). The selection is a set of block
// indices: the training op's backward recomputes it and passes no gradient
// through it.
#ifndef TPR_SPARSE_ATTENTION_SELECT_H
#define TPR_SPARSE_ATTENTION_SELECT_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/ops.h"

// sparse_config as the kernels read it (the ops' attributes, ops.h).
typedef struct tpr__sa_cfg {
  int64_t ks, st, bs, topk, init, local, dense_len;  // local: window_size / block_size blocks
  double scale;
} tpr__sa_cfg;

tpr__sa_cfg tpr__sa_cfg_of(const tpr_op_attrs *attrs);

// q . k in double, q in double and k f32 with element stride dk: four
// interleaved partial sums combined in one fixed tree when k is contiguous
// (a deterministic order the compiler can vectorise), else in order.
static inline double tpr__sa_dot(const double *q, const float *k, int64_t dk, int64_t D) {
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

// A compressed key, chunk j of KV head g: the mean of its kernel_size keys,
// each op summing them in double in position order and rounding the mean to
// f32 (so every op and the compressed-key pool hold the same values). The
// caller's layout behind ctx: the paged op's pool or its own array.
typedef const float *(*tpr__sa_chunk_fn)(const void *ctx, int64_t j, int64_t g);

// The scratch one selection uses: S (n_c) the group-summed chunk
// probabilities, w (G, cap) each head's chunk logits (cap >= n_c), mz (2G),
// score (p/bs + 1) candidate scores.
typedef struct tpr__sa_sel_scratch {
  double *S, *w, *mz, *score;
  int64_t cap;
} tpr__sa_sel_scratch;

// sel[0..p/bs] := 1 for the blocks query position p of KV head g attends,
// 0 for the others. dense: every block up to the query's. Else the n_c
// compressed keys through chunk(ctx, j, g) and qd (G, D) the group's queries
// in double: init and local blocks always, then the topk - init
// best-scoring other blocks (the lower index among equal scores).
void tpr__sa_select(const tpr__sa_cfg *cf, bool dense, tpr__sa_chunk_fn chunk, const void *ctx, int64_t n_c,
                    int64_t g, int64_t D, const double *qd, int64_t G, int64_t p, const tpr__sa_sel_scratch *sc,
                    char *sel);

#endif
