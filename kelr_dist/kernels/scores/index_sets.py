"""Adaptive, anisotropic index sets for score matching, grown by held-out loss.

The total-degree set spends its features evenly on every coordinate and interaction. A score with
a high-degree dependence on one coordinate, or on one pair, needs a few high-degree indices there
and none elsewhere. The set is grown greedily from the linear features (the quasi-Gaussian
score) inside a larger *dictionary* whose Gram sums the one Gram pass already holds per held-out
fold (:class:`~kelr_dist.kernels.scores.score_matching.GramSums`): at each step the candidates are
the
*reduced margin* of the set (the indices of the dictionary not in the set whose backward
neighbours ``m - e_k`` all are, so the set stays downward closed), and the candidate that lowers
the held-out Hyvärinen loss most is added. Growth stops when no candidate lowers it, or when it
has not reached a new minimum for :data:`PATIENCE` steps. Of the nested sets on the path, the
smallest whose loss is within one standard error of the least is kept (the one-standard-error
rule of :func:`~kelr_dist.kernels.scores.score_matching.choose_candidate`).

Every candidate of a step is scored in closed form: adding feature ``a`` to a set ``S`` whose
training Gram ``G_S`` has inverse ``A`` changes the training fit by ``w_a u`` with
``u = (-A g, 1)``, ``g = G[S, a]``, ``w_a = -(b_a + W g) / s`` and the Schur complement
``s = G[a, a] - gᵀ A g``; the held-out loss of the new fit is a quadratic in ``w_a`` whose
coefficients are matrix products with the held-out fold's ``G`` and ``b``. ``A`` is then updated
by the block inverse. Nothing is read again from the data. Candidates collinear with the set
(``s`` below :data:`SCHUR_FLOOR` of ``G[a, a]``) are not added.

Several independent fits may share one set (:func:`grow_blocks`: the sites of a local model,
:mod:`~kelr_dist.kernels.scores.local`): their changes of the held-out loss are added, and the
arithmetic of every fold and fit is done side by side, on stacked matrices.

References: T. Gerstner and M. Griebel, "Dimension-adaptive tensor-product quadrature",
Computing 71 (2003) 65–87 (the reduced margin of a downward-closed set); G. Blatman and
B. Sudret, "Adaptive sparse polynomial chaos expansion based on least angle regression",
J. Comput. Phys. 230 (2011) 2345–2367 (greedy sparse polynomial bases chosen by held-out error).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kelr_dist.kernels.bases.families import Coordinate, multi_indices
from kelr_dist.kernels.scores.folds import fold_stderr
from kelr_dist.kernels.scores.score_matching import RCOND, GramSums, PolynomialFeatures

#: growth stops after this many steps without a new least held-out loss (a later step could
#: still fall below it; the one-standard-error rule picks among the sets on the path)
PATIENCE = 20
#: a candidate whose Schur complement is below this fraction of its own Gram diagonal is
#: numerically in the span of the set: it is never added
SCHUR_FLOOR = 1e-9


def dictionary(
    coordinates: tuple[Coordinate, ...], base: int, max_features: int
) -> PolynomialFeatures:
    """The candidate dictionary: total degree ``≤ base`` together with every index of at most two
    nonzero entries and total degree ``≤ r``, ``r ≥ base`` the largest with at most
    ``max_features`` features (single coordinates and pairs to a higher degree than the rest).
    Downward closed, as a union of downward-closed sets."""
    d = len(coordinates)
    rows = _dictionary_rows(d, base, base)
    reach = base
    while d > 1:
        wider = _dictionary_rows(d, base, reach + 1)
        if len(wider) > max_features:
            break
        rows, reach = wider, reach + 1
    return PolynomialFeatures.of_indices(coordinates, np.asarray(sorted(rows, key=_order)))


def _order(m: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    return sum(m), m[::-1]


def _dictionary_rows(d: int, base: int, reach: int) -> set[tuple[int, ...]]:
    return {tuple(int(v) for v in m) for m in multi_indices([base] * d, base)} | axes_and_pairs(
        d, reach
    )


def axes_and_pairs(d: int, reach: int) -> set[tuple[int, ...]]:
    """The multi-indices in ``d`` dimensions of at most two nonzero entries and total degree
    ``≤ reach`` (single coordinates and pairs; downward closed)."""
    rows = set()
    for i in range(d):
        for j in range(i, d):
            for a in range(reach + 1):
                for b in range(reach + 1 - a if j > i else 1):
                    m = [0] * d
                    m[i] += a
                    m[j] += b
                    rows.add(tuple(m))
    return rows


@dataclass(frozen=True)
class GrowthPath:
    """The nested sets of a greedy growth: ``order (P,)`` the step at which each dictionary
    feature joined (``-1``: never; the starting set is step 0), ``fold_losses (steps + 1, K)``
    the held-out loss of each fold after every step, ``weights (K,)`` the folds' row shares."""

    order: np.ndarray
    fold_losses: np.ndarray = field(repr=False)
    weights: np.ndarray = field(repr=False)
    start_size: int = 1

    @property
    def losses(self) -> np.ndarray:
        """Held-out loss after every step, ``(steps + 1,)``."""
        return self.fold_losses @ self.weights

    def members(self, step: int) -> np.ndarray:
        """``(P,)`` bool: the set after ``step`` steps."""
        return (self.order >= 0) & (self.order <= step)

    def chosen_step(self) -> int:
        """The fewest steps whose loss is within one standard error of the least (paired over
        folds with the least and capped at the least's own, as
        :func:`~kelr_dist.kernels.scores.score_matching.choose_candidate` does)."""
        losses = self.losses
        best = int(np.nanargmin(losses))
        if self.fold_losses.shape[1] < 2:
            return best
        top = self.fold_losses[best]
        own = fold_stderr(top)
        for step in range(best + 1):
            paired = fold_stderr(self.fold_losses[step] - top)
            if losses[step] <= losses[best] + min(paired, own):
                return step
        return best


