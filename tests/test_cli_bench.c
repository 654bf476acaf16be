// `tpr bench comm`, run as a subprocess: alone (the self backend) and under
// mpirun with 2 and 3 ranks (the mpi backend, with the raw-MPI baseline);
// `tpr bench moe` under mpirun -np 4 on the tiny fixture (its JSON figures
// recomputed from one another and from the routing statistics); `tpr bench
// serve` on the demo model alone and with 2 ranks (every request answered,
// its figures recomputed from its counts), failing requests and a server
// that cannot start reported with exit 1.
// Every op must exit 0 with no wrong element, and its --json lines must obey
// nccl-tests' conventions exactly: sizes step as -b/-f (or -i) say, rounded
// as each collective's GetCollByteCount does; algbw = size / time; busbw /
// algbw = the op's bus factor for n ranks. Bad flags exit 2 with a message.
// No timing is asserted (docs/architecture.md section 10).
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tpr_path[4096];
static char tmp_dir[] = "/tmp/tpr_test_cli_bench_XXXXXX";

#define RUN(...) tt_run_tpr(tpr_path, tmp_dir, (const char *const[]){"bench", __VA_ARGS__, NULL})
// Under mpirun, killed (and failed) if it hangs.
#define MPIRUN(ranks, ...)                                                     \
  tt_run(tpr_path, tmp_dir, (const char *const[]){"bench", __VA_ARGS__, NULL}, \
         &(tt_run_opts){.np = (ranks), .timeout_s = 120})

static void expect_exit(const run_result *r, int code) {
  if (r->code != code) fail_msg("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r->code, code, r->out, r->err);
}

static void expect_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("expected '%s' in:\n%s", needle, hay);
}

// Bad usage: `tpr ARGV...` (under mpirun -np np when np > 0) exits 2 with
// `message` on stderr.
static void expect_usage_error(const char *const *argv, int np, const char *message) {
  run_result r = tt_run(tpr_path, tmp_dir, argv, &(tt_run_opts){.np = np, .timeout_s = 60});
  if (r.code != 2) fail_msg("tpr %s %s %s ...: exit %d, want 2\n%s%s", argv[0], argv[1] ? argv[1] : "",
                            argv[1] && argv[2] ? argv[2] : "", r.code, r.out, r.err);
  expect_contains(r.err, message);
  tt_run_done(&r);
}

static const char *str(const cJSON *j, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsString(v)) fail_msg("JSON key '%s' missing or not a string", key);
  return v->valuestring;
}

static void expect_close(double got, double want, double rel, const char *what) {
  if (!(fabs(got - want) <= rel * fabs(want) + 1e-300))
    fail_msg("%s: got %.17g, want %.17g", what, got, want);
}

// nccl-tests: the bus factor (src/*.cu GetBw) and the counts
// (GetCollByteCount) of each op, recomputed here independently.
static double factor_of(const char *op, int n) {
  if (!strcmp(op, "all_reduce")) return 2.0 * (n - 1) / n;
  if (!strcmp(op, "broadcast") || !strcmp(op, "sendrecv")) return 1.0;
  return (double)(n - 1) / n;
}

static void expected_shape(const char *op, uint64_t nominal, size_t es, int n, uint64_t *bytes, uint64_t *count) {
  uint64_t c = nominal / es;
  if (!strcmp(op, "all_gather") || !strcmp(op, "reduce_scatter") || !strcmp(op, "all_to_all")) {
    uint64_t align = 16 / es, base = c / (uint64_t)n / align * align;
    *count = base, *bytes = base * (uint64_t)n * es;
  } else {
    *count = c, *bytes = c * es;
  }
}

typedef struct expect {
  int n;
  size_t es;
  uint64_t minb, maxb, factor, step;
  bool baseline;
  int root;  // broadcast's
  int ops;   // header objects (ops) expected
} expect;

