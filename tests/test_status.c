// Error reporting (runtime/status.h) and logging (runtime/log.h).
//
// Messages carry "file:line: " of the raise and " (at file:line)" per
// propagation step; the tests compute the expected lines with __LINE__ so a
// macro that records the wrong place fails. Log output is captured by
// pointing fd 2 at a temporary file. TPR_LOG_LEVEL is read once per process,
// so its parsing is checked in fresh child processes (this binary re-run with
// --print-log-level).
#include "test_util.h"
#include "cli_util.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char self_exe[4096];

static void expect_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("expected '%s' in '%s'", needle, hay);
}

static int fail_line;  // line of the TPR_FAIL in raise_err()
static tpr_status raise_err(tpr_status s, int value) {
  fail_line = __LINE__; return TPR_FAIL(s, "value %d is bad, name '%s'", value, "abc");
}

static tpr_status ok_call(void) { return TPR_OK; }

static int check_line;  // line of the TPR_CHECK in pass_up()
static int pass_up_reached_end;
static tpr_status pass_up(tpr_status s, int value) {
  check_line = __LINE__; TPR_CHECK(s == TPR_OK ? ok_call() : raise_err(s, value));
  pass_up_reached_end = 1;
  return TPR_OK;
}

static void test_fail_records_file_line_message(void **state) {
  int v = (int)tt_randint(-1000000, 1000000);
  tpr_clear_error();
  assert_int_equal(raise_err(TPR_ERR_SHAPE, v), TPR_ERR_SHAPE);
  char want[256];
  snprintf(want, sizeof want, "test_status.c:%d: value %d is bad, name 'abc'", fail_line, v);
  assert_string_equal(tpr_last_error(), want);
  // Only the base name of the file is kept.
  assert_null(strchr(tpr_last_error(), '/'));
  assert_int_equal(tpr__fail(TPR_ERR_IO, "/some/dir/deep/file.c", 77, "x=%d", 5), TPR_ERR_IO);
  assert_string_equal(tpr_last_error(), "file.c:77: x=5");
  // A later failure replaces the earlier message.
  assert_int_equal(raise_err(TPR_ERR_DTYPE, v + 1), TPR_ERR_DTYPE);
  snprintf(want, sizeof want, "test_status.c:%d: value %d is bad, name 'abc'", fail_line, v + 1);
  assert_string_equal(tpr_last_error(), want);
}

static void test_check_propagates(void **state) {
  int v = (int)tt_randint(1, 1 << 30);
  for (tpr_status s = TPR_ERR_INVALID_ARG; s < TPR_STATUS_COUNT; s++) {
    pass_up_reached_end = 0;
    assert_int_equal(pass_up(s, v), s);
    assert_int_equal(pass_up_reached_end, 0);  // returned at the TPR_CHECK
    char want[256];
    snprintf(want, sizeof want, "test_status.c:%d: value %d is bad, name 'abc' (at test_status.c:%d)", fail_line, v,
             check_line);
    assert_string_equal(tpr_last_error(), want);
  }
  // A passing call goes on and leaves no message.
  tpr_clear_error();
  assert_int_equal(pass_up(TPR_OK, v), TPR_OK);
  assert_int_equal(pass_up_reached_end, 1);
  assert_string_equal(tpr_last_error(), "");
}

static tpr_status with_cleanup(tpr_status s, int *cleaned, int *after, int *goto_line) {
  tpr_status rc = TPR_OK;
  TPR_CHECK_GOTO(ok_call(), rc, cleanup);
  *goto_line = __LINE__; TPR_CHECK_GOTO(s == TPR_OK ? ok_call() : raise_err(s, 7), rc, cleanup);
  *after = 1;
cleanup:
  *cleaned = 1;
  return rc;
}

static void test_check_goto(void **state) {
  int cleaned = 0, after = 0, line = 0;
  assert_int_equal(with_cleanup(TPR_ERR_FORMAT, &cleaned, &after, &line), TPR_ERR_FORMAT);
  assert_int_equal(cleaned, 1);
  assert_int_equal(after, 0);
  char want[256];
  snprintf(want, sizeof want, "test_status.c:%d: value 7 is bad, name 'abc' (at test_status.c:%d)", fail_line, line);
  assert_string_equal(tpr_last_error(), want);
  cleaned = after = 0;
  assert_int_equal(with_cleanup(TPR_OK, &cleaned, &after, &line), TPR_OK);
  assert_int_equal(cleaned, 1);
  assert_int_equal(after, 1);
}

