// tpr mlp: the demo job. Builds the tensor-parallel MLP block program on
// every rank, proves the ranks built identical bytes, runs the deserialized
// program ("compile once, run on every rank"), sums the partial outputs over
// the tp group, and checks the result against the unsharded (tp = 1) block.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "launch/world.h"
#include "models/mlp_block.h"

typedef struct mlp_result {
  size_t program_bytes, arena_bytes, naive_bytes;
  uint64_t hash;
  double run_s, max_rel_err;
  float *y;  // (T, H) the tp-summed output
} mlp_result;

// Builds, round-trips through bytes and runs the block for one mesh.
// With `all_ranks`, every rank calls it and the program hashes are compared.
static tpr_status run_block(tpr_world *w, const tpr_block_config *c, const tpr_mesh *mesh, uint64_t seed,
                            int64_t iters, bool all_ranks, mlp_result *res) {
  tpr_program *built = NULL, *loaded = NULL;
  tpr_exec *exec = NULL;
  tpr_tensor *rank = NULL;
  tpr_block_tensors t = {0};
  uint8_t *bytes = NULL;
  tpr_status rc = TPR_OK;
  TPR_CHECK_GOTO(tpr_block_build(c, mesh->tp, &built), rc, done);
  if (all_ranks) TPR_CHECK_GOTO(tpr_comm_check_program(w->host, built, &res->hash), rc, done);
  TPR_CHECK_GOTO(tpr_program_serialize(built, &bytes, &res->program_bytes), rc, done);
  TPR_CHECK_GOTO(tpr_program_deserialize(bytes, res->program_bytes, &loaded), rc, done);
  TPR_CHECK_GOTO(tpr_block_random(c, seed, w->cpu, &t), rc, done);
  TPR_CHECK_GOTO(tpr_mesh_rank_tensor(mesh, w->cpu, &rank), rc, done);
  TPR_CHECK_GOTO(tpr_exec_new(loaded, w->cpu, &exec), rc, done);
  TPR_CHECK_GOTO(tpr_block_bind(exec, &t, rank), rc, done);
  TPR_CHECK_GOTO(tpr_exec_run(exec), rc, done);  // warm-up: page in the arena and BLAS buffers
  double t0 = tpr_cli_now();
  for (int64_t i = 0; i < iters; i++) TPR_CHECK_GOTO(tpr_exec_run(exec), rc, done);
  res->run_s = (tpr_cli_now() - t0) / (double)(iters > 0 ? iters : 1);
  res->arena_bytes = tpr_exec_plan(exec)->arena_bytes;
  res->naive_bytes = tpr_exec_plan(exec)->naive_bytes;
  const tpr_tensor *partial;
  TPR_CHECK_GOTO(tpr_exec_output(exec, "partial", &partial), rc, done);
  size_t n = (size_t)tpr_tensor_numel(partial);
  res->y = malloc(n * sizeof *res->y);
  if (!res->y) {
    rc = TPR_FAIL(TPR_ERR_OOM, "output");
    goto done;
  }
  TPR_CHECK_GOTO(tpr_tensor_to_host(partial, res->y, n * sizeof *res->y), rc, done);
done:
  free(bytes);
  tpr_exec_free(exec);
  tpr_tensor_free(rank);
  tpr_block_tensors_free(&t);
  tpr_program_free(built);
  tpr_program_free(loaded);
  return rc;
}

static double max_rel_err(const float *got, const float *want, size_t n) {
  double max_ref = 1e-30, max_err = 0;
  for (size_t i = 0; i < n; i++) {
    if (fabs(want[i]) > max_ref) max_ref = fabs(want[i]);
    double e = fabs((double)got[i] - (double)want[i]);
    if (!(e <= max_err)) max_err = e;
  }
  return max_err / max_ref;
}

