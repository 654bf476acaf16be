// A generation request on the HTTP thread: parsed (openai_request.c),
// tokenized, its engine parameters made (one seed per choice), checked
// against the engine's limits with the engine's own checks, then queued for
// the engine thread (bridge.c). Refusals are 4xx with the parameter named.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "serve/serve_impl.h"

// A message from the engine's checks without tpr's source locations (the
// leading "file.c:123: " and the " (at file.c:45)" of each propagation):
// what a client reads should name the problem, not tpr's source.
static const char *user_message(const char *m, char *buf, size_t cap) {
  const char *colon = strstr(m, ".c:");
  if (colon && colon - m < 40) {
    const char *p = colon + 3;
    while (*p >= '0' && *p <= '9') p++;
    if (p[0] == ':' && p[1] == ' ') m = p + 2;
  }
  size_t n = 0;
  while (*m && n + 1 < cap) {
    const char *at = strncmp(m, " (at ", 5) == 0 ? strchr(m, ')') : NULL;
    if (at && memchr(m, '.', (size_t)(at - m))) {
      m = at + 1;
      continue;
    }
    buf[n++] = *m++;
  }
  buf[n] = 0;
  return buf;
}

// A fresh seed when the request names none: two unseeded requests differ.
static uint64_t fresh_seed(const serve_state *st) {
  uint64_t s = 0;
  if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s)
    s = (uint64_t)(serve_now() * 1e9) ^ (uint64_t)st->next_id;
  return s;
}

// Choice i's seed: the request's for choice 0 (so n = 1 samples as `tpr run
// --seed` does), a splitmix64 step away for the others.
static uint64_t choice_seed(uint64_t base, int64_t i) {
  if (i == 0) return base;
  uint64_t z = base + 0x9e3779b97f4a7c15ull * (uint64_t)i;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The engine's parameters for every choice (the logit bias shared).
static tpr_status gen_params(const serve_state *st, int64_t max_new, serve_req *r) {
  const tpr_oai_request *q = &r->r;
  r->g = calloc((size_t)q->n, sizeof *r->g);
  r->bias = q->n_bias ? calloc((size_t)q->n_bias, sizeof *r->bias) : NULL;
  if (!r->g || (q->n_bias && !r->bias)) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  if (q->grammar) {  // structured output: each choice its own grammar state
    if (!st->vocab_bytes) return TPR_FAIL(TPR_ERR_INTERNAL, "structured output without the vocabulary's bytes");
    r->constraints = calloc((size_t)q->n, sizeof *r->constraints);
    if (!r->constraints) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
    for (int64_t i = 0; i < q->n; i++)
      tpr_token_constraint_init(&r->constraints[i], q->grammar, st->vocab_bytes, q->ignore_eos ? -1 : st->o->eos);
  }
  for (int64_t i = 0; i < q->n_bias; i++) r->bias[i] = (tpr_logit_bias){.id = q->bias_ids[i], .bias = q->bias[i]};
  uint64_t base = q->has_seed ? q->seed : fresh_seed(st);
  for (int64_t i = 0; i < q->n; i++)
    r->g[i] = (tpr_gen_params){.max_new = max_new,
                               .stop_token = q->ignore_eos ? -1 : st->o->eos,
                               .sampling = {.temperature = q->temperature, .top_k = q->top_k, .top_p = q->top_p,
                                            .seed = choice_seed(base, i)},
                               .min_new = q->min_tokens,
                               .frequency_penalty = q->frequency_penalty,
                               .presence_penalty = q->presence_penalty,
                               .repetition_penalty = q->repetition_penalty,
                               .logit_bias = r->bias,
                               .n_logit_bias = q->n_bias,
                               .logprobs = q->logprobs,
                               .top_logprobs = q->top_logprobs,
                               .constraint = r->constraints ? &r->constraints[i] : NULL,
                               .spec = q->spec_given ? q->spec : st->o->speculative};
  return TPR_OK;
}

// The prompt's token ids (tokenized, or given) and, with echo, its text.
static tpr_status prompt_of(const serve_state *st, serve_req *r) {
  tpr_oai_request *q = &r->r;
  size_t n = 0;
  if (q->prompt_ids) {
    r->prompt = q->prompt_ids, n = q->n_prompt_ids;
    q->prompt_ids = NULL, q->n_prompt_ids = 0;
  } else {
    TPR_CHECK(tpr_tokenizer_encode(st->tok, q->prompt, strlen(q->prompt), true, &r->prompt, &n));
  }
  r->prompt_len = (int64_t)n;
  if (n == 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "the prompt is empty (0 tokens)");
  if (!q->echo) return TPR_OK;
  if (q->prompt) {
    r->echo_len = strlen(q->prompt);
    r->echo_text = strdup(q->prompt);
  } else {
    TPR_CHECK(tpr_engine_check_prompt(st->e, r->prompt, r->prompt_len));
    TPR_CHECK(tpr_tokenizer_decode_known(st->tok, r->prompt, n, false, &r->echo_text, &r->echo_len));
  }
  return r->echo_text ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "out of memory");
}

