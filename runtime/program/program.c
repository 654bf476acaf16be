// Building programs: values, nodes and the builder shorthands.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program_impl.h"

tpr_status tpr_program_new(tpr_program **out) {
  *out = calloc(1, sizeof **out);
  return *out ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "program");
}

void tpr_program_free(tpr_program *p) {
  if (!p) return;
  for (int i = 0; i < p->n_values; i++) free(p->values[i].name);
  free(p->values);
  free(p->nodes);
  free(p);
}

tpr_value_id tpr__program_find(const tpr_program *p, const char *name) {
  for (int i = 0; i < p->n_values; i++)
    if (p->values[i].name && strcmp(p->values[i].name, name) == 0) return i;
  return -1;
}

static tpr_status check_name(const tpr_program *p, const char *name) {
  if (!name || !*name) return TPR_FAIL(TPR_ERR_INVALID_ARG, "program: empty value name");
  if (tpr__program_find(p, name) >= 0)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "program: name '%s' is already used", name);
  return TPR_OK;
}

static tpr_status grow(void **arr, int *cap, int need, size_t elem) {
  if (need <= *cap) return TPR_OK;
  int ncap = *cap ? *cap * 2 : 16;
  while (ncap < need) ncap *= 2;
  void *n = realloc(*arr, (size_t)ncap * elem);
  if (!n) return TPR_FAIL(TPR_ERR_OOM, "program growth");
  *arr = n;
  *cap = ncap;
  return TPR_OK;
}

static tpr_status add_value(tpr_program *p, const tpr_value_rec *rec, tpr_value_id *out) {
  TPR_CHECK(grow((void **)&p->values, &p->cap_values, p->n_values + 1, sizeof *p->values));
  p->values[p->n_values] = *rec;
  *out = p->n_values++;
  return TPR_OK;
}

static tpr_status add_named(tpr_program *p, tpr_value_kind kind, const char *name, tpr_dtype dtype, int ndim,
                            const int64_t *shape, tpr_value_id *out) {
  TPR_CHECK(check_name(p, name));
  if (!tpr_dtype_valid(dtype)) return TPR_FAIL(TPR_ERR_DTYPE, "program: '%s' has invalid dtype %d", name, (int)dtype);
  TPR_CHECK(tpr_shape_check(ndim, shape));
  tpr_value_rec rec = {.kind = kind, .producer = -1, .base = p->n_values};
  rec.desc.dtype = dtype;
  rec.desc.ndim = ndim;
  if (ndim > 0) memcpy(rec.desc.shape, shape, (size_t)ndim * sizeof *shape);
  tpr_shape_contiguous_strides(ndim, shape, rec.desc.stride);
  rec.name = strdup(name);
  if (!rec.name) return TPR_FAIL(TPR_ERR_OOM, "program name");
  tpr_status rc = add_value(p, &rec, out);
  if (rc != TPR_OK) free(rec.name);
  return rc;
}

tpr_status tpr_program_input(tpr_program *p, const char *name, tpr_dtype dtype, int ndim, const int64_t *shape,
                             tpr_value_id *out) {
  return add_named(p, TPR_VALUE_INPUT, name, dtype, ndim, shape, out);
}

tpr_status tpr_program_param(tpr_program *p, const char *name, tpr_dtype dtype, int ndim, const int64_t *shape,
                             tpr_value_id *out) {
  return add_named(p, TPR_VALUE_PARAM, name, dtype, ndim, shape, out);
}

