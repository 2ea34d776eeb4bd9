"""Faults from inputs and outputs, with real processes and real files: small inputs that would
take unbounded work (nested YAML aliases, a store's metadata claiming 1e12 samples, deeply
nested JSON attributes), racing writers, damaged chunks, a job whose second output fails, and
a lost scheduler's noise.

Every command runs as a subprocess (``python -m kelr_dist.edges.cli``), timed and, where the
fault is memory, with its peak resident memory read from ``getrusage`` of that process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import xarray as xr
import zarr
from conftest import dask_processes_in
from distributed import Client
from numcodecs import Blosc
from zarr.codecs import BloscCodec

from kelr_dist import estimate_response
from kelr_dist.data.store import TrajectoryError, open_trajectory, store_fingerprint
from kelr_dist.engine.cluster import ClusterError, client_for
from kelr_dist.engine.passes import observe_graphs
from kelr_dist.models.simulate import simulate
from kelr_dist.pipeline.result import write_result

SAMPLES, CHUNK = 20_000, 5_000  # four chunks of one chain
FAST = ["--max-lag", "40", "--max-order", "20", "--scheduler", "synchronous", "--quiet"]
ENV = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def kelr(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """``kelr ARGS`` in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "kelr_dist.edges.cli", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env=ENV, **kwargs,
    )  # fmt: skip


def one_error_line(run: subprocess.CompletedProcess, command: str) -> str:
    """The one line a refused command prints (exit 2, nothing else on stderr but the
    estimate's own warnings)."""
    assert run.returncode == 2, run.stdout + run.stderr
    lines = [s for s in run.stderr.strip().splitlines() if not s.startswith("kelr: warning: ")]
    assert len(lines) == 1 and lines[0].startswith(f"kelr {command}: error: "), run.stderr
    return lines[0]


def measured(code: str, *args: str, timeout: float = 120) -> dict:
    """Run ``code`` in a fresh interpreter; it imports what it needs, calls ``started()`` and
    then sets ``out`` (a dict), which comes back with the seconds and the growth of the
    process's peak resident memory from ``started()`` on (``seconds``, ``grew_mib``) and its
    peak resident memory (``peak_mib``, the imports included)."""
    script = (
        textwrap.dedent(
            """
        import json, resource, time
        def peak():
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        def started():
            global at, before
            at, before = time.perf_counter(), peak()
        """
        )
        + textwrap.dedent(code)
        + textwrap.dedent(
            """
        out.update(seconds=time.perf_counter() - at, grew_mib=peak() - before, peak_mib=peak())
        print(json.dumps(out))
        """
        )
    )
    run = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True, text=True, timeout=timeout, env=ENV,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A generated store (written with crc32c checksums)."""
    path = tmp_path_factory.mktemp("inputs") / "ou.zarr"
    simulate("ou", path, SAMPLES, chunk=CHUNK, seed=3, progress=False)
    return path


@pytest.fixture(scope="module")
def result(store) -> xr.Dataset:
    return estimate_response(store, client="synchronous", max_lag=40, max_order=20,
                             progress=False)  # fmt: skip


# --------------------------------------------------------------------------------------------
# job files: YAML aliases and long values
# --------------------------------------------------------------------------------------------


def laughs(key: str, levels: int = 9) -> str:
    """A job file whose ``key`` (``section.key``) is 9^levels strings, written in ~600 bytes."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * 9)}]" for k in range(1, levels + 1)]
    section, name = key.split(".")
    body = {"input": "store: s.zarr", "outputs": "result: r.zarr"}
    body[section] = f"{name}: *l{levels}" + (f", {body[section]}" if section in body else "")
    return "\n".join(lines + [f"{s}: {{{v}}}" for s, v in body.items()]) + "\n"


