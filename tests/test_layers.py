"""The layers of docs/architecture.md, read off the source: core <- ops <- models <- tools, kernels beside ops
(they import core and ops; only the dispatch loads them), the test toolkit above everything. Every import
statement of refimpl, module level or inside a function, is an edge; the graph has no cycle, no edge goes up
a layer or sideways into kernels, and no module takes another package's private name or private module."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.property

ROOT = Path(__file__).resolve().parents[1]

# module prefix -> layer (the longest matching prefix decides)
LAYER_OF = {
    "refimpl": "facade",                 # refimpl/__init__.py: re-exports core and ops for `import refimpl`
    "refimpl.types": "core", "refimpl.qtensor": "core", "refimpl.quants": "core", "refimpl.gguf": "core",
    "refimpl.dispatch": "core", "refimpl.shapes": "core", "refimpl.tolerances": "core", "refimpl.rounding": "core",
    "refimpl.progress": "core", "refimpl.errors": "core", "refimpl.residency": "core", "refimpl.backends": "core",
    "refimpl.ops": "ops",
    "refimpl.kernels": "kernels",
    "refimpl.models": "models", "refimpl.tokenizers": "models", "refimpl.tokenizer": "models",
    "refimpl.chat": "models", "refimpl.chat_sandbox": "models", "refimpl.sampling": "models",
    "refimpl.compare": "tools", "refimpl.check": "tools", "refimpl.report": "tools", "refimpl.__main__": "tools",
    "refimpl.conformance": "tools", "refimpl.cliargs": "tools", "refimpl.textgen": "tools",
    "refimpl.rpc": "tools", "refimpl.convert": "tools", "refimpl.fetch": "tools", "refimpl.requantize": "tools",
    "refimpl.testing": "testing",
}
BELOW = {     # layer -> the layers it may import
    "core": {"core"},
    "ops": {"core", "ops"},
    "kernels": {"core", "ops", "kernels"},
    "models": {"core", "ops", "models"},
    "facade": {"core", "ops", "facade", "models", "tools", "testing"},   # lazy attributes only, see below
    "tools": {"core", "ops", "models", "tools", "facade"},
    "testing": {"core", "ops", "kernels", "models", "tools", "facade", "testing"},
}
# No edge from the library into the test toolkit (`refimpl compare --op` runs the toolkit's op comparison as a
# program of its own: python -m refimpl.testing.compare_op).
ALLOWED_EDGES: set = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "refimpl").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(mod: str, is_pkg: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _imports(mod: str, path: Path):
    """(target module, imported name or None, line) for every refimpl import in the file."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "refimpl":
                    yield a.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(mod, is_pkg, node.level, node.module)
            if target.split(".")[0] != "refimpl":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                yield (sub, None, node.lineno) if sub in MODULES else (target, a.name, node.lineno)


def _layer(mod: str) -> str:
    best = max((p for p in LAYER_OF if mod == p or mod.startswith(p + ".")), key=len)
    return LAYER_OF[best]


def _package(mod: str) -> str:
    return ".".join(mod.split(".")[:2])


EDGES = {m: sorted({t for t, _, _ in _imports(m, p) if t in MODULES and t != m}) for m, p in MODULES.items()}


def test_every_module_has_a_layer():
    assert all(_layer(m) for m in MODULES)


def test_the_import_graph_has_no_cycle():
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):                                        # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in EDGES[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))
    for v in MODULES:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_imports_go_down_the_layers():
    bad = []
    for m, path in MODULES.items():
        for t, _, line in _imports(m, path):
            if t not in MODULES and t.rsplit(".", 1)[0] not in MODULES:
                continue
            lt = _layer(t)
            if lt not in BELOW[_layer(m)] and (m, t) not in ALLOWED_EDGES:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {m} ({_layer(m)}) imports {t} ({lt})")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_the_facade_imports_only_core_and_ops_eagerly():
    """`import refimpl` loads core and ops; models, tools and the toolkit are attributes loaded on first use."""
    tree = ast.parse((ROOT / "refimpl" / "__init__.py").read_text())
    eager = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    for n in eager:
        target = _resolve("refimpl", True, n.level, n.module) if isinstance(n, ast.ImportFrom) else n.names[0].name
        names = [target] + [f"{target}.{a.name}" for a in getattr(n, "names", [])]
        layers = {_layer(x) for x in names if x in MODULES}
        assert layers <= {"core", "ops", "facade"}, (target, layers)


