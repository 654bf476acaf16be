// The OpenAI response JSON of /v1/completions and /v1/chat/completions
// (cJSON): errors, full answers with n choices, streamed chunks, logprobs in
// each endpoint's shape (completions: tokens / token_logprobs /
// top_logprobs / text_offset; chat: content [{token, logprob, bytes,
// top_logprobs}]).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve.h"

static const char *error_type(int status) {
  switch (status) {
    case 400: case 413: return "invalid_request_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 503: return "service_unavailable";
    default: return "internal_error";
  }
}

char *tpr_oai_error_json(int status, const char *message, const char *param) {
  cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
  cJSON_AddStringToObject(e, "message", message);
  cJSON_AddStringToObject(e, "type", error_type(status));
  if (param && param[0]) cJSON_AddStringToObject(e, "param", param);
  else cJSON_AddNullToObject(e, "param");
  cJSON_AddNumberToObject(e, "code", status);
  char *s = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  return s;
}

static cJSON *envelope(bool chat, bool chunk, const char *id, int64_t created, const char *model) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "id", id);
  cJSON_AddStringToObject(j, "object",
                          chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
  cJSON_AddNumberToObject(j, "created", (double)created);
  cJSON_AddStringToObject(j, "model", model);
  return j;
}

static void add_usage(cJSON *j, int64_t prompt_tokens, int64_t completion_tokens) {
  cJSON *u = cJSON_AddObjectToObject(j, "usage");
  cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt_tokens);
  cJSON_AddNumberToObject(u, "completion_tokens", (double)completion_tokens);
  cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt_tokens + completion_tokens));
}

// Adds key: the first len bytes of text as a JSON string. Generated text may
// hold a NUL byte (a byte-level token for 0x00), which cJSON's C strings
// would cut the answer at, so the string is escaped here: '"', '\\' and
// control bytes (NUL as \u0000); other bytes as they are.
static void add_text(cJSON *obj, const char *key, const char *text, size_t len) {
  char *q = malloc(6 * len + 3), *o = q;  // every byte at most "\u00XX"
  if (!q) return;  // out of memory: the field is left out
  *o++ = '"';
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)text[i];
    if (ch == '"' || ch == '\\') {
      *o++ = '\\';
      *o++ = (char)ch;
    } else if (ch == '\n') {
      *o++ = '\\';
      *o++ = 'n';
    } else if (ch < 0x20 || ch == 0x7F) {
      o += sprintf(o, "\\u%04x", ch);
    } else {
      *o++ = (char)ch;
    }
  }
  *o++ = '"';
  *o = 0;
  cJSON_AddRawToObject(obj, key, q);
  free(q);
}

// The UTF-8 bytes of a token's text as a list of integers (chat's "bytes").
static cJSON *byte_list(const char *s, size_t n) {
  cJSON *a = cJSON_CreateArray();
  for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
  return a;
}

static cJSON *chat_token_lp(const char *tok, size_t len, double lp) {
  cJSON *o = cJSON_CreateObject();
  add_text(o, "token", tok, len);
  cJSON_AddNumberToObject(o, "logprob", lp);
  cJSON_AddItemToObject(o, "bytes", byte_list(tok, len));
  return o;
}

// chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null}
static cJSON *chat_logprobs(const tpr_oai_choice *c) {
  cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
  for (int64_t i = 0; i < c->n_lp; i++) {
    const tpr_oai_logprob *l = &c->lp[i];
    cJSON *t = chat_token_lp(l->token, l->token_len, l->logprob), *top = cJSON_AddArrayToObject(t, "top_logprobs");
    for (int k = 0; k < l->n_top; k++)
      cJSON_AddItemToArray(top, chat_token_lp(l->top_token[k], l->top_len[k], l->top_logprob[k]));
    cJSON_AddItemToArray(content, t);
  }
  cJSON_AddNullToObject(o, "refusal");
  return o;
}

// A JSON object key from token text that may hold NUL bytes: cut at the
// first NUL (cJSON keys are C strings), which only a 0x00 byte token has.
static char *key_of(const char *s, size_t n) {
  char *k = malloc(n + 1);
  if (!k) return NULL;
  memcpy(k, s, n);
  k[n] = 0;
  return k;
}

