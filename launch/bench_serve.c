// tpr bench serve: starts tpr serve (under mpirun for np > 1), drives it with
// N concurrent streaming clients over TCP (bench_serve_client.c), stops it,
// then runs tpr bench model on the same mesh, batch and prompts, and prints
// both side by side. Serving's figures follow vLLM's benchmark_serving: TTFT
// from a request's start to its first chunk with text, ITL the gaps between
// a request's chunks with text, aggregate output tok/s the completion tokens
// of every answered request over the span from the first request's start to
// the last response's end. The baseline's end-to-end tok/s is the tokens it
// generated over the time of its steps (prefill + decode), the figure a
// server with no overhead would reach on the same batch.
#include "launch/bench_serve.h"
#include "launch/bench_serve_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "launch/args.h"
#include "launch/bench_serve_client.h"
#include "launch/bench_serve_proc.h"
#include "launch/cli_util.h"
#include "launch/world.h"
#include "runtime/file_io.h"
#include "runtime/rng.h"
#include "shard/model_config.h"

typedef struct baseline_result {
  bool ok;
  int code;  // tpr bench model's exit status
  double prefill_tok_s, decode_tok_s, prefill_s, decode_s, end_to_end_tok_s;
  int64_t generated_tokens, steps;
} baseline_result;


const char *bs_path_in(const settings *s, const char *name, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/%s", s->dir, name);
  return buf;
}

// ---- statistics ----------------------------------------------------------------------------------------

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// numpy.percentile's default: linear between the two nearest ranks (x sorted).
static double percentile(const double *x, int64_t n, double q) {
  double pos = q / 100 * (double)(n - 1);
  int64_t lo = (int64_t)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
  return x[lo] + (x[hi] - x[lo]) * (pos - (double)lo);
}

static dist summarize(double *x, int64_t n) {
  dist d = {.n = n, .mean = NAN, .p50 = NAN, .p99 = NAN};
  if (n == 0) return d;
  qsort(x, (size_t)n, sizeof *x, cmp_double);
  double sum = 0;
  for (int64_t i = 0; i < n; i++) sum += x[i];
  d.mean = sum / (double)n, d.p50 = percentile(x, n, 50), d.p99 = percentile(x, n, 99);
  return d;
}

// TTFT and ITL (ms) of the answered requests; failures counted and shown.
bool bs_summarize_requests(const settings *s, const tpr_load_request *r, int64_t n, serve_result *out) {
  double *ttft = malloc((size_t)n * sizeof *ttft), *itl = NULL;
  int64_t n_itl = 0, gaps = 0;
  for (int64_t i = 0; i < n; i++) gaps += r[i].n_text > 1 ? r[i].n_text - 1 : 0;
  itl = malloc((size_t)(gaps ? gaps : 1) * sizeof *itl);
  if (!ttft || !itl) {
    free(ttft), free(itl);
    fprintf(stderr, CMD ": out of memory summarizing %lld requests\n", (long long)n);
    return false;
  }
  double first_start = INFINITY, last_end = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    if (r[i].t_start < first_start) first_start = r[i].t_start;
    if (r[i].t_end > last_end) last_end = r[i].t_end;
    if (r[i].error[0]) {
      if (out->failed < MAX_ERRORS_SHOWN) {
        char *e = out->errors[out->failed];
        snprintf(e, sizeof out->errors[0], "request %lld (client %lld): %s", (long long)i,
                 (long long)(i % s->clients), r[i].error);
        fprintf(stderr, CMD ": %s\n", e);
      }
      out->failed++;
      continue;
    }
    ttft[out->answered++] = (r[i].text_times[0] - r[i].t_start) * 1e3;
    for (int64_t k = 1; k < r[i].n_text; k++) itl[n_itl++] = (r[i].text_times[k] - r[i].text_times[k - 1]) * 1e3;
    out->completion_tokens += r[i].completion_tokens;
    out->text_chunks += r[i].n_text;
  }
  if (out->failed > MAX_ERRORS_SHOWN)
    fprintf(stderr, CMD ": ... and %lld more failed requests\n", (long long)(out->failed - MAX_ERRORS_SHOWN));
  out->duration_s = n ? last_end - first_start : 0;
  out->output_tok_s = (double)out->completion_tokens / out->duration_s;
  out->requests_per_s = (double)out->answered / out->duration_s;
  out->ttft_ms = summarize(ttft, out->answered);
  out->itl_ms = summarize(itl, n_itl);
  free(ttft), free(itl);
  return true;
}

// ---- the server and the clients ------------------------------------------------------------------------

void bs_free_bodies(char **b, int64_t n) {
  for (int64_t i = 0; b && i < n; i++) free(b[i]);
  free(b);
}

