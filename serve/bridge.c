// The meeting point of rank 0's HTTP thread and engine thread
// (serve_impl.h): a FIFO of new requests and cancel flags one way, a list
// of requests with new tokens the other way. Every function takes the lock
// for a few pointer moves only; nothing slow runs under it.
#include <stdlib.h>

#include "serve/serve_impl.h"

tpr_status serve_bridge_init(serve_state *st) {
  serve_bridge *b = &st->b;
  if (pthread_mutex_init(&b->mu, NULL) != 0) return TPR_FAIL(TPR_ERR_INTERNAL, "serve: mutex");
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);  // timed waits against serve_now()
  int rc = pthread_cond_init(&b->work, &ca);
  pthread_condattr_destroy(&ca);
  if (rc != 0) {
    pthread_mutex_destroy(&b->mu);
    return TPR_FAIL(TPR_ERR_INTERNAL, "serve: condition variable");
  }
  return TPR_OK;
}

void serve_bridge_destroy(serve_state *st) {
  pthread_cond_destroy(&st->b.work);
  pthread_mutex_destroy(&st->b.mu);
}

void serve_bridge_submit(serve_state *st, serve_req *r) {
  serve_bridge *b = &st->b;
  pthread_mutex_lock(&b->mu);
  r->q_next = NULL;
  if (b->submit_tail) b->submit_tail->q_next = r;
  else b->submit_head = r;
  b->submit_tail = r;
  pthread_cond_signal(&b->work);
  pthread_mutex_unlock(&b->mu);
}

void serve_bridge_cancel(serve_state *st, serve_req *r, int choice) {
  serve_bridge *b = &st->b;
  pthread_mutex_lock(&b->mu);
  if (choice < 0) r->cancel = true;
  else r->ch[choice].cancel = true;
  b->cancels++;
  pthread_cond_signal(&b->work);
  pthread_mutex_unlock(&b->mu);
}

void serve_bridge_stop(serve_state *st, double drain_s) {
  serve_bridge *b = &st->b;
  pthread_mutex_lock(&b->mu);
  if (!b->stopping) {
    b->stopping = true;
    b->t_stop = serve_now();
    b->drain_s = drain_s;
  }
  pthread_cond_signal(&b->work);
  pthread_mutex_unlock(&b->mu);
}

void serve_bridge_notify_locked(serve_state *st, serve_req *r) {
  if (r->queued) return;
  r->queued = true;
  r->q_next = st->b.update_head;
  st->b.update_head = r;
}
