// Parity of tpr's Jinja interpreter (jinja/) with transformers' rendering
// (jinja2 as apply_chat_template drives it) on real published chat templates:
// tests/fixtures/chat_templates/ (scripts/reference/make_chat_template_fixture.py)
// holds 51 published templates (llama.cpp's models/templates and
// scripts/reference/chat_templates: the families tpr runs — MiniMax-M1/M2/M3,
// Qwen3 and Qwen3-MoE, Qwen2-VL/2.5-VL, Qwen3-VL, Hunyuan Hy3, MiniCPM — and
// Llama 3.x, Qwen2.5/QwQ/Qwen3-Coder/Qwen3.5, DeepSeek R1/V3.1/V3.2/V4, GLM,
// Mistral, Gemma, Phi, Granite, Command-R, Hermes, Kimi, gpt-oss, Functionary,
// Nemotron, Seed-OSS, SmolLM3, LFM2, Solar, Ling, RWKV) and 1,641 renders of
// them over 9 conversations with and without tools and documents, generation
// prompt and enable_thinking. Every render must be byte-identical,
// every raise_exception the same message, every other Python failure a
// failure here too. The negative controls render the same cases with
// trim_blocks-like and tojson-separator mistakes injected into the
// templates' text and require the parity to break.
#include "test_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/chat.h"
#include "runtime/file_io.h"

#include <unistd.h>

static cJSON *fixture;

static char *read_file(const char *path) {
  uint8_t *b = NULL;
  size_t n = 0;
  if (tpr_file_read(path, &b, &n) != TPR_OK) fail_msg("cannot read %s: %s", path, tpr_last_error());
  char *s = malloc(n + 1);
  memcpy(s, b, n);
  s[n] = 0;
  free(b);
  return s;
}

static int setup(void **state) {
  (void)state;
  setenv("SOURCE_DATE_EPOCH", "1721952000", 1);  // the fixture's strftime_now
  char *s = read_file(TPR_FIXTURES "/chat_templates/cases.json");
  fixture = cJSON_Parse(s);
  free(s);
  return fixture ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  cJSON_Delete(fixture);
  return 0;
}

typedef struct outcome {
  int ok, bad;
  char first_bad[1200];
} outcome;

