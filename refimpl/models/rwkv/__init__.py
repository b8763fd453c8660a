"""RWKV v4, v5 (5.0 / 5.1 / 5.2), v6 and v7 as plain functions over refimpl's ops, with an explicit state.

    model = load("RWKV-4-Pile-169M.pth")              # .pth (needs torch), .safetensors, .npz, .gguf, rwkv.cpp .bin
    logits, state = forward(model, tokens)             # logits (n_vocab,) f32 of the LAST token; a new RwkvState
    logits, state = forward(model, [t], state)         # continue; `state` itself is never modified
    fork = state.copy()                                # states are NumPy arrays only: copy, save, load
                                                       # (device arrays under backend("cuda"): state.to_host())

RWKV is a recurrent network: the state after a prompt replaces Llama's KV cache and has a fixed size
(`RwkvState`, state.py). Processing tokens one at a time or as one sequence gives the same logits and state
(within `tol("rwkv.forward", "f32", "sequence")`).

The model (`RwkvModel`) is what the loaders produce for every version: `weights`, a dict keyed by BlinkDL's
.pth names ("emb.weight", "blocks.0.att.key.weight", ...), float32 NumPy arrays with the checkpoint's own
shapes (a linear weight is (n_out, n_in), i.e. ggml ne [n_in, n_out]; tests/models/rwkv_tiny.py lists every
version's names and shapes); `version` (4, 5, 6 or 7); `hparams`; `tokenizer` (None unless given).
checkpoint.py reads .pth / .safetensors / .npz state dicts (and the `transformers` names of the same tensors);
gguf_io.py reads llama.cpp GGUF files and returns the same RwkvModel (its matrices may stay quantized QTensors).

Each version lives in its own module, v4.py .. v7.py, and implements one function that `forward` dispatches to:

    forward_seq(model, tokens, state, cap) -> (x, new_state)
        model      RwkvModel of that version
        tokens     np.ndarray int32 (n_tokens,), n_tokens >= 1, ids checked against the vocabulary
        state      RwkvState of that version (checked against hparams); read, never modified
        cap        callable (name, array): receives named intermediates (a no-op when capture is None)
        x          f32 (n_tokens, n_embd), ggml ne [n_embd, n_tokens]: the residual stream after the last
                   block for every token (before ln_out); forward applies ln_out and head
        new_state  a new RwkvState: the state after the last token

It embeds the tokens itself (emb.weight, then blocks.0.ln0), and applies `hparams.rescale_every` if non-zero
(x halved after every rescale_every-th block, as llama.cpp and the rwkv package do for f16 inference;
checkpoints rescaled that way must say so, plain .pth files never are).

Capture names (every version): llama.cpp's where its RWKV graphs have one -- `inp_embd`, `attn_norm-{il}`,
`ffn_inp-{il}`, `ffn_norm-{il}`, `l_out-{il}`, `result_norm`, `result_output` -- plus `inp_norm` (after
blocks.0.ln0, llama.cpp's tok_norm) and each version's own, listed in its module.
"""
from __future__ import annotations

import importlib

import numpy as np

from ...backends import forward_scope
from ...errors import LoadError, RWKVError, not_this_format
from ...ops import mul_mat
from ..common import capture_fn, to_host
from ..common import layer_norm as common_layer_norm
from .model import HParams, RwkvModel
from .state import RwkvState

__all__ = ["RwkvModel", "HParams", "RwkvState", "load", "forward", "new_state", "generate", "from_state_dict"]


def from_state_dict(state_dict: dict, *, tokenizer=None, path: str = "") -> RwkvModel:
    """An RwkvModel from a dict name -> array (BlinkDL or transformers names; any float dtype; see checkpoint.py)."""
    from .checkpoint import from_state_dict as _f
    return _f(state_dict, tokenizer=tokenizer, path=path)


# what the readers under load raise for a damaged file (safetensors' Rust error, pickle's, zipfile's)
# (NumPy's .npy header parser raises SyntaxError / tokenize.TokenError for a damaged header)
_READER_ERRORS = {"SafetensorError", "UnpicklingError", "BadZipFile", "TokenError", "LargeZipFile"}


def load(path, *, tokenizer=None) -> RwkvModel:
    """Load an RWKV model: a BlinkDL/ChatRWKV .pth (torch.load with weights_only=True; needs torch), a
    .safetensors or .npz state dict, a llama.cpp .gguf (gguf_io.load) or an rwkv.cpp .bin (rwkv_cpp.load).
    The version is detected from the
    tensors (checkpoint.detect_version)."""
    try:
        return _read(path, tokenizer)
    except (LoadError, ImportError, OSError):
        raise
    except Exception as e:          # noqa: BLE001 -- torch / safetensors / NumPy readers' errors, at the boundary
        if type(e).__name__ not in _READER_ERRORS and not isinstance(e, (ValueError, KeyError, TypeError,
                                                                           IndexError, AttributeError,
                                                                           SyntaxError, EOFError)):
            raise
        msg = str(e) if str(path) in str(e) else f"{not_this_format(path, 'an RWKV checkpoint refimpl reads')}: {e}"
        raise RWKVError(msg, path) from e


def _read(path, tokenizer) -> RwkvModel:
    if str(path).endswith(".gguf"):
        from . import gguf_io
        model = gguf_io.load(path)
        if tokenizer is not None:
            model.tokenizer = tokenizer
        return model
    from . import rwkv_cpp
    if rwkv_cpp.is_rwkv_cpp(path):
        return rwkv_cpp.load(path, tokenizer=tokenizer)
    from .checkpoint import load as _load
    return _load(path, tokenizer=tokenizer)


