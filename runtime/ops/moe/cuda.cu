// MoE experts CUDA kernel (cpu.c's twin): SwiGLU experts combined with dense
// gate weights, as a grouped GEMM.
//
// The routing is found on device: one thread per expert walks the tokens in
// ascending order and lists those whose gate is nonzero (list e at idx[e*T]),
// with its count. The E counts are read back (one small sync: the host needs
// them to size each expert's GEMMs). Then, expert by expert in ascending
// order, all on the stream: gather the expert's token rows into X_e (n, H);
// cuBLAS X_e @ w13[e]^T -> (n, 2F) = [w1 x | w3 x]; act = silu(w1 x) * (w3 x)
// with silu(g) = g / (1 + expf(-g)) (torch's formula, as cpu.c); cuBLAS act @
// w2[e]^T -> (n, H); out[t] += gate * y. An expert's tokens are distinct and
// the experts run one after another, so every out element receives its
// contributions in ascending expert order, as on the CPU: deterministic, no
// atomics. Weights are read in place when row- or column-major (matmul/cpu.c's
// rule) and copied to contiguous scratch otherwise.
#include <math.h>
#include <vector>

#include "runtime/ops/cuda_kernels.h"

// gates (T, E) strides (gs0, gs1): idx (E, T) lists, counts (E).
static __global__ void route_kernel(const float *g, int64_t gs0, int64_t gs1, int64_t T, int64_t E, int32_t *idx,
                                    int32_t *counts) {
  TPR_CUDA_GRID_STRIDE(e, E) {
    int32_t n = 0;
    for (int64_t t = 0; t < T; t++)
      if (g[t * gs0 + e * gs1] != 0.0f) idx[e * T + n++] = (int32_t)t;  // NaN counts as nonzero, as on the CPU
    counts[e] = n;
  }
}

// xe (n, H) contiguous = x[rows[i]] (x strides xs0, xs1).
static __global__ void gather_rows_kernel(float *xe, const float *x, int64_t xs0, int64_t xs1, const int32_t *rows,
                                          int64_t n, int64_t H) {
  TPR_CUDA_GRID_STRIDE(i, n * H) {
    const int64_t r = i / H, j = i % H;
    xe[i] = x[rows[r] * xs0 + j * xs1];
  }
}

// act (n, F) = silu(gu[:, :F]) * gu[:, F:], gu (n, 2F).
static __global__ void silu_mul_kernel(float *act, const float *gu, int64_t n, int64_t F) {
  TPR_CUDA_GRID_STRIDE(i, n * F) {
    const int64_t r = i / F, f = i % F;
    const float g = gu[r * 2 * F + f], u = gu[r * 2 * F + F + f];
    act[i] = g / (1.0f + expf(-g)) * u;
  }
}

// out[rows[i], :] += gates[rows[i], e] * y[i, :]; rows distinct.
static __global__ void scatter_add_kernel(float *o, const float *y, const int32_t *rows, const float *g, int64_t gs0,
                                          int64_t gs1, int64_t e, int64_t n, int64_t H) {
  TPR_CUDA_GRID_STRIDE(i, n * H) {
    const int64_t r = i / H, j = i % H, t = rows[r];
    const float gate = g[t * gs0 + e * gs1];
    o[t * H + j] = __fadd_rn(o[t * H + j], __fmul_rn(gate, y[i]));  // o + gate * y, rounded twice as on the CPU
  }
}

// Expert e's (r, c) matrix of w (E, r, c), used transposed as sgemm's B
// operand: its pointer and layout, copied into row-major scratch when
// neither of its strides is unit.
static tpr_status expert_weight(tpr_cuda_ctx *c, const tpr_tensor *w, int64_t e, float *scratch, const float **m,
                                tpr__cuda_operand *l) {
  const int64_t r = w->shape[1], cc = w->shape[2];
  *m = (const float *)tpr_tensor_data(w) + e * w->stride[0];
  *l = tpr__cuda_layout(r, cc, w->stride[1], w->stride[2], true);
  if (!l->copy) return TPR_OK;
  const int64_t shape[2] = {r, cc}, cs[2] = {cc, 1};
  TPR_CHECK(tpr__cuda_strided_copy(c, "moe_experts", scratch, cs, *m, w->stride + 1, 2, shape, sizeof(float)));
  *m = scratch;
  *l = tpr__cuda_layout(r, cc, cc, 1, true);
  return TPR_OK;
}

