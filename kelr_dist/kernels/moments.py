"""Per-coordinate moments, tail statistics and the automatic basis choice (pass 0).

Step 1 of the algorithm in §4 of the paper ("for each dimension, run a statistical test to
identify the tail of the marginal distribution of p_eq ... choose an appropriate RKHS basis"),
with the tuning guidance of Remark remark_rich (Hermite: β from the sample excess kurtosis)
and §3.2 (Laguerre: θ from the Gamma maximum-likelihood fit of each coordinate).

Two light passes, each a :class:`kelr_dist.kernels.reduction.Reduction`:

1. :func:`moments_reduction` — per coordinate: count, mean, central sums M2, M3, M4 (merged
   with the exact pairwise update of Chan, Golub & LeVeque (1979) / Pébay (2008), stable for
   data with a large offset; within a block a corrected two-pass algorithm), minimum,
   maximum, and the count and first position of non-finite values (rejected with a
   :class:`ValueError` by the finalize step). Empty blocks are the identity of the combine;
   a trajectory without samples is an error. Result: :class:`Moments`.
2. :func:`gamma_reduction` — only for Laguerre coordinates whose θ is to be estimated: sums of
   ``y`` and ``log y`` for ``y = (x - loc) / scale`` (shift from pass 1), finalized into the
   Gamma MLE (:class:`GammaFit`). :func:`gamma_reduction_for` builds it from pass 1 and a spec
   (or returns ``None`` when no coordinate needs it).

Then :func:`choose_basis` turns the statistics and a spec into one
:class:`kelr_dist.kernels.bases.Coordinate` per component; :func:`fit_basis` runs the whole flow in
memory. Moments are the population (biased) ones, as ``numpy.var``, ``scipy.stats.skew`` and
``scipy.stats.kurtosis`` with their defaults.

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
  ``γ₂ <= 1``; ``β = 1/2`` when ``γ₂ > 1``. Reason (Remark remark_rich): the expansion converges
  in ``L²(W^{1-2β})`` only if ``p² W^{1-2β}`` is integrable; with β = 1 that needs Gaussian decay
  of the standardised density faster than ``exp(-x²/4)``. Within the exponential-power family
  ``exp(-|x|^s)`` a positive excess kurtosis means ``s < 2`` (no Gaussian decay: Laplace has
  γ₂ = 3, Student-t(5) γ₂ = 6), for which only ``β = 1/2`` (``W⁰``: plain ``L²``) is safe. The
  threshold 1 rather than 0 leaves room for sampling noise of a correlated series and for
  multimodal Gaussian-tailed marginals (the triple-well's x₁ has γ₂ ≈ 0.2). Never β < 1/2.
* **Laguerre** (§3.1.2, §3.2): ``loc = min - 1e-3 σ`` (every sample has ``y > 0``, as the Gamma
  likelihood needs). Provisional ``scale = σ`` for the Gamma pass (:func:`laguerre_shift`);
  the MLE shape ``k̂`` solves ``log k - ψ(k) = log mean(y) - mean(log y)``. The paper uses
  integer θ (the Hille-Hardy bound, Lemma lem:HHF), so ``θ = max(0, round(k̂ - 1))``; the
  scale is then the Gamma MLE of the scale with the shape fixed at ``θ + 1``:
  ``scale = (μ - loc) / (θ + 1)`` (the weight's mean equals the data's). ``β = 1`` unless the
  data's tail is clearly heavier than that of the fitted weight, ``γ₂ > 6/(θ+1) + 1`` (the
  Gamma(k) excess kurtosis is 6/k), then ``β = 1/2`` by the same argument as for Hermite.

Spec (``spec`` argument, also the ``basis`` attribute of results): ``"auto"`` for every
coordinate, or one comma-separated entry per coordinate, each ``auto``, ``hermite``,
``hermite(beta=..,loc=..,scale=..)``, ``laguerre`` or
``laguerre(theta=..,beta=..,loc=..,scale=..)`` with any subset of the keys (``beta >= 1/2``,
``theta > -1``, ``scale > 0``); omitted values are chosen from the data by the rule above (the
family is then fixed). A list of :class:`~kelr_dist.kernels.bases.Coordinate`,
:class:`~kelr_dist.kernels.bases.Hermite`/:class:`~kelr_dist.kernels.bases.Laguerre` (loc and scale
from the
data) or entry strings is accepted too. :func:`format_basis` writes a spec that parses back to
the same coordinates.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import digamma, polygamma

from kelr_dist.kernels.bases import Coordinate, Hermite, Laguerre
from kelr_dist.kernels.reduction import BlockInfo, Reduction, add_partials, reduce_in_memory

SKEWNESS_THRESHOLD = 0.5
"""|skewness| above which a marginal counts as clearly skewed."""
ONE_SIDED_RATIO = 0.5
"""Laguerre needs ``mean - min <= ONE_SIDED_RATIO * (max - mean)`` (a wall on the left)."""
KURTOSIS_THRESHOLD = 1.0
"""Excess kurtosis above which tails count as heavier than the weight's: β = 1/2."""
SHIFT_MARGIN = 1e-3
"""Laguerre shift below the minimum, in standard deviations."""
SUB_BLOCK = 1 << 16
"""Rows per sub-block inside the chunk kernels (bounds the temporaries)."""

