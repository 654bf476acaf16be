// The HTTP/1.1 request reader of tpr serve (serve/http_reader.c), fed as a
// connection feeds it: the input's first byte seeds the sizes of the pieces
// the rest arrives in; every complete request is released and the bytes past
// it fed again, until the input is used up or the reader refuses it.
#include <stdbool.h>
#include <string.h>

#include "fuzz_common.h"
#include "serve/http_reader.h"

#define FUZZ_MAX_BODY 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  unsigned piece_seed = data[0];
  const char *p = (const char *)data + 1;
  size_t left = size - 1;
  tpr_http_reader rd;
  tpr_http_reader_init(&rd, FUZZ_MAX_BODY);
  int requests = 0;
  while (left > 0) {
    piece_seed = piece_seed * 1103515245u + 12345u;
    size_t n = 1 + (piece_seed >> 16) % 64;
    if (n > left) n = left;
    size_t used = 0;
    int status = 0;
    char msg[160];
    tpr_http_feed f = tpr_http_reader_feed(&rd, p, n, &used, &status, msg, sizeof msg);
    fz_require(used <= n, "the reader uses at most the bytes it was given");
    if (f == TPR_HTTP_BAD) {
      fz_require(status == 400 || status == 413 || status == 417, "a refused request is a 400, 413 or 417");
      fz_require(memchr(msg, 0, sizeof msg) != NULL && msg[0] != 0, "a refusal says why");
      break;
    }
    if (f == TPR_HTTP_REQUEST) {
      tpr_http_request r;
      tpr_http_reader_request(&rd, &r);
      fz_require(r.path != NULL && r.body != NULL, "a request has a path and a body");
      fz_require(r.body_len <= FUZZ_MAX_BODY && strlen(r.body) <= r.body_len, "the body is within the limit");
      fz_require(strlen(r.path) <= TPR_HTTP_MAX_URL, "the path is within the URL limit");
      (void)tpr_http_reader_keep_alive(&rd);
      tpr_http_reader_next(&rd);
      requests++;
      // Bytes past the request are fed again, as a connection does.
      p += used;
      left -= used;
      continue;
    }
    fz_require(used == n, "a reader wanting more has used every byte");
    p += n;
    left -= n;
  }
  tpr_http_reader_free(&rd);
  (void)requests;
  return 0;
}
