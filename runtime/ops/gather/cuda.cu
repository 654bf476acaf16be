// Gather CUDA kernels (cpu.c's twin): embedding, embedding_shard and
// index_select for any element type, plus the index checks the other
// kernels share.
//
// Elements move as bytes (an unsigned integer of the element's size), so one
// kernel per size serves every dtype. Indices live in device memory and are
// read there; as on the CPU, every index is range-checked before anything is
// written, and a bad one is TPR_ERR_INVALID_ARG naming its position and
// value, with out left as it was. The check costs one small read back (a
// stream sync) per op.
#include <limits.h>

#include "runtime/ops/cuda_kernels.h"

enum { CHECK_THREADS = 256 };

struct min_op {
  __device__ long long operator()(long long a, long long b) const { return b < a ? b : a; }
};

// One block: the first position p (row-major over d) whose index lies
// outside [lo, hi], or -1; res = {p, value at p}.
static __global__ void first_bad_kernel(const void *ids, bool is64, tpr__cuda_desc d, int64_t n, int64_t lo,
                                        int64_t hi, int64_t *res) {
  __shared__ long long shm[32];
  long long first = LLONG_MAX;
  for (int64_t p = threadIdx.x; p < n; p += blockDim.x) {
    const int64_t v = tpr__cuda_load_index(ids, is64, tpr__cuda_offset(d, p));
    if (v < lo || v > hi) {
      first = p;  // this thread's positions only grow: its first is its least
      break;
    }
  }
  first = tpr__cuda_block_reduce(first, min_op(), shm);
  if (threadIdx.x == 0) {
    res[0] = first == LLONG_MAX ? -1 : first;
    res[1] = first == LLONG_MAX ? 0 : tpr__cuda_load_index(ids, is64, tpr__cuda_offset(d, first));
  }
}

// The CPU kernels validate every index before writing anything; so do
// these, with the same messages: a one-block device scan finds the first
// (row-major) position whose value lies outside [lo, hi] (both inclusive),
// then that position and value are read back (one small sync). *pos = -1
// when every value is in range.
static tpr_status first_bad_index(tpr_cuda_ctx *c, const char *op, const tpr_tensor *ids, int64_t lo, int64_t hi,
                                  int64_t *pos, int64_t *val) {
  *pos = -1, *val = 0;
  if (ids->dtype != TPR_I32 && ids->dtype != TPR_I64)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s (cuda): indices are %s, expected i32 or i64", op, tpr_dtype_name(ids->dtype));
  const int64_t n = tpr_tensor_numel(ids);
  if (n == 0) return TPR_OK;
  tpr__cuda_scratch res(c);
  TPR_CHECK(res.alloc(2 * sizeof(int64_t)));
  first_bad_kernel<<<1, CHECK_THREADS, 0, c->stream>>>(tpr_tensor_data(ids), ids->dtype == TPR_I64,
                                                       tpr__cuda_tensor_desc(ids), n, lo, hi, (int64_t *)res.p);
  TPR_CUDA_LAUNCHED(op, "index check");
  int64_t h[2];
  TPR_CHECK(tpr__cuda_read(c, op, h, res.p, sizeof h));
  *pos = h[0], *val = h[1];
  return TPR_OK;
}

// The CPU's messages for an index outside [0, limit) (limit < 0: no upper bound).
static tpr_status check_ids(tpr_cuda_ctx *c, const char *op, const char *what, const tpr_tensor *ids, int64_t limit) {
  int64_t pos, v;
  TPR_CHECK(first_bad_index(c, op, ids, 0, limit < 0 ? INT64_MAX : limit - 1, &pos, &v));
  if (pos < 0) return TPR_OK;
  if (v < 0 && limit < 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: %s %lld at position %lld is negative", op, what, (long long)v,
                    (long long)pos);
  return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s: %s %lld at position %lld is out of range [0, %lld)", op, what,
                  (long long)v, (long long)pos, (long long)limit);
}

static tpr_status need_ids(const char *op, const tpr_tensor *ids) {
  if (ids->dtype != TPR_I32 && ids->dtype != TPR_I64)
    return TPR_FAIL(TPR_ERR_DTYPE, "%s (cuda): ids are %s, expected i32 or i64", op, tpr_dtype_name(ids->dtype));
  return TPR_OK;
}

// What an embedding row read needs: ids (any shape, strided), the table's
// strides, and for a shard the run-time shard index.
struct embed_args {
  const void *ids;
  bool ids64;
  tpr__cuda_desc idd;
  int64_t ts0, ts1, V, H;
  const void *shard;  // NULL: plain embedding; else (1) i32/i64
  bool shard64;
};

