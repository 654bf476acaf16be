// A rank of `tpr train` killed with SIGKILL, as an out-of-memory killer or a
// dead node does it: mpirun and every rank must exit non-zero within
// --comm-timeout + 5 s, a message must name the killed rank, no tpr process
// may be left, the checkpoint directory must stay a whole checkpoint and
// `tpr train --resume` must finish from it with exit 0. Killed mid-step
// (np 2 tp 2; np 4 tp 2 dp 2) and mid-save (TPR_DEBUG_SAVE_PAUSE_MS holds
// every rank inside the save after it wrote its optimizer state). Negative
// control: a checkpoint with a truncated file must fail the checker and the
// resume.
#define _GNU_SOURCE
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_fixture.h"
#include "shard/safetensors.h"

#define COMM_TIMEOUT_S 10
#define EXIT_BOUND_S (COMM_TIMEOUT_S + 5.0)
#define FIX TPR_FIXTURES "/minimax_m2_train"
#define MODEL TPR_FIXTURES "/minimax_m2_tiny"
#define MAX_NP 4
#define LONG_RUN "100000"  // steps of the killed runs: the kill ends them

static char tpr_path[4096], ck[4200], ck_tmp[4200], bad[4200];  // under tmp_dir
static char tmp_dir[] = "/tmp/tpr_test_rank_fail_XXXXXX";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(long ms) { nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL); }

// /proc/pid/stat: parent pid and state ('Z' zombie); false if gone.
static bool proc_stat(pid_t pid, pid_t *ppid, char *state) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *rp = strrchr(buf, ')');  // the name may hold spaces and parentheses
  int pp = 0;
  if (!rp || sscanf(rp + 1, " %c %d", state, &pp) != 2) return false;
  *ppid = pp;
  return true;
}

static bool alive(pid_t pid) {
  pid_t pp;
  char st;
  return proc_stat(pid, &pp, &st) && st != 'Z' && st != 'X';
}

// The world rank of a child of mpirun (OMPI_COMM_WORLD_RANK in its
// environment), or -1.
static int rank_of(pid_t pid) {
  char path[64], buf[65536];
  snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  for (char *p = buf; p < buf + n; p += strlen(p) + 1)
    if (!strncmp(p, "OMPI_COMM_WORLD_RANK=", 21)) return atoi(p + 21);
  return -1;
}

typedef struct job {
  pid_t mpirun;
  int np;
  pid_t rank[MAX_NP];
} job;

// Starts `mpirun -np np tpr args...` (output to tmp_dir/stdout, stderr) and
// finds each rank's pid among mpirun's children.
static job start(int np, const char *const *args, const char *pause_ms) {
  char out_path[4200], err_path[4200], nps[8];
  snprintf(out_path, sizeof out_path, "%s/stdout", tmp_dir);
  snprintf(err_path, sizeof err_path, "%s/stderr", tmp_dir);
  snprintf(nps, sizeof nps, "%d", np);
  const char *argv[64] = {TPR_MPIEXEC, "-np", nps, "--oversubscribe", tpr_path};
  int n = 5;
  for (int i = 0; args[i] && n < 63; i++) argv[n++] = args[i];
  argv[n] = NULL;
  fflush(stdout), fflush(stderr);
  job j = {.np = np, .mpirun = fork()};
  assert_true(j.mpirun >= 0);
  if (j.mpirun == 0) {
    int in = open("/dev/null", O_RDONLY), out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600),
        err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || out < 0 || err < 0) _exit(126);
    dup2(in, 0), dup2(out, 1), dup2(err, 2);
    for (const char *const *v = (const char *const[]){"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                                       "PMI_RANK", "SLURM_PROCID", NULL};
         *v; v++)
      unsetenv(*v);
    setenv("TPR_NUM_THREADS", "1", 1);
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);  // Open MPI's components (cli_util.c says why)
    unsetenv("TPR_LOG_LEVEL");
    if (pause_ms) setenv("TPR_DEBUG_SAVE_PAUSE_MS", pause_ms, 1);
    else unsetenv("TPR_DEBUG_SAVE_PAUSE_MS");
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int found = 0;
  for (double until = now_s() + 30; found < np && now_s() < until; sleep_ms(20)) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
      pid_t pid = (pid_t)atoi(e->d_name), pp;
      char st;
      if (pid <= 0 || !proc_stat(pid, &pp, &st) || pp != j.mpirun) continue;
      int r = rank_of(pid);
      if (r >= 0 && r < np && !j.rank[r]) j.rank[r] = pid, found++;
    }
    if (d) closedir(d);
  }
  if (found < np) {
    kill(j.mpirun, SIGKILL);
    waitpid(j.mpirun, NULL, 0);
    fail_msg("found %d of %d tpr ranks under mpirun %d; its stderr:\n%s", found, np, (int)j.mpirun,
             tt_slurp(err_path, NULL));
  }
  return j;
}

