"""Tests for the test systems and their integrators (models.paper_systems, models.integrators).

Oracles: the exact equilibrium densities (normalised by midpoint quadrature on a grid), the
exact Ornstein-Uhlenbeck covariances ``expm(-Gamma t) C``, the paper's potentials written out
again in numpy, and finite differences. Monte-Carlo tolerances come from batch means, so
autocorrelated samples are judged by their real error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest

from kelr_dist.models.paper_systems import LangevinMorse, OrnsteinUhlenbeck, TripleWell
from kelr_dist.models.registry import MODEL_NAMES, Model, make_model

BATCHES = 40
SIGMAS = 5.0  # tolerance in batch-means standard errors (many statistics per test)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


@dataclass
class Exact:
    """Moments of a normalised density on a grid, and the marginal mass of coordinate 0 bins."""

    mean: np.ndarray  # (d,)
    second: np.ndarray  # (d, d) E[x x^T]
    bin_edges: np.ndarray  # (B+1,)
    bin_mass: np.ndarray  # (B,)


def exact_statistics(
    model: Model, lower: tuple[float, float], upper: tuple[float, float], cells: tuple[int, int]
) -> Exact:
    """Midpoint quadrature of ``exp(log_density)`` over a 2-D box; 40 bins along coordinate 0."""
    axes = [
        lo + (np.arange(n) + 0.5) * (hi - lo) / n
        for lo, hi, n in zip(lower, upper, cells, strict=True)
    ]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 2)
    log_p = model.log_density(grid)
    weight = np.exp(log_p - log_p.max())
    weight /= weight.sum()
    mean = weight @ grid
    second = (grid * weight[:, None]).T @ grid
    cells_per_bin = cells[0] // 40
    marginal = weight.reshape(cells).sum(axis=1)
    bin_mass = marginal.reshape(40, cells_per_bin).sum(axis=1)
    bin_edges = np.linspace(lower[0], upper[0], 41)
    return Exact(mean, second, bin_edges, bin_mass)


def batch_statistics(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per-batch mean (2), second moments (3) and coordinate-0 histogram mass: (BATCHES, 5+B)."""
    rows = []
    for batch in np.array_split(x, BATCHES):
        counts = np.histogram(batch[:, 0], bins=edges)[0] / len(batch)
        second = (batch.T @ batch / len(batch))[np.triu_indices(2)]
        rows.append(np.concatenate([batch.mean(axis=0), second, counts]))
    return np.array(rows)


def mismatch(x: np.ndarray, exact: Exact) -> np.ndarray:
    """|estimate - exact| / batch-means standard error, for every statistic: (5+B,)."""
    stats = batch_statistics(x, exact.bin_edges)
    estimate = stats.mean(axis=0)
    error = stats.std(axis=0, ddof=1) / math.sqrt(BATCHES)
    truth = np.concatenate([exact.mean, exact.second[np.triu_indices(2)], exact.bin_mass])
    # bins the chain never visits and the exact density leaves empty have no error bar
    return np.abs(estimate - truth) / np.maximum(error, 1e-4)


