// The endpoints: GET /health, GET /v1/models, GET /metrics, POST
// /v1/completions, POST /v1/chat/completions. A request that passes its
// checks becomes an engine sequence (submitted here, between steps); loop.c
// streams its tokens back. Every bad request gets an OpenAI-shaped JSON error.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <http_parser.h>

#include "serve/serve_impl.h"

static const double hist_bounds[SERVE_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                        0.1,   0.25,   0.5,   1,    2.5,   10};
static const int status_codes[SERVE_N_STATUS - 1] = {200, 400, 404, 405, 408, 413, 500, 503};

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

static void respond_error(serve_state *st, tpr_http_conn *c, int status, const char *msg) {
  char *j = tpr_oai_error_json(status, msg);
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
  int64_t unfinished = 0;
  for (serve_req *r = st->reqs; r; r = r->next) unfinished += !r->engine_done;
  int64_t waiting = tpr_engine_waiting(st->e);
  text_buf t = {0};
  metric_head(&t, "tpr_requests_total", "counter", "HTTP requests answered, by status.");
  for (int i = 0; i < SERVE_N_STATUS; i++) {
    char code[8];
    if (i < SERVE_N_STATUS - 1) snprintf(code, sizeof code, "%d", status_codes[i]);
    else snprintf(code, sizeof code, "other");
    tb_printf(&t, "tpr_requests_total{status=\"%s\"} %lld\n", code, (long long)st->m.by_status[i]);
  }
  metric_head(&t, "tpr_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.");
  tb_printf(&t, "tpr_prompt_tokens_total %lld\n", (long long)st->m.prompt_tokens);
  metric_head(&t, "tpr_generation_tokens_total", "counter", "Tokens generated for answered requests.");
  tb_printf(&t, "tpr_generation_tokens_total %lld\n", (long long)st->m.generated_tokens);
  metric_head(&t, "tpr_running_sequences", "gauge", "Sequences the engine is running (holding KV blocks).");
  tb_printf(&t, "tpr_running_sequences %lld\n", (long long)(unfinished - waiting));
  metric_head(&t, "tpr_waiting_sequences", "gauge", "Sequences waiting for KV blocks (queued or preempted).");
  tb_printf(&t, "tpr_waiting_sequences %lld\n", (long long)waiting);
  metric_head(&t, "tpr_kv_blocks_in_use", "gauge", "KV cache blocks in use (replica 0).");
  tb_printf(&t, "tpr_kv_blocks_in_use %lld\n", (long long)tpr_engine_blocks_in_use(st->e, 0));
  histogram(&t, "tpr_time_to_first_token_seconds", "From submission to the first generated token.", &st->m.ttft);
  histogram(&t, "tpr_inter_token_latency_seconds", "Between consecutive generated tokens of a request.",
            &st->m.itl);
  if (!t.p) return respond(st, c, 500, "text/plain", "out of memory\n");
  respond(st, c, 200, "text/plain; version=0.0.4", t.p);
  free(t.p);
}

// Tokenizes, checks and submits a generation request.
static void generate(serve_state *st, tpr_http_conn *c, const tpr_http_request *hr, bool chat) {
  char err[512];
  int status = 400;
  tpr_oai_request q;
  if (!tpr_oai_parse(hr->body, hr->body_len, chat, st->o->chat_template, st->o->model_id, &q, &status, err,
                     sizeof err))
    return respond_error(st, c, status, err);
  int32_t *ids = NULL;
  size_t n = 0;
  if (q.prompt_ids) {
    ids = q.prompt_ids, n = q.n_prompt_ids;
    q.prompt_ids = NULL, q.n_prompt_ids = 0;
  } else if (tpr_tokenizer_encode(st->tok, q.prompt, strlen(q.prompt), true, &ids, &n) != TPR_OK) {
    snprintf(err, sizeof err, "cannot tokenize the prompt: %s", tpr_last_error());
    goto fail;
  }
  if (n == 0) {
    snprintf(err, sizeof err, "the prompt is empty (0 tokens)");
    goto fail;
  }
  if ((int64_t)n + q.max_tokens > st->o->max_seq) {
    snprintf(err, sizeof err,
             "the prompt (%zu tokens) plus max_tokens (%lld) is longer than the context of %lld tokens", n,
             (long long)q.max_tokens, (long long)st->o->max_seq);
    goto fail;
  }
  tpr_gen_params g = {.max_new = q.max_tokens,
                      .stop_token = q.ignore_eos ? -1 : st->o->eos,
                      .sampling = {.temperature = q.temperature, .top_k = q.top_k, .top_p = q.top_p,
                                   .seed = (uint64_t)q.seed}};
  int64_t seq;
  if (tpr_engine_check_prompt(st->e, ids, (int64_t)n) != TPR_OK ||
      tpr_engine_submit(st->e, ids, (int64_t)n, &g, &seq) != TPR_OK) {
    snprintf(err, sizeof err, "%s", tpr_last_error());
    goto fail;
  }
  serve_req *r = calloc(1, sizeof *r);
  if (!r) {
    // The engine runs the sequence anyway; nothing waits for it.
    status = 500;
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  r->conn = c;
  r->r = q;
  r->seq = seq;
  r->prompt_len = (int64_t)n;
  r->created = (int64_t)time(NULL);
  r->t_submit = r->t_last_token = serve_now();
  snprintf(r->id, sizeof r->id, "%s-%lld", chat ? "chatcmpl" : "cmpl", (long long)st->next_id++);
  // Appended, so sequences are reported in submission order.
  serve_req **tail = &st->reqs;
  while (*tail) tail = &(*tail)->next;
  *tail = r;
  st->m.prompt_tokens += (int64_t)n;
  free(ids);
  if (q.stream) {
    serve_count_status(st, 200);
    tpr_http_stream_begin(c);
  }
  return;
fail:
  free(ids);
  tpr_oai_request_free(&q);
  respond_error(st, c, status, err);
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
    return respond_error(st, c, 404, msg);
  }
  if (r->method != routes[k].method) {
    char msg[300];
    snprintf(msg, sizeof msg, "%s takes %s", routes[k].path, http_method_str(routes[k].method));
    return respond_error(st, c, 405, msg);
  }
  switch (k) {
    case 0: return respond(st, c, 200, "application/json", "{\"status\":\"ok\"}");
    case 1: return models(st, c);
    case 2: return metrics(st, c);
    default:
      if (st->stopping) return respond_error(st, c, 503, "the server is shutting down");
      return generate(st, c, r, k == 4);
  }
}

void serve_conn_closed(void *ctx, tpr_http_conn *c) {
  serve_state *st = ctx;
  for (serve_req *r = st->reqs; r; r = r->next)
    if (r->conn == c) r->conn = NULL;
}
