// Hunyuan-MoE (models/hunyuan_moe.h) through the engine's session against
// transformers' HunYuanMoEV1ForCausalLM (tests/fixtures/hunyuan_moe_tiny, made
// by scripts/reference/make_hunyuan_moe_fixture.py), under mpirun at the mesh
// on the command line (--tp/--dp/--ep):
//  - parity: logits of both prompts within 1e-4 of max |logit|;
//  - greedy: prefill a random prefix, decode the rest and transformers' 8
//    greedy tokens one at a time through the KV cache: the tokens equal,
//    every decoded row within the bound of transformers' and of one full
//    forward (1e-5);
//  - negative control (a): query/key layernorm before RoPE (Qwen3's order)
//    instead of after must break the parity bound;
//  - negative control (b): the shared expert dropped (a copy of the
//    checkpoint whose shared_mlp.down_proj is zero) must break it;
//  - capacity mode (factor 1, re-routing, a fresh seed): the logits on this
//    mesh equal those of a one-rank session on every rank (same drops, same
//    re-routing draws: the decision does not depend on the layout) within
//    1e-5, some assignments were dropped and re-routed, and the logits
//    differ from dropless ones (the mode did something).
// The prefix length comes from a fresh seed each run (printed; TPR_TEST_SEED).
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/session.h"
#include "m2_ref.h"
#include "mpi_util.h"
#include "runtime/file_io.h"
#include "shard/safetensors.h"

#define FIX TPR_FIXTURES "/hunyuan_moe_tiny"
#define V 256
#define TA 11
#define TB 5
#define NG 8
#define BOUND 1e-4     // max|d| <= BOUND * max|ref|: the TP parity tolerance (as qwen3_moe's)
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

static tpr_session *open_session(const char *dir, bool control) {
  tpr_session_opts o = {.model_dir = dir, .max_seq = TA + NG, .max_batch = 1, .tp = tp, .dp = dp, .ep = ep,
                        .per_rank_qk_norm = control, .force_tp_rank = -1};
  tpr_session *s = NULL;
  TT_OK(tpr_session_open(&o, world, tt_cpu(), &s));
  return s;
}

// A session in capacity mode (factor 1, re-routing with `seed`) on comm at
// the mesh given.
static tpr_session *open_capacity(tpr_comm_t comm, int t, int d, int e, uint64_t seed) {
  tpr_session_opts o = {.model_dir = FIX, .max_seq = TA + NG, .max_batch = 1, .tp = t, .dp = d, .ep = e,
                        .force_tp_rank = -1, .moe_stats = true,
                        .moe = {.capacity_factor = 1.0, .reroute_dropped = true, .seed = seed}};
  tpr_session *s = NULL;
  TT_OK(tpr_session_open(&o, comm, tt_cpu(), &s));
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
  tpr_session *s = open_session(FIX, false);
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
  static float full[(TA + NG) * V], step[TA * V], whole[(TA + NG) * V];
  tpr_session *s = open_session(FIX, false);
  TT_OK(tpr_session_forward(s, seq, P, 0, step));
  double kv = 0, vs_ref = 0;
  for (int64_t t = P; t < TA + NG - 1; t++) {  // decode token t, whose row predicts token t+1
    TT_OK(tpr_session_forward(s, &seq[t], 1, t, step));
    if (t >= TA - 1) {
      int g = (int)(t - (TA - 1));
      seq[t + 1] = argmax(step);
      vs_ref = fmax(vs_ref, m2_rel_err(step, ref.greedy_logits + g * V, V));
      if (seq[t + 1] != ref.greedy[g]) fail_msg("greedy token %d is %d, transformers' %d", g, seq[t + 1], ref.greedy[g]);
    }
    memcpy(full + t * V, step, V * sizeof *step);
  }
  TT_OK(tpr_session_forward(s, seq, TA + NG - 1, 0, whole));
  for (int64_t r = P; r < TA + NG - 1; r++) kv = fmax(kv, m2_rel_err(full + r * V, whole + r * V, V));
  tpr_session_close(s);
  if (R == 0)
    printf("greedy (prefill %lld of %d, seed %lld): tokens equal; decoded rows vs transformers %.3g (bound %.0e), "
           "vs one full forward %.3g (bound %.0e)\n", (long long)P, TA, (long long)seed, vs_ref, BOUND, kv, KV_BOUND);
  if (!(vs_ref <= BOUND)) fail_msg("decoded logits differ from transformers' by %.3g", vs_ref);
  if (!(kv <= KV_BOUND)) fail_msg("cached decode differs from a full forward by %.3g", kv);
}

static void test_control_norm_before_rope(void **state) {
  (void)state;
  tpr_session *s = open_session(FIX, true);
  if (R == 0) printf("control (a) query/key layernorm before RoPE, tp %d:\n", tp);
  double e = parity(s);
  tpr_session_close(s);
  if (!(e > BOUND)) fail_msg("q/k norm before RoPE passed the parity bound (%.3g <= %.0e)", e, BOUND);
}

