"""Post-analysis of an estimated response operator: what users do with ``k(t)``.

The estimate (:func:`kelr_dist.pipeline.estimate.estimate_response`) is a Dataset with
``response(lag, i, j)`` -- the linear response operator ``k_A(t)`` of eq. 5 on the lag
grid ``t = lag * dt`` -- and its block-averaging standard error ``response_stderr``. This
module turns it into the quantities of eq. 4:

- :func:`predict_response`: the linear response ``ΔE[A_i](t) = ∫_0^t Σ_j k_ij(t-s) δf_j(s) ds``
  to a forcing history, by the trapezoid rule on the lag grid;
- :func:`susceptibility`: the static response ``∫_0^T k(t) dt`` (trapezoid rule);
- :func:`normalized`: the operator with its diagonal scaled to ``k_ii(0) = 1`` (the paper's
  figures);
- :func:`sampled`, :func:`step`, :func:`ramp`: forcing histories as labelled DataArrays.

The same operations are available on the result Dataset through the ``kelr`` accessor
(``ds.kelr.predict(forcing)``, ``ds.kelr.susceptibility()``, ``ds.kelr.normalized()``),
registered when this module is imported.

Error bars
----------
A prediction is a weighted sum ``Σ_m c_m k_m`` of response entries. The standard errors of
neighbouring lags come from the same trajectory and are strongly (positively) correlated,
and their covariance is not part of the result. The default ``errors="bound"`` therefore
reports ``Σ_m |c_m| σ_m``, the standard deviation under perfectly correlated errors, which
is an upper bound on the standard deviation for *any* correlation between the entries
(triangle inequality for standard deviations). ``errors="independent"`` reports the
root-sum-square ``(Σ_m c_m² σ_m²)^{1/2}``, exact when the errors of different lags and
forcing components are independent; it is smaller and may understate the uncertainty.
Error bars are returned as a ``stderr`` coordinate of the result; they describe the
statistical error of the estimate only (not the quadrature error, nor the bias of the
density estimate), and they are not carried through later arithmetic on the DataArray.
The quadrature error is estimated apart (Richardson: the step response summed on every lag
against every second lag) as ``attrs["quadrature_error"]``, and a :class:`QuadratureWarning`
says when it exceeds the error bars: a response that changes within a lag or two.
With ``converged`` (the result's ``response_converged``: whether the block averaging of each
entry reached its plateau) a ``converged`` coordinate says whether every entry a value uses had
converged error bars; where it is False the error bar is too small.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
import xarray as xr
from numpy.typing import ArrayLike

if TYPE_CHECKING:
    from kelr_dist.data.fields import FieldLayout

ErrorModel = Literal["bound", "independent"]
ERROR_MODELS: tuple[str, ...] = ("bound", "independent")
RESPONSE_DIMS = ("lag", "i", "j")
#: suffixes of the companions of a response variable ``<name>``: its standard error, the
#: block averaging behind it and its move to a neighbouring model (not estimates themselves)
COMPANION_SUFFIXES = ("_stderr", "_block_size", "_converged", "_model_shift")
_GRID_RTOL = 1e-6  # relative tolerance when matching a forcing's time step to the response's dt
ForcedComponents = Hashable | Sequence[Hashable] | None
"""The ``j`` of a forcing history: the forced component's name, the names of several, or None."""


class QuadratureWarning(UserWarning):
    """The trapezoid sum over the lag grid of a step response is off by more than its error bars
    (or 1% of its size without them): the sample interval is coarse against how fast the
    response changes, and predictions inherit that error."""


#: a step response's quadrature error estimate beyond this fraction of its largest size is
#: warned when no standard errors are given (with them: beyond their bound)
QUADRATURE_TOLERANCE = 0.01


# --------------------------------------------------------------------------------------------
# forcing histories
# --------------------------------------------------------------------------------------------


