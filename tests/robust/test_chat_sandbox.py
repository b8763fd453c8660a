"""Chat templates are code from downloaded files: `refimpl.chat.render` must render real templates exactly,
refuse every known sandbox escape with ChatTemplateError, and stop resource bombs (huge ranges, string
repetition, nested loops, recursive macros, formatting widths) with a clear ChatTemplateError in bounded
time and memory. Then Hypothesis composes random templates from risky pieces: each renders or raises
ChatTemplateError, within the time limit (plus slack) and a memory bound.
"""
from __future__ import annotations

import gc
import json
import resource
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("jinja2")

from refimpl.chat import ChatTemplateError, render  # noqa: E402

from ._fuzz import examples, record  # noqa: E402

pytestmark = pytest.mark.property

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3? 😀"}]

# SmolLM2-135M-Instruct's tokenizer.chat_template (the GGUF's, verbatim)
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
           "<|im_end|>\n' }}{% endif %}"
           "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# the constructs of the Llama 3 family's templates: bos_token, namespace, raise_exception on bad roles,
# strftime_now, tools through tojson, loop controls, string tests, .strip()
LLAMA3_STYLE = """{{- bos_token }}
{%- set ns = namespace(system='', first=true) %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] | trim %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and tools is defined %}
    {{- "Tools:\\n" }}
    {%- for t in tools %}{{- t | tojson(indent=2) }}{{- "\\n" }}{%- endfor %}
{%- endif %}
{{- ns.system }}{{- "<|eot_id|>" }}
{%- for message in loop_messages %}
    {%- if message['role'] not in ['user', 'assistant', 'tool'] %}
        {{- raise_exception("Conversation roles must be user, assistant or tool, got " + message['role']) }}
    {%- endif %}
    {%- if message.content is not string %}{{- raise_exception("content must be a string") }}{%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'].strip() + '<|eot_id|>' }}
    {%- if loop.index > 100 %}{%- break %}{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"""


def _golden_smollm2():
    from pathlib import Path
    g = json.loads((Path(__file__).parents[1] / "golden_data" / "llama_tokens_smollm2.json").read_text())
    return g["chat"]


# -- legitimate templates ---------------------------------------------------------------------------------

def test_smollm2_template_matches_llama_cpp_golden():
    c = _golden_smollm2()
    assert render(SMOLLM2, c["messages"], add_generation_prompt=c["add_generation_prompt"]) == c["text"]


def test_smollm2_template_adds_default_system_prompt():
    out = render(SMOLLM2, [{"role": "user", "content": "Hi"}])
    assert out == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_chatml():
    out = render(CHATML, MESSAGES[:2], add_generation_prompt=False)
    assert out == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"


