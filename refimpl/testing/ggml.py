"""Real ggml as the test oracle, through the `ggml-python` bindings (optional dependency).

Everything here calls the pinned ggml (ggml-python 0.0.45 = ggml 0.15.3, built portably with AVX2/FMA/F16C
and without AVX-512, see `PROFILE`) on NumPy inputs and returns NumPy outputs. refimpl's tests compare
against these functions; users can do the same for their own kernels.

    dequantize(qt)                  ggml's `dequantize_row_*` / type traits `to_float`
    quantize(x, type, method)       "chunk": `ggml_quantize_chunk` (no imatrix), "ref": `quantize_row_*_ref`,
                                    "cpu": the CPU backend's `quantize_row_*` (type traits `from_float`)
    type_size(t), blck_size(t)      `ggml_type_size`, `ggml_blck_size`

Calls that ggml would answer with an abort (a type without that quantizer, a type that needs an
importance matrix) raise ValueError here instead of reaching ggml.
"""
from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

from ..qtensor import QTensor
from ..types import GGMLType, as_type, traits

# The build every golden value in this repository was produced with.
PROFILE = ("ggml-python==0.0.45 (ggml 0.15.3), CMAKE_ARGS=-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON "
           "-DGGML_FMA=ON -DGGML_F16C=ON (x86-64 AVX2 portable profile, no AVX-512)")


def available() -> bool:
    try:
        _libs()
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _libs():
    try:
        import ggml  # noqa: F401  (ggml-python; loads libggml-base/-cpu)
    except ImportError as e:
        raise ImportError("refimpl.testing.ggml needs ggml-python==0.0.45 (pip install 'refimpl[test]')") from e
    libdir = os.path.join(os.path.dirname(ggml.__file__), "lib")
    base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
    cpu = ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"))
    return ggml, base, cpu


def build_features() -> dict[str, int]:
    """The SIMD features the loaded ggml was compiled with (`ggml_cpu_has_*`)."""
    g, _, _ = _libs()
    names = ("avx", "avx2", "fma", "f16c", "avx512", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "llamafile")
    return {n: int(getattr(g, f"ggml_cpu_has_{n}")()) for n in names}


def check_profile() -> None:
    """Raise unless the loaded ggml is the portable AVX2 build the goldens assume (see PROFILE)."""
    f = build_features()
    want = {"avx": 1, "avx2": 1, "fma": 1, "f16c": 1, "avx512": 0, "avx512_vnni": 0, "avx512_bf16": 0,
            "avx_vnni": 0, "amx_int8": 0}
    bad = {k: f[k] for k in want if f[k] != want[k]}
    if bad:
        raise RuntimeError(f"the installed ggml-python is not the portable AVX2 build refimpl's goldens assume "
                           f"(differs in {bad}); reinstall it with scripts/setup.sh. Expected: {PROFILE}")


def _fn(lib, name, argtypes, restype=None):
    f = getattr(lib, name)
    f.argtypes, f.restype = argtypes, restype
    return f


_P = ctypes.c_void_p
_row_fn = ([_P, _P, ctypes.c_int64], None)


def type_size(t) -> int:
    g, _, _ = _libs()
    return int(g.ggml_type_size(int(as_type(t))))


def blck_size(t) -> int:
    g, _, _ = _libs()
    return int(g.ggml_blck_size(int(as_type(t))))


def type_name(t) -> str:
    g, _, _ = _libs()
    return g.ggml_type_name(int(as_type(t))).decode()


def requires_imatrix(t) -> bool:
    g, _, _ = _libs()
    return bool(g.ggml_quantize_requires_imatrix(int(as_type(t))))


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(_P)