def run(model: Model, n_samples: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    state = model.initial_state(rng)
    state = model.advance(state, model.default_burn_in, rng)[1]
    return model.advance(state, n_samples, rng)[0]


def central_difference(f, x: np.ndarray, h: float = 1e-5) -> np.ndarray:
    """Gradient of the scalar-per-row ``f`` at ``x (n, d)`` by central differences: (n, d)."""
    grad = np.empty_like(x)
    for i in range(x.shape[1]):
        step = np.zeros(x.shape[1])
        step[i] = h
        grad[:, i] = (f(x + step) - f(x - step)) / (2 * h)
    return grad


TRIPLE_WELL_BOX = (-5.0, -5.5), (7.0, 6.5), (1200, 1200)
LANGEVIN_BOX = (-0.6, -7.0), (7.4, 7.0), (4000, 700)


# --------------------------------------------------------------------------------------------
# the paper's potentials, written out again (brute-force twins of the numba code)
# --------------------------------------------------------------------------------------------


def paper_triple_well(x: np.ndarray, a: float, gamma: float, variant: str) -> np.ndarray:
    """eq. 60 term by term; ``v`` applied to squared distances ``z``."""

    def v(z: np.ndarray) -> np.ndarray:
        # "paper": v(z) = 10 exp(1/(z^2 - a^2)) on |z| < a; "radial": the exponent holds r^2 = z
        inner = z**2 - a**2 if variant == "paper" else z - a**2
        with np.errstate(divide="ignore", over="ignore"):
            return np.where(inner < 0, 10 * np.exp(1 / np.minimum(inner, -1e-300)), 0.0)

    x1, x2 = x[:, 0], x[:, 1]
    return (
        -v(x1**2 + x2**2)
        - (1 - gamma) * v((x1 - 2 * a) ** 2 + x2**2)
        - (1 + gamma) * v((x1 - a) ** 2 + (x2 - math.sqrt(3) * a) ** 2)
        + 0.8 * ((x1 - a) ** 2 + (x2 - a / math.sqrt(3)) ** 2)
    )


def paper_morse(x: np.ndarray, epsilon: float, a: float, x0: float) -> np.ndarray:
    y = a * (x - x0)
    return epsilon * (np.exp(-2 * y) - 2 * np.exp(-y) + 0.03 * y**2)


def test_triple_well_potential_is_the_papers_formula() -> None:
    x = np.random.default_rng(1).uniform(-1.5, 3.5, size=(4000, 2))
    for variant in ("paper", "radial"):
        for a, gamma in ((1.0, 0.25), (1.3, 0.6)):
            model = TripleWell(a=a, gamma=gamma, variant=variant)
            expected = paper_triple_well(x, a, gamma, variant)
            np.testing.assert_allclose(model.potential(x), expected, rtol=1e-13, atol=1e-13)


def test_triple_well_variants_differ() -> None:
    x = np.random.default_rng(2).uniform(-1.0, 3.0, size=(2000, 2))
    paper, radial = TripleWell(variant="paper"), TripleWell(variant="radial")
    assert np.max(np.abs(paper.log_density(x) - radial.log_density(x))) > 0.5
    # equally deep at the well centres (10 exp(-1/a^2)); flat (r^4) versus rounded (r^2) around
    assert paper.potential(np.array([[0.0, 0.0]]))[0] == radial.potential(np.array([[0, 0.0]]))[0]


def test_morse_potential_is_the_papers_formula() -> None:
    x = np.linspace(-0.3, 4.0, 1001)
    model = LangevinMorse(epsilon=0.3, a=7.0, x0=0.2)
    np.testing.assert_allclose(model.potential(x), paper_morse(x, 0.3, 7.0, 0.2), rtol=1e-13)


# --------------------------------------------------------------------------------------------
# gradients and scores
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["paper", "radial"])
def test_triple_well_gradient_matches_finite_differences(variant: str) -> None:
    model = TripleWell(variant=variant)
    x = np.random.default_rng(3).uniform(-1.2, 3.2, size=(3000, 2))
    np.testing.assert_allclose(
        model.gradient(x), central_difference(model.potential, x), rtol=1e-6, atol=1e-6
    )


