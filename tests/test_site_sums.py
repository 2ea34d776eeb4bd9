"""The site sums of a tied local model: the functions of the whole field that the Stein
correction's refit adds for a translation-symmetric field."""

from __future__ import annotations

import numpy as np
import pytest

from kelr_dist.kernels.bases.families import Coordinate, Hermite, polynomials
from kelr_dist.kernels.scores.local import LocalFeatures, degree_caps, lattice
from kelr_dist.kernels.scores.site_sums import SITE_SUM_DEGREE, SiteSums, pooled


def _site_sums(shape: tuple[int, ...], degree: int, radius: int = 2) -> tuple[SiteSums, np.ndarray]:
    """Site sums of degree ``≤ degree`` on a periodic lattice of ``shape``, the components'
    coordinates a little apart (pooled for the sums), and 300 rows."""
    rng = np.random.default_rng(0)
    d = int(np.prod(shape))
    x = 1.5 + 0.8 * rng.standard_normal((300, d))
    coords = tuple(Coordinate(Hermite(), 1.4 + 0.01 * k, 0.9 + 0.01 * k) for k in range(d))
    hoods = lattice(shape, radius)
    caps = tuple(min(c, degree) for c in degree_caps(hoods, 200))
    features = LocalFeatures(hoods, coords, caps, tied=True)
    site = features.sites[0]
    inner = np.arange(site.size) < features.inner_size(0)  # not the shell's features
    keep = inner & (site.indices.sum(axis=1) >= SITE_SUM_DEGREE)
    return SiteSums(features, keep, pooled(coords), x.mean(0), x.std(0)), x


def _brute_force(sums: SiteSums, x: np.ndarray) -> np.ndarray:
    """``Σ_i Π_k P_{m_k}(y_{N(i)_k})`` for every column's multi-index ``m``, by numpy."""
    top = int(sums.indices.max())
    y = sums.coordinate.mapped(x)
    table = np.stack([polynomials(Hermite(), y[:, k], top)[0] for k in range(x.shape[1])], 1)
    out = np.zeros((x.shape[0], sums.size))
    for members in sums.features.neighbourhoods.members:
        for u, m in enumerate(sums.indices):
            out[:, u] += np.prod([table[:, c, p] for c, p in zip(members, m, strict=True)], 0)
    return out


@pytest.mark.parametrize("shape", [(9,), (4, 4)])
def test_site_sums_are_the_sites_polynomials_summed(shape: tuple[int, ...]) -> None:
    """The values are every site's polynomials of the columns' multi-indices summed (a numpy
    oracle); the divergence sums agree with a central difference of the values."""
    sums, x = _site_sums(shape, 3)
    values, divergence = sums.values_and_divergence_sums(x)
    np.testing.assert_allclose(values, _brute_force(sums, x), rtol=1e-11, atol=1e-10)
    np.testing.assert_array_equal(sums(x), values)
    h = 1e-5
    for j in (0, x.shape[1] - 1):
        step = np.zeros(x.shape[1])
        step[j] = h
        numeric = ((sums(x + step) - sums(x - step)) / (2 * h)).sum(axis=0)
        np.testing.assert_allclose(divergence[j], numeric, rtol=1e-6, atol=1e-5)


def test_site_sums_are_invariant_and_kept_once() -> None:
    """On a ring, shifting the field by one site leaves every site sum as it was. Translated
    copies are kept once: of degree 2 on neighbourhoods ``(i, i - 1, i + 1)`` they are
    ``Σ P_2(y_i)``, ``Σ y_i y_(i+1)`` and ``Σ y_(i-1) y_(i+1)``; no constant or linear one (the
    refit's affine features)."""
    sums, x = _site_sums((9,), 4)
    np.testing.assert_allclose(sums(np.roll(x, 1, axis=1)), sums(x), rtol=1e-12, atol=1e-10)
    assert sums.indices.sum(axis=1).min() == SITE_SUM_DEGREE
    small, _ = _site_sums((9,), 2, radius=1)
    assert small.size == 3
    kept = sorted(tuple(int(v) for v in m[:3]) for m in small.indices)  # m[3:]: the shell
    linear, _ = _site_sums((9,), 1, radius=1)
    assert linear.size == 0 and linear.values_and_divergence_sums(x)[1].shape == (9, 0)
    assert kept in ([(0, 1, 1), (1, 0, 1), (2, 0, 0)], [(0, 1, 1), (1, 1, 0), (2, 0, 0)])


def test_a_tied_ring_is_refitted_on_its_site_sums_within_its_error_bars() -> None:
    """An anharmonic ring (MALA samples of a closed-form density, the exact FDT on the same
    samples), tied local model, a uniform forcing pattern: the Stein correction refits on the
    site sums (with the squares' own functions), the pattern's response is within 3 total
    standard errors of the exact one, and the identity's lag-0 response is exact."""
    import sys
    from pathlib import Path

    import kelr_dist

    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    from local_ring_check import mala, score

    d = 12
    x = mala(d, 10, 2000, 0.05, 4, 7)
    forcing = kelr_dist.Forcing(
        tuple(f"x{k + 1}" for k in range(d)), patterns=np.ones((1, d)), pattern_names=("F",)
    )
    options = dict(
        dt=0.2, max_lag=5, score=score, estimator="score-matching", neighbours="ring",
        symmetry="translation", client="synchronous", progress=False, forcing=forcing,
    )  # fmt: skip
    squares = kelr_dist.estimate_response(x, observable="square", **options)
    assert squares.attrs["stein_correction"] == "observable, site sums"
    column = {"j": "F"}
    error = np.abs(squares["response"] - squares["response_exact"]).sel(column)
    assert float((error / squares["response_total_stderr"].sel(column)).max()) < 3
    identity = kelr_dist.estimate_response(x, **options)
    assert identity.attrs["stein_correction"] == "site sums"
    lag0 = identity["response"].isel(lag=0).drop_sel(j="F").values
    np.testing.assert_allclose(lag0, np.eye(d), atol=1e-8)
