// Mesh groups (shard/mesh_comms.h) and collective ops inside programs, under
// mpirun. For every factorization of the world (tp4; tp2.dp2; ep4; ep2.etp2;
// ep2.edp2; ...) each axis group must hold exactly the ranks the layout
// rule names, computed here independently from world ranks; and a program
// with all_reduce / all_gather / reduce_scatter / all_to_all over different
// axes must give, on every rank, the values computed from every rank's
// inputs. Inputs are small integers, so every sum is exact.
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/tpr_comm.h"
#include "shard/mesh_comms.h"
#include "test_util.h"
#include "mpi_util.h"

static tpr_comm_t world;
static uint64_t seed;

typedef struct factorization {
  int tp, ep, etp;
} factorization;

// Members of world rank w's group along `axis`, in group-rank order, from
// the layout: dense w = dp_rank*tp + tp_rank; expert w = (edp_rank*ep + ep_rank)*etp + etp_rank.
static int members(const factorization *f, int n, int w, tpr_mesh_axis axis, int *out) {
  int k = 0;
  for (int v = 0; v < n; v++) {
    bool same;
    switch (axis) {
      case TPR_AXIS_TP: same = v / f->tp == w / f->tp; break;
      case TPR_AXIS_DP: same = v % f->tp == w % f->tp; break;
      case TPR_AXIS_ETP: same = v / f->etp == w / f->etp; break;
      case TPR_AXIS_EP: same = v / (f->ep * f->etp) == w / (f->ep * f->etp) && v % f->etp == w % f->etp; break;
      case TPR_AXIS_EDP: same = v % (f->ep * f->etp) == w % (f->ep * f->etp); break;
      default: same = true;
    }
    if (same) out[k++] = v;  // ascending world rank is ascending group rank for every axis
  }
  return k;
}

static int factorizations(int n, factorization *out) {
  int k = 0;
  for (int tp = 1; tp <= n; tp++)
    for (int ep = 1; ep <= n; ep++)
      for (int etp = 1; etp <= n; etp++)
        if (n % tp == 0 && n % (ep * etp) == 0) out[k++] = (factorization){tp, ep, etp};
  return k;
}

static void test_groups(void **state) {
  int n = tpr_comm_size(world), w = tpr_comm_rank(world);
  factorization fs[64];
  int nf = factorizations(n, fs);
  for (int i = 0; i < nf; i++) {
    tpr_mesh m;
    TT_OK(tpr_mesh_init(n, w, fs[i].tp, fs[i].ep, fs[i].etp, &m));
    tpr_mesh_comms mc;
    TT_OK(tpr_mesh_comms_init(world, &m, &mc));
    for (int a = 0; a < TPR_AXIS_COUNT; a++) {
      int want[64], k = members(&fs[i], n, w, (tpr_mesh_axis)a, want);
      tpr_comm_t c = mc.axis[a];
      assert_string_equal(tpr_comm_name(c), tpr_mesh_axis_name((tpr_mesh_axis)a));
      assert_int_equal(tpr_comm_size(c), k);
      for (int g = 0; g < k; g++) assert_int_equal(tpr_comm_world_rank(c, g), want[g]);
      assert_int_equal(tpr_comm_world_rank(c, tpr_comm_rank(c)), w);
      // The group really connects those ranks: sum and max of world ranks.
      int64_t sum = w, mx = w, want_sum = 0;
      for (int g = 0; g < k; g++) want_sum += want[g];
      TT_OK(tpr_comm_all_reduce(c, &sum, &sum, 1, TPR_I64, TPR_SUM));
      TT_OK(tpr_comm_all_reduce(c, &mx, &mx, 1, TPR_I64, TPR_MAX));
      assert_int_equal(sum, want_sum);
      assert_int_equal(mx, want[k - 1]);
    }
    tpr_mesh_comms_free(&mc);
  }
}

