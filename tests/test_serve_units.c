// Units of tpr serve without sockets: the built-in chat templates (exact
// renderings, roles a template cannot place, detection from a checkpoint
// directory), the HTTP request reader fed random splits of a byte stream, and
// answer text with NUL and control bytes kept whole in the response JSON.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jinja/chat.h"
#include "serve/serve.h"
#include "test_util.h"

static char *render(tpr_chat_template t, const char *messages_json, char *err, size_t errlen) {
  cJSON *m = cJSON_Parse(messages_json);
  assert_non_null(m);
  char *out = tpr_chat_render(t, m, err, errlen);
  cJSON_Delete(m);
  return out;
}

static const char *conversation =
    "[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
    "\"text\":\"hi \"},{\"type\":\"text\",\"text\":\"there\"}]},{\"role\":\"assistant\",\"content\":\"yes\"},"
    "{\"role\":\"user\",\"content\":\"日本\"}]";

static void test_templates_render(void **state) {
  (void)state;
  char err[256];
  char *c = render(TPR_CHAT_CHATML, conversation, err, sizeof err);
  assert_non_null(c);
  assert_string_equal(c,
                      "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n"
                      "<|im_start|>assistant\nyes<|im_end|>\n<|im_start|>user\n日本<|im_end|>\n"
                      "<|im_start|>assistant\n");
  free(c);
  char *m = render(TPR_CHAT_MINIMAX_M2, conversation, err, sizeof err);
  assert_non_null(m);
  assert_string_equal(m,
                      "]~!b[]~b]system\nbe brief[e~[\n]~b]user\nhi there[e~[\n]~b]ai\nyes[e~[\n"
                      "]~b]user\n日本[e~[\n]~b]ai\n<think>\n");
  free(m);
  // Hunyuan-A13B: the system message opens the first turn, so the user's
  // <|startoftext|> is left out there and written for the later user turn.
  char *h = render(TPR_CHAT_HUNYUAN_MOE, conversation, err, sizeof err);
  assert_non_null(h);
  assert_string_equal(h,
                      "<|startoftext|>be brief<|extra_4|>hi there<|extra_0|>yes<|eos|>"
                      "<|startoftext|>日本<|extra_0|>");
  free(h);
  h = render(TPR_CHAT_HUNYUAN_MOE, "[{\"role\":\"user\",\"content\":\"hi\"}]", err, sizeof err);
  assert_non_null(h);
  assert_string_equal(h, "<|startoftext|>hi<|extra_0|>");
  free(h);
  printf("chatml, minimax_m2 and hunyuan_moe render a 4-message conversation exactly\n");
}

static void test_templates_refuse(void **state) {
  (void)state;
  char err[256];
  // ChatML takes any role; MiniMax-M2's template has no place for "critic".
  const char *odd = "[{\"role\":\"critic\",\"content\":\"x\"}]";
  char *c = render(TPR_CHAT_CHATML, odd, err, sizeof err);
  assert_non_null(c);
  free(c);
  assert_null(render(TPR_CHAT_MINIMAX_M2, odd, err, sizeof err));
  assert_non_null(strstr(err, "'critic'"));
  assert_non_null(strstr(err, "minimax_m2"));
  assert_null(render(TPR_CHAT_HUNYUAN_MOE, "[{\"role\":\"tool\",\"content\":\"x\"}]", err, sizeof err));
  assert_non_null(strstr(err, "hunyuan_moe"));
  assert_null(render(TPR_CHAT_NONE, conversation, err, sizeof err));
  assert_non_null(strstr(err, "--chat-template"));
  assert_null(render(TPR_CHAT_CHATML, "[]", err, sizeof err));
  assert_null(render(TPR_CHAT_CHATML, "[{\"role\":\"user\",\"content\":5}]", err, sizeof err));
  assert_null(render(TPR_CHAT_CHATML, "[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]", err, sizeof err));
  printf("refused: a role minimax_m2 lacks, no template, empty list, bad content (last: %s)\n", err);
}

