#include "cli_util.h"

#include <fcntl.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "test_util.h"

char *tt_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = calloc((size_t)n + 1, 1);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  if (len) *len = (size_t)n;
  return buf;
}

void tt_spit(const char *path, const void *bytes, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) fail_msg("cannot create %s", path);
  assert_int_equal(fwrite(bytes, 1, len, f), len);
  fclose(f);
}

void tt_write_npy_i32(const char *path, const int32_t *v, int64_t n) {
  char h[118];  // 10 + 118 = 128 bytes before the data: aligned, as numpy writes it
  snprintf(h, sizeof h, "{'descr': '<i4', 'fortran_order': False, 'shape': (%lld,), }", (long long)n);
  size_t len = strlen(h);
  memset(h + len, ' ', sizeof h - len - 1), h[sizeof h - 1] = '\n';
  size_t bytes = 10 + sizeof h + (size_t)n * sizeof *v;
  unsigned char *b = malloc(bytes);
  assert_non_null(b);
  memcpy(b, "\x93NUMPY\x01\x00", 8);
  b[8] = (unsigned char)sizeof h, b[9] = 0;
  memcpy(b + 10, h, sizeof h);
  memcpy(b + 10 + sizeof h, v, (size_t)n * sizeof *v);
  tt_spit(path, b, bytes);
  free(b);
}

const char *tt_path(const char *dir, const char *name) {
  static char paths[8][4200];
  static int next;
  char *p = paths[next++ % 8];
  snprintf(p, sizeof paths[0], "%s/%s", dir, name);
  return p;
}

void tt_configs_dir(char *buf, size_t cap) {
  // CMake compiles with absolute paths, so __FILE__ locates tests/.
  const char *env = getenv("TPR_CONFIGS_DIR");
  char here[4096];
  snprintf(here, sizeof here, "%s", __FILE__);
  snprintf(buf, cap, "%s%s", env ? env : dirname(here), env ? "" : "/../configs");
}

int tt_self_exe(char *buf, size_t cap) {
  ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
  if (n <= 0) return -1;
  buf[n] = '\0';
  return 0;
}

int tt_tpr_path(char *buf, size_t cap, const char *test) {
  char self[4096];
  if (tt_self_exe(self, sizeof self) != 0) return -1;
  snprintf(buf, cap, "%s/tpr", dirname(self));
  if (access(buf, X_OK) == 0) return 0;
  fprintf(stderr, "%s: %s is not built\n", test, buf);
  return -1;
}

// Runs argv (argv[0] a path) with stdin from /dev/null and stdout/stderr
// captured in tmp_dir; `detach` unsets the launcher variables so a child of
// an MPI test is not mistaken for an MPI rank.
static run_result run_argv(const char *const *argv, const char *tmp_dir, bool detach, bool mpi) {
  char out_path[4200], err_path[4200];
  snprintf(out_path, sizeof out_path, "%s/stdout", tmp_dir);
  snprintf(err_path, sizeof err_path, "%s/stderr", tmp_dir);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int in = open("/dev/null", O_RDONLY);
    int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || out < 0 || err < 0) _exit(126);
    dup2(in, 0), dup2(out, 1), dup2(err, 2);
    static const char *const launcher_vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                                "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; detach && i < sizeof launcher_vars / sizeof launcher_vars[0]; i++) unsetenv(launcher_vars[i]);
    setenv("TPR_NUM_THREADS", "1", 1);
    unsetenv("TPR_LOG_LEVEL");
    // Open MPI's dlopen'ed components leak what LeakSanitizer cannot
    // attribute (tests/CMakeLists.txt says the same for mpirun tests).
    if (mpi) setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  run_result r = {.code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st)};
  r.out = tt_slurp(out_path, NULL);
  r.err = tt_slurp(err_path, NULL);
  if (strstr(r.err, "Sanitizer") || strstr(r.err, "runtime error:")) {
    fprintf(stderr, "%s: sanitizer report:\n%s\n", argv[1] ? argv[1] : argv[0], r.err);
    tt_run_done(&r);
    fail();
  }
  return r;
}

run_result tt_run(const char *exe, const char *tmp_dir, const char *const *args, const tt_run_opts *o) {
  static const tt_run_opts none;
  if (!o) o = &none;
  const char *argv[64];
  char nps[16], secs[16];
  int n = 0;
  if (o->timeout_s > 0) {  // coreutils timeout: exit 124 when it had to kill
    snprintf(secs, sizeof secs, "%d", o->timeout_s);
    argv[n++] = "/usr/bin/timeout", argv[n++] = "-k", argv[n++] = "5", argv[n++] = secs;
  }
  if (o->np > 0) {
    snprintf(nps, sizeof nps, "%d", o->np);
    argv[n++] = TPR_MPIEXEC, argv[n++] = "-np", argv[n++] = nps, argv[n++] = "--oversubscribe";
  }
  argv[n++] = exe;
  for (int i = 0; args[i] && n < 63; i++) argv[n++] = args[i];
  argv[n] = NULL;
  run_result r = run_argv(argv, tmp_dir, true, o->np > 0);
  if (o->timeout_s > 0 && r.code == 124)
    fail_msg("%s %s (np %d) hung: killed after %d s\nstderr:\n%s", exe, args[0] ? args[0] : "", o->np, o->timeout_s,
             r.err);
  return r;
}

run_result tt_run_tpr(const char *tpr, const char *tmp_dir, const char *const *args) {
  return tt_run(tpr, tmp_dir, args, NULL);  // not under mpirun: the CLI must pick the self backend
}

run_result tt_run_mpi(int np, const char *exe, const char *tmp_dir, const char *const *args) {
  return tt_run(exe, tmp_dir, args, &(tt_run_opts){.np = np});
}

void tt_run_done(run_result *r) {
  free(r->out);
  free(r->err);
}

cJSON *tt_json_of(run_result r) {
  if (r.code != 0) fail_msg("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
  cJSON *j = cJSON_Parse(r.out);
  if (!cJSON_IsObject(j)) fail_msg("not a JSON object:\n%s", r.out);
  tt_run_done(&r);
  return j;
}

double tt_json_num(const cJSON *j, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsNumber(v)) fail_msg("JSON key '%s' missing or not a number", key);
  return v->valuedouble;
}
