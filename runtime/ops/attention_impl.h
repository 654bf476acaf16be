// The CPU attention's causal block algorithm (attention.c), shared with the
// paged attention (paged_attention.c) so both compute a query's output with
// the same GEMMs and the same softmax: a sequence's result through the paged
// pool equals the contiguous op's bit for bit when its keys are gathered into
// a contiguous (L, Hkv, D) scratch.
#ifndef TPR_OPS_ATTENTION_IMPL_H
#define TPR_OPS_ATTENTION_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "../tensor.h"

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

// Floats of score scratch tpr__attention_causal needs for T queries whose
// last one sees L = start + T keys.
int64_t tpr__attention_scratch_floats(int64_t T, int64_t L);

// Causal GQA attention of T >= 1 queries at positions start .. start + T - 1:
// query t, head h attends keys [0, start + t] of KV head h / (Hq / Hkv).
// q: T rows of Hq heads; k, v: start + T rows of Hkv heads; out row t, head h
// at o + (t * Hq + h) * D. p: tpr__attention_scratch_floats(T, start + T)
// floats. Every size and leading dim must fit a blasint (the caller checks).
void tpr__attention_causal(const tpr__heads_view *q, const tpr__heads_view *k, const tpr__heads_view *v, int64_t T,
                           int64_t Hq, int64_t Hkv, int64_t D, int64_t start, float scale, float *o, float *p);

#endif