_NO_INDEX = np.iinfo(np.int64).max
_KEYS = {"hermite": ("beta", "loc", "scale"), "laguerre": ("theta", "beta", "loc", "scale")}

Entry = tuple[str, dict[str, float]]  # (family name, given parameters) or ("auto", {})


# --------------------------------------------------------------------------- pass 1: moments


@dataclass(frozen=True, eq=False)
class Moments:
    """Per-coordinate sample statistics, arrays of shape ``(d,)`` (population moments).

    Attributes
    ----------
    n : number of samples per coordinate.
    mean, variance, std : ``variance = M2 / n`` (``numpy.var`` with ``ddof=0``).
    skewness : ``sqrt(n) M3 / M2^{3/2}`` (``scipy.stats.skew``); NaN for a constant coordinate.
    excess_kurtosis : ``n M4 / M2² - 3`` (``scipy.stats.kurtosis``); NaN for a constant one.
    minimum, maximum : extreme values.
    """

    n: np.ndarray
    mean: np.ndarray
    variance: np.ndarray
    std: np.ndarray
    skewness: np.ndarray
    excess_kurtosis: np.ndarray
    minimum: np.ndarray
    maximum: np.ndarray

    @property
    def d(self) -> int:
        return int(self.mean.shape[0])


def _empty_moments(d: int) -> dict[str, np.ndarray]:
    """The identity of :func:`combine_moments` for ``d`` coordinates."""
    no_index = np.full(d, _NO_INDEX, dtype=np.int64)
    return {
        **{name: np.zeros(d) for name in ("mean", "m2", "m3", "m4")},
        "n": np.zeros(d, dtype=np.int64),
        "nonfinite": np.zeros(d, dtype=np.int64),
        "min": np.full(d, np.inf),
        "max": np.full(d, -np.inf),
        "bad_chain": no_index,
        "bad_time": no_index,
    }


def _block_moments(x: np.ndarray, chain: int, start: int) -> dict[str, np.ndarray]:
    """Partial of one sub-block ``x (L, d)`` whose first row is row ``start`` of ``chain``.

    Corrected two-pass algorithm on the transposed block (numpy sums the contiguous axis
    pairwise): the mean of the first pass is refined by the mean of the deviations, so an
    offset (x = 1e6 + noise) costs no more than the rounding of the mean itself.
    """
    xt = np.ascontiguousarray(x.T)
    finite = np.isfinite(xt)
    n = finite.sum(axis=1)
    count = np.maximum(n, 1)[:, None]
    mean = np.where(finite, xt, 0.0).sum(axis=1, keepdims=True) / count
    dev = np.where(finite, xt - mean, 0.0)
    correction = dev.sum(axis=1, keepdims=True) / count
    dev = np.where(finite, dev - correction, 0.0)
    dev2 = dev * dev
    bad = ~finite.all(axis=1)
    return {
        "n": n.astype(np.int64),
        "mean": (mean + correction)[:, 0],
        "m2": dev2.sum(axis=1),
        "m3": (dev2 * dev).sum(axis=1),
        "m4": (dev2 * dev2).sum(axis=1),
        "min": np.where(finite, xt, np.inf).min(axis=1),
        "max": np.where(finite, xt, -np.inf).max(axis=1),
        "nonfinite": (~finite).sum(axis=1).astype(np.int64),
        "bad_chain": np.where(bad, chain, _NO_INDEX).astype(np.int64),
        "bad_time": np.where(bad, start + np.argmin(finite, axis=1), _NO_INDEX).astype(np.int64),
    }


