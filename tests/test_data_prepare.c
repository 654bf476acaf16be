// tpr data prepare (data/, launch/cmd_data.c), run as the CLI:
//  - the ids equal tpr_tokenizer_encode's for every document of random text
//    and JSONL inputs, in input order, split into train/val by splitmix64
//    recomputed here, and the shards, document offsets and index are laid
//    out as docs/data.md says (read back with train/npy.c's reader);
//  - the output is byte-identical at 1 and 4 workers;
//  - on committed inputs the ids (and chat masks) equal Hugging Face
//    tokenizers' and a jinja2 rendering's (scripts/reference/
//    make_data_prepare_fixture.py);
//  - --chat masks are 1 exactly on the assistant replies: the masked runs
//    decode to each reply's content and end-of-turn marker, on random
//    conversations with system messages, several turns and content parts; a
//    reply whose first token would straddle the boundary is refused (the
//    negative control of the piecewise check);
//  - bad records are counted with their file and line, the exit status is 1
//    without --allow-bad; usage errors exit 2, unreadable inputs 1.
#define _GNU_SOURCE  // nftw, mkdtemp
#include <cjson/cJSON.h>
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_util.h"
#include "data/data.h"
#include "data/data_impl.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "train/npy.h"

#define DEMO TPR_FIXTURES "/demo_model"
#define FIX TPR_FIXTURES "/data_prepare"

static char tpr[4096];
static char tmp[64];
static tpr_tokenizer *tok;
static int32_t eos;

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }

// --- random text ------------------------------------------------------------------
static void put_cp(char **p, uint32_t cp) {
  char *s = *p;
  if (cp < 0x80) *s++ = (char)cp;
  else if (cp < 0x800) {
    *s++ = (char)(0xC0 | cp >> 6);
    *s++ = (char)(0x80 | (cp & 63));
  } else if (cp < 0x10000) {
    *s++ = (char)(0xE0 | cp >> 12);
    *s++ = (char)(0x80 | ((cp >> 6) & 63));
    *s++ = (char)(0x80 | (cp & 63));
  } else {
    *s++ = (char)(0xF0 | cp >> 18);
    *s++ = (char)(0x80 | ((cp >> 12) & 63));
    *s++ = (char)(0x80 | ((cp >> 6) & 63));
    *s++ = (char)(0x80 | (cp & 63));
  }
  *p = s;
}

// A random word: ASCII letters mostly, some Latin-1, CJK and astral
// characters, digits and punctuation. Never whitespace; starts with a letter.
static void rand_word(char **p) {
  int n = (int)tt_randint(1, 9);
  for (int i = 0; i < n; i++) {
    double u = tt_uniform(0, 1);
    uint32_t cp;
    if (i == 0 || u < 0.7) cp = (uint32_t)tt_randint('a', 'z') - (tt_uniform(0, 1) < 0.1 ? 32 : 0);
    else if (u < 0.78) cp = (uint32_t)tt_randint(0xC0, 0x17F);
    else if (u < 0.86) cp = (uint32_t)tt_randint(0x4E00, 0x4FFF);
    else if (u < 0.9) cp = (uint32_t)tt_randint(0x1F600, 0x1F64F);
    else if (u < 0.95) cp = (uint32_t)tt_randint('0', '9');
    else cp = (uint32_t)".,;:!?'\"()-/\\"[tt_randint(0, 12)];
    put_cp(p, cp);
  }
}

// A line of 1..max words (never blank), NUL-terminated in buf (>= 64*max bytes).
static char *rand_line(char *buf, int max) {
  char *p = buf;
  int n = (int)tt_randint(1, max);
  for (int i = 0; i < n; i++) {
    if (i) *p++ = tt_uniform(0, 1) < 0.9 ? ' ' : '\t';
    rand_word(&p);
  }
  *p = 0;
  return buf;
}

typedef struct doc_list {
  char **text;
  int n;
} doc_list;

static void docs_free(doc_list *d) {
  for (int i = 0; i < d->n; i++) free(d->text[i]);
  free(d->text);
  d->n = 0;
  d->text = NULL;
}

static void docs_add(doc_list *d, const char *s) {
  d->text = realloc(d->text, sizeof *d->text * (size_t)(d->n + 1));
  d->text[d->n++] = strdup(s);
}

// A paragraph of 1..4 lines.
static char *rand_paragraph(void) {
  size_t cap = 4 * 64 * 12 + 8;
  char *s = malloc(cap), line[64 * 12];
  s[0] = 0;
  int n = (int)tt_randint(1, 4);
  for (int i = 0; i < n; i++) {
    if (i) strcat(s, "\n");
    strcat(s, rand_line(line, 10));
  }
  return s;
}

// --- running tpr and reading what it wrote ---------------------------------------
static run_result run_tpr(const char *const *args) { return tt_run_tpr(tpr, tmp, args); }

typedef struct split_data {
  int32_t *ids;
  uint8_t *mask;
  int64_t n;
  int64_t *doc_end;  // the documents' ends in ids
  int64_t ndoc;
} split_data;

