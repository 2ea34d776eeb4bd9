"""The lattice field model: its density, its exact score and its bonds."""

from __future__ import annotations

import numpy as np
import pytest

from kelr_dist.models.registry import make_model


@pytest.mark.parametrize(("rows", "columns"), [(1, 16), (4, 8), (2, 2), (3, 1)])
def test_score_is_the_gradient_of_the_log_density(rows, columns):
    model = make_model("lattice", rows=rows, columns=columns)
    d = rows * columns
    assert model.components == tuple(f"x{i + 1}" for i in range(d))
    x = np.random.default_rng(0).normal(0.0, 1.2, (5, d))
    h = 1e-6
    difference = np.stack(
        [
            (model.log_density(x + h * e) - model.log_density(x - h * e)) / (2 * h)
            for e in np.eye(d)
        ],
        axis=1,
    )
    np.testing.assert_allclose(model.score(x), difference, atol=1e-6)


def bonds_log_density(x, pairs, barrier=1.0, tilt=0.1, coupling=0.1, twist=0.3, omega=1.5):
    gaps = np.array([x[i] - x[j] for i, j in pairs])
    sites = -(barrier * (x**2 - 1) ** 2 + tilt * x).sum()
    return sites + np.sum(-0.5 * coupling * gaps**2 + twist * np.cos(omega * gaps))


@pytest.mark.parametrize(
    ("rows", "columns", "pairs"),
    [
        (1, 2, [(0, 1)]),  # a side of two sites is open: one bond, not two
        (1, 3, [(0, 1), (1, 2), (2, 0)]),  # a ring
        (2, 3, [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3), (0, 3), (1, 4), (2, 5)]),
    ],
)
def test_bonds_join_neighbours_along_rows_and_columns(rows, columns, pairs):
    model = make_model("lattice", rows=rows, columns=columns)
    x = np.random.default_rng(1).normal(size=rows * columns)
    assert model.log_density(x[None])[0] == pytest.approx(bonds_log_density(x, pairs))


def test_bad_sides_are_named():
    with pytest.raises(ValueError, match="columns"):
        make_model("lattice", columns=0)
    with pytest.raises(ValueError, match="rows"):
        make_model("lattice", rows=2.5)
