// The endpoints, on the HTTP thread: GET /health, GET /v1/models, GET
// /metrics, and POST /v1/completions and /v1/chat/completions, which
// submit.c takes. Every bad request gets an OpenAI-shaped JSON error.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <http_parser.h>

#include "serve/serve_impl.h"

static const double hist_bounds[SERVE_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                        0.1,   0.25,   0.5,   1,    2.5,   10};
static const int status_codes[SERVE_N_STATUS - 1] = {200, 400, 404, 405, 408, 413, 417, 500, 503};

double serve_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void serve_count_status(serve_state *st, int status) {
  int i = 0;
  while (i < SERVE_N_STATUS - 1 && status_codes[i] != status) i++;
  st->m.by_status[i]++;  // the last slot: any other status
}

void serve_observe(serve_hist *h, double s) {
  int b = 0;
  while (b < SERVE_HIST_BUCKETS && s > hist_bounds[b]) b++;
  h->count[b]++;
  h->sum += s;
}

static void respond(serve_state *st, tpr_http_conn *c, int status, const char *ctype, const char *body) {
  serve_count_status(st, status);
  tpr_http_respond(c, status, ctype, body, strlen(body));
}

void serve_respond_error(serve_state *st, tpr_http_conn *c, int status, const char *msg, const char *param) {
  char *j = tpr_oai_error_json(status, msg, param);
  respond(st, c, status, "application/json", j ? j : "{}");
  free(j);
}

static void models(serve_state *st, tpr_http_conn *c) {
  char body[1024];
  cJSON *name = cJSON_CreateString(st->o->model_id);
  char *q = cJSON_PrintUnformatted(name);
  snprintf(body, sizeof body,
           "{\"object\":\"list\",\"data\":[{\"id\":%s,\"object\":\"model\",\"created\":0,\"owned_by\":\"tpr\","
           "\"max_model_len\":%lld}]}",
           q ? q : "\"\"", (long long)st->o->max_seq);
  free(q);
  cJSON_Delete(name);
  respond(st, c, 200, "application/json", body);
}

// Appends printf-style text to a growing buffer (the metrics page).
typedef struct text_buf {
  char *p;
  size_t len, cap;
} text_buf;

static void tb_printf(text_buf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(text_buf *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = t->p ? vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap) : -1;
    va_end(ap);
    if (n >= 0 && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = t->cap * 2 + (n > 0 ? (size_t)n : 0) + 4096;
    char *q = realloc(t->p, cap);
    if (!q) return;  // the page is cut short rather than lost
    t->p = q;
    t->cap = cap;
  }
}

