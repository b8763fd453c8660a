"""Generated pages of the documentation site, built from refimpl itself: an MkDocs hook (mkdocs.yml `hooks:`).

    ops/index.md, ops/<family>.md   one page per op family (refimpl/ops/<family>.py): every op's signature,
                                    docstring (the ggml call, both shapes, the math, precision choices), the
                                    ggml enum entries it covers, its tolerances from refimpl/tolerances.py,
                                    the compiled kernels registered for it, and where its source is
    layouts.md                      every tensor type: block size, bytes, bits per weight, quantizers, and the
                                    block struct as its dequantizer's docstring states it
    notebooks/index.md + NN_*.py    the teaching notebooks (notebooks/NN_*.py, rendered by mkdocs-jupyter)

An op without a docstring is reported as a warning, which fails `mkdocs build --strict` (tests/test_docs.py).
`python docs/gen_ops_reference.py OUTDIR` writes the generated Markdown pages to OUTDIR instead.
"""
from __future__ import annotations

import importlib
import inspect
import logging
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
log = logging.getLogger("mkdocs.plugins.refimpl.gen_ops_reference")

# family module -> page title, in reading order
FAMILIES = {
    "elementwise": "Element-wise, unary and GLU",
    "reduce": "Reductions",
    "movement": "Data movement and views",
    "norm": "Normalization",
    "softmax": "Softmax",
    "rope": "Rotary embeddings",
    "attention": "Flash attention and the lightning indexer",
    "matmul": "Matrix products",
    "conv": "Convolution, pooling, resampling",
    "recurrent": "Recurrent and state-space",
    "loss": "Losses",
    "optim": "Optimizer steps",
    "hyperconn": "Hyper-connections (DeepSeek V4)",
    "sort": "Sorting",
    "fused": "Fused",
}

# pages linked from hand-written pages that other parts of the project own and may not have written yet:
# a link to one that does not exist is replaced by plain text instead of failing the build
OPTIONAL_PAGES = ("numerics.md",)


def _import_path():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _covers(c: str) -> str:
    if c.startswith("UNARY:"):
        return f"GGML_UNARY_OP_{c[6:]}"
    if c.startswith("GLU:"):
        return f"GGML_GLU_OP_{c[4:]}"
    return f"GGML_OP_{c}"


def _kernels() -> dict[str, list[tuple[str, str]]]:
    """op name -> [(backend, file)] from the `@register("op", backend="...")` decorators in refimpl/kernels
    (read as text, so that building the docs never imports Numba)."""
    found: dict[str, list[tuple[str, str]]] = {}
    pat = re.compile(r"""@register\(\s*["'](\w+)["']\s*,\s*backend\s*=\s*["'](\w+)["']""")
    for f in sorted((ROOT / "refimpl" / "kernels").rglob("*.py")):
        for name, backend in pat.findall(f.read_text(encoding="utf-8")):
            found.setdefault(name, []).append((backend, f.relative_to(ROOT).as_posix()))
    return found


def families() -> dict[str, list]:
    """family -> [OpInfo] in source order."""
    _import_path()
    from refimpl.ops import OPS
    out: dict[str, list] = {f: [] for f in FAMILIES}
    for info in OPS.values():
        fam = info.fn.__module__.rsplit(".", 1)[-1]
        out.setdefault(fam, []).append(info)
    for infos in out.values():
        infos.sort(key=lambda i: inspect.getsourcelines(i.fn)[1])
    return {f: v for f, v in out.items() if v}


def missing_docstrings() -> list[str]:
    """Public ops whose reference function has no docstring."""
    return sorted(i.name for infos in families().values() for i in infos if not (i.fn.__doc__ or "").strip())


def _tolerance_rows(name: str) -> list[str]:
    from refimpl.testing.tolerances import TOLERANCES
    rows = []
    for (what, typ, against), t in TOLERANCES.items():
        if what != name:
            continue
        if t.exact:
            bound = "identical bits"
        elif t.nmse is not None:
            bound = f"NMSE ≤ {t.nmse:g}"
        elif t.max_ulp is not None:
            bound = f"≤ {t.max_ulp} ulp"
        else:
            bound = ", ".join(f"{k} {v:g}" for k, v in (("atol", t.atol), ("rtol", t.rtol)) if v)
        rows.append(f"| {'any' if typ == '*' else typ} | {against} | {bound} | {_md_cell(t.why)} |")
    return rows


