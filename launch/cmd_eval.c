// tpr eval: the mean next-token cross-entropy of a checkpoint over a token
// file, cut into the windows `tpr train` reads (window w: inputs
// [w*T, w*T + T), targets shifted by one), every window starting a fresh
// sequence. The validation loss of a training run (scripts/demo_model/),
// and the check that a committed model still scores what was recorded.
//
// Under mpirun each data-parallel replica takes windows r, r + dp, ...;
// a replica with none left in the last round runs window 0 again and drops
// it, because every rank must make the same forward calls (MoE exchanges
// span the replicas). Sums are accumulated in double in window order on
// each replica and added over replicas at the end, so the result does not
// depend on the thread count; it can differ in the last bits between
// meshes (the logits do).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "launch/model_cli.h"
#include "train/npy.h"

// -log softmax(logits)[target] of one position, in double.
static double token_ce(const float *logits, int64_t V, int32_t target) {
  double mx = logits[0];
  for (int64_t v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
  double sum = 0;
  for (int64_t v = 0; v < V; v++) sum += exp((double)logits[v] - mx);
  return mx + log(sum) - (double)logits[target];
}

typedef struct eval_result {
  int64_t windows, tokens;
  double ce_sum, seconds;
} eval_result;

static tpr_status eval_windows(tpr_world *w, tpr_session *s, const tpr_npy *data, int64_t T, int64_t nw,
                               eval_result *res) {
  const tpr_shard_plan *pl = tpr_session_plan(s);
  int64_t V = tpr_session_config(s)->vocab_size, dp = pl->dp, replica = w->rank / pl->tp;
  int32_t *buf = malloc((size_t)(T + 1) * sizeof *buf);
  float *logits = malloc((size_t)(T * V) * sizeof *logits);
  tpr_status rc = buf && logits ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "eval: logits (%lld, %lld)", (long long)T,
                                                    (long long)V);
  double sums[2] = {0, 0};  // cross-entropy sum, windows counted (this replica)
  double t0 = tpr_cli_now();
  for (int64_t round = 0; rc == TPR_OK && round * dp < nw; round++) {
    int64_t win = round * dp + replica;
    bool mine = win < nw;
    rc = tpr_npy_read_i32(data, (mine ? win : 0) * T, T + 1, buf);
    if (rc == TPR_OK) rc = tpr_session_forward(s, buf, T, 0, logits);  // (T, V)
    if (rc != TPR_OK || !mine) continue;
    double ce = 0;
    for (int64_t t = 0; t < T; t++) ce += token_ce(logits + t * V, V, buf[t + 1]);
    sums[0] += ce, sums[1] += 1;
  }
  rc = tpr_comm_agree(w->host, rc);
  // Each replica's sums once (its tp rank 0's), added in rank order: the
  // doubles travel as their bits (no f64 reduction in tpr_comm).
  int64_t mine[2], *all = rc == TPR_OK ? malloc((size_t)(2 * w->size) * sizeof *all) : NULL;
  memcpy(mine, sums, sizeof mine);
  if (rc == TPR_OK && !all) rc = TPR_FAIL(TPR_ERR_OOM, "eval: gather of %d ranks' sums", w->size);
  if (rc == TPR_OK) rc = tpr_comm_all_gather(w->host, mine, all, 2, TPR_I64);
  sums[0] = sums[1] = 0;
  for (int r = 0; rc == TPR_OK && r < w->size; r += pl->tp) {
    double v[2];
    memcpy(v, all + 2 * r, sizeof v);
    sums[0] += v[0], sums[1] += v[1];
  }
  free(all);
  *res = (eval_result){.windows = (int64_t)sums[1], .tokens = (int64_t)sums[1] * T, .ce_sum = sums[0],
                       .seconds = tpr_cli_now() - t0};
  if (rc == TPR_OK && res->windows != nw)
    rc = TPR_FAIL(TPR_ERR_INTERNAL, "eval: %lld windows scored, expected %lld", (long long)res->windows,
                  (long long)nw);
  free(buf), free(logits);
  return rc;
}

