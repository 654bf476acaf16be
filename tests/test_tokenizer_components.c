// Pre-tokenizers and normalizers beyond the common ones (Digits, Punctuation,
// Split behaviours, ByteLevel inside a Sequence, Whitespace, WhitespaceSplit,
// CharDelimiterSplit, BertPreTokenizer, Lowercase, Strip, StripAccents)
// against the Hugging Face `tokenizers` library: the fixtures under
// tests/fixtures/tokenizer_components/ (scripts/reference/
// make_tokenizer_components_fixture.py) hold tiny tokenizers that library
// trained and its encodings of mixed text. Every id and decoded string must be
// equal. Negative controls (a step dropped, two steps swapped) must give
// mismatches, so the comparison is shown to catch a wrong pipeline.
// Added tokens: 300 short overlapping ones with random flags against the
// library (added_flags), and 10,000 against a naive leftmost-longest search.
// BERT-style tokenizers (make_tokenizer_wordpiece_fixture.py): WordPiece,
// BertNormalizer, the WordPiece decoder, BertProcessing and
// TemplateProcessing; Unigram with Metaspace (make_tokenizer_unigram_fixture.py);
// BPE with continuing_subword_prefix / end_of_word_suffix, the BPEDecoder and
// RobertaProcessing (make_tokenizer_bpe_affix_fixture.py); all three sets
// encoded with add_special_tokens as the library's default. UnicodeScripts
// alone and in a Sequence with BPE, byte-level BPE, WordPiece and Unigram over
// mixed-script text, and over every boundary of the library's script table
// (make_tokenizer_scripts_fixture.py).
#define _GNU_SOURCE  // mkdtemp
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/file_io.h"
#include "test_util.h"
#include "tokenizer/tok_impl.h"  // tok_scripts_ablate, for the UnicodeScripts negative controls
#include "tokenizer/tokenizer.h"

#define FIX TPR_FIXTURES "/tokenizer_components"

static const char *CONFIGS[] = {"starcoder",        "digits_group",   "falcon",          "bytelevel_first",
                                "punct_isolated",   "punct_removed",  "punct_prev",      "punct_next",
                                "punct_contiguous", "split_str_next", "split_invert_removed",
                                "split_contiguous", "whitespace",     "whitespace_split", "bert",
                                "char_delim",       "lower_bytelevel", "added_flags",      "wordpiece_bert",
                                "wordpiece_cased",  "unigram_t5",     "unigram_bytes",   "unigram_precompiled",
                                "bpe_prefix",       "bpe_suffix",     "bpe_suffix_bytelevel", "unigram_nmt",
                                "wordlevel",        "unicode_nfc",    "unicode_nfd",     "unicode_nfkc",
                                "unicode_nfkd",     "unicode_bert",   "unicode_strip",   "unicode_clean",
                                "unicode_punct",    "unicode_regex",  "unicode_grapheme", "scripts_bpe",
                                "scripts_bytelevel", "scripts_wordpiece", "scripts_unigram", "scripts_table"};

static cJSON *read_json(const char *path) {
  uint8_t *bytes;
  size_t n;
  TT_OK(tpr_file_read(path, &bytes, &n));
  cJSON *j = cJSON_ParseWithLength((const char *)bytes, n);
  free(bytes);
  if (!j) fail_msg("%s does not parse", path);
  return j;
}

typedef struct tally {
  size_t cases, ids, id_bad, decodes, dec_bad;
} tally;

