#include "trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/progress.h"
#include "shard/safetensors.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/clip.h"
#include "train/data.h"
#include "train/eval_windows.h"
#include "train/schedule.h"
#include "train/state.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


typedef struct loop {
  tpr_train_state *t;
  const tpr_session *s;
  tpr_comm_t world;
  const tpr_train_opts *o;
  tpr_tokens *tokens;
  tpr_data *data;
  tpr_tokens *eval;   // --eval-data (NULL: none)
  int64_t eval_nw;    // its windows
  tpr_adamw_state *adam;  // (params)
  int n_params;
  int32_t *inputs, *targets;  // (seq_len)
  // Packed data with document offsets: the current window's document starts
  // (seq_len + 1), for training and for validation; NULL: the EOS rule.
  uint8_t *starts, *eval_starts;
  const tpr_mesh *mesh;
  tpr_progress bar;   // rank 0's progress line (drawn only on a terminal)
} loop;

// The document starts of the window just read, handed to the state (packed
// data with offsets only).
static tpr_status window_starts(loop *l, int64_t step, int m, int dpr, int b) {
  if (l->starts) TPR_CHECK(tpr_data_window_starts(l->data, step, m, dpr, b, l->starts));
  tpr_train_set_doc_starts(l->t, l->starts);
  return TPR_OK;
}

// N: the learned targets of the whole step, every micro-step of every dp
// replica. The data order is a pure function of (step, micro, replica, row)
// (train/data.h), so each rank counts the other replicas' rows itself and
// no collective is needed.
static tpr_status step_kept(loop *l, int64_t step, int64_t *n) {
  const tpr_train_opts *o = l->o;
  *n = 0;
  for (int64_t m = 0; m < o->grad_accum; m++)
    for (int r = 0; r < l->mesh->dp; r++)
      for (int64_t b = 0; b < o->micro_batch; b++) {
        TPR_CHECK(tpr_data_window(l->data, step, (int)m, r, (int)b, l->inputs, l->targets));
        TPR_CHECK(window_starts(l, step, (int)m, r, (int)b));
        *n += tpr_train_scored(l->t, l->inputs, l->targets);  // learned: not -100, not after an EOS under --pack
      }
  return TPR_OK;
}

// The rank's sequences of one step: micro-steps x rows, each a forward +
// backward of its mean loss over its learned targets, accumulated; the
// gradient then becomes the mean over the dp replicas
// (tpr_train_reduce_grads, or FSDP's reduce-scatter inside the program).
//   Without --sft every target is learned: each sequence's gradient is
//   accumulated with weight 1 / (accum * micro_batch), the mean over the
//   step's sequences.
//   With --sft, transformers' Trainer (with num_items_in_batch, and
//   average_tokens_across_devices across replicas): the step's loss is the
//   sum of the token losses of all its sequences on all replicas divided by
//   N, the step's learned targets (step_kept). A sequence with n learned
//   targets scales its loss by s = dp * n / N (dp: undoing the replica
//   mean), so micro-batches and replicas with fewer learned tokens weigh
//   less and a sequence with none weighs 0 (its mean loss is 0, never NaN);
//   a step with N = 0 has a zero gradient (transformers would divide 0 by
//   0). s differs between replicas, so it seeds the backward
//   (tpr_train_sequence_scaled), before FSDP mixes the replicas' gradients.
//   It scales the sequence's whole loss, the MoE aux term included.
// The reported losses are weighted alike (s, or 1 / (accum * micro_batch)).
static tpr_status forward_backward(loop *l, int64_t step, tpr_losses *sum) {
  const tpr_train_opts *o = l->o;
  double w = 1.0 / (double)(o->grad_accum * o->micro_batch);
  int64_t n_step = 0;
  *sum = (tpr_losses){0};
  if (o->sft) TPR_CHECK(step_kept(l, step, &n_step));
  for (int64_t m = 0; m < o->grad_accum; m++)
    for (int64_t b = 0; b < o->micro_batch; b++) {
      tpr_losses one;
      TPR_CHECK(tpr_data_window(l->data, step, (int)m, l->mesh->dp_rank, (int)b, l->inputs, l->targets));
      TPR_CHECK(window_starts(l, step, (int)m, l->mesh->dp_rank, (int)b));
      if (o->sft) {
        w = n_step ? (double)l->mesh->dp * (double)tpr_train_scored(l->t, l->inputs, l->targets) / (double)n_step : 0.0;
        TPR_CHECK(tpr_train_sequence_scaled(l->t, l->inputs, l->targets, w, 1.0, &one));
      } else {
        TPR_CHECK(tpr_train_sequence(l->t, l->inputs, l->targets, w, &one));
      }
      sum->loss += w * one.loss, sum->ce += w * one.ce, sum->aux += w * one.aux;
    }
  return TPR_OK;
}

