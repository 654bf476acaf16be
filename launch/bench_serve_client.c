// One connection per request (as vLLM's benchmark_serving opens a session
// per request): connect, write the whole request, read until the response's
// last chunk, close, then the client's next request. A client's state is
// its TCP handle (one per request), an idle timer and the parsers.
#include "launch/bench_serve_client.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <http_parser.h>
#include <uv.h>

#define ERROR_BODY_MAX 240  // the part of a non-200 answer quoted in the error

typedef struct client {
  const tpr_load_opts *o;
  tpr_load_request *all;  // o->clients x o->requests_per_client results
  tpr_load_request *req;  // the request in flight
  int index, next;        // this client's number; the round of the request in flight
  bool ending;            // its TCP handle is closing
  uv_tcp_t tcp;
  uv_connect_t connect;
  uv_write_t write;
  uv_timer_t idle;
  char *request_text;  // header and body, alive until the write completes
  http_parser parser;
  bool complete;       // the response's last byte has been parsed
  double t_read;       // arrival of the bytes being parsed
  char *line, *event;  // SSE: the line being read, the event's data lines
  size_t line_len, line_cap, event_len, event_cap;
  bool event_has_data;
  int64_t text_cap;
  char error_body[ERROR_BODY_MAX + 1];
  size_t error_body_len;
  char read_buf[64 * 1024];  // libuv reads into it (one read in flight per handle)
} client;

static void start_request(client *c);

// CLOCK_MONOTONIC seconds, the clock of tpr_cli_now (the caller's own times).
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The first problem of a request is the one reported.
static void fail(client *c, const char *fmt, ...) {
  if (c->req->error[0]) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->req->error, sizeof c->req->error, fmt, ap);
  va_end(ap);
}

static bool append(char **buf, size_t *len, size_t *cap, const char *data, size_t n) {
  if (*len + n + 1 > *cap) {
    size_t want = *cap ? *cap : 256;
    while (want < *len + n + 1) want *= 2;
    char *grown = realloc(*buf, want);
    if (!grown) return false;
    *buf = grown, *cap = want;
  }
  memcpy(*buf + *len, data, n);
  *len += n;
  (*buf)[*len] = 0;
  return true;
}

static void record_text_time(client *c) {
  tpr_load_request *r = c->req;
  if (r->n_text == c->text_cap) {
    int64_t cap = c->text_cap ? 2 * c->text_cap : 64;
    double *grown = realloc(r->text_times, (size_t)cap * sizeof *grown);
    if (!grown) return fail(c, "out of memory recording chunk times");
    r->text_times = grown, c->text_cap = cap;
  }
  r->text_times[r->n_text++] = c->t_read;
}

// One SSE event's data: "[DONE]" or a completion chunk (or an error object).
static void handle_event(client *c, const char *data, size_t len) {
  tpr_load_request *r = c->req;
  if (r->done) return fail(c, "an event came after data: [DONE]");
  if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
    r->done = true;
    return;
  }
  cJSON *j = cJSON_ParseWithLength(data, len);
  if (!cJSON_IsObject(j)) {
    cJSON_Delete(j);
    return fail(c, "an SSE event that is not a JSON object: %.120s", data);
  }
  const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
  if (err) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
    fail(c, "the server sent an error event: %.200s", cJSON_IsString(m) ? m->valuestring : "(no message)");
  }
  const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
  const cJSON *text = cJSON_GetObjectItemCaseSensitive(choice, "text");  // a chat chunk: its delta's content
  if (!text) text = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice, "delta"), "content");
  if (cJSON_IsString(text) && text->valuestring[0]) record_text_time(c);
  const cJSON *finish = cJSON_GetObjectItemCaseSensitive(choice, "finish_reason");
  if (cJSON_IsString(finish)) snprintf(r->finish_reason, sizeof r->finish_reason, "%s", finish->valuestring);
  const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "usage"),
                                                         "completion_tokens");
  if (cJSON_IsNumber(tokens)) r->completion_tokens = (int64_t)tokens->valuedouble;
  cJSON_Delete(j);
}

