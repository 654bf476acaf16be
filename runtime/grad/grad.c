// The backward-rule table the autodiff engine reads (tpr__backward_rule,
// declared in runtime/program/autodiff.h), assembled from the lists the
// family files register, and the helpers rules share.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "grad.h"

static const tpr__grad_def *const families[] = {
    tpr__matmul_grad, tpr__elementwise_grad, tpr__norm_grad, tpr__softmax_grad, tpr__gather_grad, tpr__copy_grad,
    tpr__collective_grad, tpr__rope_grad, tpr__attention_grad, tpr__router_grad, tpr__moe_grad, tpr__reduce_grad,
    tpr__loss_grad, tpr__lightning_grad, tpr__sparse_attention_grad,
};

static tpr_backward_rule rules[TPR_OP_KIND_COUNT];
static pthread_once_t rules_once = PTHREAD_ONCE_INIT;

// As the op table (runtime/ops/op_table.c): a rule registered twice is a
// build mistake, stopped at once.
static void build_rules(void) {
  for (size_t f = 0; f < sizeof families / sizeof *families; f++)
    for (const tpr__grad_def *d = families[f]; d->rule; d++) {
      if ((unsigned)d->op >= TPR_OP_KIND_COUNT || rules[d->op]) {
        fprintf(stderr, "tpr: the backward rule of op kind %d is out of range or registered twice\n", (int)d->op);
        abort();
      }
      rules[d->op] = d->rule;
    }
}

tpr_backward_rule tpr__backward_rule(tpr_op_kind op) {
  pthread_once(&rules_once, build_rules);
  return (unsigned)op < TPR_OP_KIND_COUNT ? rules[op] : NULL;
}

tpr_status tpr__grad_take(tpr_grad_ctx *g, tpr_value_id packed, int64_t *off, tpr_value_id like) {
  if (!tpr_grad_wanted(g, like)) {
    tpr_tensor d;
    TPR_CHECK(tpr_program_value(tpr_grad_program(g), like, &d));
    *off += tpr_tensor_numel(&d);
    return TPR_OK;
  }
  tpr_value_id v;
  TPR_CHECK(tpr_grad_unpack(g, packed, off, like, &v));
  return tpr_grad_add(g, like, v);
}

