"""The checks of an estimate's inputs against the data's metadata, made before any pass.

:func:`check_inputs` opens the trajectory (a store path, an xarray object or an array-like),
selects its components and checks the options against its shape: the largest lag, a degree's
memory, the folds, the basis spec, the exact score, the observable and the forcing.
(``kelr estimate`` and ``kelr run`` call it before a cluster starts.)
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from kelr_dist.data.fields import FIELD_ATTR, stacked
from kelr_dist.data.store import (
    IN_MEMORY,
    as_trajectory,
    estimate_limits,
    open_trajectory,
    parse_json_attr,
)
from kelr_dist.kernels.bases.eof import eof_names
from kelr_dist.kernels.bases.spec import parse_basis_spec
from kelr_dist.kernels.observables.distribution import PendingDistribution
from kelr_dist.kernels.observables.field import FieldSpec
from kelr_dist.kernels.response.operator import (
    Forcing,
    Observable,
    constant_forcing,
)
from kelr_dist.kernels.scores.folds import Folds
from kelr_dist.kernels.scores.local import (
    LOCAL_DIMENSION,
    Neighbourhoods,
    declared_neighbourhoods,
)
from kelr_dist.kernels.scores.score_matching import feature_count
from kelr_dist.pipeline.fields import PATTERN, PendingEOF, field_observable, forcing_pattern
from kelr_dist.pipeline.options import EstimateOptions, Name, eof_modes, is_pattern
from kelr_dist.pipeline.steps import (
    kernel_embedding_max_order,
)

#: default largest lag: 2000 rows, at most a twentieth of a chain
DEFAULT_MAX_LAG = 2000


#: largest score-matching Gram matrices (all folds) a requested degree may need
MAX_GRAM_BYTES = 2 * 1024**3


#: the largest lag may be at most this fraction of a chain (error bars need many blocks of it)
MAX_LAG_FRACTION = 0.25


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


def _time_index(table: Any, ndim: int) -> np.ndarray | None:
    """The time coordinate a pandas ``DataFrame``/``Series`` carries in its index: the values of
    a float, ``DatetimeIndex`` or ``TimedeltaIndex`` index, taken as xarray's ``time``
    coordinate is (float: ``dt`` from its step; dates and durations: ``dt`` in seconds); None
    for other objects and for integer indexes (the default ``0, 1, ...``: sample numbers)."""
    index: Any = getattr(table, "index", None)
    if ndim not in (1, 2) or getattr(getattr(index, "dtype", None), "kind", "") not in tuple("fmM"):
        return None
    if getattr(index, "tz", None) is not None:  # dates with a time zone: the same instants in UTC
        index = index.tz_convert(None)
    return np.asarray(index)


def _open(trajectory: Any, variable: str, dt: float | None) -> xr.DataArray:
    """The trajectory as a validated ``(chain, time, component)`` DataArray: a store path, an
    xarray object in the store layout, or an array-like (numpy array, list, pandas object) of
    shape ``(time,)`` (one component), ``(time, component)`` or ``(chain, time, component)``; a
    pandas object's float or date index is its ``time`` coordinate (:func:`_time_index`); an
    array without either ``dt`` gets ``dt = 1`` in ``time_units = "steps"``."""
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
        times = _time_index(trajectory, array.ndim)
        array = array[:, np.newaxis] if array.ndim == 1 else array
        dims = ("time", "component") if array.ndim == 2 else ("chain", "time", "component")
        # without dt or a time index the lags are counted in samples, and the result says so
        attrs = {"dt": 1.0, "time_units": "steps"} if dt is None and times is None else {}
        coords: dict[str, Any] = {} if names is None else {"component": names}
        if times is not None:
            coords["time"] = times
        trajectory = xr.DataArray(array, dims=dims, coords=coords, attrs=attrs)
    source = str(trajectory.encoding.get("source", IN_MEMORY))
    return as_trajectory(stacked(trajectory, variable, source), variable, dt=dt)


#: an unknown component's message lists at most this many of the available ones
SHOWN_COMPONENTS = 20


def _select(traj: xr.DataArray, components: Sequence[str] | None, name: Name = str) -> xr.DataArray:
    """The ``components`` of ``traj`` (all when None), in the order given (lazily: a store's
    blocks are still read whole, the other components dropped per block); a field's points so
    selected lose the field's grid (the result stays on ``i``, ``j``)."""
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
    selected = traj.sel(component=list(components))
    # a field's points picked by name are components like any others: no grid to return to
    selected.attrs.pop(FIELD_ATTR, None)
    return selected


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


