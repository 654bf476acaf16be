// One request at a time: on a complete message the parser is paused, so
// pipelined bytes stay with the caller until the answer is written.
#include "serve/http_reader.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tpr_http_append(char **p, size_t *len, const char *at, size_t n) {
  char *q = realloc(*p, *len + n + 1);
  if (!q) return -1;
  memcpy(q + *len, at, n);
  *len += n;
  q[*len] = 0;
  *p = q;
  return 0;
}

static void clear(tpr_http_reader *r) {
  free(r->url);
  free(r->body);
  r->url = r->body = NULL;
  r->url_len = r->body_len = 0;
}

static void clear_expect(tpr_http_reader *r) {
  r->field_len = r->expect_len = 0;
  r->in_value = r->field_is_expect = r->expect_continue = r->expect_failed = r->continue_sent = false;
}

static int on_message_begin(http_parser *p) {
  tpr_http_reader *r = p->data;
  clear(r);
  clear_expect(r);
  r->started = true;
  return 0;
}

static void lower_into(char *dst, size_t cap, size_t *len, const char *at, size_t n) {
  for (size_t i = 0; i < n && *len + 1 < cap; i++) {
    char c = at[i];
    dst[(*len)++] = c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
  }
  dst[*len] = 0;
}

// A header name may come in pieces; a new name starts after a value.
static int on_header_field(http_parser *p, const char *at, size_t n) {
  tpr_http_reader *r = p->data;
  if (r->in_value) r->field_len = 0, r->in_value = false;
  lower_into(r->field, sizeof r->field, &r->field_len, at, n);
  return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t n) {
  tpr_http_reader *r = p->data;
  if (!r->in_value) r->in_value = true, r->field_is_expect = strcmp(r->field, "expect") == 0;
  if (r->field_is_expect) lower_into(r->expect, sizeof r->expect, &r->expect_len, at, n);
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t n) {
  tpr_http_reader *r = p->data;
  return r->url_len + n > TPR_HTTP_MAX_URL ? -1 : tpr_http_append(&r->url, &r->url_len, at, n);
}

static int on_headers_complete(http_parser *p) {
  tpr_http_reader *r = p->data;
  // A declared length past the limit is refused before reading it.
  if (p->content_length != ULLONG_MAX && p->content_length > r->max_body) {
    r->too_big = true;
    return -1;
  }
  if (r->expect_len) {
    r->expect_continue = strcmp(r->expect, "100-continue") == 0;
    r->expect_failed = !r->expect_continue;
    if (r->expect_failed) return -1;
  }
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t n) {
  tpr_http_reader *r = p->data;
  if (r->body_len + n > r->max_body) {  // chunked bodies have no declared length
    r->too_big = true;
    return -1;
  }
  return tpr_http_append(&r->body, &r->body_len, at, n);
}

static int on_message_complete(http_parser *p) {
  tpr_http_reader *r = p->data;
  r->complete = true;
  http_parser_pause(p, 1);
  return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

void tpr_http_reader_init(tpr_http_reader *r, size_t max_body) {
  memset(r, 0, sizeof *r);
  http_parser_init(&r->parser, HTTP_REQUEST);
  r->parser.data = r;
  r->max_body = max_body;
}

void tpr_http_reader_free(tpr_http_reader *r) { clear(r); }

tpr_http_feed tpr_http_reader_feed(tpr_http_reader *r, const char *data, size_t len, size_t *used, int *status,
                                   char *msg, size_t msglen) {
  *used = http_parser_execute(&r->parser, &settings, data, len);
  enum http_errno err = HTTP_PARSER_ERRNO(&r->parser);
  if (err == HPE_PAUSED && r->complete) return TPR_HTTP_REQUEST;
  if (err == HPE_OK) return TPR_HTTP_MORE;
  *status = r->too_big ? 413 : r->expect_failed ? 417 : 400;
  if (r->too_big) snprintf(msg, msglen, "request body larger than %zu bytes", r->max_body);
  else if (r->expect_failed) snprintf(msg, msglen, "Expect: %s is not supported (only 100-continue)", r->expect);
  else if (err == HPE_CB_url)
    snprintf(msg, msglen, "malformed HTTP request: URL longer than %d bytes", TPR_HTTP_MAX_URL);
  else snprintf(msg, msglen, "malformed HTTP request: %s", http_errno_description(err));
  return TPR_HTTP_BAD;
}

void tpr_http_reader_request(tpr_http_reader *r, tpr_http_request *out) {
  static char empty[1];
  empty[0] = 0;
  char *url = r->url ? r->url : empty;
  char *q = strchr(url, '?');
  if (q) *q = 0;
  *out = (tpr_http_request){.method = (int)r->parser.method, .path = url, .body = r->body ? r->body : empty,
                            .body_len = r->body_len};
}

bool tpr_http_reader_keep_alive(const tpr_http_reader *r) { return http_should_keep_alive(&r->parser) != 0; }

bool tpr_http_reader_http10(const tpr_http_reader *r) {
  return r->parser.http_major == 1 && r->parser.http_minor == 0;
}

void tpr_http_reader_next(tpr_http_reader *r) {
  clear(r);
  clear_expect(r);
  r->started = r->complete = false;
  // After a refused request the parser stays in its error state (the
  // connection closes); http-parser asserts on unpausing that.
  if (HTTP_PARSER_ERRNO(&r->parser) == HPE_PAUSED) http_parser_pause(&r->parser, 0);
}
