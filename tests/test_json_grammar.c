// engine/json_grammar.c and engine/token_constraint.c: the JSON automaton
// against cJSON on random texts, schema cases, the tool-call grammar, and
// the token masks over the demo model's tokenizer.
//   - random JSON objects written with the whitespace the grammar allows are
//     accepted, complete exactly at their end and at no proper prefix; one
//     byte inserted, deleted or replaced gives a text the automaton accepts
//     iff cJSON parses it as an object and a scan of its whitespace and
//     numbers says it is within the limits (an independent reference);
//   - schemas: accepted and refused texts, one per rule (lone UTF-16
//     surrogate escapes refused, pairs one character), and the keywords
//     that are refused when compiling;
//   - masks: random walks through the demo tokenizer's vocabulary under the
//     mask end in text cJSON parses (and that validates); every allowed token
//     feeds, sampled refused tokens do not; the stop token only when
//     complete. The control: random walks without the mask do not parse.
#include "test_util.h"

#include <cjson/cJSON.h>
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

static bool accepts(const tpr_json_grammar *g, const char *text, size_t n) {
  tpr_json_state s;
  tpr_json_state_init(&s, g);
  return tpr_json_state_feed(&s, text, n) && tpr_json_state_complete(&s);
}

// ---- random JSON with the grammar's whitespace

typedef struct buf {
  char *s;
  size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    b->cap = (b->n + n + 1) * 2;
    b->s = realloc(b->s, b->cap);
  }
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = 0;
}
static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

static void ws(buf *b) {
  switch (tt_randint(0, 3)) {
    case 0: break;
    case 1: puts_(b, " "); break;
    default: {
      puts_(b, "\n");
      for (int64_t i = tt_randint(0, 6); i > 0; i--) puts_(b, tt_randint(0, 4) ? " " : "\t");
    }
  }
}

static void rand_string(buf *b) {
  static const char *const parts[] = {"a", "Z", " ", "\\\"", "\\\\", "\\n", "\\u00e9", "é", "日本", "🙂", "{", "]", ":", ","};
  puts_(b, "\"");
  for (int i = tt_randint(0, 6); i > 0; i--) puts_(b, parts[tt_randint(0, (int)(sizeof parts / sizeof parts[0]) - 1)]);
  puts_(b, "\"");
}

static void rand_value(buf *b, int depth) {
  int k = tt_randint(0, depth > 3 ? 4 : 6);
  char num[64];
  switch (k) {
    case 0: rand_string(b); break;
    case 1:
      snprintf(num, sizeof num, "%s%d%s%s", tt_randint(0, 1) ? "-" : "", (int)tt_randint(0, 100000),
               tt_randint(0, 1) ? ".25" : "", tt_randint(0, 3) == 0 ? "e-7" : "");
      puts_(b, num);
      break;
    case 2: puts_(b, "true"); break;
    case 3: puts_(b, "false"); break;
    case 4: puts_(b, "null"); break;
    case 5: {
      puts_(b, "[");
      int n = tt_randint(0, 3);
      for (int i = 0; i < n; i++) {
        if (i) puts_(b, ","), ws(b);
        rand_value(b, depth + 1);
      }
      puts_(b, "]");
      break;
    }
    default: {
      puts_(b, "{");
      int n = tt_randint(0, 3);
      for (int i = 0; i < n; i++) {
        if (i) puts_(b, ",");
        ws(b), rand_string(b), ws(b), puts_(b, ":"), ws(b), rand_value(b, depth + 1), ws(b);
      }
      puts_(b, "}");
    }
  }
}

// The reference's view of the limits: outside strings, every whitespace run
// is "", " " or "\n" + up to MAX_WS spaces/tabs, nothing leads or trails,
// numbers are at most MAX_NUMBER bytes, and nesting is at most MAX_DEPTH - 1.
static bool within_limits(const char *s, size_t n) {
  bool in_str = false;
  int depth = 0;
  if (n && (s[0] == ' ' || s[0] == '\n' || s[0] == '\t' || s[0] == '\r')) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (in_str) {
      if (c == '\\') i++;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '{' || c == '[') depth++;
    else if (c == '}' || c == ']') depth--;
    if (depth >= TPR_JSON_MAX_DEPTH) return false;
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      size_t j = i;
      while (j < n && (s[j] == ' ' || s[j] == '\n' || s[j] == '\t' || s[j] == '\r')) j++;
      if (j == n) return false;  // trailing
      bool ok = (j - i == 1 && c == ' ') ||
                (c == '\n' && j - i - 1 <= TPR_JSON_MAX_WS && !memchr(s + i + 1, '\n', j - i - 1) &&
                 !memchr(s + i + 1, '\r', j - i - 1));
      if (!ok) return false;
      i = j - 1;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t j = i;
      while (j < n && strchr("-+.eE0123456789", s[j])) j++;
      if (j - i > TPR_JSON_MAX_NUMBER) return false;
      i = j - 1;
    }
  }
  return true;
}

