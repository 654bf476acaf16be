// Paged KV cache CPU kernels (vLLM's PagedAttention layout): the in-place
// write of a step's new rows into the block pool, and causal GQA attention of
// a ragged batch of tokens from many sequences over that pool.
//
// Attention splits the T tokens into runs: consecutive tokens of one
// sequence at consecutive positions (a prefill chunk is one run, a decode
// token a run of 1). All runs go to flash.c's blocked kernel in one
// threaded call, which reads each run's keys and values in place through its
// block table (a pool whose D stride is not 1 is first gathered run by run
// into a contiguous scratch). A token's output is defined on a fixed grid of
// key positions, so it is exactly what tpr_attention gives for the same run
// over a contiguous cache, bit for bit, and it depends only on its run's data
// -- never on the other sequences of the batch (batch invariance) nor on the
// thread count.
//
// Every index is checked before anything is written (out, or the pool).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "runtime/ops/cpu_kernels.h"
#include "runtime/ops/strided.h"

// Element i of a 1-D i32 tensor, or (i, j) of a 2-D one, through its strides.
static int64_t at1(const tpr_tensor *t, int64_t i) { return tpr__index_at(t, i * t->stride[0]); }
static int64_t at2(const tpr_tensor *t, int64_t i, int64_t j) {
  return tpr__index_at(t, i * t->stride[0] + j * t->stride[1]);
}

// pool (NB, bs, Hkv, D) f32, new (T, Hkv, D) f32, slot_mapping (T) i32;
// writes pool row slot_mapping[t] := new[t] in place (slot < 0: skipped);
// out (1) i32 = the number of rows written. Duplicate slots: the later token
// wins (tokens are written in order).
TPR_CPU_KERNEL(paged_cache_write) {
  const char *op = "paged_cache_write (cpu)";
  if (n_in != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: expected 3 inputs, got %d", op, n_in);
  const tpr_tensor *pool = in[0], *nw = in[1], *sm = in[2];
  // Dtypes and shapes: the shape rule (paged_rules.c) checked them.
  const int64_t T = nw->shape[0], bs = pool->shape[1], rows = pool->shape[0] * bs;
  int64_t written = 0;
  for (int64_t t = 0; t < T; t++) {  // every slot first: an error writes nothing
    const int64_t r = at1(sm, t);
    if (r >= rows)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: slot_mapping[%lld] = %lld is outside the pool's NB*bs = %lld rows",
                      op, (long long)t, (long long)r, (long long)rows);
    written += r >= 0;
  }
  // The pool is written through its storage (the handle is const), as cache_write.
  float *base = tpr_tensor_data(pool);
  const float *src = tpr_tensor_data(nw);
  const int64_t *ps = pool->stride, *ns = nw->stride;
  for (int64_t t = 0; t < T; t++) {
    const int64_t r = at1(sm, t);
    if (r < 0) continue;  // a padded token
    tpr__strided_copy(base + (r / bs) * ps[0] + (r % bs) * ps[1], ps + 2, src + t * ns[0], ns + 1, 2, nw->shape + 1,
                      sizeof(float));
  }
  const int32_t n32 = (int32_t)written;  // written <= T, an i32 by the rule's (T) i32 input
  memcpy(tpr_tensor_data(out), &n32, sizeof n32);
  return TPR_OK;
}

typedef struct paged_run {
  int64_t t0, n;   // tokens [t0, t0 + n)
  int64_t s;       // their sequence
  int64_t start;   // position of token t0; token t0 + i is at start + i
} paged_run;

