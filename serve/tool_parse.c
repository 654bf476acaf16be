// The output parser of tool_parse.h: a small state machine over a pending
// buffer. In content it looks for `<think>` (reasoning on) and the format's
// start tag; in reasoning for `</think>`; inside a call block for the end
// tag, then hands the block's text to the format's parse function. Bytes
// that may begin a tag wait until the next feed decides.
#include "serve/tool_parse.h"

#include "serve/tool_formats.h"

#include <ctype.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

enum { S_CONTENT = 0, S_REASONING = 1, S_CALL = 2 };


// --- buffers ---------------------------------------------------------------------

static void buf_add(tpr_out_parser *p, tpr_text_buf *b, const char *s, size_t n) {
  if (!n) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1) cap *= 2;
    char *t = realloc(b->s, cap);
    if (!t) {
      p->oom = true;
      return;
    }
    b->s = t, b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = 0;
}

static void buf_drop_front(tpr_text_buf *b, size_t n) {
  if (!n) return;
  memmove(b->s, b->s + n, b->len - n);
  b->len -= n;
  if (b->s) b->s[b->len] = 0;
}

bool tpr_text_blank(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isspace((unsigned char)s[i])) return false;
  return true;
}

// --- the table of formats ---------------------------------------------------------

// To add a format: an enum value in tool_parse.h, a parse function
// (tool_formats.h) and a row here. parse gets the text between start and
// end (end NULL: from start to the end of the answer) and appends the calls
// it holds (returns how many; 0: the block is not a call and stays content).
// at_start: the block can only begin the answer (after whitespace), and its
// start is part of it (Llama 3's JSON). detect: strings that a chat
// template's text all holds when it uses the format (more specific rows
// first).
static const struct format {
  const char *name, *start, *end;
  int (*parse)(tpr_out_parser *p, const char *s, size_t n);
  bool at_start;
  const char *detect[3];
} formats[TPR_TOOL_FMT_COUNT] = {
    [TPR_TOOL_FMT_NONE] = {"none", NULL, NULL, NULL, false, {NULL}},
    [TPR_TOOL_FMT_HERMES] = {"hermes", "<tool_call>", "</tool_call>", tool_parse_hermes, false, {"<tool_call>"}},
    [TPR_TOOL_FMT_MINIMAX_M2] = {"minimax_m2", "<minimax:tool_call>", "</minimax:tool_call>", tool_parse_minimax_m2,
                                 false, {"<minimax:tool_call>"}},
    [TPR_TOOL_FMT_QWEN3_CODER] = {"qwen3_coder", "<tool_call>", "</tool_call>", tool_parse_qwen3_coder, false,
                                  {"<tool_call>", "<function="}},
    [TPR_TOOL_FMT_GLM45] = {"glm45", "<tool_call>", "</tool_call>", tool_parse_glm45, false,
                            {"<tool_call>", "<arg_key>"}},
    // Hy3's template builds its tags with '<tool_calls{}>'.format(':opensource')
    [TPR_TOOL_FMT_HUNYUAN] = {"hunyuan", "<tool_calls:opensource>", "</tool_calls:opensource>", tool_parse_hunyuan,
                              false, {"toolsep_token", ":opensource"}},
    [TPR_TOOL_FMT_HUNYUAN_PREVIEW] = {"hunyuan_preview", "<tool_calls>", "</tool_calls>", tool_parse_hunyuan, false,
                                      {"<tool_calls>", "<tool_sep>"}},
    [TPR_TOOL_FMT_KIMI_K2] = {"kimi_k2", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                              tool_parse_kimi_k2, false, {"<|tool_calls_section_begin|>"}},
    [TPR_TOOL_FMT_DEEPSEEK] = {"deepseek_v3", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", tool_parse_deepseek,
                               false, {"<｜tool▁calls▁begin｜>"}},
    [TPR_TOOL_FMT_MISTRAL] = {"mistral", "[TOOL_CALLS]", NULL, tool_parse_mistral, false, {"[TOOL_CALLS]"}},
    [TPR_TOOL_FMT_LLAMA3_JSON] = {"llama3_json", "{", NULL, tool_parse_llama3_json, true, {"<|python_tag|>"}},
};

