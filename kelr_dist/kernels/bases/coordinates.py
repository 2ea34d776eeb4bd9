"""The automatic basis choice: one coordinate (family and affine map) per component.

Step 1 of the algorithm in §4 of the paper ("for each dimension, run a statistical test to
identify the tail of the marginal distribution of p_eq ... choose an appropriate RKHS basis"),
from the statistics of :mod:`kelr_dist.kernels.survey.moments`. :func:`choose_basis` turns them and
a spec (:mod:`kelr_dist.kernels.bases.spec`) into one
:class:`~kelr_dist.kernels.bases.families.Coordinate` per component; :func:`fit_basis` runs the
whole flow in memory.

Automatic rule (spec entry ``auto``), per coordinate with sample mean μ, standard deviation σ,
skewness γ₁, excess kurtosis γ₂, minimum and maximum:

* **Family.** Laguerre when the marginal is clearly right-skewed *and* bounded on the left:
  ``γ₁ > 0.5`` and ``μ - min <= 0.5 (max - μ)``; otherwise Hermite.
  The data are a correlated time series, so the skewness threshold is far above the iid
  sampling noise ``sqrt(6/N)`` (it allows an effective sample size down to ~ 1e3 at 15 standard
  errors); the half-range ratio separates a hard wall (Gamma(2): ~0.2; the paper's Morse
  marginal: ~0.2) from a skewed distribution with two Gaussian tails (0.8 N(0,1) + 0.2 N(3,1):
  ~0.8). Left-skewed data get Hermite: the Laguerre map ``y = (x - loc) / scale`` needs
  ``scale > 0``, so a reflection is not offered (negate the component upstream if wanted).
* **Hermite** (§3.1.1): ``loc = μ``, ``scale = σ`` (standardising matters: on the triple-well
  raw coordinates give ~10x larger response errors). ``β = 1`` (the paper's choice) when
  ``γ₂ <= 1``; ``β = 1/2`` when ``γ₂ > 1``. Reason (Remark 1): the expansion converges
  in ``L²(W^{1-2β})`` only if ``p² W^{1-2β}`` is integrable; with β = 1 that needs Gaussian decay
  of the standardised density faster than ``exp(-x²/4)``. Within the exponential-power family
  ``exp(-|x|^s)`` a positive excess kurtosis means ``s < 2`` (no Gaussian decay: Laplace has
  γ₂ = 3, Student-t(5) γ₂ = 6), for which only ``β = 1/2`` (``W⁰``: plain ``L²``) is safe. The
  threshold 1 rather than 0 leaves room for sampling noise of a correlated series and for
  multimodal Gaussian-tailed marginals (the triple-well's x₁ has γ₂ ≈ 0.2). Never β < 1/2;
  a given β of at least :data:`MAX_TAIL_BETA` is refused unless the tails are clearly lighter
  than the weight's (the coefficients' variance would be infinite).
* **Laguerre** (§3.1.2, §3.2): ``loc = min - 1e-3 σ`` (every sample has ``y > 0``, as the Gamma
  likelihood needs). Provisional ``scale = σ`` for the Gamma pass (:func:`laguerre_shift`);
  the MLE shape ``k̂`` solves ``log k - ψ(k) = log mean(y) - mean(log y)``. The paper uses
  integer θ (the Hille-Hardy bound, Lemma 3.4), so ``θ = max(0, round(k̂ - 1))``; the
  scale is then the Gamma MLE of the scale with the shape fixed at ``θ + 1``:
  ``scale = (μ - loc) / (θ + 1)`` (the weight's mean equals the data's). ``β = 1`` unless the
  data's tail is clearly heavier than that of the fitted weight, ``γ₂ > 6/(θ+1) + 1`` (the
  Gamma(k) excess kurtosis is 6/k), then ``β = 1/2`` by the same argument as for Hermite.
* **Fourier** (periodic components, :func:`periodicity`): a component declared periodic (a
  ``fourier`` spec entry, or the trajectory's ``periods`` attribute) or found wrapped in the
  data gets the Fourier family on the circle with ``scale = period / 2π`` and ``loc`` its wrap
  point: ``-period/2`` or 0, whichever of the usual windows ``[-P/2, P/2]``, ``[0, P]`` holds
  every sample (else the minimum).

Wrapped components (:func:`detect_periods`, from
:class:`~kelr_dist.kernels.survey.moments.WrapStatistics`): for a usual period ``P`` (2π or 360) a
component is taken as a wrapped angle when all of

1. every sample lies in one usual window of length ``P``;
2. some step between consecutive samples jumps by more than ``P/2`` (a *jump*);
3. its ordinary steps are small: the RMS circular step ``min(|Δ|, P - |Δ|)`` is at most
   :data:`STEP_FRACTION` ``P``;
4. the jumps are nearly whole periods: their RMS circular step is at most
   :data:`JUMP_FRACTION` ``P`` (each spans about three quarters of the window or more).

A diffusion on a circle meets them (its jumps are its wrap crossings, whose circular size is that
of an ordinary step); a coordinate on the line does not: it leaves the window (a Gaussian tail
over 1e6 samples spans ~10σ), or its large steps, when it has them, are large on the circle too
(a fast, nearly independent process: its RMS step is comparable with its range).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kelr_dist.kernels.bases.families import Coordinate, Fourier, Hermite, Laguerre
from kelr_dist.kernels.bases.spec import Entry, parse_basis_spec
from kelr_dist.kernels.reduction import Reduction, reduce_in_memory
from kelr_dist.kernels.survey.moments import (
    CoordinateError,
    GammaFit,
    Moments,
    WrapStatistics,
    gamma_reduction,
    moments_reduction,
    wrap_reduction,
)

SKEWNESS_THRESHOLD = 0.5
"""|skewness| above which a marginal counts as clearly skewed."""
ONE_SIDED_RATIO = 0.5
"""Laguerre needs ``mean - min <= ONE_SIDED_RATIO * (max - mean)`` (a wall on the left)."""
KURTOSIS_THRESHOLD = 1.0
"""Excess kurtosis above which tails count as heavier than the weight's: β = 1/2."""
MAX_TAIL_BETA = 1.5
"""Smallest given β refused for a coordinate whose tails are within :data:`KURTOSIS_THRESHOLD`
of its weight's or heavier: the coefficients' integrands ``ψ_m W^{1-β}`` then have infinite
variance, since for a density with the weight's tails ``E[W^{2-2β}] = ∫ W^{3-2β}`` diverges at
``β ≥ 3/2`` (Hermite; Laguerre likewise, ``∫ e^{-y} e^{2(β-1)y}``), and far samples overflow
float64 (:meth:`~kelr_dist.kernels.bases.families.Hermite.weighted_polynomials`). Lighter tails
(a bounded or quartic-well marginal) may take any β."""
SHIFT_MARGIN = 1e-3
"""Laguerre shift below the minimum, in standard deviations."""
STEP_FRACTION = 0.15
"""A wrapped component's RMS circular step is at most this fraction of the period (54°)."""
JUMP_FRACTION = 0.25
"""... and its jumps' RMS circular step at most this fraction (they span 3/4 of it or more)."""
WINDOW_TOLERANCE = 1e-9
"""Relative slack of the window test (a stored π may round above π)."""


