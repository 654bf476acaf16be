// Finite-difference checks of backward rules: a small program (one op, or a
// caller's graph) over params in0, in1, ... is given the loss
// L = sum(out * r) with a fixed random r, differentiated with
// tpr_program_build_backward, and each checked input's gradient is compared
// with central differences (L computed on the host in double from the f32
// output) at a sample of its elements.
#ifndef TPR_GRAD_CHECK_H
#define TPR_GRAD_CHECK_H

#include "test_util.h"
#include "runtime/program/autodiff.h"

typedef tpr_status (*tt_grad_build_fn)(tpr_program *p, const tpr_value_id *in, tpr_value_id *out);

typedef struct tt_grad_case {
  const char *name;
  int n_in;
  const tpr_tensor *in[TPR_OP_MAX_INPUTS];  // on tt_cpu(); copied, never modified
  bool diff[TPR_OP_MAX_INPUTS];             // inputs (f32) whose gradient is checked
  // Either one op ...
  tpr_op_kind op;
  tpr_op_attrs attrs;
  // ... or a graph over the inputs (op and attrs are then ignored).
  tt_grad_build_fn build;
  double h;         // step; 0 means 1e-2
  int max_points;   // elements probed per input; 0 means 64 (all when fewer)
  double corrupt;   // negative controls: 0, or a factor the analytic gradient is multiplied by
} tt_grad_case;

// Returns the worst NMSE (sum (g - fd)^2 / sum fd^2 over the probed
// elements) over the checked inputs, printing one line per input.
double tt_grad_check(const tt_grad_case *c);

// Fails the test when tt_grad_check's NMSE is above bound.
void tt_grad_expect(const tt_grad_case *c, double bound);
// Frees the case's input tensors.
void tt_grad_free_inputs(tt_grad_case *c);

#endif