// Encodes and decodes every case of `name` with t; counts mismatches.
static tally run_cases(const tpr_tokenizer *t, const char *name, bool quiet) {
  char path[512];
  snprintf(path, sizeof path, FIX "/%s.jsonl", name);
  uint8_t *bytes;
  size_t n;
  TT_OK(tpr_file_read(path, &bytes, &n));
  tally r = {0};
  char *save = NULL;
  int shown = 0;
  for (char *line = strtok_r((char *)bytes, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    cJSON *c = cJSON_Parse(line);
    assert_non_null(c);
    const char *text = cJSON_GetObjectItem(c, "t")->valuestring;
    const cJSON *want = cJSON_GetObjectItem(c, "ids"), *d = cJSON_GetObjectItem(c, "d");
    int32_t *ids;
    size_t nid;
    bool special = cJSON_IsNumber(cJSON_GetObjectItem(c, "s"));  // encoded with add_special_tokens=True
    TT_OK(tpr_tokenizer_encode(t, text, strlen(text), special, &ids, &nid));
    bool same = (size_t)cJSON_GetArraySize(want) == nid;
    for (size_t i = 0; same && i < nid; i++) same = cJSON_GetArrayItem(want, (int)i)->valueint == ids[i];
    r.cases++, r.ids += nid, r.id_bad += !same;
    if (!same && !quiet && shown++ < 3) print_message("%s: ids differ for \"%s\"\n", name, text);
    if (cJSON_IsString(d)) {  // decode the reference's ids, so a wrong encode does not count twice
      size_t nw = (size_t)cJSON_GetArraySize(want), i = 0;
      int32_t *w = malloc((nw + 1) * sizeof *w);
      const cJSON *e;
      cJSON_ArrayForEach(e, want) w[i++] = e->valueint;
      char *out;
      size_t ol;
      TT_OK(tpr_tokenizer_decode(t, w, nw, true, &out, &ol));  // the library skips specials by default
      bool ok = ol == strlen(d->valuestring) && !memcmp(out, d->valuestring, ol);
      r.decodes++, r.dec_bad += !ok;
      if (!ok && !quiet && shown++ < 3) print_message("%s: decode differs for \"%s\"\n", name, text);
      free(out), free(w);
    }
    free(ids);
    cJSON_Delete(c);
  }
  free(bytes);
  return r;
}

static void test_parity(void **s) {
  tally all = {0};
  for (size_t k = 0; k < sizeof CONFIGS / sizeof *CONFIGS; k++) {
    char path[512];
    snprintf(path, sizeof path, FIX "/%s.json", CONFIGS[k]);
    tpr_tokenizer *t;
    TT_OK(tpr_tokenizer_load(path, &t));
    tally r = run_cases(t, CONFIGS[k], false);
    print_message("%-22s %4zu strings %6zu ids: %zu id mismatches, %zu/%zu decode mismatches\n", CONFIGS[k], r.cases,
                  r.ids, r.id_bad, r.dec_bad, r.decodes);
    all.cases += r.cases, all.id_bad += r.id_bad, all.dec_bad += r.dec_bad, all.decodes += r.decodes;
    tpr_tokenizer_free(t);
  }
  print_message("all: %zu strings, %zu id mismatches, %zu decode mismatches\n", all.cases, all.id_bad, all.dec_bad);
  assert_int_equal(all.id_bad, 0);
  assert_int_equal(all.dec_bad, 0);
}

// ---- negative controls: a copy with one component dropped or two swapped
typedef void (*edit_fn)(cJSON *j);
static cJSON *steps(cJSON *j) { return cJSON_GetObjectItem(cJSON_GetObjectItem(j, "pre_tokenizer"), "pretokenizers"); }
static void drop_first(cJSON *j) { cJSON_DeleteItemFromArray(steps(j), 0); }
static void drop_last(cJSON *j) { cJSON_DeleteItemFromArray(steps(j), cJSON_GetArraySize(steps(j)) - 1); }
static void swap_first_two(cJSON *j) { cJSON_AddItemToArray(steps(j), cJSON_DetachItemFromArray(steps(j), 0)); }
static void drop_strip_accents(cJSON *j) {
  cJSON_DeleteItemFromArray(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "normalizer"), "normalizers"), 1);
}
static void digits_individual(cJSON *j) {
  cJSON_ReplaceItemInObject(cJSON_GetArrayItem(steps(j), 0), "individual_digits", cJSON_CreateTrue());
}
static void clear_added_flags(cJSON *j) {
  cJSON *a;
  const char *flags[] = {"single_word", "lstrip", "rstrip"};
  cJSON_ArrayForEach(a, cJSON_GetObjectItem(j, "added_tokens")) for (int k = 0; k < 3; k++)
      cJSON_ReplaceItemInObject(a, flags[k], cJSON_CreateFalse());
}
static void drop_normalizer(cJSON *j) { cJSON_ReplaceItemInObject(j, "normalizer", cJSON_CreateNull()); }
static void set(cJSON *j, const char *a, const char *b, cJSON *v) {
  cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, a), b, v);
}
static void bert_no_chinese(cJSON *j) { set(j, "normalizer", "handle_chinese_chars", cJSON_CreateFalse()); }
static void bert_no_lowercase(cJSON *j) { set(j, "normalizer", "lowercase", cJSON_CreateFalse()); }
static void bert_keep_accents(cJSON *j) { set(j, "normalizer", "strip_accents", cJSON_CreateFalse()); }
static void bert_no_clean(cJSON *j) { set(j, "normalizer", "clean_text", cJSON_CreateFalse()); }
static void wp_long_words(cJSON *j) { set(j, "model", "max_input_chars_per_word", cJSON_CreateNumber(100)); }
static void wp_hash_prefix(cJSON *j) { set(j, "model", "continuing_subword_prefix", cJSON_CreateString("##")); }
static void wp_no_cleanup(cJSON *j) { set(j, "decoder", "cleanup", cJSON_CreateFalse()); }
static void drop_first_norm(cJSON *j) {
  cJSON_DeleteItemFromArray(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "normalizer"), "normalizers"), 0);
}
static void decoder_prefix(cJSON *j) { set(j, "decoder", "prefix", cJSON_CreateString("@@")); }
static void no_suffix(cJSON *j) { set(j, "model", "end_of_word_suffix", cJSON_CreateNull()); }
static void decoder_suffix(cJSON *j) { set(j, "decoder", "suffix", cJSON_CreateString("w>")); }
static void no_byte_fallback(cJSON *j) { set(j, "model", "byte_fallback", cJSON_CreateFalse()); }
static void flat_scores(cJSON *j) {  // every piece equally likely: fewest pieces win
  cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "vocab"))
      cJSON_ReplaceItemInArray(e, 1, cJSON_CreateNumber(-1));
}
static void prepend_never(cJSON *j) { set(j, "pre_tokenizer", "prepend_scheme", cJSON_CreateString("never")); }
static void drop_post(cJSON *j) { cJSON_ReplaceItemInObject(j, "post_processor", cJSON_CreateNull()); }
static void punct_to_isolated(cJSON *j) {
  cJSON_ReplaceItemInObject(cJSON_GetArrayItem(steps(j), 0), "behavior", cJSON_CreateString("Isolated"));
}

