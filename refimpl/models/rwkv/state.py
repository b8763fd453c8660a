"""The RWKV recurrent state: NumPy arrays only, so it copies, pickles and saves like any array bundle.

Per layer (numpy shapes; ggml lists them reversed):

    shift_att  (n_layer, n_embd)                    the last token's input to time-mix (token shift)
    shift_ffn  (n_layer, n_embd)                    the last token's input to channel-mix
    wkv        v4:    (n_layer, 3, n_embd)          aa, bb, pp of the numerically stable WKV
               v5-v7: (n_layer, n_head, head_size, head_size)
                                                    the matrix state per head, in the layout of the
                                                    version's wkv op: v5/v6 s[i][j] with i = key index,
                                                    j = value index (rwkv_wkv6); v7 transposed, i = value
                                                    index, j = key index (rwkv_wkv7)

All float32. A fresh state is zeros, except v4's pp which starts at -1e38 (minus "infinity").

`copy()` makes the copy a forward pass writes, in the active backend's memory (refimpl.backends.state_copy):
under the CUDA backend its arrays are device arrays, so a decode loop never moves it; `to_host()` gives the
NumPy state back (`save` and `==` do that themselves).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...backends import state_copy
from ...residency import to_host


@dataclass
class RwkvState:
    version: int
    shift_att: np.ndarray
    shift_ffn: np.ndarray
    wkv: np.ndarray

    @classmethod
    def zeros(cls, version: int, n_layer: int, n_embd: int, n_head: int = 0, head_size: int = 0) -> "RwkvState":
        if version == 4:
            wkv = np.zeros((n_layer, 3, n_embd), np.float32)
            wkv[:, 2] = np.float32(-1e38)
        else:
            wkv = np.zeros((n_layer, n_head, head_size, head_size), np.float32)
        return cls(version, np.zeros((n_layer, n_embd), np.float32), np.zeros((n_layer, n_embd), np.float32), wkv)

    def copy(self) -> "RwkvState":
        """A writable copy in the active backend's memory (NumPy, or device arrays under the CUDA backend)."""
        return RwkvState(self.version, state_copy(self.shift_att), state_copy(self.shift_ffn), state_copy(self.wkv))

    def to_host(self) -> "RwkvState":
        """This state with NumPy arrays (the same arrays where they are NumPy already)."""
        return RwkvState(self.version, *(to_host(a) for a in (self.shift_att, self.shift_ffn, self.wkv)))

    def save(self, path) -> None:
        """Write the state to an .npz file (no pickle)."""
        h = self.to_host()
        np.savez(path, version=np.int32(self.version), shift_att=h.shift_att, shift_ffn=h.shift_ffn, wkv=h.wkv)

    @classmethod
    def load(cls, path) -> "RwkvState":
        with np.load(path, allow_pickle=False) as z:
            return cls(int(z["version"]), z["shift_att"].copy(), z["shift_ffn"].copy(), z["wkv"].copy())

    def __eq__(self, other) -> bool:
        return (isinstance(other, RwkvState) and self.version == other.version
                and all(np.array_equal(to_host(getattr(self, k)), to_host(getattr(other, k)), equal_nan=True)
                        for k in ("shift_att", "shift_ffn", "wkv")))
