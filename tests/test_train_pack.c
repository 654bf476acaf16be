// `tpr train --pack` (packed documents, docs/training.md "Packed sequences")
// against PyTorch: transformers' own class run with a 4-D block-diagonal
// causal mask, position_ids restarting per document and the EOS inputs'
// targets at -100 (scripts/reference/make_pack_train_fixture.py,
// tests/fixtures/<family>_pack; Qwen2-VL's text decoder for an MRoPE family;
// MiniMax, whose lightning layers take no mask, as each document run alone
// through transformers' class and joined -- the lightning state must restart
// at every document's first token), one family per run:
// `test_train_pack qwen3_moe|minimax_m2|qwen2_vl|minimax`, registered as ctest
// test_train_pack_<family>. Step 0 of two windows with 2-3 EOS each (one at a
// window's first input): the loss within 1e-5 and the gradients of every
// attention, norm and router tensor (the fixture leaves out the MLPs, the
// embedding and the lm head to stay small) within 1e-4, at tp 1, tp 2 and dp 2
// (FSDP).
//
// Negative controls: without the attention mask (--debug-pack no-mask; for
// minimax also without the lightning state's reset, which the same input
// drives) the loss and the gradients must miss PyTorch's by far, and so must
// a run without --pack. Minimax alone: with the mask kept but the lightning
// state carried across documents (--debug-pack no-state-reset) they must
// miss as well; the other families refuse that control. Restarted positions cannot be seen under the mask (RoPE
// scores depend on position differences only, and the mask keeps both in one
// document: the fixture records that), so they are checked without it: the
// no-mask run's loss must equal PyTorch's with a plain causal mask and the
// restarted positions, and the same run with positions 0..T-1
// (--debug-pack no-mask-no-positions) must not. Validation (--eval-data)
// packs its windows as well and averages over the positions it scores.
#include "test_util.h"
#include "train_harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/npy.h"

typedef struct family {
  const char *name, *fix, *model;
  int min_tensors;  // tensors a gradient comparison must cover (more than this)
  bool lightning;   // lightning attention layers: their state restarts at each document
} family;

#define FIXTURE(dir) TPR_FIXTURES "/" dir
#define GA2 "--grad-accum", "2"

static const family families[] = {
    {"qwen3_moe", FIXTURE("qwen3_moe_pack"), FIXTURE("qwen3_moe_tiny"), 35, false},  // 36 kept: 4 layers' attention, norms, routers
    {"minimax_m2", FIXTURE("minimax_m2_pack"), FIXTURE("minimax_m2_tiny"), 18, false},  // 19 kept: 2 layers'
    // MRoPE: every row of positions_3d restarts alike (the text rule per document); dense, no aux loss.
    {"qwen2_vl", FIXTURE("qwen2_vl_pack"), FIXTURE("qwen2_vl_tiny"), 18, false},  // 19 kept: 2 layers' with q/k/v biases
    // Lightning layers 0, 2, 3 (qkv_proj, output_gate, out_proj, their norm) beside softmax layer 1.
    {"minimax", FIXTURE("minimax_pack"), FIXTURE("minimax_tiny"), 28, true},  // 29 kept: 4 layers', the final norm
};
static const family *F;

static double aux(void) { return th_meta_at("model.router_aux_loss_coef", -1); }

static char eos[16];
static const char *const *pack_args(const char *debug) {
  static const char *a[6];
  snprintf(eos, sizeof eos, "%d", (int)th_meta_at("data.eos_id", -1));
  a[0] = "--pack", a[1] = "--eos-id", a[2] = eos, a[3] = debug ? "--debug-pack" : NULL, a[4] = debug, a[5] = NULL;
  return a;
}

static void test_parity(void **state) {
  (void)state;
  // dp 2: one window per replica, FSDP where the family's program is built for it.
  const th_mesh_case cases[] = {{1, MESH(GA2)}, {2, MESH(GA2, "--tp", "2")}, {2, MESH("--dp", "2")}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    double le, ge = th_step0(cases[i].np, cases[i].mesh, aux(), pack_args(NULL), F->min_tensors, &le);
    assert_true(le <= TH_LOSS_BOUND);
    assert_true(ge <= TH_GRAD_BOUND);
  }
}

// Step 0's loss of one run at tp 1 with `extra`.
static double loss_of(const char *const *extra) {
  cJSON *steps = th_train(1, MESH(GA2), 1, aux(), extra);
  double l = th_step_num(steps, 0, "loss");
  cJSON_Delete(steps);
  return l;
}

static double rel(double got, double want) { return fabs(got - want) / fabs(want); }