def test_llama3_style_with_tools_and_raise_exception():
    tools = [{"name": "add", "parameters": {"a": "int", "b": "<int>"}}]
    out = render(LLAMA3_STYLE, MESSAGES, bos_token="<|begin_of_text|>", tools=tools)
    assert out.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nToday Date: 26 Jul 2024\n\n")
    assert '"b": "<int>"' in out                       # Hugging Face's tojson: no HTML escaping
    assert json.dumps(tools[0], indent=2, ensure_ascii=False) in out
    assert "Be brief.<|eot_id|>" in out and out.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert "And 3+3? 😀<|eot_id|>" in out
    with pytest.raises(ChatTemplateError, match="chat template raised: Conversation roles must be user, assistant "
                                                "or tool, got robot"):
        render(LLAMA3_STYLE, [{"role": "robot", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="content must be a string"):
        render(LLAMA3_STYLE, [{"role": "user", "content": ["x"]}])


def test_other_hugging_face_constructs():
    assert render("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.role[0] }}"
                  "{% endfor %}", MESSAGES) == "su"
    assert render("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
                  MESSAGES[:2]) == "Be brief.What is 2+2?"
    assert len(render("{{ strftime_now('%Y-%m-%d') }}", [])) == 10
    assert render("{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join('|') }}",
                  MESSAGES) == "What is 2+2?|And 3+3? 😀"
    assert render("{{ x|tojson }}", [], x={"k": "é<>"}) == '{"k": "é<>"}'
    assert render("{{ tools is defined }} {{ tools }}", []) == "False "     # undefined names print as ""


def test_a_long_conversation_renders_quickly():
    msgs = [{"role": "user" if i % 2 else "assistant", "content": f"message {i} " * 50} for i in range(2000)]
    t0 = time.perf_counter()
    out = render(SMOLLM2, msgs)
    assert len(out) > 1_000_000 and time.perf_counter() - t0 < 2.0


# -- escapes ------------------------------------------------------------------------------------------------

ESCAPES = {
    "str_subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "cycler_globals": "{{ cycler.__init__.__globals__ }}",
    "joiner_globals": "{{ joiner.__init__.__globals__['os'] }}",
    "template_context": "{{ self._TemplateReference__context }}",
    "lipsum_globals": "{{ lipsum.__globals__['os'] }}",
    "for_subclasses": "{% for x in ().__class__.__base__.__subclasses__() %}{{ x }}{% endfor %}",
    "namespace_init": "{{ namespace.__init__.__globals__ }}",
    "namespace_attrs": "{% set ns = namespace(a=1) %}{{ ns._Namespace__attrs }}",
    "namespace_dict": "{% set ns = namespace(a=1) %}{{ ns.__dict__ }}",
    "range_self": "{{ range.__self__ }}",
    "raise_exception_globals": "{{ raise_exception.__globals__ }}",
    "getitem_dunder": "{{ messages['__class__'] }}",
    "attr_filter": "{{ messages|attr('__class__') }}",
    "map_attribute": "{{ messages|map(attribute='__class__')|list }}",
    "format_field": "{{ '{0.__class__}'.format(messages) }}",
    "format_map": "{{ '{x.__class__.__base__}'.format_map({'x': 1}) }}",
    "loop_internals": "{% for m in messages %}{{ loop._iterator }}{% endfor %}",
    "func_code": "{{ raise_exception.__code__ }}",
    "generator_frame": "{{ (messages|map('string')).gi_frame }}",
    "mutate_list": "{{ messages.append(1) }}",
    "mutate_dict": "{{ messages[0].update({'role': 'x'}) }}",
    "pop": "{{ messages.pop() }}",
    "config_items": "{{ config.items() }}",
    "request_environ": "{{ request.environ }}",
    "include": "{% include '/etc/passwd' %}",
    "import": "{% import 'os' as os %}",
    "extends": "{% extends '/etc/passwd' %}",
}


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_escape_attempts_are_refused(case):
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError) as e:
        render(ESCAPES[case], MESSAGES)
    record("chat: escape attempts", "refused", time.perf_counter() - t0)
    assert str(e.value).startswith("chat template ")
    assert MESSAGES[0] == {"role": "system", "content": "Be brief."} and len(MESSAGES) == 4    # unchanged


def test_flask_globals_do_not_exist():
    """`config` / `request` (Flask's) are plain undefined names here: they print as nothing."""
    assert render("[{{ config }}][{{ request }}][{{ self }}]", []) == "[][][<TemplateReference None>]"


# -- bombs --------------------------------------------------------------------------------------------------

BOMBS = {   # id: (template, what the error says)
    "range_1e9": ("{% for i in range(10**9) %}{% endfor %}", "over the limit"),
    "range_list": ("{{ range(10**9)|list }}", "over the limit"),
    "str_times_1e10": ("{{ 'a' * 10**10 }}", r"str \* 10000000000"),
    "list_times": ("{{ [1, 2] * 10**9 }}", r"list \* 1000000000"),
    "pow": ("{{ 10 ** 100000 }}", "more than 4096 bits"),
    "nested_loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     "took longer than"),
    "loop_over_long_string": ("{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
                              "took longer than"),
    "doubling": ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                 "concatenation would hold"),
    "doubling_plus": ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                      "{% endfor %}", r"str \+ str"),
    "recursive_macro": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed too deeply"),
    "exponential_macro": ("{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(60) }}",
                          "took longer than"),
    "percent_width": ("{{ '%999999999d' % 1 }}", "'%' formatting"),
    "percent_precision": ("{{ '%.999999999f' % 1.0 }}", "'%' formatting"),
    "format_width": ("{{ '{:999999999}'.format(1) }}", "format()"),
    "format_nested_width": ("{{ '{0:{1}}'.format('a', 10**9) }}", "format()"),
    "format_filter": ("{{ '%999999999s'|format('a') }}", "format filter"),
    "center": ("{{ 'a'|center(10**9) }}", "center filter"),
    "ljust": ("{{ 'a'.ljust(10**9) }}", "ljust()"),
    "zfill": ("{{ '1'.zfill(10**9) }}", "zfill()"),
    "expandtabs": ("{{ ('\t' * 100000).expandtabs(1000) }}", "expandtabs()"),
    "indent": ("{{ ('\n' * 100000)|indent(1000) }}", "indent filter"),
    "replace_empty": ("{{ ('x' * 10000)|replace('', 'y' * 10000) }}", "replace filter"),
    "replace_method": ("{{ ('x' * 10000).replace('x', 'y' * 10000) }}", "replace()"),
    "translate": ("{{ ('x' * 10000).translate({120: 'y' * 10000}) }}", "translate()"),
    "join_amplify": ("{{ (range(100000)|list)|join('y' * 1000) }}", "join filter"),
    "batch_fill": ("{{ [1]|batch(10**9, 'x')|list }}", "over the limit"),
    "slice": ("{{ [1]|slice(10**9)|list }}", "over the limit"),
    "tojson_indent": ("{{ [[[[1] * 50] * 50] * 50]|tojson(indent=10000) }}", "tojson filter"),
    "map_center": ("{{ range(100000)|map('center', 1000000)|list|length }}", "add up to more than"),
    "literal_nesting": ("{% set a = 'x' * 1000000 %}{% set b = [a, a, a, a, a, a, a, a] %}{% set c = [b, b, b, b] %}"
                        "{{ c }}", "literal would hold"),
    "namespace_in_list": ("{% set ns = namespace(a='') %}{% set l = [ns] * 1000 %}{{ l|length }}"
                          "{% set ns.a = 'x' * 1000000 %}{{ l }}", "output expression would hold"),
    "output_flood": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "rendered text would exceed"),
    "huge_template": ("x" * (5 << 20), "characters long"),
}


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_bombs_are_refused_in_bounded_time_and_memory(case):
    template, what = BOMBS[case]
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ChatTemplateError, match=what):
            render(template, MESSAGES, timeout=1.0)
    finally:
        dt = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    record("chat: resource bombs", "refused", dt)
    assert dt < 3.0, f"{case}: {dt:.1f} s"
    assert peak < 200 << 20, f"{case}: {peak >> 20} MiB"


