// Chat templates. ChatML is the default (and, for now, the only) template:
//   <|im_start|>{role}\n{content}<|im_end|>\n   for each message, then
//   <|im_start|>assistant\n                     the generation prompt.
// Qwen and MiniMax tokenizers declare <|im_start|> / <|im_end|> as special
// tokens, so the markers encode to single ids.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

char *tpr_chat_render_chatml(const cJSON *messages, char *err, size_t errlen) {
  if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0) {
    snprintf(err, errlen, "'messages' must be a non-empty list of {role, content} objects");
    return NULL;
  }
  sbuf b = {0};
  int i = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, messages) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsString(role) || !role->valuestring[0]) {
      snprintf(err, errlen, "messages[%d].role must be a non-empty string", i);
      free(b.p);
      return NULL;
    }
    put(&b, "<|im_start|>");
    put(&b, role->valuestring);
    put(&b, "\n");
    if (!put_content(&b, content)) {
      snprintf(err, errlen, "messages[%d].content must be a string or a list of text parts", i);
      free(b.p);
      return NULL;
    }
    put(&b, "<|im_end|>\n");
    i++;
  }
  put(&b, "<|im_start|>assistant\n");
  if (b.oom) {
    snprintf(err, errlen, "out of memory rendering the chat template");
    free(b.p);
    return NULL;
  }
  return b.p;
}
