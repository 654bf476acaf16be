// MoE expert CPU kernels: SwiGLU experts as a grouped GEMM, fed either by
// dense gate weights (moe_experts) or by dispatched rows (moe_grouped_ffn,
// the expert-parallel path). Both run each expert through expert_ffn below,
// so a row gets the same per-row math whichever dispatcher brought it.
//
// moe_experts:
// For each expert in ascending order: gather the tokens whose gate is
// nonzero (ascending) into a contiguous block X_e (n_e, H), one sgemm
// X_e @ w13[e]^T -> (n_e, 2F) = [w1 x | w3 x], SwiGLU into (n_e, F), one
// sgemm with w2[e]^T -> (n_e, H), then out[t] += gate * y. Experts without
// tokens are skipped. Every token's contributions are added in ascending
// expert order, so the result is deterministic. Matches transformers'
// MiniMax-M2 expert loop: act(w1 x) * (w3 x), w2, times the routing weight,
// index_add into the output. With more than one thread and row-major
// experts, moe_experts and moe_experts_bwd spread the experts over the
// threads, one expert a thread (moe_experts_spread), with the same per-row
// results and the same order of additions into out; otherwise the loop
// over experts is single-threaded and each GEMM uses the threads.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ops/cpu_kernels.h"

#include "runtime/ops/strided.h"
#include "runtime/ops/gemm/weight_gemm.h"

static bool fits_blasint(int64_t v) { return (int64_t)(blasint)v == v; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// How sgemm reads a weight matrix stored (r, c) with strides (s0, s1), used
// transposed: the same rule as matmul/cpu.c. A row-major matrix is read as is
// (Trans), a column-major one as its transpose (NoTrans); one with neither
// unit stride is copied into row-major scratch first.
typedef struct operand {
  enum CBLAS_TRANSPOSE op;
  int64_t ld;
  bool copy;
} operand;

static operand layout_t(int64_t r, int64_t c, int64_t s0, int64_t s1) {
  operand o = {CblasTrans, max64(c, 1), false};
  if ((c <= 1 || s1 == 1) && (r <= 1 || s0 >= max64(c, 1))) {
    if (r > 1) o.ld = s0;
  } else if ((r <= 1 || s0 == 1) && (c <= 1 || s1 >= max64(r, 1))) {
    o.op = CblasNoTrans;
    o.ld = c > 1 ? s1 : max64(r, 1);
  } else {
    o.copy = true;
  }
  return o;
}

// Expert e's (r, c) matrix of w (E, r, c), ready for sgemm as its transpose.
static const float *weight(const tpr_tensor *w, int64_t e, float *scratch, operand *o) {
  const int64_t r = w->shape[1], c = w->shape[2];
  const float *m = (const float *)tpr_tensor_data(w) + e * w->stride[0];
  *o = layout_t(r, c, w->stride[1], w->stride[2]);
  if (!o->copy) return m;
  const int64_t shape[2] = {r, c}, cs[2] = {c, 1};
  tpr__strided_copy(scratch, cs, m, w->stride + 1, 2, shape, sizeof(float));
  return scratch;
}

// The forward kernels read the experts in the dtype the session holds them.
static bool weight_dtype_ok(const tpr_tensor *w13, const tpr_tensor *w2) {
  return (w13->dtype == TPR_F32 || w13->dtype == TPR_BF16 || w13->dtype == TPR_F8E4M3) && w2->dtype == w13->dtype;
}

static bool w13_fp8(const tpr_tensor *const *in) { return in[2]->dtype == TPR_F8E4M3; }

// silu(g) = g / (1 + exp(-g)), torch's formula; g << 0 gives -0, not NaN.
static inline float silu(float g) { return g / (1.0f + expf(-g)); }

// Scratch for expert_ffn over up to `rows` rows: X_e (rows, H), [w1 x | w3 x]
// (rows, 2F), act (rows, F), y (rows, H), and one expert weight matrix for
// when a weight needs a row-major copy.
// The backward adds dy (rows, H) (the cotangent of the expert's output
// rows), dgu (rows, 2F) = [dh1 | dh3] and dxe (rows, H); NULL in a forward.
typedef struct ffn_scratch {
  float *xe, *gu, *act, *y, *wbuf;
  float *dy, *dgu, *dxe;
} ffn_scratch;

static tpr_status scratch_new(const char *op, int64_t rows, int64_t H, int64_t F, bool bwd, ffn_scratch *s) {
  const size_t wmax = (size_t)max64(2 * F * H, H * F);
  const size_t fwd = (size_t)(rows * H) * 2 + (size_t)(rows * 2 * F) + (size_t)(rows * F) + wmax;
  const size_t extra = bwd ? (size_t)(rows * H) * 2 + (size_t)(rows * 2 * F) : 0;
  float *buf = malloc((fwd + extra + 1) * sizeof *buf);
  if (!buf) return TPR_FAIL(TPR_ERR_OOM, "%s (cpu): scratch for %lld rows", op, (long long)rows);
  *s = (ffn_scratch){0};
  s->xe = buf, s->gu = s->xe + rows * H, s->act = s->gu + rows * 2 * F, s->y = s->act + rows * F;
  s->wbuf = s->y + rows * H;
  if (bwd) s->dy = s->wbuf + wmax, s->dgu = s->dy + rows * H, s->dxe = s->dgu + rows * 2 * F;
  return TPR_OK;
}

// Shapes every expert kernel needs, in the BLAS integer range: rows (the
// most an expert gets), F2 = 2F, H, and the weights' inner strides.
static tpr_status check_blas_range(const char *op, int64_t rows, int64_t F2, int64_t H, const tpr_tensor *w13,
                                   const tpr_tensor *w2) {
  if (!fits_blasint(rows) || !fits_blasint(F2) || !fits_blasint(H) || !fits_blasint(w13->stride[1]) ||
      !fits_blasint(w13->stride[2]) || !fits_blasint(w2->stride[1]) || !fits_blasint(w2->stride[2]))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s (cpu): sizes or strides exceed the BLAS integer range", op);
  return TPR_OK;
}

// Whether expert_gemm reads expert matrices of w (E, N, K) in place: row-major.
static bool read_in_place(const tpr_tensor *w) {
  const int64_t N = w->shape[1], K = w->shape[2];
  return (K <= 1 || w->stride[2] == 1) && (N <= 1 || w->stride[1] >= K);
}

// y (n, N) = x (n, K) @ W_e^T, W_e = expert e's (N, K) matrix of w (E, N, K).
// A row-major W_e (the engine's stacked experts) is read as it is, in its
// dtype, by tpr__weight_gemm: the skinny kernel at few rows (decode), sgemm
// above. Other layouts: f32 through sgemm's transpose flags (or a copy), bf16
// widened into wbuf.
// An FP8 w (E, N, K) comes with its scales sc (E, N, S), one per row and
// block of `block` columns (the op's FP8 form); sc is NULL otherwise.
static tpr_status expert_gemm(const tpr_cpu_ctx *ctx, const tpr_tensor *w, const tpr_tensor *sc, int block, int64_t e,
                              const float *x, int64_t n, float *y, float *wbuf) {
  const int64_t N = w->shape[1], K = w->shape[2], s1 = w->stride[1], s2 = w->stride[2];
  const size_t es = tpr_dtype_size(w->dtype);
  const char *we = (const char *)tpr_tensor_data(w) + (size_t)(e * w->stride[0]) * es;
  if (read_in_place(w)) {
    tpr_weight_view v = tpr__weight_view(we, w->dtype, N > 1 ? s1 : max64(K, 1));
    if (sc) {
      if (sc->shape[2] > 1 && sc->stride[2] != 1)
        return TPR_FAIL(TPR_ERR_UNSUPPORTED, "expert gemm (cpu): FP8 scales must have unit column stride");
      v.scale = (const float *)tpr_tensor_data(sc) + e * sc->stride[0];
      v.scale_ld = N > 1 ? sc->stride[1] : sc->shape[2];
      v.block = block;
    }
    return tpr__weight_gemm(ctx, x, K, n, K, &v, N, y, N);
  }
  if (sc) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "expert gemm (cpu): FP8 experts must be row-major");
  if (w->dtype == TPR_F32) {
    operand l;
    const float *wf = weight(w, e, wbuf, &l);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, l.op, (blasint)n, (blasint)N, (blasint)K, 1.0f, x, (blasint)K, wf,
                (blasint)l.ld, 0.0f, y, (blasint)N);
    return TPR_OK;
  }
  for (int64_t i = 0; i < N; i++)
    for (int64_t j = 0; j < K; j++) wbuf[i * K + j] = (float)tpr_dtype_load(we, w->dtype, (size_t)(i * s1 + j * s2));
  tpr_weight_view v = tpr__weight_view(wbuf, TPR_F32, max64(K, 1));
  return tpr__weight_gemm(ctx, x, K, n, K, &v, N, y, N);
}

