// The batched inference engine: continuous batching with chunked prefill
// over a paged KV cache, for every model family a session can load.
//
// Rank 0 owns the scheduler (engine/scheduler.h): sequences are submitted
// there, and each step rank 0 plans which tokens of which sequences run,
// then broadcasts the plan (sequences, token ids, positions, block tables,
// sampling parameters) so that every rank runs the same step with no
// scheduler of its own. Each dp replica runs its own sequences in its own
// pool; all replicas run the same program shape, padded, so the collectives
// line up. A step's token count is padded to a power of two, so a handful
// of programs serve every step.
//
// Sampling is per sequence: its own temperature / top-k / top-p and seed.
// The draw for the i-th generated token uses an RNG seeded from (seed, i)
// alone, so a sequence's tokens do not depend on what it was batched with,
// nor on preemption (recompute). Every rank of a replica samples the same
// token from the same all-gathered logits; rank 0 collects each replica's
// tokens with one small all-gather per step.
//
// Logit processing needs a sequence's history, which only rank 0 keeps: a
// chunk that samples with processing or logprobs carries extra plan words
// (its bias entries, its distinct prompt + generated ids, its generated
// (id, count) pairs, whether its stop token is masked); chunks without add
// nothing (engine_step.c). Logprob records ride the same all-gather, which
// grows only in steps where some chunk asks for them.
#ifndef TPR_ENGINE_ENGINE_H
#define TPR_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/logit_proc.h"  // tpr_logit_bias, tpr_token_logprob, TPR_MAX_*
#include "engine/token_constraint.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "models/sampling.h"

typedef struct tpr_engine_opts {
  int64_t max_tokens_per_step;  // tokens a replica runs per step (0: 256)
  // Called on every rank of the sequence's replica with the logits (vocab)
  // its gen-th generated token is sampled from (gen 0: the one after the
  // prompt), before sampling. NULL: none.
  void (*on_logits)(void *ctx, int64_t seq, int64_t gen, const float *logits, int64_t vocab);
  void *ctx;
  // Test only (a negative control): tokens attend the next chunk's block
  // table, not their own, so sequences read each other's history.
  bool debug_wrong_blocks;
  // Automatic prefix caching (engine/scheduler.h) is on unless this is set:
  // full KV blocks are kept, keyed by their tokens and every token before
  // them, and a prompt that begins with cached blocks prefills only the
  // rest. Outputs are the same bit for bit either way. The cache lives as
  // long as the engine.
  bool no_prefix_cache;
  // Test only (a negative control): cache keys hold a block's first token
  // alone, so a block is reused for a prompt whose block differs after it.
  bool debug_prefix_first_token;
  // Test only (a negative control): a hybrid model's chunks that continue a
  // sequence run on the state slot of the step's next chunk, so sequences
  // continue each other's state.
  bool debug_wrong_state_slot;
  // Speculative decoding: the most drafts any sequence may have verified in
  // one step (tpr_gen_params.spec.k <= this); 0: speculation off. Sizes the
  // step's sampled rows (max_batch * (1 + max_draft)).
  int64_t max_draft;
  // Self-speculative drafts (TPR_SPEC_SELF): the decoder layers they run
  // (1 .. layers - 1); every request's self:N:k must have this N. 0: none.
  int64_t draft_layers;
  // The external drafter (engine/speculative.h, TPR_SPEC_EXTERNAL; rank 0;
  // NULL: sequences asking for it are refused): up to k drafts to follow
  // sequence seq's tokens (len: prompt and output so far) into draft;
  // returns how many (0..k).
  int64_t (*draft)(void *ctx, int64_t seq, const int32_t *tokens, int64_t len, int64_t k, int32_t *draft);
  void *draft_ctx;
  // Test only (negative controls): a verification keeps the blocks of its
  // rejected drafts (no rollback of the block table); every draft is
  // accepted, whatever the model says (no verification).
  bool debug_keep_rejected_blocks;
  bool debug_accept_all_drafts;
  // Test only (a negative control): a hybrid model's verification with a
  // rejected draft does not restore its state slot from the snapshot (the
  // kept tokens are still recomputed, from a state that absorbed the drafts).
  bool debug_skip_state_restore;
} tpr_engine_opts;

