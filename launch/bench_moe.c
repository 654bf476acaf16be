// tpr bench moe: one MoE layer of a config's shapes (hidden H, E experts,
// top-k, expert width F) with random f32 weights made in memory, run with
// both dispatchers of models/layers/moe.h side by side (allreduce only when
// dp = 1, as it needs every rank to hold the same tokens).
//
// Every rank holds the same router (gate (E, H), bias (E)) and its own local
// experts (w13 (Er, 2Fr, H), w2 (Er, H, Fr)); x (T, H) is N(0, 1), the same
// on the ranks of a dp replica and different across replicas, and the router
// runs inside the program (router_sigmoid_topk(x @ gate^T, bias)), so with
// gate ~ N(0, 1/H) the routing is random and roughly uniform, as a trained
// router's is on average. A first run learns the rows each rank exchanges
// and each local expert runs (routing is the same on every run); then
// --warmup untimed and --iters timed cycles, each a list of blocks started
// after a world barrier: per dispatcher the layer (tpr_exec_run, per-node
// profiling on), the baseline all_to_all and the dispatch's all_to_allv
// alone (alltoall, ep > 1), and the baseline sgemm pairs. Odd cycles run the blocks in reverse order, so load from the
// rest of the machine falls on the layer and its baselines alike.
// bench_moe_report.c turns the times into per-iteration means, max over
// ranks, and prints the rates and ratios (definitions in its header comment).
#include "launch/bench_moe.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/args.h"
#include "launch/bench_moe_impl.h"
#include "launch/cli_util.h"
#include "runtime/rng.h"

// ---- setup -------------------------------------------------------------------

// Fills the mesh sizes left at 0: dp 1, tp = world/dp, ep = world, etp = world/ep.
static tpr_status resolve_mesh(int world, int64_t *tp, int64_t *dp, int64_t *ep, int64_t *etp) {
  int64_t *v[4] = {tp, dp, ep, etp};
  const char *names[4] = {"--tp", "--dp", "--ep", "--etp"};
  for (int i = 0; i < 4; i++)
    if (*v[i] < 0 || *v[i] > world)
      return TPR_FAIL(TPR_ERR_INVALID_ARG, "%s %lld: must be in [1, %d] (the world: mpirun -np)", names[i],
                      (long long)*v[i], world);
  if (!*dp) *dp = *tp && world % *tp == 0 ? world / *tp : 1;
  if (!*tp) *tp = world % *dp == 0 ? world / *dp : 0;
  if (*tp * *dp != world)
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--tp %lld x --dp %lld must equal the world of %d ranks (mpirun -np)",
                    (long long)*tp, (long long)*dp, world);
  if (!*ep) *ep = world;
  if (!*etp) *etp = world % *ep == 0 ? world / *ep : 0;
  if (*etp < 1 || world % (*ep * *etp))
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "--ep %lld x --etp %lld must divide the world of %d ranks", (long long)*ep,
                    (long long)*etp, world);
  return TPR_OK;
}

// What bad flags can break: the config, the mesh, the plan (experts not
// dividing over ep, width over etp), the MoE options. Exit 2 on failure.
static tpr_status check_setup(bm *b, const char *config, int64_t tp, int64_t dp, int64_t ep, int64_t etp,
                              bool *have_plan) {
  tpr_model_config c;
  TPR_CHECK(tpr_model_config_load(config, &c));
  TPR_CHECK(resolve_mesh(b->w->size, &tp, &dp, &ep, &etp));
  TPR_CHECK(tpr_mesh_init(b->w->size, b->w->rank, (int)tp, (int)ep, (int)etp, &b->mesh));
  TPR_CHECK(tpr_shard_plan_build(&c, (int)tp, (int)ep, (int)etp, (int)dp, TPR_F32, &b->plan));
  *have_plan = true;
  b->opts.dispatch = TPR_MOE_DISPATCH_ALLTOALL;
  TPR_CHECK(tpr_moe_opts_check(&b->opts, &b->plan));
  b->H = c.hidden_size, b->E = c.num_experts, b->k = c.experts_per_tok;
  b->Er = b->plan.experts_per_rank, b->Fr = b->plan.expert_inter_per_rank;
  return TPR_OK;
}

