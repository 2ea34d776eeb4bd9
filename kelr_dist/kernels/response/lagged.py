"""Lagged sums ``sum_n A(X_{n+s}) (x) B(X_n)`` by FFT, for one chunk plus its halo.

The response operator (eq. 6) is

    k(s) = 1/(N-s) sum_{n=0}^{N-1-s} A(X_{n+s}) (x) B(X_n),      s = 0..S,

so a chunk of rows ``[start, stop)`` of a chain contributes the sums over its ``b`` rows,
with ``a`` holding the chunk's ``A`` rows followed by the *halo*: ``A`` on the next
``min(S, rows left in the chain)`` rows. Pairs whose ``n + s`` falls beyond the rows of ``a``
(the end of the chain) are left out, which is exactly what makes the partial sums of any
chunking add up to the whole-series sums.

The sums are cross-correlations, computed by real FFTs of length ``next_fast_len(K + S)`` over
sub-blocks of ``K`` rows of ``b`` (each with its own ``S`` rows of ``a`` look-ahead), so the
cost is ``O(L log L)``, not ``O(L S)``, and memory stays at a few ``(K + S) x (q + d)``
spectra. :func:`blockwise_lagged_sums` returns the per-sub-block sums (the block-averaging
error bars of :mod:`kelr_dist.kernels.response.blocking` are built on them); :func:`lagged_sums`
adds the sub-blocks up in the frequency domain, so it needs only ``q d`` inverse transforms in all.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy import fft

from kelr_dist.kernels.checks import is_whole
from kelr_dist.kernels.compiled import compiled

#: complex numbers per group of sub-blocks, its spectra and cross spectra together (16 MiB of
#: complex128): bounds the memory and keeps each of a group's arrays under the mmap threshold
#: the engine gives its workers (32 MiB, :mod:`kelr_dist.engine.allocator`), so they are reused
#: from the heap instead of paying fresh pages per group (see docs/benchmarks.md, section
#: 'Tuning constants')
_SPECTRUM_BUDGET = 1 << 20


#: the summed cross spectra of :func:`lagged_sums` are one matrix product over the sub-blocks
#: per frequency when ``a`` and ``b`` both have at least this many columns, else an element-wise
#: sum by groups of fewer sub-blocks: with fewer columns the per-frequency products are too
#: small for BLAS (see docs/benchmarks.md, section 'Tuning constants')
MATMUL_COLUMNS = 16


def _by_products(q: int, d: int) -> bool:
    """Whether the summed cross spectra of ``q`` and ``d`` columns are matrix products (their
    groups then hold as many sub-blocks as their spectra alone allow)."""
    return min(q, d) >= MATMUL_COLUMNS


#: bytes the cross spectra of one call may take, ``q d (F/2 + 1)`` complex numbers (and their
#: inverse transforms): with hundreds of components both ``q`` and ``d`` are large, and the
#: columns of ``b`` are then transformed in groups that fit
CROSS_BUDGET = 32 * 2**20


def _column_groups(q: int, d: int, length: int) -> list[slice]:
    """The columns of ``b (L, d)`` in groups whose cross spectra with ``q`` columns of ``a``,
    transform length ``length``, fit :data:`CROSS_BUDGET` (one group when all do)."""
    width = max(1, CROSS_BUDGET // (16 * q * (length // 2 + 1)))
    return [slice(lo, min(lo + width, d)) for lo in range(0, max(d, 1), width)]


def default_block_rows(max_lag: int, rows: int | None = None) -> int:
    """Sub-block length of :func:`lagged_sums`: a power of two >= ``4 max(S, 256)``, and no
    longer than the power of two >= ``rows`` (the rows of ``b``, when given).

    With ``K >= 4 S`` the transform length ``next_fast_len(K + S)`` wastes at most a quarter
    of each transform on the look-ahead rows. Longer sub-blocks save little on the forward
    transforms, while each of the ``q d`` inverse transforms has their length: with many
    columns on both sides those dominate, and a segment of a thousand rows transformed at
    four thousand would pay them four times over.
    """
    block = 1 << int(np.ceil(np.log2(4 * max(max_lag, 256))))
    return block if rows is None else min(block, 1 << int(np.ceil(np.log2(max(rows, 1)))))


def check_lagged_pair(a: np.ndarray, b: np.ndarray, max_lag: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate ``a (L_a, q)``, ``b (L_b, d)``, ``max_lag``; return float64 arrays.

    Raises ``ValueError`` for a negative or non-integer ``max_lag``, inputs that are not 2-D and
    ``L_a < L_b``.
    """
    if not is_whole(max_lag):
        raise ValueError(f"max_lag must be a non-negative integer, got {max_lag!r}")
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    for name, x in (("a", a), ("b", b)):
        if x.ndim != 2:
            raise ValueError(
                f"{name} must be 2-D (rows, components), got shape {x.shape}; "
                "reshape a single series with x[:, None]"
            )
    if a.shape[0] < b.shape[0]:
        raise ValueError(
            f"a must have at least as many rows as b (a = the chunk's rows plus the halo), "
            f"got len(a) = {a.shape[0]} < len(b) = {b.shape[0]}"
        )
    return a, b


