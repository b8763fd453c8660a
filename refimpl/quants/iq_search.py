"""ggml's grid-search quantizers without an importance matrix: IQ3_XXS, IQ3_S, IQ2_S, IQ1_M.

These formats store each group of 4 or 8 values as an index into a codebook (a "grid": a subset of a
small integer lattice). ggml quantizes them (`quantize_row_iq3_xxs_impl` & co. in `src/ggml-quants.c`)
by trying a range of scales per group; for each scale every group of 4/8 is rounded to the lattice and,
when that lattice point is not in the codebook, replaced by the best of its nearest codebook points.
The "nearest codebook points" of every lattice point off the grid are precomputed once per type
(`iq2xs_init_impl` / `iq3xs_init_impl`): all grid points whose squared distance is one of the `nwant`
smallest distances, ordered by (distance, grid index). Here they are rebuilt in NumPy from the codebooks
of `iq_tables.TABLES` (the live ggml's own tables) on first use.

Everything runs vectorised across all groups of a batch of blocks; Python loops only over the search
steps (the trial scales, the candidate splits of IQ1_M) and over elements where ggml accumulates a f32
sum sequentially. Each f32 operation is the one ggml performs, in ggml's order; ties are broken as
ggml's strict '<' / '>' scans break them (the first candidate wins). IQ1_M sorts each group of 16 with
glibc's `qsort`, which for such small arrays is glibc's (stable) merge sort: the stable argsort here.

Reproduced quirks of the pinned ggml (0.15.3):
  * IQ3_S: a group whose values are all zero does not advance the output pointers of `qs` and `signs`,
    so the following groups of that block are written 8 (4) bytes earlier; the tail stays zero.
  * IQ3_S / IQ2_S / IQ1_M keep a block's indices and signs when every group scale is zero (only the
    super-block scale stays zero); IQ3_XXS clears them.
  * `nearest_int` is ggml's magic-number rounding (round half to even in range, wrapping outside).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..types import GGMLType
from .registry import quantizer
from ._common import f16_bytes
from .iq_tables import TABLES

f32 = np.float32
_FLT_MAX = f32(np.finfo(np.float32).max)
_BATCH = 1024          # blocks per vectorised batch (bounds the memory of the candidate arrays)


def _nearest_int(v) -> np.ndarray:
    """ggml's `nearest_int`: add 1.5*2^23 in f32 and keep the low mantissa bits (int32)."""
    val = np.asarray(v, f32) + f32(12582912.0)
    return (val.view(np.int32) & 0x007FFFFF) - 0x00400000


def _seq(terms: np.ndarray) -> np.ndarray:
    """Σ terms[..., i] in f32 as `float s = 0; for (i) s += t[i];` (sequential, starting from +0)."""
    t = np.asarray(terms, f32)
    z = np.zeros(t.shape[:-1] + (1,), f32)
    return np.add.accumulate(np.concatenate([z, t], axis=-1), axis=-1, dtype=f32)[..., -1]


def _cmax(a, b):
    """ggml's MAX(a, b) = a > b ? a : b."""
    return np.where(a > b, a, b)


# ----------------------------------------------------------------------------------------------------
# the lattices: grid levels, the map lattice point -> grid index, the neighbour lists


@dataclass(frozen=True)
class _Lattice:
    levels: np.ndarray   # (n, d) int32: lattice coordinates l (the C grid stores 2l+1) of every grid point
    bits: int            # bits per coordinate in a lattice index u = Σ l_i << bits*i
    kmap: np.ndarray     # (size,) int32: grid index of lattice point u, or -1
    nbr: np.ndarray      # (total,) int32: the neighbour lists of all off-grid u, concatenated
    start: np.ndarray    # (size,) int64: where the list of u starts in nbr
    ncount: np.ndarray   # (size,) int64: its length (0 for the points on the grid)

    def code(self, l: np.ndarray) -> np.ndarray:
        """Lattice index of levels l (..., d) -> (...)."""
        sh = self.bits * np.arange(l.shape[-1])
        return np.bitwise_or.reduce(l.astype(np.int32) << sh, axis=-1)


_SPECS = {  # table: (number of levels, bits per coordinate, map size, nwant)
    "iq3xxs": (8, 3, 4096, 2),
    "iq3s": (8, 3, 4096, 3),
    "iq2s": (3, 2, 43692, 1),
    "iq1s": (3, 2, 43692, 3),
}


