// Which dtype each weight of a session is held in (engine/session.h,
// weight_dtype). Matrices -- the projections, the experts, the router, the
// embedding and the lm head -- may stay in their checkpoint's bf16, and the
// projections, the router and the experts in their block-scaled FP8: the CPU
// kernels read them as they are and widen in registers, so a decode step
// reads half (a quarter) of the bytes. Vectors (norms, biases) are always
// f32: they are small and feed element-wise kernels that take f32 only. The
// embedding and the lm head take no FP8 (their kernels read f32 or bf16).
#include "engine/weight_dtype.h"

#include <string.h>

tpr_status tpr_weight_dtype_parse(const char *name, tpr_dtype *out) {
  if (!name || !strcmp(name, "auto")) *out = TPR_LOAD_SOURCE_DTYPE;
  else if (!strcmp(name, "f32")) *out = TPR_F32;
  else if (!strcmp(name, "bf16")) *out = TPR_BF16;
  else
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--weight-dtype %s: expected auto, f32 or bf16", name);
  return TPR_OK;
}

const char *tpr_weight_dtype_name(tpr_dtype dt) {
  return dt == TPR_LOAD_SOURCE_DTYPE ? "auto" : tpr_dtype_name(dt);
}

// The checkpoint's dtype of plan kind k: that of its first item (a kind this
// rank holds no item of is left f32). Block-scaled FP8 reads as f32 here:
// widened with its scales it is exact only in f32.
static bool source_dtype(const tpr_loader *l, int k, tpr_dtype *out) {
  for (int64_t i = 0; i < tpr_loader_count(l); i++) {
    const tpr_load_item *it = tpr_loader_item(l, i);
    if (it->kind != k) continue;
    *out = tpr_loader_kind_fp8(l, k) ? TPR_F32 : tpr_loader_item_dtype(l, it);
    return true;
  }
  return false;
}

static bool fp8_capable(const tpr_shard_tensor *t) {
  return !strstr(t->name, "embed_tokens") && !strstr(t->name, "lm_head");
}

static int gcd(int a, int b) {
  while (b) {
    int t = a % b;
    a = b, b = t;
  }
  return a;
}

tpr_status tpr_weight_dtypes(const tpr_loader *l, const tpr_shard_plan *plan, tpr_dtype want, bool host_kernels,
                             const char *const *expert_kinds, tpr_dtype *kind_dt, int *kind_block) {
  if (want != TPR_F32 && want != TPR_BF16 && want != TPR_LOAD_SOURCE_DTYPE)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "weight dtype %s: expected auto, f32 or bf16", tpr_dtype_name(want));
  if (want == TPR_BF16 && !host_kernels)
    return TPR_FAIL(TPR_ERR_UNSUPPORTED, "--weight-dtype bf16: only the CPU backend's kernels read bf16 weights; "
                    "use --weight-dtype f32 (or auto) with this device");
  int found[3] = {-1, -1, -1};
  for (int k = 0; k < plan->n_tensors; k++)
    for (int j = 0; j < 3; j++)
      if (strstr(plan->tensors[k].name, expert_kinds[j])) found[j] = k;
  // The session stacks a layer's gate, up and down experts into w13 and w2,
  // and the expert ops take one scale block: FP8 only when all three are,
  // at the block all three allow.
  int eblock = 128;
  bool all_fp8 = true;
  for (int j = 0; j < 3; j++)
    if (found[j] >= 0) {
      all_fp8 &= kind_block[found[j]] > 0;
      eblock = gcd(eblock, kind_block[found[j]]);
    }
  if (!all_fp8 || eblock < 16) eblock = 0;
  for (int j = 0; j < 3; j++)
    if (found[j] >= 0) kind_block[found[j]] = eblock;
  for (int k = 0; k < plan->n_tensors; k++) {
    tpr_dtype src = TPR_F32;
    kind_dt[k] = TPR_F32;
    bool keep_fp8 = want == TPR_LOAD_SOURCE_DTYPE && kind_block[k] > 0 && fp8_capable(&plan->tensors[k]);
    if (plan->tensors[k].ndim != 2 || !host_kernels || want == TPR_F32 || !keep_fp8) kind_block[k] = 0;
    if (plan->tensors[k].ndim != 2 || !host_kernels || want == TPR_F32) continue;
    if (keep_fp8) kind_dt[k] = TPR_F8E4M3;
    else if (want == TPR_BF16 || (source_dtype(l, k, &src) && src == TPR_BF16)) kind_dt[k] = TPR_BF16;
  }
  // One dtype for the three expert kinds (f32 unless all are bf16 or FP8).
  tpr_dtype e = found[0] >= 0 ? kind_dt[found[0]] : TPR_F32;
  for (int j = 0; j < 3; j++)
    if (found[j] >= 0 && kind_dt[found[j]] != e) e = TPR_F32;
  for (int j = 0; j < 3; j++)
    if (found[j] >= 0) {
      kind_dt[found[j]] = e;
      if (e != TPR_F8E4M3) kind_block[found[j]] = 0;
    }
  return TPR_OK;
}
