// Backends: a vtable plus a context (the ggml shape). A backend owns memory
// allocation, copies, and one kernel per op kind; an entry it cannot serve is
// NULL and the public wrappers turn that into TPR_ERR_UNSUPPORTED.
#ifndef TPR_BACKEND_H
#define TPR_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "ops.h"
#include "tensor.h"

// A kernel: in[0..n_in) and out have been checked against the op's shape
// rule, live on this backend, and out is contiguous. Inputs may be strided.
typedef tpr_status (*tpr_kernel_fn)(void *ctx, const tpr_tensor *const *in, int n_in,
                                    const tpr_op_attrs *attrs, tpr_tensor *out);

typedef struct tpr_backend_vtable {
  const char *name;
  bool host_addressable;  // its pointers can be read by host code
  tpr_status (*alloc)(void *ctx, size_t bytes, void **ptr);
  void (*free)(void *ctx, void *ptr);
  tpr_status (*copy_from_host)(void *ctx, void *dst, const void *src, size_t bytes);
  tpr_status (*copy_to_host)(void *ctx, void *dst, const void *src, size_t bytes);
  tpr_status (*copy_device)(void *ctx, void *dst, const void *src, size_t bytes);
  tpr_status (*memset)(void *ctx, void *ptr, int value, size_t bytes);
  tpr_status (*sync)(void *ctx);
  void (*destroy)(void *ctx);
  tpr_kernel_fn kernels[TPR_OP_KIND_COUNT];
} tpr_backend_vtable;

struct tpr_backend {
  const tpr_backend_vtable *vt;
  void *ctx;
};

typedef struct tpr_cpu_options {
  // GEMM and kernel threads for this process; 0 picks: TPR_NUM_THREADS if set,
  // else Slurm's SLURM_CPUS_PER_TASK, else the online cores divided by the
  // ranks on this node (so ranks that fill the cores get one thread each), at least 1.
  int n_threads;
} tpr_cpu_options;

tpr_status tpr_backend_cpu_new(const tpr_cpu_options *opts, tpr_backend **out);
int tpr_backend_cpu_threads(const tpr_backend *cpu);
// Matmuls against bf16 weights on this backend: activations rounded to bf16
// and bf16 dot products (on), or exact f32 products (off, the default).
// TPR_ERR_INVALID_ARG when `cpu` is not a cpu backend.
tpr_status tpr_backend_cpu_set_bf16_activations(tpr_backend *cpu, bool on);
void tpr_backend_free(tpr_backend *b);
const char *tpr_backend_name(const tpr_backend *b);

// Memory helpers that dispatch through the vtable.
tpr_status tpr_backend_alloc(tpr_backend *b, size_t bytes, void **ptr);
void tpr_backend_release(tpr_backend *b, void *ptr);
tpr_status tpr_backend_sync(tpr_backend *b);

// Copy a whole contiguous tensor to/from host memory of exactly nbytes.
tpr_status tpr_tensor_to_host(const tpr_tensor *t, void *dst, size_t nbytes);
tpr_status tpr_tensor_from_host(tpr_tensor *t, const void *src, size_t nbytes);
tpr_status tpr_tensor_fill_zero(tpr_tensor *t);

// Ranks of this job on this node, from the launcher's environment
// (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, then Slurm's
// SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID, as srun --mpi=pmix leaves it,
// then SLURM_NTASKS_PER_NODE); 1 if none.
int tpr_local_ranks_from_env(void);
// CPUs the launcher gave this rank (Slurm's SLURM_CPUS_PER_TASK); 0 if unknown.
int tpr_cpus_per_rank_from_env(void);

#endif
