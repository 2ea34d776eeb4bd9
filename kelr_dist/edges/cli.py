"""The ``kelr`` command line: simulate, inspect, estimate, run job files and report.

Every command exits with 0 on success and 2 on a usage or input error (a missing or broken
store, a bad option value, a bad job file, an unreachable scheduler, an existing output, an
output that is, holds or lies inside the input store), printing one line ``kelr <command>:
error: <what is wrong>`` on stderr and no traceback. Outputs are written atomically
(:func:`kelr_dist.pipeline.result.write_result`), so a failed run leaves none behind. Progress
bars are shown on a terminal only, and never with ``--quiet``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import click
import yaml

from kelr_dist import __version__
from kelr_dist.edges.jobfile import KEY_PATHS, Job, JobError, load_job, load_yaml, schema_yaml
from kelr_dist.edges.plotting import PlotExtraError
from kelr_dist.kernels.reduction import SYNCHRONOUS
from kelr_dist.models.registry import MODEL_NAMES
from kelr_dist.pipeline.options import (
    SHOWN_CHARS,
    ClusterOptions,
    EstimateOptions,
    FileOptions,
    Name,
    checked,
    choices,
    python_only,
    shown,
)

#: exceptions a user can cause (TrajectoryError, ClusterError and JobError are ValueErrors;
#: PlotExtraError: figures asked for without the plot extra)
INPUT_ERRORS = (ValueError, OSError, yaml.YAMLError, PlotExtraError)
EXIT_INPUT_ERROR = 2
EXIT_INTERRUPTED = 130
MAX_COUNT_DIGITS = 18  # a count on the command line has at most 19 digits (< 1e19)


def _one_line(text: str) -> str:
    """``text`` on one line, each run of more than ``SHOWN_CHARS`` characters without a space
    (a long path or value quoted in a message) cut to ``SHOWN_CHARS`` with ``...``."""
    return " ".join(
        word if len(word) <= SHOWN_CHARS else word[: SHOWN_CHARS - 3] + "..."
        for word in str(text).split()
    )


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
        except (click.Abort, KeyboardInterrupt, SystemError) as err:
            if isinstance(err, SystemError) and not _interrupted(err):
                raise
            click.echo("kelr: interrupted", err=True)
            if args is not None:  # called from Python (a script, a test run): it stops too
                raise KeyboardInterrupt from None
            _end_by_sigint()
        except INPUT_ERRORS as err:
            _fail(_command_path(args), str(err))
        sys.exit(result if isinstance(result, int) else 0)


def _interrupted(err: BaseException) -> bool:
    """Whether ``err`` carries a Ctrl-C: a KeyboardInterrupt raised while compiled code ran (a
    numba kernel) reaches Python as a SystemError whose cause is the interrupt."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _end_by_sigint() -> None:
    """End the ``kelr`` program as the interrupt asked: by SIGINT itself, so that a shell loop or
    script that ran it sees the interrupt and stops as well (an exit code alone would let it go
    on; https://www.cons.org/cracauer/sigint.html). The shell reports status 130."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    sys.exit(EXIT_INTERRUPTED)  # not reached where SIGINT ends the process


def _command_path(args: Sequence[str] | None) -> str:
    words = list(sys.argv[1:] if args is None else args)
    command = next((w for w in words if not w.startswith("-")), None)
    return f"kelr {command}" if command in main.commands else "kelr"


def _show_warning(message: Any, *_: Any, **__: Any) -> None:
    """Warnings of the package as one line on stderr (``kelr: warning: ...``)."""
    click.echo(f"kelr: warning: {_one_line(str(message))}", err=True)


def _fail(where: str, message: str) -> None:
    click.echo(f"{where}: error: {_one_line(message)}", err=True)
    sys.exit(EXIT_INPUT_ERROR)


# --------------------------------------------------------------------------------------------
# option types
# --------------------------------------------------------------------------------------------


def cli_name(field: str) -> str:
    """The command-line option of a field of :mod:`kelr_dist.pipeline.options`."""
    return "--" + field.replace("_", "-")


def _options_from(
    model: type[Any], exclude: Sequence[str] = (), only: Sequence[str] | None = None
) -> Callable[[Any], Any]:
    """Click options generated from the fields of an options ``model`` (``only`` these, or all
    but those in ``exclude`` and the Python function's own,
    :func:`~kelr_dist.pipeline.options.python_only`): name, help, default, choices. Values are
    passed on as given (``None``: not given) and validated by the model (:func:`_validated`);
    click converts none of them (a flag gives a bool)."""

    def decorate(command: Any) -> Any:
        for name, info in reversed(list(model.model_fields.items())):
            chosen = name not in exclude if only is None else name in only
            if not chosen or python_only(info):
                continue
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            text = str(info.description)
            help_text = text[0].upper() + text[1:] + "."
            if info.annotation is bool:
                flag = cli_name(name) + (f"/--no-{cli_name(name)[2:]}" if info.default else "")
                option = click.option(
                    flag, name, is_flag=True, default=info.default, help=help_text
                )
            else:
                names = choices(info)
                option = click.option(
                    cli_name(name),
                    name,
                    type=str,  # the text goes to the model as it is
                    default=info.default,
                    metavar=f"[{'|'.join(names)}]" if names else extra.get("metavar", "TEXT"),
                    show_default=info.default is not None,
                    help=help_text,
                )
            command = option(command)
        return command

    return decorate


class WholeNumber(click.ParamType):
    """A count: a whole number ``>= minimum``, written as ``100000``, ``100_000`` or ``1e5``."""

    name = "integer"

    def __init__(self, minimum: int) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """``value`` (text, or a default that is already an ``int``) as an ``int``."""
        if isinstance(value, int):
            number = value
        else:
            try:
                exact = Decimal(str(value))
            except InvalidOperation:
                exact = Decimal("nan")
            if not exact.is_finite() or exact != exact.to_integral_value():
                self.fail(f"{value!r} is not a whole number (e.g. 100000 or 1e5)", param, ctx)
            if exact.adjusted() > MAX_COUNT_DIGITS:  # before int() writes out all its digits
                self.fail(f"{value!r} is too large for a count", param, ctx)
            number = int(exact)
        if number < self.minimum:
            self.fail(f"{value!r} is less than the minimum, {self.minimum}", param, ctx)
        return number


def _whole_option(flag: str, minimum: int, default: int | None, text: str) -> Callable[[Any], Any]:
    """A click option for a whole number ``>= minimum`` (:class:`WholeNumber`), its default
    shown unless ``None``."""
    return click.option(
        flag,
        type=WholeNumber(minimum),
        default=default,
        show_default=default is not None,
        help=text,
    )


def _validated(model: type[Any], given: dict[str, Any], name: Name = cli_name) -> Any:
    """The ``model`` of the options given on the command line (``None``: not given); a bad value
    is an :class:`~kelr_dist.pipeline.options.OptionsError` naming the option."""
    values = {k: v for k, v in given.items() if k in model.model_fields and v is not None}
    return checked(model, values, name)


def _model_params(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> dict:
    """``--param key=value`` (repeated) -> ``{key: value}``, values read as YAML scalars/lists."""
    params: dict[str, Any] = {}
    for item in values:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise click.BadParameter(f"expected key=value, got {item!r}", ctx, param)
        try:
            params[key.strip()] = load_yaml(text)
        except yaml.YAMLError:
            raise click.BadParameter(
                f"cannot read the value of {shown(item)}", ctx, param
            ) from None
    return params


def _progress(quiet: bool) -> bool | None:
    """Progress bars: never with ``--quiet``, else on a terminal only."""
    return False if quiet else None


# --------------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------------


@click.group(cls=KelrGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kelr")
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Show Dask's own tracebacks (a lost scheduler, a failing connection) besides the "
    "one-line error.",
)
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Kernel-embedding linear response (kelr) from long equilibrium trajectories.

    \b
    Typical use on this machine (embedded local Dask cluster):
      kelr simulate triple-well tw.zarr --samples 1000000 --chunk 250000
      kelr info tw.zarr
      kelr estimate tw.zarr tw-response.zarr --max-time 10 --exact --kde
      kelr report tw-response.zarr --figures tw-figures

    Exit codes: 0 success, 2 usage or input error (one line on stderr).
    """
    ctx.obj = {"verbose": verbose}