static tpr_status random_tensor(bm *b, int ndim, const int64_t *shape, uint64_t stream, double scale,
                                tpr_tensor **out) {
  TPR_CHECK(tpr_tensor_new(b->w->cpu, TPR_F32, ndim, shape, out));
  tpr_rng r = {b->seed * 0x9e3779b97f4a7c15ull + stream * 0xd1b54a32d192ed03ull};
  tpr_rng_fill_normal(&r, tpr_tensor_data(*out), (size_t)tpr_tensor_numel(*out), scale);
  return TPR_OK;
}

// Shared router, this replica's x, this rank's experts.
static tpr_status make_tensors(bm *b) {
  const int64_t H = b->H, Er = b->Er, Fr = b->Fr;
  TPR_CHECK(tpr_mesh_rank_tensor(&b->mesh, b->w->cpu, &b->rank));
  TPR_CHECK(random_tensor(b, 2, (const int64_t[]){b->T, H}, 16 + (uint64_t)b->mesh.dp_rank, 1.0, &b->x));
  TPR_CHECK(random_tensor(b, 2, (const int64_t[]){b->E, H}, 1, 1.0 / sqrt((double)H), &b->gate));
  TPR_CHECK(random_tensor(b, 1, (const int64_t[]){b->E}, 2, 1e-3, &b->bias));
  uint64_t mine = 1u << 20 | (uint64_t)b->w->rank << 1;
  TPR_CHECK(random_tensor(b, 3, (const int64_t[]){Er, 2 * Fr, H}, mine, 1.0 / sqrt((double)H), &b->w13));
  return random_tensor(b, 3, (const int64_t[]){Er, H, Fr}, mine | 1, 1.0 / sqrt((double)Fr), &b->w2);
}

static bm_cat category(tpr_op_kind op, int *a2av, int *ar, const tpr_shard_plan *plan) {
  switch (op) {
    case TPR_OP_MATMUL: case TPR_OP_ROUTER_SIGMOID_TOPK: case TPR_OP_MOE_CAPACITY: return BM_ROUTER;
    case TPR_OP_ALL_TO_ALL: return BM_DISPATCH;
    case TPR_OP_ALL_TO_ALLV: return (*a2av)++ == 0 ? BM_DISPATCH : BM_COMBINE;
    case TPR_OP_MOE_COUNTS: case TPR_OP_MOE_PERMUTE: case TPR_OP_MOE_UNPERMUTE: case TPR_OP_ROW_SLICE:
    case TPR_OP_INDEX_SELECT: return BM_PERMUTE;
    case TPR_OP_MOE_GROUPED_FFN: case TPR_OP_MOE_EXPERTS: return BM_GEMM;
    case TPR_OP_ALL_GATHER: case TPR_OP_REDUCE_SCATTER: return BM_COLL;
    case TPR_OP_ALL_REDUCE: return (*ar)++ == 0 && plan->ep > 1 ? BM_COMBINE : BM_COLL;  // moe.c: ep, then etp
    default: return BM_OTHER;
  }
}

