// The state of rank 0's server, shared by its two threads:
//   the HTTP thread runs the libuv loop (http.c): it parses, tokenizes and
//     checks requests (routes.c), queues them, and turns the tokens the
//     engine publishes into answers and streamed chunks (answer.c);
//   the engine thread (the process's main thread, the only one that calls
//     MPI) takes the queue between steps, runs the engine steps with the
//     other ranks, and publishes each step's tokens (engine_loop.c).
// They meet in serve_bridge (bridge.c): one mutex over the queues and the
// fields marked "shared" below; the engine thread waits on a condition
// variable for work, the HTTP thread is woken by a uv_async_t.
#ifndef TPR_SERVE_IMPL_H
#define TPR_SERVE_IMPL_H

#include <pthread.h>

#include "serve/serve.h"

// Text from generated tokens, a few tokens at a time (vLLM's incremental
// detokenization): the text of tokens [prefix, n) minus that of
// [prefix, read) is what the tokens since `read` add, once it does not end
// in an incomplete character (U+FFFD). Each step decodes a short window,
// not the whole answer, and the window's first tokens give the decoder
// (Metaspace, Strip) the context it needs.
typedef struct serve_detok {
  char *text;              // the text so far (text_len bytes, NUL-terminated)
  size_t text_len, cap;
  int64_t prefix, read;    // token offsets of the window
} serve_detok;

// One choice of a request: one engine sequence.
typedef struct serve_choice {
  // shared: the engine thread appends what it generates
  int64_t seq;                  // the engine's sequence id (-1: not submitted)
  int32_t *out;                 // (n_out) generated tokens, as published
  tpr_token_logprob *out_lp;    // (n_out) with logprobs
  int64_t n_out, cap_out;
  bool finished;                // the engine has ended it
  bool cancel;                  // HTTP -> engine: end it (its stop string came)
  // HTTP thread only
  int32_t *gen;                 // (n_gen) the tokens taken from `out`
  tpr_token_logprob *gen_lp;
  int64_t n_gen, cap_gen;
  bool engine_done;             // `finished` as last taken
  int64_t n_done;               // tokens turned into text
  int64_t n_counted;            // tokens the answer holds (a stop string ends it at its token)
  size_t *text_after;           // (n_gen) text length once each token was decoded
  serve_detok dt;
  size_t end;                   // the answer's text length (a stop string cuts it)
  size_t sent;                  // text bytes streamed
  int64_t lp_sent;              // tokens whose logprobs were streamed
  const char *finish;           // "stop" / "length", NULL while it runs
  bool role_sent;               // chat stream: the role delta went out
  bool final_sent;              // its finish_reason went out
  // chat with tool-call or reasoning parsing (answer.c)
  tpr_parsed_choice *parsed;    // the text so far split (NULL: no parsing, or not started)
} serve_choice;

typedef struct serve_req {
  struct serve_req *next;       // HTTP thread: every request it tracks
  struct serve_req *q_next;     // shared: the submit queue / the update queue
  struct serve_req *e_next;     // engine thread: the requests it runs
  // Set by the HTTP thread before queueing; read-only afterwards.
  tpr_oai_request r;
  int32_t *prompt;              // (prompt_len) token ids
  int64_t prompt_len;
  tpr_gen_params *g;            // (r.n) per choice: its own seed
  tpr_logit_bias *bias;         // (r.n_bias) shared by every choice's g
  tpr_token_constraint *constraints;  // (r.n) each choice's grammar state (r.r.grammar); NULL: none
  char id[48];
  int64_t created;
  double t_submit;
  serve_choice *ch;             // (r.n)
  // shared
  bool cancel;                  // HTTP -> engine: end every choice (the client went away)
  bool released;                // engine -> HTTP: the engine holds nothing of it any more
  bool queued;                  // on the update queue
  bool cut_off;                 // ended by the drain timeout
  int err_status;               // the engine refused it (non-zero): answered with err
  char err[300];
  // HTTP thread only
  tpr_http_conn *conn;          // NULL once the client has gone
  bool responded;               // the answer is complete (or nobody waits)
  bool released_seen;           // `released`, as last taken
  bool first_token_seen;
  double t_last_token;
  char *echo_text;              // completions with echo: the prompt's text
  size_t echo_len;
} serve_req;

