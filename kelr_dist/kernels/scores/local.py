"""Local score matching: each component's score fitted on the features of its own neighbourhood.

Hyvärinen's loss (:mod:`kelr_dist.kernels.scores.score_matching`) is a sum over components,

    J = Σ_i E[ ½ s_i(X)² + ∂_i s_i(X) ],

so each ``s_i`` can be fitted alone. On a field (a variable on a lattice, a chain of dihedrals)
the score of site ``i`` depends mostly on the sites near it: ``s_i(x) = w_i · φ_i(x_{N(i)})``
with ``φ_i`` the polynomial features (:class:`~kelr_dist.kernels.scores.score_matching.
PolynomialFeatures`) of the components ``N(i)`` (``i`` first, nearer ones first). Its normal
equations are those of one small fit per site, ``w_i = -G_i⁻¹ b_i`` with ``G_i = E[φ_i φ_iᵀ]``
and ``b_i = E[∂_i φ_i]``: the Gram pass sums ``d`` blocks of ``P_i x P_i`` per held-out fold, so
the cost grows as ``d P²``, not as the ``C(q + d, d)²`` of the full tensor set.

Neighbourhoods (:class:`Neighbourhoods`) are declared (a ring, a periodic grid, an explicit
adjacency; :func:`declared_neighbourhoods`) or, when nothing is declared, found in the data
(:func:`partners_from_covariance`: the largest partial correlations, from the precision matrix of
the survey's covariance). Either way they come in *radii*: the ball of radius ``r`` of site
``i`` holds its first ``sizes[i][r]`` components (graph distance ``≤ r`` for a declared
structure, the ``r`` strongest partners for the data's). The radius and the degree are chosen by
the held-out loss, with the one-standard-error rule over folds of
:func:`~kelr_dist.kernels.scores.score_matching.choose_candidate` (the simplest: fewest
features); one Gram pass at the largest radius and degree holds every candidate's sums.

With ``symmetry="translation"`` (a ring or a periodic grid) every site uses the same weights:
the loss is then that of one fit whose ``G`` and ``b`` are the sums over sites.

An adaptive index set (:func:`adaptive_features`, :func:`grow_local`) spends the same Gram cost
unevenly: a dictionary of lower total degrees and of single components and pairs to a higher
degree, in which a downward-closed set is grown from the chosen radius and degree by held-out
loss (:func:`~kelr_dist.kernels.scores.index_sets.grow_blocks`), one set for the sites of each
neighbourhood shape (all of them when tied).

Reference: A. Hyvärinen, "Estimation of non-normalized statistical models by score matching",
J. Mach. Learn. Res. 6 (2005) 695–709 (the loss); the decoupling over components of a
pseudo-likelihood-like objective on a graph is that of J. Besag, "Statistical analysis of
non-lattice data", The Statistician 24 (1975) 179–195.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

import numpy as np

from kelr_dist.kernels.bases.families import Coordinate, multi_indices, polynomials
from kelr_dist.kernels.compiled import compiled
from kelr_dist.kernels.reduction import BlockInfo, Reduction
from kelr_dist.kernels.scores.folds import Folds, combine_by_fold, fold_stderr, sums_by_fold
from kelr_dist.kernels.scores.index_sets import GrowthPath, axes_and_pairs, edge_falls, grow_blocks
from kelr_dist.kernels.scores.kernel_embedding import row_blocks
from kelr_dist.kernels.scores.score_matching import (
    FEATURE_ROWS,
    RIDGES,
    Candidate,
    PolynomialFeatures,
    ScaledGram,
    choose_candidate,
    solve_weights,
)

#: features of one site's model at most when the number of samples is not given (its Gram
#: block, the solve per site and fold); with it, :func:`site_budget`
LOCAL_MAX_FEATURES = 84
#: a site's budget is at most ``c N_eff^(1/3)`` features, c this constant, for the ``N_eff``
#: rows its fit sees (all sites' rows when tied): the series-estimator rate of W. K. Newey,
#: J. Econometrics 79 (1997) 147-168 (Assumption 3, power series: ``K³/N → 0``), as for the
#: tensor model's grown set
SITE_FEATURES_PER_CUBE_ROOT = 5.0
#: the largest radius of a declared structure (graph distance) tried
DECLARED_RADIUS = 2
#: partners a site may take from the data (the radius of a neighbourhood found in the data)
DATA_PARTNERS = 4
#: the highest degree tried at any radius
LOCAL_MAX_DEGREE = 8
#: the highest degree the adaptive index set's single components and pairs reach
LOCAL_MAX_REACH = 2 * LOCAL_MAX_DEGREE
SYMMETRIES = ("none", "translation")
#: from this many components on, score matching is local unless an index set is given: the full
#: tensor model's feature budget (``SM_MAX_FEATURES``) then reaches only total degree 2 (a
#: quadratic score), while a site's own neighbourhood still affords degree 3 to 8
LOCAL_DIMENSION = 10


@dataclass(frozen=True)
class Neighbourhoods:
    """Per site ``i``, the components its score may depend on (``i`` first, nearer first),
    ``members[i]``, and the size of its ball of radius ``r``, ``sizes[i][r]`` (``r = 0``: the
    site alone). The members past the widest ball, ``members[i][sizes[i][-1]:]``, are its
    *shell*, the components at the next radius: no candidate uses them, only the richer model of
    the sensitivity check (:attr:`LocalChoice.neighbours`). ``source`` says where they come from;
    ``lattice`` whether every site has the same shape, its members at the same relative positions
    (a ring or a periodic grid)."""

    members: tuple[tuple[int, ...], ...]
    sizes: tuple[tuple[int, ...], ...]
    source: str
    lattice: bool = False

    @property
    def radius(self) -> int:
        """The largest radius, common to all sites."""
        return len(self.sizes[0]) - 1

    def describe(self, names: Sequence[str]) -> str:
        """One line: the source and the neighbourhood of the first site."""
        first = ", ".join(names[k] for k in self.members[0][: self.sizes[0][-1]])
        return f"{self.source} (site {names[0]}: {first})"


def _by_distance(adjacency: list[set[int]], radius: int) -> Neighbourhoods:
    """Balls of graph distance ``≤ radius`` and the shell at ``radius + 1``, breadth first, in
    index order within a shell."""
    members, sizes = [], []
    for site in range(len(adjacency)):
        seen, shell, order, size = {site}, [site], [site], [1]
        for r in range(radius + 1):
            shell = sorted({k for j in shell for k in adjacency[j]} - seen)
            seen.update(shell)
            order += shell
            if r < radius:
                size.append(len(order))
        members.append(tuple(order))
        sizes.append(tuple(size))
    return Neighbourhoods(tuple(members), tuple(sizes), "adjacency")


def _offsets(shape: tuple[int, ...], radius: int) -> list[tuple[tuple[int, ...], ...]]:
    """Lattice offsets by shell (Manhattan distance ``1..radius``), in a fixed order."""
    shells = []
    for r in range(1, radius + 1):
        ranges = [range(-r, r + 1)] * len(shape)
        shells.append(tuple(o for o in sorted(itertools.product(*ranges)) if sum(map(abs, o)) == r))
    return shells


def lattice(shape: tuple[int, ...], radius: int = DECLARED_RADIUS) -> Neighbourhoods:
    """A periodic lattice of ``shape`` (a ring: one entry), sites in C order, neighbourhoods of
    Manhattan distance ``≤ radius`` and the shell at ``radius + 1`` at the same relative offsets
    at every site (sites that coincide on a small lattice are kept once)."""
    shells = _offsets(shape, radius + 1)
    count = math.prod(shape)
    members, sizes = [], []
    for site in range(count):
        at = np.unravel_index(site, shape)
        order, size = [site], [1]
        for r, shell in enumerate(shells):
            for offset in shell:
                k = int(np.ravel_multi_index(tuple(np.add(at, offset) % shape), shape))
                if k not in order:
                    order.append(k)
            if r < radius:
                size.append(len(order))
        members.append(tuple(order))
        sizes.append(tuple(size))
    name = "ring" if len(shape) == 1 else f"grid({','.join(map(str, shape))})"
    return Neighbourhoods(tuple(members), tuple(sizes), name, lattice=len(set(sizes)) == 1)


_GRID = re.compile(r"^grid\((\d+(?:\s*,\s*\d+)*)\)$")


def declared_neighbourhoods(spec: Any, names: Sequence[str], what: str) -> Neighbourhoods:
    """The neighbourhoods a user declares for components ``names``: ``"ring"``,
    ``"grid(n1,n2,...)"`` (periodic, C order), a mapping of each component's name to its
    neighbours' names, a list of neighbour index lists (one per component), or the JSON text of
    one of these (a store attribute). ``what`` names the option in the error.

    Raises ``ValueError`` (one line naming ``what``) for a spec that does not match the
    components: a lattice of another size, unknown names, a missing or extra component."""
    d = len(names)
    if isinstance(spec, str) and spec.strip().startswith(("{", "[")):
        try:
            spec = json.loads(spec)
        except ValueError:
            raise ValueError(f"{what}: not valid JSON: {spec!r}") from None
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text == "ring":
            if d < 3:
                raise ValueError(f"{what}='ring' needs at least 3 components, the data have {d}")
            return lattice((d,))
        found = _GRID.match(text)
        if found is None:
            raise ValueError(
                f"{what}: expected 'ring', 'grid(n1,n2)', a mapping of component names to "
                f"their neighbours or a list of neighbour lists, got {spec!r}"
            )
        shape = tuple(int(v) for v in found.group(1).split(","))
        if math.prod(shape) != d or min(shape) < 1:
            raise ValueError(
                f"{what}={spec!r} has {math.prod(shape)} sites, the data have {d} components"
            )
        return lattice(shape)
    position = {name: k for k, name in enumerate(names)}
    if isinstance(spec, dict):
        unknown = [str(k) for k in spec if str(k) not in position]
        unknown += [str(v) for vs in spec.values() for v in vs if str(v) not in position]
        if unknown:
            raise ValueError(f"{what}: {', '.join(map(repr, unknown))} not among the components")
        missing = [n for n in names if n not in {str(k) for k in spec}]
        if missing:
            raise ValueError(f"{what}: no neighbours given for {', '.join(map(repr, missing))}")
        given = {str(k): v for k, v in spec.items()}
        lists = [[position[str(v)] for v in given[n]] for n in names]
    elif isinstance(spec, list | tuple):
        if len(spec) != d:
            raise ValueError(f"{what} has {len(spec)} neighbour lists, the data {d} components")
        lists = [[int(v) for v in vs] for vs in spec]
        if any(not 0 <= v < d for vs in lists for v in vs):
            raise ValueError(f"{what}: neighbour indices must be in 0..{d - 1}")
    else:
        raise ValueError(f"{what}: expected a string, a mapping or a list, got {spec!r}")
    adjacency: list[set[int]] = [set() for _ in range(d)]
    for site, partners in enumerate(lists):
        for k in partners:
            if k != site:
                adjacency[site].add(k)
                adjacency[k].add(site)
    return _by_distance(adjacency, DECLARED_RADIUS)


def partners_from_covariance(
    covariance: np.ndarray, partners: int = DATA_PARTNERS
) -> Neighbourhoods:
    """Neighbourhoods found in the data: each site's ``partners`` components of largest
    absolute partial correlation ``-Θ_ij / sqrt(Θ_ii Θ_jj)``, ``Θ`` the precision matrix of the
    ``covariance (d, d)`` (pseudo-inverse: a singular covariance gives no error), strongest first;
    the ball of radius ``r`` is the site and its ``r`` strongest partners, the shell the next
    one."""
    d = covariance.shape[0]
    precision = np.linalg.pinv(np.atleast_2d(covariance))
    diagonal = np.sqrt(np.abs(np.diag(precision)))
    diagonal[diagonal == 0] = 1.0
    partial_corr = np.abs(precision / diagonal[:, None] / diagonal[None, :])
    np.fill_diagonal(partial_corr, -np.inf)
    count = min(partners, d - 1)
    members, sizes = [], []
    for site in range(d):
        ranked = np.argsort(-partial_corr[site], kind="stable")[: min(count + 1, d - 1)]
        members.append((site, *(int(k) for k in ranked)))
        sizes.append(tuple(range(1, count + 2)))
    return Neighbourhoods(tuple(members), tuple(sizes), "partial correlations")


def site_budget(n_samples: int, dim: int, tied: bool, flops: float) -> int:
    """Features of one site's model at most: ``c N_eff^(1/3)``
    (:data:`SITE_FEATURES_PER_CUBE_ROOT`) for the rows ``N_eff`` its fit sees — the ``N_used``
    rows the Gram pass reads, times ``d`` when the sites' weights are tied — where the pass
    reads all ``N`` samples, or the ``flops / (2 d P²)`` it is thinned to when its ``2 d P²``
    flops per row exceed ``flops`` (:func:`kelr_dist.pipeline.steps.gram_stride`). So the
    budget grows as ``N^(1/3)`` up to ``(c³ flops / 2d)^(1/5)`` (tied: ``(c³ flops / 2)^(1/5)``),
    where the stated cost of the pass holds it; at least 4 (the constant and the linear
    features of a site and its two nearest)."""
    by_rows, by_cost = _site_bounds(n_samples, dim, tied, flops)
    return max(int(min(by_rows, by_cost)), 4)


def held_by_cost(n_samples: int, dim: int, tied: bool, flops: float) -> bool:
    """Whether :func:`site_budget` is held by the Gram pass's cost rather than by the samples:
    more samples then do not raise it."""
    by_rows, by_cost = _site_bounds(n_samples, dim, tied, flops)
    return by_cost < by_rows


def _site_bounds(n_samples: int, dim: int, tied: bool, flops: float) -> tuple[float, float]:
    """:func:`site_budget`'s two bounds: by the rows its fit sees, and by the pass's cost."""
    c = SITE_FEATURES_PER_CUBE_ROOT
    sites = dim if tied else 1
    by_rows = c * (max(n_samples, 1) * sites) ** (1.0 / 3.0)
    by_cost = (c**3 * flops * sites / (2.0 * dim)) ** (1.0 / 5.0)
    return by_rows, by_cost


def degree_caps(
    neighbourhoods: Neighbourhoods, max_features: int = LOCAL_MAX_FEATURES
) -> list[int]:
    """The highest degree tried at each radius: the largest ``q ≤`` :data:`LOCAL_MAX_DEGREE`
    whose total-degree set on the largest ball of that radius has at most ``max_features``
    features (0: the radius is too wide for any degree)."""
    caps = []
    for r in range(neighbourhoods.radius + 1):
        size = max(s[r] for s in neighbourhoods.sizes)
        q = 0
        while q < LOCAL_MAX_DEGREE and math.comb(q + 1 + size, size) <= max_features:
            q += 1
        caps.append(q)
    return caps


def _site_indices(
    sizes: tuple[int, ...], width: int, caps: tuple[int, ...], reach: int
) -> np.ndarray:
    """A site's multi-indices over its ``width`` members (:class:`LocalFeatures`), by total
    degree, then its shell's (:func:`_shell_indices`) last."""
    inner = sizes[-1]
    rows = {
        tuple(int(v) for v in m)
        for r, q in enumerate(caps)
        if q > 0
        for m in multi_indices([q] * sizes[r] + [0] * (width - sizes[r]), q)
    }
    if reach > 0:
        rows |= {(*m, *(0,) * (width - inner)) for m in axes_and_pairs(inner, reach)}
    ordered = sorted(rows, key=lambda m: (sum(m), m[::-1]))
    return np.asarray(ordered + _shell_indices(inner, width))


