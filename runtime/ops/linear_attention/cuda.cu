// Lightning attention CUDA kernels (cpu.c's twin; ops.h,
// tpr_lightning_attention). NOT YET RUN ON A GPU: compiled (sm_90) only;
// tests/test_cuda_ops.c compares them with the CPU kernels where a GPU
// exists (docs/lightning-attention.md).
//
// The prefill and its backward are cpu.c's block loops with every head of a
// block in one strided-batched cuBLAS sgemm (full f32) where the CPU calls one
// sgemm per head: q, k, v copied heads-major (H, T, D), then per block of b
// tokens the same products (inter, Q K^T, the decayed intra product, the state
// update; the backward's recurrence for dQ, dK, dV and G), with the decays
// applied by three small kernels computing the CPU's expf of the same f32
// products. The state at each block's start is kept for the backward
// ((T / block, H, D, D) scratch), no (T, T) buffer. The block loop runs on
// the host: a handful of launches per block.
//
// The engine's form (lightning_paged): the step's state_slot and positions
// are read back (2T ints) and cut into runs on the host exactly as the CPU
// does (paged_runs.h, the same checks and messages); each run is the
// prefill's block loop on its slot of the pool, in place, from zeros when
// the run starts a sequence. Padded rows are zeroed.
//
// Decode: one thread block per (sequence, head), thread c owns column c of
// the state: S[a][c] = exp(-s) S[a][c] + k[a] v[c], then o[c] = sum over a
// ascending of q[a] S[a][c] -- the CPU's order.
//
// The slopes are read back (H floats) for the CPU's check and message: a
// negative or non-finite slope is TPR_ERR_INVALID_ARG.
#include <math.h>
#include <stdlib.h>

#include <vector>

#include "runtime/ops/cuda_kernels.h"
#include "paged_runs.h"  // after cuda_kernels.h, which declares runtime/status.h's functions extern "C"

// ---- device kernels

// dst[h, i, d] = src[h, i, d] * exp(-s_h (off + sign * i)) for H heads of
// (b, D) rows; head and row strides per operand (dst may be src).
static __global__ void decay_rows_kernel(float *dst, int64_t d_hs, int64_t d_ld, const float *src, int64_t s_hs,
                                         int64_t s_ld, const float *slopes, int64_t H, int64_t b, int64_t D,
                                         int64_t off, int64_t sign) {
  TPR_CUDA_GRID_STRIDE(e, H * b * D) {
    const int64_t d = e % D, i = (e / D) % b, h = e / (D * b);
    const float f = expf(-(slopes[h] * (float)(off + sign * i)));
    dst[h * d_hs + i * d_ld + d] = src[h * s_hs + i * s_ld + d] * f;
  }
}

// a (H, b, b): a_ij *= exp(-s_h (i - j)) for j <= i, 0 above the diagonal.
static __global__ void diag_decay_kernel(float *a, const float *slopes, int64_t H, int64_t b) {
  TPR_CUDA_GRID_STRIDE(e, H * b * b) {
    const int64_t j = e % b, i = (e / b) % b, h = e / (b * b);
    a[e] = j <= i ? a[e] * expf(-(slopes[h] * (float)(i - j))) : 0.0f;
  }
}

// S (H, D, D) *= exp(-s_h b).
static __global__ void scale_state_kernel(float *S, const float *slopes, int64_t H, int64_t D, int64_t b) {
  TPR_CUDA_GRID_STRIDE(e, H * D * D) S[e] *= expf(-(slopes[e / (D * D)] * (float)b));
}

struct decode_args {
  const float *q, *k, *v;
  int64_t qs[3], ks[3], vs[3];  // strides of (B, H, D)
  const float *slopes;
  float *o, *S;                 // (B, H, D), (B, H, D, D) contiguous
  int64_t Bn, H, D;
};

// One block per (sequence b, head h), grid-strided; thread c owns column c.
static __global__ void decode_kernel(decode_args a) {
  const int64_t D = a.D;
  for (int64_t r = blockIdx.x; r < a.Bn * a.H; r += gridDim.x) {
    const int64_t b = r / a.H, h = r % a.H;
    const float *q = a.q + b * a.qs[0] + h * a.qs[1], *k = a.k + b * a.ks[0] + h * a.ks[1];
    const float *v = a.v + b * a.vs[0] + h * a.vs[1];
    float *S = a.S + r * D * D;
    const float ratio = expf(-a.slopes[h]);
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
      const float vc = v[c * a.vs[2]];
      float acc = 0.0f;
      for (int64_t i = 0; i < D; i++) {
        const float s = ratio * S[i * D + c] + k[i * a.ks[2]] * vc;
        S[i * D + c] = s;
        acc += q[i * a.qs[2]] * s;
      }
      a.o[r * D + c] = acc;
    }
  }
}

