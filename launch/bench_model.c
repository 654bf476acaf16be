// tpr bench model: prefill and decode speed of any engine family under tensor
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
#include <omp.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BENCH_X86 1
#endif

#include "engine/engine.h"
#include "launch/args.h"
#include "launch/bench_model.h"
#include "launch/bench_model_profile.h"
#include "launch/bench_peak.h"
#include "launch/bench_spec.h"
#include "launch/cli_util.h"
#include "launch/model_cli.h"
#include "runtime/file_io.h"
#include "runtime/rng.h"
#include "shard/checkpoint_gen.h"
#include "shard/shard_plan.h"
#include "tokenizer/tokenizer.h"

typedef struct roofline {
  double gemm_gflops;  // sgemm 1024^3 on this rank's threads
  double read_gbs;     // streaming read far past the last-level cache, on this rank's threads
  int read_threads;
  size_t read_bytes;   // this rank's buffer
  tpr_bench_peak peak; // the ISA's arithmetic peak on this rank's threads (in registers)
} roofline;

// One thread's slice of the read probe: float adds into 4 x 8 independent
// lanes, so the adds never limit the loads.
#ifdef BENCH_X86
__attribute__((target("avx2"))) static float sum_avx2(const float *x, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
  }
  float l[8], s = 0;
  _mm256_storeu_ps(l, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (int k = 0; k < 8; k++) s += l[k];
  for (; i < n; i++) s += x[i];
  return s;
}
#endif

// Any x86-64 (or other) CPU: independent lanes the compiler vectorises
// with the baseline ISA.
static float sum_portable(const float *x, size_t n) {
  float a[16] = {0}, s = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++) a[k] += x[i + k];
  for (int k = 0; k < 16; k++) s += a[k];
  for (; i < n; i++) s += x[i];
  return s;
}

// The buffer: 8 x the last-level cache, at least 1 GiB and at most 4 GiB
// for the node, split over its ranks (all probe at once, so together they
// stream the whole and the LLC they share holds a sliver of it).
static size_t read_probe_bytes(void) {
  long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  size_t node = (size_t)1 << 30;
  if (llc > 0 && (size_t)llc * 8 > node) node = (size_t)llc * 8;
  if (node > ((size_t)4 << 30)) node = (size_t)4 << 30;
  size_t mine = node / (size_t)tpr_local_ranks_from_env();
  if (mine < ((size_t)64 << 20)) mine = (size_t)64 << 20;
  return mine & ~(size_t)4095;
}

// Read bandwidth of this rank: `threads` OpenMP threads (the count the
// backend runs kernels on) each stream their slice (first touched by the
// same thread, so pages sit on its NUMA node); a warm-up pass, then the
// best of 3.
static void measure_read(int threads, roofline *rf) {
  size_t bytes = read_probe_bytes();
  float *x = NULL;
  while (!(x = aligned_alloc(64, bytes)) && bytes > ((size_t)64 << 20)) bytes /= 2;
  rf->read_threads = threads, rf->read_bytes = x ? bytes : 0;
  if (!x) return;
  size_t n = bytes / sizeof *x;
#ifdef BENCH_X86
  bool avx2 = __builtin_cpu_supports("avx2");
#endif
  double best = 0;
  volatile float sink = 0;
  for (int pass = -1; pass < 3; pass++) {  // pass -1 writes the buffer (and warms the threads)
    float total = 0;
    double t0 = tpr_cli_now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      size_t lo = n * (size_t)t / (size_t)nt, hi = n * (size_t)(t + 1) / (size_t)nt;
      if (pass < 0) {
        for (size_t i = lo; i < hi; i++) x[i] = (float)(i & 7);
      } else {
#ifdef BENCH_X86
        total += avx2 ? sum_avx2(x + lo, hi - lo) : sum_portable(x + lo, hi - lo);
#else
        total += sum_portable(x + lo, hi - lo);
#endif
      }
    }
    double g = (double)bytes / (tpr_cli_now() - t0) * 1e-9;
    sink += total;
    if (pass >= 0 && g > best) best = g;
  }
  (void)sink;
  free(x);
  rf->read_gbs = best;
}