def _signature(fn) -> str:
    """The signature with annotations as written (refimpl's modules use postponed, string annotations)."""
    parts, star = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        s = ("*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else "") + p.name
        if p.kind is p.VAR_POSITIONAL:
            star = True
        if p.annotation is not p.empty:
            s += f": {p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)}"
        if p.default is not p.empty:
            s += f" = {p.default!r}" if p.annotation is not p.empty else f"={p.default!r}"
        parts.append(s)
    ret = inspect.signature(fn).return_annotation
    shown = ret if isinstance(ret, str) else inspect.formatannotation(ret)
    tail = "" if ret is inspect.Signature.empty else f" -> {shown}"
    return f"({', '.join(parts)}){tail}"


def op_page(family: str, infos: list, kernels: dict) -> str:
    mod = importlib.import_module(f"refimpl.ops.{family}")
    lines = [f"# {FAMILIES.get(family, family)}", "",
             f"`refimpl/ops/{family}.py`: {len(infos)} ops, each also importable as `refimpl.<name>`.", "",
             "```text", inspect.cleandoc(mod.__doc__ or ""), "```", ""]
    for info in infos:
        fn = info.fn
        doc = inspect.cleandoc(fn.__doc__ or "")
        if not doc:
            log.warning("op %s (refimpl/ops/%s.py) has no docstring", info.name, family)
        src = Path(inspect.getsourcefile(fn)).resolve().relative_to(ROOT).as_posix()
        line = inspect.getsourcelines(fn)[1]
        lines += [f"## {info.name}", "",
                  "```python", f"refimpl.{info.name}{_signature(fn)}", "```", ""]
        if info.covers:
            lines += ["ggml: " + ", ".join(f"`{_covers(c)}`" for c in info.covers) + "  ", ""]
        lines += ["```text", doc or "(no docstring)", "```", ""]
        tol = _tolerance_rows(info.name)
        if tol:
            lines += ["| type | compared with | tolerance | why |", "|---|---|---|---|", *tol, ""]
        else:
            lines += ["No tolerance entry of its own: see the [tolerance table](../testing.md#the-tolerance-table).",
                      ""]
        ks = kernels.get(info.name, [])
        extra = "; ".join(f"{b} (`{f}`)" for b, f in ks)
        lines += [f"Source: `{src}:{line}`" + (f". Kernels: {extra}." if extra else "."), ""]
    return "\n".join(lines)


def ops_index(fams: dict) -> str:
    lines = ["# Op reference", "",
             "Every forward op of ggml as a NumPy function: the name is ggml's without `ggml_`, the arguments follow "
             "ggml's order, shapes are NumPy order (ggml's `ne` reversed) and every docstring gives both. The pages "
             "below are generated from the docstrings and from the tolerance table "
             "(`refimpl/tolerances.py`), so they say what the code and the tests say.", "",
             "| family | ops |", "|---|---|"]
    for fam, infos in fams.items():
        names = ", ".join(f"[`{i.name}`]({fam}.md#{i.name})" for i in infos)
        lines.append(f"| [{FAMILIES.get(fam, fam)}]({fam}.md) | {names} |")
    lines += ["", "`python -m refimpl.testing.coverage --run` lists every op of ggml with its implementation and "
              "golden-test status."]
    return "\n".join(lines)


def _quantizer_groups(t, quantizers) -> str:
    """'chunk = ref = cpu', 'chunk = ref; cpu', ...: the methods of `refimpl.quantize` for type t, those that
    are the same function joined by '=' (a method without its own entry falls back to 'ref')."""
    fns = {m: quantizers.get((t, m)) or quantizers.get((t, "ref")) for m in ("chunk", "ref", "cpu")}
    groups: list[list[str]] = []
    for m, fn in fns.items():
        if fn is None:
            continue
        for g in groups:
            if fns[g[0]] is fn:
                g.append(m)
                break
        else:
            groups.append([m])
    return "; ".join(" = ".join(g) for g in groups) or "none without an importance matrix"


def layouts_page() -> str:
    _import_path()
    from refimpl.quants import DEQUANTIZERS, QUANTIZERS
    from refimpl.types import traits
    lines = ["# Block layouts", "",
             "Every ggml type refimpl holds, with ggml's block size and bytes per block (`refimpl.traits`), the "
             "quantizer methods it has (`refimpl.quantize(x, type, method=...)`, see [Tensor types](types.md)) and "
             "the block struct as its dequantizer states it. Element types (F32, F16, ...) are plain NumPy arrays; "
             "BF16 and the block types are `refimpl.QTensor`s of raw blocks.", "",
             "In the last column, methods joined by `=` run the same quantizer; a method ggml does not have for a "
             "type (Q8_1 and Q8_K have no `ggml_quantize_chunk`) falls back to `ref`.", "",
             "| type | elements per block | bytes per block | bits per weight | `quantize(..., method=)` |",
             "|---|---:|---:|---:|---|"]
    for t in DEQUANTIZERS:
        tr = traits(t)
        methods = _quantizer_groups(t, QUANTIZERS)
        lines.append(f"| [{tr.name}](#{tr.name.lower()}) | {tr.blck_size} | {tr.type_size} | "
                     f"{tr.bits_per_weight:.4g} | {methods} |")
    lines.append("")
    for t, fn in DEQUANTIZERS.items():
        tr = traits(t)
        lines += [f"## {tr.name}", "", "```text", inspect.cleandoc(fn.__doc__ or "(no docstring)"), "```", "",
                  f"Dequantizer: `{fn.__module__}.{fn.__name__}`", ""]
    return "\n".join(lines)


def notebook_sources() -> list[Path]:
    return sorted(NB_DIR.glob("[0-9][0-9]_*.py"))


def _notebook_summary(path: Path) -> tuple[str, str]:
    """(title, first paragraph) of a percent-format notebook's first markdown cell."""
    text = path.read_text(encoding="utf-8")
    cell = text.split("# %% [markdown]", 1)[1].split("# %%", 1)[0]
    lines = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in cell.strip().splitlines()]
    title = lines[0].lstrip("# ").strip()
    para = []
    for ln in lines[1:]:
        if not ln.strip():
            if para:
                break
            continue
        para.append(ln.strip())
    return title, " ".join(para)


