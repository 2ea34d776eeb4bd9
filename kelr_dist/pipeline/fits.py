"""The fits the estimate composes from its steps: the kernel embedding, the response's scores.

:func:`kernel_embedding` fits the kernel embedding of a :class:`~kelr_dist.pipeline.planning.Plan`
(after a pilot when the plan asks for one); :func:`response_scores` gathers every score the
response read evaluates, with their fold refits and richer neighbours, after refitting them on
random Fourier features (read 3f) or, by the Stein correction, on the own functions of an
observable that is not affine and on the site sums of a tied local model (:func:`stein_refit`,
read 3r); :func:`goodness_of_fit` builds the scores' check of the response read.
"""

from __future__ import annotations

import math
from typing import Any

from kelr_dist.kernels.reduction import Reduction
from kelr_dist.kernels.response.blocking import fitted_base_block, useful_levels
from kelr_dist.kernels.response.operator import (
    DIFFERENCE_STEP,
    Score,
    replicate_stride,
    response_reduction,
)
from kelr_dist.kernels.response.stein_correction import (
    FourierFeatures,
    ObservableFeatures,
    StackedFeatures,
)
from kelr_dist.kernels.scores.folds import Folds
from kelr_dist.kernels.scores.kernel_embedding import KernelDensity
from kelr_dist.kernels.scores.local import LocalChoice
from kelr_dist.kernels.scores.site_sums import SiteSums
from kelr_dist.kernels.scores.stein_check import SteinFunctions, stein_check_reduction
from kelr_dist.pipeline.inputs import Inputs
from kelr_dist.pipeline.options import EstimateOptions
from kelr_dist.pipeline.planning import Plan, Setting, affine
from kelr_dist.pipeline.steps import (
    AnyScoreMatching,
    Fits,
    KernelEmbeddingChoice,
    Passes,
    Pilot,
    check_stride,
    choose_kernel_embedding,
    correlation_time,
    extend_score,
    fit_estimators,
    gram_stride,
    pilot_kernel_embedding,
    refit_scores,
    settle_index_set,
)

#: the response variables of estimated scores, which get the affine Stein correction
ESTIMATED = ("response_kernel_embedding", "response_score_matching")


#: the scores of a response read by response variable, their refits without each fold, their
#: neighbouring models (:meth:`Plan.scores`)
Scores = tuple[dict[str, Score], dict[str, tuple[Score, ...]], dict[str, tuple[Score, ...]]]


def response_scores(
    passes: Passes,
    inputs: Inputs,
    setting: Setting,
    plan: Plan,
    fitted: tuple[KernelEmbeddingChoice | None, AnyScoreMatching | None, Fits],
) -> tuple[dict[str, Score], dict[str, tuple[Score, ...]], dict[str, tuple[Score, ...]], dict]:
    """The scores of the response read (:meth:`Plan.scores`), after read 3f (score matching
    refitted with random Fourier features, its neighbour outside a polynomial span) or, when the
    plan refits (an observable that is not affine, a tied local model), read 3r
    (:func:`stein_refit`, which fits that neighbour too); with the estimates before read 3r
    (empty without it)."""
    ke, sm, fits = fitted
    extended = None
    fourier = sm is not None and plan.features is not None and setting.periods is None
    if fourier and not plan.refit:
        assert sm is not None and plan.features is not None
        n_samples = math.prod(inputs.trajectory.shape[:2])
        stride = gram_stride(n_samples, plan.features.gram_size)
        extended = extend_score(passes, sm.model, setting.survey.moments, stride)
    found = plan.scores(ke, sm, fits, extended)
    if not plan.refit:
        return (*found, {})
    fourier_base = sm.model if fourier and sm is not None else None
    moments = setting.survey.moments
    parts: list[Any] = []
    if not affine(setting.observable):
        step = DIFFERENCE_STEP * moments.std
        parts.append(ObservableFeatures(setting.observable, moments.mean, moments.std, step))
    if plan.site_sums:
        assert isinstance(sm, LocalChoice)  # planned for a tied local model
        parts.append(SiteSums.of(sm, moments.mean, moments.std))
    features = parts[0] if len(parts) == 1 else StackedFeatures(tuple(parts))
    return stein_refit(passes, setting, found, inputs.folds, features, fourier_base)


def response_read(
    inputs: Inputs,
    setting: Setting,
    plan: Plan,
    found: tuple[
        dict[str, Score], dict[str, tuple[Score, ...]], dict[str, tuple[Score, ...]], dict
    ],
) -> Reduction:
    """Read 4, the response (:func:`~kelr_dist.kernels.response.operator.response_reduction`,
    eq. 7) of every score :func:`response_scores` found: the observable and forcing of the
    setting, the affine Stein correction of the estimated scores where the plan makes it, the
    fold refits and neighbouring models for the fit's own variance."""
    scores, replicates, neighbours, unrefitted = found
    n_samples = math.prod(inputs.trajectory.shape[:2])
    chains, length = inputs.trajectory.shape[:2]
    base_block = fitted_base_block(inputs.max_lag, chains, length)
    return response_reduction(
        scores,
        setting.observable,
        inputs.forcing,
        inputs.max_lag,
        centre=setting.centre,
        scales=setting.survey.moments.std,
        corrected=[name for name in ESTIMATED if name in scores] if plan.affine else (),
        origin=setting.survey.moments.mean,
        replicates=replicates,
        periods=setting.periods,
        neighbours=neighbours,
        base_block=base_block,
        unrefitted=unrefitted,
        replicate_stride=replicate_stride(n_samples),
        max_levels=useful_levels(base_block, chains, length, inputs.max_lag),
    )