static void split_free(split_data *s) {
  free(s->ids);
  free(s->mask);
  free(s->doc_end);
  memset(s, 0, sizeof *s);
}

static int64_t jnum(const cJSON *j, const char *k) { return (int64_t)tt_json_num(j, k); }

// np.save's header for (n,) of descr, built here independently of data/.
static void numpy_header(char h[128], const char *descr, int64_t n) {
  char dict[128];
  int k = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }", descr,
                   (long long)n);
  memcpy(h, "\x93NUMPY\x01\x00\x76\x00", 10);
  memset(h + 10, ' ', 118);
  memcpy(h + 10, dict, (size_t)k);
  h[127] = '\n';
}

// Every shard of `split` in the index at dir/name.json, checked against the
// format and concatenated.
static void read_split(const char *dir, const cJSON *index, const char *split, bool chat, int64_t shard_tokens,
                       split_data *out) {
  memset(out, 0, sizeof *out);
  const cJSON *sp = cJSON_GetObjectItem(cJSON_GetObjectItem(index, "splits"), split);
  assert_non_null(sp);
  const cJSON *shards = cJSON_GetObjectItem(sp, "shards");
  assert_true(cJSON_IsArray(shards));
  int64_t total = jnum(sp, "tokens"), ndoc = jnum(sp, "documents");
  out->ids = malloc(sizeof *out->ids * (size_t)(total + 1));
  out->mask = malloc((size_t)total + 1);
  out->doc_end = malloc(sizeof *out->doc_end * (size_t)(ndoc + 1));
  int k = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, shards) {
    char want[256];
    snprintf(want, sizeof want, "%s.%05d.npy", split, k);
    const char *tf = cJSON_GetObjectItem(e, "tokens_file")->valuestring;
    assert_non_null(strstr(tf, want));
    assert_null(strchr(tf, '/'));  // relative to the index's directory
    int64_t n = jnum(e, "tokens"), nd = jnum(e, "documents");
    tpr_npy *t = NULL, *d = NULL;
    TT_OK(tpr_npy_open(tt_path(dir, tf), &t));
    assert_string_equal(tpr_npy_descr(t), "<u2");  // vocab 4096
    assert_int_equal(tpr_npy_len(t), n);
    assert_true(out->n + n <= total);
    TT_OK(tpr_npy_read_i32(t, 0, n, out->ids + out->n));
    TT_OK(tpr_npy_open(tt_path(dir, cJSON_GetObjectItem(e, "docs_file")->valuestring), &d));
    assert_string_equal(tpr_npy_descr(d), "<i8");
    assert_int_equal(tpr_npy_len(d), nd + 1);
    int64_t prev = 0, v;
    TT_OK(tpr_npy_get(d, 0, &v));
    assert_int_equal(v, 0);
    for (int64_t i = 1; i <= nd; i++) {
      TT_OK(tpr_npy_get(d, i, &v));
      assert_true(v >= prev);
      if (i == nd) {  // the shard closed at its first document end past the threshold, not later
        assert_int_equal(v, n);
        assert_true(prev < shard_tokens);
      }
      assert_true(out->ndoc < ndoc);
      out->doc_end[out->ndoc++] = out->n + v;
      prev = v;
    }
    if (k + 1 < cJSON_GetArraySize(shards)) assert_true(n >= shard_tokens);
    const cJSON *mf = cJSON_GetObjectItem(e, "mask_file");
    assert_true(chat == (mf != NULL));
    if (chat) {
      size_t len;
      char *m = tt_slurp(tt_path(dir, mf->valuestring), &len);
      char h[128];
      numpy_header(h, "|u1", n);
      assert_int_equal(len, 128 + (size_t)n);
      assert_memory_equal(m, h, 128);
      for (int64_t i = 0; i < n; i++) assert_true(m[128 + i] == 0 || m[128 + i] == 1);
      memcpy(out->mask + out->n, m + 128, (size_t)n);
      free(m);
    }
    // The token file's header is np.save's, byte for byte.
    size_t len;
    char *raw = tt_slurp(tt_path(dir, tf), &len);
    char h[128];
    numpy_header(h, "<u2", n);
    assert_memory_equal(raw, h, 128);
    free(raw);
    tpr_npy_close(t);
    tpr_npy_close(d);
    out->n += n;
    k++;
  }
  assert_int_equal(out->n, total);
  assert_int_equal(out->ndoc, ndoc);
}

static cJSON *read_index(const char *path) {
  char *s = tt_slurp(path, NULL);
  cJSON *j = cJSON_Parse(s);
  free(s);
  assert_non_null(j);
  assert_string_equal(cJSON_GetObjectItem(j, "format")->valuestring, "tpr-token-shards");
  assert_int_equal(jnum(j, "version"), 1);
  assert_int_equal(jnum(j, "vocab_size"), tpr_tokenizer_vocab_size(tok));
  assert_string_equal(cJSON_GetObjectItem(j, "dtype")->valuestring, "uint16");
  return j;
}