// s->y (n, H) = w2[e] @ (silu(w1[e] x) * (w3[e] x)) for the n rows of s->xe
// (n, H): [w1 x | w3 x] = X_e @ w13[e]^T -> (n, 2F), SwiGLU into (n, F),
// then @ w2[e]^T. w13 (E, 2F, H), w2 (E, H, F), any strides.
// The up half: s->gu (n, 2F) = [w1 x | w3 x], s->act (n, F) = silu(h1) * h3.
// The experts of an op: weights, and in the FP8 form their scales.
typedef struct experts {
  const tpr_tensor *w13, *w2, *s13, *s2;  // s13, s2 NULL unless FP8
  int block;
} experts;

static experts experts_of(const tpr_tensor *const *in, int n_in, const tpr_op_attrs *attrs) {
  int block = attrs && attrs->n_i > 0 ? (int)attrs->i[0] : 0;
  bool fp8 = block > 0 && n_in == 6;
  return (experts){in[2], in[3], fp8 ? in[4] : NULL, fp8 ? in[5] : NULL, block};
}

static tpr_status expert_up(const tpr_cpu_ctx *ctx, const experts *x, int64_t e, int64_t n, const ffn_scratch *s) {
  const int64_t F2 = x->w13->shape[1], F = F2 / 2;
  TPR_CHECK(expert_gemm(ctx, x->w13, x->s13, x->block, e, s->xe, n, s->gu, s->wbuf));
  for (int64_t i = 0; i < n; i++)
    for (int64_t f = 0; f < F; f++) s->act[i * F + f] = silu(s->gu[i * F2 + f]) * s->gu[i * F2 + F + f];
  return TPR_OK;
}

// The down half: s->y (n, H) = s->act @ w2[e]^T.
static tpr_status expert_down(const tpr_cpu_ctx *ctx, const experts *x, int64_t e, int64_t n, const ffn_scratch *s) {
  // the up half's weight copy is no longer needed
  return expert_gemm(ctx, x->w2, x->s2, x->block, e, s->act, n, s->y, s->wbuf);
}

static tpr_status expert_ffn(const tpr_cpu_ctx *ctx, const experts *x, int64_t e, int64_t n, const ffn_scratch *s) {
  TPR_CHECK(expert_up(ctx, x, e, n, s));
  return expert_down(ctx, x, e, n, s);
}

