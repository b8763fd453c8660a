"""`refimpl.tokenizer`: the public name of refimpl.tokenizers (`refimpl.tokenizer.from_gguf(path)`)."""
from .tokenizers import *  # noqa: F401,F403
from .tokenizers import __all__  # noqa: F401
