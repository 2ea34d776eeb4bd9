"""The two score estimators end to end: the held-out choice picks the right one on systems that
need different ones, the lag-0 Stein residual, invariance to the data's units and origin, and the
kernel embedding's held-out loss (fits by fold, the smooth score's divergence)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from kelr_dist.kernels.bases.coordinates import fit_basis
from kelr_dist.kernels.bases.families import TensorBasis
from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.kernels.scores.folds import Folds
from kelr_dist.kernels.scores.heldout import smooth_density_loss
from kelr_dist.kernels.scores.kernel_embedding import KernelDensity, coefficient_reduction
from kelr_dist.models.registry import make_model
from kelr_dist.models.simulate import simulate
from kelr_dist.pipeline.estimate import estimate_response
from kelr_dist.pipeline.warnings import BiasWarning


def error(ds, name: str = "response") -> float:
    return float(np.abs(ds[name] - ds["response_exact"]).max())


@pytest.fixture(scope="module")
def systems(tmp_path_factory) -> dict[str, object]:
    """2e5 samples of a system that needs score matching (three wells in curved, rotated
    valleys) and of one that needs the kernel embedding (the paper's triple-well)."""
    folder = tmp_path_factory.mktemp("systems")
    paths = {}
    # the choice and its error against the exact FDT on the same samples need only the
    # stationary law: curved-wells' coarse sampler (MALA is exact in law at any step)
    models = {"curved-wells": make_model("curved-wells", step=0.03, subsample=10)}
    for name in ("curved-wells", "triple-well"):
        paths[name] = folder / f"{name}.zarr"
        simulate(models.get(name, name), paths[name], n_samples=200_000, seed=7)
    return paths


@pytest.mark.parametrize(
    ("system", "expected", "tolerance"),
    [("curved-wells", "score-matching", 0.05), ("triple-well", "kernel-embedding", 0.06)],
)
@pytest.mark.slow
def test_the_held_out_choice_picks_the_estimator_the_system_needs(
    systems, system, expected, tolerance
):
    """CI-sized accuracy suite (scripts/accuracy_suite.py at N = 1e7 has the real figures):
    the automatic estimate must take the estimator whose response is right, and be close to
    the exact FDT on the same samples; the other estimator is clearly worse on each. The
    lag-0 Stein residuals of the chosen and of the exact estimate are within their error bars."""
    ds = estimate_response(
        systems[system], client="synchronous", exact=True, gaussian=True, max_lag=400
    )
    assert ds.attrs["estimator"] == expected
    other = (
        "response_score_matching" if expected == "kernel-embedding" else "response_kernel_embedding"
    )
    assert error(ds) <= tolerance
    assert error(ds, other) > 1.5 * error(ds)  # the one not chosen is clearly worse
    table = ds["candidate_chosen"].values
    assert table.sum() == 1
    assert ds["candidate_estimator"].values[table][0] == expected
    for suffix in ("", "_exact"):
        ratio = np.abs(ds[f"stein_residual{suffix}"] / ds[f"stein_residual{suffix}_stderr"])
        assert float(ratio.max()) < 3, suffix
    # the quasi-Gaussian score satisfies Stein's identity for A = x (it is linear) and is
    # still wrong at later lags: the lag-0 check is necessary, not sufficient
    assert error(ds, "response_gaussian") > 3 * error(ds)


@pytest.mark.slow
@pytest.mark.parametrize(("system", "warns"), [("curved-wells", True), ("triple-well", False)])
def test_a_poor_kernel_embedding_warns_by_its_uncorrected_stein_residual(systems, system, warns):
    """For A = x and a constant forcing the affine correction makes the lag-0 residual 0 by
    construction; the one before it is then the evidence. Forced onto the curved valleys (response
    error ~0.2 at N = 1e6) the kernel embedding must warn; on the triple-well (error ~0.02) not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = estimate_response(
            systems[system], client="synchronous", estimator="kernel-embedding", max_lag=400
        )
    assert float(np.abs(ds["stein_residual"] / ds["stein_residual_stderr"]).max()) < 1e-6
    messages = [str(w.message) for w in caught if isinstance(w.message, BiasWarning)]
    assert bool(messages) == warns, messages
    if warns:
        assert "before the Stein correction" in messages[0]
        assert "of k(0)" in messages[0]


def ou_data(n: int = 60_000) -> np.ndarray:
    model = make_model("ou")
    rng = np.random.default_rng(11)
    return model.advance(model.initial_state(rng), n, rng)[0]


@pytest.mark.parametrize("estimator", ["kernel-embedding", "score-matching"])
def test_units_and_origin_do_not_change_the_response(estimator):
    """x -> a x + c (a = 1e-4, 1e4; c = 1e3): k(t) is dimensionless for A = x and constant
    forcing, so it must not change beyond a small fraction of its standard error."""
    x = ou_data()
    kwargs = dict(client="synchronous", estimator=estimator, max_lag=30, max_order=20)
    base = estimate_response(x, **kwargs)
    stderr = float(base["response_stderr"].isel(lag=slice(1, None)).min())
    for scale, shift in [(1e-4, 0.0), (1e4, 0.0), (1.0, 1e3), (1e-4, 1e3)]:
        moved = estimate_response(x * scale + shift, **kwargs)
        assert moved.attrs.get("order") == base.attrs.get("order")
        assert moved.attrs.get("degree") == base.attrs.get("degree")
        difference = float(np.abs(moved["response"] - base["response"]).max())
        assert difference < 1e-3 * stderr, (scale, shift, difference, stderr)
        np.testing.assert_allclose(
            moved["response_stderr"], base["response_stderr"], rtol=1e-6, atol=1e-3 * stderr
        )


def test_fold_fits_equal_fits_on_the_other_folds_alone():
    x = ou_data(20_000)
    basis = TensorBasis(tuple(fit_basis(x)), 10)
    folds = Folds(4, 1, len(x))
    density = reduce_in_memory(coefficient_reduction(basis, folds), x, 3_000)
    whole = KernelDensity.fit(basis, x)
    np.testing.assert_allclose(density.coefficients, whole.coefficients, rtol=1e-12, atol=1e-15)
    for f in range(4):
        rest = np.delete(x, np.arange(folds.edge(f), folds.edge(f + 1)), axis=0)
        alone = KernelDensity.fit(basis, rest)
        np.testing.assert_allclose(
            density.held_out(f).coefficients, alone.coefficients, rtol=1e-10, atol=1e-14
        )


def test_second_derivatives_and_smooth_score_divergence_match_differences():
    x = ou_data(20_000)
    density = KernelDensity.fit(TensorBasis(tuple(fit_basis(x)), 12), x)
    points = x[::997]
    p, grad, hess = density.derivatives(points)
    h = 1e-5
    for j in range(2):
        up, down = points.copy(), points.copy()
        up[:, j] += h
        down[:, j] -= h
        numeric = (density.evaluate(up)[1][:, j] - density.evaluate(down)[1][:, j]) / (2 * h)
        np.testing.assert_allclose(hess[:, j], numeric, rtol=1e-5, atol=1e-7)
    delta = 0.01

    def smooth_score(z):
        q, g = density.evaluate(z)
        return q[:, None] * g / (q * q + delta * delta)[:, None]

    divergence = sum(
        (smooth_score(points + h * e)[:, j] - smooth_score(points - h * e)[:, j]) / (2 * h)
        for j, e in enumerate(np.eye(2))
    )
    s = smooth_score(points)
    expected = 0.5 * (s * s).sum(axis=1) + divergence
    np.testing.assert_allclose(smooth_density_loss(p, grad, hess, delta), expected, rtol=1e-5)


def test_extreme_and_mixed_units_give_the_same_automatic_estimate():
    """Data in units of 1e-139 or 1e60, or one coordinate in 1e-8 and the other in 1e8: the same
    choice, the same responses of both families (finite), the same disagreement figure and
    held-out losses, and no numpy overflow warnings (scores and held-out losses are computed in
    standardized units)."""
    x = ou_data()
    kwargs = dict(client="synchronous", max_lag=30, max_order=20)
    base = estimate_response(x, **kwargs)
    stderr = float(base["response_stderr"].isel(lag=slice(1, None)).min())
    for scale in (np.array([1e-139, 1e-139]), np.array([1e60, 1e60]), np.array([1e-8, 1e8])):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            moved = estimate_response(x * scale, **kwargs)
        assert moved.attrs["estimator"] == base.attrs["estimator"]
        for name in ("response_kernel_embedding", "response_score_matching"):
            if name not in base:
                continue
            # k_ij is in units of x_i per unit forcing on x_j: scale_i / scale_j
            ratio = scale[None, :, None] / scale[None, None, :]
            rescaled = moved[name].values * (1.0 / ratio)
            assert np.isfinite(rescaled).all(), (scale, name)
            difference = float(np.abs(rescaled - base[name].values).max())
            assert difference < 1e-3 * stderr, (scale, name, difference, stderr)
        np.testing.assert_allclose(
            moved.attrs["estimator_disagreement"], base.attrs["estimator_disagreement"], rtol=1e-6
        )
        # held-out losses are those of the standardized score: the same numbers in any units
        np.testing.assert_allclose(moved["candidate_loss"], base["candidate_loss"], rtol=1e-6)
