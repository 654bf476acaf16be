// The HTTP thread's half of a request's life after it is queued: the tokens
// the engine published become text (incrementally detokenized, a token at
// a time, so a stop string ends the answer at the token that completed it),
// streamed chunks or a full answer with n choices, logprobs in the
// endpoint's shape, and the metrics. Then the request is freed once the
// engine has released it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_impl.h"

// --- incremental detokenization -----------------------------------------------

void serve_detok_free(serve_detok *d) { free(d->text); }

static bool ends_incomplete(const char *s, size_t n) { return n >= 3 && memcmp(s + n - 3, "\xEF\xBF\xBD", 3) == 0; }

static int detok_append(serve_detok *d, const char *s, size_t n) {
  if (d->text_len + n + 1 > d->cap) {
    size_t cap = d->cap ? d->cap : 256;
    while (cap < d->text_len + n + 1) cap *= 2;
    char *t = realloc(d->text, cap);
    if (!t) return -1;
    d->text = t, d->cap = cap;
  }
  memcpy(d->text + d->text_len, s, n);
  d->text_len += n;
  d->text[d->text_len] = 0;
  return 0;
}

// Takes the tokens up to gen[n - 1] into the text once they add complete
// characters (final: whatever they add, an incomplete character included).
// keep_special: special tokens are text too, except the end-of-sequence
// token that stopped the answer (vLLM leaves it out of the text).
static void detok_step(const tpr_tokenizer *tok, serve_detok *d, const int32_t *gen, int64_t n, bool final,
                       bool keep_special, int32_t eos) {
  char *prefix = NULL, *full = NULL;
  size_t pl = 0, fl = 0;
  bool skip = !keep_special;
  if (keep_special && n > d->read && eos >= 0 && gen[n - 1] == eos) n--;
  if (n <= d->read) return;
  if (tpr_tokenizer_decode_known(tok, gen + d->prefix, (size_t)(d->read - d->prefix), skip, &prefix, &pl) ==
          TPR_OK &&
      tpr_tokenizer_decode_known(tok, gen + d->prefix, (size_t)(n - d->prefix), skip, &full, &fl) == TPR_OK &&
      fl > pl && (final || !ends_incomplete(full, fl)) && detok_append(d, full + pl, fl - pl) == 0) {
    d->prefix = d->read;
    d->read = n;
  }
  free(prefix);
  free(full);
}

// --- a choice's progress -------------------------------------------------------

static size_t longest_stop(const tpr_oai_request *q) {
  size_t m = 0;
  for (int i = 0; i < q->n_stop; i++) {
    size_t l = strlen(q->stop[i]);
    if (l > m) m = l;
  }
  return m;
}

// The first stop string in text[from, n) (bytes, NUL bytes included), as
// its offset; -1: none.
static int64_t find_stop(const tpr_oai_request *q, const char *text, size_t from, size_t n) {
  int64_t best = -1;
  for (int s = 0; s < q->n_stop; s++) {
    size_t m = strlen(q->stop[s]);
    for (size_t i = from; i + m <= n; i++)
      if (text[i] == q->stop[s][0] && memcmp(text + i, q->stop[s], m) == 0) {
        if (best < 0 || (int64_t)i < best) best = (int64_t)i;
        break;
      }
  }
  return best;
}

// Decodes up to token n (final: flushing), records where token n - 1's
// text ends, and looks for a stop string in what it added. True: a stop
// string ended the choice there.
static bool take_text(serve_state *st, serve_req *r, int64_t index, int64_t n, bool final) {
  serve_choice *c = &r->ch[index];
  size_t before = c->dt.text_len, L = longest_stop(&r->r);
  detok_step(st->tok, &c->dt, c->gen, n, final, r->r.keep_special, r->r.ignore_eos ? -1 : st->o->eos);
  c->text_after[n - 1] = c->dt.text_len;
  if (!L || c->dt.text_len == before) return false;
  int64_t at = find_stop(&r->r, c->dt.text, before > L - 1 ? before - (L - 1) : 0, c->dt.text_len);
  if (at < 0) return false;
  c->end = (size_t)at;
  c->n_counted = n;
  c->finish = "stop";
  if (!c->engine_done) serve_bridge_cancel(st, r, (int)index);  // no more tokens for it
  return true;
}

