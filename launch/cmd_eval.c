// tpr eval: the mean next-token cross-entropy of a checkpoint over a token
// file, cut into the windows `tpr train` reads (window w: inputs
// [w*T, w*T + T), targets shifted by one), every window starting a fresh
// sequence. The validation loss of a training run (scripts/demo_model/),
// and the check that a committed model still scores what was recorded.
//
// The windows and their split over data-parallel replicas are
// train/eval_windows.h's (`tpr train --eval-data` scores the same ones);
// the result can differ in the last bits between meshes (the logits do).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "launch/model_cli.h"
#include "train/eval_windows.h"
#include "train/tokens.h"

// -log softmax(logits)[target] of one position, in double.
static double token_ce(const float *logits, int64_t V, int32_t target) {
  double mx = logits[0];
  for (int64_t v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
  double sum = 0;
  for (int64_t v = 0; v < V; v++) sum += exp((double)logits[v] - mx);
  return mx + log(sum) - (double)logits[target];
}

// tpr_eval_windows' scorer on an inference session: a forward of the
// window from position 0 and the cross-entropy of its logits in double.
typedef struct session_scorer {
  tpr_session *s;
  int64_t T, V;
  float *logits;  // (T, V)
} session_scorer;

static tpr_status score_window(void *ctx, const int32_t *ids, int64_t offset, bool keep, double *ce_sum,
                               int64_t *scored) {
  (void)offset;  // every position is scored: no document rule
  session_scorer *c = ctx;
  TPR_CHECK(tpr_session_forward(c->s, ids, c->T, 0, c->logits));  // (T, V)
  *ce_sum = 0, *scored = c->T;
  for (int64_t t = 0; keep && t < c->T; t++) *ce_sum += token_ce(c->logits + t * c->V, c->V, ids[t + 1]);
  return TPR_OK;
}

static tpr_status eval_windows(tpr_world *w, tpr_session *s, const tpr_tokens *data, int64_t T, int64_t nw,
                               tpr_eval_result *res) {
  const tpr_shard_plan *pl = tpr_session_plan(s);
  session_scorer c = {.s = s, .T = T, .V = tpr_session_config(s)->vocab_size};
  int64_t numel;  // T comes from --seq-len: checked before the product sizes an allocation
  TPR_CHECK(tpr_size_mul_checked("tpr eval: --seq-len x vocabulary", T, c.V, TPR_SHAPE_MAX_NUMEL, &numel));
  c.logits = malloc((size_t)numel * sizeof *c.logits);
  if (!c.logits) return TPR_FAIL(TPR_ERR_OOM, "eval: logits (%lld, %lld)", (long long)T, (long long)c.V);
  tpr_status rc = tpr_eval_windows(w->host, pl->tp, pl->dp, w->rank / pl->tp, data, T, nw, score_window, &c, res);
  free(c.logits);
  return rc;
}

int tpr_cmd_eval(int argc, char **argv) {
  const char *model = NULL;
  tpr_arg_list data_list = {0};  // repeatable: joined into one comma list
  int64_t T = 256, max_windows = 0;
  bool json = false;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  tpr_model_debug dbg = TPR_MODEL_DEBUG_DEFAULT;
  tpr_model_mesh mesh = TPR_MODEL_MESH_DEFAULT;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory (Hugging Face or converted)"},
      {"data", TPR_ARG_STR_LIST, &data_list,
       "tokens: .npy files of u16, u32, i32 or i64 ids, a glob (sorted), a token-shard index PREFIX.json[:train|:val] "
       "(default its val split), or a comma-separated list of these; repeatable; all concatenated in order"},
      {"seq-len", TPR_ARG_SIZE, &T, "tokens per window, as `tpr train --seq-len` (default 256)"},
      {"windows", TPR_ARG_SIZE, &max_windows, "score only the first N windows (default: all whole windows)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object (rank 0)"},
      TPR_MODEL_MESH_ARGS(mesh),
      TPR_WORLD_ARGS(wo),
      TPR_MODEL_DEBUG_ARGS(dbg),
  };
  const char *usage = "usage: [mpirun -np N] tpr eval --model DIR --data DATA [--seq-len T] [--windows N]\n"
                      "       [--tp T --dp D --ep E --etp F] [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!model || !data_list.n || T < 1 || max_windows < 0) {
    fprintf(stderr, "tpr eval: --model and --data are required, --seq-len >= 1, --windows >= 0\n%s\n", usage);
    return 2;
  }
  char *data = tpr_cli_join_data(&data_list);
  if (!data) {
    fprintf(stderr, "tpr eval: out of memory\n");
    return 1;
  }
  tpr_world w;
  tpr_session *s = NULL;
  tpr_tokens *tokens = NULL;
  tpr_tokens_opts to = {.split = "val"};
  tpr_eval_result res = {0};
  tpr_status rc = tpr_world_init(&argc, &argv, &wo, &w);
  int64_t nw = 0;
  if (rc == TPR_OK) rc = tpr_tokens_open(data, &to, &tokens);
  if (rc == TPR_OK) rc = tpr_eval_window_count(tokens, T, max_windows, &nw);
  if (rc == TPR_OK) rc = tpr_cli_open_model(&w, model, &mesh, T, &dbg, &s);
  if (rc == TPR_OK) rc = tpr_tokens_check_range(tokens, tpr_session_config(s)->vocab_size);
  double t0 = tpr_cli_now();
  if (rc == TPR_OK) rc = eval_windows(&w, s, tokens, T, nw, &res);
  double seconds = tpr_cli_now() - t0;
  if (rc == TPR_OK && w.rank == 0) {
    const tpr_shard_plan *pl = tpr_session_plan(s);
    double loss = res.ce_sum / (double)res.tokens;
    if (json)
      printf("{\"command\":\"eval\",\"model\":\"%s\",\"data\":\"%s\",\"seq_len\":%lld,\"windows\":%lld,"
             "\"tokens\":%lld,\"loss\":%.9g,\"perplexity\":%.6g,\"tp\":%d,\"dp\":%d,\"ep\":%d,\"seconds\":%.3f}\n",
             model, data, (long long)T, (long long)res.windows, (long long)res.tokens, loss, exp(loss), pl->tp,
             pl->dp, pl->ep, seconds);
    else
      printf("tpr eval: %lld windows x %lld tokens of %s: mean cross-entropy %.6f nats/token (perplexity %.2f), "
             "tp %d dp %d ep %d, %.1f s\n", (long long)res.windows, (long long)T, data, loss, exp(loss), pl->tp,
             pl->dp, pl->ep, seconds);
  }
  tpr_session_close(s);
  tpr_tokens_close(tokens);
  free(data);
  if (rc != TPR_OK) return tpr_world_fail(&w, "eval");
  tpr_world_finish(&w);
  return 0;
}
