// Chat templates from checkpoints, rendered as transformers renders them
// (chat.h).
#define _GNU_SOURCE
#include "jinja/chat.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_impl.h"
#include "runtime/file_io.h"

const char *const tpr_chat_special_names[TPR_CHAT_SPECIAL_TOKENS] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                                                     "pad_token", "cls_token", "mask_token"};

static char *dup_n(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (p) {
    memcpy(p, s, n);
    p[n] = 0;
  }
  return p;
}

void tpr_chat_jinja_free(tpr_chat_jinja *c) {
  if (!c) return;
  free(c->text);
  free(c->text_tools);
  tpr_jinja_free(c->t);
  tpr_jinja_free(c->t_tools);
  for (int i = 0; i < TPR_CHAT_SPECIAL_TOKENS; i++) free(c->special[i]);
  memset(c, 0, sizeof *c);
}

tpr_status tpr_chat_jinja_from_text(const char *text, size_t len, tpr_chat_jinja *out, tpr_jinja_error *err) {
  memset(out, 0, sizeof *out);
  out->text = dup_n(text, len);
  if (!out->text) return TPR_FAIL(TPR_ERR_OOM, "chat template: out of memory");
  snprintf(out->source, sizeof out->source, "template text");
  tpr_status rc = tpr_jinja_parse(text, len, &out->t, err);
  if (rc != TPR_OK) tpr_chat_jinja_free(out);
  return rc;
}

static cJSON *read_json(const char *dir, const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  uint8_t *bytes = NULL;
  size_t len = 0;
  if (tpr_file_read(path, &bytes, &len) != TPR_OK) {
    tpr_clear_error();
    return NULL;
  }
  cJSON *j = cJSON_ParseWithLength((const char *)bytes, len);
  free(bytes);
  return j;
}

// A special token as tokenizer_config.json writes it: a string or {"content": ...}.
static const char *token_text(const cJSON *v) {
  if (cJSON_IsString(v)) return v->valuestring;
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
  return cJSON_IsString(c) ? c->valuestring : NULL;
}

void tpr_chat_jinja_special_tokens(const char *model_dir, tpr_chat_jinja *out) {
  cJSON *cfg = read_json(model_dir, "tokenizer_config.json");
  cJSON *map = read_json(model_dir, "special_tokens_map.json");
  for (int i = 0; i < TPR_CHAT_SPECIAL_TOKENS; i++) {
    const char *v = token_text(cJSON_GetObjectItemCaseSensitive(cfg, tpr_chat_special_names[i]));
    if (!v) v = token_text(cJSON_GetObjectItemCaseSensitive(map, tpr_chat_special_names[i]));
    free(out->special[i]);
    out->special[i] = v ? strdup(v) : NULL;
  }
  cJSON_Delete(map);
  cJSON_Delete(cfg);
}

tpr_status tpr_chat_jinja_load(const char *model_dir, tpr_chat_jinja *out, tpr_jinja_error *err) {
  memset(out, 0, sizeof *out);
  tpr_jinja_error local;
  if (!err) err = &local;
  memset(err, 0, sizeof *err);
  tpr_chat_jinja_special_tokens(model_dir, out);
  cJSON *cfg = read_json(model_dir, "tokenizer_config.json");
  char path[4096];
  snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir);
  uint8_t *bytes = NULL;
  size_t len = 0;
  tpr_status rc = TPR_OK;
  if (tpr_file_read(path, &bytes, &len) == TPR_OK) {
    out->text = dup_n((const char *)bytes, len);
    free(bytes);
    snprintf(out->source, sizeof out->source, "chat_template.jinja");
  } else {
    tpr_clear_error();
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsString(ct)) {
      out->text = strdup(ct->valuestring);
      snprintf(out->source, sizeof out->source, "tokenizer_config.json's chat_template");
    } else if (cJSON_IsArray(ct)) {
      const cJSON *e;
      cJSON_ArrayForEach(e, ct) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name"), *t = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (!cJSON_IsString(n) || !cJSON_IsString(t)) continue;
        if (!strcmp(n->valuestring, "default") && !out->text) out->text = strdup(t->valuestring);
        if (!strcmp(n->valuestring, "tool_use") && !out->text_tools) out->text_tools = strdup(t->valuestring);
      }
      snprintf(out->source, sizeof out->source, "tokenizer_config.json's chat_template (named)");
    }
  }
  cJSON_Delete(cfg);
  if (!out->text && !out->text_tools) {
    tpr_chat_jinja_free(out);
    return TPR_FAIL(TPR_ERR_IO, "%s declares no chat template (no chat_template.jinja, no chat_template in "
                    "tokenizer_config.json)", model_dir);
  }
  if (out->text) rc = tpr_jinja_parse(out->text, strlen(out->text), &out->t, err);
  if (rc == TPR_OK && out->text_tools) rc = tpr_jinja_parse(out->text_tools, strlen(out->text_tools), &out->t_tools, err);
  if (rc != TPR_OK) tpr_chat_jinja_free(out);
  return rc;
}

