"""Fields of 16 to 128 components: one automatic estimate each against the exact FDT.

The systems are lattice fields with a closed-form density (``kelr_dist.models.lattice``: a
double well per site, harmonic and cosine ties between neighbours, so each site's score is a
non-polynomial function of its neighbours): a ring of 16 and of 32 sites, an 8 x 8 and an
8 x 16 periodic grid. Each is simulated once (``--samples`` samples in two chains, cached under
``--data``), then estimated with everything automatic on the embedded cluster of two workers,
with ``exact=True``: the exact-FDT response with the model's score on the same samples is the
reference.

Columns: "d"; "wall" the estimate's wall time (simulation left out); "client" and "workers" the
peak resident memory of this process and of each worker while it ran; "estimator" the chosen
one with its degree or order; "err diag" and "err off" the largest ``|k̂ - k_exact|`` over lags
on and off the diagonal; "quasi-Gaussian" the quasi-Gaussian FDT's (the baseline a Gaussian
score gives); "err/tse" the largest ratio of an entry's error to its total standard error, with the
family-wise threshold of the ``d²`` entries of one lag (Šidák at the level of three standard
errors for one entry, ``kelr_dist.pipeline.warnings.stein_threshold``: the largest of ``d²``
ratios of an unbiased estimate exceeds three by chance, and an entry's lags are strongly
correlated);
"GoF z" the goodness-of-fit check's largest statistic with its Šidák threshold; "warnings" the
warnings raised (T truncation, B bias, D disagreement, C convergence, N non-finite, S
sensitivity, G goodness of fit, E edge). An error beyond three total standard errors with no
warning would be a defect (beyond the family-wise threshold for many entries): "unwarned"
says so. A system whose estimate fails gets its error in
the row instead of numbers. This process's memory is capped (``--client-memory``, a data-segment
limit, which the workers inherit above their own ``--worker-memory``), so that a runaway
allocation fails as a ``MemoryError`` in its row instead of exhausting the machine.

    python scripts/bench_fields.py                                  # N = 1e6, d = 16..128
    python scripts/bench_fields.py --samples 2e4 --sizes 16         # a quick look
    python scripts/bench_fields.py --output docs/benchmarks/fields.md
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from doc_table import write_table

from kelr_dist import estimate_response, make_model, simulate
from kelr_dist.engine.cluster import close_embedded_cluster, get_client
from kelr_dist.pipeline.warnings import stein_threshold
from kelr_dist.testing import peak_memory

#: components -> (rows, columns) of the lattice: rings, then periodic grids
SHAPES = {16: (1, 16), 32: (1, 32), 64: (8, 8), 128: (8, 16)}
CHAINS = 2
#: the lattice's sampler as the benchmark runs it: the error against the exact FDT on the same
#: samples needs only the stationary law (any step: MALA is exact in law), and this step simulates
#: 8 times faster than the model's default, which also follows the diffusion in time
COARSE = {"step": 0.02, "subsample": 10}
WORKERS = 2
GIB = 1 << 30
#: one letter per warning category, in the order the table lists them
LETTERS = {
    "TruncationWarning": "T",
    "BiasWarning": "B",
    "DisagreementWarning": "D",
    "ConvergenceWarning": "C",
    "NonFiniteWarning": "N",
    "SensitivityWarning": "S",
    "GoodnessOfFitWarning": "G",
    "EdgeWarning": "E",
}


def count(text: str) -> int:
    """A count written ``1000000``, ``1_000_000`` or ``1e6``."""
    value = float(text.replace("_", ""))
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(value)


def store(data: Path, d: int, samples: int, client: Any) -> Path:
    """The lattice store of ``d`` sites and ``samples`` samples (seed 0), simulated once."""
    rows, columns = SHAPES[d]
    path = data / f"lattice-{rows}x{columns}-{samples:.0e}.zarr"
    model = make_model("lattice", rows=rows, columns=columns, **COARSE)
    start = time.perf_counter()
    simulate(model, path, samples // CHAINS, chains=CHAINS, chunk=1 << 16, client=client)
    print(f"  store {path.name}: {time.perf_counter() - start:.0f} s", flush=True)
    return path


def errors(ds: xr.Dataset, name: str) -> tuple[float, float]:
    """(diagonal, off-diagonal) largest ``|name - response_exact|`` over lags."""
    err = np.asarray(abs(ds[name] - ds["response_exact"]).max(dim="lag").values)
    off = err - np.diag(np.diag(err))
    return float(np.max(np.diag(err))), float(off.max())


def estimate(path: Path, client: Any, max_lag: int) -> tuple[xr.Dataset, str, float, list[float]]:
    """The automatic estimate of ``path`` with the exact FDT and the quasi-Gaussian baseline;
    its warnings' letters, wall time and the peak memory of the client and of every worker."""
    workers = list(client.run(os.getpid).values())
    with (
        warnings.catch_warnings(record=True) as caught,
        peak_memory([os.getpid(), *workers]) as peaks,
    ):
        warnings.simplefilter("always")
        start = time.perf_counter()
        ds = estimate_response(path, client=client, exact=True, gaussian=True, max_lag=max_lag)
        wall = time.perf_counter() - start
    names = {w.category.__name__ for w in caught}
    letters = "".join(v for k, v in LETTERS.items() if k in names) or "-"
    return ds, letters, wall, [peaks[pid] / GIB for pid in (os.getpid(), *workers)]