// Every field but max_new, stop_token and sampling is off when zero, so
// {.max_new, .stop_token, .sampling} keeps its old meaning.
//
// Logit processing, in this order, on the logits of the row being sampled
// (vLLM's order), before temperature / top-k / top-p (tpr_sample):
//   0. constraint: -inf on every id its grammar does not allow next;
//   1. logit_bias: logit[id] += bias for each entry;
//   2. min_new: while fewer than min_new tokens are generated, the
//      stop_token's logit is -inf (the sequence cannot end early);
//   3. repetition_penalty r (HF / vLLM): every distinct id present in the
//      prompt or the generated tokens so far has logit / r if logit > 0,
//      logit * r otherwise;
//   4. frequency_penalty f and presence_penalty p (OpenAI): for every id
//      generated so far c times (c > 0), logit -= f * c + p. Prompt tokens
//      do not count.
// Each step is computed in double from the float logit and rounded back to
// float (engine/logit_proc.h).
// Logprobs are of the raw model output: log-softmax of the logits before
// any of this processing and before temperature (vLLM's default,
// "raw_logprobs"), computed in double.
typedef struct tpr_gen_params {
  int64_t max_new;         // tokens to generate (>= 1)
  int32_t stop_token;      // ends the sequence when sampled (kept); -1: none
  tpr_sampling sampling;   // temperature, top-k, top-p, seed
  int64_t min_new;         // >= 0, <= max_new: the stop token is masked until this many are generated
  double frequency_penalty;   // [-2, 2]; 0: off
  double presence_penalty;    // [-2, 2]; 0: off
  double repetition_penalty;  // (0, 2^31); 0 or 1: off
  const tpr_logit_bias *logit_bias;  // n_logit_bias entries (copied at submit; ids in the vocabulary)
  int64_t n_logit_bias;              // [0, TPR_MAX_LOGIT_BIAS]
  bool logprobs;           // record each generated token's logprob (tpr_engine_logprobs)
  int32_t top_logprobs;    // [0, TPR_MAX_TOP_LOGPROBS]: also the this many most likely ids (needs logprobs)
  // Structured output (rank 0; NULL: none): before anything else, ids the
  // grammar does not allow next get -inf. The caller owns it, one per
  // sequence, until the sequence is released.
  tpr_token_constraint *constraint;
  // Speculative decoding (engine/speculative.h; kind NONE: off): before each
  // decode step the drafter proposes up to spec.k tokens, the step verifies
  // them with the model, and the sequence advances by the agreeing prefix
  // plus the model's own next token. Greedy output is the same token for
  // token as without; with temperature / top-k / top-p each token is
  // accepted or redrawn by the speculative sampling rule
  // (tpr_sample_verify), so the output has the same distribution (not the
  // same draws: a draw's random numbers are spent differently). A sequence
  // with logit processing, logprobs or a constraint gets no drafts (it
  // decodes one token per step, as without). Hybrid models (recurrent
  // state): lookup and external drafts only; a verification snapshots the
  // sequence's state slot and, when a draft is rejected, restores it and
  // recomputes the kept tokens in the next step (docs/engine.md,
  // "Speculative decoding on hybrid models"). self:N:k is refused there.
  tpr_spec spec;
} tpr_gen_params;

typedef struct tpr_engine tpr_engine;

// On every rank (not collective). The session must stay open while the
// engine lives, and nothing else may use its KV pool meanwhile.
tpr_status tpr_engine_new(tpr_session *s, const tpr_engine_opts *o, tpr_engine **out);
void tpr_engine_free(tpr_engine *e);

// Any rank: TPR_ERR_INVALID_ARG naming the first token id outside the vocabulary.
tpr_status tpr_engine_check_prompt(const tpr_engine *e, const int32_t *prompt, int64_t len);

// Rank 0 only: queues a sequence; ids are 0, 1, 2, ... Bad ids or
// parameters, or a sequence longer than max_seq or than the whole pool:
// TPR_ERR_INVALID_ARG, nothing queued.
tpr_status tpr_engine_submit(tpr_engine *e, const int32_t *prompt, int64_t len, const tpr_gen_params *g,
                             int64_t *id);

// Rank 0 only: n sequences of the same prompt (OpenAI's n), g[i] the
// parameters of sequence i (each its own seed). Ids are consecutive
// (*first_id + i). They share the KV blocks of the prompt: sequence 0
// computes the prompt; the others are admitted once its first
// floor((len - 1) / block_size) blocks are written, take those blocks
// (reference-counted, never written again) and compute only the rest of
// the prompt, so the prompt's KV memory and prefill are paid about once.
// A sibling preempted, or admitted after sequence 0 lost its blocks,
// recomputes its whole prompt as any sequence does. Outputs equal n
// separate tpr_engine_submit calls with the same parameters. Errors as
// tpr_engine_submit, nothing queued.
tpr_status tpr_engine_submit_n(tpr_engine *e, const int32_t *prompt, int64_t len, const tpr_gen_params *g, int64_t n,
                               int64_t *first_id);

