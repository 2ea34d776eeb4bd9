"""Held-out, truth-free choice between score estimators: the Hyvärinen loss on unseen folds.

Why this criterion. The response to a forcing needs only the score ``s = ∇ log p_eq``. For any
bounded ``u`` the error of a response estimate built from ``ŝ`` is an integral of the score
error: with constant forcing and ``u_t(x) = E[A(X_t) | X_0 = x]``,

    k̂(t) - k(t) = -E[ u_t(X) (ŝ(X) - s(X))ᵀ ],   so   |k̂_ij(t) - k_ij(t)| ≤ ‖u_{t,i}‖ ‖ŝ_j - s_j‖

(norms in ``L²(p_eq)``) at every lag at once. The Fisher divergence ``F(ŝ) = E|ŝ - s|²`` therefore
bounds the response error of every estimator in the same units, whatever the estimator is made
of. It cannot be computed without ``s``, but Hyvärinen's identity (integration by parts, valid
when ``p ŝ → 0`` at the edges of the support) gives it up to a constant that does not depend on
``ŝ``:

    J(ŝ) = E[ ½ |ŝ(X)|² + ∇·ŝ(X) ] = ½ F(ŝ) - ½ E|s(X)|².

``J`` is a plain mean over samples, so differences of ``J`` between two estimators estimate
differences of their Fisher divergences, truth-free. Evaluated on samples the estimator was not
fitted on it is free of the optimism of in-sample fits (a high-order expansion always fits its
own sample better); folds are whole chains or long contiguous blocks
(:mod:`kelr_dist.kernels.scores.folds`) so that "unseen" holds despite time correlation.

The two families.

* Score matching (:mod:`kelr_dist.kernels.scores.score_matching`) minimises ``J`` itself; its
held-out ``J``
  comes exactly from each fold's Gram sums (no extra pass) and ranks its degrees and ridges.
* The kernel embedding's score ``∇p_M / p_M`` on ``{p_M ≥ δ}`` (eq. 46) has a jump at the
  edge of that set, where ``∇·ŝ`` is a surface measure and ``J`` is undefined. It is scored
  through its smooth twin ``ŝ_δ = p_M ∇p_M / (p_M² + δ²)`` (δ in standardized units, as the
  threshold), which equals ``∇ log p_M`` where ``p_M ≫ δ``, goes to 0 where ``p_M ≪ δ``, and has a
  divergence everywhere: ``∂_j ŝ_j = (g_j² + p h_j) / (p² + δ²) - 2 p² g_j² / (p² + δ²)²`` with
  ``g = ∇p_M``, ``h_j = ∂²_j p_M``. Its coefficients are refitted without the scored fold
  (eq. 39: sums over the other folds), the order and δ come from the paper's rules (§4).
  The twin is scored at ``10 δ``, not ``δ``: refitted on three quarters of the data at the
  order chosen for all of it, ``p_M`` oscillates in the tails (Gibbs), and the oscillations'
  second derivatives enter ``∇·ŝ`` — but not the response, which uses ``∇p_M / p_M`` only.
  At ``δ`` those oscillations dominate the loss and the fold means disagree; at ``10 δ`` they
  agree (see docs/benchmarks.md, section 'Tuning constants'). A larger multiple only makes the
  kernel embedding look worse (its tails count as ``ŝ = 0``), so this errs on its side.

What it does not do. ``J`` is not used to tune δ within the kernel embedding: the rejected tail
samples carry much of ``E[A Bᵀ]`` while they weigh little in the Fisher divergence ``F``, so the
δ with the least ``F`` need not have the least response error; it is used only to choose between
the families (see docs/benchmarks.md, section 'Tuning constants'). The lag-0 Stein residual
(:mod:`kelr_dist.kernels.response.operator`) then reports what bias is left.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from kelr_dist.kernels.reduction import BlockInfo, Reduction
from kelr_dist.kernels.scores.folds import Folds, fold_stderr
from kelr_dist.kernels.scores.kernel_embedding import KernelDensity, Order
from kelr_dist.kernels.scores.score_matching import Candidate

#: the kernel embedding's held-out loss uses every HELDOUT_STRIDE-th sample (by time index)
HELDOUT_STRIDE = 4
#: its smooth twin is scored at this multiple of the threshold δ, far enough above it that the
#: tails' Gibbs oscillations leave the fold losses (the module docstring; see
#: docs/benchmarks.md, section 'Tuning constants')
HELDOUT_SMOOTHING = 10.0

ESTIMATORS = ("auto", "kernel-embedding", "score-matching")


def smooth_density_loss(
    p: np.ndarray, gradient: np.ndarray, hessian: np.ndarray, delta: float
) -> np.ndarray:
    """Per-sample ``½|ŝ_δ|² + ∇·ŝ_δ`` of ``ŝ_δ = p ∇p / (p² + δ²)``; ``p (n,)``, ``gradient`` and
    ``hessian`` (its diagonal) ``(n, d)``, all in the same units as ``δ``. Returns ``(n,)``.

    Given ``p`` and its derivatives in the mapped coordinates ``y = (x - loc) / scale`` (as the
    held-out pass does) it is the loss of the standardized score, the units score matching's
    candidates are scored in too (:func:`~kelr_dist.kernels.scores.score_matching.hyvarinen_loss`),
    and free of the Jacobian's ``1 / Π scale`` (which overflows for data in very small units)."""
    denominator = (p * p + delta * delta)[:, None]
    score = p[:, None] * gradient / denominator
    g2 = gradient * gradient
    divergence = (g2 + p[:, None] * hessian) / denominator - 2.0 * (p * p)[:, None] * g2 / (
        denominator * denominator
    )
    return 0.5 * np.sum(score * score, axis=1) + np.sum(divergence, axis=1)


