// tpr bench serve --shared-prefix S: what the prefix cache does for TTFT.
// Every prompt is one S-token system prompt then P tokens of its own (a
// client's question). The same server is started twice, with the prefix
// cache and with --no-prefix-cache; each time, warm-up requests that share
// nothing compile the programs without filling the cache, COLD requests run
// one at a time, each with a system prompt of its own (first requests:
// nothing of their prompts is cached yet; the last one's system prompt is
// the clients'), then N clients send K requests each (the later ones: the
// system prompt's whole blocks are cached from the last cold one). The
// median of the cold TTFTs is "the first request's": one request alone is
// too noisy a figure on a shared machine. Both runs send the same prompts.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "launch/bench_serve_impl.h"

#define COLD 3

typedef struct prefix_run {
  bool ok;
  double first_ttft_ms;
  serve_result later;  // the clients' requests
  double queried, hits, blocks;  // the server's prefix cache counters at the end
} prefix_run;

// Serves the workload once; false when the server did not start or a request failed.
static bool run_once(const settings *s, bool cache, prefix_run *out) {
  settings c = *s;
  c.no_prefix_cache = !cache;
  tpr_proc server;
  out->later = (serve_result){.stop.code = -1};
  if (!bs_start_server(&c, &server, &out->later)) return false;
  const int port = out->later.port;
  const int64_t n = s->clients * s->requests, vocab = bs_model_vocab(s);
  // Warm-up prompts of the same length that share nothing with the others.
  settings w = c;
  w.shared_prefix = 0, w.prompt_len = s->shared_prefix + s->prompt_len, w.seed = s->seed + 1000003;
  char **warm = vocab > 0 && s->warmup > 0 ? bs_request_bodies(&w, vocab, s->warmup) : NULL;
  char **bodies = vocab > 0 ? bs_request_bodies(&c, vocab, 1 + n) : NULL;
  tpr_load_request *reqs = calloc((size_t)(1 + n), sizeof *reqs);
  bool ok = bodies && reqs && (warm || s->warmup == 0);
  if (!ok && vocab > 0) fprintf(stderr, CMD ": out of memory for %lld requests\n", (long long)n + 1);
  ok = ok && (s->warmup == 0 || bs_warm_up(&w, port, warm));
  if (ok) {
    bs_allow_sockets(s->clients);
    double cold[COLD];
    for (int k = 0; ok && k < COLD; k++) {  // the last one has the clients' system prompt
      settings ck = c;
      ck.prefix_stream = (uint64_t)(COLD - 1 - k);
      char **b = bs_request_bodies(&ck, vocab, 1);
      tpr_load_request r = {0};
      tpr_load_opts first = bs_load_opts(&ck, port, 1, 1, b);
      ok = b && tpr_load_run(&first, &r) && !r.error[0] && r.n_text > 0;
      if (!ok) fprintf(stderr, CMD ": a first request failed: %s\n", r.error);
      cold[k] = ok ? (r.text_times[0] - r.t_start) * 1e3 : NAN;
      tpr_load_requests_free(&r, 1);
      bs_free_bodies(b, 1);
    }
    for (int i = 0; ok && i < COLD; i++)  // the median
      for (int k = i + 1; k < COLD; k++)
        if (cold[k] < cold[i]) { double t = cold[i]; cold[i] = cold[k]; cold[k] = t; }
    out->first_ttft_ms = cold[COLD / 2];
    tpr_load_opts later = bs_load_opts(&c, port, (int)s->clients, (int)s->requests, bodies + 1);
    ok = ok && tpr_load_run(&later, reqs + 1) && bs_summarize_requests(&c, reqs + 1, n, &out->later) &&
         out->later.failed == 0;
    ok = ok && bs_metric(port, "tpr_prefix_cache_queries_total", &out->queried) &&
         bs_metric(port, "tpr_prefix_cache_hits_total", &out->hits) &&
         bs_metric(port, "tpr_prefix_cache_blocks", &out->blocks);
  }
  tpr_load_requests_free(reqs, reqs ? 1 + n : 0);
  free(reqs);
  bs_free_bodies(bodies, 1 + n);
  bs_free_bodies(warm, s->warmup);
  out->later.stop = tpr_proc_stop_server(&server, s->stop_timeout_s);
  fprintf(stderr, CMD ": the server (%s) exited with status %d\n", cache ? "prefix cache" : "--no-prefix-cache",
          out->later.stop.code);
  out->ok = ok && out->later.stop.code == 0 && !out->later.stop.killed;
  return out->ok;
}