// ---- host helpers

// Row-major C = op(A) op(B) + beta C for `batch` matrices (the strides
// apart), cuBLAS's column-major swap as tpr__cuda_sgemm, with a beta.
static tpr_status gemm(tpr_cuda_ctx *c, const char *op, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                       const float *A, int64_t lda, int64_t sa, const float *B, int64_t ldb, int64_t sb, float beta,
                       float *C, int64_t ldc, int64_t sc, int64_t batch) {
  if (M == 0 || N == 0 || K == 0 || batch == 0) return TPR_OK;  // K > 0 always here: blocks are never empty
  const float one = 1.0f;
  TPR_CUBLAS_TRY(cublasSgemmStridedBatched(c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                           (int)N, (int)M, (int)K, &one, B, (int)ldb, (long long)sb, A, (int)lda,
                                           (long long)sa, &beta, C, (int)ldc, (long long)sc, (int)batch),
                 op, "cublasSgemmStridedBatched");
  return TPR_OK;
}

static tpr_status decay_rows(tpr_cuda_ctx *c, const char *op, float *dst, int64_t d_hs, int64_t d_ld,
                             const float *src, int64_t s_hs, int64_t s_ld, const float *sl, int64_t H, int64_t b,
                             int64_t D, int64_t off, int64_t sign) {
  decay_rows_kernel<<<tpr__cuda_blocks(H * b * D, 256), 256, 0, c->stream>>>(dst, d_hs, d_ld, src, s_hs, s_ld, sl, H,
                                                                             b, D, off, sign);
  TPR_CUDA_LAUNCHED(op, "decay rows");
  return TPR_OK;
}

static tpr_status diag_decay(tpr_cuda_ctx *c, const char *op, float *a, const float *sl, int64_t H, int64_t b) {
  diag_decay_kernel<<<tpr__cuda_blocks(H * b * b, 256), 256, 0, c->stream>>>(a, sl, H, b);
  TPR_CUDA_LAUNCHED(op, "diagonal decay");
  return TPR_OK;
}

static tpr_status scale_state(tpr_cuda_ctx *c, const char *op, float *S, const float *sl, int64_t H, int64_t D,
                              int64_t b) {
  scale_state_kernel<<<tpr__cuda_blocks(H * D * D, 256), 256, 0, c->stream>>>(S, sl, H, D, b);
  TPR_CUDA_LAUNCHED(op, "state decay");
  return TPR_OK;
}

// The slopes (H), any stride, into contiguous device scratch dst, read back
// and checked as the CPU does.
static tpr_status load_slopes(tpr_cuda_ctx *c, const char *op, const tpr_tensor *t, float *dst) {
  const int64_t H = t->shape[0], one = 1;
  TPR_CHECK(tpr__cuda_strided_copy(c, op, dst, &one, tpr_tensor_data(t), t->stride, 1, t->shape, sizeof(float)));
  float *h = (float *)malloc((size_t)(H > 0 ? H : 1) * sizeof *h);
  if (!h) return TPR_FAIL(TPR_ERR_OOM, "%s (cuda): slopes", op);
  tpr_status rc = tpr__cuda_read(c, op, h, dst, (size_t)H * sizeof *h);
  for (int64_t i = 0; rc == TPR_OK && i < H; i++)
    if (!(h[i] >= 0.0f) || !isfinite(h[i]))
      rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: slopes[%lld] = %g; slopes must be finite and >= 0", op, (long long)i,
                    (double)h[i]);
  free(h);
  return rc;
}

// t (T, H, D), any strides -> dst (H, T, D) contiguous.
static tpr_status heads_major(tpr_cuda_ctx *c, const char *op, const tpr_tensor *t, float *dst) {
  const int64_t T = t->shape[0], D = t->shape[2], ds[3] = {D, T * D, 1};
  return tpr__cuda_strided_copy(c, op, dst, ds, tpr_tensor_data(t), t->stride, 3, t->shape, sizeof(float));
}

