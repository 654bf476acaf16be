// The alltoall expert-parallel dispatcher across ranks, under mpirun: the
// mesh has ep = world, each rank holding ER experts of E = world*ER. One
// rank-agnostic program per rank (the bytes must agree) does
//   counts = moe_counts(g); rc = all_to_all(counts over ep);
//   send = moe_permute(x, g, R); recv = all_to_allv(send, counts, rc);
//   identity path: back = all_to_allv(recv, rc, counts); moe_unpermute(back, g)
//   expert path:   y = moe_grouped_ffn(recv, rc, w13, w2); the same way back.
// Every rank regenerates every rank's inputs from the agreed seed and checks
// rc and recv exactly, the identity path against x * rowsum(g), and all
// ranks' expert outputs (all-gathered) against moe_experts on one process
// with all E experts. Routings: sparse with every rank sending nothing to
// one peer (and one token routed nowhere), and every token of every rank on
// one expert, so all ranks but one receive nothing. Also all_to_allv's
// errors: counts past the buffers, and its shape rule.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/tpr_comm.h"
#include "mpi_util.h"
#include "ops_util.h"
#include "runtime/rng.h"
#include "shard/mesh_comms.h"

enum { N = 9, H = 8, F = 6, ER = 2, KMAX = 3, R = KMAX * N };  // R: the most rows one rank sends

static tpr_comm_t world;
static uint64_t seed;  // rank 0's, broadcast: every rank can regenerate every rank's inputs
static int W, me;

typedef enum routing { SPARSE, ONE_EXPERT } routing;

// Rank v's x (N, H) and gates (N, E), from (seed, v, routing) alone.
static void inputs_of(int v, routing how, float *X, float *G) {
  const int E = W * ER;
  tpr_rng r = {seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(2 * v + how + 1))};
  tpr_rng_fill_normal(&r, X, N * H, 1.0);
  memset(G, 0, (size_t)N * E * sizeof *G);
  if (how == ONE_EXPERT) {
    int hot = (int)(seed % (uint64_t)E);  // the same expert for every rank
    for (int t = 0; t < N; t++) G[t * E + hot] = (float)(0.05 + 0.95 * tpr_rng_uniform(&r));
    return;
  }
  // Peer (v+1) % W gets nothing from v (when there is another peer).
  const int skip = W > 1 ? (v + 1) % W : -1, allowed = E - (W > 1 ? ER : 0);
  for (int t = 0; t < N - 1; t++) {  // token N-1 goes nowhere
    int k = 1 + (int)(tpr_rng_next(&r) % (uint64_t)(allowed < KMAX ? allowed : KMAX));
    for (int j = 0; j < k; j++) {
      int e;
      do e = (int)(tpr_rng_next(&r) % (uint64_t)E);
      while (e / ER == skip || G[t * E + e] != 0);
      G[t * E + e] = (float)(0.05 + 0.95 * tpr_rng_uniform(&r));
    }
  }
}

// All E experts' weights (the same on every rank); rank v holds experts
// [v*ER, (v+1)*ER). w13 (E, 2F, H), w2 (E, H, F).
static void weights(float *W13, float *W2) {
  tpr_rng r = {seed ^ 0x5bd1e995ull};
  tpr_rng_fill_normal(&r, W13, (size_t)W * ER * 2 * F * H, 1.0);
  tpr_rng_fill_normal(&r, W2, (size_t)W * ER * H * F, 1.0);
}

