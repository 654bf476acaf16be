// tpr tokenize / tpr detokenize: a checkpoint's tokenizer.json on the command
// line (tokenizer/tokenizer.h). No mpirun, no model weights.
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "runtime/file_io.h"
#include "tokenizer/tokenizer.h"

int tpr_cmd_tokenize(int argc, char **argv) {
  const char *model = NULL, *text = NULL, *file = NULL;
  bool json = false, no_special = false;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory holding tokenizer.json (or the file itself)"},
      {"text", TPR_ARG_STR, &text, "the text to encode"},
      {"file", TPR_ARG_STR, &file, "a file whose bytes are the text to encode ('-' for stdin)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object: ids and their token strings"},
      {"no-special", TPR_ARG_FLAG, &no_special, "do not add the template's special tokens (e.g. BOS)"},
  };
  const char *usage = "usage: tpr tokenize --model DIR (--text STR | --file F) [--json] [--no-special]\n"
                      "prints the ids comma-separated (special tokens written in the text are always recognised)";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!model || !text == !file) {
    fprintf(stderr, "tpr tokenize: give --model and exactly one of --text or --file\n%s\n", usage);
    return 2;
  }
  uint8_t *bytes = NULL;
  size_t len = text ? strlen(text) : 0;
  tpr_tokenizer *t = NULL;
  int32_t *ids = NULL;
  size_t n = 0;
  tpr_status rc = TPR_OK;
  if (file) rc = tpr_file_read(strcmp(file, "-") == 0 ? "/dev/stdin" : file, &bytes, &len);
  if (rc == TPR_OK) rc = tpr_tokenizer_load(model, &t);
  if (rc == TPR_OK) rc = tpr_tokenizer_encode(t, text ? text : (const char *)bytes, len, !no_special, &ids, &n);
  if (rc == TPR_OK && json) {
    cJSON *j = cJSON_CreateObject(), *ja = cJSON_AddArrayToObject(j, "ids"), *jt = cJSON_AddArrayToObject(j, "tokens");
    for (size_t i = 0; i < n; i++) {
      cJSON_AddItemToArray(ja, cJSON_CreateNumber(ids[i]));
      cJSON_AddItemToArray(jt, cJSON_CreateString(tpr_tokenizer_id_to_token(t, ids[i])));
    }
    cJSON_AddNumberToObject(j, "count", (double)n);
    if (!tpr_cli_print_json(j)) rc = TPR_FAIL(TPR_ERR_OOM, "tokenize: JSON output");
  } else if (rc == TPR_OK) {
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    printf("\n");
  }
  free(ids);
  free(bytes);
  tpr_tokenizer_free(t);
  if (rc != TPR_OK) {
    fprintf(stderr, "tpr tokenize: error: %s\n", tpr_last_error());
    return 1;
  }
  return 0;
}

// "1,2, 3" -> ids; false with a message on anything else.
static bool parse_ids(const char *s, int32_t **out, size_t *n) {
  size_t cap = 16;
  *n = 0;
  *out = malloc(cap * sizeof **out);
  while (*out && *s) {
    while (*s == ' ' || *s == ',') s++;
    if (!*s) break;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || errno || v < INT32_MIN || v > INT32_MAX || (*end && *end != ',' && *end != ' ')) {
      fprintf(stderr, "tpr detokenize: --ids: '%s' is not a list of integers\n", s);
      return false;
    }
    if (*n == cap) {
      int32_t *g = realloc(*out, (cap *= 2) * sizeof **out);
      if (!g) break;
      *out = g;
    }
    (*out)[(*n)++] = (int32_t)v;
    s = end;
  }
  if (!*out) fprintf(stderr, "tpr detokenize: out of memory\n");
  return *out != NULL;
}

int tpr_cmd_detokenize(int argc, char **argv) {
  const char *model = NULL, *ids_arg = NULL;
  bool skip = false;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory holding tokenizer.json (or the file itself)"},
      {"ids", TPR_ARG_STR, &ids_arg, "comma-separated token ids"},
      {"skip-special", TPR_ARG_FLAG, &skip, "leave out special tokens (BOS, EOS, chat markers)"},
  };
  const char *usage = "usage: tpr detokenize --model DIR --ids 1,2,3 [--skip-special]\nprints the decoded text";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!model || !ids_arg) {
    fprintf(stderr, "tpr detokenize: give --model and --ids\n%s\n", usage);
    return 2;
  }
  int32_t *ids = NULL;
  size_t n;
  if (!parse_ids(ids_arg, &ids, &n)) {
    free(ids);
    return 2;
  }
  tpr_tokenizer *t = NULL;
  char *text = NULL;
  size_t len = 0;
  tpr_status rc = tpr_tokenizer_load(model, &t);
  if (rc == TPR_OK) rc = tpr_tokenizer_decode(t, ids, n, skip, &text, &len);
  if (rc == TPR_OK) {
    fwrite(text, 1, len, stdout);
    printf("\n");
  }
  free(text);
  free(ids);
  tpr_tokenizer_free(t);
  if (rc != TPR_OK) {
    fprintf(stderr, "tpr detokenize: error: %s\n", tpr_last_error());
    return rc == TPR_ERR_INVALID_ARG ? 2 : 1;
  }
  return 0;
}
