// serve/tool_parse.c: reasoning, Hermes/Qwen and MiniMax-M2 tool calls and
// content separated from generated text fed in every possible way (whole,
// byte by byte, split in two at every byte and in three at every pair of
// bytes): each split must give the same answer as the expected one.
// Malformed and unfinished blocks stay content, byte for byte.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  assert_true(tpr_reasoning_detect("x <think> y"));
  assert_false(tpr_reasoning_detect("thinking"));
  assert_true(tpr_prompt_opens_think("<|im_start|>assistant\n<think>\n"));
  assert_false(tpr_prompt_opens_think("<think>\n\n</think>\n\n"));
  assert_true(tpr_tool_format_parse("minimax_m2", &f) && f == TPR_TOOL_FMT_MINIMAX_M2);
  assert_true(tpr_tool_format_parse("hermes", &f) && f == TPR_TOOL_FMT_HERMES);
  assert_false(tpr_tool_format_parse("qwen", &f));
  assert_string_equal(tpr_tool_format_name(TPR_TOOL_FMT_NONE), "none");
  assert_true(tpr_text_blank(" \n\t", 3) && !tpr_text_blank(" a", 2));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_split),
      cmocka_unit_test(test_monotonic),
      cmocka_unit_test(test_detect),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
