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
  double t_last_token;     // when the latest generated token was seen
  bool first_sent;         // a token reached the client (time to first token taken)
  bool responded;          // the answer is complete (or nobody waits for it)
  bool engine_done;        // the engine has finished the sequence
} serve_req;

#define SERVE_HIST_BUCKETS 12
#define SERVE_N_STATUS 9  // 200 400 404 405 408 413 500 503, other

// A Prometheus histogram: per-bucket counts (made cumulative when
// rendered), +Inf last.
typedef struct serve_hist {
  int64_t count[SERVE_HIST_BUCKETS + 1];
  double sum;
} serve_hist;

typedef struct serve_metrics {
  int64_t by_status[SERVE_N_STATUS];
  int64_t prompt_tokens, generated_tokens;
  serve_hist ttft;  // submission to the first generated token
  serve_hist itl;   // between consecutive generated tokens of a request
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
  double t_stop;           // when the signal came
  serve_metrics m;
} serve_state;

// routes.c: the http handler and the on_close callback (ctx: serve_state).
void serve_handle(void *ctx, tpr_http_conn *c, const tpr_http_request *r);
void serve_conn_closed(void *ctx, tpr_http_conn *c);
void serve_count_status(serve_state *st, int status);
void serve_observe(serve_hist *h, double seconds);
double serve_now(void);

#endif