def _local(
    traj: xr.DataArray, options: EstimateOptions, components: list[str], name: Name = str
) -> tuple[bool, Neighbourhoods | None]:
    """Whether score matching is local (``index_set="local"``, neighbourhoods given by the
    option or the store's ``neighbours`` attribute, or ``index_set="auto"`` from
    :data:`~kelr_dist.kernels.scores.local.LOCAL_DIMENSION` components on) and its declared
    neighbourhoods, checked against the components; ``symmetry`` needs a lattice."""
    spec, what = options.neighbours, name("neighbours")
    if spec is None and options.index_set in ("auto", "local", "local-adaptive"):
        spec = traj.attrs.get("neighbours")
        what = f"trajectory {traj.attrs.get('store', IN_MEMORY)!r}: attribute 'neighbours'"
    declared = None if spec is None else declared_neighbourhoods(spec, components, what)
    local = options.index_set in ("local", "local-adaptive") or declared is not None
    local = local or (options.index_set == "auto" and len(components) >= LOCAL_DIMENSION)
    if options.symmetry == "translation" and not (declared is not None and declared.lattice):
        raise ValueError(
            f"{name('symmetry')}='translation' ties the weights of sites of the same shape: it "
            f"needs {name('neighbours')}='ring' or 'grid(n1,n2)'"
        )
    return local, declared


def _local_degree(options: EstimateOptions) -> int | None:
    return None if options.degree == "auto" else int(options.degree)


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
    if not model.closed_form_density:
        raise ValueError(
            f"{name('exact')}: the store's model {model.name!r} has no closed-form equilibrium "
            "density, so there is no exact-FDT response; compare with a direct perturbation "
            "experiment, or give a score function with "
            f"{name('score')}='package.module:function'"
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
    #: a distribution's grid and a field's EOFs come from the data
    observable: Observable | PendingDistribution | PendingEOF
    forcing: Forcing
    #: a forcing pattern ``f (d,)`` over a field's grid points (:mod:`kelr_dist.pipeline.fields`),
    #: also the last column :data:`~kelr_dist.pipeline.fields.PATTERN` of ``forcing``
    pattern: np.ndarray | None = None
    #: score matching is the local model (:mod:`kelr_dist.kernels.scores.local`), on these
    #: declared neighbourhoods (None: from the data's partial correlations)
    local: bool = False
    neighbours: Neighbourhoods | None = None


def check_inputs(trajectory: Any, options: EstimateOptions, name: Name = str) -> Inputs:
    """Open the ``trajectory`` (as :func:`estimate_response` takes it, an array with
    ``options.dt``), select its ``options.components``, and make every check of
    ``options`` against it that needs its metadata but not its values: limits, the largest
    lag, a degree's memory, the KDE's dimension, folds, the basis spec, the exact score, the
    observable and forcing. With ``options.reduce="eof(k)"`` the checks that depend on the
    components are made for the ``k`` EOF amplitudes ``eof1..eofk`` the estimate runs on (the
    observable and forcing are theirs). (``kelr estimate``/``kelr run`` call it before a cluster
    starts.)

    Raises
    ------
    ValueError
        naming the option as ``name`` gives it (``max_lag``, ``--max-lag``, ``lags.max_lag``)
        and what is wrong (:class:`~kelr_dist.data.store.TrajectoryError` for the trajectory
        itself).
    """
    array = not isinstance(trajectory, str | os.PathLike | xr.Dataset | xr.DataArray)
    dt = options.dt
    traj = _select(_open(trajectory, options.variable, dt), options.components, name)
    counted = traj.attrs.get("time_units") == "steps"  # no dt, no time index (see _open)
    if array and dt is None and counted and options.max_time is not None:
        raise ValueError(
            f"{name('max_time')}={options.max_time:g} given for an array without dt or a time "
            f"index: its lags would count samples, not time; give dt= (the sample interval) or "
            f"{name('max_lag')} (in samples)"
        )
    chains, n, d = traj.shape
    components = [str(c) for c in traj["component"].values]
    step = float(traj.attrs["dt"])
    modes = eof_modes(options.reduce)
    if modes is not None:  # the estimate runs on the EOF amplitudes
        if modes > d:
            raise ValueError(
                f"{name('reduce')}={options.reduce!r} asks for {modes} EOFs of {d} components"
            )
        d, components = modes, list(eof_names(modes))
    _check_shape(traj, n, d)
    lag = _max_lag(options, step, n, str(traj.attrs.get("store", IN_MEMORY)), name)
    fitted, chosen = _orders(options, d)
    local, neighbours = _local(traj, options, components, name)
    sm_degree = _degree(options, d, name) if not local else _local_degree(options)
    if options.kde and d > 3:
        raise ValueError(
            f"{name('kde')}: the Gaussian-KDE baseline supports d <= 3, the data have {d}"
        )
    # folds: score matching's held-out choice and the kernel embedding's order floor
    fold_plan = Folds(options.folds, chains, n)
    parse_basis_spec(options.basis, d)  # fail on a bad spec before any pass
    exact_fn = _exact_score(traj, options.score, name) if (options.exact or options.score) else None
    named = options.observable_for(components)
    observable = field_observable(named, traj, name) if isinstance(named, FieldSpec) else named
    forcing = options.forcing_for(components)
    if len(forcing.names) != d:
        raise ValueError(f"forcing has {len(forcing.names)} components, the trajectory {d}")
    pattern = forcing_pattern(options.forcing, traj, name) if is_pattern(options.forcing) else None
    if pattern is not None:  # the pattern's own column of B (eq. 5): its real standard errors
        forcing = constant_forcing(components, {PATTERN: pattern})
    return Inputs(
        traj, lag, fitted, chosen, sm_degree, fold_plan, exact_fn, observable, forcing, pattern,
        local, neighbours,
    )  # fmt: skip
