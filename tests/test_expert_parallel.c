// Expert parallelism end to end on the MiniMax-M2 fixture (8 experts, top 2):
// `tpr forward` under mpirun -np 4 for every way the mesh folds 4 ranks
// (attention on dp x tp, experts on edp x ep x etp), with both dispatchers,
// against transformers' logits and against each other; data-parallel
// replicas given different prompts; a router biased so every token goes to
// experts 0 and 1 (ranks that receive nothing); capacity mode and
// re-routing independent of the mesh, with their statistics; bad flags.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "m2_ref.h"

#define AGREE_BOUND 1e-5  // two dispatchers, same mesh: only summation order differs

static char tpr_path[4096];
static char tmp_dir[] = "/tmp/tpr_test_ep_XXXXXX";
static m2_ref ref;

static run_result run_np(int np, const char *const *args) {
  return tt_run(tpr_path, tmp_dir, args, &(tt_run_opts){.np = np, .timeout_s = 120});
}
#define RUN_ARGS(np, ...) run_np(np, (const char *const[]){__VA_ARGS__, NULL})

// A mesh and MoE flags, as `tpr forward` takes them ("" = left out).
typedef struct mesh {
  const char *tp, *dp, *ep, *etp, *dispatch;
} mesh;

// `tpr forward` of `tokens` (one list, or "a|b" for two replicas) on np ranks
// with mesh m plus extra flags; returns the logits under `key`.
static float *forward(int np, const mesh *m, const char *model, const char *tokens, int64_t T, const char *key,
                      const char *const *extra) {
  const char *out = tt_path(tmp_dir, "logits.safetensors");
  unlink(out);
  const char *args[40] = {"forward", "--model", model, "--out", out, "--json"};
  int n = 6;
  char first[512];
  snprintf(first, sizeof first, "%s", tokens);
  char *second = strchr(first, '|');
  if (second) *second++ = '\0';
  args[n++] = "--tokens", args[n++] = first;
  if (second) args[n++] = "--tokens", args[n++] = second;
  const char *flags[5] = {"--tp", "--dp", "--ep", "--etp", "--moe-dispatch"};
  const char *vals[5] = {m->tp, m->dp, m->ep, m->etp, m->dispatch};
  for (int i = 0; i < 5; i++)
    if (vals[i] && *vals[i]) args[n++] = flags[i], args[n++] = vals[i];
  for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
  cJSON *j = tt_json_of(run_np(np, args));
  assert_true(tt_json_num(j, "tokens") == T);
  cJSON_Delete(j);
  float *x = m2_read_logits(out, key, T);
  unlink(out);
  return x;
}

static const char *describe(const mesh *m, char *buf, size_t cap) {
  snprintf(buf, cap, "tp %s dp %s ep %s etp %s %s", *m->tp ? m->tp : "-", *m->dp ? m->dp : "-",
           *m->ep ? m->ep : "-", *m->etp ? m->etp : "-", *m->dispatch ? m->dispatch : "auto");
  return buf;
}

// 1. Every factorization of 4 ranks, prompt a (11 tokens: not a multiple of
// tp, so the token slices are uneven) and prompt b, equals transformers;
// both dispatchers agree where both can run (dp = 1).
static void test_factorizations(void **state) {
  static const mesh meshes[] = {
      {"4", "", "1", "", "alltoall"},  {"4", "", "2", "2", "alltoall"}, {"4", "", "2", "2", "allreduce"},
      {"4", "", "4", "1", "alltoall"}, {"4", "", "4", "1", "allreduce"}, {"4", "", "2", "1", "alltoall"},
      {"4", "", "2", "1", "allreduce"}, {"4", "", "1", "1", "alltoall"}, {"2", "2", "2", "1", "alltoall"},
      {"2", "2", "4", "1", "alltoall"}, {"2", "2", "2", "2", "alltoall"}, {"1", "4", "4", "1", "alltoall"},
      {"1", "4", "2", "2", "alltoall"}, {"1", "4", "1", "4", "alltoall"},
  };
  const int n = sizeof meshes / sizeof *meshes;
  int bad = 0;
  float *prev = NULL;
  for (int i = 0; i < n; i++) {
    char d[96];
    describe(&meshes[i], d, sizeof d);
    float *a = forward(4, &meshes[i], M2_FIX, ref.a_text, M2_TA, "logits", NULL);
    float *b = forward(4, &meshes[i], M2_FIX, ref.b_text, M2_TB, "logits", NULL);
    double ea = m2_rel_err(a, ref.logits_a, M2_TA * M2_V), eb = m2_rel_err(b, ref.logits_b, M2_TB * M2_V);
    bool ok = ea <= M2_PARITY_BOUND && eb <= M2_PARITY_BOUND;
    printf("np 4, %-34s prompt a %.3g, prompt b %.3g (bound %.0e)%s\n", d, ea, eb, M2_PARITY_BOUND,
           ok ? "" : "  FAIL");
    bad += !ok;
    // The previous mesh is the same with the other dispatcher.
    if (prev && !strcmp(meshes[i].dispatch, "allreduce")) {
      double e = m2_rel_err(a, prev, M2_TA * M2_V);
      printf("    alltoall vs allreduce on this mesh: %.3g (bound %.0e)%s\n", e, AGREE_BOUND,
             e <= AGREE_BOUND ? "" : "  FAIL");
      bad += !(e <= AGREE_BOUND);
    }
    free(prev), free(b);
    prev = a;
  }
  free(prev);
  if (bad) fail_msg("%d of %d meshes differ", bad, n);
}

