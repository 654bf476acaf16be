// HTTP/1.1 connections on libuv; the bytes go through tpr_http_reader
// (http_reader.c: keep-alive, Content-Length and chunked bodies, 413 past the
// body limit, 400 on what the parser rejects, Expect: 100-continue). One
// request at a time per connection: bytes that arrive while a request is
// answered wait in `pending` (up to a limit, then reading pauses), but the
// socket is still read, so a client that hangs up is noticed at once and its
// request cancelled rather than generated to the end. A request that is not
// complete within request_timeout seconds of its first byte (or of the
// connection going idle) gets 408 and the connection closes, so a client
// that sends one byte a second holds nothing for long. Past max_connections
// a new connection gets 503 and is closed. An HTTP/1.0 client's stream is
// close-delimited (it has no chunked encoding).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve.h"

struct tpr_http_server {
  uv_tcp_t tcp;
  uv_loop_t *loop;
  tpr_http_opts o;
  bool accepting, closing;
  int port;
  tpr_http_conn *conns;  // every open connection (a doubly linked list)
};

struct tpr_http_conn {
  uv_tcp_t tcp;
  tpr_http_server *srv;
  tpr_http_conn *prev, *next;
  uv_timer_t timer;   // the request timeout
  int open_handles;   // tcp and timer: freed when both have closed
  tpr_http_reader rd;
  bool grace_used;    // the timeout has waited one more loop turn
  int writes_pending; // queued in libuv, not yet on the wire
  bool close_when_flushed;  // closing, once the answer already queued is written
  bool busy;         // a request is waiting for its answer
  bool keep_alive;   // of the request being answered
  bool closing;
  bool streaming;
  bool chunked;      // the stream's body is chunked (HTTP/1.1)
  bool http10;       // of the request being answered
  char *pending;     // bytes read past the request being answered
  size_t pending_len;
};

static void conn_read(tpr_http_conn *c, const char *data, size_t len);
static void timer_start(tpr_http_conn *c);

