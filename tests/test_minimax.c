// MiniMax (models/minimax.h: lightning attention layers beside softmax
// attention layers, MoE) through the engine's session against transformers'
// MiniMaxForCausalLM (tests/fixtures/minimax_tiny, made by
// scripts/reference/make_minimax_fixture.py: layer_types linear, full, linear,
// linear, block_size 4, residual factors all != 1), under mpirun at the mesh
// on the command line (--tp/--dp/--ep):
//  - parity: the whole-sequence forward's logits of both prompts (11 tokens:
//    two whole blocks and a partial one; 5 tokens) within 1e-4 of max |logit|,
//    on that fixture and on tests/fixtures/minimax_tiny_b (linear, linear,
//    full; block_size 3; 8 heads, 4 KV heads; top-3 of 8 experts; tied
//    embeddings; other residual factors);
//  - negative control (tp > 1): the lightning layers' RMSNorm over the rank's
//    heads alone (no all-reduce of the sums of squares, the divisor of the
//    rank's slice) must break the bound -- the norm is over the whole heads*D
//    hidden; at tp 1 the control builds the same program as the model, so
//    the two must agree instead;
//  - the program holds, per lightning layer, exactly one collective between
//    its attention and its out_proj (the norm's all-reduce) at tp 2, none
//    with the control;
//  - the state slots: a prefill then greedy decode one token per call
//    through the session equals transformers' generate (tokens; logits within
//    1e-4) and one whole forward (1e-5); the batched engine's two sequences
//    generate transformers' greedy tokens (tpr run's path);
//  - refusals with a clear error: head counts that do not divide tp, configs
//    the family does not build.
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "family_parity.h"
#include "models/minimax.h"
#include "runtime/ops.h"
#include "shard/model_config.h"

#define FIX TPR_FIXTURES "/minimax_tiny"
#define FIX_B TPR_FIXTURES "/minimax_tiny_b"  // another hybrid: linear, linear, full; block 3; 8 heads; tied
#define BOUND 1e-4  // max|d| <= BOUND * max|ref|: the TP parity tolerance of every family
#define KV_BOUND 1e-5  // decode through the state slots vs one whole-sequence forward

static fp_ref ref, ref_b;

static tpr_session_opts session_opts_of(const char *dir, const fp_ref *r, bool control) {
  tpr_session_opts o = fp_session_opts(dir, r->ta + r->ng);
  o.per_rank_qk_norm = control;  // the family's control: the lightning norm per rank
  return o;
}

static tpr_session_opts session_opts(bool control) { return session_opts_of(FIX, &ref, control); }

static void parity_and_control(const char *dir, const fp_ref *r) {
  tpr_session_opts o = session_opts_of(dir, r, false);
  if (fp.R == 0) printf("%s:\n", dir);
  fp_test_parity(&o, r, BOUND);
  o = session_opts_of(dir, r, true);
  if (fp.R == 0) printf("control: the lightning norm over each rank's heads only, tp %d:\n", fp.tp);
  if (fp.tp > 1)
    fp_test_control(&o, r, BOUND, "the lightning norm without its all-reduce");
  else
    fp_test_parity(&o, r, BOUND);  // one rank holds every head: the same norm
}

static void test_parity(void **state) {
  (void)state;
  parity_and_control(FIX, &ref);
}

static void test_parity_b(void **state) {
  (void)state;
  parity_and_control(FIX_B, &ref_b);
}

// The lightning states carried in the session's state slot 0 across calls:
// a random prefill, then greedy decode one token per call, equal to
// transformers' generate with its cache (tokens, and logits within BOUND),
// and to one whole-sequence forward within KV_BOUND (the state of a chunked
// prefill equals one call's to rounding). On both fixtures (block 4 and 3).
static void test_greedy_cached(void **state) {
  (void)state;
  tpr_session_opts o = session_opts(false);
  fp_test_greedy_cached(&o, &ref, BOUND, KV_BOUND);
  o = session_opts_of(FIX_B, &ref_b, false);
  fp_test_greedy_cached(&o, &ref_b, BOUND, KV_BOUND);
}

// tpr run's path: the batched engine, two sequences of prompt a in one
// batch (two state slots), each generating transformers' greedy tokens.
static void test_engine_greedy(void **state) {
  (void)state;
  fp_test_engine_text(FIX, ref.a, ref.ta, ref.greedy, ref.greedy_logits, ref.ng, ref.V, BOUND);
  fp_test_engine_text(FIX_B, ref_b.a, ref_b.ta, ref_b.greedy, ref_b.greedy_logits, ref_b.ng, ref_b.V, BOUND);
}

// ---- the norm's all-reduce in the built program (rank 0 builds only)

static bool is_collective(tpr_op_kind k) {
  return k == TPR_OP_ALL_REDUCE || k == TPR_OP_ALL_GATHER || k == TPR_OP_REDUCE_SCATTER || k == TPR_OP_ALL_TO_ALL ||
         k == TPR_OP_ALL_TO_ALLV || k == TPR_OP_PARAM_GATHER;
}

// Collectives in program order between each lightning_paged node and the
// next matmul reading that layer's out_proj param.
static int norm_collectives(const tpr_program *p, int64_t *layers) {
  int count = 0, in_layer = 0;
  *layers = 0;
  for (int n = 0; n < tpr_program_num_nodes(p); n++) {
    tpr_op_kind k = tpr_program_node_op(p, n);
    const tpr_value_id *in;
    int n_in;
    tpr_value_id out;
    TT_OK(tpr_program_node_io(p, n, &in, &n_in, &out));
    if (k == TPR_OP_LIGHTNING_PAGED) in_layer = 1, ++*layers;
    for (int i = 0; in_layer && i < n_in; i++) {
      const char *name = tpr_program_value_name(p, in[i]);
      if (name && strstr(name, "out_proj")) in_layer = 0;
    }
    if (in_layer && is_collective(k)) count++;
  }
  return count;
}

