"""The warnings an estimate raises and the checks that raise them, with their tolerances.

Each check reads a finished response (or read 1's survey) and emits at most one line of its
category; :func:`emit` also records the line in the result's ``attrs["warnings"]``. The rules:

- :class:`BiasWarning`: the lag-0 Stein residual of some entry beyond the family-wise
  threshold over the entries tested (:func:`stein_threshold`: :data:`STEIN_TOLERANCE` total
  standard errors for one entry, Šidák's rule for more), or, before the affine Stein
  correction, also beyond :data:`RAW_STEIN_FRACTION` of
  ``k(0)`` (:func:`warn_bias`);
- :class:`DisagreementWarning`: the two families' responses more than
  :data:`DISAGREEMENT_TOLERANCE` standard errors apart while their held-out losses are within
  :data:`LOSS_TIE` (:func:`warn_disagreement`);
- :class:`SensitivityWarning`: the response moving by more than :data:`SENSITIVITY_TOLERANCE`
  total standard errors to a richer model (:func:`warn_sensitivity`);
- :class:`ConvergenceWarning`: block averaging without a plateau (:func:`warn_unconverged`);
- :class:`EdgeWarning`: a density that does not vanish at a hard edge (:func:`warn_edges`);
- :class:`ConditioningWarning`: score matching's scaled Gram matrix with a condition number
  above :data:`GRAM_CONDITION_LIMIT` (:func:`warn_conditioning`);
- :class:`GoodnessOfFitWarning`: Stein's identity of the chosen score failing, with test functions
  outside its span, beyond the Šidák threshold of a family-wise level
  :data:`GOODNESS_OF_FIT_LEVEL` (:func:`warn_goodness_of_fit`);
- :class:`TruncationWarning` and :class:`NonFiniteWarning`, raised by
  :func:`kelr_dist.pipeline.conclude.conclude` from the steps' findings.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
from scipy.special import ndtr, ndtri

from kelr_dist.kernels.bases.coordinates import Periodicity
from kelr_dist.kernels.response.operator import (
    ResponseResult,
    relative_to_lag0,
)
from kelr_dist.kernels.scores.heldout import Choice
from kelr_dist.kernels.scores.score_matching import RCOND, Candidate
from kelr_dist.kernels.scores.stein_check import FUNCTIONS, SteinCheck, sidak_threshold
from kelr_dist.pipeline.steps import (
    Survey,
)

#: a lag-0 Stein residual beyond this many standard errors is reported as a bias when one entry
#: is tested; over ``m`` entries the threshold is family-wise (:func:`stein_threshold`)
STEIN_TOLERANCE = 3.0
#: the chance that an unbiased estimate warns (its residuals Gaussian noise of the quoted total
#: standard errors), whatever its number of entries: that of one entry beyond STEIN_TOLERANCE
STEIN_ALPHA = float(2 * ndtr(-STEIN_TOLERANCE))


def stein_threshold(tested: int) -> float:
    """The lag-0 Stein residual's threshold, in total standard errors, over ``tested`` entries:
    Šidák's family-wise rule, so that the largest of ``tested`` independent Gaussian ratios
    exceeds it with probability :data:`STEIN_ALPHA` (each entry at the two-sided level
    ``1 - (1 - STEIN_ALPHA)^(1/tested)``); :data:`STEIN_TOLERANCE` for one entry, about 4.1
    for 80 (a distribution observable's bins)."""
    per_entry = -np.expm1(np.log1p(-STEIN_ALPHA) / max(tested, 1))
    return float(-ndtri(per_entry / 2))


#: ... and so is one before the affine Stein correction (which removes it at lag 0 only) when it
#: is also beyond this fraction of the lag-0 response, which separates accurate kernel
#: embeddings from biased ones on the systems of scripts/accuracy_suite.py (see
#: docs/benchmarks.md, section 'Tuning constants')
RAW_STEIN_FRACTION = 0.1


#: the two families' responses differing by more than this many standard errors of their
#: difference, while their held-out losses are within LOSS_TIE standard errors, is reported
DISAGREEMENT_TOLERANCE = 5.0


LOSS_TIE = 2.0


#: the rule of :class:`SensitivityWarning`: the response moving by more than this many of its
#: total standard errors when the fitted model gets two steps richer (or random Fourier features
#: are added) is reported. A model that follows the score moves by its fit noise only, a small
#: part of one standard error (0.01-0.68 on the accuracy suite's well-fitted systems, its
#: shift/tse column, docs/benchmarks.md 'Tuning constants'); a move beyond one standard error is
#: a model choice the data do not settle, a bias of about that size that the error bars leave out
SENSITIVITY_TOLERANCE = 1.0


#: score matching's Gram matrix scaled to unit diagonal with a condition number above this is
#: reported: its eigenvalues below RCOND of the largest are dropped from the solve (numerical
#: rank by a relative threshold, Golub & Van Loan, *Matrix Computations*, 4th ed., §5.5), so
#: some combinations of the chosen features are collinear on the data and their weights are set
#: to zero rather than fitted (collinear features: a degree the data's few distinct values cannot
#: carry, or components that are almost linear combinations of each other)
GRAM_CONDITION_LIMIT = 1.0 / RCOND


class BiasWarning(UserWarning):
    """The lag-0 Stein residual of an estimate exceeds its error bars: the estimate is biased
    beyond its standard errors."""


class DisagreementWarning(UserWarning):
    """The two score estimators' responses differ by many standard errors while the held-out
    criterion cannot tell which is better: at least one is biased, and which is not known."""


class EdgeWarning(UserWarning):
    """A component on the line whose density does not vanish at an edge of the data (a wall,
    clipped values): Stein's identity there has a boundary term that the lag-0 self-check and
    the affine correction leave out."""


class ConvergenceWarning(UserWarning):
    """The block-averaging standard errors of some entries of the estimate did not reach their
    plateau (chains short against the correlation time): those error bars are too small."""


class TruncationWarning(UserWarning):
    """The chosen order or degree is the largest the budget allowed and the held-out loss was
    still falling there: the estimate is limited by the budget, not by the data."""


class SensitivityWarning(UserWarning):
    """The response moves by more than ``SENSITIVITY_TOLERANCE`` (one) total standard error
    when the fitted score model gets richer, where a model that follows the score moves by a
    small part of one: the estimate is limited by the model (a score the basis does not follow),
    a bias that neither the held-out loss nor the error bars see."""


class ConditioningWarning(UserWarning):
    """Score matching's scaled Gram matrix is so ill-conditioned that directions were dropped
    from its solve: the chosen features are collinear on the data."""


class NonFiniteWarning(UserWarning):
    """The kernel-embedding density was not finite on some samples (counted apart from the
    low-density rejections)."""


class Entries(NamedTuple):
    """How a warning names a response entry as the result does: the observable's components
    (the result's ``i``, e.g. ``x2:bin32``), the forced components (``j``) and the time of a lag
    in data units (the result's ``time``)."""

    observables: tuple[str, ...]
    forcings: tuple[str, ...]
    dt: float
    time_units: str | None = None

    def entry(self, i: int, j: int) -> str:
        """``"x2:bin32 forced on x1"``."""
        return f"{self.observables[i]} forced on {self.forcings[j]}"

    def at(self, lag: int, i: int, j: int) -> str:
        """``"x2:bin32 forced on x1 at time 0.4 s"`` (no unit for the data's own)."""
        unit = f" {self.time_units}" if self.time_units else ""
        return f"{self.entry(i, j)} at time {lag * self.dt:.4g}{unit}"


class GoodnessOfFitWarning(UserWarning):
    """The chosen score fails Stein's identity for test functions outside its span (a cubic, a
    sine, a cosine per component) by more than its error bars allow: the model cannot represent
    the data's score, a bias that its own lag-0 check, held in its span, does not see."""


def emit(category: type[Warning], message: str, record: list[str] | None) -> None:
    """Warn with ``message`` (one line) and add ``"Category: message"`` to ``record``, which the
    result keeps in ``attrs["warnings"]``."""
    warnings.warn(message, category, stacklevel=5)
    if record is not None:
        record.append(f"{category.__name__}: {message}")


def warn_edges(
    survey: Survey,
    periodic: list[Periodicity | None],
    names: list[str],
    record: list[str] | None = None,
) -> None:
    """One-line :class:`EdgeWarning` per component on the line with a hard edge
    (:meth:`kelr_dist.kernels.survey.moments.EdgeStatistics.hard`)."""
    if survey.edges is None:
        return
    for k, (lower, upper) in enumerate(survey.edges.hard()):
        if periodic[k] is None and (lower or upper):
            where = " and ".join(
                f"{side} edge {value:.6g}"
                for side, value, hard in (
                    ("lower", survey.moments.minimum[k], lower),
                    ("upper", survey.moments.maximum[k], upper),
                )
                if hard
            )
            emit(
                EdgeWarning,
                f"component {names[k]!r}: its density does not vanish at its {where} (a wall or "
                "clipped data): the lag-0 Stein check and the affine Stein correction assume it "
                "does, so they do not hold there (declare it periodic if it is an angle)",
                record,
            )


def warn_conditioning(condition: float, record: list[str] | None = None) -> None:
    """One-line :class:`ConditioningWarning` when score matching's ``gram_condition`` exceeds
    :data:`GRAM_CONDITION_LIMIT`."""
    if not condition <= GRAM_CONDITION_LIMIT:
        emit(
            ConditioningWarning,
            f"score matching's Gram matrix has condition number {condition:.3g} (above "
            f"{GRAM_CONDITION_LIMIT:.0e}): some combinations of its features are collinear on "
            "the data and were dropped from the fit (attribute gram_condition)",
            record,
        )


def _worst_ratio(residual: np.ndarray, stderr: np.ndarray) -> tuple[tuple[int, ...], float]:
    """The entry ``(i, j)`` with the largest finite ``|residual| / stderr``, and that ratio
    (``-1`` when none is finite)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.abs(residual) / stderr
    ratio = np.where(np.isfinite(ratio), ratio, -1.0)
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    return tuple(int(v) for v in worst), float(ratio[worst])


def _tested(residual: np.ndarray, stderr: np.ndarray) -> int:
    """How many entries have a finite residual-to-error ratio (those the warning tests)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return int(np.isfinite(np.abs(residual) / stderr).sum())


def warn_bias(result: ResponseResult, entries: Entries, record: list[str] | None = None) -> None:
    """One-line :class:`BiasWarning` when the lag-0 Stein residual exceeds its total error bars
    (sampling and the fitted score's variance) by the family-wise :func:`stein_threshold` over
    the entries tested, or, for an estimate with the affine Stein correction, when the residual
    before it did (beyond that threshold and :data:`RAW_STEIN_FRACTION` of ``k(0)``). For ``A``
    affine in ``x`` and a constant forcing the corrected residual is 0 by construction, so the
    uncorrected one is then the only lag-0 evidence about the score estimate."""
    entry, ratio = _worst_ratio(result.stein_residual, result.stein_total_stderr)
    if ratio > stein_threshold(_tested(result.stein_residual, result.stein_total_stderr)):
        emit(
            BiasWarning,
            f"lag-0 Stein residual {result.stein_residual[entry]:+.3g} of "
            f"{entries.entry(*entry)} is {ratio:.1f} total standard errors: the estimate is "
            "biased beyond its error bars",
            record,
        )
        return
    raw, raw_stderr = result.uncorrected_stein_residual, result.uncorrected_stein_total_stderr
    if raw is None or raw_stderr is None:
        return
    shares = relative_to_lag0(raw, result.mean[0], result.stderr[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.abs(raw) / raw_stderr
    flagged = (ratios > stein_threshold(_tested(raw, raw_stderr))) & (shares > RAW_STEIN_FRACTION)
    if flagged.any():
        worst = np.unravel_index(int(np.argmax(np.where(flagged, shares, -1.0))), shares.shape)
        entry = tuple(int(v) for v in worst)
        emit(
            BiasWarning,
            f"before the Stein correction the lag-0 Stein residual of "
            f"{entries.entry(*entry)} was {shares[entry]:.0%} of k(0) "
            f"({ratios[entry]:.1f} total standard errors): the score estimate is "
            "poor; the correction removes that bias at lag 0 only, later lags may keep part of "
            "it (compare estimator='score-matching' / 'kernel-embedding', or use more data)",
            record,
        )


def warn_disagreement(
    responses: dict[str, ResponseResult],
    rows: list[Choice],
    pick: Candidate | None,
    entries: Entries,
    record: list[str] | None = None,
) -> float | None:
    """The largest ``|k̂_KE - k̂_SM|`` over lags and entries in standard errors of the difference
    (``None`` unless both families ran; ``pick`` is score matching's own choice); a one-line
    :class:`DisagreementWarning` when it exceeds :data:`DISAGREEMENT_TOLERANCE` while the
    held-out losses are within :data:`LOSS_TIE` standard errors. Standard errors are added in
    quadrature, which overstates the spread of a difference of two estimates from the same
    samples: the check errs towards silence."""
    if pick is None or not rows or rows[0].estimator != "kernel-embedding":
        return None
    ke = rows[0]
    sm = next(
        r
        for r in rows
        if r.estimator == "score-matching" and r.order == pick.degree and r.ridge == pick.ridge
    )
    used, rival = (ke, sm) if ke.chosen else (sm, ke)
    other = responses[f"response_{rival.estimator.replace('-', '_')}"]
    main = responses["response"]
    difference = np.abs(main.mean - other.mean)
    spread = np.hypot(main.stderr, other.stderr)
    # equal entries with no spread agree; a response that is not finite where the other is
    # (or where both are not) is as far apart as can be
    z = np.divide(difference, spread, out=np.where(difference > 0, np.inf, 0.0), where=spread > 0)
    z = np.where(np.isnan(difference), np.inf, z)
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = abs(used.loss - rival.loss) / float(np.hypot(used.loss_stderr, rival.loss_stderr))
    worst = float(z.max())
    if worst > DISAGREEMENT_TOLERANCE and not gap > LOSS_TIE:
        lag, i, j = (int(v) for v in np.unravel_index(int(np.argmax(z)), z.shape))
        emit(
            DisagreementWarning,
            f"the kernel-embedding and score-matching responses differ by {worst:.1f} standard "
            f"errors ({entries.at(lag, i, j)}) while their held-out losses are only "
            f"{gap:.1f} standard errors apart: one of them is biased and the held-out choice "
            f"({used.estimator}) is not decisive; compare response_kernel_embedding with "
            "response_score_matching, or use more data",
            record,
        )
    return worst


def warn_sensitivity(
    result: ResponseResult,
    neighbour: str | None,
    used: str,
    entries: Entries,
    record: list[str] | None = None,
) -> float | None:
    """The largest ``|model_shift| / total_stderr`` over lags and entries (``None`` without a
    neighbouring model); a one-line :class:`SensitivityWarning` when it exceeds
    :data:`SENSITIVITY_TOLERANCE`. ``neighbour`` names the steps of estimator ``used``, e.g.
    ``"degree 5 -> 6, 7"``."""
    if result.model_shift is None or neighbour is None:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.abs(result.model_shift) / result.total_stderr
    z = np.where(np.isnan(z), 0.0, z)
    worst = float(z.max())
    if worst > SENSITIVITY_TOLERANCE:
        lag, i, j = (int(v) for v in np.unravel_index(int(np.argmax(z)), z.shape))
        emit(
            SensitivityWarning,
            f"the response moves by {worst:.1f} total standard errors ({entries.at(lag, i, j)}) "
            f"from {used} {neighbour}, more than the {SENSITIVITY_TOLERANCE:g} a model that "
            "follows the score moves by: the data do not settle the model, and the estimate may "
            "be biased by about that much beyond its error bars (see response_model_shift; try "
            "more samples, which grow score matching's index set, a basis that follows the "
            "data, or the other estimator)",
            record,
        )
    return worst


def warn_unconverged(
    result: ResponseResult, entries: Entries, record: list[str] | None = None
) -> None:
    """One-line :class:`ConvergenceWarning` when the blocking of some entries did not converge
    (``response_converged`` is False there)."""
    converged = np.asarray(result.blocking.converged, dtype=bool)
    if converged.all():
        return
    lags = np.flatnonzero(~converged.all(axis=(1, 2)))
    unit = f" {entries.time_units}" if entries.time_units else ""
    emit(
        ConvergenceWarning,
        f"the error bars of {int((~converged).sum())} of {converged.size} response entries "
        f"(at times {lags[0] * entries.dt:.4g}..{lags[-1] * entries.dt:.4g}{unit}) did not "
        "converge (block averaging reached no plateau: chains short against the correlation "
        "time); those standard errors are too small (see response_converged)",
        record,
    )


#: the chance, when the score is right, that any of the goodness-of-fit tests of an estimate
#: fails (family-wise; each test is held to the Šidák threshold of its share)
GOODNESS_OF_FIT_LEVEL = 0.01


def warn_goodness_of_fit(
    check: SteinCheck, names: list[str], tested: np.ndarray, record: list[str] | None = None
) -> tuple[float, float]:
    """The largest ``|T| / total stderr`` of the goodness-of-fit tests of the components
    ``tested`` ``(d,)`` bool (those without a hard edge, where Stein's identity holds) and its
    threshold (:func:`~kelr_dist.kernels.scores.stein_check.sidak_threshold` over those tests at
    :data:`GOODNESS_OF_FIT_LEVEL`); a one-line :class:`GoodnessOfFitWarning` when it is beyond
    the threshold."""
    z = np.where(tested[:, None], check.z, -1.0)
    tests = int(tested.sum()) * len(FUNCTIONS)
    if tests == 0:
        return float("nan"), float("nan")
    threshold = sidak_threshold(tests, GOODNESS_OF_FIT_LEVEL)
    k, f = (int(v) for v in np.unravel_index(int(np.argmax(z)), z.shape))
    worst = float(z[k, f])
    if worst > threshold:
        failed = int((z > threshold).sum())
        emit(
            GoodnessOfFitWarning,
            f"the score fails Stein's identity E[f s + df/dx] = 0 for the {FUNCTIONS[f]} test "
            f"function of component {names[k]!r} by {check.relative[k, f]:+.3g} of E|df/dx| "
            f"({worst:.1f} total standard errors; {failed} of {tests} tests beyond the Šidák "
            f"threshold {threshold:.2f} of a family-wise level {GOODNESS_OF_FIT_LEVEL:.0%}): the "
            "score model does not follow the data there and the response may be biased beyond "
            "its error bars (see goodness_of_fit; try more samples, which grow score matching's "
            "index set, index_set='total' with a higher degree, or the other estimator)",
            record,
        )
    return worst, threshold
