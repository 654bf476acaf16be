// Program <-> bytes through protobuf-c. protobuf-c packs fields in field
// number order and repeated fields in order, so equal programs give equal
// bytes. Loading replays the build through tpr_program_op, so every shape
// rule is checked again and malformed bytes fail with TPR_ERR_FORMAT.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program.pb-c.h"
#include "program_impl.h"

#define FORMAT_VERSION 1

typedef struct pb_arrays {
  TprPb__Value *values;
  TprPb__Value **value_ptrs;
  TprPb__Node *nodes;
  TprPb__Node **node_ptrs;
  int64_t *i64;   // shapes and iattrs
  int32_t *i32;   // node inputs
} pb_arrays;

static void free_arrays(pb_arrays *a) {
  free(a->values), free(a->value_ptrs), free(a->nodes), free(a->node_ptrs), free(a->i64), free(a->i32);
}

tpr_status tpr_program_serialize(const tpr_program *p, uint8_t **bytes, size_t *len) {
  *bytes = NULL;
  *len = 0;
  size_t nv = (size_t)p->n_values, nn = (size_t)p->n_nodes;
  size_t n64 = nv * TPR_MAX_DIMS + nn * TPR_OP_MAX_IATTRS, n32 = nn * TPR_OP_MAX_INPUTS;
  pb_arrays a = {
      .values = calloc(nv + 1, sizeof *a.values),
      .value_ptrs = calloc(nv + 1, sizeof *a.value_ptrs),
      .nodes = calloc(nn + 1, sizeof *a.nodes),
      .node_ptrs = calloc(nn + 1, sizeof *a.node_ptrs),
      .i64 = calloc(n64 + 1, sizeof *a.i64),
      .i32 = calloc(n32 + 1, sizeof *a.i32),
  };
  if (!a.values || !a.value_ptrs || !a.nodes || !a.node_ptrs || !a.i64 || !a.i32) {
    free_arrays(&a);
    return TPR_FAIL(TPR_ERR_OOM, "serialize");
  }
  int64_t *i64 = a.i64;
  for (size_t v = 0; v < nv; v++) {
    const tpr_value_rec *r = &p->values[v];
    TprPb__Value *pv = &a.values[v];
    tpr_pb__value__init(pv);
    pv->name = r->name ? r->name : (char *)"";
    pv->kind = r->kind;
    pv->dtype = r->desc.dtype;
    pv->n_shape = (size_t)r->desc.ndim;
    pv->shape = i64;
    memcpy(i64, r->desc.shape, (size_t)r->desc.ndim * sizeof *i64);
    i64 += r->desc.ndim;
    pv->is_output = r->is_output;
    pv->producer = r->producer + 1;
    a.value_ptrs[v] = pv;
  }
  int32_t *i32 = a.i32;
  for (size_t n = 0; n < nn; n++) {
    const tpr_node *node = &p->nodes[n];
    TprPb__Node *pn = &a.nodes[n];
    tpr_pb__node__init(pn);
    pn->op = node->op;
    pn->n_inputs = (size_t)node->n_in;
    pn->inputs = i32;
    memcpy(i32, node->in, (size_t)node->n_in * sizeof *i32);
    i32 += node->n_in;
    pn->n_iattrs = (size_t)node->attrs.n_i;
    pn->iattrs = i64;
    memcpy(i64, node->attrs.i, (size_t)node->attrs.n_i * sizeof *i64);
    i64 += node->attrs.n_i;
    pn->n_fattrs = (size_t)node->attrs.n_f;
    pn->fattrs = (float *)node->attrs.f;
    a.node_ptrs[n] = pn;
  }
  TprPb__Program prog = TPR_PB__PROGRAM__INIT;
  prog.format_version = FORMAT_VERSION;
  prog.n_values = nv;
  prog.values = a.value_ptrs;
  prog.n_nodes = nn;
  prog.nodes = a.node_ptrs;

  size_t size = tpr_pb__program__get_packed_size(&prog);
  uint8_t *buf = malloc(size ? size : 1);
  if (!buf) {
    free_arrays(&a);
    return TPR_FAIL(TPR_ERR_OOM, "serialize: %zu bytes", size);
  }
  size_t packed = tpr_pb__program__pack(&prog, buf);
  free_arrays(&a);
  if (packed != size) {
    free(buf);
    return TPR_FAIL(TPR_ERR_INTERNAL, "serialize: packed %zu bytes, expected %zu", packed, size);
  }
  *bytes = buf;
  *len = size;
  return TPR_OK;
}