@pytest.mark.parametrize("key", ["basis.order", "input.components", "observable.names"])
def test_billion_laughs_job_file_is_refused_in_2_s_and_200_mib(key, tmp_path) -> None:
    job = tmp_path / "laughs.yaml"
    job.write_text(laughs(key))
    assert job.stat().st_size < 700
    found = measured(
        """
        import sys
        # the unbounded expansion this guards against would otherwise take the machine
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
        from kelr_dist.edges.jobfile import JobError, load_job
        started()
        try:
            load_job(sys.argv[1])
            out = {"message": None}
        except (JobError, MemoryError) as err:
            out = {"message": f"{type(err).__name__}: {err}"}
        """,
        str(job),
    )
    assert found["message"] is not None and found["message"].startswith("JobError: laughs.yaml:")
    assert "aliases (*l0) are not allowed" in found["message"]
    assert found["seconds"] < 2 and found["grew_mib"] < 200, found
    line = one_error_line(kelr("run", job), "run")  # the command says the same, on one line
    assert "laughs.yaml: not valid YAML at line 2" in line and len(line) < 200


def test_a_long_bad_value_is_quoted_short(tmp_path) -> None:
    job = tmp_path / "long.yaml"
    names = ", ".join(f"[name{k}, [deeper, [{k}]]]" for k in range(20_000))
    job.write_text(
        f"input: {{store: s.zarr, components: [{names}]}}\noutputs: {{result: r.zarr}}\n"
    )
    line = one_error_line(kelr("run", job), "run")
    assert "input.components: expected component names" in line
    assert len(line) < 300, len(line)


@pytest.mark.parametrize("levels", [900, 10_000])
def test_deeply_nested_yaml_is_one_line_naming_the_depth(levels, tmp_path) -> None:
    deep = "[" * levels + "]" * levels
    job = tmp_path / "deep.yaml"
    job.write_text(
        f"input: {{store: s.zarr}}\noutputs: {{result: r.zarr}}\nbasis: {{order: {deep}}}\n"
    )
    line = one_error_line(kelr("run", job), "run")
    assert "deep.yaml: not valid YAML at line 3" in line
    assert "nested deeper than 64 levels" in line and len(line) < 200
    line = one_error_line(kelr("simulate", "ou", tmp_path / "s.zarr", "--param", f"gamma={deep}"),
                          "simulate")  # fmt: skip
    assert "cannot read the value of 'gamma=[[[" in line and len(line) < 300
    assert not (tmp_path / "s.zarr").exists()


def test_a_5_mb_store_path_is_quoted_in_120_characters(tmp_path) -> None:
    job = tmp_path / "long.yaml"
    job.write_text(f"input: {{store: {'s' * 5 * 2**20}}}\noutputs: {{result: r.zarr}}\n")
    line = one_error_line(kelr("run", job), "run")
    assert "long.yaml:" in line and "sss..." in line
    assert max(map(len, line.split())) <= 120 and len(line) < 300, len(line)
    line = one_error_line(kelr("info", tmp_path / ("p" * 300)), "info")
    assert max(map(len, line.split())) <= 120, line


def test_aliases_in_a_model_parameter_are_refused(tmp_path) -> None:
    run = kelr("simulate", "ou", tmp_path / "s.zarr", "--samples", "1000",
               "--param", "gamma=[&a [1, 0], *a]")  # fmt: skip
    line = one_error_line(run, "simulate")
    assert "cannot read the value of 'gamma=" in line
    assert not (tmp_path / "s.zarr").exists()


# --------------------------------------------------------------------------------------------
# store metadata that does not match the data
# --------------------------------------------------------------------------------------------


def edit_shape(path: Path, axis: int, length: int) -> None:
    """Set ``x``'s shape along ``axis`` in its ``zarr.json`` and in the consolidated copy."""
    array = path / "x" / "zarr.json"
    meta = json.loads(array.read_text())
    meta["shape"][axis] = length
    array.write_text(json.dumps(meta))
    root = path / "zarr.json"
    meta = json.loads(root.read_text())
    meta["consolidated_metadata"]["metadata"]["x"]["shape"][axis] = length
    root.write_text(json.dumps(meta))


