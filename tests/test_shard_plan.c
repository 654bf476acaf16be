// The sharding planner: the MiniMax-M2 table of docs/architecture.md section 5 row by
// row (strategies, padded counts, per-rank heads, QK-norm divisors, head
// maps), the other strategies (MHA conversion, plain MHA), invariants over a
// sweep of head counts, the tensor list and per-rank bytes against
// independent formulas, the errors, and `tpr plan --json`.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shard/shard_plan.h"

static char configs_dir[4096], tpr_path[4096];

static const char *config_path(const char *name) { return tt_path(configs_dir, name); }

// Every rank's every real Q head must read, through the public local
// mapping, a copy of the KV head the unsharded model gives it.
static void expect_routing(const tpr_attn_plan *a) {
  int64_t group = a->nq / a->nkv;
  for (int r = 0; r < a->tp; r++)
    for (int64_t i = 0; i < a->q_per_rank; i++) {
      int32_t q = a->q_head_map[r * a->q_per_rank + i];
      int64_t lk = tpr_attn_plan_local_kv(a, r, i);
      assert_true(lk >= 0 && lk < a->kv_per_rank);
      if (q >= 0) assert_int_equal(a->kv_head_map[r * a->kv_per_rank + lk], q / group);
    }
}

typedef struct row {
  int tp;
  tpr_kv_strategy strategy;
  int64_t nq_padded, nkv_eff, q_per_rank, kv_per_rank, q_div, k_div;
} row;

static void test_minimax_table(void **state) {
  static const row table[] = {
      {1, TPR_KV_SHARD, 48, 8, 48, 8, 6144, 1024},        {8, TPR_KV_SHARD, 48, 8, 6, 1, 6144, 1024},
      {16, TPR_KV_REPLICATE, 48, 16, 3, 1, 6144, 2048},   {32, TPR_KV_REPLICATE, 64, 32, 2, 1, 6144, 4096},
      {64, TPR_KV_REPLICATE, 64, 64, 1, 1, 6144, 8192},
  };
  for (size_t k = 0; k < sizeof table / sizeof table[0]; k++) {
    const row *w = &table[k];
    tpr_attn_plan a;
    TT_OK(tpr_attn_plan_build(48, 8, 128, w->tp, &a));
    assert_int_equal(a.strategy, w->strategy);
    assert_int_equal(a.nq_padded, w->nq_padded);
    assert_int_equal(a.nkv_eff, w->nkv_eff);
    assert_int_equal(a.q_per_rank, w->q_per_rank);
    assert_int_equal(a.kv_per_rank, w->kv_per_rank);
    assert_int_equal(a.q_norm_divisor, w->q_div);
    assert_int_equal(a.k_norm_divisor, w->k_div);
    // Q maps: identity without padding; with padding, 6 real heads then
    // (nq'-nq)/nkv = 2 zero heads per GQA group: [0..5,-1,-1, 6..11,-1,-1, ...].
    for (int64_t j = 0; j < a.nq_padded; j++) {
      int64_t pg = a.nq_padded / 8, g = j / pg, pos = j % pg;
      int32_t want = a.nq_padded == 48 ? (int32_t)j : pos < 6 ? (int32_t)(g * 6 + pos) : -1;
      assert_int_equal(a.q_head_map[j], want);
    }
    // KV maps: identity when sharded, else each head t/8 times back to back.
    for (int64_t j = 0; j < a.nkv_eff; j++)
      assert_int_equal(a.kv_head_map[j], w->strategy == TPR_KV_SHARD ? j : j / (w->tp / 8));
    expect_routing(&a);
    tpr_attn_plan_free(&a);
  }
  // Spelled out, as in the issue.
  tpr_attn_plan a;
  TT_OK(tpr_attn_plan_build(48, 8, 128, 32, &a));
  static const int32_t q32[16] = {0, 1, 2, 3, 4, 5, -1, -1, 6, 7, 8, 9, 10, 11, -1, -1};
  for (int j = 0; j < 16; j++) assert_int_equal(a.q_head_map[j], q32[j]);
  assert_int_equal(a.q_head_map[63], -1);
  assert_int_equal(a.q_head_map[56], 42);
  tpr_attn_plan_free(&a);
  TT_OK(tpr_attn_plan_build(48, 8, 128, 16, &a));
  static const int32_t kv16[16] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
  for (int j = 0; j < 16; j++) assert_int_equal(a.kv_head_map[j], kv16[j]);
  assert_string_equal(tpr_kv_strategy_name(a.strategy), "replicate_kv");
  tpr_attn_plan_free(&a);
}