def test_morse_slope_matches_finite_differences() -> None:
    model = LangevinMorse()
    x = np.linspace(-0.2, 3.0, 777)[:, None]
    fd = central_difference(lambda p: model.potential(p[:, 0]), x, h=1e-6)[:, 0]
    np.testing.assert_allclose(model.force_slope(x[:, 0]), fd, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize(
    "model",
    [TripleWell(), TripleWell(variant="radial", kT=0.7), LangevinMorse(), OrnsteinUhlenbeck()],
    ids=lambda m: f"{m.name}-{m.params().get('variant', '')}",
)
def test_score_is_gradient_of_log_density(model: Model) -> None:
    rng = np.random.default_rng(4)
    if isinstance(model, LangevinMorse):
        x = np.column_stack([rng.uniform(-0.2, 3.0, 2000), rng.normal(size=2000)])
    else:
        x = rng.uniform(-1.2, 3.2, size=(2000, 2))
    score = model.score(x)
    assert score.shape == x.shape
    scale = np.abs(score).max()
    np.testing.assert_allclose(
        score, central_difference(model.log_density, x), rtol=1e-6, atol=1e-7 * scale
    )


# --------------------------------------------------------------------------------------------
# equilibrium statistics of the samplers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["paper", "radial"])
def test_triple_well_kernel_steps_are_the_weak_trapezoidal_scheme(variant: str) -> None:
    """The compiled step (its terms regrouped for speed) against the scheme written out in
    numpy with the model's own gradient: y = x + b(x) h/2 + s z1, x' = y + (2 b(y) - b(x)) h/2
    + s z2, s = sqrt(2 kT h/2), b = -grad V."""
    from kelr_dist.models.integrators import weak_trapezoidal_triple_well

    model = TripleWell(variant=variant, subsample=1)
    normals = np.random.default_rng(9).standard_normal((300, 4))
    x0 = np.array([0.3, 0.2])
    out = weak_trapezoidal_triple_well(  # draws the same normals, in the same order
        x0, np.random.default_rng(9), np.empty((300, 2)), model.step, 1, model.a, model.gamma,
        model.kT, variant == "radial",
    )  # fmt: skip
    half, noise = model.step / 2, math.sqrt(2 * model.kT * model.step / 2)
    x, expected = x0, []
    for z in normals:
        drift = -model.gradient(x[None])[0]
        y = x + drift * half + noise * z[:2]
        x = y + (2 * -model.gradient(y[None])[0] - drift) * half + noise * z[2:]
        expected.append(x)
    np.testing.assert_allclose(out, np.array(expected), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", ["paper", "radial"])
def test_triple_well_samples_match_density(variant: str) -> None:
    model = TripleWell(variant=variant)
    other = TripleWell(variant="radial" if variant == "paper" else "paper")
    exact = exact_statistics(model, *TRIPLE_WELL_BOX)
    exact_other = exact_statistics(other, *TRIPLE_WELL_BOX)
    assert exact.bin_mass[0] < 1e-9 and exact.bin_mass[-1] < 1e-9  # the box holds p_eq
    x = run(model, 800_000, seed=11)
    assert mismatch(x, exact).max() < SIGMAS
    # the test can fail: the samples are distinguishable from the other reading of the paper
    assert mismatch(x, exact_other).max() > 2 * SIGMAS


def test_langevin_samples_match_density() -> None:
    model = LangevinMorse()
    exact = exact_statistics(model, *LANGEVIN_BOX)
    assert exact.bin_mass[0] < 1e-9 and exact.bin_mass[-1] < 1e-9
    x = run(model, 400_000, seed=12)
    assert mismatch(x, exact).max() < SIGMAS
    # a 25% temperature error would be seen
    assert mismatch(x, exact_statistics(LangevinMorse(kT=1.25), *LANGEVIN_BOX)).max() > SIGMAS


def test_ou_exact_sampling_moments() -> None:
    model = OrnsteinUhlenbeck()
    cov = model.stationary_covariance()
    exact = Exact(
        np.zeros(2),
        cov,
        np.linspace(-6, 6, 41),
        np.diff(
            [0.5 * (1 + math.erf(e / math.sqrt(2 * cov[0, 0]))) for e in np.linspace(-6, 6, 41)]
        ),
    )
    x = run(model, 200_000, seed=13)
    assert mismatch(x, exact).max() < SIGMAS
    # a mis-specified covariance (10% larger) is detected
    exact.second = 1.1 * cov
    assert mismatch(x, exact).max() > SIGMAS


def test_ou_lag_covariances() -> None:
    model = OrnsteinUhlenbeck()
    x = run(model, 200_000, seed=14)
    lags = np.array([1, 10, 20, 40])
    expected = model.lag_covariance(lags * model.dt)
    for lag, exact in zip(lags, expected, strict=True):
        products = np.einsum("ni,nj->nij", x[lag:], x[:-lag])  # x(t + s) x(t)^T
        batches = np.array([b.mean(axis=0) for b in np.array_split(products, BATCHES)])
        error = batches.std(axis=0, ddof=1) / math.sqrt(BATCHES)
        assert np.all(np.abs(batches.mean(axis=0) - exact) < SIGMAS * error)


def test_ou_closed_forms() -> None:
    model = OrnsteinUhlenbeck(gamma=[[1.0, 0.6], [-0.4, 0.8]], sigma=[[1.0, 0.3], [0.0, 0.7]])
    gamma, sigma = np.array(model.params()["gamma"]), np.array(model.params()["sigma"])
    cov = model.stationary_covariance()
    np.testing.assert_allclose(gamma @ cov + cov @ gamma.T, sigma @ sigma.T, atol=1e-13)
    t = np.array([0.0, 0.3, 1.7])
    response = model.response(t)
    np.testing.assert_allclose(response[0], np.eye(2), atol=1e-15)
    h = 1e-6
    derivative = (model.response(t + h) - model.response(t - h)) / (2 * h)
    np.testing.assert_allclose(derivative, -gamma @ response, atol=1e-8)
    np.testing.assert_allclose(model.lag_covariance(t), response @ cov, atol=1e-14)
    # the exact response for A = x, constant forcing is E[x(t) (-score(x(0)))^T] (eq. 5)
    x = np.random.default_rng(5).normal(size=(5, 2))
    np.testing.assert_allclose(model.score(x), -x @ np.linalg.inv(cov), rtol=1e-12)


# --------------------------------------------------------------------------------------------
# resumability, round trips, errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_advance_split_is_bit_identical(name: str) -> None:
    model = make_model(name)
    start = model.initial_state(np.random.default_rng(7))
    whole, end = model.advance(start, 20_000, np.random.default_rng(8))
    for cuts in ([0, 1, 20_000], [0, 3_277, 9_001, 9_002, 20_000], [0, 6_553, 13_107, 20_000]):
        rng = np.random.default_rng(8)
        state, parts = start, []
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
            part, state = model.advance(state, hi - lo, rng)
            parts.append(part)
        assert np.array_equal(np.concatenate(parts), whole)
        assert np.array_equal(state, end)
    assert whole.dtype == np.float64 and whole.shape == (20_000, len(model.components))
    assert np.array_equal(end, whole[-1])


def test_advance_zero_samples_and_input_untouched() -> None:
    model = make_model("triple-well")
    rng = np.random.default_rng(0)
    state = model.initial_state(rng)
    before = rng.bit_generator.state
    samples, new = model.advance(state, 0, rng)
    assert samples.shape == (0, 2) and np.array_equal(new, state)
    assert rng.bit_generator.state == before
    kept = state.copy()
    model.advance(state, 10, rng)
    assert np.array_equal(state, kept)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("triple-well", {}),
        ("triple-well", {"variant": "radial", "kT": 1.0, "subsample": 3}),
        ("langevin-morse", {"gamma": 1.5, "x0": 0.5}),
        ("ou", {"gamma": [[2.0, 1.0, 0.0], [-1.0, 1.0, 0.0], [0.0, 0.5, 1.0]], "dt": 0.1,
                "sigma": np.eye(3).tolist()}),
    ],
)  # fmt: skip
def test_make_model_round_trip(name: str, params: dict) -> None:
    model = make_model(name, **params)
    assert isinstance(model, Model) and model.name == name
    rebuilt = make_model(name, **json.loads(json.dumps(model.params())))
    assert rebuilt.params() == model.params()
    assert rebuilt.dt == model.dt and rebuilt.components == model.components
    a = model.advance(model.initial_state(np.random.default_rng(1)), 500, np.random.default_rng(2))
    b = rebuilt.advance(
        rebuilt.initial_state(np.random.default_rng(1)), 500, np.random.default_rng(2)
    )
    assert np.array_equal(a[0], b[0])