def _shell_indices(inner: int, width: int) -> list[tuple[int, ...]]:
    """The features a shell component ``k`` (members ``inner..width - 1``) adds to the richer
    model of the sensitivity check: its first two polynomials and its product with the site's
    own first, ``x_k``, ``x_k²``, ``x_i x_k`` (downward closed with any set holding the site's
    linear feature)."""
    out = []
    for k in range(inner, width):
        for entries in ({k: 1}, {k: 2}, {0: 1, k: 1}):
            out.append(tuple(entries.get(j, 0) for j in range(width)))
    return out


def _widest(neighbourhoods: Neighbourhoods, caps: tuple[int, ...], reach: int) -> int:
    """Features of the widest site of these caps and reach."""
    pairs = zip(neighbourhoods.sizes, neighbourhoods.members, strict=True)
    shapes = {(sizes, len(members)) for sizes, members in pairs}
    return max(len(_site_indices(s, width, caps, reach)) for s, width in shapes)


def adaptive_features(
    neighbourhoods: Neighbourhoods,
    coordinates: tuple[Coordinate, ...],
    budget: int,
    share: float,
    tied: bool = False,
) -> LocalFeatures:
    """The dictionary a local adaptive index set grows in, at the Gram cost of the total-degree
    model of the same ``budget``: total degrees capped by ``share`` of the budget
    (:func:`degree_caps`) and, on each site's whole neighbourhood, single components and pairs to
    the highest degree ``reach ≤`` :data:`LOCAL_MAX_REACH` with which no site has more features
    than the total-degree model's widest site (:func:`degree_caps` of the whole budget)."""
    fixed = _widest(neighbourhoods, tuple(degree_caps(neighbourhoods, budget)), 0)
    caps = tuple(degree_caps(neighbourhoods, int(share * budget)))
    reach = max(caps[-1], 1)
    while reach < LOCAL_MAX_REACH and _widest(neighbourhoods, caps, reach + 1) <= fixed:
        reach += 1
    return LocalFeatures(neighbourhoods, coordinates, caps, tied, reach)


