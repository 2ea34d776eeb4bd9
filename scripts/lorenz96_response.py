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
2. *This package*, on one equilibrium trajectory of ``--samples`` samples: with ``--window m``
   the estimate runs on the ``m`` neighbouring sites centred on site 1 (observables ``x_1`` and
   ``x_1²``), and the responses are read with the ring's translation symmetry: the site mean's
   response to a forcing on site 1 is ``(1/K) Σ_b k_{x_1, b}``, its response to ``F`` is
   ``Σ_b k_{x_1, b}``, the variance's ``k_{x_1², b} - 2 x̄_1 k_{x_1, b}`` (at ``b = 1``, or summed
   over ``b``): what lies outside the window is left out. With ``--reduce eof(k)`` the estimate
   runs on all ``K`` sites' leading ``k`` EOFs (the response of the projected dynamics), for the
   site mean only.
3. *Quasi-Gaussian FDT* (Leith 1975; Majda, Abramov & Gershgorin 2010) on the same trajectory,
   with all ``K`` sites: the score of the fitted Gaussian, ``B = c^T C^{-1} (x - x̄)``; its
   standard errors by batch means over the trajectory. As a diagnostic, the package's own
   quasi-Gaussian baseline on the package's coordinates (the window or the EOFs) too: where it
   is as far off as the package, the coordinates (what the window leaves out), not the score
   model, limit the estimate.

Printed and written (``--output``, a Markdown table; ``--figure``): the direct responses at a few
times with their standard errors, and for the package and the quasi-Gaussian FDT the largest
``|R - R_direct|`` over ``t <= --max-time`` and how much of it lies beyond two combined standard
errors.

    python scripts/lorenz96_response.py --F 8 --sigma 0.5 --samples 2e5 --members 4000 \\
        --window 5 --output docs/benchmarks/lorenz96.md \\
        --figure docs/figures/lorenz96/response.png
    python scripts/lorenz96_response.py --F 5 --sigma 0.1 --window 5
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
from kelr_dist.models.lorenz96 import Lorenz96

#: the responses compared: (label, observable, forcing)
ROWS = (
    ("site mean", "mean", "site"),
    ("variance of site 1", "variance", "site"),
    ("site mean", "mean", "F"),
    ("variance of a site", "variance", "F"),
)
#: the package's estimate and its quasi-Gaussian baseline on the same coordinates
READS = {"package": "response", "window-qg": "response_gaussian"}
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


def batch_means(values: np.ndarray, axis: int) -> Curve:
    """Mean of ``values`` along ``axis`` with its batch-means standard error (``BATCHES``
    contiguous batches)."""
    per = np.stack([b.mean(axis) for b in np.array_split(values, BATCHES, axis=axis)])
    return Curve(values.mean(axis), per.std(0, ddof=1) / math.sqrt(BATCHES))


# --------------------------------------------------------------------------------------------
# 1. direct perturbation
# --------------------------------------------------------------------------------------------


def direct(
    model: Lorenz96, starts: np.ndarray, outputs: int, eps: float, site_eps: float, seed: int
) -> dict[tuple[str, str], Curve]:
    """The direct experiment: both forcings, both signs, common random numbers per member."""
    k = model.K
    members = starts.shape[0]
    forcings = {"site": site_eps * np.eye(k)[0], "F": np.full(k, eps)}
    out = {}
    for kind, pattern in forcings.items():
        states = np.empty((2, members, outputs + 1, k))
        for m, start in enumerate(starts):
            for s, sign in enumerate((1.0, -1.0)):
                rng = np.random.default_rng([seed, m])
                states[s, m, 0] = start
                states[s, m, 1:] = model.advance(start, outputs, rng, sign * pattern)[0]
        size = float(np.max(pattern))
        mean = states.mean(axis=3)  # the site mean, (2, M, T)
        out[("mean", kind)] = batch_means((mean[0] - mean[1]) / (2 * size), axis=0)
        # ensemble variances per batch of members: of site 1, or averaged over the sites
        chosen = states[..., :1] if kind == "site" else states
        per = np.stack(
            [
                (chosen[0][b].var(0, ddof=1) - chosen[1][b].var(0, ddof=1)).mean(-1) / (2 * size)
                for b in np.array_split(np.arange(members), BATCHES)
            ]
        )
        out[("variance", kind)] = Curve(per.mean(0), per.std(0, ddof=1) / math.sqrt(BATCHES))
    return out


