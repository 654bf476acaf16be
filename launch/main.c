// tpr: the command-line entry point. One binary, one subcommand per job.
#include <stdio.h>
#include <string.h>

#include "launch/commands.h"

static const tpr_command commands[] = {
    {"bench", "benchmarks that print a table or --json ('tpr bench --help' lists them)", tpr_cmd_bench},
    {"chat-template", "render a checkpoint's Jinja chat template over messages and print the prompt (and ids)",
     tpr_cmd_chat_template},
    {"compare", "max relative difference of two safetensors tensors (logits vs a reference)", tpr_cmd_compare},
    {"convert", "shard a checkpoint for a mesh: per-rank files + manifest.pb with checksums", tpr_cmd_convert},
    {"data", "prepare training data: text, JSONL or chat conversations to token shards ('tpr data --help')", tpr_cmd_data},
    {"forward", "the logits of every position of a token sequence, as safetensors (golden tests)", tpr_cmd_forward},
    {"load", "load every tensor a rank holds; report bytes, time and peak RSS", tpr_cmd_load},
    {"make-checkpoint", "write a random Hugging Face checkpoint for a config", tpr_cmd_make_checkpoint},
    {"mlp", "run a tensor-parallel SwiGLU MLP block program, checked against the unsharded block", tpr_cmd_mlp},
    {"plan", "print a checkpoint's sharding plan for a mesh (no mpirun needed)", tpr_cmd_plan},
    {"program", "build, serialize and inspect the demo block program", tpr_cmd_program},
    {"run", "generate from a checkpoint (minimax_m2, qwen3_moe, hunyuan_v1_moe, qwen3_vl_moe, qwen2_vl) under mpirun (tensor-parallel)", tpr_cmd_run},
    // -- eval command
    {"eval", "mean next-token cross-entropy of a checkpoint over a token file (validation loss)", tpr_cmd_eval},
    // -- tokenizer commands
    // -- serve command
    // -- scale command
    {"scale", "scaling sweeps, a calibrated step-time model, predictions to large meshes, plots", tpr_cmd_scale},
    {"serve", "an OpenAI-compatible HTTP server (completions, chat, streaming) under mpirun", tpr_cmd_serve},
    {"tokenize", "encode text with a checkpoint's tokenizer.json and print the ids", tpr_cmd_tokenize},
    {"detokenize", "decode token ids with a checkpoint's tokenizer.json and print the text", tpr_cmd_detokenize},
    {"train", "train a checkpoint (minimax_m2, qwen3_moe, hunyuan_v1_moe, qwen3_vl_moe, qwen2_vl, minimax, minicpm_sala) under mpirun (tp/ep/dp, FSDP, AdamW, checkpoints)", tpr_cmd_train},
    {"version", "print the version and build options", tpr_cmd_version},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: tpr <command> [options]\n"
          "       mpirun -np N tpr <command> [options]\n\n"
          "commands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].summary);
  fprintf(f,
          "\n'tpr <command> --help' describes a command's options.\n"
          "environment: TPR_LOG_LEVEL=error|warn|info|debug|trace, TPR_NUM_THREADS=N, TPR_COMM_CHECK=1,\n"
          "             TPR_CPU_ISA=portable|avx2|avx512 (cap the vector kernels),\n"
          "             TPR_WEIGHT_PANELS=1 (bf16/FP8 above 16 rows: widened panels + sgemm),\n"
          "             TPR_PROGRESS=0|1 (progress lines off / on; default: on when stderr is a terminal)\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "--version") == 0) return tpr_cmd_version(argc - 1, argv + 1);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "tpr: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