// Checks every JSON line of a run; returns the number of result lines.
static int check_json(const char *out, const expect *e) {
  char *text = strdup(out), *save = NULL;
  const char *op = NULL;
  uint64_t nominal = 0;
  int results = 0, headers = 0;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    cJSON *j = cJSON_Parse(line);
    if (!j || !cJSON_IsObject(j)) fail_msg("not a JSON object: %s", line);
    const char *kind = str(j, "kind");
    if (!strcmp(kind, "header")) {
      if (op && nominal <= e->maxb) fail_msg("%s: stopped at %llu bytes, before -e", op, (unsigned long long)nominal);
      static char op_buf[32];
      snprintf(op_buf, sizeof op_buf, "%s", str(j, "op"));
      op = op_buf;
      nominal = e->minb;
      headers++;
      assert_int_equal((int)tt_json_num(j, "ranks"), e->n);
      assert_string_equal(str(j, "backend"), e->n == 1 && !e->baseline ? "self" : "mpi");
      assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "baseline")) == e->baseline);
      assert_true(tt_json_num(j, "busbw_factor") == factor_of(op, e->n));
    } else {
      assert_string_equal(kind, "result");
      if (!op) fail_msg("result before any header: %s", line);
      assert_string_equal(str(j, "op"), op);
      if (nominal > e->maxb) fail_msg("%s: more sizes than -b/-e/-f give: %s", op, line);
      uint64_t bytes, count;
      expected_shape(op, nominal, e->es, e->n, &bytes, &count);
      if ((uint64_t)tt_json_num(j, "size") != bytes || (uint64_t)tt_json_num(j, "count") != count)
        fail_msg("%s n=%d requested %llu bytes: want size %llu count %llu, got %s", op, e->n,
                 (unsigned long long)nominal, (unsigned long long)bytes, (unsigned long long)count, line);
      assert_true(tt_json_num(j, "wrong") == 0);
      double t = tt_json_num(j, "time_us"), alg = tt_json_num(j, "algbw"), bus = tt_json_num(j, "busbw");
      assert_true(t > 0);
      assert_true(tt_json_num(j, "blocks") >= 1);
      expect_close(alg, (double)bytes / 1e3 / t, 1e-9, "algbw = size / time");
      double f = factor_of(op, e->n);
      if (alg > 0 && f > 0) expect_close(bus / alg, f, 1e-12, "busbw / algbw");
      else assert_true(bus == alg * f);
      const char *redop = str(j, "redop");
      bool reduces = !strcmp(op, "all_reduce") || !strcmp(op, "reduce_scatter");
      assert_true(reduces ? strcmp(redop, "none") != 0 : strcmp(redop, "none") == 0);
      assert_true((int)tt_json_num(j, "root") == (!strcmp(op, "broadcast") ? e->root : -1));
      if (e->baseline) {
        assert_true(tt_json_num(j, "mpi_wrong") == 0);
        double mt = tt_json_num(j, "mpi_time_us"), mbus = tt_json_num(j, "mpi_busbw");
        assert_true(mt > 0);
        expect_close(tt_json_num(j, "mpi_algbw"), (double)bytes / 1e3 / mt, 1e-9, "mpi algbw");
        if (mbus > 0) expect_close(tt_json_num(j, "ratio"), bus / mbus, 1e-9, "ratio = busbw / mpi busbw");
      } else {
        assert_null(cJSON_GetObjectItemCaseSensitive(j, "mpi_busbw"));
      }
      nominal = e->factor ? nominal * e->factor : nominal + e->step;
      results++;
    }
    cJSON_Delete(j);
  }
  if (op && nominal <= e->maxb) fail_msg("%s: stopped at %llu bytes, before -e", op, (unsigned long long)nominal);
  assert_int_equal(headers, e->ops);
  free(text);
  return results;
}

static void test_help(void **state) {
  run_result r = tt_run_tpr(tpr_path, tmp_dir, (const char *const[]){"--help", NULL});
  expect_exit(&r, 0);
  expect_contains(r.out, "bench");
  tt_run_done(&r);
  r = RUN("--help");
  expect_exit(&r, 0);
  expect_contains(r.out, "comm");
  expect_contains(r.out, "moe ");
  tt_run_done(&r);
  r = tt_run_tpr(tpr_path, tmp_dir, (const char *const[]){"bench", NULL});
  expect_exit(&r, 2);
  expect_contains(r.err, "usage: tpr bench");
  tt_run_done(&r);
  r = RUN("frobnicate");
  expect_exit(&r, 2);
  expect_contains(r.err, "unknown benchmark 'frobnicate'");
  tt_run_done(&r);
  r = RUN("comm", "-h");
  expect_exit(&r, 0);
  expect_contains(r.out, "--minbytes");
  expect_contains(r.out, "busbw");
  expect_contains(r.out, "--baseline");
  expect_contains(r.out, "--comm");
  tt_run_done(&r);
}