# --------------------------------------------------------------------------------------------
# 3. quasi-Gaussian FDT
# --------------------------------------------------------------------------------------------


def lagged(a: np.ndarray, b: np.ndarray, lags: int) -> np.ndarray:
    """``mean_n a[n + s] b[n]`` for ``s = 0..lags``."""
    n = a.shape[0]
    return np.array([np.mean(a[s:] * b[: n - s]) for s in range(lags + 1)])


def quasi_gaussian(x: np.ndarray, lags: int, dt: float) -> dict[tuple[str, str], Curve]:
    """The quasi-Gaussian FDT's step responses with batch-means standard errors."""
    mean = x.mean(0)
    centred = x - mean
    precision = np.linalg.inv(np.cov(x.T))
    conjugate = {"site": centred @ precision[:, 0], "F": centred @ precision.sum(axis=1)}
    observables = {
        ("mean", "site"): centred.mean(1),
        ("variance", "site"): centred[:, 0] ** 2,
        ("mean", "F"): centred.mean(1),
        ("variance", "F"): (centred**2).mean(1),
    }
    out = {}
    for (name, kind), a in observables.items():
        a = a - a.mean()
        b = conjugate[kind]
        per = np.stack(
            [
                trapezoid(lagged(a[p], b[p], lags), dt)
                for p in np.array_split(np.arange(len(a)), BATCHES)
            ]
        )
        whole = trapezoid(lagged(a, b, lags), dt)
        out[(name, kind)] = Curve(whole, per.std(0, ddof=1) / math.sqrt(BATCHES))
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


def eof_curves(ds: xr.Dataset, name: str, dt: float) -> dict[tuple[str, str], Curve]:
    """The site mean's step responses from a lifted ``(lag, i, j)`` response ``name``."""
    resp, err = ds[name].values, ds[f"{name}_total_stderr"].values
    site = trapezoid(resp[:, :, 0].mean(1), dt), trapezoid_bound(err[:, :, 0].mean(1), dt)
    uniform = trapezoid(resp.sum(2).mean(1), dt), trapezoid_bound(err.sum(2).mean(1), dt)
    return {("mean", "site"): Curve(*site), ("mean", "F"): Curve(*uniform)}


def window_curves(
    ds: xr.Dataset, name: str, dt: float, sites: int, site_mean: float
) -> dict[tuple[str, str], Curve]:
    """The four step responses from a window's ``(lag, (x_c, x_c²), b)`` response ``name``, by
    translation symmetry (see the module docstring); ``sites``: ``K``."""
    resp = ds[name].transpose("lag", "i", "j").values
    err = ds[f"{name}_total_stderr"].transpose("lag", "i", "j").values
    variance = resp[:, 1] - 2 * site_mean * resp[:, 0]
    variance_err = err[:, 1] + 2 * abs(site_mean) * err[:, 0]
    centre = resp.shape[2] // 2

    def curve(values: np.ndarray, errors: np.ndarray, scale: float = 1.0) -> Curve:
        return Curve(scale * trapezoid(values, dt), scale * trapezoid_bound(errors, dt))

    return {
        ("mean", "site"): curve(resp[:, 0].sum(1), err[:, 0].sum(1), 1.0 / sites),
        ("variance", "site"): curve(variance[:, centre], variance_err[:, centre]),
        ("mean", "F"): curve(resp[:, 0].sum(1), err[:, 0].sum(1)),
        ("variance", "F"): curve(variance.sum(1), variance_err.sum(1)),
    }