// Peak resident set in kB: Linux's VmHWM, which clear_refs can start over
// (getrusage's ru_maxrss, which it cannot, where /proc is unreadable).
static int64_t peak_rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  if (f) fclose(f);
  if (kb >= 0) return kb;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

// Starts the peak over at the present RSS, so the read probe's buffer
// (freed by now) does not count as the model's; false where refused.
static bool reset_peak_rss(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  bool ok = f && fputs("5", f) >= 0;
  if (f && fclose(f) != 0) ok = false;
  return ok;
}

// Weights (elements) on this rank that a step of `tokens` tokens touches:
// the dense slices (attention; on dense layers the dense MLP's F/tp
// columns, on MoE layers the shared expert's S/tp), the router, and the
// experts the tokens pick, expected under uniform routing (each of the
// rank's E/ep experts is hit with probability 1 - (1 - k/E)^tokens; at one
// token that is k/ep experts). A model without experts (qwen2_vl) has no
// router and no routed term.
// The lm head's shard is *head (it runs on sampled rows only).
// The bytes of each part per element as the session holds it (NULL: 1,
// which makes the result a count of elements).
typedef struct part_bytes {
  double attn, router, experts, head, mlp;
} part_bytes;

static double step_parts(const tpr_shard_plan *p, double tokens, const part_bytes *b, double *head) {
  const tpr_model_config *c = &p->config;
  const tpr_attn_plan *a = &p->attn;
  const part_bytes one = {1, 1, 1, 1, 1};
  if (!b) b = &one;
  double H = (double)c->hidden_size, D = (double)c->head_dim, Fr = (double)p->expert_inter_per_rank;
  double E = (double)c->num_experts, k = (double)c->experts_per_tok, tp = (double)p->tp;
  double Lm = (double)c->num_moe_layers, Ld = (double)(c->num_layers - c->num_moe_layers);
  double attn = (2.0 * (double)a->q_per_rank + 2.0 * (double)a->kv_per_rank) * D * H;
  double moe = 0;
  if (E > 0) {
    double hit = 1.0 - pow(1.0 - k / E, tokens);
    moe = b->router * E * H + b->experts * E / p->ep * hit * 3.0 * Fr * H +
          b->mlp * 3.0 * (double)c->shared_expert_intermediate_size / tp * H;
  }
  double dense = b->mlp * 3.0 * (double)c->dense_intermediate_size / tp * H;
  *head = b->head * (double)(p->vocab_padded / p->tp) * H;
  return (double)c->num_layers * b->attn * attn + Lm * moe + Ld * dense + *head;
}

static double step_weights(const tpr_shard_plan *p, double tokens, double *head) {
  return step_parts(p, tokens, NULL, head);
}

// Bytes a decode step of `tokens` tokens reads, by the dtypes the session
// holds each part in (bf16 and FP8 weights read half and a quarter).
static double step_bytes(const tpr_session *s, const tpr_shard_plan *p, double tokens) {
  const part_bytes b = {tpr_session_weight_element_bytes(s, "q_proj.weight"),
                        tpr_session_weight_element_bytes(s, ".gate.weight"),
                        tpr_session_weight_element_bytes(s, ".w1.weight"),
                        tpr_session_weight_element_bytes(s, p->config.tie_word_embeddings ? "embed_tokens" : "lm_head"),
                        tpr_session_weight_element_bytes(s, "mlp.gate_proj.weight")};  // dense or shared MLP, not experts
  double head;
  return step_parts(p, tokens, &b, &head);
}

typedef struct bench_result {
  double prefill_s, decode_s;
  int64_t prefill_tokens, decode_tokens, steps, decode_steps;
  int64_t generated_tokens;  // every sequence's, counted from the engine's results (rank 0)
  double prefill_gflop_sampled, prefill_gflop_all;  // one prefill program, logits at sampled rows / every row
  int64_t prefill_program_tokens;
} bench_result;