static void test_other_shapes(void **state) {
  tpr_attn_plan a;
  // nkv 8 at t=6: neither divides, so MHA: KV head h repeated 6 times.
  TT_OK(tpr_attn_plan_build(48, 8, 4, 6, &a));
  assert_int_equal(a.strategy, TPR_KV_CONVERT_TO_MHA);
  assert_string_equal(tpr_kv_strategy_name(a.strategy), "convert_to_mha");
  assert_int_equal(a.nq_padded, 48);
  assert_int_equal(a.nkv_eff, 48);
  assert_int_equal(a.q_per_rank, 8);
  assert_int_equal(a.kv_per_rank, 8);
  assert_int_equal(a.k_norm_divisor, 48 * 4);
  for (int j = 0; j < 48; j++) assert_int_equal(a.q_head_map[j], j), assert_int_equal(a.kv_head_map[j], j / 6);
  expect_routing(&a);
  tpr_attn_plan_free(&a);
  // t=5: MHA with tail padding of both Q and KV (48 -> 50).
  TT_OK(tpr_attn_plan_build(48, 8, 4, 5, &a));
  assert_int_equal(a.strategy, TPR_KV_CONVERT_TO_MHA);
  assert_int_equal(a.nq_padded, 50);
  assert_int_equal(a.nkv_eff, 50);
  assert_int_equal(a.q_head_map[47], 47);
  assert_int_equal(a.q_head_map[48], -1);
  assert_int_equal(a.kv_head_map[47], 7);
  assert_int_equal(a.kv_head_map[49], -1);
  assert_int_equal(a.k_norm_divisor, 48 * 4);  // zero tail heads add nothing
  expect_routing(&a);
  tpr_attn_plan_free(&a);
  // nq 12, nkv 4, t 8: 8 % 4 == 0, so replicate (groups of 3 padded to 4).
  TT_OK(tpr_attn_plan_build(12, 4, 4, 8, &a));
  assert_int_equal(a.strategy, TPR_KV_REPLICATE);
  static const int32_t q12[16] = {0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1};
  for (int j = 0; j < 16; j++) assert_int_equal(a.q_head_map[j], q12[j]);
  for (int j = 0; j < 8; j++) assert_int_equal(a.kv_head_map[j], j / 2);
  assert_int_equal(a.k_norm_divisor, 8 * 4);
  expect_routing(&a);
  tpr_attn_plan_free(&a);
  // nq 12, nkv 4, t 3: MHA without padding.
  TT_OK(tpr_attn_plan_build(12, 4, 4, 3, &a));
  assert_int_equal(a.strategy, TPR_KV_CONVERT_TO_MHA);
  assert_int_equal(a.nq_padded, 12);
  expect_routing(&a);
  tpr_attn_plan_free(&a);
  // Plain MHA (nq == nkv = 8): shard at t=4, replicate at t=16 (one zero Q
  // head after each real one), MHA path with tail padding at t=3.
  TT_OK(tpr_attn_plan_build(8, 8, 4, 4, &a));
  assert_int_equal(a.strategy, TPR_KV_SHARD);
  assert_int_equal(a.q_per_rank, 2);
  assert_int_equal(a.kv_per_rank, 2);
  expect_routing(&a);
  tpr_attn_plan_free(&a);
  TT_OK(tpr_attn_plan_build(8, 8, 4, 16, &a));
  assert_int_equal(a.strategy, TPR_KV_REPLICATE);
  for (int j = 0; j < 16; j++) assert_int_equal(a.q_head_map[j], j % 2 ? -1 : j / 2);
  for (int j = 0; j < 16; j++) assert_int_equal(a.kv_head_map[j], j / 2);
  assert_int_equal(a.k_norm_divisor, 16 * 4);
  expect_routing(&a);
  tpr_attn_plan_free(&a);
  TT_OK(tpr_attn_plan_build(8, 8, 4, 3, &a));
  assert_int_equal(a.strategy, TPR_KV_CONVERT_TO_MHA);
  assert_int_equal(a.nq_padded, 9);
  assert_int_equal(a.k_norm_divisor, 8 * 4);
  expect_routing(&a);
  tpr_attn_plan_free(&a);
  // Bad arguments.
  assert_int_equal(tpr_attn_plan_build(48, 7, 4, 8, &a), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "nkv=7"));
  assert_int_equal(tpr_attn_plan_build(48, 8, 4, 0, &a), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_attn_plan_build(0, 8, 4, 2, &a), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_attn_plan_build(48, 8, 0, 2, &a), TPR_ERR_INVALID_ARG);
}