// Renders every case of `only` (NULL: all) with the template text passed
// through mutate (NULL: as published); counts matches per template.
static int run_cases(const char *only, char *(*mutate)(const char *), outcome *per, int max_templates,
                     const char **names, int *n_names) {
  const cJSON *convs = cJSON_GetObjectItem(fixture, "conversations");
  const char *tools = cJSON_GetObjectItem(fixture, "tools")->valuestring;
  const cJSON *special = cJSON_GetObjectItem(fixture, "special");
  const cJSON *cs;
  int total_bad = 0;
  char *cached_name = NULL;
  tpr_chat_jinja cj = {0};
  bool loaded = false;
  tpr_jinja_error perr = {0};
  tpr_status prc = TPR_OK;
  cJSON_ArrayForEach(cs, cJSON_GetObjectItem(fixture, "cases")) {
    const char *tn = cJSON_GetObjectItem(cs, "template")->valuestring;
    if (only && strcmp(only, tn) != 0) continue;
    int ti = 0;
    while (ti < *n_names && strcmp(names[ti], tn) != 0) ti++;
    if (ti == *n_names) {
      assert_true(ti < max_templates);
      names[(*n_names)++] = tn;
      memset(&per[ti], 0, sizeof per[ti]);
    }
    if (!cached_name || strcmp(cached_name, tn) != 0) {
      if (loaded) tpr_chat_jinja_free(&cj);
      free(cached_name);
      cached_name = strdup(tn);
      char path[4096];
      snprintf(path, sizeof path, TPR_FIXTURES "/chat_templates/templates/%s.jinja", tn);
      char *text = read_file(path);
      if (mutate) {
        char *m = mutate(text);
        free(text);
        text = m;
      }
      prc = tpr_chat_jinja_from_text(text, strlen(text), &cj, &perr);
      loaded = prc == TPR_OK;
      free(text);
      const cJSON *sp = cJSON_GetObjectItem(special, tn);
      for (int i = 0; loaded && i < TPR_CHAT_SPECIAL_TOKENS; i++) {
        const cJSON *v = cJSON_GetObjectItem(sp, tpr_chat_special_names[i]);
        if (cJSON_IsString(v)) cj.special[i] = strdup(v->valuestring);
      }
    }
    const cJSON *exp = cJSON_GetObjectItem(cs, "expected"), *raise = cJSON_GetObjectItem(cs, "raise");
    tpr_chat_inputs in = {
        .messages_json = cJSON_GetObjectItem(convs, cJSON_GetObjectItem(cs, "conversation")->valuestring)->valuestring,
        .tools_json = cJSON_IsTrue(cJSON_GetObjectItem(cs, "tools")) ? tools : NULL,
        .documents_json = cJSON_IsTrue(cJSON_GetObjectItem(cs, "documents"))
                              ? cJSON_GetObjectItem(fixture, "documents")->valuestring
                              : NULL,
        .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(cs, "add_generation_prompt")),
        .kwargs_json = cJSON_GetObjectItem(cs, "kwargs")->valuestring};
    char *out = NULL;
    size_t len = 0;
    tpr_jinja_error err = {0};
    tpr_status rc = loaded ? tpr_chat_jinja_render(&cj, &in, NULL, &out, &len, &err) : prc;
    if (!loaded) err = perr;
    bool ok;
    if (exp) ok = rc == TPR_OK && len == strlen(exp->valuestring) && memcmp(out, exp->valuestring, len) == 0;
    else if (raise) ok = rc != TPR_OK && err.raised && strcmp(err.message, raise->valuestring) == 0;
    else ok = rc != TPR_OK;  // Python failed (TypeError, UndefinedError, ...): so must tpr
    tpr_clear_error();
    if (ok) {
      per[ti].ok++;
    } else {
      per[ti].bad++;
      total_bad++;
      if (!per[ti].first_bad[0]) {
        size_t at = 0;
        if (exp && out)
          while (at < len && exp->valuestring[at] && out[at] == exp->valuestring[at]) at++;
        snprintf(per[ti].first_bad, sizeof per[ti].first_bad,
                 "conv %s tools %d gen %d kwargs %s: %s | at byte %zu: want '%.60s' got '%.60s'",
                 cJSON_GetObjectItem(cs, "conversation")->valuestring, in.tools_json != NULL,
                 in.add_generation_prompt, in.kwargs_json,
                 rc == TPR_OK ? (exp ? "different text" : "rendered where Python failed") : err.message, at,
                 exp ? exp->valuestring + at : (raise ? raise->valuestring : "(a failure)"), out ? out + at : "");
      }
    }
    free(out);
  }
  if (loaded) tpr_chat_jinja_free(&cj);
  free(cached_name);
  return total_bad;
}

static void test_parity(void **state) {
  (void)state;
  outcome per[64];
  const char *names[64];
  int n = 0;
  int bad = run_cases(NULL, NULL, per, 64, names, &n);
  printf("| template | cases | byte-identical |\n|---|---|---|\n");
  for (int i = 0; i < n; i++) printf("| %s | %d | %d |\n", names[i], per[i].ok + per[i].bad, per[i].ok);
  for (int i = 0; i < n; i++)
    if (per[i].bad) printf("FAIL %s: %s\n", names[i], per[i].first_bad);
  assert_true(n >= 20);
  assert_int_equal(bad, 0);
}

