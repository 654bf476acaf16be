#include "runtime/progress.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static bool enabled;
static FILE *target;  // NULL: stderr

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static FILE *out_file(void) { return target ? target : stderr; }

// Under mpirun a rank's stderr is a pipe to mpirun (and its stdout a pty
// whether or not mpirun's own is a terminal), so what counts is mpirun's
// stderr: the launching ancestor's fd 2, read from /proc. Ranks started on
// another node find no such ancestor and draw nothing.
static bool launcher_on_terminal(void) {
  if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK")) return false;
  long pid = (long)getppid();
  for (int depth = 0; depth < 6 && pid > 1; depth++) {
    char path[64], comm[64] = "", link[256];
    snprintf(path, sizeof path, "/proc/%ld/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool got = fgets(comm, sizeof comm, f) != NULL;
    fclose(f);
    if (!got) return false;
    comm[strcspn(comm, "\n")] = '\0';
    if (!strcmp(comm, "mpirun") || !strcmp(comm, "mpiexec") || !strcmp(comm, "orterun") || !strcmp(comm, "prterun")) {
      snprintf(path, sizeof path, "/proc/%ld/fd/2", pid);
      ssize_t n = readlink(path, link, sizeof link - 1);
      if (n <= 0) return false;
      link[n] = '\0';
      return !strncmp(link, "/dev/pts/", 9) || !strncmp(link, "/dev/tty", 8);
    }
    // The next ancestor: field 4 of /proc/PID/stat, after the ")" closing the name.
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    f = fopen(path, "r");
    if (!f) return false;
    char stat[512];
    size_t len = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[len] = '\0';
    const char *close = strrchr(stat, ')');
    if (!close || sscanf(close + 1, " %*c %ld", &pid) != 1) return false;
  }
  return false;
}

bool tpr_progress_terminal(void) {
  const char *term = getenv("TERM"), *env = getenv("TPR_PROGRESS");
  if (env && strcmp(env, "0") == 0) return false;
  if (env && strcmp(env, "1") == 0) return true;
  if (term && strcmp(term, "dumb") == 0) return false;
  return isatty(STDERR_FILENO) || launcher_on_terminal();
}

void tpr_progress_enable(bool on, FILE *out) { enabled = on, target = out; }
bool tpr_progress_enabled(void) { return enabled; }

void tpr_progress_begin(tpr_progress *p, const char *what, uint64_t total, const char *unit) {
  memset(p, 0, sizeof *p);
  p->on = enabled;
  snprintf(p->what, sizeof p->what, "%s", what);
  snprintf(p->unit, sizeof p->unit, "%s", unit ? unit : "");
  p->total = total;
  p->t0 = now_s();
  p->last_draw = -1;
  tpr_progress_update(p, 0, NULL);
}

// "1.19 GiB"-style: the unit chosen by the larger of the two figures, so
// "0.40/2.90 GiB" reads as one scale.
static const char *byte_scale(uint64_t v, double *div) {
  static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int k = 0;
  *div = 1;
  while (k < 4 && (double)v >= *div * 1024) *div *= 1024, k++;
  return names[k];
}

static void put_duration(char *buf, size_t cap, double s) {
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

// Appends to line (cap bytes, *n used), truncating at the end.
__attribute__((format(printf, 4, 5))) static void add(char *line, size_t cap, size_t *n, const char *fmt, ...) {
  if (*n >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(line + *n, cap - *n, fmt, ap);
  va_end(ap);
  if (k > 0) *n += (size_t)k;
}

void tpr_progress_format(const tpr_progress *p, double now, int width, char *buf, size_t cap) {
  char line[512], part[128];
  size_t n = 0;
#define ADD(...) add(line, sizeof line, &n, __VA_ARGS__)
  ADD("%s", p->what);
  double elapsed = now - p->t0;
  if (p->total > 0) {
    uint64_t done = p->done < p->total ? p->done : p->total;
    int filled = (int)(20 * done / p->total);
    ADD("  [");
    for (int i = 0; i < 20; i++) ADD("%c", i < filled ? '#' : '-');
    ADD("] %3d%%", (int)(100 * done / p->total));
  }
  if (!p->unit[0]) {
    double div;
    const char *u = byte_scale(p->total > p->done ? p->total : p->done, &div);
    if (p->total > 0)
      ADD("  %.2f/%.2f %s", (double)p->done / div, (double)p->total / div, u);
    else
      ADD("  %.2f %s", (double)p->done / div, u);
    if (elapsed > 0.05 && p->done > 0) {
      double rate = (double)p->done / elapsed;
      const char *ru = byte_scale((uint64_t)rate, &div);
      ADD("  %.0f %s/s", rate / div, ru);
    }
  } else if (p->total > 0) {
    ADD("  %llu/%llu %s", (unsigned long long)p->done, (unsigned long long)p->total, p->unit);
  } else {
    ADD("  %llu %s", (unsigned long long)p->done, p->unit);
  }
  if (p->note[0]) ADD("  %s", p->note);
  if (p->total > 0 && p->done > 0 && p->done < p->total && elapsed > 0) {
    put_duration(part, sizeof part, elapsed * (double)(p->total - p->done) / (double)p->done);
    ADD("  ETA %s", part);
  } else {
    put_duration(part, sizeof part, elapsed);
    ADD("  %s", part);
  }
#undef ADD
  size_t len = strlen(line), limit = width > 1 ? (size_t)width - 1 : 0;  // the last column would wrap
  if (len > limit) len = limit;
  if (len >= cap) len = cap ? cap - 1 : 0;
  if (cap) memcpy(buf, line, len), buf[len] = '\0';
}

static int terminal_width(FILE *f) {
  struct winsize ws;
  if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 100;
}

void tpr_progress_update(tpr_progress *p, uint64_t done, const char *note) {
  if (!p->on) return;
  p->done = done;
  if (note) snprintf(p->note, sizeof p->note, "%s", note);
  double t = now_s();
  bool complete = p->total > 0 && done >= p->total;
  if (p->last_draw >= 0 && t - p->last_draw < 0.1 && !complete) return;
  p->last_draw = t;
  FILE *f = out_file();
  char line[512];
  tpr_progress_format(p, t, terminal_width(f), line, sizeof line);
  fprintf(f, "\r\033[K%s", line);  // back to the line's start, erase it, draw
  fflush(f);
  p->drawn = true;
}

void tpr_progress_clear(tpr_progress *p) {
  if (!p->on || !p->drawn) return;
  FILE *f = out_file();
  fputs("\r\033[K", f);
  fflush(f);
  p->drawn = false;
  p->last_draw = -1;  // the next update draws at once
}

void tpr_progress_end(tpr_progress *p) {
  tpr_progress_clear(p);
  p->on = false;
}
