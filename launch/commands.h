// Subcommands of the tpr CLI. Each takes argv starting at its own name and
// returns the process exit code: 0 success, 1 failure, 2 usage error.
#ifndef TPR_COMMANDS_H
#define TPR_COMMANDS_H

typedef struct tpr_command {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
} tpr_command;

int tpr_cmd_bench(int argc, char **argv);
int tpr_cmd_chat_template(int argc, char **argv);
int tpr_cmd_compare(int argc, char **argv);
int tpr_cmd_convert(int argc, char **argv);
int tpr_cmd_data(int argc, char **argv);
int tpr_cmd_forward(int argc, char **argv);
int tpr_cmd_run(int argc, char **argv);
int tpr_cmd_train(int argc, char **argv);
int tpr_cmd_load(int argc, char **argv);
int tpr_cmd_make_checkpoint(int argc, char **argv);
int tpr_cmd_mlp(int argc, char **argv);
int tpr_cmd_plan(int argc, char **argv);
int tpr_cmd_program(int argc, char **argv);
int tpr_cmd_version(int argc, char **argv);
// -- eval command
int tpr_cmd_eval(int argc, char **argv);
// -- tokenizer commands
// -- serve command
// -- scale command
int tpr_cmd_scale(int argc, char **argv);
int tpr_cmd_serve(int argc, char **argv);
int tpr_cmd_tokenize(int argc, char **argv);
int tpr_cmd_detokenize(int argc, char **argv);

#endif
