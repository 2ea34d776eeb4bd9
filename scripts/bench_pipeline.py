"""Benchmark the whole estimate: speed and flat client memory, automatic estimates, accuracy.

1. Out of core: an OU trajectory store of >= 8 GiB (float64) estimated on the embedded
   cluster of 2 workers x 1 GiB; wall time and every worker's peak resident memory (sampled by
   a psutil thread on the worker pids).
2. Accuracy, nothing tuned by hand: error = max over lags t <= 10 of |estimate -
   response_exact| on the same data, diagonal and off-diagonal entries apart, with the largest
   reported standard error; OU (N = 1e7) against ``expm(-Γt)`` for t <= 3 in units of the
   reported standard error; triple-well (N = 1e7, M = 60 and automatic, KDE baseline) and
   Langevin-Morse (N = 1e7, Laguerre(θ=1) x Hermite M = (90, 0) box and automatic, KDE).
3. Speed: the kernel-embedding estimate (triple-well, M = 60, S = 2000) for N = 1e6, 1e7, 1e8
   on the embedded 2-worker cluster, step by step through the public steps of
   ``kelr_dist.pipeline.steps`` (``Passes``, ``survey_data``, ``choose_coordinates``,
   ``fit_estimators``, ``choose_kernel_embedding``, ``respond``), each step timed: wall time,
   samples/s, the client process's peak RSS (psutil thread), every pass's graph as sent
   (``cloudpickle`` bytes of the ``ReductionGraph``, seen through
   ``kelr_dist.engine.passes.observe_graphs``), its tasks, the passes and store reads; the ratio
   1e8 / 1e7 of client RSS and largest graph (target: flat, <= 1.2x).
4. Automatic estimates (``estimator="auto"``): a 2e6-sample 2-D OU store (target <= 5 s) and a
   1e7-sample 3-D store (``coupled-3d``, target <= 30 s), with the time of each step (from one
   pass's graph to the next).
5. Large: an OU store of 1e9 samples (fewer when the disk is short; ``--large-n``) estimated at
   order 8, S = 200 on the embedded cluster: wall time, client and worker peak RSS, graph bytes;
   the store is deleted afterwards.
6. Tasks per pass: the tasks the scheduler runs for one pass over a store in 4096-row chunks and
   one in 1e6-row chunks (read out of core), without halo and with S = 200, against the pass's
   blocks (``--only tasks``).
7. The pilot (``--only pilot``): on the 3-D, 4-D and 6-D coupled systems (N = 1e7; 1e6 with
   ``--quick``) the automatic estimate, the family it chose alone, and the automatic estimate
   with both families fitted to all samples, alternated in one run: medians and ratios (target:
   automatic <= 1.3x the chosen family alone), and the choice with every family fitted.

Every figure is printed with the machine's load average (the machine is shared). Generated
stores are kept in ``--cache`` (default ``runs/bench``) and reused; the out-of-core store is
deleted after its run.

Usage::

    python scripts/bench_pipeline.py                      # full sizes (~1 h on 2 cores)
    python scripts/bench_pipeline.py --quick              # small smoke run
    python scripts/bench_pipeline.py --only speed auto
    python scripts/bench_pipeline.py --only large --large-n 2e8
    python scripts/bench_pipeline.py --only speed --output docs/benchmarks/speed.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import psutil
import xarray as xr
from distributed import get_task_stream
from doc_table import write_table

from kelr_dist.data.store import open_trajectory
from kelr_dist.engine.cluster import close_embedded_cluster, get_client
from kelr_dist.engine.passes import (
    ReductionGraph,
    build_graph,
    keep_in_memory,
    observe_graphs,
    run_reductions,
    scatter_trajectory,
)
from kelr_dist.kernels.bases.families import TensorBasis
from kelr_dist.kernels.reduction import BlockInfo, Reduction
from kelr_dist.kernels.response.lagged import lagged_sums
from kelr_dist.kernels.response.operator import (
    DensityScore,
    constant_forcing,
    identity_observable,
    response_reduction,
)
from kelr_dist.models.registry import make_model
from kelr_dist.models.simulate import simulate
from kelr_dist.pipeline.estimate import estimate_response
from kelr_dist.pipeline.steps import (
    Passes,
    choose_coordinates,
    choose_kernel_embedding,
    fit_estimators,
    respond,
    survey_data,
)
from kelr_dist.testing import peak_memory

GIB = 1 << 30
PAPER_SECONDS = 1.54e3  # paper, Table 1: triple-well, M = 60, N = 1e7
CHAINS = 2


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f}/{five:.1f}/{fifteen:.1f}"


def say(text: str) -> None:
    print(f"{text}   [{load()}]", flush=True)


def cached_store(cache: Path, model: str, n: int, *, client: Any, path: Path | None = None) -> Path:
    """A ``model`` store of ``n`` samples in ``CHAINS`` chains (seed 0) and time chunks of
    2**20 samples, simulated on ``client`` once (the path says model and N)."""
    path = path or cache / f"{model}-{n:.0e}.zarr"
    if not path.exists():
        start = time.perf_counter()
        simulate(model, path, n // CHAINS, chains=CHAINS, chunk=1 << 20, client=client)
        say(f"  simulated {path.name}: {time.perf_counter() - start:.1f} s")
    return path


# --- 1. out of core -------------------------------------------------------------------------------


def out_of_core(cache: Path, quick: bool) -> None:
    # workers pause at 80 % of their limit; one that imported kelr_dist holds ~250 MiB already
    memory, nbytes = (600 << 20, GIB // 2) if quick else (GIB, 8 * GIB + (64 << 20))
    print(f"\n== out of core: OU store {nbytes / GIB:.2f} GiB on 2 workers x {memory >> 20} MiB")
    free = shutil.disk_usage(cache).free
    if free < 1.5 * nbytes:
        say(f"  skipped: {free / GIB:.1f} GiB free disk, need {1.5 * nbytes / GIB:.1f} GiB")
        return
    n = nbytes // (2 * 8)  # two float64 components
    path = cache / "out-of-core-ou.zarr"
    try:
        start = time.perf_counter()
        cached_store(cache, "ou", n, client=get_client(n_workers=2, quiet=True), path=path)
        say(f"  simulated {n:.3g} samples: {time.perf_counter() - start:.0f} s")
        client = get_client(n_workers=2, memory_limit=memory, quiet=True)  # replaces the cluster
        pids = list(client.run(os.getpid).values())
        start = time.perf_counter()
        with peak_memory(pids) as peaks:
            ds = estimate_response(path, client=client, max_order=8, max_lag=200, exact=True)
        wall = time.perf_counter() - start
    finally:
        shutil.rmtree(path, ignore_errors=True)
        close_embedded_cluster()
    peaks_mib = [round(p / 2**20) for p in peaks.values()]
    say(
        f"  estimate of {ds.attrs['n_samples']:.3g} samples: {wall:.0f} s "
        f"({ds.attrs['n_samples'] / wall:.3g} samples/s); worker peak RSS {peaks_mib} MiB "
        f"(limit {memory >> 20} MiB each; store / total limit = {nbytes / (2 * memory):.1f})"
    )


# --- 2. accuracy ----------------------------------------------------------------------------------


def errors(ds: xr.Dataset, name: str, t_max: float) -> tuple[float, float, float]:
    """(max diagonal, max off-diagonal |name - response_exact|, max stderr) over t <= t_max."""
    window = ds.sel(lag=ds["time"] <= t_max + 1e-12)
    diff = abs(window[name] - window["response_exact"]).values
    diagonal = np.eye(diff.shape[1], diff.shape[2], dtype=bool)
    off = diff[:, ~diagonal].max() if (~diagonal).any() else float("nan")
    return float(diff[:, diagonal].max()), float(off), float(window[f"{name}_stderr"].max())


def accuracy_row(label: str, path: Path, client: Any, **kwargs: Any) -> xr.Dataset:
    start = time.perf_counter()
    ds = estimate_response(path, client=client, exact=True, max_time=10.0, **kwargs)
    wall = time.perf_counter() - start
    for name in [v for v in ("response", "response_kde") if v in ds]:
        diag, off, stderr = errors(ds, name, 10.0)
        kind = label if name == "response" else f"{label} KDE"
        say(
            f"  {kind:<40} diag {diag:.4f}  off-diag {off:.4f}  max stderr {stderr:.4f}  "
            f"order {ds.attrs['order']}  rejection {ds.attrs['rejection']:.2e}  {wall:.0f} s"
        )
    return ds


def accuracy(cache: Path, quick: bool) -> None:
    n = 10**5 if quick else 10**7
    print(f"\n== accuracy, N = {n:.0e} (error: max over t <= 10 of |estimate - exact FDT|)")
    client = get_client(n_workers=2, quiet=True)

    ou = cached_store(cache, "ou", n, client=client)
    ds = estimate_response(ou, client=client, exact=True, max_time=3.0)
    ou_model: Any = make_model("ou")  # OU's own analytic response
    truth = ou_model.response(ds["time"].values)
    error = np.abs(ds["response"].values - truth)
    ratio = error / ds["response_stderr"].values
    say(
        f"  {'OU vs expm(-Γt), t <= 3':<40} max error {error.max():.4f}  "
        f"max error/stderr {ratio.max():.2f}  within 2 stderr: {np.mean(ratio <= 2):.1%} of "
        f"entries  order {ds.attrs['order']}  basis {ds.attrs['basis'].split('(')[0]}"
    )

    tw = cached_store(cache, "triple-well", n, client=client)
    accuracy_row("triple-well M = 60", tw, client, order=60, kde=True)
    accuracy_row("triple-well automatic", tw, client)

    lm = cached_store(cache, "langevin-morse", n, client=client)
    accuracy_row(
        "Langevin-Morse Laguerre x Hermite (90, 0)",
        lm,
        client,
        basis="laguerre(theta=1),hermite",
        order=(90, 0),
        index_set="box",
        kde=True,
    )
    accuracy_row("Langevin-Morse automatic", lm, client)


# --- 3. speed -------------------------------------------------------------------------------------


def graph_figures(graph: ReductionGraph) -> tuple[int, int, int]:
    """(bytes of the pickled graph, block tasks, all tasks) of one pass's graph as sent."""
    tasks = len(graph.total.__dask_graph__())
    return len(cloudpickle.dumps(graph)), len(graph.blocks), tasks


def rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def fmt_passes(graphs: list[tuple[str, int, int, int]]) -> str:
    return "; ".join(f"{n} {b / 1024:.0f} KiB {k} blocks/{t} tasks" for n, b, k, t in graphs)


def fmt_run(n: int, run: dict[str, Any]) -> str:
    """Wall time, rate, the client's RSS and the largest graph of one observed estimate."""
    name, nbytes = max(run["graphs"], key=lambda g: g[1])[:2]
    return (
        f"{run['wall']:.1f} s, {n / run['wall']:.3g} samples/s; client RSS "
        f"{run['rss_before']:.0f} MiB before, peak {run['rss_peak']:.0f} MiB; largest graph "
        f"{nbytes / 1024:.0f} KiB ({name})"
    )


def say_run(line: str, run: dict[str, Any]) -> None:
    """``line`` (with the load), then the estimate's time per step and its passes."""
    say(line)
    print("      steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in run["steps"].items()))
    print("      passes: " + fmt_passes(run["graphs"]))


def steps_estimate(path: Path, client: Any, order: int, max_lag: int) -> dict[str, Any]:
    """The kernel-embedding estimate of ``path`` at a fixed order, step by step through the
    public steps of :mod:`kelr_dist.pipeline.steps` (as ``estimate_response(...,
    estimator="kernel-embedding", order=order, max_lag=max_lag)`` composes them), each step
    timed; the client's peak RSS sampled while it runs; every pass's graph kept and measured
    after the run."""
    traj = open_trajectory(path)
    names = [str(c) for c in traj["component"].values]
    observable, forcing = identity_observable(names), constant_forcing(names)
    times: dict[str, float] = {}
    graphs: list[ReductionGraph] = []

    def step(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        times[name] = time.perf_counter() - start
        return out

    before = rss_mib()
    with observe_graphs(graphs.append), peak_memory([os.getpid()]) as peak:
        start = time.perf_counter()
        kept, in_memory = step(
            "keep_in_memory", lambda: keep_in_memory(scatter_trajectory(traj, client), client)
        )
        passes = Passes(kept, client, False, in_memory)
        survey = step("survey_data", survey_data, passes, observable)
        coordinates = step("choose_coordinates", choose_coordinates, passes, survey)
        basis = TensorBasis(coordinates, order, "total")
        fits = step("fit_estimators", fit_estimators, passes, density_basis=basis)
        ke = step("choose_kernel_embedding", choose_kernel_embedding, passes, fits.density, order)
        scores = {"response_kernel_embedding": DensityScore(ke.density, ke.order, ke.delta)}
        response = response_reduction(
            scores,
            observable,
            forcing,
            max_lag,
            centre=survey.centre,
            scales=survey.moments.std,
            corrected=list(scores),
            origin=survey.moments.mean,
        )
        step("respond", respond, passes, response)
        wall = time.perf_counter() - start
    figures = [(", ".join(r.name for r in g.reductions), *graph_figures(g)) for g in graphs]
    del graphs, kept, passes
    return {
        "wall": wall,
        "steps": times,
        "rss_before": before,
        "rss_peak": peak[os.getpid()] / 2**20,
        "graphs": figures,
        "passes": len(figures),
        "store_reads": 1 if in_memory else len(figures),
        "in_memory": in_memory,
    }


def speed(
    cache: Path, quick: bool, sizes: tuple[int, ...] | None = None, output: Path | None = None
) -> None:
    sizes = sizes or ((10**5, 10**6) if quick else (10**6, 10**7, 10**8))
    order, max_lag = 60, 2000
    print(
        f"\n== speed: triple-well, M = {order}, S = {max_lag}, estimator kernel-embedding, "
        "embedded cluster of 2 workers, step by step (kelr_dist.pipeline.steps)"
    )
    client = get_client(n_workers=2, quiet=True)
    runs = {}
    for n in sizes:
        path = cached_store(cache, "triple-well", n, client=client)
        say(f"  N = {n:.0e}: starting")
        run = runs[n] = steps_estimate(path, client, order, max_lag)
        say_run(
            f"  N = {n:.0e}: {fmt_run(n, run)}; passes {run['passes']}, store reads "
            f"{run['store_reads']} (kept in memory: {run['in_memory']})",
            run,
        )
    if 10**7 in runs and PAPER_SECONDS:
        say(
            f"  paper (MATLAB, N = 1e7): {PAPER_SECONDS:.3g} s; this: {runs[10**7]['wall']:.1f} "
            f"s, {PAPER_SECONDS / runs[10**7]['wall']:.0f}x faster (target 1e7 <= 8 s)"
        )
    if output is not None:
        write_speed_table(runs, output)
        say(f"  table: {output}")
    big, mid = max(sizes), sorted(sizes)[-2] if len(sizes) > 1 else None
    if mid is not None:
        rss = runs[big]["rss_peak"] / runs[mid]["rss_peak"]
        graph = max(g[1] for g in runs[big]["graphs"]) / max(g[1] for g in runs[mid]["graphs"])
        say(
            f"  ratio N = {big:.0e} / {mid:.0e}: client peak RSS {rss:.2f}x, largest graph "
            f"{graph:.2f}x (target: both <= 1.2x)"
        )


def write_speed_table(runs: dict[int, dict[str, Any]], path: Path) -> None:
    """The speed runs as the documentation's table (``--output``)."""
    header = [
        "N", "wall time", "samples/s", "client peak RSS", "largest graph", "passes",
        "store reads", "per step (survey / coefficients / order sweep / response)",
    ]  # fmt: skip
    steps = ("survey_data", "fit_estimators", "choose_kernel_embedding", "respond")
    rows = [
        [
            f"{n:.0e}", f"{run['wall']:.1f} s", f"{n / run['wall']:.2g}",
            f"{run['rss_peak']:.0f} MiB", f"{max(g[1] for g in run['graphs']) / 1024:.0f} KiB",
            str(run["passes"]), str(run["store_reads"]),
            " / ".join(f"{run['steps'][k]:.1f}" for k in steps) + " s",
        ]
        for n, run in sorted(runs.items())
    ]  # fmt: skip
    note = (
        "Triple-well, kernel embedding at M = 60, largest lag S = 2000, embedded cluster of 2 "
        "worker processes; the store is kept in the workers' memory after its first read when "
        "it fits in a quarter of it."
    )
    write_table(path, header, rows, note)


# --- 4. automatic estimates -----------------------------------------------------------------------


def observed_estimate(
    path: Path, client: Any, verbose: bool = False, **kwargs: Any
) -> tuple[xr.Dataset, dict[str, Any]]:
    """``estimate_response(path, client=client, **kwargs)`` with every pass's graph observed:
    a step's time is from the moment its pass's graph is built to the next one's (the first
    entry, "open", is everything before the first pass: options, store, keep_in_memory).
    ``verbose``: a line as each pass starts (a long run says how far it got)."""
    marks: list[tuple[str, float, ReductionGraph]] = []

    def mark(graph: ReductionGraph) -> None:
        marks.append((", ".join(r.name for r in graph.reductions), time.perf_counter(), graph))
        if verbose:
            say(f"    pass {len(marks)} ({marks[-1][0]}) starts; client RSS {rss_mib():.0f} MiB")

    before = rss_mib()
    with observe_graphs(mark), peak_memory([os.getpid()]) as peak:
        start = time.perf_counter()
        ds = estimate_response(path, client=client, **kwargs)
        end = time.perf_counter()
    times = {"open": marks[0][1] - start} if marks else {}
    for (name, at, _), nxt in zip(marks, [m[1] for m in marks[1:]] + [end], strict=True):
        times[name] = nxt - at
    figures = [(name, *graph_figures(graph)) for name, _, graph in marks]
    return ds, {
        "wall": end - start,
        "steps": times,
        "rss_before": before,
        "rss_peak": peak[os.getpid()] / 2**20,
        "graphs": figures,
    }


def automatic(cache: Path, quick: bool) -> None:
    runs = [
        ("ou", 2 * 10**5 if quick else 2 * 10**6, 5.0),
        ("coupled-3d", 10**6 if quick else 10**7, 30.0),
    ]
    print("\n== automatic estimates (estimator='auto'), embedded cluster of 2 workers")
    client = get_client(n_workers=2, quiet=True)
    for model, n, target in runs:
        path = cached_store(cache, model, n, client=client)
        ds, run = observed_estimate(path, client, estimator="auto")
        say_run(
            f"  {model} N = {n:.0e}: {run['wall']:.1f} s (target <= {target:.0f} s), chosen "
            f"{ds.attrs['estimator']}; passes {ds.attrs['passes']}, store reads "
            f"{ds.attrs['store_reads']}; client peak RSS {run['rss_peak']:.0f} MiB",
            run,
        )


# --- 5. one large store ---------------------------------------------------------------------------


def large(cache: Path, quick: bool, n: int | None = None) -> None:
    """An OU store of ``n`` samples (default 1e9, fewer when the disk is short), estimated
    out of core at cheap settings on the default embedded cluster; deleted afterwards."""
    n = n or (10**7 if quick else 10**9)
    free = shutil.disk_usage(cache).free
    if 2 * 8 * n > free / 2:  # the store (2 float64 components) and half the disk to spare
        n = int(free / 2 / 16) // 10**8 * 10**8
        say(f"  disk: {free / GIB:.0f} GiB free: N lowered to {n:.2g}")
    print(f"\n== large: OU N = {n:.2g} ({16 * n / GIB:.1f} GiB), order 8, S = 200, 2 workers")
    path = cache / f"large-ou-{n:.0e}.zarr"
    client = get_client(n_workers=2, quiet=True)
    try:
        start = time.perf_counter()
        simulate("ou", path, n // CHAINS, chains=CHAINS, chunk=1 << 22, client=client)
        say(f"  simulated: {time.perf_counter() - start:.0f} s")
        pids = list(client.run(os.getpid).values())
        with peak_memory(pids) as workers:
            ds, run = observed_estimate(
                path, client, True, estimator="kernel-embedding", max_order=8, max_lag=200
            )
    finally:
        shutil.rmtree(path, ignore_errors=True)
    say_run(
        f"  estimate: {fmt_run(n, run)}; worker peak RSS "
        f"{[round(v / 2**20) for v in workers.values()]} MiB; passes {ds.attrs['passes']}, "
        f"store reads {ds.attrs['store_reads']}",
        run,
    )


# --- 6. tasks per pass ----------------------------------------------------------------------


TASKS_LAG = 200  # the halo of the lagged pass (S of the large run)


def _column_sums(x: np.ndarray, _info: BlockInfo, _halo: np.ndarray | None) -> dict:
    return {"count": len(x), "sum": x.sum(axis=0)}


def _lagged(x: np.ndarray, _info: BlockInfo, halo: np.ndarray | None) -> np.ndarray:
    assert halo is not None  # a reduction with a halo gets one
    return lagged_sums(np.concatenate([x, halo]), x, TASKS_LAG)


def tasks_per_pass(cache: Path, quick: bool) -> None:
    """Tasks the scheduler runs for one pass over an OU store (read out of core, not kept) in
    4096-row chunks and in 1e6-row chunks, a pass without halo and one with ``S = 200``,
    against the pass's blocks (target: at most 2x)."""
    print("\n== tasks per pass (counted by the scheduler's task stream)")
    client = get_client(n_workers=2, quiet=True)
    passes = {
        "sums": [Reduction("sums", _column_sums)],
        f"lagged S={TASKS_LAG}": [Reduction("lagged", _lagged, halo=TASKS_LAG)],
    }
    for chunk, n in ((4096, 2 * 10**5 if quick else 2 * 10**6), (10**6, 8 * 10**6)):
        path = cache / f"tasks-ou-{n:.0e}-chunk{chunk}.zarr"
        if not path.exists():
            simulate("ou", path, n // CHAINS, chains=CHAINS, chunk=chunk, client=client)
        trajectory = open_trajectory(path)
        for label, reductions in passes.items():
            blocks = len(build_graph(trajectory, reductions).blocks)
            start = time.perf_counter()
            with get_task_stream(client) as stream:
                run_reductions(trajectory, reductions, client, progress=False)
            tasks = len(stream.data)
            say(
                f"  N={n:.0e} in {chunk}-row chunks ({len(trajectory.data.chunks[1])} a chain), "
                f"{label}: {blocks} blocks, {tasks} tasks ({tasks / blocks:.2f}x), "
                f"{time.perf_counter() - start:.1f} s"
            )


# --- 7. the pilot: what the automatic estimate costs against the family it chooses ---------------

PILOT_SYSTEMS = ("coupled-3d", "coupled-4d", "coupled-6d")
PILOT_REPEATS = 3


def pilot_cost(
    cache: Path,
    quick: bool,
    repeats: int = PILOT_REPEATS,
    systems: Sequence[str] = PILOT_SYSTEMS,
) -> None:
    """On each d >= 3 system: the automatic estimate (pilot on), the family it chose alone, and
    the automatic estimate with every family fitted, alternated ``repeats`` times after a
    warm-up run; medians and ratios (target: automatic / chosen alone <= 1.3), and whether the
    pilot changed the choice."""
    n = 10**6 if quick else 10**7
    print(f"\n== the pilot (estimator='auto' against the chosen family alone), N = {n:.0e}")
    client = get_client(n_workers=2, quiet=True)
    for model in systems:
        path = cached_store(cache, model, n, client=client)
        warm = estimate_response(path, client=client, progress=False)
        chosen = warm.attrs["estimator"]
        seconds: dict[str, list[float]] = {"auto": [], "alone": [], "every": []}
        picks = set()
        for _ in range(repeats):
            for label, estimator in (("auto", "auto"), ("alone", chosen), ("every", "auto")):
                start = time.perf_counter()
                ds = estimate_response(
                    path, client=client, progress=False, estimator=estimator, pilot=label != "every"
                )
                seconds[label].append(time.perf_counter() - start)
                if label == "every":
                    picks.add(ds.attrs["estimator"])
        auto, alone, every = (float(np.median(seconds[k])) for k in ("auto", "alone", "every"))
        say(
            f"  {model}: median of {repeats}: auto {auto:.1f} s, {chosen} alone "
            f"{alone:.1f} s, every family {every:.1f} s; auto / alone {auto / alone:.2f} "
            f"(target <= 1.3), every family / alone {every / alone:.2f}; chosen with every "
            f"family: {', '.join(sorted(picks))}"
        )
        print(f"      {warm.attrs.get('pilot', 'no pilot')}")


SECTIONS = {
    "speed": speed,
    "auto": automatic,
    "large": large,
    "accuracy": accuracy,
    "ooc": out_of_core,
    "tasks": tasks_per_pass,
    "pilot": pilot_cost,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--cache", type=Path, default=Path("runs/bench"), help="store cache")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument(
        "--speed-sizes", nargs="+", type=float, help="N of the speed runs (default 1e6 1e7 1e8)"
    )
    parser.add_argument("--large-n", type=float, help="N of the large run (default 1e9)")
    parser.add_argument(
        "--pilot-repeats", type=int, default=PILOT_REPEATS, help="alternations of the pilot runs"
    )
    parser.add_argument(
        "--pilot-systems", nargs="+", default=list(PILOT_SYSTEMS), help="systems of the pilot runs"
    )
    parser.add_argument(
        "--output", type=Path, help="also write the speed table as Markdown to this file"
    )
    args = parser.parse_args()
    cache = args.cache / ("quick" if args.quick else "full")
    cache.mkdir(parents=True, exist_ok=True)
    say(f"bench_pipeline ({'quick' if args.quick else 'full'}), {os.cpu_count()} CPUs")
    for name in args.only:
        if name == "speed":
            sizes = tuple(int(n) for n in args.speed_sizes) if args.speed_sizes else None
            speed(cache, args.quick, sizes, args.output)
        elif name == "large" and args.large_n:
            large(cache, args.quick, int(args.large_n))
        elif name == "pilot":
            pilot_cost(cache, args.quick, args.pilot_repeats, args.pilot_systems)
        else:
            SECTIONS[name](cache, args.quick)
    close_embedded_cluster()


if __name__ == "__main__":
    main()