static bool cjson_object(const char *s, size_t n) {
  // (s[n] is NUL: cJSON wants the terminator inside the length to check that nothing follows the value)
  cJSON *j = cJSON_ParseWithLengthOpts(s, n + 1, NULL, true);
  bool ok = j && cJSON_IsObject(j);
  // cJSON accepts what JSON does not: leading zeros, "1." ... Python's json (the
  // reference elsewhere) refuses them, so does the grammar: check numbers here.
  cJSON_Delete(j);
  if (!ok) return false;
  bool in_str = false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (in_str) {
      if (c == '\\') i++;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if ((c == '-' || (c >= '0' && c <= '9')) && (i == 0 || !strchr("0123456789.eE+-", s[i - 1]))) {
      size_t j = i + (c == '-');
      if (j < n && s[j] == '0' && j + 1 < n && s[j + 1] >= '0' && s[j + 1] <= '9') return false;  // leading zero
      while (j < n && s[j] >= '0' && s[j] <= '9') j++;
      if (j < n && s[j] == '.' && (j + 1 >= n || s[j + 1] < '0' || s[j + 1] > '9')) return false;  // "1."
    }
  }
  // Inside strings JSON refuses control characters and escapes other than
  // \" \\ \/ \b \f \n \r \t \uXXXX (cJSON is lenient with \u).
  in_str = false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (in_str && c < 0x20) return false;
    if (in_str && c == '\\') {
      if (i + 1 >= n || !strchr("\"\\/bfnrtu", s[i + 1]) || !s[i + 1]) return false;
      if (s[i + 1] == 'u')
        for (size_t k = i + 2; k < i + 6; k++)
          if (k >= n || !strchr("0123456789abcdefABCDEF", s[k]) || !s[k]) return false;
      i++;
    } else if (c == '"') {
      in_str = !in_str;
    }
  }
  return true;
}

static void test_random_texts(void **state) {
  (void)state;
  char err[256];
  tpr_json_grammar *g = tpr_json_grammar_new(NULL, NULL, NULL, err, sizeof err);
  assert_non_null(g);
  int valid = 0, mutants = 0, mutants_accepted = 0, agree = 0;
  for (int t = 0; t < 1500; t++) {
    buf b = {0};
    puts_(&b, "{");
    int n = tt_randint(0, 3);
    for (int i = 0; i < n; i++) {
      if (i) puts_(&b, ",");
      ws(&b), rand_string(&b), ws(&b), puts_(&b, ":"), ws(&b), rand_value(&b, 1), ws(&b);
    }
    puts_(&b, "}");
    // The text and each of its proper prefixes.
    if (!cjson_object(b.s, b.n)) fail_msg("the generator wrote what cJSON refuses: %s",
                                          cJSON_PrintUnformatted(cJSON_CreateString(b.s)));
    tpr_json_state s;
    tpr_json_state_init(&s, g);
    for (size_t i = 0; i < b.n; i++) {
      if (!tpr_json_state_feed(&s, b.s + i, 1)) fail_msg("valid text refused at byte %zu: %s", i, b.s);
      if (i + 1 < b.n && tpr_json_state_complete(&s)) fail_msg("complete at byte %zu of %s", i, b.s);
    }
    if (!tpr_json_state_complete(&s)) fail_msg("not complete at the end: %s", b.s);
    valid++;
    // One mutation: insert, delete or replace a byte.
    static const char alphabet[] = "{}[],:\" \n\t-0123456789.eEtrufalsn\\x";
    size_t at = (size_t)tt_randint(0, (int)b.n - 1);
    char ch = alphabet[tt_randint(0, (int)sizeof alphabet - 2)];
    char *m = calloc(b.n + 3, 1);
    size_t mn = 0;
    int op = tt_randint(0, 2);
    if (op == 0) memcpy(m, b.s, at), m[at] = ch, memcpy(m + at + 1, b.s + at, b.n - at), mn = b.n + 1;
    else if (op == 1) memcpy(m, b.s, at), memcpy(m + at, b.s + at + 1, b.n - at - 1), mn = b.n - 1;
    else memcpy(m, b.s, b.n), m[at] = ch, mn = b.n;
    bool want = cjson_object(m, mn) && within_limits(m, mn);
    bool got = accepts(g, m, mn);
    mutants++, mutants_accepted += got, agree += got == want;
    if (got != want) {
      cJSON *esc = cJSON_CreateString(m);  // printed as a JSON string: newlines visible
      char *p = cJSON_PrintUnformatted(esc);
      fail_msg("mutant %s: automaton %d, reference %d", p, got, want);
    }
    free(m);
    free(b.s);
  }
  printf("%d random objects accepted (and no proper prefix complete); %d mutants, %d accepted, all as the "
         "reference\n", valid, mutants, mutants_accepted);
  assert_true(mutants_accepted > 50 && mutants_accepted < mutants - 50);  // both outcomes exercised
  tpr_json_grammar_free(g);
}