// out (n, H) contiguous: row p is table[ids[p] - shard*V] (zeros when that
// lies outside [0, V), shard only), element by element.
template <typename E>
static __global__ void embed_kernel(E *o, const E *table, embed_args a, int64_t total) {
  int64_t lo = 0;
  bool none = false;
  if (a.shard) {  // ids and shard were checked >= 0
    const int64_t sh = tpr__cuda_load_index(a.shard, a.shard64, 0);
    none = a.V == 0 || sh > INT64_MAX / a.V;  // a shard*V past INT64_MAX owns no id
    lo = none ? 0 : sh * a.V;
  }
  TPR_CUDA_GRID_STRIDE(i, total) {
    const int64_t p = i / a.H, j = i % a.H;
    const int64_t id = tpr__cuda_load_index(a.ids, a.ids64, tpr__cuda_offset(a.idd, p));
    if (a.shard && (none || id < lo || id - lo >= a.V)) {
      o[i] = 0;  // all-zero bits are 0 in every dtype
      continue;
    }
    const int64_t row = id - lo;
    o[i] = (row >= 0 && row < a.V) ? table[row * a.ts0 + j * a.ts1] : (E)0;  // in range after the check
  }
}

static tpr_status launch_embed(tpr_cuda_ctx *c, const char *op, const tpr_tensor *table, const embed_args &a,
                               tpr_tensor *out) {
  const int64_t total = tpr_tensor_numel(out);
  if (total == 0) return TPR_OK;
  const int th = 256;
  const unsigned nb = tpr__cuda_blocks(total, th);
  void *o = tpr_tensor_data(out);
  const void *t = tpr_tensor_data(table);
  const bool ok = tpr__cuda_by_size(tpr_dtype_size(table->dtype), [&](auto e) {
    using E = decltype(e);
    embed_kernel<<<nb, th, 0, c->stream>>>((E *)o, (const E *)t, a, total);
  });
  if (!ok) return TPR_FAIL(TPR_ERR_DTYPE, "%s (cuda): no kernel for %s tables", op, tpr_dtype_name(table->dtype));
  TPR_CUDA_LAUNCHED(op, "gather kernel");
  return TPR_OK;
}

static embed_args make_embed_args(const tpr_tensor *table, const tpr_tensor *ids) {
  embed_args a = {};
  a.ids = tpr_tensor_data(ids);
  a.ids64 = ids->dtype == TPR_I64;
  a.idd = tpr__cuda_tensor_desc(ids);
  a.ts0 = table->stride[0], a.ts1 = table->stride[1];
  a.V = table->shape[0], a.H = table->shape[1];
  return a;
}

// table (V, H), ids (...) i32/i64; out (..., H) contiguous, table's dtype.
TPR_CUDA_KERNEL(embedding) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "embedding (cuda): expected 2 inputs, got %d", n_in);
  const tpr_tensor *table = in[0], *ids = in[1];
  TPR_CHECK(need_ids("embedding", ids));
  if (out->dtype != table->dtype)
    return TPR_FAIL(TPR_ERR_DTYPE, "embedding (cuda): out is %s but the table is %s", tpr_dtype_name(out->dtype),
                    tpr_dtype_name(table->dtype));
  if (table->ndim != 2 || out->ndim != ids->ndim + 1 || out->shape[ids->ndim] != table->shape[1])
    return TPR_FAIL(TPR_ERR_SHAPE, "embedding (cuda): table, ids and out shapes do not fit");
  if (tpr_tensor_numel(ids) == 0) return TPR_OK;
  TPR_CUDA_TRY(cudaSetDevice(c->device), "embedding", "set device");
  TPR_CHECK(check_ids(c, "embedding", "token id", ids, table->shape[0]));
  return launch_embed(c, "embedding", table, make_embed_args(table, ids), out);
}

// table (Vl, H), ids (...) i32/i64, shard (1) i32/i64; out (..., H)
// contiguous, table's dtype. Row id - shard*Vl, or zeros outside [0, Vl).
TPR_CUDA_KERNEL(embedding_shard) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 3) return TPR_FAIL(TPR_ERR_INVALID_ARG, "embedding_shard (cuda): expected 3 inputs, got %d", n_in);
  const tpr_tensor *table = in[0], *ids = in[1], *shard = in[2];
  TPR_CHECK(need_ids("embedding_shard", ids));
  TPR_CHECK(need_ids("embedding_shard", shard));
  if (out->dtype != table->dtype)
    return TPR_FAIL(TPR_ERR_DTYPE, "embedding_shard (cuda): out is %s but the table is %s",
                    tpr_dtype_name(out->dtype), tpr_dtype_name(table->dtype));
  if (table->ndim != 2 || out->ndim != ids->ndim + 1 || out->shape[ids->ndim] != table->shape[1] ||
      tpr_tensor_numel(shard) != 1)
    return TPR_FAIL(TPR_ERR_SHAPE, "embedding_shard (cuda): table, ids, shard and out shapes do not fit");
  TPR_CUDA_TRY(cudaSetDevice(c->device), "embedding_shard", "set device");
  TPR_CHECK(check_ids(c, "embedding_shard", "shard index", shard, -1));  // the shard first, as on the CPU
  if (tpr_tensor_numel(ids) == 0) return TPR_OK;
  TPR_CHECK(check_ids(c, "embedding_shard", "token id", ids, -1));
  embed_args a = make_embed_args(table, ids);
  a.shard = tpr_tensor_data(shard);
  a.shard64 = shard->dtype == TPR_I64;
  return launch_embed(c, "embedding_shard", table, a, out);
}

