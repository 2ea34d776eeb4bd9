"""The whole estimate: ``estimate_response`` and its result schema (paper §4 algorithm).

Each pass is the engine plus one kernel (DESIGN §3):

==========  ==========================================  ===================================
pass        reductions (sharing one read of the data)   gives
==========  ==========================================  ===================================
0           moments (+ mean/covariance for baselines)   basis choice (step 1), KDE grid
0b          Gamma fit (only for Laguerre without θ)     Laguerre θ and scale
1           coefficient sums (+ KDE linear binning)     ``p_M`` (eq:kme_MC, step 2)
1b          δ/R/η sweep over every order                order and δ (eq:deltaM, crit1-2)
2           conjugate variables and lagged sums         ``k(lag, i, j)`` with error bars
==========  ==========================================  ===================================

The result is an ``xarray.Dataset`` (see :func:`estimate_response`); :func:`write_result`
writes it atomically and :func:`density_from_result` rebuilds ``p_M`` from it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from kelr_dist import __version__
from kelr_dist.bases import IndexSet, TensorBasis
from kelr_dist.density import KernelDensity, coefficient_reduction
from kelr_dist.engine import run_reductions
from kelr_dist.kde import (
    SampleMoments,
    binned_kde_reduction,
    default_grid,
    gaussian_score,
    mean_covariance_reduction,
    silverman_bandwidth,
)
from kelr_dist.moments import (
    Moments,
    choose_basis,
    coordinates_from_spec,
    format_basis,
    gamma_reduction_for,
    moments_reduction,
    parse_basis_spec,
)
from kelr_dist.reduction import SYNCHRONOUS, Reduction
from kelr_dist.response import (
    DensityScore,
    Forcing,
    FunctionScore,
    KDEScore,
    Observable,
    ResponseResult,
    Score,
    constant_forcing,
    identity_observable,
    response_reduction,
)
from kelr_dist.selection import (
    Criteria,
    active_coordinates,
    choose_delta,
    choose_order,
    criteria_reduction,
    typical_error,
)
from kelr_dist.store import as_trajectory, open_trajectory

#: default highest order scanned, by dimension (about 2000-3000 basis functions)
DEFAULT_MAX_ORDER = {1: 150, 2: 70, 3: 24, 4: 12}
#: default largest lag: 2000 rows, at most a twentieth of a chain
DEFAULT_MAX_LAG = 2000


def _open(trajectory: Any, variable: str, dt: float | None) -> xr.DataArray:
    if isinstance(trajectory, str | os.PathLike):
        return open_trajectory(trajectory, variable)
    if isinstance(trajectory, np.ndarray):
        dims = ("time", "component") if trajectory.ndim == 2 else ("chain", "time", "component")
        trajectory = xr.DataArray(trajectory, dims=dims, attrs={"dt": 1.0 if dt is None else dt})
    elif dt is not None:
        trajectory = trajectory.assign_attrs(dt=dt)
    return as_trajectory(trajectory, variable)


def _client(client: Any, n_workers: int | None, memory_limit: Any) -> Any:
    if client == SYNCHRONOUS:
        return client
    if client is None or isinstance(client, str):
        from kelr_dist.cluster import get_client

        return get_client(client, n_workers=n_workers, memory_limit=memory_limit, quiet=True)
    return client


def _max_lag(max_lag: int | None, max_time: float | None, dt: float, n: int) -> int:
    if max_lag is not None and max_time is not None:
        raise ValueError("give max_lag or max_time, not both")
    if max_time is not None:
        if not max_time >= 0:
            raise ValueError(f"max_time must be non-negative, got {max_time!r}")
        max_lag = int(round(max_time / dt))
    elif max_lag is None:
        max_lag = min(DEFAULT_MAX_LAG, max(1, n // 20))
    if int(max_lag) != max_lag or max_lag < 0:
        raise ValueError(f"max_lag must be a non-negative integer, got {max_lag!r}")
    if max_lag >= n:
        raise ValueError(f"max_lag={max_lag} must be smaller than the chain length {n}")
    return int(max_lag)


def _orders(
    order: Any, max_order: Any, index_set: str, d: int
) -> tuple[int | tuple[int, ...], int | tuple[int, ...] | None]:
    """(fitted order of the basis, user order or None for automatic)."""
    if isinstance(order, str):
        if order != "auto":
            raise ValueError(f"order must be 'auto', an integer or a tuple, got {order!r}")
        chosen = None
    elif isinstance(order, Sequence):
        if index_set == "total":
            raise ValueError("a per-coordinate order tuple needs index_set='box'")
        chosen = tuple(int(m) for m in order)
    else:
        if int(order) != order or order < 0:
            raise ValueError(f"order must be a non-negative integer, got {order!r}")
        chosen = int(order)
    if max_order is None:
        fitted = chosen if chosen is not None else DEFAULT_MAX_ORDER.get(d, 8)
    elif isinstance(max_order, Sequence):
        fitted = tuple(int(m) for m in max_order)
    else:
        fitted = int(max_order)
    if isinstance(chosen, int) and isinstance(fitted, int) and chosen > fitted:
        raise ValueError(f"order={chosen} is above max_order={fitted}")
    return fitted, chosen


def _first_set(index_set: str) -> IndexSet:
    return "total" if index_set == "auto" else index_set  # type: ignore[return-value]


def _resolve_index_set(
    density: KernelDensity, max_order: Any, chosen: int | None
) -> tuple[IndexSet, Any, Any]:
    """``index_set="auto"``: total degree, unless at most one coordinate is active
    (:func:`kelr_dist.selection.active_coordinates`); then a box with order 0 on the inactive
    ones and the 1-D default order on the active one."""
    active = active_coordinates(density)
    fitted = density.basis.order
    if active.all() or active.sum() > 1:
        return "total", fitted, chosen
    top = DEFAULT_MAX_ORDER[1] if max_order is None else int(max_order)
    box = tuple(top if a else 0 for a in active)
    return "box", box, None if chosen is None else tuple(chosen if a else 0 for a in active)


def _exact_score(trajectory: xr.DataArray, score: Callable | None) -> Callable | None:
    if score is not None:
        return score
    from kelr_dist.models import make_model

    attrs = trajectory.attrs
    if "model" not in attrs:
        raise ValueError(
            f"exact=True needs the store's model (attribute 'model', missing in "
            f"{attrs.get('store', 'the trajectory')!r}) or a score function"
        )
    params = attrs.get("model_params", "{}")
    model = make_model(
        attrs["model"], **(json.loads(params) if isinstance(params, str) else params)
    )
    return model.score


def _check_finite(moments: Moments, source: str) -> None:
    bad = ~(np.isfinite(moments.mean) & np.isfinite(moments.variance))
    if bad.any():
        raise ValueError(
            f"trajectory {source!r}: component(s) {np.flatnonzero(bad).tolist()} hold non-finite "
            "values (NaN or inf)"
        )


def estimate_response(
    trajectory: Any,
    *,
    variable: str = "x",
    basis: str | Sequence[Any] = "auto",
    order: Any = "auto",
    max_order: Any = None,
    index_set: str = "auto",
    max_lag: int | None = None,
    max_time: float | None = None,
    delta: str | float = "auto",
    observable: Observable | None = None,
    forcing: Forcing | None = None,
    exact: bool = False,
    score: Callable[[np.ndarray], np.ndarray] | None = None,
    kde: bool = False,
    gaussian: bool = False,
    client: Any = None,
    n_workers: int | None = None,
    memory_limit: Any = None,
    progress: bool | None = None,
    dt: float | None = None,
) -> xr.Dataset:
    """Kernel-embedding linear response ``k(lag, i, j)`` of a trajectory (paper §4 algorithm).

    Parameters
    ----------
    trajectory : a store path, an xarray ``Dataset``/``DataArray`` in the store layout, or a
        numpy array ``(n, d)`` / ``(chains, n, d)`` (sample interval ``dt``, default 1).
    variable : the trajectory variable of a store/Dataset.
    basis : ``"auto"`` or a per-coordinate spec, e.g. ``"laguerre(theta=1),hermite"``
        (:func:`kelr_dist.moments.parse_basis_spec`), or a list of coordinates.
    order : ``"auto"`` (criteria of §4), an order ``M`` or a box tuple ``(M_1, ..)``.
    max_order : highest order fitted and scanned (default by dimension, ``DEFAULT_MAX_ORDER``).
    index_set : ``"total"`` (``|m|_1 ≤ M``), ``"box"`` (``m_k ≤ M_k``) or ``"auto"``: total
        degree unless at most one coordinate carries structure beyond its weight
        (:func:`kelr_dist.selection.active_coordinates`), then a box with order 0 on the others,
        as in the paper's Langevin example.
    max_lag, max_time : largest lag in rows or in time units (one of them).
    delta : ``"auto"`` (error-tied threshold, :func:`kelr_dist.selection.choose_delta`),
        ``"paper"`` (``δ_M`` of eq:deltaM) or a number.
    observable, forcing : ``A`` and ``c`` (default identity and constant forcing).
    exact : also the exact-FDT response with the model's score (built-in models know it from the
        store's attributes); ``score`` gives a score function ``X (n, d) -> ∇ log p (n, d)``.
    kde, gaussian : also the Gaussian-KDE and quasi-Gaussian baselines (§5).
    client : a ``distributed.Client``, a scheduler address, ``None`` (the embedded
        ``LocalCluster``) or ``"synchronous"`` (no cluster: the same passes in this process).
    n_workers, memory_limit : size of the embedded cluster.
    progress : progress bars (``None``: when stderr is a terminal).

    Returns
    -------
    xarray.Dataset
        ``response(lag, i, j)`` and ``response_stderr``; ``response_exact``/``_kde``/
        ``_gaussian`` (+ ``_stderr``) when asked; coordinates ``lag``, ``time`` (on lag), ``i``,
        ``j``; criteria on ``order``: ``delta``, ``rejection``, ``eta``, ``eta_noise``,
        ``delta_paper``, ``rejection_paper``, ``negative_excursion``; ``coefficients`` and
        ``coefficient_variance`` on ``basis_function`` with ``multi_index(basis_function,
        component)``; the run's choices in ``attrs``.
    """
    started = time.perf_counter()
    traj = _open(trajectory, variable, dt)
    source = str(traj.attrs.get("store", "<in-memory>"))
    chains, n, d = traj.shape
    components = [str(c) for c in traj["component"].values]
    step = float(traj.attrs["dt"])
    lag = _max_lag(max_lag, max_time, step, n)
    if index_set not in ("auto", "total", "box"):
        raise ValueError(f"index_set must be 'auto', 'total' or 'box', got {index_set!r}")
    fitted, chosen = _orders(order, max_order, index_set, d)
    if not (delta in ("auto", "paper") or (isinstance(delta, float | int) and delta > 0)):
        raise ValueError(f"delta must be 'auto', 'paper' or a positive number, got {delta!r}")
    parse_basis_spec(basis, d)  # fail on a bad spec before any pass
    exact_fn = _exact_score(traj, score) if (exact or score is not None) else None
    observable = observable or identity_observable(components)
    forcing = forcing or constant_forcing(components)
    if len(forcing.names) != d:
        raise ValueError(f"forcing has {len(forcing.names)} components, the trajectory {d}")
    executor = _client(client, n_workers, memory_limit)

    def run(*reductions: Reduction) -> list[Any]:
        return run_reductions(traj, reductions, executor, progress=progress)

    # pass 0 (+0b): moments and tails -> basis
    baselines = kde or gaussian
    first = run(moments_reduction(), *([mean_covariance_reduction()] if baselines else []))
    moments: Moments = first[0]
    _check_finite(moments, source)
    gamma_pass = gamma_reduction_for(moments, basis)
    gamma = run(gamma_pass)[0] if gamma_pass is not None else None
    coordinates = tuple(choose_basis(moments, gamma, basis))
    if index_set == "auto" and isinstance(chosen, tuple):
        index_set = "box"

    # pass 1: coefficients (+ KDE bins)
    passes = [coefficient_reduction(TensorBasis(coordinates, fitted, _first_set(index_set)))]
    if kde:
        sample: SampleMoments = first[1]
        h = silverman_bandwidth(np.sqrt(np.diag(np.atleast_2d(sample.cov))), int(sample.count))
        passes.append(binned_kde_reduction(default_grid(sample.minimum, sample.maximum, h), h))
    density, *kde_estimate = run(*passes)
    if index_set == "auto":
        index_set, fitted, chosen = _resolve_index_set(density, max_order, chosen)
        if index_set == "box":  # refit on the active coordinate alone (paper §5.2)
            density = run(coefficient_reduction(TensorBasis(coordinates, fitted, "box")))[0]

    # pass 1b: criteria for every order -> order and δ
    criteria: Criteria = run(criteria_reduction(density))[0]
    if chosen is None:
        chosen = choose_order(criteria)
    level = max(chosen) if isinstance(chosen, tuple) else chosen
    deltas = choose_delta(criteria)
    if delta == "auto":
        threshold = float(deltas[level])
    elif delta == "paper":
        threshold = float(criteria.delta_paper[level])
    else:
        threshold = float(delta)

    # pass 2: conjugate variables and lagged sums
    scores: dict[str, Score] = {"response": DensityScore(density, chosen, threshold)}
    if exact_fn is not None:
        scores["response_exact"] = FunctionScore(exact_fn)
    if kde:
        scores["response_kde"] = KDEScore(kde_estimate[0])
    if gaussian:
        sample = first[1]
        scores["response_gaussian"] = FunctionScore(
            gaussian_score(sample.mean, np.atleast_2d(sample.cov))
        )
    responses = run(response_reduction(scores, observable, forcing, lag))[0]

    return _assemble(
        responses=responses,
        criteria=criteria,
        deltas=deltas,
        density=density,
        trajectory=traj,
        observable=observable,
        forcing=forcing,
        attrs={
            "order": json.dumps(chosen),
            "order_selection": "auto" if order == "auto" else "given",
            "max_order": json.dumps(fitted),
            "basis": format_basis(coordinates),
            "index_set": index_set,
            "delta": threshold,
            "delta_rule": delta if isinstance(delta, str) else "given",
            "rejection": responses["response"].rejection,
            "n_samples": int(chains * n),
            "chains": int(chains),
            "chain_length": int(n),
            "dt": step,
            "max_lag": lag,
            "chunking": json.dumps([int(c) for c in traj.chunks[1]]),
            "store": source,
            "variable": str(traj.name),
            "kelr_dist_version": __version__,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "runtime_seconds": time.perf_counter() - started,
            **{k: _attr(traj.attrs[k]) for k in ("model", "model_params") if k in traj.attrs},
        },
    )


def _attr(value: Any) -> Any:
    return value if isinstance(value, str | int | float) else json.dumps(value)


def _assemble(
    *,
    responses: dict[str, ResponseResult],
    criteria: Criteria,
    deltas: np.ndarray,
    density: KernelDensity,
    trajectory: xr.DataArray,
    observable: Observable,
    forcing: Forcing,
    attrs: dict[str, Any],
) -> xr.Dataset:
    lags = np.arange(next(iter(responses.values())).mean.shape[0])
    dims = ("lag", "i", "j")
    data: dict[str, Any] = {}
    for name, result in responses.items():
        data[name] = (dims, result.mean)
        data[f"{name}_stderr"] = (dims, result.stderr)
    orders = criteria.orders
    data.update(
        delta=("order", deltas),
        rejection=("order", criteria.rejection(deltas)),
        delta_paper=("order", criteria.delta_paper),
        rejection_paper=("order", criteria.rejection_paper()),
        negative_excursion=("order", criteria.negative_excursion),
        negative_median=("order", typical_error(criteria)),
        eta=("order", criteria.eta),
        eta_noise=("order", criteria.eta_noise),
        coefficients=("basis_function", density.coefficients),
        coefficient_variance=("basis_function", density.variances),
        multi_index=(("basis_function", "component"), density.basis.indices),
    )
    ds = xr.Dataset(
        data,
        coords={
            "lag": lags,
            "time": ("lag", lags * attrs["dt"]),
            # variable-length strings: zarr 3 has no stable spec for fixed-width unicode
            "i": _names(observable.names),
            "j": _names(forcing.names),
            "order": orders,
            "component": _names(trajectory["component"].values),
        },
        attrs=attrs,
    )
    ds["response"].attrs["long_name"] = "kernel-embedding linear response k(t)"
    ds["time"].attrs["long_name"] = "time lag"
    return ds


def _names(names: Sequence[Any]) -> np.ndarray:
    return np.asarray([str(n) for n in names], dtype=object)


def density_from_result(ds: xr.Dataset) -> KernelDensity:
    """Rebuild the fitted ``p_M`` (highest order; truncate with ``evaluate(order=...)``)."""
    d = ds.sizes["component"]
    coordinates = coordinates_from_spec(ds.attrs["basis"], d)
    tensor = TensorBasis(tuple(coordinates), _order(ds.attrs["max_order"]), ds.attrs["index_set"])
    return KernelDensity(
        tensor,
        np.asarray(ds["coefficients"].values, dtype=np.float64),
        np.asarray(ds["coefficient_variance"].values, dtype=np.float64),
        int(ds.attrs["n_samples"]),
    )


def _order(text: str) -> int | tuple[int, ...]:
    value = json.loads(text)
    return tuple(value) if isinstance(value, list) else int(value)


def write_result(ds: xr.Dataset, path: str | os.PathLike[str], overwrite: bool = False) -> None:
    """Write a result atomically: to a temporary sibling first, then renamed into place.

    ``*.nc`` gives netCDF, anything else a zarr store. An interrupted write never leaves a
    store at ``path`` (only a ``.tmp-*`` sibling, removed on errors).
    """
    target = Path(path)
    if target.exists() and not overwrite:
        raise ValueError(f"output {str(target)!r} exists; choose another path or overwrite")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        if target.suffix == ".nc":
            ds.to_netcdf(tmp)
        else:
            ds.to_zarr(tmp, mode="w", consolidated=False)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(target, old)
            os.replace(tmp, target)
            _remove(old)
        else:
            os.replace(tmp, target)
    except BaseException:
        _remove(tmp)
        raise


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()
