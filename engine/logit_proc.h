// One row of logits (vocab) on its way to sampling, per sequence: logit
// processing (logit_bias, min_new, repetition / frequency / presence
// penalties) and logprobs. engine/engine.h states the order and formulas as
// the engine's API promises them; this file holds the arithmetic, as pure
// functions of a row and a summary of the sequence's history, so every rank
// of a replica gets the same row from the same step plan and tests check it
// without MPI.
#ifndef TPR_ENGINE_LOGIT_PROC_H
#define TPR_ENGINE_LOGIT_PROC_H

#include <stdbool.h>
#include <stdint.h>

#define TPR_MAX_TOP_LOGPROBS 20
#define TPR_MAX_LOGIT_BIAS 1024

// A token's logit moved before sampling (OpenAI's logit_bias).
typedef struct tpr_logit_bias {
  int32_t id;
  float bias;  // added to the logit; finite, [-100, 100]
} tpr_logit_bias;

// One generated token's logprobs (raw log-softmax, see engine.h).
typedef struct tpr_token_logprob {
  int32_t token;           // the sampled id
  float logprob;           // its logprob
  int32_t n_top;           // top_logprobs asked for
  int32_t top_ids[TPR_MAX_TOP_LOGPROBS];       // most likely first; ties: lower id first
  float top_logprobs[TPR_MAX_TOP_LOGPROBS];
} tpr_token_logprob;

// What processing one row needs: the request's parameters and the summary
// of its history that rank 0 computes and sends in the step plan. Ids are
// in [0, vocab) (the plan's decoder checks them).
typedef struct tpr_logit_proc {
  const uint64_t *allow;       // a grammar's mask (bit id set: allowed; token_constraint.h); NULL: none
  const tpr_logit_bias *bias;  // (n_bias) in request order
  int64_t n_bias;
  int32_t masked_stop;         // the stop token while fewer than min_new tokens are generated; -1: none
  double repetition_penalty;   // 0 or 1: off
  const int32_t *seen;         // (n_seen) distinct ids of prompt + generated (read when repetition is on)
  int64_t n_seen;
  double frequency_penalty, presence_penalty;  // 0: off
  const int32_t *gen_ids, *gen_counts;         // (n_gen) distinct generated ids and their counts (> 0)
  int64_t n_gen;
} tpr_logit_proc;

// Whether applying p changes anything (false: the row is sampled as is).
bool tpr_logit_proc_active(const tpr_logit_proc *p);
static inline bool tpr_repetition_on(double r) { return r != 0 && r != 1; }

// Processes logits (vocab) in place, in engine.h's order: the grammar's
// mask (-inf outside it; structured output), bias, the stop
// mask (-inf), repetition, frequency / presence. Each operation is done in
// double on the float logit and rounded back to float, so the result is
// the same on every rank and a test can redo it exactly.
void tpr_logit_proc_apply(const tpr_logit_proc *p, float *logits, int64_t vocab);

// The distinct ids of tokens (n) in order of first appearance into ids
// (n entries suffice), and their counts into counts (NULL: not wanted);
// returns how many are distinct. tally (vocab) is all zero on entry and is
// left all zero.
int64_t tpr_logit_tally(const int32_t *tokens, int64_t n, int32_t *tally, int32_t *ids, int32_t *counts);

// The raw log-softmax of logits (vocab), accumulated in double: token's
// logprob and the n_top (<= TPR_MAX_TOP_LOGPROBS, clamped to vocab) most
// likely ids, descending, ties lower id first.
void tpr_logprobs_of(const float *logits, int64_t vocab, int32_t token, int32_t n_top, tpr_token_logprob *out);

#endif
