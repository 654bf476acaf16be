// tpr bench model: prefill and decode speed of MiniMax-M2 under tensor
// parallelism, beside this machine's own roofline measured in the same run
// (an sgemm rate and a memory read bandwidth, every rank measuring at once,
// as they share the machine while the model runs).
//
// Counting (per rank, f32): a token's matmul FLOPs are 2 x the weights it
// touches on this rank (q/k/v/o slices, the router, its k experts' slices,
// its share of lm_head) plus attention's 4 x heads_r x D x context. A
// decode step reads the dense slices, the router and the experts the batch
// picks (at most min(E, k x tokens) per layer); we count k experts per layer,
// the batch-1 figure, so weight GB/s is a lower bound.
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cblas.h>

#include "engine/engine.h"
#include "launch/args.h"
#include "launch/bench_model.h"
#include "launch/cli_util.h"
#include "launch/model_cli.h"
#include "runtime/rng.h"
#include "shard/checkpoint_gen.h"
#include "shard/shard_plan.h"

typedef struct roofline {
  double gemm_gflops;  // sgemm 1024^3 on this rank's threads
  double read_gbs;     // streaming read of 256 MiB
} roofline;

static double measure_read(void) {
  size_t n = (256u << 20) / sizeof(double);
  double *x = malloc(n * sizeof *x), best = 0;
  if (!x) return 0;
  for (size_t i = 0; i < n; i++) x[i] = (double)(i & 7);
  volatile double sink = 0;
  for (int r = 0; r < 3; r++) {
    double t0 = tpr_cli_now(), s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 3 < n; i += 4) s0 += x[i], s1 += x[i + 1], s2 += x[i + 2], s3 += x[i + 3];
    sink += s0 + s1 + s2 + s3;
    double g = (double)(n * sizeof *x) / (tpr_cli_now() - t0) * 1e-9;
    if (g > best) best = g;
  }
  (void)sink;
  free(x);
  return best;
}

// Weights (elements) on this rank that a step of `tokens` tokens touches:
// the dense slices, the router, and the experts the tokens pick, expected
// under uniform routing (each of the rank's E/ep experts is hit with
// probability 1 - (1 - k/E)^tokens; at one token that is k/ep experts).
// The lm head's shard is *head (it runs on sampled rows only).
static double step_weights(const tpr_shard_plan *p, double tokens, double *head) {
  const tpr_model_config *c = &p->config;
  const tpr_attn_plan *a = &p->attn;
  double H = (double)c->hidden_size, D = (double)c->head_dim, Fr = (double)p->expert_inter_per_rank;
  double E = (double)c->num_experts, k = (double)c->experts_per_tok;
  double attn = (2.0 * (double)a->q_per_rank + 2.0 * (double)a->kv_per_rank) * D * H;
  double hit = 1.0 - pow(1.0 - k / E, tokens);
  double moe = E * H + E / p->ep * hit * 3.0 * Fr * H;
  *head = (double)(p->vocab_padded / p->tp) * H;
  return (double)c->num_layers * (attn + moe) + *head;
}

typedef struct bench_result {
  double prefill_s, decode_s;
  int64_t prefill_tokens, decode_tokens, steps, decode_steps;
  double prefill_gflop_sampled, prefill_gflop_all;  // one prefill program, logits at sampled rows / every row
  int64_t prefill_program_tokens;
} bench_result;

// Rank 0 submits `batch` random prompts of P tokens, greedy, G + 1 new
// tokens each (the first comes from the prefill); every rank steps the
// engine until all finish. Steps with prompt tokens count as prefill, the
// others as decode.
static tpr_status run_workload(tpr_session *s, tpr_world *w, const tpr_model_engine *g, int64_t batch, int64_t P,
                               int64_t G, uint64_t seed, bench_result *r) {
  tpr_engine *e = NULL;
  tpr_engine_opts eo = {.max_tokens_per_step = g->max_tokens_per_step};
  TPR_CHECK(tpr_engine_new(s, &eo, &e));
  int64_t V = tpr_session_config(s)->vocab_size;
  int32_t *tok = malloc((size_t)P * sizeof *tok);
  tpr_status rc = tok ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "bench prompts");
  tpr_rng rng = {seed};
  tpr_gen_params gp = {.max_new = G + 1, .stop_token = -1, .sampling = {.temperature = 0, .top_p = 1}};
  for (int64_t b = 0; rc == TPR_OK && w->rank == 0 && b < batch; b++) {
    for (int64_t t = 0; t < P; t++) tok[t] = (int32_t)(tpr_rng_next(&rng) % (uint64_t)V);
    int64_t id;
    rc = tpr_engine_submit(e, tok, P, &gp, &id);
  }
  if (rc == TPR_OK) rc = tpr_comm_agree(w->host, rc);
  while (rc == TPR_OK) {
    tpr_engine_step_info info;
    rc = tpr_engine_step(e, &info);
    if (rc != TPR_OK || info.idle) break;
    r->steps++;
    if (info.prefill_tokens > 0) {
      r->prefill_s += info.seconds;
      r->prefill_tokens += info.prefill_tokens;
    } else {
      r->decode_s += info.seconds;
      r->decode_tokens += info.decode_tokens;
      r->decode_steps++;
    }
  }
  free(tok);
  tpr_engine_free(e);
  return rc;
}

