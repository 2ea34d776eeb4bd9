"""Adaptive index sets for score matching: the dictionary, the closed-form held-out losses of the
growth against direct refits, downward-closed sets, and growth that goes to the coordinate whose
score needs it."""

import warnings

import numpy as np
import pytest

from kelr_dist.kernels.bases.families import Coordinate, Hermite
from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.kernels.scores.folds import Folds
from kelr_dist.kernels.scores.index_sets import dictionary, grow, reached_edge
from kelr_dist.kernels.scores.score_matching import (
    choose_candidate,
    feature_count,
    fit_score,
    gram_reduction,
    held_out_candidates,
    held_out_losses,
)


def coordinates(x: np.ndarray) -> tuple[Coordinate, ...]:
    return tuple(Coordinate(Hermite(1.0), float(c.mean()), float(c.std())) for c in x.T)


def downward_closed(indices: np.ndarray) -> bool:
    rows = {tuple(m) for m in indices.tolist()}
    return all(
        (*m[:k], m[k] - 1, *m[k + 1 :]) in rows for m in rows for k in range(len(m)) if m[k] > 0
    )


@pytest.mark.parametrize("d, base, budget", [(2, 5, 60), (3, 3, 80), (4, 2, 120), (1, 4, 50)])
def test_dictionary_holds_the_total_degree_set_and_reaches_further_on_axes_and_pairs(
    d, base, budget
):
    coords = tuple(Coordinate(Hermite(1.0), 0.0, 1.0) for _ in range(d))
    features = dictionary(coords, base, budget)
    indices = features.indices
    assert downward_closed(indices)
    assert features.size <= max(budget, feature_count(d, base))
    assert features.mask(base).sum() == feature_count(d, base)  # the whole total-degree set
    if d > 1:
        assert max(features.max_degrees) > base  # single coordinates and pairs reach further
        assert ((indices > 0).sum(axis=1)[indices.sum(axis=1) > base] <= 2).all()
        assert len({tuple(m) for m in indices.tolist()}) == features.size


def quartic_and_gaussians(n: int, seed: int) -> tuple[np.ndarray, callable]:
    """x1 with p ∝ exp(-x⁴ + 2x²) (a double well: a cubic score), x2, x3 independent standard
    normals (linear scores): i.i.d. samples by rejection from N(0, 1.2²)."""
    rng = np.random.default_rng(seed)
    out = []
    while sum(len(o) for o in out) < n:
        z = rng.normal(0.0, 1.2, 4 * n)
        log_ratio = -(z**4) + 2 * z**2 + z**2 / (2 * 1.2**2) - 1.25
        out.append(z[np.log(rng.uniform(size=z.size)) < log_ratio])
    x1 = np.concatenate(out)[:n]
    x = np.column_stack([x1, rng.normal(size=(n, 2))])

    def score(y: np.ndarray) -> np.ndarray:
        return np.column_stack([-4 * y[:, 0] ** 3 + 4 * y[:, 0], -y[:, 1], -y[:, 2]])

    return x, score