def sampled(values: ArrayLike, times: ArrayLike, *, j: ForcedComponents = None) -> xr.DataArray:
    """A forcing history ``δf(t)`` sampled at ``times``, as a labelled DataArray.

    Parameters
    ----------
    values : ``(n,)`` samples of a forcing applied to one component, or ``(n, q)`` samples
        of a forcing applied to ``q`` components.
    times : ``(n,)`` strictly increasing sample times. ``times[0]`` is the switch-on time:
        the system is at equilibrium before it (eq. 2 starts from ``p_eq``).
    j : for ``(n,)`` values the forced component's name (stored as a scalar coordinate
        ``j``; may be omitted when the response has a single forcing component); for
        ``(n, q)`` values the ``q`` component names (required).

    Returns
    -------
    DataArray with dims ``("time",)`` or ``("time", "j")`` and coordinate ``time``.
    """
    t = np.asarray(times, dtype=float)
    f = np.asarray(values, dtype=float)
    if t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)):
        raise ValueError(f"times must be a non-empty 1-D array of finite numbers, got {t!r}")
    if t.size > 1 and not np.all(np.diff(t) > 0):
        raise ValueError("times must be strictly increasing")
    if f.ndim not in (1, 2) or f.shape[0] != t.size:
        raise ValueError(
            f"values must have shape ({t.size},) or ({t.size}, q) to match times, got {f.shape}"
        )
    if not np.all(np.isfinite(f)):
        raise ValueError("values must be finite")
    if f.ndim == 1:
        coords: dict[str, object] = {"time": t}
        if isinstance(j, list | tuple | np.ndarray):
            raise ValueError(f"j must name one component for one-dimensional values, got {j!r}")
        if j is not None:
            coords["j"] = j
        return xr.DataArray(f, dims=("time",), coords=coords, name="forcing")
    labels = list(j) if isinstance(j, list | tuple | np.ndarray) else [j]
    if j is None or len(labels) != f.shape[1]:
        raise ValueError(f"j must name the {f.shape[1]} forced components of values, got {j!r}")
    return xr.DataArray(f, dims=("time", "j"), coords={"time": t, "j": labels}, name="forcing")


def _profile_forcing(
    profile: Callable[[np.ndarray], np.ndarray],
    amplitude: ArrayLike,
    times: ArrayLike,
    j: ForcedComponents,
) -> xr.DataArray:
    """``profile(t) * amplitude`` at ``times``, for a scalar amplitude or one per component
    ``(q,)``."""
    t = np.asarray(times, dtype=float)
    p = profile(t)
    a = np.asarray(amplitude, dtype=float)
    if a.ndim > 1:
        raise ValueError(f"amplitude must be a number or a 1-D array, got shape {a.shape}")
    values = p * a if a.ndim == 0 else p[:, None] * a[None, :]
    return sampled(values, t, j=j)


def step(
    amplitude: ArrayLike, times: ArrayLike, *, j: ForcedComponents = None, onset: float = 0.0
) -> xr.DataArray:
    """Step forcing ``δf(t) = amplitude · H(t - onset)`` sampled at ``times``.

    Parameters
    ----------
    amplitude : a number (one forced component, named by ``j``) or ``(q,)`` amplitudes of
        the ``q`` components named by ``j``.
    times : ``(n,)`` sample times, usually the response's lag grid ``ds.time[:n]``.
    j : component name(s), see :func:`sampled`.
    onset : switch-on time; samples at ``t >= onset`` carry the amplitude. An onset between
        grid points is resolved only to within one time step by the trapezoid rule.
    """
    return _profile_forcing(lambda t: (t >= onset).astype(float), amplitude, times, j)


def ramp(
    rate: ArrayLike, times: ArrayLike, *, j: ForcedComponents = None, onset: float = 0.0
) -> xr.DataArray:
    """Ramp forcing ``δf(t) = rate · max(t - onset, 0)`` sampled at ``times``.

    Parameters are those of :func:`step`, with ``rate`` (forcing per unit time) in place of
    the amplitude.
    """
    return _profile_forcing(lambda t: np.maximum(t - onset, 0.0), rate, times, j)


# --------------------------------------------------------------------------------------------
# validation of the labelled inputs
# --------------------------------------------------------------------------------------------


def _check_errors(errors: str) -> None:
    if errors not in ERROR_MODELS:
        raise ValueError(f"errors must be one of {ERROR_MODELS}, got {errors!r}")


