// The request bodies of /v1/completions and /v1/chat/completions (cJSON).
// Every parameter OpenAI's API reference lists for the endpoint, plus vLLM's
// sampling extensions, is in `fields` below: honoured, or refused with a 400
// naming it when its value asks for something tpr does not do (a tool_choice
// that forces a call, a response format, fill-in-the-middle, ...). A parameter not in the table is
// refused too, as OpenAI refuses one it does not know ("Unrecognized request
// argument supplied"): a client never gets an answer that silently ignored
// what it asked for.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/chat.h"
#include "serve/serve.h"

enum { COMPL = 1, CHAT = 2, BOTH = 3 };

// The parameters each endpoint knows. Those marked `only_trivial` are
// accepted only with the value that asks for nothing (checked in
// refuse_nontrivial); the rest are parsed below.
static const struct field {
  const char *name;
  int where;
} fields[] = {
    {"model", BOTH},          {"prompt", COMPL},           {"messages", CHAT},
    {"max_tokens", BOTH},     {"max_completion_tokens", CHAT},
    {"temperature", BOTH},    {"top_p", BOTH},             {"top_k", BOTH},
    {"seed", BOTH},           {"stop", BOTH},              {"stream", BOTH},
    {"stream_options", BOTH}, {"n", BOTH},                 {"best_of", COMPL},
    {"echo", COMPL},          {"suffix", COMPL},           {"logprobs", BOTH},
    {"top_logprobs", CHAT},   {"frequency_penalty", BOTH}, {"presence_penalty", BOTH},
    {"repetition_penalty", BOTH}, {"min_tokens", BOTH},    {"logit_bias", BOTH},
    {"ignore_eos", BOTH},     {"user", BOTH},  {"chat_template_kwargs", CHAT},              {"tools", CHAT},
    {"tool_choice", CHAT},    {"parallel_tool_calls", CHAT}, {"functions", CHAT},
    {"function_call", CHAT},  {"response_format", CHAT},   {"audio", CHAT},
    {"modalities", CHAT},     {"prediction", CHAT},        {"reasoning_effort", CHAT},
    {"service_tier", CHAT},   {"store", CHAT},             {"metadata", CHAT},
    {"web_search_options", CHAT}, {"verbosity", CHAT},     {"prompt_cache_key", CHAT},
    {"safety_identifier", CHAT},  {"speculative", BOTH},
};

void tpr_oai_request_free(tpr_oai_request *r) {
  free(r->prompt);
  free(r->prompt_ids);
  for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
  free(r->bias_ids);
  free(r->bias);
  cJSON_Delete(r->tools);
  tpr_json_grammar_free(r->grammar);
  memset(r, 0, sizeof *r);
}

static bool fail(tpr_oai_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool fail(tpr_oai_error *e, int status, const char *param, const char *fmt, ...) {
  e->status = status;
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return false;
}

static const cJSON *get(const cJSON *j, const char *name) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, name);
  return f && !cJSON_IsNull(f) ? f : NULL;  // null means absent, as OpenAI reads it
}

// A number field: absent keeps *out; wants_int: an integral value.
static bool num_field(const cJSON *j, const char *name, bool wants_int, double lo, double hi, double *out,
                      tpr_oai_error *e) {
  const cJSON *f = get(j, name);
  if (!f) return true;
  if (!cJSON_IsNumber(f)) return fail(e, 400, name, "'%s' must be a number", name);
  double v = f->valuedouble;
  if (wants_int && v != floor(v)) return fail(e, 400, name, "'%s' must be an integer", name);
  if (!(v >= lo && v <= hi)) return fail(e, 400, name, "'%s' = %g is out of range [%g, %g]", name, v, lo, hi);
  *out = v;
  return true;
}

static bool bool_field(const cJSON *j, const char *name, bool *out, tpr_oai_error *e) {
  const cJSON *v = get(j, name);
  if (!v) return true;
  if (!cJSON_IsBool(v)) return fail(e, 400, name, "'%s' must be a boolean", name);
  *out = cJSON_IsTrue(v);
  return true;
}

