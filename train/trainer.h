// The training loop of `tpr train`: data (train/data.h), the model's
// forward+backward (train/state.h), gradient clipping, the LR
// schedule and AdamW (train/adamw.h), checkpoints (train/checkpoint.h).
// Collective: every rank of the world runs it with the same options.
#ifndef TPR_TRAINER_H
#define TPR_TRAINER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/session.h"
#include "train/state.h"

typedef struct tpr_train_opts {
  const char *data;         // token stream spec (train/tokens.h; an index's train split by default)
  bool sft;                 // loss masks: unlearned targets -100, steps averaged per learned token (trainer.c)
  bool data_sequential;     // windows in file order (else a seeded permutation per epoch)
  int64_t seq_len, micro_batch, grad_accum, steps;
  double lr, min_lr, weight_decay, clip;  // clip <= 0: off
  int64_t warmup;
  double beta1, beta2, eps;
  double aux_coef;          // < 0: the config's router_aux_loss_coef
  uint64_t seed;            // data order
  double bias_update_rate;  // > 0: aux-loss-free balancing of the routing bias after each step
  const char *save_dir;     // NULL: no checkpoints
  int64_t save_every;       // 0: only at the end
  int64_t stop_after;       // > 0: stop (and save) after this step, the schedule still spanning `steps`
  const char *resume_dir;   // checkpoint written by --save (also the model to load)
  const char *dump_grads;   // safetensors path: step 0's reduced gradient, full tensors (tests)
  // Validation (train/eval_windows.h): the mean cross-entropy over eval_data's
  // windows of seq_len after every eval_every steps and after the last
  // (eval_every 0: only after the last); at most eval_windows (0: all).
  const char *eval_data;    // token stream spec (an index's val split by default)
  int64_t eval_every, eval_windows;
  bool json;                // one JSON line per step on rank 0
} tpr_train_opts;

typedef struct tpr_train_step_report {
  int64_t step;
  double loss, ce, aux, grad_norm, lr, tokens_per_s, ms;
  // Where the step's time went: forward + backward of its sequences (with
  // the gradient accumulation), the gradient fold / dp reduction / norm,
  // and the optimizer (AdamW with clipping, the bias update).
  double ms_fwd_bwd, ms_grad_sync, ms_optimizer;
  // FSDP on rank 0 (train/state.h, tpr_train_comm): bytes
  // gathered / reduce-scattered, their ms, the ms not hidden behind compute.
  double gather_bytes, scatter_bytes, ms_gather, ms_scatter, ms_exposed;
  // With --profile: ms rank 0's program spent in each collective kind during
  // the step's forward + backward (all_reduce, all_gather, reduce_scatter,
  // all_to_all with all_to_allv), waits for peers included; else 0.
  bool profiled;
  double ms_collective[4];
} tpr_train_step_report;

// What a run measured: the steps after its first (which pays for first
// touches of memory), or the first when it ran only one.
typedef struct tpr_train_summary {
  int64_t steps_timed;
  double ms_per_step, tokens_per_s;  // tokens of the whole world per second
  double ms_fwd_bwd, ms_grad_sync, ms_optimizer;  // means per step, as in the reports
  double ms_gather, ms_scatter, ms_exposed;        // FSDP, means per step
  double last_loss;
} tpr_train_summary;

// Runs steps [first, opts.steps) on an open training state; reports go to
// out (rank 0). first > 0 when resuming. summary may be NULL.
tpr_status tpr_train_run(tpr_train_state *t, tpr_comm_t world, const tpr_train_opts *o, FILE *out,
                         tpr_train_summary *summary);

#endif
