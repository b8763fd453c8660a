"""Chat formatting with the GGUF's `tokenizer.chat_template`, rendered in a sandboxed Jinja environment.

    text = render(template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                  bos_token="<s>", eos_token="</s>")

A chat template is code from a downloaded file. It renders the way Hugging Face transformers renders
chat templates (jinja2 with trim_blocks and lstrip_blocks, the loopcontrols extension, `{% generation %}`
blocks, `raise_exception(msg)`, `strftime_now(fmt)`, a `tojson` that is `json.dumps(x, ensure_ascii=False,
indent=..., separators=..., sort_keys=...)`), with three layers of protection:

1. Isolation: jinja2's ImmutableSandboxedEnvironment. No attribute starting with `_` (so no `__class__`,
   `__globals__`, `__subclasses__`, `_TemplateReference__context`), no unsafe callables, no changes to
   the lists and dicts passed in, no `{% include %}` / `{% import %}` (there is no loader). Unlike plain
   jinja2, an attribute starting with `_` is an error at once (even one that does not exist), instead of
   an undefined value that prints as "". The
   `lipsum` global is removed (a text generator no chat template needs); undefined names render as ""
   as in Hugging Face (templates test `tools is defined`), and using their attributes is an error.
2. Size limits: the rendered text, and every string, list or dict the template builds on the way, may
   hold at most `max_output` characters or items (MAX_OUTPUT unless given); all of them together at most
   16 x max_output. They are checked BEFORE the operation that would exceed them runs: repetition (`*`),
   powers (`**`, integers of at most chat_sandbox.MAX_INT_BITS bits), `+`, `~`, `%` and `str.format` (the widths in
   the format), literals, every call and filter (an integer argument above max_output is refused; `center`,
   `ljust`, `rjust`, `zfill`, `expandtabs`, `replace`, `translate`, `join`, `indent`, `wordwrap`, `batch`,
   `slice`, `tojson(indent=)` and `format` by the size of what they would build; any other filter or
   method by the size of its inputs, which it cannot multiply by more than a small constant), and every
   output expression. `range` is the sandbox's (at most 100000 items).
3. Time limit: rendering stops after `timeout` seconds (TIMEOUT unless given), checked on every iteration
   of every `{% for %}` loop (the compiled loop draws its items through a checking generator), on every
   call (macros included) and in every operation above; so loops that build nothing (`{% for i in
   range(100000) %}{% for j in range(100000) %}`) and recursive macros stop too. Straight-line template
   code is bounded by the template's length (at most max_output characters). The environment is refimpl.chat_sandbox's.

Every failure, refusal and limit is a ChatTemplateError (a ValueError) saying what happened.
"""
from __future__ import annotations

import time

from .errors import ChatTemplateError

MAX_OUTPUT = 1 << 22      # characters (or items) in the output and in any one value built on the way
TIMEOUT = 5.0             # seconds

__all__ = ["render", "ChatTemplateError", "MAX_OUTPUT", "TIMEOUT"]


def render(template: str, messages: list[dict], *, add_generation_prompt: bool = True, bos_token: str = "",
           eos_token: str = "", max_output: int = MAX_OUTPUT, timeout: float = TIMEOUT, **variables) -> str:
    """Render a chat template for `messages` (plus any other template variables, e.g. `tools=[...]`).

    Raises ChatTemplateError when the template fails, calls raise_exception, tries an unsafe operation, or
    would exceed `max_output` characters / `timeout` seconds (see the module docstring)."""
    try:
        from jinja2 import TemplateError
        from jinja2.exceptions import SecurityError
    except ImportError as e:
        raise ImportError("chat templates need jinja2 (pip install 'refimpl[tokenizers]')") from e
    from .chat_sandbox import Sandbox

    if not isinstance(template, str):
        raise ChatTemplateError(f"chat template is a {type(template).__name__}; expected a string")
    if len(template) > max_output:
        raise ChatTemplateError(f"chat template refused: it is {len(template)} characters long, over the limit "
                                f"of {max_output}")
    env = Sandbox(max_output, time.monotonic() + timeout, timeout)
    try:
        tmpl = env.from_string(template)
        env.tick()
        return tmpl.render(messages=messages, add_generation_prompt=add_generation_prompt,
                           bos_token=bos_token, eos_token=eos_token, **variables)
    except ChatTemplateError:
        raise
    except SecurityError as e:
        raise ChatTemplateError(f"chat template tried an unsafe operation: {e}") from None
    except TemplateError as e:
        raise ChatTemplateError(f"chat template error: {type(e).__name__}: {e}") from None
    except RecursionError:
        raise ChatTemplateError("chat template refused: it recursed too deeply") from None
    except MemoryError:
        raise ChatTemplateError("chat template refused: out of memory") from None
    except Exception as e:   # noqa: BLE001 -- any Python error the template's own operations raise: 1/0, 'a' + 1, ...
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
