#include "ckpt_fixture.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shard/safetensors.h"
#include "test_util.h"

enum { CK_FILES = 3 };

ck_spec ck_default_spec(void) {
  return (ck_spec){.nq = 6, .nkv = 2, .D = 8, .H = 32, .L = 2, .E = 8, .I = 16, .V = 250, .F = 48};
}

static void add(ck_model *m, const char *name, int64_t d0, int64_t d1, tpr_dtype dt, double scale, double mean) {
  m->t = realloc(m->t, (size_t)(m->n + 1) * sizeof *m->t);
  assert_non_null(m->t);
  ck_tensor *t = &m->t[m->n++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = d1 ? 2 : 1;
  t->shape[0] = d0, t->shape[1] = d1;
  t->dtype = dt;
  size_t n = (size_t)(d0 * (d1 ? d1 : 1));
  t->values = malloc(n * sizeof *t->values);
  assert_non_null(t->values);
  tt_fill_normal(t->values, n, scale);
  for (size_t i = 0; i < n; i++) {
    t->values[i] += (float)mean;
    if (dt == TPR_BF16) t->values[i] = tpr_bf16_to_f32(tpr_f32_to_bf16(t->values[i]));  // what the file holds
  }
  const ck_spec *s = &m->s;
  if (!s->fp8_rows || !(strstr(name, "layers.0.self_attn.q_proj") || strstr(name, "layers.0.self_attn.o_proj") ||
                        strstr(name, "layers.1.block_sparse_moe.experts.1.w2")))
    return;
  // Block-scaled FP8 as in the MiniMax-M2 release: codes times a per-block
  // scale_inv, dequantized in f32 (what the loader must give).
  t->dtype = TPR_F8E4M3;
  t->sshape[0] = (d0 + s->fp8_rows - 1) / s->fp8_rows, t->sshape[1] = (d1 + s->fp8_cols - 1) / s->fp8_cols;
  t->scale = malloc((size_t)(t->sshape[0] * t->sshape[1]) * sizeof *t->scale);
  t->codes = malloc(n);
  for (int64_t b = 0; b < t->sshape[0] * t->sshape[1]; b++) t->scale[b] = (float)tt_uniform(0.25, 2.0);
  for (int64_t r = 0; r < d0; r++)
    for (int64_t c = 0; c < d1; c++) {
      float sc = t->scale[(r / s->fp8_rows) * t->sshape[1] + c / s->fp8_cols];
      t->codes[r * d1 + c] = tpr_f32_to_f8e4m3(t->values[r * d1 + c] / sc);
      t->values[r * d1 + c] = tpr_f8e4m3_to_f32(t->codes[r * d1 + c]) * sc;
    }
}

// Every tensor of the model, Hugging Face names.
static void list_tensors(ck_model *m) {
  const ck_spec *s = &m->s;
  char n[160];
  add(m, "model.embed_tokens.weight", s->V, s->H, TPR_BF16, 1, 0);
  for (int64_t l = 0; l < s->L; l++) {
#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    add(m, NAME("model.layers.%lld.input_layernorm.weight", (long long)l), s->H, 0, TPR_BF16, 0.1, 1);
    add(m, NAME("model.layers.%lld.post_attention_layernorm.weight", (long long)l), s->H, 0, TPR_BF16, 0.1, 1);
    add(m, NAME("model.layers.%lld.self_attn.q_proj.weight", (long long)l), s->nq * s->D, s->H, TPR_BF16, 1, 0);
    add(m, NAME("model.layers.%lld.self_attn.k_proj.weight", (long long)l), s->nkv * s->D, s->H, TPR_BF16, 1, 0);
    add(m, NAME("model.layers.%lld.self_attn.v_proj.weight", (long long)l), s->nkv * s->D, s->H, TPR_BF16, 1, 0);
    add(m, NAME("model.layers.%lld.self_attn.o_proj.weight", (long long)l), s->H, s->nq * s->D, TPR_BF16, 1, 0);
    int64_t qn = s->qwen3 ? s->D : s->nq * s->D, kn = s->qwen3 ? s->D : s->nkv * s->D;
    add(m, NAME("model.layers.%lld.self_attn.q_norm.weight", (long long)l), qn, 0, TPR_BF16, 0.1, 1);
    add(m, NAME("model.layers.%lld.self_attn.k_norm.weight", (long long)l), kn, 0, TPR_BF16, 0.1, 1);
    if (s->qwen3 && l == 0) {  // mlp_only_layers: [0]
      add(m, NAME("model.layers.0.mlp.gate_proj.weight"), s->F, s->H, TPR_BF16, 1, 0);
      add(m, NAME("model.layers.0.mlp.up_proj.weight"), s->F, s->H, TPR_BF16, 1, 0);
      add(m, NAME("model.layers.0.mlp.down_proj.weight"), s->H, s->F, TPR_BF16, 1, 0);
      continue;
    }
    const char *moe = s->qwen3 ? "mlp" : "block_sparse_moe";
    add(m, NAME("model.layers.%lld.%s.gate.weight", (long long)l, moe), s->E, s->H, TPR_BF16, 1, 0);
    if (!s->qwen3)  // F32 in the MiniMax-M2 release too
      add(m, NAME("model.layers.%lld.block_sparse_moe.e_score_correction_bias", (long long)l), s->E, 0, TPR_F32, 1, 0);
    const char *w[3] = {"w1", "w3", "w2"}, *q[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int64_t e = 0; e < s->E; e++)
      for (int k = 0; k < 3; k++)
        add(m, NAME("model.layers.%lld.%s.experts.%lld.%s.weight", (long long)l, moe, (long long)e,
                    s->qwen3 ? q[k] : w[k]),
            k < 2 ? s->I : s->H, k < 2 ? s->H : s->I, TPR_BF16, 1, 0);
#undef NAME
  }
  add(m, "model.norm.weight", s->H, 0, TPR_BF16, 0.1, 1);
  add(m, "lm_head.weight", s->V, s->H, TPR_BF16, 1, 0);
}

static void write_text(const char *dir, const char *name, const char *text) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void write_config(const char *dir, const ck_spec *s) {
  char cfg[2048], quant[160] = "";
  if (s->fp8_rows)
    snprintf(quant, sizeof quant, ", \"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [%d, %d]}",
             s->fp8_rows, s->fp8_cols);
  if (s->qwen3)
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"qwen3_moe\", \"hidden_size\": %lld, \"num_hidden_layers\": %lld, "
             "\"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld, "
             "\"intermediate_size\": %lld, \"moe_intermediate_size\": %lld, \"num_experts\": %lld, "
             "\"num_experts_per_tok\": 2, \"mlp_only_layers\": [0], \"decoder_sparse_step\": 1, "
             "\"norm_topk_prob\": true, \"vocab_size\": %lld, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1e6, "
             "\"tie_word_embeddings\": false}",
             (long long)s->H, (long long)s->L, (long long)s->nq, (long long)s->nkv, (long long)s->D, (long long)s->F,
             (long long)s->I, (long long)s->E, (long long)s->V);
  else
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"minimax_m2\", \"hidden_size\": %lld, \"num_hidden_layers\": %lld, "
             "\"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld, "
             "\"rotary_dim\": %lld, \"intermediate_size\": %lld, \"num_local_experts\": %lld, "
             "\"num_experts_per_tok\": 2, \"scoring_func\": \"sigmoid\", \"use_routing_bias\": true, "
             "\"use_qk_norm\": true, \"qk_norm_type\": \"per_layer\", \"vocab_size\": %lld, \"rms_norm_eps\": 1e-6, "
             "\"rope_theta\": 5e6, \"tie_word_embeddings\": false%s}",
             (long long)s->H, (long long)s->L, (long long)s->nq, (long long)s->nkv, (long long)s->D,
             (long long)(s->D / 2), (long long)s->I, (long long)s->E, (long long)s->V, quant);
  write_text(dir, "config.json", cfg);
}

