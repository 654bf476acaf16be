// The eager API's typed wrappers over tpr_op_run (ops.h): each packs its
// arguments into the op's inputs and attributes, nothing more.
#include "runtime/ops.h"

#define RUN2(op, a, b, at) tpr_op_run(be, op, (const tpr_tensor *const[]){a, b}, 2, at, out)

tpr_status tpr_matmul(tpr_backend *be, const tpr_tensor *a, const tpr_tensor *b, bool trans_a, bool trans_b,
                      tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 2, .i = {trans_a, trans_b}};
  return RUN2(TPR_OP_MATMUL, a, b, &at);
}

tpr_status tpr_add(tpr_backend *be, const tpr_tensor *a, const tpr_tensor *b, tpr_tensor *out) {
  return RUN2(TPR_OP_ADD, a, b, NULL);
}

tpr_status tpr_mul(tpr_backend *be, const tpr_tensor *a, const tpr_tensor *b, tpr_tensor *out) {
  return RUN2(TPR_OP_MUL, a, b, NULL);
}

tpr_status tpr_rms_norm(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *weight, float eps, tpr_tensor *out) {
  tpr_op_attrs at = {.n_f = 1, .f = {eps}};
  return RUN2(TPR_OP_RMS_NORM, x, weight, &at);
}

tpr_status tpr_swiglu(tpr_backend *be, const tpr_tensor *gate, const tpr_tensor *up, tpr_tensor *out) {
  return RUN2(TPR_OP_SWIGLU, gate, up, NULL);
}

tpr_status tpr_softmax(tpr_backend *be, const tpr_tensor *x, tpr_tensor *out) {
  return tpr_op_run(be, TPR_OP_SOFTMAX, (const tpr_tensor *const[]){x}, 1, NULL, out);
}

tpr_status tpr_embedding(tpr_backend *be, const tpr_tensor *table, const tpr_tensor *ids, tpr_tensor *out) {
  return RUN2(TPR_OP_EMBEDDING, table, ids, NULL);
}

tpr_status tpr_index_select(tpr_backend *be, const tpr_tensor *x, int dim, const tpr_tensor *index, tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {dim}};
  return RUN2(TPR_OP_INDEX_SELECT, x, index, &at);
}

tpr_status tpr_cast(tpr_backend *be, const tpr_tensor *x, tpr_tensor *out) {
  if (!out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "cast: NULL output");
  tpr_op_attrs at = {.n_i = 1, .i = {out->dtype}};
  return tpr_op_run(be, TPR_OP_CAST, (const tpr_tensor *const[]){x}, 1, &at, out);
}

#define RUN3(op, a, b, c, at) tpr_op_run(be, op, (const tpr_tensor *const[]){a, b, c}, 3, at, out)
#define RUN4(op, a, b, c, d, at) tpr_op_run(be, op, (const tpr_tensor *const[]){a, b, c, d}, 4, at, out)

tpr_status tpr_sum_squares(tpr_backend *be, const tpr_tensor *x, tpr_tensor *out) {
  return tpr_op_run(be, TPR_OP_SUM_SQUARES, (const tpr_tensor *const[]){x}, 1, NULL, out);
}

tpr_status tpr_rms_scale(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *sumsq, const tpr_tensor *weight,
                         float divisor, float eps, tpr_tensor *out) {
  tpr_op_attrs at = {.n_f = 2, .f = {divisor, eps}};
  return RUN3(TPR_OP_RMS_SCALE, x, sumsq, weight, &at);
}

tpr_status tpr_embedding_shard(tpr_backend *be, const tpr_tensor *table, const tpr_tensor *ids,
                               const tpr_tensor *shard, tpr_tensor *out) {
  return RUN3(TPR_OP_EMBEDDING_SHARD, table, ids, shard, NULL);
}

tpr_status tpr_rope(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *positions, int64_t rotary_dim,
                    float theta, tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {rotary_dim}, .n_f = 1, .f = {theta}};
  return RUN2(TPR_OP_ROPE, x, positions, &at);
}

tpr_status tpr_attention(tpr_backend *be, const tpr_tensor *q, const tpr_tensor *k_cache, const tpr_tensor *v_cache,
                         const tpr_tensor *start, float scale, tpr_tensor *out) {
  tpr_op_attrs at = {.n_f = 1, .f = {scale}};
  return RUN4(TPR_OP_ATTENTION, q, k_cache, v_cache, start, &at);
}

tpr_status tpr_attention_docs(tpr_backend *be, const tpr_tensor *q, const tpr_tensor *k_cache,
                              const tpr_tensor *v_cache, const tpr_tensor *start, const tpr_tensor *lo, float scale,
                              tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {1}, .n_f = 1, .f = {scale}};
  return tpr_op_run(be, TPR_OP_ATTENTION, (const tpr_tensor *const[]){q, k_cache, v_cache, start, lo}, 5, &at, out);
}

