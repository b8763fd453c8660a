"""Chat formatting with the GGUF's `tokenizer.chat_template`, rendered in a sandboxed Jinja environment.

A template is data from a downloaded file: it runs in jinja2's ImmutableSandboxedEnvironment, so it
cannot reach Python internals (attribute access to dunders, mutation of passed objects, calls to unsafe
callables raise `jinja2.exceptions.SecurityError`, reported here as ChatTemplateError).
"""
from __future__ import annotations


class ChatTemplateError(ValueError):
    pass


def render(template: str, messages: list[dict], *, add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "") -> str:
    try:
        from jinja2 import TemplateError
        from jinja2.exceptions import SecurityError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise ImportError("chat templates need jinja2 (pip install 'refimpl[tokenizers]')") from e

    def raise_exception(msg):
        raise ChatTemplateError(f"chat template raised: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                bos_token=bos_token, eos_token=eos_token)
    except SecurityError as e:
        raise ChatTemplateError(f"chat template tried an unsafe operation: {e}") from None
    except TemplateError as e:
        raise ChatTemplateError(f"chat template error: {e}") from None