// trainer_state.json's step in dir, or -1 when there is none (yet).
static int ckpt_step(const char *dir) {
  char *p = (char *)tt_path(dir, "trainer_state.json");
  FILE *f = fopen(p, "r");
  if (!f) return -1;
  fclose(f);
  char *text = tt_slurp(p, NULL);  // written whole before it is published
  cJSON *j = cJSON_Parse(text);
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
  int step = cJSON_IsNumber(s) ? (int)s->valuedouble : -1;
  cJSON_Delete(j);
  free(text);
  return step;
}

// A whole checkpoint of world np at its trainer_state.json's step: config,
// the model and every rank's optimizer file open and agree on the step.
// Returns the step, or -1 (and why in msg).
static int check_complete(const char *dir, int np, char *msg, size_t cap) {
  int step = ckpt_step(dir);
  if (step < 1) return snprintf(msg, cap, "%s: no trainer_state.json step", dir), -1;
  if (access(tt_path(dir, "config.json"), R_OK) != 0) return snprintf(msg, cap, "%s: no config.json", dir), -1;
  tpr_st_set *set;
  if (tpr_st_open(tt_path(dir, "model.safetensors"), &set) != TPR_OK)
    return snprintf(msg, cap, "%s: %s", dir, tpr_last_error()), -1;
  bool empty = !tpr_st_get(set, 0);
  tpr_st_close(set);
  if (empty) return snprintf(msg, cap, "%s: model.safetensors holds no tensor", dir), -1;
  for (int r = 0; r < np; r++) {
    char name[64];
    snprintf(name, sizeof name, "optim-rank-%05d-of-%05d.safetensors", r, np);
    if (tpr_st_open(tt_path(dir, name), &set) != TPR_OK) return snprintf(msg, cap, "%s", tpr_last_error()), -1;
    const char *s = tpr_st_metadata(set, "step");
    int got = s ? atoi(s) : -1;
    tpr_st_close(set);
    if (got != step) return snprintf(msg, cap, "%s: step %d, trainer_state.json says %d", name, got, step), -1;
  }
  return step;
}

// The step in the metadata of DIR.tmp/file, or -1 (no such file, or not
// whole yet).
static int tmp_step(const char *file) {
  tpr_st_set *set;
  if (access(tt_path(ck_tmp, file), F_OK) != 0 || tpr_st_open(tt_path(ck_tmp, file), &set) != TPR_OK) return -1;
  const char *s = tpr_st_metadata(set, "step");
  int step = s ? atoi(s) : -1;
  tpr_st_close(set);
  return step;
}

typedef struct ended {
  int code;          // mpirun's exit status, or -signal
  double mpirun_s;   // from the kill to mpirun's exit
  double ranks_s;    // from the kill to the last rank's end
  char *out, *err;
} ended;

// Waits for mpirun and every rank to end (at most EXIT_BOUND_S + 20 s, then
// kills what is left, all of it started here, and fails).
static ended wait_all(const job *j, double killed_at) {
  ended e = {.mpirun_s = -1, .ranks_s = -1};
  int st = 0;
  for (double until = killed_at + EXIT_BOUND_S + 20; now_s() < until; sleep_ms(5)) {
    if (e.mpirun_s < 0 && waitpid(j->mpirun, &st, WNOHANG) == j->mpirun) e.mpirun_s = now_s() - killed_at;
    while (waitpid(-1, NULL, WNOHANG) > 0) continue;  // ranks re-parented to us (the subreaper)
    int left = 0;
    for (int r = 0; r < j->np; r++) left += alive(j->rank[r]);
    if (!left && e.ranks_s < 0) e.ranks_s = now_s() - killed_at;
    if (e.mpirun_s >= 0 && e.ranks_s >= 0) break;
  }
  bool hung = e.mpirun_s < 0 || e.ranks_s < 0;
  for (int r = 0; hung && r < j->np; r++)
    if (alive(j->rank[r])) kill(j->rank[r], SIGKILL);
  if (e.mpirun_s < 0) kill(j->mpirun, SIGKILL), waitpid(j->mpirun, &st, 0);
  e.code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
  e.out = tt_slurp(tt_path(tmp_dir, "stdout"), NULL);
  e.err = tt_slurp(tt_path(tmp_dir, "stderr"), NULL);
  if (hung) fail_msg("still running %.0f s after the kill (mpirun %s)\nstderr:\n%s", EXIT_BOUND_S + 20,
                     e.mpirun_s < 0 ? "too" : "had exited", e.err);
  return e;
}

