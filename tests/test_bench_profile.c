// `tpr bench model --profile --json` on the tiny MiniMax-M2 fixture, alone
// and under mpirun -np 2: the profile object is there and consistent (every
// op kind's time positive, their sum within the exec's run time within the
// step time, every decode step running the same nodes), the read probe says
// how many threads and how large a buffer it used, and without --profile
// there is no profile. A doctored profile (an op longer than the step) must
// fail the same check, so the check can catch a real bug.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIX TPR_FIXTURES "/minimax_m2_tiny"

static char tpr_path[4096], tmp_dir[] = "/tmp/tpr_test_bench_profile_XXXXXX";

static double num(const cJSON *j, const char *key) { return tt_json_num(j, key); }

// NULL if phase is consistent, else what is wrong (static buffer).
static const char *check_phase(const cJSON *ph, int64_t want_steps) {
  static char why[256];
  double step = num(ph, "step_ms"), ops_ms = num(ph, "ops_ms"), exec_ms = num(ph, "exec_ms"), sum = 0;
  int64_t steps = (int64_t)num(ph, "steps");
  // %.6g rounding of each printed figure
  double tol = 1e-5 * step + 1e-6;
  if (want_steps > 0 && steps != want_steps)
    return snprintf(why, sizeof why, "%lld steps, want %lld", (long long)steps, (long long)want_steps), why;
  if (!(step > 0)) return snprintf(why, sizeof why, "step_ms %g is not positive", step), why;
  const cJSON *ops = cJSON_GetObjectItemCaseSensitive(ph, "ops"), *op;
  if (!cJSON_IsArray(ops) || cJSON_GetArraySize(ops) == 0) return "no ops";
  cJSON_ArrayForEach(op, ops) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(op, "op");
    double ms = num(op, "ms"), calls = num(op, "calls");
    if (!cJSON_IsString(name) || !(ms > 0) || !(calls > 0))
      return snprintf(why, sizeof why, "op %s: ms %g, calls %g (want both positive)",
                      cJSON_IsString(name) ? name->valuestring : "?", ms, calls), why;
    if (ms > step + tol) return snprintf(why, sizeof why, "op %s takes %g ms of a %g ms step", name->valuestring, ms, step), why;
    sum += ms;
  }
  if (sum > ops_ms * (1 + 1e-5) + 1e-6 || sum < ops_ms * (1 - 1e-5) - 1e-6)
    return snprintf(why, sizeof why, "ops sum to %g ms, ops_ms says %g", sum, ops_ms), why;
  if (!(ops_ms <= exec_ms + tol && exec_ms <= step + tol))
    return snprintf(why, sizeof why, "want ops %g <= exec %g <= step %g ms", ops_ms, exec_ms, step), why;
  double other = num(ph, "other_ms");
  if (other < -tol || other > step - ops_ms + tol || other < step - ops_ms - tol)
    return snprintf(why, sizeof why, "other_ms %g, want step - ops = %g", other, step - ops_ms), why;
  return NULL;
}

static const cJSON *find_op(const cJSON *ph, const char *kind) {
  const cJSON *op;
  cJSON_ArrayForEach(op, cJSON_GetObjectItemCaseSensitive(ph, "ops")) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(op, "op");
    if (cJSON_IsString(name) && !strcmp(name->valuestring, kind)) return op;
  }
  return NULL;
}

static void print_phase(const char *what, const cJSON *ph) {
  printf("  %s: %g steps, %.4f ms in all, ops %.4f ms, other %.4f ms;", what, num(ph, "steps"), num(ph, "step_ms"),
         num(ph, "ops_ms"), num(ph, "other_ms"));
  int i = 0;
  const cJSON *op;
  cJSON_ArrayForEach(op, cJSON_GetObjectItemCaseSensitive(ph, "ops")) if (i++ < 3)
      printf(" %s %.4f ms (%g calls)", cJSON_GetObjectItemCaseSensitive(op, "op")->valuestring, num(op, "ms"),
             num(op, "calls"));
  printf("\n");
}

