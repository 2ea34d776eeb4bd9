"""The pilot of ``estimator="auto"``: on a subsample it decides whether the kernel embedding can
still win; where it cannot, that family goes no further than its fit and the result says so, and
the chosen family's results are those of that family alone; where it can, both run as before."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner
from distributed import Client, LocalCluster

from kelr_dist.data.store import open_trajectory
from kelr_dist.edges.cli import main
from kelr_dist.edges.jobfile import parse_job
from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.kernels.survey.subsample import strided_rows_reduction
from kelr_dist.models.registry import make_model
from kelr_dist.models.simulate import simulate
from kelr_dist.pipeline import steps
from kelr_dist.pipeline.estimate import estimate_response

#: the smallest trajectory the pilot runs on (it reads every PILOT_MIN_STRIDE-th sample or fewer)
N = steps.PILOT_SAMPLES * steps.PILOT_MIN_STRIDE
#: fast settings shared by the runs compared
FAST: dict[str, object] = {"client": "synchronous", "progress": False, "max_lag": 20}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pilot")
    paths = {}
    # the pilot's decisions need only the stationary law: coupled-3d's coarse sampler (MALA is
    # exact in law at any step) simulates 50 times faster than its default step
    models = {"coupled-3d": make_model("coupled-3d", step=0.04, subsample=10), "triple-well": None}
    for name, model in models.items():
        paths[name] = root / f"{name}.zarr"
        simulate(model or name, paths[name], N, seed=3, progress=False)
    return paths


@pytest.fixture(scope="module")
def auto(stores: dict[str, Path]) -> xr.Dataset:
    """The automatic estimate of coupled-3d in this process (its pilot skips the kernel
    embedding)."""
    return quiet_estimate(stores["coupled-3d"])


def quiet_estimate(path: Path, **options: object) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return estimate_response(path, **{**FAST, **options})  # type: ignore[arg-type]


def test_a_family_that_cannot_win_goes_no_further(
    stores: dict[str, Path], auto: xr.Dataset
) -> None:
    """Coupled 3-D wells: the kernel embedding's held-out loss is far behind score matching's
    on the pilot rows, so it goes no further; the result records why, and its score-matching
    response is the one ``estimator="score-matching"`` gives."""
    alone = quiet_estimate(stores["coupled-3d"], estimator="score-matching")
    assert auto.attrs["pilot_skipped"] == "kernel-embedding"
    assert auto.attrs["pilot_stride"] == steps.PILOT_MIN_STRIDE
    assert auto.attrs["pilot_gap"] > steps.PILOT_MARGIN
    assert "kernel embedding was not fitted" in auto.attrs["pilot"]
    assert "pilot" not in auto.attrs["warnings"].lower()  # a decision, not a warning
    assert auto.attrs["estimator"] == "score-matching"
    assert "response_kernel_embedding" not in auto and "order" not in auto.attrs
    for name in ("response", "response_stderr", "response_total_stderr", "stein_residual"):
        np.testing.assert_array_equal(auto[name].values, alone[name].values)
    assert auto.attrs["passes"] == alone.attrs["passes"] + 1  # the pilot reads the data once


def test_a_family_that_can_win_is_carried_on(stores: dict[str, Path]) -> None:
    """Triple-well: the pilot finds no decisive gap, so both families run and the kernel
    embedding is chosen, as without a pilot."""
    auto = quiet_estimate(stores["triple-well"])
    assert auto.attrs["pilot_skipped"] == ""
    assert "Pilot" not in auto.attrs["warnings"]
    assert auto.attrs["estimator"] == "kernel-embedding"
    assert "response_score_matching" in auto


def test_no_pilot_below_its_size_or_for_one_family(stores: dict[str, Path]) -> None:
    """A trajectory shorter than the pilot's size, or a named estimator, runs no pilot."""
    short = open_trajectory(stores["coupled-3d"])[:, : N // 2].values
    assert "pilot" not in quiet_estimate(short, dt=0.01).attrs
    assert "pilot" not in quiet_estimate(stores["coupled-3d"], estimator="kernel-embedding").attrs


def test_no_pilot_when_switched_off(stores: dict[str, Path], tmp_path: Path) -> None:
    """``pilot=False`` (Python; ``pilot: false`` in a job file, ``--no-pilot`` on the command
    line) fits both families to all samples: the kernel embedding the pilot would skip is
    estimated and compared."""
    off = quiet_estimate(stores["coupled-3d"], pilot=False)
    assert "pilot" not in off.attrs
    assert "response_kernel_embedding" in off and off.attrs["estimator"] == "score-matching"
    job = {"input": {"store": "s.zarr"}, "estimator": {"pilot": False}, "outputs": {"result": "r"}}
    assert parse_job(job, tmp_path / "job.yaml").options.pilot is False
    assert "--no-pilot" in CliRunner().invoke(main, ["estimate", "--help"]).output


@pytest.mark.parametrize("chunks", [None, 1, 7, 64, (5, 300, 695)])
def test_the_pilot_subsample_is_every_kth_row_in_any_chunking(chunks: object) -> None:
    """The subsample the pilot gathers in one pass is ``x[:, ::k]``, whatever the blocks."""
    x = np.random.default_rng(0).standard_normal((2, 1000, 3))
    for stride in (1, 3, 7, 1000):
        rows = reduce_in_memory(strided_rows_reduction(stride), x, chunks)  # type: ignore[arg-type]
        np.testing.assert_array_equal(rows, x[:, ::stride])
    with pytest.raises(ValueError, match="stride must be a whole number >= 1"):
        strided_rows_reduction(0)


def test_the_pilot_on_worker_processes_decides_as_in_this_process(
    stores: dict[str, Path], auto: xr.Dataset
) -> None:
    """A real cluster of two worker processes: the gathered subsample is scattered to the
    workers, and the pilot's losses, decision and the response are those of the synchronous
    run."""
    here = auto
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        there = quiet_estimate(stores["coupled-3d"], client=client)
    assert there.attrs["pilot_skipped"] == here.attrs["pilot_skipped"] == "kernel-embedding"
    np.testing.assert_allclose(there.attrs["pilot_gap"], here.attrs["pilot_gap"], rtol=1e-9)
    np.testing.assert_allclose(there["response"], here["response"], rtol=1e-10, atol=1e-12)
