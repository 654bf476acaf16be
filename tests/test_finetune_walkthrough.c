// docs/fine-tune.md's walkthrough, run as written: the shell block between
// its <!-- walkthrough --> markers (tpr data prepare --chat, mpirun -np 2
// tpr train --sft --pack, tpr serve and a chat request) on the demo model
// and docs/examples/colours.jsonl, in a temporary directory. The served
// answer must be the reply it was trained on, the checkpoint must carry the
// tokenizer, and the training loss must have fallen; the control: the demo
// model before fine-tuning does not give that answer to the same prompt.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tpr_path[4096], tmp_dir[] = "/tmp/tpr_test_walkthrough_XXXXXX";

#define DOC TPR_SOURCE "/docs/fine-tune.md"
#define MODEL TPR_SOURCE "/tests/fixtures/demo_model"
#define ANSWER "\"content\":\"The grass is green.\""

// The shell block between <!-- name --> and <!-- /name >, malloc'ed.
static char *walkthrough_block(const char *name) {
  char *doc = tt_slurp(DOC, NULL), open[64], close[64];
  snprintf(open, sizeof open, "<!-- %s -->\n```sh\n", name);
  snprintf(close, sizeof close, "```\n<!-- /%s -->", name);
  const char *begin = strstr(doc, open), *end = strstr(doc, close);
  if (!begin || !end || end < begin) fail_msg("%s: no ```sh block between the %s markers", DOC, name);
  begin += strlen(open);
  char *block = strndup(begin, (size_t)(end - begin));
  free(doc);
  return block;
}

// Runs the block `name` in tmp_dir with OUT=tmp_dir/out (and the caller's
// other variables set); its output (stdout) is the caller's to free.
static run_result run_block(const char *name, const char *out) {
  char *block = walkthrough_block(name);
  char script[4200], dir[4096], cmd[20000];
  snprintf(script, sizeof script, "%s/%s.sh", tmp_dir, name);
  tt_spit(script, block, strlen(block));
  free(block);
  snprintf(dir, sizeof dir, "%s", tpr_path);
  *strrchr(dir, '/') = '\0';
  // The block's own PATH entry ($PWD/build/bin) does not exist in tmp_dir:
  // the tpr under test comes first.
  setenv("MODEL", MODEL, 1);
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
    fail_msg("the %s block exited %d", name, r.code);
  }
  return r;
}

static void test_walkthrough(void **state) {
  char out[4200];
  snprintf(out, sizeof out, "%s/colours", tmp_dir);
  setenv("CHATS", TPR_SOURCE "/docs/examples/colours.jsonl", 1);
  run_result r = run_block("walkthrough", out);
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

// The tool-call walkthrough: conversations with tools and tool_calls,
// fine-tuned, served; the answer must be a tool call parsed from the
// model's own tokens: finish_reason "tool_calls", get_weather, and
// arguments a JSON object naming one of the trained cities. The control:
// the demo model with the same template, asked the same, calls no tool.
static void test_tools_walkthrough(void **state) {
  (void)state;
  char out[4200];
  snprintf(out, sizeof out, "%s/weather", tmp_dir);
  setenv("TEMPLATE", TPR_FIXTURES "/chat_templates/templates/Qwen-Qwen2.5-7B-Instruct.jinja", 1);
  setenv("EXAMPLES", TPR_SOURCE "/docs/examples", 1);
  run_result r = run_block("tools-walkthrough", out);
  const char *body = strstr(r.out, "{\"id\":\"chatcmpl-");
  if (!body) fail_msg("no chat completion in the output:\n%s", r.out);
  printf("%s\n", body);
  cJSON *j = cJSON_Parse(body);
  if (!j) fail_msg("the answer is not one JSON object:\n%s", body);
  const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
  const cJSON *msg = cJSON_GetObjectItem(choice, "message");
  assert_string_equal(cJSON_GetObjectItem(choice, "finish_reason")->valuestring, "tool_calls");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")));
  const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
  const cJSON *fn = cJSON_GetObjectItem(call, "function");
  assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, "get_weather");
  assert_true(!strncmp(cJSON_GetObjectItem(call, "id")->valuestring, "call_", 5));
  cJSON *args = cJSON_Parse(cJSON_GetObjectItem(fn, "arguments")->valuestring);
  const cJSON *city = cJSON_GetObjectItem(args, "city");
  assert_true(cJSON_IsObject(args) && cJSON_IsString(city) && cJSON_GetArraySize(args) == 1);
  static const char *const cities[] = {"Tokyo", "Oslo", "Lima", "Cairo", "London", "Vienna",
                                       "Dublin", "Athens", "Boston", "Denver", "Austin"};
  bool known = false;
  for (size_t i = 0; i < sizeof cities / sizeof cities[0]; i++) known |= !strcmp(city->valuestring, cities[i]);
  assert_true(known);
  cJSON_Delete(args);
  cJSON_Delete(j);
  tt_run_done(&r);
  // The control: the base model (same template) renders the same prompt and answers with no call.
  char base[4300], prompt[4400];
  snprintf(base, sizeof base, "%s/base", out);
  snprintf(prompt, sizeof prompt, "%s/prompt.txt", tmp_dir);
  r = tt_run_tpr(tpr_path, tmp_dir,
                 (const char *const[]){"chat-template", "--model", base, "--messages", TPR_SOURCE
                                       "/tests/fixtures/tools_walkthrough_messages.json", "--tools",
                                       TPR_SOURCE "/docs/examples/weather_tools.json", "--add-generation-prompt", NULL});
  if (r.code != 0) fail_msg("tpr chat-template: exit %d\n%s", r.code, r.err);
  tt_spit(prompt, r.out, strlen(r.out));
  tt_run_done(&r);
  r = tt_run_tpr(tpr_path, tmp_dir,
                 (const char *const[]){"run", "--model", base, "--prompt-file", prompt, "--max-new-tokens", "48", NULL});
  if (r.code != 0) fail_msg("tpr run on the base model: exit %d\n%s", r.code, r.err);
  assert_null(strstr(r.out, "get_weather"));
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
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_walkthrough), cmocka_unit_test(test_tools_walkthrough)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