static tpr_status check_sizes(const char *op, int64_t H, int64_t D, int64_t T) {
  const int64_t lim = 0x7fffffff;
  if (H * D > lim || D * D > lim || T * D > lim || H > 65535)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s (cuda): sizes exceed cuBLAS's int range", op);
  return TPR_OK;
}

// The document form (ops.h, tpr_lightning_attention_docs: packed training
// sequences) has no CUDA kernel yet: refused by name rather than run as the
// plain form, which would carry the state across documents.
static tpr_status refuse_docs(const char *op, int n_in, int plain) {
  if (n_in > plain)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s (cuda): the document form (packed sequences) runs on the CPU backend "
                    "only", op);
  return TPR_OK;
}

// ---- kernels

// The prefill's block loop over n rows for every head at once, from the
// state S (H, D, D), updated in place: qh, kh, vh point at the first row of
// head 0 in heads-major copies whose heads are hs floats apart; o at the
// first row's output in (rows, H, D) layout. rows (H, Bt, D) and a (H, Bt,
// Bt) are scratch.
static tpr_status prefill_blocks(tpr_cuda_ctx *c, const char *op, const float *qh, const float *kh, const float *vh,
                                 int64_t hs, int64_t n, float *S, float *o, const float *sl, int64_t H, int64_t D,
                                 int64_t Bt, float *rows, float *a) {
  for (int64_t t0 = 0; t0 < n; t0 += Bt) {
    const int64_t b = n - t0 < Bt ? n - t0 : Bt;
    const float *qb = qh + t0 * D, *kb = kh + t0 * D, *vb = vh + t0 * D;
    float *ob = o + t0 * H * D;  // head h's rows at ob + h * D, leading dim H * D
    TPR_CHECK(decay_rows(c, op, rows, b * D, D, qb, hs, D, sl, H, b, D, 1, 1));
    TPR_CHECK(gemm(c, op, false, false, b, D, D, rows, D, b * D, S, D, D * D, 0.0f, ob, H * D, D, H));  // inter
    TPR_CHECK(gemm(c, op, false, true, b, b, D, qb, D, hs, kb, D, hs, 0.0f, a, b, b * b, H));          // Q K^T
    TPR_CHECK(diag_decay(c, op, a, sl, H, b));
    TPR_CHECK(gemm(c, op, false, false, b, D, b, a, b, b * b, vb, D, hs, 1.0f, ob, H * D, D, H));  // + intra
    TPR_CHECK(scale_state(c, op, S, sl, H, D, b));
    TPR_CHECK(decay_rows(c, op, rows, b * D, D, kb, hs, D, sl, H, b, D, b - 1, -1));
    TPR_CHECK(gemm(c, op, true, false, D, D, b, rows, D, b * D, vb, D, hs, 1.0f, S, D, D * D, H));
  }
  return TPR_OK;
}

// q, k, v (T, H, D), state (H, D, D), slopes (H); i[0] block;
// out packed (o (T, H, D) | state (H, D, D)).
TPR_CUDA_KERNEL(lightning_attention) {
  static const char *op = "lightning_attention";
  TPR_CHECK(refuse_docs(op, n_in, 5));
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  const tpr_tensor *st = in[3];
  const int64_t T = in[0]->shape[0], H = in[0]->shape[1], D = in[0]->shape[2], B = attrs->i[0];
  const int64_t Bt = T < B ? T : B, n = T * H * D;
  TPR_CHECK(check_sizes(op, H, D, T));
  TPR_CUDA_TRY(cudaSetDevice(c->device), op, "set device");
  float *o = (float *)tpr_tensor_data(out), *S = o + n;
  const int64_t cs[3] = {D * D, D, 1};
  TPR_CHECK(tpr__cuda_strided_copy(c, op, S, cs, tpr_tensor_data(st), st->stride, 3, st->shape, sizeof(float)));
  if (T == 0 || H == 0 || D == 0) return TPR_OK;
  tpr__cuda_scratch scr(c);  // slopes (H) | q, k, v (H, T, D) | rows (H, Bt, D) | scores (H, Bt, Bt)
  TPR_CHECK(scr.alloc((size_t)(H + 3 * n + H * Bt * D + H * Bt * Bt) * sizeof(float)));
  float *sl = (float *)scr.p, *qh = sl + H, *kh = qh + n, *vh = kh + n, *rows = vh + n, *a = rows + H * Bt * D;
  TPR_CHECK(load_slopes(c, op, in[4], sl));
  TPR_CHECK(heads_major(c, op, in[0], qh));
  TPR_CHECK(heads_major(c, op, in[1], kh));
  TPR_CHECK(heads_major(c, op, in[2], vh));
  return prefill_blocks(c, op, qh, kh, vh, T * D, T, S, o, sl, H, D, Bt, rows, a);
}

