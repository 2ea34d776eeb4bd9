"""Block-averaging error bars: brute-force reblocking twin, chunking invariance, oracles."""

import numpy as np
import pytest
import scipy.fft
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.signal import lfilter

from kelr_dist.kernels.reduction import BlockInfo, Reduction, reduce_in_memory
from kelr_dist.kernels.response.blocking import (
    MIN_BLOCKS,
    block_levels,
    block_standard_error,
    combine_block_partials,
    default_base_block,
    fitted_base_block,
    merge_block_partial,
    response_block_partial,
    useful_levels,
)
from kelr_dist.kernels.response.lagged import lagged_sums
from kelr_dist.testing import lag_counts


def blocking_reduction(
    q: int, max_lag: int, base_block: int, max_levels=None, finalize=block_standard_error
) -> Reduction:
    """Columns ``[:q]`` of the trajectory are A, the rest B; the chunk appends A's halo."""

    def chunk(x, info, halo):
        a_ext = x[:, :q] if halo is None else np.concatenate([x[:, :q], halo[:, :q]])
        return response_block_partial(a_ext, x[:, q:], max_lag, info, base_block, max_levels)

    return Reduction("blocking", chunk, combine_block_partials, finalize, max_lag)


def brute_sigma(x: np.ndarray, q: int, max_lag: int, lag: int, size: int) -> tuple[int, np.ndarray]:
    """Blocks and standard error of lag ``lag`` at block size ``size``, from the series y itself.

    y_n = A(X_{n+s}) (x) B(X_n); blocks of ``size`` rows aligned to each chain's start, only
    rows with n + S < N_c; block means of all chains pooled.
    """
    means = []
    for chain in x:
        a, b = chain[:, :q], chain[:, q:]
        n = chain.shape[0] - lag
        y = a[lag:, :, None] * b[:n, None, :]
        n_blocks = (chain.shape[0] - max_lag) // size
        means.extend(y[k * size : (k + 1) * size].mean(axis=0) for k in range(n_blocks))
    means = np.array(means)
    return len(means), np.sqrt(means.var(axis=0, ddof=1) / len(means))


def test_levels_match_brute_force_reblocking():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 300, 3)) + 0.5
    x[1, 150:] *= 3.0  # heterogeneous chains
    max_lag, k0, q = 5, 8, 2
    res = reduce_in_memory(blocking_reduction(q, max_lag, k0, finalize=block_levels), x, chunks=37)
    assert res.block_sizes.tolist() == [1, 8, 16, 32, 64, 128, 256]
    for lag in (0, 3, 5):
        for level, size in enumerate(res.block_sizes):
            if size == 1:  # the unblocked level uses every pair, not only rows with n + S < N
                y = np.concatenate([c[lag:, :q, None] * c[: 300 - lag, None, q:] for c in x])
                n, sigma = len(y), np.sqrt(y.var(axis=0, ddof=1) / len(y))
            else:
                n, sigma = brute_sigma(x, q, max_lag, lag, size)
            assert res.n_blocks[level, lag] == n
            if n >= 2:
                np.testing.assert_allclose(res.sigma[level, lag], sigma, rtol=1e-11)
                np.testing.assert_allclose(
                    res.sigma_error[level, lag], sigma / np.sqrt(2 * (n - 1)), rtol=1e-11
                )
            else:
                assert np.isnan(res.sigma[level, lag]).all()
    capped = reduce_in_memory(
        blocking_reduction(q, max_lag, k0, max_levels=2, finalize=block_levels), x, chunks=37
    )
    assert capped.block_sizes.tolist() == [1, 8, 16]
    np.testing.assert_allclose(capped.sigma, res.sigma[:3], rtol=1e-11)
    expected = sum(lagged_sums(c[:, :q], c[:, q:], max_lag) for c in x)
    mean = reduce_in_memory(blocking_reduction(q, max_lag, k0), x, chunks=37).mean
    np.testing.assert_allclose(mean, expected / lag_counts([300, 300], max_lag)[:, None, None])