VOCABULARIES = (   # llama.cpp's vocab-only GGUFs (models/ of the llama-cpp-python 0.3.36 sdist) and what CI checks
    ("bert-bge", "bert", 47), ("command-r", "gpt2", 47), ("deepseek-coder", "gpt2", 47),
    ("deepseek-llm", "gpt2", 47), ("falcon", "gpt2", 47), ("gemma-4", "gemma4", 46), ("gpt-2", "gpt2", 47),
    ("llama-bpe", "gpt2", 47), ("llama-spm", "llama", 47), ("mpt", "gpt2", 47), ("phi-3", "llama", 47),
    ("qwen2", "gpt2", 47), ("qwen35", "gpt2", 51), ("refact", "gpt2", 47), ("starcoder", "gpt2", 47))
NO_VECTORS = (("aquila", "gpt2", 51, 56), ("baichuan", "llama", 51, 54), ("gpt-neox", "gpt2", 51, 54),
              ("nomic-bert-moe", "t5", 51, 56))


def tokenizers_page() -> str:
    """The vocabularies checked against llama.cpp, the tokenizer models, and every BPE pre-tokenizer name
    refimpl reads, grouped by the regexes they share, with the regexes."""
    _import_path()
    from refimpl.tokenizers import PRE_TOKENIZERS
    groups: dict = {}
    for name, pre in sorted(PRE_TOKENIZERS.items()):
        groups.setdefault(pre, []).append(name)
    lines = ["# Tokenizers", "",
             "`refimpl.tokenizer.from_gguf(path)` builds the tokenizer of a GGUF file from its metadata alone and "
             "gives llama.cpp's ids (llama-vocab.cpp of llama-cpp-python 0.3.36). Tokenizer models "
             "(`tokenizer.ggml.model`): \"gpt2\" (byte-level BPE, with every pre-tokenizer below), \"llama\" "
             "(SentencePiece BPE), \"gemma4\" (BPE over raw UTF-8), \"t5\" (UGM: SentencePiece's unigram model "
             "with its precompiled normalizer), \"bert\" (WordPiece) and \"rwkv\" (RWKV World). llama.cpp's "
             "\"plamo2\", \"hybriddna\" and \"whitespace\" models are refused by name.", "",
             "## llama.cpp's vocabularies", "",
             "Every vocab-only GGUF llama.cpp ships, in CI (`tests/test_vocab_vectors.py`). With test vectors "
             "(`.inp` / `.out`, encoded as test-tokenizer-0 does: add_special=False, parse_special=False), and each "
             "line of ids decoded against llama_detokenize's text:", "",
             "| vocabulary | model | cases | ids identical | decoded identical |", "|---|---|---|---|---|"]
    lines += [f"| {v} | {m} | {n} | {n} | {n} |" for v, m, n in VOCABULARIES]
    lines += ["", "Without test vectors: llama.cpp itself tokenizing qwen35's inputs (a golden file "
              "`scripts/gen_pretokenizer_golden.py` regenerates), plain, with special-token parsing on those and on "
              "texts around the vocabulary's control and mask tokens, and those ids decoded:", "",
              "| vocabulary | model | plain, identical | special parsing, identical | decoded identical |",
              "|---|---|---|---|---|"]
    lines += [f"| {v} | {m} | {p} of {p} | {s_} of {s_} | {s_} of {s_} |" for v, m, p, s_ in NO_VECTORS]
    lines += ["", "## Pre-tokenizers", "",
              "A BPE vocabulary (`tokenizer.ggml.model` \"gpt2\") names its pre-tokenizer in `tokenizer.ggml.pre`: "
              "the regexes llama.cpp splits the text with before BPE, applied in order, each splitting the pieces "
              "the previous one left. refimpl reads every name llama.cpp 0.3.36 accepts, each with llama.cpp's ids "
              "on the same texts (GPT-2's vocabulary with the name set; the golden file above). Where llama.cpp "
              "splits with hand-written code (\"kimi-k2\", \"afmoe\") the regex shown is the one that code "
              "implements. \"clean spaces\": decode contracts \" ?\" \" !\" \" .\" and the like; \"ignore "
              "merges\": a piece that is a whole vocabulary entry is taken as is; \"BOS\": added by default when "
              "`tokenizer.ggml.add_bos_token` is absent; \"no default BOS\": no BOS id unless the GGUF names one; "
              "\"raw UTF-8\": BPE over the text's own bytes (no GPT-2 byte alphabet), byte tokens `<0xXX>` for "
              "what no token covers; \"U+2581\": spaces escaped first; \"line breaks whole\": a run of line "
              "breaks that is a token is taken as one. llama.cpp aborts on \"whitespace\" when a run of "
              "whitespace holds a space (GGML_ASSERT in find_bpe_rank); refimpl raises ValueError there.", ""]
    for pre, names in groups.items():
        flags = [f for f, on in (("clean spaces", pre.clean_spaces), ("ignore merges", pre.ignore_merges),
                                 ("BOS", pre.add_bos), ("no default BOS", pre.no_bos),
                                 ("raw UTF-8", not pre.byte_encode), ("U+2581", pre.escape),
                                 ("line breaks whole", pre.newline_tokens)) if on]
        lines += [f"### {', '.join(names)}", "", f"{'; '.join(flags) or 'no flags'}", "", "```text"]
        lines += [r.replace("\r", "\\r").replace("\n", "\\n") for r in pre.regexes]
        lines += ["```", ""]
    return "\n".join(lines)


