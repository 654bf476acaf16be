// KV-cache CUDA kernels (cpu.c's twin): causal GQA attention over a
// cache, and the in-place cache write that fills it.
//
// Attention: one block per (query t, query head h), the plainest correct
// form rather than a flash kernel. Query t sees cache rows [0, start + t],
// start read on device; head h reads KV head h / (Hq / Hkv). In f32 as the
// CPU: score_j = (q . k_j) * scale, m = max score, p_j = expf(score_j - m) *
// (1 / sum_j expf(score_j - m)), out = sum_j p_j v_j. Scores are recomputed
// in each of three passes (max, sum, then p @ v a tile of keys at a time)
// instead of being stored, so shared memory stays O(D + block) whatever the
// cache length; every pass computes bit-identical scores. Sums run in a fixed
// order (deterministic) that differs from the CPU's BLAS order. Keys a query
// cannot see are never read (the CPU reads, with weight 0, those up to the
// end of its block of queries).
//
// start is range-checked on the host first (one small read back), with the
// CPU's message: start < 0 or start + T > S is TPR_ERR_INVALID_ARG. The
// document form (ops.h: + lo (T) i32, query t sees keys [lo[t], start + t])
// reads lo back too, for the same check as the CPU's.
#include <math.h>
#include <stdlib.h>

#include "runtime/ops/cuda_kernels.h"

struct max_op {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};
struct sum_op {
  __device__ float operator()(float a, float b) const { return a + b; }
};

struct attn_args {
  const float *q, *k, *v;
  int64_t qs[3], ks[3], vs[3];  // strides of q (T, Hq, D), k and v (S, Hkv, D)
  const void *start;            // (1) i32/i64
  const int32_t *lo;            // (T) contiguous, the document form; NULL: every query from key 0
  bool start64;
  int64_t T, Hq, group, D;      // group = Hq / Hkv
  float scale;
};

// (q_t,h . k_j,g) * scale, q from shared memory.
static __device__ __forceinline__ float score(const attn_args &a, const float *qsh, const float *kg, int64_t j) {
  const float *kr = kg + j * a.ks[0];
  float dot = 0.0f;
  for (int64_t d = 0; d < a.D; d++) dot += qsh[d] * kr[d * a.ks[2]];
  return dot * a.scale;
}

// Dynamic shared memory: q (D) then the tile's probabilities (blockDim).
// blockDim >= D: thread d owns output dim d.
static __global__ void attention_kernel(float *o, attn_args a) {
  extern __shared__ float smem[];
  __shared__ float red[32];
  float *qsh = smem, *tile = smem + a.D;
  const int64_t start = tpr__cuda_load_index(a.start, a.start64, 0);
  for (int64_t b = blockIdx.x; b < a.T * a.Hq; b += gridDim.x) {
    const int64_t t = b / a.Hq, h = b % a.Hq, g = h / a.group;
    const int64_t L = start + t + 1, j_lo = a.lo ? a.lo[t] : 0;  // visible keys [j_lo, L)
    const float *kg = a.k + g * a.ks[1], *vg = a.v + g * a.vs[1];
    const float *qr = a.q + t * a.qs[0] + h * a.qs[1];
    __syncthreads();  // the previous (t, h) is done with qsh and tile
    for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x) qsh[d] = qr[d * a.qs[2]];
    __syncthreads();
    float m = -INFINITY;
    for (int64_t j = j_lo + threadIdx.x; j < L; j += blockDim.x) {
      const float s = score(a, qsh, kg, j);
      m = s > m ? s : m;
    }
    m = tpr__cuda_block_reduce(m, max_op(), red);
    float acc = 0.0f;
    for (int64_t j = j_lo + threadIdx.x; j < L; j += blockDim.x) acc += expf(score(a, qsh, kg, j) - m);
    const float inv = 1.0f / tpr__cuda_block_reduce(acc, sum_op(), red);  // sum >= 1: the max gives exp(0)
    float out = 0.0f;  // thread d's output dim
    for (int64_t j0 = j_lo; j0 < L; j0 += blockDim.x) {
      const int64_t j = j0 + threadIdx.x;
      tile[threadIdx.x] = j < L ? expf(score(a, qsh, kg, j) - m) * inv : 0.0f;
      __syncthreads();
      const int64_t n = L - j0 < (int64_t)blockDim.x ? L - j0 : (int64_t)blockDim.x;
      if ((int64_t)threadIdx.x < a.D)
        for (int64_t jj = 0; jj < n; jj++) out += tile[jj] * vg[(j0 + jj) * a.vs[0] + threadIdx.x * a.vs[2]];
      __syncthreads();
    }
    if ((int64_t)threadIdx.x < a.D) o[(t * a.Hq + h) * a.D + threadIdx.x] = out;
  }
}