static void test_controls(void **state) {
  (void)state;
  double le_mask, le_plain;
  const double ge_mask = th_step0(1, MESH(GA2), aux(), pack_args("no-mask"), F->min_tensors, &le_mask);
  const double ge_plain = th_step0(1, MESH(GA2), aux(), NULL, F->min_tensors, &le_plain);
  printf("  controls: no mask: loss rel err %.2e, worst gradient %.2e; no --pack: %.2e, %.2e (must exceed 1e-3 "
         "and %.0e)\n", le_mask, ge_mask, le_plain, ge_plain, 100 * TH_GRAD_BOUND);
  assert_true(le_mask > 1e-3 && ge_mask > 100 * TH_GRAD_BOUND);
  assert_true(le_plain > 1e-3 && ge_plain > 100 * TH_GRAD_BOUND);
  if (F->lightning) {  // the softmax mask kept, the lightning state carried across documents
    double le_state;
    const double ge_state = th_step0(1, MESH(GA2), aux(), pack_args("no-state-reset"), F->min_tensors, &le_state);
    printf("  control: lightning state not restarted at documents: loss rel err %.2e, worst gradient %.2e (must "
           "exceed 1e-3 and %.0e)\n", le_state, ge_state, 100 * TH_GRAD_BOUND);
    assert_true(le_state > 1e-3 && ge_state > 100 * TH_GRAD_BOUND);
  }

  // The positions, seen without the mask.
  const double want = th_meta_at("records.controls.no_mask.loss", -1);
  const double want_unrestarted = th_meta_at("records.controls.no_mask_no_restart.loss", -1);
  const double restarted = loss_of(pack_args("no-mask")), unrestarted = loss_of(pack_args("no-mask-no-positions"));
  printf("  positions (no mask): restarted vs PyTorch %.2e; 0..T-1 vs PyTorch's restarted %.2e (must exceed 1e-3), "
         "vs PyTorch's 0..T-1 %.2e\n", rel(restarted, want), rel(unrestarted, want), rel(unrestarted, want_unrestarted));
  assert_true(rel(restarted, want) <= TH_LOSS_BOUND);
  assert_true(rel(unrestarted, want) > 1e-3);
  assert_true(rel(unrestarted, want_unrestarted) <= TH_LOSS_BOUND);
}

// Validation packs its windows too (--eval-data): with the weights left as
// they are (lr 1e-30), the cross-entropy over the scored positions (EOS
// inputs skipped) equals PyTorch's, summed over the windows' scored
// positions and divided by their number (not the mean of the windows' means).
static void test_eval(void **state) {
  (void)state;
  char data[600];
  snprintf(data, sizeof data, "%s/tokens.npy", F->fix);
  const char *const *p = pack_args(NULL);
  const char *args[] = {"train", "--model", F->model, "--data", data, "--eval-data", data, "--seq-len", "16",
                        "--steps", "1", "--lr", "1e-30", "--min-lr", "1e-30", "--grad-accum", "2", "--json",
                        p[0], p[1], p[2], NULL};
  run_result r = tt_run(th.tpr, th.tmp_dir, args, &(tt_run_opts){.np = 1, .timeout_s = 120});
  if (r.code != 0) fail_msg("tpr train --eval-data: exit %d\n%s", r.code, r.err);
  double loss = NAN, tokens = 0;
  for (char *l = strtok(r.out, "\n"); l; l = strtok(NULL, "\n")) {
    cJSON *j = cJSON_Parse(l), *e = cJSON_GetObjectItemCaseSensitive(j, "eval");
    if (e) loss = tt_json_num(e, "loss"), tokens = tt_json_num(e, "tokens");
    cJSON_Delete(j);
  }
  tt_run_done(&r);
  const double want = th_meta_at("records.eval.loss", -1), means = th_meta_at("records.ce", 0);
  printf("  eval: %g scored positions, loss rel err %.2e (the mean of the windows' means is %.2e off)\n", tokens,
         rel(loss, want), rel(means, want));
  assert_true(tokens == th_meta_at("records.eval.scored", -1));
  assert_true(rel(loss, want) <= TH_LOSS_BOUND);
}

// Step 0's loss of a run at tp 1 on `data` with --pack and EOS id `eos`.
static double loss_on(const char *data, int eos) {
  char e[16];
  snprintf(e, sizeof e, "%d", eos);
  const char *args[64] = {"train", "--model", F->model, "--data", data, "--data-order", "sequential", "--seq-len",
                          "16", "--grad-accum", "2", "--json", "--pack", "--eos-id", e};
  int n = 15;
  th_add_hparams(args, &n, 1, aux());
  args[n] = NULL;
  run_result r = tt_run(th.tpr, th.tmp_dir, args, &(tt_run_opts){.np = 1, .timeout_s = 120});
  if (r.code != 0) fail_msg("tpr train --pack on %s: exit %d\n%s", data, r.code, r.err);
  double loss = NAN;
  for (char *l = strtok(r.out, "\n"); l && isnan(loss); l = strtok(NULL, "\n")) {
    cJSON *j = cJSON_Parse(l);
    if (cJSON_GetObjectItemCaseSensitive(j, "step")) loss = tt_json_num(j, "loss");
    cJSON_Delete(j);
  }
  tt_run_done(&r);
  return loss;
}

