// The CUDA-vs-CPU op comparison's harness (cuda_ops_harness.h): inputs on
// both backends in several layouts, one op run on each, the outputs
// compared within the op's bound, and negative controls.
#include "cuda_ops_harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tpr_backend *gpu;  // the backend under test
bool selftest;

// ---------------------------------------------------------------- bookkeeping

// Tensors and host buffers of the running test, freed after it (pass or fail).
enum { MAX_HELD = 4096 };
static tpr_tensor *held[MAX_HELD];
static void *held_host[MAX_HELD];
static int n_held, n_held_host;

tpr_tensor *hold(tpr_tensor *t) {
  assert_true(n_held < MAX_HELD);
  return held[n_held++] = t;
}
void *hold_host(void *p) {
  assert_true(n_held_host < MAX_HELD);
  return held_host[n_held_host++] = p;
}
int release_all(void **state) {
  while (n_held) tpr_tensor_free(held[--n_held]);
  while (n_held_host) free(held_host[--n_held_host]);
  return 0;
}

// ---------------------------------------------------------------- tensors on both backends

tpr_tensor *view_permute(const tpr_tensor *t, const int *p) {
  tpr_tensor *v;
  TT_OK(tpr_tensor_permute(t, p, &v));
  return hold(v);
}
tpr_tensor *view_slice(const tpr_tensor *t, int dim, int64_t start, int64_t len) {
  tpr_tensor *v;
  TT_OK(tpr_tensor_slice(t, dim, start, len, &v));
  return hold(v);
}

// The logical (nd, shape) tensor `data` (row-major, dtype dt) on both
// backends, stored in `layout`. Storage outside the view holds 0xff bytes
// (NaN, or index -1), so a kernel reading past the view is noticed.
pair pair_from(tpr_dtype dt, int nd, const int64_t *shape, int layout, const void *data) {
  int64_t s0[TPR_MAX_DIMS + 1], base[TPR_MAX_DIMS + 1];
  int p[TPR_MAX_DIMS + 1], nd0 = nd;
  memcpy(s0, shape, (size_t)nd * sizeof *s0);
  if ((layout & L_SLICE) && nd) s0[nd - 1] += 3;
  if (layout & L_COL) s0[nd0++] = 2;
  for (int i = 0; i < nd0; i++) p[i] = (layout & L_PERM) ? nd0 - 1 - i : i;
  if ((layout & L_SWAP) && nd >= 2) p[nd - 2] = nd - 1, p[nd - 1] = nd - 2;
  for (int i = 0; i < nd0; i++) base[p[i]] = s0[i];
  pair r;
  TT_OK(tpr_tensor_new(tt_cpu(), dt, nd0, base, &r.rc));
  TT_OK(tpr_tensor_new(gpu, dt, nd0, base, &r.rg));
  hold(r.rc), hold(r.rg);
  tpr_tensor *v[2] = {r.rc, r.rg};
  for (int k = 0; k < 2; k++) {
    v[k] = view_permute(v[k], p);
    if (layout & L_COL) v[k] = view_slice(v[k], nd, 1, 1), v[k]->ndim = nd;  // drop the size-1 dim by hand
    if ((layout & L_SLICE) && nd) v[k] = view_slice(v[k], nd - 1, 1, shape[nd - 1]);
  }
  r.c = v[0], r.g = v[1];
  const size_t esz = tpr_dtype_size(dt), bytes = tpr_tensor_nbytes(r.rc);
  char *h = hold_host(malloc(bytes ? bytes : 1));
  memset(h, 0xff, bytes);
  const int64_t n = tpr_shape_numel(nd, shape);
  for (int64_t i = 0; i < n; i++) {
    int64_t off = r.c->offset, rem = i;
    for (int d = nd - 1; d >= 0; d--) off += (rem % shape[d]) * r.c->stride[d], rem /= shape[d];
    memcpy(h + off * (int64_t)esz, (const char *)data + i * (int64_t)esz, esz);
  }
  TT_OK(tpr_tensor_from_host(r.rc, h, bytes));
  TT_OK(tpr_tensor_from_host(r.rg, h, bytes));
  return r;
}

