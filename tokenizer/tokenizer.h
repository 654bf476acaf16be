// Hugging Face tokenizer.json in C: the BPE, WordPiece and Unigram tokenizers of the models tpr runs,
// encoding and decoding exactly as the `tokenizers` library does
// (tests/test_tokenizer.c proves it on fixtures that library wrote).
//
// Supported components (anything else fails to load with TPR_ERR_UNSUPPORTED
// naming the file and the component, e.g. "tokenizer.json: pre_tokenizer type
// 'UnicodeScripts' is not supported"):
//   normalizer     null, NFC, NFD, NFKC, NFKD (utf8proc), Prepend, Replace
//                  (String or Regex pattern), Lowercase, Strip, StripAccents,
//                  BertNormalizer (clean_text, handle_chinese_chars,
//                  strip_accents, null following lowercase; lowercase),
//                  Precompiled (SentencePiece's charsmap), Nmt, Sequence of those
//   pre_tokenizer  null, Split (String or Regex pattern via PCRE2 with Unicode
//                  properties; behaviors Isolated, Removed, MergedWithPrevious,
//                  MergedWithNext, Contiguous; invert), Punctuation (the same
//                  behaviors), Digits (individual_digits), Whitespace,
//                  WhitespaceSplit, CharDelimiterSplit, BertPreTokenizer,
//                  ByteLevel (add_prefix_space, use_regex = the GPT-2 pattern;
//                  anywhere in a Sequence, the steps after it seeing its
//                  alphabet), Metaspace (replacement, prepend_scheme
//                  always/first/never, split; not with ByteLevel), a Sequence
//                  of those in any order
//   model          BPE: vocab, merges ("a b" or ["a", "b"]) applied by rank
//                  (lowest first, leftmost on ties), unk_token, fuse_unk,
//                  byte_fallback (<0xNN> tokens), ignore_merges,
//                  continuing_subword_prefix, end_of_word_suffix;
//                  WordPiece: vocab, unk_token, continuing_subword_prefix,
//                  max_input_chars_per_word (greedy longest match per word);
//                  WordLevel: vocab, unk_token (the whole word or unk);
//                  Unigram: vocab [piece, score], unk_id (unknowns fused),
//                  byte_fallback (Viterbi over the scores)
//   post_processor null, ByteLevel, TemplateProcessing (single),
//                  BertProcessing, RobertaProcessing (single), Sequence
//   decoder        ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip,
//                  WordPiece (prefix, cleanup), BPEDecoder (suffix), Sequence of those
//   added_tokens   matched before the model, leftmost-longest through a byte
//                  trie, with the lstrip / rstrip / single_word / normalized /
//                  special flags
//
// Unicode properties come from utf8proc, overridden where the reference's
// tables decide otherwise (normal forms, marks, punctuation, clean_text,
// grapheme clusters: tok_unicode_compat.c); regex classes come from PCRE2,
// each \p{X} widened with the code points the reference's engine adds.
// Text is UTF-8; invalid UTF-8 input to encode is TPR_ERR_INVALID_ARG (the
// reference library takes only valid strings). Decoded text is valid UTF-8:
// bytes that do not form characters become U+FFFD as the reference does.
// A loaded tokenizer is immutable: encode/decode may run on many threads.
#ifndef TPR_TOKENIZER_H
#define TPR_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/status.h"

typedef struct tpr_tokenizer tpr_tokenizer;

// Loads `path`: a checkpoint directory holding tokenizer.json (and optionally
// tokenizer_config.json, whose bos_token / eos_token name the BOS/EOS ids), or
// a tokenizer.json file itself.
tpr_status tpr_tokenizer_load(const char *path, tpr_tokenizer **out);
void tpr_tokenizer_free(tpr_tokenizer *t);

// Encodes `len` bytes of UTF-8 text. add_special: apply the post-processor
// (e.g. Llama's "<s> $A" template), as `add_special_tokens=True` does. Special
// tokens written inside the text are always recognised. *ids is malloc'ed
// (never NULL on success, even for 0 ids); the caller frees it.
tpr_status tpr_tokenizer_encode(const tpr_tokenizer *t, const char *text, size_t len, bool add_special,
                                int32_t **ids, size_t *n);

// Decodes ids to text (NUL-terminated, *len excludes the NUL; malloc'ed).
// skip_special drops special added tokens. An id outside [0, vocab size) is
// TPR_ERR_INVALID_ARG.
tpr_status tpr_tokenizer_decode(const tpr_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                                char **text, size_t *len);

// The same, leaving out ids outside [0, vocab size) instead of failing: a
// model's vocabulary is often padded past its tokenizer's (rows no token
// maps to), and a sampled padding id has no text.
tpr_status tpr_tokenizer_decode_known(const tpr_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                                      char **text, size_t *len);

// Number of ids (model vocab and added tokens: the largest id + 1).
int32_t tpr_tokenizer_vocab_size(const tpr_tokenizer *t);
// The token string of an id (NULL when out of range or unused); owned by t.
const char *tpr_tokenizer_id_to_token(const tpr_tokenizer *t, int32_t id);
// The id of a token string (added tokens first, then the model vocab), -1 if none.
int32_t tpr_tokenizer_token_to_id(const tpr_tokenizer *t, const char *token);
// Whether id is a special added token (what skip_special drops).
bool tpr_tokenizer_is_special(const tpr_tokenizer *t, int32_t id);
// BOS / EOS ids from tokenizer_config.json (-1 when not declared).
int32_t tpr_tokenizer_bos_id(const tpr_tokenizer *t);
int32_t tpr_tokenizer_eos_id(const tpr_tokenizer *t);

#endif
