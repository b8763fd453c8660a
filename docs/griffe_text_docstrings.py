"""Griffe extension for mkdocstrings: show refimpl's docstrings as they are written.

refimpl's docstrings are laid out as text (shapes in both orders in aligned columns, formulas on their own
lines), not as Markdown, so the first paragraph (the summary) is kept as prose and the rest is shown verbatim
in a text block, as `help()` shows it. Configured in mkdocs.yml under the python handler's `extensions`.
"""
from __future__ import annotations

import inspect

import griffe


def as_markdown(doc: str) -> str:
    doc = inspect.cleandoc(doc)
    summary, _, rest = doc.partition("\n\n")
    if not rest.strip():
        return summary
    return f"{summary}\n\n```text\n{rest.rstrip()}\n```"


class TextDocstrings(griffe.Extension):
    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None and obj.docstring.value and "```" not in obj.docstring.value:
            obj.docstring.value = as_markdown(obj.docstring.value)
