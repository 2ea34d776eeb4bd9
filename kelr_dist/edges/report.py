"""Reports on a result of :func:`~kelr_dist.estimate_response`: a table and figures.

- :func:`summary` — the terminal table of ``kelr report``: the estimator used and why, basis,
  order ``M`` / degree ``q``, threshold ``δ``, rejection rate ``R_M``, whether the error bars'
  block averaging converged, run time, the lag-0 Stein residual of every estimate in standard
  errors and, when the result holds ``response_exact``, the errors of every estimate against it
  (:func:`response_errors`); responses always in the order of :func:`response_names`.
- :func:`headline` — the few lines ``kelr estimate`` prints: where the result went, estimator
  and order/degree, largest standard error, largest Stein residual in standard errors.
- :func:`write_figures` — PNG figures (matplotlib, Agg canvas; no pyplot state):
  ``selection.png`` (held-out loss of every candidate against its order/degree, the choice
  marked), ``criteria.png`` (``η_M``, ``R_M``, ``δ_M`` against ``M``, eqs. 52–54),
  ``response.png`` (every entry ``k_ij(t)`` of eq. 5, every estimate with its
  sampling-error band, and the exact FDT where present; raw values, as estimated) and
  ``density.png`` (the estimated
  ``p_M`` of eq. 40: marginals, and for ``d = 2`` a map; where the store came from a built-in
  model, the true ``p_eq`` normalised on the same grid and the absolute error map, as in the
  paper's Figure fig:p_tri) and, for a result on a declared ring or grid
  (``attrs["lattice"]``), ``response_distance.png`` (the mean of ``k_ij(t)`` over the pairs at
  each lattice distance, :func:`plot_lattice_response`).
"""

from __future__ import annotations

import math
import os
import re
import textwrap
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import xarray as xr

from kelr_dist.data.fields import on_components
from kelr_dist.data.store import cut_attr, parse_json_attr
from kelr_dist.edges.analysis import is_estimate, normalized
from kelr_dist.edges.distribution_plot import distribution_figures
from kelr_dist.edges.plotting import new_figure
from kelr_dist.kernels.response.operator import relative_to_lag0

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: estimates compared with ``response_exact``: variable -> label (``response`` is labelled
#: with the estimator it came from, see :func:`label`)
ESTIMATES = {
    "response": "automatic",
    "response_kernel_embedding": "kernel embedding",
    "response_score_matching": "score matching",
    "response_kde": "KDE",
    "response_gaussian": "quasi-Gaussian",
}
#: errors against the exact response are taken over lags with ``time <= ERROR_HORIZON``
ERROR_HORIZON = 10.0
#: characters per line of a figure's title (the criteria figure's reason is wrapped, not clipped)
TITLE_WIDTH = 130
#: most characters of a model's name the report's table shows (a store's attribute can be long)
SHOWN_MODEL = 120
#: grid points per axis of the density figure, by dimension (at most ~2e5 points)
DENSITY_GRID = {1: 400, 2: 161, 3: 41}
# the density figure shows where the marginal exceeds this fraction of its maximum
_SHOWN_FRACTION = 1e-3
_STYLE: dict[str, dict[str, Any]] = {
    "response": {"color": "C0", "linestyle": "-"},
    "response_kernel_embedding": {"color": "C4", "linestyle": "-."},
    "response_score_matching": {"color": "C4", "linestyle": "-."},
    "response_kde": {"color": "C1", "linestyle": "--"},
    "response_gaussian": {"color": "C2", "linestyle": ":"},
    "response_exact": {"color": "black", "linestyle": "-", "linewidth": 0.9},
}


def label(ds: xr.Dataset, name: str) -> str:
    """Legend/table label of response variable ``name``."""
    if name == "response":
        return str(ds.attrs.get("estimator", "kernel embedding")).replace("-", " ")
    return "exact FDT" if name == "response_exact" else ESTIMATES.get(name, name)


def open_result(path: str | os.PathLike[str]) -> xr.Dataset:
    """Open a result written by :func:`kelr_dist.pipeline.result.write_result` (zarr or ``.nc``).

    Raises
    ------
    ValueError
        the path does not exist, cannot be read, or holds no ``response(lag, i, j)``.
    """
    source = os.fspath(path)
    if not Path(source).exists():
        raise ValueError(f"result {source!r} does not exist")
    try:
        if source.endswith(".nc"):
            ds = xr.load_dataset(source)
        else:
            ds = xr.open_zarr(source, consolidated=False).load()
    except Exception as err:  # xarray/zarr/netCDF raise many types for "not readable"
        raise ValueError(
            f"result {source!r} is not a readable result ({type(err).__name__}: {err})"
        ) from None
    ds = on_components(ds)
    if "response" not in ds or set(ds["response"].dims) != {"lag", "i", "j"}:
        raise ValueError(f"result {source!r} holds no variable response(lag, i, j)")
    return ds


def chosen_order(ds: xr.Dataset) -> int | tuple[int, ...] | None:
    """The order ``M`` the estimate used (``attrs["order"]``: a number or a list; JSON text in
    results of earlier versions), or None if absent."""
    value = ds.attrs.get("order")
    if isinstance(value, str):
        value = parse_json_attr(value, "order")
    if value is None:
        return None
    if np.ndim(value) > 0:
        return tuple(int(v) for v in np.asarray(value).ravel())
    return int(value)


def response_names(ds: xr.Dataset) -> list[str]:
    """The response estimates of a result in one fixed order: the chosen estimate, the other
    estimator, the baselines (:data:`ESTIMATES`), the exact FDT, then any others by name."""
    present = [str(name) for name in ds.data_vars if is_estimate(ds, name)]
    fixed = [*ESTIMATES, "response_exact"]
    return [n for n in fixed if n in present] + sorted(n for n in present if n not in fixed)


def convergence(ds: xr.Dataset, name: str = "response") -> tuple[int, int, int, int] | None:
    """The blocking of ``name``'s error bars: ``(unconverged entries, entries, smallest and
    largest block size)``, or None for a result without ``<name>_converged``."""
    if f"{name}_converged" not in ds:
        return None
    converged = np.asarray(ds[f"{name}_converged"].values, dtype=bool)
    sizes = np.asarray(ds[f"{name}_block_size"].values) if f"{name}_block_size" in ds else None
    low, high = (int(sizes.min()), int(sizes.max())) if sizes is not None else (0, 0)
    return int((~converged).sum()), int(converged.size), low, high


def _convergence_text(ds: xr.Dataset) -> str:
    state = convergence(ds)
    if state is None:
        return "-"
    bad, total, low, high = state
    blocks = f"block size {low}" if low == high else f"block sizes {low}..{high}"
    if bad == 0:
        return f"converged for all {total} entries ({blocks})"
    return (
        f"NOT converged for {bad} of {total} entries ({blocks}): those error bars are too "
        "small (chains short against the correlation time)"
    )


def response_errors(ds: xr.Dataset, horizon: float = ERROR_HORIZON) -> dict[str, dict[str, float]]:
    """Errors of every estimate against ``response_exact`` (the same samples, exact score).

    For each estimate in :data:`ESTIMATES` present: the maximum over lags with
    ``time <= horizon`` of ``|k - k_exact|`` over the diagonal entries (positions ``p`` of
    ``i`` and ``j``) and over the off-diagonal entries (``nan`` when there are none), and the
    largest standard error of the estimate over the same lags.

    Returns
    -------
    ``{variable: {"all": ..., "diagonal": ..., "off_diagonal": ..., "stderr": ...}}`` (``all``:
    over every entry); empty without ``response_exact``.
    """
    if "response_exact" not in ds:
        return {}
    lags = ds["time"].values <= horizon
    exact = ds["response_exact"].transpose("lag", "i", "j").values[lags]
    q, d = exact.shape[1:]
    diagonal = np.zeros((q, d), dtype=bool)
    diagonal[np.arange(min(q, d)), np.arange(min(q, d))] = True
    errors = {}
    for name in response_names(ds):
        if name == "response_exact":
            continue
        error = np.abs(ds[name].transpose("lag", "i", "j").values[lags] - exact).max(axis=0)
        stderr = ds.get(f"{name}_stderr")
        errors[name] = {
            "all": float(error.max()),
            "diagonal": float(error[diagonal].max()),
            "off_diagonal": float(error[~diagonal].max()) if (~diagonal).any() else math.nan,
            "stderr": math.nan if stderr is None else float(stderr.values[lags].max()),
        }
    return errors


def _short(text: str) -> str:
    """Numbers in ``text`` to 4 significant digits (long basis specs on one line)."""
    return re.sub(r"-?\d+\.\d+(?:e[-+]?\d+)?", lambda m: f"{float(m.group()):.4g}", text)


def _number(value: float) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.3g}"