def test_metadata_shape_of_1e12_samples_is_refused_in_5_s(store, tmp_path) -> None:
    claimed = tmp_path / "claimed.zarr"
    shutil.copytree(store, claimed)
    edit_shape(claimed, 1, 10**12)
    found = measured(
        """
        import sys
        from kelr_dist.data.store import TrajectoryError, open_trajectory
        started()
        try:
            open_trajectory(sys.argv[1])
            out = {"message": None}
        except TrajectoryError as err:
            out = {"message": str(err)}
        """,
        str(claimed),
    )
    assert found["seconds"] < 5 and found["grew_mib"] < 200, found
    expected = (
        f"store '{claimed}', variable 'x': the metadata says shape (1, 1000000000000, 2) "
        "(200000000 chunks of 5000 along 'time'), but its chunk files end at chunk 3 along "
        "'time' (entry 20000): the metadata (zarr.json) does not match the data"
    )
    assert found["message"].startswith(expected), found
    for command in (["info", claimed], ["estimate", claimed, tmp_path / "out.zarr", *FAST]):
        started = time.monotonic()
        line = one_error_line(kelr(*command, timeout=60), command[0])
        assert expected in line and time.monotonic() - started < 60
    assert not (tmp_path / "out.zarr").exists()


def test_shape_edited_only_in_the_array_metadata_of_a_consolidated_store(store, tmp_path) -> None:
    edited = tmp_path / "edited.zarr"
    shutil.copytree(store, edited)
    assert "consolidated_metadata" in json.loads((edited / "zarr.json").read_text())
    array = edited / "x" / "zarr.json"  # the copy the data are read through, not the root's
    meta = json.loads(array.read_text())
    meta["shape"][1] = 10**12
    array.write_text(json.dumps(meta))
    expected = (
        f"store '{edited}', variable 'x': its metadata say shape (1, {10**12}, 2), but the "
        f"store's consolidated metadata say (1, {SAMPLES}, 2)"
    )
    for command in (["info", edited], ["estimate", edited, tmp_path / "out.zarr", *FAST]):
        started = time.monotonic()
        line = one_error_line(kelr(*command, timeout=60), command[0])
        assert expected in line and time.monotonic() - started < 60


REFUSED_BEFORE_THE_ENGINE = """
    import json, sys
    from kelr_dist.edges.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit as end:
        print(json.dumps({"code": end.code, "distributed": "distributed" in sys.modules}))
"""


@pytest.mark.parametrize("command", ["info", "estimate", "run"])
def test_metadata_refusal_comes_before_the_engine_is_imported(command, store, tmp_path) -> None:
    """A store its metadata alone refuses is refused by the CLI before distributed is imported,
    so before any cluster could start (the embedded one by default here)."""
    claimed = tmp_path / "claimed.zarr"
    shutil.copytree(store, claimed)
    edit_shape(claimed, 1, 10**12)
    job = tmp_path / "job.yaml"
    job.write_text(f"input: {{store: {claimed}}}\noutputs: {{result: out.zarr}}\n")
    args = {"info": [claimed], "estimate": [claimed, tmp_path / "out.zarr"], "run": [job]}
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(REFUSED_BEFORE_THE_ENGINE), command,
         *map(str, args[command])],
        capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert json.loads(run.stdout) == {"code": 2, "distributed": False}, run.stderr
    assert "the metadata says shape (1, 1000000000000, 2)" in run.stderr
    assert not (tmp_path / "out.zarr").exists()


def test_generated_store_whose_n_samples_disagrees_with_its_shape(store, tmp_path) -> None:
    shorter = tmp_path / "shorter.zarr"
    shutil.copytree(store, shorter)
    edit_shape(shorter, 1, SAMPLES - CHUNK)  # the shape is within the chunk files...
    line = one_error_line(kelr("info", shorter), "info")  # ...but not what the store says
    assert (
        f"store '{shorter}', variable 'x': the store's attribute n_samples={SAMPLES} disagrees "
        f"with its shape (1, {SAMPLES - CHUNK}, 2) ('time': {SAMPLES - CHUNK})"
    ) in line


# --------------------------------------------------------------------------------------------
# damaged chunks: named, with exit 2
# --------------------------------------------------------------------------------------------


def truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def zero_length(data: bytes) -> bytes:
    return b""


