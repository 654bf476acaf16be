// Reading boxes of mapped tensors, converting dtypes and dequantizing FP8.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

enum { CHUNK = 1024 };  // elements converted per step through stack buffers

static void fmt_dims(char *buf, size_t cap, int n, const int64_t *v) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)v[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
}

// Converts n contiguous elements src (sdt) -> dst (ddt). When scale != NULL
// (src is F8E4M3), element j is multiplied in f32 by scale[(c0 + j) / bc]
// before the one rounding to ddt. The mapped source may be misaligned for
// its element size (the format allows any header length), and the
// converters load typed values, so such runs go through an aligned buffer.
static void convert_run(const uint8_t *src, tpr_dtype sdt, int64_t n, void *dst, tpr_dtype ddt, const float *scale,
                        int64_t c0, int bc) {
  size_t ssz = tpr_dtype_size(sdt), dsz = tpr_dtype_size(ddt);
  if (sdt == ddt) {
    memcpy(dst, src, (size_t)n * ssz);
    return;
  }
  _Alignas(8) uint8_t bounce[CHUNK * 8];
  float tmp[CHUNK];
  int aligned = (uintptr_t)src % ssz == 0;
  for (int64_t k = 0; k < n; k += CHUNK) {
    int64_t m = n - k < CHUNK ? n - k : CHUNK;
    const void *s = src + k * (int64_t)ssz;
    if (!aligned) s = memcpy(bounce, s, (size_t)m * ssz);
    uint8_t *d = (uint8_t *)dst + k * (int64_t)dsz;
    if (!scale) {
      tpr_dtype_convert(s, sdt, d, ddt, (size_t)m);
      continue;
    }
    tpr_dtype_convert(s, sdt, tmp, TPR_F32, (size_t)m);
    for (int64_t j = 0; j < m; j++) tmp[j] *= scale[(c0 + k + j) / bc];
    tpr_dtype_convert(tmp, TPR_F32, d, ddt, (size_t)m);
  }
}

// The scale_inv rows covering weight rows [r0, r0+nr) of FP8 weight t, as
// f32: *out (nsr, ceil(C/bc)), row 0 being weight row block r0/br.
// *out stays NULL when t has no scale_inv tensor.
static tpr_status load_scales(const tpr_st_set *set, const tpr_st_tensor *t, int64_t r0, int64_t nr, float **out) {
  *out = NULL;
  size_t nlen = strlen(t->name);
  char *sname = malloc(nlen + sizeof "_scale_inv");
  if (!sname) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
  memcpy(sname, t->name, nlen);
  memcpy(sname + nlen, "_scale_inv", sizeof "_scale_inv");
  const tpr_st_tensor *s = tpr_st_find(set, sname);
  free(sname);
  if (!s) return TPR_OK;
  int br, bc;
  tpr__st_fp8_block(set, &br, &bc);
  if (t->ndim != 2)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: FP8 tensor '%s' has %d dims and a scale_inv; block scales need a 2-D weight",
                    t->path, t->name, t->ndim);
  int64_t want[2] = {(t->shape[0] + br - 1) / br, (t->shape[1] + bc - 1) / bc};
  if (s->ndim != 2 || s->shape[0] != want[0] || s->shape[1] != want[1]) {
    char got[64] = "[]";
    fmt_dims(got, sizeof got, s->ndim, s->shape);
    return TPR_FAIL(TPR_ERR_FORMAT,
                    "%s: '%s_scale_inv' has shape %s; FP8 weight '%s' (%lld, %lld) in %d x %d blocks needs "
                    "[%lld, %lld]", s->path, t->name, got, t->name, (long long)t->shape[0], (long long)t->shape[1],
                    br, bc, (long long)want[0], (long long)want[1]);
  }
  if (s->dtype != TPR_F32 && s->dtype != TPR_BF16 && s->dtype != TPR_F16)
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: '%s_scale_inv' is %s; scales must be F32, BF16 or F16", s->path, t->name,
                    tpr__st_dtype_name(s->dtype));
  if (nr == 0) return TPR_OK;
  int64_t sr0 = r0 / br, nsr = (r0 + nr - 1) / br - sr0 + 1;
  float *buf = malloc((size_t)(nsr * want[1]) * sizeof *buf);
  if (!buf) return TPR_FAIL(TPR_ERR_OOM, "out of memory reading '%s_scale_inv'", t->name);
  tpr_status rc = tpr_st_read(set, s->name, (const int64_t[]){sr0, 0}, (const int64_t[]){nsr, want[1]}, TPR_F32, buf);
  if (rc != TPR_OK) {
    free(buf);
    return tpr__propagate(rc, __FILE__, __LINE__);
  }
  *out = buf;
  return TPR_OK;
}

