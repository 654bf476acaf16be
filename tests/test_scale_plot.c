// tpr scale plot on the committed sweep of the AMD EPYC (docs/scale/small): the
// four PNGs exist, are PNG files and are not trivially small (a plot with
// axes, titles and curves is tens of KB; an empty canvas a few KB). Skipped
// (77) when gnuplot is not installed (scripts/setup.sh installs gnuplot-nox).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_util.h"
#include "test_util.h"

static void test_plot_example(void **state) {
  char tpr[4096], configs[4096], tmp[] = "/tmp/tpr_scale_plot.XXXXXX", cmd[16384];
  if (tt_tpr_path(tpr, sizeof tpr, "test_scale_plot")) fail();
  tt_configs_dir(configs, sizeof configs);
  assert_non_null(mkdtemp(tmp));
  // A copy: plot writes DIR/plots/, and the source tree stays as committed.
  snprintf(cmd, sizeof cmd, "cp '%s/../docs/scale/small/results.jsonl' '%s/../docs/scale/small/predictions.jsonl' '%s/'",
           configs, configs, tmp);
  assert_int_equal(system(cmd), 0);
  const char *args[] = {"scale", "plot", tmp, NULL};
  run_result r = tt_run_tpr(tpr, tmp, args);
  printf("%s%s", r.out, r.err);
  assert_int_equal(r.code, 0);
  tt_run_done(&r);
  const char *pngs[] = {"scaling.png", "efficiency.png", "breakdown.png", "predicted.png"};
  for (int i = 0; i < 4; i++) {
    char path[8300];
    snprintf(path, sizeof path, "%s/plots/%s", tmp, pngs[i]);
    size_t len = 0;
    char *bytes = tt_slurp(path, &len);
    printf("  %-15s %zu bytes\n", pngs[i], len);
    assert_true(len > 15000);
    assert_memory_equal(bytes, "\x89PNG\r\n\x1a\n", 8);
    free(bytes);
  }
  // Negative control: a results file that breaks the schema makes no plots.
  snprintf(cmd, sizeof cmd, "echo '{\"schema\":\"tpr.scale.v1\"}' >> '%s/results.jsonl'", tmp);
  assert_int_equal(system(cmd), 0);
  r = tt_run_tpr(tpr, tmp, args);
  printf("  broken results: exit %d: %s", r.code, r.err);
  assert_int_equal(r.code, 1);
  tt_run_done(&r);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  if (system("gnuplot --version > /dev/null 2>&1") != 0) {
    printf("gnuplot not found: skipped (apt-get install gnuplot-nox)\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_plot_example)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