// An OpenAI request carries an assistant turn's tool-call arguments as JSON
// text; templates read them as a mapping (`arguments|items`). As vLLM's
// _postprocess_messages does: the text is parsed (empty or absent: {}), and
// an empty tool_calls list is dropped.
static jval openai_tool_calls(jctx *c, jval m) {
  jval *role = jd_gets(m.d, "role"), *calls = jd_gets(m.d, "tool_calls");
  if (!role || role->t != JV_STR || strcmp(role->s->s, "assistant") || !calls || calls->t != JV_LIST) return m;
  jval d = jv_dict(c);
  for (size_t k = 0; k < m.d->n; k++) {
    jval v = m.d->v[k];
    if (v.t == JV_LIST && v.l == calls->l) {
      if (!calls->l->n) continue;
      v = jv_list(c, JL_LIST);
      for (size_t i = 0; i < calls->l->n; i++) {
        jval call = calls->l->v[i], *f = call.t == JV_DICT ? jd_gets(call.d, "function") : NULL;
        if (!f || f->t != JV_DICT) jfail(c, "tool_calls[%zu] has no function object", i);
        jval *args = jd_gets(f->d, "arguments");
        jval parsed = args ? *args : jv_none();
        if (!args || !jtruthy(c, *args)) parsed = jv_dict(c);
        else if (args->t == JV_STR) parsed = jjson_parse(c, args->s->s, args->s->len);
        jval nf = jv_dict(c), nc = jv_dict(c);
        for (size_t j = 0; j < f->d->n; j++) jd_set(c, nf.d, f->d->k[j], f->d->v[j]);
        jd_set(c, nf.d, jv_cstr(c, "arguments"), parsed);
        for (size_t j = 0; j < call.d->n; j++)
          jd_set(c, nc.d, call.d->k[j], call.d->v[j].t == JV_DICT && call.d->v[j].d == f->d ? nf : call.d->v[j]);
        jl_push(c, v.l, nc);
      }
    }
    jd_set(c, d.d, m.d->k[k], v);
  }
  return d;
}

