// How the op families register their pieces (runtime/README.md).
//
// Each file of runtime/ops/<family>/ that defines shape rules or kernels
// ends with the list of what it defines: a shape rule file lists its ops
// (tpr__op_def: name, arity, rule), a CPU kernel file its kernels
// (tpr__kernel_def), a CUDA file likewise (cuda_kernels.h declares those
// lists). The op table (op_table.c) and the backends (cpu_backend.c,
// cuda_backend.cu) assemble their tables from the lists named below, so
// adding an op to a family touches only the family's own files; only a new
// file adds a line here and to the table that reads it.
#ifndef TPR_OPS_REGISTRY_H
#define TPR_OPS_REGISTRY_H

#include <stdbool.h>

#include "runtime/backend.h"
#include "runtime/ops.h"

// A shape rule: in[] holds exactly the op's arity of non-NULL descriptors,
// attrs is never NULL (its counts are in range); on success out is filled
// (contiguous, except for views, whose strides and offset are the view's).
typedef tpr_status (*tpr__infer_fn)(const tpr_tensor *const *in, const tpr_op_attrs *attrs, tpr_tensor *out);

#define TPR__OP_RULE(name) \
  static tpr_status infer_##name(const tpr_tensor *const *in, const tpr_op_attrs *attrs, tpr_tensor *out)

typedef struct tpr__op_def {
  tpr_op_kind op;
  const char *name;
  int n_inputs;  // of the plain form (the FP8 forms add their scales)
  bool is_view;
  tpr__infer_fn infer;
} tpr__op_def;

typedef struct tpr__kernel_def {
  tpr_op_kind op;
  tpr_kernel_fn fn;
} tpr__kernel_def;

// Every list ends with an entry whose function is NULL ({0}; {} in C++).

// Shape rules, one list per rules file.
extern const tpr__op_def tpr__attention_ops[], tpr__paged_attention_ops[], tpr__collective_ops[], tpr__copy_ops[],
    tpr__elementwise_ops[], tpr__gather_ops[], tpr__loss_ops[], tpr__matmul_ops[], tpr__moe_ops[],
    tpr__moe_bwd_ops[], tpr__norm_ops[], tpr__reduce_ops[], tpr__rope_ops[], tpr__router_ops[], tpr__softmax_ops[],
    tpr__lightning_ops[], tpr__sparse_attention_ops[];

// CPU kernels, one list per kernel file.
extern const tpr__kernel_def tpr__attention_cpu[], tpr__paged_attention_cpu[], tpr__copy_cpu[],
    tpr__elementwise_cpu[], tpr__gather_cpu[], tpr__moe_aux_cpu[], tpr__xent_cpu[], tpr__matmul_cpu[], tpr__moe_cpu[],
    tpr__moe_dispatch_cpu[], tpr__norm_cpu[], tpr__reduce_cpu[], tpr__rope_cpu[], tpr__router_cpu[],
    tpr__softmax_cpu[], tpr__lightning_cpu[], tpr__sparse_attention_cpu[], tpr__sparse_attention_train_cpu[];

#endif