tpr_status tpr_program_op(tpr_program *p, tpr_op_kind op, const tpr_value_id *in, int n_in,
                          const tpr_op_attrs *attrs, tpr_value_id *out) {
  static const tpr_op_attrs no_attrs;
  if (!attrs) attrs = &no_attrs;
  if (n_in < 0 || n_in > TPR_OP_MAX_INPUTS)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "program: %s with %d inputs", tpr_op_name(op), n_in);
  const tpr_tensor *descs[TPR_OP_MAX_INPUTS];
  for (int i = 0; i < n_in; i++) {
    if (in[i] < 0 || in[i] >= p->n_values)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "program: %s input %d refers to unknown value %d", tpr_op_name(op), i, in[i]);
    descs[i] = &p->values[in[i]].desc;
  }
  tpr_value_rec rec = {.kind = TPR_VALUE_NODE, .producer = p->n_nodes, .base = p->n_values};
  TPR_CHECK(tpr__op_infer(op, descs, n_in, attrs, &rec.desc));
  // Shape rules multiply and add input dims: a result past the element bound
  // (bytes from outside, a bad build) is refused before anything is sized by it.
  if (tpr_shape_check(rec.desc.ndim, rec.desc.shape) != TPR_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", tpr_last_error());
    return TPR_FAIL(TPR_ERR_SHAPE, "program: %s result: %s", tpr_op_name(op), why);
  }
  rec.desc.storage = NULL;
  // A view lives in its input's memory; its offset stays relative to that base.
  if (tpr_op_is_view(op)) rec.base = p->values[in[0]].base;
  rec.remat = op == TPR_OP_PARAM_GATHER ? attrs->i[4] != 0 : n_in > 0 && p->values[in[0]].remat && tpr__op_cheap(op);
  TPR_CHECK(grow((void **)&p->nodes, &p->cap_nodes, p->n_nodes + 1, sizeof *p->nodes));
  tpr_node node = {.op = op, .n_in = n_in, .attrs = *attrs};
  memcpy(node.in, in, (size_t)n_in * sizeof *in);
  TPR_CHECK(add_value(p, &rec, &node.out));
  p->nodes[p->n_nodes++] = node;
  *out = node.out;
  return TPR_OK;
}

tpr_status tpr_program_output(tpr_program *p, tpr_value_id v, const char *name) {
  if (v < 0 || v >= p->n_values) return TPR_FAIL(TPR_ERR_INVALID_ARG, "program: output of unknown value %d", v);
  tpr_value_rec *rec = &p->values[v];
  if (rec->kind != TPR_VALUE_NODE)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "program: output '%s' must be produced by an op", name ? name : "");
  if (rec->is_output || rec->name) return TPR_FAIL(TPR_ERR_INVALID_ARG, "program: value %d is already an output", v);
  TPR_CHECK(check_name(p, name));
  rec->name = strdup(name);
  if (!rec->name) return TPR_FAIL(TPR_ERR_OOM, "program name");
  rec->is_output = true;
  return TPR_OK;
}

int tpr_program_num_values(const tpr_program *p) { return p->n_values; }
int tpr_program_num_nodes(const tpr_program *p) { return p->n_nodes; }
tpr_op_kind tpr_program_node_op(const tpr_program *p, int n) {
  return n >= 0 && n < p->n_nodes ? p->nodes[n].op : TPR_OP_KIND_COUNT;
}

int tpr_program_value_kind(const tpr_program *p, tpr_value_id v) {
  return v >= 0 && v < p->n_values ? (int)p->values[v].kind : -1;
}

const char *tpr_program_value_name(const tpr_program *p, tpr_value_id v) {
  return v >= 0 && v < p->n_values ? p->values[v].name : NULL;
}

tpr_status tpr_program_node_io(const tpr_program *p, int n, const tpr_value_id **in, int *n_in, tpr_value_id *out) {
  if (n < 0 || n >= p->n_nodes) return TPR_FAIL(TPR_ERR_INVALID_ARG, "program: unknown node %d", n);
  *in = p->nodes[n].in;
  *n_in = p->nodes[n].n_in;
  *out = p->nodes[n].out;
  return TPR_OK;
}

double tpr_program_node_flops(const tpr_program *p, int n) {
  if (n < 0 || n >= p->n_nodes || p->nodes[n].op != TPR_OP_MATMUL) return 0;
  const tpr_node *node = &p->nodes[n];
  const tpr_tensor *a = &p->values[node->in[0]].desc, *o = &p->values[node->out].desc;
  bool ta = node->attrs.n_i > 0 && node->attrs.i[0];
  double k = (double)(ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1]);
  return 2.0 * k * (double)tpr_tensor_numel(o);  // numel(out) = batch * M * N
}