// The request bodies: client c's k-th request asks with prompt k x clients + c,
// drawn as tpr bench model draws its batch (P ids from one splitmix64 stream
// of --seed, modulo the vocabulary), so the first round holds the baseline's
// very prompts; the warm-up requests' prompts come after all of them. With
// --shared-prefix S every prompt begins with the same S ids (a stream of its
// own), then its own P. With --json-mode the bodies are chat requests (one
// user message of P words from the same stream), and the JSON ones ask for
// response_format json_object instead of ignore_eos (which a structured
// answer refuses).
char **bs_request_bodies(const settings *s, int64_t vocab, int64_t n) {
  char **bodies = calloc((size_t)n, sizeof *bodies);
  tpr_rng rng = {(uint64_t)s->seed};
  size_t cap = (size_t)(s->shared_prefix + s->prompt_len) * 12 + 256;
  for (int64_t i = 0; bodies && i < n; i++) {
    char *b = bodies[i] = malloc(cap);
    if (!b) break;
    size_t len = 0;
    if (s->json_mode) {  // a chat message of P words (the JSON-mode workload: response_format is chat's)
      static const char *const words[16] = {"the", "list", "of", "cities", "with", "their", "names", "and",
                                            "population", "as", "a", "JSON", "object", "please", "give", "me"};
      len = (size_t)snprintf(b, cap, "{\"messages\":[{\"role\":\"user\",\"content\":\"");
      for (int64_t t = 0; t < s->prompt_len; t++)
        len += (size_t)snprintf(b + len, cap - len, "%s%s", t ? " " : "", words[tpr_rng_next(&rng) % 16]);
      len += (size_t)snprintf(b + len, cap - len, "\"}");
    } else {
      len = (size_t)snprintf(b, cap, "{\"prompt\":[");
      tpr_rng shared = {(uint64_t)s->seed ^ 0x5ea4edull ^ (s->prefix_stream << 32)};  // the same for every body
      for (int64_t t = 0; t < s->shared_prefix + s->prompt_len; t++)
        len += (size_t)snprintf(b + len, cap - len, "%s%llu", t ? "," : "",
                                (unsigned long long)(tpr_rng_next(t < s->shared_prefix ? &shared : &rng) %
                                                     (uint64_t)vocab));
    }
    snprintf(b + len, cap - len, "],\"max_tokens\":%lld,\"temperature\":0,\"stream\":true,%s,"
             "\"stream_options\":{\"include_usage\":true}}",
             (long long)(s->gen_len + 1),
             s->json_body ? "\"response_format\":{\"type\":\"json_object\"}" : "\"ignore_eos\":true");
  }
  for (int64_t i = 0; bodies && i < n; i++)
    if (!bodies[i]) {
      bs_free_bodies(bodies, n);
      return NULL;
    }
  return bodies;
}

// `[mpirun -np R --oversubscribe] tpr WORDS... --model DIR`: the server and
// the baseline run on the same ranks and checkpoint.
static void push_tpr_command(const settings *s, tpr_proc_argv *a, const char *const *words) {
  tpr_proc_push_launcher(a, (int)s->np, s->mpirun, s->tpr);
  for (int i = 0; words[i]; i++) tpr_proc_push(a, words[i]);
  tpr_proc_push(a, "--model");
  tpr_proc_push(a, s->model);
}

tpr_load_opts bs_load_opts(const settings *s, int port, int clients, int per_client, char **bodies) {
  return (tpr_load_opts){.host = "127.0.0.1", .port = port,
                         .path = s->json_mode ? "/v1/chat/completions" : "/v1/completions", .clients = clients,
                         .requests_per_client = per_client, .bodies = bodies,
                         .expect_completion_tokens = s->json_body ? -(s->gen_len + 1) : s->gen_len + 1,
                         .idle_timeout_s = s->request_timeout_s};
}

// Requests sent one at a time before the measured ones, as vLLM's
// benchmark_serving sends one first: a setup that cannot answer stops here,
// and the measurement does not include the server's start (its port file is
// written once rank 0 listens, maybe before every rank is ready).
bool bs_warm_up(const settings *s, int port, char **bodies) {
  if (s->warmup == 0) return true;
  tpr_load_request *w = calloc((size_t)s->warmup, sizeof *w);
  tpr_load_opts lo = bs_load_opts(s, port, 1, (int)s->warmup, bodies);
  bool ok = w && tpr_load_run(&lo, w);
  for (int64_t i = 0; ok && i < s->warmup; i++)
    if (w[i].error[0]) {
      fprintf(stderr, CMD ": warm-up request %lld failed: %s\n", (long long)i, w[i].error);
      ok = false;
    }
  tpr_load_requests_free(w, w ? s->warmup : 0);
  free(w);
  return ok;
}

bool bs_start_server(const settings *s, tpr_proc *server, serve_result *out) {
  char port_file[128], log[128], line[8192];
  bs_path_in(s, "port", port_file, sizeof port_file);
  bs_path_in(s, "server.log", log, sizeof log);
  unlink(port_file);  // an earlier run's (--repeat)
  tpr_proc_argv a = {0};
  push_tpr_command(s, &a, (const char *const[]){"serve", NULL});
  tpr_proc_push(&a, "--port");
  tpr_proc_push(&a, "0");
  tpr_proc_push(&a, "--port-file");
  tpr_proc_push(&a, port_file);
  tpr_proc_push(&a, "--max-batch");
  tpr_proc_pushf(&a, "%lld", (long long)server_max_batch(s));
  for (int i = 0; i < s->server_args.n; i++) tpr_proc_push(&a, s->server_args.items[i]);
  if (s->no_prefix_cache) tpr_proc_push(&a, "--no-prefix-cache");
  fprintf(stderr, CMD ": starting the server: %s\n", tpr_proc_line(&a, line, sizeof line));
  double t0 = tpr_cli_now();
  bool ok = tpr_proc_start(&a, s->np > 1, log, log, server);
  tpr_proc_argv_free(&a);
  if (!ok) return false;
  int code = 0;
  tpr_port_wait w = tpr_proc_wait_port_file(server, port_file, s->start_timeout_s, &out->port, &code);
  out->start_s = tpr_cli_now() - t0;
  if (w == TPR_PORT_READY) {
    fprintf(stderr, CMD ": the server listens on port %d (%.1f s)\n", out->port, out->start_s);
    return true;
  }
  if (w == TPR_PORT_EXITED) {
    fprintf(stderr, CMD ": the server exited with status %d before listening; the end of its log (%s):\n", code, log);
  } else {
    tpr_proc_stop st = tpr_proc_stop_server(server, s->stop_timeout_s);
    fprintf(stderr, CMD ": the server did not listen within %g s (stopped: status %d%s); the end of its log (%s):\n",
            s->start_timeout_s, st.code, st.killed ? ", killed" : "", log);
  }
  tpr_proc_print_tail(log, 30);
  return false;
}