static void test_norm_allreduce_in_program(void **state) {
  (void)state;
  if (fp.R != 0) return;
  tpr_model_config cfg;
  tpr_shard_plan plan;
  TT_OK(tpr_model_config_load(FIX, &cfg));
  TT_OK(tpr_shard_plan_build(&cfg, 2, 1, 2, 1, TPR_F32, &plan));  // tp 2
  tpr_minimax_opts o = {.step = {.shape = {.tokens = 4, .samples = 2, .batch = 1, .max_blocks = 2,
                                              .pool_blocks = 4, .block_size = 4, .state_slots = 1}}};
  int got[2];
  int64_t layers[2];
  for (int c = 0; c < 2; c++) {
    tpr_program *p = NULL;
    o.control = c ? TPR_MINIMAX_CONTROL_LOCAL_NORM : TPR_MINIMAX_CONTROL_NONE;
    TT_OK(tpr_minimax_build(&plan, &o, &p));
    got[c] = norm_collectives(p, &layers[c]);
    tpr_program_free(p);
  }
  printf("tp 2 program: %d collectives between lightning attention and out_proj over %lld lightning layers "
         "(want one each); the control: %d (want 0)\n", got[0], (long long)layers[0], got[1]);
  assert_int_equal(layers[0], cfg.num_linear_layers);
  assert_int_equal(got[0], cfg.num_linear_layers);
  assert_int_equal(got[1], 0);
  tpr_shard_plan_free(&plan);
}

// ---- refusals of the config and the plan (rank 0)

static tpr_status parse_edited(const char *from, const char *to, tpr_model_config *c) {
  char path[512];
  snprintf(path, sizeof path, "%s/config.json", FIX);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static char text[1 << 16], edited[1 << 16];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  char *at = strstr(text, from);
  assert_non_null(at);
  snprintf(edited, sizeof edited, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
  return tpr_model_config_parse(edited, strlen(edited), "edited", c);
}

static void test_refusals(void **state) {
  (void)state;
  if (fp.R != 0) return;
  tpr_model_config cfg;
  tpr_shard_plan plan;
  TT_OK(tpr_model_config_load(FIX, &cfg));
  assert_int_equal(cfg.family, TPR_FAMILY_MINIMAX);
  assert_int_equal(cfg.num_linear_layers, 3);
  assert_true(tpr_model_config_layer_is_linear(&cfg, 0) && !tpr_model_config_layer_is_linear(&cfg, 1));
  assert_int_equal(cfg.linear_block_size, 4);
  assert_true(cfg.attn_alpha[1] == 1.5 && cfg.attn_beta[0] == 1.25 && cfg.mlp_beta == 0.9);
  // 4 heads over tp 3: the lightning heads cannot split.
  tpr_status rc = tpr_shard_plan_build(&cfg, 3, 1, 1, 1, TPR_F32, &plan);
  assert_int_equal(rc, TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "lightning attention heads do not split over tp=3"));
  printf("refused: %s\n", tpr_last_error());
  struct {
    const char *from, *to, *says;
    tpr_status want;
  } bad[] = {
      {"\"sliding_window\": null", "\"sliding_window\": 8", "sliding_window", TPR_ERR_UNSUPPORTED},
      {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act", TPR_ERR_UNSUPPORTED},
      {"\"block_size\": 4", "\"block_size\": 0", "block_size", TPR_ERR_FORMAT},
      {"\"full_attention\"", "\"sliding_attention\"", "layer_types", TPR_ERR_FORMAT},
      {"\"linear_attention\",\n    \"full_attention\",", "\"full_attention\",", "layer_types", TPR_ERR_FORMAT},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rc = parse_edited(bad[i].from, bad[i].to, &cfg);
    if (rc != bad[i].want || !strstr(tpr_last_error(), bad[i].says))
      fail_msg("%s -> %s: status %d, \"%s\"", bad[i].from, bad[i].to, (int)rc, tpr_last_error());
    printf("refused: %s\n", tpr_last_error());
  }
  // No layer_types: MiniMaxConfig's default alternation (full on even layers).
  TT_OK(parse_edited("\"layer_types\"", "\"layer_types_unused\"", &cfg));
  assert_int_equal(cfg.num_linear_layers, 2);
  assert_true(!tpr_model_config_layer_is_linear(&cfg, 0) && tpr_model_config_layer_is_linear(&cfg, 1));
}

int main(int argc, char **argv) {
  fp_init(&argc, &argv);
  fp_load_ref(FIX, 256, 11, 5, 6, &ref);  // V, the two prompts' lengths, greedy tokens
  fp_load_ref(FIX_B, 256, 11, 5, 6, &ref_b);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parity),
      cmocka_unit_test(test_parity_b),
      cmocka_unit_test(test_greedy_cached),
      cmocka_unit_test(test_engine_greedy),
      cmocka_unit_test(test_norm_allreduce_in_program),
      cmocka_unit_test(test_refusals),
  };
  int rc = fp_run(tests, sizeof tests / sizeof *tests, &ref);  // frees ref
  fp_free_ref(&ref_b);
  return rc;
}