// Rows [start, start + T) must lie in the cache's [0, S): the CPU's check.
static tpr_status check_start(tpr_cuda_ctx *c, const char *op, const char *what, const tpr_tensor *st, int64_t T,
                              int64_t S, int64_t *start) {
  TPR_CHECK(tpr__cuda_read_index(c, op, st, start));
  if (*start < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: start %lld is negative", op, (long long)*start);
  if (*start > S - T)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: start %lld + T %lld %s exceeds the cache's S = %lld rows", op,
                    (long long)*start, (long long)T, what, (long long)S);
  return TPR_OK;
}

// The document form's lo (T) i32, read back and checked as the CPU does
// (0 <= lo[t] <= start + t); *docs false without it.
static tpr_status check_lo(tpr_cuda_ctx *c, const tpr_tensor *const *in, int n_in, const tpr_op_attrs *attrs,
                           int64_t start, int64_t T, bool *docs) {
  *docs = attrs->n_i > 0 && attrs->i[0] != 0;
  if (n_in != 4 + (int)*docs)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention (cuda): expected %d inputs%s, got %d", 4 + (int)*docs,
                    *docs ? " (document form)" : "", n_in);
  if (!*docs || T == 0) return TPR_OK;
  const tpr_tensor *lo = in[4];
  if (lo->dtype != TPR_I32 || lo->ndim != 1 || lo->shape[0] != T || (T > 1 && lo->stride[0] != 1))
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "attention (cuda): lo must be a contiguous (T = %lld) i32", (long long)T);
  int32_t *h = (int32_t *)malloc((size_t)T * sizeof *h);
  if (!h) return TPR_FAIL(TPR_ERR_OOM, "attention (cuda): lo");
  tpr_status rc = tpr__cuda_read(c, "attention", h, tpr_tensor_data(lo), (size_t)T * sizeof *h);
  for (int64_t t = 0; rc == TPR_OK && t < T; t++)
    if (h[t] < 0 || h[t] > start + t)
      rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "attention: lo[%lld] = %d outside [0, start + %lld = %lld]: a query must "
                    "see its own key", (long long)t, h[t], (long long)t, (long long)(start + t));
  free(h);
  return rc;
}

// q (T, Hq, D), k_cache/v_cache (S, Hkv, D), start (1) (document form: + lo
// (T)); out (T, Hq, D) contiguous. attrs->f[0] = scale.
TPR_CUDA_KERNEL(attention) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 4 && n_in != 5)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention (cuda): expected 4 or 5 inputs, got %d", n_in);
  const tpr_tensor *q = in[0], *k = in[1], *v = in[2], *st = in[3];
  if (q->dtype != TPR_F32 || k->dtype != TPR_F32 || v->dtype != TPR_F32 || out->dtype != TPR_F32 ||
      (st->dtype != TPR_I32 && st->dtype != TPR_I64))
    return TPR_FAIL(TPR_ERR_DTYPE, "attention (cuda): q %s, k %s, v %s, start %s, out %s; need f32 and i32/i64 start",
                    tpr_dtype_name(q->dtype), tpr_dtype_name(k->dtype), tpr_dtype_name(v->dtype),
                    tpr_dtype_name(st->dtype), tpr_dtype_name(out->dtype));
  if (!attrs || attrs->n_f < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "attention (cuda): missing scale f[0]");
  if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3 || tpr_tensor_numel(st) != 1 || !tpr_tensor_same_shape(q, out) ||
      !tpr_tensor_same_shape(k, v) || k->shape[2] != q->shape[2] || k->shape[1] < 1 || q->shape[1] % k->shape[1])
    return TPR_FAIL(TPR_ERR_SHAPE, "attention (cuda): q, k_cache, v_cache, start and out shapes do not fit");
  const int64_t T = q->shape[0], Hq = q->shape[1], D = q->shape[2], S = k->shape[0], Hkv = k->shape[1];
  TPR_CUDA_TRY(cudaSetDevice(c->device), "attention", "set device");
  int64_t start;
  TPR_CHECK(check_start(c, "attention", "queries", st, T, S, &start));
  bool docs;
  TPR_CHECK(check_lo(c, in, n_in, attrs, start, T, &docs));
  if (T == 0 || Hq == 0 || D == 0) return TPR_OK;
  if (D > 1024)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "attention (cuda): head dim D = %lld > 1024 (one thread per dim)",
                    (long long)D);
  attn_args a = {};
  a.q = (const float *)tpr_tensor_data(q), a.k = (const float *)tpr_tensor_data(k);
  a.v = (const float *)tpr_tensor_data(v);
  for (int i = 0; i < 3; i++) a.qs[i] = q->stride[i], a.ks[i] = k->stride[i], a.vs[i] = v->stride[i];
  a.start = tpr_tensor_data(st);
  a.start64 = st->dtype == TPR_I64;
  a.lo = docs ? (const int32_t *)tpr_tensor_data(in[4]) : NULL;
  a.T = T, a.Hq = Hq, a.group = Hq / Hkv, a.D = D;
  a.scale = attrs->f[0];
  const int th = D <= 128 ? 128 : (int)((D + 31) / 32 * 32);  // a multiple of 32, >= D
  const size_t shm = (size_t)(D + th) * sizeof(float);
  attention_kernel<<<tpr__cuda_blocks(T * Hq, 1), th, shm, c->stream>>>((float *)tpr_tensor_data(out), a);
  TPR_CUDA_LAUNCHED("attention", "attention kernel");
  return TPR_OK;
}