static void test_bad_mesh(void **state) {
  int n = tpr_comm_size(world), w = tpr_comm_rank(world);
  tpr_mesh m;
  assert_int_equal(tpr_mesh_init(n, w, n + 1, 1, 1, &m), TPR_ERR_INVALID_ARG);
  assert_non_null(strstr(tpr_last_error(), "does not divide"));
  // A mesh for a different world than the communicator's.
  TT_OK(tpr_mesh_init(n * 2, w, 2, 1, 1, &m));
  tpr_mesh_comms mc;
  assert_int_equal(tpr_mesh_comms_init(world, &m, &mc), TPR_ERR_INVALID_ARG);
}

// x on world rank v: element i = (v + 1) * 10 + i % 5 (small integers).
static float input_of(int v, int64_t i) { return (float)((v + 1) * 10 + i % 5); }

static void test_program_collectives(void **state) {
  int n = tpr_comm_size(world), w = tpr_comm_rank(world);
  factorization fs[64];
  int nf = factorizations(n, fs);
  for (int i = 0; i < nf; i++) {
    const factorization *f = &fs[i];
    tpr_mesh m;
    TT_OK(tpr_mesh_init(n, w, f->tp, f->ep, f->etp, &m));
    tpr_mesh_comms mc;
    TT_OK(tpr_mesh_comms_init(world, &m, &mc));
    // x (R, 3) with R a multiple of every group size.
    const int64_t R = 2 * n * 3, C = 3;
    tpr_program *p;
    tpr_value_id x, ar, ag, rs, a2a;
    TT_OK(tpr_program_new(&p));
    TT_OK(tpr_program_input(p, "x", TPR_F32, 2, (const int64_t[]){R, C}, &x));
    TT_OK(tpr_pb_all_reduce(p, x, TPR_AXIS_TP, m.tp, TPR_SUM, &ar));          // (R, C)
    TT_OK(tpr_pb_all_gather(p, x, TPR_AXIS_EP, m.ep, &ag));                   // (ep*R, C)
    TT_OK(tpr_pb_reduce_scatter(p, x, TPR_AXIS_DP, m.dp, TPR_MAX, &rs));      // (R/dp, C)
    TT_OK(tpr_pb_all_to_all(p, x, TPR_AXIS_ETP, m.etp, &a2a));                // (R, C)
    TT_OK(tpr_program_output(p, ar, "ar"));
    TT_OK(tpr_program_output(p, ag, "ag"));
    TT_OK(tpr_program_output(p, rs, "rs"));
    TT_OK(tpr_program_output(p, a2a, "a2a"));
    // Rank-agnostic: the same bytes on every rank of this mesh.
    uint64_t h, *hs = malloc((size_t)n * sizeof *hs);
    TT_OK(tpr_program_hash(p, &h));
    TT_OK(tpr_comm_all_gather(world, &h, hs, 1, TPR_I64));
    for (int r = 0; r < n; r++) assert_true(hs[r] == h);
    free(hs);
    float *xs = malloc((size_t)(R * C) * sizeof *xs);
    for (int64_t e = 0; e < R * C; e++) xs[e] = input_of(w, e);
    tpr_tensor *xt;
    TT_OK(tpr_tensor_new(tt_cpu(), TPR_F32, 2, (const int64_t[]){R, C}, &xt));
    TT_OK(tpr_tensor_from_host(xt, xs, (size_t)(R * C) * sizeof *xs));
    tpr_exec *e;
    TT_OK(tpr_exec_new(p, tt_cpu(), &e));
    TT_OK(tpr_exec_bind(e, "x", xt));
    assert_int_equal(tpr_exec_run(e), TPR_ERR_INVALID_ARG);  // no communicators yet: a clear error
    assert_non_null(strstr(tpr_last_error(), "tpr_exec_set_collectives"));
    tpr_exec_collectives hook = tpr_mesh_comms_exec_hook(&mc);
    tpr_exec_set_collectives(e, &hook);
    TT_OK(tpr_exec_run(e));
    int grp[64], k;
    const tpr_tensor *o;
    float *got = malloc((size_t)(n * R * C) * sizeof *got);
    // all_reduce over tp: sum of the tp group's inputs.
    k = members(f, n, w, TPR_AXIS_TP, grp);
    TT_OK(tpr_exec_output(e, "ar", &o));
    TT_OK(tpr_tensor_to_host(o, got, (size_t)(R * C) * sizeof *got));
    for (int64_t j = 0; j < R * C; j++) {
      float want = 0;
      for (int g = 0; g < k; g++) want += input_of(grp[g], j);
      assert_true(got[j] == want);
    }
    // all_gather over ep: block g is ep-rank g's input.
    k = members(f, n, w, TPR_AXIS_EP, grp);
    TT_OK(tpr_exec_output(e, "ag", &o));
    TT_OK(tpr_tensor_to_host(o, got, (size_t)(k * R * C) * sizeof *got));
    for (int g = 0; g < k; g++)
      for (int64_t j = 0; j < R * C; j++) assert_true(got[g * R * C + j] == input_of(grp[g], j));
    // reduce_scatter (max) over dp: this rank's block of the max.
    k = members(f, n, w, TPR_AXIS_DP, grp);
    int me = m.dp_rank;
    int64_t blk = R / k * C;
    TT_OK(tpr_exec_output(e, "rs", &o));
    TT_OK(tpr_tensor_to_host(o, got, (size_t)blk * sizeof *got));
    for (int64_t j = 0; j < blk; j++) {
      float want = -1e30f;
      for (int g = 0; g < k; g++)
        if (input_of(grp[g], me * blk + j) > want) want = input_of(grp[g], me * blk + j);
      assert_true(got[j] == want);
    }
    // all_to_all over etp: block g comes from etp-rank g's block `me`.
    k = members(f, n, w, TPR_AXIS_ETP, grp);
    me = m.etp_rank;
    blk = R / k * C;
    TT_OK(tpr_exec_output(e, "a2a", &o));
    TT_OK(tpr_tensor_to_host(o, got, (size_t)(R * C) * sizeof *got));
    for (int g = 0; g < k; g++)
      for (int64_t j = 0; j < blk; j++) assert_true(got[g * blk + j] == input_of(grp[g], me * blk + j));
    free(got);
    free(xs);
    tpr_exec_free(e);
    tpr_tensor_free(xt);
    tpr_program_free(p);
    tpr_mesh_comms_free(&mc);
  }
}

