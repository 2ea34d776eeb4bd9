"""Read 1 settled and the estimate planned: what the survey fixes, then what to fit.

:func:`settle` runs read 1 (and 1b) into a :class:`Setting` (the survey, the periodic
components, the basis per coordinate, the observable with its centre); :func:`plan_estimate`
turns the options and the setting into a :class:`Plan` (which families to fit and on which
bases, the baselines, the Stein correction, whether a pilot runs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kelr_dist.kernels.baselines.quasi_gaussian import SampleMoments, gaussian_score
from kelr_dist.kernels.bases.coordinates import WINDOW_TOLERANCE, Periodicity
from kelr_dist.kernels.bases.families import Coordinate, TensorBasis
from kelr_dist.kernels.observables.distribution import PendingDistribution
from kelr_dist.kernels.observables.field import FieldSpec, LinearObservable
from kelr_dist.kernels.response.operator import (
    FunctionScore,
    KDEScore,
    Observable,
    Score,
    observable_mean_reduction,
)
from kelr_dist.kernels.scores.local import (
    LocalFeatures,
    Neighbourhoods,
    adaptive_features,
    degree_caps,
    partners_from_covariance,
    site_budget,
)
from kelr_dist.kernels.scores.score_matching import PolynomialFeatures
from kelr_dist.pipeline.distribution import survey_for
from kelr_dist.pipeline.fields import PendingEOF, survey_eof
from kelr_dist.pipeline.inputs import Inputs
from kelr_dist.pipeline.options import Circle, EstimateOptions
from kelr_dist.pipeline.steps import (
    SM_GRAM_FLOPS,
    SM_TOTAL_SHARE,
    AnyScoreMatching,
    Fits,
    KernelEmbeddingChoice,
    Passes,
    Survey,
    choose_coordinates,
    find_periodic,
    index_set_for,
    kde_grid_and_bandwidth,
    pilot_stride,
    score_matching_features,
)
from kelr_dist.pipeline.warnings import warn_edges


@dataclass(frozen=True)
class Setting:
    """What read 1 (and 1b) settle before any fit: the survey, the periodic components, the
    basis per coordinate, and the observable with its centre ``Ā`` and the periods."""

    survey: Survey
    periodic: list[Periodicity | None]
    coordinates: tuple[Coordinate, ...]
    observable: Observable
    centre: np.ndarray
    periods: np.ndarray | None
    #: the lines of the warnings read 1 raised (``"EdgeWarning: ..."``), for ``attrs["warnings"]``
    warnings: tuple[str, ...] = ()


def settle(passes: Passes, options: EstimateOptions, inputs: Inputs) -> Setting:
    """Read 1 (moments, ``Ā``; :func:`~kelr_dist.pipeline.steps.survey_data`), the periodic
    components, the :class:`EdgeWarning` of hard edges, the basis (read 1b when a Laguerre θ comes
    from the data) and the observable on the circle (one light read for angles)."""
    if isinstance(inputs.observable, PendingEOF):
        survey, observable = survey_eof(passes, inputs.observable)
    else:
        survey, observable = survey_for(passes, inputs.observable)
    periodic = find_periodic(passes, survey, options.basis)
    raised: list[str] = []
    names = [str(c) for c in passes.trajectory["component"].values]
    warn_edges(survey, periodic, names, raised)
    coordinates = choose_coordinates(passes, survey, options.basis, periodic)
    observable, centre, periods = _on_the_circle(passes, options, survey, periodic, observable)
    return Setting(survey, periodic, coordinates, observable, centre, periods, tuple(raised))


def _on_the_circle(
    passes: Passes,
    options: EstimateOptions,
    survey: Survey,
    periodic: list[Periodicity | None],
    observable: Observable,
) -> tuple[Observable, np.ndarray, np.ndarray | None]:
    """The observable, its centre ``Ā`` and the periods ``(d,)`` (None: no component on a
    circle) once the periodic components are known: the identity then carries the wrapped
    angles' jump in its derivative, and ``angles`` its cosines and sines, whose mean takes one
    more (light) read."""
    if all(p is None for p in periodic):
        return observable, survey.centre, None
    moments, components = survey.moments, [str(c) for c in passes.trajectory["component"].values]
    periods = np.array([0.0 if p is None else p.period for p in periodic])
    wraps = tuple(0.0 if p is None else p.loc for p in periodic)
    wrapped = tuple(
        p is not None
        and moments.minimum[k] >= p.loc - WINDOW_TOLERANCE * p.period
        and moments.maximum[k] <= p.loc + p.period * (1.0 + WINDOW_TOLERANCE)
        for k, p in enumerate(periodic)
    )
    circle = Circle(tuple(periods), wraps, wrapped, int(moments.n.min()))
    on_circle = options.observable_for(components, circle)
    if isinstance(on_circle, PendingDistribution | FieldSpec):  # settled by the survey or grid
        return observable, survey.centre, periods
    if on_circle.names == observable.names:
        return on_circle, survey.centre, periods
    return on_circle, passes(observable_mean_reduction(on_circle))[0], periods


@dataclass(frozen=True)
class Plan:
    """What an estimate fits and adds (:func:`plan_estimate`): the kernel embedding's first basis
    and score matching's features (``None``: that family is not fitted), the index-set rule
    (``"auto"`` resolves after the fit), the baselines, the affine correction, and whether a
    pilot decides if the kernel embedding is carried past its fit."""

    density_basis: TensorBasis | None
    features: PolynomialFeatures | LocalFeatures | None
    index_set: str
    grown: bool  #: score matching's index set grown by held-out loss in ``features``
    kde_grid: tuple[Any, np.ndarray] | None
    exact: Callable | None
    gaussian: SampleMoments | None
    corrected: bool
    pilot: bool  #: whether the kernel embedding is first fitted to a subsample (a pilot)
    #: the Stein correction is a refit (:func:`~kelr_dist.pipeline.fits.stein_refit`): on the
    #: observable's own functions (squares, a user's functions, a distribution's bins, powers or
    #: exceedances: outside the affine span) and on the site sums of a tied local model
    refit: bool = False
    #: the refit's test functions hold the tied local model's site sums
    #: (:class:`~kelr_dist.kernels.scores.site_sums.SiteSums`)
    site_sums: bool = False

    @property
    def affine(self) -> bool:
        """Whether the estimated scores get the affine Stein correction in the response read."""
        return self.corrected and not self.refit

    def correction(self, observable: Observable) -> str:
        """The Stein correction's test functions beside the affine ones (the result's
        ``attrs["stein_correction"]``): ``"observable"``, ``"site sums"``, both, ``"affine"``
        alone, or ``"none"``."""
        if not self.corrected:
            return "none"
        parts = [
            name
            for name, used in (
                ("observable", self.refit and not affine(observable)),
                ("site sums", self.site_sums),
            )
            if used
        ]
        return ", ".join(parts) or "affine"

    def scores(
        self,
        ke: KernelEmbeddingChoice | None,
        sm: AnyScoreMatching | None,
        fits: Fits,
        extended: Score | None = None,
    ) -> tuple[dict[str, Score], dict[str, tuple[Score, ...]], dict[str, tuple[Score, ...]]]:
        """The scores of the response read by response variable, the estimated ones refitted
        without each fold (their jackknife error), and their neighbouring models (their
        sensitivity; score matching's also ``extended``, outside its polynomial span), all in
        the same read."""
        scores: dict[str, Score] = {}
        replicates: dict[str, tuple[Score, ...]] = {}
        neighbours: dict[str, tuple[Score, ...]] = {}
        if ke is not None:
            scores["response_kernel_embedding"] = ke.score
            replicates["response_kernel_embedding"] = ke.refits()
            if ke.neighbours is not None:
                neighbours["response_kernel_embedding"] = ke.neighbours[0]
        if sm is not None:
            scores["response_score_matching"] = sm.model
            replicates["response_score_matching"] = sm.refits()
            richer = () if sm.neighbours is None else sm.neighbours[0]
            outside = () if extended is None else (extended,)
            if richer or outside:
                neighbours["response_score_matching"] = (*richer, *outside)
        if self.exact is not None:
            scores["response_exact"] = FunctionScore(self.exact)
        if fits.kde is not None:
            scores["response_kde"] = KDEScore(fits.kde)
        if self.gaussian is not None:
            sample = self.gaussian
            scores["response_gaussian"] = FunctionScore(
                gaussian_score(sample.mean, np.atleast_2d(sample.cov))
            )
        return scores, replicates, neighbours


def local_features(
    setting: Setting,
    declared: Neighbourhoods | None,
    n_samples: int,
    symmetry: str = "none",
    adaptive: bool = False,
) -> LocalFeatures:
    """The local score model's features: on the ``declared`` neighbourhoods, or on each
    component's strongest partial correlations in the survey's covariance
    (:func:`~kelr_dist.kernels.scores.local.partners_from_covariance`); ``symmetry="translation"``
    ties the sites' weights. Each site's degrees are capped by the budget of ``n_samples``
    (:func:`~kelr_dist.kernels.scores.local.site_budget`, the Gram pass's
    :data:`~kelr_dist.pipeline.steps.SM_GRAM_FLOPS`); ``adaptive``: the dictionary an adaptive
    index set grows in, at the same Gram cost
    (:func:`~kelr_dist.kernels.scores.local.adaptive_features`, :data:`SM_TOTAL_SHARE` of the
    budget a whole total-degree set)."""
    if declared is None:
        sample = setting.survey.sample
        assert sample is not None  # settle asks for the covariance
        declared = partners_from_covariance(np.atleast_2d(sample.cov))
    tied = symmetry == "translation"
    budget = site_budget(n_samples, len(setting.coordinates), tied, SM_GRAM_FLOPS)
    if adaptive:
        return adaptive_features(declared, setting.coordinates, budget, SM_TOTAL_SHARE, tied)
    caps = tuple(degree_caps(declared, budget))
    return LocalFeatures(declared, setting.coordinates, caps, tied=tied)


def affine(observable: Observable) -> bool:
    """Whether ``A`` is affine in ``x``: the identity, or a fixed matrix (a field's mean or EOF
    amplitudes, :class:`~kelr_dist.kernels.observables.field.LinearObservable`). Its functions
    are then in the span of the affine Stein correction, which makes its lag-0 response exact;
    any other observable is refitted on its own functions (:attr:`Plan.refit`)."""
    return observable.function is None or isinstance(observable.function, LinearObservable)


def plan_estimate(
    passes: Passes, options: EstimateOptions, inputs: Inputs, setting: Setting
) -> Plan:
    """The families to fit, their bases, the baselines. With ``estimator="auto"`` on long data a
    pilot (:func:`~kelr_dist.pipeline.steps.pilot_kernel_embedding`, reads of a subsample after
    read 2) decides whether the kernel embedding can still win; read 2 then fits score matching
    alone, and the kernel embedding is fitted to all samples (read 2k) only if it can."""
    # "auto" (and its alias "adaptive") grows score matching's index set unless a degree is
    # given; the kernel embedding's index set is then "auto"
    index_set = "auto" if options.index_set == "adaptive" else options.index_set
    fitted = options.estimator in ("auto", "score-matching")
    grown = fitted and index_set == "auto" and inputs.degree is None and not inputs.local
    n_samples = math.prod(passes.trajectory.shape[:2])
    if index_set == "auto" and isinstance(inputs.order, tuple):
        index_set = "box"
    basis = None
    features: PolynomialFeatures | LocalFeatures | None = None
    # a kernel embedding whose orders stop at 0 (its budget in many dimensions) is its Gaussian
    # weight alone, with no order to choose and nothing score matching's degree 1 lacks
    embedding = options.estimator == "kernel-embedding" or (
        options.estimator == "auto" and int(np.max(inputs.fitted)) > 0
    )
    if embedding:
        basis = TensorBasis(setting.coordinates, inputs.fitted, index_set_for(index_set))
    if fitted:
        if inputs.local:
            adaptive = options.index_set == "local-adaptive" and inputs.degree is None
            features = local_features(
                setting, inputs.neighbours, n_samples, options.symmetry, adaptive
            )
        else:
            grown_for = n_samples if grown else None
            features = score_matching_features(setting.coordinates, inputs.degree, grown_for)
    sample = setting.survey.sample
    # on a circle the bins at the wrap are not periodic: no Stein identity to enforce
    refits = options.stein_correction and setting.periods is None
    site_sums = refits and isinstance(features, LocalFeatures) and features.tied
    return Plan(
        density_basis=basis,
        features=features,
        index_set=index_set,
        grown=grown,
        kde_grid=kde_grid_and_bandwidth(sample) if options.kde and sample is not None else None,
        exact=inputs.exact,
        gaussian=sample if options.gaussian else None,
        corrected=options.stein_correction,
        refit=refits and (site_sums or not affine(setting.observable)),
        site_sums=site_sums,
        pilot=options.pilot
        and options.estimator == "auto"
        and basis is not None
        and pilot_stride(n_samples) is not None,
    )