#define SERVE_HIST_BUCKETS 12
#define SERVE_N_STATUS 10  // 200 400 404 405 408 413 417 500 503, other

// A Prometheus histogram: per-bucket counts (made cumulative when
// rendered), +Inf last.
typedef struct serve_hist {
  int64_t count[SERVE_HIST_BUCKETS + 1];
  double sum;
} serve_hist;

// HTTP thread only.
typedef struct serve_metrics {
  int64_t by_status[SERVE_N_STATUS];
  int64_t prompt_tokens, generated_tokens;
  serve_hist ttft;  // submission to the first generated token
  serve_hist itl;   // between consecutive generated tokens of a request
} serve_metrics;

// What the engine thread last saw of the engine (for /metrics).
typedef struct serve_gauges {
  int64_t running, waiting, blocks_in_use, preemptions, steps;
  tpr_engine_prefix_stats prefix;  // the prefix cache (all 0 with --no-prefix-cache)
  tpr_sched_spec_stats spec;       // speculative decoding (all 0 without drafts)
  double step_seconds;  // rank 0's time inside engine steps, summed
  double mask_seconds;  // of which computing grammar masks
} serve_gauges;

typedef struct serve_bridge {
  pthread_mutex_t mu;
  pthread_cond_t work;          // the engine thread waits here for something to do
  serve_req *submit_head, *submit_tail;  // HTTP -> engine, first in first out
  serve_req *update_head;       // engine -> HTTP: requests with news
  int64_t cancels;              // cancel flags set since the engine last looked
  bool stopping;                // a stop signal came: drain, then stop
  double t_stop;                // when
  double drain_s;               // how long the in-flight requests may take from then (<= 0: no limit)
  bool engine_exited;           // the engine thread has left its loop (the HTTP thread closes up)
  bool engine_failed;           // ... because a step failed: unfinished answers get 500
  serve_gauges gauges;
  uv_async_t wake_http;         // engine -> HTTP thread
} serve_bridge;

typedef struct serve_state {
  uv_loop_t loop;
  uv_signal_t sigterm, sigint;
  tpr_http_server *http;
  pthread_t http_thread;
  tpr_engine *e;
  const tpr_tokenizer *tok;
  tpr_vocab_bytes *vocab_bytes;  // rank 0: each id's bytes, for structured output's masks
  const tpr_serve_opts *o;
  serve_bridge b;
  // HTTP thread only
  serve_req *reqs;              // every request not yet freed
  int64_t next_id;
  bool stopping;                // a stop signal came (or the engine stopped)
  bool closing;                 // the engine has stopped: final writes, then the loop ends
  double t_flush;
  uv_timer_t flush;
  serve_metrics m;
} serve_state;

// bridge.c (any thread, locking inside)
tpr_status serve_bridge_init(serve_state *st);
void serve_bridge_destroy(serve_state *st);
void serve_bridge_submit(serve_state *st, serve_req *r);          // HTTP
void serve_bridge_cancel(serve_state *st, serve_req *r, int choice);  // HTTP; choice -1: all
void serve_bridge_stop(serve_state *st, double drain_s);          // HTTP (the signal)
// engine thread, with the lock held: puts r on the update queue.
void serve_bridge_notify_locked(serve_state *st, serve_req *r);

// engine_loop.c
tpr_status serve_engine_loop(serve_state *st, tpr_comm_t world);  // rank 0's engine thread
tpr_status serve_follow_loop(tpr_engine *e, tpr_comm_t world);    // every other rank

// answer.c (HTTP thread): the updates the engine published, into answers.
void serve_take_updates(serve_state *st);
void serve_req_free(serve_req *r);
void serve_detok_free(serve_detok *d);

// routes.c (HTTP thread): the http handler and the on_close callback (ctx: serve_state).
void serve_handle(void *ctx, tpr_http_conn *c, const tpr_http_request *r);
void serve_conn_closed(void *ctx, tpr_http_conn *c);
// submit.c (HTTP thread): a generation request, parsed, checked and queued.
void serve_generate(serve_state *st, tpr_http_conn *c, const tpr_http_request *hr, bool chat);
void serve_count_status(serve_state *st, int status);
void serve_observe(serve_hist *h, double seconds);
void serve_respond_error(serve_state *st, tpr_http_conn *c, int status, const char *msg, const char *param);
double serve_now(void);

#endif
