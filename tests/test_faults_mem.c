// Memory faults: a KV-cache request or a checkpoint larger than the machine
// must end in a clear error before anything is allocated (runtime/host_mem.c,
// checked by the loader and the session's KV pool), not in the OOM killer.
// Real sizes far beyond RAM + swap (--kv-cache-bytes 1 PB, --max-batch x
// --max-seq of exabytes, one past int64) against MemAvailable; then the
// boundary with TPR_DEBUG_MEM_AVAILABLE standing in for the machine: the
// exact byte count the error names loads, one byte less is refused (the
// negative control: a check off by a block or a factor would fail one side).
// And a real checkpoint (a sparse file) of twice the machine's memory. Under
// mpirun the ranks of one node share its memory: np 2 needs twice one
// rank's share, for the weights and for the KV pool.
#define _GNU_SOURCE
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MODEL TPR_FIXTURES "/minimax_m2_tiny"

static char tpr_path[4096];
static char tmp_dir[] = "/tmp/tpr_test_faults_mem_XXXXXX";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// `tpr run` on the tiny model with extra args; avail (bytes, 0: the real
// machine) stands in for MemAvailable.
static run_result run_np(int np, const char *const *extra, uint64_t avail, double *secs);
static run_result run_with(const char *const *extra, uint64_t avail, double *secs) {
  return run_np(0, extra, avail, secs);
}

// The same under `mpirun -np np` (np > 0): every rank on this node.
static run_result run_np(int np, const char *const *extra, uint64_t avail, double *secs) {
  const char *a[32] = {"run", "--model", MODEL, "--prompt-ids", "1,2,3", "--max-new-tokens", "2"};
  int n = 7;
  for (int i = 0; extra[i]; i++) a[n++] = extra[i];
  a[n] = NULL;
  char v[32];
  snprintf(v, sizeof v, "%" PRIu64, avail);
  if (avail) setenv("TPR_DEBUG_MEM_AVAILABLE", v, 1);
  double t0 = now_s();
  run_result r = tt_run(tpr_path, tmp_dir, a, &(tt_run_opts){.timeout_s = 60, .np = np});
  *secs = now_s() - t0;
  unsetenv("TPR_DEBUG_MEM_AVAILABLE");
  return r;
}

// The "needs N bytes" of a refusal (0 if none).
static uint64_t needed(const char *err) {
  const char *p = strstr(err, "needs ");
  return p ? strtoull(p + 6, NULL, 10) : 0;
}

static long max_rss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_CHILDREN, &ru);
  return ru.ru_maxrss;
}

static void expect_refused(const char *const *extra, uint64_t avail, const char *want) {
  double secs;
  run_result r = run_with(extra, avail, &secs);
  printf("  %s%s: exit %d after %.2f s, largest child RSS so far %ld KiB\n    %s", extra[0], extra[2] ? " ..." : "",
         r.code, secs, max_rss_kib(), r.err);
  if (r.code == 0 || r.code < 0) fail_msg("exit %d (a signal if < 0): not a clean refusal", r.code);
  if (!strstr(r.err, want) || !strstr(r.err, "refused before allocating"))
    fail_msg("the error does not say \"%s ... refused before allocating\":\n%s", want, r.err);
  assert_true(secs < 20);
  assert_true(max_rss_kib() < 512 * 1024);  // nothing near the request was touched
  tt_run_done(&r);
}

static void test_kv_larger_than_machine(void **state) {
  expect_refused((const char *const[]){"--kv-cache-bytes", "1000000000000000", NULL}, 0, "--kv-cache-bytes) needs");
  expect_refused((const char *const[]){"--max-batch", "100000000", "--max-seq", "100000000", NULL}, 0,
                 "--max-batch x --max-seq) needs");
  // Each size within the CLI's bound (2^50) but their product of blocks past
  // int64: an overflow is named, not wrapped into a small pool.
  double secs;
  run_result r = run_with((const char *const[]){"--max-batch", "1125899906842624", "--max-seq", "1125899906842624",
                                                 NULL}, 0, &secs);
  printf("  --max-batch 2^50 --max-seq 2^50: exit %d\n    %s", r.code, r.err);
  assert_true(r.code > 0 && strstr(r.err, "overflows"));
  tt_run_done(&r);
  // One size past the bound is refused by the option parser itself.
  r = run_with((const char *const[]){"--max-batch", "4611686018427387904", "--max-seq", "1000", NULL}, 0, &secs);
  printf("  --max-batch 2^62: exit %d\n    %s", r.code, r.err);
  assert_true(r.code == 2 && strstr(r.err, "--max-batch 4611686018427387904: larger than any size"));
  tt_run_done(&r);
}