// Detection order: a row whose markers contain another row's comes first.
static const tpr_tool_format detect_order[] = {
    TPR_TOOL_FMT_MINIMAX_M2, TPR_TOOL_FMT_KIMI_K2,    TPR_TOOL_FMT_DEEPSEEK,
    TPR_TOOL_FMT_HUNYUAN,    TPR_TOOL_FMT_HUNYUAN_PREVIEW, TPR_TOOL_FMT_GLM45,
    TPR_TOOL_FMT_QWEN3_CODER, TPR_TOOL_FMT_HERMES,    TPR_TOOL_FMT_MISTRAL,
    TPR_TOOL_FMT_LLAMA3_JSON};

const char *tpr_tool_format_name(tpr_tool_format f) {
  return f >= 0 && f < TPR_TOOL_FMT_COUNT ? formats[f].name : "?";
}

bool tpr_tool_format_parse(const char *s, tpr_tool_format *out) {
  for (int f = 0; f < TPR_TOOL_FMT_COUNT; f++)
    if (!strcmp(s, formats[f].name)) return *out = (tpr_tool_format)f, true;
  return false;
}

const char *tpr_tool_format_names(void) {
  static char names[256];
  if (!names[0])
    for (int f = 0; f < TPR_TOOL_FMT_COUNT; f++) {
      if (f) strcat(names, f == TPR_TOOL_FMT_COUNT - 1 ? " or " : ", ");
      strcat(names, formats[f].name);
    }
  return names;
}

const char *tpr_tool_format_start(tpr_tool_format f) {
  return f > 0 && f < TPR_TOOL_FMT_COUNT && !formats[f].at_start ? formats[f].start : NULL;
}

tpr_tool_format tpr_tool_format_detect(const char *t) {
  if (!t) return TPR_TOOL_FMT_NONE;
  for (size_t i = 0; i < sizeof detect_order / sizeof detect_order[0]; i++) {
    const struct format *f = &formats[detect_order[i]];
    bool all = true;
    for (int k = 0; k < 3 && f->detect[k]; k++) all = all && strstr(t, f->detect[k]) != NULL;
    if (all) return detect_order[i];
  }
  return TPR_TOOL_FMT_NONE;
}

const char *tpr_reasoning_detect(const char *t) {
  if (!t) return NULL;
  if (strstr(t, "<think>")) return "<think>";
  // Hy3 builds its tags with '<think{}>'.format(HYTK), HYTK = ':opensource'
  if (strstr(t, "'<think{}>'") && strstr(t, "':opensource'")) return "<think:opensource>";
  return NULL;
}

bool tpr_prompt_opens_think(const char *prompt, const char *think_open) {
  if (!prompt) return false;
  if (!think_open) think_open = "<think>";
  size_t n = strlen(prompt), m = strlen(think_open);
  while (n && isspace((unsigned char)prompt[n - 1])) n--;
  return n >= m && memcmp(prompt + n - m, think_open, m) == 0;
}

// --- the state machine ------------------------------------------------------------

void tpr_out_parser_init(tpr_out_parser *p, tpr_tool_format fmt, bool reasoning, bool starts_in_reasoning,
                         const cJSON *tools) {
  memset(p, 0, sizeof *p);
  p->fmt = fmt >= 0 && fmt < TPR_TOOL_FMT_COUNT ? fmt : TPR_TOOL_FMT_NONE;
  p->reasoning = reasoning;
  p->tools = tools;
  p->state = reasoning && starts_in_reasoning ? S_REASONING : S_CONTENT;
  tpr_out_parser_think_tag(p, "<think>");
}

void tpr_out_parser_think_tag(tpr_out_parser *p, const char *open) {
  if (!open || open[0] != '<' || strlen(open) + 2 > sizeof p->think_open) return;
  snprintf(p->think_open, sizeof p->think_open, "%s", open);
  snprintf(p->think_close, sizeof p->think_close, "</%s", open + 1);
}

// The length of the longest suffix of s[0, n) that is a proper prefix of tag.
static size_t partial_tag(const char *s, size_t n, const char *tag) {
  size_t m = strlen(tag);
  for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
    if (memcmp(s + n - k, tag, k) == 0) return k;
  return 0;
}

