"""Tests for the benchmark systems (kelr_dist.models.benchmark_systems): closed-form p_eq, MALA.

Oracles: finite differences of ``log_density``; the potentials written out again in numpy; exact
moments (Student-t, Gamma, Gaussian), 1-D quadrature of independent factors (coupled-3d),
transfer-matrix quadrature of the chain densities (coupled-4d/6d) and 2-D grid quadrature
(curved-wells); the exact CIR / OU autocovariances (wall). Sample statistics are judged in
batch-means standard errors, so autocorrelated chains are held to their real error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from kelr_dist.models.benchmark_systems import (
    SYSTEMS,
    AnharmonicChain,
    Coupled3D,
    Coupled4D,
    Coupled6D,
    CurvedWells,
    HeavyTail,
    Wall,
)
from kelr_dist.models.registry import MODEL_NAMES, Model, make_model

NAMES = tuple(cls.name for cls in SYSTEMS)
MALA_NAMES = tuple(name for name in NAMES if name != "wall")
BATCHES = 40
SIGMAS = 5.0  # tolerance in batch-means standard errors (many statistics per test)
N_SAMPLES = 200_000
#: samplers with 18-27% of proposals rejected, for the tests of the stationary law: MALA leaves
#: p_eq exactly invariant at any step, so these test the Metropolis correction where it has the
#: most to correct, at 1/10-1/50 of the cost per sample of the default steps (which are set for
#: the dynamics: tests/test_mala_tilt.py)
COARSE = {
    "curved-wells": {"step": 0.03, "subsample": 10},
    "coupled-3d": {"step": 0.04, "subsample": 10},
    "coupled-4d": {"step": 0.04, "subsample": 5},
    "coupled-6d": {"step": 0.04, "subsample": 5},
    "trig-4d": {"step": 0.04, "subsample": 5},
    "gamma-3d": {"step": 0.25, "subsample": 5},
    "heavy-tail": {"step": 0.3, "subsample": 2},
}

Statistic = Callable[[np.ndarray], np.ndarray]  # (n, d) samples -> (n, k) values


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def coarse(model: Model) -> Model:
    """``model`` with its :data:`COARSE` sampler (itself if it has none)."""
    sampler = COARSE.get(model.name)
    return model if sampler is None else make_model(model.name, **{**model.params(), **sampler})


def run(model: Model, n_samples: int = N_SAMPLES, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    state = model.initial_state(rng)
    state = model.advance(state, model.default_burn_in, rng)[1]
    return model.advance(state, n_samples, rng)[0]


def assert_matches(x: np.ndarray, statistic: Statistic, exact: np.ndarray) -> None:
    """Every column of ``statistic(x)`` averages to ``exact`` within SIGMAS batch-means errors."""
    values = statistic(x)
    batches = np.array([b.mean(axis=0) for b in np.array_split(values, BATCHES)])
    estimate = values.mean(axis=0)
    error = batches.std(axis=0, ddof=1) / math.sqrt(BATCHES)
    z = np.abs(estimate - exact) / np.maximum(error, 1e-12)
    assert z.max() < SIGMAS, f"estimate {estimate}\nexact    {exact}\nz        {z}"


def central_difference(f, x: np.ndarray, h: float = 1e-5) -> np.ndarray:
    """Gradient of the scalar-per-row ``f`` at ``x (n, d)`` by central differences: (n, d)."""
    grad = np.empty_like(x)
    for i in range(x.shape[1]):
        step = np.zeros(x.shape[1])
        step[i] = h
        grad[:, i] = (f(x + step) - f(x - step)) / (2 * h)
    return grad


def grid(lower: float, upper: float, n: int) -> np.ndarray:
    """Midpoints of ``n`` equal cells of ``[lower, upper]``."""
    return lower + (np.arange(n) + 0.5) * (upper - lower) / n


def normalised(log_w: np.ndarray) -> np.ndarray:
    w = np.exp(log_w - log_w.max())
    return w / w.sum()


# --------------------------------------------------------------------------------------------
# the potentials written out again (numpy twins of the numba code)
# --------------------------------------------------------------------------------------------


def curved_wells_potential(u: np.ndarray, v: np.ndarray, m: CurvedWells) -> np.ndarray:
    a = m.spacing
    profile = m.barrier * 27 / (4 * a**6) * u**2 * (u**2 - a**2) ** 2 + m.tilt * u
    return profile + 0.5 * m.stiffness * (v - m.curvature * u**2) ** 2


def coupled_3d_factors(m: Coupled3D) -> list[Callable[[np.ndarray], np.ndarray]]:
    """The potentials of the independent coordinates ``x1``, ``y2``, ``y3``."""
    return [
        lambda s: m.barrier * (s**2 - 1) ** 2 + m.tilt * s,
        lambda y: y**2 / 2 + m.quartic2 * y**4 / 4,
        lambda y: y**2 / 2 + m.cubic3 * y**3 / 3 + m.quartic3 * y**4 / 4,
    ]


def chain_sites(m: AnharmonicChain) -> list[Callable[[np.ndarray], np.ndarray]]:
    oscillator = lambda z: z**2 / 2 + m.cubic * z**3 / 3 + m.quartic * z**4 / 4  # noqa: E731
    first = lambda z: m.barrier * (z**2 - 1) ** 2 + m.tilt * z  # noqa: E731
    return [first] + [oscillator] * (m.dimension - 1)


def chain_potential(x: np.ndarray, m: AnharmonicChain) -> np.ndarray:
    sites = chain_sites(m)
    v = sum(site(x[:, i]) for i, site in enumerate(sites))
    return v + 0.5 * m.coupling * (np.diff(x, axis=1) ** 2).sum(axis=1)


def test_log_densities_are_the_documented_formulas() -> None:
    rng = np.random.default_rng(3)
    m = CurvedWells(angle=40.0, center=(0.3, 2.0), kT=0.8)
    x = rng.uniform(-3, 3, size=(500, 2))
    uv = m.to_local(x)
    np.testing.assert_allclose(m.from_local(uv), x, atol=1e-12)
    expected = -curved_wells_potential(uv[:, 0], uv[:, 1], m) / m.kT
    np.testing.assert_allclose(m.log_density(x), expected, rtol=1e-12, atol=1e-9)

    m3 = Coupled3D(kT=1.3)
    x = rng.uniform(-2, 2, size=(500, 3))
    y = np.column_stack([x[:, 0], x[:, 1] - m3.a * x[:, 0], x[:, 2] - m3.b * x[:, 1]])
    np.testing.assert_allclose(m3.factors(x), y, atol=1e-14)
    v = sum(f(y[:, k]) for k, f in enumerate(coupled_3d_factors(m3)))
    np.testing.assert_allclose(m3.log_density(x), -v / m3.kT, rtol=1e-12, atol=1e-9)

    for chain in (Coupled4D(kT=0.9), Coupled6D(coupling=0.5)):
        x = rng.uniform(-2, 2, size=(500, chain.dimension))
        expected = -chain_potential(x, chain) / chain.kT
        np.testing.assert_allclose(chain.log_density(x), expected, rtol=1e-12, atol=1e-9)

    t = HeavyTail()
    x = rng.normal(size=(500, 2)) * 4
    r = x - t.loc
    q = np.einsum("ni,ij,nj->n", r, np.linalg.inv(t.scale), r)
    expected = -(t.nu + 2) / 2 * np.log1p(q / t.nu)
    np.testing.assert_allclose(t.log_density(x), expected, rtol=1e-12, atol=1e-12)
    # normalised, it is scipy's multivariate t
    reference = stats.multivariate_t(loc=t.loc, shape=t.scale, df=t.nu).logpdf(x)
    assert np.ptp(reference - t.log_density(x)) < 1e-10

    w = Wall()
    x = np.column_stack([rng.uniform(0.01, 5, 500), rng.normal(size=500)])
    reference = stats.gamma(w.shape, scale=w.mean / w.shape).logpdf(x[:, 0]) + stats.norm(
        w.coupling * x[:, 0], w.sigma_w
    ).logpdf(x[:, 1])
    assert np.ptp(reference - w.log_density(x)) < 1e-10
    assert w.log_density(np.array([[0.0, 0.0], [-1.0, 0.0]])).tolist() == [-np.inf] * 2


# --------------------------------------------------------------------------------------------
# scores
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_score_is_gradient_of_log_density(name: str) -> None:
    model = make_model(name)
    rng = np.random.default_rng(4)
    x = run(coarse(model), 2000)[::2]
    x = np.concatenate([x, x + 0.3 * rng.normal(size=x.shape)])
    if name in ("wall", "gamma-3d"):  # inside the support
        x[:, 0] = np.abs(x[:, 0]) + 1e-2
    score = model.score(x)
    assert score.shape == x.shape and score.dtype == np.float64
    fd = central_difference(model.log_density, x)
    np.testing.assert_allclose(score, fd, rtol=1e-6, atol=1e-6 * np.abs(score).max())


def test_wall_score_outside_the_support_is_nan() -> None:
    score = Wall().score(np.array([[0.0, 0.0], [-1.0, 2.0], [1.0, 0.0]]))
    assert np.isnan(score[:2, 0]).all() and np.isfinite(score[2]).all()


# --------------------------------------------------------------------------------------------
# equilibrium statistics of the samplers
# --------------------------------------------------------------------------------------------


def moments_and_products(x: np.ndarray) -> np.ndarray:
    """Columns: x_i, then x_i x_j for i <= j."""
    i, j = np.triu_indices(x.shape[1])
    return np.column_stack([x, x[:, i] * x[:, j]])


def exact_moments_and_products(mean: np.ndarray, second: np.ndarray) -> np.ndarray:
    return np.concatenate([mean, second[np.triu_indices(len(mean))]])


def test_curved_wells_samples_match_quadrature() -> None:
    m = CurvedWells()
    a, b = m.spacing, m.curvature
    u = grid(-a - 1.6, a + 1.6, 1200)
    v = grid(-4.0, b * (a + 1.6) ** 2 + 4.0, 1200)
    uu, vv = np.meshgrid(u, v, indexing="ij")
    w = normalised(-curved_wells_potential(uu, vv, m).ravel() / m.kT)
    edges = np.concatenate(
        [w.reshape(uu.shape)[[0, -1]].ravel(), w.reshape(uu.shape)[:, [0, -1]].ravel()]
    )
    assert edges.max() < 1e-14  # the box holds all the mass
    points = m.from_local(np.column_stack([uu.ravel(), vv.ravel()]))
    mean = w @ points
    second = (points * w[:, None]).T @ points
    cuts = [-a / math.sqrt(3), a / math.sqrt(3)]  # the barrier tops of the u profile
    well = np.digitize(uu.ravel(), cuts)
    occupation = np.bincount(well, weights=w, minlength=3)
    assert occupation.min() > 0.15  # three wells, each well populated

    x = run(coarse(m))
    well_of = lambda x: np.digitize(m.to_local(x)[:, 0], cuts)  # noqa: E731
    assert np.count_nonzero(np.diff(well_of(x))) > 1000  # the chain crosses between the wells
    assert_matches(
        x,
        lambda x: np.column_stack(
            [moments_and_products(x), well_of(x)[:, None] == np.arange(3)]
        ).astype(float),
        np.concatenate([exact_moments_and_products(mean, second), occupation]),
    )


def factor_moments(potential: Callable, kT: float, lower: float, upper: float) -> np.ndarray:
    """``E[s], E[s^2], E[s^3]`` of the 1-D density ``∝ exp(-potential / kT)``: (3,)."""
    s = grid(lower, upper, 20_000)
    w = normalised(-potential(s) / kT)
    return np.array([w @ s, w @ s**2, w @ s**3])


@pytest.mark.parametrize(
    ("params", "n_samples"),
    [({}, 50_000), ({"step": 0.2, "subsample": 10}, N_SAMPLES)],
    ids=["default", "coarse-step"],
)
def test_coupled_3d_samples_match_factor_quadrature(params: dict, n_samples: int) -> None:
    """The factors are independent with known 1-D laws; a coarse step (acceptance ~0.3, where
    unadjusted Langevin would be visibly biased) must be just as exact."""
    m = Coupled3D(**params)
    exact = [factor_moments(f, m.kT, -6.0, 6.0) for f in coupled_3d_factors(m)]
    s = grid(-6.0, 6.0, 20_000)
    ws = normalised(-coupled_3d_factors(m)[0](s) / m.kT)
    p_right = ws[s > 0].sum()
    assert 0.2 < p_right < 0.8

    means = np.array([e[0] for e in exact])
    i, j = np.triu_indices(3, k=1)

    def statistic(x: np.ndarray) -> np.ndarray:
        y = m.factors(x)
        return np.column_stack([y, y**2, y**3, y[:, i] * y[:, j], x[:, 0] > 0])

    truth = np.concatenate(
        [np.concatenate([[e[k] for e in exact] for k in range(3)]), means[i] * means[j], [p_right]]
    )
    model_samples = run(m, n_samples)
    if params:
        acceptance = m.advance_with_acceptance(model_samples[-1], 1000, np.random.default_rng(0))[2]
        assert acceptance < 0.5
    assert_matches(model_samples, statistic, truth)


def chain_marginals(m: AnharmonicChain, half_width: float = 5.0, n: int = 1000):
    """Transfer-matrix quadrature: 1-D marginals ``(d, n)`` and neighbour pairs ``(d-1, n, n)``."""
    z = grid(-half_width, half_width, n)
    d = m.dimension
    f = np.array([np.exp(-site(z) / m.kT) for site in chain_sites(m)])
    kernel = np.exp(-0.5 * m.coupling * (z[:, None] - z[None, :]) ** 2 / m.kT)
    alpha = [f[0] / f[0].sum()]
    for i in range(1, d):
        nxt = f[i] * (alpha[-1] @ kernel)
        alpha.append(nxt / nxt.sum())
    beta = [np.ones(n)]
    for i in range(d - 2, -1, -1):
        prev = kernel @ (f[i + 1] * beta[0])
        beta.insert(0, prev / prev.sum())
    marginals = np.array([a * bt / (a * bt).sum() for a, bt in zip(alpha, beta, strict=True)])
    pairs = []
    for i in range(d - 1):
        joint = alpha[i][:, None] * kernel * (f[i + 1] * beta[i + 1])[None, :]
        pairs.append(joint / joint.sum())
    return z, marginals, np.array(pairs)


@pytest.mark.parametrize("cls", [Coupled4D, Coupled6D])
def test_chain_samples_match_transfer_matrix_quadrature(cls: type) -> None:
    m = cls()
    z, marginals, pairs = chain_marginals(m)
    assert marginals[:, [0, -1]].max() < 1e-14
    # the pair marginals are consistent with the 1-D ones
    np.testing.assert_allclose(pairs.sum(axis=2), marginals[:-1], atol=1e-12)
    d = m.dimension
    truth = np.concatenate([
        marginals @ z, marginals @ z**2, marginals @ z**3,
        np.einsum("ikl,k,l->i", pairs, z, z), [marginals[0][z > 0].sum()],
    ])  # fmt: skip

    def statistic(x: np.ndarray) -> np.ndarray:
        return np.column_stack([x, x**2, x**3, x[:, :-1] * x[:, 1:], x[:, 0] > 0])

    x = run(coarse(m))
    assert x.shape == (N_SAMPLES, d)
    assert_matches(x, statistic, truth)


def test_heavy_tail_samples_match_student_t() -> None:
    m = HeavyTail()
    d = 2
    levels = np.array([0.25, 0.5, 0.75, 0.95, 0.99])
    thresholds = d * stats.f(d, m.nu).ppf(levels)  # (x - loc)^T Q (x - loc) / d ~ F(d, nu)
    precision = np.linalg.inv(m.scale)

    def statistic(x: np.ndarray) -> np.ndarray:
        r = x - m.loc
        q = np.einsum("ni,ij,nj->n", r, precision, r)
        return np.column_stack([moments_and_products(x), q[:, None] <= thresholds])

    second = m.covariance() + np.outer(m.loc, m.loc)
    truth = np.concatenate([exact_moments_and_products(m.loc, second), levels])
    assert_matches(run(coarse(m)), statistic, truth)
    assert m.nu / (m.nu - 2) * m.scale == pytest.approx(m.covariance())


def test_wall_samples_match_gamma_gaussian_law_and_dynamics() -> None:
    m = Wall()
    x = run(m)
    assert x[:, 0].min() > 0
    k, theta, c, sw = m.shape, m.mean / m.shape, m.coupling, m.sigma_w
    raw = [k * theta, k * (k + 1) * theta**2, k * (k + 1) * (k + 2) * theta**3]
    levels = np.array([0.05, 0.25, 0.5, 0.75, 0.95])
    quantiles = stats.gamma(k, scale=theta).ppf(levels)
    var1 = k * theta**2
    lags = (1, 10, 40)

    def statistic(x: np.ndarray) -> np.ndarray:
        x1, x2 = x[:, 0], x[:, 1]
        w = x2 - c * x1
        n = len(x) - max(lags)
        lagged = [(x1[s : s + n] - m.mean) * (x1[:n] - m.mean) for s in lags]
        lagged += [w[s : s + n] * w[:n] for s in lags]
        columns = [x1, x1**2, x1**3, x2, x2**2, x1 * x2, *(x1[:, None] <= quantiles).T]
        return np.column_stack([col[:n] for col in columns] + lagged)

    truth = np.concatenate([
        raw, [c * raw[0], c**2 * raw[1] + sw**2, c * raw[1]], levels,
        [var1 * math.exp(-m.kappa * s * m.dt) for s in lags],
        [sw**2 * math.exp(-m.gamma * s * m.dt) for s in lags],
    ])  # fmt: skip
    assert_matches(x, statistic, truth)


def test_gamma_tie_marginals() -> None:
    """``x1 ~ Gamma(k, 1)``, ``E[x2] = alpha psi(k)``, ``E[x3] = gamma E[x2^2]``: sample means
    within 5 standard errors (tau ~6 samples, 20 counted)."""
    from scipy.special import digamma, polygamma

    model = make_model("gamma-3d")
    x = run(coarse(model), 200_000)
    k, alpha, gamma = model.shape, model.alpha, model.gamma
    mean_x2 = alpha * digamma(k)
    second_x2 = 1.0 + alpha**2 * (polygamma(1, k) + digamma(k) ** 2)
    truth = np.array([k, mean_x2, gamma * second_x2])
    stderr = x.std(axis=0) * np.sqrt(20.0 / x.shape[0])
    assert np.all(np.abs(x.mean(axis=0) - truth) < 5 * stderr)


def test_gamma_tie_visits_small_x1_as_often_as_its_law() -> None:
    """Near ``x1 = 0`` the score grows like ``1 / x1``: a chain stepping in ``x1`` rejects almost
    every step into ``x1 < 0.1`` (a sixth of the Gamma law's share there, and too many just
    above); stepping in ``log x1`` it visits both as often as the law says."""
    x1 = run(coarse(make_model("gamma-3d")), 500_000)[:, 0]
    for level in (0.1, 0.2):
        expected = 1.0 - math.exp(-level) * (1.0 + level + level**2 / 2)  # Gamma(3, 1) cdf
        assert abs((x1 < level).mean() / expected - 1.0) < 0.3


@pytest.mark.parametrize("name", MALA_NAMES)
def test_default_acceptance_rates(name: str) -> None:
    """At the default steps (``h E[s_i^2] <= 0.02``) rejections are rare; at the coarse ones
    common."""
    model = make_model(name)
    state = run(coarse(model), 10)[-1]
    _, _, acceptance = model.advance_with_acceptance(state, 2_000, np.random.default_rng(1))
    assert acceptance > 0.99
    _, _, acceptance = coarse(model).advance_with_acceptance(
        state, 20_000, np.random.default_rng(1)
    )
    assert 0.6 < acceptance < 0.9


# --------------------------------------------------------------------------------------------
# resumability, registry, round trips, errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_advance_split_is_bit_identical(name: str) -> None:
    model = make_model(name)
    start = model.initial_state(np.random.default_rng(7))
    whole, end = model.advance(start, 20_000, np.random.default_rng(8))
    for cuts in ([0, 1, 20_000], [0, 3_277, 9_001, 9_002, 20_000], [0, 0, 6_553, 20_000]):
        rng = np.random.default_rng(8)
        state, parts = start, []
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
            part, state = model.advance(state, hi - lo, rng)
            parts.append(part)
        assert np.array_equal(np.concatenate(parts), whole)
        assert np.array_equal(state, end)
    d = len(model.components)
    assert whole.dtype == np.float64 and whole.shape == (20_000, d)
    assert np.array_equal(end, whole[-1])
    kept = start.copy()
    model.advance(start, 10, np.random.default_rng(0))
    assert np.array_equal(start, kept)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("curved-wells", {}),
        ("curved-wells", {"angle": -15.0, "center": [0.0, 2.0], "kT": 0.7, "subsample": 3}),
        ("coupled-3d", {"a": -0.5, "cubic3": 0.0, "step": 0.01}),
        ("coupled-4d", {"coupling": 2.0, "tilt": 0.0}),
        ("coupled-6d", {"barrier": 2.0}),
        ("heavy-tail", {"nu": 7, "scale": [[2.0, -0.3, 0.0], [-0.3, 1.0, 0.2], [0.0, 0.2, 0.5]],
                        "loc": [0, 1, 2]}),
        ("wall", {"shape": 1, "dt": 0.2, "coupling": -1.0}),
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
    assert np.array_equal(a[0], b[0]) and np.isfinite(a[0]).all()


def test_registry_and_metadata() -> None:
    assert set(NAMES) <= set(MODEL_NAMES)
    assert NAMES == (
        "curved-wells", "coupled-3d", "coupled-4d", "coupled-6d", "heavy-tail", "wall", "trig-4d",
        "gamma-3d",
    )  # fmt: skip
    dims = {name: len(make_model(name).components) for name in NAMES}
    assert dims == {
        "curved-wells": 2, "coupled-3d": 3, "coupled-4d": 4, "coupled-6d": 6, "heavy-tail": 2,
        "wall": 2, "trig-4d": 4, "gamma-3d": 3,
    }  # fmt: skip
    assert make_model("curved-wells").dt == pytest.approx(0.3)
    assert make_model("wall").dt == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("name", "params", "named"),
    [
        ("curved-wells", {"barrier": 0.0}, "barrier"),
        ("curved-wells", {"center": [1.0]}, "center"),
        ("curved-wells", {"step": -0.1}, "step"),
        ("coupled-3d", {"quartic3": -1.0}, "quartic3"),
        ("coupled-4d", {"subsample": 0}, "subsample"),
        ("coupled-6d", {"kT": "hot"}, "kT"),
        ("heavy-tail", {"nu": 2.0}, "nu"),
        ("heavy-tail", {"scale": [[1.0, 2.0], [2.0, 1.0]]}, "scale"),
        ("heavy-tail", {"loc": [0.0, 0.0, 0.0]}, "loc"),
        ("wall", {"shape": 2.2}, "shape"),
        ("wall", {"shape": 0.5}, "shape"),
        ("wall", {"dt": 0.0}, "dt"),
        ("wall", {"theta": 1.0}, "theta"),
    ],
)
def test_bad_parameters_are_named(name: str, params: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_model(name, **params)


@pytest.mark.parametrize("name", NAMES)
def test_bad_advance_arguments_are_named(name: str) -> None:
    model = make_model(name)
    d = len(model.components)
    rng = np.random.default_rng(0)
    state = model.initial_state(rng)
    for n_samples in (-1, 2.0, True):
        with pytest.raises(ValueError, match="n_samples"):
            model.advance(state, n_samples, rng)
    with pytest.raises(ValueError, match="state"):
        model.advance(np.ones(d + 1), 10, rng)
    samples, new = model.advance(state, 0, rng)
    assert samples.shape == (0, d) and np.array_equal(new, state)
