// The parity harness the per-family tests share (test_qwen3_moe,
// test_hunyuan_moe, test_mrope): the mesh from the command line, sessions on
// it, transformers' reference read from a fixture, the logits parity over
// prompts and the greedy decode through the KV cache. Each test keeps its
// family's controls.
#ifndef TPR_TEST_FAMILY_PARITY_H
#define TPR_TEST_FAMILY_PARITY_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/session.h"
#include "mpi_util.h"
#include "shard/safetensors.h"

// The process's mesh (mpi_util.h).
typedef tt_mesh fp_mesh;
extern fp_mesh fp;

// MPI up, the mesh read from argv, the seed drawn and printed on rank 0.
void fp_init(int *argc, char ***argv);
// A fresh seed from rank 0's stream, the same on every rank.
int64_t fp_shared_seed(void);
// Session options for `dir` at the mesh (one sequence of max_seq tokens).
tpr_session_opts fp_session_opts(const char *dir, int64_t max_seq);
// A session on comm (fp.world when NULL); fails the test if it cannot open.
tpr_session *fp_open(const tpr_session_opts *o, tpr_comm_t comm);

// rows x cols (cols 0: a vector) ids stored as f32 in the reference.
void fp_read_ids(const tpr_st_set *set, const char *name, int64_t rows, int64_t cols, int32_t *ids);
int fp_argmax(const float *row, int64_t V);

// Prefills prompt[0, P) (pos3 (3, T) MRoPE positions or NULL: 1-D), then
// decodes tokens P..T+ng-2 one at a time; from T-1 on each row picks the
// next token, which must equal greedy[g], its row within the reference's
// greedy_logits[g]. seq (T+ng) gets the sequence, rows ((T+ng) x V, or NULL)
// each decoded row. Returns the worst decoded row vs the reference.
double fp_decode(tpr_session *s, const int32_t *prompt, int64_t T, int64_t P, const int32_t *pos3,
                 const int32_t *greedy, const float *greedy_logits, int64_t ng, int64_t V, int32_t *seq, float *rows);

// The two-prompt fixture (make_qwen3_moe_fixture.py's reference layout):
// tokens_a/b and their logits, greedy_a and greedy_logits_a.
typedef struct fp_ref {
  int64_t V, ta, tb, ng;
  int32_t *a, *b, *greedy;
  float *logits_a, *logits_b, *greedy_logits;
} fp_ref;
void fp_load_ref(const char *dir, int64_t V, int64_t ta, int64_t tb, int64_t ng, fp_ref *r);
void fp_free_ref(fp_ref *r);

// The worst error over both prompts (printed on rank 0), the same on every rank.
double fp_parity(tpr_session *s, const fp_ref *r);
// parity at the mesh, printed and held to `bound`.
void fp_test_parity(const tpr_session_opts *o, const fp_ref *r, double bound);
// Control: parity must break `bound`; `what` names it in the failure.
void fp_test_control(const tpr_session_opts *o, const fp_ref *r, double bound, const char *what);
// Greedy from a random prefill through the KV cache: tokens equal, decoded
// rows within `bound` of transformers' and within `kv_bound` of one full
// forward over the whole sequence.
void fp_test_greedy_cached(const tpr_session_opts *o, const fp_ref *r, double bound, double kv_bound);

// What tpr run does: the batched engine on the checkpoint in dir with a
// text prompt (tt ids; no 3-D positions: every axis is the sequence
// position), two sequences in one batch, each ngt greedy tokens equal to
// transformers' generate (want_tokens (ngt)) and their logits within bound
// of want_logits (ngt, V).
void fp_test_engine_text(const char *dir, const int32_t *text, int64_t tt, const int32_t *want_tokens,
                         const float *want_logits, int64_t ngt, int64_t V, double bound);

// Runs the tests, frees ref (when not NULL) and returns every rank's
// verdict (main's exit code); frees the world.
int fp_run(const struct CMUnitTest *tests, size_t n, fp_ref *ref);

#endif