int tpr_cmd_eval(int argc, char **argv) {
  const char *model = NULL, *data = NULL;
  int64_t T = 256, max_windows = 0;
  bool json = false;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  tpr_model_debug dbg = TPR_MODEL_DEBUG_DEFAULT;
  tpr_model_mesh mesh = TPR_MODEL_MESH_DEFAULT;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory (Hugging Face or converted)"},
      {"data", TPR_ARG_STR, &data, "token file: a 1-D numpy .npy array of u16, u32, i32 or i64 ids"},
      {"seq-len", TPR_ARG_INT, &T, "tokens per window, as `tpr train --seq-len` (default 256)"},
      {"windows", TPR_ARG_INT, &max_windows, "score only the first N windows (default: all whole windows)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object (rank 0)"},
      TPR_MODEL_MESH_ARGS(mesh),
      TPR_WORLD_ARGS(wo),
      TPR_MODEL_DEBUG_ARGS(dbg),
  };
  const char *usage = "usage: [mpirun -np N] tpr eval --model DIR --data TOKENS.npy [--seq-len T] [--windows N]\n"
                      "       [--tp T --dp D --ep E --etp F] [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!model || !data || T < 1 || max_windows < 0) {
    fprintf(stderr, "tpr eval: --model and --data are required, --seq-len >= 1, --windows >= 0\n%s\n", usage);
    return 2;
  }
  tpr_world w;
  tpr_session *s = NULL;
  tpr_npy *tokens = NULL;
  eval_result res = {0};
  tpr_status rc = tpr_world_init(&argc, &argv, &wo, &w);
  if (rc == TPR_OK) rc = tpr_npy_open(data, &tokens);
  int64_t nw = rc == TPR_OK ? (tpr_npy_len(tokens) - 1) / T : 0;
  if (rc == TPR_OK && max_windows > 0 && max_windows < nw) nw = max_windows;
  if (rc == TPR_OK && nw < 1)
    rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "eval: %s holds %lld tokens, fewer than one window of %lld + 1", data,
                  (long long)tpr_npy_len(tokens), (long long)T);
  if (rc == TPR_OK) rc = tpr_cli_open_model(&w, model, &mesh, T, &dbg, &s);
  if (rc == TPR_OK) rc = tpr_npy_check_range(tokens, tpr_session_config(s)->vocab_size);
  if (rc == TPR_OK) rc = eval_windows(&w, s, tokens, T, nw, &res);
  if (rc == TPR_OK && w.rank == 0) {
    const tpr_shard_plan *pl = tpr_session_plan(s);
    double loss = res.ce_sum / (double)res.tokens;
    if (json)
      printf("{\"command\":\"eval\",\"model\":\"%s\",\"data\":\"%s\",\"seq_len\":%lld,\"windows\":%lld,"
             "\"tokens\":%lld,\"loss\":%.9g,\"perplexity\":%.6g,\"tp\":%d,\"dp\":%d,\"ep\":%d,\"seconds\":%.3f}\n",
             model, data, (long long)T, (long long)res.windows, (long long)res.tokens, loss, exp(loss), pl->tp,
             pl->dp, pl->ep, res.seconds);
    else
      printf("tpr eval: %lld windows x %lld tokens of %s: mean cross-entropy %.6f nats/token (perplexity %.2f), "
             "tp %d dp %d ep %d, %.1f s\n", (long long)res.windows, (long long)T, data, loss, exp(loss), pl->tp,
             pl->dp, pl->ep, res.seconds);
  }
  tpr_session_close(s);
  tpr_npy_close(tokens);
  if (rc != TPR_OK) return tpr_world_fail(&w, "eval");
  tpr_world_finish(&w);
  return 0;
}
