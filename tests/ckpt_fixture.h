// Tiny random Hugging Face checkpoints for the loader tests, written with
// tpr_st_write over three files and an index, and kept in memory as f32
// copies of the stored values. Tensor names and shapes are spelled out here,
// not taken from the sharding planner, so the tests check the planner's and
// loader's naming as well as their slicing.
#ifndef TPR_CKPT_FIXTURE_H
#define TPR_CKPT_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/dtype.h"

typedef struct ck_spec {
  bool qwen3;                  // qwen3_moe (layer 0 dense, per-head QK-norm) instead of minimax_m2
  int64_t nq, nkv, D, H, L;    // heads, head_dim, hidden, layers
  int64_t E, I, V, F;          // experts, expert width, vocab, dense width (qwen3)
  // FP8 weight_block_size; when set, a few weights (layer 0 q_proj and
  // o_proj, layer 1 expert 1 w2) are stored as F8_E4M3 with scale_inv.
  int fp8_rows, fp8_cols;
} ck_spec;

typedef struct ck_tensor {
  char name[128];
  int ndim;
  int64_t shape[2];
  tpr_dtype dtype;   // as stored: BF16, the routing bias F32, some F8E4M3
  float *values;     // (shape) the stored values, exactly (FP8: code * scale in f32)
  uint8_t *codes;    // FP8 only: (shape) the stored codes
  float *scale;      // FP8 only: (sshape) scale_inv, one per block
  int64_t sshape[2];
} ck_tensor;

typedef struct ck_model {
  ck_spec s;
  ck_tensor *t;
  int n;
} ck_model;

// A spec with the shapes of configs/minimax_m2_tiny.json, scaled down, and
// a vocab that no small tp divides (so vocab padding is exercised).
ck_spec ck_default_spec(void);
// Writes config.json, model-0000{1,2,3}-of-00003.safetensors and the index
// into dir (which must exist). Fails the test on any error.
void ck_write(const char *dir, const ck_spec *s, ck_model *out);
// Removes the index and rewrites the file holding `skip` without it, or the
// one holding `reshape` with one row more (either may be NULL).
void ck_rewrite(const char *dir, const ck_model *m, const char *skip, const char *reshape);
const ck_tensor *ck_find(const ck_model *m, const char *name);  // NULL if absent
void ck_free(ck_model *m);

// rm -r for the flat directories the tests make.
void ck_rmdir(const char *dir);

#endif
