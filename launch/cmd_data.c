// tpr data prepare: text or JSONL (or JSONL chat conversations) to the token
// shards tpr train reads (data/data.h; the format: docs/data.md). No mpirun.
#define _GNU_SOURCE  // realpath
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/data.h"
#include "jinja/chat.h"
#include "launch/args.h"
#include "launch/cli_util.h"
#include "launch/commands.h"
#include "runtime/file_io.h"
#include "runtime/progress.h"
#include "tokenizer/tokenizer.h"

static const char *prepare_usage =
    "usage: tpr data prepare (--model DIR | --tokenizer FILE) --input FILE... --output PREFIX\n"
    "                        [--format txt|jsonl] [--text-key KEY] [--txt-documents blank-lines|lines]\n"
    "                        [--chat [--chat-template auto|FILE|NAME]] [--append-eos] [--add-special]\n"
    "                        [--shard-tokens N] [--val-fraction F] [--seed S] [--workers N]\n"
    "                        [--allow-bad] [--json]\n"
    "tokenizes the inputs, in the order given, into token shards for tpr train (docs/data.md):\n"
    "PREFIX.json (the index) and PREFIX.train.00000.npy, .docs.npy (document offsets), .mask.npy (--chat),\n"
    "the same for val. ids are uint16 when the vocabulary has <= 65536 ids, else uint32.\n"
    "inputs: plain text (documents separated by one or more blank lines: empty or whitespace-only;\n"
    "  --txt-documents lines makes every non-blank line a document) or JSONL (one JSON object per line, the\n"
    "  text under --text-key; blank lines skipped); the format is --format, else .jsonl/.json files are JSONL.\n"
    "--chat: JSONL {\"messages\": [{\"role\": ..., \"content\": ...}, ...]} (content a string or a list of\n"
    "  {\"type\": \"text\", \"text\": ...} parts), rendered with the checkpoint's chat template; the mask is 1\n"
    "  on the assistant replies' tokens (content and end-of-turn marker), 0 elsewhere.\n"
    "bad records (invalid UTF-8, a line that is not a JSON object, a missing or non-string key, a malformed\n"
    "  conversation) are skipped, counted and listed with file:line (the first 20); the run goes on, and\n"
    "  exits 1 if there was any unless --allow-bad. The output is the same at any --workers.\n"
    "exit status: 0 done, 1 failure or bad records (without --allow-bad), 2 usage error";

typedef struct progress_state {
  bool tty;          // the progress line of runtime/progress.h; else a plain line every 5 s
  bool begun;
  double last;
  tpr_progress bar;  // bytes read of the inputs
  const tpr_data_opts *o;
} progress_state;

static void fmt_eta(double s, char *buf, size_t n) {
  if (s < 0 || s > 1e7) snprintf(buf, n, "?");
  else if (s >= 3600) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
  else if (s >= 60) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
  else snprintf(buf, n, "%ds", (int)(s + 0.5));
}

// On a terminal the progress line (bytes read, documents, tokens, tokens/s,
// ETA), erased at the end; otherwise a plain line every 5 seconds.
static void on_progress(const tpr_data_progress *p, bool final, void *ctx) {
  progress_state *g = ctx;
  double rate = p->seconds > 0 ? (double)p->tokens / p->seconds : 0;
  if (g->tty) {
    if (!g->begun) tpr_progress_begin(&g->bar, "preparing", (uint64_t)p->bytes_total, NULL), g->begun = true;
    char note[128];
    snprintf(note, sizeof note, "%lld documents  %lld tokens  %.0f tokens/s", (long long)p->documents,
             (long long)p->tokens, rate);
    if (final) tpr_progress_end(&g->bar);
    else tpr_progress_update(&g->bar, (uint64_t)p->bytes_read, note);
    return;
  }
  if (final || p->seconds - g->last < 5.0) return;
  g->last = p->seconds;
  char read[32], total[32], eta[16];
  double frac = p->bytes_total > 0 ? (double)p->bytes_read / (double)p->bytes_total : 0;
  fmt_eta(frac > 0 ? p->seconds * (1 - frac) / frac : -1, eta, sizeof eta);
  tpr_cli_bytes((uint64_t)p->bytes_read, read, sizeof read);
  tpr_cli_bytes((uint64_t)p->bytes_total, total, sizeof total);
  char where[96];  // "12 MiB / 20 MiB (60%)", or the bytes alone when the total is unknown (a pipe)
  if (p->bytes_total > 0) snprintf(where, sizeof where, "%s / %s (%.0f%%)", read, total, 100 * frac);
  else snprintf(where, sizeof where, "%s read", read);
  fprintf(stderr, "tpr data prepare: %s, %lld documents, %lld tokens, %.0f tokens/s, ETA %s\n", where,
          (long long)p->documents, (long long)p->tokens, rate, eta);
  fflush(stderr);
}