tpr_status tpr_program_value(const tpr_program *p, tpr_value_id v, tpr_tensor *desc) {
  if (v < 0 || v >= p->n_values) return TPR_FAIL(TPR_ERR_INVALID_ARG, "program: unknown value %d", v);
  *desc = p->values[v].desc;
  return TPR_OK;
}

// Shorthands.
#define OP1(kind, x, at) tpr_program_op(p, kind, (const tpr_value_id[]){x}, 1, at, out)
#define OP2(kind, a, b, at) tpr_program_op(p, kind, (const tpr_value_id[]){a, b}, 2, at, out)

tpr_status tpr_pb_matmul(tpr_program *p, tpr_value_id a, tpr_value_id b, bool trans_a, bool trans_b,
                         tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 2, .i = {trans_a, trans_b}};
  return OP2(TPR_OP_MATMUL, a, b, &at);
}
tpr_status tpr_pb_matmul_fp8(tpr_program *p, tpr_value_id a, tpr_value_id w, tpr_value_id scale, int block,
                             tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 3, .i = {0, 1, block}};
  return tpr_program_op(p, TPR_OP_MATMUL, (const tpr_value_id[]){a, w, scale}, 3, &at, out);
}
tpr_status tpr_pb_add(tpr_program *p, tpr_value_id a, tpr_value_id b, tpr_value_id *out) {
  return OP2(TPR_OP_ADD, a, b, NULL);
}
tpr_status tpr_pb_mul(tpr_program *p, tpr_value_id a, tpr_value_id b, tpr_value_id *out) {
  return OP2(TPR_OP_MUL, a, b, NULL);
}
tpr_status tpr_pb_rms_norm(tpr_program *p, tpr_value_id x, tpr_value_id weight, float eps, tpr_value_id *out) {
  tpr_op_attrs at = {.n_f = 1, .f = {eps}};
  return OP2(TPR_OP_RMS_NORM, x, weight, &at);
}
tpr_status tpr_pb_swiglu(tpr_program *p, tpr_value_id gate, tpr_value_id up, tpr_value_id *out) {
  return OP2(TPR_OP_SWIGLU, gate, up, NULL);
}
tpr_status tpr_pb_softmax(tpr_program *p, tpr_value_id x, tpr_value_id *out) { return OP1(TPR_OP_SOFTMAX, x, NULL); }
tpr_status tpr_pb_sigmoid(tpr_program *p, tpr_value_id x, tpr_value_id *out) { return OP1(TPR_OP_SIGMOID, x, NULL); }
tpr_status tpr_pb_embedding(tpr_program *p, tpr_value_id table, tpr_value_id ids, tpr_value_id *out) {
  return OP2(TPR_OP_EMBEDDING, table, ids, NULL);
}
tpr_status tpr_pb_index_select(tpr_program *p, tpr_value_id x, int dim, tpr_value_id index, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {dim}};
  return OP2(TPR_OP_INDEX_SELECT, x, index, &at);
}
tpr_status tpr_pb_cast(tpr_program *p, tpr_value_id x, tpr_dtype dtype, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {dtype}};
  return OP1(TPR_OP_CAST, x, &at);
}
tpr_status tpr_pb_reshape(tpr_program *p, tpr_value_id x, int ndim, const int64_t *shape, tpr_value_id *out) {
  if (ndim < 0 || ndim > TPR_OP_MAX_IATTRS) return TPR_FAIL(TPR_ERR_SHAPE, "reshape: %d dims", ndim);
  tpr_op_attrs at = {.n_i = ndim};
  if (ndim > 0) memcpy(at.i, shape, (size_t)ndim * sizeof *shape);
  return OP1(TPR_OP_RESHAPE, x, &at);
}
tpr_status tpr_pb_permute(tpr_program *p, tpr_value_id x, const int *perm, tpr_value_id *out) {
  if (x < 0 || x >= p->n_values) return TPR_FAIL(TPR_ERR_INVALID_ARG, "permute: unknown value %d", x);
  tpr_op_attrs at = {.n_i = p->values[x].desc.ndim};
  for (int i = 0; i < at.n_i; i++) at.i[i] = perm[i];
  return OP1(TPR_OP_PERMUTE, x, &at);
}
tpr_status tpr_pb_slice(tpr_program *p, tpr_value_id x, int dim, int64_t start, int64_t len, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 3, .i = {dim, start, len}};
  return OP1(TPR_OP_SLICE, x, &at);
}

