// tpr_serve_run: the threads and the life of the server. On rank 0 the main
// thread binds the port, then hands the libuv loop to an HTTP thread and
// becomes the engine thread (engine_loop.c); every other rank follows rank
// 0's steps. SIGTERM / SIGINT reach rank 0's HTTP thread: it stops
// accepting, the engine finishes what is in flight (or cuts it off after
// --drain-timeout), broadcasts STOP, and every rank returns.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve/serve_impl.h"

#define FLUSH_WAIT_S 2.0  // at the end, how long final answers get to reach their clients

// Stops accepting and lets the engine drain for drain_s seconds (<= 0: no
// limit). why: what asked.
static void begin_stop(serve_state *st, const char *why, double drain_s) {
  if (st->stopping) return;
  pthread_mutex_lock(&st->b.mu);
  bool busy = st->b.gauges.running + st->b.gauges.waiting > 0 || st->b.submit_head;
  pthread_mutex_unlock(&st->b.mu);
  if (busy && drain_s > 0)
    fprintf(stderr, "tpr serve: %s: finishing the in-flight requests (at most %.3g s), then exiting\n", why, drain_s);
  else
    fprintf(stderr, "tpr serve: %s: %s, then exiting\n", why,
            busy ? "finishing the in-flight requests" : "no request in flight");
  st->stopping = true;
  tpr_http_stop_accepting(st->http);
  serve_bridge_stop(st, drain_s);
}

static void on_signal(uv_signal_t *h, int signum) {
  char why[32];
  snprintf(why, sizeof why, "signal %d", signum);
  begin_stop(h->data, why, ((serve_state *)h->data)->o->drain_timeout);
}

// Open MPI's mpirun, told to stop (SIGTERM, SIGINT), sends every rank
// SIGCONT at once, SIGTERM odls_base_sigkill_timeout seconds later and
// SIGKILL as long again after that (orte/mca/odls kill_local_procs). The
// SIGCONT from mpirun -- our parent -- is the earliest word that the job
// is ending: rank 0 starts draining then, within the 2 x timeout before
// the SIGKILL. (mpirun also forwards a SIGCONT a user sends it; that too
// stops the server.)
static serve_state *sigcont_state;
static volatile sig_atomic_t sigcont_from_mpirun;

static void on_sigcont(int sig, siginfo_t *info, void *ctx) {
  (void)sig, (void)ctx;
  if (!sigcont_state || info->si_pid != getppid()) return;
  sigcont_from_mpirun = 1;
  uv_async_send(&sigcont_state->b.wake_http);  // async-signal-safe
}

static double mpirun_kill_timeout(void) {
  const char *v = getenv("OMPI_MCA_odls_base_sigkill_timeout");
  return v ? atof(v) : 1;  // Open MPI's default
}

static void watch_mpirun_stop(serve_state *st) {
  if (!getenv("OMPI_COMM_WORLD_SIZE")) return;
  sigcont_state = st;
  struct sigaction sa = {.sa_sigaction = on_sigcont, .sa_flags = SA_SIGINFO | SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCONT, &sa, NULL);
  double grace = 2 * mpirun_kill_timeout();
  if (st->o->drain_timeout <= 0 || grace - 1 < st->o->drain_timeout)
    fprintf(stderr,
            "tpr serve: note: stopped through mpirun, the drain can take %.3g s (2 x odls_base_sigkill_timeout, less "
            "1 s to exit), not --drain-timeout %g s; start mpirun with --mca odls_base_sigkill_timeout %d for it "
            "(docs/serve.md)\n",
            grace - 1 > 0.25 ? grace - 1 : 0.25, st->o->drain_timeout,
            (int)((st->o->drain_timeout > 0 ? st->o->drain_timeout : 60) / 2 + 2));
}

static void stop_for_mpirun(serve_state *st) {
  double grace = 2 * mpirun_kill_timeout() - 1, d = st->o->drain_timeout;
  if (grace < 0.25) grace = 0.25;
  begin_stop(st, "mpirun is ending the job (its SIGCONT)", d > 0 && d < grace ? d : grace);
}