// q, k, v (T, H, D), state (H, D, D), slopes (H), dout packed (T*H*D |
// H*D*D); i[0] block; out packed (dq | dk | dv (T, H, D) | dstate (H, D, D)).
TPR_CUDA_KERNEL(lightning_attention_bwd) {
  static const char *op = "lightning_attention_bwd";
  TPR_CHECK(refuse_docs(op, n_in, 6));
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  const tpr_tensor *st = in[3], *dout = in[5];
  const int64_t T = in[0]->shape[0], H = in[0]->shape[1], D = in[0]->shape[2], B = attrs->i[0];
  const int64_t Bt = T < B ? T : B, n = T * H * D, ns = H * D * D, d0 = dout->stride[0];
  TPR_CHECK(check_sizes(op, H, D, T));
  TPR_CUDA_TRY(cudaSetDevice(c->device), op, "set device");
  float *dq = (float *)tpr_tensor_data(out), *dk = dq + n, *dv = dk + n, *G = dv + n;
  const float *dbase = (const float *)tpr_tensor_data(dout);
  const int64_t one = 1;
  TPR_CHECK(tpr__cuda_strided_copy(c, op, G, &one, dbase + n * d0, &d0, 1, &ns, sizeof(float)));  // d final state
  if (T == 0 || H == 0 || D == 0) return TPR_OK;
  const int64_t nb = (T + Bt - 1) / Bt;
  tpr__cuda_scratch scr(c);  // slopes | q, k, v, dO (H, T, D) | block-start states (nb, H, D, D) | rows | P | A
  TPR_CHECK(scr.alloc((size_t)(H + 4 * n + nb * ns + H * Bt * D + 2 * H * Bt * Bt) * sizeof(float)));
  float *sl = (float *)scr.p, *qh = sl + H, *kh = qh + n, *vh = kh + n, *dh = vh + n, *Ss = dh + n;
  float *rows = Ss + nb * ns, *p = rows + H * Bt * D, *a = p + H * Bt * Bt;
  TPR_CHECK(load_slopes(c, op, in[4], sl));
  TPR_CHECK(heads_major(c, op, in[0], qh));
  TPR_CHECK(heads_major(c, op, in[1], kh));
  TPR_CHECK(heads_major(c, op, in[2], vh));
  const int64_t dys[3] = {H * D * d0, D * d0, d0}, dyc[3] = {D, T * D, 1}, shp[3] = {T, H, D}, cs[3] = {D * D, D, 1};
  TPR_CHECK(tpr__cuda_strided_copy(c, op, dh, dyc, dbase, dys, 3, shp, sizeof(float)));
  TPR_CHECK(tpr__cuda_strided_copy(c, op, Ss, cs, tpr_tensor_data(st), st->stride, 3, st->shape, sizeof(float)));
  for (int64_t b = 0; b + 1 < nb; b++) {  // the state at each block's start (all but the last block are full)
    float *next = Ss + (b + 1) * ns;
    TPR_CUDA_TRY(cudaMemcpyAsync(next, Ss + b * ns, (size_t)ns * sizeof(float), cudaMemcpyDeviceToDevice, c->stream),
                 op, "state copy");
    TPR_CHECK(scale_state(c, op, next, sl, H, D, Bt));
    TPR_CHECK(decay_rows(c, op, rows, Bt * D, D, kh + b * Bt * D, T * D, D, sl, H, Bt, D, Bt - 1, -1));
    TPR_CHECK(gemm(c, op, true, false, D, D, Bt, rows, D, Bt * D, vh + b * Bt * D, D, T * D, 1.0f, next, D, D * D, H));
  }
  for (int64_t blk = nb - 1; blk >= 0; blk--) {
    const int64_t t0 = blk * Bt, b = T - t0 < Bt ? T - t0 : Bt, ld = H * D;
    const float *qb = qh + t0 * D, *kb = kh + t0 * D, *vb = vh + t0 * D, *db = dh + t0 * D, *S = Ss + blk * ns;
    float *dqb = dq + t0 * ld, *dkb = dk + t0 * ld, *dvb = dv + t0 * ld;
    TPR_CHECK(gemm(c, op, false, true, b, b, D, db, D, T * D, vb, D, T * D, 0.0f, p, b, b * b, H));  // dO V^T
    TPR_CHECK(diag_decay(c, op, p, sl, H, b));
    TPR_CHECK(gemm(c, op, false, true, b, b, D, qb, D, T * D, kb, D, T * D, 0.0f, a, b, b * b, H));  // Q K^T
    TPR_CHECK(diag_decay(c, op, a, sl, H, b));
    TPR_CHECK(gemm(c, op, false, true, b, D, D, db, D, T * D, S, D, D * D, 0.0f, dqb, ld, D, H));  // dO S^T
    TPR_CHECK(decay_rows(c, op, dqb, D, ld, dqb, D, ld, sl, H, b, D, 1, 1));
    TPR_CHECK(gemm(c, op, false, false, b, D, b, p, b, b * b, kb, D, T * D, 1.0f, dqb, ld, D, H));
    TPR_CHECK(gemm(c, op, false, true, b, D, D, vb, D, T * D, G, D, D * D, 0.0f, dkb, ld, D, H));  // V G^T
    TPR_CHECK(decay_rows(c, op, dkb, D, ld, dkb, D, ld, sl, H, b, D, b - 1, -1));
    TPR_CHECK(gemm(c, op, true, false, b, D, b, p, b, b * b, qb, D, T * D, 1.0f, dkb, ld, D, H));
    TPR_CHECK(gemm(c, op, false, false, b, D, D, kb, D, T * D, G, D, D * D, 0.0f, dvb, ld, D, H));  // K G
    TPR_CHECK(decay_rows(c, op, dvb, D, ld, dvb, D, ld, sl, H, b, D, b - 1, -1));
    TPR_CHECK(gemm(c, op, true, false, b, D, b, a, b, b * b, db, D, T * D, 1.0f, dvb, ld, D, H));
    TPR_CHECK(scale_state(c, op, G, sl, H, D, b));
    TPR_CHECK(decay_rows(c, op, rows, b * D, D, qb, T * D, D, sl, H, b, D, 1, 1));
    TPR_CHECK(gemm(c, op, true, false, D, D, b, rows, D, b * D, db, D, T * D, 1.0f, G, D, D * D, H));
  }
  return TPR_OK;
}

