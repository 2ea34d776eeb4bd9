"""Tests of kernels.survey.moments, .coordinates, .basis_spec: moments, Gamma MLE, basis choice,
spec."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from kelr_dist.kernels.bases.coordinates import choose_basis, fit_basis, gamma_reduction_for
from kelr_dist.kernels.bases.families import Coordinate, Hermite, Laguerre
from kelr_dist.kernels.bases.spec import coordinates_from_spec, format_basis, parse_basis_spec
from kelr_dist.kernels.reduction import BlockInfo, reduce_in_memory
from kelr_dist.kernels.survey import moments as mom
from kelr_dist.kernels.survey.moments import (
    EDGE_SAMPLES,
    combine_moments,
    edge_reduction,
    gamma_reduction,
    gamma_shape_mle,
    moments_reduction,
)

FIELDS = ("n", "mean", "variance", "std", "skewness", "excess_kurtosis", "minimum", "maximum")


def _skewed_sample(n: int, seed: int) -> np.ndarray:
    """Three coordinates with non-zero mean, skewness and kurtosis (no cancellation)."""
    rng = np.random.default_rng(seed)
    return np.column_stack(
        [rng.gamma(2.0, 1.5, n) + 1.0, -rng.lognormal(0.0, 0.5, n), rng.exponential(3.0, n) - 0.5]
    )


def _moments(x: np.ndarray, chunks=None) -> mom.Moments:
    return reduce_in_memory(moments_reduction(), x, chunks)


def _assert_moments_close(a: mom.Moments, b: mom.Moments, rtol: float) -> None:
    for name in FIELDS:
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol, err_msg=name)


def _chunk_lengths(draw_fractions: list[float], n: int) -> list[int]:
    cuts = sorted({int(f * n) for f in draw_fractions} - {0, n})
    return np.diff([0, *cuts, n]).tolist()


# ----------------------------------------------------------------------------------- moments


def test_moments_match_numpy_and_scipy():
    x = _skewed_sample(3000, 1)
    m = _moments(x)
    np.testing.assert_array_equal(m.n, 3000)
    np.testing.assert_allclose(m.mean, x.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(m.variance, x.var(axis=0), rtol=1e-12)
    np.testing.assert_allclose(m.std, x.std(axis=0), rtol=1e-12)
    np.testing.assert_allclose(m.skewness, scipy.stats.skew(x), rtol=1e-12)
    np.testing.assert_allclose(m.excess_kurtosis, scipy.stats.kurtosis(x), rtol=1e-12)
    np.testing.assert_array_equal(m.minimum, x.min(axis=0))
    np.testing.assert_array_equal(m.maximum, x.max(axis=0))


@settings(max_examples=40, deadline=None)
@given(
    fractions=st.lists(st.floats(0.0, 1.0), max_size=12),
    sub_block=st.sampled_from([3, 17, 1 << 16]),
    chains=st.integers(1, 3),
)
def test_moments_invariant_under_chunking(fractions, sub_block, chains):
    n = 600
    x = _skewed_sample(chains * n, 2).reshape(chains, n, 3)
    reference = _moments(x)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mom, "SUB_BLOCK", sub_block)
        chunked = _moments(x, _chunk_lengths(fractions, n))
    _assert_moments_close(chunked, reference, rtol=1e-12)
    flat = x.reshape(-1, 3)
    np.testing.assert_allclose(chunked.skewness, scipy.stats.skew(flat), rtol=1e-12)
    np.testing.assert_allclose(chunked.excess_kurtosis, scipy.stats.kurtosis(flat), rtol=1e-12)


def test_combine_is_commutative_associative_and_empty_is_identity():
    x = _skewed_sample(900, 3)
    info = BlockInfo(0, 0, 300, 900)
    a, b, c = (mom._moments_chunk(x[i : i + 300], info, None) for i in (0, 300, 600))
    empty = mom._moments_chunk(x[:0], info, None)
    final = mom._finalize_moments
    _assert_moments_close(final(combine_moments(a, b)), final(combine_moments(b, a)), 1e-13)
    left = final(combine_moments(combine_moments(a, b), c))
    right = final(combine_moments(a, combine_moments(b, c)))
    _assert_moments_close(left, right, 1e-12)
    for name in ("n", "mean", "m2", "m3", "m4", "min", "max"):
        np.testing.assert_array_equal(combine_moments(a, empty)[name], a[name])
        np.testing.assert_array_equal(combine_moments(empty, a)[name], a[name])


@pytest.mark.parametrize(
    ("chunks", "var_rtol", "rtol"),
    [(None, 1e-13, 1e-11), (1700, 1e-13, 1e-11), ("random", 1e-11, 1e-10), (1, 3e-11, 1e-9)],
)
def test_moments_stable_with_large_offset(chunks, var_rtol, rtol):
    """x = 1e6 + noise: the naive E[x²] - E[x]² loses ~1e-4 of the variance here.

    Each partial's mean is held to ~ulp(1e6) = 1.2e-10, so combining thousands of tiny blocks
    costs ~1e-11 in the variance and ~1e-10 in the shape statistics; realistic blocks stay at
    ~1e-14 (variance) and ~1e-12 (shape statistics).
    """
    rng = np.random.default_rng(4)
    n = 5000
    noise = rng.standard_normal((n, 1)) + rng.exponential(1.0, (n, 1))
    x = 1e6 + noise
    if chunks == "random":
        lengths = rng.integers(1, 600, n)
        lengths = lengths[lengths.cumsum() < n].tolist()
        chunks = [*lengths, n - sum(lengths)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mom, "SUB_BLOCK", 999)
        m = _moments(x, chunks)
    centred = x - 1e6  # exact: both are on the same float grid near 1e6
    np.testing.assert_allclose(m.mean, x.mean(axis=0), rtol=1e-15)
    np.testing.assert_allclose(m.variance, centred.var(axis=0), rtol=var_rtol)
    np.testing.assert_allclose(m.skewness, scipy.stats.skew(centred), rtol=rtol)
    np.testing.assert_allclose(m.excess_kurtosis, scipy.stats.kurtosis(centred), rtol=rtol)


def test_nonfinite_samples_are_reported_with_first_position():
    x = _skewed_sample(200, 5).reshape(2, 100, 3)
    x[1, 17, 2] = np.nan
    x[1, 40, 2] = np.inf
    x[1, 90, 2] = -np.inf
    message = r"coordinate 2: the earliest non-finite .* chain 1, time index 17; 3 in all, all in"
    with pytest.raises(mom.CoordinateError, match=message):
        _moments(x, [30, 30, 40])


def test_the_earliest_nonfinite_sample_over_all_components_is_named():
    """A later NaN in the first component does not hide an earlier one in another: the message
    names the earliest (chain, time) over every component, and the count over all."""
    x = _skewed_sample(200, 5).reshape(2, 100, 3)
    x[1, 80, 0] = np.nan
    x[0, 60, 2] = np.nan
    x[1, 5, 1] = np.inf
    message = r"coordinate 2: the earliest .* chain 0, time index 60; 3 in all, in 3 components"
    with pytest.raises(mom.CoordinateError, match=message):
        _moments(x, [30, 30, 40])


def test_empty_trajectory_and_bad_block_shape():
    with pytest.raises(ValueError, match="no samples"):
        mom._finalize_moments(mom._empty_moments(2))
    with pytest.raises(ValueError, match=r"shape \(L, d\)"):
        mom._moments_chunk(np.zeros(5), BlockInfo(0, 0, 5, 5), None)


def test_constant_coordinate_has_nan_shape_statistics():
    x = np.column_stack([np.full(50, 2.5), np.arange(50.0)])
    m = _moments(x)
    assert m.variance[0] == 0 and np.isnan(m.skewness[0]) and np.isnan(m.excess_kurtosis[0])
    with pytest.raises(mom.CoordinateError, match="coordinate 0: constant .* leave it out") as info:
        choose_basis(m)
    assert info.value.coordinate == 0 and "every sample is 2.5" in info.value.problem
    with pytest.raises(mom.CoordinateError, match="coordinate 0: constant"):
        gamma_reduction_for(m, "laguerre,hermite")  # the same check before a Gamma pass


def test_too_large_values_are_reported_without_overflow_warnings():
    x = np.random.default_rng(3).standard_normal((3_000, 2))
    x[1234, 1] = 1e300  # finite, but its square overflows
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning may leak
        with pytest.raises(
            mom.CoordinateError, match=r"coordinate 1: values too large \(max \|x\| = 1e\+300;"
        ):
            _moments(x, [1000, 2000])
        x[1234, 1] = 1e139  # within UNIT_LIMIT: ordinary moments, no warning
        assert np.isfinite(_moments(x, [1000, 2000]).excess_kurtosis).all()


def test_too_small_values_are_reported_not_called_constant():
    x = np.random.default_rng(3).standard_normal((3_000, 2))
    x[:, 0] *= 1e-170  # a spread whose squares underflow float64
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(mom.CoordinateError, match=r"coordinate 0: values too small .* rescale"):
            _moments(x, [1000, 2000])


@pytest.mark.parametrize("unit", [1e-139, 1e-75, 1e75, 1e138])
def test_skewness_and_kurtosis_do_not_depend_on_the_unit(unit):
    """The central sums are kept in units of a power of two per partial: data whose fourth
    powers under- or overflow float64 (beyond about 1e±77) have the same shape statistics."""
    x = np.random.default_rng(4).standard_t(5, size=(20_000, 2)) + [3.0, -1.0]
    base, moved = _moments(x, [7000, 13000]), _moments(x * unit, [7000, 13000])
    for name in ("skewness", "excess_kurtosis"):
        np.testing.assert_allclose(getattr(moved, name), getattr(base, name), rtol=1e-12)
    np.testing.assert_allclose(moved.std / unit, base.std, rtol=1e-13)
    np.testing.assert_allclose(moved.mean / unit, base.mean, rtol=1e-13)


# ------------------------------------------------------------------------------------- Gamma


def test_gamma_mle_recovers_parameters_and_matches_scipy():
    rng = np.random.default_rng(6)
    shape, scale, n = 3.5, 2.0, 20_000
    y = rng.gamma(shape, scale, n)
    fit = reduce_in_memory(gamma_reduction([0.0], [1.0]), y[:, None], 1234)
    # MC error of the MLE shape: sqrt(k / (n (k psi'(k) - 1))) ~ 0.034 here
    assert abs(fit.shape[0] - shape) < 4 * 0.034
    assert abs(fit.scale[0] - scale) < 4 * 0.02
    ref_shape, ref_loc, ref_scale = scipy.stats.gamma.fit(y, floc=0)
    np.testing.assert_allclose([fit.shape[0], fit.scale[0]], [ref_shape, ref_scale], rtol=1e-5)
    np.testing.assert_allclose(fit.theta, fit.shape - 1)


def test_gamma_pass_uses_shift_scale_and_columns_and_is_chunk_invariant():
    rng = np.random.default_rng(7)
    n = 5000
    x = np.column_stack([rng.normal(size=n), 4.0 * rng.gamma(2.0, 1.0, n) - 3.0])
    direct = reduce_in_memory(gamma_reduction([0.0], [1.0]), (x[:, 1:] + 3.0) / 4.0)
    shifted = reduce_in_memory(gamma_reduction([-3.0], [4.0], columns=[1]), x, [999, 3001, 1000])
    np.testing.assert_allclose(shifted.shape, direct.shape, rtol=1e-12)
    np.testing.assert_allclose(shifted.scale, 4.0 * direct.scale, rtol=1e-12)
    np.testing.assert_array_equal(shifted.columns, [1])


def test_gamma_shape_solves_the_likelihood_equation():
    from scipy.special import digamma

    s = np.logspace(-9, 2, 23)  # shapes from ~5e8 down to ~0.01
    k = gamma_shape_mle(s, np.zeros_like(s))
    # log k - psi(k) is evaluated with an absolute rounding error ~ eps log k
    np.testing.assert_allclose(np.log(k) - digamma(k), s, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(k[0], 0.5e9, rtol=1e-5)  # ~1/(2s); s known to ~eps log k / s


def test_gamma_pass_rejects_samples_below_the_shift():
    x = np.column_stack([np.linspace(0.0, 1.0, 50), np.linspace(1.0, 2.0, 50)])
    with pytest.raises(ValueError, match=r"coordinate 1: 1 samples not above .* time index 0"):
        reduce_in_memory(gamma_reduction([1.0], [1.0], columns=[1]), x)
    with pytest.raises(ValueError, match="same length"):
        gamma_reduction([0.0, 1.0], [1.0])
    with pytest.raises(ValueError, match="scale > 0"):
        gamma_reduction([0.0], [0.0])


# ------------------------------------------------------------------------------ basis choice


def _samples(kind: str, n: int = 20_000, seed: int = 8) -> np.ndarray:
    rng = np.random.default_rng(seed)
    draws = {
        "gaussian": lambda: 2.0 + 3.0 * rng.standard_normal(n),
        "bimodal": lambda: np.where(rng.random(n) < 0.5, -2.0, 2.0) + 0.5 * rng.standard_normal(n),
        "gamma": lambda: rng.gamma(2.0, 1.0, n) - 3.0,
        "laplace": lambda: rng.laplace(1.0, 2.0, n),
        "student": lambda: rng.standard_t(5, n),
        "left_skewed": lambda: -rng.gamma(2.0, 1.0, n),
        "skewed_mixture": lambda: np.where(rng.random(n) < 0.8, 0.0, 3.0) + rng.standard_normal(n),
    }
    return draws[kind]()[:, None]


@pytest.mark.parametrize(
    ("kind", "beta"),
    [
        ("gaussian", 1.0),
        ("bimodal", 1.0),
        ("left_skewed", 0.5),  # Gamma(2) tail: excess kurtosis 3
        ("skewed_mixture", 1.0),
        ("laplace", 0.5),
        ("student", 0.5),
    ],
)
def test_auto_picks_standardised_hermite_with_tail_beta(kind, beta):
    x = _samples(kind)
    (coordinate,) = fit_basis(x)
    assert coordinate.family == Hermite(beta=beta)
    assert coordinate.loc == pytest.approx(x.mean(), rel=1e-12, abs=1e-12)
    assert coordinate.scale == pytest.approx(x.std(), rel=1e-12)


def test_auto_picks_laguerre_for_shifted_gamma():
    x = _samples("gamma")
    (coordinate,) = fit_basis(x, chunks=3333)
    assert coordinate.family == Laguerre(theta=1.0, beta=1.0)
    assert x.min() - 2e-3 * x.std() < coordinate.loc < x.min()
    assert coordinate.scale == pytest.approx(1.0, abs=0.03)  # Gamma(2, 1): scale 1
    assert coordinate.scale == pytest.approx((x.mean() - coordinate.loc) / 2.0, rel=1e-12)


def test_paper_langevin_like_marginals():
    """A half-Gaussian wall (like the Morse x marginal) and a Gaussian velocity."""
    rng = np.random.default_rng(9)
    n = 20_000
    x = np.column_stack([np.abs(rng.standard_normal(n)) - 0.1, rng.standard_normal(n)])
    first, second = fit_basis(x)
    assert isinstance(first.family, Laguerre) and first.family.beta == 1.0
    assert second.family == Hermite(beta=1.0)


def test_laguerre_auto_theta_needs_the_gamma_pass():
    x = _samples("gamma")
    m = _moments(x)
    with pytest.raises(ValueError, match="coordinate 0: Laguerre θ needs a Gamma fit"):
        choose_basis(m)
    assert gamma_reduction_for(m, "hermite") is None
    assert gamma_reduction_for(m, "laguerre(theta=1)") is None
    assert gamma_reduction_for(m, "laguerre") is not None


# ------------------------------------------------------------------------------------ specs


def _two_coordinates() -> tuple[np.ndarray, mom.Moments]:
    rng = np.random.default_rng(10)
    x = np.column_stack([rng.gamma(2.0, 1.0, 4000) - 0.5, 1.0 + 2.0 * rng.standard_normal(4000)])
    return x, _moments(x)


def test_spec_fills_unspecified_values_from_data():
    x, m = _two_coordinates()
    first, second = choose_basis(m, spec="laguerre(theta=1),hermite(beta=0.5,loc=0,scale=1)")
    loc = m.minimum[0] - 1e-3 * m.std[0]
    assert first == Coordinate(Laguerre(theta=1.0, beta=1.0), loc, (m.mean[0] - loc) / 2.0)
    assert second == Coordinate(Hermite(beta=0.5), 0.0, 1.0)
    first, second = choose_basis(m, spec=" Hermite , auto ")
    assert first == Coordinate(Hermite(beta=0.5), m.mean[0], m.std[0])  # excess kurtosis ~3
    assert second == Coordinate(Hermite(beta=1.0), m.mean[1], m.std[1])
    first, _ = choose_basis(m, spec="laguerre(theta=2,loc=-0.5,scale=0.75,beta=0.5),auto")
    assert first == Coordinate(Laguerre(theta=2.0, beta=0.5), -0.5, 0.75)


def test_spec_accepts_objects_and_entry_strings():
    _, m = _two_coordinates()
    given = Coordinate(Laguerre(theta=0.5), loc=-1.0, scale=2.0)
    first, second = choose_basis(m, spec=[given, Hermite(beta=0.75)])
    assert first == given
    assert second == Coordinate(Hermite(beta=0.75), m.mean[1], m.std[1])
    _, second = choose_basis(m, spec=[Laguerre(theta=1.0), "hermite(scale=2)"])
    assert second == Coordinate(Hermite(beta=1.0), m.mean[1], 2.0)


@settings(max_examples=30, deadline=None)
@given(
    theta=st.floats(-0.99, 50.0),
    beta=st.floats(0.5, 1.45),  # beta >= 1.5 is refused on tails like these data's
    loc=st.floats(-1e6, -0.5),
    scale=st.floats(1e-6, 1e6),
    hermite_loc=st.floats(-1e9, 1e9),
)
def test_format_basis_round_trips(theta, beta, loc, scale, hermite_loc):
    _, m = _two_coordinates()
    coords = [
        Coordinate(Laguerre(theta=theta, beta=beta), loc=loc, scale=scale),
        Coordinate(Hermite(beta=beta), loc=hermite_loc, scale=scale),
    ]
    spec = format_basis(coords)
    assert choose_basis(m, spec=spec) == coords
    assert format_basis(choose_basis(m, spec=spec)) == spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("hermite,legendre", r"entry 1 \('legendre'\)"),
        ("hermite(gamma=1),auto", r"entry 0 .*unknown or malformed parameter 'gamma=1'"),
        ("auto,laguerre(beta=0.5,beta=1)", r"entry 1 .*duplicate parameter 'beta=1'"),
        ("hermite(beta=0.3),auto", r"entry 0 .*Hermite beta must be a finite number >= 1/2"),
        ("auto,hermite(scale=-1)", r"entry 1 .*scale must be a finite positive number, got -1.0"),
        ("auto,hermite(scale=0)", r"entry 1 .*scale must be a finite positive number, got 0.0"),
        ("laguerre(theta=one),auto", r"entry 0 .*bad value 'one' for 'theta'"),
        ("laguerre(theta=-1),auto", r"entry 0 .*Laguerre theta must be a finite number > -1"),
        ("hermite(loc=nan),auto", r"entry 0 .*bad value 'nan' for 'loc'"),
        ("hermite(beta),auto", r"entry 0 .*malformed parameter 'beta'"),
        ("auto(beta=1),auto", r"entry 0 \('auto\(beta=1\)'\)"),
        ("hermite,hermite,hermite", "3 entries for 2 coordinates"),
        ("hermite", "1 entries for 2 coordinates"),
        ("hermite,", r"entry 1 \(''\)"),
        ("hermite(beta=1,auto", "unbalanced"),
        ("hermite(beta=(1)),auto", "nested"),
    ],
)
def test_bad_specs_are_rejected_naming_the_entry(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_basis_spec(spec, 2)


def test_bad_object_spec_and_laguerre_shift_above_minimum():
    _, m = _two_coordinates()
    with pytest.raises(ValueError, match="entry 1: expected a Coordinate"):
        choose_basis(m, spec=[Hermite(), 3.0])
    with pytest.raises(ValueError, match="coordinate 1: Laguerre shift loc=0.0 is above"):
        choose_basis(m, spec="hermite,laguerre(theta=1,loc=0)")
    with pytest.raises(ValueError, match="coordinate 0: Laguerre shift"):
        choose_basis(m, spec=[Coordinate(Laguerre(), loc=0.0), "auto"])


def test_coordinates_from_a_full_spec_round_trip_and_refuse_missing_keys():
    from kelr_dist.kernels.bases.families import Coordinate, Hermite, Laguerre

    coords = [Coordinate(Laguerre(1.0, 1.0), -0.2, 0.42), Coordinate(Hermite(0.5), 0.1, 1.3)]
    assert coordinates_from_spec(format_basis(coords), 2) == coords
    with pytest.raises(ValueError, match="entry 1 .*missing loc, scale"):
        coordinates_from_spec(format_basis(coords[:1]) + ",hermite(beta=1)", 2)
    with pytest.raises(ValueError, match="entry 0 .*auto"):
        coordinates_from_spec("auto", 1)


@pytest.mark.parametrize("order", ["random", "increasing", "decreasing"])
def test_edge_samples_are_the_sorted_extremes_in_any_chunking(order):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5000, 2))
    x[:, 1] = np.round(x[:, 1], 1)  # ties
    if order != "random":
        x = np.sort(x, axis=0)[:: 1 if order == "increasing" else -1]
    x[17, 0] = np.nan  # sorted last, as numpy sorts
    k = EDGE_SAMPLES
    for chunks in (None, 700, 77):
        edges = reduce_in_memory(edge_reduction(), x, chunks)
        np.testing.assert_array_equal(edges.lowest, np.sort(x.T, axis=1)[:, :k])
        np.testing.assert_array_equal(edges.highest, -np.sort(-x.T, axis=1)[:, :k])
    few = reduce_in_memory(edge_reduction(), x[:10])
    np.testing.assert_array_equal(few.lowest, np.sort(x[:10].T, axis=1))
