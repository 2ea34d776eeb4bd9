"""Fields: a variable with one time dim and any spatial dims, stacked into components and back.

A climate variable ``(time, lat, lon)`` or ``(time, level, lat, lon)`` is a trajectory whose
components are its grid points. :func:`stacked` turns such a variable (in a ``Dataset`` or as a
``DataArray``) into the store layout ``(time, component)`` (``(chain, time, component)`` with a
``chain`` dim), lazily for dask-backed data:

- the time dim is the one dim named ``time``, or else the one dim whose coordinate is a date or a
  duration or says ``axis = "T"`` / ``standard_name = "time"`` (renamed ``time``); two
  candidates are refused naming them (and a variable without any is refused by the store
  layout's checks, naming its dims);
- every other dim (``chain`` apart) is a spatial dim, stacked in its order (the last varies
  fastest); each point is a component named ``lat=10.0,lon=40.0``, and the spatial coordinates
  (and any coordinate over the spatial dims, e.g. an area) ride along as coordinates of
  ``component``;
- points that are NaN at every time (a land mask) are dropped and named in
  ``attrs["field"]`` (:class:`FieldLayout`); a point NaN at some times only (a mask that changes
  in time, or missing values) is refused, naming it. This check reads the field once.

:class:`FieldLayout` (JSON in ``attrs["field"]``) unstacks the result's ``i`` and ``j`` back into
labelled dims ``i_lat, i_lon, j_lat, j_lon`` (NaN at masked points) and stacks them again for
the post-analysis (:mod:`kelr_dist.edges.analysis`).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

#: the dims of the store layout; any other dim of a variable makes it a field
LAYOUT_DIMS = ("chain", "time", "component")
#: attribute of a stacked trajectory (and of its result) holding the field's layout as JSON
FIELD_ATTR = "field"
#: most masked or partly missing points a message lists
SHOWN_POINTS = 5


class FieldError(ValueError):
    """A field that cannot be stacked (message names the store, the variable and the problem)."""


def _error(source: str, variable: str, problem: str) -> FieldError:
    return FieldError(f"store {source!r}, variable {variable!r}: {problem}")


def is_field(da: xr.DataArray) -> bool:
    """Whether ``da`` is a field: a dim beyond ``chain``, ``time`` and ``component``, no
    ``component`` dim, and a time dim (:func:`time_candidates`). Anything else is left to the
    store layout's checks (which refuse an array without a time dim, naming its dims)."""
    return (
        "component" not in da.dims
        and any(dim not in LAYOUT_DIMS for dim in da.dims)
        and bool(time_candidates(da))
    )


def _is_time_coordinate(da: xr.DataArray, dim: Hashable) -> bool:
    if dim not in da.coords:
        return False
    coord = da.coords[dim]
    clock = np.issubdtype(coord.dtype, np.datetime64) or np.issubdtype(coord.dtype, np.timedelta64)
    cf = coord.attrs.get("axis") == "T" or coord.attrs.get("standard_name") == "time"
    return clock or cf or " since " in str(coord.attrs.get("units", ""))


def time_candidates(da: xr.DataArray) -> list[str]:
    """The dims of ``da`` that may be its time: named ``time``, or with a coordinate that is a
    date or a duration, says ``axis="T"``/``standard_name="time"`` or has CF ``units``
    ``"... since ..."``."""
    return [str(d) for d in da.dims if d == "time" or _is_time_coordinate(da, d)]


def point_name(dims: Sequence[str], values: Sequence[Any]) -> str:
    """The component name of a grid point: ``"lat=10.0,lon=40.0"``."""
    return ",".join(f"{d}={_label(v)}" for d, v in zip(dims, values, strict=True))


def _label(value: Any) -> str:
    value = value.item() if isinstance(value, np.generic) else value
    return str(value)


def _jsonable(values: np.ndarray) -> list[Any]:
    if np.issubdtype(values.dtype, np.datetime64) or np.issubdtype(values.dtype, np.timedelta64):
        return [str(v) for v in values]
    return values.tolist()


