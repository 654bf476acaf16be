// docs/fine-tune.md's walkthrough, run as written: the shell block between
// its <!-- walkthrough --> markers (tpr data prepare --chat, mpirun -np 2
// tpr train --sft --pack, tpr serve and a chat request) on the demo model
// and docs/examples/colours.jsonl, in a temporary directory. The served
// answer must be the reply it was trained on, the checkpoint must carry the
// tokenizer, and the training loss must have fallen; the control: the demo
// model before fine-tuning does not give that answer to the same prompt.
#include "test_util.h"
#include "cli_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tpr_path[4096], tmp_dir[] = "/tmp/tpr_test_walkthrough_XXXXXX";

#define DOC TPR_SOURCE "/docs/fine-tune.md"
#define MODEL TPR_SOURCE "/tests/fixtures/demo_model"
#define ANSWER "\"content\":\"The grass is green.\""

// The shell block of the walkthrough, malloc'ed.
static char *walkthrough_block(void) {
  char *doc = tt_slurp(DOC, NULL);
  const char *begin = strstr(doc, "<!-- walkthrough -->\n```sh\n"), *end = strstr(doc, "```\n<!-- /walkthrough -->");
  if (!begin || !end || end < begin) fail_msg("%s: no ```sh block between the walkthrough markers", DOC);
  begin += strlen("<!-- walkthrough -->\n```sh\n");
  char *block = strndup(begin, (size_t)(end - begin));
  free(doc);
  return block;
}

static void test_walkthrough(void **state) {
  char *block = walkthrough_block();
  char script[4200], out[4200], dir[4096], cmd[20000];
  snprintf(script, sizeof script, "%s/walkthrough.sh", tmp_dir);
  snprintf(out, sizeof out, "%s/colours", tmp_dir);
  tt_spit(script, block, strlen(block));
  free(block);
  snprintf(dir, sizeof dir, "%s", tpr_path);
  *strrchr(dir, '/') = '\0';
  // The block's own PATH entry ($PWD/build/bin) does not exist in tmp_dir:
  // the tpr under test comes first.
  setenv("MODEL", MODEL, 1);
  setenv("CHATS", TPR_SOURCE "/docs/examples/colours.jsonl", 1);
  setenv("OUT", out, 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
  // The block runs mpirun: Open MPI's components leak what LeakSanitizer
  // cannot attribute (as for every mpirun test), so leak checking is off for
  // the whole block (tpr data prepare and tpr serve are leak-checked by
  // their own tests).
  setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
  snprintf(cmd, sizeof cmd, "cd '%s' && PATH='%s':\"$PATH\" exec bash -euo pipefail '%s'", tmp_dir, dir, script);
  run_result r = tt_run("/bin/bash", tmp_dir, (const char *const[]){"-c", cmd, NULL}, &(tt_run_opts){.timeout_s = 600});
  if (r.code != 0) {
    printf("stdout:\n%s\nstderr:\n%s\n", r.out, r.err);  // whole: fail_msg cuts long messages
    fail_msg("the walkthrough exited %d", r.code);
  }
  printf("%s", strstr(r.out, "step    60/60") ? strstr(r.out, "step    60/60") : r.out);
  if (!strstr(r.out, ANSWER) || !strstr(r.out, "\"finish_reason\":\"stop\""))
    fail_msg("the served answer is not the trained reply:\n%s", r.out);
  double first = 0, last = 0;
  const char *s1 = strstr(r.out, "step     1/60  loss "), *s60 = strstr(r.out, "step    60/60  loss ");
  assert_non_null(s1);
  assert_non_null(s60);
  first = strtod(s1 + strlen("step     1/60  loss "), NULL);
  last = strtod(s60 + strlen("step    60/60  loss "), NULL);
  printf("  loss %.4f -> %.4f\n", first, last);
  assert_true(first > 1.0 && last < 0.1);
  assert_non_null(strstr(r.out, "eval after step 60"));
  tt_run_done(&r);
  char tok[4300];
  snprintf(tok, sizeof tok, "%s/colours-model/tokenizer.json", out);
  assert_int_equal(access(tok, R_OK), 0);
  // The control: the model before fine-tuning, the same prompt, greedy.
  r = tt_run_tpr(tpr_path, tmp_dir,
                 (const char *const[]){"run", "--model", MODEL, "--prompt",
                                       "<|im_start|>user\nWhat colour is the grass?<|im_end|>\n<|im_start|>assistant\n",
                                       "--max-new-tokens", "8", NULL});
  if (r.code != 0) fail_msg("tpr run on the demo model: exit %d\n%s", r.code, r.err);
  assert_null(strstr(r.out, "The grass is green."));
  tt_run_done(&r);
}

static int setup(void **state) {
  if (!mkdtemp(tmp_dir) || tt_tpr_path(tpr_path, sizeof tpr_path, "test_finetune_walkthrough") != 0) return -1;
  if (access("/usr/bin/curl", X_OK) != 0) {
    fprintf(stderr, "test_finetune_walkthrough: curl is missing (scripts/setup.sh installs it)\n");
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_walkthrough)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
