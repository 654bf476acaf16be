// The serving loop. Rank 0 alternates a turn of the libuv loop (accepting
// requests, submitting them to the engine) with one engine step, and before
// every step broadcasts a flag to every rank: STEP (run tpr_engine_step, a
// collective), IDLE (nothing to run) or STOP (drained: leave). While idle
// rank 0 blocks in the event loop for at most one tick (SERVE_TICK_MS) and
// the other ranks sleep for most of a tick before the next broadcast, so an
// idle server does not spin a core in MPI's polling wait, and the collective
// watchdog sees a broadcast every tick.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/serve_impl.h"

enum { FLAG_STEP = 1, FLAG_IDLE = 2, FLAG_STOP = 3 };
#define SERVE_TICK_MS 50
#define SERVE_IDLE_SLEEP_MS 40  // a little under a tick: the others wait in the broadcast briefly

static void sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ms * 1000000L};
  nanosleep(&ts, NULL);
}

static void send_sse(tpr_http_conn *c, const char *json) {
  size_t n = strlen(json);
  char *b = malloc(n + 9);
  if (!b) return;
  memcpy(b, "data: ", 6);
  memcpy(b + 6, json, n);
  memcpy(b + 6 + n, "\n\n", 2);
  tpr_http_stream_send(c, b, n + 8);
  free(b);
}

static void stream_text(serve_req *r, const serve_state *st, const char *text, size_t len, const char *finish) {
  char *j = tpr_oai_chunk_json(r->r.chat, r->id, r->created, st->o->model_id, len ? text : NULL, len, finish,
                               !r->first_sent);
  if (j) send_sse(r->conn, j);
  free(j);
  r->first_sent = true;
}

// The first place `needle` occurs in the n bytes of hay (which may hold NUL
// bytes, so not strstr), or NULL.
static const char *find_bytes(const char *hay, size_t n, const char *needle) {
  size_t m = strlen(needle);
  if (m == 0 || m > n) return NULL;
  for (size_t i = 0; i + m <= n; i++)
    if (hay[i] == needle[0] && memcmp(hay + i, needle, m) == 0) return hay + i;
  return NULL;
}

// Rank 0, after a step: what each request's new tokens add to its answer.
static void progress(serve_state *st, serve_req *r) {
  tpr_sched_seq_info si;
  if (tpr_engine_result(st->e, r->seq, &si) != TPR_OK) {
    r->engine_done = true;  // cannot happen for an id the engine gave; never loop on it
    if (r->conn && !r->responded) {
      char *j = tpr_oai_error_json(500, tpr_last_error());
      if (r->r.stream) tpr_http_stream_end(r->conn);
      else tpr_http_respond(r->conn, 500, "application/json", j, strlen(j));
      free(j);
    }
    r->responded = true;
    return;
  }
  if (si.finished) r->engine_done = true;
  if (r->responded) return;
  if (!r->conn) {  // the client went away: its sequence ends now and frees its blocks
    r->responded = true;
    if (!r->engine_done && tpr_engine_cancel(st->e, r->seq) == TPR_OK) r->engine_done = true;
    return;
  }
  int64_t gen = si.len - si.prompt_len;
  if (gen == r->gen_seen && !si.finished) return;
  if (gen > r->gen_seen) {
    double now = serve_now();
    if (r->gen_seen == 0) {
      serve_observe(&st->m.ttft, now - r->t_submit);
    } else {  // tokens that came in one step share its time
      double per = (now - r->t_last_token) / (double)(gen - r->gen_seen);
      for (int64_t k = r->gen_seen; k < gen; k++) serve_observe(&st->m.itl, per);
    }
    r->t_last_token = now;
  }
  r->gen_seen = gen;
  char *text = NULL;
  size_t tl = 0;
  // Ids in the model's padding past the tokenizer's vocabulary have no text.
  if (tpr_tokenizer_decode_known(st->tok, si.tokens + si.prompt_len, (size_t)gen, true, &text, &tl) != TPR_OK) {
    text = strdup("");  // out of memory: the request ends with what was sent
    tl = 0;
  }
  if (!text) return;
  const char *finish = NULL;
  size_t end = tl, longest_stop = 0;
  for (int i = 0; i < r->r.n_stop; i++) {
    size_t sl = strlen(r->r.stop[i]);
    if (sl > longest_stop) longest_stop = sl;
    const char *p = find_bytes(text, tl, r->r.stop[i]);
    if (p && (size_t)(p - text) < end) {
      end = (size_t)(p - text);
      finish = "stop";
    }
  }
  if (!finish && si.finished)
    finish = gen > 0 && !r->r.ignore_eos && st->o->eos >= 0 && si.tokens[si.len - 1] == st->o->eos ? "stop"
                                                                                                   : "length";
  if (r->r.stream) {
    size_t stable = end;
    if (!finish) {
      // An incomplete UTF-8 character decodes to U+FFFD until its last byte
      // comes; a tail that may begin a stop string waits for the next token.
      while (stable >= 3 && memcmp(text + stable - 3, "\xEF\xBF\xBD", 3) == 0) stable -= 3;
      stable = stable > (longest_stop ? longest_stop - 1 : 0) ? stable - (longest_stop ? longest_stop - 1 : 0) : 0;
      while (stable > r->sent && stable < tl && ((unsigned char)text[stable] & 0xC0) == 0x80) stable--;
    }
    if (stable > r->sent) {
      stream_text(r, st, text + r->sent, stable - r->sent, NULL);
      r->sent = stable;
    }
    if (finish) {
      char *j = tpr_oai_chunk_json(r->r.chat, r->id, r->created, st->o->model_id, NULL, 0, finish, !r->first_sent);
      if (j) send_sse(r->conn, j);
      free(j);
      if (r->r.include_usage) {
        j = tpr_oai_usage_chunk_json(r->r.chat, r->id, r->created, st->o->model_id, r->prompt_len, gen);
        if (j) send_sse(r->conn, j);
        free(j);
      }
      send_sse(r->conn, "[DONE]");
      tpr_http_stream_end(r->conn);
    }
  } else if (finish) {
    char *j = tpr_oai_response_json(r->r.chat, r->id, r->created, st->o->model_id, text, end, finish, r->prompt_len,
                                    gen);
    if (j) {
      serve_count_status(st, 200);
      tpr_http_respond(r->conn, 200, "application/json", j, strlen(j));
    } else {
      serve_count_status(st, 500);
      tpr_http_respond(r->conn, 500, "application/json", "{}", 2);
    }
    free(j);
  }
  if (gen > 0) r->first_sent = true;
  if (finish) {
    r->responded = true;
    st->m.generated_tokens += gen;
    // A stop string ended the answer: the sequence stops generating.
    if (!r->engine_done && tpr_engine_cancel(st->e, r->seq) == TPR_OK) r->engine_done = true;
  }
  free(text);
}

