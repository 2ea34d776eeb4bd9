"""Stochastic Lorenz-96: the response to a constant forcing, by direct perturbation, by this
package and by the quasi-Gaussian FDT.

Four responses of ``dx_k = ((x_{k+1} - x_{k-2}) x_{k-1} - x_k + F + f_k) dt + sigma dW_k``
(``K`` sites on a ring) to a forcing switched on at ``t = 0`` and held (the step response
``R(t) = ∫_0^t k(s) ds``, eq. 4):

* the site mean ``(1/K) Σ_k x_k`` and the variance of site 1, to a forcing on site 1
  (``f = ε e_1``);
* the site mean and a site's variance (averaged over the sites), to a uniform change of ``F``
  (``f = ε``).

Three ways:

1. *Direct perturbation* (the method of ``scripts/perturbation_experiment.py``): ``--members``
   equilibrium states (``--spacing`` samples apart on a trajectory of their own) are integrated
   by the model's own scheme with ``+ε`` and ``-ε``, with common random numbers (the same noise
   for both signs); ``(E_+[A] - E_-[A]) / 2ε`` (ensemble means and variances), with a
   batch-means standard error over the members, is the response up to ``O(ε²)``.
2. *This package*, on one equilibrium trajectory of ``--samples`` samples. By default on all
   ``K`` sites with the local score model (``index_set="local"``, ``neighbours="ring"``,
   ``symmetry="translation"``: one fit of every site's score on its neighbourhood, the sites'
   Gram sums added; ``--index-set local-adaptive``: its index set grown by held-out loss), with
   the observables ``(1/K) Σ_k x_k``, ``(1/K) Σ_k (x_k - m)²`` and each
   ``(x_k - m)²`` (``m``: the trajectory's site mean), and besides the sites' forcings the
   uniform one (a change of ``F``) as a forcing pattern of its own (``kelr_dist.Forcing`` with
   ``patterns``: its standard errors hold the correlations between the sites), read directly:
   the site mean's response to ``F`` is ``k_{mean, F}``, to a forcing on one site ``k_{mean,
   F} / K``; the variance of site ``j`` forced on site ``j`` is ``k_{(x_j - m)², j}``
   (averaged over ``j``), a site's variance under ``F`` ``k_{mean square, F}``. With
   ``--window m`` the estimate runs on the ``m`` neighbouring sites centred on site 1 instead
   (observables ``x_1`` and ``x_1²``), read with the ring's translation symmetry: the site
   mean's response to a forcing on site 1 is ``(1/K) Σ_b k_{x_1, b}``, its response to ``F``
   ``Σ_b k_{x_1, b}``, the variance's ``k_{x_1², b} - 2 x̄_1 k_{x_1, b}`` (at ``b = 1``, or
   summed over ``b``): what lies outside the window is left out. With ``--reduce eof(k)`` the
   estimate runs on all ``K`` sites' leading ``k`` EOFs (the response of the projected
   dynamics), for the site mean only. The step response's standard error is the package's
   total standard error (sampling and fit) propagated as a bound over the summed entries and
   the lags (``Σ |w| σ``, valid for any correlation between them); the table of its parts
   gives the sampling and the estimator part alone, and the root-sum-square propagation (which
   assumes independent errors: a lower reference, not an error bar).
3. *Quasi-Gaussian FDT* (Leith 1975; Majda, Abramov & Gershgorin 2010) on the same trajectory,
   with all ``K`` sites: the score of the fitted Gaussian, ``B = c^T C^{-1} (x - x̄)``; its
   standard errors by batch means over the trajectory. The responses to a forcing on one site
   are averaged over the sites, as the package's are. As a diagnostic, the package's own
   quasi-Gaussian baseline on the package's coordinates (all sites, the window or the EOFs)
   too: where it is as far off as the package, the coordinates (what a window leaves out), not
   the score model, limit the estimate.

Printed and written (``--output``, Markdown tables; ``--figure``, with the direct experiment's
and the package's ``± 2`` standard error bands): the direct responses at a few times with their
standard errors, and for the package and the quasi-Gaussian FDT the largest ``|R - R_direct|``
over ``t <= --max-time``, the share of those times within two of the direct experiment's
standard errors and (the package) beyond two combined standard errors; then the parts of the
package's standard error. The heading names the warnings the package's estimate raised.

    python scripts/lorenz96_response.py --F 8 --sigma 0.5 --samples 2e5 --members 40000 \\
        --output docs/benchmarks/lorenz96_f8.md --figure docs/figures/lorenz96/f8.png
    python scripts/lorenz96_response.py --F 5 --sigma 0.1 --window 9
    python scripts/lorenz96_response.py --F 8 --reduce 'eof(8)'
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

import kelr_dist
from kelr_dist.edges.report import warning_lines
from kelr_dist.models.lorenz96 import Lorenz96

#: the responses compared: (label, observable, forcing)
ROWS = (
    ("site mean", "mean", "site"),
    ("variance of site 1", "variance", "site"),
    ("site mean", "mean", "F"),
    ("variance of a site", "variance", "F"),
)
#: the package's estimate and its quasi-Gaussian baseline on the same coordinates
READS = {"package": "response", "package-qg": "response_gaussian"}
#: batches of the batch-means standard errors
BATCHES = 20


@dataclass(frozen=True)
class Curve:
    """A step response ``R(t)`` on the output times, with its standard error."""

    value: np.ndarray
    stderr: np.ndarray


def equilibrium(model: Lorenz96, samples: int, seed: int) -> np.ndarray:
    """An equilibrium trajectory ``(samples, K)`` after the model's burn-in."""
    rng = np.random.default_rng(seed)
    burn, _ = model.advance(model.initial_state(rng), model.default_burn_in, rng)
    return model.advance(burn[-1], samples, rng)[0]