// Rank 0 submits `batch` random prompts of P tokens, greedy, G + 1 new
// tokens each (the first comes from the prefill); every rank steps the
// engine until all finish. Steps with prompt tokens count as prefill, the
// others as decode.
static tpr_status run_workload(tpr_session *s, tpr_world *w, const tpr_model_engine *g, int64_t batch, int64_t P,
                               int64_t G, uint64_t seed, tpr_bench_profile *prof, bench_result *r) {
  tpr_engine *e = NULL;
  tpr_engine_opts eo = {.max_tokens_per_step = g->max_tokens_per_step, .no_prefix_cache = g->no_prefix_cache};
  TPR_CHECK(tpr_engine_new(s, &eo, &e));
  int64_t V = tpr_session_config(s)->vocab_size;
  int32_t *tok = malloc((size_t)P * sizeof *tok);
  int64_t *ids = w->rank == 0 ? malloc((size_t)batch * sizeof *ids) : NULL;
  tpr_status rc = tok && (ids || w->rank != 0) ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "bench prompts");
  tpr_rng rng = {seed};
  tpr_gen_params gp = {.max_new = G + 1, .stop_token = -1, .sampling = {.temperature = 0, .top_p = 1}};
  for (int64_t b = 0; rc == TPR_OK && w->rank == 0 && b < batch; b++) {
    for (int64_t t = 0; t < P; t++) tok[t] = (int32_t)(tpr_rng_next(&rng) % (uint64_t)V);
    rc = tpr_engine_submit(e, tok, P, &gp, &ids[b]);
  }
  if (rc == TPR_OK) rc = tpr_comm_agree(w->host, rc);
  if (prof) tpr_bench_profile_start(prof);
  while (rc == TPR_OK) {
    tpr_engine_step_info info;
    rc = tpr_engine_step(e, &info);
    if (rc != TPR_OK || info.idle) break;
    if (prof) tpr_bench_profile_step(prof, info.prefill_tokens > 0, info.seconds);
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
  if (prof) tpr_bench_profile_stop();
  // The tokens generated, prefill's first ones included (tpr bench serve
  // compares its end-to-end rate with generated_tokens / (prefill_s + decode_s)).
  for (int64_t b = 0; rc == TPR_OK && w->rank == 0 && b < batch; b++) {
    tpr_sched_seq_info si;
    rc = tpr_engine_result(e, ids[b], &si);
    if (rc == TPR_OK) r->generated_tokens += si.len - si.prompt_len;
  }
  free(ids);
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
                                     .pool_blocks = pool.blocks, .block_size = pool.block_size,
                                     .state_slots = pool.state_slots}};
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