// The last step rank 0 reported before the kill (-1: none).
static int last_step(const char *out) {
  int last = -1;
  for (const char *p = strstr(out, "{\"step\":"); p; p = strstr(p + 1, "{\"step\":")) last = atoi(p + 8);
  return last;
}

static void expect_named(const ended *e, int victim, int np) {
  char want[64], other[64];
  snprintf(want, sizeof want, "rank %d", victim);
  // Open MPI: "mpirun noticed that process rank N with PID ... exited on
  // signal 9"; the watchdog: "missing from ... rank N: no answer".
  const char *hit = strstr(e->err, "process rank") ? strstr(strstr(e->err, "process rank"), want) : NULL;
  if (!hit) hit = strstr(e->err, "no answer") ? strstr(e->err, want) : NULL;
  if (!hit) fail_msg("no message names the killed rank %d\nstderr:\n%s", victim, e->err);
  for (int r = 0; r < np; r++) {  // and no survivor is blamed for the signal
    snprintf(other, sizeof other, "process rank %d with", r);
    if (r != victim && strstr(e->err, other)) fail_msg("rank %d is named as the dead one:\n%s", r, e->err);
  }
}

static void train_args(const char **a, int *n, const char *const *mesh) {
  static const char *const base[] = {"train", "--data", FIX "/tokens.npy", "--data-order", "sequential",
                                     "--seq-len", "16", "--steps", LONG_RUN, "--lr", "1e-3", "--json",
                                     "--comm-timeout", "10", NULL};
  for (int i = 0; base[i]; i++) a[(*n)++] = base[i];
  for (int i = 0; mesh[i]; i++) a[(*n)++] = mesh[i];
}

// Resumes from ck to step `to` (saving there); exit 0, and its first step is
// the checkpoint's. Returns the step the checkpoint then holds.
static int resume(int np, const char *const *mesh, int from, int to) {
  const char *a[48];
  int n = 0;
  train_args(a, &n, mesh);
  char stop[16];
  snprintf(stop, sizeof stop, "%d", to);
  const char *more[] = {"--resume", ck, "--save", ck, "--stop-after", stop, NULL};
  for (int i = 0; more[i]; i++) a[n++] = more[i];
  a[n] = NULL;
  double t0 = now_s();
  run_result r = tt_run(tpr_path, tmp_dir, a, &(tt_run_opts){.np = np, .timeout_s = 120});
  if (r.code != 0) fail_msg("resume from step %d failed with %d:\n%s", from, r.code, r.err);
  const char *first = strstr(r.out, "{\"step\":");
  assert_non_null(first);
  assert_int_equal(atoi(first + 8), from);  // continues where the checkpoint stopped, not from 0
  assert_int_equal(last_step(r.out), to - 1);
  tt_run_done(&r);
  char msg[9000];
  int step = check_complete(ck, np, msg, sizeof msg);
  if (step < 0) fail_msg("after the resume: %s", msg);
  if (access(ck_tmp, F_OK) == 0) fail_msg("%s is left after a successful save", ck_tmp);
  printf("    resume: steps %d..%d, exit 0 (%.1f s), checkpoint at step %d\n", from, to - 1, now_s() - t0, step);
  return step;
}