// Copies row r of x (rows, H) (any strides) to dst (H) contiguous.
static void load_row(float *dst, const tpr_tensor *x, int64_t r) {
  const int64_t one = 1, H = x->shape[1];
  tpr__strided_copy(dst, &one, (const float *)tpr_tensor_data(x) + r * x->stride[0], &x->stride[1], 1, &H,
                    sizeof(float));
}

// The rows of local expert e in a dispatched buffer: block src holds
// cnt[src*Er + e] of them from start[src*Er + e], for src ascending.
typedef struct expert_rows {
  const int64_t *start, *cnt;
  int64_t nsrc, Er;
} expert_rows;

// Copies expert e's rows of x (R, H) into dst (n, H), contiguous; returns n.
static int64_t gather_expert_rows(const expert_rows *g, int64_t e, const tpr_tensor *x, float *dst) {
  int64_t n = 0, H = x->shape[1];
  for (int64_t src = 0; src < g->nsrc; src++)
    for (int64_t r = g->start[src * g->Er + e]; r < g->start[src * g->Er + e] + g->cnt[src * g->Er + e]; r++)
      load_row(dst + (n++) * H, x, r);
  return n;
}

// The inverse: rows (n, H) back to expert e's places in out (R, H).
static void scatter_expert_rows(const expert_rows *g, int64_t e, const float *rows, int64_t H, float *out) {
  int64_t n = 0;
  for (int64_t src = 0; src < g->nsrc; src++)
    for (int64_t r = g->start[src * g->Er + e]; r < g->start[src * g->Er + e] + g->cnt[src * g->Er + e]; r++)
      memcpy(out + r * H, rows + (n++) * H, (size_t)H * sizeof *out);
}

// Dense gates (T, E) as lists, for the kernels that spread experts over
// threads: expert e's assignments are a = off[e] .. off[e+1]-1 (tokens
// ascending, token rows[a]); token t's are slot[per_tok[t] ..
// per_tok[t+1]-1] (experts ascending, expert slot_e[.]); order holds the
// active experts, the most rows first.
typedef struct routing {
  int64_t A, active, most;
  int64_t *off, *order;     // (E+1), (E)
  int64_t *per_tok;         // (T+1)
  int64_t *rows, *slot, *slot_e;  // (A) each
} routing;

static void routing_free(routing *r) { free(r->off), free(r->per_tok), free(r->rows); }

static tpr_status routing_new(const char *op, const tpr_tensor *g, routing *r) {
  const int64_t T = g->shape[0], E = g->shape[1], s0 = g->stride[0], s1 = g->stride[1];
  const float *gd = tpr_tensor_data(g);
  *r = (routing){0};
  r->off = calloc((size_t)(2 * E + 1), sizeof *r->off);
  r->per_tok = calloc((size_t)T + 1, sizeof *r->per_tok);
  if (!r->off || !r->per_tok) goto oom;
  r->order = r->off + E + 1;
  for (int64_t t = 0; t < T; t++)
    for (int64_t e = 0; e < E; e++)
      if (gd[t * s0 + e * s1] != 0.0f) r->off[e + 1]++, r->per_tok[t + 1]++;
  for (int64_t e = 0; e < E; e++) {
    r->most = max64(r->most, r->off[e + 1]);
    if (r->off[e + 1]) r->order[r->active++] = e;
    r->off[e + 1] += r->off[e];
  }
  for (int64_t t = 0; t < T; t++) r->per_tok[t + 1] += r->per_tok[t];
  r->A = r->off[E];
  r->rows = malloc((size_t)(3 * r->A + 1) * sizeof *r->rows);
  int64_t *fill = calloc((size_t)T + 1, sizeof *fill);
  if (!r->rows || !fill) {
    free(fill);
    goto oom;
  }
  r->slot = r->rows + r->A, r->slot_e = r->slot + r->A;
  for (int64_t e = 0, a = 0; e < E; e++)
    for (int64_t t = 0; t < T; t++)
      if (gd[t * s0 + e * s1] != 0.0f) {
        const int64_t j = r->per_tok[t] + fill[t]++;
        r->slot[j] = a, r->slot_e[j] = e, r->rows[a++] = t;
      }
  free(fill);
  for (int64_t i = 1; i < r->active; i++)  // the most rows first: the dynamic schedule then balances the rest
    for (int64_t j = i; j > 0; j--) {
      const int64_t a = r->order[j], b = r->order[j - 1];
      if (r->off[a + 1] - r->off[a] <= r->off[b + 1] - r->off[b]) break;
      r->order[j] = b, r->order[j - 1] = a;
    }
  return TPR_OK;
oom:
  routing_free(r);
  return TPR_FAIL(TPR_ERR_OOM, "%s (cpu): routing lists for %lld tokens", op, (long long)T);
}

// out (T, H) += the rows of ybuf (A, H) each token's experts gave, times
// their gates, in ascending expert order: the serial loops' order.
static void add_rows_by_token(const routing *r, const tpr_tensor *g, const float *ybuf, int64_t T, int64_t H,
                              bool gated, float *out) {
  const float *gd = tpr_tensor_data(g);
#pragma omp for schedule(static)
  for (int64_t t = 0; t < T; t++) {
    float *orow = out + t * H;
    for (int64_t j = r->per_tok[t]; j < r->per_tok[t + 1]; j++) {
      const float *y = ybuf + r->slot[j] * H;
      if (gated) {
        const float gate = gd[t * g->stride[0] + r->slot_e[j] * g->stride[1]];
        for (int64_t h = 0; h < H; h++) orow[h] += gate * y[h];
      } else {
        for (int64_t h = 0; h < H; h++) orow[h] += y[h];
      }
    }
  }
}