// wdt: the dtype the weight matrices are held in; s the session (the bytes a
// decode step reads).
static void print_result(const tpr_world *w, const tpr_session *s, const tpr_shard_plan *p, const roofline *rf,
                         const bench_result *r, int64_t batch, int64_t P, int64_t G, double load_s, tpr_dtype wdt,
                         uint64_t weight_bytes, const int64_t *rss_kb, const tpr_bench_profile *prof, bool json) {
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
  const double dec_bytes = step_bytes(s, p, per_step), roof_tps = rf->read_gbs * 1e9 / dec_bytes * per_step;
  double dec_gbs = dec_bytes * (double)r->decode_steps / r->decode_s * 1e-9;
  int64_t rss_max = 0;
  for (int i = 0; i < w->size; i++)
    if (rss_kb[i] > rss_max) rss_max = rss_kb[i];
  // Memory one sequence of P + G tokens holds on a rank: its KV rows (the
  // softmax layers) and, for a hybrid model, its recurrent state slot.
  const tpr_session_pool pool = tpr_session_pool_info(s);
  const uint64_t kv_seq = (uint64_t)((double)pool.bytes / (double)(pool.blocks * pool.block_size) * (double)(P + G));
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
    printf("],\"machine_read_threads\":%d,\"machine_read_buffer_bytes\":%zu", rf->read_threads, rf->read_bytes);
    printf(",\"prefill_s\":%.6g,\"decode_s\":%.6g,\"prefill_tokens\":%lld,\"decode_tokens\":%lld,"
           "\"generated_tokens\":%lld", r->prefill_s, r->decode_s, (long long)r->prefill_tokens,
           (long long)r->decode_tokens, (long long)r->generated_tokens);
    printf(",\"weight_dtype\":\"%s\",\"weight_bytes_per_rank\":%llu,\"decode_roofline_tok_s\":%.6g", tpr_dtype_name(wdt),
           (unsigned long long)weight_bytes, roof_tps);
    printf(",\"activation_dtype\":\"%s\"", tpr_session_stats(s)->bf16_activations ? "bf16" : "f32");
    printf(",\"kv_bytes_per_seq_per_rank\":%llu,\"state_bytes_per_seq_per_rank\":%llu", (unsigned long long)kv_seq,
           (unsigned long long)pool.state_slot_bytes);
    const tpr_bench_peak *pk = &rf->peak;
    printf(",\"machine_isa\":\"%s\",\"machine_amx_bf16\":%s", pk->isa, pk->has_amx_bf16 ? "true" : "false");
    if (pk->f32_gflops > 0)
      printf(",\"machine_f32_fma_peak_gflops_per_rank\":%.6g,\"prefill_f32_peak_efficiency\":%.6g", pk->f32_gflops,
             pre_gf / pk->f32_gflops);
    else
      printf(",\"machine_f32_fma_peak_gflops_per_rank\":null,\"prefill_f32_peak_efficiency\":null");
    if (pk->has_bf16_dot)
      printf(",\"machine_bf16_dot_peak_gflops_per_rank\":%.6g,\"prefill_bf16_peak_efficiency\":%.6g", pk->bf16_gflops,
             pre_gf / pk->bf16_gflops);
    else
      printf(",\"machine_bf16_dot_peak_gflops_per_rank\":null,\"prefill_bf16_peak_efficiency\":null");
    if (prof) printf(","), tpr_bench_profile_print_json(prof, w->rank);
    printf("}\n");
    return;
  }
  char b1[32];
  printf("tpr bench model: %s, tp %d, batch %lld (batched engine: %lld steps, %.1f tokens per decode step), "
         "prompt %lld, gen %lld\n", tpr_model_family_name(p->config.family), p->tp, (long long)batch,
         (long long)r->steps, per_step, (long long)P, (long long)G);
  printf("  %-34s %.3f s\n", "load (random weights)", load_s);
  printf("  %-34s %s, %s per rank (decode roofline %.1f tok/s)%s\n", "weights held", tpr_dtype_name(wdt),
         tpr_cli_bytes(weight_bytes, b1, sizeof b1), roof_tps,
         tpr_session_stats(s)->bf16_activations ? "; activations bf16" : "");
  printf("  %-34s %10s %14s %14s\n", "", "tokens/s", "per rank", "vs roofline");
  printf("  %-34s %10.1f %9.2f GF/s %13.1f%%  (sgemm %.1f GF/s)\n", "prefill", pre_tps, pre_gf,
         100 * pre_gf / rf->gemm_gflops, rf->gemm_gflops);
  const tpr_bench_peak *pk = &rf->peak;
  if (pk->f32_gflops > 0) {
    printf("  %-34s f32 FMA %.1f GF/s (%s, %d threads): prefill at %.1f%%", "ISA peak (in-register probe)",
           pk->f32_gflops, pk->isa, pk->threads, 100 * pre_gf / pk->f32_gflops);
    if (pk->has_bf16_dot)
      printf("; bf16 dot %.1f GF/s (avx512_bf16): prefill at %.1f%%", pk->bf16_gflops, 100 * pre_gf / pk->bf16_gflops);
    printf("%s\n", pk->has_amx_bf16 ? "; AMX-BF16 present (not probed)" : "");
  }
  printf("  %-34s %10.1f %9.2f GB/s %13.1f%%  (read %.1f GB/s on %d threads; %.2f GF/s)\n", "decode (weight reads)",
         dec_tps, dec_gbs, 100 * dec_gbs / rf->read_gbs, rf->read_gbs, rf->read_threads, dec_gf);
  char what[64];
  snprintf(what, sizeof what, "prefill program, T = %lld", (long long)r->prefill_program_tokens);
  printf("  %-34s %.3f GFLOP with logits at the %lld sampled rows, %.3f at every row (x%.2f)\n", what,
         r->prefill_gflop_sampled, (long long)(r->prefill_program_tokens < batch ? r->prefill_program_tokens : batch),
         r->prefill_gflop_all, r->prefill_gflop_sampled / r->prefill_gflop_all);
  printf("  %-34s %s (max over %d ranks)\n", "peak RSS per rank", tpr_cli_bytes((uint64_t)rss_max * 1024, b1, sizeof b1),
         w->size);
  char b2[32];
  snprintf(what, sizeof what, "per sequence of %lld tokens", (long long)(P + G));
  printf("  %-34s KV %s, recurrent state %s per rank\n", what, tpr_cli_bytes(kv_seq, b1, sizeof b1),
         tpr_cli_bytes(pool.state_slot_bytes, b2, sizeof b2));
  if (prof) tpr_bench_profile_print(prof, w->size > 1 ? "rank 0" : "one rank");
}