// Rank 0 writes dir/model.safetensors: the fixture with every
// shared_mlp.down_proj zeroed (the shared expert adds nothing), and the config.
static void write_no_shared(const char *dir) {
  tpr_st_set *set;
  TT_OK(tpr_st_open(FIX "/model.safetensors", &set));
  int n = tpr_st_count(set), zeroed = 0;
  tpr_st_write_entry *e = calloc((size_t)n, sizeof *e);
  void **bufs = calloc((size_t)n, sizeof *bufs);
  for (int i = 0; i < n; i++) {
    const tpr_st_tensor *t = tpr_st_get(set, i);
    bufs[i] = calloc(1, t->nbytes);
    if (!strstr(t->name, "shared_mlp.down_proj"))
      memcpy(bufs[i], t->data, t->nbytes);
    else
      zeroed++;
    e[i] = (tpr_st_write_entry){t->name, t->dtype, t->ndim, t->shape, bufs[i]};
  }
  char path[512];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  TT_OK(tpr_st_write(path, e, n, NULL));
  uint8_t *cfg;
  size_t len;
  TT_OK(tpr_file_read(FIX "/config.json", &cfg, &len));
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(cfg, 1, len, f), len);
  fclose(f);
  free(cfg);
  for (int i = 0; i < n; i++) free(bufs[i]);
  free(bufs), free(e);
  tpr_st_close(set);
  assert_int_equal(zeroed, 3);  // one per layer
}

static void test_control_no_shared_expert(void **state) {
  (void)state;
  char dir[256] = "/tmp/tpr_hunyuan_noshared_XXXXXX";
  if (R == 0) {
    assert_non_null(mkdtemp(dir));
    write_no_shared(dir);
  }
  TT_OK(tpr_comm_broadcast(world, dir, dir, sizeof dir, TPR_U8, 0));
  tpr_session *s = open_session(dir, false);
  if (R == 0) printf("control (b) shared expert dropped, tp %d dp %d ep %d:\n", tp, dp, ep);
  double e = parity(s);
  tpr_session_close(s);
  TT_OK(tpr_comm_barrier(world));
  if (R == 0) {
    char path[300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
  }
  if (!(e > BOUND)) fail_msg("without the shared expert the logits passed the parity bound (%.3g <= %.0e)", e, BOUND);
}

static void test_capacity_layouts(void **state) {
  (void)state;
  int64_t seed = R == 0 ? (int64_t)(tt_next_u64() >> 1) : 0;
  TT_OK(tpr_comm_broadcast(world, &seed, &seed, 1, TPR_I64, 0));
  static float mesh[TA * V], one[TA * V];
  tpr_session *s = open_capacity(world, tp, dp, ep, (uint64_t)seed);
  TT_OK(tpr_session_forward(s, ref.a, TA, 0, mesh));
  tpr_moe_stats st;
  TT_OK(tpr_session_moe_stats(s, &st));
  int64_t dropped = 0, rerouted = 0, layers = st.layers;
  for (int64_t l = 0; l < layers; l++) dropped += st.dropped[l], rerouted += st.rerouted[l];
  tpr_moe_stats_free(&st);
  tpr_session_close(s);
  tpr_comm_t alone;  // every rank on its own: the one-rank reference
  TT_OK(tpr_comm_split(world, R, 0, "alone", &alone));
  s = open_capacity(alone, 1, 1, 1, (uint64_t)seed);
  TT_OK(tpr_session_forward(s, ref.a, TA, 0, one));
  tpr_session_close(s);
  tpr_comm_free(alone);
  double e = m2_rel_err(mesh, one, TA * V), vs_dropless = m2_rel_err(one, ref.logits_a, TA * V);
  float worst = (float)e;
  TT_OK(tpr_comm_all_reduce(world, &worst, &worst, 1, TPR_F32, TPR_MAX));
  if (R == 0)
    printf("capacity 1.0 + re-routing (seed %lld), tp %d dp %d ep %d: %lld dropped, %lld re-routed over %lld layers; "
           "vs one rank %.3g (bound %.0e, worst rank %.3g); vs dropless transformers %.3g\n", (long long)seed, tp, dp,
           ep, (long long)dropped, (long long)rerouted, (long long)layers, e, KV_BOUND, worst, vs_dropless);
  if (!(worst <= KV_BOUND)) fail_msg("capacity-mode logits depend on the layout: %.3g of max |logit|", worst);
  if (dropped == 0 || rerouted == 0) fail_msg("capacity 1.0 dropped %lld, re-routed %lld", (long long)dropped,
                                              (long long)rerouted);
  if (!(vs_dropless > BOUND)) fail_msg("capacity mode changed nothing (%.3g vs dropless)", vs_dropless);
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
      cmocka_unit_test(test_control_norm_before_rope),
      cmocka_unit_test(test_control_no_shared_expert),
      cmocka_unit_test(test_capacity_layouts),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return tt_mpi_finish(world, failed);
}