def _response_values(response: xr.DataArray, name: str = "response") -> tuple[np.ndarray, float]:
    """Validate a ``(lag, i, j)`` response operator; return its values and time step ``dt``.

    The lags must be ``0, 1, ..., S``; ``dt`` comes from the ``time`` coordinate on ``lag``
    (``time = lag * dt``) or, failing that, from ``attrs["dt"]``.
    """
    if not isinstance(response, xr.DataArray):
        raise ValueError(f"{name} must be an xarray.DataArray, got {type(response).__name__}")
    if set(response.dims) != set(RESPONSE_DIMS):
        raise ValueError(f"{name} must have dims {RESPONSE_DIMS}, got {response.dims}")
    if "lag" not in response.coords:
        raise ValueError(f"{name} has no 'lag' coordinate")
    lags = response["lag"].values
    if not np.array_equal(lags, np.arange(lags.size)):
        raise ValueError(f"{name} lags must be 0, 1, ..., S without gaps, got {lags}")
    if "time" in response.coords and response["time"].dims == ("lag",) and lags.size > 1:
        times = np.asarray(response["time"].values, dtype=float)
        dt = float(times[1] - times[0])
        if not np.allclose(times, lags * dt, rtol=_GRID_RTOL, atol=0.0) or dt <= 0:
            raise ValueError(f"{name} time coordinate is not lag * dt with dt > 0: {times}")
    elif "dt" in response.attrs:
        dt = float(response.attrs["dt"])
    else:
        raise ValueError(f"{name} needs a 'time' coordinate on 'lag' or a 'dt' attribute")
    if not (np.isfinite(dt) and dt > 0):
        raise ValueError(f"{name} time step dt must be positive, got {dt}")
    return np.asarray(response.transpose(*RESPONSE_DIMS).values, dtype=float), dt


def _stderr_values(stderr: xr.DataArray, response: xr.DataArray) -> np.ndarray:
    """Validate ``stderr`` against ``response`` (same dims and labels, non-negative)."""
    if not isinstance(stderr, xr.DataArray) or set(stderr.dims) != set(RESPONSE_DIMS):
        raise ValueError(f"stderr must be an xarray.DataArray with dims {RESPONSE_DIMS}")
    for dim in RESPONSE_DIMS:
        if not np.array_equal(stderr[dim].values, response[dim].values):
            raise ValueError(f"stderr coordinate {dim!r} does not match the response's")
    values = np.asarray(stderr.transpose(*RESPONSE_DIMS).values, dtype=float)
    if not np.all(values >= 0):
        raise ValueError("stderr must be non-negative (and not NaN)")
    return values


def is_estimate(dataset: xr.Dataset, name: Hashable) -> bool:
    """Whether ``dataset[name]`` is a response estimate ``(lag, i, j)`` (not its stderr nor its
    blocking companions, :data:`COMPANION_SUFFIXES`)."""
    return set(dataset[name].dims) == set(RESPONSE_DIMS) and not str(name).endswith(
        COMPANION_SUFFIXES
    )


def _converged_values(converged: xr.DataArray, response: xr.DataArray) -> np.ndarray:
    """Validate ``converged`` against ``response``; ``(lag, i, j)`` bool."""
    if not isinstance(converged, xr.DataArray) or set(converged.dims) != set(RESPONSE_DIMS):
        raise ValueError(f"converged must be an xarray.DataArray with dims {RESPONSE_DIMS}")
    if converged.shape != response.shape:
        raise ValueError(f"converged has shape {converged.shape}, the response {response.shape}")
    return np.asarray(converged.transpose(*RESPONSE_DIMS).values, dtype=bool)