def trapezoid(k: np.ndarray, dt: float) -> np.ndarray:
    """``∫_0^t k(s) ds`` on the lag grid (trapezoid rule), along axis 0."""
    out = np.zeros_like(k)
    out[1:] = np.cumsum(0.5 * dt * (k[1:] + k[:-1]), axis=0)
    return out


def trapezoid_bound(stderr: np.ndarray, dt: float) -> np.ndarray:
    """The bound ``Σ w_s σ_s`` of the trapezoid's error from the lags' standard errors."""
    return trapezoid(np.abs(stderr), dt)


# --------------------------------------------------------------------------------------------
# 1. direct perturbation
# --------------------------------------------------------------------------------------------


def direct(
    model: Lorenz96, starts: np.ndarray, outputs: int, eps: float, site_eps: float, seed: int
) -> dict[tuple[str, str], Curve]:
    """The direct experiment: both forcings, both signs, common random numbers per member; the
    members are run in ``BATCHES`` contiguous batches (the batch means' batches), one at a time."""
    k = model.K
    forcings = {"site": site_eps * np.eye(k)[0], "F": np.full(k, eps)}
    out = {}
    for kind, pattern in forcings.items():
        size = float(np.max(pattern))
        means, variances = [], []
        for batch in np.array_split(np.arange(starts.shape[0]), BATCHES):
            states = np.empty((2, batch.size, outputs + 1, k))
            for row, m in enumerate(batch):
                for s, sign in enumerate((1.0, -1.0)):
                    rng = np.random.default_rng([seed, int(m)])
                    states[s, row, 0] = starts[m]
                    states[s, row, 1:] = model.advance(starts[m], outputs, rng, sign * pattern)[0]
            mean = states.mean(axis=3)  # the site mean, (2, members, T)
            means.append(((mean[0] - mean[1]) / (2 * size)).mean(0))
            # ensemble variances: of site 1, or averaged over the sites
            chosen = states[..., :1] if kind == "site" else states
            change = chosen[0].var(0, ddof=1) - chosen[1].var(0, ddof=1)
            variances.append(change.mean(-1) / (2 * size))
        for name, per in (("mean", np.stack(means)), ("variance", np.stack(variances))):
            out[(name, kind)] = Curve(per.mean(0), per.std(0, ddof=1) / math.sqrt(BATCHES))
    return out