@functools.lru_cache(maxsize=None)
def _lattice(name: str) -> _Lattice:
    """The grid of codebook `name` with ggml's map and neighbour lists (iq2xs_init_impl / iq3xs_init_impl):
    the neighbours of an off-grid lattice point are the grid points at one of its `nwant` smallest
    distinct squared distances, ordered by (distance, grid index)."""
    nlev, bits, size, nwant = _SPECS[name]
    tab = np.asarray(TABLES[name])
    vals, inv = np.unique(tab, return_inverse=True)
    if len(vals) != nlev:
        raise ValueError(f"codebook {name} has {len(vals)} distinct values, expected {nlev}")
    levels = inv.reshape(tab.shape).astype(np.int32)        # rank of the value = lattice level
    n, d = levels.shape
    sh = bits * np.arange(d)
    kmap = np.full(size, -1, np.int32)
    kmap[np.bitwise_or.reduce(levels << sh, axis=-1)] = np.arange(n, dtype=np.int32)
    # squared distances (in units of l; ggml's are 4x, same order) via two half-index tables
    h = d // 2
    span = 1 << (bits * h)
    sub = (np.arange(span)[:, None] >> (bits * np.arange(h))) & ((1 << bits) - 1)      # (span, h)
    dlo = ((sub[:, None, :] - levels[None, :, :h]) ** 2).sum(-1).astype(np.uint8)      # (span, n)
    dhi = ((sub[:, None, :] - levels[None, :, h:]) ** 2).sum(-1).astype(np.uint8)
    off = np.nonzero(kmap < 0)[0]
    rows, cols, dists = [], [], []
    for s in range(0, len(off), 4096):
        uu = off[s:s + 4096]
        dist = dlo[uu & (span - 1)] + dhi[uu >> (bits * h)]                            # (c, n) uint8
        thr = dist.min(axis=1)
        for _ in range(nwant - 1):      # the next larger distinct distance, if there is one
            nxt = np.where(dist > thr[:, None], dist, np.uint8(255)).min(axis=1)
            thr = np.where(nxt < 255, nxt, thr)
        r, j = np.nonzero(dist <= thr[:, None])           # row-major: j ascending within a row
        rows.append(uu[r])
        cols.append(j)
        dists.append(dist[r, j])
    rows, cols, dists = np.concatenate(rows), np.concatenate(cols), np.concatenate(dists)
    o = np.lexsort((cols, dists, rows))
    nbr = cols[o].astype(np.int32)
    ncount = np.bincount(rows, minlength=size).astype(np.int64)
    start = np.concatenate([[0], np.cumsum(ncount)[:-1]]).astype(np.int64)
    for a in (levels, kmap, nbr, start, ncount):
        a.setflags(write=False)
    return _Lattice(levels, bits, kmap, nbr, start, ncount)


def _best_neighbour(lat: _Lattice, u, xval, w, scale, qtab, variant=None) -> np.ndarray:
    """ggml's iq*_find_best_neighbour, vectorised: for each off-grid lattice point u (m,), the neighbour
    minimising Σ w (scale q - x)² (sequential f32 sum; the first minimum below FLT_MAX wins).

    xval, w: (m, d) f32; scale: (m,); qtab: (V, n, d) f32, the values q of the grid points; variant (m,)
    selects V (default 0). All candidates of all queries are evaluated at once, flat.
    """
    m = len(u)
    if m == 0:
        return np.zeros(0, np.int32)
    cnt = lat.ncount[u]
    first = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    seg = np.repeat(np.arange(m), cnt)
    T = len(seg)
    cand = lat.nbr[np.repeat(lat.start[u] - first, cnt) + np.arange(T)]
    qT = np.ascontiguousarray(np.moveaxis(qtab, -1, 1))                     # (V, d, n)
    q = qT[0][:, cand] if variant is None else qT[variant[seg], :, cand].T  # (d, T)
    x = np.ascontiguousarray(xval.T)[:, seg]
    ww = np.ascontiguousarray(w.T)[:, seg]
    sc = scale[seg]
    d2 = np.zeros(T, f32)
    diff = np.empty(T, f32)
    t = np.empty(T, f32)
    for i in range(x.shape[0]):
        np.multiply(sc, q[i], out=diff)
        np.subtract(diff, x[i], out=diff)
        np.multiply(ww[i], diff, out=t)
        np.multiply(t, diff, out=t)
        np.add(d2, t, out=d2)
    d2[~(d2 < _FLT_MAX)] = np.inf
    dmin = np.minimum.reduceat(d2, first)
    if not (dmin < np.inf).all():
        raise ValueError("ggml's neighbour search finds no grid point here (it would abort)")
    at = np.minimum.reduceat(np.where(d2 == dmin[seg], np.arange(T), T), first)
    return cand[at]