// The replica means of this step's losses, averaged over the world (every
// tp rank of a replica holds the same values, so this is the replica mean).
static tpr_status mean_losses(loop *l, tpr_losses *v) {
  float x[3] = {(float)v->loss, (float)v->ce, (float)v->aux};
  TPR_CHECK(tpr_comm_all_reduce(l->world, x, x, 3, TPR_F32, TPR_SUM));
  float n = (float)tpr_comm_size(l->world);
  *v = (tpr_losses){x[0] / n, x[1] / n, x[2] / n};
  return TPR_OK;
}

static const char *const collective_names[4] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};

// Seconds rank 0's program has spent in each collective kind so far (the op
// profile's totals; all 0 when not profiling). Returns whether it profiles.
static bool collective_seconds(const tpr_train_state *t, double out[4]) {
  double sec[TPR_OP_KIND_COUNT], flops, total = 0;
  int64_t runs;
  tpr_train_profile(t, sec, &runs, &flops);
  for (int k = 0; k < TPR_OP_KIND_COUNT; k++) total += sec[k];
  out[0] = sec[TPR_OP_ALL_REDUCE], out[1] = sec[TPR_OP_ALL_GATHER], out[2] = sec[TPR_OP_REDUCE_SCATTER];
  out[3] = sec[TPR_OP_ALL_TO_ALL] + sec[TPR_OP_ALL_TO_ALLV];
  return total > 0;
}

static tpr_status step_once(loop *l, int64_t step, tpr_train_step_report *r) {
  const tpr_train_opts *o = l->o;
  double coll0[4], coll1[4];
  collective_seconds(l->t, coll0);
  double t0 = now_s();
  tpr_train_zero_grads(l->t);
  tpr_losses losses;
  TPR_CHECK(tpr_comm_agree(l->world, forward_backward(l, step, &losses)));
  double t1 = now_s();
  bool profiled = collective_seconds(l->t, coll1);
  tpr_train_comm comm;
  tpr_train_comm_info(l->t, &comm);
  TPR_CHECK(tpr_train_reduce_grads(l->t));
  if (step == 0 && o->dump_grads) TPR_CHECK(tpr_comm_agree(l->world, tpr_train_write_full(l->t, true, o->dump_grads)));
  double sumsq, norm;
  float coef = 1.0f;
  TPR_CHECK(tpr_train_grad_sumsq(l->t, &sumsq));
  // clip_grad_norm_'s coefficient; with clipping off, a NaN/Inf gradient
  // still stops the run before the optimizer spreads it into the weights.
  if (o->clip > 0) {
    TPR_CHECK(tpr_clip_coef(sumsq, o->clip, step, &norm, &coef));
  } else if (!isfinite(norm = sqrt(sumsq))) {
    return TPR_FAIL(TPR_ERR_INVALID_ARG, "train: step %lld: the gradient norm is %g (a NaN or Inf gradient)",
                    (long long)step, norm);
  }
  double t2 = now_s();
  tpr_lr_schedule sch = {.lr_max = o->lr, .min_lr = o->min_lr, .warmup = o->warmup, .total = o->steps};
  float lr = tpr_lr_at(&sch, step);
  tpr_adamw_hparams h = {.beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps};
  for (int i = 0; i < l->n_params; i++) {
    const tpr_train_param *p = tpr_train_param_at(l->t, i);
    TPR_CHECK(tpr_adamw_step_scaled(p->data, p->grad, &l->adam[i], p->numel, &h, step + 1, lr,
                                    p->decay ? (float)o->weight_decay : 0.0f, coef));
  }
  tpr_train_params_updated(l->t);
  if (o->bias_update_rate > 0) TPR_CHECK(tpr_train_update_bias(l->t, o->bias_update_rate));
  TPR_CHECK(mean_losses(l, &losses));
  double dt = now_s() - t0;
  int64_t tokens = o->seq_len * o->micro_batch * o->grad_accum * tpr_session_plan(l->s)->dp;
  *r = (tpr_train_step_report){.step = step, .loss = losses.loss, .ce = losses.ce, .aux = losses.aux,
                               .grad_norm = norm, .lr = lr, .tokens_per_s = (double)tokens / dt, .ms = 1e3 * dt,
                               .ms_fwd_bwd = 1e3 * (t1 - t0), .ms_grad_sync = 1e3 * (t2 - t1),
                               .ms_optimizer = 1e3 * (now_s() - t2),
                               .gather_bytes = comm.gather_bytes, .scatter_bytes = comm.scatter_bytes,
                               .ms_gather = 1e3 * comm.gather_s, .ms_scatter = 1e3 * comm.scatter_s,
                               .ms_exposed = 1e3 * comm.exposed_s, .profiled = profiled};
  for (int k = 0; k < 4; k++) r->ms_collective[k] = 1e3 * (coll1[k] - coll0[k]);
  return TPR_OK;
}