// Over many shapes: the documented invariants. Note that the shard strategy
// never pads Q: nkv % t == 0 and nq % nkv == 0 make nq a multiple of t.
static void test_sweep(void **state) {
  int plans = 0, seen[3] = {0};
  for (int64_t nkv = 1; nkv <= 12; nkv++)
    for (int64_t group = 1; group <= 7; group++)
      for (int tp = 1; tp <= 40; tp++) {
        int64_t nq = nkv * group;
        tpr_attn_plan a;
        TT_OK(tpr_attn_plan_build(nq, nkv, 2, tp, &a));
        plans++, seen[a.strategy]++;
        assert_int_equal(a.nq_padded % tp, 0);
        assert_true(a.nq_padded >= nq && a.nq_padded - nq < tp);
        assert_int_equal(a.nkv_eff % tp, 0);
        assert_int_equal(a.q_norm_divisor, nq * 2);
        int64_t want_k = a.strategy == TPR_KV_SHARD ? nkv : a.strategy == TPR_KV_REPLICATE ? tp : nq;
        assert_int_equal(a.k_norm_divisor, want_k * 2);
        if (a.strategy == TPR_KV_SHARD) assert_int_equal(a.nq_padded, nq);
        if (a.strategy == TPR_KV_REPLICATE) assert_int_equal(a.kv_per_rank, 1);
        if (a.strategy == TPR_KV_CONVERT_TO_MHA) assert_int_equal(a.q_per_rank, a.kv_per_rank);
        expect_routing(&a);
        tpr_attn_plan_free(&a);
      }
  assert_true(seen[0] > 0 && seen[1] > 0 && seen[2] > 0);
  assert_int_equal(plans, 12 * 7 * 40);
}

static const tpr_shard_tensor *find(const tpr_shard_plan *p, const char *suffix) {
  for (int i = 0; i < p->n_tensors; i++) {
    size_t n = strlen(p->tensors[i].name), k = strlen(suffix);
    if (n >= k && strcmp(p->tensors[i].name + n - k, suffix) == 0) return &p->tensors[i];
  }
  return NULL;
}

static void expect_tensor(const tpr_shard_plan *p, const char *suffix, tpr_shard_transform x, int64_t count,
                          int64_t g0, int64_t g1, int64_t r0, int64_t r1) {
  const tpr_shard_tensor *t = find(p, suffix);
  if (!t) fail_msg("no tensor %s in the plan", suffix);
  if (t->transform != x || t->count != count || t->global_shape[0] != g0 || t->global_shape[1] != g1 ||
      t->rank_shape[0] != r0 || t->rank_shape[1] != r1)
    fail_msg("%s: %s x%lld (%lld, %lld) -> (%lld, %lld)", t->name, tpr_shard_transform_name(t->transform),
             (long long)t->count, (long long)t->global_shape[0], (long long)t->global_shape[1],
             (long long)t->rank_shape[0], (long long)t->rank_shape[1]);
}