const char *tpr_http_status_text(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 417: return "Expectation Failed";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

static void on_closed(uv_handle_t *h) {
  tpr_http_conn *c = h->data;
  if (--c->open_handles > 0) return;
  tpr_http_reader_free(&c->rd);
  free(c->pending);
  free(c);
}

static void conn_close(tpr_http_conn *c) {
  if (c->closing) return;
  c->closing = true;
  tpr_http_server *s = c->srv;
  if (c->prev) c->prev->next = c->next; else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  // The handler learns that its pending answer has nowhere to go.
  if (c->busy && s->o.on_close) s->o.on_close(s->o.ctx, c);
  uv_close((uv_handle_t *)&c->timer, on_closed);
  uv_close((uv_handle_t *)&c->tcp, on_closed);
}

typedef struct write_req {
  uv_write_t w;
  tpr_http_conn *c;
  bool close_after;
  char data[];
} write_req;

static void on_written(uv_write_t *w, int status) {
  write_req *r = (write_req *)w;
  tpr_http_conn *c = r->c;
  c->writes_pending--;
  bool done = status < 0 || r->close_after || (c->close_when_flushed && c->writes_pending == 0);
  if (done && !c->closing) conn_close(c);
  free(r);
}

// Closes an idle connection, but only after what is queued for it is
// written: uv_close would drop the end of an answer still in libuv's queue.
static void conn_close_flushed(tpr_http_conn *c) {
  if (c->writes_pending == 0) return conn_close(c);
  c->close_when_flushed = true;
  uv_read_stop((uv_stream_t *)&c->tcp);
}

static void conn_write(tpr_http_conn *c, const char *a, size_t alen, const char *b, size_t blen, bool close_after) {
  if (c->closing) return;
  write_req *r = malloc(sizeof *r + alen + blen);
  if (!r) {
    conn_close(c);
    return;
  }
  memcpy(r->data, a, alen);
  if (blen) memcpy(r->data + alen, b, blen);
  r->c = c;
  r->close_after = close_after;
  uv_buf_t buf = uv_buf_init(r->data, (unsigned)(alen + blen));
  if (uv_write(&r->w, (uv_stream_t *)&c->tcp, &buf, 1, on_written) < 0) {
    free(r);
    conn_close(c);
    return;
  }
  c->writes_pending++;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  buf->base = malloc(suggested);
  buf->len = buf->base ? suggested : 0;
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  tpr_http_conn *c = st->data;
  if (n > 0) conn_read(c, buf->base, (size_t)n);
  else if (n < 0) conn_close(c);  // EOF or error
  free(buf->base);
}

// The answer to the current request is written: take the next one.
static void conn_done(tpr_http_conn *c) {
  c->busy = c->streaming = false;
  tpr_http_reader_next(&c->rd);
  if (c->closing) return;
  if (!c->keep_alive || c->srv->closing) return;  // the write callback closes it
  timer_start(c);
  char *p = c->pending;
  size_t n = c->pending_len;
  c->pending = NULL;
  c->pending_len = 0;
  if (n) conn_read(c, p, n);
  free(p);
  if (!c->closing && !uv_is_active((uv_handle_t *)&c->tcp)) uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

// stream: an event stream, chunked (HTTP/1.1) or close-delimited (1.0).
static void send_head(tpr_http_conn *c, int status, const char *ctype, size_t len, bool stream, const char *body,
                      size_t blen, bool close_after) {
  char head[512];
  bool keep = c->keep_alive && !c->srv->closing;
  int h = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s", status,
                   tpr_http_status_text(status), ctype, keep ? "Connection: keep-alive\r\n" : "Connection: close\r\n");
  if (stream)
    h += snprintf(head + h, sizeof head - (size_t)h, "%sCache-Control: no-cache\r\n\r\n",
                  c->chunked ? "Transfer-Encoding: chunked\r\n" : "");
  else
    h += snprintf(head + h, sizeof head - (size_t)h, "Content-Length: %zu\r\n\r\n", len);
  conn_write(c, head, (size_t)h, body, blen, close_after);
}

void tpr_http_respond(tpr_http_conn *c, int status, const char *content_type, const char *body, size_t len) {
  bool close_after = !c->keep_alive || c->srv->closing;
  send_head(c, status, content_type, len, false, body, len, close_after);
  conn_done(c);
}

void tpr_http_stream_begin(tpr_http_conn *c) {
  c->streaming = true;
  c->chunked = !c->http10;
  if (!c->chunked) c->keep_alive = false;  // the end of the body is the end of the connection
  send_head(c, 200, "text/event-stream", 0, true, NULL, 0, false);
}

void tpr_http_stream_send(tpr_http_conn *c, const char *data, size_t len) {
  if (!len) return;  // a zero-length chunk would end the body
  if (!c->chunked) return conn_write(c, data, len, NULL, 0, false);
  char head[32];
  int h = snprintf(head, sizeof head, "%zx\r\n", len);
  char *b = malloc(len + 2);
  if (!b) return conn_close(c);
  memcpy(b, data, len);
  memcpy(b + len, "\r\n", 2);
  conn_write(c, head, (size_t)h, b, len + 2, false);
  free(b);
}

void tpr_http_stream_end(tpr_http_conn *c) {
  if (c->chunked) conn_write(c, "0\r\n\r\n", 5, NULL, 0, !c->keep_alive || c->srv->closing);
  else conn_close_flushed(c);
  conn_done(c);
}

// Answers a request the reader refused (or a timeout) and closes after it.
static void conn_refuse(tpr_http_conn *c, int status, const char *msg) {
  uv_timer_stop(&c->timer);
  c->busy = true;
  c->keep_alive = false;
  uv_read_stop((uv_stream_t *)&c->tcp);
  if (c->srv->o.on_refused) c->srv->o.on_refused(c->srv->o.ctx, status);
  char *j = tpr_oai_error_json(status, msg, NULL);
  tpr_http_respond(c, status, "application/json", j ? j : "", j ? strlen(j) : 0);
  free(j);
}

static void dispatch(tpr_http_conn *c) {
  uv_timer_stop(&c->timer);  // the answer may take as long as generation does
  tpr_http_request r;
  tpr_http_reader_request(&c->rd, &r);
  c->busy = true;
  c->keep_alive = tpr_http_reader_keep_alive(&c->rd);
  c->http10 = tpr_http_reader_http10(&c->rd);
  c->srv->o.handler(c->srv->o.ctx, c, &r);
}

// Bytes held for the next request while one is answered; past this,
// reading pauses (and a hang-up is then noticed when the answer is written).
#define PENDING_LIMIT ((size_t)1 << 16)

static void conn_read(tpr_http_conn *c, const char *data, size_t len) {
  if (c->busy) {  // bytes past a request being answered wait for it
    if (tpr_http_append(&c->pending, &c->pending_len, data, len) < 0) return conn_close(c);
    if (c->pending_len > PENDING_LIMIT) uv_read_stop((uv_stream_t *)&c->tcp);
    return;
  }
  size_t used = 0;
  int status = 400;
  char msg[160];
  switch (tpr_http_reader_feed(&c->rd, data, len, &used, &status, msg, sizeof msg)) {
    case TPR_HTTP_MORE:
      if (c->rd.expect_continue && !c->rd.continue_sent) {  // the client waits for this before the body
        c->rd.continue_sent = true;
        conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, NULL, 0, false);
      }
      return;
    case TPR_HTTP_REQUEST:
      if (used < len && tpr_http_append(&c->pending, &c->pending_len, data + used, len - used) < 0) return conn_close(c);
      return dispatch(c);
    case TPR_HTTP_BAD:
      conn_refuse(c, status, msg);
      return;
  }
}

