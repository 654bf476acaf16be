// engine/token_constraint.c: the trie-walk token mask is bit-identical to
// the per-token reference (the mask as it was first written: each id's
// bytes fed to its own copy of the state, after a filter on the first byte)
// at every step of random walks under the mask, and how much faster it is.
//   - the demo model's tokenizer (4096 ids), json_object and a schema;
//   - a synthetic vocabulary of 150,000 byte strings (JSON-ish bytes, BPE-like
//     lengths, duplicates and ids without bytes), to show the scaling;
//   - the negative control: a mask with one bit flipped is told apart (the
//     comparison can fail), and the allowed count is the bits set.
// Times are a report, never a bound (a shared machine).
#include "test_util.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/json_grammar.h"
#include "engine/token_constraint.h"

static double tt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// A copy of the frames in use and the one above (the frame popped last,
// which an object reads after a literal value); no frame above is read.
static void copy_used(tpr_json_state *t, const tpr_json_state *s) {
  const int32_t n = s->depth < TPR_JSON_MAX_DEPTH ? s->depth + 1 : s->depth;
  memcpy(t, s, offsetof(tpr_json_state, f) + (size_t)n * sizeof s->f[0]);
}

// The reference: the mask of the state s as token_constraint.c computed it
// before the trie (each id's bytes fed to its own copy of the state after a
// filter on the first byte), with the copy carrying the frame above the
// top, which the first version dropped (a forced call could then follow the
// wrong function's schema: test_selector_boundary).
static int64_t ref_mask(const tpr_vocab_bytes *v, const tpr_json_state *s, int32_t stop, uint64_t *allow) {
  const int64_t V = tpr_vocab_bytes_size(v);
  memset(allow, 0, (size_t)tpr_mask_words(V) * sizeof *allow);
  int64_t count = 0;
  if (!s->dead) {
    bool first_ok[256];
    tpr_json_state t;
    for (int b = 0; b < 256; b++) {
      copy_used(&t, s);
      char ch = (char)b;
      first_ok[b] = tpr_json_state_feed(&t, &ch, 1);
    }
    for (int64_t id = 0; id < V; id++) {
      size_t len = 0;
      const char *bytes = tpr_vocab_bytes_token(v, id, &len);
      if (!len || !first_ok[(unsigned char)bytes[0]]) continue;
      copy_used(&t, s);
      if (tpr_json_state_feed(&t, bytes, len)) allow[id / 64] |= 1ull << (id % 64), count++;
    }
  }
  if (stop >= 0 && stop < V && (count == 0 || tpr_json_state_complete(s)) && !(allow[stop / 64] >> (stop % 64) & 1))
    allow[stop / 64] |= 1ull << (stop % 64), count++;
  return count;
}

static int64_t popcount(const uint64_t *m, int64_t words) {
  int64_t n = 0;
  for (int64_t i = 0; i < words; i++) n += __builtin_popcountll(m[i]);
  return n;
}

// The k-th allowed id (k < count).
static int32_t nth_allowed(const uint64_t *m, int64_t words, int64_t k) {
  for (int64_t i = 0; i < words; i++) {
    const int c = __builtin_popcountll(m[i]);
    if (k >= c) {
      k -= c;
      continue;
    }
    uint64_t w = m[i];
    for (; k > 0; k--) w &= w - 1;
    return (int32_t)(i * 64 + __builtin_ctzll(w));
  }
  return -1;
}

typedef struct walk_stats {
  int64_t masks, steps_dead;
  double new_s, walk_s, ref_s;  // the mask (cache, else walk), a walk alone, the reference
} walk_stats;

