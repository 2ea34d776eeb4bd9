"""Order and threshold selection (eqs. 52–54): the one-pass sweep against a
brute-force evaluation at every order, chunking invariance, eta, and the automatic choices."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kelr_dist.kernels.bases.coordinates import fit_basis
from kelr_dist.kernels.bases.families import Coordinate, Hermite, Laguerre, TensorBasis
from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.kernels.scores.folds import Folds
from kelr_dist.kernels.scores.kernel_embedding import KernelDensity, coefficient_reduction
from kelr_dist.kernels.scores.selection import (
    ERROR_WINDOW,
    N_BINS,
    Criteria,
    bin_edges,
    choose_delta,
    choose_order,
    combine_sweeps,
    criteria_reduction,
    least_adequate_order,
    sweep_sums,
)


def bimodal(n: int, rng: np.random.Generator) -> np.ndarray:
    first = rng.random(n) < 0.5
    left = rng.normal([-1.5, 0.0], [0.5, 0.7], (n, 2))
    right = rng.normal([1.5, 0.5], [0.5, 0.6], (n, 2))
    return np.where(first[:, None], left, right)


def gamma_gauss(n: int, rng: np.random.Generator) -> np.ndarray:
    return np.column_stack([rng.gamma(2.0, 1.0, n), rng.standard_normal(n)])


CASES = {
    "1d-hermite": (
        lambda n, r: bimodal(n, r)[:, :1],
        lambda: (Coordinate(Hermite(), 0.0, 1.6),),
        14,
        "total",
    ),
    # the functions vary in the first coordinate only: the sweep runs its recurrence, no tables
    "2d-box-laguerre-first-only": (
        lambda n, r: np.vstack([gamma_gauss(n - 3, r), [[0.0, 0.1], [400.0, 0.0], [1e-3, 45.0]]]),
        lambda: (Coordinate(Laguerre(2.5, beta=0.5), -0.1, 0.7), Coordinate(Hermite(), 0.0, 1.2)),
        (40, 0),
        "box",
    ),
    "2d-total": (
        bimodal,
        lambda: (Coordinate(Hermite(), 0, 1.6), Coordinate(Hermite(), 0.2, 0.8)),
        16,
        "total",
    ),
    "2d-box-laguerre": (
        gamma_gauss,
        lambda: (Coordinate(Laguerre(1.0), 0.0, 0.7), Coordinate(Hermite(), 0.0, 1.2)),
        (7, 5),
        "box",
    ),
    "3d-total": (
        lambda n, r: np.column_stack([bimodal(n, r), r.gamma(2.0, 1.0, n)]),
        lambda: (
            Coordinate(Hermite(), 0, 1.6),
            Coordinate(Hermite(), 0.2, 0.8),
            Coordinate(Laguerre(1.0), 0.0, 0.8),
        ),
        7,
        "total",
    ),
}


def fitted(case: str, n: int = 2000, seed: int = 0) -> tuple[KernelDensity, np.ndarray]:
    sampler, coords, order, index_set = CASES[case]
    rng = np.random.default_rng(seed)
    basis = TensorBasis(coords(), order, index_set)
    # fit on one sample, sweep over another (as with a subsample or a later pass)
    density = KernelDensity.fit(basis, sampler(n, rng))
    return density, sampler(n, rng)


def brute_values(density: KernelDensity, x: np.ndarray) -> np.ndarray:
    """``p_M(X_n)`` in standardized units for every order, ``(levels, n)``, by
    evaluate(x, order=M) divided by the Jacobian of the affine maps."""
    orders = range(density.basis.max_level + 1)
    return np.stack([density.pdf(x, order=m) for m in orders]) / density.jacobian


@pytest.mark.parametrize("case", list(CASES))
def test_sweep_statistics_equal_brute_force_at_every_order(case):
    density, x = fitted(case)
    p = brute_values(density, x)
    sums = sweep_sums(density, x)
    criteria = Criteria.from_sums(density, sums)
    scale = np.abs(p).max(axis=1)
    assert (p < 0).any(), "the case must exercise negative values"
    # delta_M (eq. 52): smallest positive p_M(X_n); the most negative value
    positive_min = np.where(p > 0, p, np.inf).min(axis=1)
    np.testing.assert_allclose(sums["min_pos"], positive_min, rtol=1e-12, atol=1e-13 * scale.max())
    np.testing.assert_allclose(sums["min_val"], p.min(axis=1), rtol=1e-12, atol=1e-13 * scale.max())
    np.testing.assert_allclose(
        criteria.negative_excursion, np.maximum(-p.min(axis=1), 0), atol=1e-13 * scale.max()
    )
    assert (sums["pos"].sum(axis=1) + sums["neg"].sum(axis=1) + sums["zeros"] == len(x)).all()
    # R_M at bin edges (eq. 53): exact counts, up to values within rounding of an edge
    edges = bin_edges()
    for delta in edges[[0, 150, 300, 320, 340, 360, 380, 400, N_BINS - 1]]:
        rate = criteria.rejection(delta)
        brute = (p < delta).mean(axis=1)
        ambiguous = (np.abs(p - delta) <= 1e-12 * scale[:, None]).mean(axis=1)
        assert np.all(np.abs(rate - brute) <= ambiguous), (delta, rate, brute)
    np.testing.assert_array_equal(criteria.rejection_paper(), (p <= 0).mean(axis=1))
    # the rejection is a non-decreasing function of the threshold
    rates = np.stack([criteria.rejection(e) for e in edges[::10]])
    assert np.all(np.diff(rates, axis=0) >= 0)


@pytest.mark.parametrize("case", list(CASES))
def test_a_sweep_from_a_given_order_on_keeps_its_statistics_and_threshold(case):
    """A given order needs the sweep only from ERROR_WINDOW orders below it: the statistics
    from there on, and the threshold of the order, are the full sweep's; below, NaN."""
    density, x = fitted(case)
    full = Criteria.from_sums(density, sweep_sums(density, x))
    given = int(full.orders[-1]) - 1
    lowest = max(given - ERROR_WINDOW, 0)
    part = Criteria.from_sums(density, sweep_sums(density, x, lowest), lowest=lowest)
    kept = full.orders >= lowest
    assert np.array_equal(part.pos[kept], full.pos[kept])
    assert np.array_equal(part.negative_excursion[kept], full.negative_excursion[kept])
    assert np.isnan(part.negative_excursion[~kept]).all()
    assert choose_delta(part)[given] == choose_delta(full)[given]
    assert np.isnan(choose_delta(part)[~kept]).all()
    assert np.isnan(part.rejection(1e-3)[~kept]).all()