static bool string_field(const cJSON *j, const char *name, tpr_oai_error *e) {
  const cJSON *v = get(j, name);
  return !v || cJSON_IsString(v) || fail(e, 400, name, "'%s' must be a string", name);
}

// Parameters whose only accepted value asks for nothing tpr lacks.
static bool refuse_nontrivial(const cJSON *j, bool chat, tpr_oai_error *e) {
  static const char *const never[] = {"functions", "function_call", "audio", "prediction", "reasoning_effort",
                                      "web_search_options", "verbosity"};
  for (size_t i = 0; chat && i < sizeof never / sizeof never[0]; i++)
    if (get(j, never[i])) return fail(e, 400, never[i], "'%s' is not supported by this server", never[i]);
  const cJSON *v;
  if (chat && (v = get(j, "modalities"))) {
    const cJSON *m = cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 ? cJSON_GetArrayItem(v, 0) : NULL;
    if (!(cJSON_IsString(m) && strcmp(m->valuestring, "text") == 0))
      return fail(e, 400, "modalities", "'modalities' other than [\"text\"] is not supported by this server");
  }
  if (chat && (v = get(j, "store")) && !cJSON_IsFalse(v))
    return fail(e, 400, "store", "'store': this server does not store completions");
  if (chat && (v = get(j, "service_tier")) &&
      !(cJSON_IsString(v) && (!strcmp(v->valuestring, "auto") || !strcmp(v->valuestring, "default"))))
    return fail(e, 400, "service_tier", "'service_tier' must be \"auto\" or \"default\" (this server has one tier)");
  if (chat && (v = get(j, "metadata")) && !cJSON_IsObject(v))
    return fail(e, 400, "metadata", "'metadata' must be an object");
  if (!chat && (v = get(j, "suffix")) && !(cJSON_IsString(v) && v->valuestring[0] == 0))
    return fail(e, 400, "suffix", "'suffix' (fill-in-the-middle) is not supported by this server");
  const char *ids[] = {"user", "prompt_cache_key", "safety_identifier"};  // identifiers: no effect on the answer
  for (int i = 0; i < 3; i++)
    if (!string_field(j, ids[i], e)) return false;
  return true;
}

static bool unknown_fields(const cJSON *j, bool chat, tpr_oai_error *e) {
  const cJSON *f;
  cJSON_ArrayForEach(f, j) {
    bool known = false;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0] && !known; i++)
      known = (fields[i].where & (chat ? CHAT : COMPL)) && strcmp(fields[i].name, f->string) == 0;
    if (!known)
      return fail(e, 400, f->string, "Unrecognized request argument supplied: %.200s (%s does not take it)", f->string,
                  chat ? "/v1/chat/completions" : "/v1/completions");
  }
  return true;
}

// "prompt": [ids]: integers in [0, 2^31); the vocabulary is checked later.
static bool prompt_ids(const cJSON *p, tpr_oai_request *out, tpr_oai_error *e) {
  int n = cJSON_GetArraySize(p);
  if (n == 0) return fail(e, 400, "prompt", "'prompt' is an empty list of token ids");
  out->prompt_ids = malloc((size_t)n * sizeof *out->prompt_ids);
  if (!out->prompt_ids) return fail(e, 500, "prompt", "out of memory for the prompt");
  const cJSON *t;
  cJSON_ArrayForEach(t, p) {
    double v = cJSON_IsNumber(t) ? t->valuedouble : -1;
    if (!(v >= 0 && v < 2147483648.0 && v == floor(v)))
      return fail(e, 400, "prompt", "'prompt' must be a string or a list of token ids (integers >= 0)");
    out->prompt_ids[out->n_prompt_ids++] = (int32_t)v;
  }
  return true;
}

