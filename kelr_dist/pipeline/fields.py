"""A field's observables and forcing pattern from its grid, and its result back on the grid.

A field enters the estimate stacked into components (:mod:`kelr_dist.data.fields`). Here:

- :func:`field_observable`: ``mean`` / ``mean(weights=cos(lat))`` (the weighted mean over the
  points that are components, weights from a coordinate of the grid) and ``eof(k)`` (the
  amplitudes of the ``k`` leading EOFs, settled from the survey's covariance by
  :func:`survey_eof`; :mod:`kelr_dist.kernels.observables.field`);
- :func:`forcing_pattern`: a forcing ``c(x) = f`` that is a pattern ``f`` over the grid (a
  ``DataArray`` over the field's spatial dims, or one read from a file: :func:`read_pattern`).
  Its conjugate variable (eq. 5) is ``B_f = Σ_j f_j B_j = -f · ∇ log p``, the sum of the
  constant forcing's columns ``B_j = -∂_j log p`` times ``f_j``. The estimate runs with the
  constant forcing and ``B_f`` as one more column of ``B``, :data:`PATTERN`
  (:func:`~kelr_dist.kernels.response.operator.constant_forcing`): its lagged sums, standard
  errors (block averaging, the fitted score's jackknife), Stein correction and lag-0 Stein
  residual are its own, so the correlations between the points' columns are in them;
- :func:`field_result`: the result's ``i`` and ``j`` unstacked into ``i_<dim>``/``j_<dim>``
  (NaN at masked points), each point's column scaled by ``f_j`` (the share of the response
  its forcing makes), the pattern's column as ``pattern_<variable>`` (``pattern_response(lag,
  i)``, ``pattern_response_stderr``, ...), the EOFs' loadings and explained variance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from kelr_dist.data.fields import FIELD_ATTR, FieldLayout
from kelr_dist.data.store import IN_MEMORY
from kelr_dist.kernels.observables.field import (
    COSINE,
    FieldSpec,
    LinearObservable,
    leading_eofs,
    weighted_mean_matrix,
)
from kelr_dist.kernels.response.operator import Observable, identity_observable
from kelr_dist.pipeline.options import Name, PatternFile
from kelr_dist.pipeline.steps import Passes, Survey, survey_data

#: variables with these endings are not scaled by the pattern (block sizes, flags)
UNSCALED = ("_block_size", "_converged")

#: the ``j`` label of a forcing pattern's own column of the response, before
#: :func:`field_result` takes it out as the ``pattern_`` variables
PATTERN = "pattern"


@dataclass(frozen=True, eq=False)
class PendingEOF:
    """An ``eof(k)`` observable waiting for the survey's covariance (:func:`survey_eof`)."""

    k: int
    weights: np.ndarray | None
    components: tuple[str, ...]


def _source(trajectory: xr.DataArray) -> str:
    return str(trajectory.attrs.get("store", IN_MEMORY))


def _weights(spec: FieldSpec, trajectory: xr.DataArray, name: Name) -> np.ndarray | None:
    """The weights ``(d,)`` of ``spec`` at the components: ``cos(c)`` of a coordinate ``c`` in
    degrees, or a coordinate's values; None for equal weights."""
    if not spec.weights:
        return None
    cosine = COSINE.match(spec.weights)
    coordinate = cosine["name"] if cosine else spec.weights
    on_points = [str(k) for k, v in trajectory.coords.items() if v.dims == ("component",)]
    if coordinate not in on_points or coordinate == "component":
        available = ", ".join(c for c in on_points if c != "component") or "none"
        raise ValueError(
            f"{name('observable')}={spec.text!r}: no coordinate {coordinate!r} over the grid of "
            f"{_source(trajectory)!r} (coordinates over the grid: {available})"
        )
    values = np.asarray(trajectory.coords[coordinate].values, dtype=np.float64)
    weights = np.cos(np.deg2rad(values)) if cosine else values
    weights = np.where(np.abs(weights) < 1e-12, 0.0, weights)  # cos(±90°)
    if not (np.all(np.isfinite(weights)) and np.all(weights >= 0) and weights.sum() > 0):
        raise ValueError(
            f"{name('observable')}={spec.text!r}: the weights must be finite, >= 0 and not all "
            f"0 at the grid points of {_source(trajectory)!r}"
        )
    return weights