// max_tokens against the context; absent: up to the context.
static tpr_status max_new_of(const serve_state *st, const serve_req *r, int64_t *max_new, const char **param) {
  int64_t max_seq = tpr_engine_max_seq(st->e);
  *max_new = r->r.max_tokens;
  if (r->prompt_len >= max_seq) {
    *param = r->r.chat ? "messages" : "prompt";
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "the prompt (%lld tokens) leaves no room in the context of %lld tokens",
                    (long long)r->prompt_len, (long long)max_seq);
  }
  if (*max_new == 0) *max_new = max_seq - r->prompt_len;
  if (r->prompt_len + *max_new > max_seq) {
    *param = "max_tokens";
    return TPR_FAIL(TPR_ERR_INVALID_ARG,
                    "the prompt (%lld tokens) plus max_tokens (%lld) is longer than the context of %lld tokens",
                    (long long)r->prompt_len, (long long)*max_new, (long long)max_seq);
  }
  return TPR_OK;
}

void serve_generate(serve_state *st, tpr_http_conn *c, const tpr_http_request *hr, bool chat) {
  tpr_oai_error e;
  serve_req *r = calloc(1, sizeof *r);
  if (!r) return serve_respond_error(st, c, 500, "out of memory", NULL);
  if (!tpr_oai_parse(hr->body, hr->body_len, chat, &st->o->chat_template, st->o->model_id, &r->r, &e)) {
    free(r);
    return serve_respond_error(st, c, e.status, e.message, e.param);
  }
  const char *param = NULL;
  int64_t max_new = 0;
  tpr_status rc = prompt_of(st, r);
  if (rc == TPR_OK) rc = max_new_of(st, r, &max_new, &param);
  if (rc == TPR_OK) rc = gen_params(st, max_new, r);
  if (rc == TPR_OK) rc = tpr_engine_check_request(st->e, r->prompt, r->prompt_len, &r->g[0]);
  if (rc == TPR_OK && !(r->ch = calloc((size_t)r->r.n, sizeof *r->ch))) rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
  if (rc != TPR_OK) {
    char msg[512];
    serve_respond_error(st, c, rc == TPR_ERR_OOM ? 500 : 400, user_message(tpr_last_error(), msg, sizeof msg), param);
    serve_req_free(r);
    return;
  }
  for (int64_t i = 0; i < r->r.n; i++) r->ch[i].seq = -1;
  r->conn = c;
  r->created = (int64_t)time(NULL);
  r->t_submit = r->t_last_token = serve_now();
  snprintf(r->id, sizeof r->id, "%s-%lld", chat ? "chatcmpl" : "cmpl", (long long)st->next_id++);
  r->next = st->reqs;
  st->reqs = r;
  st->m.prompt_tokens += r->prompt_len;
  if (r->r.stream) {
    serve_count_status(st, 200);
    tpr_http_stream_begin(c);
  }
  serve_bridge_submit(st, r);
}