def _unit(ds: xr.Dataset) -> str:
    """`` s`` after a time where the result knows its unit (``attrs["time_units"]``: seconds
    from dates), else nothing."""
    units = ds.attrs.get("time_units")
    return f" {units}" if units else ""


def warning_lines(ds: xr.Dataset) -> list[str]:
    """The warnings the estimate raised, one line each as ``"Category: message"``
    (``attrs["warnings"]``), or ``["none"]``."""
    lines = [line for line in str(ds.attrs.get("warnings", "")).splitlines() if line.strip()]
    return lines or ["none"]


def _estimator_line(ds: xr.Dataset) -> str:
    """The estimator used and why (the held-out losses when chosen automatically)."""
    a = ds.attrs
    used = str(a.get("estimator", "kernel-embedding"))
    if a.get("estimator_selection") != "auto" or "candidate_loss" not in ds:
        return f"{used} (given)"
    chosen = ds["candidate_chosen"].values.astype(bool)
    estimators = np.array([str(v) for v in ds["candidate_estimator"].values])
    losses = ds["candidate_loss"].values
    other = [
        float(np.nanmin(losses[(estimators == e) & np.isfinite(losses)]))
        for e in ("kernel-embedding", "score-matching")
        if e != used and ((estimators == e) & np.isfinite(losses)).any()
    ]
    versus = f" vs {other[0]:.4g} for the other" if other else ""
    return f"{used} (auto: held-out Hyvärinen loss {float(losses[chosen][0]):.4g}{versus})"


#: a corrected lag-0 Stein residual below this many standard errors is 0 by construction (the
#: observable affine in x, the forcing constant: the correction enforces the identity exactly)
EXACT_RATIO = 1e-6
#: how the table and the response figure print such a residual (the headline says it in words)
BY_CONSTRUCTION = "0 (by construction)"


#: what the table prints for a share of ``k(0)`` that is not defined: no observable row's
#: ``k(0)`` is away from 0 (:func:`~kelr_dist.kernels.response.operator.relative_to_lag0`)
NO_SHARE = "—"


class SteinFigures(NamedTuple):
    """The lag-0 self-check of one response variable (:func:`stein_rows`)."""

    residual: float  #: the largest |lag-0 Stein residual|
    ratio: float  #: the largest |residual| / stderr over the entries
    raw_ratio: float  #: that ratio before the Stein correction (NaN: not corrected)
    raw_share: float  #: the largest uncorrected |residual| as a fraction of k(0) in its row
    #: (over the rows whose k(0) is away from 0, :func:`relative_to_lag0`; NaN when there is none)


def stein_rows(ds: xr.Dataset) -> dict[str, SteinFigures]:
    """Per response variable, its :class:`SteinFigures`."""
    out = {}
    for response in response_names(ds):
        name = "stein_residual" + response[len("response") :]
        if name not in ds or f"{name}_stderr" not in ds:
            continue
        raw = f"{name}_uncorrected"
        share = math.nan
        if raw in ds:
            lag0 = ds[response].transpose("lag", "i", "j").isel(lag=0).values
            stderr = (
                ds[f"{response}_stderr"].transpose("lag", "i", "j").isel(lag=0).values
                if f"{response}_stderr" in ds
                else None
            )
            shares = relative_to_lag0(ds[raw].transpose("i", "j").values, lag0, stderr)
            if np.isfinite(shares).any():
                share = float(np.nanmax(shares))
        out[response] = SteinFigures(
            float(np.nanmax(np.abs(ds[name].values))),
            _largest_ratio(ds, name),
            _largest_ratio(ds, raw),
            share,
        )
    return out


def _percent(share: float) -> str:
    """A share (a fraction) as a percentage of at most 7 characters; :data:`NO_SHARE` for NaN."""
    if not math.isfinite(share):
        return NO_SHARE
    return f"{100 * share:.1f}%" if 100 * share < 999.95 else f"{100 * share:.2g}%"


def _uncorrected(ratio: float) -> str:
    """The uncorrected residual in stderr; :data:`BY_CONSTRUCTION` below :data:`EXACT_RATIO`
    (an estimator exact for this observable and forcing without the correction too)."""
    return BY_CONSTRUCTION if ratio < EXACT_RATIO else _number(ratio)


def _share_text(share: float) -> str:
    """`` = 4.0% of k(0)``, or nothing where the share is not defined (:func:`relative_to_lag0`)."""
    return f" = {_percent(share)} of k(0)" if math.isfinite(share) else ""


