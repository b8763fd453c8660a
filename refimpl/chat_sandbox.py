"""The sandbox refimpl.chat renders a chat template in (its docstring says what is refused and why): jinja2's
ImmutableSandboxedEnvironment with every operation that can build a large value or loop for long routed
through size and time accounting. Imported by `refimpl.chat.render` only, when it first renders (jinja2 is an
optional dependency).

    Sandbox(max_output, deadline, timeout)   the environment; env.from_string(template).render(...)
    Codegen                                  jinja's code generator with `~`, literals and for loops checked
    Generation                               `{% generation %}` blocks (Hugging Face's assistant masks)
    _weight, *_growth                        what a value weighs, and what an operation can add to it
"""
from __future__ import annotations

import functools
import json
import re
import string
import time
from collections.abc import Mapping
from datetime import datetime

from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import ChatTemplateError

BUDGET = 16               # all values built, together: BUDGET x max_output
MAX_INT_BITS = 4096       # integers a template may build


class Generation(Extension):
    """`{% generation %}...{% endgeneration %}` (Hugging Face's assistant-mask blocks): the body as is."""
    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class Codegen(CodeGenerator):
    """`~` and list / tuple / dict literals go through the environment's size checks, and every for
    loop's items through its clock (environment.ticking)."""

    ticked: frozenset = frozenset()

    def visit_For(self, node, frame):
        self.ticked = self.ticked | {id(node.iter)}
        super().visit_For(node, frame)

    def visit(self, node, *args, **kwargs):
        if id(node) in self.ticked:
            self.write("environment.ticking(")
            super().visit(node, *args, **kwargs)
            self.write(")")
            return None
        return super().visit(node, *args, **kwargs)

    def visit_Concat(self, node, frame):
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def _checked(self, visit, node, frame):
        self.write("environment.checked_value(")
        visit(self, node, frame)
        self.write(")")

    def visit_List(self, node, frame):
        self._checked(CodeGenerator.visit_List, node, frame)

    def visit_Dict(self, node, frame):
        self._checked(CodeGenerator.visit_Dict, node, frame)

    def visit_Tuple(self, node, frame):
        if node.ctx == "load":
            self._checked(CodeGenerator.visit_Tuple, node, frame)
        else:
            CodeGenerator.visit_Tuple(self, node, frame)


def refuse(what: str):
    """Raise the ChatTemplateError of a refused operation."""
    raise ChatTemplateError(f"chat template refused: {what}")


