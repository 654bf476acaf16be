// The OpenAI request and response JSON of /v1/completions and
// /v1/chat/completions (cJSON). Request fields this server does not know are
// ignored, as OpenAI-compatible servers do; known fields of the wrong type or
// out of range are a 400 naming the field.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve.h"

void tpr_oai_request_free(tpr_oai_request *r) {
  free(r->prompt);
  free(r->prompt_ids);
  for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
  memset(r, 0, sizeof *r);
}

static bool bad(char *err, size_t errlen, int *status, int code, const char *msg, const char *field) {
  snprintf(err, errlen, msg, field);
  *status = code;
  return false;
}

// A number field: absent keeps *out; wants_int: an integral value.
static bool num_field(const cJSON *j, const char *name, bool wants_int, double lo, double hi, double *out, char *err,
                      size_t errlen, int *status) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, name);
  if (!f || cJSON_IsNull(f)) return true;
  if (!cJSON_IsNumber(f)) return bad(err, errlen, status, 400, "'%s' must be a number", name);
  double v = f->valuedouble;
  if (wants_int && (v != floor(v))) return bad(err, errlen, status, 400, "'%s' must be an integer", name);
  if (!(v >= lo && v <= hi)) {
    snprintf(err, errlen, "'%s' = %g is out of range [%g, %g]", name, v, lo, hi);
    *status = 400;
    return false;
  }
  *out = v;
  return true;
}

// An optional boolean (absent or null: false).
static bool bool_field(const cJSON *j, const char *name, bool *out, char *err, size_t errlen, int *status) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
  if (!v || cJSON_IsNull(v)) return true;
  if (!cJSON_IsBool(v)) return bad(err, errlen, status, 400, "'%s' must be a boolean", name);
  *out = cJSON_IsTrue(v);
  return true;
}

// "prompt": [ids]: integers in [0, 2^31); the vocabulary is checked later.
static bool prompt_ids(const cJSON *p, tpr_oai_request *out, char *err, size_t errlen, int *status) {
  int n = cJSON_GetArraySize(p);
  if (n == 0) return bad(err, errlen, status, 400, "'%s' is an empty list of token ids", "prompt");
  out->prompt_ids = malloc((size_t)n * sizeof *out->prompt_ids);
  if (!out->prompt_ids) return bad(err, errlen, status, 500, "out of memory for '%s'", "prompt");
  const cJSON *t;
  cJSON_ArrayForEach(t, p) {
    double v = cJSON_IsNumber(t) ? t->valuedouble : -1;
    if (!(v >= 0 && v < 2147483648.0 && v == floor(v)))
      return bad(err, errlen, status, 400, "'%s' must be a string or a list of token ids (integers >= 0)", "prompt");
    out->prompt_ids[out->n_prompt_ids++] = (int32_t)v;
  }
  return true;
}