@main.command()
@click.argument("model", type=click.Choice(MODEL_NAMES), metavar="MODEL")
@click.argument("store", type=click.Path(dir_okay=True, file_okay=False))
@click.option(
    "--samples", type=WholeNumber(1), required=True, help="Samples per chain (e.g. 200000 or 2e5)."
)
@_whole_option("--chains", 1, 1, "Independent chains.")
@_whole_option("--seed", 0, 0, "Random seed (chain c uses SeedSequence(seed).spawn(chains)[c]).")
@_whole_option("--chunk", 1, 262144, "Samples per time chunk of the store (and per task).")
@_whole_option(
    "--burn-in", 0, None, "Samples discarded at the start of each chain [default: the model's]."
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
    from kelr_dist.models.registry import make_model
    from kelr_dist.models.simulate import simulate as run_simulation

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


def _client(scheduler: str | None, workers: int | None, memory_limit: Any, quiet: bool) -> Any:
    """``"synchronous"``, or a client of the scheduler (argument or ``DASK_SCHEDULER_ADDRESS``)
    or of the embedded cluster. A malformed or forbidden address, or one that nothing listens
    at, fails at once (:func:`~kelr_dist.engine.cluster.check_address`)."""
    from kelr_dist.engine.cluster import check_address, get_client

    if scheduler == SYNCHRONOUS:
        return SYNCHRONOUS
    context = click.get_current_context(silent=True)
    if not (context is not None and (context.find_root().obj or {}).get("verbose")):
        _without_tracebacks(logging.getLogger("distributed"))
    check_address(scheduler, listening=True)
    return get_client(scheduler, n_workers=workers, memory_limit=memory_limit, quiet=quiet)


def _quiet_client(record: logging.LogRecord) -> bool:
    """Whether a Dask log record is shown without ``--verbose``: not one with a traceback, not
    one of the client's own (its lost connection: the command's error line says it)."""
    traceback = record.exc_info is not None or record.exc_text is not None
    return not traceback and not record.name.startswith("distributed.client")


def _without_tracebacks(logger: logging.Logger) -> None:
    """Filter ``logger``'s handlers with :func:`_quiet_client` (Dask's client logs a traceback
    and a line of its own when it loses its scheduler; ``kelr --verbose`` keeps them)."""
    for handler in logger.handlers:
        if _quiet_client not in handler.filters:
            handler.addFilter(_quiet_client)


def _describe(trajectory: Any) -> dict[str, Any]:
    from kelr_dist.data.store import describe_trajectory

    return describe_trajectory(trajectory)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _dt_text(summary: dict[str, Any]) -> str:
    """``0.05 (duration 999.95 per chain)``, with the unit where the store gives one:
    ``0.5 s (from datetime coordinates; 999.5 s per chain)``."""
    units = summary.get("time_units")
    if units is None:
        return f"{summary['dt']:.6g} (duration {summary['duration']:.6g} per chain)"
    return (
        f"{summary['dt']:.6g} {units} ({summary['time_units_source']}; "
        f"{summary['duration']:.6g} {units} per chain)"
    )


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
        ("dt", _dt_text(summary)),
        (
            "chunking",
            f"{summary['time_chunk']} samples per time chunk, {summary['n_blocks']} blocks",
        ),
        ("size", f"{_human_bytes(summary['bytes'])} ({summary['dtype']})"),
        ("origin", ", ".join(f"{k} {v}" for k, v in origin.items()) or "not recorded"),
    ]
    if params is not None:
        rows.append(("model params", json.dumps(params, sort_keys=True)))
    if summary["limits"]:
        rows.append(("estimate", "refused: " + "; ".join(summary["limits"])))
    return "\n".join(f"{label:<12}  {value}" for label, value in rows)


