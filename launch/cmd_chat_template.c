// tpr chat-template: render a checkpoint's Jinja chat template (jinja/chat.h)
// over a conversation and print the prompt, as transformers'
// apply_chat_template(tokenize=False) would (and with --ids, its token ids).
// No mpirun, no weights: a tool to see what a model will be given.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/chat.h"
#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "runtime/file_io.h"
#include "tokenizer/tokenizer.h"

static char *read_text(const char *path) {
  uint8_t *bytes = NULL;
  size_t len = 0;
  if (tpr_file_read(strcmp(path, "-") == 0 ? "/dev/stdin" : path, &bytes, &len) != TPR_OK) return NULL;
  char *s = malloc(len + 1);
  if (s) {
    memcpy(s, bytes, len);
    s[len] = 0;
  }
  free(bytes);
  return s;
}

int tpr_cmd_chat_template(int argc, char **argv) {
  const char *model = NULL, *tmpl = NULL, *messages = NULL, *tools = NULL, *documents = NULL, *kwargs = NULL;
  bool gen = false, ids = false, json = false;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model,
       "checkpoint directory: its chat_template.jinja or tokenizer_config.json's chat_template, and its special tokens"},
      {"template", TPR_ARG_STR, &tmpl, "a Jinja template file instead of a checkpoint's (special tokens from --model if given)"},
      {"messages", TPR_ARG_STR, &messages,
       "JSON file: the list of messages ('-': stdin); default [{\"role\":\"user\",\"content\":\"Hello\"}]"},
      {"tools", TPR_ARG_STR, &tools, "JSON file: the list of tool definitions (the template's tools)"},
      {"documents", TPR_ARG_STR, &documents, "JSON file: the list of documents (the template's documents)"},
      {"add-generation-prompt", TPR_ARG_FLAG, &gen, "end with the assistant turn's opening (add_generation_prompt)"},
      {"kwargs", TPR_ARG_STR, &kwargs, "a JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'"},
      {"ids", TPR_ARG_FLAG, &ids, "also print the prompt's token ids (needs --model's tokenizer.json)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object: prompt, source, and with --ids ids and count"},
  };
  const char *usage =
      "usage: tpr chat-template (--model DIR | --template FILE [--model DIR]) [--messages F.json] [--tools F.json]\n"
      "                         [--documents F.json] [--add-generation-prompt] [--kwargs JSON] [--ids] [--json]\n"
      "renders the chat template as transformers' apply_chat_template does and prints the prompt exactly\n"
      "(no newline added); a template that calls raise_exception exits 1 with its message";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!model && !tmpl) {
    fprintf(stderr, "tpr chat-template: give --model or --template\n%s\n", usage);
    return 2;
  }
  if (ids && !model) {
    fprintf(stderr, "tpr chat-template: --ids needs --model (its tokenizer.json)\n");
    return 2;
  }
  if (kwargs) {
    cJSON *k = cJSON_Parse(kwargs);
    bool ok = cJSON_IsObject(k);
    cJSON_Delete(k);
    if (!ok) {
      fprintf(stderr, "tpr chat-template: --kwargs must be a JSON object\n");
      return 2;
    }
  }
  int ret = 1;
  tpr_chat_jinja cj = {0};
  tpr_jinja_error err = {0};
  char *msgs = NULL, *tl = NULL, *docs = NULL, *out = NULL, *src = NULL;
  size_t out_len = 0;
  tpr_tokenizer *tok = NULL;
  int32_t *tid = NULL;
  size_t n_ids = 0;
  tpr_status rc = TPR_OK;
  if (tmpl) {
    src = read_text(tmpl);
    if (!src) goto fail;
    rc = tpr_chat_jinja_from_text(src, strlen(src), &cj, &err);
    if (rc == TPR_OK && model) tpr_chat_jinja_special_tokens(model, &cj);
    snprintf(cj.source, sizeof cj.source, "%s", tmpl);
  } else {
    rc = tpr_chat_jinja_load(model, &cj, &err);
  }
  if (rc != TPR_OK) goto fail;
  msgs = messages ? read_text(messages) : strdup("[{\"role\": \"user\", \"content\": \"Hello\"}]");
  if (!msgs || (tools && !(tl = read_text(tools))) || (documents && !(docs = read_text(documents)))) goto fail;
  tpr_chat_inputs in = {.messages_json = msgs, .tools_json = tl, .documents_json = docs, .add_generation_prompt = gen,
                        .kwargs_json = kwargs};
  rc = tpr_chat_jinja_render(&cj, &in, NULL, &out, &out_len, &err);
  if (rc != TPR_OK) goto fail;
  if (ids) {
    rc = tpr_tokenizer_load(model, &tok);
    // apply_chat_template(tokenize=True) encodes with add_special_tokens=False
    if (rc == TPR_OK) rc = tpr_tokenizer_encode(tok, out, out_len, false, &tid, &n_ids);
    if (rc != TPR_OK) goto fail;
  }
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "prompt", out);
    cJSON_AddStringToObject(j, "source", cj.source);
    if (ids) {
      cJSON *a = cJSON_AddArrayToObject(j, "ids");
      for (size_t i = 0; i < n_ids; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(tid[i]));
      cJSON_AddNumberToObject(j, "count", (double)n_ids);
    }
    if (!tpr_cli_print_json(j)) goto fail;
  } else {
    fwrite(out, 1, out_len, stdout);
    if (ids) {
      printf("\n");
      for (size_t i = 0; i < n_ids; i++) printf(i ? ",%d" : "%d", tid[i]);
      printf("\n");
    }
  }
  ret = 0;
fail:
  if (ret) {
    if (err.raised) fprintf(stderr, "tpr chat-template: the template raised an exception: %s\n", err.message);
    else fprintf(stderr, "tpr chat-template: error: %s\n", err.message[0] ? err.message : tpr_last_error());
  }
  free(tid);
  tpr_tokenizer_free(tok);
  free(out);
  free(msgs);
  free(tl);
  free(docs);
  free(src);
  tpr_chat_jinja_free(&cj);
  return ret;
}
