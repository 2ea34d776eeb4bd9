"""Affine Stein correction of an estimated score: the score-matching refit of ``ŝ + V z̃``.

An estimate ``ŝ`` of ``∇ log p`` (kernel embedding, score matching) is biased where it is poorly
resolved — tails, walls, rejected samples (``ŝ = 0`` outside ``D_{M,δ}``). The family

    ``s_V(x) = ŝ(x) + V z̃(x)``,   ``z̃ = ((x - x̄) / σ, 1)`` ``(d + 1,)``,   ``V`` ``(d, d + 1)``,

contains ``ŝ`` (``V = 0``). Its Hyvärinen (2005) loss ``J(s) = E[½|s|² + ∇·s]`` is quadratic in
``V`` (``∇·(V z̃) = Σ_j V_jj / σ_j``), with minimiser

    ``V = -(E[ŝ z̃ᵀ] + D) E[z̃ z̃ᵀ]⁻¹``,   ``D = [diag(1 / σ) | 0]``                 (1)

``σ`` (the components' standard deviations, default 1) does not change the family, only its
coordinates: it keeps ``E[z̃ z̃ᵀ]`` near the identity, so the solve is well conditioned in any
units (with ``σ = 1`` and data in units of 1e-150 its entries span 300 decades).

(plain sample means over the trajectory). Since ``J(s) = ½ E|s - ∇ log p|² + const`` (the Fisher
divergence up to a constant) and ``V = 0`` is in the family, the refit never has a larger
population Fisher divergence than ``ŝ``; with ``d (d + 1)`` parameters fitted on ``N`` samples
its sampling cost is negligible. At the minimiser the sample Stein identity holds for every
affine test function, ``Ê[s_V (x - x̄)ᵀ] = -I`` and ``Ê[s_V] = 0``: for ``A = x`` and a constant
forcing the corrected response has ``k̂(0) = I`` exactly, as the true FDT has, and its bias at
lag 0 — the largest for a kernel embedding with a threshold (see docs/benchmarks.md, section
'Tuning constants') — is removed rather than only reported. The uncorrected estimate's lag-0
Stein residual says how large the correction was.

The response is linear in ``B``: with ``B' = -∂c - c ⊙ s_V = B - c ⊙ (V z̃)``,

    ``k'_ij(s) = k_ij(s) - Σ_k V_jk L_ijk(s)``,
    ``L_ijk(s) = Ê[(A_i(X_{n+s}) - Ā_i) c_j(X_n) z̃_k(X_n)]``,

so the correction needs one more set of lagged sums (``L``, shared by every score) and the
moments ``Σ ŝ z̃ᵀ``, ``Σ z̃ z̃ᵀ`` from the same read as the response — no extra pass. Standard
errors: ``V`` is a constant, so by Minkowski's inequality the corrected estimate's standard
deviation is at most ``σ(k) + Σ_k |V_jk| σ(L_ijk)`` (a bound, no independence assumed).

Periodic components. On a circle ``x_j`` itself is not a function (a wrapped angle jumps by its
period ``P_j`` at the wrap), and integration by parts holds only for periodic test functions.
A periodic component's feature ``(x_j - x̄_j) / σ_j`` is therefore replaced by the pair
``(cos θ_j, sin θ_j)``, ``θ_j = 2π x_j / P_j``; the divergence term of (1) becomes the sample mean
``D = Ê[∇z̃]`` (for a component on the line still ``1 / σ_j``), summed in the same read. The
refit then satisfies the Stein identity for ``cos θ_j, sin θ_j`` (exact on the circle) and no
longer forces one for the wrapped angle, whose true lag-0 response is ``1 - P_j p_j(wrap)``, not 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kelr_dist.kernels.scores.kernel_embedding import row_blocks
from kelr_dist.kernels.scores.score_matching import solve_weights


def _periodic(periods: np.ndarray | None, d: int) -> np.ndarray:
    """``(d,)`` periods, 0 for the components on the line."""
    return np.zeros(d) if periods is None else np.asarray(periods, dtype=np.float64)


def augmented(
    x: np.ndarray,
    origin: np.ndarray,
    scale: np.ndarray | None = None,
    periods: np.ndarray | None = None,
) -> np.ndarray:
    """``z̃`` at ``x (n, d)``: per component ``(x_j - x̄_j) / σ_j``, or ``(cos θ_j, sin θ_j)``
    with ``θ_j = 2π x_j / P_j`` for a period ``P_j > 0`` in ``periods (d,)`` (default none),
    then 1: ``(n, d + p + 1)`` for ``p`` periodic components; ``scale`` ``σ (d,)``, default 1."""
    period = _periodic(periods, x.shape[1])
    # column by column into a Fortran-ordered table (numpy's loops over a d of 2-3 are slow)
    out = np.empty((x.shape[1] + int((period > 0).sum()) + 1, x.shape[0]))
    k = 0
    for j in range(x.shape[1]):
        if period[j] > 0:
            angle = (2.0 * np.pi / period[j]) * x[:, j]
            np.cos(angle, out=out[k])
            np.sin(angle, out=out[k + 1])
            k += 2
        else:
            np.subtract(x[:, j], origin[j], out=out[k])
            if scale is not None:
                out[k] /= scale[j]
            k += 1
    out[k] = 1.0
    return out.T


def divergence_sums(
    x: np.ndarray, scale: np.ndarray | None = None, periods: np.ndarray | None = None
) -> np.ndarray:
    """``Σ_n ∂_j z̃_k(x_n)`` over the rows of ``x (n, d)``: ``(d, w)`` for :func:`augmented`'s
    ``w`` columns (``n / σ_j`` on the line; ``-Σ sin θ_j · 2π / P_j``, ``Σ cos θ_j · 2π / P_j`` on
    a circle)."""
    n, d = x.shape
    period = _periodic(periods, d)
    sigma = np.ones(d) if scale is None else np.asarray(scale, dtype=np.float64)
    out = np.zeros((d, d + int((period > 0).sum()) + 1))
    column = 0
    for j in range(d):
        if period[j] > 0:
            rate = 2.0 * np.pi / period[j]
            angle = rate * x[:, j]
            out[j, column : column + 2] = rate * np.array(
                [-np.sin(angle).sum(), np.cos(angle).sum()]
            )
            column += 2
        else:
            out[j, column] = n / sigma[j]
            column += 1
    return out


def correction_columns(
    x: np.ndarray,
    origin: np.ndarray,
    c: np.ndarray | None,
    scale: np.ndarray | None = None,
    periods: np.ndarray | None = None,
) -> np.ndarray:
    """``c_j z̃_k`` at ``x (n, d)`` with forcing profile ``c (n, d)``: ``(n, d w)``, column
    ``j w + k`` — the "conjugate variables" whose lagged sums are ``L_ijk``. For a
    constant forcing (``c = None``) they do not depend on ``j``: ``z̃`` alone, ``(n, w)``."""
    z = augmented(x, origin, scale, periods)
    if c is None:
        return z
    return (c[:, :, None] * z[:, None, :]).reshape(x.shape[0], -1)


def correction_width(d: int, constant: bool, periodic: int = 0) -> int:
    """Columns of :func:`correction_columns` in ``d`` dimensions, ``periodic`` of them on a
    circle: ``w = d + periodic + 1`` for a constant forcing, ``d w`` otherwise."""
    return (d + periodic + 1) * (1 if constant else d)


def affine_fit(
    score_moment: np.ndarray, second_moment: np.ndarray, divergence: np.ndarray | None = None
) -> np.ndarray:
    """``V (d, w)`` of eq. (1) from ``Ê[ŝ z̃ᵀ] (d, w)`` and ``Ê[z̃ z̃ᵀ] (w, w)``; ``D = Ê[∇z̃]``
    is ``divergence (d, w)`` when given (:func:`divergence_sums` over the rows), else that of
    ``z̃`` on the line with unit scales, ``[I 0]``.

    Solved as score matching's normal equations
    (:func:`~kelr_dist.kernels.scores.score_matching.solve_weights`: scaled to unit diagonal,
    directions below its ``RCOND`` dropped), so a near-singular ``Ê[z̃ z̃ᵀ]`` gives the
    minimum-norm ``V``, never one blown up by rounding."""
    d = score_moment.shape[0]
    if divergence is None:
        divergence = np.eye(d, d + 1)
    (weights,) = solve_weights(second_moment, score_moment + divergence, (0.0,))
    return weights


def corrected_response(
    mean: np.ndarray,
    stderr: np.ndarray,
    lagged: np.ndarray,
    lagged_stderr: np.ndarray,
    weights: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``k' = k - Σ_k V_jk L_·jk`` and its standard-error bound ``σ(k) + Σ_k |V_jk| σ(L_·jk)``.

    ``mean``, ``stderr`` ``(S+1, q, d)``; ``lagged``, ``lagged_stderr`` ``(S+1, q, d, w)``;
    ``weights`` ``V (d, w)``.
    """
    shift = np.einsum("tijk,jk->tij", lagged, weights)
    spread = np.einsum("tijk,jk->tij", lagged_stderr, np.abs(weights))
    return mean - shift, stderr + spread