static void write_file(const char *dir, const char *name, const char *text) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void test_templates_detect(void **state) {
  (void)state;
  char dir[] = "/tmp/tpr_chat_tmpl.XXXXXX";
  assert_non_null(mkdtemp(dir));
  char why[128];
  assert_int_equal(tpr_chat_template_detect(dir, why, sizeof why), TPR_CHAT_CHATML);  // none declared
  write_file(dir, "tokenizer_config.json",
             "{\"chat_template\": \"{% for m in messages %}]~b]{{m.role}}{% endfor %}\"}");
  assert_int_equal(tpr_chat_template_detect(dir, why, sizeof why), TPR_CHAT_MINIMAX_M2);
  write_file(dir, "tokenizer_config.json",
             "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"]~b]\"}, {\"name\": \"default\", "
             "\"template\": \"<|im_start|>{{m}}\"}]}");
  assert_int_equal(tpr_chat_template_detect(dir, why, sizeof why), TPR_CHAT_CHATML);
  write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"[INST] {{ m }} [/INST]\"}");
  assert_int_equal(tpr_chat_template_detect(dir, why, sizeof why), TPR_CHAT_NONE);
  write_file(dir, "tokenizer_config.json",
             "{\"chat_template\": \"{{ '<|startoftext|>' + m + '<|extra_4|>' }}{{ u + '<|extra_0|>' }}\"}");
  assert_int_equal(tpr_chat_template_detect(dir, why, sizeof why), TPR_CHAT_HUNYUAN_MOE);
  // chat_template.jinja takes precedence over tokenizer_config.json.
  write_file(dir, "chat_template.jinja", "]~!b[]~b]system");
  assert_int_equal(tpr_chat_template_detect(dir, why, sizeof why), TPR_CHAT_MINIMAX_M2);
  assert_string_equal(why, "chat_template.jinja");
  char p[512];
  snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
  unlink(p);
  rmdir(dir);
  printf("detected: none -> chatml, ]~b] -> minimax_m2, named default, [INST] -> none, extra_0/4 -> hunyuan_moe, "
         ".jinja first\n");
}

// Feeds `stream` in random pieces; returns the requests seen (path and body
// joined as "PATH|BODY;") or a BAD status.
static void read_all(const char *stream, size_t len, size_t max_body, char *out, size_t outcap, int *bad) {
  tpr_http_reader rd;
  tpr_http_reader_init(&rd, max_body);
  out[0] = 0;
  *bad = 0;
  size_t pos = 0;
  char *pending = NULL;  // bytes past a complete request, fed again after it
  size_t plen = 0;
  while (pos < len || plen) {
    const char *data;
    size_t n;
    if (plen) {
      data = pending;
      n = plen;
    } else {
      n = (size_t)tt_randint(1, 40);
      if (n > len - pos) n = len - pos;
      data = stream + pos;
      pos += n;
    }
    size_t used = 0;
    int status = 0;
    char msg[160];
    tpr_http_feed f = tpr_http_reader_feed(&rd, data, n, &used, &status, msg, sizeof msg);
    char *rest = NULL;
    size_t rlen = 0;
    if (f == TPR_HTTP_REQUEST && used < n) {
      rlen = n - used;
      rest = malloc(rlen);
      memcpy(rest, data + used, rlen);
    }
    free(pending);
    pending = rest;
    plen = rlen;
    if (f == TPR_HTTP_BAD) {
      *bad = status;
      break;
    }
    if (f == TPR_HTTP_REQUEST) {
      tpr_http_request r;
      tpr_http_reader_request(&rd, &r);
      size_t l = strlen(out);
      snprintf(out + l, outcap - l, "%s|%s;", r.path, r.body);
      tpr_http_reader_next(&rd);
    }
  }
  free(pending);
  tpr_http_reader_free(&rd);
}

static void test_http_reader(void **state) {
  (void)state;
  const char *stream =
      "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
      "GET /health HTTP/1.1\r\nHost: a\r\n\r\n"
      "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
  char out[512];
  int bad;
  for (int trial = 0; trial < 200; trial++) {  // random splits of the same bytes
    read_all(stream, strlen(stream), 100, out, sizeof out, &bad);
    assert_int_equal(bad, 0);
    assert_string_equal(out, "/v1/completions|hello;/health|;/v1/chat/completions|abcde;");
  }
  // Negative controls: the body limit, a chunked body past it, garbage.
  read_all(stream, strlen(stream), 4, out, sizeof out, &bad);
  assert_int_equal(bad, 413);
  const char *chunked = "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n4\r\nefgh\r\n0\r\n\r\n";
  read_all(chunked, strlen(chunked), 6, out, sizeof out, &bad);
  assert_int_equal(bad, 413);
  read_all("BROKEN\r\n\r\n", 10, 100, out, sizeof out, &bad);
  assert_int_equal(bad, 400);
  printf("3 pipelined requests read alike over 200 random splits; 413 x2 and 400 refused\n");
}

