// tpr run with text: --prompt is tokenized as `tpr tokenize` does (so the
// greedy tokens equal those of --prompt-ids with those ids), the text printed
// (streamed or in --json) is `tpr detokenize` of the generated ids, a --stop
// string cuts the text right before it (a negative control: without it the
// text runs on), the tokenizer's EOS ends a sequence, and bad usage is a
// clear error. The model is a random checkpoint of the tiny fixture config
// with the vocabulary of a tokenizer trained by Hugging Face tokenizers
// (tests/fixtures/tokenizer/bytelevel).
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIX TPR_FIXTURES "/minimax_m2_tiny"
#define TOK TPR_FIXTURES "/tokenizer/bytelevel"

static char tpr_path[4096], tmp_dir[] = "/tmp/tpr_test_run_text_XXXXXX", model[4200];

static run_result run(int np, const char *const *args) {
  return tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 120});
}
#define RUN(np, ...) run(np, (const char *const[]){__VA_ARGS__, NULL})

static int tok_vocab;  // ids the tokenizer knows: the model's 2016 rows pad past them

// The largest id of the fixture's tokenizer.json (model vocab and added tokens) + 1.
static int fixture_vocab(void) {
  char *text = tt_slurp(TOK "/tokenizer.json", NULL);
  cJSON *j = cJSON_Parse(text);
  int most = -1;
  const cJSON *v;
  cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "model"), "vocab"))
    if (v->valueint > most) most = v->valueint;
  cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(j, "added_tokens")) {
    int id = cJSON_GetObjectItemCaseSensitive(v, "id")->valueint;
    if (id > most) most = id;
  }
  cJSON_Delete(j);
  free(text);
  return most + 1;
}

static const char *prompts[] = {"Hello world, this is a test.", "日本語のテキストと emoji 🙂 mixed", "  spaces\tand\nlines"};

// The ids `tpr tokenize` gives, comma-separated, into buf.
static void tokenize(const char *text, char *buf, size_t cap) {
  cJSON *j = tt_json_of(RUN(0, "tokenize", "--model", model, "--text", text, "--json"));
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "ids");
  size_t k = 0;
  for (int i = 0; i < cJSON_GetArraySize(ids); i++)
    k += (size_t)snprintf(buf + k, cap - k, i ? ",%d" : "%d", cJSON_GetArrayItem(ids, i)->valueint);
  cJSON_Delete(j);
}

// One text prompt through tpr run --json: generated ids (comma-separated
// into ids) and the text.
static char *run_text(int np, const char *prompt, const char *stop, char *ids, size_t cap) {
  run_result r = stop ? RUN(np, "run", "--model", model, "--prompt", prompt, "--max-new-tokens", "24", "--stop", stop,
                            "--json")
                      : RUN(np, "run", "--model", model, "--prompt", prompt, "--max-new-tokens", "24", "--json");
  cJSON *j = tt_json_of(r);
  const cJSON *p = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "prompts"), 0);
  const cJSON *gen = cJSON_GetObjectItemCaseSensitive(p, "generated");
  size_t k = 0;
  ids[0] = '\0';
  for (int i = 0; i < cJSON_GetArraySize(gen); i++)
    k += (size_t)snprintf(ids + k, cap - k, i ? ",%d" : "%d", cJSON_GetArrayItem(gen, i)->valueint);
  char *text = strdup(cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
  cJSON_Delete(j);
  return text;
}

static void test_text_matches_ids(void **state) {
  for (size_t i = 0; i < sizeof prompts / sizeof *prompts; i++)
    for (int np = 0; np <= 2; np += 2) {
      char ids[4096], gen[4096], gen_ids[4096], eos[32];
      tokenize(prompts[i], ids, sizeof ids);
      tokenize("<|im_end|>", eos, sizeof eos);  // tokenizer_config.json's eos_token: text mode's stop token
      char *text = run_text(np, prompts[i], NULL, gen, sizeof gen);
      // The same prompt as ids: the same greedy tokens.
      cJSON *j = tt_json_of(RUN(np, "run", "--model", model, "--prompt-ids", ids, "--max-new-tokens", "24",
                                "--stop-token", eos, "--json"));
      const cJSON *g = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "prompts"), 0),
                                                        "generated");
      size_t k = 0;
      gen_ids[0] = '\0';
      for (int t = 0; t < cJSON_GetArraySize(g); t++)
        k += (size_t)snprintf(gen_ids + k, sizeof gen_ids - k, t ? ",%d" : "%d", cJSON_GetArrayItem(g, t)->valueint);
      cJSON_Delete(j);
      assert_string_equal(gen, gen_ids);
      // The text is the detokenized ids (special tokens skipped; ids in the
      // model's padding rows past the tokenizer's vocabulary have no text).
      char known[4096] = "";
      size_t kk = 0;
      for (char *tok = strtok(gen, ","); tok; tok = strtok(NULL, ","))
        if (atoi(tok) < tok_vocab) kk += (size_t)snprintf(known + kk, sizeof known - kk, kk ? ",%s" : "%s", tok);
      run_result d = kk ? RUN(0, "detokenize", "--model", model, "--ids", known, "--skip-special")
                        : (run_result){0, strdup(""), strdup("")};
      assert_int_equal(d.code, 0);
      size_t dl = strlen(d.out);
      if (dl && d.out[dl - 1] == '\n') d.out[--dl] = '\0';
      assert_string_equal(text, d.out);
      printf("prompt %zu at np %d: %zu bytes of text from ids %s\n", i, np ? np : 1, strlen(text), known);
      tt_run_done(&d);
      free(text);
    }
}