def combine_moments(a: dict, b: dict) -> dict:
    """Merge two moment partials (Pébay 2008, eqs. 2.1-2.3; exact, order-independent).

    With ``n = n_a + n_b`` and ``δ = mean_b - mean_a``::

        mean = mean_a + δ n_b / n
        M2 = M2_a + M2_b + δ² n_a n_b / n
        M3 = M3_a + M3_b + δ³ n_a n_b (n_a - n_b) / n² + 3δ (n_a M2_b - n_b M2_a) / n
        M4 = M4_a + M4_b + δ⁴ n_a n_b (n_a² - n_a n_b + n_b²) / n³
             + 6δ² (n_a² M2_b + n_b² M2_a) / n² + 4δ (n_a M3_b - n_b M3_a) / n

    An empty partial (``n = 0``, zero sums) is the identity (exactly).
    """
    na = a["n"].astype(np.float64)
    nb = b["n"].astype(np.float64)
    n = np.maximum(na + nb, 1.0)
    delta = b["mean"] - a["mean"]
    d_n = delta / n
    m2a, m2b, m3a, m3b = a["m2"], b["m2"], a["m3"], b["m3"]
    m2 = m2a + m2b + delta * d_n * na * nb
    m3 = m3a + m3b + d_n**2 * delta * na * nb * (na - nb) + 3.0 * d_n * (na * m2b - nb * m2a)
    m4 = (
        a["m4"]
        + b["m4"]
        + d_n**3 * delta * na * nb * (na * na - na * nb + nb * nb)
        + 6.0 * d_n**2 * (na * na * m2b + nb * nb * m2a)
        + 4.0 * d_n * (na * m3b - nb * m3a)
    )
    a_first = (a["bad_chain"] < b["bad_chain"]) | (
        (a["bad_chain"] == b["bad_chain"]) & (a["bad_time"] <= b["bad_time"])
    )
    return {
        "n": a["n"] + b["n"],
        "mean": np.where(na == 0, b["mean"], a["mean"] + d_n * nb),
        "m2": m2,
        "m3": m3,
        "m4": m4,
        "min": np.minimum(a["min"], b["min"]),
        "max": np.maximum(a["max"], b["max"]),
        "nonfinite": a["nonfinite"] + b["nonfinite"],
        "bad_chain": np.where(a_first, a["bad_chain"], b["bad_chain"]),
        "bad_time": np.where(a_first, a["bad_time"], b["bad_time"]),
    }