def _check_ones(ones: int, b: np.ndarray) -> None:
    if not is_whole(ones) or ones > b.shape[1]:
        raise ValueError(
            f"ones must be an integer in [0, {b.shape[1]}] (columns of b), got {ones!r}"
        )


def _check_block(block: int) -> int:
    if not is_whole(block, 1):
        raise ValueError(f"block length must be a positive integer, got {block!r}")
    return int(block)


def _rows(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``x[lo:hi]`` transposed to ``(components, hi - lo)``, rows outside ``x`` read as zero."""
    seg = x[max(lo, 0) : max(min(hi, x.shape[0]), 0)].T
    pad = (max(-lo, 0), hi - lo - seg.shape[1] - max(-lo, 0))
    return np.pad(seg, ((0, 0), pad)) if pad != (0, 0) else seg


@dataclass(frozen=True)
class _Spectra:
    """Spectra of ``k`` sub-blocks: ``a`` ``(q, k, F//2+1)``, ``b`` ``(d, k, F//2+1)``, or
    ``(d, k, F/m)`` for ``b`` on every ``m``-th row, whose spectrum repeats with period ``F/m``."""

    a: np.ndarray
    b: np.ndarray
    length: int  # the transform length F

    def summed_cross(self) -> np.ndarray:
        """The cross spectra summed over the sub-blocks, ``sum_k a[i, k, f] conj(b[j, k, f])``,
        ``(q, d, F//2+1)`` (perhaps a transposed view; ``b`` is conjugated in place): one matrix
        product over the sub-blocks per frequency when both sides have at least
        :data:`MATMUL_COLUMNS` columns, else element-wise."""
        b = np.conjugate(self.b, out=self.b)
        n_freq, period = self.a.shape[-1], b.shape[-1]
        if _by_products(self.a.shape[0], b.shape[0]):
            # f = u P + v with P the period: b's spectrum repeats along the frequencies
            b = b if period == n_freq else b[..., np.arange(n_freq) % period]
            a = np.ascontiguousarray(self.a.transpose(2, 0, 1))  # (F//2+1, q, k)
            cross = a @ np.ascontiguousarray(b.transpose(2, 1, 0))  # (F//2+1, k, d)
            return cross.transpose(1, 2, 0)
        if period == n_freq:
            return np.einsum("ikf,jkf->ijf", self.a, b)
        # b's repeated spectrum meets a's in pieces of length P
        repeats = -(-n_freq // period)
        a = np.zeros((*self.a.shape[:2], repeats * period), dtype=self.a.dtype)
        a[..., :n_freq] = self.a
        cross = np.einsum("ikuv,jkv->ijuv", a.reshape(*a.shape[:2], repeats, period), b)
        return cross.reshape(*cross.shape[:2], -1)[..., :n_freq]


def _transform_length(rows: int, stride: int) -> int:
    """The fast transform length ``F >= rows`` of :func:`_spectra`: a multiple of ``stride``
    whose quotient is a fast complex length (the transform of ``b`` on every ``stride``-th row)."""
    if stride == 1:
        return int(fft.next_fast_len(rows, real=True))
    return stride * int(fft.next_fast_len(-(-rows // stride)))


def _spectra(
    a: np.ndarray,
    b: np.ndarray,
    block: int,
    max_lag: int,
    offset: int,
    stride: int = 1,
    summed: bool = False,
) -> Iterator[_Spectra]:
    """Real FFTs of the sub-blocks of ``b`` and of their ``a`` windows, in groups.

    Sub-block ``k`` holds ``b`` rows ``[kK - offset, (k+1)K - offset)`` and its ``a`` window the
    rows ``[kK - offset, (k+1)K - offset + S)``; rows outside the arrays read as zero. With
    ``F >= K + S`` the circular correlation of the two has no wrap-around at lags ``0..S``.

    With ``stride = m > 1`` (``offset = 0``, ``K`` a multiple of ``m``), ``b`` holds only the rows
    ``0, m, 2m, ...`` (zeros between). The transform of such a block is the transform of its
    ``K / m`` rows, of length ``F / m``, repeated ``m`` times along the frequencies: ``m`` times
    less work than the transform of the spread rows, kept unrepeated.

    A group's spectra and the cross spectra of its sub-blocks stay within
    :data:`_SPECTRUM_BUDGET`; ``summed``: the caller sums the cross spectra over the sub-blocks
    by matrix products (:meth:`_Spectra.summed_cross`), so only the spectra count and a group
    holds more of them, the products' inner dimension.
    """
    n_blocks = -(-(offset + stride * b.shape[0]) // block)
    length = _transform_length(block + max_lag, stride)
    columns = a.shape[1] + b.shape[1] + (0 if summed else a.shape[1] * b.shape[1])
    per_group = max(1, _SPECTRUM_BUDGET // (columns * (length // 2 + 1)))
    for first in range(0, n_blocks, per_group):
        count = min(per_group, n_blocks - first)
        lo = first * block - offset
        a_rows = _rows(a, lo, lo + count * block + max_lag)
        a_win = sliding_window_view(a_rows, block + max_lag, axis=1)[:, ::block]
        b_rows = _rows(b, lo // stride, (lo + count * block) // stride)
        b_win = b_rows.reshape(b.shape[1], count, block // stride)
        b_spectra = (
            fft.rfft(b_win, n=length, axis=-1)
            if stride == 1
            else fft.fft(b_win, n=length // stride, axis=-1)
        )
        yield _Spectra(a=fft.rfft(a_win, n=length, axis=-1), b=b_spectra, length=length)


def _to_lags(correlation: np.ndarray, length: int, max_lag: int) -> np.ndarray:
    """Inverse transform ``(q, d, ..., F//2+1) -> (..., S+1, q, d)`` (lags ``0..S``)."""
    # a copy of the lags kept: a view would hold the whole inverse transform alive
    lags = fft.irfft(correlation, n=length, axis=-1)[..., : max_lag + 1].copy()
    return np.moveaxis(lags, (0, 1), (-2, -1))


def lagged_sums(
    a: np.ndarray, b: np.ndarray, max_lag: int, block_rows: int | None = None, ones: int = 0
) -> np.ndarray:
    """Lagged sums ``out[s, i, j] = sum_{n < len(b), n + s < len(a)} a[n+s, i] b[n, j]``.

    The chunk's share of the numerator of eq. 6, by FFT in ``O(L log L)``.

    Parameters
    ----------
    a : ``(L_a, q)`` observable ``A`` on the chunk's rows followed by the halo
        (``L_a >= L_b``; rows past ``L_b + S`` are never used).
    b : ``(L_b, d)`` conjugate variable ``B`` on the chunk's rows.
    max_lag : ``S >= 0``.
    block_rows : rows of ``b`` per FFT sub-block (default :func:`default_block_rows`);
        memory is a few ``(block_rows + S) x (q + d)`` complex numbers per group.
    ones : the last ``ones`` columns of ``b`` are 1 on every row: their sums are sums of ``a``
        over windows (:func:`window_sums`), with no transform.

    Returns
    -------
    ``(S+1, q, d)`` float64.
    """
    a, b = check_lagged_pair(a, b, max_lag)
    block = (
        default_block_rows(max_lag, b.shape[0]) if block_rows is None else _check_block(block_rows)
    )
    _check_ones(ones, b)
    if b.shape[0] == 0:
        return np.zeros((max_lag + 1, a.shape[1], b.shape[1]))
    if max_lag == 0:  # one product sum, no transform
        return (a[: b.shape[0]].T @ b)[None]
    rest = b.shape[1] - ones
    spectra = _summed_spectra(a, b[:, :rest], block, max_lag) if rest else None
    windows = window_sums(a, b.shape[0], max_lag, block).sum(axis=0) if ones else None
    return _beside(spectra, windows, ones)


def _beside(sums: np.ndarray | None, windows: np.ndarray | None, ones: int) -> np.ndarray:
    """Lagged sums ``(..., q, d - ones)`` from the transforms, then ``ones`` copies of the
    window sums ``(..., q)`` (the columns of ``b`` that are 1)."""
    if windows is None:
        assert sums is not None
        return sums
    repeated = np.repeat(windows[..., None], ones, axis=-1)
    return repeated if sums is None else np.concatenate([sums, repeated], axis=-1)


def window_sums(
    a: np.ndarray, length: int, max_lag: int, block: int, offset: int = 0
) -> np.ndarray:
    """The lagged sums (eq. 6) of a column of ones on ``length`` rows, by block:
    ``out[k, s, i] = sum_{n in block k, n + s < len(a)} a[n+s, i]``, blocks as in
    :func:`blockwise_lagged_sums`, ``(ceil((offset + length) / K), S+1, q)``.

    A block's sum at lag ``s`` is its sum at ``s - 1`` plus the row that enters the window and
    minus the row that leaves it: ``O(K + S)`` per block and column, no transform.
    """
    a = np.asfortranarray(a, dtype=np.float64)  # a column at a time
    out = np.empty((-(-(offset + length) // block), max_lag + 1, a.shape[1]))
    _sliding_sums(a, length, block, offset, out)
    return out


@compiled
def _sliding_sums(a, length, block, offset, out):  # pragma: no cover - compiled
    """:func:`window_sums` into ``out``; rows past the end of ``a`` read as zero."""
    rows = a.shape[0]
    for k in range(out.shape[0]):
        lo, hi = max(k * block - offset, 0), min((k + 1) * block - offset, length)
        for i in range(a.shape[1]):
            total = 0.0
            for n in range(lo, min(hi, rows)):
                total += a[n, i]
            out[k, 0, i] = total
            for s in range(1, out.shape[1]):
                if hi - 1 + s < rows:
                    total += a[hi - 1 + s, i]
                if lo - 1 + s < rows:
                    total -= a[lo - 1 + s, i]
                out[k, s, i] = total


def _summed_spectra(
    a: np.ndarray, b: np.ndarray, block: int, max_lag: int, stride: int = 1
) -> np.ndarray:
    """The lagged sums of :func:`_spectra`'s sub-blocks, added up in the frequency domain:
    ``q d`` inverse transforms in all, by groups of ``b``'s columns (:func:`_column_groups`).
    ``b`` has rows."""
    groups = _column_groups(a.shape[1], b.shape[1], _transform_length(block + max_lag, stride))
    if len(groups) > 1:
        parts = [_summed_spectra(a, b[:, g], block, max_lag, stride) for g in groups]
        return np.concatenate(parts, axis=-1)
    total: np.ndarray | None = None
    summed = _by_products(a.shape[1], b.shape[1])
    for spec in _spectra(a, b, block, max_lag, offset=0, stride=stride, summed=summed):
        term = spec.summed_cross()
        total = np.ascontiguousarray(term) if total is None else np.add(total, term, out=total)
    assert total is not None  # b has rows, so there is at least one sub-block
    return _to_lags(total, spec.length, max_lag)


def blockwise_lagged_sums(
    a: np.ndarray, b: np.ndarray, max_lag: int, block: int, offset: int = 0, ones: int = 0
) -> np.ndarray:
    """Lagged sums of each block of ``block`` rows of ``b``, all lags at once.

    ``out[k, s, i, j] = sum_{n in block k, n + s < len(a)} a[n+s, i] b[n, j]`` where block ``k``
    holds rows ``n`` of ``[kK - offset, (k+1)K - offset) & [0, len(b))``: the first block may be
    cut by ``offset`` rows and the last one by the end of ``b``. Summed over ``k`` this is
    :func:`lagged_sums`; one batched FFT per group of blocks, the groups' cross spectra in one
    buffer and their lags written straight into the result (fresh multi-MiB arrays per group
    would cost their page faults again; see docs/benchmarks.md, section 'Tuning constants').

    Parameters
    ----------
    a, b, max_lag, ones : as in :func:`lagged_sums`.
    block : block length ``K >= 1``.
    offset : rows of the first block that lie before ``b`` (``0 <= offset < K``).

    Returns
    -------
    ``(ceil((offset + L_b) / K), S+1, q, d)`` float64.
    """
    a, b = check_lagged_pair(a, b, max_lag)
    block = _check_block(block)
    if not 0 <= offset < block:
        raise ValueError(f"offset must be in [0, block = {block}), got {offset}")
    _check_ones(ones, b)
    if ones and max_lag > 0 and b.shape[0] > 0:
        rest = b.shape[1] - ones
        spectra = blockwise_lagged_sums(a, b[:, :rest], max_lag, block, offset) if rest else None
        return _beside(spectra, window_sums(a, b.shape[0], max_lag, block, offset), ones)
    if max_lag == 0:  # block sums of the products, no transform
        starts = np.arange(-offset, b.shape[0], block).clip(0)
        if b.shape[0] == 0:
            return np.zeros((len(starts), 1, a.shape[1], b.shape[1]))
        products = (a[: b.shape[0], :, None] * b[:, None, :]).reshape(b.shape[0], -1)
        sums = np.add.reduceat(products, starts, axis=0)
        return sums.reshape(len(starts), 1, a.shape[1], b.shape[1])
    groups = _column_groups(a.shape[1], b.shape[1], _transform_length(block + max_lag, 1))
    if len(groups) > 1:  # the cross spectra by groups of b's columns
        parts = [blockwise_lagged_sums(a, b[:, g], max_lag, block, offset) for g in groups]
        return np.concatenate(parts, axis=-1)
    n_blocks = -(-(offset + b.shape[0]) // block)
    out = np.empty((n_blocks, max_lag + 1, a.shape[1], b.shape[1]))
    cross = np.empty(0, dtype=np.complex128)  # the groups' cross spectra, one buffer for all
    first = 0
    for spec in _spectra(a, b, block, max_lag, offset):
        shape = (spec.a.shape[0], spec.b.shape[0], *spec.a.shape[1:])
        size = math.prod(shape)
        if cross.size < size:
            cross = np.empty(size, dtype=np.complex128)
        products = cross[:size].reshape(shape)
        np.multiply(spec.a[:, None], np.conjugate(spec.b, out=spec.b)[None, :], out=products)
        count = shape[2]
        out[first : first + count] = _to_lags(products, spec.length, max_lag)
        first += count
    return out


#: :func:`strided_lagged_sums` sums directly while ``S + 1`` is at most this many strides, and
#: by the transforms of :func:`lagged_sums` beyond (see docs/benchmarks.md, section 'Tuning
#: constants')
STRIDED_LAGS = 8


def strided_lagged_sums(
    a: np.ndarray, b: np.ndarray, max_lag: int, origins: slice, length: int
) -> np.ndarray:
    """Lagged sums over every ``stride``-th origin:
    ``out[s, i, j] = sum_k a[start + k stride + s, i] b[k, j]`` over ``start + k stride + s
    < len(a)``, for the origins ``range(length)[origins]`` (``origins.step`` is the stride).

    This is :func:`lagged_sums` of ``b`` spread on the origins' rows of ``length`` rows (zeros
    elsewhere), by those transforms when ``S + 1`` exceeds :data:`STRIDED_LAGS` strides (the
    transform of a sub-block of ``b`` is that of its origins alone, repeated, see
    :func:`_spectra`), and otherwise directly in ``O(len(b) S q d)``: one matrix product per
    component of ``a`` on a strided view of its windows.

    Parameters
    ----------
    a : ``(L_a, q)`` observable on the rows and the halo (``L_a >= length``).
    b : ``(n, d)`` values at the origins.
    max_lag : ``S >= 0``.
    origins : a slice of the ``length`` rows of ``b``'s block with a positive step.
    length : the block's rows.

    Returns
    -------
    ``(S+1, q, d)`` float64.
    """
    start, _, stride = origins.indices(length)
    n = b.shape[0]
    if n == 0:  # a short block with no origin: its a may be shorter than a window
        return np.zeros((max_lag + 1, a.shape[1], b.shape[1]))
    if max_lag + 1 > STRIDED_LAGS * stride:
        # sub-blocks of whole strides, ``a`` from the first origin on
        block = stride * -(-default_block_rows(max_lag) // stride)
        a, b = np.asarray(a, dtype=np.float64)[start:], np.asarray(b, dtype=np.float64)
        return _summed_spectra(a, b, block, max_lag, stride)
    # one contiguous row per component, zeros past the end of the chain
    rows = max(a.shape[0], start + (n - 1) * stride + max_lag + 1)
    columns = np.zeros((a.shape[1], rows))
    columns[:, : a.shape[0]] = np.asarray(a, dtype=np.float64).T
    out = np.empty((max_lag + 1, a.shape[1], b.shape[1]))
    for i, column in enumerate(columns):
        windows = sliding_window_view(column, max_lag + 1)[start::stride][:n]  # (n, S+1)
        out[:, i, :] = windows.T @ b
    return out