# --------------------------------------------------------------------------------------------
# 3. quasi-Gaussian FDT
# --------------------------------------------------------------------------------------------


def lagged(a: np.ndarray, b: np.ndarray, lags: int) -> np.ndarray:
    """``mean_n mean_c a[n + s, c] b[n, c]`` for ``s = 0..lags``, ``a`` and ``b`` ``(n, m)``."""
    n = a.shape[0]
    return np.array([np.mean(a[s:] * b[: n - s]) for s in range(lags + 1)])


def quasi_gaussian(x: np.ndarray, lags: int, dt: float) -> dict[tuple[str, str], Curve]:
    """The quasi-Gaussian FDT's step responses with batch-means standard errors; the responses
    to a forcing on one site are averaged over the sites (the ring's translation symmetry), as
    the package's are."""
    k = x.shape[1]
    centred = x - x.mean(0)
    conjugate = centred @ np.linalg.inv(np.cov(x.T))  # column j: B for a forcing on site j
    uniform = conjugate.sum(axis=1, keepdims=True)
    site_mean = centred.mean(1, keepdims=True)
    squares = centred**2 - (centred**2).mean(0)
    pairs = {
        ("mean", "site"): (site_mean, uniform / k),
        ("variance", "site"): (squares, conjugate),
        ("mean", "F"): (site_mean, uniform),
        ("variance", "F"): (squares.mean(1, keepdims=True), uniform),
    }
    out = {}
    for key, (a, b) in pairs.items():
        per = np.stack(
            [
                trapezoid(lagged(a[p], b[p], lags), dt)
                for p in np.array_split(np.arange(len(a)), BATCHES)
            ]
        )
        out[key] = Curve(trapezoid(lagged(a, b, lags), dt), per.std(0, ddof=1) / math.sqrt(BATCHES))
    return out


# --------------------------------------------------------------------------------------------
# 2. this package
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CentreSite:
    """``(x_c, x_c²)`` of the window's centre site ``c``, and its derivative."""

    centre: int

    def __call__(self, x: np.ndarray) -> np.ndarray:
        site = x[:, self.centre]
        return np.stack([site, site**2], axis=1)

    def derivative(self, x: np.ndarray) -> np.ndarray:
        out = np.zeros((x.shape[0], 2, x.shape[1]))
        out[:, 0, self.centre] = 1.0
        out[:, 1, self.centre] = 2.0 * x[:, self.centre]
        return out


@dataclass(frozen=True)
class RingMoments:
    """The observables of the all-sites route, ``(n, K + 2)``: the site mean ``(1/K) Σ_k x_k``,
    the mean of the centred squares ``(1/K) Σ_k (x_k - m)²`` and each ``(x_k - m)²``, with
    ``m`` the trajectory's site mean (a constant: to first order in the forcing the response of
    ``(x_k - m)²`` is that of the variance of ``x_k``)."""

    centre: float

    def __call__(self, x: np.ndarray) -> np.ndarray:
        squares = (x - self.centre) ** 2
        return np.concatenate(
            [x.mean(1, keepdims=True), squares.mean(1, keepdims=True), squares], 1
        )

    def derivative(self, x: np.ndarray) -> np.ndarray:
        n, k = x.shape
        out = np.zeros((n, k + 2, k))
        out[:, 0, :] = 1.0 / k
        out[:, 1, :] = 2.0 * (x - self.centre) / k
        out[:, 2 + np.arange(k), np.arange(k)] = 2.0 * (x - self.centre)
        return out


#: the parts of the package's error read by :func:`weighted`: the total standard error, and as
#: a diagnostic its sampling part, its estimator part, and the total propagated as if the
#: entries' and lags' errors were independent (root-sum-square, not a bound)
PARTS = {
    "total": ("_total_stderr", "bound"),
    "sampling": ("_stderr", "bound"),
    "estimator": ("_estimator_stderr", "bound"),
    "independent": ("_total_stderr", "independent"),
}


