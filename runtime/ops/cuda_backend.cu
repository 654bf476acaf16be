// CUDA backend: memory and copies on one device, ordered on one stream; op
// kernels in runtime/ops/<family>/*cuda.cu (cuda_kernels.h).
//
// Memory comes from a small caching allocator: cudaMalloc and cudaFree
// synchronise the whole device and cost tens of microseconds, and a program
// frees and reallocates the same sizes on every step. Freed blocks go to a
// free list per rounded size and are handed out again for that size only (no
// splitting or merging). Reuse is safe in stream order: all of this backend's
// work runs on its one stream, so the next user's work is queued after the
// last user's. Work on other streams (collectives) is completed before the
// calls that launch it return, and exec.c syncs the backend before a
// collective. When cudaMalloc runs out, the cached blocks are released and the
// allocation is tried once more; everything is released at destroy.
#include <cuda.h>  // driver types only (CUpointer_attribute); libcuda is reached through the runtime
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <new>
#include <mutex>
#include <unordered_map>
#include <vector>

// The runtime's headers are C; give their declarations C linkage here.
extern "C" {
#include "runtime/backend_cuda.h"
}
#include "cuda_kernels.h"

typedef tpr_cuda_ctx cuda_ctx;

static tpr_status cuda_fail(cudaError_t err, const char *what) {
  cudaGetLastError();  // clear a non-sticky error so later launch checks do not see it
  return TPR_FAIL(TPR_ERR_UNSUPPORTED, "cuda: %s: %s", what, cudaGetErrorString(err));
}

#define CUDA_TRY(call, what)                           \
  do {                                                 \
    cudaError_t cuda__err = (call);                    \
    if (cuda__err != cudaSuccess) return cuda_fail(cuda__err, what); \
  } while (0)

tpr_status tpr__cuda_fail(cudaError_t err, const char *op, const char *what, const char *file, int line) {
  cudaGetLastError();
  tpr_status s = TPR_ERR_INTERNAL;
  if (err == cudaErrorMemoryAllocation) s = TPR_ERR_OOM;
  if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorUnsupportedPtxVersion ||
      err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice)
    s = TPR_ERR_UNSUPPORTED;
  return tpr__fail(s, file, line, "%s (cuda): %s: %s", op, what, cudaGetErrorString(err));
}

tpr_status tpr__cublas_fail(cublasStatus_t st, const char *op, const char *what, const char *file, int line) {
  tpr_status s = st == CUBLAS_STATUS_ALLOC_FAILED        ? TPR_ERR_OOM
                 : st == CUBLAS_STATUS_ARCH_MISMATCH     ? TPR_ERR_UNSUPPORTED
                 : st == CUBLAS_STATUS_NOT_SUPPORTED     ? TPR_ERR_UNSUPPORTED
                                                         : TPR_ERR_INTERNAL;
  return tpr__fail(s, file, line, "%s (cuda): %s: %s", op, what, cublasGetStatusString(st));
}

// ---- caching allocator -------------------------------------------------

struct tpr_cuda_pool {
  std::mutex mu;  // tensors may be freed from another thread than the one running kernels
  std::unordered_map<void *, size_t> live;            // block -> rounded size
  std::map<size_t, std::vector<void *>> free_blocks;  // rounded size -> cached blocks
};

// Small blocks round to 512 bytes (cudaMalloc's own alignment), large ones to
// 2 MiB (the driver's page size), so repeated shapes land in one list and
// the rounding wastes little.
static size_t pool_round(size_t bytes) {
  const size_t small = 512, large = (size_t)2 << 20;
  if (bytes <= small) return small;
  if (bytes <= ((size_t)1 << 20)) return (bytes + small - 1) / small * small;
  return (bytes + large - 1) / large * large;
}

// Returns the cached blocks to the driver (cudaFree waits for the device).
static void pool_release_cached(tpr_cuda_pool *p) {
  for (auto &kv : p->free_blocks)
    for (void *b : kv.second) cudaFree(b);
  p->free_blocks.clear();
}

