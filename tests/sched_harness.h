// The scheduler's test harness (tests/sched_harness.c), driven by a fake
// model: the token after position p of sequence id is a hash of (id, p).
// test_scheduler.c has the tests and says what the harness checks.
#ifndef TPR_TEST_SCHED_HARNESS_H
#define TPR_TEST_SCHED_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/scheduler.h"

typedef struct exp_seq {
  int32_t *tok;  // prompt then the tokens the fake model generates
  int64_t len, prompt_len, max_new, arrival_step;
  int32_t stop;
  int64_t group_n;  // > 1: this sequence leads a group of group_n submitted together (tpr_sched_submit_n)
  int64_t leader;   // a sibling: its group's leader; -1 otherwise
} exp_seq;

typedef struct harness {
  tpr_sched_opts o;
  tpr_sched *s;
  int32_t vocab;
  int wrong_model;  // negative control: sample the token one position too far
  exp_seq *e;
  int64_t n, submitted;
  int64_t *shadow, *seen_pre, *finish_step;  // (n) computed as the test sees it, preemptions seen, step finished
  bool *running;  // (n) admitted and neither preempted nor finished since
  int32_t **table;  // (n) each live sequence's block table as its last chunk gave it (n_table[i] entries)
  int64_t *n_table, *shared;  // (n) table lengths; leading blocks taken from the leader at admission
  int64_t *kv;  // (replicas, pool_blocks * block_size, 3) seq, position, token; -1 = never written
  int64_t step, steps_run, max_step_tokens, max_step_chunks, preemptions, recompute_generated;
  int64_t shared_admissions, blocks_shared, alone_siblings;  // siblings admitted holding / not holding leader blocks
  int64_t cached_admissions, blocks_cached;  // admissions holding prefix-cache blocks, and those blocks
  int64_t peak_blocks;  // the most blocks in use after a step, over the replicas
  int64_t log_seq, n_log, log[64][3];  // the chunks of sequence log_seq: pos0, n, sample
  // Speculative decoding: drafts of 1..spec_k tokens offered to every
  // sequence before each step (a random prefix of them right); 0: none.
  int64_t spec_k;
  int32_t (*drafts)[8];  // (n) the drafts offered to each sequence for this step
  int64_t drafted, accepted, verifications;
  char err[512];
} harness;

// The fake model's token after position pos of sequence id.
int32_t fake_next(int64_t id, int64_t pos, int32_t vocab);
// Builds the expected tokens of a sequence (id = its index).
void exp_init(exp_seq *e, int64_t id, int64_t prompt_len, int64_t max_new, int32_t stop, int32_t vocab,
              int64_t arrival_step);
// A group of n at ids id..id+n-1 sharing the leader's prompt.
void exp_init_group(exp_seq *e, int64_t id, int64_t n, int64_t prompt_len, const int64_t *max_new, int32_t vocab,
                    int64_t arrival_step);
void h_init(harness *h, tpr_sched_opts o, int64_t n, int32_t vocab);
void h_free(harness *h);
// The harness's view of which sequences are computed, from the scheduler.
void sync_shadow(harness *h);
// NULL when step st is right, else what is wrong (in h->err).
const char *check_step(harness *h, const tpr_sched_step *st);
// Submits the arrivals, plans, checks and runs one step (NULL: right).
const char *h_step(harness *h);
// Runs to the end and compares every sequence with its expected tokens.
const char *h_run(harness *h);
tpr_sched_opts sched_opts(int replicas, int64_t pool, int64_t bs, int64_t batch, int64_t tokens, int64_t max_seq);

#endif