// Replays one serialized node through the builder and checks the result.
static tpr_status load_node(tpr_program *p, const TprPb__Program *prog, size_t v) {
  const TprPb__Value *pv = prog->values[v];
  size_t n = (size_t)pv->producer - 1;
  if (pv->producer < 1 || n != (size_t)p->n_nodes || n >= prog->n_nodes)
    return TPR_FAIL(TPR_ERR_FORMAT, "value %zu claims producer %d, expected node %d", v, pv->producer - 1, p->n_nodes);
  const TprPb__Node *pn = prog->nodes[n];
  if (pn->n_inputs > TPR_OP_MAX_INPUTS || pn->n_iattrs > TPR_OP_MAX_IATTRS || pn->n_fattrs > TPR_OP_MAX_FATTRS)
    return TPR_FAIL(TPR_ERR_FORMAT, "node %zu has too many inputs or attributes", n);
  if (pn->op < 0 || pn->op >= TPR_OP_KIND_COUNT) return TPR_FAIL(TPR_ERR_FORMAT, "node %zu: unknown op %d", n, pn->op);
  tpr_op_attrs at = {.n_i = (int)pn->n_iattrs, .n_f = (int)pn->n_fattrs};
  if (pn->n_iattrs) memcpy(at.i, pn->iattrs, pn->n_iattrs * sizeof *at.i);
  if (pn->n_fattrs) memcpy(at.f, pn->fattrs, pn->n_fattrs * sizeof *at.f);
  tpr_value_id in[TPR_OP_MAX_INPUTS], out;
  for (size_t i = 0; i < pn->n_inputs; i++) {
    if (pn->inputs[i] < 0 || (size_t)pn->inputs[i] >= v)
      return TPR_FAIL(TPR_ERR_FORMAT, "node %zu reads value %d, not defined before it", n, pn->inputs[i]);
    in[i] = pn->inputs[i];
  }
  if (tpr_program_op(p, (tpr_op_kind)pn->op, in, (int)pn->n_inputs, &at, &out) != TPR_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", tpr_last_error());
    return TPR_FAIL(TPR_ERR_FORMAT, "node %zu (%s) is invalid: %s", n, tpr_op_name((tpr_op_kind)pn->op), why);
  }
  const tpr_tensor *d = &p->values[out].desc;
  bool same = pv->dtype == (int32_t)d->dtype && pv->n_shape == (size_t)d->ndim;
  for (size_t i = 0; same && i < pv->n_shape; i++) same = pv->shape[i] == d->shape[i];
  if (!same) return TPR_FAIL(TPR_ERR_FORMAT, "value %zu: stored dtype/shape disagree with its op", v);
  if (pv->is_output) {
    TPR_CHECK(tpr_name_check("program output", pv->name, strlen(pv->name)));
    TPR_CHECK(tpr_program_output(p, out, pv->name));
  }
  return TPR_OK;
}

static tpr_status load(tpr_program *p, const TprPb__Program *prog) {
  if (prog->format_version != FORMAT_VERSION)
    return TPR_FAIL(TPR_ERR_FORMAT, "program format version %u, this build reads %d%s", prog->format_version,
                    FORMAT_VERSION, prog->format_version == 0 ? " (the bytes are truncated or not a program)" : "");
  for (size_t v = 0; v < prog->n_values; v++) {
    const TprPb__Value *pv = prog->values[v];
    if (pv->kind == TPR_VALUE_NODE) {
      TPR_CHECK(load_node(p, prog, v));
      continue;
    }
    if (pv->kind != TPR_VALUE_INPUT && pv->kind != TPR_VALUE_PARAM)
      return TPR_FAIL(TPR_ERR_FORMAT, "value %zu has unknown kind %d", v, pv->kind);
    if (pv->n_shape > TPR_MAX_DIMS) return TPR_FAIL(TPR_ERR_FORMAT, "value %zu has %zu dims", v, pv->n_shape);
    // Names and shapes are the sender's word: both checked before the builder sizes anything by them.
    char what[64];
    snprintf(what, sizeof what, "program value %zu", v);
    TPR_CHECK(tpr_name_check(what, pv->name, strlen(pv->name)));
    if (!tpr_dtype_valid((tpr_dtype)pv->dtype)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: invalid dtype %d", what, pv->dtype);
    if (tpr_shape_size_checked(what, (tpr_dtype)pv->dtype, (int)pv->n_shape, pv->shape, NULL, NULL) != TPR_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", tpr_last_error());
      return TPR_FAIL(TPR_ERR_FORMAT, "%s", why);
    }
    tpr_value_id id;
    tpr_status rc = (pv->kind == TPR_VALUE_INPUT ? tpr_program_input : tpr_program_param)(
        p, pv->name, (tpr_dtype)pv->dtype, (int)pv->n_shape, pv->shape, &id);
    if (rc != TPR_OK) {
      char why[1024];
      snprintf(why, sizeof why, "%s", tpr_last_error());
      return TPR_FAIL(TPR_ERR_FORMAT, "value %zu ('%s') is invalid: %s", v, pv->name, why);
    }
  }
  if ((size_t)p->n_nodes != prog->n_nodes)
    return TPR_FAIL(TPR_ERR_FORMAT, "%zu nodes stored, %d produce values", prog->n_nodes, p->n_nodes);
  return TPR_OK;
}

tpr_status tpr_program_deserialize(const uint8_t *bytes, size_t len, tpr_program **out) {
  *out = NULL;
  TprPb__Program *prog = tpr_pb__program__unpack(NULL, len, bytes);
  if (!prog) return TPR_FAIL(TPR_ERR_FORMAT, "program bytes (%zu) are not a valid serialized program", len);
  tpr_program *p;
  tpr_status rc = tpr_program_new(&p);
  if (rc == TPR_OK) rc = load(p, prog);
  tpr_pb__program__free_unpacked(prog, NULL);
  if (rc != TPR_OK && rc != TPR_ERR_FORMAT && rc != TPR_ERR_OOM) {
    // Whatever the builder objected to, the bytes are what is wrong.
    char why[1024];
    snprintf(why, sizeof why, "%s", tpr_last_error());
    rc = TPR_FAIL(TPR_ERR_FORMAT, "invalid serialized program: %s", why);
  }
  if (rc != TPR_OK) {
    tpr_program_free(p);
    return rc;
  }
  *out = p;
  return TPR_OK;
}

tpr_status tpr_program_hash(const tpr_program *p, uint64_t *hash) {
  uint8_t *bytes;
  size_t len;
  TPR_CHECK(tpr_program_serialize(p, &bytes, &len));
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (size_t i = 0; i < len; i++) h = (h ^ bytes[i]) * 0x100000001b3ull;
  free(bytes);
  *hash = h;
  return TPR_OK;
}
