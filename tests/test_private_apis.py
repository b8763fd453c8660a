"""The two private APIs refimpl extends, checked for the shape it relies on, so that a release that changes them
fails here (and pyproject's upper bounds keep installs on the versions checked): gguf's
`GGUFWriter._pack_val` (refimpl.gguf writes empty arrays, which it refuses) and jinja2's `CodeGenerator`
visitors (refimpl.chat's sandbox routes literals and loops through its size and time checks)."""
import inspect
import re
from importlib.metadata import version
from pathlib import Path

import pytest

pytestmark = pytest.mark.property

ROOT = Path(__file__).resolve().parents[1]


def _bounds(name: str) -> tuple[str, str]:
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(rf'"{name}>=([\d.]+),<([\d.]+)"', text)
    assert m, f"pyproject.toml declares no upper bound for {name}"
    return m.group(1), m.group(2)


def _v(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", s)[:3])


@pytest.mark.parametrize("name", ["gguf", "jinja2"])
def test_the_installed_version_is_within_the_declared_bounds(name):
    lo, hi = _bounds(name)
    assert _v(lo) <= _v(version(name)) < _v(hi), (name, version(name), lo, hi)


def test_gguf_pack_val_has_the_shape_refimpl_extends():
    from gguf import GGUFValueType, GGUFWriter
    params = list(inspect.signature(GGUFWriter._pack_val).parameters)
    assert params == ["self", "val", "vtype", "add_vtype", "sub_type"], params
    assert callable(getattr(GGUFWriter, "_pack", None))
    w = GGUFWriter.__new__(GGUFWriter)
    w.endianess = getattr(__import__("gguf").GGUFEndian, "LITTLE")
    assert w._pack_val(7, GGUFValueType.UINT32, add_vtype=True) == b"\x04\x00\x00\x00\x07\x00\x00\x00"


def test_jinja2_code_generator_has_the_visitors_refimpl_extends():
    from jinja2.compiler import CodeGenerator
    for name in ("visit", "visit_For", "visit_Concat", "visit_List", "visit_Dict", "visit_Tuple", "write"):
        fn = getattr(CodeGenerator, name, None)
        assert callable(fn), name
        if name.startswith("visit_"):
            assert list(inspect.signature(fn).parameters)[:3] == ["self", "node", "frame"], name
    from refimpl.chat import ChatTemplateError, render
    doubling = ('{% set ns = namespace(s="x") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}'
                "{{ ns.s | length }}")
    with pytest.raises(ChatTemplateError, match="refused"):   # `~` goes through the generated size check
        render(doubling, [], max_output=1000)
