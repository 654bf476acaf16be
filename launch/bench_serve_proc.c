#include "launch/bench_serve_proc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch/cli_util.h"

#define POLL_MS 20

void tpr_proc_push(tpr_proc_argv *a, const char *arg) {
  char *copy = a->n < TPR_PROC_ARGV_MAX ? strdup(arg) : NULL;
  if (!copy) {
    a->overflow = true;
    return;
  }
  a->v[a->n++] = copy;
  a->v[a->n] = NULL;
}

void tpr_proc_pushf(tpr_proc_argv *a, const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  tpr_proc_push(a, buf);
}

void tpr_proc_push_launcher(tpr_proc_argv *a, int np, const char *mpirun, const char *tpr) {
  if (np > 1) {
    tpr_proc_push(a, mpirun);
    tpr_proc_push(a, "-np");
    tpr_proc_pushf(a, "%d", np);
    tpr_proc_push(a, "--oversubscribe");
  }
  tpr_proc_push(a, tpr);
}

const char *tpr_proc_line(const tpr_proc_argv *a, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < a->n && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? " " : "", a->v[i]);
  return buf;
}

void tpr_proc_argv_free(tpr_proc_argv *a) {
  for (int i = 0; i < a->n; i++) free(a->v[i]);
  a->n = 0;
}

static void sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

bool tpr_proc_start(const tpr_proc_argv *a, bool mpirun, const char *out_path, const char *err_path, tpr_proc *p) {
  if (a->overflow || a->n == 0) {
    fprintf(stderr, "tpr bench serve: command line too long (at most %d arguments)\n", TPR_PROC_ARGV_MAX);
    return false;
  }
  fflush(stdout);  // what is buffered here must not be written twice
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "tpr bench serve: fork: %s\n", strerror(errno));
    return false;
  }
  if (pid == 0) {
    int in = open("/dev/null", O_RDONLY);
    int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = strcmp(out_path, err_path) == 0 ? out : open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || err < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(126);
    execvp(a->v[0], a->v);
    fprintf(stderr, "tpr bench serve: cannot run %s: %s\n", a->v[0], strerror(errno));
    _exit(127);
  }
  *p = (tpr_proc){.pid = pid, .mpirun = mpirun};
  return true;
}

int tpr_proc_status_code(int st) {
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return -WTERMSIG(st);
  return -1;
}

int tpr_proc_wait(const tpr_proc *p) {
  int st;
  while (waitpid(p->pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return tpr_proc_status_code(st);
}

// true once p has exited (*code its status code).
static bool exited(const tpr_proc *p, int *code) {
  int st;
  pid_t r = waitpid(p->pid, &st, WNOHANG);
  if (r == p->pid) *code = tpr_proc_status_code(st);
  else if (r < 0) *code = -1;  // not our child any more: nothing to wait for
  return r != 0;
}

tpr_port_wait tpr_proc_wait_port_file(const tpr_proc *p, const char *port_file, double timeout_s, int *port,
                                      int *code) {
  double deadline = tpr_cli_now() + timeout_s;
  for (;;) {
    FILE *f = fopen(port_file, "r");
    char line[32] = "";
    if (f) {
      if (!fgets(line, sizeof line, f)) line[0] = 0;
      fclose(f);
    }
    int v;
    char nl = 0;
    // The newline comes last: a file caught half-written is read again.
    if (sscanf(line, "%d%c", &v, &nl) == 2 && nl == '\n' && v > 0 && v < 65536) {
      *port = v;
      return TPR_PORT_READY;
    }
    if (exited(p, code)) return TPR_PORT_EXITED;
    if (tpr_cli_now() > deadline) return TPR_PORT_TIMEOUT;
    sleep_ms(POLL_MS);
  }
}

// The processes whose parent is `parent` (/proc/PID/stat's fourth field;
// the command name before it is in parentheses and may hold spaces).
static int children_of(pid_t parent, pid_t *out, int max) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d)) && n < max) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 0) continue;
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    size_t len = f ? fread(stat, 1, sizeof stat - 1, f) : 0;
    if (f) fclose(f);
    stat[len] = 0;
    char *paren = strrchr(stat, ')'), state;
    int ppid;
    if (paren && sscanf(paren + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) out[n++] = (pid_t)pid;
  }
  if (d) closedir(d);
  return n;
}

// SIGTERM (or SIGKILL) to the server: its ranks under mpirun, else itself.
static int signal_server(const tpr_proc *p, int sig) {
  pid_t ranks[1024];
  int n = p->mpirun ? children_of(p->pid, ranks, 1024) : 0;
  for (int i = 0; i < n; i++) kill(ranks[i], sig);
  if (n == 0 || sig == SIGKILL) kill(p->pid, sig);  // no ranks left: mpirun itself
  return n ? n : 1;
}

tpr_proc_stop tpr_proc_stop_server(const tpr_proc *p, double timeout_s) {
  tpr_proc_stop s = {.code = -1};
  s.signalled = signal_server(p, SIGTERM);
  double deadline = tpr_cli_now() + timeout_s;
  while (!exited(p, &s.code)) {
    if (tpr_cli_now() > deadline) {
      signal_server(p, SIGKILL);
      s.killed = true;
      s.code = tpr_proc_wait(p);
      break;
    }
    sleep_ms(POLL_MS);
  }
  return s;
}

void tpr_proc_print_tail(const char *path, int lines) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "    (no log: %s)\n", path);
    return;
  }
  // The tail of the last 16 KiB is enough for the lines an error needs.
  char buf[16384];
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  long from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
  fseek(f, from, SEEK_SET);
  size_t len = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[len] = 0;
  if (len && buf[len - 1] == '\n') buf[--len] = 0;
  char *start = buf + len;
  for (int k = 0; start > buf && k < lines;)
    if (*--start == '\n' && ++k == lines) start++;
  if (!*start) fprintf(stderr, "    (the log is empty)\n");
  for (char *line = strtok(start, "\n"); line; line = strtok(NULL, "\n")) fprintf(stderr, "    %s\n", line);
}