def _forcing_matrix(forcing: xr.DataArray, components: np.ndarray) -> np.ndarray:
    """The forcing as an ``(n, q)`` matrix over all ``q`` response components (zeros elsewhere)."""
    if not isinstance(forcing, xr.DataArray):
        raise ValueError(f"forcing must be an xarray.DataArray, got {type(forcing).__name__}")
    if forcing.dims not in (("time",), ("time", "j"), ("j", "time")):
        raise ValueError(f"forcing must have dims ('time',) or ('time', 'j'), got {forcing.dims}")
    if "time" not in forcing.coords:
        raise ValueError("forcing has no 'time' coordinate")
    known = list(np.asarray(components).tolist())
    if forcing.ndim == 1:
        if "j" in forcing.coords:
            labels = [forcing["j"].values.tolist()]
        elif len(known) == 1:
            labels = known
        else:
            raise ValueError(
                f"a one-dimensional forcing needs a scalar coordinate 'j' naming the forced "
                f"component (one of {known})"
            )
        values = np.asarray(forcing.values, dtype=float)[:, None]
    else:
        labels = forcing["j"].values.tolist() if "j" in forcing.coords else []
        if len(labels) != forcing.sizes["j"] or len(set(labels)) != len(labels):
            raise ValueError(f"forcing needs unique 'j' labels, got {labels}")
        values = np.asarray(forcing.transpose("time", "j").values, dtype=float)
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise ValueError(f"forcing component(s) {unknown} are not among the response's j {known}")
    if not np.all(np.isfinite(values)):
        raise ValueError("forcing values must be finite")
    matrix = np.zeros((values.shape[0], len(known)))
    matrix[:, [known.index(label) for label in labels]] = values
    return matrix


def _check_forcing_times(times: np.ndarray, dt: float, max_lag: int) -> None:
    """The forcing must be sampled at the response's ``dt`` and not outlast its lags."""
    steps = np.diff(times)
    bad = np.flatnonzero(~np.isclose(steps, dt, rtol=_GRID_RTOL, atol=0.0))
    if bad.size:
        n = bad[0]
        raise ValueError(
            f"forcing time step {steps[n]:g} (between times {times[n]:g} and {times[n + 1]:g}) "
            f"does not match the response's dt = {dt:g}; resample the forcing on that grid"
        )
    if times.size - 1 > max_lag:
        raise ValueError(
            f"forcing runs to time {times[-1]:g}, but the prediction at time "
            f"{times[max_lag + 1]:g} needs the response at lag {max_lag + 1} and the response "
            f"is estimated only up to lag {max_lag} (time {max_lag * dt:g}); shorten the "
            f"forcing or estimate more lags"
        )


# --------------------------------------------------------------------------------------------
# quadrature
# --------------------------------------------------------------------------------------------


def _trapezoid_convolution(kernel: np.ndarray, signal: np.ndarray, end_weight: float) -> np.ndarray:
    """``y[n] = Σ_{m=0}^{n} w_{n,m} kernel[n-m] @ signal[m]``, ``w = 1`` inside, ``end_weight``
    at ``m = 0`` and ``m = n``; ``y[0] = 0`` (an empty interval).

    ``kernel (n, p, q)``, ``signal (n, q)`` -> ``(n, p)``. With ``end_weight = 1/2`` and a
    factor ``dt`` this is the composite trapezoid rule for ``∫_0^t k(t-s) f(s) ds``.
    """
    n = signal.shape[0]
    from scipy.signal import fftconvolve  # deferred: scipy.signal costs seconds to import

    full = fftconvolve(kernel, signal[:, None, :], axes=0)[:n].sum(axis=2)
    ends = np.einsum("npq,q->np", kernel, signal[0]) + np.einsum("pq,nq->np", kernel[0], signal)
    out = full - (1.0 - end_weight) * ends
    out[0] = 0.0
    return out


def _trapezoid_weights(n: int) -> np.ndarray:
    """Composite trapezoid weights ``(n,)`` on a unit grid: ``[1/2, 1, ..., 1, 1/2]``."""
    weights = np.ones(n)
    weights[[0, -1]] = 0.5
    return weights


# --------------------------------------------------------------------------------------------
# public operations
# --------------------------------------------------------------------------------------------