static void test_status_names(void **state) {
  static const char *const want[TPR_STATUS_COUNT] = {
      "TPR_OK", "TPR_ERR_INVALID_ARG", "TPR_ERR_SHAPE", "TPR_ERR_DTYPE", "TPR_ERR_OOM",
      "TPR_ERR_IO", "TPR_ERR_FORMAT", "TPR_ERR_UNSUPPORTED", "TPR_ERR_COMM", "TPR_ERR_INTERNAL"};
  for (int s = 0; s < TPR_STATUS_COUNT; s++) assert_string_equal(tpr_status_name((tpr_status)s), want[s]);
  assert_string_equal(tpr_status_name(TPR_STATUS_COUNT), "TPR_ERR_UNKNOWN");
  assert_string_equal(tpr_status_name((tpr_status)-1), "TPR_ERR_UNKNOWN");
  assert_string_equal(tpr_status_name((tpr_status)12345), "TPR_ERR_UNKNOWN");
}

static void test_clear_error(void **state) {
  raise_err(TPR_ERR_OOM, 1);
  assert_true(strlen(tpr_last_error()) > 0);
  tpr_clear_error();
  assert_string_equal(tpr_last_error(), "");
  // Propagating with no message still reads as a trace.
  tpr__propagate(TPR_ERR_IO, "x/y.c", 3);
  assert_string_equal(tpr_last_error(), " (at y.c:3)");
}

static void test_long_messages_truncate(void **state) {
  size_t n = 10000 + (size_t)tt_randint(0, 5000);
  char *big = malloc(n + 1);
  for (size_t i = 0; i < n; i++) big[i] = (char)('a' + tt_randint(0, 25));
  big[n] = '\0';
  assert_int_equal(TPR_FAIL(TPR_ERR_INTERNAL, "%s", big), TPR_ERR_INTERNAL);
  const char *e = tpr_last_error();
  size_t len = strlen(e);
  assert_true(len > 1000 && len < 4096);
  const char *colon = strstr(e, ": ");
  assert_non_null(colon);
  assert_memory_equal(colon + 2, big, len - (size_t)(colon + 2 - e));  // a prefix of the message, intact
  // Propagation into a full buffer never overflows and keeps the message.
  for (int i = 0; i < 100; i++) assert_int_equal(tpr__propagate(TPR_ERR_INTERNAL, "f.c", i), TPR_ERR_INTERNAL);
  assert_int_equal(strlen(tpr_last_error()), len);
  // Many propagation steps on a short message stop before the end of the buffer.
  raise_err(TPR_ERR_SHAPE, 1);
  for (int i = 0; i < 1000; i++) tpr__propagate(TPR_ERR_SHAPE, "g.c", 123456);
  len = strlen(tpr_last_error());
  assert_true(len > 1000 && len < 4096);
  expect_contains(tpr_last_error(), "(at g.c:123456)");
  free(big);
}

static void *other_thread(void *arg) {
  *(int *)arg = strlen(tpr_last_error()) == 0;  // errors are per thread
  raise_err(TPR_ERR_COMM, 99);
  return NULL;
}

static void test_errors_are_per_thread(void **state) {
  raise_err(TPR_ERR_SHAPE, 5);
  char before[512];
  snprintf(before, sizeof before, "%s", tpr_last_error());
  int clean = 0;
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, other_thread, &clean), 0);
  pthread_join(th, NULL);
  assert_int_equal(clean, 1);
  assert_string_equal(tpr_last_error(), before);
}

// Runs fn with fd 2 redirected to a temp file; returns what it wrote (malloc'ed).
static char *capture_stderr(void (*fn)(void)) {
  char path[] = "/tmp/tpr_test_status_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  assert_true(saved >= 0);
  dup2(fd, 2);
  fn();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  off_t size = lseek(fd, 0, SEEK_END);
  char *text = calloc((size_t)size + 1, 1);
  assert_int_equal(pread(fd, text, (size_t)size, 0), size);
  close(fd);
  unlink(path);
  return text;
}

static int log_value;
static char long_text[6000];
static void log_levels(void) {
  tpr_log_set_rank(3);
  tpr_log_set_level(TPR_LOG_WARN);
  TPR_LOG_DBG("debug hidden %d", log_value);
  TPR_LOG_INF("info hidden %d", log_value);
  TPR_LOG_WRN("warn shown %d", log_value);
  TPR_LOG_ERR("error shown %d\n", log_value);  // a trailing newline is not doubled
  tpr_log_set_rank(-1);
  TPR_LOG_WRN("no rank %d", log_value);
  tpr_log_set_level(TPR_LOG_DEBUG);
  TPR_LOG_DBG("debug now shown %d", log_value);
  tpr_log(TPR_LOG_TRACE, "trace hidden %d", log_value);
  tpr_log_set_level(TPR_LOG_ERROR);
  TPR_LOG_WRN("warn hidden %d", log_value);
  tpr_log_set_level(TPR_LOG_WARN);
}
static void log_long(void) {
  tpr_log_set_rank(3);
  tpr_log_set_level(TPR_LOG_WARN);
  TPR_LOG_WRN("%s", long_text);
  TPR_LOG_WRN("after");
}

