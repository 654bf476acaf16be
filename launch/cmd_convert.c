// tpr convert: per-rank shard files and manifest.pb for one mesh (see
// shard/convert.h). One process writes every rank's file, one rank's
// buffers in memory at a time; no mpirun needed.
#include <cjson/cJSON.h>
#include <stdio.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "launch/world.h"
#include "shard/convert.h"

int tpr_cmd_convert(int argc, char **argv) {
  const char *model = NULL, *out = NULL, *dtype_name = "source";
  tpr_cli_mesh m = {.ep = 1, .etp = 1, .dp = 1};
  bool json = false, force = false;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "Hugging Face checkpoint directory (required)"},
      {"out", TPR_ARG_STR, &out, "output directory; must not exist unless --force (required)"},
      {"tp", TPR_ARG_INT, &m.tp, "tensor-parallel degree (required)"},
      {"ep", TPR_ARG_INT, &m.ep, "expert-parallel degree (default 1)"},
      {"etp", TPR_ARG_INT, &m.etp, "expert tensor-parallel degree (default 1)"},
      {"dp", TPR_ARG_INT, &m.dp, "data-parallel degree; world = dp*tp (default 1)"},
      {"dtype", TPR_ARG_STR, &dtype_name, "stored dtype: source (each tensor's own, default), bf16, f16, f32"},
      {"force", TPR_ARG_FLAG, &force, "replace an existing output directory"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object"},
  };
  const char *usage =
      "usage: tpr convert --model DIR --tp T [--ep E --etp F --dp D] --out DIR2 [--dtype source] [--force] [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!model || !out) {
    fprintf(stderr, "tpr convert: --model and --out are required\n%s\n", usage);
    return 2;
  }
  if (tpr_world_launched()) {  // every rank would write the whole directory and race to publish it
    fprintf(stderr, "tpr convert: run it as one process, without mpirun (it writes every rank's file)\n");
    return 2;
  }
  tpr_dtype dt;
  if (!tpr_cli_mesh_ok("convert", &m, usage) || !tpr_cli_load_dtype("convert", dtype_name, &dt)) return 2;
  tpr_shard_plan plan = {0};
  tpr_convert_stats st = {0};
  tpr_cli_progress(0);
  double t0 = tpr_cli_now();
  tpr_status rc = tpr_cli_plan(model, &m, &plan);
  if (rc == TPR_OK) rc = tpr_convert(model, &plan, out, dt, force, &st);
  double s = tpr_cli_now() - t0;
  if (rc != TPR_OK) {
    fprintf(stderr, "tpr convert: error: %s\n", tpr_last_error());
    tpr_shard_plan_free(&plan);
    return 1;
  }
  int ok = 1;
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "command", "convert");
    cJSON_AddStringToObject(j, "model", model);
    cJSON_AddStringToObject(j, "out", out);
    cJSON_AddStringToObject(j, "dtype", dt == TPR_LOAD_SOURCE_DTYPE ? "source" : tpr_dtype_name(dt));
    const struct {
      const char *k;
      double v;
    } nums[] = {{"world_size", plan.world},           {"tp", plan.tp},
                {"ep", plan.ep},                      {"etp", plan.etp},
                {"dp", plan.dp},                      {"files", st.files},
                {"bytes_written", (double)st.bytes_written}, {"bytes_read", (double)st.bytes_read},
                {"seconds", s}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) cJSON_AddNumberToObject(j, nums[i].k, nums[i].v);
    ok = tpr_cli_print_json(j);
  } else {
    char b1[32], b2[32];
    printf("converted %s for tp=%d ep=%d etp=%d dp=%d: %d rank files + manifest.pb, %s written (%s read) in %.2f s "
           "-> %s\n",
           model, plan.tp, plan.ep, plan.etp, plan.dp, st.files, tpr_cli_bytes(st.bytes_written, b1, sizeof b1),
           tpr_cli_bytes(st.bytes_read, b2, sizeof b2), s, out);
  }
  tpr_shard_plan_free(&plan);
  return ok ? 0 : 1;
}