// moe_experts with the experts spread over the threads: every active expert
// runs whole on one thread (the most rows first, taken dynamically), its
// GEMMs single-threaded (OpenBLAS's OpenMP build runs on the calling thread
// inside a parallel region), into its own rows of ybuf (A, H), A the
// nonzero gates. Then each token adds its experts' rows in ascending expert
// order, as the serial loop does; each expert's GEMM sees the same rows in
// the same order as there, so out has the serial loop's bits on one thread,
// for any thread count. Saves a fork/join per GEMM (decode) and runs the
// gathers, SwiGLU and the weighted sums on every thread (prefill).
static tpr_status moe_experts_spread(const tpr_cpu_ctx *ctx, const experts *ex, const tpr_tensor *x,
                                     const tpr_tensor *g, float *o) {
  const int64_t T = x->shape[0], H = x->shape[1], F = ex->w13->shape[1] / 2;
  const int nt = ctx->n_threads;
  routing r;
  TPR_CHECK(routing_new("moe_experts", g, &r));
  float *ybuf = malloc((size_t)(r.A * H + 1) * sizeof *ybuf);  // (A, H)
  const size_t per_thread = (size_t)(r.most * H + r.most * 2 * F + r.most * F);  // xe, gu, act
  float *work = malloc(((size_t)nt * per_thread + 1) * sizeof *work);
  tpr_status *rcs = calloc((size_t)r.active + 1, sizeof *rcs), rc = TPR_OK;
  if (!ybuf || !work || !rcs) {
    rc = TPR_FAIL(TPR_ERR_OOM, "moe_experts (cpu): %lld expert rows of %lld", (long long)r.A, (long long)H);
    goto done;
  }
  tpr_cpu_ctx one = *ctx;
  one.n_threads = 1;
#pragma omp parallel num_threads(nt)
  {
    float *mine = work + (size_t)omp_get_thread_num() * per_thread;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < r.active; i++) {
      const int64_t e = r.order[i], n = r.off[e + 1] - r.off[e];
      ffn_scratch s = {.xe = mine, .gu = mine + n * H, .act = mine + n * H + n * 2 * F, .y = ybuf + r.off[e] * H};
      for (int64_t k = 0; k < n; k++) load_row(s.xe + k * H, x, r.rows[r.off[e] + k]);
      rcs[i] = expert_ffn(&one, ex, e, n, &s);
    }
    add_rows_by_token(&r, g, ybuf, T, H, true, o);
  }
  for (int64_t i = 0; i < r.active && rc == TPR_OK; i++) rc = rcs[i];
done:
  routing_free(&r);
  free(ybuf), free(work), free(rcs);
  return rc;
}

// x (T, H), gates (T, E), w13 (E, 2F, H), w2 (E, H, F); out (T, H) contiguous.
TPR_CPU_KERNEL(moe_experts) {
  const experts ex = experts_of(in, n_in, attrs);
  if (n_in != (ex.s13 ? 6 : 4) || (w13_fp8(in) && !ex.s13))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_experts (cpu): %d inputs do not fit its plain or FP8 form", n_in);
  const tpr_tensor *x = in[0], *g = in[1], *w13 = in[2], *w2 = in[3];
  if (x->dtype != TPR_F32 || g->dtype != TPR_F32 || !weight_dtype_ok(w13, w2) || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "moe_experts (cpu): x %s, gates %s, w13 %s, w2 %s, out %s; need f32, weights f32 "
                    "or bf16 (one dtype)",
                    tpr_dtype_name(x->dtype), tpr_dtype_name(g->dtype), tpr_dtype_name(w13->dtype),
                    tpr_dtype_name(w2->dtype), tpr_dtype_name(out->dtype));
  if (x->ndim != 2 || g->ndim != 2 || w13->ndim != 3 || w2->ndim != 3 || !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_experts (cpu): x, gates, w13, w2 and out shapes do not fit");
  const int64_t T = x->shape[0], H = x->shape[1], E = g->shape[1], F2 = w13->shape[1], F = F2 / 2;
  if (g->shape[0] != T || w13->shape[0] != E || w13->shape[2] != H || F2 % 2 || w2->shape[0] != E ||
      w2->shape[1] != H || w2->shape[2] != F)
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_experts (cpu): x, gates, w13, w2 and out shapes do not fit");
  float *o = tpr_tensor_data(out);
  if (T == 0 || H == 0) return TPR_OK;
  memset(o, 0, (size_t)(T * H) * sizeof *o);
  if (F == 0 || E == 0) return TPR_OK;  // every expert output is an empty sum
  TPR_CHECK(check_blas_range("moe_experts", T, F2, H, w13, w2));
  if (((const tpr_cpu_ctx *)ctx)->n_threads > 1 && read_in_place(w13) && read_in_place(w2))
    return moe_experts_spread(ctx, &ex, x, g, o);
  int64_t *idx = malloc((size_t)T * sizeof *idx);  // the current expert's tokens
  ffn_scratch s = {0};
  if (!idx || scratch_new("moe_experts", T, H, F, false, &s) != TPR_OK) {
    free(idx), free(s.xe);
    return TPR_FAIL(TPR_ERR_OOM, "moe_experts (cpu): scratch for %lld tokens", (long long)T);
  }
  const float *gd = tpr_tensor_data(g);
  tpr_status rc = TPR_OK;
  for (int64_t e = 0; e < E; e++) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; t++)
      if (gd[t * g->stride[0] + e * g->stride[1]] != 0.0f) idx[n++] = t;
    if (n == 0) continue;
    for (int64_t i = 0; i < n; i++) load_row(s.xe + i * H, x, idx[i]);
    if ((rc = expert_ffn(ctx, &ex, e, n, &s)) != TPR_OK) break;
    for (int64_t i = 0; i < n; i++) {
      const float gate = gd[idx[i] * g->stride[0] + e * g->stride[1]];
      float *orow = o + idx[i] * H;
      for (int64_t j = 0; j < H; j++) orow[j] += gate * s.y[i * H + j];
    }
  }
  free(idx), free(s.xe);
  return rc;
}

