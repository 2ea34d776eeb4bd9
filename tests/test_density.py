"""Kernel-embedding density (eq. 39, eq. 40): chunking invariance, truncation without refit,
brute-force twins, finite differences, accuracy on known non-Gaussian densities, bad input."""

import itertools
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from kelr_dist.kernels.baselines import kde
from kelr_dist.kernels.bases.families import Coordinate, Hermite, Laguerre, TensorBasis
from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.kernels.scores.kernel_embedding import (
    VARIANCE_STRIDE,
    KernelDensity,
    coefficient_reduction,
    coefficient_sums,
)

# --------------------------------------------------------------------------- helpers


def make_basis(families: str, order, index_set: str = "total") -> TensorBasis:
    """``families`` like "hl" (Hermite, Laguerre); affine maps deliberately not the identity."""
    coords = [
        Coordinate(Hermite(), loc=0.3, scale=1.2)
        if f == "h"
        else Coordinate(Laguerre(theta=1.0), loc=-0.5, scale=0.8)
        for f in families
    ]
    return TensorBasis(tuple(coords), order, index_set)


def samples(families: str, n: int, rng: np.random.Generator) -> np.ndarray:
    cols = [rng.normal(0.3, 1.0, n) if f == "h" else rng.gamma(2.0, 0.8, n) for f in families]
    return np.column_stack(cols)


def brute_force(density: KernelDensity, x: np.ndarray, order=None):
    """p_M and grad p_M by an explicit loop over the multi-indices (Coordinate.evaluate)."""
    basis = density.basis
    tables = [c.evaluate(x[:, k], max(basis.max_orders)) for k, c in enumerate(basis.coordinates)]
    keep = density.mask(order)
    p = np.zeros(x.shape[0])
    grad = np.zeros(x.shape)
    for m, c, kept in zip(basis.indices, density.coefficients, keep, strict=True):
        if not kept:
            continue
        values = [tables[k][0][:, mk] for k, mk in enumerate(m)]
        p += c * np.prod(values, axis=0)
        for j in range(basis.dim):
            factors = [tables[k][1][:, mk] if k == j else values[k] for k, mk in enumerate(m)]
            grad[:, j] += c * np.prod(factors, axis=0)
    return p, grad


def brute_force_coefficients(basis: TensorBasis, x: np.ndarray) -> np.ndarray:
    """eq. 39 as a loop: mean over samples of prod_k psi_{m_k}(y_k) W^{1-beta}(y_k)."""
    tables = [
        c.coefficient_table(x[:, k], max(basis.max_orders)) for k, c in enumerate(basis.coordinates)
    ]
    return np.array(
        [
            np.mean(np.prod([tables[k][:, mk] for k, mk in enumerate(m)], axis=0))
            for m in basis.indices
        ]
    )


CASES = [
    ("h", 12, "total"),
    ("l", 12, "total"),
    ("hl", 9, "total"),
    ("lh", (6, 4), "box"),
    ("hhl", 6, "total"),
    ("lhh", (3, 4, 2), "box"),
]


# --------------------------------------------------------------------------- partial sums


@settings(max_examples=30, deadline=None)
@given(
    case=st.sampled_from(CASES),
    seed=st.integers(0, 2**32 - 1),
    cuts=st.lists(st.integers(1, 299), min_size=1, max_size=6),
)
def test_coefficients_any_chunking_equal_one_chunk(case, seed, cuts):
    families, order, index_set = case
    basis = make_basis(families, order, index_set)
    x = samples(families, 300, np.random.default_rng(seed))
    edges = sorted(set(cuts))
    lengths = np.diff([0, *edges, 300]).tolist()
    whole = reduce_in_memory(coefficient_reduction(basis), x)
    split = reduce_in_memory(coefficient_reduction(basis), x, lengths)
    assert split.n == whole.n == 300
    scale = np.abs(whole.coefficients).max()
    np.testing.assert_allclose(
        split.coefficients, whole.coefficients, rtol=1e-12, atol=1e-12 * scale
    )
    np.testing.assert_allclose(split.variances, whole.variances, rtol=1e-10, atol=1e-12 * scale**2)