// The KV pool's check at its boundary: kv bytes rounded down to whole blocks.
static void test_kv_boundary(void **state) {
  uint64_t kv = (uint64_t)tt_randint(2 << 20, 8 << 20);  // above the tiny model's weights (0.7 MB)
  char kvs[32];
  snprintf(kvs, sizeof kvs, "%" PRIu64, kv);
  const char *extra[] = {"--kv-cache-bytes", kvs, NULL};
  double secs;
  run_result r = run_with(extra, 1 << 20, &secs);  // a 1 MiB "machine": the weights fit, the pool not
  uint64_t need = needed(r.err);
  printf("  --kv-cache-bytes %" PRIu64 " on 1 MiB: exit %d, needs %" PRIu64 "\n", kv, r.code, need);
  if (r.code <= 0 || !strstr(r.err, "KV pool") || !need || need > kv || kv - need >= 64 * 1024)
    fail_msg("not refused for the pool, or the wrong size:\n%s", r.err);
  tt_run_done(&r);
  r = run_with(extra, need, &secs);
  if (r.code != 0) fail_msg("with exactly %" PRIu64 " bytes available: exit %d\n%s", need, r.code, r.err);
  tt_run_done(&r);
  r = run_with(extra, need - 1, &secs);
  assert_true(r.code > 0 && needed(r.err) == need);
  tt_run_done(&r);
  printf("  %" PRIu64 " bytes available: runs; %" PRIu64 ": refused\n", need, need - 1);
}

// The loader: a checkpoint whose rank weights exceed the machine.
static void test_checkpoint_larger_than_machine(void **state) {
  const char *none[] = {NULL};
  double secs;
  run_result r = run_with(none, 4096, &secs);
  uint64_t need = needed(r.err);
  printf("  tiny model on a 4 KiB machine: exit %d after %.2f s\n    %s", r.code, secs, r.err);
  if (r.code <= 0 || !strstr(r.err, "loading its weights") || !need) fail_msg("not refused by the loader");
  tt_run_done(&r);
  r = run_with(none, need - 1, &secs);
  assert_true(r.code > 0 && strstr(r.err, "loading its weights") && needed(r.err) == need);
  tt_run_done(&r);
  // With exactly the weights available the KV pool (checked next) is what
  // refuses: the loader's figure is the weights' bytes and no more.
  r = run_with(none, need, &secs);
  assert_true(r.code != 0 ? !strstr(r.err, "loading its weights") : true);
  printf("  weights %" PRIu64 " bytes: %" PRIu64 " available passes the loader, one less is refused\n", need, need);
  tt_run_done(&r);
  // tpr convert reads through the same loader.
  const char *conv[] = {"convert", "--model", MODEL, "--tp", "1", "--out", tt_path(tmp_dir, "conv"), NULL};
  char v[32];
  snprintf(v, sizeof v, "%" PRIu64, need - 1);
  setenv("TPR_DEBUG_MEM_AVAILABLE", v, 1);
  r = tt_run(tpr_path, tmp_dir, conv, &(tt_run_opts){.timeout_s = 60});
  unsetenv("TPR_DEBUG_MEM_AVAILABLE");
  printf("  convert on %" PRIu64 " bytes: exit %d\n    %s", need - 1, r.code, r.err);
  assert_true(r.code > 0 && strstr(r.err, "loading its weights"));
  assert_true(access(tt_path(tmp_dir, "conv"), F_OK) != 0);
  tt_run_done(&r);
}

