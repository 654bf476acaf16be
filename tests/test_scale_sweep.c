// A real sweep: tpr scale run at np 1, 2, 4 on the tiny MiniMax-M2 config
// (tp = np, one run per mesh, a few training steps), its results.jsonl
// checked against the schema line by line, then tpr scale model --calibrate
// on it; a corrupted line must make the calibration refuse the file.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "scale/results.h"
#include "test_util.h"

static void test_sweep_np124(void **state) {
  char tpr[4096], configs[4096], config[4200], tmp[] = "/tmp/tpr_scale_sweep.XXXXXX";
  if (tt_tpr_path(tpr, sizeof tpr, "test_scale_sweep")) fail();
  tt_configs_dir(configs, sizeof configs);
  snprintf(config, sizeof config, "%s/minimax_m2_tiny.json", configs);
  assert_non_null(mkdtemp(tmp));
  const char *out = tt_path(tmp, "sweep");
  const char *args[] = {"scale", "run", "--config", config, "--np", "1,2,4", "--repeats", "1", "--max-repeats", "1",
                        "--steps", "3", "--comm-max-bytes", "1M", "--mpirun", TPR_MPIEXEC, "--out", out, NULL};
  run_result r = tt_run_tpr(tpr, tmp, args);
  printf("%s", r.out);
  if (r.code) printf("stderr: %s\n", r.err);
  assert_int_equal(r.code, 0);
  tt_run_done(&r);
  char *text = tt_slurp(tt_path(out, "results.jsonl"), NULL);
  int nps[3], n = 0;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    cJSON *j = cJSON_Parse(line);
    assert_non_null(j);
    tpr_scale_point p;
    TT_OK(tpr_scale_point_from_json(j, &p));
    printf("  np %d tp %d: %.3f ms/step, %.0f tokens/s, %.3f ms/step in all-reduces\n", p.mesh.world, p.mesh.tp,
           p.step_s * 1e3, p.tokens_per_s, p.coll_s[TPR_COLL_ALL_REDUCE] * 1e3);
    // Measured per collective kind (the trainer's op profile): at tp > 1
    // the step's tp all-reduces take time, and no more than the step.
    assert_true(p.has_coll);
    if (p.mesh.world > 1)
      assert_true(p.coll_s[TPR_COLL_ALL_REDUCE] > 0 && p.coll_s[TPR_COLL_ALL_REDUCE] < p.step_s);
    assert_true(n < 3);
    nps[n++] = p.mesh.world;
    assert_int_equal(p.mesh.tp, p.mesh.world);
    assert_true(p.step_s > 0 && p.step_s < 10);
    cJSON_Delete(j);
  }
  free(text);
  assert_int_equal(n, 3);
  assert_true(nps[0] == 1 && nps[1] == 2 && nps[2] == 4);
  assert_int_equal(access(tt_path(out, "comm_np2.jsonl"), R_OK), 0);
  assert_int_equal(access(tt_path(out, "comm_np4.jsonl"), R_OK), 0);
  const char *cal[] = {"scale", "model", "--calibrate", out, NULL};
  r = tt_run_tpr(tpr, tmp, cal);
  printf("%s", r.out);
  assert_int_equal(r.code, 0);
  assert_non_null(strstr(r.out, "not used for calibration"));
  tt_run_done(&r);
  assert_int_equal(access(tt_path(out, "model.json"), R_OK), 0);
  char *pred = tt_slurp(tt_path(out, "predictions.jsonl"), NULL);
  assert_non_null(pred);
  assert_non_null(strstr(pred, "\"measured_collective_s\":{\"all_reduce\":"));
  free(pred);
  // Negative control: a line whose mesh is inconsistent is refused, by line.
  FILE *f = fopen(tt_path(out, "results.jsonl"), "a");
  assert_non_null(f);
  fprintf(f, "{\"schema\":\"tpr.scale.v1\",\"np\":3}\n");
  fclose(f);
  r = tt_run_tpr(tpr, tmp, cal);
  printf("  corrupted line: exit %d, %s", r.code, r.err);
  assert_int_equal(r.code, 1);
  assert_non_null(strstr(r.err, "results.jsonl:4"));
  tt_run_done(&r);
  char cmd[8300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_sweep_np124)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