def test_limits_are_parameters():
    assert render("{{ 'a' * 100 }}", [], max_output=100) == "a" * 100
    with pytest.raises(ChatTemplateError, match="over the limit of 99"):
        render("{{ 'a' * 100 }}", [], max_output=99)
    with pytest.raises(ChatTemplateError, match="longer than 0.2 s"):
        render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", [], timeout=0.2)


def test_template_errors_are_chat_template_errors():
    for t, what in [("{{ 1/0 }}", "ZeroDivisionError"), ("{{ 'a' + 1 }}", "TypeError"), ("{% if %}", "TemplateSyntax"),
                    ("{{ x.y }}", "UndefinedError"), ("{{ 2.0 ** 10000 }}", "OverflowError")]:
        with pytest.raises(ChatTemplateError, match=what):
            render(t, [])
    with pytest.raises(ChatTemplateError, match="expected a string"):
        render(None, [])


# -- drawn templates ----------------------------------------------------------------------------------------

NUMBERS = st.sampled_from(["0", "1", "2", "7", "100", "65536", "10**6", "10**9", "2**64", "-1", "1.5"])
STRINGS = st.sampled_from(["'x'", "''", "'ab\\n'", "'%s'", "'%9999d'", "'{:>99999}'", "'\\t'", "ns.s",
                           "messages[0].content", "bos_token"])