// Two ranks of one node (tp 2): the node check asks twice the largest
// rank's share. At 2 x share - 1 bytes available it refuses where a
// per-rank check would pass (the negative control); at 2 x share the
// weights load (the KV pool, checked next, may then refuse).
static void test_node_shares_memory(void **state) {
  const char *const tp2[] = {"--tp", "2", NULL};
  double secs;
  run_result r = run_np(2, tp2, 4096, &secs);
  uint64_t share = needed(r.err);
  printf("  np 2 on a 4 KiB machine: exit %d after %.2f s\n    %s", r.code, secs, r.err);
  if (r.code <= 0 || !strstr(r.err, "loading its weights") || !strstr(r.err, "on each of the 2 ranks") || !share)
    fail_msg("not refused for the node's weights");
  assert_true(secs < 30);
  tt_run_done(&r);
  r = run_np(2, tp2, 2 * share - 1, &secs);
  printf("  %" PRIu64 " bytes (2 x %" PRIu64 " - 1): exit %d\n", 2 * share - 1, share, r.code);
  assert_true(r.code > 0 && strstr(r.err, "loading its weights") && needed(r.err) == share);
  tt_run_done(&r);
  r = run_np(2, tp2, 2 * share, &secs);
  printf("  %" PRIu64 " bytes: exit %d (%s)\n", 2 * share, r.code, r.code ? "the KV pool refuses" : "runs");
  assert_true(r.code == 0 || !strstr(r.err, "loading its weights"));
  tt_run_done(&r);
  // The KV pool: 2 ranks x the pool's share each.
  uint64_t kv = (uint64_t)tt_randint(4 << 20, 8 << 20);
  char kvs[32];
  snprintf(kvs, sizeof kvs, "%" PRIu64, kv);
  const char *const pool[] = {"--tp", "2", "--kv-cache-bytes", kvs, NULL};
  r = run_np(2, pool, 3 << 20, &secs);  // the weights fit (2 x ~0.4 MB), the pools not
  uint64_t pshare = needed(r.err);
  printf("  np 2, --kv-cache-bytes %" PRIu64 " on 3 MiB: exit %d\n    %s", kv, r.code, r.err);
  if (r.code <= 0 || !strstr(r.err, "KV pool") || !strstr(r.err, "on each of the 2 ranks") || !pshare)
    fail_msg("not refused for the node's KV pools");
  tt_run_done(&r);
  r = run_np(2, pool, 2 * pshare - 1, &secs);
  assert_true(r.code > 0 && strstr(r.err, "KV pool") && needed(r.err) == pshare);
  tt_run_done(&r);
  r = run_np(2, pool, 2 * pshare, &secs);
  if (r.code != 0) fail_msg("with 2 x %" PRIu64 " bytes available: exit %d\n%s", pshare, r.code, r.err);
  tt_run_done(&r);
  printf("  KV pool %" PRIu64 " bytes per rank: 2 x that runs, one byte less is refused\n", pshare);
}

static uint64_t meminfo_kib(const char *key) {
  FILE *f = fopen("/proc/meminfo", "r");  // /proc files have no size to read up to
  char line[256];
  uint64_t v = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, key, strlen(key))) v = strtoull(line + strlen(key), NULL, 10);
  if (f) fclose(f);
  return v;
}

