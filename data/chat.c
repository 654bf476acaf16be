// Chat conversations to ids and a loss mask (tpr data prepare --chat).
//
// Which bytes of a rendering are an assistant's reply is found from the
// template itself, not from knowledge of its markers: for assistant message
// i, render messages[:i] with the generation prompt (what the model is shown
// before it answers) and messages[:i+1] without it; the reply is the suffix
// by which the second extends the first (its content and the template's
// end-of-turn marker, which the model must learn to emit). A template whose
// generation prompt is not a prefix of the rendered reply cannot be cut this
// way and the conversation is refused.
//
// The mask is per token, so the byte spans become token spans by tokenizing
// the rendering in pieces cut at the span boundaries; the pieces' ids, joined,
// must equal the whole rendering's ids (a token straddling a boundary would
// make them differ), else the conversation is refused rather than masked
// wrongly.
#include <stdlib.h>
#include <string.h>

#include "data/data.h"

typedef struct ibuf {
  int32_t *ids;
  uint8_t *mask;
  size_t n, cap;
} ibuf;

static bool ibuf_put(ibuf *b, const int32_t *ids, size_t n, uint8_t m) {
  if (b->n + n > b->cap) {
    size_t cap = (b->n + n) * 2 + 16;
    int32_t *i2 = realloc(b->ids, cap * sizeof *i2);
    if (!i2) return false;
    b->ids = i2;
    uint8_t *m2 = realloc(b->mask, cap);
    if (!m2) return false;
    b->mask = m2;
    b->cap = cap;
  }
  memcpy(b->ids + b->n, ids, n * sizeof *ids);
  memset(b->mask + b->n, m, n);
  b->n += n;
  return true;
}

static bool encode_piece(const tpr_tokenizer *tok, const char *s, size_t len, uint8_t m, ibuf *b, char *err,
                         size_t errlen) {
  int32_t *ids = NULL;
  size_t n = 0;
  tpr_status rc = tpr_tokenizer_encode(tok, s, len, false, &ids, &n);
  if (rc != TPR_OK) {
    snprintf(err, errlen, "tokenizing the rendered conversation: %s", tpr_last_error());
    return false;
  }
  bool ok = ibuf_put(b, ids, n, m);
  free(ids);
  if (!ok) snprintf(err, errlen, "out of memory");
  return ok;
}

bool tpr_data_chat_encode(const tpr_tokenizer *tok, const tpr_chat_renderer *t, const cJSON *conversation, int32_t **ids_out,
                          uint8_t **mask_out, size_t *n_out, char *err, size_t errlen) {
  const cJSON *messages = cJSON_GetObjectItemCaseSensitive(conversation, "messages");
  if (!cJSON_IsObject(conversation) || !cJSON_IsArray(messages)) {
    snprintf(err, errlen, "not a conversation: no \"messages\" list");
    return false;
  }
  int n_msg = cJSON_GetArraySize(messages);
  // OpenAI's fine-tuning lines may carry the tools the conversation could call.
  const cJSON *tools = cJSON_GetObjectItemCaseSensitive(conversation, "tools");
  char name[320];
  tpr_chat_renderer_describe(t, name, sizeof name);
  char *whole = tpr_chat_renderer_render(t, messages, n_msg, tools, false, err, errlen);
  if (!whole) return false;
  size_t whole_len = strlen(whole);
  // spans[2k], spans[2k+1]: the k-th reply's bytes [start, end) in whole.
  size_t *spans = malloc(sizeof *spans * 2 * (size_t)(n_msg + 1));
  int n_spans = 0;
  bool ok = spans != NULL;
  if (!ok) snprintf(err, errlen, "out of memory");
  const cJSON *m = messages ? messages->child : NULL;
  for (int i = 0; ok && i < n_msg; i++, m = m->next) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant") != 0) continue;
    char *before = tpr_chat_renderer_render(t, messages, i, tools, true, err, errlen);
    char *after = before ? tpr_chat_renderer_render(t, messages, i + 1, tools, false, err, errlen) : NULL;
    ok = after != NULL;
    if (ok) {
      size_t lb = strlen(before), la = strlen(after);
      if (la < lb || memcmp(before, after, lb) != 0) {
        snprintf(err, errlen,
                 "messages[%d]: the %s template's rendering up to this reply, with the generation prompt, is not "
                 "a prefix of the rendering with the reply, so the reply's tokens cannot be delimited",
                 i, name);
        ok = false;
      } else if (la > whole_len || memcmp(after, whole, la) != 0) {
        snprintf(err, errlen, "messages[%d]: the rendering up to this reply is not a prefix of the whole rendering", i);
        ok = false;
      } else {
        spans[2 * n_spans] = lb;
        spans[2 * n_spans + 1] = la;
        n_spans++;
      }
    }
    free(before);
    free(after);
  }
  // The pieces: outside, reply, outside, reply, ..., outside.
  ibuf b = {0};
  size_t at = 0;
  for (int k = 0; ok && k <= n_spans; k++) {
    size_t start = k < n_spans ? spans[2 * k] : whole_len;
    ok = encode_piece(tok, whole + at, start - at, 0, &b, err, errlen);
    if (ok && k < n_spans) {
      ok = encode_piece(tok, whole + start, spans[2 * k + 1] - start, 1, &b, err, errlen);
      at = spans[2 * k + 1];
    }
  }
  if (ok) {
    int32_t *ref = NULL;
    size_t n_ref = 0;
    if (tpr_tokenizer_encode(tok, whole, whole_len, false, &ref, &n_ref) != TPR_OK) {
      snprintf(err, errlen, "tokenizing the rendered conversation: %s", tpr_last_error());
      ok = false;
    } else if (n_ref != b.n || memcmp(ref, b.ids, n_ref * sizeof *ref) != 0) {
      snprintf(err, errlen,
               "the rendering tokenizes differently cut at the assistant replies' boundaries than whole (a token "
               "spans a boundary), so the loss mask cannot be placed");
      ok = false;
    }
    free(ref);
  }
  free(spans);
  free(whole);
  if (!ok) {
    free(b.ids);
    free(b.mask);
    return false;
  }
  if (!b.ids) {  // an empty rendering: still a (0-token) document, with non-NULL buffers
    b.ids = malloc(sizeof *b.ids);
    b.mask = malloc(1);
    if (!b.ids || !b.mask) {
      free(b.ids);
      free(b.mask);
      snprintf(err, errlen, "out of memory");
      return false;
    }
  }
  *ids_out = b.ids;
  *mask_out = b.mask;
  *n_out = b.n;
  return true;
}