float *rand_f32(int64_t n) {
  float *x = hold_host(malloc((size_t)(n ? n : 1) * sizeof *x));
  tt_fill_normal(x, (size_t)n, 1.0);
  return x;
}
void *rand_any(tpr_dtype dt, int64_t n) {  // f32 normals; any other dtype random bytes
  if (dt == TPR_F32) return rand_f32(n);
  uint8_t *b = hold_host(malloc((size_t)(n ? n : 1) * tpr_dtype_size(dt)));
  for (int64_t i = 0; i < n * (int64_t)tpr_dtype_size(dt); i++) b[i] = (uint8_t)tt_next_u64();
  return b;
}
void set_id(void *b, tpr_dtype dt, int64_t i, int64_t v) {  // element i of an i32/i64 buffer
  if (dt == TPR_I32) ((int32_t *)b)[i] = (int32_t)v;
  else ((int64_t *)b)[i] = v;
}
void *rand_ids(tpr_dtype dt, int64_t n, int64_t lo, int64_t hi) {  // values in [lo, hi]
  void *b = hold_host(malloc((size_t)(n ? n : 1) * 8));
  for (int64_t i = 0; i < n; i++) set_id(b, dt, i, tt_randint(lo, hi));
  return b;
}
pair rand_pair(int nd, const int64_t *shape, int layout) {
  return pair_from(TPR_F32, nd, shape, layout, rand_f32(tpr_shape_numel(nd, shape)));
}
pair scalar_pair(tpr_dtype dt, int64_t v) {  // (1) i32/i64
  int32_t v32 = (int32_t)v;
  return pair_from(dt, 1, (const int64_t[]){1}, 0, dt == TPR_I32 ? (const void *)&v32 : (const void *)&v);
}

// ---------------------------------------------------------------- running and comparing

double op_bound(tpr_op_kind op) {
  switch (op) {
    case TPR_OP_CAST: case TPR_OP_EMBEDDING: case TPR_OP_INDEX_SELECT: case TPR_OP_EMBEDDING_SHARD:
    case TPR_OP_CACHE_WRITE: return 0;
    case TPR_OP_MATMUL: case TPR_OP_ATTENTION: case TPR_OP_MOE_EXPERTS: case TPR_OP_LIGHTNING_ATTENTION:
    case TPR_OP_LIGHTNING_ATTENTION_BWD: case TPR_OP_LIGHTNING_DECODE: case TPR_OP_LIGHTNING_PAGED: return 1e-4;
    default: return 1e-5;
  }
}

// Error of g against c (same dtype and shape, contiguous): bytes compared
// when exact, else max |g - c| / max |c| with NaN and inf required in the
// same places. INFINITY for any mismatch that is not a rounding difference.
double compare(const tpr_tensor *c, const tpr_tensor *g, bool exact) {
  size_t nb = tpr_tensor_nbytes(c);
  void *hc = tt_to_host(c), *hg = tt_to_host(g);
  double err = 0;
  if (exact || c->dtype != TPR_F32) {
    err = memcmp(hc, hg, nb) ? INFINITY : 0;
  } else {
    const float *a = hc, *b = hg;
    double ref = 1e-30;
    for (size_t i = 0; i < nb / 4; i++) {
      if (isnan(a[i]) || isinf(a[i]) || isnan(b[i]) || isinf(b[i])) {
        if (!(isnan(a[i]) && isnan(b[i])) && a[i] != b[i]) err = INFINITY;
        continue;
      }
      ref = fmax(ref, fabs(a[i]));
      err = fmax(err, fabs((double)b[i] - a[i]));
    }
    err = isinf(err) ? err : err / ref;
  }
  free(hc), free(hg);
  return err;
}

// The op's output (shape rule) on both backends.
pair out_pair(tpr_op_kind op, const tpr_tensor *const *cin, int n_in, const tpr_op_attrs *at) {
  tpr_tensor want;
  pair o;
  TT_OK(tpr__op_infer(op, cin, n_in, at, &want));
  TT_OK(tpr_tensor_new(tt_cpu(), want.dtype, want.ndim, want.shape, &o.c));
  TT_OK(tpr_tensor_new(gpu, want.dtype, want.ndim, want.shape, &o.g));
  o.rc = hold(o.c), o.rg = hold(o.g);
  return o;
}

