// The HTTP/1.1 request reader under tpr serve's connections: Debian's
// http-parser fed with whatever bytes arrive, yielding one complete request
// at a time (keep-alive, Content-Length and chunked bodies, a body limit).
// It owns no socket, so the fuzz target drives it with arbitrary bytes
// exactly as a connection does.
#ifndef TPR_SERVE_HTTP_READER_H
#define TPR_SERVE_HTTP_READER_H

#include <stdbool.h>
#include <stddef.h>

#include <http_parser.h>

#define TPR_HTTP_MAX_URL 8192

typedef struct tpr_http_request {
  int method;         // http-parser's enum http_method
  char *path;         // without the query string
  char *body;         // NUL-terminated
  size_t body_len;
} tpr_http_request;

typedef struct tpr_http_reader {
  http_parser parser;
  size_t max_body;
  char *url, *body;      // NUL-terminated as they grow
  size_t url_len, body_len;
  bool started;          // bytes of the current request have arrived
  bool too_big;          // the body passed max_body
  bool complete;         // a request is complete and not yet released
  // The Expect header (RFC 9110 10.1.1): 100-continue asks for an interim
  // "100 Continue" before the body; any other expectation is refused (417).
  char field[16];        // the header name being read, lowercased (cut at 15 bytes)
  size_t field_len;
  bool in_value, field_is_expect;
  char expect[32];       // Expect's value, lowercased (cut at 31 bytes)
  size_t expect_len;
  bool expect_continue;  // the headers are complete and ask for 100 Continue
  bool expect_failed;    // an expectation other than 100-continue
  bool continue_sent;    // the connection has answered it
} tpr_http_reader;

typedef enum tpr_http_feed {
  TPR_HTTP_MORE = 0,     // every byte used; no complete request yet
  TPR_HTTP_REQUEST = 1,  // a request is complete; bytes past *used belong to later requests
  TPR_HTTP_BAD = 2,      // malformed (400), too large (413) or an unknown Expect (417): answer and close
} tpr_http_feed;

// Appends n bytes to a growing NUL-terminated buffer; -1 when out of memory.
int tpr_http_append(char **p, size_t *len, const char *at, size_t n);

void tpr_http_reader_init(tpr_http_reader *r, size_t max_body);
void tpr_http_reader_free(tpr_http_reader *r);

// Feeds len bytes. On TPR_HTTP_BAD *status is 400 or 413 and msg says why.
// After TPR_HTTP_REQUEST, call tpr_http_reader_next before feeding more.
tpr_http_feed tpr_http_reader_feed(tpr_http_reader *r, const char *data, size_t len, size_t *used, int *status,
                                   char *msg, size_t msglen);

// The complete request; its strings live until tpr_http_reader_next.
void tpr_http_reader_request(tpr_http_reader *r, tpr_http_request *out);
bool tpr_http_reader_keep_alive(const tpr_http_reader *r);
// HTTP/1.0 (no chunked transfer encoding: a stream's end is the connection's).
bool tpr_http_reader_http10(const tpr_http_reader *r);

// Releases the answered request and readies the reader for the next one.
void tpr_http_reader_next(tpr_http_reader *r);

#endif