@dataclass(frozen=True)
class Periodicity:
    """A periodic component: its ``period`` and wrap point ``loc`` (data units) and why."""

    period: float
    loc: float
    reason: str


def _window(moments: Moments, k: int, period: float) -> float | None:
    """The lower edge of the usual window (``[-P/2, P/2]`` or ``[0, P]``) that holds every
    sample of coordinate ``k``, or None."""
    slack = WINDOW_TOLERANCE * period
    for lo in (-period / 2.0, 0.0):
        if moments.minimum[k] >= lo - slack and moments.maximum[k] <= lo + period + slack:
            return lo
    return None


def detect_periods(moments: Moments, wraps: WrapStatistics) -> list[Periodicity | None]:
    """The wrapped components found in the data (rule in the module docstring), ``d`` entries
    (None: not found wrapped)."""
    out: list[Periodicity | None] = []
    for k in range(moments.d):
        found = None
        for c, period in enumerate(wraps.periods):
            lo = _window(moments, k, float(period))
            step, jump = float(wraps.step_rms[k, c]), float(wraps.jump_rms[k, c])
            if (
                lo is not None
                and wraps.jumps[k, c] > 0
                and step <= STEP_FRACTION * period
                and jump <= JUMP_FRACTION * period
            ):
                found = Periodicity(
                    float(period),
                    lo,
                    f"wrapped: values within [{lo:.6g}, {lo + period:.6g}], "
                    f"{int(wraps.jumps[k, c])} jumps of nearly a whole period (RMS {jump:.3g} "
                    f"short of it) while the RMS step is {step:.3g}",
                )
                break
        out.append(found)
    return out