// A real checkpoint larger than the machine: the tiny model with its vocab
// grown until embed + lm_head exceed 2 x MemTotal, the safetensors file
// sparse (ftruncate: no disk is used, no byte of it is read).
static void test_sparse_checkpoint_larger_than_machine(void **state) {
  uint64_t total = meminfo_kib("MemTotal:") * 1024, avail = meminfo_kib("MemAvailable:") * 1024;
  assert_true(total > 0);
  const uint64_t row = 64 * sizeof(float);            // hidden_size 64, f32
  uint64_t vocab = ((2 * total / (2 * row)) / 256 + 1) * 256;  // two (V, 64) tensors > 2 x MemTotal
  char big[300];
  snprintf(big, sizeof big, "%s/big", tmp_dir);
  assert_int_equal(mkdir(big, 0755), 0);
  // config.json: the fixture's with the new vocab_size.
  char *cfg_text = tt_slurp(MODEL "/config.json", NULL);
  cJSON *cfg = cJSON_Parse(cfg_text);
  cJSON_ReplaceItemInObjectCaseSensitive(cfg, "vocab_size", cJSON_CreateNumber((double)vocab));
  char *cfg_out = cJSON_Print(cfg);
  tt_spit(tt_path(big, "config.json"), cfg_out, strlen(cfg_out));
  free(cfg_text), free(cfg_out), cJSON_Delete(cfg);
  // model.safetensors: the fixture's header, the two vocab tensors resized,
  // every tensor's offsets laid out again in the same order.
  size_t len;
  unsigned char *st = (unsigned char *)tt_slurp(MODEL "/model.safetensors", &len);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++) hlen |= (uint64_t)st[i] << (8 * i);
  cJSON *h = cJSON_ParseWithLength((const char *)st + 8, (size_t)hlen);
  assert_non_null(h);
  free(st);
  uint64_t off = 0;
  for (cJSON *t = h->child; t; t = t->next) {
    if (!strcmp(t->string, "__metadata__")) continue;
    cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    if (!strcmp(t->string, "lm_head.weight") || !strcmp(t->string, "model.embed_tokens.weight"))
      cJSON_ReplaceItemInArray(shape, 0, cJSON_CreateNumber((double)vocab));
    uint64_t nb = sizeof(float);
    for (cJSON *d = shape->child; d; d = d->next) nb *= (uint64_t)d->valuedouble;
    cJSON *offs = cJSON_CreateArray();
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + nb)));
    cJSON_ReplaceItemInObjectCaseSensitive(t, "data_offsets", offs);
    off += nb;
  }
  char *hdr = cJSON_PrintUnformatted(h);
  cJSON_Delete(h);
  size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
  unsigned char *head = calloc(8 + padded, 1);
  for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  memcpy(head + 8, hdr, hl);
  memset(head + 8 + hl, ' ', padded - hl);
  const char *path = tt_path(big, "model.safetensors");
  tt_spit(path, head, 8 + padded);
  free(head), free(hdr);
  if (truncate(path, (off_t)(8 + padded + off)) != 0) {
    printf("  skipped: cannot make a sparse file of %llu bytes here\n", (unsigned long long)off);
    return;
  }
  printf("  vocab %llu: a sparse checkpoint of %.1f GiB; MemTotal %.1f GiB, MemAvailable %.1f GiB\n",
         (unsigned long long)vocab, (double)off / 1073741824.0, (double)total / 1073741824.0,
         (double)avail / 1073741824.0);
  const char *a[] = {"run", "--model", big, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", NULL};
  double t0 = now_s();
  run_result r = tt_run(tpr_path, tmp_dir, a, &(tt_run_opts){.timeout_s = 60});
  printf("  tpr run: exit %d after %.2f s, largest child RSS so far %ld KiB\n    %s", r.code, now_s() - t0,
         max_rss_kib(), r.err);
  unlink(path), unlink(tt_path(big, "config.json")), rmdir(big);
  if (r.code <= 0 || !strstr(r.err, "loading its weights") || !strstr(r.err, "refused before allocating"))
    fail_msg("not a clean refusal by the loader (exit %d)", r.code);
  assert_true(needed(r.err) >= off);
  assert_true(max_rss_kib() < 512 * 1024);
  tt_run_done(&r);
}

static int cleanup(void **state) {
  unlink(tt_path(tmp_dir, "stdout")), unlink(tt_path(tmp_dir, "stderr"));
  return rmdir(tmp_dir) == 0 ? 0 : -1;
}

int main(void) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_faults_mem") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kv_larger_than_machine),
      cmocka_unit_test(test_kv_boundary),
      cmocka_unit_test(test_checkpoint_larger_than_machine),
      cmocka_unit_test(test_node_shares_memory),
      cmocka_unit_test(test_sparse_checkpoint_larger_than_machine),
  };
  return cmocka_run_group_tests(tests, NULL, cleanup);
}
