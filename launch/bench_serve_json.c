// tpr bench serve --json-mode: what structured output's token mask costs a
// decode step. One server answers the same N x K chat requests (a user
// message of P words) plain (ignore_eos) and with response_format
// {"type": "json_object"}, in ROUNDS rounds of alternating order (rank 0 computes a grammar mask over the
// vocabulary for each sequence at each step, token_constraint.h). Both
// kinds get W warm-up requests first. Per-token latency is the ITL of the
// streamed chunks and the server's engine step time (tpr_engine_steps_total
// and tpr_engine_step_seconds_total over each kind's requests: the mask is
// computed inside the step); a JSON answer may end before G + 1 tokens when
// its object closes, so the figures are per token and per step, never per
// request. The mask's own time (tpr_grammar_mask_seconds_total) over the
// step time is its share, a figure the machine's noise moves much less
// than the difference of two step times.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "launch/bench_serve_impl.h"

#define ROUNDS 2  // plain then JSON, then JSON then plain: neither kind always first on a drifting machine

typedef struct json_run {
  serve_result r;
  tpr_load_request *reqs;  // ROUNDS x N x K
  int64_t steps;
  double step_s, step_ms;  // the engine's time in its steps while this kind ran; per step
  double mask_s, mask_ms;  // of which in grammar masks (the server's tpr_grammar_mask_seconds_total); per step
} json_run;

// One round of a kind's N x K requests against the running server; false
// when they could not run (failed requests are counted when summarized).
static bool measure(const settings *s, int port, char **bodies, json_run *out, int round) {
  const int64_t n = s->clients * s->requests;
  tpr_load_opts lo = bs_load_opts(s, port, (int)s->clients, (int)s->requests, bodies);
  int64_t steps0 = 0, steps1 = 0;
  double sec0 = 0, sec1 = 0, mask0 = 0, mask1 = 0;
  bool counted = bs_engine_counters(port, &steps0, &sec0) && bs_metric(port, "tpr_grammar_mask_seconds_total", &mask0);
  bool ok = tpr_load_run(&lo, out->reqs + round * n);
  counted = counted && bs_engine_counters(port, &steps1, &sec1) &&
            bs_metric(port, "tpr_grammar_mask_seconds_total", &mask1);
  if (counted && out->steps >= 0)
    out->steps += steps1 - steps0, out->step_s += sec1 - sec0, out->mask_s += mask1 - mask0;
  else out->steps = -1;
  return ok;
}

static bool run(const settings *s, json_run *plain, json_run *json) {
  tpr_proc server;
  serve_result started = {.stop.code = -1};
  if (!bs_start_server(s, &server, &started)) return false;
  const int port = started.port;
  const int64_t n = s->clients * s->requests, vocab = bs_model_vocab(s);
  settings js = *s;
  js.json_body = true;
  char **pb = vocab > 0 ? bs_request_bodies(s, vocab, n + s->warmup) : NULL;
  char **jb = vocab > 0 ? bs_request_bodies(&js, vocab, n + s->warmup) : NULL;
  plain->reqs = calloc((size_t)(ROUNDS * n), sizeof *plain->reqs);
  json->reqs = calloc((size_t)(ROUNDS * n), sizeof *json->reqs);
  bool ok = pb && jb && plain->reqs && json->reqs;
  if (!ok && vocab > 0) fprintf(stderr, CMD ": out of memory for %lld requests\n", (long long)n);
  if (ok && s->warmup) fprintf(stderr, CMD ": %lld warm-up requests of each kind\n", (long long)s->warmup);
  ok = ok && bs_warm_up(s, port, pb + n) && bs_warm_up(&js, port, jb + n);
  if (ok) bs_allow_sockets(s->clients);
  for (int round = 0; ok && round < ROUNDS; round++)
    ok = round % 2 ? measure(&js, port, jb, json, round) && measure(s, port, pb, plain, round)
                   : measure(s, port, pb, plain, round) && measure(&js, port, jb, json, round);
  for (int k = 0; ok && k < 2; k++) {
    json_run *x = k ? json : plain;
    x->r.port = port;
    ok = bs_summarize_requests(k ? &js : s, x->reqs, ROUNDS * n, &x->r);
    x->step_ms = x->steps > 0 ? 1e3 * x->step_s / (double)x->steps : NAN;
    x->mask_ms = x->steps > 0 ? 1e3 * x->mask_s / (double)x->steps : NAN;
    if (ok)
      fprintf(stderr, CMD ": %s: %lld answered, %lld failed, %lld tokens\n", k ? "json_object" : "plain",
              (long long)x->r.answered, (long long)x->r.failed, (long long)x->r.completion_tokens);
    ok = ok && x->r.failed == 0;
  }
  tpr_load_requests_free(plain->reqs, plain->reqs ? ROUNDS * n : 0);
  tpr_load_requests_free(json->reqs, json->reqs ? ROUNDS * n : 0);
  free(plain->reqs), free(json->reqs);
  bs_free_bodies(pb, n + s->warmup);
  bs_free_bodies(jb, n + s->warmup);
  const tpr_proc_stop stop = tpr_proc_stop_server(&server, s->stop_timeout_s);
  fprintf(stderr, CMD ": the server exited with status %d\n", stop.code);
  return ok && stop.code == 0 && !stop.killed;
}

