#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int log_rank = -1;
static int log_level = -1;  // -1: not read from the environment yet

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

static int level_from_env(void) {
  const char *s = getenv("TPR_LOG_LEVEL");
  if (!s || !*s) return TPR_LOG_WARN;
  for (int i = 0; i <= TPR_LOG_TRACE; i++)
    if (strcasecmp(s, level_names[i]) == 0) return i;
  if (strcasecmp(s, "warning") == 0) return TPR_LOG_WARN;
  if (s[0] >= '0' && s[0] <= '4' && s[1] == '\0') return s[0] - '0';
  fprintf(stderr, "[tpr WARN] TPR_LOG_LEVEL=%s not understood; using warn\n", s);
  return TPR_LOG_WARN;
}

void tpr_log_set_rank(int rank) { log_rank = rank; }
void tpr_log_set_level(tpr_log_level level) { log_level = (int)level; }

tpr_log_level tpr_log_get_level(void) {
  if (log_level < 0) log_level = level_from_env();
  return (tpr_log_level)log_level;
}

void tpr_log(tpr_log_level level, const char *fmt, ...) {
  if ((int)level > (int)tpr_log_get_level()) return;
  if ((int)level < TPR_LOG_ERROR) level = TPR_LOG_ERROR;
  char line[4096];
  int n = log_rank >= 0
              ? snprintf(line, sizeof line, "[tpr r%d %s] ", log_rank, level_names[level])
              : snprintf(line, sizeof line, "[tpr %s] ", level_names[level]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  // One fputs per line so lines from ranks sharing a terminal do not interleave mid-line.
  size_t len = strlen(line);
  if (len + 1 >= sizeof line) len = sizeof line - 2;  // cut an over-long message so its newline still fits
  if (len == 0 || line[len - 1] != '\n') {
    line[len] = '\n';
    line[len + 1] = '\0';
  }
  fputs(line, stderr);
}