#: the random Fourier test functions of the sensitivity check (:class:`FourierFeatures`): their
#: number and the length scale of their frequencies in standard deviations of the data. On the
#: systems of scripts/accuracy_suite.py (N = 1e6) the response moves by at most 0.6 total
#: standard errors where the estimate is within its error bars, and by 2.4 (3.5 at N = 1e7) on
#: gamma-3d, whose polynomial score misses its log tie (docs/benchmarks/accuracy.md,
#: docs/benchmarks.md section 'Tuning constants'; Rahimi & Recht, "Random features for
#: large-scale kernel machines", NeurIPS 2007)
FOURIER_COUNT = 64
FOURIER_LENGTH = 0.5


class Features(Protocol):
    """Test functions ``φ (n, K)`` beside the affine ``z̃`` of a refit (:class:`ExtendedScore`),
    for components on the line: ``origin`` ``x̄ (d,)`` and ``scale`` ``σ (d,)`` place ``z̃``
    (:func:`augmented`)."""

    @property
    def origin(self) -> np.ndarray: ...

    @property
    def scale(self) -> np.ndarray: ...

    def __call__(self, x: np.ndarray) -> np.ndarray: ...

    def values_and_divergence_sums(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class FourierFeatures:
    """Random Fourier features ``φ_k(x) = cos(ω_k · (x - x̄) / σ + b_k)``, ``k = 1..K``, with
    ``ω_k ~ N(0, I / ℓ²)`` and ``b_k ~ U(0, 2π)`` from a fixed seed: smooth test functions outside
    every polynomial span, beside the affine features ``z̃`` of the Stein correction.

    ``frequencies (K, d)``, ``phases (K,)``, ``origin`` ``x̄ (d,)`` and ``scale`` ``σ (d,)``."""

    frequencies: np.ndarray
    phases: np.ndarray
    origin: np.ndarray
    scale: np.ndarray

    @classmethod
    def draw(
        cls,
        origin: np.ndarray,
        scale: np.ndarray,
        count: int = FOURIER_COUNT,
        length: float = FOURIER_LENGTH,
        seed: int = 0,
    ) -> FourierFeatures:
        """``count`` features for data centred at ``origin`` with standard deviations ``scale``."""
        rng = np.random.default_rng(seed)
        d = len(origin)
        frequencies = rng.standard_normal((count, d)) / length
        phases = rng.uniform(0.0, 2.0 * np.pi, count)
        return cls(frequencies, phases, np.asarray(origin, float), np.asarray(scale, float))

    def _argument(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.origin) / self.scale) @ self.frequencies.T + self.phases

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``φ(x)`` at ``x (n, d)``: ``(n, K)``."""
        return np.cos(self._argument(x))

    def values_and_divergence_sums(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``φ(x)`` ``(n, K)`` and ``Σ_n ∂_j φ_k(x_n)`` ``(d, K)`` (as :func:`divergence_sums`
        for ``z̃``), from one evaluation of the arguments."""
        argument = self._argument(x)
        sines = np.sin(argument).sum(axis=0)
        divergence = -(self.frequencies * sines[:, None]).T / self.scale[:, None]
        return np.cos(argument, out=argument), divergence