def periodicity(
    moments: Moments,
    spec: str | Sequence[object] = "auto",
    wraps: WrapStatistics | None = None,
    declared: Sequence[float | None] | None = None,
) -> list[Periodicity | None]:
    """Which components are periodic, ``d`` entries (None: not periodic), in this order of
    precedence: a spec entry (``fourier(...)`` declares a period, any other family none); a
    declared period (``declared[k]``: a period, 0 for not periodic, None when not declared —
    the trajectory's ``periods`` attribute); detection from ``wraps`` (:func:`detect_periods`)."""
    entries = parse_basis_spec(spec, moments.d)
    found = detect_periods(moments, wraps) if wraps is not None else [None] * moments.d
    out: list[Periodicity | None] = []
    for k, (name, params) in enumerate(entries):
        given = None if declared is None else declared[k]
        if name == "fourier":
            period = 2.0 * math.pi * params.get("scale", 1.0)
            reason = "declared by the basis spec"
        elif name == "auto" and given is not None:
            period, reason = float(given), "declared by the trajectory's 'periods' attribute"
        else:
            out.append(found[k] if name == "auto" else None)
            continue
        if period <= 0:
            out.append(None)
            continue
        lo = params.get("loc", _window(moments, k, period))
        out.append(Periodicity(period, float(moments.minimum[k] if lo is None else lo), reason))
    return out


def laguerre_shift(moments: Moments, k: int) -> tuple[float, float]:
    """Provisional Laguerre ``(loc, scale)`` of coordinate ``k``: ``(min - 1e-3 σ, σ)``."""
    std = float(moments.std[k])
    return float(moments.minimum[k]) - SHIFT_MARGIN * std, std


def _auto_family(moments: Moments, k: int) -> str:
    """``"laguerre"`` for a clearly right-skewed marginal with a wall on the left, else Hermite."""
    mean = moments.mean[k]
    one_sided = mean - moments.minimum[k] <= ONE_SIDED_RATIO * (moments.maximum[k] - mean)
    return "laguerre" if moments.skewness[k] > SKEWNESS_THRESHOLD and one_sided else "hermite"


def _tail_beta(excess_kurtosis: float, weight_kurtosis: float) -> float:
    """β = 1 unless the tail is clearly heavier than the weight's (Remark 1): 1/2."""
    return 0.5 if excess_kurtosis > weight_kurtosis + KURTOSIS_THRESHOLD else 1.0


def _check_beta(k: int, beta: float, excess_kurtosis: float, weight_kurtosis: float) -> None:
    """:class:`CoordinateError` for a β of at least :data:`MAX_TAIL_BETA` on tails that are not
    clearly lighter than the weight's."""
    if beta >= MAX_TAIL_BETA and excess_kurtosis > weight_kurtosis - KURTOSIS_THRESHOLD:
        raise CoordinateError(
            k,
            f"basis beta={beta:g} cannot work on these tails (excess kurtosis "
            f"{excess_kurtosis:.3g}, not below its weight's {weight_kurtosis:g} - "
            f"{KURTOSIS_THRESHOLD:g}): the coefficients' variance is infinite for beta >= "
            f"{MAX_TAIL_BETA:g}; give beta < {MAX_TAIL_BETA:g} (or none: 1, or 1/2 for heavy "
            "tails)",
        )


def _resolved_entries(
    moments: Moments,
    spec: str | Sequence[object],
    periodic: Sequence[Periodicity | None] | None = None,
) -> list[Entry]:
    """The entries with ``auto`` replaced by the family the rule picks (Fourier for the
    ``periodic`` components, default: those the spec declares); a constant coordinate (which
    no basis, forcing or estimate can use) is a :class:`CoordinateError`."""
    for constant in np.flatnonzero(moments.std == 0):
        raise CoordinateError(
            int(constant),
            f"constant (every sample is {moments.mean[constant]:g}): a component without spread "
            "can be neither forced nor estimated; leave it out (components=, --components, "
            "input.components)",
        )
    entries = parse_basis_spec(spec, moments.d)
    periodic = periodicity(moments, spec) if periodic is None else periodic
    out: list[Entry] = []
    for k, (name, params) in enumerate(entries):
        if (p := periodic[k]) is not None:
            out.append(("fourier", {"loc": p.loc, "scale": p.period / (2.0 * math.pi)}))
        else:
            out.append((_auto_family(moments, k), {}) if name == "auto" else (name, params))
    return out


def _laguerre_loc(moments: Moments, k: int, params: dict[str, float]) -> float:
    loc = params["loc"] if "loc" in params else laguerre_shift(moments, k)[0]
    if loc > moments.minimum[k]:
        raise ValueError(
            f"coordinate {k}: Laguerre shift loc={loc!r} is above the data minimum "
            f"{moments.minimum[k]!r}; every sample needs x >= loc"
        )
    return loc