// The token ids prompts draw from: config.json's vocab_size (as the engine
// reads it: a multimodal config's text_config's).
int64_t bs_model_vocab(const settings *s) {
  tpr_model_config c;
  if (tpr_model_config_load(s->model, &c) != TPR_OK || c.vocab_size < 1) {
    fprintf(stderr, CMD ": cannot read vocab_size from %s/config.json: %s\n", s->model, tpr_last_error());
    return -1;
  }
  return c.vocab_size;
}

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// Each client needs a socket; the default soft limit (1024) can be raised
// to the hard one without privileges.
void bs_allow_sockets(int64_t clients) {
  struct rlimit rl;
  rlim_t want = (rlim_t)clients + 64;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want) return;
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

// Starts the server, runs the clients against it, stops it. false when the
// server did not start or the clients could not run (the message printed);
// failed requests are counted in out, not a false.
// The server's tpr_engine_steps_total and tpr_engine_step_seconds_total
// (GET /metrics on a blocking socket); false when it cannot tell.
bool bs_metric(int port, const char *name, double *out) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct timeval tv = {.tv_sec = 10};
  if (fd < 0) return false;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  char *buf = malloc(1 << 16), key[128];
  size_t n = 0;
  bool ok = buf && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1);
  for (ssize_t r; ok && n + 1 < (1 << 16) && (r = read(fd, buf + n, (1 << 16) - 1 - n)) > 0;) n += (size_t)r;
  close(fd);
  if (buf) buf[n] = 0;
  snprintf(key, sizeof key, "\n%s ", name);
  const char *at = ok ? strstr(buf, key) : NULL;
  if (at) *out = strtod(at + strlen(key), NULL);
  free(buf);
  return at != NULL;
}

// The server's tpr_engine_steps_total and tpr_engine_step_seconds_total.
bool bs_engine_counters(int port, int64_t *steps, double *seconds) {
  double st = 0;
  bool ok = bs_metric(port, "tpr_engine_steps_total", &st) && bs_metric(port, "tpr_engine_step_seconds_total", seconds);
  *steps = (int64_t)st;
  return ok;
}

static bool run_serving(const settings *s, serve_result *out) {
  tpr_proc server;
  if (!bs_start_server(s, &server, out)) return false;
  int64_t n = s->clients * s->requests, vocab = bs_model_vocab(s);
  char **bodies = vocab > 0 ? bs_request_bodies(s, vocab, n + s->warmup) : NULL;
  tpr_load_request *reqs = bodies ? calloc((size_t)n, sizeof *reqs) : NULL;
  bool ok = reqs != NULL;
  if (bodies && !reqs) fprintf(stderr, CMD ": out of memory for %lld requests\n", (long long)n);
  if (ok && s->warmup) fprintf(stderr, CMD ": %lld warm-up request%s\n", (long long)s->warmup, s->warmup > 1 ? "s" : "");
  ok = ok && bs_warm_up(s, out->port, bodies + n);
  if (ok) {
    fprintf(stderr, CMD ": %lld clients x %lld requests (prompt %lld tokens, %lld generated)\n",
            (long long)s->clients, (long long)s->requests, (long long)s->prompt_len, (long long)s->gen_len + 1);
    bs_allow_sockets(s->clients);
    tpr_load_opts lo = bs_load_opts(s, out->port, (int)s->clients, (int)s->requests, bodies);
    int64_t steps0 = 0, steps1 = 0;
    double sec0 = 0, sec1 = 0;
    bool counted = bs_engine_counters(out->port, &steps0, &sec0);
    double cpu0 = cpu_seconds();
    ok = tpr_load_run(&lo, reqs);
    out->client_cpu_s = cpu_seconds() - cpu0;
    counted = counted && bs_engine_counters(out->port, &steps1, &sec1);
    out->engine_steps = counted ? steps1 - steps0 : -1;
    out->engine_step_s = counted ? sec1 - sec0 : NAN;
    ok = ok && bs_summarize_requests(s, reqs, n, out);
    if (ok)
      fprintf(stderr, CMD ": %lld answered, %lld failed in %.3f s\n", (long long)out->answered,
              (long long)out->failed, out->duration_s);
  }
  tpr_load_requests_free(reqs, n);
  free(reqs);
  bs_free_bodies(bodies, n + s->warmup);
  out->stop = tpr_proc_stop_server(&server, s->stop_timeout_s);
  char log[128];
  bs_path_in(s, "server.log", log, sizeof log);
  fprintf(stderr, CMD ": the server exited with status %d after SIGTERM to %d process%s%s\n", out->stop.code,
          out->stop.signalled, out->stop.signalled == 1 ? "" : "es",
          out->stop.killed ? " (still running after the timeout: killed)" : "");
  if (out->stop.code != 0 || out->stop.killed) {
    fprintf(stderr, CMD ": the end of the server's log (%s):\n", log);
    tpr_proc_print_tail(log, 30);
  }
  return ok;
}