// The checkpoint's Jinja template over the request body's own text (its
// messages and chat_template_kwargs; numbers keep their int/float form), with
// the generation prompt. A template's raise_exception is the client's error.
static bool render_jinja(const tpr_chat_jinja *c, const char *body, size_t body_len, tpr_oai_request *out,
                         tpr_oai_error *e) {
  tpr_jinja_error err = {0};
  size_t len = 0;
  char *text = strndup(body, body_len);  // the renderer reads a C string
  if (!text) return fail(e, 500, "messages", "out of memory for the chat template");
  tpr_chat_inputs in = {.request_json = text, .add_generation_prompt = true};
  tpr_status rc = tpr_chat_jinja_render(c, &in, NULL, &out->prompt, &len, &err);
  free(text);
  if (rc == TPR_OK) return true;
  out->prompt = NULL;
  return fail(e, 400, "messages", "the chat template %s: %s", err.raised ? "refused the messages" : "failed",
              err.message);
}

// response_format: {"type": "text"} (nothing), {"type": "json_object"} (any
// JSON object) or {"type": "json_schema", "json_schema": {"name", "schema",
// "strict"?, "description"?}}: the answer is decoded under the grammar.
static bool parse_response_format(const cJSON *j, tpr_oai_request *out, tpr_oai_error *e) {
  const cJSON *v = get(j, "response_format");
  if (!v) return true;
  const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
  const char *type = cJSON_IsString(t) ? t->valuestring : "";
  const cJSON *schema = NULL;
  if (!strcmp(type, "text")) return true;
  if (!strcmp(type, "json_schema")) {
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(v, "json_schema");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!cJSON_IsObject(js) || !cJSON_IsString(name) || (schema && !cJSON_IsObject(schema)))
      return fail(e, 400, "response_format",
                  "'response_format.json_schema' must be {\"name\": ..., \"schema\": {...}, \"strict\"?: bool}");
  } else if (strcmp(type, "json_object") != 0) {
    return fail(e, 400, "response_format",
                "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
  }
  char err[256];
  out->grammar = tpr_json_grammar_new(schema, NULL, NULL, err, sizeof err);
  out->grammar_what = "response_format";
  return out->grammar || fail(e, 400, "response_format", "'response_format': %s", err);
}

// The grammar of a forced tool call (tool_choice "required" or a named
// function) in the template's format: the call's JSON, its name one of the
// functions and its arguments valid under that function's parameters
// schema. Formats whose calls are not JSON inside text tags are refused.
static bool forced_call_grammar(const cJSON *tools, const char *only, tpr_tool_format fmt, tpr_oai_request *out,
                                tpr_oai_error *e) {
  const char *pre = NULL, *suf = NULL, *args_key = "arguments";
  if (fmt == TPR_TOOL_FMT_HERMES) pre = "<tool_call>\n", suf = "\n</tool_call>";
  else if (fmt == TPR_TOOL_FMT_LLAMA3_JSON) args_key = "parameters";
  else
    return fail(e, 400, "tool_choice",
                "tool_choice \"required\" or a named function is decoded under a grammar for the hermes and "
                "llama3_json tool-call formats only (this server's is %s); use \"auto\"", tpr_tool_format_name(fmt));
  const char *names[64];
  const cJSON *params[64];
  const cJSON *t;
  int n = 0;
  cJSON_ArrayForEach(t, tools) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function"), *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
    if (only && strcmp(nm->valuestring, only)) continue;
    if (n == 64) return fail(e, 400, "tool_choice", "tool_choice \"required\" over more than 64 functions");
    names[n] = nm->valuestring, params[n++] = cJSON_GetObjectItemCaseSensitive(f, "parameters");
  }
  if (only && n == 0)
    return fail(e, 400, "tool_choice", "'tool_choice' names the function '%s', which is not in 'tools'", only);
  char err[256];
  out->grammar = tpr_json_grammar_new_call(n, names, params, "name", args_key, pre, suf, err, sizeof err);
  out->grammar_what = "tool_choice";
  return out->grammar || fail(e, 400, "tool_choice", "the forced call's schema: %s", err);
}

