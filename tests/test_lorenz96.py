"""Stochastic Lorenz-96 (``lorenz96``): its statistics, the command line, and no exact FDT."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from kelr_dist.models.lorenz96 import Lorenz96
from kelr_dist.models.registry import make_model


def _equilibrium(model, n, seed=0):
    rng = np.random.default_rng(seed)
    burn, _ = model.advance(model.initial_state(rng), model.default_burn_in, rng)
    return model.advance(burn[-1], n, rng)[0]


def test_chaotic_regime_statistics():
    """F = 8: the site mean and standard deviation known for Lorenz-96 (about 2.3 and 3.6;
    Lorenz 1996, Abramov & Majda 2007), the same at every site (translation symmetry), and the
    small noise does not change them much."""
    model = make_model("lorenz96")
    assert model.K == 40 and model.F == 8.0 and model.dt == pytest.approx(0.05)
    x = _equilibrium(model, 20_000)
    assert x.shape == (20_000, 40) and np.isfinite(x).all()
    assert 2.1 < x.mean() < 2.6 and 3.4 < x.std() < 3.9
    assert np.ptp(x.mean(axis=0)) < 0.5 and np.ptp(x.std(axis=0)) < 0.4
    # neighbouring sites are correlated, distant ones nearly not
    c = np.corrcoef(x[:, :21].T)
    assert abs(c[0, 1]) > 0.03 and abs(c[0, 20]) < 0.1


def test_weak_forcing_decays_to_the_steady_state():
    """F = 0.5 (below the first bifurcation) and tiny noise: every site settles at x_k = F."""
    model = make_model("lorenz96", K=8, F=0.5, sigma=1e-3)
    x = _equilibrium(model, 2000)
    np.testing.assert_allclose(x.mean(axis=0), 0.5, atol=1e-3)
    assert x.std() < 1e-2


def test_perturbation_moves_the_forcing_with_common_random_numbers():
    """``advance(perturbation=...)`` adds to F; with the same generator state both signs use the
    same noise, so a zero perturbation gives the same trajectory bit for bit."""
    model = make_model("lorenz96", K=8)
    start = model.initial_state(np.random.default_rng(1))
    a, _ = model.advance(start, 200, np.random.default_rng(2))
    b, _ = model.advance(start, 200, np.random.default_rng(2), perturbation=np.zeros(8))
    assert np.array_equal(a, b)
    up, _ = model.advance(start, 20, np.random.default_rng(2), perturbation=0.1)
    down, _ = model.advance(start, 20, np.random.default_rng(2), perturbation=-0.1)
    # a uniform forcing +-0.1 for one time unit moves the mean by about +-0.1 t at first
    change = (up - down).mean(axis=1) / 0.2
    assert 0.02 < change[0] < 0.06  # after dt = 0.05


def test_no_closed_form_density():
    model = make_model("lorenz96", K=8)
    assert Lorenz96.closed_form_density is False and make_model("ou").closed_form_density
    for method in (model.score, model.log_density):
        with pytest.raises(ValueError, match="no closed-form equilibrium density"):
            method(np.zeros((3, 8)))


@pytest.mark.parametrize(
    ("params", "named"),
    [({"K": 3}, "K=3 must be at least 4"), ({"sigma": 0}, "sigma"), ({"F": "eight"}, "F")],
)
def test_bad_parameters_are_named(params, named):
    with pytest.raises(ValueError, match=named):
        make_model("lorenz96", **params)


def _kelr(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kelr_dist.edges.cli", *map(str, args)],
                          cwd=cwd, capture_output=True, text=True, timeout=300)  # fmt: skip


def test_cli_simulate_and_exact_refused(tmp_path):
    store = tmp_path / "l96.zarr"
    run = _kelr("simulate", "lorenz96", store, "--samples", 4000, "--chunk", 1000,
                "--param", "K=8", "--param", "F=6", "--param", "sigma=0.3", "--quiet",
                cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "(1, 4000, 8)" in run.stdout
    stored = xr.open_zarr(store, consolidated=False)
    x = stored["x"]
    assert stored.attrs["model"] == "lorenz96" and float(x.attrs["dt"]) == pytest.approx(0.05)
    direct = _equilibrium(make_model("lorenz96", K=8, F=6, sigma=0.3), 10)
    assert np.isfinite(x.values).all() and x.shape[-1] == direct.shape[1]
    out = tmp_path / "out.nc"
    run = _kelr("estimate", store, out, "--exact", "--max-lag", 10, "--quiet", cwd=tmp_path)
    assert run.returncode == 2 and not out.exists()
    assert run.stderr.strip().count("\n") == 0
    assert "--exact: the store's model 'lorenz96' has no closed-form equilibrium" in run.stderr


SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "lorenz96_response.py"


@pytest.mark.parametrize("route", [[], ["--window", "3"], ["--reduce", "eof(3)"]])
def test_response_script_at_tiny_size(tmp_path, route):
    """The direct-perturbation script end to end on 8 sites: the table has every row, the
    direct experiment's error bars, and the package's column (the EOF route: site mean only);
    by default the package runs on all sites with the local score model, and the parts of its
    standard error follow the table."""
    table = tmp_path / "table.md"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--K", "8", "--samples", "2e4", "--members", "100",
         "--max-time", "1", *route, "--output", str(table), "--figure", str(tmp_path / "f.png")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    text = table.read_text()
    assert ("all 8 sites, local score model (ring, symmetry translation, index set" in text) == (
        not route
    )
    rows = [line for line in text.split("The package's largest")[0].splitlines()
            if line.startswith("| ")]  # fmt: skip
    assert len(rows) == 5 and "qG: max err" in rows[0] and "package: max se" in rows[0]
    assert all(" ± " in row for row in rows[1:])
    mean_rows = [row for row in rows[1:] if row.startswith("| site mean")]
    assert all("—" not in row for row in mean_rows)
    assert ("—" in rows[2]) == (route[:1] == ["--reduce"])
    parts = [line for line in text.split("The package's largest")[1].splitlines()
             if line.startswith("| ") and "---" not in line][1:]  # fmt: skip
    assert len(parts) == (2 if route[:1] == ["--reduce"] else 4)
    for line in parts:
        total, sampling, estimator, independent = (float(c) for c in line.split("|")[3:7])
        assert max(sampling, estimator, independent) <= total + 1e-12
    assert (tmp_path / "f.png").stat().st_size > 0


def test_response_script_refuses_an_even_window(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--window", "4"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert run.returncode != 0 and "--window=4 must be an odd number" in run.stderr