@main.command()
@click.argument("store", type=click.Path())
@click.option("--variable", default="x", show_default=True, help="Trajectory variable.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--scan",
    is_flag=True,
    help="Also read the data, block by block, verifying the chunks' checksums where the store "
    "has them, and report non-finite values (NaN, ±inf): how many per component and the first "
    "positions (chain, time index, component). Exit code 1 when there are any, 2 for a chunk "
    "that cannot be read or decoded (named with its chain and time range).",
)
def info(store: str, variable: str, as_json: bool, scan: bool) -> int:
    """Validate the trajectory STORE and print its summary.

    Shows dims, length, dt, chunking, size and where the data came from, from the metadata
    alone; a store that breaks the trajectory contract is reported with what is wrong (exit
    code 2). With --scan the data are read too (one block at a time, in this process; crc32c
    checksums verified where the store has them) and non-finite values are reported with
    their positions: exit code 1 when any are found, 0 when the data are finite; a damaged
    chunk (it cannot be decoded, or its checksum does not match) is named with its chain and
    time range, exit code 2. A result of 'kelr estimate' is named as such, with the
    command that reads it ('kelr report').

    \b
    Examples:
      kelr info tw.zarr
      kelr info tw.zarr --scan
      kelr info data.zarr --variable u --json
    """
    from kelr_dist.data.store import open_trajectory
    from kelr_dist.pipeline.result import result_attrs

    attrs = result_attrs(store)
    if attrs is not None:  # an output of 'kelr estimate', not a trajectory
        click.echo(_result_info(store, attrs, as_json))
        return 0
    trajectory = open_trajectory(store, variable)
    summary = _describe(trajectory)
    found = _scan(trajectory) if scan else None
    if as_json:
        if found is not None:
            summary["nonfinite"] = found
        click.echo(json.dumps(summary, default=str, indent=2))
    else:
        click.echo(_format_info(summary))
        if found is not None:
            click.echo(_format_scan(found))
    return 1 if found and found["count"] else 0


