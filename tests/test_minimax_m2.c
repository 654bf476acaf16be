// MiniMax-M2 end to end against Hugging Face transformers
// (tests/fixtures/minimax_m2_tiny, made by scripts/reference/): `tpr forward`
// logits at tp 1, 2, 4; `tpr run` greedy generation; the KV cache (prefill +
// decode equals one full forward, and decode matches transformers' cached
// generation); the negative controls (a rank baked into the program, QK-norm
// per rank) that the parity bound must catch; and compile-once-run-everywhere
// (--broadcast-program). Every check prints the error it measured.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collectives/tpr_comm.h"
#include "engine/session.h"
#include "m2_ref.h"

#define FIX M2_FIX
#define V M2_V
#define TA M2_TA
#define TB M2_TB
#define NG M2_NG
#define PARITY_BOUND M2_PARITY_BOUND
#define KV_BOUND 1e-5       // cached decode vs one full forward (same weights, other GEMM blocking)

static char tpr_path[4096];
static char tmp_dir[] = "/tmp/tpr_test_m2_XXXXXX";

static m2_ref ref;

// ---------------------------------------------------------------- helpers

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// `tpr args...` alone (np 0) or under `mpirun -np np`, killed after 120 s.
static run_result run_np(int np, const char *const *args) {
  return tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 120});
}
#define RUN(np, ...) run_np(np, (const char *const[]){__VA_ARGS__, NULL})

static void expect_ok(const run_result *r) {
  if (r->code != 0) fail_msg("exit %d\nstdout:\n%s\nstderr:\n%s", r->code, r->out, r->err);
}

// `tpr forward` of prompt a or b at np ranks (0: alone), plus flags; the
// plain runs are kept for the tests that compare with them.
typedef struct fwd {
  float *logits;  // (T, V)
  char hash[32];  // program_hash
} fwd;
static fwd plain[5][2];

static fwd forward(int np, int which, const char *flag, const char *flag_value) {
  if (!flag && plain[np][which].logits) return plain[np][which];
  int64_t T = which ? TB : TA;
  char out[4200];
  snprintf(out, sizeof out, "%s/logits_np%d_%c%s.safetensors", tmp_dir, np, "ab"[which], flag ? flag + 2 : "");
  unlink(out);
  const char *args[16] = {"forward", "--model", FIX, "--tokens", which ? ref.b_text : ref.a_text, "--out", out,
                          "--json"};
  int n = 8;
  if (flag) args[n++] = flag;
  if (flag_value) args[n++] = flag_value;
  cJSON *j = tt_json_of(run_np(np, args));
  int ranks = np ? np : 1;
  assert_true(tt_json_num(j, "world_size") == ranks && tt_json_num(j, "tp") == ranks);
  assert_true(tt_json_num(j, "tokens") == T && tt_json_num(j, "vocab") == V);
  fwd f = {.logits = m2_read_logits(out, "logits", T)};
  const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "program_hash");
  if (!cJSON_IsString(h) || strlen(h->valuestring) != 16) fail_msg("bad program_hash");
  snprintf(f.hash, sizeof f.hash, "%s", h->valuestring);
  cJSON_Delete(j);
  unlink(out);
  if (!flag) plain[np][which] = f;
  return f;
}

static double parity_err(const fwd *f, int which) {
  return which ? m2_rel_err(f->logits, ref.logits_b, TB * V) : m2_rel_err(f->logits, ref.logits_a, TA * V);
}

// ---------------------------------------------------------------- tests

// 1. tpr forward at tp 1 (no launcher), 2 and 4 (mpirun) equals transformers.
static void test_parity(void **state) {
  static const int nps[] = {0, 2, 4};
  int bad = 0;  // every error is printed before the test fails
  for (int i = 0; i < 3; i++)
    for (int w = 0; w < 2; w++) {
      fwd f = forward(nps[i], w, NULL, NULL);
      double e = parity_err(&f, w);
      printf("parity tp %d prompt %c (%d tokens): max|d|/max|ref| = %.3g (bound %.0e)%s\n", nps[i] ? nps[i] : 1,
             "ab"[w], w ? TB : TA, e, PARITY_BOUND, e <= PARITY_BOUND ? "" : "  FAIL");
      bad += !(e <= PARITY_BOUND);
    }
  if (bad) fail_msg("%d of 6 runs differ from transformers' logits by more than %.0e", bad, PARITY_BOUND);
}

