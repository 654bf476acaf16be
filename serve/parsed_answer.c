// A chat choice's text through the output parser (tool_parse.h) into the
// response's fields: the whole answer's message, or each streamed chunk's
// delta (what the parser added since the last chunk). No engine, no HTTP:
// answer.c feeds it the detokenized text, test_serve_units a scripted one.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "serve/serve.h"

// "call_" and 24 random hex digits, as vLLM names calls.
static void make_call_id(char id[32]) {
  unsigned char b[12] = {0};
  if (getrandom(b, sizeof b, GRND_NONBLOCK) != (ssize_t)sizeof b)
    for (size_t i = 0; i < sizeof b; i++) b[i] = (unsigned char)rand();
  int o = snprintf(id, 32, "call_");
  for (size_t i = 0; i < sizeof b; i++) o += snprintf(id + o, 32 - (size_t)o, "%02x", b[i]);
}

void tpr_parsed_init(tpr_parsed_choice *pc, const tpr_oai_request *r) {
  memset(pc, 0, sizeof *pc);
  tpr_out_parser_init(&pc->p, r->tool_format, r->reasoning, r->starts_in_reasoning, r->tools);
  if (r->think_open) tpr_out_parser_think_tag(&pc->p, r->think_open);
  pc->parallel = r->parallel_tool_calls;
  pc->has_reasoning = r->reasoning;
}

void tpr_parsed_free(tpr_parsed_choice *pc) {
  tpr_out_parser_free(&pc->p);
  free(pc->ids);
  memset(pc, 0, sizeof *pc);
}

// The calls the answer shows: parallel_tool_calls false keeps the first.
static int shown(const tpr_parsed_choice *pc) { return !pc->parallel && pc->p.n_calls > 1 ? 1 : pc->p.n_calls; }

bool tpr_parsed_feed(tpr_parsed_choice *pc, const char *text, size_t upto, bool final) {
  if (upto > pc->fed) tpr_out_parser_feed(&pc->p, text + pc->fed, upto - pc->fed);
  if (upto > pc->fed) pc->fed = upto;
  if (final) tpr_out_parser_finish(&pc->p);
  int n = shown(pc);
  if (n > pc->n_ids) {  // every call gets its id once, the same in every chunk
    char(*ids)[32] = realloc(pc->ids, (size_t)n * sizeof *ids);
    if (!ids) return false;
    pc->ids = ids;
    for (; pc->n_ids < n; pc->n_ids++) make_call_id(pc->ids[pc->n_ids]);
  }
  return !pc->p.oom;
}

// finish_reason "tool_calls" when the answer stopped (not cut by the
// length) with calls in it.
static const char *finish_of(const char *finish, int n_calls) {
  return finish && n_calls > 0 && !strcmp(finish, "stop") ? "tool_calls" : finish;
}

bool tpr_parsed_delta(tpr_parsed_choice *pc, const char *finish, tpr_oai_choice *oc) {
  const tpr_out_parser *p = &pc->p;
  size_t cl = p->content.len - pc->sent_content, rl = p->reasoning_text.len - pc->sent_reasoning;
  int n = shown(pc), nc = n > pc->sent_calls ? n - pc->sent_calls : 0;
  oc->parsed = true;
  oc->text = cl ? p->content.s + pc->sent_content : NULL, oc->text_len = cl;
  oc->reasoning = rl ? p->reasoning_text.s + pc->sent_reasoning : NULL, oc->reasoning_len = rl;
  oc->calls = nc ? p->calls + pc->sent_calls : NULL, oc->n_calls = nc, oc->call_index0 = pc->sent_calls;
  oc->call_ids = nc ? (const char(*)[32])(pc->ids + pc->sent_calls) : NULL;
  oc->finish = finish_of(finish, n);
  pc->sent_content = p->content.len, pc->sent_reasoning = p->reasoning_text.len, pc->sent_calls += nc;
  return cl || rl || nc;
}

void tpr_parsed_full(const tpr_parsed_choice *pc, const char *finish, tpr_oai_choice *oc) {
  const tpr_out_parser *p = &pc->p;
  int n = shown(pc);
  oc->parsed = true;
  oc->text = p->content.s, oc->text_len = p->content.len;
  oc->content_null = (n > 0 && tpr_text_blank(p->content.s, p->content.len)) ||
                     (!p->content.len && p->reasoning_text.len);
  oc->has_reasoning = pc->has_reasoning;
  oc->reasoning = p->reasoning_text.len ? p->reasoning_text.s : NULL, oc->reasoning_len = p->reasoning_text.len;
  oc->calls = p->calls, oc->n_calls = n, oc->call_index0 = 0, oc->call_ids = (const char(*)[32])pc->ids;
  oc->finish = finish_of(finish, n);
}
