// tpr train: training steps of any family under mpirun (train/trainer.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "launch/model_cli.h"
#include "launch/positions_3d.h"
#include "runtime/file_io.h"
#include "models/minimax_m2.h"
#include "models/qk_head_decoder.h"
#include "shard/checkpoint_gen.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"
#include "train/state.h"
#include "train/trainer.h"

static const char *usage =
    "usage: mpirun -np N tpr train (--model DIR | --config F --random-init | --resume DIR) --data DATA [--sft]\n"
    "         [--seq-len T] [--micro-batch B] [--grad-accum A] [--steps S] [--lr LR] [--warmup W]\n"
    "         [--min-lr LR] [--weight-decay WD] [--clip C] [--seed S] [--data-order random|sequential]\n"
    "         [--tp --dp --ep --etp] [--fsdp | --no-fsdp] [--param-dtype f32|bf16] [--save DIR [--save-every N]]\n"
    "         [--resume DIR] [--positions-3d FILE] [--pack [--eos-id N]] [--eval-data DATA [--eval-every N]] [--json]\n"
    "DATA: X.npy, a glob pattern ('dir/*.npy', sorted; .mask.npy/.docs.npy skipped), PREFIX.json (a tpr data\n"
    "prepare index: its train split, for --eval-data its val split; PREFIX.json:train / :val to choose), or a\n"
    "comma-separated list of these (or --data repeated), concatenated in order";

// The run's summary on rank 0: timed steps, phases, peak RSS of every rank;
// with --profile also where the program's time went by op kind and the
// GEMMs' rate against sgemm measured on this rank in the same run.
static void print_summary(const tpr_train_state *t, const tpr_train_summary *sum, const int64_t *rss, int world,
                          bool profile, double sgemm, bool json) {
  double sec[TPR_OP_KIND_COUNT], flops, total = 0;
  int64_t runs;
  tpr_train_profile(t, sec, &runs, &flops);
  for (int k = 0; k < TPR_OP_KIND_COUNT; k++) total += sec[k];
  double gemm = sec[TPR_OP_MATMUL] > 0 ? flops * (double)runs / sec[TPR_OP_MATMUL] * 1e-9 : 0;
  if (json) {
    printf("{\"summary\":{\"steps_timed\":%lld,\"ms_per_step\":%.6g,\"tokens_per_s\":%.6g,\"fwd_bwd_ms\":%.6g,"
           "\"grad_sync_ms\":%.6g,\"optimizer_ms\":%.6g,\"fsdp_all_gather_ms\":%.6g,"
           "\"fsdp_reduce_scatter_ms\":%.6g,\"fsdp_exposed_ms\":%.6g,\"peak_rss_bytes\":[",
           (long long)sum->steps_timed, sum->ms_per_step, sum->tokens_per_s, sum->ms_fwd_bwd, sum->ms_grad_sync,
           sum->ms_optimizer, sum->ms_gather, sum->ms_scatter, sum->ms_exposed);
    for (int r = 0; r < world; r++) printf("%s%lld", r ? "," : "", (long long)rss[r]);
    printf("]");
    if (profile) {
      printf(",\"program_s\":%.6g,\"gemm_gflops\":%.6g,\"sgemm_gflops\":%.6g,\"gemm_efficiency\":%.6g,\"ops\":{",
             total, gemm, sgemm, sgemm > 0 ? gemm / sgemm : 0);
      for (int k = 0, first = 1; k < TPR_OP_KIND_COUNT; k++)
        if (sec[k] > 0) printf("%s\"%s\":%.6g", first ? "" : ",", tpr_op_name((tpr_op_kind)k), sec[k]), first = 0;
      printf("}");
    }
    printf("}}\n");
    return;
  }
  if (profile) {
    printf("\nprofile (rank 0, %lld sequence runs, program time %.3f s)\n  %-28s %10s %7s\n", (long long)runs, total,
           "op", "seconds", "share");
    for (int k = 0; k < TPR_OP_KIND_COUNT; k++)
      if (sec[k] > 0.005 * total)
        printf("  %-28s %10.3f %6.1f%%\n", tpr_op_name((tpr_op_kind)k), sec[k], 100 * sec[k] / total);
    printf("  GEMMs %.1f GFLOP/s = %.0f%% of sgemm %.1f GFLOP/s measured in this run\n", gemm,
           sgemm > 0 ? 100 * gemm / sgemm : 0, sgemm);
  }
  printf("%lld timed steps: %.1f ms/step (forward+backward %.1f, gradient sync %.1f, optimizer %.1f), %.1f tokens/s\n"
         "peak RSS per rank:", (long long)sum->steps_timed, sum->ms_per_step, sum->ms_fwd_bwd, sum->ms_grad_sync,
         sum->ms_optimizer, sum->tokens_per_s);
  char buf[32];
  for (int r = 0; r < world; r++) printf(" %s", tpr_cli_bytes((uint64_t)rss[r], buf, sizeof buf));
  printf("\n");
  double comm = sum->ms_gather + sum->ms_scatter;
  if (comm > 0)
    printf("FSDP per step (rank 0): all-gather %.1f ms, reduce-scatter %.1f ms, exposed %.1f ms (%.0f%% of the "
           "communication hidden behind compute)\n", sum->ms_gather, sum->ms_scatter, sum->ms_exposed,
           100 * (1 - sum->ms_exposed / comm));
}

