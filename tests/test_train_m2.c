// `tpr train` on the MiniMax-M2 fixture against PyTorch (transformers'
// MiniMaxM2ForCausalLM + torch.optim.AdamW + clip_grad_norm_, f32:
// scripts/reference/make_train_fixture.py, tests/fixtures/minimax_m2_train):
// step 0's loss and every parameter's gradient at tp 1/2/4 and at expert-
// and data-parallel foldings; 10 AdamW steps' losses and parameters; resume
// from step 5 bit for bit; negative controls (a missing backward all-reduce
// must fail the gradient bound); bad input.
#include "test_util.h"
#include "train_harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "shard/safetensors.h"

#define FIX TPR_FIXTURES "/minimax_m2_train"
#define MODEL TPR_FIXTURES "/minimax_m2_tiny"
#define MIN_TENSORS 0  // every tensor of want is compared, however many

// The fixture's aux-loss weight: every run here passes PyTorch's.
static double aux(void) { return th_meta_at("model.router_aux_loss_coef", -1); }

static void test_step0_tensor_parallel(void **state) {
  // dp 1 here: both windows of step 0 run on every replica as 2 micro-steps.
  const th_mesh_case cases[] = {
      {1, MESH("--grad-accum", "2")},
      {2, MESH("--grad-accum", "2", "--tp", "2")},
      {4, MESH("--grad-accum", "2", "--tp", "4")},  // Q 6->8 padded interleaved, KV 2->4 replicated
      {4, MESH("--grad-accum", "2", "--tp", "4", "--moe-dispatch", "alltoall")},
  };
  th_check_step0(cases, sizeof cases / sizeof *cases, aux(), MIN_TENSORS);
}

static void test_step0_expert_and_data_parallel(void **state) {
  const th_mesh_case cases[] = {
      {4, MESH("--grad-accum", "2", "--tp", "4", "--ep", "2", "--etp", "2")},
      {4, MESH("--grad-accum", "2", "--tp", "4", "--ep", "4", "--etp", "1")},
      {4, MESH("--grad-accum", "2", "--tp", "4", "--ep", "2", "--etp", "1")},  // edp 2: disjoint token slices
      {2, MESH("--dp", "2", "--tp", "1", "--ep", "2")},                         // one window per replica
      {4, MESH("--dp", "2", "--tp", "2", "--ep", "2", "--etp", "2")},
      {4, MESH("--dp", "2", "--tp", "2", "--ep", "4", "--etp", "1")},
  };
  th_check_step0(cases, sizeof cases / sizeof *cases, aux(), MIN_TENSORS);
}

// Negative controls: without the backward all-reduce of the QK-norm, or of
// the column-parallel inputs, the tp 4 gradients are wrong (the forward and
// so the loss are unchanged).
static void test_missing_grad_all_reduce_fails(void **state) {
  const char *const *tp4 = MESH("--grad-accum", "2", "--tp", "4");
  double le, qk = th_step0(4, tp4, aux(), MESH("--debug-skip-grad-marks", "qk-norm"), MIN_TENSORS, &le);
  assert_true(le <= TH_LOSS_BOUND);
  double col = th_step0(4, tp4, aux(), MESH("--debug-skip-grad-marks", "column"), MIN_TENSORS, &le);
  assert_true(le <= TH_LOSS_BOUND);
  printf("  controls: without the QK-norm's backward all-reduce %.2e, without the column inputs' %.2e "
         "(both must exceed %.0e)\n", qk, col, 100 * TH_GRAD_BOUND);
  assert_true(qk > 100 * TH_GRAD_BOUND);
  assert_true(col > 100 * TH_GRAD_BOUND);
}

// Ten AdamW steps (warmup, cosine decay, clipping) equal PyTorch's.
static void test_ten_steps(void **state) {
  int total = (int)th_meta_at("optimizer.steps", -1);
  const char *const *meshes[] = {MESH("--grad-accum", "2"), MESH("--grad-accum", "2", "--tp", "4")};
  int nps[] = {1, 4};
  for (int m = 0; m < 2; m++)
    th_check_steps(nps[m], meshes[m], total, aux(), tt_path(th.tmp_dir, m ? "ten_tp4" : "ten_tp1"), MIN_TENSORS);
}

// A run stopped after step 5 and resumed from its checkpoint reaches the
// uninterrupted run's step-10 weights and moments bit for bit.
static void test_resume_bit_identical(void **state) { th_check_resume((int)th_meta_at("optimizer.steps", -1), aux()); }