def weighted(ds: xr.Dataset, name: str, weights: np.ndarray, dt: float, part: str) -> Curve:
    """The step response ``∫_0^t Σ_ij w_ij k_ij(s) ds`` of response ``name`` (``(lag, i, j)``)
    for weights ``w (i, j)``, with the ``part`` of its standard error (:data:`PARTS`): as a
    bound ``Σ |w| σ`` over the entries and the lags (valid for any correlation between them),
    or root-sum-square."""
    resp = ds[name].transpose("lag", "i", "j").values
    suffix, rule = PARTS[part]
    if f"{name}{suffix}" not in ds:
        return Curve(trapezoid(np.einsum("lij,ij->l", resp, weights), dt), np.zeros(len(resp)))
    err = ds[f"{name}{suffix}"].transpose("lag", "i", "j").values
    value = trapezoid(np.einsum("lij,ij->l", resp, weights), dt)
    if rule == "bound":
        return Curve(value, trapezoid_bound(np.einsum("lij,ij->l", err, np.abs(weights)), dt))
    # the trapezoid to lag n weighs lags 0 and n by dt/2, the lags between by dt
    per_lag = np.einsum("lij,ij->l", err**2, weights**2)
    variance = np.zeros(len(resp))
    variance[1:] = (
        per_lag[0] / 4 + np.concatenate([[0.0], np.cumsum(per_lag[1:-1])]) + per_lag[1:] / 4
    )
    return Curve(value, dt * np.sqrt(variance))