// Token by token: text, the stop strings, and the finish once the engine
// has ended the sequence.
static void advance_choice(serve_state *st, serve_req *r, int64_t index) {
  serve_choice *c = &r->ch[index];
  if (c->finish) return;
  for (; c->n_done < c->n_gen; c->n_done++)
    if (take_text(st, r, index, c->n_done + 1, false)) {
      c->n_done = c->n_gen;  // tokens after the stop string are not part of the answer
      return;
    }
  if (!c->engine_done) return;
  if (c->n_gen > c->dt.read && take_text(st, r, index, c->n_gen, true)) return;  // a held-back character
  c->end = c->dt.text_len;
  c->n_counted = c->n_gen;
  int32_t eos = st->o->eos;
  bool eos_end = c->n_gen > 0 && !r->r.ignore_eos && eos >= 0 && c->gen[c->n_gen - 1] == eos;
  c->finish = eos_end ? "stop" : "length";
}

// --- logprobs as the response shows them -----------------------------------------

typedef struct lp_view {
  tpr_oai_logprob *lp;
  char **owned;  // every string decoded for the view
  int64_t n, n_owned;
} lp_view;

static const char *token_text(const serve_state *st, lp_view *v, int32_t id, size_t *len) {
  char *t = NULL;
  if (tpr_tokenizer_decode_known(st->tok, &id, 1, false, &t, len) != TPR_OK || !t) {
    *len = 0;
    return "";
  }
  v->owned[v->n_owned++] = t;
  return t;
}

// The logprobs of tokens [from, to) of choice c.
static bool lp_view_make(const serve_state *st, const serve_req *r, const serve_choice *c, int64_t from, int64_t to,
                         lp_view *v) {
  memset(v, 0, sizeof *v);
  int64_t n = to > from ? to - from : 0;
  v->lp = calloc((size_t)(n ? n : 1), sizeof *v->lp);
  v->owned = calloc((size_t)(n ? n : 1) * (TPR_SERVE_MAX_TOP_LOGPROBS + 2), sizeof *v->owned);
  if (!v->lp || !v->owned) return false;
  // text_offset counts characters, as OpenAI's (and Python's str) do; the
  // text is valid UTF-8, so characters are the bytes that do not continue one.
  size_t at = 0;
  int64_t chars = 0;
  for (int64_t k = from; k < to; k++) {
    const tpr_token_logprob *g = &c->gen_lp[k];
    tpr_oai_logprob *o = &v->lp[v->n++];
    o->token = token_text(st, v, c->gen[k], &o->token_len);
    o->logprob = g->logprob;
    for (size_t end = k ? c->text_after[k - 1] : 0; at < end; at++) chars += ((unsigned char)c->dt.text[at] & 0xC0) != 0x80;
    o->text_offset = chars;
    int top = g->n_top < r->r.top_logprobs ? g->n_top : r->r.top_logprobs;
    bool sampled_in = false;
    for (int t = 0; t < top; t++) {
      o->top_token[o->n_top] = token_text(st, v, g->top_ids[t], &o->top_len[o->n_top]);
      o->top_logprob[o->n_top++] = g->top_logprobs[t];
      sampled_in |= g->top_ids[t] == c->gen[k];
    }
    // completions: the sampled token is always among top_logprobs (OpenAI:
    // "up to logprobs + 1 elements").
    if (!r->r.chat && !sampled_in) {
      o->top_token[o->n_top] = o->token, o->top_len[o->n_top] = o->token_len;
      o->top_logprob[o->n_top++] = g->logprob;
    }
  }
  return true;
}

static void lp_view_free(lp_view *v) {
  for (int64_t i = 0; i < v->n_owned; i++) free(v->owned[i]);
  free(v->owned);
  free(v->lp);
}

// --- tool calls and reasoning (parsed_answer.c) -------------------------------------

// The choice's parsed text, made on first use; NULL when the request parses
// nothing (or out of memory: the caller answers 500).
static tpr_parsed_choice *choice_parsed(const serve_req *r, serve_choice *c) {
  if (!c->parsed && (c->parsed = malloc(sizeof *c->parsed))) tpr_parsed_init(c->parsed, &r->r);
  return c->parsed;
}

static bool parses(const serve_req *r) {
  return r->r.chat && (r->r.tool_format != TPR_TOOL_FMT_NONE || r->r.reasoning);
}

// --- writing ----------------------------------------------------------------------

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