// tools: [{"type": "function", "function": {"name", "description"?,
// "parameters"?, "strict"?}}]; tool_choice "none" | "auto" (the default
// with tools) | "required" | {"type": "function", "function": {"name"}}: the
// last two decode the answer under the grammar of one call
// (forced_call_grammar). strict: true only with those (under "auto" nothing
// constrains the arguments). Tools are rendered by the checkpoint's Jinja
// template only (the built-ins have no tool syntax).
static bool parse_tools(const cJSON *j, const tpr_chat_renderer *tmpl, tpr_oai_request *out, tpr_oai_error *e) {
  const cJSON *tools = get(j, "tools"), *choice = get(j, "tool_choice"), *t;
  if (tools && !cJSON_IsArray(tools)) return fail(e, 400, "tools", "'tools' must be a list of tools");
  int i = 0;
  cJSON_ArrayForEach(t, tools) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type"), *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name"), *params = get(f, "parameters");
    const cJSON *desc = get(f, "description"), *strict = get(f, "strict");
    if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 || !cJSON_IsObject(f))
      return fail(e, 400, "tools", "'tools[%d]' must be {\"type\": \"function\", \"function\": {...}}", i);
    if (!cJSON_IsString(name) || !name->valuestring[0])
      return fail(e, 400, "tools", "'tools[%d].function.name' must be a non-empty string", i);
    if ((params && !cJSON_IsObject(params)) || (desc && !cJSON_IsString(desc)) || (strict && !cJSON_IsBool(strict)))
      return fail(e, 400, "tools",
                  "'tools[%d].function': parameters must be an object (a JSON schema), description a string, strict a "
                  "boolean", i);
    i++;
  }
  bool none = false, forced = false;
  const char *only = NULL;
  if (choice) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
    const cJSON *fname = cJSON_GetObjectItemCaseSensitive(f, "name");
    if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) none = true;
    else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "auto")) none = false;
    else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required")) forced = true;
    else if (cJSON_IsObject(choice) && cJSON_IsString(fname)) forced = true, only = fname->valuestring;
    else
      return fail(e, 400, "tool_choice",
                  "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                  "\"function\": {\"name\": ...}}");
  }
  i = 0;
  cJSON_ArrayForEach(t, tools) {
    const cJSON *strict = get(cJSON_GetObjectItemCaseSensitive(t, "function"), "strict");
    if (strict && cJSON_IsTrue(strict) && !forced)
      return fail(e, 400, "tools", "'tools[%d].function.strict': true is enforced under tool_choice \"required\" "
                  "or a named function only (under \"auto\" nothing constrains the model's arguments)", i);
    i++;
  }
  if (!bool_field(j, "parallel_tool_calls", &out->parallel_tool_calls, e)) return false;
  if (!get(j, "parallel_tool_calls")) out->parallel_tool_calls = true;
  out->reasoning = tmpl->reasoning;
  out->think_open = tmpl->think_open;
  if (i == 0 && choice && !none)  // as OpenAI and vLLM answer
    return fail(e, 400, "tool_choice", "'tool_choice' other than \"none\" needs 'tools'");
  if (i == 0) return true;  // no tools (an empty list is none)
  if (!tmpl->jinja)
    return fail(e, 400, "tools",
                "'tools' needs the checkpoint's own Jinja template to be rendered; this server renders the built-in "
                "%s template", tpr_chat_template_name(tmpl->builtin));
  if (!none && tmpl->tool_format == TPR_TOOL_FMT_NONE)
    return fail(e, 400, "tool_choice",
                "this server parses no tool calls (--tool-call-parser none, or its chat template shows no tool call "
                "syntax): only tool_choice \"none\" is possible with tools");
  out->tool_format = none ? TPR_TOOL_FMT_NONE : tmpl->tool_format;
  out->keep_special = !none && tmpl->keep_special;
  out->tools = cJSON_Duplicate(tools, true);
  if (!out->tools) return fail(e, 500, "tools", "out of memory for the tools");
  if (!forced) return true;
  if (out->grammar)
    return fail(e, 400, "tool_choice", "'tool_choice' \"required\" or a named function cannot be combined with "
                "'response_format' (both constrain the answer)");
  return forced_call_grammar(tools, only, tmpl->tool_format, out, e);
}