// counts (L = n*Er) i32 of x's R rows: *start (2L, freed by the caller) holds
// start[i] / cnt[i] = start[L + i], the first row and row count of (source
// s, expert e), i = s*Er + e; *total the counted rows, *most the largest
// number of rows one expert gets over every source. Counts that are
// negative or add up past R fail naming the entry.
static tpr_status parse_counts(const char *op, const tpr_tensor *c, int64_t R, int64_t Er, int64_t **start_out,
                               int64_t *total_out, int64_t *most_out) {
  const int64_t L = c->shape[0], nsrc = L / Er;
  int64_t *start = malloc(2 * (size_t)L * sizeof *start + 1), *cnt = start + L;
  if (!start) return TPR_FAIL(TPR_ERR_OOM, "%s (cpu): %lld counts", op, (long long)L);
  const int32_t *cd = tpr_tensor_data(c);
  int64_t total = 0, most = 0;
  for (int64_t i = 0; i < L; i++) {
    cnt[i] = cd[i * c->stride[0]];
    start[i] = total;
    total += cnt[i];
    if (cnt[i] < 0 || total > R) {
      const long long k = (long long)cnt[i], src = (long long)(i / Er), ex = (long long)(i % Er);
      free(start);  // cnt lives in the same block
      if (k < 0)
        return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: count %lld (source %lld, expert %lld) is negative: %lld", op,
                        (long long)i, src, ex, k);
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: counts add up to %lld rows by entry %lld (source %lld, "
                      "expert %lld), past x's R = %lld rows", op, (long long)total, (long long)i, src, ex,
                      (long long)R);
    }
  }
  for (int64_t e = 0; e < Er; e++) {
    int64_t n = 0;
    for (int64_t s = 0; s < nsrc; s++) n += cnt[s * Er + e];
    most = max64(most, n);
  }
  *start_out = start, *total_out = total, *most_out = most;
  return TPR_OK;
}

