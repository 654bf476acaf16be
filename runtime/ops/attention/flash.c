// The CPU attention forward, blocked (flash-attention style): causal GQA
// attention of runs of queries over keys read in place, from a contiguous
// cache (cpu.c) or through a paged pool's block table
// (paged_cpu.c).
//
// Keys go in tiles of KB positions. For each query row and tile: scores
// s = scale * (q . k) (one product chain per score, d ascending), then the
// online softmax in f32: m' = max(m, max s), acc := acc * exp(m - m') +
// sum_j exp(s_j - m') v_j, l likewise. Keys past a row's position never enter
// (not even as 0 * v), so unwritten cache rows (NaN) are harmless; nor do keys
// before a run's lo[t] (the document form, packed training sequences). No buffer
// grows with the sequence beyond one (D, KB) key tile per thread.
//
// Tiles are grouped into chunks of CHUNK positions on a fixed grid: a row's
// state is computed per chunk from empty, and the chunks' states are merged
// in ascending order. That is the one definition of every output row, so a
// row's bits do not depend on the thread count, on which other rows share its
// work item, on its run's length, or on the pool's block size:
//  - prefill (a run of more than TB_SPLIT tokens): one work item per (KV
//    head, block of tokens), which walks its chunks in order;
//  - decode (shorter runs): split-K, one work item per (KV head, chunk),
//    partial states to a buffer, merged per row after all items finished.
// Work items run under one OpenMP parallel region with n_threads threads.
// A KV head's query heads (GQA) share each packed key tile.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"

enum { KB = 64, CHUNK = 256, ROWS = 64, TB_SPLIT = 8 };

bool tpr__attention_skip_rescale = false;

typedef float v8f __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));