static bool parse_prompt(const cJSON *j, const char *body, size_t body_len, bool chat, const tpr_chat_renderer *tmpl,
                         tpr_oai_request *out, tpr_oai_error *e) {
  if (chat) {
    const cJSON *m = get(j, "messages");
    if (!m) return fail(e, 400, "messages", "'messages' is required");
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0)
      return fail(e, 400, "messages", "'messages' must be a non-empty list of messages");
    const cJSON *kw = get(j, "chat_template_kwargs");
    if (kw && !cJSON_IsObject(kw)) return fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (tmpl->jinja) return render_jinja(tmpl->jinja, body, body_len, out, e);
    if (kw && kw->child)
      return fail(e, 400, "chat_template_kwargs",
                  "'chat_template_kwargs' needs the checkpoint's own Jinja template; this server renders the built-in "
                  "%s template", tpr_chat_template_name(tmpl->builtin));
    char why[sizeof e->message] = "";
    out->prompt = tpr_chat_render(tmpl->builtin, m, why, sizeof why);
    if (!out->prompt) return fail(e, 400, "messages", "%s", why[0] ? why : "the messages cannot be rendered");
    return true;
  }
  const cJSON *p = get(j, "prompt");
  // A list of one string (or of one list of ids) is what the openai client
  // sends for a batch of one.
  if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
      (cJSON_IsString(cJSON_GetArrayItem(p, 0)) || cJSON_IsArray(cJSON_GetArrayItem(p, 0))))
    p = cJSON_GetArrayItem(p, 0);
  if (!p) return fail(e, 400, "prompt", "'prompt' is required");
  if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 &&
      (cJSON_IsString(cJSON_GetArrayItem(p, 0)) || cJSON_IsArray(cJSON_GetArrayItem(p, 0))))
    return fail(e, 400, "prompt",
                "'prompt' holds %d prompts: batches of several prompts in one request are not supported (send one "
                "request each)", cJSON_GetArraySize(p));
  if (cJSON_IsArray(p)) return prompt_ids(p, out, e);
  if (!cJSON_IsString(p)) return fail(e, 400, "prompt", "'prompt' must be a string or a list of token ids");
  out->prompt = strdup(p->valuestring);
  return out->prompt || fail(e, 500, "prompt", "out of memory for the prompt");
}

static bool parse_stop(const cJSON *j, tpr_oai_request *out, tpr_oai_error *e) {
  const cJSON *stop = get(j, "stop");
  if (!stop) return true;
  if (cJSON_IsString(stop)) {
    if (stop->valuestring[0]) out->stop[out->n_stop++] = strdup(stop->valuestring);
    return true;
  }
  if (!cJSON_IsArray(stop) || cJSON_GetArraySize(stop) > TPR_SERVE_MAX_STOP)
    return fail(e, 400, "stop", "'stop' must be a string or a list of at most %d strings", TPR_SERVE_MAX_STOP);
  const cJSON *s;
  cJSON_ArrayForEach(s, stop) {
    if (!cJSON_IsString(s)) return fail(e, 400, "stop", "'stop' must be a string or a list of strings");
    if (s->valuestring[0]) out->stop[out->n_stop++] = strdup(s->valuestring);
  }
  return true;
}