// --pack's EOS: --eos-id, else the checkpoint tokenizer's eos_token.
static tpr_status pack_eos(const char *dir, int64_t given, int32_t *eos) {
  if (given >= 0) {
    if (given > INT32_MAX) return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --eos-id %lld is not a token id", (long long)given);
    *eos = (int32_t)given;
    return TPR_OK;
  }
  tpr_tokenizer *tok = NULL;
  tpr_status rc = tpr_tokenizer_load(dir, &tok);
  *eos = rc == TPR_OK ? tpr_tokenizer_eos_id(tok) : -1;
  tpr_tokenizer_free(tok);
  if (*eos < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --pack needs the EOS token that separates documents, and %s has "
                    "%s; give it with --eos-id N", dir,
                    rc != TPR_OK ? "no tokenizer tpr can load" : "a tokenizer without an eos_token");
  return TPR_OK;
}

static int usage_error(const char *msg) {
  fprintf(stderr, "tpr train: %s\n%s\n", msg, usage);
  return 2;
}

// --random-init: rank 0 writes a random checkpoint of the config into a
// fresh temporary directory that every rank then loads.
static tpr_status random_model(tpr_world *w, const char *config, uint64_t seed, char *dir, size_t n) {
  tpr_status rc = TPR_OK;
  int64_t pid = getpid();
  TPR_CHECK(tpr_comm_broadcast(w->host, &pid, &pid, 1, TPR_I64, 0));
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, n, "%s/tpr-train-init-%lld", tmp && *tmp ? tmp : "/tmp", (long long)pid);
  if (w->rank == 0) rc = tpr_checkpoint_generate(config, dir, seed, TPR_F32, 1, NULL);
  int64_t ok = rc == TPR_OK;
  TPR_CHECK(tpr_comm_all_reduce(w->host, &ok, &ok, 1, TPR_I64, TPR_MIN));
  if (!ok) return rc != TPR_OK ? rc : TPR_FAIL(TPR_ERR_IO, "rank 0 could not write the random checkpoint");
  return TPR_OK;
}