// The format's split rule, written out here.
static bool is_val(uint64_t seed, int64_t k, double f) {
  uint64_t z = seed + (uint64_t)k + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (long double)z < (long double)f * 18446744073709551616.0L;
}

// Two output directories hold the same files, byte for byte.
static void assert_same_dirs(const char *a, const char *b) {
  DIR *d = opendir(a);
  assert_non_null(d);
  struct dirent *e;
  int files = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    size_t la, lb;
    char *x = tt_slurp(tt_path(a, e->d_name), &la), *y = tt_slurp(tt_path(b, e->d_name), &lb);
    if (la != lb || memcmp(x, y, la) != 0) fail_msg("%s differs between %s and %s", e->d_name, a, b);
    free(x);
    free(y);
    files++;
  }
  closedir(d);
  d = opendir(b);
  int files_b = 0;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') files_b++;
  closedir(d);
  assert_int_equal(files, files_b);
  assert_true(files >= 5);
}

// --- tests -----------------------------------------------------------------------
static void test_text_and_jsonl(void **state) {
  doc_list docs = {0};
  // a.txt: paragraphs separated by 1-3 blank lines (some with spaces, tabs, CR)
  FILE *f = fopen(tt_path(tmp, "a.txt"), "w");
  if (tt_uniform(0, 1) < 0.5) fputs("\n \n", f);  // leading blank lines
  int na = (int)tt_randint(40, 70);
  for (int i = 0; i < na; i++) {
    char *p = rand_paragraph();
    docs_add(&docs, p);
    fputs(p, f);
    free(p);
    static const char *seps[] = {"\n\n", "\n\n\n", "\n \n", "\n\t\n\n", "\r\n\r\n", "\n  \r\n"};
    fputs(i + 1 < na || tt_uniform(0, 1) < 0.5 ? seps[tt_randint(0, 5)] : "", f);
  }
  fclose(f);
  // b.jsonl: {"text": ...} with newlines, quotes and escapes inside, other keys, blank lines
  f = fopen(tt_path(tmp, "b.jsonl"), "w");
  int nb = (int)tt_randint(40, 70);
  for (int i = 0; i < nb; i++) {
    char *p = rand_paragraph();
    if (tt_uniform(0, 1) < 0.2) strcat(p, "\n\n  trailing \"quoted\" \\ text\n");
    if (tt_uniform(0, 1) < 0.05) p[0] = 0;  // an empty text is a document of 0 tokens (plus EOS)
    docs_add(&docs, p);
    cJSON *j = cJSON_CreateObject();
    if (tt_uniform(0, 1) < 0.3) cJSON_AddNumberToObject(j, "id", i);
    cJSON_AddStringToObject(j, "text", p);
    if (tt_uniform(0, 1) < 0.3) cJSON_AddStringToObject(j, "meta", "x");
    char *line = cJSON_PrintUnformatted(j);
    fprintf(f, "%s\n%s", line, tt_uniform(0, 1) < 0.1 ? "\n  \n" : "");
    free(line);
    cJSON_Delete(j);
    free(p);
  }
  fclose(f);
  uint64_t seed = tt_next_u64();
  char seed_s[32];
  snprintf(seed_s, sizeof seed_s, "%llu", (unsigned long long)seed);
  int64_t shard_tokens = tt_randint(150, 400);
  char st[32];
  snprintf(st, sizeof st, "%lld", (long long)shard_tokens);
  const char *outs[2] = {"w1/d", "w4/d"}, *workers[2] = {"1", "4"};
  for (int w = 0; w < 2; w++) {
    const char *args[] = {"data", "prepare", "--model", DEMO, "--input", tt_path(tmp, "a.txt"),
                          tt_path(tmp, "b.jsonl"), "--output", tt_path(tmp, outs[w]), "--append-eos",
                          "--val-fraction", "0.25", "--seed", seed_s, "--shard-tokens", st, "--workers",
                          workers[w], "--json", NULL};
    cJSON *j = tt_json_of(run_tpr(args));
    assert_int_equal(jnum(j, "bad_records"), 0);
    assert_int_equal(jnum(j, "documents"), na + nb);
    cJSON_Delete(j);
  }
  char d1[128], d4[128];
  snprintf(d1, sizeof d1, "%s/w1", tmp);
  snprintf(d4, sizeof d4, "%s/w4", tmp);
  assert_same_dirs(d1, d4);

  cJSON *index = read_index(tt_path(d1, "d.json"));
  assert_int_equal(jnum(index, "eos_id"), eos);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(index, "append_eos")));
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(index, "chat")));
  // The seed exactly as given: a JSON number a double would round, so read from the file's text.
  char *raw = tt_slurp(tt_path(d1, "d.json"), NULL);
  const char *sp = strstr(raw, "\"seed\":");
  assert_non_null(sp);
  sp += 7;
  while (*sp == ' ' || *sp == '\t') sp++;
  assert_int_equal(strncmp(sp, seed_s, strlen(seed_s)), 0);
  assert_true(sp[strlen(seed_s)] == ',');
  free(raw);
  split_data sd[2];
  read_split(d1, index, "train", false, shard_tokens, &sd[0]);
  read_split(d1, index, "val", false, shard_tokens, &sd[1]);
  assert_true(sd[0].ndoc > 0 && sd[1].ndoc > 0);
  // Document k's ids, from the tokenizer directly, in split order.
  int64_t at[2] = {0, 0}, di[2] = {0, 0};
  for (int k = 0; k < docs.n; k++) {
    int v = is_val(seed, k, 0.25);
    int32_t *ids;
    size_t n;
    TT_OK(tpr_tokenizer_encode(tok, docs.text[k], strlen(docs.text[k]), false, &ids, &n));
    assert_true(di[v] < sd[v].ndoc);
    if (sd[v].doc_end[di[v]] - at[v] != (int64_t)n + 1)
      fail_msg("document %d (%s): %lld tokens written, %zu + EOS expected", k, v ? "val" : "train",
               (long long)(sd[v].doc_end[di[v]] - at[v]), n);
    assert_memory_equal(sd[v].ids + at[v], ids, n * sizeof *ids);
    assert_int_equal(sd[v].ids[at[v] + (int64_t)n], eos);
    at[v] += (int64_t)n + 1;
    di[v]++;
    free(ids);
  }
  assert_int_equal(di[0], sd[0].ndoc);
  assert_int_equal(di[1], sd[1].ndoc);
  split_free(&sd[0]);
  split_free(&sd[1]);
  cJSON_Delete(index);

  // --txt-documents lines: every non-blank line is a document.
  const char *args[] = {"data", "prepare", "--model", DEMO, "--input", tt_path(tmp, "a.txt"), "--output",
                        tt_path(tmp, "lines/d"), "--txt-documents", "lines", "--workers", "2", "--json", NULL};
  cJSON *j = tt_json_of(run_tpr(args));
  int lines = 0;
  for (int k = 0; k < na; k++) {
    lines++;
    for (const char *c = docs.text[k]; *c; c++) lines += *c == '\n';
  }
  assert_int_equal(jnum(j, "documents"), lines);
  cJSON_Delete(j);
  docs_free(&docs);
}

