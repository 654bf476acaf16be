// `tpr train` on the Hunyuan-MoE fixture against PyTorch (transformers'
// HunYuanMoEV1ForCausalLM + torch.optim.AdamW + clip_grad_norm_, f32:
// scripts/reference/make_hunyuan_train_fixture.py, tests/fixtures/hunyuan_moe_train):
// step 0's loss and every parameter's gradient at tp 1, tp 2, tp 4 (KV heads
// replicated), expert-parallel, tp x ep and data-parallel meshes; the AdamW
// steps' losses and parameters; a resume bit for bit; negative controls (the
// shared expert's backward all-reduce left out, the per-head norm moved
// before RoPE, the norm weights' all-reduce left out must fail the gradient
// bound); refusals (the capacity path, 3-D positions; FSDP: tests/test_fsdp_qkhd.c).
// The family trains on the cross-entropy alone (transformers' model has no
// aux loss): the fixture's coef is 0, and tpr's default for the family too.
#include "test_util.h"
#include "train_harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIX TPR_FIXTURES "/hunyuan_moe_train"
#define MODEL TPR_FIXTURES "/hunyuan_moe_tiny"
#define MIN_TENSORS 100  // every trained tensor of the 3-layer fixture (111) is compared

static double aux(void) { return th_meta_at("model.router_aux_loss_coef", -1); }

static void test_step0_meshes(void **state) {
  (void)state;
  const th_mesh_case cases[] = {
      {1, MESH("--grad-accum", "2")},
      {2, MESH("--grad-accum", "2", "--tp", "2")},
      {4, MESH("--grad-accum", "2", "--tp", "4")},  // 2 KV heads replicated over 4 ranks
      {2, MESH("--grad-accum", "2", "--tp", "2", "--ep", "2", "--etp", "1")},  // tp 2 x ep 2 (folded)
      {4, MESH("--grad-accum", "2", "--tp", "4", "--ep", "2", "--etp", "2")},
      {2, MESH("--dp", "2", "--tp", "1", "--ep", "2")},  // one window per replica
      {4, MESH("--dp", "2", "--tp", "2", "--ep", "2", "--etp", "1", "--moe-dispatch", "alltoall")},
  };
  assert_true(aux() == 0.0);  // the recipe: cross-entropy alone
  th_check_step0(cases, sizeof cases / sizeof *cases, aux(), MIN_TENSORS);
}

// tpr's own default for the family is transformers' loss: no --aux-coef,
// the same step-0 loss (a load-balancing term would add coef x ~2.3).
static void test_default_aux_is_zero(void **state) {
  (void)state;
  char data[600];
  snprintf(data, sizeof data, "%s/tokens.npy", FIX);
  const char *args[] = {"train", "--model", MODEL, "--data", data, "--data-order", "sequential", "--seq-len", "16",
                        "--grad-accum", "2", "--steps", "1", "--json", NULL};
  run_result r = tt_run(th.tpr, th.tmp_dir, args, &(tt_run_opts){.np = 1, .timeout_s = 120});
  assert_int_equal(r.code, 0);
  const char *at = strstr(r.out, "\"loss\":");
  assert_non_null(at);
  double got = strtod(at + 7, NULL), want = th_meta_at("records.loss", 0);
  printf("  default --aux-coef: step-0 loss %.7f, PyTorch %.7f\n", got, want);
  assert_true(fabs(got - want) <= 1e-5 * fabs(want));
  tt_run_done(&r);
}

// Negative controls at tp 2. The marks change only the backward: without the
// shared expert's input all-reduce (or the norm weights') the gradients
// upstream of it are partial. The norm on the other side of RoPE (Qwen3's
// order) changes the forward too.
static void test_controls_fail(void **state) {
  (void)state;
  double le;
  const char *const *tp2 = MESH("--grad-accum", "2", "--tp", "2");
  double shared = th_step0(2, tp2, aux(), MESH("--debug-skip-grad-marks", "shared-mlp"), MIN_TENSORS, &le);
  assert_true(le <= TH_LOSS_BOUND);
  double qk = th_step0(2, tp2, aux(), MESH("--debug-skip-grad-marks", "qk-norm"), MIN_TENSORS, &le);
  assert_true(le <= TH_LOSS_BOUND);
  double order = th_step0(2, tp2, aux(), MESH("--debug-per-rank-qk-norm"), MIN_TENSORS, &le);
  printf("  controls: shared expert's all-reduce left out %.2e, norm weights' %.2e; norm before RoPE %.2e "
         "(loss rel err %.2e) (each gradient error must exceed %.0e)\n", shared, qk, order, le, 100 * TH_GRAD_BOUND);
  assert_true(shared > 100 * TH_GRAD_BOUND);
  assert_true(qk > 100 * TH_GRAD_BOUND);
  assert_true(order > 100 * TH_GRAD_BOUND);
}

// The fixture's AdamW steps (warmup, cosine decay, clipping) equal PyTorch's.
static void test_steps(void **state) {
  (void)state;
  const char *const *meshes[] = {MESH("--grad-accum", "2"),
                                 MESH("--grad-accum", "2", "--tp", "2", "--ep", "2", "--etp", "1")};
  th_check_steps_meshes(2, (const int[]){1, 2}, meshes, aux(), MIN_TENSORS, "hunyuan_v1_moe");
}

static void test_resume_bit_identical(void **state) {
  (void)state;
  th_check_resume(4, aux());
}

static void test_refusals(void **state) {
  (void)state;
  th_check_refusal("capacity path", 1,
                   MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "16",
                        "--capacity-factor", "1.0"),
                   "--capacity-factor 1 has no backward");
  th_check_refusal("3-D positions", 1,
                   MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "16", "--positions-3d",
                        TPR_FIXTURES "/qwen3_vl_moe_train/positions_3d.npy"),
                   "--positions-3d is for MRoPE families");
}

static int setup(void **state) {
  (void)state;
  return th_setup("test_train_hunyuan", "/tmp/tpr_test_train_hunyuan_XXXXXX", FIX, MODEL);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step0_meshes),
      cmocka_unit_test(test_default_aux_is_zero),
      cmocka_unit_test(test_controls_fail),
      cmocka_unit_test(test_steps),
      cmocka_unit_test(test_resume_bit_identical),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, th_teardown);
}
