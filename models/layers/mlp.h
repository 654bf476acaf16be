// The SwiGLU MLP, tensor-parallel: y = w2(silu(w1 x) * w3 x).
//
// w1 and w3 are column-parallel (rank r computes ffn columns block r), w2 is
// row-parallel (rank r contributes the partial sum over its ffn block); the
// partial outputs are summed across the tp group. The program holds each
// full weight in its checkpoint layout and picks this rank's block with
// index_select on the rank tensor, so one program serves every rank.
#ifndef TPR_MLP_H
#define TPR_MLP_H

#include "runtime/program/tpr_runtime.h"

typedef struct tpr_mlp_dims {
  int64_t tokens;  // T
  int64_t hidden;  // H
  int64_t ffn;     // F, the intermediate size; tp must divide it
  int64_t tp;      // tensor-parallel degree
} tpr_mlp_dims;

typedef struct tpr_mlp_params {
  tpr_value_id w1;  // (F, H) gate_proj, HF (out, in) layout
  tpr_value_id w3;  // (F, H) up_proj
  tpr_value_id w2;  // (H, F) down_proj
} tpr_mlp_params;

// Declares the params "<prefix>w1", "<prefix>w3", "<prefix>w2" (f32).
tpr_status tpr_mlp_declare(tpr_program *p, const char *prefix, const tpr_mlp_dims *d, tpr_mlp_params *out);

// x (T, H) -> partial (T, H): this rank's share of the MLP output. Summing the
// partials over the tp group gives the full output.
tpr_status tpr_mlp_build(tpr_program *p, const tpr_mlp_dims *d, const tpr_mlp_params *w, tpr_value_id rank_index,
                         tpr_value_id x, tpr_value_id *partial);

#endif