def gamma_reduction_for(
    moments: Moments,
    spec: str | Sequence[object] = "auto",
    periodic: Sequence[Periodicity | None] | None = None,
) -> Reduction | None:
    """The Gamma pass :func:`choose_basis` needs for ``spec``, or ``None`` if it needs none.

    It fits the Laguerre coordinates whose θ is not given, with their final shift and the
    provisional scale σ of :func:`laguerre_shift`.
    """
    columns, locs, scales = [], [], []
    for k, (name, params) in enumerate(_resolved_entries(moments, spec, periodic)):
        if name == "laguerre" and "theta" not in params:
            columns.append(k)
            locs.append(_laguerre_loc(moments, k, params))
            scales.append(laguerre_shift(moments, k)[1])
    return gamma_reduction(locs, scales, columns) if columns else None


def _theta_from_fit(gamma: GammaFit | None, k: int, loc: float) -> float:
    """Integer Laguerre θ = max(0, round(k̂ - 1)) from the Gamma fit of coordinate ``k``."""
    hits = np.flatnonzero(gamma.columns == k) if gamma is not None else np.zeros(0, np.int64)
    if gamma is None or len(hits) == 0 or gamma.loc[hits[0]] != loc:
        raise ValueError(
            f"coordinate {k}: Laguerre θ needs a Gamma fit with loc={loc!r}; run the pass from "
            "gamma_reduction_for(moments, spec) and pass its result as `gamma`"
        )
    return float(max(0, round(float(gamma.shape[hits[0]]) - 1.0)))


def _coordinate(
    moments: Moments, gamma: GammaFit | None, k: int, name: str, params: dict[str, float]
) -> Coordinate:
    mean, kurtosis = float(moments.mean[k]), float(moments.excess_kurtosis[k])
    if name == "fourier":
        return Coordinate(Fourier(), loc=params["loc"], scale=params["scale"])
    if name == "hermite":
        loc = params.get("loc", mean)
        scale = params["scale"] if "scale" in params else float(moments.std[k])
        beta = params["beta"] if "beta" in params else _tail_beta(kurtosis, 0.0)
        _check_beta(k, beta, kurtosis, 0.0)
        family: Hermite | Laguerre = Hermite(beta=beta)
    else:
        loc = _laguerre_loc(moments, k, params)
        theta = params["theta"] if "theta" in params else _theta_from_fit(gamma, k, loc)
        scale = params["scale"] if "scale" in params else (mean - loc) / (theta + 1.0)
        beta = params["beta"] if "beta" in params else _tail_beta(kurtosis, 6.0 / (theta + 1.0))
        _check_beta(k, beta, kurtosis, 6.0 / (theta + 1.0))
        family = Laguerre(theta=theta, beta=beta)
    return Coordinate(family, loc=float(loc), scale=float(scale))


def choose_basis(
    moments: Moments,
    gamma: GammaFit | None = None,
    spec: str | Sequence[object] = "auto",
    periodic: Sequence[Periodicity | None] | None = None,
) -> list[Coordinate]:
    """One :class:`~kelr_dist.kernels.bases.families.Coordinate` per component (algorithm step 1,
    §4).

    Parameters
    ----------
    moments : pass-0 statistics (:func:`moments_reduction`).
    gamma : the result of the pass :func:`gamma_reduction_for` returns, when it returns one
        (Laguerre coordinates whose θ is chosen from the data).
    spec : ``"auto"``, a comma-separated spec or a list (:mod:`kelr_dist.kernels.bases.spec`).
    periodic : :func:`periodicity` of the components (default: those the spec declares).

    Returns
    -------
    list of ``d`` coordinates. Raises :class:`ValueError` for a bad spec (naming the entry),
    a Laguerre shift above the data minimum, or a constant coordinate (a
    :class:`~kelr_dist.kernels.survey.moments.CoordinateError`).
    """
    entries = _resolved_entries(moments, spec, periodic)
    return [_coordinate(moments, gamma, k, name, p) for k, (name, p) in enumerate(entries)]


def fit_basis(
    x: np.ndarray,
    spec: str | Sequence[object] = "auto",
    chunks: Sequence[int] | int | None = None,
) -> list[Coordinate]:
    """:func:`choose_basis` on an in-memory trajectory ``x (n, d)`` or ``(chains, n, d)``,
    wrapped components found in the data (:func:`periodicity`)."""
    moments = reduce_in_memory(moments_reduction(), x, chunks)
    periodic = periodicity(moments, spec, reduce_in_memory(wrap_reduction(), x, chunks))
    gamma_pass = gamma_reduction_for(moments, spec, periodic)
    gamma = None if gamma_pass is None else reduce_in_memory(gamma_pass, x, chunks)
    return choose_basis(moments, gamma, spec, periodic)