def _density_loss_chunk(
    densities: tuple[KernelDensity, ...],
    delta: float,
    folds: Folds,
    stride: int,
    x: np.ndarray,
    info: BlockInfo,
    _halo: np.ndarray | None,
) -> dict[str, np.ndarray]:
    loss = np.zeros(folds.count)
    count = np.zeros(folds.count, dtype=np.int64)
    for fold, rows in folds.segments(info):
        first = -(info.start + rows.start) % stride
        points = x[rows][first::stride]
        if points.shape[0] == 0:
            continue
        density = densities[fold]
        # in the mapped coordinates y: the standardized loss, as score matching's
        p, gradient, hessian = density.derivatives(points, standardized=True)
        loss[fold] += smooth_density_loss(p, gradient, hessian, HELDOUT_SMOOTHING * delta).sum()
        count[fold] += points.shape[0]
    return {"loss": loss, "n": count}


@dataclass(frozen=True)
class FoldLosses:
    """Held-out loss per fold ``(K,)`` and the rows it was averaged over ``(K,)``."""

    loss: np.ndarray
    n: np.ndarray

    @property
    def mean(self) -> float:
        """Row-weighted mean over folds."""
        return float(self.loss @ (self.n / self.n.sum()))


def _fold_means(partial_sums: dict[str, np.ndarray]) -> FoldLosses:
    n = np.asarray(partial_sums["n"])
    return FoldLosses(np.asarray(partial_sums["loss"]) / np.maximum(n, 1), n)


def density_loss_reduction(
    density: KernelDensity,
    order: Order,
    delta: float,
    folds: Folds,
    stride: int = HELDOUT_STRIDE,
) -> Reduction:
    """Held-out Hyvärinen loss of the kernel embedding's smooth score ``ŝ_δ`` (module docstring):
    each fold's rows (every ``stride``-th) scored with the coefficients of the other folds.
    ``density`` must have been fitted by fold; ``delta`` is in standardized units."""
    # each fold's estimate truncated to ``order`` once, on its own basis
    held_out = tuple(density.held_out(f).truncated(order) for f in range(folds.count))
    return Reduction(
        name="heldout",
        chunk=partial(_density_loss_chunk, held_out, float(delta), folds, stride),
        finalize=_fold_means,
    )


@dataclass(frozen=True)
class Choice:
    """One row of the candidate table: an estimator, its order/degree and ridge, its held-out
    loss ``J`` (mean over folds), the standard error of that mean from the fold spread, and
    whether it is the estimate used."""

    estimator: str
    order: int
    ridge: float
    loss: float
    loss_stderr: float
    chosen: bool = False


def candidate_table(
    estimator: str,
    kernel_embedding: tuple[int, FoldLosses | None] | None,
    score_matching: list[Candidate],
    pick: Candidate | None,
) -> list[Choice]:
    """Every candidate scored on held-out folds (kernel embedding first), the one used marked.

    ``pick`` is score matching's own choice among its candidates. With ``estimator="auto"`` the
    kernel embedding is used when its held-out loss is below that of ``pick``; otherwise the
    named estimator is used.
    """
    rows = []
    ke_loss = float("nan")
    if kernel_embedding is not None:
        order, losses = kernel_embedding
        ke_loss = losses.mean if losses is not None else float("nan")
        spread = float(fold_stderr(losses.loss)) if losses is not None else float("nan")
        rows.append(Choice("kernel-embedding", order, float("nan"), ke_loss, spread))
    sm_loss = pick.loss if pick is not None else float("nan")
    if estimator == "auto":
        use_ke = np.isfinite(ke_loss) and not ke_loss >= sm_loss
        if not np.isfinite(ke_loss) and not np.isfinite(sm_loss):
            raise ValueError("no estimator has a finite held-out loss")
        used = "kernel-embedding" if use_ke else "score-matching"
    else:
        used = estimator
    if rows and used == "kernel-embedding":
        rows[0] = replace(rows[0], chosen=True)
    rows += [
        Choice(
            "score-matching",
            c.degree,
            c.ridge,
            c.loss,
            float(fold_stderr(c.fold_losses)),
            used == "score-matching" and c is pick,
        )
        for c in score_matching
    ]
    return rows


def used_estimator(rows: list[Choice]) -> str:
    """The estimator of the row marked as used."""
    return next(r.estimator for r in rows if r.chosen)
