// Replays one fuzz target's entry point over files: every file named, and
// every regular file (not dotfiles) of every directory named, in name order.
// Built with gcc in the normal build and run by ctest over the committed
// corpus and regressions, so every finding stays fixed (also under
// TPR_SANITIZE). Exit 0 when all ran; a finding aborts like in the fuzzer.
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return 1;
  }
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap && !(buf = realloc(buf, cap = cap ? 2 * cap : 4096))) abort();
    size_t got = fread(buf + len, 1, cap - len, f);
    if (!got) break;
    len += got;
  }
  fclose(f);
  // libFuzzer hands the target a buffer of exactly `size` bytes: copy so
  // ASan sees an overread past the end here too.
  uint8_t *exact = malloc(len ? len : 1);
  if (!exact) abort();
  memcpy(exact, buf, len);
  free(buf);
  LLVMFuzzerTestOneInput(exact, len);
  free(exact);
  return 0;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
  int files = 0, bad = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s does not exist\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      bad += run_file(argv[i]), files++;
      continue;
    }
    DIR *d = opendir(argv[i]);
    if (!d) return 1;
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      if (!(names = realloc(names, (n + 1) * sizeof *names)) || !(names[n++] = strdup(e->d_name))) abort();
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp);
    for (size_t k = 0; k < n; k++) {
      char p[4096];
      snprintf(p, sizeof p, "%s/%s", argv[i], names[k]);
      if (stat(p, &st) == 0 && S_ISREG(st.st_mode) && strcmp(names[k], "README")) bad += run_file(p), files++;
      free(names[k]);
    }
    free(names);
  }
  printf("replay: %d inputs ran clean\n", files - bad);
  return bad ? 1 : 0;
}