// Writes j (deleted here) as a tokenizer.json in a fresh temporary folder,
// loads it, and removes the folder: the status of tpr_tokenizer_load.
static tpr_status load_edited(cJSON *j, tpr_tokenizer **t) {
  char dir[64] = "/tmp/tpr_tokc_XXXXXX", path[128];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  char *out = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  TT_OK(tpr_file_write(path, (const uint8_t *)out, strlen(out)));
  free(out);
  *t = NULL;
  tpr_status rc = tpr_tokenizer_load(path, t);
  unlink(path);
  rmdir(dir);
  return rc;
}

static void negative(const char *name, edit_fn edit, const char *what) {
  char path[512];
  snprintf(path, sizeof path, FIX "/%s.json", name);
  cJSON *j = read_json(path);
  edit(j);
  tpr_tokenizer *t;
  TT_OK(load_edited(j, &t));
  tally r = run_cases(t, name, true);
  print_message("negative control %s, %s: %zu of %zu strings mismatch, %zu decodes\n", name, what, r.id_bad, r.cases,
                r.dec_bad);
  if (r.id_bad + r.dec_bad == 0) fail_msg("%s with %s still matches: the test cannot see that component", name, what);
  tpr_tokenizer_free(t);
}

static void test_negative_controls(void **s) {
  negative("starcoder", drop_first, "Digits dropped");
  negative("digits_group", drop_first, "Digits dropped");
  negative("digits_group", digits_individual, "Digits individual_digits true");
  negative("falcon", drop_first, "Punctuation dropped");
  negative("falcon", drop_last, "the 3-digit Split dropped");
  negative("falcon", swap_first_two, "Punctuation moved after the rest");
  negative("bytelevel_first", drop_last, "Digits after ByteLevel dropped");
  negative("punct_prev", punct_to_isolated, "MergedWithPrevious -> Isolated");
  negative("whitespace", drop_strip_accents, "StripAccents dropped");
  negative("char_delim", drop_normalizer, "Strip dropped");
  negative("bert", drop_normalizer, "Lowercase dropped");
  negative("added_flags", clear_added_flags, "added tokens' single_word/lstrip/rstrip cleared");
  negative("wordpiece_bert", drop_normalizer, "BertNormalizer dropped");
  negative("wordpiece_bert", bert_no_chinese, "BertNormalizer handle_chinese_chars false");
  negative("wordpiece_bert", bert_no_lowercase, "BertNormalizer lowercase false");
  negative("wordpiece_bert", bert_keep_accents, "BertNormalizer strip_accents false (not following lowercase)");
  negative("wordpiece_bert", bert_no_clean, "BertNormalizer clean_text false");
  negative("wordpiece_bert", wp_no_cleanup, "WordPiece decoder cleanup false");
  negative("wordpiece_bert", drop_post, "BertProcessing dropped");
  negative("wordpiece_cased", drop_post, "TemplateProcessing dropped");
  negative("wordpiece_cased", wp_hash_prefix, "continuing_subword_prefix ## instead of @@");
  negative("wordpiece_cased", wp_long_words, "max_input_chars_per_word 100");
  negative("wordpiece_cased", bert_keep_accents, "BertNormalizer strip_accents false");
  negative("unigram_t5", flat_scores, "Unigram scores all equal");
  negative("unigram_t5", drop_normalizer, "NFKC dropped");
  negative("unigram_t5", prepend_never, "Metaspace prepend_scheme never");
  negative("unigram_t5", drop_post, "TemplateProcessing $A </s> dropped");
  negative("unigram_bytes", no_byte_fallback, "Unigram byte_fallback false");
  negative("unigram_precompiled", drop_first_norm, "Precompiled dropped");
  negative("unigram_nmt", drop_first_norm, "Nmt dropped");
  negative("wordlevel", drop_normalizer, "BertNormalizer dropped");
  negative("bpe_prefix", drop_post, "RobertaProcessing dropped");
  negative("bpe_prefix", decoder_prefix, "WordPiece decoder prefix @@");
  negative("bpe_suffix", no_suffix, "end_of_word_suffix dropped");
  negative("bpe_suffix", decoder_suffix, "BPEDecoder suffix w>");
  negative("bpe_suffix_bytelevel", no_suffix, "end_of_word_suffix dropped");
}