static void progress_all(serve_state *st) {
  for (serve_req **p = &st->reqs; *p;) {
    serve_req *r = *p;
    if (!r->engine_done || !r->responded) progress(st, r);
    if (r->engine_done && r->responded) {
      *p = r->next;
      tpr_oai_request_free(&r->r);
      free(r);
    } else {
      p = &r->next;
    }
  }
}

static bool engine_busy(const serve_state *st) {
  for (serve_req *r = st->reqs; r; r = r->next)
    if (!r->engine_done) return true;
  return false;
}

static void on_tick(uv_timer_t *t) {}  // wakes uv_run(UV_RUN_ONCE) so rank 0 broadcasts each tick

static void on_signal(uv_signal_t *h, int signum) {
  serve_state *st = h->data;
  if (st->stopping) return;
  if (engine_busy(st) && st->o->drain_timeout > 0)
    fprintf(stderr, "tpr serve: signal %d: finishing the in-flight requests (at most %.3g s), then exiting\n", signum,
            st->o->drain_timeout);
  else
    fprintf(stderr, "tpr serve: signal %d: %s, then exiting\n", signum,
            engine_busy(st) ? "finishing the in-flight requests" : "no request in flight");
  st->stopping = true;
  st->t_stop = serve_now();
  tpr_http_stop_accepting(st->http);
}

// The drain ran past --drain-timeout: every unfinished sequence ends now; a
// streaming client gets an error event, a waiting one a 503.
static void cut_off(serve_state *st) {
  const char *msg = "the server shut down before the answer was complete (--drain-timeout)";
  int64_t n = 0;
  for (serve_req *r = st->reqs; r; r = r->next) {
    if (r->engine_done) continue;
    if (tpr_engine_cancel(st->e, r->seq) == TPR_OK) r->engine_done = true;
    n++;
    if (!r->conn || r->responded) continue;
    char *j = tpr_oai_error_json(503, msg);
    if (r->r.stream) {
      if (j) send_sse(r->conn, j);
      tpr_http_stream_end(r->conn);
    } else {
      serve_count_status(st, 503);
      tpr_http_respond(r->conn, 503, "application/json", j ? j : "{}", j ? strlen(j) : 2);
    }
    free(j);
    r->responded = true;
  }
  fprintf(stderr, "tpr serve: drain timeout (%.3g s): %lld unfinished requests cut off\n", st->o->drain_timeout,
          (long long)n);
}