@dataclass(frozen=True)
class LocalFeatures:
    """Per site, the features of its neighbourhood: the union over radii ``r`` of the
    total-degree sets of degree ``caps[r]`` on the ball of radius ``r`` and, with ``reach > 0``
    (the dictionary of an adaptive index set, :func:`adaptive_features`), every index of at most
    two nonzero entries and total degree ``≤ reach`` on the whole neighbourhood; last, the
    shell's features (:func:`_shell_indices`), which only the sensitivity check's richer model
    uses. ``tied``: one set of weights for all sites (translation symmetry)."""

    neighbourhoods: Neighbourhoods
    coordinates: tuple[Coordinate, ...]
    caps: tuple[int, ...]
    tied: bool = False
    reach: int = 0

    @property
    def adaptive(self) -> bool:
        """Whether the index set is grown in these features by held-out loss."""
        return self.reach > 0

    @cached_property
    def sites(self) -> tuple[PolynomialFeatures, ...]:
        out = []
        for members, sizes in zip(
            self.neighbourhoods.members, self.neighbourhoods.sizes, strict=True
        ):
            coords = tuple(self.coordinates[k] for k in members)
            indices = _site_indices(sizes, len(members), self.caps, self.reach)
            out.append(PolynomialFeatures.of_indices(coords, indices))
        return tuple(out)

    @property
    def dim(self) -> int:
        return len(self.coordinates)

    @property
    def size(self) -> int:
        """Features of all sites (of one, when tied)."""
        return self.sites[0].size if self.tied else sum(f.size for f in self.sites)

    @property
    def width(self) -> int:
        """Features of the widest site (the Gram blocks are padded to it)."""
        return max(f.size for f in self.sites)

    @property
    def gram_size(self) -> int:
        """The size of one Gram matrix with the work of all the sites' blocks per row."""
        return math.isqrt(sum(f.size**2 for f in self.sites))

    @property
    def degree(self) -> int:
        return max(*self.caps, self.reach)

    @property
    def max_degrees(self) -> tuple[int, ...]:
        """Highest degree per component over the sites that use it, ``(d,)``."""
        top = [0] * self.dim
        for members, f in zip(self.neighbourhoods.members, self.sites, strict=True):
            for k, m in zip(members, f.max_degrees, strict=True):
                top[k] = max(top[k], m)
        return tuple(top)

    def inner_size(self, site: int) -> int:
        """Features of ``site`` on its widest ball: all but its shell's."""
        members, sizes = self.neighbourhoods.members[site], self.neighbourhoods.sizes[site]
        return self.sites[site].size - 3 * (len(members) - sizes[-1])

    def inner_site(self, site: int) -> PolynomialFeatures:
        """``site``'s features without its shell's: the dictionary its candidates and growth
        use."""
        f = self.sites[site]
        return PolynomialFeatures.of_indices(f.coordinates, f.indices[: self.inner_size(site)])

    def shell(self) -> np.ndarray:
        """``(d, width)`` bool: each site's shell features (:func:`_shell_indices`)."""
        out = np.zeros((self.dim, self.width), dtype=bool)
        for i, f in enumerate(self.sites):
            out[i, self.inner_size(i) : f.size] = True
        return out

    def mask(self, radius: int, degree: int) -> np.ndarray:
        """``(d, width)`` bool: each site's features on its ball of ``radius`` of total degree
        ``≤ degree`` (padding: False)."""
        out = np.zeros((self.dim, self.width), dtype=bool)
        for i, (sizes, f) in enumerate(zip(self.neighbourhoods.sizes, self.sites, strict=True)):
            m = f.indices
            out[i, : f.size] = (m[:, sizes[radius] :].sum(axis=1) == 0) & (m.sum(axis=1) <= degree)
        return out

    @cached_property
    def support(self) -> tuple[np.ndarray, np.ndarray]:
        """Each site's :attr:`~kelr_dist.kernels.scores.score_matching.PolynomialFeatures.support`
        with its entries as components of ``x``: components and degrees, each ``(d, W, s)``
        (padding, of the absent features too: the site's own component at degree 0, whose
        polynomial is 1). A component's polynomials are those of its coordinate at every site."""
        slots = max(f.support[0].shape[1] for f in self.sites)
        component = np.zeros((self.dim, self.width, slots), dtype=np.int64)
        degree = np.zeros_like(component)
        for i, (members, f) in enumerate(zip(self.neighbourhoods.members, self.sites, strict=True)):
            coordinate, m = f.support
            component[i] = i
            component[i, : f.size, : coordinate.shape[1]] = np.asarray(members)[coordinate]
            degree[i, : f.size, : coordinate.shape[1]] = m
        return component, degree