// UnicodeScripts without one of fixed_script()'s fixups: the fixtures must see it.
static void scripts_negative(const char *name, int ablate, const char *what) {
  char path[512];
  snprintf(path, sizeof path, FIX "/%s.json", name);
  tpr_tokenizer *t;
  TT_OK(tpr_tokenizer_load(path, &t));
  tok_scripts_ablate = ablate;
  tally r = run_cases(t, name, true);
  tok_scripts_ablate = 0;
  print_message("negative control %s, %s: %zu of %zu strings mismatch, %zu decodes\n", name, what, r.id_bad, r.cases,
                r.dec_bad);
  if (r.id_bad + r.dec_bad == 0) fail_msg("%s with %s still matches: the test cannot see that fixup", name, what);
  tpr_tokenizer_free(t);
}

static void test_scripts_negative_controls(void **s) {
  for (size_t k = 0; k < 5; k++) {
    const char *name = (const char *[]){"scripts_bpe", "scripts_bytelevel", "scripts_wordpiece", "scripts_unigram",
                                        "scripts_table"}[k];
    scripts_negative(name, TOK_SCRIPTS_NO_KANA_FIX, "Hiragana/Katakana/U+30FC not Han");
    // Whitespace after it drops the spaces either way; the table's texts have few.
    if (k != 2 && k != 4) scripts_negative(name, TOK_SCRIPTS_NO_SPACE_ANY, "' ' not Any");
  }
  scripts_negative("scripts_table", TOK_SCRIPTS_TABLE_OFF_BY_ONE, "the script table one code point off");
  negative("scripts_bytelevel", drop_first, "UnicodeScripts dropped");
  negative("scripts_wordpiece", drop_first, "UnicodeScripts dropped");
  negative("scripts_unigram", drop_first, "UnicodeScripts dropped");
}

// ---- 10,000 added tokens against a naive leftmost-longest search
static char rand_char(void) { return "ab<>_u1"[tt_randint(0, 6)]; }