tpr_status tpr_cache_write(tpr_backend *be, tpr_tensor *cache, const tpr_tensor *new_rows, const tpr_tensor *start,
                           tpr_tensor *out) {
  return RUN3(TPR_OP_CACHE_WRITE, cache, new_rows, start, NULL);
}

tpr_status tpr_router_sigmoid_topk(tpr_backend *be, const tpr_tensor *logits, const tpr_tensor *bias, int k,
                                   tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {k}};
  return RUN2(TPR_OP_ROUTER_SIGMOID_TOPK, logits, bias, &at);
}

tpr_status tpr_moe_experts(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *gates, const tpr_tensor *w13,
                           const tpr_tensor *w2, tpr_tensor *out) {
  return RUN4(TPR_OP_MOE_EXPERTS, x, gates, w13, w2, NULL);
}

// ---- Eager wrappers.
#define RUN(op, at, n, ...) tpr_op_run(be, op, (const tpr_tensor *const[]){__VA_ARGS__}, n, at, out)

tpr_status tpr_moe_capacity(tpr_backend *be, const tpr_tensor *gates, int64_t top_k, float factor, bool reroute,
                            uint64_t seed, tpr_tensor *out) {
  // The seed travels as an int64 attribute; the kernel reads the bits back.
  tpr_op_attrs at = {.n_i = 3, .i = {top_k, reroute, (int64_t)seed}, .n_f = 1, .f = {factor}};
  return RUN(TPR_OP_MOE_CAPACITY, &at, 1, gates);
}

tpr_status tpr_row_slice(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *part, int64_t n, tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {n}};
  return RUN(TPR_OP_ROW_SLICE, &at, 2, x, part);
}

tpr_status tpr_moe_counts(tpr_backend *be, const tpr_tensor *gates, tpr_tensor *out) {
  return RUN(TPR_OP_MOE_COUNTS, NULL, 1, gates);
}

tpr_status tpr_moe_permute(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *gates, tpr_tensor *out) {
  if (!out) return TPR_FAIL(TPR_ERR_INVALID_ARG, "moe_permute: NULL output");
  // R is out's row count; a non-2-D out fails the shape comparison in tpr_op_run.
  tpr_op_attrs at = {.n_i = 1, .i = {out->ndim > 0 ? out->shape[0] : 0}};
  return RUN(TPR_OP_MOE_PERMUTE, &at, 2, x, gates);
}

tpr_status tpr_moe_grouped_ffn(tpr_backend *be, const tpr_tensor *x, const tpr_tensor *counts, const tpr_tensor *w13,
                               const tpr_tensor *w2, tpr_tensor *out) {
  return RUN(TPR_OP_MOE_GROUPED_FFN, NULL, 4, x, counts, w13, w2);
}

tpr_status tpr_moe_unpermute(tpr_backend *be, const tpr_tensor *y, const tpr_tensor *gates, tpr_tensor *out) {
  return RUN(TPR_OP_MOE_UNPERMUTE, NULL, 2, y, gates);
}

tpr_status tpr_lightning_attention(tpr_backend *be, const tpr_tensor *q, const tpr_tensor *k, const tpr_tensor *v,
                                   const tpr_tensor *state, const tpr_tensor *slopes, int64_t block_size,
                                   tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {block_size}};
  return tpr_op_run(be, TPR_OP_LIGHTNING_ATTENTION, (const tpr_tensor *const[]){q, k, v, state, slopes}, 5, &at, out);
}
tpr_status tpr_lightning_attention_docs(tpr_backend *be, const tpr_tensor *q, const tpr_tensor *k,
                                        const tpr_tensor *v, const tpr_tensor *state, const tpr_tensor *slopes,
                                        const tpr_tensor *lo, int64_t block_size, tpr_tensor *out) {
  tpr_op_attrs at = {.n_i = 2, .i = {block_size, 1}};
  return tpr_op_run(be, TPR_OP_LIGHTNING_ATTENTION, (const tpr_tensor *const[]){q, k, v, state, slopes, lo}, 6, &at,
                    out);
}

tpr_status tpr_lightning_decode(tpr_backend *be, const tpr_tensor *q, const tpr_tensor *k, const tpr_tensor *v,
                                const tpr_tensor *state, const tpr_tensor *slopes, tpr_tensor *out) {
  return tpr_op_run(be, TPR_OP_LIGHTNING_DECODE, (const tpr_tensor *const[]){q, k, v, state, slopes}, 5, NULL, out);
}
