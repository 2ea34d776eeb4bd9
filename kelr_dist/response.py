"""Conjugate variables, observables, forcings and the response pass (eq:lin_oper, eq:deps_hat).

The linear response operator of an observable ``A`` to a forcing ``c(x) δf(t)`` is
``k_A(s) = E[A(X_s) ⊗ B(X_0)]`` with ``B_i = -∂_i(c_i p) / p = -∂_i c_i - c_i ∂_i log p``
(eq:lin_oper). Every estimate of it differs only in where ``∇ log p`` comes from — a
:class:`Score`:

* :class:`DensityScore` — the kernel-embedding ``p_M``: ``∇p_M / p_M`` on ``{p_M ≥ δ}`` and
  ``B̂ = 0`` elsewhere (eq:deps_hat; the sum is still divided by ``N - s``);
* :class:`FunctionScore` — a known score (the exact FDT response), the quasi-Gaussian score;
* :class:`KDEScore` — the Gaussian KDE baseline.

:func:`response_reduction` computes all of them in one pass: per block, ``A`` on the block and
its halo, ``B`` for every score, and the lagged sums with their block-averaging partials
(:mod:`kelr_dist.blocking`), so the data are read once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kelr_dist.blocking import (
    BlockingResult,
    block_standard_error,
    combine_block_partials,
    response_block_partial,
)
from kelr_dist.density import KernelDensity, Order
from kelr_dist.reduction import BlockInfo, Reduction


class Score(Protocol):
    """``x (n, d) -> (∇ log p (n, d), kept (n,) bool)``; rows not kept get ``B = 0``."""

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class DensityScore:
    """``∇ log p_M`` of the kernel-embedding estimate on ``D_{M,δ} = {p_M ≥ δ}`` (eq:deps_hat)."""

    density: KernelDensity
    order: Order
    delta: float

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p, grad = self.density.evaluate(x, self.order)
        kept = p >= self.delta
        score = np.zeros_like(grad)
        np.divide(grad, p[:, None], out=score, where=kept[:, None])
        return score, kept


@dataclass(frozen=True)
class FunctionScore:
    """A known score function ``x (n, d) -> ∇ log p (n, d)``, defined at every sample."""

    function: Callable[[np.ndarray], np.ndarray]

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        score = np.asarray(self.function(x), dtype=np.float64)
        if score.shape != x.shape:
            raise ValueError(f"score function returned shape {score.shape}, expected {x.shape}")
        return score, np.ones(x.shape[0], dtype=bool)


@dataclass(frozen=True)
class KDEScore:
    """``∇p / p`` of a KDE object with ``evaluate(x) -> (p, ∇p)``, where ``p > 0``."""

    kde: Any

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p, grad = self.kde.evaluate(x)
        kept = p > 0
        score = np.zeros_like(grad)
        np.divide(grad, p[:, None], out=score, where=kept[:, None])
        return score, kept


@dataclass(frozen=True)
class Observable:
    """``A``: ``x (n, d) -> (n, q)`` with component names; identity when ``function`` is None."""

    names: tuple[str, ...]
    function: Callable[[np.ndarray], np.ndarray] | None = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.function is None:
            return x
        a = np.asarray(self.function(x), dtype=np.float64)
        if a.ndim == 1:
            a = a[:, None]
        if a.shape != (x.shape[0], len(self.names)):
            raise ValueError(
                f"observable returned shape {a.shape}, expected {(x.shape[0], len(self.names))}"
            )
        return a


@dataclass(frozen=True)
class Forcing:
    """Forcing profile ``c(x)`` per component and its derivative ``∂_i c_i(x)``, both ``(n, d)``.

    ``function=None`` is the constant forcing ``c = 1`` of every component (so ``B = -∇ log p``).
    ``function`` returns ``(c, ∂c)`` for a user-supplied forcing.
    """

    names: tuple[str, ...]
    function: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None

    def conjugate(self, x: np.ndarray, score: np.ndarray, kept: np.ndarray) -> np.ndarray:
        """``B_i = -∂_i c_i - c_i ∂_i log p`` on kept rows, else 0 (eq:lin_oper, eq:deps_hat)."""
        if self.function is None:
            b = -score
        else:
            c, dc = (np.asarray(v, dtype=np.float64) for v in self.function(x))
            if c.shape != x.shape or dc.shape != x.shape:
                raise ValueError(
                    f"forcing returned shapes {c.shape} and {dc.shape}, expected {x.shape} each"
                )
            b = -dc - c * score
        b[~kept] = 0.0
        return b


@dataclass(frozen=True)
class ResponseResult:
    """One response estimate: ``mean`` and ``stderr`` ``(S+1, q, d)`` plus the rows kept."""

    blocking: BlockingResult
    kept: int
    n: int

    @property
    def mean(self) -> np.ndarray:
        return self.blocking.mean

    @property
    def stderr(self) -> np.ndarray:
        return self.blocking.stderr

    @property
    def rejection(self) -> float:
        """Fraction of samples with ``B = 0`` (outside ``D_{M,δ}``)."""
        return 1.0 - self.kept / self.n


@dataclass(frozen=True)
class _ResponseKernel:
    scores: Mapping[str, Score]
    observable: Observable
    forcing: Forcing
    max_lag: int
    base_block: int | None = None

    def chunk(self, x: np.ndarray, info: BlockInfo, halo: np.ndarray | None) -> dict[str, Any]:
        x_ext = x if halo is None or len(halo) == 0 else np.concatenate([x, halo])
        a_ext = self.observable(x_ext)
        out: dict[str, Any] = {}
        for name, score in self.scores.items():
            s, kept = score(x)
            b = self.forcing.conjugate(x, s, kept)
            part = response_block_partial(a_ext, b, self.max_lag, info, self.base_block)
            out[name] = {"blocks": part, "kept": int(kept.sum()), "n": x.shape[0]}
        return out


def _combine(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {
        name: {
            "blocks": combine_block_partials(a[name]["blocks"], b[name]["blocks"]),
            "kept": a[name]["kept"] + b[name]["kept"],
            "n": a[name]["n"] + b[name]["n"],
        }
        for name in a
    }


def _finalize(partials: dict[str, Any]) -> dict[str, ResponseResult]:
    return {
        name: ResponseResult(block_standard_error(p["blocks"]), p["kept"], p["n"])
        for name, p in partials.items()
    }


def response_reduction(
    scores: Mapping[str, Score],
    observable: Observable,
    forcing: Forcing,
    max_lag: int,
    base_block: int | None = None,
) -> Reduction:
    """The response pass: ``k(s) = (1/(N_s)) Σ_n A(X_{n+s}) ⊗ B(X_n)`` (eq:MC_approx) for every
    score in ``scores``, with block-averaging standard errors; halo = ``max_lag`` rows.

    Finalizes to ``{name: ResponseResult}``.
    """
    if int(max_lag) != max_lag or max_lag < 0:
        raise ValueError(f"max_lag must be a non-negative integer, got {max_lag!r}")
    kernel = _ResponseKernel(dict(scores), observable, forcing, int(max_lag), base_block)
    return Reduction(
        name="response",
        chunk=kernel.chunk,
        combine=_combine,
        finalize=_finalize,
        halo=int(max_lag),
    )


def identity_observable(components: Sequence[str]) -> Observable:
    """``A(x) = x`` named after the trajectory's components."""
    return Observable(tuple(components))


def constant_forcing(components: Sequence[str]) -> Forcing:
    """``c = 1`` on every component, so ``B = -∇ log p``."""
    return Forcing(tuple(components))