static void on_bad(const tpr_data_bad *b, void *ctx) {
  progress_state *g = ctx;
  static int64_t n;  // one run per process
  if (++n > TPR_DATA_BAD_LISTED) return;
  if (g->begun) tpr_progress_clear(&g->bar);  // the line is drawn again by the next update
  fprintf(stderr, "tpr data prepare: %s:%lld: bad record: %s\n", g->o->inputs[b->input], (long long)b->line,
          b->reason);
}

static void print_summary(const tpr_data_summary *s, bool json, const tpr_data_opts *o) {
  int64_t docs = s->train.documents + s->val.documents, tokens = s->train.tokens + s->val.tokens;
  double rate = s->seconds > 0 ? (double)tokens / s->seconds : 0;
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "index", s->index_path);
    cJSON_AddNumberToObject(j, "documents", (double)docs);
    cJSON_AddNumberToObject(j, "tokens", (double)tokens);
    cJSON_AddNumberToObject(j, "shards", (double)(s->train.shards + s->val.shards));
    const tpr_data_split_summary *sp[2] = {&s->train, &s->val};
    const char *names[2] = {"train", "val"};
    for (int k = 0; k < 2; k++) {
      cJSON *e = cJSON_AddObjectToObject(j, names[k]);
      cJSON_AddNumberToObject(e, "documents", (double)sp[k]->documents);
      cJSON_AddNumberToObject(e, "tokens", (double)sp[k]->tokens);
      cJSON_AddNumberToObject(e, "shards", (double)sp[k]->shards);
    }
    cJSON_AddNumberToObject(j, "bad_records", (double)s->bad);
    cJSON *bad = cJSON_AddArrayToObject(j, "bad");
    for (int i = 0; i < s->n_listed; i++) {
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "file", o->inputs[s->listed[i].input]);
      cJSON_AddNumberToObject(e, "line", (double)s->listed[i].line);
      cJSON_AddStringToObject(e, "reason", s->listed[i].reason);
      cJSON_AddItemToArray(bad, e);
    }
    cJSON_AddNumberToObject(j, "bytes", (double)s->bytes);
    cJSON_AddNumberToObject(j, "seconds", s->seconds);
    cJSON_AddNumberToObject(j, "tokens_per_s", rate);
    tpr_cli_print_json(j);
    return;
  }
  printf("%-16s %14s %14s %8s\n", "split", "documents", "tokens", "shards");
  printf("%-16s %14lld %14lld %8lld\n", "train", (long long)s->train.documents, (long long)s->train.tokens,
         (long long)s->train.shards);
  printf("%-16s %14lld %14lld %8lld\n", "val", (long long)s->val.documents, (long long)s->val.tokens,
         (long long)s->val.shards);
  printf("%-16s %14lld %14lld %8lld\n", "total", (long long)docs, (long long)tokens,
         (long long)(s->train.shards + s->val.shards));
  printf("bad records %lld | %.2f s | %.0f tokens/s | index %s\n", (long long)s->bad, s->seconds, rate,
         s->index_path);
}