tpr_status tpr_pb_all_reduce(tpr_program *p, tpr_value_id x, tpr_mesh_axis axis, int n, int red_op,
                             tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 3, .i = {axis, n, red_op}};
  return OP1(TPR_OP_ALL_REDUCE, x, &at);
}
tpr_status tpr_pb_all_gather(tpr_program *p, tpr_value_id x, tpr_mesh_axis axis, int n, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 2, .i = {axis, n}};
  return OP1(TPR_OP_ALL_GATHER, x, &at);
}
tpr_status tpr_pb_param_gather(tpr_program *p, tpr_value_id shard, const tpr_param_gather_opts *o,
                               tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 5, .i = {o->axis, o->n, o->group, o->prefetch, o->reshard}, .n_f = 1,
                     .f = {o->grad_scale}};
  return tpr_program_op(p, TPR_OP_PARAM_GATHER, (const tpr_value_id[]){shard}, 1, &at, out);
}

void tpr__program_gather_issue(const tpr_program *p, int *issue) {
  int prev_first = -1, first = -1;  // first nodes of the previous and the current group
  int64_t group = INT64_MIN;
  for (int n = 0; n < p->n_nodes; n++) {
    const tpr_node *node = &p->nodes[n];
    issue[n] = n;
    if (node->op != TPR_OP_PARAM_GATHER) continue;
    bool eligible = node->attrs.i[3] && node->attrs.i[2] >= 0 && p->values[node->in[0]].kind != TPR_VALUE_NODE;
    if (!eligible || node->attrs.i[2] != group || first < 0) {  // a new group (a lone one if not eligible)
      prev_first = first, first = n;
      group = eligible ? node->attrs.i[2] : INT64_MIN;
    }
    if (eligible && prev_first >= 0) issue[n] = prev_first;
  }
}

bool tpr__op_cheap(tpr_op_kind op) {
  return tpr_op_is_view(op) || op == TPR_OP_INDEX_SELECT || op == TPR_OP_CAST;
}

tpr_status tpr_pb_reduce_scatter(tpr_program *p, tpr_value_id x, tpr_mesh_axis axis, int n, int red_op,
                                 tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 3, .i = {axis, n, red_op}};
  return OP1(TPR_OP_REDUCE_SCATTER, x, &at);
}
tpr_status tpr_pb_all_to_all(tpr_program *p, tpr_value_id x, tpr_mesh_axis axis, int n, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 2, .i = {axis, n}};
  return OP1(TPR_OP_ALL_TO_ALL, x, &at);
}

#define OP3(kind, a, b, c, at) tpr_program_op(p, kind, (const tpr_value_id[]){a, b, c}, 3, at, out)
#define OP4(kind, a, b, c, d, at) tpr_program_op(p, kind, (const tpr_value_id[]){a, b, c, d}, 4, at, out)

