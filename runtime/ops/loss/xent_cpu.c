// Vocab-parallel cross-entropy (Megatron's; ops.h "Vocab-parallel
// cross-entropy"): CPU kernels of xent_max, xent_sumexp(_bwd),
// xent_target(_bwd) and xent_loss(_bwd).
//
// Each rank holds logits (T, Vl) for vocab columns [shard*Vl, shard*Vl + Vl);
// columns >= V are padding (the vocab is padded to a multiple of tp) and are
// skipped by every kernel: they never win the max, never add to the sum,
// never hold a target and always get a zero gradient.
//
// Numerics: exp and log are evaluated in double and sums accumulate in
// double, rounded once to f32, so results are deterministic and independent
// of how the vocab is sharded up to that final rounding. A row's exp and
// its sum run in xent_rows.c (eight lanes, the same bits on every ISA
// level); the other sums go in ascending column (or token) order. The
// (T, Vl) kernels split tokens over threads (cpu_threads.h), each row
// summed by one thread, so results do not depend on the thread count
// either.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/cpu_threads.h"
#include "xent_rows.h"

#define XENT_IGNORE (-100)

// Element i of a 1-D (or (n, 1)) i32/i64 tensor, any stride.
static int64_t index_at(const tpr_tensor *t, int64_t i) { return tpr__index_at(t, i * t->stride[0]); }

// Element t of a (T, 1) f32 column, any stride.
static double col_at(const tpr_tensor *c, int64_t t) { return ((const float *)tpr_tensor_data(c))[t * c->stride[0]]; }

// This shard's first global column and how many of its Vl columns are real
// (< V). A negative shard is an error; a shard past the vocabulary owns no
// real column (its columns are all padding).
static tpr_status shard_cols(const char *op, const tpr_tensor *shard, int64_t Vl, int64_t V, int64_t *lo,
                             int64_t *n_valid) {
  int64_t s = index_at(shard, 0);
  if (s < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: shard index %lld is negative", op, (long long)s);
  if (s > (INT64_MAX - Vl) / Vl) {  // shard*Vl would overflow: far past any vocabulary
    *lo = INT64_MAX - Vl;
    *n_valid = 0;
    return TPR_OK;
  }
  *lo = s * Vl;
  int64_t n = V - *lo;
  *n_valid = n < 0 ? 0 : n > Vl ? Vl : n;
  return TPR_OK;
}

// This rank's logits (T, Vl) with the shard's place in the vocabulary: the
// real columns are [0, nv), global column lo + j.
typedef struct shard_logits {
  const float *d;
  int64_t T, Vl, s0, s1, lo, nv;
} shard_logits;

static tpr_status shard_logits_of(const char *op, const tpr_tensor *l, const tpr_tensor *shard, int64_t V,
                                  shard_logits *x) {
  *x = (shard_logits){.d = tpr_tensor_data(l), .T = l->shape[0], .Vl = l->shape[1], .s0 = l->stride[0],
                      .s1 = l->stride[1]};
  return shard_cols(op, shard, x->Vl, V, &x->lo, &x->nv);
}

static inline float logit(const shard_logits *x, int64_t t, int64_t j) { return x->d[t * x->s0 + j * x->s1]; }

// Row t's real columns contiguous: in place, or copied into buf (nv) when
// the columns are strided.
static const float *row_of(const shard_logits *x, int64_t t, float *buf) {
  if (x->s1 == 1) return x->d + t * x->s0;
  for (int64_t j = 0; j < x->nv; j++) buf[j] = logit(x, t, j);
  return buf;
}

// Targets must be -100 (ignored) or in [0, limit) (limit < 0: no upper
// bound known to the op); the error names the first bad token position.
static tpr_status check_targets(const char *op, const tpr_tensor *targets, int64_t limit) {
  int64_t T = targets->shape[0];
  for (int64_t t = 0; t < T; t++) {
    int64_t y = index_at(targets, t);
    if (y == XENT_IGNORE) continue;
    if (y < 0 || (limit >= 0 && y >= limit)) {
      if (limit >= 0)
        return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: target %lld at token position %lld is outside [0, V = %lld) and "
                        "is not the ignore index -100", op, (long long)y, (long long)t, (long long)limit);
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: target %lld at token position %lld is negative and not the ignore "
                      "index -100", op, (long long)y, (long long)t);
    }
  }
  return TPR_OK;
}

