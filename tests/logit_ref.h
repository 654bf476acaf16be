// engine/engine.h's logit processing of one row, computed id by id from
// the request and the token history the way the header states it (not from
// the engine's history summaries): the reference of test_logit_proc and
// test_engine_requests.
#ifndef TPR_TEST_LOGIT_REF_H
#define TPR_TEST_LOGIT_REF_H

#include <stdint.h>

#include "engine/engine.h"

// The steps, numbered as in the header: bias, the min_new mask, repetition,
// frequency / presence. logit_ref_order is the header's order; another
// permutation gives a deliberately wrong reference (negative controls).
enum { REF_BIAS, REF_MIN_NEW, REF_REPETITION, REF_FREQUENCY_PRESENCE };
extern const int logit_ref_order[4];

// out (vocab) = raw (vocab) processed for the sequence's next token, its
// history tokens (len): prompt_len prompt tokens, then the generated ones.
// Each step is done in double and rounded to float, as the header says.
void logit_ref_row(const float *raw, int64_t vocab, const tpr_gen_params *g, const int32_t *tokens,
                   int64_t prompt_len, int64_t len, const int order[4], float *out);

// The greedy choice from a row: the highest logit, the lowest id on ties.
int64_t logit_ref_argmax(const float *row, int64_t vocab);

// ids (vocab) = 0..vocab-1 by x (vocab) descending, ties lower id first:
// the order of top_logprobs (and of tpr_sample's candidates).
void logit_ref_sorted_ids(const double *x, int64_t vocab, int32_t *ids);

#endif