static void test_many_added(void **s) {
  enum { N_ADDED = 10000, TEXT = 20000 };
  cJSON *j = read_json(FIX "/punct_isolated.json");
  cJSON *added = cJSON_GetObjectItem(j, "added_tokens");
  int32_t base = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "vocab")) if (v->valueint >= base) base =
      v->valueint + 1;
  // Short tokens over a 7-letter alphabet: many share prefixes and overlap,
  // so leftmost-longest is tested, not just found-or-not.
  char **tok = malloc(N_ADDED * sizeof *tok);
  size_t *tl = malloc(N_ADDED * sizeof *tl);
  for (int i = 0; i < N_ADDED; i++) {
    char buf[16];
    int len;
    do {
      len = (int)tt_randint(2, 9);
      for (int k = 0; k < len; k++) buf[k] = rand_char();
      buf[len] = 0;
      bool dup = false;
      for (int p = 0; p < i && !dup; p++) dup = !strcmp(tok[p], buf);
      if (!dup) break;
    } while (1);
    tok[i] = strdup(buf), tl[i] = (size_t)len;
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", base + i);
    cJSON_AddStringToObject(a, "content", buf);
    cJSON_AddBoolToObject(a, "special", false);
    cJSON_AddItemToArray(added, a);
  }
  tpr_tokenizer *t;
  TT_OK(load_edited(j, &t));
  char *text = malloc(TEXT + 1);
  for (int i = 0; i < TEXT; i++) text[i] = tt_randint(0, 9) == 0 ? ' ' : rand_char();
  text[TEXT] = 0;
  // The reference: at each position the longest token, else move on; the
  // text between tokens is encoded on its own (it holds no added token).
  int32_t *want = malloc(sizeof(int32_t) * (TEXT + 1));
  size_t nw = 0, gap = 0, n_tok = 0;
  for (size_t i = 0; i <= TEXT;) {
    int best = -1;
    size_t bl = 0;
    for (int k = 0; i < TEXT && k < N_ADDED; k++) {
      size_t l = tl[k];
      if (l > bl && i + l <= TEXT && !memcmp(text + i, tok[k], l)) best = k, bl = l;
    }
    if (best < 0 && i < TEXT) {
      i++;
      continue;
    }
    if (i > gap) {
      int32_t *g;
      size_t ng;
      TT_OK(tpr_tokenizer_encode(t, text + gap, i - gap, false, &g, &ng));
      memcpy(want + nw, g, ng * sizeof *g), nw += ng;
      free(g);
    }
    if (best < 0) break;
    want[nw++] = base + best, n_tok++;
    i += bl, gap = i;
  }
  int32_t *got;
  size_t ng;
  TT_OK(tpr_tokenizer_encode(t, text, TEXT, false, &got, &ng));
  print_message("%d added tokens, %d bytes of text: %zu added-token matches, %zu ids (reference %zu)\n", N_ADDED, TEXT,
                n_tok, ng, nw);
  assert_true(n_tok > 1000);
  assert_int_equal(ng, nw);
  assert_memory_equal(got, want, nw * sizeof *got);
  free(got), free(want), free(text);
  for (int i = 0; i < N_ADDED; i++) free(tok[i]);
  free(tok), free(tl);
  tpr_tokenizer_free(t);
}

// Components still outside tpr fail by name.
static void test_refused(void **s) {
  const char *cases[][3] = {
      {"pre_tokenizer", "{\"type\":\"NoSuchPreTokenizer\"}",
       "pre_tokenizer type 'NoSuchPreTokenizer' is not supported"},
      {"normalizer", "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Sequence\",\"normalizers\":[]}]}",
       "a nested normalizer Sequence is not supported"},
      {"post_processor",
       "{\"type\":\"TemplateProcessing\",\"single\":[{\"Sequence\":{\"id\":\"A\"}},{\"Sequence\":{\"id\":\"A\"}}]}",
       "TemplateProcessing with $A twice"},
      {"decoder", "{\"type\":\"CTC\"}", "decoder type 'CTC' is not supported"},
      {"model", "{\"type\":\"NoSuchModel\",\"vocab\":{}}", "model type 'NoSuchModel' is not supported"},
      {"model", "{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{},\"merges\":[]}", "model BPE dropout is not supported"},
      {"pre_tokenizer", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Metaspace\"},{\"type\":\"ByteLevel\"}]}",
       "Metaspace together with ByteLevel"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    cJSON *j = read_json(FIX "/bert.json");
    cJSON_ReplaceItemInObject(j, cases[k][0], cJSON_Parse(cases[k][1]));
    tpr_tokenizer *t = NULL;
    assert_int_not_equal(load_edited(j, &t), TPR_OK);
    assert_null(t);
    print_message("refused: %s\n", tpr_last_error());
    if (!strstr(tpr_last_error(), cases[k][2])) fail_msg("expected '%s' in '%s'", cases[k][2], tpr_last_error());
  }
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parity),
      cmocka_unit_test(test_negative_controls),
      cmocka_unit_test(test_scripts_negative_controls),
      cmocka_unit_test(test_many_added),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