// The committed inputs against Hugging Face tokenizers (and jinja2 for chat).
static void test_reference_fixture(void **state) {
  char *s = tt_slurp(FIX "/expected.json", NULL);
  cJSON *want = cJSON_Parse(s);
  free(s);
  assert_non_null(want);
  const char *inputs[3] = {FIX "/input.txt", FIX "/input.jsonl", FIX "/chat.jsonl"};
  const char *keys[3] = {"txt", "jsonl", "chat"};
  for (int c = 0; c < 3; c++) {
    char out[64];
    snprintf(out, sizeof out, "ref%d/d", c);
    const char *args[] = {"data", "prepare", "--model", DEMO, "--input", inputs[c], "--output", tt_path(tmp, out),
                          "--workers", "3", "--json", c == 2 ? "--chat" : NULL, NULL};
    cJSON *j = tt_json_of(run_tpr(args));
    assert_int_equal(jnum(j, "bad_records"), 0);
    cJSON_Delete(j);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/ref%d", tmp, c);
    cJSON *index = read_index(tt_path(dir, "d.json"));
    split_data sd;
    read_split(dir, index, "train", c == 2, 100000000, &sd);
    const cJSON *docs = cJSON_GetObjectItem(want, keys[c]);
    assert_int_equal(sd.ndoc, cJSON_GetArraySize(docs));
    int64_t at = 0, k = 0, masked = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, docs) {
      const cJSON *ids = c == 2 ? cJSON_GetObjectItem(d, "ids") : d;
      const cJSON *mask = c == 2 ? cJSON_GetObjectItem(d, "mask") : NULL;
      int64_t n = cJSON_GetArraySize(ids);
      if (sd.doc_end[k] - at != n) fail_msg("%s document %lld: %lld tokens, the reference has %lld", keys[c],
                                            (long long)k, (long long)(sd.doc_end[k] - at), (long long)n);
      for (int64_t i = 0; i < n; i++) {
        if (sd.ids[at + i] != cJSON_GetArrayItem(ids, (int)i)->valueint)
          fail_msg("%s document %lld token %lld: %d, the reference %d", keys[c], (long long)k, (long long)i,
                   sd.ids[at + i], cJSON_GetArrayItem(ids, (int)i)->valueint);
        if (mask) {
          if (sd.mask[at + i] != cJSON_GetArrayItem(mask, (int)i)->valueint)
            fail_msg("chat %lld token %lld: mask %d, the reference %d", (long long)k, (long long)i, sd.mask[at + i],
                     cJSON_GetArrayItem(mask, (int)i)->valueint);
          masked += sd.mask[at + i];
        }
      }
      at += n;
      k++;
    }
    if (c == 2) assert_true(masked > 0 && masked < at);
    split_free(&sd);
    cJSON_Delete(index);
  }
  cJSON_Delete(want);
}

