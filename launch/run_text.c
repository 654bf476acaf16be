// run_text.h: tokenized prompts, incremental decoding and stop strings.
#include "launch/run_text.h"

#include <stdlib.h>
#include <string.h>

tpr_status run_text_open(run_text *r, const char *model, int n_sequences, const char *const *stops, int n_stops,
                         bool stream, FILE *out) {
  memset(r, 0, sizeof *r);
  r->stops = stops, r->n_stops = n_stops, r->n = n_sequences, r->stream = stream, r->out = out;
  for (int i = 0; i < n_stops; i++)
    if (!stops[i][0]) return TPR_FAIL(TPR_ERR_INVALID_ARG, "--stop: an empty stop string would stop at once");
  TPR_CHECK(tpr_tokenizer_load(model, &r->tok));
  r->text = calloc((size_t)n_sequences, sizeof *r->text);
  r->shown = calloc((size_t)n_sequences, sizeof *r->shown);
  r->stopped = calloc((size_t)n_sequences, sizeof *r->stopped);
  if (!r->text || !r->shown || !r->stopped) return TPR_FAIL(TPR_ERR_OOM, "run: text buffers");
  return TPR_OK;
}

void run_text_close(run_text *r) {
  for (int i = 0; r->text && i < r->n; i++) free(r->text[i]);
  free(r->text), free(r->shown), free(r->stopped);
  tpr_tokenizer_free(r->tok);
  memset(r, 0, sizeof *r);
}

tpr_status run_text_encode(const run_text *r, const char *text, int32_t **ids, int64_t *n) {
  size_t len = strlen(text), count = 0;
  TPR_CHECK(tpr_tokenizer_encode(r->tok, text, len, true, ids, &count));
  *n = (int64_t)count;
  if (count == 0) {
    free(*ids);
    *ids = NULL;
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--prompt '%s' encodes to no tokens", text);
  }
  return TPR_OK;
}

// Bytes of text that are safe to show: all of it once the sequence is done,
// else up to a trailing U+FFFD (an incomplete character, as the decoder
// renders one) and never into the first max_stop - 1 bytes of a possible
// stop string at the end.
static size_t safe_len(const run_text *r, const char *text, size_t len, bool finished) {
  if (finished) return len;
  size_t keep = len;
  while (keep >= 3 && !memcmp(text + keep - 3, "\xEF\xBF\xBD", 3)) keep -= 3;
  for (int i = 0; i < r->n_stops; i++) {  // a stop string may be completing
    size_t sl = strlen(r->stops[i]);
    for (size_t p = sl - 1; p > 0; p--)
      if (p <= keep && !memcmp(text + keep - p, r->stops[i], p)) {
        keep -= p;
        break;
      }
  }
  return keep;
}

tpr_status run_text_update(run_text *r, const tpr_engine *e, int64_t id) {
  if (id < 0 || id >= r->n || r->stopped[id]) return TPR_OK;
  tpr_sched_seq_info si;
  TPR_CHECK(tpr_engine_result(e, id, &si));
  char *text;
  size_t len;  // ids in the model's padding past the tokenizer's vocabulary have no text
  TPR_CHECK(tpr_tokenizer_decode_known(r->tok, si.tokens + si.prompt_len, (size_t)(si.len - si.prompt_len), true,
                                       &text, &len));
  // Stop strings are looked for in the settled text only: a trailing U+FFFD
  // stands for a character whose bytes are still coming, and is not text
  // yet (a stop string ending in U+FFFD's first byte would match it).
  size_t settled = len;
  while (!si.finished && settled >= 3 && !memcmp(text + settled - 3, "\xEF\xBF\xBD", 3)) settled -= 3;
  char kept = text[settled];
  text[settled] = '\0';
  size_t cut = len;
  for (int i = 0; i < r->n_stops; i++) {
    const char *at = strstr(text, r->stops[i]);
    if (at && (size_t)(at - text) < cut) cut = (size_t)(at - text);
  }
  text[settled] = kept;
  bool done = si.finished || cut < len;
  text[cut] = '\0';
  r->stopped[id] = cut < len;
  free(r->text[id]);
  r->text[id] = text;
  if (r->stream && id == 0) {
    size_t show = safe_len(r, text, cut, done);
    if (show > r->shown[id]) {
      fwrite(text + r->shown[id], 1, show - r->shown[id], r->out);
      fflush(r->out);
      r->shown[id] = show;
    }
  }
  return TPR_OK;
}