@dataclass
class _Fits:
    """The fits during growth, stacked: for each held-out fold and each block (an independent
    fit sharing the index set, e.g. a site of a local model), the training ``G (L, P, P)``,
    ``b (L, c, P)`` and the held-out fold's (all dictionary features, Jacobi-scaled), the
    inverse of the training ``G`` on the set ``(L, |S|, |S|)`` and the set's training fit
    ``W (L, c, |S|)``; ``L`` = folds x ``blocks``, fold after fold."""

    train: tuple[np.ndarray, np.ndarray]
    test: tuple[np.ndarray, np.ndarray]
    inverse: np.ndarray
    fit: np.ndarray
    blocks: int

    def by_fold(self, change: np.ndarray) -> np.ndarray:
        """``(L, M)`` changes summed over each fold's blocks, ``(K, M)``."""
        return change.reshape(-1, self.blocks, change.shape[-1]).sum(axis=1)

    def changes(self, rows: list[int], candidates: np.ndarray) -> tuple[np.ndarray, ...]:
        """For each candidate added alone to the set ``rows``: the change of the held-out loss
        per fold ``(K, M)`` (``inf`` for one collinear with the set in any block),
        ``v = A g (L, |S|, M)``, the Schur complements ``(L, M)`` and the candidate's weights
        ``(L, c, M)`` (module docstring)."""
        (g_tr, b_tr), (g_te, b_te), w = self.train, self.test, self.fit
        rows_ = np.asarray(rows, dtype=np.intp)
        at = np.ix_(rows_, candidates)
        g = g_tr[:, at[0], at[1]]
        v = self.inverse @ g
        diagonal = g_tr[:, candidates, candidates]
        schur = diagonal - np.einsum("lsm,lsm->lm", g, v)
        usable = schur > SCHUR_FLOOR * diagonal
        w_new = -(b_tr[:, :, candidates] + w @ g) / np.where(usable, schur, 1.0)[:, None, :]
        g_ss, g_sm = g_te[:, rows_[:, None], rows_[None, :]], g_te[:, at[0], at[1]]
        # held-out loss of W + w_new u, u = (-v, 1): linear term uᵀ G_te Wᵀ + u·b_te, curvature
        # uᵀ G_te u
        linear = -(w @ g_ss @ v) + w @ g_sm - b_te[:, :, rows_] @ v + b_te[:, :, candidates]
        curvature = (
            np.einsum("lsm,lsm->lm", v, g_ss @ v)
            - 2 * np.einsum("lsm,lsm->lm", g_sm, v)
            + g_te[:, candidates, candidates]
        )
        change = np.sum(w_new * linear + 0.5 * w_new**2 * curvature[:, None, :], axis=1)
        change = self.by_fold(np.where(usable, change, np.inf))
        return change, v, schur, w_new

    def added(self, v: np.ndarray, schur: np.ndarray, w_new: np.ndarray) -> _Fits:
        """The fits with one candidate added (its column of :meth:`changes`: ``v (L, |S|)``,
        ``schur (L,)``, ``w_new (L, c)``)."""
        inverse = _bordered_inverse(self.inverse, v, schur)
        fit = np.concatenate([self.fit - w_new[:, :, None] * v[:, None, :], w_new[:, :, None]], 2)
        return _Fits(self.train, self.test, inverse, fit, self.blocks)