def _moments_chunk(x: np.ndarray, info: BlockInfo, halo: np.ndarray | None) -> dict:
    """Moment partial of one block ``x (L, d)``, in sub-blocks of :data:`SUB_BLOCK` rows."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"a trajectory block must have shape (L, d), got shape {x.shape}")
    partial = _empty_moments(x.shape[1])
    for lo in range(0, x.shape[0], SUB_BLOCK):
        part = _block_moments(x[lo : lo + SUB_BLOCK], info.chain, info.start + lo)
        partial = combine_moments(partial, part)
    return partial


def _finalize_moments(p: dict) -> Moments:
    for k in np.flatnonzero(p["nonfinite"]):
        raise ValueError(
            f"coordinate {k} has {p['nonfinite'][k]} non-finite samples (NaN or inf); the first "
            f"is at chain {p['bad_chain'][k]}, time index {p['bad_time'][k]}"
        )
    if not np.all(p["n"] > 0):
        raise ValueError("the trajectory has no samples")
    n = p["n"].astype(np.float64)
    variance = p["m2"] / n
    with np.errstate(divide="ignore", invalid="ignore"):
        skewness = np.sqrt(n) * p["m3"] / p["m2"] ** 1.5
        kurtosis = n * p["m4"] / p["m2"] ** 2 - 3.0
    constant = p["m2"] == 0
    return Moments(
        n=p["n"].copy(),
        mean=p["mean"].copy(),
        variance=variance,
        std=np.sqrt(variance),
        skewness=np.where(constant, np.nan, skewness),
        excess_kurtosis=np.where(constant, np.nan, kurtosis),
        minimum=p["min"].copy(),
        maximum=p["max"].copy(),
    )


def moments_reduction() -> Reduction:
    """Pass 0: per-coordinate count, mean, central moments, extremes (finalize: :class:`Moments`).

    The finalize step raises :class:`ValueError` naming the coordinate, the number of
    non-finite samples and the (chain, time) of the first one; empty blocks are allowed (they
    are the identity of the combine), a trajectory with no samples at all is an error.
    """
    return Reduction("moments", _moments_chunk, combine_moments, _finalize_moments)


# ------------------------------------------------------------------ pass 2: Gamma likelihood


@dataclass(frozen=True, eq=False)
class GammaFit:
    """Gamma maximum-likelihood fit of ``x[:, columns] - loc``, arrays of shape ``(k,)``.

    Attributes
    ----------
    columns : the coordinates fitted.
    loc : the shift used (Laguerre ``loc``).
    n : number of samples.
    shape : MLE shape ``k̂`` (the Laguerre weight Gamma(θ+1) has shape ``θ + 1``).
    scale : MLE scale in the units of ``x`` (``mean(x - loc) / k̂``).
    """

    columns: np.ndarray
    loc: np.ndarray
    n: np.ndarray
    shape: np.ndarray
    scale: np.ndarray

    @property
    def theta(self) -> np.ndarray:
        """Unrounded Laguerre θ = k̂ - 1, shape ``(k,)``."""
        return self.shape - 1.0


def gamma_shape_mle(log_mean: np.ndarray, mean_log: np.ndarray) -> np.ndarray:
    """Solve ``log k - ψ(k) = s``, ``s = log mean(y) - mean(log y) > 0``, for the MLE shape.

    Minka's (2002) closed-form start ``(3 - s + sqrt((s - 3)² + 24 s)) / (12 s)``, then his
    generalised Newton step on ``1/k`` (monotone, a handful of iterations to full precision).
    Shapes ``(k,)``.
    """
    s = np.asarray(log_mean - mean_log, dtype=np.float64)
    k = (3.0 - s + np.sqrt((s - 3.0) ** 2 + 24.0 * s)) / (12.0 * s)
    for _ in range(100):
        step = (np.log(k) - digamma(k) - s) / (k * k * (1.0 / k - polygamma(1, k)))
        k_new = 1.0 / (1.0 / k + step)
        done = np.all(np.abs(k_new - k) <= 1e-15 * k)
        k = k_new
        if done:
            break
    return k


def _gamma_chunk(
    x: np.ndarray, info: BlockInfo, columns: np.ndarray, loc: np.ndarray, scale: np.ndarray
) -> dict:
    """Sums ``n, Σ y, Σ log y`` of ``y = (x[:, columns] - loc) / scale`` for one block."""
    partial = {name: np.zeros(columns.shape[0]) for name in ("n", "sum_y", "sum_log_y")}
    for lo in range(0, x.shape[0], SUB_BLOCK):
        y = (np.asarray(x[lo : lo + SUB_BLOCK, columns], dtype=np.float64) - loc) / scale
        bad = ~(y > 0)
        if bad.any():
            row, j = np.argwhere(bad)[0]
            raise ValueError(
                f"coordinate {columns[j]}: {bad[:, j].sum()} samples not above the Laguerre "
                f"shift loc={loc[j]!r} (first: x={x[lo + row, columns[j]]!r} at chain "
                f"{info.chain}, time index {info.start + lo + row})"
            )
        part = {"n": np.full(columns.shape[0], float(y.shape[0])), "sum_y": y.sum(axis=0)}
        part["sum_log_y"] = np.log(y).sum(axis=0)
        partial = add_partials(partial, part)
    return partial


def gamma_reduction(
    loc: Sequence[float] | np.ndarray,
    scale: Sequence[float] | np.ndarray,
    columns: Sequence[int] | np.ndarray | None = None,
) -> Reduction:
    """Gamma MLE pass over ``y = (x[:, columns] - loc) / scale`` (finalize: :class:`GammaFit`).

    Parameters
    ----------
    loc, scale : ``(k,)`` shift and positive provisional scale per fitted column (see
        :func:`laguerre_shift`).
    columns : ``(k,)`` coordinates to fit; default ``0 .. k-1``.

    The chunk kernel raises :class:`ValueError` if a ``y`` is not ``> 0`` (naming the coordinate
    and the first offending sample). Partials are plain sums (combine by addition).
    """
    loc = np.atleast_1d(np.asarray(loc, dtype=np.float64))
    scale = np.atleast_1d(np.asarray(scale, dtype=np.float64))
    columns = np.arange(loc.shape[0]) if columns is None else np.asarray(columns, dtype=np.intp)
    if not (loc.shape == scale.shape == columns.shape) or loc.ndim != 1:
        raise ValueError(
            f"loc, scale and columns must have the same length, got shapes {loc.shape}, "
            f"{scale.shape} and {columns.shape}"
        )
    if not np.all(np.isfinite(loc)) or not np.all((scale > 0) & np.isfinite(scale)):
        raise ValueError(
            f"Gamma fit of coordinates {columns.tolist()}: need finite loc and finite scale > 0, "
            f"got loc={loc.tolist()}, scale={scale.tolist()} (a constant coordinate?)"
        )

    def chunk(x: np.ndarray, info: BlockInfo, halo: np.ndarray | None) -> dict:
        return _gamma_chunk(x, info, columns, loc, scale)

    def finalize(p: dict) -> GammaFit:
        if not np.all(p["n"] > 0):
            raise ValueError("the trajectory has no samples")
        mean_y = p["sum_y"] / p["n"]
        s = np.log(mean_y) - p["sum_log_y"] / p["n"]
        for j in np.flatnonzero(~(s > 0)):
            raise ValueError(f"coordinate {columns[j]} is constant: no Gamma fit exists")
        shape = gamma_shape_mle(np.log(mean_y), p["sum_log_y"] / p["n"])
        return GammaFit(columns, loc, p["n"].astype(np.int64), shape, scale * mean_y / shape)

    return Reduction("gamma", chunk, finalize=finalize)


# ---------------------------------------------------------------------------- basis choice


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
    """β = 1 unless the tail is clearly heavier than the weight's (Remark remark_rich): 1/2."""
    return 0.5 if excess_kurtosis > weight_kurtosis + KURTOSIS_THRESHOLD else 1.0


