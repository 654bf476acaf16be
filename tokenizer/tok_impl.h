// Internals of the tokenizer (tokenizer.h): the parsed tokenizer.json and the
// helpers its stages share. Not a public header.
#ifndef TPR_TOK_IMPL_H
#define TPR_TOK_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

// ---- growable byte buffer and string -> id map (tok_util.c)
typedef struct tok_buf {
  char *p;
  size_t n, cap;
} tok_buf;
tpr_status tok_buf_put(tok_buf *b, const void *s, size_t n);

typedef struct tok_map {  // open addressing, keys owned
  char **keys;
  uint32_t *lens;
  int32_t *vals;
  size_t cap, n;
} tok_map;
tpr_status tok_map_put(tok_map *m, const char *key, size_t len, int32_t val);  // overwrites
int32_t tok_map_get(const tok_map *m, const char *key, size_t len);            // -1 if absent
void tok_map_free(tok_map *m);

typedef struct tok_merges {  // (left id, right id) -> rank, merged id
  uint64_t *keys;            // UINT64_MAX = empty slot
  int32_t *rank, *merged;
  size_t cap, n;
} tok_merges;
tpr_status tok_merges_put(tok_merges *m, int32_t a, int32_t b, int32_t rank, int32_t merged);
bool tok_merges_get(const tok_merges *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged);
void tok_merges_free(tok_merges *m);

// ---- UTF-8 (tok_util.c)
size_t tok_utf8_valid_prefix(const char *s, size_t n);  // length of the longest valid prefix
// Decodes one scalar at s (valid UTF-8 assumed); returns its length.
int tok_utf8_next(const char *s, size_t n, int32_t *cp);
int tok_utf8_put(int32_t cp, char *out);  // 1..4 bytes
// Appends bytes to b as text, each maximal invalid subsequence -> U+FFFD
// (Rust's String::from_utf8_lossy, which the reference decoders use).
tpr_status tok_utf8_lossy(tok_buf *b, const unsigned char *s, size_t n);
// utf8proc_map(in, n, opts) (a normal form) into out, as the reference
// normalizes: code points newer than its tables are left alone
// (tok_unicode_compat.c).
tpr_status tok_nf_map(const char *in, size_t n, int opts, tok_buf *out);
bool tok_hf_is_mark(int32_t cp);  // a combining mark to the reference (StripAccents)
bool tok_hf_is_mn(int32_t cp);    // a nonspacing mark to the reference (BertNormalizer)
bool tok_hf_punct_flip(int32_t cp);  // punctuation to utf8proc and not to the reference, or the reverse
bool tok_hf_other_flip(int32_t cp);  // the same for clean_text's Cc/Cf/Co/Cs
bool tok_hf_grapheme_join(int32_t cp);  // joins the cluster before it to the reference, not to utf8proc
// The pattern with each \p{X} (general category) widened to the code points
// the reference's regex engine puts in X and PCRE2 does not know; *out
// malloc'ed.
tpr_status tok_regex_widen(const char *pattern, char **out);
bool tok_is_whitespace(int32_t cp);    // Unicode White_Space (Rust char::is_whitespace)
bool tok_is_word_char(int32_t cp);     // regex \w (Unicode)
bool tok_is_numeric(int32_t cp);       // Rust char::is_numeric: Nd, Nl, No
bool tok_is_punct(int32_t cp);         // ASCII punctuation or a P* category
// GPT-2's byte <-> printable-character map used by ByteLevel.
int tok_byte_char(int b);  // the code point byte b maps to
int tok_char_to_byte(int32_t cp);  // -1 when cp is not in the map

// UnicodeScripts' scripts (tok_scripts.c): ids only compare equal or not.
enum { TOK_SCRIPT_ANY = 0 };  // no script: never starts a piece
int tok_script_raw(int32_t cp);  // the reference's get_script()
int tok_script(int32_t cp);      // its fixed_script(): kana and U+30FC are Han, ' ' is Any
// Test-only: turns off fixed_script()'s fixups or shifts the table by one code
// point, so a test can show that its parity check sees them (negative
// controls). 0 in normal use.
enum { TOK_SCRIPTS_NO_KANA_FIX = 1, TOK_SCRIPTS_NO_SPACE_ANY = 2, TOK_SCRIPTS_TABLE_OFF_BY_ONE = 4 };
extern int tok_scripts_ablate;

