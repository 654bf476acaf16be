// The CPU attention forward shared by the contiguous KV-cache op
// (cpu.c) and the paged one (paged_cpu.c): a blocked, online
// softmax kernel (flash.c) that reads keys and values in place. A
// query row's output is defined the same way in both (key tiles and chunks on
// a fixed grid of positions, see flash.c), so a sequence's result
// through the paged pool equals the contiguous op's bit for bit, at any
// thread count.
#ifndef TPR_OPS_ATTENTION_IMPL_H
#define TPR_OPS_ATTENTION_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/tensor.h"

// The first `rows` rows of a (rows', heads, D) f32 tensor, read per head as a
// row-major (rows, D) matrix at base + h * hstride with leading dim ld. A
// tensor whose D stride is not 1 (or whose rows overlap) is first copied into
// a contiguous scratch, which the caller frees (free(v->scratch)).
typedef struct tpr__heads_view {
  const float *base;
  int64_t hstride, ld;
  float *scratch;
} tpr__heads_view;

tpr_status tpr__heads_view_init(const char *what, const tpr_tensor *t, int64_t rows, tpr__heads_view *v);

// Whether v fits OpenBLAS's integer (sizes and leading dims).
bool tpr__fits_blasint(int64_t v);

// Keys (or values), D stride 1: position j, KV head g at base + j * ld +
// g * hs (contiguous), or base + blocks[j / bs] * bstride + (j % bs) * ld +
// g * hs through a block table.
typedef struct tpr__kv_src {
  const float *base;
  int64_t ld, hs, bstride;
} tpr__kv_src;

// n >= 1 queries of one sequence at positions start .. start + n - 1: token
// t, head h at q + t * q_ld + h * q_hs; its output at o + (t * Hq + h) * D.
// Token t, head h attends key positions [lo[t], start + t] of KV head
// h / (Hq / Hkv) (lo NULL: from 0; else 0 <= lo[t] <= start + t, the
// document form of ops.h). blk_off: the run's block table in the job's blocks.
typedef struct tpr__attn_run {
  const float *q;
  float *o;
  const int64_t *lo;  // (n) or NULL
  int64_t n, start, blk_off;
  int64_t part_off;  // set by tpr__attention_fwd
} tpr__attn_run;

// Causal GQA attention of every run over k and v (rows up to each run's last
// position must be readable), threaded over n_threads. blocks: NULL for a
// contiguous cache, else the pool blocks (bs rows each) the runs' blk_off
// index. op names the caller in errors (only TPR_ERR_OOM).
tpr_status tpr__attention_fwd(int n_threads, const char *op, tpr__attn_run *runs, int64_t n_runs, int64_t q_ld,
                              int64_t q_hs, const tpr__kv_src *k, const tpr__kv_src *v, const int64_t *blocks,
                              int64_t bs, int64_t Hq, int64_t Hkv, int64_t D, float scale);

// Tests only: skip the accumulator's rescale when a tile raises a row's max
// (a deliberately wrong kernel the attention tests must catch).
extern bool tpr__attention_skip_rescale;

#endif
