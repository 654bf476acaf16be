#!/usr/bin/env python3
"""Random differential test of tpr's Jinja interpreter against jinja2 as
transformers configures it (no fixture; run by hand, like check_openai_client.py).

Generates N random expression templates ({{ ... }}) over literals, variables,
operators, filters, methods, tests, slices and if-expressions, renders each
with transformers' environment and with `tpr chat-template --template`, and
prints every case where tpr renders something else (DIFF), renders where
Python failed, or refuses what Python rendered (REFUSED: allowed, but listed).

  check_jinja_random.py SEED N [--tpr build/bin/tpr] [--statements]

--statements: random statement templates instead (for/if/else/set/
namespace/comments with random -/+ whitespace control around text with
newlines and indents), which check trim_blocks/lstrip_blocks and scoping.

jinja2 folds constant subexpressions at compile time, with other rules than at
run time (slicing a literal bool gives Undefined, a variable's bool a
TypeError): tpr follows the run-time rules, so REFUSED lines on literal
slices are expected.
"""
import copy
import json
import os
import random
import subprocess
import sys
import tempfile

from transformers.utils import chat_template_utils as ctu
env = ctu._compile_jinja_template("").environment
R = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
STRS = ["'abc'", "'A b C'", "''", "' x '", "'héllo'", "'日本'", "'a,b,c'", "'<t>'", "\"it's\"", "'1'", "'2.5'", "'\\n'"]
NUMS = ["0", "1", "-3", "7", "2.5", "-0.5", "1e3", "10", "3.0"]
VARS = {"s": "Mixed Case x", "n": 5, "f": 1.5, "l": [3, 1, 2], "w": ["b", "A", "c"], "d": {"k": 1, "a": [1, 2]}, "e": [], "z": None, "t": True,
        "m": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "x": 1}]}
def lit(depth):
    k = R.randrange(6)
    if k == 0: return R.choice(STRS)
    if k == 1: return R.choice(NUMS)
    if k == 2: return R.choice(["true", "false", "none", "True", "None"])
    if k == 3 and depth < 2: return "[" + ", ".join(expr(depth + 1) for _ in range(R.randrange(4))) + "]"
    if k == 4 and depth < 2: return "{" + ", ".join(f"{R.choice(STRS)}: {expr(depth+1)}" for _ in range(R.randrange(3))) + "}"
    return R.choice(list(VARS) + ["undef"])
FILTERS = ["length", "upper", "lower", "trim", "first", "last", "join", "join(', ')", "list", "sort", "unique|list", "reverse|list", "default('D')",
           "string", "int", "float", "abs", "round", "round(1)", "tojson", "tojson(indent=2)", "replace('a', 'X')", "title", "capitalize", "count",
           "items|list", "map('upper')|list", "select|list", "reject|list", "sum", "min", "max", "dictsort", "wordcount", "indent(2)", "e", "selectattr('role')|list", "map(attribute='role')|list"]
METHODS = ["split()", "split(',')", "strip()", "strip('x')", "startswith('a')", "endswith('c')", "replace('b', '_')", "find('b')", "count('a')",
           "upper()", "lower()", "get('k')", "get('q', 0)", "items()|list", "keys()|list", "values()|list", "lstrip()", "rstrip()", "title()", "index(1)", "splitlines()"]
OPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or", "**"]
TESTS = ["defined", "none", "string", "number", "integer", "mapping", "sequence", "iterable", "odd", "even", "true", "false", "divisibleby 2", "eq 1", "in [1, 2]"]
def statements(R, N, TPR):
    """Random statement templates: for/if/else/set/namespace/comments with
    random -/+ whitespace control around text with newlines and indents."""
    VARS = {"l": [1, 2, 3], "m": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], "d": {"a": 1, "b": 2}, "s": "txt", "t": True}
    WS = ["", " ", "  ", "\n", "\n  ", "\t", " \n", "\n\n"]
    def tag(body):
        l = R.choice(["", "", "-", "+"]); r = R.choice(["", "", "-", "+"])
        return "{%" + l + " " + body + " " + r + "%}"
    def var(e):
        return "{{" + R.choice(["", "-"]) + " " + e + " " + R.choice(["", "-"]) + "}}"
    def text():
        return R.choice(WS) + R.choice(["x", "y", "", "<a>", "z "]) + R.choice(WS)
    EXPRS = ["loop.index", "loop.first", "x", "ns.c", "s", "v", "k", "loop.length", "x ~ loop.revindex", "y", "x * 2", "m[0].role"]
    def block(depth):
        out = []
        for _ in range(R.randrange(1, 4)):
            k = R.randrange(8)
            if k == 0 or depth > 2: out.append(text())
            elif k == 1: out.append(var(R.choice(EXPRS)))
            elif k == 2: out.append(tag("if " + R.choice(["t", "x == 2", "loop.first", "not s", "x is defined", "y is defined"])) + block(depth + 1) + (tag("else") + block(depth + 1) if R.random() < .4 else "") + tag("endif"))
            elif k == 3: out.append(tag("for x in " + R.choice(["l", "[4, 5]", "l if x > 1", "range(2)"])) + block(depth + 1) + (tag("else") + text() if R.random() < .2 else "") + tag("endfor"))
            elif k == 4: out.append(tag("set y = " + R.choice(["1", "x", "'q'", "loop.index", "s ~ 1"])))
            elif k == 5: out.append(tag("set ns.c = ns.c + 1"))
            elif k == 6: out.append(tag("for k, v in d.items()") + block(depth + 1) + tag("endfor"))
            else: out.append("{#" + R.choice(["", "-"]) + " c " + R.choice(["", "-"]) + "#}" + text())
        return "".join(out)
    kw = json.dumps(VARS)
    tmp = tempfile.mkdtemp()
    bad = ok = both = refused = 0
    for i in range(N):
        t = tag("set ns = namespace(c=0)") + text() + block(0) + text() + var("ns.c") + R.choice(["", "\n", "\n\n"])
        try: py = ("ok", env.from_string(t).render(**copy.deepcopy(VARS)))
        except Exception as e: py = ("err", str(e))
        p = os.path.join(tmp, "t.jinja"); open(p, "w").write(t)
        r = subprocess.run([TPR, "chat-template", "--template", p, "--kwargs", kw], capture_output=True, text=True)
        if py[0] == "ok" and r.returncode == 0 and r.stdout == py[1]: ok += 1
        elif py[0] == "err" and r.returncode != 0: both += 1
        elif py[0] == "ok" and r.returncode != 0: refused += 1; print("REFUSED", repr(t), r.stderr[:200])
        else: bad += 1; print("DIFF", repr(t), "\n py:", repr(py[1])[:300], "\n tpr:", repr(r.stdout)[:300])
    print(f"ok {ok} both-failed {both} refused {refused} DIFFERENT {bad}")


def expr(depth=0):
    if depth > 3: return lit(depth)
    k = R.randrange(9)
    if k <= 1: return lit(depth)
    if k == 2: return f"({expr(depth+1)} {R.choice(OPS)} {expr(depth+1)})"
    if k == 3: return f"({expr(depth+1)})|{R.choice(FILTERS)}"
    if k == 4: return f"({expr(depth+1)}).{R.choice(METHODS)}"
    if k == 5: return f"({expr(depth+1)} is {'not ' if R.random() < .3 else ''}{R.choice(TESTS)})"
    if k == 6:
        sub = R.choice(['0', '-1', '1:', ':2', '::-1', '::2', "'k'", '5'])
        return f"({expr(depth+1)})[{sub}]"
    if k == 7: return f"({expr(depth+1)} if {expr(depth+1)} else {expr(depth+1)})"
    return f"(not {expr(depth+1)})"
N = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 300
TPR = sys.argv[sys.argv.index("--tpr") + 1] if "--tpr" in sys.argv else "build/bin/tpr"
if "--statements" in sys.argv:
    statements(R, N, TPR)
    sys.exit(0)
kw = json.dumps(VARS)
cases = []
for i in range(N):
    t = "{{ " + expr() + " }}"
    try:
        out = ("ok", env.from_string(t).render(**copy.deepcopy(VARS)))
    except Exception as ex:
        out = ("err", type(ex).__name__ + ": " + str(ex))
    cases.append((t, out))
tmp = tempfile.mkdtemp(prefix="jinja_random_")
bad = refused = okc = both_err = 0
for i, (t, out) in enumerate(cases):
    p = os.path.join(tmp, f"{i}.jinja")
    open(p, "w").write(t)
    r = subprocess.run([TPR, "chat-template", "--template", p, "--kwargs", kw], capture_output=True, text=True)
    if out[0] == "ok":
        if r.returncode == 0 and r.stdout == out[1]: okc += 1
        elif r.returncode != 0:
            if " at 0x" in out[1]: okc += 1
            else:
                refused += 1; print("REFUSED", t, "| py:", repr(out[1])[:80], "| tpr:", r.stderr.strip()[:150])
        else:
            bad += 1; print("DIFF", t, "| py:", repr(out[1])[:120], "| tpr:", repr(r.stdout)[:120])
    else:
        if r.returncode != 0: both_err += 1
        else:
            bad += 1; print("TPR RENDERED WHERE PY FAILED", t, "| py:", out[1][:100], "| tpr:", repr(r.stdout)[:100])
print(f"ok {okc} both-failed {both_err} refused {refused} DIFFERENT {bad}")
