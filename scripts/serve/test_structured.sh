#!/usr/bin/env bash
# Structured output through tpr serve, curl as the client: usage
#   test_structured.sh TPR_BINARY SOURCE_DIR MPIEXEC NP
# The demo model (its byte-level BPE tokenizer of 4096 ids) with the
# published Qwen2.5 chat template (hermes tool calls), sampled at
# temperature 1 so that only the grammar keeps the text in shape:
#   - response_format json_object: 128 answers (2 requests of n 64): every
#     answer that ended (finish_reason stop; a random model's string can
#     outlast max_tokens) is a JSON object (python3's json), and most end;
#     a streamed answer equals the same answer not streamed;
#   - the negative control: the same requests without response_format give
#     text that mostly does not parse;
#   - response_format json_schema: four schemas (nested objects, arrays with
#     bounds, enums, numbers and integers, optional and required properties),
#     32 answers each, every one valid under its schema (a validator of the
#     subset below, written here from the JSON Schema spec);
#   - tool_choice "required" over two tools and a named function: every
#     answer a tool call of the right name with arguments valid under its
#     parameters, finish_reason "tool_calls".
set -u
TPR=$1 SRC=$2 MPIEXEC=$3 NP=$4
TEST_NAME=tpr_structured_test
. "$(dirname "$0")/test_lib.sh"

cp -r "$SRC/tests/fixtures/demo_model" "$W/m"
cp "$SRC/tests/fixtures/chat_templates/templates/Qwen-Qwen2.5-7B-Instruct.jinja" "$W/m/chat_template.jinja"
rm -f "$W/port"
if [ "$NP" -gt 1 ]; then
  "$MPIEXEC" ${MPI_ARGS:-} -np "$NP" --oversubscribe "$TPR" serve --model "$W/m" --tp "$NP" --port 0 \
    --port-file "$W/port" >"$W/server.log" 2>&1 &
else
  "$TPR" serve --model "$W/m" --port 0 --port-file "$W/port" >"$W/server.log" 2>&1 &
fi
SERVER=$!
for _ in $(seq 300); do [ -s "$W/port" ] && break; sleep 0.1; done
[ -s "$W/port" ] || { cat "$W/server.log"; echo "server did not start"; exit 1; }
URL="http://127.0.0.1:$(cat "$W/port")/v1/chat/completions"
grep -q "tool calls hermes" "$W/server.log" && pass "the template's tool calls are hermes" || fail "tool-call format"

post() { curl -s -m 600 "$URL" -H 'content-type: application/json' -d @"$1"; }

# $1: the request file; $2: a python file run with the response as `a` and
# parses(text) (whether text is a JSON object) at hand.
check() { post "$1" >"$1.out"; python3 - "$1.out" "$2" <<'PY'
import json, sys
def parses(t):
    try:
        return isinstance(json.loads(t), dict)
    except ValueError:
        return False
a = json.load(open(sys.argv[1]))
exec(open(sys.argv[2]).read())
PY
}

cat >"$W/validate.py" <<'PY'
# A validator of the JSON Schema subset tpr's grammar implements (type and
# type lists, properties with required and no other keys, items, minItems,
# maxItems, minLength, maxLength, enum, const), from the JSON Schema spec: bool is not a number,
# an integer is a number without a fraction (1.0 is one).
import json
def kind_ok(v, t):
    if t == "object": return isinstance(v, dict)
    if t == "array": return isinstance(v, list)
    if t == "string": return isinstance(v, str)
    if t == "boolean": return isinstance(v, bool)
    if t == "null": return v is None
    if t == "number": return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "integer": return kind_ok(v, "number") and float(v).is_integer()
    raise ValueError(t)
def valid(v, s):
    if "enum" in s and v not in s["enum"]: return False
    if "const" in s and v != s["const"]: return False
    t = s.get("type")
    if t is not None and not any(kind_ok(v, x) for x in (t if isinstance(t, list) else [t])): return False
    if isinstance(v, str) and not (s.get("minLength", 0) <= len(v) <= s.get("maxLength", len(v))): return False
    if isinstance(v, dict) and "properties" in s:
        if set(v) - set(s["properties"]): return False
        if any(r not in v for r in s.get("required", [])): return False
        if not all(valid(v[k], s["properties"][k]) for k in v): return False
    if isinstance(v, list):
        if len(v) < s.get("minItems", 0) or ("maxItems" in s and len(v) > s["maxItems"]): return False
        if "items" in s and not all(valid(x, s["items"]) for x in v): return False
    return True
PY


# -- json_object: 2 x 64 answers. A random model's strings can outlast any
#    max_tokens (a cut answer is a prefix, finish_reason "length"): every
#    answer that ended must be a JSON object, and most must end.
cat >"$W/ended.py" <<'PY'
ended = [c for c in a["choices"] if c["finish_reason"] == "stop"]
print(len(ended), sum(parses(c["message"]["content"]) for c in ended))
PY
ended=0 good=0
for seed in 11 12; do
  printf '{"messages": [{"role": "user", "content": "Describe a city as JSON."}], "n": 64, "temperature": 1, "seed": %d, "max_tokens": 400, "response_format": {"type": "json_object"}}' "$seed" >"$W/obj$seed.json"
  read -r e g < <(check "$W/obj$seed.json" "$W/ended.py" 2>&1)
  ended=$((ended + ${e:-0})) good=$((good + ${g:-0}))