// A chunk of a parsed choice: the text up to `upto` goes through its
// parser, and the chunk carries what that added: content, reasoning_content
// and each call completed since (whole, its arguments in one piece).
static void stream_parsed(serve_state *st, serve_req *r, int64_t index, size_t upto, const char *finish,
                          int64_t lp_to) {
  serve_choice *c = &r->ch[index];
  tpr_parsed_choice *pc = choice_parsed(r, c);
  c->sent = upto > c->sent ? upto : c->sent;
  if (!pc || !tpr_parsed_feed(pc, c->dt.text, upto, finish != NULL)) return;  // out of memory: nothing sent
  tpr_oai_choice oc = {.index = index, .role = !c->role_sent, .has_logprobs = r->r.logprobs};
  bool any = tpr_parsed_delta(pc, finish, &oc);
  if (!any && !finish && lp_to == c->lp_sent && c->role_sent) return;
  lp_view v = {0};
  if (r->r.logprobs && !lp_view_make(st, r, c, c->lp_sent, lp_to, &v)) {
    lp_view_free(&v);
    return;
  }
  oc.lp = v.lp, oc.n_lp = v.n;
  char *j = tpr_oai_chunk_json(r->r.chat, r->id, r->created, st->o->model_id, &oc);
  if (j) send_sse(r->conn, j);
  free(j);
  lp_view_free(&v);
  c->role_sent = true;
  c->lp_sent = lp_to;
}

// One chunk of choice `index`: text [c->sent, upto) (after the echoed
// prompt on its first chunk), the logprobs of the tokens whose text ends by
// then, and the finish when given.
static void stream_piece(serve_state *st, serve_req *r, int64_t index, size_t upto, const char *finish) {
  serve_choice *c = &r->ch[index];
  int64_t lp_to = c->lp_sent;
  if (r->r.logprobs) {
    int64_t limit = c->finish ? c->n_counted : c->n_done;
    while (lp_to < limit && (finish || c->text_after[lp_to] <= upto)) lp_to++;
  }
  size_t tl = upto > c->sent ? upto - c->sent : 0;
  if (parses(r)) {
    stream_parsed(st, r, index, upto, finish, lp_to);
    return;
  }
  if (!tl && !finish && lp_to == c->lp_sent && c->role_sent) return;
  char *text = NULL;
  size_t len = 0;
  bool echo = r->r.echo && !c->role_sent;
  if (echo || tl) {
    text = malloc((echo ? r->echo_len : 0) + tl + 1);
    if (!text) return;
    if (echo) memcpy(text, r->echo_text, r->echo_len), len = r->echo_len;
    memcpy(text + len, c->dt.text + c->sent, tl);
    len += tl;
  }
  lp_view v = {0};
  if (r->r.logprobs && !lp_view_make(st, r, c, c->lp_sent, lp_to, &v)) {
    free(text);
    lp_view_free(&v);
    return;
  }
  tpr_oai_choice oc = {.index = index, .text = text, .text_len = len, .finish = finish, .role = !c->role_sent,
                       .has_logprobs = r->r.logprobs, .lp = v.lp, .n_lp = v.n};
  char *j = tpr_oai_chunk_json(r->r.chat, r->id, r->created, st->o->model_id, &oc);
  if (j) send_sse(r->conn, j);
  free(j);
  free(text);
  lp_view_free(&v);
  c->role_sent = true;
  c->sent = upto > c->sent ? upto : c->sent;
  c->lp_sent = lp_to;
}

static void stream_choice(serve_state *st, serve_req *r, int64_t index) {
  serve_choice *c = &r->ch[index];
  if (c->final_sent) return;
  size_t stable = c->finish ? c->end : c->dt.text_len;
  if (!c->finish) {  // a tail that may begin a stop string waits for the next token
    size_t hold = longest_stop(&r->r);
    stable = stable > (hold ? hold - 1 : 0) ? stable - (hold ? hold - 1 : 0) : 0;
    while (stable > c->sent && ((unsigned char)c->dt.text[stable] & 0xC0) == 0x80) stable--;
  }
  if (stable > c->sent || (r->r.logprobs && !c->finish)) stream_piece(st, r, index, stable, NULL);
  if (c->finish) {
    stream_piece(st, r, index, c->end, c->finish);
    c->final_sent = true;
  }
}

static int64_t completion_tokens(const serve_req *r) {
  int64_t n = 0;
  for (int64_t i = 0; i < r->r.n; i++) n += r->ch[i].n_counted;
  return n;
}

