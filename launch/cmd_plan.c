// tpr plan: print the sharding plan of a checkpoint for a mesh (docs/architecture.md
// section 5): the attention head layout and QK-norm divisors, every tensor
// kind with its global and per-rank shapes, and the bytes each rank holds.
// A pure computation: no mpirun, the world is dp*tp from the flags.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "shard/mesh.h"
#include "shard/shard_plan.h"

// The layers a plan kind of a hybrid model lives in.
static const char *layer_set(const tpr_model_config *c, const tpr_shard_tensor *t) {
  if (t->attn_layers == TPR_ATTN_LAYERS_LINEAR) return "lightning";
  if (t->attn_layers == TPR_ATTN_LAYERS_SOFTMAX) return c->family == TPR_FAMILY_MINICPM_SALA ? "sparse" : "softmax";
  return "all";
}

static const char *shape_str(const int64_t *s, int ndim, char *buf, size_t n) {
  if (ndim == 1) snprintf(buf, n, "(%lld)", (long long)s[0]);
  else snprintf(buf, n, "(%lld, %lld)", (long long)s[0], (long long)s[1]);
  return buf;
}

static const char *bytes_str(uint64_t b, char *buf, size_t n) { return tpr_cli_bytes_prec(b, 2, buf, n); }

static void print_map(const char *label, const int32_t *map, int64_t n, int64_t per_rank) {
  printf("  %-12s", label);
  for (int64_t j = 0; j < n; j++) {
    if (j && j % per_rank == 0) printf(" |");
    if (map[j] < 0) printf(" -");
    else printf(" %d", map[j]);
  }
  printf("\n");
}

static void print_text(const tpr_shard_plan *p, const uint64_t *held, const uint64_t *pad) {
  const tpr_model_config *c = &p->config;
  const tpr_attn_plan *a = &p->attn;
  char b1[64], b2[64];
  // What applies to the family: experts (or the dense MLP), and the
  // QK-norm's divisors only for the norm over the full projection (a
  // per-head norm divides by head_dim on each rank; qwen2_vl has none).
  printf("model %s: %lld layers (%lld MoE), hidden %lld, %lld Q / %lld KV heads x %lld, ",
         tpr_model_family_name(c->family), (long long)c->num_layers, (long long)c->num_moe_layers,
         (long long)c->hidden_size, (long long)c->num_heads, (long long)c->num_kv_heads, (long long)c->head_dim);
  if (c->num_experts)
    printf("%lld experts top-%lld (width %lld), ", (long long)c->num_experts, (long long)c->experts_per_tok,
           (long long)c->moe_intermediate_size);
  if (c->num_moe_layers < c->num_layers) printf("dense MLP width %lld, ", (long long)c->dense_intermediate_size);
  printf("vocab %lld\n", (long long)c->vocab_size);
  if (c->num_linear_layers)  // hybrid (minimax): the softmax layers' heads are planned below
    printf("lightning attention: %lld of %lld layers, %lld heads -> %lld per rank (whole heads, their state and the "
           "norm's all-reduce), block %lld\n", (long long)c->num_linear_layers, (long long)c->num_layers,
           (long long)c->num_heads, (long long)(c->num_heads / p->tp), (long long)c->linear_block_size);
  printf("mesh: world %d = dp %d x tp %d = edp %d x ep %d x etp %d; dtype %s\n", p->world, p->dp, p->tp, p->edp, p->ep,
         p->etp, tpr_dtype_name(p->dtype));
  printf("attention: %s; Q %lld -> %lld (%lld per rank), KV %lld -> %lld (%lld per rank); ",
         tpr_kv_strategy_name(a->strategy), (long long)a->nq, (long long)a->nq_padded, (long long)a->q_per_rank,
         (long long)a->nkv, (long long)a->nkv_eff, (long long)a->kv_per_rank);
  if (c->qk_norm == TPR_QK_NORM_FULL)
    printf("qk-norm divisors q %lld, k %lld\n", (long long)a->q_norm_divisor, (long long)a->k_norm_divisor);
  else if (c->qk_norm == TPR_QK_NORM_PER_HEAD)
    printf("qk-norm per head over %lld dims (rank-local)\n", (long long)c->head_dim);
  else
    printf("no qk-norm%s\n", c->qkv_bias ? "; q/k/v biases sliced like their heads" : "");
  print_map("q_head_map", a->q_head_map, a->nq_padded, a->q_per_rank);
  print_map("kv_head_map", a->kv_head_map, a->nkv_eff, a->kv_per_rank);
  printf("vocab %lld -> %lld", (long long)c->vocab_size, (long long)p->vocab_padded);
  if (c->num_experts)
    printf("; %lld experts and expert width %lld per rank", (long long)p->experts_per_rank,
           (long long)p->expert_inter_per_rank);
  printf("\n\n");
  // A hybrid's kinds name the layers they live in (minicpm_sala's q/k/v/o_proj
  // are two kinds each, one per layer set).
  const bool hybrid = c->num_linear_layers > 0;
  printf("%-58s %-14s %-14s %-13s %8s %12s%s\n", "tensor", "global", "per rank", "transform", "count", "bytes/rank",
         hybrid ? "  layers" : "");
  for (int i = 0; i < p->n_tensors; i++) {
    const tpr_shard_tensor *t = &p->tensors[i];
    char g[48], r[48], b[32];
    printf("%-58s %-14s %-14s %-13s %8lld %12s%s%s\n", t->name, shape_str(t->global_shape, t->ndim, g, sizeof g),
           shape_str(t->rank_shape, t->ndim, r, sizeof r), tpr_shard_transform_name(t->transform),
           (long long)t->count, bytes_str(t->rank_bytes, b, sizeof b), hybrid ? "  " : "",
           hybrid ? layer_set(c, t) : "");
  }
  printf("\n%-6s %-20s %14s %14s\n", "rank", "tp/ep/etp", "holds", "of it padding");
  for (int r = 0; r < p->world; r++) {
    tpr_mesh m;
    char coords[48] = "?";
    if (tpr_mesh_init(p->world, r, p->tp, p->ep, p->etp, &m) == TPR_OK)
      snprintf(coords, sizeof coords, "%d/%d/%d", m.tp_rank, m.ep_rank, m.etp_rank);
    printf("%-6d %-20s %14s %14s\n", r, coords, bytes_str(held[r], b1, sizeof b1), bytes_str(pad[r], b2, sizeof b2));
  }
}

