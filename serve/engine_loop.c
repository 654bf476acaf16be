// The engine side of tpr serve. Before every step rank 0 broadcasts one
// flag, STEP or STOP, and every rank then runs the same collective step;
// nothing at all is sent while the server is idle, so a burst of /health
// calls or idle connections costs the other ranks nothing and they cannot
// fall behind. The other ranks wait for the flag in a nonblocking broadcast
// that they test with short sleeps (growing to 1 ms while idle), so an idle
// rank uses no core and a busy one picks up the next step within tens of
// microseconds. Rank 0's engine thread sleeps on the bridge's condition
// variable until a request, a cancel or the stop signal comes.
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/serve_impl.h"

enum { FLAG_STEP = 1, FLAG_STOP = 2 };
#define POLL_SPIN_S 50e-6    // test without sleeping this long first: steps follow each other closely
#define POLL_MAX_SLEEP_S 1e-3

static void sleep_s(double s) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(s * 1e9)};
  nanosleep(&ts, NULL);
}

// Every rank: rank 0's flag for the next step.
static tpr_status exchange_flag(tpr_comm_t world, int32_t *flag) {
  tpr_comm_request q = NULL;
  TPR_CHECK(tpr_comm_ibroadcast(world, flag, 1, TPR_I32, 0, &q));
  double t0 = serve_now();
  bool done = false;
  tpr_status rc = TPR_OK;
  while (rc == TPR_OK && !done) {
    rc = tpr_comm_test(q, &done);
    double waited = serve_now() - t0;
    if (rc == TPR_OK && !done && waited > POLL_SPIN_S) sleep_s(waited / 8 < POLL_MAX_SLEEP_S ? waited / 8 : POLL_MAX_SLEEP_S);
  }
  tpr_status wrc = tpr_comm_wait(q);  // frees the request, also after a failed test
  return rc != TPR_OK ? rc : wrc;
}

tpr_status serve_follow_loop(tpr_engine *e, tpr_comm_t world) {
  for (;;) {
    int32_t flag = 0;
    TPR_CHECK(exchange_flag(world, &flag));
    if (flag == FLAG_STOP) return TPR_OK;
    if (flag != FLAG_STEP) return TPR_FAIL(TPR_ERR_INTERNAL, "serve: rank 0 sent flag %d", flag);
    tpr_engine_step_info info;
    TPR_CHECK(tpr_engine_step(e, &info));
  }
}

// --- rank 0 ---------------------------------------------------------------

typedef struct active_list {
  serve_req *head;
} active_list;

static tpr_status grow_out(serve_choice *c, int64_t need, bool logprobs) {
  if (need <= c->cap_out) return TPR_OK;
  int64_t cap = c->cap_out ? c->cap_out : 16;
  while (cap < need) cap *= 2;
  int32_t *o = realloc(c->out, (size_t)cap * sizeof *o);
  if (o) c->out = o;
  tpr_token_logprob *l = logprobs ? realloc(c->out_lp, (size_t)cap * sizeof *l) : NULL;
  if (l) c->out_lp = l;
  if (!o || (logprobs && !l)) return TPR_FAIL(TPR_ERR_OOM, "serve: the tokens of a choice");
  c->cap_out = cap;
  return TPR_OK;
}

// Lock held: the tokens the engine generated for r since the last publish.
// Returns whether anything changed.
static bool publish_req(serve_state *st, serve_req *r, bool *all_finished) {
  bool changed = false;
  *all_finished = true;
  for (int64_t i = 0; i < r->r.n; i++) {
    serve_choice *c = &r->ch[i];
    tpr_sched_seq_info si;
    if (tpr_engine_result(st->e, c->seq, &si) != TPR_OK) {  // cannot happen for an id the engine gave
      c->finished = changed = true;
      continue;
    }
    int64_t gen = si.len - si.prompt_len;
    if (gen > c->n_out && grow_out(c, gen, r->r.logprobs) == TPR_OK) {
      memcpy(c->out + c->n_out, si.tokens + si.prompt_len + c->n_out, (size_t)(gen - c->n_out) * sizeof *c->out);
      for (int64_t k = c->n_out; r->r.logprobs && k < gen; k++) {
        const tpr_token_logprob *lp = NULL;
        if (tpr_engine_logprobs(st->e, c->seq, k, &lp) == TPR_OK) c->out_lp[k] = *lp;
        else c->out_lp[k] = (tpr_token_logprob){.token = c->out[k]};
      }
      c->n_out = gen;
      changed = true;
    }
    if (si.finished && !c->finished) c->finished = changed = true;
    if (!c->finished) *all_finished = false;
  }
  return changed;
}

// The engine's news for every active request; finished requests leave the
// list and their sequences are forgotten by the engine.
static void publish(serve_state *st, active_list *a) {
  serve_bridge *b = &st->b;
  bool any = false;
  pthread_mutex_lock(&b->mu);
  for (serve_req **p = &a->head; *p;) {
    serve_req *r = *p;
    bool done;
    bool changed = publish_req(st, r, &done);
    if (done) {
      for (int64_t i = 0; i < r->r.n; i++) tpr_engine_release(st->e, r->ch[i].seq);
      r->released = changed = true;
      *p = r->e_next;
    } else {
      p = &r->e_next;
    }
    if (changed) serve_bridge_notify_locked(st, r), any = true;
  }
  int64_t waiting = tpr_engine_waiting(st->e), running = 0, blocks = 0;
  for (serve_req *r = a->head; r; r = r->e_next)
    for (int64_t i = 0; i < r->r.n; i++) running += !r->ch[i].finished;
  for (int rep = 0; rep < tpr_engine_replicas(st->e); rep++) blocks += tpr_engine_blocks_in_use(st->e, rep);
  b->gauges.running = running - waiting;
  b->gauges.waiting = waiting;
  b->gauges.blocks_in_use = blocks;
  b->gauges.preemptions = tpr_engine_preemptions(st->e);
  b->gauges.prefix = tpr_engine_prefix(st->e);
  b->gauges.spec = tpr_engine_spec(st->e);
  pthread_mutex_unlock(&b->mu);
  if (any) uv_async_send(&b->wake_http);
}