// ---- compiled regex (tok_pretok.c)
typedef struct tok_regex {
  pcre2_code *code;
} tok_regex;
// pattern is a PCRE2 regex, or a literal when literal=true.
tpr_status tok_regex_compile(const char *file, const char *what, const char *pattern, bool literal, tok_regex *re);
void tok_regex_free(tok_regex *re);
// Per-call matching state (a JIT stack is not shareable between threads).
typedef struct tok_run {
  pcre2_match_data *md;
  pcre2_match_context *mc;
  pcre2_jit_stack *js;
} tok_run;
tpr_status tok_run_init(tok_run *r);
void tok_run_free(tok_run *r);
// The calling thread's tok_run, kept for the thread's life (NULL with the
// error set when out of memory). Encoding takes this one instead of making its
// own: a JIT stack is an 8 MiB mapping, and making one per call cost a page
// fault per call, more time in the kernel than in the tokenizer when many
// short texts are encoded (tpr data prepare: 2.3x the wall time).
tok_run *tok_run_thread(void);
// Calls fn(ctx, start, end) for each non-empty or empty match, left to right,
// non-overlapping. Returns the first non-OK fn status.
typedef tpr_status (*tok_match_fn)(void *ctx, size_t start, size_t end);
tpr_status tok_regex_each(const tok_regex *re, tok_run *run, const char *s, size_t n, tok_match_fn fn,
                          void *ctx);

// ---- normalizers (tok_normalize.c)
typedef enum { TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD, TOK_NORM_PREPEND, TOK_NORM_REPLACE,
               TOK_NORM_LOWERCASE, TOK_NORM_STRIP, TOK_NORM_STRIP_ACCENTS, TOK_NORM_BERT,
               TOK_NORM_PRECOMPILED, TOK_NORM_NMT } tok_norm_kind;
typedef struct tok_norm {
  tok_norm_kind kind;
  char *str;      // Prepend: the prefix; Replace: the replacement; Precompiled: the replacements
  size_t str_len;  // Precompiled (its strings hold NULs)
  uint32_t *pc;    // Precompiled: the double-array trie
  size_t pc_n;
  tok_regex re;   // Replace: the pattern
  bool left, right;  // Strip
  // BertNormalizer: its four steps, applied in this order
  bool clean_text, chinese_chars, strip_accents, lowercase;
} tok_norm;

// Precompiled (tok_precompiled.c): the charsmap from its base64, and applied.
tpr_status tok_precompiled_parse(const char *file, const char *b64, tok_norm *nm);
tpr_status tok_precompiled_apply(const tok_norm *nm, const char *in, size_t n, tok_buf *out);

// ---- pre-tokenizers (tok_pretok.c)
// Digits, Punctuation, WhitespaceSplit, CharDelimiterSplit, Whitespace and
// BertPreTokenizer are splits by a character class (tok_char_class).
typedef enum { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_METASPACE, TOK_PRE_CHARS, TOK_PRE_WHITESPACE,
               TOK_PRE_BERT, TOK_PRE_SCRIPTS } tok_pre_kind;
typedef enum { TOK_CC_DIGIT, TOK_CC_PUNCT, TOK_CC_SPACE, TOK_CC_DELIM } tok_char_class;
typedef enum { TOK_SPLIT_ISOLATED, TOK_SPLIT_REMOVED, TOK_SPLIT_MERGED_PREV, TOK_SPLIT_MERGED_NEXT,
               TOK_SPLIT_CONTIGUOUS } tok_split_behavior;
typedef enum { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } tok_prepend;
typedef struct tok_pre {
  tok_pre_kind kind;
  tok_regex re;                 // Split pattern; ByteLevel with use_regex: the GPT-2 pattern
  tok_split_behavior behavior;  // Split
  bool invert;                  // Split
  bool add_prefix_space;        // ByteLevel
  bool use_regex;               // ByteLevel
  char repl[8];                 // Metaspace replacement (UTF-8)
  tok_prepend prepend;          // Metaspace
  bool split;                   // Metaspace
  tok_char_class cc;            // TOK_PRE_CHARS: which characters are the delimiters
  int32_t delim;                // CharDelimiterSplit
  bool map_bytes;               // ByteLevel with steps after it: map to its alphabet here
} tok_pre;

// ---- decoders (tok_decode.c)
typedef enum { TOK_DEC_BYTELEVEL, TOK_DEC_METASPACE, TOK_DEC_REPLACE, TOK_DEC_BYTEFALLBACK, TOK_DEC_FUSE,
               TOK_DEC_STRIP, TOK_DEC_WORDPIECE, TOK_DEC_BPE } tok_dec_kind;
typedef struct tok_dec {
  tok_dec_kind kind;
  char *pattern, *content;  // Replace (String pattern); Strip: content is one character; WordPiece: prefix;
                            // BPEDecoder: suffix
  bool cleanup;             // WordPiece
  int start, stop;          // Strip
  char repl[8];             // Metaspace
  tok_prepend prepend;      // Metaspace
} tok_dec;

// A byte trie over the added tokens of one kind (normalized or not): the
// longest token at a position in one walk, whatever the number of tokens.
typedef struct tok_trie {
  uint64_t *keys;   // edge (node << 8 | byte) + 1; 0 = empty slot
  int32_t *child;
  size_t cap, n_edges;
  int32_t *term;    // per node: index of the added token ending there, -1
  int32_t n_nodes, node_cap;
  bool first[256];  // bytes some token starts with
} tok_trie;
tpr_status tok_trie_add(tok_trie *tr, const char *s, size_t n, int32_t val);  // keeps the first val
// The longest token starting at s[0..n): its value and *len, or -1.
int32_t tok_trie_longest(const tok_trie *tr, const char *s, size_t n, size_t *len);
void tok_trie_free(tok_trie *tr);

