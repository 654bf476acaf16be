// The CPU backend: host memory, OpenBLAS GEMM, plain C kernels. It is the
// reference every other backend is compared against.
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

static const tpr_backend_vtable cpu_vtable = {
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
    .kernels =
        {
            [TPR_OP_MATMUL] = tpr__cpu_matmul,
            [TPR_OP_ADD] = tpr__cpu_add,
            [TPR_OP_MUL] = tpr__cpu_mul,
            [TPR_OP_RMS_NORM] = tpr__cpu_rms_norm,
            [TPR_OP_SWIGLU] = tpr__cpu_swiglu,
            [TPR_OP_SOFTMAX] = tpr__cpu_softmax,
            [TPR_OP_EMBEDDING] = tpr__cpu_embedding,
            [TPR_OP_INDEX_SELECT] = tpr__cpu_index_select,
            [TPR_OP_CAST] = tpr__cpu_cast,
            [TPR_OP_SUM_SQUARES] = tpr__cpu_sum_squares,
            [TPR_OP_RMS_SCALE] = tpr__cpu_rms_scale,
            [TPR_OP_EMBEDDING_SHARD] = tpr__cpu_embedding_shard,
            [TPR_OP_ROPE] = tpr__cpu_rope,
            [TPR_OP_ATTENTION] = tpr__cpu_attention,
            [TPR_OP_CACHE_WRITE] = tpr__cpu_cache_write,
            [TPR_OP_ROUTER_SIGMOID_TOPK] = tpr__cpu_router_sigmoid_topk,
            [TPR_OP_MOE_EXPERTS] = tpr__cpu_moe_experts,
            [TPR_OP_MOE_CAPACITY] = tpr__cpu_moe_capacity,
            [TPR_OP_ROW_SLICE] = tpr__cpu_row_slice,
            [TPR_OP_MOE_COUNTS] = tpr__cpu_moe_counts,
            [TPR_OP_MOE_PERMUTE] = tpr__cpu_moe_permute,
            [TPR_OP_MOE_GROUPED_FFN] = tpr__cpu_moe_grouped_ffn,
            [TPR_OP_MOE_UNPERMUTE] = tpr__cpu_moe_unpermute,
            // Training ops.
            [TPR_OP_SUM_TO] = tpr__cpu_sum_to,
            [TPR_OP_SCALE] = tpr__cpu_scale,
            [TPR_OP_FILL] = tpr__cpu_fill,

            // -- dense backward
            [TPR_OP_RMS_NORM_BWD] = tpr__cpu_rms_norm_bwd,
            [TPR_OP_RMS_SCALE_BWD] = tpr__cpu_rms_scale_bwd,
            [TPR_OP_SWIGLU_BWD] = tpr__cpu_swiglu_bwd,
            [TPR_OP_SOFTMAX_BWD] = tpr__cpu_softmax_bwd,
            [TPR_OP_EMBEDDING_BWD] = tpr__cpu_embedding_bwd,
            [TPR_OP_EMBEDDING_SHARD_BWD] = tpr__cpu_embedding_shard_bwd,
            [TPR_OP_INDEX_SELECT_BWD] = tpr__cpu_index_select_bwd,
            [TPR_OP_SLICE_BWD] = tpr__cpu_slice_bwd,

            // -- attention backward (rope, attention)
            [TPR_OP_ROPE_BWD] = tpr__cpu_rope_bwd,
            [TPR_OP_ATTENTION_BWD] = tpr__cpu_attention_bwd,

            // -- MoE backward
            [TPR_OP_ROUTER_SIGMOID_TOPK_BWD] = tpr__cpu_router_sigmoid_topk_bwd,
            [TPR_OP_MOE_EXPERTS_BWD] = tpr__cpu_moe_experts_bwd,
            [TPR_OP_MOE_GROUPED_FFN_BWD] = tpr__cpu_moe_grouped_ffn_bwd,
            [TPR_OP_MOE_PERMUTE_BWD] = tpr__cpu_moe_permute_bwd,
            [TPR_OP_MOE_UNPERMUTE_BWD] = tpr__cpu_moe_unpermute_bwd,
            [TPR_OP_ROW_SLICE_BWD] = tpr__cpu_row_slice_bwd,
            [TPR_OP_MOE_CAPACITY_BWD] = tpr__cpu_moe_capacity_bwd,

            // -- losses
            [TPR_OP_XENT_MAX] = tpr__cpu_xent_max,
            [TPR_OP_XENT_SUMEXP] = tpr__cpu_xent_sumexp,
            [TPR_OP_XENT_SUMEXP_BWD] = tpr__cpu_xent_sumexp_bwd,
            [TPR_OP_XENT_TARGET] = tpr__cpu_xent_target,
            [TPR_OP_XENT_TARGET_BWD] = tpr__cpu_xent_target_bwd,
            [TPR_OP_XENT_LOSS] = tpr__cpu_xent_loss,
            [TPR_OP_XENT_LOSS_BWD] = tpr__cpu_xent_loss_bwd,
            [TPR_OP_MOE_AUX_STATS] = tpr__cpu_moe_aux_stats,
            [TPR_OP_MOE_AUX_STATS_BWD] = tpr__cpu_moe_aux_stats_bwd,
            [TPR_OP_MOE_AUX_LOSS] = tpr__cpu_moe_aux_loss,
            [TPR_OP_MOE_AUX_LOSS_BWD] = tpr__cpu_moe_aux_loss_bwd,

            // -- paged attention
            [TPR_OP_PAGED_CACHE_WRITE] = tpr__cpu_paged_cache_write,
            [TPR_OP_PAGED_ATTENTION] = tpr__cpu_paged_attention,

        },
};

static int pick_threads(int requested) {
  if (requested > 0) return requested;
  const char *env = getenv("TPR_NUM_THREADS");
  if (env && atoi(env) > 0) return atoi(env);
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
  ctx->n_threads = pick_threads(opts ? opts->n_threads : 0);
  // OpenBLAS's thread count is per process, so the last CPU backend created
  // sets it; the kernels use their own backend's ctx->n_threads.
  openblas_set_num_threads(ctx->n_threads);
  b->vt = &cpu_vtable;
  b->ctx = ctx;
  *out = b;
  return TPR_OK;
}

int tpr_backend_cpu_threads(const tpr_backend *cpu) {
  if (!cpu || cpu->vt != &cpu_vtable) return 0;
  return ((const tpr_cpu_ctx *)cpu->ctx)->n_threads;
}
