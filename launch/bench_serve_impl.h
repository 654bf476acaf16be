// The pieces of tpr bench serve (bench_serve.c) that its shared-prefix and
// JSON-mode workloads (bench_serve_prefix.c, bench_serve_json.c) use too: the settings, the server's start,
// the request bodies, the clients' summary and the report's rows.
#ifndef TPR_BENCH_SERVE_IMPL_H
#define TPR_BENCH_SERVE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "launch/args.h"
#include "launch/bench_serve_client.h"
#include "launch/bench_serve_proc.h"

#define CMD "tpr bench serve"
#define MAX_CLIENTS 4096
#define MAX_ERRORS_SHOWN 20

typedef struct settings {
  const char *model;
  int64_t clients, prompt_len, gen_len, np, requests, seed, max_batch, warmup, repeat;
  int64_t shared_prefix;  // > 0: the shared-prefix workload (bench_serve_prefix.c)
  bool no_prefix_cache;   // the server runs with --no-prefix-cache
  uint64_t prefix_stream;  // which shared prefix: 0 the measured one, others a cold request's own
  bool json_mode;          // the JSON-mode workload (bench_serve_json.c)
  bool json_body;          // the bodies ask for response_format json_object (no ignore_eos: they may end early)
  double start_timeout_s, request_timeout_s, stop_timeout_s;
  tpr_arg_list server_args, baseline_args;
  bool json;
  char tpr[4096];
  const char *mpirun;
  char dir[64];  // temporary: the port file and the logs
} settings;

typedef struct dist {
  int64_t n;
  double mean, p50, p99;  // NAN when n = 0
} dist;

typedef struct serve_result {
  int port;
  double start_s;  // the server's start, until it listened
  int64_t answered, failed, completion_tokens, text_chunks;
  double duration_s, output_tok_s, requests_per_s;
  dist ttft_ms, itl_ms;
  double client_cpu_s;  // this process's CPU time while the clients ran
  int64_t engine_steps;  // the server's engine steps while the clients ran (/metrics); -1: unknown
  double engine_step_s;  // rank 0's time inside those steps
  char errors[MAX_ERRORS_SHOWN][sizeof ((tpr_load_request *)0)->error + 32];  // the first failures
  tpr_proc_stop stop;
} serve_result;

// The server's --max-batch: room for every client at once.
static inline int64_t server_max_batch(const settings *s) { return s->max_batch > s->clients ? s->max_batch : s->clients; }

const char *bs_path_in(const settings *s, const char *name, char *buf, size_t cap);
// n request bodies (bench_serve.c says which prompts); NULL when out of memory.
char **bs_request_bodies(const settings *s, int64_t vocab, int64_t n);
void bs_free_bodies(char **b, int64_t n);
tpr_load_opts bs_load_opts(const settings *s, int port, int clients, int per_client, char **bodies);
bool bs_warm_up(const settings *s, int port, char **bodies);
// Starts tpr serve (s->server_args, --no-prefix-cache when s->no_prefix_cache);
// false with its log's end printed when it does not listen.
bool bs_start_server(const settings *s, tpr_proc *server, serve_result *out);
int64_t bs_model_vocab(const settings *s);
void bs_allow_sockets(int64_t clients);
// TTFT and ITL of the answered requests into out; failures counted and shown.
bool bs_summarize_requests(const settings *s, const tpr_load_request *r, int64_t n, serve_result *out);
// The value of a counter or gauge in the server's GET /metrics; false when it cannot tell.
bool bs_metric(int port, const char *name, double *out);
// The server's tpr_engine_steps_total and tpr_engine_step_seconds_total; false when it cannot tell.
bool bs_engine_counters(int port, int64_t *steps, double *seconds);
// The shared-prefix workload (bench_serve_prefix.c); the exit code.
int tpr_bench_serve_prefix(settings *s);
// The JSON-mode workload (bench_serve_json.c); the exit code.
int tpr_bench_serve_json(settings *s);
const char *bs_num(double v, const char *fmt, char *buf, size_t cap);
void bs_print_dist_row(const char *what, const dist *d);
void bs_cpu_model(char *buf, size_t cap);

#endif
