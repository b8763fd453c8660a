"""Scalar helpers shared by the Numba kernels: ggml's conversions and rounding primitives, bit for bit.

Each function here is the scalar form of a NumPy helper in `refimpl/quants/_common.py` (or of an
`ops` primitive) and gives identical bits for every input, inf and NaN included:

    f16_to_f32(lo, hi)    f16_to_f32 / f16_field: little-endian f16 bytes -> f32, signalling NaN quieted
    f16_bits(v)           f16_bits: f32 -> f16 round to nearest even, NaN -> sign | 0x7E00
    fl16(v)               _fl16: f32 -> f16 -> f32 (NumPy's casts, NaN payloads too)
    nearest_int(v)        nearest_int: the 1.5*2^23 trick on the f32 bits
    cvtt_i32(v)           cvtt_i32: x86 cvttss2si (INT_MIN for NaN, inf, out of range)
    c_int8(v), c_uint8(v) c_int8 / c_uint8: a C float -> int8_t / uint8_t cast on x86-64
    add_half_away(v)      add_half_away: v + copysign(0.49999997f, v) in f32
    pairwise_sum_f64(x)   NumPy's pairwise summation of an f32 row in f64 (np.sum(.., dtype=f64))

and the thread pool every kernel splits its work on (`parallel_ranges`).

Integer arithmetic in Numba is int64 (scalars of narrower types are widened), so bit patterns are
masked explicitly; float32 arithmetic stays float32 as long as both operands are float32. No fastmath
anywhere: every f32 operation is one IEEE rounding, in the order written.
"""
from __future__ import annotations

import contextlib
import os
import threading

import numba
import numpy as np
from numba import njit, types
from numba.extending import overload

from .simd import vsum8

F32 = np.float32
JUST_BELOW_HALF = np.nextafter(F32(0.5), F32(0)).view(np.uint32).item()    # 0.49999997f as bits
_TWO_M24 = F32(2.0 ** -24)


@njit(inline="always")
def f32_from_bits(b):
    return np.uint32(b).view(np.float32)


@njit(inline="always")
def f32_bits(v):
    """The bits of an f32 value as int64 (0 .. 2^32-1)."""
    return np.int64(np.float32(v).view(np.uint32))


@njit(inline="always")
def f16_to_f32(lo, hi):
    """ggml's GGML_FP16_TO_FP32 of the little-endian bytes (lo, hi): exact; a signalling NaN comes out
    quiet (bit 22 set), as x86's F16C conversion does."""
    h = np.int64(lo) | (np.int64(hi) << 8)
    s = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        b = s | 0x7F800000 | (m << 13)
        if m != 0:
            b |= 0x00400000
    elif e != 0:
        b = s | ((e + 112) << 23) | (m << 13)
    elif m == 0:
        b = s
    else:
        b = s | f32_bits(np.float32(m) * _TWO_M24)
    return f32_from_bits(b)


@njit(inline="always")
def f16_to_f32_raw(h):
    """IEEE half bits -> f32 as NumPy's float16 -> float32 cast: exact, NaN payloads kept (not quieted)."""
    h = np.int64(h)
    s = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        b = s | 0x7F800000 | (m << 13)
    elif e != 0:
        b = s | ((e + 112) << 23) | (m << 13)
    elif m == 0:
        b = s
    else:
        b = s | f32_bits(np.float32(m) * _TWO_M24)
    return f32_from_bits(b)


@njit(inline="always")
def f16_bits(v):
    """ggml's GGML_FP32_TO_FP16 as an int (0 .. 0xFFFF): round to nearest even, overflow to inf,
    NaN -> sign | 0x7E00."""
    x = f32_bits(v)
    sign = (x >> 16) & 0x8000
    ax = x & 0x7FFFFFFF
    if ax > 0x7F800000:
        return sign | 0x7E00
    if ax >= 0x477FF000:                          # >= 65520: rounds to inf (ties to even go up)
        return sign | 0x7C00
    if ax < 0x38800000:                           # below 2^-14: an f16 subnormal (or 0 / 2^-14)
        t = f32_from_bits(ax) * np.float32(16777216.0) + np.float32(8388608.0)   # exact scale, RNE add
        return sign | (f32_bits(t) - 0x4B000000)
    h = ((((ax >> 23) - 112) << 10) | ((ax >> 13) & 0x3FF))
    rem = ax & 0x1FFF
    if rem > 0x1000 or (rem == 0x1000 and (h & 1) != 0):
        h += 1
    return sign | h


@njit(inline="always")
def fl16(v):
    """NumPy's v.astype(float16).astype(float32): round to f16 (nearest even, overflow to inf) and back;
    a NaN keeps its sign and the top 10 bits of its payload (at least 1), unquieted."""
    x = f32_bits(v)
    if (x & 0x7FFFFFFF) > 0x7F800000:
        m = (x & 0x7FFFFF) >> 13
        return f16_to_f32_raw(((x >> 16) & 0x8000) | 0x7C00 | (m if m != 0 else 1))
    return f16_to_f32_raw(f16_bits(v))


