// tpr make-checkpoint: a random Hugging Face checkpoint for a config, to
// measure `tpr load` and `tpr convert` without downloading a model.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "shard/checkpoint_gen.h"

int tpr_cmd_make_checkpoint(int argc, char **argv) {
  const char *config = NULL, *out = NULL, *dtype_name = "bf16";
  int64_t seed = 1, files = 4;
  bool json = false;
  const tpr_arg args[] = {
      {"config", TPR_ARG_STR, &config, "model config.json (required)"},
      {"out", TPR_ARG_STR, &out, "output directory, created if missing (required)"},
      {"seed", TPR_ARG_INT, &seed, "random seed (default 1)"},
      {"dtype", TPR_ARG_STR, &dtype_name,
       "weight dtype: bf16, f16, f32, or fp8 (projections and experts FP8-E4M3 in 128x128 blocks with "
       "weight_scale_inv, the rest bf16; default bf16)"},
      {"files", TPR_ARG_INT, &files, "number of .safetensors files (default 4)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object"},
  };
  const char *usage = "usage: tpr make-checkpoint --config FILE --out DIR [--seed S] [--dtype bf16] [--files N] [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  tpr_dtype dt;
  if (!config || !out) {
    fprintf(stderr, "tpr make-checkpoint: --config and --out are required\n%s\n", usage);
    return 2;
  }
  if (!strcmp(dtype_name, "fp8")) dt = TPR_F8E4M3;
  else if (!tpr_cli_load_dtype("make-checkpoint", dtype_name, &dt)) return 2;
  if (dt == TPR_LOAD_SOURCE_DTYPE) {
    fprintf(stderr, "tpr make-checkpoint: --dtype source means nothing here: there is no source\n");
    return 2;
  }
  if (files < 1 || files > 99999) {
    fprintf(stderr, "tpr make-checkpoint: --files %lld must be in [1, 99999]\n", (long long)files);
    return 2;
  }
  uint64_t bytes = 0;
  tpr_cli_progress(0);
  double t0 = tpr_cli_now();
  if (tpr_checkpoint_generate(config, out, (uint64_t)seed, dt, (int)files, &bytes) != TPR_OK) {
    fprintf(stderr, "tpr make-checkpoint: error: %s\n", tpr_last_error());
    return 1;
  }
  double s = tpr_cli_now() - t0;
  int n;
  uint64_t on_disk = tpr_cli_safetensors_bytes(out, &n);
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "command", "make-checkpoint");
    cJSON_AddStringToObject(j, "out", out);
    cJSON_AddStringToObject(j, "dtype", tpr_dtype_name(dt));
    cJSON_AddNumberToObject(j, "tensor_bytes", (double)bytes);
    cJSON_AddNumberToObject(j, "file_bytes", (double)on_disk);
    cJSON_AddNumberToObject(j, "files", n);
    cJSON_AddNumberToObject(j, "seconds", s);
    if (!tpr_cli_print_json(j)) return 1;
  } else {
    char b[32];
    printf("wrote %s of %s weights in %d files to %s (%.2f s)\n", tpr_cli_bytes(on_disk, b, sizeof b),
           tpr_dtype_name(dt), n, out, s);
  }
  return 0;
}