// completions: {"tokens", "token_logprobs", "top_logprobs" (one object per
// token: text -> logprob), "text_offset"}
static cJSON *completion_logprobs(const tpr_oai_choice *c) {
  cJSON *o = cJSON_CreateObject(), *toks = cJSON_AddArrayToObject(o, "tokens");
  cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs"), *tops = cJSON_AddArrayToObject(o, "top_logprobs");
  cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
  for (int64_t i = 0; i < c->n_lp; i++) {
    const tpr_oai_logprob *l = &c->lp[i];
    cJSON *holder = cJSON_CreateObject();  // add_text writes into an object; move the string out
    add_text(holder, "t", l->token, l->token_len);
    cJSON_AddItemToArray(toks, cJSON_DetachItemFromObject(holder, "t"));
    cJSON_Delete(holder);
    cJSON_AddItemToArray(lps, cJSON_CreateNumber(l->logprob));
    cJSON *top = cJSON_CreateObject();
    for (int k = 0; k < l->n_top; k++) {
      char *key = key_of(l->top_token[k], l->top_len[k]);
      if (key && !cJSON_GetObjectItemCaseSensitive(top, key)) cJSON_AddNumberToObject(top, key, l->top_logprob[k]);
      free(key);
    }
    cJSON_AddItemToArray(tops, top);
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)l->text_offset));
  }
  return o;
}

// vLLM's shapes: message.reasoning_content (a string or null) and
// message.tool_calls [{id, type, function: {name, arguments}}]; a delta has
// reasoning_content only when it carries some, and tool_calls items with
// their index, each call whole (its arguments in one piece).
static void add_parsed(cJSON *m, bool chunk, const tpr_oai_choice *c) {
  if (c->reasoning) add_text(m, "reasoning_content", c->reasoning, c->reasoning_len);
  else if (!chunk && c->has_reasoning) cJSON_AddNullToObject(m, "reasoning_content");
  if (!c->n_calls) return;
  cJSON *a = cJSON_AddArrayToObject(m, "tool_calls");
  for (int i = 0; i < c->n_calls; i++) {
    cJSON *t = cJSON_CreateObject();
    if (chunk) cJSON_AddNumberToObject(t, "index", c->call_index0 + i);
    cJSON_AddStringToObject(t, "id", c->call_ids[i]);
    cJSON_AddStringToObject(t, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(t, "function");
    cJSON_AddStringToObject(f, "name", c->calls[i].name);
    cJSON_AddStringToObject(f, "arguments", c->calls[i].arguments);
    cJSON_AddItemToArray(a, t);
  }
}

static cJSON *choice_json(bool chat, bool chunk, const tpr_oai_choice *c) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "index", (double)c->index);
  if (chat) {
    cJSON *m = cJSON_AddObjectToObject(o, chunk ? "delta" : "message");
    if (!chunk || c->role) cJSON_AddStringToObject(m, "role", "assistant");
    if (!chunk && c->parsed && c->content_null) cJSON_AddNullToObject(m, "content");
    else if (c->text || !chunk) add_text(m, "content", c->text ? c->text : "", c->text ? c->text_len : 0);
    if (c->parsed) add_parsed(m, chunk, c);
  } else {
    add_text(o, "text", c->text ? c->text : "", c->text ? c->text_len : 0);
  }
  if (!c->has_logprobs) cJSON_AddNullToObject(o, "logprobs");
  else cJSON_AddItemToObject(o, "logprobs", chat ? chat_logprobs(c) : completion_logprobs(c));
  if (c->finish) cJSON_AddStringToObject(o, "finish_reason", c->finish);
  else cJSON_AddNullToObject(o, "finish_reason");
  return o;
}

static char *print_free(cJSON *j) {
  char *s = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  return s;
}

char *tpr_oai_response_json(bool chat, const char *id, int64_t created, const char *model, const tpr_oai_choice *c,
                            int64_t n, int64_t prompt_tokens, int64_t completion_tokens) {
  cJSON *j = envelope(chat, false, id, created, model), *choices = cJSON_AddArrayToObject(j, "choices");
  for (int64_t i = 0; i < n; i++) cJSON_AddItemToArray(choices, choice_json(chat, false, &c[i]));
  add_usage(j, prompt_tokens, completion_tokens);
  return print_free(j);
}

char *tpr_oai_chunk_json(bool chat, const char *id, int64_t created, const char *model, const tpr_oai_choice *c) {
  cJSON *j = envelope(chat, true, id, created, model);
  cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "choices"), choice_json(chat, true, c));
  return print_free(j);
}

char *tpr_oai_usage_chunk_json(bool chat, const char *id, int64_t created, const char *model, int64_t prompt_tokens,
                               int64_t completion_tokens) {
  cJSON *j = envelope(chat, true, id, created, model);
  cJSON_AddArrayToObject(j, "choices");
  add_usage(j, prompt_tokens, completion_tokens);
  return print_free(j);
}