// --- negative controls: a mistake injected into the templates must break parity ---
// trim_blocks off: a newline after every '%}' (what trim_blocks removes).
static char *no_trim(const char *s) {
  size_t n = strlen(s);
  char *o = malloc(2 * n + 1), *p = o;
  for (size_t i = 0; i < n; i++) {
    *p++ = s[i];
    if (i > 0 && s[i] == '}' && s[i - 1] == '%' && (i < 2 || s[i - 2] != '-')) *p++ = '\n';
  }
  *p = 0;
  return o;
}

// tojson with the compact separators json.dumps does not use by default.
static char *compact_json(const char *s) {
  const char *pat = "tojson";
  size_t n = strlen(s), k = 0;
  char *o = malloc(4 * n + 1), *p = o;
  for (size_t i = 0; i < n;) {
    if (strncmp(s + i, pat, 6) == 0 && s[i + 6] != '(') {
      p += sprintf(p, "tojson(separators=(',', ':'))");
      i += 6;
      k++;
    } else {
      *p++ = s[i++];
    }
  }
  *p = 0;
  return o;
}

static void test_negative_controls(void **state) {
  (void)state;
  outcome per[64];
  const char *names[64];
  int n = 0;
  // trim_blocks (a newline kept after each %}); Qwen2.5 prints its tools with tojson.
  int bad_trim = run_cases(NULL, no_trim, per, 64, names, &n);
  int broken = 0, total = 0;
  for (int i = 0; i < n; i++) broken += per[i].bad > 0, total += per[i].ok + per[i].bad;
  printf("without trim_blocks: %d of %d renders differ, in %d of %d templates\n", bad_trim, total, broken, n);
  assert_true(broken >= 1 && bad_trim >= 10);  // most published templates control whitespace by hand
  n = 0;
  int bad_json = run_cases("Qwen-Qwen2.5-7B-Instruct", compact_json, per, 64, names, &n);
  printf("tojson with compact separators: %d of Qwen2.5's %d renders differ\n", bad_json, per[0].ok + per[0].bad);
  assert_true(bad_json >= 4);  // every render with tools
  n = 0;
  int good = run_cases("Qwen-Qwen2.5-7B-Instruct", NULL, per, 64, names, &n);
  assert_int_equal(good, 0);
}

// The case of the fixture for (template, conversation, tools, gen, kwargs).
static const cJSON *find_case(const char *tn, const char *conv, bool tools, bool gen) {
  const cJSON *cs;
  cJSON_ArrayForEach(cs, cJSON_GetObjectItem(fixture, "cases")) {
    if (!strcmp(cJSON_GetObjectItem(cs, "template")->valuestring, tn) &&
        !strcmp(cJSON_GetObjectItem(cs, "conversation")->valuestring, conv) &&
        cJSON_IsTrue(cJSON_GetObjectItem(cs, "tools")) == tools &&
        cJSON_IsTrue(cJSON_GetObjectItem(cs, "add_generation_prompt")) == gen &&
        !cJSON_IsTrue(cJSON_GetObjectItem(cs, "documents")) &&
        !strcmp(cJSON_GetObjectItem(cs, "kwargs")->valuestring, "{}"))
      return cs;
  }
  fail_msg("no case %s/%s", tn, conv);
  return NULL;
}

