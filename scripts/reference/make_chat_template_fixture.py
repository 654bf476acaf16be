#!/usr/bin/env python3
"""Chat-template parity fixture for tests/test_jinja_templates.c.

Renders real published chat templates with transformers' own renderer
(transformers.utils.chat_template_utils.render_jinja_template, after the
message clean-up apply_chat_template does: keys whose value is None dropped)
over a set of conversations, and writes tests/fixtures/chat_templates/:

  templates/NAME.jinja   the templates, as published
  cases.json             {"conversations": {name: JSON text}, "tools": JSON text,
                          "documents": JSON text, "special": {template: {bos_token, eos_token}},
                          "cases": [{"template", "conversation", "tools": bool, ["documents": true,]
                                     "add_generation_prompt", "kwargs": JSON text,
                                     "expected": text | "raise": message |
                                     "error": Python exception type}]}

The templates come from llama.cpp's models/templates/ folder, vendored in the
llama-cpp-python sdist on PyPI (the Hugging Face hub is not reachable here),
and from scripts/reference/chat_templates/ (the Qwen2-VL and Qwen3-VL
templates, which llama.cpp's folder lacks; their sources are in SOURCES.md
there):

  pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36
  tar xzf llama_cpp_python-0.3.36.tar.gz
  make_chat_template_fixture.py --templates llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates \
      --templates scripts/reference/chat_templates

strftime_now is pinned to SOURCE_DATE_EPOCH (UTC), as tpr pins it when that
variable is set, so that the dates templates print do not change.
"""
import argparse
import datetime
import json
import os
import shutil

import jinja2
from transformers.utils import chat_template_utils as ctu

EPOCH = 1721952000  # 2024-07-26 00:00:00 UTC

# (file, bos, eos): the checkpoints' own special tokens where the template
# uses them. (Llama 3.3 has 3.1's template, DeepSeek-R1-Distill-Qwen the Llama
# distill's, Qwen3-30B-A3B (Qwen3-MoE) Qwen3-0.6B's, Qwen2.5-VL Qwen2-VL's.)
LLAMA3 = ("<|begin_of_text|>", "<|eot_id|>")
DEEPSEEK = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")
MISTRAL = ("<s>", "</s>")
IM_END = (None, "<|im_end|>")
TEMPLATES = [
    # the families tpr runs
    ("MiniMax-M2.jinja", "]~!b[", "[e~["),
    ("MiniMax-M1.jinja", "<beginning_of_sentence>", "<end_of_sentence>"),
    ("MiniMax-M3.jinja", "]~!b[", "[e~["),
    ("Qwen-Qwen3-0.6B.jinja", *IM_END),
    ("Qwen-Qwen2-VL-7B-Instruct.jinja", *IM_END),
    ("Qwen-Qwen3-VL-30B-A3B-Instruct.jinja", *IM_END),
    ("tencent-Hy3.jinja", "<｜hy_begin▁of▁sentence｜>", "<｜hy_eos｜>"),
    ("openbmb-MiniCPM5-1B.jinja", "<s>", "<|im_end|>"),
    # other published templates
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", *LLAMA3),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", *LLAMA3),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", *LLAMA3),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", *IM_END),
    ("Qwen-QwQ-32B.jinja", *IM_END),
    ("Qwen3-Coder.jinja", *IM_END),
    ("Qwen3.5-4B.jinja", *IM_END),
    ("MiMo-VL.jinja", *IM_END),
    ("HuggingFaceTB-SmolLM3-3B.jinja", *IM_END),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", *DEEPSEEK),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", *DEEPSEEK),
    ("llama-cpp-deepseek-r1.jinja", *DEEPSEEK),
    ("deepseek-ai-DeepSeek-V3.1.jinja", *DEEPSEEK),
    ("deepseek-ai-DeepSeek-V3.2.jinja", *DEEPSEEK),
    ("deepseek-ai-DeepSeek-V4.jinja", *DEEPSEEK),
    ("GLM-4.6.jinja", None, "<|endoftext|>"),
    ("GLM-4.7-Flash.jinja", None, "<|endoftext|>"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", *MISTRAL),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", *MISTRAL),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", *MISTRAL),
    ("unsloth-mistral-Devstral-Small-2507.jinja", *MISTRAL),
    ("google-gemma-2-2b-it.jinja", "<bos>", "<eos>"),
    ("google-gemma-4-31B-it.jinja", "<bos>", "<eos>"),
    ("microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>"),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "<|end_of_text|>", "<|end_of_text|>"),
    ("ibm-granite-granite-4.0.jinja", "<|end_of_text|>", "<|end_of_text|>"),
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "<|begin_of_text|>", "<|im_end|>"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "<|begin_of_text|>", "<|im_end|>"),
    ("moonshotai-Kimi-K2.jinja", "[BOS]", "[EOS]"),
    ("Kimi-K2-Thinking.jinja", "[BOS]", "[EOS]"),
    ("openai-gpt-oss-120b.jinja", "<|startoftext|>", "<|return|>"),
    ("meetkai-functionary-medium-v3.1.jinja", *LLAMA3),
    ("meetkai-functionary-medium-v3.2.jinja", *LLAMA3),
    ("fireworks-ai-llama-3-firefunction-v2.jinja", *LLAMA3),
    ("NVIDIA-Nemotron-Nano-v2.jinja", None, None),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", None, None),
    ("ByteDance-Seed-OSS.jinja", "<seed:bos>", "<seed:eos>"),
    ("LFM2-8B-A1B.jinja", "<|startoftext|>", "<|im_end|>"),
    ("upstage-Solar-Open-100B.jinja", None, None),
    ("inclusionai-ling-3.0-flash.jinja", None, None),
    ("llama-cpp-rwkv-world.jinja", None, None),
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]

