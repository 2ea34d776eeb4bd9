"""Flyvbjerg-Petersen block-averaging standard errors of the lagged means, from mergeable partials.

Each entry of the response estimate (eq. 6) is the mean over ``n`` of the series
``y_n = A_i(X_{n+s}) B_j(X_n)``. Its standard error comes from reblocking (Flyvbjerg and
Petersen 1989, the method the paper cites for eq. 6): cut each chain into blocks of
``K`` consecutive rows, take the block means ``m_k``; for ``K`` well above the correlation time
they are nearly independent and ``sigma_K^2 = sum_k (m_k - mean)^2 / (n_b (n_b - 1))`` estimates
the variance of the mean. ``sigma_K`` grows with ``K`` up to a plateau, the standard error.

Levels and blocks
    ``K = 1`` (the unblocked series) and ``K_j = K0 2^j``, ``j = 0, 1, ...``, with ``K0`` a power
    of two ``>= max(S, 256)`` by default (:func:`default_base_block`; the pipeline fits a longer
    one to the lags and the data, :func:`fitted_base_block`). Blocks are aligned to the
    time index within the chain (block ``k`` of level ``j`` holds rows ``[k K_j, (k+1) K_j)``),
    and only blocks whose rows all satisfy ``n + S < N_c`` count, so every block has all
    ``S + 1`` lags; the at most ``K_j + S - 1`` rows left at the end of a chain are ignored by the
    block levels (they are in the estimate and in the ``K = 1`` level). Blocks of all chains are
    pooled; no block crosses a chain.

One FFT pass
    The block sums of ``y`` for all lags over one block of ``K0`` rows are the lagged sums of
    that block (its ``A`` rows plus ``S`` look-ahead rows):
    :func:`kelr_dist.kernels.response.lagged.blockwise_lagged_sums` gives them for all blocks of a
    chunk in one
    batched FFT, and their total *is* the chunk's lagged sums. Higher levels add pairs of
    blocks. The ``K = 1`` level needs ``sum_n y_n^2 = lagged_sums(a**2, b**2)`` (element-wise
    squares).

Mergeable partials
    A chunk starts and stops anywhere, so its partial holds, per level, the count, mean and sum
    of squared deviations (Chan et al.'s parallel update, no cancellation) of the block means of
    the blocks it covers completely, plus the block sums of the blocks cut by its edges keyed by
    ``(chain, level, block)`` with their covered row count. :func:`combine_block_partials` adds
    the edge pieces of the same block and moves a block to the level statistics once all its
    ``K`` rows are in: associative and commutative (up to rounding).

Choice of the block size (per entry)
    Lee, Needs and Drummond (Phys. Rev. E 83, 066706, 2011): the smallest level with
    ``K^3 > 2 N_s (sigma_K / sigma_1)^4`` (``N_s`` pairs at lag ``s``), i.e. blocks long against
    the correlation time ``(sigma_K/sigma_1)^2 / 2`` with the bias ``O(tau/K)`` below the
    statistical error ``O(n_b^{-1/2})``, among the levels with at least ``min_blocks`` blocks
    (default 32). When no level qualifies the largest one with ``min_blocks`` blocks is used, and
    the entry is flagged ``converged = False`` unless that level is on the plateau all the same:
    ``K > (sigma_K / sigma_1)^2 / PLATEAU_BIAS``, i.e. blocks longer than ten times the
    correlation time, whose bias ``~ 2 tau / K`` is below 10% (the criterion alone asks for a
    bias below the statistical error, which with many pooled blocks — many short chains — no
    block within a chain can reach). The estimator's own relative error is
    ``1 / sqrt(2 (n_b - 1))`` (``sigma_error``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from kelr_dist.kernels.reduction import BlockInfo
from kelr_dist.kernels.response.lagged import blockwise_lagged_sums, check_lagged_pair, lagged_sums

Partial = dict

#: a fallback level counts as converged when ``(sigma_K / sigma_1)^2 / K``, the relative bias of
#: its variance (about ``2 tau / K``), is below this
PLATEAU_BIAS = 0.1


#: bytes of one segment's block sums (and of each temporary of their level statistics): under the
#: workers' mmap threshold (32 MiB, :mod:`kelr_dist.engine.allocator`), so they come from the heap
#: instead of fresh pages per segment (see docs/benchmarks.md, section 'Tuning constants')
SEGMENT_BYTES = 30 * 2**20


def segment_length(max_lag: int, columns: int, base_block: int) -> int:
    """Rows per segment of a long chunk: the largest power of two of base blocks whose block
    sums, ``(S+1) x columns`` float64 each, fit in :data:`SEGMENT_BYTES` (at least one)."""
    blocks = SEGMENT_BYTES // (8 * (max_lag + 1) * max(columns, 1))
    return base_block << max(int(blocks).bit_length() - 1, 0)


def aligned_segments(info: BlockInfo, size: int, max_lag: int) -> Iterator[tuple[BlockInfo, slice]]:
    """The pieces of a chunk cut at the multiples of ``size`` rows of its chain, each with the
    rows it reads of the chunk's array followed by its halo: its own rows and the next
    ``min(S, rows left in the chain)``. Their partials merge like those of separate chunks."""
    cuts = range((info.start // size + 1) * size, info.stop, size)
    for lo, hi in zip([info.start, *cuts], [*cuts, info.stop], strict=True):
        halo = min(max_lag, info.chain_length - hi)
        yield (
            BlockInfo(info.chain, lo, hi, info.chain_length),
            slice(lo - info.start, hi - info.start + halo),
        )


def default_base_block(max_lag: int) -> int:
    """Base block length ``K0``: the smallest power of two ``>= max(S, 256)``."""
    return 1 << int(np.ceil(np.log2(max(max_lag, 256))))


#: the fitted base block spans at least this many largest lags: a block's transform of
#: ``K0 + S`` rows then spends at most a fifth on its look-ahead, and its block sums (``S + 1``
#: lags per block) hold at most a quarter of a value per row (see docs/benchmarks.md, section
#: 'Tuning constants')
BASE_BLOCK_LAGS = 4
#: base blocks the fitted base block leaves at least, pooled over the chains (their standard
#: error has a relative error ``1 / sqrt(2 (n_b - 1))``, 4.4% at 256) ...
BASE_BLOCKS = 256
#: ... and in each chain (the rows after a chain's last whole block are left out of the levels)
CHAIN_BLOCKS = 4


#: fewest blocks (pooled over the chains) a level needs to be chosen by
#: :func:`block_standard_error`: its standard error then has a relative error of at most
#: ``1 / sqrt(2 (n_b - 1))``, 12.7%
MIN_BLOCKS = 32


def useful_levels(
    base_block: int, chains: int, chain_length: int, max_lag: int, min_blocks: int = MIN_BLOCKS
) -> int:
    """The block levels ``K0 2^j`` that can be chosen: those with at least ``min_blocks``
    whole blocks pooled over ``chains`` chains of ``chain_length`` rows (at least 1). A longer
    level is never read by :func:`block_standard_error`, so a partial need not hold it: its
    statistics are ``(S+1) q d`` numbers per level, the largest part of a partial with many
    components."""
    valid = max(chain_length - max_lag, 0)  # rows n with n + S < N_c
    levels = 0
    while chains * (valid // (base_block << levels)) >= min_blocks:
        levels += 1
    return max(levels, 1)


def fitted_base_block(max_lag: int, chains: int, chain_length: int) -> int:
    """Base block ``K0`` fitted to the lags and to the data: the smallest power of two
    ``>= BASE_BLOCK_LAGS S`` (and ``>= 256``), halved while fewer than :data:`BASE_BLOCKS`
    blocks fit in the ``chains`` chains of ``chain_length`` rows (or fewer than
    :data:`CHAIN_BLOCKS` in one), never below :func:`default_base_block`.

    The levels ``K0 2^j`` are aligned to the time index, so a longer ``K0`` only leaves out the
    levels below it, whose blocks are short against the lags asked for; the FFT work per row
    and the block sums shrink (see docs/benchmarks.md, section 'Tuning constants')."""
    floor = default_base_block(max_lag)
    valid = max(chain_length - max_lag, 0)  # rows n with n + S < N_c, as in the levels
    k0 = default_base_block(BASE_BLOCK_LAGS * max_lag)
    while k0 > floor and (chains * (valid // k0) < BASE_BLOCKS or valid // k0 < CHAIN_BLOCKS):
        k0 //= 2
    return k0


def _level_stats(block_sums: np.ndarray, size: int) -> tuple[int, np.ndarray, np.ndarray]:
    """Count, mean and sum of squared deviations of the block means ``block_sums / size``.

    ``block_sums`` is ``(n_b, S+1, q, d)``; mean and M2 are ``(S+1, q, d)``.
    """
    mean = block_sums.mean(axis=0) / size
    deviation = block_sums - mean * size
    return block_sums.shape[0], mean, np.square(deviation, out=deviation).sum(axis=0) / size**2


def _pair_up(
    ids: np.ndarray, rows: np.ndarray, sums: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks of the next level: siblings ``2p, 2p+1`` (consecutive ``ids``) add into ``p``."""
    lead = int(ids[0] % 2)  # the first block is a right child without its sibling
    pairs = (ids.shape[0] - lead) // 2
    body = slice(lead, lead + 2 * pairs)
    firsts = np.r_[0:lead, lead : body.stop : 2, body.stop : ids.shape[0]]
    out = np.empty((firsts.shape[0], *sums.shape[1:]))
    out[:lead] = sums[:lead]
    np.add(sums[body][::2], sums[body][1::2], out=out[lead : lead + pairs])
    out[lead + pairs :] = sums[body.stop :]
    return ids[firsts] >> 1, np.add.reduceat(rows, firsts), out