bool tpr_oai_parse(const char *body, size_t len, bool chat, tpr_chat_template tmpl, const char *model_id,
                   tpr_oai_request *out, int *status, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->chat = chat;
  cJSON *j = cJSON_ParseWithLength(body, len);
  if (!j) return bad(err, errlen, status, 400, "request body is not valid JSON%s", "");
  bool ok = false;
  if (!cJSON_IsObject(j)) {
    bad(err, errlen, status, 400, "request body must be a JSON object%s", "");
    goto done;
  }
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
  if (model && !cJSON_IsNull(model)) {
    if (!cJSON_IsString(model)) {
      bad(err, errlen, status, 400, "'%s' must be a string", "model");
      goto done;
    }
    if (strcmp(model->valuestring, model_id) != 0) {
      snprintf(err, errlen, "the model '%.200s' does not exist (this server serves '%.200s')", model->valuestring,
               model_id);
      *status = 404;
      goto done;
    }
  }
  if (chat) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (!m) {
      bad(err, errlen, status, 400, "'%s' is required", "messages");
      goto done;
    }
    out->prompt = tpr_chat_render(tmpl, m, err, errlen);
    if (!out->prompt) {
      *status = 400;
      goto done;
    }
  } else {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    // A list of one string (or of one list of ids) is what the openai
    // client sends for a batch of one.
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
        (cJSON_IsString(cJSON_GetArrayItem(p, 0)) || cJSON_IsArray(cJSON_GetArrayItem(p, 0))))
      p = cJSON_GetArrayItem(p, 0);
    if (!p) {
      bad(err, errlen, status, 400, "'%s' is required", "prompt");
      goto done;
    }
    if (cJSON_IsArray(p)) {
      if (!prompt_ids(p, out, err, errlen, status)) goto done;
    } else if (!cJSON_IsString(p)) {
      bad(err, errlen, status, 400,
          "'%s' must be a string, a list of token ids, or a list of one of those (batches of several prompts are "
          "not supported)", "prompt");
      goto done;
    } else {
      out->prompt = strdup(p->valuestring);
    }
  }
  double max_tokens = 16, temperature = 1, top_p = 1, top_k = 0, seed = 0, n = 1;
  const char *mt = chat && cJSON_GetObjectItemCaseSensitive(j, "max_completion_tokens") ? "max_completion_tokens"
                                                                                          : "max_tokens";
  if (!num_field(j, mt, true, 1, 1e9, &max_tokens, err, errlen, status) ||
      !num_field(j, "temperature", false, 0, 100, &temperature, err, errlen, status) ||
      !num_field(j, "top_p", false, 1e-9, 1, &top_p, err, errlen, status) ||
      !num_field(j, "top_k", true, -1, 1e9, &top_k, err, errlen, status) ||
      !num_field(j, "seed", true, 0, 9007199254740992.0, &seed, err, errlen, status) ||
      !num_field(j, "n", true, 1, 1, &n, err, errlen, status))
    goto done;
  out->max_tokens = (int64_t)max_tokens;
  out->temperature = temperature;
  out->top_p = top_p;
  out->top_k = top_k < 0 ? 0 : (int64_t)top_k;  // -1: no limit (vLLM's spelling)
  out->seed = (int64_t)seed;
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(j, "stream_options");
  if (so && !cJSON_IsNull(so) && !cJSON_IsObject(so)) {
    bad(err, errlen, status, 400, "'%s' must be an object", "stream_options");
    goto done;
  }
  if (!bool_field(j, "stream", &out->stream, err, errlen, status) ||
      !bool_field(j, "ignore_eos", &out->ignore_eos, err, errlen, status) ||
      (cJSON_IsObject(so) && !bool_field(so, "include_usage", &out->include_usage, err, errlen, status)))
    goto done;
  if (out->include_usage && !out->stream) {
    bad(err, errlen, status, 400, "'%s' is only allowed with stream: true", "stream_options");
    goto done;
  }
  const cJSON *stop = cJSON_GetObjectItemCaseSensitive(j, "stop");
  if (stop && !cJSON_IsNull(stop)) {
    if (cJSON_IsString(stop)) {
      if (stop->valuestring[0]) out->stop[out->n_stop++] = strdup(stop->valuestring);
    } else if (cJSON_IsArray(stop) && cJSON_GetArraySize(stop) <= TPR_SERVE_MAX_STOP) {
      const cJSON *s;
      cJSON_ArrayForEach(s, stop) {
        if (!cJSON_IsString(s)) {
          bad(err, errlen, status, 400, "'%s' must be a string or a list of strings", "stop");
          goto done;
        }
        if (s->valuestring[0]) out->stop[out->n_stop++] = strdup(s->valuestring);
      }
    } else {
      bad(err, errlen, status, 400, "'%s' must be a string or a list of at most 4 strings", "stop");
      goto done;
    }
  }
  ok = true;
done:
  cJSON_Delete(j);
  if (!ok) tpr_oai_request_free(out);
  return ok;
}

static const char *error_type(int status) {
  switch (status) {
    case 400: case 413: return "invalid_request_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 503: return "service_unavailable";
    default: return "internal_error";
  }
}

char *tpr_oai_error_json(int status, const char *message) {
  cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
  cJSON_AddStringToObject(e, "message", message);
  cJSON_AddStringToObject(e, "type", error_type(status));
  cJSON_AddNullToObject(e, "param");
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

char *tpr_oai_response_json(bool chat, const char *id, int64_t created, const char *model, const char *text,
                            size_t text_len, const char *finish_reason, int64_t prompt_tokens,
                            int64_t completion_tokens) {
  cJSON *j = envelope(chat, false, id, created, model);
  cJSON *c = cJSON_CreateObject();
  cJSON_AddNumberToObject(c, "index", 0);
  if (chat) {
    cJSON *m = cJSON_AddObjectToObject(c, "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    add_text(m, "content", text, text_len);
  } else {
    add_text(c, "text", text, text_len);
  }
  cJSON_AddNullToObject(c, "logprobs");
  cJSON_AddStringToObject(c, "finish_reason", finish_reason);
  cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "choices"), c);
  add_usage(j, prompt_tokens, completion_tokens);
  char *s = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  return s;
}

char *tpr_oai_usage_chunk_json(bool chat, const char *id, int64_t created, const char *model, int64_t prompt_tokens,
                               int64_t completion_tokens) {
  cJSON *j = envelope(chat, true, id, created, model);
  cJSON_AddArrayToObject(j, "choices");
  add_usage(j, prompt_tokens, completion_tokens);
  char *s = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  return s;
}

char *tpr_oai_chunk_json(bool chat, const char *id, int64_t created, const char *model, const char *text,
                         size_t text_len, const char *finish_reason, bool first) {
  cJSON *j = envelope(chat, true, id, created, model);
  cJSON *c = cJSON_CreateObject();
  cJSON_AddNumberToObject(c, "index", 0);
  if (chat) {
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    if (first) cJSON_AddStringToObject(d, "role", "assistant");
    if (text) add_text(d, "content", text, text_len);
  } else {
    add_text(c, "text", text ? text : "", text ? text_len : 0);
  }
  cJSON_AddNullToObject(c, "logprobs");
  if (finish_reason) cJSON_AddStringToObject(c, "finish_reason", finish_reason);
  else cJSON_AddNullToObject(c, "finish_reason");
  cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "choices"), c);
  char *s = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  return s;
}