def test_one_chunk_partial_sums_are_the_lagged_sums():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1000, 2))
    info = BlockInfo(0, 100, 700, 1000)
    a_ext, b = x[100:710, :1], x[100:700, 1:]
    part = response_block_partial(a_ext, b, 10, info, base_block=64)
    np.testing.assert_allclose(part["sums"], lagged_sums(a_ext, b, 10), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(part["squares"], lagged_sums(a_ext**2, b**2, 10), rtol=1e-12)
    np.testing.assert_array_equal(part["counts"], np.full(11, 600))
    # blocks 1 (rows 64..127, cut at 100) and 10 (640..703, cut at 700) are edges at level 0
    assert {k for k in part["edges"] if k[1] == 0} == {(0, 0, 1), (0, 0, 10)}
    assert part["n_blocks"][0] == 8


def test_segments_of_a_long_chunk_give_the_same_partial():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(500, 3))
    info = BlockInfo(0, 13, 490, 500)
    a_ext, b = x[13:497, :2], x[13:490, 2:]
    whole = response_block_partial(a_ext, b, 7, info, base_block=4, segment_rows=10**6)
    split = response_block_partial(a_ext, b, 7, info, base_block=4, segment_rows=16)
    assert split["edges"].keys() == whole["edges"].keys()
    for key, value in _flatten(whole).items():
        np.testing.assert_allclose(split[key], value, rtol=1e-12, atol=1e-12, err_msg=key)


class InverseTransforms:
    """A scipy.fft backend that counts the inverse real transforms and leaves the work to
    scipy's own (``NotImplemented``)."""

    __ua_domain__ = "numpy.scipy.fft"

    def __init__(self):
        self.count = 0

    def __ua_function__(self, method, args, kwargs):
        if method.__name__ == "irfft":
            x = np.asarray(args[0])
            self.count += x.size // x.shape[kwargs.get("axis", -1)]
        return NotImplemented