tpr_status tpr_pb_sum_squares(tpr_program *p, tpr_value_id x, tpr_value_id *out) {
  return OP1(TPR_OP_SUM_SQUARES, x, NULL);
}
tpr_status tpr_pb_rms_scale(tpr_program *p, tpr_value_id x, tpr_value_id sumsq, tpr_value_id weight, float divisor,
                            float eps, tpr_value_id *out) {
  tpr_op_attrs at = {.n_f = 2, .f = {divisor, eps}};
  return OP3(TPR_OP_RMS_SCALE, x, sumsq, weight, &at);
}
tpr_status tpr_pb_embedding_shard(tpr_program *p, tpr_value_id table, tpr_value_id ids, tpr_value_id shard,
                                  tpr_value_id *out) {
  return OP3(TPR_OP_EMBEDDING_SHARD, table, ids, shard, NULL);
}
tpr_status tpr_pb_rope(tpr_program *p, tpr_value_id x, tpr_value_id positions, int64_t rotary_dim, float theta,
                       tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {rotary_dim}, .n_f = 1, .f = {theta}};
  return OP2(TPR_OP_ROPE, x, positions, &at);
}
tpr_status tpr_pb_rope_ex(tpr_program *p, tpr_value_id x, tpr_value_id positions, const tpr_rope_opts *o,
                          tpr_value_id *out) {
  tpr_op_attrs at = tpr_rope_attrs(o);
  return tpr_program_op(p, TPR_OP_ROPE, (const tpr_value_id[]){x, positions}, 2, &at, out);
}
// The packed (first (n) | second) output of a lightning op as two views
// shaped like `first_like` and `second_like`.
static tpr_status split_packed(tpr_program *p, tpr_value_id packed, tpr_value_id first_like, tpr_value_id second_like,
                               tpr_value_id *first, tpr_value_id *second) {
  tpr_tensor a, b;
  tpr_value_id s;
  TPR_CHECK(tpr_program_value(p, first_like, &a));
  TPR_CHECK(tpr_program_value(p, second_like, &b));
  const int64_t n = tpr_tensor_numel(&a), m = tpr_tensor_numel(&b);
  TPR_CHECK(tpr_pb_slice(p, packed, 0, 0, n, &s));
  TPR_CHECK(tpr_pb_reshape(p, s, a.ndim, a.shape, first));
  TPR_CHECK(tpr_pb_slice(p, packed, 0, n, m, &s));
  return tpr_pb_reshape(p, s, b.ndim, b.shape, second);
}
tpr_status tpr_pb_lightning_attention(tpr_program *p, tpr_value_id q, tpr_value_id k, tpr_value_id v,
                                      tpr_value_id state, tpr_value_id slopes, int64_t block_size, tpr_value_id *o,
                                      tpr_value_id *state_out) {
  tpr_op_attrs at = {.n_i = 1, .i = {block_size}};
  tpr_value_id packed;
  TPR_CHECK(tpr_program_op(p, TPR_OP_LIGHTNING_ATTENTION, (const tpr_value_id[]){q, k, v, state, slopes}, 5, &at,
                           &packed));
  return split_packed(p, packed, q, state, o, state_out);
}
tpr_status tpr_pb_lightning_attention_docs(tpr_program *p, tpr_value_id q, tpr_value_id k, tpr_value_id v,
                                           tpr_value_id state, tpr_value_id slopes, tpr_value_id lo,
                                           int64_t block_size, tpr_value_id *o, tpr_value_id *state_out) {
  tpr_op_attrs at = {.n_i = 2, .i = {block_size, 1}};
  tpr_value_id packed;
  TPR_CHECK(tpr_program_op(p, TPR_OP_LIGHTNING_ATTENTION, (const tpr_value_id[]){q, k, v, state, slopes, lo}, 6,
                           &at, &packed));
  return split_packed(p, packed, q, state, o, state_out);
}
tpr_status tpr_pb_lightning_decode(tpr_program *p, tpr_value_id q, tpr_value_id k, tpr_value_id v,
                                   tpr_value_id state, tpr_value_id slopes, tpr_value_id *o, tpr_value_id *state_out) {
  tpr_value_id packed;
  TPR_CHECK(tpr_program_op(p, TPR_OP_LIGHTNING_DECODE, (const tpr_value_id[]){q, k, v, state, slopes}, 5, NULL,
                           &packed));
  return split_packed(p, packed, q, state, o, state_out);
}
// Writes its pool in place, like paged_cache_write: the exec runs every node
// in program order, so a layer's state is read and written at its op.
tpr_status tpr_pb_lightning_paged(tpr_program *p, tpr_value_id q, tpr_value_id k, tpr_value_id v, tpr_value_id pool,
                                  tpr_value_id slopes, tpr_value_id state_slot, tpr_value_id positions,
                                  int64_t block_size, tpr_value_id *o) {
  tpr_op_attrs at = {.n_i = 1, .i = {block_size}};
  return tpr_program_op(p, TPR_OP_LIGHTNING_PAGED, (const tpr_value_id[]){q, k, v, pool, slopes, state_slot, positions},
                        7, &at, o);
}
tpr_status tpr_pb_attention(tpr_program *p, tpr_value_id q, tpr_value_id k_cache, tpr_value_id v_cache,
                            tpr_value_id start, float scale, tpr_value_id *out) {
  tpr_op_attrs at = {.n_f = 1, .f = {scale}};
  return OP4(TPR_OP_ATTENTION, q, k_cache, v_cache, start, &at);
}
tpr_status tpr_pb_attention_docs(tpr_program *p, tpr_value_id q, tpr_value_id k_cache, tpr_value_id v_cache,
                                 tpr_value_id start, tpr_value_id lo, float scale, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {1}, .n_f = 1, .f = {scale}};
  return tpr_program_op(p, TPR_OP_ATTENTION, (const tpr_value_id[]){q, k_cache, v_cache, start, lo}, 5, &at, out);
}
tpr_status tpr_pb_cache_write(tpr_program *p, tpr_value_id cache, tpr_value_id new_rows, tpr_value_id start,
                              tpr_value_id *out) {
  return OP3(TPR_OP_CACHE_WRITE, cache, new_rows, start, NULL);
}
// Paged KV cache (program.h). paged_cache_write writes its pool in place
// like cache_write: nothing reads its token, and the exec runs every node in
// program order, so the write is kept and precedes the attention after it.
tpr_status tpr_pb_paged_cache_write(tpr_program *p, tpr_value_id pool, tpr_value_id new_rows,
                                    tpr_value_id slot_mapping, tpr_value_id *out) {
  return OP3(TPR_OP_PAGED_CACHE_WRITE, pool, new_rows, slot_mapping, NULL);
}
tpr_status tpr_pb_paged_attention(tpr_program *p, tpr_value_id q, tpr_value_id k_pool, tpr_value_id v_pool,
                                  tpr_value_id block_tables, tpr_value_id seq, tpr_value_id positions, float scale,
                                  tpr_value_id *out) {
  tpr_op_attrs at = {.n_f = 1, .f = {scale}};
  return tpr_program_op(p, TPR_OP_PAGED_ATTENTION,
                        (const tpr_value_id[]){q, k_pool, v_pool, block_tables, seq, positions}, 6, &at, out);
}
tpr_op_attrs tpr_sparse_attn_attrs(const tpr_sparse_attn *sa) {
  return (tpr_op_attrs){.n_i = 7,
                        .i = {sa->kernel_size, sa->kernel_stride, sa->block_size, sa->topk, sa->init_blocks,
                              sa->window_size, sa->dense_len},
                        .n_f = 1,
                        .f = {sa->scale}};
}
// Writes ck_pool in place (as paged_cache_write its pool): program order
// puts it after the layer's cache writes.
tpr_status tpr_pb_sparse_attention_paged(tpr_program *p, tpr_value_id q, tpr_value_id k_pool, tpr_value_id v_pool,
                                         tpr_value_id ck_pool, tpr_value_id block_tables, tpr_value_id seq,
                                         tpr_value_id positions, tpr_value_id prefill_len, const tpr_sparse_attn *sa,
                                         tpr_value_id *out) {
  tpr_op_attrs at = tpr_sparse_attn_attrs(sa);
  tpr_value_id in[8] = {q, k_pool, v_pool, block_tables, seq, positions};
  int n = 6;
  at.i[7] = 0;
  if (ck_pool >= 0) in[n++] = ck_pool, at.i[7] |= TPR_SPARSE_CK_POOL;
  if (prefill_len >= 0) in[n++] = prefill_len, at.i[7] |= TPR_SPARSE_PREFILL_LEN;
  if (at.i[7]) at.n_i = 8;
  return tpr_program_op(p, TPR_OP_SPARSE_ATTENTION_PAGED, in, n, &at, out);
}
tpr_status tpr_pb_sparse_attention(tpr_program *p, tpr_value_id q, tpr_value_id k, tpr_value_id v,
                                   const tpr_sparse_attn *sa, tpr_value_id *out) {
  const tpr_op_attrs at = tpr_sparse_attn_attrs(sa);
  return tpr_program_op(p, TPR_OP_SPARSE_ATTENTION, (const tpr_value_id[]){q, k, v}, 3, &at, out);
}
tpr_status tpr_pb_router_sigmoid_topk(tpr_program *p, tpr_value_id logits, tpr_value_id bias, int k,
                                      tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {k}};
  return OP2(TPR_OP_ROUTER_SIGMOID_TOPK, logits, bias, &at);
}
tpr_status tpr_pb_moe_experts(tpr_program *p, tpr_value_id x, tpr_value_id gates, tpr_value_id w13, tpr_value_id w2,
                              tpr_value_id *out) {
  return OP4(TPR_OP_MOE_EXPERTS, x, gates, w13, w2, NULL);
}
// The FP8 forms of the expert ops: scales (s13, s2) after the weights.
static tpr_status expert_op_fp8(tpr_program *p, tpr_op_kind op, tpr_value_id x, tpr_value_id g_or_counts,
                                const tpr_fp8_experts *f, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {f->block}};
  return tpr_program_op(p, op, (const tpr_value_id[]){x, g_or_counts, f->w13, f->w2, f->s13, f->s2}, 6, &at, out);
}
tpr_status tpr_pb_moe_experts_fp8(tpr_program *p, tpr_value_id x, tpr_value_id gates, const tpr_fp8_experts *f,
                                  tpr_value_id *out) {
  return expert_op_fp8(p, TPR_OP_MOE_EXPERTS, x, gates, f, out);
}
tpr_status tpr_pb_moe_grouped_ffn_fp8(tpr_program *p, tpr_value_id x, tpr_value_id counts, const tpr_fp8_experts *f,
                                      tpr_value_id *out) {
  return expert_op_fp8(p, TPR_OP_MOE_GROUPED_FFN, x, counts, f, out);
}

