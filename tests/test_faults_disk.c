// A full disk: `tpr convert` and a `tpr train` save onto a small tmpfs made
// here (mount -t tmpfs -o size=N; skipped, exit 77, where mounting is not
// permitted). Each must fail with "No space left on device" naming a path on
// that file system, leave the destination as it was (a previous conversion
// byte for byte; the previous checkpoint loads and training resumes from it)
// and leave no temporary directory or partial file behind. Stale
// "<out>.tmp-<pid>" directories of killed converts: removed when the process
// is gone, reported (and kept) while it runs. Negative control: the same
// commands on a file system large enough succeed, so the failures are the
// disk's.
#define _GNU_SOURCE
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_fixture.h"

#define FIX TPR_FIXTURES "/minimax_m2_train"
#define MODEL TPR_FIXTURES "/minimax_m2_tiny"

static char tpr_path[4096], mnt[256], ref[256];
static char tmp_dir[] = "/tmp/tpr_test_faults_disk_XXXXXX";
static bool mounted;

// (Re)mounts an empty tmpfs of kib KiB on mnt.
static void mount_tmpfs(long kib) {
  if (mounted) assert_int_equal(umount2(mnt, MNT_DETACH), 0);
  char opt[64];
  snprintf(opt, sizeof opt, "size=%ldk,mode=0755", kib);
  if (mount("tmpfs", mnt, "tmpfs", 0, opt) != 0) fail_msg("mount tmpfs %s on %s: %s", opt, mnt, strerror(errno));
  mounted = true;
}

// Total bytes of the regular files in dir (flat).
static long long dir_bytes(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  long long sum = 0;
  struct dirent *e;
  struct stat st;
  while ((e = readdir(d)))
    if (stat(tt_path(dir, e->d_name), &st) == 0 && S_ISREG(st.st_mode)) sum += st.st_size;
  closedir(d);
  return sum;
}

// Every entry of mnt, space-separated (what a failed run left behind).
static void list_mnt(char *buf, size_t cap) {
  buf[0] = 0;
  DIR *d = opendir(mnt);
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      snprintf(buf + strlen(buf), cap - strlen(buf), "%s ", e->d_name);
  if (d) closedir(d);
}

static void expect_no_space(const run_result *r, const char *what) {
  printf("  %s: exit %d\n    %s", what, r->code, r->err);
  if (r->code <= 0) fail_msg("%s on a full disk: exit %d (0: success, < 0: a signal)", what, r->code);
  const char *p = strstr(r->err, "No space left on device");
  if (!p) fail_msg("%s: no \"No space left on device\" in:\n%s", what, r->err);
  if (!strstr(r->err, mnt)) fail_msg("%s: the error names no path under %s:\n%s", what, mnt, r->err);
}

static run_result convert(const char *out, const char *tp, bool force) {
  const char *a[] = {"convert", "--model", MODEL, "--tp", tp, "--out", out, force ? "--force" : NULL, NULL};
  return tt_run(tpr_path, tmp_dir, a, &(tt_run_opts){.timeout_s = 60});
}