// Random conversations: the masked runs decode to the replies.
static void test_chat_masks(void **state) {
  FILE *f = fopen(tt_path(tmp, "chat.jsonl"), "w");
  int nconv = (int)tt_randint(15, 30);
  char ***replies = calloc((size_t)nconv, sizeof *replies);
  int *nrep = calloc((size_t)nconv, sizeof *nrep);
  bool *ends_with_reply = calloc((size_t)nconv, sizeof *ends_with_reply);
  char **rendered = calloc((size_t)nconv, sizeof *rendered);
  char line[64 * 12];
  for (int c = 0; c < nconv; c++) {
    cJSON *conv = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(conv, "messages");
    size_t cap = 1 << 16;
    rendered[c] = calloc(cap, 1);
    replies[c] = calloc(8, sizeof **replies);
    if (tt_uniform(0, 1) < 0.5) {
      cJSON *m = cJSON_CreateObject();
      cJSON_AddStringToObject(m, "role", "system");
      cJSON_AddStringToObject(m, "content", rand_line(line, 8));
      cJSON_AddItemToArray(msgs, m);
      sprintf(rendered[c] + strlen(rendered[c]), "<|im_start|>system\n%s<|im_end|>\n", line);
    }
    int turns = (int)tt_randint(1, 3);
    for (int t = 0; t < turns; t++) {
      for (int who = 0; who < 2; who++) {
        if (who == 1 && t == turns - 1 && tt_uniform(0, 1) < 0.2) break;  // ends with the user: EOS not learned
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", who ? "assistant" : "user");
        rand_line(line, 10);
        if (tt_uniform(0, 1) < 0.3) {  // content as text parts, joined
          cJSON *parts = cJSON_AddArrayToObject(m, "content");
          char *cut = strchr(line, ' ');
          cJSON *p1 = cJSON_CreateObject(), *p2 = cJSON_CreateObject();
          cJSON_AddStringToObject(p1, "type", "text");
          cJSON_AddStringToObject(p2, "type", "text");
          if (cut) {
            *cut = 0;
            cJSON_AddStringToObject(p1, "text", line);
            *cut = ' ';
            cJSON_AddStringToObject(p2, "text", cut);
          } else {
            cJSON_AddStringToObject(p1, "text", line);
            cJSON_AddStringToObject(p2, "text", "");
          }
          cJSON_AddItemToArray(parts, p1);
          cJSON_AddItemToArray(parts, p2);
        } else
          cJSON_AddStringToObject(m, "content", line);
        cJSON_AddItemToArray(msgs, m);
        sprintf(rendered[c] + strlen(rendered[c]), "<|im_start|>%s\n%s<|im_end|>\n", who ? "assistant" : "user",
                line);
        if (who) {
          char *r = malloc(strlen(line) + 32);
          sprintf(r, "%s<|im_end|>\n", line);
          replies[c][nrep[c]++] = r;
        }
        ends_with_reply[c] = who == 1;
      }
    }
    char *js = cJSON_PrintUnformatted(conv);
    fprintf(f, "%s\n", js);
    free(js);
    cJSON_Delete(conv);
  }
  // Negative control: a reply starting with a newline merges with the
  // template's "\n" into one token ("\n\n"), so no mask boundary exists.
  fputs("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"\\nhello\"}]}\n",
        f);
  fclose(f);
  // The built-in ChatML rendering, which joins text parts; the demo model's
  // own Jinja template (the default) concatenates content as a string, so
  // parts are its error, as in transformers (checked below).
  const char *args[] = {"data", "prepare", "--model", DEMO, "--input", tt_path(tmp, "chat.jsonl"), "--output",
                        tt_path(tmp, "chat/d"), "--chat", "--chat-template", "chatml", "--append-eos", "--workers", "3",
                        "--json", NULL};
  run_result r = run_tpr(args);
  assert_int_equal(r.code, 1);  // the refused record
  assert_non_null(strstr(r.err, "chat.jsonl:"));
  cJSON *j = cJSON_Parse(r.out);
  assert_non_null(j);
  assert_int_equal(jnum(j, "bad_records"), 1);
  const cJSON *bad = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "bad"), 0);
  assert_int_equal(jnum(bad, "line"), nconv + 1);
  assert_non_null(strstr(cJSON_GetObjectItem(bad, "reason")->valuestring, "boundar"));
  cJSON_Delete(j);
  tt_run_done(&r);

  char dir[128];
  snprintf(dir, sizeof dir, "%s/chat", tmp);
  cJSON *index = read_index(tt_path(dir, "d.json"));
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(index, "chat")));
  split_data sd;
  read_split(dir, index, "train", true, 100000000, &sd);
  assert_int_equal(sd.ndoc, nconv);
  int64_t at = 0;
  for (int c = 0; c < nconv; c++) {
    int64_t end = sd.doc_end[c];
    // The whole document decodes to the rendering (written out above) and the EOS.
    char *text;
    size_t len;
    TT_OK(tpr_tokenizer_decode(tok, sd.ids + at, (size_t)(end - at), false, &text, &len));
    char *want = malloc(strlen(rendered[c]) + 16);
    sprintf(want, "%s<|im_end|>", rendered[c]);
    assert_string_equal(text, want);
    free(text);
    free(want);
    assert_int_equal(sd.ids[end - 1], eos);
    assert_int_equal(sd.mask[end - 1], ends_with_reply[c]);
    // Each run of 1s decodes to one reply (the last one with the EOS when it ends the conversation).
    int run = 0;
    for (int64_t i = at; i < end;) {
      if (!sd.mask[i]) {
        i++;
        continue;
      }
      int64_t k = i;
      while (k < end && sd.mask[k]) k++;
      assert_true(run < nrep[c]);
      TT_OK(tpr_tokenizer_decode(tok, sd.ids + i, (size_t)(k - i), false, &text, &len));
      char want_run[64 * 12 + 64];
      snprintf(want_run, sizeof want_run, "%s%s", replies[c][run],
               run == nrep[c] - 1 && ends_with_reply[c] ? "<|im_end|>" : "");
      assert_string_equal(text, want_run);
      free(text);
      run++;
      i = k;
    }
    assert_int_equal(run, nrep[c]);
    at = end;
    for (int k = 0; k < nrep[c]; k++) free(replies[c][k]);
    free(replies[c]);
    free(rendered[c]);
  }
  split_free(&sd);
  cJSON_Delete(index);
  free(replies);
  free(nrep);
  free(ends_with_reply);
  free(rendered);
}