static void build(tpr_program *p, const tpr_mesh *m) {
  const int E = W * ER;
  tpr_value_id x, g, w13, w2, counts, rc, send, recv, back, id, y, yb, ffn;
  TT_OK(tpr_program_input(p, "x", TPR_F32, 2, (const int64_t[]){N, H}, &x));
  TT_OK(tpr_program_input(p, "g", TPR_F32, 2, (const int64_t[]){N, E}, &g));
  TT_OK(tpr_program_param(p, "w13", TPR_F32, 3, (const int64_t[]){ER, 2 * F, H}, &w13));
  TT_OK(tpr_program_param(p, "w2", TPR_F32, 3, (const int64_t[]){ER, H, F}, &w2));
  TT_OK(tpr_pb_moe_counts(p, g, &counts));                                            // (E) i32
  TT_OK(tpr_pb_all_to_all(p, counts, TPR_AXIS_EP, m->ep, &rc));                       // (E): (source, local expert)
  TT_OK(tpr_pb_moe_permute(p, x, g, R, &send));                                       // (R, H)
  TT_OK(tpr_pb_all_to_allv(p, send, counts, rc, TPR_AXIS_EP, m->ep, m->ep * R, &recv));  // (ep*R, H)
  TT_OK(tpr_pb_all_to_allv(p, recv, rc, counts, TPR_AXIS_EP, m->ep, R, &back));       // (R, H)
  TT_OK(tpr_pb_moe_unpermute(p, back, g, &id));                                       // (N, H)
  TT_OK(tpr_pb_moe_grouped_ffn(p, recv, rc, w13, w2, &y));                            // (ep*R, H)
  TT_OK(tpr_pb_all_to_allv(p, y, rc, counts, TPR_AXIS_EP, m->ep, R, &yb));            // (R, H)
  TT_OK(tpr_pb_moe_unpermute(p, yb, g, &ffn));                                        // (N, H)
  TT_OK(tpr_program_output(p, rc, "rc"));
  TT_OK(tpr_program_output(p, recv, "recv"));
  TT_OK(tpr_program_output(p, id, "id"));
  TT_OK(tpr_program_output(p, ffn, "ffn"));
}

static void *output(tpr_exec *e, const char *name) {
  const tpr_tensor *t;
  TT_OK(tpr_exec_output(e, name, &t));
  return tt_to_host(t);
}