// Writes file f of FILES (tensors f, f+FILES, ...), leaving out `skip` and
// giving `reshape` one row too many (zeros).
static void write_file(const char *dir, const ck_model *m, int f, const char *skip, const char *reshape) {
  tpr_st_write_entry *e = calloc((size_t)(2 * m->n), sizeof *e), *se = calloc((size_t)m->n, sizeof *se);
  void **bufs = calloc((size_t)m->n, sizeof *bufs);
  char(*snames)[160] = calloc((size_t)m->n, sizeof *snames);
  int64_t(*shapes)[2] = calloc((size_t)m->n, sizeof *shapes);
  int ne = 0, ns = 0;
  char path[4200];
  snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, f + 1, CK_FILES);
  for (int i = f; i < m->n; i += CK_FILES) {
    const ck_tensor *t = &m->t[i];
    if (skip && !strcmp(skip, t->name)) continue;
    size_t n = (size_t)(t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1)), row = n / (size_t)t->shape[0];
    bool grow = reshape && !strcmp(reshape, t->name);
    bufs[ne] = calloc(n + (grow ? row : 0), tpr_dtype_size(t->dtype));
    if (t->codes) memcpy(bufs[ne], t->codes, n);
    else tpr_dtype_convert(t->values, TPR_F32, bufs[ne], t->dtype, n);
    shapes[ne][0] = t->shape[0] + grow, shapes[ne][1] = t->shape[1];
    e[ne] = (tpr_st_write_entry){t->name, t->dtype, t->ndim, shapes[ne], bufs[ne]};
    if (t->codes) {
      snprintf(snames[ne], sizeof snames[ne], "%s_scale_inv", t->name);
      se[ns++] = (tpr_st_write_entry){snames[ne], TPR_F32, 2, t->sshape, t->scale};
    }
    ne++;
  }
  memcpy(e + ne, se, (size_t)ns * sizeof *se);  // the scale_inv tensors after the weights
  TT_OK(tpr_st_write(path, e, ne + ns, NULL));
  for (int i = 0; i < ne; i++) free(bufs[i]);
  free(bufs), free(shapes), free(e), free(se), free(snames);
}

