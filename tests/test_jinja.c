// tpr's Jinja interpreter (jinja/) construct by construct, against jinja2 as
// transformers configures it: tests/fixtures/chat_templates/units.json
// (scripts/reference/make_chat_template_fixture.py) holds 73 small
// templates covering literals, printing, operators, slices, string/list/dict
// methods, loops, namespaces, macros, call/filter/set blocks, tests,
// filters, tojson, whitespace control, raise_exception, with Python's output
// (or failure). Negative control: where jinja2 without trim_blocks and
// lstrip_blocks renders differently, tpr must not match that. Then what the
// interpreter refuses (constructs outside its subset, named with their line),
// its limits (output, steps, depth, memory) and a randomized tojson round trip.
#include "test_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja.h"
#include "runtime/file_io.h"

static tpr_status render(const char *tmpl, const char *vars, const tpr_jinja_limits *lim, char **out,
                         tpr_jinja_error *err) {
  tpr_jinja_template *t = NULL;
  *out = NULL;
  tpr_status rc = tpr_jinja_parse(tmpl, strlen(tmpl), &t, err);
  if (rc == TPR_OK) rc = tpr_jinja_render_json(t, vars, strlen(vars), lim, out, NULL, err);
  tpr_jinja_free(t);
  tpr_clear_error();
  return rc;
}

static void test_units(void **state) {
  (void)state;
  setenv("SOURCE_DATE_EPOCH", "1721952000", 1);
  uint8_t *b = NULL;
  size_t n = 0;
  assert_int_equal(tpr_file_read(TPR_FIXTURES "/chat_templates/units.json", &b, &n), TPR_OK);
  cJSON *j = cJSON_ParseWithLength((const char *)b, n);
  free(b);
  assert_non_null(j);
  const cJSON *u;
  int bad = 0, count = 0, controls = 0;
  cJSON_ArrayForEach(u, cJSON_GetObjectItem(j, "units")) {
    const char *tmpl = cJSON_GetObjectItem(u, "template")->valuestring;
    const char *vars = cJSON_GetObjectItem(u, "vars")->valuestring;
    const cJSON *exp = cJSON_GetObjectItem(u, "expected"), *raise = cJSON_GetObjectItem(u, "raise"),
                *no_trim = cJSON_GetObjectItem(u, "no_trim");
    char *out = NULL;
    tpr_jinja_error err;
    tpr_status rc = render(tmpl, vars, NULL, &out, &err);
    bool ok;
    if (exp && strstr(exp->valuestring, " at 0x"))  // Python printed an object's address: tpr refuses
      ok = rc != TPR_OK && !err.raised;
    else if (exp)
      ok = rc == TPR_OK && strcmp(out, exp->valuestring) == 0;
    else if (raise)
      ok = rc != TPR_OK && err.raised && strcmp(err.message, raise->valuestring) == 0;
    else
      ok = rc != TPR_OK;
    if (ok && no_trim) {
      controls++;
      ok = strcmp(out, no_trim->valuestring) != 0;
    }
    if (!ok) {
      bad++;
      printf("MISMATCH %s\n  want: %s\n  got:  %s\n", tmpl,
             exp ? exp->valuestring : raise ? raise->valuestring : cJSON_GetObjectItem(u, "error")->valuestring,
             rc == TPR_OK ? out : err.message);
    }
    count++;
    free(out);
  }
  cJSON_Delete(j);
  printf("%d constructs, %d with a trim_blocks control\n", count, controls);
  assert_true(count >= 50 && controls >= 3);
  assert_int_equal(bad, 0);
}