def test_the_summed_quantities_pay_their_inverse_transforms_once_whatever_the_segments():
    """The squares and the rows outside the blocks are lagged sums of the whole input, ``q d``
    inverse transforms each; only the block sums, one transform per base block, go by
    segments: the count is the same for segments of one base block and one segment."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(600, 5))
    info = BlockInfo(0, 13, 590, 600)  # base blocks 0..73 of 8 rows are valid (S = 7)
    a_ext, b = x[13:597, :2], x[13:590, 2:]
    counts = []
    for segment_rows in (8, 10**6):
        counter = InverseTransforms()
        with scipy.fft.set_backend(counter):
            response_block_partial(a_ext, b, 7, info, base_block=8, segment_rows=segment_rows)
        counts.append(counter.count)
    q, d, base_blocks = 2, 3, 73 - 13 // 8  # blocks 1..73 touched by the rows [13, 584)
    assert counts == [(base_blocks + 2) * q * d] * 2


def _flatten(partial):
    return {k: v for k, v in partial.items() if k != "edges"}


def test_merge_in_place_is_the_combine_and_leaves_the_inputs_alone():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(300, 3))
    parts = [
        response_block_partial(x[lo : hi + 5, :2], x[lo:hi, 2:], 5, BlockInfo(0, lo, hi, 300), 4)
        for lo, hi in [(0, 37), (37, 150), (150, 300)]
    ]
    snapshot = [{k: np.copy(v) for k, v in _flatten(p).items()} for p in parts]
    combined = combine_block_partials(combine_block_partials(parts[0], parts[1]), parts[2])
    for before, part in zip(snapshot, parts, strict=True):  # the combine copies
        for key, value in before.items():
            np.testing.assert_array_equal(part[key], value, err_msg=key)
    total = combine_block_partials(parts[0], parts[1])
    assert merge_block_partial(total, parts[2]) is total
    assert total["edges"].keys() == combined["edges"].keys()
    for key, value in _flatten(combined).items():  # the same operations: equal to the bit
        np.testing.assert_array_equal(total[key], value, err_msg=key)
    for key, value in snapshot[2].items():
        np.testing.assert_array_equal(parts[2][key], value, err_msg=key)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 260), min_size=1, max_size=3),
    max_lag=st.integers(0, 9),
    base_block=st.sampled_from([1, 4, 8, 16]),
    cuts=st.lists(st.integers(1, 259), max_size=6),
    order_seed=st.integers(0, 2**16),
)
def test_any_chunking_and_combine_order_give_the_one_chunk_result(
    lengths, max_lag, base_block, cuts, order_seed
):
    rng = np.random.default_rng(order_seed)
    chains = [rng.normal(size=(n, 3)) for n in lengths]
    reduction = blocking_reduction(2, max_lag, base_block)
    partials, whole = [], []
    for c, chain in enumerate(chains):
        n = chain.shape[0]
        edges = sorted({0, n, *(k for k in cuts if k < n)})
        for start, stop in zip(edges[:-1], edges[1:], strict=True):
            halo = chain[stop : stop + max_lag]
            partials.append(reduction.chunk(chain[start:stop], BlockInfo(c, start, stop, n), halo))
        whole.append(reduction.chunk(chain, BlockInfo(c, 0, n, n), chain[n:]))
    # tree-reduce the chunk partials in a random order
    while len(partials) > 1:
        i, j = rng.choice(len(partials), size=2, replace=False)
        merged = combine_block_partials(partials[i], partials[j])
        partials = [p for k, p in enumerate(partials) if k not in (i, j)] + [merged]
    split, one = partials[0], whole[0]
    for part in whole[1:]:
        one = combine_block_partials(one, part)
    assert split["edges"] == {} and one["edges"] == {}
    np.testing.assert_array_equal(split["counts"], lag_counts(lengths, max_lag))
    for key, value in _flatten(one).items():
        scale = max(np.abs(value).max(initial=0.0), 1e-300)
        np.testing.assert_allclose(split[key], value, rtol=1e-12, atol=1e-12 * scale, err_msg=key)
    a, b = block_levels(split), block_levels(one)
    np.testing.assert_array_equal(a.n_blocks, b.n_blocks)
    np.testing.assert_allclose(a.sigma, b.sigma, rtol=1e-10, atol=1e-14)


def ar1(n: int, rho: float, seed: int, chains: int = 1) -> np.ndarray:
    """Stationary AR(1) chains ``(chains, n)`` with unit variance."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(size=(chains, n)) * np.sqrt(1 - rho**2)
    noise[:, 0] = rng.normal(size=chains)
    return lfilter([1.0], [1.0, -rho], noise, axis=1)


@pytest.mark.parametrize("rho", [0.0, 0.9])
def test_standard_error_of_an_ar1_mean_matches_the_analytic_value(rho):
    n, chains = 2**17, 2
    x = ar1(n, rho, seed=3, chains=chains)
    traj = np.stack([x, np.ones_like(x)], axis=-1)  # A = x, B = 1, S = 0
    res = reduce_in_memory(blocking_reduction(1, 0, None), traj, chunks=10_000)
    unblocked = reduce_in_memory(
        blocking_reduction(1, 0, None, finalize=block_levels), traj, chunks=10_000
    ).sigma[0, 0, 0, 0]
    expected = np.sqrt((1 + rho) / ((1 - rho) * n * chains))  # sigma^2 = 1
    assert res.converged[0, 0, 0]
    assert res.stderr[0, 0, 0] == pytest.approx(expected, rel=0.15)
    if rho == 0.0:  # i.i.d.: the unblocked level is sigma / sqrt(N) already
        assert unblocked == pytest.approx(expected, rel=0.02)
    else:  # correlated: naive error far too small, chosen block well past the correlation time
        assert unblocked < 0.3 * expected
        assert res.block_size[0, 0, 0] >= 256


