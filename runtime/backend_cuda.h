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

#ifdef __cplusplus
}
#endif

#endif