// 2. Data-parallel replicas run different prompts through one exchange: with
// identical prompts a token sent to the wrong replica would go unnoticed.
static void test_replicas_differ(void **state) {
  char tokens[512];
  char a5[128];
  m2_ids_text(ref.a, M2_TB, a5);  // prompt a's first 5 tokens: logits_a's first rows (causal)
  snprintf(tokens, sizeof tokens, "%s|%s", a5, ref.b_text);
  static const mesh meshes[] = {{"2", "2", "4", "1", "alltoall"}, {"1", "2", "2", "1", "alltoall"}};
  const int nps[] = {4, 2};
  for (int i = 0; i < 2; i++) {
    char d[96];
    describe(&meshes[i], d, sizeof d);
    float *r0 = forward(nps[i], &meshes[i], M2_FIX, tokens, M2_TB, "logits", NULL);
    float *r1 = forward(nps[i], &meshes[i], M2_FIX, tokens, M2_TB, "logits.1", NULL);
    double e0 = m2_rel_err(r0, ref.logits_a, M2_TB * M2_V), e1 = m2_rel_err(r1, ref.logits_b, M2_TB * M2_V);
    printf("np %d, %s: replica 0 (prompt a[:5]) %.3g, replica 1 (prompt b) %.3g\n", nps[i], d, e0, e1);
    assert_true(e0 <= M2_PARITY_BOUND && e1 <= M2_PARITY_BOUND);
    free(r0), free(r1);
  }
}

// A copy of the fixture whose routing bias sends every token to experts 0
// and 1 in every layer: under ep 4, ranks 1..3 own experts that get nothing.
static const char *biased_model(void) {
  static char dir[4200];
  snprintf(dir, sizeof dir, "%s/biased", tmp_dir);
  mkdir(dir, 0700);
  size_t len;
  char *cfg = tt_slurp(M2_FIX "/config.json", &len);
  tt_spit(tt_path(dir, "config.json"), cfg, len);
  free(cfg);
  unsigned char *st = (unsigned char *)tt_slurp(M2_FIX "/model.safetensors", &len);
  uint64_t hn;
  memcpy(&hn, st, 8);
  cJSON *h = cJSON_ParseWithLength((const char *)st + 8, (size_t)hn);
  assert_non_null(h);
  for (int L = 0; L < 2; L++) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.e_score_correction_bias", L);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(h, name);
    assert_non_null(t);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(t, "dtype")->valuestring, "F32");
    size_t at = 8 + (size_t)hn + (size_t)cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(t, "data_offsets"), 0)->valuedouble;
    float bias[8];
    memcpy(bias, st + at, sizeof bias);
    bias[0] += 100, bias[1] += 100;  // sigmoid is below 1: +100 always wins the top 2
    memcpy(st + at, bias, sizeof bias);
  }
  cJSON_Delete(h);
  tt_spit(tt_path(dir, "model.safetensors"), st, len);
  free(st);
  return dir;
}

static cJSON *layer_stats(cJSON *run, int L) {
  cJSON *ms = cJSON_GetObjectItemCaseSensitive(run, "moe_stats");
  assert_non_null(ms);
  return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ms, "layers"), L);
}