static void report(const tpr_train_opts *o, const tpr_train_step_report *r, FILE *out) {
  if (o->json) {
    fprintf(out, "{\"step\":%lld,\"loss\":%.9g,\"ce\":%.9g,\"aux\":%.9g,\"grad_norm\":%.9g,\"lr\":%.9g,"
                 "\"tokens_per_s\":%.2f,\"ms\":%.3f,\"fwd_bwd_ms\":%.3f,\"grad_sync_ms\":%.3f,\"optimizer_ms\":%.3f,"
            "\"fsdp\":{\"all_gather_bytes\":%.0f,\"all_gather_ms\":%.3f,\"reduce_scatter_bytes\":%.0f,"
            "\"reduce_scatter_ms\":%.3f,\"exposed_ms\":%.3f}",
            (long long)r->step, r->loss, r->ce, r->aux, r->grad_norm, r->lr, r->tokens_per_s, r->ms, r->ms_fwd_bwd,
            r->ms_grad_sync, r->ms_optimizer, r->gather_bytes, r->ms_gather, r->scatter_bytes, r->ms_scatter,
            r->ms_exposed);
    if (r->profiled) {
      fprintf(out, ",\"collective_ms\":{");
      for (int k = 0; k < 4; k++) fprintf(out, "%s\"%s\":%.4f", k ? "," : "", collective_names[k], r->ms_collective[k]);
      fprintf(out, "}");
    }
    fprintf(out, "}\n");
  } else {
    fprintf(out, "step %5lld/%lld  loss %.6f  ce %.6f  aux %.6f  |g| %.4f  lr %.3e  %.0f tok/s  %.1f ms\n",
            (long long)r->step + 1, (long long)o->steps, r->loss, r->ce, r->aux, r->grad_norm, r->lr,
            r->tokens_per_s, r->ms);
  }
  fflush(out);
}

// Start-up: what every rank holds for training, measured from its live
// allocations (params incl. bf16 copies, gradient accumulators, AdamW's two
// moments) and the program's arena; rank 0 prints every rank's.
static tpr_status report_memory(loop *l, FILE *out) {
  tpr_train_memory m;
  tpr_train_memory_info(l->t, &m);
  int64_t mine[4] = {(int64_t)m.params, (int64_t)m.grads, 0, (int64_t)m.arena};
  for (int i = 0; i < l->n_params; i++) mine[2] += 2 * l->adam[i].n * (int64_t)sizeof(float);
  int n = tpr_comm_size(l->world);
  int64_t *all = malloc((size_t)(4 * n) * sizeof *all);
  if (!all) return TPR_FAIL(TPR_ERR_OOM, "memory report");
  tpr_status rc = tpr_comm_all_gather(l->world, mine, all, 4, TPR_I64);
  if (rc == TPR_OK && l->mesh->world_rank == 0) {
    static const char *const keys[4] = {"params_bytes", "grads_bytes", "optimizer_bytes", "arena_bytes"};
    if (l->o->json) {
      fprintf(out, "{\"memory\":{");
      for (int k = 0; k < 4; k++) {
        fprintf(out, "%s\"%s\":[", k ? "," : "", keys[k]);
        for (int r = 0; r < n; r++) fprintf(out, "%s%lld", r ? "," : "", (long long)all[4 * r + k]);
        fprintf(out, "]");
      }
      fprintf(out, "}}\n");
    } else {
      for (int r = 0; r < n; r++)
        fprintf(out, "memory rank %d: params %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB (16 B/param would be "
                "%.2f MiB), program arena %.2f MiB\n", r, all[4 * r] / 1048576.0, all[4 * r + 1] / 1048576.0,
                all[4 * r + 2] / 1048576.0, 4.0 * all[4 * r + 1] / 1048576.0, all[4 * r + 3] / 1048576.0);
    }
    fflush(out);
  }
  free(all);
  return rc;
}