static void test_bad_flags(void **state) {
  static const struct {
    const char *args[6], *message;
  } cases[] = {
      {{"-o", "allreduce_typo"}, "unknown op 'allreduce_typo'"},
      {{"-o", "sum"}, "the reduction is -r/--redop"},
      {{"-d", "double"}, "unknown datatype 'double'"},
      {{"-r", "avg"}, "unknown redop 'avg'"},
      {{"-b", "1M", "-e", "1K"}, "larger than -e/--maxbytes"},
      {{"-b", "12X"}, "bad -b/--minbytes '12X'"},
      {{"-e", "-5"}, "bad -e/--maxbytes"},
      {{"-b", "0"}, "bad -b/--minbytes '0'"},
      {{"-f", "1"}, "at least 2"},
      {{"-f", "2", "-i", "8"}, "exclude each other"},
      {{"-i", "0"}, "bad -i/--stepbytes"},
      {{"-n", "0"}, "-n must be >= 1"},
      {{"-c", "2"}, "-c 0 or 1"},
      {{"-n", "many"}, "not a valid integer"},
      {{"--frobnicate"}, "unknown option '--frobnicate'"},
      {{"-x", "1"}, "unknown option '-x'"},
      {{"--root", "1"}, "--root 1 is not a rank"},
      {{"--baseline"}, "needs the mpi backend"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *argv[10] = {"bench", "comm", "-e", "64"};
    int n = 4;
    for (int k = 0; k < 6 && cases[i].args[k]; k++) argv[n++] = cases[i].args[k];
    argv[n] = NULL;
    expect_usage_error(argv, 0, cases[i].message);
  }
}

// A world of one: every op, the nccl-tests short flags, several dtypes.
static void test_alone(void **state) {
  run_result r = RUN("comm", "-o", "all", "-b", "8", "-e", "64K", "-n", "2", "-w", "1", "--json");
  expect_exit(&r, 0);
  expect e = {.n = 1, .es = 4, .minb = 8, .maxb = 65536, .factor = 2, .ops = 6};
  assert_int_equal(check_json(r.out, &e), 6 * 14);
  tt_run_done(&r);
  r = RUN("comm", "-o", "all", "-b1K", "-e", "4K", "-i", "1K", "-d", "bf16", "-r", "max", "-n", "1", "--json");
  expect_exit(&r, 0);
  e = (expect){.n = 1, .es = 2, .minb = 1024, .maxb = 4096, .step = 1024, .ops = 6};
  assert_int_equal(check_json(r.out, &e), 6 * 4);
  tt_run_done(&r);
  r = RUN("comm", "--op", "all_gather", "--minbytes", "100", "--maxbytes=1000", "--stepfactor", "3",
          "--datatype", "int64", "--iters", "1", "--json");
  expect_exit(&r, 0);
  e = (expect){.n = 1, .es = 8, .minb = 100, .maxb = 1000, .factor = 3, .ops = 1};
  assert_int_equal(check_json(r.out, &e), 3);  // 100, 300, 900
  tt_run_done(&r);
}

static void run_ranks(int np) {
  // Every op with the baseline, f32 sums; then half and int64 reductions.
  run_result r = MPIRUN(np, "comm", "-o", "all", "-b", "8", "-e", "64K", "-n", "2", "-w", "1", "--baseline", "--json",
                        "--comm-timeout", "60");
  expect_exit(&r, 0);
  expect e = {.n = np, .es = 4, .minb = 8, .maxb = 65536, .factor = 2, .baseline = true, .ops = 6};
  assert_int_equal(check_json(r.out, &e), 6 * 14);
  tt_run_done(&r);
  const char *dt = np == 2 ? "half" : "int64", *redop = np == 2 ? "min" : "max";
  r = MPIRUN(np, "comm", "-o", "all", "-b", "64", "-e", "64K", "-f", "4", "-d", dt, "-r", redop, "-n", "1", "-w",
             "0", "--baseline", "--root", "1", "--json", "--comm-timeout", "60");
  expect_exit(&r, 0);
  e = (expect){.n = np, .es = np == 2 ? 2 : 8, .minb = 64, .maxb = 65536, .factor = 4, .baseline = true, .root = 1,
               .ops = 6};
  assert_int_equal(check_json(r.out, &e), 6 * 6);
  tt_run_done(&r);
}

static void test_two_ranks(void **state) { run_ranks(2); }
static void test_three_ranks(void **state) { run_ranks(3); }

// The table: nccl-tests' columns plus the baseline's.
static void test_table(void **state) {
  run_result r = MPIRUN(2, "comm", "-b", "1K", "-e", "4K", "-n", "2", "--baseline", "--comm-timeout", "60");
  expect_exit(&r, 0);
  expect_contains(r.out, "# tpr bench comm: all_reduce, 2 rank(s), backend mpi, type float, redop sum");
  expect_contains(r.out, "busbw = algbw * 1 ");
  expect_contains(r.out, "MPI_Allreduce");
  static const char *const cols[] = {"size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                                     "mpi time", "mpi busbw", "ratio", "(elements)", "(GB/s)"};
  for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) expect_contains(r.out, cols[i]);
  expect_contains(r.out, "        1024           256     float     sum      -1");
  expect_contains(r.out, "        4096          1024     float     sum      -1");
  expect_contains(r.out, "# Out of bounds values : 0 OK");
  // Only rank 0 prints.
  const char *first = strstr(r.out, "# tpr bench comm:");
  assert_null(strstr(first + 1, "# tpr bench comm:"));
  tt_run_done(&r);
}

// ---- bench moe -------------------------------------------------------------------

static const cJSON *obj(const cJSON *j, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!v) fail_msg("JSON key '%s' missing", key);
  return v;
}

