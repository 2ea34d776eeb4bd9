"""A tied local model's features summed over the sites: functions of the whole field.

They are the functions of a field that a translation leaves alone.

The tied local model (:mod:`kelr_dist.kernels.scores.local`, ``symmetry="translation"``) fits
each site's score ``s_i(x) = w · φ(x_{N(i)})`` on its own neighbourhood. The conjugate variable
of a forcing pattern ``f`` is a sum over the sites, ``B_f = -Σ_i f_i s_i``; for the uniform
pattern ``Σ_i ŝ_i = w · I`` with the *site sums*

    I_a(x) = Σ_i φ_a(x_{N(i)}),

functions of the whole field. Fitted site by site, the truncation errors of the ``ŝ_i`` add up in
that sum. As test functions of the Stein correction's refit
(:class:`~kelr_dist.kernels.response.stein_correction.ExtendedScore`, eq. 1 with the affine
features ``z̃`` and ``φ = I``), they make the sample Stein identity ``Ê[ŝ_i I_a] = -Ê[∂_i I_a]``
hold for every site and every ``a``. Summed over the sites with a pattern's weights, that is
the normal equation of the best conjugate ``B_f`` in the span of ``[z̃, I]`` plus the model's own
``-Σ f_i ŝ_i``: the least-squares fit of ``B_f`` itself by ``E[(B - B_f)²] = E[B²] - 2 E[f · ∇B]
+ const``, which needs no vector field and so can use functions of the whole field.

Reference: A. Hyvärinen, "Estimation of non-normalized statistical models by score matching",
J. Mach. Learn. Res. 6 (2005) 695–709 (the integration by parts behind ``E[B_f g] = E[f · ∇g]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from kelr_dist.kernels.bases.families import Coordinate, Laguerre, polynomials
from kelr_dist.kernels.compiled import compiled
from kelr_dist.kernels.scores.local import LocalChoice, LocalFeatures

#: the lowest total degree of a site sum: the constant and the linear features are in the span
#: of the affine features ``z̃`` already
SITE_SUM_DEGREE = 2
#: rows of standard normal draws on which translated copies of a site sum are found equal
PROBE_ROWS = 64


class _Layout(NamedTuple):
    """How :class:`SiteSums` evaluates: each site's members ``(S, w)``; over a site's whole
    feature set, in an order where a feature follows its parent (itself without its last entry),
    each feature's ``parent`` and the position (``last``) and degree (``power``) of that last
    entry; the ``columns``, the features summed (the kept ones, one of each set of translated
    copies); and their supports (``position``, ``degree``, each ``(P, s)``) for the gradients."""

    members: np.ndarray
    parent: np.ndarray
    last: np.ndarray
    power: np.ndarray
    columns: np.ndarray
    position: np.ndarray
    degree: np.ndarray


@dataclass(frozen=True)
class SiteSums:
    """The test functions ``I_a(x) = Σ_i φ_a(y_{N(i)})`` of the tied local model ``features``
    (:class:`~kelr_dist.kernels.scores.local.LocalFeatures`, ``tied``): its polynomials of the
    kept multi-indices ``keep`` ``(W,)`` (the chosen model's, of total degree at least
    :data:`SITE_SUM_DEGREE`) on every site's neighbourhood, in one ``coordinate`` for all the
    components (their locations and scales pooled: a site sum is then exactly the same function
    whichever of its translated copies it is written as, and each is kept once);
    ``origin`` ``x̄ (d,)`` and ``scale`` ``σ (d,)`` place the refit's affine features
    (:class:`~kelr_dist.kernels.response.stein_correction.Features`)."""

    features: LocalFeatures
    keep: np.ndarray
    coordinate: Coordinate
    origin: np.ndarray
    scale: np.ndarray

    @classmethod
    def of(cls, choice: LocalChoice, origin: np.ndarray, scale: np.ndarray) -> SiteSums:
        """The site sums of the features of a tied local ``choice`` (its chosen set)."""
        features = choice.sums.features
        if not features.tied:
            raise ValueError("site sums need a tied local model (symmetry='translation')")
        site = features.sites[0]
        keep = choice.members[0, : site.size] & (site.indices.sum(axis=1) >= SITE_SUM_DEGREE)
        return cls(features, keep, pooled(features.coordinates), np.asarray(origin, float),
                   np.asarray(scale, float))  # fmt: skip

    @cached_property
    def _layout(self) -> _Layout:
        members = np.array(self.features.neighbourhoods.members, dtype=np.int64)
        site = self.features.sites[0]
        indices, order = site.indices, self._order
        rank = {tuple(int(v) for v in indices[a]): k for k, a in enumerate(order)}
        parent = np.zeros(len(order), dtype=np.int64)
        last = np.zeros(len(order), dtype=np.int64)
        power = np.zeros(len(order), dtype=np.int64)
        for k, a in enumerate(order):
            nonzero = np.flatnonzero(indices[a])
            if nonzero.size == 0:
                parent[k] = -1
                continue
            last[k], power[k] = nonzero[-1], indices[a, nonzero[-1]]
            up = indices[a].copy()
            up[last[k]] = 0
            parent[k] = rank[tuple(int(v) for v in up)]
        kept = np.array(
            [rank[tuple(int(v) for v in indices[a])] for a in np.flatnonzero(self.keep)],
            dtype=np.int64,
        )
        if kept.size == 0:  # a model of degree 1: nothing beside the affine features
            empty = np.zeros((0, 1), dtype=np.int64)
            return _Layout(members, parent, last, power, kept, empty, empty)
        columns = kept[self._distinct(members, parent, last, power, kept)]
        position, degree = site.subset(np.isin(np.arange(site.size), order[columns])).support
        # the support rows follow the site's own order: map the columns to it
        columns = columns[np.argsort(order[columns])]
        return _Layout(members, parent, last, power, columns, position, degree)

    def _distinct(
        self,
        members: np.ndarray,
        parent: np.ndarray,
        last: np.ndarray,
        power: np.ndarray,
        kept: np.ndarray,
    ) -> np.ndarray:
        """Positions in ``kept`` of one feature of each set of equal site sums, found on
        :data:`PROBE_ROWS` standard normal rows (in ``y``)."""
        y = np.random.default_rng(0).standard_normal((PROBE_ROWS, self.features.dim))
        top = int(power.max(initial=0))
        tables = self._tables_of(y, top)[0]
        out = np.zeros((PROBE_ROWS, kept.size))
        _site_products(tables, members, parent, last, power, kept, out)
        rounded = np.round(out / (np.abs(out).max(axis=0) + 1e-300), 9)
        _, first = np.unique(rounded.T, axis=0, return_index=True)
        return np.sort(first)

    def _tables_of(self, y: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
        """The coordinate's polynomials and their ``y``-derivatives at ``y (n, d)``, each
        ``(n, d, top + 1)``."""
        values, derivs = polynomials(self.coordinate.family, y.ravel(), top)
        shape = (*y.shape, top + 1)
        return values.reshape(shape), derivs.reshape(shape)

    @property
    def size(self) -> int:
        return int(self._layout.columns.size)

    @property
    def indices(self) -> np.ndarray:
        """Each column's multi-index over a site's members ``(P, w)``."""
        site = self.features.sites[0]
        return site.indices[np.isin(np.arange(site.size), self._order[self._layout.columns])]

    @cached_property
    def _order(self) -> np.ndarray:
        return np.argsort((self.features.sites[0].indices > 0).sum(axis=1), kind="stable")

    def _evaluate(self, x: np.ndarray, gradients: bool) -> tuple[np.ndarray, np.ndarray]:
        members, parent, last, power, columns, position, degree = self._layout
        y = self.coordinate.mapped(x)
        values, derivs = self._tables_of(y, int(power.max(initial=0)))
        out = np.zeros((x.shape[0], columns.size))
        _site_products(values, members, parent, last, power, columns, out)
        sums = np.zeros((x.shape[1], columns.size))
        if gradients:
            _gradient_sums(values, derivs, members, position, degree, sums)
            sums /= self.coordinate.scale
        return out, sums

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``I(x)`` at ``x (n, d)``: ``(n, P)``."""
        return self._evaluate(np.asarray(x, dtype=np.float64), False)[0]

    def values_and_divergence_sums(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``I(x)`` ``(n, P)`` and ``Σ_n ∂_j I_a(x_n)`` ``(d, P)``."""
        return self._evaluate(np.asarray(x, dtype=np.float64), True)


def pooled(coordinates: tuple[Coordinate, ...]) -> Coordinate:
    """One coordinate for all ``coordinates`` (of one family): their mean scale, and their mean
    location (a Laguerre family's shift: the least, so every component stays above it)."""
    family = coordinates[0].family
    if any(type(c.family) is not type(family) for c in coordinates):
        raise ValueError("site sums need one coordinate family for all the components")
    locs = [c.loc for c in coordinates]
    loc = min(locs) if isinstance(family, Laguerre) else float(np.mean(locs))
    return Coordinate(family, loc, float(np.mean([c.scale for c in coordinates])))


@compiled
def _site_products(
    values: np.ndarray,
    members: np.ndarray,
    parent: np.ndarray,
    last: np.ndarray,
    power: np.ndarray,
    columns: np.ndarray,
    out: np.ndarray,
) -> None:
    """``out[r, u] = Σ_i φ_{columns[u]}`` at row ``r``, each site's features built from their
    parents, one factor each: ``φ_k = φ_{parent[k]} · values[r, members[i, last[k]],
    power[k]]`` (the constant: 1)."""
    product = np.empty(parent.size)
    for r in range(values.shape[0]):
        for i in range(members.shape[0]):
            for k in range(parent.size):
                if parent[k] < 0:
                    product[k] = 1.0
                else:
                    product[k] = product[parent[k]] * values[r, members[i, last[k]], power[k]]
            for u in range(columns.size):
                out[r, u] += product[columns[u]]


@compiled
def _gradient_sums(
    values: np.ndarray,
    derivs: np.ndarray,
    members: np.ndarray,
    position: np.ndarray,
    degree: np.ndarray,
    sums: np.ndarray,
) -> None:
    """``sums[c, a] += ∂_c Σ_i Π_j values[r, members[i, position[a, j]], degree[a, j]]`` over
    the rows ``r`` (``y`` units; the product rule, from the products of the factors before and
    after each entry)."""
    slots = position.shape[1]
    factor = np.empty(slots)
    slope = np.empty(slots)
    component = np.empty(slots, dtype=np.int64)
    before = np.empty(slots + 1)
    for r in range(values.shape[0]):
        for i in range(members.shape[0]):
            for a in range(position.shape[0]):
                before[0] = 1.0
                for j in range(slots):
                    c = members[i, position[a, j]]
                    component[j] = c
                    factor[j] = values[r, c, degree[a, j]]
                    slope[j] = derivs[r, c, degree[a, j]]
                    before[j + 1] = before[j] * factor[j]
                after = 1.0
                for j in range(slots - 1, -1, -1):
                    if slope[j] != 0.0:
                        sums[component[j], a] += before[j] * slope[j] * after
                    after *= factor[j]


__all__ = ["PROBE_ROWS", "SITE_SUM_DEGREE", "SiteSums", "pooled"]