def dequantize(qt: QTensor) -> np.ndarray:
    """ggml's own float values of a QTensor's bytes (f32, same logical shape)."""
    g, base, _ = _libs()
    tr = traits(qt.type)
    raw = np.ascontiguousarray(qt.data).reshape(-1)
    out = np.empty(qt.size, np.float32)
    if qt.size == 0:
        return out.reshape(qt.shape)
    name = f"dequantize_row_{tr.name}"
    if hasattr(base, name):
        _fn(base, name, *_row_fn)(_ptr(raw), _ptr(out), qt.size)
    else:
        to_float = g.ggml_get_type_traits(int(qt.type)).contents.to_float
        if not to_float:
            raise ValueError(f"ggml has no dequantizer for {tr.name}")
        to_float(_ptr(raw), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), qt.size)
    return out.reshape(qt.shape)


def quantize(x, type, method: str = "chunk") -> QTensor:
    """Quantize with ggml itself: x numpy (..., n) f32 -> QTensor (dst buffer zero-filled first)."""
    g, base, cpu = _libs()
    t = as_type(type)
    tr = traits(t)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.shape[-1]
    if n % tr.blck_size:
        raise ValueError(f"{tr.name}: row length {n} is not a multiple of {tr.blck_size}")
    rows = x.size // n if n else 0
    rb = n // tr.blck_size * tr.type_size
    dst = np.zeros(rows * rb, np.uint8)
    if rows:
        if method == "chunk":
            if not hasattr(base, f"quantize_{tr.name}") and t not in (GGMLType.F16, GGMLType.BF16, GGMLType.F32):
                raise ValueError(f"ggml_quantize_chunk does not handle {tr.name}")
            if requires_imatrix(t):
                raise ValueError(f"ggml_quantize_chunk needs an importance matrix for {tr.name}")
            f = _fn(base, "ggml_quantize_chunk",
                    [ctypes.c_int, _P, _P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _P], ctypes.c_size_t)
            f(int(t), _ptr(x), _ptr(dst), 0, rows, n, None)
        elif method == "ref":
            name = f"quantize_row_{tr.name}_ref"
            if hasattr(base, name):
                _fn(base, name, *_row_fn)(_ptr(x), _ptr(dst), x.size)
            else:
                ref = g.ggml_get_type_traits(int(t)).contents.from_float_ref
                if not ref:
                    raise ValueError(f"ggml has no reference quantizer for {tr.name}")
                ref(x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), _ptr(dst), x.size)
        elif method == "cpu":
            name = f"quantize_row_{tr.name}"
            if not hasattr(cpu, name):
                raise ValueError(f"the ggml CPU backend has no from_float for {tr.name}")
            _fn(cpu, name, *_row_fn)(_ptr(x), _ptr(dst), x.size)
        else:
            raise ValueError(f"unknown method {method!r}")
    return QTensor(t, dst.reshape(x.shape[:-1] + (rb,)), x.shape)


# -- running ops: build a graph in real ggml from NumPy inputs -----------------------------------------

_NP_TO_GGML = {np.dtype(np.float32): GGMLType.F32, np.dtype(np.float16): GGMLType.F16,
               np.dtype(np.float64): GGMLType.F64, np.dtype(np.int8): GGMLType.I8,
               np.dtype(np.int16): GGMLType.I16, np.dtype(np.int32): GGMLType.I32,
               np.dtype(np.int64): GGMLType.I64}
_GGML_TO_NP = {v: k for k, v in _NP_TO_GGML.items()}


def lib():
    """The ggml-python module (all `ggml_*` graph builders, enums and constants)."""
    return _libs()[0]


RECORDED = "ggml_outputs"       # refimpl.fetch.golden(RECORDED): outputs recorded for live_or_recorded
RECORD_ENV = "REFIMPL_RECORD_GGML"


