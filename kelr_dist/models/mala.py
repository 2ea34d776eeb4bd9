"""Metropolis-adjusted Langevin (MALA) sampling, periodic components wrapped, and its model base.

Each step proposes ``y = x + h s(x) + sqrt(2h) xi`` (``s = grad log p_eq``, ``xi`` standard
normal) and accepts it with probability ``min(1, p(y) q(x|y) / (p(x) q(y|x)))``,
``q(y|x) ∝ exp(-|y - x - h s(x)|^2 / 4h)``, so the analytic ``p_eq`` is exactly invariant. For
small ``h`` this is the overdamped Langevin dynamics ``dX = s(X) dt + sqrt(2) dW``.

Periodic components (angles, the first ``angles`` of the state) are wrapped to ``(-π, π]`` after
each proposal. On the circle the proposal density is the wrapped Gaussian; the chain uses its
nearest image, the displacement wrapped to ``(-π, π]``: the other images weigh
``exp(-(2π - |Δ|)² / 4h)`` relative to it, below 1e-40 for the step sizes of the angle systems
(``sqrt(2h) ≤ 0.3``, ``|Δ| ≤ 5 sqrt(2h)``).

The uniform of the Metropolis test is one of the standard normals, ``u = Phi(z)`` (exactly
uniform), so each step consumes ``d + 1`` normals of the one stream and no second stream has to
be interleaved; the state is the stored sample itself (``log p`` and ``s`` are recomputed at the
start of each sub-block, the same numbers the chain carried).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from kelr_dist.kernels.compiled import compiled
from kelr_dist.models.densities import log_density_and_score, log_density_point
from kelr_dist.models.parameters import Parameters, count, derived, parameter, positive
from kelr_dist.models.sampling import points, run_blocks

_INV_SQRT2 = 1.0 / math.sqrt(2.0)


@compiled
def _wrap(value: float) -> float:
    """``value`` wrapped to ``(-π, π]``."""
    out = value - 2.0 * math.pi * math.floor((value + math.pi) / (2.0 * math.pi))
    return math.pi if out == -math.pi else out


@compiled
def _log_target(
    system: int,
    u: np.ndarray,
    theta: np.ndarray,
    positive: range,
    point: np.ndarray,
    grad: np.ndarray,
    tilt: np.ndarray,
) -> float:
    """``log p + tilt · x`` of the sampler's coordinates ``u`` and its gradient (into ``grad``):
    ``x = u`` but ``x_i = exp(u_i)`` for ``i`` in ``positive``, whose density ``p(x) x_i`` and
    gradient ``x_i ∂_i log p + 1`` take the change of variables in (``point`` holds ``x``). Zero
    entries of ``tilt`` are skipped, so an untilted target's numbers are bit for bit its own."""
    point[:] = u
    for i in positive:
        point[i] = math.exp(u[i])
    log_p = log_density_point(system, point, theta, grad)
    for i in range(u.shape[0]):
        if tilt[i] != 0.0:
            log_p += tilt[i] * point[i]
            grad[i] += tilt[i]
    for i in positive:
        log_p += u[i]
        grad[i] = grad[i] * point[i] + 1.0
    return log_p


