"""Total error bars: the jackknife over held-out folds beside the sampling error."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from kelr_dist import estimate_response
from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.kernels.response import operator as response_module
from kelr_dist.kernels.response.operator import (
    FunctionScore,
    constant_forcing,
    identity_observable,
    jackknife_stderr,
    response_reduction,
)
from kelr_dist.models.registry import make_model


def test_jackknife_of_the_mean_is_the_standard_error_of_the_mean():
    """Delete-one jackknife of a sample mean is exactly ``sd / sqrt(n)`` (Efron & Stein)."""
    values = np.random.default_rng(1).normal(size=(12, 3))
    replicates = np.stack([np.delete(values, f, axis=0).mean(axis=0) for f in range(12)])
    expected = values.std(axis=0, ddof=1) / np.sqrt(12)
    np.testing.assert_allclose(jackknife_stderr(replicates), expected, rtol=1e-12)


@pytest.mark.parametrize("corrected", [False, True])
def test_replicates_are_extra_columns_of_the_same_read(corrected):
    """Each refit's response, from the shared lagged sums, equals the response of that score on
    its own (the response is linear in B), corrected as the main score is; the estimator's
    standard error is their jackknife spread."""
    rng = np.random.default_rng(3)
    x = np.cumsum(rng.normal(size=(3000, 2)), axis=0) * 0.05
    x -= x.mean(axis=0)
    names = ("a", "b")
    obs, force = identity_observable(names), constant_forcing(names)

    def cubic(factor):  # not affine: the correction does not absorb the refits' differences
        return FunctionScore(lambda y: -y - factor * y**3)

    main, refits = cubic(0.2), [cubic(f) for f in (0.1, 0.25, 0.4)]
    options = dict(centre=x.mean(axis=0), corrected=("s",) if corrected else ())
    together = reduce_in_memory(
        response_reduction({"s": main}, obs, force, 7, replicates={"s": refits}, **options),
        x,
        [1000, 2000],
    )["s"]
    alone = [
        reduce_in_memory(response_reduction({"s": r}, obs, force, 7, **options), x)["s"].mean
        for r in refits
    ]
    plain = reduce_in_memory(response_reduction({"s": main}, obs, force, 7, **options), x)["s"]
    np.testing.assert_allclose(together.mean, plain.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(together.stderr, plain.stderr, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(
        together.estimator_stderr, jackknife_stderr(np.stack(alone)), rtol=1e-8, atol=1e-12
    )
    assert np.all(together.total_stderr >= together.stderr)
    assert np.all(together.estimator_stderr[1:] > 0)


@pytest.mark.parametrize("corrected", [False, True])
def test_neighbours_are_extra_columns_of_the_same_read(corrected):
    """A neighbouring model's response, from the shared lagged sums, is its own response; the
    model shift is, per entry, the neighbour's change from the score that is larger in size."""
    rng = np.random.default_rng(4)
    x = np.cumsum(rng.normal(size=(3000, 2)), axis=0) * 0.05
    x -= x.mean(axis=0)
    names = ("a", "b")
    obs, force = identity_observable(names), constant_forcing(names)
    scores = [FunctionScore(lambda y, f=f: -y - f * y**3) for f in (0.2, 0.5, -0.05)]
    options = dict(centre=x.mean(axis=0), corrected=("s",) if corrected else ())
    together = reduce_in_memory(
        response_reduction(
            {"s": scores[0]}, obs, force, 7, neighbours={"s": scores[1:]}, **options
        ),
        x,
        [1000, 2000],
    )["s"]
    main, *others = (
        reduce_in_memory(response_reduction({"s": s}, obs, force, 7, **options), x)["s"].mean
        for s in scores
    )
    np.testing.assert_allclose(together.mean, main, rtol=1e-10, atol=1e-12)
    shifts = np.stack(others) - main
    larger = np.where(np.abs(shifts[0]) >= np.abs(shifts[1]), shifts[0], shifts[1])
    np.testing.assert_allclose(together.model_shift, larger, rtol=1e-8, atol=1e-12)


def test_replicate_origins_read_the_replicates_and_neighbours_differences():
    """With ``replicate_stride = m``, a refit's (and a neighbour's) response is the score's plus the
    mean over the origins ``n = 0 mod m`` of ``(A(X_{n+s}) - Ā) (B_f - B)(X_n)``, in any
    chunking; the score's own response is the same as with every origin."""
    rng = np.random.default_rng(5)
    x = np.cumsum(rng.normal(size=(3001, 2)), axis=0) * 0.05
    x -= x.mean(axis=0)
    names = ("a", "b")
    obs, force = identity_observable(names), constant_forcing(names)

    def cubic(factor):
        return FunctionScore(lambda y: -y - factor * y**3)

    main, refits, neighbour = cubic(0.2), [cubic(f) for f in (0.1, 0.25, 0.4)], cubic(0.6)
    centre, lags, stride = x.mean(axis=0), 7, 4

    def run(chunks, m):
        reduction = response_reduction(
            {"s": main}, obs, force, lags, centre=centre, replicates={"s": refits},
            neighbours={"s": [neighbour]}, replicate_stride=m,
        )  # fmt: skip
        return reduce_in_memory(reduction, x, chunks)["s"]

    def difference(score):
        origins = np.arange(0, len(x), stride)
        delta = -(score.function(x) - main.function(x))  # B = -score
        out = np.empty((lags + 1, 2, 2))
        for s in range(lags + 1):
            n = origins[origins + s < len(x)]
            out[s] = (x[n + s] - centre).T @ delta[n] / len(n)
        return out

    full = run([3001], 1)
    for chunks in ([3001], [1000, 2001], [777, 1000, 1224]):
        sided = run(chunks, stride)
        np.testing.assert_allclose(sided.mean, full.mean, rtol=1e-12, atol=1e-14)
        replicas = np.stack([full.mean + difference(r) for r in refits])
        np.testing.assert_allclose(
            sided.estimator_stderr, jackknife_stderr(replicas), rtol=1e-9, atol=1e-13
        )
        np.testing.assert_allclose(sided.model_shift, difference(neighbour), rtol=1e-9, atol=1e-13)
    assert not np.allclose(run([3001], stride).estimator_stderr, full.estimator_stderr)