def live_or_recorded(name: str, compute, *inputs):
    """ggml's output called `name`, computed from `inputs` (arrays or QTensors): compute() with live ggml when
    ggml-python is installed; otherwise the output ggml computed from the same inputs when refimpl was
    released (refimpl.fetch.golden("ggml_outputs"), written by scripts/gen_ggml_outputs.py), after a printed
    note that says so. What was recorded from other inputs is refused (ValueError), never shown in their place.
    With $REFIMPL_RECORD_GGML set to a .npz path, every live output is also added to that file."""
    from ..fetch import golden
    digest = _digest(inputs)
    if available():
        out = compute()
        if os.environ.get(RECORD_ENV):
            _record(os.environ[RECORD_ENV], name, digest, out)
        return out
    with np.load(golden(RECORDED), allow_pickle=False) as z:
        if name not in z.files:
            known = ", ".join(sorted(f for f in z.files if not f.endswith(".inputs")))
            raise KeyError(f"no recorded ggml output {name!r} (recorded: {known}); install ggml-python to compute it")
        if str(z[name + ".inputs"]) != digest:
            raise ValueError(f"the recorded ggml output {name!r} was computed from other inputs than these; "
                             "install ggml-python to compute it")
        out = z[name]
    print(f"[ggml-python is not installed: {name} is what {PROFILE.split(' (')[0]}'s ggml computed from these "
          f"inputs, recorded with refimpl, not computed now]")
    return out


def _digest(inputs) -> str:
    """A digest of arrays' types, shapes and bytes (a QTensor's ggml type and raw blocks; None, an absent input,
    as such)."""
    import hashlib
    h = hashlib.sha256()
    for a in inputs:
        if a is None:
            h.update(b"None")
            continue
        if isinstance(a, QTensor):
            h.update(f"{traits(a.type).name}{a.shape}".encode())
            a = a.data
        a = np.ascontiguousarray(a)
        if a.dtype.hasobject:
            raise TypeError(f"live_or_recorded: inputs are arrays, QTensors or None, not {a.dtype} arrays")
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _record(path: str, name: str, digest: str, out) -> None:
    """Add (or replace) `name` and its inputs' digest in the .npz at `path`."""
    arrays = {}
    if os.path.exists(path):
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    arrays[name], arrays[name + ".inputs"] = np.asarray(out), np.array(digest)
    np.savez_compressed(path, **arrays)


def _span(shape, strides, itemsize):
    """(lowest byte offset, bytes covered) of a strided view with non-negative strides."""
    if any(s < 0 for s in strides):
        raise ValueError("ggml views cannot have negative strides; pass np.ascontiguousarray(x)")
    if any(n == 0 for n in shape):
        return 0, 0
    return 0, sum((n - 1) * s for n, s in zip(shape, strides)) + itemsize