def predict_response(
    response: xr.DataArray,
    forcing: xr.DataArray,
    *,
    stderr: xr.DataArray | None = None,
    errors: ErrorModel = "bound",
    converged: xr.DataArray | None = None,
) -> xr.DataArray:
    """Linear response ``ΔE[A_i](t_n)`` to a forcing history (eq. 4).

    ``ΔE[A_i](t_n) = ∫_{t_0}^{t_n} Σ_j k_ij(t_n - s) δf_j(s) ds``, computed with the
    composite trapezoid rule on the lag grid:
    ``dt · Σ_{m=0}^{n} w_m Σ_j k_ij((n-m) dt) δf_j(t_m)`` with ``w_0 = w_n = 1/2`` and
    ``w_m = 1`` otherwise. The quadrature error is ``O(dt²)`` for a smooth integrand; a
    step that switches on between grid points, or a jump of ``k`` at ``t = 0``, costs
    ``O(dt)``. ``ΔE(t_0) = 0``.

    Parameters
    ----------
    response : ``(lag, i, j)`` response operator ``k(t)`` (eq. 5) with lags
        ``0..S`` and a ``time`` coordinate on ``lag`` (or ``attrs["dt"]``).
    forcing : forcing history ``δf`` with dims ``("time", "j")``, or ``("time",)`` with a
        scalar coordinate ``j`` naming the forced component (see :func:`step`,
        :func:`ramp`, :func:`sampled`). It must be sampled at the response's ``dt``;
        ``time[0]`` is the switch-on time and components it does not name are unforced.
    stderr : optional ``(lag, i, j)`` standard errors of ``response`` (``response_stderr``).
    errors : ``"bound"`` (default: conservative, valid for any correlation between lags)
        or ``"independent"`` (root-sum-square); see the module docstring.
    converged : optional ``(lag, i, j)`` bool, ``response_converged``.

    Returns
    -------
    DataArray ``prediction`` with dims ``("time", "i")`` on the forcing's time coordinate
    and the response's ``i`` labels; with ``stderr`` given, a ``stderr`` coordinate of the
    same dims holds the propagated standard error; with ``converged`` given, a ``converged``
    coordinate: whether every entry ``k_ij(s)`` the value uses (forced ``j``, ``s <= t``)
    had converged error bars.

    Raises
    ------
    ValueError
        If the forcing's time step differs from ``dt``, it names an unknown component, or it
        runs past the largest estimated lag (the message names the first time that cannot
        be predicted).
    """
    _check_errors(errors)
    k, dt = _response_values(response)
    f = _forcing_matrix(forcing, response["j"].values)
    times = np.asarray(forcing["time"].values, dtype=float)
    _check_forcing_times(times, dt, k.shape[0] - 1)
    n = times.size
    prediction = xr.DataArray(
        dt * _trapezoid_convolution(k[:n], f, 0.5),
        dims=("time", "i"),
        coords={"time": times, "i": response["i"].values},
        name="prediction",
        attrs={"dt": dt, "quadrature": "trapezoid", "equation": "eq. 4"},
    )
    if converged is not None:
        unconverged = (~_converged_values(converged, response)[:n]).astype(float)
        used = (f != 0).astype(float)
        # a count of the unconverged entries used, each weighted 1/2 or 1 (by FFT: not exact)
        flags = _trapezoid_convolution(unconverged, used, 0.5) < 0.25
        prediction = prediction.assign_coords(converged=(("time", "i"), flags))
    sigma = None if stderr is None else _stderr_values(stderr, response)[:n]
    prediction.attrs["quadrature_error"] = _warn_quadrature(k[:n], dt, sigma, float(times[0]))
    if sigma is None:
        return prediction
    if errors == "bound":
        propagated = dt * _trapezoid_convolution(sigma, np.abs(f), 0.5)
    else:
        variance = _trapezoid_convolution(sigma**2, f**2, 0.25)
        propagated = dt * np.sqrt(np.maximum(variance, 0.0))
    prediction.attrs["errors"] = errors
    return prediction.assign_coords(stderr=(("time", "i"), propagated))


