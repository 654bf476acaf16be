// Qwen3-MoE (models/qwen3_moe.h) through the engine's session against
// transformers' Qwen3MoeForCausalLM (tests/fixtures/qwen3_moe_tiny, made by
// scripts/reference/make_qwen3_moe_fixture.py), under mpirun at the mesh on
// the command line (--tp/--dp/--ep):
//  - parity: logits of both prompts within 1e-4 of max |logit|;
//  - greedy: prefill a random prefix, decode the rest and transformers' 8
//    greedy tokens one at a time through the KV cache: the tokens equal,
//    every decoded row within the bound of transformers' and of one full
//    forward (1e-5);
//  - negative control (a): the per-head q/k norm replaced by one RMS over the
//    rank's whole projection must break the parity bound;
//  - negative control (b): in the tp-2 step program no collective lies
//    between the q/k projections and attention (the norm is rank-local),
//    while the same check on a program that all-reduces the norm's sums
//    finds exactly two per layer; the whole program holds the collectives
//    the layout needs (embedding, o_proj, dense MLP, MoE, lm head) and no more.
// The prefix length comes from a fresh seed each run (printed; TPR_TEST_SEED).
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "family_parity.h"
#include "models/qwen3_moe.h"
#include "shard/model_config.h"

#define FIX TPR_FIXTURES "/qwen3_moe_tiny"
#define BOUND 1e-4    // max|d| <= BOUND * max|ref|: the TP parity tolerance (as minimax_m2's)
#define KV_BOUND 1e-5  // cached decode vs one full forward

static fp_ref ref;

// control: per_rank_qk_norm (TPR_QK_CONTROL_FULL_LOCAL for this family).
static tpr_session_opts session_opts(bool control) {
  tpr_session_opts o = fp_session_opts(FIX, ref.ta + ref.ng);
  o.per_rank_qk_norm = control;
  return o;
}

static void test_parity(void **state) {
  (void)state;
  tpr_session_opts o = session_opts(false);
  fp_test_parity(&o, &ref, BOUND);
}

static void test_greedy_cached(void **state) {
  (void)state;
  tpr_session_opts o = session_opts(false);
  fp_test_greedy_cached(&o, &ref, BOUND, KV_BOUND);
}

static void test_control_full_norm(void **state) {
  (void)state;
  tpr_session_opts o = session_opts(true);
  if (fp.R == 0) printf("control (a) full-projection q/k norm on each rank, tp %d:\n", fp.tp);
  fp_test_control(&o, &ref, BOUND, "the wrong q/k norm");
}

// ---- control (b): collectives in the built tp-2 program

static bool is_collective(tpr_op_kind k) {
  return k == TPR_OP_ALL_REDUCE || k == TPR_OP_ALL_GATHER || k == TPR_OP_REDUCE_SCATTER || k == TPR_OP_ALL_TO_ALL ||
         k == TPR_OP_ALL_TO_ALLV || k == TPR_OP_PARAM_GATHER;
}

// The node producing value v, or -1 (inputs, params).
static int producer(const tpr_program *p, tpr_value_id v) {
  for (int n = 0; n < tpr_program_num_nodes(p); n++) {
    const tpr_value_id *in;
    int n_in;
    tpr_value_id out;
    if (tpr_program_node_io(p, n, &in, &n_in, &out) == TPR_OK && out == v) return n;
  }
  return -1;
}

// Collectives on a path from a node reading param `from` to value `to`:
// marks the descendants of the reader, then walks `to`'s ancestors.
static int collectives_between(const tpr_program *p, const char *from, tpr_value_id to) {
  int nv = tpr_program_num_values(p), nn = tpr_program_num_nodes(p), count = 0;
  bool *down = calloc((size_t)nv, 1), *seen = calloc((size_t)nv, 1);
  int *stack = malloc((size_t)nv * sizeof *stack);
  for (tpr_value_id v = 0; v < nv; v++)
    if (tpr_program_value_name(p, v) && !strcmp(tpr_program_value_name(p, v), from)) down[v] = true;
  for (int n = 0; n < nn; n++) {  // nodes are in topological order
    const tpr_value_id *in;
    int n_in;
    tpr_value_id out;
    TT_OK(tpr_program_node_io(p, n, &in, &n_in, &out));
    for (int i = 0; i < n_in; i++) down[out] |= down[in[i]];
  }
  int top = 0;
  stack[top++] = to;
  while (top) {
    tpr_value_id v = stack[--top];
    if (seen[v] || !down[v]) continue;
    seen[v] = true;
    int n = producer(p, v);
    if (n < 0) continue;
    count += is_collective(tpr_program_node_op(p, n));
    const tpr_value_id *in;
    int n_in;
    tpr_value_id out;
    TT_OK(tpr_program_node_io(p, n, &in, &n_in, &out));
    for (int i = 0; i < n_in; i++) stack[top++] = in[i];
  }
  free(down), free(seen), free(stack);
  return count;
}

