"""RWKV for the command line: which files are RWKV models, loading one with its tokenizer, its chat format and a
conversation that keeps the recurrent state between turns (`refimpl generate` / `refimpl chat` call these).

    path = model_path("RWKV-x070-World-0.1B.pth")      # the path if the file is an RWKV model, else None
    m = load_with_tokenizer(path, vocab=None)          # the GGUF's tokenizer, or the World vocabulary beside it
    for turn in chat_turns(m, sampler, ["Hi"]): print(turn["reply"])
"""
from __future__ import annotations

import os

import numpy as np

from ... import gguf
from ...qtensor import QTensor, dequantize
from ...tokenizers.rwkv import RWKVTokenizer
from . import forward, load

CHECKPOINT_SUFFIXES = (".pth", ".pt", ".safetensors", ".npz")
VOCAB_FILE = "rwkv_vocab_v20230424.txt"


def is_rwkv_arch(arch) -> bool:
    """general.architecture of an RWKV graph (rwkv6, rwkv7; rwkv6qwen2, arwkv7 too, which the loader refuses
    with a message naming them)."""
    return isinstance(arch, str) and (arch.startswith("rwkv") or arch == "arwkv7")


def model_path(path) -> str | None:
    """`path` if it names an RWKV model: a GGUF whose general.architecture is rwkv*, or a .pth / .pt /
    .safetensors / .npz state dict (or a .bin saved by torch.save, a zip); else None (a llama-family GGUF, a
    llama2.c checkpoint, no file)."""
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return path if is_rwkv_arch(gguf.load(path).arch) else None
    suffix = os.path.splitext(str(path))[1].lower()
    if suffix in CHECKPOINT_SUFFIXES or (suffix == ".bin" and magic == b"PK\x03\x04"):
        return path
    return None


def load_with_tokenizer(path, vocab=None, weights: str = "auto"):
    """The RWKV model at `path` with its tokenizer (the GGUF's, or `vocab` / the World vocabulary file next to
    the checkpoint), weights dequantized to f32 at load when weights == "f32", or "auto" and the file is under
    256 MiB (then its f32 copy is under 2 GiB). ValueError naming the file when there is no tokenizer."""
    with open(path, "rb") as f:
        is_gguf = f.read(4) == b"GGUF"
    try:
        if is_gguf:
            from .gguf_io import load as load_gguf
            m = load_gguf(gguf.load(path))
        else:
            m = load(path)
    except KeyError as e:                       # a tensor the version needs is missing
        raise ValueError(f"{path}: {e}") from None
    if vocab is None and m.tokenizer is None:
        beside = os.path.join(os.path.dirname(os.path.abspath(path)), VOCAB_FILE)
        vocab = beside if os.path.isfile(beside) else None
    if vocab is not None:
        try:
            m.tokenizer = RWKVTokenizer.from_world_vocab(vocab, vocab_size=m.hparams.vocab)
        except (OSError, ValueError) as e:
            raise ValueError(f"--vocab: {e}") from None
    if m.tokenizer is None:
        raise ValueError(f"{path} has no tokenizer: pass the RWKV World vocabulary with --vocab FILE "
                         f"({VOCAB_FILE}; the `rwkv` pip package ships it)")
    if weights == "f32" or (weights == "auto" and os.path.getsize(path) * 8 < 2 << 30):
        for k, w in m.weights.items():
            if isinstance(w, QTensor):
                m.weights[k] = dequantize(w)
            elif w.dtype != np.float32:
                m.weights[k] = np.asarray(w, np.float32)
    return m


def chat_template(m):
    """The model's Jinja chat template, or None: RWKV's own turns (a GGUF without a template, or with llama.cpp's
    built-in name "rwkv-world", which refimpl's and llama.cpp's converters write)."""
    t = getattr(m.tokenizer, "chat_template", None)
    return t if isinstance(t, str) and ("{%" in t or "{{" in t) else None


