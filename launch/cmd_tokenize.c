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

// Reads every line of `path` ('-': stdin) and calls fn on each parsed JSON
// value, printing what it returns on one line. Many texts under one load: what
// a parity check against the reference library runs (a few hundred strings per
// tokenizer). Line numbers in errors count from 1.
typedef cJSON *(*jsonl_fn)(const tpr_tokenizer *t, const cJSON *in, bool flag, tpr_status *rc);

static int run_jsonl(const char *cmd, const char *model, const char *path, bool flag, jsonl_fn fn) {
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "tpr %s: cannot open %s: %s\n", cmd, path, strerror(errno));
    return 1;
  }
  tpr_tokenizer *t = NULL;
  tpr_status rc = tpr_tokenizer_load(model, &t);
  char *line = NULL;
  size_t cap = 0;
  long no = 0, bad = 0;  // bad: the line an error is about
  ssize_t got;
  while (rc == TPR_OK && (got = getline(&line, &cap, f)) >= 0) {
    no++;
    if (got == 0 || (got == 1 && line[0] == '\n')) continue;
    cJSON *in = cJSON_ParseWithLength(line, (size_t)got);
    if (in && (strstr(line, "\\u0000") || strstr(line, "\\U0000"))) {  // cJSON strings end at a NUL
      cJSON_Delete(in);
      rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "a NUL (\\u0000) in a --jsonl line is not supported");
      bad = no;
      break;
    }
    if (!in) {
      rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "not JSON");
      bad = no;
      break;
    }
    cJSON *out = fn(t, in, flag, &rc);
    cJSON_Delete(in);
    if (rc != TPR_OK) {
      cJSON_Delete(out);
      bad = no;
      break;
    }
    if (!out || !tpr_cli_print_json(out)) rc = TPR_FAIL(TPR_ERR_OOM, "%s: JSON output", cmd);
  }
  free(line);
  if (f != stdin) fclose(f);
  tpr_tokenizer_free(t);
  if (rc != TPR_OK) {
    if (bad) fprintf(stderr, "tpr %s: error: %s line %ld: %s\n", cmd, path, bad, tpr_last_error());
    else fprintf(stderr, "tpr %s: error: %s\n", cmd, tpr_last_error());
    return rc == TPR_ERR_INVALID_ARG ? 2 : 1;
  }
  return 0;
}

// A JSON string -> the JSON array of its ids.
static cJSON *encode_one(const tpr_tokenizer *t, const cJSON *in, bool add_special, tpr_status *rc) {
  if (!cJSON_IsString(in)) {
    *rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "each --jsonl line must be a JSON string");
    return NULL;
  }
  int32_t *ids = NULL;
  size_t n = 0;
  *rc = tpr_tokenizer_encode(t, in->valuestring, strlen(in->valuestring), add_special, &ids, &n);
  cJSON *a = *rc == TPR_OK ? cJSON_CreateArray() : NULL;
  for (size_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
  free(ids);
  return a;
}

static int tokenize_jsonl(const char *model, const char *path, bool add_special) {
  return run_jsonl("tokenize", model, path, add_special, encode_one);
}

int tpr_cmd_tokenize(int argc, char **argv) {
  const char *model = NULL, *text = NULL, *file = NULL, *jsonl = NULL;
  bool json = false, no_special = false;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory holding tokenizer.json (or the file itself)"},
      {"text", TPR_ARG_STR, &text, "the text to encode"},
      {"file", TPR_ARG_STR, &file, "a file whose bytes are the text to encode ('-' for stdin)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object: ids and their token strings"},
      {"no-special", TPR_ARG_FLAG, &no_special, "do not add the template's special tokens (e.g. BOS)"},
      {"jsonl", TPR_ARG_STR, &jsonl,
       "a file of JSON strings, one a line ('-' for stdin): prints a JSON array of ids for each, one a line"},
  };
  const char *usage = "usage: tpr tokenize --model DIR (--text STR | --file F | --jsonl F) [--json] [--no-special]\n"
                      "prints the ids comma-separated (special tokens written in the text are always recognised)";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!model || (text != NULL) + (file != NULL) + (jsonl != NULL) != 1 || (jsonl && json)) {
    fprintf(stderr, "tpr tokenize: give --model and exactly one of --text, --file or --jsonl (--json is not for --jsonl)\n%s\n",
            usage);
    return 2;
  }
  if (jsonl) return tokenize_jsonl(model, jsonl, !no_special);
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

// A JSON array of ids -> the decoded text as a JSON string.
static cJSON *decode_one(const tpr_tokenizer *t, const cJSON *in, bool skip, tpr_status *rc) {
  int n = cJSON_IsArray(in) ? cJSON_GetArraySize(in) : -1;
  int32_t *ids = n >= 0 ? malloc(((size_t)n + 1) * sizeof *ids) : NULL;
  if (!ids) {
    *rc = n < 0 ? TPR_FAIL(TPR_ERR_INVALID_ARG, "each --jsonl line must be a JSON array of ids")
                : TPR_FAIL(TPR_ERR_OOM, "detokenize: ids");
    return NULL;
  }
  int k = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, in) {
    if (!cJSON_IsNumber(e) || e->valuedouble != (double)(int32_t)e->valuedouble) {
      free(ids);
      *rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "each --jsonl line must be a JSON array of ids");
      return NULL;
    }
    ids[k++] = (int32_t)e->valuedouble;
  }
  char *text = NULL;
  size_t len = 0;
  *rc = tpr_tokenizer_decode(t, ids, (size_t)k, skip, &text, &len);
  free(ids);
  if (*rc == TPR_OK && strlen(text) != len)  // a NUL inside: a JSON string here would end there
    *rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "the decoded text holds a NUL, which --jsonl cannot print");
  cJSON *s = *rc == TPR_OK ? cJSON_CreateString(text) : NULL;
  free(text);
  return s;
}

int tpr_cmd_detokenize(int argc, char **argv) {
  const char *model = NULL, *ids_arg = NULL, *jsonl = NULL;
  bool skip = false;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory holding tokenizer.json (or the file itself)"},
      {"ids", TPR_ARG_STR, &ids_arg, "comma-separated token ids"},
      {"skip-special", TPR_ARG_FLAG, &skip, "leave out special tokens (BOS, EOS, chat markers)"},
      {"jsonl", TPR_ARG_STR, &jsonl,
       "a file of JSON arrays of ids, one a line ('-' for stdin): prints each decoded text as a JSON string, one a line"},
  };
  const char *usage = "usage: tpr detokenize --model DIR (--ids 1,2,3 | --jsonl F) [--skip-special]\nprints the decoded text";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!model || !ids_arg == !jsonl) {
    fprintf(stderr, "tpr detokenize: give --model and exactly one of --ids or --jsonl\n%s\n", usage);
    return 2;
  }
  if (jsonl) return run_jsonl("detokenize", model, jsonl, skip, decode_one);
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