def _parse_value(text: str, key: str, entry: str, position: int) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    checks = {
        "beta": (lambda v: v >= 0.5, "beta >= 0.5"),
        "theta": (lambda v: v > -1.0, "theta > -1"),
        "scale": (lambda v: v > 0.0, "scale > 0"),
        "loc": (lambda v: True, "a finite number"),
    }
    check, need = checks[key]
    ok = math.isfinite(value) and check(value)
    if not ok:
        raise ValueError(
            f"basis spec entry {position} ({entry!r}): bad value {text!r} for {key!r}, need {need}"
        )
    return value


def _parse_entry(entry: str, position: int) -> Entry:
    """One spec entry ``family`` or ``family(key=value, ...)`` -> ``(family, {key: value})``."""
    match = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*(?:\((.*)\))?\s*", entry)
    family = match.group(1).lower() if match else None
    if family not in ("auto", *_KEYS) or (family == "auto" and match.group(2) is not None):
        raise ValueError(
            f"basis spec entry {position} ({entry!r}): expected 'auto', 'hermite(...)' or "
            "'laguerre(...)'"
        )
    params: dict[str, float] = {}
    body = match.group(2)
    for item in [] if body is None or not body.strip() else body.split(","):
        key, eq, value = (part.strip() for part in item.partition("="))
        if key not in _KEYS[family] or not eq or key in params:
            problem = "duplicate" if key in params else "unknown or malformed"
            raise ValueError(
                f"basis spec entry {position} ({entry!r}): {problem} parameter {item.strip()!r}; "
                f"{family} takes {', '.join(_KEYS[family])}"
            )
        params[key] = _parse_value(value, key, entry, position)
    return family, params