static tpr_status score_window(void *ctx, const int32_t *ids, int64_t offset, bool keep, double *ce_sum,
                               int64_t *scored) {
  loop *l = ctx;
  tpr_losses v;
  if (l->eval_starts) TPR_CHECK(tpr_tokens_doc_starts(l->eval, offset, l->o->seq_len + 1, l->eval_starts));
  tpr_train_set_doc_starts(l->t, l->eval_starts);
  TPR_CHECK(tpr_train_eval_sequence(l->t, ids, ids + 1, &v));  // targets: the inputs shifted by one
  *scored = tpr_train_scored(l->t, ids, ids + 1);
  *ce_sum = keep ? v.ce * (double)*scored : 0;  // ce: the mean over the window's scored positions
  return TPR_OK;
}

// Validation after `step` steps: the windows `tpr eval` scores, through
// the training program (forward and its backward, whose gradients are
// dropped), reported on rank 0.
static tpr_status evaluate(loop *l, int64_t step, FILE *out) {
  double t0 = now_s();
  tpr_eval_result r;
  TPR_CHECK(tpr_eval_windows(l->world, l->mesh->tp, l->mesh->dp, l->mesh->dp_rank, l->eval, l->o->seq_len,
                             l->eval_nw, score_window, l, &r));
  double loss = r.ce_sum / (double)r.tokens, dt = now_s() - t0;
  if (l->mesh->world_rank != 0) return TPR_OK;
  tpr_progress_clear(&l->bar);
  if (l->o->json)
    fprintf(out, "{\"eval\":{\"step\":%lld,\"loss\":%.9g,\"perplexity\":%.6g,\"windows\":%lld,\"tokens\":%lld,"
            "\"seconds\":%.3f}}\n", (long long)step, loss, exp(loss), (long long)r.windows, (long long)r.tokens, dt);
  else
    fprintf(out, "eval after step %lld: mean cross-entropy %.6f nats/token (perplexity %.2f) over %lld windows of "
            "%s, %.1f s\n", (long long)step, loss, exp(loss), (long long)r.windows, l->o->eval_data, dt);
  fflush(out);
  return TPR_OK;
}

static void summarize(tpr_train_summary *sum, const tpr_train_step_report *r, int64_t first) {
  if (r->step == first + 1 && sum->steps_timed == 1) *sum = (tpr_train_summary){0};  // drop the first step
  double k = (double)sum->steps_timed, total = sum->ms_per_step * k + r->ms;
  double tokens = sum->tokens_per_s * sum->ms_per_step * 1e-3 * k + r->tokens_per_s * r->ms * 1e-3;
  sum->ms_fwd_bwd = (sum->ms_fwd_bwd * k + r->ms_fwd_bwd) / (k + 1);
  sum->ms_grad_sync = (sum->ms_grad_sync * k + r->ms_grad_sync) / (k + 1);
  sum->ms_optimizer = (sum->ms_optimizer * k + r->ms_optimizer) / (k + 1);
  sum->ms_gather = (sum->ms_gather * k + r->ms_gather) / (k + 1);
  sum->ms_scatter = (sum->ms_scatter * k + r->ms_scatter) / (k + 1);
  sum->ms_exposed = (sum->ms_exposed * k + r->ms_exposed) / (k + 1);
  sum->steps_timed++;
  sum->ms_per_step = total / (double)sum->steps_timed;
  sum->tokens_per_s = tokens / (total * 1e-3);
  sum->last_loss = r->loss;
}

