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
//
// Sibling groups (tpr_sched_submit_n, OpenAI's n): n sequences of one prompt
// share the KV blocks of its first k = floor((len - 1) / block_size) whole
// blocks. Sequence 0 of the group (the leader) is an ordinary sequence. Each
// other sequence (a sibling) goes to the leader's replica and, at the head
// of its replica's waiting queue:
//  - waits (and the sequences behind it with it: FCFS) while the leader is
//    running, was never preempted, and has computed fewer than k * block_size
//    tokens before this step (rows written in the step being planned are not
//    yet readable);
//  - once they are computed, is admitted holding the leader's first k blocks
//    (one more reference each) with computed = k * block_size, and computes
//    only the rest of the prompt (at least its last token, so it samples its
//    own first token). Positions < k * block_size are never written again by
//    anyone: every holder writes at positions >= its computed;
//  - runs as an ordinary sequence (recomputing the whole prompt) when k is 0,
//    or the leader finished, was cancelled, or was ever preempted before the
//    sibling's admission. A preempted sibling recomputes as any sequence.
// A block returns to the pool when its last holder finishes or is preempted.
// The waiting rule cannot stall a replica: a sibling waits only on a leader
// that is running and mid-prompt (k * block_size <= len - 1, so at least two
// tokens are left) and never preempted, so no sibling of it runs yet; the
// leader is then the replica's one mid-prompt sequence, and the argument in
// scheduler.c (the others are decodes, or it runs alone holding less than a
// pool) plans a chunk for it or for a decode.
// Prefix cache (opts.prefix_cache; engine/block_pool.h): once a step has
// written every row of a block of a sequence's table, tpr_sched_update
// registers the block under its key (its parent's chain hash, its
// block_size token ids), prompt and generated tokens alike. A sequence
// admitted from the waiting queue (not as a sibling sharing its leader's
// blocks) walks its tokens' first k = floor((len - 1) / block_size) whole
// blocks and takes the registered ones of the longest matching prefix (one
// more holder each; cached free ones leave the LRU order), with computed =
// hits * block_size, so at least its last token is computed and sampled
// from. It keeps at least one free block for that rest: hits that would
// leave none are dropped from the end. The same rule as for siblings holds:
// a registered block is full, and every holder writes at positions >= its
// computed, so a registered block is never written again; it is only
// evicted (taken for new rows) once no one holds it. A preempted sequence
// looks its tokens up again when readmitted (its own blocks, if still
// cached). Siblings keep their waiting rule and take their leader's blocks
// as with no cache (shared_blocks counts them, and they count as hit tokens):
// the cache alone could miss them, since a block equal to one registered
// before it stays unregistered, and is not found once that one is evicted.
// A sibling whose leader no longer qualifies is looked up like any
// sequence. Each lookup or sibling admission counts its len as queried tokens
// and its hits as hit tokens (tpr_sched_prefix_stats).
// A released sequence (tpr_sched_release) keeps a tombstone of a few words,
// so ids are never reused.
#ifndef TPR_ENGINE_SCHEDULER_H
#define TPR_ENGINE_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/status.h"

typedef enum tpr_sched_fault {
  TPR_SCHED_FAULT_NONE = 0,
  TPR_SCHED_FAULT_WRITE_SHARED,  // a sibling is admitted one row short: it rewrites the last shared row
  TPR_SCHED_FAULT_FREE_SHARED,   // a holder letting go of a shared block frees it for every holder
  // Prefix-cache keys hold a block's first token alone: blocks that begin alike match.
  TPR_SCHED_FAULT_PREFIX_FIRST_TOKEN,
  // A verification keeps the blocks that hold only its rejected drafts' rows.
  TPR_SCHED_FAULT_KEEP_REJECTED_BLOCKS,
} tpr_sched_fault;