def test_no_private_name_or_module_crosses_a_package():
    bad = []
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text())
        alias = {}
        for t, name, line in _imports(m, path):
            private_mod = any(p.startswith("_") and not p.startswith("__") for p in t.split("."))
            private_name = bool(name) and name.startswith("_") and not name.startswith("__")
            if _package(t) != _package(m) and (private_mod or private_name):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {m} imports {t}{'.' + name if name else ''}")
        for node in ast.walk(tree):                      # module aliases: `from ..ops import matmul as mm`
            if isinstance(node, ast.ImportFrom):
                target = _resolve(m, path.name == "__init__.py", node.level, node.module)
                for a in node.names:
                    if f"{target}.{a.name}" in MODULES:
                        alias[a.asname or a.name] = f"{target}.{a.name}"
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in alias
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and _package(alias[node.value.id]) != _package(m)):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {m} reads {alias[node.value.id]}.{node.attr}")
    assert not bad, "private names across packages:\n" + "\n".join(sorted(set(bad)))


@pytest.mark.parametrize("folder", ["ops"])
def test_no_backend_or_numerics_branch_in_op_bodies(folder):
    """The dispatch alone asks which backend and numerics are active."""
    bad = []
    for path in sorted((ROOT / "refimpl" / folder).rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if any(k in code for k in ("current_numerics(", "current_backend(", "ggml_numerics(", "gpu_mode(")):
                bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_models_import_no_kernel():
    bad = [f"{MODULES[m].relative_to(ROOT)}: {m} imports {t}" for m in MODULES if _layer(m) == "models"
           for t in EDGES[m] if _layer(t) == "kernels"]
    assert not bad, "\n".join(bad)


# What knowing where a model runs looks like in source: device arrays, uploads, residency helpers, backend names.
DEVICE_WORDS = ("copy_to_host", "to_device", "on_device", "residency", "device_of", "gpu_mode", "device_constant",
                "cuda", "current_backend(")


def test_models_do_not_know_where_they_run():
    """Models call ops only: the CUDA backend keeps activations, weights and state on its device by itself
    (refimpl.backends.state_copy for the state a model writes); no model code names a device or a backend."""
    bad = []
    for path in sorted((ROOT / "refimpl" / "models").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else \
                node.name if isinstance(node, (ast.FunctionDef, ast.alias)) else None
            if name and any(w.rstrip("(") in name for w in DEVICE_WORDS):
                bad.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}: {name}")
    assert not bad, "\n".join(bad)


def test_library_code_never_imports_the_test_toolkit():
    bad = [f"{m} imports {t}" for m in MODULES if _layer(m) not in ("testing", "facade")
           for t in EDGES[m] if _layer(t) == "testing" and (m, t) not in ALLOWED_EDGES]
    assert not bad, "\n".join(bad)


# What reaching below a library's public API looks like in source: reading /proc, dlopen tricks on an
# already loaded library, a variable read out of a library, a call through an address in IR, private
# attributes of the standard library's thread pool or of Numba's threading layer, OpenBLAS's threads callback.
HOOKS = ("/proc/", "RTLD_NOLOAD", ".in_dll(", "inttoptr", "_max_workers", "_get_num_threads", "_is_initialized",
         "set_threads_callback", "get_config", "numba.np.ufunc.parallel")


def test_no_hooks_below_public_apis():
    """Threads through Numba's public getters and setters, BLAS through NumPy (and MKL's documented entry
    points, kernels/mkl.py): no library code reaches below a public API (docs/architecture.md)."""
    bad = []
    for path in sorted((ROOT / "refimpl").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            for h in HOOKS:
                if h in code:
                    bad.append(f"{rel}:{i}: {h}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_library_code_reaches_other_packages_through_their_public_modules():
    """No `llama_cpp._ggml` or the like: a private module of another package changes without notice (the
    shared libraries are opened by their exported C symbols instead)."""
    bad = []
    for m, path in MODULES.items():
        if _layer(m) == "testing":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for t in names:
                if t.split(".")[0] in ("refimpl", "__future__"):
                    continue
                if any(p.startswith("_") and not p.startswith("__") for p in t.split(".")):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {m} imports {t}")
    assert not bad, "private modules of other packages:\n" + "\n".join(bad)


# Each shared helper has one home: ggml's layout predicates in shapes.py, C's libm as correctly rounded f32
# functions in rounding.py, type names in types.py, RoPE's mode constants in ops/rope.py.
HOMES = {"ne_nb": "refimpl.shapes", "rows_packed": "refimpl.shapes", "is_contiguous": "refimpl.shapes",
         "is_contiguous_1": "refimpl.shapes", "is_transposed": "refimpl.shapes", "check_layout": "refimpl.shapes",
         "libm_f32": "refimpl.rounding", "expf_f32": "refimpl.rounding", "erff_f32": "refimpl.rounding",
         "type_name": "refimpl.types"}
LOOKALIKES = re.compile(r"^_*(is_)?(contig\w*|rows_(packed|contiguous)|transposed|t(ype_)?name|libm(_f32)?|expf\w*|"
                        r"erff\w*|ne_nb)$")


def test_each_shared_helper_has_one_home():
    bad = []
    for m, path in MODULES.items():
        if _layer(m) == "testing":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef) and LOOKALIKES.match(node.name) and HOMES.get(node.name) != m:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: def {node.name} (home: "
                           f"{HOMES.get(node.name.strip('_'), 'refimpl.shapes / rounding / types')})")
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and n.id.startswith("ROPE_TYPE_") and m != "refimpl.ops.rope":
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {n.id} (RoPE modes live in ops/rope.py)")
    assert not bad, "helpers defined outside their home:\n" + "\n".join(bad)


def test_errors_leave_the_command_line_in_one_place():
    """A user error is raised (ValueError, OSError, ...) and main() alone turns it into one line: no
    SystemExit("refimpl: error: ...") anywhere in the library."""
    bad = []
    for m, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                f = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(f, ast.Name) and f.id == "SystemExit":
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "SystemExit raised outside main():\n" + "\n".join(bad)


def test_model_families_are_told_apart_by_the_registry():
    """refimpl.models.FAMILIES names the module for each architecture; the modules' own tables agree."""
    from refimpl.models import FAMILIES, family, gemma3, gpt_oss, llama
    for arch in llama.ROPE_MODE:
        assert family(arch) is llama, arch
    for mod in (gemma3, gpt_oss):
        for arch in mod.ARCHS:
            assert family(arch) is mod, arch
    assert set(FAMILIES) >= set(llama.ROPE_MODE) | set(gemma3.ARCHS) | set(gpt_oss.ARCHS)
    for name in ("refimpl/__main__.py", "refimpl/textgen.py", "refimpl/compare.py"):
        tree = ast.parse((ROOT / name).read_text())
        chains = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") ==
                  "isinstance" and len(n.args) == 2 and getattr(n.args[1], "attr", getattr(n.args[1], "id", ""))
                  .endswith("Model")]
        assert not chains, f"{name}: model kinds told apart by isinstance at lines {chains}"


def test_models_never_ask_the_numerics():
    """A model calls ops; how its KV cache stores and spans cells is the cache's, chosen by the profile when the
    cache is made (dispatch.kv_layout), and roundings are the dispatch's."""
    bad = []
    for m, path in MODULES.items():
        if _layer(m) != "models" or not m.startswith("refimpl.models"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else \
                node.name if isinstance(node, ast.alias) else None
            if name in ("ggml_numerics", "current_numerics"):
                bad.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}: {name}")
    assert not bad, "models asking which numerics runs them:\n" + "\n".join(bad)


def test_cap_returns_what_it_records():
    """A model names a tensor where it makes it: `x = cap(name, op(...))` (refimpl.models.common.capture_fn)."""
    import numpy as np
    from refimpl.models.common import capture_fn, no_capture
    got = {}
    x = np.arange(3, dtype=np.float32)
    assert capture_fn(got)("t", x) is x and np.array_equal(got["t"], x) and got["t"] is not x
    assert capture_fn(lambda n, a: None)("t", x) is x and no_capture("t", x) is x


def test_models_write_each_layer_once():
    """A model does not branch on whether it is captured (`cap is no_capture`): it calls the fusions, and a
    capture makes the dispatch run their op sequences (dispatch.tapping), so there is one layer function."""
    bad = []
    for m, path in MODULES.items():
        if not m.startswith("refimpl.models"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare) and any(isinstance(o, (ast.Is, ast.IsNot)) for o in node.ops) and \
                    any(getattr(c, "id", None) == "no_capture" for c in node.comparators):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "a model branches on its capture:\n" + "\n".join(bad)
