// Hardware descriptions of the step-time model: the documented presets
// (docs/scale.md, "tpr scale predict", cites their sources) and the calibrated
// description of this machine, stored as DIR/model.json.
#ifndef TPR_SCALE_HARDWARE_H
#define TPR_SCALE_HARDWARE_H

#include "scale/stepmodel.h"

// gpu: "h100"; network: "ib-400g" | "ib-200g" | "roce-100g" (NULL: ib-400g).
// Unknown names are TPR_ERR_INVALID_ARG listing the known ones.
tpr_status tpr_scale_hw_preset(const char *gpu, const char *network, tpr_scale_hw *out);

tpr_status tpr_scale_hw_write(const char *path, const tpr_scale_hw *hw);
tpr_status tpr_scale_hw_read(const char *path, tpr_scale_hw *out);

#endif