// New requests into the engine. The HTTP thread checked them
// (tpr_engine_check_request), so a refusal here is out of memory.
static void submit(serve_state *st, serve_req *incoming, active_list *a) {
  while (incoming) {
    serve_req *r = incoming;
    incoming = r->q_next;
    int64_t first = -1;
    if (tpr_engine_submit_n(st->e, r->prompt, r->prompt_len, r->g, r->r.n, &first) != TPR_OK) {
      pthread_mutex_lock(&st->b.mu);
      r->err_status = 500;
      snprintf(r->err, sizeof r->err, "%s", tpr_last_error());
      r->released = true;
      serve_bridge_notify_locked(st, r);
      pthread_mutex_unlock(&st->b.mu);
      uv_async_send(&st->b.wake_http);
      continue;
    }
    for (int64_t i = 0; i < r->r.n; i++) r->ch[i].seq = first + i;
    r->e_next = a->head;  // order within the list does not matter: the engine keeps its own
    a->head = r;
  }
}

// The cancel flags the HTTP thread set (a client gone, a stop string).
static void apply_cancels(serve_state *st, active_list *a) {
  pthread_mutex_lock(&st->b.mu);
  for (serve_req *r = a->head; r; r = r->e_next)
    for (int64_t i = 0; i < r->r.n; i++)
      if ((r->cancel || r->ch[i].cancel) && !r->ch[i].finished) tpr_engine_cancel(st->e, r->ch[i].seq);
  pthread_mutex_unlock(&st->b.mu);
}

// The drain ran past --drain-timeout: every unfinished sequence ends now
// (the HTTP thread answers them with an error).
static void cut_off(serve_state *st, active_list *a, double drain_s) {
  int64_t n = 0;
  pthread_mutex_lock(&st->b.mu);
  for (serve_req *r = a->head; r; r = r->e_next) {
    r->cut_off = true;
    n++;
    for (int64_t i = 0; i < r->r.n; i++) tpr_engine_cancel(st->e, r->ch[i].seq);
  }
  pthread_mutex_unlock(&st->b.mu);
  fprintf(stderr, "tpr serve: drain timeout (%.3g s): %lld unfinished requests cut off\n", drain_s, (long long)n);
}

// After the last step: whatever is still active is the HTTP thread's to
// answer (a failed step); the HTTP thread closes up.
static void exit_engine(serve_state *st, active_list *a, bool failed) {
  pthread_mutex_lock(&st->b.mu);
  for (serve_req *r = a->head; r; r = r->e_next) {
    r->released = true;
    if (failed && !r->err_status) {
      r->err_status = 500;
      snprintf(r->err, sizeof r->err, "the engine failed: %s", tpr_last_error());
    }
    serve_bridge_notify_locked(st, r);
  }
  a->head = NULL;
  st->b.engine_exited = true;
  st->b.engine_failed = failed;
  // Sent under the lock: the HTTP thread closes the async handle once it
  // has read engine_exited (under the lock), so never during this send.
  uv_async_send(&st->b.wake_http);
  pthread_mutex_unlock(&st->b.mu);
}

tpr_status serve_engine_loop(serve_state *st, tpr_comm_t world) {
  serve_bridge *b = &st->b;
  active_list a = {0};
  tpr_status rc = TPR_OK;
  bool cut = false;
  for (;;) {
    pthread_mutex_lock(&b->mu);
    while (!b->submit_head && !b->cancels && !a.head && !b->stopping) pthread_cond_wait(&b->work, &b->mu);
    serve_req *incoming = b->submit_head;
    b->submit_head = b->submit_tail = NULL;
    bool cancels = b->cancels > 0, stopping = b->stopping;
    b->cancels = 0;
    double t_stop = b->t_stop, drain_s = b->drain_s;
    pthread_mutex_unlock(&b->mu);
    submit(st, incoming, &a);
    if (cancels) apply_cancels(st, &a);
    if (stopping && !cut && a.head && drain_s > 0 && serve_now() - t_stop > drain_s) {
      cut_off(st, &a, drain_s);
      cut = true;
    }
    publish(st, &a);
    if (!a.head) {
      if (!stopping) continue;
      int32_t flag = FLAG_STOP;
      rc = exchange_flag(world, &flag);
      break;
    }
    int32_t flag = FLAG_STEP;
    rc = exchange_flag(world, &flag);
    tpr_engine_step_info info;
    if (rc == TPR_OK) rc = tpr_engine_step(st->e, &info);
    if (rc != TPR_OK) break;
    pthread_mutex_lock(&b->mu);
    b->gauges.steps++;
    b->gauges.step_seconds += info.seconds;
    b->gauges.mask_seconds += info.mask_seconds;
    pthread_mutex_unlock(&b->mu);
    publish(st, &a);
  }
  exit_engine(st, &a, rc != TPR_OK);
  return rc;
}
