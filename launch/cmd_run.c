// tpr run: generation from a checkpoint through the batched engine
// (engine/engine.h): every prompt is submitted at once, and each step runs
// decodes and prefill chunks of many sequences in one program over the paged
// KV cache. Rank 0 plans each step and prints each sequence as it finishes.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "launch/model_cli.h"
#include "launch/run_text.h"
#include "models/sampling.h"
#include "runtime/file_io.h"

static void print_ids(const int32_t *ids, int64_t n, bool json);

typedef struct run_totals {
  int64_t prompt_tokens, generated, steps, preempted;
  int64_t prefill_tokens, decode_tokens;  // run in steps with prefill work / in pure decode steps
  double prefill_s, decode_s;             // time of steps with prefill work / of pure decode steps
} run_totals;


// Rank 0: queues every prompt, each with its own sampling stream.
static tpr_status submit_all(tpr_engine *e, int32_t *const *ids, const int64_t *lens, int n, const tpr_gen_params *g,
                             run_totals *tot) {
  for (int i = 0; i < n; i++) {
    tpr_gen_params gi = *g;
    gi.sampling.seed = g->sampling.seed + (uint64_t)i;
    int64_t id;
    TPR_CHECK(tpr_engine_submit(e, ids[i], lens[i], &gi, &id));
    tot->prompt_tokens += lens[i];
  }
  return TPR_OK;
}

// Collective: steps until every sequence has finished. With text (rank 0),
// each sequence's text is decoded after every step (and streamed).
static tpr_status step_all(tpr_engine *e, int rank, bool json, run_text *text, run_totals *tot) {
  for (;;) {
    tpr_engine_step_info info;
    TPR_CHECK(tpr_engine_step(e, &info));
    if (info.idle) return TPR_OK;
    tot->steps++;
    tot->preempted += info.preempted;
    tot->generated += info.decode_tokens + info.accepted;
    if (info.prefill_tokens > 0) {
      tot->prefill_s += info.seconds;
      tot->prefill_tokens += info.prefill_tokens;
    } else {  // a verification's accepted drafts are generated tokens too (rank 0 counts them)
      tot->decode_s += info.seconds;
      tot->decode_tokens += info.decode_tokens + info.accepted;
    }
    for (int i = 0; rank == 0 && text && i < text->n; i++) TPR_CHECK(run_text_update(text, e, i));
    for (int64_t i = 0; rank == 0 && !json && !text && i < info.n_finished; i++) {
      tpr_sched_seq_info si;
      TPR_CHECK(tpr_engine_result(e, info.finished[i], &si));
      printf("sequence %lld finished at step %lld: ", (long long)info.finished[i], (long long)tot->steps);
      print_ids(si.tokens + si.prompt_len, si.len - si.prompt_len, false);
      printf("\n");
      fflush(stdout);
    }
  }
}

static void print_ids(const int32_t *ids, int64_t n, bool json) {
  for (int64_t i = 0; i < n; i++) printf(json ? "%s%d" : "%s%d", i ? (json ? "," : " ") : "", ids[i]);
}

// A JSON string literal of s.
static void print_json_string(const char *s) {
  putchar('"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') printf("\\%c", *p);
    else if (*p == '\n') printf("\\n");
    else if (*p < 0x20) printf("\\u%04x", *p);
    else putchar(*p);
  }
  putchar('"');
}

// Text mode: every --prompt and --prompt-file, tokenized, into ids/lens.
static tpr_status text_prompts(const run_text *t, const tpr_arg_list *texts, const tpr_arg_list *files, int32_t **ids,
                               int64_t *lens, int *n) {
  for (int i = 0; i < texts->n + files->n; i++) {
    if (*n == TPR_ARG_LIST_MAX) return TPR_FAIL(TPR_ERR_INVALID_ARG, "more than %d prompts", TPR_ARG_LIST_MAX);
    if (i < texts->n) {
      TPR_CHECK(run_text_encode(t, texts->items[i], &ids[*n], &lens[*n]));
    } else {
      uint8_t *bytes;
      size_t len;
      TPR_CHECK(tpr_file_read(files->items[i - texts->n], &bytes, &len));
      char *z = realloc(bytes, len + 1);
      if (!z) return free(bytes), TPR_FAIL(TPR_ERR_OOM, "--prompt-file %s", files->items[i - texts->n]);
      z[len] = '\0';
      tpr_status rc = strlen(z) == len ? run_text_encode(t, z, &ids[*n], &lens[*n])
                                       : TPR_FAIL(TPR_ERR_INVALID_ARG, "--prompt-file %s holds a NUL byte",
                                                  files->items[i - texts->n]);
      free(z);
      TPR_CHECK(rc);
    }
    (*n)++;
  }
  return TPR_OK;
}