def _estimate(model, seed, n, thin, **options):
    rng = np.random.default_rng(seed)
    state = model.initial_state(rng)
    _, state = model.advance(state, model.default_burn_in, rng)
    x, _ = model.advance(state, n * thin, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return estimate_response(
            x[::thin],
            dt=model.dt * thin,
            score=model.score,
            exact=True,
            max_lag=10,
            client="synchronous",
            **options,
        )


@pytest.mark.parametrize("stride", [1, 4])
def test_total_error_bars_cover_the_error_over_seeds(stride, monkeypatch):
    """20 seeds of a non-Gaussian 2-D system (curved valleys, exact score), score matching of
    degree 4 on 1e4 nearly independent samples: the jackknife's estimator error matches the
    spread over seeds of ``k̂ - k_exact`` (same samples, so the sampling error cancels and the
    fit's remains), and at most 10% of the entries lie beyond 2 total standard errors; also
    with the replicates read on every fourth origin."""
    monkeypatch.setattr(response_module, "REPLICATE_ROWS", 10_000 // stride)
    # a coarse MALA step: only the samples' law matters here, exact at any step, and 30 times
    # fewer steps per sample than the default's
    model = make_model("curved-wells", step=0.03, subsample=10)
    results = [
        _estimate(model, seed, 10_000, 10, estimator="score-matching", degree=4,
                  stein_correction=False)
        for seed in range(20)
    ]  # fmt: skip
    assert {ds.attrs["replicate_stride"] for ds in results} == {stride}
    error = np.stack([(ds["response"] - ds["response_exact"]).values for ds in results])
    jackknife = np.stack([ds["response_estimator_stderr"].values for ds in results])
    total = np.stack([ds["response_total_stderr"].values for ds in results])
    ratio = np.sqrt((jackknife**2).mean(axis=0)) / error.std(axis=0, ddof=1)
    assert 0.5 < np.median(ratio) < 2.0
    assert np.mean(np.abs(error) > 2 * total) <= 0.10
    for ds in results:
        np.testing.assert_allclose(
            ds["response_total_stderr"],
            np.hypot(ds["response_stderr"], ds["response_estimator_stderr"]),
        )
        # the exact score is not fitted: its total error is the sampling error
        exact = ds["response_exact_total_stderr"]
        np.testing.assert_array_equal(exact, ds["response_exact_stderr"])


@pytest.mark.parametrize("stride", [1, 4])
def test_total_error_bars_cover_where_the_fit_dominates_and_sampling_bars_do_not(
    stride, monkeypatch
):
    """20 seeds of a 2-D Ornstein-Uhlenbeck process (exact score), score matching of degree 8
    (45 features) on 1000 samples: the fitted score's variance dominates the error of the
    response, so the sampling error bars alone leave far more than 10% of the entries beyond 2
    of them, while the total error bars leave at most 10%; also with the replicates read on
    every fourth origin."""
    monkeypatch.setattr(response_module, "REPLICATE_ROWS", 1000 // stride)
    model = make_model("ou")
    results = [
        _estimate(model, seed, 1000, 1, estimator="score-matching", degree=8,
                  stein_correction=False)
        for seed in range(20)
    ]  # fmt: skip
    assert {ds.attrs["replicate_stride"] for ds in results} == {stride}
    error = np.abs(np.stack([(ds["response"] - ds["response_exact"]).values for ds in results]))
    total = np.stack([ds["response_total_stderr"].values for ds in results])
    sampling = np.stack([ds["response_stderr"].values for ds in results])
    assert np.mean(error > 2 * total) <= 0.10
    assert np.mean(error > 2 * sampling) > 0.20


def test_lag0_difference_from_the_exact_reference_is_the_references_stein_residual():
    """With ``A = x`` and a constant forcing the affinely corrected estimate meets the Stein
    target ``k(0) = I`` exactly, so at lag 0 its difference from the exact FDT on the same samples
    is minus the exact reference's own lag-0 Stein residual: the reference's sampling noise, which
    no error bar of the estimate covers or should cover."""
    model = make_model("curved-wells")
    ds = _estimate(model, 3, 20_000, 10, estimator="score-matching", degree=3)
    difference = (ds["response"] - ds["response_exact"]).isel(lag=0).values
    np.testing.assert_allclose(ds["response"].isel(lag=0).values, np.eye(2), atol=1e-10)
    np.testing.assert_allclose(difference, -ds["stein_residual_exact"].values, atol=1e-10)
    assert np.abs(ds["stein_residual_exact"].values).max() > 0