def format_chat(m, messages, add_generation_prompt: bool = True) -> str:
    """The conversation as text: the GGUF's Jinja template, or llama.cpp's "rwkv-world" template
    ("System: ...\\n\\n", "User: ...\\n\\n", "Assistant: ...\\n\\n", each content trimmed; "Assistant:" after a
    last user message)."""
    tmpl = chat_template(m)
    tok = m.tokenizer
    if tmpl:
        from ...chat import render
        piece = lambda i: tok.token_to_piece(i).decode("utf-8", "replace") if i is not None and i >= 0 else ""  # noqa: E731
        return render(tmpl, messages, add_generation_prompt=add_generation_prompt,
                      bos_token=piece(getattr(tok, "bos_id", None)), eos_token=piece(getattr(tok, "eos_id", None)))
    out = []
    for i, msg in enumerate(messages):
        role, content = msg["role"], msg["content"].strip()
        if role == "system":
            out.append(f"System: {content}\n\n")
        elif role == "user":
            out.append(f"User: {content}\n\n")
            if i == len(messages) - 1:
                out.append("Assistant:")
        elif role == "assistant":
            out.append(f"Assistant: {content}\n\n")
    return "".join(out)


def chat_turns(m, sampler, turns, *, system: str = "", n_predict: int = 64, emit=None):
    """The conversation, one user turn at a time, keeping the recurrent state between turns: for each turn only
    the new text goes through the model (the turn's prompt; after the reply, what closes it), never the history.

    Without a Jinja template (RWKV's convention, llama.cpp's "rwkv-world"): the first turn runs
    "System: {system}\\n\\n" (if any) and "User: {user}\\n\\nAssistant:", the reply stops at an end-of-generation
    token (not run) or once its text holds "\\n\\n", and "\\n\\n" closes it unless the reply already ends so.
    With a Jinja template: each turn runs what the rendered conversation adds to the text already run (the
    whole conversation again, from a new state, if the template changed earlier text), and after the reply
    what the template writes to close it.

    emit(piece) receives the reply's text as it is generated. Yields, per turn, a dict: reply (its text),
    ids (every token this turn ran through the model, in order: the prompt, the reply, the closing),
    state (the RwkvState after them), restarted (True when a template forced a re-run from a new state).
    """
    tok = m.tokenizer
    tmpl = chat_template(m)
    stop_ids = {int(i) for i in (getattr(tok, "eog_ids", None) or ()) if i is not None and i >= 0}
    stop_ids |= {i for i in (getattr(tok, "eos_id", None),) if i is not None and i >= 0}
    messages = [{"role": "system", "content": system}] if system else []
    state, logits, done, history = None, None, "", []   # done: the text `state` has seen (template mode)
    for user in turns:
        messages.append({"role": "user", "content": user})
        restarted = False
        if tmpl:
            text = format_chat(m, messages)
            if text.startswith(done):
                new = text[len(done):]
            else:
                new, state, history, restarted = text, None, [], True
        else:
            text = new = (f"System: {system.strip()}\n\n" if system and state is None else "") + \
                f"User: {user.strip()}\n\nAssistant:"
        ids = tok.encode(new, add_special=False)
        turn_ids = list(ids)
        if ids:
            logits, state = forward(m, ids, state)
        elif logits is None:
            raise ValueError("chat: the first turn's text is empty")
        history += ids
        stream = tok.stream()
        reply_ids, reply = [], ""
        for _ in range(n_predict):
            t = int(sampler.sample(logits, history))
            if t in stop_ids:
                break
            reply_ids.append(t)
            history.append(t)
            logits, state = forward(m, [t], state)
            piece = stream.push(t)
            reply += piece
            if emit and piece:
                emit(piece)
            if not tmpl and "\n\n" in reply:
                break
        tail = stream.flush()
        reply += tail
        if emit and tail:
            emit(tail)
        turn_ids += reply_ids
        if tmpl:
            messages.append({"role": "assistant", "content": reply})
            ran = text + tok.decode(reply_ids)
            closed = format_chat(m, messages, add_generation_prompt=False)
            close = closed[len(ran):] if closed.startswith(ran) else ""
            done = closed if closed.startswith(ran) else ran
        else:
            messages.append({"role": "assistant", "content": reply})
            close = "" if reply.endswith("\n\n") else "\n\n"
        close_ids = tok.encode(close, add_special=False) if close else []
        if close_ids:
            logits, state = forward(m, close_ids, state)
            history += close_ids
            turn_ids += close_ids
        yield dict(reply=reply, ids=turn_ids, state=state, restarted=restarted)