// Expect: 100-continue is seen once the headers are in (the body not yet);
// any other expectation is 417; HTTP/1.0 is told apart.
static void test_http_reader_expect(void **state) {
  (void)state;
  tpr_http_reader rd;
  size_t used = 0;
  int status = 0;
  char msg[160];
  const char *head = "POST /v1/completions HTTP/1.1\r\nHost: a\r\nEXPECT: 100-Continue\r\nContent-Length: 2\r\n\r\n";
  tpr_http_reader_init(&rd, 100);
  assert_int_equal(tpr_http_reader_feed(&rd, head, strlen(head), &used, &status, msg, sizeof msg), TPR_HTTP_MORE);
  assert_true(rd.expect_continue);
  assert_int_equal(tpr_http_reader_feed(&rd, "{}", 2, &used, &status, msg, sizeof msg), TPR_HTTP_REQUEST);
  assert_false(tpr_http_reader_http10(&rd));
  tpr_http_reader_next(&rd);
  assert_false(rd.expect_continue);  // the next request starts clean
  const char *plain = "GET /health HTTP/1.0\r\n\r\n";
  assert_int_equal(tpr_http_reader_feed(&rd, plain, strlen(plain), &used, &status, msg, sizeof msg), TPR_HTTP_REQUEST);
  assert_true(tpr_http_reader_http10(&rd));
  assert_false(rd.expect_continue);
  tpr_http_reader_free(&rd);
  const char *odd = "POST /a HTTP/1.1\r\nExpect: 200-maybe\r\nContent-Length: 2\r\n\r\n{}";
  tpr_http_reader_init(&rd, 100);
  assert_int_equal(tpr_http_reader_feed(&rd, odd, strlen(odd), &used, &status, msg, sizeof msg), TPR_HTTP_BAD);
  assert_int_equal(status, 417);
  tpr_http_reader_free(&rd);
  // Too large is 413 before any 100 Continue.
  const char *big = "POST /a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 101\r\n\r\n";
  tpr_http_reader_init(&rd, 100);
  assert_int_equal(tpr_http_reader_feed(&rd, big, strlen(big), &used, &status, msg, sizeof msg), TPR_HTTP_BAD);
  assert_int_equal(status, 413);
  tpr_http_reader_free(&rd);
}

// A byte-level token may decode to 0x00: the answer keeps it (as \u0000)
// and what follows it, in the full response and in a streamed chunk.
static void test_answer_text_bytes(void **state) {
  (void)state;
  const char text[] = "a\0b\"c\\d\n\x01\xe6\x97\xa5 end";  // NUL, quote, backslash, newline, 0x01, 日
  size_t n = sizeof text - 1;
  tpr_oai_choice c = {.index = 0, .text = text, .text_len = n, .finish = "stop"};
  tpr_oai_choice d = {.index = 0, .text = text, .text_len = n, .role = true};
  char *full = tpr_oai_response_json(false, "cmpl-1", 7, "m", &c, 1, 3, 4);
  char *chunk = tpr_oai_chunk_json(true, "chatcmpl-1", 7, "m", &d);
  assert_non_null(full);
  assert_non_null(chunk);
  const char *want = "\"a\\u0000b\\\"c\\\\d\\n\\u0001\xe6\x97\xa5 end\"";
  assert_non_null(strstr(full, want));
  assert_non_null(strstr(chunk, want));
  // Both bodies are JSON cJSON reads, with the fields after the text intact.
  cJSON *j = cJSON_Parse(full);
  assert_non_null(j);
  cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason")), "stop");
  cJSON_Delete(j);
  // Negative control: only the first byte, not the whole text.
  c.text_len = 1;
  char *cut = tpr_oai_response_json(false, "cmpl-1", 7, "m", &c, 1, 3, 4);
  assert_null(strstr(cut, want));
  assert_non_null(strstr(cut, "\"text\":\"a\""));
  free(full);
  free(chunk);
  free(cut);
}

