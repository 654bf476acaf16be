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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "family_parity.h"
#include "m2_ref.h"
#include "runtime/file_io.h"

#define FIX TPR_FIXTURES "/hunyuan_moe_tiny"
#define BOUND 1e-4     // max|d| <= BOUND * max|ref|: the TP parity tolerance (as qwen3_moe's)
#define KV_BOUND 1e-5  // cached decode vs one full forward

static fp_ref ref;

// control: per_rank_qk_norm (TPR_QK_CONTROL_SWAP_ORDER for this family).
static tpr_session_opts session_opts(const char *dir, bool control) {
  tpr_session_opts o = fp_session_opts(dir, ref.ta + ref.ng);
  o.per_rank_qk_norm = control;
  return o;
}

// A session in capacity mode (factor 1, re-routing with `seed`) on comm at
// the mesh given.
static tpr_session *open_capacity(tpr_comm_t comm, int t, int d, int e, uint64_t seed) {
  tpr_session_opts o = fp_session_opts(FIX, ref.ta + ref.ng);
  o.tp = t, o.dp = d, o.ep = e, o.moe_stats = true;
  o.moe = (tpr_moe_opts){.capacity_factor = 1.0, .reroute_dropped = true, .seed = seed};
  return fp_open(&o, comm);
}

static void test_parity(void **state) {
  (void)state;
  tpr_session_opts o = session_opts(FIX, false);
  fp_test_parity(&o, &ref, BOUND);
}

static void test_greedy_cached(void **state) {
  (void)state;
  tpr_session_opts o = session_opts(FIX, false);
  fp_test_greedy_cached(&o, &ref, BOUND, KV_BOUND);
}

static void test_control_norm_before_rope(void **state) {
  (void)state;
  tpr_session_opts o = session_opts(FIX, true);
  if (fp.R == 0) printf("control (a) query/key layernorm before RoPE, tp %d:\n", fp.tp);
  fp_test_control(&o, &ref, BOUND, "q/k norm before RoPE");
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
  if (fp.R == 0) {
    assert_non_null(mkdtemp(dir));
    write_no_shared(dir);
  }
  TT_OK(tpr_comm_broadcast(fp.world, dir, dir, sizeof dir, TPR_U8, 0));
  tpr_session_opts o = session_opts(dir, false);
  tpr_session *s = fp_open(&o, NULL);
  if (fp.R == 0) printf("control (b) shared expert dropped, tp %d dp %d ep %d:\n", fp.tp, fp.dp, fp.ep);
  double e = fp_parity(s, &ref);
  tpr_session_close(s);
  TT_OK(tpr_comm_barrier(fp.world));
  if (fp.R == 0) {
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
  int64_t seed = fp_shared_seed();
  const int64_t n = ref.ta * ref.V;
  float *mesh = malloc((size_t)n * sizeof *mesh), *one = malloc((size_t)n * sizeof *one);
  tpr_session *s = open_capacity(fp.world, fp.tp, fp.dp, fp.ep, (uint64_t)seed);
  TT_OK(tpr_session_forward(s, ref.a, ref.ta, 0, mesh));
  tpr_moe_stats st;
  TT_OK(tpr_session_moe_stats(s, &st));
  int64_t dropped = 0, rerouted = 0, layers = st.layers;
  for (int64_t l = 0; l < layers; l++) dropped += st.dropped[l], rerouted += st.rerouted[l];
  tpr_moe_stats_free(&st);
  tpr_session_close(s);
  tpr_comm_t alone;  // every rank on its own: the one-rank reference
  TT_OK(tpr_comm_split(fp.world, fp.R, 0, "alone", &alone));
  s = open_capacity(alone, 1, 1, 1, (uint64_t)seed);
  TT_OK(tpr_session_forward(s, ref.a, ref.ta, 0, one));
  tpr_session_close(s);
  tpr_comm_free(alone);
  double e = m2_rel_err(mesh, one, n), vs_dropless = m2_rel_err(one, ref.logits_a, n);
  free(mesh), free(one);
  float worst = (float)e;
  TT_OK(tpr_comm_all_reduce(fp.world, &worst, &worst, 1, TPR_F32, TPR_MAX));
  if (fp.R == 0)
    printf("capacity 1.0 + re-routing (seed %lld), tp %d dp %d ep %d: %lld dropped, %lld re-routed over %lld layers; "
           "vs one rank %.3g (bound %.0e, worst rank %.3g); vs dropless transformers %.3g\n", (long long)seed, fp.tp,
           fp.dp, fp.ep, (long long)dropped, (long long)rerouted, (long long)layers, e, KV_BOUND, worst, vs_dropless);
  if (!(worst <= KV_BOUND)) fail_msg("capacity-mode logits depend on the layout: %.3g of max |logit|", worst);
  if (dropped == 0 || rerouted == 0) fail_msg("capacity 1.0 dropped %lld, re-routed %lld", (long long)dropped,
                                              (long long)rerouted);
  if (!(vs_dropless > BOUND)) fail_msg("capacity mode changed nothing (%.3g vs dropless)", vs_dropless);
}

int main(int argc, char **argv) {
  fp_init(&argc, &argv);
  fp_load_ref(FIX, 256, 11, 5, 8, &ref);  // V, the two prompts' lengths, greedy tokens
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parity),
      cmocka_unit_test(test_greedy_cached),
      cmocka_unit_test(test_control_norm_before_rope),
      cmocka_unit_test(test_control_no_shared_expert),
      cmocka_unit_test(test_capacity_layouts),
  };
  return fp_run(tests, sizeof tests / sizeof *tests, &ref);
}
