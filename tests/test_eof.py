"""The EOF route (``reduce="eof(k)"``): EOFs from one pass of covariance sums, the estimate on
their amplitudes, the response lifted back to the components.

Reference: an Ornstein-Uhlenbeck system ``dX = -Gamma X dt + sqrt(2) dW`` with symmetric
``Gamma = Q diag(lambda) Q^T``. Its covariance is ``Gamma^{-1}``, so the EOFs are the columns of
``Q`` with the smallest rates, the amplitudes ``y = V^T x`` are closed OU processes
``dy = -diag(lambda_k) y dt + sqrt(2) dW``, and the lifted response of the projected dynamics is
``V diag(exp(-lambda_k t)) V^T`` exactly.
"""

import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

from kelr_dist.kernels.bases.eof import leading_eofs, lift, lift_bound
from kelr_dist.models.registry import make_model
from kelr_dist.pipeline.estimate import estimate_response

RATES = np.array([0.5, 1.0, 3.0, 5.0])
DT = 0.05


def _rotation():
    q, _ = np.linalg.qr(np.random.default_rng(1).standard_normal((4, 4)))
    return q


def _ou():
    q = _rotation()
    gamma = q @ np.diag(RATES) @ q.T
    return make_model("ou", gamma=gamma.tolist(), sigma=(np.sqrt(2) * np.eye(4)).tolist(), dt=DT)


def _projected_response(times, k):
    v = _rotation()[:, :k]
    return np.stack([v @ np.diag(np.exp(-RATES[:k] * t)) @ v.T for t in times])


def test_leading_eofs_sorted_signed_and_lifted():
    q = _rotation()
    cov = q @ np.diag(1.0 / RATES) @ q.T
    eofs = leading_eofs(np.zeros(4), cov, 2)
    np.testing.assert_allclose(eofs.variances, 1.0 / RATES[:2])
    np.testing.assert_allclose(np.abs(eofs.patterns.T @ q[:, :2]), np.eye(2), atol=1e-12)
    peaks = eofs.patterns[np.argmax(np.abs(eofs.patterns), axis=0), [0, 1]]
    assert np.all(peaks > 0)
    np.testing.assert_allclose(eofs.explained, (1.0 / RATES[:2]) / np.sum(1.0 / RATES))
    # lag 0 lifts to the projector; the bound holds for any signs of the errors
    np.testing.assert_allclose(lift(np.eye(2), eofs.patterns), q[:, :2] @ q[:, :2].T, atol=1e-12)
    errors = np.random.default_rng(2).standard_normal((3, 2, 2))
    assert np.all(np.abs(lift(errors, eofs.patterns)) <= lift_bound(errors, eofs.patterns) + 1e-15)


def test_ou_projected_response_is_recovered():
    model = _ou()
    rng = np.random.default_rng(3)
    x, _ = model.advance(model.initial_state(rng), 100_000, rng)
    ds = estimate_response(x, dt=DT, max_time=2.0, client="synchronous",
                           estimator="score-matching", reduce="eof(2)")  # fmt: skip
    assert ds["response"].dims == ("lag", "i", "j") and ds.sizes["i"] == 4
    assert list(ds["i"].values) == ["x1", "x2", "x3", "x4"]
    assert ds["eof_response"].dims == ("lag", "eof_i", "eof_j") and ds.sizes["eof_i"] == 2
    exact = _projected_response(ds["time"].values, 2)
    error = np.abs(ds["response"].values - exact)
    assert error.max() < 0.05
    assert np.all(error <= 4 * ds["response_total_stderr"].values + 1e-3)
    # the amplitudes' own response is exp(-lambda t) on the diagonal
    np.testing.assert_allclose(
        np.diagonal(ds["eof_response"].values, axis1=1, axis2=2),
        np.exp(-np.outer(ds["time"].values, RATES[:2])),
        atol=0.05,
    )
    assert ds.attrs["reduce"] == "eof(2)"
    assert "projected dynamics" in ds.attrs["response_of"]
    expected = np.sum(1.0 / RATES[:2]) / np.sum(1.0 / RATES)
    assert abs(ds.attrs["explained_variance"] - expected) < 0.02
    assert ds["eof_patterns"].dims == ("field_component", "component")
    assert list(ds["component"].values) == ["eof1", "eof2"]
    overlap = np.abs(ds["eof_patterns"].values.T @ _rotation()[:, :2])
    np.testing.assert_allclose(overlap, np.eye(2), atol=0.06)  # sampling error


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"reduce": "eof(0)"}, "reduce: expected 'eof(k)' with k a positive integer"),
        ({"reduce": "pca(2)"}, "reduce: expected 'eof(k)'"),
        ({"reduce": "eof(5)"}, "reduce='eof(5)' asks for 5 EOFs of 4 components"),
        ({"reduce": "eof(2)", "observable": "square"}, "needs observable='identity'"),
        ({"reduce": "eof(2)", "forcing": "linear"}, "needs forcing='constant'"),
        ({"reduce": "eof(2)", "exact": True}, "exact: an exact score is the full system's"),
    ],
)
def test_bad_reduce_is_refused_in_one_line(options, message):
    x = np.random.default_rng(0).standard_normal((2000, 4))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        estimate_response(x, max_lag=5, client="synchronous", **options)
    assert "\n" not in str(err.value)


def _kelr(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kelr_dist.edges.cli", *map(str, args)],
                          cwd=cwd, capture_output=True, text=True, timeout=300)  # fmt: skip


def test_cli_reduce_on_a_store(tmp_path):
    q = _rotation()
    gamma, sigma = (q @ np.diag(RATES) @ q.T).tolist(), (np.sqrt(2) * np.eye(4)).tolist()
    store, out = tmp_path / "ou4.zarr", tmp_path / "out.nc"
    run = _kelr("simulate", "ou", store, "--samples", 40000, "--chunk", 10000, "--quiet",
                "--param", f"gamma={gamma}", "--param", f"sigma={sigma}",
                cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    run = _kelr("estimate", store, out, "--reduce", "eof(9)", "--quiet", cwd=tmp_path)
    assert run.returncode == 2 and "asks for 9 EOFs of 4 components" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not out.exists()
    run = _kelr("estimate", store, out, "--reduce", "eof(2)", "--estimator", "score-matching",
                "--max-time", 1, "--workers", 1, "--quiet", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    ds = xr.load_dataset(out)
    assert ds.attrs["reduce"] == "eof(2)" and ds["response"].shape == (21, 4, 4)
    error = np.abs(ds["response"].values - _projected_response(ds["time"].values, 2))
    assert np.all(error <= 4 * ds["response_total_stderr"].values + 1e-3)
    # the report reads it: the lifted response, and the score model of the amplitudes (figures)
    run = _kelr("report", out, "--figures", tmp_path / "figures", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "eof(2) (explaining" in run.stdout and "projected dynamics' response" in run.stdout
    assert (tmp_path / "figures" / "response.png").exists()
    assert len(list((tmp_path / "figures").glob("*.png"))) > 1