// --context: "1024,8192,32768" -> n lengths (each >= 1); false on bad text.
#define MAX_CONTEXTS 16
static bool parse_contexts(const char *text, int64_t *c, int *n) {
  *n = 0;
  for (const char *p = text; *p;) {
    char *end;
    long long v = strtoll(p, &end, 10);
    if (end == p || v < 1 || v > INT32_MAX || *n == MAX_CONTEXTS || (*end && *end != ',')) return false;
    c[(*n)++] = v;
    p = *end ? end + 1 : end;
    if (*end && !*p) return false;  // a trailing comma
  }
  return *n > 0;
}

// The long-context run: per context length C, `batch` sequences prefilled to
// C tokens (in chunks of --max-tokens-per-step) then G decoded; decode tok/s
// and what one sequence holds on a rank at C + G tokens: KV rows (softmax
// layers) and a hybrid model's recurrent state (constant in C).
static tpr_status run_contexts(tpr_session *s, tpr_world *w, const tpr_model_engine *g, int64_t batch,
                               const int64_t *ctx, int n_ctx, int64_t G, uint64_t seed, bool json) {
  const tpr_session_pool pool = tpr_session_pool_info(s);
  const double kv_token = (double)pool.bytes / (double)(pool.blocks * pool.block_size);
  const tpr_shard_plan *plan = tpr_session_plan(s);
  if (w->rank == 0 && json)
    printf("{\"command\":\"bench model\",\"family\":\"%s\",\"world_size\":%d,\"tp\":%d,\"batch\":%lld,"
           "\"gen_len\":%lld,\"contexts\":[", tpr_model_family_name(plan->config.family), w->size, plan->tp,
           (long long)batch, (long long)G);
  else if (w->rank == 0)
    printf("tpr bench model --context: %s, tp %d, batch %lld, %lld decoded tokens per sequence (memory per rank)\n"
           "  %10s %14s %14s %16s %16s %16s\n", tpr_model_family_name(plan->config.family), plan->tp,
           (long long)batch, (long long)G, "context", "prefill tok/s", "decode tok/s", "KV per seq", "state per seq",
           "total per seq");
  // A warm-up at the shortest length builds the decode program (and the
  // full-budget prefill one), so no length's decode rate pays for a build.
  bench_result warm = {0};
  int64_t shortest = ctx[0];
  for (int i = 1; i < n_ctx; i++) shortest = ctx[i] < shortest ? ctx[i] : shortest;
  TPR_CHECK(run_workload(s, w, g, batch, shortest, 2, seed, NULL, &warm));
  for (int i = 0; i < n_ctx; i++) {
    bench_result r = {0};
    TPR_CHECK(run_workload(s, w, g, batch, ctx[i], G, seed + (uint64_t)i, NULL, &r));
    const uint64_t kv = (uint64_t)(kv_token * (double)(ctx[i] + G)), st = pool.state_slot_bytes;
    const double pre = r.prefill_tokens / r.prefill_s, dec = r.decode_s > 0 ? r.decode_tokens / r.decode_s : 0;
    if (w->rank != 0) continue;
    if (json) {
      printf("%s{\"context\":%lld,\"prefill_tok_s\":%.6g,\"decode_tok_s\":%.6g,\"decode_tokens\":%lld,"
             "\"kv_bytes_per_seq_per_rank\":%llu,\"state_bytes_per_seq_per_rank\":%llu}", i ? "," : "",
             (long long)ctx[i], pre, dec, (long long)r.decode_tokens, (unsigned long long)kv, (unsigned long long)st);
      continue;
    }
    char b1[32], b2[32], b3[32];
    printf("  %10lld %14.1f %14.1f %16s %16s %16s\n", (long long)ctx[i], pre, dec, tpr_cli_bytes(kv, b1, sizeof b1),
           tpr_cli_bytes(st, b2, sizeof b2), tpr_cli_bytes(kv + st, b3, sizeof b3));
    fflush(stdout);
  }
  if (w->rank == 0 && json) printf("]}\n");
  return TPR_OK;
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

// --speculative: the prompt every sequence gets: --prompt-file's text in
// the model's tokens, or a copy-heavy one of P random tokens (a span of
// `span` repeated).
static tpr_status spec_prompt(const char *model, const char *file, int64_t P, int64_t span, int64_t vocab,
                              uint64_t seed, int32_t **ids, int64_t *len) {
  if (!file) {
    if (!(*ids = malloc((size_t)P * sizeof **ids))) return TPR_FAIL(TPR_ERR_OOM, "bench prompt");
    tpr_bench_spec_copy_prompt(*ids, P, span, vocab, seed);
    *len = P;
    return TPR_OK;
  }
  uint8_t *text = NULL;
  size_t n = 0;
  tpr_tokenizer *tok = NULL;
  size_t count = 0;
  TPR_CHECK(tpr_file_read(file, &text, &n));
  tpr_status rc = tpr_tokenizer_load(model, &tok);
  if (rc == TPR_OK) rc = tpr_tokenizer_encode(tok, (const char *)text, n, true, ids, &count);
  if (rc == TPR_OK && count == 0) rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "--prompt-file %s holds no tokens", file);
  *len = (int64_t)count;
  tpr_tokenizer_free(tok);
  free(text);
  return rc;
}

