// Internals of tpr bench moe shared by bench_moe.c (setup and timing) and
// bench_moe_report.c (reductions over ranks, table, JSON).
#ifndef TPR_BENCH_MOE_IMPL_H
#define TPR_BENCH_MOE_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "launch/world.h"
#include "models/layers/moe.h"
#include "models/moe_stats.h"
#include "shard/mesh_comms.h"
#include "shard/shard_plan.h"

// Time categories: the program's nodes fall in the first BM_NODE_CATS (by op
// kind), the rest are wall times measured around whole blocks.
typedef enum bm_cat {
  BM_ROUTER,    // matmul x @ gate^T, router_sigmoid_topk, moe_capacity
  BM_DISPATCH,  // counts all_to_all + the first all_to_allv (alltoall)
  BM_COMBINE,   // the second all_to_allv (alltoall); the all_reduce over ep (allreduce)
  BM_PERMUTE,   // local moves: moe_counts, moe_permute, moe_unpermute, row_slice, index_select
  BM_GEMM,      // moe_grouped_ffn (alltoall), moe_experts (allreduce)
  BM_COLL,      // tp/etp collectives: all_gather, reduce_scatter, the all_reduce over etp
  BM_OTHER,     // any other op
  BM_NODE_CATS,
  BM_LAYER = BM_NODE_CATS,  // wall time of tpr_exec_run
  BM_A2A,                   // the baseline tpr_comm_all_to_all over ep
  BM_A2AV,                  // the dispatch's all_to_allv alone (the layer's counts, after a barrier)
  BM_SGEMM,                 // the baseline sgemm pairs at the grouped GEMM's shapes
  BM_COUNTS,                // the counts all_to_all alone (also in BM_DISPATCH)
  BM_CATS
} bm_cat;

// One dispatcher's program and measurements.
typedef struct bm_side {
  tpr_moe_dispatch dispatch;
  tpr_program *p;
  tpr_exec *e;
  bm_cat *cat;             // (nodes) category of each node
  int64_t *ne;             // (Er) rows each local expert runs on this rank
  int64_t gemm_rows;       // sum of ne
  int64_t send_rows, recv_rows;  // this rank's exchange rows (alltoall; 0 for allreduce)
  double sec[BM_CATS];     // this rank's totals; after bm_reduce per-iteration means, max over ranks
  double sec_min[BM_CATS]; // after bm_reduce: the same, min over ranks (the exchange of the last rank to
                           // arrive waits for no one: about the transfer alone)
  // After bm_reduce (same on every rank):
  int64_t *dispatch_rows;  // (world) recv_rows of every rank
  int64_t *gemm_rows_all;  // (world) gemm_rows of every rank
  double mean_dispatch_rows, mean_gemm_rows;
} bm_side;

typedef struct bm {
  tpr_world *w;
  tpr_shard_plan plan;
  tpr_mesh mesh;
  tpr_mesh_comms comms;
  bool have_comms;
  tpr_exec_collectives hook;  // the programs' collectives over comms
  tpr_moe_opts opts;
  int64_t T, H, E, Er, Fr, k, iters, warmup;
  uint64_t seed;
  tpr_tensor *rank, *x, *gate, *bias, *w13, *w2;
  size_t a2a_count;          // f32 per peer of the baseline all_to_all
  float *a2a_send, *a2a_recv;
  size_t *xv;                // (4 ep) the dispatch's send counts, displs, recv counts, displs (f32)
  float *x_send, *x_recv;    // its buffers
  float *ga, *gc, *ga2, *gc2;  // sgemm baseline: (rows, H), (rows, 2Fr), (rows, Fr), (rows, H)
  bm_side side[2];           // [0] alltoall, [1] allreduce (when dp = 1)
  int n_sides;
  tpr_moe_stats stats;       // routing of every dp replica (summed)
  double max_abs_diff;       // |y_allreduce - y_alltoall|, max over ranks (-1: not compared)
} bm;

// Per-iteration means, max over ranks, of every side; rows gathered; the
// routing statistics summed over the dp replicas. Collective.
tpr_status tpr__bm_reduce(bm *b);
// The table or (json) one object, on the calling rank.
void tpr__bm_print(const bm *b, bool json);

#endif
