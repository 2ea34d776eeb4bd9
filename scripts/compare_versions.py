"""Results of ``estimate_response`` at two git revisions, compared on the same small stores.

Each revision is checked out into a temporary ``git worktree``; every step runs in a fresh
process with ``PYTHONPATH`` set to that worktree (one BLAS/numba thread). The stores are
simulated once by the newer revision; each revision then estimates each store with
``client="synchronous"``, ``progress=False`` and, where the option exists, the later affine Stein
correction switched off (``stein_correction=False``), and writes netCDF. Per store and per data
variable both results hold, the table gives the largest difference divided by the variable's
largest magnitude, or — for a variable that is zero up to rounding by construction (largest
magnitude under ``1e-9`` of its ``_stderr``) — divided by its largest stderr, and PASS/FAIL
against ``1e-12``. Variables only one revision writes are listed, not compared.

Usage::

    python scripts/compare_versions.py [--old 79efa18] [--new HEAD] [--models ou,triple-well]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

ROOT = Path(__file__).resolve().parent.parent
#: the last commit before the flat package moved into kernels/, engine/, data/, pipeline/, edges/
PRE_MOVE = "79efa18"
MODELS = ("ou", "triple-well", "coupled-3d")
SAMPLES = 100_000
TOLERANCE = 1e-12
#: attributes that differ between any two runs (times, paths, versions, engine counters)
RUN_ATTRS = {"created", "runtime_seconds", "store", "kelr_dist_version", "passes", "store_reads"}
#: below this fraction of its stderr a variable is rounding noise, compared against the stderr
ROUNDING = 1e-9
THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def worker(job: str, store: str, target: str) -> None:
    """In a fresh process, with the revision's ``kelr_dist`` on ``sys.path``: simulate the
    model ``target`` into ``store`` (``job="simulate"``), or estimate ``store`` into ``target``."""
    import inspect

    import kelr_dist

    if not kelr_dist.__file__.startswith(os.environ["PYTHONPATH"]):
        raise RuntimeError(f"kelr_dist imported from {kelr_dist.__file__}, not the worktree")
    if job == "simulate":
        kelr_dist.simulate(target, store, SAMPLES, progress=False)
        return
    options: dict[str, object] = {"client": "synchronous", "progress": False}
    if "stein_correction" in inspect.signature(kelr_dist.estimate_response).parameters:
        options["stein_correction"] = False
    kelr_dist.write_result(kelr_dist.estimate_response(store, **options), target)


def run(tree: Path, *job: str) -> None:
    """``worker(*job)`` in a fresh process importing ``kelr_dist`` from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree), **dict.fromkeys(THREADS, "1")}
    subprocess.run([sys.executable, __file__, "--worker", *job], env=env, check=True)


def _same_attr(a: Any, b: Any) -> bool:
    """Equal, or (floats computed from the results, e.g. ``estimator_disagreement``) within
    the tolerance of the variables."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= TOLERANCE * max(abs(a), abs(b))
    return bool(np.array_equal(a, b))


def compare(old: xr.Dataset, new: xr.Dataset) -> list[tuple[str, float, str]]:
    """``(variable, difference, scale)`` for each variable (data or coordinate) both results
    hold, then one row for the attributes both hold (but a run's own), naming those that differ."""
    rows = []
    for name in sorted(str(v) for v in set(old.variables) & set(new.variables)):
        a, b = old[name].values, new[name].values
        if a.shape != b.shape or a.dtype.kind not in "fiu":
            rows.append((name, 0.0 if np.array_equal(a, b) else np.inf, "equal"))
            continue
        diff = np.where(np.isnan(a) & np.isnan(b), 0.0, np.abs(a - b))
        scale, kind = np.nanmax(np.abs(a), initial=0.0), "relative"
        stderr = f"{name}_stderr"
        if stderr in old and np.nanmax(np.abs(old[stderr].values)) * ROUNDING > scale:
            scale, kind = np.nanmax(np.abs(old[stderr].values)), "vs stderr"
        rows.append((name, float(np.max(diff, initial=0.0) / (scale or 1.0)), kind))
    keys = (set(old.attrs) & set(new.attrs)) - RUN_ATTRS
    differ = sorted(k for k in keys if not _same_attr(old.attrs[k], new.attrs[k]))
    label = f"attrs ({len(keys)} shared{': ' if differ else ''}{', '.join(differ)})"
    return [*rows, (label, np.inf if differ else 0.0, "equal")]


def main() -> None:
    """Check out both revisions, simulate, estimate, print the table; exit 1 on any FAIL."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", default=PRE_MOVE)
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(*args.worker)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        trees = [(rev, Path(tmp) / f"tree-{i}") for i, rev in enumerate((args.old, args.new))]
        git = ["git", "-C", str(ROOT), "worktree"]
        try:
            for rev, tree in trees:
                subprocess.run([*git, "add", "--quiet", "--detach", str(tree), rev], check=True)
                head = ["git", "-C", str(tree), "log", "-1", "--format=%h %s"]
                line = subprocess.run(head, check=True, capture_output=True, text=True).stdout
                print(f"{rev}: {line.strip()[:100]}")
            print(
                "stein_correction=False where the option exists. relative: max |new - old| / "
                "max |old|; vs stderr: a variable zero up to rounding by construction (max |old| "
                f"< {ROUNDING:g} x its stderr), max |new - old| / max stderr"
            )
            for model in args.models.split(","):
                store = f"{tmp}/{model}.zarr"
                run(trees[1][1], "simulate", store, model)
                results = []
                for i, (_, tree) in enumerate(trees):
                    run(tree, "estimate", store, f"{tmp}/{model}-{i}.nc")
                    results.append(xr.load_dataset(f"{tmp}/{model}-{i}.nc"))
                old, new = results
                print(f"\n{model} ({SAMPLES:.0e} samples)")
                for name, difference, kind in compare(old, new):
                    verdict = "PASS" if difference <= TOLERANCE else "FAIL"
                    failed |= verdict == "FAIL"
                    print(f"  {name:48s} {difference:9.2e} {kind:9s} {verdict}")
                for label, a, b in (("old", old, new), ("new", new, old)):
                    only = sorted({*a.variables, *a.attrs} - {*b.variables, *b.attrs})
                    print(f"  only in {label}: {', '.join(only) or '-'}")
        finally:
            for _, tree in trees:
                subprocess.run([*git, "remove", "--force", str(tree)], check=False)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