DOCUMENTS = [
    {"title": "Tides", "text": "Tides are caused by the Moon's gravity."},
    {"title": "Paris", "text": "Paris is the capital of France.", "source": "atlas"},
]

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello! What's 2+2?"}],
    "system_multi": [
        {"role": "system", "content": "You are a terse assistant.\nAnswer in one line."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another, with \"quotes\" and 'apostrophes' — ünïcödé 日本語 🙂"},
    ],
    "multi_no_system": [
        {"role": "user", "content": "  leading and trailing spaces  "},
        {"role": "assistant", "content": "Noted.\n\n"},
        {"role": "user", "content": "Thanks"},
    ],
    "reasoning": [
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "content": "No: 91 = 7 x 13.", "reasoning_content": "Try 7: 7*13=91."},
        {"role": "user", "content": "And 97?"},
    ],
    "think_in_content": [
        {"role": "system", "content": "Think first."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "<think>\nIt is Paris.\n</think>\n\nParis."},
        {"role": "user", "content": "Of Italy?"},
    ],
    "tool_calls": [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Paris, and 3+4?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call00002", "type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]},
        {"role": "tool", "tool_call_id": "call00002", "name": "add", "content": "7"},
        {"role": "assistant", "content": "It is 21 degrees and clear; 3+4 is 7."},
        {"role": "user", "content": "Thanks!"},
    ],
    # OpenAI clients send nulls: apply_chat_template drops those keys.
    "nulls": [
        {"role": "user", "content": "Hi", "name": None},
        {"role": "assistant", "content": "Hello", "tool_calls": None},
        {"role": "user", "content": "Bye"},
    ],
    "parts": [
        {"role": "user", "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]},
    ],
    # vision-language templates count and mark the images
    "image": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": [{"type": "text", "text": "And these?"}, {"type": "image"}, {"type": "image"}]},
    ],
}


