// What the CPU kernels share (runtime/ops/<family>/*cpu*.c): the backend's
// context and the kernel signature. Each kernel follows tpr_kernel_fn:
// inputs were checked against the op's shape rule by the caller, may be
// strided, and out is contiguous; f32 compute unless noted. A kernel file
// ends with the list of its kernels (registry.h), which cpu_backend.c reads.
#ifndef TPR_CPU_KERNELS_H
#define TPR_CPU_KERNELS_H

#include "runtime/backend.h"
#include "runtime/ops/registry.h"

// Per-process CPU backend context.
typedef struct tpr_cpu_ctx {
  int n_threads;  // threads OpenBLAS and kernels may use
} tpr_cpu_ctx;

#define TPR_CPU_KERNEL(name)                                                                                  \
  static tpr_status cpu_##name(void *ctx, const tpr_tensor *const *in, int n_in, const tpr_op_attrs *attrs, \
                               tpr_tensor *out)

#endif
