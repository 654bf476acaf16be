// HTTP/1.1 on libuv with Debian's http-parser: keep-alive, Content-Length and
// chunked request bodies (the parser de-chunks them), a body size limit
// (413), 400 on a request the parser rejects. One request at a time per
// connection: after a complete request the parser is paused and reading stops
// until the answer is written, so pipelined bytes wait in `pending`.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <http_parser.h>

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
  http_parser parser;
  char *url, *body;
  size_t url_len, body_len;
  bool too_big;      // the body passed max_body: answered 413, then closed
  bool busy;         // a request is waiting for its answer
  bool keep_alive;   // of the request being answered
  bool closing;
  bool streaming;
  char *pending;     // bytes read past the request being answered
  size_t pending_len;
};

static void conn_read(tpr_http_conn *c, const char *data, size_t len);

const char *tpr_http_status_text(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

static void on_closed(uv_handle_t *h) {
  tpr_http_conn *c = h->data;
  free(c->url);
  free(c->body);
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
  if ((status < 0 || r->close_after) && !r->c->closing) conn_close(r->c);
  free(r);
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
  }
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
  free(c->url);
  free(c->body);
  c->url = c->body = NULL;
  c->url_len = c->body_len = 0;
  if (c->closing) return;
  if (!c->keep_alive || c->srv->closing) return;  // the write callback closes it
  http_parser_pause(&c->parser, 0);
  char *p = c->pending;
  size_t n = c->pending_len;
  c->pending = NULL;
  c->pending_len = 0;
  if (n) conn_read(c, p, n);
  free(p);
  if (!c->busy && !c->closing) uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void send_head(tpr_http_conn *c, int status, const char *ctype, size_t len, bool chunked, const char *body,
                      size_t blen, bool close_after) {
  char head[512];
  int h = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s%s", status, tpr_http_status_text(status),
                   ctype, c->keep_alive && !c->srv->closing ? "Connection: keep-alive\r\n" : "Connection: close\r\n",
                   chunked ? "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n\r\n" : "");
  if (!chunked) h += snprintf(head + h, sizeof head - (size_t)h, "Content-Length: %zu\r\n\r\n", len);
  conn_write(c, head, (size_t)h, body, blen, close_after);
}

void tpr_http_respond(tpr_http_conn *c, int status, const char *content_type, const char *body, size_t len) {
  bool close_after = !c->keep_alive || c->srv->closing;
  send_head(c, status, content_type, len, false, body, len, close_after);
  conn_done(c);
}

void tpr_http_stream_begin(tpr_http_conn *c) {
  c->streaming = true;
  send_head(c, 200, "text/event-stream", 0, true, NULL, 0, false);
}

void tpr_http_stream_send(tpr_http_conn *c, const char *data, size_t len) {
  if (!len) return;  // a zero-length chunk would end the body
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
  conn_write(c, "0\r\n\r\n", 5, NULL, 0, !c->keep_alive || c->srv->closing);
  conn_done(c);
}

// --- parser callbacks --------------------------------------------------------
static int grow(char **p, size_t *len, const char *at, size_t n) {
  char *q = realloc(*p, *len + n + 1);
  if (!q) return -1;
  memcpy(q + *len, at, n);
  *len += n;
  q[*len] = 0;
  *p = q;
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t n) {
  tpr_http_conn *c = p->data;
  return c->url_len + n > 8192 ? -1 : grow(&c->url, &c->url_len, at, n);
}

static int on_body(http_parser *p, const char *at, size_t n) {
  tpr_http_conn *c = p->data;
  if (c->body_len + n > c->srv->o.max_body) {
    c->too_big = true;
    return -1;
  }
  return grow(&c->body, &c->body_len, at, n);
}

static int on_message_begin(http_parser *p) {
  tpr_http_conn *c = p->data;
  free(c->url);
  free(c->body);
  c->url = c->body = NULL;
  c->url_len = c->body_len = 0;
  return 0;
}

static int on_headers_complete(http_parser *p) {
  tpr_http_conn *c = p->data;
  // A declared length past the limit is refused before reading it.
  if (p->content_length != ULLONG_MAX && p->content_length > c->srv->o.max_body) {
    c->too_big = true;
    return -1;
  }
  return 0;
}

static int on_message_complete(http_parser *p) {
  tpr_http_conn *c = p->data;
  c->busy = true;
  c->keep_alive = http_should_keep_alive(p);
  http_parser_pause(p, 1);  // one request at a time
  return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_body = on_body,
    .on_headers_complete = on_headers_complete,
    .on_message_complete = on_message_complete,
};

static void dispatch(tpr_http_conn *c) {
  char empty[1] = "";
  char *url = c->url ? c->url : empty;
  char *q = strchr(url, '?');
  if (q) *q = 0;
  tpr_http_request r = {.method = (int)c->parser.method, .path = url, .body = c->body ? c->body : empty,
                        .body_len = c->body_len};
  c->srv->o.handler(c->srv->o.ctx, c, &r);
}

static void conn_read(tpr_http_conn *c, const char *data, size_t len) {
  if (c->busy) {  // bytes past a request being answered wait for it
    if (grow(&c->pending, &c->pending_len, data, len) < 0) conn_close(c);
    uv_read_stop((uv_stream_t *)&c->tcp);
    return;
  }
  size_t used = http_parser_execute(&c->parser, &settings, data, len);
  enum http_errno err = HTTP_PARSER_ERRNO(&c->parser);
  if (err == HPE_PAUSED) {
    uv_read_stop((uv_stream_t *)&c->tcp);
    if (used < len && grow(&c->pending, &c->pending_len, data + used, len - used) < 0) return conn_close(c);
    dispatch(c);
    return;
  }
  if (err != HPE_OK) {
    c->busy = true;
    c->keep_alive = false;
    uv_read_stop((uv_stream_t *)&c->tcp);
    int status = c->too_big ? 413 : 400;
    char msg[160];
    if (c->too_big) snprintf(msg, sizeof msg, "request body larger than %zu bytes", c->srv->o.max_body);
    else snprintf(msg, sizeof msg, "malformed HTTP request: %s", http_errno_description(err));
    char *j = tpr_oai_error_json(status, msg);
    tpr_http_respond(c, status, "application/json", j ? j : "", j ? strlen(j) : 0);
    free(j);
  }
}

static void on_connection(uv_stream_t *server, int status) {
  tpr_http_server *s = server->data;
  if (status < 0 || !s->accepting) return;
  tpr_http_conn *c = calloc(1, sizeof *c);
  if (!c) return;
  c->srv = s;
  uv_tcp_init(s->loop, &c->tcp);
  c->tcp.data = c;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0) {
    uv_close((uv_handle_t *)&c->tcp, on_closed);
    return;
  }
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  http_parser_init(&c->parser, HTTP_REQUEST);
  c->parser.data = c;
  uv_tcp_nodelay(&c->tcp, 1);
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
    if (!c->busy) conn_close(c);
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