static double program_gflop(const tpr_program *p) {
  double f = 0;
  for (int n = 0; n < tpr_program_num_nodes(p); n++) f += tpr_program_node_flops(p, n);
  return f * 1e-9;
}

// The work logits-only-where-sampled saves: the largest prefill step's
// program built with N = min(T, batch) sampled rows and with every row.
static tpr_status count_prefill_flops(tpr_session *s, int64_t batch, int64_t P, int64_t budget, bench_result *r) {
  const tpr_family *f;
  TPR_CHECK(tpr_family_find(tpr_session_config(s)->family, &f));
  tpr_session_pool pool = tpr_session_pool_info(s);
  int64_t want = batch * P < budget ? batch * P : budget, T = 1;
  while (T < want) T *= 2;
  tpr_step_build_opts o = {.shape = {.tokens = T, .batch = pool.batch, .max_blocks = pool.max_blocks,
                                     .pool_blocks = pool.blocks, .block_size = pool.block_size}};
  double gf[2];
  for (int all = 0; all < 2; all++) {
    o.shape.samples = all ? T : (T < pool.batch ? T : pool.batch);
    tpr_program *p = NULL;
    TPR_CHECK(f->build_step(tpr_session_plan(s), &o, &p));
    gf[all] = program_gflop(p);
    tpr_program_free(p);
  }
  r->prefill_gflop_sampled = gf[0], r->prefill_gflop_all = gf[1], r->prefill_program_tokens = T;
  return TPR_OK;
}