static cJSON *int_array(const int32_t *v, int64_t n) {
  cJSON *arr = cJSON_CreateArray();
  for (int64_t i = 0; arr && i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(v[i]));
  return arr;
}

static cJSON *shape_array(const int64_t *s, int ndim) {
  cJSON *arr = cJSON_CreateArray();
  for (int d = 0; arr && d < ndim; d++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((double)s[d]));
  return arr;
}

static tpr_status print_json(const tpr_shard_plan *p, const uint64_t *held, const uint64_t *pad) {
  const tpr_model_config *c = &p->config;
  const tpr_attn_plan *a = &p->attn;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "command", "plan");
  cJSON_AddStringToObject(j, "model_type", tpr_model_family_name(c->family));
  cJSON_AddStringToObject(j, "dtype", tpr_dtype_name(p->dtype));
  const struct {
    const char *k;
    double v;
  } nums[] = {
      {"world_size", p->world},       {"tp", p->tp},
      {"dp", p->dp},                  {"ep", p->ep},
      {"etp", p->etp},                {"edp", p->edp},
      {"num_layers", (double)c->num_layers},
      {"hidden_size", (double)c->hidden_size},
      {"vocab_size", (double)c->vocab_size},
      {"vocab_padded", (double)p->vocab_padded},
      {"num_experts", (double)c->num_experts},
      {"experts_per_rank", (double)p->experts_per_rank},
      {"expert_intermediate_per_rank", (double)p->expert_inter_per_rank},
  };
  for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) cJSON_AddNumberToObject(j, nums[i].k, nums[i].v);
  cJSON *at = cJSON_AddObjectToObject(j, "attention");
  cJSON_AddStringToObject(at, "strategy", tpr_kv_strategy_name(a->strategy));
  cJSON_AddNumberToObject(at, "head_dim", (double)a->head_dim);
  cJSON_AddNumberToObject(at, "q_heads", (double)a->nq);
  cJSON_AddNumberToObject(at, "q_heads_padded", (double)a->nq_padded);
  cJSON_AddNumberToObject(at, "kv_heads", (double)a->nkv);
  cJSON_AddNumberToObject(at, "kv_heads_effective", (double)a->nkv_eff);
  cJSON_AddNumberToObject(at, "q_heads_per_rank", (double)a->q_per_rank);
  cJSON_AddNumberToObject(at, "kv_heads_per_rank", (double)a->kv_per_rank);
  cJSON_AddStringToObject(at, "qk_norm", c->qk_norm == TPR_QK_NORM_FULL       ? "full"  // the divisors apply
                                         : c->qk_norm == TPR_QK_NORM_PER_HEAD ? "per_head"
                                                                              : "none");
  cJSON_AddNumberToObject(at, "q_norm_divisor", (double)a->q_norm_divisor);
  cJSON_AddNumberToObject(at, "k_norm_divisor", (double)a->k_norm_divisor);
  cJSON_AddItemToObject(at, "q_head_map", int_array(a->q_head_map, a->nq_padded));
  cJSON_AddItemToObject(at, "kv_head_map", int_array(a->kv_head_map, a->nkv_eff));
  cJSON *tensors = cJSON_AddArrayToObject(j, "tensors");
  for (int i = 0; i < p->n_tensors; i++) {
    const tpr_shard_tensor *t = &p->tensors[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", t->name);
    cJSON_AddItemToObject(o, "global_shape", shape_array(t->global_shape, t->ndim));
    cJSON_AddItemToObject(o, "rank_shape", shape_array(t->rank_shape, t->ndim));
    cJSON_AddStringToObject(o, "transform", tpr_shard_transform_name(t->transform));
    cJSON_AddNumberToObject(o, "count", (double)t->count);
    cJSON_AddNumberToObject(o, "rank_bytes", (double)t->rank_bytes);
    if (p->config.num_linear_layers) cJSON_AddStringToObject(o, "layers", layer_set(&p->config, t));
    cJSON_AddItemToArray(tensors, o);
  }
  cJSON *hb = cJSON_AddArrayToObject(j, "per_rank_bytes");
  cJSON *pb = cJSON_AddArrayToObject(j, "per_rank_padding_bytes");
  for (int r = 0; r < p->world; r++) {
    cJSON_AddItemToArray(hb, cJSON_CreateNumber((double)held[r]));
    cJSON_AddItemToArray(pb, cJSON_CreateNumber((double)pad[r]));
  }
  return tpr_cli_print_json(j) ? TPR_OK : TPR_FAIL(TPR_ERR_OOM, "plan: JSON output");
}

