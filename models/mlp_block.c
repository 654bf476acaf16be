#include "mlp_block.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/file_io.h"
#include "runtime/rng.h"

static tpr_status get_number(const cJSON *root, const char *path, const char *key, double *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!item) return TPR_FAIL(TPR_ERR_FORMAT, "%s: missing key \"%s\"", path, key);
  if (!cJSON_IsNumber(item)) return TPR_FAIL(TPR_ERR_FORMAT, "%s: key \"%s\" must be a number", path, key);
  *out = item->valuedouble;
  return TPR_OK;
}

static tpr_status get_count(const cJSON *root, const char *path, const char *key, int64_t *out) {
  double v = 0;
  TPR_CHECK(get_number(root, path, key, &v));
  if (v < 1 || v > 1e9 || v != floor(v))
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: \"%s\" must be a positive integer, got %g", path, key, v);
  *out = (int64_t)v;
  return TPR_OK;
}

tpr_block_config tpr_block_config_default(void) {
  return (tpr_block_config){.hidden_size = 256, .intermediate_size = 1024, .tokens = 64, .rms_norm_eps = 1e-6f};
}

tpr_status tpr_block_config_load(const char *path, tpr_block_config *out) {
  uint8_t *text = NULL;
  size_t len = 0;
  TPR_CHECK(tpr_file_read(path, &text, &len));
  cJSON *root = cJSON_ParseWithLength((const char *)text, len);
  free(text);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return TPR_FAIL(TPR_ERR_FORMAT, "%s: not a valid JSON object", path);
  }
  double eps = 0;
  tpr_status rc = TPR_OK;
  TPR_CHECK_GOTO(get_count(root, path, "hidden_size", &out->hidden_size), rc, done);
  TPR_CHECK_GOTO(get_count(root, path, "intermediate_size", &out->intermediate_size), rc, done);
  TPR_CHECK_GOTO(get_count(root, path, "tokens", &out->tokens), rc, done);
  TPR_CHECK_GOTO(get_number(root, path, "rms_norm_eps", &eps), rc, done);
  if (!(eps > 0 && eps < 1)) rc = TPR_FAIL(TPR_ERR_FORMAT, "%s: \"rms_norm_eps\" must be in (0, 1), got %g", path, eps);
  out->rms_norm_eps = (float)eps;
done:
  cJSON_Delete(root);
  return rc;
}

tpr_status tpr_block_build(const tpr_block_config *c, int64_t tp, tpr_program **out) {
  tpr_mlp_dims d = {.tokens = c->tokens, .hidden = c->hidden_size, .ffn = c->intermediate_size, .tp = tp};
  tpr_program *p;
  TPR_CHECK(tpr_program_new(&p));
  tpr_value_id x, rank, tp_index, norm, h, partial;
  tpr_mlp_params w;
  tpr_status rc = TPR_OK;
  TPR_CHECK_GOTO(tpr_program_input(p, "x", TPR_F32, 2, (const int64_t[]){d.tokens, d.hidden}, &x), rc, fail);
  TPR_CHECK_GOTO(tpr_program_rank_param(p, &rank), rc, fail);
  TPR_CHECK_GOTO(tpr_program_param(p, "norm", TPR_F32, 1, (const int64_t[]){d.hidden}, &norm), rc, fail);
  TPR_CHECK_GOTO(tpr_mlp_declare(p, "mlp.", &d, &w), rc, fail);
  TPR_CHECK_GOTO(tpr_pb_rank_index(p, rank, TPR_RANK_TP, &tp_index), rc, fail);  // (1) i32
  TPR_CHECK_GOTO(tpr_pb_rms_norm(p, x, norm, c->rms_norm_eps, &h), rc, fail);      // (T, H)
  TPR_CHECK_GOTO(tpr_mlp_build(p, &d, &w, tp_index, h, &partial), rc, fail);       // (T, H)
  TPR_CHECK_GOTO(tpr_program_output(p, partial, "partial"), rc, fail);
  *out = p;
  return TPR_OK;
fail:
  tpr_program_free(p);
  return rc;
}

static tpr_status random_tensor(tpr_backend *be, tpr_rng *rng, int ndim, const int64_t *shape, double scale,
                                double offset, tpr_tensor **out) {
  TPR_CHECK(tpr_tensor_new(be, TPR_F32, ndim, shape, out));
  size_t n = (size_t)tpr_shape_numel(ndim, shape);
  float *host = malloc((n ? n : 1) * sizeof *host);
  if (!host) return TPR_FAIL(TPR_ERR_OOM, "random weights");
  tpr_rng_fill_normal(rng, host, n, scale);
  for (size_t i = 0; i < n; i++) host[i] += (float)offset;
  tpr_status rc = tpr_tensor_from_host(*out, host, n * sizeof *host);
  free(host);
  return rc;
}

tpr_status tpr_block_random(const tpr_block_config *c, uint64_t seed, tpr_backend *be, tpr_block_tensors *out) {
  memset(out, 0, sizeof *out);
  tpr_rng rng = {seed};
  int64_t H = c->hidden_size, F = c->intermediate_size;
  // Scales keep activations O(1) through the block, as initialisers do.
  tpr_status rc = TPR_OK;
  TPR_CHECK_GOTO(random_tensor(be, &rng, 2, (const int64_t[]){c->tokens, H}, 1.0, 0.0, &out->x), rc, fail);
  TPR_CHECK_GOTO(random_tensor(be, &rng, 1, (const int64_t[]){H}, 0.1, 1.0, &out->norm), rc, fail);
  TPR_CHECK_GOTO(random_tensor(be, &rng, 2, (const int64_t[]){F, H}, 1.0 / sqrt((double)H), 0, &out->w1), rc, fail);
  TPR_CHECK_GOTO(random_tensor(be, &rng, 2, (const int64_t[]){F, H}, 1.0 / sqrt((double)H), 0, &out->w3), rc, fail);
  TPR_CHECK_GOTO(random_tensor(be, &rng, 2, (const int64_t[]){H, F}, 1.0 / sqrt((double)F), 0, &out->w2), rc, fail);
  return TPR_OK;
fail:
  tpr_block_tensors_free(out);
  return rc;
}

void tpr_block_tensors_free(tpr_block_tensors *t) {
  tpr_tensor_free(t->x), tpr_tensor_free(t->norm), tpr_tensor_free(t->w1), tpr_tensor_free(t->w3);
  tpr_tensor_free(t->w2);
  memset(t, 0, sizeof *t);
}

tpr_status tpr_block_bind(tpr_exec *e, const tpr_block_tensors *t, const tpr_tensor *rank) {
  TPR_CHECK(tpr_exec_bind(e, "x", t->x));
  TPR_CHECK(tpr_exec_bind(e, TPR_RANK_PARAM, rank));
  TPR_CHECK(tpr_exec_bind(e, "norm", t->norm));
  TPR_CHECK(tpr_exec_bind(e, "mlp.w1", t->w1));
  TPR_CHECK(tpr_exec_bind(e, "mlp.w3", t->w3));
  return tpr_exec_bind(e, "mlp.w2", t->w2);
}