static int prepare(int argc, char **argv) {
  const char *model = NULL, *tokenizer = NULL, *output = NULL, *format = NULL, *text_key = "text";
  const char *txt_docs = NULL, *seed_s = NULL, *chat_template = NULL;
  tpr_arg_list inputs = {0};
  bool chat = false, append_eos = false, add_special = false, allow_bad = false, json = false;
  int64_t shard_tokens = 100000000, workers = 0;
  double val_fraction = 0;
  const tpr_arg args[] = {
      {"model", TPR_ARG_STR, &model, "checkpoint directory: its tokenizer.json (and chat template)"},
      {"tokenizer", TPR_ARG_STR, &tokenizer, "a tokenizer.json file instead of --model"},
      {"input", TPR_ARG_STR_LIST, &inputs, "input files, in order (repeat --input or list several after it)"},
      {"output", TPR_ARG_STR, &output, "output prefix (its directory is created): PREFIX.json, PREFIX.train.*"},
      {"format", TPR_ARG_STR, &format, "txt or jsonl (default: by extension, .jsonl/.json are jsonl)"},
      {"text-key", TPR_ARG_STR, &text_key, "JSONL: the key holding the text (default text)"},
      {"txt-documents", TPR_ARG_STR, &txt_docs, "text: blank-lines (default) or lines (a document per line)"},
      {"chat", TPR_ARG_FLAG, &chat, "JSONL chat conversations with a loss mask on the assistant replies"},
      {"chat-template", TPR_ARG_STR, &chat_template,
       "--chat: the template: auto (default: the checkpoint's own Jinja template, rendered as transformers does), "
       "a file of Jinja text, or a built-in: chatml, minimax_m2, hunyuan_moe"},
      {"append-eos", TPR_ARG_FLAG, &append_eos, "append the tokenizer's EOS to every document (error if none)"},
      {"add-special", TPR_ARG_FLAG, &add_special, "text documents: add the tokenizer's special tokens (e.g. BOS)"},
      {"shard-tokens", TPR_ARG_SIZE, &shard_tokens, "a shard closes once it holds >= N tokens (default 100000000)"},
      {"val-fraction", TPR_ARG_FLOAT, &val_fraction, "fraction of documents for the val split, 0..1 (default 0)"},
      {"seed", TPR_ARG_STR, &seed_s, "the val split's seed, 0..2^64-1 (default 0)"},
      {"workers", TPR_ARG_INT, &workers, "tokenizing threads (default: the number of cores)"},
      {"allow-bad", TPR_ARG_FLAG, &allow_bad, "exit 0 even if some records were bad (they are still reported)"},
      {"json", TPR_ARG_FLAG, &json, "print the summary as one JSON object"},
  };
  // "--input a b c": the files after --input up to the next option.
  char **av = malloc(sizeof *av * (size_t)(2 * argc + 1));
  if (!av) return 1;
  int ac = 0;
  for (int i = 0; i < argc; i++) {
    av[ac++] = argv[i];
    if (strcmp(argv[i], "--input") == 0 && i + 1 < argc) {
      av[ac++] = argv[++i];
      while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
        av[ac++] = "--input";
        av[ac++] = argv[++i];
      }
    }
  }
  av[0] = "tpr data prepare";
  tpr_args_result ar = tpr_args_parse(ac, av, args, sizeof args / sizeof args[0], prepare_usage);
  free(av);
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  const char *cmd = "tpr data prepare";
  tpr_data_opts o = {.text_key = text_key, .chat = chat, .append_eos = append_eos, .add_special = add_special,
                     .shard_tokens = shard_tokens, .val_fraction = val_fraction, .output = output};
  if (!model == !tokenizer || inputs.n == 0 || !output) {
    fprintf(stderr, "%s: give --model DIR (or --tokenizer FILE), --input and --output\n%s\n", cmd, prepare_usage);
    return 2;
  }
  const char *base = strrchr(output, '/');
  if (!(base ? base[1] : output[0])) {
    fprintf(stderr, "%s: --output '%s' is a prefix for file names, not a directory: add a name (DIR/data)\n", cmd,
            output);
    return 2;
  }
  if (format && strcmp(format, "txt") == 0) o.format = TPR_DATA_TXT;
  else if (format && strcmp(format, "jsonl") == 0) o.format = TPR_DATA_JSONL;
  else if (format) {
    fprintf(stderr, "%s: --format '%s': txt or jsonl\n", cmd, format);
    return 2;
  }
  if (txt_docs && strcmp(txt_docs, "lines") == 0) o.txt_docs = TPR_DATA_LINES;
  else if (txt_docs && strcmp(txt_docs, "blank-lines") != 0) {
    fprintf(stderr, "%s: --txt-documents '%s': blank-lines or lines\n", cmd, txt_docs);
    return 2;
  }
  if (chat && add_special) {
    fprintf(stderr, "%s: --add-special is for text documents; a chat template writes its own special tokens\n", cmd);
    return 2;
  }
  if (chat_template && !chat) {
    fprintf(stderr, "%s: --chat-template is for --chat\n", cmd);
    return 2;
  }
  if (!(val_fraction >= 0 && val_fraction <= 1)) {
    fprintf(stderr, "%s: --val-fraction %g: a fraction from 0 to 1\n", cmd, val_fraction);
    return 2;
  }
  if (shard_tokens < 1) {
    fprintf(stderr, "%s: --shard-tokens must be at least 1\n", cmd);
    return 2;
  }
  if (seed_s) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(seed_s, &end, 10);
    if (errno || end == seed_s || *end || seed_s[0] == '-') {
      fprintf(stderr, "%s: --seed '%s': a whole number from 0 to 2^64-1\n", cmd, seed_s);
      return 2;
    }
    o.seed = v;
  }
  if (workers == 0) {
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    workers = nc > 0 ? nc : 1;
  }
  if (workers < 1 || workers > 1024) {
    fprintf(stderr, "%s: --workers %lld: from 1 to 1024\n", cmd, (long long)workers);
    return 2;
  }
  o.workers = (int)workers;
  o.inputs = inputs.items;
  o.n_inputs = inputs.n;
  // The tokenizer file, for the index: absolute, so the index reads the same from anywhere.
  char *tok_file = model ? tpr_path_join(model, "tokenizer.json") : strdup(tokenizer);
  char resolved[PATH_MAX];
  if (!tok_file) return 1;
  tpr_tokenizer *tok = NULL;
  int code = 0;
  if (tpr_tokenizer_load(model ? model : tokenizer, &tok) != TPR_OK) {
    fprintf(stderr, "%s: error: %s\n", cmd, tpr_last_error());
    free(tok_file);
    return 1;
  }
  o.tok = tok;
  o.tokenizer_path = realpath(tok_file, resolved) ? resolved : tok_file;
  tpr_chat_jinja jinja = {0};
  if (chat && code == 0) {
    // The checkpoint's template: the model directory's, or the tokenizer file's folder's.
    char dir[PATH_MAX], warn[1200], what[320];
    snprintf(dir, sizeof dir, "%s", model ? model : tokenizer);
    if (!model) {
      char *slash = strrchr(dir, '/');
      if (slash) *slash = 0;
      else snprintf(dir, sizeof dir, ".");
    }
    if (tpr_chat_renderer_pick(dir, chat_template ? chat_template : "auto", &jinja, &o.chat_template, warn,
                               sizeof warn) != TPR_OK) {
      fprintf(stderr, "%s: %s\n", cmd, tpr_last_error());
      code = 2;
    } else if (warn[0]) {
      fprintf(stderr, "%s: %s\n", cmd, warn);
      code = 2;
    } else {
      tpr_chat_renderer_describe(&o.chat_template, what, sizeof what);
      fprintf(stderr, "%s: chat template %s\n", cmd, what);
    }
  }
  tpr_cli_progress(0);
  progress_state g = {.tty = tpr_progress_enabled(), .o = &o};
  o.progress = on_progress;
  o.progress_ctx = &g;
  o.on_bad = on_bad;
  o.bad_ctx = &g;
  tpr_data_summary *s = calloc(1, sizeof *s);
  if (!s) code = 1;
  if (code == 0) {
    tpr_status rc = tpr_data_prepare(&o, s);
    if (g.begun) tpr_progress_end(&g.bar);  // an error stops the run before its final report
    if (rc != TPR_OK) {
      fprintf(stderr, "%s: error: %s\n", cmd, tpr_last_error());
      code = rc == TPR_ERR_INVALID_ARG ? 2 : 1;
    } else {
      if (s->bad > TPR_DATA_BAD_LISTED)
        fprintf(stderr, "%s: ... and %lld more bad records (%lld in all)\n", cmd,
                (long long)(s->bad - TPR_DATA_BAD_LISTED), (long long)s->bad);
      print_summary(s, json, &o);
      if (s->bad > 0 && !allow_bad) {
        fprintf(stderr,
                "%s: %lld bad record%s skipped (listed above); the shards hold the rest. --allow-bad exits 0 "
                "with them\n",
                cmd, (long long)s->bad, s->bad == 1 ? "" : "s");
        code = 1;
      }
    }
  }
  free(s);
  tpr_tokenizer_free(tok);
  tpr_chat_jinja_free(&jinja);
  free(tok_file);
  return code;
}

int tpr_cmd_data(int argc, char **argv) {
  const char *usage = "usage: tpr data <subcommand> [options]\n\n"
                      "subcommands:\n"
                      "  prepare  tokenize text, JSONL or chat conversations into token shards for tpr train\n";
  if (argc < 2) {
    fprintf(stderr, "%s", usage);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    printf("%s", usage);
    return 0;
  }
  if (strcmp(argv[1], "prepare") == 0) return prepare(argc - 1, argv + 1);
  fprintf(stderr, "tpr data: unknown subcommand '%s'\n\n%s", argv[1], usage);
  return 2;
}