@pytest.mark.parametrize("case", CASES)
def test_coefficients_equal_brute_force(case):
    families, order, index_set = case
    basis = make_basis(families, order, index_set)
    x = samples(families, 200, np.random.default_rng(5))
    density = KernelDensity.fit(basis, x)
    np.testing.assert_allclose(
        density.coefficients, brute_force_coefficients(basis, x), rtol=1e-12, atol=1e-13
    )
    # psi_0 = l_0 = 1 and beta = 1: the zeroth coefficient is exactly 1, with no variance
    zero = np.all(basis.indices == 0, axis=1)
    assert density.coefficients[zero] == pytest.approx(1.0, abs=1e-14)
    assert density.variances[zero] == pytest.approx(0.0, abs=1e-14)


def test_coefficients_of_the_weight_itself_vanish():
    # data distributed as the weight W x G(.; 1) in mapped coordinates:
    # E[psi_m l_k] = delta_m0 delta_k0
    rng = np.random.default_rng(11)
    n = 200_000
    basis = TensorBasis((Coordinate(Hermite(), 1.0, 2.0), Coordinate(Laguerre(1.0), 0.5, 0.5)), 6)
    x = np.column_stack([1.0 + 2.0 * rng.standard_normal(n), 0.5 + 0.5 * rng.gamma(2.0, 1.0, n)])
    density = KernelDensity.fit(basis, x)
    rest = ~np.all(basis.indices == 0, axis=1)
    z = density.coefficients[rest] / np.sqrt(density.variances[rest])
    assert np.abs(z).max() < 5.0  # Monte-Carlo noise only
    assert np.abs(density.coefficients[rest]).max() < 0.02


# --------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize("case", CASES)
def test_lower_order_evaluation_equals_fit_at_that_order(case):
    families, order, index_set = case
    x = samples(families, 400, np.random.default_rng(3))
    points = samples(families, 50, np.random.default_rng(4))
    high = KernelDensity.fit(make_basis(families, order, index_set), x)
    low_order = tuple(max(o - 2, 0) for o in order) if isinstance(order, tuple) else order - 3
    low = KernelDensity.fit(make_basis(families, low_order, index_set), x)
    p_high, g_high = high.evaluate(points, order=low_order)
    p_low, g_low = low.evaluate(points)
    np.testing.assert_allclose(p_high, p_low, rtol=1e-12, atol=1e-14 * np.abs(p_low).max())
    np.testing.assert_allclose(g_high, g_low, rtol=1e-12, atol=1e-14 * np.abs(g_low).max())


@pytest.mark.parametrize(
    ("order", "index_set", "low"), [(9, "total", 4), ((12, 2), "box", 5), ((12, 2), "box", (6, 1))]
)
def test_truncation_is_the_same_function_on_a_smaller_basis(order, index_set, low):
    density = KernelDensity.fit(
        make_basis("hh", order, index_set), samples("hh", 400, np.random.default_rng(5))
    )
    small = density.truncated(low)
    assert small.basis.size == int(density.mask(low).sum()) < density.basis.size
    assert density.truncated(None) is density
    points = samples("hh", 60, np.random.default_rng(6))
    full = KernelDensity(
        density.basis,
        np.where(density.mask(low), density.coefficients, 0.0),
        density.variances,
        density.n,
    )
    for got, want in zip(small.derivatives(points), full.derivatives(points), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14 * np.abs(want).max())


@pytest.mark.parametrize("case", CASES)
def test_evaluate_equals_brute_force_loop(case):
    families, order, index_set = case
    density = KernelDensity.fit(
        make_basis(families, order, index_set), samples(families, 300, np.random.default_rng(7))
    )
    points = samples(families, 64, np.random.default_rng(8))
    p, grad = density.evaluate(points)
    p_ref, grad_ref = brute_force(density, points)
    np.testing.assert_allclose(p, p_ref, rtol=1e-11, atol=1e-13 * np.abs(p_ref).max())
    np.testing.assert_allclose(grad, grad_ref, rtol=1e-11, atol=1e-13 * np.abs(grad_ref).max())