tpr_status tpr_st_read(const tpr_st_set *set, const char *name, const int64_t *start, const int64_t *len,
                       tpr_dtype dst_dt, void *dst) {
  if (!set || !name) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tpr_st_read: set or name is NULL");
  const tpr_st_tensor *t = tpr_st_find(set, name);
  if (!t) return TPR_FAIL(TPR_ERR_INVALID_ARG, "no tensor named '%s' in the checkpoint", name);
  if (!tpr_dtype_valid(dst_dt)) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tensor '%s': invalid dtype %d", name, dst_dt);

  int nd = t->ndim;
  int64_t st[TPR_MAX_DIMS], ln[TPR_MAX_DIMS], numel = 1;
  for (int d = 0; d < nd; d++) {
    st[d] = start ? start[d] : 0;
    ln[d] = len ? len[d] : t->shape[d] - st[d];
    if (st[d] < 0 || ln[d] < 0 || st[d] > t->shape[d] || ln[d] > t->shape[d] - st[d]) {
      char a[200] = "[]", b[200] = "[]", c[200] = "[]";
      fmt_dims(a, sizeof a, nd, st);
      if (len) fmt_dims(b, sizeof b, nd, len);
      else snprintf(b, sizeof b, "(to the end)");
      fmt_dims(c, sizeof c, nd, t->shape);
      return TPR_FAIL(TPR_ERR_SHAPE, "%s: tensor '%s': box start %s len %s is outside its shape %s (dim %d)",
                      t->path, name, start ? a : "[0...]", b, c, d);
    }
    numel *= ln[d];
  }
  if (numel == 0) return TPR_OK;
  if (!dst) return TPR_FAIL(TPR_ERR_INVALID_ARG, "tensor '%s': dst is NULL", name);

  float *scales = NULL;
  int br, bc;
  tpr__st_fp8_block(set, &br, &bc);
  if (t->dtype == TPR_F8E4M3 && dst_dt != TPR_F8E4M3) TPR_CHECK(load_scales(set, t, st[0], ln[0], &scales));
  int64_t sC = scales ? (t->shape[1] + bc - 1) / bc : 0;

  // Row-major element strides of the tensor; runs along the last dim are
  // contiguous in both the file and dst.
  int64_t stride[TPR_MAX_DIMS], idx[TPR_MAX_DIMS] = {0};
  int64_t step = 1;
  for (int d = nd - 1; d >= 0; d--) stride[d] = step, step *= t->shape[d];
  int64_t run = nd ? ln[nd - 1] : 1, nruns = numel / run;
  size_t ssz = tpr_dtype_size(t->dtype), dsz = tpr_dtype_size(dst_dt);
  const uint8_t *base = t->data;
  for (int64_t r = 0; r < nruns; r++) {
    int64_t off = nd ? st[nd - 1] : 0;
    for (int d = 0; d < nd - 1; d++) off += (st[d] + idx[d]) * stride[d];
    const float *srow = scales ? scales + ((st[0] + idx[0]) / br - st[0] / br) * sC : NULL;
    convert_run(base + off * (int64_t)ssz, t->dtype, run, (uint8_t *)dst + r * run * (int64_t)dsz, dst_dt, srow,
                nd ? st[nd - 1] : 0, bc);
    for (int d = nd - 2; d >= 0 && ++idx[d] == ln[d]; d--) idx[d] = 0;  // next run, odometer style
  }
  free(scales);
  return TPR_OK;
}

tpr_status tpr_st_read_f32(const tpr_st_set *set, const char *name, const int64_t *start, const int64_t *len,
                           float *dst) {
  TPR_CHECK(tpr_st_read(set, name, start, len, TPR_F32, dst));
  return TPR_OK;
}