@njit(inline="always")
def nearest_int(v):
    """ggml's nearest_int: (bits(v + 12582912.f) & 0x7FFFFF) - 0x400000, as int64 in -2^22 .. 2^22-1."""
    t = np.float32(v) + np.float32(12582912.0)
    return (f32_bits(t) & 0x007FFFFF) - 0x00400000


@njit(inline="always")
def cvtt_i32(v):
    """x86 cvttss2si: truncate toward zero; NaN, +-inf and |v| >= 2^31 give INT_MIN."""
    if v > np.float32(-2147483648.0) and v < np.float32(2147483648.0):
        return np.int64(v)
    return np.int64(-2147483648)


@njit(inline="always")
def c_int8(v):
    """C `(int8_t)f` on x86-64: cvttss2si, keep the low byte; as int64 in -128 .. 127."""
    return ((cvtt_i32(v) & 0xFF) ^ 0x80) - 0x80


@njit(inline="always")
def c_uint8(v):
    """C `(uint8_t)f` on x86-64; as int64 in 0 .. 255."""
    return cvtt_i32(v) & 0xFF


@njit(inline="always")
def add_half_away(v):
    """v + copysign(0.49999997f, v) in f32: its truncation is roundf(v)."""
    s = (f32_bits(v) & 0x80000000) | JUST_BELOW_HALF
    return np.float32(v) + f32_from_bits(s)


@njit(inline="always")
def recip0(d):
    """`d ? 1.0f/d : 0.0f` in f32 (NaN != 0, so NaN gives NaN)."""
    if d != np.float32(0.0):
        return np.float32(1.0) / d
    return np.float32(0.0)


def _pw_lanes(x, lo, m):
    """NumPy's pairwise_sum block's eight accumulators over x[lo : lo + 8m] (m >= 1), added as it adds them."""


@overload(_pw_lanes, inline="always")
def _pw_lanes_impl(x, lo, m):
    if isinstance(x, types.Array) and x.ndim == 1 and x.layout == "C" and x.dtype in (types.float32, types.float64):
        return lambda x, lo, m: vsum8(x, lo, m)      # one f64 vector of the eight lanes

    def scalar(x, lo, m):                            # strided rows: the same sums, lane by lane
        r0 = np.float64(x[lo])
        r1 = np.float64(x[lo + 1])
        r2 = np.float64(x[lo + 2])
        r3 = np.float64(x[lo + 3])
        r4 = np.float64(x[lo + 4])
        r5 = np.float64(x[lo + 5])
        r6 = np.float64(x[lo + 6])
        r7 = np.float64(x[lo + 7])
        for k in range(1, m):
            i = lo + 8 * k
            r0 += np.float64(x[i])
            r1 += np.float64(x[i + 1])
            r2 += np.float64(x[i + 2])
            r3 += np.float64(x[i + 3])
            r4 += np.float64(x[i + 4])
            r5 += np.float64(x[i + 5])
            r6 += np.float64(x[i + 6])
            r7 += np.float64(x[i + 7])
        return ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    return scalar