@pytest.mark.parametrize("case", CASES)
def test_gradient_against_finite_differences(case):
    families, order, index_set = case
    density = KernelDensity.fit(
        make_basis(families, order, index_set), samples(families, 300, np.random.default_rng(9))
    )
    points = samples(families, 40, np.random.default_rng(10)) + 0.05  # away from x = loc
    _, grad = density.evaluate(points)
    h = 1e-5
    for j in range(points.shape[1]):
        step = np.zeros(points.shape[1])
        step[j] = h
        fd = (density.pdf(points + step) - density.pdf(points - step)) / (2 * h)
        np.testing.assert_allclose(grad[:, j], fd, rtol=1e-5, atol=1e-7 * np.abs(fd).max())


def test_row_blocks_do_not_change_the_evaluation():
    # more points than one internal row block (8192): results are per row
    basis = make_basis("hl", 8)
    density = KernelDensity.fit(basis, samples("hl", 500, np.random.default_rng(1)))
    points = samples("hl", 9000, np.random.default_rng(2))
    p, grad = density.evaluate(points)
    p_tail, grad_tail = density.evaluate(points[8000:])
    np.testing.assert_array_equal(p[8000:], p_tail)
    np.testing.assert_array_equal(grad[8000:], grad_tail)


def test_density_integrates_to_one_at_every_order():
    # int Psi_m = delta_m0 for beta = 1, so int p_M = c_0 = 1 for every M (Gauss quadrature)
    basis = make_basis("hl", 10)
    density = KernelDensity.fit(basis, samples("hl", 1000, np.random.default_rng(12)))
    t, w = np.polynomial.hermite_e.hermegauss(60)
    u, v = np.polynomial.laguerre.laggauss(60)
    c1, c2 = basis.coordinates
    x1 = c1.loc + c1.scale * t
    x2 = c2.loc + c2.scale * u
    weights = np.outer(w * c1.scale * np.exp(t**2 / 2), v * c2.scale * np.exp(u))
    grid = np.stack(np.meshgrid(x1, x2, indexing="ij"), -1).reshape(-1, 2)
    for order in (0, 3, 10):
        total = np.sum(density.pdf(grid, order=order) * weights.ravel())
        assert total == pytest.approx(1.0, abs=1e-10)


# --------------------------------------------------------------------------- accuracy


MIX_WEIGHTS = np.array([0.5, 0.5])
MIX_MEANS = np.array([[-1.0, -0.5], [1.0, 0.5]])
MIX_COVS = np.array([[[0.36, 0.144], [0.144, 0.64]], [[0.49, -0.168], [-0.168, 0.36]]])


def mixture_samples(n: int, rng: np.random.Generator) -> np.ndarray:
    first = rng.random(n) < MIX_WEIGHTS[0]
    out = np.empty((n, 2))
    for k, rows in enumerate((first, ~first)):
        out[rows] = rng.multivariate_normal(MIX_MEANS[k], MIX_COVS[k], int(rows.sum()))
    return out


def mixture_pdf(x: np.ndarray) -> np.ndarray:
    return sum(
        w * stats.multivariate_normal(m, c).pdf(x)
        for w, m, c in zip(MIX_WEIGHTS, MIX_MEANS, MIX_COVS, strict=True)
    )


def grid_points(lo, hi, n=41) -> np.ndarray:
    axes = [np.linspace(a, b, n) for a, b in zip(lo, hi, strict=True)]
    return np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(lo))


def kde_sup_error(x: np.ndarray, points: np.ndarray, truth: np.ndarray) -> float:
    """Sup error of the paper's Gaussian KDE (Silverman bandwidth), binned (FFT) evaluation."""
    h = kde.silverman_bandwidth(x.std(axis=0, ddof=1), x.shape[0])
    grid = kde.default_grid(x.min(axis=0), x.max(axis=0), h)
    p, _ = reduce_in_memory(kde.binned_kde_reduction(grid, h), x).evaluate(points)
    return float(np.abs(p - truth).max())