void ck_rewrite(const char *dir, const ck_model *m, const char *skip, const char *reshape) {
  char path[4200];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  unlink(path);
  for (int i = 0; i < m->n; i++)
    if ((skip && !strcmp(m->t[i].name, skip)) || (reshape && !strcmp(m->t[i].name, reshape)))
      write_file(dir, m, i % CK_FILES, skip, reshape);
}

void ck_write(const char *dir, const ck_spec *s, ck_model *out) {
  *out = (ck_model){.s = *s};
  list_tensors(out);
  write_config(dir, s);
  // Three files, tensors dealt round-robin, so every rank reads from several.
  size_t cap = 64 + (size_t)out->n * 400;
  char *index = malloc(cap);
  assert_non_null(index);
  size_t k = (size_t)snprintf(index, cap, "{\"metadata\": {}, \"weight_map\": {");
  for (int i = 0; i < out->n; i++) {
    k += (size_t)snprintf(index + k, cap - k, "%s\"%s\": \"model-%05d-of-%05d.safetensors\"", i ? ", " : "",
                          out->t[i].name, i % CK_FILES + 1, CK_FILES);
    if (out->t[i].codes)
      k += (size_t)snprintf(index + k, cap - k, ", \"%s_scale_inv\": \"model-%05d-of-%05d.safetensors\"",
                            out->t[i].name, i % CK_FILES + 1, CK_FILES);
  }
  for (int f = 0; f < CK_FILES; f++) write_file(dir, out, f, NULL, NULL);
  snprintf(index + k, cap - k, "}}");
  write_text(dir, "model.safetensors.index.json", index);
  free(index);
}

const ck_tensor *ck_find(const ck_model *m, const char *name) {
  for (int i = 0; i < m->n; i++)
    if (!strcmp(m->t[i].name, name)) return &m->t[i];
  return NULL;
}

void ck_free(ck_model *m) {
  for (int i = 0; i < m->n; i++) free(m->t[i].values), free(m->t[i].codes), free(m->t[i].scale);
  free(m->t);
  memset(m, 0, sizeof *m);
}

void ck_rmdir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[4200];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      unlink(path);
    }
  closedir(d);
  rmdir(dir);
}
