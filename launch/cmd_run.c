// tpr run: generation from a MiniMax-M2 checkpoint. Each prompt is
// prefilled in one program run, then decoded one token per run with the KV
// cache; every rank samples the same token from the same all-gathered
// logits and the same seeded RNG, so no extra collective is needed.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "launch/model_cli.h"
#include "models/sampling.h"

typedef struct run_totals {
  int64_t prompt_tokens, generated;
  double prefill_s, decode_s;
} run_totals;

// Generates n_new tokens after prompt (len) into out.
static tpr_status generate(tpr_session *s, const int32_t *prompt, int64_t len, int64_t n_new,
                           const tpr_sampling *smp, tpr_rng *rng, int32_t *out, run_totals *tot) {
  int64_t V = tpr_session_config(s)->vocab_size;
  float *logits = malloc((size_t)(len * V) * sizeof *logits);
  void *scratch = malloc(TPR_SAMPLE_SCRATCH_BYTES(V));
  tpr_status rc = logits && scratch ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "logits");
  double t0 = tpr_cli_now();
  if (rc == TPR_OK) rc = tpr_session_forward(s, prompt, len, 0, logits);
  tot->prefill_s += tpr_cli_now() - t0;
  tot->prompt_tokens += len;
  if (rc == TPR_OK && n_new > 0) out[0] = (int32_t)tpr_sample(logits + (len - 1) * V, V, smp, rng, scratch);
  t0 = tpr_cli_now();
  for (int64_t i = 1; rc == TPR_OK && i < n_new; i++) {
    rc = tpr_session_forward(s, &out[i - 1], 1, len + i - 1, logits);
    if (rc == TPR_OK) out[i] = (int32_t)tpr_sample(logits, V, smp, rng, scratch);
  }
  tot->decode_s += tpr_cli_now() - t0;
  tot->generated += n_new > 0 ? n_new - 1 : 0;  // decode steps (the first token comes from prefill)
  free(logits);
  free(scratch);
  return rc;
}

static void print_ids(const int32_t *ids, int64_t n, bool json) {
  for (int64_t i = 0; i < n; i++) printf(json ? "%s%d" : "%s%d", i ? (json ? "," : " ") : "", ids[i]);
}