def flipped_bit(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0x08  # inside the compressed samples: blosc would decode it
    return bytes(damaged)


@pytest.mark.parametrize("damage", [truncated, zero_length, flipped_bit])
def test_damaged_chunk_is_named_with_exit_2(damage, store, tmp_path) -> None:
    damaged = tmp_path / "damaged.zarr"
    shutil.copytree(store, damaged)
    chunk = damaged / "x" / "c" / "0" / "2" / "0"
    chunk.write_bytes(damage(chunk.read_bytes()))
    where = (
        f"store '{damaged}', variable 'x': a damaged chunk at chain 0, time 10000-14999 "
        "(stored chunk 2) cannot be read"
    )
    scan = one_error_line(kelr("info", damaged, "--scan"), "info")
    assert where in scan, scan
    if damage is flipped_bit:
        assert "checksum do not match" in scan
    out = tmp_path / "out.zarr"
    line = one_error_line(kelr("estimate", damaged, out, *FAST), "estimate")
    assert where in line, line
    assert not out.exists()


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_truncated_chunk_without_checksum_is_named_not_a_crash(zarr_format, store, tmp_path):
    plain = tmp_path / "plain.zarr"  # Blosc, no checksum after it
    ds = xr.open_zarr(store, consolidated=False)
    for name in ds.variables:
        ds[name].encoding.clear()
    blosc = (
        BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")
        if zarr_format == 3
        else Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE)
    )
    ds.chunk({"time": CHUNK}).to_zarr(
        plain, encoding={"x": {"compressors": (blosc,)}}, zarr_format=zarr_format,
        consolidated=False,
    )  # fmt: skip
    chunk = plain / "x" / ("c/0/2/0" if zarr_format == 3 else "0.2.0")
    chunk.write_bytes(truncated(chunk.read_bytes()))
    where = (
        f"store '{plain}', variable 'x': a damaged chunk at chain 0, time 10000-14999 "
        "(stored chunk 2) cannot be read (TruncatedFrame: chunk file"
    )
    advice = "rewrite the store with a checksum (crc32c, as kelr simulate writes)"
    for _ in range(2):  # a crash came about one read in four
        line = one_error_line(kelr("info", plain, "--scan"), "info")
        assert where in line and advice in line, line
    out = tmp_path / "out.zarr"
    line = one_error_line(kelr("estimate", plain, out, *FAST), "estimate")
    assert where in line and advice in line, line


def test_a_deleted_chunk_in_the_middle_is_named_with_exit_2(store, tmp_path) -> None:
    holed = tmp_path / "holed.zarr"
    shutil.copytree(store, holed)
    (holed / "x" / "c" / "0" / "1" / "0").unlink()  # the second of four: not the last
    where = (
        f"store '{holed}', variable 'x': 1 of its 4 chunk files are missing, the first "
        f"'x/c/0/1/0' (chain 0, time {CHUNK}-{2 * CHUNK - 1}, component 0-1)"
    )
    assert where in one_error_line(kelr("info", holed, "--scan"), "info")
    out = tmp_path / "out.zarr"
    assert where in one_error_line(kelr("estimate", holed, out, *FAST), "estimate")
    assert not out.exists()


def test_a_store_rewritten_between_two_passes_is_refused(store, tmp_path) -> None:
    rewritten = tmp_path / "rewritten.zarr"
    shutil.copytree(store, rewritten)
    sent = []

    def rewrite_after_the_first_pass(graph) -> None:
        sent.append(graph)
        if len(sent) == 2:  # the second pass is sent: the first read the store as opened
            run = kelr("simulate", "ou", rewritten, "--samples", SAMPLES, "--chunk", CHUNK,
                       "--seed", "4", "--overwrite", "--quiet")  # fmt: skip
            assert run.returncode == 0, run.stderr

    with observe_graphs(rewrite_after_the_first_pass), pytest.raises(TrajectoryError) as err:
        estimate_response(rewritten, client="synchronous", max_lag=40, max_order=20,
                          progress=False)  # fmt: skip
    message = str(err.value)
    assert message.startswith(f"store '{rewritten}', variable 'x': the store changed while it")
    assert "a result would mix two datasets" in message and "\n" not in message
    assert len(sent) == 2  # refused at the end of the pass that read it changed


