// What the CUDA kernels share (runtime/ops/<family>/*cuda.cu; the CUDA twin
// of cpu_kernels.h): the backend's context, the kernel signature and host
// and device helpers. Each kernel follows tpr_kernel_fn: inputs were checked
// against the op's shape rule by tpr_op_run, live on this backend, may be
// strided; out is contiguous. Every kernel computes the same function as its CPU twin
// (same formulas, same documented accumulation types, same errors); only the
// order of f32 sums differs where the CPU's order is inherently sequential.
//
// All work is enqueued on the backend's one stream (ctx->stream), GEMMs go
// through the backend's cuBLAS handle bound to that stream. Device memory
// (including index tensors such as the rank tensor) is only ever read by
// device code or through an explicit copy (tpr__cuda_read).
//
// C++ (included from *.cu only): the runtime's C headers get C linkage here.
#ifndef TPR_CUDA_KERNELS_H
#define TPR_CUDA_KERNELS_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>  // the C headers below include these; not inside extern "C"

extern "C" {
#include "registry.h"
#include "runtime/backend.h"
#include "strided.h"  // host-side iterators and stride helpers, shared with the CPU kernels
}

typedef struct tpr_cuda_pool tpr_cuda_pool;  // the caching allocator (cuda_backend.cu)

// Per-backend CUDA context.
typedef struct tpr_cuda_ctx {
  int device;
  cudaStream_t stream;   // every kernel, copy and GEMM of this backend
  cublasHandle_t blas;   // bound to stream
  tpr_cuda_pool *pool;   // freed blocks, reused in stream order
  void *stage;           // (stage_bytes) pinned host memory for small device -> host reads
  size_t stage_bytes;
} tpr_cuda_ctx;

#define TPR_CUDA_KERNEL(name)                                                                                  \
  static tpr_status cuda_##name(void *ctx, const tpr_tensor *const *in, int n_in, const tpr_op_attrs *attrs, \
                                tpr_tensor *out)

// The CUDA kernel files' lists (registry.h), which cuda_backend.cu reads.
extern const tpr__kernel_def tpr__attention_cuda[], tpr__paged_attention_cuda[], tpr__copy_cuda[],
    tpr__elementwise_cuda[], tpr__gather_cuda[], tpr__matmul_cuda[], tpr__moe_cuda[], tpr__norm_cuda[],
    tpr__rope_cuda[], tpr__router_cuda[], tpr__softmax_cuda[], tpr__lightning_cuda[], tpr__sparse_attention_cuda[];

// ---- host helpers (cuda_backend.cu, or cuda_shared.cu where noted) --------

// A failed CUDA / cuBLAS call as a tpr_status naming the op: OOM for
// allocation failures, UNSUPPORTED when the device cannot run this build's
// code, INTERNAL otherwise. Clears the runtime's (non-sticky) last error.
tpr_status tpr__cuda_fail(cudaError_t err, const char *op, const char *what, const char *file, int line);
tpr_status tpr__cublas_fail(cublasStatus_t st, const char *op, const char *what, const char *file, int line);

#define TPR_CUDA_TRY(call, op, what)                                                      \
  do {                                                                                    \
    cudaError_t tpr__ce = (call);                                                         \
    if (tpr__ce != cudaSuccess) return tpr__cuda_fail(tpr__ce, (op), (what), __FILE__, __LINE__); \
  } while (0)

// After a <<<...>>> launch: launch configuration errors surface here.
#define TPR_CUDA_LAUNCHED(op, what) TPR_CUDA_TRY(cudaGetLastError(), (op), (what))

#define TPR_CUBLAS_TRY(call, op, what)                                                    \
  do {                                                                                    \
    cublasStatus_t tpr__bs = (call);                                                      \
    if (tpr__bs != CUBLAS_STATUS_SUCCESS) return tpr__cublas_fail(tpr__bs, (op), (what), __FILE__, __LINE__); \
  } while (0)

// Device memory from the backend's caching allocator. A block freed while
// kernels on ctx->stream still use it is only handed out again to work that
// is ordered after them on the same stream, so scratch may be freed right
// after the launches that use it.
tpr_status tpr__cuda_alloc(tpr_cuda_ctx *c, size_t bytes, void **ptr);
void tpr__cuda_free(tpr_cuda_ctx *c, void *ptr);

// Scratch that returns to the pool when it goes out of scope (error paths too).
struct tpr__cuda_scratch {
  tpr_cuda_ctx *c;
  void *p;
  explicit tpr__cuda_scratch(tpr_cuda_ctx *ctx) : c(ctx), p(nullptr) {}
  ~tpr__cuda_scratch() { if (p) tpr__cuda_free(c, p); }
  tpr__cuda_scratch(const tpr__cuda_scratch &) = delete;
  tpr__cuda_scratch &operator=(const tpr__cuda_scratch &) = delete;
  tpr_status alloc(size_t bytes) { return tpr__cuda_alloc(c, bytes, &p); }
};

// Copies bytes of device memory to host memory, waiting for the stream (so
// everything queued before is finished). The one way kernels read device
// values on the host: small things only (a scalar, per-expert counts).
tpr_status tpr__cuda_read(tpr_cuda_ctx *c, const char *op, void *host_dst, const void *dev_src, size_t bytes);

// Launch sizes: grid-stride loops over n items with `threads` per block.
static inline unsigned tpr__cuda_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