def _split_entries(spec: str) -> list[str]:
    """Split at the commas outside parentheses."""
    entries, depth, current = [], 0, []
    for char in spec:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise ValueError(f"basis spec {spec!r}: unbalanced or nested parentheses")
        if char == "," and depth == 0:
            entries.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError(f"basis spec {spec!r}: unbalanced parentheses")
    return [*entries, "".join(current)]


def _object_entry(item: object, position: int) -> Entry:
    """A Coordinate, a family object or an entry string -> an :data:`Entry`."""
    if isinstance(item, str):
        return _parse_entry(item, position)
    coordinate = item if isinstance(item, Coordinate) else None
    family = coordinate.family if coordinate is not None else item
    if isinstance(family, Hermite):
        name, params = "hermite", {"beta": float(family.beta)}
    elif isinstance(family, Laguerre):
        name, params = "laguerre", {"theta": float(family.theta), "beta": float(family.beta)}
    else:
        raise ValueError(
            f"basis spec entry {position}: expected a Coordinate, Hermite, Laguerre or a string, "
            f"got {item!r}"
        )
    if coordinate is not None:
        params.update(loc=float(coordinate.loc), scale=float(coordinate.scale))
    return name, params


def parse_basis_spec(spec: str | Sequence[object], d: int) -> list[Entry]:
    """Parse a basis spec for ``d`` coordinates into ``d`` entries ``(family, given params)``.

    ``"auto"`` alone applies to every coordinate; otherwise exactly ``d`` entries are needed.
    Raises :class:`ValueError` naming the offending entry.
    """
    if isinstance(spec, str):
        entries = [_parse_entry(e, i) for i, e in enumerate(_split_entries(spec))]
        if len(entries) == 1 and entries[0][0] == "auto":
            entries = entries * d
    else:
        entries = [_object_entry(item, i) for i, item in enumerate(spec)]
    if len(entries) != d:
        raise ValueError(f"basis spec {spec!r} has {len(entries)} entries for {d} coordinates")
    return entries


def _resolved_entries(moments: Moments, spec: str | Sequence[object]) -> list[Entry]:
    """The entries with ``auto`` replaced by the family the rule picks."""
    entries = parse_basis_spec(spec, moments.d)
    return [
        (_auto_family(moments, k), {}) if name == "auto" else (name, params)
        for k, (name, params) in enumerate(entries)
    ]


def _laguerre_loc(moments: Moments, k: int, params: dict[str, float]) -> float:
    loc = params["loc"] if "loc" in params else laguerre_shift(moments, k)[0]
    if loc > moments.minimum[k]:
        raise ValueError(
            f"coordinate {k}: Laguerre shift loc={loc!r} is above the data minimum "
            f"{moments.minimum[k]!r}; every sample needs x >= loc"
        )
    return loc


def gamma_reduction_for(
    moments: Moments, spec: str | Sequence[object] = "auto"
) -> Reduction | None:
    """The Gamma pass :func:`choose_basis` needs for ``spec``, or ``None`` if it needs none.

    It fits the Laguerre coordinates whose θ is not given, with their final shift and the
    provisional scale σ of :func:`laguerre_shift`.
    """
    columns, locs, scales = [], [], []
    for k, (name, params) in enumerate(_resolved_entries(moments, spec)):
        if name == "laguerre" and "theta" not in params:
            columns.append(k)
            locs.append(_laguerre_loc(moments, k, params))
            scales.append(laguerre_shift(moments, k)[1])
    return gamma_reduction(locs, scales, columns) if columns else None


def _theta_from_fit(gamma: GammaFit | None, k: int, loc: float) -> float:
    """Integer Laguerre θ = max(0, round(k̂ - 1)) from the Gamma fit of coordinate ``k``."""
    hits = [] if gamma is None else np.flatnonzero(gamma.columns == k)
    if len(hits) == 0 or gamma.loc[hits[0]] != loc:
        raise ValueError(
            f"coordinate {k}: Laguerre θ needs a Gamma fit with loc={loc!r}; run the pass from "
            "gamma_reduction_for(moments, spec) and pass its result as `gamma`"
        )
    return float(max(0, round(float(gamma.shape[hits[0]]) - 1.0)))