# ----------------------------------------------------------------------------------------------------
# IQ3_XXS, IQ3_S, IQ2_S: the scale search over groups of 32 / 32 / 16


@dataclass(frozen=True)
class _Search:
    table: str
    gsize: int          # elements per group (one scale)
    sub: int            # elements per grid point
    kmaxq: int          # lattice levels 0..kmaxq-1
    steps: range        # the trial scales `is`
    step: float         # id = (2 kmaxq - 1 + is*step) / max
    on_grid_init: bool  # ggml's initial is_on_grid[]
    refine_all: bool    # the final pass re-rounds every grid point (IQ3_S) or only the off-grid ones


_IQ3XXS = _Search("iq3xxs", 32, 4, 8, range(-15, 16), 0.2, True, False)
_IQ3S = _Search("iq3s", 32, 4, 8, range(-9, 10), 0.2, False, True)
_IQ2S = _Search("iq2s", 16, 8, 3, range(-9, 10), 0.1, True, False)


def _snap(sp: _Search, lat: _Lattice, qtab, id_, scale, xval, waux, mask):
    """Round xval·id to the lattice, and replace off-grid points (where `mask`, (G,) or (G, nsub)) by
    their best neighbour at `scale`. Returns levels (G, gsize) and on-grid flags (G, nsub)."""
    G = xval.shape[0]
    ns = sp.gsize // sp.sub
    l = np.clip(_nearest_int(f32(0.5) * (id_[:, None] * xval - f32(1))), 0, sp.kmaxq - 1)
    l = l.reshape(G, ns, sp.sub)
    u = lat.code(l)                                        # (G, ns)
    gi = lat.kmap[u]
    on = gi >= 0
    need = ~on & (mask[:, None] if mask.ndim == 1 else mask)
    if need.any():
        g, k = np.nonzero(need)
        xs = xval.reshape(G, ns, sp.sub)[g, k]
        ws = waux.reshape(G, ns, sp.sub)[g, k]
        best = _best_neighbour(lat, u[g, k], xs, ws, scale[g], qtab)
        l[g, k] = lat.levels[best]
    return l.reshape(G, sp.gsize), on


