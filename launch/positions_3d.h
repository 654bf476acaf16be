// `tpr forward --positions-3d FILE`: MRoPE positions (3, T) (rows temporal,
// height, width) from a .npy (np.save of an int32/int64 array of shape
// (3, T)) or a .safetensors file (the tensor "positions_3d", else its only
// tensor; I32/I64 of shape (3, T) or transformers' position_ids shape
// (3, 1, T)).
#ifndef TPR_LAUNCH_POSITIONS_3D_H
#define TPR_LAUNCH_POSITIONS_3D_H

#include <stdint.h>

#include "runtime/status.h"

// *out (3 * T) int32 row-major, malloc'ed. A shape other than (3, T) for the
// given T, a value outside [0, 2^31) or an unreadable file: TPR_ERR_FORMAT /
// TPR_ERR_INVALID_ARG / TPR_ERR_IO naming the file.
tpr_status tpr_positions_3d_read(const char *path, int64_t T, int32_t **out);

#endif
