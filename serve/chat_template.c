// Chat templates, built in (tpr has no Jinja engine, so a checkpoint's own
// template text is recognised, not run):
//   chatml       <|im_start|>{role}\n{content}<|im_end|>\n per message, then
//                <|im_start|>assistant\n  (Qwen2/Qwen3, Qwen3-MoE; any role)
//   minimax_m2   ]~!b[ once, then ]~b]{role}\n{content}[e~[\n per message, the
//                assistant's role written "ai", then ]~b]ai\n<think>\n
//                (MiniMax-M2's turn markers; roles system, user, assistant,
//                tool). The official template's default system prompt and
//                tool-call rendering are not reproduced.
//   hunyuan_moe  <|startoftext|>{system}<|extra_4|>, <|startoftext|>{user}<|extra_0|>
//                (the user's <|startoftext|> left out right after a system
//                message, which opened the turn), {assistant}<|eos|>; nothing
//                after the last message: <|extra_0|> hands the turn to the
//                model (Hunyuan-A13B-Instruct's turn markers; roles system,
//                user, assistant). The official template's /think and
//                /no_think switches are not reproduced.
// The markers are special tokens of those tokenizers, so each encodes to a
// single id.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/chat.h"
#include "runtime/file_io.h"
#include "serve/serve.h"

typedef struct sbuf {
  char *p;
  size_t len, cap;
  bool oom;
} sbuf;

static void put(sbuf *b, const char *s) {
  size_t n = strlen(s);
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = (b->len + n + 1) * 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      b->oom = true;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n + 1);
  b->len += n;
}

// content: a string, or a list of {"type":"text","text":...} parts (joined).
static bool put_content(sbuf *b, const cJSON *content) {
  if (cJSON_IsString(content)) {
    put(b, content->valuestring);
    return true;
  }
  if (!cJSON_IsArray(content)) return false;
  const cJSON *part;
  cJSON_ArrayForEach(part, content) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text)) return false;
    put(b, text->valuestring);
  }
  return true;
}

// How a template writes one role's turn: open, the content, close.
typedef struct role_def {
  const char *role, *open, *close;
} role_def;

typedef struct template_def {
  const char *name;
  const char *begin, *generation;
  // Any role, as given: turn_open {role} turn_sep {content} turn_close. Used
  // when roles is NULL.
  const char *turn_open, *turn_sep, *turn_close;
  // The roles the template can render and how it writes each; NULL: any role.
  const role_def *roles;
  // A user turn right after a system message leaves out its open (the system
  // message opened the turn).
  bool user_joins_system;
} template_def;

static const role_def minimax_roles[] = {{"system", "]~b]system\n", "[e~[\n"},
                                         {"user", "]~b]user\n", "[e~[\n"},
                                         {"assistant", "]~b]ai\n", "[e~[\n"},
                                         {"tool", "]~b]tool\n", "[e~[\n"},
                                         {NULL, NULL, NULL}};
static const role_def hunyuan_roles[] = {{"system", "<|startoftext|>", "<|extra_4|>"},
                                         {"user", "<|startoftext|>", "<|extra_0|>"},
                                         {"assistant", "", "<|eos|>"},
                                         {NULL, NULL, NULL}};

static const template_def templates[TPR_CHAT_TEMPLATE_COUNT] = {
    [TPR_CHAT_CHATML] = {.name = "chatml",
                         .begin = "",
                         .generation = "<|im_start|>assistant\n",
                         .turn_open = "<|im_start|>",
                         .turn_sep = "\n",
                         .turn_close = "<|im_end|>\n"},
    [TPR_CHAT_MINIMAX_M2] = {.name = "minimax_m2", .begin = "]~!b[", .generation = "]~b]ai\n<think>\n",
                             .roles = minimax_roles},
    [TPR_CHAT_HUNYUAN_MOE] = {.name = "hunyuan_moe", .begin = "", .generation = "", .roles = hunyuan_roles,
                              .user_joins_system = true},
};

const char *tpr_chat_template_name(tpr_chat_template t) {
  return t >= 0 && t < TPR_CHAT_TEMPLATE_COUNT ? templates[t].name : "none";
}

void tpr_chat_renderer_describe(const tpr_chat_renderer *r, char *buf, size_t cap) {
  if (r->jinja) snprintf(buf, cap, "jinja (%s)", r->jinja->source);
  else snprintf(buf, cap, "%s (built in)", tpr_chat_template_name(r->builtin));
}

