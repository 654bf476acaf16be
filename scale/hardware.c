// Hardware presets and model.json (see hardware.h).
#include "scale/hardware.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// H100 SXM5 (NVIDIA H100 Tensor Core GPU datasheet): 989 TFLOP/s dense BF16,
// 3.35 TB/s HBM3; NVLink 4 900 GB/s per GPU (both directions: 450 GB/s
// each way), 8 GPUs per HGX node. Achieved fractions are assumptions stated
// here, not measurements: 50% of peak FLOP/s in the GEMMs (large-model MFU
// reports sit at 40-55%), 80% of HBM and link bandwidth.
// Latencies: ~10 us per NCCL ring step inside a node, ~15 us across.
static const double h100_flops = 989e12 * 0.5, h100_hbm = 3.35e12 * 0.8, nvlink_bw = 450e9 * 0.8;

static const struct {
  const char *name;
  double gbit, alpha;  // per GPU (one NIC per GPU), latency per round
} networks[] = {
    {"ib-400g", 400, 15e-6},    // NDR InfiniBand ConnectX-7, 400 Gb/s
    {"ib-200g", 200, 15e-6},    // HDR InfiniBand, 200 Gb/s
    {"roce-100g", 100, 25e-6},  // 100 GbE RoCE
};

tpr_status tpr_scale_hw_preset(const char *gpu, const char *network, tpr_scale_hw *out) {
  *out = (tpr_scale_hw){0};
  if (!gpu || strcmp(gpu, "h100"))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "scale: unknown --gpu '%s' (h100; or cpu with --calibration DIR)",
                    gpu ? gpu : "");
  if (!network) network = "ib-400g";
  int nw = -1;
  for (int i = 0; i < (int)(sizeof networks / sizeof networks[0]); i++)
    if (!strcmp(network, networks[i].name)) nw = i;
  if (nw < 0) return TPR_FAIL(TPR_ERR_INVALID_ARG, "scale: unknown --network '%s' (ib-400g, ib-200g, roce-100g)", network);
  snprintf(out->name, sizeof out->name, "h100+%s", network);
  out->gemm_flops = h100_flops, out->mem_bw = h100_hbm, out->ranks_per_node = 8;
  out->param_bytes = 2, out->act_bytes = 2;
  // Kernel launches and the host loop: a few ms per training step, ~1 ms per
  // decode step with CUDA graphs (assumed, not measured).
  out->t_fixed[TPR_WL_TRAIN] = 5e-3, out->t_fixed[TPR_WL_PREFILL] = 2e-3, out->t_fixed[TPR_WL_DECODE] = 1e-3;
  double ib = networks[nw].gbit / 8 * 1e9 * 0.8;
  for (int k = 0; k < TPR_COLL_COUNT; k++) {
    out->intra[k] = (tpr_ab){.alpha = 10e-6, .beta = 1 / nvlink_bw, .points = 1};
    out->inter[k] = (tpr_ab){.alpha = networks[nw].alpha, .beta = 1 / ib, .points = 1};
  }
  return TPR_OK;
}

static cJSON *ab_json(const tpr_ab *ab) {
  cJSON *a = cJSON_CreateObject();
  cJSON_AddNumberToObject(a, "alpha_s", ab->alpha);
  cJSON_AddNumberToObject(a, "beta_s_per_byte", ab->beta);
  cJSON_AddNumberToObject(a, "rms_rel_residual", ab->rms_rel);
  cJSON_AddNumberToObject(a, "points", ab->points);
  if (ab->split > 0) {
    cJSON_AddNumberToObject(a, "split_bytes", ab->split);
    cJSON_AddNumberToObject(a, "alpha_large_s", ab->alpha_large);
    cJSON_AddNumberToObject(a, "beta_large_s_per_byte", ab->beta_large);
  }
  return a;
}

