"""Conjugate variables, observables, forcings and the response pass (eq. 5, eq. 46).

The linear response operator of an observable ``A`` to a forcing ``c(x) δf(t)`` is
``k_A(s) = E[A(X_s) ⊗ B(X_0)]`` with ``B_i = -∂_i(c_i p) / p = -∂_i c_i - c_i ∂_i log p``
(eq. 5). Every estimate of it differs only in where ``∇ log p`` comes from — a
:class:`Score`:

* :class:`DensityScore` — the kernel-embedding ``p_M``: ``∇p_M / p_M`` on ``{p_M ≥ δ}`` and
  ``B̂ = 0`` elsewhere (eq. 46; the sum is still divided by ``N - s``);
* :class:`FunctionScore` — a known score (the exact FDT response), the quasi-Gaussian score;
* :class:`KDEScore` — the Gaussian KDE baseline;
* :class:`kelr_dist.kernels.scores.score_matching.ScoreModel` — the score-matching fit.

:func:`response_reduction` computes all of them in one pass: per block, ``A`` on the block and
its halo, ``B`` for every score, and the lagged sums with their block-averaging partials
(:mod:`kelr_dist.kernels.response.blocking`), so the data are read once.

Covariance form. The observable enters centred, ``k(s) = (1/N_s) Σ_n (A(X_{n+s}) - Ā) ⊗ B(X_n)``
with ``Ā`` its mean over the trajectory (from an earlier pass). For the true score ``E[B] = 0``
and the centring changes nothing; for an estimate ``Ê[B̂] ≠ 0`` slightly, and without centring
that bias is multiplied by ``|Ā|``: data in other units or with another origin (kelvin instead of
a deviation, positions far from 0) would give another answer. Centred, ``A - Ā`` and ``B̂`` do not
depend on the origin, and their product not on the units.

Lag-0 self-check (Stein's identity). For the true score and any smooth ``g``,
``E[g(X) s(X)ᵀ + ∇g(X)] = 0``; with ``g = c_j (A_i - Ā_i)`` this reads
``k_ij(0) = E[∂_j(c_j (A_i - Ā_i))] = E[c_j ∂_j A_i + (A_i - Ā_i) ∂_j c_j]``. The residual
``k̂(0) - Ê[∂_j(c_j (A_i - Ā_i))]`` of an estimate, with its block-averaging standard error, measures
the estimator's bias at lag 0 without knowing the truth (:attr:`ResponseResult.stein`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from typing import Any, Protocol

import numpy as np

from kelr_dist.kernels.bases.families import TensorBasis
from kelr_dist.kernels.compiled import compiled
from kelr_dist.kernels.reduction import BlockInfo, Reduction
from kelr_dist.kernels.response.blocking import (
    BlockingResult,
    Partial,
    aligned_segments,
    block_standard_error,
    combine_block_partials,
    default_base_block,
    lagged_means,
    merge_block_partial,
    response_block_partial,
    segment_length,
)
from kelr_dist.kernels.response.lagged import strided_lagged_sums
from kelr_dist.kernels.response.stein_correction import (
    ExtendedScore,
    affine_fit,
    augmented,
    corrected_response,
    correction_columns,
    correction_width,
    divergence_sums,
)
from kelr_dist.kernels.scores.kernel_embedding import KernelDensity, Order, evaluate_on_basis
from kelr_dist.kernels.scores.local import LocalScoreModel
from kelr_dist.kernels.scores.score_matching import ScoreModel


class Score(Protocol):
    """``x (n, d) -> (∇ log p (n, d), kept (n,) bool)``; rows not kept get ``B = 0``."""

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


@compiled
def _score_on_support(p, grad, delta, scales, score, kept):  # pragma: no cover - compiled
    """``score = ∇p / p / scales`` where ``p ≥ δ`` (``kept``), 0 below; a non-finite ``p`` or
    gradient is not a low density: NaN, and not kept (counted apart). One pass over the rows."""
    for i in range(p.shape[0]):
        finite = np.isfinite(p[i])
        for k in range(grad.shape[1]):
            finite = finite and np.isfinite(grad[i, k])
        kept[i] = finite and p[i] >= delta
        for k in range(grad.shape[1]):
            if not finite:
                score[i, k] = np.nan
            elif kept[i]:
                score[i, k] = grad[i, k] / p[i] / scales[k]
            else:
                score[i, k] = 0.0


@dataclass(frozen=True)
class DensityScore:
    """``∇ log p_M`` of the kernel-embedding estimate on ``D_{M,δ} = {p_M ≥ δ}`` (eq. 46).

    ``delta`` is in standardized units: it bounds the density of the mapped coordinates
    ``y = (x - loc) / scale``, i.e. ``p_M(x) Π_k scale_k``, so it does not depend on the data's
    units.
    """

    density: KernelDensity
    order: Order
    delta: float

    @cached_property
    def truncated(self) -> KernelDensity:
        """``p_M`` on its own basis (:meth:`KernelDensity.truncated`), built once per score."""
        return self.density.truncated(self.order)

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # in the mapped coordinates, then ∇_x log p = ∇_y log p / scale: finite in any units
        return self.from_density(*self.truncated.evaluate(x, standardized=True))

    @staticmethod
    def many(scores: Sequence[DensityScore], x: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each score at ``x (n, d)``, as its call gives it; scores whose truncations share a
        basis (an estimate and its refits without each fold) share its tables
        (:func:`~kelr_dist.kernels.scores.kernel_embedding.evaluate_on_basis`)."""
        out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(scores)
        groups: dict[TensorBasis, list[int]] = {}
        for k, score in enumerate(scores):
            groups.setdefault(score.truncated.basis, []).append(k)
        for members in groups.values():
            densities = [scores[k].truncated for k in members]
            for k, (p, grad, _) in zip(
                members, evaluate_on_basis(densities, x, standardized=True), strict=True
            ):
                out[k] = scores[k].from_density(p, grad)
        return out  # type: ignore[return-value]

    def from_density(self, p: np.ndarray, grad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The score and the rows kept from ``p_M`` and ``∇p_M`` in the mapped coordinates."""
        score, kept = np.empty_like(grad), np.empty(p.shape, dtype=np.bool_)
        _score_on_support(p, grad, self.delta, self.density.scales, score, kept)
        return score, kept


def function_reference(function: Any) -> str:
    """``module:qualname`` of a user-supplied function, as messages and results name it."""
    return f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', function)}"


def call_user_function(kind: str, function: Callable[..., Any], x: np.ndarray) -> Any:
    """``function(x)`` for a user-supplied ``kind`` ("score function", "observable", "forcing"):
    whatever it raises becomes a :class:`ValueError` naming it and the block's shape (the CLI's
    one line and exit 2, not a traceback from inside a worker)."""
    try:
        return function(x)
    except Exception as err:
        raise ValueError(
            f"the {kind} {function_reference(function)} failed on a block of shape {x.shape} "
            f"(rows of the trajectory, (n, d)): {type(err).__name__}: {err}"
        ) from err


def check_finite(kind: str, function: Any, values: np.ndarray, info: BlockInfo) -> None:
    """Refuse non-finite ``values`` ``(n, ...)`` that the ``kind`` ``function`` returned on the
    rows of block ``info``: a :class:`ValueError` naming the function and the first offending
    row of the trajectory (its chain and time index)."""
    bad = ~np.isfinite(values.reshape(values.shape[0], -1)).all(axis=1)
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(
            f"the {kind} {function_reference(function)} returned a non-finite value (NaN or "
            f"inf) on {int(bad.sum())} of {values.shape[0]} rows of a block; the first is time "
            f"index {info.start + row} of chain {info.chain}: such a function is refused, not "
            "averaged into an all-NaN response"
        )


@dataclass(frozen=True)
class FunctionScore:
    """A known score function ``x (n, d) -> ∇ log p (n, d)``, defined at every sample."""

    function: Callable[[np.ndarray], np.ndarray]

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        score = np.asarray(call_user_function("score function", self.function, x), dtype=np.float64)
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


#: relative step (in units of each component's standard deviation) of the central differences
#: that differentiate an observable given without its derivative
DIFFERENCE_STEP = 1e-5


@dataclass(frozen=True)
class Observable:
    """``A``: ``x (n, d) -> (n, q)`` with component names; identity when ``function`` is None.

    ``derivative`` gives ``∂_j A_i`` ``x (n, d) -> (n, q, d)`` for the lag-0 self-check; without it
    (a user function) the derivative is taken by central differences.
    """

    names: tuple[str, ...]
    function: Callable[[np.ndarray], np.ndarray] | None = None
    derivative: Callable[[np.ndarray], np.ndarray] | None = None

    def jacobian(self, x: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """``∂_j A_i`` at ``x (n, d)``, ``(n, q, d)``; ``steps (d,)`` for central differences."""
        if self.derivative is not None:
            return np.asarray(self.derivative(x), dtype=np.float64)
        if self.function is None:
            return np.broadcast_to(np.eye(x.shape[1]), (x.shape[0], x.shape[1], x.shape[1]))
        out = np.empty((x.shape[0], len(self.names), x.shape[1]))
        for j, h in enumerate(steps):
            up, down = x.copy(), x.copy()
            up[:, j] += h
            down[:, j] -= h
            out[:, :, j] = (self(up) - self(down)) / (2.0 * h)
        return out

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.function is None:
            return x
        a = np.asarray(call_user_function("observable", self.function, x), dtype=np.float64)
        if a.ndim == 1:
            a = a[:, None]
        if a.shape != (x.shape[0], len(self.names)):
            raise ValueError(
                f"observable returned shape {a.shape}, expected {(x.shape[0], len(self.names))}"
            )
        return a


@dataclass(frozen=True, eq=False)
class Forcing:
    """Forcing profile ``c(x)`` per component and its derivative ``∂_i c_i(x)``, both ``(n, d)``.

    ``function=None`` is the constant forcing ``c = 1`` of every component (so ``B = -∇ log p``).
    ``function`` returns ``(c, ∂c)`` for a user-supplied forcing.

    A constant forcing may also carry ``patterns`` ``f (m, d)`` named ``pattern_names``: the
    constant forcing ``c = f`` of all components at once, whose conjugate variable is
    ``B_f = Σ_j f_j B_j = -f · ∇ log p`` (eq. 5). Each is one more column of ``B`` after the
    components' (``columns``), so its lagged sums, standard errors, Stein correction and
    lag-0 Stein residual are its own, not combined from the components' columns afterwards
    (which would lose the correlations between them).
    """

    names: tuple[str, ...]
    function: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None
    patterns: np.ndarray | None = None
    pattern_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.patterns is None:
            if self.pattern_names:
                raise ValueError(f"pattern_names {self.pattern_names} given without patterns")
            return
        patterns = np.asarray(self.patterns, dtype=np.float64)
        if self.function is not None:
            raise ValueError(
                "patterns combine the columns of the constant forcing; a forcing function "
                f"{function_reference(self.function)} gives its own profile instead"
            )
        shape = (len(self.pattern_names), len(self.names))
        if patterns.shape != shape or not np.isfinite(patterns).all():
            raise ValueError(
                f"patterns must be finite, of shape {shape} (one row per pattern name, one "
                f"column per component), got shape {patterns.shape}"
            )
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(
                f"pattern_names {self.pattern_names} must differ from each other and from the "
                "components' names"
            )
        object.__setattr__(self, "patterns", patterns)

    @property
    def columns(self) -> tuple[str, ...]:
        """Names of the columns of ``B`` (the result's ``j``): the components, then the
        patterns."""
        return self.names + self.pattern_names

    @property
    def width(self) -> int:
        """Number of columns of ``B``: ``d + m``."""
        return len(self.columns)

    def extended(self, values: np.ndarray, axis: int = -1) -> np.ndarray:
        """``values`` with an axis over the components (``d`` long, ``axis``) extended to the
        columns of ``B``: each pattern's combination ``Σ_j f_j values_j`` appended, ``d + m``
        long; ``values`` itself without patterns."""
        if self.patterns is None:
            return values
        combined = np.moveaxis(np.moveaxis(values, axis, -1) @ self.patterns.T, -1, axis)
        return np.concatenate([values, combined], axis=axis)

    def profile(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``c`` and ``∂_i c_i`` at ``x (n, d)``, each ``(n, d)``."""
        if self.function is None:
            return np.ones(x.shape), np.zeros(x.shape)
        returned = call_user_function("forcing", self.function, x)
        if not (isinstance(returned, tuple | list) and len(returned) == 2):
            what = (
                f"a {type(returned).__name__} of {len(returned)} values"
                if isinstance(returned, tuple | list)
                else f"one {type(returned).__name__}"
                + (f" of shape {np.shape(returned)}" if hasattr(returned, "shape") else "")
            )
            raise ValueError(
                f"the forcing {function_reference(self.function)} returned {what}; a forcing "
                "returns a pair (c, dc): the profile c and its divergence terms dc_i = ∂_i c_i, "
                f"each of shape {x.shape} (eq. 5)"
            )
        c, dc = (np.asarray(v, dtype=np.float64) for v in returned)
        if c.shape != x.shape or dc.shape != x.shape:
            raise ValueError(
                f"forcing returned shapes {c.shape} and {dc.shape}, expected {x.shape} each"
            )
        return c, dc

    def conjugate(self, x: np.ndarray, score: np.ndarray, kept: np.ndarray) -> np.ndarray:
        """``B_i = -∂_i c_i - c_i ∂_i log p`` (eq. 5) with the score set to 0 on rows not kept
        (eq. 46: ``B̂ = 0`` there for a constant forcing; ``-∂_i c_i``, which needs no density,
        is kept for a varying one), then the patterns' ``B_f = Σ_j f_j B_j``: ``(n, d + m)``."""
        if self.function is None:  # -score where kept, 0 elsewhere, in one pass
            b = np.negative(score, out=np.zeros_like(score), where=kept[:, None])
            return self.extended(b)
        score = np.where(kept[:, None], score, 0.0)
        c, dc = self.profile(x)
        return -dc - c * score


@dataclass(frozen=True)
class ResponseResult:
    """One response estimate: ``mean`` and ``stderr`` ``(S+1, q, d)``, the rows kept, and the
    lag-0 Stein residual ``k̂(0) - Ê[∂_j(c_j (A_i - Ā_i))]`` with its standard error (``stein``,
    mean and stderr of shape ``(1, q·d, 1)``; see the module docstring)."""

    blocking: BlockingResult
    kept: int
    n: int
    stein: BlockingResult
    #: the affine Stein correction ``V (d, d + 1)`` applied
    #: (:mod:`kelr_dist.kernels.response.stein_correction`) and the uncorrected estimate's lag-0
    #: Stein residual; ``None`` when not corrected
    correction: np.ndarray | None = None
    uncorrected_stein: BlockingResult | None = None
    #: the estimator's own standard error ``(S+1, q, d)`` from the delete-a-group jackknife over
    #: the held-out folds (:func:`jackknife_stderr`), and the same for the lag-0 response before
    #: the affine correction ``(q, d)``; ``None`` for a score that is not refitted by fold
    estimator_stderr: np.ndarray | None = None
    uncorrected_estimator_stderr: np.ndarray | None = None
    #: rows where the score was not finite (a kernel-embedding ``p_M`` that is NaN or inf there),
    #: set to ``B = 0`` like the rejected rows but counted apart from them
    nonfinite: int = 0
    #: ``(S+1, q, d)``: the response of a neighbouring model (two steps richer, say, or with
    #: more features) minus this one, on the same samples, per entry the largest of the
    #: neighbours'; ``None`` without any
    model_shift: np.ndarray | None = None

    @property
    def total_stderr(self) -> np.ndarray:
        """``(S+1, q, d)``: ``sqrt(stderr² + estimator_stderr²)``, the sampling error of the
        lagged mean and the variance of the fitted score together (the sampling error alone
        when the estimator's is not known)."""
        if self.estimator_stderr is None:
            return self.stderr
        return np.hypot(self.stderr, self.estimator_stderr)

    @property
    def stein_total_stderr(self) -> np.ndarray:
        """``(q, d)`` standard error of the lag-0 Stein residual with the estimator's variance
        (the residual is ``k̂(0)`` minus a target that does not depend on the score)."""
        if self.estimator_stderr is None:
            return self.stein_residual_stderr
        return np.hypot(self.stein_residual_stderr, self.estimator_stderr[0])

    @property
    def uncorrected_stein_total_stderr(self) -> np.ndarray | None:
        """``(q, d)`` the same before the Stein correction (``None`` if not corrected)."""
        raw = self.uncorrected_stein_residual_stderr
        if raw is None or self.uncorrected_estimator_stderr is None:
            return raw
        return np.hypot(raw, self.uncorrected_estimator_stderr)

    @property
    def stein_residual(self) -> np.ndarray:
        """``(q, d)``."""
        return self.stein.mean.reshape(self.mean.shape[1:])

    @property
    def stein_residual_stderr(self) -> np.ndarray:
        """``(q, d)``."""
        return self.stein.stderr.reshape(self.mean.shape[1:])

    @property
    def uncorrected_stein_residual(self) -> np.ndarray | None:
        """``(q, d)`` lag-0 Stein residual before the Stein correction (``None`` if none)."""
        if self.uncorrected_stein is None:
            return None
        return self.uncorrected_stein.mean.reshape(self.mean.shape[1:])

    @property
    def uncorrected_stein_residual_stderr(self) -> np.ndarray | None:
        """``(q, d)`` its standard error (``None`` if not corrected)."""
        if self.uncorrected_stein is None:
            return None
        return self.uncorrected_stein.stderr.reshape(self.mean.shape[1:])

    @property
    def mean(self) -> np.ndarray:
        return self.blocking.mean

    @property
    def stderr(self) -> np.ndarray:
        return self.blocking.stderr

    @property
    def rejection(self) -> float:
        """Fraction of samples with ``B = 0`` because the density is low (outside ``D_{M,δ}``),
        not counting those where it is not finite (:attr:`nonfinite_rejection`)."""
        return 1.0 - (self.kept + self.nonfinite) / self.n

    @property
    def nonfinite_rejection(self) -> float:
        """Fraction of samples with ``B = 0`` because the score was not finite there."""
        return self.nonfinite / self.n


#: a row ``i`` of ``k(0)`` is "away from 0" (a share of it is defined) when some ``|k_ij(0)|`` is
#: above LAG0_SIGNIFICANCE of its standard errors (when they are known) and its
#: ``max_j |k_ij(0)|`` above LAG0_FRACTION of the largest row's. A row of a near-constant or
#: uncorrelated component has ``k(0) ~ 0``, and a share of it is noise divided by noise (the
#: report printed 4e10 %).
LAG0_SIGNIFICANCE = 3.0
LAG0_FRACTION = 1e-6


def relative_to_lag0(
    residual: np.ndarray, lag0: np.ndarray, lag0_stderr: np.ndarray | None = None
) -> np.ndarray:
    """``|residual_ij| / max_j' |k_ij'(0)|``: a lag-0 Stein residual ``(q, d)`` as a fraction of
    the size of the lag-0 response ``k(0)`` ``(q, d)`` in its row (the observable ``A_i``'s
    units per unit forcing; for ``A = x`` and a constant forcing ``k(0) = I``). NaN in the rows
    whose ``k(0)`` is not away from 0 (:data:`LAG0_SIGNIFICANCE`, :data:`LAG0_FRACTION`;
    ``lag0_stderr`` ``(q, d)``, when known)."""
    lag0 = np.abs(lag0)
    size = np.max(lag0, axis=1, keepdims=True)
    rows = (size > 0) & (size > LAG0_FRACTION * size.max(initial=0.0))
    if lag0_stderr is not None:
        rows &= (lag0 > LAG0_SIGNIFICANCE * lag0_stderr).any(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(rows, np.abs(residual) / size, np.nan)


def stein_target(
    observable: Observable, forcing: Forcing, x: np.ndarray, a: np.ndarray, steps: np.ndarray
) -> np.ndarray:
    """``∂_j(c_j (A_i - Ā_i)) = c_j ∂_j A_i + (A_i - Ā_i) ∂_j c_j`` at ``x (n, d)``, ``(n, q, d)``;
    ``a (n, q)`` is the centred observable on the same rows (for a constant forcing, ``c = 1``,
    the target is ``∂_j A_i``, as the Jacobian gives it: a broadcast view for the identity; a
    pattern ``f`` adds its column ``Σ_j f_j ∂_j A_i``, ``(n, q, d + m)``)."""
    if forcing.function is None:
        return forcing.extended(observable.jacobian(x, steps))
    c, dc = forcing.profile(x)
    return observable.jacobian(x, steps) * c[:, None, :] + a[:, :, None] * dc[:, None, :]


#: bytes of a span's arrays (:meth:`_ResponseKernel.row_bytes` per row): a chunk's response
#: partial goes by spans of as many whole segments of the blocking as fit, at least one. Each
#: span pays the ``q d`` inverse transforms of its summed lagged sums (squares, shifts) once, so
#: with hundreds of columns, where a segment holds a few base blocks, the spans save most of
#: them; their arrays above the workers' mmap threshold take fresh pages once per span, a small
#: cost against the transforms saved (see docs/benchmarks.md, section 'Tuning constants')
SPAN_BYTES = 128 * 2**20


def span_length(segment: int, row_bytes: int) -> int:
    """Rows per span of a chunk: the most whole segments of ``segment`` rows whose arrays,
    ``row_bytes`` per row, fit in :data:`SPAN_BYTES` (at least one segment)."""
    return segment * max(1, SPAN_BYTES // (segment * max(row_bytes, 1)))


#: bytes of the lag-0 Stein residual products of one piece of a span (rows in whole base
#: blocks, at least one)
STEIN_PIECE_BYTES = 64 * 2**20

#: key of the lagged sums shared by every corrected score (not a score's name: has a space)
AFFINE = "affine correction"


def _side_by_side(columns: Sequence[np.ndarray]) -> np.ndarray:
    """``np.hstack(columns)`` in column-major order: the lagged sums transform ``B`` column by
    column, which reads a contiguous column faster (see docs/benchmarks.md, section 'Tuning
    constants')."""
    out = np.empty((columns[0].shape[0], sum(c.shape[1] for c in columns)), order="F")
    start = 0
    for column in columns:
        out[:, start : start + column.shape[1]] = column
        start += column.shape[1]
    return out


def replicate_key(name: str, fold: int) -> str:
    """Key of the partials of score ``name`` refitted without held-out ``fold`` (has spaces:
    never a score's name)."""
    return f"{name} without fold {fold}"


def unrefitted_key(name: str) -> str:
    """Key of score ``name`` before its refit on the observable's functions (has spaces)."""
    return f"{name} before the refit"


def neighbour_key(name: str, step: int) -> str:
    """Key of the partials of score ``name``'s neighbouring model ``step`` (has spaces: never a
    score's name)."""
    return f"{name} neighbouring model {step}"


def jackknife_stderr(replicates: np.ndarray) -> np.ndarray:
    """Delete-a-group jackknife standard error from ``K`` leave-one-group-out estimates
    ``θ_(f)`` stacked on axis 0: ``sqrt((K - 1)/K Σ_f (θ_(f) - θ̄)²)`` (Efron & Stein 1981;
    Shao & Tu, *The Jackknife and Bootstrap*, 1995, §5.2, groups of equal size). The groups
    are the held-out folds (:mod:`kelr_dist.kernels.scores.folds`), each much longer than the
    correlation time, so the deleted groups are nearly independent."""
    k = replicates.shape[0]
    spread = replicates - replicates.mean(axis=0)
    return np.sqrt((k - 1) / k * np.sum(spread * spread, axis=0))


@dataclass(frozen=True)
class _ResponseKernel:
    scores: Mapping[str, Score]
    observable: Observable
    forcing: Forcing
    max_lag: int
    centre: np.ndarray  # (q,) Ā
    corrected: frozenset[str]  # scores that get the affine Stein correction
    origin: np.ndarray  # (d,) x̄ of the correction's features
    scales: np.ndarray  # (d,) σ: the correction's features, the central-difference steps
    base_block: int | None = None
    #: per score name, the score refitted without each held-out fold (jackknife replicates)
    replicates: Mapping[str, Sequence[Score]] = field(default_factory=dict)
    periods: np.ndarray | None = None  # (d,) periods of the components on a circle (0: line)
    #: per score name, its neighbouring models (the model's sensitivity, same read)
    neighbours: Mapping[str, Sequence[Score]] = field(default_factory=dict)
    #: per score name, the estimate before a refit on the observable's functions: only its
    #: lag-0 Stein residual is read (the uncorrected one)
    unrefitted: Mapping[str, Score] = field(default_factory=dict)
    #: the replicates and the neighbours are read on every ``replicate_stride``-th origin
    #: (:func:`replicate_stride`)
    replicate_stride: int = 1
    #: block levels the partials hold (:func:`~kelr_dist.kernels.response.blocking.
    #: useful_levels`; ``None``: every level with a block)
    max_levels: int | None = None

    def chunk(self, x: np.ndarray, info: BlockInfo, halo: np.ndarray | None) -> dict[str, Any]:
        """The chunk's partial, by spans of whole segments of the blocking
        (:func:`~kelr_dist.kernels.response.blocking.segment_length`, aligned to the time index;
        each with the next ``S`` rows as its halo), merged like separate chunks: a span is
        :func:`span_length` rows, its arrays within :data:`SPAN_BYTES`. Its scores are evaluated
        once, and its lagged sums that only add up (the squares, the replicates' and the
        neighbours' shifts) pay their ``q d`` inverse transforms once per span; its block sums
        go by segments, whose arrays stay under the workers' mmap threshold and are reused from
        the heap (see docs/benchmarks.md, section 'Tuning constants')."""
        halo = np.empty((0, x.shape[1])) if halo is None else halo
        k0 = default_base_block(self.max_lag) if self.base_block is None else self.base_block
        segment = segment_length(self.max_lag, len(self.observable.names) * self.columns, k0)
        total = None
        for piece, rows in aligned_segments(
            info, span_length(segment, self.row_bytes), self.max_lag
        ):
            if rows.stop <= x.shape[0]:
                x_ext = x[rows]
            else:  # the last spans' halo runs into the chunk's halo
                x_ext = np.concatenate([x[rows.start :], halo[: rows.stop - x.shape[0]]])
            part = self._span(x_ext, piece, segment)
            total = part if total is None else _combine(total, part, merge_block_partial)
        assert total is not None
        return total

    def partial_bytes(self, levels: int) -> int:
        """Bytes of one partial, about: the block statistics (mean and sum of squares per
        level, the sums and the squares), ``(2 levels + 2) (S + 1) q`` :attr:`columns`, and
        the replicates' and neighbours' lagged sums, float64."""
        q, d = len(self.observable.names), self.forcing.width
        return 8 * (self.max_lag + 1) * q * ((2 * levels + 2) * self.columns + self.others * d)

    @property
    def row_bytes(self) -> int:
        """Bytes per row of a span's arrays (:func:`span_length`): ``x``, ``A`` and its
        square, ``B`` and its square, the scores' values and, on the replicates' origins, the
        replicates' and the neighbours' values and shifts, all float64."""
        own = len(self.scores) + len(self.unrefitted)
        q, components = len(self.observable.names), len(self.forcing.names)
        floats = components + 2 * q + 2 * self.columns + own * components
        return 8 * (floats + -(-2 * self.others * self.forcing.width // self.replicate_stride))

    @property
    def others(self) -> int:
        """The jackknife replicates and the neighbouring models, all scores'."""
        return sum(map(len, self.replicates.values())) + sum(map(len, self.neighbours.values()))

    @property
    def columns(self) -> int:
        """Columns of ``B`` with block-averaging error bars: every score's ``d + m`` (the
        components', then the patterns'), then the correction's (``d + 1``, or ``d (d + 1)``
        for a varying forcing). The jackknife replicates' columns need their lagged sums alone
        (their means), not their block averages."""
        d = len(self.forcing.names)
        periodic = 0 if self.periods is None else int((self.periods > 0).sum())
        constant = self.forcing.function is None
        correction = correction_width(d, constant, periodic) if self.corrected else 0
        return len(self.scores) * self.forcing.width + correction

    def _span(self, x_ext: np.ndarray, info: BlockInfo, segment: int) -> dict[str, Any]:
        """Every score's ``B`` side by side (then the correction's columns), so one transform
        of ``A`` serves them all: ``blocks`` holds their lagged sums with the block-averaging
        partials, ``shifts`` the plain lagged sums of the jackknife replicates' and the
        neighbouring models' differences from their score's ``B`` on the origins of
        :func:`replicate_origins` (only their means are used), ``stein`` every score's lag-0
        residual products, ``parts`` per score (and refit) what is not lagged; ``x_ext`` holds
        the span's rows followed by its halo, whose block sums go by ``segment`` rows."""
        x = x_ext[: info.length]
        # column-major: every transform and product below reads one column at a time
        a_ext = np.subtract(self.observable(x_ext), self.centre, order="F")
        a = a_ext[: info.length]
        # the correction's features (only a corrected estimate uses them)
        z = augmented(x, self.origin, self.scales, self.periods) if self.corrected else None
        if self.observable.function is not None:
            check_finite("observable", self.observable.function, a_ext, info)
        if self.forcing.function is not None:
            check_finite("forcing", self.forcing.function, np.hstack(self.forcing.profile(x)), info)

        # the scores and the estimates before their refit on every row; the replicates and the
        # neighbours, which enter as differences from their score, on the replicates' origins
        own = list(self.scores.items()) + [
            (unrefitted_key(name), score) for name, score in self.unrefitted.items()
        ]
        values = dict(
            zip([k for k, _ in own], evaluate_scores([s for _, s in own], x), strict=True)
        )
        others = [
            (replicate_key(name, fold), name, score)
            for name, refits in self.replicates.items()
            for fold, score in enumerate(refits)
        ] + [
            (neighbour_key(name, step), name, score)
            for name, models in self.neighbours.items()
            for step, score in enumerate(models)
        ]
        origins = replicate_origins(info, self.replicate_stride)
        x_replicas = x[origins]
        replicate_values = evaluate_scores([s for _, _, s in others], x_replicas) if others else []

        columns: list[np.ndarray] = []
        parts: dict[str, dict[str, Any]] = {}
        for name, score in self.scores.items():
            s, kept = values[name]
            columns.append(self._conjugate(name, score, x, s, kept, info, parts))
            if z is not None and name in self.corrected:
                # of the score where kept, 0 elsewhere: of -B itself for the constant forcing
                # (its components' columns)
                parts[name]["moment"] = (
                    -(columns[-1][:, : x.shape[1]].T @ z) if self.forcing.function is None
                    else np.where(kept[:, None], s, 0.0).T @ z
                )  # fmt: skip
        unrefitted = [
            self.forcing.conjugate(x, *values[unrefitted_key(name)]) for name in self.unrefitted
        ]
        stein = self._stein(x, a, columns + unrefitted, info)
        names = list(self.scores)
        d = self.forcing.width
        shifts = np.empty((x_replicas.shape[0], len(others) * d)) if others else None
        for k, ((key, name, score), (s, kept)) in enumerate(
            zip(others, replicate_values, strict=True)
        ):
            b = self._conjugate(key, score, x_replicas, s, kept, info, parts, origins)
            assert shifts is not None
            shifts[:, k * d : (k + 1) * d] = b - columns[names.index(name)][origins]
            if z is not None and name in self.corrected:
                own_s, own_kept = values[name]
                difference = np.where(kept[:, None], s, 0.0) - np.where(
                    own_kept[origins, None], own_s[origins], 0.0
                )
                parts[key]["moment"] = difference.T @ z[origins]
        if z is not None:
            # a constant forcing shares the columns z̃ between all j: d + 1 lagged sums
            if self.forcing.function is None:
                columns.append(z)
            else:
                profile = self.forcing.profile(x)[0]
                columns.append(
                    correction_columns(x, self.origin, profile, self.scales, self.periods)
                )
            divergence = divergence_sums(x, self.scales, self.periods)
            parts[AFFINE] = {"moment": z.T @ z, "divergence": divergence, "n": x.shape[0]}
        return {
            "blocks": response_block_partial(
                a_ext,
                _side_by_side(columns),
                self.max_lag,
                info,
                self.base_block,
                max_levels=self.max_levels,
                segment_rows=segment,
                # z̃ ends with its constant feature: its sums need no transform
                ones=int(z is not None and self.forcing.function is None),
            ),
            "shifts": (
                None
                if shifts is None
                else strided_lagged_sums(a_ext, shifts, self.max_lag, origins, info.length)
            ),
            "replicate_counts": replicate_counts(info, self.replicate_stride, self.max_lag),
            "stein": stein,
            "parts": parts,
        }

    def _stein(
        self, x: np.ndarray, a: np.ndarray, conjugates: Sequence[np.ndarray], info: BlockInfo
    ) -> Partial:
        """The lag-0 Stein residual products ``a_i b_j - ∂_j(c_j A_i)`` of every conjugate
        variable ``b (n, d)``, then the target ``∂_j(c_j A_i)`` itself, and their block-averaging
        partial, by aligned row pieces whose
        ``k q d`` products stay within :data:`STEIN_PIECE_BYTES` (with d in the hundreds,
        ``q d`` columns of a whole span would take gigabytes; with a few components a
        span is one piece); the pieces merge like separate chunks."""
        k0 = default_base_block(0)
        width = (len(conjugates) + 1) * a.shape[1] * self.forcing.width
        total = None
        pieces = k0 << max(int(STEIN_PIECE_BYTES // (8 * width * k0)).bit_length() - 1, 0)
        for piece, rows in aligned_segments(info, pieces, 0):
            x_p, a_p = x[rows], a[rows]
            target = stein_target(
                self.observable, self.forcing, x_p, a_p, DIFFERENCE_STEP * self.scales
            )
            # a_i b_j - target_ij with the rows last (numpy's inner loop runs along them, not
            # over the few components), score-major like the lagged sums' columns; the target
            # itself last, whose mean a corrected estimate's k(0) reduces to
            residuals = np.empty((len(conjugates) + 1, *target.shape[1:], piece.length))
            residuals[-1] = np.moveaxis(target, 0, -1)
            for k, b in enumerate(conjugates):
                np.multiply(a_p.T[:, None, :], b[rows].T[None, :, :], out=residuals[k])
                residuals[k] -= residuals[-1]
            part = response_block_partial(
                residuals.reshape(-1, piece.length).T, np.ones((piece.length, 1)), 0, piece
            )
            total = part if total is None else merge_block_partial(total, part)
        assert total is not None  # a span has at least one row
        return total

    def _conjugate(
        self,
        key: str,
        score: Score,
        x: np.ndarray,
        s: np.ndarray,
        kept: np.ndarray,
        info: BlockInfo,
        parts: dict[str, Any],
        rows: slice = slice(None),
    ) -> np.ndarray:
        """``B`` of score ``key`` from its values ``s``, ``kept`` at ``x``, the span's
        ``rows``: an estimated score must be finite where it is used; its counts go to
        ``parts[key]``."""
        finite = np.logical_and.reduce([np.isfinite(column) for column in s.T])
        if isinstance(score, FunctionScore):
            check_finite("score function", score.function, s, info)
        elif not finite[kept].all():  # an estimated score: only where it is used
            row = range(info.length)[rows][int(np.flatnonzero(kept & ~finite)[0])]
            raise ValueError(
                f"the estimated score {key!r} is not finite at time index "
                f"{info.start + row} of chain {info.chain}"
            )
        parts[key] = {"kept": int(kept.sum()), "n": x.shape[0], "nonfinite": int((~finite).sum())}
        return self.forcing.conjugate(x, s, kept)


#: origins the replicates' and the neighbours' responses are read on, at least (about 1e6):
#: their differences from the score's response are smooth in the data, and on a subsample of
#: this size their sampling noise is a small share of the jackknife's spread (see
#: docs/benchmarks.md, section 'Tuning constants')
REPLICATE_ROWS = 2**20


def replicate_stride(rows: int) -> int:
    """Every ``m``-th origin (of the time index) carries the replicates' and the neighbouring
    models' differences from their score: ``m`` is the largest power of two that leaves at
    least :data:`REPLICATE_ROWS` of the ``rows`` (1 below ``2 REPLICATE_ROWS``)."""
    return 1 << max(int(rows // REPLICATE_ROWS).bit_length() - 1, 0)


def replicate_origins(info: BlockInfo, stride: int) -> slice:
    """The rows of a block whose time index is a multiple of ``stride``: the same origins in
    any chunking."""
    return slice((-info.start) % stride, info.length, stride)


def replicate_counts(info: BlockInfo, stride: int, max_lag: int) -> np.ndarray:
    """``(S+1,)`` pairs per lag of the replicates' origins of a block: origins ``n`` with
    ``n + s`` in the chain."""
    first = info.start + (-info.start) % stride
    stops = np.minimum(info.stop, info.chain_length - np.arange(max_lag + 1))
    return np.maximum(-(-(stops - first) // stride), 0)


def evaluate_scores(scores: Sequence[Score], x: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each score's ``(∇ log p, kept)`` at ``x (n, d)``, sharing work: a refit
    (:class:`~kelr_dist.kernels.response.stein_correction.ExtendedScore`) starts from its base's
    values, every base once, and the refits on one feature set share its values; the
    kernel-embedding scores together (:meth:`DensityScore.many`: an estimate and its refits share
    the basis tables), the score-matching models together (:meth:`ScoreModel.many`: they share
    the feature values), and the local ones (:meth:`LocalScoreModel.many`: they share the
    polynomial tables, and the feature values of the same features)."""
    roots = [score.base if isinstance(score, ExtendedScore) else score for score in scores]
    index: dict[int, int] = {}
    unique: list[Score] = []
    for root in roots:
        if id(root) not in index:
            index[id(root)] = len(unique)
            unique.append(root)
    values: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(unique)
    for kind, many in (
        (DensityScore, DensityScore.many),
        (ScoreModel, ScoreModel.many),
        (LocalScoreModel, LocalScoreModel.many),
    ):
        members = [k for k, root in enumerate(unique) if isinstance(root, kind)]
        if members:
            group: list[Any] = [unique[k] for k in members]
            for k, value in zip(members, many(group, x), strict=True):
                values[k] = value
    for k, root in enumerate(unique):
        if values[k] is None:
            values[k] = root(x)
    designs: dict[int, np.ndarray] = {}  # per feature set, shared by its refits
    evaluated: dict[int, np.ndarray] = {}  # per part of a feature set, shared by the sets
    out = []
    for score, root in zip(scores, roots, strict=True):
        known = values[index[id(root)]]
        assert known is not None
        if isinstance(score, ExtendedScore):
            key = id(score.features)
            if key not in designs:
                designs[key] = score.design(x, evaluated)
            known = score.on_base(designs[key], *known)
        out.append(known)
    return out


def _combine(
    a: dict[str, Any],
    b: dict[str, Any],
    blocks: Callable[[Partial, Partial], Partial] = combine_block_partials,
) -> dict[str, Any]:
    """Two chunks' partials merged; ``blocks`` merges their blocking partials
    (:func:`~kelr_dist.kernels.response.blocking.merge_block_partial` into ``a``'s own, for a
    running total over a chunk's spans)."""
    parts = {
        name: {key: value + b["parts"][name][key] for key, value in part.items()}
        for name, part in a["parts"].items()
    }
    shifts = a["shifts"]
    return {
        "blocks": blocks(a["blocks"], b["blocks"]),
        "shifts": None if shifts is None else shifts + b["shifts"],
        "replicate_counts": a["replicate_counts"] + b["replicate_counts"],
        "stein": blocks(a["stein"], b["stein"]),
        "parts": parts,
    }


def _finalize(
    forcing: Forcing,
    names: tuple[str, ...],
    replicates: dict[str, int],
    neighbours: dict[str, int],
    unrefitted: tuple[str, ...],
    partials: dict[str, Any],
) -> dict[str, ResponseResult]:
    """Each score's columns of ``B`` (:attr:`Forcing.width`) of the shared lagged sums (in the
    chunk's order: the scores ``names``, then the correction's); a score with
    ``replicates[name]`` refits gets their jackknife standard error, and a score with
    ``neighbours[name]`` neighbouring models its :attr:`~ResponseResult.model_shift`, from the
    means of their columns (the plain lagged sums: the refits in the order of ``replicates``,
    then the neighbours). A score named in
    ``unrefitted`` gets the lag-0 Stein residual before its refit on the observable's functions
    as its uncorrected one (the residual columns after the scores')."""
    width = forcing.width
    blocks = block_standard_error(partials["blocks"])
    stein = block_standard_error(partials["stein"])
    parts = partials["parts"]
    shared = parts.get(AFFINE)  # present exactly when some score is corrected
    lagged = blocks.columns(slice(len(names) * width, None))
    shift_means = (
        None
        if partials["shifts"] is None
        else lagged_means(partials["shifts"], partials["replicate_counts"])
    )
    keys = [replicate_key(n, f) for n, k in replicates.items() for f in range(k)]
    keys += [neighbour_key(n, m) for n, k in neighbours.items() for m in range(k)]
    q = blocks.mean.shape[1]

    def lagged_mean(column: int) -> BlockingResult:
        return blocks.columns(slice(column * width, (column + 1) * width))

    def corrected(result: ResponseResult, moment: np.ndarray | None) -> ResponseResult:
        """``result`` with the affine correction fitted to its ``Ê[ŝ z̃ᵀ]`` ``moment``."""
        if moment is None:
            return result
        weights = affine_fit(
            moment,
            shared["moment"] / shared["n"],
            divergence=shared["divergence"] / shared["n"],
        )
        return _corrected(result, weights, lagged, forcing)

    def own_moment(key: str) -> np.ndarray | None:
        p = parts[key]
        return p["moment"] / p["n"] if "moment" in p else None

    def refitted(name: str, key: str) -> tuple[np.ndarray, np.ndarray]:
        """The lag-0 response before the affine correction ``(q, d)`` and the response after it
        ``(S+1, q, d)`` of the refit ``key`` of score ``name``: the score's plus the difference
        read on the replicates' origins (its moment likewise)."""
        main = results[name]
        # the refits' own lag-0 residuals are not kept: the score's stand in for them
        stein_raw = main.stein if main.uncorrected_stein is None else main.uncorrected_stein
        assert shift_means is not None
        column = keys.index(key)
        own = lagged_mean(names.index(name))
        # the refit's mean; its error bars (never used) are the score's
        blocking = replace(
            own, mean=own.mean + shift_means[..., column * width : (column + 1) * width]
        )
        result = ResponseResult(blocking, parts[name]["kept"], parts[name]["n"], stein_raw)
        moment, shift = own_moment(name), own_moment(key)
        return result.mean[0], corrected(result, None if moment is None else moment + shift).mean

    results = {}
    for k, name in enumerate(names):
        p = parts[name]
        stein_k = stein.columns(slice(k * q * width, (k + 1) * q * width), axis=-2)
        result = ResponseResult(
            lagged_mean(k), p["kept"], p["n"], stein_k, nonfinite=p["nonfinite"]
        )
        results[name] = corrected(result, own_moment(name))
    for name, count in replicates.items():
        raw, final = zip(
            *(refitted(name, replicate_key(name, f)) for f in range(count)), strict=True
        )
        results[name] = replace(
            results[name],
            estimator_stderr=jackknife_stderr(np.stack(final)),
            uncorrected_estimator_stderr=(
                jackknife_stderr(np.stack(raw)) if results[name].correction is not None else None
            ),
        )
    target = stein.columns(slice(len(names + unrefitted) * q * width, None), axis=-2)
    for name in names:
        if results[name].correction is not None or name in unrefitted:
            results[name] = _lag0_with_its_target(results[name], target.stderr.reshape(q, width))
    for u, name in enumerate(unrefitted):
        k = len(names) + u
        raw = results[name]
        # the estimator's part of the residual's error bar is the refitted estimate's lag-0
        # jackknife (its fold refits' values at lag 0, Ê[∂A] over the other folds' rows): the
        # unrefitted fold refits are not read
        results[name] = replace(
            raw,
            uncorrected_stein=stein.columns(slice(k * q * width, (k + 1) * q * width), axis=-2),
            uncorrected_estimator_stderr=(
                None if raw.estimator_stderr is None else raw.estimator_stderr[0]
            ),
        )
    for name, count in neighbours.items():
        shifts = np.stack(
            [refitted(name, neighbour_key(name, m))[1] - results[name].mean for m in range(count)]
        )
        largest = np.take_along_axis(shifts, np.abs(shifts).argmax(axis=0)[None], axis=0)[0]
        results[name] = replace(results[name], model_shift=largest)
    return results


def _lag0_with_its_target(result: ResponseResult, target_stderr: np.ndarray) -> ResponseResult:
    """``result`` (a Stein-corrected estimate) with its lag-0 standard errors at least the
    error of the mean it reduces to: the correction is fitted so that ``k̂(0) = Ê[∂_j(c_j A_i)]
    + r`` with a residual ``r`` (0 for the observables it makes exact), on the same samples, so
    ``k̂(0)`` carries the sampling error of that mean, ``target_stderr (q, d)``, which the
    lagged products' error bar (the correction held fixed) leaves out: the lag-0 error bar is
    ``max(σ, sqrt(σ_target² + σ_r²))``."""
    stderr = result.stderr.copy()
    floor = np.hypot(target_stderr, result.stein_residual_stderr)
    stderr[0] = np.fmax(stderr[0], floor)
    return replace(result, blocking=replace(result.blocking, stderr=stderr))


def _corrected(
    raw: ResponseResult, weights: np.ndarray, lagged: BlockingResult, forcing: Forcing
) -> ResponseResult:
    """``raw`` with the affine Stein correction ``V`` applied to its response and its lag-0
    Stein residual (:func:`kelr_dist.kernels.response.stein_correction.corrected_response`);
    a pattern's column ``B_f = Σ_j f_j B_j`` by ``Σ_j f_j V_j`` (:meth:`Forcing.extended`)."""
    on_columns = forcing.extended(weights, axis=0)
    shape = raw.mean.shape + (weights.shape[1],)
    l_mean, l_stderr = (
        np.broadcast_to(v.reshape(shape[:2] + (-1, shape[-1])), shape)
        for v in (lagged.mean, lagged.stderr)
    )
    mean, stderr = corrected_response(raw.mean, raw.stderr, l_mean, l_stderr, on_columns)
    stein_mean, stein_stderr = corrected_response(
        raw.stein_residual[None],
        raw.stein_residual_stderr[None],
        l_mean[:1],
        l_stderr[:1],
        on_columns,
    )
    stein_shape = raw.stein.mean.shape
    return replace(
        raw,
        blocking=replace(raw.blocking, mean=mean, stderr=stderr),
        stein=replace(
            raw.stein,
            mean=stein_mean.reshape(stein_shape),
            stderr=stein_stderr.reshape(stein_shape),
        ),
        correction=weights,
        uncorrected_stein=raw.stein,
    )


def response_reduction(
    scores: Mapping[str, Score],
    observable: Observable,
    forcing: Forcing,
    max_lag: int,
    centre: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    base_block: int | None = None,
    corrected: Collection[str] = (),
    origin: np.ndarray | None = None,
    replicates: Mapping[str, Sequence[Score]] | None = None,
    periods: np.ndarray | None = None,
    neighbours: Mapping[str, Sequence[Score]] | None = None,
    unrefitted: Mapping[str, Score] | None = None,
    replicate_stride: int = 1,
    max_levels: int | None = None,
) -> Reduction:
    """The response pass: ``k(s) = (1/N_s) Σ_n (A(X_{n+s}) - Ā) ⊗ B(X_n)`` (eq. 6, in
    covariance form) for every score in ``scores``, with block-averaging standard errors and the
    lag-0 Stein residual; halo = ``max_lag`` rows.

    ``centre`` is ``Ā`` ``(q,)`` (default 0: no centring); ``scales`` ``(d,)`` the components'
    standard deviations (default 1), which set the central-difference steps of an observable
    given without its derivative and scale the correction's features. The scores named in
    ``corrected`` get the affine Stein correction
    (:mod:`kelr_dist.kernels.response.stein_correction`, features centred at ``origin`` ``(d,)``,
    default 0; use the sample mean; ``periods`` ``(d,)`` gives the components on a circle their
    periodic features) fitted from the same read. ``replicates`` maps some score names to that
    score refitted without each held-out fold: their responses are more columns of the same lagged
    sums (the response is linear in ``B``), corrected as the score is, and give the estimate's
    jackknife standard error (:attr:`ResponseResult.estimator_stderr`, :func:`jackknife_stderr`).
    ``neighbours`` maps some score names to neighbouring models (a richer one, say): their
    responses, on more columns, give :attr:`ResponseResult.model_shift`. ``unrefitted`` maps some
    score names to the estimate before its refit on the observable's functions
    (:func:`~kelr_dist.kernels.scores.refit.refit_reduction`): its lag-0 Stein residual becomes the
    score's uncorrected one. The replicates' and the neighbours' responses are the score's plus
    their difference from it, read on every ``replicate_stride``-th origin
    (:func:`replicate_stride`; 1, the default, reads them on every row). ``max_levels`` caps the
    block levels a partial holds (:func:`~kelr_dist.kernels.response.blocking.useful_levels`:
    the longer ones are never chosen); it also sizes the partials for the engine's combine tree.
    Finalizes to ``{name: ResponseResult}``.
    """
    if int(max_lag) != max_lag or max_lag < 0:
        raise ValueError(f"max_lag must be a non-negative integer, got {max_lag!r}")
    if int(replicate_stride) != replicate_stride or replicate_stride < 1:
        raise ValueError(f"replicate_stride must be a positive integer, got {replicate_stride!r}")
    q, d = len(observable.names), len(forcing.names)
    centre = np.zeros(q) if centre is None else np.asarray(centre, dtype=np.float64)
    scales = np.ones(d) if scales is None else np.asarray(scales, dtype=np.float64)
    unknown = set(corrected) - set(scores)
    if unknown:
        raise ValueError(f"corrected names {sorted(unknown)} are not among the scores")
    origin = np.zeros(d) if origin is None else np.asarray(origin, dtype=np.float64)
    replicates = {name: tuple(refits) for name, refits in (replicates or {}).items()}
    unknown = set(replicates) - set(scores)
    if unknown:
        raise ValueError(f"replicate names {sorted(unknown)} are not among the scores")
    neighbours = {name: tuple(models) for name, models in (neighbours or {}).items()}
    unknown = set(neighbours) - set(scores)
    if unknown:
        raise ValueError(f"neighbour names {sorted(unknown)} are not among the scores")
    unrefitted = dict(unrefitted or {})
    unknown = set(unrefitted) - set(scores) | set(unrefitted) & set(corrected)
    if unknown:
        raise ValueError(
            f"unrefitted names {sorted(unknown)} are not among the scores or are corrected"
        )
    kernel = _ResponseKernel(
        dict(scores),
        observable,
        forcing,
        int(max_lag),
        centre,
        frozenset(corrected),
        origin,
        scales,
        base_block,
        replicates,
        None if periods is None else np.asarray(periods, dtype=np.float64),
        neighbours,
        unrefitted,
        int(replicate_stride),
        None if max_levels is None else int(max_levels),
    )
    counts = {name: len(refits) for name, refits in replicates.items()}
    return Reduction(
        name="response",
        chunk=kernel.chunk,
        combine=_combine,
        finalize=partial(
            _finalize,
            forcing,
            tuple(scores),
            counts,
            {n: len(m) for n, m in neighbours.items()},
            tuple(unrefitted),
        ),
        halo=int(max_lag),
        partial_bytes=0 if max_levels is None else kernel.partial_bytes(max_levels),
    )


def _observable_sums(
    observable: Observable, x: np.ndarray, info: BlockInfo, _halo: np.ndarray | None
) -> dict[str, Any]:
    a = observable(x)
    if observable.function is not None:
        check_finite("observable", observable.function, a, info)
    # column by column: numpy sums a tall C-ordered table along its rows an order of magnitude
    # slower, and without pairwise summation
    return {"sum": np.array([column.sum() for column in a.T]), "n": x.shape[0]}


def observable_mean_reduction(observable: Observable) -> Reduction:
    """``Ā = (1/N) Σ_n A(X_n)`` ``(q,)``: the centre of the covariance form."""
    return Reduction(
        name="observable-mean",
        chunk=partial(_observable_sums, observable),
        finalize=_observable_mean,
    )


def _observable_mean(partial_sums: dict[str, Any]) -> np.ndarray:
    return np.asarray(partial_sums["sum"], dtype=np.float64) / partial_sums["n"]


def identity_observable(components: Sequence[str]) -> Observable:
    """``A(x) = x`` named after the trajectory's components."""
    return Observable(tuple(components))


def constant_forcing(
    components: Sequence[str], patterns: Mapping[str, np.ndarray] | None = None
) -> Forcing:
    """``c = 1`` on every component, so ``B = -∇ log p``; each of ``patterns`` (name: ``f``
    ``(d,)``) adds the column ``B_f = -f · ∇ log p`` of the forcing ``c = f`` (eq. 5)."""
    if not patterns:
        return Forcing(tuple(components))
    return Forcing(
        tuple(components),
        patterns=np.array([np.asarray(f, dtype=np.float64) for f in patterns.values()]),
        pattern_names=tuple(patterns),
    )
