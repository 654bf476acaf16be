// The embedded demo model (tests/fixtures/demo_model, trained by tpr train
// on Debian's fortunes: scripts/demo_model/) against what transformers
// computed on the committed files (scripts/reference/make_demo_reference.py):
//   - every reference prompt: `tpr tokenize` gives the ids `tokenizers` gave,
//     and `tpr run --prompt` (one rank, and 2 ranks at tp 2 / ep 2) generates
//     transformers' greedy ids and text;
//   - the logits of prompt 0 at tp 2 within 1e-4 of the largest logit;
//   - `tpr eval` over the committed validation slice equals the recorded
//     validation loss (1e-4) and transformers' own (1e-4), and beats the
//     bigram baseline recorded beside it.
// tpr eval itself: 2 replicas (an odd window count, so one replica runs a
// dropped window) equal one rank; an id past the vocabulary is an error.
// Negative controls: the logits of a prompt with one token changed, and the
// loss of windows half as long, must miss those bounds.
#include "test_util.h"
#include "cli_util.h"
#include "train/npy.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIX TPR_FIXTURES "/demo_model"

static char tpr_path[4096], tmp_dir[] = "/tmp/tpr_test_demo_model_XXXXXX";
static cJSON *ref, *training;

static run_result run(int np, const char *const *args) {
  return tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 240});
}
#define RUN(np, ...) run(np, (const char *const[]){__VA_ARGS__, NULL})

static cJSON *get(const cJSON *j, const char *key) {
  cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!v) fail_msg("reference: no \"%s\"", key);
  return v;
}

// A JSON array of ints as "1,2,3" into buf.
static void join_ids(const cJSON *a, char *buf, size_t cap) {
  size_t k = 0;
  buf[0] = '\0';
  for (int i = 0; i < cJSON_GetArraySize(a); i++)
    k += (size_t)snprintf(buf + k, cap - k, i ? ",%d" : "%d", cJSON_GetArrayItem(a, i)->valueint);
}

static void test_greedy_equals_transformers(void **state) {
  (void)state;
  const cJSON *prompts = get(ref, "prompts");
  char max_new[16], want[8192], got[8192], eos[16];
  snprintf(max_new, sizeof max_new, "%d", get(ref, "max_new_tokens")->valueint);
  snprintf(eos, sizeof eos, "%d", get(ref, "eos_id")->valueint);
  for (int i = 0; i < cJSON_GetArraySize(prompts); i++) {
    const cJSON *p = cJSON_GetArrayItem(prompts, i);
    const char *text = get(p, "text")->valuestring;
    cJSON *t = tt_json_of(RUN(0, "tokenize", "--model", FIX, "--text", text, "--json"));
    join_ids(get(t, "ids"), got, sizeof got);
    join_ids(get(p, "ids"), want, sizeof want);
    assert_string_equal(got, want);
    cJSON_Delete(t);
    join_ids(get(p, "greedy"), want, sizeof want);
    if (cJSON_IsTrue(get(p, "ended_at_eos"))) {  // tpr lists the EOS it stopped at
      size_t n = strlen(want);
      snprintf(want + n, sizeof want - n, n ? ",%s" : "%s", eos);
    }
    for (int np = 0; np <= 2; np += 2) {
      cJSON *j = np ? tt_json_of(RUN(np, "run", "--model", FIX, "--prompt", text, "--max-new-tokens", max_new,
                                     "--tp", "2", "--ep", "2", "--json"))
                    : tt_json_of(RUN(np, "run", "--model", FIX, "--prompt", text, "--max-new-tokens", max_new,
                                     "--json"));
      const cJSON *out = cJSON_GetArrayItem(get(j, "prompts"), 0);
      join_ids(get(out, "generated"), got, sizeof got);
      printf("prompt %d at np %d: %d generated ids (min top-2 logit gap in transformers %.4f)\n", i, np ? np : 1,
             cJSON_GetArraySize(get(out, "generated")), get(p, "min_top2_gap")->valuedouble);
      assert_string_equal(got, want);
      assert_string_equal(get(out, "text")->valuestring, get(p, "greedy_text")->valuestring);
      cJSON_Delete(j);
    }
  }
}

// tpr forward of ids at tp 2 against transformers' logits: the relative error.
static double logits_rel(const char *ids) {
  const char *out = tt_path(tmp_dir, "logits.safetensors");
  run_result r = RUN(2, "forward", "--model", FIX, "--tokens", ids, "--out", out, "--tp", "2", "--ep", "2");
  assert_int_equal(r.code, 0);
  tt_run_done(&r);
  r = RUN(0, "compare", "--a", out, "--a-key", "logits", "--b", FIX "/reference.safetensors", "--b-key", "logits",
          "--tol", "1e-4", "--json");
  cJSON *j = cJSON_Parse(r.out);  // exit 1 when over --tol: parsed either way
  assert_non_null(j);
  double rel = get(j, "rel")->valuedouble;
  cJSON_Delete(j);
  tt_run_done(&r);
  return rel;
}