// The layer as a program: router, then tpr_moe_build with this dispatcher.
static tpr_status build_side(bm *b, bm_side *s) {
  const int64_t T = b->T, H = b->H, E = b->E, Er = b->Er, Fr = b->Fr;
  tpr_value_id rank, x, gate, bias, w13, w2, logits, gates, y;
  tpr_moe_values v;
  TPR_CHECK(tpr_program_new(&s->p));
  tpr_program *p = s->p;
  TPR_CHECK(tpr_program_rank_param(p, &rank));
  TPR_CHECK(tpr_program_input(p, "x", TPR_F32, 2, (const int64_t[]){T, H}, &x));
  TPR_CHECK(tpr_program_param(p, "gate", TPR_F32, 2, (const int64_t[]){E, H}, &gate));
  TPR_CHECK(tpr_program_param(p, "bias", TPR_F32, 1, (const int64_t[]){E}, &bias));
  TPR_CHECK(tpr_program_param(p, "w13", TPR_F32, 3, (const int64_t[]){Er, 2 * Fr, H}, &w13));
  TPR_CHECK(tpr_program_param(p, "w2", TPR_F32, 3, (const int64_t[]){Er, H, Fr}, &w2));
  TPR_CHECK(tpr_pb_matmul(p, x, gate, false, true, &logits));  // (T, E)
  TPR_CHECK(tpr_pb_router_sigmoid_topk(p, logits, bias, (int)b->k, &gates));
  tpr_moe_opts o = b->opts;
  o.dispatch = s->dispatch;
  TPR_CHECK(tpr_moe_build(p, &b->plan, &o, 0, rank, x, gates, w13, w2, &y, &v));
  TPR_CHECK(tpr_program_output(p, y, "y"));
  TPR_CHECK(tpr_program_output(p, v.gates, "gates"));
  if (v.gates != gates) TPR_CHECK(tpr_program_output(p, gates, "router"));
  if (v.send_counts >= 0) TPR_CHECK(tpr_program_output(p, v.send_counts, "send_counts"));
  if (v.recv_counts >= 0 && v.recv_counts != v.send_counts)
    TPR_CHECK(tpr_program_output(p, v.recv_counts, "recv_counts"));
  int n = tpr_program_num_nodes(p), a2av = 0, ar = 0;
  if (!(s->cat = malloc((size_t)(n > 0 ? n : 1) * sizeof *s->cat)) || !(s->ne = calloc((size_t)Er, sizeof *s->ne)))
    return TPR_FAIL(TPR_ERR_OOM, "bench moe: node categories");
  for (int i = 0; i < n; i++) s->cat[i] = category(tpr_program_node_op(p, i), &a2av, &ar, &b->plan);
  TPR_CHECK(tpr_exec_new(p, b->w->cpu, &s->e));
  tpr_exec_set_collectives(s->e, &b->hook);
  const char *names[6] = {TPR_RANK_PARAM, "x", "gate", "bias", "w13", "w2"};
  const tpr_tensor *t[6] = {b->rank, b->x, b->gate, b->bias, b->w13, b->w2};
  for (int i = 0; i < 6; i++) TPR_CHECK(tpr_exec_bind(s->e, names[i], t[i]));
  return TPR_OK;
}

// An (n) output of the last run on the host (f32 or i32 alike: 4 bytes).
static tpr_status output_host(bm_side *s, const char *name, void *dst, size_t n) {
  const tpr_tensor *t;
  TPR_CHECK(tpr_exec_output(s->e, name, &t));
  return tpr_tensor_to_host(t, dst, n * 4);
}

// Rows this rank exchanges and each local expert runs, from the first run.
static tpr_status learn_rows(bm *b, bm_side *s) {
  const int64_t E = b->E, Er = b->Er, T = b->T;
  if (s->dispatch == TPR_MOE_DISPATCH_ALLTOALL) {
    int32_t *c = malloc((size_t)(2 * E) * sizeof *c);
    if (!c) return TPR_FAIL(TPR_ERR_OOM, "bench moe: counts");
    tpr_status rc = output_host(s, "send_counts", c, (size_t)E);
    if (rc == TPR_OK) rc = output_host(s, b->plan.ep > 1 ? "recv_counts" : "send_counts", c + E, (size_t)E);
    const int ep = b->plan.ep;
    if (rc == TPR_OK && !(b->xv = calloc(4 * (size_t)ep, sizeof *b->xv))) rc = TPR_FAIL(TPR_ERR_OOM, "bench moe");
    for (int64_t i = 0; rc == TPR_OK && i < E; i++) {
      s->send_rows += c[i], s->recv_rows += c[E + i];
      s->ne[i % Er] += c[E + i];  // recv_counts: (ep source, Er)
      b->xv[i / Er] += (size_t)c[i] * (size_t)b->H;  // elements to / from peer i / Er
      b->xv[2 * ep + i / Er] += (size_t)c[E + i] * (size_t)b->H;
    }
    for (int j = 1; rc == TPR_OK && j < ep; j++) {  // displacements: blocks packed in peer order
      b->xv[ep + j] = b->xv[ep + j - 1] + b->xv[j - 1];
      b->xv[3 * ep + j] = b->xv[3 * ep + j - 1] + b->xv[2 * ep + j - 1];
    }
    free(c);
    TPR_CHECK(rc);
  } else {  // moe_experts runs the tokens whose gate for a local expert is nonzero
    float *g = malloc((size_t)(T * E) * sizeof *g);
    if (!g) return TPR_FAIL(TPR_ERR_OOM, "bench moe: gates");
    tpr_status rc = output_host(s, "gates", g, (size_t)(T * E));
    for (int64_t t = 0; rc == TPR_OK && t < T; t++)
      for (int64_t e = 0; e < Er; e++) s->ne[e] += g[t * E + b->mesh.ep_rank * Er + e] != 0.0f;
    free(g);
    TPR_CHECK(rc);
  }
  for (int64_t e = 0; e < Er; e++) s->gemm_rows += s->ne[e];
  return TPR_OK;
}