// Logprobs in each endpoint's shape, n choices with their indices.
static void test_answer_logprobs(void **state) {
  (void)state;
  tpr_oai_logprob lp[2] = {
      {.token = "he", .token_len = 2, .logprob = -0.25, .text_offset = 0, .n_top = 2,
       .top_token = {"he", "ha"}, .top_len = {2, 2}, .top_logprob = {-0.25, -1.5}},
      {.token = "llo", .token_len = 3, .logprob = -2, .text_offset = 2, .n_top = 1,
       .top_token = {"y"}, .top_len = {1}, .top_logprob = {-0.5}},
  };
  tpr_oai_choice c[2] = {{.index = 0, .text = "hello", .text_len = 5, .finish = "length", .has_logprobs = true,
                          .lp = lp, .n_lp = 2},
                         {.index = 1, .text = "x", .text_len = 1, .finish = "stop", .has_logprobs = true}};
  char *s = tpr_oai_response_json(false, "cmpl-2", 7, "m", c, 2, 3, 3);
  cJSON *j = cJSON_Parse(s);
  assert_non_null(j);
  cJSON *choices = cJSON_GetObjectItem(j, "choices");
  assert_int_equal(cJSON_GetArraySize(choices), 2);
  cJSON *l = cJSON_GetObjectItem(cJSON_GetArrayItem(choices, 0), "logprobs");
  assert_string_equal(cJSON_GetStringValue(cJSON_GetArrayItem(cJSON_GetObjectItem(l, "tokens"), 1)), "llo");
  assert_true(cJSON_GetArrayItem(cJSON_GetObjectItem(l, "token_logprobs"), 1)->valuedouble == -2);
  cJSON *top0 = cJSON_GetArrayItem(cJSON_GetObjectItem(l, "top_logprobs"), 0);
  assert_true(cJSON_GetObjectItem(top0, "ha")->valuedouble == -1.5);
  assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(l, "text_offset"), 1)->valueint, 2);
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(choices, 1), "index")->valueint, 1);
  cJSON_Delete(j);
  free(s);
  s = tpr_oai_response_json(true, "chatcmpl-2", 7, "m", c, 1, 3, 2);
  j = cJSON_Parse(s);
  l = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs");
  cJSON *t1 = cJSON_GetArrayItem(cJSON_GetObjectItem(l, "content"), 1);
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(t1, "token")), "llo");
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(t1, "bytes")), 3);
  assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(t1, "bytes"), 0)->valueint, 'l');
  cJSON *tt = cJSON_GetArrayItem(cJSON_GetObjectItem(t1, "top_logprobs"), 0);
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(tt, "token")), "y");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(l, "refusal")));
  cJSON_Delete(j);
  free(s);
}

// Every request parameter is honoured or refused with its name.
static void test_request_params(void **state) {
  (void)state;
  tpr_oai_request r;
  tpr_oai_error e;
  const char *ok = "{\"prompt\": [5, 6], \"n\": 3, \"logprobs\": 4, \"logit_bias\": {\"7\": -2.5}, "
                   "\"frequency_penalty\": 0.5, \"presence_penalty\": -1, \"repetition_penalty\": 1.2, "
                   "\"min_tokens\": 2, \"echo\": false, \"user\": \"u\", \"seed\": 9, \"best_of\": 3}";
  assert_true(tpr_oai_parse(ok, strlen(ok), false, &(tpr_chat_renderer){.builtin = TPR_CHAT_CHATML}, "m", &r, &e));
  assert_int_equal(r.n_prompt_ids, 2);
  assert_int_equal(r.n, 3);
  assert_true(r.logprobs && r.top_logprobs == 4);
  assert_int_equal(r.n_bias, 1);
  assert_true(r.bias_ids[0] == 7 && r.bias[0] == -2.5f);
  assert_true(r.frequency_penalty == 0.5 && r.presence_penalty == -1 && r.repetition_penalty == 1.2);
  assert_true(r.min_tokens == 2 && r.has_seed && r.seed == 9 && r.max_tokens == 0);
  tpr_oai_request_free(&r);
  const char *unseeded = "{\"prompt\": \"a\"}";
  assert_true(tpr_oai_parse(unseeded, strlen(unseeded), false, &(tpr_chat_renderer){.builtin = TPR_CHAT_CHATML}, "m", &r, &e));
  assert_false(r.has_seed);
  assert_false(r.logprobs);
  tpr_oai_request_free(&r);
  static const struct {
    bool chat;
    const char *body, *param;
  } bad[] = {
      {false, "{\"prompt\": \"a\", \"frobnicate\": 1}", "frobnicate"},
      {false, "{\"prompt\": \"a\", \"suffix\": \"z\"}", "suffix"},
      {false, "{\"prompt\": \"a\", \"best_of\": 2}", "best_of"},
      {false, "{\"prompt\": \"a\", \"logprobs\": true}", "logprobs"},
      {false, "{\"prompt\": \"a\", \"echo\": true, \"logprobs\": 0}", "echo"},
      {false, "{\"prompt\": [\"a\", \"b\"]}", "prompt"},
      {false, "{\"prompt\": \"a\", \"logit_bias\": {\"-3\": 1}}", "logit_bias"},
      {false, "{\"prompt\": \"a\", \"presence_penalty\": -2.5}", "presence_penalty"},
      {false, "{\"prompt\": \"a\", \"top_logprobs\": 2}", "top_logprobs"},
      {true, "{\"messages\": [], \"tools\": [{}]}", "tools"},
      {true, "{\"messages\": [], \"response_format\": {\"type\": \"json_schema\"}}", "response_format"},
      {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": false, \"top_logprobs\": 1}",
       "top_logprobs"},
      {true, "{\"messages\": [], \"store\": true}", "store"},
      {true, "{\"messages\": [], \"echo\": true}", "echo"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    bool parsed = tpr_oai_parse(bad[i].body, strlen(bad[i].body), bad[i].chat, &(tpr_chat_renderer){.builtin = TPR_CHAT_CHATML}, "m", &r, &e);
    if (parsed) tpr_oai_request_free(&r);
    assert_false(parsed);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, bad[i].param);
  }
  // Accepted as asking for nothing: tools [], tool_choice "none", a text format.
  const char *trivial = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [], "
                        "\"tool_choice\": \"none\", \"response_format\": {\"type\": \"text\"}, \"store\": false}";
  assert_true(tpr_oai_parse(trivial, strlen(trivial), true, &(tpr_chat_renderer){.builtin = TPR_CHAT_CHATML}, "m", &r, &e));
  tpr_oai_request_free(&r);
  printf("%zu refusals name their parameter\n", sizeof bad / sizeof bad[0]);
}