// x (R, H), counts (n*Er) i32, w13 (Er, 2F, H), w2 (Er, H, F); out (R, H)
// contiguous. x holds n source blocks, each with counts[s*Er + e] rows for
// local expert e in ascending e: the layout all_to_allv gives when every
// peer sends its moe_permute rows. Each expert gathers its rows from every
// block (sources ascending) into one contiguous X_e, runs expert_ffn once,
// and its outputs go back to the same row positions of out; rows past the
// counted ones are not written.
TPR_CPU_KERNEL(moe_grouped_ffn) {
  const experts ex = experts_of(in, n_in, attrs);
  if (n_in != (ex.s13 ? 6 : 4) || (w13_fp8(in) && !ex.s13))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_grouped_ffn (cpu): %d inputs do not fit its plain or FP8 form", n_in);
  const tpr_tensor *x = in[0], *c = in[1], *w13 = in[2], *w2 = in[3];
  if (x->dtype != TPR_F32 || c->dtype != TPR_I32 || !weight_dtype_ok(w13, w2) || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "moe_grouped_ffn (cpu): x %s, counts %s, w13 %s, w2 %s, out %s; need f32 with "
                    "i32 counts, weights f32 or bf16 (one dtype)", tpr_dtype_name(x->dtype), tpr_dtype_name(c->dtype), tpr_dtype_name(w13->dtype),
                    tpr_dtype_name(w2->dtype), tpr_dtype_name(out->dtype));
  if (x->ndim != 2 || c->ndim != 1 || w13->ndim != 3 || w2->ndim != 3 || !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_grouped_ffn (cpu): x, counts, w13, w2 and out shapes do not fit");
  const int64_t R = x->shape[0], H = x->shape[1], Er = w13->shape[0], F2 = w13->shape[1], F = F2 / 2;
  const int64_t L = c->shape[0];
  if (Er < 1 || L % Er || L < Er || w13->shape[2] != H || F2 % 2 || w2->shape[0] != Er || w2->shape[1] != H ||
      w2->shape[2] != F)
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_grouped_ffn (cpu): x, counts, w13, w2 and out shapes do not fit");
  const int64_t nsrc = L / Er;
  int64_t *start, *cnt, total, most;
  TPR_CHECK(parse_counts("moe_grouped_ffn", c, R, Er, &start, &total, &most));
  cnt = start + L;
  float *o = tpr_tensor_data(out);
  tpr_status rc = TPR_OK;
  ffn_scratch s = {0};
  if (total == 0 || H == 0) goto done;
  if (F == 0) {  // an empty sum per row: zeros
    memset(o, 0, (size_t)(total * H) * sizeof *o);
    goto done;
  }
  if ((rc = check_blas_range("moe_grouped_ffn", most, F2, H, w13, w2)) != TPR_OK) goto done;
  if ((rc = scratch_new("moe_grouped_ffn", most, H, F, false, &s)) != TPR_OK) goto done;
  const expert_rows rows = {start, cnt, nsrc, Er};
  for (int64_t e = 0; e < Er; e++) {
    int64_t n = gather_expert_rows(&rows, e, x, s.xe);
    if (n == 0) continue;
    if ((rc = expert_ffn(ctx, &ex, e, n, &s)) != TPR_OK) goto done;
    scatter_expert_rows(&rows, e, s.y, H, o);
  }
done:
  free(start), free(s.xe);
  return rc;
}

// ---------------------------------------------------------------- backward
//
// Per expert, from its rows s->xe (n, H) and their output cotangent s->dy
// (n, H) (already times the gate for moe_experts): recompute h = [h1 | h3]
// and a = silu(h1) * h3, then
//   dw2[e] = dy^T a,  da = dy w2[e],  dh1 = da * h3 * silu'(h1),
//   dh3 = da * silu(h1),  dw13[e] = [dh1 | dh3]^T x,  dx = [dh1 | dh3] w13[e]
// (the fused-MoE GateUpProj / DownProj backward, one sgemm each). Every result
// is a fixed function of the expert's rows, and the callers add the rows'
// dx in ascending expert order, so the backward is deterministic.

// The transpose of a layout_t operand: the stored matrix itself.
static enum CBLAS_TRANSPOSE untransposed(const operand *o) { return o->op == CblasTrans ? CblasNoTrans : CblasTrans; }

// silu'(g) = sig(g) (1 + g (1 - sig(g))).
static inline float dsilu(float g) {
  const float sg = 1.0f / (1.0f + expf(-g));
  return sg * (1.0f + g * (1.0f - sg));
}

// dw13e (2F, H) and dw2e (H, F) contiguous are overwritten; s->dxe (n, H)
// gets the rows' input cotangent. s->dy (n, H) holds the cotangent of the
// expert's unweighted output rows y = w2 a; the rows' combine weights are
// gate[n] (NULL: 1). With dgate, dgate[i] = dy_i . y_i, the gate's gradient,
// computed as (w2^T dy_i) . a_i: that product is needed for da anyway, so y
// is never recomputed. The gate then enters as da = gate * (w2^T dy) and
// dw2 = dy^T (gate * a).
static tpr_status expert_bwd(const tpr_cpu_ctx *ctx, const tpr_tensor *w13, const tpr_tensor *w2, int64_t e,
                             int64_t n, const float *gate, float *dgate, const ffn_scratch *s, float *dw13e,
                             float *dw2e) {
  const int64_t F2 = w13->shape[1], F = F2 / 2, H = w13->shape[2];
  const experts ex = {w13, w2, NULL, NULL, 0};
  TPR_CHECK(expert_up(ctx, &ex, e, n, s));
  operand l2, l13;
  const float *w2e = weight(w2, e, s->wbuf, &l2);
  // u = w2^T dy (n, F) into dgu's first F columns.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, untransposed(&l2), (blasint)n, (blasint)F, (blasint)H, 1.0f, s->dy,
              (blasint)H, w2e, (blasint)l2.ld, 0.0f, s->dgu, (blasint)F2);
  for (int64_t i = 0; dgate && i < n; i++) {
    double dot = 0;
    for (int64_t f = 0; f < F; f++) dot += (double)s->dgu[i * F2 + f] * (double)s->act[i * F + f];
    dgate[i] = (float)dot;
  }
  for (int64_t i = 0; gate && i < n; i++)
    for (int64_t f = 0; f < F; f++) s->dgu[i * F2 + f] *= gate[i], s->act[i * F + f] *= gate[i];
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)H, (blasint)F, (blasint)n, 1.0f, s->dy, (blasint)H,
              s->act, (blasint)F, 0.0f, dw2e, (blasint)F);
  for (int64_t i = 0; i < n; i++)  // da -> [dh1 | dh3] in place
    for (int64_t f = 0; f < F; f++) {
      const float da = s->dgu[i * F2 + f], h1 = s->gu[i * F2 + f], h3 = s->gu[i * F2 + F + f];
      s->dgu[i * F2 + F + f] = da * silu(h1);
      s->dgu[i * F2 + f] = da * h3 * dsilu(h1);
    }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)F2, (blasint)H, (blasint)n, 1.0f, s->dgu,
              (blasint)F2, s->xe, (blasint)H, 0.0f, dw13e, (blasint)H);
  const float *w13e = weight(w13, e, s->wbuf, &l13);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, untransposed(&l13), (blasint)n, (blasint)H, (blasint)F2, 1.0f, s->dgu,
              (blasint)F2, w13e, (blasint)l13.ld, 0.0f, s->dxe, (blasint)H);
  return TPR_OK;
}

// Expert e's gradient slices dw13e (2F, H) and dw2e (H, F) zeroed: for an
// expert no row reached. An active expert's are overwritten by expert_bwd's
// GEMMs (beta 0), so the packed output is never cleared whole: its weight
// gradients are E experts' matrices, ~100 MB a layer at the small config,
// and clearing them was a quarter of the backward's time.
static void zero_expert_grads(int64_t e, int64_t F2, int64_t H, float *dw13, float *dw2) {
  memset(dw13 + e * F2 * H, 0, (size_t)(F2 * H) * sizeof *dw13);
  memset(dw2 + e * H * (F2 / 2), 0, (size_t)(H * (F2 / 2)) * sizeof *dw2);
}

