// manifest.pb of a converted checkpoint: on first use the tiny MiniMax-M2
// fixture is converted (tp 1) into the scratch directory; each input then
// replaces its manifest.pb, and the directory is opened and loaded whole
// (the rank file is the real one, so a manifest that passes every check
// must still agree with its checksums).
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_common.h"
#include "shard/convert.h"
#include "shard/loader.h"
#include "shard/model_config.h"
#include "shard/shard_plan.h"

static tpr_shard_plan plan;
static char conv[600];

static void setup(void) {
  char src[512];
  snprintf(src, sizeof src, "%s/minimax_m2_tiny", fz_fixtures());
  tpr_model_config cfg;
  fz_require(tpr_model_config_load(src, &cfg) == TPR_OK, "fixture config loads");
  fz_require(tpr_shard_plan_build(&cfg, 1, 1, 1, 1, TPR_BF16, &plan) == TPR_OK, "fixture plan builds");
  snprintf(conv, sizeof conv, "%s/conv", fz_dir());
  if (tpr_convert(src, &plan, conv, TPR_LOAD_SOURCE_DTYPE, false, NULL) != TPR_OK) {
    fprintf(stderr, "fuzz_manifest: convert: %s\n", tpr_last_error());
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!conv[0]) setup();
  fz_write("conv/manifest.pb", data, size);
  tpr_loader *l = NULL;
  tpr_status rc = tpr_loader_open(conv, &plan, 0, &l);
  if (rc == TPR_OK) {
    tpr_rank_weights w;
    rc = tpr_loader_load_all(l, TPR_F32, &w);
    if (rc == TPR_OK) tpr_rank_weights_free(&w);
  }
  tpr_loader_close(l);
  if (getenv("TPR_FUZZ_VERBOSE"))  // seeds should load whole: check with the replay driver
    fprintf(stderr, "fuzz_manifest: %s\n", rc == TPR_OK ? "loaded" : tpr_last_error());
  return 0;
}