static void check_run(int np) {
  int64_t P = tt_randint(2, 12), G = tt_randint(2, 6), seed = tt_randint(1, 1000);
  char p[16], g[16], sd[16];
  snprintf(p, sizeof p, "%lld", (long long)P), snprintf(g, sizeof g, "%lld", (long long)G);
  snprintf(sd, sizeof sd, "%lld", (long long)seed);
  const char *args[] = {"bench", "model", "--model", FIX, "--prompt-len", p, "--gen-len", g, "--seed", sd,
                        "--profile", "--json", NULL};
  cJSON *j = tt_json_of(tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 120}));
  // The read probe ran on the backend's thread count (tt_run sets TPR_NUM_THREADS=1).
  assert_true(num(j, "machine_read_threads") == 1);
  assert_true(num(j, "machine_read_buffer_bytes") >= 64.0 * (1 << 20));
  assert_true(num(j, "machine_read_gbs_per_rank") > 0);
  const cJSON *prof = cJSON_GetObjectItemCaseSensitive(j, "profile");
  assert_true(cJSON_IsObject(prof) && num(prof, "rank") == 0);
  const cJSON *dec = cJSON_GetObjectItemCaseSensitive(prof, "decode"), *pre = cJSON_GetObjectItemCaseSensitive(prof, "prefill");
  printf("np %d, prompt %lld, gen %lld:\n", np, (long long)P, (long long)G);
  print_phase("decode", dec);
  print_phase("prefill", pre);
  // G + 1 tokens are generated, the first by the prefill step.
  const char *why = check_phase(dec, G);
  if (why) fail_msg("decode profile: %s", why);
  if ((why = check_phase(pre, 0))) fail_msg("prefill profile: %s", why);
  assert_true(num(pre, "steps") >= 1);
  // The model's main kinds ran, and every decode step ran the same program:
  // each kind's calls are a whole multiple of the steps.
  const char *kinds[] = {"matmul", "moe_experts", "paged_attention", "rms_norm"};
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
    if (!find_op(dec, kinds[i])) fail_msg("decode profile has no %s", kinds[i]);
  const cJSON *op;
  cJSON_ArrayForEach(op, cJSON_GetObjectItemCaseSensitive(dec, "ops")) {
    int64_t calls = (int64_t)num(op, "calls");
    if (calls % G) fail_msg("%s: %lld calls over %lld decode steps", cJSON_GetObjectItemCaseSensitive(op, "op")->valuestring,
                            (long long)calls, (long long)G);
  }
  // Negative control: an op made longer than its step must be caught.
  cJSON *bad = cJSON_Duplicate(dec, 1);
  cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(bad, "ops"), 0);
  cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(first, "ms"), num(dec, "step_ms") * 1.5);
  assert_non_null(check_phase(bad, G));
  cJSON_Delete(bad);
  cJSON_Delete(j);
}

static void test_profile(void **state) {
  (void)state;
  check_run(0);
  check_run(2);
}

// Without --profile: the same keys, no profile object.
static void test_no_profile(void **state) {
  (void)state;
  const char *args[] = {"bench", "model", "--model", FIX, "--prompt-len", "3", "--gen-len", "2", "--json", NULL};
  cJSON *j = tt_json_of(tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.timeout_s = 120}));
  assert_null(cJSON_GetObjectItemCaseSensitive(j, "profile"));
  assert_true(num(j, "decode_tok_s") > 0 && num(j, "peak_rss_bytes_max") > 0);
  cJSON_Delete(j);
}

int main(void) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_bench_profile") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_profile),
      cmocka_unit_test(test_no_profile),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(tt_path(tmp_dir, "stdout"));
  unlink(tt_path(tmp_dir, "stderr"));
  rmdir(tmp_dir);
  return failed ? 1 : 0;
}