int tpr_cmd_plan(int argc, char **argv) {
  const char *model = NULL, *config = NULL, *dtype_name = "bf16";
  tpr_cli_mesh m = {.ep = 1, .etp = 1, .dp = 1};
  bool json = false;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory holding config.json"},
      {"config", TPR_ARG_STR, &config, "a config.json file (instead of --model)"},
      {"tp", TPR_ARG_INT, &m.tp, "tensor-parallel degree (required)"},
      {"ep", TPR_ARG_INT, &m.ep, "expert-parallel degree (default 1)"},
      {"etp", TPR_ARG_INT, &m.etp, "expert tensor-parallel degree (default 1)"},
      {"dp", TPR_ARG_INT, &m.dp, "data-parallel degree; world = dp*tp (default 1)"},
      {"dtype", TPR_ARG_STR, &dtype_name, "checkpoint dtype the bytes are counted in (default bf16)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object"},
  };
  const char *usage = "usage: tpr plan (--model DIR | --config FILE) --tp T [--ep E --etp F --dp D] [--dtype bf16] [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  if (!model == !config) {
    fprintf(stderr, "tpr plan: give exactly one of --model DIR or --config FILE\n%s\n", usage);
    return 2;
  }
  if (!tpr_cli_mesh_ok("plan", &m, usage)) return 2;
  tpr_dtype dtype;
  if (tpr_dtype_parse(dtype_name, &dtype) != TPR_OK) {
    fprintf(stderr, "tpr plan: --dtype: %s\n", tpr_last_error());
    return 2;
  }
  tpr_model_config c;
  tpr_shard_plan plan = {0};
  uint64_t *held = NULL, *pad = NULL;
  tpr_status rc = tpr_model_config_load(model ? model : config, &c);
  if (rc == TPR_OK) rc = tpr_shard_plan_build(&c, (int)m.tp, (int)m.ep, (int)m.etp, (int)m.dp, dtype, &plan);
  if (rc == TPR_OK) {
    held = calloc((size_t)plan.world, sizeof *held);
    pad = calloc((size_t)plan.world, sizeof *pad);
    if (!held || !pad) rc = TPR_FAIL(TPR_ERR_OOM, "plan: per-rank bytes");
  }
  for (int r = 0; rc == TPR_OK && r < plan.world; r++) rc = tpr_shard_plan_rank_bytes(&plan, r, &held[r], &pad[r]);
  if (rc == TPR_OK) {
    if (json) rc = print_json(&plan, held, pad);
    else print_text(&plan, held, pad);
  }
  free(held);
  free(pad);
  tpr_shard_plan_free(&plan);
  if (rc != TPR_OK) {
    fprintf(stderr, "tpr plan: error: %s\n", tpr_last_error());
    return 1;
  }
  return 0;
}