// Random walks under the mask (the stop token with probability 1/4 when
// allowed); at each step the trie mask must equal the reference's.
static void walks(const tpr_vocab_bytes *v, const tpr_json_grammar *const *grammars, int n_grammars, int32_t stop,
                  int n_walks, int max_len, walk_stats *st) {
  const int64_t V = tpr_vocab_bytes_size(v), W = tpr_mask_words(V);
  uint64_t *a = malloc((size_t)W * sizeof *a), *b = malloc((size_t)(2 * W) * sizeof *b);
  int32_t *gen = malloc((size_t)max_len * sizeof *gen);
  assert_non_null(a), assert_non_null(b), assert_non_null(gen);
  for (int w = 0; w < n_walks; w++) {
    tpr_token_constraint c;
    tpr_token_constraint_init(&c, grammars[w % n_grammars], v, stop);
    int64_t n = 0;
    for (;;) {
      double t0 = tt_now();
      const int64_t count = tpr_token_constraint_mask(&c, gen, n, a);
      double t1 = tt_now();
      const int64_t want = ref_mask(v, &c.state, stop, b);
      st->ref_s += tt_now() - t1, st->new_s += t1 - t0, st->masks++;
      // The trie walk alone: a fresh constraint (no cache) brought to the same state first.
      tpr_token_constraint cold;
      tpr_token_constraint_init(&cold, c.grammar, v, stop);
      tpr_token_constraint_advance(&cold, gen, n);
      double t2 = tt_now();
      const int64_t cold_count = tpr_token_constraint_mask(&cold, gen, n, b + W);
      st->walk_s += tt_now() - t2;
      tpr_token_constraint_free(&cold);
      assert_int_equal(cold_count, want);
      assert_memory_equal(b + W, b, (size_t)W * sizeof *b);
      if (count != want || memcmp(a, b, (size_t)W * sizeof *a)) {
        for (int64_t id = 0; id < V; id++)
          if ((a[id / 64] ^ b[id / 64]) >> (id % 64) & 1) {
            size_t len = 0;
            const char *t = tpr_vocab_bytes_token(v, id, &len);
            fail_msg("walk %d step %lld: id %lld [%.*s] trie %d reference %d (counts %lld, %lld)", w, (long long)n,
                     (long long)id, (int)len, t, (int)(a[id / 64] >> (id % 64) & 1), (int)(b[id / 64] >> (id % 64) & 1),
                     (long long)count, (long long)want);
          }
        fail_msg("walk %d step %lld: counts %lld (trie) and %lld (reference) with the same bits", w, (long long)n,
                 (long long)count, (long long)want);
      }
      assert_int_equal(popcount(a, W), count);
      if (n == max_len) break;
      const bool stop_ok = stop >= 0 && (a[stop / 64] >> (stop % 64) & 1);
      if (stop_ok && (count == 1 || tt_randint(0, 3) == 0)) break;
      int32_t pick;
      do pick = nth_allowed(a, W, tt_randint(0, count - 1));
      while (pick == stop);
      gen[n++] = pick;
    }
    tpr_token_constraint_free(&c);
  }
  free(a), free(b), free(gen);
}

static void report(const char *what, int64_t V, int64_t nodes, const walk_stats *st) {
  const double m = (double)st->masks;
  printf("%s: %lld ids, %lld trie nodes; %lld masks: per-token reference %.1f us, trie walk %.1f us (%.1fx), "
         "walk or cached mask %.1f us (%.1fx) (a report, not a bound)\n",
         what, (long long)V, (long long)nodes, (long long)st->masks, 1e6 * st->ref_s / m, 1e6 * st->walk_s / m,
         st->ref_s / st->walk_s, 1e6 * st->new_s / m, st->ref_s / st->new_s);
}

static const char *schema_text =
    "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"},\"s\":{\"type\":\"string\",\"maxLength\":6},"
    "\"e\":{\"enum\":[\"red\",\"green\",1.5,null]},\"l\":{\"type\":\"array\",\"items\":{\"type\":\"number\"},"
    "\"maxItems\":3},\"m\":{\"type\":\"string\",\"minLength\":2},\"k\":{\"type\":\"array\",\"items\":{\"type\":"
    "\"integer\"},\"minItems\":2}},\"required\":[\"n\",\"l\"]}";