def local_gram_sums(
    features: LocalFeatures, x: np.ndarray, start: int = 0, stride: int = 1
) -> dict[str, np.ndarray | int]:
    """Per site ``i``, partial sums of ``G_i`` and ``b_i = Σ ∂_i φ_i`` over the rows of
    ``x (n, d)`` whose time index ``start + row`` is a multiple of ``stride``:
    ``{"gram": (d, W, W), "b": (d, W), "n": n'}`` (``W``: the widest site, zero-padded)."""
    rows_used = x[-start % stride :: stride]
    width = features.width
    gram = np.zeros((features.dim, width, width))
    b = np.zeros((features.dim, width))
    for rows in row_blocks(rows_used.shape[0], FEATURE_ROWS):
        block = rows_used[rows]
        for i, (members, f) in enumerate(
            zip(features.neighbourhoods.members, features.sites, strict=True)
        ):
            phi, own = f.values_and_derivative_sums(block[:, members], 0)
            gram[i, : f.size, : f.size] += phi.T @ phi
            b[i, : f.size] += own
    return {"gram": gram, "b": b, "n": rows_used.shape[0]}


def _chunk(
    features: LocalFeatures,
    folds: Folds,
    stride: int,
    x: np.ndarray,
    info: BlockInfo,
    _halo: np.ndarray | None,
) -> list[dict]:
    def empty() -> dict[str, Any]:
        width = features.width
        return {
            "gram": np.zeros((features.dim, width, width)),
            "b": np.zeros((features.dim, width)),
            "n": 0,
        }

    return sums_by_fold(folds, empty, partial(local_gram_sums, features, stride=stride), x, info)