// tpr chat-template on checkpoint directories: the template from
// tokenizer_config.json (a string, or a named list), chat_template.jinja
// first when both exist, the checkpoint's special tokens, --ids, --json, and
// a raise_exception exiting 1 with the template's message.
static void test_cli(void **state) {
  (void)state;
  char tpr[4096];
  if (tt_tpr_path(tpr, sizeof tpr, "test_jinja_templates") != 0) fail();
  char dir[] = "/tmp/tpr_chat_template_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char *qwen = read_file(TPR_FIXTURES "/chat_templates/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
  char *llama = read_file(TPR_FIXTURES "/chat_templates/templates/meta-llama-Llama-3.1-8B-Instruct.jinja");
  char *gemma = read_file(TPR_FIXTURES "/chat_templates/templates/google-gemma-2-2b-it.jinja");
  char *tokjson = read_file(TPR_FIXTURES "/tokenizer/bytelevel/tokenizer.json");
  const cJSON *convs = cJSON_GetObjectItem(fixture, "conversations");
  const char *user = cJSON_GetObjectItem(convs, "user")->valuestring;
  const char *sysm = cJSON_GetObjectItem(convs, "system_multi")->valuestring;
  tt_spit(tt_path(dir, "user.json"), user, strlen(user));
  tt_spit(tt_path(dir, "system.json"), sysm, strlen(sysm));
  const char *tools = cJSON_GetObjectItem(fixture, "tools")->valuestring;
  tt_spit(tt_path(dir, "tools.json"), tools, strlen(tools));
  tt_spit(tt_path(dir, "tokenizer.json"), tokjson, strlen(tokjson));
  // 1. tokenizer_config.json with the template as a string.
  cJSON *cfg = cJSON_CreateObject();
  cJSON_AddStringToObject(cfg, "chat_template", qwen);
  cJSON_AddStringToObject(cfg, "eos_token", "<|im_end|>");
  char *cfg_text = cJSON_Print(cfg);
  tt_spit(tt_path(dir, "tokenizer_config.json"), cfg_text, strlen(cfg_text));
  free(cfg_text);
  const char *a1[] = {"chat-template", "--model", dir, "--messages", tt_path(dir, "user.json"), "--tools",
                      tt_path(dir, "tools.json"), "--add-generation-prompt", NULL};
  run_result r = tt_run_tpr(tpr, dir, a1);
  assert_int_equal(r.code, 0);
  assert_string_equal(r.out, cJSON_GetObjectItem(find_case("Qwen-Qwen2.5-7B-Instruct", "user", true, true), "expected")->valuestring);
  tt_run_done(&r);
  // --json --ids: the prompt and its ids (encoded without added special tokens).
  const char *a2[] = {"chat-template", "--model", dir, "--messages", tt_path(dir, "user.json"), "--json", "--ids", NULL};
  cJSON *j = tt_json_of(tt_run_tpr(tpr, dir, a2));
  const char *want = cJSON_GetObjectItem(find_case("Qwen-Qwen2.5-7B-Instruct", "user", false, false), "expected")->valuestring;
  assert_string_equal(cJSON_GetObjectItem(j, "prompt")->valuestring, want);
  assert_true(tt_json_num(j, "count") > 5 && tt_json_num(j, "count") == cJSON_GetArraySize(cJSON_GetObjectItem(j, "ids")));
  cJSON_Delete(j);
  // 2. A named list: "default" without tools, "tool_use" with them.
  cJSON_DeleteItemFromObject(cfg, "chat_template");
  cJSON *list = cJSON_AddArrayToObject(cfg, "chat_template");
  cJSON *e1 = cJSON_CreateObject(), *e2 = cJSON_CreateObject();
  cJSON_AddStringToObject(e1, "name", "default");
  cJSON_AddStringToObject(e1, "template", llama);
  cJSON_AddStringToObject(e2, "name", "tool_use");
  cJSON_AddStringToObject(e2, "template", qwen);
  cJSON_AddItemToArray(list, e1);
  cJSON_AddItemToArray(list, e2);
  cJSON_ReplaceItemInObject(cfg, "eos_token", cJSON_CreateString("<|eot_id|>"));
  cJSON_AddStringToObject(cfg, "bos_token", "<|begin_of_text|>");
  cfg_text = cJSON_Print(cfg);
  tt_spit(tt_path(dir, "tokenizer_config.json"), cfg_text, strlen(cfg_text));
  free(cfg_text);
  const char *a3[] = {"chat-template", "--model", dir, "--messages", tt_path(dir, "system.json"), NULL};
  r = tt_run_tpr(tpr, dir, a3);
  assert_int_equal(r.code, 0);
  assert_string_equal(r.out, cJSON_GetObjectItem(find_case("meta-llama-Llama-3.1-8B-Instruct", "system_multi", false, false), "expected")->valuestring);
  tt_run_done(&r);
  // 3. chat_template.jinja wins over tokenizer_config.json; its raise exits 1 with the message.
  tt_spit(tt_path(dir, "chat_template.jinja"), gemma, strlen(gemma));
  r = tt_run_tpr(tpr, dir, a3);
  assert_int_equal(r.code, 1);
  assert_non_null(strstr(r.err, "System role not supported"));
  tt_run_done(&r);
  // 4. The demo model end to end: the ids transformers' apply_chat_template(
  // [{"role": "user", "content": "Hello"}], add_generation_prompt=True,
  // tokenize=True) gives for tests/fixtures/demo_model.
  const char *a6[] = {"chat-template", "--model", TPR_FIXTURES "/demo_model", "--add-generation-prompt", "--ids", "--json", NULL};
  j = tt_json_of(tt_run_tpr(tpr, dir, a6));
  const int want_ids[] = {1, 356, 201, 42, 323, 81, 2, 201, 1, 363, 201};
  const cJSON *ids = cJSON_GetObjectItem(j, "ids");
  assert_int_equal(cJSON_GetArraySize(ids), 11);
  for (int i = 0; i < 11; i++) assert_int_equal(cJSON_GetArrayItem(ids, i)->valueint, want_ids[i]);
  cJSON_Delete(j);
  // 5. Usage errors.
  const char *a4[] = {"chat-template", "--messages", "x.json", NULL};
  r = tt_run_tpr(tpr, dir, a4);
  assert_int_equal(r.code, 2);
  tt_run_done(&r);
  const char *a5[] = {"chat-template", "--model", dir, "--kwargs", "[1]", NULL};
  r = tt_run_tpr(tpr, dir, a5);
  assert_int_equal(r.code, 2);
  tt_run_done(&r);
  cJSON_Delete(cfg);
  free(qwen);
  free(llama);
  free(gemma);
  free(tokjson);
  const char *files[] = {"user.json", "system.json", "tools.json", "tokenizer.json", "tokenizer_config.json",
                         "chat_template.jinja", "stdout", "stderr"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) unlink(tt_path(dir, files[i]));
  rmdir(dir);
}

