// The op table: every op's name, arity and shape rule, assembled from the
// lists the op families register (registry.h), plus the eager entry point.
// Programs call the same shape rules, so eager and program semantics agree.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "registry.h"
#include "rule_checks.h"
#include "runtime/backend.h"

// The lists of the shape-rules files (registry.h).
static const tpr__op_def *const rule_lists[] = {
    tpr__matmul_ops, tpr__elementwise_ops, tpr__norm_ops, tpr__softmax_ops, tpr__gather_ops, tpr__copy_ops,
    tpr__collective_ops, tpr__rope_ops, tpr__attention_ops, tpr__router_ops, tpr__moe_ops, tpr__reduce_ops,
    tpr__moe_bwd_ops, tpr__loss_ops, tpr__paged_attention_ops, tpr__lightning_ops,
    tpr__sparse_attention_ops,
};

static tpr__op_def ops[TPR_OP_KIND_COUNT];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

// An op registered twice, or a kind out of range, is a build mistake that
// every program would trip over: stop at once, naming it.
static void build_table(void) {
  for (size_t f = 0; f < sizeof rule_lists / sizeof *rule_lists; f++)
    for (const tpr__op_def *d = rule_lists[f]; d->infer; d++) {
      if ((unsigned)d->op >= TPR_OP_KIND_COUNT || ops[d->op].infer) {
        fprintf(stderr, "tpr: op kind %d ('%s') is out of range or registered twice\n", (int)d->op, d->name);
        abort();
      }
      ops[d->op] = *d;
    }
}

static const char *const axis_names[TPR_AXIS_COUNT] = {"world", "tp", "dp", "ep", "etp", "edp"};

const char *tpr_mesh_axis_name(tpr_mesh_axis a) { return (unsigned)a < TPR_AXIS_COUNT ? axis_names[a] : "?"; }

// Kinds are numbered ahead of their rules while an op family is being added:
// a kind with no entry is unknown.
static bool op_valid(tpr_op_kind op) {
  pthread_once(&table_once, build_table);
  return (unsigned)op < TPR_OP_KIND_COUNT && ops[op].infer;
}

const char *tpr_op_name(tpr_op_kind op) { return op_valid(op) ? ops[op].name : "?"; }
int tpr_op_num_inputs(tpr_op_kind op) { return op_valid(op) ? ops[op].n_inputs : -1; }
bool tpr_op_is_view(tpr_op_kind op) { return op_valid(op) && ops[op].is_view; }
// all_to_allv came later than 12..15, so the collectives are not one range.
bool tpr_op_is_collective(tpr_op_kind op) {
  return (op >= TPR_OP_ALL_REDUCE && op <= TPR_OP_ALL_TO_ALL) || op == TPR_OP_ALL_TO_ALLV ||
         op == TPR_OP_PARAM_GATHER;
}

tpr_status tpr__op_infer(tpr_op_kind op, const tpr_tensor *const *in, int n_in, const tpr_op_attrs *attrs,
                         tpr_tensor *out) {
  static const tpr_op_attrs no_attrs;
  if (!op_valid(op)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "unknown op kind %d", (int)op);
  int block = tpr__fp8_block_attr(op, attrs), want = ops[op].n_inputs + (block > 0 ? tpr__fp8_extra_inputs(op) : 0);
  const int extra = tpr__optional_inputs(op, attrs);
  want += extra;
  if (n_in != want)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s takes %d inputs%s, got %d", ops[op].name, want,
                    block > 0 ? " in its FP8 form (the weights' scales last)"
                    : extra && op == TPR_OP_SPARSE_ATTENTION_PAGED
                        ? " with the optional inputs its i[7] names (compressed-key pool, then prefill lengths)"
                    : extra ? " in its document form (the (T) lower bounds last)"
                            : "", n_in);
  for (int i = 0; i < n_in; i++)
    if (!in[i]) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: input %d is NULL", ops[op].name, i);
  if (!attrs) attrs = &no_attrs;
  if (attrs->n_i < 0 || attrs->n_i > TPR_OP_MAX_IATTRS || attrs->n_f < 0 || attrs->n_f > TPR_OP_MAX_FATTRS)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: attribute counts out of range", ops[op].name);
  return ops[op].infer(in, attrs, out);
}

tpr_status tpr_op_run(tpr_backend *backend, tpr_op_kind op, const tpr_tensor *const *in, int n_in,
                      const tpr_op_attrs *attrs, tpr_tensor *out) {
  static const tpr_op_attrs no_attrs;
  if (!backend || !out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_op_run: NULL backend or out");
  if (!op_valid(op)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "unknown op kind %d", (int)op);
  if (!attrs) attrs = &no_attrs;
  tpr_tensor want;
  TPR_CHECK(tpr__op_infer(op, in, n_in, attrs, &want));
  if (ops[op].is_view)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s is a view: use tpr_tensor_%s", ops[op].name, ops[op].name);
  if (tpr_op_is_collective(op))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s is a collective: call tpr_comm_%s, or run it in a program exec given "
                    "communicators (tpr_exec_set_collectives)", ops[op].name, ops[op].name);
  if (want.dtype != out->dtype || !tpr_tensor_same_shape(&want, out)) {
    char w[128], g[128];
    return TPR_FAIL(TPR_ERR_SHAPE, "%s: output must be %s, got %s", ops[op].name,
                    tpr_tensor_describe(&want, w, sizeof w), tpr_tensor_describe(out, g, sizeof g));
  }
  if (!tpr_tensor_is_contiguous(out)) return TPR_FAIL(TPR_ERR_SHAPE, "%s: output must be contiguous", ops[op].name);
  for (int i = 0; i < n_in; i++)
    if (tpr_tensor_backend(in[i]) != backend)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: input %d lives on another backend", ops[op].name, i);
  if (tpr_tensor_backend(out) != backend)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: output lives on another backend", ops[op].name);
  tpr_kernel_fn fn = backend->vt->kernels[op];
  if (!fn) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "backend %s has no %s kernel", backend->vt->name, ops[op].name);
  return fn(backend->ctx, in, n_in, attrs, out);
}