// out (contiguous, x's shape with dim -> n) from x: the coordinate along dim
// is replaced by index[j].
template <typename E>
static __global__ void index_select_kernel(E *o, tpr__cuda_desc od, const E *x, tpr__cuda_desc xd, int dim,
                                           const void *index, bool idx64, int64_t istride, int64_t total) {
  TPR_CUDA_GRID_STRIDE(i, total) {
    int64_t rem = i, off = 0;
    for (int k = od.ndim - 1; k >= 0; k--) {
      const int64_t coord = rem % od.shape[k];
      rem /= od.shape[k];
      const int64_t xc = k == dim ? tpr__cuda_load_index(index, idx64, coord * istride) : coord;
      off += xc * xd.stride[k];
    }
    o[i] = x[off];
  }
}

// x (..., X_dim, ...), index (n) i32/i64; out (..., n, ...) contiguous.
TPR_CUDA_KERNEL(index_select) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  if (n_in != 2) return TPR_FAIL(TPR_ERR_INVALID_ARG, "index_select (cuda): expected 2 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *index = in[1];
  TPR_CHECK(need_ids("index_select", index));
  if (!attrs || attrs->n_i < 1) return TPR_FAIL(TPR_ERR_INVALID_ARG, "index_select (cuda): missing dim attribute i[0]");
  int dim = (int)attrs->i[0];
  if (dim < 0) dim += x->ndim;
  if (dim < 0 || dim >= x->ndim)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "index_select (cuda): dim %lld out of range for %d-d x",
                    (long long)attrs->i[0], x->ndim);
  if (out->dtype != x->dtype)
    return TPR_FAIL(TPR_ERR_DTYPE, "index_select (cuda): out is %s but x is %s", tpr_dtype_name(out->dtype),
                    tpr_dtype_name(x->dtype));
  if (index->ndim != 1 || out->ndim != x->ndim || out->shape[dim] != index->shape[0])
    return TPR_FAIL(TPR_ERR_SHAPE, "index_select (cuda): x, index and out shapes do not fit");
  for (int d = 0; d < x->ndim; d++)
    if (d != dim && out->shape[d] != x->shape[d])
      return TPR_FAIL(TPR_ERR_SHAPE, "index_select (cuda): x, index and out shapes do not fit");
  const int64_t total = tpr_tensor_numel(out);
  if (index->shape[0] == 0 || total == 0) return TPR_OK;
  TPR_CUDA_TRY(cudaSetDevice(c->device), "index_select", "set device");
  TPR_CHECK(check_ids(c, "index_select", "index", index, x->shape[dim]));
  const tpr__cuda_desc od = tpr__cuda_tensor_desc(out), xd = tpr__cuda_tensor_desc(x);
  const void *idx = tpr_tensor_data(index);
  const bool i64 = index->dtype == TPR_I64;
  const int64_t is = index->stride[0];
  const int th = 256;
  const unsigned nb = tpr__cuda_blocks(total, th);
  void *o = tpr_tensor_data(out);
  const void *xp = tpr_tensor_data(x);
  const bool ok = tpr__cuda_by_size(tpr_dtype_size(x->dtype), [&](auto e) {
    using E = decltype(e);
    index_select_kernel<<<nb, th, 0, c->stream>>>((E *)o, od, (const E *)xp, xd, dim, idx, i64, is, total);
  });
  if (!ok) return TPR_FAIL(TPR_ERR_DTYPE, "index_select (cuda): no kernel for %s", tpr_dtype_name(x->dtype));
  TPR_CUDA_LAUNCHED("index_select", "index_select kernel");
  return TPR_OK;
}

const tpr__kernel_def tpr__gather_cuda[] = {
    {TPR_OP_EMBEDDING, cuda_embedding},
    {TPR_OP_EMBEDDING_SHARD, cuda_embedding_shard},
    {TPR_OP_INDEX_SELECT, cuda_index_select},
    {},
};