// A program built for one group size must not run on another.
static void test_group_size_mismatch(void **state) {
  int n = tpr_comm_size(world), w = tpr_comm_rank(world);
  tpr_mesh m;
  TT_OK(tpr_mesh_init(n, w, n, 1, 1, &m));
  tpr_mesh_comms mc;
  TT_OK(tpr_mesh_comms_init(world, &m, &mc));
  tpr_program *p;
  tpr_value_id x, y;
  TT_OK(tpr_program_new(&p));
  TT_OK(tpr_program_input(p, "x", TPR_F32, 1, (const int64_t[]){4}, &x));
  TT_OK(tpr_pb_all_reduce(p, x, TPR_AXIS_TP, n + 1, TPR_SUM, &y));
  TT_OK(tpr_program_output(p, y, "y"));
  tpr_tensor *xt = tt_random_f32(tt_cpu(), 1, (const int64_t[]){4}, NULL);
  tpr_exec *e;
  TT_OK(tpr_exec_new(p, tt_cpu(), &e));
  TT_OK(tpr_exec_bind(e, "x", xt));
  tpr_exec_collectives hook = tpr_mesh_comms_exec_hook(&mc);
  tpr_exec_set_collectives(e, &hook);
  assert_int_equal(tpr_exec_run(e), TPR_ERR_SHAPE);
  assert_non_null(strstr(tpr_last_error(), "built for a group of"));
  tpr_exec_free(e);
  tpr_tensor_free(xt);
  tpr_program_free(p);
  tpr_mesh_comms_free(&mc);
}

int main(int argc, char **argv) {
  world = tt_mpi_world(&argc, &argv);
  seed = tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_groups),
      cmocka_unit_test(test_bad_mesh),
      cmocka_unit_test(test_program_collectives),
      cmocka_unit_test(test_group_size_mismatch),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return tt_mpi_finish(world, failed);
}