static void test_schemas(void **state) {
  (void)state;
  static const struct {
    const char *schema, *text;
    bool ok;
  } cases[] = {
      {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":3}},"
       "\"required\":[\"b\"]}", "{\"a\": 1, \"b\": \"xyz\"}", true},
      {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":3}},"
       "\"required\":[\"b\"]}", "{\"b\": \"x\"}", true},
      {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":3}},"
       "\"required\":[\"b\"]}", "{\"a\": 1}", false},  // required b missing
      {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":3}},"
       "\"required\":[\"b\"]}", "{\"b\": \"wxyz\"}", false},  // maxLength
      {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}}}",
       "{\"b\": \"x\", \"a\": 1}", false},  // the schema's order
      {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}", "{\"c\": 1}", false},  // no other keys
      {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}", "{\"a\": 1.5}", false},
      {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}", "{}", true},
      {"{\"type\":\"string\",\"minLength\":2}", "\"é\"", false},
      {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":2}", "\"é\\n\"", true},  // code points; an escape is one
      {"{\"type\":\"array\",\"items\":{\"enum\":[\"x\",2,null]},\"minItems\":1,\"maxItems\":2}", "[2, null]", true},
      {"{\"type\":\"array\",\"items\":{\"enum\":[\"x\",2,null]},\"minItems\":1,\"maxItems\":2}", "[]", false},
      {"{\"type\":\"array\",\"items\":{\"enum\":[\"x\",2,null]},\"minItems\":1,\"maxItems\":2}", "[3]", false},
      {"{\"type\":[\"number\",\"boolean\"]}", "false", true},
      {"{\"type\":[\"number\",\"boolean\"]}", "\"1\"", false},
      {"{\"const\":{\"k\":[1]}}", "{\"k\":[1]}", true},  // const: the compact text
      {"{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}},"
       "\"required\":[\"x\"]}},\"required\":[\"p\"]}", "{\"p\": {\"x\": -2e3}}", true},
      {"{}", "[{\"any\": true}]", true},
      // \u escapes: a surrogate pair is one character; a lone half is refused
      // (cJSON and serde_json refuse it, so output holding one would not parse).
      {"{\"type\":\"string\",\"maxLength\":1}", "\"\\ud83d\\ude00\"", true},
      {"{\"type\":\"string\"}", "\"\\uDBFF\\uDFFFx\\u00e9\"", true},
      {"{\"type\":\"string\"}", "\"\\udeea\"", false},         // a low half alone
      {"{\"type\":\"string\"}", "\"\\ud83d\"", false},         // a high half, then the end
      {"{\"type\":\"string\"}", "\"\\ud83dx\"", false},        // then a character
      {"{\"type\":\"string\"}", "\"\\ud83d\\n\"", false},     // then another escape
      {"{\"type\":\"string\"}", "\"\\ud83d\\u0041\"", false},  // then a non-surrogate \u
      {"{\"type\":\"string\"}", "\"\\ud83d\\ud83d\"", false},  // then another high half
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char err[256];
    cJSON *s = cJSON_Parse(cases[i].schema);
    tpr_json_grammar *g = tpr_json_grammar_new(s, NULL, NULL, err, sizeof err);
    if (!g) fail_msg("%s: %s", cases[i].schema, err);
    if (accepts(g, cases[i].text, strlen(cases[i].text)) != cases[i].ok)
      fail_msg("%s on %s: want %d", cases[i].schema, cases[i].text, cases[i].ok);
    tpr_json_grammar_free(g);
    cJSON_Delete(s);
  }
  static const char *const refused[] = {"{\"type\":\"string\",\"pattern\":\"a\"}", "{\"$ref\":\"#/x\"}",
                                        "{\"anyOf\":[{}]}", "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":true}",
                                        "{\"type\":\"color\"}", "{\"type\":\"object\",\"properties\":{},\"required\":[\"z\"]}",
                                        "{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}"};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    char err[256] = "";
    cJSON *s = cJSON_Parse(refused[i]);
    tpr_json_grammar *g = tpr_json_grammar_new(s, NULL, NULL, err, sizeof err);
    if (g) fail_msg("%s compiled", refused[i]);
    assert_true(err[0] != 0);
    cJSON_Delete(s);
  }
  printf("%zu schema cases, %zu refusals\n", sizeof cases / sizeof cases[0], sizeof refused / sizeof refused[0]);
}