// This replica's routing, counted once per replica (its tp rank 0).
static tpr_status count_routing(bm *b) {
  const int64_t T = b->T, E = b->E;
  TPR_CHECK(tpr_moe_stats_init(&b->stats, 1, E, b->plan.ep));
  if (b->mesh.tp_rank != 0) return TPR_OK;
  bool capacity = b->opts.capacity_factor > 0;
  float *g = malloc((size_t)(2 * T * E) * sizeof *g);
  if (!g) return TPR_FAIL(TPR_ERR_OOM, "bench moe: gates");
  tpr_status rc = output_host(&b->side[0], "gates", g, (size_t)(T * E));
  if (rc == TPR_OK && capacity) rc = output_host(&b->side[0], "router", g + T * E, (size_t)(T * E));
  if (rc == TPR_OK) tpr_moe_stats_add(&b->stats, 0, capacity ? g + T * E : NULL, g, T);
  free(g);
  return rc;
}

// Baseline buffers: the all_to_all at the layer's mean bytes per rank, and
// the sgemm operands for the busiest local expert.
static tpr_status make_baselines(bm *b) {
  int64_t rows = b->side[0].recv_rows, most = 1;
  TPR_CHECK(tpr_comm_all_reduce(b->w->host, &rows, &rows, 1, TPR_I64, TPR_SUM));
  double bytes = (double)rows * (double)b->H * 4.0 / b->w->size;
  b->a2a_count = (size_t)ceil(bytes / b->plan.ep / 4.0);
  if (b->a2a_count < 1) b->a2a_count = 1;
  for (int i = 0; i < b->n_sides; i++)
    for (int64_t e = 0; e < b->Er; e++) most = b->side[i].ne[e] > most ? b->side[i].ne[e] : most;
  size_t a2a = b->a2a_count * (size_t)b->plan.ep, H = (size_t)b->H, F = (size_t)b->Fr, m = (size_t)most;
  size_t xs = (size_t)b->side[0].send_rows * H + 1, xr = (size_t)b->side[0].recv_rows * H + 1;
  float **buf[8] = {&b->a2a_send, &b->a2a_recv, &b->ga, &b->gc, &b->ga2, &b->gc2, &b->x_send, &b->x_recv};
  size_t len[8] = {a2a, a2a, m * H, m * 2 * F, m * F, m * H, xs, xr};
  tpr_rng r = {b->seed ^ 0x5bd1e995u ^ (uint64_t)b->w->rank << 32};
  for (int i = 0; i < 8; i++) {
    if (!(*buf[i] = malloc(len[i] * sizeof(float))))
      return TPR_FAIL(TPR_ERR_OOM, "bench moe: baseline buffer of %zu floats", len[i]);
    tpr_rng_fill_normal(&r, *buf[i], len[i], 1.0);  // touches every page before timing
  }
  return TPR_OK;
}