static void print_result(const tpr_world *w, const tpr_shard_plan *p, const roofline *rf, const bench_result *r,
                         int64_t batch, int64_t P, int64_t G, double load_s, const int64_t *rss_kb, bool json) {
  // FLOPs: 2 x the weights a token multiplies on this rank (its k experts
  // only: step_weights at one token), the lm head on sampled rows only
  // (one per sequence in prefill), plus attention's 4 x heads_r x D x context.
  double head, elems = step_weights(p, 1, &head);
  double attn_per_tok = 4.0 * (double)p->attn.q_per_rank * (double)p->config.head_dim * (double)p->config.num_layers;
  double pre_flops = 2.0 * (elems - head) * (double)r->prefill_tokens + 2.0 * head * (double)batch +
                     attn_per_tok * (double)r->prefill_tokens * (double)P / 2;
  double dec_flops = 2.0 * elems * (double)r->decode_tokens + attn_per_tok * (double)r->decode_tokens * ((double)P + (double)G / 2);
  double pre_tps = r->prefill_tokens / r->prefill_s, dec_tps = r->decode_tokens / r->decode_s;
  double pre_gf = pre_flops / r->prefill_s * 1e-9, dec_gf = dec_flops / r->decode_s * 1e-9;
  // Bytes: a decode step reads the weights its tokens touch once.
  double per_step = r->decode_steps ? (double)r->decode_tokens / (double)r->decode_steps : 1;
  double dec_gbs = 4.0 * step_weights(p, per_step, &head) * (double)r->decode_steps / r->decode_s * 1e-9;
  int64_t rss_max = 0;
  for (int i = 0; i < w->size; i++)
    if (rss_kb[i] > rss_max) rss_max = rss_kb[i];
  if (json) {
    printf("{\"command\":\"bench model\",\"world_size\":%d,\"tp\":%d,\"batch\":%lld,\"prompt_len\":%lld,\"gen_len\":%lld,"
           "\"load_s\":%.6g,\"prefill_tok_s\":%.6g,\"decode_tok_s\":%.6g,\"prefill_gflops_per_rank\":%.6g,"
           "\"decode_gflops_per_rank\":%.6g,\"decode_weight_gbs_per_rank\":%.6g,\"machine_gemm_gflops_per_rank\":%.6g,"
           "\"machine_read_gbs_per_rank\":%.6g,\"prefill_gemm_efficiency\":%.6g,\"decode_bandwidth_efficiency\":%.6g,"
           "\"steps\":%lld,\"decode_steps\":%lld,\"decode_tokens_per_step\":%.6g,\"prefill_program_tokens\":%lld,"
           "\"prefill_program_gflop_sampled_rows\":%.6g,\"prefill_program_gflop_every_row\":%.6g,"
           "\"peak_rss_bytes_max\":%lld,\"peak_rss_bytes\":[",
           w->size, p->tp, (long long)batch, (long long)P, (long long)G, load_s, pre_tps, dec_tps, pre_gf, dec_gf, dec_gbs,
           rf->gemm_gflops, rf->read_gbs, pre_gf / rf->gemm_gflops, dec_gbs / rf->read_gbs, (long long)r->steps,
           (long long)r->decode_steps, per_step, (long long)r->prefill_program_tokens, r->prefill_gflop_sampled,
           r->prefill_gflop_all, (long long)rss_max * 1024);
    for (int i = 0; i < w->size; i++) printf("%s%lld", i ? "," : "", (long long)rss_kb[i] * 1024);
    printf("]}\n");
    return;
  }
  char b1[32];
  printf("tpr bench model: %s, tp %d, batch %lld (batched engine: %lld steps, %.1f tokens per decode step), "
         "prompt %lld, gen %lld\n", tpr_model_family_name(p->config.family), p->tp, (long long)batch,
         (long long)r->steps, per_step, (long long)P, (long long)G);
  printf("  %-34s %.3f s\n", "load (random weights)", load_s);
  printf("  %-34s %10s %14s %14s\n", "", "tokens/s", "per rank", "vs roofline");
  printf("  %-34s %10.1f %9.2f GF/s %13.1f%%  (sgemm %.1f GF/s)\n", "prefill", pre_tps, pre_gf,
         100 * pre_gf / rf->gemm_gflops, rf->gemm_gflops);
  printf("  %-34s %10.1f %9.2f GB/s %13.1f%%  (read %.1f GB/s; %.2f GF/s)\n", "decode (weight reads)", dec_tps, dec_gbs,
         100 * dec_gbs / rf->read_gbs, rf->read_gbs, dec_gf);
  char what[64];
  snprintf(what, sizeof what, "prefill program, T = %lld", (long long)r->prefill_program_tokens);
  printf("  %-34s %.3f GFLOP with logits at the %lld sampled rows, %.3f at every row (x%.2f)\n", what,
         r->prefill_gflop_sampled, (long long)(r->prefill_program_tokens < batch ? r->prefill_program_tokens : batch),
         r->prefill_gflop_all, r->prefill_gflop_sampled / r->prefill_gflop_all);
  printf("  %-34s %s (max over %d ranks)\n", "peak RSS per rank", tpr_cli_bytes((uint64_t)rss_max * 1024, b1, sizeof b1),
         w->size);
}

// rm -r of the flat directory random_checkpoint made.
static void remove_flat_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[512];
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      unlink(path);
    }
  if (d) closedir(d);
  if (rmdir(dir) != 0) fprintf(stderr, "tpr bench model: could not remove %s\n", dir);
}

// Rank 0 writes a random checkpoint into a fresh temporary directory and
// tells the others its path (ranks share the node's /tmp).
static tpr_status random_checkpoint(tpr_world *w, const char *config, uint64_t seed, char *dir, size_t cap) {
  char path[256] = "";
  int64_t ok = 1;
  if (w->rank == 0) {
    snprintf(path, sizeof path, "/tmp/tpr_bench_model_XXXXXX");
    ok = mkdtemp(path) && tpr_checkpoint_generate(config, path, seed, TPR_F32, 1, NULL) == TPR_OK;
  }
  TPR_CHECK(tpr_comm_broadcast(w->host, &ok, &ok, 1, TPR_I64, 0));
  if (!ok) return TPR_FAIL(TPR_ERR_IO, "bench model: rank 0 could not write the random checkpoint (%s)",
                           w->rank == 0 ? tpr_last_error() : "see rank 0");
  TPR_CHECK(tpr_comm_broadcast(w->host, path, path, sizeof path, TPR_U8, 0));
  snprintf(dir, cap, "%s", path);
  return TPR_OK;
}

