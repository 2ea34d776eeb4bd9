"""Before/after timing of the core kernel stages: a git revision against the working tree.

The stages of ``scripts/bench_core.py`` that ``kernels/bases/families.py``,
``kernels/scores/kernel_embedding.py`` and ``kernels/scores/selection.py`` carry — basis tables
(values and derivatives of each coordinate's functions at the mapped samples, as ``p_M``/``∇p_M``
builds them), coefficient sums, ``p_M`` and ``∇p_M`` at every sample, the δ/R/η sweep — on the same
triple-well samples, in fresh processes that alternate between the revision (a temporary ``git
worktree``) and the working tree, with
``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``/``MKL_NUM_THREADS`` unset, set to 2 and set to 1 (BLAS
capped at one thread, as the engine's workers run: the setting to judge a kernel change by). Each
process runs the stage on 2 threads (rows split evenly, as ``bench_core.py``) and reports its
median over ``--repeats``; the table prints the median over ``--rounds`` processes and the load
average. The results of both trees are compared (max relative difference of coefficients, ``p``,
``∇p`` and equality of the sweep's counts).

Usage::

    python scripts/bench_core_ab.py --rev HEAD~1 --n 1e6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("tables", "coefficients", "p and grad p", "sweep")
VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: thread variables unset, at the core count, and at 1: the engine's workers cap BLAS at one
#: thread each, so "1" is the setting estimates run in (with unset or 2 each of the 2 row
#: threads' GEMMs may start BLAS threads of its own: an oversubscribed baseline)
SETTINGS = ("unset", "2", "1")


def worker(n: int, repeats: int, save: str) -> None:
    """In a fresh process: time the stages with the kelr_dist on ``sys.path``; JSON to stdout."""
    from concurrent.futures import ThreadPoolExecutor
    from functools import reduce

    import numpy as np

    from kelr_dist.kernels.bases import families as bases
    from kelr_dist.kernels.bases.coordinates import fit_basis
    from kelr_dist.kernels.bases.families import TensorBasis
    from kelr_dist.kernels.reduction import add_partials
    from kelr_dist.kernels.scores.kernel_embedding import (
        KernelDensity,
        coefficient_sums,
        row_blocks,
    )
    from kelr_dist.kernels.scores.selection import combine_sweeps, sweep_sums
    from kelr_dist.models.registry import make_model

    model = make_model("triple-well")
    rng = np.random.default_rng(0)
    state = model.advance(model.initial_state(rng), model.default_burn_in, rng)[1]
    x = model.advance(state, n, rng)[0]
    basis = TensorBasis(tuple(fit_basis(x)), 60)
    wide = TensorBasis(basis.coordinates, 70)
    edges = np.linspace(0, n, 3).astype(int)
    parts = list(zip(edges[:-1], edges[1:], strict=True))

    def parallel(job):
        with ThreadPoolExecutor(2) as pool:
            return list(pool.map(lambda ab: job(x[ab[0] : ab[1]]), parts))

    def tables(xs):
        space = (
            [bases.Workspace() for _ in basis.coordinates] if hasattr(bases, "Workspace") else None
        )
        for rows in row_blocks(len(xs), basis.row_block()):
            for k, c in enumerate(basis.coordinates):
                y = c.mapped(xs[rows, k])
                if space is None:
                    c.family.evaluate(y, basis.max_orders[k])
                else:
                    c.family.evaluate(y, basis.max_orders[k], space[k])

    def fit(xs):
        return coefficient_sums(basis, xs)

    density = KernelDensity.from_sums(basis, reduce(add_partials, parallel(fit)))
    density_70 = KernelDensity.from_sums(wide, coefficient_sums(wide, x))
    jobs = {
        "tables": lambda: parallel(tables),
        "coefficients": lambda: parallel(fit),
        "p and grad p": lambda: parallel(density.evaluate),
        "sweep": lambda: parallel(lambda xs: sweep_sums(density_70, xs)),
    }
    times = {}
    for name, job in jobs.items():
        job()  # warm (numba cache, first allocations)
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            job()
            runs.append(time.perf_counter() - start)
        times[name] = statistics.median(runs)
    p, grad = density.evaluate(x)
    sweep = reduce(combine_sweeps, parallel(lambda xs: sweep_sums(density_70, xs)))
    np.savez(save, coefficients=density.coefficients, p=p, grad=grad, **sweep)
    print(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rev", default="HEAD", help="the 'before' revision (default HEAD)")
    parser.add_argument("--n", type=float, default=1e6)
    parser.add_argument("--rounds", type=int, default=3, help="processes per tree and setting")
    parser.add_argument("--repeats", type=int, default=3, help="timings per process")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(int(args.n), args.repeats, args.worker)
        return
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.rev],
            check=True,
            capture_output=True,
        )
        try:
            trees = {f"before ({args.rev})": old, "after (working tree)": ROOT}
            results: dict[tuple[str, str], list[dict]] = {}
            for setting in SETTINGS:
                env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
                if setting != "unset":
                    env.update(dict.fromkeys(VARIABLES, setting))
                for round_ in range(args.rounds):
                    for label, tree in trees.items():
                        env["PYTHONPATH"] = str(tree)
                        save = str(Path(tmp) / f"{label.split()[0]}.npz")
                        out = subprocess.run(
                            [sys.executable, __file__, "--worker", save, "--n", str(args.n),
                             "--repeats", str(args.repeats)],
                            env=env, check=True, capture_output=True, text=True,
                        )  # fmt: skip
                        times = json.loads(out.stdout.strip().splitlines()[-1])
                        results.setdefault((setting, label), []).append(times)
                        print(
                            f"  threads {setting}, round {round_ + 1}, {label}: "
                            + ", ".join(f"{k} {v:.3f} s" for k, v in times.items())
                            + f"   [load {os.getloadavg()[0]:.1f}]",
                            flush=True,
                        )
            import numpy as np

            before, after = (np.load(Path(tmp) / f"{w}.npz") for w in ("before", "after"))
            print(f"\nN = {args.n:.0e}, 2 threads, median over {args.rounds} processes (s):")
            print(f"  {'stage':<14}" + "".join(f"{s:>30}" for s in SETTINGS))
            for stage in STAGES:
                cells = []
                for setting in SETTINGS:
                    b, a = (
                        statistics.median(r[stage] for r in results[(setting, label)])
                        for label in trees
                    )
                    cells.append(f"{b:.3f} -> {a:.3f} ({b / a:.2f}x)")
                print(f"  {stage:<14}" + "".join(f"{c:>30}" for c in cells))
            for key in ("coefficients", "p", "grad"):
                scale = np.abs(before[key]).max()
                print(f"  max |after - before| / max |before|, {key}: "
                      f"{np.abs(after[key] - before[key]).max() / scale:.1e}")  # fmt: skip
            same = all(np.array_equal(before[k], after[k]) for k in before.files if k not in (
                "coefficients", "p", "grad"))  # fmt: skip
            print(f"  sweep statistics identical: {same}   [load {os.getloadavg()}]")
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
                check=False,
                capture_output=True,
            )


if __name__ == "__main__":
    main()