tpr_status tpr__cuda_alloc(tpr_cuda_ctx *c, size_t bytes, void **ptr) {
  *ptr = nullptr;
  tpr_cuda_pool *p = c->pool;
  const size_t size = pool_round(bytes);
  std::lock_guard<std::mutex> lock(p->mu);
  auto it = p->free_blocks.find(size);
  if (it != p->free_blocks.end() && !it->second.empty()) {
    *ptr = it->second.back();
    it->second.pop_back();
  } else {
    cudaError_t err = cudaSetDevice(c->device);
    if (err == cudaSuccess) err = cudaMalloc(ptr, size);
    if (err == cudaErrorMemoryAllocation) {  // give the cache back and try once more
      cudaGetLastError();
      pool_release_cached(p);
      err = cudaMalloc(ptr, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      *ptr = nullptr;
      return TPR_FAIL(err == cudaErrorMemoryAllocation ? TPR_ERR_OOM : TPR_ERR_INTERNAL,
                      "cuda: cannot allocate %zu bytes: %s", bytes, cudaGetErrorString(err));
    }
  }
  try {
    p->live[*ptr] = size;
  } catch (const std::bad_alloc &) {  // never let an exception cross into C
    cudaFree(*ptr);
    *ptr = nullptr;
    return TPR_FAIL(TPR_ERR_OOM, "cuda: allocator bookkeeping for %zu bytes", bytes);
  }
  return TPR_OK;
}

void tpr__cuda_free(tpr_cuda_ctx *c, void *ptr) {
  if (!ptr) return;
  tpr_cuda_pool *p = c->pool;
  std::lock_guard<std::mutex> lock(p->mu);
  auto it = p->live.find(ptr);
  if (it == p->live.end()) return;  // not ours (or freed twice): never hand it out
  const size_t size = it->second;
  p->live.erase(it);
  try {
    p->free_blocks[size].push_back(ptr);
  } catch (const std::bad_alloc &) {
    cudaFree(ptr);  // cannot cache it: give it back (cudaFree waits for the device)
  }
}

static tpr_status cuda_alloc(void *ctx, size_t bytes, void **ptr) {
  return tpr__cuda_alloc((cuda_ctx *)ctx, bytes, ptr);
}

static void cuda_free_ptr(void *ctx, void *ptr) { tpr__cuda_free((cuda_ctx *)ctx, ptr); }

// ---- copies --------------------------------------------------------------

static tpr_status cuda_copy(cuda_ctx *c, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return TPR_OK;
  CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, c->stream), "memcpy");
  // Host copies return only when the host buffer may be reused or read.
  if (kind != cudaMemcpyDeviceToDevice) CUDA_TRY(cudaStreamSynchronize(c->stream), "stream sync");
  return TPR_OK;
}

static tpr_status cuda_from_host(void *ctx, void *dst, const void *src, size_t bytes) {
  return cuda_copy((cuda_ctx *)ctx, dst, src, bytes, cudaMemcpyHostToDevice);
}
static tpr_status cuda_to_host(void *ctx, void *dst, const void *src, size_t bytes) {
  return cuda_copy((cuda_ctx *)ctx, dst, src, bytes, cudaMemcpyDeviceToHost);
}
static tpr_status cuda_device_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  return cuda_copy((cuda_ctx *)ctx, dst, src, bytes, cudaMemcpyDeviceToDevice);
}

tpr_status tpr__cuda_read(tpr_cuda_ctx *c, const char *op, void *host_dst, const void *dev_src, size_t bytes) {
  if (bytes == 0) return TPR_OK;
  if (bytes > c->stage_bytes) {  // grow the pinned staging buffer
    if (c->stage) cudaFreeHost(c->stage);
    c->stage = nullptr;
    c->stage_bytes = 0;
    size_t want = bytes < 4096 ? 4096 : bytes;
    TPR_CUDA_TRY(cudaMallocHost(&c->stage, want), op, "pinned staging buffer");
    c->stage_bytes = want;
  }
  TPR_CUDA_TRY(cudaMemcpyAsync(c->stage, dev_src, bytes, cudaMemcpyDeviceToHost, c->stream), op, "read back");
  TPR_CUDA_TRY(cudaStreamSynchronize(c->stream), op, "stream sync");
  memcpy(host_dst, c->stage, bytes);
  return TPR_OK;
}

static tpr_status cuda_memset(void *ctx, void *ptr, int value, size_t bytes) {
  if (bytes == 0) return TPR_OK;
  CUDA_TRY(cudaMemsetAsync(ptr, value, bytes, ((cuda_ctx *)ctx)->stream), "memset");
  return TPR_OK;
}

static tpr_status cuda_sync(void *ctx) {
  CUDA_TRY(cudaStreamSynchronize(((cuda_ctx *)ctx)->stream), "stream sync");
  return TPR_OK;
}

static void cuda_destroy(void *ctx) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  cudaSetDevice(c->device);
  if (c->stream) cudaStreamSynchronize(c->stream);
  if (c->blas) cublasDestroy(c->blas);
  if (c->pool) {
    // Blocks still live belong to tensors that outlive their backend (a
    // caller's bug); the memory goes back with the backend either way.
    for (auto &kv : c->pool->live) cudaFree(kv.first);
    pool_release_cached(c->pool);
    delete c->pool;
  }
  if (c->stage) cudaFreeHost(c->stage);
  if (c->stream) cudaStreamDestroy(c->stream);
  cudaGetLastError();
  free(c);
}