def test_model_metadata() -> None:
    assert {"triple-well", "langevin-morse", "ou"} <= set(MODEL_NAMES)
    assert make_model("triple-well").dt == pytest.approx(5e-3)
    assert make_model("langevin-morse").dt == pytest.approx(1e-2)
    assert make_model("langevin-morse").components == ("x", "v")
    assert make_model("ou", gamma=[[1.0]], sigma=[[1.0]]).components == ("x1",)
    # a model is itself: models with other parameters (or none at all) are not equal
    assert make_model("triple-well") != make_model("triple-well", kT=1.0)


@pytest.mark.parametrize(
    ("name", "params", "named"),
    [
        ("double-well", {}, "double-well"),
        ("triple-well", {"temperature": 1.0}, "temperature"),
        ("triple-well", {"variant": "spherical"}, "spherical"),
        ("triple-well", {"kT": -1.0}, "kT"),
        ("triple-well", {"gamma": 1.5}, "gamma"),
        ("triple-well", {"subsample": 0}, "subsample"),
        ("triple-well", {"step": float("nan")}, "step"),
        ("langevin-morse", {"a": 0.0}, "a="),
        ("langevin-morse", {"x0": float("inf")}, "x0"),
        ("ou", {"gamma": [[1.0, 0.0], [0.0, -0.5]]}, "gamma"),
        ("ou", {"gamma": [1.0, 2.0]}, "gamma"),
        ("ou", {"sigma": [[1.0, 0.0], [1.0, 0.0]]}, "sigma"),
        ("ou", {"sigma": [[1.0]]}, "sigma"),
        ("ou", {"dt": 0}, "dt"),
        ("ou", {"dt": 1e-20}, "dt"),
        ("ou", {"gamma": [["a", 0.0], [0.0, 1.0]]}, "gamma"),
        ("triple-well", {"kT": "hot"}, "kT"),
        ("triple-well", {"subsample": 2.5}, "subsample"),
    ],
)
def test_bad_names_and_parameters_are_named(name: str, params: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_model(name, **params)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_bad_advance_arguments_are_named(name: str) -> None:
    model = make_model(name)
    rng = np.random.default_rng(0)
    for n_samples in (-1, 2.0, True):
        with pytest.raises(ValueError, match="n_samples"):
            model.advance(np.zeros(2), n_samples, rng)
    with pytest.raises(ValueError, match="state"):
        model.advance(np.zeros(len(model.components) + 1), 10, rng)