// 3. Every token to one rank's experts: no hang, no crash, the single-rank
// answer, and the statistics show the empty ranks.
static void test_zero_token_ranks(void **state) {
  const char *model = biased_model();
  const mesh alone = {"", "", "", "", ""};
  float *want = forward(0, &alone, model, ref.a_text, M2_TA, "logits", NULL);
  double against_ref = m2_rel_err(want, ref.logits_a, M2_TA * M2_V);
  printf("biased router, one rank, vs the unbiased reference: %.3g (the bias must change the answer)\n", against_ref);
  assert_true(against_ref > 1e-3);
  static const mesh meshes[] = {{"4", "", "4", "1", "alltoall"}, {"4", "", "4", "1", "allreduce"},
                                {"1", "4", "4", "1", "alltoall"}, {"2", "2", "2", "2", "alltoall"}};
  for (int i = 0; i < 4; i++) {
    char d[96];
    float *got = forward(4, &meshes[i], model, ref.a_text, M2_TA, "logits", NULL);
    double e = m2_rel_err(got, want, M2_TA * M2_V);
    printf("biased router, np 4, %s: vs one rank %.3g\n", describe(&meshes[i], d, sizeof d), e);
    assert_true(e <= M2_PARITY_BOUND);
    free(got);
  }
  free(want);
  cJSON *j = tt_json_of(RUN_ARGS(4, "run", "--model", model, "--prompt-ids", ref.a_text, "--max-new-tokens", "3",
                                 "--ep", "4", "--etp", "1", "--moe-stats", "--json"));
  cJSON *l0 = layer_stats(j, 0);
  const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(l0, "tokens_per_rank");
  // 11 prompt tokens + 2 decode steps, 2 assignments each, all on rank 0.
  assert_true(cJSON_GetArrayItem(ranks, 0)->valuedouble == 2 * (M2_TA + 2));
  for (int r = 1; r < 4; r++) assert_true(cJSON_GetArrayItem(ranks, r)->valuedouble == 0);
  assert_true(tt_json_num(l0, "rank_imbalance") == 4 && tt_json_num(l0, "expert_imbalance") == 4);
  cJSON_Delete(j);
}

static int64_t sum_array(const cJSON *a) {
  int64_t s = 0;
  for (int i = 0; i < cJSON_GetArraySize(a); i++) s += (int64_t)cJSON_GetArrayItem(a, i)->valuedouble;
  return s;
}

// `tpr run --moe-stats` of prompt a (+2 decode steps) on np ranks with extra flags.
static cJSON *run_stats(int np, const char *ep, const char *etp, const char *tp, const char *const *extra) {
  const char *args[32] = {"run", "--model", M2_FIX, "--prompt-ids", ref.a_text, "--max-new-tokens", "3",
                          "--moe-stats", "--json", "--ep", ep, "--etp", etp, "--tp", tp};
  int n = 15;
  for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
  return tt_json_of(run_np(np, args));
}

// 4. Capacity mode: C = ceil(11 * 2 * 0.5 / 8) = 2 rows per expert for the
// prompt, so some of its 22 assignments are dropped; the decision is taken
// from the replica's tokens, so every mesh gives the single-rank answer.
// Re-routing moves dropped assignments, reproducibly.
static void test_capacity(void **state) {
  const char *cap[] = {"--capacity-factor", "0.5", NULL};
  const char *rer[] = {"--capacity-factor", "0.5", "--reroute-dropped", "--reroute-seed", "7", NULL};
  const mesh alone = {"", "", "", "", ""};
  static const mesh meshes[] = {{"4", "", "4", "1", "alltoall"}, {"2", "2", "2", "2", "alltoall"},
                                {"4", "", "2", "2", "allreduce"}};
  float *dropless = forward(0, &alone, M2_FIX, ref.a_text, M2_TA, "logits", NULL);
  float *capped = forward(0, &alone, M2_FIX, ref.a_text, M2_TA, "logits", cap);
  float *rerouted = forward(0, &alone, M2_FIX, ref.a_text, M2_TA, "logits", rer);
  double e_drop = m2_rel_err(capped, dropless, M2_TA * M2_V), e_rer = m2_rel_err(rerouted, capped, M2_TA * M2_V);
  printf("capacity 0.5 vs dropless: %.3g; re-routed vs dropped: %.3g (both must differ)\n", e_drop, e_rer);
  assert_true(e_drop > 1e-3 && e_rer > 1e-3);
  for (int i = 0; i < 3; i++) {
    char d[96];
    describe(&meshes[i], d, sizeof d);
    float *c = forward(4, &meshes[i], M2_FIX, ref.a_text, M2_TA, "logits", cap);
    float *r = forward(4, &meshes[i], M2_FIX, ref.a_text, M2_TA, "logits", rer);
    double ec = m2_rel_err(c, capped, M2_TA * M2_V), er = m2_rel_err(r, rerouted, M2_TA * M2_V);
    printf("np 4, %s: capacity vs one rank %.3g, re-routed vs one rank %.3g\n", d, ec, er);
    assert_true(ec <= M2_PARITY_BOUND && er <= M2_PARITY_BOUND);
    free(c), free(r);
  }
  free(dropless), free(capped), free(rerouted);

  // Statistics: the same on one rank and on four; consistent with each other.
  for (int with_reroute = 0; with_reroute < 2; with_reroute++) {
    cJSON *one = run_stats(0, "1", "1", "1", with_reroute ? rer : cap);
    cJSON *four = run_stats(4, "4", "1", "4", with_reroute ? rer : cap);
    for (int L = 0; L < 2; L++) {
      cJSON *a = layer_stats(one, L), *b = layer_stats(four, L);
      double routed = tt_json_num(a, "routed"), dropped = tt_json_num(a, "dropped"), re = tt_json_num(a, "rerouted");
      printf("layer %d%s: routed %.0f dropped %.0f rerouted %.0f; np 4: %.0f %.0f %.0f\n", L,
             with_reroute ? " (re-routing)" : "", routed, dropped, re, tt_json_num(b, "routed"),
             tt_json_num(b, "dropped"), tt_json_num(b, "rerouted"));
      assert_true(routed == 2 * (M2_TA + 2));  // the prompt and two decode steps, top 2
      assert_true(dropped >= 2 * M2_TA - 8 * 2);  // 8 experts keep at most 2 of the prompt's 22; decode drops none
      assert_true(with_reroute ? re > 0 && re <= dropped : re == 0);
      const cJSON *pe = cJSON_GetObjectItemCaseSensitive(a, "tokens_per_expert");
      assert_true(sum_array(pe) == routed - dropped + re);
      assert_true(sum_array(cJSON_GetObjectItemCaseSensitive(b, "tokens_per_rank")) == routed - dropped + re);
      assert_true(tt_json_num(b, "routed") == routed && tt_json_num(b, "dropped") == dropped &&
                  tt_json_num(b, "rerouted") == re);
    }
    cJSON_Delete(one), cJSON_Delete(four);
  }
}