static bool all_finished(const serve_req *r) {
  for (int64_t i = 0; i < r->r.n; i++)
    if (!r->ch[i].finish) return false;
  return true;
}

static void stream_end(serve_state *st, serve_req *r) {
  if (r->r.include_usage) {
    char *j = tpr_oai_usage_chunk_json(r->r.chat, r->id, r->created, st->o->model_id, r->prompt_len,
                                       completion_tokens(r));
    if (j) send_sse(r->conn, j);
    free(j);
  }
  send_sse(r->conn, "[DONE]");
  tpr_http_stream_end(r->conn);
}

static void respond_full(serve_state *st, serve_req *r) {
  tpr_oai_choice *oc = calloc((size_t)r->r.n, sizeof *oc);
  lp_view *v = calloc((size_t)r->r.n, sizeof *v);
  char **texts = calloc((size_t)r->r.n, sizeof *texts);
  bool ok = oc && v && texts;
  for (int64_t i = 0; ok && i < r->r.n; i++) {
    serve_choice *c = &r->ch[i];
    size_t el = r->r.echo ? r->echo_len : 0;
    texts[i] = malloc(el + c->end + 1);
    ok = texts[i] != NULL;
    if (!ok) break;
    if (el) memcpy(texts[i], r->echo_text, el);
    if (c->end) memcpy(texts[i] + el, c->dt.text, c->end);
    if (r->r.logprobs) ok = lp_view_make(st, r, c, 0, c->n_counted, &v[i]);
    oc[i] = (tpr_oai_choice){.index = i, .text = texts[i], .text_len = el + c->end, .finish = c->finish,
                             .has_logprobs = r->r.logprobs, .lp = v[i].lp, .n_lp = v[i].n};
    if (parses(r)) {  // the whole text through the parser: content, reasoning_content, tool_calls
      tpr_parsed_choice *pc = choice_parsed(r, c);
      ok = pc && tpr_parsed_feed(pc, c->dt.text, c->end, true);
      if (ok) tpr_parsed_full(pc, c->finish, &oc[i]);
    }
  }
  char *j = ok ? tpr_oai_response_json(r->r.chat, r->id, r->created, st->o->model_id, oc, r->r.n, r->prompt_len,
                                       completion_tokens(r))
               : NULL;
  if (j) {
    serve_count_status(st, 200);
    tpr_http_respond(r->conn, 200, "application/json", j, strlen(j));
  } else {
    serve_respond_error(st, r->conn, 500, "out of memory while writing the answer", NULL);
  }
  free(j);
  for (int64_t i = 0; v && texts && i < r->r.n; i++) lp_view_free(&v[i]), free(texts[i]);
  free(oc), free(v), free(texts);
}

// The engine refused the request, failed, or the drain timeout cut it off.
static void respond_failure(serve_state *st, serve_req *r, int status, const char *msg) {
  if (r->r.stream) {
    char *j = tpr_oai_error_json(status, msg, NULL);
    if (j) send_sse(r->conn, j);
    free(j);
    tpr_http_stream_end(r->conn);
  } else {
    serve_respond_error(st, r->conn, status, msg, NULL);
  }
}

static void observe_tokens(serve_state *st, serve_req *r, int64_t new_tokens) {
  if (new_tokens <= 0) return;
  double now = serve_now();
  int64_t k = 0;
  if (!r->first_token_seen) {
    serve_observe(&st->m.ttft, now - r->t_submit);
    r->first_token_seen = true;
    k = 1;
  }
  double per = (now - r->t_last_token) / (double)new_tokens;  // tokens that came together share the time
  for (; k < new_tokens; k++) serve_observe(&st->m.itl, per);
  r->t_last_token = now;
}