// The variables of render_jinja_template, in its order.
static void build_chat(jctx *c, jdict *vars, const void *arg) {
  const void *const *a = arg;
  const tpr_chat_jinja *cj = a[0];
  const tpr_chat_inputs *in = a[1];
  jval msgs, tools = jv_none(), docs = jv_none(), kw = jv_none();
  if (in->request_json) {
    jval body = jjson_parse(c, in->request_json, strlen(in->request_json));
    if (body.t != JV_DICT) jfail(c, "the request must be a JSON object");
    jval *m = jd_gets(body.d, "messages"), *t = jd_gets(body.d, "tools"), *d = jd_gets(body.d, "documents"),
         *k = jd_gets(body.d, "chat_template_kwargs");
    if (!m) jfail(c, "the request has no messages");
    msgs = *m;
    if (t && t->t != JV_NONE) tools = *t;
    if (d && d->t != JV_NONE) docs = *d;
    if (k && k->t != JV_NONE) kw = *k;
  } else {
    msgs = jjson_parse(c, in->messages_json, strlen(in->messages_json));
    if (in->tools_json) tools = jjson_parse(c, in->tools_json, strlen(in->tools_json));
    if (in->documents_json) docs = jjson_parse(c, in->documents_json, strlen(in->documents_json));
    if (in->kwargs_json) kw = jjson_parse(c, in->kwargs_json, strlen(in->kwargs_json));
  }
  if (msgs.t != JV_LIST) jfail(c, "messages must be a JSON list");
  jval clean = jv_list(c, JL_LIST);
  static const char *const reasoning[] = {"reasoning_content", "thinking", "reasoning"};
  for (size_t i = 0; i < msgs.l->n; i++) {
    jval m = msgs.l->v[i];
    if (m.t != JV_DICT) jfail(c, "Chat messages should be dicts");
    jval d = jv_dict(c);  // apply_chat_template drops keys whose value is None
    for (size_t k = 0; k < m.d->n; k++) {
      jval key = m.d->k[k], v = m.d->v[k];
      // vLLM gives a null content (an assistant turn of tool calls) to a
      // template as "" (its string content format).
      if (in->request_json && v.t == JV_NONE && key.t == JV_STR && !strcmp(key.s->s, "content")) v = jv_cstr(c, "");
      if (v.t != JV_NONE) jd_set(c, d.d, key, v);
    }
    const jval *r = NULL;
    for (int k = 0; k < 3 && !r; k++) {
      jval *v = jd_gets(d.d, reasoning[k]);
      if (v && v->t != JV_NONE) r = v;
    }
    if (r) {  // {"thinking": r, **message, "reasoning_content": r}
      jval rv = *r, al = jv_dict(c);
      jd_set(c, al.d, jv_cstr(c, "thinking"), rv);
      for (size_t k = 0; k < d.d->n; k++) jd_set(c, al.d, d.d->k[k], d.d->v[k]);
      jd_set(c, al.d, jv_cstr(c, "reasoning_content"), rv);
      d = al;
    }
    if (in->request_json) d = openai_tool_calls(c, d);
    jl_push(c, clean.l, d);
  }
  jd_set(c, vars, jv_cstr(c, "messages"), clean);
  jd_set(c, vars, jv_cstr(c, "tools"), tools);
  jd_set(c, vars, jv_cstr(c, "documents"), docs);
  jd_set(c, vars, jv_cstr(c, "add_generation_prompt"), jv_bool(in->add_generation_prompt));
  for (int i = 0; i < TPR_CHAT_SPECIAL_TOKENS; i++)
    if (cj->special[i]) jd_set(c, vars, jv_cstr(c, tpr_chat_special_names[i]), jv_cstr(c, cj->special[i]));
  if (kw.t != JV_NONE) {
    if (kw.t != JV_DICT) jfail(c, "the extra template arguments must be a JSON object");
    for (size_t i = 0; i < kw.d->n; i++) jd_set(c, vars, kw.d->k[i], kw.d->v[i]);
  }
}

tpr_status tpr_chat_jinja_render(const tpr_chat_jinja *cj, const tpr_chat_inputs *in, const tpr_jinja_limits *limits,
                                 char **out, size_t *out_len, tpr_jinja_error *err) {
  // A named "tool_use" template when tools are given (transformers' choice).
  bool has_tools = in->tools_json != NULL;
  if (in->request_json) {
    cJSON *body = cJSON_Parse(in->request_json);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(body, "tools");
    has_tools = t && !cJSON_IsNull(t);
    cJSON_Delete(body);
  }
  const tpr_jinja_template *t = has_tools && cj->t_tools ? cj->t_tools : cj->t ? cj->t : cj->t_tools;
  if (!in->messages_json && !in->request_json) return TPR_FAIL(TPR_ERR_INVALID_ARG, "chat template: no messages");
  const void *arg[2] = {cj, in};
  return jrender(t, build_chat, arg, limits, out, out_len, err);
}
