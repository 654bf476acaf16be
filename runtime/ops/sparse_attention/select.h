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

// The scratch one selection uses: S (n_c) the group-summed chunk
// probabilities, w (n_c) chunk logits, score (qb + 1) candidate scores.
typedef struct tpr__sa_sel_scratch {
  double *S, *w, *score;
} tpr__sa_sel_scratch;

// sel[0..p/bs] := 1 for the blocks query position p of KV head g attends,
// 0 for the others. dense: every block up to the query's. Else c (n_c, Hkv,
// D) are the sequence's compressed keys in double, qd (G, D) the group's
// queries in double: init and local blocks always, then the topk - init
// best-scoring other blocks (the lower index among equal scores).
void tpr__sa_select(const tpr__sa_cfg *cf, bool dense, const double *c, int64_t n_c, int64_t Hkv, int64_t g,
                    int64_t D, const double *qd, int64_t G, int64_t p, const tpr__sa_sel_scratch *sc, char *sel);

#endif