def _columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A table: the first column left-aligned, the others right-aligned, each as wide as its
    widest cell and two spaces apart (cells never run together)."""
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = f"  {cells[0]:<{widths[0]}}"
        return first + "".join(f"  {c:>{w}}" for c, w in zip(cells[1:], widths[1:], strict=True))

    return [line(header), *(line(r) for r in rows)]


def _largest_ratio(ds: xr.Dataset, name: str) -> float:
    """``max |ds[name]| / ds[name_stderr]`` over the entries (NaN when absent)."""
    if name not in ds:
        return math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.nanmax(np.abs(ds[name].values) / ds[f"{name}_stderr"].values))


def _order_text(ds: xr.Dataset) -> str:
    """``order M = 56 (auto)`` / ``degree q = 3`` of the estimator used."""
    a = ds.attrs
    if str(a.get("estimator", "kernel-embedding")) == "score-matching" and "degree" in a:
        return f"degree q = {a['degree']}"
    if "order" in a:
        return f"order M = {chosen_order(ds)} ({a.get('order_selection', '?')})"
    return "-"


def headline(ds: xr.Dataset, name: str) -> str:
    """What ``kelr estimate`` prints: where the result went and its headline numbers (the
    whole table is ``kelr report``'s)."""
    ds = on_components(ds)
    stderr = float(ds["response_stderr"].max()) if "response_stderr" in ds else math.nan
    stein = stein_rows(ds).get("response")
    if stein is None:
        bias = "-"
    elif stein.ratio < EXACT_RATIO and not stein.raw_ratio >= EXACT_RATIO:
        bias = (
            "0 by construction (this estimator satisfies the lag-0 identity exactly for this "
            "observable and forcing): no lag-0 evidence either way; the held-out choice and "
            "the families' disagreement are the checks"
        )
    elif math.isfinite(stein.raw_ratio) and stein.ratio < EXACT_RATIO:
        bias = (
            f"0 after the affine Stein correction (exact by construction for this observable "
            f"and forcing); before it {_number(stein.raw_ratio)} stderr"
            f"{_share_text(stein.raw_share)}"
            " (the score estimate's own bias at lag 0)"
        )
    else:
        bias = (
            f"{_number(stein.ratio)} (the largest lag-0 Stein residual in standard errors: the "
            "estimator's bias at lag 0"
            + (
                f"; {_number(stein.raw_ratio)} before the Stein correction"
                if math.isfinite(stein.raw_ratio)
                else ""
            )
            + ")"
        )
    rows = [
        ("wrote", name),
        ("estimator", f"{ds.attrs.get('estimator', '?')}, {_order_text(ds)}"),
        ("max stderr", f"{_number(stderr)} (sampling error; blocking {_convergence_text(ds)})"),
        ("Stein/stderr", bias),
        ("details", f"kelr report {name} [--figures DIR]"),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def summary(ds: xr.Dataset, name: str | None = None) -> str:
    """The report table of a result (several lines, no trailing newline)."""
    ds = on_components(ds)
    a = ds.attrs
    origin = f"model {cut_attr(a['model'], SHOWN_MODEL)}, " if "model" in a else ""
    t_max = float(ds["time"].values[-1])
    rows = [
        ("result", name or a.get("store", "")),
        (
            "trajectory",
            f"{a.get('store', '?')} ({origin}{a.get('chains', '?')} chain(s), "
            f"{a.get('n_samples', '?')} samples, dt {a.get('dt', '?')}{_unit(ds)})",
        ),
        ("estimator", _estimator_line(ds)),
        (
            "observable",
            f"A = {a.get('observable', 'identity')}, forcing c = {a.get('forcing', 'constant')}",
        ),
        ("basis", _short(str(a.get("basis", "?")))),
    ]
    if "reduce" in a:  # the EOF route (kelr_dist.pipeline.eof)
        rows.append(
            (
                "reduced",
                f"{a['reduce']} (explaining {float(a['explained_variance']):.1%} of the variance): "
                "the projected dynamics' response, lifted back to the components",
            )
        )
    rows += [("periodic", line) for line in periodic_lines(ds)]
    if "order" in a:
        rows += [
            ("index set", f"{a.get('index_set', '?')}, max order {a.get('max_order', '?')}"),
            ("order M", f"{chosen_order(ds)} ({a.get('order_selection', '?')})"),
            ("delta", f"{_number(a.get('delta', math.nan))} ({a.get('delta_rule', '?')})"),
        ]
    if "degree" in a:
        rows.append(
            ("degree q", f"{a['degree']} (ridge {a.get('ridge', 0):g}, max {a.get('max_degree')})")
        )
    if "estimator_disagreement" in a:
        rows.append(
            (
                "families",
                f"kernel embedding and score matching differ by up to "
                f"{float(a['estimator_disagreement']):.1f} stderr (estimator_disagreement)",
            )
        )
    rows += [
        ("rejection", _number(a.get("rejection", math.nan))),
        ("lags", f"0..{ds.sizes['lag'] - 1} (t <= {t_max:.4g})"),
        ("responses", ", ".join(response_names(ds))),
        ("error bars", _convergence_text(ds)),
        ("run time", f"{float(a.get('runtime_seconds', math.nan)):.1f} s"),
    ]
    rows += [("warning", line) for line in warning_lines(ds)]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    stein = stein_rows(ds)
    if stein:
        lines.append(
            "lag-0 Stein residual k(0) - E[d_j(c_j A_i)] (estimator bias; 0 for the true score;"
            " 'uncorrected': before the Stein correction, in stderr and in % of k(0)):"
        )
        cells = []
        for variable, figures in stein.items():
            corrected = math.isfinite(figures.raw_ratio)
            exact = figures.ratio < EXACT_RATIO  # as the headline: "0 by construction"
            cells.append(
                [
                    label(ds, variable),
                    BY_CONSTRUCTION if exact else _number(figures.residual),
                    "0" if exact else _number(figures.ratio),
                    _uncorrected(figures.raw_ratio) if corrected else "-",
                    _percent(figures.raw_share) if corrected else "-",
                ]
            )
        header = ["estimate", "max |residual|", "in stderr", "uncorrected", "% of k(0)"]
        table = _columns(header, cells)
        flags = ["  biased beyond its error bars" if f.ratio > 3 else "" for f in stein.values()]
        lines += [table[0], *(row + flag for row, flag in zip(table[1:], flags, strict=True))]
    errors = response_errors(ds)
    if errors:
        horizon = min(ERROR_HORIZON, t_max)
        lines.append(f"errors vs exact FDT, max over t <= {horizon:.4g} of |k - k_exact|:")
        if _distribution_kind(ds) is not None:  # bins, moments: no diagonal to speak of
            cells = [
                [label(ds, v), _number(e["all"]), _number(e["stderr"])] for v, e in errors.items()
            ]
            lines += _columns(["estimate", "every entry", "max stderr"], cells)
        else:
            cells = [
                [
                    label(ds, v),
                    _number(e["diagonal"]),
                    _number(e["off_diagonal"]),
                    _number(e["stderr"]),
                ]
                for v, e in errors.items()
            ]
            lines += _columns(["estimate", "diagonal", "off-diagonal", "max stderr"], cells)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------------


def _positive(values: np.ndarray) -> np.ndarray:
    """``values`` with non-positive entries masked (NaN) for a log axis."""
    values = np.asarray(values, dtype=float)
    return np.where(values > 0, values, np.nan)


def _log_scale_or_say(ax: Any, *curves: np.ndarray | float) -> bool:
    """A logarithmic y axis where some curve of the panel has a positive value (True); else a
    linear one at 0 with a note that every value is 0, nothing to draw on a log scale (False)."""
    if any(np.any(np.asarray(c, dtype=float) > 0) for c in curves):
        ax.set_yscale("log")
        return True
    ax.set_ylim(-0.05, 1.0)
    ax.text(0.5, 0.5, "every value is 0 here", transform=ax.transAxes, ha="center", va="center")
    return False


def _log_floor(*curves: np.ndarray) -> float:
    """Bottom of a log axis: below the smallest informative value of the curves, ignoring
    values more than 1e3 below their curve's median (the ``η_0 = 0`` of M = 0 shows as 1e-17)."""
    lows = []
    for curve in curves:
        values = np.asarray(curve, dtype=float)
        values = values[np.isfinite(values) & (values > 0)]
        if values.size:
            lows.append(values[values >= 1e-3 * np.median(values)].min())
    return 0.5 * min(lows) if lows else 1e-12


def plot_criteria(ds: xr.Dataset) -> Figure:
    """The kernel embedding's order criteria against ``M`` and why the order was chosen.

    Panels: ``η_M`` (eq. 54) with its noise level and the convergence line (twice the level
    the scan ends at); the certified error bound ``ε̃_M`` (the largest negative excursion of
    ``p_M`` within two orders) with the band of the automatic rule (within 2x its least);
    ``R_M`` (eq. 53) and ``δ`` (eq. 52), with the paper's ``δ_M`` dashed. The automatic rule:
    the smallest order after which ``η`` stays below the convergence line whose ``ε̃_M`` is in
    the band (:func:`kelr_dist.kernels.scores.selection.choose_order`).
    """
    from kelr_dist.kernels.scores.selection import (
        convergence,
        one_standard_error_floor,
        windowed_max,
    )

    orders = ds["order"].values
    order = chosen_order(ds)
    marked = max(order) if isinstance(order, tuple) else order
    eta = np.asarray(ds["eta"].values, dtype=float)
    later_max, eta_line = convergence(eta)
    floor = (
        one_standard_error_floor(
            ds["held_out_l2_loss"].values, ds["held_out_l2_loss_stderr"].values
        )
        if "held_out_l2_loss" in ds
        else 0
    )
    converged = (later_max <= eta_line) & (orders >= floor)
    bound = windowed_max(ds["negative_excursion"].values)
    band = 2.0 * bound[converged].min() if converged.any() else math.nan

    fig = new_figure(figsize=(13, 8.2), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    ax = axes[0]
    noise = ds["eta_noise"].values if "eta_noise" in ds else None
    ax.plot(orders, _positive(eta), "o-", ms=3, label="η_M")
    if noise is not None:
        ax.plot(orders, _positive(noise), "--", label="noise level of η_M")
    ax.axhline(eta_line, color="grey", lw=0.9, ls=":", label="2 x final level: converged below")
    if converged.any():
        ax.axvspan(orders[converged].min(), orders[-1], color="green", alpha=0.07, lw=0)
    if _log_scale_or_say(ax, eta, eta_line):
        ax.set_ylim(bottom=_log_floor(eta[1:], noise if noise is not None else eta))
    ax.set_title("η_M: size of the order-M shell of coefficients (eq. 54)")
    ax.set_ylabel("η_M (density units of the\nstandardized coordinates)")

    ax = axes[1]
    ax.plot(orders, _positive(bound), "o-", ms=3, color="C3", label="ε̃_M (certified bound)")
    if math.isfinite(band):
        ax.axhline(band, color="grey", lw=0.9, ls=":", label="2 x least ε̃ among converged M")
    if converged.any():
        ax.axvspan(orders[converged].min(), orders[-1], color="green", alpha=0.07, lw=0)
    if floor > 0:
        ax.axvline(floor, color="grey", lw=0.9, ls="--", label=f"held-out L² floor M = {floor}")
    if _log_scale_or_say(ax, bound):
        ax.set_ylim(bottom=_log_floor(bound[1:]))  # p_0 (the weight) is never negative
    ax.set_title("ε̃_M: largest |p_M| where p_M < 0 (within 2 orders)")
    ax.set_ylabel("lower bound of sup |p_M - p_eq|\n(density, standardized coordinates)")

    ax = axes[2]
    rejection = ds["rejection"].values
    paper = ds["rejection_paper"].values if "rejection_paper" in ds else None
    ax.plot(orders, _positive(rejection), "o-", ms=3, label="R_M with δ used")
    if paper is not None:
        ax.plot(orders, _positive(paper), "--", label="R_M, paper's δ_M")
    _log_scale_or_say(ax, rejection, *([] if paper is None else [paper]))
    ax.set_title("R_M: share of samples with p_M < δ (B̂ = 0 there, eq. 53)")
    ax.set_ylabel("rejection rate R_M\n(fraction of samples, dimensionless)")

    ax = axes[3]
    delta = ds["delta"].values
    delta_paper = ds["delta_paper"].values if "delta_paper" in ds else None
    ax.plot(orders, _positive(delta), "o-", ms=3, label="δ used")
    if delta_paper is not None:
        ax.plot(orders, _positive(delta_paper), "--", label="paper's δ_M (least p_M > 0)")
    _log_scale_or_say(ax, delta, *([] if delta_paper is None else [delta_paper]))
    ax.set_title("δ: positivity threshold (eq. 52)")
    ax.set_ylabel("δ (density, standardized coordinates)")

    for ax in axes:
        if marked is not None:
            ax.axvline(marked, color="red", linewidth=0.9, label=f"chosen M = {marked}")
        ax.set_xlabel("order M (dimensionless)")
        ax.set_xlim(orders.min() - 1, orders.max() + 1)  # every order, drawn or all 0
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    selection = str(ds.attrs.get("order_selection", "auto"))
    if marked is None:
        reason = "no order recorded"
    elif selection == "auto":
        reason = (
            f"chosen M = {marked} (automatic): the smallest order after which η_M stays below "
            f"{eta_line:.2g} (converged, green) whose ε̃_M is within 2x the least ({band:.2g})"
            + (f", at least the held-out L² floor {floor}" if floor > 0 else "")
        )
    else:
        reason = f"M = {order} ({selection}: given, not chosen by these criteria)"
    used = str(ds.attrs.get("estimator", "kernel-embedding"))
    note = "" if used == "kernel-embedding" else f"; the estimate used {used} (see selection.png)"
    wrapped = "\n".join(textwrap.wrap(reason + note, TITLE_WIDTH))  # a long reason is not clipped
    fig.suptitle(f"kernel embedding order criteria (log scales)\n{wrapped}", fontsize="medium")
    return fig


#: a response with more entries than this is drawn as heat maps (:func:`plot_response_maps`),
#: not a line panel per entry
MAX_PANELS = 36
_MOMENTS = {1: "mean", 2: "variance", 3: "third central moment", 4: "fourth central moment"}


def _distribution_kind(ds: xr.Dataset) -> str | None:
    """``pdf``, ``moments`` or ``exceedance`` for a distribution estimate, else None."""
    if "distribution" not in ds.attrs:
        return None
    return str(parse_json_attr(ds.attrs["distribution"], "distribution")["kind"])


def entry_labels(ds: xr.Dataset, i: str, j: str) -> tuple[str, str]:
    """The title and y label of entry ``k_ij``, in the observable's own units: ``variance of x1``
    for a moment, ``P(x1 > q0.99)`` for an exceedance, else the observable's name."""
    component, _, part = i.partition(":")
    kind = _distribution_kind(ds)
    if kind == "moments" and part.startswith("moment"):
        k = int(float(part[len("moment") :]))
        what = f"{_MOMENTS.get(k, f'moment {k}')} of {component}"
        power = "" if k == 1 else f"^{k}"
        return what, f"{what}\nper unit forcing (units of {component}{power})"
    if kind == "exceedance" and part.startswith("exceed"):
        what = f"P({component} > q{part[len('exceed') :]})"
        return what, f"{what}\nper unit forcing (probability)"
    return (
        f"k[{i}, {j}](t)",
        f"response of {i} to forcing on {j}\n(units of {i} per unit of forcing)",
    )


def _time_label(ds: xr.Dataset) -> str:
    unit = _unit(ds) or ", the data's time unit"
    return f"time lag t (dt = {ds.attrs.get('dt', '?')}{unit})"


def plot_responses(ds: xr.Dataset, normalise: bool = False) -> Figure:
    """Every entry ``k_ij(t)`` against time, every estimate with its ±2 standard-error band
    (sampling error); raw values, or diagonal entries normalised to ``k_ii(0) = 1`` (the paper's
    figures) with ``normalise``. A PDF estimate, or one with more than :data:`MAX_PANELS`
    entries, is drawn as heat maps instead (:func:`plot_response_maps`)."""
    if _distribution_kind(ds) == "pdf" or ds.sizes["i"] * ds.sizes["j"] > MAX_PANELS:
        return plot_response_maps(ds)
    shown, note = ds, "raw values"
    if normalise:
        try:
            shown, note = normalized(ds), "diagonal entries normalised to k_ii(0) = 1"
        except ValueError:
            note = "not normalised (zero diagonal at lag 0)"
    names_i = [str(v) for v in ds["i"].values]
    names_j = [str(v) for v in ds["j"].values]
    q, d = len(names_i), len(names_j)
    fig = new_figure(figsize=(4.2 * d, 3.2 * q), layout="constrained")
    from matplotlib import legend_handler  # after new_figure: matplotlib is installed

    axes = fig.subplots(q, d, squeeze=False)
    time = ds["time"].values
    legend: dict[str, tuple[Any, ...]] = {}  # variable -> its band and line, for one legend
    for (a, i), (b, j) in ((x, y) for x in enumerate(names_i) for y in enumerate(names_j)):
        ax = axes[a, b]
        for name in _STYLE:
            if name not in shown:
                continue
            k = shown[name].sel(i=i, j=j).values
            style = {**_STYLE[name], "linewidth": 2.0} if name == "response" else _STYLE[name]
            (line,) = ax.plot(time, k, **style)
            band = None
            # the total error (sampling and the score's fit) where the result has it
            spread = f"{name}_total_stderr" if f"{name}_total_stderr" in shown else f"{name}_stderr"
            if spread in shown and name != "response_exact":
                s = shown[spread].sel(i=i, j=j).values
                color = _STYLE[name]["color"]
                band = ax.fill_between(time, k - 2 * s, k + 2 * s, color=color, alpha=0.15, lw=0)
            legend.setdefault(name, (line,) if band is None else (band, line))
        diagonal = a == b
        title, ylabel = entry_labels(ds, i, j)
        if len(names_j) > 1 and not title.startswith("k["):
            title += f"; forcing {j}"
        ax.set_title(title + ("  (normalised)" if diagonal and shown is not ds else ""))
        ax.set_xlabel(_time_label(ds))
        ax.set_ylabel(ylabel)
        ax.axhline(0.0, color="grey", linewidth=0.5)
        ax.grid(True, alpha=0.3)
    labels = []
    for name, parts in legend.items():
        text = label(ds, name) + (", chosen" if name == "response" else "")
        # the total error where the estimate carries its score fit's variance
        spread = "total stderr" if f"{name}_estimator_stderr" in ds else "stderr"
        labels.append(f"{text} ± 2 {spread}" if len(parts) == 2 else text)
    axes[0, 0].legend(
        list(legend.values()),
        labels,
        handler_map={tuple: legend_handler.HandlerTuple(ndivide=1)},
        fontsize="small",
    )
    stein = stein_rows(ds).get("response")
    bias = (
        "\nlag-0 Stein residual (bias) of the chosen estimate: "
        + (
            BY_CONSTRUCTION
            if stein.ratio < EXACT_RATIO
            else f"up to {stein.residual:.2g} = {stein.ratio:.1f} stderr"
        )
        + (
            f"\n(before the Stein correction: {stein.raw_ratio:.1f} stderr"
            f"{_share_text(stein.raw_share).replace(' =', ',')})"
            if np.isfinite(stein.raw_ratio)
            else ""
        )
        if stein
        else ""
    )
    fig.suptitle(
        f"linear response operator ({note})\nbands: ±2 standard errors, "
        + (
            "sampling and the score fit's variance (jackknife), "
            if "response_total_stderr" in ds
            else "sampling error only, "
        )
        + f"not estimator bias{bias}",
        fontsize="medium",
    )
    return fig


def shown_lags(count: int) -> list[int]:
    """The lags a figure of many entries shows, out of ``count``: 0, a quarter and half of the
    largest lag (positions along ``lag``)."""
    return sorted({0, (count - 1) // 4, (count - 1) // 2})


def _heat_map(
    fig: Figure, ax: Any, time: np.ndarray, rows: np.ndarray, values: np.ndarray, label: str
) -> None:
    """``values (rows, time)`` as a heat map on a symmetric colour scale, with its colour bar."""
    limit = float(np.nanmax(np.abs(values))) or 1.0
    image = ax.pcolormesh(
        time, rows, values, cmap="RdBu_r", vmin=-limit, vmax=limit, shading="nearest"
    )
    fig.colorbar(image, ax=ax, label=label)


def plot_response_maps(ds: xr.Dataset) -> Figure:
    """Many entries as heat maps of the chosen estimate.

    A PDF estimate: per observed component (rows) and forcing (columns), ``δp(x, t)`` per unit
    forcing against the bin centre ``x`` (data units) and the lag
    (:func:`~kelr_dist.distribution_response`). A square response of many components (``i``
    the same names as ``j``): ``k_ij`` at three lags as ``i x j`` maps, and every diagonal
    ``k_ii(t)`` with its ±2 standard-error band. Any other: per forcing, ``k_ij(t)`` against the
    observable's entry and the lag.
    """
    from kelr_dist.edges.distribution import distribution_response

    time = ds["time"].values
    names_i = [str(v) for v in ds["i"].values]
    names_j = [str(v) for v in ds["j"].values]
    used = label(ds, "response")
    if _distribution_kind(ds) == "pdf":
        components = parse_json_attr(ds.attrs["distribution"], "distribution")["components"]
        fig = new_figure(figsize=(5.2 * len(names_j), 3.4 * len(components)), layout="constrained")
        axes = fig.subplots(len(components), len(names_j), squeeze=False)
        for r, component in enumerate(components):
            labelled = distribution_response(ds, component)
            for c, j in enumerate(names_j):
                ax = axes[r, c]
                values = labelled["response"].sel(j=j).values.T  # (bin, lag)
                _heat_map(
                    fig, ax, time, labelled["bin"].values, values,
                    f"δp per unit forcing\n(density per unit {component})",
                )  # fmt: skip
                ax.set_title(f"density of {component}, forcing on {j}")
                ax.set_xlabel(_time_label(ds))
                ax.set_ylabel(f"{component} (the data's units)")
        fig.suptitle(
            f"response of the PDF to forcing ({used}): k(t) per bin in density per unit of x\n"
            "(distribution_<j>.png shows the response to a step of forcing)",
            fontsize="medium",
        )
        return fig
    if names_i == names_j:
        d = len(names_i)
        lags = shown_lags(time.size)
        columns = max(len(lags), math.ceil(math.sqrt(d)))
        rows = math.ceil(d / columns)
        fig = new_figure(figsize=(2.6 * columns, 2.2 * rows + 4.0), layout="constrained")
        top, bottom = cast(Any, fig.subfigures(2, 1, height_ratios=(4.0, 2.2 * rows)))
        k = ds["response"].transpose("lag", "i", "j").values
        ticks = np.arange(0, d, max(1, d // 8))
        for ax, lag in zip(np.atleast_1d(top.subplots(1, len(lags))), lags, strict=True):
            _heat_map(top, ax, np.arange(d), np.arange(d), k[lag], "k_ij (units of i per unit "
                      "forcing of j)")  # fmt: skip
            ax.set_title(f"k_ij at t = {time[lag]:.3g}{_unit(ds)}")
            ax.set_xlabel("forced component j (index)")
            ax.set_ylabel("observed component i (index)")
            ax.set_xticks(ticks, [names_j[t] for t in ticks], rotation=90, fontsize="small")
            ax.set_yticks(ticks, [names_i[t] for t in ticks], fontsize="small")
            ax.invert_yaxis()
        spread = "response_total_stderr" if "response_total_stderr" in ds else "response_stderr"
        s = ds[spread].transpose("lag", "i", "j").values if spread in ds else None
        panels = np.atleast_1d(bottom.subplots(rows, columns, sharex=True)).ravel()
        for n, ax in enumerate(panels):
            if n >= d:
                ax.set_visible(False)
                continue
            ax.plot(time, k[:, n, n], color="C0")
            if s is not None:
                ax.fill_between(
                    time, k[:, n, n] - 2 * s[:, n, n], k[:, n, n] + 2 * s[:, n, n],
                    color="C0", alpha=0.2, lw=0,
                )  # fmt: skip
            ax.axhline(0.0, color="grey", lw=0.5)
            ax.set_title(f"k[{names_i[n]}, {names_i[n]}](t)", fontsize="small")
            ax.tick_params(labelsize="x-small")
        bottom.supxlabel(_time_label(ds), fontsize="small")
        bottom.supylabel(
            f"k_ii(t) (units of i per unit forcing), ±2 {spread[9:]}", fontsize="small"
        )
        fig.suptitle(
            f"linear response operator of {d} components ({used}): k_ij at three lags (top) and "
            f"the diagonal k_ii(t) with its ±2 {spread[9:].replace('_', ' ')} band (below)",
            fontsize="medium",
        )
        return fig
    fig = new_figure(figsize=(5.2 * len(names_j), 0.5 + 0.12 * len(names_i)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(names_j)))
    k = ds["response"].transpose("lag", "i", "j").values
    ticks = np.arange(0, len(names_i), max(1, len(names_i) // 16))
    for ax, (c, j) in zip(axes, enumerate(names_j), strict=True):
        _heat_map(fig, ax, time, np.arange(len(names_i)), k[:, :, c].T,
                  "k_ij (units of A_i per unit forcing)")  # fmt: skip
        ax.set_yticks(ticks, [names_i[t] for t in ticks], fontsize="small")
        ax.invert_yaxis()
        ax.set_title(f"forcing on {j}")
        ax.set_xlabel(_time_label(ds))
        ax.set_ylabel("observable entry i (its name)")
    fig.suptitle(f"linear response operator ({used}), one row per observable entry")
    return fig


_LATTICE = re.compile(r"^(ring|grid)\((\d+(?:,\d+)*)\)$")


def lattice_shape(ds: xr.Dataset) -> tuple[int, ...] | None:
    """The shape of the lattice the estimate declared (``attrs["lattice"]``: ``"ring(16)"`` is
    ``(16,)``, ``"grid(8,8)"`` is ``(8, 8)``), or None: no lattice declared, or a response that
    is not square over its sites (``i`` and ``j`` the same names, as many as the sites)."""
    found = _LATTICE.match(str(ds.attrs.get("lattice", "")).replace(" ", ""))
    if found is None:
        return None
    shape = tuple(int(n) for n in found.group(2).split(","))
    names_i, names_j = list(ds["i"].values), list(ds["j"].values)
    return shape if names_i == names_j and len(names_i) == math.prod(shape) else None


def lattice_distances(shape: tuple[int, ...]) -> np.ndarray:
    """Distances between the sites of a periodic lattice of ``shape`` (a ring: one entry),
    sites in C order: ``(d, d)`` integers, ``r_ij = Σ_a min(|i_a - j_a|, n_a - |i_a - j_a|)``,
    the graph distance of its nearest-neighbour bonds that the declared neighbourhoods of
    :func:`~kelr_dist.kernels.scores.local.lattice` count (a ring: ``min(|i-j|, d-|i-j|)``)."""
    sites = np.stack(np.unravel_index(np.arange(math.prod(shape)), shape), axis=1)  # (d, axes)
    apart = np.abs(sites[:, None, :] - sites[None, :, :])
    return np.minimum(apart, np.asarray(shape) - apart).sum(axis=2)


class DistanceProfile(NamedTuple):
    """A response averaged over the pairs of sites at each lattice distance
    (:func:`distance_profile`)."""

    distance: np.ndarray  #: ``(r,)`` the distances 0, 1, .. the largest
    mean: np.ndarray  #: ``(lag, r)`` the mean of ``k_ij(t)`` over them
    band: np.ndarray | None  #: ``(lag, r)`` the mean of their standard errors (None: none)


def distance_profile(
    ds: xr.Dataset, shape: tuple[int, ...], name: str = "response"
) -> DistanceProfile:
    """The response ``name`` (eq. 5) against the lattice distance (:func:`lattice_distances`):
    at every lag, the mean of ``k_ij(t)`` over the pairs at each distance, and the mean of the
    entries' standard errors (total where the result has them, else sampling).

    The mean of the standard errors bounds the standard error of the mean whatever the
    correlations between the entries (the triangle inequality for standard deviations), and
    equals it when they are perfectly correlated: a conservative band. Dividing by the square
    root of the pair count would assume independent entries, which the entries of one estimate
    are not (they share the samples and the score's fit).
    """
    r = lattice_distances(shape).ravel()
    k = ds[name].transpose("lag", "i", "j").values.reshape(ds.sizes["lag"], r.size)
    spread = f"{name}_total_stderr" if f"{name}_total_stderr" in ds else f"{name}_stderr"
    s = ds[spread].transpose("lag", "i", "j").values.reshape(k.shape) if spread in ds else None
    distance = np.unique(r)
    mean = np.stack([k[:, r == at].mean(axis=1) for at in distance], axis=1)
    band = None if s is None else np.stack([s[:, r == at].mean(axis=1) for at in distance], axis=1)
    return DistanceProfile(distance, mean, band)


def plot_lattice_response(ds: xr.Dataset) -> Figure | None:
    """The chosen estimate against the lattice distance of a declared ring or grid
    (:func:`lattice_shape`), or None without one.

    One line per lag (those of the heat maps, :func:`shown_lags`): the mean of ``k_ij(t)`` over
    the pairs ``(i, j)`` at each distance (:func:`distance_profile`), with a band of ±2 times
    the mean of their standard errors (total where the result has them) — a bound on the mean's
    standard error whatever the entries' correlations, not the smaller ``1/√pairs`` one that
    independent entries would give. The exact FDT, where present, dashed in the colour of its
    lag. A field's result (``i_<dim>``/``j_<dim>``) is read on its components.
    """
    ds = on_components(ds)
    shape = lattice_shape(ds)
    if shape is None:
        return None
    time = ds["time"].values
    profile = distance_profile(ds, shape)
    exact = distance_profile(ds, shape, "response_exact") if "response_exact" in ds else None
    fig = new_figure(figsize=(8.0, 5.2), layout="constrained")
    ax = fig.subplots()
    lags = shown_lags(time.size)
    for c, lag in enumerate(lags):
        mean, color = profile.mean[lag], f"C{c}"
        ax.plot(profile.distance, mean, "o-", ms=4, color=color, label=f"t = {time[lag]:.3g}")
        if profile.band is not None:
            half = 2.0 * profile.band[lag]
            ax.fill_between(
                profile.distance, mean - half, mean + half, color=color, alpha=0.18, lw=0
            )
    if exact is not None:  # after the estimates: last in the legend
        for c, lag in enumerate(lags):
            ax.plot(
                exact.distance, exact.mean[lag], "--", color=f"C{c}", lw=1.0,
                label="exact FDT (dashed, colour of its lag)" if c == 0 else "_exact",
            )  # fmt: skip
    ax.axhline(0.0, color="grey", lw=0.5)
    ax.set_xticks(profile.distance)
    ax.grid(True, alpha=0.3)
    way = "shortest way round" if len(shape) == 1 else "periodic, summed over the grid's axes"
    ax.set_xlabel(f"lattice distance r between sites i and j (sites; {way})")
    ax.set_ylabel(
        "mean of k_ij(t) over the pairs at distance r\n(units of A_i per unit forcing of j)"
    )
    unit = ds.attrs.get("time_units") or "the data's time unit"
    ax.legend(title=f"time lag ({unit})", fontsize="small")
    spread = "total stderr" if "response_total_stderr" in ds else "stderr"
    lattice = str(ds.attrs["lattice"]).replace(" ", "")
    fig.suptitle(
        f"response of A = {ds.attrs.get('observable', 'identity')} against lattice distance on "
        f"{lattice} ({label(ds, 'response')})\nmean over the pairs (i, j) at each distance; "
        f"band ±2 x the mean of their {spread}\n(conservative: a bound on the mean's standard "
        "error whatever the entries' correlations)",
        fontsize="medium",
    )
    return fig


def plot_selection(ds: xr.Dataset) -> Figure:
    """Held-out Hyvärinen loss of every candidate, ± its fold standard error: the kernel
    embedding against its order ``M`` and score matching against its degree ``q`` (the best
    ridge per degree), each on its own axis, one loss scale for both; the choice starred and
    its loss drawn across both. Every candidate is inside the axes: when unstable fits reach
    losses far from the best, the scale is linear near the best and logarithmic beyond
    (symlog)."""
    estimators = np.array([str(v) for v in ds["candidate_estimator"].values])
    orders = ds["candidate_order"].values
    losses = ds["candidate_loss"].values
    errors = np.nan_to_num(ds["candidate_loss_stderr"].values, nan=0.0)
    chosen = ds["candidate_chosen"].values.astype(bool)
    finite = np.isfinite(losses)
    sm = (estimators == "score-matching") & finite
    ridges = ds["candidate_ridge"].values if "candidate_ridge" in ds else np.zeros(losses.size)
    # score matching's own pick (the chosen candidate, or its best when the kernel embedding
    # was used): its ridge is the one drawn at its degree, so that it is always starred
    pick = chosen & sm
    if not pick.any() and "degree" in ds.attrs:
        pick = sm & (orders == int(ds.attrs["degree"]))
        pick &= np.isclose(ridges, float(ds.attrs.get("ridge", 0.0))) if pick.sum() > 1 else pick
    best_ridge = [
        np.flatnonzero(sm & (orders == q) & pick)[0]
        if (pick & (orders == q)).any()
        else np.flatnonzero(sm & (orders == q))[np.argmin(losses[sm & (orders == q)])]
        for q in np.unique(orders[sm])
    ]
    rows = {
        "kernel-embedding": np.flatnonzero((estimators == "kernel-embedding") & finite),
        "score-matching": np.array(best_ridge, dtype=int),
    }
    rows = {name: r for name, r in rows.items() if r.size}
    panels = {
        "kernel-embedding": ("kernel embedding", "order M (paper's rules)", "C4", "s"),
        "score-matching": ("score matching", "degree q (best ridge per degree)", "C2", "o-"),
    }
    widths = [1.0 if name == "kernel-embedding" else 2.5 for name in rows] or [1.0]
    fig = new_figure(figsize=(3.0 + 2.6 * sum(widths), 4.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(widths), sharey=True, width_ratios=widths))
    for ax, (name, r) in zip(axes, rows.items(), strict=False):
        title, xlabel, color, fmt = panels[name]
        ax.errorbar(orders[r], losses[r], yerr=errors[r], fmt=fmt, ms=5, color=color, capsize=2)
        mark = r[chosen[r]]
        if mark.size:
            ax.plot(orders[mark], losses[mark], "*", ms=16, color="red", label="chosen", zorder=3)
        own = r[pick[r] & ~chosen[r]]
        if own.size:  # score matching's pick, where the kernel embedding was chosen
            ax.plot(
                orders[own], losses[own], "*", ms=16, mfc="none", mec="red", zorder=3,
                label="score matching's own pick",
            )  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlim(orders[r].min() - 1, orders[r].max() + 1)
        if r.size == 1:  # nothing to compare: say so rather than draw a lone point's axis
            ax.set_xticks([orders[r][0]])
            ax.text(
                0.5, 0.92, f"only one order fitted (M = {orders[r][0]})\nnothing to compare",
                transform=ax.transAxes, ha="center", va="top", fontsize="small",
            )  # fmt: skip
        ax.grid(True, alpha=0.3)
    if (chosen & finite).any():
        best = float(losses[chosen & finite][0])
        for ax in axes:
            ax.axhline(best, color="red", lw=0.8, ls=":", label="loss of the chosen")
    symlog = False
    if rows:
        shown = np.concatenate(list(rows.values()))
        low = float(losses[shown].min())
        near = max(abs(low), 1.0)  # losses within a few times the best are what matters
        span = np.concatenate([losses[shown] - errors[shown], losses[shown] + errors[shown]])
        symlog = bool(span.max() > low + 2.0 * near or span.min() < low - 2.0 * near)
        if symlog:
            from matplotlib.ticker import FuncFormatter, SymmetricalLogLocator

            axes[0].set_yscale("symlog", linthresh=3.0 * near)
            # plain numbers (not 10^k and -10^0) at 1, 2, 5 per decade
            axes[0].yaxis.set_major_locator(
                SymmetricalLogLocator(base=10, linthresh=3.0 * near, subs=(1.0, 2.0, 5.0))
            )
            axes[0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
        pad = 0.05 * (span.max() - span.min() + 1e-3 * near)
        if symlog:  # a margin on the logarithmic part is a share of the value
            pad = max(pad, 0.2 * max(abs(span.max()), abs(span.min())))
        axes[0].set_ylim(span.min() - pad, span.max() + pad)
    axes[0].set_ylabel("held-out loss J = E[|s|²/2 + div s]\n(units of 1/x², lower is better)")
    for ax in axes[1:]:
        ax.set_ylabel("held-out loss J (same scale)")
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(text, handle)
    axes[-1].legend(list(handles.values()), list(handles), fontsize="small")
    scale = "\nloss axis linear near the best, logarithmic beyond" if symlog else ""
    fig.suptitle(
        "estimator choice on held-out folds: Hyvärinen loss (Fisher divergence up to a "
        f"constant), ± its standard error over the folds{scale}",
        fontsize="medium",
    )
    return fig


def _density_axes(density: Any, n: int) -> list[np.ndarray]:
    """Per coordinate, ``n`` grid points covering the fitted basis' weight (wide; cropped later)."""
    axes = []
    for coordinate in density.basis.coordinates:
        family, loc, scale = coordinate.family, coordinate.loc, coordinate.scale
        if coordinate.period is not None:  # Fourier: one whole window [loc, loc + period)
            axes.append(loc + scale * np.linspace(0.0, 2.0 * math.pi, n))
        elif hasattr(family, "theta"):  # Laguerre: y = (x - loc) / scale >= 0, Gamma(θ+1) weight
            k = float(family.theta) + 1.0
            axes.append(loc + scale * np.linspace(0.0, k + 10.0 * math.sqrt(k) + 5.0, n))
        else:
            axes.append(loc + scale * np.linspace(-5.0, 5.0, n))
    return axes


def periodic_lines(ds: xr.Dataset) -> list[str]:
    """One line per component taken as periodic (attribute ``periodic``): its period, where its
    values wrap and why (declared, or found wrapped in the data)."""
    table = parse_json_attr(ds.attrs.get("periodic", "{}"), "periodic")
    return [
        f"{name}: angle, period {_angle_unit(entry['period'])[1]}, wraps at "
        f"{entry['wrap']:.6g}; {entry['reason']}"
        for name, entry in table.items()
    ]


def _angle_unit(period: float) -> tuple[str, str]:
    """The unit of an angle of this period and the period in words: ``rad``/``2π``,
    ``deg``/``360``, else the data's units."""
    if math.isclose(period, 2.0 * math.pi, rel_tol=1e-9):
        return "rad", "2π"
    if math.isclose(period, 360.0, rel_tol=1e-9):
        return "deg", "360"
    return "the data's units", f"{period:.6g}"


def _axis_label(name: str, coordinate: Any) -> str:
    """``name (angle, rad)`` for a periodic coordinate, else ``name (the data's units)``."""
    if coordinate.period is None:
        return f"{name} (the data's units)"
    return f"{name} (angle, {_angle_unit(coordinate.period)[0]})"


def _true_density(ds: xr.Dataset, points: np.ndarray) -> np.ndarray | None:
    """Unnormalised ``p_eq`` of the store's built-in model at ``points (n, d)``, else None."""
    if "model" not in ds.attrs:
        return None
    from kelr_dist.models.registry import make_model

    params = ds.attrs.get("model_params", "{}")
    try:
        model = make_model(ds.attrs["model"], **parse_json_attr(params, "model_params"))
        log_p = np.asarray(model.log_density(points), dtype=float)
    except (ValueError, TypeError):  # not a built-in model after all: no reference
        return None
    finite = np.isfinite(log_p)
    if not finite.any():
        return None
    return np.where(finite, np.exp(log_p - log_p[finite].max()), 0.0)


def _marginals(grid: np.ndarray, axes: list[np.ndarray]) -> list[np.ndarray]:
    """Marginal densities of a gridded density ``grid (n_1, .., n_d)`` (trapezoid rule)."""
    d = grid.ndim
    out = []
    for k in range(d):
        m = grid
        for other in reversed([o for o in range(d) if o != k]):
            m = np.trapezoid(m, axes[other], axis=other)
        out.append(m)
    return out


def _normalise(grid: np.ndarray, axes: list[np.ndarray]) -> np.ndarray:
    total = grid
    for k in reversed(range(grid.ndim)):
        total = np.trapezoid(total, axes[k], axis=k)
    return grid / total


def _shown_range(*curves: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    """Where any curve exceeds :data:`_SHOWN_FRACTION` of its maximum."""
    keep = np.zeros(x.shape, dtype=bool)
    for c in curves:
        if np.nanmax(c) > 0:
            keep |= c > _SHOWN_FRACTION * np.nanmax(c)
    if not keep.any():
        return float(x[0]), float(x[-1])
    return float(x[keep].min()), float(x[keep].max())


def plot_density(ds: xr.Dataset) -> Figure | None:
    """The estimated density ``p_M`` at the chosen order (eq. 40), None for ``d > 3``.

    Marginals of ``p_M`` (and of the true ``p_eq`` of a built-in model, normalised on the
    grid); for ``d = 2`` also maps of ``p_M``, ``p_eq`` and ``|p_M - p_eq|`` (Figure fig:p_tri).
    """
    from kelr_dist.pipeline.result import density_from_result

    density = density_from_result(ds)
    d = density.basis.dim
    if d not in DENSITY_GRID:
        return None
    order = chosen_order(ds)
    axes = _density_axes(density, DENSITY_GRID[d])
    mesh = np.meshgrid(*axes, indexing="ij")
    points = np.stack([m.ravel() for m in mesh], axis=1)
    shape = tuple(a.size for a in axes)
    estimate = density.pdf(points, order).reshape(shape)
    truth = _true_density(ds, points)
    truth = None if truth is None else _normalise(truth.reshape(shape), axes)
    names = [str(c) for c in (ds["component"].values if "component" in ds else range(d))]
    maps = [("estimated p_M", estimate, "viridis")] if d == 2 else []
    if maps and truth is not None:
        error = np.abs(estimate - truth)
        maps += [("true p_eq", truth, "viridis"), ("|p_M - p_eq|", error, "magma")]
    # one panel per marginal and per map, none left empty: the maps get a row of their own
    # when there are three of them, else they follow the marginals
    if len(maps) == 3:
        layout = [
            [f"m{k}" for k in range(d) for _ in range(3)],
            [f"p{c}" for c in range(3) for _ in range(2)],
        ]
    else:
        layout = [[f"m{k}" for k in range(d)] + [f"p{c}" for c in range(len(maps))]]
    columns = len(maps) if len(maps) == 3 else d + len(maps)
    fig = new_figure(figsize=(4.5 * columns, 3.8 * len(layout)), layout="constrained")
    panel = fig.subplot_mosaic(cast(Any, layout))  # a list of rows of names (stubs: invariant)
    est_marginals = _marginals(estimate, axes)
    true_marginals = _marginals(truth, axes) if truth is not None else None
    for k in range(d):
        ax = panel[f"m{k}"]
        ax.plot(axes[k], est_marginals[k], color="C0", label=f"p_M, kernel embedding (M = {order})")
        curves = [est_marginals[k]]
        if true_marginals is not None:
            ax.plot(axes[k], true_marginals[k], color="black", lw=0.9, ls="--", label="true p_eq")
            curves.append(true_marginals[k])
        on_circle = density.basis.coordinates[k].period is not None
        ax.set_xlim(*((axes[k][0], axes[k][-1]) if on_circle else _shown_range(*curves, x=axes[k])))
        ax.set_title(f"marginal density of {names[k]}")
        ax.set_xlabel(_axis_label(names[k], density.basis.coordinates[k]))
        ax.set_ylabel(f"density (per unit of {names[k]})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    if maps:
        limits = [panel[f"m{k}"].get_xlim() for k in range(2)]
        for c, (title, values, cmap) in enumerate(maps):
            ax = panel[f"p{c}"]
            image = ax.pcolormesh(axes[0], axes[1], values.T, cmap=cmap, shading="auto")
            unit = f"(per unit of {names[0]} x {names[1]})"
            fig.colorbar(image, ax=ax, label=f"density {unit}" if c < 2 else f"|error| {unit}")
            ax.set_xlim(*limits[0])
            ax.set_ylim(*limits[1])
            ax.set_title(title)
            ax.set_xlabel(_axis_label(names[0], density.basis.coordinates[0]))
            ax.set_ylabel(_axis_label(names[1], density.basis.coordinates[1]))
    used = str(ds.attrs.get("estimator", "kernel-embedding"))
    note = (
        ""
        if used == "kernel-embedding"
        else f"\nthe response used {used.replace('-', ' ')}, whose score is not the gradient of "
        "this density: p_M is the kernel embedding's fit, shown for comparison"
    )
    fig.suptitle(
        f"equilibrium density: the kernel embedding's p_M at order M = {order}"
        + (" and the true p_eq" if truth is not None else "")
        + note
    )
    return fig


def write_figures(ds: xr.Dataset, directory: str | os.PathLike[str]) -> list[Path]:
    """Write ``response.png``, ``selection.png``, ``criteria.png``, ``density.png`` and
    ``response_distance.png`` (those the result has the data for) to ``directory``.

    Returns
    -------
    The paths written. Each file is written to a temporary name and renamed, so an
    interrupted report leaves no truncated PNG.

    Raises
    ------
    OSError
        a figure that cannot be written (a full disk, no permission), naming its path; the
        folders this call made are removed again with what it wrote in them.
    """
    ds = on_components(ds)
    figures = {"response.png": plot_responses(ds)}  # first: no folder without matplotlib
    if "candidate_loss" in ds:
        figures["selection.png"] = plot_selection(ds)
    if "order" in ds.dims and "eta" in ds:
        figures["criteria.png"] = plot_criteria(ds)
    if "coefficients" in ds:
        density = plot_density(ds)
        if density is not None:
            figures["density.png"] = density
    lattice = plot_lattice_response(ds)
    if lattice is not None:
        figures["response_distance.png"] = lattice
    figures.update(distribution_figures(ds))  # a pdf estimate's distribution_<j>.png
    folder = Path(directory)
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    written: list[Path] = []
    target = folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, fig in figures.items():
            target, partial = folder / name, folder / f".{name}.partial"
            fig.savefig(partial, dpi=110, format="png")
            os.replace(partial, target)
            written.append(target)
    except OSError as err:
        for path in (folder / f".{n}.partial" for n in figures):
            path.unlink(missing_ok=True)
        if made:
            for path in written:
                path.unlink(missing_ok=True)
            for path in made:
                with suppress(OSError):
                    path.rmdir()
        raise OSError(err.errno, err.strerror or str(err), str(target)) from None
    return written
