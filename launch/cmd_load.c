// tpr load: load everything a rank holds and report bytes, time and peak
// resident memory next to the checkpoint's size. Under mpirun every rank
// loads its own shard and rank 0 prints all of them; alone, --rank picks
// which rank of the dp*tp world to load.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "launch/world.h"

enum { S_RANK, S_HELD, S_READ, S_NS, S_RSS0, S_RSS, S_ITEMS, S_COUNT };

static int64_t max_rss_bytes(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (int64_t)ru.ru_maxrss * 1024;  // KiB on Linux
}

static tpr_status load_rank(const char *model, const tpr_shard_plan *p, int rank, tpr_dtype dt, int64_t *s) {
  tpr_loader *l = NULL;
  tpr_rank_weights w = {0};
  s[S_RANK] = rank;
  s[S_RSS0] = max_rss_bytes();
  double t0 = tpr_cli_now();
  tpr_status rc = tpr_loader_open(model, p, rank, &l);
  if (rc == TPR_OK) rc = tpr_loader_load_all(l, dt, &w);
  s[S_NS] = (int64_t)((tpr_cli_now() - t0) * 1e9);
  s[S_RSS] = max_rss_bytes();
  s[S_HELD] = (int64_t)w.bytes_held, s[S_READ] = (int64_t)w.bytes_read, s[S_ITEMS] = w.n;
  tpr_rank_weights_free(&w);
  tpr_loader_close(l);
  return rc;
}

static bool print(const char *model, const tpr_shard_plan *p, const char *dtype, const int64_t *all, int n,
                  bool json) {
  int files;
  uint64_t ck = tpr_cli_safetensors_bytes(model, &files);
  if (json) {
    cJSON *j = cJSON_CreateObject(), *ranks = NULL;
    cJSON_AddStringToObject(j, "command", "load");
    cJSON_AddStringToObject(j, "model", model);
    cJSON_AddStringToObject(j, "dtype", dtype);
    const double nums[] = {p->world, p->tp, p->ep, p->etp, p->dp, (double)ck, files, (double)p->rank_bytes};
    const char *keys[] = {"world_size", "tp", "ep", "etp", "dp", "checkpoint_bytes", "checkpoint_files",
                          "plan_rank_bytes_bf16"};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) cJSON_AddNumberToObject(j, keys[i], nums[i]);
    if (j) ranks = cJSON_AddArrayToObject(j, "ranks");
    for (int r = 0; ranks && r < n; r++) {
      const int64_t *s = all + r * S_COUNT;
      double sec = (double)s[S_NS] * 1e-9;
      cJSON *o = cJSON_CreateObject();
      cJSON_AddNumberToObject(o, "rank", (double)s[S_RANK]);
      cJSON_AddNumberToObject(o, "tensors", (double)s[S_ITEMS]);
      cJSON_AddNumberToObject(o, "bytes_held", (double)s[S_HELD]);
      cJSON_AddNumberToObject(o, "bytes_read", (double)s[S_READ]);
      cJSON_AddNumberToObject(o, "seconds", sec);
      cJSON_AddNumberToObject(o, "gb_per_s", sec > 0 ? (double)s[S_READ] / sec / 1e9 : 0);
      cJSON_AddNumberToObject(o, "rss_before_bytes", (double)s[S_RSS0]);
      cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)s[S_RSS]);
      cJSON_AddItemToArray(ranks, o);
    }
    return tpr_cli_print_json(j);
  }
  char b[6][32];
  printf("%s: %d safetensors files, %s; mesh tp=%d ep=%d etp=%d dp=%d (world %d); dtype %s\n", model, files,
         tpr_cli_bytes(ck, b[0], 32), p->tp, p->ep, p->etp, p->dp, p->world, dtype);
  printf("%-5s %8s %12s %12s %9s %8s %12s %12s %10s\n", "rank", "tensors", "held", "read", "seconds", "GB/s",
         "peak RSS", "RSS before", "peak/ckpt");
  for (int r = 0; r < n; r++) {
    const int64_t *s = all + r * S_COUNT;
    double sec = (double)s[S_NS] * 1e-9;
    printf("%-5lld %8lld %12s %12s %9.3f %8.2f %12s %12s %9.1f%%\n", (long long)s[S_RANK], (long long)s[S_ITEMS],
           tpr_cli_bytes((uint64_t)s[S_HELD], b[1], 32), tpr_cli_bytes((uint64_t)s[S_READ], b[2], 32), sec,
           sec > 0 ? (double)s[S_READ] / sec / 1e9 : 0.0, tpr_cli_bytes((uint64_t)s[S_RSS], b[3], 32),
           tpr_cli_bytes((uint64_t)s[S_RSS0], b[4], 32), ck ? 100.0 * (double)s[S_RSS] / (double)ck : 0.0);
  }
  return true;
}

