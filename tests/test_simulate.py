"""Chunked generation: brute-force twin, real kill-and-resume, same store on 1 or 2 workers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster

from kelr_dist import __version__
from kelr_dist.data.store import TrajectoryError, open_trajectory, read_progress
from kelr_dist.models.registry import make_model
from kelr_dist.models.simulate import simulate

N, CHAINS, CHUNK, BURN_IN, SEED = 3000, 2, 1000, 1500, 11


def _in_memory(n: int, chains: int, seed: int, burn_in: int) -> np.ndarray:
    """The brute-force twin: each chain's stream advanced in one call, burn-in in another."""
    model = make_model("ou")
    out = []
    for child in np.random.SeedSequence(seed).spawn(chains):
        rng = np.random.Generator(np.random.PCG64(child))
        _, state = model.advance(model.initial_state(rng), burn_in, rng)
        out.append(model.advance(state, n, rng)[0])
    return np.stack(out)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    path = tmp_path_factory.mktemp("ref") / "ref.zarr"
    da = simulate("ou", path, N, chains=CHAINS, seed=SEED, chunk=CHUNK, burn_in=BURN_IN)
    return da.values


def test_store_matches_the_uninterrupted_in_memory_run(tmp_path: Path, reference: np.ndarray):
    np.testing.assert_array_equal(reference, _in_memory(N, CHAINS, SEED, BURN_IN))
    assert not np.array_equal(reference[0], reference[1])  # chains have their own streams
    model = make_model("ou")
    da = simulate(model, tmp_path / "s.zarr", 2500, seed=3, chunk=700)
    assert da.dims == ("chain", "time", "component") and da.shape == (1, 2500, 2)
    assert da.chunks == ((1,), (700, 700, 700, 400), (2,))
    assert da.dtype == np.float64
    assert da.attrs["dt"] == model.dt
    assert da.attrs["model"] == "ou" and da.attrs["seed"] == 3 and da.attrs["burn_in"] == 0
    assert json.loads(da.attrs["model_params"]) == model.params()
    assert da.attrs["kelr_dist_version"] == __version__
    assert da.coords["component"].values.tolist() == list(model.components)
    np.testing.assert_array_equal(da.values, _in_memory(2500, 1, 3, 0))


CHILD = """
import os, signal, sys
from kelr_dist.models.registry import make_model
from kelr_dist.models.simulate import simulate


class DiesInAdvance:
    '''The OU model, except that the process kills itself (SIGKILL) at a given advance call.'''

    def __init__(self, calls):
        self._inner, self._calls = make_model("ou"), calls

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def advance(self, state, n, rng):
        self._calls -= 1
        if self._calls < 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return self._inner.advance(state, n, rng)


simulate(DiesInAdvance(int(sys.argv[2])), sys.argv[1], {n}, chains={chains}, seed={seed},
         chunk={chunk}, burn_in={burn_in}, progress=False)
"""