static void on_refused(void *ctx, int status) { serve_count_status(ctx, status); }

static tpr_status rank0_init(serve_state *st) {
  uv_loop_init(&st->loop);
  tpr_http_opts ho = {.host = st->o->host, .port = st->o->port, .max_body = st->o->max_body,
                      .request_timeout = st->o->request_timeout, .handler = serve_handle, .ctx = st,
                      .on_close = serve_conn_closed, .on_refused = on_refused};
  tpr_status rc = tpr_http_listen(&st->loop, &ho, &st->http);
  if (rc != TPR_OK) {
    uv_run(&st->loop, UV_RUN_DEFAULT);
    uv_loop_close(&st->loop);
    return rc;
  }
  uv_timer_init(&st->loop, &st->tick);
  uv_timer_start(&st->tick, on_tick, SERVE_TICK_MS, SERVE_TICK_MS);
  uv_signal_init(&st->loop, &st->sigterm);
  uv_signal_init(&st->loop, &st->sigint);
  st->sigterm.data = st->sigint.data = st;
  uv_signal_start(&st->sigterm, on_signal, SIGTERM);
  uv_signal_start(&st->sigint, on_signal, SIGINT);
  printf("tpr serve: model '%s' on http://%s:%d (context %lld tokens, chat template %s)\n", st->o->model_id,
         st->o->host, tpr_http_port(st->http), (long long)st->o->max_seq, tpr_chat_template_name(st->o->chat_template));
  fflush(stdout);
  if (st->o->port_file) {
    FILE *f = fopen(st->o->port_file, "w");
    if (f) {
      fprintf(f, "%d\n", tpr_http_port(st->http));
      fclose(f);
    }
  }
  return TPR_OK;
}

static void rank0_close(serve_state *st) {
  uv_close((uv_handle_t *)&st->tick, NULL);
  uv_close((uv_handle_t *)&st->sigterm, NULL);
  uv_close((uv_handle_t *)&st->sigint, NULL);
  // Final answers are written (their connections close after the write);
  // give them a moment, then close whatever is left.
  double t0 = serve_now();
  while (tpr_http_open_conns(st->http) > 0 && serve_now() - t0 < 2) {
    uv_run(&st->loop, UV_RUN_NOWAIT);
    sleep_ms(1);
  }
  tpr_http_close_all(st->http);
  uv_run(&st->loop, UV_RUN_DEFAULT);
  uv_loop_close(&st->loop);
  tpr_http_free(st->http);
  while (st->reqs) {
    serve_req *r = st->reqs;
    st->reqs = r->next;
    tpr_oai_request_free(&r->r);
    free(r);
  }
}

tpr_status tpr_serve_run(tpr_comm_t world, int rank, tpr_engine *e, const tpr_tokenizer *tok,
                         const tpr_serve_opts *o) {
  serve_state *st = calloc(1, sizeof *st);
  if (!st) return TPR_FAIL(TPR_ERR_OOM, "serve: state");
  st->e = e;
  st->tok = tok;
  st->o = o;
  tpr_status rc = rank == 0 ? rank0_init(st) : TPR_OK;
  if (rank != 0) {
    // Rank 0 decides when to stop; a signal mpirun forwards here must not
    // take a rank out of the collective steps.
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
  }
  rc = tpr_comm_agree(world, rc);  // a port that cannot be bound stops every rank
  if (rc != TPR_OK) {
    free(st);
    return rc;
  }
  for (;;) {
    int32_t flag = FLAG_IDLE;
    if (rank == 0) {
      uv_run(&st->loop, engine_busy(st) ? UV_RUN_NOWAIT : UV_RUN_ONCE);
      if (st->stopping && st->o->drain_timeout > 0 && engine_busy(st) &&
          serve_now() - st->t_stop > st->o->drain_timeout)
        cut_off(st);
      bool busy = engine_busy(st);
      flag = busy ? FLAG_STEP : st->stopping ? FLAG_STOP : FLAG_IDLE;
    }
    rc = tpr_comm_broadcast(world, &flag, &flag, 1, TPR_I32, 0);
    if (rc != TPR_OK || flag == FLAG_STOP) break;
    if (flag == FLAG_IDLE) {
      if (rank != 0) sleep_ms(SERVE_IDLE_SLEEP_MS);
      continue;
    }
    tpr_engine_step_info info;
    rc = tpr_engine_step(e, &info);
    if (rc != TPR_OK) break;
    if (rank == 0) progress_all(st);
  }
  if (rank == 0) rank0_close(st);
  free(st);
  return rc;
}