// Checks this rank's rc and recv, its identity output, and every rank's
// expert output, for one routing.
static void check_routing(tpr_exec *e, tpr_tensor *xt, tpr_tensor *gt, routing how, const float *W13,
                          const float *W2, const tpr_tensor *w13f, const tpr_tensor *w2f) {
  const int E = W * ER;
  float *X = malloc((size_t)W * N * H * sizeof *X), *G = malloc((size_t)W * N * E * sizeof *G);
  for (int v = 0; v < W; v++) inputs_of(v, how, X + v * N * H, G + v * N * E);
  TT_OK(tpr_tensor_from_host(xt, X + me * N * H, tpr_tensor_nbytes(xt)));
  TT_OK(tpr_tensor_from_host(gt, G + me * N * E, tpr_tensor_nbytes(gt)));
  TT_OK(tpr_exec_run(e));
  int32_t *rc = output(e, "rc");
  float *recv = output(e, "recv"), *id = output(e, "id"), *ffn = output(e, "ffn");
  // rc and recv: source s's rows for my local experts, in (source, expert, token) order.
  int row = 0;
  for (int s = 0; s < W; s++) {
    const float *Xs = X + s * N * H, *Gs = G + s * N * E;
    for (int le = 0; le < ER; le++) {
      int n = 0;
      for (int t = 0; t < N; t++) {
        if (Gs[t * E + me * ER + le] == 0) continue;
        if (memcmp(recv + row * H, Xs + t * H, H * sizeof *recv))
          fail_msg("rank %d: recv row %d is not source %d's token %d for local expert %d", me, row, s, t, le);
        row++, n++;
      }
      assert_int_equal(rc[s * ER + le], n);
    }
  }
  int received = row;
  if (how == SPARSE && W > 1)  // rank me-1 routes nothing here
    for (int le = 0; le < ER; le++) assert_int_equal(rc[((me + W - 1) % W) * ER + le], 0);
  if (how == ONE_EXPERT) assert_int_equal(received, (int)(seed % (uint64_t)E) / ER == me ? W * N : 0);
  // Identity: dispatch and combine give x * (sum of the token's gates), added
  // in f32 in ascending expert order (2u per term).
  const float *Xm = X + me * N * H, *Gm = G + me * N * E;
  for (int t = 0; t < N; t++)
    for (int j = 0; j < H; j++) {
      double want = 0, mag = 0;
      for (int ex = 0; ex < E; ex++) want += (double)Gm[t * E + ex] * Xm[t * H + j], mag += fabs(Gm[t * E + ex] * Xm[t * H + j]);
      if (!(fabs(id[t * H + j] - want) <= 2 * E * 0x1p-24 * mag))
        fail_msg("rank %d identity (%d, %d): got %.9g want %.17g", me, t, j, id[t * H + j], want);
    }
  // Expert outputs of every rank against moe_experts on one process.
  float *all = malloc((size_t)W * N * H * sizeof *all);
  TT_OK(tpr_comm_all_gather(world, ffn, all, (size_t)N * H, TPR_F32));
  tpr_tensor *out = tt_new(TPR_F32, 2, (const int64_t[]){N, H});
  double worst = 0, rolled = 0;
  for (int v = 0; v < W; v++) {
    tpr_tensor *xv = tt_from_host(TPR_F32, 2, (const int64_t[]){N, H}, X + v * N * H);
    tpr_tensor *gv = tt_from_host(TPR_F32, 2, (const int64_t[]){N, E}, G + v * N * E);
    TT_OK(tpr_moe_experts(tt_cpu(), xv, gv, w13f, w2f, out));
    float *want = tt_to_host(out);
    double dw[N * H], mag = 1e-30, err = 0;
    for (int i = 0; i < N * H; i++) dw[i] = want[i], mag = fmax(mag, fabs(want[i]));
    for (int i = 0; i < N * H; i++) err = isfinite(all[v * N * H + i]) ? fmax(err, fabs(all[v * N * H + i] - dw[i])) : INFINITY;
    if (mag > 1e-29) worst = fmax(worst, err / mag);
    // Negative control: each rank's experts taken from the next rank's block.
    if (W > 1) {
      tpr_tensor *r13 = tt_new(TPR_F32, 3, (const int64_t[]){E, 2 * F, H}), *r2 = tt_new(TPR_F32, 3, (const int64_t[]){E, H, F});
      const size_t b13 = (size_t)ER * 2 * F * H, b2 = (size_t)ER * H * F;
      float *S13 = malloc((size_t)W * b13 * sizeof *S13), *S2 = malloc((size_t)W * b2 * sizeof *S2);
      for (int q = 0; q < W; q++) {
        memcpy(S13 + q * b13, W13 + ((q + 1) % W) * b13, b13 * sizeof *S13);
        memcpy(S2 + q * b2, W2 + ((q + 1) % W) * b2, b2 * sizeof *S2);
      }
      TT_OK(tpr_tensor_from_host(r13, S13, tpr_tensor_nbytes(r13)));
      TT_OK(tpr_tensor_from_host(r2, S2, tpr_tensor_nbytes(r2)));
      TT_OK(tpr_moe_experts(tt_cpu(), xv, gv, r13, r2, out));
      float *bad = tt_to_host(out);
      double e2 = 0;
      for (int i = 0; i < N * H; i++) e2 = fmax(e2, fabs(all[v * N * H + i] - bad[i]));
      rolled = fmax(rolled, e2 / mag);
      free(S13), free(S2), free(bad);
      tpr_tensor_free(r13), tpr_tensor_free(r2);
    }
    free(want);
    tpr_tensor_free(xv), tpr_tensor_free(gv);
  }
  if (!(worst <= 1e-5)) fail_msg("rank %d routing %d: expert outputs off by %.3g of their scale", me, how, worst);
  if (W > 1) assert_true(rolled > 1e-2);
  free(X), free(G), free(rc), free(recv), free(id), free(ffn), free(all);
  tpr_tensor_free(out);
}