// ---- timing ------------------------------------------------------------------

// The grouped GEMM's work as plain sgemm: for each local expert with n rows,
// (n, H) x (H, 2Fr) and (n, Fr) x (Fr, H), reading the same weights the
// layer does (row-major, used transposed as moe.c's kernel uses them).
static void sgemm_pass(const bm *b, const bm_side *s) {
  const int H = (int)b->H, F = (int)b->Fr;
  const float *w13 = tpr_tensor_data(b->w13), *w2 = tpr_tensor_data(b->w2);
  for (int64_t e = 0; e < b->Er; e++) {
    const int n = (int)s->ne[e];
    if (!n) continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, 2 * F, H, 1.0f, b->ga, H, w13 + e * 2 * F * H, H, 0.0f,
                b->gc, 2 * F);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, H, F, 1.0f, b->ga2, F, w2 + e * H * F, F, 0.0f, b->gc2,
                H);
  }
}

typedef struct block {
  bm_side *s;
  bm_cat what;  // BM_LAYER, BM_A2A or BM_SGEMM
} block;

static tpr_status run_block(bm *b, const block *k, bool timed) {
  TPR_CHECK(tpr_comm_barrier(b->w->host));
  double t0 = tpr_cli_now();
  if (k->what == BM_LAYER)
    TPR_CHECK(tpr_exec_run(k->s->e));
  else if (k->what == BM_A2A)
    TPR_CHECK(tpr_comm_all_to_all(b->comms.axis[TPR_AXIS_EP], b->a2a_send, b->a2a_recv, b->a2a_count, TPR_F32));
  else if (k->what == BM_A2AV)
    TPR_CHECK(tpr_comm_all_to_allv(b->comms.axis[TPR_AXIS_EP], b->x_send, b->xv, b->xv + b->plan.ep, b->x_recv,
                                   b->xv + 2 * b->plan.ep, b->xv + 3 * b->plan.ep, TPR_F32));
  else
    sgemm_pass(b, k->s);
  if (timed) k->s->sec[k->what] += tpr_cli_now() - t0;
  return TPR_OK;
}

static tpr_status run_cycles(bm *b) {
  block blocks[8];
  int nb = 0;
  for (int i = 0; i < b->n_sides; i++) {
    bm_side *s = &b->side[i];
    blocks[nb++] = (block){s, BM_LAYER};
    if (s->dispatch == TPR_MOE_DISPATCH_ALLTOALL && b->plan.ep > 1)
      blocks[nb++] = (block){s, BM_A2A}, blocks[nb++] = (block){s, BM_A2AV};
    blocks[nb++] = (block){s, BM_SGEMM};
  }
  for (int64_t c = 0; c < b->warmup + b->iters; c++) {
    for (int i = 0; c == b->warmup && i < b->n_sides; i++) TPR_CHECK(tpr_exec_set_profiling(b->side[i].e, true));
    for (int j = 0; j < nb; j++) TPR_CHECK(run_block(b, &blocks[c % 2 ? nb - 1 - j : j], c >= b->warmup));
  }
  for (int i = 0; i < b->n_sides; i++) {
    bm_side *s = &b->side[i];
    const double *ns = tpr_exec_node_seconds(s->e);
    for (int n = 0; ns && n < tpr_program_num_nodes(s->p); n++) {
      s->sec[s->cat[n]] += ns[n];
      if (tpr_program_node_op(s->p, n) == TPR_OP_ALL_TO_ALL) s->sec[BM_COUNTS] += ns[n];
    }
    TPR_CHECK(tpr_exec_set_profiling(s->e, false));
  }
  return TPR_OK;
}

