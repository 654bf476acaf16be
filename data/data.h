// tpr data prepare: text (plain or JSONL, or JSONL chat conversations) to
// the token shards `tpr train` reads. The on-disk format (an index JSON, .npy
// token shards, document offsets, loss masks, the validation split) is
// described in docs/data.md; it is shared with the training side and fixed.
//
// The inputs are read in order, cut into records (documents, JSONL lines),
// and each batch of records is parsed, rendered and tokenized on `workers`
// threads; the results are written in input order by one thread, so the
// output is byte-identical at any worker count. A bad record (invalid UTF-8,
// a line that is not a JSON object, a missing or non-string text key, a
// malformed conversation) is counted and reported with its file and line,
// never written and never silently dropped.
#ifndef TPR_DATA_H
#define TPR_DATA_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/status.h"
#include "serve/serve.h"  // the built-in chat templates (tpr_chat_render_prefix)
#include "tokenizer/tokenizer.h"

typedef enum tpr_data_format {
  TPR_DATA_AUTO = 0,  // by extension: .jsonl / .json are JSONL, anything else text
  TPR_DATA_TXT,
  TPR_DATA_JSONL,
} tpr_data_format;

// How plain text is cut into documents.
typedef enum tpr_data_txt_docs {
  TPR_DATA_BLANK_LINES = 0,  // runs of lines separated by one or more blank (empty or whitespace-only) lines
  TPR_DATA_LINES,            // every non-blank line is a document
} tpr_data_txt_docs;

#define TPR_DATA_BAD_LISTED 20  // bad records listed (all are counted)

typedef struct tpr_data_bad {
  int input;      // index into opts.inputs
  int64_t line;   // 1-based: the record's (first) line
  char reason[200];
} tpr_data_bad;

typedef struct tpr_data_progress {
  int64_t bytes_read, bytes_total;  // bytes_total 0 when unknown (not a regular file)
  int64_t documents, tokens, bad;
  double seconds;
} tpr_data_progress;

typedef struct tpr_data_opts {
  const tpr_tokenizer *tok;
  const char *tokenizer_path;  // written to the index as given
  const char *const *inputs;
  int n_inputs;
  tpr_data_format format;
  tpr_data_txt_docs txt_docs;
  const char *text_key;  // JSONL: the text's key ("text")
  bool chat;             // JSONL {"messages": [...]}, rendered with chat_template, a loss mask beside the ids
  tpr_chat_renderer chat_template;  // the checkpoint's Jinja template, or a built-in
  bool append_eos;       // the tokenizer's EOS after every document (it must have one)
  bool add_special;      // apply the tokenizer's post-processor (e.g. a BOS) to every text document
  int64_t shard_tokens;  // a shard closes once it holds >= this many tokens (> 0)
  double val_fraction;   // [0, 1]
  uint64_t seed;
  int workers;           // >= 1
  const char *output;    // PREFIX: PREFIX.json, PREFIX.{train,val}.NNNNN{.npy,.docs.npy,.mask.npy}
  // Called by the writing thread after every batch and once at the end
  // (final = true); may be NULL.
  void (*progress)(const tpr_data_progress *p, bool final, void *ctx);
  void *progress_ctx;
  // Called for every bad record as it is written (in input order); may be NULL.
  void (*on_bad)(const tpr_data_bad *b, void *ctx);
  void *bad_ctx;
} tpr_data_opts;

typedef struct tpr_data_split_summary {
  int64_t documents, tokens, shards;
} tpr_data_split_summary;

typedef struct tpr_data_summary {
  tpr_data_split_summary train, val;
  int64_t bad;                        // all bad records
  tpr_data_bad listed[TPR_DATA_BAD_LISTED];
  int n_listed;                       // min(bad, TPR_DATA_BAD_LISTED)
  int64_t bytes;                      // input bytes read
  double seconds;
  char index_path[4096];
} tpr_data_summary;

// Runs the whole preparation. Errors (an unreadable input, a failed write,
// --append-eos without an EOS, bad options) are TPR_FAIL statuses naming the
// file; bad records are not errors: they are in *s.
tpr_status tpr_data_prepare(const tpr_data_opts *o, tpr_data_summary *s);

// The format an input is read as: o's, else by its extension.
tpr_data_format tpr_data_format_of(tpr_data_format given, const char *path);

// Whether document k (0-based over all inputs, bad records not counted) goes
// to the validation split: splitmix64(seed + k) < val_fraction * 2^64.
bool tpr_data_is_val(uint64_t seed, int64_t k, double val_fraction);

// --- chat.c -----------------------------------------------------------------
// One conversation {"messages": [...]} rendered with template t and
// tokenized: ids (n) and mask (n; 1 on the tokens of assistant replies).
// false with *err set (a bad record) when the conversation is malformed, when
// a message prefix rendered with the generation prompt is not a prefix of the
// next one without it (the template cannot delimit the reply), or when the
// rendering tokenizes differently cut at the reply boundaries than whole.
bool tpr_data_chat_encode(const tpr_tokenizer *tok, const tpr_chat_renderer *t, const cJSON *conversation, int32_t **ids,
                          uint8_t **mask, size_t *n, char *err, size_t errlen);

// --- utf8 -------------------------------------------------------------------
// Whether s[0..len) is valid UTF-8 (no overlongs, surrogates or > U+10FFFF);
// if not, *bad_at is the offset of the first bad byte.
bool tpr_data_utf8_valid(const char *s, size_t len, size_t *bad_at);

#endif