# Constructs one by one: (template, variables). Rendered with transformers'
# environment, and again with trim_blocks and lstrip_blocks off (the negative
# control: tpr must match the first and, where they differ, not the second).
UNITS = [
    # literals, printing with Python's str()
    ("{{ 1 }} {{ 1.0 }} {{ 1.5e-7 }} {{ 1e16 }} {{ 123456789.125 }} {{ -0.0 }} {{ 10/4 }} {{ 10//4 }} {{ -7//2 }} {{ -7%3 }} {{ 7%-3 }} {{ 2**10 }} {{ 2**-1 }}", {}),
    ("{{ true }} {{ True }} {{ none }} {{ None }} {{ false and 1 }} {{ 0 or 'x' }} {{ [] or none }}", {}),
    ("{{ [1, 'a', \"b'c\", none, true, 1.0, {'k': [2]}] }} {{ (1,) }} {{ (1, 2) }} {{ {} }} {{ 'it\\'s' }}", {}),
    ("{{ 'a\\tb\\n' ~ \"q\\\"\" ~ '\\u00e9\\x41' }}|{{ 'x' 'y' }}", {}),
    ("{{ [1,2] + [3] }} {{ 'ab' * 3 }} {{ 3 * [0] }} {{ 1 + 2.5 }} {{ 'a' ~ 1 ~ none ~ true }} {{ 7 / 7 }}", {}),
    ("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 1 == 1.0 }} {{ 'a' != 'a' }} {{ 2 in [1,2] }} {{ 'b' in 'abc' }} {{ 'k' in {'k':1} }} {{ 3 not in [1] }}", {}),
    ("{{ x }}|{{ x is undefined }}|{{ d.missing }}|{{ d['missing'] is defined }}|{{ n.attr is defined }}", {"d": {}, "n": None}),
    ("{{ 'yes' if c else 'no' }} {{ 'a' if false }}| {{ (1 if c else 2) + 1 }}", {"c": True}),
    ("{{ -x|abs }} {{ not x is none }} {{ not 1 == 2 }}", {"x": 3}),
    # strings: unicode, slices, methods
    ("{{ s|length }} {{ s[0] }} {{ s[-1] }} {{ s[1:3] }} {{ s[::-1] }} {{ s[::2] }} {{ s[10] is defined }} {{ s|upper }} {{ s|reverse }}", {"s": "héllo日本🙂"}),
    ("{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[-2] }} {{ l[5] is defined }} {{ l[1:10:2] }}", {"l": [1, 2, 3, 4]}),
    ("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' x') }}|{{ s|trim }}|{{ s.split() }}|{{ s.split(' ') }}|{{ s.split('x', 1) }}|{{ s.rsplit(' ', 1) }}", {"s": "  x a  b x  "}),
    ("{{ s.split(none, 1) }} {{ s.rsplit(none, 1) }} {{ s.split(none, 0) }} {{ s.rsplit(none, 0) }} {{ s.split(maxsplit=5) }} {{ s.rsplit('b', 1) }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.rsplit(',', 1) }}", {"s": "  a b  c "}),
    ("{{ s.startswith('ab') }} {{ s.endswith(('z', 'c')) }} {{ s.find('c') }} {{ s.rfind('q') }} {{ s.count('a') }} {{ s.replace('a', 'A') }} {{ s.replace('', '-') }} {{ s.upper() }} {{ s.title() }} {{ s.capitalize() }} {{ '-'.join(['a','b']) }}", {"s": "abcab"}),
    ("{{ s.splitlines() }} {{ s.splitlines(true) }} {{ s|indent(2) }}|{{ s|indent(2, true) }}|{{ s|indent('> ', blank=true) }}", {"s": "a\nb\r\n\nc"}),
    ("{{ 'hello world-foo (bar)'|title }} {{ 'aBC'|capitalize }} {{ 'x'|upper }}{{ 'ÉÀ'|lower }} {{ s.removeprefix('ab') }}", {"s": "abc"}),
    ("{{ 'a b  c'|wordcount }} {{ '<a href=\"x\">&'|e }} {{ '<b>'|escape }} {{ '<i>'|safe }}", {}),
    # dicts
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.keys()|list }} {{ d.values()|list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d|length }} {{ d|list }} {{ d['a'] }} {{ d.a }}", {"d": {"b": 1, "a": 2}}),
    ("{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %} {{ dict(x=1, y=[2]) }}", {"d": {"z": 1, "y": 2}}),
    # loops
    ("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem is defined }}{{ loop.nextitem|default('-') }};{% endfor %}", {"l": ["a", "b", "c"]}),
    ("{% for x in l if x % 2 %}{{ x }}{{ loop.index }}{% else %}empty{% endfor %}|{% for x in [] %}{{ x }}{% else %}none{% endfor %}", {"l": [1, 2, 3, 4, 5]}),
    ("{% for x in l %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}", {"l": [1, 2, 3, 4]}),
    ("{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.depth }}{{ loop.cycle('+', '-') }}{% endfor %}{{ loop.index }}{% endfor %}", {}),
    ("{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %} {% for c in 'ab' %}{{ c }}{% endfor %} {% for k in {'p': 1, 'q': 2} %}{{ k }}{% endfor %} {% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}", {}),
    ("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set x = 3 %}{% endif %}{{ x }}", {}),
    # namespace, set
    ("{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}{% set blk %}  x {{ a }}\n{% endset %}[{{ blk }}]{% set f | upper %}abc{% endset %}{{ f }}", {}),
    # macros and call
    ("{% macro m(a, b='B', c=none) %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m('x')|length }}", {}),
    ("{% macro w(t) %}<{{ caller() }}:{{ t }}>{% endmacro %}{% call w('T') %}inside{% endcall %}{% macro r(x) %}{{ x }}{% endmacro %}{{ r(r('n')) }}", {}),
    ("{% set a = 1 %}{% with a = 2, b = a %}{{ a }}{{ b }}{% set c = 3 %}{{ c }}{% endwith %}{{ a }}{{ c is defined }}{% with %}w{% endwith %}", {}),
    ("{% filter upper %}abc {{ x }}{% endfilter %}{% generation %}gen{% endgeneration %}", {"x": "y"}),
    # tests
    ("{{ 1 is number }}{{ true is number }}{{ true is integer }}{{ 1.0 is float }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is sequence }}{{ 'a' is sequence }}{{ {} is sequence }}{{ x is iterable }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 1 is eq 1 }}{{ 1 is equalto(2) }}{{ none is none }}{{ true is true }}{{ 0 is false }}{{ false is sameas false }}{{ 'A' is upper }}{{ 3 is gt 2 }}{{ 2 is in [2] }}{{ 1 is boolean }}", {}),
    # filters
    ("{{ l|first }} {{ l|last }} {{ l|length }} {{ l|count }} {{ l|join(', ') }} {{ l|join }} {{ l|unique|list }} {{ l|sort }} {{ l|sort(reverse=true) }} {{ l|reverse|list }} {{ l|sum }} {{ l|min }} {{ l|max }} {{ l|list }} {{ l|string }}", {"l": [3, 1, 2, 3]}),
    ("{{ w|sort|join(' ') }} {{ w|sort(case_sensitive=true)|join(' ') }} {{ w|unique|list }} {{ w|map('upper')|join }} {{ w|select('lower')|list }} {{ w|reject('lower')|list }}", {"w": ["b", "B", "a", "C"]}),
    ("{{ m|selectattr('role', 'equalto', 'user')|list|length }} {{ m|rejectattr('role', 'eq', 'user')|map(attribute='content')|join('|') }} {{ m|map(attribute='x', default='d')|list }} {{ m|selectattr('tool')|list }} {{ m|sort(attribute='role')|map(attribute='role')|list }} {{ m|map(attribute='role')|unique|list }}", {"m": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool": 1}, {"role": "user", "content": "c"}]}),
    ("{{ x|default('d') }} {{ none|default('d') }} {{ ''|default('d', true) }} {{ x|d('e') }} {{ '5'|int + 1 }} {{ '2.5'|float }} {{ 'x'|int }} {{ 3.9|int }} {{ 3|float }} {{ -2|abs }} {{ 2.5|round }} {{ 3.14159|round(2) }} {{ 2.7|round(0, 'floor') }} {{ 5|string ~ 1 }}", {}),
    ("{{ m|selectattr('role', 'equalto', 'system') }}", {"m": []}),
    ("{{ d|dictsort }} {{ d|dictsort(reverse=true) }} {{ d|dictsort(by='value') }} {{ d|dictsort(true) }}{% for k, v in d|dictsort %}{{ k }}{% endfor %}", {"d": {"b": 2, "A": 3, "a": 1}}),
    ("{{ '%s-%d-%i %r %%'|format('x', 3, 4.7, 'q') }} {{ '%s' % 1 }} {{ '%s and %s' % ('a', none) }} {{ '%s' % [1, 2] }} {{ '%d%%' % true }}", {}),
    ("{{ '{} {}'.format('a', 1) }} {{ '{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='n') }} {{ '{{literal}} {}'.format(none) }}", {}),
    ("{{ '%s %s' % ('a',) }}", {}),
    # corners found by random differential testing (scripts/reference/check_jinja_random.py)
    ("{{ [x, d.q] }} {{ x is sequence }} {{ true|round }} {{ 2.5 is divisibleby 2 }} {{ 3.0 is odd }} {{ 'abc' % [] }} {{ 0|select|list }} {{ none|map('upper')|list }}", {"d": {}}),
    ("{{ m|unique|list }}", {"m": [{"a": 1}]}),
    ("{{ [1]|indent }}", {}),
    ("{{ x|int }}", {}),
    ("{{ '{} {}'.format('a') }}", {}),
    ("{% if m|selectattr('role', 'equalto', 'system') %}truthy generator{% endif %}{% set g = m|map(attribute='role') %}{{ g|list }}{{ g|list }}", {"m": [{"role": "user"}]}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ x + 1 }}", {}),
    ("{{ x.y }}", {}),
    ("{{ x.y is defined }}", {}),
    ("{{ d.items }}", {"d": {}}),
    ("{{ [1,2]|selectattr('a')|length }}", {}),
    ("{{ raise_exception('Bad role: ' ~ r) }}", {"r": "x"}),
    ("{% for i in range(3) %}{% if i == 2 %}{{ raise_exception('stop at ' ~ i) }}{% endif %}{{ i }}{% endfor %}", {}),
    ("{{ strftime_now('%Y-%m-%d %d %b %Y') }}", {}),
    # tojson
    ("{{ v|tojson }}|{{ v|tojson(indent=2) }}|{{ v|tojson(indent=4, sort_keys=true) }}|{{ v|tojson(separators=(',', ':')) }}|{{ 'é\"\\n<>&'|tojson }}|{{ [1.0, 1e20, 0.1, -5, none, true]|tojson }}|{{ {}|tojson(indent=2) }}|{{ []|tojson }}", {"v": {"b": [1, {"x": "y"}], "a": "ü", "c": {}}}),
    ("{{ v|tojson(indent='\t') }}", {"v": {"k": [1, 2]}}),
    # whitespace control, trim_blocks, lstrip_blocks
    ("<ul>\n  {% for x in l %}\n    <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n", {"l": [1, 2]}),
    ("a  {%- if true -%}  b  {%- endif -%}  c\n  {{- ' d ' -}}  e {# comment #}\n f {#- c -#} g\n    {#+ keep +#}\nh", {}),
    ("  {%+ if true %}x{% endif +%}\ny\n{% raw %}{{ not parsed }} {% if %}{% endraw %}\n  {% if true %}\nz\n  {% endif %}\n", {}),
    ("line1\r\nline2\r\n{% if true %}\r\nin\r\n{% endif %}\r\n", {}),
    ("{{ x }}\n\n", {"x": 1}),
    # Python's repr of strings
    ("{{ ['it\\'s', 'say \"hi\"', 'both \\' \"', 'tab\\there', 'nl\\n', 'é\\u00a0x', '\\x01'] }}", {}),
    ("{{ messages[0]['content'] }}{{ messages[0].content }}{{ messages|length }}", {"messages": [{"role": "user", "content": "Hi"}]}),
    # Markup: + escapes the plain side (functionary v3.1, Ministral 3 use it); ~ gives a plain string
    ("{{ '<a>'|safe + '<b>' }}|{{ '&' + ('\"'|e) }}|{{ ('x'|safe + '<') + '>' }}|{{ ('<'|safe ~ '<') + '>' }}|{{ ('q'|safe + t)|length }}", {"t": "'"}),
    ("{{ 'a'|safe + 1 }}", {}),
    # unknown filters and tests: compile-time errors, except under if and conditional expressions
    ("{% if x %}{{ y|frob }}{{ y is frob }}{% endif %}ok{{ (y|frob) if x else 1 }}{% set a = y|frob if x %}", {}),
    ("{% if x %}{% for i in y %}{{ i|frob }}{% endfor %}{% endif %}", {}),
    ("{% if true %}{{ 1|frob }}{% endif %}", {}),
    ("{% if x %}{% elif y|frob %}{% endif %}", {"y": 1}),
    ("{% for i in [1] %}{{ i is frob }}{% endfor %}", {}),
    ("{% macro m() %}{% if false %}{{ 1|frob }}{% endif %}{% endmacro %}{{ m() }}ok", {}),
]


