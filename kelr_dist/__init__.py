"""kelr_dist: kernel-embedding linear response from long equilibrium trajectories.

The main entry points::

    kelr_dist.simulate(model, path, n_samples, ...)      # a trajectory store
    kelr_dist.open_trajectory(path)                      # validate a store
    kelr_dist.estimate_response(path_or_array, ...)      # the response k(lag, i, j)

See ``docs/architecture.md`` for the module map. Importing the package registers the
``Dataset.kelr`` accessor (:mod:`kelr_dist.edges.analysis`).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kelr_dist")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

from kelr_dist.edges import analysis  # noqa: E402  (registers the Dataset.kelr accessor)

#: public name -> defining module; imported on first use (PEP 562), so that worker processes,
#: which import the package to unpickle a kernel, load only the modules that kernel needs
_EXPORTS = {
    "predict_response": "edges.analysis",
    "ramp": "edges.analysis",
    "sampled": "edges.analysis",
    "step": "edges.analysis",
    "susceptibility": "edges.analysis",
    "distribution_response": "edges.distribution",
    "predict_distribution": "edges.distribution",
    "Coordinate": "kernels.bases",
    "Hermite": "kernels.bases",
    "Laguerre": "kernels.bases",
    "TensorBasis": "kernels.bases",
    "ClusterError": "engine.cluster",
    "close_embedded_cluster": "engine.cluster",
    "get_client": "engine.cluster",
    "KernelDensity": "kernels.density",
    "density_from_result": "pipeline.result",
    "estimate_response": "pipeline.estimate",
    "BiasWarning": "pipeline.estimate",
    "ConvergenceWarning": "pipeline.estimate",
    "EdgeWarning": "pipeline.estimate",
    "DisagreementWarning": "pipeline.estimate",
    "write_result": "pipeline.result",
    "MODEL_NAMES": "models.registry",
    "make_model": "models.registry",
    "fit_basis": "kernels.coordinates",
    "format_basis": "kernels.basis_spec",
    "Forcing": "kernels.response",
    "Observable": "kernels.response",
    "Criteria": "kernels.selection",
    "choose_delta": "kernels.selection",
    "choose_order": "kernels.selection",
    "simulate": "models.simulate",
    "TrajectoryError": "data.store",
    "describe_trajectory": "data.store",
    "open_trajectory": "data.store",
}

__all__ = ["__version__", "analysis", *sorted(_EXPORTS)]


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        from importlib import import_module

        value = getattr(import_module(f"kelr_dist.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kelr_dist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
