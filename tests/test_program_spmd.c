// SPMD under mpirun: every rank builds the block program independently; the
// serialized bytes must be identical on all ranks (hash all-gathered), the
// tp-summed result must match the unsharded block, and a program with the
// rank baked in (the bug docs/architecture.md section 1 forbids) must be detected.
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/tpr_comm.h"
#include "models/mlp_block.h"
#include "test_util.h"
#include "mpi_util.h"

static tpr_comm_t comm;
static const tpr_block_config cfg = {.hidden_size = 32, .intermediate_size = 96, .tokens = 9, .rms_norm_eps = 1e-5f};

static bool hashes_agree(const tpr_program *p) {
  uint64_t h, *all = calloc((size_t)tpr_comm_size(comm), sizeof *all);
  TT_OK(tpr_program_hash(p, &h));
  TT_OK(tpr_comm_all_gather(comm, &h, all, 1, TPR_I64));
  bool same = true;
  for (int r = 0; r < tpr_comm_size(comm); r++) same &= all[r] == all[0];
  free(all);
  return same;
}

static void test_identical_programs(void **state) {
  int size = tpr_comm_size(comm);
  tpr_program *p;
  TT_OK(tpr_block_build(&cfg, size, &p));
  assert_true(hashes_agree(p));
  tpr_program_free(p);
  // Negative control: a builder that slices by this rank's number.
  tpr_program *bad;
  tpr_value_id w, s;
  TT_OK(tpr_program_new(&bad));
  TT_OK(tpr_program_param(bad, "w", TPR_F32, 2, (const int64_t[]){size, 4}, &w));
  TT_OK(tpr_pb_slice(bad, w, 0, tpr_comm_rank(comm), 1, &s));
  TT_OK(tpr_program_output(bad, s, "mine"));
  if (size > 1) assert_false(hashes_agree(bad));
  tpr_program_free(bad);
}

static void test_tp_sum_matches_single(void **state) {
  int size = tpr_comm_size(comm), rank = tpr_comm_rank(comm);
  // Same seed on every rank: all ranks hold the same full weights.
  uint64_t seed = tt_next_u64();
  TT_OK(tpr_comm_all_reduce(comm, &seed, &seed, 1, TPR_I64, TPR_MAX));
  tpr_block_tensors w;
  TT_OK(tpr_block_random(&cfg, seed, tt_cpu(), &w));
  size_t n = (size_t)(cfg.tokens * cfg.hidden_size);
  float *y = malloc(n * sizeof *y), *ref = malloc(n * sizeof *ref);
  const int tps[] = {size, 1};
  for (int k = 0; k < 2; k++) {
    tpr_mesh m;
    TT_OK(tpr_mesh_init(tps[k], k == 0 ? rank : 0, tps[k], 1, 1, &m));
    tpr_program *p;
    TT_OK(tpr_block_build(&cfg, tps[k], &p));
    tpr_tensor *rt;
    TT_OK(tpr_mesh_rank_tensor(&m, tt_cpu(), &rt));
    tpr_exec *e;
    TT_OK(tpr_exec_new(p, tt_cpu(), &e));
    TT_OK(tpr_block_bind(e, &w, rt));
    TT_OK(tpr_exec_run(e));
    const tpr_tensor *out;
    TT_OK(tpr_exec_output(e, "partial", &out));
    TT_OK(tpr_tensor_to_host(out, k == 0 ? y : ref, n * sizeof *y));
    tpr_exec_free(e);
    tpr_tensor_free(rt);
    tpr_program_free(p);
  }
  TT_OK(tpr_comm_all_reduce(comm, y, y, n, TPR_F32, TPR_SUM));
  double *want = malloc(n * sizeof *want);
  for (size_t i = 0; i < n; i++) want[i] = ref[i];
  assert_true(tt_max_rel_err(y, want, n) < 1e-5);
  free(y), free(ref), free(want);
  tpr_block_tensors_free(&w);
}

int main(int argc, char **argv) {
  comm = tt_mpi_world(&argc, &argv);
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_identical_programs),
      cmocka_unit_test(test_tp_sum_matches_single),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return tt_mpi_finish(comm, failed);
}