class _Ctx:
    def __init__(self, mem: int):
        g = lib()
        self.g = g
        self.ctx = g.ggml_init(g.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False))
        if not self.ctx:
            raise MemoryError(f"ggml_init failed for {mem} bytes")

    def tensor(self, x):
        """A ggml tensor holding x's values and reproducing its view (strides) -- see `run`."""
        g = self.g
        if isinstance(x, QTensor):
            t, data, shape = x.type, x.data, x.shape
            tr = traits(t)
            nb0 = tr.type_size                               # ggml addresses block rows by blocks
            lead = data.strides[:-1]
            last = data.shape[-1]                            # bytes of one row
        else:
            x = np.asarray(x)
            if x.dtype not in _NP_TO_GGML:
                raise TypeError(f"no ggml type for numpy dtype {x.dtype}")
            t = _NP_TO_GGML[x.dtype]
            tr = traits(t)
            data = x.reshape(1) if x.ndim == 0 else x
            shape = data.shape
            nb0 = data.strides[-1] if shape[-1] > 1 else tr.type_size
            lead = data.strides[:-1]
            last = tr.type_size
        if len(shape) > 4:
            raise ValueError(f"ggml tensors have at most 4 dims, got numpy shape {shape}")
        ne = list(shape[::-1]) + [1] * (4 - len(shape))
        contig = _contig_nb(ne, tr)
        nb = [int(nb0)] + [int(v) for v in lead[::-1]] + contig[len(shape):]
        nb = [contig[i] if ne[i] == 1 else nb[i] for i in range(4)]   # size-1 dims: any stride, use ggml's
        if any(v < 0 for v in nb):
            raise ValueError(f"ggml views cannot have negative strides (numpy strides {data.strides}); "
                             f"pass np.ascontiguousarray(x)")
        if not all(ne):
            raise ValueError(f"empty tensor (ne {ne}) cannot be passed to ggml")
        n0 = ne[0] // tr.blck_size                           # blocks (or elements) along dim 0
        span = (n0 - 1) * nb[0] + sum((ne[i] - 1) * nb[i] for i in range(1, 4)) + tr.type_size
        if isinstance(x, QTensor):
            span = sum((ne[i] - 1) * nb[i] for i in range(1, 4)) + last
        units = -(-span // tr.type_size)
        base = g.ggml_new_tensor_1d(self.ctx, int(t), units * tr.blck_size)
        ctypes.memmove(g.ggml_get_data(base), data.ctypes.data, span)
        if nb == contig:
            if units * tr.blck_size == int(np.prod(ne)):
                return g.ggml_reshape_4d(self.ctx, base, *ne)
            return g.ggml_view_4d(self.ctx, base, *ne, nb[1], nb[2], nb[3], 0)
        # a view with ascending strides, then ggml_permute back to the logical dim order
        order = sorted(range(4), key=lambda i: (nb[i], i))
        if nb[order[0]] != tr.type_size:
            raise ValueError(f"ggml cannot represent strides nb {nb} for ne {ne}: one dim must be packed "
                             f"(stride {tr.type_size})")
        if order[0] != 0 and tr.blck_size > 1:
            raise ValueError("a block-quantized tensor cannot be viewed transposed")
        vne = [ne[i] for i in order]
        vnb = [nb[i] for i in order]
        v = g.ggml_view_4d(self.ctx, base, *vne, vnb[1], vnb[2], vnb[3], 0)
        if order == [0, 1, 2, 3]:
            return v
        # view dim j holds logical dim order[j]; ggml_permute sends view dim j to result dim order[j]
        return g.ggml_permute(self.ctx, v, *order)

    def free(self):
        self.g.ggml_free(self.ctx)


def _contig_nb(ne, tr):
    nb = [tr.type_size, tr.type_size * (ne[0] // tr.blck_size)]
    nb.append(nb[1] * ne[1])
    nb.append(nb[2] * ne[2])
    return nb


def read(t) -> np.ndarray | QTensor:
    """Copy a computed ggml tensor out as a NumPy-order ndarray (or QTensor for block types), with
    ggml_n_dims(t) dimensions (trailing ne of 1 dropped: ne [4, 3, 1, 1] -> numpy (3, 4))."""
    g = lib()
    c = t.contents
    typ = GGMLType(c.type)
    tr = traits(typ)
    ne = [int(c.ne[i]) for i in range(4)]
    nb = [int(c.nb[i]) for i in range(4)]
    n_dims = max([i + 1 for i in range(4) if ne[i] > 1] + [1])   # ggml_n_dims
    shape = tuple(ne[:n_dims][::-1])
    nb_used = nb[:n_dims]
    ptr = g.ggml_get_data(t)
    if typ in _GGML_TO_NP:
        dt = _GGML_TO_NP[typ]
        span = sum((n - 1) * s for n, s in zip(ne, nb)) + dt.itemsize if all(ne) else 0
        buf = np.ctypeslib.as_array((ctypes.c_uint8 * max(span, 1)).from_address(ptr))
        arr = np.lib.stride_tricks.as_strided(buf[: span - span % dt.itemsize].view(dt), shape,
                                              tuple(nb_used[::-1]))
        return np.array(arr, copy=True)
    rb = ne[0] // tr.blck_size * tr.type_size
    span = sum((n - 1) * s for n, s in zip(ne[1:], nb[1:])) + rb
    buf = np.ctypeslib.as_array((ctypes.c_uint8 * span).from_address(ptr))
    data = np.lib.stride_tricks.as_strided(buf, shape[:-1] + (rb,), tuple(nb_used[1:][::-1]) + (1,))
    return QTensor(typ, np.array(data, copy=True), shape)


class GGMLAbort(RuntimeError):
    """ggml rejected the graph (GGML_ASSERT / abort) -- raised instead of killing the interpreter."""


def run(build, *inputs, n_threads: int = 1, mem: int | None = None, isolate: bool = True):
    """Run one ggml graph on NumPy inputs; see `_run`. With `isolate` (default) the graph runs in a forked
    child process, so a GGML_ASSERT in ggml becomes a `GGMLAbort` carrying ggml's message instead of
    aborting the interpreter (and with it a whole test session)."""
    if not isolate or not hasattr(os, "fork"):
        return _run(build, *inputs, n_threads=n_threads, mem=mem)
    import pickle
    import sys
    _libs()
    r, w = os.pipe()
    er, ew = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:                                    # child: compute, send the pickled result, exit
        try:
            os.close(r)
            os.close(er)
            os.dup2(ew, 2)
            os.environ["GGML_NO_BACKTRACE"] = "1"
            try:
                payload = pickle.dumps(("ok", _run(build, *inputs, n_threads=n_threads, mem=mem)))
            except BaseException as e:              # noqa: BLE001 -- a Python-side error: re-raised in the parent
                payload = pickle.dumps(("err", e if _picklable(e) else RuntimeError(repr(e))))
            with os.fdopen(w, "wb") as f:
                f.write(payload)
        finally:
            os._exit(0)
    os.close(w)
    os.close(ew)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    with os.fdopen(er, "rb") as f:
        err = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if not data:
        msg = " ".join(line.strip() for line in err.splitlines() if line.strip())[-2000:]
        raise GGMLAbort(f"ggml aborted (exit status {status}): {msg or 'no message'}")
    kind, value = pickle.loads(data)
    if kind == "err":
        raise value
    return value


def _picklable(e) -> bool:
    import pickle
    try:
        pickle.dumps(e)
        return True
    except Exception:  # noqa: BLE001 -- whatever pickling raises means: not picklable
        return False


def _run(build, *inputs, n_threads: int = 1, mem: int | None = None):
    """Run one ggml graph on NumPy inputs and return the result(s) as NumPy arrays / QTensors.

    build(ctx, *tensors) -> ggml tensor (or a tuple of them): calls ggml-python's graph builders, e.g.
        run(lambda ctx, a, b: lib().ggml_add(ctx, a, b), a, b)
    Each ndarray/QTensor input becomes a ggml tensor with the same values *and the same view*: a strided
    or permuted NumPy view becomes a ggml view (ggml_view_4d + ggml_permute) over a copy of the memory it
    spans, so ops see non-contiguous sources exactly as they would in ggml. Other inputs (ints, floats,
    None) are passed to `build` unchanged. Computed single-threaded by default (n_threads).
    """
    g = lib()
    size = 0
    for x in inputs:
        if isinstance(x, QTensor):
            size += x.data.nbytes
        elif isinstance(x, np.ndarray):
            size += x.nbytes
    mem = mem or (64 << 20) + 8 * size
    c = _Ctx(mem)
    try:
        ts = [c.tensor(x) if isinstance(x, (np.ndarray, QTensor)) else x for x in inputs]
        out = build(c.ctx, *ts)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        gf = g.ggml_new_graph(c.ctx)
        for o in outs:
            g.ggml_build_forward_expand(gf, o)
        rc = g.ggml_graph_compute_with_ctx(c.ctx, gf, n_threads)
        if rc != 0:
            raise RuntimeError(f"ggml_graph_compute failed with status {rc}")
        res = [read(o) for o in outs]
    finally:
        c.free()
    return res if isinstance(out, (tuple, list)) else res[0]