// Copies a (ndim, shape) block of esz-byte elements between strided device
// layouts (strides in elements); nothing is launched for an empty block.
// cuda_shared.cu.
tpr_status tpr__cuda_strided_copy(tpr_cuda_ctx *c, const char *op, void *dst, const int64_t *dst_stride,
                                  const void *src, const int64_t *src_stride, int ndim, const int64_t *shape,
                                  size_t esz);

// Row-major sgemm on the stream: C (M, N) = op(A) (M, K) @ op(B) (K, N) for
// `batch` matrices batch_stride apart (stride 0 broadcasts), where A and B
// are stored row-major with leading dims lda, ldb (their rows, before op) and
// C has leading dim ldc. The usual column-major swap: cuBLAS computes
// C^T = op(B)^T op(A)^T. Full f32 (no TF32). cuda_shared.cu.
tpr_status tpr__cuda_sgemm(tpr_cuda_ctx *c, const char *op, bool trans_a, bool trans_b, int64_t M, int64_t N,
                           int64_t K, const float *A, int64_t lda, int64_t stride_a, const float *B, int64_t ldb,
                           int64_t stride_b, float *C, int64_t ldc, int64_t stride_c, int64_t batch);

// How sgemm reads one stored (r, c) matrix with strides (s0, s1) whose
// logical operand is stored^T when trans is set -- the CPU matmul's rule (matmul/cpu.c): a
// row-major view is read as is, a column-major one as its transpose with the
// other flag; with neither unit stride it must be copied (copy = true; the
// row-major scratch then uses the defaults trans / max(c, 1)).
typedef struct tpr__cuda_operand {
  bool trans;
  int64_t ld;
  bool copy;
} tpr__cuda_operand;

static inline tpr__cuda_operand tpr__cuda_layout(int64_t r, int64_t c, int64_t s0, int64_t s1, bool trans) {
  const int64_t c1 = c > 1 ? c : 1, r1 = r > 1 ? r : 1;
  tpr__cuda_operand o = {trans, c1, false};
  if ((c <= 1 || s1 == 1) && (r <= 1 || s0 >= c1)) {  // row-major
    if (r > 1) o.ld = s0;
  } else if ((r <= 1 || s0 == 1) && (c <= 1 || s1 >= r1)) {  // column-major
    o.trans = !trans;
    o.ld = c > 1 ? s1 : r1;
  } else {
    o.copy = true;
  }
  return o;
}

// Element 0 of an i32/i64 tensor (a run-time scalar such as start or shard),
// read through an explicit copy for the host-side range check.
// cuda_shared.cu.
tpr_status tpr__cuda_read_index(tpr_cuda_ctx *c, const char *op, const tpr_tensor *t, int64_t *v);

// ---- device helpers ---------------------------------------------------------

// A strided tensor's geometry for device code (strides in elements).
typedef struct tpr__cuda_desc {
  int ndim;
  int64_t shape[TPR_MAX_DIMS];
  int64_t stride[TPR_MAX_DIMS];
} tpr__cuda_desc;

// The first nd dims of (shape, stride).
static inline tpr__cuda_desc tpr__cuda_make_desc(int nd, const int64_t *shape, const int64_t *stride) {
  tpr__cuda_desc d = {};
  d.ndim = nd;
  for (int i = 0; i < nd; i++) d.shape[i] = shape[i], d.stride[i] = stride[i];
  return d;
}

static inline tpr__cuda_desc tpr__cuda_tensor_desc(const tpr_tensor *t) {
  return tpr__cuda_make_desc(t->ndim, t->shape, t->stride);
}

// Element offset of the i-th element in row-major order of d's shape.
static __device__ __forceinline__ int64_t tpr__cuda_offset(const tpr__cuda_desc &d, int64_t i) {
  int64_t off = 0;
  for (int k = d.ndim - 1; k >= 0; k--) {
    const int64_t n = d.shape[k];
    off += (i % n) * d.stride[k];
    i /= n;
  }
  return off;
}

// Element off of an i32 (is64 false) or i64 index buffer.
static __device__ __forceinline__ int64_t tpr__cuda_load_index(const void *p, bool is64, int64_t off) {
  return is64 ? ((const int64_t *)p)[off] : (int64_t)((const int32_t *)p)[off];
}

// Calls f(E()) with E the unsigned integer type of esz bytes (elements moved
// as bytes serve every dtype); false for any other size.
template <typename F>
static inline bool tpr__cuda_by_size(size_t esz, F f) {
  switch (esz) {
    case 1: f(uint8_t()); return true;
    case 2: f(uint16_t()); return true;
    case 4: f(uint32_t()); return true;
    case 8: f(uint64_t()); return true;
    default: return false;
  }
}

#define TPR_CUDA_GRID_STRIDE(i, n) \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

// Reduces v over the block with op (commutative) in a fixed order: each
// warp's lanes by a xor butterfly, then thread 0 over the per-warp results in
// warp order. The order depends only on blockDim, so results are
// deterministic. blockDim.x must be a multiple of 32 (<= 1024); shm holds 32
// values; every thread of the block must call it and gets the result.
template <typename T, typename Op>
static __device__ T tpr__cuda_block_reduce(T v, Op op, T *shm) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  for (int s = 16; s > 0; s /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, s));
  __syncthreads();  // every thread has read shm[0] of a previous call
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    T r = shm[0];
    for (unsigned w = 1; w < nwarps; w++) r = op(r, shm[w]);
    shm[0] = r;
  }
  __syncthreads();
  return shm[0];
}

#endif