@dataclass(frozen=True)
class LocalSums:
    """Per held-out fold and site, ``Σ φ_i φ_iᵀ`` ``(K, d, W, W)``, ``Σ ∂_i φ_i`` ``(K, d, W)``
    and rows ``(K,)``."""

    features: LocalFeatures
    gram: np.ndarray
    b: np.ndarray
    n: np.ndarray

    @classmethod
    def from_partials(cls, features: LocalFeatures, parts: list[dict]) -> LocalSums:
        return cls(
            features,
            np.stack([p["gram"] for p in parts]),
            np.stack([p["b"] for p in parts]),
            np.array([int(p["n"]) for p in parts]),
        )

    @cached_property
    def _totals(self) -> tuple[np.ndarray, np.ndarray]:
        """``(Σ G, Σ b)`` over every fold."""
        return self.gram.sum(axis=0), self.b.sum(axis=0)

    def means(
        self, fold: int | None = None, left_out: bool = False, sites: list[int] | None = None
    ) -> tuple[np.ndarray, ...]:
        """``(G (d, W, W), b (d, W))`` as means over all rows, over ``fold`` alone, or
        (``left_out``) over every fold but ``fold``: the sums over every fold less the fold's,
        so the fits of the choice hold one ``(d, W, W)`` array besides the folds' own, not one
        per fold. ``sites``: those sites' rows alone (``(len(sites), W, W)``, ``(len(sites),
        W)``)."""
        on = slice(None) if sites is None else sites
        gram, b = (total[on] for total in self._totals)
        if fold is None:
            return gram / self.n.sum(), b / self.n.sum()
        if not left_out:
            return self.gram[fold][on] / self.n[fold], self.b[fold][on] / self.n[fold]
        n = self.n.sum() - self.n[fold]
        return (gram - self.gram[fold][on]) / n, (b - self.b[fold][on]) / n

    def fit(
        self, members: np.ndarray, ridges: Sequence[float], without: int | None = None
    ) -> list[np.ndarray]:
        """Per ridge, the weights ``(d, W)`` of the features ``members (d, W)`` fitted on every
        fold (or every fold but ``without``); tied: one fit to the sums over sites, the same
        weights at every site."""
        gram, b = self.means(without, left_out=True)
        out = [np.zeros(b.shape) for _ in ridges]
        keep = members[0]
        if not self.features.tied and (members == keep).all():  # one stacked solve
            g = gram[:, keep][:, :, keep]
            for r, w in enumerate(solve_weights(g, b[:, keep][:, None], tuple(ridges))):
                out[r][:, keep] = w[:, 0]
            return out
        sites = np.arange(self.features.dim)
        groups = [sites] if self.features.tied else [sites[i : i + 1] for i in sites]
        for group in groups:
            keep = members[group[0]]
            g = gram[group].sum(axis=0)[np.ix_(keep, keep)]
            fits = solve_weights(g, b[group].sum(axis=0)[keep][None], tuple(ridges))
            for r, w in enumerate(fits):
                out[r][np.ix_(group, np.flatnonzero(keep))] = w[0]
        return out

    def loss(self, weights: np.ndarray, fold: int | None = None) -> float:
        """Hyvärinen's loss of ``weights (d, W)`` on ``fold`` (all rows: ``None``), each site's
        term in its standardized coordinate (the scale of :func:`hyvarinen_loss`)."""
        gram, b = self.means(fold)
        scales = np.array([c.scale for c in self.features.coordinates])
        w, b = weights * scales[:, None], b * scales[:, None]  # as hyvarinen_loss scales them
        return float(np.sum(w * (0.5 * (gram @ w[:, :, None])[:, :, 0] + b)))


def local_gram_reduction(features: LocalFeatures, folds: Folds, stride: int = 1) -> Reduction:
    """The local score-matching pass: chunk = :func:`local_gram_sums` per held-out fold, combine
    = ``+``, finalize = :class:`LocalSums`."""
    return Reduction(
        name="local gram",
        chunk=partial(_chunk, features, folds, stride),
        combine=combine_by_fold,
        finalize=partial(LocalSums.from_partials, features),
    )