// Shapes of x, w13, w2 as the forwards check them (R rows of x, E experts).
static tpr_status check_ffn_shapes(const char *op, const tpr_tensor *x, int64_t E, const tpr_tensor *w13,
                                   const tpr_tensor *w2, const tpr_tensor *dy) {
  if (x->dtype != TPR_F32 || w13->dtype != TPR_F32 || w2->dtype != TPR_F32 || dy->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s (cpu): x, w13, w2 and dy must be f32", op);
  if (x->ndim != 2 || w13->ndim != 3 || w2->ndim != 3 || !tpr_tensor_same_shape(x, dy))
    return TPR_FAIL(TPR_ERR_SHAPE, "%s (cpu): x, w13, w2 and dy shapes do not fit", op);
  const int64_t H = x->shape[1], F2 = w13->shape[1];
  if (w13->shape[0] != E || w13->shape[2] != H || F2 % 2 || w2->shape[0] != E || w2->shape[1] != H ||
      w2->shape[2] != F2 / 2)
    return TPR_FAIL(TPR_ERR_SHAPE, "%s (cpu): x, w13, w2 and dy shapes do not fit", op);
  return TPR_OK;
}

// moe_experts_bwd with the experts spread over the threads, as
// moe_experts_spread: each active expert's backward whole on one thread
// (its own scratch, GEMMs single-threaded), writing its dgates, its dw13 and
// dw2 slices and its rows' dx into dxbuf (A, H); then each token adds its
// experts' dx rows in ascending expert order. The serial loop's bits on one
// thread, for any thread count.
static tpr_status moe_experts_bwd_spread(const tpr_cpu_ctx *ctx, const tpr_tensor *x, const tpr_tensor *g,
                                         const tpr_tensor *w13, const tpr_tensor *w2, const tpr_tensor *dy, float *dx,
                                         float *dg, float *dw13, float *dw2) {
  const int64_t T = x->shape[0], H = x->shape[1], E = g->shape[1], F2 = w13->shape[1], F = F2 / 2;
  const int nt = ctx->n_threads;
  const float *gd = tpr_tensor_data(g);
  routing r;
  TPR_CHECK(routing_new("moe_experts_bwd", g, &r));
  float *dxbuf = malloc((size_t)(r.A * H + 1) * sizeof *dxbuf);  // (A, H)
  ffn_scratch *scr = calloc((size_t)nt, sizeof *scr);
  tpr_status *rcs = calloc((size_t)r.active + 1, sizeof *rcs), rc = TPR_OK;
  if (!dxbuf || !scr || !rcs) rc = TPR_FAIL(TPR_ERR_OOM, "moe_experts_bwd (cpu): %lld expert rows", (long long)r.A);
  for (int i = 0; i < nt && rc == TPR_OK; i++) rc = scratch_new("moe_experts_bwd", r.most, H, F, true, &scr[i]);
  if (rc != TPR_OK) goto done;
  for (int64_t e = 0; e < E; e++)
    if (r.off[e + 1] == r.off[e]) zero_expert_grads(e, F2, H, dw13, dw2);
  tpr_cpu_ctx one = *ctx;
  one.n_threads = 1;
#pragma omp parallel num_threads(nt)
  {
    const ffn_scratch *s = &scr[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < r.active; i++) {
      const int64_t e = r.order[i], a0 = r.off[e], n = r.off[e + 1] - a0;
      float *gate = s->y, *dgate = s->y + n;  // (n) each: s->y is free in the backward
      for (int64_t k = 0; k < n; k++) {
        const int64_t t = r.rows[a0 + k];
        gate[k] = gd[t * g->stride[0] + e * g->stride[1]];
        load_row(s->xe + k * H, x, t);
        load_row(s->dy + k * H, dy, t);
      }
      rcs[i] = expert_bwd(&one, w13, w2, e, n, gate, dgate, s, dw13 + e * F2 * H, dw2 + e * H * F);
      for (int64_t k = 0; k < n; k++) dg[r.rows[a0 + k] * E + e] = dgate[k];
      memcpy(dxbuf + a0 * H, s->dxe, (size_t)(n * H) * sizeof *dxbuf);
    }
    add_rows_by_token(&r, g, dxbuf, T, H, false, dx);
  }
  for (int64_t i = 0; i < r.active && rc == TPR_OK; i++) rc = rcs[i];
done:
  for (int i = 0; scr && i < nt; i++) free(scr[i].xe);
  routing_free(&r);
  free(dxbuf), free(scr), free(rcs);
  return rc;
}

// x (T, H), gates (T, E), w13 (E, 2F, H), w2 (E, H, F), dy (T, H); out packed
// (dx (T*H) | dgates (T*E) | dw13 (E*2F*H) | dw2 (E*H*F)). dgates[t, e] =
// dy_t . y_e(t) (double accumulation) where the gate is nonzero, else 0;
// the FFN's cotangent is gate * dy.
TPR_CPU_KERNEL(moe_experts_bwd) {
  if (n_in != 5) return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_experts_bwd (cpu): expected 5 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *g = in[1], *w13 = in[2], *w2 = in[3], *dy = in[4];
  if (g->dtype != TPR_F32 || g->ndim != 2 || out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_experts_bwd (cpu): gates must be (T, E) f32 and out f32");
  TPR_CHECK(check_ffn_shapes("moe_experts_bwd", x, g->shape[1], w13, w2, dy));
  const int64_t T = x->shape[0], H = x->shape[1], E = g->shape[1], F2 = w13->shape[1], F = F2 / 2;
  if (g->shape[0] != T || out->ndim != 1 || out->shape[0] != T * H + T * E + E * F2 * H + E * H * F)
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_experts_bwd (cpu): gates or the packed output do not fit");
  float *dx = tpr_tensor_data(out), *dg = dx + T * H, *dw13 = dg + T * E, *dw2 = dw13 + E * F2 * H;
  memset(dx, 0, (size_t)(T * H + T * E) * sizeof *dx);  // dx, dgates; the experts' slices below
  if (T == 0 || H == 0 || F == 0 || E == 0) {  // dgates: dot products with zero outputs
    memset(dw13, 0, (size_t)(E * F2 * H + E * H * F) * sizeof *dw13);
    return TPR_OK;
  }
  TPR_CHECK(check_blas_range("moe_experts_bwd", T, F2, H, w13, w2));
  if (((const tpr_cpu_ctx *)ctx)->n_threads > 1 && read_in_place(w13) && read_in_place(w2))
    return moe_experts_bwd_spread(ctx, x, g, w13, w2, dy, dx, dg, dw13, dw2);
  int64_t *idx = malloc((size_t)T * sizeof *idx);
  ffn_scratch s = {0};
  if (!idx || scratch_new("moe_experts_bwd", T, H, F, true, &s) != TPR_OK) {
    free(idx), free(s.xe);
    return TPR_FAIL(TPR_ERR_OOM, "moe_experts_bwd (cpu): scratch for %lld tokens", (long long)T);
  }
  const float *gd = tpr_tensor_data(g);
  const int64_t gs0 = g->stride[0], gs1 = g->stride[1];
  tpr_status rc = TPR_OK;
  for (int64_t e = 0; e < E; e++) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; t++)
      if (gd[t * gs0 + e * gs1] != 0.0f) idx[n++] = t;
    if (n == 0) {
      zero_expert_grads(e, F2, H, dw13, dw2);
      continue;
    }
    float *gate = s.y, *dgate = s.y + n;  // (n) each: s.y is free in the backward
    for (int64_t i = 0; i < n; i++) {
      gate[i] = gd[idx[i] * gs0 + e * gs1];
      load_row(s.xe + i * H, x, idx[i]);
      load_row(s.dy + i * H, dy, idx[i]);
    }
    TPR_CHECK_GOTO(expert_bwd(ctx, w13, w2, e, n, gate, dgate, &s, dw13 + e * F2 * H, dw2 + e * H * F), rc, done);
    for (int64_t i = 0; i < n; i++) {
      const int64_t t = idx[i];
      dg[t * E + e] = dgate[i];
      for (int64_t j = 0; j < H; j++) dx[t * H + j] += s.dxe[i * H + j];
    }
  }
done:
  free(idx), free(s.xe);
  return rc;
}