// Unaligned loads and stores; static and always inlined, so the (baseline
// x86-64) ABI for passing 32-byte vectors never applies.
#pragma GCC diagnostic ignored "-Wpsabi"
static inline __attribute__((always_inline)) v8f ld8(const float *p) {
  v8f v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline __attribute__((always_inline)) void st8(float *p, v8f v) { memcpy(p, &v, sizeof v); }

typedef struct attn_item {
  int64_t run, g, t0;
  int64_t c;  // split-K: the one chunk; -1: every chunk in order
} attn_item;

typedef struct attn_job {
  const tpr__attn_run *runs;
  int64_t q_ld, q_hs, Hq, Hkv, D, tb;
  tpr__kv_src k, v;
  const int64_t *blk;  // pool block of each run's blocks (runs' blk_off index it); NULL: contiguous
  int64_t bs;
  float scale;
  float *part;  // split runs' partial states: (row, chunk, D + 2)
} attn_job;

// Row of key position j of KV head g: through the run's block table if any.
static inline const float *kv_row(const tpr__kv_src *s, const int64_t *blocks, int64_t bs, int64_t g, int64_t j) {
  if (!blocks) return s->base + j * s->ld + g * s->hs;
  return s->base + blocks[j / bs] * s->bstride + (j % bs) * s->ld + g * s->hs;
}

// The partial states (chunks 0, 1, ...) of token t, query head h of split run r.
static inline float *part_row(const attn_job *J, const tpr__attn_run *r, int64_t t, int64_t h) {
  const int64_t n_ch = (r->start + r->n + CHUNK - 1) / CHUNK;
  return J->part + r->part_off + (t * J->Hq + h) * n_ch * (J->D + 2);
}

#define ATT_CAT2(a, b) a##_##b
#define ATT_CAT(a, b) ATT_CAT2(a, b)
#define ATT_FN(name) ATT_CAT(name, ATT_SFX)

#define ATT_SFX base
#include "flash_tile.h"
#undef ATT_SFX

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define ATT_SFX avx2
#include "flash_tile.h"
#undef ATT_SFX
#pragma GCC pop_options
#define ATT_HAVE_AVX2 1
#endif

typedef void (*item_fn)(const attn_job *, const attn_item *, float *, const float **);
typedef void (*merge_row_fn)(const attn_job *, const tpr__attn_run *, int64_t, int64_t, float *);

static bool use_avx2(void) {
#ifdef ATT_HAVE_AVX2
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

static bool split_run(const tpr__attn_run *r) { return r->n <= TB_SPLIT && r->start + r->n > CHUNK; }

tpr_status tpr__attention_fwd(int n_threads, const char *op, tpr__attn_run *runs, int64_t n_runs, int64_t q_ld,
                              int64_t q_hs, const tpr__kv_src *k, const tpr__kv_src *v, const int64_t *blk,
                              int64_t bs, int64_t Hq, int64_t Hkv, int64_t D, float scale) {
  const int64_t group = Hq / Hkv, W = D + 2;
  attn_job J = {.runs = runs, .q_ld = q_ld, .q_hs = q_hs, .Hq = Hq, .Hkv = Hkv, .D = D, .k = *k, .v = *v,
                .blk = blk, .bs = bs, .scale = scale};
  J.tb = ROWS / group > 0 ? ROWS / group : 1;  // tokens per prefill item: about ROWS rows
  // Count the items and the split runs' partial rows.
  int64_t n_items = 0, n_part = 0, n_split_rows = 0;
  for (int64_t i = 0; i < n_runs; i++) {
    tpr__attn_run *r = &runs[i];
    if (split_run(r)) {
      const int64_t n_ch = (r->start + r->n + CHUNK - 1) / CHUNK;
      r->part_off = n_part;
      n_items += Hkv * n_ch;
      n_part += r->n * Hq * n_ch * W;
      n_split_rows += r->n * Hq;
    } else {
      n_items += Hkv * ((r->n + J.tb - 1) / J.tb);
    }
  }
  if (n_items == 0) return TPR_OK;
  const int nt = n_threads < 1 ? 1 : (n_threads > n_items ? (int)n_items : n_threads);
  const int64_t rows = J.tb * group, ws_floats = (2 * KB + 2 * rows * W + 15) & ~(int64_t)15;
  attn_item *items = malloc((size_t)n_items * sizeof *items);
  int64_t *split_rows = malloc((size_t)(n_split_rows > 0 ? n_split_rows : 1) * 2 * sizeof *split_rows);
  float *ws = aligned_alloc(64, (size_t)(nt * ws_floats) * sizeof(float));
  const float **krows = malloc((size_t)(nt * 2 * KB) * sizeof *krows);  // key and value rows of a tile
  J.part = malloc((size_t)(n_part > 0 ? n_part : 1) * sizeof(float));
  tpr_status rc = TPR_OK;
  if (!items || !split_rows || !ws || !krows || !J.part) {
    rc = TPR_FAIL(TPR_ERR_OOM, "%s: scratch for %lld work items, %lld partial floats, D = %lld", op,
                  (long long)n_items, (long long)n_part, (long long)D);
    goto done;
  }
  int64_t ni = 0, ns = 0;
  for (int64_t i = 0; i < n_runs; i++) {
    const tpr__attn_run *r = &runs[i];
    if (split_run(r)) {
      const int64_t n_ch = (r->start + r->n + CHUNK - 1) / CHUNK;
      for (int64_t g = 0; g < Hkv; g++)
        for (int64_t c = 0; c < n_ch; c++) items[ni++] = (attn_item){.run = i, .g = g, .t0 = 0, .c = c};
      for (int64_t t = 0; t < r->n * Hq; t++) split_rows[2 * ns] = i, split_rows[2 * ns++ + 1] = t;
    } else {
      for (int64_t g = 0; g < Hkv; g++)
        for (int64_t t0 = 0; t0 < r->n; t0 += J.tb) items[ni++] = (attn_item){.run = i, .g = g, .t0 = t0, .c = -1};
    }
  }
  const bool avx2 = use_avx2();
  item_fn run_item = item_base;
  merge_row_fn run_merge = merge_row_base;
#ifdef ATT_HAVE_AVX2
  if (avx2) run_item = item_avx2, run_merge = merge_row_avx2;
#else
  (void)avx2;
#endif
#pragma omp parallel num_threads(nt)
  {
    const int tid = omp_get_thread_num();
    float *w = ws + tid * ws_floats;
    // Long prefill items cost more than decode ones: hand them out one at a time.
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_items; i++) run_item(&J, &items[i], w, krows + tid * 2 * KB);
    // (the loop's barrier: every partial is written)
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_split_rows; i++) {
      const tpr__attn_run *r = &runs[split_rows[2 * i]];
      const int64_t th = split_rows[2 * i + 1];
      run_merge(&J, r, th / Hq, th % Hq, w);
    }
  }
done:
  free(items), free(split_rows), free(ws), free(krows), free(J.part);
  return rc;
}
