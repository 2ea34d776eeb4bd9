"""The ``kelr`` command line, run as a real process (``python -m kelr_dist.edges.cli``).

End to end: simulate -> info -> estimate (embedded 2-worker cluster) -> report, and a job file
with a user observable from a module on ``PYTHONPATH``; every documented bad input exits with
code 2, one line on stderr and no partial output.
"""

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from kelr_dist.models.simulate import simulate
from kelr_dist.pipeline.estimate import estimate_response

KELR = [sys.executable, "-m", "kelr_dist.edges.cli"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TIMEOUT = 300


def environment(**extra):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    return env


def kelr(*args, cwd, env=None):
    return subprocess.run(
        [*KELR, *map(str, args)],
        cwd=cwd,
        env=env or environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def leftovers(folder):
    """Temporary siblings an atomic write would leave behind."""
    return [p.name for p in Path(folder).iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_simulate_info_estimate_report(tmp_path):
    store, out, figures = tmp_path / "ou.zarr", tmp_path / "ou-response.zarr", tmp_path / "fig"
    run = kelr("simulate", "ou", store, "--samples", 20000, "--chunk", 5000, "--seed", 3,
               "--quiet", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "(1, 20000, 2)" in run.stdout

    run = kelr("info", store, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    for text in ("x1, x2", "20000 samples per chain x 1 chain(s)", "dt            0.05",
                 "5000 samples per time chunk, 4 blocks", "model ou, seed 3"):  # fmt: skip
        assert text in run.stdout

    run = kelr("estimate", store, out, "--max-order", 6, "--max-lag", 50, "--exact",
               "--workers", 2, "--quiet", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    # the headline only (the table is kelr report's): where it went, estimator, stderr, Stein
    assert run.stdout.splitlines()[0].split() == ["wrote", str(out)]
    for text in ("estimator", "max stderr", "Stein/stderr", f"kelr report {out}"):
        assert text in run.stdout, text
    assert "errors vs exact FDT" not in run.stdout and "rejection" not in run.stdout

    ds = xr.open_zarr(out, consolidated=False).load()
    for name in ("response", "response_stderr", "response_exact", "response_exact_stderr"):
        assert ds[name].dims == ("lag", "i", "j") and ds[name].shape == (51, 2, 2)
    for name in ("delta", "rejection", "eta", "eta_noise", "delta_paper", "rejection_paper"):
        assert ds[name].dims == ("order",)
    assert ds["coefficients"].dims == ("basis_function",)
    assert ds["multi_index"].dims == ("basis_function", "component")
    assert list(ds["i"].values) == ["x1", "x2"] and list(ds["j"].values) == ["x1", "x2"]
    np.testing.assert_allclose(ds["time"].values, 0.05 * np.arange(51))
    for key in ("order", "basis", "index_set", "delta", "rejection", "n_samples", "chains",
                "dt", "chunking", "kelr_dist_version", "store", "model", "model_params",
                "runtime_seconds", "max_lag", "created"):  # fmt: skip
        assert key in ds.attrs, key
    assert ds.attrs["n_samples"] == 20000 and ds.attrs["max_lag"] == 50
    assert ds.attrs["model"] == "ou"
    # the estimate agrees with the exact FDT on the same samples within its error bars
    error = np.abs(ds["response"] - ds["response_exact"]).max().item()
    assert error < 3 * ds["response_stderr"].max().item()

    run = kelr("report", out, "--figures", figures, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "order M" in run.stdout and "rejection" in run.stdout and "run time" in run.stdout
    assert "error bars" in run.stdout and "errors vs exact FDT" in run.stdout
    assert run.stdout.count("lag-0 Stein residual k(0)") == 1  # the summary, once
    # one order of the responses everywhere: the chosen estimate, the other, baselines, exact
    listed = next(line for line in run.stdout.splitlines() if line.startswith("responses"))
    names = listed.split(None, 1)[1].split(", ")
    assert names[0] == "response" and names[-1] == "response_exact"
    pngs = sorted(figures.glob("*.png"))
    assert [p.name for p in pngs] == [
        "criteria.png", "density.png", "response.png", "selection.png"
    ]  # fmt: skip
    for png in pngs:
        data = png.read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 20_000
    assert leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    simulate("ou", folder / "ou.zarr", 20000, chunk=5000, progress=False)
    return folder / "ou.zarr"


def test_job_file_with_a_user_observable(tmp_path, store):
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "kelr_cli_observables.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            def first_and_sum(x):
                return np.stack([x[:, 0], x[:, 0] + x[:, 1]], axis=1)
            """
        )
    )
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "job.yaml").write_text(
        textwrap.dedent(
            f"""
            input: {{store: {os.path.relpath(store, jobs)}}}
            basis: {{order: 4, max_order: 6}}
            observable: {{function: "kelr_cli_observables:first_and_sum", names: [first, sum]}}
            lags: {{max_lag: 20}}
            baselines: {{exact: true}}
            outputs: {{result: out/result.zarr, netcdf: out/result.nc, figures: out/figures}}
            cluster: {{workers: 1}}
            """
        )
    )
    run = kelr("run", "job.yaml", "--quiet", cwd=jobs, env=environment(PYTHONPATH=str(modules)))
    assert run.returncode == 0, run.stderr
    assert {p.name for p in (jobs / "out").iterdir()} == {"result.zarr", "result.nc", "figures"}
    assert len(list((jobs / "out" / "figures").glob("*.png"))) == 4
    result = xr.open_zarr(jobs / "out" / "result.zarr", consolidated=False).load()
    xr.testing.assert_identical(result, xr.load_dataset(jobs / "out" / "result.nc"))
    assert list(result["i"].values) == ["first", "sum"]
    assert result.attrs["order"] == 4

    # brute-force twin: the response is linear in A, so with A = x the rows combine to it
    twin = estimate_response(
        store, order=4, max_order=6, max_lag=20, exact=True, client="synchronous"
    )
    for name in ("response", "response_exact"):
        k = twin[name].values
        expected = np.stack([k[:, 0], k[:, 0] + k[:, 1]], axis=1)
        np.testing.assert_allclose(result[name].values, expected, rtol=1e-10, atol=1e-12)


def test_simulate_and_estimate_on_a_running_scheduler(tmp_path, dask_processes):
    """``--scheduler`` with real ``dask scheduler``/``dask worker`` processes: the same store
    and the same estimate as in this process."""
    store, out = tmp_path / "ou.zarr", tmp_path / "out.nc"
    run = kelr("simulate", "ou", store, "--samples", 4000, "--chunk", 1000, "--chains", 2,
               "--seed", 5, "--scheduler", dask_processes, "--quiet", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    twin = simulate("ou", tmp_path / "twin.zarr", 4000, chains=2, seed=5, chunk=1000)
    np.testing.assert_array_equal(xr.open_zarr(store, consolidated=False)["x"].values, twin)

    run = kelr("estimate", store, out, "--max-order", 4, "--max-lag", 10,
               "--scheduler", dask_processes, "--quiet", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    here = estimate_response(store, max_order=4, max_lag=10, client="synchronous")
    np.testing.assert_allclose(
        xr.load_dataset(out)["response"].values, here["response"].values, rtol=1e-10, atol=1e-13
    )


def broken_store(folder):
    path = folder / "broken.zarr"
    xr.Dataset({"x": (("a", "b"), np.zeros((10, 2)))}).to_zarr(path, consolidated=False)
    return path


def job_file(folder, text):
    path = folder / "job.yaml"
    path.write_text(textwrap.dedent(text))
    return path


# (name, set-up(folder, store) -> argv, expected message, outputs that must not exist)
DOCUMENTED_BAD_INPUTS = [
    (
        "missing store",
        lambda f, s: ["estimate", f / "missing.zarr", f / "out.zarr"],
        "the store does not exist",
        ["out.zarr"],
    ),
    (
        "broken store",
        lambda f, s: ["estimate", broken_store(f), f / "out.zarr", "--scheduler", "synchronous"],
        "dims ('a', 'b') found",
        ["out.zarr"],
    ),
    (
        "bad order",
        lambda f, s: ["estimate", s, f / "out.zarr", "--order", "sixty"],
        "--order: expected 'auto' or a non-negative integer",
        ["out.zarr"],
    ),
    (
        "max-lag with max-time",
        lambda f, s: ["estimate", s, f / "out.zarr", "--max-lag", 5, "--max-time", 1.0],
        "give --max-lag or --max-time, not both",
        ["out.zarr"],
    ),
    (
        "unreachable scheduler",
        lambda f, s: [
            "estimate",
            s,
            f / "out.zarr",
            "--scheduler",
            f"tcp://127.0.0.1:{free_port()}",
        ],
        "cannot reach the Dask scheduler",
        ["out.zarr"],
    ),
    (
        "bad job key",
        lambda f, s: [
            "run",
            job_file(
                f, f"input: {{store: {s}}}\nbasis: {{orders: 3}}\noutputs: {{result: out.zarr}}\n"
            ),
        ],
        "job.yaml: basis.orders: unknown key",
        ["out.zarr"],
    ),
]
# more bad inputs, run in this process through the same entry point (KelrGroup.main)
OTHER_BAD_INPUTS = [
    ("a score function that fails on the data (raised inside a pass)",
     lambda f, s: ["estimate", s, f / "out.zarr", "--score", "os:getcwd", "--scheduler",
                   "synchronous"],
     "getcwd failed on a block of shape", ["out.zarr"]),
    ("broken store info",
     lambda f, s: ["info", broken_store(f)], "dims ('a', 'b') found", []),
    ("basis for the wrong dimension (raised inside the estimate)",
     lambda f, s: ["estimate", s, f / "out.zarr", "--basis", "hermite", "--scheduler",
                   "synchronous"],
     "has 1 entries for 2 coordinates", ["out.zarr"]),
    ("existing output",
     lambda f, s: ["estimate", s, (f / "out.zarr").mkdir() or f / "out.zarr"],
     "exists; remove it, choose another path or pass --overwrite", []),
    ("bad job order",
     lambda f, s: ["run", job_file(f, f"input: {{store: {s}}}\nbasis: {{order: sixty}}\n"
                                      "outputs: {result: out.zarr}\n")],
     "job.yaml: basis.order: expected 'auto' or a non-negative integer", ["out.zarr"]),
    ("invalid YAML",
     lambda f, s: ["run", job_file(f, "input: {store: [x\n")], "not valid YAML", []),
    ("bad model parameter",
     lambda f, s: ["simulate", "ou", f / "new.zarr", "--samples", 100, "--param", "dt=-1"],
     "dt=-1", ["new.zarr"]),
    ("simulate onto a store with other settings",
     lambda f, s: ["simulate", "ou", s, "--samples", 100],
     "holds a generation with other settings (n_samples: store 20000, given 100", []),
    ("simulate --overwrite onto a folder that is not a store",
     lambda f, s: ["simulate", "ou", (f / "d").mkdir() or (f / "d" / "a").touch() or f / "d",
                   "--samples", 100, "--overwrite"],
     "is not a zarr store; refusing to overwrite it", []),
    ("a count that is not a whole number",
     lambda f, s: ["simulate", "ou", f / "new.zarr", "--samples", "2.5"],
     "Invalid value for '--samples': '2.5' is not a whole number (e.g. 100000 or 1e5)",
     ["new.zarr"]),
    ("unknown model",
     lambda f, s: ["simulate", "lorenz", f / "new.zarr", "--samples", 100],
     "Invalid value for 'MODEL'", ["new.zarr"]),
    ("missing result",
     lambda f, s: ["report", f / "nothing.zarr"], "does not exist", []),
    ("unknown estimator",
     lambda f, s: ["estimate", s, f / "out.zarr", "--estimator", "neural"],
     "--estimator: expected one of ['auto', 'kernel-embedding', 'score-matching']",
     ["out.zarr"]),
    ("a largest lag beyond the chains, named as the command line names it",
     lambda f, s: ["estimate", s, f / "out.zarr", "--max-lag", 100000],
     "--max-lag=100000 is more than a quarter of the chain length", ["out.zarr"]),
    ("score-matching degree too large for memory",
     lambda f, s: ["estimate", s, f / "out.zarr", "--degree", 3000, "--scheduler",
                   "synchronous"],
     "its Gram matrices need", ["out.zarr"]),
    ("too many folds for the samples",
     lambda f, s: ["estimate", s, f / "out.zarr", "--folds", 5000, "--scheduler", "synchronous"],
     "--folds: expected an integer from 2 to 20", ["out.zarr"]),
    ("max-time shorter than dt: no lag beyond 0",
     lambda f, s: ["estimate", s, f / "out.zarr", "--max-time", 0.01, "--scheduler",
                   "synchronous"],
     "--max-time=0.01 is shorter than the sample interval dt=0.05 of", ["out.zarr"]),
    ("a memory limit that is no memory size, refused by the options model",
     lambda f, s: ["estimate", s, f / "out.zarr", "--memory-limit", "lots"],
     "kelr estimate: error: --memory-limit: expected a memory size like '2GiB' or a positive "
     "number of bytes, got 'lots'", ["out.zarr"]),
    ("bad job estimator",
     lambda f, s: ["run", job_file(f, f"input: {{store: {s}}}\nestimator: {{method: knn}}\n"
                                      "outputs: {result: out.zarr}\n")],
     "job.yaml: estimator.method: expected one of", ["out.zarr"]),
]  # fmt: skip


def check_failure(code, stdout, stderr, folder, message, absent):
    assert code == 2, (stdout, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("kelr") and ": error: " in lines[0]
    assert message in lines[0]
    assert "Traceback" not in stderr
    for output in absent:
        assert not (folder / output).exists(), output
    assert leftovers(folder) == []


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory, store):
    """The documented bad inputs, run as processes at once: ``name -> (code, out, err, folder)``."""
    started = {}
    for name, argv, _, _ in DOCUMENTED_BAD_INPUTS:
        folder = tmp_path_factory.mktemp("bad")
        process = subprocess.Popen(
            [*KELR, *map(str, argv(folder, store))],
            cwd=folder,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started[name] = (process, folder)
    runs = {}
    for name, (process, folder) in started.items():
        stdout, stderr = process.communicate(timeout=TIMEOUT)
        runs[name] = (process.returncode, stdout, stderr, folder)
    return runs


@pytest.mark.parametrize(
    ("name", "message", "absent"), [(n, m, a) for n, _, m, a in DOCUMENTED_BAD_INPUTS]
)
def test_documented_bad_input_exits_2_with_one_line(bad_runs, name, message, absent):
    check_failure(*bad_runs[name], message, absent)


@pytest.mark.parametrize(("name", "argv", "message", "absent"), OTHER_BAD_INPUTS)
def test_other_bad_input_exits_2_with_one_line(
    tmp_path, store, capsys, monkeypatch, name, argv, message, absent
):
    from kelr_dist.edges.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main.main([str(a) for a in argv(tmp_path, store)], prog_name="kelr")
    captured = capsys.readouterr()
    check_failure(exit_info.value.code, captured.out, captured.err, tmp_path, message, absent)


def test_simulate_overwrite_replaces_a_store(tmp_path, capsys, monkeypatch):
    from kelr_dist.edges.cli import main

    monkeypatch.chdir(tmp_path)
    for argv in (["--samples", 300], ["--samples", 400, "--seed", 2, "--overwrite"]):
        with pytest.raises(SystemExit) as exit_info:
            main.main(["simulate", "ou", "s.zarr", "--chunk", 100, "-q", *map(str, argv)])
        assert exit_info.value.code == 0, capsys.readouterr().err
    assert "(1, 400, 2)" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]


def test_help_has_an_example_for_every_command(tmp_path):
    run = kelr("--help", cwd=tmp_path)
    assert run.returncode == 0
    for command in ("simulate", "info", "estimate", "run", "report"):
        assert command in run.stdout
    from kelr_dist.edges.cli import main

    for command in main.commands.values():
        assert "Example" in (command.help or ""), command.name


def test_unconverged_error_bars_are_one_warning_line(tmp_path, capsys, monkeypatch):
    from kelr_dist.edges.cli import main

    monkeypatch.chdir(tmp_path)
    simulate("ou", tmp_path / "short.zarr", 4000, chunk=2000, progress=False)
    argv = ["estimate", "short.zarr", "out.zarr", "--max-order", "4", "--max-lag", "1000",
            "--scheduler", "synchronous", "--quiet"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main.main(argv, prog_name="kelr")
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    warned = [line for line in captured.err.splitlines() if "did not converge" in line]
    assert len(warned) == 1 and warned[0].startswith("kelr: warning: the error bars of")
    assert "blocking NOT converged" in captured.out


def test_info_scan_reports_non_finite_values_with_their_positions(tmp_path, capsys, monkeypatch):
    from kelr_dist.edges.cli import main

    monkeypatch.chdir(tmp_path)
    data = np.random.default_rng(0).standard_normal((2, 3000, 2))
    data[1, 17, 1], data[0, 2500, 0] = np.nan, -np.inf
    data[1, 2000:2020, 0] = np.inf  # 20 more, beyond the first 10 shown
    names = np.array(["x", "v"], dtype=object)
    bad = xr.Dataset({"x": (("chain", "time", "component"), data)},
                     coords={"component": names}, attrs={"dt": 0.1})  # fmt: skip
    bad.chunk({"time": 1000}).to_zarr("bad.zarr", consolidated=False)
    clean = simulate("ou", tmp_path / "clean.zarr", 3000, chunk=1000, progress=False)
    assert clean.shape == (1, 3000, 2)
    codes = {}
    for argv in (["info", "bad.zarr", "--scan"], ["info", "clean.zarr", "--scan"],
                 ["info", "bad.zarr"]):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            main.main(argv, prog_name="kelr")
        codes[" ".join(argv)] = (exit_info.value.code, capsys.readouterr().out)
    code, out = codes["info bad.zarr --scan"]
    assert code == 1
    assert "22 non-finite values (x 21, v 1)" in out
    assert "first 10      chain 0, time 2500, x = -inf; chain 1, time 17, v = nan; " in out
    code, out = codes["info clean.zarr --scan"]
    assert code == 0 and "all values finite" in out
    code, out = codes["info bad.zarr"]
    assert code == 0 and "non-finite" not in out  # without --scan the data are not read


ESTIMATE_ONTO = ["--max-lag", "5", "--scheduler", "synchronous", "--overwrite"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["estimate", "ou.zarr", "./ou.zarr", *ESTIMATE_ONTO],
            "output 'ou.zarr' is the input store 'ou.zarr'",
        ),
        (
            ["estimate", "link.zarr", "ou.zarr", *ESTIMATE_ONTO],  # a symbolic link to the store
            "output 'ou.zarr' is the input store 'link.zarr'",
        ),
        (
            ["estimate", "ou.zarr", "ou.zarr/result.zarr", *ESTIMATE_ONTO],
            "output 'ou.zarr/result.zarr' lies inside the input store 'ou.zarr'",
        ),
        (
            ["estimate", "ou.zarr", ".", *ESTIMATE_ONTO],
            "output '.' contains the input store 'ou.zarr'",
        ),
        (
            ["run", "job.yaml", "--overwrite"],  # a job's netCDF output, inside the store
            "ou.zarr/r.nc' lies inside the input store",
        ),
    ],
)
def test_output_overlapping_the_input_store_is_refused(tmp_path, capsys, monkeypatch, argv,
                                                        message):  # fmt: skip
    """``kelr estimate S S --overwrite`` (and ``kelr run`` with such outputs) exits 2 naming
    both paths, before any work, and leaves the trajectory as it was."""
    from kelr_dist.edges.cli import main

    monkeypatch.chdir(tmp_path)
    simulate("ou", tmp_path / "ou.zarr", 3000, chunk=1000, progress=False)
    (tmp_path / "link.zarr").symlink_to(tmp_path / "ou.zarr")
    job_file(tmp_path, "input: {store: ou.zarr}\noutputs: {result: r.zarr, netcdf: ou.zarr/r.nc}\n")
    before = xr.open_zarr("ou.zarr", consolidated=False)["x"].values
    with pytest.raises(SystemExit) as exit_info:
        main.main(argv, prog_name="kelr")
    captured = capsys.readouterr()
    check_failure(exit_info.value.code, captured.out, captured.err, tmp_path, message, ["r.zarr"])
    np.testing.assert_array_equal(xr.open_zarr("ou.zarr", consolidated=False)["x"].values, before)


def test_overwrite_replaces_only_an_earlier_result_and_figures_stay_out_of_the_store(
    tmp_path, capsys, monkeypatch
):
    """--overwrite on a folder that is not a kelr result (a typo for OUT) exits 2 and leaves it
    whole; an earlier result is replaced; a job's figures folder inside the store is refused."""
    from kelr_dist.edges.cli import main

    monkeypatch.chdir(tmp_path)
    simulate("ou", tmp_path / "ou.zarr", 3000, chunk=1000, progress=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "precious.txt").write_text("keep me")
    with pytest.raises(SystemExit) as exit_info:
        main.main(["estimate", "ou.zarr", "other", *ESTIMATE_ONTO], prog_name="kelr")
    captured = capsys.readouterr()
    check_failure(
        exit_info.value.code, captured.out, captured.err, tmp_path,
        "output 'other' exists and is not a kelr_dist result", [],
    )  # fmt: skip
    assert (tmp_path / "other" / "precious.txt").read_text() == "keep me"
    argv = ["estimate", "ou.zarr", "r.zarr", "--max-lag", "5", "--scheduler", "synchronous", "-q"]
    for extra in ([], ["--overwrite"]):  # written, then replaced
        with pytest.raises(SystemExit) as exit_info:
            main.main([*argv, *extra], prog_name="kelr")
        captured = capsys.readouterr()
        assert exit_info.value.code == 0, captured.err
    job_file(tmp_path, "input: {store: ou.zarr}\noutputs: {result: r2.zarr, figures: ou.zarr}\n")
    with pytest.raises(SystemExit) as exit_info:
        main.main(["run", "job.yaml"], prog_name="kelr")
    captured = capsys.readouterr()
    check_failure(
        exit_info.value.code, captured.out, captured.err, tmp_path,
        "ou.zarr' is the input store", ["r2.zarr"],
    )  # fmt: skip
    assert not list((tmp_path / "ou.zarr").glob("*.png"))


def test_simulate_counts_in_scientific_notation(tmp_path, capsys, monkeypatch):
    from kelr_dist.edges.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main.main(["simulate", "ou", "s.zarr", "--samples", "2e3", "--chunk", "1_000", "-q"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    assert "(1, 2000, 2)" in captured.out and "1000 samples per time chunk" in captured.out


def test_documented_synopsis_lists_every_model():
    """The documentation's ``kelr simulate {...}`` names the models the command accepts, in
    order."""
    from kelr_dist.models.registry import MODEL_NAMES

    guide = Path(__file__).resolve().parents[1] / "docs" / "guide" / "cli.md"
    synopsis = re.search(r"^kelr simulate \{([^}]*)\}", guide.read_text(), flags=re.MULTILINE)
    assert synopsis is not None, "docs/guide/cli.md has no 'kelr simulate {MODEL,...}' synopsis"
    assert "".join(synopsis.group(1).split()).split(",") == list(MODEL_NAMES)


def test_info_on_a_result_points_to_kelr_report(tmp_path, capsys, monkeypatch):
    """``kelr info`` on a result of ``kelr estimate`` says so in one line and names the
    command that reads it (exit 0), instead of listing its variables as a bad trajectory."""
    from kelr_dist.edges.cli import main

    monkeypatch.chdir(tmp_path)
    result = xr.Dataset(
        {"response": (("lag", "i", "j"), np.zeros((3, 2, 2)))},
        attrs={"estimator": "score-matching", "kelr_dist_version": "0.1", "store": "ou.zarr"},
    )
    result.to_zarr("r.zarr", consolidated=False)
    outputs = {}
    for argv in (["info", "r.zarr"], ["info", "r.zarr", "--json"], ["info", "r.zarr", "--scan"]):
        with pytest.raises(SystemExit) as exit_info:
            main.main(argv, prog_name="kelr")
        captured = capsys.readouterr()
        assert exit_info.value.code == 0 and captured.err == "", captured.err
        outputs[" ".join(argv[2:])] = captured.out
    first = outputs[""].splitlines()[0]
    assert "r.zarr is a kelr_dist result" in first and "kelr report r.zarr" in first
    assert "response_stderr" not in outputs[""] and "variable" not in outputs[""]
    assert outputs["--scan"] == outputs[""]
    summary = json.loads(outputs["--json"])
    assert summary["result"] is True and summary["report"] == "kelr report r.zarr"
    assert summary["estimator"] == "score-matching"


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ("input: {store: missing.zarr}", "job.yaml: store '"),
        ("input: {store: STORE, variable: y}", "job.yaml: store '"),
        ("input: {store: STORE}\nlags: {max_lag: 100000}", "job.yaml: lags.max_lag=100000 is more"),
        ("input: {store: STORE}\nbasis: {spec: hermite}", "job.yaml: basis spec 'hermite' has"),
        ("input: {store: STORE}\nestimator: {folds: 5000}", "job.yaml: estimator.folds: expected"),
        ("input: {store: STORE}\nlags: {max_time: 0.01}", "job.yaml: lags.max_time=0.01 is"),
        ("input: {store: STORE}\noutputs: {result: exists}", "job.yaml: output '"),
        ('input: {store: STORE}\noutputs: {result: "r\\0.zarr"}', "job.yaml: outputs.result: "),
        ('input: {store: "s\\0.zarr"}', "job.yaml: input.store: "),
    ],
)
def test_every_job_file_error_starts_with_its_name(
    tmp_path, store, capsys, monkeypatch, job, message
):
    """Errors of a job's values against the files (the store, the outputs, the data's shape)
    are named by the job file as its schema errors are, and come before any cluster starts."""
    from kelr_dist.edges.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "exists").mkdir()
    text = job.replace("STORE", str(store))
    if "outputs" not in text:
        text += "\noutputs: {result: out.zarr}"
    job_file(tmp_path, text + "\ncluster: {scheduler: 'tcp://127.0.0.1:1'}\n")
    with pytest.raises(SystemExit) as exit_info:
        main.main(["run", "job.yaml"], prog_name="kelr")
    captured = capsys.readouterr()
    check_failure(exit_info.value.code, captured.out, captured.err, tmp_path, message, ["out.zarr"])
    assert captured.err.startswith(f"kelr run: error: {message}")


def test_an_unreadable_job_file_is_named_by_its_name(tmp_path, capsys):
    from kelr_dist.edges.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main.main(["run", str(tmp_path / "nothing.yaml")], prog_name="kelr")
    captured = capsys.readouterr()
    assert exit_info.value.code == 2
    assert captured.err.startswith("kelr run: error: nothing.yaml: cannot read the job file")


def test_info_labels_dt_from_datetime_coordinates_in_seconds(tmp_path, capsys, monkeypatch):
    from kelr_dist.edges.cli import main

    monkeypatch.chdir(tmp_path)
    time = np.datetime64("2000-01-01") + np.arange(2000) * np.timedelta64(500, "ms")
    data = np.random.default_rng(0).standard_normal((2000, 2))
    xr.Dataset({"x": (("time", "component"), data)}, coords={"time": time}).chunk(
        {"time": 500}
    ).to_zarr("dates.zarr", consolidated=False)
    with pytest.raises(SystemExit) as exit_info:
        main.main(["info", "dates.zarr"], prog_name="kelr")
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    dt = next(line for line in captured.out.splitlines() if line.startswith("dt "))
    assert dt.split(None, 1)[1] == "0.5 s (from datetime coordinates; 999.5 s per chain)"


def test_estimate_on_selected_components(tmp_path, store, capsys, monkeypatch):
    """--components estimates on the components named; an unknown one exits 2 naming it and
    the components the store has, before any cluster starts."""
    from kelr_dist.edges.cli import main

    monkeypatch.chdir(tmp_path)
    argv = ["estimate", str(store), "out.zarr", "--max-order", "4", "--max-lag", "5",
            "--scheduler", "synchronous", "-q"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main.main([*argv, "--components", "x2"], prog_name="kelr")
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    ds = xr.open_zarr(tmp_path / "out.zarr", consolidated=False)
    assert ds["i"].values.tolist() == ["x2"] and ds["component"].values.tolist() == ["x2"]
    with pytest.raises(SystemExit) as exit_info:
        main.main(["estimate", str(store), "out2.zarr", "--components", "x2,y"], prog_name="kelr")
    captured = capsys.readouterr()
    check_failure(
        exit_info.value.code, captured.out, captured.err, tmp_path,
        "--components: 'y' not in", ["out2.zarr"],
    )  # fmt: skip
    assert "available: x1, x2" in captured.err


def test_an_interrupt_stops_the_caller_too(tmp_path, capsys, monkeypatch):
    """Ctrl-C during a command called from Python (a script, this test run) is one line on
    stderr and a KeyboardInterrupt that stops the caller; it was a SystemExit(130), which a test
    run catches as a failed test and goes on."""
    import kelr_dist.data.store as store
    from kelr_dist.edges.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "open_trajectory", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(["info", str(tmp_path / "any.zarr")])
    assert capsys.readouterr().err.strip() == "kelr: interrupted"


def test_the_kelr_program_ends_by_the_interrupt(tmp_path):
    """A ``kelr`` process interrupted by SIGINT (a terminal's Ctrl-C) says so in one line and
    ends by SIGINT itself, so a shell loop or script running it stops as well."""
    import signal
    import time

    kelr = Path(sys.executable).parent / "kelr"
    store = tmp_path / "long.zarr"
    process = subprocess.Popen(
        [str(kelr), "simulate", "ou", str(store), "--samples", "1e9", "--quiet"],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not any(tmp_path.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.2)  # until the command runs (the store's temporary sibling appears)
        time.sleep(1.0)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == -signal.SIGINT, err
    assert err.strip().splitlines()[-1] == "kelr: interrupted", err


def test_info_on_a_netcdf_file_says_how_to_read_it(tmp_path):
    """A netCDF file is not a zarr store: ``kelr info`` says so in one line and how to read it
    (from Python, or converted once), exit code 2."""
    data = np.random.default_rng(0).standard_normal((2000, 2))
    xr.Dataset({"x": (("time", "component"), data)}).to_netcdf(tmp_path / "traj.nc")
    out = kelr("info", "traj.nc", cwd=tmp_path)
    assert out.returncode == 2
    message = out.stderr.strip()
    assert "\n" not in message and "a file, not a zarr store" in message
    assert "estimate_response(xarray.open_dataset(path))" in message and "to_zarr" in message