// cache[start + t, h, d] = new[t, h, d]; E moves the element's bytes.
template <typename E>
static __global__ void cache_write_kernel(E *cache, int64_t cs0, int64_t cs1, int64_t cs2, const E *nw,
                                          tpr__cuda_desc nd, const void *start, bool start64, int64_t total) {
  const int64_t s = tpr__cuda_load_index(start, start64, 0);
  const int64_t Hkv = nd.shape[1], D = nd.shape[2];
  TPR_CUDA_GRID_STRIDE(i, total) {
    const int64_t d = i % D, h = (i / D) % Hkv, t = i / (D * Hkv);
    cache[(s + t) * cs0 + h * cs1 + d * cs2] = nw[t * nd.stride[0] + h * nd.stride[1] + d * nd.stride[2]];
  }
}

static __global__ void write_end_kernel(int32_t *o, const void *start, bool start64, int64_t T) {
  *o = (int32_t)(tpr__cuda_load_index(start, start64, 0) + T);
}

// cache (S, Hkv, D), new (T, Hkv, D) same dtype, start (1); writes
// cache[start + i] = new[i] in place; out (1) i32 = start + T.
TPR_CUDA_KERNEL(cache_write) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "cache_write (cuda): expected 3 inputs, got %d", n_in);
  const tpr_tensor *cache = in[0], *nw = in[1], *st = in[2];
  if (nw->dtype != cache->dtype || out->dtype != TPR_I32 || (st->dtype != TPR_I32 && st->dtype != TPR_I64))
    return TPR_FAIL(TPR_ERR_DTYPE, "cache_write (cuda): cache %s, new %s, start %s, out %s",
                    tpr_dtype_name(cache->dtype), tpr_dtype_name(nw->dtype), tpr_dtype_name(st->dtype),
                    tpr_dtype_name(out->dtype));
  if (cache->ndim != 3 || nw->ndim != 3 || nw->shape[1] != cache->shape[1] || nw->shape[2] != cache->shape[2] ||
      tpr_tensor_numel(st) != 1 || tpr_tensor_numel(out) != 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "cache_write (cuda): cache, new, start and out shapes do not fit");
  const int64_t T = nw->shape[0], S = cache->shape[0];
  TPR_CUDA_TRY(cudaSetDevice(c->device), "cache_write", "set device");
  int64_t start;
  TPR_CHECK(check_start(c, "cache_write", "new rows", st, T, S, &start));
  if (start + T > INT32_MAX)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "cache_write: end position %lld does not fit the i32 token",
                    (long long)(start + T));
  // The one op that writes an input: the handle is const, its storage is not.
  void *cd = tpr_tensor_data(cache);
  const void *nd = tpr_tensor_data(nw), *sp = tpr_tensor_data(st);
  const bool s64 = st->dtype == TPR_I64;
  const int64_t total = tpr_tensor_numel(nw), *cs = cache->stride;
  const tpr__cuda_desc ndesc = tpr__cuda_tensor_desc(nw);
  if (total > 0) {
    const int th = 256;
    const unsigned nb = tpr__cuda_blocks(total, th);
    const bool ok = tpr__cuda_by_size(tpr_dtype_size(cache->dtype), [&](auto e) {
      using E = decltype(e);
      cache_write_kernel<<<nb, th, 0, c->stream>>>((E *)cd, cs[0], cs[1], cs[2], (const E *)nd, ndesc, sp, s64, total);
    });
    if (!ok) return TPR_FAIL(TPR_ERR_DTYPE, "cache_write (cuda): no kernel for %s", tpr_dtype_name(cache->dtype));
    TPR_CUDA_LAUNCHED("cache_write", "cache_write kernel");
  }
  write_end_kernel<<<1, 1, 0, c->stream>>>((int32_t *)tpr_tensor_data(out), sp, s64, T);
  TPR_CUDA_LAUNCHED("cache_write", "end token");
  return TPR_OK;
}

const tpr__kernel_def tpr__attention_cuda[] = {
    {TPR_OP_ATTENTION, cuda_attention},
    {TPR_OP_CACHE_WRITE, cuda_cache_write},
    {},
};