def sup_errors(x: np.ndarray, basis: TensorBasis, points, truth, orders) -> dict[int, float]:
    density = KernelDensity.fit(basis, x)
    return {m: float(np.abs(density.pdf(points, order=m) - truth).max()) for m in orders}


SIZES = (10_000, 100_000, 1_000_000)


def test_gaussian_mixture_accuracy_falls_with_n_and_order_and_beats_kde():
    """2-D two-component mixture, Hermite x Hermite standardised on the sample (eq. 40)."""
    x_all = mixture_samples(SIZES[-1], np.random.default_rng(2024))
    mean, std = x_all.mean(axis=0), x_all.std(axis=0)
    basis = TensorBasis(tuple(Coordinate(Hermite(), mean[k], std[k]) for k in range(2)), 30)
    points = grid_points((-3.0, -3.0), (3.0, 3.0))
    truth = mixture_pdf(points)
    orders = (4, 8, 12, 16, 20, 30)
    errors = {n: sup_errors(x_all[:n], basis, points, truth, orders) for n in SIZES}
    # with N: at an order whose bias is below the noise of 1e4 samples
    assert errors[10_000][30] > 1.5 * errors[100_000][30] > 2.0 * errors[1_000_000][30]
    # with M: at 1e6 samples the bias dominates up to M = 30, and falls steadily
    at_large_n = [errors[1_000_000][m] for m in orders]
    assert all(b < 0.8 * a for a, b in zip(at_large_n, at_large_n[1:], strict=False))
    assert at_large_n[-1] < at_large_n[0] / 10
    # against the KDE at equal N
    for n in SIZES:
        assert errors[n][30] < 0.7 * kde_sup_error(x_all[:n], points, truth), n


def test_gamma_times_gaussian_accuracy_falls_with_n_and_order_and_beats_kde():
    """Gamma(2) x N(0, 1), Laguerre(theta=1) x Hermite with maps that do not match the data
    (scale 0.7 and 1.2, so p_eq is not a finite expansion): the series converges by M ~ 8,
    beyond which sampling noise dominates."""
    rng = np.random.default_rng(77)
    x_all = np.column_stack([rng.gamma(2.0, 1.0, SIZES[-1]), rng.standard_normal(SIZES[-1])])
    basis = TensorBasis((Coordinate(Laguerre(1.0), 0.0, 0.7), Coordinate(Hermite(), 0.0, 1.2)), 12)
    points = grid_points((0.05, -3.0), (8.0, 3.0))
    truth = stats.gamma(2).pdf(points[:, 0]) * stats.norm.pdf(points[:, 1])
    orders = (0, 2, 4, 8, 12)
    errors = {n: sup_errors(x_all[:n], basis, points, truth, orders) for n in SIZES}
    assert errors[10_000][8] > 1.5 * errors[100_000][8] > 2.0 * errors[1_000_000][8]
    at_large_n = [errors[1_000_000][m] for m in orders[:4]]
    assert all(b < 0.8 * a for a, b in zip(at_large_n, at_large_n[1:], strict=False))
    for n in SIZES:
        assert errors[n][8] < 0.5 * kde_sup_error(x_all[:n], points, truth), n


# --------------------------------------------------------------------------- bad input


@pytest.fixture
def basis_hl() -> TensorBasis:
    return make_basis("hl", 4)


def test_non_finite_samples_are_rejected(basis_hl):
    x = samples("hl", 20, np.random.default_rng(0))
    x[7, 1] = np.nan
    with pytest.raises(ValueError, match=r"x has 1 non-finite.*row 7, component 1"):
        coefficient_sums(basis_hl, x)
    x[7, 1] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        reduce_in_memory(coefficient_reduction(basis_hl), x, 5)


def test_laguerre_data_below_the_shift_are_rejected(basis_hl):
    x = samples("hl", 20, np.random.default_rng(0))
    x[3, 1] = -0.75  # loc = -0.5
    with pytest.raises(ValueError, match=r"component 1 .*-0\.75.*loc=-0\.5"):
        coefficient_sums(basis_hl, x)


