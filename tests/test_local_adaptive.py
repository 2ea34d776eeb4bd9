"""The local score model's adaptive index set: grown per site by held-out loss in a dictionary
that reaches further along single components and pairs than the total-degree set."""

from __future__ import annotations

import numpy as np
import pytest

from kelr_dist.kernels.bases.families import Coordinate, Hermite
from kelr_dist.kernels.scores.local import (
    LocalFeatures,
    adaptive_features,
    choose_local,
    degree_caps,
    lattice,
)
from tests.test_local_scores import _local_sums, _ring_samples


def _sextic_sites(d: int, n: int, seed: int = 0) -> np.ndarray:
    """Independent sites of density ``∝ exp(-x⁶ / 6)`` (score ``-x⁵``): ``x⁶ / 6`` is
    Gamma(1/6)-distributed."""
    rng = np.random.default_rng(seed)
    return rng.choice([-1.0, 1.0], (n, d)) * (6.0 * rng.gamma(1.0 / 6.0, 1.0, (n, d))) ** (1 / 6)


def _coordinates(x: np.ndarray) -> tuple[Coordinate, ...]:
    return tuple(
        Coordinate(Hermite(), float(m), float(s)) for m, s in zip(x.mean(0), x.std(0), strict=True)
    )


@pytest.mark.parametrize("tied", [True, False])
def test_the_grown_set_reaches_a_sparse_score_the_total_degree_set_of_its_size_cannot(
    tied: bool,
) -> None:
    """Score ``-x_i⁵`` at every site of a ring (radius 1: three components a site): the grown
    set, started at total degree ≤ 3, adds the site's own ``x⁵`` (its dictionary reaches degree
    6 along single components and pairs), with no more features than the total-degree set of
    degree 4, which cannot hold it; its held-out loss is lower by many standard errors."""
    x = _sextic_sites(8, 21_000)
    coords, hoods = _coordinates(x), lattice((8,), radius=1)
    grown = choose_local(_local_sums(x, LocalFeatures(hoods, coords, (0, 3), tied, reach=6)))
    assert grown.index_set == "local-adaptive" and grown.growth is not None
    site = grown.sums.features.sites[0]
    chosen = site.indices[grown.members[0, : site.size]]
    assert not chosen[:, 3:].any()  # never the shell's components (the sensitivity check's)
    chosen = chosen[:, :3]
    assert [5, 0, 0] in chosen.tolist()
    assert not (chosen[:, 1:] >= 4).any()  # nothing far along the neighbours' components
    fixed = choose_local(_local_sums(x, LocalFeatures(hoods, coords, (0, 4), tied)))
    degree_4 = int(fixed.sums.features.mask(1, 4)[0].sum())  # 35
    assert fixed.degree <= 4 and grown.pick.features <= degree_4 * (1 if tied else 8)
    gap = fixed.pick.fold_losses - grown.pick.fold_losses
    assert gap.mean() > 5 * gap.std(ddof=1) / np.sqrt(gap.size), (fixed.pick, grown.pick)
    s, _ = grown.model(x[:500])
    scale = np.abs(x[:500] ** 5).max()
    np.testing.assert_allclose(s, -(x[:500] ** 5), atol=0.1 * scale)
    assert grown.neighbours is not None and len(grown.refits()) == 4


def test_the_adaptive_dictionary_spends_the_total_degree_models_gram_budget() -> None:
    """At the same budget the adaptive dictionary has no more features a site than the
    total-degree model's widest and reaches further along single components and pairs."""
    x, _ = _ring_samples(12, 100)
    coords = _coordinates(x)
    for hoods in (lattice((12,)), lattice((12,), radius=3), lattice((3, 4))):
        for budget in (40, 200, 478):
            fixed = LocalFeatures(hoods, coords, tuple(degree_caps(hoods, budget)))
            adaptive = adaptive_features(hoods, coords, budget, 0.6)
            assert adaptive.adaptive and adaptive.width <= fixed.width
            assert adaptive.degree >= fixed.degree, (hoods.source, budget)


def test_local_adaptive_end_to_end_on_a_ring() -> None:
    from kelr_dist import estimate_response

    x, _ = _ring_samples(12, 20_000, seed=3)
    ds = estimate_response(
        x, estimator="score-matching", index_set="local-adaptive", neighbours="ring",
        symmetry="translation", max_lag=2, client="synchronous", progress=False,
    )  # fmt: skip
    assert ds.attrs["score_matching_index_set"] == "local-adaptive"
    np.testing.assert_allclose(ds["response"].isel(lag=0), np.eye(12), atol=1e-8)
    assert np.isfinite(ds["response_total_stderr"]).all()


@pytest.mark.parametrize("tied", [True, False])
def test_a_local_growth_path_holds_the_refits_held_out_losses(tied: bool) -> None:
    """Every step's held-out loss per fold, computed in closed form for all sites side by side,
    is that of the sites refitted on the set of that step (each site alone, or tied)."""
    from kelr_dist.kernels.scores.local import grow_local

    x = _sextic_sites(6, 12_000, seed=4)
    features = LocalFeatures(lattice((6,), radius=1), _coordinates(x), (0, 2), tied, reach=5)
    sums = _local_sums(x, features)
    growth = grow_local(sums, features.mask(1, 1))
    path = growth.paths[0]
    assert growth.groups == ((0, 1, 2, 3, 4, 5),) and len(path.losses) > 3
    for step in range(len(path.losses)):
        members = np.zeros((6, features.width), dtype=bool)
        members[:, : path.order.size] = path.members(step)
        refits = [sums.loss(sums.fit(members, (0.0,), without=f)[0], f) for f in range(4)]
        np.testing.assert_allclose(path.fold_losses[step], refits, rtol=1e-6, atol=1e-8)


def test_a_local_adaptive_set_stopped_by_its_dictionary_reports_the_truncation() -> None:
    """Score ``-x_i⁵``, grown from the linear features: a dictionary that reaches degree 3 or 5
    along the site's own component is used up there with the loss still falling (the
    TruncationWarning's message says where); one that reaches degree 7 is not."""
    from kelr_dist.pipeline.steps import score_matching_truncation

    x = _sextic_sites(8, 21_000)
    coords, hoods = _coordinates(x), lattice((8,), radius=1)
    for reach, truncated in ((3, True), (5, True), (7, False)):
        choice = choose_local(_local_sums(x, LocalFeatures(hoods, coords, (0, 1), True, reach)))
        found = score_matching_truncation(choice, x.shape[0])
        assert (found is not None) == truncated, (reach, choice.pick)
        if found is not None:
            assert choice.degree == reach and found.drop > 5 * found.drop_stderr
            assert "adaptive index set" in found.message