int tpr_bench_model(int argc, char **argv) {
  const char *config = NULL, *model = NULL, *context = NULL, *prompt_file = NULL;
  int64_t batch = 1, P = 32, G = 16, seed = 1, ctx[MAX_CONTEXTS], repeat = 3, span = 8;
  int n_ctx = 0;
  bool random_weights = false, json = false, profile = false;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  tpr_model_mesh mesh = TPR_MODEL_MESH_DEFAULT;
  tpr_model_engine eng = {0};
  const tpr_arg args[] = {
      {"config", TPR_ARG_STR, &config, "model config.json (with --random-weights)"},
      {"random-weights", TPR_ARG_FLAG, &random_weights, "write a random checkpoint of --config first"},
      {"model", TPR_ARG_STR, &model, "or: an existing checkpoint directory"},
      {"batch", TPR_ARG_SIZE, &batch, "sequences, run together by the batched engine (default 1)"},
      {"prompt-len", TPR_ARG_SIZE, &P, "prompt tokens per sequence (default 32)"},
      {"gen-len", TPR_ARG_SIZE, &G, "generated tokens per sequence (default 16)"},
      {"seed", TPR_ARG_INT, &seed, "seed of the weights and prompts (default 1)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object (rank 0)"},
      {"profile", TPR_ARG_FLAG, &profile, "time every op of the steps: per op kind, prefill and decode apart (rank 0's)"},
      {"context", TPR_ARG_STR, &context,
       "long-context run: lengths C1,C2,... (e.g. 1024,8192,32768): per C, prefill to C tokens, decode --gen-len; "
       "decode tok/s and KV + recurrent state bytes per sequence (replaces --prompt-len; not with --profile)"},
      {"prompt-file", TPR_ARG_STR, &prompt_file,
       "with --speculative: every sequence's prompt, this text in the model's tokens (--model; default: "
       "--prompt-len random tokens, a span of --copy-span repeated)"},
      {"copy-span", TPR_ARG_SIZE, &span, "with --speculative and no --prompt-file: the repeated span (default 8)"},
      {"repeat", TPR_ARG_SIZE, &repeat, "with --speculative: runs per mode, the best kept (default 3)"},
      TPR_MODEL_MESH_ARGS(mesh),
      TPR_MODEL_ENGINE_ARGS(eng),
      TPR_WORLD_ARGS(wo),
  };
  const char *usage = "usage: [mpirun -np N] tpr bench model (--config FILE --random-weights | --model DIR) "
                      "[--batch B --prompt-len P --gen-len G | --context C1,C2,... | --speculative lookup:n:k "
                      "[--prompt-file F]] [--profile] [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if ((!model) == (!(config && random_weights)) || batch < 1 || P < 1 || G < 1) {
    fprintf(stderr, "tpr bench model: give --config FILE --random-weights or --model DIR, and positive "
                    "--batch/--prompt-len/--gen-len\n%s\n", usage);
    return 2;
  }
  if (context && (!parse_contexts(context, ctx, &n_ctx) || profile)) {
    fprintf(stderr, "tpr bench model: --context %s: %s\n%s\n", context,
            profile ? "not with --profile" : "give positive lengths separated by commas, at most 16", usage);
    return 2;
  }
  tpr_spec spec = {0};
  if (tpr_cli_speculative(&eng, &spec) != TPR_OK || ((prompt_file || repeat != 3) && !spec.kind) ||
      (spec.kind && (n_ctx || profile)) || repeat < 1 || span < 1) {
    fprintf(stderr, "tpr bench model: %s\n%s\n",
            eng.speculative && !spec.kind && strcmp(eng.speculative, "off") ? tpr_last_error()
            : spec.kind ? "--speculative: not with --context or --profile; --repeat and --copy-span >= 1"
                        : "--prompt-file and --repeat go with --speculative",
            usage);
    return 2;
  }
  int32_t *spec_ids = NULL;
  int64_t spec_len = 0;
  if (spec.kind && prompt_file && !model) {
    fprintf(stderr, "tpr bench model: --prompt-file needs --model (its tokenizer)\n%s\n", usage);
    return 2;
  }
  for (int i = 0; i < n_ctx; i++) P = i == 0 || ctx[i] > P ? ctx[i] : P;  // the longest: max_seq
  if (spec.kind && prompt_file) {  // every rank reads it: the prompt's length sizes max_seq
    if (spec_prompt(model, prompt_file, P, span, 0, (uint64_t)seed, &spec_ids, &spec_len) != TPR_OK) {
      fprintf(stderr, "tpr bench model: %s\n", tpr_last_error());
      return 2;
    }
    P = spec_len;
  }
  const int64_t tokens[2] = {batch, P + G};  // every sequence's prompt and generated tokens: the engine's rows
  if (!tpr_cli_sizes_ok("tpr bench model", "--batch x (--prompt-len + --gen-len)", 2, tokens, INT32_MAX)) return 2;
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
  if (!eng.max_tokens_per_step)  // --context: chunked prefill, 2048 tokens a step
    eng.max_tokens_per_step = n_ctx ? 2048 : batch * P > 256 ? batch * P : 256;
  if (rc == TPR_OK) rc = tpr_cli_open_engine_model(&w, model, &mesh, P + G + 1, &eng, &dbg, &s);
  roofline rf = {0};
  bench_result r = {0};
  tpr_bench_profile *prof = profile ? calloc(1, sizeof *prof) : NULL;
  if (rc == TPR_OK && profile && !prof) rc = TPR_FAIL(TPR_ERR_OOM, "bench model --profile");
  int64_t peak_before_probe = 0, *rss = calloc((size_t)(w.size > 0 ? w.size : 1), sizeof *rss);
  if (rc == TPR_OK) rc = tpr_comm_barrier(w.host);
  if (rc == TPR_OK) {
    rf.gemm_gflops = tpr_cli_sgemm_gflops();
    int threads = tpr_backend_cpu_threads(w.cpu);
    peak_before_probe = peak_rss_kb();
    measure_read(threads > 0 ? threads : omp_get_max_threads(), &rf);
    tpr_bench_peak_measure(threads > 0 ? threads : omp_get_max_threads(), &rf.peak);
    if (!reset_peak_rss()) peak_before_probe = 0;  // the probe's buffer stays in the peak
    if (spec.kind) {
      if (!spec_ids) rc = spec_prompt(model, NULL, P, span, tpr_session_config(s)->vocab_size, (uint64_t)seed,
                                      &spec_ids, &spec_len);
      tpr_bench_spec_opts so = {.spec = spec, .batch = batch, .gen_len = G, .repeat = repeat, .prompt = spec_ids,
                                .prompt_len = spec_len, .prompt_what = prompt_file ? prompt_file : "copy-heavy, random",
                                .json = json};
      if (rc == TPR_OK) rc = tpr_bench_spec(s, &w, &eng, &so);
      free(spec_ids), free(rss), free(prof);
      tpr_session_close(s);
      if (model == dir && w.rank == 0) remove_flat_dir(dir);
      if (rc != TPR_OK) return tpr_world_fail(&w, "bench model");
      tpr_world_finish(&w);
      return 0;
    }
    if (n_ctx) {
      rc = run_contexts(s, &w, &eng, batch, ctx, n_ctx, G, (uint64_t)seed, json);
      free(rss), free(prof);
      tpr_session_close(s);
      if (model == dir && w.rank == 0) remove_flat_dir(dir);
      if (rc != TPR_OK) return tpr_world_fail(&w, "bench model");
      tpr_world_finish(&w);
      return 0;
    }
    rc = run_workload(s, &w, &eng, batch, P, G, (uint64_t)seed, prof, &r);
  }
  if (rc == TPR_OK && w.rank == 0)
    rc = count_prefill_flops(s, batch, P, eng.max_tokens_per_step, &r);
  int64_t mine = peak_rss_kb();
  if (peak_before_probe > mine) mine = peak_before_probe;
  if (rc == TPR_OK) rc = tpr_comm_all_gather(w.host, &mine, rss, 1, TPR_I64);
  if (rc == TPR_OK && w.rank == 0) {
    tpr_shard_plan plan;
    tpr_model_config cfg = *tpr_session_config(s);
    rc = tpr_shard_plan_build(&cfg, w.size, 1, w.size, 1, TPR_F32, &plan);
    if (rc == TPR_OK) print_result(&w, s, &plan, &rf, &r, batch, P, G, tpr_session_stats(s)->load_s,
                                  tpr_session_stats(s)->matrix_dtype, tpr_session_stats(s)->weight_bytes, rss, prof, json);
    if (rc == TPR_OK) tpr_shard_plan_free(&plan);
  }
  free(rss);
  free(prof);
  tpr_session_close(s);  // unmaps the checkpoint before it is removed
  s = NULL;
  if (model == dir && w.rank == 0) remove_flat_dir(dir);
  tpr_session_close(s);
  if (rc != TPR_OK) return tpr_world_fail(&w, "bench model");
  tpr_world_finish(&w);
  return 0;
}
