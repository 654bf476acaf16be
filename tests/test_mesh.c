// The device mesh (shard/mesh.h): every factorization of worlds 1..8, the
// rank tensor, and a program that picks its tp shard through the rank tensor
// (index_select of a (tp, n) weight by rank[TPR_RANK_TP]). The program bytes
// must not depend on which rank will run them; only the bound rank tensor does.
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "shard/mesh.h"

static void expect_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("expected '%s' in '%s'", needle, hay);
}

// Checks every rank of one factorization; returns false if it is impossible.
static bool check_factorization(int world, int tp, int ep, int etp) {
  int seen_dense[8][8] = {{0}};      // [dp_rank][tp_rank]
  int seen_expert[8][8][8] = {{{0}}};  // [edp_rank][ep_rank][etp_rank]
  for (int r = 0; r < world; r++) {
    tpr_mesh m;
    tpr_status rc = tpr_mesh_init(world, r, tp, ep, etp, &m);
    bool possible = world % tp == 0 && world % (ep * etp) == 0;
    if (!possible) {
      assert_int_equal(rc, TPR_ERR_INVALID_ARG);
      return false;
    }
    TT_OK(rc);
    assert_int_equal(m.world_size, world);
    assert_int_equal(m.world_rank, r);
    assert_int_equal(m.tp, tp);
    assert_int_equal(m.ep, ep);
    assert_int_equal(m.etp, etp);
    assert_int_equal(m.dp, world / tp);
    assert_int_equal(m.edp, world / (ep * etp));
    assert_int_equal(m.dp * m.tp, world);
    assert_int_equal(m.edp * m.ep * m.etp, world);
    assert_in_range(m.tp_rank, 0, tp - 1);
    assert_in_range(m.dp_rank, 0, m.dp - 1);
    assert_in_range(m.ep_rank, 0, ep - 1);
    assert_in_range(m.etp_rank, 0, etp - 1);
    assert_in_range(m.edp_rank, 0, m.edp - 1);
    // tp varies fastest among dense coordinates, etp then ep among expert ones.
    assert_int_equal(r, m.dp_rank * tp + m.tp_rank);
    assert_int_equal(r, (m.edp_rank * ep + m.ep_rank) * etp + m.etp_rank);
    seen_dense[m.dp_rank][m.tp_rank]++;
    seen_expert[m.edp_rank][m.ep_rank][m.etp_rank]++;
  }
  // Coordinates are a bijection: each tp group holds tp distinct ranks, and so on.
  for (int d = 0; d < world / tp; d++)
    for (int t = 0; t < tp; t++) assert_int_equal(seen_dense[d][t], 1);
  for (int e = 0; e < world / (ep * etp); e++)
    for (int p = 0; p < ep; p++)
      for (int t = 0; t < etp; t++) assert_int_equal(seen_expert[e][p][t], 1);
  return true;
}

static void test_all_factorizations(void **state) {
  int possible = 0, impossible = 0;
  for (int world = 1; world <= 8; world++)
    for (int tp = 1; tp <= 8; tp++)
      for (int ep = 1; ep <= 8; ep++)
        for (int etp = 1; etp * ep <= 8; etp++) {
          if (check_factorization(world, tp, ep, etp)) possible++; else impossible++;
        }
  // The enumeration itself: sum over worlds of (tp divisors) x ((ep, etp)
  // pairs whose product divides the world), e.g. world 8: 4 x 10 = 40.
  assert_int_equal(possible, 1 + 6 + 6 + 18 + 6 + 36 + 6 + 40);
  assert_int_equal(possible + impossible, 8 * 8 * 20);
}

static void test_impossible_factorizations(void **state) {
  tpr_mesh m;
  assert_int_equal(tpr_mesh_init(4, 0, 3, 1, 1, &m), TPR_ERR_INVALID_ARG);
  expect_contains(tpr_last_error(), "tp=3");
  expect_contains(tpr_last_error(), "4 ranks");
  assert_int_equal(tpr_mesh_init(4, 1, 1, 4, 2, &m), TPR_ERR_INVALID_ARG);
  expect_contains(tpr_last_error(), "ep*etp = 4*2 = 8");
  expect_contains(tpr_last_error(), "world of 4");
  assert_int_equal(tpr_mesh_init(6, 0, 4, 1, 1, &m), TPR_ERR_INVALID_ARG);
  expect_contains(tpr_last_error(), "tp=4");
  expect_contains(tpr_last_error(), "6");
  static const int bad_sizes[][3] = {{0, 1, 1}, {1, 0, 1}, {1, 1, 0}, {-2, 1, 1}, {1, -1, 1}, {1, 1, -4}};
  for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
    assert_int_equal(tpr_mesh_init(4, 0, bad_sizes[i][0], bad_sizes[i][1], bad_sizes[i][2], &m), TPR_ERR_INVALID_ARG);
    char want[64];
    snprintf(want, sizeof want, "tp=%d ep=%d etp=%d", bad_sizes[i][0], bad_sizes[i][1], bad_sizes[i][2]);
    expect_contains(tpr_last_error(), want);
  }
  int world = (int)tt_randint(1, 64);
  assert_int_equal(tpr_mesh_init(world, world, 1, 1, 1, &m), TPR_ERR_INVALID_ARG);
  char want[64];
  snprintf(want, sizeof want, "rank %d of a world of %d", world, world);
  expect_contains(tpr_last_error(), want);
  assert_int_equal(tpr_mesh_init(world, -1, 1, 1, 1, &m), TPR_ERR_INVALID_ARG);
  expect_contains(tpr_last_error(), "rank -1");
  assert_int_equal(tpr_mesh_init(0, 0, 1, 1, 1, &m), TPR_ERR_INVALID_ARG);
  assert_int_equal(tpr_mesh_init(-3, 0, 1, 1, 1, &m), TPR_ERR_INVALID_ARG);
}