#: entries of the observable's Jacobian held at once by :class:`ObservableFeatures` (32 MiB)
JACOBIAN_ENTRIES = 1 << 22


@dataclass(frozen=True)
class ObservableFeatures:
    """The observable's own functions ``φ = A (n, q)`` as test functions: a refit on them makes
    the sample Stein identity ``Ê[s A_i] = -Ê[∂A_i]`` hold for every ``A_i``, so the response
    of ``A`` to a constant forcing has its exact value at lag 0 (``k(0) = Ê[∂_j A_i]``).

    ``observable``: ``x (n, d) -> (n, q)`` with ``jacobian(x, steps) -> (n, q, d)``
    (:class:`~kelr_dist.kernels.response.operator.Observable`); ``steps`` ``(d,)`` its central
    differences when it has no derivative."""

    observable: Any
    origin: np.ndarray
    scale: np.ndarray
    steps: np.ndarray

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``A(x)`` at ``x (n, d)``: ``(n, q)``."""
        return np.asarray(self.observable(x), dtype=np.float64)

    def values_and_divergence_sums(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``A(x)`` ``(n, q)`` and ``Σ_n ∂_j A_i(x_n)`` ``(d, q)``, the Jacobian ``(n', q, d)``
        taken on row blocks of at most :data:`JACOBIAN_ENTRIES` entries (``q d`` grows as
        ``d²`` on a field)."""
        values = self(x)
        q, d = values.shape[1], x.shape[1]
        divergence = np.zeros((q, d))
        for rows in row_blocks(x.shape[0], max(1, JACOBIAN_ENTRIES // (q * d))):
            divergence += self.observable.jacobian(x[rows], self.steps).sum(axis=0)
        return values, divergence.T


@dataclass(frozen=True)
class StackedFeatures:
    """Several feature sets side by side (placed by the first's ``z̃``)."""

    parts: tuple[Any, ...]  # Features

    @property
    def origin(self) -> np.ndarray:
        return self.parts[0].origin

    @property
    def scale(self) -> np.ndarray:
        return self.parts[0].scale

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.hstack([part(x) for part in self.parts])

    def values_and_divergence_sums(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        values, divergence = zip(
            *(part.values_and_divergence_sums(x) for part in self.parts), strict=True
        )
        return np.hstack(values), np.hstack(divergence)


def parts(features: Any) -> tuple[Any, ...]:
    """The feature sets side by side in ``features``, stacks flattened (itself, unless it is
    :class:`StackedFeatures`)."""
    if not isinstance(features, StackedFeatures):
        return (features,)
    return tuple(part for stacked in features.parts for part in parts(stacked))


def refit_design(
    x: np.ndarray,
    features: Features,
    evaluated: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``[z̃, φ]`` at ``x (n, d)`` ``(n, w)`` and its divergence sums ``Σ_n ∂_j [z̃, φ]``
    ``(d, w)``: the design of a refit by eq. (1). ``evaluated``: each part's values and
    divergence sums at ``x`` by ``id`` (:func:`parts`), filled as they are evaluated, so the
    designs of feature sets that share a part evaluate it once."""
    evaluated = {} if evaluated is None else evaluated
    for part in parts(features):
        if id(part) not in evaluated:
            evaluated[id(part)] = part.values_and_divergence_sums(x)
    phi, divergence = zip(*(evaluated[id(part)] for part in parts(features)), strict=True)
    z = augmented(x, features.origin, features.scale)
    affine = divergence_sums(x, features.scale)
    return np.hstack([z, *phi]), np.hstack([affine, *divergence])


@dataclass(frozen=True)
class ExtendedScore:
    """A score ``ŝ`` refitted as ``ŝ + V [z̃, φ]`` (eq. 1 with the affine features and the test
    functions ``φ`` of ``features``: random Fourier features, the observable's own functions):
    the nearest score to ``∇ log p`` in Fisher divergence in that family, which contains ``ŝ``.
    ``weights`` ``V (d, w)``."""

    base: Any  # a score: x (n, d) -> (∇ log p (n, d), kept (n,))
    features: Any  # Features
    weights: np.ndarray

    @classmethod
    def fit(
        cls, base: Any, features: Any, moment: np.ndarray, sums: dict[str, Any]
    ) -> ExtendedScore:
        """From ``Σ ŝ [z̃, φ]ᵀ`` (``moment``, ``(d, w)``, 0 on the rows ``base`` keeps not) and
        the design's sums ``Σ [z̃, φ][z̃, φ]ᵀ`` (``second``), ``Σ ∂[z̃, φ]`` (``divergence``) and
        ``n`` over the trajectory (:func:`refit_design`)."""
        n = sums["n"]
        second, target = sums["second"] / n, (moment + sums["divergence"]) / n
        # features in few dimensions are nearly collinear (random ones; bins that partition
        # unity with the constant): score matching's scaled minimum-norm solve
        (weights,) = solve_weights(second, target, (0.0,))
        return cls(base, features, weights)

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.on_base(self.design(x), *self.base(x))

    def design(self, x: np.ndarray, evaluated: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """``[z̃, φ]`` at ``x (n, d)``: ``(n, w)``, shared by the refits on the same features;
        ``evaluated``: each part's values at ``x`` by ``id``, as in :func:`refit_design`."""
        evaluated = {} if evaluated is None else evaluated
        for part in parts(self.features):
            if id(part) not in evaluated:
                evaluated[id(part)] = part(x)
        f = self.features
        phi = [evaluated[id(part)] for part in parts(f)]
        return np.hstack([augmented(x, f.origin, f.scale), *phi])

    def on_base(
        self, design: np.ndarray, score: np.ndarray, kept: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """This score from its :meth:`design` and its base's values (``score``, ``kept``) at the
        same rows; on the rows not kept, the base's value (0, or NaN where it is not finite)."""
        return np.where(kept[:, None], score + design @ self.weights.T, score), kept