// Splits the tokens into runs and checks every index the attention reads;
// *n_runs runs go to runs (T entries). *max_ctx: the longest run context
// (rows); *n_blocks: the block table entries all runs read.
static tpr_status plan_runs(const char *op, const tpr_tensor *bt, const tpr_tensor *seq, const tpr_tensor *pos,
                            int64_t NB, int64_t bs, paged_run *runs, int64_t *n_runs, int64_t *max_ctx,
                            int64_t *n_blocks) {
  const int64_t T = seq->shape[0], B = bt->shape[0], MB = bt->shape[1], cap = MB * bs;
  int64_t nr = 0;
  *max_ctx = 0, *n_blocks = 0;
  for (int64_t t = 0; t < T; t++) {
    const int64_t s = at1(seq, t), p = at1(pos, t);
    if (s < 0) continue;  // a padded token: no run, zero output
    if (s >= B)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: seq[%lld] = %lld but block_tables has B = %lld rows", op,
                      (long long)t, (long long)s, (long long)B);
    if (p < 0 || p >= cap)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: positions[%lld] = %lld is outside [0, MB*bs = %lld)", op,
                      (long long)t, (long long)p, (long long)cap);
    paged_run *last = nr ? &runs[nr - 1] : NULL;
    if (last && last->t0 + last->n == t && last->s == s && last->start + last->n == p) {
      last->n++;
      continue;
    }
    runs[nr++] = (paged_run){.t0 = t, .n = 1, .s = s, .start = p};
  }
  for (int64_t i = 0; i < nr; i++) {
    const paged_run *r = &runs[i];
    const int64_t ctx = r->start + r->n;  // <= cap: the run's last position was checked
    for (int64_t j = 0; j * bs < ctx; j++) {
      const int64_t b = at2(bt, r->s, j);
      if (b < 0 || b >= NB)
        return TPR_FAIL(TPR_ERR_INVALID_ARG,
                        "%s: block_tables[%lld][%lld] = %lld (read by token %lld at position %lld) is outside the "
                        "pool's [0, NB = %lld) blocks",
                        op, (long long)r->s, (long long)j, (long long)b, (long long)(r->t0 + r->n - 1),
                        (long long)(ctx - 1), (long long)NB);
    }
    *max_ctx = ctx > *max_ctx ? ctx : *max_ctx;
    *n_blocks += (ctx + bs - 1) / bs;
  }
  *n_runs = nr;
  return TPR_OK;
}

// dst (ctx, Hkv, D) contiguous := the pool rows of positions [0, ctx) of
// sequence s, one block (bs rows) at a time.
static void gather(float *dst, const tpr_tensor *pool, const tpr_tensor *bt, int64_t s, int64_t ctx) {
  const int64_t bs = pool->shape[1], Hkv = pool->shape[2], D = pool->shape[3], *ps = pool->stride;
  const int64_t ds[3] = {Hkv * D, D, 1};
  const float *base = tpr_tensor_data(pool);
  for (int64_t j0 = 0; j0 < ctx; j0 += bs) {
    const int64_t shape[3] = {ctx - j0 < bs ? ctx - j0 : bs, Hkv, D};
    tpr__strided_copy(dst + j0 * Hkv * D, ds, base + at2(bt, s, j0 / bs) * ps[0], ps + 1, 3, shape, sizeof(float));
  }
}

// A pool the kernel reads in place: D stride 1.
static tpr__kv_src pool_src(const tpr_tensor *pool) {
  const int64_t *ps = pool->stride;
  return (tpr__kv_src){.base = tpr_tensor_data(pool), .ld = ps[1], .hs = ps[2], .bstride = ps[0]};
}