// An OpenAI request body as the input (what tpr serve has): the same bytes
// as the fixture's case, and a float in tool-call arguments kept a float.
static void test_request_body(void **state) {
  (void)state;
  char *text = read_file(TPR_FIXTURES "/chat_templates/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
  tpr_chat_jinja cj;
  tpr_jinja_error err;
  assert_int_equal(tpr_chat_jinja_from_text(text, strlen(text), &cj, &err), TPR_OK);
  cj.special[1] = strdup("<|im_end|>");
  const char *conv = cJSON_GetObjectItem(cJSON_GetObjectItem(fixture, "conversations"), "tool_calls")->valuestring;
  const char *tools = cJSON_GetObjectItem(fixture, "tools")->valuestring;
  char *body = malloc(strlen(conv) + strlen(tools) + 128);
  sprintf(body, "{\"model\": \"m\", \"messages\": %s, \"tools\": %s, \"max_tokens\": 5}", conv, tools);
  tpr_chat_inputs in = {.request_json = body, .add_generation_prompt = true};
  char *out = NULL;
  size_t len = 0;
  assert_int_equal(tpr_chat_jinja_render(&cj, &in, NULL, &out, &len, &err), TPR_OK);
  assert_string_equal(out, cJSON_GetObjectItem(find_case("Qwen-Qwen2.5-7B-Instruct", "tool_calls", true, true), "expected")->valuestring);
  free(out);
  const char *floats = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", "
                       "\"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                       "\"arguments\": {\"t\": 1.0, \"n\": 2}}}]}], \"chat_template_kwargs\": {\"unused\": 1}}";
  in.request_json = floats;
  assert_int_equal(tpr_chat_jinja_render(&cj, &in, NULL, &out, &len, &err), TPR_OK);
  assert_non_null(strstr(out, "{\"t\": 1.0, \"n\": 2}"));  // json.dumps of Python's 1.0 and 2
  free(out);
  in.request_json = "{\"model\": \"m\"}";
  assert_int_not_equal(tpr_chat_jinja_render(&cj, &in, NULL, &out, &len, &err), TPR_OK);
  assert_non_null(strstr(err.message, "no messages"));
  tpr_clear_error();
  free(body);
  free(text);
  tpr_chat_jinja_free(&cj);
}

// Follow-up turns as OpenAI clients send them (tool-call arguments as JSON
// text, null content beside the calls), through the request-body path that
// tpr serve uses: equal to transformers' rendering after vLLM's clean-up
// (the fixture's openai_cases). Negative control: the same bodies rendered
// as plain messages (no clean-up) must not all match.
static void test_openai_follow_up(void **state) {
  (void)state;
  const cJSON *cases = cJSON_GetObjectItem(fixture, "openai_cases"), *cs;
  int n = 0, controls_differ = 0;
  cJSON_ArrayForEach(cs, cases) {
    const char *tn = cJSON_GetObjectItem(cs, "template")->valuestring;
    char path[512];
    snprintf(path, sizeof path, TPR_FIXTURES "/chat_templates/templates/%s.jinja", tn);
    char *text = read_file(path);
    tpr_chat_jinja cj;
    tpr_jinja_error err = {0};
    assert_int_equal(tpr_chat_jinja_from_text(text, strlen(text), &cj, &err), TPR_OK);
    free(text);
    const cJSON *sp = cJSON_GetObjectItem(cJSON_GetObjectItem(fixture, "special"), tn);
    for (int i = 0; i < TPR_CHAT_SPECIAL_TOKENS; i++) {
      const cJSON *v = cJSON_GetObjectItem(sp, tpr_chat_special_names[i]);
      if (cJSON_IsString(v)) cj.special[i] = strdup(v->valuestring);
    }
    const char *body = cJSON_GetObjectItem(cs, "request")->valuestring;
    const cJSON *exp = cJSON_GetObjectItem(cs, "expected");
    tpr_chat_inputs in = {.request_json = body, .add_generation_prompt = true};
    char *out = NULL;
    size_t len = 0;
    tpr_status rc = tpr_chat_jinja_render(&cj, &in, NULL, &out, &len, &err);
    if (exp) {
      if (rc != TPR_OK) fail_msg("%s: %s", tn, err.message);
      if (strcmp(out, exp->valuestring)) fail_msg("%s: the follow-up turn renders differently", tn);
    } else {
      assert_int_not_equal(rc, TPR_OK);
    }
    free(out);
    tpr_clear_error();
    // The control: the body's messages as they are.
    cJSON *b = cJSON_Parse(body);
    char *msgs = cJSON_PrintUnformatted(cJSON_GetObjectItem(b, "messages"));
    char *tools = cJSON_PrintUnformatted(cJSON_GetObjectItem(b, "tools"));
    tpr_chat_inputs plain = {.messages_json = msgs, .tools_json = tools, .add_generation_prompt = true};
    out = NULL;
    rc = tpr_chat_jinja_render(&cj, &plain, NULL, &out, &len, &err);
    if (exp && (rc != TPR_OK || strcmp(out, exp->valuestring))) controls_differ++;
    free(out);
    tpr_clear_error();
    free(msgs);
    free(tools);
    cJSON_Delete(b);
    tpr_chat_jinja_free(&cj);
    n++;
  }
  printf("%d templates render OpenAI follow-up turns as vLLM does; without the clean-up %d differ\n", n,
         controls_differ);
  assert_true(n >= 12);
  assert_true(controls_differ >= n / 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parity),
      cmocka_unit_test(test_negative_controls),
      cmocka_unit_test(test_cli),
      cmocka_unit_test(test_request_body),
      cmocka_unit_test(test_openai_follow_up),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