// ---- the baseline --------------------------------------------------------------------------------------

// The last line of a file that starts with '{', parsed.
static cJSON *last_json_line(const char *path) {
  uint8_t *bytes = NULL;
  size_t len = 0;
  if (tpr_file_read(path, &bytes, &len) != TPR_OK) return NULL;
  char *text = (char *)bytes, *last = NULL;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
    if (line[0] == '{') last = line;
  cJSON *j = last ? cJSON_Parse(last) : NULL;
  free(bytes);
  return j;
}

static bool json_number(const cJSON *j, const char *key, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsNumber(v)) return false;
  *out = v->valuedouble;
  return true;
}

static void run_baseline(const settings *s, baseline_result *b) {
  char out_path[128], log[128], line[8192];
  bs_path_in(s, "baseline.json", out_path, sizeof out_path);
  bs_path_in(s, "baseline.log", log, sizeof log);
  tpr_proc_argv a = {0};
  push_tpr_command(s, &a, (const char *const[]){"bench", "model", NULL});
  tpr_proc_push(&a, "--batch");
  tpr_proc_pushf(&a, "%lld", (long long)s->clients);
  tpr_proc_push(&a, "--prompt-len");
  tpr_proc_pushf(&a, "%lld", (long long)s->prompt_len);
  tpr_proc_push(&a, "--gen-len");
  tpr_proc_pushf(&a, "%lld", (long long)s->gen_len);
  tpr_proc_push(&a, "--seed");
  tpr_proc_pushf(&a, "%lld", (long long)s->seed);
  tpr_proc_push(&a, "--json");
  for (int i = 0; i < s->baseline_args.n; i++) tpr_proc_push(&a, s->baseline_args.items[i]);
  fprintf(stderr, CMD ": running the baseline: %s\n", tpr_proc_line(&a, line, sizeof line));
  tpr_proc p;
  bool started = tpr_proc_start(&a, s->np > 1, out_path, log, &p);
  tpr_proc_argv_free(&a);
  b->code = started ? tpr_proc_wait(&p) : -1;
  cJSON *j = b->code == 0 ? last_json_line(out_path) : NULL;
  double generated = 0, steps = 0;
  b->ok = j && json_number(j, "prefill_tok_s", &b->prefill_tok_s) && json_number(j, "decode_tok_s", &b->decode_tok_s) &&
          json_number(j, "prefill_s", &b->prefill_s) && json_number(j, "decode_s", &b->decode_s) &&
          json_number(j, "generated_tokens", &generated) && json_number(j, "steps", &steps) &&
          b->prefill_s + b->decode_s > 0;
  cJSON_Delete(j);
  if (!b->ok) {
    fprintf(stderr, CMD ": the baseline %s; the end of its log (%s):\n",
            b->code != 0 ? "failed" : "printed no JSON with prefill_s, decode_s and generated_tokens", log);
    tpr_proc_print_tail(log, 30);
    return;
  }
  b->generated_tokens = (int64_t)generated, b->steps = (int64_t)steps;
  b->end_to_end_tok_s = generated / (b->prefill_s + b->decode_s);
}

// ---- the report ----------------------------------------------------------------------------------------

void bs_cpu_model(char *buf, size_t cap) {
  snprintf(buf, cap, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  while (f && fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) != 0 || !colon) continue;
    snprintf(buf, cap, "%s", colon + 1 + (colon[1] == ' '));
    buf[strcspn(buf, "\n")] = 0;
    break;
  }
  if (f) fclose(f);
}

static double ratio(double a, double b) { return b > 0 ? a / b : NAN; }

static void add_dist(cJSON *j, const char *name, const dist *d) {
  char key[64];
  snprintf(key, sizeof key, "%s_ms_mean", name);
  cJSON_AddNumberToObject(j, key, d->mean);  // NAN prints as null
  snprintf(key, sizeof key, "%s_ms_p50", name);
  cJSON_AddNumberToObject(j, key, d->p50);
  snprintf(key, sizeof key, "%s_ms_p99", name);
  cJSON_AddNumberToObject(j, key, d->p99);
  snprintf(key, sizeof key, "%s_count", name);
  cJSON_AddNumberToObject(j, key, (double)d->n);
}

// Every run, in the order they ran (serving then the baseline, alternating).
static void add_runs(cJSON *j, const serve_result *rs, const baseline_result *bs, int64_t n) {
  cJSON *runs = cJSON_AddArrayToObject(j, "runs");
  for (int64_t i = 0; i < n; i++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "output_tok_s", rs[i].output_tok_s);
    cJSON_AddNumberToObject(o, "ttft_ms_p50", rs[i].ttft_ms.p50);
    cJSON_AddNumberToObject(o, "itl_ms_p50", rs[i].itl_ms.p50);
    cJSON_AddNumberToObject(o, "baseline_end_to_end_tok_s", bs[i].ok ? bs[i].end_to_end_tok_s : NAN);
    cJSON_AddNumberToObject(o, "baseline_decode_tok_s", bs[i].ok ? bs[i].decode_tok_s : NAN);
    cJSON_AddItemToArray(runs, o);
  }
}