// No complete request within the timeout: a half-sent request gets 408, an
// idle keep-alive connection is closed quietly.
static void on_timeout(uv_timer_t *t) {
  tpr_http_conn *c = t->data;
  if (c->busy || c->closing) return;
  // libuv runs timers before it polls sockets, so bytes that arrived while
  // rank 0 was in an engine step are still unread: one more loop turn first.
  if (!c->grace_used) {
    c->grace_used = true;
    uv_timer_start(&c->timer, on_timeout, 1, 0);
    return;
  }
  if (!c->rd.started) return conn_close_flushed(c);
  char msg[160];
  snprintf(msg, sizeof msg, "no complete request within %.3g s", c->srv->o.request_timeout);
  conn_refuse(c, 408, msg);
}

static void timer_start(tpr_http_conn *c) {
  double t = c->srv->o.request_timeout;
  c->grace_used = false;
  if (t > 0) uv_timer_start(&c->timer, on_timeout, (uint64_t)(t * 1000.0 + 0.5), 0);
}

static void refuse_connection(tpr_http_conn *c) {
  char msg[128];
  snprintf(msg, sizeof msg, "too many connections (--max-connections %d)", c->srv->o.max_connections);
  c->keep_alive = false;
  conn_refuse(c, 503, msg);
}

static void on_connection(uv_stream_t *server, int status) {
  tpr_http_server *s = server->data;
  if (status < 0 || !s->accepting) return;
  bool full = s->o.max_connections > 0 && tpr_http_open_conns(s) >= s->o.max_connections;
  tpr_http_conn *c = calloc(1, sizeof *c);
  if (!c) return;
  c->srv = s;
  uv_tcp_init(s->loop, &c->tcp);
  c->tcp.data = c;
  c->open_handles = 1;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0) {
    uv_close((uv_handle_t *)&c->tcp, on_closed);
    return;
  }
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  tpr_http_reader_init(&c->rd, s->o.max_body);
  uv_timer_init(s->loop, &c->timer);
  c->timer.data = c;
  c->open_handles = 2;
  uv_tcp_nodelay(&c->tcp, 1);
  if (full) return refuse_connection(c);
  timer_start(c);
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

tpr_status tpr_http_listen(uv_loop_t *loop, const tpr_http_opts *o, tpr_http_server **out) {
  *out = NULL;
  struct sockaddr_in addr;
  int r = uv_ip4_addr(o->host, o->port, &addr);
  if (r < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "serve: bad --host '%s': %s", o->host, uv_strerror(r));
  tpr_http_server *s = calloc(1, sizeof *s);
  if (!s) return TPR_FAIL(TPR_ERR_OOM, "serve: server");
  s->loop = loop;
  s->o = *o;
  s->accepting = true;
  uv_tcp_init(loop, &s->tcp);
  s->tcp.data = s;
  r = uv_tcp_bind(&s->tcp, (const struct sockaddr *)&addr, 0);
  if (r == 0) r = uv_listen((uv_stream_t *)&s->tcp, 128, on_connection);
  if (r < 0) {
    uv_close((uv_handle_t *)&s->tcp, (uv_close_cb)free);
    return TPR_FAIL(TPR_ERR_IO, "serve: cannot listen on %s:%d: %s", o->host, o->port, uv_strerror(r));
  }
  struct sockaddr_storage name;
  int nl = sizeof name;
  uv_tcp_getsockname(&s->tcp, (struct sockaddr *)&name, &nl);
  s->port = ntohs(((struct sockaddr_in *)&name)->sin_port);
  *out = s;
  return TPR_OK;
}

void tpr_http_stop_accepting(tpr_http_server *s) {
  if (!s->accepting) return;
  s->accepting = false;
  s->closing = true;  // answers from now on close their connection
  uv_close((uv_handle_t *)&s->tcp, NULL);
  // Idle keep-alive connections would otherwise hold the drain open.
  for (tpr_http_conn *c = s->conns, *n; c; c = n) {
    n = c->next;
    if (!c->busy) conn_close_flushed(c);
  }
}

void tpr_http_close_all(tpr_http_server *s) {
  tpr_http_stop_accepting(s);
  while (s->conns) conn_close(s->conns);
}

int tpr_http_port(const tpr_http_server *s) { return s->port; }

int tpr_http_open_conns(const tpr_http_server *s) {
  int n = 0;
  for (tpr_http_conn *c = s->conns; c; c = c->next) n++;
  return n;
}

void tpr_http_free(tpr_http_server *s) { free(s); }
