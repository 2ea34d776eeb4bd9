"""Goodness of fit of a score: Stein's identity tested with functions outside the model's span.

For the true score ``s = ∇ log p`` and any smooth ``f`` whose product with ``p`` vanishes at the
edges, ``E[f(X) s_i(X) + ∂_i f(X)] = 0`` (Stein's identity; integration by parts). A fitted score
that cannot represent ``s`` satisfies it for the functions of its own span — score matching's
normal equations impose it there, and for ``A = x`` the lag-0 Stein residual of a Gaussian (affine)
score is zero by construction — but not for functions outside it. This pass tests each component
``i`` of every score with three functions of ``u_i = (x_i - x̄_i) / σ_i`` (the survey's mean and
standard deviation), none of them in an affine span: the "cubic" ``u³ / (1 + u² / 9)`` (``u³``
within a few standard deviations, growing like ``9 u`` beyond them, so that its statistic has a
finite variance on heavy tails: a Student-t of 5 degrees of freedom made plain ``u³`` fail at
several times the nominal rate), ``sin u`` and ``cos u``; a component on a circle of period
``P`` uses ``sin 2θ``, ``sin θ`` and ``cos θ`` with ``θ = 2π (x_i - x̄_i) / P``, periodic, so no
boundary term enters.

The statistic ``T_i(f) = (1/n) Σ_n [f(u_{n,i}) ŝ_i(X_n) + ∂_i f(u_{n,i})]`` (the score set to 0 on
the rows it rejects, as the response uses it) gets a block-averaging standard error
(:mod:`kelr_dist.kernels.response.blocking`), and, for a score refitted without each held-out
fold, the jackknife standard error of the fitted score's variance
(:func:`kelr_dist.kernels.response.operator.jackknife_stderr`): the two in quadrature are its
total standard error. The tests are many (three per component), so one that fails is judged
against a family-wise level by Šidák's rule (:func:`sidak_threshold`).

Kernel Stein discrepancies (Liu, Lee & Jordan 2016; Chwialkowski, Strathmann & Gretton 2016;
Gorham & Mackey 2017) test against a whole RKHS at a quadratic cost in the rows; the few fixed
functions here cost one evaluation of each score per row used and add to a pass as a mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from statistics import NormalDist
from typing import Any

import numpy as np

from kelr_dist.kernels.reduction import BlockInfo, Reduction
from kelr_dist.kernels.response.blocking import (
    BlockingResult,
    block_standard_error,
    combine_block_partials,
    response_block_partial,
)
from kelr_dist.kernels.response.operator import (
    Score,
    evaluate_scores,
    jackknife_stderr,
    replicate_origins,
)

#: the test functions, as the result labels them
FUNCTIONS = ("cubic", "sine", "cosine")


@dataclass(frozen=True)
class SteinFunctions:
    """The test functions of every component: ``u³ / (1 + u²/9)``, ``sin u``, ``cos u`` of
    ``u = (x - mean) / std`` on the line, ``sin 2θ``, ``sin θ``, ``cos θ`` of
    ``θ = 2π (x - mean) / period`` on a circle (``periods`` ``(d,)``, 0 on the line)."""

    mean: np.ndarray  # (d,)
    std: np.ndarray  # (d,)
    periods: np.ndarray | None = None  # (d,)

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``f`` and ``∂_i f`` at ``x (n, d)``, each ``(n, d, 3)`` in the order of
        :data:`FUNCTIONS`."""
        periods = np.zeros(x.shape[1]) if self.periods is None else self.periods
        circle = periods > 0
        # d u / d x: 1/σ on the line, 2π/P on a circle
        rate = np.where(circle, 2.0 * np.pi / np.where(circle, periods, 1.0), 1.0 / self.std)
        u = (x - self.mean) * rate
        sin, cos = np.sin(u), np.cos(u)
        u2 = u * u
        tempered = 1.0 / (1.0 + u2 / 9.0)
        cubic = u * u2 * tempered
        cubic_slope = (3.0 * u2 + u2 * u2 / 9.0) * tempered * tempered
        f = np.stack([np.where(circle, 2.0 * sin * cos, cubic), sin, cos], axis=-1)
        df = np.stack([np.where(circle, 2.0 * (cos * cos - sin * sin), cubic_slope), cos, -sin], -1)
        return f, df * rate[:, None]


@dataclass(frozen=True)
class SteinCheck:
    """Stein's identity tested on one score: per component and test function ``(d, 3)``."""

    #: ``T_i(f)``: the mean of ``f ŝ_i + ∂_i f`` (0 for the true score)
    statistic: np.ndarray
    #: its block-averaging standard error (the score held fixed), and whether it converged
    stderr: np.ndarray
    converged: np.ndarray
    #: the mean of ``|∂_i f|``: the size ``T`` is measured against (:attr:`relative`)
    scale: np.ndarray
    #: the fitted score's part of the error: jackknife over its refits without each fold
    #: (``None`` for a score that is not refitted)
    estimator_stderr: np.ndarray | None
    rows: int  #: rows the statistic averages

    @property
    def total_stderr(self) -> np.ndarray:
        """``(d, 3)`` the sampling and the fitted score's errors in quadrature."""
        if self.estimator_stderr is None:
            return self.stderr
        return np.hypot(self.stderr, self.estimator_stderr)

    @property
    def relative(self) -> np.ndarray:
        """``(d, 3)`` ``T / E|∂_i f|``: the discrepancy as a share of the identity's own terms."""
        return self.statistic / self.scale

    @property
    def z(self) -> np.ndarray:
        """``(d, 3)`` ``|T|`` in total standard errors (``inf`` where a nonzero ``T`` has none)."""
        size, spread = np.abs(self.statistic), self.total_stderr
        return np.divide(size, spread, out=np.where(size > 0, np.inf, 0.0), where=spread > 0)


