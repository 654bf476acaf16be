// The state rank 0's server shares between routes.c and loop.c.
#ifndef TPR_SERVE_IMPL_H
#define TPR_SERVE_IMPL_H

#include "serve/serve.h"

typedef struct serve_req {
  struct serve_req *next;
  tpr_http_conn *conn;     // NULL once the client has gone
  tpr_oai_request r;
  int64_t seq;             // engine sequence id
  int64_t prompt_len;
  int64_t gen_seen;        // generated tokens already looked at
  char id[48];
  int64_t created;
  size_t sent;             // bytes of text already streamed
  double t_submit;
  bool first_sent;         // a token reached the client (time to first token taken)
  bool responded;          // the answer is complete (or nobody waits for it)
  bool engine_done;        // the engine has finished the sequence
} serve_req;

#define SERVE_TTFT_BUCKETS 10

typedef struct serve_metrics {
  int64_t by_status[6];    // 200 400 404 405 413 5xx
  int64_t prompt_tokens, generated_tokens;
  int64_t ttft_count[SERVE_TTFT_BUCKETS + 1];  // cumulative at render time; +Inf last
  double ttft_sum;
} serve_metrics;

typedef struct serve_state {
  uv_loop_t loop;
  uv_timer_t tick;
  uv_signal_t sigterm, sigint;
  tpr_http_server *http;
  tpr_engine *e;
  const tpr_tokenizer *tok;
  const tpr_serve_opts *o;
  serve_req *reqs;
  int64_t next_id;
  bool stopping;
  serve_metrics m;
} serve_state;

// routes.c: the http handler and the on_close callback (ctx: serve_state).
void serve_handle(void *ctx, tpr_http_conn *c, const tpr_http_request *r);
void serve_conn_closed(void *ctx, tpr_http_conn *c);
void serve_count_status(serve_state *st, int status);
void serve_observe_ttft(serve_state *st, double seconds);
double serve_now(void);

#endif