// tools and tool_choice: validated, rendered by a Jinja template only;
// "required" / a named function decode under a call's grammar (hermes and
// llama3_json formats only); response_format json_object / json_schema
// under theirs.
static void test_request_tools(void **state) {
  (void)state;
  const char *tmpl_text = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}<tools>{% for t in tools %}"
                          "{{ t.function.name }};{% endfor %}</tools>{% endif %}<think>\n";
  tpr_chat_jinja j = {0};
  tpr_jinja_error jerr = {0};
  assert_int_equal(tpr_chat_jinja_from_text(tmpl_text, strlen(tmpl_text), &j, &jerr), TPR_OK);
  tpr_chat_renderer jr = {.jinja = &j, .tool_format = TPR_TOOL_FMT_HERMES, .reasoning = true};
  tpr_chat_renderer builtin = {.builtin = TPR_CHAT_CHATML, .tool_format = TPR_TOOL_FMT_HERMES, .reasoning = true};
  tpr_chat_renderer no_parser = {.jinja = &j};
  tpr_chat_renderer xml = {.jinja = &j, .tool_format = TPR_TOOL_FMT_MINIMAX_M2};
  tpr_oai_request r;
  tpr_oai_error e;
#define MSG "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]"
#define TOOL "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}}"
  const char *ok = "{" MSG ", \"tools\": [" TOOL "], \"parallel_tool_calls\": false}";
  assert_true(tpr_oai_parse(ok, strlen(ok), true, &jr, "m", &r, &e));
  assert_string_equal(r.prompt, "hi<tools>get_weather;</tools><think>");  // jinja2 drops the trailing newline
  assert_int_equal(r.tool_format, TPR_TOOL_FMT_HERMES);
  assert_true(r.reasoning && r.starts_in_reasoning && !r.parallel_tool_calls);
  assert_int_equal(cJSON_GetArraySize(r.tools), 1);
  tpr_oai_request_free(&r);
  const char *none = "{" MSG ", \"tools\": [" TOOL "], \"tool_choice\": \"none\"}";
  assert_true(tpr_oai_parse(none, strlen(none), true, &jr, "m", &r, &e));
  assert_int_equal(r.tool_format, TPR_TOOL_FMT_NONE);  // rendered, not parsed
  assert_true(r.parallel_tool_calls);
  tpr_oai_request_free(&r);
  assert_true(tpr_oai_parse(none, strlen(none), true, &no_parser, "m", &r, &e));
  assert_false(r.reasoning);
  tpr_oai_request_free(&r);
  const char *forced[] = {
      "{" MSG ", \"tools\": [" TOOL "], \"tool_choice\": \"required\"}",
      "{" MSG ", \"tools\": [" TOOL "], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
      "\"get_weather\"}}}",
      "{" MSG ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": true}}], "
      "\"tool_choice\": \"required\"}",
      "{" MSG ", \"response_format\": {\"type\": \"json_object\"}}",
      "{" MSG ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": "
      "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\"]}}}}",
  };
  for (size_t i = 0; i < sizeof forced / sizeof forced[0]; i++) {
    if (!tpr_oai_parse(forced[i], strlen(forced[i]), true, &jr, "m", &r, &e)) fail_msg("%s: %s", forced[i], e.message);
    assert_non_null(r.grammar);
    assert_string_equal(r.grammar_what, i < 3 ? "tool_choice" : "response_format");
    tpr_oai_request_free(&r);
  }
  const char *plain = "{" MSG "}";  // no tools: reasoning still separated
  assert_true(tpr_oai_parse(plain, strlen(plain), true, &jr, "m", &r, &e));
  assert_true(r.reasoning && r.starts_in_reasoning && !r.tools);
  tpr_oai_request_free(&r);
  static const struct {
    int which;  // 0 jinja, 1 built-in, 2 jinja without a tool parser
    const char *body, *param;
  } bad[] = {
      {3, "{" MSG ", \"tools\": [" TOOL "], \"tool_choice\": \"required\"}", "tool_choice"},  // not JSON calls
      {0, "{" MSG ", \"tools\": [" TOOL "], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
          "\"nope\"}}}", "tool_choice"},
      {0, "{" MSG ", \"tools\": [" TOOL "], \"tool_choice\": \"required\", \"response_format\": {\"type\": "
          "\"json_object\"}}", "tool_choice"},
      {0, "{" MSG ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", "
          "\"schema\": {\"type\": \"string\", \"pattern\": \"a+\"}}}}", "response_format"},
      {0, "{" MSG ", \"response_format\": {\"type\": \"json_object\"}, \"ignore_eos\": true}", "ignore_eos"},
      {0, "{" MSG ", \"response_format\": {\"type\": \"yaml\"}}", "response_format"},
      {0, "{" MSG ", \"tools\": [" TOOL "], \"tool_choice\": \"sometimes\"}", "tool_choice"},
      {0, "{" MSG ", \"tools\": {\"a\": 1}}", "tools"},
      {0, "{" MSG ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"\"}}]}", "tools"},
      {0, "{" MSG ", \"tools\": [{\"type\": \"code\", \"function\": {\"name\": \"f\"}}]}", "tools"},
      {0, "{" MSG ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": 3}}]}",
       "tools"},
      {0, "{" MSG ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": true}}]}",
       "tools"},
      {0, "{" MSG ", \"tools\": [" TOOL "], \"parallel_tool_calls\": 1}", "parallel_tool_calls"},
      {1, "{" MSG ", \"tools\": [" TOOL "]}", "tools"},
      {2, "{" MSG ", \"tools\": [" TOOL "]}", "tool_choice"},
      {0, "{" MSG ", \"tool_choice\": \"auto\"}", "tool_choice"},
      {0, "{" MSG ", \"tools\": [], \"tool_choice\": \"auto\"}", "tool_choice"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const tpr_chat_renderer *t = bad[i].which == 0 ? &jr : bad[i].which == 1 ? &builtin : bad[i].which == 2 ? &no_parser : &xml;
    bool parsed = tpr_oai_parse(bad[i].body, strlen(bad[i].body), true, t, "m", &r, &e);
    if (parsed) tpr_oai_request_free(&r);
    assert_false(parsed);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, bad[i].param);
  }