static void test_minimax_tensors(void **state) {
  tpr_model_config c;
  TT_OK(tpr_model_config_load(config_path("minimax_m2.json"), &c));
  const int64_t L = 62, H = 3072, V = 200064, E = 256, I = 1536, D = 128;
  // Unsharded (tp = ep = 1): the bytes are the model's parameter count x 2.
  tpr_shard_plan p;
  TT_OK(tpr_shard_plan_build(&c, 1, 1, 1, 1, TPR_BF16, &p));
  uint64_t params = 2 * V * H + H + L * (2 * H + 48 * D * H * 2 + 8 * D * H * 2 + 48 * D + 8 * D + E * H + E + E * 3 * I * H);
  assert_true(p.rank_bytes == 2 * params);
  assert_int_equal(p.n_tensors, 16);
  tpr_shard_plan_free(&p);

  // tp 64, ep 8 (edp 8): the example mesh.
  TT_OK(tpr_shard_plan_build(&c, 64, 8, 1, 1, TPR_BF16, &p));
  assert_int_equal(p.world, 64);
  assert_int_equal(p.edp, 8);
  expect_tensor(&p, "embed_tokens.weight", TPR_XFORM_VOCAB, 1, V, H, V / 64, H);
  expect_tensor(&p, "lm_head.weight", TPR_XFORM_VOCAB, 1, V, H, V / 64, H);
  expect_tensor(&p, "q_proj.weight", TPR_XFORM_COLUMN_HEADS, L, 48 * D, H, D, H);
  expect_tensor(&p, "k_proj.weight", TPR_XFORM_COLUMN_HEADS, L, 8 * D, H, D, H);
  expect_tensor(&p, "v_proj.weight", TPR_XFORM_COLUMN_HEADS, L, 8 * D, H, D, H);
  expect_tensor(&p, "o_proj.weight", TPR_XFORM_ROW_HEADS, L, H, 48 * D, H, D);
  expect_tensor(&p, "q_norm.weight", TPR_XFORM_NORM_HEADS, L, 48 * D, 0, 64 * D, 0);  // padded like Q
  expect_tensor(&p, "k_norm.weight", TPR_XFORM_NORM_HEADS, L, 8 * D, 0, 64 * D, 0);   // replicated like K
  expect_tensor(&p, "input_layernorm.weight", TPR_XFORM_REPLICATE, L, H, 0, H, 0);
  expect_tensor(&p, "post_attention_layernorm.weight", TPR_XFORM_REPLICATE, L, H, 0, H, 0);
  expect_tensor(&p, "block_sparse_moe.gate.weight", TPR_XFORM_REPLICATE, L, E, H, E, H);
  expect_tensor(&p, "block_sparse_moe.e_score_correction_bias", TPR_XFORM_REPLICATE, L, E, 0, E, 0);
  expect_tensor(&p, "experts.{E}.w1.weight", TPR_XFORM_EXPERT_COLUMN, L * 32, I, H, I, H);
  expect_tensor(&p, "experts.{E}.w3.weight", TPR_XFORM_EXPERT_COLUMN, L * 32, I, H, I, H);
  expect_tensor(&p, "experts.{E}.w2.weight", TPR_XFORM_EXPERT_ROW, L * 32, H, I, H, I);
  expect_tensor(&p, "model.norm.weight", TPR_XFORM_REPLICATE, 1, H, 0, H, 0);
  assert_string_equal(find(&p, "w1.weight")->name, "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight");
  uint64_t sum = 0;
  for (int i = 0; i < p.n_tensors; i++) sum += p.tensors[i].rank_bytes;
  assert_true(sum == p.rank_bytes);
  // Held bytes are equal on every rank; padding follows the Q map.
  for (int r = 0; r < 64; r++) {
    uint64_t held, pad;
    TT_OK(tpr_shard_plan_rank_bytes(&p, r, &held, &pad));
    assert_true(held == p.rank_bytes);
    uint64_t norm_pad = (uint64_t)L * 16 * D * 2;  // 16 zero heads of q_norm on every rank
    uint64_t q_pad = r % 8 >= 6 ? (uint64_t)L * 2 * D * H * 2 : 0;  // q_proj rows + o_proj columns
    assert_true(pad == norm_pad + q_pad);
  }
  tpr_shard_plan_free(&p);

  // etp splits each expert's width; f32 doubles the bytes; dp replicates.
  tpr_shard_plan q;
  TT_OK(tpr_shard_plan_build(&c, 8, 4, 2, 2, TPR_BF16, &p));
  TT_OK(tpr_shard_plan_build(&c, 8, 4, 2, 2, TPR_F32, &q));
  assert_int_equal(p.world, 16);
  assert_int_equal(p.edp, 2);
  expect_tensor(&p, "experts.{E}.w1.weight", TPR_XFORM_EXPERT_COLUMN, L * 64, I, H, I / 2, H);
  expect_tensor(&p, "experts.{E}.w2.weight", TPR_XFORM_EXPERT_ROW, L * 64, H, I, H, I / 2);
  assert_true(q.rank_bytes == 2 * p.rank_bytes);
  tpr_shard_plan_free(&p);
  tpr_shard_plan_free(&q);
}

