// tpr forward: the f32 logits of every position of one token sequence,
// written by rank 0 as a safetensors file with the key "logits" (T, vocab).
// The golden tests compare them with transformers' logits.
#include <stdio.h>
#include <stdlib.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "launch/model_cli.h"
#include "shard/safetensors.h"

int tpr_cmd_forward(int argc, char **argv) {
  const char *model = NULL, *tokens_text = NULL, *out = NULL;
  int64_t tp = 0;
  bool json = false;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  tpr_model_debug dbg = TPR_MODEL_DEBUG_DEFAULT;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory (Hugging Face or converted)"},
      {"tokens", TPR_ARG_STR, &tokens_text, "token ids, comma-separated: 1,2,3"},
      {"out", TPR_ARG_STR, &out, "safetensors file for the logits (T, vocab) f32, key \"logits\""},
      {"tp", TPR_ARG_INT, &tp, "tensor-parallel degree (default and only value: the world size)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object (rank 0)"},
      TPR_WORLD_ARGS(wo),
      TPR_MODEL_DEBUG_ARGS(dbg),
  };
  const char *usage = "usage: [mpirun -np N] tpr forward --model DIR --tokens 1,2,3 --out FILE [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!model || !tokens_text || !out) {
    fprintf(stderr, "tpr forward: --model, --tokens and --out are required\n%s\n", usage);
    return 2;
  }
  int32_t *tokens = NULL;
  int64_t T = 0;
  if (tpr_cli_token_list("--tokens", tokens_text, &tokens, &T) != TPR_OK) {
    fprintf(stderr, "tpr forward: %s\n", tpr_last_error());
    return 2;
  }
  tpr_world w;
  tpr_m2_session *s = NULL;
  if (tpr_world_init(&argc, &argv, &wo, &w) != TPR_OK ||
      tpr_cli_open_model(&w, model, tp, T, &dbg, &s) != TPR_OK) {
    free(tokens);
    return tpr_world_fail(&w, "forward");
  }
  int64_t V = tpr_m2_session_config(s)->vocab_size;
  float *logits = malloc((size_t)(T * V) * sizeof *logits);
  double t0 = tpr_cli_now();
  tpr_status rc = logits ? tpr_m2_session_forward(s, tokens, T, 0, logits) : TPR_FAIL(TPR_ERR_OOM, "logits");
  double secs = tpr_cli_now() - t0;
  if (rc == TPR_OK && w.rank == 0) {
    tpr_st_write_entry e = {.name = "logits", .dtype = TPR_F32, .ndim = 2, .shape = (const int64_t[]){T, V},
                            .data = logits};
    rc = tpr_st_write(out, &e, 1, NULL);
  }
  if (rc == TPR_OK && w.rank == 0) {
    if (json)
      printf("{\"command\":\"forward\",\"world_size\":%d,\"tp\":%d,\"tokens\":%lld,\"vocab\":%lld,\"out\":\"%s\","
             "\"load_s\":%.4f,\"forward_s\":%.4f,\"program_hash\":\"%016llx\"}\n",
             w.size, w.size, (long long)T, (long long)V, out, tpr_m2_session_stats(s)->load_s, secs,
             (unsigned long long)tpr_m2_session_stats(s)->program_hash);
    else
      printf("tpr forward: %lld tokens, tp %d: logits (%lld, %lld) f32 -> %s (load %.3f s, forward %.3f s)\n",
             (long long)T, w.size, (long long)T, (long long)V, out, tpr_m2_session_stats(s)->load_s, secs);
  }
  free(tokens);
  free(logits);
  if (rc != TPR_OK) {
    tpr_m2_session_close(s);
    return tpr_world_fail(&w, "forward");
  }
  tpr_m2_session_close(s);
  tpr_world_finish(&w);
  return 0;
}
