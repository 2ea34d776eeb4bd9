"""Score matching in the polynomial basis: ``s(x) = W φ(x)`` by one Gram pass (Hyvärinen 2005).

The response needs only the score ``s = ∇ log p_eq`` (constant forcing: ``B = -s``,
eq. 5). Score matching fits it directly, without a density. For a model
``s_W(x) = W φ(x)`` with features ``φ (P,)`` and weights ``W (d, P)``, Hyvärinen's loss

    J(W) = E[ ½ |s_W(X)|² + ∇·s_W(X) ] = ½ tr(W G Wᵀ) + Σ_j W_j · b_j,
    G = E[φ φᵀ]  (P, P),        b_j = E[∂_j φ]  (P,)

equals the Fisher divergence ``½ E|s_W - s|²`` minus ``½ E|s|²`` (integration by parts, valid when
``p φ → 0`` at the edges of the support), is quadratic in ``W`` and is minimised by
``W_j = -G⁻¹ b_j``. ``G`` and ``b`` are sample means: per block the partial sums ``Σ φ φᵀ`` and
``Σ ∂_j φ`` (a GEMM, the shape of the kernel embedding's coefficient pass), added over blocks.

Features. Tensor products of each coordinate's orthonormal polynomials — ``ψ_m`` (Hermite) or
``ℓ^{(θ)}_m`` (Laguerre) in the same affine maps ``y = (x - loc) / scale`` as the kernel
embedding (:mod:`kelr_dist.kernels.bases.families`), without the weight — over the total-degree set
``|m|_1 ≤ q``, or any downward-closed set of multi-indices (an adaptive set,
:mod:`kelr_dist.kernels.scores.index_sets`). The features of degree ``q' ≤ q`` (of any
downward-closed subset) are a subset, so one pass at the highest degree gives the sums of every
lower degree. The linear features are in the span for
``q ≥ 1``, so the unregularised fit satisfies the sample Stein identity ``Ê[x s_Wᵀ] = -I``
exactly (k̂(0) = I for ``A = x``); degree 1 is the quasi-Gaussian score.

Conditioning and selection. Features orthonormal for a Gaussian are far from orthonormal for a
multimodal or heavy-tailed density at high degree, so the solve goes through the
eigen-decomposition of ``G`` scaled to unit diagonal (:class:`ScaledGram`; eigenvalues below
``1e-10`` of the largest dropped: rounding in the sums, ~1e-14 relative, must not be amplified to
the size of the weights) with an optional ridge ``α`` relative to its mean eigenvalue.
The degree and ``α`` are chosen on held-out folds (:mod:`kelr_dist.kernels.scores.folds`): the sums
are kept
per fold, each candidate is fitted on all folds but one and its loss ``J`` evaluated on the one
left out — exactly, from that fold's ``G`` and ``b`` — so choosing needs no further pass.

Reference: A. Hyvärinen, "Estimation of non-normalized statistical models by score matching",
J. Mach. Learn. Res. 6 (2005) 695–709.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

import numpy as np

from kelr_dist.kernels.bases.families import Coordinate, TensorBasis, polynomials
from kelr_dist.kernels.compiled import compiled
from kelr_dist.kernels.reduction import BlockInfo, Reduction
from kelr_dist.kernels.scores.folds import Folds, combine_by_fold, fold_stderr, sums_by_fold
from kelr_dist.kernels.scores.kernel_embedding import row_blocks

#: ridge factors α tried by the held-out selection (λ = α tr(G) / P)
RIDGES = (0.0, 1e-8, 1e-6, 1e-4, 1e-2)
#: eigenvalues of G below this fraction of the largest are treated as zero
RCOND = 1e-10
#: rows per block of the feature tables, so that a block's tables of up to SM_MAX_FEATURES
#: features stay in cache (see docs/benchmarks.md, section 'Tuning constants')
FEATURE_ROWS = 2048


def feature_count(d: int, degree: int) -> int:
    """Number of features ``C(q + d, d)`` of total degree ``≤ q`` in ``d`` coordinates."""
    return math.comb(degree + d, d)


@dataclass(frozen=True)
class PolynomialFeatures:
    """Features ``φ_a(x) = Π_k P_{m_ak}(y_k)`` over a downward-closed set of multi-indices.

    ``P_m`` are the coordinate family's orthonormal polynomials (weight exponent 0) in the
    mapped coordinate ``y_k = (x_k - loc_k) / scale_k``. Without ``index_set`` the set is the
    total degree ``|m_a|_1 ≤ degree``, laid out as the kernel embedding's basis functions
    (:class:`~kelr_dist.kernels.bases.families.TensorBasis`); with ``index_set`` (multi-indices,
    each ``d`` whole numbers, every backward neighbour ``m - e_k`` in the set) it is that set and
    ``degree`` its largest total degree (:meth:`of_indices`).
    """

    coordinates: tuple[Coordinate, ...]
    degree: int
    index_set: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "coordinates", tuple(self.coordinates))
        if isinstance(self.degree, bool) or int(self.degree) != self.degree or self.degree < 1:
            raise ValueError(f"degree must be an integer >= 1, got {self.degree!r}")
        if self.index_set is not None and int(self.indices.sum(axis=1).max()) != self.degree:
            raise ValueError("degree must be the largest total degree of index_set")

    @classmethod
    def of_indices(
        cls, coordinates: tuple[Coordinate, ...], indices: np.ndarray
    ) -> PolynomialFeatures:
        """The features of the multi-indices ``indices (P, d)`` (a downward-closed set)."""
        rows = tuple(tuple(int(v) for v in row) for row in np.asarray(indices))
        return cls(coordinates, max(sum(row) for row in rows), rows)

    @cached_property
    def layout(self) -> TensorBasis:
        return TensorBasis(self.coordinates, int(self.degree), "total")

    @property
    def dim(self) -> int:
        return len(self.coordinates)

    @cached_property
    def indices(self) -> np.ndarray:
        """Multi-indices ``(P, d)``."""
        if self.index_set is None:
            return self.layout.indices
        return np.asarray(self.index_set, dtype=np.int64).reshape(-1, self.dim)

    @property
    def size(self) -> int:
        return int(self.indices.shape[0])

    @property
    def gram_size(self) -> int:
        """The size of the Gram matrix the pass sums per row (its work: ``2 P²`` flops)."""
        return self.size

    @cached_property
    def max_degrees(self) -> tuple[int, ...]:
        """Highest degree per coordinate, ``(d,)``."""
        return tuple(int(m) for m in self.indices.max(axis=0))

    def mask(self, degree: int) -> np.ndarray:
        """``(P,)`` bool: the features of total degree ``≤ degree``."""
        return self.indices.sum(axis=1) <= degree

    def subset(self, keep: np.ndarray) -> PolynomialFeatures:
        """The features ``keep`` (``(P,)`` bool, a downward-closed subset), in the same order."""
        return PolynomialFeatures.of_indices(self.coordinates, self.indices[keep])

    def truncated(self, degree: int) -> PolynomialFeatures:
        if self.index_set is None:
            return PolynomialFeatures(self.coordinates, degree)
        return self.subset(self.mask(degree))

    @cached_property
    def support(self) -> tuple[np.ndarray, np.ndarray]:
        """The nonzero entries of each multi-index, at most ``s`` per feature: their coordinates
        and degrees, each ``(P, s)`` (padded with coordinate 0 at degree 0, whose polynomial is
        1). A feature's value and gradient are products over its own entries only, so the work
        per row is proportional to ``P s``, not ``P d``."""
        m = self.indices
        nonzero = m > 0
        count = nonzero.sum(axis=1)
        rows, cols = np.nonzero(nonzero)
        slots = np.arange(rows.size) - np.repeat(np.cumsum(count) - count, count)
        coordinate = np.zeros((self.size, max(int(count.max()), 1)), dtype=np.int64)
        degree = np.zeros_like(coordinate)
        coordinate[rows, slots] = cols
        degree[rows, slots] = m[rows, cols]
        return coordinate, degree

    def _tables(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each coordinate's polynomials and their derivatives (x units) at ``x (n, d)`` up to
        its highest degree, each ``(n, d, D + 1)`` (``D``: the highest of all)."""
        top = self.max_degrees
        values = np.zeros((x.shape[0], self.dim, max(top) + 1))
        derivs = np.zeros_like(values)
        for k, c in enumerate(self.coordinates):
            v, dv = polynomials(c.family, c.mapped(x[:, k]), top[k])
            values[:, k, : top[k] + 1] = v
            derivs[:, k, : top[k] + 1] = dv / c.scale
        return values, derivs

    def _factors(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The polynomial of each entry of :attr:`support` and its derivative (x units) at
        ``x (n, d)``, each ``(n, P, s)``."""
        values, derivs = self._tables(x)
        coordinate, degree = self.support
        return values[:, coordinate, degree], derivs[:, coordinate, degree]

    def values(self, x: np.ndarray) -> np.ndarray:
        """``φ (n, P)`` at ``x (n, d)``."""
        return self.values_and_derivative_sums(x, -1)[0]

    def values_and_derivative_sums(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``φ (n, P)`` at ``x (n, d)`` and ``Σ_n ∂_k φ`` ``(P,)`` along coordinate ``k`` alone
        (x units; ``k = -1``: none, zeros): one pass over the entries of :attr:`support`, where
        :meth:`values_and_gradient_sums` gathers each entry's factor (a score's evaluation and a
        local fit need no more)."""
        values, derivs = self._tables(np.asarray(x, dtype=np.float64))
        coordinate, degree = self.support
        phi = np.empty((values.shape[0], self.size))
        sums = np.zeros(self.size)
        _products_along(values, derivs, coordinate, degree, k, phi, sums)
        return phi, sums

    def gradients(self, x: np.ndarray) -> np.ndarray:
        """``∂_j φ`` at ``x (n, d)``, ``(d, n, P)`` (x units)."""
        x = np.asarray(x, dtype=np.float64)
        _, grads = self._values_and_entry_gradients(x)
        coordinate, _ = self.support
        out = np.zeros((self.dim, x.shape[0], self.size))
        features = np.arange(self.size)
        for slot in range(coordinate.shape[1]):
            out[coordinate[:, slot], :, features] += grads[:, :, slot].T
        return out

    def values_and_gradient_sums(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``φ (n, P)`` at ``x (n, d)`` and ``Σ_n ∂_j φ`` ``(d, P)`` (x units)."""
        phi, grads = self._values_and_entry_gradients(np.asarray(x, dtype=np.float64))
        coordinate, _ = self.support
        sums = np.zeros((self.dim, self.size))
        np.add.at(sums, (coordinate, np.arange(self.size)[:, None]), grads.sum(axis=0))
        return phi, sums

    def _values_and_entry_gradients(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``φ (n, P)`` and, per entry of :attr:`support`, the derivative of ``φ`` along its
        coordinate ``(n, P, s)``: the product with that entry's factor replaced by its
        derivative, from the products of the factors before and after it."""
        factors, derivs = self._factors(x)
        slots = factors.shape[2]
        before = [np.ones(factors.shape[:2])]
        for j in range(slots - 1):
            before.append(before[-1] * factors[:, :, j])
        after = [np.ones(factors.shape[:2])]
        for j in range(slots - 1, 0, -1):
            after.append(factors[:, :, j] * after[-1])
        grads = np.stack(
            [before[j] * derivs[:, :, j] * after[-1 - j] for j in range(slots)], axis=2
        )
        return before[-1] * factors[:, :, -1], grads


@compiled
def _products_along(
    values: np.ndarray,
    derivs: np.ndarray,
    coordinate: np.ndarray,
    degree: np.ndarray,
    k: int,
    phi: np.ndarray,
    sums: np.ndarray,
) -> None:
    """``phi[r, a] = Π_j values[r, coordinate[a, j], degree[a, j]]`` and, by the product rule
    along the entries of coordinate ``k``, ``sums[a] += ∂_k phi[r, a]`` over the rows ``r``."""
    for r in range(values.shape[0]):
        for a in range(coordinate.shape[0]):
            v, dv = 1.0, 0.0
            for j in range(coordinate.shape[1]):
                c, m = coordinate[a, j], degree[a, j]
                f = values[r, c, m]
                dv = dv * f + v * derivs[r, c, m] if c == k else dv * f
                v *= f
            phi[r, a] = v
            sums[a] += dv


def gram_sums(
    features: PolynomialFeatures, x: np.ndarray, start: int = 0, stride: int = 1
) -> dict[str, np.ndarray | int]:
    """Partial sums of ``G`` and ``b`` over the rows of ``x (n, d)`` whose time index
    ``start + row`` is a multiple of ``stride``: ``{"gram": (P, P), "b": (d, P), "n": n'}``."""
    first = -start % stride
    rows_used = x[first::stride]
    gram = np.zeros((features.size, features.size))
    b = np.zeros((features.dim, features.size))
    for rows in row_blocks(rows_used.shape[0], FEATURE_ROWS):
        phi, grad_sums = features.values_and_gradient_sums(rows_used[rows])
        gram += phi.T @ phi
        b += grad_sums
    return {"gram": gram, "b": b, "n": rows_used.shape[0]}


def _gram_chunk(
    features: PolynomialFeatures,
    folds: Folds,
    stride: int,
    x: np.ndarray,
    info: BlockInfo,
    _halo: np.ndarray | None,
) -> list[dict]:
    def empty() -> dict[str, Any]:
        size = features.size
        return {"gram": np.zeros((size, size)), "b": np.zeros((features.dim, size)), "n": 0}

    return sums_by_fold(folds, empty, partial(gram_sums, features, stride=stride), x, info)


@dataclass(frozen=True)
class GramSums:
    """``Σ φ φᵀ`` ``(K, P, P)``, ``Σ ∂_j φ`` ``(K, d, P)`` and rows ``(K,)`` per held-out fold."""

    features: PolynomialFeatures
    gram: np.ndarray
    b: np.ndarray
    n: np.ndarray

    @classmethod
    def from_partials(cls, features: PolynomialFeatures, parts: list[dict]) -> GramSums:
        return cls(
            features,
            np.stack([p["gram"] for p in parts]),
            np.stack([p["b"] for p in parts]),
            np.array([int(p["n"]) for p in parts]),
        )

    def means(self, fold: int | None = None, left_out: bool = False) -> tuple[np.ndarray, ...]:
        """``(G, b)`` as means over all rows, over ``fold`` alone, or (``left_out``) over every
        fold but ``fold``."""
        if fold is None:
            keep = np.ones(len(self.n), dtype=bool)
        else:
            keep = np.arange(len(self.n)) == fold
            if left_out:
                keep = ~keep
        n = self.n[keep].sum()
        return self.gram[keep].sum(axis=0) / n, self.b[keep].sum(axis=0) / n


@dataclass(frozen=True)
class ScaledGram:
    """``G`` scaled to unit diagonal, ``G̃ = D G D`` with ``D = diag(G)^{-1/2}`` (Jacobi), and its
    eigen-decomposition. Features of very different sizes (high powers of a heavy-tailed
    coordinate next to low ones) give ``G`` a spread of eigenvalues that is mostly the spread of
    its diagonal; the scaling removes that part, so the threshold :data:`RCOND` drops only the
    directions that are collinear (van der Sluis 1969: the diagonal scaling is within a factor
    ``P`` of the best one for the condition number)."""

    scale: np.ndarray  # (P,) D
    eigval: np.ndarray  # (P,) ascending
    eigvec: np.ndarray  # (P, P)

    @classmethod
    def of(cls, gram: np.ndarray) -> ScaledGram:
        """Of ``gram (P, P)``, or of a stack ``(..., P, P)`` (then every field is stacked)."""
        diagonal = np.diagonal(gram, axis1=-2, axis2=-1)
        scale = np.where(diagonal > 0, 1.0 / np.sqrt(np.where(diagonal > 0, diagonal, 1.0)), 1.0)
        eigval, eigvec = np.linalg.eigh(scale[..., :, None] * gram * scale[..., None, :])
        return cls(scale, eigval, eigvec)

    @property
    def kept(self) -> np.ndarray:
        """``(P,)`` bool: eigenvalues above :data:`RCOND` times the largest."""
        return self.eigval > RCOND * np.maximum(self.eigval[..., -1:], 0.0)

    @property
    def condition(self) -> float:
        """Largest over smallest eigenvalue of ``G̃`` (``inf`` when it is singular)."""
        low = float(self.eigval[0])
        return float(self.eigval[-1]) / low if low > 0 else np.inf


def solve_weights(gram: np.ndarray, b: np.ndarray, ridges: tuple[float, ...]) -> list[np.ndarray]:
    """``W = -D (G̃ + α I)⁺ D b`` per ridge factor ``α``, each ``(d, P)``: ``(G + λ)⁻¹ b`` in the
    Jacobi-scaled features (:class:`ScaledGram`; ``tr(G̃) / P = 1``, so ``α`` is the ridge
    relative to the mean eigenvalue, as ``λ = α tr(G) / P`` unscaled).

    Solved in the eigenbasis of ``G̃``; eigenvalues below :data:`RCOND` times the largest count
    as zero (a pseudo-inverse), so collinear features do not blow the weights up. A stack of
    independent fits, ``gram (..., P, P)`` and ``b (..., d, P)``, gives weights ``(..., d, P)``.
    """
    scaled = ScaledGram.of(gram)
    keep = scaled.kept
    vectors, scale = scaled.eigvec, scaled.scale[..., :, None]
    projected = np.swapaxes(vectors, -1, -2) @ (scale * np.swapaxes(b, -1, -2))  # (..., P, d)
    out = []
    for alpha in ridges:
        inverse = np.where(keep, 1.0 / np.where(keep, scaled.eigval + alpha, 1.0), 0.0)
        solved = -(scale * (vectors @ (inverse[..., :, None] * projected)))
        out.append(np.swapaxes(solved, -1, -2))
    return out


def hyvarinen_loss(
    weights: np.ndarray, gram: np.ndarray, b: np.ndarray, scales: np.ndarray | None = None
) -> float:
    """``J(W) = Σ_j σ_j² (½ W_j G W_jᵀ + W_j · b_j)`` for mean ``G``, ``b`` of some rows: the
    loss of the score of the standardized coordinates ``y_j = (x_j - loc_j) / σ_j``
    (``s_y,j = σ_j s_x,j``, ``∂_y_j s_y,j = σ_j² ∂_x_j s_x,j``), which does not change when a
    coordinate's unit does; ``scales`` ``σ (d,)``, default 1 (the loss in ``x``)."""
    if scales is not None:  # σ_j W_j and σ_j b_j first: no 1/σ² of tiny units squared again
        weights, b = weights * scales[:, None], b * scales[:, None]
    return float(0.5 * np.einsum("ja,ab,jb->", weights, gram, weights) + np.sum(weights * b))


@dataclass(frozen=True)
class Candidate:
    """One fitted candidate with its held-out loss (mean over folds) and per-fold losses.

    ``members`` ``(P,)`` bool: its features in the fitted set (``None``: total degree
    ``≤ degree``); ``degree`` is then their largest total degree.
    """

    degree: int
    ridge: float
    loss: float
    fold_losses: np.ndarray = field(repr=False)
    members: np.ndarray | None = field(default=None, repr=False, compare=False)

    def keep(self, features: PolynomialFeatures) -> np.ndarray:
        """``(P,)`` bool: the candidate's features among ``features``."""
        return features.mask(self.degree) if self.members is None else self.members


def held_out_losses(sums: GramSums, keep: np.ndarray, ridges: tuple[float, ...]) -> np.ndarray:
    """``(len(ridges), K)``: the features ``keep`` fitted on all folds but one, per ridge, and
    scored by ``J`` on that fold in the standardized coordinates of the features' maps
    (:func:`hyvarinen_loss`)."""
    scales = np.array([c.scale for c in sums.features.coordinates])
    losses = np.zeros((len(ridges), len(sums.n)))
    for f in range(len(sums.n)):
        train_g, train_b = sums.means(f, left_out=True)
        test_g, test_b = sums.means(f)
        fits = solve_weights(train_g[np.ix_(keep, keep)], train_b[:, keep], ridges)
        for r, w in enumerate(fits):
            losses[r, f] = hyvarinen_loss(w, test_g[np.ix_(keep, keep)], test_b[:, keep], scales)
    return losses


def held_out_candidates(
    sums: GramSums, degrees: list[int] | None = None, ridges: tuple[float, ...] = RIDGES
) -> list[Candidate]:
    """Every (degree, ridge) fitted on all folds but one and scored by ``J`` on that fold
    (:func:`held_out_losses`).

    The loss of a candidate is the row-weighted mean over folds; its fit never sees the fold it
    is scored on.
    """
    degrees = degrees or list(range(1, sums.features.degree + 1))
    weights_n = sums.n / sums.n.sum()
    out = []
    for q in degrees:
        losses = held_out_losses(sums, sums.features.mask(q), ridges)
        out += [
            Candidate(q, alpha, float(losses[r] @ weights_n), losses[r])
            for r, alpha in enumerate(ridges)
        ]
    return out


def _fewest_parameters(c: Candidate) -> tuple[int, float]:
    return c.degree, c.ridge


def choose_candidate(
    candidates: list[Candidate], simplicity: Callable[[Candidate], Any] = _fewest_parameters
) -> Candidate:
    """The simplest candidate within one standard error of the least held-out loss.

    Simplest: lowest degree, then smallest ridge (a ridge shrinks the score and biases the
    response linearly while the loss sees the shrinkage only quadratically: it is there for
    ill-conditioned Gram matrices, not as a smoother; ``simplicity`` gives another order, e.g.
    by features). The standard error is that of the paired
    per-fold difference to the best candidate, ``sd_f(J_f(c) - J_f(best)) / sqrt(K)``, capped
    at the best candidate's own ``sd_f(J_f(best)) / sqrt(K)`` (so an unstable fit whose fold
    losses scatter by more than the loss itself is never "within one error"): among
    candidates the data cannot tell apart, the one with fewer parameters has the smaller
    variance (the one-standard-error rule; Hastie, Tibshirani & Friedman, *The Elements of
    Statistical Learning*, 2nd ed., §7.10).
    """
    finite = [c for c in candidates if np.isfinite(c.loss)]
    if not finite:
        raise ValueError("every score-matching candidate has a non-finite held-out loss")
    top = min(finite, key=lambda c: c.loss)
    k = len(top.fold_losses)
    if k < 2:
        return top
    own = fold_stderr(top.fold_losses)
    for c in sorted(finite, key=simplicity):
        paired = fold_stderr(c.fold_losses - top.fold_losses)
        # a candidate whose losses scatter wildly is not "as good": the tolerance never
        # exceeds the best candidate's own standard error
        if c.loss <= top.loss + min(paired, own):
            return c
    return top


@dataclass(frozen=True)
class ScoreModel:
    """A fitted score ``s(x) = W φ(x)``: a :class:`~.response.Score` defined everywhere."""

    features: PolynomialFeatures
    weights: np.ndarray  # (d, P)

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return ScoreModel.many([self], x)[0]

    def on(self, wide: PolynomialFeatures) -> np.ndarray | None:
        """The weights ``(d, P_wide)`` of this model on the features ``wide`` (zero on those it
        does not use), or None when ``wide`` lacks one of its features."""
        if wide.coordinates != self.features.coordinates:
            return None
        position = {tuple(int(v) for v in m): i for i, m in enumerate(wide.indices)}
        keys = [tuple(int(v) for v in m) for m in self.features.indices]
        if any(key not in position for key in keys):
            return None
        weights = np.zeros((self.weights.shape[0], wide.size))
        weights[:, [position[key] for key in keys]] = self.weights
        return weights

    @staticmethod
    def many(models: Sequence[ScoreModel], x: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each model at ``x (n, d)``, as its call gives it; the models whose features lie in
        the widest one's (an estimate, its refits without each fold, its richer neighbours)
        share its feature values: one product with their weights side by side."""
        out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(models)
        left = list(range(len(models)))
        while left:
            wide = max((models[k].features for k in left), key=lambda f: f.size)
            placed = [(k, models[k].on(wide)) for k in left]
            group = [(k, w) for k, w in placed if w is not None]
            left = [k for k, w in placed if w is None]
            stacked = np.vstack([w for _, w in group])
            values = np.empty((x.shape[0], stacked.shape[0]))
            for rows in row_blocks(x.shape[0], FEATURE_ROWS):
                values[rows] = wide.values(x[rows]) @ stacked.T
            d = x.shape[1]
            kept = np.ones(x.shape[0], dtype=bool)
            for slot, (k, _) in enumerate(group):
                out[k] = (values[:, slot * d : (slot + 1) * d], kept)
        return out  # type: ignore[return-value]


def fit_score(
    sums: GramSums,
    degree: int,
    ridge: float = 0.0,
    without: int | None = None,
    members: np.ndarray | None = None,
) -> ScoreModel:
    """The score model of ``degree`` (or of the features ``members``, ``(P,)`` bool) and ridge
    factor ``ridge`` fitted on every row, or on every held-out fold but ``without`` (a
    jackknife replicate)."""
    keep = sums.features.mask(degree) if members is None else members
    gram, b = sums.means(without, left_out=True)
    (weights,) = solve_weights(gram[np.ix_(keep, keep)], b[:, keep], (ridge,))
    fitted = sums.features.truncated(degree) if members is None else sums.features.subset(keep)
    return ScoreModel(fitted, weights)


def gram_reduction(features: PolynomialFeatures, folds: Folds, stride: int = 1) -> Reduction:
    """The score-matching pass: chunk = :func:`gram_sums` per held-out fold (rows whose time
    index is a multiple of ``stride``), combine = ``+``, finalize = :class:`GramSums`."""
    return Reduction(
        name="gram",
        chunk=partial(_gram_chunk, features, folds, stride),
        combine=combine_by_fold,
        finalize=partial(GramSums.from_partials, features),
    )