static void test_rank_tensor(void **state) {
  for (int rep = 0; rep < 20; rep++) {
    static const int worlds[] = {1, 2, 4, 6, 8, 12, 16};
    int world = worlds[tt_randint(0, 6)];
    int tp, ep, etp;
    do tp = (int)tt_randint(1, world); while (world % tp);
    do ep = (int)tt_randint(1, world), etp = (int)tt_randint(1, world); while (world % (ep * etp));
    int rank = (int)tt_randint(0, world - 1);
    tpr_mesh m;
    TT_OK(tpr_mesh_init(world, rank, tp, ep, etp, &m));
    int32_t v[TPR_RANK_SLOTS], got[TPR_RANK_SLOTS];
    memset(v, 0xff, sizeof v);
    tpr_mesh_rank_values(&m, v);
    const int32_t want[TPR_RANK_SLOTS] = {
        [TPR_RANK_TP] = m.tp_rank,   [TPR_RANK_TP_SIZE] = tp,    [TPR_RANK_DP] = m.dp_rank,
        [TPR_RANK_DP_SIZE] = m.dp,   [TPR_RANK_EP] = m.ep_rank,  [TPR_RANK_EP_SIZE] = ep,
        [TPR_RANK_ETP] = m.etp_rank, [TPR_RANK_ETP_SIZE] = etp,  [TPR_RANK_EDP] = m.edp_rank,
        [TPR_RANK_EDP_SIZE] = m.edp, [TPR_RANK_WORLD] = rank,    [TPR_RANK_WORLD_SIZE] = world};
    assert_memory_equal(v, want, sizeof want);
    tpr_tensor *t = NULL;
    TT_OK(tpr_mesh_rank_tensor(&m, tt_cpu(), &t));
    assert_int_equal(t->dtype, TPR_I32);
    assert_int_equal(t->ndim, 1);
    assert_int_equal(t->shape[0], TPR_RANK_SLOTS);
    TT_OK(tpr_tensor_to_host(t, got, sizeof got));
    assert_memory_equal(got, v, sizeof v);
    tpr_tensor_free(t);
  }
}

// x = param "w" (tp*n) viewed as (tp, n); out "row" (1, n) = x[rank[TP]].
static tpr_program *build_shard_program(const tpr_mesh *m, int64_t n) {
  tpr_program *p = NULL;
  tpr_value_id w, w2, rank, idx, row;
  TT_OK(tpr_program_new(&p));
  TT_OK(tpr_program_rank_param(p, &rank));
  TT_OK(tpr_program_param(p, "w", TPR_F32, 1, (const int64_t[]){m->tp * n}, &w));
  TT_OK(tpr_pb_reshape(p, w, 2, (const int64_t[]){m->tp, n}, &w2));
  TT_OK(tpr_pb_rank_index(p, rank, TPR_RANK_TP, &idx));
  tpr_tensor desc;
  TT_OK(tpr_program_value(p, idx, &desc));
  assert_int_equal(desc.dtype, TPR_I32);
  assert_int_equal(desc.ndim, 1);
  assert_int_equal(desc.shape[0], 1);
  TT_OK(tpr_pb_index_select(p, w2, 0, idx, &row));
  TT_OK(tpr_program_output(p, row, "row"));
  return p;
}

static void serialize(const tpr_program *p, uint8_t **bytes, size_t *len) {
  TT_OK(tpr_program_serialize(p, bytes, len));
  assert_true(*len > 0);
}