// The default template is the checkpoint's own Jinja (the demo model's is
// ChatML): on string contents its shards equal the built-in ChatML's byte
// for byte; text parts are the template's error (it concatenates strings),
// counted as a bad record naming it; a template file's raise_exception is a
// bad record carrying its message.
static void test_chat_jinja(void **state) {
  FILE *f = fopen(tt_path(tmp, "jchat.jsonl"), "w");
  char line[64 * 12];
  for (int c = 0; c < 12; c++) {
    cJSON *conv = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(conv, "messages");
    for (int t = 0; t < 2 * (int)tt_randint(1, 2); t++) {
      cJSON *m = cJSON_CreateObject();
      cJSON_AddStringToObject(m, "role", t % 2 ? "assistant" : "user");
      cJSON_AddStringToObject(m, "content", rand_line(line, 8));
      cJSON_AddItemToArray(msgs, m);
    }
    char *js = cJSON_PrintUnformatted(conv);
    fprintf(f, "%s\n", js);
    free(js);
    cJSON_Delete(conv);
  }
  fclose(f);
  char jin[256];  // tt_path's buffers are reused
  snprintf(jin, sizeof jin, "%s", tt_path(tmp, "jchat.jsonl"));
  run_result a = run_tpr((const char *[]){"data", "prepare", "--model", DEMO, "--input", jin, "--output",
                                          tt_path(tmp, "jchat/a"), "--chat", NULL});
  run_result b = run_tpr((const char *[]){"data", "prepare", "--model", DEMO, "--input", jin, "--output",
                                          tt_path(tmp, "jchat/b"), "--chat", "--chat-template", "chatml", NULL});
  assert_int_equal(a.code, 0);
  assert_int_equal(b.code, 0);
  assert_non_null(strstr(a.err, "chat template jinja (tokenizer_config.json"));
  static const char *const files[] = {"train.00000.npy", "train.00000.mask.npy", "train.00000.docs.npy"};
  for (int i = 0; i < 3; i++) {
    char pa[256], pb[256];
    snprintf(pa, sizeof pa, "jchat/a.%s", files[i]);
    snprintf(pb, sizeof pb, "jchat/b.%s", files[i]);
    size_t na, nb;
    char *x = tt_slurp(tt_path(tmp, pa), &na), *y = tt_slurp(tt_path(tmp, pb), &nb);
    assert_true(na == nb && memcmp(x, y, na) == 0);
    free(x), free(y);
  }
  tt_run_done(&a), tt_run_done(&b);
  f = fopen(jin, "w");
  fputs("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]},"
        "{\"role\":\"assistant\",\"content\":\"hello\"}]}\n", f);
  fputs("{\"messages\":[{\"role\":\"critic\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\"}]}\n", f);
  fclose(f);
  a = run_tpr((const char *[]){"data", "prepare", "--model", DEMO, "--input", jin, "--output", tt_path(tmp, "jchat/c"),
                               "--chat", "--allow-bad", NULL});
  assert_int_equal(a.code, 0);
  assert_non_null(strstr(a.err, "jchat.jsonl:1: bad record: the chat template failed"));
  tt_run_done(&a);
  const char *tmpl = "{% for m in messages %}{% if m.role == 'critic' %}{{ raise_exception('no critics') }}{% endif %}"
                     "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  tt_spit(tt_path(tmp, "t.jinja"), tmpl, strlen(tmpl));
  a = run_tpr((const char *[]){"data", "prepare", "--model", DEMO, "--input", jin, "--output", tt_path(tmp, "jchat/d"),
                               "--chat", "--chat-template", tt_path(tmp, "t.jinja"), NULL});
  assert_int_equal(a.code, 1);  // one bad record: the critic
  assert_non_null(strstr(a.err, "jchat.jsonl:2: bad record: the chat template refused the messages: no critics"));
  assert_null(strstr(a.err, "jchat.jsonl:1:"));  // this template renders text parts as Python prints a list
  tt_run_done(&a);
}