// Starts a run that saves every step into ck, lets it reach `min_step`
// checkpoints, kills rank `victim` (at once, or when it is inside a save),
// and checks the exit, the message, the processes and the checkpoint.
static void kill_and_check(int np, const char *const *mesh, int victim, bool in_save) {
  ck_rmdir(ck), ck_rmdir(ck_tmp);
  const char *a[48];
  int n = 0;
  train_args(a, &n, mesh);
  const char *more[] = {"--model", MODEL, "--save", ck, "--save-every", "1", NULL};
  for (int i = 0; more[i]; i++) a[n++] = more[i];
  a[n] = NULL;
  job j = start(np, a, in_save ? "400" : NULL);
  int min_step = in_save ? 2 : 1;
  double until = now_s() + 40;
  while (ckpt_step(ck) < min_step && now_s() < until && waitpid(j.mpirun, NULL, WNOHANG) == 0) sleep_ms(5);
  char victim_file[64];
  snprintf(victim_file, sizeof victim_file, "optim-rank-%05d-of-%05d.safetensors", victim, np);
  // In a save: the victim has written its optimizer file for the step after
  // the published one into DIR.tmp and sleeps (TPR_DEBUG_SAVE_PAUSE_MS)
  // before the model is gathered. (Right after a publish DIR.tmp briefly
  // holds the previous checkpoint, swapped out: an older step.)
  while (in_save && tmp_step(victim_file) != ckpt_step(ck) + 1 && now_s() < until) sleep_ms(2);
  int before = ckpt_step(ck);
  if (before < min_step || !alive(j.rank[victim])) {
    for (int r = 0; r < np; r++) kill(j.rank[r], SIGKILL);
    kill(j.mpirun, SIGKILL), waitpid(j.mpirun, NULL, 0);
    fail_msg("no checkpoint at step %d within 40 s (or the run ended): %s", min_step,
             tt_slurp(tt_path(tmp_dir, "stderr"), NULL));
  }
  double t = now_s();
  assert_int_equal(kill(j.rank[victim], SIGKILL), 0);
  ended e = wait_all(&j, t);
  printf("  np %d rank %d killed %s (checkpoint at step %d, rank 0 had reported step %d): mpirun exit %d after "
         "%.2f s, last rank gone after %.2f s (bound %.0f s)\n",
         np, victim, in_save ? "inside a save" : "mid-run", before, last_step(e.out), e.code, e.mpirun_s, e.ranks_s,
         EXIT_BOUND_S);
  if (e.code == 0) fail_msg("mpirun exited 0 after rank %d was killed", victim);
  assert_true(e.mpirun_s <= EXIT_BOUND_S && e.ranks_s <= EXIT_BOUND_S);
  expect_named(&e, victim, np);
  char msg[9000];
  int step = check_complete(ck, np, msg, sizeof msg);
  if (step < 0) fail_msg("the checkpoint is not whole after the kill: %s", msg);
  assert_true(step >= before);
  if (in_save) {  // the interrupted save published nothing: the previous checkpoint, and a leftover
    assert_int_equal(step, before);
    if (tmp_step(victim_file) != before + 1) fail_msg("the kill did not land inside the save of step %d", before + 1);
    assert_int_equal(ckpt_step(ck_tmp), -1);
    printf("    %s holds the interrupted save's files (no trainer_state.json); %s is step %d\n", ck_tmp, ck, step);
    // A rank killed inside the safetensors writer leaves its partial
    // "<file>.tmp.<pid>" there too (the mid-run kill lands there now and
    // then): the next save must clear it as well.
    char partial[96];
    snprintf(partial, sizeof partial, "%s.tmp.%d", victim_file, (int)j.rank[victim]);
    tt_spit(tt_path(ck_tmp, partial), "partial", 7);
  }
  free(e.out), free(e.err);
  int after = resume(np, mesh, step, step + 2);
  assert_int_equal(after, step + 2);
}

#define MESH(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_kill_mid_run(void **state) {
  kill_and_check(2, MESH("--tp", "2"), 1, false);
  kill_and_check(4, MESH("--tp", "2", "--dp", "2"), (int)tt_randint(1, 3), false);
}

static void test_kill_in_save(void **state) {
  kill_and_check(2, MESH("--tp", "2"), 1, true);
  kill_and_check(4, MESH("--tp", "2", "--dp", "2"), (int)tt_randint(1, 3), true);
}

// A rank stopped with SIGSTOP (a hung node, a debugger, swapping to death)
// is alive to mpirun, so only the watchdog can end the job: the survivors'
// watchdogs must ask it, get no answer, name it, and bring every rank down
// within --comm-timeout + 5 s.
static void test_stopped_rank(void **state) {
  const int np = 2, victim = (int)tt_randint(0, 1);
  const char *a[48];
  int n = 0;
  train_args(a, &n, MESH("--tp", "2"));
  a[n++] = "--model", a[n++] = MODEL, a[n] = NULL;
  job j = start(np, a, NULL);
  double until = now_s() + 40;
  char *out = NULL;
  for (int step = -1; step < 1 && now_s() < until && waitpid(j.mpirun, NULL, WNOHANG) == 0; sleep_ms(20)) {
    free(out);
    out = tt_slurp(tt_path(tmp_dir, "stdout"), NULL);
    step = last_step(out);
  }
  free(out);
  if (!alive(j.rank[victim])) fail_msg("the run ended before a step: %s", tt_slurp(tt_path(tmp_dir, "stderr"), NULL));
  double t = now_s();
  assert_int_equal(kill(j.rank[victim], SIGSTOP), 0);
  ended e = wait_all(&j, t);
  printf("  np %d rank %d stopped (SIGSTOP) after rank 0 reported step %d: mpirun exit %d after %.2f s, last rank gone "
         "after %.2f s (bound %.0f s)\n",
         np, victim, last_step(e.out), e.code, e.mpirun_s, e.ranks_s, EXIT_BOUND_S);
  if (e.code == 0) fail_msg("mpirun exited 0 with rank %d stopped", victim);
  assert_true(e.mpirun_s <= EXIT_BOUND_S && e.ranks_s <= EXIT_BOUND_S);
  char want[64];
  snprintf(want, sizeof want, "rank %d: no answer", victim);
  if (!strstr(e.err, want)) fail_msg("the watchdog does not name the stopped rank (\"%s\"):\n%s", want, e.err);
  printf("    the watchdog: \"%s\"\n", want);
  free(e.out), free(e.err);
}

