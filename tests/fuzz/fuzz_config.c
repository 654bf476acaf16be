// config.json: parse + validate, then the sharding plan for one rank and for
// tp 2 (the planner sizes every tensor from what the config says).
#include "fuzz_common.h"
#include "shard/model_config.h"
#include "shard/shard_plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tpr_model_config c;
  if (tpr_model_config_parse((const char *)data, size, "fuzz config.json", &c) != TPR_OK) return 0;
  fz_require(tpr_model_config_validate(&c, "fuzz") == TPR_OK, "a parsed config validates");
  static const int tps[] = {1, 2};
  for (int i = 0; i < 2; i++) {
    tpr_shard_plan plan;
    if (tpr_shard_plan_build(&c, tps[i], 1, 1, 1, TPR_BF16, &plan) == TPR_OK) tpr_shard_plan_free(&plan);
  }
  return 0;
}