static void test_bad_records(void **state) {
  // Text: paragraph 2's third line has a stray byte: the file's line 5.
  FILE *f = fopen(tt_path(tmp, "bad.txt"), "w");
  fputs("good one\n\nline a\nline b\nline \xC3\x28 c\n\nfine again\n", f);
  fclose(f);
  f = fopen(tt_path(tmp, "bad.jsonl"), "w");
  fputs("{\"text\":\"ok 1\"}\n"          // 1
        "{\"text\":\"ok 2\"\n"           // 2 truncated
        "\n"                             // 3 blank: skipped
        "[\"text\"]\n"                   // 4 not an object
        "{\"txt\":\"x\"}\n"              // 5 no key
        "{\"text\":7}\n"                 // 6 not a string
        "{\"text\":\"\xF0\x9F\x98\"}\n"  // 7 truncated UTF-8
        "{\"text\":\"\\ud800\"}\n"       // 8 lone surrogate escape
        "{\"text\":\"ok 3\"}\n",         // 9
        f);
  for (int i = 0; i < 20; i++) fputs("nope\n", f);  // 10..29: past the listed 20
  fclose(f);
  const char *args[] = {"data", "prepare", "--model", DEMO, "--input", tt_path(tmp, "bad.txt"), "--input",
                        tt_path(tmp, "bad.jsonl"), "--output", tt_path(tmp, "bad/d"), "--json", NULL};
  run_result r = run_tpr(args);
  assert_int_equal(r.code, 1);
  assert_non_null(strstr(r.err, "bad.txt:5: bad record: invalid UTF-8"));
  assert_non_null(strstr(r.err, "--allow-bad"));
  assert_non_null(strstr(r.err, "and 7 more bad records (27 in all)"));
  cJSON *j = cJSON_Parse(r.out);
  assert_non_null(j);
  assert_int_equal(jnum(j, "bad_records"), 27);
  assert_int_equal(jnum(j, "documents"), 2 + 2);
  const cJSON *bad = cJSON_GetObjectItem(j, "bad");
  assert_int_equal(cJSON_GetArraySize(bad), 20);
  const int64_t lines[] = {5, 2, 4, 5, 6, 7, 8, 10, 11};
  const char *files[] = {"bad.txt", "bad.jsonl"};
  for (int i = 0; i < 9; i++) {
    const cJSON *b = cJSON_GetArrayItem(bad, i);
    assert_int_equal(jnum(b, "line"), lines[i]);
    assert_non_null(strstr(cJSON_GetObjectItem(b, "file")->valuestring, files[i > 0]));
  }
  assert_non_null(strstr(cJSON_GetObjectItem(cJSON_GetArrayItem(bad, 3), "reason")->valuestring, "no \"text\" key"));
  cJSON_Delete(j);
  tt_run_done(&r);
  // --allow-bad: the same output, exit 0.
  const char *args2[] = {"data", "prepare", "--model", DEMO, "--input", tt_path(tmp, "bad.txt"), "--input",
                         tt_path(tmp, "bad.jsonl"), "--output", tt_path(tmp, "bad2/d"), "--allow-bad", "--json",
                         NULL};
  j = tt_json_of(run_tpr(args2));
  assert_int_equal(jnum(j, "bad_records"), 27);
  cJSON_Delete(j);
}

static void expect_exit(const char *const *args, int code, const char *msg) {
  run_result r = run_tpr(args);
  if (r.code != code || !strstr(r.err, msg))
    fail_msg("%s: exit %d, stderr '%s'; want %d and '%s'", args[1], r.code, r.err, code,
             msg);
  tt_run_done(&r);
}