@compiled
def mala(
    x0: np.ndarray,
    normals: np.ndarray,
    out: np.ndarray,
    step: float,
    subsample: int,
    system: int,
    theta: np.ndarray,
    angles: int,
    accepted: np.ndarray,
    positive: int = 0,
    tilt: np.ndarray | None = None,
) -> np.ndarray:
    """MALA steps for ``system`` (:mod:`kelr_dist.models.densities`), storing every
    ``subsample``-th state; the first ``angles`` components wrapped to ``(-π, π]``, the
    ``positive`` after them moved in ``log x``.

    Proposal ``y = wrap(x + h s(x) + sqrt(2h) xi)``; accepted when ``Phi(z) < exp(log r)`` with
    ``log r = log p(y) - log p(x) - |wrap(x - y - h s(y))|^2 / 4h + |xi|^2 / 2`` (a NaN ratio,
    e.g. an overflowing proposal, is rejected). A positive component ``x_i`` is proposed and
    tested in ``u_i = log x_i``, with the density ``p(x) x_i`` of ``u`` (:func:`_log_target`):
    near ``x_i = 0``, where ``∂_i log p`` grows like ``1 / x_i``, steps in ``x_i`` itself are
    rejected almost always and the chain would rarely enter that region.

    Parameters
    ----------
    x0 : (d,) state before the block.
    normals : (k * subsample, d + 1) per step: ``xi`` (d) then ``z`` for the uniform ``Phi(z)``.
    out : (k, d) written with the state after every ``subsample`` steps.
    step : ``h``.
    theta : the system's parameters, as :func:`kelr_dist.models.densities.log_density_point`
        reads them.
    angles : how many leading components are angles.
    accepted : (1,) int64, incremented by the number of accepted proposals.
    positive : how many components after the angles are positive (``x0`` must be, there).
    tilt : (d,) ``ε``: the target ``p(x) exp(ε · x)`` and its score ``s + ε`` (default none):
        for small ``h`` the dynamics ``dX = (s(X) + ε) dt + sqrt(2) dW``, the constant forcing
        ``ε`` of the FDT (eq. 4), on the components moved in ``x`` itself (on a ``positive``
        one it is the dynamics of ``log x`` that is tilted). The same ``normals`` with two
        tilts give two chains driven by common random numbers (the same proposals' noise and
        the same uniforms).
    """
    d = x0.shape[0]
    if tilt is None:
        weights = np.zeros(d)
    else:
        weights = tilt
    logs = range(angles, angles + positive)
    x = x0.copy()
    for i in logs:
        x[i] = math.log(x0[i])
    y = np.empty(d)
    # the positive components in x as stored: the chain's u is log of these, so that a run
    # resumed from a stored sample carries the same u, bit for bit
    stored = x0.copy()
    proposed = x0.copy()
    gx = np.empty(d)
    gy = np.empty(d)
    point = np.empty(d)
    lpx = _log_target(system, x, theta, logs, point, gx, weights)
    noise = math.sqrt(2.0 * step)
    inv4h = 0.25 / step
    row = 0
    count = 0
    for n in range(out.shape[0]):
        for _ in range(subsample):
            forward = 0.0
            for i in range(d):
                z = normals[row, i]
                y[i] = x[i] + step * gx[i] + noise * z
                if i < angles:
                    y[i] = _wrap(y[i])
                elif i < angles + positive:
                    proposed[i] = math.exp(y[i])
                    y[i] = math.log(proposed[i])
                forward += z * z
            lpy = _log_target(system, y, theta, logs, point, gy, weights)
            backward = 0.0
            for i in range(d):
                r = x[i] - y[i] - step * gy[i]
                if i < angles:
                    r = _wrap(r)
                backward += r * r
            log_ratio = lpy - lpx - inv4h * backward + 0.5 * forward
            if log_ratio >= 0.0 or 0.5 * math.erfc(-normals[row, d] * _INV_SQRT2) < math.exp(
                log_ratio
            ):
                x, y = y, x
                gx, gy = gy, gx
                stored, proposed = proposed, stored
                lpx = lpy
                count += 1
            row += 1
        for i in range(d):
            out[n, i] = stored[i] if angles <= i < angles + positive else x[i]
    accepted[0] += count
    return out


def _tilt(tilt: np.ndarray, d: int, angles: int) -> np.ndarray:
    """``tilt`` as a finite float64 ``(d,)`` array, zero on the ``angles`` first components, or a
    ValueError naming it (``exp(ε θ)`` is not periodic: a constant force on an angle has no
    stationary law of this form)."""
    weights = np.array(tilt, dtype=np.float64)
    if weights.shape != (d,) or not np.all(np.isfinite(weights)):
        raise ValueError(f"tilt={tilt!r} must be {d} finite numbers, one per component")
    if np.any(weights[:angles] != 0.0):
        raise ValueError(f"tilt={tilt!r} must be 0 on the {angles} angle component(s)")
    return weights


#: the sampler's parameters, which the density does not read
SAMPLER = ("step", "subsample")


