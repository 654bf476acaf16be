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
  // Matmuls against bf16 weights round their activations to bf16 and use
  // bf16 dot products (gemm/bf16_gemm.h); off: exact f32 products.
  bool bf16_activations;
} tpr_cpu_ctx;

// Sum of x (n) over eight interleaved f32 partial sums combined in one fixed
// tree: a deterministic order the compiler can vectorise, with an error that
// grows with n/8 instead of n (norm/cpu.c's sum of squares is its twin).
static inline float tpr__sum8_f32(const float *x, int64_t n) {
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) acc[l] += x[i + l];
  for (int l = 0; i < n; i++, l++) acc[l] += x[i];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

#define TPR_CPU_KERNEL(name)                                                                                  \
  static tpr_status cpu_##name(void *ctx, const tpr_tensor *const *in, int n_in, const tpr_op_attrs *attrs, \
                               tpr_tensor *out)

#endif
