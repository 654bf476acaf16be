// `tpr train` on the Qwen2-VL fixture against PyTorch (the text decoder of
// transformers' Qwen2VLForConditionalGeneration + torch.optim.AdamW +
// clip_grad_norm_, f32: scripts/reference/make_qwen2_vl_train_fixture.py,
// tests/fixtures/qwen2_vl_train). A dense model with q/k/v biases and
// sectioned MRoPE: no router, the loss is the cross-entropy alone. Every run
// passes the fixture's 3-D positions (an image-like grid inside text, so t,
// h and w differ and sectioned MRoPE's backward is exercised): step 0's loss
// and every parameter's gradient (the biases included) at tp 1, tp 2, tp 4
// (Q padded 6 -> 8, KV heads replicated 2 -> 4) and dp 2; the AdamW steps'
// losses and parameters, saved under the hub's names; a resume bit for bit;
// the text rule without --positions-3d; negative controls (1-D positions,
// the column inputs' backward all-reduce left out, the biases wrongly
// treated as replicated); refusals; and the CLI of a
// model without experts (plan, bench model, --moe-stats, the vision note).
#include "test_util.h"
#include "train_harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#define FIX TPR_FIXTURES "/qwen2_vl_train"
#define MODEL TPR_FIXTURES "/qwen2_vl_tiny"
#define POS FIX "/positions_3d.npy"
#define MIN_TENSORS 25  // every trained tensor of the 2-layer text decoder (27) is compared

static double aux(void) { return th_meta_at("model.router_aux_loss_coef", -1); }

static void test_step0_meshes(void **state) {
  (void)state;
  const th_mesh_case cases[] = {
      {1, MESH("--grad-accum", "2")},
      {2, MESH("--grad-accum", "2", "--tp", "2")},
      {4, MESH("--grad-accum", "2", "--tp", "4")},  // Q 6 -> 8 (padded), 2 KV heads replicated over 4 ranks
      {2, MESH("--dp", "2", "--tp", "1")},          // one window per replica
      {4, MESH("--dp", "2", "--tp", "2")},
  };
  assert_true(aux() == 0.0);  // the recipe: cross-entropy alone
  th_check_step0(cases, sizeof cases / sizeof *cases, aux(), MIN_TENSORS);
}

// Without --positions-3d the trainer gives every axis the sequence position
// (transformers' positions for text): step 0's loss equals PyTorch's with
// them; against the grid fixture the gradients must fail (the negative
// control: 1-D positions in place of the 3-D ones). No --aux-coef: the
// family's default is transformers' loss, the cross-entropy alone.
static void test_text_positions(void **state) {
  (void)state;
  const char *const *saved = th.run_args;
  th.run_args = NULL;
  double le;
  double g = th_step0(1, MESH("--grad-accum", "2"), aux(), NULL, MIN_TENSORS, &le);
  th.run_args = saved;
  const char *args[] = {"train", "--model", MODEL, "--data", FIX "/tokens.npy", "--data-order", "sequential",
                        "--seq-len", "16", "--grad-accum", "2", "--steps", "1", "--json", NULL};
  run_result r = tt_run(th.tpr, th.tmp_dir, args, &(tt_run_opts){.np = 1, .timeout_s = 120});
  assert_int_equal(r.code, 0);
  const char *at = strstr(r.out, "\"loss\":"), *ax = strstr(r.out, "\"aux\":");
  assert_non_null(at);
  assert_non_null(ax);
  double got = strtod(at + 7, NULL), want = th_meta_at("text_positions_step0_loss", -1), a = strtod(ax + 6, NULL);
  double text_err = fabs(got - want) / fabs(want);
  tt_run_done(&r);
  printf("  text positions: step-0 loss %.7f, PyTorch %.7f (rel err %.2e), aux %g; against the 3-D fixture: loss "
         "rel err %.2e, worst gradient %.2e (must exceed %.0e)\n", got, want, text_err, a, le, g, 100 * TH_GRAD_BOUND);
  assert_true(text_err <= TH_LOSS_BOUND);
  assert_true(a == 0.0);
  assert_true(g > 100 * TH_GRAD_BOUND);
}

