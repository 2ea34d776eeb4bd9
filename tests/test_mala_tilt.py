"""The tilted MALA chain: the target ``p_eq(x) exp(ε · x)`` of a constant forcing ``ε``, run on
common random numbers, and no tilt bit for bit the untilted chain; and the untilted chain at its
default step follows the diffusion whose response the FDT gives."""

import numpy as np
import pytest
from scipy.integrate import quad

from kelr_dist.models.mala import MalaSystem
from kelr_dist.models.registry import MODEL_NAMES, make_model
from kelr_dist.testing import _gap_terms, fdt_identity

#: the MALA-sampled systems
MALA_SYSTEMS = [name for name in MODEL_NAMES if isinstance(make_model(name), MalaSystem)]
#: the lattice on a ring of 4 sites: its step rule is per site, and 16 sites cost 4 times as much
SMALL = {"lattice": {"columns": 4}}


@pytest.mark.parametrize("name", ["curved-wells", "gamma-3d"])
def test_zero_tilt_is_bit_identical(name: str) -> None:
    model = make_model(name)
    rng = np.random.default_rng(3)
    x0 = model.initial_state(rng)
    d = len(model.components)
    plain, _ = model.advance(x0, 2000, np.random.default_rng(5))
    zero, _ = model.advance(x0, 2000, np.random.default_rng(5), tilt=np.zeros(d))
    assert plain.tobytes() == zero.tobytes()


def test_tilt_moves_the_stationary_mean_by_eps_var() -> None:
    # coupled-3d with a = b = 0: x3 is independent of the rest, with the 1-D density
    # exp(-(y^2/2 + c y^3/3 + g y^4/4)); tilted by exp(eps y) its mean is a 1-D quadrature
    model = make_model("coupled-3d", a=0.0, b=0.0, cubic3=0.3, quartic3=0.2)
    c, g, eps = 0.3, 0.2, 0.2

    def mean(e: float) -> float:
        def weight(y: float) -> float:
            return np.exp(-(y * y / 2 + c * y**3 / 3 + g * y**4 / 4) + e * y)

        return quad(lambda y: y * weight(y), -12, 12)[0] / quad(weight, -12, 12)[0]

    variance = (mean(1e-4) - mean(-1e-4)) / 2e-4
    exact = (mean(eps) - mean(-eps)) / (2 * eps)
    assert abs(exact - variance) < 0.05 * variance  # first order in eps: d E[x3] / d eps = Var

    x0 = model.initial_state(np.random.default_rng(1))
    tilt = np.array([0.0, 0.0, eps])
    up, _ = model.advance(x0, 40_000, np.random.default_rng(2), tilt=tilt)
    down, _ = model.advance(x0, 40_000, np.random.default_rng(2), tilt=-tilt)
    diff = (up[2000:, 2] - down[2000:, 2]) / (2 * eps)
    batches = diff.reshape(38, -1).mean(axis=1)
    stderr = batches.std(ddof=1) / np.sqrt(batches.size)
    assert abs(batches.mean() - exact) < 4 * stderr + 1e-3
    # common random numbers: the difference is far more precise than either chain's mean
    spread = up[2000:, 2].reshape(38, -1).mean(axis=1).std(ddof=1) / np.sqrt(38) / eps
    assert stderr < 0.5 * spread


@pytest.mark.parametrize(
    ("name", "tilt"),
    [("curved-wells", [0.0, 0.0, 0.0]), ("curved-wells", [0.1, np.nan]), ("circle", [0.1])],
)
def test_bad_tilt_is_named(name: str, tilt: list) -> None:
    model = make_model(name)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="tilt"):
        model.advance(model.initial_state(rng), 10, rng, tilt=np.array(tilt))


@pytest.mark.parametrize("name", MALA_SYSTEMS)
def test_default_step_follows_the_diffusion_at_the_stored_lags(name: str) -> None:
    """``C(0) - C(t) = ∫_0^t k`` (eq. 4 for ``dU = s dt + sqrt(2) dW``) at the first three
    stored lags, within 4 batch-means standard errors per component. At ``h E[s_i^2]`` of
    0.5-0.9 (18-27% of proposals rejected) the chain misses it by 4-18%, 10-30 standard errors
    at this length."""
    model = make_model(name, **SMALL.get(name, {}))
    times = [model.dt, 2 * model.dt, 3 * model.dt]
    rng = np.random.default_rng(11)
    ratio, stderr = fdt_identity(model, 500_000, times, rng, batches=40, burn_in=200_000)
    assert np.all(np.isfinite(stderr)) and np.all(stderr > 0)
    off = np.abs(ratio - 1.0) / stderr
    assert off.max() < 4.0, (
        f"{name}: (C(0) - C(t)) / ∫k = {ratio.round(4).tolist()} ± {stderr.round(4).tolist()}"
    )


def test_gap_terms_are_the_lagged_means_written_out() -> None:
    rng = np.random.default_rng(4)
    f, b = rng.standard_normal((2, 300, 3)).cumsum(axis=1)
    spread, drift = _gap_terms(f, b, 7)
    for m in range(1, 8):
        df = f[m:] - f[:-m]
        np.testing.assert_allclose(spread[m], 0.5 * (df * df).mean(axis=0), rtol=1e-10)
        np.testing.assert_allclose(drift[m], 0.5 * (df * (b[:-m] - b[m:])).mean(axis=0), rtol=1e-9)
    scale = np.abs(f * b).mean() + (f * f).mean()
    np.testing.assert_allclose(np.stack([spread[0], drift[0]]), 0.0, atol=1e-12 * scale)