tpr_status tpr_chat_renderer_pick(const char *model_dir, const char *arg, tpr_chat_jinja *j, tpr_chat_renderer *r,
                                  char *warn, size_t cap) {
  *r = (tpr_chat_renderer){.builtin = TPR_CHAT_CHATML};
  warn[0] = '\0';
  tpr_jinja_error err = {0};
  if (strcmp(arg, "auto") == 0) {
    tpr_status rc = tpr_chat_jinja_load(model_dir, j, &err);
    if (rc == TPR_OK) r->jinja = j;
    else if (rc != TPR_ERR_IO)
      r->builtin = TPR_CHAT_NONE,
      snprintf(warn, cap, "the checkpoint's chat template cannot be rendered (%s); give --chat-template FILE.jinja "
               "or a built-in name", err.message);
    return TPR_OK;
  }
  if (tpr_chat_template_parse(arg, &r->builtin)) return TPR_OK;
  uint8_t *text = NULL;
  size_t len = 0;
  if (tpr_file_read(arg, &text, &len) != TPR_OK)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--chat-template '%s' is neither auto, a built-in (chatml, minimax_m2, "
                    "hunyuan_moe) nor a readable file", arg);
  tpr_status rc = tpr_chat_jinja_from_text((const char *)text, len, j, &err);
  free(text);
  if (rc != TPR_OK) return TPR_FAIL(TPR_ERR_INVALID_ARG, "--chat-template %s: %s", arg, err.message);
  snprintf(j->source, sizeof j->source, "%s", arg);
  tpr_chat_jinja_special_tokens(model_dir, j);
  r->jinja = j;
  return TPR_OK;
}

char *tpr_chat_renderer_render(const tpr_chat_renderer *r, const cJSON *messages, int n, const cJSON *tools,
                               bool add_generation_prompt, char *err, size_t errlen) {
  if (!r->jinja) {
    if (tools && !cJSON_IsNull(tools)) {
      snprintf(err, errlen, "tools need the checkpoint's own Jinja template (this is the built-in %s rendering)",
               tpr_chat_template_name(r->builtin));
      return NULL;
    }
    return tpr_chat_render_prefix(r->builtin, messages, n, add_generation_prompt, err, errlen);
  }
  if (!cJSON_IsArray(messages) || n < 0 || n > cJSON_GetArraySize(messages)) {
    snprintf(err, errlen, "'messages' must be a list of messages");
    return NULL;
  }
  if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools)) {
    snprintf(err, errlen, "'tools' must be a list of tool definitions");
    return NULL;
  }
  // {"messages": messages[:n], "tools": tools}: the request body tpr serve would render (borrowed items).
  cJSON *body = cJSON_CreateObject(), *first = cJSON_AddArrayToObject(body, "messages");
  const cJSON *m = messages->child;
  for (int i = 0; first && i < n; i++, m = m->next) cJSON_AddItemReferenceToArray(first, (cJSON *)m);
  if (body && tools && cJSON_IsArray(tools)) cJSON_AddItemReferenceToObject(body, "tools", (cJSON *)tools);
  char *json = first ? cJSON_PrintUnformatted(body) : NULL;
  cJSON_Delete(body);
  if (!json) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  tpr_jinja_error e = {0};
  char *out = NULL;
  size_t len = 0;
  tpr_chat_inputs in = {.request_json = json, .add_generation_prompt = add_generation_prompt};
  tpr_status rc = tpr_chat_jinja_render(r->jinja, &in, NULL, &out, &len, &e);
  free(json);
  if (rc == TPR_OK) return out;
  snprintf(err, errlen, "the chat template %s: %s", e.raised ? "refused the messages" : "failed", e.message);
  return NULL;
}

bool tpr_chat_template_parse(const char *s, tpr_chat_template *out) {
  for (int t = 0; t < TPR_CHAT_TEMPLATE_COUNT; t++)
    if (strcmp(s, templates[t].name) == 0) {
      *out = (tpr_chat_template)t;
      return true;
    }
  return false;
}

// Which built-in template a checkpoint's Jinja text is, by its markers.
static tpr_chat_template recognise(const char *jinja) {
  if (strstr(jinja, "]~b]")) return TPR_CHAT_MINIMAX_M2;
  if (strstr(jinja, "<|extra_0|>") && strstr(jinja, "<|extra_4|>")) return TPR_CHAT_HUNYUAN_MOE;
  if (strstr(jinja, "<|im_start|>")) return TPR_CHAT_CHATML;
  return TPR_CHAT_NONE;
}