static bool is_null(const cJSON *j, const char *key) { return cJSON_IsNull(obj(j, key)); }

// Positive number; the rates and ratios are printed with 6 digits (%.6g),
// so a figure recomputed from printed ones agrees within a few 1e-6.
static double pos(const cJSON *j, const char *key) {
  double v = tt_json_num(j, key);
  if (!(v > 0)) fail_msg("%s = %g, want > 0", key, v);
  return v;
}

static int64_t item(const cJSON *arr, int i) {
  const cJSON *v = cJSON_GetArrayItem(arr, i);
  if (!cJSON_IsNumber(v)) fail_msg("array item %d missing or not a number", i);
  return (int64_t)v->valuedouble;
}

// One dispatcher's object: the rates from the times and counts, the ratios
// from the rates. rows: (world) the rows each rank's experts ran.
static void check_side(const cJSON *s, const char *name, bool exchange, int ep, double H, double Fr, int world,
                       double *rows) {
  print_message("  %s: layer %.3g s, grouped GEMM %.3g GF/s vs sgemm %.3g\n", name, pos(s, "layer_s"),
                pos(s, "grouped_gemm_gflops"), pos(s, "sgemm_gflops"));
  pos(s, "router_s"), pos(s, "grouped_gemm_s"), pos(s, "sgemm_s");
  const cJSON *er = obj(s, "expert_rows_per_rank");
  assert_int_equal(cJSON_GetArraySize(er), world);
  double mean = 0;
  for (int r = 0; r < world; r++) mean += (double)(rows[r] = (double)item(er, r)) / world;
  expect_close(tt_json_num(s, "grouped_gemm_flops"), mean * 6 * H * Fr, 1e-12, "flops = 6 H Fr x mean rows");
  double flops = tt_json_num(s, "grouped_gemm_flops");
  expect_close(tt_json_num(s, "grouped_gemm_gflops"), flops / tt_json_num(s, "grouped_gemm_s") * 1e-9, 2e-5,
               "grouped GFLOP/s = flops / time");
  expect_close(tt_json_num(s, "sgemm_gflops"), flops / tt_json_num(s, "sgemm_s") * 1e-9, 2e-5, "sgemm GFLOP/s");
  expect_close(pos(s, "grouped_vs_sgemm"), tt_json_num(s, "grouped_gemm_gflops") / tt_json_num(s, "sgemm_gflops"),
               2e-5, "grouped_vs_sgemm = grouped / sgemm");
  double f = (ep - 1.0) / ep, cb = pos(s, "combine_bytes");
  expect_close(tt_json_num(s, "combine_gbs"), cb / pos(s, "combine_s") * 1e-9, 2e-5, "combine GB/s");
  if (!exchange) {  // allreduce: the combine is an all_reduce of (T, H), no dispatch, no all_to_all baseline
    expect_close(tt_json_num(s, "combine_busbw_gbs"), tt_json_num(s, "combine_gbs") * 2 * f, 2e-5, "all_reduce busbw");
    assert_true(tt_json_num(s, "dispatch_bytes") == 0 && is_null(s, "dispatch_rows_per_rank"));
    assert_true(is_null(s, "a2a_busbw_gbs") && is_null(s, "dispatch_vs_a2a") && is_null(s, "combine_vs_a2a") &&
                is_null(s, "a2av_vs_a2a"));
    return;
  }
  const cJSON *dr = obj(s, "dispatch_rows_per_rank");
  for (int r = 0; r < world; r++) assert_true((double)item(dr, r) == rows[r]);  // received rows are the experts' rows
  double db = pos(s, "dispatch_bytes");
  expect_close(db, mean * H * 4, 1e-12, "dispatch bytes = mean rows received x H x 4");
  assert_true(cb == db);
  expect_close(pos(s, "dispatch_gbs"), db / pos(s, "dispatch_s") * 1e-9, 2e-5, "dispatch GB/s");
  expect_close(pos(s, "dispatch_busbw_gbs"), tt_json_num(s, "dispatch_gbs") * f, 2e-5, "dispatch busbw");
  expect_close(pos(s, "combine_busbw_gbs"), tt_json_num(s, "combine_gbs") * f, 2e-5, "combine busbw");
  double ab = pos(s, "a2a_bytes");
  assert_true(ab == ceil(db / ep / 4) * ep * 4);
  expect_close(pos(s, "a2a_busbw_gbs"), ab / pos(s, "a2a_s") * 1e-9 * f, 2e-5, "all_to_all busbw");
  expect_close(pos(s, "dispatch_vs_a2a"), tt_json_num(s, "dispatch_busbw_gbs") / tt_json_num(s, "a2a_busbw_gbs"),
               2e-5, "dispatch_vs_a2a");
  expect_close(pos(s, "combine_vs_a2a"), tt_json_num(s, "combine_busbw_gbs") / tt_json_num(s, "a2a_busbw_gbs"), 2e-5,
               "combine_vs_a2a");
  assert_true(tt_json_num(s, "dispatch_min_s") <= tt_json_num(s, "dispatch_s"));
  expect_close(pos(s, "a2av_busbw_gbs"), db / pos(s, "a2av_s") * 1e-9 * f, 2e-5, "all_to_allv alone busbw");
  expect_close(pos(s, "a2av_vs_a2a"), tt_json_num(s, "a2av_busbw_gbs") / tt_json_num(s, "a2a_busbw_gbs"), 2e-5,
               "a2av_vs_a2a");
}