def field_observable(
    spec: FieldSpec, trajectory: xr.DataArray, name: Name = str
) -> Observable | PendingEOF:
    """The observable ``spec`` names on the components of ``trajectory`` (a field's grid points,
    with their coordinates): the weighted mean as an :class:`Observable`, ``eof(k)`` pending."""
    components = tuple(str(c) for c in trajectory["component"].values)
    weights = _weights(spec, trajectory, name)
    if spec.kind == "mean":
        function = LinearObservable(weighted_mean_matrix(np.ones(len(components)) if weights is
                                                         None else weights))  # fmt: skip
        return Observable(("mean",), function, function.derivative)
    if spec.k > len(components):
        raise ValueError(
            f"{name('observable')}={spec.text!r}: {spec.k} EOFs of {len(components)} components"
        )
    return PendingEOF(spec.k, weights, components)


def survey_eof(passes: Passes, pending: PendingEOF) -> tuple[Survey, Observable]:
    """Read 1 with the covariance, and the ``eof(k)`` observable it settles
    (:func:`~kelr_dist.kernels.observables.field.leading_eofs`) with its mean ``Ā = L x̄``."""
    survey = survey_data(passes, identity_observable(pending.components))
    assert survey.sample is not None
    loadings, explained = leading_eofs(np.atleast_2d(survey.sample.cov), pending.k, pending.weights)
    function = LinearObservable(loadings, explained)
    names = tuple(f"eof{m + 1}" for m in range(pending.k))
    observable = Observable(names, function, function.derivative)
    survey = replace(survey, centre=loadings @ survey.centre)
    return survey, observable


def read_pattern(spec: PatternFile, label: str) -> xr.DataArray:
    """The pattern ``spec`` names, loaded: the variable of a netCDF file or of a zarr store (a
    folder); ``label`` names the option in the errors."""
    file = Path(spec.file)
    if not file.exists():
        raise ValueError(f"{label}: no file or zarr store {str(file)!r}")
    zarr: dict[str, Any] = {"engine": "zarr", "consolidated": False} if file.is_dir() else {}
    try:
        opened = xr.open_dataset(file, chunks=None, **zarr)
    except Exception as err:  # the backends raise many types for "not readable"
        raise ValueError(
            f"{label}: cannot read {str(file)!r} as a netCDF file or zarr store "
            f"({type(err).__name__}: {err})"
        ) from None
    with opened as ds:
        if spec.variable not in ds.data_vars:
            found = ", ".join(map(str, ds.data_vars)) or "none"
            raise ValueError(
                f"{label}: no variable {spec.variable!r} in {str(file)!r} (its variables: {found})"
            )
        return ds[spec.variable].load()