tpr_status tpr_train_run(tpr_train_state *t, tpr_comm_t world, const tpr_train_opts *o, FILE *out,
                         tpr_train_summary *summary) {
  const tpr_session *s = tpr_train_state_session(t);
  tpr_train_summary local = {0};
  if (!summary) summary = &local;
  *summary = (tpr_train_summary){0};
  loop l = {.t = t, .s = s, .world = world, .o = o, .mesh = tpr_session_mesh(s)};
  l.n_params = tpr_train_num_params(t);
  int64_t first = 0;
  tpr_status rc = TPR_OK;
  l.inputs = malloc((size_t)o->seq_len * sizeof *l.inputs);
  l.targets = malloc((size_t)o->seq_len * sizeof *l.targets);
  l.adam = calloc((size_t)(l.n_params ? l.n_params : 1), sizeof *l.adam);
  if (!l.inputs || !l.targets || !l.adam) rc = TPR_FAIL(TPR_ERR_OOM, "train");
  for (int i = 0; rc == TPR_OK && i < l.n_params; i++)
    rc = tpr_adamw_state_init(&l.adam[i], tpr_train_param_at(t, i)->numel);
  tpr_data_config dc = {.seq_len = o->seq_len,
                        .micro_batch = (int)o->micro_batch,
                        .accum = (int)o->grad_accum,
                        .dp = tpr_session_plan(s)->dp,
                        .order = o->data_sequential ? TPR_DATA_SEQUENTIAL : TPR_DATA_RANDOM,
                        .seed = o->seed,
                        .masked = o->sft};
  const bool packed = tpr_train_packed(t);
  tpr_tokens_opts to = {.split = "train", .masks = o->sft, .docs = packed}, eo = {.split = "val", .docs = packed};
  if (rc == TPR_OK) rc = tpr_tokens_open(o->data, &to, &l.tokens);
  if (rc == TPR_OK) rc = tpr_data_create(l.tokens, &dc, tpr_session_config(s)->vocab_size, &l.data);
  if (rc == TPR_OK && o->eval_data) rc = tpr_tokens_open(o->eval_data, &eo, &l.eval);
  if (rc == TPR_OK && l.eval) rc = tpr_eval_window_count(l.eval, o->seq_len, o->eval_windows, &l.eval_nw);
  if (rc == TPR_OK && l.eval) rc = tpr_tokens_check_range(l.eval, tpr_session_config(s)->vocab_size);
  // Packed data that records its documents packs by them; else by EOS.
  if (rc == TPR_OK && packed && tpr_tokens_has_docs(l.tokens) && !(l.starts = malloc((size_t)o->seq_len + 1)))
    rc = TPR_FAIL(TPR_ERR_OOM, "train: document starts");
  if (rc == TPR_OK && packed && l.eval && tpr_tokens_has_docs(l.eval) &&
      !(l.eval_starts = malloc((size_t)o->seq_len + 1)))
    rc = TPR_FAIL(TPR_ERR_OOM, "train: document starts");
  if (rc == TPR_OK && packed && l.mesh->world_rank == 0)
    TPR_LOG_INF("train --pack: documents %s", l.starts ? "where the data's document offsets start them"
                                                        : "after each EOS token");
  rc = tpr_comm_agree(world, rc);
  if (rc == TPR_OK && o->resume_dir) rc = tpr_comm_agree(world, tpr_train_checkpoint_load(t, o->resume_dir, l.adam, &first));
  if (rc == TPR_OK) rc = report_memory(&l, out);
  int64_t last = o->stop_after > 0 && o->stop_after < o->steps ? o->stop_after : o->steps;
  if (l.mesh->world_rank == 0) {  // the other ranks' bars stay zeroed: off
    tpr_progress_begin(&l.bar, "training", (uint64_t)last, "steps");
    tpr_progress_update(&l.bar, (uint64_t)first, NULL);
  }
  for (int64_t step = first; rc == TPR_OK && step < last; step++) {
    tpr_train_step_report r = {0};
    rc = step_once(&l, step, &r);
    if (rc == TPR_OK && l.mesh->world_rank == 0) {
      tpr_progress_clear(&l.bar);
      report(o, &r, out);
      char note[96];
      snprintf(note, sizeof note, "loss %.4f  %.0f tok/s", r.loss, r.tokens_per_s);
      tpr_progress_update(&l.bar, (uint64_t)(step + 1), note);
    }
    if (rc == TPR_OK) summarize(summary, &r, first);
    bool eval = l.eval && (step + 1 == last || (o->eval_every > 0 && (step + 1) % o->eval_every == 0));
    if (rc == TPR_OK && eval) rc = evaluate(&l, step + 1, out);
    bool save = o->save_dir && (step + 1 == last || (o->save_every > 0 && (step + 1) % o->save_every == 0));
    if (rc == TPR_OK && save) rc = tpr_train_checkpoint_save(t, world, o->save_dir, step + 1, o, l.adam);
  }
  tpr_progress_end(&l.bar);
  for (int i = 0; l.adam && i < l.n_params; i++) tpr_adamw_state_free(&l.adam[i]);
  tpr_train_set_doc_starts(t, NULL);  // the state outlives l.starts
  free(l.adam), free(l.inputs), free(l.targets), free(l.starts), free(l.eval_starts);
  tpr_data_free(l.data);
  tpr_tokens_close(l.tokens);
  tpr_tokens_close(l.eval);
  return rc;
}