// tp, dp, ep, etp as the run must resolve them; capacity: --capacity-factor given.
static void check_moe(const cJSON *j, int tp, int dp, int ep, int etp, int tokens, bool capacity) {
  assert_string_equal(str(j, "command"), "bench moe");
  assert_int_equal((int)tt_json_num(j, "world_size"), 4);
  assert_true(tt_json_num(j, "tp") == tp && tt_json_num(j, "dp") == dp && tt_json_num(j, "ep") == ep &&
              tt_json_num(j, "etp") == etp && tt_json_num(j, "edp") == 4 / (ep * etp));
  double H = tt_json_num(j, "hidden"), Fr = tt_json_num(j, "expert_inter_per_rank"), k = tt_json_num(j, "top_k");
  assert_true(H == 64 && Fr == 32.0 / etp && k == 2 && tt_json_num(j, "experts") == 8);
  // Routing: every replica's tokens, top-k each; the experts run what capacity left.
  const cJSON *st = obj(j, "moe_stats"), *L = cJSON_GetArrayItem(obj(st, "layers"), 0);
  assert_true(tt_json_num(st, "tokens") == (double)tokens * dp && tt_json_num(st, "ep") == ep);
  double routed = tt_json_num(L, "routed"), dropped = tt_json_num(L, "dropped"), rer = tt_json_num(L, "rerouted");
  assert_true(routed == (double)tokens * dp * k);
  assert_true(capacity ? dropped > 0 : dropped == 0 && rer == 0);
  const cJSON *tpr_ = obj(L, "tokens_per_rank");
  double per_rank[4] = {0}, sum = 0;
  assert_int_equal(cJSON_GetArraySize(tpr_), ep);
  for (int r = 0; r < ep; r++) sum += per_rank[r] = (double)item(tpr_, r);
  assert_true(sum == routed - dropped + rer);
  // alltoall: a rank receives every assignment to its ep rank's experts (edp = 1 here).
  double rows[4], ar_rows[4];
  check_side(obj(j, "alltoall"), "alltoall", ep > 1, ep, H, Fr, 4, rows);
  for (int w = 0; w < 4; w++) assert_true(rows[w] == per_rank[(w / etp) % ep]);
  if (dp > 1) {
    assert_true(is_null(j, "allreduce"));
    expect_contains(str(j, "allreduce_note"), "dp = 1");
    return;
  }
  check_side(obj(j, "allreduce"), "allreduce", false, ep, H, Fr, 4, ar_rows);
  for (int w = 0; w < 4; w++) assert_true(ar_rows[w] == rows[w]);
  expect_close(tt_json_num(obj(j, "allreduce"), "combine_bytes"), (double)tokens * H * 4, 0, "all_reduce bytes");
  assert_true(tt_json_num(j, "max_abs_diff") <= 1e-5);  // the two dispatchers compute the same layer
}

static char moe_config[4200];
#define MOE(ranks, ...)                                                                                            \
  tt_run(tpr_path, tmp_dir,                                                                                     \
         (const char *const[]){"bench", "moe", "--config", moe_config, "--random-weights", __VA_ARGS__, NULL}, \
         &(tt_run_opts){.np = (ranks), .timeout_s = 60})