// A random-order run resumed with neither --seed nor --data-order reads on
// in the checkpoint's order (trainer_state.json) and ends as the
// uninterrupted run; asking for another seed on --resume is refused.
// Control: the same schedule with another seed ends elsewhere, so the
// comparison depends on the order.
static void test_resume_keeps_data_order(void **state) {
  const int total = 4;
  const char *full = tt_path(th.tmp_dir, "order_full"), *half = tt_path(th.tmp_dir, "order_half");
  const char *rest = tt_path(th.tmp_dir, "order_rest"), *other = tt_path(th.tmp_dir, "order_other");
  const char *const *mesh = MESH("--grad-accum", "2");
  cJSON_Delete(th_train(1, mesh, total, aux(), MESH("--save", full, "--data-order", "random", "--seed", "7")));
  cJSON_Delete(th_train(1, mesh, total, aux(), MESH("--save", other, "--data-order", "random", "--seed", "8")));
  run_result stopped;
  cJSON *a = th_train_n(1, mesh, total, total / 2, aux(),
                        MESH("--save", half, "--stop-after", "2", "--data-order", "random", "--seed", "7"), &stopped);
  assert_non_null(a);
  cJSON_Delete(a);
  tt_run_done(&stopped);
  // No --data-order and no --seed: both come from the checkpoint.
  run_result r = th_resume(1, half, rest, mesh, total, aux(), NULL, 240);
  if (r.code != 0) fail_msg("resume failed: %s", r.err);
  tt_run_done(&r);
  size_t la, lb, lc;
  char *x = tt_slurp(tt_path(full, "model.safetensors"), &la), *y = tt_slurp(tt_path(rest, "model.safetensors"), &lb);
  char *z = tt_slurp(tt_path(other, "model.safetensors"), &lc);
  bool same = la == lb && !memcmp(x, y, la), control_differs = la != lc || memcmp(x, z, la) != 0;
  printf("  random order, seed 7, resumed without --seed: %s; seed 8 instead: %s\n", same ? "identical" : "DIFFERS",
         control_differs ? "differs (control)" : "SAME");
  assert_true(same);
  assert_true(control_differs);
  free(x), free(y), free(z);
  r = th_resume(1, half, rest, mesh, total, aux(), MESH("--seed", "8"), 240);
  printf("  resume asking for seed 8: exit %d: %s", r.code, r.err);
  assert_int_equal(r.code, 2);
  assert_non_null(strstr(r.err, "seed 7"));
  tt_run_done(&r);
}

// A save that died half-way leaves "<dir>.tmp" behind and the previous
// checkpoint whole: resuming from it works, and the next save clears the
// leftover and publishes a whole new checkpoint.
static void test_interrupted_save(void **state) {
  const char *dir = tt_path(th.tmp_dir, "ckpt"), *tmp = tt_path(th.tmp_dir, "ckpt.tmp");
  const char *const *mesh = MESH("--grad-accum", "2");
  cJSON_Delete(th_train(1, mesh, 2, aux(), MESH("--save", dir)));
  size_t len;
  char *before = tt_slurp(tt_path(dir, "model.safetensors"), &len);
  // What a process killed in the middle of writing leaves: a partial directory.
  assert_int_equal(mkdir(tmp, 0755), 0);
  tt_spit(tt_path(tmp, "model.safetensors"), before, len / 3);
  tt_spit(tt_path(tmp, "optim-rank-00000-of-00001.safetensors"), "garbage", 7);
  size_t len2;
  char *still = tt_slurp(tt_path(dir, "model.safetensors"), &len2);
  assert_true(len2 == len && !memcmp(before, still, len));
  free(still);
  run_result r = th_resume(1, dir, dir, mesh, 3, aux(), MESH("--data-order", "sequential"), 120);
  if (r.code != 0) fail_msg("resume after an interrupted save failed: %s", r.err);
  tt_run_done(&r);
  struct stat st;
  assert_true(stat(tmp, &st) != 0);  // the leftover is gone
  char *after = tt_slurp(tt_path(dir, "trainer_state.json"), NULL);
  assert_non_null(strstr(after, "\"step\":\t3") ? after : strstr(after, "\"step\": 3"));
  free(after), free(before);
  printf("  interrupted save: previous checkpoint intact, resumed, leftover cleared, step 3 published\n");
}

// f32 tensor `name` of a safetensors file (malloc'ed), *n its elements.
static float *read_tensor(const char *path, const char *name, int64_t *n) {
  tpr_st_set *set;
  TT_OK(tpr_st_open(path, &set));
  const tpr_st_tensor *t = tpr_st_find(set, name);
  if (!t || t->ndim != 1) fail_msg("%s: no 1-D %s", path, name);
  *n = t->shape[0];
  float *x = malloc((size_t)*n * sizeof *x);
  TT_OK(tpr_st_read_f32(set, name, (const int64_t[]){0}, t->shape, x));
  tpr_st_close(set);
  return x;
}

