#include <cblas.h>
#include <stdio.h>

#include "launch/commands.h"

int tpr_cmd_version(int argc, char **argv) {
#ifdef TPR_HAVE_CUDA
  const char *cuda = "on";
#else
  const char *cuda = "off";
#endif
  printf("tpr %s (cuda backend: %s; openblas: %s)\n", TPR_VERSION, cuda, openblas_get_config());
  return 0;
}
