"""Accuracy of the automatic estimate on systems nobody tuned it for, against the exact FDT.

For every system (all with a closed-form ``p_eq``, so the exact score is known) a trajectory of
``--samples`` samples is simulated once (cached under ``--data``), then one automatic estimate
(``estimator="auto"``, embedded cluster) gives the chosen response, the other estimator's, the
exact-FDT response on the same samples and the baselines (Gaussian KDE for d <= 2, the
quasi-Gaussian FDT). "Stein/se" is the largest lag-0 Stein residual of the reported (affinely
corrected) estimate in standard errors, "raw/se" the uncorrected estimate's: the size of the
correction; "KE-SM/se" the two families' largest difference in standard errors ("!": a
DisagreementWarning was raised). Coverage: "err/tse" is the largest ``|k̂ - k_exact|`` over the
total standard error (sampling and the fitted score's jackknife variance), "lag" the lag (rows)
where it is, ">2tse" the share of
entries beyond 2 total standard errors, "tse/se" the median ratio of total to sampling standard
error, "ref/se" the exact reference's own largest lag-0 Stein residual in its standard errors
(its sampling noise, which an affinely corrected estimate, pinned to the Stein target at lag 0,
does not share: a large err/tse at lag 0 with a large ref/se is the reference's), "warn" the
warnings raised (T truncation, B bias, D disagreement, C convergence, N
non-finite). Errors are ``max over lags and entries of |k̂ - k_exact|``,
diagonal and off-diagonal entries apart; "M/q" the kernel embedding's order and score matching's
degree ("a": the largest total degree of score matching's grown index set, the default;
``--index-set total`` fixes it at a total degree).
Printed: one table, and (``--figure``) the response curves of the two systems where the automatic
estimate is furthest from the exact response.

    python scripts/accuracy_suite.py                      # N = 1e7, every system (~15 min)
    python scripts/accuracy_suite.py --samples 1e6 --systems ou curved-wells
    python scripts/accuracy_suite.py --samples 1e6 --systems trig-4d gamma-3d --index-set total
    python scripts/accuracy_suite.py --samples 1e6 --output docs/benchmarks/accuracy.md
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from doc_table import write_table

import kelr_dist
from kelr_dist.edges.report import stein_rows
from kelr_dist.models.registry import make_model

#: name -> (model name, parameters); d = 2 unless the model says otherwise
SYSTEMS = {
    "ou": "ou",
    "triple-well": "triple-well",
    "langevin-morse": "langevin-morse",
    "curved-wells": "curved-wells",
    "coupled-3d": "coupled-3d",
    "coupled-4d": "coupled-4d",
    "coupled-6d": "coupled-6d",
    "heavy-tail": "heavy-tail",
    "wall": "wall",
    "trig-4d": "trig-4d",
    "gamma-3d": "gamma-3d",
    "torus": "torus",
    "torus-cos-sin": "torus",
    "angles-line": "angles-line",
    "angles-line-cos-sin": "angles-line",
}
#: the systems estimated with another observable than the identity (the wrapped angles)
OBSERVABLES = {"torus-cos-sin": "angles", "angles-line-cos-sin": "angles"}
BASELINES = {"kde": "response_kde", "gaussian": "response_gaussian"}


def errors(ds: xr.Dataset, name: str) -> tuple[float, float]:
    """(diagonal, off-diagonal) max |k̂ - k_exact| of response variable ``name``."""
    if name not in ds:
        return (np.nan, np.nan)
    err = abs(ds[name] - ds["response_exact"]).max("lag").values
    if err.shape[0] != err.shape[1]:  # an observable other than A = x (cos/sin): all entries
        return float(err.max()), np.nan
    diag = float(np.max(np.diag(err)))
    off = err - np.diag(np.diag(err))
    return diag, float(off.max()) if err.shape[0] > 1 else np.nan


def trajectory(system: str, samples: int, data: Path) -> Path:
    path = data / f"{SYSTEMS[system]}-{samples:.0e}.zarr"
    if not path.exists():
        kelr_dist.simulate(SYSTEMS[system], path, n_samples=samples, seed=2026)
    return path


def run(system: str, samples: int, data: Path, index_set: str = "auto") -> tuple[dict, xr.Dataset]:
    path = trajectory(system, samples, data)
    d = len(make_model(SYSTEMS[system]).components)
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = kelr_dist.estimate_response(
            path,
            exact=True,
            kde=d <= 2,
            gaussian=True,
            observable=OBSERVABLES.get(system, "identity"),
            index_set=index_set,
        )
    seconds = time.perf_counter() - started
    other = (
        "response_score_matching"
        if ds.attrs["estimator"] == "kernel-embedding"
        else "response_kernel_embedding"
    )
    stein = stein_rows(ds)["response"]  # (max |residual|, in stderr, uncorrected in stderr)
    single = {
        ds.attrs["estimator"]: errors(ds, "response"),
        other[9:].replace("_", "-"): errors(ds, other),
    }
    row = {
        "system": system,
        "d": d,
        "auto": errors(ds, "response"),
        "ke": single.get("kernel-embedding", (np.nan, np.nan)),
        "sm": single.get("score-matching", (np.nan, np.nan)),
        **{k: errors(ds, v) for k, v in BASELINES.items()},
        "chosen": ds.attrs["estimator"],
        # (no order when the pilot left the kernel embedding out)
        "order": f"{','.join(map(str, np.atleast_1d(ds.attrs.get('order', '-'))))}/"
        f"{ds.attrs['degree']}"
        + ("a" if ds.attrs.get("score_matching_index_set") == "adaptive" else ""),
        "stein": stein[1],
        "raw_stein": stein[2],
        "warned": any("Stein" in str(w.message) for w in caught),
        "disagreement": ds.attrs.get("estimator_disagreement", np.nan),
        "disagreement_warned": any(
            isinstance(w.message, kelr_dist.DisagreementWarning) for w in caught
        ),
        **coverage(ds),
        "sensitivity": ds.attrs.get("model_sensitivity", np.nan),
        "warnings": "".join(
            sorted(
                {
                    WARNING_LETTERS[w.category.__name__]
                    for w in caught
                    if w.category.__name__ in WARNING_LETTERS
                }
            )
        ),
        "seconds": seconds,
    }
    return row, ds


#: one letter per warning class of the estimate in the table's "warn" column (others, such as
#: dask's, are not counted)
WARNING_LETTERS = {
    "TruncationWarning": "T",
    "BiasWarning": "B",
    "DisagreementWarning": "D",
    "SensitivityWarning": "S",
    "ConvergenceWarning": "C",
    "NonFiniteWarning": "N",
}


def coverage(ds: xr.Dataset) -> dict[str, float]:
    """The automatic estimate's error against its total error bars: the largest
    ``|k̂ - k_exact| / response_total_stderr`` and its lag, the share of entries beyond 2 of
    them, the median over entries of the ratio of total to sampling standard error, and the
    exact reference's own largest lag-0 Stein residual in its standard errors (sampling noise of
    the reference: an affinely corrected estimate meets the Stein target at lag 0 exactly, so
    there its difference from the reference is that residual, not an error of the estimate)."""
    error = abs(ds["response"] - ds["response_exact"]).values
    total, sampling = ds["response_total_stderr"].values, ds["response_stderr"].values
    z = error / total
    reference = np.abs(ds["stein_residual_exact"].values) / ds["stein_residual_exact_stderr"].values
    return {
        "z_total": float(np.max(z)),
        "z_lag": int(np.unravel_index(int(np.argmax(z)), z.shape)[0]),
        "beyond_2": float(np.mean(error > 2 * total)),
        "total_ratio": float(np.median(total / sampling)),
        "reference_stein": float(np.max(reference)),
    }


def pair(v: tuple[float, float]) -> str:
    return " / ".join("  -  " if np.isnan(x) else f"{x:.3f}" for x in v)


def print_table(rows: list[dict], samples: int) -> None:
    print(f"\nN = {samples:.0e} per system; error = max_t,entries |k - k_exact|, diag / off-diag")
    head = (
        f"{'system':15} {'d':>1}  {'auto':>13}  {'kernel-emb.':>13}  {'score-match.':>13}  "
        f"{'KDE':>13}  {'quasi-Gauss':>13}  {'chosen':>17} {'M/q':>5} {'Stein/se':>8} "
        f"{'KE-SM/se':>9} {'err/tse':>7} {'lag':>4} {'>2tse':>5} {'tse/se':>6} {'ref/se':>6} "
        f"{'shift':>5} {'warn':>4} {'time s':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['system']:15} {r['d']:>1}  {pair(r['auto']):>13}  {pair(r['ke']):>13}  "
            f"{pair(r['sm']):>13}  {pair(r['kde']):>13}  {pair(r['gaussian']):>13}  "
            f"{r['chosen']:>17} {r['order']:>5} {r['stein']:>8.1f} {r['raw_stein']:>6.1f} "
            f"{r['disagreement']:>8.1f}{'!' if r['disagreement_warned'] else ' '} "
            f"{r['z_total']:>7.1f} {r['z_lag']:>4} {r['beyond_2']:>5.0%} "
            f"{r['total_ratio']:>6.2f} {r['reference_stein']:>6.1f} {r['sensitivity']:>5.2f} "
            f"{r['warnings'] or '-':>4} {r['seconds']:>6.1f}"
        )


def write_markdown(rows: list[dict], samples: int, path: Path) -> None:
    """The table for the documentation (``--output``)."""
    header = [
        "system", "d", "automatic", "kernel embedding", "score matching", "KDE",
        "quasi-Gaussian", "chosen", "M / q", "Stein/se (uncorrected)", "KE−SM / se",
        "err/tse (lag)", ">2tse", "tse/se", "exact Stein/se", "shift/tse", "warnings", "time s",
    ]  # fmt: skip

    def cell(v: tuple[float, float]) -> str:  # "—": not run, "-": no off-diagonal entries
        return "—" if np.isnan(v).all() else pair(v).replace("  -  ", "-")

    body = [
        [
            r["system"], str(r["d"]), cell(r["auto"]), cell(r["ke"]), cell(r["sm"]),
            cell(r["kde"]), cell(r["gaussian"]), r["chosen"],
            r["order"].replace("/", " / "), f"{r['stein']:.1f} ({r['raw_stein']:.1f})",
            "—" if np.isnan(r["disagreement"]) else
            f"{r['disagreement']:.1f}{' (warned)' if r['disagreement_warned'] else ''}",
            f"{r['z_total']:.1f} ({r['z_lag']})", f"{r['beyond_2']:.0%}",
            f"{r['total_ratio']:.2f}", f"{r['reference_stein']:.1f}",
            "—" if np.isnan(r["sensitivity"]) else f"{r['sensitivity']:.2f}", r["warnings"] or "—",
            f"{r['seconds']:.0f}",
        ]
        for r in rows
    ]  # fmt: skip
    note = (
        f"N = {samples:.0e} samples per system, embedded cluster. Error: max over lags and "
        "entries of |k̂ − k_exact| against the exact FDT on the same samples, diagonal / "
        "off-diagonal entries (—: not run, the kernel embedding when the pilot left it out). "
        "err/tse: the largest |k̂ − k_exact| over the total standard error "
        "(sampling and the fitted score's jackknife variance), and the lag (rows) where it is; "
        ">2tse: the share of entries beyond 2 total standard errors; tse/se: the median ratio "
        "of total to sampling standard error; exact Stein/se: the exact reference's own largest "
        "lag-0 Stein residual in its standard errors (its sampling noise: the corrected "
        "estimate meets the Stein target at lag 0, so its lag-0 difference from the reference "
        "is this residual); shift/tse: the largest move of the response, in total standard "
        "errors, from the chosen model to its neighbours (two steps richer; with random "
        "Fourier features; attribute model_sensitivity); warnings: T truncation, B bias, "
        "D disagreement, S sensitivity, C convergence, N non-finite."
    )
    write_table(path, header, body, note)


def figure(results: list[tuple[dict, xr.Dataset]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hardest = sorted(results, key=lambda r: -max(r[0]["auto"]))[:2]
    fig, axes = plt.subplots(len(hardest), 2, figsize=(10, 3.6 * len(hardest)), squeeze=False)
    for (row, ds), ax_row in zip(hardest, axes, strict=True):
        # show the lags where the exact response lives: 3x the time its k_11 falls below 2%
        k11 = np.abs(ds["response_exact"].isel(i=0, j=0).values)
        alive = np.flatnonzero(k11 > 0.02 * k11.max())
        shown = slice(0, min(len(k11), 3 * (int(alive[-1]) + 1)))
        for ax, (i, j) in zip(ax_row, [(0, 0), (0, 1)], strict=True):
            t = ds["time"].values[shown]
            styles: list[tuple[str, dict[str, Any]]] = [
                ("response_exact", dict(color="k", lw=2, label="exact FDT")),
                ("response", dict(color="C0", label=f"automatic ({row['chosen']})")),
                ("response_kernel_embedding", dict(color="C1", ls="--", label="kernel embedding")),
                ("response_score_matching", dict(color="C2", ls="--", label="score matching")),
                ("response_gaussian", dict(color="C3", ls=":", label="quasi-Gaussian")),
            ]
            for name, style in styles:
                if name in ds:
                    k = ds[name].isel(i=i, j=j).values[shown]
                    ax.plot(t, k, **style)
                    if name == "response":
                        se = ds["response_stderr"].isel(i=i, j=j).values[shown]
                        ax.fill_between(t, k - 2 * se, k + 2 * se, color="C0", alpha=0.2, lw=0)
            ax.set_title(f"{row['system']}: k_{i + 1}{j + 1}(t)")
            ax.set_xlabel("time lag t (model time units)")
            ax.set_ylabel(f"k_{i + 1}{j + 1} (dimensionless)")
        ax_row[0].legend(fontsize=8)
    fig.suptitle("band: ±2 standard errors of the automatic estimate (sampling error only)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=float, default=1e7)
    parser.add_argument("--systems", nargs="*", default=list(SYSTEMS))
    parser.add_argument("--data", type=Path, default=Path("runs/accuracy"))
    parser.add_argument(
        "--index-set",
        default="auto",
        choices=["auto", "total"],
        help="the estimate's index_set (auto: score matching's set grown by held-out loss; "
        "total: a fixed total degree)",
    )
    parser.add_argument("--figure", type=Path, default=None, help="PNG of the hardest two")
    parser.add_argument(
        "--output", type=Path, default=None, help="also write the table as Markdown to this file"
    )
    args = parser.parse_args()
    samples = int(args.samples)
    args.data.mkdir(parents=True, exist_ok=True)
    results = []
    for system in args.systems:
        row, ds = run(system, samples, args.data, args.index_set)
        results.append((row, ds))
        print_table([row], samples)
    print_table([r for r, _ in results], samples)
    if args.output is not None:
        write_markdown([r for r, _ in results], samples, args.output)
        print(f"table: {args.output}")
    if args.figure is not None:
        figure(results, args.figure)
        print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