@pytest.mark.parametrize("rho", [0.5, 0.99])
def test_the_levels_past_the_useful_ones_change_nothing(rho):
    """A partial cut to :func:`useful_levels` (the levels with at least MIN_BLOCKS blocks over
    the chains) gives the standard errors, block sizes and flags of one with every level, and
    holds fewer: the longer levels are never chosen."""
    n, chains, max_lag, k0 = 40_000, 3, 20, 64
    x = ar1(n, rho, seed=7, chains=chains)
    traj = np.stack([x, np.roll(x, 3, axis=1)], axis=-1)
    levels = useful_levels(k0, chains, n, max_lag)
    assert chains * ((n - max_lag) // (k0 << (levels - 1))) >= MIN_BLOCKS
    assert chains * ((n - max_lag) // (k0 << levels)) < MIN_BLOCKS
    every = reduce_in_memory(blocking_reduction(1, max_lag, k0), traj, chunks=7_000)
    cut = reduce_in_memory(blocking_reduction(1, max_lag, k0, levels), traj, chunks=7_000)
    assert cut.block_sizes.shape[0] == levels + 1 < every.block_sizes.shape[0]
    np.testing.assert_array_equal(cut.stderr, every.stderr)
    np.testing.assert_array_equal(cut.block_size, every.block_size)
    np.testing.assert_array_equal(cut.converged, every.converged)
    assert useful_levels(k0, 1, 10 * k0, max_lag) == 1  # never none


def test_too_few_blocks_is_flagged_not_converged():
    x = ar1(2000, 0.99, seed=4)[0]
    traj = np.stack([x, np.ones_like(x)], axis=-1)
    res = reduce_in_memory(blocking_reduction(1, 0, 16), traj, chunks=300)
    assert not res.converged[0, 0, 0]
    assert res.n_blocks[res.block_sizes == res.block_size[0, 0, 0]][0, 0] >= 32


def test_many_short_chains_long_against_the_correlation_time_are_converged():
    """400 chains of 1024 rows of an AR(1) with ρ = 0.95 (τ ≈ 20 rows): no level within a chain
    meets K³ > 2 N r⁴ with 4e5 rows pooled (it asks for K > 1077), but whole-chain blocks are on
    the plateau, and the error is right; chains short against τ (ρ = 0.998, τ ≈ 500) stay
    flagged."""
    n, chains, rho = 1024, 400, 0.95
    x = ar1(n, rho, seed=5, chains=chains)
    traj = np.stack([x, np.ones_like(x)], axis=-1)
    res = reduce_in_memory(blocking_reduction(1, 0, 256), traj, chunks=n)
    assert res.converged[0, 0, 0] and res.block_size[0, 0, 0] == n
    expected = np.sqrt((1 + rho) / ((1 - rho) * n * chains))
    assert res.stderr[0, 0, 0] == pytest.approx(expected, rel=0.15)
    slow = ar1(n, 0.998, seed=6, chains=chains)
    res = reduce_in_memory(
        blocking_reduction(1, 0, 256), np.stack([slow, np.ones_like(slow)], axis=-1), chunks=n
    )
    assert not res.converged[0, 0, 0]


def test_default_base_block():
    assert default_base_block(0) == 256
    assert default_base_block(2000) == 2048
    assert default_base_block(2048) == 2048


def test_fitted_base_block_spans_the_lags_and_leaves_blocks_in_every_chain():
    # long data: four largest lags per block
    assert fitted_base_block(200, 1, 10**7) == 1024
    assert fitted_base_block(2000, 1, 10**7) == 8192
    assert fitted_base_block(10, 1, 10**7) == 256  # never below the default
    # too few blocks in all (256), or in one chain (4): halved down to the default
    assert fitted_base_block(200, 1, 200_000) == 512
    assert fitted_base_block(200, 1, 50_000) == 256
    assert fitted_base_block(200, 1000, 2_000) == 256
    for lag, chains, rows in ((200, 1, 10**7), (2000, 3, 10**6), (600, 50, 30_000)):
        k0 = fitted_base_block(lag, chains, rows)
        assert k0 >= default_base_block(lag) and k0 & (k0 - 1) == 0


def test_a_longer_base_block_keeps_the_levels_it_shares():
    """The levels are aligned to the time index: a base block twice as long gives the same
    means and the same statistics on every level the two share."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((20_000, 2)), rng.standard_normal((20_000, 1))
    info = BlockInfo(0, 0, 20_000 - 30, 20_000)
    short = response_block_partial(a, b[: info.stop], 30, info, base_block=256)
    long = response_block_partial(a, b[: info.stop], 30, info, base_block=1024)
    assert np.allclose(short["sums"], long["sums"], rtol=1e-12)
    assert np.array_equal(short["n_blocks"][2:], long["n_blocks"])
    assert np.allclose(short["block_m2"][2:], long["block_m2"], rtol=1e-10)


def test_rejects_bad_input():
    x = np.ones((100, 1))
    info = BlockInfo(0, 0, 50, 100)
    with pytest.raises(ValueError, match="halo"):
        response_block_partial(x[:50], x[:50], 5, info)
    with pytest.raises(ValueError, match="rows but the block"):
        response_block_partial(x[:55], x[:40], 5, info)
    with pytest.raises(ValueError, match="base_block"):
        response_block_partial(x[:55], x[:50], 5, info, base_block=0)
    with pytest.raises(ValueError, match="base_block"):
        response_block_partial(x[:55], x[:50], 5, info, base_block=8.5)
    part = response_block_partial(x[:55], x[:50], 5, info, base_block=8)
    other = response_block_partial(x[:55], x[:50], 5, info, base_block=16)
    with pytest.raises(ValueError, match="base_block"):
        combine_block_partials(part, other)
    with pytest.raises(ValueError, match="min_blocks"):
        block_standard_error(part, min_blocks=1)


def test_columns_of_a_wide_result_are_the_result_of_those_columns_alone():
    # one partial for several scores side by side, sliced per score, is each score's own pass
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 3000, 5))
    info = BlockInfo(0, 0, 3000, 3000)
    wide = block_standard_error(response_block_partial(x[0, :, :2], x[0, :, 2:], 8, info, 16))
    for cols in (slice(0, 1), slice(1, 3)):
        alone = block_standard_error(
            response_block_partial(x[0, :, :2], x[0, :, 2:][:, cols], 8, info, 16)
        )
        part = wide.columns(cols)
        for field in ("mean", "stderr", "block_size", "converged"):
            np.testing.assert_allclose(getattr(part, field), getattr(alone, field), rtol=1e-12)


def test_a_wide_result_by_groups_of_columns_is_the_result_at_once(monkeypatch):
    """With hundreds of columns the standard errors go by groups of columns
    (STANDARD_ERROR_BYTES); each entry's statistics are its own, so the result is the same."""
    from kelr_dist.kernels.response import blocking

    rng = np.random.default_rng(5)
    x = rng.normal(size=(4000, 9))
    info = BlockInfo(0, 0, 4000, 4000)
    partial = response_block_partial(x[:, :2], x[:, 2:], 8, info, 16)
    whole = block_standard_error(partial)
    level_bytes = 8 * (partial["n_blocks"].shape[0] + 1) * 9 * 2  # one column of every level
    monkeypatch.setattr(blocking, "STANDARD_ERROR_BYTES", 3 * level_bytes)  # groups of 3 of 7
    grouped = block_standard_error(partial)
    for field in ("mean", "stderr", "block_size", "converged"):
        np.testing.assert_array_equal(getattr(grouped, field), getattr(whole, field))
    np.testing.assert_array_equal(grouped.n_blocks, whole.n_blocks)