done
[ "$good" = "$ended" ] && [ "$ended" -ge 96 ] &&
  pass "json_object: $good of the $ended answers that ended (of 128) parse as JSON objects" ||
  fail "json_object: $good of $ended ended answers parse (of 128)"

# -- the control: no response_format, the same sampling
sed 's/, "response_format": {"type": "json_object"}//' "$W/obj11.json" >"$W/plain.json"
cat >"$W/parses.py" <<'PY'
print(sum(parses(c["message"]["content"]) for c in a["choices"]))
PY
r=$(check "$W/plain.json" "$W/parses.py" 2>&1)
[ "${r:-64}" -lt 32 ] && pass "control: without response_format $r of 64 answers parse as JSON objects" ||
  fail "control: without response_format $r of 64 answers parse"

# -- streamed = not streamed (one choice, a fixed seed)
printf '{"messages": [{"role": "user", "content": "JSON please."}], "temperature": 1, "seed": 5, "max_tokens": 300, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object", "properties": {"id": {"type": "string", "maxLength": 12}, "xs": {"type": "array", "items": {"type": "number"}, "maxItems": 4}}, "required": ["id", "xs"]}}}}' >"$W/one.json"
whole=$(post "$W/one.json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])')
sed 's/"seed": 5,/"seed": 5, "stream": true,/' "$W/one.json" >"$W/one_s.json"
streamed=$(post "$W/one_s.json" | python3 -c '
import json, sys
out = ""
for line in sys.stdin:
    line = line.strip()
    if line.startswith("data: ") and line != "data: [DONE]":
        for c in json.loads(line[6:])["choices"]:
            out += c["delta"].get("content") or ""
print(out)')
[ -n "$whole" ] && [ "$whole" = "$streamed" ] && python3 -c 'import json,sys; json.loads(sys.argv[1])' "$whole" &&
  pass "json_schema streamed = not streamed, and parses" || fail "json_schema streamed: [$streamed] vs [$whole]"

# -- json_schema: four schemas, 32 answers each, each valid
i=0
while IFS= read -r schema; do
  i=$((i + 1))
  printf '{"messages": [{"role": "user", "content": "Fill in the form."}], "n": 32, "temperature": 1, "seed": %d, "max_tokens": 400, "response_format": {"type": "json_schema", "json_schema": {"name": "form", "schema": %s}}}' "$((20 + i))" "$schema" >"$W/schema$i.json"
  printf 'import json\nexec(open("%s").read())\ns = json.loads(r"""%s""")\nbad = [c["message"]["content"] for c in a["choices"] if c["finish_reason"] != "stop" or not valid(json.loads(c["message"]["content"]), s)]\nprint("ok", len(a["choices"]) - len(bad), bad[:1])\n' "$W/validate.py" "$schema" >"$W/check$i.py"
  r=$(check "$W/schema$i.json" "$W/check$i.py" 2>&1)
  case "$r" in "ok 32 []") pass "json_schema $i: 32 of 32 valid";; *) fail "json_schema $i: $r";; esac
done <<'SCHEMAS'
{"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 8}, "maxItems": 3}}, "required": ["name", "age"]}
{"type": "object", "properties": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}, "kind": {"enum": ["a", "b", 3, null]}}, "required": ["point", "kind"]}
{"type": "array", "items": {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": ["integer", "null"]}}, "required": ["ok"]}, "minItems": 1, "maxItems": 4}
{"type": "object", "properties": {"id": {"const": "x-1"}, "score": {"type": "number"}, "note": {"type": "string", "maxLength": 16}}, "required": ["id", "score"]}
SCHEMAS

# -- forced tool calls: "required" over two tools, then a named one
TOOLS=$(cat "$SRC/docs/examples/weather_tools.json")
printf '{"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": %s, "tool_choice": "required", "n": 16, "temperature": 1, "seed": 3, "max_tokens": 400}' "$TOOLS" >"$W/req.json"
printf 'import json\nexec(open("%s").read())\ntools = {t["function"]["name"]: t["function"]["parameters"] for t in json.load(open("%s"))}\nbad = []\nfor c in a["choices"]:\n    calls = c["message"].get("tool_calls") or []\n    if c["finish_reason"] != "tool_calls" or len(calls) != 1 or calls[0]["function"]["name"] not in tools or not valid(json.loads(calls[0]["function"]["arguments"]), tools[calls[0]["function"]["name"]]) or (NAME and calls[0]["function"]["name"] != NAME): bad.append(c)\nprint("ok", len(a["choices"]) - len(bad), bad[:1])\n' "$W/validate.py" "$SRC/docs/examples/weather_tools.json" >"$W/calls.py"
sed 's/NAME/None/g' "$W/calls.py" >"$W/calls_any.py"
r=$(check "$W/req.json" "$W/calls_any.py" 2>&1)
case "$r" in "ok 16 []") pass "tool_choice required: 16 of 16 answers are one valid call";; *) fail "tool_choice required: $r";; esac
sed 's/"tool_choice": "required"/"tool_choice": {"type": "function", "function": {"name": "add"}}/' "$W/req.json" >"$W/named.json"
sed 's/NAME/"add"/g' "$W/calls.py" >"$W/calls_add.py"
r=$(check "$W/named.json" "$W/calls_add.py" 2>&1)
case "$r" in "ok 16 []") pass "tool_choice add: 16 of 16 answers call add validly";; *) fail "tool_choice add: $r";; esac

kill -TERM "$SERVER" 2>/dev/null
wait "$SERVER" 2>/dev/null
SERVER=""
echo "$fails failure(s)"
[ "$fails" = 0 ]