typedef struct tok_added {
  char *content;
  uint32_t len;
  int32_t id;
  bool special, lstrip, rstrip, single_word, normalized;
} tok_added;

typedef enum { TOK_MODEL_BPE, TOK_MODEL_WORDPIECE, TOK_MODEL_WORDLEVEL, TOK_MODEL_UNIGRAM } tok_model_kind;

struct tpr_tokenizer {
  char *file;  // the tokenizer.json path, for messages
  tok_model_kind model;
  // model (BPE, and WordPiece's vocab)
  tok_map vocab;
  tok_merges merges;
  int32_t unk_id;
  bool byte_fallback, fuse_unk, ignore_merges;
  int32_t byte_ids[256];  // <0xNN> ids for byte_fallback (-1 when absent)
  int32_t bl_ids[256];    // ByteLevel: the id of each byte's mapped character
  char *bpe_prefix, *bpe_suffix;  // BPE continuing_subword_prefix, end_of_word_suffix (NULL: none)
  char *wp_prefix;        // WordPiece continuing_subword_prefix
  int32_t wp_max_chars;   // WordPiece max_input_chars_per_word
  double *uni_score;      // Unigram: per id
  double uni_min;         // Unigram: the lowest score
  size_t uni_max_len;     // Unigram: the longest piece in bytes
  // every id -> token string (model vocab, then added tokens over it)
  char **id_tok;
  uint32_t *id_len;
  bool *id_special;
  int32_t n_ids;
  tok_norm *norms;
  int n_norms;
  tok_pre *pres;
  int n_pres;
  bool byte_level;  // a ByteLevel pre-tokenizer: words reach the model as bytes
  bool byte_map;    // steps follow ByteLevel: pieces pass between them in its alphabet
  tok_dec *decs;
  int n_decs;
  bool has_decoder;
  tok_added *added;  // sorted by id
  int n_added;
  tok_trie added_trie[2];  // [normalized]
  int32_t *post_pre, *post_post;  // TemplateProcessing ids before / after $A
  int n_post_pre, n_post_post;
  int32_t bos_id, eos_id;
};

// ---- stage entry points
tpr_status tok_parse_normalizer(tpr_tokenizer *t, const void *json);   // cJSON*
tpr_status tok_parse_pretokenizer(tpr_tokenizer *t, const void *json);
tpr_status tok_parse_decoder(tpr_tokenizer *t, const void *json);
tpr_status tok_parse_added(tpr_tokenizer *t, const void *json);
// Normalizes in[0..n) into out (cleared first).
tpr_status tok_normalize(const tpr_tokenizer *t, tok_run *run, const char *in, size_t n, tok_buf *out);

// Words handed from the pre-tokenizers to the model.
typedef struct tok_words {
  tok_buf text;        // words live here
  size_t *off, *len;
  size_t n, cap;
} tok_words;
tpr_status tok_words_push(tok_words *w, size_t off, size_t len);
void tok_words_free(tok_words *w);
// Splits s[0..n) (a normalized segment; at_start: it begins the original text)
// into words, appended to w.
tpr_status tok_pretokenize(const tpr_tokenizer *t, tok_run *run, const char *s, size_t n, bool at_start,
                           tok_words *w);
// BPE on one word, ids appended to out.
typedef struct tok_ids {
  int32_t *p;
  size_t n, cap;
} tok_ids;
tpr_status tok_ids_push(tok_ids *v, int32_t id);
typedef struct tok_bpe_scratch {  // reused between words
  int32_t *id, *prev, *next, *len;
  void *heap;  // merge_item[2 * cap] (tok_bpe.c)
  size_t cap;
} tok_bpe_scratch;
tpr_status tok_bpe_word(const tpr_tokenizer *t, tok_bpe_scratch *s, const char *w, size_t n, tok_ids *out);
void tok_bpe_scratch_free(tok_bpe_scratch *s);
// WordPiece and WordLevel (tok_wordpiece.c): the model's fields from its JSON
// object, and one word's ids (greedy longest match; the whole word) appended to out.
tpr_status tok_parse_wordpiece(tpr_tokenizer *t, const void *json, int32_t *max_id);
tpr_status tok_wordpiece_word(const tpr_tokenizer *t, tok_buf *scratch, const char *w, size_t n, tok_ids *out);
// Unigram (tok_unigram.c): likewise; one word's best segmentation (Viterbi).
tpr_status tok_parse_unigram(tpr_tokenizer *t, const void *json, int32_t *max_id);
tpr_status tok_unigram_word(const tpr_tokenizer *t, tok_buf *scratch, const char *w, size_t n, tok_ids *out);

#endif
