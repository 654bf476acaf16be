// Check mode (TPR_COMM_CHECK=1): before each collective every rank of the
// group shares what it is about to call, over the group's host channel, and
// all of them fail with the same message when they disagree. A mismatched
// count or dtype would otherwise corrupt memory or hang; a rank that skipped
// a call shows up as a different op or sequence number here.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"

enum { REC_OP, REC_SEQ, REC_COUNT, REC_DTYPE, REC_RED, REC_ROOT, REC_LEN };

static void describe_call(const int64_t *r, char *buf, size_t cap) {
  static const char *const red[] = {"sum", "max", "min"};
  if (r[REC_OP] == TPR__OP_BARRIER) {
    snprintf(buf, cap, "barrier #%lld", (long long)r[REC_SEQ]);
    return;
  }
  const char *dt = tpr_dtype_valid((tpr_dtype)r[REC_DTYPE]) ? tpr_dtype_name((tpr_dtype)r[REC_DTYPE]) : "?";
  int n = snprintf(buf, cap, "%s #%lld (count %lld, %s", tpr__coll_op_name((tpr__coll_op)r[REC_OP]),
                   (long long)r[REC_SEQ], (long long)r[REC_COUNT], dt);
  if (r[REC_RED] >= 0 && r[REC_RED] <= 2 && n > 0 && (size_t)n < cap)
    n += snprintf(buf + n, cap - (size_t)n, ", %s", red[r[REC_RED]]);
  if (r[REC_ROOT] >= 0 && n > 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, ", root %lld", (long long)r[REC_ROOT]);
  if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, ")");
}

static bool same_call(const int64_t *a, const int64_t *b) {
  bool v = a[REC_OP] == TPR__OP_ALL_TO_ALLV;  // per-rank extents differ legitimately
  return a[REC_OP] == b[REC_OP] && a[REC_SEQ] == b[REC_SEQ] && (v || a[REC_COUNT] == b[REC_COUNT]) &&
         a[REC_DTYPE] == b[REC_DTYPE] && a[REC_RED] == b[REC_RED] && a[REC_ROOT] == b[REC_ROOT];
}

static tpr_status host_all_gather(tpr_comm_t c, const int64_t *mine, int64_t *all, size_t n) {
  tpr_comm_t h = c->host ? c->host : c;
  return h->vt->all_gather(h->ctx, mine, all, n, TPR_I64);
}

// Rank i's recv_counts[j] must be what rank j sends to i. Every rank gathers
// all send and recv counts, so all of them reach the same verdict.
static tpr_status agree_v_counts(tpr_comm_t c, const size_t *send_counts, const size_t *recv_counts) {
  size_t n = (size_t)c->size;
  int64_t *mine = malloc(2 * n * sizeof *mine), *all = malloc(2 * n * n * sizeof *all);
  tpr_status rc = mine && all ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "check mode: count matrix");
  for (size_t j = 0; rc == TPR_OK && j < n; j++) {
    mine[j] = (int64_t)send_counts[j];
    mine[n + j] = (int64_t)recv_counts[j];
  }
  if (rc == TPR_OK) rc = host_all_gather(c, mine, all, 2 * n);
  for (size_t i = 0; rc == TPR_OK && i < n; i++)
    for (size_t j = 0; rc == TPR_OK && j < n; j++) {
      int64_t sent = all[j * 2 * n + i], expected = all[i * 2 * n + n + j];
      if (sent != expected)
        rc = TPR_FAIL(TPR_ERR_COMM,
                      "check mode: all_to_allv on group %s: rank %zu expects %lld elements from rank %zu, which "
                      "sends %lld",
                      c->name, i, (long long)expected, j, (long long)sent);
    }
  free(mine);
  free(all);
  return rc;
}

tpr_status tpr__comm_agree(tpr_comm_t c, const tpr__call *call, const size_t *send_counts,
                           const size_t *recv_counts) {
  int64_t mine[REC_LEN] = {call->op, (int64_t)call->seq, (int64_t)call->count, call->dtype, call->red_op,
                           call->root};
  int64_t *all = malloc((size_t)c->size * REC_LEN * sizeof *all);
  if (!all) return TPR_FAIL(TPR_ERR_OOM, "check mode: call records");
  tpr_status rc = host_all_gather(c, mine, all, REC_LEN);
  if (rc != TPR_OK) {
    free(all);
    return rc;
  }
  char msg[1536], group[160], what[128];
  int used = 0, bad = 0;
  for (int r = 1; r < c->size; r++) bad += !same_call(all, all + (size_t)r * REC_LEN);
  if (bad) {
    used = snprintf(msg, sizeof msg, "check mode: ranks of group %s disagree on a collective:",
                    tpr__comm_describe(c, group, sizeof group));
    for (int r = 0; r < c->size && used > 0 && (size_t)used + 200 < sizeof msg; r++) {
      describe_call(all + (size_t)r * REC_LEN, what, sizeof what);
      used += snprintf(msg + used, sizeof msg - (size_t)used, "\n  rank %d (world %d) calls %s%s", r,
                       c->world_ranks[r], what, r && !same_call(all, all + (size_t)r * REC_LEN) ? "  <- differs" : "");
    }
  }
  free(all);
  if (bad) return TPR_FAIL(TPR_ERR_COMM, "%s", msg);
  if (call->op == TPR__OP_ALL_TO_ALLV) return agree_v_counts(c, send_counts, recv_counts);
  return TPR_OK;
}
