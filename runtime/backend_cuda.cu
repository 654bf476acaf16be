// CUDA backend: memory and copies on one device, ordered on one stream.
#include <cuda.h>  // driver types only (CUpointer_attribute); libcuda is reached through the runtime
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

// The runtime's headers are C; give their declarations C linkage here.
extern "C" {
#include "backend_cuda.h"
}

typedef struct cuda_ctx {
  int device;
  cudaStream_t stream;
} cuda_ctx;

static tpr_status cuda_fail(cudaError_t err, const char *what) {
  return TPR_FAIL(TPR_ERR_UNSUPPORTED, "cuda: %s: %s", what, cudaGetErrorString(err));
}

#define CUDA_TRY(call, what)                           \
  do {                                                 \
    cudaError_t cuda__err = (call);                    \
    if (cuda__err != cudaSuccess) return cuda_fail(cuda__err, what); \
  } while (0)

static tpr_status cuda_alloc(void *ctx, size_t bytes, void **ptr) {
  cudaError_t err = cudaMalloc(ptr, bytes ? bytes : 1);
  if (err != cudaSuccess) return TPR_FAIL(TPR_ERR_OOM, "cuda: cannot allocate %zu bytes: %s", bytes, cudaGetErrorString(err));
  return TPR_OK;
}

static void cuda_free_ptr(void *ctx, void *ptr) { cudaFree(ptr); }

static tpr_status cuda_copy(cuda_ctx *c, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
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

static tpr_status cuda_memset(void *ctx, void *ptr, int value, size_t bytes) {
  CUDA_TRY(cudaMemsetAsync(ptr, value, bytes, ((cuda_ctx *)ctx)->stream), "memset");
  return TPR_OK;
}

static tpr_status cuda_sync(void *ctx) {
  CUDA_TRY(cudaStreamSynchronize(((cuda_ctx *)ctx)->stream), "stream sync");
  return TPR_OK;
}

static void cuda_destroy(void *ctx) {
  cuda_ctx *c = (cuda_ctx *)ctx;
  cudaStreamDestroy(c->stream);
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
  return vt;  // kernels[] stay NULL until their *.cu twins land
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
  cudaError_t err = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    free(c), free(b);
    return cuda_fail(err, "stream create");
  }
  b->vt = &cuda_vtable;
  b->ctx = c;
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