// q (T, Hq, D) f32, k_pool/v_pool (NB, bs, Hkv, D) f32, block_tables (B, MB)
// i32, seq (T) i32, positions (T) i32; out (T, Hq, D) contiguous.
// attrs->f[0] = scale.
TPR_CPU_KERNEL(paged_attention) {
  const char *op = "paged_attention (cpu)";
  if (n_in != 6) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: expected 6 inputs, got %d", op, n_in);
  const tpr_tensor *q = in[0], *kp = in[1], *vp = in[2], *bt = in[3], *seq = in[4], *pos = in[5];
  // Dtypes and shapes: the shape rule (paged_rules.c) checked them.
  if (!attrs || attrs->n_f < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: missing scale f[0]", op);
  const int64_t T = q->shape[0], Hq = q->shape[1], D = q->shape[2];
  const int64_t NB = kp->shape[0], bs = kp->shape[1], Hkv = kp->shape[2];
  const int n_threads = ctx ? ((const tpr_cpu_ctx *)ctx)->n_threads : 1;

  paged_run *runs = malloc((size_t)(T > 0 ? T : 1) * sizeof *runs);
  tpr__attn_run *ar = malloc((size_t)(T > 0 ? T : 1) * sizeof *ar);
  if (!runs || !ar) {
    free(runs), free(ar);
    return TPR_FAIL(TPR_ERR_OOM, "%s: %lld runs", op, (long long)T);
  }
  int64_t n_runs = 0, max_ctx = 0, n_blocks = 0;
  tpr_status rc = plan_runs("paged_attention", bt, seq, pos, NB, bs, runs, &n_runs, &max_ctx, &n_blocks);
  float *o = tpr_tensor_data(out), *ks = NULL, *vs = NULL;
  int64_t *blocks = NULL;
  tpr__heads_view qv;
  memset(&qv, 0, sizeof qv);
  if (rc != TPR_OK) goto done;
  memset(o, 0, (size_t)(T * Hq * D) * sizeof *o);  // padded tokens' rows stay 0
  if (n_runs == 0 || Hq == 0 || D == 0) goto done;
  TPR_CHECK_GOTO(tpr__heads_view_init("q", q, T, &qv), rc, done);
  const float scale = attrs->f[0];
  for (int64_t i = 0; i < n_runs; i++) {
    const paged_run *r = &runs[i];
    ar[i] = (tpr__attn_run){.q = qv.base + r->t0 * qv.ld, .o = o + r->t0 * Hq * D, .n = r->n, .start = r->start};
  }
  if (D == 1 || (kp->stride[3] == 1 && vp->stride[3] == 1)) {  // in place: every run in one threaded call
    blocks = malloc((size_t)(n_blocks > 0 ? n_blocks : 1) * sizeof *blocks);
    if (!blocks) {
      rc = TPR_FAIL(TPR_ERR_OOM, "%s: %lld block table entries", op, (long long)n_blocks);
      goto done;
    }
    for (int64_t i = 0, nb = 0; i < n_runs; i++) {
      ar[i].blk_off = nb;
      for (int64_t j = 0; j * bs < runs[i].start + runs[i].n; j++) blocks[nb++] = at2(bt, runs[i].s, j);
    }
    const tpr__kv_src ksrc = pool_src(kp), vsrc = pool_src(vp);
    rc = tpr__attention_fwd(n_threads, op, ar, n_runs, qv.ld, qv.hstride, &ksrc, &vsrc, blocks, bs, Hq, Hkv, D,
                            scale);
    goto done;
  }
  ks = malloc((size_t)(max_ctx * Hkv * D) * sizeof *ks);  // (ctx, Hkv, D) gathered keys
  vs = malloc((size_t)(max_ctx * Hkv * D) * sizeof *vs);  // and values
  if (!ks || !vs) {
    rc = TPR_FAIL(TPR_ERR_OOM, "%s: scratch for %lld keys x %lld heads x %lld dims", op, (long long)max_ctx,
                  (long long)Hkv, (long long)D);
    goto done;
  }
  const tpr__kv_src kc = {.base = ks, .ld = Hkv * D, .hs = D}, vc = {.base = vs, .ld = Hkv * D, .hs = D};
  for (int64_t i = 0; i < n_runs && rc == TPR_OK; i++) {
    gather(ks, kp, bt, runs[i].s, runs[i].start + runs[i].n);
    gather(vs, vp, bt, runs[i].s, runs[i].start + runs[i].n);
    rc = tpr__attention_fwd(n_threads, op, &ar[i], 1, qv.ld, qv.hstride, &kc, &vc, NULL, 0, Hq, Hkv, D, scale);
  }
done:
  free(runs), free(ar), free(blocks), free(ks), free(vs), free(qv.scratch);
  return rc;
}

const tpr__kernel_def tpr__paged_attention_cpu[] = {
    {TPR_OP_PAGED_CACHE_WRITE, cpu_paged_cache_write},
    {TPR_OP_PAGED_ATTENTION, cpu_paged_attention},
    {0},
};