def test_growth_losses_are_the_refits_held_out_losses_and_sets_stay_downward_closed():
    x, _ = quartic_and_gaussians(20_000, seed=1)
    features = dictionary(coordinates(x), 3, 90)
    sums = reduce_in_memory(gram_reduction(features, Folds(4, 1, len(x))), x, 5000)
    path = grow(sums, features.mask(1))
    steps = len(path.losses) - 1
    assert steps >= 3
    for step in sorted({0, 1, steps // 2, steps}):
        members = path.members(step)
        assert members.sum() == path.start_size + step
        assert downward_closed(features.indices[members])
        direct = held_out_losses(sums, members, (0.0,))[0]
        np.testing.assert_allclose(path.fold_losses[step], direct, rtol=1e-7)


def test_growth_spends_the_features_on_the_coordinate_that_needs_them():
    """Only x1's score is non-linear: the grown set reaches degree >= 3 in x1 and stays linear in
    x2 and x3, with fewer features and a smaller Fisher divergence to the true score than the
    total-degree choice from the same sums."""
    x, score = quartic_and_gaussians(40_000, seed=2)
    features = dictionary(coordinates(x), 4, 120)
    sums = reduce_in_memory(gram_reduction(features, Folds(4, 1, len(x))), x, 10_000)
    path = grow(sums, features.mask(1))
    members = path.members(path.chosen_step())
    chosen = features.indices[members]
    assert chosen[:, 0].max() >= 3
    assert chosen[:, 1:].max() <= 1
    total = choose_candidate(held_out_candidates(sums))
    test, _ = quartic_and_gaussians(20_000, seed=3)

    def fisher(model) -> float:
        return float(np.mean(np.sum((model(test)[0] - score(test)) ** 2, axis=1)))

    adaptive = fit_score(sums, 1, members=members)
    assert adaptive.features.size < features.mask(total.degree).sum()
    assert fisher(adaptive) <= fisher(fit_score(sums, total.degree, total.ridge))
    assert reached_edge(features, members) == []


def test_the_default_grows_the_set_total_keeps_the_fixed_degree_and_adaptive_is_its_alias():
    """The default index set is grown from the held-out total degree: it holds x1's cubic and
    that total degree's set; 'adaptive' gives the same estimate, 'total' and a given degree the
    total-degree set; lag 0 meets the Stein identity of the linear features exactly, with or
    without the affine correction (independent rows: the Gram pass reads every one)."""
    from kelr_dist import estimate_response

    x, _ = quartic_and_gaussians(20_000, seed=4)
    run = dict(dt=1.0, estimator="score-matching", max_lag=3, client="synchronous")
    ds = estimate_response(x, **run)
    assert ds.attrs["score_matching_index_set"] == "adaptive"
    assert ds.attrs["score_matching_max_degrees"][0] >= 3
    total = estimate_response(x, index_set="total", **run)
    assert ds.attrs["score_matching_features"] >= feature_count(3, total.attrs["degree"])
    np.testing.assert_allclose(ds["response"].isel(lag=0), np.eye(3), atol=1e-8)
    raw = estimate_response(x, stein_correction=False, **run)
    np.testing.assert_allclose(raw["response"].isel(lag=0), np.eye(3), atol=1e-6)
    alias = estimate_response(x, index_set="adaptive", **run)
    np.testing.assert_array_equal(alias["response"], ds["response"])
    for options in (dict(index_set="total"), dict(degree=3)):
        total = estimate_response(x, **options, **run)
        assert total.attrs["score_matching_index_set"] == "total"
    with pytest.raises(ValueError, match="index_set='adaptive'"):
        estimate_response(x, index_set="adaptive", degree=3, **run)


def test_the_dictionary_budget_grows_with_the_samples_up_to_the_gram_pass_cost():
    """``c N^(1/3)`` features (c = SM_FEATURES_PER_CUBE_ROOT) until the Gram pass's flop budget
    thins the rows, then flat; the dictionary stays within it and its full total-degree block
    within SM_TOTAL_SHARE of it, at the largest budget as high as the fixed total-degree set's."""
    from kelr_dist.pipeline.steps import (
        SM_FEATURES_PER_CUBE_ROOT,
        SM_GRAM_FLOPS,
        SM_TOTAL_SHARE,
        dictionary_budget,
        grown_base_degree,
        score_matching_features,
        score_matching_max_degree,
    )

    sizes = [10**3, 10**4, 10**5, 10**6, 10**7, 10**9]
    budgets = [dictionary_budget(n) for n in sizes]
    assert budgets == sorted(budgets) and budgets[0] < budgets[2] < budgets[3]
    for n, p in zip(sizes[:3], budgets[:3], strict=True):
        assert p == int(SM_FEATURES_PER_CUBE_ROOT * n ** (1 / 3))
    cap = int((SM_FEATURES_PER_CUBE_ROOT**3 * SM_GRAM_FLOPS / 2) ** 0.2)
    assert budgets[-1] == budgets[-2] == cap
    # at the cap the rows the flop budget leaves still satisfy P <= c N_used^(1/3)
    assert cap <= SM_FEATURES_PER_CUBE_ROOT * (SM_GRAM_FLOPS / (2 * cap**2)) ** (1 / 3)
    for d in (1, 2, 3, 4, 6):
        coords = tuple(Coordinate(Hermite(1.0), 0.0, 1.0) for _ in range(d))
        for n in (10**4, 10**6):
            features = score_matching_features(coords, None, n)
            budget = max(dictionary_budget(n), d + 1)
            assert features.size <= budget
            base = grown_base_degree(d, budget)
            assert features.mask(base).sum() == feature_count(d, base)
            assert feature_count(d, base) <= max(SM_TOTAL_SHARE * budget, d + 1)
        top = grown_base_degree(d, dictionary_budget(10**9))
        assert top >= score_matching_max_degree(d)


def test_correlation_time_from_the_survey_steps_and_the_strides_it_allows():
    from kelr_dist.kernels.survey.moments import moments_reduction, wrap_reduction
    from kelr_dist.pipeline.steps import Survey, check_stride, correlation_time, gram_stride

    rng = np.random.default_rng(5)
    n, rhos = 200_000, np.array([0.9, 0.98])
    x = np.zeros((n, 2))
    noise = rng.normal(size=(n, 2)) * np.sqrt(1 - rhos**2)
    for t in range(1, n):
        x[t] = rhos * x[t - 1] + noise[t]

    def survey(y: np.ndarray) -> Survey:
        moments = reduce_in_memory(moments_reduction(), y, 30_000)
        wraps = reduce_in_memory(wrap_reduction(), y, 30_000)
        return Survey(moments, np.zeros(2), wraps=wraps)

    tau = correlation_time(survey(x))
    assert tau == pytest.approx((1 + 0.9) / (1 - 0.9), rel=0.05)  # the faster coordinate's
    assert check_stride(tau) == int(tau // 4) and check_stride(None) == 1
    # the Gram pass is thinned by its flops alone (its normal equations then hold on all rows)
    assert gram_stride(n, 10) == 1 and gram_stride(n, 10_000) > 1
    # a coordinate whose steps jump at every candidate period: no correlation time
    assert correlation_time(survey(x * [1.0, 1000.0])) is None


def test_truncation_is_reported_when_the_dictionary_stops_the_growth():
    """x1's score is cubic: a dictionary that reaches only degree 3 along x1 is used up there with
    the loss still falling (a TruncationWarning's message names the coordinate), one that reaches
    further is not."""
    from kelr_dist.pipeline.steps import choose_score_matching, score_matching_truncation

    x, _ = quartic_and_gaussians(20_000, seed=6)
    messages = []
    for budget in (20, 120):
        features = dictionary(coordinates(x), 2, budget)
        sums = reduce_in_memory(gram_reduction(features, Folds(4, 1, len(x))), x, 5000)
        choice = choose_score_matching(sums, grown=True)
        messages.append(score_matching_truncation(choice, len(x)))
    short, long = messages
    assert short is not None and short.chosen == 3 and short.drop > 10 * short.drop_stderr
    assert "along coordinate 1 of its adaptive index set" in short.message
    assert "index_set='total' with degree=4" in short.message
    assert long is None


@pytest.mark.slow
def test_the_default_on_a_system_with_a_known_score_is_as_close_as_the_total_degree():
    """A 3-D system with a Gamma coordinate and a log tie (its score has 1/x1 and log x1 terms
    no polynomial holds), 1e5 samples, A = x, score matching: against the exact FDT on the same
    samples the grown default is at most as far off as the fixed total-degree set (the default
    before; at lag 0 both meet the Stein identity, so after it, with 5% for this seed's noise),
    and within 3 of its total standard errors or warned."""
    from kelr_dist import estimate_response
    from kelr_dist.models.registry import make_model

    # the comparison on the same samples needs only the stationary law: the coarse sampler
    model = make_model("gamma-3d", step=0.25, subsample=5)
    rng = np.random.default_rng(2026)
    state = model.initial_state(rng)
    _, state = model.advance(state, model.default_burn_in, rng)
    thin = 5
    x, _ = model.advance(state, 100_000 * thin, rng)
    run = dict(
        estimator="score-matching",
        dt=model.dt * thin,
        score=model.score,
        exact=True,
        max_lag=20,
        client="synchronous",
    )
    errors, covered = {}, {}
    for index_set in ("auto", "total"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ds = estimate_response(x[::thin], index_set=index_set, **run)
        error = np.abs(ds["response"] - ds["response_exact"]).isel(lag=slice(1, None))
        errors[index_set] = float(error.max())
        within = bool((error <= 3 * ds["response_total_stderr"].isel(lag=slice(1, None))).all())
        ours = [w for w in caught if w.category.__module__.startswith("kelr_dist")]
        covered[index_set] = within or bool(ours)
    assert errors["auto"] <= 1.05 * errors["total"]
    assert covered["auto"]