tpr_status run_on(op_case *k, bool on_gpu) {
  const tpr_tensor *in[TPR_OP_MAX_INPUTS];
  for (int i = 0; i < k->n_in; i++) in[i] = on_gpu ? k->in[i].g : k->in[i].c;
  tpr_tensor *o = on_gpu ? k->out.g : k->out.c;
  if (on_gpu) TT_OK(gpu->vt->memset(gpu->ctx, tpr_tensor_data(o), 0xff, tpr_tensor_nbytes(o)));  // poison
  if (on_gpu && k->pool0) TT_OK(tpr_tensor_from_host(k->in[3].rg, k->pool0, tpr_tensor_nbytes(k->in[3].rg)));
  return tpr_op_run(on_gpu ? gpu : tt_cpu(), k->op, in, k->n_in, &k->at, o);
}

// cache_write writes its input 0 in place, lightning_paged its input 3 (the
// state pool): their whole bases are compared too.
double case_error(const op_case *k) {
  double e = compare(k->out.c, k->out.g, op_bound(k->op) == 0);
  if (k->op == TPR_OP_CACHE_WRITE) e = fmax(e, compare(k->in[0].rc, k->in[0].rg, true));
  if (k->op == TPR_OP_LIGHTNING_PAGED) e = fmax(e, compare(k->in[3].rc, k->in[3].rg, false));
  return e;
}

// Runs op on both backends and checks the outputs agree within the op's
// bound. The case stays valid (for a negative control) until the test ends.
__attribute__((format(printf, 5, 6))) op_case *check(tpr_op_kind op, const tpr_op_attrs *at, int n_in,
                                                     const pair *in, const char *fmt, ...) {
  static op_case k;
  memset(&k, 0, sizeof k);
  k.op = op, k.n_in = n_in;
  if (at) k.at = *at;
  va_list ap;
  va_start(ap, fmt);
  int w = snprintf(k.what, sizeof k.what, "%s ", tpr_op_name(op));
  vsnprintf(k.what + w, sizeof k.what - (size_t)w, fmt, ap);
  va_end(ap);
  const tpr_tensor *cin[TPR_OP_MAX_INPUTS];
  for (int i = 0; i < n_in; i++) k.in[i] = in[i], cin[i] = in[i].c;
  k.out = out_pair(op, cin, n_in, &k.at);
  if (op == TPR_OP_LIGHTNING_PAGED) k.pool0 = hold_host(tt_to_host(in[3].rg));
  TT_OK(run_on(&k, false));
  tpr_status rc = run_on(&k, true);
  if (rc != TPR_OK) fail_msg("%s: %s: %s", k.what, tpr_status_name(rc), tpr_last_error());
  double e = case_error(&k), bound = op_bound(op);
  if (!(e <= bound)) fail_msg("%s: error %.3g > bound %.3g", k.what, e, bound);
  return &k;
}

// Negative control: logical element `elem` of input `which` changes on the
// GPU side only (f32: += v; i32/i64: = v; other dtypes: the low bit flips);
// the rerun must then fail the comparison.
void negative(op_case *k, int which, int64_t elem, double v) {
  const pair *p = &k->in[which];
  const tpr_tensor *t = p->c;
  int64_t off = t->offset, rem = elem;
  for (int d = t->ndim - 1; d >= 0; d--) off += (rem % t->shape[d]) * t->stride[d], rem /= t->shape[d];
  char *h = tt_to_host(p->rg), *e = h + off * (int64_t)tpr_dtype_size(t->dtype);
  if (t->dtype == TPR_F32) *(float *)e += (float)v;
  else if (t->dtype == TPR_I32) *(int32_t *)e = (int32_t)v;
  else if (t->dtype == TPR_I64) *(int64_t *)e = (int64_t)v;
  else *e ^= 1;
  TT_OK(tpr_tensor_from_host(p->rg, h, tpr_tensor_nbytes(p->rg)));
  free(h);
  TT_OK(run_on(k, true));
  double err = case_error(k);
  if (!(err > op_bound(k->op))) fail_msg("%s: negative control passed (error %.3g)", k->what, err);
}

const int layouts[N_LAYOUTS] = {0, L_PERM, L_SLICE, L_COL, L_PERM | L_SLICE};