tpr_status tpr_scale_hw_write(const char *path, const tpr_scale_hw *hw) {
  cJSON *j = cJSON_CreateObject(), *intra = cJSON_CreateObject(), *inter = cJSON_CreateObject(),
        *fixed = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "name", hw->name);
  cJSON_AddNumberToObject(j, "gemm_flops", hw->gemm_flops);
  cJSON_AddNumberToObject(j, "mem_bw", hw->mem_bw);
  cJSON_AddNumberToObject(j, "mem_bw_node", hw->mem_bw_node);
  cJSON_AddNumberToObject(j, "gemm_flops_busy", hw->gemm_flops_busy);
  cJSON_AddNumberToObject(j, "cores", hw->cores);
  cJSON_AddNumberToObject(j, "ranks_per_node", hw->ranks_per_node);
  cJSON_AddNumberToObject(j, "param_bytes", hw->param_bytes);
  cJSON_AddNumberToObject(j, "act_bytes", hw->act_bytes);
  for (int w = 0; w < 3; w++) cJSON_AddNumberToObject(fixed, tpr_workload_name((tpr_workload)w), hw->t_fixed[w]);
  cJSON_AddItemToObject(j, "t_fixed_s", fixed);
  cJSON *eta = cJSON_CreateObject();
  for (int w = 0; w < 3; w++) cJSON_AddNumberToObject(eta, tpr_workload_name((tpr_workload)w), hw->roofline_factor[w]);
  cJSON_AddItemToObject(j, "roofline_factor", eta);
  for (int k = 0; k < TPR_COLL_COUNT; k++) {
    if (hw->intra[k].points) cJSON_AddItemToObject(intra, tpr_coll_name((tpr_coll)k), ab_json(&hw->intra[k]));
    if (hw->inter[k].points) cJSON_AddItemToObject(inter, tpr_coll_name((tpr_coll)k), ab_json(&hw->inter[k]));
  }
  cJSON *by = cJSON_CreateObject();
  for (int k = 0; k < TPR_COLL_COUNT; k++) {
    cJSON *op = NULL;
    for (int g = 2; g < TPR_SCALE_FIT_RANKS; g++) {
      if (!hw->by_ranks[k][g].points) continue;
      if (!op) op = cJSON_AddObjectToObject(by, tpr_coll_name((tpr_coll)k));
      char key[8];
      snprintf(key, sizeof key, "%d", g);
      cJSON_AddItemToObject(op, key, ab_json(&hw->by_ranks[k][g]));
    }
  }
  cJSON_AddItemToObject(j, "by_ranks", by);
  cJSON *sync = cJSON_CreateObject();  // per workload, per group size
  for (int w = 0; w < 3; w++) {
    cJSON *per = cJSON_AddObjectToObject(sync, tpr_workload_name((tpr_workload)w));
    for (int g = 2; per && g < TPR_SCALE_FIT_RANKS; g++)
      if (hw->t_sync[w][g] > 0) {
        char key[8];
        snprintf(key, sizeof key, "%d", g);
        cJSON_AddNumberToObject(per, key, hw->t_sync[w][g]);
      }
  }
  cJSON_AddItemToObject(j, "t_sync_s", sync);
  cJSON_AddStringToObject(j, "calibration_points", hw->sync_on_tp ? "np1+tp" : "np1");
  cJSON_AddItemToObject(j, "intra", intra);
  cJSON_AddItemToObject(j, "inter", inter);
  char *text = cJSON_Print(j);
  cJSON_Delete(j);
  FILE *f = text ? fopen(path, "w") : NULL;
  bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  if (f && fclose(f)) ok = false;
  free(text);
  return ok ? TPR_OK : TPR_FAIL(TPR_ERR_IO, "scale: cannot write %s", path);
}