def row_weights(route: str, shape: tuple[int, int], sites: int, site_mean: float) -> dict:
    """Each response's weights ``w (i, j)`` on the route's response of ``shape`` (see the
    module docstring): ``"window"`` (``x_c``, ``x_c²`` on the window's sites centred on ``c``,
    read by translation symmetry, the rest of the ring left out), ``"ring"``
    (:class:`RingMoments` on all ``sites``, the responses to a forcing on one site averaged
    over the sites) or ``"eof"`` (the lifted ``(K, K)`` response; site mean only)."""
    q, d = shape
    out = {key: np.zeros(shape) for key in (("mean", "site"), ("variance", "site"),
                                            ("mean", "F"), ("variance", "F"))}  # fmt: skip
    if route == "window":
        out[("mean", "site")][0] = 1.0 / sites
        out[("mean", "F")][0] = 1.0
        out[("variance", "site")][:, d // 2] = (-2.0 * site_mean, 1.0)
        out[("variance", "F")][:] = np.array([[-2.0 * site_mean], [1.0]])
    elif route == "ring":  # columns: the sites, then the uniform pattern "F" (the last)
        ring = d - 1
        out[("mean", "site")][0, -1] = 1.0 / ring
        out[("mean", "F")][0, -1] = 1.0
        out[("variance", "site")][2 + np.arange(ring), np.arange(ring)] = 1.0 / ring
        out[("variance", "F")][1, -1] = 1.0
    else:
        out[("mean", "site")][:, 0] = 1.0 / q
        out[("mean", "F")][:] = 1.0 / q
        del out[("variance", "site")], out[("variance", "F")]
    return out


def package(
    x: np.ndarray, model: Lorenz96, args: argparse.Namespace, lags: int
) -> tuple[dict[str, dict[tuple[str, str], Curve]], xr.Dataset, dict]:
    """This package's step responses and, as a diagnostic, those of its quasi-Gaussian
    baseline on the same coordinates (``"package"``, ``"package-qg"``), its result, and the
    parts of the package's standard error per response (:data:`PARTS`)."""
    k, dt = model.K, model.dt
    options: dict = dict(max_lag=lags, estimator=args.estimator, client="synchronous",
                         gaussian=True)  # fmt: skip
    if args.degree is not None:
        options["degree"] = args.degree
    site_mean = float(x.mean())
    if args.reduce is not None:
        route, sites = "eof", list(range(k))
        options["reduce"] = args.reduce
    elif args.window is not None:
        route, half = "window", args.window // 2
        sites = [(s + k) % k for s in range(-half, half + 1)]
        options["observable"] = kelr_dist.Observable(("x1", "x1^2"), CentreSite(half),
                                                     CentreSite(half).derivative)  # fmt: skip
    else:
        route, sites = "ring", list(range(k))
        moments = RingMoments(site_mean)
        labels = ("site mean", "mean square", *(f"{c}^2" for c in model.components))
        options["observable"] = kelr_dist.Observable(labels, moments, moments.derivative)
        options.update(index_set=args.index_set, neighbours="ring", symmetry=args.symmetry)
        # the uniform forcing (a change of F) as a column of its own: its standard errors
        # then hold the correlations between the sites' columns
        options["forcing"] = kelr_dist.Forcing(
            tuple(model.components), patterns=np.ones((1, k)), pattern_names=("F",)
        )
    names = [model.components[s] for s in sites]
    array = xr.DataArray(x[:, sites], dims=("time", "component"), coords={"component": names},
                         attrs={"dt": dt})  # fmt: skip
    ds = kelr_dist.estimate_response(array, **options)
    shape = ds["response"].transpose("lag", "i", "j").shape[1:]
    weights = row_weights(route, shape, k, site_mean)
    curves = {
        key: {row: weighted(ds, name, w, dt, "total") for row, w in weights.items()}
        for key, name in READS.items()
    }
    parts = {
        row: {part: weighted(ds, "response", w, dt, part) for part in PARTS}
        for row, w in weights.items()
    }
    return curves, ds, parts


# --------------------------------------------------------------------------------------------
# table and figure
# --------------------------------------------------------------------------------------------


def compare(measured: Curve, other: Curve | None, times: np.ndarray, horizon: float) -> tuple:
    """Over ``0 < t <= horizon``: the largest ``|R - R_direct|``, the share of times within two
    of the direct experiment's standard errors, the share beyond two combined standard errors,
    and the largest standard error of ``other``."""
    if other is None:
        return math.nan, math.nan, math.nan, math.nan
    keep = (times > 0) & (times <= horizon + 1e-9)
    gap = np.abs(other.value - measured.value)[keep]
    combined = np.sqrt(measured.stderr**2 + other.stderr**2)[keep]
    return (
        float(gap.max()),
        float(np.mean(gap <= 2 * measured.stderr[keep])),
        float(np.mean(gap > 2 * combined)),
        float(other.stderr[keep].max()),
    )


def cell(value: float, form: str) -> str:
    return "—" if math.isnan(value) else format(value, form)


def table(results: dict, times: np.ndarray, args: argparse.Namespace, heading: str) -> str:
    marks = [t for t in (0.5, 1.0, 2.0) if t <= args.max_time + 1e-9]
    at = [int(np.argmin(np.abs(times - t))) for t in marks]
    cells = " | ".join(f"direct R({t:g})" for t in marks)
    lines = [
        heading,
        "",
        f"| response | forcing | {cells} | qG: max err | qG: in direct 2se | package: max err | "
        "package: max se | package: in direct 2se | package: >2se | package / qG | "
        "qG on the package's coordinates: max err |",
        "|---|---|" + "---:|" * (len(marks) + 8),
    ]
    for label, name, kind in ROWS:
        measured = results["direct"][(name, kind)]
        qg = compare(measured, results["qg"].get((name, kind)), times, args.max_time)
        pk = compare(measured, results["package"].get((name, kind)), times, args.max_time)
        own = compare(measured, results["package-qg"].get((name, kind)), times, args.max_time)
        values = " | ".join(f"{measured.value[i]:.4f} ± {measured.stderr[i]:.4f}" for i in at)
        ratio = pk[0] / qg[0] if qg[0] > 0 else math.nan
        forcing = "site 1" if kind == "site" else "F"
        row = [(qg[0], ".4f"), (qg[1], ".0%"), (pk[0], ".4f"), (pk[3], ".4f"), (pk[1], ".0%"),
               (pk[2], ".0%"), (ratio, ".2f"), (own[0], ".4f")]  # fmt: skip
        lines.append(f"| {label} | {forcing} | {values} | "
                     + " | ".join(cell(v, f) for v, f in row) + " |")  # fmt: skip
    return "\n".join(lines)


def error_parts(parts: dict, times: np.ndarray, horizon: float) -> str:
    """The package's largest standard error over ``0 < t <= horizon`` per response, and its
    parts (:data:`PARTS`)."""
    keep = (times > 0) & (times <= horizon + 1e-9)
    lines = [
        "| response | forcing | total (bound) | sampling part (bound) | estimator part (bound) | "
        "total, root-sum-square |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for label, name, kind in ROWS:
        if (name, kind) in parts:
            errs = [float(parts[(name, kind)][part].stderr[keep].max()) for part in PARTS]
            forcing = "site 1" if kind == "site" else "F"
            lines.append(f"| {label} | {forcing} | " + " | ".join(f"{e:.4f}" for e in errs) + " |")
    return "\n".join(lines)


def figure(results: dict, times: np.ndarray, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(9, 7), sharex=True)
    for ax, (label, name, kind) in zip(axes.ravel(), ROWS, strict=True):
        measured = results["direct"][(name, kind)]
        low, high = measured.value - 2 * measured.stderr, measured.value + 2 * measured.stderr
        ax.fill_between(times, low, high, color="0.8", label="direct ± 2 se")
        ax.plot(times, measured.value, "k-", lw=1.2, label="direct")
        for key, style, text in (
            ("qg", "C0--", "quasi-Gaussian FDT"),
            ("package-qg", "C0:", "quasi-Gaussian, package's coordinates"),
            ("package", "C3-", "kelr_dist"),
        ):
            curve = results[key].get((name, kind))
            if curve is None:
                continue
            if key == "package":
                low, high = curve.value - 2 * curve.stderr, curve.value + 2 * curve.stderr
                ax.fill_between(times, low, high, color="C3", alpha=0.15, lw=0,
                                label="kelr_dist ± 2 total se")  # fmt: skip
            ax.plot(times, curve.value, style, lw=1.2, label=text)
        ax.set_title(f"{label}, forcing {'on site 1' if kind == 'site' else 'F'}", fontsize=10)
        ax.set_ylabel("step response")
    for ax in axes[1]:
        ax.set_xlabel("t")
    # one legend below the panels, where it hides no curve
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def warned(ds: xr.Dataset) -> str:
    """The categories of the warnings the estimate raised (the report's lines), or "none"."""
    return ", ".join(sorted({line.split(":")[0] for line in warning_lines(ds)}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--K", type=int, default=40, help="sites")
    parser.add_argument("--F", type=float, default=8.0, help="forcing")
    parser.add_argument("--sigma", type=float, default=0.5, help="additive noise")
    parser.add_argument("--samples", type=float, default=2e5, help="trajectory for the FDTs")
    parser.add_argument("--members", type=int, default=4000, help="direct experiment's members")
    parser.add_argument("--spacing", type=int, default=20, help="samples between members")
    parser.add_argument("--epsilon", type=float, default=0.25, help="uniform forcing ε")
    parser.add_argument("--site-epsilon", type=float, default=1.0, help="site forcing ε")
    parser.add_argument("--max-time", type=float, default=2.0, help="responses up to this t")
    routes = parser.add_mutually_exclusive_group()
    routes.add_argument("--window", type=int, help="estimate on this many neighbouring sites "
                       "instead of all K with the local score model")  # fmt: skip
    routes.add_argument("--reduce", help="estimate on the leading EOFs instead, e.g. 'eof(8)'")
    parser.add_argument("--symmetry", default="translation", choices=("translation", "none"),
                        help="the local score model's symmetry (all-sites route)")  # fmt: skip
    parser.add_argument("--index-set", default="local", choices=("local", "local-adaptive"),
                        help="the local score model's index set (all-sites route)")  # fmt: skip
    parser.add_argument("--estimator", default="score-matching", help="estimate_response's")
    parser.add_argument("--degree", type=int, help="the score model's degree (default: chosen "
                        "by held-out loss)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--output", type=Path, help="write the Markdown table here")
    parser.add_argument("--figure", type=Path, help="write the figure here")
    parser.add_argument("--result", type=Path, help="write the package's result here (netCDF)")
    args = parser.parse_args()
    if args.window is not None and (
        args.window < 1 or args.window % 2 == 0 or args.window > args.K
    ):
        raise SystemExit(f"--window={args.window} must be an odd number of sites from 1 to K")
    try:
        model = Lorenz96(K=args.K, F=args.F, sigma=args.sigma)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    lags = int(round(args.max_time / model.dt))
    times = np.arange(lags + 1) * model.dt

    started = time.perf_counter()
    x = equilibrium(model, int(args.samples), args.seed)
    centred = (x - x.mean()) / x.std()
    skewness, kurtosis = float((centred**3).mean()), float((centred**4).mean() - 3.0)
    print(f"trajectory: {x.shape}, {time.perf_counter() - started:.0f} s; mean {x.mean():.3f}, "
          f"std {x.std():.3f}, skewness {skewness:.3f}, "
          f"excess kurtosis {kurtosis:.3f}")  # fmt: skip
    results: dict = {}
    started = time.perf_counter()
    results["qg"] = quasi_gaussian(x, lags, model.dt)
    print(f"quasi-Gaussian FDT: {time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    curves, ds, parts = package(x, model, args, lags)
    results.update(curves)
    if args.result is not None:
        ds.to_netcdf(args.result)
    if args.reduce is not None:
        route = f"`reduce={args.reduce}`"
        fitted = f"explained variance {ds.attrs['explained_variance']:.3f}"
    elif args.window is not None:
        route, fitted = f"a window of {args.window} sites", f"degree {ds.attrs.get('degree')}"
    else:
        route = (
            f"all {args.K} sites, local score model (ring, symmetry {args.symmetry}, "
            f"index set {ds.attrs.get('score_matching_index_set')})"
        )
        fitted = (
            f"radius {ds.attrs.get('local_radius')}, degree {ds.attrs.get('degree')}, "
            f"{ds.attrs.get('score_matching_features')} features"
        )
    print(f"package: {ds.attrs['estimator']}, {fitted}, "
          f"{time.perf_counter() - started:.0f} s")  # fmt: skip
    started = time.perf_counter()
    starts = equilibrium(model, args.members * args.spacing, args.seed + 1)[:: args.spacing]
    results["direct"] = direct(model, starts, lags, args.epsilon, args.site_epsilon, args.seed + 2)
    print(f"direct experiment: {args.members} members x 2 signs x 2 forcings, "
          f"{time.perf_counter() - started:.0f} s")  # fmt: skip

    heading = (
        f"Lorenz-96, K = {args.K}, F = {args.F:g}, sigma = {args.sigma:g}; N = "
        f"{int(args.samples):.0e} samples (dt = {model.dt:g}) for the FDTs, package on {route} "
        f"({ds.attrs['estimator']}, {fitted}); direct: {args.members} members, "
        f"ε = {args.epsilon:g} (F), {args.site_epsilon:g} (site 1); "
        f"errors over t <= {args.max_time:g}; the package's warnings: {warned(ds)}"
    )
    text = (
        f"{table(results, times, args, heading)}\n\nThe package's largest standard error over "
        f"t <= {args.max_time:g} and its parts:\n\n{error_parts(parts, times, args.max_time)}"
    )
    print(text)
    if args.output is not None:
        command = " ".join(["python", "scripts/lorenz96_response.py", *sys.argv[1:]])
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(
            f"{text}\n\n`{command}` ({stamp}, {platform.machine()}, {platform.python_version()})\n"
        )
        print(f"wrote {args.output}")
    if args.figure is not None:
        figure(results, times, args.figure, heading.split(";")[0])
        print(f"wrote {args.figure}")


if __name__ == "__main__":
    main()