class Sandbox(ImmutableSandboxedEnvironment):
    """The environment a chat template renders in: jinja2's immutable sandbox, plus the size and time
    accounting of refimpl.chat's docstring (limits: max_output characters or items, BUDGET x max_output
    in all, the deadline on time.monotonic())."""
    code_generator_class = Codegen
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, max_output: int, deadline: float, timeout: float):
        super().__init__(trim_blocks=True, lstrip_blocks=True,
                         extensions=["jinja2.ext.loopcontrols", Generation])
        self.limit, self.deadline, self.timeout = max_output, deadline, timeout
        self.budget = BUDGET * max_output
        self.memo: dict = {}
        self.globals.pop("lipsum", None)
        self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        self.filters["tojson"] = _tojson
        self.filters = {name: self._guard_filter(name, f) for name, f in self.filters.items()}
        self.finalize = self._finalize
        self.concat = self._concat

    # -- time and size accounting
    def tick(self):
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"chat template refused: rendering took longer than {self.timeout:g} s")

    def ticking(self, items):
        deadline, clock = self.deadline, time.monotonic
        for x in items:
            if clock() > deadline:
                self.tick()
            yield x

    def weight(self, v) -> int:
        return _weight(v, self.memo)

    def spend(self, n: int, what: str):
        self.tick()
        if n > self.limit:
            refuse(f"{what} would hold about {n} characters or items, over the limit of {self.limit}")
        self.budget -= n
        if self.budget < 0:
            refuse(f"the values it builds add up to more than {BUDGET * self.limit} characters or items")

    def check_ints(self, args, what: str):
        for a in args:
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > self.limit:
                refuse(f"{what} got the integer {a}, over the limit of {self.limit}")

    # -- the hooks jinja calls
    def unsafe_undefined(self, obj, attribute):
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def getattr(self, obj, attribute):
        if isinstance(attribute, str) and attribute.startswith("_"):   # even one that does not exist
            self.unsafe_undefined(obj, attribute)
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        if isinstance(argument, str) and argument.startswith("_") and not isinstance(obj, Mapping):
            self.unsafe_undefined(obj, argument)
        return super().getitem(obj, argument)

    def checked_concat(self, parts):
        self.spend(sum(self.weight(p) for p in parts), "a ~ concatenation")
        return "".join(map(str, parts))

    def checked_value(self, v):
        self.spend(self.weight(v), "a literal")
        return v

    def _finalize(self, v):
        self.spend(self.weight(v), "an output expression")
        return v

    def _concat(self, parts):
        out, n = [], 0
        for p in parts:
            n += len(p)
            if n > self.limit:
                refuse(f"the rendered text would exceed {self.limit} characters")
            out.append(p)
        self.spend(n, "the rendered text")
        return "".join(out)

    def call_binop(self, context, operator, left, right):
        w = self.weight
        seq = (str, list, tuple)
        if operator == "*":
            if isinstance(left, int) and isinstance(right, seq):
                left, right = right, left
            if isinstance(left, seq) and isinstance(right, int):
                self.spend(w(left) * max(right, 0), f"{type(left).__name__} * {right}")
            elif isinstance(left, int) and isinstance(right, int) \
                    and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                refuse(f"an integer product of more than {MAX_INT_BITS} bits")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1 \
                    and (left.bit_length() - 1) * right > MAX_INT_BITS:
                refuse(f"{left} ** {right} has more than {MAX_INT_BITS} bits")
        elif operator == "+":
            if isinstance(left, seq) and isinstance(right, seq):
                self.spend(w(left) + w(right), f"{type(left).__name__} + {type(right).__name__}")
        elif operator == "%" and isinstance(left, str):
            args = right if isinstance(right, tuple) else (right,)
            self.check_ints(args, "'%' formatting")
            self.spend(len(left) + w(right) + _percent_growth(left, args), "'%' formatting")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):   # noqa: N805 (jinja's own signature)
        self = __self
        name = getattr(__obj, "__name__", None)
        owner = getattr(__obj, "__self__", None)
        wrapped = getattr(__obj, "__wrapped__", None)
        if owner is None and wrapped is not None:          # str.format, wrapped by the sandbox
            owner = getattr(wrapped, "__self__", None)
        what = f"{name or type(__obj).__name__}()"
        self.check_ints(list(args) + list(kwargs.values()), what)
        if isinstance(owner, str) and name == "join" and args:
            args = (list(args[0]),) + args[1:]
        est = sum(map(self.weight, args)) + sum(map(self.weight, kwargs.values()))
        est += self.weight(owner) if owner is not None else 0
        if isinstance(owner, str):
            est += _str_method_growth(owner, name, args, kwargs, self.weight)
        self.spend(est, what)
        result = super().call(__context, __obj, *args, **kwargs)
        if isinstance(result, (str, bytes, list, tuple, dict)):
            self.spend(self.weight(result), what)
        return result

    def _guard_filter(self, name, f):
        @functools.wraps(f)
        def guarded(*args, **kwargs):
            # args may start with a context / eval context / environment (jinja's pass_* filters)
            skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0
            vals = list(args[skip:])
            what = f"the {name} filter"
            self.check_ints(vals[1:] + list(kwargs.values()), what)
            if name in ("join", "batch", "slice") and vals and not isinstance(vals[0], (str, list, tuple, dict)):
                vals[0] = list(vals[0])
                args = args[:skip] + tuple(vals)
            est = sum(map(self.weight, vals)) + sum(map(self.weight, kwargs.values()))
            est += _filter_growth(name, vals, kwargs, self.weight)
            self.spend(est, what)
            result = f(*args, **kwargs)
            if isinstance(result, (str, bytes, list, tuple, dict)):
                self.spend(self.weight(result), what)
            return result
        return guarded


# -- sizes ----------------------------------------------------------------------------------------------


def _weight(v, memo: dict) -> int:
    """About len(str(v)): the characters of a string; for a container, its items' weights plus a few
    characters each. Each list, tuple, dict or set is visited once (memo: id -> (object, weight), the
    object kept alive so that its id stays unique); those cannot change while a template renders (the
    sandbox forbids mutating them), unless they hold a jinja namespace, which can: those are not memoized."""
    return _weigh(v, memo)[0]


def _weigh(v, memo: dict) -> tuple[int, bool]:
    """(weight, whether it can change: holds a namespace)."""
    if isinstance(v, str):
        return len(v), False
    if isinstance(v, (bytes, bytearray)):
        return 4 * len(v) + 3, False
    if isinstance(v, bool) or v is None:
        return 5, False
    if isinstance(v, int):
        return v.bit_length() // 3 + 2, False
    if isinstance(v, float):
        return 24, False
    is_ns = type(v).__name__ == "Namespace" and type(v).__module__.startswith("jinja2")
    if not (is_ns or isinstance(v, (list, tuple, dict, set, frozenset))):
        return 32, False
    hit = memo.get(id(v))
    if hit is not None:
        return hit[1], False               # memoized (or being weighed: a cycle adds nothing)
    memo[id(v)] = (v, 0)
    if is_ns:
        items = list(object.__getattribute__(v, "_Namespace__attrs").values())
    elif isinstance(v, dict):
        items = [x for kv in v.items() for x in kv]
    else:
        items = v
    w, volatile = 2, is_ns
    for x in items:
        wx, vx = _weigh(x, memo)
        w += wx + 2
        volatile |= vx
    if volatile:
        del memo[id(v)]
    else:
        memo[id(v)] = (v, w)
    return w, volatile