static void ids_of(const cJSON *prompt, const char *key, int32_t *ids, int n) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(prompt, key);
  if (cJSON_GetArraySize(a) != n) fail_msg("'%s' has %d ids, want %d", key, cJSON_GetArraySize(a), n);
  for (int i = 0; i < n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(a, i)->valuedouble;
}

static void print_ids(const char *what, const int32_t *ids, int n) {
  printf("%s", what);
  for (int i = 0; i < n; i++) printf(" %d", ids[i]);
  printf("\n");
}

// 2. tpr run, greedy: transformers' 8 tokens after prompt a at every tp;
// prompt b (a second prompt through the same caches) alike across tp and
// starting with the argmax of transformers' last logits row.
static void test_greedy(void **state) {
  static const int nps[] = {0, 2, 4};
  int32_t b1[NG] = {0};
  int argmax_b = 0, bad = 0;
  for (int v = 1; v < V; v++)
    if (ref.logits_b[(TB - 1) * V + v] > ref.logits_b[(TB - 1) * V + argmax_b]) argmax_b = v;
  for (int i = 0; i < 3; i++) {
    int ranks = nps[i] ? nps[i] : 1;
    cJSON *j = tt_json_of(RUN(nps[i], "run", "--model", FIX, "--json", "--max-new-tokens", "8", "--prompt-ids",
                           ref.a_text, "--prompt-ids", ref.b_text));
    assert_true(tt_json_num(j, "world_size") == ranks && tt_json_num(j, "decode_tokens") == 2 * (NG - 1) &&
                tt_json_num(j, "prefill_tokens") == TA + TB);
    const cJSON *prompts = cJSON_GetObjectItemCaseSensitive(j, "prompts");
    assert_int_equal(cJSON_GetArraySize(prompts), 2);
    int32_t p[TA], ga[NG], gb[NG];
    ids_of(cJSON_GetArrayItem(prompts, 0), "prompt", p, TA);
    assert_memory_equal(p, ref.a, sizeof p);
    ids_of(cJSON_GetArrayItem(prompts, 0), "generated", ga, NG);
    ids_of(cJSON_GetArrayItem(prompts, 1), "generated", gb, NG);
    printf("greedy tp %d:\n", ranks);
    print_ids("  prompt a ->", ga, NG);
    print_ids("  prompt b ->", gb, NG);
    // Every tp is run and printed before the test fails.
    if (memcmp(ga, ref.greedy_a, sizeof ga)) {
      print_ids("  FAIL: transformers' greedy_a is", ref.greedy_a, NG);
      bad++;
    }
    if (gb[0] != argmax_b) printf("  FAIL: prompt b's first token should be transformers' argmax %d\n", argmax_b), bad++;
    if (i == 0) memcpy(b1, gb, sizeof b1);
    else if (memcmp(gb, b1, sizeof gb)) printf("  FAIL: prompt b's tokens differ from tp 1's\n"), bad++;
    cJSON_Delete(j);
  }
  if (bad) fail_msg("%d greedy check(s) failed (above)", bad);
}

static tpr_session *open_session(tpr_comm_t self, int64_t max_seq) {
  tpr_session_opts o = {.model_dir = FIX, .max_seq = max_seq, .force_tp_rank = -1};
  tpr_session *s = NULL;
  TT_OK(tpr_session_open(&o, self, tt_cpu(), &s));
  assert_int_equal(tpr_session_config(s)->vocab_size, V);
  return s;
}