static bool print_json(const settings *s, const serve_result *r, const baseline_result *b, const char *cpu,
                       const serve_result *rs, const baseline_result *bs) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "command", "bench serve");
  cJSON_AddStringToObject(j, "model", s->model);
  cJSON_AddNumberToObject(j, "clients", (double)s->clients);
  cJSON_AddNumberToObject(j, "prompt_len", (double)s->prompt_len);
  cJSON_AddNumberToObject(j, "gen_len", (double)s->gen_len);
  cJSON_AddNumberToObject(j, "max_tokens", (double)(s->gen_len + 1));
  cJSON_AddNumberToObject(j, "np", (double)s->np);
  cJSON_AddNumberToObject(j, "requests", (double)s->requests);
  cJSON_AddNumberToObject(j, "seed", (double)s->seed);
  cJSON_AddNumberToObject(j, "max_batch", (double)server_max_batch(s));
  cJSON_AddNumberToObject(j, "warmup_requests", (double)s->warmup);
  cJSON_AddNumberToObject(j, "repeat", (double)s->repeat);
  cJSON *sa = cJSON_AddArrayToObject(j, "server_args");
  for (int i = 0; i < s->server_args.n; i++) cJSON_AddItemToArray(sa, cJSON_CreateString(s->server_args.items[i]));
  cJSON *ba = cJSON_AddArrayToObject(j, "baseline_args");
  for (int i = 0; i < s->baseline_args.n; i++) cJSON_AddItemToArray(ba, cJSON_CreateString(s->baseline_args.items[i]));
  cJSON_AddStringToObject(j, "cpu_model", cpu);
  cJSON_AddNumberToObject(j, "server_start_s", r->start_s);
  cJSON_AddNumberToObject(j, "requests_total", (double)(s->clients * s->requests));
  cJSON_AddNumberToObject(j, "requests_answered", (double)r->answered);
  cJSON_AddNumberToObject(j, "requests_failed", (double)r->failed);
  cJSON_AddNumberToObject(j, "completion_tokens", (double)r->completion_tokens);
  cJSON_AddNumberToObject(j, "text_chunks", (double)r->text_chunks);
  cJSON_AddNumberToObject(j, "duration_s", r->duration_s);
  cJSON_AddNumberToObject(j, "output_tok_s", r->output_tok_s);
  cJSON_AddNumberToObject(j, "requests_per_s", r->requests_per_s);
  add_dist(j, "ttft", &r->ttft_ms);
  add_dist(j, "itl", &r->itl_ms);
  cJSON_AddNumberToObject(j, "client_cpu_s", r->client_cpu_s);
  cJSON_AddNumberToObject(j, "server_engine_steps", (double)r->engine_steps);
  cJSON_AddNumberToObject(j, "server_engine_step_s", r->engine_step_s);
  cJSON *errors = cJSON_AddArrayToObject(j, "errors");  // the first 20
  for (int64_t i = 0; i < r->failed && i < MAX_ERRORS_SHOWN; i++) cJSON_AddItemToArray(errors, cJSON_CreateString(r->errors[i]));
  cJSON_AddNumberToObject(j, "server_exit_status", r->stop.code);
  cJSON_AddBoolToObject(j, "server_killed", r->stop.killed);
  cJSON_AddNumberToObject(j, "server_processes_signalled", r->stop.signalled);
  cJSON_AddNumberToObject(j, "baseline_exit_status", b->code);
  double none = NAN;
  cJSON_AddNumberToObject(j, "baseline_prefill_tok_s", b->ok ? b->prefill_tok_s : none);
  cJSON_AddNumberToObject(j, "baseline_decode_tok_s", b->ok ? b->decode_tok_s : none);
  cJSON_AddNumberToObject(j, "baseline_prefill_s", b->ok ? b->prefill_s : none);
  cJSON_AddNumberToObject(j, "baseline_decode_s", b->ok ? b->decode_s : none);
  cJSON_AddNumberToObject(j, "baseline_generated_tokens", b->ok ? (double)b->generated_tokens : none);
  cJSON_AddNumberToObject(j, "baseline_steps", b->ok ? (double)b->steps : none);
  cJSON_AddNumberToObject(j, "baseline_end_to_end_tok_s", b->ok ? b->end_to_end_tok_s : none);
  cJSON_AddNumberToObject(j, "serve_vs_baseline_end_to_end", b->ok ? ratio(r->output_tok_s, b->end_to_end_tok_s) : none);
  cJSON_AddNumberToObject(j, "serve_vs_baseline_decode", b->ok ? ratio(r->output_tok_s, b->decode_tok_s) : none);
  add_runs(j, rs, bs, s->repeat);
  return tpr_cli_print_json(j);
}

// A number for the table, "-" where there is none.
const char *bs_num(double v, const char *fmt, char *buf, size_t cap) {
  if (isfinite(v)) snprintf(buf, cap, fmt, v);
  else snprintf(buf, cap, "-");
  return buf;
}