// Expert parallelism.
tpr_status tpr_pb_moe_capacity(tpr_program *p, tpr_value_id gates, int64_t top_k, float factor, bool reroute,
                               uint64_t seed, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 3, .i = {top_k, reroute, (int64_t)seed}, .n_f = 1, .f = {factor}};  // seed's bits
  return OP1(TPR_OP_MOE_CAPACITY, gates, &at);
}
tpr_status tpr_pb_row_slice(tpr_program *p, tpr_value_id x, tpr_value_id part, int64_t n, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {n}};
  return OP2(TPR_OP_ROW_SLICE, x, part, &at);
}
tpr_status tpr_pb_moe_counts(tpr_program *p, tpr_value_id gates, tpr_value_id *out) {
  return OP1(TPR_OP_MOE_COUNTS, gates, NULL);
}
tpr_status tpr_pb_moe_permute(tpr_program *p, tpr_value_id x, tpr_value_id gates, int64_t rows, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 1, .i = {rows}};
  return OP2(TPR_OP_MOE_PERMUTE, x, gates, &at);
}
tpr_status tpr_pb_all_to_allv(tpr_program *p, tpr_value_id x, tpr_value_id send_counts, tpr_value_id recv_counts,
                              tpr_mesh_axis axis, int n, int64_t rows, tpr_value_id *out) {
  tpr_op_attrs at = {.n_i = 3, .i = {axis, n, rows}};
  return OP3(TPR_OP_ALL_TO_ALLV, x, send_counts, recv_counts, &at);
}
tpr_status tpr_pb_moe_grouped_ffn(tpr_program *p, tpr_value_id x, tpr_value_id counts, tpr_value_id w13,
                                  tpr_value_id w2, tpr_value_id *out) {
  return OP4(TPR_OP_MOE_GROUPED_FFN, x, counts, w13, w2, NULL);
}
tpr_status tpr_pb_moe_unpermute(tpr_program *p, tpr_value_id y, tpr_value_id gates, tpr_value_id *out) {
  return OP2(TPR_OP_MOE_UNPERMUTE, y, gates, NULL);
}