# advance calls per chain: 2 for the burn-in (chunk by chunk), then 3 chunks. Killed at call
# 3: chain 0 has one chunk; at call 7: chain 0 is complete, chain 1 has burnt in, no record.
@pytest.mark.parametrize(("calls", "written"), [(3, [1000, 0]), (7, [3000, 0])])
def test_killed_then_resumed_is_bit_identical(
    tmp_path: Path, reference: np.ndarray, calls: int, written: list[int]
) -> None:
    path = tmp_path / "killed.zarr"
    script = textwrap.dedent(CHILD).format(
        n=N, chains=CHAINS, seed=SEED, chunk=CHUNK, burn_in=BURN_IN
    )
    child = subprocess.run(
        [sys.executable, "-c", script, str(path), str(calls)], capture_output=True, timeout=120
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    assert read_progress(path)[:, 0].tolist() == written
    with pytest.raises(TrajectoryError, match="incomplete generated store.*resume it"):
        open_trajectory(path)
    resumed = simulate("ou", path, N, chains=CHAINS, seed=SEED, chunk=CHUNK, burn_in=BURN_IN)
    np.testing.assert_array_equal(resumed.values, reference)
    assert resumed.attrs["complete"] is True


def test_same_store_on_one_or_two_workers(tmp_path: Path) -> None:
    settings = {"n_samples": 2000, "chains": 3, "seed": 4, "chunk": 500, "burn_in": 300}
    here = simulate("ou", tmp_path / "here.zarr", **settings).values
    assert len({here[c].tobytes() for c in range(3)}) == 3  # chains differ
    # one cluster, scaled from 1 to 2 worker processes (each start costs seconds)
    with (
        LocalCluster(
            n_workers=1, processes=True, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        for workers in (1, 2):
            cluster.scale(workers)
            client.wait_for_workers(workers)
            da = simulate("ou", tmp_path / f"w{workers}.zarr", client=client, **settings)
            np.testing.assert_array_equal(da.values, here)


def test_complete_store_is_returned_and_other_settings_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    first = simulate("ou", path, 100, chains=2, seed=1, chunk=40).values
    chunk_file = next((path / "x").rglob("0"))
    stamp = chunk_file.stat().st_mtime_ns
    np.testing.assert_array_equal(simulate("ou", path, 100, chains=2, seed=1, chunk=40), first)
    assert chunk_file.stat().st_mtime_ns == stamp  # nothing was rewritten
    with pytest.raises(ValueError, match=r"other settings.*seed: store 1, given 2"):
        simulate("ou", path, 100, chains=2, seed=2, chunk=40)
    with pytest.raises(ValueError, match=r"model parameter 'dt': store 0.05, given 0.1"):
        simulate(make_model("ou", dt=0.1), path, 100, chains=2, seed=1, chunk=40)
    with pytest.raises(ValueError, match=r"n_samples: store 100, given 200; chunk: store 40"):
        simulate("ou", path, 200, chains=2, seed=1, chunk=50)
    (tmp_path / "other").mkdir()
    with pytest.raises(ValueError, match="exists and is not a store made by simulate"):
        simulate("ou", tmp_path / "other", 100)


def test_overwrite_replaces_a_store_with_other_settings(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    simulate("ou", path, 100, seed=1, chunk=40)
    with pytest.raises(ValueError, match=r"path=.*s.zarr.* other settings.*--overwrite"):
        simulate("ou", path, 120, seed=2, chunk=40)
    new = simulate("ou", path, 120, seed=2, chunk=40, overwrite=True)
    twin = simulate("ou", tmp_path / "twin.zarr", 120, seed=2, chunk=40)
    np.testing.assert_array_equal(new.values, twin.values)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr", "twin.zarr"]  # no temporary
    (tmp_path / "empty").mkdir()
    assert simulate("ou", tmp_path / "empty", 50, chunk=40, overwrite=True).shape == (1, 50, 2)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("keep me")
    with pytest.raises(ValueError, match="is not a zarr store; refusing to overwrite"):
        simulate("ou", tmp_path / "notes", 50, overwrite=True)
    assert (tmp_path / "notes" / "a.txt").read_text() == "keep me"


def test_a_failed_overwrite_leaves_the_old_store(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    old = simulate("ou", path, 100, seed=1, chunk=40).values
    with pytest.raises(ValueError, match="burn_in=-1"):
        simulate("ou", path, 100, seed=2, chunk=40, burn_in=-1, overwrite=True)
    np.testing.assert_array_equal(open_trajectory(path).values, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]


def test_a_simulated_store_opens_without_warnings(tmp_path: Path) -> None:
    import warnings

    import xarray as xr

    path = tmp_path / "s.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        simulate("ou", path, 100, chunk=40)
        xr.open_zarr(path).load()  # consolidated metadata, variable-length component names
        open_trajectory(path).load()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_samples": 0}, "n_samples=0 must be an integer >= 1"),
        ({"n_samples": 10.5}, "n_samples=10.5 must be an integer >= 1"),
        ({"chains": 0}, "chains=0 must be an integer >= 1"),
        ({"chunk": 0}, "chunk=0 must be an integer >= 1"),
        ({"seed": -1}, "seed=-1 must be an integer >= 0"),
        ({"burn_in": -5}, "burn_in=-5 must be an integer >= 0"),
        ({"model": "brownian"}, "unknown model name='brownian'"),
        ({"model": 3}, "model=3 is neither a model name nor a Model"),
    ],
)
def test_bad_input_names_the_parameter(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = {"model": "ou", "path": tmp_path / "bad.zarr", "n_samples": 10, **kwargs}
    with pytest.raises(ValueError, match=message):
        simulate(**args)
    assert not (tmp_path / "bad.zarr").exists()


def test_progress_bar_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    simulate("ou", tmp_path / "quiet.zarr", 30, chunk=10, progress=False)
    assert capsys.readouterr().err == ""
    simulate("ou", tmp_path / "loud.zarr", 30, chunk=10, progress=True)
    assert "3/3" in capsys.readouterr().err


# --- the triple-well kernel draws numpy's own normals ---------------------------------------


@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.Philox])
@pytest.mark.parametrize("seed", [0, 2**63 + 12345])
def test_compiled_generator_normals_are_numpys(bit_generator: type, seed: int) -> None:
    """numba's compiled ``Generator.standard_normal`` (what the triple-well kernel draws from)
    gives numpy's numbers and leaves the generator where numpy would."""
    from numba import njit

    @njit
    def fill(rng: np.random.Generator, out: np.ndarray) -> np.ndarray:
        for i in range(out.size):
            out[i] = rng.standard_normal()
        return out

    rng = np.random.Generator(bit_generator(seed))
    twin = np.random.Generator(bit_generator(seed))
    rng.standard_normal(7), twin.standard_normal(7)
    expected = twin.standard_normal(300_000)  # ~0.3 % from the wedges and the tail
    np.testing.assert_array_equal(fill(rng, np.empty(300_000)), expected)
    np.testing.assert_array_equal(rng.standard_normal(5), twin.standard_normal(5))


@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.Philox])
def test_triple_well_resumes_bit_for_bit_however_a_run_is_split(bit_generator: type) -> None:
    """Samples and the generator afterwards do not depend on how a run is split."""
    model = make_model("triple-well")

    def run(splits: list[int]):
        rng = np.random.Generator(bit_generator(21))
        state = model.initial_state(rng)
        parts = []
        for n in splits:
            samples, state = model.advance(state, n, rng)
            parts.append(samples)
        return np.concatenate(parts), state, rng.standard_normal(5), rng.integers(2**32)

    whole = run([5000])
    for splits in ([1, 0, 3276, 1723], [2000, 3000]):
        for a, b in zip(whole, run(splits), strict=True):
            np.testing.assert_array_equal(a, b)
