"""Fields: many components (d in the hundreds) estimated with memory and time proportional to the
features used, and the per-site (local) score model."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kelr_dist.kernels.bases.families import Coordinate, Hermite, TensorBasis, multi_indices
from kelr_dist.kernels.scores.index_sets import dictionary
from kelr_dist.kernels.scores.score_matching import PolynomialFeatures


@pytest.mark.parametrize(("caps", "total"), [((3, 2, 4), None), ((3, 2, 4), 4), ((2,) * 6, 3)])
def test_multi_indices_are_the_dense_enumeration_in_order(caps: tuple, total: int | None) -> None:
    dense = [
        m
        for m in itertools.product(*[range(c + 1) for c in caps])
        if total is None or sum(m) <= total
    ]
    np.testing.assert_array_equal(multi_indices(caps, total), np.array(dense))


def test_index_sets_in_128_coordinates_are_built_sparsely() -> None:
    coords = tuple(Coordinate(Hermite(), 0.0, 1.0) for _ in range(128))
    assert multi_indices([1] * 128, 1).shape == (129, 128)
    assert TensorBasis(coords, 1, "total").size == 129  # numpy's meshgrid stops at 32 axes
    assert TensorBasis(coords, 0, "total").tails.shape == (1, 127)
    assert dictionary(coords, 1, 500).size == 129
    features = PolynomialFeatures(coords, 2)
    assert features.support[0].shape == (features.size, 2)  # two factors at most, not 128
    x = np.random.default_rng(0).standard_normal((50, 128))
    phi, sums = features.values_and_gradient_sums(x)
    np.testing.assert_allclose(sums, features.gradients(x).sum(axis=1), rtol=1e-12, atol=1e-12)
    column = features.indices.tolist().index([1, 1] + [0] * 126)
    np.testing.assert_allclose(phi[:, column], x[:, 0] * x[:, 1], rtol=1e-12)


RUN_128 = """
import json, resource, sys
import numpy as np
from kelr_dist import estimate_response

rng = np.random.default_rng(0)
n, d = 20_000, 128
x = np.empty((n, d))
x[0] = rng.standard_normal(d)
noise = rng.standard_normal((n, d)) * np.sqrt(1 - 0.9**2)
for t in range(1, n):  # a ring of AR(1) sites coupled to their left neighbour
    x[t] = 0.9 * x[t - 1] + 0.05 * (np.roll(x[t - 1], 1) - x[t - 1]) + noise[t]
options = json.loads(sys.argv[1])
ds = estimate_response(x, client="synchronous", max_lag=4, progress=False, **options)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak": peak, "shape": list(ds["response"].shape),
                  "finite": bool(np.isfinite(ds["response"].values).all()),
                  "stderr": bool(np.isfinite(ds["response_stderr"].values).all()),
                  "estimator": ds.attrs["estimator"]}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("options", [{"estimator": "score-matching"}, {}])
def test_128_components_every_step_under_two_gib(options: dict) -> None:
    """Survey, fits and response at d = 128 in one real process, which stays under 2 GiB."""
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RUN_128), json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["shape"] == [5, 128, 128]
    assert out["finite"] and out["stderr"]
    assert out["peak"] < 2 * 2**30, f"peak resident memory {out['peak'] / 2**30:.2f} GiB"


def test_lagged_sums_by_column_groups_are_the_same_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    """With many columns the cross spectra go by groups of columns (bounded memory): the same
    sums as all columns at once."""
    from kelr_dist.kernels.response import lagged

    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3000, 6)), rng.standard_normal((2990, 9))
    whole = lagged.lagged_sums(a, b, 10)
    blocks = lagged.blockwise_lagged_sums(a, b, 10, 512, 100)
    monkeypatch.setattr(lagged, "CROSS_BUDGET", 16 * 6 * 3000)  # about two columns a group
    assert len(lagged._column_groups(6, 9, 4096)) > 2
    np.testing.assert_allclose(lagged.lagged_sums(a, b, 10), whole, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(
        lagged.blockwise_lagged_sums(a, b, 10, 512, 100), blocks, rtol=1e-12, atol=1e-9
    )