static void test_small_and_errors(void **state) {
  tpr_model_config c;
  tpr_shard_plan p;
  TT_OK(tpr_model_config_load(config_path("minimax_m2_tiny.json"), &c));
  // tp 3: 6 Q / 2 KV heads -> MHA; vocab 256 -> 258, the last rank holds 2 zero rows.
  TT_OK(tpr_shard_plan_build(&c, 3, 1, 1, 1, TPR_BF16, &p));
  assert_int_equal(p.attn.strategy, TPR_KV_CONVERT_TO_MHA);
  assert_int_equal(p.vocab_padded, 258);
  expect_tensor(&p, "embed_tokens.weight", TPR_XFORM_VOCAB, 1, 256, 64, 86, 64);
  uint64_t held, pad;
  TT_OK(tpr_shard_plan_rank_bytes(&p, 0, &held, &pad));
  assert_true(pad == 0);
  TT_OK(tpr_shard_plan_rank_bytes(&p, 2, &held, &pad));
  assert_true(pad == 2 * 2 * 64 * 2);  // embed + lm_head, 2 rows of 64, bf16
  assert_int_equal(tpr_shard_plan_rank_bytes(&p, 3, &held, &pad), TPR_ERR_INVALID_ARG);
  tpr_shard_plan_free(&p);
  // tp 5: MHA with tail padding, 6 -> 10 Q and KV heads; ranks 3 and 4 hold
  // only zero heads, rank 4 also 4 zero vocab rows (256 -> 260).
  TT_OK(tpr_shard_plan_build(&c, 5, 1, 1, 1, TPR_BF16, &p));
  assert_int_equal(p.attn.strategy, TPR_KV_CONVERT_TO_MHA);
  assert_int_equal(p.attn.nkv_eff, 10);
  const uint64_t L = 2, D = 16, H = 64, norm_pad = L * (4 * D + 4 * D) * 2;  // q_norm + k_norm, held whole
  for (int r = 0; r < 5; r++) {
    TT_OK(tpr_shard_plan_rank_bytes(&p, r, &held, &pad));
    uint64_t heads_pad = r >= 3 ? L * 4 * (2 * D * H) * 2 : 0;  // q, k, v rows and o columns
    uint64_t vocab_pad = r == 4 ? 2 * 4 * H * 2 : 0;
    if (pad != norm_pad + heads_pad + vocab_pad) fail_msg("rank %d: padding %llu", r, (unsigned long long)pad);
  }
  tpr_shard_plan_free(&p);
  // Tied embeddings: no lm_head.
  c.tie_word_embeddings = true;
  TT_OK(tpr_shard_plan_build(&c, 2, 1, 1, 1, TPR_BF16, &p));
  assert_null(find(&p, "lm_head.weight"));
  tpr_shard_plan_free(&p);
  c.tie_word_embeddings = false;
  // 8 experts do not split over ep 3; a 32-wide expert does not split over etp 3.
  assert_int_equal(tpr_shard_plan_build(&c, 3, 3, 1, 1, TPR_BF16, &p), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "8 experts"));
  assert_non_null(strstr(tpr_last_error(), "ep=3"));
  assert_int_equal(tpr_shard_plan_build(&c, 3, 1, 3, 1, TPR_BF16, &p), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "etp=3"));
  // Impossible factorisations are the mesh's error: ep*etp must divide dp*tp.
  assert_int_equal(tpr_shard_plan_build(&c, 4, 8, 1, 1, TPR_BF16, &p), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "mesh"));
  assert_int_equal(tpr_shard_plan_build(&c, 0, 1, 1, 1, TPR_BF16, &p), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_shard_plan_build(&c, 2, 1, 1, 0, TPR_BF16, &p), TPR_ERR_INVALID_ARG);
  // A hand-built config is validated like a loaded one.
  tpr_model_config bad = c;
  bad.num_kv_heads = 4;
  assert_int_equal(tpr_shard_plan_build(&bad, 2, 1, 1, 1, TPR_BF16, &p), TPR_ERR_FORMAT);
  assert_non_null(strstr(tpr_last_error(), "num_key_value_heads"));
  // M2 itself: 256 experts over ep 3.
  TT_OK(tpr_model_config_load(config_path("minimax_m2.json"), &c));
  assert_int_equal(tpr_shard_plan_build(&c, 3, 3, 1, 1, TPR_BF16, &p), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "256 experts"));

  // Qwen3-MoE: per-head norms replicate; the dense layer's MLP is column/row parallel.
  TT_OK(tpr_model_config_load(config_path("qwen3_moe_tiny.json"), &c));
  TT_OK(tpr_shard_plan_build(&c, 2, 2, 1, 1, TPR_BF16, &p));
  expect_tensor(&p, "q_norm.weight", TPR_XFORM_REPLICATE, 4, 16, 0, 16, 0);
  expect_tensor(&p, "mlp.experts.{E}.gate_proj.weight", TPR_XFORM_EXPERT_COLUMN, 3 * 4, 32, 64, 32, 64);
  expect_tensor(&p, "mlp.experts.{E}.down_proj.weight", TPR_XFORM_EXPERT_ROW, 3 * 4, 64, 32, 64, 32);
  expect_tensor(&p, "layers.{L}.mlp.gate_proj.weight", TPR_XFORM_COLUMN, 1, 96, 64, 48, 64);
  expect_tensor(&p, "layers.{L}.mlp.down_proj.weight", TPR_XFORM_ROW, 1, 64, 96, 64, 48);
  assert_null(find(&p, "e_score_correction_bias"));
  tpr_shard_plan_free(&p);
}