static void test_convert_full_disk(void **state) {
  // Negative control and the size to aim at: the same conversion on /tmp.
  ck_rmdir(ref);
  run_result r = convert(ref, "2", false);
  if (r.code != 0) fail_msg("convert on /tmp: exit %d\n%s", r.code, r.err);
  tt_run_done(&r);
  long long need = dir_bytes(ref);
  char out[300], left[2048];
  snprintf(out, sizeof out, "%s/conv", mnt);
  // 1. Too small for one conversion: an error, nothing left.
  long kib = (long)(need / 1024 / 2);
  mount_tmpfs(kib);
  r = convert(out, "2", false);
  printf("conversion of %lld bytes onto a %ld KiB tmpfs\n", need, kib);
  expect_no_space(&r, "convert");
  tt_run_done(&r);
  list_mnt(left, sizeof left);
  if (left[0]) fail_msg("left on the file system after the failed convert: %s", left);
  // 2. Room for one conversion, not two: --force over a finished one must
  // leave it as it was.
  kib = (long)(need * 3 / 2 / 1024) + 8;
  mount_tmpfs(kib);
  r = convert(out, "2", false);
  if (r.code != 0) fail_msg("convert onto %ld KiB (room for one): exit %d\n%s", kib, r.code, r.err);
  tt_run_done(&r);
  size_t mlen;
  char *manifest = tt_slurp(tt_path(out, "manifest.pb"), &mlen);
  long long before = dir_bytes(out);
  r = convert(out, "1", true);
  printf("over a finished conversion (%lld bytes) on a %ld KiB tmpfs\n", before, kib);
  expect_no_space(&r, "convert --force");
  tt_run_done(&r);
  size_t mlen2;
  char *again = tt_slurp(tt_path(out, "manifest.pb"), &mlen2);
  assert_true(mlen == mlen2 && !memcmp(manifest, again, mlen));
  assert_int_equal(dir_bytes(out), before);
  free(manifest), free(again);
  list_mnt(left, sizeof left);
  if (strcmp(left, "conv ")) fail_msg("after the failed --force: %s(want only conv)", left);
  // And it still loads: a run from it.
  const char *run[] = {"run", "--model", out, "--tp", "2", "--etp", "1", "--prompt-ids", "1,2,3", "--max-new-tokens", "2", NULL};
  r = tt_run(tpr_path, tmp_dir, run, &(tt_run_opts){.np = 2, .timeout_s = 60});
  printf("  the previous conversion: manifest unchanged, %lld bytes, tpr run from it exit %d\n", before, r.code);
  if (r.code != 0) fail_msg("tpr run from the untouched conversion: exit %d\n%s", r.code, r.err);
  tt_run_done(&r);
}

static void train_args(const char **a, int *n, const char *save) {
  const char *base[] = {"train", "--data", FIX "/tokens.npy", "--data-order", "sequential", "--seq-len", "16",
                        "--lr", "1e-3", "--json", "--comm-timeout", "10", "--tp", "2", "--save", save, NULL};
  for (int i = 0; base[i]; i++) a[(*n)++] = base[i];
}

static int state_step(const char *dir) {
  char *text = tt_slurp(tt_path(dir, "trainer_state.json"), NULL);
  cJSON *j = cJSON_Parse(text);
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
  int step = cJSON_IsNumber(s) ? (int)s->valuedouble : -1;
  cJSON_Delete(j);
  free(text);
  return step;
}

static void test_save_full_disk(void **state) {
  // The size of one checkpoint (np 2, tp 2), saved on /tmp.
  ck_rmdir(ref);
  const char *a[48];
  int n = 0;
  train_args(a, &n, ref);
  const char *first[] = {"--model", MODEL, "--steps", "1", NULL};
  for (int i = 0; first[i]; i++) a[n++] = first[i];
  a[n] = NULL;
  run_result r = tt_run(tpr_path, tmp_dir, a, &(tt_run_opts){.np = 2, .timeout_s = 60});
  if (r.code != 0) fail_msg("train --save on /tmp: exit %d\n%s", r.code, r.err);
  tt_run_done(&r);
  long long need = dir_bytes(ref);
  // Room for one checkpoint, not two: the save of step 1 is published, that
  // of step 2 (DIR.tmp beside DIR) runs out of space.
  long kib = (long)(need * 3 / 2 / 1024) + 8;
  mount_tmpfs(kib);
  char ck[300], left[2048];
  snprintf(ck, sizeof ck, "%s/ck", mnt);
  n = 0;
  train_args(a, &n, ck);
  const char *more[] = {"--model", MODEL, "--steps", "3", "--save-every", "1", NULL};
  for (int i = 0; more[i]; i++) a[n++] = more[i];
  a[n] = NULL;
  r = tt_run(tpr_path, tmp_dir, a, &(tt_run_opts){.np = 2, .timeout_s = 60});
  printf("checkpoints of %lld bytes, saved every step onto a %ld KiB tmpfs\n", need, kib);
  expect_no_space(&r, "train --save-every 1");
  tt_run_done(&r);
  int step = state_step(ck);
  list_mnt(left, sizeof left);
  printf("  left: %s; %s holds step %d (%lld bytes)\n", left, ck, step, dir_bytes(ck));
  assert_int_equal(step, 1);
  if (strcmp(left, "ck ")) fail_msg("after the failed save: %s(want only ck)", left);
  assert_int_equal(dir_bytes(ck), need);
  // The previous checkpoint loads: training resumes from step 1 (no save).
  n = 0;
  const char *res[] = {"train", "--data", FIX "/tokens.npy", "--data-order", "sequential", "--seq-len", "16",
                       "--lr", "1e-3", "--json", "--comm-timeout", "10", "--tp", "2", "--resume", ck,
                       "--steps", "3", NULL};
  r = tt_run(tpr_path, tmp_dir, res, &(tt_run_opts){.np = 2, .timeout_s = 60});
  const char *s = strstr(r.out, "{\"step\":");
  printf("  resume from it: exit %d, first step %d\n", r.code, s ? atoi(s + 8) : -1);
  if (r.code != 0 || !s || atoi(s + 8) != 1) fail_msg("resume: exit %d\n%s\n%s", r.code, r.out, r.err);
  tt_run_done(&r);
}