typedef struct tpr_sched_opts {
  int replicas;         // dp replicas, each with its own block pool (>= 1)
  int64_t pool_blocks;  // KV blocks per replica (>= 1)
  int64_t block_size;   // token rows per block (>= 1)
  int64_t max_batch;    // chunks (sequences) per replica per step (>= 1)
  int64_t max_tokens;   // tokens per replica per step (>= 1)
  int64_t max_seq;      // the longest sequence (prompt + generated) a block table holds (>= 1)
  bool prefix_cache;    // reuse registered full blocks across sequences (see above)
  // Recurrent state slots per replica (a hybrid model's linear layers; 0:
  // none). A running sequence holds one slot, taken at admission (a waiting
  // sequence is admitted only when a slot is free: FCFS, the ones behind it
  // wait too) and given back when it is preempted, finishes or is cancelled;
  // its chunks name it (tpr_sched_chunk.state_slot). The state at a position
  // is only in the slot of the sequence that computed it, so no sequence may
  // start past position 0 on someone else's blocks: prefix_cache must be off
  // (tpr_sched_new refuses both) and siblings do not share their leader's
  // blocks (each computes its whole prompt).
  // Speculative decoding with state slots: a verification's state has
  // absorbed every draft, so one with a rejected draft is rolled back by
  // recompute: the engine restores the slot's state from a snapshot taken
  // before the step, and the sequence's computed goes back to the
  // verification's pos0, so its next chunk runs the kept tokens (the first
  // and the accepted drafts: m rows, chunk.recompute) again before the new
  // one. Its blocks for those rows are kept. One with every draft accepted
  // keeps its state as it is.
  int64_t state_slots;
  // Test only (negative controls of the sharing checks); 0 in real runs.
  tpr_sched_fault debug_fault;
} tpr_sched_opts;