// Negative control: the checker and the resume must see a damaged
// checkpoint (a truncated optimizer file of rank 1).
static void test_damaged_checkpoint_is_refused(void **state) {
  const char *mesh[] = {"--tp", "2", NULL};
  char msg[9000];
  if (check_complete(ck, 2, msg, sizeof msg) < 0) {  // the np 4 checkpoint of the last test: make an np 2 one
    ck_rmdir(ck);
    const char *a[48];
    int n = 0;
    train_args(a, &n, mesh);
    const char *more[] = {"--model", MODEL, "--save", ck, "--stop-after", "1", NULL};
    for (int i = 0; more[i]; i++) a[n++] = more[i];
    a[n] = NULL;
    run_result r = tt_run(tpr_path, tmp_dir, a, &(tt_run_opts){.np = 2, .timeout_s = 120});
    assert_int_equal(r.code, 0);
    tt_run_done(&r);
  }
  assert_true(check_complete(ck, 2, msg, sizeof msg) >= 1);
  ck_rmdir(bad);
  assert_int_equal(mkdir(bad, 0755), 0);
  static const char *const files[] = {"config.json", "model.safetensors", "trainer_state.json",
                                      "optim-rank-00000-of-00002.safetensors", "optim-rank-00001-of-00002.safetensors"};
  for (int i = 0; i < 5; i++) {
    size_t len;
    char *bytes = tt_slurp(tt_path(ck, files[i]), &len);
    tt_spit(tt_path(bad, files[i]), bytes, i == 4 ? len / 2 : len);
    free(bytes);
  }
  assert_true(check_complete(bad, 2, msg, sizeof msg) < 0);
  printf("  truncated optimizer file: checker says \"%s\"\n", msg);
  const char *a[48];
  int n = 0;
  train_args(a, &n, mesh);
  const char *more[] = {"--resume", bad, "--stop-after", "3", NULL};
  for (int i = 0; more[i]; i++) a[n++] = more[i];
  a[n] = NULL;
  run_result r = tt_run(tpr_path, tmp_dir, a, &(tt_run_opts){.np = 2, .timeout_s = 120});
  if (r.code == 0 || !strstr(r.err, "optim-rank-00001")) fail_msg("resume from a damaged checkpoint: exit %d\n%s", r.code, r.err);
  printf("  resume from it: exit %d\n", r.code);
  tt_run_done(&r);
}

static int cleanup(void **state) {
  ck_rmdir(ck), ck_rmdir(ck_tmp), ck_rmdir(bad);
  unlink(tt_path(tmp_dir, "stdout")), unlink(tt_path(tmp_dir, "stderr"));
  return rmdir(tmp_dir) == 0 ? 0 : -1;
}

int main(void) {
  if (tt_tpr_path(tpr_path, sizeof tpr_path, "test_train_rank_failure") != 0) return 1;
  if (!mkdtemp(tmp_dir)) return 1;
  snprintf(ck, sizeof ck, "%s/ck", tmp_dir);
  snprintf(ck_tmp, sizeof ck_tmp, "%s/ck.tmp", tmp_dir);
  snprintf(bad, sizeof bad, "%s/bad", tmp_dir);
  // Ranks that outlive mpirun come to this process, which can then see
  // (and reap) them: "no rank left behind" is checked, not assumed.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kill_mid_run),
      cmocka_unit_test(test_kill_in_save),
      cmocka_unit_test(test_damaged_checkpoint_is_refused),
      cmocka_unit_test(test_stopped_rank),
  };
  return cmocka_run_group_tests(tests, NULL, cleanup);
}
