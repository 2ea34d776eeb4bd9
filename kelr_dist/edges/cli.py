"""The ``kelr`` command line: simulate, inspect, estimate, run job files and report.

Every command exits with 0 on success and 2 on a usage or input error (a missing or broken
store, a bad option value, a bad job file, an unreachable scheduler, an existing output),
printing one line ``kelr <command>: error: <what is wrong>`` on stderr and no traceback.
Outputs are written atomically (:func:`kelr_dist.pipeline.result.write_result`), so a failed run
leaves none behind. Progress bars are shown on a terminal only, and never with ``--quiet``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
import yaml

from kelr_dist import __version__
from kelr_dist.data.models import MODEL_NAMES
from kelr_dist.edges.jobfile import (
    ESTIMATORS,
    INDEX_SETS,
    Job,
    check_basis,
    check_degree,
    check_delta,
    check_max_order,
    check_order,
    load_job,
)
from kelr_dist.kernels.reduction import SYNCHRONOUS

#: exceptions a user can cause (TrajectoryError, ClusterError and JobError are ValueErrors)
INPUT_ERRORS = (ValueError, OSError, yaml.YAMLError)
EXIT_INPUT_ERROR = 2
EXIT_INTERRUPTED = 130
PROBE_TIMEOUT = 5.0  # seconds to open a TCP connection to a named scheduler


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class KelrGroup(click.Group):
    """A click group that turns user errors into one line on stderr and exit code 2."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, **extra: Any):  # type: ignore[override]
        if extra.pop("standalone_mode", True) is False:
            return super().main(args, prog_name, standalone_mode=False, **extra)
        warnings.showwarning = _show_warning
        try:
            result = super().main(args, prog_name or "kelr", standalone_mode=False, **extra)
        except click.ClickException as err:
            context = getattr(err, "ctx", None)
            where = context.command_path if context is not None else "kelr"
            hint = f" (see '{where} --help')" if isinstance(err, click.UsageError) else ""
            _fail(where, err.format_message() + hint)
        except (click.Abort, KeyboardInterrupt):
            click.echo("kelr: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except INPUT_ERRORS as err:
            _fail(_command_path(args), str(err))
        sys.exit(result if isinstance(result, int) else 0)


def _command_path(args: Sequence[str] | None) -> str:
    words = list(sys.argv[1:] if args is None else args)
    command = next((w for w in words if not w.startswith("-")), None)
    return f"kelr {command}" if command in main.commands else "kelr"


def _show_warning(message: Any, category: type, *args: Any, **kwargs: Any) -> None:
    """Warnings of the package as one line on stderr (``kelr: warning: ...``)."""
    click.echo(f"kelr: warning: {_one_line(str(message))}", err=True)


def _fail(where: str, message: str) -> None:
    click.echo(f"{where}: error: {_one_line(message)}", err=True)
    sys.exit(EXIT_INPUT_ERROR)


# --------------------------------------------------------------------------------------------
# option types
# --------------------------------------------------------------------------------------------


class _Checked(click.ParamType):
    """A string option converted by ``parse`` and checked by a job-file check."""

    def __init__(self, name: str, check: Callable[[Any], Any]) -> None:
        self.name = name
        self.check = check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.check(_scalar_or_list(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


def _scalar_or_list(text: str) -> Any:
    """``"60"`` -> 60, ``"1e-7"`` -> 1e-7, ``"90,0"`` -> [90, 0], else the text."""
    parts = [p.strip() for p in text.split(",")]
    values = [_number(p) for p in parts]
    return values if len(values) > 1 else values[0]


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


ORDER = _Checked("order", check_order)
MAX_ORDER = _Checked("max_order", check_max_order)
DELTA = _Checked("delta", check_delta)
DEGREE = _Checked("degree", check_degree)


def _basis(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return check_basis(value)
    except ValueError as err:
        raise click.BadParameter(str(err), ctx, param) from None


def _model_params(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> dict:
    """``--param key=value`` (repeated) -> ``{key: value}``, values read as YAML scalars/lists."""
    params: dict[str, Any] = {}
    for item in values:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise click.BadParameter(f"expected key=value, got {item!r}", ctx, param)
        try:
            params[key.strip()] = yaml.safe_load(text)
        except yaml.YAMLError:
            raise click.BadParameter(f"cannot read the value of {item!r}", ctx, param) from None
    return params


def _progress(quiet: bool) -> bool | None:
    """Progress bars: never with ``--quiet``, else on a terminal only."""
    return False if quiet else None


# --------------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------------


@click.group(cls=KelrGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kelr")
def main() -> None:
    """Kernel-embedding linear response (kelr) from long equilibrium trajectories.

    \b
    A typical session on this machine (embedded local Dask cluster):
      kelr simulate triple-well tw.zarr --samples 1000000 --chunk 250000
      kelr info tw.zarr
      kelr estimate tw.zarr tw-response.zarr --max-time 10 --exact --kde
      kelr report tw-response.zarr --figures tw-figures

    Exit codes: 0 success, 2 usage or input error (one line on stderr).
    """


@main.command()
@click.argument("model", type=click.Choice(MODEL_NAMES), metavar="MODEL")
@click.argument("store", type=click.Path(dir_okay=True, file_okay=False))
@click.option("--samples", type=click.IntRange(min=1), required=True, help="Samples per chain.")
@click.option(
    "--chains", type=click.IntRange(min=1), default=1, show_default=True, help="Independent chains."
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Random seed (chain c uses SeedSequence(seed).spawn(chains)[c]).",
)
@click.option(
    "--chunk",
    type=click.IntRange(min=1),
    default=262144,
    show_default=True,
    help="Samples per time chunk of the store (and per task).",
)
@click.option(
    "--burn-in",
    type=click.IntRange(min=0),
    default=None,
    help="Samples discarded at the start of each chain [default: the model's].",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    callback=_model_params,
    metavar="KEY=VALUE",
    help="Model parameter, repeatable (e.g. --param kT=1.0).",
)
@click.option(
    "--scheduler",
    metavar="ADDR",
    help="Run the chains on this Dask scheduler (default: in this process).",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an existing store made with other settings (atomically, once the new one "
    "is complete).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def simulate(
    model: str,
    store: str,
    samples: int,
    chains: int,
    seed: int,
    chunk: int,
    burn_in: int | None,
    params: dict[str, Any],
    scheduler: str | None,
    overwrite: bool,
    quiet: bool,
) -> None:
    """Simulate a built-in MODEL into a new trajectory STORE (zarr).

    An interrupted run is resumed by the same command; a complete store with the same
    settings is left as it is. A store with other settings is refused unless --overwrite
    is given (a file or a folder that is not a zarr store is never replaced).

    \b
    Examples:
      kelr simulate ou ou.zarr --samples 200000 --chunk 50000
      kelr simulate triple-well tw.zarr --samples 10000000 --chains 2 --param kT=1.0
      kelr simulate langevin-morse lm.zarr --samples 1000000 --scheduler tcp://host:8786
    """
    from kelr_dist.data.models import make_model
    from kelr_dist.data.simulate import simulate as run_simulation

    built = make_model(model, **params)  # bad parameters fail before the store exists
    with contextlib.ExitStack() as stack:
        client = _client(scheduler, None, None, quiet) if scheduler else None
        if client is not None:
            stack.callback(client.close)
        trajectory = run_simulation(
            built,
            store,
            samples,
            chains=chains,
            seed=seed,
            chunk=chunk,
            client=client,
            burn_in=burn_in,
            progress=_progress(quiet),
            overwrite=overwrite,
        )
    click.echo(_format_info(_describe(trajectory)))


def _probe_scheduler(address: str | None) -> None:
    """Fail at once when nothing listens at a ``tcp://``/``tls://`` scheduler address.

    A refused connection is known immediately, whereas a ``distributed.Client`` keeps retrying
    it until its connect timeout; other schemes are left to the client.
    """
    from kelr_dist.engine.cluster import ClusterError

    if not address:
        return
    scheme, _, location = address.rpartition("://")
    host, _, port = location.rpartition(":")
    if scheme not in ("", "tcp", "tls") or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT).close()
    except OSError as err:
        raise ClusterError(
            f"cannot reach the Dask scheduler at address={address!r}: {err}"
        ) from None


def _client(scheduler: str | None, workers: int | None, memory_limit: Any, quiet: bool) -> Any:
    """``"synchronous"``, or a client of the scheduler (argument or ``DASK_SCHEDULER_ADDRESS``)
    or of the embedded cluster."""
    from kelr_dist.engine.cluster import check_address, get_client

    if scheduler == SYNCHRONOUS:
        return SYNCHRONOUS
    address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if address:
        check_address(address)  # a forbidden plain-TCP address is refused before connecting
    _probe_scheduler(address)
    return get_client(scheduler, n_workers=workers, memory_limit=memory_limit, quiet=quiet)


def _describe(trajectory: Any) -> dict[str, Any]:
    from kelr_dist.data.store import describe_trajectory

    return describe_trajectory(trajectory)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _format_info(summary: dict[str, Any]) -> str:
    """The ``kelr info`` text of :func:`kelr_dist.data.store.describe_trajectory`'s dict."""
    shape = (summary["chains"], summary["length"], len(summary["components"]))
    origin = dict(summary["origin"])
    params = origin.pop("model_params", None)
    rows = [
        ("store", summary["store"]),
        ("variable", summary["variable"]),
        ("dims", f"{tuple(summary['dims'])} = {shape}"),
        ("components", ", ".join(summary["components"])),
        ("length", f"{summary['length']} samples per chain x {summary['chains']} chain(s)"),
        ("dt", f"{summary['dt']:.6g} (duration {summary['duration']:.6g} per chain)"),
        (
            "chunking",
            f"{summary['time_chunk']} samples per time chunk, {summary['n_blocks']} blocks",
        ),
        ("size", f"{_human_bytes(summary['bytes'])} ({summary['dtype']})"),
        ("origin", ", ".join(f"{k} {v}" for k, v in origin.items()) or "not recorded"),
    ]
    if params is not None:
        rows.append(("model params", json.dumps(params, sort_keys=True)))
    return "\n".join(f"{label:<12}  {value}" for label, value in rows)


@main.command()
@click.argument("store", type=click.Path())
@click.option("--variable", default="x", show_default=True, help="Trajectory variable.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def info(store: str, variable: str, as_json: bool) -> None:
    """Validate the trajectory STORE and print its summary.

    Shows dims, length, dt, chunking, size and where the data came from; a store that breaks
    the trajectory contract is reported with what is wrong (exit code 2).

    \b
    Examples:
      kelr info tw.zarr
      kelr info data.zarr --variable u --json
    """
    from kelr_dist.data.store import open_trajectory

    summary = _describe(open_trajectory(store, variable))
    click.echo(json.dumps(summary, default=str, indent=2) if as_json else _format_info(summary))


def _check_outputs(targets: Sequence[Path | None], overwrite: bool) -> None:
    """Refuse outputs that exist (without --overwrite) or could not be written, before work."""
    from kelr_dist.pipeline.result import check_output

    for target in targets:
        if target is None:
            continue
        if target.exists() and not overwrite:
            raise ValueError(
                f"output {str(target)!r} exists; remove it, choose another path or pass --overwrite"
            )
        check_output(target, overwrite)


def _run_estimate(
    store: Path,
    variable: str,
    options: Callable[[list[str]], dict[str, Any]],
    *,
    result: Path,
    netcdf: Path | None,
    figures: Path | None,
    overwrite: bool,
    scheduler: str | None,
    workers: int | None,
    memory_limit: str | int | None,
    quiet: bool,
) -> None:
    """Validate the inputs, estimate on the chosen cluster, write the outputs, print where the
    result went and its headline numbers (``kelr report`` prints the whole summary).

    ``options(components)`` gives the keyword arguments of ``estimate_response`` for the
    store's component names. Everything that can be checked cheaply (outputs, the store) is
    checked before a cluster starts; the outputs are written once the estimate is complete.
    """
    from kelr_dist.data.store import open_trajectory
    from kelr_dist.edges.report import headline, write_figures
    from kelr_dist.engine.cluster import close_embedded_cluster
    from kelr_dist.pipeline.estimate import estimate_response
    from kelr_dist.pipeline.result import write_result

    _check_outputs([result, netcdf], overwrite)
    trajectory = open_trajectory(store, variable)
    kwargs = options([str(c) for c in trajectory["component"].values])
    client = _client(scheduler, workers, memory_limit, quiet)
    try:
        ds = estimate_response(store, client=client, progress=_progress(quiet), **kwargs)
    finally:
        if client != SYNCHRONOUS:
            client.close()
        close_embedded_cluster()
    write_result(ds, result, overwrite=overwrite)
    if netcdf is not None:
        write_result(ds, netcdf, overwrite=overwrite)
    click.echo(headline(ds, str(result)))  # the whole table is 'kelr report's
    if figures is not None:
        for path in write_figures(ds, figures):
            click.echo(f"wrote {path}")


@main.command()
@click.argument("store", type=click.Path())
@click.argument("out", type=click.Path())
@click.option("--variable", default="x", show_default=True, help="Trajectory variable.")
@click.option(
    "--estimator",
    type=click.Choice(ESTIMATORS),
    default="auto",
    show_default=True,
    help="Score estimate: the paper's kernel embedding, score matching (Hyvärinen 2005), or "
    "auto (the one with the smaller held-out Hyvärinen loss).",
)
@click.option(
    "--degree",
    type=DEGREE,
    default="auto",
    show_default=True,
    help="Score matching: 'auto' (held-out loss) or a total degree q >= 1.",
)
@click.option(
    "--folds",
    type=click.IntRange(min=2),
    default=4,
    show_default=True,
    help="Held-out folds: whole chains, or contiguous blocks of each chain.",
)
@click.option(
    "--basis",
    default="auto",
    show_default=True,
    callback=_basis,
    help="'auto' or one entry per component, e.g. 'laguerre(theta=1),hermite'.",
)
@click.option(
    "--order",
    type=ORDER,
    default="auto",
    show_default=True,
    help="'auto' (criteria of the paper's §4), an order M, or M1,M2 (box).",
)
@click.option(
    "--max-order",
    type=MAX_ORDER,
    default=None,
    help="Highest order fitted and scanned [default: by dimension].",
)
@click.option(
    "--index-set",
    type=click.Choice(INDEX_SETS),
    default="auto",
    show_default=True,
    help="Multi-indices: total degree |m| <= M, box m_k <= M_k, or auto (total, unless "
    "only one coordinate is active).",
)
@click.option(
    "--max-lag",
    type=click.IntRange(min=0),
    default=None,
    help="Largest lag in samples (not with --max-time).",
)
@click.option(
    "--max-time",
    type=click.FloatRange(min=0),
    default=None,
    help="Largest lag in time units (not with --max-lag).",
)
@click.option(
    "--delta",
    type=DELTA,
    default="auto",
    show_default=True,
    help="Positivity threshold: 'auto', 'paper' or a number.",
)
@click.option("--exact", is_flag=True, help="Also the exact-FDT response (built-in models).")
@click.option("--kde", is_flag=True, help="Also the Gaussian-KDE baseline.")
@click.option("--gaussian", is_flag=True, help="Also the quasi-Gaussian baseline.")
@click.option(
    "--scheduler",
    metavar="ADDR",
    help="Dask scheduler address, or 'synchronous' (no cluster) "
    "[default: DASK_SCHEDULER_ADDRESS, else an embedded local cluster].",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes of the embedded cluster [default: CPU count].",
)
@click.option(
    "--memory-limit",
    metavar="SIZE",
    default=None,
    help="Memory per embedded worker, e.g. 2GiB [default: 80% of RAM / workers].",
)
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or cluster logs.")
def estimate(
    store: str,
    out: str,
    variable: str,
    estimator: str,
    degree: Any,
    folds: int,
    basis: str,
    order: Any,
    max_order: Any,
    index_set: str,
    max_lag: int | None,
    max_time: float | None,
    delta: Any,
    exact: bool,
    kde: bool,
    gaussian: bool,
    scheduler: str | None,
    workers: int | None,
    memory_limit: str | None,
    overwrite: bool,
    quiet: bool,
) -> None:
    """Estimate the linear response operator of STORE and write it to OUT.

    OUT is a zarr store, or netCDF when it ends in .nc. Printed: where the result went, the
    estimator and its order/degree, the largest standard error (and whether its block
    averaging converged) and the largest lag-0 Stein residual in standard errors; 'kelr report
    OUT' prints the whole summary.

    \b
    Examples:
      kelr estimate tw.zarr tw-response.zarr --max-time 10 --exact --kde
      kelr estimate lm.zarr lm.nc --basis 'laguerre(theta=1),hermite' \\
          --index-set box --order 90,0 --max-lag 2000
      kelr estimate big.zarr out.zarr --scheduler tcp://scheduler:8786
      kelr estimate tw.zarr out.zarr --workers 2 --memory-limit 1GiB --quiet
    """
    if max_lag is not None and max_time is not None:
        raise click.UsageError("--max-lag and --max-time are mutually exclusive")
    options = {
        "variable": variable,
        "estimator": estimator,
        "degree": degree,
        "folds": folds,
        "basis": basis,
        "order": order,
        "max_order": max_order,
        "index_set": index_set,
        "max_lag": max_lag,
        "max_time": max_time,
        "delta": delta,
        "exact": exact,
        "kde": kde,
        "gaussian": gaussian,
    }
    _run_estimate(
        Path(store),
        variable,
        lambda components: options,
        result=Path(out),
        netcdf=None,
        figures=None,
        overwrite=overwrite,
        scheduler=scheduler,
        workers=workers,
        memory_limit=memory_limit,
        quiet=quiet,
    )


@main.command()
@click.argument("job_file", metavar="JOB.yaml", type=click.Path())
@click.option(
    "--scheduler",
    metavar="ADDR",
    help="Dask scheduler address (overrides the job's cluster section).",
)
@click.option("--overwrite", is_flag=True, help="Replace existing outputs.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or cluster logs.")
def run(job_file: str, scheduler: str | None, overwrite: bool, quiet: bool) -> None:
    """Run the estimate described by a job file (schema: kelr_dist.edges.jobfile).

    The file is validated completely first; relative paths are taken relative to its folder.

    \b
    Example job.yaml:
      input: {store: tw.zarr}
      basis: {order: auto, max_order: 60}
      lags: {max_time: 10}
      baselines: {exact: true, kde: true}
      outputs: {result: tw-response.zarr, figures: tw-figures}
    \b
    Examples:
      kelr run job.yaml
      kelr run job.yaml --scheduler tcp://scheduler:8786 --quiet
    """
    job: Job = load_job(job_file)
    cluster = (
        (scheduler, None, None) if scheduler else (job.scheduler, job.workers, job.memory_limit)
    )
    _run_estimate(
        job.store,
        job.variable,
        job.estimate_kwargs,
        result=job.result,
        netcdf=job.netcdf,
        figures=job.figures,
        overwrite=overwrite or job.overwrite,
        scheduler=cluster[0],
        workers=cluster[1],
        memory_limit=cluster[2],
        quiet=quiet,
    )


@main.command()
@click.argument("result", type=click.Path())
@click.option(
    "--figures",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Write PNG figures (criteria, responses, density) to this folder.",
)
def report(result: str, figures: str | None) -> None:
    """Print the summary of a RESULT written by 'kelr estimate' or 'kelr run'.

    The table holds the chosen order, δ, the rejection rate, the run time, the basis and the
    errors against the exact response when present (max over t <= 10 of |k - k_exact|,
    diagonal and off-diagonal). With --figures, PNG figures are written too.

    \b
    Examples:
      kelr report tw-response.zarr
      kelr report tw-response.zarr --figures tw-figures
    """
    from kelr_dist.edges.report import open_result, summary, write_figures

    ds = open_result(result)
    click.echo(summary(ds, result))
    if figures is not None:
        for path in write_figures(ds, figures):
            click.echo(f"wrote {path}")


if __name__ == "__main__":
    main()