int tpr_cmd_train(int argc, char **argv) {
  const char *model = NULL, *config = NULL, *order = NULL, *dump = NULL;
  tpr_arg_list data_list = {0}, eval_list = {0};  // repeatable: joined into one comma list
  bool random_init = false, profile = false;
  tpr_train_opts o = {.seq_len = 256, .micro_batch = 1, .grad_accum = 1, .steps = 10, .lr = 3e-4, .min_lr = -1,
                      .weight_decay = 0.1, .clip = 1.0, .warmup = 0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                      .aux_coef = -1};
  int64_t seed = -1;  // -1: not given (0, or on --resume the checkpoint's)
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  tpr_model_debug dbg = TPR_MODEL_DEBUG_DEFAULT;
  tpr_model_mesh mesh = TPR_MODEL_MESH_DEFAULT;
  const char *skip_marks = NULL, *param_dtype = "f32", *debug_fsdp = NULL, *pos3_path = NULL, *debug_pack = NULL;
  bool fsdp = false, no_fsdp = false, no_prefetch = false, no_reshard = false, pack = false;
  int64_t eos_id = -1;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory to start from (Hugging Face)"},
      {"config", TPR_ARG_STR, &config, "model config.json, with --random-init"},
      {"random-init", TPR_ARG_FLAG, &random_init, "start from random weights (N(0, 0.02^2); norms near 1)"},
      {"data", TPR_ARG_STR_LIST, &data_list,
       "training tokens (DATA below): .npy files of u16, u32, i32 or i64 ids, a glob, a token-shard index "
       "PREFIX.json[:train|:val] (default its train split), or a comma-separated list; repeatable; all "
       "concatenated in order"},
      {"sft", TPR_ARG_FLAG, &o.sft,
       "supervised fine-tuning: learn only targets whose token has loss mask 1 (X.mask.npy beside X.npy, or the "
       "index's mask_file), others -100; a step's loss is its learned tokens' summed loss / their count over all "
       "micro-batches and replicas (transformers' Trainer)"},
      {"data-order", TPR_ARG_STR, &order,
       "random (a seeded permutation of windows per epoch, default) | sequential; --resume: the checkpoint's"},
      {"seq-len", TPR_ARG_SIZE, &o.seq_len, "tokens per sequence (default 256)"},
      {"micro-batch", TPR_ARG_SIZE, &o.micro_batch, "sequences per micro-step per replica (default 1)"},
      {"grad-accum", TPR_ARG_SIZE, &o.grad_accum, "micro-steps per optimizer step (default 1)"},
      {"steps", TPR_ARG_INT, &o.steps, "optimizer steps (default 10)"},
      {"lr", TPR_ARG_FLOAT, &o.lr, "peak learning rate (default 3e-4)"},
      {"warmup", TPR_ARG_INT, &o.warmup, "linear warmup steps (default 0)"},
      {"min-lr", TPR_ARG_FLOAT, &o.min_lr, "floor of the cosine decay (default lr / 10)"},
      {"weight-decay", TPR_ARG_FLOAT, &o.weight_decay, "AdamW decoupled weight decay on >= 2-D weights (default 0.1)"},
      {"beta1", TPR_ARG_FLOAT, &o.beta1, "AdamW beta1 (default 0.9)"},
      {"beta2", TPR_ARG_FLOAT, &o.beta2, "AdamW beta2 (default 0.95)"},
      {"clip", TPR_ARG_FLOAT, &o.clip, "global gradient-norm clip (default 1.0; 0 = off)"},
      {"aux-coef", TPR_ARG_FLOAT, &o.aux_coef, "weight of the MoE load-balancing loss (default: the config's)"},
      {"bias-update-rate", TPR_ARG_FLOAT, &o.bias_update_rate,
       "aux-loss-free balancing: after each step e_score_correction_bias += rate * sign(mean load - load) (default 0: off)"},
      {"seed", TPR_ARG_INT, &seed,
       "seed of the data order and of --random-init (default 0; --resume: the checkpoint's)"},
      {"save", TPR_ARG_STR, &o.save_dir, "checkpoint directory (Hugging Face + optimizer state), written atomically"},
      {"save-every", TPR_ARG_INT, &o.save_every, "also save every N steps (default: only at the end)"},
      {"resume", TPR_ARG_STR, &o.resume_dir, "continue from a --save directory (same tp, ep, etp; dp may change)"},
      {"stop-after", TPR_ARG_INT, &o.stop_after, "stop (and save) after this many steps of the --steps schedule"},
      {"eval-data", TPR_ARG_STR_LIST, &eval_list,
       "validation tokens (DATA; an index's val split by default): the mean cross-entropy over their --seq-len "
       "windows, every token (no loss mask), as tpr eval scores them, after the last step and every --eval-every "
       "steps"},
      {"eval-every", TPR_ARG_INT, &o.eval_every, "with --eval-data: also validate after every N steps (default 0: "
       "only after the last)"},
      {"eval-windows", TPR_ARG_SIZE, &o.eval_windows, "with --eval-data: at most N windows (default: all)"},
      {"json", TPR_ARG_FLAG, &o.json, "one JSON line per step (rank 0)"},
      {"profile", TPR_ARG_FLAG, &profile,
       "time every op; print seconds per op kind and the GEMM rate against sgemm (a last JSON line with --json)"},
      {"fsdp", TPR_ARG_FLAG, &fsdp,
       "shard params, gradients and optimizer state over dp (experts over edp), FSDP-style (default when dp > 1)"},
      {"no-fsdp", TPR_ARG_FLAG, &no_fsdp, "plain data parallelism: every replica holds everything, gradients all-reduced"},
      {"param-dtype", TPR_ARG_STR, &param_dtype,
       "FSDP: f32 | bf16, the dtype params are kept, gathered and computed in (master weights, gradients and "
       "moments stay f32; default f32)"},
      {"no-prefetch", TPR_ARG_FLAG, &no_prefetch, "FSDP: gather each layer's params only when it runs"},
      {"no-reshard", TPR_ARG_FLAG, &no_reshard,
       "FSDP: keep the gathered params from the forward for the backward (more memory, fewer gathers)"},
      {"debug-fsdp", TPR_ARG_STR, &debug_fsdp,
       "test only: sum-grads | wrong-shard: sum instead of average over replicas, or keep the next rank's chunk "
       "(negative controls)"},
      {"positions-3d", TPR_ARG_STR, &pos3_path,
       "MRoPE families (qwen3_vl_moe, qwen2_vl): the rope positions (3, seq-len) of every sequence, .npy or .safetensors "
       "(default: the text rule, every axis the position)"},
      {"pack", TPR_ARG_FLAG, &pack,
       "packed documents: the token stream's documents are separated by EOS (tpr data prepare --append-eos); in "
       "each window positions restart after every EOS, attention (and a lightning layer's state) never crosses one, "
       "and the loss skips the EOS positions (Megatron-LM's reset_position_ids, reset_attention_mask, "
       "eod_mask_loss)"},
      {"eos-id", TPR_ARG_INT, &eos_id, "with --pack: the EOS token id (default: the checkpoint tokenizer's eos_token)"},
      {"debug-pack", TPR_ARG_STR, &debug_pack,
       "test only: no-mask | no-positions | no-mask-no-positions | no-state-reset: --pack without its attention "
       "mask, without restarting the positions, without both, or (lightning attention layers) without restarting "
       "their state at each document (negative controls)"},
      {"dump-grads", TPR_ARG_STR, &dump, "test only: write step 0's gradients (full tensors) to this safetensors file"},
      {"debug-skip-grad-marks", TPR_ARG_STR, &skip_marks,
       "test only: column | qk-norm | shared-mlp | all: leave out those backward all-reduces; bias-wrong: add one "
       "on the q/k/v biases (negative controls)"},
      TPR_MODEL_MESH_ARGS(mesh),
      TPR_WORLD_ARGS(wo),
      TPR_MODEL_DEBUG_ARGS(dbg),
  };
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (strcmp(mesh.activation_dtype, "f32") != 0)
    return usage_error("--activation-dtype applies to inference: training multiplies f32 weights in f32");
  int sources = (model != NULL) + (config != NULL) + (o.resume_dir != NULL);
  if (sources != 1 || (config && !random_init) || (random_init && !config))
    return usage_error("give exactly one of --model DIR, --config F --random-init, or --resume DIR");
  if (!data_list.n) return usage_error("--data is required");
  o.eval_data = eval_list.n ? eval_list.items[0] : NULL;  // joined below, once the options are checked
  if (order && strcmp(order, "random") && strcmp(order, "sequential"))
    return usage_error("--data-order must be random or sequential");
  if (seed < -1) return usage_error("--seed must be >= 0");
  bool sequential = order && !strcmp(order, "sequential");
  if (o.resume_dir) {
    // A resume reads on in the order the checkpoint's run read; another
    // order would silently train on other windows than the uninterrupted run.
    uint64_t saved_seed;
    bool saved_sequential;
    if (tpr_train_checkpoint_data_order(o.resume_dir, &saved_seed, &saved_sequential) != TPR_OK) {
      fprintf(stderr, "tpr train: --resume: %s\n", tpr_last_error());
      return 1;
    }
    if ((seed >= 0 && (uint64_t)seed != saved_seed) || (order && sequential != saved_sequential)) {
      fprintf(stderr,
              "tpr train: --resume %s: that run read its data in %s order with seed %llu; this one asks for %s "
              "order with seed %lld (leave --seed and --data-order out to continue as it did)\n",
              o.resume_dir, saved_sequential ? "sequential" : "random", (unsigned long long)saved_seed,
              order ? order : (saved_sequential ? "sequential" : "random"),
              (long long)(seed >= 0 ? seed : (int64_t)saved_seed));
      return 2;
    }
    seed = (int64_t)saved_seed;
    sequential = saved_sequential;
  }
  if (seed < 0) seed = 0;
  if (o.seq_len < 1 || o.micro_batch < 1 || o.grad_accum < 1 || o.steps < 1 || o.warmup < 0 || o.save_every < 0 || o.stop_after < 0)
    return usage_error("--seq-len, --micro-batch, --grad-accum and --steps must be >= 1; --warmup, --save-every, --stop-after >= 0");
  if (o.eval_every < 0 || o.eval_windows < 0) return usage_error("--eval-every and --eval-windows must be >= 0");
  // A micro-step's tokens are one tensor's rows and the step's windows are
  // counted in int: both products must fit before the data reader sees them.
  const int64_t micro_tokens[2] = {o.seq_len, o.micro_batch}, step_rows[2] = {o.micro_batch, o.grad_accum};
  if (!tpr_cli_sizes_ok("tpr train", "--seq-len x --micro-batch", 2, micro_tokens, INT32_MAX) ||
      !tpr_cli_sizes_ok("tpr train", "--micro-batch x --grad-accum", 2, step_rows, INT32_MAX))
    return 2;
  if (!o.eval_data && (o.eval_every || o.eval_windows)) return usage_error("--eval-every and --eval-windows need --eval-data");
  if (!(o.lr > 0) || !(o.weight_decay >= 0) || !(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
    return usage_error("--lr must be > 0, --weight-decay >= 0, betas in [0, 1)");
  if (!(o.bias_update_rate >= 0)) return usage_error("--bias-update-rate must be >= 0");
  if (o.min_lr < 0) o.min_lr = o.lr / 10;
  int skip = 0;
  if (skip_marks) {
    if (!strcmp(skip_marks, "column")) skip = TPR_M2_MARKS_COLUMN;
    else if (!strcmp(skip_marks, "qk-norm")) skip = TPR_M2_MARKS_QK_NORM;
    else if (!strcmp(skip_marks, "shared-mlp")) skip = TPR_QKHD_MARKS_SHARED;  // hunyuan_v1_moe's shared expert
    else if (!strcmp(skip_marks, "bias-wrong")) skip = TPR_QKHD_MARKS_BIAS_WRONG;  // qwen2_vl: a wrong mark added
    else if (!strcmp(skip_marks, "all")) skip = TPR_M2_MARKS_COLUMN | TPR_M2_MARKS_QK_NORM | TPR_QKHD_MARKS_SHARED;
    else return usage_error("--debug-skip-grad-marks must be column, qk-norm, shared-mlp, bias-wrong or all");
  }
  if (fsdp && no_fsdp) return usage_error("give --fsdp or --no-fsdp, not both");
  if (!pack && (eos_id != -1 || debug_pack)) return usage_error("--eos-id and --debug-pack go with --pack");
  if (eos_id < -1) return usage_error("--eos-id must be >= 0");
  if (pack && pos3_path)
    return usage_error("--positions-3d gives every sequence the same positions, --pack restarts them at each "
                       "document: give one or the other");
  int pack_debug = 0;
  if (debug_pack && !strcmp(debug_pack, "no-mask")) pack_debug = TPR_PACK_DEBUG_NO_MASK;
  else if (debug_pack && !strcmp(debug_pack, "no-positions")) pack_debug = TPR_PACK_DEBUG_NO_POSITIONS;
  else if (debug_pack && !strcmp(debug_pack, "no-mask-no-positions"))
    pack_debug = TPR_PACK_DEBUG_NO_MASK | TPR_PACK_DEBUG_NO_POSITIONS;
  else if (debug_pack && !strcmp(debug_pack, "no-state-reset")) pack_debug = TPR_PACK_DEBUG_NO_STATE_RESET;
  else if (debug_pack)
    return usage_error("--debug-pack must be no-mask, no-positions, no-mask-no-positions or no-state-reset");
  tpr_fsdp_opts fo = {.on = fsdp, .prefetch = !no_prefetch, .reshard = !no_reshard};
  if (!strcmp(param_dtype, "f32")) fo.param_dtype = TPR_F32;
  else if (!strcmp(param_dtype, "bf16")) fo.param_dtype = TPR_BF16;
  else return usage_error("--param-dtype must be f32 or bf16");
  if (debug_fsdp && !strcmp(debug_fsdp, "sum-grads")) fo.debug_sum_grads = true;
  else if (debug_fsdp && !strcmp(debug_fsdp, "wrong-shard")) fo.debug_wrong_shard = true;
  else if (debug_fsdp) return usage_error("--debug-fsdp must be sum-grads or wrong-shard");
  char *data = tpr_cli_join_data(&data_list), *eval_data = tpr_cli_join_data(&eval_list);
  if (!data || (eval_list.n && !eval_data)) {
    free(data), free(eval_data);
    fprintf(stderr, "tpr train: out of memory\n");
    return 1;
  }
  o.data = data;
  o.eval_data = eval_data;
  o.data_sequential = sequential;
  o.seed = (uint64_t)seed;
  o.dump_grads = dump;
  tpr_world w;
  tpr_session *s = NULL;
  tpr_train_state *t = NULL;
  char init_dir[512] = "";
  tpr_status rc = tpr_world_init(&argc, &argv, &wo, &w);
  if (rc == TPR_OK) tpr_cli_progress(w.rank);
  if (rc == TPR_OK && random_init) rc = random_model(&w, config, (uint64_t)seed, init_dir, sizeof init_dir);
  const char *dir = o.resume_dir ? o.resume_dir : model ? model : init_dir;
  // A family with no training program is refused by name before any
  // weight is read (a resumed run was one it trains).
  tpr_model_config mc;
  if (rc == TPR_OK && !o.resume_dir && (rc = tpr_model_config_load(dir, &mc)) == TPR_OK &&
      !tpr_train_supported(mc.family))
    rc = TPR_FAIL(TPR_ERR_UNSUPPORTED, "train: model family %s runs inference only (forward, run, bench model); "
                  "training supports %s", tpr_model_family_name(mc.family), tpr_train_supported_list());
  int32_t eos = -1;
  if (rc == TPR_OK && pack) rc = pack_eos(dir, eos_id, &eos);
  int32_t *pos3 = NULL;
  if (rc == TPR_OK && pos3_path) rc = tpr_positions_3d_read(pos3_path, o.seq_len, &pos3);
  tpr_session_opts so;
  if (rc == TPR_OK) rc = tpr_cli_session_opts(&w, dir, &mesh, o.seq_len, &dbg, &so);
  if (rc == TPR_OK) {
    so.training = true;
    so.skip_grad_marks = skip;
    rc = tpr_session_open(&so, w.host, w.be, &s);
  }
  // FSDP by default once there is more than one replica to shard over (the
  // families whose training program shards its params).
  if (rc == TPR_OK && !no_fsdp)
    fo.on = fo.on || (tpr_session_plan(s)->dp > 1 && tpr_train_fsdp_built(tpr_session_plan(s)->config.family));
  if (rc == TPR_OK && o.bias_update_rate > 0 && tpr_session_plan(s)->config.family != TPR_FAMILY_MINIMAX_M2)
    rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --bias-update-rate moves e_score_correction_bias, which %s has not",
                  tpr_model_family_name(tpr_session_plan(s)->config.family));
  if (rc == TPR_OK && !fo.on && (strcmp(param_dtype, "f32") || debug_fsdp))
    rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "train: --param-dtype bf16 and --debug-fsdp need FSDP (--fsdp, or dp > 1)");
  tpr_train_state_opts to = {.seq_len = o.seq_len, .aux_coef = o.aux_coef, .profile = profile, .fsdp = fo,
                             .positions_3d = pos3, .pack = pack, .eos_id = eos, .pack_debug = pack_debug};
  double sgemm = rc == TPR_OK && profile && w.rank == 0 ? tpr_cli_sgemm_gflops() : 0;
  tpr_train_summary sum = {0};
  if (rc == TPR_OK) rc = tpr_train_state_open(s, &to, &t);
  if (rc == TPR_OK && w.rank == 0 && !o.json) {
    const tpr_shard_plan *pl = tpr_session_plan(s);
    printf("train: world %d (tp %d dp %d ep %d etp %d), %d trained tensors on rank 0, seq %lld x %lld x %lld "
           "per replica per step\n", w.size, pl->tp, pl->dp, pl->ep, pl->etp, tpr_train_num_params(t),
           (long long)o.seq_len, (long long)o.micro_batch, (long long)o.grad_accum);
  }
  if (rc == TPR_OK) rc = tpr_train_run(t, w.host, &o, stdout, &sum);
  int64_t *rss = calloc((size_t)w.size, sizeof *rss);
  if (rc == TPR_OK && !rss) rc = TPR_FAIL(TPR_ERR_OOM, "peak RSS");
  if (rc == TPR_OK) rc = tpr_world_peak_rss(&w, rss);
  if (rc == TPR_OK && w.rank == 0) print_summary(t, &sum, rss, w.size, profile, sgemm, o.json);
  free(rss);
  free(pos3);
  free(data), free(eval_data);
  tpr_train_state_free(t);  // before the session it trains
  tpr_session_close(s);
  if (random_init && w.rank == 0 && init_dir[0]) tpr_dir_remove_flat(init_dir, NULL);  // only a starting point
  if (rc != TPR_OK) return tpr_world_fail(&w, "train");
  tpr_world_finish(&w);
  return 0;
}