@dataclass(frozen=True)
class LocalScoreModel:
    """A fitted local score: ``s_i(x) = w_i · φ_i(x_{N(i)})`` per site, defined everywhere (a
    :class:`~kelr_dist.kernels.response.operator.Score`)."""

    features: LocalFeatures
    weights: np.ndarray  # (d, W)

    @cached_property
    def keep(self) -> np.ndarray:
        """``(d, W)`` bool: per site the features its weights use, those of the chosen radius
        and degree (the weights of the Gram pass's other features are zero) and the constant,
        so a score costs what the chosen model holds, not what the pass summed."""
        keep = self.weights != 0
        keep[:, 0] = True  # the constant: never an empty set
        return keep

    @cached_property
    def max_degrees(self) -> np.ndarray:
        """Highest degree per component over the features :attr:`keep`, ``(d,)``."""
        component, degree = self.features.support
        top = np.zeros(self.features.dim, dtype=np.int64)
        np.maximum.at(top, component[self.keep], degree[self.keep])
        return top

    @cached_property
    def gathered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The entries of the features :attr:`keep`, site after site: components and degrees,
        each ``(P, s)`` (``s``: the most any of them has), and where each site's begin and
        end, ``(d + 1,)``."""
        component, degree = self.features.support
        slots = max(int((degree[self.keep] > 0).sum(axis=1).max()), 1)
        bounds = np.concatenate([[0], np.cumsum(self.keep.sum(axis=1))])
        return component[self.keep][:, :slots], degree[self.keep][:, :slots], bounds

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return LocalScoreModel.many([self], x)[0]

    @staticmethod
    def many(
        models: Sequence[LocalScoreModel], x: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each model at ``x (n, d)``, as its call gives it, sharing work: each component's
        polynomials once per row block, to the highest degree any model needs there (per
        component and coordinate: models on other coordinates have tables of their own), and
        the models that use the same features (an estimate and its refits without each fold)
        their values, each site's dotted with their weights side by side."""
        x = np.asarray(x, dtype=np.float64)
        tables: dict[tuple[int, Coordinate], int] = {}  # (component, coordinate) -> its column
        top: list[int] = []
        columns: dict[LocalFeatures, np.ndarray] = {}
        for model in models:
            if model.features not in columns:
                coordinates = model.features.coordinates
                columns[model.features] = np.array(
                    [tables.setdefault((k, c), len(tables)) for k, c in enumerate(coordinates)]
                )
                top += [0] * (len(tables) - len(top))
            for column, need in zip(columns[model.features], model.max_degrees, strict=True):
                top[column] = max(top[column], int(need))
        groups: dict[tuple[LocalFeatures, bytes], list[int]] = {}
        for k, model in enumerate(models):
            groups.setdefault((model.features, model.keep.tobytes()), []).append(k)
        plans = []
        for (features, _), group in groups.items():
            component, degree, bounds = models[group[0]].gathered
            weights = np.stack([models[k].weights[models[k].keep] for k in group])  # (M, P)
            plans.append((group, columns[features][component], degree, bounds, weights))
        values = np.empty((len(models), x.shape[0], x.shape[1]))
        for rows in row_blocks(x.shape[0], FEATURE_ROWS):
            table = _polynomial_tables(x[rows], list(tables), top)
            for group, component, degree, bounds, weights in plans:
                for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                    phi = np.empty((b - a, table.shape[2]))
                    _feature_products(table, component[a:b], degree[a:b], phi)
                    values[group, rows, i] = weights[:, a:b] @ phi
        kept = np.ones(x.shape[0], dtype=bool)
        return [(values[k], kept) for k in range(len(models))]


def _polynomial_tables(
    x: np.ndarray, columns: list[tuple[int, Coordinate]], top: list[int]
) -> np.ndarray:
    """The polynomials of each ``(component, coordinate)`` of ``columns`` at ``x (n, d)`` up to
    its degree in ``top``, ``(len(columns), max(top) + 1, n)`` (zero above it; rows last: a
    polynomial's values are contiguous)."""
    out = np.zeros((len(columns), max(top, default=0) + 1, x.shape[0]))
    for j, ((k, coordinate), degree) in enumerate(zip(columns, top, strict=True)):
        values, _ = polynomials(coordinate.family, coordinate.mapped(x[:, k]), degree)
        out[j, : degree + 1] = values.T
    return out


@compiled
def _feature_products(
    table: np.ndarray, component: np.ndarray, degree: np.ndarray, phi: np.ndarray
) -> None:
    """``phi[a] = Π_j table[component[a, j], degree[a, j]]`` ``(P, n)``, over each feature's
    entries up to its first of degree 0 (the padding; the constant: its first), row after row
    along the contiguous rows of ``table (T, D + 1, n)``."""
    for a in range(component.shape[0]):
        out = phi[a]
        out[:] = table[component[a, 0], degree[a, 0]]
        for j in range(1, component.shape[1]):
            if degree[a, j] == 0:
                break
            factor = table[component[a, j], degree[a, j]]
            for r in range(out.shape[0]):
                out[r] *= factor[r]


@dataclass(frozen=True)
class LocalCandidate(Candidate):
    """A local candidate: ``radius`` of the neighbourhoods, ``degree``, ridge, and its
    ``features`` (all sites', one site's when tied) for the simplicity order."""

    radius: int = 0
    features: int = 0


def _simplest(c: Candidate) -> tuple[int, int, float]:
    assert isinstance(c, LocalCandidate)
    return c.features, c.degree, c.ridge