#undef MSG
#undef TOOL
  tpr_chat_jinja_free(&j);
}

// The parsed answer in vLLM's shapes: message.content null beside tool
// calls, reasoning_content, tool_calls with string arguments; a delta's
// calls carry their index.
static void test_answer_tool_calls(void **state) {
  (void)state;
  tpr_tool_call calls[2] = {{.name = "f", .arguments = "{\"x\":1}"}, {.name = "g", .arguments = "{}"}};
  const char ids[2][32] = {"call_0123", "call_4567"};
  tpr_oai_choice c = {.index = 0, .text = "\n", .text_len = 1, .finish = "tool_calls", .parsed = true,
                      .content_null = true, .has_reasoning = true, .reasoning = "why", .reasoning_len = 3,
                      .calls = calls, .n_calls = 2, .call_ids = ids};
  char *s = tpr_oai_response_json(true, "chatcmpl-3", 7, "m", &c, 1, 3, 2);
  cJSON *j = cJSON_Parse(s);
  assert_non_null(j);
  cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), *m = cJSON_GetObjectItem(ch, "message");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(m, "content")));
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(m, "reasoning_content")), "why");
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason")), "tool_calls");
  cJSON *t1 = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "tool_calls"), 1);
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(t1, "id")), "call_4567");
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(t1, "type")), "function");
  cJSON *f0 = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "tool_calls"), 0), "function");
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(f0, "arguments")), "{\"x\":1}");
  assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "tool_calls"), 0), "index"));
  cJSON_Delete(j);
  free(s);
  // No reasoning: reasoning_content null; content kept.
  tpr_oai_choice d = {.index = 0, .text = "ok", .text_len = 2, .finish = "stop", .parsed = true,
                      .has_reasoning = true};
  s = tpr_oai_response_json(true, "chatcmpl-4", 7, "m", &d, 1, 3, 2);
  assert_non_null(strstr(s, "\"content\":\"ok\",\"reasoning_content\":null"));
  assert_null(strstr(s, "tool_calls"));
  free(s);
  // A delta: the second call alone, numbered 1; no content field; reasoning absent.
  tpr_oai_choice e = {.index = 0, .parsed = true, .has_reasoning = true, .calls = calls + 1, .n_calls = 1,
                      .call_index0 = 1, .call_ids = ids + 1};
  s = tpr_oai_chunk_json(true, "chatcmpl-5", 7, "m", &e);
  j = cJSON_Parse(s);
  cJSON *delta = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta");
  assert_null(cJSON_GetObjectItem(delta, "content"));
  assert_null(cJSON_GetObjectItem(delta, "reasoning_content"));
  cJSON *dt = cJSON_GetArrayItem(cJSON_GetObjectItem(delta, "tool_calls"), 0);
  assert_int_equal(cJSON_GetObjectItem(dt, "index")->valueint, 1);
  assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(dt, "function"), "name")), "g");
  cJSON_Delete(j);
  free(s);
}