@njit(inline="always")
def _pw_block(x, lo, n):
    """NumPy's pairwise_sum for n <= 128 elements of x[lo:] (as f64), 8 accumulators."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += np.float64(x[lo + i])
        return res
    if lo < 0 or lo + n > x.size:
        raise IndexError("pairwise_sum_f64: range outside the row")
    end = n - n % 8
    res = _pw_lanes(x, lo, end // 8)
    for i in range(end, n):
        res += np.float64(x[lo + i])
    return res


@njit
def _pw_stack(x, lo, n):
    """pairwise_sum_f64 for any n: the recursion as an explicit post-order walk (its stack allocated here)."""
    stack_lo = np.empty(64, np.int64)
    stack_n = np.empty(64, np.int64)
    vals = np.empty(64, np.float64)
    done = np.zeros(64, np.int64)
    top = 0
    stack_lo[0] = lo
    stack_n[0] = n
    done[0] = 0
    nv = 0
    while top >= 0:
        m = stack_n[top]
        if m <= 128:
            vals[nv] = _pw_block(x, stack_lo[top], m)
            nv += 1
            top -= 1
            continue
        if done[top] == 0:
            done[top] = 1
            n2 = m // 2
            n2 -= n2 % 8
            l0 = stack_lo[top]
            # push right then left, so that left is evaluated first
            stack_lo[top + 1] = l0 + n2
            stack_n[top + 1] = m - n2
            done[top + 1] = 0
            stack_lo[top + 2] = l0
            stack_n[top + 2] = n2
            done[top + 2] = 0
            top += 2
        else:
            # both children evaluated: left is vals[nv-2], right vals[nv-1]
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
            top -= 1
    return vals[0]


def _pw_level(deeper):
    @njit
    def level(x, lo, n):
        if n <= 128:
            return _pw_block(x, lo, n)
        n2 = n // 2
        n2 -= n2 % 8
        return deeper(x, lo, n2) + deeper(x, lo + n2, n - n2)
    return level


# NumPy's recursion (halves at multiples of 8) written out five levels deep: rows up to ~4,000 elements
# (every norm and softmax row of the models) sum without allocating; longer ones walk `_pw_stack`.
_pw_rec = _pw_stack
for _ in range(5):
    _pw_rec = _pw_level(_pw_rec)


@njit
def pairwise_sum_f64(x, lo, n):
    """Σ x[lo:lo+n] in f64 by NumPy's pairwise summation (blocks of <= 128 with 8 accumulators, halved
    at multiples of 8 above that) -- the order `np.sum(row, dtype=np.float64)` uses on one buffer. A block's
    eight accumulators are one f64 vector (`simd.vsum8`) where the row is contiguous.

    NumPy's reductions over many rows may split a row between iterator buffers, and then differ from
    this in the last bits of the f64 sum (rarely visible after the rounding to f32 that follows)."""
    return _pw_rec(x, lo, n)


# -- threads ------------------------------------------------------------------------------------------------

_POOL = None
_POOL_PID = 0            # the process that started _POOL: a forked child starts its own (its threads are gone)
_POOL_SIZE = 0           # its max_workers
_PREFIX = "refimpl-kernels"


_TLS = threading.local()


def n_threads() -> int:
    """Threads the kernels use: Numba's setting (NUMBA_NUM_THREADS, `numba.set_num_threads`), as
    `numba.get_num_threads()` returns it -- or, inside `threads_fixed()` on this thread, the count read when
    that began (the public getter takes ~1 us, and a decode step asks hundreds of times)."""
    n = getattr(_TLS, "n", 0)
    if n:
        return n
    return max(1, numba.get_num_threads())


@contextlib.contextmanager
def threads_fixed():
    """n_threads() on this thread is the count read at entry until the block ends (the numba backend's
    forward scope: one model pass, during which nothing changes Numba's setting)."""
    prev = getattr(_TLS, "n", 0)
    _TLS.n = 0
    _TLS.n = n_threads()
    try:
        yield
    finally:
        _TLS.n = prev


_OMP_PID = os.getpid()   # the process that imported the kernels: where Numba's OpenMP threads may be started


def prange_ok() -> bool:
    """Whether this thread may enter a prange driver: not in a forked child (GNU OpenMP's threads do not survive
    a fork: a child that used a region its parent had started would hang) and not on one of refimpl's pool
    threads (their caller may hold the OpenMP team already)."""
    return os.getpid() == _OMP_PID and not threading.current_thread().name.startswith(_PREFIX)


def parallel_ranges(work, n: int, min_items: int) -> None:
    """Call work(lo, hi) over [0, n) split into at most n_threads() ranges of >= min_items items, on a
    thread pool (the kernels are `nogil`), the first range on the calling thread.

    Kernels split their rows or blocks here rather than in a `prange`: Numba's parallel compilation
    optimises a function's whole body once more (tens of seconds for the block formats, per caller),
    for no gain on work items this coarse, and one pool serves every kernel."""
    global _POOL, _POOL_PID, _POOL_SIZE
    k = min(n_threads(), max(1, n // max(1, min_items)))
    if k > 1 and threading.current_thread().name.startswith(_PREFIX):
        k = 1                            # already on a pool thread: waiting on the pool could deadlock
    if k <= 1:
        if n:
            work(0, n)
        return
    if _POOL is None or _POOL_SIZE < k - 1 or _POOL_PID != os.getpid():
        from concurrent.futures import ThreadPoolExecutor
        size = max(k - 1, n_threads() - 1)
        _POOL = ThreadPoolExecutor(max_workers=size, thread_name_prefix=_PREFIX)
        _POOL_PID, _POOL_SIZE = os.getpid(), size
    bounds = [n * t // k for t in range(k + 1)]
    futs = [_POOL.submit(work, bounds[t], bounds[t + 1]) for t in range(1, k)]
    work(bounds[0], bounds[1])
    for f in futs:
        f.result()


# -- one small Numba function per type, from a template --------------------------------------------------------

def per_type(namespace: dict, template: str, names, **fields) -> dict:
    """Define `template` in `namespace` (a kernel module's globals()) once per type name of `names`, its
    `{t}` the name and each other `{field}` fields[field](name); returns {name: the function}.

    Why source text: each function must call one type's kernel as a compile-time constant, so that Numba
    inlines it, and must load from Numba's cache. Numba caches neither a function that closes over another
    compiled function nor one that takes it as an argument (in a new process both miss the cache, every
    time: measured with numba 0.68). A function compiled from text under the module's own file name is an
    ordinary module function to Numba's cache: found by that file and invalidated when it changes. The text
    is placed at the template's own lines, so tracebacks and Numba's errors point at the template."""
    path = namespace["__file__"]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    at = text.find(template)
    pad = "\n" * text[:at].count("\n") if at >= 0 else ""
    made = {}
    for t in names:
        if not (isinstance(t, str) and t.isidentifier()):
            raise ValueError(f"per_type: type name {t!r} is not an identifier")
        code = template.format(t=t, **{k: fn(t) for k, fn in fields.items()})
        name = code.split("def ", 1)[1].split("(", 1)[0]
        exec(compile(pad + code, path, "exec"), namespace)       # noqa: S102 -- the module's own template
        made[t] = namespace[name]
    return made