def forcing_pattern(
    spec: xr.DataArray | PatternFile, trajectory: xr.DataArray, name: Name = str
) -> np.ndarray:
    """The pattern ``f`` ``(d,)`` at the components of the field ``trajectory``, given as a
    ``DataArray`` or in a file (:func:`read_pattern`): its dims must be the field's spatial dims,
    its coordinates must hold every grid point, and its values there be finite real numbers
    (masked points may be anything)."""
    if isinstance(spec, PatternFile):
        label = f"{name('forcing')}={spec.text!r}"
        pattern = read_pattern(spec, label)
    else:
        label, pattern = name("forcing"), spec
    layout = FieldLayout.from_attrs(trajectory.attrs)
    source = _source(trajectory)
    if layout is None:
        raise ValueError(
            f"{label}: a pattern (DataArray over {tuple(map(str, pattern.dims))}) "
            f"needs a field (a variable with spatial dims); {source!r} has components only"
        )
    if not (np.issubdtype(pattern.dtype, np.integer) or np.issubdtype(pattern.dtype, np.floating)):
        got = "text" if pattern.dtype.kind in "SU" else f"dtype {pattern.dtype}"
        raise ValueError(f"{label}: the pattern's values must be real numbers, got {got}")
    if set(map(str, pattern.dims)) != set(layout.dims) or pattern.ndim != len(layout.dims):
        raise ValueError(
            f"{label}: the pattern's dims {tuple(map(str, pattern.dims))} are not the "
            f"spatial dims {layout.dims} of the field {source!r}"
        )
    try:
        on_grid = pattern.sel(
            {d: layout.coords[d] for d in layout.dims if d in pattern.coords}
        ).transpose(*layout.dims)
    except (KeyError, ValueError) as err:
        raise ValueError(
            f"{label}: the pattern's coordinates do not hold every point of the field "
            f"{source!r} ({type(err).__name__}: {err})"
        ) from None
    if on_grid.shape != layout.shape:
        raise ValueError(
            f"{label}: the pattern's shape {on_grid.shape} is not the field's grid "
            f"{layout.shape} ({layout.dims})"
        )
    values = np.asarray(on_grid.values, dtype=np.float64).reshape(-1)[np.flatnonzero(layout.kept)]
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(
            f"{label}: the pattern is not finite at {bad.size} grid point(s) of the "
            f"field, the first {layout.components[bad[0]]}"
        )
    return values


def field_result(
    result: xr.Dataset,
    trajectory: xr.DataArray,
    observable: Observable,
    pattern: np.ndarray | None,
) -> xr.Dataset:
    """The result of a field's estimate on its grid (see the module docstring); ``result``
    itself for a trajectory that is not a field."""
    layout = FieldLayout.from_attrs(trajectory.attrs)
    if layout is None:
        return result
    if pattern is not None:
        result = _scaled(result, pattern)
    prefixes = {"i": "i_", "j": "j_"}
    data = {key: layout.on_grid(var, prefixes) for key, var in result.data_vars.items()}
    function = observable.function
    if isinstance(function, LinearObservable) and function.explained is not None:
        loadings = xr.DataArray(function.matrix, dims=("i", "component"))
        data["eof_loading"] = layout.unstack(loadings, "component", "")
        data["eof_explained_variance"] = xr.DataArray(function.explained, dims=("i",))
    spread = {"i", "j"} - set(data["response"].dims)
    coords = {k: v for k, v in result.coords.items() if not spread & set(v.dims)}
    out = xr.Dataset(data, coords=coords, attrs=result.attrs)
    out.attrs[FIELD_ATTR] = layout.to_json()
    out.attrs["field_masked"] = json.dumps(layout.masked)
    return out


def _scaled(result: xr.Dataset, pattern: np.ndarray) -> xr.Dataset:
    """The pattern's column (the last ``j``, :data:`PATTERN`) of every variable over ``j`` as
    ``pattern_<variable>``, and the components' columns of the constant forcing times ``f_j``
    (standard errors times ``|f_j|``): column ``j`` is the share of the pattern's response that
    the forcing at point ``j`` makes (they sum to ``pattern_response``)."""
    labels = [str(label) for label in result["j"].values]
    assert labels[-1] == PATTERN and len(labels) == pattern.size + 1
    columns = result.isel(j=slice(None, -1))
    f = xr.DataArray(pattern, dims=("j",), coords={"j": columns["j"].values})
    out = {}
    for key, var in result.data_vars.items():
        if "j" not in var.dims:
            out[key] = var
            continue
        out[f"pattern_{key}"] = var.isel(j=-1, drop=True)
        column = columns[key]
        unscaled = str(key).endswith(UNSCALED)
        out[key] = column if unscaled else column * (abs(f) if "stderr" in str(key) else f)
    scaled = xr.Dataset(out, coords=columns.coords, attrs=result.attrs)
    scaled.attrs["forcing"] = PATTERN
    return scaled