def test_sweep_over_the_fitting_sample_has_no_zero_order_rejection():
    # p_0 = Psi_0 > 0 everywhere (c_0 = 1): nothing is rejected at order 0
    density, x = fitted("2d-total")
    criteria = reduce_in_memory(criteria_reduction(density), x)
    assert criteria.rejection_paper()[0] == 0
    assert criteria.negative_excursion[0] == 0


@settings(max_examples=20, deadline=None)
@given(
    case=st.sampled_from(list(CASES)),
    seed=st.integers(0, 2**32 - 1),
    cuts=st.lists(st.integers(1, 499), min_size=1, max_size=6),
)
def test_sweep_partials_over_any_chunking_combine_to_the_one_chunk_result(case, seed, cuts):
    density, x = fitted(case, n=500, seed=seed % 1000)
    lengths = np.diff([0, *sorted(set(cuts)), 500]).tolist()
    reduction = criteria_reduction(density)
    whole = reduce_in_memory(reduction, x)
    split = reduce_in_memory(reduction, x, lengths)
    for key in ("pos", "neg", "zeros"):
        np.testing.assert_array_equal(getattr(split, key), getattr(whole, key))
    assert split.n == whole.n == 500
    for key in ("delta_paper", "negative_excursion"):
        a, b = getattr(split, key), getattr(whole, key)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-300)
    # combine_sweeps is commutative and associative on the raw partials
    parts = [sweep_sums(density, x[s]) for s in np.split(np.arange(500), np.cumsum(lengths)[:-1])]
    left = parts[0]
    for part in parts[1:]:
        left = combine_sweeps(left, part)
    right = parts[-1]
    for part in parts[-2::-1]:
        right = combine_sweeps(part, right)
    for key in left:
        np.testing.assert_array_equal(left[key], right[key])


@pytest.mark.parametrize("case", list(CASES))
def test_eta_is_the_shell_norm_of_the_coefficients(case):
    density, _ = fitted(case)
    basis = density.basis
    m = basis.indices
    level = m.sum(axis=1) if basis.index_set == "total" else m.max(axis=1)
    expect = [
        np.sqrt(np.sum(density.coefficients[level == L + 1] ** 2)) for L in range(basis.max_level)
    ]
    criteria = Criteria.from_sums(density, sweep_sums(density, density_points(density)))
    np.testing.assert_allclose(criteria.eta[:-1], expect, rtol=1e-13)
    assert np.isnan(criteria.eta[-1])
    noise = [np.sqrt(np.sum(density.variances[level == L + 1])) for L in range(basis.max_level)]
    np.testing.assert_allclose(criteria.eta_noise[:-1], noise, rtol=1e-13)