def _search(sp: _Search, x: np.ndarray, weight: np.ndarray, xval: np.ndarray, active: np.ndarray):
    """The scale search of quantize_row_iq3_xxs_impl / iq3_s_impl / iq2_s_impl for G groups.

    x, weight, xval: (G, gsize) f32; active: (G,) groups that are searched (the others are skipped).
    Returns (scale (G,) f32, levels (G, gsize), flip (G,) bool: scale came out negative and was negated).
    """
    lat = _lattice(sp.table)
    qtab = (2 * lat.levels + 1).astype(f32)[None]          # ggml's grid coordinates 2l+1
    G = x.shape[0]
    ns = sp.gsize // sp.sub
    waux = np.sqrt(weight)
    mx = np.max(xval, axis=1)
    with np.errstate(all="ignore"):
        scale = mx / f32(2 * sp.kmaxq - 1)
        best = np.zeros(G, f32)
        L = np.zeros((G, sp.gsize), np.int32)
        on_grid = np.full((G, ns), sp.on_grid_init)
        wx = weight * xval
        for is_ in sp.steps:
            id_ = (f32(2 * sp.kmaxq - 1) + f32(is_) * f32(sp.step)) / mx
            this_scale = f32(1) / id_
            laux, on = _snap(sp, lat, qtab, id_, this_scale, xval, waux, active)
            q = (2 * laux + 1).astype(f32)
            sumqx = _seq(wx * q)
            sumq2 = _seq((weight * q) * q)
            acc = active & (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
            scale = np.where(acc, sumqx / sumq2, scale)
            best = np.where(acc, scale * sumqx, best)
            L = np.where(acc[:, None], laux, L)
            on_grid = np.where(acc[:, None], on, on_grid)
        refine = active & ~on_grid.all(axis=1) & (scale > 0)
        if refine.any():
            idx = np.nonzero(refine)[0]
            sid = f32(1) / scale[idx]
            redo = np.ones((len(idx), ns), bool) if sp.refine_all else ~on_grid[idx]
            lr, _ = _snap(sp, lat, qtab, sid, scale[idx], xval[idx], waux[idx], redo)
            # IQ3_XXS / IQ2_S re-round only the groups of 4/8 that were off the grid, IQ3_S all of them
            lr = np.where(np.repeat(redo, sp.sub, axis=1), lr, L[idx])
            L[idx] = lr
            q = (2 * lr + 1).astype(f32)
            sumqx = _seq(wx[idx] * q)
            sumq2 = _seq((weight[idx] * q) * q)
            scale[idx] = np.where(sumq2 > 0, sumqx / sumq2, scale[idx])
    flip = active & (scale < 0)
    scale = np.where(flip, -scale, scale)
    return scale, L, flip


def _grid_index(lat: _Lattice, L: np.ndarray, sub: int, active: np.ndarray) -> np.ndarray:
    G = L.shape[0]
    gi = lat.kmap[lat.code(L.reshape(G, -1, sub))]
    if (gi[active] < 0).any():
        raise ValueError("a quantized group is not on the grid (ggml aborts: 'Oops: found point not on grid')")
    return np.where(active[:, None], gi, 0)


def _signs(x: np.ndarray) -> np.ndarray:
    """(G, n) -> (G, n/8) uint8 sign bytes: bit i set where !(x >= 0)."""
    G, n = x.shape
    b = (~(x >= 0)).reshape(G, n // 8, 8).astype(np.uint8)
    return np.bitwise_or.reduce(b << np.arange(8, dtype=np.uint8), axis=-1).astype(np.uint8)


def _running_max(scales: np.ndarray, active: np.ndarray) -> np.ndarray:
    """max_scale of one block: MAX over its (searched) groups in order, from 0."""
    m = np.zeros(scales.shape[0], f32)
    for ib in range(scales.shape[1]):
        m = np.where(active[:, ib], _cmax(m, scales[:, ib]), m)
    return m


def _super_scale(max_scale, scales, divisor, fudge, lmax):
    """d = max_scale/divisor, the f16 bytes of d*fudge, and the group scale levels."""
    with np.errstate(all="ignore"):
        d = max_scale / f32(divisor)
        dh = f16_bytes(d * f32(fudge))
        id_ = f32(1) / d
        ls = np.clip(_nearest_int(f32(0.5) * (id_[:, None] * scales - f32(1))), 0, lmax)
    return dh, ls


def _batched(type_size: int, batch: int = _BATCH):
    """Run a (n, 256) f32 -> (n, type_size) uint8 quantizer on batches of `batch` blocks."""
    def deco(fn):
        def run(x: np.ndarray) -> np.ndarray:
            x = np.ascontiguousarray(x, dtype=f32).reshape(-1, 256)
            if x.shape[0] == 0:
                return np.zeros((0, type_size), np.uint8)
            return np.concatenate([fn(x[s:s + batch]) for s in range(0, x.shape[0], batch)])
        run.__name__ = run.__qualname__ = fn.__name__
        run.__doc__ = fn.__doc__
        return run
    return deco


@quantizer(GGMLType.IQ3_XXS, "chunk", "ref")
@_batched(98)
def quantize_iq3_xxs(x: np.ndarray) -> np.ndarray:
    """quantize_iq3_xxs without imatrix (= quantize_row_iq3_xxs_ref): (n, 256) f32 -> (n, 98) uint8."""
    nb = x.shape[0]
    G = nb * 8
    xb = x.reshape(G, 32)
    weight = xb * xb
    xval = np.where(xb >= 0, xb, -xb)
    signs = _signs(xb)                                                  # (G, 4)
    # an odd number of negative values in a group of 8: flip the sign of the one with least w·x²
    odd = (np.bitwise_count(signs) if hasattr(np, "bitwise_count")
           else np.unpackbits(signs[..., None], axis=-1).sum(-1)) % 2 == 1
    with np.errstate(over="ignore"):
        imin = np.argmin(((weight * xb) * xb).reshape(G, 4, 8), axis=-1)   # first minimum
    flipm = odd[..., None] & (np.arange(8) == imin[..., None])           # (G, 4, 8)
    xval = np.where(flipm.reshape(G, 32), -xval, xval)
    signs = (signs ^ np.bitwise_or.reduce(flipm.astype(np.uint8) << np.arange(8, dtype=np.uint8),
                                          axis=-1).astype(np.uint8)) & 127
    active = ~(np.max(xval, axis=1) < f32(1e-8))
    scale, L, flip = _search(_IQ3XXS, xb, weight, xval, active)
    signs = np.where(flip[:, None], ~signs & 127, signs).astype(np.uint32)
    gi = _grid_index(_lattice("iq3xxs"), L, 4, active)                  # (G, 8)
    scale = np.where(active, scale, f32(0))
    sas = signs[:, 0] | (signs[:, 1] << 7) | (signs[:, 2] << 14) | (signs[:, 3] << 21)
    sas = np.where(active, sas, 0).astype(np.uint32).reshape(nb, 8)
    scale = scale.reshape(nb, 8)
    max_scale = _running_max(scale, active.reshape(nb, 8))
    dh, ls = _super_scale(max_scale, scale, 31, 1.0125, 15)
    sas = sas | (ls.astype(np.uint32) << 28)
    out = np.zeros((nb, 98), np.uint8)
    nz = max_scale != 0
    out[:, 0:2] = np.where(nz[:, None], dh, 0)
    out[:, 2:66] = np.where(nz[:, None], gi.reshape(nb, 64), 0)
    out[:, 66:98] = np.where(nz[:, None], np.ascontiguousarray(sas.astype("<u4")).view(np.uint8), 0)
    return out


@quantizer(GGMLType.IQ3_S, "chunk", "ref")
@_batched(110)
def quantize_iq3_s(x: np.ndarray) -> np.ndarray:
    """quantize_iq3_s without imatrix (= quantize_row_iq3_s_ref): (n, 256) f32 -> (n, 110) uint8."""
    nb = x.shape[0]
    G = nb * 8
    xb = x.reshape(G, 32)
    weight = xb * xb
    xval = np.where(xb >= 0, xb, -xb)
    signs = _signs(xb)                                                  # (G, 4)
    active = np.max(xval, axis=1) != 0
    scale, L, flip = _search(_IQ3S, xb, weight, xval, active)
    signs = np.where(flip[:, None], ~signs, signs).astype(np.uint8)
    gi = _grid_index(_lattice("iq3s"), L, 4, active)                    # (G, 8)
    scale = np.where(active, scale, f32(0)).reshape(nb, 8)
    act = active.reshape(nb, 8)
    max_scale = _running_max(scale, act)
    dh, ls = _super_scale(max_scale, scale, 31, 1.033, 15)
    out = np.zeros((nb, 110), np.uint8)
    nz = max_scale != 0
    out[:, 0:2] = np.where(nz[:, None], dh, 0)
    # qs and signs of the searched groups, packed to the front (ggml skips zero groups without
    # advancing its output pointers)
    slot = np.cumsum(act, axis=1) - 1                                  # (nb, 8)
    b, ib = np.nonzero(act)
    gi = gi.reshape(nb, 8, 8)
    sg = signs.reshape(nb, 8, 4)
    qs_cols = 2 + slot[b, ib][:, None] * 8 + np.arange(8)
    out[b[:, None], qs_cols] = (gi[b, ib] & 255).astype(np.uint8)
    sg_cols = 74 + slot[b, ib][:, None] * 4 + np.arange(4)
    out[b[:, None], sg_cols] = sg[b, ib]
    qh = np.where(act[..., None], gi >> 8, 0)                           # (nb, 8 groups, 8) bits
    out[:, 66:74] = np.bitwise_or.reduce((qh << np.arange(8)).astype(np.uint8), axis=-1).astype(np.uint8)
    out[:, 106:110] = np.where(nz[:, None], (ls[:, 0::2] | (ls[:, 1::2] << 4)).astype(np.uint8), 0)
    return out


@quantizer(GGMLType.IQ2_S, "chunk", "ref")
@_batched(82)
def quantize_iq2_s(x: np.ndarray) -> np.ndarray:
    """quantize_iq2_s without imatrix (= quantize_row_iq2_s_ref): (n, 256) f32 -> (n, 82) uint8."""
    nb = x.shape[0]
    G = nb * 16
    with np.errstate(all="ignore"):
        sumx2 = _seq(x * x)
        sigma2 = (f32(2) * sumx2) / f32(256)
        xb = x.reshape(G, 16)
        weight = f32(0.25) * np.repeat(sigma2, 16)[:, None] + xb * xb
    xval = np.where(xb >= 0, xb, -xb)
    signs = _signs(xb)                                                  # (G, 2)
    active = ~(np.max(xval, axis=1) < f32(1e-8))
    scale, L, flip = _search(_IQ2S, xb, weight, xval, active)
    signs = np.where(flip[:, None], ~signs, signs).astype(np.uint8)
    gi = _grid_index(_lattice("iq2s"), L, 8, active)                    # (G, 2)
    scale = np.where(active, scale, f32(0)).reshape(nb, 16)
    act = active.reshape(nb, 16)
    max_scale = _running_max(scale, act)
    dh, ls = _super_scale(max_scale, scale, 31, 0.9875, 15)
    out = np.zeros((nb, 82), np.uint8)
    nz = max_scale != 0
    out[:, 0:2] = np.where(nz[:, None], dh, 0)
    gi = np.where(active[:, None], gi, 0).reshape(nb, 32)
    out[:, 2:34] = (gi & 255).astype(np.uint8)
    out[:, 34:66] = np.where(active[:, None], signs, 0).reshape(nb, 32)
    hi = (gi >> 8).reshape(nb, 8, 4)
    out[:, 66:74] = np.bitwise_or.reduce((hi << (2 * np.arange(4))).astype(np.uint8), axis=-1).astype(np.uint8)
    out[:, 74:82] = np.where(nz[:, None], (ls[:, 0::2] | (ls[:, 1::2] << 4)).astype(np.uint8), 0)
    return out


# ----------------------------------------------------------------------------------------------------
# IQ1_M: an exhaustive search of the two boundaries splitting a sorted group of 16 into levels -1, 0, +1

_IQ1M_X = np.array([[-0.875, 0.125, 1.125],      # x_p: the levels shifted by +IQ1M_DELTA
                    [-1.125, -0.125, 0.875]], f32)  # x_m: shifted by -IQ1M_DELTA
# the level set (0: x_p, 1: x_m) of shift k (0..3) for the first / second 8 values of a group
_IQ1M_V = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
_IQ1M_PAIRS = np.array([(i1, i2) for i1 in range(17) for i2 in range(i1, 17)])          # ggml's loop order
_IQ1M_LVL = ((np.arange(16)[None, :] >= _IQ1M_PAIRS[:, :1]).astype(np.int64)
             + (np.arange(16)[None, :] >= _IQ1M_PAIRS[:, 1:]))                       # (153, 16)


@quantizer(GGMLType.IQ1_M, "chunk")
@_batched(56, _BATCH // 4)
def quantize_iq1_m(x: np.ndarray) -> np.ndarray:
    """quantize_iq1_m without imatrix (ggml has no reference quantizer for IQ1_M): (n, 256) -> (n, 56).

    When no neighbour of an off-grid group of 8 has a finite error (|x| beyond ~1e14), ggml falls back
    to a scan of the whole grid that reads past the group (an out-of-bounds bug) and then aborts; this
    raises ValueError there instead.
    """
    return _quantize_iq1_m(x)


def _quantize_iq1_m(x: np.ndarray) -> np.ndarray:
    lat = _lattice("iq1s")
    nb = x.shape[0]
    G = nb * 16
    xb = x.reshape(G, 16)
    rows = np.arange(G)
    with np.errstate(all="ignore"):
        weight = xb * xb
        active = ~(np.max(np.abs(xb), axis=1) < f32(1e-7))
        # glibc's qsort of 16 (value, index) pairs is a stable merge sort
        order = np.argsort(xb, axis=1, kind="stable")                            # (G, 16)
        half = (order >= 8).astype(np.int64)
        ws, xs = weight[rows[:, None], order], xb[rows[:, None], order]       # in sorted order
        # terms of sorted element j for shift k at level lvl: (w·x_v[lvl])·x and (w·x_v[lvl])·x_v[lvl]
        xv = _IQ1M_X[_IQ1M_V.T][half]                                           # (G, 16, 4, 3)
        a = ws[:, :, None, None] * xv
        tqx = a * xs[:, :, None, None]
        tq2 = a * xv
        P = len(_IQ1M_PAIRS)
        sqx = np.zeros((G, 4, P), f32)
        sq2 = np.zeros((G, 4, P), f32)
        for j in range(16):
            lv = _IQ1M_LVL[:, j]
            sqx = sqx + tqx[:, j][:, :, lv]
            sq2 = sq2 + tq2[:, j][:, :, lv]
        # candidates in ggml's order (i1, i2 outer, k inner); the scan keeps ggml's running best
        sqx = np.ascontiguousarray(sqx.transpose(2, 1, 0).reshape(P * 4, G))
        sq2 = np.ascontiguousarray(sq2.transpose(2, 1, 0).reshape(P * 4, G))
        pos = sq2 > 0
        sqx2 = sqx * sqx
        ratio = sqx / sq2
        value = ratio * sqx
        best = np.full(G, -_FLT_MAX, f32)
        sel = np.full(G, -1, np.int64)
        for c in range(P * 4):
            acc = pos[c] & (sqx2[c] > best * sq2[c])
            best = np.where(acc, value[c], best)
            sel = np.where(acc, c, sel)
        active &= sel >= 0
        c = np.where(active, sel, 0)
        scale = ratio[c, rows]
        bk = c % 4
        p = c // 4
        L = np.zeros((G, 16), np.int64)
        L[rows[:, None], order] = _IQ1M_LVL[p]
        neg = scale < 0
        L = np.where(neg[:, None], 2 - L, L)
        scale = np.where(neg, -scale, scale)
        bk = np.where(neg, 3 - bk, bk)
        # each group of 8 to its grid point, or to its best neighbour at this scale
        var = _IQ1M_V[bk]                                                        # (G, 2)
        u = lat.code(L.reshape(G, 2, 8))
        gi = lat.kmap[u]
        need = (gi < 0) & active[:, None]
        if need.any():
            g, k = np.nonzero(need)
            qtab = _IQ1M_X[:, lat.levels]                                        # (2, 2048, 8)
            gi[g, k] = _best_neighbour(lat, u[g, k], xb.reshape(G, 2, 8)[g, k],
                                       weight.reshape(G, 2, 8)[g, k], scale[g], qtab, var[g, k])
            redo = need.any(axis=1)
            q = _IQ1M_X[var[:, :, None], lat.levels[np.where(gi >= 0, gi, 0)]].reshape(G, 16)
            wq = weight * q
            sx, s2 = _seq(wq * xb), _seq(wq * q)
            scale = np.where(redo & (sx > 0) & (s2 > 0), sx / s2, scale)
        gi = np.where(active[:, None], gi, 0)
        bk = np.where(active, bk, 0)
        scale = np.where(active, scale, f32(0)).reshape(nb, 16)
        act = active.reshape(nb, 16)
        max_scale = _running_max(scale, act)
        nz = max_scale != 0

        out = np.zeros((nb, 56), np.uint8)
        out[:, 0:32] = (gi & 255).reshape(nb, 32)
        qh = ((gi[:, 0] >> 8) | ((gi[:, 1] >> 8) << 4)).reshape(nb, 16)
        masks = np.array([0x00, 0x80, 0x08, 0x88])[bk.reshape(nb, 16)]
        out[:, 32:48] = np.where(nz[:, None], qh | masks, qh)
        # the super-block scale: a least-squares fit of all 256 values at the chosen group scales
        d = max_scale / f32(15)
        id_ = f32(1) / d
        ls = np.clip(_nearest_int(f32(0.5) * (id_[:, None] * scale - f32(1))), 0, 7)    # (nb, 16)
        q = _IQ1M_X[_IQ1M_V[bk.reshape(nb, 16)][..., None], lat.levels[gi.reshape(nb, 16, 2)]]  # (nb,16,2,8)
        q = q * (2 * ls + 1).astype(f32)[:, :, None, None]
        q = q.reshape(nb, 256)
        wq = weight.reshape(nb, 256) * q
        sx, s2 = _seq(wq * x), _seq(wq * q)
        d = np.where(s2 > 0, sx / s2, d)
        s16 = np.ascontiguousarray((d * f32(1.1125)).astype("<f2")).view("<u2").astype(np.uint16)
        sc = np.bitwise_or.reduce(ls.reshape(nb, 4, 4).astype(np.uint16) << (3 * np.arange(4, dtype=np.uint16)),
                                  axis=-1).astype(np.uint16)
        sc[:, 0] |= (s16 & 0x000F) << 12
        sc[:, 1] |= (s16 & 0x00F0) << 8
        sc[:, 2] |= (s16 & 0x0F00) << 4
        sc[:, 3] |= (s16 & 0xF000)
        sc = np.where(nz[:, None], sc, 0).astype("<u2")
        out[:, 48:56] = np.ascontiguousarray(sc).view(np.uint8)
    return out
