// serve/tool_parse.c: reasoning, Hermes/Qwen and MiniMax-M2 tool calls and
// content separated from generated text fed in every possible way (whole,
// byte by byte, split in two at every byte and in three at every pair of
// bytes): each split must give the same answer as the expected one.
// Malformed and unfinished blocks stay content, byte for byte.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/chat.h"
#include "runtime/file_io.h"
#include "serve/tool_parse.h"
#include "test_util.h"

typedef struct tcase {
  tpr_tool_format fmt;
  bool reasoning, starts_in;
  const char *tools;  // JSON or NULL
  const char *in;
  const char *content, *reasoning_text;
  int n_calls;
  const char *name[3], *args[3];
} tcase;

static const char *weather_tools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"temp\":{\"type\":\"number\"},"
    "\"metric\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},\"tags\":{\"type\":[\"array\",\"null\"]}}}}}]";

static const tcase cases[] = {
    // plain content, no tags
    {TPR_TOOL_FMT_HERMES, true, false, NULL, "Hello <b>world</b> <thinking", "Hello <b>world</b> <thinking", "", 0, {0}, {0}},
    // reasoning then content
    {TPR_TOOL_FMT_NONE, true, false, NULL, "<think>\nlet me see\n</think>\n\nThe answer.", "\n\nThe answer.",
     "\nlet me see\n", 0, {0}, {0}},
    // the prompt opened <think>: only the closing tag comes
    {TPR_TOOL_FMT_HERMES, true, true, NULL, "hmm </thi\n</think>ok", "ok", "hmm </thi\n", 0, {0}, {0}},
    // reasoning off: <think> is content
    {TPR_TOOL_FMT_NONE, false, true, NULL, "<think>x</think>y", "<think>x</think>y", "", 0, {0}, {0}},
    // reasoning never closed stays reasoning
    {TPR_TOOL_FMT_HERMES, true, false, NULL, "a<think>b <tool_call>", "a", "b <tool_call>", 0, {0}, {0}},
    // Hermes: reasoning, one call
    {TPR_TOOL_FMT_HERMES, true, false, NULL,
     "<think>need weather</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
     "\"days\": 3}}\n</tool_call>",
     "\n\n", "need weather", 1, {"get_weather"}, {"{\"city\":\"Paris\",\"days\":3}"}},
    // Hermes: two calls, text before, unicode kept
    {TPR_TOOL_FMT_HERMES, false, false, NULL,
     "Sure.<tool_call>{\"name\":\"a\",\"arguments\":{\"q\":\"日本\"}}</tool_call>\n<tool_call>\n{\"name\":\"b\"}\n"
     "</tool_call>",
     "Sure.\n", "", 2, {"a", "b"}, {"{\"q\":\"日本\"}", "{}"}},
    // Hermes: malformed JSON left as content with its tags, the next call still parsed
    {TPR_TOOL_FMT_HERMES, false, false, NULL,
     "x<tool_call>{\"name\": oops}</tool_call>y<tool_call>{\"arguments\":{}}</tool_call><tool_call>{\"name\":\"c\","
     "\"arguments\":[1]}</tool_call>",
     "x<tool_call>{\"name\": oops}</tool_call>y<tool_call>{\"arguments\":{}}</tool_call>", "", 1, {"c"}, {"[1]"}},
    // Hermes: unfinished call at the end of generation is content
    {TPR_TOOL_FMT_HERMES, false, false, NULL, "go <tool_call>\n{\"name\": \"f\", \"argu",
     "go <tool_call>\n{\"name\": \"f\", \"argu", "", 0, {0}, {0}},
    // a tag's beginning at the very end is content
    {TPR_TOOL_FMT_HERMES, true, false, NULL, "end <tool_ca", "end <tool_ca", "", 0, {0}, {0}},
    {TPR_TOOL_FMT_HERMES, true, false, NULL, "end <thi", "end <thi", "", 0, {0}, {0}},
    // tool parsing off: tags are content
    {TPR_TOOL_FMT_NONE, false, false, NULL, "<tool_call>{\"name\":\"a\"}</tool_call>",
     "<tool_call>{\"name\":\"a\"}</tool_call>", "", 0, {0}, {0}},
    // MiniMax-M2 with the schema's types
    {TPR_TOOL_FMT_MINIMAX_M2, true, true, NULL,
     "plan</think>\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">\nSan Francisco, "
     "CA\n</parameter>\n<parameter name=\"days\">3</parameter>\n<parameter name=\"temp\">21.0</parameter>"
     "<parameter name=\"metric\">True</parameter><parameter name=\"opts\">{\"a\": [1, 2]}</parameter>"
     "<parameter name=\"tags\">[\"x\"]</parameter><parameter name=\"other\">42</parameter>\n</invoke>\n"
     "<invoke name='noop'></invoke>\n</minimax:tool_call>",
     "\n", "plan", 2, {"get_weather", "noop"},
     {"{\"city\":\"San Francisco, CA\",\"days\":3,\"temp\":21,\"metric\":true,\"opts\":{\"a\":[1,2]},"
      "\"tags\":[\"x\"],\"other\":\"42\"}",
      "{}"}},
    // MiniMax-M2: values that do not convert stay strings; null is null
    {TPR_TOOL_FMT_MINIMAX_M2, false, false, NULL,
     "<minimax:tool_call><invoke name=\"get_weather\"><parameter name=\"days\">three</parameter><parameter "
     "name=\"temp\">NULL</parameter><parameter name=\"opts\">{bad</parameter></invoke></minimax:tool_call>",
     "", "", 1, {"get_weather"}, {"{\"days\":\"three\",\"temp\":null,\"opts\":\"{bad\"}"}},
    // MiniMax-M2: a block without an invoke, and an invoke without its end, stay content
    {TPR_TOOL_FMT_MINIMAX_M2, false, false, NULL,
     "a<minimax:tool_call>nothing</minimax:tool_call>b<minimax:tool_call><invoke name=\"f\"><parameter "
     "name=\"x\">1</minimax:tool_call>",
     "a<minimax:tool_call>nothing</minimax:tool_call>b<minimax:tool_call><invoke name=\"f\"><parameter "
     "name=\"x\">1</minimax:tool_call>",
     "", 0, {0}, {0}},
    // MiniMax-M2: unfinished block at the end of generation
    {TPR_TOOL_FMT_MINIMAX_M2, false, false, NULL, "<minimax:tool_call><invoke name=\"f\">",
     "<minimax:tool_call><invoke name=\"f\">", "", 0, {0}, {0}},
    // Hermes tags are content for MiniMax-M2 and the other way round
    {TPR_TOOL_FMT_MINIMAX_M2, false, false, NULL, "<tool_call>{\"name\":\"a\"}</tool_call>",
     "<tool_call>{\"name\":\"a\"}</tool_call>", "", 0, {0}, {0}},
    // Qwen3-Coder: one newline of layout around each value; schema types; two functions
    {TPR_TOOL_FMT_QWEN3_CODER, true, false, NULL,
     "<think>go</think>ok\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork \n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=noop>\n</function>\n"
     "</tool_call>",
     "ok\n\n", "go", 2, {"get_weather", "noop"}, {"{\"city\":\"New\\nYork \",\"days\":3}", "{}"}},
    // Qwen3-Coder: a Hermes JSON block is not its format, and stays content
    {TPR_TOOL_FMT_QWEN3_CODER, false, false, NULL, "<tool_call>{\"name\":\"a\"}</tool_call>",
     "<tool_call>{\"name\":\"a\"}</tool_call>", "", 0, {0}, {0}},
    // GLM-4.5: the name on the first line, typed pairs; 4.7: no newline after the name
    {TPR_TOOL_FMT_GLM45, false, false, NULL,
     "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
     "<arg_value>3</arg_value>\n<arg_key>opts</arg_key><arg_value>{\"a\": 1}</arg_value>\n</tool_call>"
     "<tool_call>noop<arg_key>x</arg_key><arg_value>[1, 2]</arg_value></tool_call>",
     "", "", 2, {"get_weather", "noop"}, {"{\"city\":\"Paris\",\"days\":3,\"opts\":{\"a\":1}}", "{\"x\":[1,2]}"}},
    // GLM: a pair without its value closes nothing: the block stays content
    {TPR_TOOL_FMT_GLM45, false, false, NULL, "a<tool_call>f\n<arg_key>k</arg_key><arg_value>v</tool_call>",
     "a<tool_call>f\n<arg_key>k</arg_key><arg_value>v</tool_call>", "", 0, {0}, {0}},
    // Hunyuan Hy3-preview: one <tool_calls> block of two calls
    {TPR_TOOL_FMT_HUNYUAN_PREVIEW, true, false, NULL,
     "<think></think>Sure.<tool_calls>\n<tool_call>get_weather<tool_sep>\n<arg_key>city</arg_key>\n"
     "<arg_value>Paris</arg_value>\n<arg_key>temp</arg_key>\n<arg_value>21.5</arg_value>\n</tool_call>\n"
     "<tool_call>noop<tool_sep>\n</tool_call>\n</tool_calls>",
     "Sure.", "", 2, {"get_weather", "noop"}, {"{\"city\":\"Paris\",\"temp\":21.5}", "{}"}},
    // Hy3: the same with ":opensource" tags
    {TPR_TOOL_FMT_HUNYUAN, false, false, NULL,
     "<tool_calls:opensource>\n<tool_call:opensource>add<tool_sep:opensource>\n<arg_key:opensource>a</arg_key:opensource>\n"
     "<arg_value:opensource>3</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>",
     "", "", 1, {"add"}, {"{\"a\":3}"}},
    // Kimi K2: "functions.NAME:INDEX" ids, JSON arguments
    {TPR_TOOL_FMT_KIMI_K2, false, false, NULL,
     "I'll check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
     "{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.add:1<|tool_call_argument_begin|>"
     "{\"a\": 3, \"b\": 4}<|tool_call_end|><|tool_calls_section_end|>",
     "I'll check.", "", 2, {"get_weather", "add"}, {"{\"city\":\"Paris\"}", "{\"a\":3,\"b\":4}"}},
    // Kimi K2: arguments that are not JSON leave the block as content
    {TPR_TOOL_FMT_KIMI_K2, false, false, NULL,
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{oops<|tool_call_end|>"
     "<|tool_calls_section_end|>",
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{oops<|tool_call_end|>"
     "<|tool_calls_section_end|>",
     "", 0, {0}, {0}},
    // DeepSeek V3.1 after reasoning
    {TPR_TOOL_FMT_DEEPSEEK, true, true, NULL,
     "weather?</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}"
     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "", "weather?", 1, {"get_weather"}, {"{\"city\":\"Paris\"}"}},
    // DeepSeek V3 / R1: "function", the name after the sep, fenced JSON
    {TPR_TOOL_FMT_DEEPSEEK, false, false, NULL,
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 3, \"b\": 4}\n```"
     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "", "", 1, {"add"}, {"{\"a\":3,\"b\":4}"}},
    // Mistral v11+: name[ARGS]{...} per [TOOL_CALLS], to the end of the answer
    {TPR_TOOL_FMT_MISTRAL, false, false, NULL,
     "Let me look.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]add[ARGS]{\"a\": 3, \"b\": 4}",
     "Let me look.", "", 2, {"get_weather", "add"}, {"{\"city\":\"Paris\"}", "{\"a\":3,\"b\":4}"}},
    // Mistral before v11: a JSON list
    {TPR_TOOL_FMT_MISTRAL, false, false, NULL,
     "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, {\"name\": \"noop\"}]", "", "", 2,
     {"add", "noop"}, {"{\"a\":1,\"b\":2}", "{}"}},
    // Mistral: an unparsable tail stays content with its tag
    {TPR_TOOL_FMT_MISTRAL, false, false, NULL, "x[TOOL_CALLS]get_weather{\"city\"", "x[TOOL_CALLS]get_weather{\"city\"",
     "", 0, {0}, {0}},
    // Llama 3: the whole answer, "parameters", several joined by "; "
    {TPR_TOOL_FMT_LLAMA3_JSON, false, false, NULL,
     "  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"add\", "
     "\"parameters\": {\"a\": 3, \"b\": 4}}",
     "  ", "", 2, {"get_weather", "add"}, {"{\"city\":\"Paris\"}", "{\"a\":3,\"b\":4}"}},
    // Llama 3: JSON later in the answer is not a call; a non-call object stays content
    {TPR_TOOL_FMT_LLAMA3_JSON, false, false, NULL, "Here: {\"name\": \"f\", \"parameters\": {}}",
     "Here: {\"name\": \"f\", \"parameters\": {}}", "", 0, {0}, {0}},
    {TPR_TOOL_FMT_LLAMA3_JSON, false, false, NULL, "{\"a\": 1} and more", "{\"a\": 1} and more", "", 0, {0}, {0}},
};

static void check(const tcase *c, const size_t *cuts, int n_cuts, const cJSON *tools) {
  tpr_out_parser p;
  tpr_out_parser_init(&p, c->fmt, c->reasoning, c->starts_in, tools);
  size_t len = strlen(c->in), from = 0;
  for (int k = 0; k <= n_cuts; k++) {
    size_t to = k < n_cuts ? cuts[k] : len;
    tpr_out_parser_feed(&p, c->in + from, to - from);
    from = to;
  }
  tpr_out_parser_finish(&p);
  assert_false(p.oom);
  if (strcmp(p.content.s ? p.content.s : "", c->content) != 0 ||
      strcmp(p.reasoning_text.s ? p.reasoning_text.s : "", c->reasoning_text) != 0 || p.n_calls != c->n_calls) {
    fprintf(stderr, "input %s\ncuts:", c->in);
    for (int k = 0; k < n_cuts; k++) fprintf(stderr, " %zu", cuts[k]);
    fprintf(stderr, "\ncontent [%s]\nreasoning [%s]\ncalls %d\n", p.content.s ? p.content.s : "",
            p.reasoning_text.s ? p.reasoning_text.s : "", p.n_calls);
  }
  assert_string_equal(p.content.s ? p.content.s : "", c->content);
  assert_string_equal(p.reasoning_text.s ? p.reasoning_text.s : "", c->reasoning_text);
  assert_int_equal(p.n_calls, c->n_calls);
  for (int i = 0; i < c->n_calls; i++) {
    assert_string_equal(p.calls[i].name, c->name[i]);
    assert_string_equal(p.calls[i].arguments, c->args[i]);
  }
  tpr_out_parser_free(&p);
}

static void test_every_split(void **state) {
  (void)state;
  cJSON *tools = cJSON_Parse(weather_tools);
  assert_non_null(tools);
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    const tcase *c = &cases[t];
    size_t len = strlen(c->in);
    check(c, NULL, 0, tools);
    size_t *bytes = malloc(len * sizeof *bytes);  // one byte at a time
    for (size_t i = 0; i + 1 < len; i++) bytes[i] = i + 1;
    check(c, bytes, len > 0 ? (int)len - 1 : 0, tools);
    free(bytes);
    for (size_t i = 0; i <= len; i++) {
      check(c, (size_t[]){i}, 1, tools);
      for (size_t j = i; j <= len; j += 1 + (len > 120))  // every pair (every other for long inputs)
        check(c, (size_t[]){i, j}, 2, tools);
    }
  }
  cJSON_Delete(tools);
}

// What has been classified is final: content, reasoning and calls only grow
// as bytes come (what the streamed deltas rely on).
static void test_monotonic(void **state) {
  (void)state;
  const char *in = "<think>r</think>a<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>b";
  tpr_out_parser p;
  tpr_out_parser_init(&p, TPR_TOOL_FMT_HERMES, true, false, NULL);
  size_t cl = 0, rl = 0;
  int nc = 0;
  for (size_t i = 0; in[i]; i++) {
    tpr_out_parser_feed(&p, in + i, 1);
    assert_true(p.content.len >= cl && p.reasoning_text.len >= rl && p.n_calls >= nc);
    cl = p.content.len, rl = p.reasoning_text.len, nc = p.n_calls;
    if (i == 7) assert_int_equal(rl, 1);  // "<think>r": r is reasoning already
  }
  tpr_out_parser_finish(&p);
  assert_string_equal(p.content.s, "ab");
  assert_int_equal(p.n_calls, 1);
  tpr_out_parser_free(&p);
}

static void test_detect(void **state) {
  (void)state;
  tpr_tool_format f;
  assert_int_equal(tpr_tool_format_detect("{% if tools %}<tool_call>{% endif %}"), TPR_TOOL_FMT_HERMES);
  assert_int_equal(tpr_tool_format_detect("<minimax:tool_call>"), TPR_TOOL_FMT_MINIMAX_M2);
  assert_int_equal(tpr_tool_format_detect("<|im_start|>"), TPR_TOOL_FMT_NONE);
  assert_int_equal(tpr_tool_format_detect(NULL), TPR_TOOL_FMT_NONE);
  assert_string_equal(tpr_reasoning_detect("x <think> y"), "<think>");
  assert_null(tpr_reasoning_detect("thinking"));
  assert_string_equal(tpr_reasoning_detect("{%- set HYTK = ':opensource' %}{%- set t = '<think{}>'.format(HYTK) %}"),
                      "<think:opensource>");
  assert_true(tpr_prompt_opens_think("<|im_start|>assistant\n<think>\n", NULL));
  assert_false(tpr_prompt_opens_think("<think>\n\n</think>\n\n", NULL));
  assert_true(tpr_prompt_opens_think("<｜hy_Assistant｜><think:opensource>", "<think:opensource>"));
  assert_true(tpr_tool_format_parse("hunyuan_preview", &f) && f == TPR_TOOL_FMT_HUNYUAN_PREVIEW);
  assert_int_equal(tpr_tool_format_detect("x = '<tool_calls>' y = '<tool_sep>' '<arg_key>' '<tool_call>'"),
                   TPR_TOOL_FMT_HUNYUAN_PREVIEW);
  assert_non_null(strstr(tpr_tool_format_names(), "llama3_json"));
  assert_true(tpr_tool_format_parse("minimax_m2", &f) && f == TPR_TOOL_FMT_MINIMAX_M2);
  assert_true(tpr_tool_format_parse("hermes", &f) && f == TPR_TOOL_FMT_HERMES);
  assert_false(tpr_tool_format_parse("qwen", &f));
  assert_string_equal(tpr_tool_format_name(TPR_TOOL_FMT_NONE), "none");
  assert_true(tpr_text_blank(" \n\t", 3) && !tpr_text_blank(" a", 2));
}

// What a model trained on a published template emits is what the template
// renders for an assistant turn of tool calls. For each format, the
// checkpoint's own template (tests/fixtures/chat_templates) renders
// [user, assistant with get_weather(city=Paris) and add(a=3, b=4)]; the text
// after the generation prompt's shared prefix is fed to the parser, which
// must find both calls with their arguments and leave neither in the
// content. The template's text must also select the format (auto). Negative
// control: the hermes parser on every other format's text finds nothing.
// The tools of the template fixture (weather_tools' ["array", "null"] type
// sends Hermes 3's schema macro into endless recursion, in jinja2 as here).
static const char *turn_tools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get the weather.\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"description\":\"Add two integers.\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},"
    "\"required\":[\"a\",\"b\"]}}}]";

static char *render_turn(const char *tmpl_name, const char *eos, const char *messages, bool gen) {
  char path[512];
  snprintf(path, sizeof path, TPR_FIXTURES "/chat_templates/templates/%s.jinja", tmpl_name);
  uint8_t *bytes = NULL;
  size_t n = 0;
  if (tpr_file_read(path, &bytes, &n) != TPR_OK) fail_msg("%s: %s", path, tpr_last_error());
  tpr_chat_jinja cj;
  tpr_jinja_error err = {0};
  if (tpr_chat_jinja_from_text((const char *)bytes, n, &cj, &err) != TPR_OK) fail_msg("%s: %s", tmpl_name, err.message);
  free(bytes);
  if (eos) cj.special[1] = strdup(eos);
  char *body = malloc(strlen(messages) + strlen(turn_tools) + 64);
  sprintf(body, "{\"messages\": %s, \"tools\": %s}", messages, turn_tools);
  tpr_chat_inputs in = {.request_json = body, .add_generation_prompt = gen};
  char *out = NULL;
  size_t len = 0;
  if (tpr_chat_jinja_render(&cj, &in, NULL, &out, &len, &err) != TPR_OK) fail_msg("%s: %s", tmpl_name, err.message);
  free(body);
  tpr_chat_jinja_free(&cj);
  return out;
}

static void test_templates_round_trip(void **state) {
  (void)state;
  static const struct {
    const char *tmpl, *eos;
    tpr_tool_format fmt;
    int n_calls;  // Llama 3.1's template allows one call per turn
  } rows[] = {
      {"Qwen-Qwen3-0.6B", "<|im_end|>", TPR_TOOL_FMT_HERMES, 2},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "<|im_end|>", TPR_TOOL_FMT_HERMES, 2},
      {"MiniMax-M2", "[e~[", TPR_TOOL_FMT_MINIMAX_M2, 2},
      {"Qwen3-Coder", "<|im_end|>", TPR_TOOL_FMT_QWEN3_CODER, 2},
      {"GLM-4.6", "<|endoftext|>", TPR_TOOL_FMT_GLM45, 2},
      {"tencent-Hy3", NULL, TPR_TOOL_FMT_HUNYUAN, 2},
      {"moonshotai-Kimi-K2", "[EOS]", TPR_TOOL_FMT_KIMI_K2, 2},
      {"deepseek-ai-DeepSeek-V3.1", "<｜end▁of▁sentence｜>", TPR_TOOL_FMT_DEEPSEEK, 2},
      {"Mistral-Small-3.2-24B-Instruct-2506", "</s>", TPR_TOOL_FMT_MISTRAL, 2},
      {"meta-llama-Llama-3.1-8B-Instruct", "<|eot_id|>", TPR_TOOL_FMT_LLAMA3_JSON, 1},
  };
  const char *user = "{\"role\": \"user\", \"content\": \"Weather in Paris, and 3+4?\"}";
  // (ids of 9 letters and digits: Mistral's template requires them)
  const char *call_weather = "{\"id\": \"call00001\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                             "\"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}";
  const char *call_add = "{\"id\": \"call00002\", \"type\": \"function\", \"function\": {\"name\": \"add\", "
                         "\"arguments\": \"{\\\"a\\\": 3, \\\"b\\\": 4}\"}}";
  cJSON *tools = cJSON_Parse(turn_tools);
  int controls_found = 0;
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    char prompt_msgs[256], turn_msgs[1024];
    snprintf(prompt_msgs, sizeof prompt_msgs, "[%s]", user);
    snprintf(turn_msgs, sizeof turn_msgs, "[%s, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [%s%s%s]}]",
             user, call_weather, rows[i].n_calls > 1 ? ", " : "", rows[i].n_calls > 1 ? call_add : "");
    char *prompt = render_turn(rows[i].tmpl, rows[i].eos, prompt_msgs, true);
    char *turn = render_turn(rows[i].tmpl, rows[i].eos, turn_msgs, false);
    size_t k = 0;  // the generation prompt may open <think>: the shared prefix ends before it
    while (prompt[k] && prompt[k] == turn[k]) k++;
    char *answer = turn + k;
    // The end-of-turn token is the sampled stop token, not text of the answer.
    size_t al = strlen(answer);
    while (al && (answer[al - 1] == '\n' || answer[al - 1] == ' ')) al--;
    if (rows[i].eos && al >= strlen(rows[i].eos) && !strncmp(answer + al - strlen(rows[i].eos), rows[i].eos,
                                                               strlen(rows[i].eos)))
      answer[al - strlen(rows[i].eos)] = 0;
    // the template's own text selects the format
    char path[512];
    snprintf(path, sizeof path, TPR_FIXTURES "/chat_templates/templates/%s.jinja", rows[i].tmpl);
    uint8_t *text = NULL;
    size_t tn = 0;
    assert_int_equal(tpr_file_read(path, &text, &tn), TPR_OK);
    char *t = strndup((const char *)text, tn);
    free(text);
    if (tpr_tool_format_detect(t) != rows[i].fmt)
      fail_msg("%s: auto picks %s, not %s", rows[i].tmpl, tpr_tool_format_name(tpr_tool_format_detect(t)),
               tpr_tool_format_name(rows[i].fmt));
    const char *think = tpr_reasoning_detect(t);
    free(t);
    tpr_out_parser p;
    tpr_out_parser_init(&p, rows[i].fmt, true, false, tools);
    tpr_out_parser_think_tag(&p, think);
    for (const char *q = answer; *q; q++) tpr_out_parser_feed(&p, q, 1);  // a byte at a time
    tpr_out_parser_finish(&p);
    const char *content = p.content.s ? p.content.s : "";
    if (p.n_calls != rows[i].n_calls || strstr(content, "Paris") || strstr(content, "get_weather"))
      fail_msg("%s: %d calls from [%s]; content left [%s]", rows[i].tmpl, p.n_calls, answer, content);
    assert_string_equal(p.calls[0].name, "get_weather");
    assert_string_equal(p.calls[0].arguments, "{\"city\":\"Paris\"}");
    if (rows[i].n_calls > 1) {
      assert_string_equal(p.calls[1].name, "add");
      assert_string_equal(p.calls[1].arguments, "{\"a\":3,\"b\":4}");
    }
    tpr_out_parser_free(&p);
    if (rows[i].fmt != TPR_TOOL_FMT_HERMES) {  // the control: another format's parser
      tpr_out_parser_init(&p, TPR_TOOL_FMT_HERMES, true, false, tools);
      tpr_out_parser_feed(&p, answer, strlen(answer));
      tpr_out_parser_finish(&p);
      controls_found += p.n_calls;
      tpr_out_parser_free(&p);
    }
    printf("%-40s %-12s %d calls from %zu bytes\n", rows[i].tmpl, tpr_tool_format_name(rows[i].fmt), rows[i].n_calls,
           strlen(answer));
    free(prompt);
    free(turn);
  }
  assert_int_equal(controls_found, 0);
  cJSON_Delete(tools);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_split),
      cmocka_unit_test(test_monotonic),
      cmocka_unit_test(test_detect),
      cmocka_unit_test(test_templates_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
