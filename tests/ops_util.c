#include "ops_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tpr_tensor *tt_new(tpr_dtype dt, int nd, const int64_t *shape) {
  tpr_tensor *t = NULL;
  TT_OK(tpr_tensor_new(tt_cpu(), dt, nd, shape, &t));
  return t;
}

tpr_tensor *tt_from_host(tpr_dtype dt, int nd, const int64_t *shape, const void *h) {
  tpr_tensor *t = tt_new(dt, nd, shape);
  TT_OK(tpr_tensor_from_host(t, h, tpr_tensor_nbytes(t)));
  return t;
}

void *tt_to_host(const tpr_tensor *t) {
  size_t nb = tpr_tensor_nbytes(t);
  void *h = malloc(nb ? nb : 1);
  TT_OK(tpr_tensor_to_host(t, h, nb));
  return h;
}

void tt_check_roundtrip(tt_build_fn build, int n_in, const tpr_tensor *const *in, const tpr_tensor *eager) {
  tpr_program *p, *q;
  tpr_value_id ids[TPR_OP_MAX_INPUTS], out;
  char name[16];
  TT_OK(tpr_program_new(&p));
  for (int i = 0; i < n_in; i++) {
    snprintf(name, sizeof name, "in%d", i);
    TT_OK(tpr_program_input(p, name, in[i]->dtype, in[i]->ndim, in[i]->shape, &ids[i]));
  }
  TT_OK(build(p, ids, &out));
  TT_OK(tpr_program_output(p, out, "out"));
  uint8_t *b1, *b2;
  size_t l1, l2;
  TT_OK(tpr_program_serialize(p, &b1, &l1));
  TT_OK(tpr_program_deserialize(b1, l1, &q));
  TT_OK(tpr_program_serialize(q, &b2, &l2));
  assert_int_equal(l1, l2);
  assert_memory_equal(b1, b2, l1);
  tpr_exec *e;
  TT_OK(tpr_exec_new(q, tt_cpu(), &e));
  for (int i = 0; i < n_in; i++) {
    snprintf(name, sizeof name, "in%d", i);
    TT_OK(tpr_exec_bind(e, name, in[i]));
  }
  TT_OK(tpr_exec_run(e));
  const tpr_tensor *got;
  TT_OK(tpr_exec_output(e, "out", &got));
  assert_int_equal(got->dtype, eager->dtype);
  assert_true(tpr_tensor_same_shape(got, eager));
  assert_memory_equal(tpr_tensor_data(got), tpr_tensor_data(eager), tpr_tensor_nbytes(eager));
  tpr_exec_free(e);
  tpr_program_free(p), tpr_program_free(q);
  free(b1), free(b2);
}

float *tt_read_npy_f32(const char *path, int64_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  unsigned char pre[10];
  assert_int_equal(fread(pre, 1, 10, f), 10);
  assert_memory_equal(pre, "\x93NUMPY\x01\x00", 8);  // version 1.0: a 2-byte header length
  const size_t hl = pre[8] | (size_t)pre[9] << 8;
  char *hdr = calloc(hl + 1, 1);
  assert_int_equal(fread(hdr, 1, hl, f), hl);
  assert_non_null(strstr(hdr, "'descr': '<f4'"));
  assert_non_null(strstr(hdr, "'fortran_order': False"));
  const char *sh = strstr(hdr, "'shape': (");
  assert_non_null(sh);
  int64_t numel = 1;
  for (char *e = (char *)sh + 10; *e != ')';) {
    numel *= strtoll(e, &e, 10);
    while (*e == ',' || *e == ' ') e++;
  }
  if (numel != n) fail_msg("%s holds %lld elements, expected %lld", path, (long long)numel, (long long)n);
  float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
  assert_int_equal(fread(x, sizeof *x, (size_t)n, f), (size_t)n);
  fclose(f), free(hdr);
  return x;
}