def test_the_store_fingerprint_is_in_the_result(store, result) -> None:
    fingerprint = result.attrs["store_fingerprint"]
    assert re.fullmatch("[0-9a-f]{32}", fingerprint)
    assert fingerprint == store_fingerprint(str(store), "x")
    assert open_trajectory(store).attrs["store_fingerprint"] == fingerprint


def test_scan_of_an_intact_store_says_it_verified_checksums(store) -> None:
    run = kelr("info", store, "--scan")
    assert run.returncode == 0, run.stderr
    assert "scan          crc32c checksums verified, all values finite" in run.stdout
    codecs = json.loads((store / "x" / "zarr.json").read_text())["codecs"]
    assert [c["name"] for c in codecs] == ["bytes", "blosc", "crc32c"]


def test_damaged_chunk_on_the_embedded_cluster(store, tmp_path) -> None:
    damaged = tmp_path / "damaged.zarr"
    shutil.copytree(store, damaged)
    chunk = damaged / "x" / "c" / "0" / "1" / "0"
    chunk.write_bytes(flipped_bit(chunk.read_bytes()))
    run = kelr("estimate", damaged, tmp_path / "out.zarr", "--max-lag", "40", "--workers", "1",
               "--quiet")  # fmt: skip
    line = one_error_line(run, "estimate")
    assert (
        f"of store '{damaged}' on worker tcp://127.0.0.1:" in line
        and "a damaged chunk at chain 0, time 5000-9999 (stored chunk 1) cannot be read" in line
    ), line


# --------------------------------------------------------------------------------------------
# deeply nested JSON attributes
# --------------------------------------------------------------------------------------------

NESTED = "[" * 100_000 + "]" * 100_000


def test_a_10_mb_model_attribute_is_neither_copied_nor_printed_whole(store, tmp_path) -> None:
    huge = tmp_path / "huge.zarr"
    shutil.copytree(store, huge)
    zarr.open_group(huge, mode="r+", use_consolidated=False).attrs["model"] = "m" * 10 * 2**20
    info = kelr("info", huge)
    assert info.returncode == 0, info.stderr
    assert len(info.stdout) < 10_000 and "(cut: 10485760 characters)" in info.stdout
    out = tmp_path / "out.zarr"
    run = kelr("estimate", huge, out, *FAST)
    assert run.returncode == 0, run.stderr
    model = xr.open_zarr(out, consolidated=False).attrs["model"]
    assert model.startswith("mmm") and model.endswith("... (cut: 10485760 characters)")
    assert len(model) < 3000
    report = kelr("report", out)
    assert report.returncode == 0, report.stderr
    assert len(report.stdout) < 10_000 and "mmm..." in report.stdout


def one_array_forcing(x):
    """A forcing that forgets its divergence: returns c only."""
    return x.copy()


def test_a_forcing_that_returns_one_array_is_named(store) -> None:
    with pytest.raises(ValueError) as err:
        estimate_response(store, forcing=one_array_forcing, client="synchronous", max_lag=40,
                          max_order=20, progress=False)  # fmt: skip
    message = str(err.value)
    assert message.startswith(
        "the forcing test_faults_inputs:one_array_forcing returned one ndarray of shape ("
    ), message
    assert "a forcing returns a pair (c, dc)" in message and "\n" not in message


def test_nested_model_params_in_a_store(store, tmp_path) -> None:
    nested = tmp_path / "nested.zarr"
    shutil.copytree(store, nested)
    zarr.open_group(nested, mode="r+").attrs["model_params"] = NESTED
    run = kelr("info", nested)
    assert run.returncode == 0, run.stderr
    assert (
        'model params  "model_params: JSON nested deeper than 32 levels (200000 characters), '
        'not read"'
    ) in run.stdout


def test_nested_model_params_in_a_result(result, tmp_path) -> None:
    path = tmp_path / "nested-result.zarr"
    write_result(result.assign_attrs(model_params=NESTED), path)
    assert kelr("info", path).returncode == 0
    figures = tmp_path / "figures"
    run = kelr("report", path, "--figures", figures)
    assert run.returncode == 0, run.stderr
    assert sorted(p.suffix for p in figures.iterdir()) and all(
        p.suffix == ".png" for p in figures.iterdir()
    )


