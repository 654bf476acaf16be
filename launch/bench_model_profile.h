// tpr bench model --profile: where a step's time goes, per op kind, for the
// prefill steps and the decode steps apart. The exec times every node of
// every program run on this thread (tpr_exec_set_op_profile); the engine's
// step time less the sum of the ops is the overhead (scheduling, staging
// inputs, gathering logits, sampling, building a program for a new shape).
#ifndef TPR_BENCH_MODEL_PROFILE_H
#define TPR_BENCH_MODEL_PROFILE_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/program/program.h"

typedef struct tpr_bench_phase {
  tpr_exec_op_profile ops;  // summed over the phase's steps
  int64_t steps;
  double step_seconds;      // the engine's wall time of those steps
} tpr_bench_phase;

typedef struct tpr_bench_profile {
  tpr_bench_phase prefill, decode;
  tpr_exec_op_profile step;  // the sink during one step
} tpr_bench_profile;

// Zeroes p and points this thread's exec sink at p->step.
void tpr_bench_profile_start(tpr_bench_profile *p);
// Moves the step just run into its phase and clears the sink.
void tpr_bench_profile_step(tpr_bench_profile *p, bool prefill, double seconds);
// Switches the sink off.
void tpr_bench_profile_stop(void);
// The text tables (title names whose profile it is).
void tpr_bench_profile_print(const tpr_bench_profile *p, const char *title);
// `"profile":{...}` (no separator before it).
void tpr_bench_profile_print_json(const tpr_bench_profile *p, int rank);

#endif