// out (T, 1) = max over this shard's real columns. A row with none gets
// -FLT_MAX: it loses the all-reduce max to every finite logit of another
// shard, and unlike -inf it stays finite, so no consumer ever forms
// inf - inf or 0 * inf (NaN) from it. A NaN logit makes the row's max NaN.
TPR_CPU_KERNEL(xent_max) {
  shard_logits x;
  TPR_CHECK(shard_logits_of("xent_max", in[0], in[1], attrs->i[0], &x));
  float *o = tpr_tensor_data(out);
  const int nt = tpr__cpu_nt(ctx, x.T * x.nv);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t t = 0; t < x.T; t++) {
    float m = -FLT_MAX;
    for (int64_t j = 0; j < x.nv; j++) {
      float v = logit(&x, t, j);
      if (isnan(v)) {
        m = v;
        break;
      }
      if (v > m) m = v;
    }
    o[t] = m;
  }
  return TPR_OK;
}

// out (T, 1) = sum over real columns of exp(l - max), max the global one.
TPR_CPU_KERNEL(xent_sumexp) {
  const tpr_tensor *mx = in[1];
  shard_logits x;
  TPR_CHECK(shard_logits_of("xent_sumexp", in[0], in[2], attrs->i[0], &x));
  float *o = tpr_tensor_data(out);
  const int nt = tpr__cpu_nt(ctx, x.T * x.nv);
  float *bufs = x.s1 == 1 ? NULL : malloc((size_t)(nt * x.nv + 1) * sizeof *bufs);
  if (x.s1 != 1 && !bufs) return TPR_FAIL(TPR_ERR_OOM, "xent_sumexp: a row of %lld logits", (long long)x.nv);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t t = 0; t < x.T; t++) {
    float *buf = bufs ? bufs + omp_get_thread_num() * x.nv : NULL;
    o[t] = (float)tpr_xent_row_sumexp(row_of(&x, t, buf), x.nv, col_at(mx, t));
  }
  free(bufs);
  return TPR_OK;
}

// d logits (T, Vl) = dy * exp(l - max) on real columns, 0 on padding. The
// max is held fixed: its own gradient cancels in the loss (see xent_loss's
// backward rule, runtime/grad/loss.c), so no cotangent is ever formed for it.
TPR_CPU_KERNEL(xent_sumexp_bwd) {
  const tpr_tensor *mx = in[1], *dy = in[3];
  shard_logits x;
  TPR_CHECK(shard_logits_of("xent_sumexp_bwd", in[0], in[2], attrs->i[0], &x));
  float *o = tpr_tensor_data(out);
  const int64_t Vl = x.Vl;
  const int nt = tpr__cpu_nt(ctx, x.T * Vl);
  float *bufs = x.s1 == 1 ? NULL : malloc((size_t)(nt * x.nv + 1) * sizeof *bufs);
  if (x.s1 != 1 && !bufs) return TPR_FAIL(TPR_ERR_OOM, "xent_sumexp_bwd: a row of %lld logits", (long long)x.nv);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t t = 0; t < x.T; t++) {
    float *buf = bufs ? bufs + omp_get_thread_num() * x.nv : NULL;
    tpr_xent_row_grad(row_of(&x, t, buf), x.nv, col_at(mx, t), col_at(dy, t), o + t * Vl);
    for (int64_t j = x.nv; j < Vl; j++) o[t * Vl + j] = 0.0f;
  }
  free(bufs);
  return TPR_OK;
}

// out (T, 1) = logits[t, y_t - shard*Vl] where this shard owns y_t, else 0
// (also for y_t = -100). Targets are checked first: a bad one writes nothing.
TPR_CPU_KERNEL(xent_target) {
  const tpr_tensor *y = in[1];
  shard_logits x;
  TPR_CHECK(shard_logits_of("xent_target", in[0], in[2], attrs->i[0], &x));
  TPR_CHECK(check_targets("xent_target", y, attrs->i[0]));
  float *o = tpr_tensor_data(out);
  for (int64_t t = 0; t < x.T; t++) {
    int64_t yt = index_at(y, t), j = yt - x.lo;
    o[t] = (yt != XENT_IGNORE && j >= 0 && j < x.nv) ? logit(&x, t, j) : 0.0f;
  }
  return TPR_OK;
}