tpr_chat_template tpr_chat_template_detect(const char *model_dir, char *why, size_t whylen) {
  char path[4096];
  uint8_t *bytes = NULL;
  size_t len = 0;
  tpr_chat_template t = TPR_CHAT_CHATML;
  snprintf(why, whylen, "no chat template in the checkpoint: ChatML, the default");
  // Newer checkpoints keep the template in its own file.
  snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir);
  if (tpr_file_read(path, &bytes, &len) == TPR_OK) {
    char *text = malloc(len + 1);
    if (text) {
      memcpy(text, bytes, len);
      text[len] = 0;
      t = recognise(text);
      snprintf(why, whylen, "chat_template.jinja");
      free(text);
    }
    free(bytes);
    return t;
  }
  snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
  if (tpr_file_read(path, &bytes, &len) != TPR_OK) return t;
  cJSON *j = cJSON_ParseWithLength((const char *)bytes, len);
  free(bytes);
  const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
  if (cJSON_IsArray(ct)) {  // named templates: the "default" one
    const cJSON *e;
    const cJSON *found = NULL;
    cJSON_ArrayForEach(e, ct) {
      const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
      if (cJSON_IsString(n) && strcmp(n->valuestring, "default") == 0)
        found = cJSON_GetObjectItemCaseSensitive(e, "template");
    }
    ct = found;
  }
  if (cJSON_IsString(ct)) {
    t = recognise(ct->valuestring);
    snprintf(why, whylen, "tokenizer_config.json's chat_template");
  }
  cJSON_Delete(j);
  return t;
}

char *tpr_chat_render(tpr_chat_template t, const cJSON *messages, char *err, size_t errlen) {
  return tpr_chat_render_prefix(t, messages, cJSON_GetArraySize(messages), true, err, errlen);
}

char *tpr_chat_render_prefix(tpr_chat_template t, const cJSON *messages, int n_messages, bool add_generation_prompt,
                             char *err, size_t errlen) {
  if (t < 0 || t >= TPR_CHAT_TEMPLATE_COUNT) {
    snprintf(err, errlen,
             "this model's chat template is not one tpr has built in (chatml, minimax_m2, hunyuan_moe): start the "
             "server with --chat-template NAME, or use /v1/completions with a prompt you render");
    return NULL;
  }
  const template_def *d = &templates[t];
  if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0) {
    snprintf(err, errlen, "'messages' must be a non-empty list of {role, content} objects");
    return NULL;
  }
  sbuf b = {0};
  put(&b, "");  // an empty rendering (no messages, no generation prompt) is "", not NULL
  put(&b, d->begin);
  int i = 0;
  bool prev_system = false;
  const cJSON *m;
  cJSON_ArrayForEach(m, messages) {
    if (i == n_messages) break;
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsString(role) || !role->valuestring[0]) {
      snprintf(err, errlen, "messages[%d].role must be a non-empty string", i);
      goto fail;
    }
    const char *open_prefix = d->turn_open, *written = role->valuestring, *open_suffix = d->turn_sep;
    const char *close = d->turn_close;
    if (d->roles) {
      const role_def *r = d->roles;
      while (r->role && strcmp(r->role, role->valuestring) != 0) r++;
      if (!r->role) {
        snprintf(err, errlen, "messages[%d].role '%.64s' has no place in the %s chat template", i, role->valuestring,
                 d->name);
        goto fail;
      }
      bool joined = d->user_joins_system && strcmp(r->role, "user") == 0 && prev_system;
      open_prefix = joined ? "" : r->open;
      written = open_suffix = "";
      close = r->close;
    }
    prev_system = strcmp(role->valuestring, "system") == 0;
    put(&b, open_prefix);
    put(&b, written);
    put(&b, open_suffix);
    if (!put_content(&b, content)) {
      snprintf(err, errlen, "messages[%d].content must be a string or a list of text parts", i);
      goto fail;
    }
    put(&b, close);
    i++;
  }
  if (add_generation_prompt) put(&b, d->generation);
  if (b.oom) {
    snprintf(err, errlen, "out of memory rendering the chat template");
    goto fail;
  }
  return b.p;
fail:
  free(b.p);
  return NULL;
}