// Negative controls at tp 2 (3 Q heads and 1 KV head per rank). The marks
// change only the backward: without the column inputs' all-reduce the
// gradients upstream of q/k/v are partial; the biases all-reduced as though
// replicated mix different heads' cotangents (each rank holds its own
// heads' slice). (The biases left out of the forward is test_qwen2_vl's
// control: in training the loss would not depend on them, which the
// backward refuses.)
static void test_controls_fail(void **state) {
  (void)state;
  double le;
  const char *const *tp2 = MESH("--grad-accum", "2", "--tp", "2");
  double col = th_step0(2, tp2, aux(), MESH("--debug-skip-grad-marks", "column"), MIN_TENSORS, &le);
  assert_true(le <= TH_LOSS_BOUND);
  double bias = th_step0(2, tp2, aux(), MESH("--debug-skip-grad-marks", "bias-wrong"), MIN_TENSORS, &le);
  assert_true(le <= TH_LOSS_BOUND);
  printf("  controls: column inputs' all-reduce left out %.2e, biases marked replicated %.2e (each must exceed "
         "%.0e)\n", col, bias, 100 * TH_GRAD_BOUND);
  assert_true(col > 100 * TH_GRAD_BOUND);
  assert_true(bias > 100 * TH_GRAD_BOUND);
}

// The fixture's AdamW steps (warmup, cosine decay, clipping; no decay on the
// biases) equal PyTorch's; the saved checkpoint is one transformers loads:
// its config names the family and its tensors carry the hub's names (the
// fixture's tiny checkpoint's, less the vision tower), the biases included.
static void test_steps(void **state) {
  (void)state;
  const char *const *meshes[] = {MESH("--grad-accum", "2"), MESH("--grad-accum", "2", "--tp", "4")};
  th_check_steps_meshes(2, (const int[]){1, 4}, meshes, aux(), MIN_TENSORS, "qwen2_vl");
}

static void test_resume_bit_identical(void **state) {
  (void)state;
  th_check_resume(4, aux());
}

static void test_refusals(void **state) {
  (void)state;
  th_check_refusal("positions for another length", 1,
                   MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "8", "--positions-3d",
                        POS),
                   "positions_3d.npy");
  th_check_refusal("an aux loss", 1,
                   MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "16", "--aux-coef",
                        "0.01"),
                   "qwen2_vl has no experts");
  th_check_refusal("expert parallelism", 2,
                   MESH("train", "--model", MODEL, "--data", FIX "/tokens.npy", "--seq-len", "16", "--tp", "1",
                        "--ep", "2"),
                   "no experts");
}

// The elements a decode step of one token reads on a rank at tp (f32: 4
// bytes each): q/k/v/o's head slices, the dense MLP's F/tp columns, the lm
// head's vocab shard; dense: false leaves the MLP out (what bench model
// counted before it knew dense layers; the negative control).
static double decode_bytes(int tp, bool dense) {
  const double H = 96, D = 16, F = 64, L = 2;
  double qr = tp == 4 ? 2 : 6.0 / tp, kr = tp >= 2 ? 1 : 2, vocab_padded = tp == 4 ? 92 : 90;
  double layer = (2 * qr + 2 * kr) * D * H + (dense ? 3 * F / tp * H : 0);
  return 4 * (L * layer + vocab_padded / tp * H);
}

// The CLI of a model without experts: plan prints what applies (no QK-norm
// divisors, no "0 experts top-0"), bench model counts the dense MLPs (its
// bytes per decode step against the hand count; no nan), --moe-stats is
// refused naming the family, run says the vision tower is not run.
// --save: the decoder under the names save_pretrained writes (the hub's
// model.layers.*) and the vision tower (visual.*) copied from the fixture.
static void test_save_transformers_layout(void **state) {
  (void)state;
  th_check_save_as_saved(POS);
}

