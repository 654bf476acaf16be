// InfLLM-v2 sparse attention, CUDA (cpu.c's twin; semantics at
// tpr_pb_sparse_attention_paged). The plainest form that computes the CPU's
// function, not tuned: compiled by the CUDA build, not yet run on a GPU
// (docs/minicpm-sala.md).
//
// The index tensors are read back to the host (a small sync) and checked as
// the CPU checks them before anything is written; the sequences' lengths
// decide dense or sparse on the host. A sparse sequence's compressed keys go
// to device scratch in double, each chunk summed in the CPU's order, so equal
// chunks give equal means here too. Then one block per (token, KV head): its
// threads compute the group's chunk probabilities (the softmax sums reduced in
// the block's fixed order, the only place the CPU's sequential order differs),
// the block scores (each block's max sequentially, as on the CPU), thread 0
// picks the blocks (the CPU's loop), and the group's heads run over the
// picked keys: scores in double, the weighted sum over keys in ascending
// order per output dim, as the CPU's.
#include <math.h>

#include <vector>

#include "runtime/ops/cuda_kernels.h"

namespace {

struct max_d {
  __device__ double operator()(double a, double b) const { return b > a ? b : a; }
};
struct sum_d {
  __device__ double operator()(double a, double b) const { return a + b; }
};

struct sa_args {
  const float *q, *k, *v;
  int64_t qs[3], ks[4], vs[4];     // strides of q (T, Hq, D) and the pools (NB, bs, Hkv, D)
  const int32_t *bt, *seq, *pos;   // contiguous (B, MB), (T), (T)
  const int32_t *pl;               // (T) prefill lengths (the prefill-length form), or NULL
  const int64_t *len, *n_c, *c0;   // per sequence: L, compressed chunks, first chunk in comp
  const double *comp;              // (chunks, Hkv, D)
  double *S, *score;               // per grid block: (max_c), (max_blk)
  int *sel;                        // per grid block: (max_blk)
  int64_t T, Hkv, G, D, pbs, MB, max_c, max_blk;
  int64_t ks_, st, bs, topk, init, local, dense_len;
  double scale;
};

__device__ __forceinline__ const float *kv_row(const float *base, const int64_t *s, const sa_args &a, int64_t sq,
                                               int64_t r, int64_t g) {
  return base + (int64_t)a.bt[sq * a.MB + r / a.pbs] * s[0] + (r % a.pbs) * s[1] + g * s[2];
}

// comp[c0 + j] (Hkv, D) := the mean of chunk j's kernel_size keys, rounded to
// f32 as the CPU kernel keeps it; one thread per (j, g, d).
__global__ void compress_kernel(double *comp, sa_args a, int64_t sq, int64_t n_c, int64_t c0) {
  TPR_CUDA_GRID_STRIDE(i, n_c * a.Hkv * a.D) {
    const int64_t j = i / (a.Hkv * a.D), g = (i / a.D) % a.Hkv, d = i % a.D;
    double acc = 0;
    for (int64_t r = j * a.st; r < j * a.st + a.ks_; r++) acc += kv_row(a.k, a.ks, a, sq, r, g)[d * a.ks[3]];
    comp[((c0 + j) * a.Hkv + g) * a.D + d] = (double)(float)(acc / (double)a.ks_);  // cpu.c's f32 rounding
  }
}

__device__ double dot_qk(const sa_args &a, const double *q, const float *k, int64_t dk) {
  double dot = 0;
  for (int64_t d = 0; d < a.D; d++) dot += q[d] * k[d * dk];
  return dot * a.scale;
}

// Dynamic shared memory: the group's queries (G, D) then a tile (blockDim) of weights, in double.
__global__ void sparse_attention_kernel(float *o, sa_args a) {
  extern __shared__ double smem[];
  __shared__ double red[32];
  double *qd = smem, *tile = smem + a.G * a.D;
  double *S = a.S + blockIdx.x * a.max_c, *score = a.score + blockIdx.x * a.max_blk;
  int *sel = a.sel + blockIdx.x * a.max_blk;
  const int64_t tid = threadIdx.x, nth = blockDim.x;
  for (int64_t it = blockIdx.x; it < a.T * a.Hkv; it += gridDim.x) {
    const int64_t t = it / a.Hkv, g = it % a.Hkv, sq = a.seq[t];
    float *out = o + (t * a.Hkv * a.G + g * a.G) * a.D;  // (G, D) rows of this group
    __syncthreads();  // the previous item is done with the shared and scratch memory
    if (sq < 0) {     // a padded token: zero rows (the branch is the whole block's)
      for (int64_t e = tid; e < a.G * a.D; e += nth) out[e] = 0.0f;
      continue;
    }
    const int64_t p = a.pos[t], qb = p / a.bs, n = a.pl ? a.pl[t] : 0;
    const int64_t L = n <= 0 ? a.len[sq] : n > p + 1 ? n : p + 1;  // cpu.c's deciding_len
    for (int64_t e = tid; e < a.G * a.D; e += nth)
      qd[e] = a.q[t * a.qs[0] + (g * a.G + e / a.D) * a.qs[1] + (e % a.D) * a.qs[2]];
    const bool dense = L < a.dense_len;
    for (int64_t b = tid; b <= qb; b += nth) sel[b] = dense || b < a.init || b > qb - a.local;
    __syncthreads();
    const int64_t first = a.init, last = qb - a.local;
    if (!dense && last >= first && a.topk > a.init) {
      int64_t n_valid = p + 1 >= a.ks_ ? (p + 1 - a.ks_) / a.st + 1 : 0;
      n_valid = n_valid < a.n_c[sq] ? n_valid : a.n_c[sq];
      const double *c = a.comp + a.c0[sq] * a.Hkv * a.D;
      for (int64_t j = tid; j < n_valid; j += nth) S[j] = 0;
      for (int64_t h = 0; h < a.G && n_valid > 0; h++) {
        const double *q = qd + h * a.D;
        double m = -INFINITY;
        for (int64_t j = tid; j < n_valid; j += nth) {
          double dot = 0;
          for (int64_t d = 0; d < a.D; d++) dot += q[d] * c[(j * a.Hkv + g) * a.D + d];
          const double lj = dot * a.scale;
          m = lj > m ? lj : m;
        }
        m = tpr__cuda_block_reduce(m, max_d(), red);
        double z = 0;
        for (int64_t j = tid; j < n_valid; j += nth) {
          double dot = 0;
          for (int64_t d = 0; d < a.D; d++) dot += q[d] * c[(j * a.Hkv + g) * a.D + d];
          z += exp(dot * a.scale - m);
        }
        z = tpr__cuda_block_reduce(z, sum_d(), red);
        for (int64_t j = tid; j < n_valid; j += nth) {  // each thread owns its j: no race
          double dot = 0;
          for (int64_t d = 0; d < a.D; d++) dot += q[d] * c[(j * a.Hkv + g) * a.D + d];
          S[j] += exp(dot * a.scale - m) / z;
        }
      }
      __syncthreads();
      const int64_t per = a.bs / a.st, back = a.ks_ / a.st - 1;
      for (int64_t b = first + tid; b <= last; b += nth) {
        int64_t lo = b * per - back, hi = (b + 1) * per;
        lo = lo < 0 ? 0 : lo, hi = hi < n_valid ? hi : n_valid;
        double best = 0;  // every S_j >= 0
        for (int64_t j = lo; j < hi; j++) best = S[j] > best ? S[j] : best;
        score[b] = best;
      }
      __syncthreads();
      if (tid == 0)  // the best topk - init candidates, the lower block first among equals (cpu.c's loop)
        for (int64_t slots = a.topk - a.init; slots > 0; slots--) {
          int64_t pick = -1;
          for (int64_t b = first; b <= last; b++)
            if (!sel[b] && (pick < 0 || score[b] > score[pick])) pick = b;
          if (pick < 0) break;
          sel[pick] = 1;
        }
      __syncthreads();
    }
    for (int64_t h = 0; h < a.G; h++) {
      const double *q = qd + h * a.D;
      double m = -INFINITY;
      for (int64_t r = tid; r <= p; r += nth)
        if (sel[r / a.bs]) {
          const double w = dot_qk(a, q, kv_row(a.k, a.ks, a, sq, r, g), a.ks[3]);
          m = w > m ? w : m;
        }
      m = tpr__cuda_block_reduce(m, max_d(), red);
      double z = 0;
      for (int64_t r = tid; r <= p; r += nth)
        if (sel[r / a.bs]) z += exp(dot_qk(a, q, kv_row(a.k, a.ks, a, sq, r, g), a.ks[3]) - m);
      z = tpr__cuda_block_reduce(z, sum_d(), red);
      double acc = 0;  // thread d's output dim
      for (int64_t r0 = 0; r0 <= p; r0 += nth) {
        const int64_t r = r0 + tid;
        tile[tid] = r <= p && sel[r / a.bs] ? exp(dot_qk(a, q, kv_row(a.k, a.ks, a, sq, r, g), a.ks[3]) - m) : 0.0;
        __syncthreads();
        const int64_t n = p + 1 - r0 < nth ? p + 1 - r0 : nth;
        if (tid < a.D)
          for (int64_t jj = 0; jj < n; jj++)
            if (sel[(r0 + jj) / a.bs]) acc += tile[jj] * kv_row(a.v, a.vs, a, sq, r0 + jj, g)[tid * a.vs[3]];
        __syncthreads();
      }
      if (tid < a.D) out[h * a.D + tid] = (float)(acc / z);
    }
  }
}

// A contiguous device copy of the i32 tensor t, and a host copy.
tpr_status read_i32(tpr_cuda_ctx *c, const char *op, const tpr_tensor *t, tpr__cuda_scratch &dev,
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

// host (n) int64 -> new device scratch.
tpr_status upload(tpr_cuda_ctx *c, const char *op, const std::vector<int64_t> &host, tpr__cuda_scratch &dev) {
  TPR_CHECK(dev.alloc(host.size() * sizeof(int64_t)));
  TPR_CUDA_TRY(cudaMemcpyAsync(dev.p, host.data(), host.size() * sizeof(int64_t), cudaMemcpyHostToDevice, c->stream),
               op, "upload");
  return TPR_OK;
}

}  // namespace

// q (T, Hq, D) f32, k_pool/v_pool (NB, bs, Hkv, D) f32, block_tables (B, MB)
// i32, seq (T) i32, positions (T) i32[, ck_pool][, prefill_len (T) i32]
// (i[7]'s optional inputs, ops.h); out (T, Hq, D) contiguous. The
// compressed-key pool is accepted and neither read nor written: this twin
// recomputes a sequence's compressed keys every call, rounded to f32 as the
// CPU kernel keeps them there, so both score the same values.
TPR_CUDA_KERNEL(sparse_attention_paged) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  const char *op = "sparse_attention_paged (cuda)";
  const int64_t opt = attrs->n_i > 7 ? attrs->i[7] : 0;
  const int n_ck = (opt & TPR_SPARSE_CK_POOL) ? 1 : 0, n_pl = (opt & TPR_SPARSE_PREFILL_LEN) ? 1 : 0;
  if (n_in != 6 + n_ck + n_pl)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: expected %d inputs, got %d", op, 6 + n_ck + n_pl, n_in);
  const tpr_tensor *q = in[0], *kp = in[1], *vp = in[2], *bt = in[3], *seq = in[4], *pos = in[5];
  const tpr_tensor *pl = n_pl ? in[6 + n_ck] : NULL;
  // Dtypes, shapes and attributes: the shape rule (rules.c) checked them.
  const int64_t T = q->shape[0], Hq = q->shape[1], D = q->shape[2];
  const int64_t NB = kp->shape[0], pbs = kp->shape[1], Hkv = kp->shape[2], B = bt->shape[0], MB = bt->shape[1];
  TPR_CUDA_TRY(cudaSetDevice(c->device), op, "set device");
  tpr__cuda_scratch dbt(c), dseq(c), dpos(c), dpl(c);
  std::vector<int32_t> hbt, hseq, hpos, hpl;
  TPR_CHECK(read_i32(c, op, bt, dbt, hbt));
  TPR_CHECK(read_i32(c, op, seq, dseq, hseq));
  TPR_CHECK(read_i32(c, op, pos, dpos, hpos));
  if (pl) TPR_CHECK(read_i32(c, op, pl, dpl, hpl));
  std::vector<int64_t> len((size_t)(B > 0 ? B : 1), 0), n_c(len.size(), 0), c0(len.size(), 0);
  int64_t max_len = 0;
  for (int64_t t = 0; t < T; t++) {  // cpu.c's plan(), in its order and words
    const int64_t s = hseq[t], p = hpos[t];
    if (s < 0) continue;
    if (s >= B)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: seq[%lld] = %lld but block_tables has B = %lld rows", op,
                      (long long)t, (long long)s, (long long)B);
    if (p < 0 || p >= MB * pbs)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: positions[%lld] = %lld is outside [0, MB*bs = %lld)", op,
                      (long long)t, (long long)p, (long long)(MB * pbs));
    len[s] = p + 1 > len[s] ? p + 1 : len[s];
    max_len = p + 1 > max_len ? p + 1 : max_len;
  }
  for (int64_t s = 0; s < B; s++)
    for (int64_t j = 0; j * pbs < len[s]; j++) {
      const int64_t b = hbt[s * MB + j];
      if (b < 0 || b >= NB)
        return TPR_FAIL(TPR_ERR_INVALID_ARG,
                        "%s: block_tables[%lld][%lld] = %lld (read by sequence %lld of length %lld) is outside the "
                        "pool's [0, NB = %lld) blocks",
                        op, (long long)s, (long long)j, (long long)b, (long long)s, (long long)len[s], (long long)NB);
    }
  if (T == 0 || Hq == 0 || D == 0) return TPR_OK;
  const int th = D <= 128 ? 128 : (int)((D + 31) / 32 * 32);  // a multiple of 32, >= D
  if (th > 1024) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "%s: head dim D = %lld > 1024", op, (long long)D);
  sa_args a = {};
  a.ks_ = attrs->i[0], a.st = attrs->i[1], a.bs = attrs->i[2], a.topk = attrs->i[3], a.init = attrs->i[4];
  a.local = attrs->i[5] / attrs->i[2], a.dense_len = attrs->i[6], a.scale = attrs->f[0];
  std::vector<char> sparse(len.size(), 0);  // a row of the sequence is sparse (cpu.c's plan)
  for (int64_t t = 0; t < T; t++) {
    const int64_t s = hseq[t], p = hpos[t], n = pl ? hpl[t] : 0;
    if (s >= 0 && (n <= 0 ? len[s] : n > p + 1 ? n : p + 1) >= a.dense_len) sparse[s] = 1;
  }
  int64_t total_c = 0, max_c = 0;
  for (int64_t s = 0; s < B; s++) {
    if (!sparse[s]) continue;
    n_c[s] = len[s] >= a.ks_ ? (len[s] - a.ks_) / a.st + 1 : 0, c0[s] = total_c;
    total_c += n_c[s], max_c = n_c[s] > max_c ? n_c[s] : max_c;
  }
  a.q = (const float *)tpr_tensor_data(q), a.k = (const float *)tpr_tensor_data(kp);
  a.v = (const float *)tpr_tensor_data(vp);
  for (int i = 0; i < 3; i++) a.qs[i] = q->stride[i];
  for (int i = 0; i < 4; i++) a.ks[i] = kp->stride[i], a.vs[i] = vp->stride[i];
  a.bt = (const int32_t *)dbt.p, a.seq = (const int32_t *)dseq.p, a.pos = (const int32_t *)dpos.p;
  a.pl = pl ? (const int32_t *)dpl.p : NULL;
  a.T = T, a.Hkv = Hkv, a.G = Hq / Hkv, a.D = D, a.pbs = pbs, a.MB = MB;
  a.max_c = max_c + 1, a.max_blk = max_len / a.bs + 1;
  const int64_t items = T * Hkv, grid = items < 1024 ? items : 1024;
  tpr__cuda_scratch dlen(c), dnc(c), dc0(c), dcomp(c), dS(c), dscore(c), dsel(c);
  TPR_CHECK(upload(c, op, len, dlen));
  TPR_CHECK(upload(c, op, n_c, dnc));
  TPR_CHECK(upload(c, op, c0, dc0));
  TPR_CHECK(dcomp.alloc((size_t)(total_c > 0 ? total_c : 1) * Hkv * D * sizeof(double)));
  TPR_CHECK(dS.alloc((size_t)grid * a.max_c * sizeof(double)));
  TPR_CHECK(dscore.alloc((size_t)grid * a.max_blk * sizeof(double)));
  TPR_CHECK(dsel.alloc((size_t)grid * a.max_blk * sizeof(int)));
  a.len = (const int64_t *)dlen.p, a.n_c = (const int64_t *)dnc.p, a.c0 = (const int64_t *)dc0.p;
  a.comp = (const double *)dcomp.p, a.S = (double *)dS.p, a.score = (double *)dscore.p, a.sel = (int *)dsel.p;
  for (int64_t s = 0; s < B; s++) {
    if (n_c[s] == 0) continue;
    compress_kernel<<<tpr__cuda_blocks(n_c[s] * Hkv * D, 256), 256, 0, c->stream>>>((double *)dcomp.p, a, s, n_c[s],
                                                                                    c0[s]);
    TPR_CUDA_LAUNCHED(op, "compressed keys");
  }
  const size_t shm = (size_t)(a.G * D + th) * sizeof(double);
  // The scratch returns to the pool on scope exit; the allocator hands it out
  // again only to work ordered after these launches (cuda_kernels.h).
  sparse_attention_kernel<<<(unsigned)grid, th, shm, c->stream>>>((float *)tpr_tensor_data(out), a);
  TPR_CUDA_LAUNCHED(op, "sparse attention kernel");
  return TPR_OK;
}

const tpr__kernel_def tpr__sparse_attention_cuda[] = {
    {TPR_OP_SPARSE_ATTENTION_PAGED, cuda_sparse_attention_paged},
    {},
};