// logit_bias: {"id": bias}, ids as decimal strings, bias in [-100, 100].
static bool parse_logit_bias(const cJSON *j, tpr_oai_request *out, tpr_oai_error *e) {
  const cJSON *b = get(j, "logit_bias");
  if (!b) return true;
  if (!cJSON_IsObject(b)) return fail(e, 400, "logit_bias", "'logit_bias' must be an object of token id: bias");
  int n = cJSON_GetArraySize(b);
  if (n > 1024) return fail(e, 400, "logit_bias", "'logit_bias' has %d entries (at most 1024)", n);
  out->bias_ids = malloc((size_t)(n ? n : 1) * sizeof *out->bias_ids);
  out->bias = malloc((size_t)(n ? n : 1) * sizeof *out->bias);
  if (!out->bias_ids || !out->bias) return fail(e, 500, "logit_bias", "out of memory");
  const cJSON *f;
  cJSON_ArrayForEach(f, b) {
    char *end = NULL;
    long long id = strtoll(f->string, &end, 10);
    if (!f->string[0] || *end || id < 0 || id > 2147483647)
      return fail(e, 400, "logit_bias", "'logit_bias' key '%.40s' is not a token id", f->string);
    if (!cJSON_IsNumber(f) || !(f->valuedouble >= -100 && f->valuedouble <= 100))
      return fail(e, 400, "logit_bias", "'logit_bias' value for %lld must be a number in [-100, 100]", id);
    out->bias_ids[out->n_bias] = (int32_t)id;
    out->bias[out->n_bias++] = (float)f->valuedouble;
  }
  return true;
}

