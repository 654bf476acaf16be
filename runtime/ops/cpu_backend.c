// The CPU backend: host memory, OpenBLAS GEMM, plain C kernels (the CPU
// kernel files of runtime/ops/<family>/). It is the reference every other
// backend is compared against.
//
// Threads: one OpenMP runtime (libgomp) for everything. OpenBLAS is its
// OpenMP build (CMakeLists.txt links it by path), so its GEMMs run on the
// same pool as the kernels' `omp parallel` regions (cpu_threads.h) and two
// pools never spin against each other. The count is set here, once per
// backend: openblas_set_num_threads (which, in the OpenMP build, also sets
// omp_set_num_threads for the host loops without a num_threads clause), and
// ctx->n_threads, which every kernel passes as num_threads.
//
// Wait policy: libgomp's default lets an idle worker spin (GOMP_SPINCOUNT,
// ~0.3M pause iterations) before it sleeps, so back-to-back kernels fork in
// ~1 us instead of a futex wake. That is right when the process owns its
// cores. On a host shared with other busy processes (more runnable threads
// than cores) a spinning worker steals the time another thread needs, and
// OMP_WAIT_POLICY=passive is the better setting. The runtime reads it at
// load time, before any code of ours runs, so it belongs in the job's
// environment, not here.
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/backend.h"
#include "cpu_kernels.h"

// 64-byte alignment keeps AVX-512 loads aligned and rows off shared cache lines.
#define CPU_ALIGN 64

static tpr_status cpu_alloc(void *ctx, size_t bytes, void **ptr) {
  size_t rounded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
  *ptr = aligned_alloc(CPU_ALIGN, rounded ? rounded : CPU_ALIGN);
  if (!*ptr) return TPR_FAIL(TPR_ERR_OOM, "cpu: cannot allocate %zu bytes", bytes);
  return TPR_OK;
}

static void cpu_free(void *ctx, void *ptr) { free(ptr); }

static tpr_status cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  if (bytes) memmove(dst, src, bytes);
  return TPR_OK;
}

static tpr_status cpu_memset(void *ctx, void *ptr, int value, size_t bytes) {
  if (bytes) memset(ptr, value, bytes);
  return TPR_OK;
}

static void cpu_destroy(void *ctx) { free(ctx); }

// The kernel files' lists (registry.h).
static const tpr__kernel_def *const kernel_lists[] = {
    tpr__matmul_cpu, tpr__elementwise_cpu, tpr__norm_cpu, tpr__softmax_cpu, tpr__gather_cpu, tpr__copy_cpu,
    tpr__rope_cpu, tpr__attention_cpu, tpr__router_cpu, tpr__moe_cpu, tpr__moe_dispatch_cpu, tpr__reduce_cpu,
    tpr__xent_cpu, tpr__moe_aux_cpu, tpr__paged_attention_cpu, tpr__lightning_cpu,
    tpr__sparse_attention_cpu, tpr__sparse_attention_train_cpu,
};

// The kernel table is filled once, from the lists, before the first backend
// is handed out.
static tpr_backend_vtable cpu_vtable = {
    .name = "cpu",
    .host_addressable = true,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_from_host = cpu_copy,
    .copy_to_host = cpu_copy,
    .copy_device = cpu_copy,
    .memset = cpu_memset,
    .sync = NULL,  // every CPU kernel is synchronous
    .destroy = cpu_destroy,
};
static pthread_once_t kernels_once = PTHREAD_ONCE_INIT;

// Two kernels for one op kind is a build mistake: stopped at once, named.
static void add_kernels(void) {
  for (size_t l = 0; l < sizeof kernel_lists / sizeof *kernel_lists; l++)
    for (const tpr__kernel_def *k = kernel_lists[l]; k->fn; k++) {
      if ((unsigned)k->op >= TPR_OP_KIND_COUNT || cpu_vtable.kernels[k->op]) {
        fprintf(stderr, "tpr: cpu kernel of op kind %d is out of range or registered twice\n", (int)k->op);
        abort();
      }
      cpu_vtable.kernels[k->op] = k->fn;
    }
}

static int pick_threads(int requested) {
  if (requested > 0) return requested;
  const char *env = getenv("TPR_NUM_THREADS");
  if (env && atoi(env) > 0) return atoi(env);
  int given = tpr_cpus_per_rank_from_env();  // srun/sbatch --cpus-per-task
  if (given > 0) return given;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int per_rank = (int)(cores > 0 ? cores : 1) / tpr_local_ranks_from_env();
  return per_rank > 0 ? per_rank : 1;
}

tpr_status tpr_backend_cpu_new(const tpr_cpu_options *opts, tpr_backend **out) {
  *out = NULL;
  tpr_cpu_ctx *ctx = calloc(1, sizeof *ctx);
  tpr_backend *b = calloc(1, sizeof *b);
  if (!ctx || !b) {
    free(ctx);
    free(b);
    return TPR_FAIL(TPR_ERR_OOM, "cpu backend");
  }
  pthread_once(&kernels_once, add_kernels);
  ctx->n_threads = pick_threads(opts ? opts->n_threads : 0);
  // OpenBLAS's thread count is per process, so the last CPU backend created
  // sets it; the kernels use their own backend's ctx->n_threads.
  openblas_set_num_threads(ctx->n_threads);
  b->vt = &cpu_vtable;
  b->ctx = ctx;
  *out = b;
  return TPR_OK;
}

tpr_status tpr_backend_cpu_set_bf16_activations(tpr_backend *cpu, bool on) {
  if (!cpu || cpu->vt != &cpu_vtable)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "bf16 activations: backend %s is not the cpu", tpr_backend_name(cpu));
  ((tpr_cpu_ctx *)cpu->ctx)->bf16_activations = on;
  return TPR_OK;
}

int tpr_backend_cpu_threads(const tpr_backend *cpu) {
  if (!cpu || cpu->vt != &cpu_vtable) return 0;
  return ((const tpr_cpu_ctx *)cpu->ctx)->n_threads;
}