int tpr_cmd_run(int argc, char **argv) {
  const char *model = NULL;
  tpr_arg_list prompts = {0}, texts = {0}, files = {0}, stops = {0};
  bool no_stream = false;
  int64_t max_new = 16, top_k = 0, seed = 0, max_seq = 0, stop_token = -1;
  double temperature = 0, top_p = 1;
  bool json = false;
  tpr_world_opts wo = TPR_WORLD_OPTS_DEFAULT;
  tpr_model_debug dbg = TPR_MODEL_DEBUG_DEFAULT;
  tpr_model_mesh mesh = TPR_MODEL_MESH_DEFAULT;
  tpr_model_engine eng = {0};
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory (Hugging Face or converted)"},
      {"prompt-ids", TPR_ARG_STR_LIST, &prompts, "a prompt's token ids, comma-separated; repeat for a batch"},
      {"prompt", TPR_ARG_STR_LIST, &texts, "a text prompt, tokenized with the checkpoint's tokenizer.json; repeat for a batch"},
      {"prompt-file", TPR_ARG_STR_LIST, &files, "a text prompt read from a file (UTF-8); repeatable"},
      {"stop", TPR_ARG_STR_LIST, &stops, "text prompts: the output ends before this string (repeatable)"},
      {"no-stream", TPR_ARG_FLAG, &no_stream, "text prompts: print the text when done, not as it is generated"},
      {"max-new-tokens", TPR_ARG_SIZE, &max_new, "tokens to generate per prompt (default 16)"},
      {"temperature", TPR_ARG_FLOAT, &temperature, "0 = greedy (default); > 0 samples"},
      {"top-k", TPR_ARG_INT, &top_k, "sample among the k most likely tokens (default 0 = all)"},
      {"top-p", TPR_ARG_FLOAT, &top_p, "sample within the smallest set of mass >= p (default 1 = all)"},
      {"seed", TPR_ARG_INT, &seed, "sampling seed; prompt i samples with seed + i (default 0)"},
      {"stop-token", TPR_ARG_INT, &stop_token,
       "end a sequence when it samples this id (default: none; text prompts: the tokenizer's EOS)"},
      {"max-seq", TPR_ARG_SIZE, &max_seq, "longest sequence the KV cache holds (default: longest prompt + max-new-tokens)"},
      TPR_MODEL_ENGINE_ARGS(eng),
      {"json", TPR_ARG_FLAG, &json, "print one JSON object (rank 0)"},
      {"moe-stats", TPR_ARG_FLAG, &mesh.moe_stats, "print routing statistics per MoE layer (also in --json)"},
      TPR_MODEL_MESH_ARGS(mesh),
      TPR_WORLD_ARGS(wo),
      TPR_MODEL_DEBUG_ARGS(dbg),
  };
  const char *usage = "usage: [mpirun -np N] tpr run --model DIR (--prompt-ids 1,2,3 | --prompt TEXT | --prompt-file F) "
                      "[more prompts ...] [--stop STR] [--no-stream]\n       "
                      "[--max-new-tokens N] [--temperature T --top-k K --top-p P --seed S] [--stop-token ID]\n"
                      "       [--max-batch B] [--max-tokens-per-step N] [--kv-cache-bytes N | --kv-cache-fraction F]\n"
                      "       [--tp T --dp D --ep E --etp F] [--moe-dispatch alltoall|allreduce] "
                      "[--capacity-factor F [--reroute-dropped]] [--moe-stats] [--json]";
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0], usage);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  tpr_sampling smp = {.temperature = temperature, .top_k = top_k, .top_p = top_p, .seed = (uint64_t)seed};
  const bool text_mode = texts.n + files.n > 0;
  if (!model || (prompts.n == 0 && !text_mode) || (prompts.n > 0 && text_mode)) {
    fprintf(stderr, "tpr run: --model and prompts are required: --prompt-ids, or text (--prompt / --prompt-file), "
            "not both\n%s\n", usage);
    return 2;
  }
  if (stops.n > 0 && !text_mode) {
    fprintf(stderr, "tpr run: --stop needs text prompts (--prompt / --prompt-file); use --stop-token with ids\n");
    return 2;
  }
  if (max_new < 1 || tpr_sampling_check(&smp) != TPR_OK) {
    fprintf(stderr, "tpr run: %s\n", max_new < 1 ? "--max-new-tokens must be >= 1" : tpr_last_error());
    return 2;
  }
  int32_t *ids[TPR_ARG_LIST_MAX] = {0};
  int64_t lens[TPR_ARG_LIST_MAX] = {0}, longest = 0;
  int n_prompts = prompts.n;
  run_text text = {0};
  if (text_mode) {  // every rank tokenizes: all of them check the ids
    tpr_status trc = run_text_open(&text, model, texts.n + files.n, stops.items, stops.n,
                                   !no_stream && !json && texts.n + files.n == 1, stdout);
    n_prompts = 0;
    if (trc == TPR_OK) trc = text_prompts(&text, &texts, &files, ids, lens, &n_prompts);
    if (trc == TPR_OK && stop_token == -1) stop_token = tpr_tokenizer_eos_id(text.tok);
    if (trc != TPR_OK) {
      fprintf(stderr, "tpr run: %s\n", tpr_last_error());
      for (int j = 0; j < n_prompts; j++) free(ids[j]);
      run_text_close(&text);
      return 2;
    }
  }
  for (int i = 0; i < prompts.n; i++) {
    if (tpr_cli_token_list("--prompt-ids", prompts.items[i], &ids[i], &lens[i]) != TPR_OK) {
      fprintf(stderr, "tpr run: %s\n", tpr_last_error());
      for (int j = 0; j < i; j++) free(ids[j]);
      return 2;
    }
  }
  for (int i = 0; i < n_prompts; i++)
    if (lens[i] > longest) longest = lens[i];
  if (max_seq == 0) max_seq = longest + max_new;
  if (max_seq < longest + max_new) {
    fprintf(stderr, "tpr run: --max-seq %lld is shorter than the longest prompt (%lld) + --max-new-tokens (%lld)\n",
            (long long)max_seq, (long long)longest, (long long)max_new);
    for (int i = 0; i < n_prompts; i++) free(ids[i]);
    return 2;
  }
  tpr_world w;
  tpr_session *s = NULL;
  tpr_status rc = tpr_world_init(&argc, &argv, &wo, &w);
  if (!eng.max_batch) eng.max_batch = n_prompts;
  if (rc == TPR_OK) rc = tpr_cli_open_engine_model(&w, model, &mesh, max_seq, &eng, &dbg, &s);
  run_totals tot = {0};
  tpr_engine *e = NULL;
  tpr_spec spec = {0};
  if (rc == TPR_OK) rc = tpr_cli_speculative(&eng, &spec);
  tpr_engine_opts eo = {.max_tokens_per_step = eng.max_tokens_per_step, .no_prefix_cache = eng.no_prefix_cache,
                        .max_draft = spec.kind ? spec.k : 0,
                        .draft_layers = spec.kind == TPR_SPEC_SELF ? spec.n : 0};
  tpr_gen_params g = {.max_new = max_new, .stop_token = (int32_t)stop_token, .sampling = smp, .spec = spec};
  if (stop_token < -1 || stop_token > INT32_MAX) rc = TPR_FAIL(TPR_ERR_INVALID_ARG, "--stop-token %lld", (long long)stop_token);
  if (rc == TPR_OK) rc = tpr_engine_new(s, &eo, &e);
  if (rc == TPR_OK && w.rank == 0 && !json) {
    tpr_cli_print_kv_pool(s);
  }
  // Every rank names a bad prompt; a rank-0 error at submission (a sequence
  // the pool cannot hold) reaches every rank before the first step.
  for (int i = 0; rc == TPR_OK && i < n_prompts; i++) rc = tpr_engine_check_prompt(e, ids[i], lens[i]);
  if (rc == TPR_OK)
    rc = tpr_comm_agree(w.host, w.rank == 0 ? submit_all(e, ids, lens, n_prompts, &g, &tot) : TPR_OK);
  if (rc == TPR_OK) rc = step_all(e, w.rank, json, text_mode ? &text : NULL, &tot);
  if (rc == TPR_OK && w.rank == 0 && text.stream) printf("\n");
  tpr_moe_stats ms = {0};
  if (rc == TPR_OK && mesh.moe_stats) rc = tpr_session_moe_stats(s, &ms);  // collective
  if (rc == TPR_OK && w.rank == 0) {
    const tpr_session_info *st = tpr_session_stats(s);
    const tpr_shard_plan *pl = tpr_session_plan(s);
    double pre = tot.prefill_s > 0 ? (double)tot.prefill_tokens / tot.prefill_s : 0;
    double dec = tot.decode_s > 0 ? (double)tot.decode_tokens / tot.decode_s : 0;
    tpr_sched_seq_info si[TPR_ARG_LIST_MAX];
    for (int i = 0; rc == TPR_OK && i < n_prompts; i++) rc = tpr_engine_result(e, i, &si[i]);
    if (json) {
      printf("{\"command\":\"run\",\"world_size\":%d,\"tp\":%d,\"dp\":%d,\"ep\":%d,\"etp\":%d,\"prompts\":[",
             w.size, pl->tp, pl->dp, pl->ep, pl->etp);
      for (int i = 0; i < n_prompts; i++) {
        printf("%s{\"prompt\":[", i ? "," : "");
        print_ids(ids[i], lens[i], true);
        printf("],\"generated\":[");
        print_ids(si[i].tokens + si[i].prompt_len, si[i].len - si[i].prompt_len, true);
        printf("]");
        if (text_mode) printf(",\"text\":"), print_json_string(text.text[i] ? text.text[i] : "");
        printf("}");
      }
      tpr_session_pool pool = tpr_session_pool_info(s);
      printf("],\"load_s\":%.4f,\"prefill_tokens\":%lld,\"prefill_s\":%.4f,\"prefill_tok_s\":%.2f,"
             "\"decode_tokens\":%lld,\"decode_s\":%.4f,\"decode_tok_s\":%.2f,\"weight_bytes_per_rank\":%llu,"
             "\"steps\":%lld,\"preemptions\":%lld,\"kv_pool_blocks\":%lld,\"kv_block_size\":%lld,"
             "\"kv_pool_bytes_per_rank\":%llu,\"max_batch\":%lld,\"state_bytes_per_seq_per_rank\":%llu",
             st->load_s, (long long)tot.prefill_tokens, tot.prefill_s, pre, (long long)tot.decode_tokens, tot.decode_s,
             dec, (unsigned long long)st->weight_bytes, (long long)tot.steps, (long long)tot.preempted,
             (long long)pool.blocks, (long long)pool.block_size, (unsigned long long)pool.bytes, (long long)pool.batch,
             (unsigned long long)pool.state_slot_bytes);
      if (spec.kind) {
        char name[32];
        tpr_sched_spec_stats sp = tpr_engine_spec(e);
        printf(",\"speculative\":{\"drafter\":\"%s\",\"drafted\":%lld,\"accepted\":%lld,\"verifications\":%lld,"
               "\"acceptance_rate\":%.4f,\"tokens_per_verification\":%.4f,\"state_rollbacks\":%lld,"
               "\"recomputed_tokens\":%lld}",
               tpr_spec_format(&spec, name, sizeof name), (long long)sp.drafted, (long long)sp.accepted,
               (long long)sp.verifications, sp.drafted ? (double)sp.accepted / (double)sp.drafted : 0.0,
               sp.verifications ? 1.0 + (double)sp.accepted / (double)sp.verifications : 0.0,
               (long long)sp.rollbacks, (long long)sp.recomputed);
      }
      if (mesh.moe_stats) {
        printf(",\"moe_stats\":");
        tpr_moe_stats_json(&ms, stdout);
      }
      printf("}\n");
    } else {
      for (int i = 0; i < n_prompts && text_mode && !text.stream; i++)
        printf("--- prompt %d (%lld tokens), generated:\n%s\n", i, (long long)lens[i], text.text[i] ? text.text[i] : "");
      for (int i = 0; i < n_prompts && !text_mode; i++) {
        printf("prompt %d (%lld tokens): ", i, (long long)lens[i]);
        print_ids(ids[i], lens[i], false);
        printf("\n  generated: ");
        print_ids(si[i].tokens + si[i].prompt_len, si[i].len - si[i].prompt_len, false);
        printf("\n");
      }
      printf("tp %d dp %d ep %d etp %d | load %.3f s | %lld steps, %lld preemptions | prefill steps %lld tokens, "
             "%.1f tok/s | decode steps %lld tokens, %.1f tok/s\n", pl->tp, pl->dp, pl->ep, pl->etp, st->load_s,
             (long long)tot.steps, (long long)tot.preempted, (long long)tot.prefill_tokens, pre,
             (long long)tot.decode_tokens, dec);
      if (spec.kind) {
        char name[32];
        tpr_sched_spec_stats sp = tpr_engine_spec(e);
        printf("speculative %s: %lld drafts in %lld verifications, %lld accepted (%.1f%%), %.2f tokens per "
               "verification step\n", tpr_spec_format(&spec, name, sizeof name), (long long)sp.drafted,
               (long long)sp.verifications, (long long)sp.accepted,
               sp.drafted ? 100.0 * (double)sp.accepted / (double)sp.drafted : 0.0,
               sp.verifications ? 1.0 + (double)sp.accepted / (double)sp.verifications : 0.0);
        if (tpr_session_pool_info(s).state_slots)  // a hybrid model: rejected drafts roll the state back by recompute
          printf("  state rollbacks %lld of %lld verifications, %lld tokens recomputed\n", (long long)sp.rollbacks,
                 (long long)sp.verifications, (long long)sp.recomputed);
      }
      if (mesh.moe_stats) tpr_moe_stats_print(&ms, stdout);
    }
  }
  for (int i = 0; i < n_prompts; i++) free(ids[i]);
  run_text_close(&text);
  tpr_moe_stats_free(&ms);
  tpr_engine_free(e);
  if (rc != TPR_OK) {
    tpr_session_close(s);
    return tpr_world_fail(&w, "run");
  }
  tpr_session_close(s);
  tpr_world_finish(&w);
  return 0;
}