// Runs the CLI; returns its exit code and stdout+stderr (or stdout only).
static int run_cli(const char *args, bool with_stderr, char **out) {
  char cmd[9000];
  snprintf(cmd, sizeof cmd, "'%s' plan %s %s", tpr_path, args, with_stderr ? "2>&1" : "2>/dev/null");
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t cap = 1 << 16, n = 0, got;
  char *buf = malloc(cap);
  while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0)
    if ((n += got) + 1 == cap) buf = realloc(buf, cap *= 2);
  buf[n] = 0;
  int st = pclose(f);
  *out = buf;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_json(void **state) {
  char args[4400], *out;
  snprintf(args, sizeof args, "--config '%s' --tp 32 --ep 4 --dp 2 --json", config_path("minimax_m2.json"));
  assert_int_equal(run_cli(args, false, &out), 0);
  cJSON *j = cJSON_Parse(out);
  if (!j) fail_msg("not JSON:\n%s", out);
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "attention");
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(a, "strategy")->valuestring, "replicate_kv");
  assert_true(tt_json_num(a, "q_heads") == 48 && tt_json_num(a, "q_heads_padded") == 64);
  assert_true(tt_json_num(a, "kv_heads") == 8 && tt_json_num(a, "kv_heads_effective") == 32);
  assert_true(tt_json_num(a, "q_heads_per_rank") == 2 && tt_json_num(a, "kv_heads_per_rank") == 1);
  assert_true(tt_json_num(a, "q_norm_divisor") == 6144 && tt_json_num(a, "k_norm_divisor") == 4096);
  const cJSON *qmap = cJSON_GetObjectItemCaseSensitive(a, "q_head_map");
  assert_int_equal(cJSON_GetArraySize(qmap), 64);
  assert_true(cJSON_GetArrayItem(qmap, 6)->valuedouble == -1 && cJSON_GetArrayItem(qmap, 8)->valuedouble == 6);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(a, "kv_head_map")), 32);
  assert_true(tt_json_num(j, "world_size") == 64 && tt_json_num(j, "edp") == 16);
  // per_rank_bytes: one number per rank, matching the library.
  tpr_model_config c;
  tpr_shard_plan p;
  TT_OK(tpr_model_config_load(config_path("minimax_m2.json"), &c));
  TT_OK(tpr_shard_plan_build(&c, 32, 4, 1, 2, TPR_BF16, &p));
  const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(j, "per_rank_bytes");
  assert_int_equal(cJSON_GetArraySize(bytes), 64);
  for (int r = 0; r < 64; r++) assert_true(cJSON_GetArrayItem(bytes, r)->valuedouble == (double)p.rank_bytes);
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(j, "tensors");
  assert_int_equal(cJSON_GetArraySize(tensors), p.n_tensors);
  const cJSON *t0 = cJSON_GetArrayItem(tensors, 0);
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(t0, "name")->valuestring, "model.embed_tokens.weight");
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(t0, "transform")->valuestring, "vocab");
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(t0, "rank_shape")), 2);
  tpr_shard_plan_free(&p);
  cJSON_Delete(j);
  free(out);
  // The text form names every tensor kind.
  snprintf(args, sizeof args, "--model '%s' --tp 8", config_path("minimax_m2_tiny.json"));
  assert_int_equal(run_cli(args, false, &out), 0);
  assert_non_null(strstr(out, "block_sparse_moe.experts.{E}.w2.weight"));
  assert_non_null(strstr(out, "replicate_kv"));
  free(out);
  // Usage errors exit 2; planning errors exit 1 with the reason.
  assert_int_equal(run_cli("--tp 8", true, &out), 2);
  assert_non_null(strstr(out, "--model"));
  free(out);
  snprintf(args, sizeof args, "--config '%s'", config_path("minimax_m2.json"));
  assert_int_equal(run_cli(args, true, &out), 2);
  assert_non_null(strstr(out, "--tp is required"));
  free(out);
  snprintf(args, sizeof args, "--config '%s' --tp 8 --dtype bogus", config_path("minimax_m2.json"));
  assert_int_equal(run_cli(args, true, &out), 2);
  free(out);
  snprintf(args, sizeof args, "--config '%s' --tp 3 --ep 3 --json", config_path("minimax_m2.json"));
  assert_int_equal(run_cli(args, true, &out), 1);
  assert_non_null(strstr(out, "ep=3"));
  free(out);
  assert_int_equal(run_cli("--model /nonexistent --tp 2", true, &out), 1);
  assert_non_null(strstr(out, "cannot open /nonexistent"));
  free(out);
}

int main(void) {
  tt_seed_from_env();
  tt_configs_dir(configs_dir, sizeof configs_dir);
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_shard_plan") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_minimax_table),   cmocka_unit_test(test_other_shapes),
      cmocka_unit_test(test_sweep),           cmocka_unit_test(test_minimax_tensors),
      cmocka_unit_test(test_small_and_errors), cmocka_unit_test(test_cli_json),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