static void test_moe(void **state) {
  cJSON *j = tt_json_of(MOE(4, "--ep", "4", "--tokens", "48", "--iters", "3", "--warmup", "1", "--json"));
  check_moe(j, 4, 1, 4, 1, 48, false);
  cJSON_Delete(j);
  j = tt_json_of(MOE(4, "--ep", "2", "--tp", "2", "--tokens", "40", "--iters", "3", "--warmup", "1",
                     "--capacity-factor", "0.75", "--seed", "3", "--json"));
  check_moe(j, 2, 2, 2, 2, 40, true);
  cJSON_Delete(j);
  run_result r = MOE(2, "--tokens", "16", "--iters", "2");  // the table: ep defaults to the world
  expect_exit(&r, 0);
  static const char *const cols[] = {"tp 2 dp 1 | ep 2 etp 1", "layer ms", "dispatch ms", "combine ms", "GEMM GF/s",
                                     "vs a2a busbw", "vs sgemm", "\nalltoall ", "\nallreduce ", "baseline:",
                                     "routing:", "32 assignments of 16 tokens"};
  for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) expect_contains(r.out, cols[i]);
  tt_run_done(&r);
}

static void test_moe_bad_flags(void **state) {
  static const struct {
    int np;
    const char *args[4], *message;
  } cases[] = {
      {0, {"--frobnicate"}, "unknown option '--frobnicate'"},
      {0, {"--tokens", "0"}, "--tokens must be >= 1"},
      {0, {"--iters", "0"}, "--iters must be >= 1"},
      {0, {"--capacity-factor", "-1"}, "--capacity-factor must be"},
      {0, {"--reroute-dropped"}, "needs --capacity-factor"},
      {0, {"--ep", "2"}, "--ep 2: must be in [1, 1]"},
      {3, {"--ep", "3"}, "8 experts do not split"},
      {4, {"--tp", "3"}, "--tp 3 x --dp 1 must equal the world of 4 ranks"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *argv[12] = {"bench", "moe", "--config", moe_config, "--random-weights"};
    int n = 5;
    for (int k = 0; k < 4 && cases[i].args[k]; k++) argv[n++] = cases[i].args[k];
    argv[n] = NULL;
    expect_usage_error(argv, cases[i].np, cases[i].message);
  }
  expect_usage_error((const char *const[]){"bench", "moe", "--random-weights", NULL}, 0, "give --config FILE");
  expect_usage_error((const char *const[]){"bench", "moe", "--config", moe_config, NULL}, 0, "give --random-weights");
  expect_usage_error((const char *const[]){"bench", "moe", "--config", "/nonexistent/config.json", "--random-weights", NULL},
                     0, "/nonexistent/config.json");
  run_result r = RUN("moe", "--help");
  expect_exit(&r, 0);
  expect_contains(r.out, "--capacity-factor");
  expect_contains(r.out, "vs sgemm");
  tt_run_done(&r);
}

// ---- bench serve -----------------------------------------------------------------

static char demo_model[4200];

#define SERVE(...)                                                                                    \
  tt_run(tpr_path, tmp_dir, (const char *const[]){"bench", "serve", "--model", demo_model, __VA_ARGS__, NULL}, \
         &(tt_run_opts){.timeout_s = 240})

// A failed run keeps its logs in the directory its last stderr line names.
static void remove_kept_logs(const char *err) {
  const char *p = strstr(err, "logs kept in ");
  if (!p) return;
  char dir[256];
  if (sscanf(p + strlen("logs kept in "), "%255s", dir) != 1 || strncmp(dir, "/tmp/tpr_bench_serve_", 21) != 0) return;
  static const char *const files[] = {"port", "server.log", "baseline.json", "baseline.log"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) unlink(tt_path(dir, files[i]));
  rmdir(dir);
}

// 4 clients x 1 request, prompt 8, gen 8: every figure present, and the
// derived ones recomputed from the counts they come from.
static void check_serve(const cJSON *j, int np) {
  assert_string_equal(str(j, "command"), "bench serve");
  assert_true(tt_json_num(j, "clients") == 4 && tt_json_num(j, "prompt_len") == 8 && tt_json_num(j, "gen_len") == 8 &&
              tt_json_num(j, "np") == np && tt_json_num(j, "requests") == 1 && tt_json_num(j, "seed") == 1 &&
              tt_json_num(j, "max_batch") == 4 && tt_json_num(j, "max_tokens") == 9 &&
              tt_json_num(j, "warmup_requests") == 1);
  assert_true(strlen(str(j, "cpu_model")) > 0);
  // Every request answered, with the 9 tokens it asked for (8 + the prefill's).
  assert_true(tt_json_num(j, "requests_total") == 4 && tt_json_num(j, "requests_answered") == 4 &&
              tt_json_num(j, "requests_failed") == 0);
  assert_int_equal(cJSON_GetArraySize(obj(j, "errors")), 0);
  double tokens = tt_json_num(j, "completion_tokens"), chunks = tt_json_num(j, "text_chunks");
  assert_true(tokens == 36);
  assert_true(chunks >= 4 && chunks <= tokens);  // a chunk holds one token's text or more
  double dur = pos(j, "duration_s");
  expect_close(pos(j, "output_tok_s"), tokens / dur, 1e-12, "output tok/s = completion tokens / duration");
  expect_close(pos(j, "requests_per_s"), 4 / dur, 1e-12, "requests/s");
  const cJSON *itl50 = obj(j, "itl_ms_p50");
  print_message("  np %d: %.1f tok/s, TTFT p50 %.2f ms, ITL p50 %.2f ms; baseline %.1f tok/s end to end\n", np,
                tt_json_num(j, "output_tok_s"), tt_json_num(j, "ttft_ms_p50"),
                cJSON_IsNumber(itl50) ? itl50->valuedouble : NAN, tt_json_num(j, "baseline_end_to_end_tok_s"));
  assert_true(tt_json_num(j, "ttft_count") == 4);
  double t50 = pos(j, "ttft_ms_p50"), t99 = pos(j, "ttft_ms_p99"), tmean = pos(j, "ttft_ms_mean");
  assert_true(t50 <= t99 && tmean <= t99);
  // One gap between each pair of a request's consecutive text chunks. Chunks
  // that arrive in one read share its time (a gap of 0); under load every
  // request's chunks can arrive that way, so the statistics are only bounded:
  // ordered, and the gaps of each request within the run's duration. When
  // each answer comes as one chunk there are no gaps, and the statistics of
  // nothing are null, never a number.
  assert_true(tt_json_num(j, "itl_count") == chunks - 4);
  if (chunks == 4) {
    assert_true(is_null(j, "itl_ms_p50") && is_null(j, "itl_ms_p99") && is_null(j, "itl_ms_mean"));
  } else {
    double i50 = tt_json_num(j, "itl_ms_p50"), i99 = tt_json_num(j, "itl_ms_p99");
    double imean = tt_json_num(j, "itl_ms_mean");
    assert_true(i50 >= 0 && i50 <= i99 && imean >= 0);
    assert_true(imean * (chunks - 4) <= 4 * dur * 1e3 * (1 + 1e-9));
  }
  assert_true(tt_json_num(j, "client_cpu_s") >= 0);
  assert_true(tt_json_num(j, "server_exit_status") == 0 && cJSON_IsFalse(obj(j, "server_killed")));
  assert_true(tt_json_num(j, "server_processes_signalled") == np);  // the ranks under mpirun, else tpr serve
  // The baseline: tpr bench model's batch of 4, its generated tokens counted.
  assert_true(tt_json_num(j, "baseline_exit_status") == 0);
  pos(j, "baseline_prefill_tok_s"), pos(j, "baseline_decode_tok_s");
  assert_true(tt_json_num(j, "baseline_generated_tokens") == 36 && tt_json_num(j, "baseline_steps") >= 9);
  double e2e = pos(j, "baseline_end_to_end_tok_s");
  expect_close(e2e, 36 / (pos(j, "baseline_prefill_s") + pos(j, "baseline_decode_s")), 1e-12,
               "baseline end-to-end = generated / (prefill_s + decode_s)");
  double r1 = pos(j, "serve_vs_baseline_end_to_end"), r2 = pos(j, "serve_vs_baseline_decode");
  assert_true(isfinite(r1) && isfinite(r2));
  expect_close(r1, tt_json_num(j, "output_tok_s") / e2e, 1e-12, "serve / baseline end to end");
  expect_close(r2, tt_json_num(j, "output_tok_s") / tt_json_num(j, "baseline_decode_tok_s"), 1e-12,
               "serve / baseline decode");
}

static void test_serve(void **state) {
  cJSON *j = tt_json_of(SERVE("--clients", "4", "--prompt-len", "8", "--gen-len", "8", "--np", "1", "--json"));
  check_serve(j, 1);
  cJSON_Delete(j);
  // Under mpirun the ranks get SIGTERM. Open MPI's components leak what
  // LeakSanitizer cannot attribute (as for every mpirun test).
  const char *asan = getenv("ASAN_OPTIONS");
  char *saved = asan ? strdup(asan) : NULL;
  setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
  j = tt_json_of(SERVE("--clients", "4", "--prompt-len", "8", "--gen-len", "8", "--np", "2", "--json"));
  if (saved) setenv("ASAN_OPTIONS", saved, 1);
  else unsetenv("ASAN_OPTIONS");
  free(saved);
  check_serve(j, 2);
  cJSON_Delete(j);
  // The table: every row named.
  run_result r = SERVE("--clients", "2", "--prompt-len", "4", "--gen-len", "2");
  expect_exit(&r, 0);
  static const char *const rows[] = {"requests answered", "output tokens/s (aggregate)", "TTFT ms", "ITL ms", "p50",
                                     "p99", "server exit status after SIGTERM", "end-to-end tokens/s",
                                     "decode tokens/s", "serving / baseline end-to-end", "serving / baseline decode"};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) expect_contains(r.out, rows[i]);
  expect_contains(r.err, "the server exited with status 0");
  tt_run_done(&r);
}