def _merge_level(
    partial: Partial, level: int, n_b: int, mean_b: np.ndarray, m2_b: np.ndarray
) -> None:
    """Chan et al.'s pairwise update of level ``level`` of ``partial`` with the statistics
    (count, mean, M2) of other blocks, in place. A level without blocks on one side takes the
    other's statistics as they are: only the levels that have blocks on both sides are
    computed, so a segment's merge costs what its own levels hold, not every level's."""
    n_a = int(partial["n_blocks"][level])
    if n_b == 0:
        return
    mean_a, m2_a = partial["block_mean"][level], partial["block_m2"][level]
    if n_a == 0:
        mean_a[...], m2_a[...] = mean_b, m2_b
    else:
        n = n_a + n_b
        delta = mean_b - mean_a
        mean_a += delta * (n_b / n)
        m2_a += m2_b
        m2_a += np.square(delta, out=delta) * (float(n_a * n_b) / n)
    partial["n_blocks"][level] = n_a + n_b


def _check_halo(a_ext: np.ndarray, b: np.ndarray, max_lag: int, info: BlockInfo) -> None:
    if b.shape[0] != info.length:
        raise ValueError(f"b has {b.shape[0]} rows but the block {info} has {info.length}")
    halo = min(max_lag, info.chain_length - info.stop)
    if a_ext.shape[0] != info.length + halo:
        raise ValueError(
            f"a_ext must hold the block's {info.length} rows plus a halo of min(S = {max_lag}, "
            f"rows left = {info.chain_length - info.stop}) = {halo} rows, got {a_ext.shape[0]}"
        )


