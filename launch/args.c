#include "args.h"

#include "runtime/tensor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_usage(FILE *f, const char *usage, const tpr_arg *args, int n) {
  fprintf(f, "%s\n\noptions:\n", usage);
  for (int i = 0; i < n; i++) {
    const char *meta = args[i].type == TPR_ARG_INT || args[i].type == TPR_ARG_SIZE ? " N" : args[i].type == TPR_ARG_FLOAT ? " X"
                       : args[i].type == TPR_ARG_STR ? " VALUE"
                       : args[i].type == TPR_ARG_STR_LIST ? " VALUE..." : "";
    char left[64];
    snprintf(left, sizeof left, "--%s%s", args[i].name, meta);
    fprintf(f, "  %-24s %s\n", left, args[i].help);
  }
  fprintf(f, "  %-24s %s\n", "--help", "show this help");
}

static bool parse_value(const tpr_arg *a, const char *text) {
  char *end = NULL;
  errno = 0;
  if (a->type == TPR_ARG_INT || a->type == TPR_ARG_SIZE) {
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end) return false;
    *(int64_t *)a->dest = v;
  } else if (a->type == TPR_ARG_FLOAT) {
    double v = strtod(text, &end);
    if (errno || end == text || *end) return false;
    *(double *)a->dest = v;
  } else if (a->type == TPR_ARG_STR_LIST) {
    tpr_arg_list *l = a->dest;
    if (l->n == TPR_ARG_LIST_MAX) return false;
    l->items[l->n++] = text;
  } else {
    *(const char **)a->dest = text;
  }
  return true;
}

// A size from the command line goes through the same checked helper as the
// sizes in files: negative or past TPR_SHAPE_MAX_BYTES is refused here, before
// a command computes anything from it.
static bool size_in_range(const char *cmd, const tpr_arg *a, int64_t v) {
  char what[96];
  snprintf(what, sizeof what, "--%s", a->name);
  int64_t out;
  if (v >= 0 && tpr_size_mul_checked(what, v, 1, TPR_SHAPE_MAX_BYTES, &out) == TPR_OK) return true;
  if (v < 0)
    fprintf(stderr, "%s: --%s %lld: a size cannot be negative\n", cmd, a->name, (long long)v);
  else
    fprintf(stderr, "%s: --%s %lld: larger than any size tpr accepts (2^50)\n", cmd, a->name, (long long)v);
  return false;
}

tpr_args_result tpr_args_parse(int argc, char **argv, const tpr_arg *args, int n_args, const char *usage) {
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
      print_usage(stdout, usage, args, n_args);
      return TPR_ARGS_HELP;
    }
    const tpr_arg *a = NULL;
    const char *inline_value = NULL;
    if (strncmp(s, "--", 2) == 0) {
      const char *eq = strchr(s, '=');
      size_t len = eq ? (size_t)(eq - s - 2) : strlen(s + 2);
      for (int k = 0; k < n_args && !a; k++)
        if (strlen(args[k].name) == len && strncmp(args[k].name, s + 2, len) == 0) a = &args[k];
      if (eq) inline_value = eq + 1;
    }
    if (!a) {
      fprintf(stderr, "%s: unknown option '%s'\n\n", argv[0], s);
      print_usage(stderr, usage, args, n_args);
      return TPR_ARGS_ERROR;
    }
    if (a->type == TPR_ARG_FLAG) {
      if (inline_value) {
        fprintf(stderr, "%s: --%s takes no value\n", argv[0], a->name);
        return TPR_ARGS_ERROR;
      }
      *(bool *)a->dest = true;
      continue;
    }
    const char *value = inline_value ? inline_value : (i + 1 < argc ? argv[++i] : NULL);
    if (!value) {
      fprintf(stderr, "%s: --%s needs a value\n", argv[0], a->name);
      return TPR_ARGS_ERROR;
    }
    if (!parse_value(a, value)) {
      fprintf(stderr, "%s: --%s: '%s' is not a valid %s\n", argv[0], a->name, value,
              a->type == TPR_ARG_INT ? "integer" : a->type == TPR_ARG_SIZE ? "size" : "number");
      return TPR_ARGS_ERROR;
    }
    if (a->type == TPR_ARG_SIZE && !size_in_range(argv[0], a, *(int64_t *)a->dest)) return TPR_ARGS_ERROR;
  }
  return TPR_ARGS_OK;
}