// One line of the event stream (its '\n', and a '\r' before it, removed):
// "data:" lines gather into the event, which a blank line dispatches; other
// fields and comments are ignored, as the SSE specification says.
static void handle_line(client *c, char *line, size_t len) {
  if (len == 0) {
    if (c->event_has_data) handle_event(c, c->event ? c->event : "", c->event_len);
    c->event_len = 0, c->event_has_data = false;
    return;
  }
  if (len < 5 || memcmp(line, "data:", 5) != 0) return;
  const char *v = line + 5;
  if (*v == ' ') v++;
  bool ok = (!c->event_has_data || append(&c->event, &c->event_len, &c->event_cap, "\n", 1)) &&
            append(&c->event, &c->event_len, &c->event_cap, v, len - (size_t)(v - line));
  if (!ok) fail(c, "out of memory reading an event");
  c->event_has_data = true;
}

static int on_headers_complete(http_parser *p) {
  client *c = p->data;
  c->req->http_status = (int)p->status_code;
  return 0;
}

// The body, chunked encoding already removed: split into lines.
static int on_body(http_parser *p, const char *at, size_t n) {
  client *c = p->data;
  if (c->req->http_status != 200) {  // an error answer: keep its start for the report
    size_t room = ERROR_BODY_MAX - c->error_body_len, k = n < room ? n : room;
    memcpy(c->error_body + c->error_body_len, at, k);
    c->error_body[c->error_body_len += k] = 0;
    return 0;
  }
  while (n > 0) {
    const char *nl = memchr(at, '\n', n);
    size_t k = nl ? (size_t)(nl - at) : n;
    if (!append(&c->line, &c->line_len, &c->line_cap, at, k)) {
      fail(c, "out of memory reading the stream");
      return -1;
    }
    if (!nl) break;
    size_t len = c->line_len;
    if (len > 0 && c->line[len - 1] == '\r') len--;
    handle_line(c, c->line, len);
    c->line_len = 0;
    at += k + 1, n -= k + 1;
  }
  return 0;
}

static int on_message_complete(http_parser *p) {
  client *c = p->data;
  c->complete = true;
  return 0;
}