@dataclass(frozen=True)
class LocalGrowth:
    """A local adaptive index set: per group of sites with the same dictionary (every site when
    tied; the sites of the same neighbourhood shape otherwise), its sites and the path of the set
    they share, grown by their summed held-out loss (:func:`grow_local`)."""

    groups: tuple[tuple[int, ...], ...]
    paths: tuple[GrowthPath, ...] = field(repr=False)

    def members(self, features: LocalFeatures, later: int = 0) -> np.ndarray:
        """``(d, width)`` bool: each site's features in its group's chosen set, or ``later``
        steps on along the path (at most its last)."""
        out = np.zeros((features.dim, features.width), dtype=bool)
        for sites, path in zip(self.groups, self.paths, strict=True):
            step = min(path.chosen_step() + later, len(path.losses) - 1)
            chosen = path.members(step)
            out[np.ix_(np.asarray(sites), np.arange(chosen.size))] = chosen
        return out


def grow_local(sums: LocalSums, start: np.ndarray) -> LocalGrowth:
    """Grow each group's index set (:class:`LocalGrowth`) from ``start (d, width)`` (downward
    closed, the same for the sites of a group) inside the features of ``sums``
    (:func:`~kelr_dist.kernels.scores.index_sets.grow_blocks`). Tied, the group's one block is
    the fit to the sums over sites; untied, every site of the group is a block of its own, fitted
    alone: the set, not the weights, is shared, chosen by the loss of all of them. Each site's
    term of the held-out loss is in its standardized coordinate (:meth:`LocalSums.loss`)."""
    features = sums.features
    shapes: dict[tuple[int, ...], list[int]] = {}
    for i, members in enumerate(features.neighbourhoods.members):
        shapes.setdefault((*features.neighbourhoods.sizes[i], len(members)), []).append(i)
    groups = [tuple(range(features.dim))] if features.tied else [tuple(g) for g in shapes.values()]
    weight = np.array([c.scale for c in features.coordinates]) ** 2
    paths = []
    for sites in groups:
        size, rows = features.inner_size(sites[0]), list(sites)
        parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[], []]
        for f in range(len(sums.n)):
            for part, (gram, b) in zip(
                parts,
                (sums.means(f, left_out=True, sites=rows), sums.means(f, sites=rows)),
                strict=True,
            ):
                g, v = gram[:, :size, :size], b[:, None, :size]
                if part is parts[1]:  # the held-out loss in the standardized coordinates
                    g, v = g * weight[rows, None, None], v * weight[rows, None, None]
                if features.tied:
                    g, v = g.sum(axis=0, keepdims=True), v.sum(axis=0, keepdims=True)
                part.append((g, v))
        train, test = (tuple(np.stack(a) for a in zip(*part, strict=True)) for part in parts)
        indices = features.inner_site(sites[0]).indices
        paths.append(grow_blocks(train, test, sums.n, indices, start[sites[0], :size]))
    return LocalGrowth(tuple(groups), tuple(paths))


@dataclass(frozen=True)
class LocalChoice:
    """The local model of the radius, degree and ridge with the least held-out loss (the
    simplest within one standard error), every candidate scored, and the sums they came from;
    with an adaptive index set, the set grown from that radius and degree (``growth``)."""

    model: LocalScoreModel
    pick: LocalCandidate
    candidates: list[Candidate] = field(repr=False)
    sums: LocalSums = field(repr=False)
    path: None = None
    growth: LocalGrowth | None = field(default=None, repr=False)

    @property
    def index_set(self) -> str:
        return "local" if self.growth is None else "local-adaptive"

    @property
    def degree(self) -> int:
        return self.pick.degree

    @property
    def ridge(self) -> float:
        return self.pick.ridge

    @property
    def radius(self) -> int:
        return self.pick.radius

    @property
    def members(self) -> np.ndarray:
        if self.growth is not None:
            return self.growth.members(self.sums.features)
        return self.sums.features.mask(self.radius, self.degree)

    @property
    def condition(self) -> float:
        """The largest condition number of a site's scaled Gram matrix (all rows)."""
        gram, _ = self.sums.means()
        keep = self.members
        return max(
            ScaledGram.of(gram[i][np.ix_(keep[i], keep[i])]).condition for i in range(gram.shape[0])
        )

    def refits(self) -> tuple[LocalScoreModel, ...]:
        """The chosen model refitted without each held-out fold (the jackknife replicates)."""
        return tuple(
            LocalScoreModel(self.sums.features, self.sums.fit(self.members, (self.ridge,), f)[0])
            for f in range(len(self.sums.n))
        )

    def truncation(self) -> tuple[float, float] | None:
        """When the budget, not the data, stopped the model: the chosen degree is the highest
        its radius allowed, held there by the features budget (below
        :data:`LOCAL_MAX_DEGREE`), and the held-out loss fell to it from the next simpler
        candidate (one degree lower, or the radius before at its highest degree); grown, the set
        holds the dictionary's highest degree along a component and the step that added it
        lowered the held-out loss
        (:func:`~kelr_dist.kernels.scores.index_sets.edge_falls`, the largest fall): that fall
        and its paired standard error over folds; else ``None``."""
        if self.growth is not None:
            return self._edge_fall(self.growth)
        caps = self.sums.features.caps
        radius, degree = self.radius, self.degree
        if degree != caps[radius] or degree >= LOCAL_MAX_DEGREE:
            return None
        if degree > 1:
            lower = (radius, degree - 1)
        elif radius > 0 and caps[radius - 1] >= 1:
            lower = (radius - 1, caps[radius - 1])
        else:
            return None

        def best(at: tuple[int, int]) -> Candidate:
            return min(
                (c for c in self.candidates if isinstance(c, LocalCandidate)
                 and (c.radius, c.degree) == at),
                key=lambda c: c.loss,
            )  # fmt: skip

        low, high = best(lower), best((radius, degree))
        if low.loss <= high.loss:
            return None
        return low.loss - high.loss, float(fold_stderr(low.fold_losses - high.fold_losses))

    def _edge_fall(self, growth: LocalGrowth) -> tuple[float, float] | None:
        features, members = self.sums.features, self.members
        falls = [
            fall
            for sites, path in zip(growth.groups, growth.paths, strict=True)
            for _, top, fall in edge_falls(
                features.inner_site(sites[0]), members[sites[0], : path.order.size], path
            )
            if top < LOCAL_MAX_REACH
        ]
        drops = [float(fall @ (self.sums.n / self.sums.n.sum())) for fall in falls]
        if not drops or max(drops) <= 0:
            return None
        top = int(np.argmax(drops))
        return drops[top], float(fold_stderr(falls[top]))

    @cached_property
    def neighbours(self) -> tuple[tuple[LocalScoreModel, ...], str] | None:
        """The chosen model one radius wider; at the widest radius, two degrees higher (to its
        cap) and with the shell's features (:func:`_shell_indices`: the components at the next
        radius, each alone and with the site); grown, two steps further along its path and with
        the shell's features; at the same ridge (``None``: no richer model was fitted). See
        :attr:`kelr_dist.pipeline.steps.ScoreMatchingChoice.neighbours`."""
        features = self.sums.features
        shell = features.shell()
        if self.growth is not None:
            members = self.growth.members(features, later=2) | shell
            what = f"local adaptive set: {int(self.members.sum())} -> {int(members.sum())} features"
        else:
            caps, radius, degree = features.caps, self.radius, self.degree
            if radius + 1 < len(caps) and caps[radius + 1] >= 1:
                radius, degree = radius + 1, min(degree, caps[radius + 1])
                members = features.mask(radius, degree)
            else:
                degree = min(degree + 2, caps[radius])
                members = features.mask(radius, degree) | shell
            what = (
                f"local radius {self.radius} degree {self.degree} -> radius {radius} "
                f"degree {degree}"
            )
            if radius == self.radius and shell.any():
                past = features.neighbourhoods.radius + 1  # the shell's radius
                what += f" and the pairs with the site at radius {past}"
        if (members == self.members).all():
            return None
        model = LocalScoreModel(features, self.sums.fit(members, (self.ridge,))[0])
        return (model,), what