# --------------------------------------------------------------------------------------------
# writers: one wins, all or nothing, stale temporaries
# --------------------------------------------------------------------------------------------

WRITER = """
    import sys, time
    import xarray as xr
    from kelr_dist.pipeline.result import write_result
    ds = xr.open_zarr(sys.argv[1], consolidated=False).load().assign_attrs(writer=sys.argv[3])
    open(sys.argv[5], "w").close()  # ready
    while not __import__("os").path.exists(sys.argv[4]):  # both start writing together
        time.sleep(0.001)
    try:
        write_result(ds, sys.argv[2])
    except FileExistsError as err:
        print(err)
        sys.exit(2)
"""


def test_two_concurrent_write_result_one_exits_2(result, tmp_path) -> None:
    source = tmp_path / "source.zarr"
    write_result(result, source)
    for trial in range(3):
        out, go = tmp_path / f"out-{trial}.zarr", tmp_path / f"go-{trial}"
        ready = [tmp_path / f"ready-{trial}-{name}" for name in "ab"]
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(WRITER), source, out, name, go, flag],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=ENV,
            )  # fmt: skip
            for name, flag in zip("ab", ready, strict=True)
        ]
        deadline = time.monotonic() + 120
        while not all(flag.exists() for flag in ready):  # both loaded and waiting
            assert time.monotonic() < deadline and all(w.poll() is None for w in writers)
            time.sleep(0.05)
        go.touch()
        runs = [(w.wait(timeout=120), *w.communicate()) for w in writers]
        codes = sorted(code for code, _, _ in runs)
        assert codes == [0, 2], runs
        loser = next(stdout for code, stdout, _ in runs if code == 2)
        winner = "ab"[[code for code, _, _ in runs].index(0)]
        assert f"output '{out}' was created by another writer while this one was writing" in loser
        assert xr.open_zarr(out, consolidated=False).attrs["writer"] == winner
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_two_concurrent_kelr_estimate_one_exits_2(store, tmp_path) -> None:
    out = tmp_path / "out.zarr"
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "kelr_dist.edges.cli", "estimate", store, out, *FAST],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )  # fmt: skip
        for _ in range(2)
    ]
    done = [(r.wait(timeout=600), *r.communicate()) for r in runs]
    assert sorted(code for code, _, _ in done) == [0, 2], done
    loser = next(stderr for code, _, stderr in done if code == 2)
    assert len(loser.strip().splitlines()) == 1 and str(out) in loser, loser
    assert xr.open_zarr(out, consolidated=False)["response"].shape[0] == 41
    assert [p.name for p in tmp_path.iterdir()] == ["out.zarr"]


def test_stale_temporary_of_a_killed_writer_is_removed(result, tmp_path) -> None:
    out = tmp_path / "out.zarr"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    stale = tmp_path / f".out.zarr.tmp-{gone.pid}@{host}-0123abcd"
    running = tmp_path / f".out.zarr.tmp-{os.getppid()}@{host}-4567cdef"  # its writer runs
    elsewhere = tmp_path / f".out.zarr.tmp-{gone.pid}@another-host-89abcdef"
    for folder in (stale, running, elsewhere):
        folder.mkdir()
        (folder / "zarr.json").write_text("{}")
    write_result(result, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["out.zarr", running.name, elsewhere.name]
    )


LIMITED_RUN = """
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    from kelr_dist.edges.cli import main
    main(sys.argv[2:])
"""