// x (R, H), counts (n*Er) i32, w13 (Er, 2F, H), w2 (Er, H, F), dy (R, H);
// out packed (dx (R*H) | dw13 (Er*2F*H) | dw2 (Er*H*F)). Unweighted, in the
// forward's row layout; rows past the counted ones get dx = 0 (the forward
// never read them).
TPR_CPU_KERNEL(moe_grouped_ffn_bwd) {
  if (n_in != 5) return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_grouped_ffn_bwd (cpu): expected 5 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *c = in[1], *w13 = in[2], *w2 = in[3], *dy = in[4];
  if (c->dtype != TPR_I32 || c->ndim != 1 || out->dtype != TPR_F32 || w13->ndim != 3)
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_grouped_ffn_bwd (cpu): counts must be 1-D i32, w13 3-D, out f32");
  const int64_t Er = w13->shape[0], L = c->shape[0];
  TPR_CHECK(check_ffn_shapes("moe_grouped_ffn_bwd", x, Er, w13, w2, dy));
  const int64_t R = x->shape[0], H = x->shape[1], F2 = w13->shape[1], F = F2 / 2;
  if (Er < 1 || L % Er || L < Er || out->ndim != 1 || out->shape[0] != R * H + Er * F2 * H + Er * H * F)
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_grouped_ffn_bwd (cpu): counts or the packed output do not fit");
  const int64_t nsrc = L / Er;
  int64_t *start, *cnt, total, most;
  TPR_CHECK(parse_counts("moe_grouped_ffn_bwd", c, R, Er, &start, &total, &most));
  cnt = start + L;
  float *dx = tpr_tensor_data(out), *dw13 = dx + R * H, *dw2 = dw13 + Er * F2 * H;
  memset(dx, 0, (size_t)(R * H) * sizeof *dx);  // the experts' slices below
  tpr_status rc = TPR_OK;
  ffn_scratch s = {0};
  if (total == 0 || H == 0 || F == 0) {
    memset(dw13, 0, (size_t)(Er * F2 * H + Er * H * F) * sizeof *dw13);
    goto done;
  }
  if ((rc = check_blas_range("moe_grouped_ffn_bwd", most, F2, H, w13, w2)) != TPR_OK) goto done;
  if ((rc = scratch_new("moe_grouped_ffn_bwd", most, H, F, true, &s)) != TPR_OK) goto done;
  const expert_rows rows = {start, cnt, nsrc, Er};
  for (int64_t e = 0; e < Er; e++) {
    int64_t n = gather_expert_rows(&rows, e, x, s.xe);
    if (n == 0) {
      zero_expert_grads(e, F2, H, dw13, dw2);
      continue;
    }
    gather_expert_rows(&rows, e, dy, s.dy);
    TPR_CHECK_GOTO(expert_bwd(ctx, w13, w2, e, n, NULL, NULL, &s, dw13 + e * F2 * H, dw2 + e * H * F), rc, done);
    scatter_expert_rows(&rows, e, s.dxe, H, dx);
  }
done:
  free(start), free(s.xe);
  return rc;
}

const tpr__kernel_def tpr__moe_cpu[] = {
    {TPR_OP_MOE_EXPERTS, cpu_moe_experts},
    {TPR_OP_MOE_GROUPED_FFN, cpu_moe_grouped_ffn},
    {TPR_OP_MOE_EXPERTS_BWD, cpu_moe_experts_bwd},
    {TPR_OP_MOE_GROUPED_FFN_BWD, cpu_moe_grouped_ffn_bwd},
    {0},
};