static void test_logits_equal_transformers(void **state) {
  (void)state;
  const cJSON *p = cJSON_GetArrayItem(get(ref, "prompts"), 0);
  char ids[4096];
  join_ids(get(p, "ids"), ids, sizeof ids);
  double rel = logits_rel(ids);
  printf("prompt 0 logits at tp 2 / ep 2: max|tpr - transformers| / max|logit| = %.3e (bound 1e-4)\n", rel);
  assert_true(rel <= 1e-4);
  // Negative control: one prompt token replaced by a random other id.
  cJSON *bad = cJSON_Duplicate(get(p, "ids"), 1);
  int n = cJSON_GetArraySize(bad), k = (int)tt_randint(0, n - 1), old = cJSON_GetArrayItem(bad, k)->valueint;
  int repl = (old + (int)tt_randint(1, 4000)) % 4096;
  cJSON_ReplaceItemInArray(bad, k, cJSON_CreateNumber(repl));
  join_ids(bad, ids, sizeof ids);
  cJSON_Delete(bad);
  double wrong = logits_rel(ids);
  printf("negative control, token %d changed %d -> %d: %.3e (must exceed 1e-4)\n", k, old, repl, wrong);
  assert_true(wrong > 1e-4);
}

static double eval_loss(const char *seq_len) {
  cJSON *j = tt_json_of(RUN(0, "eval", "--model", FIX, "--data", FIX "/val.npy", "--seq-len", seq_len, "--json"));
  double loss = tt_json_num(j, "loss");
  printf("tpr eval --seq-len %s: %d windows, %d tokens, loss %.6f (%.1f s)\n", seq_len,
         (int)tt_json_num(j, "windows"), (int)tt_json_num(j, "tokens"), loss, tt_json_num(j, "seconds"));
  cJSON_Delete(j);
  return loss;
}

static void test_val_loss(void **state) {
  (void)state;
  const cJSON *val = get(training, "val");
  double recorded = get(val, "loss")->valuedouble, bigram = get(get(training, "baselines"), "bigram_interpolated")->valuedouble;
  double hf = get(get(ref, "val"), "loss")->valuedouble;
  char T[16];
  snprintf(T, sizeof T, "%d", get(val, "seq_len")->valueint);
  double loss = eval_loss(T);
  printf("recorded %.6f (|d| %.2e), transformers %.6f (|d| %.2e), bigram baseline %.6f, unigram %.6f\n", recorded,
         fabs(loss - recorded), hf, fabs(loss - hf), bigram,
         get(get(training, "baselines"), "unigram")->valuedouble);
  assert_true(fabs(loss - recorded) <= 1e-4);
  assert_true(fabs(loss - hf) <= 1e-4);
  assert_true(loss < bigram);
  // Negative control: windows of half the length score other targets with
  // less context; the comparison must see it.
  char half[16];
  snprintf(half, sizeof half, "%d", get(val, "seq_len")->valueint / 2);
  double other = eval_loss(half);
  printf("negative control, --seq-len %s: |d| %.2e (must exceed 1e-4)\n", half, fabs(other - recorded));
  assert_true(fabs(other - recorded) > 1e-4);
}

static void test_eval_replicas_and_bad_ids(void **state) {
  (void)state;
  char w[16];
  snprintf(w, sizeof w, "%d", (int)tt_randint(3, 15) | 1);
  cJSON *a = tt_json_of(RUN(0, "eval", "--model", FIX, "--data", FIX "/val.npy", "--windows", w, "--json"));
  cJSON *b = tt_json_of(RUN(2, "eval", "--model", FIX, "--data", FIX "/val.npy", "--windows", w, "--tp", "1", "--dp",
                            "2", "--ep", "2", "--json"));
  double la = tt_json_num(a, "loss"), lb = tt_json_num(b, "loss");
  printf("tpr eval, %s windows: 1 rank %.9f, dp 2 x ep 2 %.9f, |d| %.2e (bound 1e-5)\n", w, la, lb, fabs(la - lb));
  assert_int_equal((int)tt_json_num(a, "windows"), atoi(w));
  assert_int_equal((int)tt_json_num(b, "windows"), atoi(w));
  assert_true(fabs(la - lb) <= 1e-5);
  cJSON_Delete(a);
  cJSON_Delete(b);
  // A token file with one id past the 4096-id vocabulary at a random place.
  int32_t ids[600];
  for (int i = 0; i < 600; i++) ids[i] = (int32_t)tt_randint(0, 4095);
  int at = (int)tt_randint(0, 599);
  ids[at] = (int32_t)tt_randint(4096, 100000);
  const char *bad = tt_path(tmp_dir, "bad.npy");
  assert_int_equal(tpr_npy_write_i32(bad, ids, 600), TPR_OK);
  run_result r = RUN(0, "eval", "--model", FIX, "--data", bad, "--seq-len", "64");
  char pos[32];
  snprintf(pos, sizeof pos, "%d", at);
  printf("id %d at position %d: exit %d, %s", ids[at], at, r.code, r.err);
  assert_int_equal(r.code, 1);
  assert_non_null(strstr(r.err, pos));
  tt_run_done(&r);
}

int main(void) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_demo_model") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  tt_seed_from_env();
  char *text = tt_slurp(FIX "/reference.json", NULL);
  ref = cJSON_Parse(text);
  free(text);
  text = tt_slurp(FIX "/training.json", NULL);
  training = cJSON_Parse(text);
  free(text);
  if (!ref || !training) return fprintf(stderr, "test_demo_model: unreadable reference.json / training.json\n"), 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy_equals_transformers),
      cmocka_unit_test(test_logits_equal_transformers),
      cmocka_unit_test(test_val_loss),
      cmocka_unit_test(test_eval_replicas_and_bad_ids),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  cJSON_Delete(ref);
  cJSON_Delete(training);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
  return rc;
}