void bs_print_dist_row(const char *what, const dist *d) {
  char a[32], b[32], c[32];
  printf("    %-34s %10s %10s %10s   (%lld values)\n", what, bs_num(d->p50, "%.2f", a, sizeof a),
         bs_num(d->p99, "%.2f", b, sizeof b), bs_num(d->mean, "%.2f", c, sizeof c), (long long)d->n);
}

static void print_table(const settings *s, const serve_result *r, const baseline_result *b, const char *cpu,
                        const serve_result *rs, const baseline_result *bs) {
  char x[32], y[32];
  printf("tpr bench serve: %s, np %lld, %lld clients x %lld request%s, prompt %lld, %lld generated (gen %lld + 1), "
         "server --max-batch %lld\n",
         s->model, (long long)s->np, (long long)s->clients, (long long)s->requests, s->requests == 1 ? "" : "s",
         (long long)s->prompt_len, (long long)s->gen_len + 1, (long long)s->gen_len,
         (long long)server_max_batch(s));
  printf("  cpu: %s\n", cpu);
  printf("  serving (tpr serve, streaming over HTTP)\n");
  printf("    %-34s %10lld / %lld failed\n", "requests answered", (long long)r->answered, (long long)r->failed);
  printf("    %-34s %10s   (%lld tokens in %.3f s, %.2f requests/s)\n", "output tokens/s (aggregate)",
         bs_num(r->output_tok_s, "%.1f", x, sizeof x), (long long)r->completion_tokens, r->duration_s, r->requests_per_s);
  printf("    %-34s %10s %10s %10s\n", "", "p50", "p99", "mean");
  bs_print_dist_row("TTFT ms", &r->ttft_ms);
  bs_print_dist_row("ITL ms", &r->itl_ms);
  printf("    %-34s %10.3f\n", "client CPU seconds (this process)", r->client_cpu_s);
  if (r->engine_steps > 0)
    printf("    %-34s %10lld   (%.3f ms each on rank 0, %.3f s in all)\n", "engine steps (server /metrics)",
           (long long)r->engine_steps, 1e3 * r->engine_step_s / (double)r->engine_steps, r->engine_step_s);
  printf("    %-34s %10d%s\n", "server exit status after SIGTERM", r->stop.code, r->stop.killed ? " (killed)" : "");
  printf("  baseline (tpr bench model --batch %lld, the same prompts)\n", (long long)s->clients);
  if (!b->ok) {
    printf("    failed (exit status %d)\n", b->code);
    return;
  }
  printf("    %-34s %10.1f   (%lld tokens in %.3f s prefill + %.3f s decode, %lld steps)\n", "end-to-end tokens/s",
         b->end_to_end_tok_s, (long long)b->generated_tokens, b->prefill_s, b->decode_s, (long long)b->steps);
  printf("    %-34s %10.1f\n", "decode tokens/s", b->decode_tok_s);
  printf("    %-34s %10lld   (%.3f ms each)\n", "engine steps", (long long)b->steps,
         1e3 * (b->prefill_s + b->decode_s) / (double)(b->steps ? b->steps : 1));
  printf("    %-34s %10.1f\n", "prefill tokens/s", b->prefill_tok_s);
  printf("  %-36s %10s\n", "serving / baseline end-to-end", bs_num(ratio(r->output_tok_s, b->end_to_end_tok_s), "%.3f", x, sizeof x));
  printf("  %-36s %10s\n", "serving / baseline decode", bs_num(ratio(r->output_tok_s, b->decode_tok_s), "%.3f", y, sizeof y));
  if (s->repeat < 2) return;
  printf("  the median of %lld alternating runs of each side; every run (serving tok/s, baseline end-to-end tok/s):\n",
         (long long)s->repeat);
  for (int64_t i = 0; i < s->repeat; i++)
    printf("    %10.1f %10s\n", rs[i].output_tok_s, bs_num(bs[i].ok ? bs[i].end_to_end_tok_s : NAN, "%.1f", x, sizeof x));
}

// ---- the command ---------------------------------------------------------------------------------------

// The index of the run whose double at `off` is the median (the lower one of
// an even count): a whole run is reported, not a mix of runs.
static int64_t median_index(const void *runs, int64_t n, size_t size, size_t off) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = *(const double *)((const char *)runs + (size_t)i * size + off);
    int64_t below = 0, equal_before = 0;
    for (int64_t k = 0; k < n; k++) {
      double w = *(const double *)((const char *)runs + (size_t)k * size + off);
      below += w < v;
      equal_before += w == v && k < i;
    }
    if (below + equal_before == (n - 1) / 2) best = i;
  }
  return best;
}

static void remove_dir(const settings *s) {
  static const char *const files[] = {"port", "server.log", "baseline.json", "baseline.log"};
  char p[128];
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) unlink(bs_path_in(s, files[i], p, sizeof p));
  rmdir(s->dir);
}