@dataclass(frozen=True)
class FieldLayout:
    """A field's grid: spatial ``dims``, their ``coords`` (values along each), and which points
    are components (``kept``, flat over the grid in C order); ``masked`` names the others."""

    dims: tuple[str, ...]
    coords: dict[str, list[Any]]
    kept: tuple[bool, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(self.coords[d]) for d in self.dims)

    def names(self) -> list[str]:
        """Names of every point of the grid, C order."""
        axes = (np.asarray(self.coords[d], dtype=object) for d in self.dims)
        grids = np.meshgrid(*axes, indexing="ij")
        return [point_name(self.dims, p) for p in zip(*(g.ravel() for g in grids), strict=True)]

    @property
    def components(self) -> list[str]:
        """Names of the points that are components."""
        return [n for n, k in zip(self.names(), self.kept, strict=True) if k]

    @property
    def masked(self) -> list[str]:
        """Names of the masked (dropped) points."""
        return [n for n, k in zip(self.names(), self.kept, strict=True) if not k]

    def to_json(self) -> str:
        return json.dumps({"dims": list(self.dims), "coords": self.coords, "kept": self.kept})

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> FieldLayout | None:
        """The layout in ``attrs["field"]``, None when there is none."""
        text = attrs.get(FIELD_ATTR)
        if not isinstance(text, str):
            return None
        record = json.loads(text)
        return cls(tuple(record["dims"]), record["coords"], tuple(bool(k) for k in record["kept"]))

    def grid_coords(self, prefix: str = "") -> dict[str, Any]:
        """The grid's coordinates, each dim named ``prefix + dim``."""
        return {f"{prefix}{d}": np.asarray(self.coords[d]) for d in self.dims}

    def unstack(self, da: xr.DataArray, dim: str, prefix: str) -> xr.DataArray:
        """``da`` with its ``dim`` (labelled by :attr:`components`) spread over the grid as dims
        ``prefix + d`` for each spatial ``d`` (NaN at masked points; False or 0 for bool or
        integer values such as block sizes)."""
        axis = da.dims.index(dim)
        values = np.asarray(da.values)
        kind = values.dtype.kind
        fill: Any = {"b": False, "i": 0, "u": 0}.get(kind, np.nan)
        dtype = values.dtype if kind in "biu" else np.result_type(values, np.float64)
        shape = (*values.shape[:axis], len(self.kept), *values.shape[axis + 1 :])
        full = np.full(shape, fill, dtype=dtype)
        index: list[Any] = [slice(None)] * values.ndim
        index[axis] = np.flatnonzero(self.kept)
        full[tuple(index)] = values
        full = full.reshape((*values.shape[:axis], *self.shape, *values.shape[axis + 1 :]))
        dims = (*da.dims[:axis], *(f"{prefix}{d}" for d in self.dims), *da.dims[axis + 1 :])
        coords = {k: v for k, v in da.coords.items() if dim not in v.dims}
        return xr.DataArray(
            full, dims=dims, coords={**coords, **self.grid_coords(prefix)}, attrs=da.attrs
        )

    def stack(self, da: xr.DataArray, prefix: str, dim: str) -> xr.DataArray:
        """The inverse of :meth:`unstack`: the dims ``prefix + d`` of ``da`` stacked into
        ``dim``, masked points left out, labelled by :attr:`components`."""
        spread = [f"{prefix}{d}" for d in self.dims]
        rest = [d for d in da.dims if d not in spread]
        first = min(da.dims.index(d) for d in spread)
        order = [*rest[:first], *spread, *rest[first:]]
        values = np.asarray(da.transpose(*order).values)
        flat = values.reshape((*values.shape[:first], -1, *values.shape[first + len(spread) :]))
        index: list[Any] = [slice(None)] * flat.ndim
        index[first] = np.flatnonzero(self.kept)
        dims = (*rest[:first], dim, *rest[first:])
        coords = {k: v for k, v in da.coords.items() if not set(v.dims) & set(spread)}
        return xr.DataArray(
            flat[tuple(index)], dims=dims, coords={**coords, dim: self.components}, attrs=da.attrs
        )

    def on_components(self, da: xr.DataArray) -> xr.DataArray:
        """``da`` with its ``i_<dim>``/``j_<dim>`` dims (all of either) stacked back into ``i``
        and ``j`` (:meth:`stack`); as it is without them."""
        for dim in ("i", "j"):
            if all(f"{dim}_{d}" in da.dims for d in self.dims):
                da = self.stack(da, f"{dim}_", dim)
        return da

    def on_grid(self, da: xr.DataArray, prefixes: dict[str, str]) -> xr.DataArray:
        """``da`` with each dim of ``prefixes`` whose labels are the :attr:`components` spread
        over the grid as ``prefix + <grid dim>`` (:meth:`unstack`), and so the coordinates
        along it; the other dims as they are."""
        components = self.components
        for dim, prefix in prefixes.items():
            if dim not in da.dims or [str(c) for c in da[dim].values] != components:
                continue
            along = [k for k, c in da.coords.items() if dim in c.dims and k != dim]
            spread = {k: self.unstack(da[k].drop_vars(along), dim, prefix).variable for k in along}
            da = self.unstack(da, dim, prefix).assign_coords(spread)
        return da


def on_components(ds: xr.Dataset) -> xr.Dataset:
    """A field's result with its ``i_<dim>``/``j_<dim>`` dims stacked back into ``i`` and ``j``
    over the points that are components (:meth:`FieldLayout.on_components`), as the report
    reads a result; any other result as it is."""
    layout = FieldLayout.from_attrs(ds.attrs)
    if layout is None:
        return ds
    data = {key: layout.on_components(var) for key, var in ds.data_vars.items()}
    spread = {f"{dim}_{d}" for dim in ("i", "j") for d in layout.dims}
    coords = {k: v for k, v in ds.coords.items() if not spread & set(v.dims)}
    return xr.Dataset(data, coords=coords, attrs=ds.attrs)