def density_points(density: KernelDensity) -> np.ndarray:
    return np.array([[c.loc + c.scale for c in density.basis.coordinates]])


# --------------------------------------------------------------------------- automatic choices


def constructed(eta, eps, delta_paper=None) -> Criteria:
    levels = len(eps)
    eta = np.r_[np.asarray(eta, dtype=float), np.nan]
    return Criteria(
        orders=np.arange(levels),
        delta_paper=np.full(levels, 1e-7) if delta_paper is None else np.asarray(delta_paper),
        negative_excursion=np.asarray(eps, dtype=float),
        eta=eta,
        eta_noise=np.full(levels, np.nan),
        n=1000,
        pos=np.zeros((levels, N_BINS), dtype=np.int64),
        neg=np.zeros((levels, N_BINS), dtype=np.int64),
        zeros=np.zeros(levels, dtype=np.int64),
    )


def windowed_excursion(eps: np.ndarray, window: int = 2) -> np.ndarray:
    """The documented error scale: the largest negative excursion within ``window`` orders."""
    eps = np.asarray(eps, dtype=float)
    return np.array([eps[max(m - window, 0) : m + window + 1].max() for m in range(len(eps))])


def test_choose_order_on_constructed_criteria():
    # eta decays to a noise floor ~1e-3 from order 6 on (converged, eq. 54); the error scale
    # (largest eps within 2 orders) is 5e-3, 3e-3, 2e-3, 1e-3, 4e-3, 8e-3... for M = 6, 7, ...
    eta = [0.5, 0.3, 0.1, 0.05, 0.02, 0.01, 1e-3, 1.2e-3, 0.9e-3, 1.1e-3, 1e-3, 1e-3, 1e-3]
    eps = [0.0, 0.0, 0.02, 0.01, 5e-3, 3e-3, 2e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 4e-3, 8e-3]
    scale = windowed_excursion(eps)
    np.testing.assert_allclose(scale[6:11], [5e-3, 3e-3, 2e-3, 1e-3, 4e-3])
    criteria = constructed(eta, eps)
    assert choose_order(criteria) == 8  # within twice the least error scale (the default)
    assert choose_order(criteria, tolerance=0.1) == 9
    assert choose_order(criteria, min_order=10) == 10
    # shells that vanish by symmetry (odd orders) do not fake convergence at order 1 or 3,
    # where the error scale is 0 (the estimate never goes negative there)
    eta_sym = [0.5, 0.0, 0.3, 0.0, 0.1, 0.0, 1e-3, 0.0, 1e-3, 0.0, 1e-3, 0.0, 1e-3]
    eps_sym = [0.0] * 4 + eps[4:]
    assert windowed_excursion(eps_sym)[1] == 0
    assert choose_order(constructed(eta_sym, eps_sym)) == 8


@pytest.mark.parametrize(("lo", "hi"), [(-1, 5), (6, 5), (0, 12)])
def test_choose_order_rejects_ranges_outside_the_scan(lo, hi):
    criteria = constructed([0.1] * 11, [0.0] * 12)
    with pytest.raises(ValueError, match="order range"):
        choose_order(criteria, min_order=lo, max_order=hi)


def test_choose_delta_is_the_median_negative_magnitude_rounded_up_to_an_edge():
    # order 1: negatives at |p| = 2^-20 (x3) and 2^-10 (x2): median bin [2^-20, 2^-19.75)
    # order 2: one huge excursion does not move the median: 2^-16 (x4), 2^-2 (x1)
    # orders 0, 3, 4: no negatives; they borrow the largest median within 2 orders (order 2's)
    # orders 5, 6: none within two orders -> the paper's δ_M
    edges = bin_edges()
    t = np.arange(len(edges))
    criteria = constructed([0.1] * 6, [0.0] * 7, np.full(7, 1e-9))
    for order, tee, count in [(1, -80, 3), (1, -40, 2), (2, -64, 4), (2, -8, 1)]:
        criteria.neg[order, t[edges == 2.0 ** (tee / 4)][0]] = count
    delta = choose_delta(criteria)
    assert np.isin(delta, edges).all()
    upper = {1: 2.0 ** (-79 / 4), 2: 2.0 ** (-63 / 4)}
    np.testing.assert_allclose(
        delta, [upper[2], upper[1], upper[2], upper[2], upper[2], 1e-9, 1e-9], rtol=0.2
    )
    np.testing.assert_allclose(delta[1:3], [upper[1], upper[2]], rtol=1e-12)
    # never below δ_M, and the factor scales it
    criteria.delta_paper[1] = 1e-3
    assert choose_delta(criteria)[1] >= 1e-3
    assert choose_delta(criteria, factor=10.0)[2] >= 10 * upper[2]