def _quadrature_error(k: np.ndarray, dt: float) -> np.ndarray:
    """Richardson's estimate ``|I_h - I_2h| / 3`` of the trapezoid rule's error in the step
    response ``I(t) = ∫_0^t k(s) ds`` at the even lags, ``(⌈S/2⌉, q, d)`` from ``k (S, q, d)``;
    ``I_2h`` is the same sum on every second lag (the error of a rule of order ``h²``)."""
    fine = dt * _cumulative_trapezoid(k)[::2]
    coarse = 2.0 * dt * _cumulative_trapezoid(k[::2])
    return np.abs(fine - coarse) / 3.0


def _cumulative_trapezoid(values: np.ndarray) -> np.ndarray:
    """The trapezoid rule on a unit grid from index 0 to every index along axis 0."""
    out = np.zeros_like(values)
    out[1:] = np.cumsum(0.5 * (values[1:] + values[:-1]), axis=0)
    return out


def _warn_quadrature(k: np.ndarray, dt: float, sigma: np.ndarray | None, start: float) -> float:
    """The largest quadrature error estimate of the step response over the lags ``k`` a
    prediction uses; a one-line :class:`QuadratureWarning` where it exceeds the step response's
    error bars (their bound, from ``sigma``) or, without them, 1% of its size."""
    error = _quadrature_error(k, dt)
    if sigma is None:
        size = np.max(np.abs(dt * _cumulative_trapezoid(k)), axis=0)
        tolerance = np.broadcast_to(QUADRATURE_TOLERANCE * size, error.shape)
    else:
        tolerance = dt * _cumulative_trapezoid(sigma)[::2]
    beyond = error > tolerance
    if beyond.any():
        lag, i, j = (int(v) for v in np.argwhere(beyond)[0])
        warnings.warn(
            f"the response changes too fast for its lag grid (dt = {dt:.6g}): the trapezoid sum "
            f"over lags of the step response ({i}, {j}) may be off by {error[lag, i, j]:.3g} "
            f"at time {start + 2 * lag * dt:.6g}, more than its error bars (or 1% of its size "
            "without them), and a prediction inherits that; estimate from a store with a finer "
            "dt, or read the prediction as approximate there",
            QuadratureWarning,
            stacklevel=3,
        )
    return float(np.max(error, initial=0.0))


def susceptibility(
    response: xr.DataArray,
    *,
    stderr: xr.DataArray | None = None,
    errors: ErrorModel = "bound",
    converged: xr.DataArray | None = None,
) -> xr.DataArray:
    """Static susceptibility ``χ_ij = ∫_0^T k_ij(t) dt`` over the estimated lags (trapezoid).

    ``T = S·dt`` is the largest estimated lag; for a response that has decayed by ``T`` this
    is the long-time response to a unit step (for Ornstein-Uhlenbeck, ``Γ^{-1}``).

    Parameters
    ----------
    response : ``(lag, i, j)`` response operator with at least two lags.
    stderr, errors, converged : as in :func:`predict_response`.

    Returns
    -------
    DataArray ``susceptibility`` with dims ``("i", "j")``, attribute ``horizon = T``, a
    ``stderr`` coordinate when ``stderr`` is given and a ``converged`` coordinate (every lag's
    error bar converged) when ``converged`` is given.
    """
    _check_errors(errors)
    k, dt = _response_values(response)
    if k.shape[0] < 2:
        raise ValueError(f"response needs at least two lags to integrate, got {k.shape[0]}")
    weights = dt * _trapezoid_weights(k.shape[0])
    result = xr.DataArray(
        np.tensordot(weights, k, axes=1),
        dims=("i", "j"),
        coords={"i": response["i"].values, "j": response["j"].values},
        name="susceptibility",
        attrs={"dt": dt, "horizon": (k.shape[0] - 1) * dt, "quadrature": "trapezoid"},
    )
    if converged is not None:
        flags = _converged_values(converged, response).all(axis=0)
        result = result.assign_coords(converged=(("i", "j"), flags))
    if stderr is None:
        return result
    sigma = _stderr_values(stderr, response)
    if errors == "bound":
        propagated = np.tensordot(weights, sigma, axes=1)
    else:
        propagated = np.sqrt(np.tensordot(weights**2, sigma**2, axes=1))
    result.attrs["errors"] = errors
    return result.assign_coords(stderr=(("i", "j"), propagated))