def _expr(children):
    return st.one_of(
        st.tuples(children, st.sampled_from(["*", "+", "~", "%", "**", "==", "in"]), children).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(children, st.sampled_from(["center", "indent", "replace('', 'yy')", "join('--')", "batch",
                                             "slice", "list", "string", "tojson", "length", "wordwrap", "format",
                                             "map('string')", "first", "trim", "upper"]),
                  NUMBERS).map(lambda t: f"({t[0]}|{t[1]}({t[2]}))" if "(" not in t[1] else f"({t[0]}|{t[1]})"),
        st.tuples(children, st.sampled_from(["center", "ljust", "zfill", "expandtabs", "split", "strip"]),
                  NUMBERS).map(lambda t: f"({t[0]}).{t[1]}({t[2] if t[1] not in ('split', 'strip') else ''})"),
        st.lists(children, min_size=1, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        children.map(lambda x: f"range({x})"),
    )


EXPRS = st.recursive(st.one_of(NUMBERS, STRINGS, st.just("messages"), st.just("i")), _expr, max_leaves=6)


def _stmt(children):
    return st.one_of(
        st.tuples(EXPRS, st.lists(children, max_size=3)).map(
            lambda t: "{% for i in " + t[0] + " %}" + "".join(t[1]) + "{% endfor %}"),
        st.tuples(EXPRS, st.lists(children, max_size=3)).map(
            lambda t: "{% if " + t[0] + " %}" + "".join(t[1]) + "{% endif %}"),
        st.lists(children, max_size=3).map(
            lambda b: "{% macro m(n) %}" + "".join(b) + "{{ m(n) }}{% endmacro %}{{ m(1) }}"),
    )


STMTS = st.recursive(st.one_of(EXPRS.map(lambda e: "{{ " + e + " }}"),
                               EXPRS.map(lambda e: "{% set ns.s = " + e + " %}")), _stmt, max_leaves=8)


@pytest.fixture(scope="module")
def rss0():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss    # KiB on Linux: the process's peak so far


@settings(max_examples=examples(400), deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.lists(STMTS, min_size=1, max_size=4))
def test_drawn_templates_render_or_refuse_in_bounded_time(rss0, body):
    """Memory: the process's peak resident size may not grow by more than 256 MiB over all cases
    (tracemalloc would slow these allocation-heavy cases tenfold)."""
    template = "{% set ns = namespace(s='x') %}" + "".join(body)
    # Python's cyclic collector runs in whatever thread allocates: late in a full pytest run, one pass over
    # the process's heap took 2 s of this thread's CPU in a case that renders in 40 ms (a `center` refused).
    # The bound is on the render, so the collector waits until the render ends.
    gc.disable()
    t0, cpu0 = time.perf_counter(), time.thread_time()
    outcome = "rendered"
    try:
        out = render(template, MESSAGES, max_output=1 << 16, timeout=0.3)
        assert isinstance(out, str) and len(out) <= 1 << 16
    except ChatTemplateError:
        outcome = "refused (ChatTemplateError)"
    finally:
        dt, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        gc.enable()
        record("chat: drawn templates", outcome, dt)
    # the bound is on this thread's CPU time, which another process's load does not stretch; the wall-clock
    # bound only catches a render that hangs
    assert cpu < 2.0, f"{cpu:.2f} s of CPU: {template}"
    assert dt < 30.0, f"{dt:.2f} s: {template}"
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    assert grown < 256 << 10, f"peak RSS grew by {grown >> 10} MiB: {template}"