int tpr_bench_model(int argc, char **argv) {
  const char *config = NULL, *model = NULL;
  int64_t batch = 1, P = 32, G = 16, seed = 1;
  bool random_weights = false, json = false;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  tpr_model_mesh mesh = TPR_MODEL_MESH_DEFAULT;
  tpr_model_engine eng = {0};
  const tpr_arg args[] = {
      {"config", TPR_ARG_STR, &config, "model config.json (with --random-weights)"},
      {"random-weights", TPR_ARG_FLAG, &random_weights, "write a random checkpoint of --config first"},
      {"model", TPR_ARG_STR, &model, "or: an existing checkpoint directory"},
      {"batch", TPR_ARG_INT, &batch, "sequences, run together by the batched engine (default 1)"},
      {"prompt-len", TPR_ARG_INT, &P, "prompt tokens per sequence (default 32)"},
      {"gen-len", TPR_ARG_INT, &G, "generated tokens per sequence (default 16)"},
      {"seed", TPR_ARG_INT, &seed, "seed of the weights and prompts (default 1)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object (rank 0)"},
      TPR_MODEL_MESH_ARGS(mesh),
      TPR_MODEL_ENGINE_ARGS(eng),
      TPR_WORLD_ARGS(wo),
  };
  const char *usage = "usage: [mpirun -np N] tpr bench model (--config FILE --random-weights | --model DIR) "
                      "[--batch B --prompt-len P --gen-len G] [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if ((!model) == (!(config && random_weights)) || batch < 1 || P < 1 || G < 1) {
    fprintf(stderr, "tpr bench model: give --config FILE --random-weights or --model DIR, and positive "
                    "--batch/--prompt-len/--gen-len\n%s\n", usage);
    return 2;
  }
  tpr_world w;
  tpr_session *s = NULL;
  char dir[256];
  tpr_model_debug dbg = TPR_MODEL_DEBUG_DEFAULT;
  tpr_status rc = tpr_world_init(&argc, &argv, &wo, &w);
  if (rc == TPR_OK && !model && (rc = random_checkpoint(&w, config, (uint64_t)seed, dir, sizeof dir)) == TPR_OK)
    model = dir;
  if (!eng.max_batch) eng.max_batch = batch;
  // By default every prompt is prefilled in one step, so the decode steps
  // measured hold the whole batch.
  if (!eng.max_tokens_per_step) eng.max_tokens_per_step = batch * P > 256 ? batch * P : 256;
  if (rc == TPR_OK) rc = tpr_cli_open_engine_model(&w, model, &mesh, P + G + 1, &eng, &dbg, &s);
  roofline rf = {0};
  bench_result r = {0};
  int64_t *rss = calloc((size_t)(w.size > 0 ? w.size : 1), sizeof *rss);
  if (rc == TPR_OK) rc = tpr_comm_barrier(w.host);
  if (rc == TPR_OK) {
    rf.gemm_gflops = tpr_cli_sgemm_gflops();
    rf.read_gbs = measure_read();
    rc = run_workload(s, &w, &eng, batch, P, G, (uint64_t)seed, &r);
  }
  if (rc == TPR_OK && w.rank == 0)
    rc = count_prefill_flops(s, batch, P, eng.max_tokens_per_step, &r);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  int64_t mine = ru.ru_maxrss;
  if (rc == TPR_OK) rc = tpr_comm_all_gather(w.host, &mine, rss, 1, TPR_I64);
  if (rc == TPR_OK && w.rank == 0) {
    tpr_shard_plan plan;
    tpr_model_config cfg = *tpr_session_config(s);
    rc = tpr_shard_plan_build(&cfg, w.size, 1, w.size, 1, TPR_F32, &plan);
    if (rc == TPR_OK) print_result(&w, &plan, &rf, &r, batch, P, G, tpr_session_stats(s)->load_s, rss, json);
    if (rc == TPR_OK) tpr_shard_plan_free(&plan);
  }
  free(rss);
  tpr_session_close(s);  // unmaps the checkpoint before it is removed
  s = NULL;
  if (model == dir && w.rank == 0) remove_flat_dir(dir);
  tpr_session_close(s);
  if (rc != TPR_OK) return tpr_world_fail(&w, "bench model");
  tpr_world_finish(&w);
  return 0;
}
