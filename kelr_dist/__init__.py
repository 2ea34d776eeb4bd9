"""kelr_dist: kernel-embedding linear response from long equilibrium trajectories.

The main entry points::

    kelr_dist.simulate(model, path, n_samples, ...)      # a trajectory store
    kelr_dist.open_trajectory(path)                      # validate a store
    kelr_dist.estimate_response(path_or_array, ...)      # the response k(lag, i, j)

See ``docs/architecture.md`` for the module map. The package itself imports neither xarray nor
pandas. The ``Dataset.kelr`` accessor is registered by the module that defines it,
:mod:`kelr_dist.edges.analysis`, when it is imported: ``import kelr_dist.edges.analysis``, or the
first use of a name the package exports from it (``kelr_dist.predict_response``, ``step``, ...).
"""

from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("kelr_dist")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

#: public name -> defining module; imported on first use (PEP 562), so that worker processes,
#: which import the package to unpickle a kernel, load only the modules that kernel needs
_EXPORTS = {
    "predict_response": "edges.analysis",
    "QuadratureWarning": "edges.analysis",
    "ramp": "edges.analysis",
    "sampled": "edges.analysis",
    "step": "edges.analysis",
    "susceptibility": "edges.analysis",
    "distribution_response": "edges.distribution",
    "LinearRegimeWarning": "edges.distribution",
    "predict_distribution": "edges.distribution",
    "Coordinate": "kernels.bases.families",
    "Hermite": "kernels.bases.families",
    "Laguerre": "kernels.bases.families",
    "TensorBasis": "kernels.bases.families",
    "ClusterError": "engine.cluster",
    "close_embedded_cluster": "engine.cluster",
    "get_client": "pipeline.client",
    "WorkerTuning": "engine.cluster",
    "KernelDensity": "kernels.scores.kernel_embedding",
    "density_from_result": "pipeline.result",
    "estimate_response": "pipeline.estimate",
    "BiasWarning": "pipeline.warnings",
    "ConditioningWarning": "pipeline.warnings",
    "ConvergenceWarning": "pipeline.warnings",
    "EdgeWarning": "pipeline.warnings",
    "GoodnessOfFitWarning": "pipeline.warnings",
    "DisagreementWarning": "pipeline.warnings",
    "NonFiniteWarning": "pipeline.warnings",
    "SensitivityWarning": "pipeline.warnings",
    "TruncationWarning": "pipeline.warnings",
    "write_result": "pipeline.result",
    "MODEL_NAMES": "models.registry",
    "make_model": "models.registry",
    "fit_basis": "kernels.bases.coordinates",
    "format_basis": "kernels.bases.spec",
    "Forcing": "kernels.response.operator",
    "Observable": "kernels.response.operator",
    "Criteria": "kernels.scores.selection",
    "choose_delta": "kernels.scores.selection",
    "choose_order": "kernels.scores.selection",
    "simulate": "models.simulate",
    "TrajectoryError": "data.store",
    "describe_trajectory": "data.store",
    "open_trajectory": "data.store",
}

#: public submodules, imported on first use like the names above
_SUBMODULES = {"analysis": "edges.analysis"}

__all__ = ["__version__", *sorted([*_EXPORTS, *_SUBMODULES])]


def __getattr__(name: str) -> Any:  # Any: type checkers of scripts see the names as usable
    from importlib import import_module

    if name in _SUBMODULES:
        return import_module(f"kelr_dist.{_SUBMODULES[name]}")
    if name in _EXPORTS:
        value = getattr(import_module(f"kelr_dist.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kelr_dist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