static double num(const cJSON *j, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
  return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

// A fit as ab_json writes it (files without the split: one regime).
static tpr_ab ab_of_json(const cJSON *a) {
  return (tpr_ab){.alpha = num(a, "alpha_s"), .beta = num(a, "beta_s_per_byte"), .rms_rel = num(a, "rms_rel_residual"),
                  .points = (int)num(a, "points"), .split = num(a, "split_bytes"),
                  .alpha_large = num(a, "alpha_large_s"), .beta_large = num(a, "beta_large_s_per_byte")};
}

tpr_status tpr_scale_hw_read(const char *path, tpr_scale_hw *out) {
  *out = (tpr_scale_hw){0};
  FILE *f = fopen(path, "rb");
  if (!f) return TPR_FAIL(TPR_ERR_IO, "scale: cannot open %s (write it with tpr scale model --calibrate DIR)", path);
  char *text = malloc(1 << 20);  // model.json is a few KB
  size_t len = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
  bool whole = text && feof(f);
  fclose(f);
  if (!whole) {
    free(text);
    return TPR_FAIL(TPR_ERR_FORMAT, "scale: %s is not a model.json (over 1 MiB or unreadable)", path);
  }
  text[len] = 0;
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (!j) return TPR_FAIL(TPR_ERR_FORMAT, "scale: %s is not JSON", path);
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
  snprintf(out->name, sizeof out->name, "%s", cJSON_IsString(name) ? name->valuestring : "calibrated");
  out->gemm_flops = num(j, "gemm_flops"), out->mem_bw = num(j, "mem_bw"), out->cores = num(j, "cores");
  out->mem_bw_node = num(j, "mem_bw_node"), out->gemm_flops_busy = num(j, "gemm_flops_busy");  // 0 when absent
  out->ranks_per_node = (int)num(j, "ranks_per_node");
  const cJSON *cp = cJSON_GetObjectItemCaseSensitive(j, "calibration_points");
  out->sync_on_tp = cJSON_IsString(cp) && !strcmp(cp->valuestring, "np1+tp");
  out->param_bytes = (int)num(j, "param_bytes"), out->act_bytes = (int)num(j, "act_bytes");
  const cJSON *fixed = cJSON_GetObjectItemCaseSensitive(j, "t_fixed_s");
  for (int w = 0; w < 3; w++) out->t_fixed[w] = num(fixed, tpr_workload_name((tpr_workload)w));
  const cJSON *eta = cJSON_GetObjectItemCaseSensitive(j, "roofline_factor");  // absent in older files: 1
  for (int w = 0; w < 3; w++) out->roofline_factor[w] = num(eta, tpr_workload_name((tpr_workload)w));
  const char *sides[2] = {"intra", "inter"};
  for (int s = 0; s < 2; s++) {
    const cJSON *side = cJSON_GetObjectItemCaseSensitive(j, sides[s]);
    for (int k = 0; k < TPR_COLL_COUNT; k++) {
      const cJSON *a = cJSON_GetObjectItemCaseSensitive(side, tpr_coll_name((tpr_coll)k));
      if (!a) continue;
      tpr_ab *ab = s ? &out->inter[k] : &out->intra[k];
      *ab = ab_of_json(a);
    }
  }
  const cJSON *by = cJSON_GetObjectItemCaseSensitive(j, "by_ranks"), *sync = cJSON_GetObjectItemCaseSensitive(j, "t_sync_s");
  for (int w = 0; w < 3; w++)
    for (int g = 2; g < TPR_SCALE_FIT_RANKS; g++) {
      char key[8];
      snprintf(key, sizeof key, "%d", g);
      out->t_sync[w][g] = num(cJSON_GetObjectItemCaseSensitive(sync, tpr_workload_name((tpr_workload)w)), key);
    }
  for (int k = 0; k < TPR_COLL_COUNT; k++)
    for (int g = 2; g < TPR_SCALE_FIT_RANKS; g++) {
      char key[8];
      snprintf(key, sizeof key, "%d", g);
      const cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(by, tpr_coll_name((tpr_coll)k)), key);
      if (a)
        out->by_ranks[k][g] = ab_of_json(a);
    }
  cJSON_Delete(j);
  if (!(out->gemm_flops > 0) || !(out->mem_bw > 0) || out->ranks_per_node < 1)
    return TPR_FAIL(TPR_ERR_FORMAT, "scale: %s lacks gemm_flops, mem_bw or ranks_per_node", path);
  return TPR_OK;
}