// logprobs: chat takes a boolean and top_logprobs, completions an integer
// (the number of most likely tokens; 0: the sampled token's only).
static bool parse_logprobs(const cJSON *j, bool chat, tpr_oai_request *out, tpr_oai_error *e) {
  if (chat) {
    double top = 0;
    if (!bool_field(j, "logprobs", &out->logprobs, e) ||
        !num_field(j, "top_logprobs", true, 0, TPR_SERVE_MAX_TOP_LOGPROBS, &top, e))
      return false;
    if (get(j, "top_logprobs") && !out->logprobs)
      return fail(e, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    out->top_logprobs = (int)top;
    return true;
  }
  double lp = -1;
  if (!num_field(j, "logprobs", true, 0, TPR_SERVE_MAX_TOP_LOGPROBS, &lp, e)) return false;
  out->logprobs = lp >= 0;
  out->top_logprobs = lp > 0 ? (int)lp : 0;
  return true;
}

static bool parse_sampling(const cJSON *j, bool chat, tpr_oai_request *out, tpr_oai_error *e) {
  double max_tokens = 0, temperature = 1, top_p = 1, top_k = 0, seed = -1, n = 1, best_of = -1;
  double fp = 0, pp = 0, rp = 1, min_tokens = 0;
  const char *mt = chat && get(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (!num_field(j, mt, true, 1, 1e9, &max_tokens, e) || !num_field(j, "temperature", false, 0, 100, &temperature, e) ||
      !num_field(j, "top_p", false, 1e-9, 1, &top_p, e) || !num_field(j, "top_k", true, -1, 1e9, &top_k, e) ||
      !num_field(j, "seed", true, -9007199254740992.0, 9007199254740992.0, &seed, e) ||
      !num_field(j, "n", true, 1, TPR_SERVE_MAX_N, &n, e) ||
      (!chat && !num_field(j, "best_of", true, 1, TPR_SERVE_MAX_N, &best_of, e)) ||
      !num_field(j, "frequency_penalty", false, -2, 2, &fp, e) ||
      !num_field(j, "presence_penalty", false, -2, 2, &pp, e) ||
      !num_field(j, "repetition_penalty", false, 1e-6, 2147483647.0, &rp, e) ||
      !num_field(j, "min_tokens", true, 0, 1e9, &min_tokens, e))
    return false;
  if (best_of >= 0 && best_of != n)
    return fail(e, 400, "best_of", "'best_of' other than n (%g) is not supported (ranking candidates server-side)", n);
  if (max_tokens > 0 && min_tokens > max_tokens)
    return fail(e, 400, "min_tokens", "'min_tokens' (%g) is larger than max_tokens (%g)", min_tokens, max_tokens);
  out->max_tokens = (int64_t)max_tokens;
  out->temperature = temperature;
  out->top_p = top_p;
  out->top_k = top_k < 0 ? 0 : (int64_t)top_k;  // -1: no limit (vLLM's spelling)
  out->has_seed = get(j, "seed") != NULL;
  out->seed = (uint64_t)(int64_t)seed;
  out->n = (int64_t)n;
  out->frequency_penalty = fp, out->presence_penalty = pp, out->repetition_penalty = rp;
  out->min_tokens = (int64_t)min_tokens;
  return true;
}

// tpr's extension: "speculative": "lookup:n:k" | "off" for this request
// (the server's --speculative otherwise; k at most the server's).
static bool parse_speculative(const cJSON *j, tpr_oai_request *out, tpr_oai_error *e) {
  const cJSON *v = get(j, "speculative");
  if (!v) return true;
  if (!cJSON_IsString(v)) return fail(e, 400, "speculative", "'speculative' must be a string: lookup:n:k or off");
  if (tpr_spec_parse(v->valuestring, &out->spec) != TPR_OK)
    return fail(e, 400, "speculative", "%s", tpr_last_error());
  out->spec_given = true;
  return true;
}

static bool parse_stream(const cJSON *j, bool chat, tpr_oai_request *out, tpr_oai_error *e) {
  const cJSON *so = get(j, "stream_options");
  if (so && !cJSON_IsObject(so)) return fail(e, 400, "stream_options", "'stream_options' must be an object");
  if (!bool_field(j, "stream", &out->stream, e) || !bool_field(j, "ignore_eos", &out->ignore_eos, e) ||
      (!chat && !bool_field(j, "echo", &out->echo, e)) ||
      (so && !bool_field(so, "include_usage", &out->include_usage, e)))
    return false;
  const cJSON *f;
  cJSON_ArrayForEach(f, so) {
    if (strcmp(f->string, "include_usage") != 0)
      return fail(e, 400, "stream_options", "'stream_options.%.100s' is not supported (only include_usage)",
                  f->string);
  }
  if (so && !out->stream) return fail(e, 400, "stream_options", "'stream_options' is only allowed with stream: true");
  if (out->ignore_eos && out->grammar)
    return fail(e, 400, "ignore_eos", "'ignore_eos' with %s: a structured answer ends at its end-of-sequence token",
                out->grammar_what);
  if (out->echo && out->logprobs)
    return fail(e, 400, "echo", "'echo' with 'logprobs' (the prompt's logprobs) is not supported");
  return true;
}

bool tpr_oai_parse(const char *body, size_t len, bool chat, const tpr_chat_renderer *tmpl, const char *model_id,
                   tpr_oai_request *out, tpr_oai_error *e) {
  memset(out, 0, sizeof *out);
  memset(e, 0, sizeof *e);
  out->chat = chat;
  cJSON *j = cJSON_ParseWithLength(body, len);
  if (!j) return fail(e, 400, NULL, "request body is not valid JSON");
  bool ok = false;
  if (!cJSON_IsObject(j)) {
    fail(e, 400, NULL, "request body must be a JSON object");
    goto done;
  }
  const cJSON *model = get(j, "model");
  if (model && !cJSON_IsString(model)) {
    fail(e, 400, "model", "'model' must be a string");
    goto done;
  }
  if (model && strcmp(model->valuestring, model_id) != 0) {
    fail(e, 404, "model", "the model '%.200s' does not exist (this server serves '%.200s')", model->valuestring,
         model_id);
    goto done;
  }
  ok = unknown_fields(j, chat, e) && refuse_nontrivial(j, chat, e) && (!chat || parse_response_format(j, out, e)) &&
       (!chat || parse_tools(j, tmpl, out, e)) &&
       parse_prompt(j, body, len, chat, tmpl, out, e) &&
       parse_sampling(j, chat, out, e) && parse_logprobs(j, chat, out, e) && parse_stream(j, chat, out, e) &&
       parse_stop(j, out, e) && parse_logit_bias(j, out, e) && parse_speculative(j, out, e);
  // A grammar decodes the answer from its first token: no reasoning to
  // separate first, even after a generation prompt that opens <think>.
  if (ok && out->grammar) out->reasoning = false;
  if (ok && out->reasoning) out->starts_in_reasoning = tpr_prompt_opens_think(out->prompt, out->think_open);
done:
  cJSON_Delete(j);
  if (!ok) tpr_oai_request_free(out);
  return ok;
}