def goodness_of_fit(
    inputs: Inputs,
    setting: Setting,
    scores: dict[str, Score],
    replicates: dict[str, tuple[Score, ...]],
) -> Reduction:
    """The goodness-of-fit check of every score of the response read
    (:func:`~kelr_dist.kernels.scores.stein_check.stein_check_reduction`): test functions of the
    survey's standardised components, on every ``⌊τ/4⌋``-th row
    (:func:`~kelr_dist.pipeline.steps.check_stride`), the fold refits' jackknife on every
    ``replicate_stride``-th of those, as in the response read."""
    stride = check_stride(correlation_time(setting.survey))
    moments = setting.survey.moments
    return stein_check_reduction(
        scores,
        SteinFunctions(moments.mean, moments.std, setting.periods),
        replicates,
        stride,
        replicate_stride(math.prod(inputs.trajectory.shape[:2]) // stride),
    )


def stein_refit(
    passes: Passes,
    setting: Setting,
    fitted: Scores,
    folds: Folds,
    features: Any,
    fourier_base: Score | None = None,
) -> tuple[dict[str, Score], dict[str, tuple[Score, ...]], dict[str, tuple[Score, ...]], dict]:
    """Read 3r: every estimated score of ``fitted`` (scores, their refits without each fold,
    their neighbouring models) refitted on the affine features and the test functions
    ``features`` (a refit without fold ``f`` of ``folds`` on the other folds' rows): the
    observable's own functions
    (:class:`~kelr_dist.kernels.response.stein_correction.ObservableFeatures`), so that for a
    constant forcing the response of each column of ``A`` has its exact lag-0 value, and a tied
    local model's site sums (:class:`~kelr_dist.kernels.scores.site_sums.SiteSums`), so that the
    conjugate of every forcing pattern is fitted in functions of the whole field. With
    ``fourier_base`` (score matching), that score refitted on random Fourier features beside
    them becomes one more neighbour of it (the sensitivity check outside a polynomial span).
    Returns the refitted scores, refits and neighbours, and the estimates before the refit,
    whose lag-0 Stein residuals stay the evidence of their bias."""
    scores, replicates, neighbours = fitted
    moments = setting.survey.moments
    names = [name for name in ESTIMATED if name in scores]
    groups = [
        (name, kind, members)
        for name in names
        for kind, members in (
            ("score", (scores[name],)),
            ("replicates", replicates.get(name, ())),
            ("neighbours", neighbours.get(name, ())),
        )
    ]
    # a fold refit is refitted without its fold: the jackknife then sees the refit's variance
    requests: list[tuple[Score, Any, int | None]] = [
        (s, features, fold if kind == "replicates" else None)
        for _, kind, members in groups
        for fold, s in enumerate(members)
    ]
    if fourier_base is not None:
        fourier = FourierFeatures.draw(moments.mean, moments.std)
        requests.append((fourier_base, StackedFeatures((fourier, features)), None))
    refitted = iter(refit_scores(passes, requests, folds))
    out: dict[str, dict[str, Any]] = {"score": dict(scores), "replicates": dict(replicates)}
    out["neighbours"] = dict(neighbours)
    for name, kind, members in groups:
        if members:
            new = tuple(next(refitted) for _ in members)
            out[kind][name] = new[0] if kind == "score" else new
    if fourier_base is not None:
        name = "response_score_matching"
        out["neighbours"][name] = (*out["neighbours"].get(name, ()), next(refitted))
    return out["score"], out["replicates"], out["neighbours"], {n: scores[n] for n in names}


def kernel_embedding(
    passes: Passes,
    options: EstimateOptions,
    inputs: Inputs,
    plan: Plan,
    density: KernelDensity | None,
    sm: AnyScoreMatching | None,
) -> tuple[KernelEmbeddingChoice | None, Pilot | None]:
    """The kernel embedding of the plan (``None`` when it is not fitted), from the ``density`` of
    read 2 or, after a pilot that finds it can still win, from its own read 2k; and the pilot."""
    if plan.density_basis is None:
        return None, None
    pilot = None
    if plan.pilot and sm is not None:
        pilot = pilot_kernel_embedding(
            passes,
            plan.density_basis,
            sm,
            options.folds,
            order=inputs.order,
            delta=options.delta,
            index_set=plan.index_set,
            max_order=options.max_order,
        )
        if pilot is not None and pilot.skips_kernel_embedding:
            return None, pilot
        density = fit_estimators(
            passes, density_basis=plan.density_basis, folds=inputs.folds
        ).density
    assert density is not None
    density, order = settle_index_set(
        passes,
        density,
        inputs.order,
        index_set=plan.index_set,
        max_order=options.max_order,
        folds=inputs.folds,
    )
    return choose_kernel_embedding(passes, density, order, options.delta), pilot
