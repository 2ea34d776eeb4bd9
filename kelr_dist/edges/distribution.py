"""Responses of whole distributions: labelled families, and the PDF predicted under a forcing.

An estimate with a distribution observable (``observable="pdf"``, ``"moments"`` or
``"exceedance"``, :mod:`kelr_dist.kernels.observables.distribution`) records its grid in
``attrs["distribution"]``. :func:`distribution_response` reshapes the result's ``i`` dimension
into one component's family, labelled as xarray wants it: ``bin`` (bin centres in data units;
responses in density per unit), ``moment`` (1..4) or ``quantile`` (levels, with the thresholds in
data units). :func:`predict_distribution` turns a forcing history into the predicted PDF with its
error band (eq. 4, through :func:`kelr_dist.edges.analysis.predict_response`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Hashable
from typing import Any

import numpy as np
import xarray as xr

from kelr_dist.edges.analysis import ErrorModel, predict_response
from kelr_dist.kernels.observables.distribution import DistributionGrid, parse_distribution_spec

DIMS = {"pdf": "bin", "moments": "moment", "exceedance": "quantile"}


class LinearRegimeWarning(UserWarning):
    """The predicted PDF goes negative: the forcing is beyond the linear regime there."""


def distribution_record(result: xr.Dataset) -> dict[str, Any]:
    """The grid a distribution observable's estimate recorded (``attrs["distribution"]``)."""
    record = result.attrs.get("distribution")
    if record is None:
        raise ValueError(
            "the result holds no distribution observable (estimate it with observable='pdf', "
            "'moments' or 'exceedance')"
        )
    return json.loads(record) if isinstance(record, str) else dict(record)


def distribution_grid(result: xr.Dataset) -> DistributionGrid:
    """The estimate's distribution observable, to evaluate the same functions on other samples
    (``kelr_dist.kernels.observables.distribution.distribution_values(grid, x)``, ``x (n, d)``)."""
    record = distribution_record(result)
    spec = parse_distribution_spec(record["spec"])
    assert spec is not None
    coordinates = np.asarray(record["coordinates"], dtype=float)
    d = coordinates.shape[0]
    return DistributionGrid(
        spec,
        tuple(record["components"]),
        coordinates[:, 0] if spec.kind == "pdf" else np.zeros(d),
        np.asarray(record["bin_width"], dtype=float),
        np.asarray(record["mean"], dtype=float),
        coordinates if spec.kind == "exceedance" else np.zeros((d, len(spec.quantiles))),
        np.asarray(record["scale"], dtype=float),
        np.asarray(record["equilibrium"], dtype=float),
    )


def _component(record: dict[str, Any], component: Hashable | None) -> int:
    components = record["components"]
    if component is None:
        if len(components) != 1:
            raise ValueError(f"component: name one of {components}")
        return 0
    if component not in components:
        raise ValueError(f"component: expected one of {components}, got {component!r}")
    return components.index(component)


#: the error variables of a response that are labelled with it, per bin, moment or quantile
ERROR_SUFFIXES = ("_stderr", "_total_stderr", "_estimator_stderr", "_model_shift")


def distribution_response(
    result: xr.Dataset, component: Hashable | None = None, name: str = "response"
) -> xr.Dataset:
    """One component's distribution response, labelled.

    Parameters
    ----------
    result : an estimate with a distribution observable.
    component : the observed component (may be omitted for one-component data).
    name : the response variable (``response``, ``response_exact``, ...).

    Returns
    -------
    Dataset with ``response`` and its error bars ``(lag, <dim>, j)`` (``response_stderr``, and
    where the result has them ``response_total_stderr``, ``response_estimator_stderr`` and
    ``response_model_shift``), and ``equilibrium`` ``(<dim>,)``, where ``<dim>`` is ``bin``
    (coordinate: bin centres in data units; response and equilibrium in density per unit:
    ``k_b / h``, ``p0_b = Ā_b / h``), ``moment`` (1..4; the centred moments ``E[(x - μ)^k]``,
    ``μ`` in ``attrs["mean"]``) or ``quantile`` (levels; coordinate ``threshold`` in data units;
    the smoothed ``P(x > threshold)``, smoothing width ``attrs["width"]`` in data units).
    """
    record = distribution_record(result)
    c = _component(record, component)
    kind = record["kind"]
    dim = DIMS[kind]
    r = len(record["levels"])
    rows = slice(c * r, (c + 1) * r)
    scale = 1.0 / record["bin_width"][c] if kind == "pdf" else 1.0
    coords: dict[str, Any] = {dim: record["coordinates"][c] if kind == "pdf" else record["levels"]}
    extra = {}
    if kind == "exceedance":
        coords["threshold"] = (dim, record["coordinates"][c])
        extra["width"] = record["scale"][c]  # the steps' smoothing width in data units
    data: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
    for suffix in ("", *ERROR_SUFFIXES):
        key = name + suffix
        if key not in result:  # the estimator's and the total error exist for estimated scores
            continue
        values = result[key].transpose("lag", "i", "j").isel(i=rows).values * scale
        data["response" + key[len(name) :]] = (("lag", dim, "j"), values)
    data["equilibrium"] = ((dim,), np.asarray(record["equilibrium"][c]) * scale)
    coords.update(lag=result["lag"].values, j=result["j"].values)
    coords["time"] = ("lag", result["time"].values)
    units = "density per unit of x per unit forcing" if kind == "pdf" else "per unit forcing"
    out = xr.Dataset(data, coords=coords)
    out["response"].attrs["units"] = units
    out.attrs.update(
        kind=kind,
        component=record["components"][c],
        mean=record["mean"][c],
        bin_width=record["bin_width"][c],
        dt=result.attrs["dt"],
        spec=record["spec"],
        **extra,
    )
    return out


