// Internals of the batched engine shared by its request side (engine.c:
// creation, request checks, submission, results) and its step
// (engine_step.c: the broadcast plan, sampling, the per-step all-gather of
// sampled tokens and logprobs).
#ifndef TPR_ENGINE_ENGINE_IMPL_H
#define TPR_ENGINE_ENGINE_IMPL_H

#include "engine/engine.h"

// Rank 0's state of a sequence beside the scheduler's (tokens, blocks).
typedef struct engine_seq {
  tpr_gen_params g;       // as submitted; g.logit_bias points at bias
  tpr_logit_bias *bias;   // (g.n_logit_bias) the engine's copy
  tpr_token_logprob *lp;  // (n_lp) one record per generated token, when g.logprobs
  int64_t n_lp, cap_lp;
  bool released;
} engine_seq;

struct tpr_engine {
  tpr_session *s;
  tpr_engine_opts o;
  int rank, replica, replicas;
  // Set in tpr_engine_new and never changed: all that
  // tpr_engine_check_request reads, from any thread.
  tpr_sched_opts limits;  // the scheduler's options (max_seq, pool blocks, block size)
  int64_t vocab;
  tpr_sched *sched;       // rank 0
  engine_seq *seqs;       // rank 0: (n_seqs) by sequence id
  int64_t n_seqs, cap_seqs;
  int32_t *tally;         // rank 0: (vocab) all zero between uses (tpr_logit_tally)
  int64_t *msg;           // the step plan (msg_words used)
  int64_t msg_cap, msg_words;
  // This rank's step (its replica's chunks), sized for the largest step.
  int32_t *tokens, *positions, *slots, *seq, *blocks, *rows;
  int32_t *state_slots;  // (T) each row's recurrent state slot (hybrid families)
  int32_t *prefill_lens; // (T) each row's sequence's prompt length (tpr_step.prefill_lens)
  int64_t step_cap;
  float *logits;                // (B, V)
  float *row;                   // (V) a sampled row after logit processing
  void *sample_scratch;
  tpr_logit_bias *proc_bias;    // (TPR_MAX_LOGIT_BIAS) a chunk's bias entries, read from the plan
  double mask_s;                // rank 0: the step's time in grammar masks so far (encode_extra)
  int32_t *proc_ids;            // (3 * max_seq) a chunk's seen ids, generated ids and counts (rank 0: its tallies)
  int32_t *send;                // (1 + B * (2 + 2 * TPR_MAX_TOP_LOGPROBS)) this rank's words of the all-gather
  int32_t *sampled;             // send + 1: (B) this replica's sampled tokens
  int32_t *gathered;            // (world * the step's words per rank)
  int64_t gathered_cap;
  int64_t *finished;            // rank 0: (B * replicas)
  // Speculative decoding: a step samples up to sample_cap rows per replica
  // (B, or B * (1 + max_draft) rounded to a power of two, within step_cap).
  int64_t sample_cap;
  int32_t *draft;               // rank 0: (max_draft) a drafter's output
  int64_t **draft_words;        // (B) self-speculation: the plan word each draft row's argmax goes to
  int64_t *spec_ids;            // rank 0: (n_spec) unfinished sequences with a drafter, by id
  int64_t n_spec, cap_spec;
  // Hybrid models with drafts: (layers) each recurrent layer's snapshot
  // pool, shaped as s->states[L] (NULL for other layers); NULL otherwise.
  tpr_tensor **snap;
  double state_copy_s;          // this step's time in snapshot copies so far
};

// A step's token count is padded to a power of two (engine.h).
static inline int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

#endif