// Streamed chunks of a parsed chat answer, from a scripted text arriving in
// random pieces (as tokens detokenize), through the response code
// (tpr_parsed_delta, tpr_oai_chunk_json) and accumulated as a client does:
// the same reasoning, calls and (up to whitespace beside calls) content as
// the non-streamed answer of the same text, each call once, whole, with its
// index and an id; the last chunk's finish_reason "tool_calls".
typedef struct streamed {
  char content[1024], reasoning[1024], name[4][32], args[4][256], id[4][32];
  int n_calls, chunks;
  char finish[32];
} streamed;

static void accumulate(const char *chunk_json, streamed *a) {
  cJSON *j = cJSON_Parse(chunk_json);
  assert_non_null(j);
  cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), *d = cJSON_GetObjectItem(ch, "delta");
  const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(d, "content"));
  if (t) strcat(a->content, t);
  if ((t = cJSON_GetStringValue(cJSON_GetObjectItem(d, "reasoning_content")))) strcat(a->reasoning, t);
  cJSON *call;
  cJSON_ArrayForEach(call, cJSON_GetObjectItem(d, "tool_calls")) {
    int k = cJSON_GetObjectItem(call, "index")->valueint;
    assert_int_equal(k, a->n_calls);  // each call once, in order
    cJSON *f = cJSON_GetObjectItem(call, "function");
    snprintf(a->name[k], sizeof a->name[k], "%s", cJSON_GetStringValue(cJSON_GetObjectItem(f, "name")));
    snprintf(a->args[k], sizeof a->args[k], "%s", cJSON_GetStringValue(cJSON_GetObjectItem(f, "arguments")));
    snprintf(a->id[k], sizeof a->id[k], "%s", cJSON_GetStringValue(cJSON_GetObjectItem(call, "id")));
    a->n_calls++;
  }
  if (cJSON_IsString(cJSON_GetObjectItem(ch, "finish_reason")))
    snprintf(a->finish, sizeof a->finish, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason")));
  a->chunks++;
  cJSON_Delete(j);
}