// Both dispatchers must give the same layer output (a check of the bench).
static tpr_status compare_outputs(bm *b) {
  b->max_abs_diff = -1;
  if (b->n_sides < 2) return TPR_OK;
  size_t n = (size_t)(b->T * b->H);
  float *y = malloc(2 * n * sizeof *y), d = 0;
  if (!y) return TPR_FAIL(TPR_ERR_OOM, "bench moe: outputs");
  tpr_status rc = output_host(&b->side[0], "y", y, n);
  if (rc == TPR_OK) rc = output_host(&b->side[1], "y", y + n, n);
  for (size_t i = 0; rc == TPR_OK && i < n; i++) d = fmaxf(d, fabsf(y[i] - y[n + i]));
  free(y);
  TPR_CHECK(rc);
  TPR_CHECK(tpr_comm_all_reduce(b->w->host, &d, &d, 1, TPR_F32, TPR_MAX));
  b->max_abs_diff = d;
  return TPR_OK;
}

static tpr_status run(bm *b) {
  TPR_CHECK(tpr_mesh_comms_init(b->w->host, &b->mesh, &b->comms));
  b->have_comms = true;
  b->hook = tpr_mesh_comms_exec_hook(&b->comms);
  TPR_CHECK(make_tensors(b));
  b->side[0].dispatch = TPR_MOE_DISPATCH_ALLTOALL;
  b->side[1].dispatch = TPR_MOE_DISPATCH_ALLREDUCE;
  b->n_sides = b->plan.dp == 1 ? 2 : 1;
  for (int i = 0; i < b->n_sides; i++) {
    TPR_CHECK(build_side(b, &b->side[i]));
    TPR_CHECK(tpr_exec_run(b->side[i].e));
    TPR_CHECK(learn_rows(b, &b->side[i]));
  }
  TPR_CHECK(count_routing(b));
  TPR_CHECK(make_baselines(b));
  TPR_CHECK(run_cycles(b));
  TPR_CHECK(compare_outputs(b));
  return tpr__bm_reduce(b);
}

static void cleanup(bm *b, bool have_plan) {
  for (int i = 0; i < 2; i++) {
    bm_side *s = &b->side[i];
    tpr_exec_free(s->e);
    tpr_program_free(s->p);
    free(s->cat), free(s->ne), free(s->dispatch_rows), free(s->gemm_rows_all);
  }
  tpr_tensor *t[6] = {b->rank, b->x, b->gate, b->bias, b->w13, b->w2};
  for (int i = 0; i < 6; i++) tpr_tensor_free(t[i]);
  free(b->a2a_send), free(b->a2a_recv), free(b->ga), free(b->gc), free(b->ga2), free(b->gc2);
  free(b->xv), free(b->x_send), free(b->x_recv);
  tpr_moe_stats_free(&b->stats);
  if (b->have_comms) tpr_mesh_comms_free(&b->comms);
  if (have_plan) tpr_shard_plan_free(&b->plan);
}

// ---- flags ---------------------------------------------------------------------

static const char usage[] =
    "usage: [mpirun -np N] tpr bench moe --config FILE --random-weights [--ep E] [--tp T] [--etp F] [--dp D]\n"
    "                                    [--tokens N] [--iters K] [--warmup W] [--capacity-factor F] [--seed S] "
    "[--json]\n\n"
    "One MoE layer of the config's shapes (its router is MiniMax-M2's sigmoid top-k whatever the family) with\n"
    "random f32 weights, N tokens per dp replica, run with both dispatchers (allreduce only when dp = 1).\n"
    "Columns, per dispatcher: layer ms (wall time of a run); dispatch ms (counts all_to_all + first all_to_allv)\n"
    "and GB/s = rows a rank receives x H x 4 B / time; combine ms (the reverse all_to_allv; allreduce: the\n"
    "all_reduce over ep) and GB/s; grouped GEMM GFLOP/s = 6 H Fr per expert row / time; vs all_to_all busbw:\n"
    "the exchange's busbw (bytes a rank sends / time x (ep-1)/ep) over tpr_comm_all_to_all's at the same bytes\n"
    "per rank; vs sgemm: the grouped GEMM rate over plain cblas_sgemm at the same per-expert shapes. Times are\n"
    "per-iteration means, the max over ranks; bytes and FLOPs are means over ranks. Both baselines run in the\n"
    "same cycles as the layer, in alternating order.";

