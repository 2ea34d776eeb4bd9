"""The Fourier family on the circle: orthonormality, derivatives, and a von Mises density and
score recovered by both estimators."""

import math

import numpy as np
import pytest
from scipy import stats

from kelr_dist.kernels.bases.families import Coordinate, Fourier, TensorBasis, polynomials
from kelr_dist.kernels.bases.spec import coordinates_from_spec, format_basis, parse_basis_spec
from kelr_dist.kernels.scores.kernel_embedding import KernelDensity
from kelr_dist.kernels.scores.score_matching import PolynomialFeatures, gram_sums, solve_weights


def test_orthonormal_by_quadrature_to_order_150():
    # the trapezoid rule with Q nodes integrates trigonometric polynomials of degree < Q exactly
    nodes = 400
    theta = 2.0 * math.pi * np.arange(nodes) / nodes
    phi, _ = polynomials(Fourier(), theta, 150)
    gram = phi.T @ phi / nodes  # ∫ φ_m φ_n w dθ with w = 1/2π
    np.testing.assert_allclose(gram, np.eye(151), atol=1e-12)


def test_layout_values_and_derivatives():
    theta = np.linspace(-7.0, 7.0, 41)
    values, derivs = Fourier().evaluate(theta, 6)  # Ψ = φ / 2π (β = 1)
    root2 = math.sqrt(2.0) / (2.0 * math.pi)
    for k in (1, 2, 3):
        np.testing.assert_allclose(values[:, 2 * k - 1], root2 * np.cos(k * theta), atol=1e-14)
        np.testing.assert_allclose(values[:, 2 * k], root2 * np.sin(k * theta), atol=1e-14)
        np.testing.assert_allclose(derivs[:, 2 * k], k * root2 * np.cos(k * theta), atol=1e-13)
    np.testing.assert_allclose(values[:, 0], 1.0 / (2.0 * math.pi))
    second = Fourier().second_derivatives(theta, values, derivs)
    np.testing.assert_allclose(second[:, 5], -9.0 * values[:, 5], atol=1e-14)


def test_spec_round_trip_and_period():
    entries = parse_basis_spec("fourier(period=360),hermite", 2)
    assert entries[0] == ("fourier", {"scale": 360.0 / (2.0 * math.pi)})
    coordinates = coordinates_from_spec(
        "fourier(period=360,loc=0),hermite(beta=1,loc=0,scale=1)", 2
    )
    assert coordinates[0].period == pytest.approx(360.0)
    assert coordinates_from_spec(format_basis(coordinates), 2) == coordinates
    with pytest.raises(ValueError, match="period or scale"):
        parse_basis_spec("fourier(period=360,scale=2)", 1)
    with pytest.raises(ValueError, match="period > 0"):
        parse_basis_spec("fourier(period=-1)", 1)


KAPPA, MU = 1.5, 0.7


def von_mises(n: int, degrees: bool = False) -> np.ndarray:
    """``n`` von Mises(μ, κ) samples in (-π, π] (or degrees in [-180, 180)), ``(n, 1)``."""
    x = stats.vonmises(KAPPA, loc=MU).rvs(size=n, random_state=np.random.default_rng(3))
    x = (x + math.pi) % (2.0 * math.pi) - math.pi
    return (np.degrees(x) if degrees else x)[:, None]


def exact_score(theta: np.ndarray) -> np.ndarray:
    return -KAPPA * np.sin(theta - MU)


@pytest.mark.parametrize("degrees", [False, True])
def test_von_mises_density_and_score_by_the_kernel_embedding(degrees):
    x = von_mises(200_000, degrees)
    unit = math.pi / 180.0 if degrees else 1.0
    coordinate = Coordinate(Fourier(), loc=-math.pi / unit, scale=1.0 / unit)
    density = KernelDensity.fit(TensorBasis((coordinate,), 8), x)
    grid = np.linspace(-math.pi, math.pi, 181)[:, None]
    p = density.evaluate(grid / unit)[0]
    truth = stats.vonmises(KAPPA, loc=MU).pdf(grid[:, 0])
    np.testing.assert_allclose(p / unit, truth, atol=0.01)  # density of radians
    # the score (radians) on the samples: its Fisher divergence E|ŝ - s|² is small
    at, grad = density.evaluate(x[:20_000])
    fisher = np.mean((grad[:, 0] / at / unit - exact_score(x[:20_000, 0] * unit)) ** 2)
    assert fisher < 0.005
    # a Hermite expansion of the same data cannot follow the cliff of the density at ±π
    line = Coordinate(loc=0.0, scale=math.pi / unit / 1.8)
    hermite_p = KernelDensity.fit(TensorBasis((line,), 8), x).evaluate(grid / unit)[0] / unit
    assert np.abs(hermite_p - truth).max() > 5 * np.abs(p / unit - truth).max()


def test_von_mises_score_by_score_matching():
    x = von_mises(200_000)
    features = PolynomialFeatures((Coordinate(Fourier(), loc=-math.pi, scale=1.0),), 6)
    sums = gram_sums(features, x)
    gram, b = sums["gram"] / sums["n"], sums["b"] / sums["n"]
    (weights,) = solve_weights(gram, b, (0.0,))
    grid = np.linspace(-math.pi, math.pi, 181)[:, None]
    fitted = features.values(grid) @ weights.T
    np.testing.assert_allclose(fitted[:, 0], exact_score(grid[:, 0]), atol=0.1)
    fisher = np.mean(((features.values(x) @ weights.T)[:, 0] - exact_score(x[:, 0])) ** 2)
    assert fisher < 0.002
    # on the circle the score's Stein identity holds for the periodic features, not for θ:
    # E[θ s(θ)] = -(1 - 2π p(±π)) for the wrapped angle, not -1
    stein = np.mean(x[:, 0] * (features.values(x) @ weights.T)[:, 0])
    wrap = 2.0 * math.pi * stats.vonmises(KAPPA, loc=MU).pdf(math.pi)
    assert stein == pytest.approx(-(1.0 - wrap), abs=0.02)
    assert abs(stein + 1.0) > 0.1