def stacked(obj: xr.Dataset | xr.DataArray, variable: str, source: str) -> Any:
    """``obj`` with its field variable stacked into components (see the module docstring), the
    layout in the variable's ``attrs["field"]``; ``obj`` itself when the variable is not a
    field (or is missing: the store's checks name that).

    Raises
    ------
    FieldError
        two candidate time dims, every point masked, or a point that is NaN at some times only
        (named, with how often).
    """
    if isinstance(obj, xr.Dataset) and variable not in obj.data_vars:
        return obj
    da = obj[variable] if isinstance(obj, xr.Dataset) else obj
    if not isinstance(da, xr.DataArray) or not is_field(da):
        return obj
    name = str(da.name) if isinstance(obj, xr.DataArray) and da.name is not None else variable
    candidates = time_candidates(da)
    if len(candidates) > 1:
        raise _error(
            source,
            name,
            f"{len(candidates)} candidate time dims {tuple(candidates)} (named 'time', or with "
            "a date coordinate, axis='T' or standard_name='time'): keep one, e.g. "
            f"da.isel({candidates[-1]}=0)",
        )
    time = candidates[0]
    if time != "time":
        da = da.rename({time: "time"})
    if da.chunks is None:  # read once, here: the mask and the samples come from the same read
        da = da.compute()
    spatial = tuple(str(d) for d in da.dims if d not in ("chain", "time"))
    lead = ("chain", "time") if "chain" in da.dims else ("time",)
    da = da.transpose(*lead, *spatial)
    layout = _layout(da, spatial, source, name)
    flat = da.data.reshape((*da.shape[: len(lead)], -1))
    kept = np.flatnonzero(layout.kept)
    coords = {k: v for k, v in da.coords.items() if set(v.dims) <= set(lead)}
    # the spatial coordinates (lat, lon) and any other over the grid (an area) per component
    on_points = {
        str(k): ("component", _broadcast(v, [da.sizes[d] for d in spatial], spatial)[kept])
        for k, v in da.coords.items()
        if v.dims and set(v.dims) <= set(spatial)
    }
    out = xr.DataArray(
        flat[..., kept],
        dims=(*lead, "component"),
        coords={**coords, **on_points, "component": layout.components},
        attrs={**da.attrs, FIELD_ATTR: layout.to_json()},
        name=da.name,
    )
    out.encoding = dict(da.encoding)
    if isinstance(obj, xr.DataArray):
        return out
    ds = xr.Dataset({variable: out}, attrs=obj.attrs)
    ds.encoding = dict(obj.encoding)
    return ds


def _broadcast(coord: xr.DataArray, shape: Sequence[int], spatial: Sequence[str]) -> np.ndarray:
    """A coordinate over some of the spatial dims (of sizes ``shape``), over all of them, flat
    in C order."""
    values = np.asarray(coord.transpose(*[d for d in spatial if d in coord.dims]).values)
    sizes = [n if d in coord.dims else 1 for d, n in zip(spatial, shape, strict=True)]
    expanded = values.reshape(sizes)
    return np.broadcast_to(expanded, tuple(shape)).reshape(-1)


def _layout(da: xr.DataArray, spatial: tuple[str, ...], source: str, name: str) -> FieldLayout:
    """The grid and its mask from one read of the field: the points NaN at every time are
    masked; a point NaN at some times only is refused."""
    lead = tuple(range(da.ndim - len(spatial)))
    missing = np.isnan(da.data).sum(axis=lead) if np.issubdtype(da.dtype, np.floating) else None
    times = int(np.prod(da.shape[: len(lead)]))
    if missing is None:
        count = np.zeros(da.shape[len(lead) :], dtype=np.int64)
    else:
        count = np.asarray(missing.compute() if hasattr(missing, "compute") else missing)
    coords = {
        d: _jsonable(np.asarray(da[d].values)) if d in da.coords else list(range(da.sizes[d]))
        for d in spatial
    }
    layout = FieldLayout(spatial, coords, tuple(bool(c == 0) for c in count.reshape(-1)))
    partly = np.flatnonzero((count.reshape(-1) > 0) & (count.reshape(-1) < times))
    if partly.size:
        names = layout.names()
        shown = ", ".join(
            f"{names[p]} ({int(count.reshape(-1)[p])} of {times} times)"
            for p in partly[:SHOWN_POINTS]
        )
        more = f" and {partly.size - SHOWN_POINTS} more" if partly.size > SHOWN_POINTS else ""
        raise _error(
            source,
            name,
            f"{partly.size} grid point(s) are NaN at some times only: {shown}{more}; a masked "
            "point must be NaN at every time (fill the gaps or mask the point)",
        )
    if not any(layout.kept):
        raise _error(source, name, "every grid point is NaN at every time: nothing to estimate")
    return layout