static void metric_head(text_buf *t, const char *name, const char *type, const char *help) {
  tb_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void histogram(text_buf *t, const char *name, const char *help, const serve_hist *h) {
  metric_head(t, name, "histogram", help);
  int64_t cum = 0;
  for (int b = 0; b <= SERVE_HIST_BUCKETS; b++) {
    cum += h->count[b];
    if (b < SERVE_HIST_BUCKETS) tb_printf(t, "%s_bucket{le=\"%g\"} %lld\n", name, hist_bounds[b], (long long)cum);
    else tb_printf(t, "%s_bucket{le=\"+Inf\"} %lld\n", name, (long long)cum);
  }
  tb_printf(t, "%s_sum %.6f\n%s_count %lld\n", name, h->sum, name, (long long)cum);
}

static void metrics(serve_state *st, tpr_http_conn *c) {
  pthread_mutex_lock(&st->b.mu);
  serve_gauges g = st->b.gauges;
  pthread_mutex_unlock(&st->b.mu);
  text_buf t = {0};
  metric_head(&t, "tpr_requests_total", "counter", "HTTP requests answered, by status.");
  for (int i = 0; i < SERVE_N_STATUS; i++) {
    char code[8];
    if (i < SERVE_N_STATUS - 1) snprintf(code, sizeof code, "%d", status_codes[i]);
    else snprintf(code, sizeof code, "other");
    tb_printf(&t, "tpr_requests_total{status=\"%s\"} %lld\n", code, (long long)st->m.by_status[i]);
  }
  const struct {
    const char *name, *type, *help;
    int64_t v;
  } rows[] = {
      {"tpr_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", st->m.prompt_tokens},
      {"tpr_generation_tokens_total", "counter", "Tokens generated for answered requests.", st->m.generated_tokens},
      {"tpr_running_sequences", "gauge", "Sequences the engine is running (holding KV blocks).", g.running},
      {"tpr_waiting_sequences", "gauge", "Sequences waiting for KV blocks (queued or preempted).", g.waiting},
      {"tpr_kv_blocks_in_use", "gauge", "KV cache blocks in use (all dp replicas).", g.blocks_in_use},
      {"tpr_preemptions_total", "counter", "Sequences preempted (KV blocks freed, recomputed later).", g.preemptions},
      {"tpr_engine_steps_total", "counter", "Engine steps run.", g.steps},
      // vLLM's names: hit rate = hits / queries, both in prompt tokens.
      {"tpr_prefix_cache_queries_total", "counter",
       "Prompt tokens looked up in the prefix cache at admissions (recomputes after preemption included).",
       g.prefix.queried_tokens},
      {"tpr_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache (not prefilled again).",
       g.prefix.hit_tokens},
      {"tpr_prefix_cache_blocks", "gauge", "KV blocks held in the prefix cache, in use or free (all dp replicas).",
       g.prefix.cached_blocks},
      // vLLM's spec_decode names: acceptance rate = accepted / draft tokens.
      {"tpr_spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified (speculative decoding).",
       g.spec.drafted},
      {"tpr_spec_decode_num_accepted_tokens_total", "counter", "Of which accepted by the model.", g.spec.accepted},
      {"tpr_spec_decode_num_verifications_total", "counter",
       "Decode steps of sequences with drafts (each gives 1 + its accepted drafts tokens).", g.spec.verifications},
      {"tpr_open_connections", "gauge", "Open client connections (this one included).", tpr_http_open_conns(st->http)},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    metric_head(&t, rows[i].name, rows[i].type, rows[i].help);
    tb_printf(&t, "%s %lld\n", rows[i].name, (long long)rows[i].v);
  }
  metric_head(&t, "tpr_engine_step_seconds_total", "counter", "Time rank 0 spent in engine steps.");
  tb_printf(&t, "tpr_engine_step_seconds_total %.6f\n", g.step_seconds);
  metric_head(&t, "tpr_grammar_mask_seconds_total", "counter",
              "Of that, time rank 0 spent computing structured output's token masks.");
  tb_printf(&t, "tpr_grammar_mask_seconds_total %.6f\n", g.mask_seconds);
  histogram(&t, "tpr_time_to_first_token_seconds", "From submission to the first generated token.", &st->m.ttft);
  histogram(&t, "tpr_inter_token_latency_seconds", "Between consecutive generated tokens of a request.",
            &st->m.itl);
  if (!t.p) return respond(st, c, 500, "text/plain", "out of memory\n");
  respond(st, c, 200, "text/plain; version=0.0.4", t.p);
  free(t.p);
}

void serve_handle(void *ctx, tpr_http_conn *c, const tpr_http_request *r) {
  serve_state *st = ctx;
  static const struct {
    const char *path;
    int method;
  } routes[] = {{"/health", HTTP_GET},
                {"/v1/models", HTTP_GET},
                {"/metrics", HTTP_GET},
                {"/v1/completions", HTTP_POST},
                {"/v1/chat/completions", HTTP_POST}};
  int k = -1;
  for (int i = 0; i < 5; i++)
    if (strcmp(r->path, routes[i].path) == 0) k = i;
  if (k < 0) {
    char msg[300];
    snprintf(msg, sizeof msg, "no such endpoint: %.200s", r->path);
    return serve_respond_error(st, c, 404, msg, NULL);
  }
  if (r->method != routes[k].method) {
    char msg[300];
    snprintf(msg, sizeof msg, "%s takes %s", routes[k].path, http_method_str(routes[k].method));
    return serve_respond_error(st, c, 405, msg, NULL);
  }
  switch (k) {
    case 0: return respond(st, c, 200, "application/json", "{\"status\":\"ok\"}");
    case 1: return models(st, c);
    case 2: return metrics(st, c);
    default:
      if (st->stopping) return serve_respond_error(st, c, 503, "the server is shutting down", NULL);
      return serve_generate(st, c, r, k == 4);
  }
}

void serve_conn_closed(void *ctx, tpr_http_conn *c) {
  serve_state *st = ctx;
  for (serve_req *r = st->reqs; r; r = r->next)
    if (r->conn == c) {
      r->conn = NULL;
      if (!r->responded) serve_bridge_cancel(st, r, -1);  // its sequences end now, their blocks return
    }
}
