"""How a small constant forcing moves a whole distribution: FDT prediction against the perturbed
system itself, and against the exact FDT.

For a system with a simulator and a closed-form ``p_eq`` (the triple-well of the paper, eq. 59;
the under-damped Langevin-Morse system, eq. 64, whose dynamics is not reversible; two systems of
the accuracy suite sampled by Metropolis-adjusted Langevin, :mod:`kelr_dist.models.mala`: the
three wells in a curved valley ``curved-wells`` and the double well driving two skewed
coordinates ``coupled-3d``), on one equilibrium trajectory of ``--samples`` samples:

1. *FDT, estimated and exact.* Two estimates, ``observable="pdf(bins=K)"`` and
   ``"moments"``, each with the exact-FDT response on the same samples (``exact=True``).
   Printed: the largest error of the estimated PDF response ``k_b(t) / h`` against the exact one
   as a fraction of the PDF's peak (with its time, bin and forcing, and the largest residual of
   the lag-0 identity ``k_b(0) = E[A_b']`` of estimate and exact reference, which says which of
   the two is off), and the variance response's largest error in its total standard errors.
2. *Direct perturbation experiment* (needs no score). ``--members`` equilibrium states (from an
   independent trajectory, ``--spacing`` samples apart) are integrated by the model's own scheme
   with the constant forcing ``+ε`` and ``-ε`` on the forced component, with common random numbers
   (the same noise for both). A MALA chain follows ``dX = s(X) dt + sqrt(2) dW`` (``s = ∇ log p``,
   time ``step`` per MALA step), for which the forcing ``ε e_j`` is the tilted target
   ``p(x) exp(ε x_j)``: the forced chain is MALA on that target (the model's ``tilt``), with the
   same proposals' noise and the same uniforms of the accept/reject test for both signs; the chain
   follows the diffusion only while its step is small (few rejections), so the MALA systems run with
   ``--model step=0.005`` and a sample interval that resolves the response's fastest decay (the
   FDT's step response is a sum over the lags). The central difference
   ``(E_{+ε}[A(X_t)] - E_{-ε}[A(X_t)]) / 2ε`` of the same bin functions and moments, with its
   batch-means standard error over the members, is the response to a unit step forcing up to
   ``O(ε²)``. Printed: its largest deviation from the FDT's step response (eq. 4) in combined
   standard errors, the FDT's propagated both ways of :mod:`kelr_dist.edges.analysis`: ``bound``
   (conservative) and ``independent`` (too small when the errors of neighbouring lags are
   correlated, as they are here).

    python scripts/perturbation_experiment.py --system triple-well --samples 1e6
    python scripts/perturbation_experiment.py --system langevin-morse --samples 1e6 \\
        --figure docs/figures/distribution_langevin_morse.png
    python scripts/perturbation_experiment.py --system curved-wells --samples 1e6 \\
        --model step=0.005 subsample=6 --estimator score-matching
    python scripts/perturbation_experiment.py --system coupled-3d --samples 1e6 \\
        --model step=0.005 subsample=8 --estimator score-matching
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from numba import njit

import kelr_dist
from kelr_dist.edges.distribution import distribution_grid, distribution_record
from kelr_dist.edges.distribution_plot import plot_distribution
from kelr_dist.kernels.observables.distribution import DistributionGrid, distribution_values
from kelr_dist.models.integrators import morse_point, triple_well_point
from kelr_dist.models.mala import MalaSystem
from kelr_dist.models.registry import Model, make_model

#: system -> (forced component index, time span of the response in its time units)
SYSTEMS = {
    "triple-well": (0, 3.0),
    "langevin-morse": (1, 6.0),
    "curved-wells": (0, 6.0),
    "coupled-3d": (1, 8.0),
}
#: batches of the batch-means standard error of the direct experiment
BATCHES = 40


@njit(cache=False)
def _forced_triple_well(x0, eps, j, step, steps, outputs, a, gamma, kT, radial, rng):  # noqa: ANN001
    """Weak trapezoidal scheme (as the model's) with the drift ``-∇V ± ε e_j``, same noise for
    both signs: states ``(2, outputs + 1, M, 2)`` every ``steps`` steps."""
    half = 0.5 * step
    noise = math.sqrt(2.0 * kT) * math.sqrt(half)
    out = np.empty((2, outputs + 1, x0.shape[0], 2))
    for m in range(x0.shape[0]):
        for s in range(2):
            out[s, 0, m] = x0[m]
        x = np.empty((2, 2))
        x[0] = x0[m]
        x[1] = x0[m]
        for k in range(outputs):
            for _ in range(steps):
                z1 = rng.standard_normal()
                z2 = rng.standard_normal()
                z3 = rng.standard_normal()
                z4 = rng.standard_normal()
                for s in range(2):
                    f1 = (eps if s == 0 else -eps) if j == 0 else 0.0
                    f2 = (eps if s == 0 else -eps) if j == 1 else 0.0
                    _, g1, g2 = triple_well_point(x[s, 0], x[s, 1], a, gamma, radial)
                    y1 = x[s, 0] + noise * z1 + half * (f1 - g1)
                    y2 = x[s, 1] + noise * z2 + half * (f2 - g2)
                    _, h1, h2 = triple_well_point(y1, y2, a, gamma, radial)
                    x[s, 0] += noise * (z1 + z3) + step * (f1 - h1)
                    x[s, 1] += noise * (z2 + z4) + step * (f2 - h2)
            for s in range(2):
                out[s, k + 1, m] = x[s]
    return out


@njit(cache=False)
def _forced_langevin(x0, eps, step, steps, outputs, gamma, kT, epsilon, a, centre, rng):  # noqa: ANN001
    """BAOAB (as the model's) with the force ``-U'(x) ± ε`` on the velocity, same noise for both
    signs: states ``(2, outputs + 1, M, 2)`` every ``steps`` steps."""
    half = 0.5 * step
    damping = math.exp(-gamma * step)
    kick = math.sqrt(kT * (1.0 - damping * damping))
    out = np.empty((2, outputs + 1, x0.shape[0], 2))
    for m in range(x0.shape[0]):
        for s in range(2):
            out[s, 0, m] = x0[m]
        x = np.empty((2, 2))
        x[0] = x0[m]
        x[1] = x0[m]
        for k in range(outputs):
            for _ in range(steps):
                z = rng.standard_normal()
                for s in range(2):
                    force = eps if s == 0 else -eps
                    p, v = x[s, 0], x[s, 1]
                    v += half * (force - morse_point(p, epsilon, a, centre)[1])
                    p += half * v
                    v = damping * v + kick * z
                    p += half * v
                    v += half * (force - morse_point(p, epsilon, a, centre)[1])
                    x[s, 0], x[s, 1] = p, v
            for s in range(2):
                out[s, k + 1, m] = x[s]
    return out


def _forced_mala(
    model: MalaSystem, x0: np.ndarray, eps: float, j: int, every: int, outputs: int, seed: int
) -> np.ndarray:
    """The MALA chains on ``p(x) exp(±ε x_j)`` from each state of ``x0 (M, d)``, one seed per
    member for both signs (common random numbers): states ``(2, outputs + 1, M, d)`` every
    ``every`` stored samples."""
    tilt = np.zeros(x0.shape[1])
    tilt[j] = eps
    out = np.empty((2, outputs + 1, *x0.shape))
    out[:, 0] = x0
    for m, start in enumerate(x0):
        for s, sign in enumerate((1.0, -1.0)):
            rng = np.random.default_rng([seed, m])
            chain, _ = model.advance(start, outputs * every, rng, tilt=sign * tilt)
            out[s, 1:, m] = chain[every - 1 :: every]
    return out


def build(system: str, settings: list[str]) -> Model:
    """The model ``system`` with the parameters ``name=value`` of ``settings``."""
    params = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep:
            raise SystemExit(f"--model: {setting!r} must be name=value")
        try:
            params[key] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            raise SystemExit(f"--model: {setting!r} must be name=number") from None
    try:
        return make_model(system, **params)
    except ValueError as error:
        raise SystemExit(f"--model: {error}") from None


def equilibrium(model: Model, samples: int, seed: int) -> np.ndarray:
    """An equilibrium trajectory ``(samples, d)`` after the model's burn-in."""
    rng = np.random.default_rng(seed)
    state = model.initial_state(rng)
    burn, _ = model.advance(state, model.default_burn_in, rng)
    return model.advance(burn[-1], samples, rng)[0]


def direct(
    system: str, model: Model, members: int, spacing: int, eps: float, outputs: int, seed: int
) -> tuple:
    """The direct experiment's states ``(2, outputs + 1, M, d)`` and output times (at most
    ``outputs``, on whole stored samples within the time span)."""
    forced, span = SYSTEMS[system]
    starts = equilibrium(model, members * spacing, seed)[::spacing]
    if isinstance(model, MalaSystem):
        every = max(1, int(round(span / outputs / model.dt)))
        outputs = min(outputs, int(span / (every * model.dt) + 1e-9))
        states = _forced_mala(model, starts, eps, forced, every, outputs, seed)
        return states, np.arange(outputs + 1) * every * model.dt
    sde: Any = model  # the triple-well's or the Langevin-Morse system's own parameters
    steps = int(round(span / outputs / sde.step))
    if system == "triple-well":
        states = _forced_triple_well(
            starts, eps, forced, sde.step, steps, outputs, sde.a, sde.gamma, sde.kT,
            sde.variant == "radial", np.random.default_rng(seed),
        )  # fmt: skip
    else:
        states = _forced_langevin(
            starts, eps, sde.step, steps, outputs, sde.gamma, sde.kT, sde.epsilon,
            sde.a, sde.x0, np.random.default_rng(seed),
        )  # fmt: skip
    return states, np.arange(outputs + 1) * steps * sde.step


def central_difference(
    grid: DistributionGrid, states: np.ndarray, eps: float, bounded: bool
) -> tuple:
    """``(E_+ [A] - E_- [A]) / 2ε`` ``(outputs + 1, q)`` and its batch-means standard error.

    ``bounded``: the observables take values in ``[0, 1]`` (the bins). A bin that no member
    reaches has a batch-means standard error of 0, though ``M`` members cannot resolve a mean
    difference below about ``1 / (2ε M)`` (one member moving across the whole bin): that is the
    floor of the bins' standard error."""
    diff = np.stack(
        [
            (distribution_values(grid, states[0, k]) - distribution_values(grid, states[1, k]))
            / (2 * eps)
            for k in range(states.shape[1])
        ]
    )  # (outputs + 1, M, q)
    batches = np.array_split(diff, BATCHES, axis=1)
    means = np.stack([b.mean(axis=1) for b in batches])  # (BATCHES, outputs + 1, q)
    stderr = means.std(axis=0, ddof=1) / math.sqrt(BATCHES)
    if bounded:
        stderr = np.maximum(stderr, 1.0 / (2 * eps * diff.shape[1]))
    return diff.mean(axis=1), stderr


def step_response(
    ds: xr.Dataset, name: str, forced: str, errors: str
) -> tuple[np.ndarray, np.ndarray]:
    """FDT step response ``(lag, q)`` to a unit step on ``forced`` with its standard error."""
    forcing = kelr_dist.step(1.0, ds["time"].values, j=forced)
    out = kelr_dist.predict_response(ds[name], forcing, stderr=ds[f"{name}_stderr"], errors=errors)
    return out.values, out["stderr"].values


def stein_misfit(ds: xr.Dataset, component: str, suffix: str, stderr: str = "total_stderr") -> str:
    """The largest lag-0 Stein residual of ``component``'s observables in its (total) standard
    errors, with its value and entry."""
    rows = [str(i).startswith(f"{component}:") for i in ds["i"].values]
    residual = ds[f"stein_residual{suffix}"].isel(i=rows)
    z = abs(residual) / ds[f"stein_residual{suffix}_{stderr}"].isel(i=rows)
    at = np.unravel_index(int(np.argmax(z.values)), z.shape)
    entry, forcing = residual["i"].values[at[0]], residual["j"].values[at[1]]
    return (f"{float(z.values[at]):.1f} s.e. ({float(residual.values[at]):+.4f} at {entry}, "
            f"forcing on {forcing})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--system", choices=list(SYSTEMS), default="triple-well")
    parser.add_argument("--samples", type=float, default=1e6)
    parser.add_argument("--bins", type=int, default=40)
    parser.add_argument("--members", type=int, default=20000)
    parser.add_argument("--spacing", type=int, default=20, help="samples between members")
    parser.add_argument("--epsilon", type=float, default=0.25, help="forcing amplitude ε")
    parser.add_argument("--outputs", type=int, default=12, help="times compared")
    parser.add_argument("--figure", type=Path, help="write the PDF-response figure here")
    parser.add_argument(
        "--cache", type=Path, help="folder that keeps the estimates and the direct experiment's "
        "states (a second run with the same arguments reuses them)",
    )  # fmt: skip
    parser.add_argument("--estimator", default="auto", help="estimate_response's estimator")
    parser.add_argument(
        "--model", nargs="+", default=[], metavar="NAME=VALUE", help="model parameters, e.g. "
        "for a MALA system step=0.005 subsample=6: the FDT with the score is the response of "
        "dX = s dt + sqrt(2) dW, which the chain follows only while its step is small (few "
        "rejections), and the step response sums the lags, so the stored interval must resolve "
        "the response's fastest decay",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    system, samples = args.system, int(args.samples)
    forced_index, span = SYSTEMS[system]
    model = build(system, args.model)

    started = time.perf_counter()
    name = "-".join([system, *args.model])
    tag = f"{name}-{samples:.0e}-{args.bins}-{args.estimator}-{args.seed}"
    results = {}
    for observable in (f"pdf(bins={args.bins})", "moments"):
        kind = observable.split("(")[0]
        cached = None if args.cache is None else args.cache / f"{tag}-{kind}.nc"
        if cached is not None and cached.exists():
            results[kind] = xr.load_dataset(cached)
            continue
        x = xr.DataArray(
            equilibrium(model, samples, args.seed),
            dims=("time", "component"),
            coords={"component": list(model.components)},
            attrs={"dt": model.dt},
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results[kind] = kelr_dist.estimate_response(
                x, observable=observable, max_time=span, score=model.score,
                estimator=args.estimator,
            )  # fmt: skip
        for w in caught:
            print(f"  [{observable}] {w.category.__name__}: {str(w.message)[:150]}")
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            results[kind].to_netcdf(cached)
    pdf, moments = results["pdf"], results["moments"]
    components = [str(c) for c in pdf["component"].values]
    forced = components[forced_index]
    print(f"{system}: N = {samples:.0e}, estimator {pdf.attrs['estimator']}, "
          f"{time.perf_counter() - started:.0f} s for both estimates")  # fmt: skip

    # 1. estimated against exact FDT, same samples and bin observables
    for component in components:
        est = kelr_dist.distribution_response(pdf, component)
        exact = kelr_dist.distribution_response(pdf, component, name="response_exact")
        peak = float(exact["equilibrium"].max())
        gap = np.abs(est["response"] - exact["response"])
        error = float(gap.max())
        at = {k: v.item() for k, v in gap.argmax(...).items()}
        where = float(gap["time"][at["lag"]]), float(gap["bin"][at["bin"]]), components[at["j"]]
        stderr = float(est["response_stderr"].max())
        print(f"  PDF response of {component}: max |k̂ - k_exact| / h = {error:.4f} = "
              f"{error / peak:.4f} of the PDF's peak {peak:.3f} "
              f"(max s.e. {stderr:.4f}; at t = {where[0]:.3g}, x = {where[1]:.3g}, "
              f"forcing on {where[2]})")  # fmt: skip
        print(f"    lag-0 identity k_b(0) = E[A_b'] (Stein residual), {component}'s bins: "
              f"{stein_misfit(pdf, component, '')} estimated, "
              f"{stein_misfit(pdf, component, '_exact')} exact")  # fmt: skip
        if "stein_residual_uncorrected" in pdf:
            print(f"    before the Stein correction: "
                  f"{stein_misfit(pdf, component, '_uncorrected', 'stderr')}")  # fmt: skip
        mom = kelr_dist.distribution_response(moments, component)
        mom_exact = kelr_dist.distribution_response(moments, component, name="response_exact")
        diff = (mom["response"] - mom_exact["response"]).sel(moment=2.0)
        z = np.abs(diff) / mom["response_total_stderr"].sel(moment=2.0)
        size = float(np.abs(mom_exact["response"].sel(moment=2.0)).max())
        print(f"  variance response of {component}: max |k̂ - k_exact| = "
              f"{float(np.abs(diff).max()):.4f}, max {float(z.max()):.2f} total s.e. "
              f"(|k_exact| up to {size:.3f})")  # fmt: skip

    # 2. direct perturbation experiment
    started = time.perf_counter()
    direct_tag = f"{name}-{args.members}-{args.spacing}-{args.epsilon}-{args.outputs}-{args.seed}"
    cached = None if args.cache is None else args.cache / f"{direct_tag}-direct.npz"
    if cached is not None and cached.exists():
        states, times = (np.load(cached)[key] for key in ("states", "times"))
    else:
        states, times = direct(system, model, args.members, args.spacing, args.epsilon,
                               args.outputs, args.seed + 1)  # fmt: skip
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            np.savez(cached, states=states, times=times)
    print(f"direct experiment: {args.members} members × 2 signs, ε = {args.epsilon}, "
          f"{time.perf_counter() - started:.0f} s")  # fmt: skip
    lags = np.rint(times / model.dt).astype(int)
    for label, ds in (("pdf", pdf), ("moments", moments)):
        measured, measured_se = central_difference(
            distribution_grid(ds), states, args.epsilon, bounded=label == "pdf"
        )
        for name, errors in [(n, e) for n in ("response", "response_exact")
                             for e in ("bound", "independent")]:  # fmt: skip
            predicted, predicted_se = step_response(ds, name, forced, errors)
            predicted, predicted_se = predicted[lags], predicted_se[lags]
            z = np.abs(measured - predicted) / np.sqrt(measured_se**2 + predicted_se**2 + 1e-300)
            z[0] = 0.0  # both are 0 at t = 0
            worst = np.unravel_index(np.argmax(z), z.shape)
            scale = 1.0
            if label == "pdf":
                scale = float(np.max(distribution_record(ds)["equilibrium"]))
            error = np.abs(measured - predicted).max() / scale
            print(f"  {label:8s} {name:15s} {errors:11s}: max |direct - FDT| {error:.4f}"
                  f"{' of the bin mass peak' if label == 'pdf' else ''}; max {z.max():.2f} "
                  f"combined s.e. (at t = {times[worst[0]]:.3g}, {ds['i'].values[worst[1]]}: "
                  f"direct {measured[worst]:.3g} ± {measured_se[worst]:.2g}, FDT "
                  f"{predicted[worst]:.3g} ± {predicted_se[worst]:.2g}); "
                  f"{np.mean(z[1:] > 2):.1%} beyond 2 s.e.")  # fmt: skip
    if args.figure is not None:
        fig = plot_distribution(pdf, forced)
        args.figure.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.figure, dpi=110)
        print(f"wrote {args.figure}")


if __name__ == "__main__":
    main()
