// Paged KV cache CUDA kernels (paged_cpu.c's twin): the in-place write
// of a step's rows into the block pool, and causal GQA attention of a ragged
// batch over it. Naive but correct forms, the plainest that compute the CPU's
// function; not tuned.
//
// The index tensors (slot_mapping; block_tables, seq, positions) are copied
// to contiguous device scratch and read back once (a small sync), so every
// index is range-checked on the host before anything is written, with the
// CPU's status codes; kernels then read the contiguous copies.
//
// Attention: one block per (token t, query head h), cuda.cu's three
// passes (max, sum, then p @ v a tile of keys at a time), key j of sequence
// s read from pool row block_tables[s][j / bs] * bs + j % bs. A token's
// result depends only on its own query, sequence and position (batch
// invariant); its f32 sums run in a fixed order that differs from the CPU's
// BLAS order. A padded token (seq < 0) gets a zero row.
//
// Cache write: one thread per (head, dim) element walks the tokens in order,
// so duplicate slots resolve as on the CPU (the later token wins) without
// races.
#include <math.h>

#include <vector>

#include "runtime/ops/cuda_kernels.h"

namespace {

struct max_f {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};
struct sum_f {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// A contiguous device copy of the i32 tensor t in dev, and a host copy.
tpr_status read_indices(tpr_cuda_ctx *c, const char *op, const tpr_tensor *t, tpr__cuda_scratch &dev,
                        std::vector<int32_t> &host) {
  const int64_t n = tpr_tensor_numel(t);
  host.assign((size_t)(n > 0 ? n : 1), 0);
  TPR_CHECK(dev.alloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t)));
  if (n == 0) return TPR_OK;
  int64_t cs[TPR_MAX_DIMS];
  tpr__contig_strides(t->ndim, t->shape, cs);
  TPR_CHECK(tpr__cuda_strided_copy(c, op, dev.p, cs, tpr_tensor_data(t), t->stride, t->ndim, t->shape, 4));
  return tpr__cuda_read(c, op, host.data(), dev.p, (size_t)n * sizeof(int32_t));
}

// pool[slot[t]] = new[t] for t in order; thread i owns element (h, d) = (i / D, i % D).
__global__ void paged_write_kernel(float *pool, tpr__cuda_desc pd, const float *nw, tpr__cuda_desc nd,
                                   const int32_t *slot, int64_t T) {
  const int64_t Hkv = nd.shape[1], D = nd.shape[2], bs = pd.shape[1];
  TPR_CUDA_GRID_STRIDE(i, Hkv * D) {
    const int64_t h = i / D, d = i % D;
    for (int64_t t = 0; t < T; t++) {
      const int64_t r = slot[t];
      if (r < 0) continue;
      pool[(r / bs) * pd.stride[0] + (r % bs) * pd.stride[1] + h * pd.stride[2] + d * pd.stride[3]] =
          nw[t * nd.stride[0] + h * nd.stride[1] + d * nd.stride[2]];
    }
  }
}

__global__ void write_i32_kernel(int32_t *o, int32_t v) { *o = v; }

struct paged_args {
  const float *q, *k, *v;
  int64_t qs[3], ks[4], vs[4];    // strides of q (T, Hq, D) and the pools (NB, bs, Hkv, D)
  const int32_t *bt, *seq, *pos;  // contiguous (B, MB), (T), (T)
  int64_t T, Hq, group, D, bs, MB;
  float scale;
};

// Element offset of position j's row, KV head g, in a pool with strides s.
__device__ __forceinline__ int64_t row_off(const paged_args &a, const int64_t *s, const int32_t *btr, int64_t j,
                                           int64_t g) {
  return (int64_t)btr[j / a.bs] * s[0] + (j % a.bs) * s[1] + g * s[2];
}

__device__ __forceinline__ float score(const paged_args &a, const float *qsh, const int32_t *btr, int64_t j,
                                       int64_t g) {
  const float *kr = a.k + row_off(a, a.ks, btr, j, g);
  float dot = 0.0f;
  for (int64_t d = 0; d < a.D; d++) dot += qsh[d] * kr[d * a.ks[3]];
  return dot * a.scale;
}