static void test_demo_vocab(void **state) {
  (void)state;
  tpr_tokenizer *tok = NULL;
  assert_int_equal(tpr_tokenizer_load(TPR_FIXTURES "/demo_model", &tok), TPR_OK);
  const int64_t V = tpr_tokenizer_vocab_size(tok);
  tpr_vocab_bytes *vb = NULL;
  assert_int_equal(tpr_vocab_bytes_new(tok, V, &vb), TPR_OK);
  cJSON *schema = cJSON_Parse(schema_text);
  char err[256];
  // A forced call of one of two functions: which arguments' schema applies
  // depends on the name (a selector literal, read by its object just after).
  cJSON *p0 = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"enum\":[true,"
                          "\"x\"]}},\"required\":[\"a\",\"b\"]}"),
        *p1 = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\",\"maxLength\":3}},"
                          "\"required\":[\"text\"]}");
  const char *names[2] = {"add", "adder"};
  const cJSON *params[2] = {p0, p1};
  const tpr_json_grammar *g[4] = {
      tpr_json_grammar_new(NULL, NULL, NULL, err, sizeof err), tpr_json_grammar_new(schema, NULL, NULL, err, sizeof err),
      tpr_json_grammar_new(NULL, "<tool_call>\n", "\n</tool_call>", err, sizeof err),
      tpr_json_grammar_new_call(2, names, params, "name", "arguments", "<tool_call>\n", "\n</tool_call>", err, sizeof err)};
  for (int i = 0; i < 4; i++) assert_non_null(g[i]);
  walk_stats st = {0};
  walks(vb, g, 4, tpr_tokenizer_eos_id(tok), 60, 300, &st);
  report("demo tokenizer", V, tpr_vocab_bytes_trie_nodes(vb), &st);
  for (int i = 0; i < 4; i++) tpr_json_grammar_free((tpr_json_grammar *)g[i]);
  cJSON_Delete(schema), cJSON_Delete(p0), cJSON_Delete(p1);
  tpr_vocab_bytes_free(vb);
  tpr_tokenizer_free(tok);
}

// 150,000 synthetic tokens: JSON-ish bytes (letters most, then digits,
// spaces, punctuation, quotes, escapes, UTF-8 and control bytes) of 1 to 16
// bytes, a space-led word half the time as BPE has; id 0 has no bytes (the
// stop token), 1 in 500 ids none either, 1 in 200 a copy of an earlier id.
static void test_synthetic_vocab(void **state) {
  (void)state;
  const int64_t V = 150000;
  static const char alpha[] = "etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLU0123456789     \n\t{}[]:,\"\"\\-+.eE_/";
  char **bytes = calloc((size_t)V, sizeof *bytes);
  size_t *lens = calloc((size_t)V, sizeof *lens);
  assert_non_null(bytes), assert_non_null(lens);
  for (int64_t id = 1; id < V; id++) {
    if (tt_randint(0, 499) == 0) continue;
    if (id > 1 && tt_randint(0, 199) == 0) {
      const int64_t from = tt_randint(1, id - 1);
      if (!bytes[from]) continue;
      bytes[id] = malloc(lens[from]), lens[id] = lens[from];
      memcpy(bytes[id], bytes[from], lens[from]);
      continue;
    }
    const size_t len = (size_t)(tt_randint(0, 3) ? tt_randint(1, 8) : tt_randint(1, 16));
    bytes[id] = malloc(len), lens[id] = len;
    for (size_t k = 0; k < len; k++) {
      const int64_t r = tt_randint(0, 99);
      bytes[id][k] = r < 97 ? alpha[tt_randint(0, (int64_t)sizeof alpha - 2)] : (char)tt_randint(0, 255);
    }
    if (len > 1 && tt_randint(0, 1)) bytes[id][0] = ' ';
  }
  tpr_vocab_bytes *vb = NULL;
  assert_int_equal(tpr_vocab_bytes_from(V, (const char *const *)bytes, lens, &vb), TPR_OK);
  for (int64_t id = 0; id < V; id++) {  // the bytes kept are the ones given
    size_t len = 0;
    const char *t = tpr_vocab_bytes_token(vb, id, &len);
    assert_int_equal(len, lens[id]);
    if (len) assert_memory_equal(t, bytes[id], len);
    free(bytes[id]);
  }
  free(bytes), free(lens);
  cJSON *schema = cJSON_Parse(schema_text);
  char err[256];
  const tpr_json_grammar *g[2] = {tpr_json_grammar_new(NULL, NULL, NULL, err, sizeof err),
                                  tpr_json_grammar_new(schema, NULL, NULL, err, sizeof err)};
  assert_non_null(g[0]), assert_non_null(g[1]);
  walk_stats st = {0};
  walks(vb, g, 2, 0, 8, 60, &st);
  report("synthetic vocabulary", V, tpr_vocab_bytes_trie_nodes(vb), &st);
  tpr_json_grammar_free((tpr_json_grammar *)g[0]), tpr_json_grammar_free((tpr_json_grammar *)g[1]);
  cJSON_Delete(schema);
  tpr_vocab_bytes_free(vb);
}

