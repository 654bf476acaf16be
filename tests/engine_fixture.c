#include "engine_fixture.h"

#include <stdlib.h>
#include <string.h>

#include "m2_ref.h"
#include "mpi_util.h"
#include "test_util.h"

tt_mesh em;

void em_init(int *argc, char ***argv) { em = tt_mesh_init(argc, argv); }

tpr_session *em_open_session(int64_t max_batch, int64_t block_size, int64_t kv_bytes) {
  return em_open_session_dir(M2_FIX, max_batch, block_size, kv_bytes);
}

tpr_session *em_open_session_dir(const char *dir, int64_t max_batch, int64_t block_size, int64_t kv_bytes) {
  tpr_session_opts o = {.model_dir = dir, .max_seq = EM_MAX_SEQ, .max_batch = max_batch,
                        .block_size = block_size, .kv_cache_bytes = kv_bytes, .tp = em.tp, .dp = em.dp,
                        .ep = em.ep, .force_tp_rank = -1};
  tpr_session *s = NULL;
  TT_OK(tpr_session_open(&o, em.world, tt_cpu(), &s));
  return s;
}

uint64_t em_block_bytes(void) {
  tpr_session *probe = em_open_session(1, 4, 0);
  tpr_session_pool p = tpr_session_pool_info(probe);
  tpr_session_close(probe);
  return p.bytes / (uint64_t)p.blocks;
}

uint64_t em_shared_seed(void) { return (uint64_t)tt_shared_seed(em.world); }

void em_on_logits(void *ctx, int64_t seq, int64_t gen, const float *logits, int64_t vocab) {
  em_recorded *r = ctx;
  if (seq >= EM_MAX_SEQS || gen >= EM_MAX_GEN || vocab != M2_V) return;
  memcpy(r->rows[seq][gen], logits, sizeof r->rows[seq][gen]);
  r->have[seq][gen] = true;
}

void em_share_results(const tpr_engine *e, int n, int32_t (*tokens)[EM_MAX_SEQ], int64_t *len, int64_t *prompt_len,
                      int *replica) {
  enum { PER_SEQ = EM_MAX_SEQ + 3 };  // len, prompt_len, replica, tokens
  int64_t words[EM_MAX_SEQS * PER_SEQ] = {0};
  assert_true(n <= EM_MAX_SEQS);
  for (int i = 0; em.R == 0 && i < n; i++) {
    tpr_sched_seq_info si;
    TT_OK(tpr_engine_result(e, i, &si));
    assert_true(si.finished && si.len <= EM_MAX_SEQ);
    int64_t *w = words + i * PER_SEQ;
    w[0] = si.len, w[1] = si.prompt_len, w[2] = si.replica;
    for (int64_t t = 0; t < si.len; t++) w[3 + t] = si.tokens[t];
  }
  TT_OK(tpr_comm_broadcast(em.world, words, words, (size_t)(n * PER_SEQ), TPR_I64, 0));
  for (int i = 0; i < n; i++) {
    const int64_t *w = words + i * PER_SEQ;
    len[i] = w[0];
    if (prompt_len) prompt_len[i] = w[1];
    if (replica) replica[i] = (int)w[2];
    for (int64_t t = 0; t < len[i]; t++) tokens[i][t] = (int32_t)w[3 + t];
  }
}
