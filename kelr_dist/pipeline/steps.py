"""The estimate's steps, each one engine pass plus kernels: survey, basis, fit, choose, respond.

A step takes a :class:`Passes` (the trajectory and where its passes run) and the results of
earlier steps, and returns plain results; :func:`kelr_dist.pipeline.estimate.estimate_response`
composes
them, and scripts may call them one by one::

    passes = Passes(trajectory, client)
    survey = survey_data(passes, observable)                      # read 1: moments, Ā
    coordinates = choose_coordinates(passes, survey, "auto")       # (read 1b: Gamma fit)
    fits = fit_estimators(passes, density_basis=basis, features=features, folds=folds)  # 2
    sm = choose_score_matching(fits.gram)                          # no read: held-out Gram sums
    pilot = pilot_kernel_embedding(passes, basis, sm, folds.count)  # read 2p: a subsample
    ke = choose_kernel_embedding(passes, fits.density)             # read 3: δ/R/η sweep
    response = response_reduction({"response": ...}, observable, forcing, lag, centre=survey.centre)
    out = respond(passes, response)                                # read 4

Every pass is :func:`kelr_dist.engine.passes.run_reductions` with the step's reductions; reductions
that
can share a read of the data are run in the same pass.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import xarray as xr

from kelr_dist.data.store import IN_MEMORY, as_trajectory
from kelr_dist.engine.failures import WorkersLost, check_functions_on_workers
from kelr_dist.engine.passes import keep_in_memory, run_reductions, scatter_trajectory
from kelr_dist.kernels.baselines.kde import (
    DEFAULT_MAX_GRID_BYTES,
    BinnedKDE,
    binned_kde_reduction,
    default_grid,
    silverman_bandwidth,
)
from kelr_dist.kernels.baselines.quasi_gaussian import (
    COLLINEAR_TOLERANCE,
    SampleMoments,
    collinear_component,
    mean_covariance_reduction,
)
from kelr_dist.kernels.bases.coordinates import (
    Periodicity,
    choose_basis,
    gamma_reduction_for,
    periodicity,
)
from kelr_dist.kernels.bases.families import Coordinate, IndexSet, TensorBasis
from kelr_dist.kernels.reduction import Reduction
from kelr_dist.kernels.response.operator import (
    DensityScore,
    Observable,
    ResponseResult,
    observable_mean_reduction,
)
from kelr_dist.kernels.response.stein_correction import ExtendedScore, FourierFeatures
from kelr_dist.kernels.scores.folds import Folds, fold_stderr
from kelr_dist.kernels.scores.heldout import (
    Choice,
    FoldLosses,
    density_loss_reduction,
)
from kelr_dist.kernels.scores.index_sets import GrowthPath, dictionary, edge_falls, grow
from kelr_dist.kernels.scores.kernel_embedding import KernelDensity, coefficient_reduction
from kelr_dist.kernels.scores.local import (
    LocalChoice,
    LocalFeatures,
    LocalSums,
    choose_local,
    held_by_cost,
    local_gram_reduction,
)
from kelr_dist.kernels.scores.refit import Request, refit_reduction
from kelr_dist.kernels.scores.score_matching import (
    RIDGES,
    Candidate,
    GramSums,
    PolynomialFeatures,
    ScaledGram,
    ScoreModel,
    choose_candidate,
    feature_count,
    fit_score,
    gram_reduction,
    held_out_candidates,
    held_out_losses,
)
from kelr_dist.kernels.scores.selection import (
    ERROR_WINDOW,
    Criteria,
    active_coordinates,
    choose_delta,
    choose_order,
    criteria_reduction,
)
from kelr_dist.kernels.scores.stein_check import SteinCheck
from kelr_dist.kernels.survey.moments import (
    CoordinateError,
    EdgeStatistics,
    Moments,
    WrapStatistics,
    edge_reduction,
    moments_reduction,
    wrap_reduction,
)
from kelr_dist.kernels.survey.subsample import strided_rows_reduction

#: the kernel embedding's highest order scanned: the largest total-degree set whose work per
#: sample, ~(d + 1) P flops for the P basis functions (coefficients, p and its d derivatives, the
#: criteria sweep), is at most KE_WORK_PER_SAMPLE — 70 in d = 2 (2556 functions), 20 in d = 3,
#: 11 in d = 4, 6 in d = 6 (see docs/benchmarks.md, section 'Tuning constants') — with every
#: coordinate at most KE_MAX_DEGREE (the 1-D order); tables stay within bases.TABLE_BUDGET bytes
KE_WORK_PER_SAMPLE = 7800
KE_MAX_DEGREE = 150
#: score matching's highest degree: at most this many features (Gram matrices of 400 KiB each)
#: and at most SM_MAX_DEGREE (polynomials of higher degree are fitted to noise; see
#: docs/benchmarks.md, section 'Tuning constants')
SM_MAX_FEATURES = 220
SM_MAX_DEGREE = 24
#: flops the score-matching Gram pass may spend (2 P² per row used, ~8 s at 50 Gflop/s): rows
#: beyond that budget are thinned to every stride-th sample
SM_GRAM_FLOPS = 4e11
#: the default (grown) index set's dictionary: at most ``c N^(1/3)`` features for the ``N`` rows
#: the Gram pass uses, c this constant. A least-squares series fit of K power-series terms is
#: consistent when ``ζ(K)² K / N → 0`` with ``ζ(K) ∝ K`` (W. K. Newey, "Convergence rates and
#: asymptotic normality for series estimators", J. Econometrics 79 (1997) 147-168, Assumption 3
#: and its power-series bound): ``K ∝ N^(1/3)``; c = 5 gives about SM_MAX_FEATURES at 1e5 rows
SM_FEATURES_PER_CUBE_ROOT = 5.0
#: ... of which this share is a whole total-degree set: at the largest budget (478 features) that
#: is the fixed total-degree set's degree or above (SM_MAX_FEATURES: 6 in 4-D, 9 in 3-D), so the
#: grown set can start where the fixed one would stop
SM_TOTAL_SHARE = 0.6


def kernel_embedding_max_order(d: int) -> int:
    """Highest total order ``M`` with ``(d + 1) C(M + d, d) ≤`` :data:`KE_WORK_PER_SAMPLE` (and
    ``M ≤`` :data:`KE_MAX_DEGREE`): the work budget of the kernel-embedding passes."""
    order = 0
    while order < KE_MAX_DEGREE and (d + 1) * math.comb(order + 1 + d, d) <= KE_WORK_PER_SAMPLE:
        order += 1
    return order


def score_matching_max_degree(d: int) -> int:
    """Highest total degree ``1 ≤ q ≤`` :data:`SM_MAX_DEGREE` with at most
    :data:`SM_MAX_FEATURES` features."""
    degree = 1
    while degree < SM_MAX_DEGREE and feature_count(d, degree + 1) <= SM_MAX_FEATURES:
        degree += 1
    return degree


def dictionary_budget(n_samples: int) -> int:
    """Features of the dictionary score matching's default index set grows in: the largest
    ``P ≤ c N_used^(1/3)`` (:data:`SM_FEATURES_PER_CUBE_ROOT`) for the rows ``N_used`` the Gram
    pass reads: all ``N`` samples, or the ``SM_GRAM_FLOPS / (2 P²)`` it is thinned to when ``2 P²
    N`` flops exceed :data:`SM_GRAM_FLOPS`. So the budget grows as ``N^(1/3)`` (108 features at
    1e4 samples, 232 at 1e5) up to ``(c³ SM_GRAM_FLOPS / 2)^(1/5)`` (478, from about 9e5
    samples on), where the stated cost of the pass holds it."""
    c = SM_FEATURES_PER_CUBE_ROOT
    by_rows = c * max(n_samples, 1) ** (1.0 / 3.0)
    by_cost = (c**3 * SM_GRAM_FLOPS / 2.0) ** (1.0 / 5.0)
    return int(min(by_rows, by_cost))


def grown_base_degree(d: int, budget: int) -> int:
    """The total degree of the dictionary's full block: the highest ``1 ≤ q ≤``
    :data:`SM_MAX_DEGREE` with at most :data:`SM_TOTAL_SHARE` of the ``budget``'s features (the
    rest reaches further along single coordinates and pairs)."""
    degree = 1
    while degree < SM_MAX_DEGREE and feature_count(d, degree + 1) <= SM_TOTAL_SHARE * budget:
        degree += 1
    return degree


def score_matching_features(
    coordinates: tuple[Coordinate, ...],
    degree: int | None,
    grown_for: int | None = None,
) -> PolynomialFeatures:
    """The features of the Gram pass: total degree ``degree + 1`` for a given degree (the one
    above is its neighbour, :attr:`ScoreMatchingChoice.neighbours`), else
    :func:`score_matching_max_degree`, or (``grown_for`` a number of samples) the dictionary the
    default index set grows in (:func:`kelr_dist.kernels.scores.index_sets.dictionary`): the
    total degree of :func:`grown_base_degree` and single coordinates and pairs further, at most
    :func:`dictionary_budget` features in all."""
    d = len(coordinates)
    if grown_for is not None:
        budget = max(dictionary_budget(grown_for), d + 1)
        return dictionary(coordinates, grown_base_degree(d, budget), budget)
    return PolynomialFeatures(
        coordinates, score_matching_max_degree(d) if degree is None else degree + 1
    )


#: with a correlation time τ (rows), the goodness-of-fit check may read every ⌊τ / this⌋-th row:
#: for an AR(1) series thinning to a stride of τ / 4 raises the variance of a mean by about 2%
#: (s τ_s / τ with τ_s the thinned series' time), so the other rows buy nearly nothing
#: (MacEachern & Berliner, "Subsampling the Gibbs sampler", Amer. Statist. 48 (1994) 188-190;
#: Sokal, "Monte Carlo methods in statistical mechanics", 1997, for τ)
CORRELATION_STRIDE_DIVISOR = 4


def gram_stride(n_samples: int, features: int) -> int:
    """Every how many samples the Gram pass uses: so that its ``2 P²`` flops per row stay within
    :data:`SM_GRAM_FLOPS`. (Not thinned by the correlation time: :func:`correlation_time` depends
    on the units through the survey's wrap test, and every row read keeps score matching's
    normal equations, hence the lag-0 Stein identity, exact on all rows.)"""
    return max(1, math.ceil(n_samples * 2.0 * features**2 / SM_GRAM_FLOPS))


def check_stride(correlation: float | None) -> int:
    """Every how many rows the goodness-of-fit check reads
    (:mod:`~kelr_dist.kernels.scores.stein_check`): every ``⌊τ /``
    :data:`CORRELATION_STRIDE_DIVISOR` ``⌋``-th for an integrated autocorrelation time ``τ`` in
    rows (:func:`correlation_time`; all rows when it is not known)."""
    return 1 if correlation is None else max(1, int(correlation // CORRELATION_STRIDE_DIVISOR))


def correlation_time(survey: Survey) -> float | None:
    """Integrated autocorrelation time in rows from the survey, no further read: per coordinate
    the lag-1 autocorrelation ``ρ₁ = 1 - E[Δ²] / (2 var)`` of consecutive steps ``Δ`` and its
    AR(1) time ``τ = (1 + ρ₁) / (1 - ρ₁)``, the smallest over coordinates (the slower modes of a
    coordinate only lengthen its true τ, so this thins less than they would allow). ``E[Δ²]`` is
    the survey's mean square circular step of a period that saw no jump (then every circular step
    is the plain step); ``None`` when a coordinate has none."""
    wraps = survey.wraps
    if wraps is None:
        return None
    times = []
    for k, var in enumerate(np.asarray(survey.moments.std, dtype=np.float64) ** 2):
        plain = np.flatnonzero(wraps.jumps[k] == 0)
        if plain.size == 0 or not var > 0 or wraps.steps[k] < 1:
            return None
        rho = 1.0 - float(wraps.step_rms[k, plain[0]]) ** 2 / (2.0 * var)
        times.append((1.0 + rho) / (1.0 - rho) if 0.0 < rho < 1.0 else 1.0)
    return min(times)


#: flops per second of the passes' matrix products on the embedded cluster, to state the cost of
#: a larger budget in seconds (the rates behind SM_GRAM_FLOPS and KE_WORK_PER_SAMPLE; see
#: docs/benchmarks.md, section 'Tuning constants')
GRAM_FLOP_RATE = 5e10
TABLE_FLOP_RATE = 2e10


@dataclass(frozen=True)
class Truncation:
    """The chosen order or degree is the largest the budget allowed and the held-out loss was
    still falling there: by ``drop`` (``drop_stderr`` its paired standard error over folds)."""

    estimator: str
    chosen: int
    drop: float
    drop_stderr: float
    knob: str  #: the option that raises the budget, with its cost
    where: str = ""  #: where in the index set, when not the whole set

    @property
    def message(self) -> str:
        family = "degree" if self.estimator == "score-matching" else "order"
        return (
            f"{self.estimator} chose {family} {self.chosen}{self.where}, the largest its budget "
            "allows, and "
            f"its held-out loss was still falling there (by {self.drop:.3g}, "
            f"{self.drop / self.drop_stderr:.1f} standard errors, from {family} "
            f"{self.chosen - 1}): the estimate is limited by the budget, not the data, and may "
            f"be biased beyond its error bars; {self.knob}"
        )


def score_matching_truncation(choice: AnyScoreMatching, n_samples: int) -> Truncation | None:
    """A :class:`Truncation` when score matching's automatic degree is the largest fitted
    (:func:`score_matching_max_degree`): the one-standard-error rule then found no lower degree as
    good, so the loss was still falling. The knob is ``degree``, one more than the largest, with
    its Gram matrices' bytes and the Gram pass's seconds. For an adaptive index set: when the
    grown set holds the dictionary's highest degree along a coordinate and adding it lowered the
    held-out loss (:func:`adaptive_truncation`)."""
    if isinstance(choice, LocalChoice):
        found = choice.truncation()
        if found is None:
            return None
        features = choice.sums.features
        if held_by_cost(n_samples, features.dim, features.tied, SM_GRAM_FLOPS):
            knob = (
                "a site's features are held by the Gram pass's cost (local.site_budget, "
                f"SM_GRAM_FLOPS = {SM_GRAM_FLOPS:.0e}), not by the samples: more samples do not "
                "raise it"
            )
        else:
            knob = (
                "a site's features grow with the samples, as 5 N^(1/3) (tied sites: "
                "5 (N d)^(1/3)), up to the Gram pass's cost (local.site_budget): more samples "
                "raise it"
            )
        return Truncation(
            "score-matching",
            choice.degree,
            *found,
            knob,
            where=f" at radius {choice.radius} of the local model"
            + ("" if choice.growth is None else ", along a component of its adaptive index set"),
        )
    if choice.path is not None:
        return adaptive_truncation(choice, n_samples)
    top = choice.sums.features.degree
    if choice.degree != top or top < 2:
        return None

    def best(degree: int) -> Candidate:
        return min((c for c in choice.candidates if c.degree == degree), key=lambda c: c.loss)

    lower, upper = best(top - 1), best(top)
    return Truncation(
        "score-matching",
        top,
        lower.loss - upper.loss,
        float(fold_stderr(lower.fold_losses - upper.fold_losses)),
        f"degree={top + 1} raises it ({_degree_cost(choice.sums, top + 1, n_samples)})",
    )


def adaptive_truncation(choice: ScoreMatchingChoice, n_samples: int) -> Truncation | None:
    """A :class:`Truncation` when the adaptive index set reached the dictionary's highest degree
    along a coordinate (:func:`kelr_dist.kernels.scores.index_sets.edge_falls`) and the step that
    added it lowered the held-out loss (the largest such fall): growth there was stopped by the
    dictionary, not by the data."""
    features, path = choice.sums.features, choice.path
    assert path is not None
    members = choice.pick.keep(features)
    found: Truncation | None = None
    for k, top, fall in edge_falls(features, members, path):
        drop = float(fall @ path.weights)
        if drop > 0 and (found is None or drop > found.drop):
            found = Truncation(
                "score-matching",
                top,
                drop,
                float(fold_stderr(fall)),
                f"index_set='total' with degree={top + 1} reaches further along it "
                f"({_degree_cost(choice.sums, top + 1, n_samples)}); the grown set's dictionary "
                f"of {features.size} features grows with the samples, as 5 N^(1/3)",
                f" along coordinate {k + 1} of its adaptive index set",
            )
    return found


def _degree_cost(sums: GramSums, degree: int, n_samples: int) -> str:
    """What the total-degree set of ``degree`` costs: features, Gram bytes, seconds, stride."""
    d, folds = sums.features.dim, len(sums.n)
    size = feature_count(d, degree)
    stride = gram_stride(n_samples, size)
    seconds = n_samples / stride * 2.0 * size**2 / GRAM_FLOP_RATE
    return (
        f"{size} features instead of {feature_count(d, degree - 1)}: Gram matrices of "
        f"{8 * size**2 * (folds + 1) / 2**20:.1f} MiB with the folds', ~{seconds:.0f} s of Gram "
        f"products, rows thinned to every {stride}-th"
    )


def kernel_embedding_truncation(choice: KernelEmbeddingChoice, n_samples: int) -> Truncation | None:
    """A :class:`Truncation` when the kernel embedding's automatic order is the highest scanned
    (:func:`kernel_embedding_max_order`) and its held-out L² loss fell from the order below it.
    The knob is ``max_order``, with the basis size and the seconds per pass of its tables."""
    criteria = choice.criteria
    loss, loss_stderr = criteria.held_out_loss, criteria.held_out_loss_stderr
    top = int(criteria.orders[-1])
    if choice.order_selection != "auto" or choice.level != top or loss is None or top < 1:
        return None
    assert loss_stderr is not None
    if not loss[top] < loss[top - 1]:
        return None
    basis = choice.density.basis
    larger = TensorBasis(basis.coordinates, _raised(basis.order), basis.index_set)
    seconds = n_samples * (basis.dim + 1) * larger.size / TABLE_FLOP_RATE
    knob = (
        f"max_order={top + 1} raises it ({larger.size} basis functions instead of {basis.size}, "
        f"~{seconds:.0f} s of basis tables per pass over these {n_samples} samples)"
    )
    stderr = float(np.hypot(loss_stderr[top], loss_stderr[top - 1]))
    return Truncation("kernel-embedding", top, float(loss[top - 1] - loss[top]), stderr, knob)


def _raised(order: int | tuple[int, ...]) -> int | tuple[int, ...]:
    """An order one higher (every coordinate's of a box that is not held at 0)."""
    if isinstance(order, tuple):
        return tuple(m + 1 if m > 0 else 0 for m in order)
    return int(order) + 1


@dataclass
class Passes:
    """A trajectory and where its passes run; counts the passes over the data and the reads
    of the store (one in all when the trajectory is kept in the workers' memory,
    :func:`kelr_dist.engine.passes.keep_in_memory`)."""

    trajectory: xr.DataArray
    client: Any
    progress: bool | None = None
    in_memory: bool = False
    reads: int = 0
    #: the trajectory as its store gives it, for a kept one: read again from the store when
    #: the workers holding the kept blocks are all lost (:class:`WorkersLost`)
    stored: xr.DataArray | None = None

    def __call__(self, *reductions: Reduction) -> list[Any]:
        self.reads += 1
        try:
            return run_reductions(self.trajectory, reductions, self.client, progress=self.progress)
        except WorkersLost:
            if self.stored is None:
                raise
            self.trajectory, self.stored = self.stored, None  # out of core from now on
            self.in_memory = False
            return run_reductions(self.trajectory, reductions, self.client, progress=self.progress)

    @property
    def store_reads(self) -> int:
        """Reads of the store (or of the caller's array): 1 when kept in memory."""
        return min(self.reads, 1) if self.in_memory else self.reads


def open_passes(trajectory: xr.DataArray, client: Any, progress: bool | None) -> Passes:
    """The :class:`Passes` over ``trajectory`` on ``client``: in-memory input scattered to the
    workers once, and a store that fits in the workers' memory kept there and read once for all
    passes (read again from the store if the workers holding it are all lost)."""
    kept, in_memory = keep_in_memory(scatter_trajectory(trajectory, client), client)
    return Passes(kept, client, progress, in_memory, stored=trajectory if in_memory else None)


def check_user_functions(score: Any, observable: Any, forcing: Any, client: Any) -> None:
    """The user's score function, observable and forcing (``"module:function"`` specs, or
    objects with a ``function`` spec) loaded on every worker before any block runs
    (:func:`~kelr_dist.engine.failures.check_functions_on_workers`)."""
    check_functions_on_workers(
        {
            "score function": score,
            "observable": getattr(observable, "function", None),
            "forcing": getattr(forcing, "function", None),
        },
        client,
    )


@dataclass(frozen=True)
class Survey:
    """Pass-0 results: per-coordinate moments, the observable's mean ``Ā (q,)`` and (when asked)
    mean and covariance for the baselines."""

    moments: Moments
    centre: np.ndarray
    sample: SampleMoments | None = None
    wraps: WrapStatistics | None = None
    edges: EdgeStatistics | None = None


def survey_data(passes: Passes, observable: Observable) -> Survey:
    """Read 1: moments and tails (basis choice, step 1 of §4), the steps that find wrapped
    angles, the extremes that find hard edges, ``Ā``, and the sample mean and covariance (KDE
    bandwidth, quasi-Gaussian baseline). A component that is (nearly) a linear combination of the
    ones before it is refused here, naming it
    (:func:`~kelr_dist.kernels.baselines.quasi_gaussian.collinear_component`)."""
    reductions = [moments_reduction(), wrap_reduction(), edge_reduction()]
    reductions.append(observable_mean_reduction(observable))
    reductions.append(mean_covariance_reduction())
    with _named_components(passes):
        out = passes(*reductions)
    sample: SampleMoments = out[4]
    collinear = collinear_component(np.atleast_2d(sample.cov))
    if collinear is not None:
        j, left = collinear
        names = [str(c) for c in passes.trajectory.coords["component"].values]
        others = [n for k, n in enumerate(names) if k != j]
        raise ValueError(
            f"trajectory {passes.trajectory.attrs.get('store', IN_MEMORY)!r}, component "
            f"{names[j]!r}: a linear combination of {names[:j]} (1 - R² = {left:.2g}, below "
            f"{COLLINEAR_TOLERANCE:g}); its density has no spread off that line: estimate "
            f"without it (components={others})"
        )
    return Survey(out[0], out[3], sample, out[1], out[2])


def declared_periods(trajectory: xr.DataArray) -> list[float | None] | None:
    """The trajectory's ``periods`` attribute (a mapping, or its JSON text, of component name to
    period; 0 or null: declared not periodic) as one entry per component (None: not declared);
    None without the attribute. ``ValueError`` naming the store for a malformed one."""
    value = trajectory.attrs.get("periods")
    if value is None:
        return None
    source = trajectory.attrs.get("store", IN_MEMORY)
    try:
        periods = json.loads(value) if isinstance(value, str) else dict(value)
        checked = {str(k): float(v or 0.0) for k, v in periods.items()}
    except (TypeError, ValueError, AttributeError):
        checked = {"": math.nan}
    if not all(math.isfinite(v) and v >= 0 for v in checked.values()):
        raise ValueError(
            f"trajectory {source!r}: attribute 'periods' must map component names to periods "
            f"(numbers > 0; 0 or null: not periodic), got {value!r}"
        )
    return [checked.get(str(c)) for c in trajectory.coords["component"].values]


def find_periodic(
    passes: Passes, survey: Survey, basis: str | Sequence[Any] = "auto"
) -> list[Periodicity | None]:
    """The periodic components (:func:`kelr_dist.kernels.bases.coordinates.periodicity`): declared
    by the spec or the trajectory's ``periods`` attribute, or found wrapped in the survey. No
    read."""
    declared = declared_periods(passes.trajectory)
    return periodicity(survey.moments, basis, survey.wraps, declared)


@contextmanager
def _named_components(passes: Passes) -> Iterator[None]:
    """Re-raise a :class:`~kelr_dist.kernels.survey.moments.CoordinateError` (NaN, too large values,
    a constant component) naming the store and the component."""
    try:
        yield
    except CoordinateError as err:
        source = passes.trajectory.attrs.get("store", IN_MEMORY)
        name = str(passes.trajectory.coords["component"].values[err.coordinate])
        raise ValueError(f"trajectory {source!r}, component {name!r}: {err.problem}") from None


def choose_coordinates(
    passes: Passes,
    survey: Survey,
    basis: str | Sequence[Any] = "auto",
    periodic: Sequence[Periodicity | None] | None = None,
) -> tuple[Coordinate, ...]:
    """Basis per coordinate (step 1 of §4, Remark 1; Fourier for the ``periodic`` ones, default
    :func:`find_periodic`); runs the Gamma-fit pass only for Laguerre coordinates whose θ comes
    from the data."""
    with _named_components(passes):
        periodic = find_periodic(passes, survey, basis) if periodic is None else periodic
        gamma_pass = gamma_reduction_for(survey.moments, basis, periodic)
        gamma = passes(gamma_pass)[0] if gamma_pass is not None else None
        return tuple(choose_basis(survey.moments, gamma, basis, periodic))


def kde_grid_and_bandwidth(sample: SampleMoments) -> tuple[Any, np.ndarray]:
    """The binned KDE's grid and Silverman bandwidth; ``ValueError`` (naming the bytes) before any
    further pass when the grid would not fit."""
    h = silverman_bandwidth(np.sqrt(np.diag(np.atleast_2d(sample.cov))), int(sample.count))
    grid = default_grid(sample.minimum, sample.maximum, h, max_bytes=math.inf)
    if grid.working_bytes > DEFAULT_MAX_GRID_BYTES:
        raise ValueError(
            f"kde: the Gaussian-KDE baseline would need a grid of {grid.shape} nodes "
            f"({grid.working_bytes / 2**30:.1f} GiB, more than the "
            f"{DEFAULT_MAX_GRID_BYTES / 2**30:.0f} GiB it may use: its nodes are a quarter "
            "bandwidth apart, and the bandwidth shrinks as the samples grow); leave the "
            "baseline out, or estimate fewer components (components=, --components)"
        )
    return grid, h


@dataclass(frozen=True)
class Fits:
    """Read-2 results: the kernel embedding ``p_M`` (fitted by fold), score matching's Gram sums
    by fold, and the KDE baseline — each ``None`` when not asked for."""

    density: KernelDensity | None = None
    gram: GramSums | LocalSums | None = None
    kde: BinnedKDE | None = None


def fit_estimators(
    passes: Passes,
    *,
    density_basis: TensorBasis | None = None,
    features: PolynomialFeatures | LocalFeatures | None = None,
    folds: Folds | None = None,
    kde_grid: tuple[Any, np.ndarray] | None = None,
) -> Fits:
    """Read 2: coefficient sums (eq. 39), score matching's Gram sums (Hyvärinen 2005) and
    the KDE bins, in one pass; sums kept per held-out fold when ``folds`` is given. The Gram
    sums use every :func:`gram_stride`-th row."""
    reductions, names = [], []
    if density_basis is not None:
        reductions.append(coefficient_reduction(density_basis, folds))
        names.append("density")
    if features is not None:
        if folds is None:
            raise ValueError("score matching needs held-out folds")
        chains, n, _ = passes.trajectory.shape
        stride = gram_stride(chains * n, features.gram_size)
        if isinstance(features, LocalFeatures):
            reductions.append(local_gram_reduction(features, folds, stride))
        else:
            reductions.append(gram_reduction(features, folds, stride))
        names.append("gram")
    if kde_grid is not None:
        reductions.append(binned_kde_reduction(*kde_grid))
        names.append("kde")
    return Fits(**dict(zip(names, passes(*reductions), strict=True)))


@dataclass(frozen=True)
class KernelEmbeddingChoice:
    """The kernel embedding after order and threshold selection (eqs. 52–54)."""

    density: KernelDensity
    order: int | tuple[int, ...]
    delta: float
    criteria: Criteria
    deltas: np.ndarray
    order_selection: str = "auto"
    delta_rule: str = "auto"

    @property
    def level(self) -> int:
        return max(self.order) if isinstance(self.order, tuple) else int(self.order)

    @property
    def score(self) -> DensityScore:
        """``∇ log p_M`` on ``{p_M ≥ δ}`` (eq. 46) at the chosen order and threshold."""
        return DensityScore(self.density, self.order, self.delta)

    @cached_property
    def neighbours(self) -> tuple[tuple[DensityScore, ...], str] | None:
        """The score two orders higher, or one at the edge of the fit (a box order: its nonzero
        entries that can, up by as much), at its order's threshold by the same rule (a given
        ``δ`` stays), with what it is (``None``: the fit holds no higher order); see
        :attr:`ScoreMatchingChoice.neighbours`."""
        basis = self.density.basis
        level = min(self.level + 2, basis.max_level)
        order: Order = level
        if isinstance(self.order, tuple):
            order = tuple(
                min(o + level - self.level, t) if o > 0 else 0
                for o, t in zip(self.order, basis.max_orders, strict=True)
            )
        if level <= self.level or order == self.order:
            return None
        deltas = {"auto": self.deltas, "paper": self.criteria.delta_paper}.get(self.delta_rule)
        delta = self.delta if deltas is None else float(deltas[level])
        return (DensityScore(self.density, order, delta),), f"order {self.order} -> {order}"

    def refits(self) -> tuple[DensityScore, ...]:
        """The score with ``p_M`` refitted without each held-out fold (eq. 39 over the other
        folds' sums), at the same order and threshold: the jackknife replicates."""
        assert self.density.fold_counts is not None
        return tuple(
            DensityScore(self.density.held_out(f), self.order, self.delta)
            for f in range(len(self.density.fold_counts))
        )


Order = int | tuple[int, ...]


def settle_index_set(
    passes: Passes,
    density: KernelDensity,
    order: Order | None = None,
    *,
    index_set: str = "given",
    max_order: Order | None = None,
    folds: Folds | None = None,
) -> tuple[KernelDensity, Order | None]:
    """The kernel embedding's density and order on its index set. With ``index_set="auto"`` the
    fitted total-degree ``density`` is kept, or, when at most one coordinate is active
    (:func:`kelr_dist.kernels.scores.selection.active_coordinates`), refitted by ``folds`` on a box
    with order 0 on the others and ``max_order`` (default: the 1-D budget) on the active one, as in
    the paper's Langevin example (§5.2; read 2b); a given ``order`` then applies to the active
    one."""
    active = active_coordinates(density) if index_set == "auto" else None
    if active is None or active.sum() > 1 or active.all():
        return density, order
    top = kernel_embedding_max_order(1) if max_order is None else int(max_order)  # type: ignore[arg-type]
    box = TensorBasis(density.basis.coordinates, tuple(top if a else 0 for a in active), "box")
    refit = fit_estimators(passes, density_basis=box, folds=folds).density
    assert refit is not None
    return refit, None if order is None else tuple(order if a else 0 for a in active)  # type: ignore[misc]


def choose_kernel_embedding(
    passes: Passes,
    density: KernelDensity,
    order: Order | None = None,
    delta: str | float = "auto",
) -> KernelEmbeddingChoice:
    """Read 3: the δ/R/η sweep over every order, then the order (unless given) and δ (§4). A
    given order is swept from ``ERROR_WINDOW`` orders below it on: all its threshold needs."""
    given = None if order is None else (max(order) if isinstance(order, tuple) else int(order))
    lowest = 0 if given is None else max(given - ERROR_WINDOW, 0)
    criteria: Criteria = passes(criteria_reduction(density, lowest))[0]
    chosen = choose_order(criteria) if order is None else order
    level = max(chosen) if isinstance(chosen, tuple) else int(chosen)
    deltas = choose_delta(criteria)
    if delta == "auto":
        threshold = float(deltas[level])
    elif delta == "paper":
        threshold = float(criteria.delta_paper[level])
    else:
        threshold = float(delta)
    return KernelEmbeddingChoice(
        density,
        chosen,
        threshold,
        criteria,
        deltas,
        "auto" if order is None else "given",
        delta if isinstance(delta, str) else "given",
    )


@dataclass(frozen=True)
class ScoreMatchingChoice:
    """The score-matching fit of the degree (or adaptive index set) and ridge with the least
    held-out loss, and every candidate scored."""

    model: ScoreModel
    pick: Candidate
    candidates: list[Candidate] = field(repr=False)
    sums: GramSums = field(repr=False)
    path: GrowthPath | None = field(default=None, repr=False)

    @cached_property
    def condition(self) -> float:
        """Condition number of the chosen features' Gram matrix (all rows) scaled to unit
        diagonal, the matrix the weights are solved with
        (:class:`~kelr_dist.kernels.scores.score_matching.ScaledGram`)."""
        keep = self.pick.keep(self.sums.features)
        gram, _ = self.sums.means()
        return ScaledGram.of(gram[np.ix_(keep, keep)]).condition

    def refits(self) -> tuple[ScoreModel, ...]:
        """The chosen model refitted without each held-out fold (the jackknife replicates)."""
        return tuple(
            fit_score(self.sums, self.degree, self.ridge, without=f, members=self.pick.members)
            for f in range(len(self.sums.n))
        )

    @cached_property
    def neighbours(self) -> tuple[tuple[ScoreModel, ...], str] | None:
        """The chosen model two steps richer, or one at the edge of the fitted features, at the
        same ridge, with what it is: a higher total degree (two: a score of a symmetric density
        gains only from every other degree), or a later step of the adaptive growth (``None``:
        no richer model). The response's change to it
        (:attr:`~kelr_dist.kernels.response.operator.ResponseResult.model_shift`) is how much the
        estimate still depends on the model, which its error bars do not measure."""
        if self.path is None:
            richer = min(self.degree + 2, self.sums.features.degree)
            if richer <= self.degree:
                return None
            model = fit_score(self.sums, richer, self.ridge)
            return (model,), f"degree {self.degree} -> {richer}"
        chosen = self.path.chosen_step()
        step = min(chosen + 2, len(self.path.losses) - 1)
        if step <= chosen:
            return None
        members = self.path.members(step)
        model = fit_score(self.sums, self.degree, self.ridge, members=members)
        start = int(self.pick.keep(self.sums.features).sum())
        return (
            model,
        ), f"adaptive step {chosen} -> {step} ({start} -> {int(members.sum())} features)"

    @property
    def degree(self) -> int:
        return self.pick.degree

    @property
    def ridge(self) -> float:
        return self.pick.ridge

    @property
    def index_set(self) -> str:
        return "total" if self.path is None else "adaptive"


def choose_score_matching(
    gram: GramSums | LocalSums, degree: int | None = None, grown: bool = False
) -> AnyScoreMatching:
    """Degree (unless given) and ridge by held-out Hyvärinen loss (one-standard-error rule,
    :func:`kelr_dist.kernels.scores.score_matching.choose_candidate`); refit on every fold. No read.

    ``grown`` (the default index set): ``gram`` holds the sums of a dictionary
    (:func:`score_matching_features`). The total degree is chosen first, among those whose whole
    set the dictionary holds, and the index set is grown from it by held-out loss
    (:func:`kelr_dist.kernels.scores.index_sets.grow`); the ridge is then chosen for the grown
    set. The path starts at the total-degree choice and keeps it unless a larger set lowers the
    held-out loss by more than a standard error. Local sums
    (:class:`~kelr_dist.kernels.scores.local.LocalSums`): radius, degree and ridge of the local
    model (:func:`~kelr_dist.kernels.scores.local.choose_local`)."""
    if isinstance(gram, LocalSums):
        return choose_local(gram, degree)
    if not grown:
        candidates = held_out_candidates(gram, None if degree is None else [degree])
        pick = choose_candidate(candidates)
        return ScoreMatchingChoice(fit_score(gram, pick.degree, pick.ridge), pick, candidates, gram)
    start = choose_candidate(held_out_candidates(gram, list(range(1, _full_degree(gram) + 1))))
    path = grow(gram, gram.features.mask(start.degree))
    members = path.members(path.chosen_step())
    top = int(gram.features.indices[members].sum(axis=1).max())
    losses = held_out_losses(gram, members, RIDGES)
    share = gram.n / gram.n.sum()
    candidates = [
        Candidate(top, alpha, float(losses[r] @ share), losses[r], members)
        for r, alpha in enumerate(RIDGES)
    ]
    pick = choose_candidate(candidates)
    model = fit_score(gram, top, pick.ridge, members=members)
    return ScoreMatchingChoice(model, pick, candidates, gram, path)


def _full_degree(gram: GramSums) -> int:
    """The highest total degree whose whole set the features of ``gram`` hold."""
    features = gram.features
    d, degree = features.dim, 1
    while int(features.mask(degree + 1).sum()) == feature_count(d, degree + 1):
        degree += 1
    return degree


#: either kind of score-matching fit: the full tensor (or adaptive) model, or the local one
AnyScoreMatching = ScoreMatchingChoice | LocalChoice


#: the pilot fits and scores the kernel embedding on every ``k``-th sample, ``k = n_samples //
#: PILOT_SAMPLES``: rows enough for a family far behind to be many standard errors behind (the
#: pilot table of docs/benchmarks.md), few enough that its reads cost a small part of the kernel
#: embedding's own
PILOT_SAMPLES = 50_000
#: ... and it runs only when it reads at most a fifth of the samples: below that it costs about
#: what it can save
PILOT_MIN_STRIDE = 5
#: the kernel embedding is left out when its pilot held-out loss is above score matching's (fitted
#: to all samples) by more than this many standard errors of their paired difference over folds:
#: fitted to fewer samples, the kernel embedding is, if anything, worse than on all of them, so
#: such a gap, in the comparison the estimate makes (kernels/scores/heldout.py), is one it would
#: not close
PILOT_MARGIN = 5.0


@dataclass(frozen=True)
class Pilot:
    """The kernel embedding scored on a subsample (:func:`pilot_kernel_embedding`) against
    score matching's held-out loss, and whether it can still win on all samples."""

    stride: int  #: the pilot read every ``stride``-th sample
    samples: int  #: rows its held-out loss was averaged over
    kernel_embedding: Choice  #: its order and held-out loss on the pilot rows
    score_matching: Choice  #: score matching's pick and its held-out loss (all samples)
    gap_stderr: float  #: standard error of :attr:`gap` from the paired per-fold losses

    @property
    def gap(self) -> float:
        """Kernel embedding's held-out loss minus score matching's (positive: it is behind)."""
        return self.kernel_embedding.loss - self.score_matching.loss

    @property
    def skips_kernel_embedding(self) -> bool:
        """Whether the kernel embedding is behind by more than :data:`PILOT_MARGIN` standard
        errors."""
        return bool(self.gap > PILOT_MARGIN * self.gap_stderr)

    def attrs(self) -> dict[str, Any]:
        """The result's record of the pilot: ``pilot`` (:attr:`decision`), ``pilot_stride``,
        ``pilot_gap`` (in standard errors) and ``pilot_skipped`` (the family not fitted, or
        ``""``)."""
        return {
            "pilot": self.decision,
            "pilot_stride": self.stride,
            "pilot_gap": self.gap / self.gap_stderr,
            "pilot_skipped": "kernel-embedding" if self.skips_kernel_embedding else "",
        }

    @property
    def decision(self) -> str:
        """One line: what the pilot found and what runs."""
        verdict = (
            "the kernel embedding was not fitted to all samples"
            if self.skips_kernel_embedding
            else "both families were fitted to all samples"
        )
        return (
            f"pilot (kernel embedding fitted to every {self.stride}-th sample, held-out loss on "
            f"{self.samples} rows): held-out loss kernel-embedding (order "
            f"{self.kernel_embedding.order}) {self.kernel_embedding.loss:.6g}, score-matching "
            f"(degree {self.score_matching.order}) {self.score_matching.loss:.6g}, gap "
            f"{self.gap / self.gap_stderr:.1f} standard errors: {verdict}"
        )


def pilot_stride(n_samples: int) -> int | None:
    """Every how many samples the pilot reads (:data:`PILOT_SAMPLES`); ``None`` when that is
    below :data:`PILOT_MIN_STRIDE` (no pilot)."""
    stride = n_samples // PILOT_SAMPLES
    return stride if stride >= PILOT_MIN_STRIDE else None


def pilot_kernel_embedding(
    passes: Passes,
    density_basis: TensorBasis,
    score_matching: AnyScoreMatching,
    folds: int,
    *,
    order: Order | None = None,
    delta: str | float = "auto",
    index_set: str = "given",
    max_order: Order | None = None,
) -> Pilot | None:
    """Read 2p gathers every ``k``-th sample (:func:`pilot_stride`) into memory; on them, the
    kernel embedding fitted by ``folds`` on ``density_basis``, its index set, order and threshold
    settled, and its held-out Hyvärinen loss, as the estimate makes them (passes over the
    subsample only), to compare with score matching's (all samples; no read). ``None`` (no read)
    when the data are too short for a pilot. Read 2p counts in ``passes.reads``."""
    chains, n, _ = passes.trajectory.shape
    stride = pilot_stride(chains * n)
    if stride is None:
        return None
    rows = passes.trajectory.isel(time=slice(None, None, stride))
    gathered = rows.copy(data=passes(strided_rows_reduction(stride))[0])
    gathered.attrs.update(store=IN_MEMORY, dt=stride * gathered.attrs["dt"])
    subsample = Passes(scatter_trajectory(as_trajectory(gathered), passes.client), passes.client)
    plan = Folds(folds, chains, rows.shape[1])
    fitted = fit_estimators(subsample, density_basis=density_basis, folds=plan).density
    assert fitted is not None
    density, order = settle_index_set(
        subsample, fitted, order, index_set=index_set, max_order=max_order, folds=plan
    )
    ke = choose_kernel_embedding(subsample, density, order, delta)
    losses: FoldLosses = subsample(density_loss_reduction(ke.density, ke.order, ke.delta, plan))[0]
    pick = score_matching.pick
    return Pilot(
        stride,
        int(losses.n.sum()),
        Choice("kernel-embedding", ke.level, math.nan, losses.mean, _stderr(losses.loss)),
        Choice("score-matching", pick.degree, pick.ridge, pick.loss, _stderr(pick.fold_losses)),
        _stderr(losses.loss - pick.fold_losses),
    )


def _stderr(fold_losses: np.ndarray) -> float:
    return float(fold_stderr(fold_losses))


@dataclass(frozen=True)
class Responses:
    """Read-4 results: one :class:`ResponseResult` per score and the kernel embedding's
    held-out loss (when asked)."""

    results: dict[str, ResponseResult]
    density_loss: FoldLosses | None = None
    #: every score's goodness-of-fit check (when asked), by response variable
    goodness_of_fit: dict[str, SteinCheck] | None = None


def extend_score(passes: Passes, score: Any, moments: Moments, stride: int = 1) -> ExtendedScore:
    """Read 3f: ``score`` refitted with random Fourier features beside the affine ones
    (:class:`~kelr_dist.kernels.response.stein_correction.ExtendedScore`, features scaled by the
    data's ``moments``): the neighbour outside a polynomial span that the sensitivity check compares
    the response with; on every ``stride``-th row, as the Gram pass (:func:`gram_stride`)."""
    features = FourierFeatures.draw(moments.mean, moments.std)
    return refit_scores(passes, [(score, features, None)], stride=stride, name="fourier moments")[0]


def refit_scores(
    passes: Passes,
    requests: Sequence[Request],
    folds: Folds | None = None,
    stride: int = 1,
    name: str = "score refits",
) -> list[ExtendedScore]:
    """One read that refits each ``(score, features, fold)`` as ``score + V [z̃, φ]`` (eq. 1 of
    :mod:`~kelr_dist.kernels.response.stein_correction`;
    :func:`~kelr_dist.kernels.scores.refit.refit_reduction`) on every ``stride``-th row, without
    held-out ``fold`` of ``folds`` when it is given, every score evaluated once per block."""
    return passes(refit_reduction(requests, folds, stride, name))[0]


def respond(
    passes: Passes,
    response: Reduction,
    held_out: tuple[KernelEmbeddingChoice, Folds] | None = None,
    check: Reduction | None = None,
) -> Responses:
    """Read 4: the response pass ``response`` (conjugate variables and lagged sums for every
    score, eq. 5, eq. 6, the lag-0 Stein residuals and the affine Stein correction: built by
    :func:`kelr_dist.kernels.response.operator.response_reduction`), with ``held_out`` the
    kernel embedding's held-out loss, and with ``check`` the scores' goodness of fit
    (:func:`~kelr_dist.kernels.scores.stein_check.stein_check_reduction`), in the same read."""
    reductions = [response]
    if held_out is not None:
        choice, folds = held_out
        reductions.append(density_loss_reduction(choice.density, choice.order, choice.delta, folds))
    if check is not None:
        reductions.append(check)
    out = iter(passes(*reductions))
    results = next(out)
    loss = next(out) if held_out is not None else None
    return Responses(results, loss, next(out) if check is not None else None)


def index_set_for(index_set: str) -> IndexSet:
    """The index set of the first fit (``auto`` starts from total degree)."""
    return "total" if index_set == "auto" else index_set  # type: ignore[return-value]


__all__ = [
    "AnyScoreMatching",
    "Fits",
    "KernelEmbeddingChoice",
    "Passes",
    "Pilot",
    "Responses",
    "ScoreMatchingChoice",
    "Survey",
    "check_user_functions",
    "choose_coordinates",
    "choose_kernel_embedding",
    "check_stride",
    "choose_score_matching",
    "correlation_time",
    "declared_periods",
    "extend_score",
    "refit_scores",
    "find_periodic",
    "fit_estimators",
    "open_passes",
    "kde_grid_and_bandwidth",
    "pilot_kernel_embedding",
    "pilot_stride",
    "settle_index_set",
    "respond",
    "score_matching_features",
    "survey_data",
]