def _coordinate(
    moments: Moments, gamma: GammaFit | None, k: int, name: str, params: dict[str, float]
) -> Coordinate:
    mean, kurtosis = float(moments.mean[k]), float(moments.excess_kurtosis[k])
    if name == "hermite":
        loc = params.get("loc", mean)
        scale = params["scale"] if "scale" in params else float(moments.std[k])
        beta = params["beta"] if "beta" in params else _tail_beta(kurtosis, 0.0)
        family: Hermite | Laguerre = Hermite(beta=beta)
    else:
        loc = _laguerre_loc(moments, k, params)
        theta = params["theta"] if "theta" in params else _theta_from_fit(gamma, k, loc)
        scale = params["scale"] if "scale" in params else (mean - loc) / (theta + 1.0)
        beta = params["beta"] if "beta" in params else _tail_beta(kurtosis, 6.0 / (theta + 1.0))
        family = Laguerre(theta=theta, beta=beta)
    if not scale > 0:
        raise ValueError(
            f"coordinate {k}: the {name} scale from the data is {scale!r} (a constant "
            "coordinate?); give scale= in the basis spec"
        )
    return Coordinate(family, loc=float(loc), scale=float(scale))


def choose_basis(
    moments: Moments,
    gamma: GammaFit | None = None,
    spec: str | Sequence[object] = "auto",
) -> list[Coordinate]:
    """One :class:`~kelr_dist.kernels.bases.Coordinate` per component (algorithm step 1, §4).

    Parameters
    ----------
    moments : pass-0 statistics (:func:`moments_reduction`).
    gamma : the result of the pass :func:`gamma_reduction_for` returns, when it returns one
        (Laguerre coordinates whose θ is chosen from the data).
    spec : ``"auto"``, a comma-separated spec or a list (see the module docstring).

    Returns
    -------
    list of ``d`` coordinates. Raises :class:`ValueError` for a bad spec (naming the entry),
    a Laguerre shift above the data minimum or a zero scale (naming the coordinate).
    """
    entries = _resolved_entries(moments, spec)
    return [_coordinate(moments, gamma, k, name, p) for k, (name, p) in enumerate(entries)]


def fit_basis(
    x: np.ndarray,
    spec: str | Sequence[object] = "auto",
    chunks: Sequence[int] | int | None = None,
) -> list[Coordinate]:
    """:func:`choose_basis` on an in-memory trajectory ``x (n, d)`` or ``(chains, n, d)``."""
    moments = reduce_in_memory(moments_reduction(), x, chunks)
    gamma_pass = gamma_reduction_for(moments, spec)
    gamma = None if gamma_pass is None else reduce_in_memory(gamma_pass, x, chunks)
    return choose_basis(moments, gamma, spec)


def coordinates_from_spec(spec: str | Sequence[object], d: int) -> list[Coordinate]:
    """Coordinates from a fully specified spec (as :func:`format_basis` writes); no data needed.

    Raises :class:`ValueError` naming the entry when a family or a parameter is left to the data.
    """
    coordinates = []
    for k, (name, params) in enumerate(parse_basis_spec(spec, d)):
        needed = ("beta", "loc", "scale") + (("theta",) if name == "laguerre" else ())
        missing = [key for key in needed if key not in params]
        if name == "auto" or missing:
            raise ValueError(
                f"basis entry {k} ({name}) is not fully specified: "
                f"{'missing ' + ', '.join(missing) if missing else 'the family is auto'}"
            )
        family: Hermite | Laguerre = (
            Hermite(beta=params["beta"])
            if name == "hermite"
            else Laguerre(theta=params["theta"], beta=params["beta"])
        )
        coordinates.append(Coordinate(family, loc=params["loc"], scale=params["scale"]))
    return coordinates


def format_basis(coordinates: Sequence[Coordinate]) -> str:
    """The spec string of ``coordinates``; :func:`choose_basis` parses it back to them."""
    entries = []
    for c in coordinates:
        f = c.family
        head = f"laguerre(theta={float(f.theta)!r}," if isinstance(f, Laguerre) else "hermite("
        entries.append(
            f"{head}beta={float(f.beta)!r},loc={float(c.loc)!r},scale={float(c.scale)!r})"
        )
    return ",".join(entries)