// q, k, v (B, H, D), state (B, H, D, D), slopes (H);
// out packed (o (B, H, D) | states (B, H, D, D)).
TPR_CUDA_KERNEL(lightning_decode) {
  (void)n_in, (void)attrs;
  static const char *op = "lightning_decode";
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  const tpr_tensor *q = in[0], *k = in[1], *v = in[2], *st = in[3];
  const int64_t Bn = q->shape[0], H = q->shape[1], D = q->shape[2], n = Bn * H * D;
  TPR_CUDA_TRY(cudaSetDevice(c->device), op, "set device");
  float *o = (float *)tpr_tensor_data(out), *S = o + n;
  const int64_t cs[4] = {H * D * D, D * D, D, 1};
  TPR_CHECK(tpr__cuda_strided_copy(c, op, S, cs, tpr_tensor_data(st), st->stride, 4, st->shape, sizeof(float)));
  if (n == 0) return TPR_OK;
  tpr__cuda_scratch scr(c);
  TPR_CHECK(scr.alloc((size_t)H * sizeof(float)));
  TPR_CHECK(load_slopes(c, op, in[4], (float *)scr.p));
  decode_args a = {};
  a.q = (const float *)tpr_tensor_data(q), a.k = (const float *)tpr_tensor_data(k);
  a.v = (const float *)tpr_tensor_data(v);
  for (int i = 0; i < 3; i++) a.qs[i] = q->stride[i], a.ks[i] = k->stride[i], a.vs[i] = v->stride[i];
  a.slopes = (const float *)scr.p, a.o = o, a.S = S, a.Bn = Bn, a.H = H, a.D = D;
  const int th = D <= 128 ? 128 : 256;
  decode_kernel<<<tpr__cuda_blocks(Bn * H, 1), th, 0, c->stream>>>(a);
  TPR_CUDA_LAUNCHED(op, "decode kernel");
  return TPR_OK;
}

