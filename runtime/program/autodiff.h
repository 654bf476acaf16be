// Autodiff on programs: the backward of a forward program is appended to the
// same program as more ops (ggml's build_backward idea), so one exec runs the
// forward and the backward and the memory planner sees the whole DAG: a
// forward value lives exactly until the last backward op that reads it.
//
// Every differentiable op kind has a backward rule in runtime/grad/, one
// file per op family (runtime/grad/norm.c for runtime/ops/norm/, ...), which
// registers it there (runtime/grad/grad.h). A rule reads its node (inputs,
// attrs, output, the output's cotangent `dout`) and emits ops for the
// cotangents of the inputs that want one, handing each to tpr_grad_add,
// which sums the contributions of a value's consumers.
//
// Replicated vs partial values (docs/architecture.md section 3). Inside a tp group a
// value is replicated (equal on every rank: the residual stream, the loss) or
// partial/sharded. The autodiff keeps one convention: the cotangent of a
// replicated value is the full gradient on every rank. Two rules follow:
//  - all_reduce (sum) makes a replicated value from partial ones; its
//    backward is the identity (Megatron's g);
//  - where a replicated value enters rank-local compute (a column-parallel
//    input, the all-reduced QK-norm sum of squares feeding this rank's slice,
//    a replicated weight whose slice the rank tensor picks), each rank's
//    cotangent is only its own part, so the builder MARKS that edge with
//    grad_all_reduce (identity forward, all-reduce backward: Megatron's f).
// The autodiff infers nothing about replication: the builder's marks and the
// collective ops' rules are the whole story, and the gradient tests at
// tp 2/4 against PyTorch are the proof.
#ifndef TPR_AUTODIFF_H
#define TPR_AUTODIFF_H

#include "program.h"

typedef struct tpr_backward_opts {
  // (1) i32/i64 values holding this rank's index on each mesh axis (for the
  // rules that must pick their own block, e.g. all_gather's backward), or -1
  // where the program has none (a rule that needs one then fails clearly).
  tpr_value_id axis_rank[TPR_AXIS_COUNT];
} tpr_backward_opts;

// Fills opts with -1 everywhere.
void tpr_backward_opts_init(tpr_backward_opts *o);

// Appends to p the backward of every node p holds now, seeded with
// d loss = 1 (loss: a (1) f32 value). For each wrt[i] (params or inputs),
// grads[i] receives the value id of d loss / d wrt[i] (contiguous f32, also
// for a bf16 wrt; wrt[i]'s shape), or -1 when the loss does not depend on it. A node on the path from
// a wrt value to the loss whose op has no backward rule fails naming the op.
tpr_status tpr_program_build_backward(tpr_program *p, tpr_value_id loss, const tpr_value_id *wrt, int n_wrt,
                                      const tpr_backward_opts *opts, tpr_value_id *grads);

// ---- For backward rules (runtime/grad/*.c).
typedef struct tpr_grad_ctx tpr_grad_ctx;

// A node being differentiated (a copy: rules append ops, which may move the
// program's node array).
typedef struct tpr_grad_node {
  tpr_op_kind op;
  int n_in;
  tpr_value_id in[TPR_OP_MAX_INPUTS];
  tpr_op_attrs attrs;
  tpr_value_id out;
  tpr_value_id dout;  // cotangent of out: out's shape, f32
} tpr_grad_node;

typedef tpr_status (*tpr_backward_rule)(tpr_grad_ctx *g, const tpr_grad_node *n);

// The rule of op kind `op`, NULL when it has none. The engine calls rules
// only through this table, which runtime/grad/grad.c assembles from the
// lists each family's rule file registers.
tpr_backward_rule tpr__backward_rule(tpr_op_kind op);

tpr_program *tpr_grad_program(tpr_grad_ctx *g);
// Whether v needs a cotangent (it depends on a wrt value and the loss
// depends on it). Rules skip the work for inputs that do not.
bool tpr_grad_wanted(const tpr_grad_ctx *g, tpr_value_id v);
// Adds dv (v's shape, f32) to v's cotangent. A no-op when v is not wanted.
tpr_status tpr_grad_add(tpr_grad_ctx *g, tpr_value_id v, tpr_value_id dv);
// This rank's index on `axis` (see tpr_backward_opts).
tpr_status tpr_grad_axis_rank(const tpr_grad_ctx *g, tpr_mesh_axis axis, tpr_value_id *out);
// Result `like` of a packed backward op: the 1-D f32 `packed` viewed at
// element offset `*offset` with like's shape; *offset advances past it.
tpr_status tpr_grad_unpack(tpr_grad_ctx *g, tpr_value_id packed, int64_t *offset, tpr_value_id like,
                           tpr_value_id *out);
// v itself when its strides are contiguous (at any offset), else a
// contiguous copy.
tpr_status tpr_grad_contiguous(tpr_grad_ctx *g, tpr_value_id v, tpr_value_id *out);

// Builders of the training ops (ops.h gives the semantics).
tpr_status tpr_pb_grad_all_reduce(tpr_program *p, tpr_value_id x, tpr_mesh_axis axis, int n, tpr_value_id *out);
tpr_status tpr_pb_sum_to(tpr_program *p, tpr_value_id x, int ndim, const int64_t *shape, tpr_value_id *out);
tpr_status tpr_pb_scale(tpr_program *p, tpr_value_id x, float alpha, tpr_value_id *out);
tpr_status tpr_pb_fill(tpr_program *p, tpr_value_id like, float value, tpr_value_id *out);

#endif