def _diagonal_scale(values: np.ndarray, name: str) -> np.ndarray:
    """``(i, j)`` divisors: ``k_pp(0)`` on the (positional) diagonal, 1 elsewhere."""
    scale = np.ones(values.shape[1:])
    diagonal = np.arange(min(scale.shape))
    scale[diagonal, diagonal] = values[0, diagonal, diagonal]
    if not np.all(np.isfinite(scale)) or np.any(scale == 0):
        raise ValueError(f"{name} has a zero or non-finite diagonal at lag 0; cannot normalise")
    return scale


def normalized(dataset: xr.Dataset) -> xr.Dataset:
    """Scale the diagonal entries of every response to ``k_ii(0) = 1`` (the paper's figures).

    Every variable with dims ``(lag, i, j)`` (``response``, ``response_exact``,
    ``response_kde``, ...) has its diagonal entries ``k_pp(t)`` (positions ``p`` of ``i``
    and ``j``) divided by its own ``k_pp(0)``; off-diagonal entries are unchanged. A
    ``<name>_stderr`` variable (and ``_total_stderr``, ``_estimator_stderr``,
    ``_model_shift``) is divided by the same factor as ``<name>`` (the uncertainty of
    ``k_pp(0)`` itself is not propagated).

    Returns
    -------
    A new Dataset with the scaled variables and ``attrs["normalization"]``.
    """
    responses = [name for name in dataset.data_vars if is_estimate(dataset, name)]
    if not responses:
        raise ValueError(f"dataset has no variable with dims {RESPONSE_DIMS} to normalise")
    scaled = {}
    for name in responses:
        values = np.asarray(dataset[name].transpose(*RESPONSE_DIMS).values, dtype=float)
        scale = xr.DataArray(
            _diagonal_scale(values, str(name)),
            dims=("i", "j"),
            coords={"i": dataset["i"].values, "j": dataset["j"].values},
        )
        scaled[name] = dataset[name] / scale
        for suffix in ("_stderr", "_total_stderr", "_estimator_stderr", "_model_shift"):
            if f"{name}{suffix}" in dataset:
                scaled[f"{name}{suffix}"] = dataset[f"{name}{suffix}"] / scale
    result = dataset.assign(scaled)
    for name in scaled:
        result[name].attrs = dict(dataset[name].attrs)
    result.attrs["normalization"] = "diagonal entries divided by their value at lag 0"
    return result