// Any rank, any thread (reads only what never changes after
// tpr_engine_new): what tpr_engine_submit would refuse for this prompt and
// these parameters (ids outside the vocabulary, bad parameters, len +
// max_new past max_seq, a sequence larger than a whole pool), with the
// same messages. Lets a server answer 400 before queueing anything.
tpr_status tpr_engine_check_request(const tpr_engine *e, const int32_t *prompt, int64_t len, const tpr_gen_params *g);
int64_t tpr_engine_max_seq(const tpr_engine *e);    // the longest sequence, prompt + generated
int64_t tpr_engine_vocab(const tpr_engine *e);      // the model's vocabulary (ids < this)

// What one step did (the same on every rank but `finished`).
typedef struct tpr_engine_step_info {
  bool idle;               // nothing to run: every sequence has finished
  int64_t tokens;          // real tokens run, over every replica (drafts and recomputed rows apart)
  int64_t prefill_tokens;  // of which prompt (or recomputed after a preemption) tokens
  int64_t decode_tokens;   // of which decodes (one per sequence; a verification's drafts not counted)
  int64_t draft_tokens;    // drafts verified (speculative decoding), beside tokens
  int64_t accepted;        // rank 0: of which accepted: the step generated decode_tokens + accepted tokens by decodes
  int64_t recomputed_tokens;  // rows run again after a hybrid model's state rollback (speculative), beside tokens
  int64_t sequences;       // chunks run
  int64_t program_tokens;  // T: the padded token count of the program
  int64_t preempted;       // sequences preempted while planning
  double seconds;          // this rank's wall time of the step
  double mask_seconds;     // rank 0: of which computing grammar masks (structured output, token_constraint.h)
  double state_copy_seconds;  // of which snapshotting and restoring a hybrid model's state slots (speculative)
  const int64_t *finished; // rank 0: sequences that finished in this step
  int64_t n_finished;
} tpr_engine_step_info;

// Collective: plans (rank 0), broadcasts, runs one step and samples.
tpr_status tpr_engine_step(tpr_engine *e, tpr_engine_step_info *info);

// Rank 0, between steps: ends a sequence now (a client went away, a stop
// string was found): its blocks return to the pool at once, and the next
// steps plan nothing more for it. Its tokens so far stay readable.
tpr_status tpr_engine_cancel(tpr_engine *e, int64_t id);

// Rank 0: a sequence's tokens so far (prompt then generated).
tpr_status tpr_engine_result(const tpr_engine *e, int64_t id, tpr_sched_seq_info *out);

// Rank 0: the logprobs of sequence id's generated token i (0-based), for a
// sequence submitted with logprobs; valid until the next step or release.
// TPR_ERR_INVALID_ARG: no such token yet, or the sequence did not ask.
tpr_status tpr_engine_logprobs(const tpr_engine *e, int64_t id, int64_t i, const tpr_token_logprob **out);

// Rank 0, between steps: forgets a finished (or cancelled) sequence: its
// tokens and logprobs are freed, its id is never reused, and results for
// it are TPR_ERR_INVALID_ARG from then on. A server calls this once an
// answer is sent, so memory does not grow with the requests served.
// An unfinished sequence: TPR_ERR_INVALID_ARG.
tpr_status tpr_engine_release(tpr_engine *e, int64_t id);

// Rank 0: KV blocks in use on replica r (0 once every sequence has ended;
// cached blocks no sequence holds count as free).
int64_t tpr_engine_blocks_in_use(const tpr_engine *e, int replica);
// Rank 0: the prefix cache so far, over every replica: prompt tokens looked
// up at admissions, those found cached, and the blocks cached now (held or
// free). All 0 with the cache off, and on other ranks.
typedef struct tpr_engine_prefix_stats {
  int64_t queried_tokens, hit_tokens, cached_blocks;
} tpr_engine_prefix_stats;
tpr_engine_prefix_stats tpr_engine_prefix(const tpr_engine *e);
int64_t tpr_engine_preemptions(const tpr_engine *e);
// Rank 0: speculative decoding so far: drafts verified, accepted, and
// verifications (decode steps of sequences with drafts); for a hybrid model
// also the verifications rolled back and the tokens recomputed after them.
tpr_sched_spec_stats tpr_engine_spec(const tpr_engine *e);
// Rank 0: recurrent state slots held on replica r (a hybrid model's running
// sequences; 0 once every sequence has ended, and for other models).
int64_t tpr_engine_state_slots_in_use(const tpr_engine *e, int replica);
int tpr_engine_replicas(const tpr_engine *e);  // dp replicas, each with its own KV pool
// Rank 0: unfinished sequences waiting for blocks (not yet admitted, or preempted).
int64_t tpr_engine_waiting(const tpr_engine *e);

#endif