int tpr_cmd_load(int argc, char **argv) {
  const char *model = NULL, *dtype_name = "source";
  tpr_cli_mesh m = {.ep = 1, .etp = 1, .dp = 0};
  int64_t rank = 0;
  bool json = false;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "Hugging Face or converted checkpoint directory (required)"},
      {"tp", TPR_ARG_INT, &m.tp, "tensor-parallel degree (required)"},
      {"ep", TPR_ARG_INT, &m.ep, "expert-parallel degree (default 1)"},
      {"etp", TPR_ARG_INT, &m.etp, "expert tensor-parallel degree (default 1)"},
      {"dp", TPR_ARG_INT, &m.dp, "data-parallel degree; world = dp*tp (default: world size / tp, or 1)"},
      {"rank", TPR_ARG_INT, &rank, "without mpirun: the world rank to load (default 0)"},
      {"dtype", TPR_ARG_STR, &dtype_name, "destination dtype: source (each tensor's own, default), bf16, f16, f32"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object (rank 0)"},
      TPR_WORLD_ARGS(wo),
  };
  const char *usage = "usage: [mpirun -np N] tpr load --model DIR --tp T [--ep E --etp F --dp D] [--rank R] "
                      "[--dtype source] [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  tpr_dtype dt;
  if (!model) {
    fprintf(stderr, "tpr load: --model is required\n%s\n", usage);
    return 2;
  }
  tpr_world w;
  if (tpr_world_init(&argc, &argv, &wo, &w) != TPR_OK) return tpr_world_fail(&w, "load");
  tpr_cli_progress(w.rank);
  if (m.dp == 0) m.dp = w.mpi && m.tp > 0 && w.size % m.tp == 0 ? w.size / m.tp : 1;
  if (!tpr_cli_mesh_ok("load", &m, usage) || !tpr_cli_load_dtype("load", dtype_name, &dt)) {
    tpr_world_finish(&w);
    return 2;
  }
  tpr_shard_plan p = {0};
  int64_t mine[S_COUNT] = {0}, *all = NULL;
  tpr_status rc = tpr_cli_plan(model, &m, &p);
  if (rc == TPR_OK && w.size > 1 && p.world != w.size)
    rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "the mesh dp=%d x tp=%d is a world of %d ranks, but mpirun started %d", p.dp,
                  p.tp, p.world, w.size);
  if (w.size > 1 && rank != 0) TPR_LOG_WRN("load: --rank is ignored under mpirun: each rank loads its own");
  if (rc == TPR_OK) rc = load_rank(model, &p, w.size > 1 ? w.rank : (int)rank, dt, mine);
  if (rc == TPR_OK && !(all = malloc((size_t)(w.size * S_COUNT) * sizeof *all)))
    rc = TPR_FAIL(TPR_ERR_OOM, "out of memory");
  if (rc == TPR_OK) rc = tpr_comm_all_gather(w.host, mine, all, S_COUNT, TPR_I64);
  if (rc != TPR_OK) {
    free(all);
    tpr_shard_plan_free(&p);
    return tpr_world_fail(&w, "load");
  }
  bool ok = w.rank != 0 || print(model, &p, dtype_name, all, w.size, json);
  free(all);
  tpr_shard_plan_free(&p);
  tpr_world_finish(&w);
  return ok ? 0 : 1;
}