// The control: a one-bit difference is seen by the comparison the walks
// make, and a vocabulary whose tokens all share one long prefix (a deep
// chain, branching only at its end) still gives the reference's mask.
static void test_control_and_edges(void **state) {
  (void)state;
  const int64_t V = 130;
  char *bytes[130] = {0};
  size_t lens[130] = {0};
  char buf[130][40];
  for (int64_t id = 1; id < V; id++) {
    const size_t len = (size_t)tt_randint(1, 39);
    for (size_t k = 0; k < len; k++) buf[id][k] = k < len - 1 ? ' ' : (char)tt_randint(0x20, 0x7e);
    if (id % 3 == 0) buf[id][0] = '{';
    bytes[id] = buf[id], lens[id] = len;
  }
  tpr_vocab_bytes *vb = NULL;
  assert_int_equal(tpr_vocab_bytes_from(V, (const char *const *)bytes, lens, &vb), TPR_OK);
  char err[256];
  tpr_json_grammar *g = tpr_json_grammar_new(NULL, NULL, NULL, err, sizeof err);
  uint64_t a[3], b[3];
  tpr_token_constraint c;
  tpr_token_constraint_init(&c, g, vb, 0);
  int32_t gen[1] = {3};  // "{" then spaces and a byte, or a byte alone
  for (int n = 0; n < 2; n++) {
    const int64_t count = tpr_token_constraint_mask(&c, gen, n, a);
    assert_int_equal(count, ref_mask(vb, &c.state, 0, b));
    assert_memory_equal(a, b, sizeof a);
    b[1] ^= 1ull << 5;
    assert_memory_not_equal(a, b, sizeof a);
  }
  tpr_token_constraint_free(&c);
  tpr_json_grammar_free(g);
  tpr_vocab_bytes_free(vb);
}