int tpr_cmd_run(int argc, char **argv) {
  const char *model = NULL;
  tpr_arg_list prompts = {0};
  int64_t max_new = 16, top_k = 0, seed = 0, max_seq = 0;
  double temperature = 0, top_p = 1;
  bool json = false;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  tpr_model_debug dbg = TPR_MODEL_DEBUG_DEFAULT;
  tpr_model_mesh mesh = TPR_MODEL_MESH_DEFAULT;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory (Hugging Face or converted)"},
      {"prompt-ids", TPR_ARG_STR_LIST, &prompts, "a prompt's token ids, comma-separated; repeat for a batch"},
      {"max-new-tokens", TPR_ARG_INT, &max_new, "tokens to generate per prompt (default 16)"},
      {"temperature", TPR_ARG_FLOAT, &temperature, "0 = greedy (default); > 0 samples"},
      {"top-k", TPR_ARG_INT, &top_k, "sample among the k most likely tokens (default 0 = all)"},
      {"top-p", TPR_ARG_FLOAT, &top_p, "sample within the smallest set of mass >= p (default 1 = all)"},
      {"seed", TPR_ARG_INT, &seed, "sampling seed, the same on every rank (default 0)"},
      {"max-seq", TPR_ARG_INT, &max_seq, "KV cache rows (default: longest prompt + max-new-tokens)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object (rank 0)"},
      {"moe-stats", TPR_ARG_FLAG, &mesh.moe_stats, "print routing statistics per MoE layer (also in --json)"},
      TPR_MODEL_MESH_ARGS(mesh),
      TPR_WORLD_ARGS(wo),
      TPR_MODEL_DEBUG_ARGS(dbg),
  };
  const char *usage = "usage: [mpirun -np N] tpr run --model DIR --prompt-ids 1,2,3 [--prompt-ids ...] "
                      "[--max-new-tokens N] [--temperature T --top-k K --top-p P --seed S]\n"
                      "       [--tp T --dp D --ep E --etp F] [--moe-dispatch alltoall|allreduce] "
                      "[--capacity-factor F [--reroute-dropped]] [--moe-stats] [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  tpr_sampling smp = {.temperature = temperature, .top_k = top_k, .top_p = top_p, .seed = (uint64_t)seed};
  if (!model || prompts.n == 0) {
    fprintf(stderr, "tpr run: --model and at least one --prompt-ids are required\n%s\n", usage);
    return 2;
  }
  if (max_new < 1 || tpr_sampling_check(&smp) != TPR_OK) {
    fprintf(stderr, "tpr run: %s\n", max_new < 1 ? "--max-new-tokens must be >= 1" : tpr_last_error());
    return 2;
  }
  int32_t *ids[TPR_ARG_LIST_MAX] = {0}, *gen = NULL;
  int64_t lens[TPR_ARG_LIST_MAX] = {0}, longest = 0;
  for (int i = 0; i < prompts.n; i++) {
    if (tpr_cli_token_list("--prompt-ids", prompts.items[i], &ids[i], &lens[i]) != TPR_OK) {
      fprintf(stderr, "tpr run: %s\n", tpr_last_error());
      for (int j = 0; j < i; j++) free(ids[j]);
      return 2;
    }
    if (lens[i] > longest) longest = lens[i];
  }
  if (max_seq == 0) max_seq = longest + max_new;
  if (max_seq < longest + max_new) {
    fprintf(stderr, "tpr run: --max-seq %lld is shorter than the longest prompt (%lld) + --max-new-tokens (%lld)\n",
            (long long)max_seq, (long long)longest, (long long)max_new);
    for (int i = 0; i < prompts.n; i++) free(ids[i]);
    return 2;
  }
  tpr_world w;
  tpr_session *s = NULL;
  tpr_status rc = tpr_world_init(&argc, &argv, &wo, &w);
  if (rc == TPR_OK) rc = tpr_cli_open_model(&w, model, &mesh, max_seq, &dbg, &s);
  run_totals tot = {0};
  tpr_rng rng = {(uint64_t)seed};
  if (rc == TPR_OK && !(gen = malloc((size_t)(prompts.n * max_new) * sizeof *gen))) rc = TPR_FAIL(TPR_ERR_OOM, "ids");
  for (int i = 0; rc == TPR_OK && i < prompts.n; i++)
    rc = generate(s, ids[i], lens[i], max_new, &smp, &rng, gen + i * max_new, &tot);
  tpr_moe_stats ms = {0};
  if (rc == TPR_OK && mesh.moe_stats) rc = tpr_session_moe_stats(s, &ms);  // collective
  if (rc == TPR_OK && w.rank == 0) {
    const tpr_session_info *st = tpr_session_stats(s);
    const tpr_shard_plan *pl = tpr_session_plan(s);
    double pre = tot.prefill_s > 0 ? (double)tot.prompt_tokens / tot.prefill_s : 0;
    double dec = tot.decode_s > 0 ? (double)tot.generated / tot.decode_s : 0;
    if (json) {
      printf("{\"command\":\"run\",\"world_size\":%d,\"tp\":%d,\"dp\":%d,\"ep\":%d,\"etp\":%d,\"prompts\":[",
             w.size, pl->tp, pl->dp, pl->ep, pl->etp);
      for (int i = 0; i < prompts.n; i++) {
        printf("%s{\"prompt\":[", i ? "," : "");
        print_ids(ids[i], lens[i], true);
        printf("],\"generated\":[");
        print_ids(gen + i * max_new, max_new, true);
        printf("]}");
      }
      printf("],\"load_s\":%.4f,\"prefill_tokens\":%lld,\"prefill_s\":%.4f,\"prefill_tok_s\":%.2f,"
             "\"decode_tokens\":%lld,\"decode_s\":%.4f,\"decode_tok_s\":%.2f,\"weight_bytes_per_rank\":%llu",
             st->load_s, (long long)tot.prompt_tokens, tot.prefill_s, pre, (long long)tot.generated, tot.decode_s,
             dec, (unsigned long long)st->weight_bytes);
      if (mesh.moe_stats) {
        printf(",\"moe_stats\":");
        tpr_moe_stats_json(&ms, stdout);
      }
      printf("}\n");
    } else {
      for (int i = 0; i < prompts.n; i++) {
        printf("prompt %d (%lld tokens): ", i, (long long)lens[i]);
        print_ids(ids[i], lens[i], false);
        printf("\n  generated: ");
        print_ids(gen + i * max_new, max_new, false);
        printf("\n");
      }
      printf("tp %d dp %d ep %d etp %d | load %.3f s | prefill %lld tokens, %.1f tok/s | decode %lld tokens, "
             "%.1f tok/s\n", pl->tp, pl->dp, pl->ep, pl->etp, st->load_s, (long long)tot.prompt_tokens, pre,
             (long long)tot.generated, dec);
      if (mesh.moe_stats) tpr_moe_stats_print(&ms, stdout);
    }
  }
  for (int i = 0; i < prompts.n; i++) free(ids[i]);
  free(gen);
  tpr_moe_stats_free(&ms);
  if (rc != TPR_OK) {
    tpr_session_close(s);
    return tpr_world_fail(&w, "run");
  }
  tpr_session_close(s);
  tpr_world_finish(&w);
  return 0;
}
