// What the engine tests under mpirun share: the world and the mesh given on
// the command line (--tp/--dp/--ep), sessions on transformers' MiniMax-M2
// fixture (m2_ref.h), and seeds every rank agrees on.
#ifndef TPR_TEST_ENGINE_FIXTURE_H
#define TPR_TEST_ENGINE_FIXTURE_H

#include <stdint.h>

#include "collectives/tpr_comm.h"
#include "engine/engine.h"
#include "m2_ref.h"
#include "mpi_util.h"

extern tt_mesh em;  // set by em_init: MPI up, the mesh from argv
void em_init(int *argc, char ***argv);

// A session on the fixture at the mesh: max_seq em_max_seq, this batch and
// block size; kv_bytes 0: room for max_batch full sequences.
#define EM_MAX_SEQ 32
tpr_session *em_open_session(int64_t max_batch, int64_t block_size, int64_t kv_bytes);
// The same on the checkpoint in dir (another fixture of vocabulary M2_V).
tpr_session *em_open_session_dir(const char *dir, int64_t max_batch, int64_t block_size, int64_t kv_bytes);

// Bytes of one KV block of 4 rows on this rank (a probe session's pool / its blocks).
uint64_t em_block_bytes(void);

// A fresh random seed from rank 0's test RNG, the same on every rank.
uint64_t em_shared_seed(void);

// What an engine's on_logits saw on this rank: rows[seq][gen] (vocab M2_V).
#define EM_MAX_SEQS 16
#define EM_MAX_GEN 10
typedef struct em_recorded {
  float rows[EM_MAX_SEQS][EM_MAX_GEN][M2_V];
  bool have[EM_MAX_SEQS][EM_MAX_GEN];
} em_recorded;
void em_on_logits(void *ctx, int64_t seq, int64_t gen, const float *logits, int64_t vocab);  // ctx: em_recorded

// Rank 0's final token lists of sequences 0..n-1 (n <= EM_MAX_SEQS) on
// every rank: tokens[i] (len[i] of them, prompt_len[i] the prompt's), the
// replica that ran each (NULL: not wanted). Every sequence has finished.
void em_share_results(const tpr_engine *e, int n, int32_t (*tokens)[EM_MAX_SEQ], int64_t *len, int64_t *prompt_len,
                      int *replica);

#endif