def notebooks_index() -> str:
    lines = ["# Notebooks", "",
             "Teaching notebooks, one idea each, that import refimpl rather than re-implement it. Their sources are "
             "jupytext percent-format files in `notebooks/` (the `.ipynb` beside each is that source executed, with "
             "its outputs and figures, so the repository shows them too); the test "
             "docs build executes every one on the real models, so these pages show each output and plot (and the "
             "test suite's build fails when a cell fails: `tests/test_docs.py`). Each ends with exercises "
             "checked against refimpl. Run one locally with `pip install -e '.[notebooks]'` and "
             "`jupyter lab notebooks/` (or open the `.ipynb` in any notebook viewer); "
             "`REFIMPL_DOCS_EXECUTE=false mkdocs build` builds the pages with the code only.", ""]
    lines += ["## The path", "", *notebook_path(), "", "## Each notebook", ""]
    for src in notebook_sources():
        title, para = _notebook_summary(src)
        lines += [f"- [{title}]({src.name}): {para}"]
    return "\n".join(lines)


def notebook_path() -> list[str]:
    """The path table of notebooks/README.md (its one home), each notebook's name a link to its page."""
    text = (NB_DIR / "README.md").read_text(encoding="utf-8")
    table = text.split("<!-- path:", 1)[1].split("\n", 1)[1].split("\n\n", 1)[0]
    return [re.sub(r"`(\d\d_\w+)`", r"[\1](\1.py)", ln) for ln in table.splitlines()]


SHRUNK_MARKER = "<!-- refimpl: shrunk example -->"