static void test_exchange(void **state) {
  tpr_mesh m;
  TT_OK(tpr_mesh_init(W, me, 1, W, 1, &m));
  tpr_mesh_comms mc;
  TT_OK(tpr_mesh_comms_init(world, &m, &mc));
  tpr_program *p;
  TT_OK(tpr_program_new(&p));
  build(p, &m);
  uint64_t h, *hs = malloc((size_t)W * sizeof *hs);  // rank-agnostic: the same bytes everywhere
  TT_OK(tpr_program_hash(p, &h));
  TT_OK(tpr_comm_all_gather(world, &h, hs, 1, TPR_I64));
  for (int r = 0; r < W; r++) assert_true(hs[r] == h);
  const int E = W * ER;
  float *W13 = malloc((size_t)E * 2 * F * H * sizeof *W13), *W2 = malloc((size_t)E * H * F * sizeof *W2);
  weights(W13, W2);
  tpr_tensor *w13f = tt_from_host(TPR_F32, 3, (const int64_t[]){E, 2 * F, H}, W13);
  tpr_tensor *w2f = tt_from_host(TPR_F32, 3, (const int64_t[]){E, H, F}, W2);
  // This rank's shard: its contiguous block of ER experts.
  tpr_tensor *w13l = tt_from_host(TPR_F32, 3, (const int64_t[]){ER, 2 * F, H}, W13 + (size_t)me * ER * 2 * F * H);
  tpr_tensor *w2l = tt_from_host(TPR_F32, 3, (const int64_t[]){ER, H, F}, W2 + (size_t)me * ER * H * F);
  tpr_tensor *xt = tt_new(TPR_F32, 2, (const int64_t[]){N, H}), *gt = tt_new(TPR_F32, 2, (const int64_t[]){N, E});
  tpr_exec *e;
  TT_OK(tpr_exec_new(p, tt_cpu(), &e));
  TT_OK(tpr_exec_bind(e, "x", xt));
  TT_OK(tpr_exec_bind(e, "g", gt));
  TT_OK(tpr_exec_bind(e, "w13", w13l));
  TT_OK(tpr_exec_bind(e, "w2", w2l));
  tpr_exec_collectives hook = tpr_mesh_comms_exec_hook(&mc);
  tpr_exec_set_collectives(e, &hook);
  // The same exec for both routings: rows the second run does not count may
  // hold the first run's bytes, and nothing may read them.
  check_routing(e, xt, gt, SPARSE, W13, W2, w13f, w2f);
  check_routing(e, xt, gt, ONE_EXPERT, W13, W2, w13f, w2f);
  check_routing(e, xt, gt, SPARSE, W13, W2, w13f, w2f);
  tpr_exec_free(e);
  tpr_tensor *all[] = {w13f, w2f, w13l, w2l, xt, gt};
  for (int i = 0; i < 6; i++) tpr_tensor_free(all[i]);
  free(W13), free(W2), free(hs);
  tpr_program_free(p);
  tpr_mesh_comms_free(&mc);
}

// Counts that promise more rows than the receive buffer holds (the send
// side fits): a clear error on every rank, each checking its own receive
// side before any data moves, so no rank hangs.
static void test_exchange_overflow(void **state) {
  tpr_mesh m;
  TT_OK(tpr_mesh_init(W, me, 1, W, 1, &m));
  tpr_mesh_comms mc;
  TT_OK(tpr_mesh_comms_init(world, &m, &mc));
  tpr_program *p;
  tpr_value_id x, c, y;
  TT_OK(tpr_program_new(&p));
  TT_OK(tpr_program_input(p, "x", TPR_F32, 2, (const int64_t[]){5 * W, 3}, &x));
  TT_OK(tpr_program_input(p, "c", TPR_I32, 1, (const int64_t[]){W}, &c));
  TT_OK(tpr_pb_all_to_allv(p, x, c, c, TPR_AXIS_EP, W, 4, &y));  // (4, 3)
  TT_OK(tpr_program_output(p, y, "y"));
  int32_t *cnt = malloc((size_t)W * sizeof *cnt);
  for (int j = 0; j < W; j++) cnt[j] = 5;  // 5*W rows each way: all of x, more than 4
  tpr_tensor *xt = tt_random_f32(tt_cpu(), 2, (const int64_t[]){5 * W, 3}, NULL);
  tpr_tensor *ct = tt_from_host(TPR_I32, 1, (const int64_t[]){W}, cnt);
  tpr_exec *e;
  TT_OK(tpr_exec_new(p, tt_cpu(), &e));
  TT_OK(tpr_exec_bind(e, "x", xt));
  TT_OK(tpr_exec_bind(e, "c", ct));
  tpr_exec_collectives hook = tpr_mesh_comms_exec_hook(&mc);
  tpr_exec_set_collectives(e, &hook);
  assert_int_equal(tpr_exec_run(e), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "to receive"));
  tpr_exec_free(e);
  tpr_tensor_free(xt), tpr_tensor_free(ct);
  free(cnt);
  tpr_program_free(p);
  tpr_mesh_comms_free(&mc);
}