static void test_answer_parsed_stream(void **state) {
  (void)state;
  static const struct {
    tpr_tool_format fmt;
    bool starts_in, parallel;
    const char *text;
    int n_calls;
  } cases[] = {
      {TPR_TOOL_FMT_HERMES, false, true,
       "<think>the user wants weather</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", 2},
      {TPR_TOOL_FMT_HERMES, false, false,  // parallel_tool_calls false: the first call only
       "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>", 1},
      {TPR_TOOL_FMT_MINIMAX_M2, true, true,
       "plan it</think>Let me look.<minimax:tool_call><invoke name=\"get_weather\"><parameter name=\"city\">Oslo"
       "</parameter></invoke></minimax:tool_call>", 1},
      {TPR_TOOL_FMT_HERMES, true, true, "only thinking</think>The answer is 4.", 0},
  };
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    tpr_oai_request q = {.chat = true, .tool_format = cases[t].fmt, .reasoning = true,
                         .starts_in_reasoning = cases[t].starts_in, .parallel_tool_calls = cases[t].parallel};
    const char *text = cases[t].text;
    size_t n = strlen(text);
    tpr_parsed_choice full;
    tpr_parsed_init(&full, &q);
    assert_true(tpr_parsed_feed(&full, text, n, true));
    tpr_oai_choice fo = {.index = 0};
    tpr_parsed_full(&full, "stop", &fo);
    char *fj = tpr_oai_response_json(true, "chatcmpl-9", 7, "m", &fo, 1, 3, 4);
    cJSON *fr = cJSON_Parse(fj);
    cJSON *fch = cJSON_GetArrayItem(cJSON_GetObjectItem(fr, "choices"), 0), *fm = cJSON_GetObjectItem(fch, "message");
    const char *want_finish = cases[t].n_calls ? "tool_calls" : "stop";
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(fch, "finish_reason")), want_finish);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(fm, "tool_calls")), cases[t].n_calls);
    for (int rep = 0; rep < 50; rep++) {
      tpr_parsed_choice pc;
      tpr_parsed_init(&pc, &q);
      streamed a = {0};
      for (size_t at = 0; at < n;) {  // pieces of 1-6 bytes, as tokens come
        size_t upto = at + (size_t)tt_randint(1, 6);
        if (upto > n) upto = n;
        assert_true(tpr_parsed_feed(&pc, text, upto, false));
        tpr_oai_choice oc = {.index = 0, .role = at == 0};
        if (tpr_parsed_delta(&pc, NULL, &oc) || at == 0) {
          char *j = tpr_oai_chunk_json(true, "chatcmpl-9", 7, "m", &oc);
          accumulate(j, &a);
          free(j);
        }
        at = upto;
      }
      assert_true(tpr_parsed_feed(&pc, text, n, true));
      tpr_oai_choice last = {.index = 0};
      tpr_parsed_delta(&pc, "stop", &last);
      char *j = tpr_oai_chunk_json(true, "chatcmpl-9", 7, "m", &last);
      accumulate(j, &a);
      free(j);
      assert_string_equal(a.finish, want_finish);
      const char *fc = cJSON_GetStringValue(cJSON_GetObjectItem(fm, "content"));
      if (fc) assert_string_equal(a.content, fc);
      else assert_true(tpr_text_blank(a.content, strlen(a.content)));
      const char *frs = cJSON_GetStringValue(cJSON_GetObjectItem(fm, "reasoning_content"));
      assert_string_equal(a.reasoning, frs ? frs : "");
      assert_int_equal(a.n_calls, cases[t].n_calls);
      for (int k = 0; k < a.n_calls; k++) {
        cJSON *fcall = cJSON_GetArrayItem(cJSON_GetObjectItem(fm, "tool_calls"), k);
        cJSON *ff = cJSON_GetObjectItem(fcall, "function");
        assert_string_equal(a.name[k], cJSON_GetStringValue(cJSON_GetObjectItem(ff, "name")));
        assert_string_equal(a.args[k], cJSON_GetStringValue(cJSON_GetObjectItem(ff, "arguments")));
        assert_int_equal(strlen(a.id[k]), 29);  // "call_" + 24 hex digits
        assert_true(strncmp(a.id[k], "call_", 5) == 0 && strspn(a.id[k] + 5, "0123456789abcdef") == 24);
        if (k) assert_string_not_equal(a.id[k], a.id[k - 1]);
      }
      tpr_parsed_free(&pc);
    }
    cJSON_Delete(fr);
    free(fj);
    tpr_parsed_free(&full);
  }
}

int main(void) {
  tt_seed_from_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_templates_render),
      cmocka_unit_test(test_templates_refuse),
      cmocka_unit_test(test_templates_detect),
      cmocka_unit_test(test_http_reader),
      cmocka_unit_test(test_http_reader_expect),
      cmocka_unit_test(test_answer_text_bytes),
      cmocka_unit_test(test_answer_logprobs),
      cmocka_unit_test(test_request_params),
      cmocka_unit_test(test_request_tools),
      cmocka_unit_test(test_answer_tool_calls),
      cmocka_unit_test(test_answer_parsed_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
