// tpr forward: the f32 logits of every position of a token sequence (one per
// data-parallel replica when --tokens is given dp times), written by rank 0
// as a safetensors file: "logits" (T, vocab), "logits.R" for replica R > 0.
// The golden tests compare them with transformers' logits. MRoPE families
// (qwen3_vl_moe) take the rope's 3-D positions from --positions-3d; without
// it every axis is the token's index (text).
#include <stdio.h>
#include <stdlib.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "launch/model_cli.h"
#include "launch/positions_3d.h"
#include "shard/safetensors.h"

// Rank 0 gathers replica r's logits (T, V) from world rank r*tp, its tp rank 0
// (dense coordinates put tp fastest).
static tpr_status gather_replicas(tpr_world *w, const tpr_shard_plan *pl, float *logits, size_t n) {
  for (int r = 1; r < pl->dp; r++) {
    int src = r * pl->tp;
    if (w->rank == 0) TPR_CHECK(tpr_comm_recv(w->host, logits + (size_t)r * n, n, TPR_F32, src));
    if (w->rank == src) TPR_CHECK(tpr_comm_send(w->host, logits + (size_t)r * n, n, TPR_F32, 0));
  }
  return TPR_OK;
}

static tpr_status write_logits(const char *out, const float *logits, int64_t replicas, int64_t T, int64_t V) {
  tpr_st_write_entry e[TPR_ARG_LIST_MAX];
  char names[TPR_ARG_LIST_MAX][32];
  const int64_t shape[2] = {T, V};  // outlives the loop: the entries point at it
  for (int64_t r = 0; r < replicas; r++) {
    snprintf(names[r], sizeof names[r], r ? "logits.%lld" : "logits", (long long)r);
    e[r] = (tpr_st_write_entry){.name = names[r], .dtype = TPR_F32, .ndim = 2, .shape = shape,
                                .data = logits + r * T * V};
  }
  return tpr_st_write(out, e, (size_t)replicas, NULL);
}