// A forced call's arguments follow the schema of the function named: the
// object reads which name literal ended from the frame just popped (above
// the stack's top), so a mask's copy of the state must carry that frame.
// Token boundaries right after the name's closing quote.
static void test_selector_boundary(void **state) {
  (void)state;
  const char *toks[5] = {NULL, "<tool_call>\n{\"name\": \"adder\"", ", \"arguments\": {\"text\"",
                         ", \"arguments\": {\"a\"", "<tool_call>\n{\"name\": \"add\""};
  size_t lens[5] = {0};
  for (int i = 1; i < 5; i++) lens[i] = strlen(toks[i]);
  tpr_vocab_bytes *vb = NULL;
  assert_int_equal(tpr_vocab_bytes_from(5, toks, lens, &vb), TPR_OK);
  cJSON *p0 = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}"),
        *p1 = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\"}},\"required\":[\"text\"]}");
  const char *names[2] = {"add", "adder"};
  const cJSON *params[2] = {p0, p1};
  char err[256];
  tpr_json_grammar *g =
      tpr_json_grammar_new_call(2, names, params, "name", "arguments", "<tool_call>\n", "\n</tool_call>", err, sizeof err);
  assert_non_null(g);
  for (int k = 0; k < 20; k++) {  // again and again: a stale frame from an earlier mask must not matter
    const int32_t gen[1] = {k % 2 ? 4 : 1};
    tpr_token_constraint c;
    tpr_token_constraint_init(&c, g, vb, 0);
    uint64_t a[1], b[1];
    const int64_t count = tpr_token_constraint_mask(&c, gen, 1, a);  // first: it feeds gen to c.state
    assert_int_equal(count, ref_mask(vb, &c.state, 0, b));
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(a[0], k % 2 ? 1ull << 3 : 1ull << 2);  // "add": its "a"; "adder": its "text"
    tpr_token_constraint_free(&c);
  }
  tpr_json_grammar_free(g);
  cJSON_Delete(p0), cJSON_Delete(p1);
  tpr_vocab_bytes_free(vb);
}

static bool same_key(const tpr_json_grammar *g, const char *x, const char *y) {
  tpr_json_state a, b;
  tpr_json_state_init(&a, g), tpr_json_state_init(&b, g);
  assert_true(tpr_json_state_feed(&a, x, strlen(x)));
  assert_true(tpr_json_state_feed(&b, y, strlen(y)));
  uint64_t ka[TPR_JSON_KEY_WORDS], kb[TPR_JSON_KEY_WORDS];
  const int na = tpr_json_state_key(&a, ka), nb = tpr_json_state_key(&b, kb);
  return na == nb && !memcmp(ka, kb, (size_t)na * sizeof ka[0]);
}

// The key the mask cache goes by: a string's count is told apart below its
// minLength and up to its maxLength, not beyond a minLength with no maximum
// (nor in a string with no bounds); an array's likewise.
static void test_state_key(void **state) {
  (void)state;
  cJSON *schema = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"m\":{\"type\":\"string\",\"minLength\":2},"
                              "\"x\":{\"type\":\"string\",\"maxLength\":4},\"k\":{\"type\":\"array\",\"minItems\":2},"
                              "\"f\":{}}}");
  char err[256];
  tpr_json_grammar *g = tpr_json_grammar_new(schema, NULL, NULL, err, sizeof err);
  assert_non_null(g);
  assert_false(same_key(g, "{\"m\": \"", "{\"m\": \"a"));
  assert_false(same_key(g, "{\"m\": \"a", "{\"m\": \"ab"));
  assert_true(same_key(g, "{\"m\": \"ab", "{\"m\": \"abcdef"));
  assert_false(same_key(g, "{\"x\": \"abc", "{\"x\": \"abcd"));
  assert_false(same_key(g, "{\"k\": [1, 2", "{\"k\": [1"));
  assert_true(same_key(g, "{\"k\": [1, 2", "{\"k\": [1, 2, 3, 4"));
  assert_true(same_key(g, "{\"f\": \"a", "{\"f\": \"abcdef"));
  assert_false(same_key(g, "{\"f\": \"a", "{\"f\": \"a\\"));
  assert_false(same_key(g, "{\"f\": 1", "{\"f\": 12"));  // a number counts its bytes (at most TPR_JSON_MAX_NUMBER)
  tpr_json_grammar_free(g);
  cJSON_Delete(schema);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_control_and_edges),
      cmocka_unit_test(test_selector_boundary),
      cmocka_unit_test(test_state_key),
      cmocka_unit_test(test_demo_vocab),
      cmocka_unit_test(test_synthetic_vocab),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
