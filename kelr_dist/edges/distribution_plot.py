"""The report's figure of a PDF response: how a step forcing moves a component's distribution.

For each forced component ``j`` of an estimate with ``observable="pdf"`` one figure, a row per
observed component: on the left a heat map of ``δp(x, t)``, the PDF's response to a unit step
forcing of ``j`` (``∫_0^t k_bj(s) ds / h``, eq. 4), in density per unit of ``x`` per unit forcing,
with ``x`` in data units; on the right, on the same ``x`` axis, the unperturbed PDF ``p0`` and the
predicted PDFs ``p0 + δf δp(x, t)`` at a few times with their error bands, for a step of forcing
of size ``δf`` chosen to move the PDF by a quarter of its peak (named in the title).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

from kelr_dist.edges.analysis import step
from kelr_dist.edges.distribution import (
    LinearRegimeWarning,
    distribution_record,
    predict_distribution,
)
from kelr_dist.edges.plotting import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: the shown forcing moves the PDF by this fraction of its peak at most: visible, and well inside
#: the linear regime where the prediction stays positive
SHOWN_CHANGE = 0.25
#: how an axis names the time unit of a result that records none
DATA_TIME_UNIT = "the data's time unit"
#: predicted PDFs drawn at these fractions of the largest lag
SHOWN_TIMES = (0.05, 0.2, 1.0)


def distribution_figures(ds: xr.Dataset) -> dict[str, Figure]:
    """``{"distribution_<j>.png": Figure}`` per forced component ``j`` of a ``pdf`` estimate
    (empty for any other result)."""
    if "distribution" not in ds.attrs or distribution_record(ds)["kind"] != "pdf":
        return {}
    return {f"distribution_{j}.png": plot_distribution(ds, str(j)) for j in ds["j"].values}


def plot_distribution(
    ds: xr.Dataset, forced: str, name: str = "response", figure: Figure | None = None
) -> Figure:
    """The figure of :mod:`this module <kelr_dist.edges.distribution_plot>` for forced component
    ``forced``; ``name`` the response variable shown. It is drawn into ``figure`` when given (an
    empty one, e.g. ``matplotlib.pyplot.figure(layout="constrained")``), else into a new figure
    with a row of 3.6 inches per component."""
    components = distribution_record(ds)["components"]
    fig = figure or new_figure(figsize=(10.5, 3.6 * len(components)), layout="constrained")
    axes = fig.subplots(len(components), 2, squeeze=False, width_ratios=(2.2, 1), sharey="row")
    times = ds["time"].values
    unit = step(1.0, times, j=forced)
    units = ds.attrs.get("time_units", "")
    predictions = []
    for component in components:
        with warnings.catch_warnings():  # a unit forcing may leave the linear regime: only δp
            warnings.simplefilter("ignore", LinearRegimeWarning)
            predictions.append(predict_distribution(ds, unit, component=component, name=name))
    # one forcing for every row: the largest that moves no component's PDF by more than
    # SHOWN_CHANGE of its peak
    amplitude = min(
        SHOWN_CHANGE * float(p["equilibrium"].max()) / (float(np.abs(p["perturbation"]).max()) or 1)
        for p in predictions
    )
    colours = ("tab:orange", "tab:red", "tab:purple")
    for row, component, per_unit in zip(axes, components, predictions, strict=True):
        delta = per_unit["perturbation"]
        x = delta["bin"].values
        p0 = per_unit["equilibrium"].values
        limit = float(np.abs(delta).max()) or 1.0
        heat = row[0].pcolormesh(
            times, x, delta.values.T, cmap="RdBu_r", vmin=-limit, vmax=limit, shading="gouraud"
        )
        bar = fig.colorbar(heat, ax=row[0], location="top", aspect=40, pad=0.01)
        bar.set_label(
            f"δp({component}, t) per unit step forcing of {forced} (density per unit {component})"
        )
        row[0].set_xlabel(f"time since the step ({units or DATA_TIME_UNIT})")
        row[0].set_ylabel(component)
        row[1].plot(p0, x, color="black", lw=2, label="unperturbed p0")
        for fraction, colour in zip(SHOWN_TIMES, colours, strict=True):
            n = int(round(fraction * (times.size - 1)))
            p = p0 + amplitude * delta.values[n]
            band = 2.0 * amplitude * per_unit["stderr"].values[n]
            row[1].plot(
                p,
                x,
                color=colour,
                lw=1.2,
                label=f"t = {times[n]:.3g}{f' {units}' if units else ''}",
            )
            row[1].fill_betweenx(x, p - band, p + band, color=colour, alpha=0.25, lw=0)
        row[1].set_xlabel(f"density per unit {component}")
        row[1].set_title(
            f"p({component}, t) after a step of forcing\n"
            f"δf = {amplitude:.3g} on {forced}, ±2 s.e.\n"
            f"(δf: each PDF moves ≤ {SHOWN_CHANGE:.0%} of its peak)",
            fontsize=9,
        )
        row[1].tick_params(labelleft=True)
        row[1].legend(fontsize=8, loc="best")
    return fig