static const http_parser_settings parser_settings = {
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

// A complete response, checked against what every request asked for.
static void check_answer(client *c) {
  const tpr_load_request *r = c->req;
  if (r->http_status != 200)
    return fail(c, "HTTP %d: %s", r->http_status, c->error_body_len ? c->error_body : "(empty body)");
  if (!r->done) return fail(c, "the stream ended without data: [DONE]");
  if (!r->finish_reason[0]) return fail(c, "no chunk carried a finish_reason");
  if (r->completion_tokens < 0) return fail(c, "no usage chunk (stream_options.include_usage)");
  if (c->o->expect_completion_tokens >= 0 ? r->completion_tokens != c->o->expect_completion_tokens
                                           : r->completion_tokens > -c->o->expect_completion_tokens)
    return fail(c, "usage.completion_tokens = %lld, want %s%lld", (long long)r->completion_tokens,
                c->o->expect_completion_tokens < 0 ? "at most " : "", llabs(c->o->expect_completion_tokens));
  if (r->n_text == 0) return fail(c, "no chunk carried text, so no time to first token");
}

static void on_idle_closed(uv_handle_t *h) { (void)h; }

static void on_tcp_closed(uv_handle_t *h) {
  client *c = h->data;
  free(c->request_text);
  c->request_text = NULL;
  c->ending = false;
  if (++c->next < c->o->requests_per_client) start_request(c);
  else uv_close((uv_handle_t *)&c->idle, on_idle_closed);
}

// The request is over (answered or not): the connection closes, and its
// close callback starts the client's next request.
static void end_request(client *c) {
  if (c->ending) return;
  c->ending = true;
  tpr_load_request *r = c->req;
  r->t_end = c->complete ? c->t_read : now();
  if (c->complete) check_answer(c);
  uv_timer_stop(&c->idle);
  uv_close((uv_handle_t *)&c->tcp, on_tcp_closed);
}

static void on_idle(uv_timer_t *t) {
  client *c = t->data;
  fail(c, "nothing received for %g s", c->o->idle_timeout_s);
  end_request(c);
}

static void restart_idle_timer(client *c) {
  uv_timer_start(&c->idle, on_idle, (uint64_t)(c->o->idle_timeout_s * 1000), 0);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  client *c = h->data;
  *buf = uv_buf_init(c->read_buf, sizeof c->read_buf);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  client *c = s->data;
  if (c->ending || n == 0) return;
  c->t_read = now();
  if (n == UV_EOF) {  // a response without length ends here; any other is cut short
    http_parser_execute(&c->parser, &parser_settings, NULL, 0);
    if (!c->complete) fail(c, "the server closed the connection before the response ended");
    return end_request(c);
  }
  if (n < 0) {
    fail(c, "reading the response: %s", uv_strerror((int)n));
    return end_request(c);
  }
  restart_idle_timer(c);
  size_t used = http_parser_execute(&c->parser, &parser_settings, buf->base, (size_t)n);
  enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
  if (c->complete) return end_request(c);  // bytes past the response (none are asked for) are ignored
  if (e != HPE_OK || used != (size_t)n) {
    fail(c, "malformed HTTP response: %s", http_errno_description(e));
    end_request(c);
  }
}

static void on_written(uv_write_t *w, int status) {
  client *c = w->data;
  if (status < 0 && !c->ending) {
    fail(c, "sending the request: %s", uv_strerror(status));
    end_request(c);
  }
}

static void on_connect(uv_connect_t *req, int status) {
  client *c = req->data;
  if (c->ending) return;
  if (status < 0) {
    fail(c, "connecting to %s:%d: %s", c->o->host, c->o->port, uv_strerror(status));
    return end_request(c);
  }
  uv_tcp_nodelay(&c->tcp, 1);
  uv_buf_t b = uv_buf_init(c->request_text, (unsigned)strlen(c->request_text));
  int rc = uv_write(&c->write, (uv_stream_t *)&c->tcp, &b, 1, on_written);
  if (rc == 0) rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
  if (rc < 0) {
    fail(c, "sending the request: %s", uv_strerror(rc));
    end_request(c);
  }
}

static void start_request(client *c) {
  const tpr_load_opts *o = c->o;
  int64_t i = (int64_t)c->next * o->clients + c->index;
  tpr_load_request *r = c->req = &c->all[i];
  memset(r, 0, sizeof *r);
  r->completion_tokens = -1;
  c->complete = false;
  c->line_len = c->event_len = 0, c->event_has_data = false;
  c->text_cap = 0, c->error_body_len = 0, c->error_body[0] = 0;
  http_parser_init(&c->parser, HTTP_RESPONSE);
  c->parser.data = c;
  const char *body = o->bodies[i];
  size_t blen = strlen(body), cap = blen + 512;
  c->request_text = malloc(cap);
  if (c->request_text)
    snprintf(c->request_text, cap,
             "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             o->path, o->host, o->port, blen, body);
  r->t_start = now();
  uv_tcp_init(c->idle.loop, &c->tcp);
  c->tcp.data = c;
  c->connect.data = c->write.data = c;
  restart_idle_timer(c);
  struct sockaddr_in addr;
  int rc = uv_ip4_addr(o->host, o->port, &addr);
  if (rc == 0 && !c->request_text) rc = UV_ENOMEM;
  if (rc == 0) rc = uv_tcp_connect(&c->connect, &c->tcp, (const struct sockaddr *)&addr, on_connect);
  if (rc < 0) {
    fail(c, "connecting to %s:%d: %s", o->host, o->port, uv_strerror(rc));
    end_request(c);
  }
}

bool tpr_load_run(const tpr_load_opts *o, tpr_load_request *out) {
  uv_loop_t loop;
  client *cs = calloc((size_t)o->clients, sizeof *cs);
  if (!cs || uv_loop_init(&loop) != 0) {
    free(cs);
    fprintf(stderr, "tpr bench serve: cannot start the clients' event loop\n");
    return false;
  }
  for (int k = 0; k < o->clients; k++) {
    client *c = &cs[k];
    c->o = o, c->all = out, c->index = k;
    uv_timer_init(&loop, &c->idle);
    c->idle.data = c;
  }
  for (int k = 0; k < o->clients; k++) start_request(&cs[k]);
  uv_run(&loop, UV_RUN_DEFAULT);  // returns once every handle has closed: every request has ended
  uv_loop_close(&loop);
  for (int k = 0; k < o->clients; k++) free(cs[k].line), free(cs[k].event);
  free(cs);
  return true;
}

void tpr_load_requests_free(tpr_load_request *r, int64_t n) {
  for (int64_t i = 0; r && i < n; i++) free(r[i].text_times);
}
