// The batched engine's scheduler: which tokens of which sequences run in the
// next step, and where their KV rows live. Pure host logic, no backend: rank
// 0 runs it and broadcasts each step's plan (engine/engine.h), so it is unit
// tested on its own.
//
// Model (vLLM's, simplified): every dp replica has its own pool of KV blocks
// (block_size token rows each, the same layout on every layer and every tp
// rank of the replica). A sequence is assigned to one replica when it is
// submitted (the replica with the fewest unfinished sequences; ties: the
// lower index) and stays there. It holds `len` known tokens (prompt, then
// the generated ones) of which the first `computed` have their KV rows
// written; its block table lists the blocks holding positions
// [0, n_blocks*block_size).
//
// A step plans, for each replica, a list of chunks: chunk = tokens
// [computed, computed + n) of one sequence. When the chunk reaches the last
// known token (computed + n == len) the model's logits at that token are
// sampled and the token appended (tpr_sched_update). Decode is a chunk of 1.
//
// Policy per replica, under a budget of max_tokens tokens and max_batch
// chunks: (1) running sequences whose next chunk is a single token (decodes),
// in admission order; (2) running sequences still prefilling, in admission
// order, each chunk as long as the budget and free blocks allow (chunked
// prefill); (3) waiting sequences, first come first served (a preempted
// sequence keeps its place by arrival), admitted while a non-empty chunk fits.
// A decode that needs a new block when none is free preempts the most
// recently admitted running sequence of the replica (possibly itself): its
// blocks are freed, computed = 0, and it waits again to recompute its prompt
// and everything generated so far (preemption by recompute: nothing is lost;
// since sampling state lives with the sequence, the continuation is the same).
#ifndef TPR_ENGINE_SCHEDULER_H
#define TPR_ENGINE_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/status.h"

typedef struct tpr_sched_opts {
  int replicas;         // dp replicas, each with its own block pool (>= 1)
  int64_t pool_blocks;  // KV blocks per replica (>= 1)
  int64_t block_size;   // token rows per block (>= 1)
  int64_t max_batch;    // chunks (sequences) per replica per step (>= 1)
  int64_t max_tokens;   // tokens per replica per step (>= 1)
  int64_t max_seq;      // the longest sequence (prompt + generated) a block table holds (>= 1)
} tpr_sched_opts;

// One sequence's work in a step.
typedef struct tpr_sched_chunk {
  int64_t seq;                // sequence id (tpr_sched_submit)
  int64_t pos0;               // position of the chunk's first token (= computed before the step)
  int64_t n;                  // tokens in the chunk (>= 1)
  const int32_t *tokens;      // (n) the chunk's token ids
  bool sample;                // pos0 + n == len: sample the token after the chunk
  bool first;                 // the sequence's first chunk since submission or preemption
  const int32_t *blocks;      // (n_blocks) the block table, covering positions < pos0 + n
  int64_t n_blocks;
} tpr_sched_chunk;

// A step's plan. Pointers stay valid until the next tpr_sched_next or
// tpr_sched_update call.
typedef struct tpr_sched_step {
  int replicas;
  const int64_t *n_chunks;              // (replicas)
  const tpr_sched_chunk *const *chunks; // (replicas) arrays of n_chunks[r] chunks
  int64_t tokens;                       // sum of every chunk's n
  int64_t preempted;                    // sequences preempted while planning this step
} tpr_sched_step;

typedef struct tpr_sched tpr_sched;

// Bad options: TPR_ERR_INVALID_ARG naming the option.
tpr_status tpr_sched_new(const tpr_sched_opts *o, tpr_sched **out);
void tpr_sched_free(tpr_sched *s);

// Adds a sequence (the prompt is copied). Ids are 0, 1, 2, ... in submission
// order. stop_token >= 0 ends the sequence when sampled (it is kept in the
// output); -1: none. Errors (TPR_ERR_INVALID_ARG, nothing added): an empty
// prompt, max_new < 1, len + max_new > max_seq, or a sequence that would need
// more blocks than a whole pool holds ("the KV pool of N blocks x B tokens is
// too small for one sequence of L tokens") -- it could never finish.
tpr_status tpr_sched_submit(tpr_sched *s, const int32_t *prompt, int64_t len, int64_t max_new, int32_t stop_token,
                            int64_t *id);

// Plans the next step into *out. Returns TPR_OK with out->tokens == 0 when no
// sequence is unfinished.
tpr_status tpr_sched_next(tpr_sched *s, tpr_sched_step *out);

// Applies a step's results: sampled[r][i] is the token sampled for the i-th
// chunk of replica r that has sample set (in chunk order; arrays may be NULL
// for replicas with none). Every chunk's tokens count as computed; a sequence
// that reaches max_new generated tokens or samples its stop token finishes
// and its blocks return to the pool. Token ids are not checked here.
tpr_status tpr_sched_update(tpr_sched *s, const tpr_sched_step *step, const int32_t *const *sampled);

// Ends sequence id now, as if it had finished: a running one returns its
// blocks to the pool, a waiting one leaves the queue; its tokens so far stay
// readable. Between steps only (a planned step not yet applied:
// TPR_ERR_INVALID_ARG); an unknown id is TPR_ERR_INVALID_ARG; a finished one
// is left as it is.
tpr_status tpr_sched_cancel(tpr_sched *s, int64_t id);

// A sequence's tokens so far: prompt then generated (valid until the next
// call that changes the scheduler).
typedef struct tpr_sched_seq_info {
  const int32_t *tokens;
  int64_t len, prompt_len;
  int replica;
  bool finished;
  int64_t preemptions;  // times this sequence was preempted
} tpr_sched_seq_info;
tpr_status tpr_sched_seq(const tpr_sched *s, int64_t id, tpr_sched_seq_info *out);

int64_t tpr_sched_unfinished(const tpr_sched *s);
int64_t tpr_sched_waiting(const tpr_sched *s);  // unfinished sequences holding no blocks (queued or preempted)
int64_t tpr_sched_blocks_in_use(const tpr_sched *s, int replica);
int64_t tpr_sched_preemptions(const tpr_sched *s);  // total so far

#endif