@dataclass(eq=False)
class MalaSystem(Parameters):
    """The sampler and exact evaluators of a MALA-sampled system.

    A subclass is a ``@dataclass`` of its density's parameters and names its ``components``; its
    class keywords give its ``name``, the number ``system`` of its density in
    :mod:`kelr_dist.models.densities` and, where they differ from the defaults here, its
    sampler's ``step`` and ``subsample``::

        @dataclass(eq=False)
        class Coupled3D(Potential, name="coupled-3d", system=COUPLED_3D, subsample=10): ...

    The density reads ``_theta``: the parameters in their declaration order, the sampler's left
    out, unless the subclass's ``_derive`` sets another.
    """

    name: ClassVar[str]
    default_burn_in: ClassVar[int] = 20_000  # stored samples, for every MALA system
    angles: ClassVar[int] = 0  # how many leading components are angles in (-π, π]
    positives: ClassVar[int] = 0  # how many components after the angles are positive (log moves)
    _system: ClassVar[int]
    components: tuple[str, ...] = derived()
    # Each system's default step keeps h E[s_i^2] <= 0.02 for every component i (s the score in
    # the sampler's coordinates); its subsample keeps its dt. MALA follows the diffusion to O(h)
    # over finite times (Bou-Rabee & Vanden-Eijnden 2010; rejections O(h^(3/2)) per step, Roberts
    # & Tweedie 1996): the Euler proposal runs the chain's clock fast by about h E[s_i^2] / 2
    # (exactly so for a Gaussian) and rejections slow it by about their fraction. At this bound
    # C(0) - C(t) matches the FDT's integral of k within 1-3% at the stored lags, with ~0.1% of
    # proposals rejected; at h E[s_i^2] of 0.5-0.9 (18-27% rejected) it misses by up to 4-18%
    # (scripts/mala_fdt_check.py, tests/test_mala_tilt.py).
    step: float = parameter(0.001, positive)
    subsample: int = parameter(200, count)
    _theta: np.ndarray = derived()

    def __init_subclass__(
        cls,
        *,
        name: str | None = None,
        system: int | None = None,
        step: float | None = None,
        subsample: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if name is not None:
            cls.name = name
        if system is not None:
            cls._system = system
        own = dict(cls.__dict__.get("__annotations__", {}))
        for field, default in zip(SAMPLER, (step, subsample), strict=True):
            if default is not None:  # the field again, with this subclass's default
                base = MalaSystem.__dataclass_fields__[field]
                own[field] = base.type
                setattr(cls, field, parameter(default, base.metadata["check"]))
        cls.__annotations__ = own

    def _derive(self) -> None:
        self._theta = np.array(
            [
                getattr(self, f.name)
                for f in dataclasses.fields(self)
                if f.init and f.name not in SAMPLER
            ],
            dtype=np.float64,
        )

    @property
    def dt(self) -> float:
        """Time between stored samples, ``step * subsample``."""
        return self.step * self.subsample

    def advance_with_acceptance(
        self,
        state: np.ndarray,
        n_samples: int,
        rng: np.random.Generator,
        tilt: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """:meth:`advance`, and the fraction of accepted proposals (NaN when ``n_samples = 0``).

        Returns
        -------
        samples : (n_samples, d).  new_state : (d,).  acceptance : float.
        """
        d = len(self.components)
        accepted = np.zeros(1, dtype=np.int64)
        weights = None if tilt is None else _tilt(tilt, d, self.angles)

        def kernel(x0: np.ndarray, normals: np.ndarray, out: np.ndarray) -> np.ndarray:
            return mala(
                x0, normals.reshape(-1, d + 1), out, self.step, self.subsample, self._system,
                self._theta, self.angles, accepted, self.positives, weights,
            )  # fmt: skip

        samples, new = run_blocks(state, n_samples, rng, (d + 1) * self.subsample, kernel, d)
        steps = samples.shape[0] * self.subsample
        return samples, new, (accepted[0] / steps if steps else math.nan)

    def advance(
        self,
        state: np.ndarray,
        n_samples: int,
        rng: np.random.Generator,
        tilt: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n_samples`` stored samples ``(n_samples, d)`` and the new state ``(d,)``.

        ``tilt`` ``(d,)``: sample ``p_eq(x) exp(tilt · x)`` instead, the chain under the constant
        forcing ``tilt`` (:func:`mala`); two calls with the same ``rng`` state and two tilts run
        on common random numbers.
        """
        samples, new, _ = self.advance_with_acceptance(state, n_samples, rng, tilt)
        return samples, new

    def score(self, x: np.ndarray) -> np.ndarray:
        """Exact ``grad log p_eq`` at ``x (n, d)``, shape ``(n, d)`` (periodic in the angles,
        whatever window they are given in)."""
        return log_density_and_score(self._system, points(x, len(self.components)), self._theta)[1]

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Unnormalised ``log p_eq`` at ``x (n, d)``, shape ``(n,)``."""
        return log_density_and_score(self._system, points(x, len(self.components)), self._theta)[0]
