// The load generator of tpr bench serve: N concurrent clients, each sending
// its requests one after another as streaming POSTs over real TCP sockets,
// all on one libuv loop in the calling thread (it sleeps in epoll between
// bytes, so it costs the server's ranks little CPU). Each response is parsed
// as HTTP/1.1 (http-parser: status, headers, chunked transfer encoding), its
// body as server-sent events, each event's data as an OpenAI completion
// chunk; the arrival time of every chunk carrying text is kept.
#ifndef TPR_BENCH_SERVE_CLIENT_H
#define TPR_BENCH_SERVE_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

// One request's outcome. Times are CLOCK_MONOTONIC seconds (tpr_cli_now's clock).
typedef struct tpr_load_request {
  double t_start;          // just before connecting (TTFT counts from here, as vLLM's does)
  double t_end;            // the response's last byte
  double *text_times;      // arrival of each SSE chunk whose choices[0].text is not empty
  int64_t n_text;
  int64_t completion_tokens;  // the usage chunk's; -1 when none came
  int http_status;            // 0 when no status line came
  char finish_reason[32];     // "" when none came
  bool done;                  // data: [DONE] came
  char error[320];            // "" when the request is answered correctly
} tpr_load_request;

typedef struct tpr_load_opts {
  const char *host;         // an IPv4 address
  int port;
  const char *path;         // "/v1/completions"
  int clients;
  int requests_per_client;
  // clients x requests_per_client JSON bodies: client c's k-th request sends
  // bodies[k * clients + c], so the first round sends the first `clients`.
  char *const *bodies;
  int64_t expect_completion_tokens;  // a usage chunk with any other count is an error (< 0: any count up to -it)
  double idle_timeout_s;             // a request that receives nothing for this long fails
} tpr_load_opts;

// Runs every request to its end (answered or failed) and fills out[i] for
// the request of bodies[i]; free them with tpr_load_requests_free. Returns
// false only when the loop itself could not run (out of memory, libuv), with
// a message on stderr; failed requests are reported in out[i].error.
bool tpr_load_run(const tpr_load_opts *o, tpr_load_request *out);
void tpr_load_requests_free(tpr_load_request *r, int64_t n);

#endif