def response_block_partial(
    a_ext: np.ndarray,
    b: np.ndarray,
    max_lag: int,
    info: BlockInfo,
    base_block: int | None = None,
    max_levels: int | None = None,
    segment_rows: int | None = None,
    ones: int = 0,
) -> Partial:
    """Lagged sums and block-averaging partials of one chunk (eq. 6), one FFT pass.

    Parameters
    ----------
    a_ext : ``(L + h, q)`` observable ``A`` on the chunk's rows and the halo,
        ``h = min(S, chain_length - stop)``.
    b : ``(L, d)`` conjugate variable ``B`` on the chunk's rows.
    max_lag : ``S >= 0``.
    info : where the chunk sits (:class:`kelr_dist.kernels.reduction.BlockInfo`).
    base_block : ``K0`` (default :func:`default_base_block`); must be the same for all chunks.
    max_levels : cap on the number of block levels ``K0 2^j`` (default: all with a block).
    segment_rows : the block sums of a long chunk are processed in aligned segments of about
        this many rows (rounded to a multiple of ``K0``), merged like separate chunks: memory
        stays at ``(segment_rows / K0) x (S+1) x q x d`` block sums plus the FFT work space.
        Default: :func:`segment_length`. The squares and the rows outside the blocks are summed
        over the whole input, whatever the segments: their ``q d`` inverse transforms once.
    ones : the last ``ones`` columns of ``b`` are 1 on every row (the constant feature of the
        Stein correction): their lagged sums are window sums of ``a``, with no transform
        (:func:`kelr_dist.kernels.response.lagged.window_sums`).

    Returns
    -------
    dict with ``"sums"`` ``(S+1, q, d)`` (exactly
    :func:`kelr_dist.kernels.response.lagged.lagged_sums` of the
    chunk), ``"squares"`` (the same for ``y^2``), ``"counts"`` ``(S+1,)`` pairs per lag,
    ``"n_blocks"`` ``(J,)``, ``"block_mean"`` and ``"block_m2"`` ``(J, S+1, q, d)`` for the blocks
    covered completely, ``"edges"`` ``{(chain, level, block): (rows, block sum)}`` for the cut
    ones, and the ints ``"max_lag"``, ``"base_block"``.
    """
    a_ext, b = check_lagged_pair(a_ext, b, max_lag)
    _check_halo(a_ext, b, max_lag, info)
    k0 = default_base_block(max_lag) if base_block is None else base_block
    if isinstance(k0, bool) or not isinstance(k0, int | np.integer) or k0 < 1:
        raise ValueError(f"base_block must be a positive integer, got {base_block!r}")
    k0 = int(k0)
    if max_levels is not None and max_levels < 0:
        raise ValueError(f"max_levels must be non-negative, got {max_levels!r}")
    valid_rows = max(info.chain_length - max_lag, 0)  # rows n with n + S < N_c
    n_levels = 0
    while k0 << n_levels <= valid_rows and (max_levels is None or n_levels < max_levels):
        n_levels += 1
    # the chunk's rows in valid base blocks, [start, block_end): the rest is outside the levels
    block_end = max(min(info.stop, valid_rows // k0 * k0), info.start)
    in_blocks = block_end - info.start
    shape = (max_lag + 1, a_ext.shape[1], b.shape[1])
    # summed over the whole input: their q d inverse transforms once, not once per segment
    partial = {
        "max_lag": max_lag,
        "base_block": k0,
        "counts": np.clip(
            np.minimum(info.stop, info.chain_length - np.arange(max_lag + 1)) - info.start,
            0,
            None,
        ),
        "sums": lagged_sums(a_ext[in_blocks:], b[in_blocks:], max_lag, ones=ones),
        "squares": lagged_sums(a_ext**2, b**2, max_lag, ones=ones),
        "n_blocks": np.zeros(n_levels, dtype=np.int64),
        "block_mean": np.zeros((n_levels, *shape)),
        "block_m2": np.zeros((n_levels, *shape)),
        "edges": {},
    }
    if in_blocks == 0:
        return partial
    # the block sums go by aligned segments, merged as separate chunks' would be: bounded memory
    if segment_rows is None:
        segment_rows = segment_length(max_lag, a_ext.shape[1] * b.shape[1], k0)
    size = k0 * max(1, segment_rows // k0)
    within = BlockInfo(info.chain, info.start, block_end, info.chain_length)
    for piece, rows in aligned_segments(within, size, max_lag):
        part = _segment_levels(
            a_ext[rows], b[rows][: piece.length], max_lag, piece, k0, n_levels, ones
        )
        _merge_levels(partial, part)
        np.add(partial["sums"], part["sums"], out=partial["sums"])
    return partial


def _segment_levels(
    a_ext: np.ndarray,
    b: np.ndarray,
    max_lag: int,
    info: BlockInfo,
    k0: int,
    levels: int,
    ones: int,
) -> Partial:
    """The ``levels`` block levels of one segment whose rows all lie in valid base blocks:
    ``"sums"`` (the total of its block sums), ``"n_blocks"``, ``"block_mean"``, ``"block_m2"``
    and ``"edges"`` as in :func:`response_block_partial`."""
    valid_rows = max(info.chain_length - max_lag, 0)
    first = info.start // k0
    block_sums = blockwise_lagged_sums(a_ext, b, max_lag, k0, info.start - first * k0, ones)
    ids = np.arange(first, -(-info.stop // k0))
    rows = np.minimum(info.stop, (ids + 1) * k0) - np.maximum(info.start, ids * k0)
    shape = block_sums.shape[1:]
    partial: Partial = {
        "sums": block_sums.sum(axis=0),
        "n_blocks": np.zeros(levels, dtype=np.int64),
        "block_mean": np.zeros((levels, *shape)),
        "block_m2": np.zeros((levels, *shape)),
        "edges": {},
    }
    for level in range(levels):
        size = k0 << level
        if level:
            ids, rows, block_sums = _pair_up(ids, rows, block_sums)
        # only the first and the last block can be cut by the segment's edges
        lo, hi = int(rows[0] < size), ids.shape[0] - int(rows[-1] < size)
        if hi > lo:
            (
                partial["n_blocks"][level],
                partial["block_mean"][level],
                partial["block_m2"][level],
            ) = _level_stats(block_sums[lo:hi], size)
        for k in {0, ids.shape[0] - 1}:
            if rows[k] < size and ids[k] < valid_rows // size:
                key = (info.chain, level, int(ids[k]))
                partial["edges"][key] = (int(rows[k]), block_sums[k].copy())  # not a view
    return partial


def _owned(partial: Partial) -> Partial:
    """A copy of ``partial`` whose arrays and edges :func:`merge_block_partial` may modify."""
    copied = {key: np.array(value) for key, value in partial.items() if key != "edges"}
    return {**copied, "max_lag": partial["max_lag"], "base_block": partial["base_block"],
            "edges": dict(partial["edges"])}  # fmt: skip


def combine_block_partials(p: Partial, q: Partial) -> Partial:
    """Merge two partials of :func:`response_block_partial` (associative, commutative).

    Level statistics merge by Chan et al.'s update; edge pieces of the same block add up, and a
    block whose rows are all in is moved to its level's statistics. Inputs are not modified
    (:func:`merge_block_partial` merges into a partial in place).
    """
    return merge_block_partial(_owned(p), q)


def merge_block_partial(total: Partial, part: Partial) -> Partial:
    """Merge ``part`` into ``total`` in place and return ``total``: the result of
    :func:`combine_block_partials`, without a copy of ``total``'s levels per merge (a running
    total over a chunk's segments, which the caller owns). ``part`` is not modified; ``total``
    must not share arrays with it."""
    for key in ("max_lag", "base_block"):
        if total[key] != part[key]:
            raise ValueError(f"cannot combine partials with {key} {total[key]} and {part[key]}")
    _merge_levels(total, part)
    total["counts"] = total["counts"] + part["counts"]
    np.add(total["sums"], part["sums"], out=total["sums"])
    np.add(total["squares"], part["squares"], out=total["squares"])
    return total


def _merge_levels(total: Partial, part: Partial) -> None:
    """The block levels and edges of ``part`` merged into ``total``'s, in place (the rest of
    :func:`merge_block_partial`)."""
    k0 = total["base_block"]
    edges = total["edges"]
    promoted: dict[int, list[np.ndarray]] = {}
    for key, (rows, block_sum) in part["edges"].items():
        if key in edges:
            rows, block_sum = rows + edges[key][0], block_sum + edges[key][1]
        level = key[1]
        if rows == k0 << level:
            edges.pop(key, None)
            promoted.setdefault(level, []).append(block_sum)
        else:
            edges[key] = (rows, block_sum)
    levels = part["n_blocks"].shape[0]
    extra = max([levels, *(k + 1 for k in promoted)]) - total["n_blocks"].shape[0]
    if extra > 0:  # the levels the part has and the total not yet, empty
        total["n_blocks"] = np.pad(total["n_blocks"], (0, extra))
        pad = ((0, extra),) + ((0, 0),) * (total["block_mean"].ndim - 1)
        for key in ("block_mean", "block_m2"):
            total[key] = np.pad(total[key], pad)
    for level in range(levels):
        n_b = int(part["n_blocks"][level])
        _merge_level(total, level, n_b, part["block_mean"][level], part["block_m2"][level])
    for level in sorted(promoted):
        _merge_level(total, level, *_level_stats(np.stack(promoted[level]), k0 << level))


@dataclass(frozen=True)
class BlockingResult:
    """Means and their block-averaging standard errors.

    Attributes
    ----------
    mean : ``(S+1, q, d)`` the estimate ``sums / counts`` (eq. 6; NaN where no pairs).
    stderr : ``(S+1, q, d)`` standard error at the chosen block size.
    block_size : ``(S+1, q, d)`` the chosen ``K`` per entry.
    converged : ``(S+1, q, d)`` whether the Lee-Needs-Drummond criterion was met.
    block_sizes : ``(levels,)`` ``K`` of each level: ``1, K0, 2 K0, ...``.
    n_blocks : ``(levels, S+1)`` blocks per level and lag.

    The standard error of every level, from which ``stderr`` is chosen, is
    :func:`block_levels` of the same partial (``levels`` times the result's size: not kept).
    """

    mean: np.ndarray
    stderr: np.ndarray
    block_size: np.ndarray
    converged: np.ndarray
    block_sizes: np.ndarray
    n_blocks: np.ndarray

    def columns(self, index: slice, axis: int = -1) -> BlockingResult:
        """The result of the entries ``index`` along ``axis`` of ``(S+1, q, d)`` (-1: ``j``,
        -2: ``i``) alone: every entry's statistics are its own, so this is what the entries'
        own pass would give."""
        entries = (slice(None),) * (axis % 3) + (index,)
        return replace(
            self,
            mean=self.mean[entries],
            stderr=self.stderr[entries],
            block_size=self.block_size[entries],
            converged=self.converged[entries],
        )


@dataclass(frozen=True)
class BlockLevels:
    """The reblocking curve: the standard error of the lagged means at every block level.

    Attributes
    ----------
    block_sizes : ``(levels,)`` ``K`` of each level: ``1, K0, 2 K0, ...``.
    n_blocks : ``(levels, S+1)`` blocks per level and lag.
    sigma : ``(levels, S+1, q, d)`` standard-error estimate of each level (NaN with < 2 blocks).
    """

    block_sizes: np.ndarray
    n_blocks: np.ndarray
    sigma: np.ndarray

    @property
    def sigma_error(self) -> np.ndarray:
        """``(levels, S+1, q, d)`` the error of each level's ``sigma``:
        ``sigma / sqrt(2 (n_b - 1))`` (NaN with fewer than 2 blocks)."""
        nb = self.n_blocks.reshape(self.n_blocks.shape + (1,) * (self.sigma.ndim - 2))
        return self.sigma / np.sqrt(np.where(nb >= 2, 2.0 * (nb - 1), np.nan))


def _sigma(m2: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``sqrt(M2 / (n (n - 1)))`` with ``n`` broadcast on the leading axes; NaN for ``n < 2``."""
    n = n.reshape(n.shape + (1,) * (m2.ndim - n.ndim)).astype(np.float64)
    ok = n >= 2
    var = np.divide(m2, n * (n - 1), out=np.full(np.broadcast(m2, n).shape, np.nan), where=ok)
    return np.sqrt(np.clip(var, 0, None))


def lagged_means(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``sums / counts`` per lag (eq. 6): ``sums`` ``(S+1, ...)``, ``counts`` ``(S+1,)`` pairs
    per lag; NaN at lags with no pairs."""
    n1 = np.asarray(counts).reshape((-1,) + (1,) * (sums.ndim - 1)).astype(np.float64)
    return np.divide(sums, n1, out=np.full(sums.shape, np.nan), where=n1 > 0)


#: bytes of one ``(levels, S+1, q, columns)`` array :func:`block_standard_error` works on at a
#: time: a result with hundreds of components on both sides is computed by groups of its
#: columns (each entry's statistics are its own), so its temporaries stay within a few times this
STANDARD_ERROR_BYTES = 64 * 2**20


def block_standard_error(partial: Partial, min_blocks: int = MIN_BLOCKS) -> BlockingResult:
    """Standard errors of the lagged means by reblocking (see the module docstring).

    Parameters
    ----------
    partial : the fully combined partial of :func:`response_block_partial` over a trajectory
        (blocks still cut, i.e. ``"edges"`` left because chunks are missing, are not counted).
    min_blocks : fewest blocks a level needs to be chosen.

    Returns
    -------
    :class:`BlockingResult`, computed by groups of the last axis' entries that keep each
    level's array within :data:`STANDARD_ERROR_BYTES`.
    """
    if min_blocks < 2:
        raise ValueError(f"min_blocks must be at least 2, got {min_blocks}")
    sums = partial["sums"]
    levels = partial["n_blocks"].shape[0] + 1
    width = max(1, STANDARD_ERROR_BYTES // (8 * levels * max(sums[..., :1].size, 1)))
    if width >= sums.shape[-1]:
        return _standard_errors(partial, min_blocks)
    out: dict[str, np.ndarray] = {}
    for lo in range(0, sums.shape[-1], width):
        columns = slice(lo, lo + width)
        piece = {
            **partial,
            **{key: partial[key][..., columns] for key in ("sums", "squares", "block_m2")},
        }
        part = _standard_errors(piece, min_blocks)
        for name in ("mean", "stderr", "block_size", "converged"):
            value = getattr(part, name)
            if name not in out:  # the whole result's arrays, filled group by group
                out[name] = np.empty((*value.shape[:-1], sums.shape[-1]), dtype=value.dtype)
            out[name][..., columns] = value
    return replace(part, **out)


def block_levels(partial: Partial) -> BlockLevels:
    """The standard error of the lagged means at every block level of ``partial`` (the
    combined partial of :func:`response_block_partial`): the reblocking curve that
    :func:`block_standard_error` chooses from (Flyvbjerg & Petersen 1989)."""
    return _means_and_levels(partial)[1]


def _means_and_levels(partial: Partial) -> tuple[np.ndarray, BlockLevels]:
    """The lagged means of ``partial`` and its :func:`block_levels` (which need the means)."""
    counts = np.asarray(partial["counts"])
    n1 = counts.reshape((-1,) + (1,) * (partial["sums"].ndim - 1)).astype(np.float64)
    mean = lagged_means(partial["sums"], counts)
    m2_unblocked = partial["squares"] - np.where(n1 > 0, partial["sums"] * mean, 0.0)
    n_lags = counts.shape[0]
    n_blocks = np.vstack([counts, np.repeat(partial["n_blocks"][:, None], n_lags, axis=1)])
    sigma = np.concatenate(
        [_sigma(m2_unblocked, counts)[None], _sigma(partial["block_m2"], partial["n_blocks"])]
    )
    block_sizes = np.r_[1, partial["base_block"] << np.arange(partial["n_blocks"].shape[0])]
    return mean, BlockLevels(block_sizes, n_blocks, sigma)


def _standard_errors(partial: Partial, min_blocks: int) -> BlockingResult:
    """:func:`block_standard_error` of all the partial's entries at once."""
    counts = np.asarray(partial["counts"])
    n1 = counts.reshape((-1,) + (1,) * (partial["sums"].ndim - 1)).astype(np.float64)
    mean, levels = _means_and_levels(partial)
    block_sizes, n_blocks, sigma = levels.block_sizes, levels.n_blocks, levels.sigma
    nb = n_blocks.reshape(n_blocks.shape + (1,) * (sigma.ndim - 2)).astype(np.float64)

    enough = (nb >= min_blocks) & np.isfinite(sigma)
    ratio = np.divide(sigma, sigma[:1], out=np.ones(sigma.shape), where=sigma[:1] > 0)
    sizes = block_sizes.reshape((-1,) + (1,) * (sigma.ndim - 1)).astype(np.float64)
    criterion = enough & (sizes**3 > 2 * n1[None] * ratio**4)
    fallback = np.where(enough.any(axis=0), sigma.shape[0] - 1 - np.argmax(enough[::-1], axis=0), 0)
    # on the plateau though short of the criterion (many short chains: blocks of 512 rows of
    # chains 50 correlation times long, pooled into many blocks, fail K³ > 2 N r⁴ alone)
    on_plateau = np.take_along_axis(
        enough & (sizes * PLATEAU_BIAS > ratio**2), fallback[None], axis=0
    )[0]
    met = criterion.any(axis=0)
    converged = met | on_plateau
    chosen = np.where(met, np.argmax(criterion, axis=0), fallback)
    stderr = np.take_along_axis(sigma, chosen[None], axis=0)[0]
    return BlockingResult(
        mean=mean,
        stderr=stderr,
        block_size=block_sizes[chosen],
        converged=converged,
        block_sizes=block_sizes,
        n_blocks=n_blocks,
    )