int tpr_cmd_forward(int argc, char **argv) {
  const char *model = NULL, *out = NULL, *pos3_path = NULL;
  tpr_arg_list lists = {0};
  bool json = false;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  tpr_model_debug dbg = TPR_MODEL_DEBUG_DEFAULT;
  tpr_model_mesh mesh = TPR_MODEL_MESH_DEFAULT;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory (Hugging Face or converted)"},
      {"tokens", TPR_ARG_STR_LIST, &lists,
       "token ids, comma-separated: 1,2,3; give it dp times (same length) for one list per data-parallel replica"},
      {"out", TPR_ARG_STR, &out,
       "safetensors file for the logits (T, vocab) f32: key \"logits\", and \"logits.R\" for replica R > 0"},
      {"positions-3d", TPR_ARG_STR, &pos3_path,
       "MRoPE models: .npy or .safetensors of int (3, T) rope positions (temporal, height, width); default: every "
       "axis = the token index"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object (rank 0)"},
      TPR_MODEL_MESH_ARGS(mesh),
      TPR_WORLD_ARGS(wo),
      TPR_MODEL_DEBUG_ARGS(dbg),
  };
  const char *usage = "usage: [mpirun -np N] tpr forward --model DIR --tokens 1,2,3 [--tokens ...] --out FILE\n"
                      "       [--tp T --dp D --ep E --etp F] [--moe-dispatch alltoall|allreduce] "
                      "[--capacity-factor F [--reroute-dropped]] [--positions-3d FILE] [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!model || lists.n == 0 || !out) {
    fprintf(stderr, "tpr forward: --model, --tokens and --out are required\n%s\n", usage);
    return 2;
  }
  int32_t *tokens[TPR_ARG_LIST_MAX] = {0};
  int64_t T = 0;
  for (int i = 0; i < lists.n; i++) {
    int64_t n = 0;
    tpr_status rc = tpr_cli_token_list("--tokens", lists.items[i], &tokens[i], &n);
    if (rc == TPR_OK && i > 0 && n != T)
      rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "--tokens: list %d has %lld ids, list 1 has %lld; replicas run one "
                    "program, so every list needs the same length", i + 1, (long long)n, (long long)T);
    T = n;
    if (rc != TPR_OK) {
      fprintf(stderr, "tpr forward: %s\n", tpr_last_error());
      for (int j = 0; j <= i; j++) free(tokens[j]);
      return 2;
    }
  }
  int32_t *pos3 = NULL;
  if (pos3_path && tpr_positions_3d_read(pos3_path, T, &pos3) != TPR_OK) {
    fprintf(stderr, "tpr forward: %s\n", tpr_last_error());
    for (int j = 0; j < lists.n; j++) free(tokens[j]);
    return 2;
  }
  tpr_world w;
  tpr_session *s = NULL;
  tpr_status rc = tpr_world_init(&argc, &argv, &wo, &w);
  if (rc == TPR_OK) rc = tpr_cli_open_model(&w, model, &mesh, T, &dbg, &s);
  const tpr_shard_plan *pl = rc == TPR_OK ? tpr_session_plan(s) : NULL;
  if (rc == TPR_OK && lists.n != 1 && lists.n != pl->dp)
    rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "--tokens given %d times: give one list, or one per replica (dp = %d)",
                  lists.n, pl->dp);
  if (rc != TPR_OK) {
    for (int i = 0; i < lists.n; i++) free(tokens[i]);
    free(pos3);
    tpr_session_close(s);
    return tpr_world_fail(&w, "forward");
  }
  int64_t V = tpr_session_config(s)->vocab_size, replicas = lists.n, replica = w.rank / pl->tp;
  float *logits = malloc((size_t)(replicas * T * V) * sizeof *logits);
  double t0 = tpr_cli_now();
  rc = logits ? tpr_session_forward_3d(s, tokens[replicas > 1 ? replica : 0], T, 0, pos3,
                                       logits + (replicas > 1 ? replica : 0) * T * V)
              : TPR_FAIL(TPR_ERR_OOM, "logits");
  double secs = tpr_cli_now() - t0;
  if (rc == TPR_OK && replicas > 1) rc = gather_replicas(&w, pl, logits, (size_t)(T * V));
  if (rc == TPR_OK && w.rank == 0) rc = write_logits(out, logits, replicas, T, V);
  if (rc == TPR_OK && w.rank == 0) {
    if (json)
      printf("{\"command\":\"forward\",\"world_size\":%d,\"tp\":%d,\"dp\":%d,\"ep\":%d,\"etp\":%d,"
             "\"moe_dispatch\":\"%s\",\"replicas\":%lld,\"tokens\":%lld,\"vocab\":%lld,\"out\":\"%s\","
             "\"load_s\":%.4f,\"forward_s\":%.4f,\"program_hash\":\"%016llx\",\"weight_dtype\":\"%s\","
             "\"weight_bytes\":%llu,\"activation_dtype\":\"%s\"}\n",
             w.size, pl->tp, pl->dp, pl->ep, pl->etp, mesh.moe_dispatch, (long long)replicas, (long long)T,
             (long long)V, out, tpr_session_stats(s)->load_s, secs,
             (unsigned long long)tpr_session_stats(s)->program_hash,
             tpr_dtype_name(tpr_session_stats(s)->matrix_dtype),
             (unsigned long long)tpr_session_stats(s)->weight_bytes,
             tpr_session_stats(s)->bf16_activations ? "bf16" : "f32");
    else
      printf("tpr forward: %lld tokens x %lld replicas, tp %d dp %d ep %d etp %d, %s weights (%.2f MiB per rank): "
             "logits (%lld, %lld) f32 -> %s (load %.3f s, forward %.3f s)\n",
             (long long)T, (long long)replicas, pl->tp, pl->dp, pl->ep, pl->etp,
             tpr_dtype_name(tpr_session_stats(s)->matrix_dtype), tpr_session_stats(s)->weight_bytes / 1048576.0,
             (long long)T, (long long)V, out, tpr_session_stats(s)->load_s, secs);
  }
  for (int i = 0; i < lists.n; i++) free(tokens[i]);
  free(logits);
  free(pos3);
  if (rc != TPR_OK) {
    tpr_session_close(s);
    return tpr_world_fail(&w, "forward");
  }
  tpr_session_close(s);
  tpr_world_finish(&w);
  return 0;
}