static void print_result(const tpr_world *w, const tpr_block_config *c, const tpr_mesh *m, const mlp_result *r,
                         bool check, bool json) {
  double flops = 2.0 * 3.0 * (double)c->tokens * (double)c->hidden_size * (double)c->intermediate_size / (double)m->tp;
  double gflops = r->run_s > 0 ? flops / r->run_s * 1e-9 : 0;
  if (json) {
    printf("{\"command\":\"mlp\",\"world_size\":%d,\"tp\":%d,\"tokens\":%lld,\"hidden_size\":%lld,"
           "\"intermediate_size\":%lld,\"threads_per_rank\":%d,\"program_bytes\":%zu,\"program_hash\":\"%016llx\","
           "\"ranks_agree\":true,\"arena_bytes\":%zu,\"naive_bytes\":%zu,\"run_ms\":%.4f,\"gflops_per_rank\":%.3f",
           w->size, m->tp, (long long)c->tokens, (long long)c->hidden_size, (long long)c->intermediate_size,
           tpr_backend_cpu_threads(w->cpu), r->program_bytes, (unsigned long long)r->hash, r->arena_bytes,
           r->naive_bytes, r->run_s * 1e3, gflops);
    if (check) printf(",\"max_rel_err_vs_tp1\":%.3e,\"check_passed\":%s", r->max_rel_err, r->max_rel_err < 1e-5 ? "true" : "false");
    printf("}\n");
    return;
  }
  printf("tpr mlp: pre-norm SwiGLU MLP block, tensor-parallel\n");
  printf("  %-28s %d (tp %d, backend cpu, %d thread(s) per rank)\n", "ranks", w->size, m->tp,
         tpr_backend_cpu_threads(w->cpu));
  printf("  %-28s T=%lld H=%lld F=%lld (F/tp=%lld per rank)\n", "shape", (long long)c->tokens,
         (long long)c->hidden_size, (long long)c->intermediate_size, (long long)(c->intermediate_size / m->tp));
  printf("  %-28s %zu bytes, hash %016llx, identical on all %d ranks\n", "program", r->program_bytes,
         (unsigned long long)r->hash, w->size);
  printf("  %-28s %zu bytes (naive %zu, %.0f%% saved)\n", "activation arena", r->arena_bytes, r->naive_bytes,
         r->naive_bytes ? 100.0 * (1.0 - (double)r->arena_bytes / (double)r->naive_bytes) : 0.0);
  printf("  %-28s %.3f ms per run, %.2f GFLOP/s per rank\n", "rank 0 time", r->run_s * 1e3, gflops);
  if (check)
    printf("  %-28s max rel err %.2e vs unsharded tp=1 block (bound 1e-5): %s\n", "check", r->max_rel_err,
           r->max_rel_err < 1e-5 ? "PASS" : "FAIL");
}

int tpr_cmd_mlp(int argc, char **argv) {
  const char *config = NULL;
  int64_t tp = 0, tokens = 0, seed = 1234, iters = 10;
  bool json = false, no_check = false;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  const tpr_arg args[] = {
      {"config", TPR_ARG_STR, &config, "JSON config (hidden_size, intermediate_size, tokens, rms_norm_eps); "
                                       "default: the embedded tiny block (H=256, F=1024, T=64)"},
      {"tp", TPR_ARG_INT, &tp, "tensor-parallel degree (default: the world size)"},
      {"tokens", TPR_ARG_SIZE, &tokens, "override the number of tokens per run"},
      {"seed", TPR_ARG_INT, &seed, "seed of the random weights and input (default 1234)"},
      {"iters", TPR_ARG_INT, &iters, "timed runs after one warm-up (default 10)"},
      {"no-check", TPR_ARG_FLAG, &no_check, "skip the comparison with the unsharded block"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object instead of the table"},
      TPR_WORLD_ARGS(wo),
  };
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0],
                                      "usage: [mpirun -np N] tpr mlp [--config FILE] [--tp N] [--json]");
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;

  tpr_world w;
  if (tpr_world_init(&argc, &argv, &wo, &w) != TPR_OK) return tpr_world_fail(&w, "mlp");
  tpr_block_config c = tpr_block_config_default();
  if (config && tpr_block_config_load(config, &c) != TPR_OK) return tpr_world_fail(&w, "mlp");
  if (tokens > 0) c.tokens = tokens;
  if (tp == 0) tp = w.size;
  if (tp != w.size) {
    // Sums over a tp sub-group need the mesh communicators of the collectives layer.
    TPR_FAIL(TPR_ERR_UNSUPPORTED, "--tp %lld must equal the world size %d (data-parallel replicas are not wired "
             "into this command yet)", (long long)tp, w.size);
    return tpr_world_fail(&w, "mlp");
  }
  tpr_mesh mesh;
  mlp_result res = {0};
  if (tpr_mesh_init(w.size, w.rank, (int)tp, 1, 1, &mesh) != TPR_OK) return tpr_world_fail(&w, "mlp");
  if (run_block(&w, &c, &mesh, (uint64_t)seed, iters, true, &res) != TPR_OK) return tpr_world_fail(&w, "mlp");
  size_t n = (size_t)(c.tokens * c.hidden_size);
  if (tpr_comm_all_reduce(w.host, res.y, res.y, n, TPR_F32, TPR_SUM) != TPR_OK) return tpr_world_fail(&w, "mlp");
  int rc = 0;
  if (!no_check && w.rank == 0) {
    tpr_mesh solo;
    mlp_result ref = {0};
    if (tpr_mesh_init(1, 0, 1, 1, 1, &solo) != TPR_OK || run_block(&w, &c, &solo, (uint64_t)seed, 0, false, &ref) != TPR_OK)
      return tpr_world_fail(&w, "mlp");
    res.max_rel_err = max_rel_err(res.y, ref.y, n);
    free(ref.y);
    rc = res.max_rel_err < 1e-5 ? 0 : 1;
  }
  if (w.rank == 0) print_result(&w, &c, &mesh, &res, !no_check, json);
  free(res.y);
  tpr_world_finish(&w);
  return rc;
}
