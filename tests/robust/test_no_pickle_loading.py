"""No code in the refimpl package may unpickle data (a pickle runs arbitrary code when loaded): the only
allowed deserializer of pickled files is `torch.load(..., weights_only=True)`, torch's restricted
unpickler. The source tree is parsed (not grepped), so aliases (`import pickle as p`, `from numpy import
load`) and keyword arguments are seen as Python sees them.

Flagged: pickle / _pickle / cPickle / dill / cloudpickle `load`, `loads`, `Unpickler`; `joblib.load`;
`shelve.open`; `marshal.load(s)`; `pandas.read_pickle`; `numpy.load` (and `numpy.lib.format.read_array`)
with `allow_pickle` other than a literal False (NumPy's default is False, so omitting it is fine);
`torch.load` without a literal `weights_only=True`; `yaml.load` / `yaml.unsafe_load` / `yaml.full_load`;
`eval` / `exec` / `compile` builtins.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.property

PACKAGE = Path(__file__).resolve().parents[2] / "refimpl"

# (file relative to the repository, call): why it is safe
ALLOWED = {
    ("refimpl/testing/ggml.py", "pickle.loads"):
        "reads back the result that its own forked child process pickled into a pipe; never a file or "
        "other outside input",
    ("refimpl/kernels/_common.py", "compile"):
        "per_type compiles the kernel templates written in refimpl's own modules (kernels/matmul.py, "
        "kernels/quants.py), formatted with type names of refimpl's type table that it checks are identifiers; "
        "never outside input",
    ("refimpl/kernels/_common.py", "exec"):
        "runs what per_type compiled (the line above), defining one kernel per type in the template's module",
}

_PICKLERS = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle"}


def _aliases(tree: ast.AST) -> dict[str, str]:
    """local name -> dotted origin, from every import in the module (functions' own imports included)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.AST, aliases: dict) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    head = aliases.get(node.id, node.id)
    return ".".join([head, *reversed(parts)])


def _const_kw(call: ast.Call, name: str):
    """(present, literal value or a sentinel for a non-literal) of keyword `name`."""
    for kw in call.keywords:
        if kw.arg == name:
            return True, (kw.value.value if isinstance(kw.value, ast.Constant) else ...)
        if kw.arg is None:          # **kwargs: unknown
            return True, ...
    return False, None


def problems(path: Path, source: str) -> list[tuple[int, str, str]]:
    """(line, call, why) for every call that could unpickle or run code, in one source file."""
    tree = ast.parse(source, str(path))
    aliases = _aliases(tree)
    out = []
    np_mod = {"numpy", "np"}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        if name is None:
            continue
        mod, _, fn = name.rpartition(".")
        root = name.split(".")[0]
        if root in _PICKLERS and fn in ("load", "loads", "Unpickler"):
            out.append((node.lineno, name, "unpickles"))
        elif name in ("joblib.load", "shelve.open", "marshal.load", "marshal.loads", "pandas.read_pickle"):
            out.append((node.lineno, name, "unpickles / unmarshals"))
        elif (root in np_mod and fn == "load") or name.endswith("lib.format.read_array"):
            present, value = _const_kw(node, "allow_pickle")
            if present and value is not False:
                out.append((node.lineno, name, f"allow_pickle={value!r}"))
        elif root == "torch" and fn == "load":
            present, value = _const_kw(node, "weights_only")
            if value is not True:
                out.append((node.lineno, name, "torch.load without weights_only=True"))
        elif root == "yaml" and fn in ("load", "unsafe_load", "full_load", "load_all", "unsafe_load_all"):
            present, value = _const_kw(node, "Loader")
            if fn != "load" or not present or value is ...:
                out.append((node.lineno, name, "yaml can build arbitrary objects"))
        elif isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec", "compile") \
                and node.func.id not in aliases:
            out.append((node.lineno, node.func.id, "runs code"))
    return out


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def test_the_scanner_sees_through_aliases():
    src = """
import pickle as p
import numpy
from numpy import load as L
import torch, yaml
from dill import loads
p.loads(b"")
numpy.load("a", allow_pickle=True)
L("a", allow_pickle=flag)
numpy.load("a")                                    # fine: NumPy's default is allow_pickle=False
torch.load("a")
torch.load("a", weights_only=True)                 # fine
torch.load("a", weights_only=False)
yaml.load(s)
loads(b"")
eval("1")
"""
    got = [(line, why) for line, _, why in problems(Path("x.py"), src)]
    lines = [line for line, _ in got]
    assert lines == [7, 8, 9, 11, 13, 14, 15, 16], got


def test_no_module_of_the_package_unpickles():
    found = []
    for path in _sources():
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for line, call, why in problems(path, path.read_text(encoding="utf-8")):
            if (rel, call) not in ALLOWED:
                found.append(f"{rel}:{line}: {call}: {why}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("key", sorted(ALLOWED))
def test_every_allowed_exception_still_exists(key):
    rel, call = key
    path = PACKAGE.parent / rel
    assert path.is_file(), rel
    assert any(c == call for _, c, _ in problems(path, path.read_text(encoding="utf-8"))), \
        f"{rel} no longer calls {call}: remove it from ALLOWED"
