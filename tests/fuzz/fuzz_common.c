#include "fuzz_common.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char scratch[256];

static void rm_tree(const char *path) {
  DIR *d = opendir(path);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char p[1024];
      snprintf(p, sizeof p, "%s/%s", path, e->d_name);
      rm_tree(p);
    }
    closedir(d);
    rmdir(path);
  } else {
    unlink(path);
  }
}

static void cleanup(void) {
  if (scratch[0]) rm_tree(scratch);
}

const char *fz_dir(void) {
  if (!scratch[0]) {
    struct stat st;
    const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(scratch, sizeof scratch, "%s/tpr_fuzz_XXXXXX", base);
    if (!mkdtemp(scratch)) {
      perror("fuzz: mkdtemp");
      abort();
    }
    atexit(cleanup);
  }
  return scratch;
}

const char *fz_write(const char *name, const uint8_t *data, size_t size) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", fz_dir(), name);
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) {
    perror("fuzz: writing the input");
    abort();
  }
  return path;
}

const char *fz_fixtures(void) { return TPR_FUZZ_FIXTURES; }

void fz_require(int ok, const char *what) {
  if (ok) return;
  fprintf(stderr, "fuzz: invariant broken: %s\n", what);
  abort();
}