static void test_stop_string(void **state) {
  char gen[4096];
  char *full = run_text(0, prompts[0], NULL, gen, sizeof gen);
  size_t n = strlen(full);
  assert_true(n >= 6);
  // A stop string from the middle of the text (not its first occurrence's
  // prefix problem: cut at the first occurrence of it).
  char stop[8];
  memcpy(stop, full + n / 2, 3);
  stop[3] = '\0';
  const char *first = strstr(full, stop);
  char *cut = run_text(0, prompts[0], stop, gen, sizeof gen);
  printf("stop '%s': %zu bytes -> %zu (want %zu)\n", stop, n, strlen(cut), (size_t)(first - full));
  assert_int_equal(strlen(cut), (size_t)(first - full));
  assert_memory_equal(cut, full, strlen(cut));
  assert_true(strlen(cut) < n);  // negative control: without --stop the text runs past it
  free(full);
  free(cut);
  // Streamed stdout (one prompt, not --json) is the same text.
  run_result r = RUN(0, "run", "--model", model, "--prompt", prompts[0], "--max-new-tokens", "24", "--stop", stop);
  assert_int_equal(r.code, 0);
  char *line = strchr(r.out, '\n');  // after the KV pool line
  assert_non_null(line);
  char *cut2 = run_text(0, prompts[0], stop, gen, sizeof gen);
  assert_memory_equal(line + 1, cut2, strlen(cut2));
  assert_true(line[1 + strlen(cut2)] == '\n');
  free(cut2);
  tt_run_done(&r);
}

static void test_bad_usage(void **state) {
  run_result r = RUN(0, "run", "--model", model, "--prompt", "x", "--prompt-ids", "1,2");
  assert_int_equal(r.code, 2);
  assert_non_null(strstr(r.err, "not both"));
  tt_run_done(&r);
  r = RUN(0, "run", "--model", model, "--prompt-ids", "1,2", "--stop", "x");
  assert_int_equal(r.code, 2);
  assert_non_null(strstr(r.err, "--stop needs text prompts"));
  tt_run_done(&r);
  r = RUN(0, "run", "--model", FIX, "--prompt", "hello");  // no tokenizer.json there
  assert_int_equal(r.code, 2);
  assert_non_null(strstr(r.err, "tokenizer"));
  tt_run_done(&r);
  r = RUN(0, "run", "--model", model, "--prompt-file", "/nonexistent/prompt.txt");
  assert_int_equal(r.code, 2);
  assert_non_null(strstr(r.err, "/nonexistent/prompt.txt"));
  tt_run_done(&r);
  r = RUN(0, "run", "--model", model, "--prompt", "");
  assert_int_equal(r.code, 2);
  tt_run_done(&r);
}

int main(void) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_run_text") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  tt_seed_from_env();
  tok_vocab = fixture_vocab();
  // The tiny config with the tokenizer's vocabulary (2,009 ids, padded).
  char cfg[4200], cmd[9000];
  snprintf(cfg, sizeof cfg, "%s/config.json", tmp_dir);
  snprintf(model, sizeof model, "%s/model", tmp_dir);
  snprintf(cmd, sizeof cmd, "sed 's/\"vocab_size\": 256/\"vocab_size\": 2016/' %s/config.json > %s && grep -q 2016 %s",
           FIX, cfg, cfg);
  if (system(cmd) != 0) return fprintf(stderr, "could not write %s\n", cfg), 1;
  char seed[32];
  snprintf(seed, sizeof seed, "%lld", (long long)tt_randint(1, 1 << 30));
  run_result r = RUN(0, "make-checkpoint", "--config", cfg, "--out", model, "--seed", seed);
  if (r.code) return fprintf(stderr, "make-checkpoint: %s\n", r.err), 1;
  tt_run_done(&r);
  snprintf(cmd, sizeof cmd, "cp %s/tokenizer.json %s/tokenizer_config.json %s/", TOK, TOK, model);
  if (system(cmd) != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text_matches_ids),
      cmocka_unit_test(test_stop_string),
      cmocka_unit_test(test_bad_usage),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
  return rc;
}
