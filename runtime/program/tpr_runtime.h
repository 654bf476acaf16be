// Public header of the runtime layer: tensors, dtypes, backends, ops,
// programs, errors and logging.
#ifndef TPR_RUNTIME_H
#define TPR_RUNTIME_H

#include "program.h"
#include "runtime/backend.h"
#include "runtime/dtype.h"
#include "runtime/log.h"
#include "runtime/ops.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

#endif