_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[a-zA-Z%]")


def _widths(spec: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", spec)]


def _arg(args, kwargs, i, key, default):
    return args[i] if len(args) > i else kwargs.get(key, default)


def _str_method_growth(s: str, name, args, kwargs, w) -> int:
    """How much larger than its inputs a str method's result can be."""
    if name in ("center", "ljust", "rjust", "zfill"):
        n = _arg(args, kwargs, 0, "width", 0)
        return n if isinstance(n, int) else 0
    if name == "expandtabs":
        n = _arg(args, kwargs, 0, "tabsize", 8)
        return s.count("\t") * max(n, 0) if isinstance(n, int) else 0
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        hits = s.count(args[0]) if args[0] else len(s) + 1
        return hits * len(args[1])
    if name == "translate" and args and isinstance(args[0], dict):
        return len(s) * max((w(v) for v in args[0].values()), default=1)
    if name == "join" and args and isinstance(args[0], list):
        return len(s) * len(args[0])
    if name in ("format", "format_map"):
        fields = [spec for _, _, spec, _ in string.Formatter().parse(s) if spec is not None]
        ints = [a for a in list(args) + list(kwargs.values()) if isinstance(a, int) and not isinstance(a, bool)]
        widest = max([x for spec in fields for x in _widths(spec)] + ints, default=0)
        return len(fields) * widest
    return 0


def _filter_growth(name: str, vals: list, kwargs: dict, w) -> int:
    """How much larger than its inputs a filter's result can be (vals[0] is the filtered value)."""
    v = vals[0] if vals else None
    rest = vals[1:]
    a = lambda i, key, default: _arg(rest, kwargs, i, key, default)   # noqa: E731
    if name == "center":
        n = a(0, "width", 80)
        return n if isinstance(n, int) else 0
    if name == "indent":
        width = a(0, "width", 4)
        lines = str(v).count("\n") + 1 if isinstance(v, str) else 1
        return lines * (width if isinstance(width, int) else w(width))
    if name == "replace" and isinstance(v, str):
        old, new = a(0, "old", None), a(1, "new", None)
        if isinstance(old, str) and isinstance(new, str):
            return (v.count(old) if old else len(v) + 1) * len(new)
    if name == "join" and isinstance(v, list):
        return len(v) * w(a(0, "d", ""))
    if name in ("batch", "slice"):
        n = a(0, "linecount" if name == "batch" else "slices", 0)
        return (n if isinstance(n, int) else 0) * (2 + w(a(1, "fill_with", None)))
    if name == "wordwrap" and isinstance(v, str):
        width = a(0, "width", 79)
        lines = len(v) // max(width, 1) + v.count("\n") + 1 if isinstance(width, int) else len(v)
        return lines * w(a(2, "wrapstring", "\n"))
    if name == "tojson":
        n = a(0, "indent", None)
        return w(v) * (n if isinstance(n, int) and n > 0 else 0) * _depth(v)
    if name == "format" and isinstance(v, str):
        return _percent_growth(v, list(rest) + list(kwargs.values()))
    return 0


def _percent_growth(fmt: str, args) -> int:
    """The padding '%' formatting can add: conversions x the widest width / precision (written or '*')."""
    specs = list(_PERCENT.finditer(fmt))
    widths = [int(x) for m in specs for x in m.groups() if x and x != "*"]
    widths += [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
    return len(specs) * max(widths, default=0)


def _depth(v, memo=None) -> int:
    """Nesting depth of lists / tuples / dicts (each container visited once)."""
    memo = {} if memo is None else memo
    if not isinstance(v, (list, tuple, dict)):
        return 1
    if id(v) in memo:
        return memo[id(v)][1]
    memo[id(v)] = (v, 1)
    items = v.values() if isinstance(v, dict) else v
    d = 1 + max((_depth(x, memo) for x in items), default=0)
    memo[id(v)] = (v, d)
    return d


def _raise_exception(message):
    raise ChatTemplateError(f"chat template raised: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """Hugging Face's tojson: plain json.dumps (jinja's own escapes <, >, & and ' for HTML)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