def test_automatic_choices_on_data_gaussian_low_bimodal_high():
    """A correlated Gaussian needs few orders (its Mehler series decays like 0.35^M), a
    bimodal mixture of narrow components many. Measured at N = 1e5: once eta is at its noise
    floor, the error scale of the converged orders is sampling noise (4e-5..9e-5 for the
    Gaussian at M = 6..24), so picking its minimum within 10% can land on any of them."""
    rng = np.random.default_rng(2)
    n = 100_000
    chosen = {}
    for name, x in [
        ("gauss", rng.multivariate_normal([0, 0], [[1, 0.5], [0.5, 2]], n)),
        ("bimodal", bimodal(n, rng)),
    ]:
        density = KernelDensity.fit(TensorBasis(tuple(fit_basis(x)), 24), x)
        criteria = reduce_in_memory(criteria_reduction(density), x, 30_000)
        order = choose_order(criteria)
        delta = choose_delta(criteria)[order]
        chosen[name] = order
        # the threshold is at least the median negative magnitude and delta_M, and R_M at it
        # is exact (a bin edge)
        p = density.pdf(x, order=order) / density.jacobian  # standardized units, as delta
        negative = np.sort(-p[p < 0])
        typical = negative[(len(negative) - 1) // 2] if len(negative) else 0.0  # lower median
        assert delta >= typical and delta >= p[p > 0].min()
        assert criteria.rejection(delta)[order] == pytest.approx((p < delta).mean(), abs=1e-5)
    assert chosen["gauss"] <= 8
    assert chosen["bimodal"] >= 2 * chosen["gauss"] and chosen["bimodal"] >= 12


def test_held_out_l2_is_the_brute_force_cross_validated_risk():
    # with beta = 1/2 the basis is orthonormal in plain L2 of the standardized coordinates, so
    # for fold k: L_k(M) = ||p_M^(-k)||^2 - 2 mean_{x in fold k} p_M^(-k)(x), the density of y
    rng = np.random.default_rng(7)
    x = bimodal(4_000, rng)
    coords = (Coordinate(Hermite(beta=0.5), 0.0, 1.6), Coordinate(Hermite(beta=0.5), 0.2, 0.8))
    basis = TensorBasis(coords, 10, "total")
    folds = Folds(4, 1, len(x))
    density = reduce_in_memory(coefficient_reduction(basis, folds), x, 700)
    loss, spread = density.held_out_l2()
    levels = basis.indices.sum(axis=1)
    brute = np.empty((folds.count, basis.max_level + 1))
    for k in range(folds.count):
        rest = density.held_out(k)
        own = x[folds.edge(k) : folds.edge(k + 1)]
        for order in range(basis.max_level + 1):
            kept = rest.coefficients[levels <= order]
            p_y = rest.pdf(own, order) / rest.jacobian
            brute[k, order] = kept @ kept - 2.0 * p_y.mean()
    np.testing.assert_allclose(loss, brute.mean(axis=0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(spread, brute.std(axis=0, ddof=1) / 2.0, rtol=1e-8, atol=1e-12)
    assert np.argmin(loss) > 2  # two separated modes need more than the weight's first shells


def test_held_out_floor_keeps_the_order_rule_from_underfitting():
    # the weight and its first shells are positive everywhere: eps = 0 there certifies nothing,
    # and without held-out losses the rule takes order 0; the floor (smallest order within one
    # standard error of the least held-out loss) moves it to the first order the data support
    eta = [0.4] * 12 + [np.nan]
    eps = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5e-3, 3e-3, 2e-3, 2e-3, 2e-3, 2e-3]
    criteria = constructed(eta, eps)
    assert choose_order(criteria) == 0
    loss = np.array(
        [-1.0, -1.1, -1.3, -1.5, -1.6, -1.64, -1.66, -1.67, -1.67, -1.66, -1.6, -1.5, -1]
    )
    floored = replace(criteria, held_out_loss=loss, held_out_loss_stderr=np.full(13, 0.02))
    assert least_adequate_order(floored) == 6  # -1.66 <= -1.67 + 0.02 < -1.64
    assert choose_order(floored) == 10  # eps~ within twice its least (2e-3) among orders >= 6
    assert choose_order(floored, min_order=11) == 11
    assert least_adequate_order(criteria) == 0  # no folds: no floor