static void test_errors(void **state) {
  tt_spit(tt_path(tmp, "ok.txt"), "hello there\n", 12);
  const char *no_model[] = {"data", "prepare", "--input", tt_path(tmp, "ok.txt"), "--output", tt_path(tmp, "e/d"),
                            NULL};
  expect_exit(no_model, 2, "give --model");
  const char *bad_flag[] = {"data", "prepare", "--model", DEMO, "--input", tt_path(tmp, "ok.txt"), "--output",
                            tt_path(tmp, "e/d"), "--shuffle", NULL};
  expect_exit(bad_flag, 2, "unknown option '--shuffle'");
  const char *missing[] = {"data", "prepare", "--model", DEMO, "--input", tt_path(tmp, "ok.txt"),
                           tt_path(tmp, "missing.txt"), "--output", tt_path(tmp, "e/d"), NULL};
  expect_exit(missing, 1, "missing.txt: cannot read");
  const char *frac[] = {"data", "prepare", "--model", DEMO, "--input", tt_path(tmp, "ok.txt"), "--output",
                        tt_path(tmp, "e/d"), "--val-fraction", "1.5", NULL};
  expect_exit(frac, 2, "--val-fraction");
  const char *chat_txt[] = {"data", "prepare", "--model", DEMO, "--input", tt_path(tmp, "ok.txt"), "--output",
                            tt_path(tmp, "e/d"), "--chat", NULL};
  expect_exit(chat_txt, 2, "--chat reads JSONL");
  const char *nomodel_dir[] = {"data", "prepare", "--model", tt_path(tmp, "nowhere"), "--input",
                               tt_path(tmp, "ok.txt"), "--output", tt_path(tmp, "e/d"), NULL};
  expect_exit(nomodel_dir, 1, "nowhere");
  const char *sub[] = {"data", "shuffle", NULL};
  expect_exit(sub, 2, "unknown subcommand 'shuffle'");
  // A tokenizer.json alone (no tokenizer_config.json beside it): no EOS.
  size_t len;
  char *tj = tt_slurp(DEMO "/tokenizer.json", &len);
  char dir[128];
  snprintf(dir, sizeof dir, "%s/tokonly", tmp);
  mkdir(dir, 0777);
  tt_spit(tt_path(dir, "tokenizer.json"), tj, len);
  free(tj);
  const char *no_eos[] = {"data", "prepare", "--tokenizer", tt_path(dir, "tokenizer.json"), "--input",
                          tt_path(tmp, "ok.txt"), "--output", tt_path(tmp, "e/d"), "--append-eos", NULL};
  expect_exit(no_eos, 2, "declares no EOS");
  const char *tok_file[] = {"data", "prepare", "--tokenizer", tt_path(dir, "tokenizer.json"), "--input",
                            tt_path(tmp, "ok.txt"), "--output", tt_path(tmp, "e/d"), "--json", NULL};
  cJSON *j = tt_json_of(run_tpr(tok_file));
  cJSON_Delete(j);
  cJSON *index = read_index(tt_path(tmp, "e/d.json"));
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(index, "eos_id")));
  cJSON_Delete(index);
}

// data/'s npy header is np.save's (a file numpy itself wrote, tests/fixtures/npy).
static void test_npy_header(void **state) {
  size_t len;
  char *np = tt_slurp(TPR_FIXTURES "/npy/tokens_u2_v1.npy", &len);
  char h[DATA_NPY_HEADER];
  data_npy_header(h, "<u2", 5);
  assert_true(len >= sizeof h);
  assert_memory_equal(np, h, sizeof h);
  free(np);
}

// UTF-8 validity: every well-formed sequence of each length is accepted;
// overlongs, surrogates, > U+10FFFF, stray continuations and truncations are
// refused at the right offset.
static void test_utf8(void **state) {
  char buf[8], *p;
  for (uint32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x1000 ? 1 : 97)) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    p = buf;
    *p++ = 'x';
    put_cp(&p, cp);
    if (!tpr_data_utf8_valid(buf, (size_t)(p - buf), NULL)) fail_msg("U+%04X refused", cp);
  }
  static const struct {
    const char *s;
    size_t at;
  } bad[] = {{"ab\x80", 2},         {"a\xC0\x80", 1},         {"\xC1\xBF", 0},     {"\xE0\x80\x80", 0},
             {"\xED\xA0\x80", 0}, {"\xF0\x8F\xBF\xBF", 0}, {"\xF4\x90\x80\x80", 0},
             {"\xF5\x80\x80\x80", 0}, {"ok\xE2\x82", 2},   {"\xF0\x9F\x98", 0}, {"\xC3\x28", 0},
             {"\xFF", 0}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t at = 99;
    if (tpr_data_utf8_valid(bad[i].s, strlen(bad[i].s), &at)) fail_msg("case %zu accepted", i);
    assert_int_equal(at, bad[i].at);
  }
  assert_true(tpr_data_utf8_valid("\xED\x9F\xBF\xF4\x8F\xBF\xBF", 7, NULL));  // U+D7FF, U+10FFFF
}

int main(void) {
  tt_seed_from_env();
  if (tt_tpr_path(tpr, sizeof tpr, "test_data_prepare") != 0) return 1;
  snprintf(tmp, sizeof tmp, "/tmp/tpr_data_XXXXXX");
  if (!mkdtemp(tmp)) return 1;
  if (tpr_tokenizer_load(DEMO, &tok) != TPR_OK) {
    fprintf(stderr, "%s\n", tpr_last_error());
    return 1;
  }
  eos = tpr_tokenizer_eos_id(tok);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_utf8),        cmocka_unit_test(test_npy_header),  cmocka_unit_test(test_text_and_jsonl), cmocka_unit_test(test_reference_fixture),
      cmocka_unit_test(test_chat_masks), cmocka_unit_test(test_chat_jinja),  cmocka_unit_test(test_bad_records),   cmocka_unit_test(test_errors),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tpr_tokenizer_free(tok);
  nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}
