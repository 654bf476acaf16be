// The endpoints: GET /health, GET /v1/models, GET /metrics, POST
// /v1/completions, POST /v1/chat/completions. A request that passes its
// checks becomes an engine sequence (submitted here, between steps); loop.c
// streams its tokens back. Every bad request gets an OpenAI-shaped JSON error.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <http_parser.h>

#include "serve/serve_impl.h"

static const double ttft_bounds[SERVE_TTFT_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};

double serve_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void serve_count_status(serve_state *st, int status) {
  int i = status == 200 ? 0 : status == 400 ? 1 : status == 404 ? 2 : status == 405 ? 3 : status == 413 ? 4 : 5;
  st->m.by_status[i]++;
}

void serve_observe_ttft(serve_state *st, double s) {
  int b = 0;
  while (b < SERVE_TTFT_BUCKETS && s > ttft_bounds[b]) b++;
  st->m.ttft_count[b]++;
  st->m.ttft_sum += s;
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

static void metrics(serve_state *st, tpr_http_conn *c) {
  static const char *codes[6] = {"200", "400", "404", "405", "413", "5xx"};
  int64_t running = 0;
  for (serve_req *r = st->reqs; r; r = r->next) running += !r->engine_done;
  char body[4096];
  int n = snprintf(body, sizeof body, "# HELP tpr_requests_total HTTP requests answered, by status.\n"
                                      "# TYPE tpr_requests_total counter\n");
  for (int i = 0; i < 6; i++)
    n += snprintf(body + n, sizeof body - (size_t)n, "tpr_requests_total{status=\"%s\"} %lld\n", codes[i],
                  (long long)st->m.by_status[i]);
  n += snprintf(body + n, sizeof body - (size_t)n,
                "# HELP tpr_prompt_tokens_total Prompt tokens of accepted requests.\n"
                "# TYPE tpr_prompt_tokens_total counter\ntpr_prompt_tokens_total %lld\n"
                "# HELP tpr_generation_tokens_total Tokens generated for answered requests.\n"
                "# TYPE tpr_generation_tokens_total counter\ntpr_generation_tokens_total %lld\n"
                "# HELP tpr_running_sequences Sequences in the engine.\n"
                "# TYPE tpr_running_sequences gauge\ntpr_running_sequences %lld\n"
                "# HELP tpr_kv_blocks_in_use KV cache blocks in use (replica 0).\n"
                "# TYPE tpr_kv_blocks_in_use gauge\ntpr_kv_blocks_in_use %lld\n"
                "# HELP tpr_time_to_first_token_seconds From submission to the first generated token.\n"
                "# TYPE tpr_time_to_first_token_seconds histogram\n",
                (long long)st->m.prompt_tokens, (long long)st->m.generated_tokens, (long long)running,
                (long long)tpr_engine_blocks_in_use(st->e, 0));
  int64_t cum = 0;
  for (int b = 0; b <= SERVE_TTFT_BUCKETS; b++) {
    cum += st->m.ttft_count[b];
    if (b < SERVE_TTFT_BUCKETS)
      n += snprintf(body + n, sizeof body - (size_t)n, "tpr_time_to_first_token_seconds_bucket{le=\"%g\"} %lld\n",
                    ttft_bounds[b], (long long)cum);
    else
      n += snprintf(body + n, sizeof body - (size_t)n, "tpr_time_to_first_token_seconds_bucket{le=\"+Inf\"} %lld\n",
                    (long long)cum);
  }
  snprintf(body + n, sizeof body - (size_t)n,
           "tpr_time_to_first_token_seconds_sum %.6f\ntpr_time_to_first_token_seconds_count %lld\n", st->m.ttft_sum,
           (long long)cum);
  respond(st, c, 200, "text/plain; version=0.0.4", body);
}

// Tokenizes, checks and submits a generation request.
static void generate(serve_state *st, tpr_http_conn *c, const tpr_http_request *hr, bool chat) {
  char err[512];
  int status = 400;
  tpr_oai_request q;
  if (!tpr_oai_parse(hr->body, hr->body_len, chat, st->o->model_id, &q, &status, err, sizeof err))
    return respond_error(st, c, status, err);
  int32_t *ids = NULL;
  size_t n = 0;
  if (tpr_tokenizer_encode(st->tok, q.prompt, strlen(q.prompt), true, &ids, &n) != TPR_OK) {
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
                      .stop_token = st->o->eos,
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
  r->t_submit = serve_now();
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