def _held_out(sums: LocalSums, members: np.ndarray, ridges: tuple[float, ...]) -> np.ndarray:
    """``(len(ridges), K)``: the features ``members (d, W)`` fitted on all folds but one, per
    ridge, and scored on that one."""
    losses = np.zeros((len(ridges), len(sums.n)))
    for f in range(len(sums.n)):
        for r, w in enumerate(sums.fit(members, ridges, without=f)):
            losses[r, f] = sums.loss(w, f)
    return losses


def _radius(features: LocalFeatures, members: np.ndarray) -> int:
    """The widest radius of a ball whose components the features ``members (d, W)`` use."""
    radius = 0
    for i, (sizes, f) in enumerate(zip(features.neighbourhoods.sizes, features.sites, strict=True)):
        used = np.flatnonzero(f.indices[members[i, : f.size]].any(axis=0))
        if used.size:
            radius = max(radius, int(np.searchsorted(np.asarray(sizes), used[-1], side="right")))
    return radius


def choose_local(
    sums: LocalSums, degree: int | None = None, ridges: tuple[float, ...] = RIDGES
) -> LocalChoice:
    """Radius, degree (unless given) and ridge by held-out Hyvärinen loss: every candidate fitted
    on all folds but one and scored on that one, summed over sites; the simplest (fewest
    features) within one standard error of the least
    (:func:`~kelr_dist.kernels.scores.score_matching.choose_candidate`). With an adaptive
    dictionary (:attr:`LocalFeatures.adaptive`) and no degree given, the index set is then grown
    from that radius and degree (:func:`grow_local`; the path keeps it unless a larger set lowers
    the held-out loss by more than a standard error) and the ridge chosen again for the grown
    set. No read."""
    features = sums.features
    share = sums.n / sums.n.sum()
    candidates: list[Candidate] = []
    for radius, cap in enumerate(features.caps):
        for q in range(1, cap + 1) if degree is None else [min(degree, cap)] if cap else []:
            members = features.mask(radius, q)
            losses = _held_out(sums, members, ridges)
            count = int(members[0].sum()) if features.tied else int(members.sum())
            candidates += [
                LocalCandidate(q, alpha, float(losses[r] @ share), losses[r], None, radius, count)
                for r, alpha in enumerate(ridges)
            ]
    pick = choose_candidate(candidates, _simplest)
    assert isinstance(pick, LocalCandidate)
    members = features.mask(pick.radius, pick.degree)
    growth = None
    if features.adaptive and degree is None:
        growth = grow_local(sums, members)
        members = growth.members(features)
        losses = _held_out(sums, members, ridges)
        count = int(members[0].sum()) if features.tied else int(members.sum())
        top = int(features.support[1][members].sum(axis=-1).max())
        radius = _radius(features, members)
        grown = [
            LocalCandidate(top, alpha, float(losses[r] @ share), losses[r], None, radius, count)
            for r, alpha in enumerate(ridges)
        ]
        candidates += grown
        pick = choose_candidate(list(grown), _simplest)
        assert isinstance(pick, LocalCandidate)
    model = LocalScoreModel(features, sums.fit(members, (pick.ridge,))[0])
    return LocalChoice(model, pick, candidates, sums, growth=growth)


__all__ = [
    "LOCAL_DIMENSION",
    "LocalCandidate",
    "LocalChoice",
    "LocalFeatures",
    "LocalGrowth",
    "LocalScoreModel",
    "LocalSums",
    "Neighbourhoods",
    "SYMMETRIES",
    "adaptive_features",
    "choose_local",
    "declared_neighbourhoods",
    "degree_caps",
    "grow_local",
    "site_budget",
    "lattice",
    "local_gram_reduction",
    "partners_from_covariance",
]