static bool settings_ok(settings *s, const char *usage) {
  const char *bad = !s->model                                        ? "--model is required"
                    : s->clients < 1 || s->clients > MAX_CLIENTS     ? "--clients must be in [1, 4096]"
                    : s->prompt_len < 1 || s->gen_len < 1            ? "--prompt-len and --gen-len must be >= 1"
                    : s->np < 1 || s->np > 1024                      ? "--np must be in [1, 1024]"
                    : s->requests < 1                                ? "--requests must be >= 1"
                    : s->warmup > 1000                               ? "--warmup must be at most 1000"
                    : s->repeat < 1 || s->repeat > 100               ? "--repeat must be in [1, 100]"
                    : s->clients * s->requests > 1000000             ? "--clients x --requests must be at most 10^6"
                    : !(s->start_timeout_s > 0) || !(s->request_timeout_s > 0) || !(s->stop_timeout_s > 0)
                        ? "--start-timeout, --request-timeout and --stop-timeout must be > 0"
                        : NULL;
  if (bad) {
    fprintf(stderr, CMD ": %s\n%s\n", bad, usage);
    return false;
  }
  if (s->shared_prefix < 0 || s->shared_prefix > INT32_MAX) {
    fprintf(stderr, CMD ": --shared-prefix must be in [0, %d]\n%s\n", INT32_MAX, usage);
    return false;
  }
  if (s->shared_prefix > 0 && (s->repeat > 1 || s->baseline_args.n > 0)) {
    fprintf(stderr, CMD ": --shared-prefix runs no baseline and once: --repeat and --baseline-arg do not apply\n");
    return false;
  }
  if (s->json_mode && (s->shared_prefix > 0 || s->repeat > 1 || s->baseline_args.n > 0)) {
    fprintf(stderr, CMD ": --json-mode runs no baseline and once, alone: --shared-prefix, --repeat and "
                    "--baseline-arg do not apply\n");
    return false;
  }
  const int64_t tokens[2] = {s->clients, s->shared_prefix + s->prompt_len + s->gen_len};
  if (!tpr_cli_sizes_ok(CMD, "--clients x (--shared-prefix + --prompt-len + --gen-len)", 2, tokens, INT32_MAX))
    return false;
  if (tpr_world_launched()) {
    fprintf(stderr, CMD ": run it without mpirun: it launches the server and the baseline itself (--np)\n");
    return false;
  }
  return true;
}