// x (T, H), gates (T, E), w13 (E, 2F, H), w2 (E, H, F); out (T, H) contiguous.
TPR_CUDA_KERNEL(moe_experts) {
  tpr_cuda_ctx *c = (tpr_cuda_ctx *)ctx;
  const char *op = "moe_experts";
  if (n_in != 4) return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_experts (cuda): expected 4 inputs, got %d", n_in);
  const tpr_tensor *x = in[0], *g = in[1], *w13 = in[2], *w2 = in[3];
  if (x->dtype != TPR_F32 || g->dtype != TPR_F32 || w13->dtype != TPR_F32 || w2->dtype != TPR_F32 ||
      out->dtype != TPR_F32)
    return TPR_FAIL(TPR_ERR_DTYPE, "moe_experts (cuda): x %s, gates %s, w13 %s, w2 %s, out %s; only f32 is supported",
                    tpr_dtype_name(x->dtype), tpr_dtype_name(g->dtype), tpr_dtype_name(w13->dtype),
                    tpr_dtype_name(w2->dtype), tpr_dtype_name(out->dtype));
  if (x->ndim != 2 || g->ndim != 2 || w13->ndim != 3 || w2->ndim != 3 || !tpr_tensor_same_shape(x, out))
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_experts (cuda): x, gates, w13, w2 and out shapes do not fit");
  const int64_t T = x->shape[0], H = x->shape[1], E = g->shape[1], F2 = w13->shape[1], F = F2 / 2;
  if (g->shape[0] != T || w13->shape[0] != E || w13->shape[2] != H || F2 % 2 || w2->shape[0] != E ||
      w2->shape[1] != H || w2->shape[2] != F)
    return TPR_FAIL(TPR_ERR_SHAPE, "moe_experts (cuda): x, gates, w13, w2 and out shapes do not fit");
  float *o = (float *)tpr_tensor_data(out);
  if (T == 0 || H == 0) return TPR_OK;
  if (T > INT32_MAX) return TPR_FAIL(TPR_ERR_UNSUPPORTED, "moe_experts (cuda): %lld tokens exceed i32", (long long)T);
  TPR_CUDA_TRY(cudaSetDevice(c->device), op, "set device");
  TPR_CUDA_TRY(cudaMemsetAsync(o, 0, tpr_tensor_nbytes(out), c->stream), op, "zero output");
  if (F == 0 || E == 0) return TPR_OK;  // every expert output is an empty sum

  // Scratch: token lists (E, T) and counts (E); X_e (T, H), [w1 x | w3 x]
  // (T, 2F), act (T, F), y (T, H), and one expert weight matrix when a
  // weight needs a copy.
  tpr__cuda_scratch lists(c), bufs(c);
  TPR_CHECK(lists.alloc((size_t)(E * T + E) * sizeof(int32_t)));
  int32_t *idx = (int32_t *)lists.p, *counts = idx + E * T;
  const float *gd = (const float *)tpr_tensor_data(g);
  const int64_t gs0 = g->stride[0], gs1 = g->stride[1];
  route_kernel<<<tpr__cuda_blocks(E, 128), 128, 0, c->stream>>>(gd, gs0, gs1, T, E, idx, counts);
  TPR_CUDA_LAUNCHED(op, "route kernel");
  std::vector<int32_t> n_tok((size_t)E);
  TPR_CHECK(tpr__cuda_read(c, op, n_tok.data(), counts, (size_t)E * sizeof(int32_t)));

  const int64_t wmax = F2 * H > H * F ? F2 * H : H * F;
  TPR_CHECK(bufs.alloc((size_t)(2 * T * H + T * F2 + T * F + wmax) * sizeof(float)));
  float *xe = (float *)bufs.p, *gu = xe + T * H, *act = gu + T * F2, *y = act + T * F, *wbuf = y + T * H;
  const float *xd = (const float *)tpr_tensor_data(x);
  const int th = 256;
  for (int64_t e = 0; e < E; e++) {
    const int64_t n = n_tok[(size_t)e];
    if (n == 0) continue;
    const int32_t *rows = idx + e * T;
    gather_rows_kernel<<<tpr__cuda_blocks(n * H, th), th, 0, c->stream>>>(xe, xd, x->stride[0], x->stride[1], rows, n,
                                                                          H);
    TPR_CUDA_LAUNCHED(op, "gather rows");
    const float *w;
    tpr__cuda_operand l;
    TPR_CHECK(expert_weight(c, w13, e, wbuf, &w, &l));
    TPR_CHECK(tpr__cuda_sgemm(c, op, false, l.trans, n, F2, H, xe, H, 0, w, l.ld, 0, gu, F2, 0, 1));
    silu_mul_kernel<<<tpr__cuda_blocks(n * F, th), th, 0, c->stream>>>(act, gu, n, F);
    TPR_CUDA_LAUNCHED(op, "silu");
    // Stream order: the w13 GEMM has read wbuf before this copy overwrites it.
    TPR_CHECK(expert_weight(c, w2, e, wbuf, &w, &l));
    TPR_CHECK(tpr__cuda_sgemm(c, op, false, l.trans, n, H, F, act, F, 0, w, l.ld, 0, y, H, 0, 1));
    scatter_add_kernel<<<tpr__cuda_blocks(n * H, th), th, 0, c->stream>>>(o, y, rows, gd, gs0, gs1, e, n, H);
    TPR_CUDA_LAUNCHED(op, "scatter add");
  }
  return TPR_OK;
}

const tpr__kernel_def tpr__moe_cuda[] = {
    {TPR_OP_MOE_EXPERTS, cuda_moe_experts},
    {},
};