static void test_cli(void **state) {
  (void)state;
  run_result r = tt_run(th.tpr, th.tmp_dir, MESH("plan", "--model", MODEL, "--tp", "4"), NULL);
  assert_int_equal(r.code, 0);
  printf("  plan: %.*s", (int)(strchr(strchr(strchr(r.out, '\n') + 1, '\n') + 1, '\n') - r.out + 1), r.out);
  assert_null(strstr(r.out, "qk-norm divisors"));
  assert_null(strstr(r.out, "experts"));
  assert_non_null(strstr(r.out, "no qk-norm"));
  assert_non_null(strstr(r.out, "dense MLP width 64"));
  tt_run_done(&r);
  cJSON *j = tt_json_of(tt_run(th.tpr, th.tmp_dir, MESH("plan", "--model", MODEL, "--tp", "1", "--json"), NULL));
  const cJSON *at = cJSON_GetObjectItemCaseSensitive(j, "attention");
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(at, "qk_norm")), "none");
  cJSON_Delete(j);

  const int tps[] = {1, 4};
  for (int i = 0; i < 2; i++) {
    char tp[8];
    snprintf(tp, sizeof tp, "%d", tps[i]);
    r = tt_run(th.tpr, th.tmp_dir,
               MESH("bench", "model", "--model", MODEL, "--tp", tp, "--batch", "1", "--prompt-len", "4", "--gen-len",
                    "4", "--json"),
               &(tt_run_opts){.np = tps[i], .timeout_s = 120});
    assert_int_equal(r.code, 0);
    assert_null(strstr(r.out, "nan"));
    assert_null(strstr(r.out, "inf"));
    j = tt_json_of(r);
    double got = tt_json_num(j, "machine_read_gbs_per_rank") * 1e9 * tt_json_num(j, "decode_tokens_per_step") /
                 tt_json_num(j, "decode_roofline_tok_s");
    double want = decode_bytes(tps[i], true), wrong = decode_bytes(tps[i], false);
    printf("  bench model tp %d: %.0f bytes per decode step, by hand %.0f (without the dense MLPs %.0f); prefill "
           "%.4g GF/s per rank\n", tps[i], got, want, wrong, tt_json_num(j, "prefill_gflops_per_rank"));
    assert_true(fabs(got - want) <= 1e-4 * want);
    assert_true(fabs(got - wrong) > 1e-2 * want);
    assert_true(tt_json_num(j, "prefill_gflops_per_rank") > 0);
    cJSON_Delete(j);
  }

  r = tt_run(th.tpr, th.tmp_dir, MESH("run", "--model", MODEL, "--prompt-ids", "1,2,3", "--max-new-tokens", "2"),
             NULL);
  assert_int_equal(r.code, 0);
  assert_non_null(strstr(r.err, "qwen2_vl runs its text decoder only"));
  tt_run_done(&r);
  th_check_refusal("--moe-stats", 1,
                   MESH("run", "--model", MODEL, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--moe-stats"),
                   "--moe-stats: qwen2_vl is a dense model");
}

static int setup(void **state) {
  (void)state;
  int rc = th_setup("test_train_qwen2_vl", "/tmp/tpr_test_train_qwen2_vl_XXXXXX", FIX, MODEL);
  static const char *const pos_args[] = {"--positions-3d", POS, NULL};  // outlives setup (a compound literal would not)
  th.run_args = pos_args;
  return rc;
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step0_meshes),
      cmocka_unit_test(test_text_positions),
      cmocka_unit_test(test_controls_fail),
      cmocka_unit_test(test_steps),
      cmocka_unit_test(test_resume_bit_identical),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_cli),
      cmocka_unit_test(test_save_transformers_layout),
  };
  return cmocka_run_group_tests(tests, setup, th_teardown);
}
