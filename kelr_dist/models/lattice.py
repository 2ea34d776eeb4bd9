"""Lattice fields: a double well per site, local non-polynomial couplings, closed-form density.

    log p_eq(x) = -Σ_i [H (x_i² - 1)² + tilt x_i]
                  - Σ_(i,j) [κ (x_i - x_j)² / 2 - τ cos(ω (x_i - x_j))]   (+ a constant)

over the sites of a ``rows x columns`` grid (a chain when ``rows = 1``), the bonds ``(i, j)``
between neighbours along a row or a column, periodic along a side of at least three sites (a ring,
a torus). The field has as many components as sites (``d = rows * columns``), its exact score is
known at every point, and it is sampled by MALA (:mod:`kelr_dist.models.mala`), which leaves
``p_eq`` exactly invariant: the exact-FDT response on the same samples is the reference for fields
of tens to hundreds of components. Each component's marginal is bimodal and skewed by ``tilt``, and
the cosine tie makes the score of a site a non-polynomial function of its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kelr_dist.models import densities
from kelr_dist.models.mala import MalaSystem
from kelr_dist.models.parameters import count, parameter, positive, real

if TYPE_CHECKING:
    from kelr_dist.models.protocol import Model


@dataclass(eq=False)
class Lattice(MalaSystem, name="lattice", system=densities.LATTICE, step=0.0025, subsample=80):
    """A double-well field on a chain or grid of sites with harmonic and cosine ties; MALA.

    Parameters
    ----------
    rows, columns : the grid's sides (1 and 16: a ring of 16 sites); ``d = rows * columns``.
    barrier : ``H`` (1).  tilt : (0.1).  coupling : ``κ`` (0.1).  twist : ``τ`` (0.3).
    omega : ``ω`` (1.5).  step : MALA step (0.0025, the rule of
    :class:`~kelr_dist.models.mala.MalaSystem`: ``h E[s_i²] ≤ 0.02``).  subsample : (80;
    ``dt = 0.2``).
    With these each site stays bimodal (about a third of the samples in its right well at
    ``d = 32``) and decorrelates within about 30 stored samples; MALA accepts about 99%.
    """

    rows: int = parameter(1, count)
    columns: int = parameter(16, count)
    barrier: float = parameter(1.0, positive)
    tilt: float = parameter(0.1, real)
    coupling: float = parameter(0.1, real)
    twist: float = parameter(0.3, real)
    omega: float = parameter(1.5, positive)

    def _derive(self) -> None:
        self.components = tuple(f"x{i + 1}" for i in range(self.rows * self.columns))
        super()._derive()

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """Every site in its right well, ``1 + 0.1 N(0, 1)``: ``(d,)``."""
        return 1.0 + 0.1 * rng.standard_normal(len(self.components))


SYSTEMS: tuple[type[Model], ...] = (Lattice,)