// Per layer: collectives from q_proj to the attention's q, and from k_proj to
// the k written into the pool; with the program's total collectives.
static void count_qk(const tpr_program *p, int64_t layers, int *qk, int *total) {
  *qk = 0, *total = 0;
  for (int n = 0; n < tpr_program_num_nodes(p); n++) *total += is_collective(tpr_program_node_op(p, n));
  for (int64_t L = 0; L < layers; L++) {
    char qn[96], kn[96], pool[96];
    snprintf(qn, sizeof qn, "model.layers.%lld.self_attn.q_proj.weight", (long long)L);
    snprintf(kn, sizeof kn, "model.layers.%lld.self_attn.k_proj.weight", (long long)L);
    tpr_family_pool_name(L, "k", pool, sizeof pool);
    for (int n = 0; n < tpr_program_num_nodes(p); n++) {
      const tpr_value_id *in;
      int n_in;
      tpr_value_id out;
      TT_OK(tpr_program_node_io(p, n, &in, &n_in, &out));
      tpr_op_kind k = tpr_program_node_op(p, n);
      const char *first = tpr_program_value_name(p, in[0]);
      if (k == TPR_OP_PAGED_ATTENTION && first == NULL) {
        const char *kp = tpr_program_value_name(p, in[1]);
        if (kp && !strcmp(kp, pool)) *qk += collectives_between(p, qn, in[0]);
      }
      if (k == TPR_OP_PAGED_CACHE_WRITE && first && !strcmp(first, pool)) *qk += collectives_between(p, kn, in[1]);
    }
  }
}

static void test_control_no_qk_collective(void **state) {
  (void)state;
  if (fp.R != 0) return;  // building only: rank 0
  tpr_model_config cfg;
  tpr_shard_plan plan;
  TT_OK(tpr_model_config_load(FIX, &cfg));
  TT_OK(tpr_shard_plan_build(&cfg, 2, 1, 2, 1, TPR_F32, &plan));  // tp 2, ep 1, etp 2, dp 1
  tpr_qkhd_opts o = {.step = {.shape = {.tokens = 4, .samples = 2, .batch = 1, .max_blocks = 2,
                                               .pool_blocks = 4, .block_size = 4}}};
  int qk[2], total[2];
  for (int c = 0; c < 2; c++) {
    tpr_program *p = NULL;
    o.qk_control = c ? TPR_QK_CONTROL_FULL_ALLREDUCE : TPR_QK_CONTROL_NONE;
    TT_OK(tpr_qkhd_build(&tpr_qwen3_moe_desc, &plan, &o, &p));
    count_qk(p, cfg.num_layers, &qk[c], &total[c]);
    tpr_program_free(p);
  }
  // What the layout needs at tp 2, etp 2 (allreduce dispatcher): the
  // embedding and each o_proj all-reduce, each dense MLP's all-reduce, each
  // MoE layer's etp all-reduce (ep 1: none over ep), the lm head's gather.
  int64_t L = cfg.num_layers, moe = cfg.num_moe_layers;
  int need = (int)(1 + L + (L - moe) + moe + 1);
  printf("tp 2 program: %d collectives between q/k projections and attention (want 0), %d in all (layout needs %d); "
         "control all-reducing the norm: %d between (want %lld), %d in all\n",
         qk[0], total[0], need, qk[1], (long long)(2 * L), total[1]);
  tpr_shard_plan_free(&plan);
  assert_int_equal(qk[0], 0);
  assert_int_equal(total[0], need);
  assert_int_equal(qk[1], 2 * L);  // the check sees an all-reduce where one is
  assert_int_equal(total[1], need + 2 * L);
}

int main(int argc, char **argv) {
  fp_init(&argc, &argv);
  fp_load_ref(FIX, 256, 11, 5, 8, &ref);  // V, the two prompts' lengths, greedy tokens
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parity),
      cmocka_unit_test(test_greedy_cached),
      cmocka_unit_test(test_control_full_norm),
      cmocka_unit_test(test_control_no_qk_collective),
  };
  return fp_run(tests, sizeof tests / sizeof *tests, &ref);
}