static const char *find_tag(const tpr_text_buf *b, const char *tag) {
  return tag ? tool_find(b->s, b->s + b->len, tag) : NULL;
}

// One step; false: nothing more to do until more bytes come.
static bool step(tpr_out_parser *p) {
  tpr_text_buf *b = &p->pending;
  const struct format *f = &formats[p->fmt];
  if (!b->len) return false;
  if (p->state == S_CONTENT && f->at_start && !p->start_decided) {
    // A block that can only begin the answer: whitespace waits; then its
    // start (kept in the block) or anything else decides once.
    size_t i = 0;
    while (i < b->len && isspace((unsigned char)b->s[i])) i++;
    if (i == b->len) return false;
    p->start_decided = true;
    if (!strncmp(b->s + i, f->start, strlen(f->start))) {
      buf_add(p, &p->content, b->s, i);
      buf_drop_front(b, i);
      p->state = S_CALL;
      return true;
    }
  }
  if (p->state == S_CONTENT) {
    const char *th = p->reasoning ? find_tag(b, p->think_open) : NULL, *tc = f->at_start ? NULL : find_tag(b, f->start);
    const char *at = th && (!tc || th < tc) ? th : tc;
    if (at) {
      buf_add(p, &p->content, b->s, (size_t)(at - b->s));
      buf_drop_front(b, (size_t)(at - b->s) + strlen(at == th ? p->think_open : f->start));
      p->state = at == th ? S_REASONING : S_CALL;
      return true;
    }
    size_t h1 = p->reasoning ? partial_tag(b->s, b->len, p->think_open) : 0,
           h2 = f->start && !f->at_start ? partial_tag(b->s, b->len, f->start) : 0;
    size_t hold = h1 > h2 ? h1 : h2;
    buf_add(p, &p->content, b->s, b->len - hold);
    buf_drop_front(b, b->len - hold);
    return false;
  }
  if (p->state == S_REASONING) {
    const char *at = find_tag(b, p->think_close);
    if (at) {
      buf_add(p, &p->reasoning_text, b->s, (size_t)(at - b->s));
      buf_drop_front(b, (size_t)(at - b->s) + strlen(p->think_close));
      p->state = S_CONTENT;
      return true;
    }
    size_t hold = partial_tag(b->s, b->len, p->think_close);
    buf_add(p, &p->reasoning_text, b->s, b->len - hold);
    buf_drop_front(b, b->len - hold);
    return false;
  }
  // S_CALL: the block waits whole for its end tag (no end tag: for the end
  // of the answer, tpr_out_parser_finish).
  const char *at = find_tag(b, f->end);
  if (!at) return false;
  size_t body = (size_t)(at - b->s);
  if (f->parse(p, b->s, body) <= 0) {  // not a call: the block as it was generated
    buf_add(p, &p->content, f->start, strlen(f->start));
    buf_add(p, &p->content, b->s, body + strlen(f->end));
  }
  buf_drop_front(b, body + strlen(f->end));
  p->state = S_CONTENT;
  return true;
}

void tpr_out_parser_feed(tpr_out_parser *p, const char *s, size_t n) {
  buf_add(p, &p->pending, s, n);
  while (step(p)) {
  }
}

void tpr_out_parser_finish(tpr_out_parser *p) {
  tpr_text_buf *b = &p->pending;
  if (p->state == S_REASONING) {
    buf_add(p, &p->reasoning_text, b->s, b->len);
  } else if (p->state == S_CALL) {
    const struct format *f = &formats[p->fmt];
    // A block that runs to the end of the answer is parsed now; any block
    // left unparsed is content as generated (its start tag included).
    if (f->end || f->parse(p, b->s, b->len) <= 0) {
      if (!f->at_start) buf_add(p, &p->content, f->start, strlen(f->start));
      buf_add(p, &p->content, b->s, b->len);
    }
  } else {
    buf_add(p, &p->content, b->s, b->len);
  }
  b->len = 0;
  p->state = S_CONTENT;
}

void tpr_out_parser_free(tpr_out_parser *p) {
  free(p->pending.s), free(p->content.s), free(p->reasoning_text.s);
  for (int i = 0; i < p->n_calls; i++) free(p->calls[i].name), free(p->calls[i].arguments);
  free(p->calls);
  memset(p, 0, sizeof *p);
}
