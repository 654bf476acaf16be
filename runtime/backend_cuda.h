// The CUDA backend: device memory, copies and streams behind the backend
// vtable. Op kernels arrive op by op (*.cu beside their CPU twins); an op
// without one fails with TPR_ERR_UNSUPPORTED naming the op, never silently.
// Built when TPR_CUDA=AUTO finds nvcc (or TPR_CUDA=ON); otherwise every entry
// point reports that this build has no CUDA.
#ifndef TPR_BACKEND_CUDA_H
#define TPR_BACKEND_CUDA_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// CUDA devices visible to this process; 0 when the build has no CUDA, no
// driver is loaded, or no GPU is present (never an error).
int tpr_cuda_device_count(void);
// A backend on device `device`. No device -> TPR_ERR_UNSUPPORTED with a
// "no CUDA device" message.
tpr_status tpr_backend_cuda_new(int device, tpr_backend **out);

// --- raw memory helpers (the mpi collective backend stages device buffers
// through pinned host memory with these) ---------------------------------
// True when p points into CUDA device or managed memory; false for host
// memory (pageable or pinned), NULL, a build without CUDA, or a process with
// no device. Asks the driver, so it never creates a CUDA context: a process
// that has not used CUDA cannot hold device memory.
bool tpr_cuda_is_device_pointer(const void *p);
// Copies bytes between any mix of host and device memory (cudaMemcpyDefault);
// complete when it returns. No CUDA -> TPR_ERR_UNSUPPORTED.
tpr_status tpr_cuda_memcpy(void *dst, const void *src, size_t bytes);
// Waits for all work queued on the current device (on any stream), so that
// device memory written by kernels may be read by a copy.
tpr_status tpr_cuda_device_sync(void);
// Page-locked host memory (cudaMallocHost / cudaFreeHost). No CUDA ->
// TPR_ERR_UNSUPPORTED and *out = NULL; free(NULL) is a no-op.
tpr_status tpr_cuda_host_alloc(size_t bytes, void **out);
void tpr_cuda_host_free(void *p);

#ifdef __cplusplus
}
#endif

#endif