// Stale "<out>.tmp-<pid>": a dead process's is removed, a live one's kept
// and reported.
static void test_stale_convert_tmp(void **state) {
  mount_tmpfs(4096);
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, NULL, 0);
  pid_t live = fork();
  if (live == 0) {
    pause();
    _exit(0);
  }
  char out[300], stale_dead[340], stale_live[340], junk[340];
  snprintf(out, sizeof out, "%s/conv", mnt);
  snprintf(stale_dead, sizeof stale_dead, "%s.tmp-%d", out, (int)dead);
  snprintf(stale_live, sizeof stale_live, "%s.tmp-%d", out, (int)live);
  snprintf(junk, sizeof junk, "%s.tmp-1x", out);  // not a pid: not ours to judge
  const char *dirs[] = {stale_dead, stale_live, junk};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(mkdir(dirs[i], 0755), 0);
    tt_spit(tt_path(dirs[i], "rank-00000-of-00002.safetensors"), "partial", 7);
    tt_spit(tt_path(dirs[i], "rank-00001-of-00002.safetensors.tmp.123"), "partial", 7);
  }
  run_result r = convert(out, "2", false);
  kill(live, SIGKILL), waitpid(live, NULL, 0);
  printf("  convert beside a dead run's %s and a live one's: exit %d\n    %s", stale_dead, r.code, r.err);
  assert_int_equal(r.code, 0);
  assert_true(access(stale_dead, F_OK) != 0);
  if (!strstr(r.err, "removed") || !strstr(r.err, stale_dead)) fail_msg("the removal is not reported:\n%s", r.err);
  assert_true(access(tt_path(stale_live, "rank-00000-of-00002.safetensors"), F_OK) == 0);
  if (!strstr(r.err, "still running") || !strstr(r.err, stale_live)) fail_msg("the live one is not reported");
  assert_true(access(tt_path(junk, "rank-00000-of-00002.safetensors"), F_OK) == 0);
  tt_run_done(&r);
  // A dead run's directory holding a file not of a conversion: kept, reported.
  ck_rmdir(out);
  assert_int_equal(mkdir(stale_dead, 0755), 0);
  tt_spit(tt_path(stale_dead, "notes.txt"), "mine", 4);
  r = convert(out, "2", false);
  printf("  beside a dead run's directory holding notes.txt: exit %d\n    %s", r.code, r.err);
  assert_int_equal(r.code, 0);
  assert_true(access(tt_path(stale_dead, "notes.txt"), F_OK) == 0);
  if (!strstr(r.err, "kept")) fail_msg("not reported:\n%s", r.err);
  tt_run_done(&r);
}

static int cleanup(void **state) {
  if (mounted) umount2(mnt, MNT_DETACH);
  rmdir(mnt);
  ck_rmdir(ref);
  unlink(tt_path(tmp_dir, "stdout")), unlink(tt_path(tmp_dir, "stderr"));
  return rmdir(tmp_dir) == 0 ? 0 : -1;
}

int main(void) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_faults_disk") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  snprintf(mnt, sizeof mnt, "%s/mnt", tmp_dir);
  snprintf(ref, sizeof ref, "%s/ref", tmp_dir);
  if (mkdir(mnt, 0755) != 0) return 1;
  if (mount("tmpfs", mnt, "tmpfs", 0, "size=64k") != 0) {
    printf("skipped: cannot mount a tmpfs on %s (%s); the full-disk tests need root or CAP_SYS_ADMIN\n", mnt,
           strerror(errno));
    rmdir(mnt), rmdir(tmp_dir);
    return 77;
  }
  mounted = true;
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_convert_full_disk),
      cmocka_unit_test(test_save_full_disk),
      cmocka_unit_test(test_stale_convert_tmp),
  };
  return cmocka_run_group_tests(tests, NULL, cleanup);
}
