// Text in and out for tpr run: prompts tokenized with the checkpoint's
// tokenizer.json (tokenizer/tokenizer.h), generated tokens decoded as they
// arrive, stop strings, and the tokenizer's EOS as the stop token.
#ifndef TPR_RUN_TEXT_H
#define TPR_RUN_TEXT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

typedef struct run_text {
  tpr_tokenizer *tok;
  const char *const *stops;  // stop strings (borrowed)
  int n_stops;
  int n;                     // sequences (ids 0..n-1)
  bool stream;               // print sequence 0's text to `out` as it grows
  FILE *out;
  char **text;               // (n) the generated text so far, cut at a stop string
  size_t *shown;             // (n) bytes of text already streamed
  bool *stopped;             // (n) a stop string was found: later tokens are not shown
} run_text;

// Loads model's tokenizer.json (TPR_ERR_IO / _FORMAT / _UNSUPPORTED naming
// the file when it is missing or not supported).
tpr_status run_text_open(run_text *r, const char *model, int n_sequences, const char *const *stops, int n_stops,
                         bool stream, FILE *out);
void run_text_close(run_text *r);

// Encodes a prompt (special tokens of the template added); *ids malloc'ed.
// An empty prompt is TPR_ERR_INVALID_ARG.
tpr_status run_text_encode(const run_text *r, const char *text, int32_t **ids, int64_t *n);

// Rank 0, after each engine step: decodes sequence id's generated tokens,
// cuts them at the first stop string, and streams what is new. Text that
// ends inside a multi-byte character (decoded as U+FFFD) is held back until
// the character is whole, unless the sequence has finished.
tpr_status run_text_update(run_text *r, const tpr_engine *e, int64_t id);

#endif