// 3. In-process, self backend: prefill 6 + decode 5 one at a time equals one
// forward over all 11 tokens; decoding at the wrong position does not; and
// decode after prompt a matches transformers' cached generation.
static void test_kv_cache(void **state) {
  tpr_comm_t self;
  TT_OK(tpr_comm_init_self(&self));
  tpr_session *s = open_session(self, 16);
  static float full[TA * V], again[TA * V], step[TA * V];
  TT_OK(tpr_session_forward(s, ref.a, TA, 0, full));
  double e = m2_rel_err(full, ref.logits_a, TA * V);
  printf("kv: full forward (T 11) vs transformers: %.3g\n", e);
  assert_true(e <= PARITY_BOUND);

  const int P = 6;
  TT_OK(tpr_session_forward(s, ref.a, P, 0, step));
  double worst = m2_rel_err(step, full, (size_t)P * V);
  printf("kv: prefill (T %d) rows vs full forward: %.3g\n", P, worst);
  for (int t = P; t < TA; t++) {
    TT_OK(tpr_session_forward(s, &ref.a[t], 1, t, step));
    double et = m2_rel_err(step, full + t * V, V);
    printf("kv: decode position %d vs full forward row: %.3g\n", t, et);
    if (et > worst) worst = et;
  }
  printf("kv: worst prefill/decode vs full: %.3g (bound %.0e)\n", worst, KV_BOUND);
  if (!(worst <= KV_BOUND)) fail_msg("cached decode differs from the full forward: %.3g > %.0e", worst, KV_BOUND);

  // Negative control: every decode token at start 0 (as if the cache were ignored).
  TT_OK(tpr_session_forward(s, ref.a, P, 0, step));
  double least = INFINITY;
  for (int t = P; t < TA; t++) {
    TT_OK(tpr_session_forward(s, &ref.a[t], 1, 0, step));
    double et = m2_rel_err(step, full + t * V, V);
    if (et < least) least = et;
  }
  printf("kv: decode at the wrong start (0): smallest error %.3g (must exceed 1e-2)\n", least);
  if (!(least > 1e-2)) fail_msg("decoding at position 0 was not told apart from the right position: %.3g", least);

  // Errors leave the session usable, and a rerun is bitwise the same.
  assert_int_equal(tpr_session_forward(s, ref.a, TA, 6, step), TPR_ERR_INVALID_ARG);  // 6 + 11 > 16 rows
  int32_t bad[2] = {1, V};
  assert_int_equal(tpr_session_forward(s, bad, 2, 0, step), TPR_ERR_INVALID_ARG);
  if (!strstr(tpr_last_error(), "vocabulary")) fail_msg("token %d: '%s'", V, tpr_last_error());
  TT_OK(tpr_session_forward(s, ref.a, TA, 0, again));
  assert_memory_equal(again, full, sizeof full);
  tpr_session_close(s);

  // transformers' greedy_logits_a: prefill prompt a, then feed greedy_a.
  s = open_session(self, TA + NG);
  TT_OK(tpr_session_forward(s, ref.a, TA, 0, full));
  worst = m2_rel_err(full + (TA - 1) * V, ref.greedy_logits_a, V);
  for (int i = 1; i < NG; i++) {
    TT_OK(tpr_session_forward(s, &ref.greedy_a[i - 1], 1, TA + i - 1, step));
    double ei = m2_rel_err(step, ref.greedy_logits_a + i * V, V);
    if (ei > worst) worst = ei;
  }
  printf("kv: decode of greedy_a vs transformers' greedy_logits_a: %.3g (bound %.0e)\n", worst, PARITY_BOUND);
  if (!(worst <= PARITY_BOUND)) fail_msg("decode logits differ from transformers': %.3g", worst);
  tpr_session_close(s);
  tpr_comm_free(self);
}

// 3b. More token counts than the session keeps programs for (16): every
// prefix of a 19-token sequence gives the full forward's rows (causality at
// every T), and the evicted programs rebuild to the same logits bit for bit.
static void test_program_cache(void **state) {
  enum { N = TA + NG };
  int32_t seq[N];
  memcpy(seq, ref.a, sizeof ref.a);
  memcpy(seq + TA, ref.greedy_a, sizeof ref.greedy_a);
  tpr_comm_t self;
  TT_OK(tpr_comm_init_self(&self));
  tpr_session *s = open_session(self, N);
  static float full[N * V], part[N * V];
  TT_OK(tpr_session_forward(s, seq, N, 0, full));
  double worst = 0;
  for (int T = 1; T < N; T++) {
    TT_OK(tpr_session_forward(s, seq, T, 0, part));
    double e = m2_rel_err(part, full, (size_t)T * V);
    if (e > worst) worst = e;
  }
  printf("program cache: prefixes T = 1..%d vs the T = %d forward: worst %.3g (bound %.0e)\n", N - 1, N, worst,
         KV_BOUND);
  if (!(worst <= KV_BOUND)) fail_msg("a prefix differs from the full forward: %.3g", worst);
  TT_OK(tpr_session_forward(s, seq, N, 0, part));  // T = 19 was evicted: rebuilt
  assert_memory_equal(part, full, sizeof full);
  double e = m2_rel_err(full, ref.logits_a, TA * V);
  printf("program cache: T = %d rows 0..%d vs transformers' logits_a: %.3g\n", N, TA - 1, e);
  assert_true(e <= PARITY_BOUND);
  tpr_session_close(s);
  tpr_comm_free(self);
}