def render_unit(env, text, variables):
    try:
        return {"expected": env.from_string(text).render(**variables)}
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:
            return {"raise": str(e)}
        return {"error": f"{type(e).__name__}: {e}"}
    except Exception as e:  # noqa: BLE001 - any failure is an expected failure
        return {"error": f"{type(e).__name__}: {e}"}


def units():
    env = ctu._compile_jinja_template("").environment
    plain = env.overlay(trim_blocks=False, lstrip_blocks=False)
    out = []
    for text, variables in UNITS:
        case = {"template": text, "vars": json.dumps(variables, ensure_ascii=False)}
        case.update(render_unit(env, text, variables))
        control = render_unit(plain, text, variables)
        if "expected" in case and control.get("expected", case["expected"]) != case["expected"]:
            case["no_trim"] = control["expected"]
        out.append(case)
    return out


def render(text, conv, tools, gen, bos, eos, kwargs, documents=None):
    conv = [{k: v for k, v in m.items() if v is not None} for m in conv]  # apply_chat_template's clean-up
    special = {}
    if bos is not None:
        special["bos_token"] = bos
    if eos is not None:
        special["eos_token"] = eos
    out, _ = ctu.render_jinja_template(conversations=[conv], tools=tools, documents=documents, chat_template=text,
                                       add_generation_prompt=gen, **{**special, **kwargs})
    return out[0]