static void test_log(void **state) {
  log_value = (int)tt_randint(0, 1 << 30);
  char *out = capture_stderr(log_levels);
  char want[512];
  snprintf(want, sizeof want,
           "[tpr r3 WARN] warn shown %d\n[tpr r3 ERROR] error shown %d\n[tpr WARN] no rank %d\n"
           "[tpr DEBUG] debug now shown %d\n",
           log_value, log_value, log_value, log_value);
  assert_string_equal(out, want);
  assert_null(strstr(out, "hidden"));
  free(out);
  assert_int_equal(tpr_log_get_level(), TPR_LOG_WARN);
  tpr_log_set_level(TPR_LOG_TRACE);
  assert_int_equal(tpr_log_get_level(), TPR_LOG_TRACE);
  tpr_log_set_level(TPR_LOG_WARN);

  // An over-long message is cut, still a line of its own, and the next line is intact.
  for (size_t i = 0; i + 1 < sizeof long_text; i++) long_text[i] = (char)('a' + tt_randint(0, 25));
  out = capture_stderr(log_long);
  assert_true(strncmp(out, "[tpr r3 WARN] ", 14) == 0);
  char *nl = strchr(out, '\n');
  assert_non_null(nl);
  assert_true(nl - out < 4096);
  assert_memory_equal(out + 14, long_text, (size_t)(nl - out - 14));
  assert_string_equal(nl + 1, "[tpr r3 WARN] after\n");
  free(out);
  tpr_log_set_rank(-1);
}

// The level a fresh process reads from TPR_LOG_LEVEL (NULL: unset); the
// child's stderr goes to err (cap bytes).
static int child_level(const char *value, char *err, size_t cap) {
  char path[] = "/tmp/tpr_test_status_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fd, 2);
    if (value) setenv("TPR_LOG_LEVEL", value, 1); else unsetenv("TPR_LOG_LEVEL");
    execl(self_exe, self_exe, "--print-log-level", (char *)NULL);
    _exit(127);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  ssize_t got = pread(fd, err, cap - 1, 0);
  err[got > 0 ? got : 0] = '\0';
  close(fd);
  unlink(path);
  assert_true(WIFEXITED(st));
  return WEXITSTATUS(st);
}

static void test_log_level_env(void **state) {
  static const struct { const char *value; int level; bool warns; } cases[] = {
      {NULL, TPR_LOG_WARN, false},  {"", TPR_LOG_WARN, false},     {"error", TPR_LOG_ERROR, false},
      {"WARN", TPR_LOG_WARN, false}, {"warning", TPR_LOG_WARN, false}, {"Info", TPR_LOG_INFO, false},
      {"debug", TPR_LOG_DEBUG, false}, {"trace", TPR_LOG_TRACE, false}, {"0", TPR_LOG_ERROR, false},
      {"4", TPR_LOG_TRACE, false},  {"2", TPR_LOG_INFO, false},    {"5", TPR_LOG_WARN, true},
      {"loud", TPR_LOG_WARN, true}, {"44", TPR_LOG_WARN, true},
  };
  char err[1024];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int got = child_level(cases[i].value, err, sizeof err);
    if (got != cases[i].level)
      fail_msg("TPR_LOG_LEVEL=%s: level %d, want %d", cases[i].value ? cases[i].value : "(unset)", got,
               cases[i].level);
    if (cases[i].warns) {
      expect_contains(err, "not understood");
      expect_contains(err, cases[i].value);
    } else {
      assert_string_equal(err, "");
    }
  }
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--print-log-level") == 0) return (int)tpr_log_get_level();
  if (tt_self_exe(self_exe, sizeof self_exe) != 0) return 1;
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fail_records_file_line_message),
      cmocka_unit_test(test_check_propagates),
      cmocka_unit_test(test_check_goto),
      cmocka_unit_test(test_status_names),
      cmocka_unit_test(test_clear_error),
      cmocka_unit_test(test_long_messages_truncate),
      cmocka_unit_test(test_errors_are_per_thread),
      cmocka_unit_test(test_log),
      cmocka_unit_test(test_log_level_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