@xr.register_dataset_accessor("kelr")
class KelrAccessor:
    """``ds.kelr``: post-analysis of a response Dataset from ``estimate_response``.

    Examples
    --------
    >>> times = ds["time"].values[:200]  # the lag grid
    >>> ds.kelr.predict(step(0.1, times, j="x"))  # ΔE[A](t) with error bars
    >>> ds.kelr.susceptibility()  # ∫_0^T k dt
    >>> ds.kelr.normalized()  # diagonal k_ii(0) = 1
    """

    def __init__(self, dataset: xr.Dataset) -> None:
        self._dataset = dataset

    def _converged(self, variable: str) -> xr.DataArray | None:
        converged = self._dataset.get(f"{variable}_converged")
        return None if converged is None else self._on_components(converged)

    def _layout(self) -> FieldLayout | None:
        """The grid of a field's result (None for any other result); imported here: the data
        layer imports xarray, whose import registers this accessor."""
        from kelr_dist.data.fields import FieldLayout

        return FieldLayout.from_attrs(self._dataset.attrs)

    def _on_components(self, values: xr.DataArray) -> xr.DataArray:
        """A field result's ``(lag, i_<dim>..., j_<dim>...)`` variable as ``(lag, i, j)``
        (:meth:`~kelr_dist.data.fields.FieldLayout.on_components`); any other as it is."""
        layout = self._layout()
        return values if layout is None else layout.on_components(values)

    def _field_forcing(self, forcing: xr.DataArray) -> xr.DataArray:
        """A field result's forcing history over the grid ``(time, <spatial dims>)`` stacked
        into its points, ``(time, j)``; any other as it is."""
        layout = self._layout()
        if layout is None or not isinstance(forcing, xr.DataArray):
            return forcing
        if set(layout.dims) <= set(map(str, forcing.dims)):
            if "time" not in forcing.dims or forcing.ndim != len(layout.dims) + 1:
                raise ValueError(
                    f"a forcing history over the grid needs dims ('time', *{layout.dims}), got "
                    f"{tuple(map(str, forcing.dims))}"
                )
            return layout.stack(forcing, "", "j").transpose("time", "j")
        return forcing

    def _pattern_amplitude(self, forcing: xr.DataArray) -> bool:
        """Whether ``forcing`` is the amplitude ``(time,)`` of the pattern a field's result was
        estimated with: it forces the pattern's own column (``pattern_<variable>``)."""
        return (
            isinstance(forcing, xr.DataArray)
            and forcing.dims == ("time",)
            and self._dataset.attrs.get("forcing") == "pattern"
        )

    def _on_grid(self, values: xr.DataArray, prefixes: dict[str, str]) -> xr.DataArray:
        """A field result's output with its ``i``/``j`` over the grid's points spread back over
        the grid (:meth:`~kelr_dist.data.fields.FieldLayout.on_grid`); any other as it is."""
        layout = self._layout()
        return values if layout is None else layout.on_grid(values, prefixes)

    def _variable(self, variable: str) -> tuple[xr.DataArray, xr.DataArray | None]:
        if variable not in self._dataset.data_vars:
            names = [str(name) for name in self._dataset.data_vars]
            raise ValueError(f"variable {variable!r} is not in the dataset (has {names})")
        response = self._on_components(self._dataset[variable])
        if "time" not in response.coords and "dt" in self._dataset.attrs:
            response = response.assign_attrs(dt=self._dataset.attrs["dt"])
        # the total error (sampling and the fitted score's variance) where the result has it
        stderr = self._dataset.get(f"{variable}_total_stderr")
        stderr = self._dataset.get(f"{variable}_stderr") if stderr is None else stderr
        return response, None if stderr is None else self._on_components(stderr)

    def predict(
        self, forcing: xr.DataArray, *, variable: str = "response", errors: ErrorModel = "bound"
    ) -> xr.DataArray:
        """:func:`~kelr_dist.predict_response` of ``ds[variable]`` with
        ``ds[variable + "_total_stderr"]`` (or ``_stderr`` in results without it; and
        ``_converged``).

        For a field's result the forcing may be a history over the grid ``(time, lat, lon)``
        (or, for a result estimated with a forcing pattern, the pattern's amplitude
        ``(time,)``: the prediction is then that of the pattern's own column,
        ``pattern_<variable>``, with its standard errors), and a prediction of the field itself
        is a field ``(time, lat, lon)``."""
        if self._pattern_amplitude(forcing):
            variable, forcing = f"pattern_{variable}", forcing.assign_coords(j="pattern")
        response, stderr = self._variable(variable)
        converged = self._converged(variable)
        if "j" not in response.dims:  # a pattern's column
            response = response.expand_dims(j=["pattern"], axis=-1)
            stderr = None if stderr is None else stderr.expand_dims(j=["pattern"], axis=-1)
            if converged is not None:
                converged = converged.expand_dims(j=["pattern"], axis=-1)
        prediction = predict_response(
            response,
            self._field_forcing(forcing),
            stderr=stderr,
            errors=errors,
            converged=converged,
        )
        return self._on_grid(prediction, {"i": ""})

    def susceptibility(
        self, *, variable: str = "response", errors: ErrorModel = "bound"
    ) -> xr.DataArray:
        """:func:`susceptibility` of ``ds[variable]`` with ``ds[variable + "_total_stderr"]``
        (or ``_stderr`` in results without it; and ``_converged``)."""
        response, stderr = self._variable(variable)
        static = susceptibility(
            response, stderr=stderr, errors=errors, converged=self._converged(variable)
        )
        return self._on_grid(static, {"i": "i_", "j": "j_"})

    def normalized(self) -> xr.Dataset:
        """:func:`normalized` of the dataset."""
        return normalized(self._dataset)