// q, k, v (T, H, D), pool (NS, H, D, D) contiguous, slopes (H), state_slot
// (T) i32, positions (T) i32; i[0] block; out o (T, H, D); the pool's slots
// of the step's runs are written in place.
TPR_CUDA_KERNEL(lightning_paged) {
  (void)n_in;
  static const char *op = "lightning_paged";
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  const tpr_tensor *pool = in[3];
  const int64_t T = in[0]->shape[0], H = in[0]->shape[1], D = in[0]->shape[2], B = attrs->i[0];
  const int64_t NS = pool->shape[0], Bt = T < B ? T : B, n = T * H * D;
  if (!tpr_tensor_is_contiguous(pool))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s (cuda): the state pool must be contiguous (it is written in place)", op);
  TPR_CHECK(check_sizes(op, H, D, T));
  TPR_CUDA_TRY(cudaSetDevice(c->device), op, "set device");
  float *o = (float *)tpr_tensor_data(out), *P = (float *)tpr_tensor_data(pool);
  TPR_CUDA_TRY(cudaMemsetAsync(o, 0, (size_t)n * sizeof(float), c->stream), op, "zero output");  // padded rows
  if (T == 0 || H == 0 || D == 0) return TPR_OK;
  // The slots and positions, contiguous on the device, then on the host for the runs.
  tpr__cuda_scratch ids(c);
  TPR_CHECK(ids.alloc((size_t)(2 * T) * sizeof(int32_t)));
  int32_t *dslot = (int32_t *)ids.p, *dpos = dslot + T;
  const int64_t one = 1;
  TPR_CHECK(tpr__cuda_strided_copy(c, op, dslot, &one, tpr_tensor_data(in[5]), in[5]->stride, 1, &T, 4));
  TPR_CHECK(tpr__cuda_strided_copy(c, op, dpos, &one, tpr_tensor_data(in[6]), in[6]->stride, 1, &T, 4));
  std::vector<int32_t> idx((size_t)(2 * T));  // slots (T) | positions (T)
  std::vector<tpr__la_run> runs((size_t)T);
  int64_t n_runs = 0;
  TPR_CHECK(tpr__cuda_read(c, op, idx.data(), dslot, idx.size() * sizeof(int32_t)));
  TPR_CHECK(tpr__la_paged_runs(idx.data(), 1, idx.data() + T, 1, T, NS, runs.data(), &n_runs));
  tpr__cuda_scratch scr(c);  // slopes (H) | q, k, v (H, T, D) | rows (H, Bt, D) | scores (H, Bt, Bt)
  TPR_CHECK(scr.alloc((size_t)(H + 3 * n + H * Bt * D + H * Bt * Bt) * sizeof(float)));
  float *sl = (float *)scr.p, *qh = sl + H, *kh = qh + n, *vh = kh + n, *rows = vh + n, *a = rows + H * Bt * D;
  TPR_CHECK(load_slopes(c, op, in[4], sl));
  TPR_CHECK(heads_major(c, op, in[0], qh));
  TPR_CHECK(heads_major(c, op, in[1], kh));
  TPR_CHECK(heads_major(c, op, in[2], vh));
  for (int64_t r = 0; r < n_runs; r++) {
    const int64_t t0 = runs[r].t0;
    float *S = P + runs[r].slot * H * D * D;  // the slot's (H, D, D), updated in place
    if (idx[(size_t)(T + t0)] == 0)           // a sequence's start
      TPR_CUDA_TRY(cudaMemsetAsync(S, 0, (size_t)(H * D * D) * sizeof(float), c->stream), op, "zero a state slot");
    TPR_CHECK(prefill_blocks(c, op, qh + t0 * D, kh + t0 * D, vh + t0 * D, T * D, runs[r].n, S, o + t0 * H * D, sl,
                             H, D, Bt, rows, a));
  }
  return TPR_OK;
}

const tpr__kernel_def tpr__lightning_cuda[] = {
    {TPR_OP_LIGHTNING_ATTENTION, cuda_lightning_attention},
    {TPR_OP_LIGHTNING_ATTENTION_BWD, cuda_lightning_attention_bwd},
    {TPR_OP_LIGHTNING_DECODE, cuda_lightning_decode},
    {TPR_OP_LIGHTNING_PAGED, cuda_lightning_paged},
    {},
};