int tpr_bench_serve(int argc, char **argv) {
  settings s = {.clients = 8, .prompt_len = 32, .gen_len = 16, .np = 1, .requests = 1, .seed = 1,
                .warmup = 1, .repeat = 1, .start_timeout_s = 120, .request_timeout_s = 600, .stop_timeout_s = 60};
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &s.model, "checkpoint directory (config.json, tokenizer.json), as tpr serve takes"},
      {"clients", TPR_ARG_SIZE, &s.clients, "concurrent streaming clients; the baseline's --batch (default 8)"},
      {"prompt-len", TPR_ARG_SIZE, &s.prompt_len, "prompt tokens per request, random ids (default 32)"},
      {"gen-len", TPR_ARG_SIZE, &s.gen_len,
       "tokens generated per request after the prefill's first: max_tokens = G + 1, as tpr bench model (default 16)"},
      {"np", TPR_ARG_SIZE, &s.np, "ranks of the server and of the baseline (mpirun -np; default 1: no mpirun)"},
      {"requests", TPR_ARG_SIZE, &s.requests, "requests each client sends one after another (default 1)"},
      {"seed", TPR_ARG_INT, &s.seed, "seed of the prompts, drawn as tpr bench model draws them (default 1)"},
      {"max-batch", TPR_ARG_SIZE, &s.max_batch, "the server's --max-batch (default and at least: --clients)"},
      {"warmup", TPR_ARG_SIZE, &s.warmup,
       "requests sent one at a time first, not measured; one failing stops the run (default 1, as vLLM's "
       "initial test run; 0: none)"},
      {"repeat", TPR_ARG_SIZE, &s.repeat,
       "run serving and the baseline this many times, alternating, and report the median run of each (a shared "
       "machine's speed drifts; default 1)"},
      {"server-arg", TPR_ARG_STR_LIST, &s.server_args, "one more argument of tpr serve (repeatable)"},
      {"baseline-arg", TPR_ARG_STR_LIST, &s.baseline_args, "one more argument of tpr bench model (repeatable)"},
      {"start-timeout", TPR_ARG_FLOAT, &s.start_timeout_s, "seconds the server may take to listen (default 120)"},
      {"request-timeout", TPR_ARG_FLOAT, &s.request_timeout_s,
       "seconds a request may receive nothing before it fails (default 600)"},
      {"stop-timeout", TPR_ARG_FLOAT, &s.stop_timeout_s,
       "seconds the server may take to exit after SIGTERM before SIGKILL (default 60)"},
      {"shared-prefix", TPR_ARG_SIZE, &s.shared_prefix,
       "the shared-prefix workload: every prompt begins with the same N ids (a system prompt) before its own "
       "--prompt-len; "
       "serves it with the prefix cache and with --no-prefix-cache and compares the TTFT of the first request "
       "with the later ones' (no baseline; default 0: off)"},
      {"json-mode", TPR_ARG_FLAG, &s.json_mode,
       "the JSON-mode workload: the same prompts served plain and with response_format json_object (the "
       "grammar's token mask each step) by one server; compares per-token latency (no baseline)"},
      {"json", TPR_ARG_FLAG, &s.json, "print one JSON object"},
  };
  const char *usage =
      "usage: tpr bench serve --model DIR [--clients N] [--prompt-len P] [--gen-len G] [--np R] [--requests K]\n"
      "                       [--seed S] [--max-batch B] [--warmup W] [--repeat R] [--server-arg ARG ...]\n"
      "                       [--baseline-arg ARG ...] [--shared-prefix S] [--json-mode] [--json]\n\n"
      "Starts `[mpirun -np R --oversubscribe] tpr serve --model DIR --port 0 --max-batch max(N, B)`, sends W\n"
      "warm-up requests one at a time, then N concurrent streaming POST /v1/completions (P random token ids,\n"
      "max_tokens G + 1, greedy, ignore_eos), K per client one after another, stops the server with SIGTERM, then\n"
      "runs `tpr bench model --batch N --prompt-len P --gen-len G` on the same ranks and prompts. Reports aggregate\n"
      "output tok/s, TTFT and ITL (p50, p99, mean; vLLM benchmark_serving's definitions) beside the baseline's\n"
      "end-to-end tok/s (generated tokens over its prefill + decode step time) and decode tok/s. Exits 1 if any\n"
      "request fails, the server does not exit 0, or the baseline fails. The server and mpirun inherit the\n"
      "environment (mpirun: $MPIEXEC, else PATH).\n\n"
      "With --shared-prefix S every prompt is the same S ids then P of its own, and no baseline runs: the server\n"
      "is started twice, with the prefix cache and with --no-prefix-cache; each time, after W warm-up requests\n"
      "that share nothing, one request runs alone (the first: its prefix is not cached), then N clients send\n"
      "K each. Reports the first request's TTFT, the later ones' (p50, p99, mean), their ratio, and the\n"
      "server's prefix cache hits (/metrics).\n\n"
      "With --json-mode one server answers the N x K requests twice, plain (ignore_eos) and then with\n"
      "response_format {\"type\": \"json_object\"} (no ignore_eos: an answer may end before G + 1 tokens), after W\n"
      "warm-up requests of each kind, and no baseline runs. Reports ITL (p50, mean), the server's engine step\n"
      "time (/metrics) of both and their ratios: what the grammar's token mask adds to a decode step.";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!settings_ok(&s, usage)) return 2;
  ssize_t len = readlink("/proc/self/exe", s.tpr, sizeof s.tpr - 1);
  if (len <= 0) return fprintf(stderr, CMD ": cannot find the tpr binary (/proc/self/exe)\n"), 1;
  s.tpr[len] = 0;
  s.mpirun = getenv("MPIEXEC") && *getenv("MPIEXEC") ? getenv("MPIEXEC") : "mpirun";
  snprintf(s.dir, sizeof s.dir, "/tmp/tpr_bench_serve_XXXXXX");
  if (!mkdtemp(s.dir)) return fprintf(stderr, CMD ": cannot create a directory in /tmp\n"), 1;

  if (s.shared_prefix > 0 || s.json_mode) {
    int rc = s.json_mode ? tpr_bench_serve_json(&s) : tpr_bench_serve_prefix(&s);
    if (rc == 0) remove_dir(&s);
    else fprintf(stderr, CMD ": logs kept in %s\n", s.dir);
    return rc;
  }
  serve_result *rs = calloc((size_t)s.repeat, sizeof *rs);
  baseline_result *bs = calloc((size_t)s.repeat, sizeof *bs);
  if (!rs || !bs) return free(rs), free(bs), fprintf(stderr, CMD ": out of memory\n"), 1;
  bool ok = true;
  int64_t runs = 0;
  while (ok && runs < s.repeat) {
    int64_t i = runs++;
    if (s.repeat > 1) fprintf(stderr, CMD ": run %lld of %lld\n", (long long)i + 1, (long long)s.repeat);
    rs[i] = (serve_result){.stop.code = -1};
    bs[i] = (baseline_result){.code = -1};
    if (!run_serving(&s, &rs[i])) {  // no server, or no answers to count: nothing to report
      fprintf(stderr, CMD ": logs kept in %s\n", s.dir);
      free(rs), free(bs);
      return 1;
    }
    ok = rs[i].failed == 0 && rs[i].stop.code == 0 && !rs[i].stop.killed;
    if (ok) run_baseline(&s, &bs[i]);
    ok = ok && bs[i].ok;
  }
  // A failed run is the one reported; else the median run of each side.
  s.repeat = runs;
  const serve_result *r = ok ? &rs[median_index(rs, runs, sizeof *rs, offsetof(serve_result, output_tok_s))]
                             : &rs[runs - 1];
  baseline_result b = bs[runs - 1];
  if (ok) {
    b = bs[median_index(bs, runs, sizeof *bs, offsetof(baseline_result, end_to_end_tok_s))];
    b.decode_tok_s = bs[median_index(bs, runs, sizeof *bs, offsetof(baseline_result, decode_tok_s))].decode_tok_s;
  }
  char cpu[256];
  bs_cpu_model(cpu, sizeof cpu);
  bool printed = true;
  if (s.json) printed = print_json(&s, r, &b, cpu, rs, bs);
  else print_table(&s, r, &b, cpu, rs, bs);
  ok = ok && printed;
  if (ok) remove_dir(&s);
  else fprintf(stderr, CMD ": %s; logs kept in %s\n",
               r->failed ? "some requests failed" : !b.ok ? "the baseline failed" : "the server did not exit cleanly",
               s.dir);
  free(rs), free(bs);
  return ok ? 0 : 1;
}
