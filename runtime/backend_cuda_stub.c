// Stand-in for builds without the CUDA toolkit (TPR_CUDA=OFF or no nvcc):
// the same entry points, reporting that CUDA is not built in.
#ifndef TPR_HAVE_CUDA
#include "backend_cuda.h"

int tpr_cuda_device_count(void) { return 0; }

tpr_status tpr_backend_cuda_new(int device, tpr_backend **out) {
  *out = NULL;
  return TPR_FAIL(TPR_ERR_UNSUPPORTED, "no CUDA device: this build has no CUDA backend (configure with TPR_CUDA=ON)");
}

bool tpr_cuda_is_device_pointer(const void *p) { return false; }

tpr_status tpr_cuda_memcpy(void *dst, const void *src, size_t bytes) {
  return TPR_FAIL(TPR_ERR_UNSUPPORTED, "cuda memcpy: this build has no CUDA backend");
}

tpr_status tpr_cuda_device_sync(void) {
  return TPR_FAIL(TPR_ERR_UNSUPPORTED, "cuda sync: this build has no CUDA backend");
}

tpr_status tpr_cuda_host_alloc(size_t bytes, void **out) {
  *out = NULL;
  return TPR_FAIL(TPR_ERR_UNSUPPORTED, "pinned host memory: this build has no CUDA backend");
}

void tpr_cuda_host_free(void *p) {}
#endif