def predict_distribution(
    result: xr.Dataset,
    forcing: xr.DataArray,
    *,
    component: Hashable | None = None,
    name: str = "response",
    errors: ErrorModel = "bound",
) -> xr.Dataset:
    """The predicted PDF ``p(x, t) = p0(x) + δp(x, t)`` of one component under a forcing history.

    ``δp_b(t) = ∫_0^t Σ_j k_bj(t - s) δf_j(s) ds / h`` (eq. 4 with the bin observables, trapezoid
    rule, :func:`~kelr_dist.predict_response`); ``p0_b = Ā_b / h``. The bins
    partition unity, so ``Σ_b h p_b(t) = 1`` at every time, and ``integral`` checks it. Where
    ``p`` goes negative the forcing is beyond the linear regime: the values are kept as they are
    (never clipped), ``negative`` marks them, ``attrs["negative_from_time"]`` holds the first
    time (NaN when none) and a :class:`LinearRegimeWarning` says where.

    Parameters
    ----------
    result : an estimate with ``observable="pdf"``.
    forcing : a forcing history (:func:`kelr_dist.step`, :func:`kelr_dist.sampled`, ...) on the
        response's ``dt``.
    component : the component whose PDF is predicted (may be omitted for one component).
    name : the response variable to use (``response``, ``response_exact``, ...).
    errors : ``"bound"`` or ``"independent"`` (``kelr_dist.edges.analysis``).

    Returns
    -------
    Dataset on ``(time, bin)``, ``bin`` the bin centres in data units: ``pdf`` (``p0 + δp``),
    ``perturbation`` (``δp``), ``stderr`` (of ``δp``, the error band), ``negative`` (bool),
    ``equilibrium`` ``p0 (bin)`` and ``integral (time)`` (``Σ_b h p_b``).
    """
    labelled = distribution_response(result, component, name)
    if labelled.attrs["kind"] != "pdf":
        raise ValueError(
            f"predict_distribution needs a result with observable='pdf', got "
            f"{labelled.attrs['spec']!r}"
        )
    k = labelled["response"].rename(bin="i")
    stderr = labelled["response_stderr"].rename(bin="i")
    k.attrs["dt"] = stderr.attrs["dt"] = labelled.attrs["dt"]
    delta = predict_response(k, forcing, stderr=stderr, errors=errors)
    delta = delta.rename(i="bin")
    p0 = labelled["equilibrium"]
    pdf = p0 + delta.drop_vars("stderr")
    h = labelled.attrs["bin_width"]
    negative = pdf < 0
    out = xr.Dataset(
        {
            "pdf": pdf,
            "perturbation": delta.drop_vars("stderr"),
            "stderr": delta["stderr"],
            "negative": negative,
            "equilibrium": p0,
            "integral": (pdf * h).sum("bin"),
        }
    )
    out["pdf"].attrs["units"] = "density per unit of x"
    times = out["time"].values[negative.any("bin").values]
    first = float(times.min()) if times.size else np.nan
    out.attrs.update({**labelled.attrs, "errors": errors, "negative_from_time": first})
    if np.isfinite(first):
        where = out["bin"].values[negative.sel(time=first).values]
        warnings.warn(
            f"the predicted PDF of {labelled.attrs['component']} goes negative from time "
            f"{first:g} (at x = {where.min():.4g}..{where.max():.4g}): the forcing is beyond the "
            "linear regime there (values kept, 'negative' marks them)",
            LinearRegimeWarning,
            stacklevel=2,
        )
    return out