def _result_info(store: str, attrs: dict[str, Any], as_json: bool) -> str:
    """What ``kelr info`` says of a result (attributes ``attrs``): what it is, where it came
    from and the command that reads it."""
    report = f"kelr report {store}"
    if as_json:
        keys = ("estimator", "kelr_dist_version", "store", "created")
        summary = {"store": store, "result": True, "report": report}
        summary.update({k: attrs[k] for k in keys if k in attrs})
        return json.dumps(summary, default=str, indent=2)
    estimated = f"estimated from {attrs['store']} " if "store" in attrs else ""
    periodic = json.loads(attrs.get("periodic", "{}"))
    angles = ", ".join(f"{name} (period {entry['period']:.6g})" for name, entry in periodic.items())
    return (
        f"{store} is a kelr_dist result ({estimated}by {attrs.get('estimator', '?')}, "
        f"kelr_dist {attrs.get('kelr_dist_version', '?')}"
        + (f"; periodic components: {angles}" if angles else "")
        + f"), not a trajectory store: read it with '{report}'"
    )


def _scan(trajectory: Any) -> dict[str, Any]:
    """Non-finite values of ``trajectory`` (:mod:`kelr_dist.kernels.survey.scan` on the engine, in
    this process, one block at a time) as a JSON-ready dict."""
    from kelr_dist.data.store import checksums
    from kelr_dist.engine.passes import run_reduction
    from kelr_dist.kernels.survey.scan import nonfinite_reduction

    result = run_reduction(trajectory, nonfinite_reduction(), SYNCHRONOUS, progress=None)
    names = [str(c) for c in trajectory["component"].values]
    return {
        "checksums": checksums(trajectory.attrs["store"], str(trajectory.name)),
        "count": result.count,
        "by_component": dict(zip(names, map(int, result.by_component), strict=True)),
        "first": [
            {"chain": int(c), "time": int(t), "component": names[k], "value": str(v)}
            for (c, t, k), v in zip(result.positions, result.values, strict=True)
        ],
    }


def _format_scan(found: dict[str, Any]) -> str:
    """The ``kelr info --scan`` lines."""
    verified = f"{found['checksums']} checksums verified, " if found["checksums"] else ""
    if not found["count"]:
        return f"{'scan':<12}  {verified}all values finite"
    counts = ", ".join(f"{name} {n}" for name, n in found["by_component"].items())
    first = "; ".join(
        f"chain {p['chain']}, time {p['time']}, {p['component']} = {p['value']}"
        for p in found["first"]
    )
    shown = f"first {len(found['first'])}" if found["count"] > len(found["first"]) else "at"
    return (
        f"{'scan':<12}  {verified}{found['count']} non-finite values ({counts})\n"
        f"{shown:<12}  {first}"
    )


def _check_outputs(
    store: Path, targets: Sequence[Path | None], overwrite: bool, figures: Path | None
) -> None:
    """Refuse, before work, outputs that overlap the input ``store``, exist (without
    --overwrite; with it, unless they are an earlier result) or could not be written; and a
    figures folder in or around the store (it only gains PNG files, so it may exist)."""
    from kelr_dist.edges.plotting import require_matplotlib
    from kelr_dist.pipeline.result import check_apart, check_output

    for target in targets:
        if target is not None:
            check_output(target, overwrite, store)
    if figures is not None:
        check_apart(store, figures)
        require_matplotlib()