// d logits (T, Vl): dy[t] at the target's column where this shard owns it,
// zeros elsewhere. The op has no V (the forward checked targets < V); it
// still refuses negative targets other than -100.
TPR_CPU_KERNEL(xent_target_bwd) {
  const tpr_tensor *dy = in[0], *y = in[1];
  int64_t T = dy->shape[0], Vl = attrs->i[0], lo = 0, nv = 0;
  TPR_CHECK(shard_cols("xent_target_bwd", in[2], Vl, INT64_MAX, &lo, &nv));
  TPR_CHECK(check_targets("xent_target_bwd", y, -1));
  float *o = tpr_tensor_data(out);
  memset(o, 0, (size_t)(T * Vl) * sizeof *o);
  for (int64_t t = 0; t < T; t++) {
    int64_t yt = index_at(y, t);
    if (yt == XENT_IGNORE || yt < lo || yt - lo >= nv) continue;
    o[t * Vl + (yt - lo)] = (float)col_at(dy, t);
  }
  return TPR_OK;
}

// Counted (target != -100) positions; fails on other negative targets.
static tpr_status count_targets(const char *op, const tpr_tensor *y, int64_t *count) {
  TPR_CHECK(check_targets(op, y, -1));
  int64_t c = 0;
  for (int64_t t = 0; t < y->shape[0]; t++) c += index_at(y, t) != XENT_IGNORE;
  *count = c;
  return TPR_OK;
}

// out (1) = mean over counted t of log(sumexp) + max - target, in double in
// token order; 0 when every target is ignored (torch gives NaN there; a
// batch of padding must not poison the step).
TPR_CPU_KERNEL(xent_loss) {
  const tpr_tensor *se = in[0], *mx = in[1], *tg = in[2], *y = in[3];
  int64_t T = se->shape[0], count = 0;
  TPR_CHECK(count_targets("xent_loss", y, &count));
  double acc = 0;
  for (int64_t t = 0; t < T; t++)
    if (index_at(y, t) != XENT_IGNORE) acc += log(col_at(se, t)) + col_at(mx, t) - col_at(tg, t);
  ((float *)tpr_tensor_data(out))[0] = count ? (float)(acc / (double)count) : 0.0f;
  return TPR_OK;
}

// out (2T) packed (dsumexp | dtarget): dloss / (count * sumexp_t) and
// -dloss / count for counted t, zeros for ignored t. The max's partial
// (+dloss / count) is left out on purpose: sumexp's dependence on the max
// gives exactly -dloss / count back, so the two cancel.
TPR_CPU_KERNEL(xent_loss_bwd) {
  const tpr_tensor *se = in[0], *y = in[1];
  int64_t T = se->shape[0], count = 0;
  TPR_CHECK(count_targets("xent_loss_bwd", y, &count));
  double dl = ((const float *)tpr_tensor_data(in[2]))[0];
  float *o = tpr_tensor_data(out);
  for (int64_t t = 0; t < T; t++) {
    bool on = count > 0 && index_at(y, t) != XENT_IGNORE;
    o[t] = on ? (float)(dl / ((double)count * col_at(se, t))) : 0.0f;
    o[T + t] = on ? (float)(-dl / (double)count) : 0.0f;
  }
  return TPR_OK;
}

const tpr__kernel_def tpr__xent_cpu[] = {
    {TPR_OP_XENT_MAX, cpu_xent_max},
    {TPR_OP_XENT_SUMEXP, cpu_xent_sumexp},
    {TPR_OP_XENT_SUMEXP_BWD, cpu_xent_sumexp_bwd},
    {TPR_OP_XENT_TARGET, cpu_xent_target},
    {TPR_OP_XENT_TARGET_BWD, cpu_xent_target_bwd},
    {TPR_OP_XENT_LOSS, cpu_xent_loss},
    {TPR_OP_XENT_LOSS_BWD, cpu_xent_loss_bwd},
    {0},
};