static void on_refused(void *ctx, int status) { serve_count_status(ctx, status); }

static void close_handle(uv_handle_t *h) {
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

// The engine has stopped: answers still owed are written (an error if the
// engine failed or the request came too late), then, once the writes are
// out or FLUSH_WAIT_S has passed, every handle closes and the loop ends.
static void on_flush_tick(uv_timer_t *t) {
  serve_state *st = t->data;
  if (tpr_http_open_conns(st->http) > 0 && serve_now() - st->t_flush < FLUSH_WAIT_S) return;
  uv_timer_stop(t);
  signal(SIGCONT, SIG_DFL);  // before the async handle its handler uses closes
  sigcont_state = NULL;
  tpr_http_close_all(st->http);
  close_handle((uv_handle_t *)t);
  close_handle((uv_handle_t *)&st->sigterm);
  close_handle((uv_handle_t *)&st->sigint);
  close_handle((uv_handle_t *)&st->b.wake_http);
}

static void close_up(serve_state *st) {
  if (st->closing) return;
  st->closing = true;
  st->stopping = true;
  tpr_http_stop_accepting(st->http);
  // Requests the engine never took (they came after its last step).
  for (serve_req *r = st->reqs; r; r = r->next) {
    if (r->responded || !r->conn) continue;
    int status = st->b.engine_failed ? 500 : 503;
    const char *msg = st->b.engine_failed ? "the engine failed; the server is stopping" : "the server is shutting down";
    if (r->r.stream) {
      char *j = tpr_oai_error_json(status, msg, NULL);
      if (j) {
        char line[1024];
        int n = snprintf(line, sizeof line, "data: %s\n\n", j);
        if (n > 0 && (size_t)n < sizeof line) tpr_http_stream_send(r->conn, line, (size_t)n);
      }
      free(j);
      tpr_http_stream_end(r->conn);
    } else {
      serve_respond_error(st, r->conn, status, msg, NULL);
    }
    r->responded = true;
  }
  st->t_flush = serve_now();
  uv_timer_init(&st->loop, &st->flush);
  st->flush.data = st;
  uv_timer_start(&st->flush, on_flush_tick, 0, 10);
}

static void on_wake(uv_async_t *a) {
  serve_state *st = a->data;
  if (sigcont_from_mpirun) stop_for_mpirun(st);
  // engine_exited first: the engine sets it after its last publish, so
  // once it is seen, every update is already queued and taken below.
  // (Read after taking, an update published meanwhile would be left for a
  // close_up that ends its stream unanswered.)
  pthread_mutex_lock(&st->b.mu);
  bool exited = st->b.engine_exited;
  pthread_mutex_unlock(&st->b.mu);
  serve_take_updates(st);
  if (exited) close_up(st);
}

static void *http_thread(void *arg) {
  serve_state *st = arg;
  uv_run(&st->loop, UV_RUN_DEFAULT);
  return NULL;
}

static tpr_status rank0_init(serve_state *st) {
  TPR_CHECK(serve_bridge_init(st));
  uv_loop_init(&st->loop);
  tpr_http_opts ho = {.host = st->o->host, .port = st->o->port, .max_body = st->o->max_body,
                      .max_connections = st->o->max_connections, .request_timeout = st->o->request_timeout,
                      .handler = serve_handle, .ctx = st, .on_close = serve_conn_closed, .on_refused = on_refused};
  tpr_status rc = tpr_http_listen(&st->loop, &ho, &st->http);
  if (rc != TPR_OK) {
    uv_run(&st->loop, UV_RUN_DEFAULT);
    uv_loop_close(&st->loop);
    serve_bridge_destroy(st);
    return rc;
  }
  uv_async_init(&st->loop, &st->b.wake_http, on_wake);
  st->b.wake_http.data = st;
  uv_signal_init(&st->loop, &st->sigterm);
  uv_signal_init(&st->loop, &st->sigint);
  st->sigterm.data = st->sigint.data = st;
  uv_signal_start(&st->sigterm, on_signal, SIGTERM);
  uv_signal_start(&st->sigint, on_signal, SIGINT);
  char tmpl[320];
  tpr_chat_renderer_describe(&st->o->chat_template, tmpl, sizeof tmpl);
  printf("tpr serve: model '%s' on http://%s:%d (context %lld tokens, chat template %s, tool calls %s, reasoning "
         "%s)\n", st->o->model_id, st->o->host, tpr_http_port(st->http), (long long)st->o->max_seq, tmpl,
         tpr_tool_format_name(st->o->chat_template.tool_format), st->o->chat_template.reasoning ? "think" : "none");
  fflush(stdout);
  watch_mpirun_stop(st);
  // The pid file first: once the port file exists (what scripts wait for), so does it.
  if (st->o->pid_file) {
    FILE *f = fopen(st->o->pid_file, "w");
    if (f) {
      fprintf(f, "%d\n", (int)getpid());
      fclose(f);
    }
  }
  if (st->o->port_file) {
    FILE *f = fopen(st->o->port_file, "w");
    if (f) {
      fprintf(f, "%d\n", tpr_http_port(st->http));
      fclose(f);
    }
  }
  return TPR_OK;
}

// After the HTTP thread has ended.
static void rank0_free(serve_state *st) {
  uv_loop_close(&st->loop);
  tpr_http_free(st->http);
  while (st->reqs) {
    serve_req *r = st->reqs;
    st->reqs = r->next;
    serve_req_free(r);
  }
  serve_bridge_destroy(st);
  tpr_vocab_bytes_free(st->vocab_bytes);
}

tpr_status tpr_serve_run(tpr_comm_t world, int rank, tpr_engine *e, const tpr_tokenizer *tok,
                         const tpr_serve_opts *o) {
  // A client that hangs up makes a write fail with EPIPE; without this the
  // signal would end the process.
  signal(SIGPIPE, SIG_IGN);
  serve_state *st = calloc(1, sizeof *st);
  if (!st) return TPR_FAIL(TPR_ERR_OOM, "serve: state");
  st->e = e;
  st->tok = tok;
  st->o = o;
  tpr_status rc = rank == 0 ? rank0_init(st) : TPR_OK;
  // Each id's bytes, for structured output's token masks (rank 0 plans the steps).
  if (rc == TPR_OK && rank == 0) rc = tpr_vocab_bytes_new(tok, tpr_engine_vocab(e), &st->vocab_bytes);
  if (rank != 0) {
    // Rank 0 decides when to stop; a signal mpirun forwards here must not
    // take a rank out of the collective steps.
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
  }
  bool inited = rank == 0 && rc == TPR_OK;
  rc = tpr_comm_agree(world, rc);  // a port that cannot be bound stops every rank
  if (rc == TPR_OK && rank == 0 && pthread_create(&st->http_thread, NULL, http_thread, st) != 0)
    rc = TPR_FAIL(TPR_ERR_INTERNAL, "serve: cannot start the HTTP thread");
  if (rc != TPR_OK) {
    if (inited) {  // close the listener before leaving
      tpr_http_close_all(st->http);
      uv_close((uv_handle_t *)&st->b.wake_http, NULL);
      uv_close((uv_handle_t *)&st->sigterm, NULL);
      uv_close((uv_handle_t *)&st->sigint, NULL);
      uv_run(&st->loop, UV_RUN_DEFAULT);
      rank0_free(st);
    }
    free(st);
    return rc;
  }
  if (rank == 0) {
    rc = serve_engine_loop(st, world);
    pthread_join(st->http_thread, NULL);
    rank0_free(st);
  } else {
    rc = serve_follow_loop(e, world);
  }
  free(st);
  return rc;
}
