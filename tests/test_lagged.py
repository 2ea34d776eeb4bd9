"""Lagged sums by FFT against their O(N S) brute-force twin, and invariance under chunking."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kelr_dist.kernels.reduction import Reduction, reduce_in_memory
from kelr_dist.kernels.response import lagged
from kelr_dist.kernels.response.lagged import (
    blockwise_lagged_sums,
    lagged_sums,
    strided_lagged_sums,
)
from kelr_dist.testing import lag_counts


def brute_lagged_sums(a: np.ndarray, b: np.ndarray, max_lag: int) -> np.ndarray:
    """out[s, i, j] = sum_{n < len(b), n + s < len(a)} a[n+s, i] b[n, j], one lag at a time."""
    out = np.zeros((max_lag + 1, a.shape[1], b.shape[1]))
    for s in range(max_lag + 1):
        n = min(len(b), len(a) - s)
        if n > 0:
            out[s] = np.einsum("ni,nj->ij", a[s : s + n], b[:n])
    return out


def assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float = 1e-12) -> None:
    """Relative agreement, measured against the largest entry (FFT rounding is absolute)."""
    scale = max(np.abs(expected).max(), 1e-300)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize(
    ("len_a", "len_b", "max_lag", "block_rows"),
    [
        (120, 100, 20, None),  # halo of S rows
        (107, 100, 20, 16),  # short halo (end of chain), many sub-blocks
        (100, 100, 0, 7),  # S = 0: plain products
        (30, 5, 40, 3),  # S beyond the rows: lags past len(a) are zero
        (400, 100, 10, 64),  # a longer than needed
        (0, 0, 3, None),  # empty
    ],
)
def test_lagged_sums_matches_brute_force(len_a, len_b, max_lag, block_rows):
    rng = np.random.default_rng(len_a + 7 * len_b)
    a, b = rng.normal(size=(len_a, 3)), rng.normal(size=(len_b, 2))
    out = lagged_sums(a, b, max_lag, block_rows=block_rows)
    assert out.shape == (max_lag + 1, 3, 2)
    assert_close(out, brute_lagged_sums(a, b, max_lag))


@pytest.mark.parametrize("direct", [True, False], ids=["directly", "by-transforms"])
@pytest.mark.parametrize(
    ("length", "halo", "max_lag", "origins"),
    [
        (100, 20, 20, slice(3, None, 4)),
        (100, 20, 20, slice(0, None, 2)),
        (100, 20, 20, slice(1, None, 32)),
        (100, 5, 20, slice(2, None, 8)),  # short halo (end of chain)
        (100, 5, 40, slice(2, None, 3)),
        (100, 0, 7, slice(0, None, 1)),  # every row
        (10, 0, 4, slice(9, None, 16)),  # one origin
        (3, 0, 40, slice(5, None, 64)),  # a chain's last rows, no origin, shorter than S
        (5000, 30, 30, slice(7, None, 6)),  # several sub-blocks, a stride not a power of two
    ],
)
def test_strided_lagged_sums_are_the_sums_of_b_spread_on_its_origins(
    monkeypatch, direct, length, halo, max_lag, origins
):
    # either way of summing, whatever the rule between them would choose
    monkeypatch.setattr(lagged, "STRIDED_LAGS", 10**9 if direct else 0)
    rng = np.random.default_rng(length + halo + max_lag)
    rows = range(length)[origins]
    a, b = rng.normal(size=(length + halo, 3)), rng.normal(size=(len(rows), 2))
    spread = np.zeros((length, 2))
    spread[origins] = b
    out = strided_lagged_sums(a, b, max_lag, origins, length)
    assert out.shape == (max_lag + 1, 3, 2)
    assert_close(out, brute_lagged_sums(a, spread, max_lag))


@pytest.mark.parametrize("products", [True, False], ids=["by-products", "element-wise"])
@pytest.mark.parametrize("origins", [slice(0, None, 1), slice(2, None, 3)])
def test_summed_cross_spectra_by_matrix_products_or_element_wise(monkeypatch, products, origins):
    """The cross spectra summed over the sub-blocks, as one matrix product per frequency or
    element by element, give the brute-force sums; on strided origins too, whose spectrum
    repeats along the frequencies."""
    monkeypatch.setattr(lagged, "MATMUL_COLUMNS", 1 if products else 10**9)
    monkeypatch.setattr(lagged, "STRIDED_LAGS", 0)  # by transforms
    rng = np.random.default_rng(3)
    length, max_lag = 3000, 40
    rows = range(length)[origins]
    a, b = rng.normal(size=(length + max_lag, 3)), rng.normal(size=(len(rows), 2))
    spread = np.zeros((length, 2))
    spread[origins] = b
    out = strided_lagged_sums(a, b, max_lag, origins, length)
    assert_close(out, brute_lagged_sums(a, spread, max_lag))
    assert_close(lagged_sums(a, spread, max_lag, block_rows=256), out)


@pytest.mark.parametrize("max_lag", [6, 0])  # S = 0: block sums of products, no transform
@pytest.mark.parametrize("offset", [0, 1, 9])
def test_blockwise_lagged_sums_are_the_sums_of_each_block(offset, max_lag):
    rng = np.random.default_rng(offset)
    block = 10
    a, b = rng.normal(size=(58, 2)), rng.normal(size=(55, 2))
    out = blockwise_lagged_sums(a, b, max_lag, block, offset=offset)
    assert out.shape == (-(-(offset + 55) // block), max_lag + 1, 2, 2)
    for k, part in enumerate(out):
        lo, hi = max(k * block - offset, 0), min((k + 1) * block - offset, 55)
        assert_close(part, brute_lagged_sums(a[lo:], b[lo:hi], max_lag))


@pytest.mark.parametrize("ones", [1, 2])
@pytest.mark.parametrize(
    ("len_a", "len_b", "max_lag", "block", "offset"),
    [
        (120, 100, 20, 16, 0),  # a halo of S rows, several blocks
        (107, 100, 20, 16, 5),  # short halo (end of chain), the first block cut
        (30, 5, 40, 4, 3),  # S beyond the rows: lags past len(a) are zero
        (100, 100, 0, 7, 0),  # S = 0: plain products
        (3, 3, 6, 8, 7),  # one block, cut at both ends
    ],
)
def test_columns_of_ones_are_summed_over_windows_as_the_transforms_sum_them(
    len_a, len_b, max_lag, block, offset, ones
):
    rng = np.random.default_rng(len_a + len_b + block)
    a, b = rng.normal(size=(len_a, 3)), rng.normal(size=(len_b, 4))
    b[:, 4 - ones :] = 1.0
    out = blockwise_lagged_sums(a, b, max_lag, block, offset, ones=ones)
    assert_close(out, blockwise_lagged_sums(a, b, max_lag, block, offset))
    assert_close(lagged_sums(a, b, max_lag, block, ones=ones), brute_lagged_sums(a, b, max_lag))
    only_ones = b[:, 4 - ones :]
    assert_close(
        blockwise_lagged_sums(a, only_ones, max_lag, block, offset, ones=ones),
        blockwise_lagged_sums(a, only_ones, max_lag, block, offset),
    )


def test_more_columns_of_ones_than_b_has_are_refused():
    a, b = np.ones((10, 2)), np.ones((8, 2))
    for bad in (3, -1, 1.5):
        with pytest.raises(ValueError, match="ones must be an integer in"):
            lagged_sums(a, b, 2, ones=bad)
        with pytest.raises(ValueError, match="ones must be an integer in"):
            blockwise_lagged_sums(a, b, 2, 4, ones=bad)


def test_lag_counts():
    np.testing.assert_array_equal(lag_counts([5, 3], 4), [8, 6, 4, 2, 1])
    np.testing.assert_array_equal(lag_counts(10, 2), [10, 9, 8])


@pytest.mark.parametrize(
    ("a", "b", "max_lag", "match"),
    [
        (np.ones(5), np.ones((5, 1)), 2, "a must be 2-D"),
        (np.ones((5, 1)), np.ones((6, 1)), 2, "at least as many rows"),
        (np.ones((5, 1)), np.ones((5, 1)), -1, "max_lag"),
        (np.ones((5, 1)), np.ones((5, 1)), 1.5, "max_lag"),
    ],
)
def test_lagged_sums_rejects_bad_input(a, b, max_lag, match):
    with pytest.raises(ValueError, match=match):
        lagged_sums(a, b, max_lag)


def test_bad_block_and_counts_arguments():
    with pytest.raises(ValueError, match="block"):
        lagged_sums(np.ones((5, 1)), np.ones((5, 1)), 1, block_rows=0)
    with pytest.raises(ValueError, match="offset"):
        blockwise_lagged_sums(np.ones((5, 1)), np.ones((5, 1)), 1, 4, offset=4)
    with pytest.raises(ValueError, match="chain_lengths"):
        lag_counts([5, -1], 2)


def lagged_reduction(q: int, max_lag: int) -> Reduction:
    """Columns ``[:q]`` of the trajectory are A, the rest B; A's halo comes from the engine."""

    def chunk(x, info, halo):
        a_ext = x[:, :q] if halo is None else np.concatenate([x[:, :q], halo[:, :q]])
        return lagged_sums(a_ext, x[:, q:], max_lag, block_rows=8)

    return Reduction("lagged", chunk, halo=max_lag)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 90),
    max_lag=st.integers(0, 12),
    cuts=st.lists(st.integers(1, 89), max_size=6),
    seed=st.integers(0, 2**16),
)
def test_any_chunking_gives_the_whole_series_sums(n, max_lag, cuts, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, n, 3))  # two chains, A = column 0, B = columns 1, 2
    edges = sorted({0, n, *(c for c in cuts if c < n)})
    chunks = np.diff(edges).tolist()
    reduction = lagged_reduction(1, max_lag)
    whole = reduce_in_memory(reduction, x)
    expected = sum(brute_lagged_sums(c[:, :1], c[:, 1:], max_lag) for c in x)
    assert_close(whole, expected)
    assert_close(reduce_in_memory(reduction, x, chunks), whole)


def test_sub_blocks_are_no_longer_than_the_rows_given():
    # a segment of a thousand rows is transformed at about its own length, not at four thousand
    assert lagged.default_block_rows(100) == 1024
    assert lagged.default_block_rows(1000) == 4096
    assert lagged.default_block_rows(100, rows=300) == 512
    assert lagged.default_block_rows(1000, rows=1024) == 1024
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(1124, 3)), rng.normal(size=(1024, 2))
    assert_close(lagged_sums(a, b, 100), brute_lagged_sums(a, b, 100))