// One sequence's work in a step.
typedef struct tpr_sched_chunk {
  int64_t seq;                // sequence id (tpr_sched_submit)
  int64_t pos0;               // position of the chunk's first token (= computed before the step)
  int64_t n;                  // tokens in the chunk (>= 1)
  const int32_t *tokens;      // (n) the chunk's token ids
  bool sample;                // pos0 + n == len: sample the token after the chunk
  bool first;                 // the sequence's first chunk since admission (pos0 > 0: a sibling's, after the shared blocks)
  const int32_t *blocks;      // (n_blocks) the block table, covering positions < pos0 + n
  int64_t n_blocks;
  int32_t state_slot;         // the sequence's state slot (opts.state_slots > 0), else -1
  // Speculative decoding: a decode verifying drafts (tpr_sched_set_draft):
  // its last n_draft tokens are drafts, and each of its 1 + n_draft rows is
  // sampled. 0: an ordinary chunk.
  int64_t n_draft;
  bool drafts_later;  // its drafts are the engine's to write (tpr_sched_set_draft with NULL)
  // State rollback (opts.state_slots): the first `recompute` tokens run
  // again after a verification rejected a draft (their rows were computed
  // before, from the state the engine restored); 0: none.
  int64_t recompute;
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

// What tpr_sched_submit would refuse, from the options alone (a pure
// function: callable from any thread on a copy of the options).
tpr_status tpr_sched_check_submit(const tpr_sched_opts *o, const int32_t *prompt, int64_t len, int64_t max_new,
                                  int32_t stop_token);

// Adds a sibling group: n >= 1 sequences of one prompt (copied once per
// sequence), sequence i with max_new[i] and stop_token[i]; ids are
// *first_id + i. Errors as tpr_sched_submit, for any i; nothing is added.
tpr_status tpr_sched_submit_n(tpr_sched *s, const int32_t *prompt, int64_t len, const int64_t *max_new,
                              const int32_t *stop_token, int64_t n, int64_t *first_id);

// Plans the next step into *out. Returns TPR_OK with out->tokens == 0 when no
// sequence is unfinished.
tpr_status tpr_sched_next(tpr_sched *s, tpr_sched_step *out);

// Applies a step's results: sampled[r] holds, for each chunk of replica r
// that has sample set (in chunk order), 1 + n_draft entries: the token
// sampled after the chunk (n_draft 0), or for a verification its accepted
// drafts, then the target's token after them, then -1 for each rejected
// draft past the first (arrays may be NULL for replicas with none). Every
// chunk's tokens count as computed, a verification's first token and
// accepted drafts only: the rows of its rejected drafts are rolled back and
// blocks holding nothing else go back to the pool. Tokens are appended one
// by one: a sequence that reaches max_new generated tokens or samples its
// stop token finishes there (later tokens of the same verification are
// dropped) and its blocks return to the pool. Token ids are not checked
// here; verified tokens that do not match the drafts are
// TPR_ERR_INVALID_ARG, nothing applied.
tpr_status tpr_sched_update(tpr_sched *s, const tpr_sched_step *step, const int32_t *const *sampled);

// Ends sequence id now, as if it had finished: a running one returns its
// blocks to the pool, a waiting one leaves the queue; its tokens so far stay
// readable. Between steps only (a planned step not yet applied:
// TPR_ERR_INVALID_ARG); an unknown id is TPR_ERR_INVALID_ARG; a finished one
// is left as it is.
tpr_status tpr_sched_cancel(tpr_sched *s, int64_t id);

// Forgets a finished (or cancelled) sequence: its tokens and block table
// are freed; its id stays taken. Unknown, unfinished or already released:
// TPR_ERR_INVALID_ARG.
tpr_status tpr_sched_release(tpr_sched *s, int64_t id);

// A sequence's tokens so far: prompt then generated (valid until the next
// call that changes the scheduler). A released id: TPR_ERR_INVALID_ARG.
typedef struct tpr_sched_seq_info {
  const int32_t *tokens;
  int64_t len, prompt_len;
  int replica;
  bool finished;
  int64_t preemptions;    // times this sequence was preempted
  int64_t shared_blocks;  // blocks it holds from its group's leader since its admission (0: none, or not any more)
  int64_t cached_blocks;  // prefix-cache hits of its last admission (0 once preempted or finished)
} tpr_sched_seq_info;
tpr_status tpr_sched_seq(const tpr_sched *s, int64_t id, tpr_sched_seq_info *out);

// Speculative decoding (the engine, rank 0, between steps): up to k draft
// tokens to follow sequence id's last token in the next step, where they are
// verified (tpr_sched_chunk.n_draft). Taken only by a running sequence with
// just its last token left to compute (a decode), and at most
// max_new - generated - 1 of them; the plan gives each planned decode as
// many as the step's token budget and the free blocks allow, after every
// decode is planned (a draft never preempts), and drops the rest. Drafts
// last for one plan. An unknown id, k < 0 or a planned step waiting:
// TPR_ERR_INVALID_ARG.
// draft NULL: k drafts the engine writes into the planned chunk's tokens
// itself after planning (self-speculation); tpr_sched_update then does not
// compare the verified tokens with them.
tpr_status tpr_sched_set_draft(tpr_sched *s, int64_t id, const int32_t *draft, int64_t k);
// Drafts verified so far, those accepted, and the verifications; with state
// slots, the verifications rolled back (a draft rejected) and the tokens
// planned again after them (chunk.recompute, summed at planning).
typedef struct tpr_sched_spec_stats {
  int64_t drafted, accepted, verifications;
  int64_t rollbacks, recomputed;
} tpr_sched_spec_stats;
tpr_sched_spec_stats tpr_sched_spec(const tpr_sched *s);

int64_t tpr_sched_unfinished(const tpr_sched *s);
int64_t tpr_sched_waiting(const tpr_sched *s);  // unfinished sequences holding no blocks (queued or preempted)
int64_t tpr_sched_blocks_in_use(const tpr_sched *s, int replica);
int64_t tpr_sched_preemptions(const tpr_sched *s);  // total so far
// State slots of a replica held by its running sequences (-1: no such replica).
int64_t tpr_sched_state_slots_in_use(const tpr_sched *s, int replica);
// Prefix cache totals over every lookup so far, in tokens (0 when off).
void tpr_sched_prefix_stats(const tpr_sched *s, int64_t *queried, int64_t *hit);
// Registered blocks of a replica's pool, held or cached free (-1: no such replica).
int64_t tpr_sched_cached_blocks(const tpr_sched *s, int replica);
// Holders of block id of a replica's pool (0: free; -1: no such block).
int32_t tpr_sched_block_refs(const tpr_sched *s, int replica, int32_t id);

#endif