// Aux-loss-free balancing: after a step every routing bias moved by exactly
// +-rate or 0 (towards the mean load), and the same on every mesh.
static void test_bias_update(void **state) {
  const double rate = 1.0 / 1024;  // b +- rate rounds by at most half an ulp of |b| < 4: 2.4e-7
  char r[32];
  snprintf(r, sizeof r, "%.17g", rate);
  const char *one = tt_path(th.tmp_dir, "bias_tp1"), *four = tt_path(th.tmp_dir, "bias_tp4");
  cJSON_Delete(th_train(1, MESH("--grad-accum", "2"), 1, aux(), MESH("--save", one, "--bias-update-rate", r)));
  cJSON_Delete(th_train(4, MESH("--grad-accum", "2", "--tp", "4", "--ep", "2", "--etp", "2"), 1, aux(),
                        MESH("--save", four, "--bias-update-rate", r)));
  int up = 0, down = 0;
  for (int L = 0; L < 2; L++) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.e_score_correction_bias", L);
    int64_t n0, n1, n4;
    float *b0 = read_tensor(MODEL "/model.safetensors", name, &n0), *b1 = read_tensor(tt_path(one, "model.safetensors"), name, &n1),
          *b4 = read_tensor(tt_path(four, "model.safetensors"), name, &n4);
    assert_true(n0 == n1 && n1 == n4);
    for (int64_t e = 0; e < n0; e++) {
      double d = (double)b1[e] - b0[e];
      assert_true(b1[e] == b4[e]);  // identical on both meshes
      assert_true(fabs(fabs(d) - rate) <= 2.4e-7 || d == 0);
      up += d > 0, down += d < 0;
    }
    free(b0), free(b1), free(b4);
  }
  printf("  bias update: %d biases up, %d down by %.3g, identical at tp 1 and tp 4 x ep 2\n", up, down, rate);
  assert_true(up > 0 && down > 0);
}

// A 1-D '<i4' .npy file of ids.
static void write_npy_i32(const char *path, const int32_t *v, int n) {
  char hdr[128];
  int len = snprintf(hdr, sizeof hdr, "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }", n);
  while ((10 + len + 1) % 64) hdr[len++] = ' ';
  hdr[len++] = '\n';
  size_t total = 10 + (size_t)len + 4 * (size_t)n;
  unsigned char *b = malloc(total);
  memcpy(b, "\x93NUMPY\x01\x00", 8);
  b[8] = (unsigned char)(len & 255), b[9] = (unsigned char)(len >> 8);
  memcpy(b + 10, hdr, (size_t)len);
  memcpy(b + 10 + len, v, 4 * (size_t)n);
  tt_spit(path, b, total);
  free(b);
}

static void test_bad_input(void **state) {
  const char *bad_npy = tt_path(th.tmp_dir, "bad.npy");
  tt_spit(bad_npy, "\x93NUMPY\x01\x00garbage", 15);
  const char *big = tt_path(th.tmp_dir, "big_ids.npy");
  int32_t ids[40];
  for (int i = 0; i < 40; i++) ids[i] = i == 23 ? 256 : i;  // 256 = the fixture's vocabulary size
  write_npy_i32(big, ids, 40);
  struct {
    const char *what;
    int np;
    const char *const *args;
    const char *expect;
  } cases[] = {
      {"corrupt npy", 1, MESH("train", "--model", MODEL, "--data", bad_npy, "--seq-len", "16"), "npy"},
      {"short data", 1, MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "4096"), "short"},
      {"tp not dividing", 2, MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--tp", "3"), "tp"},
      {"unwritable save", 1,
       MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "16", "--steps", "1", "--save",
            "/proc/tpr-cannot-write-here"),
       "cannot"},
      {"no data", 1, MESH("train", "--model", MODEL), "--data"},
      {"id past the vocabulary", 2, MESH("train", "--model", MODEL, "--data", big, "--seq-len", "16"), "256"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    th_check_refusal(cases[i].what, cases[i].np, cases[i].args, cases[i].expect);
}

static int setup(void **state) {
  (void)state;
  return th_setup("test_train_m2", "/tmp/tpr_test_train_XXXXXX", FIX, MODEL);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step0_tensor_parallel),  cmocka_unit_test(test_step0_expert_and_data_parallel),
      cmocka_unit_test(test_missing_grad_all_reduce_fails), cmocka_unit_test(test_ten_steps),
      cmocka_unit_test(test_resume_bit_identical),    cmocka_unit_test(test_interrupted_save),
      cmocka_unit_test(test_resume_keeps_data_order),
      cmocka_unit_test(test_bias_update),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, setup, th_teardown);
}