def sidak_threshold(tests: int, level: float) -> float:
    """The two-sided normal quantile each of ``tests`` tests is held to so that the chance that
    any of them fails, for independent tests that all hold, is ``level`` (Šidák 1967): a
    per-test level ``1 - (1 - level)^(1/tests)``. For dependent tests it errs towards silence."""
    each = -np.expm1(np.log1p(-level) / tests)
    return NormalDist().inv_cdf(1.0 - each / 2.0)


def strided_info(info: BlockInfo, stride: int) -> BlockInfo:
    """The block ``info`` in the time index of the chain's rows whose index is a multiple of
    ``stride`` (the rows :func:`~kelr_dist.kernels.response.operator.replicate_origins` takes):
    the same series in any chunking."""
    return BlockInfo(
        info.chain,
        -(-info.start // stride),
        -(-info.stop // stride),
        -(-info.chain_length // stride),
    )


@dataclass(frozen=True)
class _CheckKernel:
    scores: Mapping[str, Score]
    replicates: Mapping[str, Sequence[Score]]
    functions: SteinFunctions
    stride: int
    replicate_stride: int

    def chunk(self, x: np.ndarray, info: BlockInfo, _halo: np.ndarray | None) -> dict[str, Any]:
        rows = x[replicate_origins(info, self.stride)]
        out: dict[str, Any] = {"rows": rows.shape[0]}
        if rows.shape[0] == 0:
            return out
        series = strided_info(info, self.stride)
        f, df = self.functions(rows)
        out["scale"] = np.abs(df).sum(axis=0)
        # the replicates' rows: every replicate_stride-th of these, in the strided time index
        sub = replicate_origins(series, self.replicate_stride)
        names = list(self.scores)
        used = [_as_used(*v) for v in evaluate_scores([self.scores[n] for n in names], rows)]
        for name, score in zip(names, used, strict=True):
            h = f * score[:, :, None] + df
            out[name] = {
                "blocks": response_block_partial(
                    h.reshape(h.shape[0], -1), np.ones((h.shape[0], 1)), 0, series
                )
            }
        others = [(name, s) for name in names for s in self.replicates.get(name, ())]
        if not others:
            return out
        refits = evaluate_scores([s for _, s in others], rows[sub])
        for (name, _), values in zip(others, refits, strict=True):
            shift = f[sub] * (_as_used(*values) - used[names.index(name)][sub])[..., None]
            part = out[name]
            part["shifts"] = [*part.get("shifts", []), shift.sum(axis=0)]
            part["replicate_rows"] = shift.shape[0]
        return out


def _as_used(score: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """The score as the response uses it: 0 on the rows it rejects (and where it is not
    finite, which it does not keep)."""
    return np.where(kept[:, None] & np.isfinite(score), score, 0.0)


def _combine(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    if not a["rows"]:
        return {**b, "rows": a["rows"] + b["rows"]}
    if not b["rows"]:
        return {**a, "rows": a["rows"] + b["rows"]}
    out: dict[str, Any] = {"rows": a["rows"] + b["rows"], "scale": a["scale"] + b["scale"]}
    for name, part in a.items():
        if name in ("rows", "scale"):
            continue
        other = b[name]
        merged: dict[str, Any] = {"blocks": combine_block_partials(part["blocks"], other["blocks"])}
        if "shifts" in part:
            merged["shifts"] = [p + q for p, q in zip(part["shifts"], other["shifts"], strict=True)]
            merged["replicate_rows"] = part["replicate_rows"] + other["replicate_rows"]
        out[name] = merged
    return out


def _finalize(names: tuple[str, ...], d: int, partials: dict[str, Any]) -> dict[str, SteinCheck]:
    checks = {}
    for name in names:
        part = partials[name]
        blocks: BlockingResult = block_standard_error(part["blocks"])
        shape = (d, len(FUNCTIONS))
        statistic = blocks.mean.reshape(shape)
        estimator = None
        if "shifts" in part:
            # each refit's statistic: the score's plus its mean difference on the replicates' rows
            shifts = np.stack(part["shifts"]) / max(part["replicate_rows"], 1)
            estimator = jackknife_stderr(statistic + shifts)
        checks[name] = SteinCheck(
            statistic,
            blocks.stderr.reshape(shape),
            np.asarray(blocks.converged, dtype=bool).reshape(shape),
            partials["scale"] / partials["rows"],
            estimator,
            int(partials["rows"]),
        )
    return checks


def stein_check_reduction(
    scores: Mapping[str, Score],
    functions: SteinFunctions,
    replicates: Mapping[str, Sequence[Score]] | None = None,
    stride: int = 1,
    replicate_stride: int = 1,
) -> Reduction:
    """The goodness-of-fit pass: Stein's identity of every score in ``scores`` tested with
    ``functions`` (:class:`SteinFunctions`) on the rows whose time index is a multiple of
    ``stride``; a score with ``replicates`` (refitted without each held-out fold) also gets the
    jackknife error of its fit, from their differences to it on every ``replicate_stride``-th of
    those rows. Finalizes to ``{name: SteinCheck}``. No halo: it adds to any pass."""
    for name in replicates or {}:
        if name not in scores:
            raise ValueError(f"replicate name {name!r} is not among the scores")
    for label, value in (("stride", stride), ("replicate_stride", replicate_stride)):
        if int(value) != value or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    kernel = _CheckKernel(
        dict(scores),
        {name: tuple(refits) for name, refits in (replicates or {}).items()},
        functions,
        int(stride),
        int(replicate_stride),
    )
    return Reduction(
        name="goodness of fit",
        chunk=kernel.chunk,
        combine=_combine,
        finalize=partial(_finalize, tuple(scores), len(functions.mean)),
    )