// Data that records its documents (X.docs.npy beside X.npy, as tpr data
// prepare writes) is packed by those starts, not by EOS: the fixture's
// tokens with the documents the EOS rule would find, and an EOS id that
// never occurs, give PyTorch's loss; one document start moved must not
// (nor must the same data without the offsets, which the EOS rule then
// leaves unpacked).
static void test_document_offsets(void **state) {
  (void)state;
  char src[600], data[700], docs[700];
  snprintf(src, sizeof src, "%s/tokens.npy", F->fix);
  snprintf(data, sizeof data, "%s/stream.npy", th.tmp_dir);
  snprintf(docs, sizeof docs, "%s/stream.docs.npy", th.tmp_dir);
  tpr_npy *in = NULL;
  assert_int_equal(tpr_npy_open(src, &in), TPR_OK);
  const int64_t n = tpr_npy_len(in);
  int32_t ids[256];
  int64_t off[258], n_off = 0;
  assert_true(n <= 256);
  assert_int_equal(tpr_npy_read_i32(in, 0, n, ids), TPR_OK);
  tpr_npy_close(in);
  const int eos = (int)th_meta_at("data.eos_id", -1);
  int unused = 0;  // an id the data never holds, as the EOS the rule would look for
  for (bool seen = true; seen; unused++) {
    seen = false;
    for (int64_t i = 0; i < n; i++) seen |= ids[i] == unused;
    if (!seen) break;
  }
  off[n_off++] = 0;
  for (int64_t i = 0; i + 1 < n; i++)
    if (ids[i] == eos) off[n_off++] = i + 1;  // where the EOS rule starts a document
  off[n_off++] = n;
  assert_true(n_off > 3);
  assert_int_equal(tpr_npy_write_i32(data, ids, n), TPR_OK);
  assert_int_equal(tpr_npy_write(docs, "<i8", off, n_off), TPR_OK);
  const double want = th_meta_at("records.loss", 0);
  const double by_offsets = loss_on(data, unused);
  off[1] += 1;  // the first document one token longer
  assert_int_equal(tpr_npy_write(docs, "<i8", off, n_off), TPR_OK);
  const double moved = loss_on(data, unused);
  assert_int_equal(remove(docs), 0);
  const double none = loss_on(data, unused);
  printf("  document offsets: loss rel err %.2e; a start moved %.2e, no offsets %.2e (must exceed 1e-3)\n",
         rel(by_offsets, want), rel(moved, want), rel(none, want));
  assert_true(rel(by_offsets, want) <= TH_LOSS_BOUND);
  assert_true(rel(moved, want) > 1e-3 && rel(none, want) > 1e-3);
}

static void test_refusals(void **state) {
  (void)state;
  char data[600];
  snprintf(data, sizeof data, "%s/tokens.npy", F->fix);
#define TRAIN "train", "--model", F->model, "--data", data, "--seq-len", "16", "--steps", "1"
  th_check_refusal("no EOS anywhere", 1, MESH(TRAIN, "--pack"), "give it with --eos-id N");
  th_check_refusal("EOS outside the vocabulary", 1, MESH(TRAIN, "--pack", "--eos-id", "100000"),
                   "the EOS id 100000 is outside the vocabulary [0, ");
  th_check_refusal("--eos-id without --pack", 1, MESH(TRAIN, "--eos-id", "3"), "--eos-id and --debug-pack go with --pack");
  th_check_refusal("a bad control", 1, MESH(TRAIN, "--pack", "--eos-id", "3", "--debug-pack", "x"),
                   "--debug-pack must be");
  if (!F->lightning)
    th_check_refusal("a lightning control without lightning layers", 1,
                     MESH(TRAIN, "--pack", "--eos-id", "3", "--debug-pack", "no-state-reset"),
                     "has no lightning attention layers");
  th_check_refusal("--pack with --positions-3d", 1, MESH(TRAIN, "--pack", "--eos-id", "3", "--positions-3d", data),
                   "give one or the other");
#undef TRAIN
}

static char test_name[64];

static int setup(void **state) {
  (void)state;
  char tmp[96];
  snprintf(tmp, sizeof tmp, "/tmp/tpr_%s_XXXXXX", test_name);
  return th_setup(test_name, tmp, F->fix, F->model);
}

int main(int argc, char **argv) {
  for (size_t i = 0; argc == 2 && i < sizeof families / sizeof *families; i++)
    if (!strcmp(argv[1], families[i].name)) F = &families[i];
  if (!F) {
    fprintf(stderr, "usage: test_train_pack qwen3_moe|minimax_m2|qwen2_vl|minimax\n");
    return 2;
  }
  tt_seed_from_env();
  snprintf(test_name, sizeof test_name, "test_train_pack_%s", F->name);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parity),
      cmocka_unit_test(test_controls),
      cmocka_unit_test(test_eval),
      cmocka_unit_test(test_document_offsets),
      cmocka_unit_test(test_refusals),
  };
  return _cmocka_run_group_tests(test_name, tests, sizeof tests / sizeof *tests, setup, th_teardown);
}