// Dynamic shared memory: q (D) then the tile's probabilities (blockDim).
// blockDim >= D: thread d owns output dim d.
__global__ void paged_attention_kernel(float *o, paged_args a) {
  extern __shared__ float smem[];
  __shared__ float red[32];
  float *qsh = smem, *tile = smem + a.D;
  for (int64_t b = blockIdx.x; b < a.T * a.Hq; b += gridDim.x) {
    const int64_t t = b / a.Hq, h = b % a.Hq, g = h / a.group, s = a.seq[t];
    __syncthreads();  // the previous (t, h) is done with qsh and tile
    if (s < 0) {      // a padded token (the branch is the whole block's)
      for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x) o[(t * a.Hq + h) * a.D + d] = 0.0f;
      continue;
    }
    const int64_t L = (int64_t)a.pos[t] + 1;  // visible positions [0, L)
    const int32_t *btr = a.bt + s * a.MB;
    const float *qr = a.q + t * a.qs[0] + h * a.qs[1];
    for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x) qsh[d] = qr[d * a.qs[2]];
    __syncthreads();
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < L; j += blockDim.x) {
      const float sc = score(a, qsh, btr, j, g);
      m = sc > m ? sc : m;
    }
    m = tpr__cuda_block_reduce(m, max_f(), red);
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < L; j += blockDim.x) acc += expf(score(a, qsh, btr, j, g) - m);
    const float inv = 1.0f / tpr__cuda_block_reduce(acc, sum_f(), red);  // sum >= 1: the max gives exp(0)
    float out = 0.0f;  // thread d's output dim
    for (int64_t j0 = 0; j0 < L; j0 += blockDim.x) {
      const int64_t j = j0 + threadIdx.x;
      tile[threadIdx.x] = j < L ? expf(score(a, qsh, btr, j, g) - m) * inv : 0.0f;
      __syncthreads();
      const int64_t n = L - j0 < (int64_t)blockDim.x ? L - j0 : (int64_t)blockDim.x;
      if ((int64_t)threadIdx.x < a.D)
        for (int64_t jj = 0; jj < n; jj++) out += tile[jj] * a.v[row_off(a, a.vs, btr, j0 + jj, g) + threadIdx.x * a.vs[3]];
      __syncthreads();
    }
    if ((int64_t)threadIdx.x < a.D) o[(t * a.Hq + h) * a.D + threadIdx.x] = out;
  }
}

}  // namespace

// pool (NB, bs, Hkv, D) f32, new (T, Hkv, D) f32, slot_mapping (T) i32;
// writes pool row slot_mapping[t] := new[t] in place (slot < 0: skipped);
// out (1) i32 = the number of rows written.
TPR_CUDA_KERNEL(paged_cache_write) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  const char *op = "paged_cache_write (cuda)";
  if (n_in != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: expected 3 inputs, got %d", op, n_in);
  const tpr_tensor *pool = in[0], *nw = in[1], *sm = in[2];
  // Dtypes and shapes: the shape rule (paged_rules.c) checked them.
  TPR_CUDA_TRY(cudaSetDevice(c->device), "paged_cache_write", "set device");
  const int64_t T = nw->shape[0], rows = pool->shape[0] * pool->shape[1];
  tpr__cuda_scratch dslot(c);
  std::vector<int32_t> slot;
  TPR_CHECK(read_indices(c, "paged_cache_write", sm, dslot, slot));
  int64_t written = 0;
  for (int64_t t = 0; t < T; t++) {  // every slot first: an error writes nothing
    if (slot[t] >= rows)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: slot_mapping[%lld] = %lld is outside the pool's NB*bs = %lld rows",
                      op, (long long)t, (long long)slot[t], (long long)rows);
    written += slot[t] >= 0;
  }
  const int64_t n = nw->shape[1] * nw->shape[2];
  if (written > 0 && n > 0) {
    const int th = 256;
    // The pool is written through its storage (the handle is const), as cache_write.
    paged_write_kernel<<<tpr__cuda_blocks(n, th), th, 0, c->stream>>>(
        (float *)tpr_tensor_data(pool), tpr__cuda_tensor_desc(pool), (const float *)tpr_tensor_data(nw),
        tpr__cuda_tensor_desc(nw), (const int32_t *)dslot.p, T);
    TPR_CUDA_LAUNCHED("paged_cache_write", "write kernel");
  }
  write_i32_kernel<<<1, 1, 0, c->stream>>>((int32_t *)tpr_tensor_data(out), (int32_t)written);
  TPR_CUDA_LAUNCHED("paged_cache_write", "row count");
  return TPR_OK;
}