// 4. The negative controls: the bugs docs/architecture.md section 1 and 5 describe must
// break parity at np 4 by far more than the bound; at tp 1 they are no-ops.
static void test_negative_controls(void **state) {
  static const struct {
    const char *flag, *value;
  } bugs[] = {{"--debug-force-tp-rank", "0"}, {"--debug-per-rank-qk-norm", NULL}};
  for (int b = 0; b < 2; b++) {
    fwd f = forward(4, 0, bugs[b].flag, bugs[b].value);
    double e = parity_err(&f, 0);
    printf("control %s at np 4: max|d|/max|ref| = %.3g (must exceed %.0e)\n", bugs[b].flag, e, 100 * PARITY_BOUND);
    free(f.logits);
    if (!(e > 100 * PARITY_BOUND)) fail_msg("%s went unnoticed: error %.3g", bugs[b].flag, e);
    f = forward(0, 0, bugs[b].flag, bugs[b].value);
    e = parity_err(&f, 0);
    printf("control %s at tp 1 (a no-op there): %.3g\n", bugs[b].flag, e);
    free(f.logits);
    if (!(e <= PARITY_BOUND)) fail_msg("%s at tp 1: error %.3g", bugs[b].flag, e);
  }
}

// 5. Compile once, run everywhere: rank 0's program bytes, shipped, give the
// same program (hash) and the same logits, bit for bit, as every rank
// building its own.
static void test_broadcast_program(void **state) {
  fwd local = forward(4, 0, NULL, NULL), sent = forward(4, 0, "--broadcast-program", NULL);
  double e = parity_err(&sent, 0);
  printf("broadcast program np 4: hash %s (local %s), error %.3g, bitwise equal to local: %s\n", sent.hash,
         local.hash, e, memcmp(sent.logits, local.logits, TA * V * sizeof(float)) ? "no" : "yes");
  assert_true(e <= PARITY_BOUND);
  assert_string_equal(sent.hash, local.hash);
  assert_memory_equal(sent.logits, local.logits, TA * V * sizeof(float));
  free(sent.logits);
}

static void test_help(void **state) {
  static const char *const cmds[][2] = {{"forward", "--tokens"}, {"run", "--prompt-ids"}};
  for (int i = 0; i < 2; i++) {
    run_result r = RUN(0, cmds[i][0], "--help");
    expect_ok(&r);
    const char *want[] = {cmds[i][1], "--model", "--debug-force-tp-rank", "--broadcast-program", "test only"};
    for (int k = 0; k < 5; k++)
      if (!strstr(r.out, want[k])) fail_msg("tpr %s --help lacks '%s':\n%s", cmds[i][0], want[k], r.out);
    tt_run_done(&r);
  }
}

static int setup(void **state) {
  m2_ref_load(&ref);
  return 0;
}

static int teardown(void **state) {
  for (int i = 0; i < 5; i++) free(plain[i][0].logits), free(plain[i][1].logits);
  unlink(tt_path(tmp_dir, "stdout"));
  unlink(tt_path(tmp_dir, "stderr"));
  return rmdir(tmp_dir) == 0 ? 0 : -1;
}

int main(void) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_minimax_m2") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  // As ctest sets them (tests/CMakeLists.txt), for runs outside ctest.
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  setenv("LSAN_OPTIONS", "suppressions=" TPR_FIXTURES "/../lsan.supp:print_suppressions=0", 0);
  tt_seed_from_env();
  double t_start = now_s();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_parity),
      cmocka_unit_test(test_greedy),
      cmocka_unit_test(test_kv_cache),
      cmocka_unit_test(test_program_cache),
      cmocka_unit_test(test_negative_controls),
      cmocka_unit_test(test_broadcast_program),
  };
  int rc = cmocka_run_group_tests(tests, setup, teardown);
  printf("test_minimax_m2: %.1f s\n", now_s() - t_start);
  return rc;
}