static void test_program_uses_rank_tensor(void **state) {
  int tp = (int)tt_randint(2, 4), dp = (int)tt_randint(1, 2), world = tp * dp;
  int64_t n = tt_randint(3, 17);
  float *h;
  tpr_tensor *w = tt_random_f32(tt_cpu(), 1, (const int64_t[]){tp * n}, &h);
  uint8_t *ref_bytes = NULL;
  size_t ref_len = 0;
  uint64_t ref_hash = 0;
  for (int r = 0; r < world; r++) {
    tpr_mesh m;
    TT_OK(tpr_mesh_init(world, r, tp, 1, 1, &m));
    tpr_program *built = build_shard_program(&m, n), *p = NULL;
    uint8_t *bytes;
    size_t len;
    uint64_t hash;
    serialize(built, &bytes, &len);
    TT_OK(tpr_program_hash(built, &hash));
    if (r == 0) {
      ref_bytes = bytes, ref_len = len, ref_hash = hash;
    } else {
      // Every rank builds the same bytes.
      assert_int_equal(len, ref_len);
      assert_memory_equal(bytes, ref_bytes, len);
      assert_int_equal(hash, ref_hash);
    }
    // Run the shipped bytes, not the built program.
    TT_OK(tpr_program_deserialize(ref_bytes, ref_len, &p));
    tpr_tensor *rank = NULL;
    TT_OK(tpr_mesh_rank_tensor(&m, tt_cpu(), &rank));
    tpr_exec *e = NULL;
    TT_OK(tpr_exec_new(p, tt_cpu(), &e));
    TT_OK(tpr_exec_bind(e, "w", w));
    TT_OK(tpr_exec_bind(e, TPR_RANK_PARAM, rank));
    TT_OK(tpr_exec_run(e));
    const tpr_tensor *out;
    TT_OK(tpr_exec_output(e, "row", &out));
    assert_int_equal(out->ndim, 2);
    assert_int_equal(out->shape[0], 1);
    assert_int_equal(out->shape[1], n);
    float *got = malloc((size_t)n * sizeof *got);
    TT_OK(tpr_tensor_to_host(out, got, (size_t)n * sizeof *got));
    assert_memory_equal(got, h + (int64_t)m.tp_rank * n, (size_t)n * sizeof *got);
    if (tp > 1) assert_memory_not_equal(got, h + (int64_t)((m.tp_rank + 1) % tp) * n, (size_t)n * sizeof *got);
    free(got);
    tpr_exec_free(e);
    tpr_tensor_free(rank);
    tpr_program_free(p);
    tpr_program_free(built);
    if (r) free(bytes);
  }
  // A different tp is a different program.
  tpr_mesh m;
  TT_OK(tpr_mesh_init(world * 2, 0, tp * 2, 1, 1, &m));
  tpr_program *other = build_shard_program(&m, n);
  uint64_t hash;
  TT_OK(tpr_program_hash(other, &hash));
  assert_true(hash != ref_hash);
  tpr_program_free(other);
  free(ref_bytes);
  tpr_tensor_free(w);
  free(h);
}

static void test_program_rank_errors(void **state) {
  int tp = (int)tt_randint(2, 4);
  int64_t n = tt_randint(2, 9);
  tpr_mesh m;
  TT_OK(tpr_mesh_init(tp, 0, tp, 1, 1, &m));
  tpr_program *p = build_shard_program(&m, n);
  tpr_value_id again;
  assert_int_equal(tpr_program_rank_param(p, &again), TPR_ERR_INVALID_ARG);  // once per program
  expect_contains(tpr_last_error(), "'rank'");
  tpr_tensor *w = tt_random_f32(tt_cpu(), 1, (const int64_t[]){tp * n}, NULL);
  tpr_exec *e = NULL;
  TT_OK(tpr_exec_new(p, tt_cpu(), &e));
  TT_OK(tpr_exec_bind(e, "w", w));
  // A rank tensor of the wrong shape or dtype does not bind.
  tpr_tensor *bad = tt_random_f32(tt_cpu(), 1, (const int64_t[]){TPR_RANK_SLOTS}, NULL);
  assert_int_equal(tpr_exec_bind(e, TPR_RANK_PARAM, bad), TPR_ERR_SHAPE);
  tpr_tensor_free(bad);
  tpr_tensor *short_rank = NULL;
  TT_OK(tpr_tensor_new(tt_cpu(), TPR_I32, 1, (const int64_t[]){TPR_RANK_SLOTS - 1}, &short_rank));
  assert_int_equal(tpr_exec_bind(e, TPR_RANK_PARAM, short_rank), TPR_ERR_SHAPE);
  tpr_tensor_free(short_rank);
  // Unbound rank: run fails and names it.
  assert_int_equal(tpr_exec_run(e), TPR_ERR_INVALID_ARG);
  expect_contains(tpr_last_error(), "'rank' is not bound");
  // A rank tensor from a bigger mesh (tp_rank >= the program's tp) is caught at run time.
  tpr_mesh big;
  TT_OK(tpr_mesh_init(2 * tp, 2 * tp - 1, 2 * tp, 1, 1, &big));
  tpr_tensor *rank = NULL;
  TT_OK(tpr_mesh_rank_tensor(&big, tt_cpu(), &rank));
  TT_OK(tpr_exec_bind(e, TPR_RANK_PARAM, rank));
  assert_int_equal(tpr_exec_run(e), TPR_ERR_INVALID_ARG);
  expect_contains(tpr_last_error(), "out of range");
  tpr_tensor_free(rank);
  tpr_exec_free(e);
  tpr_tensor_free(w);
  tpr_program_free(p);
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_factorizations),
      cmocka_unit_test(test_impossible_factorizations),
      cmocka_unit_test(test_rank_tensor),
      cmocka_unit_test(test_program_uses_rank_tensor),
      cmocka_unit_test(test_program_rank_errors),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tpr_backend_free(tt_cpu());
  return rc;
}