def package(
    x: np.ndarray, model: Lorenz96, args: argparse.Namespace, lags: int
) -> tuple[dict[str, dict[tuple[str, str], Curve]], xr.Dataset]:
    """This package's step responses (on a window or on EOFs) and, as a diagnostic, those of
    its quasi-Gaussian baseline on the same coordinates (``"package"``, ``"window-qg"``), and
    its result."""
    k, dt = model.K, model.dt
    options = dict(max_lag=lags, estimator=args.estimator, client="synchronous", gaussian=True)
    if args.reduce is not None:
        coords = {"component": list(model.components)}
        data = xr.DataArray(x, dims=("time", "component"), coords=coords, attrs={"dt": dt})
        ds = kelr_dist.estimate_response(data, reduce=args.reduce, **options)
        curves = {key: eof_curves(ds, name, dt) for key, name in READS.items()}
        return curves, ds
    half = args.window // 2
    sites = [(s + k) % k for s in range(-half, half + 1)]
    names = [model.components[s] for s in sites]
    data = xr.DataArray(x[:, sites], dims=("time", "component"), coords={"component": names},
                        attrs={"dt": dt})  # fmt: skip
    centre = CentreSite(half)
    observable = kelr_dist.Observable(("x1", "x1^2"), centre, centre.derivative)
    ds = kelr_dist.estimate_response(data, observable=observable, **options)
    site_mean = float(x[:, 0].mean())
    curves = {key: window_curves(ds, name, dt, k, site_mean) for key, name in READS.items()}
    return curves, ds


# --------------------------------------------------------------------------------------------
# table and figure
# --------------------------------------------------------------------------------------------


def compare(measured: Curve, other: Curve | None, times: np.ndarray, horizon: float) -> tuple:
    """Largest ``|R - R_direct|`` over ``0 < t <= horizon``, the share of those times beyond
    two combined standard errors, and the largest standard error of ``other`` there."""
    if other is None:
        return math.nan, math.nan, math.nan
    keep = (times > 0) & (times <= horizon + 1e-9)
    gap = np.abs(other.value - measured.value)[keep]
    combined = np.sqrt(measured.stderr**2 + other.stderr**2)[keep]
    return float(gap.max()), float(np.mean(gap > 2 * combined)), float(other.stderr[keep].max())


def table(results: dict, times: np.ndarray, args: argparse.Namespace, heading: str) -> str:
    marks = [t for t in (0.5, 1.0, 2.0) if t <= args.max_time + 1e-9]
    at = [int(np.argmin(np.abs(times - t))) for t in marks]
    cells = " | ".join(f"direct R({t:g})" for t in marks)
    lines = [
        heading,
        "",
        f"| response | forcing | {cells} | quasi-Gaussian: max err | >2se | package: max err | "
        "max se | >2se | package / qG | qG on the package's coordinates: max err |",
        "|---|---|" + "---:|" * (len(marks) + 7),
    ]
    for label, name, kind in ROWS:
        measured = results["direct"][(name, kind)]
        qg = compare(measured, results["qg"].get((name, kind)), times, args.max_time)
        pk = compare(measured, results["package"].get((name, kind)), times, args.max_time)
        local = compare(measured, results["window-qg"].get((name, kind)), times, args.max_time)
        values = " | ".join(f"{measured.value[i]:.4f} ± {measured.stderr[i]:.4f}" for i in at)
        ratio = pk[0] / qg[0] if qg[0] > 0 else math.nan
        forcing = "site 1" if kind == "site" else "F"
        lines.append(
            f"| {label} | {forcing} | {values} | {qg[0]:.4f} | {qg[1]:.0%} | "
            + ("—" if math.isnan(pk[0]) else f"{pk[0]:.4f}")
            + " | "
            + ("—" if math.isnan(pk[2]) else f"{pk[2]:.4f}")
            + " | "
            + ("—" if math.isnan(pk[1]) else f"{pk[1]:.0%}")
            + " | "
            + ("—" if math.isnan(ratio) else f"{ratio:.2f}")
            + " | "
            + ("—" if math.isnan(local[0]) else f"{local[0]:.4f}")
            + " |"
        )
    return "\n".join(lines)