// A tool call among two functions: the arguments follow the named one's schema.
static void test_call_grammar(void **state) {
  (void)state;
  const char *names[] = {"get_weather", "add"};
  cJSON *p0 = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}");
  cJSON *p1 = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},"
                          "\"required\":[\"a\",\"b\"]}");
  const cJSON *params[] = {p0, p1};
  char err[256];
  tpr_json_grammar *g = tpr_json_grammar_new_call(2, names, params, "name", "arguments", "<tool_call>\n",
                                                  "\n</tool_call>", err, sizeof err);
  assert_non_null(g);
  static const struct {
    const char *text;
    bool ok;
  } cases[] = {
      {"<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>", true},
      {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>", true},
      {"<tool_call>\n{\"name\": \"add\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>", false},  // other's args
      {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>", false},
      {"<tool_call>\n{\"name\": \"sub\", \"arguments\": {}}\n</tool_call>", false},
      {"<tool_call>\n{\"arguments\": {}, \"name\": \"add\"}\n</tool_call>", false},
      {"{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}", false},  // the tags are part of it
      {"<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call> ", false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (accepts(g, cases[i].text, strlen(cases[i].text)) != cases[i].ok) fail_msg("%s: want %d", cases[i].text, cases[i].ok);
  tpr_json_grammar_free(g);
  cJSON_Delete(p0), cJSON_Delete(p1);
}

// Random walks over the demo tokenizer's vocabulary.
static void test_masks(void **state) {
  (void)state;
  tpr_tokenizer *tok = NULL;
  assert_int_equal(tpr_tokenizer_load(TPR_FIXTURES "/demo_model", &tok), TPR_OK);
  const int64_t V = tpr_tokenizer_vocab_size(tok);
  const int32_t eos = tpr_tokenizer_eos_id(tok);
  tpr_vocab_bytes *vb = NULL;
  assert_int_equal(tpr_vocab_bytes_new(tok, V, &vb), TPR_OK);
  const char *schema_text = "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"},\"s\":{\"type\":\"string\","
                            "\"maxLength\":6},\"l\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":3}},"
                            "\"required\":[\"n\",\"l\"]}";
  cJSON *schema = cJSON_Parse(schema_text);
  char err[256];
  tpr_json_grammar *grammars[2] = {tpr_json_grammar_new(NULL, NULL, NULL, err, sizeof err),
                                   tpr_json_grammar_new(schema, NULL, NULL, err, sizeof err)};
  uint64_t *allow = malloc((size_t)tpr_mask_words(V) * sizeof *allow);
  int parsed = 0, walks = 0, control_parsed = 0;
  double mask_s = 0;
  int64_t masks = 0;
  for (int w = 0; w < 60; w++) {
    const tpr_json_grammar *g = grammars[w % 2];
    tpr_token_constraint c;
    tpr_token_constraint_init(&c, g, vb, eos);
    int32_t gen[800];
    int64_t n = 0;
    bool ended = false;
    while (n < 800 && !ended) {
      double t0 = tt_now();
      int64_t count = tpr_token_constraint_mask(&c, gen, n, allow);
      mask_s += tt_now() - t0, masks++;
      assert_true(count >= 1);
      // Soundness on a sample: an allowed token feeds, a refused one does not.
      tpr_json_state s = c.state;
      for (int k = 0; k < 8; k++) {
        int32_t id = (int32_t)tt_randint(0, (int)V - 1);
        if (id == eos) continue;
        tpr_json_state t = s;
        char *text = NULL;
        size_t len = 0;
        bool feeds = false;
        if (!tpr_tokenizer_is_special(tok, id) && tpr_tokenizer_decode_known(tok, &id, 1, false, &text, &len) == TPR_OK &&
            len)
          feeds = tpr_json_state_feed(&t, text, len);
        if ((int)(allow[id / 64] >> (id % 64) & 1) != (int)feeds)
          fail_msg("token %d [%.*s] feeds %d but the mask says %d (after %lld tokens)", id, (int)len, text ? text : "",
                   feeds, (int)(allow[id / 64] >> (id % 64) & 1), (long long)n);
        free(text);
      }
      const int eos_ok = (int)(allow[eos / 64] >> (eos % 64) & 1);
      assert_int_equal(eos_ok, (int)(tpr_json_state_complete(&s) || count - eos_ok == 0));
      // Draw an allowed token: the stop token with probability 1/2 when allowed.
      int32_t pick = -1;
      if ((allow[eos / 64] >> (eos % 64) & 1) && tt_randint(0, 1)) pick = eos;
      while (pick < 0) {
        int32_t id = (int32_t)tt_randint(0, (int)V - 1);
        if (allow[id / 64] >> (id % 64) & 1) pick = id;
      }
      if (pick == eos) ended = true;
      else gen[n++] = pick;
    }
    tpr_token_constraint_free(&c);
    walks++;
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(tpr_tokenizer_decode_known(tok, gen, (size_t)n, false, &text, &len), TPR_OK);
    cJSON *j = ended ? cJSON_ParseWithLength(text, len) : NULL;
    bool ok = j && cJSON_IsObject(j);
    if (ok && w % 2) {  // the schema: n integer, l a list of at most 3 booleans, s at most 6 characters
      const cJSON *nn = cJSON_GetObjectItem(j, "n"), *l = cJSON_GetObjectItem(j, "l"), *ss = cJSON_GetObjectItem(j, "s");
      ok = cJSON_IsNumber(nn) && nn->valuedouble == (double)(long long)nn->valuedouble && cJSON_IsArray(l) &&
           cJSON_GetArraySize(l) <= 3 && (!ss || (cJSON_IsString(ss) && strlen(ss->valuestring) <= 4 * 6));
      const cJSON *x;
      cJSON_ArrayForEach(x, l) ok = ok && cJSON_IsBool(x);
    }
    if (ended && !ok) {
      buf cat = {0};
      for (int64_t i = 0; i < n; i++) {
        char *piece = NULL;
        size_t pl = 0;
        tpr_tokenizer_decode_known(tok, &gen[i], 1, false, &piece, &pl);
        put(&cat, piece, pl);
        free(piece);
      }
      cJSON *e2 = cJSON_CreateString(cat.s ? cat.s : "");
      printf("token by token: %s\n", cJSON_PrintUnformatted(e2));
      cJSON *esc = cJSON_CreateString(text);
      fail_msg("walk %d ended in text that does not parse or validate: %s", w, cJSON_PrintUnformatted(esc));
    }
    parsed += ok;
    cJSON_Delete(j);
    free(text);
    // The control: as many tokens drawn without the mask.
    for (int64_t i = 0; i < n; i++) gen[i] = (int32_t)tt_randint(0, (int)V - 1);
    text = NULL;
    assert_int_equal(tpr_tokenizer_decode_known(tok, gen, (size_t)n, true, &text, &len), TPR_OK);
    j = cJSON_ParseWithLength(text, len);
    control_parsed += j && cJSON_IsObject(j);
    cJSON_Delete(j);
    free(text);
  }
  printf("%d random walks under the mask: %d ended and parse (and validate); without it %d parse\n", walks, parsed,
         control_parsed);
  printf("a mask over the %lld ids: %.1f us on average (%lld masks; a report, not a bound)\n", (long long)V,
         1e6 * mask_s / (double)masks, (long long)masks);
  assert_true(parsed >= walks / 2);  // a walk's string can outlast 800 tokens; every walk that ended parsed
  assert_true(control_parsed < walks / 4);
  free(allow);
  tpr_json_grammar_free(grammars[0]), tpr_json_grammar_free(grammars[1]);
  cJSON_Delete(schema);
  tpr_vocab_bytes_free(vb);
  tpr_tokenizer_free(tok);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_texts),
      cmocka_unit_test(test_schemas),
      cmocka_unit_test(test_call_grammar),
      cmocka_unit_test(test_masks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
