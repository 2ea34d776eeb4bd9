"""The whole estimate: validate the options and compose the steps into ``estimate_response``.

It follows the paper's §4 algorithm, plus a second score estimator and a held-out choice between
them.

``estimate_response`` composes the steps of :mod:`kelr_dist.pipeline.steps`, each one read of the
data:

====  ======================================================  ===================================
read  reductions (sharing the read)                           gives
====  ======================================================  ===================================
1     moments, ``Ā`` (+ mean/covariance for baselines)         basis choice (step 1), centring
1b    Gamma fit (only for Laguerre without θ)                  Laguerre θ and scale
2     coefficient sums and score-matching Gram sums, by fold   ``p_M`` (eq. 39), ``G``, ``b``
      (+ KDE bins)
2p    ``estimator="auto"``, long data: every k-th sample      whether the kernel embedding is
      gathered; the kernel embedding fitted, swept and scored  fitted to all samples (read 2k)
      on it in memory
3     δ/R/η sweep over every order                             order and δ (eqs. 52–54)
4     lagged sums for every score, Stein residuals, the        ``k(lag, i, j)`` with error bars,
      kernel embedding's held-out loss                         the estimator choice
====  ======================================================  ===================================

Read 3 is skipped for ``estimator="score-matching"`` and when the pilot leaves the kernel
embedding out; score matching's degree is chosen from the fold sums of read 2 without a read of
its own. ``estimate_response`` validates its arguments into
:class:`~kelr_dist.pipeline.options.EstimateOptions` once, checks them against the data
(:func:`check_inputs`), settles read 1 (:func:`settle`), builds a :class:`Plan`
(:func:`plan_estimate`) and composes the steps; :func:`conclude` makes the choice, the warnings
and the attributes. The result is an ``xarray.Dataset`` (see
:func:`estimate_response`, assembled by :mod:`kelr_dist.pipeline.result`, which also writes it
and rebuilds ``p_M`` from it).
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import xarray as xr

from kelr_dist import __version__
from kelr_dist.data.store import (
    IN_MEMORY,
    as_trajectory,
    estimate_limits,
    open_trajectory,
    parse_json_attr,
)
from kelr_dist.engine.cluster import client_for
from kelr_dist.engine.passes import keep_in_memory, scatter_trajectory
from kelr_dist.kernels.bases import Coordinate, TensorBasis
from kelr_dist.kernels.basis_spec import format_basis, parse_basis_spec
from kelr_dist.kernels.blocking import fitted_base_block
from kelr_dist.kernels.coordinates import WINDOW_TOLERANCE, Periodicity
from kelr_dist.kernels.density import KernelDensity
from kelr_dist.kernels.distribution import DistributionObservable, PendingDistribution
from kelr_dist.kernels.folds import DEFAULT_FOLDS, Folds
from kelr_dist.kernels.heldout import Choice, candidate_table, used_estimator
from kelr_dist.kernels.quasi_gaussian import SampleMoments, gaussian_score
from kelr_dist.kernels.response import (
    DIFFERENCE_STEP,
    Forcing,
    FunctionScore,
    KDEScore,
    Observable,
    ResponseResult,
    Score,
    observable_mean_reduction,
    relative_to_lag0,
    replicate_stride,
    response_reduction,
)
from kelr_dist.kernels.score_matching import Candidate, PolynomialFeatures, feature_count
from kelr_dist.kernels.stein_correction import (
    FOURIER_COUNT,
    FourierFeatures,
    ObservableFeatures,
    StackedFeatures,
)
from kelr_dist.pipeline.distribution import distribution_attrs, survey_for
from kelr_dist.pipeline.options import Circle, EstimateOptions, Name, checked
from kelr_dist.pipeline.result import assemble_result, json_attr, number_attr
from kelr_dist.pipeline.steps import (
    Fits,
    KernelEmbeddingChoice,
    Passes,
    Pilot,
    Responses,
    ScoreMatchingChoice,
    Survey,
    choose_coordinates,
    choose_kernel_embedding,
    choose_score_matching,
    correlation_time,
    extend_score,
    find_periodic,
    fit_estimators,
    gram_stride,
    index_set_for,
    kde_grid_and_bandwidth,
    kernel_embedding_max_order,
    kernel_embedding_truncation,
    pilot_kernel_embedding,
    pilot_stride,
    refit_scores,
    respond,
    score_matching_features,
    score_matching_truncation,
    settle_index_set,
)

#: the response variables of estimated scores, which get the affine Stein correction
ESTIMATED = ("response_kernel_embedding", "response_score_matching")

#: default largest lag: 2000 rows, at most a twentieth of a chain
DEFAULT_MAX_LAG = 2000
#: largest score-matching Gram matrices (all folds) a requested degree may need
MAX_GRAM_BYTES = 2 * 1024**3
#: a lag-0 Stein residual beyond this many standard errors is reported as a bias
STEIN_TOLERANCE = 3.0
#: ... and so is one before the affine Stein correction (which removes it at lag 0 only) when it
#: is also beyond this fraction of the lag-0 response, which separates accurate kernel
#: embeddings from biased ones on the systems of scripts/accuracy_suite.py (see
#: docs/benchmarks.md, section 'Tuning constants')
RAW_STEIN_FRACTION = 0.1
#: the two families' responses differing by more than this many standard errors of their
#: difference, while their held-out losses are within LOSS_TIE standard errors, is reported
DISAGREEMENT_TOLERANCE = 5.0
LOSS_TIE = 2.0
#: the response moving by more than this many of its total standard errors when the fitted
#: model gets two steps richer (or random Fourier features are added) is reported: the
#: estimate depends on the model more than its error bars say. One error bar is the scale a user
#: reads off the band; a model that follows the score moves by its fit noise only, a small part
#: of it (the accuracy suite's shift/tse column, docs/benchmarks.md 'Tuning constants')
SENSITIVITY_TOLERANCE = 1.0
#: the largest lag may be at most this fraction of a chain (error bars need many blocks of it)
MAX_LAG_FRACTION = 0.25


class BiasWarning(UserWarning):
    """The lag-0 Stein residual of an estimate exceeds its error bars: the estimate is biased
    beyond its standard errors."""


class DisagreementWarning(UserWarning):
    """The two score estimators' responses differ by many standard errors while the held-out
    criterion cannot tell which is better: at least one is biased, and which is not known."""


class EdgeWarning(UserWarning):
    """A component on the line whose density does not vanish at an edge of the data (a wall,
    clipped values): Stein's identity there has a boundary term that the lag-0 self-check and
    the affine correction leave out."""


class ConvergenceWarning(UserWarning):
    """The block-averaging standard errors of some entries of the estimate did not reach their
    plateau (chains short against the correlation time): those error bars are too small."""


class TruncationWarning(UserWarning):
    """The chosen order or degree is the largest the budget allowed and the held-out loss was
    still falling there: the estimate is limited by the budget, not by the data."""


class SensitivityWarning(UserWarning):
    """The response moves by more than its error bars when the fitted score model gets one step
    richer: the estimate is limited by the model (a score the basis does not follow), a bias
    that neither the held-out loss nor the error bars see."""


class NonFiniteWarning(UserWarning):
    """The kernel-embedding density was not finite on some samples (counted apart from the
    low-density rejections)."""


def _emit(category: type[Warning], message: str, record: list[str] | None) -> None:
    """Warn with ``message`` (one line) and add ``"Category: message"`` to ``record``, which the
    result keeps in ``attrs["warnings"]``."""
    warnings.warn(message, category, stacklevel=5)
    if record is not None:
        record.append(f"{category.__name__}: {message}")


def _column_names(table: Any, ndim: int) -> list[str] | None:
    """Component names of a pandas ``DataFrame`` (its columns) or named ``Series``; None for
    other array-likes and for a DataFrame's default columns ``0, 1, ...``, which get
    ``x1, x2, ...`` as every unnamed component does (:mod:`kelr_dist.data.store`)."""
    columns = getattr(table, "columns", None) if ndim == 2 else None
    if columns is not None:
        if list(columns) == list(range(len(columns))):
            return None
        return [str(c) for c in columns]
    name = getattr(table, "name", None) if ndim == 1 else None
    return None if name is None else [str(name)]


def _open(trajectory: Any, variable: str, dt: float | None) -> xr.DataArray:
    """The trajectory as a validated ``(chain, time, component)`` DataArray: a store path, an
    xarray object in the store layout, or an array-like (numpy array, list) of shape
    ``(time,)`` (one component), ``(time, component)`` or ``(chain, time, component)``; an
    array without ``dt`` gets ``dt = 1`` in ``time_units = "steps"``."""
    if isinstance(trajectory, str | os.PathLike):
        return open_trajectory(trajectory, variable, dt=dt)
    if not isinstance(trajectory, xr.Dataset | xr.DataArray):
        array = np.asarray(trajectory)
        if array.ndim not in (1, 2, 3):
            raise ValueError(
                f"trajectory: an array of shape {array.shape} ({type(trajectory).__name__}); "
                "expected (time,) for one component, (time, component) or (chain, time, "
                "component), or a store path or an xarray object in the store layout"
            )
        names = _column_names(trajectory, array.ndim)
        array = array[:, np.newaxis] if array.ndim == 1 else array
        dims = ("time", "component") if array.ndim == 2 else ("chain", "time", "component")
        # without dt the lags are counted in samples, and the result says so
        attrs = {"dt": 1.0, "time_units": "steps"} if dt is None else {}
        coords = {} if names is None else {"component": names}
        trajectory = xr.DataArray(array, dims=dims, coords=coords, attrs=attrs)
    return as_trajectory(trajectory, variable, dt=dt)


#: an unknown component's message lists at most this many of the available ones
SHOWN_COMPONENTS = 20


def _select(traj: xr.DataArray, components: Sequence[str] | None, name: Name = str) -> xr.DataArray:
    """The ``components`` of ``traj`` (all when None), in the order given (lazily: a store's
    blocks are still read whole, the other components dropped per block)."""
    if components is None:
        return traj
    available = [str(c) for c in traj["component"].values]
    unknown = [c for c in components if c not in available]
    if unknown:
        shown = ", ".join(available[:SHOWN_COMPONENTS])
        more = f", ... ({len(available)} in all)" if len(available) > SHOWN_COMPONENTS else ""
        raise ValueError(
            f"{name('components')}: {', '.join(map(repr, unknown))} not in the trajectory "
            f"{traj.attrs.get('store', IN_MEMORY)!r}; available: {shown}{more}"
        )
    return traj.sel(component=list(components))


def check_max_time(max_time: float | None, dt: float, source: str, name: Name = str) -> None:
    """Refuse a ``max_time`` shorter than the sample interval ``dt`` of the trajectory
    ``source`` (but not 0, which asks for lag 0 alone): it is rounded to whole lags, and would
    leave no lag beyond 0. (The CLI calls it before a cluster starts.)"""
    if max_time is not None and 0 < max_time < dt:
        raise ValueError(
            f"{name('max_time')}={max_time:g} is shorter than the sample interval dt={dt:g} "
            f"of {source!r}: lags are whole multiples of dt, so no lag beyond 0 would be "
            f"estimated; give {name('max_time')}={dt:g} or more (or 0 for lag 0 alone)"
        )


def _max_lag(options: EstimateOptions, dt: float, n: int, source: str, name: Name = str) -> int:
    """The largest lag in rows: given, from ``max_time`` (:func:`check_max_time`), or the
    default; at most a quarter of a chain."""
    max_lag = options.max_lag
    if options.max_time is not None:
        check_max_time(options.max_time, dt, source, name)
        # the lags up to max_time, not past it (a ratio a rounding below a whole number counts)
        ratio = options.max_time / dt
        max_lag = math.floor(ratio + 1e-9 * max(1.0, ratio))
    elif max_lag is None:
        max_lag = min(DEFAULT_MAX_LAG, max(1, n // 20))
    if max_lag > MAX_LAG_FRACTION * n:
        given = (
            f"{name('max_lag')}={max_lag} is"
            if options.max_time is None
            else f"{name('max_time')}={options.max_time:g} gives lag {max_lag},"
        )
        raise ValueError(
            f"{given} more than a quarter of the chain length {n}: the lagged means and their "
            "error bars need chains several times longer than the largest lag"
        )
    return max_lag


def _check_shape(traj: xr.DataArray, n: int, d: int) -> None:
    """Refuse data that cannot give a response (:func:`kelr_dist.data.store.estimate_limits`:
    too many components, e.g. a transposed array, or too short chains)."""
    problems = estimate_limits(n, d)
    if problems:
        source = traj.attrs.get("store", IN_MEMORY)
        raise ValueError(f"trajectory {source!r} has {'; and '.join(problems)}")


def _orders(options: EstimateOptions, d: int) -> tuple[Any, Any]:
    """(fitted order of the basis, user order or None for automatic)."""
    chosen = None if options.order == "auto" else options.order
    fitted: Any = options.max_order
    if fitted is None:  # (an order above a given max_order is refused by the model)
        fitted = chosen if chosen is not None else kernel_embedding_max_order(d)
    return fitted, chosen


def _degree(options: EstimateOptions, d: int, name: Name = str) -> int | None:
    """The requested score-matching degree (None: automatic); refuses one whose Gram matrices
    would not fit in memory, naming the bytes."""
    if options.degree == "auto":
        return None
    degree = int(options.degree)
    size = feature_count(d, degree + 1)  # its neighbour's features are fitted too
    nbytes = 8 * size * size * (options.folds + 1)
    if nbytes > MAX_GRAM_BYTES:
        raise ValueError(
            f"{name('degree')}={degree} gives {size} features in d = {d} (with the degree above, "
            "its neighbour): its Gram matrices need "
            f"{nbytes / 2**30:.1f} GiB (limit {MAX_GRAM_BYTES / 2**30:.0f} GiB); choose a "
            "smaller degree"
        )
    return degree


def _exact_score(
    trajectory: xr.DataArray, score: Callable | None, name: Name = str
) -> Callable | None:
    if score is not None:
        return score
    from kelr_dist.models.registry import make_model

    attrs = trajectory.attrs
    if "model" not in attrs:
        raise ValueError(
            f"{name('exact')}: the exact response needs the store's model (attribute 'model', "
            f"missing in "
            f"{attrs.get('store', 'the trajectory')!r}) or its score function: "
            f"{name('score')}='package.module:function' (a callable in Python)"
        )
    params = attrs.get("model_params", "{}")
    model = make_model(
        attrs["model"],
        **(parse_json_attr(params, "model_params") if isinstance(params, str) else params),
    )
    return model.score


@dataclass(frozen=True)
class Inputs:
    """The checked inputs of an estimate (:func:`check_inputs`)."""

    trajectory: xr.DataArray  #: validated, ``(chain, time, component)``
    max_lag: int  #: largest lag in rows
    fitted: Any  #: order of the fitted kernel-embedding basis
    order: Any  #: the user's order, None for automatic
    degree: int | None  #: the user's score-matching degree, None for automatic
    folds: Folds  #: the held-out folds
    exact: Callable | None  #: the exact score, when asked for
    observable: Observable | PendingDistribution  #: a distribution's grid comes from the data
    forcing: Forcing


def check_inputs(
    trajectory: Any, options: EstimateOptions, dt: float | None = None, name: Name = str
) -> Inputs:
    """Open the ``trajectory`` (as :func:`estimate_response` takes it), select its
    ``options.components``, and make every check of
    ``options`` against it that needs its metadata but not its values: limits, the largest
    lag, a degree's memory, the KDE's dimension, folds, the basis spec, the exact score, the
    observable and forcing. (``kelr estimate``/``kelr run`` call it before a cluster starts.)

    Raises
    ------
    ValueError
        naming the option as ``name`` gives it (``max_lag``, ``--max-lag``, ``lags.max_lag``)
        and what is wrong (:class:`~kelr_dist.data.store.TrajectoryError` for the trajectory
        itself).
    """
    array = not isinstance(trajectory, str | os.PathLike | xr.Dataset | xr.DataArray)
    if array and dt is None and options.max_time is not None:
        raise ValueError(
            f"{name('max_time')}={options.max_time:g} given for an array without dt: its lags "
            f"would count samples, not time; give dt= (the sample interval) or "
            f"{name('max_lag')} (in samples)"
        )
    traj = _select(_open(trajectory, options.variable, dt), options.components, name)
    chains, n, d = traj.shape
    components = [str(c) for c in traj["component"].values]
    step = float(traj.attrs["dt"])
    _check_shape(traj, n, d)
    lag = _max_lag(options, step, n, str(traj.attrs.get("store", IN_MEMORY)), name)
    fitted, chosen = _orders(options, d)
    sm_degree = _degree(options, d, name)
    if options.kde and d > 3:
        raise ValueError(
            f"{name('kde')}: the Gaussian-KDE baseline supports d <= 3, the data have {d}"
        )
    # folds: score matching's held-out choice and the kernel embedding's order floor
    fold_plan = Folds(options.folds, chains, n)
    parse_basis_spec(options.basis, d)  # fail on a bad spec before any pass
    exact_fn = _exact_score(traj, options.score, name) if (options.exact or options.score) else None
    observable = options.observable_for(components)
    forcing = options.forcing_for(components)
    if len(forcing.names) != d:
        raise ValueError(f"forcing has {len(forcing.names)} components, the trajectory {d}")
    return Inputs(traj, lag, fitted, chosen, sm_degree, fold_plan, exact_fn, observable, forcing)


def estimate_response(
    trajectory: Any,
    *,
    variable: str = "x",
    components: Sequence[str] | str | None = None,
    estimator: str = "auto",
    basis: str | Sequence[Any] = "auto",
    order: Any = "auto",
    max_order: Any = None,
    index_set: str = "auto",
    degree: Any = "auto",
    folds: int = DEFAULT_FOLDS,
    max_lag: int | None = None,
    max_time: float | None = None,
    delta: str | float = "auto",
    observable: Observable | None = None,
    forcing: Forcing | Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
    exact: bool = False,
    score: Callable[[np.ndarray], np.ndarray] | None = None,
    kde: bool = False,
    gaussian: bool = False,
    stein_correction: bool = True,
    pilot: bool = True,
    client: Any = None,
    n_workers: int | None = None,
    memory_limit: Any = None,
    progress: bool | None = None,
    dt: float | None = None,
) -> xr.Dataset:
    """Linear response ``k(lag, i, j)`` of a trajectory (eq. 5, eq. 6).

    Parameters
    ----------
    trajectory : a store path, an xarray ``Dataset``/``DataArray`` in the store layout (one
        opened from a netCDF or other non-zarr file is read through the object), or a numpy
        array ``(n, d)`` / ``(chains, n, d)`` or pandas DataFrame (sample interval ``dt``,
        default 1 in ``time_units = "steps"``, when ``max_time`` is not given). Unnamed
        components are ``x1, x2, ...`` by every route.
    variable : the trajectory variable of a store/Dataset.
    components : estimate on these components only, by name (a list, or ``"x1,x3"``), in the
        order given; ``None``: all (``kelr estimate --components``).
    estimator : the score estimate: ``"kernel-embedding"`` (the paper's ``∇ log p_M``),
        ``"score-matching"`` (Hyvärinen 2005, :mod:`kelr_dist.kernels.score_matching`) or
        ``"auto"``:
        both, and the one with the smaller held-out Hyvärinen loss
    (:mod:`kelr_dist.kernels.heldout`).
    basis : ``"auto"`` or a per-coordinate spec, e.g. ``"laguerre(theta=1),hermite"``
        (:func:`kelr_dist.kernels.basis_spec.parse_basis_spec`), or a list of coordinates; both
        estimators
        use its coordinate families and affine maps.
    order : kernel embedding: ``"auto"`` (criteria of §4), an order ``M`` or a box tuple.
    max_order : highest order fitted and scanned (default: the budget of
        :func:`kelr_dist.pipeline.steps.kernel_embedding_max_order`).
    index_set : ``"total"`` (``|m|_1 ≤ M``), ``"box"`` (``m_k ≤ M_k``) or ``"auto"``: total
        degree unless at most one coordinate carries structure beyond its weight
        (:func:`kelr_dist.kernels.selection.active_coordinates`), then a box with order 0 on the
        others,
        as in the paper's Langevin example; ``"adaptive"``: that for the kernel embedding, and
        score matching's index set grown by held-out loss in a dictionary of higher
        single-coordinate and pairwise degrees
        (:func:`kelr_dist.kernels.adaptive_index.grow`; attributes
        ``score_matching_features``, ``score_matching_max_degrees``).
    degree : score matching: ``"auto"`` (held-out loss over degrees ``1..q_max`` of
        :func:`kelr_dist.pipeline.steps.score_matching_max_degree`) or a total degree ``q``.
    folds : held-out folds (whole chains, or contiguous blocks of each chain).
    max_lag, max_time : largest lag in rows or in time units (one of them).
    delta : ``"auto"`` (error-tied threshold, :func:`kelr_dist.kernels.selection.choose_delta`),
        ``"paper"`` (``δ_M`` of eq. 52) or a number, in standardized units (the density of
        ``(x - loc) / scale``).
    observable, forcing : ``A`` and ``c`` (default identity and constant forcing): objects, or
        names and references as in a job file; a forcing may also be a function
        ``x (n, d) -> (c, ∂_i c_i)``, each ``(n, d)``. ``A`` enters centred (covariance form,
        :mod:`kelr_dist.kernels.response`).
        The distribution observables ``"pdf"``, ``"moments"``, ``"exceedance"`` (with
        parameters, :mod:`kelr_dist.kernels.distribution`) take their grid from the data;
        :func:`kelr_dist.edges.distribution.distribution_response` labels their responses.
    exact : also the exact-FDT response with the model's score (built-in models know it from the
        store's attributes); ``score`` gives a score function ``X (n, d) -> ∇ log p (n, d)``, a
        callable or ``"package.module:function"`` (imported, never evaluated).
    kde, gaussian : also the Gaussian-KDE (d ≤ 3) and quasi-Gaussian baselines (§5).
    stein_correction : refit the estimated scores (kernel embedding, score matching; not the
        baselines) by the affine Stein correction
        (:mod:`kelr_dist.kernels.stein_correction`), in the response read, or, for a
        distribution observable, on the observable's own functions too, in one read before it
        (:func:`refit_on_observable`); ``False`` gives the uncorrected estimators (the paper's
        own ``B̂``).
    pilot : with ``estimator="auto"`` on at least 250 000 samples, fit the kernel embedding to
        a strided subsample first, and to all samples only when its held-out loss there can
        still win (:func:`~kelr_dist.pipeline.steps.pilot_kernel_embedding`); ``False`` fits
        both families to all samples.
    client : a ``distributed.Client``, a scheduler address, ``None`` (the embedded
        ``LocalCluster``) or ``"synchronous"`` (no cluster: the same passes in this process).
    n_workers, memory_limit : size of the embedded cluster.
    progress : progress bars (``None``: when stderr is a terminal).

    Returns
    -------
    xarray.Dataset
        ``response(lag, i, j)`` and ``response_stderr`` from the chosen estimator
        (``attrs["estimator"]``); with ``estimator="auto"`` the other one as
        ``response_kernel_embedding`` or ``response_score_matching``;
        ``response_exact``/``_kde``/``_gaussian`` (+ ``_stderr``) when asked; for every response
        the lag-0 Stein residual ``stein_residual[_suffix](i, j)`` and its ``_stderr`` (for a
        corrected estimate also ``..._uncorrected``: the size of the correction); the
        held-out candidates on ``candidate``; the kernel embedding's criteria on ``order`` and
        coefficients on ``basis_function``; the run's choices in ``attrs``.

    Warns
    -----
    BiasWarning
        when the chosen estimate's Stein residual exceeds 3 total standard errors.
    DisagreementWarning
        (``estimator="auto"``) when the two families' responses differ by more than 5 standard
        errors of their difference (attribute ``estimator_disagreement``) while their held-out
        losses are within 2 standard errors of each other.
    TruncationWarning
        when the chosen degree or order is the largest the budget allowed and the held-out loss
        was still falling there.
    SensitivityWarning
        when the response moves by more than one total standard error as the chosen model gets
        two steps richer, or (score matching) is refitted with random Fourier features
        (:func:`~kelr_dist.pipeline.steps.extend_score`; ``response_model_shift``, attributes
        ``model_sensitivity``, ``model_neighbour``).
    ConvergenceWarning
        when the block averaging of some entries of the chosen estimate reached no plateau
        (``response_converged`` False; per-entry block sizes in ``response_block_size``).
    """
    started = time.perf_counter()
    options = checked(
        EstimateOptions,
        dict(
            variable=variable, components=components, estimator=estimator, basis=basis,
            order=order, max_order=max_order, index_set=index_set, degree=degree, folds=folds,
            max_lag=max_lag, max_time=max_time, delta=delta, observable=observable,
            forcing=forcing, exact=exact, score=score, kde=kde, gaussian=gaussian,
            stein_correction=stein_correction, pilot=pilot,
        ),
    )  # fmt: skip
    inputs = check_inputs(trajectory, options, dt)
    # a client made here from an address is closed at the end (also on an error)
    with client_for(client, n_workers=n_workers, memory_limit=memory_limit, quiet=True) as run_on:
        # in-memory input goes to the workers once, and a store that fits in the workers' memory
        # is read once for all passes
        kept, in_memory = keep_in_memory(scatter_trajectory(inputs.trajectory, run_on), run_on)
        passes = Passes(kept, run_on, progress, in_memory)
        setting = settle(passes, options, inputs)
        plan = plan_estimate(passes, options, inputs, setting)
        fits = fit_estimators(
            passes,
            density_basis=None if plan.pilot else plan.density_basis,
            features=plan.features,
            folds=inputs.folds,
            kde_grid=plan.kde_grid,
            correlation=plan.correlation,
        )
        sm = (
            None
            if fits.gram is None
            else choose_score_matching(fits.gram, inputs.degree, plan.adaptive)
        )
        ke, piloted = kernel_embedding(passes, options, inputs, plan, fits.density, sm)
        scores, replicates, neighbours, unrefitted = response_scores(
            passes, inputs, setting, plan, (ke, sm, fits)
        )
        response = response_reduction(
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
            base_block=fitted_base_block(inputs.max_lag, *inputs.trajectory.shape[:2]),
            unrefitted=unrefitted,
            replicate_stride=replicate_stride(math.prod(inputs.trajectory.shape[:2])),
        )
        out = respond(passes, response, None if ke is None or sm is None else (ke, inputs.folds))
    return conclude(options, inputs, setting, plan, passes, (ke, sm, piloted), out, started)


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


def settle(passes: Passes, options: EstimateOptions, inputs: Inputs) -> Setting:
    """Read 1 (moments, ``Ā``; :func:`~kelr_dist.pipeline.steps.survey_data`), the periodic
    components, the :class:`EdgeWarning` of hard edges, the basis (read 1b when a Laguerre θ comes
    from the data) and the observable on the circle (one light read for angles)."""
    covariance = options.kde or options.gaussian
    survey, observable = survey_for(passes, inputs.observable, covariance=covariance)
    periodic = find_periodic(passes, survey, options.basis)
    _warn_edges(survey, periodic, [str(c) for c in passes.trajectory["component"].values])
    coordinates = choose_coordinates(passes, survey, options.basis, periodic)
    observable, centre, periods = _on_the_circle(passes, options, survey, periodic, observable)
    return Setting(survey, periodic, coordinates, observable, centre, periods)


@dataclass(frozen=True)
class Plan:
    """What an estimate fits and adds (:func:`plan_estimate`): the kernel embedding's first basis
    and score matching's features (``None``: that family is not fitted), the index-set rule
    (``"auto"`` resolves after the fit), the baselines, the affine correction, and whether a
    pilot decides if the kernel embedding is carried past its fit."""

    density_basis: TensorBasis | None
    features: PolynomialFeatures | None
    index_set: str
    adaptive: bool  #: score matching's index set grown by held-out loss in ``features``
    correlation: float | None  #: the rows' correlation time, which thins the adaptive Gram pass
    kde_grid: tuple[Any, np.ndarray] | None
    exact: Callable | None
    gaussian: SampleMoments | None
    corrected: bool
    pilot: bool  #: whether the kernel embedding is first fitted to a subsample (a pilot)
    #: the Stein correction is a refit on the observable's own functions (a distribution's
    #: bins, powers or exceedances, outside the affine span): :func:`refit_on_observable`
    refit: bool = False

    @property
    def affine(self) -> bool:
        """Whether the estimated scores get the affine Stein correction in the response read."""
        return self.corrected and not self.refit

    def scores(
        self,
        ke: KernelEmbeddingChoice | None,
        sm: ScoreMatchingChoice | None,
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


#: the scores of a response read by response variable, their refits without each fold, their
#: neighbouring models (:meth:`Plan.scores`)
Scores = tuple[dict[str, Score], dict[str, tuple[Score, ...]], dict[str, tuple[Score, ...]]]


def response_scores(
    passes: Passes,
    inputs: Inputs,
    setting: Setting,
    plan: Plan,
    fitted: tuple[KernelEmbeddingChoice | None, ScoreMatchingChoice | None, Fits],
) -> tuple[dict[str, Score], dict[str, tuple[Score, ...]], dict[str, tuple[Score, ...]], dict]:
    """The scores of the response read (:meth:`Plan.scores`), after read 3f (score matching
    refitted with random Fourier features, its neighbour outside a polynomial span) or, for a
    distribution observable, read 3r (:func:`refit_on_observable`, which fits that neighbour
    too); with the estimates before read 3r (empty without it)."""
    ke, sm, fits = fitted
    extended = None
    fourier = sm is not None and plan.features is not None and setting.periods is None
    if fourier and not plan.refit:
        assert sm is not None and plan.features is not None
        n_samples = math.prod(inputs.trajectory.shape[:2])
        stride = gram_stride(n_samples, plan.features.size, plan.correlation)
        extended = extend_score(passes, sm.model, setting.survey.moments, stride)
    found = plan.scores(ke, sm, fits, extended)
    if not plan.refit:
        return (*found, {})
    fourier_base = sm.model if fourier and sm is not None else None
    return refit_on_observable(passes, setting, found, inputs.folds, fourier_base)


def refit_on_observable(
    passes: Passes,
    setting: Setting,
    fitted: Scores,
    folds: Folds,
    fourier_base: Score | None = None,
) -> tuple[dict[str, Score], dict[str, tuple[Score, ...]], dict[str, tuple[Score, ...]], dict]:
    """Read 3r: every estimated score of ``fitted`` (scores, their refits without each fold,
    their neighbouring models) refitted on the affine features and the observable's own
    functions (:class:`~kelr_dist.kernels.stein_correction.ObservableFeatures`; a refit without
    fold ``f`` of ``folds`` on the other folds' rows), so that for a constant forcing the
    response of each column of ``A`` has its exact lag-0 value; with
    ``fourier_base`` (score matching), that score refitted on random Fourier features beside
    them becomes one more neighbour of it (the sensitivity check outside a polynomial span).
    Returns the refitted scores, refits and neighbours, and the estimates before the refit,
    whose lag-0 Stein residuals stay the evidence of their bias."""
    scores, replicates, neighbours = fitted
    moments = setting.survey.moments
    features = ObservableFeatures(
        setting.observable, moments.mean, moments.std, DIFFERENCE_STEP * moments.std
    )
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


def plan_estimate(
    passes: Passes, options: EstimateOptions, inputs: Inputs, setting: Setting
) -> Plan:
    """The families to fit, their bases, the baselines. With ``estimator="auto"`` on long data a
    pilot (:func:`~kelr_dist.pipeline.steps.pilot_kernel_embedding`, reads of a subsample after
    read 2) decides whether the kernel embedding can still win; read 2 then fits score matching
    alone, and the kernel embedding is fitted to all samples (read 2k) only if it can."""
    # "adaptive" grows score matching's index set; the kernel embedding's is then "auto"
    adaptive = options.index_set == "adaptive"
    index_set = "auto" if adaptive else options.index_set
    if index_set == "auto" and isinstance(inputs.order, tuple):
        index_set = "box"
    basis = features = None
    if options.estimator in ("auto", "kernel-embedding"):
        basis = TensorBasis(setting.coordinates, inputs.fitted, index_set_for(index_set))
    if options.estimator in ("auto", "score-matching"):
        features = score_matching_features(setting.coordinates, inputs.degree, adaptive)
    sample = setting.survey.sample
    return Plan(
        density_basis=basis,
        features=features,
        index_set=index_set,
        adaptive=adaptive,
        correlation=correlation_time(setting.survey) if adaptive else None,
        kde_grid=kde_grid_and_bandwidth(sample) if options.kde and sample is not None else None,
        exact=inputs.exact,
        gaussian=sample if options.gaussian else None,
        corrected=options.stein_correction,
        # on a circle the bins at the wrap are not periodic: no Stein identity to enforce
        refit=options.stein_correction
        and isinstance(setting.observable, DistributionObservable)
        and setting.periods is None,
        pilot=options.pilot
        and options.estimator == "auto"
        and pilot_stride(math.prod(passes.trajectory.shape[:2])) is not None,
    )


def kernel_embedding(
    passes: Passes,
    options: EstimateOptions,
    inputs: Inputs,
    plan: Plan,
    density: KernelDensity | None,
    sm: ScoreMatchingChoice | None,
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


def conclude(
    options: EstimateOptions,
    inputs: Inputs,
    setting: Setting,
    plan: Plan,
    passes: Passes,
    fitted: tuple[KernelEmbeddingChoice | None, ScoreMatchingChoice | None, Pilot | None],
    out: Responses,
    started: float,
) -> xr.Dataset:
    """The result of the response read: the held-out choice between the families, the warnings
    (:class:`TruncationWarning`, :class:`BiasWarning`, :class:`DisagreementWarning`,
    :class:`ConvergenceWarning`, :class:`NonFiniteWarning`, each also a line of
    ``attrs["warnings"]``), the run's attributes, and the labelled Dataset."""
    traj = inputs.trajectory
    chains, n, _ = traj.shape
    ke, sm, pilot = fitted
    candidates = candidate_table(
        options.estimator,
        None if ke is None else (ke.level, out.density_loss),
        sm.candidates if sm is not None else [],
        sm.pick if sm is not None else None,
    )
    used = used_estimator(candidates)
    responses = dict(out.results)
    responses["response"] = responses.pop(f"response_{used.replace('-', '_')}")
    main = responses["response"]
    raised: list[str] = []
    if pilot is not None and pilot.skips_kernel_embedding:
        raised.append(f"Pilot: {pilot.decision}")
    truncation = (
        kernel_embedding_truncation(ke, chains * n)
        if used == "kernel-embedding" and ke is not None
        else score_matching_truncation(sm, chains * n)
        if used == "score-matching" and sm is not None and inputs.degree is None
        else None
    )
    if truncation is not None:
        _emit(TruncationWarning, truncation.message, raised)
    _warn_bias(main, raised)
    disagreement = _warn_disagreement(
        responses, candidates, sm.pick if sm is not None else None, raised
    )
    chosen = ke if used == "kernel-embedding" else sm if used == "score-matching" else None
    steps = [] if chosen is None or chosen.neighbours is None else [chosen.neighbours[1]]
    if used == "score-matching" and setting.periods is None:  # extend_score ran
        steps.append(f"+ {FOURIER_COUNT} random Fourier features")
    neighbour = "; ".join(steps) or None
    sensitivity = _warn_sensitivity(main, neighbour, used, raised)
    _warn_unconverged(main, raised)
    if main.nonfinite:
        _emit(
            NonFiniteWarning,
            f"the {used} score was not finite on {main.nonfinite} of {main.n} samples; they get "
            "B = 0 like the low-density rejections and are counted apart "
            "(attribute nonfinite_rejection)",
            raised,
        )

    attrs: dict[str, Any] = {
        "estimator": used,
        "estimator_selection": options.estimator,
        "folds": int(options.folds),
        "replicate_stride": replicate_stride(chains * n),
        "n_samples": int(chains * n),
        "chains": int(chains),
        "chain_length": int(n),
        "dt": float(traj.attrs["dt"]),
        "max_lag": inputs.max_lag,
        "basis": format_basis(setting.coordinates),
        "rejection": main.rejection,
        "nonfinite_rejection": main.nonfinite_rejection,
        "warnings": "\n".join(raised),
        "stein_correction": (
            "observable" if plan.refit else "affine" if options.stein_correction else "none"
        ),
        **options.function_names(),
        **distribution_attrs(setting.observable),
        "passes": passes.reads,
        "store_reads": passes.store_reads,
        "chunking": [int(c) for c in traj.chunks[1]] if traj.chunks else [int(n)],
        "store": str(traj.attrs.get("store", IN_MEMORY)),
        "variable": str(traj.name),
        "kelr_dist_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        **{k: json_attr(traj.attrs[k]) for k in ("model", "model_params") if k in traj.attrs},
    }
    if ke is not None:
        attrs.update(
            order=number_attr(ke.order),
            order_selection=ke.order_selection,
            max_order=number_attr(ke.density.basis.order),
            index_set=ke.density.basis.index_set,
            delta=ke.delta,
            delta_rule=ke.delta_rule,
        )
    if sm is not None:
        assert plan.features is not None
        attrs.update(
            degree=sm.degree,
            ridge=sm.ridge,
            max_degree=plan.features.degree,
            gram_stride=gram_stride(chains * n, plan.features.size, plan.correlation),
            gram_condition=sm.condition,
            score_matching_index_set=sm.index_set,
            score_matching_features=int(sm.model.features.size),
            score_matching_max_degrees=list(sm.model.features.max_degrees),
        )
    if pilot is not None:
        attrs.update(pilot.attrs())
    if disagreement is not None:
        attrs["estimator_disagreement"] = disagreement
    if sensitivity is not None:
        attrs.update(model_sensitivity=sensitivity, model_neighbour=neighbour)
    if setting.periods is not None:
        attrs["periodic"] = periodic_attr(traj, setting.periodic)
    attrs["runtime_seconds"] = time.perf_counter() - started
    return assemble_result(
        responses=responses,
        ke=ke,
        candidates=candidates,
        used=used,
        trajectory=traj,
        observable=setting.observable,
        forcing=inputs.forcing,
        attrs=attrs,
    )


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
    if isinstance(on_circle, PendingDistribution):  # settled on the data's grid by the survey
        return observable, survey.centre, periods
    if on_circle.names == observable.names:
        return on_circle, survey.centre, periods
    return on_circle, passes(observable_mean_reduction(on_circle))[0], periods


def _warn_edges(survey: Survey, periodic: list[Periodicity | None], names: list[str]) -> None:
    """One-line :class:`EdgeWarning` per component on the line with a hard edge
    (:meth:`kelr_dist.kernels.moments.EdgeStatistics.hard`)."""
    if survey.edges is None:
        return
    for k, (lower, upper) in enumerate(survey.edges.hard()):
        if periodic[k] is None and (lower or upper):
            where = " and ".join(
                f"{side} edge {value:.6g}"
                for side, value, hard in (
                    ("lower", survey.moments.minimum[k], lower),
                    ("upper", survey.moments.maximum[k], upper),
                )
                if hard
            )
            warnings.warn(
                f"component {names[k]!r}: its density does not vanish at its {where} (a wall or "
                "clipped data): the lag-0 Stein check and the affine Stein correction assume it "
                "does, so they do not hold there (declare it periodic if it is an angle)",
                EdgeWarning,
                stacklevel=4,
            )


def periodic_attr(trajectory: xr.DataArray, periodic: list[Periodicity | None]) -> str:
    """The result's ``periodic`` attribute: JSON ``{component: {period, wrap, reason}}``."""
    names = [str(c) for c in trajectory["component"].values]
    return json.dumps(
        {
            name: {"period": p.period, "wrap": p.loc, "reason": p.reason}
            for name, p in zip(names, periodic, strict=True)
            if p is not None
        }
    )


def _worst_ratio(residual: np.ndarray, stderr: np.ndarray) -> tuple[tuple[int, ...], float]:
    """The entry ``(i, j)`` with the largest finite ``|residual| / stderr``, and that ratio
    (``-1`` when none is finite)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.abs(residual) / stderr
    ratio = np.where(np.isfinite(ratio), ratio, -1.0)
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    return tuple(int(v) for v in worst), float(ratio[worst])


def _warn_bias(result: ResponseResult, record: list[str] | None = None) -> None:
    """One-line :class:`BiasWarning` when the lag-0 Stein residual exceeds its total error bars
    (sampling and the fitted score's variance), or, for an estimate with the affine Stein
    correction, when the residual before it did (beyond :data:`STEIN_TOLERANCE` total standard
    errors and :data:`RAW_STEIN_FRACTION` of ``k(0)``). For ``A`` affine in ``x`` and a constant
    forcing the corrected residual is 0 by construction, so the uncorrected one is then the only
    lag-0 evidence about the score estimate."""
    entry, ratio = _worst_ratio(result.stein_residual, result.stein_total_stderr)
    if ratio > STEIN_TOLERANCE:
        _emit(
            BiasWarning,
            f"lag-0 Stein residual {result.stein_residual[entry]:+.3g} at (i, j) = {entry} is "
            f"{ratio:.1f} total standard errors: the estimate is biased beyond its error bars",
            record,
        )
        return
    raw, raw_stderr = result.uncorrected_stein_residual, result.uncorrected_stein_total_stderr
    if raw is None or raw_stderr is None:
        return
    shares = relative_to_lag0(raw, result.mean[0], result.stderr[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.abs(raw) / raw_stderr
    flagged = (ratios > STEIN_TOLERANCE) & (shares > RAW_STEIN_FRACTION)
    if flagged.any():
        worst = np.unravel_index(int(np.argmax(np.where(flagged, shares, -1.0))), shares.shape)
        entry = tuple(int(v) for v in worst)
        _emit(
            BiasWarning,
            f"before the Stein correction the lag-0 Stein residual at (i, j) = "
            f"{entry} was {shares[entry]:.0%} of k(0) "
            f"({ratios[entry]:.1f} total standard errors): the score estimate is "
            "poor; the correction removes that bias at lag 0 only, later lags may keep part of "
            "it (compare estimator='score-matching' / 'kernel-embedding', or use more data)",
            record,
        )


def _warn_disagreement(
    responses: dict[str, ResponseResult],
    rows: list[Choice],
    pick: Candidate | None,
    record: list[str] | None = None,
) -> float | None:
    """The largest ``|k̂_KE - k̂_SM|`` over lags and entries in standard errors of the difference
    (``None`` unless both families ran; ``pick`` is score matching's own choice); a one-line
    :class:`DisagreementWarning` when it exceeds :data:`DISAGREEMENT_TOLERANCE` while the
    held-out losses are within :data:`LOSS_TIE` standard errors. Standard errors are added in
    quadrature, which overstates the spread of a difference of two estimates from the same
    samples: the check errs towards silence."""
    if pick is None or not rows or rows[0].estimator != "kernel-embedding":
        return None
    ke = rows[0]
    sm = next(
        r
        for r in rows
        if r.estimator == "score-matching" and r.order == pick.degree and r.ridge == pick.ridge
    )
    used, rival = (ke, sm) if ke.chosen else (sm, ke)
    other = responses[f"response_{rival.estimator.replace('-', '_')}"]
    main = responses["response"]
    difference = np.abs(main.mean - other.mean)
    spread = np.hypot(main.stderr, other.stderr)
    # equal entries with no spread agree; a response that is not finite where the other is
    # (or where both are not) is as far apart as can be
    z = np.divide(difference, spread, out=np.where(difference > 0, np.inf, 0.0), where=spread > 0)
    z = np.where(np.isnan(difference), np.inf, z)
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = abs(used.loss - rival.loss) / float(np.hypot(used.loss_stderr, rival.loss_stderr))
    worst = float(z.max())
    if worst > DISAGREEMENT_TOLERANCE and not gap > LOSS_TIE:
        lag, i, j = (int(v) for v in np.unravel_index(int(np.argmax(z)), z.shape))
        _emit(
            DisagreementWarning,
            f"the kernel-embedding and score-matching responses differ by {worst:.1f} standard "
            f"errors (lag {lag}, entry ({i}, {j})) while their held-out losses are only "
            f"{gap:.1f} standard errors apart: one of them is biased and the held-out choice "
            f"({used.estimator}) is not decisive; compare response_kernel_embedding with "
            "response_score_matching, or use more data",
            record,
        )
    return worst


def _warn_sensitivity(
    result: ResponseResult, neighbour: str | None, used: str, record: list[str] | None = None
) -> float | None:
    """The largest ``|model_shift| / total_stderr`` over lags and entries (``None`` without a
    neighbouring model); a one-line :class:`SensitivityWarning` when it exceeds
    :data:`SENSITIVITY_TOLERANCE`. ``neighbour`` names the steps of estimator ``used``, e.g.
    ``"degree 5 -> 6, 7"``."""
    if result.model_shift is None or neighbour is None:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.abs(result.model_shift) / result.total_stderr
    z = np.where(np.isnan(z), 0.0, z)
    worst = float(z.max())
    if worst > SENSITIVITY_TOLERANCE:
        lag, i, j = (int(v) for v in np.unravel_index(int(np.argmax(z)), z.shape))
        _emit(
            SensitivityWarning,
            f"the response moves by {worst:.1f} total standard errors (lag {lag}, entry "
            f"({i}, {j})) from {used} {neighbour}: the estimate depends on the model "
            "more than its error bars say, so it is likely biased by about that much (see "
            "response_model_shift; try index_set='adaptive', a basis that follows the data, "
            "or the other estimator)",
            record,
        )
    return worst


def _warn_unconverged(result: ResponseResult, record: list[str] | None = None) -> None:
    """One-line :class:`ConvergenceWarning` when the blocking of some entries did not converge
    (``response_converged`` is False there)."""
    converged = np.asarray(result.blocking.converged, dtype=bool)
    if converged.all():
        return
    lags = np.flatnonzero(~converged.all(axis=(1, 2)))
    _emit(
        ConvergenceWarning,
        f"the error bars of {int((~converged).sum())} of {converged.size} response entries "
        f"(lags {lags[0]}..{lags[-1]}) did not converge (block averaging reached no plateau: "
        "chains short against the correlation time); those standard errors are too small "
        "(see response_converged)",
        record,
    )