static void add_run(cJSON *j, const char *name, const json_run *r) {
  cJSON *o = cJSON_AddObjectToObject(j, name);
  cJSON_AddNumberToObject(o, "requests", (double)r->r.answered);
  cJSON_AddNumberToObject(o, "completion_tokens", (double)r->r.completion_tokens);
  cJSON_AddNumberToObject(o, "itl_ms_p50", r->r.itl_ms.p50);
  cJSON_AddNumberToObject(o, "itl_ms_p99", r->r.itl_ms.p99);
  cJSON_AddNumberToObject(o, "itl_ms_mean", r->r.itl_ms.mean);
  cJSON_AddNumberToObject(o, "ttft_ms_p50", r->r.ttft_ms.p50);
  cJSON_AddNumberToObject(o, "server_engine_steps", (double)r->steps);
  cJSON_AddNumberToObject(o, "server_engine_step_ms", r->step_ms);
  cJSON_AddNumberToObject(o, "server_mask_ms_per_step", r->mask_ms);
}

static bool print_json(const settings *s, const json_run *p, const json_run *j, const char *cpu) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "command", "bench serve --json-mode");
  cJSON_AddStringToObject(o, "model", s->model);
  cJSON_AddStringToObject(o, "cpu", cpu);
  cJSON_AddNumberToObject(o, "np", (double)s->np);
  cJSON_AddNumberToObject(o, "prompt_len", (double)s->prompt_len);
  cJSON_AddNumberToObject(o, "max_tokens", (double)(s->gen_len + 1));
  cJSON_AddNumberToObject(o, "clients", (double)s->clients);
  cJSON_AddNumberToObject(o, "requests", (double)s->requests);
  cJSON_AddNumberToObject(o, "rounds", ROUNDS);
  add_run(o, "plain", p);
  add_run(o, "json_object", j);
  cJSON_AddNumberToObject(o, "itl_p50_ratio", j->r.itl_ms.p50 / p->r.itl_ms.p50);
  cJSON_AddNumberToObject(o, "itl_mean_ratio", j->r.itl_ms.mean / p->r.itl_ms.mean);
  cJSON_AddNumberToObject(o, "engine_step_ratio", j->step_ms / p->step_ms);
  cJSON_AddNumberToObject(o, "mask_share_of_step", j->mask_s / j->step_s);
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!text) return false;
  printf("%s\n", text);
  free(text);
  return true;
}

static void row(const char *what, double a, double b, const char *fmt) {
  char x[32], y[32], z[32];
  printf("    %-36s %14s %14s %10s\n", what, bs_num(a, fmt, x, sizeof x), bs_num(b, fmt, y, sizeof y),
         bs_num(b / a, "%.3f", z, sizeof z));
}

static void print_table(const settings *s, const json_run *p, const json_run *j, const char *cpu) {
  printf("tpr bench serve --json-mode: %s, np %lld, %lld clients x %lld, prompt %lld, at most %lld generated; the same "
         "prompts plain and with response_format json_object, %d rounds\n",
         s->model, (long long)s->np, (long long)s->clients, (long long)s->requests, (long long)s->prompt_len,
         (long long)s->gen_len + 1, ROUNDS);
  printf("  cpu: %s\n", cpu);
  printf("    %-36s %14s %14s %10s\n", "", "plain", "json_object", "json/plain");
  row("completion tokens", (double)p->r.completion_tokens, (double)j->r.completion_tokens, "%.0f");
  row("ITL p50, ms", p->r.itl_ms.p50, j->r.itl_ms.p50, "%.3f");
  row("ITL p99, ms", p->r.itl_ms.p99, j->r.itl_ms.p99, "%.3f");
  row("ITL mean, ms", p->r.itl_ms.mean, j->r.itl_ms.mean, "%.3f");
  row("TTFT p50, ms", p->r.ttft_ms.p50, j->r.ttft_ms.p50, "%.3f");
  row("engine steps (server /metrics)", (double)p->steps, (double)j->steps, "%.0f");
  row("engine step time, ms (rank 0)", p->step_ms, j->step_ms, "%.3f");
  row("of which grammar masks, ms per step", p->mask_ms, j->mask_ms, "%.4f");
  char x[32];
  printf("  %-38s %14s   (the mask's share of a json_object step)\n", "grammar mask / step time",
         bs_num(j->mask_s / j->step_s, "%.4f", x, sizeof x));
}

int tpr_bench_serve_json(settings *s) {
  json_run plain = {0}, json = {0};
  if (!run(s, &plain, &json)) return 1;
  char cpu[256];
  bs_cpu_model(cpu, sizeof cpu);
  if (s->json) return print_json(s, &plain, &json, cpu) ? 0 : 1;
  print_table(s, &plain, &json, cpu);
  return 0;
}
