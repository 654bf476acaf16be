// Speculative decoding's drafters (engine/speculative.h).
#include "engine/speculative.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tpr_status tpr_spec_check(const tpr_spec *s) {
  if (s->kind == TPR_SPEC_NONE) return TPR_OK;
  if (s->kind != TPR_SPEC_LOOKUP && s->kind != TPR_SPEC_SELF && s->kind != TPR_SPEC_EXTERNAL)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "speculative: unknown drafter %d", (int)s->kind);
  if (s->kind == TPR_SPEC_SELF && s->n < 1)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "speculative self:N:k: N %d layers must be >= 1", s->n);
  if (s->kind == TPR_SPEC_LOOKUP && (s->n < 1 || s->n > TPR_SPEC_MAX_N))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "speculative lookup:n:k: n %d is outside [1, %d]", s->n, TPR_SPEC_MAX_N);
  if (s->k < 1 || s->k > TPR_SPEC_MAX_K)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "speculative: k %d drafts per step is outside [1, %d]", s->k, TPR_SPEC_MAX_K);
  return TPR_OK;
}

// A decimal integer filling text[0..len) exactly.
static bool parse_int(const char *text, size_t len, int32_t *out) {
  if (len == 0 || len > 9) return false;
  int32_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (text[i] < '0' || text[i] > '9') return false;
    v = v * 10 + (text[i] - '0');
  }
  *out = v;
  return true;
}

tpr_status tpr_spec_parse(const char *text, tpr_spec *out) {
  *out = (tpr_spec){0};
  if (!text) return TPR_FAIL(TPR_ERR_INVALID_ARG, "speculative: no value");
  if (!strcmp(text, "off") || !strcmp(text, "none")) return TPR_OK;
  const bool self = !strncmp(text, "self:", 5);
  const char *a = self ? text + 5 : strncmp(text, "lookup:", 7) ? NULL : text + 7, *colon = a ? strchr(a, ':') : NULL;
  tpr_spec s = {.kind = self ? TPR_SPEC_SELF : TPR_SPEC_LOOKUP};
  if (!colon || !parse_int(a, (size_t)(colon - a), &s.n) || !parse_int(colon + 1, strlen(colon + 1), &s.k))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "speculative '%s': expected lookup:n:k (e.g. lookup:3:4), self:N:k (e.g. "
                    "self:2:3) or off", text);
  TPR_CHECK(tpr_spec_check(&s));
  *out = s;
  return TPR_OK;
}

const char *tpr_spec_format(const tpr_spec *s, char *buf, size_t size) {
  if (s->kind == TPR_SPEC_LOOKUP)
    snprintf(buf, size, "lookup:%d:%d", s->n, s->k);
  else if (s->kind == TPR_SPEC_SELF)
    snprintf(buf, size, "self:%d:%d", s->n, s->k);
  else if (s->kind == TPR_SPEC_EXTERNAL)
    snprintf(buf, size, "external:%d", s->k);
  else
    snprintf(buf, size, "off");
  return buf;
}

// Prompt lookup: the latest start j < len - m of the last m tokens, for the
// longest m <= n that occurs earlier; the k tokens after that occurrence
// (those past the end repeat the ones drafted: the span from the match on
// taken as periodic, so "a b a b" drafts "a b a ..." in full).
static int64_t lookup_draft(const tpr_spec *s, const int32_t *tok, int64_t len, int32_t *draft) {
  for (int64_t m = s->n < len ? s->n : len - 1; m >= 1; m--) {
    const int32_t *tail = tok + len - m;
    for (int64_t j = len - m - 1; j >= 0; j--) {
      if (tok[j] != tail[0] || memcmp(tok + j, tail, (size_t)m * sizeof *tok) != 0) continue;
      // What followed the match, continued past the end by the draft
      // itself: a span repeating with period len - from drafts all k.
      const int64_t from = j + m;
      for (int64_t i = 0; i < s->k; i++) draft[i] = from + i < len ? tok[from + i] : draft[from + i - len];
      return s->k;
    }
  }
  return 0;
}

int64_t tpr_spec_draft(const tpr_spec *s, const int32_t *tokens, int64_t len, int32_t *draft) {
  if (s->kind == TPR_SPEC_LOOKUP && len >= 2) return lookup_draft(s, tokens, len, draft);
  return 0;
}
