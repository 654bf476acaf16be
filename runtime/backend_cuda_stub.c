// Stand-in for builds without the CUDA toolkit (TPR_CUDA=OFF or no nvcc):
// the same entry points, reporting that CUDA is not built in.
#ifndef TPR_HAVE_CUDA
#include "backend_cuda.h"

int tpr_cuda_device_count(void) { return 0; }

tpr_status tpr_backend_cuda_new(int device, tpr_backend **out) {
  *out = NULL;
  return TPR_FAIL(TPR_ERR_UNSUPPORTED, "no CUDA device: this build has no CUDA backend (configure with TPR_CUDA=ON)");
}
#endif