int tpr_bench_moe(int argc, char **argv) {
  const char *config = NULL;
  int64_t tp = 0, dp = 0, ep = 0, etp = 0, tokens = 512, iters = 20, warmup = 3, seed = 1;
  double capacity = 0;
  bool random_weights = false, reroute = false, json = false;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  const tpr_arg args[] = {
      {"config", TPR_ARG_STR, &config, "model config.json (a file, or a directory holding one)"},
      {"random-weights", TPR_ARG_FLAG, &random_weights, "random f32 weights made in memory (required)"},
      {"ep", TPR_ARG_INT, &ep, "expert-parallel degree (default: the world)"},
      {"tp", TPR_ARG_INT, &tp, "tensor-parallel degree of the tokens' replicas (default world / dp)"},
      {"etp", TPR_ARG_INT, &etp, "expert tensor-parallel degree (default world / ep)"},
      {"dp", TPR_ARG_INT, &dp, "data-parallel replicas; world = dp * tp (default 1, or world / tp)"},
      {"tokens", TPR_ARG_SIZE, &tokens, "tokens per dp replica (default 512)"},
      {"iters", TPR_ARG_INT, &iters, "timed cycles (default 20)"},
      {"warmup", TPR_ARG_INT, &warmup, "untimed cycles before them (default 3)"},
      {"capacity-factor", TPR_ARG_FLOAT, &capacity, "expert capacity factor (default: dropless)"},
      {"reroute-dropped", TPR_ARG_FLAG, &reroute, "re-route dropped assignments (needs --capacity-factor)"},
      {"seed", TPR_ARG_INT, &seed, "seed of the weights and tokens (default 1)"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object (rank 0)"},
      TPR_WORLD_ARGS(wo),
  };
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  const char *bad = !config ? "give --config FILE (a model config.json)"
                    : !random_weights ? "give --random-weights (the layer's weights are made in memory; no "
                                        "checkpoint is read)"
                    : tokens < 1 ? "--tokens must be >= 1"
                    : iters < 1 || warmup < 0 ? "--iters must be >= 1 and --warmup >= 0"
                    : !(capacity >= 0) || isinf(capacity) ? "--capacity-factor must be a finite number >= 0"
                                                          : NULL;
  if (bad) {
    fprintf(stderr, "tpr bench moe: %s\n(tpr bench moe --help lists the options)\n", bad);
    return 2;
  }
  tpr_world w;
  if (tpr_world_init(&argc, &argv, &wo, &w) != TPR_OK) return tpr_world_fail(&w, "bench moe");
  bm b = {.w = &w, .T = tokens, .iters = iters, .warmup = warmup, .seed = (uint64_t)seed,
          .opts = {.capacity_factor = capacity, .reroute_dropped = reroute, .seed = (uint64_t)seed}};
  bool have_plan = false;
  // Bad flags fail alike on every rank; the all-reduce keeps a lone failure from hanging the others.
  tpr_status rc = check_setup(&b, config, tp, dp, ep, etp, &have_plan);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", rc != TPR_OK ? tpr_last_error() : "");
  int64_t failed[2] = {rc != TPR_OK, w.rank == 0 && rc != TPR_OK};  // anyone, rank 0
  if (w.size > 1 && tpr_comm_all_reduce(w.host, failed, failed, 2, TPR_I64, TPR_MAX) != TPR_OK)
    return tpr_world_fail(&w, "bench moe");
  if (failed[0]) {  // rank 0 says why; another rank only when rank 0 had no complaint
    if (w.rank == 0 || (rc != TPR_OK && !failed[1]))
      fprintf(stderr, "tpr bench moe: %s\n", rc != TPR_OK ? msg : "another rank rejected the flags (see its message)");
    cleanup(&b, have_plan);
    tpr_world_finish(&w);
    return 2;
  }
  rc = run(&b);
  if (rc == TPR_OK && w.rank == 0) tpr__bm_print(&b, json);
  cleanup(&b, have_plan);
  if (rc != TPR_OK) return tpr_world_fail(&w, "bench moe");
  tpr_world_finish(&w);
  return 0;
}