def _run_estimate(
    store: Path,
    options: EstimateOptions,
    cluster: ClusterOptions,
    *,
    result: Path,
    netcdf: Path | None,
    figures: Path | None,
    overwrite: bool,
    quiet: bool,
    job: str | None = None,
) -> None:
    """Validate the inputs, estimate on the chosen cluster, write the outputs, print where the
    result went and its headline numbers (``kelr report`` prints the whole summary).

    ``options`` are the validated keyword options of ``estimate_response``, ``cluster`` where
    it runs. Everything that can be checked from the metadata (outputs, the store, the options
    against its shape: :func:`~kelr_dist.pipeline.inputs.check_inputs`) is checked before a
    cluster starts, and named by the ``job`` file's name when there is one (``job.yaml: ...``,
    as its schema errors are); the outputs are written once the estimate is complete.
    """
    from kelr_dist.data.store import open_trajectory

    try:
        _check_outputs(store, [result, netcdf], overwrite, figures)
        # the store's metadata first, before the engine (distributed) is even imported
        open_trajectory(store, options.variable)
        from kelr_dist.pipeline.inputs import check_inputs

        check_inputs(store, options, name=cli_name if job is None else KEY_PATHS.__getitem__)
    except (ValueError, OSError) as err:
        if job is None:
            raise
        raise JobError(f"{job}: {err}") from None
    from kelr_dist.edges.report import headline, write_figures
    from kelr_dist.engine.cluster import close_embedded_cluster
    from kelr_dist.pipeline.estimate import estimate_response
    from kelr_dist.pipeline.result import write_result

    kwargs = options.values()
    client = _client(cluster.scheduler, cluster.workers, cluster.memory_limit, quiet)
    try:
        ds = estimate_response(store, client=client, progress=_progress(quiet), **kwargs)
    finally:
        if client != SYNCHRONOUS:
            client.close()
        close_embedded_cluster()
    write_result(ds, result, overwrite=overwrite, also=[netcdf] if netcdf is not None else [])
    click.echo(headline(ds, str(result)))  # the whole table is 'kelr report's
    if figures is not None:
        for path in write_figures(ds, figures):
            click.echo(f"wrote {path}")


@main.command()
@click.argument("store", type=click.Path())
@click.argument("out", type=click.Path())
@_options_from(EstimateOptions)
@_options_from(ClusterOptions)
@_options_from(FileOptions, only=("overwrite",))
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or cluster logs.")
def estimate(store: str, out: str, overwrite: bool, quiet: bool, **given: Any) -> None:
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
      kelr estimate user.zarr out.zarr --score mypackage.densities:score
      kelr estimate sst.zarr out.zarr --variable sst --forcing pattern=bump.nc:heating
    """
    _run_estimate(
        Path(store),
        _validated(EstimateOptions, given),
        _validated(ClusterOptions, given),
        result=Path(out),
        netcdf=None,
        figures=None,
        overwrite=overwrite,
        quiet=quiet,
    )


@main.command()
@click.argument("job_file", metavar="JOB.yaml", type=click.Path())
@_options_from(ClusterOptions, only=("scheduler",))
@_options_from(FileOptions, only=("overwrite",))
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or cluster logs.")
def run(job_file: str, scheduler: str | None, overwrite: bool, quiet: bool) -> None:
    """Run the estimate described by a job file (schema: kelr_dist.edges.jobfile).

    The file is validated completely first; relative paths are taken relative to its folder.
    --scheduler and --overwrite override the job's cluster section and outputs.overwrite.

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
    cluster = _validated(ClusterOptions, {"scheduler": scheduler}) if scheduler else job.cluster
    _run_estimate(
        job.store,
        job.options,
        cluster,
        result=job.result,
        netcdf=job.netcdf,
        figures=job.figures,
        overwrite=overwrite or job.files.overwrite,
        quiet=quiet,
        job=job.source.name,
    )


# the job-file schema, written from the options model, closes 'kelr run --help'
run.help = f"{inspect.cleandoc(run.help or '')}\n\n\b\nJob file schema:\n{schema_yaml()}"


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

    The table holds the chosen order, δ, the rejection rate, the run time, the basis, the
    warnings the estimate raised and the errors against the exact response when present (max
    over t <= 10 of |k - k_exact|, diagonal and off-diagonal). With --figures, PNG figures are
    written too.

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
