// Public header of the runtime layer: tensors, dtypes, backends, ops,
// programs, errors and logging.
#ifndef TPR_RUNTIME_H
#define TPR_RUNTIME_H

#include "backend.h"
#include "dtype.h"
#include "log.h"
#include "ops/ops.h"
#include "program.h"
#include "status.h"
#include "tensor.h"

#endif
