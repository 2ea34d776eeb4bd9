"""The survey of a distribution observable: its grid and thresholds from the data.

A ``pdf``, ``moments`` or ``exceedance`` observable
(:mod:`kelr_dist.kernels.observables.distribution`) is placed on the data: the bin grid from the
survey's extremes, mean and standard deviation, the thresholds at the data's quantiles.
:func:`survey_for` runs the survey (read 1) and, for ``pdf`` and ``exceedance``, a light histogram
read for the quantiles and the observables' equilibrium means ``Ā``; the result records the fitted
grid in ``attrs["distribution"]`` (:func:`distribution_attrs`), from which
:mod:`kelr_dist.edges.distribution` labels it.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from kelr_dist.kernels.observables.distribution import (
    DistributionObservable,
    PendingDistribution,
    histogram_reduction,
    resolve_distribution,
)
from kelr_dist.kernels.response.operator import Observable, identity_observable
from kelr_dist.pipeline.steps import Passes, Survey, survey_data


def survey_for(
    passes: Passes, observable: Observable | PendingDistribution
) -> tuple[Survey, Observable]:
    """Read 1 (:func:`~kelr_dist.pipeline.steps.survey_data`) and the observable it settles: a
    :class:`~kelr_dist.kernels.observables.distribution.PendingDistribution` becomes an
    :class:`~kelr_dist.kernels.response.operator.Observable` on the data's grid, its ``Ā`` the
    survey's centre (after one histogram read for ``pdf`` and ``exceedance``); any other observable
    is returned as it is."""
    if not isinstance(observable, PendingDistribution):
        return survey_data(passes, observable), observable
    survey = survey_data(passes, identity_observable(observable.components))
    m = survey.moments
    counts = None
    if observable.spec.kind != "moments":
        counts = passes(histogram_reduction(m.minimum, m.maximum))[0]
    variance = m.variance
    central = np.stack(
        [
            np.zeros_like(variance),
            variance,
            m.skewness * variance**1.5,
            (m.excess_kurtosis + 3.0) * variance**2,
        ],
        axis=1,
    )
    grid = resolve_distribution(observable, m.mean, m.std, m.minimum, m.maximum, central, counts)
    return Survey(m, grid.equilibrium.reshape(-1), survey.sample), DistributionObservable.on(grid)


def distribution_attrs(observable: Observable) -> dict[str, Any]:
    """``{"distribution": JSON}`` for a distribution observable's result (empty otherwise): the
    spec, components, positions in data units (bin centres, moment orders, thresholds), the
    quantile levels, the PDF's bin width and the equilibrium values ``Ā``."""
    if not isinstance(observable, DistributionObservable) or observable.grid is None:
        return {}
    grid = observable.grid
    record = {
        "kind": grid.spec.kind,
        "spec": grid.spec.text,
        "components": list(grid.components),
        "levels": list(grid.spec.levels),
        "coordinates": grid.coordinates().tolist(),
        "bin_width": grid.h.tolist(),
        "mean": grid.mean.tolist(),
        "scale": grid.scale.tolist(),
        "equilibrium": grid.equilibrium.tolist(),
    }
    return {"distribution": json.dumps(record)}