// released: the engine is done with r; cut: by the drain timeout.
static void progress(serve_state *st, serve_req *r, bool released, bool cut, int64_t new_tokens) {
  if (r->responded) return;
  if (!r->conn) {  // the client went away; the engine was told
    r->responded = true;
    return;
  }
  observe_tokens(st, r, new_tokens);
  if (released && (r->err_status || cut)) {  // an error, not a short answer
    for (int64_t i = 0; cut && r->r.stream && i < r->r.n; i++) {  // what was generated still goes out
      advance_choice(st, r, i);
      if (r->ch[i].finish) r->ch[i].finish = NULL, r->ch[i].end = r->ch[i].dt.text_len;
      stream_choice(st, r, i);
    }
    respond_failure(st, r, cut ? 503 : r->err_status,
                    cut ? "the server shut down before the answer was complete (--drain-timeout)" : r->err);
    r->responded = true;
    return;
  }
  for (int64_t i = 0; i < r->r.n; i++) {
    advance_choice(st, r, i);
    if (r->r.stream) stream_choice(st, r, i);
  }
  if (all_finished(r)) {
    st->m.generated_tokens += completion_tokens(r);
    if (r->r.stream) stream_end(st, r);
    else respond_full(st, r);
    r->responded = true;
  } else if (released) {  // cannot happen: a released request's choices have all ended
    respond_failure(st, r, 500, "the engine released an unfinished request");
    r->responded = true;
  }
}

// --- taking what the engine published ---------------------------------------------

static bool take_choice(serve_choice *c, bool logprobs, int64_t *new_tokens) {
  int64_t n = c->n_out - c->n_gen;
  if (n > 0) {
    if (c->n_out > c->cap_gen) {
      int64_t cap = c->cap_out;
      int32_t *g = realloc(c->gen, (size_t)cap * sizeof *g);
      if (g) c->gen = g;
      size_t *ta = realloc(c->text_after, (size_t)cap * sizeof *ta);
      if (ta) c->text_after = ta;
      tpr_token_logprob *l = logprobs ? realloc(c->gen_lp, (size_t)cap * sizeof *l) : NULL;
      if (l) c->gen_lp = l;
      if (!g || !ta || (logprobs && !l)) return false;
      c->cap_gen = cap;
    }
    memcpy(c->gen + c->n_gen, c->out + c->n_gen, (size_t)n * sizeof *c->gen);
    if (logprobs) memcpy(c->gen_lp + c->n_gen, c->out_lp + c->n_gen, (size_t)n * sizeof *c->gen_lp);
    c->n_gen = c->n_out;
    *new_tokens += n;
  }
  c->engine_done = c->finished;
  return true;
}

void serve_req_free(serve_req *r) {
  for (int64_t i = 0; r->ch && i < r->r.n; i++) {
    serve_choice *c = &r->ch[i];
    free(c->out), free(c->out_lp), free(c->gen), free(c->gen_lp), free(c->text_after);
    serve_detok_free(&c->dt);
    if (c->parsed) tpr_parsed_free(c->parsed);
    free(c->parsed);
  }
  free(r->ch);
  free(r->prompt);
  free(r->g);
  free(r->bias);
  for (int64_t i = 0; r->constraints && i < r->r.n; i++) tpr_token_constraint_free(&r->constraints[i]);
  free(r->constraints);
  free(r->echo_text);
  tpr_oai_request_free(&r->r);
  free(r);
}

typedef struct taken {
  serve_req *r;
  bool released, cut;
  int64_t new_tokens;
} taken;

void serve_take_updates(serve_state *st) {
  serve_bridge *b = &st->b;
  taken small[64], *t = small;
  int64_t n = 0, cap = 64;
  pthread_mutex_lock(&b->mu);
  for (serve_req *r = b->update_head; r; r = r->q_next) n++;
  if (n > cap) {
    t = malloc((size_t)n * sizeof *t);
    if (!t) t = small, n = cap;  // the rest stay queued for the next wake-up
  }
  int64_t k = n;
  while (k > 0 && b->update_head) {  // the queue is newest first: fill from the back for arrival order
    serve_req *r = b->update_head;
    b->update_head = r->q_next;
    r->queued = false;
    taken *x = &t[--k];
    *x = (taken){.r = r, .released = r->released, .cut = r->cut_off};
    for (int64_t i = 0; i < r->r.n; i++)
      if (!take_choice(&r->ch[i], r->r.logprobs, &x->new_tokens)) r->err_status = 500;
  }
  pthread_mutex_unlock(&b->mu);
  for (int64_t i = k; i < n; i++) {
    progress(st, t[i].r, t[i].released, t[i].cut, t[i].new_tokens);
    t[i].r->released_seen |= t[i].released;
  }
  if (t != small) free(t);
  // Requests the engine is done with and nobody waits for are freed.
  for (serve_req **p = &st->reqs; *p;) {
    serve_req *r = *p;
    if (r->released_seen && r->responded) {
      *p = r->next;
      serve_req_free(r);
    } else {
      p = &r->next;
    }
  }
}