// all_to_allv's shape rule, and that it counts as a collective.
static void test_all_to_allv_rule(void **state) {
  tpr_tensor *x = tt_new(TPR_F32, 2, (const int64_t[]){8, 4}), *c6 = tt_new(TPR_I32, 1, (const int64_t[]){6});
  tpr_tensor *c3 = tt_new(TPR_I32, 1, (const int64_t[]){3}), *c64 = tt_new(TPR_I64, 1, (const int64_t[]){6}), *xt;
  TT_OK(tpr_tensor_transpose(x, 0, 1, &xt));
  tpr_tensor d;
  tpr_op_attrs at = {.n_i = 3, .i = {TPR_AXIS_EP, 3, 10}};
#define INFER(a, b, c) tpr__op_infer(TPR_OP_ALL_TO_ALLV, (const tpr_tensor *const[]){a, b, c}, 3, &at, &d)
  TT_OK(INFER(x, c6, c6));
  assert_int_equal(d.ndim, 2);
  assert_true(d.shape[0] == 10 && d.shape[1] == 4 && d.dtype == TPR_F32);
  assert_int_equal(INFER(x, c6, c3), TPR_ERR_SHAPE);   // lengths differ
  assert_int_equal(INFER(x, c64, c6), TPR_ERR_DTYPE);
  assert_int_equal(INFER(xt, c6, c6), TPR_ERR_SHAPE);  // strided x
  at.i[1] = 4;
  assert_int_equal(INFER(x, c6, c6), TPR_ERR_SHAPE);   // 6 counts for 4 peers
  at.i[1] = 3, at.i[2] = -1;
  assert_int_equal(INFER(x, c6, c6), TPR_ERR_INVALID_ARG);
  at.i[2] = 10, at.i[0] = 99;
  assert_int_equal(INFER(x, c6, c6), TPR_ERR_INVALID_ARG);
  at.i[0] = TPR_AXIS_EP, at.n_i = 2;
  assert_int_equal(INFER(x, c6, c6), TPR_ERR_INVALID_ARG);
#undef INFER
  assert_true(tpr_op_is_collective(TPR_OP_ALL_TO_ALLV) && tpr_op_is_collective(TPR_OP_ALL_TO_ALL));
  const tpr_op_kind local[] = {TPR_OP_MOE_CAPACITY, TPR_OP_ROW_SLICE, TPR_OP_MOE_COUNTS, TPR_OP_MOE_PERMUTE,
                               TPR_OP_MOE_GROUPED_FFN, TPR_OP_MOE_UNPERMUTE};
  const char *names[] = {"moe_capacity", "row_slice", "moe_counts", "moe_permute", "moe_grouped_ffn", "moe_unpermute"};
  for (int i = 0; i < 6; i++) {
    assert_false(tpr_op_is_collective(local[i]));
    assert_string_equal(tpr_op_name(local[i]), names[i]);
  }
  assert_string_equal(tpr_op_name(TPR_OP_ALL_TO_ALLV), "all_to_allv");
  assert_int_equal(tpr_op_num_inputs(TPR_OP_ALL_TO_ALLV), 3);
  // Eagerly it is refused: collectives run in a program exec.
  tpr_tensor *o = tt_new(TPR_F32, 2, (const int64_t[]){10, 4});
  at = (tpr_op_attrs){.n_i = 3, .i = {TPR_AXIS_EP, 3, 10}};
  assert_int_equal(tpr_op_run(tt_cpu(), TPR_OP_ALL_TO_ALLV, (const tpr_tensor *const[]){x, c6, c6}, 3, &at, o),
                   TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "collective"));
  tpr_tensor *all[] = {x, c6, c3, c64, xt, o};
  for (int i = 0; i < 6; i++) tpr_tensor_free(all[i]);
}

int main(int argc, char **argv) {
  world = tt_mpi_world(&argc, &argv);
  W = tpr_comm_size(world), me = tpr_comm_rank(world);
  seed = tt_seed_from_env();
  if (tpr_comm_broadcast(world, &seed, &seed, 1, TPR_I64, 0) != TPR_OK) return tt_mpi_finish(world, 1);
  if (me == 0) printf("# every rank uses rank 0's seed %llu\n", (unsigned long long)seed);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exchange),
      cmocka_unit_test(test_exchange_overflow),
      cmocka_unit_test(test_all_to_allv_rule),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return tt_mpi_finish(world, failed);
}
