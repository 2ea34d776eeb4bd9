"""Sup error of the kernel-embedding density p_M (eq. 40) against N for a few orders M, and of
the paper's Gaussian KDE (Silverman bandwidth, §5), on i.i.d. samples of two known
non-Gaussian densities. Prints the table and writes ``docs/figures/density_accuracy.png``.

* 2-D Gaussian mixture (two correlated components), Hermite x Hermite standardised on the
  sample mean and standard deviation (as the automatic basis choice does);
* Gamma(2) x N(0, 1), Laguerre(θ = 1) x Hermite with affine maps that do *not* match the data
  (scale 0.7 and 1.2), so that the density is not a finite expansion in the basis.

The sup error is over a 41 x 41 grid covering the bulk of each density. The KDE is evaluated by
the binned (FFT) method of :mod:`kelr_dist.kernels.baselines.kde` (error ~1e-3 relative to the
exact sum).

Usage: ``python scripts/density_accuracy.py [--out docs/figures/density_accuracy.png]``
(about a minute).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from kelr_dist.kernels.baselines import kde  # noqa: E402
from kelr_dist.kernels.bases.families import Coordinate, Hermite, Laguerre, TensorBasis  # noqa: E402
from kelr_dist.kernels.reduction import reduce_in_memory  # noqa: E402
from kelr_dist.kernels.scores.kernel_embedding import KernelDensity  # noqa: E402

SIZES = (10_000, 30_000, 100_000, 300_000, 1_000_000)
MIX_WEIGHTS = np.array([0.5, 0.5])
MIX_MEANS = np.array([[-1.0, -0.5], [1.0, 0.5]])
MIX_COVS = np.array([[[0.36, 0.144], [0.144, 0.64]], [[0.49, -0.168], [-0.168, 0.36]]])


@dataclass(frozen=True)
class Case:
    title: str
    sample: Callable[[int, np.random.Generator], np.ndarray]
    pdf: Callable[[np.ndarray], np.ndarray]
    basis: Callable[[np.ndarray], TensorBasis]
    lower: tuple[float, float]
    upper: tuple[float, float]
    orders: tuple[int, ...]


def mixture_sample(n: int, rng: np.random.Generator) -> np.ndarray:
    first = rng.random(n) < MIX_WEIGHTS[0]
    out = np.empty((n, 2))
    for k, rows in enumerate((first, ~first)):
        out[rows] = rng.multivariate_normal(MIX_MEANS[k], MIX_COVS[k], int(rows.sum()))
    return out


def mixture_pdf(x: np.ndarray) -> np.ndarray:
    return sum(
        w * stats.multivariate_normal(m, c).pdf(x)
        for w, m, c in zip(MIX_WEIGHTS, MIX_MEANS, MIX_COVS, strict=True)
    )


def standardised_hermite(x: np.ndarray) -> TensorBasis:
    mean, std = x.mean(axis=0), x.std(axis=0)
    return TensorBasis(tuple(Coordinate(Hermite(), mean[k], std[k]) for k in range(2)), 40)


def gamma_gauss_sample(n: int, rng: np.random.Generator) -> np.ndarray:
    return np.column_stack([rng.gamma(2.0, 1.0, n), rng.standard_normal(n)])


def gamma_gauss_pdf(x: np.ndarray) -> np.ndarray:
    return stats.gamma(2).pdf(x[:, 0]) * stats.norm.pdf(x[:, 1])


def laguerre_hermite(_x: np.ndarray) -> TensorBasis:
    return TensorBasis((Coordinate(Laguerre(1.0), 0.0, 0.7), Coordinate(Hermite(), 0.0, 1.2)), 20)


CASES = (
    Case(
        "Gaussian mixture, Hermite x Hermite",
        mixture_sample,
        mixture_pdf,
        standardised_hermite,
        (-3.0, -3.0),
        (3.0, 3.0),
        (10, 20, 30, 40),
    ),
    Case(
        "Gamma(2) x N(0,1), Laguerre x Hermite",
        gamma_gauss_sample,
        gamma_gauss_pdf,
        laguerre_hermite,
        (0.05, -3.0),
        (8.0, 3.0),
        (2, 4, 8, 20),
    ),
)


def grid_points(lower, upper, n: int = 41) -> np.ndarray:
    axes = [np.linspace(a, b, n) for a, b in zip(lower, upper, strict=True)]
    return np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 2)


def kde_error(x: np.ndarray, points: np.ndarray, truth: np.ndarray) -> float:
    h = kde.silverman_bandwidth(x.std(axis=0, ddof=1), x.shape[0])
    grid = kde.default_grid(x.min(axis=0), x.max(axis=0), h)
    p, _ = reduce_in_memory(kde.binned_kde_reduction(grid, h), x).evaluate(points)
    return float(np.abs(p - truth).max())


def errors(case: Case, seed: int, sizes: tuple[int, ...] = SIZES) -> tuple[np.ndarray, np.ndarray]:
    """Sup errors ``(len(sizes), len(orders))`` of p_M and ``(len(sizes),)`` of the KDE."""
    x_all = case.sample(sizes[-1], np.random.default_rng(seed))
    points = grid_points(case.lower, case.upper)
    truth = case.pdf(points)
    basis = case.basis(x_all)
    out = np.empty((len(sizes), len(case.orders)))
    out_kde = np.empty(len(sizes))
    for i, n in enumerate(sizes):
        density = KernelDensity.fit(basis, x_all[:n])
        for j, order in enumerate(case.orders):
            out[i, j] = np.abs(density.pdf(points, order=order) - truth).max()
        out_kde[i] = kde_error(x_all[:n], points, truth)
    return out, out_kde


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = Path(__file__).resolve().parents[1]
    parser.add_argument(
        "--out", type=Path, default=root / "docs" / "figures" / "density_accuracy.png"
    )
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument(
        "--max-n", type=int, default=SIZES[-1], help="largest N (a quick run: --max-n 100000)"
    )
    args = parser.parse_args()
    sizes = tuple(n for n in SIZES if n <= args.max_n)
    fig, axes = plt.subplots(1, len(CASES), figsize=(11, 4.2))
    for ax, case in zip(axes, CASES, strict=True):
        err, err_kde = errors(case, args.seed, sizes)
        peak = case.pdf(grid_points(case.lower, case.upper)).max()
        print(f"\n{case.title}: sup error over the grid (max p_eq = {peak:.3f})")
        header = "".join(f"{'M=' + str(m):>10}" for m in case.orders)
        print(f"{'N':>10}{header}{'KDE':>10}")
        for i, n in enumerate(sizes):
            row = "".join(f"{e:10.2e}" for e in err[i])
            print(f"{n:>10}{row}{err_kde[i]:10.2e}")
        for j, order in enumerate(case.orders):
            ax.loglog(sizes, err[:, j], "o-", label=f"$p_M$, M = {order}")
        ax.loglog(sizes, err_kde, "k--s", label="Gaussian KDE (Silverman)")
        ax.set_title(case.title, fontsize=10)
        ax.set_xlabel("N (i.i.d. samples, dimensionless)")
        ax.set_ylabel(r"$\sup_{grid} |p - p_{eq}|$ (density, per unit area)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=90)
    print(f"\nwrote {os.path.relpath(args.out)}")


if __name__ == "__main__":
    main()
