"""Whether the MALA-sampled systems follow their diffusion at the stored lags.

For the reversible diffusion ``dU = s(U) dt + sqrt(2) dW`` (``s = grad log p_eq``) the FDT's
response ``k(t) = E[f(X_t) B(X_0)]``, ``B = -L f``, is ``-dC/dt``, ``C(t) = E[f(X_t) f(X_0)]``,
so ``C(0) - C(t) = ∫_0^t k(s) ds`` (eq. 4) at every ``t``. A MALA chain with step ``h`` follows
the diffusion up to ``O(h)``: its Euler proposals overshoot and its rejections hold it back, and
the ratio ``(C(0) - C(t)) / ∫_0^t k`` measures by how much. For each system, at its default
``step`` (or ``--model step=H subsample=K``), this prints the ratio per component at ``t = h``
(one step), at the first three stored lags and at ``10 dt``, with batch-means standard errors
(:func:`kelr_dist.testing.fdt_identity`; ``f = x``, ``cos θ`` and ``sin θ`` for an angle,
``log x`` for a component moved in ``log x``), and the rejected fraction.

    python scripts/mala_fdt_check.py --steps 4e6
    python scripts/mala_fdt_check.py --systems coupled-3d --model step=0.04 subsample=10
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kelr_dist.models.mala import MalaSystem
from kelr_dist.models.registry import MODEL_NAMES, make_model
from kelr_dist.testing import fdt_identity


def _mala_names() -> list[str]:
    return [name for name in MODEL_NAMES if isinstance(make_model(name), MalaSystem)]


def _value(text: str) -> float | int:
    number = float(text)
    return int(number) if number.is_integer() and "." not in text else number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", nargs="+", default=None, help="default: every MALA system")
    parser.add_argument("--steps", type=float, default=2e6, help="chain length in MALA steps")
    parser.add_argument("--batches", type=int, default=20, help="batches of the batch means")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--model", nargs="*", default=[], metavar="KEY=VALUE", help="sampler or model parameters"
    )
    args = parser.parse_args()
    params = {key: _value(value) for key, value in (item.split("=", 1) for item in args.model)}
    for name in args.systems or _mala_names():
        model = make_model(name, **params)
        if not isinstance(model, MalaSystem):
            parser.error(f"--systems: {name!r} is not sampled by MALA")
        times = [model.step, model.dt, 2 * model.dt, 3 * model.dt, 10 * model.dt]
        start = time.perf_counter()
        ratio, stderr = fdt_identity(
            model, int(args.steps), times, np.random.default_rng(args.seed), args.batches
        )
        rng = np.random.default_rng(args.seed)
        state = model.initial_state(rng)
        _, state = model.advance(state, model.default_burn_in, rng)
        acceptance = model.advance_with_acceptance(state, 2000, rng)[2]
        print(
            f"{name}: h = {model.step:g}, subsample = {model.subsample}, dt = {model.dt:g}, "
            f"rejected {1 - acceptance:.3f} ({time.perf_counter() - start:.0f} s)"
        )
        for t, row, error in zip(times, ratio, stderr, strict=True):
            cells = "  ".join(f"{r:.4f} ± {e:.4f}" for r, e in zip(row, error, strict=True))
            print(f"  t = {t:<8.4g} {cells}")


if __name__ == "__main__":
    main()