@pytest.mark.parametrize("shape", [(10, 3), (10, 1), (10,), (2, 10, 2)])
def test_mismatched_dimensions_are_rejected(basis_hl, shape):
    with pytest.raises(ValueError, match=r"x must have shape \(n, 2\)"):
        coefficient_sums(basis_hl, np.ones(shape))


def test_evaluate_rejects_mismatched_points(basis_hl):
    density = KernelDensity.fit(basis_hl, samples("hl", 20, np.random.default_rng(0)))
    with pytest.raises(ValueError, match=r"x must have shape \(n, 2\)"):
        density.evaluate(np.ones((4, 3)))


def test_empty_block_is_rejected(basis_hl):
    with pytest.raises(ValueError, match="x is empty"):
        coefficient_sums(basis_hl, np.empty((0, 2)))


def test_orders_outside_the_fitted_range_are_rejected(basis_hl):
    density = KernelDensity.fit(basis_hl, samples("hl", 20, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="order 5 is outside the fitted range 0..4"):
        density.evaluate(np.ones((2, 2)), order=5)


def test_order_whose_coefficient_matrix_does_not_fit_names_the_bytes():
    coords = tuple(Coordinate(Hermite()) for _ in range(3))
    with pytest.raises(ValueError, match=r"order 2000 needs a \d+\.\d GiB coefficient matrix"):
        TensorBasis(coords, 2000)


def test_order_whose_tables_do_not_fit_is_a_value_error_not_an_allocation():
    """d = 3, M = 300: the coefficient matrix is 0.1 GiB (accepted) but one row block of tail
    products is 8192 x 45451 float64 = 3 GiB, several of them at once. The fit must refuse with a
    ValueError naming the bytes, not die allocating. Run in a child process capped at 3 GiB of
    address space so a missing check fails with MemoryError instead of swamping the machine."""
    script = textwrap.dedent(
        """
        import resource, numpy as np
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
        from kelr_dist.kernels.bases.families import Coordinate, Hermite, TensorBasis
        from kelr_dist.kernels.scores.kernel_embedding import coefficient_sums
        basis = TensorBasis(tuple(Coordinate(Hermite()) for _ in range(3)), 300)
        x = np.random.default_rng(0).standard_normal((20000, 3))
        try:
            coefficient_sums(basis, x)
        except ValueError as err:
            print("ValueError:", err)
        except MemoryError:
            print("MemoryError")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert re.search(r"ValueError:.*\d.*(bytes|[KMGT]iB)", out.stdout), out.stdout + out.stderr


def test_indices_are_the_index_set():
    # total: |m|_1 <= M, box: m_k <= M_k, each exactly once
    for order, index_set, expect in [
        (4, "total", [m for m in itertools.product(range(5), repeat=3) if sum(m) <= 4]),
        ((2, 3, 1), "box", list(itertools.product(range(3), range(4), range(2)))),
    ]:
        basis = TensorBasis(tuple(Coordinate(Hermite()) for _ in range(3)), order, index_set)
        assert sorted(map(tuple, basis.indices.tolist())) == sorted(expect)


@pytest.mark.parametrize(
    ("families", "order", "index_set"), [("lh", (12, 0), "box"), ("hhh", 6, "total")]
)
def test_estimates_on_one_basis_share_its_tables_with_the_same_values(families, order, index_set):
    """An estimate and its refits without each fold, evaluated together on their shared
    basis tables (the response pass's jackknife replicates), give what each one's own
    evaluation gives (the d >= 3 fused kernel and the GEMMs of d = 2 alike; to rounding, as a
    GEMM of several estimates' stacked coefficients may sum in another order), and the scores
    from them what each score's call gives."""
    from kelr_dist.kernels.response.operator import DensityScore
    from kelr_dist.kernels.scores.folds import Folds
    from kelr_dist.kernels.scores.kernel_embedding import evaluate_on_basis

    rng = np.random.default_rng(3)
    basis = make_basis(families, order, index_set)
    x = samples(families, 6000, rng)
    density = reduce_in_memory(coefficient_reduction(basis, Folds(3, 1, 6000)), x[None], 1000)
    densities = [density, *(density.held_out(f) for f in range(3))]

    def close(a: np.ndarray, b: np.ndarray) -> bool:
        return np.allclose(a, b, rtol=0, atol=1e-12 * np.abs(b).max())

    for second in (False, True):
        together = evaluate_on_basis(densities, x, second=second)
        for estimate, values in zip(densities, together, strict=True):
            alone = estimate.derivatives(x) if second else (*estimate.evaluate(x), None)
            for a, b in zip(values, alone, strict=True):
                assert (a is None and b is None) or close(a, b)
    scores = [DensityScore(d, order, 1e-3) for d in densities]
    for (s, kept), score in zip(DensityScore.many(scores, x), scores, strict=True):
        own, own_kept = score(x)
        assert close(s, own) and np.array_equal(kept, own_kept)
    other = KernelDensity.fit(
        make_basis(families, 2 if index_set == "total" else (2, 0), index_set), x
    )
    with pytest.raises(ValueError, match="one basis"):
        evaluate_on_basis([density, other], x)


@pytest.mark.parametrize(
    ("families", "order", "index_set"),
    [("lh", (40, 0), "box"), ("h", 30, "total"), ("l", 25, "total"), ("hhh", (10, 0, 0), "box")],
)
def test_bases_of_one_varying_coordinate_give_the_brute_force_values(families, order, index_set):
    """A basis whose functions vary in the first coordinate only is summed by its recurrence
    for up to ``SERIES_ESTIMATES`` estimates at once, by the tables beyond: both give the
    explicit sum over the basis, p and ∇p."""
    from kelr_dist.kernels.scores.kernel_embedding import SERIES_ESTIMATES, evaluate_on_basis

    rng = np.random.default_rng(11)
    basis = make_basis(families, order, index_set)
    x = samples(families, 3000, rng)
    for count in (1, SERIES_ESTIMATES, SERIES_ESTIMATES + 1):
        coefficients = rng.standard_normal((count, basis.size)) / basis.size
        densities = [KernelDensity(basis, c, np.ones(basis.size), 3000) for c in coefficients]
        for density, (p, grad, _) in zip(densities, evaluate_on_basis(densities, x), strict=True):
            want_p, want_grad = brute_force(density, x)
            assert np.allclose(p, want_p, rtol=0, atol=1e-12 * np.abs(want_p).max())
            assert np.allclose(grad, want_grad, rtol=0, atol=1e-12 * np.abs(want_grad).max())


@pytest.mark.parametrize(
    ("families", "order", "index_set"),
    [("lh", (40, 0), "box"), ("h", 30, "total"), ("l", 25, "total"), ("hhl", (10, 0, 0), "box")],
)
@pytest.mark.parametrize("start", [0, 5])
def test_coefficient_sums_of_one_varying_coordinate_are_the_explicit_sums(
    families, order, index_set, start
):
    """The recurrence path of eq. 39's sums (a basis varying in its first coordinate only) gives
    the explicit sums over the tables, the strided squares included, far samples too."""
    rng = np.random.default_rng(3)
    basis = make_basis(families, order, index_set)
    x = samples(families, 2000, rng)
    x[:4, 0] = [55.0, -40.0, 300.0, 1e-9] if families[0] == "h" else [300.0, 1e3, -0.5, 0.0]
    tables = [
        c.coefficient_table(x[:, k], max(basis.max_orders)) for k, c in enumerate(basis.coordinates)
    ]
    terms = np.stack(
        [np.prod([tables[k][:, mk] for k, mk in enumerate(m)], axis=0) for m in basis.indices]
    )
    strided = (start + np.arange(x.shape[0])) % VARIANCE_STRIDE == 0
    sums = coefficient_sums(basis, x, start)
    assert sums["n"] == 2000 and sums["n_sq"] == strided.sum()
    for key, want in (("sum", terms.sum(axis=1)), ("sumsq", (terms[:, strided] ** 2).sum(axis=1))):
        got = sums[key].reshape(-1)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