// Failures are reported and exit 1, never counted as answers: a server that
// refuses every request (its context too short for prompt + max_tokens: the
// warm-up request stops the run, or without one every request fails), a
// server that cannot start (its error shown, no hang); bad options exit 2.
static void test_serve_failures(void **state) {
  run_result r = SERVE("--clients", "3", "--prompt-len", "8", "--gen-len", "8", "--server-arg", "--max-seq",
                       "--server-arg", "12");
  expect_exit(&r, 1);
  expect_contains(r.err, "warm-up request 0 failed: HTTP 400");
  expect_contains(r.err, "the server exited with status 0");  // stopped all the same
  assert_true(strlen(r.out) == 0);
  remove_kept_logs(r.err);
  tt_run_done(&r);
  r = SERVE("--clients", "3", "--prompt-len", "8", "--gen-len", "8", "--server-arg", "--max-seq", "--server-arg",
            "12", "--warmup", "0", "--json");
  expect_exit(&r, 1);
  cJSON *j = cJSON_Parse(r.out);
  if (!cJSON_IsObject(j)) fail_msg("not a JSON object:\n%s", r.out);
  assert_true(tt_json_num(j, "requests_answered") == 0 && tt_json_num(j, "requests_failed") == 3);
  assert_int_equal(cJSON_GetArraySize(obj(j, "errors")), 3);
  expect_contains(cJSON_GetArrayItem(obj(j, "errors"), 0)->valuestring, "HTTP 400");
  assert_true(is_null(j, "ttft_ms_p50") && tt_json_num(j, "completion_tokens") == 0);
  cJSON_Delete(j);
  expect_contains(r.err, "longer than the context of 12 tokens");
  remove_kept_logs(r.err);
  tt_run_done(&r);

  r = tt_run(tpr_path, tmp_dir,
             (const char *const[]){"bench", "serve", "--model", "/nonexistent/model", "--clients", "2", NULL},
             &(tt_run_opts){.timeout_s = 120});
  expect_exit(&r, 1);
  expect_contains(r.err, "the server exited with status 1 before listening");
  expect_contains(r.err, "cannot open /nonexistent/model");  // tpr serve's own message, from its log
  remove_kept_logs(r.err);
  tt_run_done(&r);

  static const struct {
    const char *args[4], *message;
  } cases[] = {
      {{"--frobnicate"}, "unknown option '--frobnicate'"},
      {{"--clients", "0"}, "--clients must be in [1, 4096]"},
      {{"--gen-len", "0"}, "--prompt-len and --gen-len must be >= 1"},
      {{"--np", "0"}, "--np must be in [1, 1024]"},
      {{"--requests", "0"}, "--requests must be >= 1"},
      {{"--start-timeout", "0"}, "must be > 0"},
      {{"--warmup", "1001"}, "--warmup must be at most 1000"},
      {{"--clients", "two"}, "not a valid size"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *argv[10] = {"bench", "serve", "--model", demo_model};
    int n = 4;
    for (int k = 0; k < 4 && cases[i].args[k]; k++) argv[n++] = cases[i].args[k];
    argv[n] = NULL;
    expect_usage_error(argv, 0, cases[i].message);
  }
  expect_usage_error((const char *const[]){"bench", "serve", "--clients", "2", NULL}, 0, "--model is required");
  r = RUN("serve", "--help");
  expect_exit(&r, 0);
  expect_contains(r.out, "--server-arg");
  expect_contains(r.out, "TTFT");
  tt_run_done(&r);
}

static int remove_tmp(void **state) {
  unlink(tt_path(tmp_dir, "stdout"));
  unlink(tt_path(tmp_dir, "stderr"));
  return rmdir(tmp_dir) == 0 ? 0 : -1;
}

int main(void) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_cli_bench") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  char here[4096];
  snprintf(here, sizeof here, "%s", __FILE__);  // absolute under CMake: tests/ of the source tree
  const char *tests_dir = dirname(here);
  snprintf(moe_config, sizeof moe_config, "%s/fixtures/minimax_m2_tiny/config.json", tests_dir);
  snprintf(demo_model, sizeof demo_model, "%s/fixtures/demo_model", tests_dir);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),       cmocka_unit_test(test_bad_flags),   cmocka_unit_test(test_alone),
      cmocka_unit_test(test_two_ranks),  cmocka_unit_test(test_three_ranks), cmocka_unit_test(test_table),
      cmocka_unit_test(test_moe),        cmocka_unit_test(test_moe_bad_flags), cmocka_unit_test(test_serve),
      cmocka_unit_test(test_serve_failures),
  };
  return cmocka_run_group_tests(tests, NULL, remove_tmp);
}