static void expect_fail(run_result r, const char *needle) {
  if (r.code == 0 || !strstr(r.err, needle))
    fail_msg("want a failure naming '%s'; exit %d\nstderr:\n%s", needle, r.code, r.err);
  tt_run_done(&r);
}

// 5. Flags that cannot work fail on every rank with a message, never a hang.
static void test_bad_flags(void **state) {
  expect_fail(RUN_ARGS(4, "forward", "--model", M2_FIX, "--tokens", "1,2", "--out", "/dev/null", "--ep", "3"),
              "--ep 3");
  expect_fail(RUN_ARGS(4, "forward", "--model", M2_FIX, "--tokens", "1,2", "--out", "/dev/null", "--tp", "3"),
              "--tp 3");
  expect_fail(RUN_ARGS(4, "forward", "--model", M2_FIX, "--tokens", "1,2", "--out", "/dev/null", "--moe-dispatch",
                       "nope"),
              "--moe-dispatch nope");
  expect_fail(RUN_ARGS(4, "forward", "--model", M2_FIX, "--tokens", "1,2", "--out", "/dev/null", "--tp", "2",
                       "--ep", "4", "--moe-dispatch", "allreduce"),
              "dp = 2");
  expect_fail(RUN_ARGS(0, "forward", "--model", M2_FIX, "--tokens", "1,2", "--out", "/dev/null", "--reroute-dropped"),
              "--reroute-dropped needs --capacity-factor");
  expect_fail(RUN_ARGS(0, "forward", "--model", M2_FIX, "--tokens", "1,2", "--out", "/dev/null", "--capacity-factor",
                       "-1"),
              "--capacity-factor");
  expect_fail(RUN_ARGS(2, "forward", "--model", M2_FIX, "--tokens", "1,2", "--tokens", "3", "--out", "/dev/null",
                       "--dp", "2"),
              "same length");
  expect_fail(RUN_ARGS(4, "forward", "--model", M2_FIX, "--tokens", "1,2", "--out", "/dev/null", "--ep", "16"),
              "--ep 16");
}

static int setup(void **state) {
  m2_ref_load(&ref);
  return 0;
}

int main(void) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_expert_parallel") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_factorizations), cmocka_unit_test(test_replicas_differ),
      cmocka_unit_test(test_zero_token_ranks), cmocka_unit_test(test_capacity), cmocka_unit_test(test_bad_flags),
  };
  int rc = cmocka_run_group_tests(tests, setup, NULL);
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
  if (system(cmd) != 0) return 1;
  return rc;
}