// q (T, Hq, D) f32, k_pool/v_pool (NB, bs, Hkv, D) f32, block_tables (B, MB)
// i32, seq (T) i32, positions (T) i32; out (T, Hq, D) contiguous.
// attrs->f[0] = scale.
TPR_CUDA_KERNEL(paged_attention) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  const char *op = "paged_attention (cuda)";
  if (n_in != 6) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: expected 6 inputs, got %d", op, n_in);
  const tpr_tensor *q = in[0], *kp = in[1], *vp = in[2], *bt = in[3], *seq = in[4], *pos = in[5];
  // Dtypes and shapes: the shape rule (paged_rules.c) checked them.
  if (!attrs || attrs->n_f < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: missing scale f[0]", op);
  const int64_t T = q->shape[0], Hq = q->shape[1], D = q->shape[2];
  const int64_t NB = kp->shape[0], bs = kp->shape[1], Hkv = kp->shape[2], B = bt->shape[0], MB = bt->shape[1];
  TPR_CUDA_TRY(cudaSetDevice(c->device), "paged_attention", "set device");
  tpr__cuda_scratch dbt(c), dseq(c), dpos(c);
  std::vector<int32_t> hbt, hseq, hpos;
  TPR_CHECK(read_indices(c, "paged_attention", bt, dbt, hbt));
  TPR_CHECK(read_indices(c, "paged_attention", seq, dseq, hseq));
  TPR_CHECK(read_indices(c, "paged_attention", pos, dpos, hpos));
  // The CPU's checks (its plan_runs), token by token: a token reads blocks [0, pos / bs].
  for (int64_t t = 0; t < T; t++) {
    const int64_t s = hseq[t], p = hpos[t];
    if (s < 0) continue;
    if (s >= B)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "paged_attention: seq[%lld] = %lld but block_tables has B = %lld rows",
                      (long long)t, (long long)s, (long long)B);
    if (p < 0 || p >= MB * bs)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "paged_attention: positions[%lld] = %lld is outside [0, MB*bs = %lld)",
                      (long long)t, (long long)p, (long long)(MB * bs));
    for (int64_t j = 0; j <= p / bs; j++) {
      const int64_t b = hbt[s * MB + j];
      if (b < 0 || b >= NB)
        return TPR_FAIL(TPR_ERR_INVALID_ARG,
                        "paged_attention: block_tables[%lld][%lld] = %lld (read by token %lld at position %lld) is "
                        "outside the pool's [0, NB = %lld) blocks",
                        (long long)s, (long long)j, (long long)b, (long long)t, (long long)p, (long long)NB);
    }
  }
  if (T == 0 || Hq == 0 || D == 0) return TPR_OK;
  if (D > 1024)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: head dim D = %lld > 1024 (one thread per dim)", op, (long long)D);
  paged_args a = {};
  a.q = (const float *)tpr_tensor_data(q), a.k = (const float *)tpr_tensor_data(kp);
  a.v = (const float *)tpr_tensor_data(vp);
  for (int i = 0; i < 3; i++) a.qs[i] = q->stride[i];
  for (int i = 0; i < 4; i++) a.ks[i] = kp->stride[i], a.vs[i] = vp->stride[i];
  a.bt = (const int32_t *)dbt.p, a.seq = (const int32_t *)dseq.p, a.pos = (const int32_t *)dpos.p;
  a.T = T, a.Hq = Hq, a.group = Hq / Hkv, a.D = D, a.bs = bs, a.MB = MB;
  a.scale = attrs->f[0];
  const int th = D <= 128 ? 128 : (int)((D + 31) / 32 * 32);  // a multiple of 32, >= D
  const size_t shm = (size_t)(D + th) * sizeof(float);
  // The scratch copies return to the pool on scope exit; the allocator hands
  // them out again only to work ordered after this launch (cuda_kernels.h).
  paged_attention_kernel<<<tpr__cuda_blocks(T * Hq, 1), th, shm, c->stream>>>((float *)tpr_tensor_data(out), a);
  TPR_CUDA_LAUNCHED("paged_attention", "paged attention kernel");
  return TPR_OK;
}

const tpr__kernel_def tpr__paged_attention_cuda[] = {
    {TPR_OP_PAGED_CACHE_WRITE, cuda_paged_cache_write},
    {TPR_OP_PAGED_ATTENTION, cuda_paged_attention},
    {},
};
