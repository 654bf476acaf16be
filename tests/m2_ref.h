// The MiniMax-M2 fixture made by scripts/reference/ (transformers'
// logits for two prompts and greedy tokens) and the helpers the end-to-end
// tests share: reading it, reading `tpr forward`'s output, measuring error.
#ifndef TPR_TEST_M2_REF_H
#define TPR_TEST_M2_REF_H

#include <stddef.h>
#include <stdint.h>

#include "shard/safetensors.h"

#define M2_FIX TPR_FIXTURES "/minimax_m2_tiny"
#define M2_V 256   // the fixture's vocabulary
#define M2_TA 11   // tokens_a
#define M2_TB 5    // tokens_b
#define M2_NG 8    // greedy_a
#define M2_PARITY_BOUND 1e-4  // max|d| <= bound * max|logit|: the TP parity tolerance

typedef struct m2_ref {
  int32_t a[M2_TA], b[M2_TB], greedy_a[M2_NG];
  float logits_a[M2_TA * M2_V], logits_b[M2_TB * M2_V], greedy_logits_a[M2_NG * M2_V];
  char a_text[256], b_text[256];  // "1,2,3" for --tokens
} m2_ref;

// Loads M2_FIX/reference.safetensors into *r (fails the test otherwise).
void m2_ref_load(m2_ref *r);

// max_i |got_i - want_i| / max_i |want_i|; infinity if got holds a NaN/Inf.
double m2_rel_err(const float *got, const float *want, size_t n);

// `name` (rows, cols) f32 of an open set (cols 0: a vector of rows).
void m2_read_f32(const tpr_st_set *set, const char *name, int64_t rows, int64_t cols, float *dst);
// The (T, M2_V) f32 tensor `key` of a safetensors file `tpr forward` wrote (malloc'ed).
float *m2_read_logits(const char *path, const char *key, int64_t T);

// "a,b,c" of n ids into text (at least 12*n bytes).
void m2_ids_text(const int32_t *ids, int n, char *text);

#endif
