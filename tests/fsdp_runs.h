// What the FSDP tests (test_fsdp, test_fsdp_qkhd) read from a `tpr train
// --json` run and from its checkpoint: per-step losses and gradient norms,
// the FSDP gather bytes, rank 0's memory line, and a tensor-by-tensor
// comparison of two saves.
#ifndef TPR_TESTS_FSDP_RUNS_H
#define TPR_TESTS_FSDP_RUNS_H

#include <stdbool.h>

typedef struct run {
  double loss[8], norm[8];  // per step: the loss, the gradient's global norm
  int steps;
  double gathered;  // FSDP all-gather bytes of the last step (0: FSDP was off)
  double mem[4];    // rank 0: params, grads, optimizer, arena bytes
} run;

// A run's stdout (modified: split into lines) parsed.
run fr_parse(char *out);
// Worst ||a - b|| / ||b|| over the tensors of want_dir's model.safetensors
// (got_dir must hold each, of the same shape); *worst_name the tensor.
double fr_compare_dirs(const char *got_dir, const char *want_dir, const char **worst_name);
// Worst relative difference of the step losses (norms: of the gradient norms).
double fr_step_err(const run *a, const run *b, bool norms);

#endif
