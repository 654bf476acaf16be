// Minimal long-option parsing shared by the subcommands: --name VALUE or
// --name=VALUE, --help, with clear errors for unknown or malformed options.
#ifndef TPR_ARGS_H
#define TPR_ARGS_H

#include <stdbool.h>
#include <stdint.h>

// TPR_ARG_SIZE: an int64_t that sizes something (tokens, sequences, bytes): a
// whole number from 0 to TPR_SHAPE_MAX_BYTES, checked by runtime/tensor.h's
// tpr_size_mul_checked like every other size from outside, so a command can
// multiply two of them with tpr_size_mul_checked before it allocates.
typedef enum tpr_arg_type {
  TPR_ARG_INT,
  TPR_ARG_FLOAT,
  TPR_ARG_STR,
  TPR_ARG_FLAG,
  TPR_ARG_STR_LIST,
  TPR_ARG_SIZE
} tpr_arg_type;

// Destination of a TPR_ARG_STR_LIST option: every occurrence is appended.
#define TPR_ARG_LIST_MAX 64
typedef struct tpr_arg_list {
  const char *items[TPR_ARG_LIST_MAX];
  int n;
} tpr_arg_list;

typedef struct tpr_arg {
  const char *name;  // without the leading "--"
  tpr_arg_type type;
  void *dest;        // int64_t* (INT, SIZE), double*, const char**, bool*, tpr_arg_list*
  const char *help;
} tpr_arg;

typedef enum tpr_args_result { TPR_ARGS_OK = 0, TPR_ARGS_HELP = 1, TPR_ARGS_ERROR = 2 } tpr_args_result;

// Parses argv[1..argc) (argv[0] is the command name). On --help prints the
// usage to stdout; on an error prints it with the usage to stderr.
tpr_args_result tpr_args_parse(int argc, char **argv, const tpr_arg *args, int n_args, const char *usage);

#endif