def grow(sums: GramSums, start: np.ndarray) -> GrowthPath:
    """Grow a downward-closed set inside ``sums.features`` (the dictionary) from ``start``
    (``(P,)`` bool, downward closed) by held-out Hyvärinen loss (module docstring, and
    :func:`grow_blocks`), in the standardized coordinates of the features' maps as
    :func:`~kelr_dist.kernels.scores.score_matching.hyvarinen_loss` scores them."""
    # the standardized-coordinate factor σ_j of every loss term folded into b
    sigma = np.array([c.scale for c in sums.features.coordinates])[:, None]
    train, test = [], []
    for f in range(len(sums.n)):
        (g_tr, b_tr), (g_te, b_te) = sums.means(f, left_out=True), sums.means(f)
        train.append((g_tr[None], sigma * b_tr[None]))
        test.append((g_te[None], sigma * b_te[None]))
    stacked = tuple(tuple(np.stack(p) for p in zip(*part, strict=True)) for part in (train, test))
    return grow_blocks(stacked[0], stacked[1], sums.n, sums.features.indices, start)


def grow_blocks(
    train: tuple[np.ndarray, ...],
    test: tuple[np.ndarray, ...],
    n: np.ndarray,
    indices: np.ndarray,
    start: np.ndarray,
) -> GrowthPath:
    """Grow one downward-closed set of the multi-indices ``indices (P, d)`` (downward closed: the
    dictionary) from ``start`` (``(P,)`` bool, downward closed) by held-out loss, for ``B``
    independent least-squares fits that share the set: per held-out fold ``k`` and block ``β``
    the fit ``W = -b A`` of ``train = (G (K, B, P, P), b (K, B, c, P))`` (fold ``k``'s training
    rows), scored by the loss ``½ W G Wᵀ + b·W`` of ``test`` (its held-out rows), summed over the
    blocks; ``n (K,)`` the folds' rows. One block with ``c`` components is a full score model;
    one block per site (``c = 1``), a local model whose sites share a set.

    A step adds the candidate of the reduced margin with the largest fall of the held-out loss,
    or a candidate together with one of the indices it admits (``m + e_k``) when that pair falls
    by more per feature: an index whose own gain is nil can open the one that matters (``x²``
    before ``x³`` for a symmetric double well)."""
    (g_tr, b_tr), (g_te, b_te) = train, test
    folds, blocks = g_tr.shape[:2]
    # one Jacobi scaling per block for all folds (the fits do not depend on it, the arithmetic
    # does)
    diagonal = np.diagonal(g_tr, axis1=2, axis2=3).mean(axis=0)
    scale = 1.0 / np.sqrt(np.where(diagonal > 0, diagonal, 1.0))[None]

    def scaled(g: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        g = scale[..., :, None] * g * scale[..., None, :]
        b = b * scale[..., None, :]
        return g.reshape(-1, *g.shape[2:]), b.reshape(-1, *b.shape[2:])

    member = np.asarray(start, dtype=bool).copy()
    order = np.where(member, 0, -1)
    rows = [int(p) for p in np.flatnonzero(member)]
    (gs_tr, bs_tr), (gs_te, bs_te) = scaled(g_tr, b_tr), scaled(g_te, b_te)
    # the start set's inverse, guarded as score matching's solve (RCOND of the largest)
    at = np.ix_(rows, rows)
    inverse = np.linalg.pinv(gs_tr[:, at[0], at[1]], rcond=RCOND, hermitian=True)
    fits = _Fits((gs_tr, bs_tr), (gs_te, bs_te), inverse, -(bs_tr[:, :, rows] @ inverse), blocks)
    losses = [fits.by_fold(_loss(fits.fit, (gs_te, bs_te), rows)[:, None])[:, 0]]
    weights = n / n.sum()
    backward = _backward_neighbours(indices)
    forward = _forward_neighbours(backward)
    best, since = float(losses[0] @ weights), 0
    while since < PATIENCE:
        margin = _margin(member, backward)
        if margin.size == 0:
            break
        singles = fits.changes(rows, margin)
        gain = weights @ singles[0]
        move, per_feature = [int(np.argmin(gain))], float(np.min(gain))
        for m, a in enumerate(margin):
            member[a] = True
            admitted = [b for b in forward[a] if b >= 0 and _admissible(b, member, backward)]
            member[a] = False
            if not admitted or not np.isfinite(gain[m]):
                continue
            _, v, schur, w_new = singles
            after = fits.added(v[:, :, m], schur[:, m], w_new[:, :, m])
            second = weights @ after.changes([*rows, int(a)], np.array(admitted))[0]
            k = int(np.argmin(second))
            if (gain[m] + second[k]) / 2 < per_feature:
                move, per_feature = [m, int(admitted[k])], (gain[m] + second[k]) / 2
        if not np.isfinite(per_feature):
            break
        for position, target in enumerate(move):
            a = int(margin[target]) if position == 0 else target
            change, v, schur, w_new = fits.changes(rows, np.array([a]))
            fits = fits.added(v[:, :, 0], schur[:, 0], w_new[:, :, 0])
            losses.append(losses[-1] + change[:, 0])
            rows.append(a)
            member[a] = True
            order[a] = len(losses) - 1
            current = float(losses[-1] @ weights)
            best, since = (current, 0) if current < best else (best, since + 1)
    return GrowthPath(order, np.array(losses), weights, int(np.asarray(start).sum()))


def _loss(fit: np.ndarray, test: tuple[np.ndarray, np.ndarray], rows: list[int]) -> np.ndarray:
    """``(L,)`` held-out loss of each stacked fit ``(L, c, |S|)``."""
    at = np.ix_(rows, rows)
    gram, b = test[0][:, at[0], at[1]], test[1][:, :, rows]
    return 0.5 * np.einsum("lja,lab,ljb->l", fit, gram, fit) + np.sum(fit * b, axis=(1, 2))


def _bordered_inverse(inverse: np.ndarray, v: np.ndarray, schur: np.ndarray) -> np.ndarray:
    """Inverses of ``[[G, g], [gᵀ, c]]`` from ``A = G⁻¹ (L, n, n)``, ``v = A g (L, n)`` and
    ``s = c - gᵀ v (L,)``."""
    count, n = inverse.shape[:2]
    out = np.empty((count, n + 1, n + 1))
    out[:, :n, :n] = inverse + v[:, :, None] * v[:, None, :] / schur[:, None, None]
    out[:, :n, n] = out[:, n, :n] = -v / schur[:, None]
    out[:, n, n] = 1.0 / schur
    return out


def _backward_neighbours(indices: np.ndarray) -> np.ndarray:
    """``(P, d)`` position of ``m - e_k`` in ``indices`` (``-1`` where ``m_k = 0``)."""
    where = {tuple(m): p for p, m in enumerate(indices.tolist())}
    out = np.full(indices.shape, -1, dtype=np.int64)
    for p, m in enumerate(indices.tolist()):
        for k, v in enumerate(m):
            if v > 0:
                out[p, k] = where[(*m[:k], v - 1, *m[k + 1 :])]
    return out


def _forward_neighbours(backward: np.ndarray) -> np.ndarray:
    """``(P, d)`` position of ``m + e_k`` (``-1`` where it is not in the dictionary)."""
    out = np.full(backward.shape, -1, dtype=np.int64)
    for p, k in zip(*np.nonzero(backward >= 0), strict=True):
        out[backward[p, k], k] = p
    return out


def _admissible(position: int, member: np.ndarray, backward: np.ndarray) -> bool:
    """Whether the index at ``position`` is outside the set with every backward neighbour in."""
    back = backward[position]
    return not member[position] and bool(member[back[back >= 0]].all())


def _margin(member: np.ndarray, backward: np.ndarray) -> np.ndarray:
    """Positions not in the set whose backward neighbours all are (the reduced margin)."""
    inside = np.where(backward >= 0, member[np.maximum(backward, 0)], True).all(axis=1)
    return np.flatnonzero(inside & ~member)


def reached_edge(features: PolynomialFeatures, members: np.ndarray) -> list[int]:
    """Coordinates along which the chosen set holds the dictionary's highest degree: growth
    there was limited by the dictionary, not by the held-out loss."""
    top = features.indices.max(axis=0)
    chosen = features.indices[members].max(axis=0)
    return [k for k in range(features.dim) if chosen[k] == top[k] and top[k] > 1]


def edge_falls(
    features: PolynomialFeatures, members: np.ndarray, path: GrowthPath
) -> list[tuple[int, int, np.ndarray]]:
    """Per coordinate of :func:`reached_edge` whose highest degree the growth added (not the start
    set): the coordinate, that degree and the per-fold fall ``(K,)`` of the held-out loss at the
    step that first added an index of it."""
    out = []
    for k in reached_edge(features, members):
        top = int(features.indices[:, k].max())
        step = int(path.order[members & (features.indices[:, k] == top)].min())
        if step >= 1:
            out.append((k, top, path.fold_losses[step - 1] - path.fold_losses[step]))
    return out


__all__ = [
    "GrowthPath",
    "axes_and_pairs",
    "dictionary",
    "edge_falls",
    "grow",
    "grow_blocks",
    "reached_edge",
]