def test_job_whose_second_output_fails_leaves_nothing(store, result, tmp_path) -> None:
    probe = tmp_path / "probe"
    write_result(result, probe / "r.zarr", also=[probe / "r.nc"])
    largest = max(p.stat().st_size for p in (probe / "r.zarr").rglob("*") if p.is_file())
    assert (probe / "r.nc").stat().st_size > largest + 4096  # the netCDF file cannot fit
    job = tmp_path / "job.yaml"
    job.write_text(
        f"input: {{store: {store}}}\nlags: {{max_lag: 40}}\nbasis: {{max_order: 20}}\n"
        "outputs: {result: r.zarr, netcdf: r.nc}\ncluster: {scheduler: synchronous}\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LIMITED_RUN), str(largest + 4096), "run", job,
         "--quiet"],
        capture_output=True, text=True, timeout=600, env=ENV,
    )  # fmt: skip
    line = one_error_line(run, "run")
    assert f"(writing {tmp_path / 'r.nc'})" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml", "probe"]  # nothing left
    rerun = kelr("run", job, "--quiet")  # not refused with "exists"
    assert rerun.returncode == 0, rerun.stderr
    assert (tmp_path / "r.zarr").is_dir() and (tmp_path / "r.nc").is_file()


# --------------------------------------------------------------------------------------------
# a lost scheduler: one line, Dask's traceback only with --verbose
# --------------------------------------------------------------------------------------------


def scheduler_pid(address: str) -> int:
    """The process id of the ``dask scheduler`` listening at ``address``
    (:func:`conftest.dask_processes_in`)."""
    return next(
        int(line.split()[0])
        for line in subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True,
                                   text=True).stdout.splitlines()
        if f"--port {address.rsplit(':', 1)[1]}" in line and "scheduler" in line
    )  # fmt: skip


@pytest.mark.parametrize("verbose", [False, True])
def test_lost_scheduler_is_one_line(verbose, tmp_path) -> None:
    store = tmp_path / "long.zarr"
    simulate("ou", store, 400_000, chunk=20_000, progress=False)
    with dask_processes_in(tmp_path, workers=1) as address:
        scheduler_log = tmp_path / "scheduler-0.log"
        deadline = time.monotonic() + 120
        while "Registered to" not in (tmp_path / "worker-1.log").read_text():
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.5)
        command = ["estimate", store, tmp_path / "out.zarr", "--scheduler", address, "--quiet"]
        job = subprocess.Popen(
            [sys.executable, "-m", "kelr_dist.edges.cli", *(["--verbose"] if verbose else []),
             *map(str, command)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
        )  # fmt: skip
        while "Receive client connection" not in scheduler_log.read_text():
            assert time.monotonic() < deadline and job.poll() is None, "the client did not connect"
            time.sleep(0.2)
        time.sleep(3)  # a pass under way
        killed = time.monotonic()
        os.kill(scheduler_pid(address), signal.SIGKILL)
        _, stderr = job.communicate(timeout=120)
        seconds = time.monotonic() - killed
    assert job.returncode == 2, stderr
    assert re.search(r"lost the connection to the Dask scheduler at tcp://127\.0\.0\.1:\d+",
                     stderr)  # fmt: skip
    lines = stderr.strip().splitlines()
    if verbose:  # Dask's own lines (the reconnection, with a traceback when it was cancelled)
        assert "- distributed.client - ERROR - " in stderr
    else:
        assert len(lines) == 1 and lines[0].startswith("kelr estimate: error: "), stderr
    assert seconds < 60


@pytest.mark.parametrize("request_", ["nthreads", "run", "scatter"])
def test_lost_scheduler_between_passes_is_one_error(request_, tmp_path) -> None:
    """A request to a scheduler killed a moment before (between two passes) fails at once
    with distributed's ``CommClosedError`` while the client still says it is running: inside
    ``client_for`` it is the same one error as in a pass."""
    with dask_processes_in(tmp_path, workers=1) as address:
        client = Client(address, timeout=10, set_as_default=False)
        try:
            client.wait_for_workers(1, timeout=120)
            os.kill(scheduler_pid(address), signal.SIGKILL)
            ask = {
                "nthreads": client.nthreads,
                "run": lambda: client.run(os.getpid),
                "scatter": lambda: client.scatter([1.0], hash=False),
            }[request_]
            lost = rf"lost the connection to the Dask scheduler at {re.escape(address)} "
            with pytest.raises(ClusterError, match=lost), client_for(client):
                ask()
        finally:
            client.close(timeout=5)