# Follow-up turns as an OpenAI client sends them (tool-call arguments as JSON
# text, null content beside tool calls), rendered as vLLM renders them: its
# _postprocess_messages parses the arguments into a mapping (empty: {}) and
# drops an empty tool_calls list, a null content reaches the template as ""
# (vLLM's "string" content format), then apply_chat_template drops the nulls.
OPENAI_TEMPLATES = ["MiniMax-M2", "MiniMax-M1", "Qwen-Qwen3-0.6B", "Qwen-Qwen3-VL-30B-A3B-Instruct", "tencent-Hy3",
                    "meta-llama-Llama-3.1-8B-Instruct", "Qwen3-Coder", "deepseek-ai-DeepSeek-V3.1",
                    "deepseek-ai-DeepSeek-V3.2", "GLM-4.6", "moonshotai-Kimi-K2", "openai-gpt-oss-120b",
                    "Mistral-Small-3.2-24B-Instruct-2506", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use"]


def openai_wire(conv):
    out = []
    for m in conv:
        m = dict(m)
        if m.get("tool_calls"):
            m["content"] = None
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    out.append({"role": "assistant", "content": "One more.", "tool_calls": []})
    out.append({"role": "user", "content": "And now?"})
    return out


def vllm_postprocess(conv):
    conv = json.loads(json.dumps(conv))
    for m in conv:
        if "content" in m and m["content"] is None:
            m["content"] = ""
        if m["role"] == "assistant" and isinstance(m.get("tool_calls"), list):
            if not m["tool_calls"]:
                m.pop("tool_calls")
                continue
            for c in m["tool_calls"]:
                args = c["function"].get("arguments")
                c["function"]["arguments"] = json.loads(args) if args and not isinstance(args, (dict, list)) else (args or {})
    return conv


def openai_cases(texts, special):
    out = []
    wire = openai_wire(CONVERSATIONS["tool_calls"])
    for name in OPENAI_TEMPLATES:
        sp = special[name]
        case = {"template": name,
                "request": json.dumps({"model": "m", "messages": wire, "tools": TOOLS}, ensure_ascii=False)}
        try:
            case["expected"] = render(texts[name], vllm_postprocess(wire), TOOLS, True, sp.get("bos_token"),
                                      sp.get("eos_token"), {})
        except jinja2.exceptions.TemplateError as e:
            case["raise" if type(e) is jinja2.exceptions.TemplateError else "error"] = str(e)
        except Exception as e:  # noqa: BLE001
            case["error"] = f"{type(e).__name__}: {e}"
        out.append(case)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", required=True, action="append",
                    help="a folder of templates (llama.cpp's models/templates; repeat to add more)")
    ap.add_argument("--out", default="tests/fixtures/chat_templates")
    a = ap.parse_args()
    # Pin strftime_now (transformers builds it from datetime.now).
    fixed = datetime.datetime.fromtimestamp(EPOCH, datetime.timezone.utc).replace(tzinfo=None)

    class FixedDatetime(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return fixed

    ctu.datetime = FixedDatetime
    ctu._compile_jinja_template.cache_clear()
    os.makedirs(os.path.join(a.out, "templates"), exist_ok=True)
    cases = []
    special = {}
    texts = {}
    for fname, bos, eos in TEMPLATES:
        name = fname[:-len(".jinja")]
        src = next((os.path.join(d, fname) for d in a.templates if os.path.exists(os.path.join(d, fname))), None)
        if src is None:
            raise SystemExit(f"{fname}: in none of the --templates folders")
        shutil.copyfile(src, os.path.join(a.out, "templates", fname))
        with open(src, encoding="utf-8") as f:
            text = f.read()
        texts[name] = text
        special[name] = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
        kw_sets = [{}]
        if "enable_thinking" in text:
            kw_sets.append({"enable_thinking": False})
        for conv_name, conv in CONVERSATIONS.items():
            for with_tools in ([False, True] if conv_name in ("user", "system_multi", "tool_calls") else [False]):
                for gen in (False, True):
                    for kw in kw_sets:
                        case = {"template": name, "conversation": conv_name, "tools": with_tools,
                                "add_generation_prompt": gen, "kwargs": json.dumps(kw)}
                        try:
                            case["expected"] = render(text, conv, TOOLS if with_tools else None, gen, bos, eos, kw)
                        except jinja2.exceptions.TemplateError as e:
                            if type(e) is jinja2.exceptions.TemplateError:  # raise_exception
                                case["raise"] = str(e)
                            else:
                                case["error"] = f"{type(e).__name__}: {e}"
                        except Exception as e:  # noqa: BLE001 - any failure is an expected failure
                            case["error"] = f"{type(e).__name__}: {e}"
                        cases.append(case)
        if "documents" in text:  # retrieval-augmented templates (Command-R, Granite)
            for gen, with_tools in ((False, False), (True, False), (True, True)):
                case = {"template": name, "conversation": "user", "tools": with_tools, "documents": True,
                        "add_generation_prompt": gen, "kwargs": "{}"}
                try:
                    case["expected"] = render(text, CONVERSATIONS["user"], TOOLS if with_tools else None, gen, bos,
                                              eos, {}, DOCUMENTS)
                except jinja2.exceptions.TemplateError as e:
                    case["raise" if type(e) is jinja2.exceptions.TemplateError else "error"] = str(e)
                except Exception as e:  # noqa: BLE001
                    case["error"] = f"{type(e).__name__}: {e}"
                cases.append(case)
    fixture = {
        "source": "llama.cpp models/templates via llama-cpp-python 0.3.36 (PyPI sdist) and "
                  "scripts/reference/chat_templates; transformers "
                  + __import__("transformers").__version__ + ", jinja2 " + jinja2.__version__,
        "source_date_epoch": EPOCH,
        "conversations": {k: json.dumps(v, ensure_ascii=False) for k, v in CONVERSATIONS.items()},
        "tools": json.dumps(TOOLS),
        "documents": json.dumps(DOCUMENTS),
        "special": special,
        "cases": cases,
        "openai_cases": openai_cases(texts, special),
    }
    with open(os.path.join(a.out, "units.json"), "w", encoding="utf-8") as f:
        json.dump({"source_date_epoch": EPOCH, "units": units()}, f, ensure_ascii=False, indent=1)
    with open(os.path.join(a.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, separators=(",", ":"))
    n_ok = sum("expected" in c for c in cases)
    print(f"{len(TEMPLATES)} templates, {len(cases)} cases ({n_ok} rendered, {len(cases) - n_ok} raise or fail)")


if __name__ == "__main__":
    main()