def shrunk_example() -> str:
    """A real hypothesis failure and what it shrank to, run now (docs/testing.md shows it): a soft_max that
    forgets to subtract the row maximum, searched over `refimpl.testing.tensors`; derandomized, so every
    build shows the same search."""
    import numpy as np
    from hypothesis import given, settings

    import refimpl
    from refimpl.testing import assert_nmse, tensors

    def my_soft_max(x):                        # the planted bug: exp(x) overflows past x ~ 88.7
        e = np.exp(np.asarray(x, np.float32))
        return e / e.sum(axis=-1, keepdims=True)

    @settings(max_examples=500, derandomize=True, database=None, deadline=None, print_blob=False)
    @given(tensors(types=["f32"], min_value=-100, max_value=100, views=False))
    def test_my_soft_max(x):
        with np.errstate(all="ignore"):
            assert_nmse(my_soft_max(x), refimpl.ops.soft_max_ext(x), 1e-6, "soft_max")

    try:
        test_my_soft_max()
    except AssertionError as e:
        notes = [n for n in getattr(e, "__notes__", []) if n.startswith(("Falsifying", "Failing"))]
        first = str(e).splitlines()[0]
        return "\n".join(notes + [f"AssertionError: {first}"])
    raise RuntimeError("the planted soft_max bug was not found: the docs example needs a new bug")


def generated_pages() -> dict[str, str]:
    fams = families()
    kernels = _kernels()
    pages = {"ops/index.md": ops_index(fams), "layouts.md": layouts_page(), "notebooks/index.md": notebooks_index(),
             "tokenizers.md": tokenizers_page()}
    for fam, infos in fams.items():
        pages[f"ops/{fam}.md"] = op_page(fam, infos, kernels)
    return pages


# -- MkDocs hook events ----------------------------------------------------------------------------------------

def on_config(config):
    """Fill the nav's "Op reference" and "Notebooks" entries with the generated pages."""
    fams = families()
    nav = config.get("nav") or []
    for i, item in enumerate(nav):
        if not isinstance(item, dict):
            continue
        (title, target), = item.items()
        if target == "ops/index.md":
            nav[i] = {title: ["ops/index.md"] + [{FAMILIES.get(f, f): f"ops/{f}.md"} for f in fams]}
        elif target == "numerics-modes.md" and (ROOT / "docs" / "numerics.md").exists():
            nav[i] = {title: ["numerics-modes.md", {"Every emulated rounding": "numerics.md"}]}
        elif target == "notebooks/index.md":
            nav[i] = {title: ["notebooks/index.md"] +
                      [{_notebook_summary(s)[0]: f"notebooks/{s.name}"} for s in notebook_sources()]}
    return config


try:
    from mkdocs.plugins import event_priority
except ImportError:                      # run as a script without mkdocs
    def event_priority(_):
        return lambda f: f


@event_priority(100)                     # before mkdocs-jupyter turns the notebook sources into pages
def on_files(files, config):
    from mkdocs.structure.files import File
    missing = missing_docstrings()
    for name in missing:
        log.warning("public op %s has no docstring", name)
    for uri, content in generated_pages().items():
        files.append(File.generated(config, uri, content=content))
    for src in notebook_sources():
        files.append(File(f"notebooks/{src.name}", str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


_cwd: list[str] = []


def on_page_markdown(markdown, page, config, files):
    """Links to OPTIONAL_PAGES that are not there yet become plain text. A notebook page is rendered and executed
    (unless REFIMPL_DOCS_EXECUTE=false) from notebooks/, the working directory the notebooks expect, without the
    side columns."""
    if page.file.src_uri.startswith("notebooks/") and page.file.src_uri.endswith(".py"):
        _cwd.append(os.getcwd())
        os.chdir(NB_DIR)
        # the whole width for the notebook (the site's navigation stays in the header search and the previous /
        # next links below): its code is written to 120 columns, and at a 1280-pixel window the two side columns
        # left 630 pixels for it, 880 without the table of contents (tests/test_docs.py checks in a browser)
        page.meta["hide"] = ["navigation", "toc"]
    if SHRUNK_MARKER in markdown:
        markdown = markdown.replace(SHRUNK_MARKER, "```text\n" + shrunk_example() + "\n```")
    for name in OPTIONAL_PAGES:
        if files.get_file_from_path(name) is None:
            markdown = re.sub(r"\[([^\]]+)\]\((?:\.\./)*" + re.escape(name) + r"(#[^)]*)?\)",
                              r"\1 (`docs/" + name + "`, not written yet)", markdown)
    return markdown


def on_page_content(html, page, config, files):
    if _cwd:
        os.chdir(_cwd.pop())
    return html


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs-generated")
    for uri, content in generated_pages().items():
        p = out / uri
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content, encoding="utf-8")
        print(p)
