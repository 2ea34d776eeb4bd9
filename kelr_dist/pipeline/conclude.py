"""The conclusion of an estimate: the held-out choice, the warnings, the attributes, the result.

:func:`conclude` takes the response read's results, picks the estimator by held-out loss, runs
the checks of :mod:`kelr_dist.pipeline.warnings`, records the run's choices and assembles the
labelled Dataset (:func:`kelr_dist.pipeline.result.assemble_result`).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
import xarray as xr

from kelr_dist import __version__
from kelr_dist.data.store import (
    IN_MEMORY,
    cut_attr,
)
from kelr_dist.kernels.bases.coordinates import Periodicity
from kelr_dist.kernels.bases.spec import format_basis
from kelr_dist.kernels.response.operator import (
    replicate_stride,
)
from kelr_dist.kernels.response.stein_correction import (
    FOURIER_COUNT,
)
from kelr_dist.kernels.scores.heldout import candidate_table, used_estimator
from kelr_dist.kernels.scores.local import LocalChoice
from kelr_dist.pipeline.distribution import distribution_attrs
from kelr_dist.pipeline.inputs import Inputs
from kelr_dist.pipeline.options import EstimateOptions
from kelr_dist.pipeline.planning import Plan, Setting
from kelr_dist.pipeline.result import assemble_result, json_attr, number_attr
from kelr_dist.pipeline.steps import (
    AnyScoreMatching,
    KernelEmbeddingChoice,
    Passes,
    Pilot,
    Responses,
    gram_stride,
    kernel_embedding_truncation,
    score_matching_truncation,
)
from kelr_dist.pipeline.warnings import (
    GOODNESS_OF_FIT_LEVEL,
    Entries,
    NonFiniteWarning,
    TruncationWarning,
    emit,
    warn_bias,
    warn_conditioning,
    warn_disagreement,
    warn_goodness_of_fit,
    warn_sensitivity,
    warn_unconverged,
)


def conclude(
    options: EstimateOptions,
    inputs: Inputs,
    setting: Setting,
    plan: Plan,
    passes: Passes,
    fitted: tuple[KernelEmbeddingChoice | None, AnyScoreMatching | None, Pilot | None],
    out: Responses,
    started: float,
) -> xr.Dataset:
    """The result of the response read: the held-out choice between the families, the warnings
    (:class:`TruncationWarning`, :class:`BiasWarning`, :class:`DisagreementWarning`,
    :class:`SensitivityWarning`, :class:`ConvergenceWarning`, :class:`ConditioningWarning`,
    :class:`GoodnessOfFitWarning`, :class:`NonFiniteWarning`, each also a line of
    ``attrs["warnings"]`` after read 1's :class:`EdgeWarning` lines), the run's attributes, and
    the labelled Dataset."""
    traj = inputs.trajectory
    chains, n, _ = traj.shape
    ke, sm, pilot = fitted
    candidates = candidate_table(
        options.estimator,
        None if ke is None else (ke.level, out.density_loss),
        sm.candidates if sm is not None else [],
        sm.pick if sm is not None else None,
    )
    used = used_estimator(candidates)
    responses = dict(out.results)
    chosen_name = f"response_{used.replace('-', '_')}"
    responses["response"] = responses.pop(chosen_name)
    checks = dict(out.goodness_of_fit or {})
    if chosen_name in checks:
        checks["response"] = checks.pop(chosen_name)
    main = responses["response"]
    raised: list[str] = list(setting.warnings)  # read 1's (EdgeWarning); decisions: attrs["pilot"]
    entries = Entries(
        tuple(setting.observable.names),
        inputs.forcing.columns,
        float(traj.attrs["dt"]),
        traj.attrs.get("time_units"),
    )
    truncation = (
        kernel_embedding_truncation(ke, chains * n)
        if used == "kernel-embedding" and ke is not None
        else score_matching_truncation(sm, chains * n)
        if used == "score-matching" and sm is not None and inputs.degree is None
        else None
    )
    if truncation is not None:
        emit(TruncationWarning, truncation.message, raised)
    warn_bias(main, entries, raised)
    disagreement = warn_disagreement(
        responses, candidates, sm.pick if sm is not None else None, entries, raised
    )
    chosen = ke if used == "kernel-embedding" else sm if used == "score-matching" else None
    steps = [] if chosen is None or chosen.neighbours is None else [chosen.neighbours[1]]
    if used == "score-matching" and setting.periods is None:  # extend_score ran
        steps.append(f"+ {FOURIER_COUNT} random Fourier features")
    neighbour = "; ".join(steps) or None
    sensitivity = warn_sensitivity(main, neighbour, used, entries, raised)
    warn_unconverged(main, entries, raised)
    if sm is not None:
        warn_conditioning(sm.condition, raised)
    fit = None
    if "response" in checks:
        names = [str(c) for c in traj["component"].values]
        fit = warn_goodness_of_fit(checks["response"], names, stein_holds(setting), raised)
    if main.nonfinite:
        emit(
            NonFiniteWarning,
            f"the {used} score was not finite on {main.nonfinite} of {main.n} samples; they get "
            "B = 0 like the low-density rejections and are counted apart "
            "(attribute nonfinite_rejection)",
            raised,
        )

    attrs: dict[str, Any] = {
        "estimator": used,
        "estimator_selection": options.estimator,
        "folds": int(options.folds),
        "replicate_stride": replicate_stride(chains * n),
        "n_samples": int(chains * n),
        "chains": int(chains),
        "chain_length": int(n),
        "dt": float(traj.attrs["dt"]),
        "max_lag": inputs.max_lag,
        "basis": format_basis(setting.coordinates),
        "rejection": main.rejection,
        "nonfinite_rejection": main.nonfinite_rejection,
        "warnings": "\n".join(raised),
        "stein_correction": plan.correction(setting.observable),
        **options.function_names(),
        **distribution_attrs(setting.observable),
        "passes": passes.reads,
        "store_reads": passes.store_reads,
        "chunking": [int(c) for c in traj.chunks[1]] if traj.chunks else [int(n)],
        "store": str(traj.attrs.get("store", IN_MEMORY)),
        "store_fingerprint": str(traj.attrs.get("store_fingerprint", "")),
        "variable": str(traj.name),
        "kelr_dist_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        **{
            k: cut_attr(json_attr(traj.attrs[k]))
            for k in ("model", "model_params")
            if k in traj.attrs
        },
    }
    if ke is not None:
        attrs.update(
            order=number_attr(ke.order),
            order_selection=ke.order_selection,
            max_order=number_attr(ke.density.basis.order),
            index_set=ke.density.basis.index_set,
            delta=ke.delta,
            delta_rule=ke.delta_rule,
        )
    if sm is not None:
        assert plan.features is not None
        attrs.update(
            degree=sm.degree,
            ridge=sm.ridge,
            max_degree=plan.features.degree,
            gram_stride=gram_stride(chains * n, plan.features.gram_size),
            gram_condition=sm.condition,
            score_matching_index_set=sm.index_set,
            score_matching_features=int(sm.model.features.size),
            score_matching_max_degrees=list(sm.model.features.max_degrees),
        )
        if isinstance(sm, LocalChoice):
            local = sm.sums.features
            attrs.update(
                score_matching_features=sm.pick.features,
                local_radius=sm.radius,
                neighbourhoods=local.neighbourhoods.describe(
                    [str(c) for c in traj["component"].values]
                ),
                symmetry="translation" if local.tied else "none",
            )
    declared = inputs.neighbours
    if declared is not None and declared.lattice:  # a ring or a periodic grid: its geometry
        sites = len(declared.members)
        attrs["lattice"] = f"ring({sites})" if declared.source == "ring" else declared.source
    if pilot is not None:
        attrs.update(pilot.attrs())
    if disagreement is not None:
        attrs["estimator_disagreement"] = disagreement
    if sensitivity is not None:
        attrs.update(model_sensitivity=sensitivity, model_neighbour=neighbour)
    if setting.periods is not None:
        attrs["periodic"] = periodic_attr(traj, setting.periodic)
    if fit is not None:
        attrs.update(
            goodness_of_fit_z=fit[0],
            goodness_of_fit_threshold=fit[1],
            goodness_of_fit_level=GOODNESS_OF_FIT_LEVEL,
        )
    attrs["runtime_seconds"] = time.perf_counter() - started
    return assemble_result(
        responses=responses,
        ke=ke,
        candidates=candidates,
        used=used,
        trajectory=traj,
        observable=setting.observable,
        forcing=inputs.forcing,
        attrs=attrs,
        checks=checks,
    )


def stein_holds(setting: Setting) -> np.ndarray:
    """``(d,)`` bool: the components where Stein's identity holds without a boundary term (on a
    circle, or on the line without a hard edge: :class:`EdgeWarning` names the others)."""
    periodic = setting.periodic
    edges = setting.survey.edges
    hard = [(False, False)] * len(periodic) if edges is None else edges.hard()
    return np.array(
        [
            p is not None or not (lower or upper)
            for p, (lower, upper) in zip(periodic, hard, strict=True)
        ]
    )


def periodic_attr(trajectory: xr.DataArray, periodic: list[Periodicity | None]) -> str:
    """The result's ``periodic`` attribute: JSON ``{component: {period, wrap, reason}}``."""
    names = [str(c) for c in trajectory["component"].values]
    return json.dumps(
        {
            name: {"period": p.period, "wrap": p.loc, "reason": p.reason}
            for name, p in zip(names, periodic, strict=True)
            if p is not None
        }
    )