def row(d: int, path: Path, client: Any, max_lag: int) -> list[str]:
    """One line of the table (or the failure, named, in place of its numbers)."""
    try:
        ds, letters, wall, memory = estimate(path, client, max_lag)
    except Exception as err:  # noqa: BLE001 - a failed system is a row of the table
        traceback.print_exc()
        message = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
        return [str(d), f"failed: {message}", *["—"] * 9]
    diag, off = errors(ds, "response")
    gauss = max(errors(ds, "response_gaussian"))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.abs(ds["response"] - ds["response_exact"]) / ds["response_total_stderr"]
    worst = float(ratio.max())
    threshold = stein_threshold(d * d)
    used = ds.attrs["estimator"]
    level = ds.attrs.get("degree" if used == "score-matching" else "order", "")
    fit = (
        f"{ds.attrs['goodness_of_fit_z']:.1f} / {ds.attrs['goodness_of_fit_threshold']:.2f}"
        if "goodness_of_fit_z" in ds.attrs
        else "—"
    )
    return [
        str(d),
        f"{wall:.0f} s",
        f"{memory[0]:.2f} GiB",
        " ".join(f"{m:.2f}" for m in memory[1:]) + " GiB",
        f"{used} {level}",
        f"{diag:.3f}",
        f"{off:.3f}",
        f"{gauss:.3f}",
        f"{worst:.1f} / {threshold:.1f}",
        fit,
        letters + (" (unwarned)" if worst > threshold and letters == "-" else ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=count, default=1_000_000, help="samples (two chains)")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=list(SHAPES), choices=list(SHAPES), metavar="D"
    )
    parser.add_argument("--max-lag", type=count, default=100, help="largest lag in rows")
    parser.add_argument("--data", type=Path, default=Path("bench-data"), help="store cache")
    parser.add_argument(
        "--client-memory", type=float, default=8.0, help="GiB cap of this process (0: none)"
    )
    parser.add_argument(
        "--worker-memory",
        type=float,
        help="GiB per worker (default: the embedded cluster's, the machine's memory shared)",
    )
    parser.add_argument("--output", type=Path, help="write the table here (Markdown)")
    args = parser.parse_args()
    if args.client_memory > 0:
        cap = int(args.client_memory * GIB)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    args.data.mkdir(parents=True, exist_ok=True)
    header = ["d", "wall", "client", "workers", "estimator", "err diag", "err off",
              "quasi-Gaussian", "err/tse / threshold", "GoF z / threshold", "warnings"]  # fmt: skip
    rows = []
    try:
        limit = None if args.worker_memory is None else int(args.worker_memory * GIB)
        client = get_client(n_workers=WORKERS, memory_limit=limit, quiet=True)
        limit = next(iter(client.scheduler_info()["workers"].values()))["memory_limit"]
        for d in args.sizes:
            print(f"d = {d}: {SHAPES[d][0]} x {SHAPES[d][1]} sites", flush=True)
            rows.append(row(d, store(args.data, d, args.samples, client), client, args.max_lag))
            print("  | " + " | ".join(rows[-1]) + " |", flush=True)
    finally:
        close_embedded_cluster()
    note = (
        f"N = {args.samples:.0e} samples in {CHAINS} chains of a lattice field "
        "(`kelr_dist.models.lattice`, default parameters but MALA step 0.02, subsample 10; "
        "rings for d = 16, 32, periodic "
        f"8 x 8 and 8 x 16 grids for d = 64, 128), lags 0..{args.max_lag} rows; "
        f"embedded cluster of {WORKERS} workers of {limit / GIB:.1f} GiB each."
    )
    if args.output is not None:
        write_table(args.output, header, rows, note)
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