def figure(results: dict, times: np.ndarray, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(9, 6.5), sharex=True)
    for ax, (label, name, kind) in zip(axes.ravel(), ROWS, strict=True):
        measured = results["direct"][(name, kind)]
        low, high = measured.value - 2 * measured.stderr, measured.value + 2 * measured.stderr
        ax.fill_between(times, low, high, color="0.8", label="direct ± 2 se")
        ax.plot(times, measured.value, "k-", lw=1.2, label="direct")
        for key, style, text in (
            ("qg", "C0--", "quasi-Gaussian FDT"),
            ("window-qg", "C0:", "quasi-Gaussian, package's coordinates"),
            ("package", "C3-", "kelr_dist"),
        ):
            curve = results[key].get((name, kind))
            if curve is not None:
                ax.plot(times, curve.value, style, lw=1.2, label=text)
        ax.set_title(f"{label}, forcing {'on site 1' if kind == 'site' else 'F'}", fontsize=10)
        ax.set_xlabel("t")
        ax.set_ylabel("step response")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


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
    window = parser.add_mutually_exclusive_group()
    window.add_argument("--window", type=int, default=5, help="neighbouring sites estimated on")
    window.add_argument("--reduce", help="estimate on the leading EOFs instead, e.g. 'eof(8)'")
    parser.add_argument("--estimator", default="score-matching", help="estimate_response's")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--output", type=Path, help="write the Markdown table here")
    parser.add_argument("--figure", type=Path, help="write the figure here")
    args = parser.parse_args()
    if args.reduce is None and (args.window < 1 or args.window % 2 == 0 or args.window > args.K):
        raise SystemExit(f"--window={args.window} must be an odd number of sites from 1 to K")
    try:
        model = Lorenz96(K=args.K, F=args.F, sigma=args.sigma)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    lags = int(round(args.max_time / model.dt))
    times = np.arange(lags + 1) * model.dt

    started = time.perf_counter()
    x = equilibrium(model, int(args.samples), args.seed)
    skewness = float(((x - x.mean()) ** 3).mean() / x.std() ** 3)
    print(f"trajectory: {x.shape}, {time.perf_counter() - started:.0f} s; mean {x.mean():.3f}, "
          f"std {x.std():.3f}, skewness {skewness:.3f}")  # fmt: skip
    results: dict = {}
    started = time.perf_counter()
    results["qg"] = quasi_gaussian(x, lags, model.dt)
    print(f"quasi-Gaussian FDT: {time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    curves, ds = package(x, model, args, lags)
    results.update(curves)
    explained = f", explained variance {ds.attrs['explained_variance']:.3f}" if args.reduce else ""
    print(f"package ({args.reduce or f'window {args.window}'}): estimator "
          f"{ds.attrs['estimator']}, {time.perf_counter() - started:.0f} s{explained}")  # fmt: skip
    started = time.perf_counter()
    starts = equilibrium(model, args.members * args.spacing, args.seed + 1)[:: args.spacing]
    results["direct"] = direct(model, starts, lags, args.epsilon, args.site_epsilon, args.seed + 2)
    print(f"direct experiment: {args.members} members x 2 signs x 2 forcings, "
          f"{time.perf_counter() - started:.0f} s")  # fmt: skip

    route = f"`reduce={args.reduce}`" if args.reduce else f"a window of {args.window} sites"
    heading = (
        f"Lorenz-96, K = {args.K}, F = {args.F:g}, sigma = {args.sigma:g}; N = "
        f"{int(args.samples):.0e} samples (dt = {model.dt:g}) for the FDTs, package on {route} "
        f"({ds.attrs['estimator']}); direct: {args.members} members, ε = {args.epsilon:g} "
        f"(F), {args.site_epsilon:g} (site 1); errors over t <= {args.max_time:g}"
    )
    text = table(results, times, args, heading)
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