static void add_run(cJSON *j, const char *name, const prefix_run *r) {
  cJSON *o = cJSON_AddObjectToObject(j, name);
  cJSON_AddNumberToObject(o, "first_ttft_ms", r->first_ttft_ms);
  cJSON_AddNumberToObject(o, "later_ttft_ms_p50", r->later.ttft_ms.p50);
  cJSON_AddNumberToObject(o, "later_ttft_ms_p99", r->later.ttft_ms.p99);
  cJSON_AddNumberToObject(o, "later_ttft_ms_mean", r->later.ttft_ms.mean);
  cJSON_AddNumberToObject(o, "later_over_first_p50", r->later.ttft_ms.p50 / r->first_ttft_ms);
  cJSON_AddNumberToObject(o, "later_output_tok_s", r->later.output_tok_s);
  cJSON_AddNumberToObject(o, "prefix_cache_queries", r->queried);
  cJSON_AddNumberToObject(o, "prefix_cache_hits", r->hits);
  cJSON_AddNumberToObject(o, "prefix_cache_blocks", r->blocks);
}

static bool print_json(const settings *s, const prefix_run *on, const prefix_run *off, const char *cpu) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "command", "bench serve --shared-prefix");
  cJSON_AddStringToObject(j, "model", s->model);
  cJSON_AddStringToObject(j, "cpu", cpu);
  cJSON_AddNumberToObject(j, "np", (double)s->np);
  cJSON_AddNumberToObject(j, "shared_prefix", (double)s->shared_prefix);
  cJSON_AddNumberToObject(j, "prompt_len", (double)s->prompt_len);
  cJSON_AddNumberToObject(j, "max_tokens", (double)(s->gen_len + 1));
  cJSON_AddNumberToObject(j, "clients", (double)s->clients);
  cJSON_AddNumberToObject(j, "requests", (double)s->requests);
  add_run(j, "prefix_cache", on);
  add_run(j, "no_prefix_cache", off);
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!text) return false;
  printf("%s\n", text);
  free(text);
  return true;
}

static void row(const char *what, double a, double b, const char *fmt) {
  char x[32], y[32];
  printf("    %-40s %16s %18s\n", what, bs_num(a, fmt, x, sizeof x), bs_num(b, fmt, y, sizeof y));
}

static void print_table(const settings *s, const prefix_run *on, const prefix_run *off, const char *cpu) {
  printf("tpr bench serve --shared-prefix: %s, np %lld, prompts of %lld shared + %lld own tokens, %lld generated; "
         "%d cold requests one at a time, then %lld clients x %lld\n",
         s->model, (long long)s->np, (long long)s->shared_prefix, (long long)s->prompt_len, (long long)s->gen_len + 1, COLD,
         (long long)s->clients, (long long)s->requests);
  printf("  cpu: %s\n", cpu);
  printf("    %-40s %16s %18s\n", "", "prefix cache", "--no-prefix-cache");
  row("TTFT of a first request (median of 3), ms", on->first_ttft_ms, off->first_ttft_ms, "%.2f");
  row("TTFT of the later requests p50, ms", on->later.ttft_ms.p50, off->later.ttft_ms.p50, "%.2f");
  row("TTFT of the later requests p99, ms", on->later.ttft_ms.p99, off->later.ttft_ms.p99, "%.2f");
  row("TTFT of the later requests mean, ms", on->later.ttft_ms.mean, off->later.ttft_ms.mean, "%.2f");
  row("later p50 / first", on->later.ttft_ms.p50 / on->first_ttft_ms, off->later.ttft_ms.p50 / off->first_ttft_ms,
      "%.3f");
  row("later output tokens/s (aggregate)", on->later.output_tok_s, off->later.output_tok_s, "%.1f");
  row("prefix cache hit tokens (/metrics)", on->hits, off->hits, "%.0f");
  row("prefix cache queried tokens (/metrics)", on->queried, off->queried, "%.0f");
  row("prefix cache blocks at the end", on->blocks, off->blocks, "%.0f");
  char x[32];
  printf("  %-42s %16s\n", "later p50 TTFT, cache / no cache", bs_num(on->later.ttft_ms.p50 / off->later.ttft_ms.p50, "%.3f", x, sizeof x));
}

int tpr_bench_serve_prefix(settings *s) {
  prefix_run on = {0}, off = {0};
  bool ok = run_once(s, false, &off) && run_once(s, true, &on);
  if (!ok) return 1;
  char cpu[256];
  bs_cpu_model(cpu, sizeof cpu);
  if (s->json) return print_json(s, &on, &off, cpu) ? 0 : 1;
  print_table(s, &on, &off, cpu);
  return 0;
}