def new_state(model: RwkvModel) -> RwkvState:
    """The state before any token: zeros (v4's pp at -1e38)."""
    hp = model.hparams
    return RwkvState.zeros(model.version, hp.n_layer, hp.n_embd, hp.n_head, hp.head_size)


def _check_state(model: RwkvModel, state: RwkvState) -> None:
    hp = model.hparams
    if not isinstance(state, RwkvState) or state.version != model.version:
        raise ValueError(f"state: an RwkvState of version {model.version} is needed, got "
                         f"{getattr(state, 'version', type(state).__name__)}")
    wkv = (hp.n_layer, 3, hp.n_embd) if model.version == 4 else (hp.n_layer, hp.n_head, hp.head_size, hp.head_size)
    for k, shape in (("shift_att", (hp.n_layer, hp.n_embd)), ("shift_ffn", (hp.n_layer, hp.n_embd)), ("wkv", wkv)):
        a = getattr(state, k)
        if a.shape != shape or a.dtype != np.float32:
            raise ValueError(f"state.{k}: f32 {shape} expected for this model, got {a.dtype} {a.shape}")


def _module(version: int):
    if version not in (4, 5, 6, 7):
        raise ValueError(f"RWKV version {version}: only 4, 5, 6, 7 exist")
    return importlib.import_module(f"{__name__}.v{version}")


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """torch's LayerNorm over the last axis as ggml ops: norm(x, eps) * weight + bias (llama.cpp's LLM_NORM)."""
    from .v6 import flat
    return common_layer_norm(x, flat(weight), flat(bias), eps)


def forward(model: RwkvModel, tokens, state: RwkvState | None = None, capture=None, all_logits: bool = False):
    """Run `tokens` (one id or a sequence) from `state` (None: new_state(model)).

    Returns (logits, new_state): logits f32 (n_vocab,) of the last token, or (n_tokens, n_vocab) for every
    token with all_logits=True; new_state is a new RwkvState (the one passed in is left as it was).
    """
    hp = model.hparams
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if tokens.size == 0:
        raise ValueError("forward: no tokens")
    if tokens.min() < 0 or tokens.max() >= hp.vocab:
        raise ValueError(f"forward: token id out of range [0, {hp.vocab})")
    tokens = tokens.astype(np.int32)
    if state is None:
        state = new_state(model)
    _check_state(model, state)
    cap = capture_fn(capture)
    with forward_scope(int(tokens.size), "decoder"):
        try:
            x, state = _module(model.version).forward_seq(model, tokens, state, cap)
        except KeyError as e:              # a tensor the version's graph reads is not in the checkpoint
            name = e.args[0] if e.args else ""
            if not _is_tensor_name(name):
                raise
            raise RWKVError(f"{model.path or 'model'}: RWKV-{hp.variant} tensor {name!r} is missing",
                            model.path or None) from e
        if not all_logits:
            x = x[-1:]
        x = layer_norm(x, model.w("ln_out.weight"), model.w("ln_out.bias"), hp.norm_eps)
        cap("result_norm", x)
        logits = to_host(mul_mat(model.w("head.weight"), x))
    cap("result_output", logits)
    return (logits if all_logits else logits[0]), state


def _is_tensor_name(name) -> bool:
    """Whether a KeyError's key reads as an RWKV tensor name (blocks.N.* or a top-level weight)."""
    if not isinstance(name, str):
        return False
    parts = name.split(".")
    return (parts[0] == "blocks" and len(parts) >= 3 and parts[1].isdigit()) or name in (
        "emb.weight", "head.weight", "ln_out.weight", "ln_out.bias")


def generate(model: RwkvModel, prompt, max_tokens: int = 64, sampler=None, state: RwkvState | None = None, *,
             stop_ids=None):
    """Continue `prompt` (text, which needs model.tokenizer, or a list of token ids) from `state`.

    Yields text pieces when the model has a tokenizer, else token ids. Stops after max_tokens, or at a token
    of stop_ids (default: the tokenizer's end-of-generation ids, none without a tokenizer); the stop token is
    not yielded. The generator's return value (StopIteration.value, or `yield from`) is the state after the
    prompt and every yielded token, so a conversation can go on from it; `state` itself is not modified.
    """
    from ...sampling import Sampler
    sampler = sampler or Sampler()
    tok = model.tokenizer
    if isinstance(prompt, str):
        if tok is None:
            raise ValueError("generate: a text prompt needs model.tokenizer; pass token ids instead")
        ids = list(tok.encode(prompt, add_special=False))
    else:
        ids = [int(i) for i in prompt]
    if not ids:
        raise ValueError("generate: empty prompt")
    if stop_ids is None:
        stop_ids = set()
        if tok is not None:
            stop_ids |= {int(i) for i in (getattr(tok, "eog_ids", None) or ()) if i is not None and i >= 0}
            stop_ids |= {i for i in (getattr(tok, "eos_id", None),) if i is not None and i >= 0}
    stop_ids = set(stop_ids)
    logits, state = forward(model, ids, state)
    history = list(ids)
    stream = tok.stream() if tok is not None and hasattr(tok, "stream") else None
    for _ in range(max_tokens):
        t = int(sampler.sample(logits, history))
        if t in stop_ids:
            break
        history.append(t)
        if tok is None:
            yield t
        else:
            piece = stream.push(t) if stream is not None else tok.decode([t])
            if piece:
                yield piece
        logits, state = forward(model, [t], state)
    if stream is not None and hasattr(stream, "flush"):
        tail = stream.flush()
        if tail:
            yield tail
    return state
