// The step-time model: a roofline for compute plus alpha-beta terms for the
// collectives one step of a mesh issues (docs/scale.md derives the counts).
//
//   t_step = s * (t_fixed + eta * max(flops / gemm_rate, bytes / mem_bw)) + sum_c count_c * t_ab(c)
// where, with a = min(ranks on the node, cores) ranks running at once,
// mem_bw = min(the solo rate, the node's / a) and gemm_rate goes from the
// solo rate (a = 1) to the all-cores-busy rate (a = cores), linearly in a
//
// flops and bytes are per rank; s = max(1, ranks_per_node / cores) is the
// oversubscription of a node (ranks sharing cores run their compute in turn);
// eta (the roofline factor, by default) or t_fixed (a cost per step) is
// what a single-rank run takes beyond its roofline, calibrated on them. Communication is not overlapped
// with compute (FSDP's prefetch hides some: the model is an upper bound there).
#ifndef TPR_SCALE_STEPMODEL_H
#define TPR_SCALE_STEPMODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "scale/alphabeta.h"

typedef struct tpr_scale_config {  // the model dimensions the counts need
  int64_t hidden, layers, heads, kv_heads, head_dim, expert_ffn, experts, top_k, vocab;
} tpr_scale_config;

// Reads a Hugging Face config.json (MiniMax-M2 field names).
tpr_status tpr_scale_config_read(const char *path, tpr_scale_config *out);

typedef struct tpr_scale_mesh {
  int world, tp, dp, ep, etp;  // world = dp*tp = edp*ep*etp
  bool fsdp;                   // training with dp > 1 (tpr train's default)
} tpr_scale_mesh;

// Fills dp and etp from world, tp, ep (0: defaults as tpr: tp = world/dp,
// ep 1, etp world/ep) and checks the products; TPR_ERR_INVALID_ARG otherwise.
tpr_status tpr_scale_mesh_resolve(tpr_scale_mesh *m);

typedef enum tpr_workload { TPR_WL_TRAIN, TPR_WL_PREFILL, TPR_WL_DECODE } tpr_workload;
const char *tpr_workload_name(tpr_workload w);
int tpr_workload_from_name(const char *name);  // -1 if unknown

typedef struct tpr_scale_work {
  tpr_workload kind;
  int64_t tokens;   // per replica per step: seq*micro_batch (train), batch*prompt (prefill), batch (decode)
  int64_t context;  // attention context per token (train/prefill: seq/2 on average; decode: prompt + gen/2)
  int64_t samples;  // rows whose logits are computed (inference: batch; train: tokens)
} tpr_scale_work;

#define TPR_SCALE_FIT_RANKS 17  // group sizes 2..16
typedef struct tpr_scale_hw {
  char name[32];
  double gemm_flops;    // per rank, achieved (FLOP/s)
  double mem_bw;        // per rank (bytes/s), the rank streaming alone
  double cores;         // per node, as ranks see them (oversubscription); 0: never oversubscribed
  // Measured with every core of the node busy (one rank each; 0: unknown,
  // then the solo rates hold at any rank count): the node's streaming read
  // bandwidth, which its ranks share, and a rank's GEMM rate then.
  double mem_bw_node, gemm_flops_busy;
  int ranks_per_node;   // groups inside a node use `intra`, across nodes `inter`
  double t_fixed[3];    // per workload, seconds per step (calibrated; 0 under the work-proportional fit)
  // Per workload, the factor on the roofline time: the measured single-rank
  // step over its roofline (kernels below peak, elementwise ops, attention:
  // costs that shrink with each rank's share of the work). 0 reads as 1.
  double roofline_factor[3];
  int param_bytes;      // weight element size in compute (4 f32 on the cpu, 2 bf16 on GPUs)
  int act_bytes;        // activation element size in the collectives
  tpr_ab intra[TPR_COLL_COUNT], inter[TPR_COLL_COUNT];  // pooled over rank counts: any group size
  // Fits of one group size alone (inside a node), used for that size where
  // present: on one machine they see what the pooled latency term cannot,
  // such as ranks outnumbering cores.
  tpr_ab by_ranks[TPR_COLL_COUNT][TPR_SCALE_FIT_RANKS];
  // Per workload, seconds per collective call of a step at this many ranks
  // on one node, beyond its alpha-beta time: the wait for a peer that is not
  // running (ranks sharing cores, other load), which back-to-back bench comm
  // calls do not see. Per workload because the wait depends on the compute
  // between calls (a decode step's segments are far shorter than a training
  // step's). Calibrated on measured steps (tpr scale model); 0 in presets.
  double t_sync[3][TPR_SCALE_FIT_RANKS];
  bool sync_on_tp;  // calibrated: t_sync from the tp = np meshes (else single-rank points only)
} tpr_scale_hw;

typedef struct tpr_scale_pred {
  double step_s, tokens_per_s;          // tokens_per_s: the whole world's
  double compute_s, comm_s;             // comm_s includes sync_s
  double sync_s, calls;                 // t_sync's share; collective calls per step
  double coll_s[TPR_COLL_COUNT];        // per kind, per step
  double coll_bytes[TPR_COLL_COUNT];    // nccl-tests size summed per kind, per rank per step
  double coll_calls[TPR_COLL_COUNT];
  double flops, bytes;                  // per rank per step
} tpr_scale_pred;

// The counts behind it: calls of each collective kind a step issues, with
// their sizes (exposed for the tests' hand computations).
typedef struct tpr_scale_call {
  tpr_coll op;
  int group;        // ranks in the group
  int stride;       // distance between group members in world rank order
  double size;      // nccl-tests size (bytes)
  double count;     // calls per step
} tpr_scale_call;
#define TPR_SCALE_MAX_CALLS 40
// Every call of a step: the program's (below), the trainer's statistics, and
// training's gradient sync (FSDP gathers and scatters, or DP all-reduces).
int tpr_scale_step_calls(const tpr_scale_config *c, const tpr_scale_mesh *m, const tpr_scale_work *w,
                         const tpr_scale_hw *hw, tpr_scale_call *calls);

// The calls of the step's program alone (forward, backward in training).
int tpr_scale_program_calls(const tpr_scale_config *c, const tpr_scale_mesh *m, const tpr_scale_work *w,
                            const tpr_scale_hw *hw, tpr_scale_call *calls);

tpr_status tpr_scale_predict(const tpr_scale_config *c, const tpr_scale_mesh *m, const tpr_scale_work *w,
                             const tpr_scale_hw *hw, tpr_scale_pred *out);

// Per-rank FLOPs and bytes of a step (exposed for calibration).
void tpr_scale_step_work(const tpr_scale_config *c, const tpr_scale_mesh *m, const tpr_scale_work *w,
                         const tpr_scale_hw *hw, double *flops, double *bytes);

#endif