static tpr_backend_vtable make_vtable(void) {
  tpr_backend_vtable vt = {};
  vt.name = "cuda";
  vt.host_addressable = false;
  vt.alloc = cuda_alloc;
  vt.free = cuda_free_ptr;
  vt.copy_from_host = cuda_from_host;
  vt.copy_to_host = cuda_to_host;
  vt.copy_device = cuda_device_copy;
  vt.memset = cuda_memset;
  vt.sync = cuda_sync;
  vt.destroy = cuda_destroy;
  // View and collective ops never reach a kernel; op kinds without a CUDA
  // kernel stay NULL (tpr_op_run reports TPR_ERR_UNSUPPORTED naming the op).
  // Each kernel file lists its kernels (registry.h).
  static const tpr__kernel_def *const lists[] = {
      tpr__matmul_cuda, tpr__elementwise_cuda, tpr__norm_cuda, tpr__softmax_cuda, tpr__gather_cuda, tpr__copy_cuda,
      tpr__rope_cuda, tpr__attention_cuda, tpr__router_cuda, tpr__moe_cuda, tpr__paged_attention_cuda,
      tpr__lightning_cuda, tpr__sparse_attention_cuda,
  };
  for (const tpr__kernel_def *const *l = lists; l < lists + sizeof lists / sizeof *lists; l++)
    for (const tpr__kernel_def *k = *l; k->fn; k++) vt.kernels[k->op] = k->fn;
  return vt;
}

static const tpr_backend_vtable cuda_vtable = make_vtable();

extern "C" int tpr_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

extern "C" tpr_status tpr_backend_cuda_new(int device, tpr_backend **out) {
  *out = NULL;
  int n = tpr_cuda_device_count();
  if (n == 0) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "no CUDA device: this machine has no GPU or no driver");
  if (device < 0 || device >= n)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "CUDA device %d does not exist (%d visible)", device, n);
  CUDA_TRY(cudaSetDevice(device), "set device");
  cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
  tpr_backend *b = (tpr_backend *)calloc(1, sizeof *b);
  if (!c || !b) {
    free(c), free(b);
    return TPR_FAIL(TPR_ERR_OOM, "cuda backend");
  }
  c->device = device;
  b->vt = &cuda_vtable;
  b->ctx = c;
  c->pool = new (std::nothrow) tpr_cuda_pool;
  if (!c->pool) {
    tpr_backend_free(b);
    return TPR_FAIL(TPR_ERR_OOM, "cuda backend: allocator");
  }
  cudaError_t err = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    tpr_backend_free(b);  // destroy copes with a half-built context
    return cuda_fail(err, "stream create");
  }
  cublasStatus_t st = cublasCreate(&c->blas);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(c->blas, c->stream);
  // Plain f32 GEMMs: TF32 tensor cores would round the inputs to 10 mantissa
  // bits and break agreement with the CPU backend.
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
  if (st != CUBLAS_STATUS_SUCCESS) {
    tpr_backend_free(b);
    return TPR_FAIL(st == CUBLAS_STATUS_ALLOC_FAILED ? TPR_ERR_OOM : TPR_ERR_UNSUPPORTED, "cuda: cuBLAS handle: %s",
                    cublasGetStatusString(st));
  }
  *out = b;
  return TPR_OK;
}

// --- raw memory helpers -------------------------------------------------

// cuPointerGetAttribute, fetched through the runtime so that libtpr needs no
// link to libcuda. The driver query is used instead of
// cudaPointerGetAttributes because it never creates a context: under mpirun
// a CPU-only run on a GPU node would otherwise put a context on device 0 from
// every rank at its first collective.
typedef CUresult(CUDAAPI *pointer_attr_fn)(void *data, CUpointer_attribute attribute, CUdeviceptr ptr);

static pointer_attr_fn pointer_attr(void) {
  // C++ function-local statics are initialised once, thread-safely.
  static const pointer_attr_fn fn = []() -> pointer_attr_fn {
    if (tpr_cuda_device_count() == 0) return nullptr;
    void *p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &p, 12000, cudaEnableDefault, &found);
#else
    cudaError_t err = cudaGetDriverEntryPoint("cuPointerGetAttribute", &p, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return (pointer_attr_fn)p;
  }();
  return fn;
}

extern "C" bool tpr_cuda_is_device_pointer(const void *p) {
  if (!p) return false;
  pointer_attr_fn fn = pointer_attr();
  if (!fn) return false;  // no device, or no driver query: nothing is device memory
  unsigned int type = 0;
  // Host memory the driver does not know gives CUDA_ERROR_INVALID_VALUE, and
  // a driver nobody initialised CUDA_ERROR_NOT_INITIALIZED: both are host.
  if (fn(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS) return false;
  return type == CU_MEMORYTYPE_DEVICE;  // cudaMalloc'd and managed memory; pinned host memory is CU_MEMORYTYPE_HOST
}

extern "C" tpr_status tpr_cuda_memcpy(void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return TPR_OK;
  CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "memcpy");
  return TPR_OK;
}

extern "C" tpr_status tpr_cuda_device_sync(void) {
  CUDA_TRY(cudaDeviceSynchronize(), "device sync");
  return TPR_OK;
}

extern "C" tpr_status tpr_cuda_host_alloc(size_t bytes, void **out) {
  *out = nullptr;
  cudaError_t err = cudaMallocHost(out, bytes ? bytes : 1);
  if (err != cudaSuccess) {
    *out = nullptr;
    return TPR_FAIL(TPR_ERR_OOM, "cuda: cannot allocate %zu bytes of pinned host memory: %s", bytes,
                    cudaGetErrorString(err));
  }
  return TPR_OK;
}

extern "C" void tpr_cuda_host_free(void *p) {
  if (p) cudaFreeHost(p);
}
