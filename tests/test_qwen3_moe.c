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

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/session.h"
#include "m2_ref.h"
#include "models/qwen3_moe.h"
#include "mpi_util.h"
#include "shard/model_config.h"

#define FIX TPR_FIXTURES "/qwen3_moe_tiny"
#define V 256
#define TA 11
#define TB 5
#define NG 8
#define BOUND 1e-4    // max|d| <= BOUND * max|ref|: the TP parity tolerance (as minimax_m2's)
#define KV_BOUND 1e-5  // cached decode vs one full forward

static tpr_comm_t world;
static int R, tp, dp, ep;
static struct {
  int32_t a[TA], b[TB], greedy[NG];
  float logits_a[TA * V], logits_b[TB * V], greedy_logits[NG * V];
} ref;

static void read_ids(const tpr_st_set *set, const char *name, int n, int32_t *ids) {
  float f[16];
  m2_read_f32(set, name, n, 0, f);
  for (int i = 0; i < n; i++) ids[i] = (int32_t)f[i];
}

static void load_ref(void) {
  tpr_st_set *set;
  TT_OK(tpr_st_open(FIX "/reference.safetensors", &set));
  read_ids(set, "tokens_a", TA, ref.a);
  read_ids(set, "tokens_b", TB, ref.b);
  read_ids(set, "greedy_a", NG, ref.greedy);
  m2_read_f32(set, "logits_a", TA, V, ref.logits_a);
  m2_read_f32(set, "logits_b", TB, V, ref.logits_b);
  m2_read_f32(set, "greedy_logits_a", NG, V, ref.greedy_logits);
  tpr_st_close(set);
}

static tpr_session *open_session(bool control) {
  tpr_session_opts o = {.model_dir = FIX, .max_seq = TA + NG, .max_batch = 1, .tp = tp, .dp = dp, .ep = ep,
                        .per_rank_qk_norm = control, .force_tp_rank = -1};
  tpr_session *s = NULL;
  TT_OK(tpr_session_open(&o, world, tt_cpu(), &s));
  return s;
}

static int argmax(const float *row) {
  int best = 0;
  for (int v = 1; v < V; v++)
    if (row[v] > row[best]) best = v;
  return best;
}

// The worst error over both prompts, the same on every rank.
static double parity(tpr_session *s) {
  static float la[TA * V], lb[TB * V];
  TT_OK(tpr_session_forward(s, ref.a, TA, 0, la));
  TT_OK(tpr_session_forward(s, ref.b, TB, 0, lb));
  double ea = m2_rel_err(la, ref.logits_a, TA * V), eb = m2_rel_err(lb, ref.logits_b, TB * V);
  if (R == 0) printf("  prompt a %.3g, prompt b %.3g\n", ea, eb);
  return fmax(ea, eb);
}

static void test_parity(void **state) {
  (void)state;
  tpr_session *s = open_session(false);
  if (R == 0) printf("parity tp %d dp %d ep %d (max|d|/max|ref|, bound %.0e):\n", tp, dp, ep, BOUND);
  double e = parity(s);
  tpr_session_close(s);
  if (!(e <= BOUND)) fail_msg("logits differ from transformers' by %.3g of max |logit| (bound %.0e)", e, BOUND);
}

static void test_greedy_cached(void **state) {
  (void)state;
  int64_t seed = R == 0 ? (int64_t)(tt_next_u64() >> 1) : 0;
  TT_OK(tpr_comm_broadcast(world, &seed, &seed, 1, TPR_I64, 0));
  int64_t P = 1 + (int64_t)((uint64_t)seed % (TA - 1));  // prefill length in [1, TA-1]
  int32_t seq[TA + NG];
  memcpy(seq, ref.a, sizeof ref.a);
  static float full[(TA + NG) * V], step[TA * V];
  tpr_session *s = open_session(false);
  TT_OK(tpr_session_forward(s, seq, P, 0, step));
  double kv = 0, vs_ref = 0;
  int64_t t = P;
  for (; t < TA + NG - 1; t++) {  // decode token t, whose row predicts token t+1
    TT_OK(tpr_session_forward(s, &seq[t], 1, t, step));
    if (t >= TA - 1) {
      int g = (int)(t - (TA - 1));
      seq[t + 1] = argmax(step);
      vs_ref = fmax(vs_ref, m2_rel_err(step, ref.greedy_logits + g * V, V));
      if (seq[t + 1] != ref.greedy[g]) fail_msg("greedy token %d is %d, transformers' %d", g, seq[t + 1], ref.greedy[g]);
    }
    memcpy(full + t * V, step, V * sizeof *step);
  }
  // The last greedy token's row was never needed; one full forward over the
  // whole sequence checks every decoded row.
  static float whole[(TA + NG) * V];
  TT_OK(tpr_session_forward(s, seq, TA + NG - 1, 0, whole));
  for (int64_t r = P; r < TA + NG - 1; r++) kv = fmax(kv, m2_rel_err(full + r * V, whole + r * V, V));
  tpr_session_close(s);
  if (R == 0)
    printf("greedy (prefill %lld of %d, seed %lld): tokens equal; decoded rows vs transformers %.3g (bound %.0e), "
           "vs one full forward %.3g (bound %.0e)\n", (long long)P, TA, (long long)seed, vs_ref, BOUND, kv, KV_BOUND);
  if (!(vs_ref <= BOUND)) fail_msg("decoded logits differ from transformers' by %.3g", vs_ref);
  if (!(kv <= KV_BOUND)) fail_msg("cached decode differs from a full forward by %.3g", kv);
}

static void test_control_full_norm(void **state) {
  (void)state;
  tpr_session *s = open_session(true);
  if (R == 0) printf("control (a) full-projection q/k norm on each rank, tp %d:\n", tp);
  double e = parity(s);
  tpr_session_close(s);
  if (!(e > BOUND)) fail_msg("the wrong q/k norm passed the parity bound (%.3g <= %.0e)", e, BOUND);
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
  if (R != 0) return;  // building only: rank 0
  tpr_model_config cfg;
  tpr_shard_plan plan;
  TT_OK(tpr_model_config_load(FIX, &cfg));
  TT_OK(tpr_shard_plan_build(&cfg, 2, 1, 2, 1, TPR_F32, &plan));  // tp 2, ep 1, etp 2, dp 1
  tpr_qwen3_build_opts o = {.step = {.shape = {.tokens = 4, .samples = 2, .batch = 1, .max_blocks = 2,
                                               .pool_blocks = 4, .block_size = 4}}};
  int qk[2], total[2];
  for (int c = 0; c < 2; c++) {
    tpr_program *p = NULL;
    o.qk_control = c ? TPR_QWEN3_QK_FULL_ALLREDUCE : TPR_QWEN3_QK_PER_HEAD;
    TT_OK(tpr_qwen3_build(&plan, &o, &p));
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
  world = tt_mpi_world(&argc, &argv);
  R = tpr_comm_rank(world);
  tp = tpr_comm_size(world), dp = 1, ep = 1;
  for (int i = 1; i + 1 < argc; i++) {
    if (!strcmp(argv[i], "--tp")) tp = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--dp")) dp = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--ep")) ep = atoi(argv[i + 1]);
  }
  if (R == 0) tt_seed_from_env();
  load_ref();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parity),
      cmocka_unit_test(test_greedy_cached),
      cmocka_unit_test(test_control_full_norm),
      cmocka_unit_test(test_control_no_qk_collective),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return tt_mpi_finish(world, failed);
}