// Outside the subset: an error that names the construct and its line, never output.
static void test_refusals(void **state) {
  (void)state;
  static const struct {
    const char *tmpl, *want;
  } cases[] = {
      {"a\n{% include 'x' %}", "line 2: the 'include' tag is not supported"},
      {"{% extends 'base' %}", "'extends' tag is not supported"},
      {"{% do x.append(1) %}", "'do' tag is not supported"},
      {"{% import 'm' as m %}", "'import' tag is not supported"},
      {"{% frobnicate %}", "unknown tag 'frobnicate'"},
      {"\n\n{{ x|frob }}", "line 3: no filter named 'frob'"},
      {"{{ x|urlize }}", "no filter named 'urlize'"},
      {"{{ x|batch(2) }}", "no filter named 'batch'"},
      {"{{ x is frob }}", "no test named 'frob'"},
      {"{% for x in y recursive %}{% endfor %}", "recursive for loops are not supported"},
      {"{{ f(*args) }}", "*args and **kwargs in calls are not supported"},
      {"{{ '{:>5}'.format(1) }}", "format specs"},
      {"{{ '%5s' % 1 }}", "is not supported (only"},
      {"{{ 'a'.isdigit() }}", "string method 'isdigit' is not supported"},
      {"{% set l = [] %}{{ l.append(1) }}", "access to attribute 'append' of 'list' object is unsafe"},
      {"{% set d = {} %}{{ d.update({}) }}", "'update' of 'dict' object is unsafe"},
      {"{{ [1]|reverse }}", "printing a generator is not supported"},
      {"{{ {}.items() }}", "printing a view is not supported"},
      {"{% if x %}", "unexpected end of template: expected 'elif'"},
      {"{% endif %}", "unexpected 'endif'"},
      {"{{ x", "unclosed"},
      {"{{ 'abc }}", "unterminated string"},
      {"{# x", "missing end of comment"},
      {"{{ ) }}", "unexpected ')'"},
      {"{% set ns = namespace() %}{% set ns._x = 1 %}", "underscore-prefixed"},
      {"{{ namespace(_y=1) }}", "underscore-prefixed"},
      {"{{ range(200000)|length }}", "MAX_RANGE"},
      {"{{ 1 // 0 }}", "division or modulo by zero"},
      {"{{ 9223372036854775807 + 1 }}", "integer overflow"},
      {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "takes not more than 1 argument"},
      {"{% macro m(a) %}{% endmacro %}{{ m(b=2) }}", "no keyword argument 'b'"},
      {"{{ 1|tojson(ensure_ascii=true) }}", "ensure_ascii=True"},
      {"{% break %}", "break or continue outside a loop"},
      {"\xff", "not valid UTF-8"},
      {"{% set ns = namespace() %}{% set ns.x = ns %}{{ ns }}", "contains itself"},
      {"{% set ns = namespace() %}{% set ns.x = ns %}{{ ns|tojson }}", "Namespace is not JSON serializable"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out = NULL;
    tpr_jinja_error err;
    tpr_status rc = render(cases[i].tmpl, "{\"x\": \"s\", \"y\": [1]}", NULL, &out, &err);
    if (rc == TPR_OK || !strstr(err.message, cases[i].want))
      fail_msg("'%s': want an error with '%s', got %s '%s'", cases[i].tmpl, cases[i].want, rc == TPR_OK ? "output" : "error",
               rc == TPR_OK ? out : err.message);
    assert_false(err.raised);
    free(out);
  }
}

static void test_limits(void **state) {
  (void)state;
  tpr_jinja_limits lim = {.max_output = 1000, .max_steps = 5000, .max_depth = 8, .max_memory = 8 << 20};
  static const struct {
    const char *tmpl, *want;
  } cases[] = {
      {"{% for i in range(100) %}{{ 'x' * 20 }}{% endfor %}", "output is longer than 1000 bytes"},
      {"{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", "more than 5000 loop iterations"},
      {"{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", "nested deeper than 8 calls"},
      {"{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
       "bytes of memory"},
      {"{{ 'ab' * 100000000000 }}", "longer than the output limit"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out = NULL;
    tpr_jinja_error err;
    tpr_status rc = render(cases[i].tmpl, "{}", &lim, &out, &err);
    if (rc == TPR_OK || !strstr(err.message, cases[i].want))
      fail_msg("'%s': want '%s', got '%s'", cases[i].tmpl, cases[i].want, rc == TPR_OK ? "output" : err.message);
  }
  // Deep nesting in the source is refused by the parser, not by the stack.
  char deep[4096];
  size_t k = 0;
  k += (size_t)sprintf(deep, "{{ ");
  for (int i = 0; i < 1000; i++) deep[k++] = '(';
  deep[k++] = '1';
  for (int i = 0; i < 1000; i++) deep[k++] = ')';
  sprintf(deep + k, " }}");
  char *out = NULL;
  tpr_jinja_error err;
  assert_int_not_equal(render(deep, "{}", NULL, &out, &err), TPR_OK);
  assert_non_null(strstr(err.message, "too deep"));
  // Within the limits the same templates render.
  assert_int_equal(render("{% for i in range(10) %}{{ i }}{% endfor %}", "{}", &lim, &out, &err), TPR_OK);
  assert_string_equal(out, "0123456789");
  free(out);
}

// tojson of random Unicode strings reads back as the same string (cJSON), and
// prints non-ASCII as it is (ensure_ascii=False).
static void test_tojson_random(void **state) {
  (void)state;
  for (int iter = 0; iter < 300; iter++) {
    char s[256];
    size_t n = 0;
    int len = (int)tt_randint(0, 40);
    for (int i = 0; i < len; i++) {
      int kind = (int)tt_randint(0, 4);
      uint32_t cp = kind == 0 ? (uint32_t)tt_randint(1, 0x1f)
                    : kind == 1 ? (uint32_t)tt_randint(0x20, 0x7e)
                    : kind == 2 ? (uint32_t)tt_randint(0xa0, 0xd7ff)
                    : kind == 3 ? (uint32_t)tt_randint(0x10000, 0x10ffff)
                                : (uint32_t)"\"\\/\n"[tt_randint(0, 3)];
      if (cp < 0x80) s[n++] = (char)cp;
      else if (cp < 0x800) { s[n++] = (char)(0xc0 | (cp >> 6)); s[n++] = (char)(0x80 | (cp & 0x3f)); }
      else if (cp < 0x10000) {
        s[n++] = (char)(0xe0 | (cp >> 12)); s[n++] = (char)(0x80 | ((cp >> 6) & 0x3f)); s[n++] = (char)(0x80 | (cp & 0x3f));
      } else {
        s[n++] = (char)(0xf0 | (cp >> 18)); s[n++] = (char)(0x80 | ((cp >> 12) & 0x3f));
        s[n++] = (char)(0x80 | ((cp >> 6) & 0x3f)); s[n++] = (char)(0x80 | (cp & 0x3f));
      }
    }
    s[n] = 0;
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "s", s);
    char *vars = cJSON_PrintUnformatted(v);
    char *out = NULL;
    tpr_jinja_error err;
    assert_int_equal(render("{{ s|tojson }}", vars, NULL, &out, &err), TPR_OK);
    cJSON *back = cJSON_Parse(out);
    assert_true(cJSON_IsString(back));
    assert_string_equal(back->valuestring, s);
    for (size_t i = 0; i < n; i++)  // every non-ASCII byte is printed raw
      if ((unsigned char)s[i] >= 0x80) assert_non_null(strchr(out, s[i]));
    for (const char *u = strstr(out, "\\u"); u; u = strstr(u + 1, "\\u"))  // only controls are \u-escaped
      assert_true(u[2] == '0' && u[3] == '0' && (u[4] == '0' || u[4] == '1'));
    cJSON_Delete(back);
    cJSON_Delete(v);
    free(vars);
    free(out);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_units),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_tojson_random),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
